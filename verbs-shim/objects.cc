// Verbs objects of urnic contexts: PD, MR, CQ, SRQ, QP and AH, each a
// control request to the service (abi.h); the rings it returns are mapped
// here for the data path. Calls on other providers' objects are forwarded.
#include <arpa/inet.h>
#include <endian.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <sys/mman.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <new>

#include "dataplane/hostif/verbs.h"
#include "verbs-shim/mr_share.h"
#include "verbs-shim/shim.h"

using namespace urnic::shim;

namespace {

// As rdma-core's destroy verbs: waits on the object's mutex and condvar
// until `acked()` (ibv_ack_async_event / ibv_ack_cq_events signal them).
template <typename Acked>
void wait_for_acks(pthread_mutex_t* mu, pthread_cond_t* cv, Acked acked) {
  pthread_mutex_lock(mu);
  while (!acked()) pthread_cond_wait(cv, mu);
  pthread_mutex_unlock(mu);
}

// Fails a call on a context whose service is gone. Destroy calls succeed
// instead (the service released everything): the application can clean up.
bool destroy_locally(const Context& c) {
  return c.dead.load();
}

}  // namespace

// --- PD
// ----------------------------------------------------------------------------

ibv_pd* ours::ibv_alloc_pd(ibv_context* context) {
  Context& c = ctx_of(context);
  HandleRep rep;
  if (c.call(Op::kAllocPd, "ibv_alloc_pd", nullptr, 0, nullptr, 0, &rep,
             sizeof rep))
    return nullptr;
  auto* pd = new (std::nothrow) ibv_pd{};
  if (!pd) {
    HandleReq h{rep.handle};
    c.call(Op::kDeallocPd, "ibv_dealloc_pd", &h, sizeof h, nullptr, 0, nullptr,
           0);
    return fail<ibv_pd>(ENOMEM);
  }
  pd->context = context;
  pd->handle = rep.handle;
  return pd;
}

int ours::ibv_dealloc_pd(ibv_pd* pd) {
  Context& c = ctx_of(pd->context);
  HandleReq h{pd->handle};
  const int rc = c.call(Op::kDeallocPd, "ibv_dealloc_pd", &h, sizeof h, nullptr,
                        0, nullptr, 0);
  if (rc && !destroy_locally(c)) return rc;
  delete pd;
  return 0;
}

// --- MR
// -----------------------------------------------------------------------------

namespace {

constexpr unsigned kWriteAccess =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;

// What the application holds, and what ibv_rereg_mr keeps when it changes
// only some of the attributes (ibv_mr has no access field).
struct Mr {
  ibv_mr mr{};  // first: the application holds &mr
  unsigned access = 0;
  uint64_t iova = 0;
};
static_assert(std::is_standard_layout_v<Mr>);
Mr& mr_of(ibv_mr* m) {
  return *reinterpret_cast<Mr*>(m);
}

// The service forgets registration `handle` (the pages stay shared,
// mr_share.h); 0 or its errno (EBUSY while memory windows are bound).
int drop_registration(Context& c, uint32_t handle, const char* what) {
  HandleReq h{handle};
  return c.call(Op::kDeregMr, what, &h, sizeof h, nullptr, 0, nullptr, 0);
}

ibv_mr* reg_mr(ibv_pd* pd, void* addr, size_t length, uint64_t iova,
               unsigned access) {
  Context& c = ctx_of(pd->context);
  if (c.dead) return fail<ibv_mr>(EIO);
  // Optional flags (relaxed ordering, ...) may be ignored by definition.
  access &= ~static_cast<unsigned>(IBV_ACCESS_OPTIONAL_RANGE);
  // Refused before any page is shared (turned into memfd memory): a
  // registration the service would refuse must leave the process's memory
  // as it was, as the kernel checks before it pins anything.
  if (const int e = urnic::hostif::mr_access_error(access)) {
    // A feature urnic lacks is said (perftest --odp only printed "failed
    // to create mr"); a malformed flag set is the program's own mistake.
    if (e == EOPNOTSUPP && !quiet())
      say("ibv_reg_mr: access 0x%x asks for %s, which urnic does not have",
          access,
          (access & IBV_ACCESS_ON_DEMAND) ? "on-demand paging (ODP)"
                                          : "FLUSH placement rights");
    return fail<ibv_mr>(e);
  }
  if (!urnic::hostif::mr_iova_valid(reinterpret_cast<uint64_t>(addr), iova) ||
      length > c.info.device.max_mr_size)
    return fail<ibv_mr>(EINVAL);
  MrShare::Result shared;
  std::string why;
  int rc = MrShare::instance().share(addr, length, access & kWriteAccess,
                                     kMaxMrPieces, &shared, &why);
  if (rc) {
    say("ibv_reg_mr(%p, %zu): %s; the range cannot be shared with the "
        "service",
        addr, length, why.c_str());
    return fail<ibv_mr>(rc);
  }
  auto* req = new (std::nothrow) RegMrReq{};  // ~1 KiB: not on the stack
  auto* box = new (std::nothrow) Mr;
  if (!req || !box) {
    delete req;
    delete box;
    return fail<ibv_mr>(ENOMEM);
  }
  req->pd = pd->handle;
  req->access = access;
  req->addr = reinterpret_cast<uint64_t>(addr);
  req->length = length;
  req->iova = iova;
  req->map_start = shared.map_start;
  req->map_len = shared.map_len;
  req->npieces = static_cast<uint32_t>(shared.pieces.size());
  int fds[kMaxMrPieces];
  int nfds = 0;
  for (size_t i = 0; i < shared.pieces.size(); ++i) {
    const MrShare::Piece& p = shared.pieces[i];
    req->pieces[i] = {p.fd_offset, p.length, p.vma_start, p.vma_end};
    if (p.fd >= 0) fds[nfds++] = p.fd;  // none for the program's own mapping
  }
  RegMrRep rep;
  rc = c.call(Op::kRegMr, "ibv_reg_mr", req, sizeof *req, fds, nfds, &rep,
              sizeof rep);
  delete req;
  if (rc) {
    delete box;
    return fail<ibv_mr>(rc);
  }
  box->access = access;
  box->iova = iova;
  ibv_mr* mr = &box->mr;
  mr->context = pd->context;
  mr->pd = pd;
  mr->addr = addr;
  mr->length = length;
  mr->handle = rep.handle;
  mr->lkey = rep.lkey;
  mr->rkey = rep.rkey;
  return mr;
}

}  // namespace

