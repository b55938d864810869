// urnic-perf's TCP side channel (as perftest's): the client sends the test
// parameters, both sides swap per-QP connection data, then they exchange
// small fixed-size control messages (begin/end of a size, results).
#pragma once

#include <cstdint>
#include <string>

namespace urnic::perf {

// One QP's end of a connection.
struct QpWire {
  uint32_t qpn = 0;
  uint32_t psn = 0;
  uint8_t gid[16] = {};
  uint32_t rkey = 0;
  uint32_t pad = 0;
  uint64_t addr = 0;  // base of this QP's slots in the peer's MR
};

enum class Msg : uint32_t { kBegin = 1, kEnd = 2, kResult = 3, kBye = 4 };

struct CtlMsg {
  Msg type = Msg::kBegin;
  uint32_t size_index = 0;
  uint64_t a = 0, b = 0, c = 0;  // kResult: ops, verify errors, errors
};

class Channel {
 public:
  ~Channel();
  // Server: listens on port, accepts one client. Client: connects. false
  // and a message in `err` on failure.
  bool listen_accept(uint16_t port, std::string& err);
  bool connect_to(const std::string& host, uint16_t port, std::string& err);
  // Whole-buffer I/O; false when the peer is gone (the caller says so).
  bool send_all(const void* p, size_t n);
  bool recv_all(void* p, size_t n);
  bool send_msg(const CtlMsg& m) { return send_all(&m, sizeof m); }
  bool recv_msg(CtlMsg& m) { return recv_all(&m, sizeof m); }
  // True when a message can be read without blocking (or the peer left).
  bool readable(int timeout_ms);
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

}  // namespace urnic::perf
