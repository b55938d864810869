// The service side of the verbs shim; see shim_server.h and
// dataplane/hostif/abi.h.
#include "dataplane/service/shim_server.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <new>
#include <stdexcept>
#include <thread>

#include "dataplane/service/foreign_memory.h"
#include "dataplane/transport/qp_attr.h"

namespace urnic::service {

using namespace urnic::shim;

namespace {

// Service-created shared memory (rings, doorbells): sealed so that the
// application cannot shrink it under the service (a SIGBUS here).
int make_shared(size_t len, const char* name, Mapping* out) {
  const int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -errno;
  void* p = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(len)) == 0 &&
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0)
    p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    close(fd);
    return -e;
  }
  out->base = p;
  out->len = len;
  return fd;
}

void unmap(Mapping& m) {
  if (m.whole) {
    foreign::remove(m.whole);
    munmap(m.whole, m.whole_len);
  } else if (m.base) {
    munmap(m.base, m.len);
  }
  m = {};
}

template <typename T>
bool body_as(const CtlRequest& req, T* out) {
  if (req.body.size() != sizeof(T)) return false;
  std::memcpy(out, req.body.data(), sizeof(T));
  return true;
}

template <typename T>
void reply_with(CtlReply& rep, const T& v) {
  rep.payload.assign(reinterpret_cast<const char*>(&v), sizeof v);
}

// A controlled Q_Key (bit 31 set, IBTA 10.2.5) may be set by privileged
// processes only: Linux's uverbs refuses it with EPERM without CAP_NET_RAW.
// Otherwise any local client could take a Q_Key that UD services use to
// tell privileged senders apart. The client's effective capabilities, read
// from /proc; if they cannot be read (another pid namespace), root.
bool may_set_controlled_qkey(const ClientInfo& ci) {
  constexpr int kCapNetRaw = 13;  // linux/capability.h
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/status", static_cast<int>(ci.pid));
  FILE* f = ci.pid > 0 ? std::fopen(path, "re") : nullptr;
  if (!f) return ci.uid == 0;
  bool ok = false;
  char line[256];
  while (std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, "CapEff:", 7) == 0) {
      ok = (std::strtoull(line + 7, nullptr, 16) >> kCapNetRaw) & 1;
      break;
    }
  }
  std::fclose(f);
  return ok;
}

// Takes ownership of received fd i (the server closes the others).
int take_fd(CtlRequest& req, size_t i) {
  if (i >= req.fds.size()) return -1;
  const int fd = req.fds[i];
  req.fds[i] = -1;
  return fd;
}

}  // namespace

static_assert(config::kMaxWorkers <= kSummaryWords,
              "each worker needs a summary word of the doorbell page");

ShimServer::ShimServer(ShimEnv env) : env_(std::move(env)) {
  if (env_.engines.empty() || env_.engines.size() > kSummaryWords ||
      env_.gates.size() != env_.engines.size() ||
      (!env_.bells.empty() && env_.bells.size() != env_.engines.size()))
    throw std::invalid_argument(
        "ShimServer: 1..16 engines, a gate each (and a bell each, or none)");
  foreign::install();
  for (transport::Engine* e : env_.engines) e->set_recv_source(this);
  env_.dev->set_mcast_hook([this](const transport::Gid& g, bool joined) {
    mcast_changed(g, joined);
  });
}

ShimServer::~ShimServer() {
  for (transport::Engine* e : env_.engines) e->set_recv_source(nullptr);
  for (auto& [id, c] : clients_) release_all(*c);
  env_.dev->set_mcast_hook(nullptr);
  finish_abandoned(true);
}

// --- control thread ---------------------------------------------------------

void ShimServer::handle(CtlRequest& req, CtlReply& rep) {
  if (req.attempt == 0) ctr_.requests.fetch_add(1, std::memory_order_relaxed);
  auto& slot = clients_[req.client->id];
  if (!slot) {
    slot = std::make_unique<Client>();
    slot->info = *req.client;
  }
  why_.clear();
  const int rc = dispatch(*slot, req, rep);
  if (rc) {
    ctr_.request_errors.fetch_add(1, std::memory_order_relaxed);
    rep.status = -rc;
    rep.payload = why_.empty() ? std::string(strerror(rc)) : why_;
    for (int fd : rep.fds) close(fd);
    rep.fds.clear();
  }
}

void ShimServer::on_close(const ClientInfo& ci) {
  auto it = clients_.find(ci.id);
  if (it == clients_.end()) return;
  release_all(*it->second);
  clients_.erase(it);
  ctr_.clients_closed.fetch_add(1, std::memory_order_relaxed);
}

bool ShimServer::sends_untaken(const QpObj& q) const {
  return !q.broken &&
         q.sh->sq_prod.load(std::memory_order_acquire) != q.sq_seen;
}

// Everything of a client goes, QPs first (they hold PDs, CQs, SRQs). A
// destroyed QP answers nothing more, so an RC peer sees its retries run
// out and completes with an error, as with a crashed host.
void ShimServer::release_all(Client& c) {
  {
    ParkAll park(all_gates());
    // Sends posted before the client went still leave (destroy_qp).
    std::vector<bool> pass(env_.gates.size());
    for (auto& [h, q] : c.qps)
      if (sends_untaken(*q)) {
        ctr_.sends_at_destroy.fetch_add(1, std::memory_order_relaxed);
        pass[q->home] = true;
      }
    for (size_t i = 0; i < pass.size(); ++i)
      if (pass[i]) run_one_pass(*env_.gates[i]);
    for (auto& [h, q] : c.qps) env_.engines[q->home]->destroy_qp(q->qp);
    for (auto& [h, a] : c.ahs) env_.dev->destroy_ah(a.ah);
    for (auto& [h, s] : c.srqs) env_.dev->destroy_srq(s->srq);
    for (auto& [h, q] : c.cqs) env_.dev->destroy_cq(q.cq);
    for (auto& [h, w] : c.mws) env_.dev->dealloc_mw(w);  // before their MRs
    for (auto& [h, m] : c.mrs) {
      env_.dev->dereg_mr(m.mr);
      if (env_.tx_memory) env_.tx_memory->remove(m.view.base);
    }
    for (auto& [h, pd] : c.pds) env_.dev->dealloc_pd(pd);
    std::erase(live_, &c);
  }
  for (auto& [h, q] : c.qps) unmap(q->mem);
  for (auto& [h, s] : c.srqs) unmap(s->mem);
  for (auto& [h, q] : c.cqs) unmap(q.mem);
  for (auto& [h, m] : c.mrs) retire_view(m.view);
  if (c.pending_mr) {
    abandoned_mrs_.push_back(std::move(*c.pending_mr));
    c.pending_mr.reset();
  }
  for (auto& [h, fd] : c.channels) close(fd);
  c.qps.clear();
  c.ahs.clear();
  c.srqs.clear();
  c.cqs.clear();
  c.mrs.clear();
  c.mws.clear();
  c.pds.clear();
  c.channels.clear();
  unmap(c.db_mem);
  c.db = nullptr;
  if (c.async_fd >= 0) close(c.async_fd);
  c.async_fd = -1;
  c.open = false;
}

// Summary word j (doorbell indices j*4096 .. j*4096+4095) belongs to home
// j % homes(); a home's k-th index is in its (k / 4096)-th word.
uint32_t ShimServer::alloc_doorbell(Client& c, uint32_t home) {
  std::vector<uint32_t>& fr = c.free_doorbells[home];
  if (!fr.empty()) {
    const uint32_t d = fr.back();
    fr.pop_back();
    return d;
  }
  std::vector<Target>& t = c.targets[home];
  const auto k = static_cast<uint32_t>(t.size());
  const uint32_t word = (k / kDoorbellsPerSummary) * homes() + home;
  if (word >= kSummaryWords) return UINT32_MAX;
  t.emplace_back();  // control thread, the home lcore parked by the caller
  return word * kDoorbellsPerSummary + k % kDoorbellsPerSummary;
}

