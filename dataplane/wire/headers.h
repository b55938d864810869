// On-the-wire header layouts: Ethernet/802.1Q, ARP, IPv4, IPv6, UDP, ICMP,
// and the RoCEv2 transport headers of IBTA vol. 1 ch. 9.2-9.4 and Annex A17.
// All structs have alignment 1 and exact wire sizes (static_asserts below).
#pragma once

#include <cstdint>

#include "dataplane/wire/byteorder.h"

namespace urnic::wire {

constexpr uint16_t kEtherTypeIpv4 = 0x0800;
constexpr uint16_t kEtherTypeArp = 0x0806;
constexpr uint16_t kEtherTypeVlan = 0x8100;
constexpr uint16_t kEtherTypeQinQ = 0x88a8;
constexpr uint16_t kEtherTypeIpv6 = 0x86dd;
constexpr uint16_t kRoceV2Port = 4791;  // IANA, Annex A17.2.3
constexpr uint8_t kIpProtoIcmp = 1;
constexpr uint8_t kIpProtoIgmp = 2;
constexpr uint8_t kIpProtoUdp = 17;
constexpr uint8_t kIpProtoIcmpv6 = 58;

struct MacAddr {
  uint8_t b[6];
  bool operator==(const MacAddr&) const = default;
  bool is_multicast() const { return b[0] & 1; }
  bool is_broadcast() const {
    return (b[0] & b[1] & b[2] & b[3] & b[4] & b[5]) == 0xff;
  }
};

struct EthHdr {
  MacAddr dst;
  MacAddr src;
  Be16 ether_type;
};

struct VlanTag {
  Be16 tci;  // PCP(3) DEI(1) VID(12)
  Be16 ether_type;
};

struct ArpHdr {
  Be16 htype;  // 1 = Ethernet
  Be16 ptype;  // 0x0800
  uint8_t hlen;
  uint8_t plen;
  Be16 oper;  // 1 request, 2 reply
  MacAddr sha;
  Be32 spa;
  MacAddr tha;
  Be32 tpa;
};

struct Ipv4Hdr {
  uint8_t version_ihl;
  uint8_t tos;  // DSCP(6) ECN(2)
  Be16 total_length;
  Be16 id;
  Be16 frag;  // flags(3) offset(13)
  uint8_t ttl;
  uint8_t protocol;
  Be16 checksum;
  Be32 src;
  Be32 dst;
};

struct Ipv6Hdr {
  Be32 vtc_flow;  // version(4) traffic class(8) flow label(20)
  Be16 payload_length;
  uint8_t next_header;
  uint8_t hop_limit;
  uint8_t src[16];
  uint8_t dst[16];
};

struct UdpHdr {
  Be16 src_port;
  Be16 dst_port;
  Be16 length;
  Be16 checksum;
};

struct IcmpHdr {  // ICMPv4 and ICMPv6 share the first 8 bytes of echo
  uint8_t type;
  uint8_t code;
  Be16 checksum;
  Be16 id;
  Be16 seq;
};

// Base Transport Header, IBTA 9.2.
struct Bth {
  uint8_t opcode;
  uint8_t flags;  // SE(1) M(1) PadCnt(2) TVer(4)
  Be16 pkey;
  Be32 dqpn;  // FECN(1) BECN(1) Resv6a(6) DestQP(24)
  Be32 apsn;  // AckReq(1) Resv7(7) PSN(24)

  static constexpr uint8_t kSe = 0x80;
  static constexpr uint8_t kMigReq = 0x40;
  static constexpr uint32_t kFecn = 0x80000000u;
  static constexpr uint32_t kBecn = 0x40000000u;
  static constexpr uint32_t kAckReq = 0x80000000u;

  uint8_t pad_count() const { return (flags >> 4) & 3; }
  uint8_t tver() const { return flags & 0xf; }
  uint32_t qpn() const { return dqpn.get() & kMask24; }
  uint32_t psn() const { return apsn.get() & kMask24; }
  bool ack_req() const { return apsn.get() & kAckReq; }
};

// RDMA Extended Transport Header, IBTA 9.3.3.
struct Reth {
  Be64 va;
  Be32 rkey;
  Be32 dma_len;
};

// AETH syndrome values (IBTA 9.7.5.2.1, table 42): bits 6:5 say what the
// AETH is, bits 4:0 carry a value for it (credit count, RNR timer, NAK
// code); bit 7 is reserved, so a syndrome with it set has no known kind.
namespace aeth {
constexpr uint8_t kind(uint8_t syn) {
  return syn & 0xe0;
}
constexpr uint8_t value(uint8_t syn) {
  return syn & 0x1f;
}
// kind()
constexpr uint8_t kAck = 0x00;     // value: credit count
constexpr uint8_t kRnrNak = 0x20;  // value: RNR timer (table 45)
constexpr uint8_t kNak = 0x60;     // value: one of the NAK codes below
// ACK with the "invalid" credit count: no end-to-end credits (C9-150).
constexpr uint8_t kAckUnlimited = kAck | 0x1f;
// NAK codes, value() of a kNak syndrome (table 44).
constexpr uint8_t kNakPsnSeq = 0, kNakInvalidRequest = 1, kNakRemoteAccess = 2,
                  kNakRemoteOp = 3;
constexpr uint8_t nak(uint8_t code) {
  return kNak | code;
}
}  // namespace aeth

// ACK Extended Transport Header, IBTA 9.3.5: syndrome + MSN.
struct Aeth {
  Be32 syn_msn;  // Syndrome(8) MSN(24)
  uint8_t syndrome() const { return static_cast<uint8_t>(syn_msn.get() >> 24); }
  uint32_t msn() const { return syn_msn.get() & kMask24; }
};

// Atomic Extended Transport Header, IBTA 9.3.4.
struct AtomicEth {
  Be64 va;
  Be32 rkey;
  Be64 swap_add;
  Be64 compare;
};

// Atomic Acknowledge Extended Transport Header, IBTA 9.5.3.
struct AtomicAckEth {
  Be64 orig;
};

struct ImmDt {
  Be32 imm;  // carried opaque: the verbs API passes it in network order
};

// Invalidate Extended Transport Header, IBTA 9.3.6.
struct Ieth {
  Be32 rkey;
};

// Datagram Extended Transport Header, IBTA 9.3.2.
struct Deth {
  Be32 qkey;
  Be32 src_qp;  // Resv8(8) SrcQP(24)
};

// Congestion Notification Packet payload, Annex A17.9.4: 16 reserved bytes.
struct CnpPad {
  uint8_t reserved[16];
};

constexpr uint32_t kIcrcSize = 4;

static_assert(sizeof(EthHdr) == 14);
static_assert(sizeof(VlanTag) == 4);
static_assert(sizeof(ArpHdr) == 28);
static_assert(sizeof(Ipv4Hdr) == 20);
static_assert(sizeof(Ipv6Hdr) == 40);
static_assert(sizeof(UdpHdr) == 8);
static_assert(sizeof(IcmpHdr) == 8);
static_assert(sizeof(Bth) == 12);
static_assert(sizeof(Reth) == 16);
static_assert(sizeof(Aeth) == 4);
static_assert(sizeof(AtomicEth) == 28);
static_assert(sizeof(AtomicAckEth) == 8);
static_assert(sizeof(ImmDt) == 4);
static_assert(sizeof(Ieth) == 4);
static_assert(sizeof(Deth) == 8);
static_assert(sizeof(CnpPad) == 16);

}  // namespace urnic::wire
