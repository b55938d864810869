// The one table of RoCEv2 opcode properties (IBTA vol. 1 table 38, 9.2.1;
// CNP from Annex A17.9.4): which extension headers each opcode carries, in
// which order, whether it is a request or a response, its place in a
// message (first/middle/last/only), and whether it may carry payload.
// Everything else (offsets, header lengths) is derived at compile time.
#pragma once

#include <array>
#include <cstdint>

#include "dataplane/wire/headers.h"

namespace urnic::wire {

// Extension headers, in the order they follow the BTH (IBTA 9.2, fig. 36).
enum class Ext : uint8_t {
  kDeth,
  kReth,
  kAtomicEth,
  kAeth,
  kAtomicAckEth,
  kImmDt,
  kIeth,
  kCnpPad,
  kCount
};
constexpr uint8_t kExtCount = static_cast<uint8_t>(Ext::kCount);
constexpr uint8_t kExtSize[kExtCount] = {
    sizeof(Deth),         sizeof(Reth),  sizeof(AtomicEth), sizeof(Aeth),
    sizeof(AtomicAckEth), sizeof(ImmDt), sizeof(Ieth),      sizeof(CnpPad)};
constexpr const char* kExtName[kExtCount] = {
    "DETH",         "RETH",  "AtomicETH", "AETH",
    "AtomicAckETH", "ImmDt", "IETH",      "CNP"};

constexpr uint32_t ext_bit(Ext e) {
  return 1u << static_cast<uint8_t>(e);
}

// Property bits (above the Ext bits).
enum OpMask : uint32_t {
  kDeth = ext_bit(Ext::kDeth),
  kReth = ext_bit(Ext::kReth),
  kAtomicEth = ext_bit(Ext::kAtomicEth),
  kAeth = ext_bit(Ext::kAeth),
  kAtomicAck = ext_bit(Ext::kAtomicAckEth),
  kImm = ext_bit(Ext::kImmDt),
  kIeth = ext_bit(Ext::kIeth),
  kCnp = ext_bit(Ext::kCnpPad),
  kExtMask = (1u << kExtCount) - 1,

  kReq = 1u << 12,      // requester -> responder
  kResp = 1u << 13,     // responder -> requester
  kPayload = 1u << 14,  // may carry payload
  kFirst = 1u << 15,
  kMiddle = 1u << 16,
  kLast = 1u << 17,
  kOnly = kFirst | kLast,
  kSend = 1u << 18,
  kWrite = 1u << 19,
  kRead = 1u << 20,    // read request or read response
  kAtomic = 1u << 21,  // atomic request or atomic ack
  kAck = 1u << 22,     // carries an AETH meaning "acknowledge"
  // ATOMIC WRITE (IBTA 1.5, A19.4): an RDMA WRITE ONLY of 8 bytes that the
  // responder stores as one atomic, ordered store.
  kAtomicWrite = 1u << 23,
  kRc = 1u << 24,
  kUc = 1u << 25,
  kUd = 1u << 26,
  kCnpOp = 1u << 27,
};

struct OpcodeInfo {
  const char* name = nullptr;  // nullptr: opcode not supported
  uint32_t mask = 0;
  uint8_t hdr_len = 0;                 // BTH + extension headers
  uint8_t ext_offset[kExtCount] = {};  // from the start of the BTH