ShimServer::Target& ShimServer::target(Client& c, uint32_t doorbell) {
  return c
      .targets[doorbell_home(doorbell, homes())][db_local(doorbell, homes())];
}

void ShimServer::free_doorbell(Client& c, uint32_t doorbell) {
  target(c, doorbell) = {};
  c.free_doorbells[doorbell_home(doorbell, homes())].push_back(doorbell);
}

uint32_t ShimServer::pick_home() const {
  uint32_t best = 0;
  for (uint32_t h = 1; h < homes(); ++h)
    if (env_.engines[h]->qp_count() < env_.engines[best]->qp_count()) best = h;
  return best;
}

size_t ShimServer::qp_count() const {
  size_t n = 0;
  for (const transport::Engine* e : env_.engines) n += e->qp_count();
  return n;
}

bool ShimServer::over_limit(const char* key, uint64_t have, uint64_t add,
                            uint64_t max) {
  if (!max || have + add <= max) return false;
  why_ = std::string("over this client's limit: client_limits.") + key +
         " is " + std::to_string(max) + ", " + std::to_string(have) + " in use";
  ctr_.client_limit_refusals.fetch_add(1, std::memory_order_relaxed);
  return true;
}

int ShimServer::dispatch(Client& c, CtlRequest& req, CtlReply& rep) {
  const auto op = static_cast<Op>(req.op);
  if (op == Op::kOpen) return op_open(c, req, rep);
  if (!c.open) {
    why_ = "the first request of a verbs connection must be kOpen";
    return EPROTO;
  }
  transport::Device& dev = *env_.dev;
  HandleReq hr;
  switch (op) {
    case Op::kOpen:
      break;
    case Op::kCmOpen:  // Daemon::handle routes these to the CmServer
    case Op::kCmCommand:
      return EOPNOTSUPP;
    case Op::kQueryPort: {
      ibv_port_attr pa = env_.info.port;
      if (env_.port_state) env_.port_state(pa);
      reply_with(rep, pa);
      return 0;
    }
    case Op::kAllocPd: {
      if (over_limit("max_pd", c.pds.size(), 1, env_.client_limits.max_pd))
        return ENOMEM;
      transport::Pd* pd = nullptr;
      int rc;
      {
        ParkAll park(all_gates());
        rc = dev.alloc_pd(&pd);
      }
      if (rc) return rc;
      const uint32_t h = c.next_handle++;
      c.pds[h] = pd;
      reply_with(rep, HandleRep{h});
      return 0;
    }
    case Op::kDeallocPd: {
      if (!body_as(req, &hr) || !c.pds.count(hr.handle)) return EINVAL;
      int rc;
      {
        ParkAll park(all_gates());
        rc = dev.dealloc_pd(c.pds[hr.handle]);
      }
      if (rc) return rc;
      c.pds.erase(hr.handle);
      return 0;
    }
    case Op::kRegMr:
      return op_reg_mr(c, req, rep);
    case Op::kDeregMr: {
      if (!body_as(req, &hr) || !c.mrs.count(hr.handle)) return EINVAL;
      if (const int rc = drop_mr_range(c, c.mrs[hr.handle], nullptr)) return rc;
      c.mrs.erase(hr.handle);
      return 0;
    }
    case Op::kReregMr: {
      ReregMrReq r;
      if (!body_as(req, &r) || r.handle == r.fresh || !c.mrs.count(r.handle) ||
          !c.mrs.count(r.fresh))
        return EINVAL;
      MrObj& m = c.mrs[r.handle];
      MrObj& f = c.mrs[r.fresh];
      if (const int rc = drop_mr_range(c, m, f.mr)) return rc;
      m.view = f.view;
      m.bytes = f.bytes;
      c.mrs.erase(r.fresh);
      reply_with(rep, RegMrRep{r.handle, m.mr->lkey(), m.mr->rkey()});
      return 0;
    }
    case Op::kAllocMw: {
      AllocMwReq r;
      if (!body_as(req, &r) || !c.pds.count(r.pd)) return EINVAL;
      // Checked before it becomes an ibv_mw_type (any value can come).
      if (r.type != IBV_MW_TYPE_1 && r.type != IBV_MW_TYPE_2) return EINVAL;
      // Windows are keys like MRs: they count against the same limit.
      if (over_limit("max_mr", c.mrs.size() + c.mws.size(), 1,
                     env_.client_limits.max_mr))
        return ENOMEM;
      transport::Mw* mw = nullptr;
      int rc;
      {
        ParkAll park(all_gates());
        rc = dev.alloc_mw(c.pds[r.pd], static_cast<ibv_mw_type>(r.type), &mw);
      }
      if (rc) return rc;
      const uint32_t h = c.next_handle++;
      c.mws[h] = mw;
      reply_with(rep, AllocMwRep{h, mw->rkey()});
      return 0;
    }
    case Op::kDeallocMw: {
      if (!body_as(req, &hr) || !c.mws.count(hr.handle)) return EINVAL;
      {
        ParkAll park(all_gates());
        dev.dealloc_mw(c.mws[hr.handle]);
      }
      c.mws.erase(hr.handle);
      return 0;
    }
    case Op::kCreateChannel: {
      const int fd = take_fd(req, 0);
      if (fd < 0) {
        why_ = "kCreateChannel needs the channel's socket";
        return EINVAL;
      }
      const uint32_t h = c.next_handle++;
      c.channels[h] = fd;
      reply_with(rep, HandleRep{h});
      return 0;
    }
    case Op::kDestroyChannel: {
      if (!body_as(req, &hr) || !c.channels.count(hr.handle)) return EINVAL;
      for (auto& [h, q] : c.cqs)
        if (q.channel == hr.handle) return EBUSY;
      close(c.channels[hr.handle]);
      c.channels.erase(hr.handle);
      return 0;
    }
    case Op::kCreateCq:
      return op_create_cq(c, req, rep);
    case Op::kResizeCq:
      return op_resize_cq(c, req, rep);
    case Op::kDestroyCq: {
      if (!body_as(req, &hr) || !c.cqs.count(hr.handle)) return EINVAL;
      CqObj& q = c.cqs[hr.handle];
      int rc;
      {
        ParkAll park(all_gates());
        rc = dev.destroy_cq(q.cq);
      }
      if (rc) return rc;
      unmap(q.mem);
      c.cqs.erase(hr.handle);
      forget_async(c, hr.handle);
      return 0;
    }
    case Op::kCreateSrq:
      return op_create_srq(c, req, rep);
    case Op::kModifySrq: {
      ModifySrqReq m;
      if (!body_as(req, &m) || !c.srqs.count(m.handle)) return EINVAL;
      ParkAll park(all_gates());
      return dev.modify_srq(c.srqs[m.handle]->srq, m.attr, m.mask);
    }
    case Op::kQuerySrq: {
      if (!body_as(req, &hr) || !c.srqs.count(hr.handle)) return EINVAL;
      ibv_srq_attr a{};
      {
        ParkAll park(all_gates());
        const transport::Srq* s = c.srqs[hr.handle]->srq;
        a.max_wr = s->max_wr();
        a.max_sge = s->max_sge();
        a.srq_limit = s->limit();
      }
      reply_with(rep, a);
      return 0;
    }
    case Op::kDestroySrq: {
      if (!body_as(req, &hr)) return EINVAL;
      const int rc = destroy_srq(c, hr.handle);
      if (!rc) forget_async(c, hr.handle);
      return rc;
    }
    case Op::kCreateQp:
      return op_create_qp(c, req, rep);
    case Op::kModifyQp:
      return op_modify_qp(c, req, rep);
    case Op::kQueryQp:
      return op_query_qp(c, req, rep);
    case Op::kDestroyQp: {
      if (!body_as(req, &hr)) return EINVAL;
      const int rc = destroy_qp(c, hr.handle);
      if (!rc) forget_async(c, hr.handle);
      return rc;
    }
    case Op::kCreateAh: {
      CreateAhReq a;
      if (!body_as(req, &a) || !c.pds.count(a.pd)) return EINVAL;
      if (over_limit("max_ah", c.ahs.size(), 1, env_.client_limits.max_ah))
        return ENOMEM;
      if (const char* w = transport::check_av(a.attr, dev.limits())) {
        why_ = w;  // as ibv_modify_qp says of a QP's AV
        return EINVAL;
      }
      if (env_.warm_neighbour) {
        const int rc =
            env_.warm_neighbour(a.attr.grh.dgid.raw, req.attempt, req.since_ns);
        if (rc == EINPROGRESS) {
          rep.later = true;
          return 0;
        }
        if (rc) {
          why_ = "cannot resolve the destination GID's MAC address";
          return rc;
        }
      }
      transport::Ah* ah = nullptr;
      int rc;
      const uint32_t h = c.next_handle;
      {
        ParkAll park(all_gates());
        rc = dev.create_ah(c.pds[a.pd], a.attr, &ah);
        if (!rc) c.ahs[h] = {ah, a.pd};  // the lcores look AHs up here
      }
      if (rc) return rc;
      ++c.next_handle;
      reply_with(rep, HandleRep{h});
      return 0;
    }
    case Op::kAsyncRequeue: {
      AsyncRequeueReq q;
      if (!body_as(req, &q) || q.n > kMaxRequeue) return EINVAL;
      // Older than any held back: they go first, and out as room allows.
      c.async_backlog.insert(c.async_backlog.begin(), q.msgs, q.msgs + q.n);
      async_backlog_ |= !flush_async(c);
      return 0;
    }
    case Op::kAttachMcast:
    case Op::kDetachMcast: {
      McastReq r;
      if (!body_as(req, &r) || !c.qps.count(r.qp)) return EINVAL;
      QpObj& q = *c.qps[r.qp];
      const char* why = nullptr;
      int rc;
      {
        // Every lcore reads the device's group table (which frames to take).
        ParkAll park(all_gates());
        transport::Engine& e = *env_.engines[q.home];
        rc = op == Op::kAttachMcast ? e.attach_mcast(q.qp, r.gid, &why)
                                    : e.detach_mcast(q.qp, r.gid, &why);
      }
      if (rc && why) why_ = why;
      return rc;
    }
    case Op::kDestroyAh: {
      if (!body_as(req, &hr) || !c.ahs.count(hr.handle)) return EINVAL;
      {
        ParkAll park(all_gates());
        // What the application posted before this takes the AH's address
        // now (the engine copies it into the WQE), as it would have had
        // the lcore served the doorbell first: the AH may go once
        // ibv_post_send returns (mckey destroys it without polling).
        const AhObj& a = c.ahs[hr.handle];
        uint32_t taken = 0;
        for (auto& [h, q] : c.qps)
          if (q->pd == a.pd && q->qp->type() == IBV_QPT_UD)
            drain_qp_st(c, *q, &taken);
        dev.destroy_ah(a.ah);
        c.ahs.erase(hr.handle);  // the lcore looks AHs up in this map
      }
      return 0;
    }
  }
  why_ = "unknown verbs operation " + std::to_string(static_cast<int>(req.op));
  return EOPNOTSUPP;
}

