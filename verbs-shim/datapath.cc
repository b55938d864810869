// The data path: posting WQEs into the rings the service maps, ringing the
// context's doorbell page, and polling completions out of the CQ rings. No
// system calls, no allocation: a spin lock per queue (uncontended in the
// usual one-thread-per-queue use) and stores with release ordering.
#include <bit>
#include <cerrno>
#include <cstring>

#include "dataplane/hostif/verbs.h"
#include "verbs-shim/shim.h"

namespace urnic::shim {

void ring_and_wake(Context& ctx, uint32_t doorbell) {
  if (ring_doorbell(*ctx.db, doorbell) &&
      doorbell_wakes(*ctx.db, doorbell, ctx.info.homes)) {
    // The lcore waits for events: one write wakes it. A failure (the
    // service gone) loses nothing: nobody is left to wake.
    const int fd = ctx.bells[doorbell_home(doorbell, ctx.info.homes)];
    const uint64_t one = 1;
    if (fd >= 0) (void)!write(fd, &one, sizeof one);
  }
}

namespace {

constexpr uint32_t kMaxMsgSize = uint32_t{1} << 31;  // = max_msg_sz
// A message may take at most 2^22 packets (the 2^23 PSN window, halved).
constexpr uint64_t kMaxPackets = uint64_t{1} << 22;

// The opcode rules are the transport's own (one definition).
using hostif::is_atomic;
using hostif::valid_opcode;

// States in which the send queue accepts work (ERR: the service flushes).
bool send_ok(uint32_t state) {
  return state == IBV_QPS_RTS || state == IBV_QPS_SQD || state == IBV_QPS_SQE ||
         state == IBV_QPS_ERR;
}

bool ah_ok(const Qp& q, const ibv_ah* ah) {
  return ah && ah->context == q.ibv()->context;
}

// The checks the engine would otherwise make later (with a LOC_QP_OP_ERR
// completion and the QP in error): message length, atomics, UD size.
int check_length(const Qp& q, ibv_wr_opcode op, uint64_t len, bool inl,
                 uint32_t num_sge, uint32_t first_len) {
  if (len > kMaxMsgSize) return EINVAL;
  if (is_atomic(op) && (inl || num_sge != 1 || first_len != 8)) return EINVAL;
  // ATOMIC_WRITE carries its 8 bytes in the WQE, no SGE or inline data.
  if (op == IBV_WR_ATOMIC_WRITE && (inl || num_sge || len)) return EINVAL;
  if (inl && (op == IBV_WR_RDMA_READ || len > q.max_inline)) return EINVAL;
  // A UD message over the port MTU is not refused: the service sends
  // nothing and completes it (IBTA C10-93.1.1, as rxe).
  if (q.type != IBV_QPT_UD) {
    if (const uint32_t mtu = q.path_mtu.load(std::memory_order_relaxed);
        mtu && len / mtu >= kMaxPackets)
      return EINVAL;
  }
  return 0;
}

// A BIND_MW WQE (abi.h, ShmSendWqe): the window is named by its rkey now,
// which then becomes the new one (as providers update mw->rkey). The
// service checks the MR, range and rights when the bind executes.
int set_bind(Qp& q, ShmSendWqe& w, ibv_mw* mw, uint32_t rkey,
             const ibv_mw_bind_info& bi) {
  if (!mw || mw->context != q.ibv()->context) return EINVAL;
  if (bi.mr && bi.mr->context != mw->context) return EINVAL;
  w.imm_data = mw->rkey;
  w.rkey = rkey;
  w.remote_addr = bi.addr;
  w.compare_add = bi.length;
  w.swap = static_cast<uint32_t>(bi.mw_access_flags);
  w.bind_lkey = bi.mr ? bi.mr->lkey : 0;
  mw->rkey = rkey;
  return 0;
}

// Copies one ibv_send_wr into its slot (the slot is not yet published).
int build_send(Qp& q, ShmSendWqe& w, const ibv_send_wr* wr) {
  if (!valid_opcode(q.type, wr->opcode)) return EINVAL;
  // ibv_send_wr has no room for ATOMIC_WRITE's 8 bytes: rdma-core's
  // providers take it through ibv_wr_atomic_write only, and so do we.
  if (wr->opcode == IBV_WR_ATOMIC_WRITE) return EINVAL;
  if (wr->num_sge < 0) return EINVAL;
  const bool inl = wr->send_flags & IBV_SEND_INLINE;
  // A bind or a local invalidate carries no data.
  if (hostif::is_local_op(wr->opcode) && (wr->num_sge || inl)) return EINVAL;
  const auto nsge = static_cast<uint32_t>(wr->num_sge);
  // Inline data is gathered now, so any number of SGEs may feed it.
  if (!inl && nsge > q.max_send_sge) return EINVAL;
  uint64_t len = 0;
  for (uint32_t i = 0; i < nsge; ++i) len += wr->sg_list[i].length;
  if (const int rc = check_length(q, wr->opcode, len, inl, nsge,
                                  nsge ? wr->sg_list[0].length : 0))
    return rc;
  if (q.type == IBV_QPT_UD && !ah_ok(q, wr->wr.ud.ah)) return EINVAL;

  w.wr_id = wr->wr_id;
  w.opcode = wr->opcode;
  w.send_flags = wr->send_flags;
  w.imm_data = wr->imm_data;
  w.remote_addr = 0;
  w.compare_add = 0;
  w.swap = 0;
  w.rkey = 0;
  w.ah = 0;
  w.remote_qpn = 0;
  w.remote_qkey = 0;
  w.bind_lkey = 0;
  switch (wr->opcode) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
    case IBV_WR_RDMA_READ:
      w.remote_addr = wr->wr.rdma.remote_addr;
      w.rkey = wr->wr.rdma.rkey;
      break;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      w.remote_addr = wr->wr.atomic.remote_addr;
      w.rkey = wr->wr.atomic.rkey;
      w.compare_add = wr->wr.atomic.compare_add;
      w.swap = wr->wr.atomic.swap;
      break;
    case IBV_WR_BIND_MW:
      if (set_bind(q, w, wr->bind_mw.mw, wr->bind_mw.rkey,
                   wr->bind_mw.bind_info))
        return EINVAL;
      break;
    default:
      break;  // LOCAL_INV, SEND_WITH_INV: imm_data is invalidate_rkey
  }
  if (q.type == IBV_QPT_UD) {
    w.ah = wr->wr.ud.ah->handle;
    w.remote_qpn = wr->wr.ud.remote_qpn;
    w.remote_qkey = wr->wr.ud.remote_qkey;
  }
  if (inl) {
    uint32_t off = 0;
    for (uint32_t i = 0; i < nsge; ++i) {
      const ibv_sge& s = wr->sg_list[i];
      // An empty SGE may have no address (UCX's zero-length active
      // messages): memcpy's source must not be null even for 0 bytes.
      if (s.length)
        std::memcpy(w.inline_data + off, reinterpret_cast<const void*>(s.addr),
                    s.length);
      off += s.length;
    }
    w.num_sge = 0;
    w.inline_len = off;
  } else {
    // lkeys are the service's to check (a bad one completes with
    // IBV_WC_LOC_PROT_ERR, as on hardware).
    for (uint32_t i = 0; i < nsge; ++i)
      w.sge[i] = {wr->sg_list[i].addr, wr->sg_list[i].length,
                  wr->sg_list[i].lkey};
    w.num_sge = nsge;
    w.inline_len = 0;
  }
  return 0;
}

void publish_sq(Qp& q, uint32_t prod) {
  q.sq_prod = prod;
  q.sh->sq_prod.store(prod, std::memory_order_release);
  ring_and_wake(q.ctx(), q.doorbell);
}

}  // namespace

