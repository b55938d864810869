// Events and process life: completion channels (one socket each; the
// service writes a CQ handle per event), asynchronous events (the
// context's socket), ibv_fork_init and what a forked child inherits.
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#include "verbs-shim/mr_share.h"
#include "verbs-shim/shim.h"

namespace urnic::shim {

void fork_prepare_contexts();
void fork_parent_contexts();
void fork_child_contexts();

namespace {

// The child keeps no way to speak for its parent: its urnic contexts are
// dead (calls fail with EIO) and their control sockets closed. (Rings and
// doorbells are MADV_DONTFORK: the child does not even map them.)
void atfork_prepare() {
  fork_prepare_contexts();
  MrShare::instance().lock();
}
void atfork_parent() {
  MrShare::instance().unlock();
  fork_parent_contexts();
}
void atfork_child() {
  MrShare::instance().privatize_in_child();
  MrShare::instance().unlock();
  fork_child_contexts();
}

}  // namespace

void install_fork_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
  });
}

}  // namespace urnic::shim

using namespace urnic::shim;

// Registered memory needs nothing at fork: the fork handler gives the child
// private copies (MrShare::privatize_in_child), as a kernel >= 5.13 copies
// pinned pages; so, as libibverbs there, ibv_fork_init changes nothing for
// urnic memory (it used to MADV_DONTFORK every registration for good, so a
// child died on heap pages once registered) and the status is UNNEEDED.
// Another provider's devices still get the real call.
URNIC_EXPORT int ibv_fork_init(void) {
  auto f = URNIC_REAL(ibv_fork_init, "IBVERBS_1.1");
  const int rc = f ? f() : 0;
  return rc == ENOSYS ? 0 : rc;
}

URNIC_EXPORT ibv_fork_status ibv_is_fork_initialized(void) {
  auto f = URNIC_REAL(ibv_is_fork_initialized, "IBVERBS_1.13");
  const ibv_fork_status st = f ? f() : IBV_FORK_DISABLED;
  return st == IBV_FORK_ENABLED ? st : IBV_FORK_UNNEEDED;
}

// --- completion channels
// ------------------------------------------------------------

ibv_comp_channel* ours::ibv_create_comp_channel(ibv_context* context) {
  Context& c = ctx_of(context);
  int sp[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) != 0)
    return nullptr;
  HandleRep rep;
  const int rc = c.call(Op::kCreateChannel, "ibv_create_comp_channel", nullptr,
                        0, &sp[1], 1, &rep, sizeof rep);
  close(sp[1]);
  auto* ch = rc ? nullptr : new (std::nothrow) Channel;
  if (!ch) {
    if (!rc) {
      HandleReq h{rep.handle};
      c.call(Op::kDestroyChannel, "ibv_destroy_comp_channel", &h, sizeof h,
             nullptr, 0, nullptr, 0);
    }
    close(sp[0]);
    errno = rc ? rc : ENOMEM;
    return nullptr;
  }
  ch->handle = rep.handle;
  ch->ch.context = context;
  ch->ch.fd = sp[0];
  ch->ch.refcnt = 0;
  std::lock_guard g(c.obj_mu);
  c.channel_fds.push_back(sp[0]);
  return &ch->ch;
}

int ours::ibv_destroy_comp_channel(ibv_comp_channel* channel) {
  Context& c = ctx_of(channel->context);
  pthread_mutex_lock(&channel->context->mutex);
  const int users = channel->refcnt;
  pthread_mutex_unlock(&channel->context->mutex);
  if (users) return EBUSY;
  auto* ch = reinterpret_cast<Channel*>(channel);
  HandleReq h{ch->handle};
  const int rc = c.call(Op::kDestroyChannel, "ibv_destroy_comp_channel", &h,
                        sizeof h, nullptr, 0, nullptr, 0);
  if (rc && !c.dead) return rc;
  {
    std::lock_guard g(c.obj_mu);
    std::erase(c.channel_fds, channel->fd);
  }
  close(channel->fd);
  delete ch;
  return 0;
}

int ours::ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq,
                           void** cq_context) {
  Context& c = ctx_of(channel->context);
  for (;;) {
    uint64_t handle;
    // Blocking unless the application made the fd O_NONBLOCK (EAGAIN). A
    // signal ends the wait with EINTR, as libibverbs' read() does.
    const ssize_t n = recv(channel->fd, &handle, sizeof handle, 0);
    if (n < 0) return -1;
    if (n == 0) {
      // The service closed its end: it is gone (its other sockets close
      // as it exits), or the channel was destroyed while this thread
      // waited on it, which does not make the context unusable.
      if (!c.dead.load() && !c.hung_up(100)) {
        errno = EBADF;
        return -1;
      }
      c.lost("completion channel closed");
      errno = EIO;
      return -1;
    }
    if (n != sizeof handle) continue;
    // The count goes up before obj_mu is let go: ibv_destroy_cq, once it
    // has removed the CQ under obj_mu, sees every event handed out.
    std::lock_guard g(c.obj_mu);
    Cq* q = c.cqs.find(static_cast<uint32_t>(handle));
    if (!q) continue;  // an event for a CQ destroyed since
    ibv_cq* x = ibv_cq_ex_to_cq(&q->cqx);
    pthread_mutex_lock(&x->mutex);
    ++q->events;
    pthread_mutex_unlock(&x->mutex);
    *cq = x;
    *cq_context = x->cq_context;
    return 0;
  }
}

void ours::ibv_ack_cq_events(ibv_cq* cq, unsigned int nevents) {
  pthread_mutex_lock(&cq->mutex);
  cq->comp_events_completed += nevents;
  pthread_cond_signal(&cq->cond);
  pthread_mutex_unlock(&cq->mutex);
}

