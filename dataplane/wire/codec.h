// Frame classification and RoCEv2 encode/decode on plain byte buffers (no
// DPDK types, so it is unit-tested and fuzzed alone). Decoding never reads
// outside the buffers it is given and reports each malformation by reason.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <utility>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "dataplane/wire/headers.h"
#include "dataplane/wire/icrc.h"
#include "dataplane/wire/opcode.h"

namespace urnic::wire {

// One contiguous piece of a frame (an mbuf segment, an external buffer).
struct ConstBuf {
  const uint8_t* data;
  uint32_t len;
};

// Why a frame was rejected. Each reason has its own counter (name table in
// codec.cc, checked against this enum at compile time).
enum class Malformed : uint8_t {
  kNone,
  kTruncated,          // frame shorter than the headers it announces
  kSplitHeaders,       // headers not contiguous in the first segment
  kVlanStacked,        // QinQ / more than one tag
  kIpVersion,          // version nibble disagrees with the EtherType
  kIpHeaderLen,        // IPv4 IHL < 5
  kIpTotalLen,         // IP length beyond the frame or below the header
  kIpChecksum,         // IPv4 header checksum
  kIpFragment,         // RoCEv2 is never fragmented (Annex A17.4.5.4)
  kIpSource,           // RoCE from no unicast host (0/8, 127/8, 224/3, ::, ::1,
                       // ff00::/8)
  kUdpLen,             // UDP length disagrees with the IP length
  kBthVersion,         // TVer != 0
  kUnknownOpcode,      // not RC/UC/UD/CNP (includes RD)
  kBadLength,          // payload+pad not a multiple of 4, or shorter than pad
  kPayloadNotAllowed,  // opcode carries no payload, but there is some
  kBadIcrc,
  kCount
};
const char* malformed_name(Malformed m);

enum class FrameKind : uint8_t {
  kRoce,  // valid RoCEv2 (UDP 4791, ICRC checked)
  kArp,
  kIcmpv4,   // for the host's ICMP handler
  kIcmpv6,   // includes neighbour discovery
  kOtherIp,  // valid IP, not for us to handle (other UDP ports, TCP, ...)
  kOtherL2,  // not IP or ARP
  kMalformed,
};

// urnic's P_Key table is the default partition alone (0xFFFF): a packet's
// P_Key matches it as a full (0xFFFF) or limited (0x7FFF) member (IBTA
// 9.6.1.1, C9-42; rxe's pkey_match against its default entry).
constexpr bool pkey_ok(uint16_t pkey) {
  return (pkey & 0x7fff) == 0x7fff;
}

// Fields of one RoCEv2 packet, both what encode() takes and what decode
// produces; GIDs are IPv4-mapped (::ffff:a.b.c.d) for IPv4.
struct RoceFields {
  MacAddr dst_mac{};
  MacAddr src_mac{};
  bool vlan = false;
  uint16_t vlan_tci = 0;
  bool ipv6 = false;
  uint8_t sgid[16] = {};
  uint8_t dgid[16] = {};
  uint8_t tclass = 0;  // IPv4 TOS or IPv6 traffic class
  uint8_t ttl = 64;    // or hop limit
  uint32_t flow_label = 0;
  uint16_t ip_id = 0;
  bool dont_fragment = true;
  uint16_t udp_sport = 0xc000;
  // BTH
  uint8_t opcode = 0;
  bool se = false;
  bool migreq = false;
  uint16_t pkey = 0xffff;
  bool fecn = false;
  bool becn = false;
  uint32_t dqpn = 0;
  bool ack_req = false;
  uint32_t psn = 0;
  // Extension headers (used when the opcode carries them)
  uint64_t reth_va = 0;
  uint32_t reth_rkey = 0;
  uint32_t reth_len = 0;
  uint8_t aeth_syndrome = 0;
  uint32_t aeth_msn = 0;
  uint64_t atomic_va = 0;
  uint32_t atomic_rkey = 0;
  uint64_t atomic_swap_add = 0;
  uint64_t atomic_compare = 0;
  uint64_t atomic_orig = 0;
  uint32_t imm = 0;  // ImmDt as a big-endian number
  uint32_t ieth_rkey = 0;
  uint32_t deth_qkey = 0;
  uint32_t deth_src_qp = 0;
  uint32_t payload_len = 0;  // excluding pad and ICRC

