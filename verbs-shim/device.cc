// Devices and contexts: the merged device list, ibv_open_device /
// ibv_close_device, the device/port/GID/P_Key queries and the sysfs files
// tools read about urnic devices.
#include <endian.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string_view>
#include <vector>

#include "verbs-shim/ctl.h"
#include "verbs-shim/shim.h"

URNIC_EXPORT int ibv_read_sysfs_file(const char* dir, const char* file,
                                     char* buf, size_t size);

namespace urnic::shim {

// Each context's cmd_fd is a memfd of this name: its /proc/self/fd link
// (the whole string) is how ibv_import_device knows it; memfd_create takes
// the part after "/memfd:".
constexpr std::string_view kCmdFdLink = "/memfd:urnic-cmd-fd";
constexpr const char* kCmdFdName = kCmdFdLink.data() + kCmdFdLink.find(':') + 1;
namespace {

constexpr const char* kDefaultSocket = "/run/urnic/urnicd.sock";

struct Registry {
  Device devices[kMaxDevices];
  int ndev = 0;
  std::once_flag paths_once;
  std::mutex lists_mu;
  std::map<ibv_device**, ibv_device**> lists;  // merged -> real
  std::mutex ctx_mu;
  std::vector<Context*> contexts;
};

Registry& reg() {
  static Registry* r = new Registry;  // never destroyed: used until exit
  return *r;
}

// URNIC_SOCKET is read once: device names stay what they were first.
void init_paths() {
  Registry& r = reg();
  std::call_once(r.paths_once, [&r] {
    const char* env = getenv("URNIC_SOCKET");
    const std::string all = env && *env ? env : kDefaultSocket;
    size_t pos = 0;
    while (pos <= all.size() && r.ndev < kMaxDevices) {
      size_t end = all.find(':', pos);
      if (end == std::string::npos) end = all.size();
      if (end > pos) {
        Device& d = r.devices[r.ndev];
        d.index = r.ndev;
        d.path = all.substr(pos, end - pos);
        d.dev.node_type = IBV_NODE_CA;
        d.dev.transport_type = IBV_TRANSPORT_IB;
        snprintf(d.dev.name, sizeof d.dev.name, "urnic%d", d.index);
        snprintf(d.dev.dev_name, sizeof d.dev.dev_name, "urnic_uverbs%d",
                 d.index);
        snprintf(d.dev.dev_path, sizeof d.dev.dev_path,
                 "/sys/class/infiniband_verbs/urnic_uverbs%d", d.index);
        snprintf(d.dev.ibdev_path, sizeof d.dev.ibdev_path,
                 "/sys/class/infiniband/urnic%d", d.index);
        ++r.ndev;
      }
      pos = end + 1;
    }
  });
}

void report_unreachable(Device& d, int err, HelloFail how,
                        const std::string& text) {
  if (d.down_reported.exchange(true)) return;
  if (how == HelloFail::kConnect && (err == EACCES || err == EPERM))
    say("no permission to connect to urnicd at %s (%s): the socket's mode "
        "is urnicd's control.mode, its owner and group those of the user "
        "that started urnicd",
        d.path.c_str(), strerror(err));
  else if (how == HelloFail::kConnect && err == ETIMEDOUT)
    say("urnicd at %s accepts no connections (its backlog stayed full for "
        "60 s: stopped or wedged?)",
        d.path.c_str());
  else if (how == HelloFail::kConnect)
    say("service not running at %s (connect: %s); set URNIC_SOCKET",
        d.path.c_str(), strerror(err));
  else if (how == HelloFail::kRefused)
    say("urnicd at %s refused us: %s", d.path.c_str(), text.c_str());
  else
    say("urnicd at %s did not answer (%s)", d.path.c_str(), strerror(err));
}

// Opens a service connection as ibv_open_device does. On success *fd is
// the control socket, *async_fd our end of the event socket, *db_fd the
// doorbell page, and bells[0 .. info->homes) the worker lcores' bells.
int open_connection(Device& d, char* buf, OpenRep* info, int* fd, int* async_fd,
                    int* db_fd, int bells[kSummaryWords]) {
  int rc = connect_service(d.path, fd);
  if (rc) {
    report_unreachable(d, rc, HelloFail::kConnect, "");
    return ENODEV;
  }
  int sp[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) != 0) {
    rc = errno;
    close(*fd);
    return rc;
  }
  OpenReq req;
  req.pid = static_cast<uint32_t>(getpid());
  Reply r;
  rc = transact(*fd, static_cast<uint16_t>(Op::kOpen), &req, sizeof req, &sp[1],
                1, buf, urnic::ctl::kMaxMsg, &r, 10000);
  close(sp[1]);
  if (rc == 0 && r.status < 0) {
    // Version mismatches and permission refusals: always worth a line.
    say("urnicd at %s refused to open %s: %.*s", d.path.c_str(), d.dev.name,
        static_cast<int>(r.payload.size()), r.payload.data());
    rc = -r.status;
  } else if (rc == 0 &&
             (r.payload.size() != sizeof(OpenRep) || r.nfds < 1 ||
              reinterpret_cast<const OpenRep*>(r.payload.data())->homes == 0 ||
              reinterpret_cast<const OpenRep*>(r.payload.data())->homes >
                  kSummaryWords ||
              static_cast<uint32_t>(r.nfds) !=
                  1 + reinterpret_cast<const OpenRep*>(r.payload.data())
                          ->homes)) {
    say("urnicd at %s: malformed open reply (is it the urnicd this "
        "liburnic-verbs.so was built with?)",
        d.path.c_str());
    rc = EPROTO;
  } else if (rc) {
    say("urnicd at %s did not answer the open (%s)", d.path.c_str(),
        strerror(rc));
    rc = ENODEV;
  }
  if (rc == 0) {
    std::memcpy(info, r.payload.data(), sizeof *info);
    if (info->abi != kShimAbi) {
      say("urnicd at %s speaks shim ABI %u, this liburnic-verbs.so %u",
          d.path.c_str(), info->abi, kShimAbi);
      rc = EPROTONOSUPPORT;
    }
  }
  if (rc) {
    r.close_fds();
    close(sp[0]);
    close(*fd);
    return rc;
  }
  *async_fd = sp[0];
  *db_fd = r.fds[0];
  for (uint32_t h = 0; h < info->homes; ++h) bells[h] = r.fds[1 + h];
  return 0;
}

// --- context ops
// ---------------------------------------------------------------

int query_device(ibv_context* c, ibv_device_attr* attr) {
  *attr = ctx_of(c).info.device;
  return 0;
}

int query_device_ex(ibv_context* c, const ibv_query_device_ex_input* input,
                    ibv_device_attr_ex* attr, size_t attr_size) {
  if (input && input->comp_mask) return EINVAL;
  if (attr_size < sizeof(ibv_device_attr)) return EINVAL;
  const Context& ctx = ctx_of(c);
  ibv_device_attr_ex a{};
  a.orig_attr = ctx.info.device;
  a.device_cap_flags_ex = ctx.info.device.device_cap_flags;
  a.phys_port_cnt_ex = ctx.info.device.phys_port_cnt;
  std::memset(attr, 0, attr_size);
  std::memcpy(attr, &a, std::min(attr_size, sizeof a));
  return 0;
}

int query_port_full(ibv_context* c, uint8_t port, ibv_port_attr* out) {
  if (port != 1) return EINVAL;
  Context& ctx = ctx_of(c);
  ibv_port_attr pa{};
  const int rc = ctx.call(Op::kQueryPort, "ibv_query_port", nullptr, 0, nullptr,
                          0, &pa, sizeof pa);
  if (rc) return rc;
  *out = pa;
  return 0;
}

int query_port_op(ibv_context* c, uint8_t port, ibv_port_attr* attr,
                  size_t attr_len) {
  ibv_port_attr pa;
  const int rc = query_port_full(c, port, &pa);
  if (rc) return rc;
  std::memset(attr, 0, attr_len);
  std::memcpy(attr, &pa, std::min(attr_len, sizeof pa));
  return 0;
}

// The pre-1.1 layout ends at `flags`.
constexpr size_t kCompatPortAttrLen = offsetof(ibv_port_attr, flags) + 1;

int compat_query_port(ibv_context* c, uint8_t port,
                      _compat_ibv_port_attr* attr) {
  ibv_port_attr pa;
  const int rc = query_port_full(c, port, &pa);
  if (rc) return rc;
  std::memcpy(attr, &pa, kCompatPortAttrLen);
  return 0;
}

uint32_t gid_table_len(const Context& c) {
  return c.info.port.gid_tbl_len > 0
             ? static_cast<uint32_t>(c.info.port.gid_tbl_len)
             : c.info.num_gids;
}

}  // namespace