// ibv_bind_mw (type 1, verbs.h checked the type): a BIND_MW WR on the QP
// with the next rkey, as providers post it; mw->rkey is the new one once
// posted, and the completion says whether the bind took.
int bind_mw(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind* mb) {
  if (!mb) return EINVAL;
  ibv_send_wr wr{};
  wr.wr_id = mb->wr_id;
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = static_cast<unsigned>(mb->send_flags);
  wr.bind_mw.mw = mw;
  wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
  wr.bind_mw.bind_info = mb->bind_info;
  ibv_send_wr* bad = nullptr;
  return post_send(qp, &wr, &bad);
}

int post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  Qp& q = qp_of(qp);
  int rc = 0;
  if (q.ctx().dead.load(std::memory_order_relaxed)) {
    *bad = wr;
    return EIO;
  }
  std::lock_guard g(q.sq_lock);
  if (!send_ok(q.sh->state.load(std::memory_order_acquire))) {
    *bad = wr;
    return EINVAL;
  }
  uint32_t prod = q.sq_prod;
  uint32_t done = q.sh->sq_done.load(std::memory_order_acquire);
  for (; wr; wr = wr->next) {
    if (prod - done >= q.sq_size()) {
      done = q.sh->sq_done.load(std::memory_order_acquire);
      if (prod - done >= q.sq_size()) {
        rc = q.ctx().full_or_gone();
        break;
      }
    }
    rc = build_send(q, q.sq()[prod & (q.sq_size() - 1)], wr);
    if (rc) break;
    ++prod;
  }
  // The WRs before a bad one are posted, as on hardware.
  if (prod != q.sq_prod) publish_sq(q, prod);
  if (rc) *bad = wr;
  return rc;
}

