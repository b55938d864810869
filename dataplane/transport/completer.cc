// Completer: ACK/NAK, read responses and atomic ACKs (IBTA 9.7.5.2), the
// retransmit timer (9.7.6.1.3), RNR back-off (9.7.5.2.8), go-back-N, and
// error completions.
#include <algorithm>

#include "dataplane/transport/psn.h"
#include "dataplane/transport/roles.h"

namespace urnic::transport {
namespace {

namespace aeth = wire::aeth;

// Completes the SEND/WRITE WRs that PSNs before `end` acknowledge. Returns
// true if it stopped at a READ/ATOMIC lying entirely before `end` whose
// response has not fully arrived, or at a READ with responses before `end`
// still missing: they were lost (9.7.5.2.3). (A READ asked for in several
// requests, Qp::rd_reqs_, has request boundaries inside its PSNs, and a
// NAK may be for one of them.)
bool ack_through(Engine& e, Qp& qp, uint32_t end) {
  while (qp.sq_head_ != qp.sq_tail_ && qp.state_ != IBV_QPS_ERR) {
    SendWqe& w = qp.sqe(qp.sq_head_);
    if (!w.started) break;
    if (psn_diff(w.last_psn, end) >= 0) {
      const uint32_t next =
          psn_after(qp.comp_.psn, w.first_psn) ? qp.comp_.psn : w.first_psn;
      return w.wr.opcode == IBV_WR_RDMA_READ && psn_before(next, end);
    }
    if (needs_response(w.wr.opcode) && !w.done) return true;
    e.complete_head(qp, IBV_WC_SUCCESS);
  }
  return false;
}

// The oldest unacknowledged PSN after WRs were completed.
void sync_comp_psn(Qp& qp) {
  if (qp.sq_head_ == qp.sq_tail_) return;
  const SendWqe& w = qp.sqe(qp.sq_head_);
  if (w.started && psn_after(w.first_psn, qp.comp_.psn))
    qp.comp_.psn = w.first_psn;
}

// The congestion window follows the oldest unacknowledged PSN.
void cc_progress(Engine& e, Qp& qp) {
  e.cc_sync(qp);
  if (!e.config().cc.window) return;
  const uint32_t acked = qp.cc_.on_progress(e.config().cc, qp.comp_.psn);
  // What was in use when these ACKs left the peer: still in flight or
  // granted, and what they acknowledge.
  e.cc_shared_.on_acked(e.config().cc, acked, e.cc_committed() + acked);
  qp.ctr_.cc_window.set(qp.cc_.window());
}

void progress(Engine& e, Qp& qp) {
  qp.retire_rd_reqs();  // answered requests give their credits back
  cc_progress(e, qp);
  e.rtt_progress(qp);
  qp.comp_.retries_left = qp.retry_cnt_;
  qp.comp_.rnr_left = qp.rnr_retry_;
  qp.comp_.went_back = false;
  // Restart the timer for what is still outstanding, unless the requester
  // is behind an ACK for packets it sent before a go-back-N: then it moves
  // forward, and the timer is armed again when the resend leaves.
  e.cancel_retrans(qp);
  if (psn_before(qp.req_.psn, qp.comp_.psn))
    Requester::go_to_st(e, qp, qp.comp_.psn);
  else if (qp.comp_.psn != qp.req_.max_psn) {
    e.arm_retrans(qp);
    // Packets sent after the newest AckReq are answered with the next one.
    if (!psn_after(qp.comp_.psn, qp.ackreq_psn_)) e.arm_probe(qp);
  }
  if (qp.sq_next_ != qp.sq_tail_) e.make_ready(qp);
}

// Go-back-N from the oldest unacknowledged PSN, counting a retry (retry_cnt
// covers timeouts and sequence NAKs alike; 7 is not infinite, C9-140). The
// congestion window is cut first, so the resend is one window, not all of
// max_unacked.
void cut_windows(Engine& e, Qp& qp, bool timeout) {
  if (e.config().cc.window) {
    bool cut = true;
    if (timeout)
      qp.cc_.on_timeout(e.config().cc, qp.req_.max_psn);
    else
      cut = qp.cc_.on_loss(e.config().cc, qp.comp_.psn, qp.req_.max_psn);
    if (cut) {
      e.ctr_.inc(ECtr::cc_window_cuts);
      ++qp.ctr_.cc_window_cuts;
    }
    if (e.cc_shared_.on_loss(e.config().cc)) e.ctr_.inc(ECtr::cc_shared_cuts);
    qp.ctr_.cc_window.set(qp.cc_.window());
  }
}

void retry(Engine& e, Qp& qp, bool timeout) {
  if (qp.comp_.retries_left == 0) {
    e.fail_head(qp, IBV_WC_RETRY_EXC_ERR);
    return;
  }
  cut_windows(e, qp, timeout);
  --qp.comp_.retries_left;
  qp.comp_.went_back = true;
  qp.comp_.went_back_psn = qp.comp_.psn;
  e.cancel_retrans(qp);  // the timer runs again from the resend
  Requester::go_to_st(e, qp, qp.comp_.psn, Requester::Queue::kFirst);
}

// Go-back-N for a loss an arriving packet revealed (a sequence NAK, a gap
// in responses, an ACK past an unanswered READ). Packets sent before the
// go-back reveal the same loss again: act once per PSN until progress.
void go_back_once(Engine& e, Qp& qp) {
  if (qp.comp_.went_back && qp.comp_.went_back_psn == qp.comp_.psn) return;
  retry(e, qp, false);
}

// Is `psn` one we sent and have not yet seen acknowledged?
bool in_window(const Qp& qp, uint32_t psn, Engine& e) {
  if (psn_before(psn, qp.comp_.psn)) {
    e.ctr_.inc(ECtr::rx_dup);
    ++const_cast<Qp&>(qp).ctr_.dup_packets;
    return false;
  }
  if (!psn_before(psn, qp.req_.max_psn)) {
    e.ctr_.inc(ECtr::rx_ghost_ack);
    return false;
  }
  return true;
}

void on_ack(Engine& e, Qp& qp, uint32_t psn) {
  e.ctr_.inc(ECtr::acks_rx);
  ++qp.ctr_.acks_rx;
  if (!in_window(qp, psn, e)) return;
  const uint32_t end = psn_add(psn, 1);
  if (ack_through(e, qp, end)) {
    sync_comp_psn(qp);
    go_back_once(e, qp);
    return;
  }
  if (qp.state_ == IBV_QPS_ERR) return;
  qp.comp_.psn = end;
  sync_comp_psn(qp);
  progress(e, qp);
  Completer::check_head_st(e, qp);
}

void on_nak(Engine& e, Qp& qp, uint32_t psn, uint8_t syndrome) {
  const uint8_t kind = aeth::kind(syndrome);
  const uint8_t code = aeth::value(syndrome);
  if (!in_window(qp, psn, e)) return;
  // A NAK acknowledges every PSN before its own (9.7.5.2.2).
  const bool advanced = psn_after(psn, qp.comp_.psn);
  if (ack_through(e, qp, psn)) {
    sync_comp_psn(qp);
    go_back_once(e, qp);
    return;
  }
  if (qp.state_ == IBV_QPS_ERR) return;
  qp.comp_.psn = psn;
  if (advanced) {
    qp.retire_rd_reqs();
    cc_progress(e, qp);
    qp.comp_.retries_left = qp.retry_cnt_;
    qp.comp_.rnr_left = qp.rnr_retry_;
    qp.comp_.went_back = false;
  }
  if (kind == aeth::kRnrNak) {
    e.ctr_.inc(ECtr::naks_rnr_rx);
    ++qp.ctr_.naks_rnr_rx;
    // rnr_retry 7 means "retry forever" (9.7.5.2.8); others count down.
    if (qp.rnr_retry_ != 7) {
      if (qp.comp_.rnr_left == 0) {
        e.fail_head(qp, IBV_WC_RNR_RETRY_EXC_ERR);
        return;
      }
      --qp.comp_.rnr_left;
    }
    e.ctr_.inc(ECtr::rnr_waits);
    ++qp.ctr_.rnr_waits;
    qp.comp_.rnr_wait = true;
    qp.comp_.rnr_psn = psn;
    e.cancel_retrans(qp);
    e.timers_.arm(qp.rnr_timer_, e.now_ + rnr_timer_ns(code));
    return;
  }
  switch (code) {
    case aeth::kNakPsnSeq:
      e.ctr_.inc(ECtr::naks_seq_rx);
      ++qp.ctr_.naks_seq_rx;
      // Packets sent before we went back to this PSN raise NAKs for the
      // same gap: the resend is already under way (one retry per gap).
      if (advanced) qp.comp_.went_back = false;
      go_back_once(e, qp);
      return;
    case aeth::kNakInvalidRequest:
      e.ctr_.inc(ECtr::naks_inv_req_rx);
      ++qp.ctr_.naks_inv_req_rx;
      e.fail_head(qp, IBV_WC_REM_INV_REQ_ERR);
      return;
    case aeth::kNakRemoteAccess:
      e.ctr_.inc(ECtr::naks_access_rx);
      ++qp.ctr_.naks_access_rx;
      e.fail_head(qp, IBV_WC_REM_ACCESS_ERR);
      return;
    case aeth::kNakRemoteOp:
      e.ctr_.inc(ECtr::naks_op_rx);
      ++qp.ctr_.naks_op_rx;
      e.fail_head(qp, IBV_WC_REM_OP_ERR);
      return;
    default:
      // Reserved NAK codes: treat as an invalid request (C9-134).
      e.ctr_.inc(ECtr::naks_inv_req_rx);
      ++qp.ctr_.naks_inv_req_rx;
      e.fail_head(qp, IBV_WC_REM_INV_REQ_ERR);
      return;
  }
}

// A response that must come next: the head WR (after implied ACKs) must
// be the one it answers, at the oldest unacknowledged PSN. An atomic ACK
// answers an atomic; a READ response a READ, or an ATOMIC WRITE (without
// data: IBTA 1.5 A19.4, rxe's responder).
SendWqe* expect_response(Engine& e, Qp& qp, uint32_t psn, bool atomic) {
  if (!in_window(qp, psn, e)) return nullptr;
  const bool lost = ack_through(e, qp, psn);
  if (qp.state_ == IBV_QPS_ERR) return nullptr;
  sync_comp_psn(qp);
  SendWqe* w = qp.sq_head_ != qp.sq_tail_ ? &qp.sqe(qp.sq_head_) : nullptr;
  const bool match = !lost && w && w->started &&
                     (atomic ? is_atomic(w->wr.opcode)
                             : w->wr.opcode == IBV_WR_RDMA_READ ||
                                   w->wr.opcode == IBV_WR_ATOMIC_WRITE) &&
                     psn_diff(psn, w->first_psn) >= 0 &&
                     psn_diff(psn, w->last_psn) <= 0;
  if (match && psn == qp.comp_.psn) return w;
  // A gap in the responses (an earlier one was lost): go back once per gap.
  e.ctr_.inc(ECtr::rx_out_of_seq);
  ++qp.ctr_.out_of_seq;
  go_back_once(e, qp);
  return nullptr;
}

// A response at `psn` was taken; the head WR `done` (if not null) is
// complete with it.
void took_response(Engine& e, Qp& qp, uint32_t psn, SendWqe* done) {
  qp.comp_.psn = psn_add(psn, 1);
  if (done) {
    done->done = true;
    e.complete_head(qp, IBV_WC_SUCCESS);
  }
  if (qp.state_ == IBV_QPS_ERR) return;
  progress(e, qp);
  Completer::check_head_st(e, qp);
}

void on_read_response(Engine& e, Qp& qp, const RxPkt& p) {
  const uint32_t psn = p.f.psn;
  SendWqe* w = expect_response(e, qp, psn, false);
  if (!w) return;
  if (w->wr.opcode == IBV_WR_ATOMIC_WRITE) {
    // One response, without data. (A plain ACK completes it too: on_ack,
    // as needs_response() says; rxe's completer takes either.)
    if (p.f.payload_len != 0 || p.f.opcode != wire::opcode::kRcReadRespOnly) {
      e.ctr_.inc(ECtr::rx_bad_length);
      return;
    }
    took_response(e, qp, psn, w);
    return;
  }
  const uint32_t off =
      static_cast<uint32_t>(psn_diff(psn, w->first_psn)) * qp.mtu_;
  const uint32_t want = std::min(qp.mtu_, w->length - off);
  const bool last = psn == w->last_psn;
  // The last response of its request (a READ may be asked for in several,
  // Qp::rd_reqs_) is a Last or Only one, and no other is (9.7.5.2.x).
  const Qp::RdReq* r = qp.rd_req_at(psn);
  const bool op_last = p.op.mask & wire::kLast;
  if (p.f.payload_len != want || !r || (psn == r->last_psn) != op_last) {
    e.ctr_.inc(ECtr::rx_bad_length);
    return;
  }
  scatter(w->host_sg, w->wr.num_sge, off, p.segs, p.fi.payload_off, want);
  if (!last)  // the next response's bytes
    prefetch(w->host_sg, w->wr.num_sge, off + want,
             std::min(qp.mtu_, w->length - off - want), true);
  took_response(e, qp, psn, last ? w : nullptr);
}

void on_atomic_ack(Engine& e, Qp& qp, const RxPkt& p) {
  const uint32_t psn = p.f.psn;
  SendWqe* w = expect_response(e, qp, psn, true);
  if (!w) return;
  // The original value lands in the local buffer in host order (verbs).
  const uint64_t orig = p.f.atomic_orig;
  const wire::ConstBuf src{reinterpret_cast<const uint8_t*>(&orig), 8};
  scatter(w->host_sg, w->wr.num_sge, 0, {&src, 1}, 0, 8);
  took_response(e, qp, psn, w);
}

}  // namespace

void Completer::rx_st(Engine& e, Qp& qp, const RxPkt& p) {
  if (qp.type_ != IBV_QPT_RC) return;
  const uint8_t op = p.f.opcode;
  if (op == wire::opcode::kRcAck) {
    const uint8_t syn = p.f.aeth_syndrome;
    if (aeth::kind(syn) == aeth::kAck)
      on_ack(e, qp, p.f.psn);
    else if (aeth::kind(syn) == aeth::kRnrNak || aeth::kind(syn) == aeth::kNak)
      on_nak(e, qp, p.f.psn, syn);
    else
      e.ctr_.inc(ECtr::rx_bad_opcode_seq);  // reserved syndrome class
  } else if (op == wire::opcode::kRcAtomicAck) {
    on_atomic_ack(e, qp, p);
  } else if (p.op.mask & wire::kRead) {
    // READ data flows responder -> requester: here is its notification
    // point (Annex A17.9), the responder's QP its reaction point.
    e.on_ce_st(qp, p.f.tclass);
    on_read_response(e, qp, p);
  }
}

void Completer::cnp_st(Engine& e, Qp& qp) {
  e.ctr_.inc(ECtr::cnps_rx);
  ++qp.ctr_.cnps_rx;
  const CcParams& p = e.config().cc;
  if (!p.window || !p.ecn) return;
  if (p.dcqcn) {
    // DCQCN reaction point: the rate, not the windows.
    if (qp.rate_.on_cnp(p, e.now_, e.dcqcn_share_)) {
      e.ctr_.inc(ECtr::cc_rate_cuts);
      ++qp.ctr_.cc_rate_cuts;
    }
    qp.ctr_.cc_rate_mbps.set(qp.rate_.gauge_mbps());
    return;
  }
  // As a loss (RFC 3168 6.1.2: once per window of data), minus the resend.
  // UC has no window: with algorithm window a CNP is only counted.
  if (qp.type_ == IBV_QPT_RC) cut_windows(e, qp, false);
}

void Completer::timer_st(Engine& e, Qp& qp, TimerKind kind) {
  if (qp.state_ != IBV_QPS_RTS && qp.state_ != IBV_QPS_SQD) return;
  if (kind == kRnrTimer) {
    qp.comp_.rnr_wait = false;
    e.cancel_retrans(qp);
    Requester::go_to_st(e, qp, qp.comp_.rnr_psn, Requester::Queue::kFirst);
    return;
  }
  if (qp.comp_.psn == qp.req_.max_psn || qp.comp_.rnr_wait) return;
  e.ctr_.inc(ECtr::timeouts);
  ++qp.ctr_.timeouts;
  retry(e, qp, true);
}

// The PSN a probe of `last` (the last packet sent) resends from, and in
// *read whether that is a READ asked again. A READ is one request for all
// its response PSNs, so probing its last PSN would re-request its last
// response alone, and rxe takes every repeated READ as the new extent of
// its responder resource and drops a later one that is not inside it
// (rxe_resp.c, duplicate_request): the re-request for the gap before that
// last response then went unanswered until retry exceeded
// (tools/vm-rxe-interop, igb, ib_read_bw -q 8). Such a READ is asked again
// from its first response not yet received, which every later re-request
// (the completer only moves forward) stays inside. A READ asked for in
// several requests is asked again within the request of `last`.
static uint32_t read_probe_psn(Qp& qp, uint32_t last, bool* read) {
  *read = false;
  for (uint32_t i = qp.sq_head_; i != qp.sq_tail_; ++i) {
    const SendWqe& w = qp.sqe(i);
    if (!w.started) break;
    if (psn_diff(last, w.last_psn) > 0) continue;
    if (w.wr.opcode != IBV_WR_RDMA_READ) return last;
    const Qp::RdReq* r = qp.rd_req_at(last);
    if (!r) return last;
    *read = true;
    return psn_after(qp.comp_.psn, r->first_psn) ? qp.comp_.psn : r->first_psn;
  }
  return last;
}

void Completer::probe_st(Engine& e, Qp& qp) {
  if (qp.state_ != IBV_QPS_RTS && qp.state_ != IBV_QPS_SQD) return;
  if (qp.comp_.psn == qp.req_.max_psn || qp.comp_.rnr_wait) return;
  // Nothing of the current pass (a go-back may have started one) is out:
  // the requester sends next, and that arms the probe again.
  if (!psn_after(qp.req_.psn, qp.comp_.psn)) return;
  e.ctr_.inc(ECtr::tail_probes);
  ++qp.ctr_.tail_probes;
  if (qp.probes_ == 0) qp.probe_t0_ns_ = qp.probe_from_ns_;
  qp.probe_sent_ns_ = e.now_;
  // Neither probe spends a retry, and the Local ACK Timeout keeps running
  // from the last progress (go_to_st leaves the timers alone); the probe
  // timer fired, and the resend arms it again, backed off.
  // The first two probes are one packet each: cheap when the peer is only
  // slow (its lcore off the CPU), which on shared cores is the usual case.
  if (qp.probes_++ < 2) {
    // The last packet sent (of a go-back's resend, if one is under way:
    // it may be window-bound and its ACKs lost), again, with AckReq
    // (go_to_st sets it): a responder that has it answers with an ACK (a
    // duplicate, 9.7.5.1.1), one that misses an earlier packet and whose
    // NAK is still to come with a sequence NAK. A NAK for the PSN of an earlier
    // go-back is news now: that resend was lost too. A READ goes again from
    // its first missing response (read_probe_psn): more duplicate data on a
    // slow link than one response, but the smallest start rxe still serves.
    bool read = false;
    const uint32_t from =
        read_probe_psn(qp, psn_add(qp.req_.psn, kPsnMask), &read);
    // A READ's probe is its loss signal. A WRITE's probe is answered by an
    // ACK (only slow) or a sequence NAK, which cuts the windows (on_nak); a
    // READ's only by the missing responses, the same whether they were lost
    // or late. With one READ per QP in flight (a window under two READs)
    // only a probe finds a loss, so without a cut here the windows never
    // shrank: 16 QPs READing 64 KiB on a 512-frame af_packet ring re-asked
    // a fifth of their READs (perf/README.md, "READ under load"). Cut
    // as for a loss: once per window of data (on_loss), nothing resent by it.
    if (read) cut_windows(e, qp, false);
    qp.comp_.went_back = false;
    qp.probe_due_ = true;
    Requester::go_to_st(e, qp, from, Requester::Queue::kFirst);
  } else if (qp.req_.rd_atomic) {
    // READ/atomic requests outstanding: go back N from the oldest
    // unanswered one; each is asked again within its own extent.
    cut_windows(e, qp, false);
    qp.comp_.went_back = true;
    qp.comp_.went_back_psn = qp.comp_.psn;
    Requester::go_to_st(e, qp, qp.comp_.psn, Requester::Queue::kFirst);
  } else {
    // Still nothing after two probes: either the peer is still off the CPU
    // or it misses an earlier packet and its NAK was lost (a responder NAKs
    // a gap once, 9.7.5.2.2, and drops what follows). The oldest
    // unacknowledged packet alone answers both: a duplicate draws an ACK of
    // everything the responder has (9.7.5.1.1), the missing packet is taken,
    // ACKed, and the next probe of the last packet draws the NAK for what
    // follows. Going back N here resent whole windows to peers that were
    // only slow (memif with lcores sharing CPUs: 10 k packets in 2 s).
    qp.comp_.went_back = false;
    qp.probe_due_ = true;
    const uint32_t resume = qp.req_.psn;
    Requester::go_to_st(e, qp, qp.comp_.psn, Requester::Queue::kFirst);
    qp.probe_one_ = true;
    qp.probe_resume_ = resume;
  }
}

void Completer::check_head_st(Engine& e, Qp& qp) {
  if (qp.state_ == IBV_QPS_ERR) return;
  // A WR that failed locally completes once everything before it has.
  if (qp.sq_head_ != qp.sq_tail_ && qp.sq_head_ == qp.sq_next_ &&
      qp.req_.offset == 0) {
    const SendWqe& w = qp.sqe(qp.sq_head_);
    if (!w.started && w.local_err != IBV_WC_SUCCESS) {
      e.fail_head(qp, w.local_err);
      return;
    }
  }
  // SQD: drained once nothing is outstanding (IBTA 10.3.1, 11.6.3).
  if (qp.state_ == IBV_QPS_SQD && !qp.sq_draining() && qp.sqd_notify_ &&
      !qp.comp_.drained_sent) {
    qp.comp_.drained_sent = true;
    e.dev_.raise({IBV_EVENT_SQ_DRAINED, qp.qpn_, nullptr, nullptr, qp.owner_});
  }
}

}  // namespace urnic::transport
