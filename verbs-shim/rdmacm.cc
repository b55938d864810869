// The RDMA CM character device, /dev/infiniband/rdma_cm, for librdmacm:
// open() gives an event channel, write() carries the kernel's ucma commands
// (rdma/rdma_user_cm.h) to urnicd, fstat() says "character device", and the
// fd is pollable exactly as the kernel's: readable while events wait.
//
// A channel is two sockets. The application's fd is our end of a SEQPACKET
// pair whose other end urnicd holds and writes one CmEventMsg per event to,
// so poll/epoll/O_NONBLOCK work on it unchanged and a GET_EVENT blocked in
// one thread holds no lock another thread's command needs. Commands go over
// a control connection of the channel's own (closing it is ucma_close: the
// service destroys the channel's ids). The CM state lives in urnicd
// (dataplane/service/cm_server.cc); what only this process can know stays
// here: how many events of each id were handed out (events_reported, which
// rdma_destroy_id waits to see acknowledged), and which ids are still ours
// (events of a destroyed id are dropped, as the kernel drops them); the
// same for multicast memberships (rdma_leave_multicast waits likewise).
#undef _FORTIFY_SOURCE
#undef _FILE_OFFSET_BITS
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "verbs-shim/ctl.h"
#include "verbs-shim/shim.h"