namespace {

int fill_recv(ShmRecvWqe& w, const ibv_recv_wr* wr, uint32_t max_sge) {
  if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > max_sge)
    return EINVAL;
  w.wr_id = wr->wr_id;
  w.num_sge = static_cast<uint32_t>(wr->num_sge);
  for (uint32_t i = 0; i < w.num_sge; ++i)
    w.sge[i] = {wr->sg_list[i].addr, wr->sg_list[i].length,
                wr->sg_list[i].lkey};
  return 0;
}

// Writes the WRs into a receive ring (a QP's RQ or an SRQ) while there is
// room, then publishes the producer index once and rings the doorbell.
// ENOMEM: full (the caller asks whether the service is gone).
// `prod` is the caller's copy of its own index; the caller holds the lock.
int post_recv_ring(ShmRecvWqe* ring, uint32_t size, uint32_t max_sge,
                   uint32_t& prod, std::atomic<uint32_t>& shared_prod,
                   const std::atomic<uint32_t>& done, Context& ctx,
                   uint32_t doorbell, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  int rc = 0;
  uint32_t p = prod;
  uint32_t d = done.load(std::memory_order_acquire);
  for (; wr; wr = wr->next) {
    if (p - d >= size) {
      d = done.load(std::memory_order_acquire);
      if (p - d >= size) {
        rc = ENOMEM;
        break;
      }
    }
    rc = fill_recv(ring[p & (size - 1)], wr, max_sge);
    if (rc) break;
    ++p;
  }
  if (p != prod) {
    prod = p;
    shared_prod.store(p, std::memory_order_release);
    ring_and_wake(ctx, doorbell);
  }
  if (rc) *bad = wr;
  return rc;
}

}  // namespace

int post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  Qp& q = qp_of(qp);
  if (q.ctx().dead.load(std::memory_order_relaxed)) {
    *bad = wr;
    return EIO;
  }
  if (q.has_srq) {
    *bad = wr;
    return EINVAL;
  }
  std::lock_guard g(q.rq_lock);
  if (q.sh->state.load(std::memory_order_acquire) == IBV_QPS_RESET) {
    *bad = wr;
    return EINVAL;
  }
  const int rc = post_recv_ring(q.rq(), q.rq_size(), q.max_recv_sge, q.rq_prod,
                                q.sh->rq_prod, q.sh->rq_done, q.ctx(),
                                q.doorbell, wr, bad);
  return rc == ENOMEM ? q.ctx().full_or_gone() : rc;
}

int post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  Srq& s = srq_of(srq);
  if (s.ctx->dead.load(std::memory_order_relaxed)) {
    *bad = wr;
    return EIO;
  }
  std::lock_guard g(s.lock);
  const int rc = post_recv_ring(s.ring, s.size, s.max_sge, s.prod, s.sh->prod,
                                s.sh->done, *s.ctx, s.doorbell, wr, bad);
  return rc == ENOMEM ? s.ctx->full_or_gone() : rc;
}

