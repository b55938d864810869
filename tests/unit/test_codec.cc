// Encode/decode round trips for every opcode and the rejection of every
// malformed-packet class, each by its own reason.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "dataplane/wire/codec.h"
#include "dataplane/wire/icrc.h"

using namespace urnic::wire;

namespace {

RoceFields random_fields(std::mt19937_64& rng, uint8_t op, bool ipv6, bool vlan,
                         uint32_t payload) {
  RoceFields f;
  auto r = [&] { return rng(); };
  for (auto& b : f.dst_mac.b) b = static_cast<uint8_t>(r());
  for (auto& b : f.src_mac.b) b = static_cast<uint8_t>(r());
  f.vlan = vlan;
  f.vlan_tci = vlan ? static_cast<uint16_t>(r() & 0xefff) : 0;
  f.ipv6 = ipv6;
  if (ipv6) {
    for (auto& b : f.sgid) b = static_cast<uint8_t>(r());
    for (auto& b : f.dgid) b = static_cast<uint8_t>(r());
    f.sgid[0] = 0xfd;  // not IPv4-mapped
    f.flow_label = r() & 0xfffff;
    f.dont_fragment = true;  // IPv6 has no DF; decode leaves the default
    f.ip_id = 0;
  } else {
    // A source a host may have (decode refuses 0/8, 127/8, 224/3).
    gid_from_ipv4(0x0a000000 | (static_cast<uint32_t>(r()) & 0xffffff), f.sgid);
    gid_from_ipv4(static_cast<uint32_t>(r()), f.dgid);
    f.ip_id = static_cast<uint16_t>(r());
  }
  f.tclass = static_cast<uint8_t>(r());
  f.ttl = static_cast<uint8_t>(r() | 1);
  f.udp_sport = static_cast<uint16_t>(r());
  f.opcode = op;
  f.se = r() & 1;
  f.migreq = r() & 1;
  f.pkey = static_cast<uint16_t>(r());
  f.fecn = r() & 1;
  f.becn = r() & 1;
  f.dqpn = r() & kMask24;
  f.ack_req = r() & 1;
  f.psn = r() & kMask24;
  const OpcodeInfo& i = opcode_info(op);
  if (i.has_ext(Ext::kReth)) {
    f.reth_va = r();
    f.reth_rkey = static_cast<uint32_t>(r());
    f.reth_len = static_cast<uint32_t>(r());
  }
  if (i.has_ext(Ext::kAeth)) {
    f.aeth_syndrome = static_cast<uint8_t>(r());
    f.aeth_msn = r() & kMask24;
  }
  if (i.has_ext(Ext::kAtomicEth)) {
    f.atomic_va = r();
    f.atomic_rkey = static_cast<uint32_t>(r());
    f.atomic_swap_add = r();
    f.atomic_compare = r();
  }
  if (i.has_ext(Ext::kAtomicAckEth)) f.atomic_orig = r();
  if (i.has_ext(Ext::kImmDt)) f.imm = static_cast<uint32_t>(r());
  if (i.has_ext(Ext::kIeth)) f.ieth_rkey = static_cast<uint32_t>(r());
  if (i.has_ext(Ext::kDeth)) {
    f.deth_qkey = static_cast<uint32_t>(r());
    f.deth_src_qp = r() & kMask24;
  }
  f.payload_len = (i.mask & kPayload) ? payload : 0;
  return f;
}

std::vector<uint8_t> encode(const RoceFields& f,
                            std::vector<uint8_t>* pl = nullptr) {
  std::vector<uint8_t> payload(f.payload_len);
  for (size_t i = 0; i < payload.size(); ++i)
    payload[i] = static_cast<uint8_t>(i * 7 + 3);
  std::vector<uint8_t> buf(f.payload_len + 256);
  const uint32_t n = encode_frame(f, payload.data(), buf.data(),
                                  static_cast<uint32_t>(buf.size()));
  buf.resize(n);
  if (pl) *pl = payload;
  return buf;
}

// A valid IPv4 RC SEND_ONLY frame with 10 bytes of payload.
std::vector<uint8_t> sample() {
  std::mt19937_64 rng(7);
  RoceFields f = random_fields(rng, opcode::kRcSendOnly, false, false, 10);
  f.fecn = f.becn = false;
  return encode(f);
}

Malformed why(const std::vector<uint8_t>& frame, int64_t len = -1) {
  FrameInfo fi;
  decode(frame.data(),
         len >= 0 ? static_cast<uint32_t>(len)
                  : static_cast<uint32_t>(frame.size()),
         fi);
  return fi.kind == FrameKind::kMalformed ? fi.why : Malformed::kNone;
}

void fix_ipv4_csum(std::vector<uint8_t>& f) {
  f[24] = f[25] = 0;
  const uint16_t c =
      static_cast<uint16_t>(~csum_fold(csum_partial(&f[14], 20)));
  f[24] = static_cast<uint8_t>(c >> 8);
  f[25] = static_cast<uint8_t>(c);
}

// Recomputes the ICRC of an IPv4 untagged frame in place.
void fix_icrc(std::vector<uint8_t>& f) {
  Icrc c;
  c.begin(&f[14], 20, false);
  c.update(&f[14 + 20 + 8 + 12], f.size() - (14 + 20 + 8 + 12) - 4);
  Icrc::store(&f[f.size() - 4], c.value());
}

}  // namespace

