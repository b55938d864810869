// Responder: PSN and opcode-sequence checks, execution of SEND / WRITE /
// READ / ATOMIC with key validation, duplicate handling with read and
// atomic replay, RNR, coalesced ACKs and NAKs (IBTA 9.7.5.1); UC (9.8) and
// UD (9.8; the GRH of a UD receive buffer: 11.4.1.2) receive paths.
#include <arpa/inet.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>

#include "dataplane/transport/psn.h"
#include "dataplane/transport/roles.h"

namespace urnic::transport {
namespace {

using namespace wire::opcode;

namespace aeth = wire::aeth;
// wc.sl of a UD receive (complete_recv).
constexpr uint8_t kSlRoceV2Ipv6 = 0x9, kSlRoceV2Ipv4 = 0xa;

// Outcome of executing one in-sequence request packet (qp.h).
using Res = RespResult;

// What each refusal does: the NAK sent (RC), the engine counter, and the
// status of the receive WR it completes (IBV_WC_SUCCESS: none). IBTA
// 9.7.5.1: key, bounds, PD and rights violations are Remote Access errors;
// length and sequence violations and more READ/atomics than the responder
// resources are Invalid Requests; a receive WR this side cannot use is a
// Remote Operational error.
struct RespError {
  uint8_t nak_code;
  ECtr ctr;
  ibv_wc_status recv_status;
};
// A switch over every result, so a cause added to URNIC_RESP_RESULTS
// without its entry here does not build (-Wswitch).
RespError resp_error(Res r) {
  switch (r) {
    case Res::ok:
    case Res::rnr:
      break;  // not refusals
    case Res::rkey_invalid:
      return {aeth::kNakRemoteAccess, ECtr::rx_rkey_invalid, IBV_WC_SUCCESS};
    case Res::rkey_pd:
      return {aeth::kNakRemoteAccess, ECtr::rx_rkey_pd, IBV_WC_SUCCESS};
    case Res::rkey_bounds:
      return {aeth::kNakRemoteAccess, ECtr::rx_rkey_bounds, IBV_WC_SUCCESS};
    case Res::rkey_rights:
      return {aeth::kNakRemoteAccess, ECtr::rx_rkey_rights, IBV_WC_SUCCESS};
    case Res::qp_access:
      return {aeth::kNakRemoteAccess, ECtr::rx_qp_access, IBV_WC_SUCCESS};
    case Res::opcode_seq:
      return {aeth::kNakInvalidRequest, ECtr::rx_bad_opcode_seq,
              IBV_WC_SUCCESS};
    case Res::opcode_length:
      return {aeth::kNakInvalidRequest, ECtr::rx_bad_length, IBV_WC_SUCCESS};
    case Res::write_length:
      return {aeth::kNakInvalidRequest, ECtr::rx_write_length, IBV_WC_SUCCESS};
    case Res::rd_atomic_over:
      return {aeth::kNakInvalidRequest, ECtr::rx_rd_atomic_over,
              IBV_WC_SUCCESS};
    case Res::atomic_misaligned:
      return {aeth::kNakInvalidRequest, ECtr::rx_atomic_misaligned,
              IBV_WC_SUCCESS};
    case Res::recv_too_small:
      return {aeth::kNakInvalidRequest, ECtr::rx_recv_too_small,
              IBV_WC_LOC_LEN_ERR};
    case Res::recv_bad_lkey:
      return {aeth::kNakRemoteOp, ECtr::rx_recv_bad_lkey, IBV_WC_LOC_PROT_ERR};
    case Res::msg_too_long:
      return {aeth::kNakInvalidRequest, ECtr::rx_msg_too_long, IBV_WC_SUCCESS};
    case Res::invalidate_rkey:
      // SEND_WITH_INV naming no type 2 window bound through this QP: the
      // receive completes in error, as rxe does (its responder's
      // RESPST_ERR_INVALIDATE_RKEY).
      return {aeth::kNakInvalidRequest, ECtr::rx_invalidate_rkey,
              IBV_WC_REM_INV_REQ_ERR};
  }
  return {0, ECtr::rx_packets, IBV_WC_SUCCESS};  // ok/rnr: never asked
}

// Counts a refusal and remembers it as the QP's last (urnicctl qps).
void count_refusal(Engine& e, Qp& qp, Res r) {
  e.ctr_.inc(resp_error(r).ctr);
  qp.ctr_.nak_cause.set(static_cast<uint64_t>(r));
}

bool is_fatal_nak(uint8_t syn) {
  return syn == aeth::nak(aeth::kNakInvalidRequest) ||
         syn == aeth::nak(aeth::kNakRemoteAccess) ||
         syn == aeth::nak(aeth::kNakRemoteOp);
}

// Queues the one deferred ACK/NAK of the QP (sent by poll()). A later
// response supersedes an earlier one, except that a NAK is not replaced
// by an ACK for an earlier PSN and a fatal NAK is never replaced.
void queue_ack(Engine& e, Qp& qp, uint8_t syn, uint32_t psn) {
  Qp::Resp& r = qp.resp_;
  if (r.ack_pending) {
    if (is_fatal_nak(r.ack_syndrome)) return;
    if (r.ack_syndrome != aeth::kAckUnlimited && psn_before(psn, r.ack_psn))
      return;
  }
  r.ack_pending = true;
  r.ack_syndrome = syn;
  r.ack_psn = psn;
  e.make_ready(qp);
  e.make_ack_ready(qp);
}

// A request the responder refuses for good (IBTA 9.9.3.1.3): the NAK, then
// ERR. `in_recv_wc`: a receive WQE's completion carries the cause;
// otherwise (a WRITE, READ or ATOMIC, a broken opcode sequence) the
// responder's client learns it from an affiliated asynchronous error, as
// C9-222.1 requires (mlx5 and rxe raise the same events; fatal_event()).
void fatal(Engine& e, Qp& qp, uint8_t syn, uint32_t psn, bool in_recv_wc) {
  switch (syn) {
    case aeth::nak(aeth::kNakInvalidRequest):
      e.ctr_.inc(ECtr::naks_inv_req_tx);
      ++qp.ctr_.naks_inv_req_tx;
      break;
    case aeth::nak(aeth::kNakRemoteAccess):
      e.ctr_.inc(ECtr::naks_access_tx);
      ++qp.ctr_.naks_access_tx;
      break;
    default:
      e.ctr_.inc(ECtr::naks_op_tx);
      ++qp.ctr_.naks_op_tx;
      break;
  }
  queue_ack(e, qp, syn, psn);
  qp.resp_.fatal = true;
  qp.resp_.fatal_event = !in_recv_wc;
}

// The affiliated asynchronous error of a fatal NAK's syndrome.
ibv_event_type fatal_event(uint8_t syn) {
  switch (syn) {
    case aeth::nak(aeth::kNakInvalidRequest):
      return IBV_EVENT_QP_REQ_ERR;  // Invalid Request Local WQ Error
    case aeth::nak(aeth::kNakRemoteAccess):
      return IBV_EVENT_QP_ACCESS_ERR;  // Local Access Violation WQ Error
    default:
      return IBV_EVENT_QP_FATAL;  // Local Work Queue Catastrophic Error
  }
}

// Completes the receive WR held by the message in progress.
void complete_recv(Engine& e, Qp& qp, ibv_wc_status st, ibv_wc_opcode op,
                   uint32_t byte_len, const wire::RoceFields& f, bool imm) {
  Qp::Resp& r = qp.resp_;
  ibv_wc wc{};
  wc.wr_id = r.recv.wr_id;
  wc.status = st;
  wc.opcode = op;
  wc.byte_len = byte_len;
  wc.qp_num = qp.qpn_;
  if (imm) {
    wc.wc_flags |= IBV_WC_WITH_IMM;
    wc.imm_data = htonl(f.imm);  // ibv_wc carries it in network order
  }
  if (f.opcode == kRcSendLastInv || f.opcode == kRcSendOnlyInv) {
    wc.wc_flags |= IBV_WC_WITH_INV;
    wc.invalidated_rkey = f.ieth_rkey;
  }
  if (qp.type_ == IBV_QPT_UD) {
    wc.wc_flags |= IBV_WC_GRH;
    wc.src_qp = f.deth_src_qp;
    // RoCE has no service level on the wire; like ConnectX (whose CQE sl
    // field carries the RoCE packet type for UD), sl says how the GRH area
    // is filled: bit 3 = UDP-encapsulated (RoCEv2), bits 2:0 = L3 header
    // type (1 IPv6, 2 IPv4). UCX reads it to find the destination GID.
    wc.sl = f.ipv6 ? kSlRoceV2Ipv6 : kSlRoceV2Ipv4;
  } else {
    wc.src_qp = qp.dest_qpn_;
  }
  wc.pkey_index = 0;
  r.have_recv = false;
  e.push_cqe(qp, qp.recv_cq_, wc, f.se);
}

// Receive WRs posted but not yet taken (RecvSource): asked for only when a
// queue is found empty, so the common path costs nothing. What it takes may
// be refused (a bad WQE, a corrupted ring: the QP is then in error, its
// queue flushed), so the caller looks at the queue again.
template <typename Q>
void refill(Engine& e, Q& q) {
  if (e.recv_src_ && e.recv_src_->refill(q)) e.ctr_.inc(ECtr::recv_refills);
}

// Takes the next receive WR (the QP's RQ or its SRQ) and resolves its
// buffers, as many as hold `need` bytes (all for a message whose length is
// not known yet). False if none is posted. A bad lkey in a buffer the
// message reaches is reported as recv_bad_lkey; one it does not reach (a
// WRITE with immediate reaches none, a SEND of 100 B the first 4 KiB one
// only) is never looked at, as rxe looks only where it copies.
bool take_recv(Engine& e, Qp& qp, Res* res, uint32_t need) {
  Qp::Resp& r = qp.resp_;
  *res = Res::ok;
  if (r.have_recv) {
    r.recv_off = 0;  // UC: a dropped message leaves its WR for the next
    return true;
  }
  if (qp.srq_) {
    if (!qp.srq_->pop(r.recv)) {
      refill(e, *qp.srq_);
      if (!qp.srq_->pop(r.recv)) return false;
    }
  } else {
    if (qp.rq_head_ == qp.rq_tail_) {
      refill(e, qp);  // a refill that put the QP in error flushed the RQ
      if (qp.rq_head_ == qp.rq_tail_) return false;
    }
    const RecvWqe& q = qp.rq_[qp.rq_head_ & qp.rq_mask_];
    r.recv.wr_id = q.wr_id;
    r.recv.num_sge = q.num_sge;
    std::copy_n(q.sge, q.num_sge, r.recv.sg_list);
    ++qp.rq_head_;
    qp.publish_rq();
  }
  r.have_recv = true;
  r.recv_off = 0;
  r.recv_cap = 0;
  uint32_t i = 0;
  for (; i < r.recv.num_sge && r.recv_cap < need; ++i) {
    const Sge& s = r.recv.sg_list[i];
    r.recv_sg[i] = {};
    if (s.length == 0) continue;
    Mr* mr;
    if (e.dev_.check_local(qp.pd_, s.lkey, s.addr, s.length,
                           IBV_ACCESS_LOCAL_WRITE, &mr) != AccessError::kOk) {
      *res = Res::recv_bad_lkey;
      return true;
    }
    r.recv_sg[i] = {mr->host(s.addr), s.length};
    r.recv_cap += s.length;
  }
  r.recv_nsg = i;
  return true;
}

// Checks an rkey for a remote access with `right` (the MR's and the QP's
// access flags must both allow it, C9-88 / 10.6.3.3).
Res check_rkey(Engine& e, Qp& qp, uint32_t rkey, uint64_t va, uint32_t len,
               uint32_t right, uint8_t** host) {
  if (len == 0) {  // zero-length: the R_Key is not checked (9.7.5.1.3)
    *host = nullptr;
    return Res::ok;
  }
  if (!(qp.access_ & right)) return Res::qp_access;
  Mr* mr;
  switch (e.dev_.check_remote(qp.pd_, rkey, va, len, right, &mr, qp.qpn_)) {
    case AccessError::kOk:
      break;
    case AccessError::kBadKey:
      return Res::rkey_invalid;
    case AccessError::kPd:
      return Res::rkey_pd;
    case AccessError::kBounds:
      return Res::rkey_bounds;
    case AccessError::kRights:
      return Res::rkey_rights;
  }
  *host = mr->host(va);
  return Res::ok;
}

// Payload length rules: FIRST/MIDDLE carry exactly one MTU, LAST/ONLY at
// most one; anything else is a length error, NAKed as an invalid request
// (IBTA 9.7.5.1, as rxe's responder checks it).
bool length_ok(const Qp& qp, const RxPkt& p) {
  const uint32_t len = p.f.payload_len;
  if (qp.type_ == IBV_QPT_UD) return true;
  if (p.op.mask & wire::kLast) return len <= qp.mtu_;
  return len == qp.mtu_;
}

Res do_send(Engine& e, Qp& qp, const RxPkt& p) {
  Qp::Resp& r = qp.resp_;
  const bool first = p.op.mask & wire::kFirst;
  const bool last = p.op.mask & wire::kLast;
  if (!length_ok(qp, p)) return Res::opcode_length;
  if (first) {
    Res res;
    if (!take_recv(e, qp, &res, last ? p.f.payload_len : UINT32_MAX))
      return Res::rnr;
    if (res != Res::ok) return res;
  }
  const uint32_t len = p.f.payload_len;
  if (r.recv_off + len > r.recv_cap) return Res::recv_too_small;
  scatter(r.recv_sg, r.recv_nsg, r.recv_off, p.segs, p.fi.payload_off, len);
  r.recv_off += len;
  if (!last)
    prefetch(r.recv_sg, r.recv_nsg, r.recv_off,
             std::min(qp.mtu_, r.recv_cap - r.recv_off), true);
  // SEND_WITH_INV: the window is invalidated before the receive completes,
  // so the consumer that sees the completion sees the window gone.
  if (last && (p.op.mask & wire::kIeth) &&
      !e.dev_.remote_invalidate(qp.pd_, qp.qpn_, p.f.ieth_rkey))
    return Res::invalidate_rkey;
  if (last) {
    r.msg = Qp::Resp::kNone;
    r.msn = psn_add(r.msn, 1);
    complete_recv(e, qp, IBV_WC_SUCCESS, IBV_WC_RECV, r.recv_off, p.f,
                  p.op.mask & wire::kImm);
  } else {
    r.msg = Qp::Resp::kSend;
  }
  return Res::ok;
}

Res do_write(Engine& e, Qp& qp, const RxPkt& p) {
  Qp::Resp& r = qp.resp_;
  const bool first = p.op.mask & wire::kFirst;
  const bool last = p.op.mask & wire::kLast;
  const bool imm = p.op.mask & wire::kImm;
  if (!length_ok(qp, p)) return Res::opcode_length;
  if (first) {
    if (p.f.reth_len > e.dev_.limits().max_msg_sz) return Res::msg_too_long;
    uint8_t* host;
    const Res res = check_rkey(e, qp, p.f.reth_rkey, p.f.reth_va, p.f.reth_len,
                               IBV_ACCESS_REMOTE_WRITE, &host);
    if (res != Res::ok) return res;
    r.wr_p = host;
    r.wr_left = r.wr_total = p.f.reth_len;
  }
  const uint32_t len = p.f.payload_len;
  if (len > r.wr_left || (last && len != r.wr_left)) return Res::write_length;
  if (last && imm) {
    // WRITE with immediate consumes a receive WR (9.4.4): check it is
    // there before placing the last bytes, so an RNR retry is harmless.
    Res res;
    if (!take_recv(e, qp, &res, 0)) return Res::rnr;
    if (res != Res::ok) return res;
  }
  if (len) {
    const wire::ConstBuf* s = p.segs.data();
    HostSge dst{r.wr_p, len};
    scatter(&dst, 1, 0, {s, p.segs.size()}, p.fi.payload_off, len);
    r.wr_p += len;
    r.wr_left -= len;
    prefetch(r.wr_p, std::min(r.wr_left, qp.mtu_), true);  // the next one's
  }
  if (last) {
    r.msg = Qp::Resp::kNone;
    r.msn = psn_add(r.msn, 1);
    if (imm)
      complete_recv(e, qp, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM,
                    r.wr_total, p.f, true);
  } else {
    r.msg = Qp::Resp::kWrite;
  }
  return Res::ok;
}

// The resource slot a new READ/ATOMIC takes; null if every slot still has
// responses to send, or none was granted (more outstanding than
// max_dest_rd_atomic, which the requester promised not to exceed: an
// invalid request, IBTA 9.7.5.1).
RespResource* new_resource(Qp& qp) {
  if (qp.max_dest_rd_atomic_ == 0) return nullptr;
  RespResource& s = qp.res_[qp.res_next_];
  // A replay still queued on the oldest slot is moot: the requester has
  // completed that request, or it could not have sent this one.
  if (s.pending && !s.replay) return nullptr;
  // Kept below the ring's size: a free-running count taken modulo a size
  // that does not divide 2^32 (3, 5, 6, ...) reuses a slot at once when it
  // wraps.
  if (++qp.res_next_ == qp.res_.size()) qp.res_next_ = 0;
  return &s;
}

// ATOMIC WRITE (IBTA 1.5 A19.4, as rxe executes it): 8 bytes at an 8-byte
// aligned address, stored as one release store once every earlier request
// of the QP has executed (they have: requests execute in PSN order); the
// R_Key must allow remote write. Like a READ it takes a responder resource
// and is answered by an RDMA READ RESPONSE ONLY without data (rxe's
// send_read_response_ack; its completer takes that, or an ACK); a
// duplicate replays that response from the resource, never executing
// again, so a later write to the same word is never undone.
Res do_atomic_write(Engine& e, Qp& qp, const RxPkt& p) {
  if (p.f.payload_len != 8 || p.f.reth_len != 8) return Res::opcode_length;
  if (p.f.reth_va & 7) return Res::atomic_misaligned;
  uint8_t* host;
  const Res res = check_rkey(e, qp, p.f.reth_rkey, p.f.reth_va, 8,
                             IBV_ACCESS_REMOTE_WRITE, &host);
  if (res != Res::ok) return res;
  if (reinterpret_cast<uintptr_t>(host) & 7) return Res::atomic_misaligned;
  RespResource* s = new_resource(qp);
  if (!s) return Res::rd_atomic_over;
  *s = {};
  s->kind = RespResource::kAtomicWrite;
  s->first_psn = s->last_psn = s->tx_psn = p.f.psn;
  s->pending = qp.res_any_pending_ = true;
  uint64_t v;
  HostSge dst{reinterpret_cast<uint8_t*>(&v), 8};
  scatter(&dst, 1, 0, p.segs, p.fi.payload_off, 8);
  // The application may read or CAS the word concurrently.
  std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(host))
      .store(v, std::memory_order_release);
  qp.resp_.msn = psn_add(qp.resp_.msn, 1);
  e.ctr_.inc(ECtr::atomic_writes);
  return Res::ok;
}

Res do_read(Engine& e, Qp& qp, const RxPkt& p) {
  uint8_t* host;
  const uint32_t len = p.f.reth_len;
  // Longer than a message may be (2^31, IBTA 9.4.3 and the port's
  // max_msg_sz): at MTU 256 it would take 2^23 PSNs or more, half the PSN
  // space, and the window arithmetic breaks (rxe: check_length).
  if (len > e.dev_.limits().max_msg_sz) return Res::msg_too_long;
  const Res res = check_rkey(e, qp, p.f.reth_rkey, p.f.reth_va, len,
                             IBV_ACCESS_REMOTE_READ, &host);
  if (res != Res::ok) return res;
  RespResource* s = new_resource(qp);
  if (!s) return Res::rd_atomic_over;
  const uint32_t npkts = pkts_for(len, qp.mtu_);
  *s = {};
  s->kind = RespResource::kRead;
  s->first_psn = p.f.psn;
  s->last_psn = psn_add(p.f.psn, npkts - 1);
  s->rkey = p.f.reth_rkey;
  s->pending = qp.res_any_pending_ = true;
  s->tx_psn = s->tx_first = p.f.psn;
  s->tx_p = host;
  s->tx_left = s->tx_total = len;
  qp.resp_.msn = psn_add(qp.resp_.msn, 1);
  return Res::ok;
}

Res do_atomic(Engine& e, Qp& qp, const RxPkt& p) {
  // Atomics work on naturally aligned 8-byte words (IBTA 9.4.5); a
  // misaligned address is an invalid request.
  if (p.f.atomic_va & 7) return Res::atomic_misaligned;
  uint8_t* host;
  const Res res = check_rkey(e, qp, p.f.atomic_rkey, p.f.atomic_va, 8,
                             IBV_ACCESS_REMOTE_ATOMIC, &host);
  if (res != Res::ok) return res;
  RespResource* s = new_resource(qp);
  if (!s) return Res::rd_atomic_over;
  // The application may touch the same word with CPU atomics.
  std::atomic_ref<uint64_t> word(*reinterpret_cast<uint64_t*>(host));
  uint64_t orig;
  if (p.f.opcode == kRcCmpSwap) {
    orig = p.f.atomic_compare;
    word.compare_exchange_strong(orig, p.f.atomic_swap_add);
  } else {
    orig = word.fetch_add(p.f.atomic_swap_add);
  }
  *s = {};
  s->kind = RespResource::kAtomic;
  s->first_psn = s->last_psn = s->tx_psn = p.f.psn;
  s->orig = orig;
  s->rkey = p.f.atomic_rkey;
  s->pending = qp.res_any_pending_ = true;
  qp.resp_.msn = psn_add(qp.resp_.msn, 1);
  return Res::ok;
}

// Duplicate request (PSN before ePSN, 9.7.5.1.6): never executed twice.
void duplicate(Engine& e, Qp& qp, const RxPkt& p) {
  e.ctr_.inc(ECtr::rx_dup);
  ++qp.ctr_.dup_packets;
  const uint32_t psn = p.f.psn;
  if (p.op.mask & wire::kRead) {
    for (RespResource& s : qp.res_) {
      if (s.kind != RespResource::kRead || psn_before(psn, s.first_psn) ||
          psn_after(psn, s.last_psn))
        continue;
      // Replay from the saved resource; the request may ask for a
      // sub-range (a requester resuming a partly answered READ).
      uint8_t* host;
      if (p.f.reth_rkey != s.rkey ||
          check_rkey(e, qp, p.f.reth_rkey, p.f.reth_va, p.f.reth_len,
                     IBV_ACCESS_REMOTE_READ, &host) != Res::ok)
        return;
      const uint32_t npkts = pkts_for(p.f.reth_len, qp.mtu_);
      if (psn_after(psn_add(psn, npkts - 1), s.last_psn)) return;
      s.pending = s.replay = qp.res_any_pending_ = true;
      s.tx_psn = s.tx_first = psn;
      s.tx_p = host;
      s.tx_left = s.tx_total = p.f.reth_len;
      e.ctr_.inc(ECtr::read_replays);
      e.make_ready(qp);
      return;
    }
    return;  // too old: no resource left, silently dropped
  }
  if (p.op.mask & (wire::kAtomic | wire::kAtomicWrite)) {
    const auto kind = p.op.mask & wire::kAtomic ? RespResource::kAtomic
                                                : RespResource::kAtomicWrite;
    for (RespResource& s : qp.res_) {
      if (s.kind != kind || s.first_psn != psn) continue;
      // The saved value, not a new execution.
      s.pending = s.replay = qp.res_any_pending_ = true;
      s.tx_psn = psn;
      e.ctr_.inc(ECtr::atomic_replays);
      e.make_ready(qp);
      e.make_ack_ready(qp);
      return;
    }
    return;
  }
  // SEND/WRITE: acknowledge again (C9-105), up to the last SEND/WRITE
  // executed (Qp::Resp::sw_psn), which is this one or later.
  queue_ack(e, qp, aeth::kAckUnlimited, qp.resp_.sw_psn);
}

// Opcode sequence (9.7.5.1.2? C9-91): MIDDLE/LAST continue a message of
// the same kind; FIRST/ONLY start one.
bool sequence_ok(const Qp& qp, const wire::OpcodeInfo& op) {
  const Qp::Resp::Msg m = qp.resp_.msg;
  const bool cont = op.mask & (wire::kMiddle) ||
                    ((op.mask & wire::kLast) && !(op.mask & wire::kFirst));
  if (m == Qp::Resp::kNone) return !cont;
  if (!cont) return false;
  return m == Qp::Resp::kSend ? (op.mask & wire::kSend) != 0
                              : (op.mask & wire::kWrite) != 0;
}

void rc_rx(Engine& e, Qp& qp, const RxPkt& p) {
  Qp::Resp& r = qp.resp_;
  const uint32_t psn = p.f.psn;
  const int32_t d = psn_diff(psn, r.epsn);
  if (d < 0) {
    duplicate(e, qp, p);
    return;
  }
  if (d > 0) {
    // Out of sequence: one NAK per gap (C9-101 class B), then silence
    // until the expected PSN shows up.
    e.ctr_.inc(ECtr::rx_out_of_seq);
    ++qp.ctr_.out_of_seq;
    if (!r.nak_sent) {
      r.nak_sent = true;
      e.ctr_.inc(ECtr::naks_seq_tx);
      ++qp.ctr_.naks_seq_tx;
      queue_ack(e, qp, aeth::nak(aeth::kNakPsnSeq), r.epsn);
    }
    return;
  }
  r.nak_sent = false;
  // The gap a pending sequence/RNR NAK reported is closed: drop that NAK
  // rather than make the requester go back for nothing.
  if (r.ack_pending && (r.ack_syndrome == aeth::nak(aeth::kNakPsnSeq) ||
                        aeth::kind(r.ack_syndrome) == aeth::kRnrNak))
    r.ack_pending = false;
  if (!sequence_ok(qp, p.op)) {
    count_refusal(e, qp, Res::opcode_seq);
    fatal(e, qp, aeth::nak(aeth::kNakInvalidRequest), psn, false);
    return;
  }
  Res res;
  uint32_t used = 1;
  if (p.op.mask & wire::kAtomicWrite) {
    res = do_atomic_write(e, qp, p);
  } else if (p.op.mask & wire::kSend) {
    res = do_send(e, qp, p);
  } else if (p.op.mask & wire::kWrite) {
    res = do_write(e, qp, p);
  } else if (p.op.mask & wire::kRead) {
    res = do_read(e, qp, p);
    used = pkts_for(p.f.reth_len, qp.mtu_);
  } else {
    res = do_atomic(e, qp, p);
  }
  switch (res) {
    case Res::ok:
      break;
    case Res::rnr:
      // The refill found the application's ring corrupted: the QP is in
      // error now and answers nothing (as if it had been before).
      if (qp.state_ == IBV_QPS_ERR) return;
      // No receive WR: RNR NAK with our timer; ePSN stays (9.7.5.2.8).
      e.ctr_.inc(ECtr::naks_rnr_tx);
      ++qp.ctr_.naks_rnr_tx;
      r.nak_sent = true;
      queue_ack(e, qp, static_cast<uint8_t>(aeth::kRnrNak | qp.min_rnr_timer_),
                psn);
      return;
    default: {
      const RespError err = resp_error(res);
      count_refusal(e, qp, res);
      if (err.recv_status != IBV_WC_SUCCESS)
        complete_recv(e, qp, err.recv_status, IBV_WC_RECV,
                      res == Res::recv_too_small ? r.recv_off : 0, p.f, false);
      fatal(e, qp, aeth::nak(err.nak_code), psn,
            err.recv_status != IBV_WC_SUCCESS);
      return;
    }
  }
  r.epsn = psn_add(psn, used);
  if (p.op.mask & (wire::kRead | wire::kAtomic | wire::kAtomicWrite)) {
    // The response itself acknowledges everything before it.
    if (r.ack_pending && !is_fatal_nak(r.ack_syndrome)) r.ack_pending = false;
    e.make_ready(qp);
    if (p.op.mask & (wire::kAtomic | wire::kAtomicWrite)) e.make_ack_ready(qp);
  } else {
    r.sw_psn = psn;
    if (p.f.ack_req ||
        (r.ack_pending && r.ack_syndrome == aeth::kAckUnlimited)) {
      // Coalescing: a pending ACK grows to cover every packet executed since.
      queue_ack(e, qp, aeth::kAckUnlimited, psn);
    }
  }
}

void uc_rx(Engine& e, Qp& qp, const RxPkt& p) {
  Qp::Resp& r = qp.resp_;
  const uint32_t psn = p.f.psn;
  const bool starts = p.op.mask & wire::kFirst;
  if (psn != r.epsn) {
    // A lost packet: the message in progress is dropped (9.8.3.1).
    if (r.msg != Qp::Resp::kNone) {
      e.ctr_.inc(ECtr::rx_uc_dropped);
      r.msg = Qp::Resp::kNone;
    }
    r.uc_drop = !starts;
  }
  r.epsn = psn_add(psn, 1);
  if (r.uc_drop) {
    if (!starts) {
      e.ctr_.inc(ECtr::rx_uc_dropped);
      return;
    }
    r.uc_drop = false;
  }
  if (!sequence_ok(qp, p.op)) {
    e.ctr_.inc(ECtr::rx_bad_opcode_seq);
    r.msg = Qp::Resp::kNone;
    r.uc_drop = !starts;
    if (!starts) return;
  }
  const Res res =
      (p.op.mask & wire::kSend) ? do_send(e, qp, p) : do_write(e, qp, p);
  if (res == Res::ok) return;
  // UC has no NAKs: the message is silently dropped (9.8.3.2).
  if (res == Res::rnr) {
    e.ctr_.inc(ECtr::rx_no_recv);
  } else {
    e.ctr_.inc(ECtr::rx_uc_dropped);
    count_refusal(e, qp, res);
    if (const ibv_wc_status st = resp_error(res).recv_status;
        st != IBV_WC_SUCCESS) {
      complete_recv(e, qp, st, IBV_WC_RECV, 0, p.f, false);
      e.to_error(qp);
      return;
    }
  }
  r.msg = Qp::Resp::kNone;
  r.uc_drop = true;
}

void ud_rx(Engine& e, Qp& qp, const RxPkt& p) {
  Qp::Resp& r = qp.resp_;
  // A Q_Key that is not the QP's: the request is dropped, silently, and
  // counted (the IBTA's Q_Key check; rule number unchecked, none given).
  if (p.f.deth_qkey != qp.qkey_) {
    e.ctr_.inc(ECtr::rx_bad_qkey);
    return;
  }
  Res res;
  const uint32_t len = p.f.payload_len;
  if (!take_recv(e, qp, &res, len + kGrhSize)) {
    e.ctr_.inc(ECtr::rx_no_recv);
    return;
  }
  if (res == Res::ok && len + kGrhSize > r.recv_cap) res = Res::recv_too_small;
  if (res != Res::ok) {
    count_refusal(e, qp, res);
    complete_recv(e, qp, resp_error(res).recv_status, IBV_WC_RECV, 0, p.f,
                  false);
    e.to_error(qp);
    return;
  }
  // The 40-byte GRH slot: the IPv6 header, or for IPv4 20 zero bytes and
  // then the IPv4 header (the RoCEv2 convention, as rxe and mlx5 do).
  uint8_t grh[kGrhSize] = {};
  const uint8_t* l3 = p.segs[0].data + p.fi.l3_off;
  if (p.f.ipv6)
    std::memcpy(grh, l3, kGrhSize);
  else
    std::memcpy(grh + 20, l3, 20);
  const wire::ConstBuf g{grh, kGrhSize};
  scatter(r.recv_sg, r.recv_nsg, 0, {&g, 1}, 0, kGrhSize);
  scatter(r.recv_sg, r.recv_nsg, kGrhSize, p.segs, p.fi.payload_off, len);
  complete_recv(e, qp, IBV_WC_SUCCESS, IBV_WC_RECV, len + kGrhSize, p.f,
                p.op.mask & wire::kImm);
}

}  // namespace