ibv_mr* ours::ibv_reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  return reg_mr(pd, addr, length, reinterpret_cast<uint64_t>(addr),
                static_cast<unsigned>(access));
}

ibv_mr* ours::ibv_reg_mr_iova(ibv_pd* pd, void* addr, size_t length,
                              uint64_t iova, int access) {
  return reg_mr(pd, addr, length, iova, static_cast<unsigned>(access));
}

ibv_mr* ours::ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length,
                               uint64_t iova, unsigned int access) {
  return reg_mr(pd, addr, length, iova, access);
}

int ours::ibv_rereg_mr(ibv_mr* mr, int flags, ibv_pd* pd, void* addr,
                       size_t length, int access) {
  // Checks as rdma-core's ibv_rereg_mr makes them; the MR stays as it was.
  auto input_error = [] {
    errno = EINVAL;
    return IBV_REREG_MR_ERR_INPUT;
  };
  if (flags & ~IBV_REREG_MR_FLAGS_SUPPORTED) return input_error();
  const bool translation = flags & IBV_REREG_MR_CHANGE_TRANSLATION;
  if (translation && (!addr || !length)) return input_error();
  if (access && !(flags & IBV_REREG_MR_CHANGE_ACCESS)) return input_error();
  // (A PD of another context, as the kernel refuses it.)
  if ((flags & IBV_REREG_MR_CHANGE_PD) && (!pd || pd->context != mr->context))
    return input_error();
  if (flags == 0) return 0;  // nothing to change
  Mr& old = mr_of(mr);
  ibv_pd* const new_pd = (flags & IBV_REREG_MR_CHANGE_PD) ? pd : mr->pd;
  void* const new_addr = translation ? addr : mr->addr;
  const size_t new_len = translation ? length : mr->length;
  const uint64_t new_iova =
      translation ? reinterpret_cast<uint64_t>(addr) : old.iova;
  const unsigned new_access = (flags & IBV_REREG_MR_CHANGE_ACCESS)
                                  ? static_cast<unsigned>(access)
                                  : old.access;
  // A new registration first, then the old one goes: if the new one is
  // refused the MR is still the old, valid one (what ERR_INPUT promises),
  // at the price of both existing for a moment (client_limits count both).
  ibv_mr* fresh = reg_mr(new_pd, new_addr, new_len, new_iova, new_access);
  if (!fresh) return IBV_REREG_MR_ERR_INPUT;  // errno from reg_mr
  // Then the new one takes the old one's place and keys (kReregMr), so a
  // peer's rkey stays valid, as on rxe and mlx5.
  Context& c = ctx_of(mr->context);
  Mr& box = mr_of(fresh);
  ReregMrReq req{mr->handle, fresh->handle};
  RegMrRep rep;
  if (const int rc = c.call(Op::kReregMr, "ibv_rereg_mr", &req, sizeof req,
                            nullptr, 0, &rep, sizeof rep)) {
    // The old registration stays (windows are bound to it, it is in use,
    // or the service is gone): the new one goes again and the MR is what
    // it was.
    drop_registration(c, fresh->handle, "ibv_rereg_mr");
    delete &box;
    errno = rc;
    return c.dead ? IBV_REREG_MR_ERR_CMD : IBV_REREG_MR_ERR_INPUT;
  }
  old.access = box.access;
  old.iova = box.iova;
  mr->pd = new_pd;
  mr->addr = new_addr;
  mr->length = new_len;
  mr->lkey = rep.lkey;
  mr->rkey = rep.rkey;
  delete &box;
  return 0;
}

int ours::ibv_dereg_mr(ibv_mr* mr) {
  Context& c = ctx_of(mr->context);
  const int rc = drop_registration(c, mr->handle, "ibv_dereg_mr");
  if (rc && !destroy_locally(c)) return rc;
  delete &mr_of(mr);
  return 0;
}

// --- MW (verbs.h reaches these through context->ops)
// -----------------------------------------------------------------------------