// --- completion queues
// -------------------------------------------------------------

namespace {

// Empty polls between two looks at the control connection (a poll(2)
// each): a program that only polls a CQ hears of a killed service within a
// few milliseconds of spinning, at a small fraction of an empty poll's cost.
constexpr uint32_t kHangupCheckPolls = 4096;

// An empty CQ of a context whose service is gone (the connection failed,
// the service flushed everything and closed the doorbell page, or it was
// killed and its end of the control connection hung up): polling fails, as
// on a device in its fatal state. Completions already in the ring (the
// flushed WRs among them) are still returned first; the ring stays mapped
// after the service exits.
bool service_gone(Cq& q) {
  Context& c = *q.ctx;
  if (c.dead.load(std::memory_order_relaxed)) return true;
  if (c.db->closed.load(std::memory_order_acquire)) {
    c.lost("urnicd is shutting down");
    return true;
  }
  if (++q.empty_polls % kHangupCheckPolls || !c.hung_up()) return false;
  c.lost("its control connection hung up");
  return true;
}

int poll_cq_locked(ibv_cq* cq, int n, ibv_wc* wc) {
  Cq& q = cq_of(cq);
  if (q.ctx->in_child.load(std::memory_order_relaxed)) {
    errno = EIO;
    return -1;
  }
  std::lock_guard g(q.lock);
  const uint32_t prod = q.sh->prod.load(std::memory_order_acquire);
  if (prod - q.cons > q.mask + 1) {  // not something the service writes
    errno = EIO;
    return -1;
  }
  int k = 0;
  while (k < n && q.cons != prod) {
    wc[k++] = q.ring[q.cons & q.mask];
    ++q.cons;
  }
  if (k) {
    q.sh->cons.store(q.cons, std::memory_order_release);
    return k;
  }
  // An overrun CQ is in error: like hardware, polling it fails.
  if (n > 0 &&
      (q.sh->error.load(std::memory_order_acquire) || service_gone(q))) {
    errno = EIO;
    return -1;
  }
  return 0;
}

}  // namespace

int poll_cq(ibv_cq* cq, int n, ibv_wc* wc) {
  const int k = poll_cq_locked(cq, n, wc);
  if (k == 0 && n > 0) empty_poll();  // outside the CQ's lock
  return k;
}

void cq_clean(ibv_cq* cq, uint32_t qpn) {
  if (cq == nullptr) return;
  Cq& q = cq_of(cq);
  std::lock_guard g(q.lock);
  const uint32_t prod = q.sh->prod.load(std::memory_order_acquire);
  if (prod - q.cons > q.mask + 1) return;  // not the service's: polls fail
  // From the newest back, each kept entry moves up past the dropped ones;
  // the consumer index then skips them. Only [cons, prod) is written,
  // which the service does not touch until cons moves.
  uint32_t dropped = 0;
  for (uint32_t i = prod; i != q.cons;) {
    --i;
    const ibv_wc& w = q.ring[i & q.mask];
    if (w.qp_num == qpn)
      ++dropped;
    else if (dropped)
      q.ring[(i + dropped) & q.mask] = w;
  }
  if (dropped == 0) return;
  q.cons += dropped;
  q.sh->cons.store(q.cons, std::memory_order_release);
}

