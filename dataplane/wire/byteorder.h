// Big-endian field types for wire headers: alignment 1, explicit load/store,
// so header structs can overlay any byte offset without UB.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

namespace urnic::wire {

template <typename T>
constexpr T to_be(T v) {
  if constexpr (std::endian::native == std::endian::little) {
    if constexpr (sizeof(T) == 2) return __builtin_bswap16(v);
    if constexpr (sizeof(T) == 4) return __builtin_bswap32(v);
    if constexpr (sizeof(T) == 8) return __builtin_bswap64(v);
  }
  return v;
}

// A big-endian integer stored as raw bytes.
template <typename T>
struct Be {
  uint8_t b[sizeof(T)];
  T get() const {
    T v;
    std::memcpy(&v, b, sizeof v);
    return to_be(v);
  }
  void set(T v) {
    v = to_be(v);
    std::memcpy(b, &v, sizeof v);
  }
};
using Be16 = Be<uint16_t>;
using Be32 = Be<uint32_t>;
using Be64 = Be<uint64_t>;
static_assert(sizeof(Be64) == 8 && alignof(Be64) == 1);

// 24-bit big-endian values (PSN, QPN, MSN) live in the low 3 bytes of a Be32
// whose top byte carries flags; these helpers keep the masking in one place.
constexpr uint32_t kMask24 = 0x00ffffff;

inline uint16_t load_be16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] << 8 | p[1]);
}
inline uint32_t load_be32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 |
         p[3];
}
inline void store_be16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}
inline void store_be32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v >> 24);
  p[1] = static_cast<uint8_t>(v >> 16);
  p[2] = static_cast<uint8_t>(v >> 8);
  p[3] = static_cast<uint8_t>(v);
}

}  // namespace urnic::wire
