#include "dataplane/service/control.h"

#include <errno.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace urnic::service {
namespace {

constexpr size_t kMaxClients = 256;
constexpr size_t kMaxFds = 72;  // > shim::kMaxMrPieces
// A deferred request is tried again this often.
constexpr int kRetryMs = 2;

uint64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000u + uint64_t(ts.tv_nsec);
}

std::string errstr(const std::string& what) {
  return what + ": " + strerror(errno);
}

void mkdir_p(const std::string& dir) {
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') {
      const std::string part = dir.substr(0, i);
      if (mkdir(part.c_str(), 0755) != 0 && errno != EEXIST)
        throw std::runtime_error(errstr("creating " + part));
    }
  }
}

// A user or group given by name or number; throws naming the key.
bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(),
                                   [](char c) { return c >= '0' && c <= '9'; });
}

uid_t resolve_user(const std::string& key, const std::string& v) {
  if (all_digits(v)) return static_cast<uid_t>(std::stoul(v));
  passwd pw{}, *res = nullptr;
  char buf[4096];
  if (getpwnam_r(v.c_str(), &pw, buf, sizeof buf, &res) != 0 || !res)
    throw std::runtime_error(key + ": no user \"" + v + "\" on this host");
  return pw.pw_uid;
}

gid_t resolve_group(const std::string& key, const std::string& v) {
  if (all_digits(v)) return static_cast<gid_t>(std::stoul(v));
  group gr{}, *res = nullptr;
  char buf[4096];
  if (getgrnam_r(v.c_str(), &gr, buf, sizeof buf, &res) != 0 || !res)
    throw std::runtime_error(key + ": no group \"" + v + "\" on this host");
  return gr.gr_gid;
}

std::string user_name(uid_t uid) {
  passwd pw{}, *res = nullptr;
  char buf[4096];
  if (getpwuid_r(uid, &pw, buf, sizeof buf, &res) == 0 && res)
    return std::to_string(uid) + " (" + pw.pw_name + ")";
  return std::to_string(uid);
}

// The peer's supplementary groups (SO_PEERGROUPS, Linux 4.13), as they
// were when it connected.
std::vector<gid_t> peer_groups(int fd) {
  std::vector<gid_t> g(64);
  for (int tries = 0; tries < 3; ++tries) {
    socklen_t len = static_cast<socklen_t>(g.size() * sizeof(gid_t));
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g.data(), &len) == 0) {
      g.resize(len / sizeof(gid_t));
      return g;
    }
    if (errno != ERANGE) break;
    g.resize(len / sizeof(gid_t) + 1);
  }
  return {};
}

}  // namespace

ControlServer::ControlServer(const config::ControlConfig& cfg, Handler h,
                             CloseHandler on_close)
    : path_(cfg.socket),
      mode_(cfg.mode),
      handler_(std::move(h)),
      on_close_(std::move(on_close)) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (path_.size() >= sizeof sa.sun_path)
    throw std::runtime_error("control.socket path too long: " + path_);
  std::memcpy(sa.sun_path, path_.c_str(), path_.size() + 1);
  const size_t slash = path_.rfind('/');
  if (slash != std::string::npos && slash > 0) mkdir_p(path_.substr(0, slash));

  // Names first: a config naming nobody known fails before any file.
  const Ids ids = resolve_ids(cfg);
  allow_uids_ = ids.allow_uids;
  allow_gids_ = ids.allow_gids;
  const uid_t owner = ids.owner;
  const gid_t grp = ids.group;
  ensure_free(path_);
  unlink(path_.c_str());

  listen_fd_ =
      socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd_ < 0) throw std::runtime_error(errstr("socket"));
  // Owner and group before the mode, and both before listen(): nobody
  // connects through a mode meant for other owners.
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      chown(path_.c_str(), owner, grp) != 0 ||
      chmod(path_.c_str(), cfg.mode) != 0 || listen(listen_fd_, 16) != 0) {
    const std::string e = errstr("control socket " + path_);
    close(listen_fd_);
    unlink(path_.c_str());
    throw std::runtime_error(e);
  }
}

ControlServer::Ids ControlServer::resolve_ids(
    const config::ControlConfig& cfg) {
  Ids ids;
  for (const std::string& u : cfg.allow_users)
    ids.allow_uids.insert(resolve_user("control.allow_users", u));
  for (const std::string& g : cfg.allow_groups)
    ids.allow_gids.insert(resolve_group("control.allow_groups", g));
  if (!cfg.owner.empty()) ids.owner = resolve_user("control.owner", cfg.owner);
  if (!cfg.group.empty()) ids.group = resolve_group("control.group", cfg.group);
  return ids;
}