namespace urnic::shim {
namespace {

constexpr const char* kCmNode = "/dev/infiniband/rdma_cm";
// fds at or above this are never channels (open refuses with EMFILE).
constexpr int kMaxCmFd = 1 << 16;
// The misc major and the minor Linux's rdma_cm usually gets.
constexpr unsigned kMiscMajor = 10, kCmMinor = 58;
constexpr int kCmTimeoutMs = 60000;

struct CmChannel {
  int fd = -1;      // the application's: events arrive here
  int ev_fd = -1;   // our duplicate of `fd`, which GET_EVENT reads
  int ctl_fd = -1;  // commands
  // Set by close() before the number is released: a call that found the
  // channel before that is ordered before the close (see channel_of).
  std::atomic<bool> closed{false};
  ino_t ino = 0;  // identity of `fd` (a reused fd number is not ours)
  dev_t dev = 0;
  uint64_t token = 0;
  std::mutex ctl_mu;  // one command, one reply
  std::unique_ptr<char[]> rx{new char[ctl::kMaxMsg]};
  std::mutex ev_mu;  // `reported`
  // The ids of this channel and the events handed out for each.
  std::unordered_map<uint32_t, uint32_t> reported;
  // Multicast memberships by handle: the id that joined and the events of
  // the membership handed out (counted against the id too, as the
  // kernel's ucma_get_event does). After a leave, `stale` holds how many
  // of its events the socket still has: they are dropped when read, as
  // the kernel drops them at the leave (ucma_cleanup_mc_events).
  struct Mc {
    uint32_t id = 0;
    uint32_t n = 0;
  };
  std::unordered_map<uint32_t, Mc> mcs, stale;
  ~CmChannel() {
    if (ev_fd >= 0) close(ev_fd);
    if (ctl_fd >= 0) close(ctl_fd);
  }
};

std::atomic<uint8_t> g_is_channel[kMaxCmFd];
std::mutex g_mu;
// Never destroyed: at exit the static destructors run while other threads
// of the program may still be in a CM command (librdmacm's rsocket service
// threads are not joined). Destroying the map there, unlocked, raced with
// such a thread's copy of a channel's shared_ptr and freed the channel
// twice (ASan, rstream's server, about 1 exit in 9).
std::map<int, std::shared_ptr<CmChannel>>& g_channels =
    *new std::map<int, std::shared_ptr<CmChannel>>;

// Our channel behind `fd`, or null: a cheap test first, since every write()
// and close() of the process passes here.
std::shared_ptr<CmChannel> channel_of(int fd) {
  if (fd < 0 || fd >= kMaxCmFd ||
      !g_is_channel[fd].load(std::memory_order_acquire))
    return nullptr;
  std::shared_ptr<CmChannel> ch;
  {
    std::lock_guard g(g_mu);
    auto it = g_channels.find(fd);
    if (it == g_channels.end()) return nullptr;
    ch = it->second;
  }
  // The number may have been closed behind our back (close_range, dup2
  // onto it, a raw syscall): only the same socket is the channel. Unless
  // our close() of it ran since the lookup: then this call found the
  // channel first and is ordered before the close, as a write() that the
  // kernel's ucma has entered holds its file; it goes on with `ch`, whose
  // own descriptors outlive the number.
  struct stat st;
  auto real_fstat = URNIC_REAL(fstat, "GLIBC_2.33");
  if (!real_fstat || real_fstat(fd, &st) != 0 || st.st_ino != ch->ino ||
      st.st_dev != ch->dev)
    return ch->closed.load() ? ch : nullptr;
  return ch;
}

std::shared_ptr<CmChannel> forget(int fd) {
  if (fd < 0 || fd >= kMaxCmFd ||
      !g_is_channel[fd].load(std::memory_order_acquire))
    return nullptr;
  std::lock_guard g(g_mu);
  auto it = g_channels.find(fd);
  if (it == g_channels.end()) return nullptr;
  std::shared_ptr<CmChannel> ch = std::move(it->second);
  g_channels.erase(it);
  g_is_channel[fd].store(0, std::memory_order_release);
  ch->closed.store(true);
  return ch;
}

int fail(int err) {
  errno = err;
  return -1;
}

// One command to the service; the response bytes (if any) land in `out`
// (room `out_len`, *got set). 0 or an errno value.
int command(CmChannel& ch, const CmCommandReq& req, const void* body,
            const void* opt, void* out, size_t out_len, size_t* got) {
  char msg[sizeof req + 512 + kCmMaxOption];
  const size_t len = sizeof req + req.in + req.optlen;
  if (len > sizeof msg) return EINVAL;
  std::memcpy(msg, &req, sizeof req);
  std::memcpy(msg + sizeof req, body, req.in);
  if (req.optlen) std::memcpy(msg + sizeof req + req.in, opt, req.optlen);
  std::lock_guard g(ch.ctl_mu);
  Reply r;
  const int rc =
      transact(ch.ctl_fd, static_cast<uint16_t>(Op::kCmCommand), msg, len,
               nullptr, 0, ch.rx.get(), ctl::kMaxMsg, &r, kCmTimeoutMs);
  if (rc) return rc == ETIMEDOUT ? ETIMEDOUT : ENODEV;  // the service is gone
  r.close_fds();
  // A feature urnic lacks (multicast) is said, as verbs refusals are; the
  // other refusals are librdmacm's probes (AF_IB commands, then the IP
  // ones), which it answers itself, and would only be noise.
  if (r.status == -EOPNOTSUPP && !quiet())
    say("rdma_cm: %.*s", static_cast<int>(r.payload.size()), r.payload.data());
  if (r.status < 0) return -r.status;
  *got = std::min(out_len, r.payload.size());
  if (*got) std::memcpy(out, r.payload.data(), *got);
  return 0;
}

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// GET_EVENT (kernel ucma_get_event): the next event of a live id, blocking
// unless the fd is non-blocking (then EAGAIN, as the kernel's O_NONBLOCK).
int get_event(CmChannel& ch, const uint8_t* body, uint16_t in, uint16_t out) {
  if (in < sizeof(rdma_ucm_get_event)) return EINVAL;
  if (out < sizeof(rdma_ucm_event_resp)) return ENOSPC;
  const uint64_t response = load<uint64_t>(body);
  for (;;) {
    CmEventMsg m;
    // Our duplicate, not the application's number: another thread may
    // close that number (and the number be reused) while this one waits,
    // and the wait then goes on as the kernel's does (rping's CM thread,
    // rdma-core before PR #1622).
    const ssize_t n = recv(ch.ev_fd, &m, sizeof m, 0);
    if (n < 0) return errno;
    if (n == 0) return ENODEV;  // urnicd went away
    if (static_cast<size_t>(n) != sizeof m) continue;
    std::lock_guard g(ch.ev_mu);
    auto it = ch.reported.find(m.count_id);
    if (it == ch.reported.end()) continue;  // destroyed: the event goes too
    if (m.resp.event == 12 || m.resp.event == 13) {  // MULTICAST_JOIN/ERROR
      auto st = ch.stale.find(m.resp.id);
      if (st != ch.stale.end()) {  // its membership was left
        if (--st->second.n == 0) ch.stale.erase(st);
        continue;
      }
      // The event may come before the JOIN's reply is taken.
      CmChannel::Mc& mc = ch.mcs[m.resp.id];
      mc.id = m.count_id;
      ++mc.n;
    }
    ++it->second;
    if (m.resp.event == 4 /* RDMA_CM_EVENT_CONNECT_REQUEST */)
      ch.reported.emplace(m.resp.id, 0);
    std::memcpy(reinterpret_cast<void*>(response), &m.resp, sizeof m.resp);
    return 0;
  }
}

// One ucma command as the kernel's ucma_write takes it. 0 or an errno.
int cm_write(CmChannel& ch, const uint8_t* buf, size_t len) {
  if (len < sizeof(rdma_ucm_cmd_hdr)) return EINVAL;
  const auto hdr = load<rdma_ucm_cmd_hdr>(buf);
  if (hdr.in + sizeof hdr > len) return EINVAL;
  const uint8_t* body = buf + sizeof hdr;
  CmCommandReq req;
  req.cmd = hdr.cmd;
  req.in = hdr.in;
  req.out = hdr.out;
  switch (hdr.cmd) {
    case RDMA_USER_CM_CMD_GET_EVENT:
      return get_event(ch, body, hdr.in, hdr.out);
    case RDMA_USER_CM_CMD_CREATE_ID: {
      if (hdr.in < sizeof(rdma_ucm_create_id)) return EINVAL;
      rdma_ucm_create_id_resp resp{};
      size_t got = 0;
      if (hdr.out < sizeof resp) return ENOSPC;
      if (const int rc =
              command(ch, req, body, nullptr, &resp, sizeof resp, &got))
        return rc;
      {
        std::lock_guard g(ch.ev_mu);
        ch.reported[resp.id] = 0;
      }
      const auto cmd = load<rdma_ucm_create_id>(body);
      std::memcpy(reinterpret_cast<void*>(cmd.response), &resp, sizeof resp);
      return 0;
    }
    case RDMA_USER_CM_CMD_DESTROY_ID: {
      if (hdr.in < sizeof(rdma_ucm_destroy_id)) return EINVAL;
      if (hdr.out < sizeof(rdma_ucm_destroy_id_resp)) return ENOSPC;
      const auto cmd = load<rdma_ucm_destroy_id>(body);
      size_t got = 0;
      if (const int rc = command(ch, req, body, nullptr, nullptr, 0, &got))
        return rc;
      rdma_ucm_destroy_id_resp resp{};
      {
        std::lock_guard g(ch.ev_mu);
        auto it = ch.reported.find(cmd.id);
        if (it != ch.reported.end()) {
          resp.events_reported = it->second;
          ch.reported.erase(it);
        }
        // Its memberships went with it in the service.
        std::erase_if(ch.mcs,
                      [&](const auto& e) { return e.second.id == cmd.id; });
        std::erase_if(ch.stale,
                      [&](const auto& e) { return e.second.id == cmd.id; });
      }
      std::memcpy(reinterpret_cast<void*>(cmd.response), &resp, sizeof resp);
      return 0;
    }
    case RDMA_USER_CM_CMD_JOIN_IP_MCAST:
    case RDMA_USER_CM_CMD_JOIN_MCAST: {
      // Both open with the response pointer, the uid, and name the id.
      const bool ip = hdr.cmd == RDMA_USER_CM_CMD_JOIN_IP_MCAST;
      if (hdr.in <
          (ip ? sizeof(rdma_ucm_join_ip_mcast) : sizeof(rdma_ucm_join_mcast)))
        return EINVAL;
      if (hdr.out < sizeof(rdma_ucm_create_id_resp)) return ENOSPC;
      rdma_ucm_create_id_resp resp{};
      size_t got = 0;
      if (const int rc =
              command(ch, req, body, nullptr, &resp, sizeof resp, &got))
        return rc;
      const uint32_t id = ip ? load<rdma_ucm_join_ip_mcast>(body).id
                             : load<rdma_ucm_join_mcast>(body).id;
      {
        std::lock_guard g(ch.ev_mu);
        ch.mcs.try_emplace(resp.id, CmChannel::Mc{id, 0});
      }
      std::memcpy(reinterpret_cast<void*>(load<uint64_t>(body)), &resp,
                  sizeof resp);
      return 0;
    }
    case RDMA_USER_CM_CMD_LEAVE_MCAST: {
      // The service answers with the membership's events it put in the
      // socket; the application is told those it was handed.
      if (hdr.in < sizeof(rdma_ucm_destroy_id)) return EINVAL;
      if (hdr.out < sizeof(rdma_ucm_destroy_id_resp)) return ENOSPC;
      const auto cmd = load<rdma_ucm_destroy_id>(body);
      rdma_ucm_destroy_id_resp sent{}, resp{};
      size_t got = 0;
      if (const int rc =
              command(ch, req, body, nullptr, &sent, sizeof sent, &got))
        return rc;
      {
        std::lock_guard g(ch.ev_mu);
        CmChannel::Mc mc;
        if (auto it = ch.mcs.find(cmd.id); it != ch.mcs.end()) {
          mc = it->second;
          ch.mcs.erase(it);
        }
        resp.events_reported = mc.n;
        if (got == sizeof sent && sent.events_reported > mc.n)
          ch.stale[cmd.id] = CmChannel::Mc{mc.id, sent.events_reported - mc.n};
      }
      std::memcpy(reinterpret_cast<void*>(cmd.response), &resp, sizeof resp);
      return 0;
    }
    case RDMA_USER_CM_CMD_MIGRATE_ID: {
      // Written on the new channel; cmd.fd is the old one.
      if (hdr.in < sizeof(rdma_ucm_migrate_id)) return EINVAL;
      if (hdr.out < sizeof(rdma_ucm_migrate_resp)) return ENOSPC;
      const auto cmd = load<rdma_ucm_migrate_id>(body);
      std::shared_ptr<CmChannel> old = channel_of(static_cast<int>(cmd.fd));
      if (!old) return EINVAL;
      req.migrate_from = old->token;
      size_t got = 0;
      if (const int rc = command(ch, req, body, nullptr, nullptr, 0, &got))
        return rc;
      rdma_ucm_migrate_resp resp{};
      {
        std::scoped_lock g(old->ev_mu);
        auto it = old->reported.find(cmd.id);
        if (it != old->reported.end()) {
          resp.events_reported = it->second;
          old->reported.erase(it);
        }
      }
      {
        // Its memberships follow it (the old channel's map is locked first
        // above, then released: no two channel locks are held at once).
        std::unordered_map<uint32_t, CmChannel::Mc> moved;
        {
          std::lock_guard g(old->ev_mu);
          std::erase_if(old->mcs, [&](const auto& e) {
            if (e.second.id != cmd.id) return false;
            moved.insert(e);
            return true;
          });
        }
        std::lock_guard g(ch.ev_mu);
        ch.reported[cmd.id] = 0;
        ch.mcs.insert(moved.begin(), moved.end());
      }
      std::memcpy(reinterpret_cast<void*>(cmd.response), &resp, sizeof resp);
      return 0;
    }
    case RDMA_USER_CM_CMD_SET_OPTION: {
      if (hdr.in < sizeof(rdma_ucm_set_option)) return EINVAL;
      const auto cmd = load<rdma_ucm_set_option>(body);
      if (cmd.optlen > kCmMaxOption) return EINVAL;
      req.optlen = cmd.optlen;
      size_t got = 0;
      return command(ch, req, body, reinterpret_cast<const void*>(cmd.optval),
                     nullptr, 0, &got);
    }
    case RDMA_USER_CM_CMD_QUERY_ROUTE:
    case RDMA_USER_CM_CMD_QUERY:
    case RDMA_USER_CM_CMD_INIT_QP_ATTR: {
      // Responses go to the pointer that opens the body.
      if (hdr.in < sizeof(uint64_t)) return EINVAL;
      const uint64_t response = load<uint64_t>(body);
      char resp[512];
      size_t got = 0;
      if (const int rc = command(ch, req, body, nullptr, resp,
                                 std::min<size_t>(hdr.out, sizeof resp), &got))
        return rc;
      if (got) std::memcpy(reinterpret_cast<void*>(response), resp, got);
      return 0;
    }
    default: {
      size_t got = 0;
      return command(ch, req, body, nullptr, nullptr, 0, &got);
    }
  }
}

}  // namespace

bool is_cm_node(const char* path) {
  return path && std::strcmp(path, kCmNode) == 0;
}

int cm_open(int flags) {
  std::string path = cm_service_path();
  int ctl_fd;
  if (int rc = connect_service(path, &ctl_fd)) {
    if (!quiet())
      say("rdma_cm: service not running at %s (connect: %s); set "
          "URNIC_SOCKET",
          path.c_str(), strerror(rc));
    return fail(ENODEV);
  }
  auto ch = std::make_shared<CmChannel>();
  ch->ctl_fd = ctl_fd;
  int sp[2];
  const int type = SOCK_SEQPACKET | ((flags & O_CLOEXEC) ? SOCK_CLOEXEC : 0) |
                   ((flags & O_NONBLOCK) ? SOCK_NONBLOCK : 0);
  if (socketpair(AF_UNIX, type, 0, sp) != 0) return -1;  // ch closes ctl_fd
  // The service only writes its end; ours only reads.
  shutdown(sp[0], SHUT_WR);
  CmOpenReq req;
  req.pid = static_cast<uint32_t>(getpid());
  Reply r;
  int rc =
      transact(ctl_fd, static_cast<uint16_t>(Op::kCmOpen), &req, sizeof req,
               &sp[1], 1, ch->rx.get(), ctl::kMaxMsg, &r, kCmTimeoutMs);
  close(sp[1]);
  if (rc == 0 && r.status < 0) {
    say("rdma_cm: urnicd at %s refused the channel: %.*s", path.c_str(),
        static_cast<int>(r.payload.size()), r.payload.data());
    rc = -r.status;
  } else if (rc == 0 && r.payload.size() != sizeof(CmOpenRep)) {
    say("rdma_cm: malformed reply from urnicd at %s (is it the urnicd this "
        "liburnic-verbs.so was built with?)",
        path.c_str());
    rc = EPROTO;
  } else if (rc) {
    rc = ENODEV;
  }
  r.close_fds();
  struct stat st;
  auto real_fstat = URNIC_REAL(fstat, "GLIBC_2.33");
  if (rc == 0 && sp[0] >= kMaxCmFd) rc = EMFILE;
  if (rc == 0 && (!real_fstat || real_fstat(sp[0], &st) != 0)) rc = EBADF;
  if (rc == 0 && (ch->ev_fd = fcntl(sp[0], F_DUPFD_CLOEXEC, 0)) < 0) rc = errno;
  if (rc) {
    close(sp[0]);
    return fail(rc);
  }
  CmOpenRep rep;
  std::memcpy(&rep, r.payload.data(), sizeof rep);
  ch->fd = sp[0];
  ch->token = rep.token;
  ch->ino = st.st_ino;
  ch->dev = st.st_dev;
  {
    std::lock_guard g(g_mu);
    g_channels[sp[0]] = std::move(ch);
    g_is_channel[sp[0]].store(1, std::memory_order_release);
  }
  return sp[0];
}

bool cm_fstat(int fd, struct stat* st) {
  if (!channel_of(fd)) return false;
  std::memset(st, 0, sizeof *st);
  st->st_mode = S_IFCHR | 0666;
  st->st_nlink = 1;
  // Where the kernel has its own rdma_cm (ib_core loaded, as in a host
  // with rxe), librdmacm asks netlink for its dev_t and wants the node it
  // opened to carry it: report the real node's number.
  static const dev_t rdev = [] {
    struct stat real;
    auto real_stat = URNIC_REAL(stat, "GLIBC_2.33");
    return real_stat && real_stat(kCmNode, &real) == 0 && S_ISCHR(real.st_mode)
               ? real.st_rdev
               : makedev(kMiscMajor, kCmMinor);
  }();
  st->st_rdev = rdev;
  st->st_blksize = 4096;
  return true;
}

}  // namespace urnic::shim