int req_notify_cq(ibv_cq* cq, int solicited_only) {
  Cq& q = cq_of(cq);
  if (q.ctx->dead.load(std::memory_order_relaxed)) return EIO;
  // Sequentially consistent: the program's next poll must not read the
  // producer index before this store is visible, or a completion pushed in
  // between is neither polled nor notified (the service fences likewise
  // between publishing prod and reading arm).
  if (solicited_only) {
    // Armed for every completion already: that stays.
    uint32_t expect = 0;
    q.sh->arm.compare_exchange_strong(expect, kArmSolicited,
                                      std::memory_order_seq_cst);
  } else {
    q.sh->arm.exchange(kArmAll, std::memory_order_seq_cst);
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return 0;
}

namespace {

// ibv_cq_ex: start_poll takes the lock, end_poll releases it (as rdma-core
// providers); the consumer index is published at end_poll.
void load_current(Cq& q) {
  q.cur = &q.ring[q.cons & q.mask];
  q.cqx.wr_id = q.cur->wr_id;
  q.cqx.status = q.cur->status;
}

int cq_start_poll(ibv_cq_ex* cq, ibv_poll_cq_attr* attr) {
  Cq& q = cq_of(cq);
  if (attr && attr->comp_mask) return EINVAL;
  if (q.ctx->in_child.load(std::memory_order_relaxed)) return EIO;
  q.lock.lock();
  const uint32_t prod = q.sh->prod.load(std::memory_order_acquire);
  if (q.cons == prod || prod - q.cons > q.mask + 1) {
    const bool err = prod - q.cons > q.mask + 1 ||
                     q.sh->error.load(std::memory_order_acquire) ||
                     service_gone(q);
    q.lock.unlock();
    if (!err) empty_poll();
    return err ? EIO : ENOENT;
  }
  load_current(q);
  return 0;
}

int cq_next_poll(ibv_cq_ex* cq) {
  Cq& q = cq_of(cq);
  ++q.cons;
  if (q.cons == q.sh->prod.load(std::memory_order_acquire)) {
    q.cur = nullptr;
    return ENOENT;
  }
  load_current(q);
  return 0;
}

void cq_end_poll(ibv_cq_ex* cq) {
  Cq& q = cq_of(cq);
  // The entry start_poll/next_poll last returned is consumed too.
  if (q.cur) ++q.cons;
  q.cur = nullptr;
  q.sh->cons.store(q.cons, std::memory_order_release);
  q.lock.unlock();
}

ibv_wc_opcode cq_read_opcode(ibv_cq_ex* cq) {
  return cq_of(cq).cur->opcode;
}
uint32_t cq_read_vendor_err(ibv_cq_ex* cq) {
  return cq_of(cq).cur->vendor_err;
}
uint32_t cq_read_byte_len(ibv_cq_ex* cq) {
  return cq_of(cq).cur->byte_len;
}
__be32 cq_read_imm_data(ibv_cq_ex* cq) {
  return cq_of(cq).cur->imm_data;
}
uint32_t cq_read_qp_num(ibv_cq_ex* cq) {
  return cq_of(cq).cur->qp_num;
}
uint32_t cq_read_src_qp(ibv_cq_ex* cq) {
  return cq_of(cq).cur->src_qp;
}
unsigned int cq_read_wc_flags(ibv_cq_ex* cq) {
  return cq_of(cq).cur->wc_flags;
}
uint32_t cq_read_slid(ibv_cq_ex* cq) {
  return cq_of(cq).cur->slid;
}
uint8_t cq_read_sl(ibv_cq_ex* cq) {
  return cq_of(cq).cur->sl;
}
uint8_t cq_read_dlid_path_bits(ibv_cq_ex* cq) {
  return cq_of(cq).cur->dlid_path_bits;
}

}  // namespace

void set_cq_ex_ops(Cq& c) {
  ibv_cq_ex& x = c.cqx;
  x.start_poll = cq_start_poll;
  x.next_poll = cq_next_poll;
  x.end_poll = cq_end_poll;
  x.read_opcode = cq_read_opcode;
  x.read_vendor_err = cq_read_vendor_err;
  x.read_byte_len = cq_read_byte_len;
  x.read_imm_data = cq_read_imm_data;
  x.read_qp_num = cq_read_qp_num;
  x.read_src_qp = cq_read_src_qp;
  x.read_wc_flags = cq_read_wc_flags;
  x.read_slid = cq_read_slid;
  x.read_sl = cq_read_sl;
  x.read_dlid_path_bits = cq_read_dlid_path_bits;
}

// --- ibv_qp_ex: ibv_wr_*
// -------------------------------------------------------------------
//
// WQEs are built in the ring past the published index; wr_complete checks
// the last one and publishes the batch, or nothing if any WQE was bad
// (its first error is returned). wr_start takes the send-queue lock,
// wr_complete / wr_abort release it, as rdma-core providers do.

namespace {

void wr_error(Qp& q, int err) {
  WrBatch& b = wr_batch(q);
  if (!b.err) b.err = err;
  b.cur = nullptr;
}

// Checks the WQE being built once all of it is known.
void wr_finish(Qp& q) {
  WrBatch& b = wr_batch(q);
  ShmSendWqe* w = b.cur;
  if (!w) return;
  b.cur = nullptr;
  const auto op = static_cast<ibv_wr_opcode>(w->opcode);
  const bool inl = w->send_flags & IBV_SEND_INLINE;
  uint64_t len = inl ? w->inline_len : 0;
  if (!inl)
    for (uint32_t i = 0; i < w->num_sge; ++i) len += w->sge[i].length;
  if (const int rc = check_length(q, op, len, inl, inl ? 1 : w->num_sge,
                                  inl ? w->inline_len : w->sge[0].length)) {
    wr_error(q, rc);
    return;
  }
  if (q.type == IBV_QPT_UD && !b.ud_set) wr_error(q, EINVAL);
}

ShmSendWqe* wr_begin(ibv_qp_ex* qx, ibv_wr_opcode op) {
  Qp& q = qp_of(qx);
  wr_finish(q);
  WrBatch& b = wr_batch(q);
  if (b.err) return nullptr;
  if (q.ctx().dead.load(std::memory_order_relaxed)) {
    wr_error(q, EIO);  // (a forked child has no ring to read)
    return nullptr;
  }
  const uint32_t prod = q.sq_prod + b.n;
  if (prod - q.sh->sq_done.load(std::memory_order_acquire) >= q.sq_size()) {
    wr_error(q, q.ctx().full_or_gone());
    return nullptr;
  }
  ShmSendWqe& w = q.sq()[prod & (q.sq_size() - 1)];
  ++b.n;
  w.wr_id = qx->wr_id;
  w.opcode = op;
  // Where the data comes from is decided by wr_set_sge* / wr_set_inline*.
  w.send_flags = qx->wr_flags & ~static_cast<uint32_t>(IBV_SEND_INLINE);
  w.num_sge = 0;
  w.inline_len = 0;
  w.imm_data = 0;
  w.remote_addr = 0;
  w.compare_add = 0;
  w.swap = 0;
  w.rkey = 0;
  w.ah = 0;
  w.remote_qpn = 0;
  w.remote_qkey = 0;
  w.bind_lkey = 0;
  w.sge[0] = {};
  b.cur = &w;
  b.ud_set = false;
  return &w;
}

void wr_start(ibv_qp_ex* qx) {
  Qp& q = qp_of(qx);
  q.sq_lock.lock();
  wr_batch(q) = WrBatch{};
}

int wr_complete(ibv_qp_ex* qx) {
  Qp& q = qp_of(qx);
  wr_finish(q);
  WrBatch& b = wr_batch(q);
  int rc = b.err;
  if (!rc && q.ctx().dead.load(std::memory_order_relaxed)) rc = EIO;
  if (!rc && b.n && !send_ok(q.sh->state.load(std::memory_order_acquire)))
    rc = EINVAL;
  if (!rc && b.n) publish_sq(q, q.sq_prod + b.n);
  b.n = 0;
  b.err = 0;
  q.sq_lock.unlock();
  return rc;
}

void wr_abort(ibv_qp_ex* qx) {
  Qp& q = qp_of(qx);
  WrBatch& b = wr_batch(q);
  b.n = 0;
  b.err = 0;
  b.cur = nullptr;
  q.sq_lock.unlock();
}

void wr_send(ibv_qp_ex* qx) {
  wr_begin(qx, IBV_WR_SEND);
}

void wr_send_imm(ibv_qp_ex* qx, __be32 imm) {
  if (ShmSendWqe* w = wr_begin(qx, IBV_WR_SEND_WITH_IMM)) w->imm_data = imm;
}

void wr_send_inv(ibv_qp_ex* qx, uint32_t invalidate_rkey) {
  if (ShmSendWqe* w = wr_begin(qx, IBV_WR_SEND_WITH_INV))
    w->imm_data = invalidate_rkey;
}

void wr_local_inv(ibv_qp_ex* qx, uint32_t invalidate_rkey) {
  if (ShmSendWqe* w = wr_begin(qx, IBV_WR_LOCAL_INV))
    w->imm_data = invalidate_rkey;
}

void wr_bind_mw(ibv_qp_ex* qx, ibv_mw* mw, uint32_t rkey,
                const ibv_mw_bind_info* bi) {
  Qp& q = qp_of(qx);
  if (ShmSendWqe* w = wr_begin(qx, IBV_WR_BIND_MW))
    if (!bi || set_bind(q, *w, mw, rkey, *bi)) wr_error(q, EINVAL);
}

void wr_rdma(ibv_qp_ex* qx, ibv_wr_opcode op, uint32_t rkey, uint64_t raddr,
             __be32 imm) {
  if (ShmSendWqe* w = wr_begin(qx, op)) {
    w->rkey = rkey;
    w->remote_addr = raddr;
    w->imm_data = imm;
  }
}

void wr_rdma_write(ibv_qp_ex* qx, uint32_t rkey, uint64_t raddr) {
  wr_rdma(qx, IBV_WR_RDMA_WRITE, rkey, raddr, 0);
}
void wr_rdma_write_imm(ibv_qp_ex* qx, uint32_t rkey, uint64_t raddr,
                       __be32 imm) {
  wr_rdma(qx, IBV_WR_RDMA_WRITE_WITH_IMM, rkey, raddr, imm);
}
void wr_rdma_read(ibv_qp_ex* qx, uint32_t rkey, uint64_t raddr) {
  wr_rdma(qx, IBV_WR_RDMA_READ, rkey, raddr, 0);
}

void wr_atomic_cmp_swp(ibv_qp_ex* qx, uint32_t rkey, uint64_t raddr,
                       uint64_t compare, uint64_t swap) {
  if (ShmSendWqe* w = wr_begin(qx, IBV_WR_ATOMIC_CMP_AND_SWP)) {
    w->rkey = rkey;
    w->remote_addr = raddr;
    w->compare_add = compare;
    w->swap = swap;
  }
}

void wr_atomic_fetch_add(ibv_qp_ex* qx, uint32_t rkey, uint64_t raddr,
                         uint64_t add) {
  if (ShmSendWqe* w = wr_begin(qx, IBV_WR_ATOMIC_FETCH_AND_ADD)) {
    w->rkey = rkey;
    w->remote_addr = raddr;
    w->compare_add = add;
  }
}

// ATOMIC WRITE: the 8 bytes at `atomic_wr` are copied now (the caller may
// reuse them at once), in compare_add, and written as they lie in memory.
void wr_atomic_write(ibv_qp_ex* qx, uint32_t rkey, uint64_t raddr,
                     const void* atomic_wr) {
  if (ShmSendWqe* w = wr_begin(qx, IBV_WR_ATOMIC_WRITE)) {
    w->rkey = rkey;
    w->remote_addr = raddr;
    std::memcpy(&w->compare_add, atomic_wr, 8);
  }
}

// The WQE the setters apply to; a setter without an operation is an error.
ShmSendWqe* wr_target(Qp& q) {
  WrBatch& b = wr_batch(q);
  if (!b.cur && !b.err) b.err = EINVAL;
  return b.cur;
}

void wr_set_sge(ibv_qp_ex* qx, uint32_t lkey, uint64_t addr, uint32_t len) {
  Qp& q = qp_of(qx);
  ShmSendWqe* w = wr_target(q);
  if (!w) return;
  if (q.max_send_sge < 1) return wr_error(q, EINVAL);
  w->send_flags &= ~static_cast<uint32_t>(IBV_SEND_INLINE);
  w->num_sge = 1;
  w->inline_len = 0;
  w->sge[0] = {addr, len, lkey};
}

void wr_set_sge_list(ibv_qp_ex* qx, size_t n, const ibv_sge* list) {
  Qp& q = qp_of(qx);
  ShmSendWqe* w = wr_target(q);
  if (!w) return;
  if (n > q.max_send_sge) return wr_error(q, EINVAL);
  w->send_flags &= ~static_cast<uint32_t>(IBV_SEND_INLINE);
  w->num_sge = static_cast<uint32_t>(n);
  w->inline_len = 0;
  for (size_t i = 0; i < n; ++i)
    w->sge[i] = {list[i].addr, list[i].length, list[i].lkey};
  if (n == 0) w->sge[0] = {};
}

void wr_set_inline_data_list(ibv_qp_ex* qx, size_t n,
                             const ibv_data_buf* bufs) {
  Qp& q = qp_of(qx);
  ShmSendWqe* w = wr_target(q);
  if (!w) return;
  size_t total = 0;
  for (size_t i = 0; i < n; ++i) total += bufs[i].length;
  if (total > q.max_inline || total > kMaxInline) return wr_error(q, EINVAL);
  size_t off = 0;
  for (size_t i = 0; i < n; ++i) {
    if (bufs[i].length)  // as in post_send: an empty one may have no address
      std::memcpy(w->inline_data + off, bufs[i].addr, bufs[i].length);
    off += bufs[i].length;
  }
  w->send_flags |= IBV_SEND_INLINE;
  w->num_sge = 0;
  w->inline_len = static_cast<uint32_t>(total);
}

void wr_set_inline_data(ibv_qp_ex* qx, void* addr, size_t len) {
  const ibv_data_buf b{addr, len};
  wr_set_inline_data_list(qx, 1, &b);
}

void wr_set_ud_addr(ibv_qp_ex* qx, ibv_ah* ah, uint32_t remote_qpn,
                    uint32_t remote_qkey) {
  Qp& q = qp_of(qx);
  ShmSendWqe* w = wr_target(q);
  if (!w) return;
  if (q.type != IBV_QPT_UD || !ah_ok(q, ah)) return wr_error(q, EINVAL);
  w->ah = ah->handle;
  w->remote_qpn = remote_qpn;
  w->remote_qkey = remote_qkey;
  wr_batch(q).ud_set = true;
}

}  // namespace

void set_qp_ex_ops(Qp& q, uint64_t ops) {
  ibv_qp_ex& x = *q.ibv_ex();
  x.wr_start = wr_start;
  x.wr_complete = wr_complete;
  x.wr_abort = wr_abort;
  x.wr_set_sge = wr_set_sge;
  x.wr_set_sge_list = wr_set_sge_list;
  x.wr_set_inline_data = wr_set_inline_data;
  x.wr_set_inline_data_list = wr_set_inline_data_list;
  x.wr_set_ud_addr = wr_set_ud_addr;
  if (ops & IBV_QP_EX_WITH_SEND) x.wr_send = wr_send;
  if (ops & IBV_QP_EX_WITH_SEND_WITH_IMM) x.wr_send_imm = wr_send_imm;
  if (ops & IBV_QP_EX_WITH_SEND_WITH_INV) x.wr_send_inv = wr_send_inv;
  if (ops & IBV_QP_EX_WITH_LOCAL_INV) x.wr_local_inv = wr_local_inv;
  if (ops & IBV_QP_EX_WITH_BIND_MW) x.wr_bind_mw = wr_bind_mw;
  if (ops & IBV_QP_EX_WITH_RDMA_WRITE) x.wr_rdma_write = wr_rdma_write;
  if (ops & IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM)
    x.wr_rdma_write_imm = wr_rdma_write_imm;
  if (ops & IBV_QP_EX_WITH_RDMA_READ) x.wr_rdma_read = wr_rdma_read;
  if (ops & IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP)
    x.wr_atomic_cmp_swp = wr_atomic_cmp_swp;
  if (ops & IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD)
    x.wr_atomic_fetch_add = wr_atomic_fetch_add;
  if (ops & IBV_QP_EX_WITH_ATOMIC_WRITE) x.wr_atomic_write = wr_atomic_write;
}

}  // namespace urnic::shim