std::string cm_service_path() {
  init_paths();
  Registry& r = reg();
  return r.ndev ? r.devices[0].path : std::string(kDefaultSocket);
}

Device* urnic_device(const ibv_device* d) {
  Registry& r = reg();
  // Ours are the `dev` members of one array: a range check first.
  const auto p = reinterpret_cast<uintptr_t>(d);
  if (p < reinterpret_cast<uintptr_t>(&r.devices[0]) ||
      p >= reinterpret_cast<uintptr_t>(&r.devices[kMaxDevices]))
    return nullptr;
  for (Device& dev : r.devices)
    if (d == &dev.dev) return &dev;
  return nullptr;
}

bool device_info(Device& d, OpenRep* out) {
  std::lock_guard g(d.mu);
  if (!d.have_info) {
    // A short-lived connection: the guid and the attributes are asked for
    // before any context exists (ibv_devices, sysfs readers).
    std::unique_ptr<char[]> buf(new char[urnic::ctl::kMaxMsg]);
    int fd, async_fd, db_fd, bells[kSummaryWords];
    if (open_connection(d, buf.get(), &d.info, &fd, &async_fd, &db_fd, bells))
      return false;
    close(fd);
    close(async_fd);
    close(db_fd);
    for (uint32_t h = 0; h < d.info.homes; ++h) close(bells[h]);
    d.have_info = true;
  }
  *out = d.info;
  return true;
}

