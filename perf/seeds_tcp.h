// The seed programs' control channel: a byte stream for connection set-up
// data and small fixed-size control messages. A closed channel is the
// peer lost: every read that finds EOF exits with kPeerLost. Channel is
// the interface; SideChannel is the TCP one (as perftest's), CmChannel
// (seeds_cm.h) carries the same bytes in SENDs on an RC QP (--cm).
#pragma once

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "perf/seeds_common.h"

namespace seeds {

class Channel {
 public:
  Channel() = default;
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;
  virtual ~Channel() = default;

  virtual void send_all(const void* p, size_t n) = 0;
  virtual void recv_all(void* p, size_t n) = 0;
  // True when a message (or EOF) can be read without blocking.
  virtual bool readable(int timeout_ms = 0) = 0;
  // Waits up to `ms` for the peer to close (the end of a run).
  virtual void wait_close(int ms) = 0;

  template <typename T>
  void send_obj(const T& v) {
    send_all(&v, sizeof v);
  }
  template <typename T>
  void recv_obj(T& v) {
    recv_all(&v, sizeof v);
  }
};

class SideChannel final : public Channel {
 public:
  ~SideChannel() override {
    if (fd_ >= 0) close(fd_);
  }

  // Server: waits for one client on `port` (IPv4 and IPv6).
  void accept_one(uint16_t port) {
    const int l = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (l < 0) die(kSetup, "socket: %s", strerror(errno));
    const int one = 1, zero = 0;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    setsockopt(l, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    sockaddr_in6 sa{};
    sa.sin6_family = AF_INET6;
    sa.sin6_port = htons(port);
    sa.sin6_addr = in6addr_any;
    if (bind(l, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
        listen(l, 1) != 0)
      die(kSetup, "bind/listen on TCP port %u: %s", port, strerror(errno));
    fd_ = accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
    close(l);
    if (fd_ < 0) die(kSetup, "accept: %s", strerror(errno));
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }

  // Client: connects, retrying for 5 s while the server starts.
  void connect_to(const std::string& host, uint16_t port) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const std::string ps = std::to_string(port);
    if (const int rc = getaddrinfo(host.c_str(), ps.c_str(), &hints, &res))
      die(kSetup, "%s: %s", host.c_str(), gai_strerror(rc));
    int err = 0;
    for (int attempt = 0; attempt < 50 && fd_ < 0; ++attempt) {
      for (addrinfo* a = res; a && fd_ < 0; a = a->ai_next) {
        const int s =
            socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (s < 0) continue;
        if (connect(s, a->ai_addr, a->ai_addrlen) == 0) {
          fd_ = s;
        } else {
          err = errno;
          close(s);
        }
      }
      if (fd_ < 0) usleep(100'000);
    }
    freeaddrinfo(res);
    if (fd_ < 0)
      die(kSetup, "connect %s:%u: %s", host.c_str(), port, strerror(err));
    const int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }

  void send_all(const void* p, size_t n) override {
    const auto* b = static_cast<const uint8_t*>(p);
    while (n) {
      const ssize_t k = send(fd_, b, n, MSG_NOSIGNAL);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0)
        die(kPeerLost, "peer lost: side channel: %s",
            k < 0 ? strerror(errno) : "closed");
      b += k;
      n -= size_t(k);
    }
  }
  void recv_all(void* p, size_t n) override {
    auto* b = static_cast<uint8_t*>(p);
    while (n) {
      const ssize_t k = recv(fd_, b, n, 0);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0)
        die(kPeerLost, "peer lost: side channel: %s",
            k < 0 ? strerror(errno) : "closed");
      b += k;
      n -= size_t(k);
    }
  }
  bool readable(int timeout_ms) override {
    pollfd p{fd_, POLLIN, 0};
    return poll(&p, 1, timeout_ms) > 0;
  }

  void wait_close(int ms) override {
    char b[64];
    for (uint64_t end = now_ns() + uint64_t(ms) * 1'000'000u; now_ns() < end;)
      if (readable(10) && recv(fd_, b, sizeof b, 0) <= 0) return;
  }

 private:
  int fd_ = -1;
};

}  // namespace seeds