using namespace urnic::shim;

URNIC_EXPORT ssize_t write(int fd, const void* buf, size_t len) {
  if (std::shared_ptr<CmChannel> ch = channel_of(fd)) {
    const int rc = cm_write(*ch, static_cast<const uint8_t*>(buf), len);
    // URNIC_CM_TRACE=1: one line per command, for debugging a program.
    static const bool trace = getenv("URNIC_CM_TRACE") != nullptr;
    if (trace)
      say("cm fd %d cmd %u len %zu -> %d", fd,
          len >= 4 ? *static_cast<const uint32_t*>(buf) : 0u, len, rc);
    if (rc) return fail(rc);
    return static_cast<ssize_t>(len);
  }
  static auto* const real = URNIC_REAL(write, nullptr);
  if (!real) return fail(ENOSYS);
  return real(fd, buf, len);
}

URNIC_EXPORT int close(int fd) {
  // The channel's control connection closes with it: the service destroys
  // the ids left on it, as the kernel's ucma_close does.
  std::shared_ptr<CmChannel> ch = forget(fd);
  ch.reset();
  static auto* const real = URNIC_REAL(close, nullptr);
  if (!real) return fail(ENOSYS);
  return real(fd);
}

URNIC_EXPORT int fstat(int fd, struct stat* st) {
  if (cm_fstat(fd, st)) return 0;
  static auto* const real = URNIC_REAL(fstat, "GLIBC_2.33");
  if (!real) return fail(ENOSYS);
  return real(fd, st);
}

URNIC_EXPORT int fstat64(int fd, struct stat64* st) {
  static_assert(sizeof(struct stat64) == sizeof(struct stat));
  if (cm_fstat(fd, reinterpret_cast<struct stat*>(st))) return 0;
  static auto* const real = URNIC_REAL(fstat64, "GLIBC_2.33");
  if (!real) return fail(ENOSYS);
  return real(fd, st);
}