void register_context(Context* c) {
  std::lock_guard g(reg().ctx_mu);
  reg().contexts.push_back(c);
}

void unregister_context(Context* c) {
  std::lock_guard g(reg().ctx_mu);
  std::erase(reg().contexts, c);
}

// Fork: the child must not speak on (or keep) its parent's connections.
void fork_prepare_contexts() {
  reg().ctx_mu.lock();
  for (Context* c : reg().contexts) c->obj_mu.lock();
}
void fork_parent_contexts() {
  for (Context* c : reg().contexts) c->obj_mu.unlock();
  reg().ctx_mu.unlock();
}
// Only async-signal-safe calls here (the parent may have had threads).
void fork_child_contexts() {
  // The event sockets keep their numbers (the program holds them) but
  // become a socket whose peer is gone: reads see end-of-file, never the
  // parent's events.
  int sp[2] = {-1, -1};
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) == 0)
    close(sp[1]);
  for (Context* c : reg().contexts) {
    c->in_child.store(true);
    c->dead.store(true);
    if (c->ctl_fd >= 0) close(c->ctl_fd);
    c->ctl_fd = -1;
    if (sp[0] >= 0) {
      if (c->ibv()->async_fd >= 0) dup3(sp[0], c->ibv()->async_fd, O_CLOEXEC);
      for (int fd : c->channel_fds) dup3(sp[0], fd, O_CLOEXEC);
    }
    c->obj_mu.unlock();
  }
  if (sp[0] >= 0) close(sp[0]);
  reg().ctx_mu.unlock();
}

}  // namespace urnic::shim