TEST(Codec, RoundTripEveryOpcode) {
  std::mt19937_64 rng(2024);
  int n = 0;
  for (int op = 0; op < 256; ++op) {
    if (!opcode_info(static_cast<uint8_t>(op)).valid()) continue;
    for (int variant = 0; variant < 8; ++variant) {
      const bool ipv6 = variant & 1, vlan = variant & 2;
      const uint32_t payload = (variant >> 2) ? 1 + rng() % 4096 : 0;
      const RoceFields f =
          random_fields(rng, static_cast<uint8_t>(op), ipv6, vlan, payload);
      std::vector<uint8_t> pl;
      const std::vector<uint8_t> frame = encode(f, &pl);
      ASSERT_FALSE(frame.empty()) << opcode_info(static_cast<uint8_t>(op)).name;
      FrameInfo fi;
      decode(frame.data(), static_cast<uint32_t>(frame.size()), fi);
      ASSERT_EQ(fi.kind, FrameKind::kRoce)
          << opcode_info(static_cast<uint8_t>(op)).name << " "
          << malformed_name(fi.why);
      EXPECT_EQ(fi.roce, f) << opcode_info(static_cast<uint8_t>(op)).name;
      EXPECT_EQ(fi.op, &opcode_info(static_cast<uint8_t>(op)));
      ASSERT_EQ(fi.payload_off + f.payload_len + pad_for(f.payload_len) + 4,
                frame.size());
      if (!pl.empty()) {
        EXPECT_EQ(0, std::memcmp(frame.data() + fi.payload_off, pl.data(),
                                 pl.size()));
      }
      ++n;
    }
  }
  EXPECT_EQ(n, 39 * 8);
}

// A template built from one packet of a flow encodes every other packet of
// that flow (any opcode, length, traffic class, IPv4 id, BTH and extension
// fields) byte for byte as the full encoder does, the IPv4 checksum
// included; and it refuses what the full encoder refuses.
TEST(Codec, TemplateEncodesAsTheFullEncoder) {
  std::mt19937_64 rng(77);
  int n = 0;
  for (int flow = 0; flow < 64; ++flow) {
    const bool ipv6 = flow & 1, vlan = flow & 2;
    const RoceFields first =
        random_fields(rng, 0x04 /* RC SEND only */, ipv6, vlan, 0);
    HeaderTemplate t;
    build_template(first, t);
    ASSERT_GT(t.len, 0);
    for (int op = 0; op < 256; ++op) {
      if (!opcode_info(static_cast<uint8_t>(op)).valid()) continue;
      const uint32_t payload = rng() % 3 ? rng() % 4097 : 0;
      RoceFields f =
          random_fields(rng, static_cast<uint8_t>(op), ipv6, vlan, payload);
      // The flow's addresses, this packet's everything else.
      f.dst_mac = first.dst_mac;
      f.src_mac = first.src_mac;
      f.vlan_tci = first.vlan_tci;
      std::memcpy(f.sgid, first.sgid, 16);
      std::memcpy(f.dgid, first.dgid, 16);
      f.ttl = first.ttl;
      f.flow_label = first.flow_label;
      f.dont_fragment = first.dont_fragment;
      f.udp_sport = first.udp_sport;
      uint8_t full[256], fast[256];
      std::memset(full, 0xa5, sizeof full);
      std::memset(fast, 0x5a, sizeof fast);
      const uint32_t a = encode_headers(f, full, sizeof full);
      const uint32_t b = encode_headers(t, f, fast, sizeof fast);
      ASSERT_EQ(a, b) << opcode_info(static_cast<uint8_t>(op)).name;
      ASSERT_EQ(0, std::memcmp(full, fast, a))
          << opcode_info(static_cast<uint8_t>(op)).name << " flow " << flow;
      // Exactly the room needed is enough (below the template's 66 bytes
      // too); one byte less, or payload on an opcode without any: both
      // refuse.
      uint8_t exact[256];
      ASSERT_EQ(encode_headers(t, f, exact, a), a);
      EXPECT_EQ(0, std::memcmp(full, exact, a));
      EXPECT_EQ(encode_headers(t, f, fast, a - 1), 0u);
      ++n;
    }
  }
  EXPECT_EQ(n, 64 * 39);
  HeaderTemplate none;
  RoceFields f;
  f.opcode = 0x04;
  uint8_t buf[256];
  EXPECT_EQ(encode_headers(none, f, buf, sizeof buf), 0u);  // not built
}