ibv_mw* urnic::shim::alloc_mw(ibv_pd* pd, ibv_mw_type type) {
  Context& c = ctx_of(pd->context);
  AllocMwReq req{pd->handle, static_cast<uint32_t>(type)};
  AllocMwRep rep;
  if (c.call(Op::kAllocMw, "ibv_alloc_mw", &req, sizeof req, nullptr, 0, &rep,
             sizeof rep))
    return nullptr;
  auto* mw = new (std::nothrow) ibv_mw{};
  if (!mw) {
    HandleReq h{rep.handle};
    c.call(Op::kDeallocMw, "ibv_alloc_mw", &h, sizeof h, nullptr, 0, nullptr,
           0);
    return fail<ibv_mw>(ENOMEM);
  }
  mw->context = pd->context;
  mw->pd = pd;
  mw->rkey = rep.rkey;
  mw->handle = rep.handle;
  mw->type = type;
  return mw;
}

int urnic::shim::dealloc_mw(ibv_mw* mw) {
  Context& c = ctx_of(mw->context);
  HandleReq h{mw->handle};
  const int rc = c.call(Op::kDeallocMw, "ibv_dealloc_mw", &h, sizeof h, nullptr,
                        0, nullptr, 0);
  if (rc && !destroy_locally(c)) return rc;
  delete mw;
  return 0;
}

// --- CQ
// -----------------------------------------------------------------------------

namespace {

// Maps the CQ memory the service passed (fd, rep) and points `q` at it; the
// mapping `q` had is the caller's. False, errno set, if it is unusable.
bool attach_cq(Cq& q, int fd, const CreateCqRep& rep, const char* what) {
  void* map = map_service_fd(fd, rep.map_len);
  if (!map) return false;
  auto* sh = static_cast<CqShared*>(map);
  if (!std::has_single_bit(sh->size) || sh->size < rep.cqe ||
      sh->offset + uint64_t{sh->size} * sizeof(ibv_wc) > rep.map_len) {
    munmap(map, rep.map_len);
    say("%s: the CQ memory urnicd returned is malformed", what);
    errno = EPROTO;
    return false;
  }
  q.sh = sh;
  q.ring = reinterpret_cast<ibv_wc*>(static_cast<char*>(map) + sh->offset);
  q.mask = sh->size - 1;
  q.cons = sh->cons.load(std::memory_order_acquire);
  q.cur = nullptr;
  q.map = map;
  q.map_len = rep.map_len;
  q.cqx.cqe = static_cast<int>(rep.cqe);
  return true;
}

Cq* make_cq(Context& c, int cqe, void* cq_context, ibv_comp_channel* channel,
            int comp_vector, const char* what) {
  if (cqe <= 0 || comp_vector < 0 || comp_vector >= c.ibv()->num_comp_vectors)
    return fail<Cq>(EINVAL);
  if (channel && channel->context != c.ibv()) return fail<Cq>(EINVAL);
  auto* ch = reinterpret_cast<Channel*>(channel);
  CreateCqReq req;
  req.cqe = static_cast<uint32_t>(cqe);
  req.channel = ch ? ch->handle : kNoHandle;
  CreateCqRep rep;
  int fd;
  if (c.call(Op::kCreateCq, what, &req, sizeof req, nullptr, 0, &rep,
             sizeof rep, &fd, 1))
    return nullptr;
  auto undo = [&c, &rep](int err) {
    HandleReq h{rep.handle};
    c.call(Op::kDestroyCq, "ibv_destroy_cq", &h, sizeof h, nullptr, 0, nullptr,
           0);
    return fail<Cq>(err);
  };
  auto* q = new (std::nothrow) Cq;
  if (!q) {
    close(fd);
    return undo(ENOMEM);
  }
  if (!attach_cq(*q, fd, rep, what)) {
    const int e = errno;
    delete q;
    return undo(e);
  }
  q->ctx = &c;
  q->channel = ch;
  ibv_cq_ex& x = q->cqx;
  x.context = c.ibv();
  x.channel = channel;
  x.cq_context = cq_context;
  x.handle = rep.handle;
  q->handle = rep.handle;
  pthread_mutex_init(&x.mutex, nullptr);
  pthread_cond_init(&x.cond, nullptr);
  set_cq_ex_ops(*q);
  {
    std::lock_guard g(c.obj_mu);
    if (const int err = c.cqs.insert(q)) {
      pthread_mutex_destroy(&x.mutex);
      pthread_cond_destroy(&x.cond);
      munmap(q->map, q->map_len);
      delete q;
      if (err != EEXIST) return undo(err);
      // Not ours to destroy: the object we have under that handle uses it.
      say("%s: urnicd returned handle %u, which is in use", what, rep.handle);
      return fail<Cq>(EPROTO);
    }
  }
  if (channel) {
    pthread_mutex_lock(&c.ibv()->mutex);
    ++channel->refcnt;
    pthread_mutex_unlock(&c.ibv()->mutex);
  }
  return q;
}

}  // namespace