using namespace urnic::shim;

// --- importing a device
// ------------------------------------------------------------

// ibv_import_device takes a kernel device's command fd. A urnic context's
// cmd_fd (or a dup of it) is a placeholder: there is nothing to import, as
// for ibv_import_pd/mr (verbs.def). Any other fd goes to libibverbs.
URNIC_EXPORT ibv_context* ibv_import_device(int cmd_fd) {
  char link[64], target[64];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", cmd_fd);
  const ssize_t n = readlink(link, target, sizeof target - 1);
  if (n > 0 && std::string_view(target, static_cast<size_t>(n))
                   .starts_with(kCmdFdLink)) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  if (auto real = URNIC_REAL(ibv_import_device, "IBVERBS_1.10"))
    return real(cmd_fd);
  errno = EOPNOTSUPP;
  return nullptr;
}

// --- device list
// -------------------------------------------------------------------

URNIC_EXPORT ibv_device** ibv_get_device_list(int* num_devices) {
  init_paths();
  Registry& r = reg();
  ibv_device** real_list = nullptr;
  int nreal = 0;
  if (auto real = URNIC_REAL(ibv_get_device_list, "IBVERBS_1.1")) {
    // Without kernel RDMA support this fails (ENOSYS); ours still count.
    real_list = real(&nreal);
    if (!real_list) nreal = 0;
  }
  std::vector<ibv_device*> ours;
  for (int i = 0; i < r.ndev; ++i) {
    Device& d = r.devices[i];
    std::string text;
    HelloFail how;
    const int rc = hello(d.path, &text, &how);
    if (rc == 0) {
      d.down_reported = false;
      ours.push_back(&d.dev);
    } else {
      report_unreachable(d, rc, how, text);
    }
  }
  // urnic devices first: a tool's default (the first device) is ours.
  const size_t n = ours.size() + static_cast<size_t>(nreal);
  auto** list = static_cast<ibv_device**>(calloc(n + 1, sizeof(ibv_device*)));
  if (!list) {
    if (real_list)
      if (auto f = URNIC_REAL(ibv_free_device_list, "IBVERBS_1.1"))
        f(real_list);
    errno = ENOMEM;
    return nullptr;
  }
  std::copy(ours.begin(), ours.end(), list);
  for (int i = 0; i < nreal; ++i) list[ours.size() + i] = real_list[i];
  {
    std::lock_guard g(r.lists_mu);
    r.lists[list] = real_list;
  }
  if (num_devices) *num_devices = static_cast<int>(n);
  return list;
}

URNIC_EXPORT void ibv_free_device_list(ibv_device** list) {
  Registry& r = reg();
  ibv_device** real_list = nullptr;
  {
    std::lock_guard g(r.lists_mu);
    auto it = r.lists.find(list);
    if (it == r.lists.end()) {
      if (auto f = URNIC_REAL(ibv_free_device_list, "IBVERBS_1.1")) f(list);
      return;
    }
    real_list = it->second;
    r.lists.erase(it);
  }
  free(list);
  if (real_list)
    if (auto f = URNIC_REAL(ibv_free_device_list, "IBVERBS_1.1")) f(real_list);
}

const char* ours::ibv_get_device_name(ibv_device* device) {
  return urnic_device(device)->dev.name;
}

__be64 ours::ibv_get_device_guid(ibv_device* device) {
  OpenRep info;
  return device_info(*urnic_device(device), &info) ? info.node_guid : 0;
}

// --- open / close
// ----------------------------------------------------------------------

