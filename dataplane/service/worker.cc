// The worker lcore loop, top to bottom: commands and resolution timers,
// rx_burst, classify, handle, buffered tx_burst, idle back-off.
#include <netinet/in.h>
#include <rte_cycles.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_pause.h>
#include <rte_prefetch.h>
#include <sched.h>
#include <sys/prctl.h>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <stdexcept>
#include <utility>

#include "dataplane/service/engine_config.h"
#include "dataplane/service/service.h"
#include "dataplane/wire/codec.h"
#include "dataplane/wire/headers.h"

namespace urnic::service {

using stats::Ctr;
using wire::FrameKind;

std::atomic<bool> g_quit{false};

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u +
         static_cast<uint64_t>(ts.tv_nsec);
}

namespace {
constexpr uint32_t kMaxSegs = 32;
// The frame's bytes, segment by segment (at most kMaxSegs).
uint32_t segs_of(const rte_mbuf* m, wire::ConstBuf (&segs)[kMaxSegs]) {
  uint32_t n = 0;
  for (const rte_mbuf* s = m; s && n < kMaxSegs; s = s->next)
    segs[n++] = {rte_pktmbuf_mtod(s, const uint8_t*), s->data_len};
  return n;
}
constexpr uint32_t kZeroCopyMin = 512;  // bytes: below this a copy is cheaper

// The view `b` may be attached from, if it is worth it and its reference
// count has room.
const ZeroCopyTx::View* attachable(const ZeroCopyTx& zc,
                                   const wire::ConstBuf& b) {
  if (b.len < kZeroCopyMin || b.len > UINT16_MAX) return nullptr;
  const ZeroCopyTx::View* v = zc.find(b.data, b.len);
  return v && rte_mbuf_ext_refcnt_read(v->shinfo) < ZeroCopyTx::kMaxInFlight
             ? v
             : nullptr;
}

// A frame built into mbufs from the pool: bytes copied into segments
// (continuation segments get no headroom) and pieces of application
// memory attached as external buffers. Frees what it holds unless
// release()d.
class MbufChain {
 public:
  explicit MbufChain(rte_mempool* pool)
      : pool_(pool), head_(rte_pktmbuf_alloc(pool)), cur_(head_) {}
  ~MbufChain() {
    if (head_) rte_pktmbuf_free(head_);
  }
  MbufChain(const MbufChain&) = delete;
  MbufChain& operator=(const MbufChain&) = delete;

  rte_mbuf* head() const { return head_; }
  rte_mbuf* release() { return std::exchange(head_, nullptr); }
  uint64_t referenced() const { return referenced_; }
  uint64_t attached() const { return attached_; }

  // Copies `len` bytes; with `sum`, sums each piece as copied. False when
  // the pool has no mbuf left.
  bool put(const uint8_t* p, uint32_t len, wire::TrailerSum* sum = nullptr) {
    while (len) {
      uint32_t room = rte_pktmbuf_tailroom(cur_);
      if (room == 0) {
        rte_mbuf* seg = rte_pktmbuf_alloc(pool_);
        if (!seg) return false;
        seg->data_off = 0;  // continuation segments need no headroom
        link(seg);
        room = rte_pktmbuf_tailroom(cur_);
      }
      const uint32_t take = std::min(room, len);
      uint8_t* const to =
          rte_pktmbuf_mtod_offset(cur_, uint8_t*, cur_->data_len);
      std::memcpy(to, p, take);
      if (sum) sum->update(to, take);
      cur_->data_len = static_cast<uint16_t>(cur_->data_len + take);
      head_->pkt_len += take;
      p += take;
      len -= take;
    }
    return true;
  }
  // Chains `b` (at most UINT16_MAX bytes) as an external buffer, holding
  // one reference of `shinfo` until the PMD frees the segment.
  bool attach(const wire::ConstBuf& b, rte_mbuf_ext_shared_info* shinfo) {
    rte_mbuf* seg = rte_pktmbuf_alloc(pool_);
    if (!seg) return false;
    rte_mbuf_ext_refcnt_update(shinfo, 1);
    void* addr = const_cast<uint8_t*>(b.data);
    rte_pktmbuf_attach_extbuf(seg, addr, reinterpret_cast<rte_iova_t>(addr),
                              static_cast<uint16_t>(b.len), shinfo);
    seg->data_len = static_cast<uint16_t>(b.len);
    link(seg);  // no tailroom: the next put() starts a new segment
    head_->pkt_len += b.len;
    referenced_ += b.len;
    ++attached_;
    return true;
  }

 private:
  void link(rte_mbuf* seg) {
    cur_->next = seg;
    ++head_->nb_segs;
    cur_ = seg;
  }

  rte_mempool* pool_;
  rte_mbuf* head_;
  rte_mbuf* cur_;
  uint64_t referenced_ = 0, attached_ = 0;
};

// DCQCN's line rate when rpg_max_rate is 0: the port's link speed, or
// 100 Gb/s where the port reports none.
uint64_t line_rate_mbps(const PortInfo& port) {
  stats::PortSnapshot ps;
  port_read_link(port, ps);
  const uint32_t s = ps.link_speed_mbps;
  return s && s != RTE_ETH_SPEED_NUM_UNKNOWN ? s : 100'000;
}

constexpr uint64_t kTimerNs = 1'000'000;  // pending-queue poll period
}  // namespace