  constexpr bool valid() const { return name != nullptr; }
  constexpr bool has(uint32_t m) const { return (mask & m) == m; }
  constexpr bool has_ext(Ext e) const { return mask & ext_bit(e); }
};

namespace opcode {
// RC 0x00-0x1f, UC 0x20-0x3f, UD 0x60-0x7f, CNP 0x81 (IBTA table 38).
constexpr uint8_t kRcSendFirst = 0x00, kRcSendMiddle = 0x01, kRcSendLast = 0x02,
                  kRcSendLastImm = 0x03, kRcSendOnly = 0x04,
                  kRcSendOnlyImm = 0x05, kRcWriteFirst = 0x06,
                  kRcWriteMiddle = 0x07, kRcWriteLast = 0x08,
                  kRcWriteLastImm = 0x09, kRcWriteOnly = 0x0a,
                  kRcWriteOnlyImm = 0x0b, kRcReadRequest = 0x0c,
                  kRcReadRespFirst = 0x0d, kRcReadRespMiddle = 0x0e,
                  kRcReadRespLast = 0x0f, kRcReadRespOnly = 0x10, kRcAck = 0x11,
                  kRcAtomicAck = 0x12, kRcCmpSwap = 0x13, kRcFetchAdd = 0x14,
                  kRcSendLastInv = 0x16, kRcSendOnlyInv = 0x17,
                  kRcAtomicWrite = 0x1d;
constexpr uint8_t kUcBase = 0x20;  // UC opcode = kUcBase + RC send/write op
constexpr uint8_t kUdSendOnly = 0x64, kUdSendOnlyImm = 0x65;
constexpr uint8_t kCnp = 0x81;
}  // namespace opcode

namespace detail {

struct OpDef {
  uint8_t op;
  const char* name;
  uint32_t mask;
};

// clang-format off
constexpr OpDef kOpDefs[] = {
  {0x00, "RC_SEND_FIRST",              kRc | kReq | kSend | kPayload | kFirst},
  {0x01, "RC_SEND_MIDDLE",             kRc | kReq | kSend | kPayload | kMiddle},
  {0x02, "RC_SEND_LAST",               kRc | kReq | kSend | kPayload | kLast},
  {0x03, "RC_SEND_LAST_WITH_IMM",      kRc | kReq | kSend | kPayload | kLast | kImm},
  {0x04, "RC_SEND_ONLY",               kRc | kReq | kSend | kPayload | kOnly},
  {0x05, "RC_SEND_ONLY_WITH_IMM",      kRc | kReq | kSend | kPayload | kOnly | kImm},
  {0x06, "RC_RDMA_WRITE_FIRST",        kRc | kReq | kWrite | kPayload | kFirst | kReth},
  {0x07, "RC_RDMA_WRITE_MIDDLE",       kRc | kReq | kWrite | kPayload | kMiddle},
  {0x08, "RC_RDMA_WRITE_LAST",         kRc | kReq | kWrite | kPayload | kLast},
  {0x09, "RC_RDMA_WRITE_LAST_WITH_IMM",kRc | kReq | kWrite | kPayload | kLast | kImm},
  {0x0a, "RC_RDMA_WRITE_ONLY",         kRc | kReq | kWrite | kPayload | kOnly | kReth},
  {0x0b, "RC_RDMA_WRITE_ONLY_WITH_IMM",kRc | kReq | kWrite | kPayload | kOnly | kReth | kImm},
  {0x0c, "RC_RDMA_READ_REQUEST",       kRc | kReq | kRead | kOnly | kReth},
  {0x0d, "RC_RDMA_READ_RESPONSE_FIRST",kRc | kResp | kRead | kPayload | kFirst | kAeth},
  {0x0e, "RC_RDMA_READ_RESPONSE_MIDDLE",kRc | kResp | kRead | kPayload | kMiddle},
  {0x0f, "RC_RDMA_READ_RESPONSE_LAST", kRc | kResp | kRead | kPayload | kLast | kAeth},
  {0x10, "RC_RDMA_READ_RESPONSE_ONLY", kRc | kResp | kRead | kPayload | kOnly | kAeth},
  {0x11, "RC_ACKNOWLEDGE",             kRc | kResp | kAck | kOnly | kAeth},
  {0x12, "RC_ATOMIC_ACKNOWLEDGE",      kRc | kResp | kAtomic | kOnly | kAeth | kAtomicAck},
  {0x13, "RC_COMPARE_SWAP",            kRc | kReq | kAtomic | kOnly | kAtomicEth},
  {0x14, "RC_FETCH_ADD",               kRc | kReq | kAtomic | kOnly | kAtomicEth},
  {0x16, "RC_SEND_LAST_WITH_INVALIDATE",kRc | kReq | kSend | kPayload | kLast | kIeth},
  {0x17, "RC_SEND_ONLY_WITH_INVALIDATE",kRc | kReq | kSend | kPayload | kOnly | kIeth},
  {0x1d, "RC_ATOMIC_WRITE",            kRc | kReq | kWrite | kAtomicWrite | kPayload | kOnly | kReth},
  {0x20, "UC_SEND_FIRST",              kUc | kReq | kSend | kPayload | kFirst},
  {0x21, "UC_SEND_MIDDLE",             kUc | kReq | kSend | kPayload | kMiddle},
  {0x22, "UC_SEND_LAST",               kUc | kReq | kSend | kPayload | kLast},
  {0x23, "UC_SEND_LAST_WITH_IMM",      kUc | kReq | kSend | kPayload | kLast | kImm},
  {0x24, "UC_SEND_ONLY",               kUc | kReq | kSend | kPayload | kOnly},
  {0x25, "UC_SEND_ONLY_WITH_IMM",      kUc | kReq | kSend | kPayload | kOnly | kImm},
  {0x26, "UC_RDMA_WRITE_FIRST",        kUc | kReq | kWrite | kPayload | kFirst | kReth},
  {0x27, "UC_RDMA_WRITE_MIDDLE",       kUc | kReq | kWrite | kPayload | kMiddle},
  {0x28, "UC_RDMA_WRITE_LAST",         kUc | kReq | kWrite | kPayload | kLast},
  {0x29, "UC_RDMA_WRITE_LAST_WITH_IMM",kUc | kReq | kWrite | kPayload | kLast | kImm},
  {0x2a, "UC_RDMA_WRITE_ONLY",         kUc | kReq | kWrite | kPayload | kOnly | kReth},
  {0x2b, "UC_RDMA_WRITE_ONLY_WITH_IMM",kUc | kReq | kWrite | kPayload | kOnly | kReth | kImm},
  {0x64, "UD_SEND_ONLY",               kUd | kReq | kSend | kPayload | kOnly | kDeth},
  {0x65, "UD_SEND_ONLY_WITH_IMM",      kUd | kReq | kSend | kPayload | kOnly | kDeth | kImm},
  {0x81, "CNP",                        kCnpOp | kCnp},
};
// clang-format on

constexpr std::array<OpcodeInfo, 256> build_table() {
  std::array<OpcodeInfo, 256> t{};
  for (const OpDef& d : kOpDefs) {
    OpcodeInfo& e = t[d.op];
    e.name = d.name;
    e.mask = d.mask;
    uint8_t off = sizeof(Bth);
    for (uint8_t i = 0; i < kExtCount; ++i) {
      if (d.mask & (1u << i)) {
        e.ext_offset[i] = off;
        off = static_cast<uint8_t>(off + kExtSize[i]);
      }
    }
    e.hdr_len = off;
  }
  return t;
}

}  // namespace detail

inline constexpr std::array<OpcodeInfo, 256> kOpcodeTable =
    detail::build_table();

constexpr const OpcodeInfo& opcode_info(uint8_t op) {
  return kOpcodeTable[op];
}

// Longest extension-header set of any opcode (AtomicETH: 28).
constexpr uint8_t kMaxExtLen = [] {
  uint8_t m = 0;
  for (const OpcodeInfo& i : kOpcodeTable)
    if (i.valid() && i.hdr_len - sizeof(Bth) > m)
      m = static_cast<uint8_t>(i.hdr_len - sizeof(Bth));
  return m;
}();
static_assert(kMaxExtLen == sizeof(AtomicEth));

// Compile-time spot checks of the derived layout against IBTA.
static_assert(opcode_info(opcode::kRcWriteOnlyImm).hdr_len == 12 + 16 + 4);
static_assert(opcode_info(opcode::kRcAtomicAck).hdr_len == 12 + 4 + 8);
static_assert(opcode_info(opcode::kRcCmpSwap).hdr_len == 12 + 28);
static_assert(opcode_info(opcode::kUdSendOnlyImm)
                  .ext_offset[static_cast<uint8_t>(Ext::kImmDt)] == 12 + 8);
static_assert(opcode_info(opcode::kCnp).hdr_len == 12 + 16);
static_assert(opcode_info(opcode::kRcAtomicWrite).hdr_len == 12 + 16);
static_assert(!opcode_info(0x15).valid() && !opcode_info(0x40).valid());

}  // namespace urnic::wire