// --- asynchronous events
// ------------------------------------------------------------

namespace {

// What an async event's `element` names (verbs.h, ibv_async_event).
enum class Element { kCq, kQp, kSrq, kDevice, kPort };
Element element_of(ibv_event_type t) {
  switch (t) {
    case IBV_EVENT_CQ_ERR:
      return Element::kCq;
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR:
    case IBV_EVENT_QP_LAST_WQE_REACHED:
      return Element::kQp;
    case IBV_EVENT_SRQ_ERR:
    case IBV_EVENT_SRQ_LIMIT_REACHED:
      return Element::kSrq;
    case IBV_EVENT_DEVICE_FATAL:
      return Element::kDevice;
    default:
      return Element::kPort;
  }
}

}  // namespace

void urnic::shim::purge_async_events(Context& c) {
  if (c.async_eof || c.dead.load()) return;
  const int fd = c.ibv()->async_fd;
  AsyncRequeueReq keep;
  auto flush = [&] {
    if (keep.n)
      c.call(Op::kAsyncRequeue, "ibv_destroy (async events)", &keep,
             sizeof keep, nullptr, 0, nullptr, 0);
    keep.n = 0;
  };
  for (;;) {
    AsyncMsg m;
    const ssize_t n = recv(fd, &m, sizeof m, MSG_DONTWAIT);
    if (n != sizeof m) break;  // empty, EOF (seen again by the reader), junk
    bool live = true;
    {
      std::lock_guard g(c.obj_mu);
      switch (element_of(static_cast<ibv_event_type>(m.type))) {
        case Element::kCq:
          live = c.cqs.find(m.handle) != nullptr;
          break;
        case Element::kQp:
          live = c.qps.find(m.handle) != nullptr;
          break;
        case Element::kSrq:
          live = c.srqs.find(m.handle) != nullptr;
          break;
        case Element::kDevice:
        case Element::kPort:
          break;
      }
    }
    if (!live) continue;  // its object is gone: the event goes too
    keep.msgs[keep.n++] = m;
    if (keep.n == kMaxRequeue) flush();
  }
  flush();  // the live ones go back, in order
}

int ours::ibv_get_async_event(ibv_context* context, ibv_async_event* event) {
  Context& c = ctx_of(context);
  for (;;) {
    if (c.async_eof) {
      errno = EIO;
      return -1;
    }
    AsyncMsg m;
    const ssize_t n = recv(context->async_fd, &m, sizeof m, 0);
    if (n < 0) return -1;  // EINTR too, as libibverbs' read()
    if (n == 0) {
      // The service is gone: reported once as a fatal device event.
      c.async_eof = true;
      c.lost("async event socket closed");
      std::memset(event, 0, sizeof *event);
      event->event_type = IBV_EVENT_DEVICE_FATAL;
      return 0;
    }
    if (n != sizeof m) continue;
    std::memset(event, 0, sizeof *event);
    event->event_type = static_cast<ibv_event_type>(m.type);
    std::lock_guard g(c.obj_mu);
    switch (element_of(event->event_type)) {
      case Element::kCq: {
        Cq* q = c.cqs.find(m.handle);
        if (!q) continue;  // destroyed since
        event->element.cq = ibv_cq_ex_to_cq(&q->cqx);
        ++q->async_reported;
        return 0;
      }
      case Element::kQp: {
        Qp* q = c.qps.find(m.handle);
        if (!q) continue;
        event->element.qp = q->ibv();
        ++q->events_reported;
        return 0;
      }
      case Element::kSrq: {
        Srq* q = c.srqs.find(m.handle);
        if (!q) continue;
        event->element.srq = &q->srq;
        ++q->events_reported;
        return 0;
      }
      case Element::kDevice:
        // The service is shutting down (it flushed this context's QPs):
        // reported once; the close that follows reads as EIO, not as a
        // second fatal event.
        c.async_eof = true;
        c.lost("urnicd is shutting down");
        return 0;
      case Element::kPort:  // port events carry the port number
        event->element.port_num = static_cast<int>(m.handle);
        return 0;
    }
  }
}

// Counted as libibverbs counts them (ibv_get_async_event(3)): the
// object's destroy waits until every event handed out for it has been
// acknowledged, so that a thread still reading the event's element does
// not read freed memory.
URNIC_EXPORT void ibv_ack_async_event(ibv_async_event* event) {
  auto counted = [](pthread_mutex_t* mu, pthread_cond_t* cv, uint32_t* n) {
    pthread_mutex_lock(mu);
    ++*n;
    pthread_cond_signal(cv);
    pthread_mutex_unlock(mu);
  };
  switch (element_of(event->event_type)) {
    case Element::kCq: {
      ibv_cq* cq = event->element.cq;
      if (!cq || !is_urnic(cq->context)) break;
      counted(&cq->mutex, &cq->cond, &cq->async_events_completed);
      return;
    }
    case Element::kSrq: {
      ibv_srq* srq = event->element.srq;
      if (!srq || !is_urnic(srq->context)) break;
      counted(&srq->mutex, &srq->cond, &srq->events_completed);
      return;
    }
    case Element::kQp: {
      ibv_qp* qp = event->element.qp;
      if (!qp || !is_urnic(qp->context)) break;
      counted(&qp->mutex, &qp->cond, &qp->events_completed);
      return;
    }
    case Element::kDevice:
    case Element::kPort:
      return;  // nothing to count
  }
  if (auto f = URNIC_REAL(ibv_ack_async_event, "IBVERBS_1.1")) f(event);
}
