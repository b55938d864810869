// 24-bit packet sequence number arithmetic (IBTA 9.7.1): PSNs wrap at 2^24
// and compare within a window of 2^23, like serial numbers (RFC 1982).
#pragma once

#include <cstdint>

namespace urnic::transport {

constexpr uint32_t kPsnMask = 0x00ffffff;
constexpr uint32_t kPsnHalf = 0x00800000;  // comparison window

constexpr uint32_t psn_add(uint32_t psn, uint32_t n) {
  return (psn + n) & kPsnMask;
}
// Signed distance a - b in (-2^23, 2^23].
constexpr int32_t psn_diff(uint32_t a, uint32_t b) {
  return static_cast<int32_t>(((a - b) & kPsnMask) << 8) >> 8;
}
constexpr bool psn_before(uint32_t a, uint32_t b) {
  return psn_diff(a, b) < 0;
}
constexpr bool psn_after(uint32_t a, uint32_t b) {
  return psn_diff(a, b) > 0;
}

static_assert(psn_add(kPsnMask, 1) == 0);
static_assert(psn_diff(0, kPsnMask) == 1);
static_assert(psn_diff(kPsnMask, 0) == -1);
static_assert(psn_before(0xfffff0, 0x000010));
static_assert(psn_diff(5, 5) == 0);

}  // namespace urnic::transport
