#include "dataplane/service/control.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace urnic::service {
namespace {

constexpr size_t kMaxClients = 64;

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

}  // namespace

ControlServer::ControlServer(const config::ControlConfig& cfg, Handler h)
    : path_(cfg.socket), handler_(std::move(h)) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (path_.size() >= sizeof sa.sun_path)
    throw std::runtime_error("control.socket path too long: " + path_);
  std::memcpy(sa.sun_path, path_.c_str(), path_.size() + 1);
  const size_t slash = path_.rfind('/');
  if (slash != std::string::npos && slash > 0) mkdir_p(path_.substr(0, slash));

  ensure_free(path_);
  unlink(path_.c_str());

  listen_fd_ =
      socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd_ < 0) throw std::runtime_error(errstr("socket"));
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      chmod(path_.c_str(), cfg.mode) != 0 || listen(listen_fd_, 16) != 0) {
    const std::string e = errstr("control socket " + path_);
    close(listen_fd_);
    throw std::runtime_error(e);
  }
}

void ControlServer::ensure_free(const std::string& path) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (path.size() >= sizeof sa.sun_path)
    throw std::runtime_error("control.socket path too long: " + path);
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  // A live service on the path wins; a dead one's socket file is removed.
  const int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (probe < 0) return;
  const bool live =
      connect(probe, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
  close(probe);
  if (live)
    throw std::runtime_error("another urnicd is already serving " + path);
}

ControlServer::~ControlServer() {
  for (int fd : clients_) close(fd);
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    unlink(path_.c_str());
  }
}

void ControlServer::poll(int timeout_ms) {
  std::vector<pollfd> fds;
  fds.push_back({listen_fd_, POLLIN, 0});
  for (int fd : clients_) fds.push_back({fd, POLLIN, 0});
  if (::poll(fds.data(), fds.size(), timeout_ms) <= 0) return;
  std::vector<int> keep;
  for (size_t i = 1; i < fds.size(); ++i) {
    if (fds[i].revents & (POLLERR | POLLHUP | POLLNVAL)) {
      close(fds[i].fd);
      continue;
    }
    if (fds[i].revents & POLLIN) serve(fds[i].fd);
    keep.push_back(fds[i].fd);
  }
  clients_.swap(keep);
  clients_.erase(std::remove(clients_.begin(), clients_.end(), -1),
                 clients_.end());
  if (fds[0].revents & POLLIN) {
    const int c = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c >= 0) {
      if (clients_.size() >= kMaxClients)
        close(c);  // the client sees EOF, not a hang
      else
        clients_.push_back(c);
    }
  }
}

void ControlServer::serve(int fd) {
  char buf[ctl::kMaxMsg];
  const ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
  if (n <= 0) return;  // EOF is seen as POLLHUP next time
  ctl::Hdr req;
  ctl::Hdr rep;
  std::string payload;
  if (static_cast<size_t>(n) < sizeof req) {
    rep.status = -EPROTO;
    payload = "short message";
  } else {
    std::memcpy(&req, buf, sizeof req);
    rep.op = req.op;
    if (req.magic != ctl::kMagic) {
      rep.status = -EPROTO;
      payload = "not an urnic control message";
    } else if (req.version != ctl::kVersion) {
      rep.status = -EPROTONOSUPPORT;
      payload = "protocol version " + std::to_string(req.version) +
                " not supported; urnicd speaks " +
                std::to_string(ctl::kVersion);
    } else if (req.len != n - sizeof req) {
      rep.status = -EPROTO;
      payload = "length mismatch";
    } else {
      int status = 0;
      payload = handler_(static_cast<ctl::Op>(req.op),
                         std::string(buf + sizeof req, req.len), status);
      rep.status = status;
    }
  }
  if (payload.size() > ctl::kMaxMsg - sizeof rep)
    payload.resize(ctl::kMaxMsg - sizeof rep);
  rep.len = static_cast<uint32_t>(payload.size());
  std::string out(reinterpret_cast<const char*>(&rep), sizeof rep);
  out += payload;
  // A client that stopped reading loses its reply, never the service's time.
  send(fd, out.data(), out.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
}

}  // namespace urnic::service
