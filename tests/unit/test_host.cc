// ARP, ICMP echo and ND handling, as traces: a crafted frame in, the frame
// that goes out (or none) and the counters.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "dataplane/host/gid_table.h"
#include "dataplane/host/host.h"

using namespace urnic;
using namespace urnic::wire;
using stats::Ctr;

namespace {

constexpr uint32_t kOurIp = 0x0a4d0001;   // 10.77.0.1
constexpr uint32_t kPeerIp = 0x0a4d0002;  // 10.77.0.2
const MacAddr kOurMac{{0x02, 0, 0, 0, 0, 1}};
const MacAddr kPeerMac{{0x02, 0, 0, 0, 0, 2}};

struct HostTest : ::testing::Test {
  host::HostAddrs h;
  host::NeighbourTable nt{host::NeighbourParams{}};
  stats::LcoreCounters c;
  HostTest() {
    h.mac = kOurMac;
    h.ipv4 = kOurIp;
    h.has_ipv6 = true;
    const uint8_t v6[16] = {0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    std::memcpy(h.ipv6, v6, 16);
    host::ipv6_link_local(h.mac, h.ipv6_ll);
  }
  FrameInfo classify(std::vector<uint8_t>& f) {
    FrameInfo fi;
    decode(f.data(), static_cast<uint32_t>(f.size()), fi);
    return fi;
  }
};

std::vector<uint8_t> arp(uint16_t oper, const MacAddr& sha, uint32_t spa,
                         uint32_t tpa) {
  std::vector<uint8_t> f(60, 0);
  auto* eth = reinterpret_cast<EthHdr*>(f.data());
  eth->dst = MacAddr{{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}};
  eth->src = sha;
  eth->ether_type.set(kEtherTypeArp);
  auto* a = reinterpret_cast<ArpHdr*>(f.data() + 14);
  a->htype.set(1);
  a->ptype.set(kEtherTypeIpv4);
  a->hlen = 6;
  a->plen = 4;
  a->oper.set(oper);
  a->sha = sha;
  a->spa.set(spa);
  a->tpa.set(tpa);
  return f;
}

std::vector<uint8_t> echo_request(uint32_t dst) {
  host::HostAddrs peer;
  peer.mac = kPeerMac;
  peer.ipv4 = kPeerIp;
  std::vector<uint8_t> f(128, 0);
  f.resize(host::build_icmp_echo_request(peer, 0, dst, 7, 9, f.data()));
  reinterpret_cast<EthHdr*>(f.data())->dst = kOurMac;
  return f;
}

}  // namespace

TEST_F(HostTest, ArpRequestForUsIsAnsweredInPlaceAndLearned) {
  auto f = arp(1, kPeerMac, kPeerIp, kOurIp);
  uint32_t len = static_cast<uint32_t>(f.size());
  ASSERT_EQ(host::handle_arp(h, nt, c, f.data(), &len, classify(f), 1),
            host::HostVerdict::kReply);
  // Expect: a reply from our MAC to the requester, sender = us.
  const auto* eth = reinterpret_cast<const EthHdr*>(f.data());
  const auto* a = reinterpret_cast<const ArpHdr*>(f.data() + 14);
  EXPECT_EQ(eth->dst, kPeerMac);
  EXPECT_EQ(eth->src, kOurMac);
  EXPECT_EQ(a->oper.get(), 2);
  EXPECT_EQ(a->sha, kOurMac);
  EXPECT_EQ(a->spa.get(), kOurIp);
  EXPECT_EQ(a->tha, kPeerMac);
  EXPECT_EQ(a->tpa.get(), kPeerIp);
  EXPECT_EQ(c.get(Ctr::arp_tx_reply), 1u);
  // Expect: the requester is now in the cache.
  uint8_t gid[16];
  gid_from_ipv4(kPeerIp, gid);
  MacAddr mac;
  EXPECT_EQ(nt.lookup(gid, 2, mac), host::Lookup::kHit);
  EXPECT_EQ(mac, kPeerMac);
}

TEST_F(HostTest, ArpForSomeoneElseIsIgnoredAndNotLearned) {
  auto f = arp(1, kPeerMac, kPeerIp, 0x0a4d0009);
  uint32_t len = static_cast<uint32_t>(f.size());
  EXPECT_EQ(host::handle_arp(h, nt, c, f.data(), &len, classify(f), 1),
            host::HostVerdict::kConsumed);
  EXPECT_EQ(c.get(Ctr::arp_ignored), 1u);
  uint8_t gid[16];
  gid_from_ipv4(kPeerIp, gid);
  MacAddr mac;
  EXPECT_EQ(nt.lookup(gid, 2, mac), host::Lookup::kPending);
}

TEST_F(HostTest, UnsolicitedArpReplyDoesNotFillTheCache) {
  auto f = arp(2, kPeerMac, kPeerIp, kOurIp);
  uint32_t len = static_cast<uint32_t>(f.size());
  host::handle_arp(h, nt, c, f.data(), &len, classify(f), 1);
  EXPECT_EQ(nt.size(), 0u);
  // After we asked, the same reply resolves.
  uint8_t gid[16];
  gid_from_ipv4(kPeerIp, gid);
  EXPECT_TRUE(nt.start(gid, 1));
  host::handle_arp(h, nt, c, f.data(), &len, classify(f), 2);
  MacAddr mac;
  EXPECT_EQ(nt.lookup(gid, 3, mac), host::Lookup::kHit);
  EXPECT_EQ(c.get(Ctr::neigh_resolved), 1u);
}

TEST_F(HostTest, EchoRequestGetsAValidReply) {
  auto f = echo_request(kOurIp);
  uint32_t len = static_cast<uint32_t>(f.size());
  ASSERT_EQ(host::handle_icmpv4(h, c, f.data(), &len, classify(f)),
            host::HostVerdict::kReply);
  f.resize(len);
  // Expect: a reply that itself decodes cleanly (IP checksum), ICMP type 0
  // with a valid checksum, addresses swapped.
  FrameInfo fi = classify(f);
  ASSERT_EQ(fi.kind, FrameKind::kIcmpv4);
  const auto* ip = reinterpret_cast<const Ipv4Hdr*>(f.data() + 14);
  EXPECT_EQ(ip->src.get(), kOurIp);
  EXPECT_EQ(ip->dst.get(), kPeerIp);
  EXPECT_EQ(f[34], 0);
  EXPECT_EQ(csum_fold(csum_partial(f.data() + 34, len - 34)), 0xffff);
  EXPECT_EQ(c.get(Ctr::icmp_echo_tx), 1u);
}

TEST_F(HostTest, EchoWithBadChecksumOrForOthersIsDropped) {
  auto f = echo_request(kOurIp);
  f.back() ^= 0xff;
  uint32_t len = static_cast<uint32_t>(f.size());
  EXPECT_EQ(host::handle_icmpv4(h, c, f.data(), &len, classify(f)),
            host::HostVerdict::kConsumed);
  EXPECT_EQ(c.get(Ctr::icmp_other), 1u);
  f = echo_request(0x0a4d0063);
  EXPECT_EQ(host::handle_icmpv4(h, c, f.data(), &len, classify(f)),
            host::HostVerdict::kConsumed);
  EXPECT_EQ(c.get(Ctr::not_for_us), 1u);
}

TEST_F(HostTest, NeighbourSolicitationGetsAdvertisement) {
  // Build an NS from the peer with our own builder (peer's view).
  host::HostAddrs peer;
  peer.mac = kPeerMac;
  peer.has_ipv6 = true;
  const uint8_t pv6[16] = {0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2};
  std::memcpy(peer.ipv6, pv6, 16);
  host::ipv6_link_local(peer.mac, peer.ipv6_ll);
  std::vector<uint8_t> f(256, 0);
  const uint32_t n = host::build_neighbour_solicit(peer, 0, h.ipv6, f.data());
  f.resize(n);
  uint32_t len = n;
  FrameInfo fi = classify(f);
  ASSERT_EQ(fi.kind, FrameKind::kIcmpv6);
  f.resize(256);
  ASSERT_EQ(host::handle_icmpv6(h, nt, c, f.data(), &len, 256, fi, 1),
            host::HostVerdict::kReply);
  f.resize(len);
  fi = classify(f);
  ASSERT_EQ(fi.kind, FrameKind::kIcmpv6);
  const auto* ip = reinterpret_cast<const Ipv6Hdr*>(f.data() + 14);
  const uint8_t* l4 = f.data() + fi.l4_off;
  // Expect: NA (136), S and O flags, target = our address, valid checksum,
  // sent to the solicitor, hop limit 255.
  EXPECT_EQ(l4[0], 136);
  EXPECT_EQ(l4[4], 0x60);
  EXPECT_EQ(0, std::memcmp(l4 + 8, h.ipv6, 16));
  EXPECT_EQ(0, std::memcmp(ip->dst, peer.ipv6, 16));
  EXPECT_EQ(ip->hop_limit, 255);
  EXPECT_EQ(host::icmpv6_checksum(*ip, l4, fi.l3_len - 40), 0);
  EXPECT_EQ(0, std::memcmp(l4 + 26, kOurMac.b, 6));
  // The solicitor was learned from its source link-layer option.
  MacAddr mac;
  EXPECT_EQ(nt.lookup(peer.ipv6, 2, mac), host::Lookup::kHit);
  EXPECT_EQ(mac, kPeerMac);
}

TEST_F(HostTest, NdWithWrongHopLimitIsIgnored) {
  host::HostAddrs peer = h;
  peer.mac = kPeerMac;
  std::vector<uint8_t> f(256, 0);
  f.resize(host::build_neighbour_solicit(peer, 0, h.ipv6, f.data()));
  f[14 + 7] = 64;  // hop limit is not part of the ICMPv6 checksum
  uint32_t len = static_cast<uint32_t>(f.size());
  FrameInfo fi = classify(f);
  EXPECT_EQ(host::handle_icmpv6(h, nt, c, f.data(), &len, 256, fi, 1),
            host::HostVerdict::kConsumed);
  EXPECT_EQ(c.get(Ctr::nd_ignored), 1u);
}

TEST_F(HostTest, ResolveRequestPicksArpOrNs) {
  uint8_t buf[128];
  uint8_t gid[16];
  gid_from_ipv4(kPeerIp, gid);
  const uint32_t n = host::build_resolve_request(h, 0, gid, buf);
  ASSERT_EQ(n, 60u);
  FrameInfo fi;
  decode(buf, n, fi);
  EXPECT_EQ(fi.kind, FrameKind::kArp);
  uint8_t v6[16] = {0xfd};
  v6[15] = 2;
  decode(buf, host::build_resolve_request(h, 0, v6, buf), fi);
  EXPECT_EQ(fi.kind, FrameKind::kIcmpv6);
}

TEST_F(HostTest, GidTableFromAddresses) {
  host::GidTable t(h);
  ASSERT_EQ(t.count, 3u);
  EXPECT_EQ(host::format_gid(t.gid[0]),
            "0000:0000:0000:0000:0000:ffff:0a4d:0001");
  EXPECT_EQ(host::format_gid(t.gid[1]),
            "fe80:0000:0000:0000:0000:00ff:fe00:0001");  // EUI-64 of 02:..:01
  EXPECT_EQ(t.find(h.ipv6), 2);
  uint8_t other[16];
  gid_from_ipv4(kPeerIp, other);
  EXPECT_EQ(t.find(other), -1);
  host::HostAddrs v4only = h;
  v4only.has_ipv6 = false;
  EXPECT_EQ(host::GidTable(v4only).count, 1u);
}

TEST_F(HostTest, GidTableInTheKernelsLayout) {
  host::HostAddrs k = h;
  k.kernel_gid_layout = true;
  const host::GidTable t(k);
  ASSERT_EQ(t.count, 3u);
  EXPECT_EQ(t.find(h.ipv6_ll), 0);  // the default GID, as rxe's
  uint8_t v4[16];
  gid_from_ipv4(h.ipv4, v4);
  EXPECT_EQ(t.find(v4), 1);
  EXPECT_EQ(t.find(h.ipv6), 2);
  // Without IPv6 there is no link-local GID to put first.
  k.has_ipv6 = false;
  const host::GidTable v4only(k);
  ASSERT_EQ(v4only.count, 1u);
  EXPECT_EQ(v4only.find(v4), 0);
}

TEST_F(HostTest, Icmpv6WithoutIpv6ConfiguredIsNotForUs) {
  host::HostAddrs peer = h;
  peer.mac = kPeerMac;
  std::vector<uint8_t> f(256, 0);
  f.resize(host::build_neighbour_solicit(peer, 0, h.ipv6, f.data()));
  host::HostAddrs v4only = h;
  v4only.has_ipv6 = false;
  uint32_t len = static_cast<uint32_t>(f.size());
  FrameInfo fi = classify(f);
  // Expect: no advertisement, counted as traffic not addressed to us.
  EXPECT_EQ(host::handle_icmpv6(v4only, nt, c, f.data(), &len, 256, fi, 1),
            host::HostVerdict::kConsumed);
  EXPECT_EQ(c.get(Ctr::not_for_us), 1u);
  EXPECT_EQ(c.get(Ctr::nd_tx_na), 0u);
}

// IGMPv2 (RFC 2236): a report goes to the group, a leave to 224.0.0.2, each
// with TTL 1, the Router Alert option, valid IP and IGMP checksums and the
// group's MAC; the decoder takes it as IP that is not RoCE (protocol 2).
TEST_F(HostTest, IgmpReportAndLeave) {
  constexpr uint32_t kGroup = 0xef810203;  // 239.129.2.3
  for (const bool leave : {false, true}) {
    uint8_t buf[128];
    const uint32_t n = host::build_igmp(h, 0, kGroup, leave, buf);
    ASSERT_EQ(n, 60u);
    std::vector<uint8_t> f(buf, buf + n);
    const FrameInfo fi = classify(f);
    ASSERT_EQ(fi.kind, FrameKind::kOtherIp);
    EXPECT_EQ(fi.l4_proto, kIpProtoIgmp);
    EXPECT_EQ(fi.ip_hdr_len, 24u);
    EXPECT_EQ(fi.l3_len, 32u);
    const uint8_t* ip = buf + 14;
    EXPECT_EQ(ip[8], 1);  // TTL
    EXPECT_EQ(std::vector<uint8_t>(ip + 20, ip + 24),
              (std::vector<uint8_t>{0x94, 4, 0, 0}));
    EXPECT_EQ(csum_fold(csum_partial(ip, 24)), 0xffff);
    EXPECT_EQ(load_be32(ip + 12), kOurIp);
    const uint32_t dst = leave ? 0xe0000002 : kGroup;
    EXPECT_EQ(load_be32(ip + 16), dst);
    const MacAddr mac = leave ? MacAddr{{0x01, 0x00, 0x5e, 0x00, 0x00, 0x02}}
                              : MacAddr{{0x01, 0x00, 0x5e, 0x01, 0x02, 0x03}};
    EXPECT_EQ(reinterpret_cast<const EthHdr*>(buf)->dst, mac);
    const uint8_t* g = ip + 24;
    EXPECT_EQ(g[0], leave ? 0x17 : 0x16);
    EXPECT_EQ(load_be32(g + 4), kGroup);
    EXPECT_EQ(csum_fold(csum_partial(g, 8)), 0xffff);
    // Not a query.
    uint32_t asked = 1;
    EXPECT_FALSE(host::igmp_query(g, 8, &asked));
  }
}

// A query (type 0x11) names the group it asks about, 0 for all; a bad
// checksum or a short message is no query.
TEST_F(HostTest, IgmpQueryIsRecognised) {
  uint8_t q[12] = {0x11, 100, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};  // v3: 12 bytes
  auto seal = [&](uint32_t len) {
    q[2] = q[3] = 0;
    const uint16_t s = static_cast<uint16_t>(~csum_fold(csum_partial(q, len)));
    q[2] = static_cast<uint8_t>(s >> 8);
    q[3] = static_cast<uint8_t>(s);
  };
  seal(8);
  uint32_t group = 1;
  EXPECT_TRUE(host::igmp_query(q, 8, &group));
  EXPECT_EQ(group, 0u);
  q[4] = 239, q[5] = 1, q[6] = 2, q[7] = 3;
  seal(12);
  EXPECT_TRUE(host::igmp_query(q, 12, &group));
  EXPECT_EQ(group, 0xef010203u);
  q[7] = 4;  // checksum no longer matches
  EXPECT_FALSE(host::igmp_query(q, 12, &group));
  EXPECT_FALSE(host::igmp_query(q, 7, &group));
}