ibv_cq_ex* urnic::shim::create_cq_ex(ibv_context* context,
                                     ibv_cq_init_attr_ex* attr) {
  if (attr->comp_mask & ~static_cast<uint32_t>(IBV_CQ_INIT_ATTR_MASK_FLAGS |
                                               IBV_CQ_INIT_ATTR_MASK_PD))
    return fail<ibv_cq_ex>(EOPNOTSUPP);
  if (attr->wc_flags & ~static_cast<uint64_t>(IBV_WC_STANDARD_FLAGS))
    return fail<ibv_cq_ex>(EOPNOTSUPP);
  if ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) &&
      (attr->flags &
       ~static_cast<uint32_t>(IBV_CREATE_CQ_ATTR_SINGLE_THREADED)))
    return fail<ibv_cq_ex>(EOPNOTSUPP);
  if (attr->cqe > INT32_MAX) return fail<ibv_cq_ex>(EINVAL);
  Cq* q = make_cq(ctx_of(context), static_cast<int>(attr->cqe),
                  attr->cq_context, attr->channel,
                  static_cast<int>(attr->comp_vector), "ibv_create_cq_ex");
  return q ? &q->cqx : nullptr;
}

ibv_cq* ours::ibv_create_cq(ibv_context* context, int cqe, void* cq_context,
                            ibv_comp_channel* channel, int comp_vector) {
  Cq* q = make_cq(ctx_of(context), cqe, cq_context, channel, comp_vector,
                  "ibv_create_cq");
  return q ? ibv_cq_ex_to_cq(&q->cqx) : nullptr;
}

int ours::ibv_resize_cq(ibv_cq* cq, int cqe) {
  if (cqe <= 0) return EINVAL;
  Cq& q = cq_of(cq);
  Context& c = *q.ctx;
  // Nobody polls while the service moves the ring: it copies the entries
  // from the consumer index we published up to its producer index.
  std::lock_guard g(q.lock);
  q.sh->cons.store(q.cons, std::memory_order_release);
  ResizeCqReq req{q.handle, static_cast<uint32_t>(cqe)};
  CreateCqRep rep;
  int fd;
  if (const int rc = c.call(Op::kResizeCq, "ibv_resize_cq", &req, sizeof req,
                            nullptr, 0, &rep, sizeof rep, &fd, 1))
    return rc;
  // (On failure the service has already moved the CQ: without its new
  // memory the CQ cannot be polled any more.)
  void* const old_map = q.map;
  const size_t old_len = q.map_len;
  if (!attach_cq(q, fd, rep, "ibv_resize_cq")) return errno;
  munmap(old_map, old_len);
  return 0;
}

int ours::ibv_destroy_cq(ibv_cq* cq) {
  Cq& q = cq_of(cq);
  Context& c = *q.ctx;
  HandleReq h{q.handle};
  const int rc = c.call(Op::kDestroyCq, "ibv_destroy_cq", &h, sizeof h, nullptr,
                        0, nullptr, 0);
  if (rc && !destroy_locally(c)) return rc;
  uint32_t reported;
  {
    std::lock_guard g(c.obj_mu);
    c.cqs.erase(q.handle);
    reported = q.async_reported;
  }
  purge_async_events(c);
  // Every completion event and async event handed out, acknowledged.
  wait_for_acks(&cq->mutex, &cq->cond, [&] {
    return cq->comp_events_completed == q.events &&
           cq->async_events_completed == reported;
  });
  if (cq->channel) {
    pthread_mutex_lock(&c.ibv()->mutex);
    --cq->channel->refcnt;
    pthread_mutex_unlock(&c.ibv()->mutex);
  }
  munmap(q.map, q.map_len);
  pthread_mutex_destroy(&cq->mutex);
  pthread_cond_destroy(&cq->cond);
  delete &q;
  return 0;
}

// --- SRQ
// ------------------------------------------------------------------------------

namespace {

ibv_srq* make_srq(ibv_pd* pd, ibv_srq_init_attr* init, const char* what) {
  Context& c = ctx_of(pd->context);
  CreateSrqReq req;
  req.pd = pd->handle;
  req.max_wr = init->attr.max_wr;
  req.max_sge = init->attr.max_sge;
  CreateSrqRep rep;
  int fd;
  if (c.call(Op::kCreateSrq, what, &req, sizeof req, nullptr, 0, &rep,
             sizeof rep, &fd, 1))
    return nullptr;
  auto undo = [&c, &rep](int err) {
    HandleReq h{rep.handle};
    c.call(Op::kDestroySrq, "ibv_destroy_srq", &h, sizeof h, nullptr, 0,
           nullptr, 0);
    return fail<ibv_srq>(err);
  };
  void* map = map_service_fd(fd, rep.map_len);
  if (!map) return undo(errno);
  auto* sh = static_cast<SrqShared*>(map);
  if (!std::has_single_bit(sh->size) ||
      sh->offset + uint64_t{sh->size} * sizeof(ShmRecvWqe) > rep.map_len ||
      rep.doorbell >= kMaxDoorbells) {
    munmap(map, rep.map_len);
    say("%s: the SRQ memory urnicd returned is malformed", what);
    return undo(EPROTO);
  }
  auto* s = new (std::nothrow) Srq;
  if (!s) {
    munmap(map, rep.map_len);
    return undo(ENOMEM);
  }
  s->ctx = &c;
  s->sh = sh;
  s->ring = reinterpret_cast<ShmRecvWqe*>(static_cast<char*>(map) + sh->offset);
  s->size = sh->size;
  s->prod = sh->prod.load(std::memory_order_relaxed);
  s->max_sge = rep.max_sge;
  s->doorbell = rep.doorbell;
  s->map = map;
  s->map_len = rep.map_len;
  ibv_srq& x = s->srq;
  x.context = pd->context;
  x.srq_context = init->srq_context;
  x.pd = pd;
  x.handle = rep.handle;
  s->handle = rep.handle;
  pthread_mutex_init(&x.mutex, nullptr);
  pthread_cond_init(&x.cond, nullptr);
  {
    std::lock_guard g(c.obj_mu);
    if (const int err = c.srqs.insert(s)) {
      pthread_mutex_destroy(&x.mutex);
      pthread_cond_destroy(&x.cond);
      munmap(s->map, s->map_len);
      delete s;
      if (err != EEXIST) return undo(err);
      // Not ours to destroy: the object we have under that handle uses it.
      say("%s: urnicd returned handle %u, which is in use", what, rep.handle);
      return fail<ibv_srq>(EPROTO);
    }
  }
  // What the queue really holds, as providers report it.
  init->attr.max_wr = rep.max_wr;
  init->attr.max_sge = rep.max_sge;
  return &s->srq;
}

}  // namespace