Worker::Worker(const config::Config& cfg, const PortInfo& port,
               const host::HostAddrs& addrs, host::NeighbourTable& nt,
               transport::Device& dev, uint32_t lcore, uint16_t queue,
               uint32_t homes)
    : cfg_(cfg),
      port_(port),
      addrs_(addrs),
      gids_(addrs),
      nt_(nt),
      lcore_(lcore),
      queue_(queue),
      burst_(cfg.lcores.burst),
      vlan_tci_(cfg.port.vlan),
      pending_(cfg.arp.queue_len),
      engine_(
          dev, *this,
          [&] {
            transport::EngineConfig ec =
                engine_config(cfg.transport, line_rate_mbps(port));
            ec.home = queue;
            ec.homes = homes;
            ec.tx_fill = cfg.lcores.burst;
            return ec;
          }(),
          now_ns()),
      rx_fault_(MbufFaultOps{port.pool}, ctr_, kRxFaultCtrs),
      tx_fault_(MbufFaultOps{port.pool}, ctr_, kTxFaultCtrs) {
  const std::string name = "urnic_cmd_" + std::to_string(lcore);
  cmd_ring_ = rte_ring_create(name.c_str(), 64, SOCKET_ID_ANY,
                              RING_F_SP_ENQ | RING_F_SC_DEQ);
  if (!cmd_ring_)
    throw std::runtime_error("command ring: " +
                             std::string(rte_strerror(rte_errno)));
  if (queue < port.rx_wake_fds.size())
    for (int fd : port.rx_wake_fds[queue]) wake_.watch_rx(fd);
  gate_.set_wake(&wake_);
}

Worker::~Worker() {
  rx_fault_.drain();
  tx_fault_.drain();
  tx_drop_all_st();
  pending_.clear([](rte_mbuf* m) { rte_pktmbuf_free(m); });
  rte_ring_free(cmd_ring_);
  while (loop_head_ != loop_tail_)
    rte_pktmbuf_free(loop_[loop_head_++ % kLoopSize]);
  for (Held& h : held_)
    for (; h.n; --h.n, h.head = (h.head + 1) % kHandoffHold)
      rte_pktmbuf_free(h.m[h.head]);
  if (handoff_) {
    void* m;
    while (rte_ring_dequeue(handoff_, &m) == 0)
      rte_pktmbuf_free(static_cast<rte_mbuf*>(m));
    rte_ring_free(handoff_);
  }
}

void Worker::serve(ShimServer* shim, std::span<Worker* const> peers) {
  shim_ = shim;
  if (peers.size() < 2) return;
  peers_ = peers;
  const std::string name = "urnic_handoff_" + std::to_string(lcore_);
  handoff_ =
      rte_ring_create(name.c_str(), kHandoffRing, SOCKET_ID_ANY, RING_F_SC_DEQ);
  if (!handoff_)
    throw std::runtime_error("handoff ring: " +
                             std::string(rte_strerror(rte_errno)));
  held_.resize(peers.size());
}

// Frames this service sent to itself and frames other workers received for
// our QPs: both are received like frames from the port.
uint32_t Worker::local_rx_st(uint64_t now) {
  uint32_t n = 0;
  const uint32_t tail = loop_tail_;  // frames looped while handling these
                                     // wait for the next loop
  // Not while frames wait for another worker: a looped frame could be one
  // more for it (these wait in loop_, whose owner retries when it is full).
  while (loop_head_ != tail && held_total_ == 0) {
    handle_st(loop_[loop_head_++ % kLoopSize], now);
    ++n;
  }
  if (handoff_) {
    void* m[32];
    const unsigned k = rte_ring_dequeue_burst(handoff_, m, 32, nullptr);
    for (unsigned i = 0; i < k; ++i)
      handoff_rx_st(static_cast<rte_mbuf*>(m[i]), now);
    n += k;
  }
  return n;
}

// A RoCE frame for a QP of worker `home`, decoded: to its ring, unless
// frames for it are already held (they go first) or the ring is full.
void Worker::hand_off_st(uint32_t home, rte_mbuf* m) {
  Held& h = held_[home];
  if (h.n == 0 && rte_ring_enqueue(peers_[home]->handoff_, m) == 0) {
    ctr_.inc(Ctr::roce_handoff);
    handed_ |= 1u << home;
    return;
  }
  if (h.n == kHandoffHold) {  // only a fault stage's release gets here
    ctr_.inc(Ctr::roce_handoff_dropped);
    rte_pktmbuf_free(m);
    return;
  }
  h.m[(h.head + h.n++) % kHandoffHold] = m;
  ++held_total_;
  ctr_.inc(Ctr::roce_handoff_held);
}

// The workers this pass handed frames to: each is woken if it waits (once
// per pass, not per frame: a wake-up check is a full fence).
void Worker::wake_handed_st() {
  while (handed_) {
    const uint32_t home = static_cast<uint32_t>(std::countr_zero(handed_));
    handed_ &= handed_ - 1;
    peers_[home]->wake_.ring();
  }
}

// Offers the held frames again, oldest first, as many as the rings take.
bool Worker::release_held_st() {
  if (held_total_ == 0) return true;
  for (uint32_t home = 0; home < held_.size(); ++home) {
    Held& h = held_[home];
    while (h.n) {
      const uint32_t run = std::min(h.n, kHandoffHold - h.head);  // no wrap
      const unsigned k = rte_ring_enqueue_burst(
          peers_[home]->handoff_, reinterpret_cast<void* const*>(&h.m[h.head]),
          run, nullptr);
      ctr_.add(Ctr::roce_handoff, k);
      if (k) handed_ |= 1u << home;
      h.head = (h.head + k) % kHandoffHold;
      h.n -= k;
      held_total_ -= k;
      if (k < run) break;
    }
  }
  return held_total_ == 0;
}