  bool operator==(const RoceFields&) const = default;
};

// Where things are in a decoded frame (offsets from the frame start).
struct FrameInfo {
  FrameKind kind = FrameKind::kMalformed;
  Malformed why = Malformed::kNone;
  uint16_t l3_off = 0;
  uint16_t l4_off = 0;  // UDP / ICMP / ARP body
  uint16_t bth_off = 0;
  uint32_t payload_off = 0;
  uint32_t l3_len = 0;      // IP total length (header + payload)
  uint16_t ether_type = 0;  // after the VLAN tag
  uint8_t ip_hdr_len = 0;
  uint8_t l4_proto = 0;
  const OpcodeInfo* op = nullptr;
  RoceFields roce;  // filled for kRoce only
};

// Zero-fills a small trivially copyable object (a FrameInfo) with 16-byte
// stores: all bytes zero, not its members' default values. For ~200 bytes GCC's
// generic tuning emits `rep stos`, whose start-up cost made the three such
// fills of every packet ~10 % of a worker's samples (64 B WRITEs,
// perf/README.md). The stores are a fold expression, not a loop: GCC turns a
// loop of them back into a memset (and so `rep stos`).
#if defined(__SSE2__)
template <size_t... I>
inline void zero_16s(unsigned char* d, std::index_sequence<I...>) {
  const __m128i z = _mm_setzero_si128();
  (_mm_storeu_si128(reinterpret_cast<__m128i*>(d + 16 * I), z), ...);
}
#endif
template <typename T>
inline void zero_fill(T& obj) {
  static_assert(std::is_trivially_copyable_v<T>);
  auto* d = reinterpret_cast<unsigned char*>(&obj);
#if defined(__SSE2__)
  zero_16s(d, std::make_index_sequence<sizeof(T) / 16>{});
  std::memset(d + sizeof(T) / 16 * 16, 0, sizeof(T) % 16);
#else
  std::memset(d, 0, sizeof(T));
#endif
}

// Classifies and, for RoCEv2, fully decodes a frame whose bytes are
// `segs` (in order; headers must sit in segs[0]). `frame_len` is the frame
// length (Ethernet padding after the IP packet is allowed). ICRC is
// verified over all segments.
// `ip_csum_ok`: the NIC verified the IPv4 header checksum (an RX offload
// flag), so it is not recomputed.
// `writable`: segs[0].data, if the caller owns those bytes alone and lets
// the ICRC check write into them (restored before return; Icrc::in_place),
// else null.
void decode(std::span<const ConstBuf> segs, uint32_t frame_len, FrameInfo& out,
            bool ip_csum_ok = false, uint8_t* writable = nullptr);
inline void decode(const uint8_t* frame, uint32_t len, FrameInfo& out) {
  const ConstBuf seg{frame, len};
  decode({&seg, 1}, len, out);
}

// Length of L2..extension headers that encode_headers() writes.
uint32_t header_len(const RoceFields& f);
// Pad bytes after a payload of `len` (IBTA 9.2.2: to a 4-byte boundary).
constexpr uint32_t pad_for(uint32_t len) {
  return (4 - (len & 3)) & 3;
}
// Trailer bytes (pad + ICRC) after a payload of `len`.
constexpr uint32_t trailer_len(uint32_t len) {
  return pad_for(len) + kIcrcSize;
}

// Writes Ethernet (+VLAN), IP, UDP, BTH and extension headers for a packet
// that will carry f.payload_len bytes of payload; lengths and the IPv4
// header checksum are filled in. Returns bytes written, or 0 if `cap` is too
// small, the opcode is unknown, or it may not carry payload.
uint32_t encode_headers(const RoceFields& f, uint8_t* buf, uint32_t cap);

// Ethernet (+VLAN), IP and UDP of every packet of one flow, built once (a
// QP's path: MACs, VLAN, IP addresses, hop limit, flow label, UDP ports).
// The second encode_headers() copies it and patches what varies per
// packet: the traffic class (ECN bits), the IP and UDP lengths, the IPv4
// id and header checksum (from the sum of the words that do not vary).
struct HeaderTemplate {
  static constexpr uint32_t kMaxLen = 14 + 4 + 40 + 8;
  uint8_t bytes[kMaxLen] = {};
  uint8_t len = 0;     // bytes used; 0: not built
  uint8_t l3_off = 0;  // the IP header
  bool ipv6 = false;
  uint32_t csum_rest = 0;  // IPv4: folded sum of the header from byte 6
};
// `f`'s address fields make the template; its per-packet fields do not
// matter.
void build_template(const RoceFields& f, HeaderTemplate& t);
// As encode_headers(f, ...), byte for byte, for a packet whose address
// fields are the ones `t` was built from (checked in tests, not here).
uint32_t encode_headers(const HeaderTemplate& t, const RoceFields& f,
                        uint8_t* buf, uint32_t cap);

// Given headers written by encode_headers() and the payload pieces, writes
// pad bytes and the ICRC to `trailer` (room for 3 + 4). Returns its length.
uint32_t encode_trailer(const uint8_t* hdrs, const RoceFields& f,
                        std::span<const ConstBuf> payload, uint8_t* trailer);

// The trailer of a frame whose payload is summed piece by piece as it is
// copied into the frame (transport::TxFrame::unsealed): the ICRC then
// covers exactly the bytes that leave, whatever their source does
// meanwhile. `hdrs` and `f` as for encode_trailer(); update() each piece
// of the copy in order, then finish() writes pad and ICRC to `trailer`
// (room for 3 + 4) and returns its length.
class TrailerSum {
 public:
  TrailerSum(const uint8_t* hdrs, const RoceFields& f);
  void update(const uint8_t* p, uint32_t n) { icrc_.update(p, n); }
  uint32_t finish(uint8_t* trailer);