// Headers in one buffer, payload in another, trailer in a third: what the
// zero-copy TX path will send must decode like a flat frame.
TEST(Codec, ScatteredEncodeMatchesFlat) {
  std::mt19937_64 rng(5);
  const RoceFields f =
      random_fields(rng, opcode::kRcWriteOnlyImm, false, true, 1001);
  std::vector<uint8_t> pl;
  const std::vector<uint8_t> flat = encode(f, &pl);
  uint8_t hdr[256], trailer[8];
  const uint32_t hl = encode_headers(f, hdr, sizeof hdr);
  const ConstBuf pieces[] = {{pl.data(), 500}, {pl.data() + 500, 501}};
  const uint32_t tl = encode_trailer(hdr, f, pieces, trailer);
  std::vector<uint8_t> joined(hdr, hdr + hl);
  joined.insert(joined.end(), pl.begin(), pl.end());
  joined.insert(joined.end(), trailer, trailer + tl);
  EXPECT_EQ(joined, flat);
}

// A payload summed piece by piece as it is copied (TrailerSum, for
// TxFrame::unsealed) gets the trailer encode_trailer gives, however split,
// with and without pad, over IPv4 and IPv6, with and without VLAN, for a
// READ response (AETH) and a UD send (DETH).
TEST(Codec, TrailerSumMatchesEncodeTrailer) {
  std::mt19937_64 rng(11);
  for (const int shape : {0, 1, 2, 3, 4, 5, 6, 7}) {
    const bool v6 = shape & 1, vlan = shape & 2;
    const uint8_t op =
        shape & 4 ? opcode::kUdSendOnly : opcode::kRcReadRespOnly;
    for (const uint32_t len : {257u, 1000u, 1001u, 4095u, 4096u}) {
      const RoceFields f = random_fields(rng, op, v6, vlan, len);
      std::vector<uint8_t> pl;
      const std::vector<uint8_t> flat = encode(f, &pl);
      uint8_t hdr[256], want[8], got[8];
      const uint32_t hl = encode_headers(f, hdr, sizeof hdr);
      const ConstBuf whole{pl.data(), len};
      const uint32_t tl = encode_trailer(hdr, f, {&whole, 1}, want);
      EXPECT_EQ(0, std::memcmp(want, flat.data() + hl + len, tl));
      for (const uint32_t cut : {1u, 7u, 256u, len / 2, len - 1}) {
        TrailerSum sum(hdr, f);
        sum.update(pl.data(), cut);
        sum.update(pl.data() + cut, len - cut);
        ASSERT_EQ(sum.finish(got), tl);
        EXPECT_EQ(0, std::memcmp(want, got, tl)) << shape << " " << len;
      }
    }
  }
}