// A UD SEND to a multicast group (DQPN 0xFFFFFF): taken if a QP of this
// device joined the group, else not ours (the port takes every group's
// frames: all-multicast). Each worker with members gets the frame, shared
// (one reference each), and delivers it to its own.
void Worker::mcast_rx_st(rte_mbuf* m, const wire::FrameInfo& fi,
                         std::span<const wire::ConstBuf> segs, uint64_t now) {
  if (!engine_.device().mcast_group(fi.roce.dgid)) {
    ctr_.inc(Ctr::mcast_not_joined);
    rte_pktmbuf_free(m);
    return;
  }
  ctr_.inc(Ctr::mcast_rx);
  if (!peers_.empty()) {
    std::memcpy(rte_mbuf_to_priv(m), &fi, sizeof fi);
    for (uint32_t home = 0; home < peers_.size(); ++home) {
      if (peers_[home] == this ||
          !peers_[home]->engine_.mcast_member(fi.roce.dgid))
        continue;
      rte_mbuf_refcnt_update(m, 1);
      hand_off_st(home, m);
    }
  }
  if (engine_.mcast_member(fi.roce.dgid)) {
    ctr_.inc(Ctr::roce_rx);
    engine_.rx(fi, segs, now);
  }
  rte_pktmbuf_free(m);
}

// An IGMP frame (RFC 2236): a router's query is answered with a v2 report
// for each IPv4 group the device has members of (or the one it asks
// about), at once rather than after a random delay (one host per port
// here, no report of another host to suppress ours); at most one answer per
// 100 ms, so that a flood of queries costs at most that. Reports of other
// hosts and leaves are not ours.
void Worker::igmp_rx_st(const uint8_t* frame, uint32_t len,
                        const wire::FrameInfo& fi, uint64_t now) {
  const uint32_t l4_len = fi.l3_len - fi.ip_hdr_len;
  uint32_t group = 0;
  if (fi.l4_off + l4_len > len ||
      !host::igmp_query(frame + fi.l4_off, l4_len, &group)) {
    ctr_.inc(Ctr::igmp_other);
    return;
  }
  ctr_.inc(Ctr::igmp_queries_rx);
  if (igmp_answered_ns_ != 0 && now - igmp_answered_ns_ < 100'000'000) {
    ctr_.inc(Ctr::igmp_queries_ignored);
    return;
  }
  igmp_answered_ns_ = now;
  engine_.device().for_each_mcast_group([&](const transport::Gid& g) {
    if (!wire::gid_is_ipv4(g.data())) return;
    const uint32_t ip = wire::gid_to_ipv4(g.data());
    if (group != 0 && ip != group) return;
    rte_mbuf* r = igmp_frame(port_.pool, addrs_, vlan_tci_, ip, false);
    if (!r) return;  // counted by the pool; the next query asks again
    ctr_.inc(Ctr::igmp_reports_tx);
    tx_st(r);
  });
}

// A RoCE frame for one of our QPs that another worker received, checked
// and decoded (handle_st): straight to the engine.
void Worker::handoff_rx_st(rte_mbuf* m, uint64_t now) {
  static_assert(std::is_trivially_copyable_v<wire::FrameInfo>);
  wire::FrameInfo fi;
  std::memcpy(&fi, rte_mbuf_to_priv(m), sizeof fi);
  wire::ConstBuf segs[kMaxSegs];
  const uint32_t n = segs_of(m, segs);
  ctr_.inc(Ctr::roce_rx);
  engine_.rx(fi, {segs, n}, now);
  rte_pktmbuf_free(m);
}

namespace {
uint8_t* roce_ip(rte_mbuf* m, bool* v6) {
  return wire::roce_ip(rte_pktmbuf_mtod(m, uint8_t*), m->data_len, v6);
}
}  // namespace

void MbufFaultOps::corrupt(rte_mbuf* m, uint64_t random) const {
  // The first segment's last byte: a header byte past the IP header of a
  // zero-copy frame, else payload or ICRC; the ICRC check catches either.
  uint8_t* p = rte_pktmbuf_mtod(m, uint8_t*);
  p[m->data_len - 1] ^= static_cast<uint8_t>(1 + random % 255);
}

bool MbufFaultOps::mark_ce(rte_mbuf* m) const {
  return wire::mark_ce(rte_pktmbuf_mtod(m, uint8_t*), m->data_len);
}

void Worker::set_fault(const config::FaultConfig& f, uint64_t seed) {
  // A distinct stream per lcore and direction, all replayed by one seed.
  const uint64_t s = seed ^ (uint64_t{lcore_} << 33);
  rx_fault_.set(f.rx, s ^ 0x5258);
  tx_fault_.set(f.tx, s ^ 0x5458);
}

void Worker::rx_st(rte_mbuf* m, uint64_t now) {
  bool v6;
  if (rx_fault_.on() && roce_ip(m, &v6)) {
    rx_fault_.push_st(m, now);
    return;
  }
  handle_st(m, now);
}

// Frames the fault stages release now: received ones are handled, sent
// ones join the TX burst.
uint32_t Worker::fault_release_st(uint64_t now) {
  uint32_t n = 0;
  if (rx_fault_.pending())
    n += rx_fault_.pop_st(now, [&](rte_mbuf* m) { handle_st(m, now); });
  if (tx_fault_.pending())
    n += tx_fault_.pop_st(now, [&](rte_mbuf* m) { tx_st(m); });
  return n;
}

