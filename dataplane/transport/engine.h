// The transport engine of one lcore: QPs and their requester, completer and
// responder state machines (IBTA vol. 1 ch. 9), timers, and the I/O
// boundary. Packets come in through rx() as decoded frames and leave through
// a PacketIo, so the same engine runs on a DPDK port and on a simulated link.
// Every method runs on the owning lcore; none allocates or throws except
// create_qp/destroy_qp (control path).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "dataplane/transport/objects.h"
#include "dataplane/transport/qp.h"
#include "dataplane/transport/timer_wheel.h"
#include "dataplane/transport/types.h"
#include "dataplane/wire/codec.h"

namespace urnic::transport {

// One frame to transmit, in three parts: `hdr` (Ethernet .. extension
// headers, built by the engine), `payload` pieces (in registered memory, or
// engine-owned bytes for inline data and atomics), and `trailer` (pad +
// ICRC). An implementation may reference a `stable` payload (zero copy)
// until the frame is on the wire: the memory stays registered while its WR
// is outstanding. Any other payload it copies inside transmit().
struct TxFrame {
  const uint8_t* hdr = nullptr;
  uint32_t hdr_len = 0;
  std::span<const wire::ConstBuf> payload;
  const uint8_t* trailer = nullptr;
  uint32_t trailer_len = 0;
  // The payload stays as it is until the frame is gone: an RC request's
  // data, which the application may not touch before the WR completes,
  // after the ACK; a PacketIo may reference it (zero-copy TX). Other
  // payload is the engine's own copy, valid until transmit() returns, or
  // (unsealed) the source itself.
  bool stable = false;
  // To a multicast group QPs of this device joined, from a QP not created
  // with IBV_QP_CREATE_BLOCK_SELF_MCAST_LB: the PacketIo gives the device a
  // copy too, as a NIC loops a group's frame back to its own members.
  bool loop_to_members = false;
  // Not null for a payload that is not stable and too large for the
  // engine's copy to be cheap: `trailer` is not computed yet. Whoever
  // copies the frame sums its copy of the payload with wire::TrailerSum
  // (these fields, hdr) and writes the trailer_len bytes it gives; so the
  // ICRC covers the bytes that leave, and the payload is copied once.
  const wire::RoceFields* unsealed = nullptr;
  uint32_t payload_len() const {
    uint32_t n = 0;
    for (const wire::ConstBuf& b : payload) n += b.len;
    return n;
  }
  uint32_t frame_len() const { return hdr_len + payload_len() + trailer_len; }
  // The whole frame into `out` (frame_len() bytes): a copying PacketIo's
  // (tests, benchmarks). Returns its length.
  uint32_t copy_to(uint8_t* out) const {
    uint8_t* p = out;
    std::memcpy(p, hdr, hdr_len);
    p += hdr_len;
    uint8_t* const pl = p;
    for (const wire::ConstBuf& b : payload) {
      if (b.len) std::memcpy(p, b.data, b.len);
      p += b.len;
    }
    if (unsealed) {  // never empty: only payloads over the engine's copy
      const wire::ConstBuf copy{pl, static_cast<uint32_t>(p - pl)};
      p += wire::encode_trailer(hdr, *unsealed, {&copy, 1}, p);
    } else {
      if (trailer_len) std::memcpy(p, trailer, trailer_len);
      p += trailer_len;
    }
    return static_cast<uint32_t>(p - out);
  }
};

class PacketIo {
 public:
  virtual ~PacketIo() = default;
  // False when the TX queue has no room: nothing is lost, the engine keeps
  // its state and sends the frame on a later poll().
  virtual bool transmit(const TxFrame& f) = 0;
};

// The host side of the receive queues. An application posts receive WRs
// to a ring in its own memory and rings a doorbell; the lcore takes them
// at its next pass. A SEND may arrive in between (the lcore was off the
// CPU after taking the doorbells, and the peer sent on a credit the
// application gave after posting): the responder then asks for what was
// posted before it finds a queue empty, as a NIC reads the RQ's doorbell
// record when it needs a WQE (dataplane/NOTES.md, "Doorbells").
class RecvSource {
 public:
  virtual ~RecvSource() = default;
  // Takes the receive WRs posted to this QP's ring (its Qp::recv_ring_) or
  // this SRQ's into the engine now. True if there were any.
  virtual bool refill(Qp& qp) = 0;
  virtual bool refill(Srq& srq) = 0;
};

// clang-format off
#define URNIC_ENGINE_COUNTERS(X)                                             \
  X(tx_packets)      X(tx_bytes)        X(tx_full)         X(rx_packets)     \
  X(rx_no_qp)        X(rx_bad_state)    X(rx_bad_type)     X(rx_bad_pkey)    \
  X(rx_bad_qkey)     X(rx_bad_opcode_seq) X(rx_dup)        X(rx_out_of_seq)  \
  X(rx_ghost_ack)    X(rx_uc_dropped)   X(acks_tx)         X(acks_rx)        \
  X(naks_seq_tx)     X(naks_rnr_tx)     X(naks_access_tx)  X(naks_inv_req_tx) \
  X(naks_op_tx)      X(naks_seq_rx)     X(naks_rnr_rx)     X(naks_access_rx) \
  X(naks_inv_req_rx) X(naks_op_rx)      X(retransmits)     X(timeouts)       \
  X(rnr_waits)       X(read_replays)    X(atomic_replays)  X(cq_overflows)   \
  X(wqes_flushed)    X(send_wqes)       X(recv_wqes)       X(completions)    \
  X(rx_no_recv)      X(rx_bad_length)   X(local_errors)    X(cc_window_cuts) \
  X(cc_shared_cuts)  X(cnps_tx)         X(cnps_rx)         X(cc_rate_cuts)   \
  X(tail_probes)     X(rx_rkey_invalid) X(rx_rkey_pd)      X(rx_rkey_bounds) \
  X(rx_rkey_rights)  X(rx_qp_access)    X(rx_write_length) X(rx_rd_atomic_over) \
  X(rx_atomic_misaligned) X(rx_recv_too_small) X(rx_recv_bad_lkey)     \
  X(rx_invalidate_rkey) X(atomic_writes) X(cc_grant_waits)                \
  X(rx_msg_too_long) X(ud_too_long) X(rx_bad_addr) X(cc_floor_drops)  \
  X(probe_pauses)    X(recv_refills)    X(rx_mcast)        X(rx_mcast_copies)
// clang-format on

enum class ECtr : uint16_t {
#define URNIC_ECTR_ENUM(n) n,
  URNIC_ENGINE_COUNTERS(URNIC_ECTR_ENUM)
#undef URNIC_ECTR_ENUM
      kCount
};
constexpr size_t kNumECtr = static_cast<size_t>(ECtr::kCount);
extern const char* const kECtrNames[kNumECtr];

// Written only by the engine's lcore (plain load+store, no locked RMW);
// read by the control thread with relaxed loads (as stats::LcoreCounters).
struct EngineCounters {
  std::atomic<uint64_t> v[kNumECtr] = {};
  uint64_t get(ECtr c) const {
    return v[static_cast<size_t>(c)].load(std::memory_order_relaxed);
  }
  void inc(ECtr c, uint64_t n = 1) {
    std::atomic<uint64_t>& a = v[static_cast<size_t>(c)];
    a.store(a.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
};

struct EngineConfig {
  uint32_t ack_req_every = 32;  // AckReq on at least every Nth packet
  uint32_t max_unacked = 512;   // requester window, in packets (PSNs)
  uint32_t tx_budget = 64;      // packets one poll() may send per QP
  uint32_t tx_quantum = 32768;  // bytes per QP turn (round-robin by bytes)
  // Packets one poll() sends over all QPs: the caller then gets back to RX,
  // so the peer's ACKs are read while many QPs have data.
  uint32_t poll_budget = 256;
  // Frames one poll() tries to hand over (ACKs included) before a pass
  // over the ready QPs ends early: the caller's transmit burst. A pass that
  // sent fewer (one QP, one quantum) goes round again; a burst sent half
  // full costs the PMD call of a full one (af_packet: a sendto, ~5 700
  // cycles whatever it carries, perf/README.md "Full bursts"). 1: one pass
  // per poll.
  uint32_t tx_fill = 1;
  uint16_t udp_sport_base = 0xc000;
  uint32_t timer_tick_ns = 1000;  // timer wheel resolution
  // Tail-loss probe (as TCP's, RFC 8985 7): when nothing is acknowledged
  // for max(2 x smoothed RTT, this) while packets are outstanding, the last
  // one is sent again with AckReq, so a lost tail or a lost ACK costs a
  // round trip, not the Local ACK Timeout (67 ms at perftest's 14). Backs
  // off x2 per probe without progress; never reaches the timeout; does
  // not count as a retry; the third probe without progress goes back N.
  // Runs from the newest packet sent with AckReq (Engine::arm_probe).
  // 0: off.
  uint64_t tail_probe_ns = 200'000;
  // Congestion control of RC QPs (congestion.h): loss-driven windows (their
  // max_window is max_unacked), ECN and DCQCN.
  CcParams cc;
  // QPs spread over `homes` engines (one per worker lcore): this one is
  // number `home`. QPNs carry their engine (slot % homes), so any lcore
  // steers a packet by its destination QPN without a table (home_of).
  uint32_t home = 0;
  uint32_t homes = 1;
};

struct QpInitAttr {
  ibv_qp_type qp_type = IBV_QPT_RC;  // RC, UC or UD
  Pd* pd = nullptr;
  Cq* send_cq = nullptr;
  Cq* recv_cq = nullptr;
  Srq* srq = nullptr;
  ibv_qp_cap cap{};  // on success: what was granted (>= asked)
  bool sq_sig_all = false;
  // IBV_QP_CREATE_BLOCK_SELF_MCAST_LB: what it sends to a group is not
  // looped back to this device's members.
  bool block_self_mcast_lb = false;
};

class Engine {
 public:
  Engine(Device& dev, PacketIo& io, const EngineConfig& cfg = {},
         uint64_t now_ns = 0);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Set before the lcore runs, cleared after it stopped (nullptr: the
  // engine's own queues are all there is, as in the simulations).
  void set_recv_source(RecvSource* s) { recv_src_ = s; }

  // Control path (verbs semantics; 0 or a positive errno).
  int create_qp(QpInitAttr& attr, Qp** out);
  // On a refusal by the validator, *why (if given) names the problem.
  int modify_qp(Qp* qp, const ibv_qp_attr& attr, int mask,
                const char** why = nullptr);
  int query_qp(const Qp* qp, ibv_qp_attr* attr, QpInitAttr* init) const;
  int destroy_qp(Qp* qp);
  Qp* find_qp(uint32_t qpn) const;
  // ibv_attach_mcast / ibv_detach_mcast: a UD QP of this engine receives
  // the UD SENDs to group `gid` (DQPN 0xFFFFFF, IBTA 9.8.1, 10.5.2), each
  // member its own copy, until it detaches or is destroyed. 0, EINVAL (not
  // a UD QP, not a multicast GID; detach: not attached) or ENOMEM (a
  // device limit); *why names a refusal. Every lcore parked (the device's
  // group table is read by all of them).
  int attach_mcast(Qp* qp, const uint8_t gid[16], const char** why = nullptr);
  int detach_mcast(Qp* qp, const uint8_t gid[16], const char** why = nullptr);
  // Whether a QP of this engine joined `gid` (any lcore: the table
  // changes only while every lcore is parked).
  bool mcast_member(const uint8_t gid[16]) const {
    return !mcast_.empty() && mcast_.count(to_gid(gid)) != 0;
  }
  // The engine (EngineConfig::home) whose QP `qpn` would be; the same
  // answer on every engine of a device.
  uint32_t home_of(uint32_t qpn) const {
    const uint32_t low = qpn & ((1u << qpn_slot_bits_) - 1);
    return low < kFirstQpn ? 0 : (low - kFirstQpn) % cfg_.homes;
  }
  size_t qp_count() const { return nqp_; }
  // f(const Qp&) for every QP, in table order (not QPN order). Control
  // thread (the table only changes there); a QP's counters may be read
  // while its lcore runs.
  template <class F>
  void for_each_qp(F&& f) const {
    for (const std::unique_ptr<Qp>& q : qps_)
      if (q) f(*q);
  }

  // Whether a QP of the MR's PD still points into its memory (posted WRs,
  // a message in progress, READ responses to send: Qp::uses_memory), so
  // the memory must stay mapped. Lcore parked.
  bool mr_in_use(const Mr& mr) const;

  // ibv_post_send / ibv_post_recv for one WR: 0, ENOMEM (queue full) or
  // EINVAL (bad WR, or a state that does not accept it). In ERR a posted WR
  // completes with IBV_WC_WR_FLUSH_ERR.
  int post_send(Qp* qp, const SendWr& wr) {
    return post_send(qp, wr, wr.sg_list);
  }
  int post_recv(Qp* qp, const RecvWr& wr) {
    return post_recv(qp, wr.wr_id, wr.num_sge, wr.sg_list);
  }
  // The same with the SGEs apart (wr.num_sge / num_sge of them at `sges`):
  // the shim's WQE intake fills them straight from the shared slot, and
  // they are copied once more, into the QP's own arrays.
  int post_send(Qp* qp, const SendWrHead& wr, const Sge* sges);
  int post_recv(Qp* qp, uint64_t wr_id, uint32_t num_sge, const Sge* sges);
  // A WR the shim accepted but the service refused before it reached the
  // queue (a misbehaving application wrote it): completes with `st`, the
  // QP goes to error, and the shared ring still frees its slot.
  void fail_unposted_send(Qp* qp, uint64_t wr_id, ibv_wr_opcode op,
                          ibv_wc_status st);
  void fail_unposted_recv(Qp* qp, uint64_t wr_id, ibv_wc_status st);

  // A decoded RoCEv2 frame (fi.kind == kRoce, ICRC verified) addressed to
  // this device; `segs` hold the frame's bytes.
  void rx(const wire::FrameInfo& fi, std::span<const wire::ConstBuf> segs,
          uint64_t now_ns);
  // Timers, requester and responder transmit work, deferred ACKs. Returns
  // packets sent plus timers fired (0: nothing to do). timers false: the
  // caller has received frames still to read (the peer's answers may be
  // among them), so no timer fires in this pass.
  uint32_t poll(uint64_t now_ns, bool timers = true);
  // The caller (the lcore) was off the CPU, or busy elsewhere, for `ns`
  // up to `now_ns`, and read no frame meanwhile: the transport's timers
  // (the Local ACK Timeout, the probe, RNR, pacing) stand still that long,
  // as a NIC's keep running only while its firmware does. An answer that
  // waited in the ring would otherwise be timed out on the way back: 16384
  // QPs on memif, their service stopped 80 ms a second, resent ~300 000
  // packets that had arrived (perf/README.md, "the lcore's own pauses").
  // Late, never early.
  void lcore_paused(uint64_t now_ns, uint64_t ns);
  // True while some QP has packets it could send now (TX was full, or a
  // budget ran out): the caller should poll() again without waiting.
  bool busy() const { return !ready_.empty() || !ack_.empty(); }
  // Nothing to send and no timer armed: only a frame or a new work
  // request can give the engine work (the lcore may wait for events).
  bool quiet() const { return !busy() && timers_.size() == 0; }

  const EngineCounters& counters() const { return ctr_; }
  Device& device() { return dev_; }
  const EngineConfig& config() const { return cfg_; }
  // The shared congestion window (congestion.h) and what it counts, as the
  // lcore last published them (each poll()): for another thread.
  struct CcGauges {
    QpCounter shared_window, in_flight, active_qps, waiting_qps;
  };
  const CcGauges& cc_gauges() const { return gauges_; }
  // The same, current: the lcore's own (and tests').
  uint32_t cc_shared_window() const { return cc_shared_.window(); }
  uint64_t cc_in_flight() const { return cc_in_flight_; }
  uint32_t cc_active_qps() const { return cc_active_; }
  uint32_t cc_granted_qps() const { return cc_granted_; }
  // Rate-limited QPs with something to send: what the DCQCN increase timer
  // is shared between (DcqcnShare).
  uint32_t dcqcn_sharing_qps() const { return dcqcn_share_.limited; }

  // --- Internal: shared with the roles (roles.h); not an API. ---

  // Shared by the roles (engine.cc).
  void fill_addr(const Qp& qp, const Path& path, wire::RoceFields& f) const;
  // Encodes and transmits one packet of `qp`; false if TX is full. RC/UC
  // packets start from qp.tmpl_, so their Ethernet..UDP bytes come from
  // qp.hdr_; UD packets (an AH per WR) are encoded whole. Unless `stable`
  // (TxFrame::stable) the ICRC is computed over a copy of the payload:
  // application memory may change meanwhile (a UD or UC send completes
  // before the frame has left; a READ response's memory is the responder
  // application's, rewritten at will), and a frame must carry the ICRC of
  // the bytes it carries. A small payload is copied here (bounce_), a
  // larger one by the PacketIo as it builds the frame (TxFrame::unsealed).
  bool send_packet(Qp& qp, wire::RoceFields& f,
                   std::span<const wire::ConstBuf> payload,
                   bool stable = false);
  void make_ready(Qp& qp) { ready_.push_back(qp); }
  // A resend after a go-back leads the next pass, so its frames lead the
  // next transmit burst: a receiver whose ring is nearly full drops a
  // burst's tail, and a resend that always came last was lost at every
  // retry until retry exceeded (perf/README.md, "resends first").
  void make_ready_first(Qp& qp) { ready_.push_front(qp); }
  // Small responder packets (ACK/NAK, atomic ACK) go out before bulk data:
  // an ACK queued behind every other QP's data burst would look lost.
  void make_ack_ready(Qp& qp) { ack_.push_back(qp); }
  void unlink_ready(Qp& qp);
  // Grants of the shared window (CcParams::grant): may `qp`, with `out`
  // packets in flight, send a new packet now? If not it waits for a grant
  // (queued here) or for its packets in flight to drain.
  bool cc_may_send(Qp& qp, int32_t out);
  // The packet about to be sent is the last cc_may_send lets go for now
  // (its turn ends, or it fills the shared window): it asks for an ACK.
  bool cc_turn_ends(const Qp& qp) const {
    if (!cfg_.cc.window || !cfg_.cc.grant) return false;
    const CcTurns t = cc_turns();
    return (!cc_wait_.empty() &&
            qp.cc_burst_ + 1 >= t.grant * CcParams::kGrantBursts) ||
           (qp.cc_out_ + 1 >= t.grant && t.committed + 1 >= t.limit);
  }
  // An admitted QP that will not send (no work, not RTS) gives its grant
  // back; a QP leaving RTS leaves the queue.
  void cc_release(Qp& qp);
  // Completes sqe(qp.sq_head_) with `st` (a CQE if signaled or an error).
  void complete_head(Qp& qp, ibv_wc_status st);
  bool push_cqe(Qp& qp, Cq* cq, const ibv_wc& wc, bool solicited);
  // Error completion of the head WR, then the QP goes to ERR.
  void fail_head(Qp& qp, ibv_wc_status st);
  void to_error(Qp& qp);
  void reset_qp(Qp& qp);
  // The retransmit timer (IBTA's Local ACK Timeout) and the tail-loss
  // probe that runs ahead of it; armed while packets are outstanding.
  void arm_retrans(Qp& qp);
  // The probe, (re)started: a packet with AckReq left, or progress while
  // one is unanswered.
  void arm_probe(Qp& qp);
  // The probe time the round trip gives, with its floor, before back-off.
  uint64_t probe_time(const Qp& qp) const {
    return std::max(
        {cfg_.tail_probe_ns, 2 * qp.srtt_ns_, qp.srtt_ns_ + 4 * qp.rttvar_ns_});
  }
  void cancel_retrans(Qp& qp);
  void cancel_timers(Qp& qp);  // every timer of the QP (reset, error, destroy)
  // Round-trip sample for the tail-loss probe: comp_.psn moved on.
  void rtt_progress(Qp& qp);
  void fire_timer(TimerNode& t);
  uint32_t make_qpn(uint32_t slot) const;
  // Keeps the shared window's count of packets in flight and of QPs with
  // packets in flight in step with `qp` (after its PSNs moved, or when it
  // leaves RTS).
  void cc_sync(Qp& qp);
  uint32_t cc_window(const Qp& qp) const;
  // ECN notification point: a CNP back to the sender of `tclass`'s packet
  // if it was CE-marked (RFC 3168), at most one per QP per interval.
  void on_ce_st(Qp& qp, uint8_t tclass) {
    if ((tclass & 0x3) == 0x3) send_cnp(qp);
  }
  void send_cnp(Qp& qp);
  // RC data (requests, READ responses) leaves ECN-capable, ECT(0), where a
  // CNP is acted on; UC data where DCQCN paces it (UC has no window: with
  // algorithm window its CNPs are only counted).
  void set_ect(wire::RoceFields& f, bool uc = false) const {
    if (cfg_.cc.window && cfg_.cc.ecn && (!uc || cfg_.cc.dcqcn))
      f.tclass = static_cast<uint8_t>((f.tclass & 0xfc) | 0x2);
  }
  // DCQCN pacing of RC and UC data, around send_packet: pace_ok is false (and
  // the pace timer armed to bring the QP back) while the QP must wait;
  // paced_sent charges the frame just sent. Inline: once per data packet,
  // and nothing but a flag test for an unlimited QP.
  bool pace_ok(Qp& qp) {
    uint64_t at = 0;
    if (qp.rate_.may_send(cfg_.cc, now_, &at, dcqcn_share_)) return true;
    timers_.arm(qp.pace_timer_, at);
    return false;
  }
  void paced_sent(Qp& qp) {
    if (!qp.rate_.limited()) return;
    qp.rate_.on_sent(cfg_.cc, now_, last_tx_len_, dcqcn_share_);
    qp.ctr_.cc_rate_mbps.set(qp.rate_.gauge_mbps());
  }

  // A UD SEND to a group: to every member on this engine.
  void mcast_rx(const wire::FrameInfo& fi,
                std::span<const wire::ConstBuf> segs);
  using McastMap = std::unordered_map<Gid, std::vector<Qp*>, GidHash>;
  // Takes member `at` out of group `g` (and the group out of the table when
  // it was the last); returns the group after it.
  McastMap::iterator leave_group(McastMap::iterator g,
                                 std::vector<Qp*>::iterator at);

  Device& dev_;
  PacketIo& io_;
  RecvSource* recv_src_ = nullptr;
  EngineConfig cfg_;
  EngineCounters ctr_;
  TimerWheel timers_;
  uint64_t now_ = 0;
  // When this lcore last came back from a pause of its own (lcore_paused):
  // an answer that waited for it says nothing of the peer's.
  uint64_t resumed_ns_ = 0;
  // QPN = generation << qpn_slot_bits_ | (kFirstQpn + slot * homes + home).
  // A slot is
  // reused only when the table is full (freed slots queue FIFO), and then
  // with its generation advanced, so a stale packet of a destroyed QP does
  // not land on a new one; generations start random (qpn_rng_), so QPNs
  // are not a sequence an outsider can guess.
  std::vector<std::unique_ptr<Qp>> qps_;  // by slot
  std::vector<uint32_t> slot_gen_;        // by slot
  std::deque<uint32_t> free_qp_;          // freed slots, oldest first
  uint32_t qpn_slot_bits_ = 0;
  std::mt19937 qpn_rng_;
  size_t nqp_ = 0;
  QpList<&Qp::ready_link_> ready_;  // QPs with transmit work
  // Multicast groups with members on this engine, and the members.
  McastMap mcast_;
  // send_packet's copy of a small payload that may change
  // (TxFrame::stable): up to what one CRC call takes with the headers.
  alignas(64) uint8_t bounce_[wire::Icrc::kInlineTail];
  bool tx_refused_ = false;     // the PacketIo refused a frame this turn
  uint32_t last_tx_len_ = 0;    // bytes of the last frame sent
  int64_t turn_left_ = 0;       // bytes the QP whose turn it is may still send
  QpList<&Qp::ack_link_> ack_;  // QPs with an ACK-sized response pending
  SharedWindow cc_shared_;
  CcGauges gauges_;
  DcqcnShare dcqcn_share_;     // its QPs' DCQCN rates (rpg_time_share_qps)
  uint64_t cc_in_flight_ = 0;  // packets, all QPs
  uint32_t cc_active_ = 0;     // QPs with packets in flight
  // QPs waiting for a grant, oldest first, and the QPs granted that have
  // not sent yet (each counted as a grant in flight).
  QpList<&Qp::cc_wait_link_> cc_wait_;
  uint32_t cc_waiting_ = 0;  // QPs on cc_wait_
  uint32_t cc_granted_ = 0;
  // cc_floor_count's sample, and the samples the low floor still holds
  // for (0: the floor counts every QP with work).
  uint32_t cc_floor_sent_ = 0, cc_floor_resent_ = 0, cc_floor_hold_ = 0;
  void cc_wake();
  bool cc_admissible() const;
  // What grants fill: the shared window, but never less than min_window
  // per QP with work (in flight or waiting), the floor each QP's share has
  // (SharedWindow::share): with grants the same packets are in flight as
  // without, held by fewer QPs at a time. The window alone (the pipe,
  // measured from the lowest RTT) starved two workers on shared CPUs,
  // whose queues ride out the time a lcore is off the CPU.
  // The floor stops at shared_init_window, what a path is assumed to hold
  // before anything is measured: 256 QPs on one lcore otherwise kept 512
  // packets in flight into a 512-frame af_packet ring that the shared
  // window (300-500) did not (perf/README.md, "The grants' floor capped").
  // Under heavy loss (CcParams::kFloorResentPct) the floor counts the QPs
  // in flight or granted only: the path evidently holds less.
  uint64_t cc_limit() const {
    const uint32_t qps =
        cc_floor_hold_ ? cc_active_ + cc_granted_ : cc_active_ + cc_waiting_;
    const uint64_t floor =
        std::min<uint64_t>(uint64_t{std::max(cfg_.cc.min_window, 1u)} * qps,
                           std::max(cfg_.cc.shared_init_window, 1u));
    return std::max<uint64_t>(cc_shared_.window(), floor);
  }
  // Every RC data packet sent, `resent` if sent before: keeps
  // cc_floor_hold_.
  void cc_floor_count(bool resent) {
    cc_floor_resent_ += resent;
    if (++cc_floor_sent_ < CcParams::kFloorSample) return;
    const bool heavy = uint64_t{cc_floor_resent_} * 100 >
                       uint64_t{cc_floor_sent_} * CcParams::kFloorResentPct;
    if (heavy) {
      if (!cc_floor_hold_) ctr_.inc(ECtr::cc_floor_drops);
      cc_floor_hold_ = CcParams::kFloorHold;
    } else if (cc_floor_hold_) {
      --cc_floor_hold_;
    }
    cc_floor_sent_ = cc_floor_resent_ = 0;
  }
  // A grant: cc.grant packets, kCrowdedGrants times that while the QPs
  // with work would fill the limit twice over with grants (most of them
  // wait their turn either way, and a turn costs an ACK), but at most half
  // the limit, so that a window cut to its floor still lets two QPs take
  // turns. Twice over, not once: two workers' 8 QPs each (8 x 16 = 128)
  // crossed a window of 128 now and then and took the longer grants.
  uint64_t cc_grant(uint64_t limit) const {
    const uint64_t grant = cfg_.cc.grant;
    const uint64_t with_work = uint64_t{cc_active_} + cc_granted_ + cc_waiting_;
    const uint64_t g = with_work * grant > 2 * limit
                           ? grant * CcParams::kCrowdedGrants
                           : grant;
    return std::clamp<uint64_t>(limit / 2, 1, g);
  }
  // The limit, the grant and what is committed (packets in flight and
  // granted), each computed once: the requester asks for all three per
  // packet (cc_may_send, cc_turn_ends).
  struct CcTurns {
    uint64_t limit, grant, committed;
  };
  CcTurns cc_turns() const {
    const uint64_t limit = cc_limit(), grant = cc_grant(limit);
    return {limit, grant, cc_in_flight_ + uint64_t{cc_granted_} * grant};
  }
  uint64_t cc_grant() const { return cc_grant(cc_limit()); }
  uint64_t cc_committed() const { return cc_turns().committed; }
};

}  // namespace urnic::transport