ibv_srq* ours::ibv_create_srq(ibv_pd* pd, ibv_srq_init_attr* srq_init_attr) {
  return make_srq(pd, srq_init_attr, "ibv_create_srq");
}

ibv_srq* urnic::shim::create_srq_ex(ibv_context* context,
                                    ibv_srq_init_attr_ex* attr) {
  // Basic SRQs only (no XRC, no tag matching).
  const uint32_t known =
      IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_CQ;
  if ((attr->comp_mask & ~known) || !(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) ||
      ((attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) &&
       attr->srq_type != IBV_SRQT_BASIC))
    return fail<ibv_srq>(EOPNOTSUPP);
  if (!attr->pd || attr->pd->context != context) return fail<ibv_srq>(EINVAL);
  ibv_srq_init_attr init{};
  init.srq_context = attr->srq_context;
  init.attr = attr->attr;
  ibv_srq* s = make_srq(attr->pd, &init, "ibv_create_srq_ex");
  if (s) attr->attr = init.attr;
  return s;
}

int ours::ibv_modify_srq(ibv_srq* srq, ibv_srq_attr* srq_attr,
                         int srq_attr_mask) {
  ModifySrqReq req;
  req.handle = srq_of(srq).handle;
  req.mask = srq_attr_mask;
  req.attr = *srq_attr;
  return ctx_of(srq->context)
      .call(Op::kModifySrq, "ibv_modify_srq", &req, sizeof req, nullptr, 0,
            nullptr, 0);
}

int ours::ibv_query_srq(ibv_srq* srq, ibv_srq_attr* srq_attr) {
  HandleReq h{srq_of(srq).handle};
  return ctx_of(srq->context)
      .call(Op::kQuerySrq, "ibv_query_srq", &h, sizeof h, nullptr, 0, srq_attr,
            sizeof *srq_attr);
}

int ours::ibv_destroy_srq(ibv_srq* srq) {
  Srq& s = srq_of(srq);
  Context& c = *s.ctx;
  HandleReq h{srq_of(srq).handle};
  const int rc = c.call(Op::kDestroySrq, "ibv_destroy_srq", &h, sizeof h,
                        nullptr, 0, nullptr, 0);
  if (rc && !destroy_locally(c)) return rc;
  uint32_t reported;
  {
    std::lock_guard g(c.obj_mu);
    c.srqs.erase(s.handle);
    reported = s.events_reported;
  }
  purge_async_events(c);
  wait_for_acks(&srq->mutex, &srq->cond,
                [&] { return srq->events_completed == reported; });
  munmap(s.map, s.map_len);
  pthread_mutex_destroy(&srq->mutex);
  pthread_cond_destroy(&srq->cond);
  delete &s;
  return 0;
}

// --- QP
// --------------------------------------------------------------------------------