 private:
  Icrc icrc_;
  uint32_t pad_;
};

// Encodes a whole frame into one buffer. Returns its length, or 0.
uint32_t encode_frame(const RoceFields& f, const uint8_t* payload, uint8_t* buf,
                      uint32_t cap);

// Internet checksum (RFC 1071) of `n` bytes, folded, not complemented.
uint32_t csum_partial(const uint8_t* p, size_t n, uint32_t sum = 0);
uint16_t csum_fold(uint32_t sum);

// The IP header of a RoCEv2 frame (UDP to 4791) within its first `len`
// bytes, or null; *v6 says which IP version. Reads only what is there.
uint8_t* roce_ip(uint8_t* frame, uint32_t len, bool* v6);

// Marks an ECN-capable (ECT(0) or ECT(1)) RoCEv2 frame Congestion
// Experienced, as a switch queue would (RFC 3168 5), fixing the IPv4 header
// checksum. False if it is not ECN-capable or not RoCEv2. The ICRC masks the
// ECN bits (Annex A17.4.1), so it stays valid.
bool mark_ce(uint8_t* frame, uint32_t len);

// IPv4-mapped GID helpers.
void gid_from_ipv4(uint32_t addr, uint8_t gid[16]);
bool gid_is_ipv4(const uint8_t gid[16]);
uint32_t gid_to_ipv4(const uint8_t gid[16]);

// Multicast: a GID that is an IPv4-mapped 224.0.0.0/4 address (RFC 5771) or
// an IPv6 ff00::/8 one (RFC 4291 2.7), and the destination QPN of every
// packet to a group (IBTA 9.6.1.1; Annex A17 keeps it for RoCEv2).
constexpr uint32_t kMulticastQpn = 0xffffff;
constexpr bool ipv4_is_multicast(uint32_t addr) {  // host order
  return (addr & 0xf0000000u) == 0xe0000000u;
}
bool gid_is_multicast(const uint8_t gid[16]);
constexpr bool ipv4_is_loopback(uint32_t addr) {  // host order, 127.0.0.0/8
  return (addr >> 24) == 127;
}
// The group's Ethernet address, without ARP or ND: 01:00:5e + the low 23
// bits of an IPv4 group (RFC 1112 6.4), 33:33 + the low 32 bits of an IPv6
// one (RFC 2464 7).
void multicast_mac(const uint8_t gid[16], MacAddr& mac);

}  // namespace urnic::wire
