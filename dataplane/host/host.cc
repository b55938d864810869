// ARP (RFC 826), ICMP echo (RFC 792), IPv6 ND (RFC 4861) and ICMPv6 echo
// (RFC 4443) for the service's own addresses.
#include "dataplane/host/host.h"

#include <cstdio>
#include <cstring>
#include <string>

#include "dataplane/host/gid_table.h"

namespace urnic::host {

using stats::Ctr;
using namespace wire;

namespace {

constexpr uint8_t kIcmpEchoReply = 0, kIcmpEchoRequest = 8;
constexpr uint8_t kIcmp6EchoRequest = 128, kIcmp6EchoReply = 129;
constexpr uint8_t kNdSolicit = 135, kNdAdvert = 136;
constexpr uint8_t kNdOptSrcLl = 1, kNdOptTgtLl = 2;
constexpr uint32_t kNdMsgLen = 24;  // type..target
constexpr uint32_t kMinFrame = 60;  // Ethernet minimum without FCS

template <typename T>
T* at(uint8_t* p, uint32_t off) {
  return reinterpret_cast<T*>(p + off);
}

void solicited_node(const uint8_t target[16], uint8_t out[16]) {
  static constexpr uint8_t kPrefix[13] = {0xff, 0x02, 0, 0, 0, 0,
                                          0,    0,    0, 0, 1, 0xff};
  std::memcpy(out, kPrefix, 13);
  std::memcpy(out + 13, target + 13, 3);
}

bool is_ipv4_mapped_zero(const uint8_t a[16]) {
  static constexpr uint8_t kZero[16] = {};
  return std::memcmp(a, kZero, 16) == 0;
}

// Writes Ethernet (+tag) for `type`; returns the L3 offset.
uint32_t put_eth(uint8_t* buf, const MacAddr& dst, const MacAddr& src,
                 uint16_t vlan_tci, uint16_t type) {
  auto* eth = at<EthHdr>(buf, 0);
  eth->dst = dst;
  eth->src = src;
  if (vlan_tci) {
    eth->ether_type.set(kEtherTypeVlan);
    auto* tag = at<VlanTag>(buf, sizeof(EthHdr));
    tag->tci.set(vlan_tci);
    tag->ether_type.set(type);
    return sizeof(EthHdr) + sizeof(VlanTag);
  }
  eth->ether_type.set(type);
  return sizeof(EthHdr);
}

uint16_t ipv4_checksum(const uint8_t* ip, uint32_t len) {
  return static_cast<uint16_t>(~csum_fold(csum_partial(ip, len)));
}

// Finds an ND option of `type` in [p, p+len); nullptr if absent or the
// options are malformed (RFC 4861 4.6: length 0 is invalid).
const uint8_t* nd_option(const uint8_t* p, uint32_t len, uint8_t type,
                         bool* bad) {
  *bad = false;
  while (len >= 2) {
    const uint32_t olen = p[1] * 8u;
    if (olen == 0 || olen > len) {
      *bad = true;
      return nullptr;
    }
    if (p[0] == type && olen >= 8) return p;
    p += olen;
    len -= olen;
  }
  if (len != 0) *bad = true;
  return nullptr;
}

}  // namespace

bool HostAddrs::owns_ipv6(const uint8_t a[16]) const {
  return has_ipv6 &&
         (std::memcmp(a, ipv6, 16) == 0 || std::memcmp(a, ipv6_ll, 16) == 0);
}

void ipv6_link_local(const MacAddr& mac, uint8_t out[16]) {
  std::memset(out, 0, 16);
  out[0] = 0xfe;
  out[1] = 0x80;
  out[8] = mac.b[0] ^ 0x02;  // universal/local bit flipped
  out[9] = mac.b[1];
  out[10] = mac.b[2];
  out[11] = 0xff;
  out[12] = 0xfe;
  out[13] = mac.b[3];
  out[14] = mac.b[4];
  out[15] = mac.b[5];
}

uint16_t icmpv6_checksum(const Ipv6Hdr& ip, const uint8_t* l4, uint32_t len) {
  uint32_t s = csum_partial(ip.src, 16);
  s = csum_partial(ip.dst, 16, s);
  s += len >> 16;
  s += len & 0xffff;
  s += kIpProtoIcmpv6;
  s = csum_partial(l4, len, s);
  return static_cast<uint16_t>(~csum_fold(s));
}

HostVerdict handle_arp(const HostAddrs& h, NeighbourTable& nt,
                       stats::LcoreCounters& c, uint8_t* frame, uint32_t* len,
                       const FrameInfo& fi, uint64_t now) {
  auto* arp = at<ArpHdr>(frame, fi.l3_off);
  if (arp->htype.get() != 1 || arp->ptype.get() != kEtherTypeIpv4 ||
      arp->hlen != 6 || arp->plen != 4) {
    c.inc(Ctr::arp_ignored);
    return HostVerdict::kConsumed;
  }
  const uint16_t oper = arp->oper.get();
  const uint32_t spa = arp->spa.get();
  const uint32_t tpa = arp->tpa.get();
  uint8_t gid[16];
  gid_from_ipv4(spa, gid);
  const bool sender_valid = spa != 0 && !arp->sha.is_multicast();
  if (oper == 1) {
    c.inc(Ctr::arp_rx_request);
    if (tpa != h.ipv4) {
      // Gratuitous ARP or someone else's: refresh what we already know.
      if (sender_valid) nt.learn(gid, arp->sha, now, false);
      c.inc(Ctr::arp_ignored);
      return HostVerdict::kConsumed;
    }
    // RFC 826: the requester will talk to us, so remember it.
    if (sender_valid) nt.learn(gid, arp->sha, now, true);
    const MacAddr requester = arp->sha;
    arp->oper.set(2);
    arp->tha = requester;
    arp->tpa.set(spa);
    arp->sha = h.mac;
    arp->spa.set(h.ipv4);
    auto* eth = at<EthHdr>(frame, 0);
    eth->dst = eth->src;
    eth->src = h.mac;
    c.inc(Ctr::arp_tx_reply);
    return HostVerdict::kReply;
  }
  if (oper == 2) {
    c.inc(Ctr::arp_rx_reply);
    if (sender_valid && tpa == h.ipv4 && nt.learn(gid, arp->sha, now, false))
      c.inc(Ctr::neigh_resolved);
    else
      c.inc(Ctr::arp_ignored);
    return HostVerdict::kConsumed;
  }
  c.inc(Ctr::arp_ignored);
  (void)len;
  return HostVerdict::kConsumed;
}

HostVerdict handle_icmpv4(const HostAddrs& h, stats::LcoreCounters& c,
                          uint8_t* frame, uint32_t* len, const FrameInfo& fi) {
  auto* ip = at<Ipv4Hdr>(frame, fi.l3_off);
  if (ip->dst.get() != h.ipv4) {
    c.inc(Ctr::not_for_us);
    return HostVerdict::kConsumed;
  }
  const uint32_t l4_len = fi.l3_len - fi.ip_hdr_len;
  auto* icmp = at<IcmpHdr>(frame, fi.l4_off);
  if (l4_len >= sizeof(IcmpHdr) && icmp->type == kIcmpEchoReply &&
      icmp->code == 0) {
    c.inc(Ctr::icmp_echo_reply_rx);  // answer to `urnicctl ping`
    return HostVerdict::kConsumed;
  }
  if (l4_len < sizeof(IcmpHdr) || icmp->type != kIcmpEchoRequest ||
      icmp->code != 0 ||
      csum_fold(csum_partial(frame + fi.l4_off, l4_len)) != 0xffff) {
    c.inc(Ctr::icmp_other);
    return HostVerdict::kConsumed;
  }
  c.inc(Ctr::icmp_echo_rx);
  auto* eth = at<EthHdr>(frame, 0);
  eth->dst = eth->src;
  eth->src = h.mac;
  const uint32_t src = ip->src.get();
  ip->src.set(h.ipv4);
  ip->dst.set(src);
  ip->ttl = h.ttl;
  ip->checksum.set(0);
  ip->checksum.set(ipv4_checksum(frame + fi.l3_off, fi.ip_hdr_len));
  icmp->type = kIcmpEchoReply;
  icmp->checksum.set(0);
  icmp->checksum.set(static_cast<uint16_t>(
      ~csum_fold(csum_partial(frame + fi.l4_off, l4_len))));
  *len = fi.l3_off + fi.l3_len;
  c.inc(Ctr::icmp_echo_tx);
  return HostVerdict::kReply;
}

HostVerdict handle_icmpv6(const HostAddrs& h, NeighbourTable& nt,
                          stats::LcoreCounters& c, uint8_t* frame,
                          uint32_t* len, uint32_t cap, const FrameInfo& fi,
                          uint64_t now) {
  auto* ip = at<Ipv6Hdr>(frame, fi.l3_off);
  uint8_t* l4 = frame + fi.l4_off;
  const uint32_t l4_len = fi.l3_len - fi.ip_hdr_len;
  if (!h.has_ipv6) {  // no IPv6 configured: none of it is addressed to us
    c.inc(Ctr::not_for_us);
    return HostVerdict::kConsumed;
  }
  if (l4_len < 4 || icmpv6_checksum(*ip, l4, l4_len) != 0) {
    c.inc(Ctr::icmp6_other);
    return HostVerdict::kConsumed;
  }
  auto* eth = at<EthHdr>(frame, 0);
  const uint8_t type = l4[0];
  if (type == kIcmp6EchoRequest) {
    if (!h.owns_ipv6(ip->dst) || l4[1] != 0 || l4_len < sizeof(IcmpHdr)) {
      c.inc(h.owns_ipv6(ip->dst) ? Ctr::icmp6_other : Ctr::not_for_us);
      return HostVerdict::kConsumed;
    }
    c.inc(Ctr::icmp6_echo_rx);
    eth->dst = eth->src;
    eth->src = h.mac;
    uint8_t tmp[16];
    std::memcpy(tmp, ip->src, 16);
    std::memcpy(ip->src, ip->dst, 16);
    std::memcpy(ip->dst, tmp, 16);
    ip->hop_limit = h.ttl;
    l4[0] = kIcmp6EchoReply;
    l4[2] = l4[3] = 0;
    store_be16(l4 + 2, icmpv6_checksum(*ip, l4, l4_len));
    *len = fi.l3_off + fi.l3_len;
    c.inc(Ctr::icmp6_echo_tx);
    return HostVerdict::kReply;
  }
  if (type != kNdSolicit && type != kNdAdvert) {
    c.inc(Ctr::icmp6_other);
    return HostVerdict::kConsumed;
  }
  // RFC 4861 7.1.1 / 7.1.2 validity: hop limit 255, code 0, length >= 24.
  if (ip->hop_limit != 255 || l4[1] != 0 || l4_len < kNdMsgLen ||
      l4[8] == 0xff /* multicast target */) {
    c.inc(Ctr::nd_ignored);
    return HostVerdict::kConsumed;
  }
  const uint8_t* target = l4 + 8;
  bool bad_opt = false;
  if (type == kNdAdvert) {
    c.inc(Ctr::nd_rx_na);
    const uint8_t* opt =
        nd_option(l4 + kNdMsgLen, l4_len - kNdMsgLen, kNdOptTgtLl, &bad_opt);
    MacAddr mac;
    if (!bad_opt && opt) {
      std::memcpy(mac.b, opt + 2, 6);
      if (nt.learn(target, mac, now, false)) {
        c.inc(Ctr::neigh_resolved);
        return HostVerdict::kConsumed;
      }
    }
    c.inc(Ctr::nd_ignored);
    return HostVerdict::kConsumed;
  }
  c.inc(Ctr::nd_rx_ns);
  const uint8_t* slla =
      nd_option(l4 + kNdMsgLen, l4_len - kNdMsgLen, kNdOptSrcLl, &bad_opt);
  const bool dad = is_ipv4_mapped_zero(ip->src);  // source ::
  if (bad_opt || (dad && slla) || !h.owns_ipv6(target)) {
    c.inc(Ctr::nd_ignored);
    return HostVerdict::kConsumed;
  }
  if (slla && !dad) {
    MacAddr mac;
    std::memcpy(mac.b, slla + 2, 6);
    nt.learn(ip->src, mac, now, true);
  }
  // Answer with a neighbour advertisement, built over the solicitation.
  const uint32_t na_len = kNdMsgLen + 8;
  const uint32_t need = fi.l4_off + na_len;
  if (need > cap) {
    c.inc(Ctr::nd_ignored);
    return HostVerdict::kConsumed;
  }
  uint8_t tgt[16];
  std::memcpy(tgt, target, 16);
  if (dad) {
    static constexpr uint8_t kAllNodes[16] = {0xff, 2, 0, 0, 0, 0, 0, 0,
                                              0,    0, 0, 0, 0, 0, 0, 1};
    std::memcpy(ip->dst, kAllNodes, 16);
    wire::multicast_mac(kAllNodes, eth->dst);
  } else {
    std::memcpy(ip->dst, ip->src, 16);
    eth->dst = eth->src;
  }
  eth->src = h.mac;
  std::memcpy(ip->src, tgt, 16);
  ip->payload_length.set(na_len);
  ip->hop_limit = 255;
  l4[0] = kNdAdvert;
  l4[1] = 0;
  l4[2] = l4[3] = 0;
  // Flags: Solicited (unless answering DAD) and Override (RFC 4861 7.2.4).
  l4[4] = dad ? 0x20 : 0x60;
  l4[5] = l4[6] = l4[7] = 0;
  std::memcpy(l4 + 8, tgt, 16);
  l4[24] = kNdOptTgtLl;
  l4[25] = 1;
  std::memcpy(l4 + 26, h.mac.b, 6);
  store_be16(l4 + 2, icmpv6_checksum(*ip, l4, na_len));
  *len = std::max(need, kMinFrame);
  if (*len > need) std::memset(frame + need, 0, *len - need);
  c.inc(Ctr::nd_tx_na);
  return HostVerdict::kReply;
}

uint32_t build_arp_request(const HostAddrs& h, uint16_t vlan_tci,
                           uint32_t target_ipv4, uint8_t* buf) {
  const MacAddr bcast{{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}};
  const uint32_t l3 = put_eth(buf, bcast, h.mac, vlan_tci, kEtherTypeArp);
  auto* arp = at<ArpHdr>(buf, l3);
  arp->htype.set(1);
  arp->ptype.set(kEtherTypeIpv4);
  arp->hlen = 6;
  arp->plen = 4;
  arp->oper.set(1);
  arp->sha = h.mac;
  arp->spa.set(h.ipv4);
  arp->tha = MacAddr{};
  arp->tpa.set(target_ipv4);
  const uint32_t end = l3 + sizeof(ArpHdr);
  std::memset(buf + end, 0, kMinFrame > end ? kMinFrame - end : 0);
  return std::max(end, kMinFrame);
}

uint32_t build_neighbour_solicit(const HostAddrs& h, uint16_t vlan_tci,
                                 const uint8_t target[16], uint8_t* buf) {
  uint8_t snm[16];
  solicited_node(target, snm);
  MacAddr dst;
  wire::multicast_mac(snm, dst);
  const uint32_t l3 = put_eth(buf, dst, h.mac, vlan_tci, kEtherTypeIpv6);
  auto* ip = at<Ipv6Hdr>(buf, l3);
  const uint32_t msg_len = kNdMsgLen + 8;
  ip->vtc_flow.set(6u << 28);
  ip->payload_length.set(msg_len);
  ip->next_header = kIpProtoIcmpv6;
  ip->hop_limit = 255;
  // Source: the global address for global targets, else link-local.
  const bool ll_target = target[0] == 0xfe && (target[1] & 0xc0) == 0x80;
  std::memcpy(ip->src, ll_target ? h.ipv6_ll : h.ipv6, 16);
  std::memcpy(ip->dst, snm, 16);
  uint8_t* l4 = buf + l3 + sizeof(Ipv6Hdr);
  std::memset(l4, 0, msg_len);
  l4[0] = kNdSolicit;
  std::memcpy(l4 + 8, target, 16);
  l4[24] = kNdOptSrcLl;
  l4[25] = 1;
  std::memcpy(l4 + 26, h.mac.b, 6);
  store_be16(l4 + 2, icmpv6_checksum(*ip, l4, msg_len));
  return l3 + sizeof(Ipv6Hdr) + msg_len;
}

uint32_t build_icmp_echo_request(const HostAddrs& h, uint16_t vlan_tci,
                                 uint32_t dst_ipv4, uint16_t id, uint16_t seq,
                                 uint8_t* buf) {
  const uint32_t l3 = put_eth(buf, MacAddr{}, h.mac, vlan_tci, kEtherTypeIpv4);
  constexpr uint32_t kData = 32;
  auto* ip = at<Ipv4Hdr>(buf, l3);
  ip->version_ihl = 0x45;
  ip->tos = 0;
  ip->total_length.set(sizeof(Ipv4Hdr) + sizeof(IcmpHdr) + kData);
  ip->id.set(seq);
  ip->frag.set(0x4000);
  ip->ttl = h.ttl;
  ip->protocol = kIpProtoIcmp;
  ip->checksum.set(0);
  ip->src.set(h.ipv4);
  ip->dst.set(dst_ipv4);
  ip->checksum.set(ipv4_checksum(buf + l3, sizeof(Ipv4Hdr)));
  uint8_t* l4 = buf + l3 + sizeof(Ipv4Hdr);
  auto* icmp = reinterpret_cast<IcmpHdr*>(l4);
  icmp->type = kIcmpEchoRequest;
  icmp->code = 0;
  icmp->checksum.set(0);
  icmp->id.set(id);
  icmp->seq.set(seq);
  for (uint32_t i = 0; i < kData; ++i)
    l4[sizeof(IcmpHdr) + i] = static_cast<uint8_t>(i);
  icmp->checksum.set(static_cast<uint16_t>(
      ~csum_fold(csum_partial(l4, sizeof(IcmpHdr) + kData))));
  return l3 + sizeof(Ipv4Hdr) + sizeof(IcmpHdr) + kData;
}

uint32_t build_igmp(const HostAddrs& h, uint16_t vlan_tci, uint32_t group,
                    bool leave, uint8_t* buf) {
  constexpr uint32_t kAllRouters = 0xe0000002;  // 224.0.0.2
  const uint32_t dst = leave ? kAllRouters : group;
  uint8_t dgid[16];
  gid_from_ipv4(dst, dgid);
  MacAddr mac;
  multicast_mac(dgid, mac);
  const uint32_t l3 = put_eth(buf, mac, h.mac, vlan_tci, kEtherTypeIpv4);
  constexpr uint32_t kIpLen = sizeof(Ipv4Hdr) + 4;  // + Router Alert
  constexpr uint32_t kIgmpLen = 8;
  auto* ip = at<Ipv4Hdr>(buf, l3);
  ip->version_ihl = 0x46;
  ip->tos = 0xc0;  // network control, as Linux sends IGMP
  ip->total_length.set(kIpLen + kIgmpLen);
  ip->id.set(0);
  ip->frag.set(0x4000);
  ip->ttl = 1;
  ip->protocol = kIpProtoIgmp;
  ip->checksum.set(0);
  ip->src.set(h.ipv4);
  ip->dst.set(dst);
  uint8_t* opt = buf + l3 + sizeof(Ipv4Hdr);
  opt[0] = 0x94;  // Router Alert (RFC 2113): copied, option 20, length 4
  opt[1] = 4;
  opt[2] = opt[3] = 0;
  ip->checksum.set(ipv4_checksum(buf + l3, kIpLen));
  uint8_t* g = buf + l3 + kIpLen;
  g[0] = leave ? 0x17 : 0x16;  // v2 Leave Group / v2 Membership Report
  g[1] = 0;                    // max response time: queries only
  store_be16(g + 2, 0);
  store_be32(g + 4, group);
  store_be16(g + 2,
             static_cast<uint16_t>(~csum_fold(csum_partial(g, kIgmpLen))));
  const uint32_t len = l3 + kIpLen + kIgmpLen;
  if (len < 60) {
    std::memset(buf + len, 0, 60 - len);
    return 60;
  }
  return len;
}

bool igmp_query(const uint8_t* l4, uint32_t len, uint32_t* group) {
  if (len < 8 || l4[0] != 0x11) return false;
  if (csum_fold(csum_partial(l4, len)) != 0xffff) return false;
  *group = load_be32(l4 + 4);
  return true;
}

uint32_t build_resolve_request(const HostAddrs& h, uint16_t vlan_tci,
                               const uint8_t gid[16], uint8_t* buf) {
  if (gid_is_ipv4(gid))
    return build_arp_request(h, vlan_tci, gid_to_ipv4(gid), buf);
  if (!h.has_ipv6) return 0;
  return build_neighbour_solicit(h, vlan_tci, gid, buf);
}

}  // namespace urnic::host

namespace urnic::host {
std::string format_gid(const uint8_t g[16]) {
  char buf[40];
  for (int i = 0; i < 8; ++i)
    snprintf(buf + i * 5, 6, "%02x%02x%s", g[2 * i], g[2 * i + 1],
             i < 7 ? ":" : "");
  return buf;
}
}  // namespace urnic::host