int ShimServer::op_open(Client& c, CtlRequest& req, CtlReply& rep) {
  OpenReq o;
  if (c.open) {
    why_ = "this connection is already open";
    return EPROTO;
  }
  if (!body_as(req, &o)) {
    why_ = "malformed open request";
    return EPROTO;
  }
  if (o.abi != kShimAbi) {
    why_ = "liburnic-verbs.so speaks shim ABI " + std::to_string(o.abi) +
           ", this urnicd " + std::to_string(kShimAbi) +
           ": use the shim built with this urnicd";
    return EPROTONOSUPPORT;
  }
  const int async_fd = take_fd(req, 0);
  if (async_fd < 0) {
    why_ = "open needs the async-event socket";
    return EINVAL;
  }
  // Copies of the workers' bells: the reply's fds are closed once sent.
  std::vector<int> bells;
  for (int b : env_.bells) {
    const int d = fcntl(b, F_DUPFD_CLOEXEC, 0);
    if (d < 0) {
      const int err = errno;
      for (int x : bells) close(x);
      close(async_fd);
      why_ = "open: cannot pass the bells (" + std::string(strerror(err)) + ")";
      return err;
    }
    bells.push_back(d);
  }
  Mapping m;
  const int fd = make_shared(page_round(sizeof(DoorbellPage)), "urnic-db", &m);
  if (fd < 0) {
    for (int x : bells) close(x);
    close(async_fd);
    return -fd;
  }
  c.db = new (m.base) DoorbellPage;
  c.db_mem = m;
  c.async_fd = async_fd;
  c.open = true;
  {
    ParkAll park(all_gates());
    live_.push_back(&c);
  }
  ctr_.clients.fetch_add(1, std::memory_order_relaxed);
  OpenRep r = env_.info;
  r.homes = homes();
  if (env_.port_state) env_.port_state(r.port);
  reply_with(rep, r);
  rep.fds.push_back(fd);
  rep.fds.insert(rep.fds.end(), bells.begin(), bells.end());
  return 0;
}

