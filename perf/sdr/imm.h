// SDR's 32-bit immediate (seed 001): message id (10 bits) | chunk offset
// (18 bits) | user bits (4). Host order here; the verbs imm_data field is
// big-endian (htonl when posting, ntohl when polling).
#pragma once

#include <cstdint>

namespace sdr {

inline constexpr uint32_t kMsgIdBits = 10;
inline constexpr uint32_t kChunkBits = 18;
inline constexpr uint32_t kUserBits = 4;
static_assert(kMsgIdBits + kChunkBits + kUserBits == 32);

inline constexpr uint32_t kMsgIdMask = (1u << kMsgIdBits) - 1;
inline constexpr uint32_t kChunkMask = (1u << kChunkBits) - 1;
inline constexpr uint32_t kUserMask = (1u << kUserBits) - 1;

inline constexpr uint32_t kMaxSlots = kMsgIdMask + 1;  // message ids
// The last chunk offset marks the end of a round of chunks (a zero-length
// write after them on the same QP), so a message has at most 2^18 - 1.
inline constexpr uint32_t kMarkerChunk = kChunkMask;
inline constexpr uint32_t kMaxChunks = kMarkerChunk;

struct Imm {
  uint32_t msg_id;  // the slot of the receiver's table
  uint32_t chunk;   // chunk index within the message, or kMarkerChunk
  uint32_t user;    // here: the slot's use count mod 16 (stale writes)
};

constexpr uint32_t encode_imm(uint32_t msg_id, uint32_t chunk, uint32_t user) {
  return (msg_id & kMsgIdMask) << (kChunkBits + kUserBits) |
         (chunk & kChunkMask) << kUserBits | (user & kUserMask);
}

constexpr Imm decode_imm(uint32_t imm) {
  return {imm >> (kChunkBits + kUserBits) & kMsgIdMask,
          imm >> kUserBits & kChunkMask, imm & kUserMask};
}

static_assert(encode_imm(1, 0, 0) == 1u << 22);
static_assert(encode_imm(0, 1, 0) == 1u << 4);
static_assert(decode_imm(encode_imm(1023, kMarkerChunk, 15)).msg_id == 1023);
static_assert(decode_imm(encode_imm(1023, kMarkerChunk, 15)).chunk ==
              kMarkerChunk);
static_assert(decode_imm(encode_imm(5, 77, 9)).user == 9);

}  // namespace sdr