int Worker::launch(void* self) {
  // An idle worker's wake-up latency is its back-off sleep
  // (lcores.idle.sleep_us), which the kernel stretches by the thread's
  // timer slack, 50 us by default: a 50 us sleep took 137 us on average on
  // the test VM, 85 us with 1 us of slack (perf/README.md).
  prctl(PR_SET_TIMERSLACK, 1000UL);
  static_cast<Worker*>(self)->loop_st();
  return 0;
}

// Host frames (ARP, ICMP, ND, resolved pending packets): when the TX ring
// is full they are dropped and counted; the engine's frames are not (see
// transmit()).
void Worker::tx_st(rte_mbuf* m) {
  if (tx_n_ == burst_) tx_flush_st();
  if (tx_n_ == burst_) {
    ctr_.inc(Ctr::tx_dropped);
    rte_pktmbuf_free(m);
    return;
  }
  tx_[tx_n_++] = m;
  if (tx_n_ == burst_) tx_flush_st();
}

bool Worker::transmit(const transport::TxFrame& f) {
  // Frames to ourselves wait in loop_ across a possible park (when MRs may
  // go away): they are always copied.
  const bool loop = std::memcmp(f.hdr, addrs_.mac.b, 6) == 0;
  // Back-pressure: with the PMD's TX ring full the engine keeps the frame
  // (it retries on a later poll) instead of building it to be dropped.
  if (!loop && tx_n_ == burst_) {
    tx_flush_st();
    if (tx_n_ == burst_) return false;
  }
  if (loop && loop_tail_ - loop_head_ >= kLoopSize) return false;  // likewise
  MbufChain c(port_.pool);
  if (!c.head()) return false;
  bool ok = c.put(f.hdr, f.hdr_len);
  if (f.unsealed) {
    // The ICRC over the payload as copied into the mbufs, each piece
    // summed right after its copy, while it is in the cache.
    wire::TrailerSum sum(f.hdr, *f.unsealed);
    for (const wire::ConstBuf& b : f.payload)
      ok = ok && c.put(b.data, b.len, &sum);
    uint8_t trailer[8];
    ok = ok && c.put(trailer, sum.finish(trailer));
  } else {
    // A payload piece of application memory is attached, not copied (small
    // pieces are cheaper to copy than to chain), if it stays unchanged
    // until the PMD is done with it (f.stable: an RC request's).
    for (const wire::ConstBuf& b : f.payload) {
      const ZeroCopyTx::View* v =
          zc_ && !loop && f.stable ? attachable(*zc_, b) : nullptr;
      ok = ok && (v ? c.attach(b, v->shinfo) : c.put(b.data, b.len));
    }
    ok = ok && c.put(f.trailer, f.trailer_len);
  }
  // Counted once the frame is whole: a frame that fails here is built
  // again later.
  rte_mbuf* head = ok ? c.release() : nullptr;
  if (!head) return false;
  ctr_.add(Ctr::tx_copy_bytes, f.payload_len() - c.referenced());
  ctr_.add(Ctr::tx_zero_copy_bytes, c.referenced());
  ctr_.add(Ctr::tx_zero_copy, c.attached());
  if (loop) {
    // To one of our own GIDs: received on the next loop (whole frame, ICRC
    // checked on the way in), never put on the wire.
    loop_[loop_tail_++ % kLoopSize] = head;
    ctr_.inc(Ctr::roce_loopback);
    return true;
  }
  if (f.loop_to_members && loop_tail_ - loop_head_ < kLoopSize) {
    // A copy for the device's own members of the group (no switch sends a
    // frame back out of the port it came in on). Best effort, as the wire
    // is: no room in loop_, no copy.
    if (rte_mbuf* copy = rte_pktmbuf_copy(head, port_.pool, 0, UINT32_MAX)) {
      loop_[loop_tail_++ % kLoopSize] = copy;
      ctr_.inc(Ctr::mcast_loopback);
    }
  }
  if (tx_fault_.on())
    tx_fault_.push_st(head, now_);
  else
    tx_st(head);
  return true;
}

rte_mbuf* igmp_frame(rte_mempool* pool, const host::HostAddrs& a,
                     uint16_t vlan_tci, uint32_t group, bool leave) {
  rte_mbuf* m = rte_pktmbuf_alloc(pool);
  if (m)
    m->data_len = m->pkt_len = static_cast<uint16_t>(host::build_igmp(
        a, vlan_tci, group, leave, rte_pktmbuf_mtod(m, uint8_t*)));
  return m;
}

