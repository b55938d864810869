// Requester: turns send WRs into packets (IBTA 9.5 segmentation, 9.7.1 PSN
// assignment), within the PSN window and the READ/ATOMIC credit limit, and
// repositions itself for go-back-N.
#include <arpa/inet.h>

#include <algorithm>

#include "dataplane/transport/psn.h"
#include "dataplane/transport/roles.h"

namespace urnic::transport {
namespace {

using namespace wire::opcode;

// The smallest READ request (unless less is left): 64 KiB at a 1 KiB MTU
// (read_request_pkts).
constexpr uint32_t kMinReadPkts = 64;

// Packets (PSNs) the QP may have unacknowledged.
uint32_t window(const Engine& e, const Qp& qp) {
  return e.cc_window(qp);
}

// Resolves the WR's local SGEs to host memory once (lkey, PD, bounds and,
// for READ/ATOMIC results, local write access).
bool resolve(Qp& qp, SendWqe& w, const Device& dev) {
  const uint32_t rights =
      is_rd_atomic(w.wr.opcode) ? uint32_t{IBV_ACCESS_LOCAL_WRITE} : 0u;
  for (uint32_t i = 0; i < w.wr.num_sge; ++i) {
    const Sge& s = w.sge[i];
    w.host_sg[i] = {};
    if (s.length == 0) continue;
    Mr* mr;
    if (dev.check_local(qp.pd_, s.lkey, s.addr, s.length, rights, &mr) !=
        AccessError::kOk)
      return false;
    w.host_sg[i] = {mr->host(s.addr), s.length};
  }
  w.resolved = true;
  return true;
}

// Opcode of one SEND/WRITE packet (IBTA table 38); UC opcodes are the RC
// ones plus 0x20.
uint8_t data_opcode(ibv_qp_type t, ibv_wr_opcode op, bool first, bool last) {
  const bool imm =
      op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_RDMA_WRITE_WITH_IMM;
  if (t == IBV_QPT_UD) return imm ? kUdSendOnlyImm : kUdSendOnly;
  uint8_t c;
  if (op == IBV_WR_SEND_WITH_INV) {  // RC only (valid_opcode)
    return first && last ? kRcSendOnlyInv
           : first       ? kRcSendFirst
           : last        ? kRcSendLastInv
                         : kRcSendMiddle;
  }
  if (op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM) {
    c = first && last ? (imm ? kRcSendOnlyImm : kRcSendOnly)
        : first       ? kRcSendFirst
        : last        ? (imm ? kRcSendLastImm : kRcSendLast)
                      : kRcSendMiddle;
  } else {
    c = first && last ? (imm ? kRcWriteOnlyImm : kRcWriteOnly)
        : first       ? kRcWriteFirst
        : last        ? (imm ? kRcWriteLastImm : kRcWriteLast)
                      : kRcWriteMiddle;
  }
  return t == IBV_QPT_UC ? static_cast<uint8_t>(c + kUcBase) : c;
}

// Responses a new READ request asks for, `out` packets in flight before it.
// A READ larger than the window is asked for in several requests (each
// with its own credit), so that what a lost response costs is bounded:
// go-back-N has the responder send again from the first missing response
// to the end of its request, and what it sent behind the loss arrives out
// of sequence and is dropped. One 4 MiB READ at 1 % loss had 92 % of its
// responses sent again and got 0.23 Gb/s (perf/README.md, "Large READs on
// a lossy port"). A request is at least kMinReadPkts (and the window's
// share of one credit, so that max_rd_atomic requests fill the window): at
// 1 % random loss the window holds ~8 packets, and READs held to it lost a
// quarter of their goodput, and 33-64 packet READs took a round trip more
// (two requests, the second waiting for room); with 64, a READ of up to 64
// packets is one request, as before.
uint32_t read_request_pkts(const Engine& e, const Qp& qp, const SendWqe& w,
                           int32_t out) {
  const uint32_t left = w.npkts - qp.req_.offset / qp.mtu_;
  const uint32_t win = std::max(window(e, qp), 1u);
  if (out <= 0) return std::min(left, std::max(win, kMinReadPkts));
  const uint32_t room =
      win > static_cast<uint32_t>(out) ? win - static_cast<uint32_t>(out) : 0;
  const uint32_t least =
      std::max(kMinReadPkts, (win + qp.max_rd_atomic_ - 1) / qp.max_rd_atomic_);
  return std::min(left, std::max(room, least));
}

// Sends the next packet of `w`; false if TX is full (nothing changed). A
// READ request asks for `rd_pkts` responses; a READ/ATOMIC request that is
// `rd_new` (not sent before) takes a credit (send_st checked one is free).
bool send_one(Engine& e, Qp& qp, SendWqe& w, uint32_t rd_pkts, bool rd_new) {
  const bool ud = qp.type_ == IBV_QPT_UD;
  const bool rc = qp.type_ == IBV_QPT_RC;
  // RC/UC: the per-QP template (copied, not zeroed first: this runs for
  // every packet); UD: the addresses of this WR's AH.
  wire::RoceFields f = qp.tmpl_;
  if (ud) {
    f = wire::RoceFields{};
    e.fill_addr(qp, qp.sq_av(w), f);
    f.dqpn = w.wr.remote_qpn;
  }
  if (!ud) e.set_ect(f, !rc);
  f.psn = qp.req_.psn;
  const uint32_t mtu = qp.mtu_;
  const uint32_t off = qp.req_.offset;
  wire::ConstBuf pieces[kMaxSge];
  uint32_t npieces = 0;
  uint32_t psn_used = 1;
  uint32_t len = 0;
  bool last = true;
  const ibv_wr_opcode op = w.wr.opcode;
  uint32_t next_off = off;  // bytes of the WR asked for or sent after this
  if (op == IBV_WR_RDMA_READ) {
    // One request for rd_pkts responses from `off` (read_request_pkts); a
    // re-issued READ asks only for what is still missing (9.7.4.1.4).
    f.opcode = kRcReadRequest;
    f.reth_va = w.wr.remote_addr + off;
    f.reth_rkey = w.wr.rkey;
    next_off = std::min(w.length, off + rd_pkts * mtu);
    f.reth_len = next_off - off;
    f.ack_req = true;
    psn_used = rd_pkts;
    last = off / mtu + rd_pkts >= w.npkts;
  } else if (op == IBV_WR_ATOMIC_WRITE) {
    // One packet: RETH for 8 bytes, the 8 bytes as its payload (A19.4).
    f.opcode = kRcAtomicWrite;
    f.reth_va = w.wr.remote_addr;
    f.reth_rkey = w.wr.rkey;
    f.reth_len = 8;
    pieces[0] = {reinterpret_cast<const uint8_t*>(&w.wr.compare_add), 8};
    npieces = 1;
    f.payload_len = 8;
    f.ack_req = true;
  } else if (is_atomic(op)) {
    const bool cs = op == IBV_WR_ATOMIC_CMP_AND_SWP;
    f.opcode = cs ? kRcCmpSwap : kRcFetchAdd;
    f.atomic_va = w.wr.remote_addr;
    f.atomic_rkey = w.wr.rkey;
    f.atomic_swap_add = cs ? w.wr.swap : w.wr.compare_add;
    f.atomic_compare = cs ? w.wr.compare_add : 0;
    f.ack_req = true;
  } else {
    len = std::min(ud ? w.length : mtu, w.length - off);
    const bool first = off == 0;
    last = off + len == w.length;
    f.opcode = data_opcode(qp.type_, op, first, last);
    const bool write =
        op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM;
    if (write && first) {
      f.reth_va = w.wr.remote_addr;
      f.reth_rkey = w.wr.rkey;
      f.reth_len = w.length;
    }
    if (last && op == IBV_WR_SEND_WITH_INV)
      f.ieth_rkey = w.wr.imm_data;  // invalidate_rkey, host order
    else if (last)
      f.imm = ntohl(w.wr.imm_data);
    f.se = last && (w.wr.send_flags & IBV_SEND_SOLICITED) &&
           op != IBV_WR_RDMA_WRITE;
    npieces = gather(w.host_sg, w.wr.num_sge, off, len, pieces);
    f.payload_len = len;
    next_off = off + len;
    if (!last)  // the QP's next packet: its bytes on their way in
      prefetch(w.host_sg, w.wr.num_sge, off + len,
               std::min(mtu, w.length - off - len), false);
    // AckReq on the last packet, on the first packet resent after a
    // go-back (quick news of recovery), on the packet that fills the window
    // (the requester waits for that ACK, and a responder coalescing ACKs
    // would otherwise send none), and at least every ack_req_every packets
    // or twice per window, whichever is more often: in a small window the
    // loss of its one ACK-soliciting packet would otherwise cost a timeout
    // (and a retry) although the packets before it arrived. That window is
    // the QP's own, not its share of the lcore's shared one: while many QPs
    // divide that, the others fill the pipe as this one waits, and asking
    // twice per share made a 16-QP receiver send an ACK per 12 packets
    // (perf/README.md, "One ACK per QP's run").
    const uint32_t win = window(e, qp);
    const uint32_t own = e.config().cc.window ? qp.cc_.window() : win;
    const uint32_t every =
        std::max(std::min(e.config().ack_req_every, own / 2), 1u);
    f.ack_req =
        rc && (last || qp.req_.ackreq_next ||
               qp.req_.pkts_since_ackreq + 1 >= every || e.cc_turn_ends(qp) ||
               static_cast<uint32_t>(psn_diff(psn_add(qp.req_.psn, psn_used),
                                              qp.comp_.psn)) >= win);
  }
  if (ud) {
    // C10-15: a Q_Key with the high bit set means "use the QP's Q_Key".
    f.deth_qkey =
        (w.wr.remote_qkey & 0x80000000u) ? qp.qkey_ : w.wr.remote_qkey;
    f.deth_src_qp = qp.qpn_;
  }
  // An RC request's data stays put until its ACK completes the WR; a UD
  // or UC send completes before the frame has left (TxFrame::stable).
  if (!e.send_packet(qp, f, {pieces, npieces}, rc)) return false;
  if (f.ack_req && !qp.rtt_timing_ && qp.req_.psn == qp.req_.max_psn) {
    qp.rtt_timing_ = true;  // a first transmission: time its ACK
    qp.rtt_psn_ = qp.req_.psn;
    qp.rtt_sent_ns_ = e.now_;
    qp.rtt_delivered_ = qp.cc_.delivered();
    qp.rtt_shared_delivered_ = e.cc_shared_.delivered();
  }

  qp.req_.pkts_since_ackreq = f.ack_req ? 0 : qp.req_.pkts_since_ackreq + 1;
  qp.req_.ackreq_next = false;
  if (!w.started) {
    w.started = true;
    w.first_psn = qp.req_.psn;
    w.last_psn = psn_add(w.first_psn, w.npkts - 1);
  }
  if (rd_new) qp.push_rd_req(f.psn, psn_add(f.psn, psn_used - 1));
  const bool resent = psn_before(qp.req_.psn, qp.req_.max_psn);
  if (resent) {
    ++qp.ctr_.retransmits;
    e.ctr_.inc(ECtr::retransmits);
  }
  if (rc) e.cc_floor_count(resent);
  qp.req_.psn = psn_add(qp.req_.psn, psn_used);
  if (psn_after(qp.req_.psn, qp.req_.max_psn)) qp.req_.max_psn = qp.req_.psn;
  e.cc_sync(qp);
  if (last) {
    ++qp.sq_next_;
    qp.req_.offset = 0;
  } else {
    qp.req_.offset = next_off;
  }
  if (rc) {
    e.arm_retrans(qp);
    if (f.ack_req) {
      // The newest; a probe of an older packet leaves it where it was.
      const uint32_t end = psn_add(f.psn, psn_used - 1);
      if (psn_after(end, qp.ackreq_psn_)) qp.ackreq_psn_ = end;
      e.arm_probe(qp);
    }
  } else if (last) {
    // UC/UD: nothing will acknowledge it; complete once sent (9.8.3).
    e.complete_head(qp, IBV_WC_SUCCESS);
  }
  return true;
}

}  // namespace

uint32_t Requester::send_st(Engine& e, Qp& qp, uint32_t budget, bool* more) {
  *more = false;
  if (qp.state_ != IBV_QPS_RTS && qp.state_ != IBV_QPS_SQD) return 0;
  if (qp.comp_.rnr_wait) return 0;
  const bool rc = qp.type_ == IBV_QPT_RC;
  // RC and UC data are paced by the QP's DCQCN rate (UC has no window and
  // no ACKs: the rate is all it has to back off with).
  const bool paced = qp.type_ != IBV_QPT_UD;
  // A rate-limited QP shares the DCQCN increase timer only while it has
  // something to send (DcqcnShare): requests, or READ responses (paced by
  // the same rate).
  if (paced) qp.rate_.set_idle(e.dcqcn_share_, nothing_to_send(qp));
  uint32_t sent = 0;
  while (qp.sq_next_ != qp.sq_tail_) {
    if (sent >= budget || e.turn_left_ <= 0) {
      *more = true;
      break;
    }
    SendWqe& w = qp.sqe(qp.sq_next_);
    if (is_local_op(w.wr.opcode)) {
      if (qp.state_ == IBV_QPS_SQD) break;
      // Runs once everything posted before it has completed, so a bind or
      // an invalidation never overtakes an earlier operation; the
      // completer makes the QP ready again when the head gets here.
      if (qp.sq_head_ != qp.sq_next_) break;
      const ibv_wc_status st =
          w.wr.opcode == IBV_WR_BIND_MW
              ? e.dev_.bind_mw(qp.pd_, qp.qpn_, w.wr.bind)
              : e.dev_.local_invalidate(qp.pd_, w.wr.imm_data);
      ++qp.sq_next_;
      if (st != IBV_WC_SUCCESS) {
        e.ctr_.inc(ECtr::local_errors);
        e.fail_head(qp, st);  // a local error: the QP goes to error
        break;
      }
      e.complete_head(qp, st);
      continue;
    }
    const bool rd = is_rd_atomic(w.wr.opcode);
    if (!w.started && qp.req_.offset == 0) {
      if (qp.state_ == IBV_QPS_SQD) break;       // draining: no new WRs
      if (w.local_err != IBV_WC_SUCCESS) break;  // completer reports it
      // Fence (IBTA 10.8.3.3): wait for earlier READ/ATOMIC to complete.
      if ((w.wr.send_flags & IBV_SEND_FENCE) && qp.req_.rd_atomic) break;
      if (qp.type_ == IBV_QPT_UD) {
        // C10-93.1.1: a message longer than the port MTU emits no packet
        // and no error (as rxe fakes its send); counted.
        if (w.length > mtu_bytes(e.dev_.config().active_mtu)) {
          e.ctr_.inc(ECtr::ud_too_long);
          ++qp.sq_next_;
          e.complete_head(qp, IBV_WC_SUCCESS);
          continue;
        }
      }
      if (!w.resolved && !resolve(qp, w, e.device())) {
        w.local_err = IBV_WC_LOC_PROT_ERR;
        e.ctr_.inc(ECtr::local_errors);
        Completer::check_head_st(e, qp);
        break;
      }
      w.npkts = qp.type_ == IBV_QPT_UD || is_atomic(w.wr.opcode) ||
                        w.wr.opcode == IBV_WR_ATOMIC_WRITE
                    ? 1
                    : pkts_for(w.length, qp.mtu_);
    }
    // Packets in flight before this one, and whether it is new data (not
    // sent before a go-back).
    const int32_t out = psn_diff(qp.req_.psn, qp.comp_.psn);
    const bool fresh = !psn_before(qp.req_.psn, qp.req_.max_psn);
    // PSNs this packet uses: a READ request's responses. A request sent
    // before asks again for (the rest of) its own extent; a new one takes
    // a credit.
    uint32_t need = 1;
    bool rd_new = false;
    if (rd) {
      const Qp::RdReq* r = qp.rd_req_at(qp.req_.psn);
      rd_new = !r;
      if (rd_new && qp.req_.rd_atomic >= qp.max_rd_atomic_) break;
      if (w.wr.opcode == IBV_WR_RDMA_READ)
        need = r ? static_cast<uint32_t>(psn_diff(r->last_psn, qp.req_.psn)) + 1
                 : read_request_pkts(e, qp, w, out);
    }
    if (rc) {
      // A tail-loss probe goes even when the window is full (a window cut
      // after a loss can leave more in flight than it allows): waiting for
      // ACKs that were lost would leave only the timeout. So does one more
      // packet when the last one did not ask for an ACK: the window shrank
      // under packets sent within it (its share of the shared window falls
      // as more QPs send), and nothing would answer them but the timeout
      // (64 QPs through 2 Gb/s: ~740 timeouts in 3 s with nothing lost).
      // That packet fills the window, so it asks.
      if (out > 0 && static_cast<uint32_t>(out) + need > window(e, qp) &&
          !qp.probe_due_ && qp.req_.pkts_since_ackreq == 0)
        break;
      if (!e.pace_ok(qp)) break;  // the pace timer makes it ready again
      // New data waits for its turn in the shared window; a probe or a
      // packet sent again after a go-back does not (it is in flight
      // already as far as the window is concerned).
      if (!qp.probe_due_ && fresh && !e.cc_may_send(qp, out))
        break;  // a grant or its own ACKs make it ready again
    } else if (paced && !e.pace_ok(qp)) {
      break;  // UC: the pace timer makes it ready again
    }
    if (!send_one(e, qp, w, need, rd_new)) {
      *more = true;
      break;
    }
    qp.probe_due_ = false;
    if (paced) e.paced_sent(qp);
    if (rc) {
      if (out <= 0 && qp.cc_admitted_) e.cc_release(qp);  // used it
      // A turn starts with new data from nothing in flight; a resend after
      // a go-back does not start one (it would skip the queue).
      if (out <= 0 && fresh) qp.cc_burst_ = 0;
      ++qp.cc_burst_;
    }
    ++sent;
    // A probe of the oldest packet alone: back to where the pass was.
    if (qp.probe_one_) go_to_st(e, qp, qp.probe_resume_);
    if (qp.state_ == IBV_QPS_ERR) break;  // a completion overflowed its CQ
  }
  if (paced && nothing_to_send(qp)) qp.rate_.set_idle(e.dcqcn_share_, true);
  // A grant this QP cannot use goes to the next in line.
  if (qp.cc_admitted_ &&
      (qp.sq_next_ == qp.sq_tail_ || qp.state_ != IBV_QPS_RTS))
    e.cc_release(qp);
  return sent;
}

void Requester::go_to_st(Engine& e, Qp& qp, uint32_t psn, Queue q) {
  // Find the WR that holds `psn`: started WRs hold consecutive PSN ranges.
  uint32_t i = qp.sq_head_;
  for (; i != qp.sq_tail_; ++i) {
    const SendWqe& w = qp.sqe(i);
    if (!w.started || psn_diff(psn, w.last_psn) <= 0) break;
  }
  // READ/ATOMIC requests sent again keep their credits (Qp::rd_reqs_): the
  // responder holds their resources until they are answered.
  qp.sq_next_ = i;
  qp.req_.offset = 0;
  if (i != qp.sq_tail_) {
    const SendWqe& w = qp.sqe(i);
    const bool atomic = is_atomic(w.wr.opcode);
    if (w.started && !atomic && psn_diff(psn, w.first_psn) > 0)
      qp.req_.offset =
          static_cast<uint32_t>(psn_diff(psn, w.first_psn)) * qp.mtu_;
  }
  qp.req_.psn = psn;
  qp.probe_one_ = false;
  e.cc_sync(qp);
  qp.rtt_timing_ = false;  // Karn: an ACK now may answer either copy
  qp.req_.pkts_since_ackreq = 0;
  qp.req_.ackreq_next = true;
  if (qp.sq_next_ == qp.sq_tail_) return;
  if (q == Queue::kFirst)
    e.make_ready_first(qp);
  else
    e.make_ready(qp);
}

}  // namespace urnic::transport
