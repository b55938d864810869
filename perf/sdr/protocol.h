// What sdr's sender and receiver say over the TCP side channel: the test
// parameters, the receiver's table, and the control messages of selective
// resend (sent / missing / complete / done). Also the message layout.
// Chunks and end-of-round markers travel on the QP (imm.h).
#pragma once

#include <cstdint>

namespace sdr {

inline constexpr uint32_t kMagic = 0x53445231;  // "SDR1"

// Client (sender) -> server (receiver): the server runs with these.
struct Params {
  uint32_t magic = kMagic;
  uint32_t msg_size = 65536;  // -s
  uint32_t chunk = 0;         // --chunk; 0: the path MTU (one packet)
  uint32_t slots = 16;        // --slots: table entries, messages in flight
  uint64_t count = 1000;      // -n: messages
  uint32_t uc = 0;            // --uc
  uint32_t verify = 0;        // --verify
  uint32_t nack_us = 10000;   // --nack-us
  uint32_t pad = 0;
};

// Server -> client with its QP end: the root MR holding the slot table.
struct Table {
  uint64_t addr = 0;
  uint32_t rkey = 0;
  uint32_t stride = 0;  // bytes from one slot to the next
  uint32_t chunk = 0;   // the chunk size both ends use
  uint32_t pad = 0;
};

enum class Ctl : uint32_t {
  kSent = 1,  // S->R: a round of (slot, use) is out (its marker completed)
  kMissing,   // R->S: these chunks did not arrive; nwords bitmap words follow
  kComplete,  // R->S: (slot, use) is complete; the slot is free again
  kDone,      // R->S: all messages complete; slot = exit status (0 or 5)
};

struct CtlMsg {
  Ctl type = Ctl::kSent;
  uint32_t slot = 0;
  uint32_t use = 0;
  uint32_t nwords = 0;
};

// The first bytes of every message: when the sender started it (for the
// receiver's completion latency: CLOCK_MONOTONIC, both ends on one host)
// and which message it is. The pattern (--verify) covers the rest.
struct MsgHeader {
  uint64_t t0_ns;
  uint32_t slot;
  uint32_t use;
};
inline constexpr uint32_t kHeaderBytes = sizeof(MsgHeader);

// A message is (slot, use): the use-th message placed in that slot.
inline uint64_t pattern_seed(uint32_t slot, uint32_t use) {
  return (uint64_t{slot} << 32 | use) ^ 0x5344520000000000ull;
}

}  // namespace sdr