void ControlServer::ensure_free(const std::string& path) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (path.size() >= sizeof sa.sun_path)
    throw std::runtime_error("control.socket path too long: " + path);
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  // Nothing there: free. A live service on the path wins; only a socket
  // that refuses connections (a dead urnicd's) is taken over, and the
  // caller removes it. Anything else at the path is someone's file, which
  // a mistyped control.socket must not delete (urnicd runs as root).
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    throw std::runtime_error(errstr("control.socket " + path));
  }
  if (!S_ISSOCK(st.st_mode))
    throw std::runtime_error("control.socket " + path +
                             " exists and is not a socket: not removed");
  const int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (probe < 0) throw std::runtime_error(errstr("socket"));
  const int rc = connect(probe, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  const int err = errno;
  close(probe);
  if (rc == 0)
    throw std::runtime_error("another urnicd is already serving " + path);
  if (err != ECONNREFUSED)
    throw std::runtime_error(
        "control.socket " + path +
        " is a socket urnic cannot take over (connect: " + std::strerror(err) +
        "; another program's?): not removed");
}

ControlServer::~ControlServer() {
  for (Client& c : clients_) {
    if (on_close_) on_close_(c.info);
    close(c.fd);
  }
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    unlink(path_.c_str());
  }
}

// The socket file's mode already limits who can connect; the credentials
// are checked again here (a socket inherited or passed around does not
// widen access) and recorded for `urnicctl clients`.
// With control.allow_users / allow_groups, only they (and root and the
// service's own user) may use the service, whatever the file mode.
bool ControlServer::permitted(int fd, const ClientInfo& ci) const {
  if (ci.uid == 0 || ci.uid == geteuid()) return true;
  if (allow_uids_.empty() && allow_gids_.empty()) {
    if (mode_ & 0002) return true;
    return (mode_ & 0020) && ci.gid == getegid();
  }
  if (allow_uids_.count(ci.uid) || allow_gids_.count(ci.gid)) return true;
  for (gid_t g : peer_groups(fd))
    if (allow_gids_.count(g)) return true;
  return false;
}

void ControlServer::poll(int timeout_ms) {
  std::vector<pollfd> fds;
  fds.push_back({listen_fd_, POLLIN, 0});
  bool pending = false;
  for (const Client& c : clients_) {
    // A client with a deferred request is not read (its requests stay in
    // order); a hang-up is still seen.
    fds.push_back({c.fd, static_cast<short>(c.pending ? 0 : POLLIN), 0});
    pending |= c.pending;
  }
  if (pending) timeout_ms = std::min(timeout_ms, kRetryMs);
  const int n = ::poll(fds.data(), fds.size(), timeout_ms);
  if (n < 0 || (n == 0 && !pending)) return;
  std::vector<Client> keep;
  for (size_t i = 1; i < fds.size(); ++i) {
    Client& c = clients_[i - 1];
    const short ev = fds[i].revents;
    bool alive = !(ev & (POLLERR | POLLNVAL));
    if (alive && c.pending) {
      if (ev & POLLHUP)
        alive = false;  // gone while its request waited
      else
        process(c);
    } else if (alive && (ev & POLLIN)) {
      alive = serve(c);
    } else if (alive && (ev & POLLHUP)) {
      alive = false;
    }
    if (alive) {
      keep.push_back(std::move(c));
    } else {
      drop_pending(c);
      if (on_close_) on_close_(c.info);
      close(c.fd);
    }
  }
  clients_.swap(keep);
  if (fds[0].revents & POLLIN) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    Client c{fd, {}};
    ucred cr{};
    socklen_t len = sizeof cr;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0 ||
        clients_.size() >= kMaxClients) {
      refused_.fetch_add(1, std::memory_order_relaxed);
      close(fd);  // the client sees EOF, not a hang
      return;
    }
    c.info = {next_id_++, cr.pid, cr.uid, cr.gid};
    if (!permitted(fd, c.info)) {
      refused_.fetch_add(1, std::memory_order_relaxed);
      ctl::Hdr rep;
      rep.status = -EACCES;
      char mode[8];
      snprintf(mode, sizeof mode, "%04o", mode_);
      const std::string msg =
          "uid " + user_name(cr.uid) + " may not use this urnicd" +
          (allow_uids_.empty() && allow_gids_.empty()
               ? std::string(" (socket mode ") + mode + ")"
               : std::string(
                     " (not in control.allow_users or control.allow_groups)"));
      rep.len = static_cast<uint32_t>(msg.size());
      std::string out(reinterpret_cast<const char*>(&rep), sizeof rep);
      send(fd, (out + msg).data(), out.size() + msg.size(),
           MSG_DONTWAIT | MSG_NOSIGNAL);
      // Closing a Unix socket with unread data resets the peer, which may
      // then never read the answer: read what it already sent first.
      shutdown(fd, SHUT_WR);
      char sink[256];
      while (recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0) {
      }
      close(fd);
      return;
    }
    clients_.push_back(c);
  }
}