// What libibverbs' inline wrappers (ibv_poll_cq, ibv_post_send, ...) and
// its legacy queries call through the context: one table, set whole at
// open, as rdma-core's providers set theirs. Declaration order (C++20).
constexpr ibv_context_ops kContextOps = {
    ._compat_query_device = query_device,
    ._compat_query_port = compat_query_port,
    .alloc_mw = alloc_mw,
    .bind_mw = bind_mw,
    .dealloc_mw = dealloc_mw,
    .poll_cq = poll_cq,
    .req_notify_cq = req_notify_cq,
    .post_srq_recv = post_srq_recv,
    .post_send = post_send,
    .post_recv = post_recv,
};

ibv_context* ours::ibv_open_device(ibv_device* device) {
  Device* d = urnic_device(device);
  install_fork_handlers();
  auto* ctx = new (std::nothrow) Context;
  if (!ctx) {
    errno = ENOMEM;
    return nullptr;
  }
  ctx->rx.reset(new (std::nothrow) char[urnic::ctl::kMaxMsg]);
  int fd = -1, async_fd = -1, db_fd = -1;
  int rc = ctx->rx ? open_connection(*d, ctx->rx.get(), &ctx->info, &fd,
                                     &async_fd, &db_fd, ctx->bells.data())
                   : ENOMEM;
  if (rc == 0) {
    ctx->db_len = page_round(sizeof(DoorbellPage));
    ctx->db = static_cast<DoorbellPage*>(map_service_fd(db_fd, ctx->db_len));
    if (!ctx->db) {
      rc = errno;
      close(fd);
      close(async_fd);
      ctx->close_bells();
    }
  }
  if (rc) {
    delete ctx;
    errno = rc;
    return nullptr;
  }
  {
    std::lock_guard g(d->mu);
    d->info = ctx->info;
    d->have_info = true;
  }
  d->lost_reported = false;
  ctx->dev = d;
  ctx->ctl_fd = fd;

  ctx->box.self = ctx;
  verbs_context& v = ctx->box.vctx;
  v.sz = sizeof(verbs_context);
  v.query_port = query_port_op;
  v.query_device_ex = query_device_ex;
  v.create_cq_ex = create_cq_ex;
  v.create_qp_ex = create_qp_ex;
  v.create_srq_ex = create_srq_ex;
  ibv_context& c = v.context;
  c.device = device;
  // No kernel command channel: a placeholder, so that programs that dup or
  // check it find a valid descriptor (rdma-core's shared-PD test dups it,
  // then imports it: ibv_import_device says EOPNOTSUPP for it, below).
  c.cmd_fd = memfd_create(kCmdFdName, MFD_CLOEXEC);
  c.async_fd = async_fd;
  c.num_comp_vectors = 1;
  pthread_mutex_init(&c.mutex, nullptr);
  c.abi_compat = __VERBS_ABI_IS_EXTENDED;
  c.ops = kContextOps;
  register_context(ctx);
  return &c;
}

int ours::ibv_close_device(ibv_context* context) {
  Context* ctx = &ctx_of(context);
  unregister_context(ctx);
  {
    // Closing the connection makes the service release every object of
    // this context; what the application did not destroy is freed here.
    // A dead context's lock may belong to a thread that no longer exists
    // (a forked child): then it is not waited for.
    std::unique_lock g(ctx->ctl_mu, std::defer_lock);
    if (ctx->dead)
      (void)g.try_lock();
    else
      g.lock();
    if (ctx->ctl_fd >= 0) close(ctx->ctl_fd);
    ctx->ctl_fd = -1;
    ctx->dead = true;
  }
  {
    std::lock_guard g(ctx->obj_mu);
    ctx->qps.for_each([](Qp* q) {
      munmap(q->sh, q->map_len);
      pthread_mutex_destroy(&q->ibv()->mutex);
      pthread_cond_destroy(&q->ibv()->cond);
      delete_qp(q);
    });
    ctx->srqs.for_each([](Srq* q) {
      munmap(q->map, q->map_len);
      delete q;
    });
    ctx->cqs.for_each([](Cq* q) {
      munmap(q->map, q->map_len);
      delete q;
    });
    ctx->qps.clear();
    ctx->srqs.clear();
    ctx->cqs.clear();
  }
  munmap(ctx->db, ctx->db_len);
  ctx->close_bells();
  if (context->async_fd >= 0) close(context->async_fd);
  if (context->cmd_fd >= 0) close(context->cmd_fd);
  pthread_mutex_destroy(&context->mutex);
  delete ctx;
  return 0;
}