transport::DeviceConfig device_config(const config::Config& cfg,
                                      const PortInfo& port,
                                      const host::HostAddrs& addrs) {
  transport::DeviceConfig dc;
  dc.mac = addrs.mac;
  const host::GidTable gids(addrs);
  for (uint32_t i = 0; i < gids.count; ++i)
    std::memcpy(dc.gids[i], gids.gid[i], 16);
  dc.num_gids = static_cast<uint8_t>(gids.count);
  const config::LimitsConfig& l = cfg.limits;
  transport::Limits& t = dc.limits;
  t.max_qp = l.max_qp;
  t.max_qp_wr = l.max_qp_wr;
  t.max_sge = l.max_sge;
  t.max_inline = l.max_inline;
  t.max_cq = l.max_cq;
  t.max_cqe = l.max_cqe;
  t.max_mr = l.max_mr;
  t.max_mr_size = l.max_mr_size;
  t.max_pd = l.max_pd;
  t.max_srq = l.max_srq;
  t.max_srq_wr = l.max_srq_wr;
  t.max_ah = l.max_ah;
  t.max_msg_sz = l.max_msg_sz;
  t.max_rd_atomic = l.max_rd_atomic;
  t.max_dest_rd_atomic = l.max_dest_rd_atomic;
  t.gid_table_len = dc.num_gids;
  dc.vlan = cfg.port.vlan != 0;
  dc.vlan_tci = cfg.port.vlan;
  // IPv6 + UDP + BTH + RETH + ImmDt + ICRC: the largest per-packet overhead
  // of a data packet (Annex A17.4).
  constexpr uint32_t kOverhead = 40 + 8 + 12 + 16 + 4 + 4;
  dc.active_mtu = IBV_MTU_256;
  for (int m = IBV_MTU_4096; m >= IBV_MTU_256; --m) {
    if (transport::mtu_bytes(static_cast<ibv_mtu>(m)) + kOverhead <= port.mtu) {
      dc.active_mtu = static_cast<ibv_mtu>(m);
      break;
    }
  }
  t.max_path_mtu = static_cast<uint8_t>(dc.active_mtu);
  return dc;
}

void Worker::tx_flush_st() {
  if (tx_n_ == 0) return;
  // Sum lengths first: once handed to the PMD an mbuf may be freed.
  uint64_t bytes = 0;
  for (uint16_t i = 0; i < tx_n_; ++i) bytes += tx_[i]->pkt_len;
  const uint16_t sent = rte_eth_tx_burst(port_.port_id, queue_, tx_, tx_n_);
  ctr_.inc(Ctr::tx_bursts);  // calls: on af_packet and tap, one syscall each
  for (uint16_t i = sent; i < tx_n_; ++i) bytes -= tx_[i]->pkt_len;
  ctr_.add(Ctr::tx_packets, sent);
  ctr_.add(Ctr::tx_bytes, bytes);
  if (sent < tx_n_) {
    // The TX ring is full: keep the rest, in order, for the next flush;
    // transmit() refuses new engine frames until there is room.
    ctr_.inc(Ctr::tx_ring_full);
    std::memmove(tx_, tx_ + sent, (tx_n_ - sent) * sizeof tx_[0]);
  }
  tx_n_ = static_cast<uint16_t>(tx_n_ - sent);
}

void Worker::tx_drop_all_st() {
  ctr_.add(Ctr::tx_dropped, tx_n_);
  for (uint16_t i = 0; i < tx_n_; ++i) rte_pktmbuf_free(tx_[i]);
  tx_n_ = 0;
}

void Worker::send_resolve_request_st(const uint8_t gid[16]) {
  rte_mbuf* m = rte_pktmbuf_alloc(port_.pool);
  if (!m) return;  // counted by the pool; the retry timer tries again
  uint8_t* buf = rte_pktmbuf_mtod(m, uint8_t*);
  const uint32_t len = host::build_resolve_request(addrs_, vlan_tci_, gid, buf);
  if (len == 0) {
    rte_pktmbuf_free(m);
    return;
  }
  m->data_len = m->pkt_len = len;
  ctr_.inc(wire::gid_is_ipv4(gid) ? Ctr::arp_tx_request : Ctr::nd_tx_ns);
  tx_st(m);
}

void Worker::send_ip_st(rte_mbuf* m, const uint8_t gid[16], uint64_t now) {
  wire::MacAddr mac;
  switch (nt_.lookup(gid, now, mac)) {
    case host::Lookup::kHit:
      std::memcpy(rte_pktmbuf_mtod(m, uint8_t*), mac.b, 6);
      tx_st(m);
      return;
    case host::Lookup::kFailed:
      ctr_.inc(Ctr::neigh_failed);
      rte_pktmbuf_free(m);
      return;
    case host::Lookup::kPending:
      break;
  }
  if (!pending_.push(m, gid)) {
    ctr_.inc(Ctr::pending_dropped);
    rte_pktmbuf_free(m);
    return;
  }
  ctr_.inc(Ctr::pending_queued);
  bool full = false;
  if (nt_.start(gid, now, &full)) send_resolve_request_st(gid);
  if (full) ctr_.inc(Ctr::neigh_table_full);
}

void Worker::commands_st(uint64_t now) {
  void* obj;
  while (rte_ring_dequeue(cmd_ring_, &obj) == 0) {
    auto* c = static_cast<Command*>(obj);
    ctr_.inc(Ctr::commands);
    int result = 0;
    if (c->kind == Command::Kind::kResolve) {
      bool full = false;
      if (nt_.start(c->gid, now, &full)) send_resolve_request_st(c->gid);
      result = full ? -ENOSPC : 0;
    } else if (c->kind == Command::Kind::kSendFrame) {
      send_ip_st(c->frame, c->gid, now);
      c->frame = nullptr;
    } else if (c->kind == Command::Kind::kPing) {
      rte_mbuf* m = rte_pktmbuf_alloc(port_.pool);
      if (!m) {
        result = -ENOMEM;
      } else if (!wire::gid_is_ipv4(c->gid)) {
        rte_pktmbuf_free(m);
        result = -EAFNOSUPPORT;
      } else {
        const uint32_t len = host::build_icmp_echo_request(
            addrs_, vlan_tci_, wire::gid_to_ipv4(c->gid),
            static_cast<uint16_t>(lcore_), ++ping_seq_,
            rte_pktmbuf_mtod(m, uint8_t*));
        m->data_len = m->pkt_len = len;
        ctr_.inc(Ctr::icmp_echo_req_tx);
        send_ip_st(m, c->gid, now);
      }
    }
    c->result.store(result, std::memory_order_release);
  }
}

