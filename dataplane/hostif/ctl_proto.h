// Control-socket protocol between urnicd and its clients (urnicctl and the
// verbs shim, whose messages are dataplane/hostif/abi.h). Unix SEQPACKET: one
// request message, one reply message, each a CtlHdr followed by `len` bytes.
// Versioned so that a mismatched client gets a clear error instead of garbage.
#pragma once

#include <cstdint>

namespace urnic::ctl {

constexpr uint32_t kMagic = 0x434e5255;  // "URNC" little-endian
// 2: the verbs shim operations; 3: DoorbellPage::pending is a mask of
// summary words (QPs on several lcores).
constexpr uint16_t kVersion = 3;
constexpr uint32_t kMaxMsg = 64 * 1024;
// Fds in one reply, at most (the shim's kOpen: the doorbell page and one
// bell per worker lcore).
constexpr uint32_t kMaxReplyFds = 20;

enum class Op : uint16_t {
  kHello = 1,      // reply: "urnicd <version> proto <n>"
  kStatsText = 2,  // reply: testpmd-style text
  kStatsJson = 3,  // reply: JSON
  kPing = 4,       // payload: IPv4 dotted quad; the service sends one echo
  kGids = 5,       // reply: one "index gid" line per GID
  kObjects = 6,    // reply: verbs objects, per device and per client
  // Per-QP and per-lcore counters, one page of QPs. Payload: the decimal
  // QPN to start from (empty: 0); the reply says where the next page starts.
  kQpStats = 7,      // reply: JSON (stats::format_qps_json)
  kQpStatsText = 8,  // reply: a table; "next N" last when there is more
  // Fault injection (config `fault`). Payload: "key=value" words (keys of
  // the fault section, "fault." optional), empty to only read; reply: the
  // settings in effect, one "fault.key=value" per line.
  kFault = 9,
  // 100..199: the verbs shim (dataplane/hostif/abi.h)
};

struct Hdr {
  uint32_t magic = kMagic;
  uint16_t version = kVersion;
  uint16_t op = 0;
  int32_t status = 0;  // reply: 0 or -errno; payload then holds a message
  uint32_t len = 0;    // payload bytes after the header
};
static_assert(sizeof(Hdr) == 16);

}  // namespace urnic::ctl