TEST(Codec, EncodeRefusesBadRequests) {
  RoceFields f;
  uint8_t buf[512];
  f.opcode = 0x40;  // RD: unsupported
  EXPECT_EQ(encode_headers(f, buf, sizeof buf), 0u);
  f.opcode = opcode::kRcAck;
  f.payload_len = 4;  // ACKs carry no payload
  EXPECT_EQ(encode_headers(f, buf, sizeof buf), 0u);
  f.payload_len = 0;
  EXPECT_EQ(encode_headers(f, buf, 20), 0u);  // no room
  EXPECT_NE(encode_headers(f, buf, sizeof buf), 0u);
}

TEST(Codec, ClassifiesNonRoce) {
  std::vector<uint8_t> f = sample();
  FrameInfo fi;
  f[14 + 20 + 2] = 0x13;  // UDP dst port no longer 4791 (0x12b7)
  decode(f.data(), static_cast<uint32_t>(f.size()), fi);
  EXPECT_EQ(fi.kind, FrameKind::kOtherIp);
  f = sample();
  f[12] = 0x88;
  f[13] = 0xcc;  // LLDP
  decode(f.data(), static_cast<uint32_t>(f.size()), fi);
  EXPECT_EQ(fi.kind, FrameKind::kOtherL2);
  f = sample();
  f[14 + 9] = 6;  // TCP
  fix_ipv4_csum(f);
  decode(f.data(), static_cast<uint32_t>(f.size()), fi);
  EXPECT_EQ(fi.kind, FrameKind::kOtherIp);
}

TEST(Codec, EthernetPaddingAfterIpIsAllowed) {
  std::vector<uint8_t> f = sample();
  f.resize(f.size() + 6, 0);
  EXPECT_EQ(why(f), Malformed::kNone);
}

// Every malformed class, each with its own reason.
TEST(Codec, RejectsEveryMalformedClass) {
  const std::vector<uint8_t> good = sample();
  ASSERT_EQ(why(good), Malformed::kNone);
  std::vector<uint8_t> f;

  // Expect: truncated at every length below the full frame, never a crash.
  for (uint32_t len = 0; len < good.size(); ++len)
    EXPECT_NE(why(good, len), Malformed::kNone) << len;
  EXPECT_EQ(why(good, 10), Malformed::kTruncated);

  f = good;  // QinQ
  f[12] = 0x88;
  f[13] = 0xa8;
  EXPECT_EQ(why(f), Malformed::kVlanStacked);

  f = good;  // IPv4 EtherType, version 6 inside
  f[14] = 0x65;
  EXPECT_EQ(why(f), Malformed::kIpVersion);

  f = good;  // IHL 4
  f[14] = 0x44;
  EXPECT_EQ(why(f), Malformed::kIpHeaderLen);

  f = good;  // total length beyond the frame
  f[16] = 0x0f;
  fix_ipv4_csum(f);
  EXPECT_EQ(why(f), Malformed::kIpTotalLen);

  f = good;
  f[25] ^= 1;
  EXPECT_EQ(why(f), Malformed::kIpChecksum);

  f = good;  // more-fragments
  f[20] |= 0x20;
  fix_ipv4_csum(f);
  EXPECT_EQ(why(f), Malformed::kIpFragment);

  // Sources no host has (IPv4 source at bytes 26..29): 0/8, loopback,
  // multicast, broadcast. Our own address is fine (own-GID loopback).
  for (const uint8_t top : {0, 127, 224, 239, 255}) {
    f = good;
    f[26] = top;
    fix_ipv4_csum(f);
    EXPECT_EQ(why(f), Malformed::kIpSource) << int{top};
  }

  f = good;  // UDP length one short of the IP payload
  f[14 + 20 + 5] -= 1;
  EXPECT_EQ(why(f), Malformed::kUdpLen);

  f = good;  // TVer 1
  f[14 + 20 + 8 + 1] |= 1;
  EXPECT_EQ(why(f), Malformed::kBthVersion);

  f = good;  // RD opcode
  f[14 + 20 + 8] = 0x44;
  EXPECT_EQ(why(f), Malformed::kUnknownOpcode);

  f = good;  // pad count larger than the padded payload
  f[14 + 20 + 8] = opcode::kRcSendOnly;
  {
    // A frame with no payload but PadCnt 3.
    std::mt19937_64 rng(1);
    RoceFields z = random_fields(rng, opcode::kRcSendOnly, false, false, 0);
    f = encode(z);
    f[14 + 20 + 8 + 1] |= 0x30;
    fix_icrc(f);
    EXPECT_EQ(why(f), Malformed::kBadLength);
  }

  {  // an ACK with 4 bytes of payload
    std::mt19937_64 rng(1);
    RoceFields a = random_fields(rng, opcode::kRcAck, false, false, 0);
    f = encode(a);
    f.insert(f.end() - 4, {1, 2, 3, 4});
    f[14 + 3] += 4;       // IP total length
    f[14 + 20 + 5] += 4;  // UDP length
    fix_ipv4_csum(f);
    fix_icrc(f);
    EXPECT_EQ(why(f), Malformed::kPayloadNotAllowed);
  }

  f = good;
  f[f.size() - 7] ^= 0x80;  // a payload bit
  EXPECT_EQ(why(f), Malformed::kBadIcrc);
  f = good;
  f.back() ^= 1;  // an ICRC bit
  EXPECT_EQ(why(f), Malformed::kBadIcrc);
}