int ShimServer::map_mr_view(Client& c, const RegMrReq& r, CtlRequest& req,
                            Mapping* out) {
  if (!c.pds.count(r.pd)) return EINVAL;
  // The application's own shared mapping: one piece and no fd (abi.h).
  const bool foreign = r.npieces == 1 && r.pieces[0].vma_end != 0;
  if (r.npieces == 0 || r.npieces > kMaxMrPieces ||
      (foreign ? !req.fds.empty() : r.npieces != req.fds.size())) {
    why_ = "reg_mr: pieces and passed fds disagree";
    return EINVAL;
  }
  const uint64_t page = 4096;
  uint64_t total = 0;
  for (uint32_t i = 0; i < r.npieces; ++i) {
    const MrPiece& p = r.pieces[i];
    if (p.length == 0 || p.length % page || p.fd_offset % page) return EINVAL;
    if (foreign) {
      total += p.length;
      break;
    }
    if (p.vma_start != 0 || p.vma_end != 0) {
      why_ =
          "reg_mr: a mapping of the application's must be the MR's only "
          "piece";
      return EINVAL;
    }
    // Sealed against shrinking and long enough: otherwise a later
    // ftruncate by the application would fault the service (SIGBUS).
    struct stat st;
    const int seals = fcntl(req.fds[i], F_GET_SEALS);
    if (fstat(req.fds[i], &st) != 0 || seals < 0 || !(seals & F_SEAL_SHRINK) ||
        p.fd_offset + p.length < p.fd_offset ||
        static_cast<uint64_t>(st.st_size) < p.fd_offset + p.length) {
      why_ =
          "reg_mr: memory must be a memfd sealed against shrinking and "
          "covering the range";
      return EINVAL;
    }
    total += p.length;
  }
  if (r.map_start % page || total != r.map_len || r.addr < r.map_start ||
      r.addr - r.map_start > r.map_len ||
      r.length > r.map_len - (r.addr - r.map_start)) {
    why_ = "reg_mr: the registered range is not inside its pages";
    return EINVAL;
  }
  // Exactly the pages the range touches, as the shim maps them: the view
  // is what gets mapped (and on a PCI port pinned), so a small MR must
  // not bring a large view past max_mr_bytes.
  if (r.addr - r.map_start >= page ||
      r.map_len != (r.addr - r.map_start + r.length + page - 1) / page * page) {
    why_ = "reg_mr: the mapped pages are more than the registered range's";
    return EINVAL;
  }
  if (r.length > env_.dev->limits().max_mr_size) return EINVAL;
  if (!hostif::mr_iova_valid(r.addr, r.iova)) {
    why_ = "reg_mr: the iova and the address differ within their page";
    return EINVAL;
  }
  if (over_limit("max_mr", c.mrs.size() + c.mws.size(), 1,
                 env_.client_limits.max_mr) ||
      over_limit("max_mr_bytes", c.mr_bytes, r.length,
                 env_.client_limits.max_mr_bytes))
    return ENOMEM;
  if (foreign) return map_foreign_view(c, r, req, out);
  // One contiguous view of the pieces, wherever the kernel puts it.
  void* base = mmap(nullptr, r.map_len, PROT_NONE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return errno;
  Mapping view{base, r.map_len};
  uint64_t off = 0;
  for (uint32_t i = 0; i < r.npieces; ++i) {
    void* p = mmap(static_cast<uint8_t*>(base) + off, r.pieces[i].length,
                   PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, req.fds[i],
                   static_cast<off_t>(r.pieces[i].fd_offset));
    if (p == MAP_FAILED) {
      const int e = errno;
      unmap(view);
      return e;
    }
    off += r.pieces[i].length;
  }
  // The view holds the memory now: the fds go at once, not when the
  // (possibly deferred) request is answered.
  for (uint32_t i = 0; i < r.npieces; ++i) close(take_fd(req, i));
  *out = view;
  return 0;
}

namespace {

// The line of /proc/<pid>/maps that is exactly [start, end).
struct MapsLine {
  char perms[5] = {};
  uint64_t offset = 0;
  dev_t dev = 0;
  uint64_t ino = 0;
  std::string path;
};
bool find_maps_line(pid_t pid, uint64_t start, uint64_t end, MapsLine* out) {
  char name[64];
  std::snprintf(name, sizeof name, "/proc/%d/maps", static_cast<int>(pid));
  FILE* f = std::fopen(name, "re");
  if (!f) return false;
  char line[4096 + 256];
  bool found = false;
  while (!found && std::fgets(line, sizeof line, f)) {
    unsigned long long s = 0, e = 0, off = 0, ino = 0;
    unsigned maj = 0, min = 0;
    int n = 0;
    if (std::sscanf(line, "%llx-%llx %4s %llx %x:%x %llu %n", &s, &e,
                    out->perms, &off, &maj, &min, &ino, &n) < 7)
      continue;
    if (s != start || e != end) continue;
    out->offset = off;
    out->dev = makedev(maj, min);
    out->ino = ino;
    out->path = line + n;
    while (!out->path.empty() && out->path.back() == '\n') out->path.pop_back();
    found = true;
  }
  std::fclose(f);
  return found;
}

}  // namespace

int ShimServer::map_foreign_view(const Client& c, const RegMrReq& r,
                                 const CtlRequest& req, Mapping* out) {
  // map_mr_view checked the piece's and the range's sizes and alignment.
  const uint64_t page = 4096;
  const MrPiece& p = r.pieces[0];
  if (req.fds.size() != 0 || p.vma_start % page || p.vma_end % page ||
      p.vma_start > r.map_start || r.map_start + r.map_len < r.map_start ||
      r.map_start + r.map_len > p.vma_end ||
      p.fd_offset + p.length < p.fd_offset) {
    why_ = "reg_mr: the registered range is not inside its mapping";
    return EINVAL;
  }
  // The mapping's file itself, opened first and then checked against the
  // client's maps by inode: a client that swaps the mapping in between is
  // refused rather than served another file. Opening another process's
  // map_files needs CAP_SYS_ADMIN (or CAP_CHECKPOINT_RESTORE).
  char path[96];
  std::snprintf(path, sizeof path, "/proc/%d/map_files/%llx-%llx",
                static_cast<int>(c.info.pid),
                static_cast<unsigned long long>(p.vma_start),
                static_cast<unsigned long long>(p.vma_end));
  const int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    why_ = std::string("reg_mr: cannot open the application's mapping (") +
           path + "): " + std::strerror(e) +
           (e == EPERM ? " (urnicd needs CAP_SYS_ADMIN for it)" : "");
    return e == ENOENT ? EINVAL : e;
  }
  // Memory: a regular file of tmpfs (POSIX and System V shared memory,
  // shared anonymous memory, memfds) or hugetlbfs, not a device's
  // registers, and not a disk's or a network file system's, whose page
  // faults would stall a worker lcore for every client on it (a FUSE file
  // for as long as its client likes). Writable and shared in the client,
  // so the service writes only what the client could.
  struct statfs fs;
  if (fstatfs(fd, &fs) != 0 ||
      (fs.f_type != TMPFS_MAGIC && fs.f_type != HUGETLBFS_MAGIC)) {
    close(fd);
    why_ =
        "reg_mr: a shared mapping of a file is registered only from tmpfs "
        "(/dev/shm, shared memory) or hugetlbfs: a disk or network file's "
        "page faults would stall the service";
    return EINVAL;
  }
  struct stat st;
  MapsLine m;
  const bool ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
                  find_maps_line(c.info.pid, p.vma_start, p.vma_end, &m) &&
                  m.perms[0] == 'r' && m.perms[1] == 'w' && m.perms[3] == 's' &&
                  m.ino == st.st_ino && m.dev == st.st_dev &&
                  p.fd_offset == m.offset + (r.map_start - p.vma_start) &&
                  static_cast<uint64_t>(st.st_size) >= p.fd_offset + p.length;
  if (!ok) {
    close(fd);
    why_ =
        "reg_mr: the range is not in a writable shared mapping of a file or "
        "of shared memory of this client, inside the file";
    return EINVAL;
  }
  // Huge pages (hugetlbfs, SHM_HUGETLB: st_blksize is the huge page size)
  // map only whole and at aligned addresses: the view maps the huge pages
  // the range touches, at an address congruent to the file's offset.
  uint64_t huge = page;
  if (st.st_blksize > 0 && (st.st_blksize & (st.st_blksize - 1)) == 0 &&
      static_cast<uint64_t>(st.st_blksize) > page &&
      static_cast<uint64_t>(st.st_blksize) <= (uint64_t{1} << 30))
    huge = static_cast<uint64_t>(st.st_blksize);
  const uint64_t off_lo = p.fd_offset & ~(huge - 1);
  const uint64_t off_hi = (p.fd_offset + p.length + huge - 1) & ~(huge - 1);
  const uint64_t len = off_hi - off_lo;
  void* res = mmap(nullptr, len + huge, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (res == MAP_FAILED) {
    const int e = errno;
    close(fd);
    return e;
  }
  auto* const lo = static_cast<uint8_t*>(res);
  auto* const at = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(lo) + huge - 1) & ~uintptr_t{huge - 1});
  void* v = mmap(at, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
                 static_cast<off_t>(off_lo));
  const int e = errno;
  close(fd);  // the mapping holds the file now
  if (at > lo) munmap(lo, at - lo);
  if (lo + len + huge > at + len) munmap(at + len, lo + len + huge - at - len);
  if (v == MAP_FAILED) {
    munmap(at, len);
    return e;
  }
  // The file can shrink under the view (no seal): the SIGBUS that an
  // access past its end raises is caught for this range (foreign_memory.h).
  if (!foreign::add(at, len, huge)) {
    munmap(at, len);
    why_ = "reg_mr: too many MRs over the applications' own mappings";
    return ENOMEM;
  }
  out->base = at + (p.fd_offset - off_lo);
  out->len = r.map_len;
  out->whole = at;
  out->whole_len = len;
  return 0;
}

