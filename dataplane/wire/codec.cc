// Decoder and encoder for Ethernet/IP/UDP/RoCEv2 frames. Every length read
// from the wire is checked against what the buffers hold before use.
#include "dataplane/wire/codec.h"

#include <cstring>
#include <type_traits>

#include "dataplane/wire/icrc.h"

namespace urnic::wire {
namespace {

// clang-format off
constexpr const char* kMalformedNames[] = {
  "none", "truncated", "split_headers", "vlan_stacked", "ip_version",
  "ip_header_len", "ip_total_len", "ip_checksum", "ip_fragment", "ip_source",
  "udp_len",
  "bth_version", "unknown_opcode", "bad_length", "payload_not_allowed",
  "bad_icrc",
};
// clang-format on
static_assert(std::size(kMalformedNames) ==
              static_cast<size_t>(Malformed::kCount));

constexpr uint8_t kV4MappedPrefix[12] = {0, 0, 0, 0, 0,    0,
                                         0, 0, 0, 0, 0xff, 0xff};

// Whether a packet's source is an address a host may have: not IPv4's
// "this network" 0/8, loopback 127/8, multicast or class E (224/3, the
// broadcast address among them; RFC 1122 3.2.1.3), nor IPv6's unspecified,
// loopback or multicast (RFC 4291 2.5.2, 2.5.3, 2.7).
bool unicast_source(const RoceFields& f) {
  if (!f.ipv6) {
    const uint32_t top = f.sgid[12];
    return top != 0 && top != 127 && top < 224;
  }
  if (f.sgid[0] == 0xff) return false;
  for (int i = 0; i < 15; ++i)
    if (f.sgid[i]) return true;
  return f.sgid[15] > 1;  // :: and ::1
}

// Walks [off, off+len) of the concatenated segments, calling fn(ptr, n).
template <typename Fn>
bool for_range(std::span<const ConstBuf> segs, uint32_t off, uint32_t len,
               Fn&& fn) {
  for (const ConstBuf& s : segs) {
    if (len == 0) break;
    if (off >= s.len) {
      off -= s.len;
      continue;
    }
    const uint32_t n = std::min(len, s.len - off);
    fn(s.data + off, n);
    len -= n;
    off = 0;
  }
  return len == 0;
}

FrameInfo& fail(FrameInfo& out, Malformed why) {
  out.kind = FrameKind::kMalformed;
  out.why = why;
  return out;
}

template <typename T>
const T* at(const uint8_t* base, uint32_t off) {
  return reinterpret_cast<const T*>(base + off);
}
template <typename T>
T* at(uint8_t* base, uint32_t off) {
  return reinterpret_cast<T*>(base + off);
}

void decode_roce(std::span<const ConstBuf> segs, const uint8_t* p,
                 uint32_t first_len, uint8_t* writable, FrameInfo& out) {
  const auto* udp = at<UdpHdr>(p, out.l4_off);
  const uint32_t udp_len = udp->length.get();
  const uint32_t l4_room = out.l3_len - out.ip_hdr_len;
  if (udp_len < sizeof(UdpHdr) || udp_len > l4_room) {
    fail(out, Malformed::kUdpLen);
    return;
  }
  // IPv4 may carry Ethernet-style trailing bytes only outside the IP packet.
  if (udp_len != l4_room) {
    fail(out, Malformed::kUdpLen);
    return;
  }
  const uint32_t roce_len = udp_len - sizeof(UdpHdr);
  out.bth_off = static_cast<uint16_t>(out.l4_off + sizeof(UdpHdr));
  if (roce_len < sizeof(Bth) + kIcrcSize) {
    fail(out, Malformed::kTruncated);
    return;
  }
  if (out.bth_off + sizeof(Bth) > first_len) {
    fail(out, Malformed::kSplitHeaders);
    return;
  }
  const auto* bth = at<Bth>(p, out.bth_off);
  if (bth->tver() != 0) {
    fail(out, Malformed::kBthVersion);
    return;
  }
  const OpcodeInfo& op = opcode_info(bth->opcode);
  if (!op.valid()) {
    fail(out, Malformed::kUnknownOpcode);
    return;
  }
  if (roce_len < op.hdr_len + kIcrcSize) {
    fail(out, Malformed::kTruncated);
    return;
  }
  if (out.bth_off + op.hdr_len > first_len) {
    fail(out, Malformed::kSplitHeaders);
    return;
  }
  const uint32_t padded = roce_len - op.hdr_len - kIcrcSize;
  const uint8_t pad = bth->pad_count();
  if ((padded & 3) != 0 || pad > padded) {
    fail(out, Malformed::kBadLength);
    return;
  }
  if (padded != 0 && !(op.mask & kPayload)) {
    fail(out, Malformed::kPayloadNotAllowed);
    return;
  }

  // ICRC over everything after the BTH up to the ICRC itself: with the
  // headers in one call where the packet is in the first segment (a small
  // payload copied after them, a larger one masked in place where the
  // caller lets us), else chained.
  Icrc icrc;
  const uint32_t icrc_off = out.bth_off + roce_len - kIcrcSize;
  const uint32_t rest_off = out.bth_off + op.hdr_len;
  const bool ipv6 = out.ether_type == kEtherTypeIpv6;
  if (writable && icrc_off <= first_len &&
      icrc_off - rest_off > Icrc::kInlineTail && out.l3_off >= 8) {
    icrc.in_place(writable + out.l3_off, out.ip_hdr_len, ipv6,
                  icrc_off - out.l3_off);
  } else if (icrc_off <= first_len &&
             icrc_off - rest_off <= Icrc::kInlineTail) {
    icrc.begin(p + out.l3_off, out.ip_hdr_len, ipv6, op.hdr_len - sizeof(Bth),
               p + rest_off, icrc_off - rest_off, 0);
  } else {
    icrc.begin(p + out.l3_off, out.ip_hdr_len, ipv6, op.hdr_len - sizeof(Bth));
    for_range(segs, rest_off, icrc_off - rest_off,
              [&](const uint8_t* d, uint32_t n) { icrc.update(d, n); });
  }
  uint8_t wire_icrc[kIcrcSize];
  uint32_t got = 0;
  for_range(segs, icrc_off, kIcrcSize, [&](const uint8_t* d, uint32_t n) {
    std::memcpy(wire_icrc + got, d, n);
    got += n;
  });
  if (got != kIcrcSize || Icrc::load(wire_icrc) != icrc.value()) {
    fail(out, Malformed::kBadIcrc);
    return;
  }

  RoceFields& f = out.roce;
  f.udp_sport = udp->src_port.get();
  f.opcode = bth->opcode;
  f.se = bth->flags & Bth::kSe;
  f.migreq = bth->flags & Bth::kMigReq;
  f.pkey = bth->pkey.get();
  const uint32_t dqpn = bth->dqpn.get();
  f.fecn = dqpn & Bth::kFecn;
  f.becn = dqpn & Bth::kBecn;
  f.dqpn = dqpn & kMask24;
  f.ack_req = bth->ack_req();
  f.psn = bth->psn();
  const uint8_t* b = p + out.bth_off;
  auto ext = [&](Ext e) { return b + op.ext_offset[static_cast<uint8_t>(e)]; };
  if (op.has_ext(Ext::kDeth)) {
    const auto* h = reinterpret_cast<const Deth*>(ext(Ext::kDeth));
    f.deth_qkey = h->qkey.get();
    f.deth_src_qp = h->src_qp.get() & kMask24;
  }
  if (op.has_ext(Ext::kReth)) {
    const auto* h = reinterpret_cast<const Reth*>(ext(Ext::kReth));
    f.reth_va = h->va.get();
    f.reth_rkey = h->rkey.get();
    f.reth_len = h->dma_len.get();
  }
  if (op.has_ext(Ext::kAtomicEth)) {
    const auto* h = reinterpret_cast<const AtomicEth*>(ext(Ext::kAtomicEth));
    f.atomic_va = h->va.get();
    f.atomic_rkey = h->rkey.get();
    f.atomic_swap_add = h->swap_add.get();
    f.atomic_compare = h->compare.get();
  }
  if (op.has_ext(Ext::kAeth)) {
    const auto* h = reinterpret_cast<const Aeth*>(ext(Ext::kAeth));
    f.aeth_syndrome = h->syndrome();
    f.aeth_msn = h->msn();
  }
  if (op.has_ext(Ext::kAtomicAckEth)) {
    f.atomic_orig =
        reinterpret_cast<const AtomicAckEth*>(ext(Ext::kAtomicAckEth))
            ->orig.get();
  }
  if (op.has_ext(Ext::kImmDt))
    f.imm = reinterpret_cast<const ImmDt*>(ext(Ext::kImmDt))->imm.get();
  if (op.has_ext(Ext::kIeth))
    f.ieth_rkey = reinterpret_cast<const Ieth*>(ext(Ext::kIeth))->rkey.get();
  f.payload_len = padded - pad;
  out.payload_off = out.bth_off + op.hdr_len;
  out.op = &op;
  out.kind = FrameKind::kRoce;
}

}  // namespace

const char* malformed_name(Malformed m) {
  const auto i = static_cast<size_t>(m);
  return i < std::size(kMalformedNames) ? kMalformedNames[i] : "?";
}

uint8_t* roce_ip(uint8_t* p, uint32_t len, bool* v6) {
  uint32_t off = sizeof(EthHdr);
  if (len < off) return nullptr;
  uint16_t type = static_cast<uint16_t>(p[12] << 8 | p[13]);
  if (type == kEtherTypeVlan) {
    off += sizeof(VlanTag);
    if (len < off) return nullptr;
    type = static_cast<uint16_t>(p[16] << 8 | p[17]);
  }
  uint8_t* ip = p + off;
  uint32_t udp;
  if (type == kEtherTypeIpv4 && len >= off + sizeof(Ipv4Hdr)) {
    if (ip[9] != kIpProtoUdp) return nullptr;
    udp = off + (ip[0] & 0xfu) * 4;
    *v6 = false;
  } else if (type == kEtherTypeIpv6 && len >= off + sizeof(Ipv6Hdr)) {
    if (ip[6] != kIpProtoUdp) return nullptr;
    udp = off + sizeof(Ipv6Hdr);
    *v6 = true;
  } else {
    return nullptr;
  }
  if (len < udp + sizeof(UdpHdr)) return nullptr;
  const uint16_t dport = static_cast<uint16_t>(p[udp + 2] << 8 | p[udp + 3]);
  return dport == kRoceV2Port ? ip : nullptr;
}

bool mark_ce(uint8_t* frame, uint32_t len) {
  bool v6 = false;
  uint8_t* ip = roce_ip(frame, len, &v6);
  if (!ip) return false;
  if (v6) {  // traffic class: version(4) TC(8) flow label(20)
    if (((ip[1] >> 4) & 3) == 0) return false;
    ip[1] |= 0x30;
    return true;
  }
  auto* h = reinterpret_cast<Ipv4Hdr*>(ip);
  if ((h->tos & 3) == 0) return false;
  h->tos |= 3;
  h->checksum.set(0);
  h->checksum.set(
      static_cast<uint16_t>(~csum_fold(csum_partial(ip, (ip[0] & 0xfu) * 4))));
  return true;
}

uint32_t csum_partial(const uint8_t* p, size_t n, uint32_t sum) {
  // 32-bit big-endian words into a 64-bit accumulator: the one's-complement
  // sum of 32-bit words folds to the same 16-bit sum (RFC 1071 2.(B)).
  uint64_t s = sum;
  for (; n >= 4; p += 4, n -= 4) s += load_be32(p);
  if (n >= 2) {
    s += uint32_t{p[0]} << 8 | p[1];
    p += 2;
    n -= 2;
  }
  if (n) s += uint32_t{p[0]} << 8;
  s = (s & 0xffffffff) + (s >> 32);
  s = (s & 0xffffffff) + (s >> 32);
  return static_cast<uint32_t>(s);
}

uint16_t csum_fold(uint32_t sum) {
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return static_cast<uint16_t>(sum);
}

void gid_from_ipv4(uint32_t addr, uint8_t gid[16]) {
  std::memcpy(gid, kV4MappedPrefix, 12);
  store_be32(gid + 12, addr);
}
bool gid_is_ipv4(const uint8_t gid[16]) {
  return std::memcmp(gid, kV4MappedPrefix, 12) == 0;
}
uint32_t gid_to_ipv4(const uint8_t gid[16]) {
  return load_be32(gid + 12);
}
bool gid_is_multicast(const uint8_t gid[16]) {
  return gid_is_ipv4(gid) ? ipv4_is_multicast(gid_to_ipv4(gid))
                          : gid[0] == 0xff;
}
void multicast_mac(const uint8_t gid[16], MacAddr& mac) {
  if (gid_is_ipv4(gid)) {
    mac.b[0] = 0x01;
    mac.b[1] = 0x00;
    mac.b[2] = 0x5e;
    mac.b[3] = gid[13] & 0x7f;
    mac.b[4] = gid[14];
    mac.b[5] = gid[15];
  } else {
    mac.b[0] = mac.b[1] = 0x33;
    std::memcpy(mac.b + 2, gid + 12, 4);
  }
}

void decode(std::span<const ConstBuf> segs, uint32_t frame_len, FrameInfo& out,
            bool ip_csum_ok, uint8_t* writable) {
  // Zero-fill (FrameInfo is trivially copyable): cheaper than assigning a
  // value-initialised temporary. Decode sets every field it reports.
  zero_fill(out);
  if (segs.empty()) {
    fail(out, Malformed::kTruncated);
    return;
  }
  uint64_t total = 0;
  for (const ConstBuf& s : segs) total += s.len;
  if (total < frame_len) {
    fail(out, Malformed::kTruncated);
    return;
  }
  const uint8_t* p = segs[0].data;
  const uint32_t first_len = std::min(segs[0].len, frame_len);
  // Headers must be in the first segment: a frame too short for them is
  // truncated; a long frame whose first segment is short is split.
  auto missing = [&](uint32_t need) {
    if (first_len >= need) return false;
    fail(out,
         frame_len < need ? Malformed::kTruncated : Malformed::kSplitHeaders);
    return true;
  };
  if (missing(sizeof(EthHdr))) return;
  const auto* eth = at<EthHdr>(p, 0);
  out.roce.dst_mac = eth->dst;
  out.roce.src_mac = eth->src;
  uint16_t type = eth->ether_type.get();
  uint32_t l3 = sizeof(EthHdr);
  if (type == kEtherTypeQinQ) {
    fail(out, Malformed::kVlanStacked);
    return;
  }
  if (type == kEtherTypeVlan) {
    if (missing(l3 + sizeof(VlanTag))) return;
    const auto* tag = at<VlanTag>(p, l3);
    out.roce.vlan = true;
    out.roce.vlan_tci = tag->tci.get();
    type = tag->ether_type.get();
    l3 += sizeof(VlanTag);
    if (type == kEtherTypeVlan || type == kEtherTypeQinQ) {
      fail(out, Malformed::kVlanStacked);
      return;
    }
  }
  out.ether_type = type;
  out.l3_off = static_cast<uint16_t>(l3);
  const uint32_t l3_room = frame_len - l3;  // bytes of frame after L2

  if (type == kEtherTypeArp) {
    if (missing(l3 + sizeof(ArpHdr))) return;
    out.l4_off = out.l3_off;
    out.kind = FrameKind::kArp;
    return;
  }

  uint8_t proto;
  if (type == kEtherTypeIpv4) {
    if (missing(l3 + sizeof(Ipv4Hdr))) return;
    const auto* ip = at<Ipv4Hdr>(p, l3);
    if ((ip->version_ihl >> 4) != 4) {
      fail(out, Malformed::kIpVersion);
      return;
    }
    const uint32_t ihl = (ip->version_ihl & 0xf) * 4u;
    if (ihl < sizeof(Ipv4Hdr)) {
      fail(out, Malformed::kIpHeaderLen);
      return;
    }
    if (missing(l3 + ihl)) return;
    const uint32_t tot = ip->total_length.get();
    if (tot < ihl || tot > l3_room) {
      fail(out, Malformed::kIpTotalLen);
      return;
    }
    if (!ip_csum_ok && csum_fold(csum_partial(p + l3, ihl)) != 0xffff) {
      fail(out, Malformed::kIpChecksum);
      return;
    }
    if (ip->frag.get() & 0x3fff) {  // MF or a fragment offset
      fail(out, Malformed::kIpFragment);
      return;
    }
    out.ip_hdr_len = static_cast<uint8_t>(ihl);
    out.l3_len = tot;
    proto = ip->protocol;
    RoceFields& f = out.roce;
    gid_from_ipv4(ip->src.get(), f.sgid);
    gid_from_ipv4(ip->dst.get(), f.dgid);
    f.tclass = ip->tos;
    f.ttl = ip->ttl;
    f.ip_id = ip->id.get();
    f.dont_fragment = ip->frag.get() & 0x4000;
  } else if (type == kEtherTypeIpv6) {
    if (missing(l3 + sizeof(Ipv6Hdr))) return;
    const auto* ip = at<Ipv6Hdr>(p, l3);
    const uint32_t vtc = ip->vtc_flow.get();
    if ((vtc >> 28) != 6) {
      fail(out, Malformed::kIpVersion);
      return;
    }
    const uint32_t tot = sizeof(Ipv6Hdr) + ip->payload_length.get();
    if (tot > l3_room) {
      fail(out, Malformed::kIpTotalLen);
      return;
    }
    out.ip_hdr_len = sizeof(Ipv6Hdr);
    out.l3_len = tot;
    proto = ip->next_header;
    RoceFields& f = out.roce;
    f.ipv6 = true;
    std::memcpy(f.sgid, ip->src, 16);
    std::memcpy(f.dgid, ip->dst, 16);
    f.tclass = static_cast<uint8_t>(vtc >> 20);
    f.flow_label = vtc & 0xfffff;
    f.ttl = ip->hop_limit;
    f.dont_fragment = true;  // IPv6 routers never fragment
  } else {
    out.kind = FrameKind::kOtherL2;
    return;
  }

  out.l4_proto = proto;
  out.l4_off = static_cast<uint16_t>(l3 + out.ip_hdr_len);
  const uint32_t l4_len = out.l3_len - out.ip_hdr_len;
  if (proto == kIpProtoIcmp || proto == kIpProtoIcmpv6) {
    if (l4_len < sizeof(IcmpHdr) - 4) {  // type, code, checksum at least
      fail(out, Malformed::kTruncated);
      return;
    }
    const bool v6 = type == kEtherTypeIpv6;
    if ((proto == kIpProtoIcmpv6) != v6) {
      out.kind = FrameKind::kOtherIp;
      return;
    }
    // The handler reads the ICMP body from the first segment only.
    if (out.l4_off + l4_len > first_len) {
      fail(out, Malformed::kSplitHeaders);
      return;
    }
    out.kind = v6 ? FrameKind::kIcmpv6 : FrameKind::kIcmpv4;
    return;
  }
  if (proto != kIpProtoUdp) {
    out.kind = FrameKind::kOtherIp;
    return;
  }
  if (l4_len < sizeof(UdpHdr)) {
    fail(out, Malformed::kUdpLen);
    return;
  }
  if (missing(out.l4_off + sizeof(UdpHdr))) return;
  if (at<UdpHdr>(p, out.l4_off)->dst_port.get() != kRoceV2Port) {
    out.kind = FrameKind::kOtherIp;
    return;
  }
  // A source no host can have (the kernel drops such martians before rxe
  // sees them): a UD receive would report it, a CM REQ would answer it.
  // Checked for RoCE only: a DHCP client's 0.0.0.0 is none of ours.
  if (!unicast_source(out.roce)) {
    fail(out, Malformed::kIpSource);
    return;
  }
  decode_roce(segs, p, first_len, writable == p ? writable : nullptr, out);
}

uint32_t header_len(const RoceFields& f) {
  const OpcodeInfo& op = opcode_info(f.opcode);
  return sizeof(EthHdr) + (f.vlan ? sizeof(VlanTag) : 0) +
         (f.ipv6 ? sizeof(Ipv6Hdr) : sizeof(Ipv4Hdr)) + sizeof(UdpHdr) +
         op.hdr_len;
}

namespace {

// What encode_headers() checks and sizes before writing; false: refused.
struct Sizes {
  uint32_t len = 0;      // all headers
  uint32_t pad = 0;      // after the payload
  uint32_t udp_len = 0;  // UDP header and everything after it
};
bool sizes(const RoceFields& f, const OpcodeInfo& op, uint32_t cap, Sizes& z) {
  if (!op.valid() || (f.payload_len && !(op.mask & kPayload))) return false;
  z.len = header_len(f);
  if (cap < z.len) return false;
  z.pad = pad_for(f.payload_len);
  z.udp_len = sizeof(UdpHdr) + op.hdr_len + f.payload_len + z.pad + kIcrcSize;
  return z.udp_len <= 0xffff - sizeof(Ipv4Hdr);
}

// Ethernet (+VLAN), IP and UDP at buf; returns where BTH goes.
uint32_t encode_l2_l4(const RoceFields& f, uint32_t udp_len, uint8_t* buf) {
  auto* eth = at<EthHdr>(buf, 0);
  eth->dst = f.dst_mac;
  eth->src = f.src_mac;
  uint32_t off = sizeof(EthHdr);
  const uint16_t l3_type = f.ipv6 ? kEtherTypeIpv6 : kEtherTypeIpv4;
  if (f.vlan) {
    eth->ether_type.set(kEtherTypeVlan);
    auto* tag = at<VlanTag>(buf, off);
    tag->tci.set(f.vlan_tci);
    tag->ether_type.set(l3_type);
    off += sizeof(VlanTag);
  } else {
    eth->ether_type.set(l3_type);
  }
  if (f.ipv6) {
    auto* ip = at<Ipv6Hdr>(buf, off);
    ip->vtc_flow.set(6u << 28 | uint32_t{f.tclass} << 20 |
                     (f.flow_label & 0xfffff));
    ip->payload_length.set(static_cast<uint16_t>(udp_len));
    ip->next_header = kIpProtoUdp;
    ip->hop_limit = f.ttl;
    std::memcpy(ip->src, f.sgid, 16);
    std::memcpy(ip->dst, f.dgid, 16);
    off += sizeof(Ipv6Hdr);
  } else {
    auto* ip = at<Ipv4Hdr>(buf, off);
    ip->version_ihl = 0x45;
    ip->tos = f.tclass;
    ip->total_length.set(static_cast<uint16_t>(sizeof(Ipv4Hdr) + udp_len));
    ip->id.set(f.ip_id);
    ip->frag.set(f.dont_fragment ? 0x4000 : 0);
    ip->ttl = f.ttl;
    ip->protocol = kIpProtoUdp;
    ip->checksum.set(0);
    ip->src.set(gid_to_ipv4(f.sgid));
    ip->dst.set(gid_to_ipv4(f.dgid));
    ip->checksum.set(static_cast<uint16_t>(
        ~csum_fold(csum_partial(buf + off, sizeof(Ipv4Hdr)))));
    off += sizeof(Ipv4Hdr);
  }
  auto* udp = at<UdpHdr>(buf, off);
  udp->src_port.set(f.udp_sport);
  udp->dst_port.set(kRoceV2Port);
  udp->length.set(static_cast<uint16_t>(udp_len));
  udp->checksum.set(0);  // RoCEv2 senders leave it zero; the ICRC covers data
  return off + sizeof(UdpHdr);
}

// BTH and the opcode's extension headers at b.
void encode_bth(const RoceFields& f, const OpcodeInfo& op, uint32_t pad,
                uint8_t* b) {
  auto* bth = at<Bth>(b, 0);
  bth->opcode = f.opcode;
  bth->flags = static_cast<uint8_t>((f.se ? Bth::kSe : 0) |
                                    (f.migreq ? Bth::kMigReq : 0) | pad << 4);
  bth->pkey.set(f.pkey);
  bth->dqpn.set((f.fecn ? Bth::kFecn : 0) | (f.becn ? Bth::kBecn : 0) |
                (f.dqpn & kMask24));
  bth->apsn.set((f.ack_req ? Bth::kAckReq : 0) | (f.psn & kMask24));
  auto ext = [&](Ext e) { return b + op.ext_offset[static_cast<uint8_t>(e)]; };
  if (op.has_ext(Ext::kDeth)) {
    auto* h = reinterpret_cast<Deth*>(ext(Ext::kDeth));
    h->qkey.set(f.deth_qkey);
    h->src_qp.set(f.deth_src_qp & kMask24);
  }
  if (op.has_ext(Ext::kReth)) {
    auto* h = reinterpret_cast<Reth*>(ext(Ext::kReth));
    h->va.set(f.reth_va);
    h->rkey.set(f.reth_rkey);
    h->dma_len.set(f.reth_len);
  }
  if (op.has_ext(Ext::kAtomicEth)) {
    auto* h = reinterpret_cast<AtomicEth*>(ext(Ext::kAtomicEth));
    h->va.set(f.atomic_va);
    h->rkey.set(f.atomic_rkey);
    h->swap_add.set(f.atomic_swap_add);
    h->compare.set(f.atomic_compare);
  }
  if (op.has_ext(Ext::kAeth)) {
    reinterpret_cast<Aeth*>(ext(Ext::kAeth))
        ->syn_msn.set(uint32_t{f.aeth_syndrome} << 24 | (f.aeth_msn & kMask24));
  }
  if (op.has_ext(Ext::kAtomicAckEth))
    reinterpret_cast<AtomicAckEth*>(ext(Ext::kAtomicAckEth))
        ->orig.set(f.atomic_orig);
  if (op.has_ext(Ext::kImmDt))
    reinterpret_cast<ImmDt*>(ext(Ext::kImmDt))->imm.set(f.imm);
  if (op.has_ext(Ext::kIeth))
    reinterpret_cast<Ieth*>(ext(Ext::kIeth))->rkey.set(f.ieth_rkey);
  if (op.has_ext(Ext::kCnpPad))
    std::memset(ext(Ext::kCnpPad), 0, sizeof(CnpPad));
}

}  // namespace

uint32_t encode_headers(const RoceFields& f, uint8_t* buf, uint32_t cap) {
  const OpcodeInfo& op = opcode_info(f.opcode);
  Sizes z;
  if (!sizes(f, op, cap, z)) return 0;
  encode_bth(f, op, z.pad, buf + encode_l2_l4(f, z.udp_len, buf));
  return z.len;
}

void build_template(const RoceFields& f, HeaderTemplate& t) {
  t = {};
  const uint32_t l4 = encode_l2_l4(f, 0, t.bytes);
  t.len = static_cast<uint8_t>(l4);  // through UDP
  t.l3_off =
      static_cast<uint8_t>(sizeof(EthHdr) + (f.vlan ? sizeof(VlanTag) : 0));
  t.ipv6 = f.ipv6;
  if (!t.ipv6) {
    uint8_t* ip = t.bytes + t.l3_off;
    std::memset(ip, 0, 6);  // version, TOS, total length, id: per packet
    at<Ipv4Hdr>(ip, 0)->checksum.set(0);
    t.csum_rest = csum_fold(csum_partial(ip, sizeof(Ipv4Hdr)));
    ip[0] = 0x45;
  }
}

uint32_t encode_headers(const HeaderTemplate& t, const RoceFields& f,
                        uint8_t* buf, uint32_t cap) {
  const OpcodeInfo& op = opcode_info(f.opcode);
  Sizes z;
  if (t.len == 0 || !sizes(f, op, cap, z)) return 0;
  // The whole template where there is room (a constant size: a few moves,
  // no call), else what it holds.
  if (cap >= HeaderTemplate::kMaxLen)
    std::memcpy(buf, t.bytes, HeaderTemplate::kMaxLen);
  else
    std::memcpy(buf, t.bytes, t.len);
  uint8_t* l3 = buf + t.l3_off;
  if (t.ipv6) {
    auto* ip = at<Ipv6Hdr>(l3, 0);
    ip->vtc_flow.set((ip->vtc_flow.get() & 0xf00fffffu) | uint32_t{f.tclass}
                                                              << 20);
    ip->payload_length.set(static_cast<uint16_t>(z.udp_len));
  } else {
    auto* ip = at<Ipv4Hdr>(l3, 0);
    const uint32_t total = sizeof(Ipv4Hdr) + z.udp_len;
    ip->tos = f.tclass;
    ip->total_length.set(static_cast<uint16_t>(total));
    ip->id.set(f.ip_id);
    // The words that vary, added to the sum of the others (RFC 1071).
    ip->checksum.set(static_cast<uint16_t>(
        ~csum_fold(t.csum_rest + (0x4500u | f.tclass) + total + f.ip_id)));
  }
  at<UdpHdr>(buf, t.len - sizeof(UdpHdr))
      ->length.set(static_cast<uint16_t>(z.udp_len));
  encode_bth(f, op, z.pad, buf + t.len);
  return z.len;
}

namespace {
// Where the ICRC's masked headers start, and how long the IP header is.
uint32_t l3_offset(const RoceFields& f) {
  return sizeof(EthHdr) + (f.vlan ? sizeof(VlanTag) : 0);
}
uint32_t ip_hdr_len(const RoceFields& f) {
  return f.ipv6 ? sizeof(Ipv6Hdr) : sizeof(Ipv4Hdr);
}
}  // namespace

TrailerSum::TrailerSum(const uint8_t* hdrs, const RoceFields& f)
    : pad_(pad_for(f.payload_len)) {
  icrc_.begin(hdrs + l3_offset(f), ip_hdr_len(f), f.ipv6,
              opcode_info(f.opcode).hdr_len - sizeof(Bth));
}

uint32_t TrailerSum::finish(uint8_t* trailer) {
  std::memset(trailer, 0, pad_);
  if (pad_) icrc_.update(trailer, pad_);  // a CRC call costs even for 0 B
  Icrc::store(trailer + pad_, icrc_.value());
  return pad_ + kIcrcSize;
}

uint32_t encode_trailer(const uint8_t* hdrs, const RoceFields& f,
                        std::span<const ConstBuf> payload, uint8_t* trailer) {
  if (payload.size() > 1) {
    TrailerSum sum(hdrs, f);
    for (const ConstBuf& b : payload) sum.update(b.data, b.len);
    return sum.finish(trailer);
  }
  // One CRC call for headers, a payload in one piece and the pad.
  const uint32_t pad = pad_for(f.payload_len);
  std::memset(trailer, 0, pad);
  Icrc icrc;
  icrc.begin(hdrs + l3_offset(f), ip_hdr_len(f), f.ipv6,
             opcode_info(f.opcode).hdr_len - sizeof(Bth),
             payload.empty() ? nullptr : payload[0].data,
             payload.empty() ? 0 : payload[0].len, pad);
  Icrc::store(trailer + pad, icrc.value());
  return pad + kIcrcSize;
}

uint32_t encode_frame(const RoceFields& f, const uint8_t* payload, uint8_t* buf,
                      uint32_t cap) {
  const uint32_t hl = encode_headers(f, buf, cap);
  if (hl == 0) return 0;
  const uint32_t total = hl + f.payload_len + trailer_len(f.payload_len);
  if (total > cap) return 0;
  if (f.payload_len) std::memcpy(buf + hl, payload, f.payload_len);
  const ConstBuf pl{buf + hl, f.payload_len};
  encode_trailer(buf, f, {&pl, f.payload_len ? 1u : 0u},
                 buf + hl + f.payload_len);
  return total;
}

}  // namespace urnic::wire
