// The control-socket client of liburnic-verbs.so (framing: ctl_proto.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "dataplane/hostif/ctl_proto.h"

namespace urnic::shim {

constexpr int kMaxReplyFds = static_cast<int>(ctl::kMaxReplyFds);

struct Reply {
  int status = 0;            // the service's: 0 or -errno
  std::string_view payload;  // in the caller's buffer
  int fds[kMaxReplyFds] = {};
  int nfds = 0;
  void close_fds();
};

// Connects to a service's control socket (SEQPACKET, close-on-exec).
// 0 or an errno value.
int connect_service(const std::string& path, int* fd_out);

// Sends one request (+ fds) and waits up to timeout_ms for its reply.
// Returns 0 when a reply arrived (its status may still be an error), else
// the transport's errno (ECONNRESET: the service closed; ETIMEDOUT; EPROTO:
// not a reply).
int transact(int fd, uint16_t op, const void* body, size_t len, const int* fds,
             int nfds, char* buf, size_t buflen, Reply* rep, int timeout_ms);

enum class HelloFail { kNone, kConnect, kNoAnswer, kRefused };

// kHello on a connection of its own: 0 and the service's version text, or
// an errno value and where it failed (kRefused: *text is its message).
int hello(const std::string& path, std::string* text, HelloFail* how);

}  // namespace urnic::shim
