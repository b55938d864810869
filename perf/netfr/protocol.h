// What netfr's two ends agree on: the test parameters, the receiver's
// ring, the notify that follows each frame's WRITE, and the side
// channel's end-of-run message. Credits travel on the QPs themselves: a
// zero-length SEND_WITH_IMM whose immediate is the QP's running count of
// freed ring buffers.
#pragma once

#include <cstdint>

namespace netfr {

inline constexpr uint32_t kMagic = 0x4e465231;  // "NFR1"
inline constexpr uint32_t kQps = 2;             // frames alternate over two QPs

// Client (sender) -> server (receiver): the server runs with these.
struct Params {
  uint32_t magic = kMagic;
  uint32_t frame_size = 65536;  // -s
  uint64_t count = 10000;       // -n: frames
  uint32_t rate_fps = 0;        // --rate: 0 = as fast as credits allow
  uint32_t ring = 16;           // --ring: receiver buffers (= credits) per QP
  uint32_t verify = 0;          // --verify
  uint32_t pad = 0;
};

// Server -> client: the ring, kQps x ring buffers of `stride` bytes; QP q
// writes buffers q * ring .. q * ring + ring - 1, in turn.
struct Ring {
  uint64_t addr = 0;
  uint32_t rkey = 0;
  uint32_t stride = 0;
};

// The SEND after each frame's WRITE. t_ns is the sender's CLOCK_MONOTONIC
// when it posted the frame: latency is only meaningful with both ends on
// one host.
struct Notify {
  uint64_t seq;  // global frame number across both QPs
  uint64_t t_ns;
  uint32_t buf;  // ring buffer within the QP's half
  uint32_t len;
};

// Receiver -> sender over TCP when every frame is delivered: status 0, or
// 5 when a byte differed (sent first, then the receiver exits with it).
struct Done {
  uint32_t status = 0;
  uint32_t pad = 0;
};

inline uint64_t pattern_seed(uint64_t seq) {
  return seq ^ 0x4e46520000000000ull;
}

}  // namespace netfr