namespace {

// The ibv_wr_* operations each QP type can carry (SEND_WITH_INV: RC only,
// as its opcodes; windows are bound and invalidated on RC and UC).
uint64_t supported_send_ops(ibv_qp_type t) {
  const uint64_t send = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
  const uint64_t write =
      IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
  switch (t) {
    case IBV_QPT_RC:
      return send | write | IBV_QP_EX_WITH_RDMA_READ |
             IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
             IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |
             IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_LOCAL_INV |
             IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_ATOMIC_WRITE;
    case IBV_QPT_UC:
      return send | write | IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW;
    case IBV_QPT_UD:
      return send;
    default:
      return 0;
  }
}

bool same_ctx(const ibv_cq* cq, const ibv_context* ctx) {
  return cq && cq->context == ctx;
}

// `attr` is an ibv_qp_init_attr_ex (ibv_qp_init_attr is its prefix).
ibv_qp* make_qp(ibv_pd* pd, ibv_qp_init_attr_ex* attr, bool ex,
                uint64_t send_ops, const char* what) {
  Context& c = ctx_of(pd->context);
  const ibv_context* ctx = pd->context;
  if (!same_ctx(attr->send_cq, ctx) || !same_ctx(attr->recv_cq, ctx) ||
      (attr->srq && attr->srq->context != ctx))
    return fail<ibv_qp>(EINVAL);
  if (attr->qp_type != IBV_QPT_RC && attr->qp_type != IBV_QPT_UC &&
      attr->qp_type != IBV_QPT_UD)
    return fail<ibv_qp>(EOPNOTSUPP);
  CreateQpReq req;
  req.pd = pd->handle;
  req.send_cq = attr->send_cq->handle;
  req.recv_cq = attr->recv_cq->handle;
  req.srq = attr->srq ? attr->srq->handle : kNoHandle;
  req.qp_type = attr->qp_type;
  req.sq_sig_all = attr->sq_sig_all ? 1 : 0;
  if (attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS)
    req.create_flags = attr->create_flags;
  req.cap = attr->cap;
  CreateQpRep rep;
  int fd;
  if (c.call(Op::kCreateQp, what, &req, sizeof req, nullptr, 0, &rep,
             sizeof rep, &fd, 1))
    return nullptr;
  auto undo = [&c, &rep](int err) {
    HandleReq h{rep.handle};
    c.call(Op::kDestroyQp, "ibv_destroy_qp", &h, sizeof h, nullptr, 0, nullptr,
           0);
    return fail<ibv_qp>(err);
  };
  void* map = map_service_fd(fd, rep.map_len);
  if (!map) return undo(errno);
  auto* sh = static_cast<QpShared*>(map);
  const bool rq_ok = attr->srq ? true
                               : std::has_single_bit(sh->rq_size) &&
                                     sh->rq_offset + uint64_t{sh->rq_size} *
                                                         sizeof(ShmRecvWqe) <=
                                         rep.map_len;
  if (!std::has_single_bit(sh->sq_size) || !rq_ok ||
      sh->sq_offset + uint64_t{sh->sq_size} * sizeof(ShmSendWqe) >
          rep.map_len ||
      rep.map_len > UINT32_MAX || rep.doorbell >= kMaxDoorbells) {
    munmap(map, rep.map_len);
    say("%s: the QP memory urnicd returned is malformed", what);
    return undo(EPROTO);
  }
  if (rep.cap.max_inline_data > kMaxInline || rep.cap.max_send_sge > kMaxSge ||
      rep.cap.max_recv_sge > kMaxSge) {
    munmap(map, rep.map_len);
    say("%s: urnicd granted more than its own limits", what);
    return undo(EPROTO);
  }
  Qp* q = new_qp(ex);
  if (!q) {
    munmap(map, rep.map_len);
    return undo(ENOMEM);
  }
  q->sh = sh;
  q->handle = rep.handle;
  q->sq_off = static_cast<uint32_t>(sh->sq_offset);
  q->rq_off = static_cast<uint32_t>(sh->rq_offset);
  q->sq_log = static_cast<uint8_t>(std::countr_zero(sh->sq_size));
  q->rq_log =
      attr->srq ? 0 : static_cast<uint8_t>(std::countr_zero(sh->rq_size));
  q->sq_prod = sh->sq_prod.load(std::memory_order_relaxed);
  q->rq_prod = sh->rq_prod.load(std::memory_order_relaxed);
  q->doorbell = static_cast<uint16_t>(rep.doorbell);
  q->max_inline = static_cast<uint16_t>(rep.cap.max_inline_data);
  q->max_send_sge = static_cast<uint8_t>(rep.cap.max_send_sge);
  q->max_recv_sge = static_cast<uint8_t>(rep.cap.max_recv_sge);
  q->type = attr->qp_type;
  q->has_srq = attr->srq != nullptr;  // q->ex: set by new_qp
  q->map_len = static_cast<uint32_t>(rep.map_len);
  ibv_qp& b = *q->ibv();
  b.context = pd->context;
  b.qp_context = attr->qp_context;
  b.pd = pd;
  b.send_cq = attr->send_cq;
  b.recv_cq = attr->recv_cq;
  b.srq = attr->srq;
  b.handle = rep.handle;
  b.qp_num = rep.qpn;
  b.state = IBV_QPS_RESET;
  b.qp_type = attr->qp_type;
  pthread_mutex_init(&b.mutex, nullptr);
  pthread_cond_init(&b.cond, nullptr);
  if (ex) set_qp_ex_ops(*q, send_ops);
  {
    std::lock_guard g(c.obj_mu);
    if (const int err = c.qps.insert(q)) {
      pthread_mutex_destroy(&b.mutex);
      pthread_cond_destroy(&b.cond);
      munmap(map, rep.map_len);
      delete_qp(q);
      if (err != EEXIST) return undo(err);
      // Not ours to destroy: the object we have under that handle uses it.
      say("%s: urnicd returned handle %u, which is in use", what, rep.handle);
      return fail<ibv_qp>(EPROTO);
    }
  }
  attr->cap = rep.cap;  // what the queues really hold
  return &b;
}

}  // namespace

ibv_qp* urnic::shim::create_qp_ex(ibv_context* context,
                                  ibv_qp_init_attr_ex* attr) {
  const uint32_t known = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS |
                         IBV_QP_INIT_ATTR_CREATE_FLAGS |
                         IBV_QP_INIT_ATTR_MAX_TSO_HEADER;
  if (attr->comp_mask & ~known) return fail<ibv_qp>(EOPNOTSUPP);
  // The create flags go to the service, which takes
  // IBV_QP_CREATE_BLOCK_SELF_MCAST_LB only and says why it refuses others.
  if ((attr->comp_mask & IBV_QP_INIT_ATTR_MAX_TSO_HEADER) &&
      attr->max_tso_header)
    return fail<ibv_qp>(EOPNOTSUPP);
  if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd ||
      attr->pd->context != context)
    return fail<ibv_qp>(EINVAL);
  const bool ex = attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  const uint64_t ops = ex ? attr->send_ops_flags : 0;
  if (ops & ~supported_send_ops(attr->qp_type)) return fail<ibv_qp>(EOPNOTSUPP);
  return make_qp(attr->pd, attr, ex, ops, "ibv_create_qp_ex");
}