bool Worker::accept_l2_st(const rte_mbuf* m) {
  // Before any decoding: a promiscuous port also sees other hosts' unicast
  // frames, which are not ours to count as malformed or anything else.
  if (m->data_len < sizeof(wire::EthHdr)) return true;  // decode says why
  const auto* eth = rte_pktmbuf_mtod(m, const wire::EthHdr*);
  if (!eth->dst.is_multicast() && !(eth->dst == addrs_.mac)) {
    ctr_.inc(Ctr::not_for_us);
    return false;
  }
  uint16_t vid = 0;
  if (eth->ether_type.get() == wire::kEtherTypeVlan &&
      m->data_len >= sizeof(wire::EthHdr) + sizeof(wire::VlanTag))
    vid = rte_pktmbuf_mtod_offset(m, const wire::VlanTag*, sizeof(wire::EthHdr))
              ->tci.get() &
          0xfff;
  if (vid != vlan_tci_) {
    ctr_.inc(Ctr::vlan_mismatch);
    return false;
  }
  return true;
}

void Worker::handle_st(rte_mbuf* m, uint64_t now) {
  ctr_.add(Ctr::rx_bytes, m->pkt_len);
  if (!accept_l2_st(m)) {
    rte_pktmbuf_free(m);
    return;
  }
  wire::ConstBuf segs[kMaxSegs];
  const uint32_t n = segs_of(m, segs);
  wire::FrameInfo& fi = rx_fi_;
  // With the RX IPv4-checksum offload on, a GOOD flag saves the software
  // check; BAD or UNKNOWN fall through to it, so counting stays in one place.
  const bool ip_ok = (m->ol_flags & RTE_MBUF_F_RX_IP_CKSUM_MASK) ==
                     RTE_MBUF_F_RX_IP_CKSUM_GOOD;
  // The ICRC check may mask the headers in place (one CRC call instead of
  // two) in a first segment this lcore alone holds.
  uint8_t* own = RTE_MBUF_DIRECT(m) && rte_mbuf_refcnt_read(m) == 1
                     ? rte_pktmbuf_mtod(m, uint8_t*)
                     : nullptr;
  wire::decode({segs, n}, m->pkt_len, fi, ip_ok, own);

  if (fi.kind == FrameKind::kMalformed) {
    ctr_.add_malformed(fi.why);
    rte_pktmbuf_free(m);
    return;
  }
  uint32_t len = m->data_len;
  host::HostVerdict v = host::HostVerdict::kConsumed;
  uint8_t* frame = rte_pktmbuf_mtod(m, uint8_t*);
  switch (fi.kind) {
    case FrameKind::kRoce:
      if (fi.roce.dqpn == wire::kMulticastQpn) {
        mcast_rx_st(m, fi, {segs, n}, now);
        return;
      }
      if (gids_.find(fi.roce.dgid) < 0) {
        ctr_.inc(Ctr::not_for_us);
        break;
      }
      if (fi.roce.dqpn == 1) {
        // QP1, the GSI: CM MADs for the control thread (cm_server.h).
        if (gsi_ && rte_ring_enqueue(gsi_, m) == 0) {
          ctr_.inc(Ctr::gsi_rx);
          return;
        }
        ctr_.inc(Ctr::gsi_dropped);
        break;
      }
      if (!peers_.empty()) {
        // The QP's home worker runs it: the frame goes there whole.
        const uint32_t home = engine_.home_of(fi.roce.dqpn);
        if (peers_[home] != this) {
          // The decoding (ICRC checked) travels in the mbuf's private area
          // (port.cc sizes it): the home worker does not decode again.
          std::memcpy(rte_mbuf_to_priv(m), &fi, sizeof fi);
          hand_off_st(home, m);
          return;
        }
      }
      ctr_.inc(Ctr::roce_rx);
      // Packets for unknown QPs are dropped silently (IBTA 9.6.1.1) and
      // counted by the engine (transport rx_no_qp).
      engine_.rx(fi, {segs, n}, now);
      break;
    case FrameKind::kArp:
      v = host::handle_arp(addrs_, nt_, ctr_, frame, &len, fi, now);
      break;
    case FrameKind::kIcmpv4:
      if (m->nb_segs == 1)
        v = host::handle_icmpv4(addrs_, ctr_, frame, &len, fi);
      else
        ctr_.inc(Ctr::icmp_other);
      break;
    case FrameKind::kIcmpv6:
      if (m->nb_segs == 1)
        v = host::handle_icmpv6(addrs_, nt_, ctr_, frame, &len,
                                m->data_len + rte_pktmbuf_tailroom(m), fi, now);
      else
        ctr_.inc(Ctr::icmp6_other);
      break;
    case FrameKind::kOtherIp:
      if (fi.l4_proto == wire::kIpProtoIgmp && m->nb_segs == 1)
        igmp_rx_st(frame, m->data_len, fi, now);
      else
        ctr_.inc(Ctr::non_roce_ignored);
      break;
    case FrameKind::kOtherL2:
      ctr_.inc(Ctr::other_l2);
      break;
    case FrameKind::kMalformed:
      break;
  }
  if (v == host::HostVerdict::kReply) {
    m->data_len = static_cast<uint16_t>(len);
    m->pkt_len = len;
    tx_st(m);
  } else {
    rte_pktmbuf_free(m);
  }
}