bool ControlServer::serve(Client& c) {
  char buf[ctl::kMaxMsg];
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * kMaxFds)];
  iovec iov{buf, sizeof buf};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = cbuf;
  mh.msg_controllen = sizeof cbuf;
  const ssize_t n = recvmsg(c.fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n == 0) return false;  // orderly close
  if (n < 0) return errno == EAGAIN || errno == EINTR;
  std::vector<int> in_fds;
  for (cmsghdr* cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
    const size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
      in_fds.push_back(fd);
    }
  }
  c.req.assign(buf, static_cast<size_t>(n));
  c.req_fds = std::move(in_fds);
  c.attempts = 0;
  c.since_ns = mono_ns();
  c.truncated = mh.msg_flags & (MSG_CTRUNC | MSG_TRUNC);
  process(c);
  return true;
}

void ControlServer::drop_pending(Client& c) {
  for (int fd : c.req_fds)
    if (fd >= 0) close(fd);
  c.req_fds.clear();
  c.req.clear();
  c.pending = false;
}

void ControlServer::process(Client& c) {
  const char* buf = c.req.data();
  const size_t n = c.req.size();
  ctl::Hdr req;
  ctl::Hdr rep;
  CtlReply out;
  if (c.truncated) {
    out.status = -EMSGSIZE;
    out.payload = "message or its file descriptors truncated";
  } else if (n < sizeof req) {
    out.status = -EPROTO;
    out.payload = "short message";
  } else {
    std::memcpy(&req, buf, sizeof req);
    rep.op = req.op;
    if (req.magic != ctl::kMagic) {
      out.status = -EPROTO;
      out.payload = "not an urnic control message";
    } else if (req.version != ctl::kVersion) {
      out.status = -EPROTONOSUPPORT;
      out.payload = "protocol version " + std::to_string(req.version) +
                    " not supported; urnicd speaks " +
                    std::to_string(ctl::kVersion) +
                    " (use the liburnic-verbs.so / urnicctl of this urnicd)";
    } else if (req.len != n - sizeof req) {
      out.status = -EPROTO;
      out.payload = "length mismatch";
    } else {
      CtlRequest r{&c.info,
                   static_cast<ctl::Op>(req.op),
                   std::string_view(buf + sizeof req, req.len),
                   c.req_fds,
                   c.attempts,
                   c.since_ns};
      handler_(r, out);
      if (out.later) {
        ++c.attempts;
        c.pending = true;
        return;
      }
    }
  }
  c.pending = false;
  for (int fd : c.req_fds)
    if (fd >= 0) close(fd);
  c.req_fds.clear();
  rep.status = out.status;
  if (out.payload.size() > ctl::kMaxMsg - sizeof rep)
    out.payload.resize(ctl::kMaxMsg - sizeof rep);
  rep.len = static_cast<uint32_t>(out.payload.size());
  std::string msg(reinterpret_cast<const char*>(&rep), sizeof rep);
  msg += out.payload;
  iovec oiov{msg.data(), msg.size()};
  msghdr om{};
  om.msg_iov = &oiov;
  om.msg_iovlen = 1;
  alignas(cmsghdr) char ocbuf[CMSG_SPACE(sizeof(int) * ctl::kMaxReplyFds)];
  if (!out.fds.empty() && out.fds.size() <= ctl::kMaxReplyFds) {
    om.msg_control = ocbuf;
    om.msg_controllen = CMSG_SPACE(sizeof(int) * out.fds.size());
    cmsghdr* cm = CMSG_FIRSTHDR(&om);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * out.fds.size());
    std::memcpy(CMSG_DATA(cm), out.fds.data(), sizeof(int) * out.fds.size());
  }
  // A client that stopped reading loses its reply, never the service's time.
  sendmsg(c.fd, &om, MSG_DONTWAIT | MSG_NOSIGNAL);
  for (int fd : out.fds) close(fd);
  c.req.clear();
}

}  // namespace urnic::service
