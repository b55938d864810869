#include "perf/urnic-perf/exchange.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace urnic::perf {

Channel::~Channel() {
  if (fd_ >= 0) close(fd_);
}

bool Channel::listen_accept(uint16_t port, std::string& err) {
  const int l = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (l < 0) {
    err = std::string("socket: ") + strerror(errno);
    return false;
  }
  const int one = 1, zero = 0;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  setsockopt(l, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);  // v4 too
  sockaddr_in6 sa{};
  sa.sin6_family = AF_INET6;
  sa.sin6_port = htons(port);
  sa.sin6_addr = in6addr_any;
  if (bind(l, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      listen(l, 1) != 0) {
    err =
        "bind/listen on port " + std::to_string(port) + ": " + strerror(errno);
    close(l);
    return false;
  }
  fd_ = accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
  close(l);
  if (fd_ < 0) {
    err = std::string("accept: ") + strerror(errno);
    return false;
  }
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return true;
}

bool Channel::connect_to(const std::string& host, uint16_t port,
                         std::string& err) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string ps = std::to_string(port);
  if (const int rc = getaddrinfo(host.c_str(), ps.c_str(), &hints, &res)) {
    err = host + ": " + gai_strerror(rc);
    return false;
  }
  // The server may still be starting: retry for a few seconds.
  for (int attempt = 0; attempt < 50 && fd_ < 0; ++attempt) {
    for (addrinfo* a = res; a; a = a->ai_next) {
      const int s =
          socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (s < 0) continue;
      if (connect(s, a->ai_addr, a->ai_addrlen) == 0) {
        fd_ = s;
        break;
      }
      err = "connect " + host + ":" + ps + ": " + strerror(errno);
      close(s);
    }
    if (fd_ < 0) usleep(100'000);
  }
  freeaddrinfo(res);
  if (fd_ < 0) return false;
  const int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return true;
}

bool Channel::send_all(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  while (n) {
    const ssize_t k = send(fd_, b, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    b += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool Channel::recv_all(void* p, size_t n) {
  auto* b = static_cast<uint8_t*>(p);
  while (n) {
    const ssize_t k = recv(fd_, b, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    b += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool Channel::readable(int timeout_ms) {
  pollfd p{fd_, POLLIN, 0};
  return poll(&p, 1, timeout_ms) == 1;
}

}  // namespace urnic::perf