// --- queries
// -------------------------------------------------------------------

int ours::ibv_query_device(ibv_context* context, ibv_device_attr* device_attr) {
  return query_device(context, device_attr);
}

int ours::ibv_query_port(ibv_context* context, uint8_t port_num,
                         _compat_ibv_port_attr* port_attr) {
  return compat_query_port(context, port_num, port_attr);
}

int ours::ibv_query_gid(ibv_context* context, uint8_t port_num, int index,
                        union ibv_gid* gid) {
  const Context& c = ctx_of(context);
  if (port_num != 1 || index < 0 ||
      static_cast<uint32_t>(index) >= gid_table_len(c)) {
    errno = EINVAL;
    return -1;
  }
  // Entries past the service's GIDs read as zero, like empty kernel ones.
  std::memset(gid, 0, sizeof *gid);
  if (static_cast<uint32_t>(index) < std::min(c.info.num_gids, kMaxGids))
    std::memcpy(gid->raw, c.info.gids[index], 16);
  return 0;
}

int ours::_ibv_query_gid_ex(ibv_context* context, uint32_t port_num,
                            uint32_t gid_index, ibv_gid_entry* entry,
                            uint32_t flags, size_t entry_size) {
  const Context& c = ctx_of(context);
  if (flags || port_num != 1 || gid_index >= gid_table_len(c)) return EINVAL;
  if (gid_index >= std::min(c.info.num_gids, kMaxGids)) return ENODATA;
  ibv_gid_entry e{};
  std::memcpy(e.gid.raw, c.info.gids[gid_index], 16);
  e.gid_index = gid_index;
  e.port_num = 1;
  e.gid_type = IBV_GID_TYPE_ROCE_V2;
  e.ndev_ifindex = 0;  // the service's port is no kernel netdev
  std::memset(entry, 0, entry_size);
  std::memcpy(entry, &e, std::min(entry_size, sizeof e));
  return 0;
}

ssize_t ours::_ibv_query_gid_table(ibv_context* context, ibv_gid_entry* entries,
                                   size_t max_entries, uint32_t flags,
                                   size_t entry_size) {
  const Context& c = ctx_of(context);
  const uint32_t n = std::min(c.info.num_gids, kMaxGids);
  if (flags || entry_size < sizeof(ibv_gid_entry)) return -EINVAL;
  if (max_entries < n) return -EINVAL;
  for (uint32_t i = 0; i < n; ++i) {
    auto* e = reinterpret_cast<ibv_gid_entry*>(
        reinterpret_cast<char*>(entries) + i * entry_size);
    std::memset(e, 0, entry_size);
    std::memcpy(e->gid.raw, c.info.gids[i], 16);
    e->gid_index = i;
    e->port_num = 1;
    e->gid_type = IBV_GID_TYPE_ROCE_V2;
  }
  return n;
}

int ours::ibv_query_gid_type(ibv_context* context, uint8_t port_num,
                             unsigned int index, ibv_gid_type_sysfs* type) {
  const Context& c = ctx_of(context);
  if (port_num != 1 || index >= gid_table_len(c)) {
    errno = EINVAL;
    return -1;
  }
  // rdma-core reports an empty entry as RoCE v1 too.
  *type = index < std::min(c.info.num_gids, kMaxGids)
              ? IBV_GID_TYPE_SYSFS_ROCE_V2
              : IBV_GID_TYPE_SYSFS_IB_ROCE_V1;
  return 0;
}