int ShimServer::op_reg_mr(Client& c, CtlRequest& req, CtlReply& rep) {
  RegMrReq r;
  if (!body_as(req, &r)) return EINVAL;
  TxMemory* const tx = env_.tx_memory;
  Mapping view;
  bool zc = false;
  if (c.pending_mr) {
    // The same request again: ControlServer holds a client's next request
    // back until this one is answered. Anything else is refused, not
    // mixed with the pending view.
    if (std::memcmp(&c.pending_mr->req, &r, sizeof r) != 0) {
      why_ = "reg_mr: another registration of this client is in progress";
      return EBUSY;
    }
    PendingMr& p = *c.pending_mr;
    if (!p.dma.valid()) start_dma(p);  // queued: a slot may be free now
    if (!p.dma.valid() ||
        p.dma.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      rep.later = true;
      return 0;
    }
    view = p.view;
    const int dma_error = p.dma.get();
    --dma_mapping_;
    zc = tx->map(view.base, view.len, dma_error);
    c.pending_mr.reset();
  } else {
    if (const int rc = map_mr_view(c, r, req, &view)) return rc;
    if (tx && tx->dma_is_slow()) {
      // Zero-copy TX on a PCI port: the DMA mapping pins every page, so it
      // runs on the TxMemory's thread (at most kMaxDmaMapping queued
      // there; the rest wait here) and this client waits (later) while the
      // others are served.
      c.pending_mr = PendingMr{view, r, {}};
      start_dma(*c.pending_mr);
      rep.later = true;
      return 0;
    }
    if (tx)
      zc = tx->map(view.base, view.len, tx->map_dma(view.base, view.len).get());
  }
  void* const base = view.base;
  transport::Mr* mr = nullptr;
  int rc;
  {
    ParkAll park(all_gates());
    rc = env_.dev->reg_mr(c.pds[r.pd],
                          static_cast<uint8_t*>(base) + (r.addr - r.map_start),
                          r.length, r.iova, r.access, &mr);
    if (!rc && zc) tx->add(base, r.map_len);
  }
  if (rc) {
    if (zc) tx->remove(base);  // never added: nothing refers to it
    retire_view(view);
    return rc;
  }
  const uint32_t h = c.next_handle++;
  c.mrs[h] = {mr, view, r.length};
  c.mr_bytes += r.length;
  reply_with(rep, RegMrRep{h, mr->lkey(), mr->rkey()});
  return 0;
}

int ShimServer::op_create_cq(Client& c, CtlRequest& req, CtlReply& rep) {
  CreateCqReq r;
  if (!body_as(req, &r)) return EINVAL;
  if (r.cqe == 0 || r.cqe > env_.dev->limits().max_cqe) return EINVAL;
  if (over_limit("max_cq", c.cqs.size(), 1, env_.client_limits.max_cq))
    return ENOMEM;
  int notify = -1;
  if (r.channel != kNoHandle) {
    auto it = c.channels.find(r.channel);
    if (it == c.channels.end()) return EINVAL;
    notify = fcntl(it->second, F_DUPFD_CLOEXEC, 0);
    if (notify < 0) return errno;
  }
  Mapping m;
  const size_t len = cq_shared_len(r.cqe);
  const int fd = make_shared(len, "urnic-cq", &m);
  if (fd < 0) {
    if (notify >= 0) close(notify);
    return -fd;
  }
  transport::Cq* cq = nullptr;
  const uint32_t h = c.next_handle;
  int rc;
  {
    ParkAll park(all_gates());
    rc = env_.dev->create_cq(r.cqe, &cq, m.base);
    if (!rc) {
      cq->set_notify(notify, h);
      cq->set_owner({c.info.id, h});
    }
  }
  if (rc) {
    if (notify >= 0) close(notify);
    unmap(m);
    close(fd);
    return rc;
  }
  ++c.next_handle;
  c.cqs[h] = {cq, m, r.channel};
  reply_with(rep, CreateCqRep{h, cq->capacity(), len});
  rep.fds.push_back(fd);
  return 0;
}