// Waiting for events needs a frame to wake the lcore (its queue's
// readiness fd) and nothing that only time brings: no engine timer armed
// (a QP with packets out, a pacing limiter), no neighbour resolution
// pending, nothing held back in a ring, a fault stage or the TX buffer.
bool Worker::can_wait_st() const {
  return cfg_.lcores.idle.wait_ms && wake_.covers_rx() && engine_.quiet() &&
         pending_.size() == 0 && tx_n_ == 0 && held_total_ == 0 &&
         loop_head_ == loop_tail_ && !rx_fault_.pending() &&
         !tx_fault_.pending();
}

// The queue's RX interrupt (a PCI port on vfio) is on from the
// announcement, before the poll that precedes the wait: a frame that
// arrives after that poll raises it.
void Worker::announce_st() {
  if (port_.rx_intr) rte_eth_dev_rx_intr_enable(port_.port_id, queue_);
  wake_.announce_st();
  if (shim_) shim_->set_waiting_st(queue_, true);
}

void Worker::withdraw_st() {
  wake_.withdraw_st();
  if (shim_) shim_->set_waiting_st(queue_, false);
  if (port_.rx_intr) rte_eth_dev_rx_intr_disable(port_.port_id, queue_);
}

void Worker::loop_st() {
  const config::IdleConfig& idle = cfg_.lcores.idle;
  uint32_t empty_polls = 0;
  uint64_t control_burst_until = 0;  // ns: poll, neither yield nor sleep
  uint64_t next_timer = 0;
  // The idle the last pass chose (a wait, a sleep, a yield): when it began
  // (0: none) and how much of the time until the next pass it may cover.
  uint64_t idle_t0 = 0, idle_cap = 0;
  uint64_t last_busy = 0;  // ns: the last pass that had anything to do
  rte_mbuf* pkts[config::kMaxBurst];
  uint64_t t_prev = rte_rdtsc();
  while (!g_quit.load(std::memory_order_relaxed)) {
    // The control thread may change shared tables now. Parks come in runs
    // (a QP's create and three modifies, a client's set-up): after one the
    // idle lcore polls on for kControlBurstNs, so the next park finds it
    // awake (on the test VM a modify_qp took ~15 us with a polling lcore,
    // 60-90 us when its park had to wake the lcore from a sleep, futex or
    // nanosleep alike), and does not yield meanwhile: on a CPU shared
    // with other runnable threads a yield gave it away for a time slice,
    // a sleeper is woken at once (perf/README.md, "control path").
    const bool parked = gate_.check_st();
    const uint64_t now = now_ns();
    if (parked) {
      control_burst_until = now + kControlBurstNs;
      // The client list may have changed meanwhile: a new client's page
      // does not say this lcore waits. Announced again when idle.
      if (wake_.announced_st()) withdraw_st();
    }
    // Off the CPU since the last pass, beyond the idle it chose (a sleep,
    // a wait or a yield, and up to kIdleLateNs more for the CPU to come
    // back from one): the engine's timers stand still that long
    // (Engine::lcore_paused). Time after a yield counted as a pause once:
    // with a busy thread on the lcore's CPU every pass yielded for a time
    // slice, so the timers' clock all but stopped, and a QP whose loss only
    // its timer could find stalled until the CPU went quiet (perf/README.md,
    // "Timers that never ran").
    const uint64_t chosen = idle_t0 ? std::min(now - idle_t0, idle_cap) : 0;
    idle_t0 = 0;
    if (now_ && now - now_ > chosen + kPauseNs) {
      const uint64_t paused = now - now_ - chosen;
      engine_.lcore_paused(now, paused);
      ctr_.inc(Ctr::lcore_pauses);
      ctr_.add(Ctr::lcore_paused_us, paused / 1000);
    }
    now_ = now;
    // 1. Commands from the control thread and resolution timers.
    if (now >= next_timer) {
      commands_st(now);
      pending_.poll(
          nt_, now,
          [&](rte_mbuf* m, const wire::MacAddr& mac) {
            std::memcpy(rte_pktmbuf_mtod(m, uint8_t*), mac.b, 6);
            ctr_.inc(Ctr::pending_sent);
            tx_st(m);
          },
          [&](rte_mbuf* m) {
            ctr_.inc(Ctr::neigh_failed);
            rte_pktmbuf_free(m);
          },
          [&](const uint8_t* gid) { send_resolve_request_st(gid); });
      next_timer = now + kTimerNs;
    }
    // 2. New work requests the applications rang for (shim doorbells),
    // before the frames: a receive WQE posted before a SEND arrived must be
    // there for it. After a sleep both wait here; frames first made a UD or
    // UC SEND find no receive (dropped; perftest -c UD -a hung) and an RC
    // one an RNR NAK.
    uint32_t local = 0;
    if (shim_) {
      uint32_t rung = 0;
      const uint32_t wqes = shim_->doorbells_st(queue_, &rung);
      if (wqes) ctr_.add(Ctr::shim_wqes, wqes);
      if (rung) ctr_.add(Ctr::doorbells, rung);
      local += wqes;
    }
    // 2b. Receive, classify, handle; not while frames wait for room in
    // another worker's hand-off ring (back-pressure: the backlog stays in
    // the port's ring, where a loss is the PMD's RX-missed, not ours).
    uint16_t n = 0;
    if (release_held_st()) {
      n = rte_eth_rx_burst(port_.port_id, queue_, pkts, burst_);
      if (n) {
        ctr_.inc(Ctr::rx_bursts);
        ctr_.add(Ctr::rx_packets, n);
      }
    } else {
      ctr_.inc(Ctr::rx_held);
    }
    for (uint16_t i = 0; i < n; ++i) {
      if (i + 1 < n) rte_prefetch0(rte_pktmbuf_mtod(pkts[i + 1], void*));
      rx_st(pkts[i], now);
    }
    local += local_rx_st(now);
    local += fault_release_st(now);
    // 3. Transport: timers, requester/responder transmit work, deferred
    // ACKs; then transmit what the burst and the engine produced.
    // A full burst: more frames wait in the ring, the peer's answers may be
    // among them, and the engine's timers wait until they are read (at
    // most kTimerDeferNs). After a pause of the lcore's own its timers
    // stood still (lcore_paused above), but a ring that filled meanwhile
    // takes a few hundred us to read, and timers due in that time fired
    // for answers still in it (perf/README.md, "the lcore's own pauses").
    bool timers = true;
    if (n == burst_) {
      if (!timers_deferred_ns_) timers_deferred_ns_ = now;
      timers = now - timers_deferred_ns_ >= kTimerDeferNs;
      if (!timers) ctr_.inc(Ctr::timers_deferred);
    }
    if (timers) timers_deferred_ns_ = 0;
    const uint32_t work = engine_.poll(now, timers);
    if (tx_fault_.pending()) local += fault_release_st(now_ns());
    tx_flush_st();
    if (handed_) wake_handed_st();
    // 4. Poll accounting and idle back-off (poll -> pause -> sleep); never
    // sleep while the engine has packets it could send.
    const uint64_t t = rte_rdtsc();
    // Frames waiting in a fault stage (delay, bottleneck) keep it polling.
    // Transmit work behind a full TX ring is not: the peer that drains the
    // ring may need this CPU (memif, two services on shared cores: 16 QPs
    // spinning on a full ring got 2.1 Gb/s where 1 QP got 16.7), so the
    // back-off applies, and every pass still flushes and retries. So is
    // a wait for room in another worker's hand-off ring (the frames held
    // and the looped ones behind them): that worker may need this CPU.
    const bool tx_blocked = tx_n_ > 0;
    if (n || local || work || (engine_.busy() && !tx_blocked) ||
        (loop_head_ != loop_tail_ && held_total_ == 0) || rx_fault_.pending() ||
        tx_fault_.pending()) {
      ctr_.inc(Ctr::poll_busy);
      ctr_.add(Ctr::cycles_busy, t - t_prev);
      empty_polls = 0;
      last_busy = now;
      if (wake_.announced_st()) withdraw_st();
    } else {
      ctr_.inc(Ctr::poll_idle);
      ctr_.add(Ctr::cycles_idle, t - t_prev);
      ++empty_polls;
      if (now_ < control_burst_until) {
        rte_pause();
      } else if (empty_polls > idle.spin_polls + idle.pause_polls &&
                 idle.sleep_us) {
        if (can_wait_st()) {
          // Wait for events rather than sleep a fixed time (wake.h): first
          // announce it and poll once more (this pass's poll came before
          // anyone could know), commands included (one posted since the
          // last look rang no bell), then wait.
          if (!wake_.announced_st()) {
            announce_st();
            next_timer = 0;
          } else {
            idle_t0 = now_ns();
            idle_cap = UINT64_MAX;  // no timer is armed while it waits
            const unsigned why = wake_.wait_st(static_cast<int>(idle.wait_ms));
            if (why == Wake::kTimedOut) ctr_.inc(Ctr::idle_wait_timeouts);
            if (why & Wake::kRx) ctr_.inc(Ctr::idle_wakes_rx);
            withdraw_st();
            ctr_.inc(Ctr::idle_waits);
            next_timer = 0;  // look at timers and commands at once
          }
        } else {
          // No QP on the whole device (not just here: another worker's
          // frames may land on this one's queue) and nothing done for
          // kQuietNs: nothing can wait on this lcore but ARP/ND, pings, CM
          // MADs (ms timeouts) and commands (polled every kTimerNs anyway),
          // so sleep longer. Each sleep and wake-up cost this VM ~25 us of
          // CPU: 50 us sleeps kept an idle worker ~30 % busy (perf/README.md,
          // "An idle service"). The quiet second keeps a run of pings or a
          // CM exchange on the short sleeps after its first frame. Creating
          // a QP parks its home lcore, which wakes it.
          const bool no_qp = engine_.device().qp_total() == 0 &&
                             idle.no_qp_sleep_us > idle.sleep_us &&
                             now - last_busy >= kQuietNs;
          const uint64_t ns =
              uint64_t{no_qp ? idle.no_qp_sleep_us : idle.sleep_us} * 1000;
          idle_t0 = now_ns();
          idle_cap = ns + kIdleLateNs;
          gate_.sleep_st(ns);  // park() wakes it
          ctr_.inc(no_qp ? Ctr::idle_sleeps_no_qp : Ctr::idle_sleeps);
          next_timer = 0;  // slept: look at timers and commands at once
        }
      } else if (empty_polls > idle.spin_polls) {
        // yield: an application thread sharing this CPU runs now rather
        // than after the scheduler's slice (milliseconds).
        if (idle.yield) {
          idle_t0 = now_ns();
          idle_cap = kIdleLateNs;
          sched_yield();
        } else {
          rte_pause();
        }
      }
    }
    // Time spent pausing or sleeping is idle time too.
    const uint64_t t_end = rte_rdtsc();
    if (!n) ctr_.add(Ctr::cycles_idle, t_end - t);
    t_prev = t_end;
  }
  tx_flush_st();
  tx_drop_all_st();  // what the port did not take by shutdown
  gate_.set_running(false);
}

}  // namespace urnic::service