int ours::ibv_query_pkey(ibv_context* /*context*/, uint8_t port_num, int index,
                         __be16* pkey) {
  if (port_num != 1 || index != 0) {
    errno = EINVAL;
    return -1;
  }
  *pkey = htobe16(0xffff);  // the default partition, full member
  return 0;
}

int ours::ibv_get_pkey_index(ibv_context* /*context*/, uint8_t port_num,
                             __be16 pkey) {
  if (port_num == 1 && (be16toh(pkey) & 0x7fff) == 0x7fff) return 0;
  errno = ENOENT;
  return -1;
}

// --- sysfs
// ---------------------------------------------------------------------------

namespace {

const char* port_state_str(int s) {
  switch (s) {
    case IBV_PORT_DOWN:
      return "DOWN";
    case IBV_PORT_INIT:
      return "INIT";
    case IBV_PORT_ARMED:
      return "ARMED";
    case IBV_PORT_ACTIVE:
      return "ACTIVE";
    default:
      return "NOP";
  }
}

// The answer for `rel` (a path below a urnic device's sysfs directory), or
// false (ENOENT, or EINVAL for an empty GID's attributes, as the kernel).
bool sysfs_answer(Device& d, const std::string& rel, std::string* out,
                  int* err) {
  *err = ENOENT;
  if (rel == "ibdev") return *out = d.dev.name, true;
  if (rel == "abi_version") return *out = "1", true;
  if (rel == "node_type") return *out = "1: CA", true;
  if (rel == "hca_type") return *out = "urnic", true;
  if (rel == "hw_rev") return *out = "0", true;
  OpenRep info;
  if (!device_info(d, &info)) {
    *err = ENODEV;
    return false;
  }
  char buf[128];
  if (rel == "node_guid" || rel == "sys_image_guid") {
    const uint64_t g = be64toh(info.node_guid);
    snprintf(buf, sizeof buf, "%04x:%04x:%04x:%04x",
             static_cast<unsigned>(g >> 48),
             static_cast<unsigned>((g >> 32) & 0xffff),
             static_cast<unsigned>((g >> 16) & 0xffff),
             static_cast<unsigned>(g & 0xffff));
    return *out = buf, true;
  }
  if (rel == "fw_ver")
    return *out = std::string(
               info.device.fw_ver,
               strnlen(info.device.fw_ver, sizeof info.device.fw_ver)),
           true;
  if (rel == "board_id" || rel == "node_desc") {
    const std::string v(
        info.service_version,
        strnlen(info.service_version, sizeof info.service_version));
    *out = rel == "board_id" ? "URNIC" : "urnicd " + v + " " + d.path;
    return true;
  }
  const std::string port = "ports/1/";
  if (rel.rfind(port, 0) != 0) return false;
  const std::string p = rel.substr(port.size());
  const uint32_t ngids = std::min(info.num_gids, kMaxGids);
  const uint32_t tbl = info.port.gid_tbl_len > 0
                           ? static_cast<uint32_t>(info.port.gid_tbl_len)
                           : ngids;
  auto index_of = [&p](const char* prefix, unsigned* i) {
    const size_t n = strlen(prefix);
    if (p.compare(0, n, prefix) != 0 || p.size() == n) return false;
    char* end;
    const unsigned long v = strtoul(p.c_str() + n, &end, 10);
    if (*end) return false;
    *i = static_cast<unsigned>(v);
    return true;
  };
  unsigned i;
  if (index_of("gids/", &i)) {
    if (i >= tbl) return false;
    uint8_t g[16] = {};
    if (i < ngids) std::memcpy(g, info.gids[i], 16);
    snprintf(buf, sizeof buf,
             "%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:"
             "%02x%02x",
             g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], g[10],
             g[11], g[12], g[13], g[14], g[15]);
    return *out = buf, true;
  }
  if (index_of("gid_attrs/types/", &i) || index_of("gid_attrs/ndevs/", &i)) {
    if (i >= ngids) {
      *err = i < tbl ? EINVAL : ENOENT;
      return false;
    }
    *out = p.find("types") != std::string::npos ? "RoCE v2" : d.dev.name;
    return true;
  }
  if (index_of("pkeys/", &i)) {
    if (i != 0) return false;
    return *out = "0xffff", true;
  }
  const ibv_port_attr& pa = info.port;
  if (p == "link_layer") return *out = "Ethernet", true;
  if (p == "state") {
    snprintf(buf, sizeof buf, "%d: %s", pa.state, port_state_str(pa.state));
    return *out = buf, true;
  }
  if (p == "phys_state")
    return *out = pa.state == IBV_PORT_ACTIVE ? "5: LinkUp" : "3: Disabled",
           true;
  if (p == "lid" || p == "sm_lid") return *out = "0x0", true;
  if (p == "lid_mask_count" || p == "sm_sl") return *out = "0", true;
  if (p == "cap_mask") {
    snprintf(buf, sizeof buf, "0x%08x", pa.port_cap_flags);
    return *out = buf, true;
  }
  return false;
}

}  // namespace