void Responder::rx_st(Engine& e, Qp& qp, const RxPkt& p) {
  if (qp.resp_.fatal) return;  // going to ERR once the NAK is out
  switch (qp.type_) {
    case IBV_QPT_RC:
      e.on_ce_st(qp, p.f.tclass);  // CE-marked request: a CNP back
      rc_rx(e, qp, p);
      break;
    case IBV_QPT_UC:
      e.on_ce_st(qp, p.f.tclass);  // as RC: the sender's rate is UC's only
      uc_rx(e, qp, p);
      break;
    default:
      ud_rx(e, qp, p);
      break;
  }
}

bool Responder::read_pending(const Qp& qp) {
  if (!qp.res_any_pending_) return false;
  for (const RespResource& s : qp.res_)
    if (s.pending && s.kind == RespResource::kRead) return true;
  return false;
}

bool nothing_to_send(const Qp& qp) {
  const bool requests =
      (qp.state_ == IBV_QPS_RTS || qp.state_ == IBV_QPS_SQD) &&
      qp.sq_next_ != qp.sq_tail_;
  return !requests && !Responder::read_pending(qp);
}

uint32_t Responder::send_st(Engine& e, Qp& qp, uint32_t budget, bool* more) {
  *more = false;
  if (qp.state_ == IBV_QPS_ERR || qp.type_ != IBV_QPT_RC) return 0;
  uint32_t sent = 0;
  Qp::Resp& r = qp.resp_;
  // Read responses and atomic ACKs first, oldest resource first: an ACK
  // must not overtake responses for earlier PSNs.
  const uint32_t n =
      qp.res_any_pending_ ? static_cast<uint32_t>(qp.res_.size()) : 0;
  for (uint32_t k = 0; k < n; ++k) {
    RespResource& s = qp.res_[(qp.res_next_ + k) % n];
    while (s.pending) {
      if (sent >= budget || e.turn_left_ <= 0) {
        *more = true;
        return sent;
      }
      wire::RoceFields f = qp.tmpl_;
      f.psn = s.tx_psn;
      f.aeth_syndrome = aeth::kAckUnlimited;
      f.aeth_msn = r.msn;
      wire::ConstBuf piece{};
      uint32_t len = 0;
      if (s.kind == RespResource::kAtomic) {
        f.opcode = kRcAtomicAck;
        f.atomic_orig = s.orig;
      } else if (s.kind == RespResource::kAtomicWrite) {
        f.opcode = kRcReadRespOnly;  // ACK-sized: no data, not paced
      } else {
        len = std::min(qp.mtu_, s.tx_left);
        const bool first = s.tx_psn == s.tx_first;
        const bool last = len == s.tx_left;
        f.opcode = first && last ? kRcReadRespOnly
                   : first       ? kRcReadRespFirst
                   : last        ? kRcReadRespLast
                                 : kRcReadRespMiddle;
        f.payload_len = len;
        piece = {s.tx_p, len};
        // READ data is ECN-capable and paced as request data is (the
        // requester answers a CE mark with a CNP); while paced, the ACKs
        // behind the responses wait too.
        e.set_ect(f);
        qp.rate_.set_idle(e.dcqcn_share_, false);  // busy (DcqcnShare)
        if (!e.pace_ok(qp)) return sent;
      }
      if (!e.send_packet(qp, f, {&piece, len ? 1u : 0u})) {
        *more = true;
        return sent;
      }
      if (len) e.paced_sent(qp);
      ++sent;
      s.tx_psn = psn_add(s.tx_psn, 1);
      s.tx_p += len;
      s.tx_left -= len;
      prefetch(s.tx_p, std::min(qp.mtu_, s.tx_left), false);
      if (s.kind != RespResource::kRead || s.tx_left == 0) s.pending = false;
    }
  }
  qp.res_any_pending_ = false;  // every resource drained (or none walked)
  // The READ responses are out: idle unless requests are left (a READ
  // target in RTR would otherwise stay counted).
  if (!qp.rate_.idle() && nothing_to_send(qp))
    qp.rate_.set_idle(e.dcqcn_share_, true);
  if (r.ack_pending) {
    if (sent >= budget) {
      *more = true;
      return sent;
    }
    wire::RoceFields f = qp.tmpl_;
    f.opcode = kRcAck;
    f.psn = r.ack_psn;
    f.aeth_syndrome = r.ack_syndrome;
    f.aeth_msn = r.msn;
    if (!e.send_packet(qp, f, {})) {
      *more = true;
      return sent;
    }
    ++sent;
    r.ack_pending = false;
    if (r.ack_syndrome == aeth::kAckUnlimited) {
      e.ctr_.inc(ECtr::acks_tx);
      ++qp.ctr_.acks_tx;
    }
    if (r.fatal) {
      r.fatal = false;
      // The NAK just sent is the fatal one (never superseded).
      const bool raise = std::exchange(r.fatal_event, false);
      const ibv_event_type ev = fatal_event(r.ack_syndrome);
      e.to_error(qp);
      if (raise) e.dev_.raise({ev, qp.qpn_, nullptr, nullptr, qp.owner_});
    }
  }
  return sent;
}

}  // namespace urnic::transport
