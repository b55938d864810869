// A queue pair: its verbs attributes, send/receive queues and the state of
// its three roles (requester, completer, responder). Only the engine of the
// QP's lcore touches it; see BEHAVIOUR.md for the rules each role follows.
#pragma once

#include <atomic>
#include <cstdint>
#include <iterator>
#include <vector>

#include "dataplane/transport/congestion.h"
#include "dataplane/transport/objects.h"
#include "dataplane/transport/timer_wheel.h"
#include "dataplane/transport/types.h"
#include "dataplane/wire/codec.h"

namespace urnic::transport {

constexpr uint32_t kFirstQpn = 0x11;  // QPN 0 and 1 are SMI/GSI

// Per-QP counters (urnicctl qps, urnic-perf), written only by the QP's
// lcore (plain load+store, no locked RMW) and read relaxed by the control
// thread. NAKs are counted by type as the engine's ECtr ones are.
// clang-format off
#define URNIC_QP_COUNTERS(X)                                                 \
  X(tx_packets)      X(rx_packets)      X(retransmits)     X(timeouts)       \
  X(rnr_waits)       X(dup_packets)     X(out_of_seq)      X(acks_tx)        \
  X(acks_rx)         X(naks_seq_rx)     X(naks_rnr_rx)     X(naks_access_rx) \
  X(naks_inv_req_rx) X(naks_op_rx)      X(naks_seq_tx)     X(naks_rnr_tx)    \
  X(naks_access_tx)  X(naks_inv_req_tx) X(naks_op_tx)      X(cq_overflows)  \
  X(cc_window_cuts)  X(cc_window)       X(cnps_tx)         X(cnps_rx)        \
  X(cc_rate_cuts)    X(cc_rate_mbps)      X(tail_probes)     X(nak_cause)     \
  X(srtt_us)
// clang-format on
// cc_window (the current congestion window, packets), cc_rate_mbps (the
// DCQCN rate, 0 while unlimited), nak_cause (the RespResult the QP last
// refused a request for, 0 = none) and srtt_us (the smoothed round trip of
// its requests, RFC 6298; 0 before the first sample) are gauges, the rest
// count events. A QP's share of the shared window over its round trip is
// its rate: QPs of one lcore whose round trips differ get different rates.

// What the responder made of one request packet: ok, RNR, or the one
// reason it refused it. Each refusal has its engine counter, NAK and name
// (responder.cc, resp_error()); urnicctl qps shows a QP's last one.
// clang-format off
#define URNIC_RESP_RESULTS(X)                                                \
  X(ok)              X(rnr)             X(rkey_invalid)    X(rkey_pd)        \
  X(rkey_bounds)     X(rkey_rights)     X(qp_access)       X(opcode_seq)     \
  X(opcode_length)   X(write_length)    X(rd_atomic_over)  X(atomic_misaligned) \
  X(recv_too_small)  X(recv_bad_lkey)    X(invalidate_rkey) X(msg_too_long)
// clang-format on
enum class RespResult : uint8_t {
#define URNIC_RESP_ENUM(n) n,
  URNIC_RESP_RESULTS(URNIC_RESP_ENUM)
#undef URNIC_RESP_ENUM
};
constexpr const char* kRespResultNames[] = {
#define URNIC_RESP_NAME(n) #n,
    URNIC_RESP_RESULTS(URNIC_RESP_NAME)
#undef URNIC_RESP_NAME
};
constexpr size_t kNumRespResults = std::size(kRespResultNames);

constexpr const char* kQpCtrNames[] = {
#define URNIC_QCTR_NAME(n) #n,
    URNIC_QP_COUNTERS(URNIC_QCTR_NAME)
#undef URNIC_QCTR_NAME
};
constexpr size_t kNumQpCtr = std::size(kQpCtrNames);

class QpCounter {
 public:
  QpCounter& operator++() {
    v_.store(v_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    return *this;
  }
  uint64_t get() const { return v_.load(std::memory_order_relaxed); }
  void set(uint64_t v) { v_.store(v, std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

struct QpCounters {
#define URNIC_QCTR_FIELD(n) QpCounter n;
  URNIC_QP_COUNTERS(URNIC_QCTR_FIELD)
#undef URNIC_QCTR_FIELD
  // f(name, value) for every counter, in declaration order.
  template <class F>
  void for_each(F&& f) const {
#define URNIC_QCTR_VISIT(n) f(#n, n.get());
    URNIC_QP_COUNTERS(URNIC_QCTR_VISIT)
#undef URNIC_QCTR_VISIT
  }
  uint64_t naks_rx() const {
    return naks_seq_rx.get() + naks_rnr_rx.get() + naks_access_rx.get() +
           naks_inv_req_rx.get() + naks_op_rx.get();
  }
  uint64_t naks_tx() const {
    return naks_seq_tx.get() + naks_rnr_tx.get() + naks_access_tx.get() +
           naks_inv_req_tx.get() + naks_op_tx.get();
  }
};

// A local SGE resolved to host memory once, when its WR is first used.
struct HostSge {
  uint8_t* p = nullptr;
  uint32_t len = 0;
};

// A posted send WR. Its SGEs, their resolution and its inline bytes live
// in arrays of the QP sized from its caps (Qp::sq_sge_, sq_host_,
// sq_inline_); the pointers are set once, at create_qp, and never change.
// A UD WR's address vector is in Qp::sq_av_, at the WQE's own index.
// (A WQE of kMaxSge and kMaxInline room was 872 B: 111 KiB per QP for 128
// WRs.)
struct SendWqe {
  SendWrHead wr;
  Sge* sge = nullptr;              // max_send_sge entries
  HostSge* host_sg = nullptr;      // max_send_sge entries (>= 1)
  uint8_t* inline_data = nullptr;  // max_inline_data bytes (null if 0)
  uint32_t length = 0;             // message bytes
  uint32_t npkts = 0;              // PSNs the message uses
  uint32_t first_psn = 0;          // valid once started
  uint32_t last_psn = 0;
  bool started = false;   // PSNs assigned (at least one packet sent)
  bool resolved = false;  // host_sg valid
  bool done = false;      // READ/ATOMIC response fully received
  ibv_wc_status local_err = IBV_WC_SUCCESS;  // found when resolving
};

// A posted receive WR; its SGEs are in Qp::rq_sge_ (max_recv_sge each).
struct RecvWqe {
  uint64_t wr_id = 0;
  uint32_t num_sge = 0;
  Sge* sge = nullptr;
};

// Saved state of a READ or ATOMIC request (IBTA 9.7.5.1.5 responder
// resources): used to send the responses and to answer duplicates.
struct RespResource {
  enum Kind : uint8_t { kFree, kRead, kAtomic, kAtomicWrite } kind = kFree;
  uint32_t first_psn = 0;
  uint32_t last_psn = 0;
  uint64_t orig = 0;  // atomic: value before execution
  uint32_t rkey = 0;
  // Responses still to send: next PSN, position, bytes left.
  bool pending = false;
  bool replay = false;  // pending only because a duplicate asked again
  uint32_t tx_psn = 0;
  uint32_t tx_first = 0;  // PSN of the request being answered
  uint8_t* tx_p = nullptr;
  uint32_t tx_left = 0;
  uint32_t tx_total = 0;
};

class Qp;

// Membership of a QP in one of the engine's intrusive FIFO lists.
struct QpLink {
  Qp* next = nullptr;
  bool on = false;
};

// An intrusive FIFO of QPs through the QpLink member `Link`: O(1) push and
// pop, no allocation; a QP is on a given list at most once.
template <QpLink Qp::*Link>
class QpList {
 public:
  bool empty() const { return head_ == nullptr; }
  Qp* tail() const { return tail_; }
  void push_back(Qp& qp);
  void push_front(Qp& qp);
  Qp* pop_front();
  void remove(Qp& qp);  // O(n): control path only

 private:
  Qp* head_ = nullptr;
  Qp* tail_ = nullptr;
};

class Qp {
 public:
  uint32_t qpn() const { return qpn_; }
  ibv_qp_state state() const { return state_; }
  ibv_qp_type type() const { return type_; }
  // In SQD with a WR started and not yet complete (IBTA 10.3.1): not yet
  // drained, and IBV_EVENT_SQ_DRAINED still to come.
  bool sq_draining() const {
    return state_ == IBV_QPS_SQD && (sq_head_ != sq_next_ || req_.offset != 0);
  }
  const QpCounters& counters() const { return ctr_; }

  void set_owner(const Owner& o) { owner_ = o; }

  // --- everything below is engine-internal ---
  uint32_t qpn_ = 0;
  uint32_t index_ = 0;
  ibv_qp_type type_ = IBV_QPT_RC;
  ibv_qp_state state_ = IBV_QPS_RESET;
  Pd* pd_ = nullptr;
  Cq* send_cq_ = nullptr;
  Cq* recv_cq_ = nullptr;
  Srq* srq_ = nullptr;
  ibv_qp_cap cap_{};
  bool sq_sig_all_ = false;

  // Attributes (ibv_modify_qp).
  ibv_qp_attr attr_{};  // as last set, for query_qp
  Path path_;
  wire::RoceFields tmpl_;     // addresses + dest QPN of every RC/UC packet
  wire::HeaderTemplate hdr_;  // tmpl_'s Ethernet..UDP bytes, prebuilt
  uint32_t mtu_ = 1024;
  uint32_t dest_qpn_ = 0;
  uint32_t qkey_ = 0;
  uint32_t access_ = 0;
  uint64_t timeout_ns_ = 0;  // 0: no retransmit timer
  uint8_t retry_cnt_ = 7;
  uint8_t rnr_retry_ = 7;
  uint8_t min_rnr_timer_ = 0;
  uint8_t max_rd_atomic_ = 1;
  uint8_t max_dest_rd_atomic_ = 1;
  bool sqd_notify_ = false;
  uint16_t udp_sport_ = 0xc000;
  uint32_t mcast_ = 0;           // multicast groups attached (UD)
  bool block_mcast_lb_ = false;  // IBV_QP_CREATE_BLOCK_SELF_MCAST_LB

  // Send queue: [sq_head_, sq_tail_) posted and not completed; the
  // requester's cursor sq_next_ is in between. Indices run freely.
  std::vector<SendWqe> sq_;
  std::vector<Sge> sq_sge_;
  std::vector<HostSge> sq_host_;
  std::vector<uint8_t> sq_inline_;
  // UD only: each WR's AH address, copied at post, as mlx5 writes the
  // address vector into the WQE: the AH may go once the post returns.
  std::vector<Path> sq_av_;
  uint32_t sq_mask_ = 0;
  uint32_t sq_head_ = 0;  // completer: oldest not completed
  uint32_t sq_next_ = 0;  // requester: WQE being / to be sent
  uint32_t sq_tail_ = 0;  // producer (post_send)
  SendWqe& sqe(uint32_t i) { return sq_[i & sq_mask_]; }
  const Path& sq_av(const SendWqe& w) const { return sq_av_[&w - sq_.data()]; }
  // Whether this QP's state points into host memory [lo, hi): a posted
  // send's resolved buffers, a receive or a WRITE in progress, READ
  // responses still to send. Memory under such a pointer must stay mapped
  // (the shim refuses to deregister its MR, EBUSY). Lcore parked.
  bool uses_memory(const uint8_t* lo, const uint8_t* hi) const;

  // Receive queue (unless an SRQ is used).
  std::vector<RecvWqe> rq_;
  std::vector<Sge> rq_sge_;
  uint32_t rq_mask_ = 0;
  uint32_t rq_head_ = 0;
  uint32_t rq_tail_ = 0;

  // Requester.
  struct Req {
    uint32_t psn = 0;        // next PSN to send
    uint32_t max_psn = 0;    // one past the highest PSN ever sent
    uint32_t offset = 0;     // bytes of sqe(sq_next_) already sent
    uint32_t rd_atomic = 0;  // READ/ATOMIC requests outstanding (rd_reqs_)
    uint32_t pkts_since_ackreq = 0;
    bool ackreq_next = false;  // first packet after a go-back asks for an ACK
  } req_;
  // The READ/ATOMIC requests sent whose responses have not all arrived,
  // oldest first: a ring of max_rd_atomic_ slots (more only if the limit
  // was lowered under outstanding ones), req_.rd_atomic of them from
  // rd_head_. Each holds a max_rd_atomic credit (a responder resource at
  // the peer, IBTA 9.7.5.1.5). A READ larger than the window is asked for
  // in several requests, and a request sent again after a go-back asks
  // for no more than its record: the same extent the responder holds.
  struct RdReq {
    uint32_t first_psn = 0;
    uint32_t last_psn = 0;
  };
  std::vector<RdReq> rd_reqs_;
  uint32_t rd_head_ = 0;
  // The outstanding request whose PSNs hold `psn`, or null.
  const RdReq* rd_req_at(uint32_t psn) const;
  // Drops the requests the completer has passed (all their responses in).
  void retire_rd_reqs();
  // Appends a request (a credit must be free: rd_atomic < max_rd_atomic_).
  void push_rd_req(uint32_t first_psn, uint32_t last_psn);
  // Sizes the ring for max_rd_atomic_, keeping what is outstanding.
  void size_rd_reqs();

  // Completer.
  struct Comp {
    uint32_t psn = 0;  // oldest unacknowledged PSN
    uint8_t retries_left = 7;
    uint8_t rnr_left = 7;
    bool rnr_wait = false;  // waiting for the RNR timer
    uint32_t rnr_psn = 0;
    bool drained_sent = false;   // IBV_EVENT_SQ_DRAINED raised
    bool went_back = false;      // went back to went_back_psn, no progress
    uint32_t went_back_psn = 0;  // since: a NAK for it is not news
  } comp_;
  LossWindow cc_;             // congestion window (congestion.h)
  uint32_t cc_out_ = 0;       // its packets in flight as the engine counts them
  QpLink cc_wait_link_;       // waiting for a grant of the shared window
  bool cc_admitted_ = false;  // granted: its next packet goes
  uint32_t cc_burst_ = 0;     // packets sent since it started from none
  uint64_t cnp_sent_ns_ = 0;  // responder: when it last sent a CNP
  bool cnp_sent_ = false;
  DcqcnRate rate_;  // DCQCN reaction point and pacer (congestion.h)
  TimerNode retrans_timer_;
  TimerNode rnr_timer_;
  TimerNode pace_timer_;   // the pacer lets the QP send again
  TimerNode probe_timer_;  // tail-loss probe (EngineConfig::tail_probe_ns)
  // The probe is due at probe_due_ns_; its timer may be set earlier (at
  // probe_set_ns_), then it moves on when it fires (Engine::arm_probe).
  uint64_t probe_due_ns_ = 0;
  uint64_t probe_set_ns_ = 0;
  uint32_t probes_ = 0;  // probes since the last progress
  // A probe's time runs from probe_from_ns_ (the newest send with AckReq,
  // or progress). The first probe since progress ran from probe_t0_ns_,
  // the newest left at probe_sent_ns_. An answer a probe time or more
  // after the newest says the peer had paused, for the whole silence,
  // which the probe time keeps as its floor for 1-2 s (pause_,
  // Engine::rtt_progress).
  uint64_t probe_from_ns_ = 0;
  uint64_t probe_t0_ns_ = 0;
  uint64_t probe_sent_ns_ = 0;
  RecentMax pause_;
  // Last PSN of the newest packet sent with AckReq: a response is due only
  // for packets up to there, so the probe runs from that send.
  uint32_t ackreq_psn_ = 0;
  bool probe_due_ = false;  // the next packet is a probe: past the window
  // The probe is the oldest unacknowledged packet alone: once it is sent,
  // the requester goes on from probe_resume_ (cleared by any go_to_st).
  bool probe_one_ = false;
  uint32_t probe_resume_ = 0;
  // Round trip of the QP: one AckReq packet timed at a time (rtt_psn_),
  // not a resent one (Karn); srtt_ns_ 0 until the first sample.
  uint64_t srtt_ns_ = 0;
  uint64_t rttvar_ns_ = 0;
  uint64_t rtt_sent_ns_ = 0;
  // Packets ACKed (this QP's, the engine's) when the timed one left.
  uint64_t rtt_delivered_ = 0;
  uint64_t rtt_shared_delivered_ = 0;
  uint32_t rtt_psn_ = 0;
  bool rtt_timing_ = false;

  // Responder.
  struct Resp {
    uint32_t epsn = 0;  // expected PSN
    // The last SEND/WRITE packet executed: the PSN a duplicate SEND/WRITE is
    // acknowledged with. Not ePSN - 1, which may be a READ's or an ATOMIC's:
    // a plain ACK there completes that request at an rxe requester without
    // its data (rxe_comp.c takes an ACK at a pending READ's last PSN as its
    // completion; rxe's own responder keeps ack_psn for this).
    uint32_t sw_psn = 0;
    uint32_t msn = 0;
    bool nak_sent = false;  // sequence NAK already sent for this gap
    enum Msg : uint8_t { kNone, kSend, kWrite } msg = kNone;
    bool uc_drop = false;  // UC: discarding until the next FIRST/ONLY
    // SEND in progress
    bool have_recv = false;
    RecvWr recv;
    HostSge recv_sg[kMaxSge];
    uint32_t recv_nsg = 0;
    uint32_t recv_cap = 0;  // bytes the receive buffers hold
    uint32_t recv_off = 0;
    // WRITE in progress
    uint8_t* wr_p = nullptr;
    uint32_t wr_left = 0;
    uint32_t wr_total = 0;
    // Deferred ACK / NAK (one slot: a later one supersedes).
    bool ack_pending = false;
    uint8_t ack_syndrome = 0;
    uint32_t ack_psn = 0;
    bool fatal = false;  // move to ERR once the pending NAK is out
    // The move raises the NAK's affiliated asynchronous error: no receive
    // WQE's completion reports the cause (IBTA 9.9.3.1.3, C9-222.1).
    bool fatal_event = false;
  } resp_;
  std::vector<RespResource> res_;  // ring of max_dest_rd_atomic entries
  uint32_t res_next_ = 0;          // next slot to use, < res_.size()
  // Set with every RespResource::pending, cleared once a pass over res_
  // finds none: with no READ or ATOMIC in progress (every WRITE or SEND
  // packet, every ACK) res_, up to 16 entries of its own cache line each,
  // is not walked, and with many QPs it is cold.
  bool res_any_pending_ = false;

  // Engine lists.
  QpLink ready_link_;       // on the engine's list of QPs with transmit work
  bool turn_cont_ = false;  // TX turn interrupted by a full queue:
  uint32_t turn_pkts_ = 0;  // packets and bytes left of it
  int64_t turn_bytes_ = 0;
  QpLink ack_link_;  // has an ACK/NAK/atomic ACK to send

  QpCounters ctr_;

  // Indices shared with the verbs shim (null for in-process QPs): send WQEs
  // retired, receive WQEs taken (each plus a bias the service adds for WQEs
  // it refused before they reached the engine), and the state, so the
  // application's rings free slots and its posts see ERR.
  std::atomic<uint32_t>* pub_sq_done_ = nullptr;
  std::atomic<uint32_t>* pub_rq_done_ = nullptr;
  std::atomic<uint32_t>* pub_state_ = nullptr;
  // The host's handle of the ring the application posts receive WRs to
  // (opaque here; RecvSource::refill's).
  void* recv_ring_ = nullptr;
  uint32_t sq_pub_bias_ = 0;
  uint32_t rq_pub_bias_ = 0;
  // Read only when an async event is raised: last, off the lines the
  // packet path reads.
  Owner owner_;
  void publish_sq() {
    if (pub_sq_done_)
      pub_sq_done_->store(sq_head_ + sq_pub_bias_, std::memory_order_release);
  }
  void publish_rq() {
    if (pub_rq_done_)
      pub_rq_done_->store(rq_head_ + rq_pub_bias_, std::memory_order_release);
  }
  void set_state(ibv_qp_state s) {
    state_ = s;
    if (pub_state_) pub_state_->store(s, std::memory_order_release);
  }
};

template <QpLink Qp::*Link>
void QpList<Link>::push_back(Qp& qp) {
  QpLink& l = qp.*Link;
  if (l.on) return;
  l = {nullptr, true};
  (tail_ ? (tail_->*Link).next : head_) = &qp;
  tail_ = &qp;
}

template <QpLink Qp::*Link>
void QpList<Link>::push_front(Qp& qp) {
  QpLink& l = qp.*Link;
  if (l.on) return;
  l = {head_, true};
  head_ = &qp;
  if (!tail_) tail_ = &qp;
}

template <QpLink Qp::*Link>
Qp* QpList<Link>::pop_front() {
  Qp* qp = head_;
  if (!qp) return nullptr;
  head_ = (qp->*Link).next;
  if (!head_) tail_ = nullptr;
  qp->*Link = {};
  return qp;
}

template <QpLink Qp::*Link>
void QpList<Link>::remove(Qp& qp) {
  if (!(qp.*Link).on) return;
  Qp* prev = nullptr;
  for (Qp* q = head_; q; prev = q, q = (q->*Link).next) {
    if (q != &qp) continue;
    (prev ? (prev->*Link).next : head_) = (q->*Link).next;
    if (tail_ == q) tail_ = prev;
    break;
  }
  qp.*Link = {};
}

}  // namespace urnic::transport