namespace urnic::shim {

// The device file or directory `path` names, as in the kernel's tree: a
// urnic device's /dev/infiniband node, or a path below its two sysfs
// directories. Paths are matched as the callers build them (no symlinks or
// "..", "//" tolerated).
DevPath device_path(const char* path, std::string* content, int* err) {
  static constexpr char kDev[] = "/dev/infiniband/";
  static constexpr char kSys[] = "/sys/class/infiniband";
  if (!path || (strncmp(path, kDev, sizeof kDev - 1) != 0 &&
                strncmp(path, kSys, sizeof kSys - 1) != 0))
    return DevPath::kNone;
  init_paths();
  Registry& r = reg();
  std::string full = path;
  for (size_t at; (at = full.find("//")) != std::string::npos;)
    full.erase(at, 1);
  while (full.size() > 1 && full.back() == '/') full.pop_back();
  for (int k = 0; k < r.ndev; ++k) {
    Device& d = r.devices[k];
    if (full == std::string(kDev) + d.dev.dev_name) return DevPath::kNode;
    for (const char* base : {d.dev.ibdev_path, d.dev.dev_path}) {
      const std::string b = base;
      if (full == b) return DevPath::kDir;
      if (full.rfind(b + "/", 0) != 0) continue;
      const std::string rel = full.substr(b.size() + 1);
      if (sysfs_answer(d, rel, content, err)) return DevPath::kFile;
      if (*err != ENOENT) return DevPath::kMissing;
      for (const char* dir : {"ports", "ports/1", "ports/1/gids",
                              "ports/1/gid_attrs", "ports/1/gid_attrs/types",
                              "ports/1/gid_attrs/ndevs", "ports/1/pkeys"})
        if (rel == dir) return DevPath::kDir;
      return DevPath::kMissing;
    }
  }
  return DevPath::kNone;
}

}  // namespace urnic::shim

URNIC_EXPORT int ibv_read_sysfs_file(const char* dir, const char* file,
                                     char* buf, size_t size) {
  if (dir && file) {
    std::string out;
    int err = ENOENT;
    switch (device_path((std::string(dir) + "/" + file).c_str(), &out, &err)) {
      case DevPath::kNone:
        break;
      case DevPath::kFile:
        if (size == 0) return 0;
        {
          const size_t n = std::min(out.size(), size - 1);
          std::memcpy(buf, out.data(), n);
          buf[n] = '\0';
          return static_cast<int>(n);
        }
      case DevPath::kDir:
        err = EISDIR;
        [[fallthrough]];
      case DevPath::kNode:  // never below a sysfs directory
      case DevPath::kMissing:
        errno = err;
        return -1;
    }
  }
  auto f = URNIC_REAL(ibv_read_sysfs_file, "IBVERBS_1.0");
  if (!f) {
    errno = ENOSYS;
    return -1;
  }
  return f(dir, file, buf, size);
}