ibv_qp* ours::ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
  ibv_qp_init_attr_ex a{};
  std::memcpy(&a, qp_init_attr, sizeof *qp_init_attr);
  ibv_qp* qp = make_qp(pd, &a, false, 0, "ibv_create_qp");
  if (qp) qp_init_attr->cap = a.cap;
  return qp;
}

ibv_qp_ex* ours::ibv_qp_to_qp_ex(ibv_qp* qp) {
  Qp& q = qp_of(qp);
  return q.ex ? q.ibv_ex() : nullptr;
}

int ours::ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) {
  Qp& q = qp_of(qp);
  ModifyQpReq req;
  req.handle = qp_of(qp).handle;
  req.mask = attr_mask;
  req.attr = *attr;
  ModifyQpRep rep;
  const int rc = q.ctx().call(Op::kModifyQp, "ibv_modify_qp", &req, sizeof req,
                              nullptr, 0, &rep, sizeof rep);
  if (rc) return rc;
  qp->state = static_cast<ibv_qp_state>(rep.state);
  if ((attr_mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_RESET) {
    // Its completions not yet polled go with it (flushed WRs of an ERR
    // state, say): a QP brought back to RTS starts clean, as on mlx5.
    cq_clean(qp->send_cq, qp->qp_num);
    if (qp->recv_cq != qp->send_cq) cq_clean(qp->recv_cq, qp->qp_num);
  }
  if ((attr_mask & IBV_QP_PATH_MTU) && attr->path_mtu >= IBV_MTU_256 &&
      attr->path_mtu <= IBV_MTU_4096)
    q.path_mtu.store(128u << attr->path_mtu, std::memory_order_relaxed);
  return 0;
}

int ours::ibv_query_qp(ibv_qp* qp, ibv_qp_attr* attr, int /*attr_mask*/,
                       ibv_qp_init_attr* init_attr) {
  HandleReq h{qp_of(qp).handle};
  QueryQpRep rep;
  const int rc = qp_of(qp).ctx().call(Op::kQueryQp, "ibv_query_qp", &h,
                                      sizeof h, nullptr, 0, &rep, sizeof rep);
  if (rc) return rc;
  *attr = rep.attr;
  attr->cap = rep.cap;
  if (init_attr) {
    *init_attr = {};
    init_attr->qp_context = qp->qp_context;
    init_attr->send_cq = qp->send_cq;
    init_attr->recv_cq = qp->recv_cq;
    init_attr->srq = qp->srq;
    init_attr->cap = rep.cap;
    init_attr->qp_type = qp->qp_type;
    init_attr->sq_sig_all = static_cast<int>(rep.sq_sig_all);
  }
  qp->state = attr->qp_state;
  return 0;
}

int ours::ibv_destroy_qp(ibv_qp* qp) {
  Qp& q = qp_of(qp);
  Context& c = q.ctx();
  HandleReq h{qp_of(qp).handle};
  const int rc = c.call(Op::kDestroyQp, "ibv_destroy_qp", &h, sizeof h, nullptr,
                        0, nullptr, 0);
  if (rc && !destroy_locally(c)) return rc;
  cq_clean(qp->send_cq, qp->qp_num);
  if (qp->recv_cq != qp->send_cq) cq_clean(qp->recv_cq, qp->qp_num);
  uint32_t reported;
  {
    std::lock_guard g(c.obj_mu);
    c.qps.erase(q.handle);
    reported = q.events_reported;  // no more from here on
  }
  purge_async_events(c);
  wait_for_acks(&qp->mutex, &qp->cond,
                [&] { return qp->events_completed == reported; });
  munmap(q.sh, q.map_len);
  pthread_mutex_destroy(&qp->mutex);
  pthread_cond_destroy(&qp->cond);
  delete_qp(&q);
  return 0;
}

// --- multicast ---------------------------------------------------------------

namespace {
int mcast(Op op, const char* verb, ibv_qp* qp, const ibv_gid* gid) {
  if (!gid) return EINVAL;
  Qp& q = qp_of(qp);
  McastReq req;
  req.qp = q.handle;
  std::memcpy(req.gid, gid->raw, 16);  // the LID: RoCE has none
  return q.ctx().call(op, verb, &req, sizeof req, nullptr, 0, nullptr, 0);
}
}  // namespace

int ours::ibv_attach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t) {
  return mcast(Op::kAttachMcast, "ibv_attach_mcast", qp, gid);
}

int ours::ibv_detach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t) {
  return mcast(Op::kDetachMcast, "ibv_detach_mcast", qp, gid);
}

// --- AH
// ------------------------------------------------------------------------------------

ibv_ah* ours::ibv_create_ah(ibv_pd* pd, ibv_ah_attr* attr) {
  Context& c = ctx_of(pd->context);
  CreateAhReq req;
  req.pd = pd->handle;
  req.attr = *attr;
  HandleRep rep;
  if (c.call(Op::kCreateAh, "ibv_create_ah", &req, sizeof req, nullptr, 0, &rep,
             sizeof rep))
    return nullptr;
  auto* ah = new (std::nothrow) ibv_ah{};
  if (!ah) {
    HandleReq h{rep.handle};
    c.call(Op::kDestroyAh, "ibv_destroy_ah", &h, sizeof h, nullptr, 0, nullptr,
           0);
    return fail<ibv_ah>(ENOMEM);
  }
  ah->context = pd->context;
  ah->pd = pd;
  ah->handle = rep.handle;
  return ah;
}