// Sends already posted on QPs that complete into `cq` get their
// completions first: a HCA makes them within microseconds of the post,
// here a worker's next pass does, and ibv_resize_cq's check of the entries
// the CQ holds must see them (rdma-core's test_resize_cq posts UD sends
// and resizes at once). Bounded: a WR that waits for its peer holds the
// resize up for 10 ms at most. sq_prod is the application's, read only to
// decide whether to wait.
void ShimServer::settle_sends(const Client& c, const transport::Cq* cq) {
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(10);
  for (;;) {
    bool pending = false;
    for (const auto& [h, o] : c.qps) {
      if (o->qp->send_cq_ != cq || o->broken) continue;
      const uint32_t out = o->sh->sq_prod.load(std::memory_order_acquire) -
                           o->sh->sq_done.load(std::memory_order_acquire);
      pending = pending || (out != 0 && out <= o->sq_size);
    }
    if (!pending || std::chrono::steady_clock::now() >= until) return;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

int ShimServer::op_resize_cq(Client& c, CtlRequest& req, CtlReply& rep) {
  ResizeCqReq r;
  if (!body_as(req, &r) || !c.cqs.count(r.handle)) return EINVAL;
  if (r.cqe == 0 || r.cqe > env_.dev->limits().max_cqe) return EINVAL;
  CqObj& q = c.cqs[r.handle];
  settle_sends(c, q.cq);
  Mapping m;
  const size_t len = cq_shared_len(r.cqe);
  const int fd = make_shared(len, "urnic-cq", &m);
  if (fd < 0) return -fd;
  int rc;
  {
    ParkAll park(all_gates());
    rc = env_.dev->resize_cq(q.cq, r.cqe, m.base);
  }
  if (rc) {
    unmap(m);
    close(fd);
    return rc;
  }
  unmap(q.mem);  // the lcore no longer touches it; the shim maps the new one
  q.mem = m;
  reply_with(rep, CreateCqRep{r.handle, q.cq->capacity(), len});
  rep.fds.push_back(fd);
  return 0;
}

int ShimServer::op_create_srq(Client& c, CtlRequest& req, CtlReply& rep) {
  CreateSrqReq r;
  if (!body_as(req, &r) || !c.pds.count(r.pd)) return EINVAL;
  const transport::Limits& lim = env_.dev->limits();
  if (r.max_wr == 0 || r.max_wr > lim.max_srq_wr || r.max_sge == 0 ||
      r.max_sge > lim.max_sge)
    return EINVAL;
  if (over_limit("max_srq", c.srqs.size(), 1, env_.client_limits.max_srq) ||
      over_limit("max_wr", c.wrs, r.max_wr, env_.client_limits.max_wr))
    return ENOMEM;
  const uint32_t slots = ring_slots(r.max_wr);
  Mapping m;
  const size_t len = srq_shared_len(slots);
  const int fd = make_shared(len, "urnic-srq", &m);
  if (fd < 0) return -fd;
  auto s = std::make_unique<SrqObj>();
  s->mem = m;
  s->sh = new (m.base) SrqShared;
  s->size = slots;
  s->sh->size = slots;
  const auto ring_off = static_cast<uint32_t>(page_round(sizeof(SrqShared)));
  s->sh->offset = ring_off;
  s->ring =
      reinterpret_cast<ShmRecvWqe*>(static_cast<uint8_t*>(m.base) + ring_off);
  s->pd = r.pd;
  const uint32_t h = c.next_handle;  // taken once created
  int rc;
  {
    ParkAll park(all_gates());
    rc = env_.dev->create_srq(c.pds[r.pd], slots, r.max_sge, &s->srq);
    if (!rc) {
      s->srq->set_publish(&s->sh->done);
      s->srq->set_owner({c.info.id, h});
      s->srq->set_recv_ring(s.get());
      s->home = pick_home();
      s->doorbell = alloc_doorbell(c, s->home);
      if (s->doorbell == UINT32_MAX) {
        env_.dev->destroy_srq(s->srq);
        rc = ENOMEM;
      } else {
        target(c, s->doorbell) = {nullptr, s.get()};
      }
    }
  }
  if (rc) {
    unmap(m);
    close(fd);
    return rc;
  }
  ++c.next_handle;
  reply_with(rep, CreateSrqRep{h, slots, r.max_sge, s->doorbell, len});
  s->wrs = r.max_wr;
  c.wrs += s->wrs;
  c.srqs[h] = std::move(s);
  rep.fds.push_back(fd);
  return 0;
}

int ShimServer::destroy_srq(Client& c, uint32_t h) {
  auto it = c.srqs.find(h);
  if (it == c.srqs.end()) return EINVAL;
  SrqObj& s = *it->second;
  {
    ParkAll park(all_gates());
    const int rc = env_.dev->destroy_srq(s.srq);
    if (rc) return rc;
    free_doorbell(c, s.doorbell);
  }
  unmap(s.mem);
  c.wrs -= s.wrs;
  c.srqs.erase(it);
  return 0;
}

int ShimServer::op_create_qp(Client& c, CtlRequest& req, CtlReply& rep) {
  CreateQpReq r;
  if (!body_as(req, &r)) return EINVAL;
  if (!c.pds.count(r.pd) || !c.cqs.count(r.send_cq) ||
      !c.cqs.count(r.recv_cq) || (r.srq != kNoHandle && !c.srqs.count(r.srq)))
    return EINVAL;
  if (r.qp_type != IBV_QPT_RC && r.qp_type != IBV_QPT_UC &&
      r.qp_type != IBV_QPT_UD) {
    why_ = "urnic supports RC, UC and UD QPs";
    return EOPNOTSUPP;
  }
  const uint64_t wrs = uint64_t{r.cap.max_send_wr} +
                       (r.srq != kNoHandle ? 0 : r.cap.max_recv_wr);
  if (over_limit("max_qp", c.qps.size(), 1, env_.client_limits.max_qp) ||
      over_limit("max_wr", c.wrs, wrs, env_.client_limits.max_wr))
    return ENOMEM;
  transport::QpInitAttr a;
  a.qp_type = static_cast<ibv_qp_type>(r.qp_type);
  a.pd = c.pds[r.pd];
  a.send_cq = c.cqs[r.send_cq].cq;
  a.recv_cq = c.cqs[r.recv_cq].cq;
  a.srq = r.srq != kNoHandle ? c.srqs[r.srq]->srq : nullptr;
  a.cap = r.cap;
  a.sq_sig_all = r.sq_sig_all != 0;
  if (r.create_flags & ~uint32_t{IBV_QP_CREATE_BLOCK_SELF_MCAST_LB}) {
    why_ = "of the QP create flags urnic takes only BLOCK_SELF_MCAST_LB";
    return EOPNOTSUPP;
  }
  a.block_self_mcast_lb = r.create_flags & IBV_QP_CREATE_BLOCK_SELF_MCAST_LB;
  auto q = std::make_unique<QpObj>();
  q->pd = r.pd;
  q->send_cq = r.send_cq;
  q->recv_cq = r.recv_cq;
  q->srq = r.srq;
  // The QP lives on one worker: its requester, responder, completer,
  // timers and doorbell run there. QPs of an SRQ go where the SRQ is.
  q->home = r.srq != kNoHandle ? c.srqs[r.srq]->home : pick_home();
  transport::Engine& eng = *env_.engines[q->home];
  // The rings' memory is made before parking (memfd, mmap: system calls
  // the home lcore need not wait for), sized as the engine will grant:
  // powers of two, no receive ring with an SRQ.
  const transport::Limits& lim = env_.dev->limits();
  if (r.cap.max_send_wr > lim.max_qp_wr || r.cap.max_recv_wr > lim.max_qp_wr)
    return EINVAL;
  const uint32_t sq = ring_slots(r.cap.max_send_wr);
  const uint32_t rq = r.srq != kNoHandle ? 0 : ring_slots(r.cap.max_recv_wr);
  const int fd = make_shared(qp_shared_len(sq, rq), "urnic-qp", &q->mem);
  if (fd < 0) return -fd;
  uint8_t* base = static_cast<uint8_t*>(q->mem.base);
  q->sh = new (base) QpShared;
  q->sq_size = sq;
  q->rq_size = rq;
  q->sh->sq_size = sq;
  q->sh->rq_size = rq;
  const auto sq_off = static_cast<uint32_t>(page_round(sizeof(QpShared)));
  const auto rq_off = static_cast<uint32_t>(
      sq_off + page_round(size_t{sq} * sizeof(ShmSendWqe)));
  q->sh->sq_offset = sq_off;
  q->sh->rq_offset = rq_off;
  q->sq = reinterpret_cast<ShmSendWqe*>(base + sq_off);
  q->rq = reinterpret_cast<ShmRecvWqe*>(base + rq_off);
  const uint32_t h = c.next_handle;  // taken once created
  int rc;
  {
    ParkGuard park(*env_.gates[q->home]);
    rc = eng.create_qp(a, &q->qp);
    if (!rc && (a.cap.max_send_wr != sq || a.cap.max_recv_wr != rq)) {
      eng.destroy_qp(q->qp);  // the engine granted other sizes: a bug
      rc = EPROTO;
    }
    if (!rc) {
      q->doorbell = alloc_doorbell(c, q->home);
      if (q->doorbell == UINT32_MAX) {
        rc = ENOMEM;
        eng.destroy_qp(q->qp);
      } else {
        q->qp->pub_sq_done_ = &q->sh->sq_done;
        q->qp->pub_rq_done_ = &q->sh->rq_done;
        q->qp->pub_state_ = &q->sh->state;
        q->qp->recv_ring_ = q.get();
        q->qp->set_owner({c.info.id, h});
        target(c, q->doorbell) = {q.get(), nullptr};
      }
    }
  }
  if (rc) {
    unmap(q->mem);
    close(fd);
    return rc;
  }
  ++c.next_handle;
  CreateQpRep out;
  out.handle = h;
  out.qpn = q->qp->qpn();
  out.cap = a.cap;
  out.doorbell = q->doorbell;
  out.map_len = q->mem.len;
  reply_with(rep, out);
  rep.fds.push_back(fd);
  q->wrs = static_cast<uint32_t>(wrs);
  c.wrs += q->wrs;
  c.qps[h] = std::move(q);
  return 0;
}

int ShimServer::op_modify_qp(Client& c, CtlRequest& req, CtlReply& rep) {
  ModifyQpReq r;
  if (!body_as(req, &r) || !c.qps.count(r.handle)) return EINVAL;
  // The enum fields come from the application: a value the enum does not
  // hold is undefined behaviour once read as the enum. Those the mask
  // selects are checked as raw words; the others (garbage is allowed there,
  // ibv_modify_qp ignores them) are cleared before anything reads them.
  auto sane = [&](auto& field, int bit, uint32_t max) {
    static_assert(sizeof field == sizeof(uint32_t));
    uint32_t v;
    std::memcpy(&v, &field, sizeof v);
    if (!(r.mask & bit)) {
      std::memset(&field, 0, sizeof field);
      return true;
    }
    return v <= max;
  };
  // Every field is cleared or checked, whatever the others hold.
  int bad = 0;
  bad += !sane(r.attr.qp_state, IBV_QP_STATE, IBV_QPS_UNKNOWN);
  bad += !sane(r.attr.cur_qp_state, IBV_QP_CUR_STATE, IBV_QPS_UNKNOWN);
  bad += !sane(r.attr.path_mtu, IBV_QP_PATH_MTU, IBV_MTU_4096);
  bad += !sane(r.attr.path_mig_state, IBV_QP_PATH_MIG_STATE, IBV_MIG_ARMED);
  if (bad) {
    why_ = "a QP state, path MTU or migration state out of range";
    return EINVAL;
  }
  if ((r.mask & IBV_QP_QKEY) && (r.attr.qkey & 0x80000000u) &&
      !may_set_controlled_qkey(c.info)) {
    why_ =
        "a Q_Key with bit 31 set (a controlled Q_Key) needs CAP_NET_RAW, as "
        "on Linux";
    return EPERM;
  }
  QpObj& q = *c.qps[r.handle];
  // Resolve the peer's MAC before parking the lcore that answers ARP.
  if ((r.mask & IBV_QP_AV) && r.attr.ah_attr.is_global && env_.warm_neighbour) {
    const int rc = env_.warm_neighbour(r.attr.ah_attr.grh.dgid.raw, req.attempt,
                                       req.since_ns);
    if (rc == EINPROGRESS) {
      rep.later = true;
      return 0;
    }
    if (rc) {
      why_ =
          "cannot resolve the destination GID's MAC address (no ARP/ND "
          "answer)";
      return rc;
    }
  }
  int rc;
  const char* reason = nullptr;
  {
    ParkGuard park(*env_.gates[q.home]);
    rc = env_.engines[q.home]->modify_qp(q.qp, r.attr, r.mask, &reason);
    if (!rc && q.qp->state() == IBV_QPS_RESET) {
      // RESET empties the queues: WQEs not yet taken are dropped, and the
      // application's indices carry on (the bias keeps "done" == posted).
      q.sq_seen = q.sh->sq_prod.load(std::memory_order_acquire);
      q.rq_seen = q.sh->rq_prod.load(std::memory_order_acquire);
      q.qp->sq_pub_bias_ = q.sq_seen;
      q.qp->rq_pub_bias_ = q.rq_seen;
      q.qp->publish_sq();
      q.qp->publish_rq();
      q.broken = false;
    }
  }
  if (rc) {
    if (why_.empty())
      why_ = reason ? std::string("modify_qp refused: ") + reason
                    : "modify_qp refused by the QP state machine";
    return rc;
  }
  reply_with(rep, ModifyQpRep{static_cast<uint32_t>(q.qp->state())});
  return 0;
}

int ShimServer::op_query_qp(Client& c, CtlRequest& req, CtlReply& rep) {
  HandleReq hr;
  if (!body_as(req, &hr) || !c.qps.count(hr.handle)) return EINVAL;
  QueryQpRep out;
  transport::QpInitAttr init;
  int rc;
  {
    const QpObj& q = *c.qps[hr.handle];
    ParkGuard park(*env_.gates[q.home]);
    rc = env_.engines[q.home]->query_qp(q.qp, &out.attr, &init);
  }
  if (rc) return rc;
  out.cap = init.cap;
  out.sq_sig_all = init.sq_sig_all;
  reply_with(rep, out);
  return 0;
}

int ShimServer::destroy_qp(Client& c, uint32_t h) {
  auto it = c.qps.find(h);
  if (it == c.qps.end()) return EINVAL;
  QpObj& q = *it->second;
  if (q.qp->mcast_ != 0) {
    why_ = "the QP is attached to multicast groups: ibv_detach_mcast first";
    return EBUSY;  // as the kernel's uverbs says
  }
  {
    ParkGuard park(*env_.gates[q.home]);
    // What the application posted before the destroy leaves first, as on
    // rxe (which sends a UD WQE within ibv_post_send) or a NIC (at its
    // doorbell). A protocol over UD may post its last ACK and destroy the
    // QP at once: libfabric's ofi_rxd does at fi_close, and its peer,
    // left without the ACK, waited for ever (1 in ~40 fi_pingpong runs on
    // a loaded host). Only the lcore sends: it runs one pass for it.
    if (sends_untaken(q)) {
      ctr_.sends_at_destroy.fetch_add(1, std::memory_order_relaxed);
      run_one_pass(*env_.gates[q.home]);
    }
    const int rc = env_.engines[q.home]->destroy_qp(q.qp);
    if (rc) return rc;
    free_doorbell(c, q.doorbell);
  }
  unmap(q.mem);
  c.wrs -= q.wrs;
  c.qps.erase(it);
  return 0;
}

// The event names its object's owner: one lookup, whatever the number of
// clients and objects (a mass flush raises one per QP). The object must
// still be the client's: an event raised just before a destroy is dropped.
bool ShimServer::send_async(const transport::AsyncEvent& ev) {
  const auto it = clients_.find(ev.owner.client);
  if (it == clients_.end()) return false;
  Client& c = *it->second;
  const uint32_t h = ev.owner.handle;
  bool live;
  if (ev.cq) {
    const auto q = c.cqs.find(h);
    live = q != c.cqs.end() && q->second.cq == ev.cq;
  } else if (ev.srq) {
    const auto s = c.srqs.find(h);
    live = s != c.srqs.end() && s->second->srq == ev.srq;
  } else {
    const auto q = c.qps.find(h);
    live = q != c.qps.end() && q->second->qp->qpn() == ev.qpn;
  }
  return live && send_to(c, {ev.type, h});
}

bool ShimServer::send_to(Client& c, const AsyncMsg& m) {
  if (c.async_fd < 0) return false;
  if (c.async_backlog.empty()) {  // else behind the older ones
    if (send(c.async_fd, &m, sizeof m, MSG_DONTWAIT | MSG_NOSIGNAL) == sizeof m)
      return true;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return false;  // gone
  }
  if (c.async_backlog.size() >= kMaxAsyncBacklog) return false;
  c.async_backlog.push_back(m);
  async_backlog_ = true;
  ctr_.async_deferred.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool ShimServer::flush_async(Client& c) {
  while (!c.async_backlog.empty()) {
    const AsyncMsg& m = c.async_backlog.front();
    if (send(c.async_fd, &m, sizeof m, MSG_DONTWAIT | MSG_NOSIGNAL) !=
        sizeof m) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
      // The application is gone: its close follows.
      ctr_.async_dropped.fetch_add(c.async_backlog.size(),
                                   std::memory_order_relaxed);
      c.async_backlog.clear();
      break;
    }
    c.async_backlog.pop_front();
  }
  return true;
}

void ShimServer::flush_async() {
  bool left = false;
  for (auto& [id, cp] : clients_) left |= !flush_async(*cp);
  async_backlog_ = left;
}

void ShimServer::forget_async(Client& c, uint32_t handle) {
  std::erase_if(c.async_backlog,
                [handle](const AsyncMsg& m) { return m.handle == handle; });
}

void ShimServer::broadcast(const AsyncMsg& m) {
  for (auto& [id, cp] : clients_)
    (send_to(*cp, m) ? ctr_.async_events : ctr_.async_dropped)
        .fetch_add(1, std::memory_order_relaxed);
}

int ShimServer::drop_mr_range(Client& c, MrObj& m, transport::Mr* fresh) {
  {
    ParkAll park(all_gates());
    // Unmapping it now would let the lcore touch freed memory; the
    // application deregisters once its WRs completed.
    bool in_use = false;
    for (const transport::Engine* e : env_.engines)
      in_use = in_use || e->mr_in_use(*m.mr);
    if (in_use) {
      why_ =
          "the MR is still in use (work requests posted on it have not "
          "completed, or a transfer into it is under way)";
      return EBUSY;
    }
    // EBUSY while memory windows are bound to it (verbs).
    if (const int rc =
            fresh ? env_.dev->rereg_mr(m.mr, fresh) : env_.dev->dereg_mr(m.mr))
      return rc;
    if (env_.tx_memory) env_.tx_memory->remove(m.view.base);
  }
  retire_view(m.view);
  c.mr_bytes -= m.bytes;
  return 0;
}

void ShimServer::retire_view(Mapping& m) {
  if (env_.tx_memory && env_.tx_memory->busy(m.base))
    retired_views_.push_back(m);
  else
    unmap(m);
  m = {};
}

void ShimServer::unmap_retired() {
  std::erase_if(retired_views_, [&](Mapping& m) {
    if (env_.tx_memory->busy(m.base)) return false;
    unmap(m);
    return true;
  });
}

bool ShimServer::start_dma(PendingMr& p) {
  if (dma_mapping_ >= kMaxDmaMapping) return false;
  p.dma = env_.tx_memory->map_dma(p.view.base, p.view.len);
  ++dma_mapping_;
  return true;
}

void ShimServer::finish_abandoned(bool wait) {
  std::erase_if(abandoned_mrs_, [&](PendingMr& p) {
    if (p.dma.valid()) {
      if (!wait &&
          p.dma.wait_for(std::chrono::seconds(0)) != std::future_status::ready)
        return false;
      // map() takes the DMA mapping over; remove() and retire_view() give
      // it back with the view.
      const int dma_error = p.dma.get();
      --dma_mapping_;
      if (env_.tx_memory->map(p.view.base, p.view.len, dma_error))
        env_.tx_memory->remove(p.view.base);
    }
    retire_view(p.view);  // never started: nothing was mapped
    return true;
  });
}

void ShimServer::pump_events() {
  if (!retired_views_.empty()) unmap_retired();
  if (!abandoned_mrs_.empty()) finish_abandoned(false);
  if (async_backlog_) flush_async();
  transport::AsyncEvent ev;
  while (env_.dev->next_event(&ev)) {
    if (send_async(ev))
      ctr_.async_events.fetch_add(1, std::memory_order_relaxed);
    else
      ctr_.async_dropped.fetch_add(1, std::memory_order_relaxed);
  }
}

void ShimServer::port_event(bool up) {
  broadcast({up ? IBV_EVENT_PORT_ACTIVE : IBV_EVENT_PORT_ERR, 1});
}

void ShimServer::shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  {
    ParkAll park(all_gates());  // returns at once: the lcores have stopped
    for (auto& [id, cp] : clients_)
      for (auto& [h, q] : cp->qps) env_.engines[q->home]->to_error(*q->qp);
    // WQEs posted but not yet taken complete too (posted in ERR: flushed),
    // or an application waiting for them would wait forever.
    uint32_t taken = 0;
    for (auto& [id, cp] : clients_)
      for (auto& [h, q] : cp->qps) drain_qp_st(*cp, *q, &taken);
  }
  pump_events();
  // Completions are all written: an empty CQ now means "never more".
  for (Client* c : live_) c->db->closed.store(1, std::memory_order_release);
  broadcast({IBV_EVENT_DEVICE_FATAL, 0});
}

void ShimServer::mcast_changed(const transport::Gid& g, bool joined) {
  (joined ? ctr_.mcast_joins : ctr_.mcast_leaves)
      .fetch_add(1, std::memory_order_relaxed);
  if (env_.mcast_changed) env_.mcast_changed(g.data(), joined);
}

std::vector<std::pair<const char*, uint64_t>> ShimServer::stats() const {
  auto r = [](const std::atomic<uint64_t>& a) {
    return a.load(std::memory_order_relaxed);
  };
  const transport::Device& d = *env_.dev;
  return {{"clients_open", live_.size()},
          {"mr_pages_truncated", foreign::faults()},
          {"clients", r(ctr_.clients)},
          {"clients_closed", r(ctr_.clients_closed)},
          {"requests", r(ctr_.requests)},
          {"request_errors", r(ctr_.request_errors)},
          {"doorbells", r(ctr_.doorbells)},
          {"bad_wqes", r(ctr_.bad_wqes)},
          {"async_events", r(ctr_.async_events)},
          {"async_deferred", r(ctr_.async_deferred)},
          {"async_dropped", r(ctr_.async_dropped)},
          {"client_limit_refusals", r(ctr_.client_limit_refusals)},
          {"mcast_joins", r(ctr_.mcast_joins)},
          {"mcast_leaves", r(ctr_.mcast_leaves)},
          {"sends_at_destroy", r(ctr_.sends_at_destroy)},
          {"mcast_groups", d.mcast_groups()},
          {"mcast_attached", d.mcast_attached()},
          {"qps", qp_count()},
          {"mrs", d.num_mrs()},
          {"cqs", d.num_cqs()},
          {"pds", d.num_pds()}};
}

std::string ShimServer::objects_text() const {
  const transport::Device& d = *env_.dev;
  std::string s =
      "device: pds " + std::to_string(d.num_pds()) + " mrs " +
      std::to_string(d.num_mrs()) + " cqs " + std::to_string(d.num_cqs()) +
      " srqs " + std::to_string(d.num_srqs()) + " ahs " +
      std::to_string(d.num_ahs()) + " qps " + std::to_string(qp_count()) + "\n";
  s += "clients: " + std::to_string(live_.size()) + "\n";
  for (const auto& [id, cp] : clients_) {
    const Client& c = *cp;
    if (!c.open) continue;
    s += "  client " + std::to_string(id) + " pid " +
         std::to_string(c.info.pid) + " uid " + std::to_string(c.info.uid) +
         ": pds " + std::to_string(c.pds.size()) + " mrs " +
         std::to_string(c.mrs.size()) + " cqs " + std::to_string(c.cqs.size()) +
         " srqs " + std::to_string(c.srqs.size()) + " qps " +
         std::to_string(c.qps.size()) + " ahs " + std::to_string(c.ahs.size()) +
         " channels " + std::to_string(c.channels.size()) + "\n";
  }
  return s;
}

std::vector<std::pair<uint32_t, pid_t>> ShimServer::qp_owners() const {
  std::vector<std::pair<uint32_t, pid_t>> out;
  for (const auto& [id, cp] : clients_)
    for (const auto& [h, q] : cp->qps)
      out.emplace_back(q->qp->qpn(), cp->info.pid);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace urnic::service