TEST(Codec, VariantFieldsDoNotAffectIcrc) {
  std::vector<uint8_t> f = sample();
  f[15] = 0x03;  // ECN CE marked in flight
  f[22] = 1;     // TTL decremented
  fix_ipv4_csum(f);
  f[14 + 20 + 6] = 0x12;       // UDP checksum
  f[14 + 20 + 8 + 4] |= 0x80;  // FECN
  EXPECT_EQ(why(f), Malformed::kNone);
}

TEST(Codec, SplitHeadersAreReportedNotRead) {
  const std::vector<uint8_t> good = sample();
  const ConstBuf segs[] = {
      {good.data(), 40},
      {good.data() + 40, static_cast<uint32_t>(good.size() - 40)}};
  FrameInfo fi;
  decode(segs, static_cast<uint32_t>(good.size()), fi);
  EXPECT_EQ(fi.kind, FrameKind::kMalformed);
  EXPECT_EQ(fi.why, Malformed::kSplitHeaders);
}

TEST(Codec, MalformedNamesAreDistinct) {
  for (size_t a = 0; a < static_cast<size_t>(Malformed::kCount); ++a)
    for (size_t b = a + 1; b < static_cast<size_t>(Malformed::kCount); ++b)
      EXPECT_STRNE(malformed_name(static_cast<Malformed>(a)),
                   malformed_name(static_cast<Malformed>(b)));
}

// A switch's CE mark (what the fault stage and the simulated link do): only
// ECN-capable RoCEv2 frames, IPv4 checksum fixed, ICRC still valid.
TEST(Codec, MarkCe) {
  std::mt19937_64 rng(11);
  for (bool v6 : {false, true}) {
    for (bool vlan : {false, true}) {
      for (uint8_t ecn : {0, 1, 2, 3}) {
        SCOPED_TRACE(testing::Message()
                     << "v6 " << v6 << " vlan " << vlan << " ecn " << int{ecn});
        RoceFields f = random_fields(rng, opcode::kRcWriteOnly, v6, vlan, 64);
        f.tclass = static_cast<uint8_t>(0x68 | ecn);  // DSCP 26
        std::vector<uint8_t> frame = encode(f);
        const std::vector<uint8_t> before = frame;
        const uint32_t len = static_cast<uint32_t>(frame.size());
        EXPECT_EQ(mark_ce(frame.data(), len), ecn != 0);
        FrameInfo fi;
        decode(frame.data(), len, fi);
        ASSERT_EQ(fi.kind, FrameKind::kRoce) << malformed_name(fi.why);
        EXPECT_EQ(fi.roce.tclass, ecn ? 0x6b : 0x68);
        if (!ecn) {
          EXPECT_EQ(frame, before);
        }
        // Cut short before the UDP header: not touched.
        std::vector<uint8_t> cut = before;
        EXPECT_FALSE(mark_ce(cut.data(), v6 ? 14 + 40 : 14 + 20));
        EXPECT_EQ(cut, before);
      }
    }
  }
  // Another UDP port is not RoCEv2.
  std::vector<uint8_t> other = sample();
  other[14 + 20 + 2] = 0x13;  // destination port 4791 -> 5047
  other[15] = 0x02;
  EXPECT_FALSE(mark_ce(other.data(), static_cast<uint32_t>(other.size())));
}