int ours::ibv_destroy_ah(ibv_ah* ah) {
  Context& c = ctx_of(ah->context);
  HandleReq h{ah->handle};
  const int rc = c.call(Op::kDestroyAh, "ibv_destroy_ah", &h, sizeof h, nullptr,
                        0, nullptr, 0);
  if (rc && !destroy_locally(c)) return rc;
  delete ah;
  return 0;
}

namespace {

// The GID table index of `gid`, or -1.
int gid_index(const Context& c, const uint8_t gid[16]) {
  const uint32_t n = std::min(c.info.num_gids, kMaxGids);
  for (uint32_t i = 0; i < n; ++i)
    if (std::memcmp(c.info.gids[i], gid, 16) == 0) return static_cast<int>(i);
  return -1;
}

uint16_t ip_checksum(const uint8_t* h, size_t len) {
  uint32_t sum = 0;
  for (size_t i = 0; i + 1 < len; i += 2) sum += (h[i] << 8) | h[i + 1];
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return static_cast<uint16_t>(~sum);
}

// The received GRH: RoCEv2 over IPv4 puts the 20-byte IPv4 header in its
// last 20 bytes; otherwise it holds the IPv6 header. Decided like
// rdma-core: not IPv6 -> IPv4 if it says so; IPv6 unless a valid IPv4
// header (length 5, good checksum) sits at byte 20.
int grh_version(const ibv_grh* grh) {
  const auto* b = reinterpret_cast<const uint8_t*>(grh);
  const uint8_t* ip4 = b + 20;
  if ((b[0] >> 4) != 6) return (ip4[0] >> 4) == 4 ? 4 : -1;
  if ((ip4[0] & 0xf) != 5) return 6;
  uint8_t h[20];
  std::memcpy(h, ip4, sizeof h);
  h[10] = h[11] = 0;
  const uint16_t sum = ip_checksum(h, sizeof h);
  return ((ip4[10] << 8) | ip4[11]) == sum ? 4 : 6;
}

int init_ah_from_wc(Context& c, uint8_t port_num, const ibv_wc* wc,
                    const ibv_grh* grh, ibv_ah_attr* ah) {
  std::memset(ah, 0, sizeof *ah);
  ah->grh.flow_label = be32toh(grh->version_tclass_flow) & 0xfffff;
  ah->dlid = wc->slid;
  ah->sl = wc->sl;
  ah->src_path_bits = wc->dlid_path_bits;
  ah->port_num = port_num;
  if (!(wc->wc_flags & IBV_WC_GRH)) return 0;
  ah->is_global = 1;
  const int v = grh_version(grh);
  uint8_t ours[16];
  if (v == 4) {
    const auto* ip4 = reinterpret_cast<const uint8_t*>(grh) + 20;
    const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if ((ip4[16] & 0xf0) == 0xe0) {  // multicast destination
      errno = EINVAL;
      return -1;
    }
    std::memcpy(ours, mapped, 12);
    std::memcpy(ours + 12, ip4 + 16, 4);  // destination: us
    std::memcpy(ah->grh.dgid.raw, mapped, 12);
    std::memcpy(ah->grh.dgid.raw + 12, ip4 + 12, 4);  // source: the peer
    ah->grh.hop_limit = ip4[8];
    ah->grh.traffic_class = ip4[1];
  } else if (v == 6) {
    if (grh->dgid.raw[0] == 0xff || grh->next_hdr != IPPROTO_UDP) {
      errno = grh->dgid.raw[0] == 0xff ? EINVAL : EPROTONOSUPPORT;
      return -1;
    }
    std::memcpy(ours, grh->dgid.raw, 16);
    ah->grh.dgid = grh->sgid;
    ah->grh.hop_limit = grh->hop_limit;
    ah->grh.traffic_class =
        static_cast<uint8_t>((be32toh(grh->version_tclass_flow) >> 20) & 0xff);
  } else {
    errno = EPROTONOSUPPORT;
    return -1;
  }
  const int idx = gid_index(c, ours);
  if (idx < 0) {
    errno = ENOENT;  // addressed to a GID this device does not have
    return -1;
  }
  ah->grh.sgid_index = static_cast<uint8_t>(idx);
  return 0;
}

}  // namespace

int ours::ibv_init_ah_from_wc(ibv_context* context, uint8_t port_num,
                              ibv_wc* wc, ibv_grh* grh, ibv_ah_attr* ah_attr) {
  return init_ah_from_wc(ctx_of(context), port_num, wc, grh, ah_attr);
}

ibv_ah* ours::ibv_create_ah_from_wc(ibv_pd* pd, ibv_wc* wc, ibv_grh* grh,
                                    uint8_t port_num) {
  ibv_ah_attr attr;
  if (init_ah_from_wc(ctx_of(pd->context), port_num, wc, grh, &attr))
    return nullptr;
  return ours::ibv_create_ah(pd, &attr);
}

// --- import (kernel object sharing: not for urnic)
// ----------------------------
