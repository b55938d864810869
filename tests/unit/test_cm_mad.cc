// CM MAD codec: golden MADs written byte by byte from the IBTA tables (so a
// wrong offset fails even when encode and decode agree), round trips, field
// masking, header refusals, cma_hdr, service IDs and CM timeouts.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <vector>

#include "dataplane/wire/cm_mad.h"

using namespace urnic::wire::cm;

namespace {

using Bytes = std::array<uint8_t, kMadSize>;

constexpr uint64_t kTid = 0x0000000512345678;  // agent 5, comm ID 0x12345678
constexpr uint32_t kAttrMod = 0x00000001;

MadHdr hdr() {
  MadHdr h;
  h.tid = kTid;
  h.attr_mod = kAttrMod;
  h.attr_id = 0x99;  // encode must replace it with the message's
  return h;
}

// Ch. 13 MAD header, by hand: base version, class, class version, method,
// status, class specific, TID, attribute ID, reserved, attribute modifier.
Bytes golden_hdr(uint8_t attr) {
  Bytes e{};
  e[0] = 0x01;
  e[1] = 0x07;
  e[2] = 0x02;
  e[3] = 0x03;
  const uint8_t tid[8] = {0x00, 0x00, 0x00, 0x05, 0x12, 0x34, 0x56, 0x78};
  std::memcpy(&e[8], tid, 8);
  e[16] = 0x00;
  e[17] = attr;
  e[23] = 0x01;  // attr_mod
  return e;
}

template <size_t N>
void fill(uint8_t (&a)[N], uint8_t seed) {
  for (size_t i = 0; i < N; ++i) a[i] = static_cast<uint8_t>(seed + i * 7);
}
template <size_t N>
void fill_golden(Bytes& e, size_t at, uint8_t seed) {
  for (size_t i = 0; i < N; ++i) e[at + i] = static_cast<uint8_t>(seed + i * 7);
}

void expect_bytes(const uint8_t* got, const Bytes& want) {
  for (size_t i = 0; i < kMadSize; ++i)
    EXPECT_EQ(got[i], want[i]) << "MAD byte " << i << " (message byte "
                               << static_cast<long>(i) - 24 << ")";
}

// Encodes `m`, compares with the hand-written golden, decodes the golden
// (header and message) and compares with `m`.
template <typename Msg>
void check_golden(const Msg& m, const Bytes& golden, uint16_t attr) {
  std::vector<uint8_t> mad(kMadSize, 0xee);  // exact size: ASan sees overruns
  encode(hdr(), m, mad.data());
  expect_bytes(mad.data(), golden);

  std::vector<uint8_t> in(golden.begin(), golden.end());
  MadHdr h;
  ASSERT_EQ(decode_hdr(in.data(), in.size(), h), DecodeError::kOk);
  EXPECT_EQ(h.tid, kTid);
  EXPECT_EQ(h.attr_id, attr);
  EXPECT_EQ(h.attr_mod, kAttrMod);
  Msg d;
  std::memset(static_cast<void*>(&d), 0xa5, sizeof d);  // decode sets all
  decode(in.data(), d);
  EXPECT_TRUE(d == m);
}

template <typename Msg>
Msg round_trip(const Msg& m) {
  std::vector<uint8_t> mad(kMadSize);
  encode(hdr(), m, mad.data());
  MadHdr h;
  EXPECT_EQ(decode_hdr(mad.data(), mad.size(), h), DecodeError::kOk);
  Msg d;
  decode(mad.data(), d);
  return d;
}

// A REQ with every field set, all bit fields distinct from their neighbours.
Req full_req() {
  Req r;
  r.local_comm_id = 0x11223344;
  r.ece_vendor_id = 0x02c9aa;
  r.service_id = service_id(kPsTcp, 7174);
  r.local_ca_guid = 0x0a1b2c3d4e5f6071;
  r.local_qkey = 0xdeadbeef;
  r.local_qpn = 0x123456;
  r.responder_resources = 0x77;
  r.local_eecn = 0xabcdef;
  r.initiator_depth = 0x88;
  r.remote_eecn = 0x654321;
  r.remote_cm_response_timeout = 20;
  r.transport_type = 3;
  r.flow_control = true;
  r.starting_psn = 0xfedcba;
  r.local_cm_response_timeout = 22;
  r.retry_count = 7;
  r.pkey = 0x8001;
  r.path_mtu = 3;
  r.rdc_exists = true;
  r.rnr_retry_count = 6;
  r.max_cm_retries = 15;
  r.srq = true;
  r.extended_transport = 5;
  Path& p = r.primary;
  p.local_lid = 0xffff;
  p.remote_lid = 0xfffe;
  const uint8_t v4a[16] = {0, 0, 0,    0,    0,  0,  0, 0,
                           0, 0, 0xff, 0xff, 10, 77, 0, 1};
  const uint8_t v4b[16] = {0, 0, 0,    0,    0,  0,  0, 0,
                           0, 0, 0xff, 0xff, 10, 77, 0, 2};
  std::memcpy(p.local_gid, v4a, 16);
  std::memcpy(p.remote_gid, v4b, 16);
  p.flow_label = 0xabcde;
  p.packet_rate = 0x2a;
  p.traffic_class = 0x60;
  p.hop_limit = 64;
  p.sl = 5;
  p.subnet_local = true;
  p.local_ack_timeout = 17;
  r.has_alternate = true;
  Path& a = r.alternate;
  a.local_lid = 0x1234;
  a.remote_lid = 0x5678;
  fill(a.local_gid, 0xf0);
  fill(a.remote_gid, 0x0f);
  a.flow_label = 0x12345;
  a.packet_rate = 0x3f;
  a.traffic_class = 0x12;
  a.hop_limit = 2;
  a.sl = 15;
  a.subnet_local = false;
  a.local_ack_timeout = 31;
  r.sap_supported = true;
  fill(r.private_data, 1);
  return r;
}

}  // namespace

TEST(CmMad, ReqGolden) {
  const Req r = full_req();
  Bytes e = golden_hdr(0x10);
  const size_t m = 24;  // Table 106 offsets below are after the header
  e[m + 0] = 0x11, e[m + 1] = 0x22, e[m + 2] = 0x33, e[m + 3] = 0x44;
  e[m + 5] = 0x02, e[m + 6] = 0xc9, e[m + 7] = 0xaa;  // ECE vendor ID
  const uint8_t sid[8] = {0, 0, 0, 0, 0x01, 0x06, 0x1c, 0x06};
  std::memcpy(&e[m + 8], sid, 8);
  const uint8_t guid[8] = {0x0a, 0x1b, 0x2c, 0x3d, 0x4e, 0x5f, 0x60, 0x71};
  std::memcpy(&e[m + 16], guid, 8);
  e[m + 28] = 0xde, e[m + 29] = 0xad, e[m + 30] = 0xbe, e[m + 31] = 0xef;
  e[m + 32] = 0x12, e[m + 33] = 0x34, e[m + 34] = 0x56;  // local QPN
  e[m + 35] = 0x77;                                      // responder res.
  e[m + 36] = 0xab, e[m + 37] = 0xcd, e[m + 38] = 0xef;  // local EECN
  e[m + 39] = 0x88;                                      // initiator depth
  e[m + 40] = 0x65, e[m + 41] = 0x43, e[m + 42] = 0x21;  // remote EECN
  e[m + 43] = 0xa7;  // 10100 remote CM timeout 20 | 11 XRC | 1 flow control
  e[m + 44] = 0xfe, e[m + 45] = 0xdc, e[m + 46] = 0xba;  // starting PSN
  e[m + 47] = 0xb7;  // 10110 local CM timeout 22 | 111 retry count
  e[m + 48] = 0x80, e[m + 49] = 0x01;  // P_Key
  e[m + 50] = 0x3e;  // 0011 MTU 3 | 1 RDC exists | 110 RNR retry 6
  e[m + 51] = 0xfd;  // 1111 max CM retries | 1 SRQ | 101 extended transport
  // Primary path, 52..95.
  e[m + 52] = 0xff, e[m + 53] = 0xff, e[m + 54] = 0xff, e[m + 55] = 0xfe;
  e[m + 66] = 0xff, e[m + 67] = 0xff, e[m + 68] = 10, e[m + 69] = 77;
  e[m + 70] = 0, e[m + 71] = 1;  // local GID ::ffff:10.77.0.1 at 56
  e[m + 82] = 0xff, e[m + 83] = 0xff, e[m + 84] = 10, e[m + 85] = 77;
  e[m + 86] = 0, e[m + 87] = 2;                          // remote GID at 72
  e[m + 88] = 0xab, e[m + 89] = 0xcd, e[m + 90] = 0xe0;  // flow label 20 bits
  e[m + 91] = 0x2a;  // 00 reserved | 101010 packet rate
  e[m + 92] = 0x60;  // traffic class
  e[m + 93] = 64;    // hop limit
  e[m + 94] = 0x58;  // 0101 SL 5 | 1 subnet local | 000
  e[m + 95] = 0x88;  // 10001 local ACK timeout 17 | 000
  // Alternate path, 96..139.
  e[m + 96] = 0x12, e[m + 97] = 0x34, e[m + 98] = 0x56, e[m + 99] = 0x78;
  fill_golden<16>(e, m + 100, 0xf0);
  fill_golden<16>(e, m + 116, 0x0f);
  e[m + 132] = 0x12, e[m + 133] = 0x34, e[m + 134] = 0x50;
  e[m + 135] = 0x3f;
  e[m + 136] = 0x12;
  e[m + 137] = 2;
  e[m + 138] = 0xf0;  // 1111 SL 15 | 0 subnet local
  e[m + 139] = 0xfc;  // 11111 local ACK timeout 31 | 1 SAP supported | 00
  fill_golden<92>(e, m + 140, 1);  // private data to the end
  check_golden(r, e, 0x10);
}

TEST(CmMad, ReqAsLinuxSendsOnRoce) {
  // cm_format_req on RoCE: LIDs 0xFFFF, no alternate path (zeros at 96..139),
  // CM timeouts 20, max CM retries 15, RC.
  Req r;
  r.local_qpn = 0x000011;
  r.remote_cm_response_timeout = 20;
  r.local_cm_response_timeout = 20;
  r.max_cm_retries = 15;
  r.pkey = 0xffff;
  r.path_mtu = 3;
  r.primary.local_ack_timeout = 17;
  uint8_t mad[kMadSize];
  encode(hdr(), r, mad);
  EXPECT_EQ(mad[24 + 43], 0xa0);
  EXPECT_EQ(mad[24 + 47], 0xa0);
  EXPECT_EQ(mad[24 + 51], 0xf0);
  EXPECT_EQ(mad[24 + 52], 0xff);
  EXPECT_EQ(mad[24 + 55], 0xff);
  EXPECT_EQ(mad[24 + 93], 64);
  for (size_t i = 96; i < 140; ++i) EXPECT_EQ(mad[24 + i], 0) << i;
  Req d;
  decode(mad, d);
  EXPECT_FALSE(d.has_alternate);
  EXPECT_TRUE(d == r);
}

TEST(CmMad, ReqRoundTrip) {
  const Req r = full_req();
  EXPECT_TRUE(round_trip(r) == r);
  Req no_alt = r;
  no_alt.has_alternate = false;
  no_alt.alternate = Path{};
  EXPECT_TRUE(round_trip(no_alt) == no_alt);
}

TEST(CmMad, MraGoldenAndRoundTrip) {
  Mra m;
  m.local_comm_id = 0x01020304;
  m.remote_comm_id = 0x05060708;
  m.message_mraed = 2;
  m.service_timeout = 24;
  fill(m.private_data, 3);
  Bytes e = golden_hdr(0x11);
  const uint8_t ids[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  std::memcpy(&e[24], ids, 8);
  e[24 + 8] = 0x80;  // 10 MRAed "other" | 000000
  e[24 + 9] = 0xc0;  // 11000 service timeout 24 | 000
  fill_golden<222>(e, 24 + 10, 3);
  check_golden(m, e, 0x11);
  m.message_mraed = 1;
  m.service_timeout = 31;
  EXPECT_TRUE(round_trip(m) == m);
}

TEST(CmMad, RejGoldenAndRoundTrip) {
  Rej m;
  m.local_comm_id = 0xa1a2a3a4;
  m.remote_comm_id = 0xb1b2b3b4;
  m.message_rejected = 1;
  m.ari_length = 72;
  m.reason = static_cast<uint16_t>(RejReason::kConsumerDefined);
  fill(m.ari, 0x20);
  fill(m.private_data, 0x40);
  Bytes e = golden_hdr(0x12);
  const uint8_t ids[8] = {0xa1, 0xa2, 0xa3, 0xa4, 0xb1, 0xb2, 0xb3, 0xb4};
  std::memcpy(&e[24], ids, 8);
  e[24 + 8] = 0x40;  // 01 REP rejected
  e[24 + 9] = 0x90;  // 1001000 ARI length 72 | 0
  e[24 + 10] = 0x00, e[24 + 11] = 28;
  fill_golden<72>(e, 24 + 12, 0x20);
  fill_golden<148>(e, 24 + 84, 0x40);
  check_golden(m, e, 0x12);
  m.message_rejected = 2;
  m.ari_length = 0x7f;
  m.reason = 0xbeef;
  EXPECT_TRUE(round_trip(m) == m);
}

TEST(CmMad, RepGoldenAndRoundTrip) {
  Rep m;
  m.local_comm_id = 0x10203040;
  m.remote_comm_id = 0x50607080;
  m.local_qkey = 0x01234567;
  m.local_qpn = 0xabcdef;
  m.local_eecn = 0x111111;
  m.starting_psn = 0x7a5a5a;
  m.ece_vendor_id = 0x02c9aa;
  m.responder_resources = 16;
  m.initiator_depth = 8;
  m.target_ack_delay = 15;
  m.failover = 2;
  m.flow_control = true;
  m.rnr_retry_count = 7;
  m.srq = true;
  m.local_ca_guid = 0x0102030405060708;
  fill(m.private_data, 9);
  Bytes e = golden_hdr(0x13);
  const uint8_t ids[8] = {0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80};
  std::memcpy(&e[24], ids, 8);
  e[24 + 8] = 0x01, e[24 + 9] = 0x23, e[24 + 10] = 0x45, e[24 + 11] = 0x67;
  e[24 + 12] = 0xab, e[24 + 13] = 0xcd, e[24 + 14] = 0xef;  // local QPN
  e[24 + 15] = 0x02;                                        // vendor high
  e[24 + 16] = 0x11, e[24 + 17] = 0x11, e[24 + 18] = 0x11;  // local EECN
  e[24 + 19] = 0xc9;                                        // vendor mid
  e[24 + 20] = 0x7a, e[24 + 21] = 0x5a, e[24 + 22] = 0x5a;  // starting PSN
  e[24 + 23] = 0xaa;                                        // vendor low
  e[24 + 24] = 16;
  e[24 + 25] = 8;
  e[24 + 26] = 0x7d;  // 01111 target ACK delay 15 | 10 failover | 1 flow ctl
  e[24 + 27] = 0xf0;  // 111 RNR retry 7 | 1 SRQ | 0000
  for (int i = 0; i < 8; ++i) e[24 + 28 + i] = static_cast<uint8_t>(i + 1);
  fill_golden<196>(e, 24 + 36, 9);
  check_golden(m, e, 0x13);
  m.failover = 3;
  m.flow_control = false;
  m.srq = false;
  m.rnr_retry_count = 5;
  EXPECT_TRUE(round_trip(m) == m);
}

TEST(CmMad, RtuGoldenAndRoundTrip) {
  Rtu m;
  m.local_comm_id = 0xcafef00d;
  m.remote_comm_id = 0x0badc0de;
  fill(m.private_data, 0x33);
  Bytes e = golden_hdr(0x14);
  const uint8_t ids[8] = {0xca, 0xfe, 0xf0, 0x0d, 0x0b, 0xad, 0xc0, 0xde};
  std::memcpy(&e[24], ids, 8);
  fill_golden<224>(e, 24 + 8, 0x33);
  check_golden(m, e, 0x14);
  EXPECT_TRUE(round_trip(m) == m);
}

TEST(CmMad, DreqGoldenAndRoundTrip) {
  Dreq m;
  m.local_comm_id = 0x01010101;
  m.remote_comm_id = 0x02020202;
  m.remote_qpn = 0xa1b2c3;
  fill(m.private_data, 0x44);
  Bytes e = golden_hdr(0x15);
  const uint8_t ids[8] = {1, 1, 1, 1, 2, 2, 2, 2};
  std::memcpy(&e[24], ids, 8);
  e[24 + 8] = 0xa1, e[24 + 9] = 0xb2, e[24 + 10] = 0xc3;  // byte 11 reserved
  fill_golden<220>(e, 24 + 12, 0x44);
  check_golden(m, e, 0x15);
  EXPECT_TRUE(round_trip(m) == m);
}

TEST(CmMad, DrepGoldenAndRoundTrip) {
  Drep m;
  m.local_comm_id = 0x03030303;
  m.remote_comm_id = 0x04040404;
  fill(m.private_data, 0x55);
  Bytes e = golden_hdr(0x16);
  const uint8_t ids[8] = {3, 3, 3, 3, 4, 4, 4, 4};
  std::memcpy(&e[24], ids, 8);
  fill_golden<224>(e, 24 + 8, 0x55);
  check_golden(m, e, 0x16);
  EXPECT_TRUE(round_trip(m) == m);
}

TEST(CmMad, SidrReqGoldenAndRoundTrip) {
  SidrReq m;
  m.request_id = 0x99887766;
  m.pkey = 0xffff;
  m.service_id = service_id(kPsUdp, 4791);
  fill(m.private_data, 0x66);
  Bytes e = golden_hdr(0x17);
  e[24 + 0] = 0x99, e[24 + 1] = 0x88, e[24 + 2] = 0x77, e[24 + 3] = 0x66;
  e[24 + 4] = 0xff, e[24 + 5] = 0xff;  // 6..7 reserved
  const uint8_t sid[8] = {0, 0, 0, 0, 0x01, 0x11, 0x12, 0xb7};
  std::memcpy(&e[24 + 8], sid, 8);
  fill_golden<216>(e, 24 + 16, 0x66);
  check_golden(m, e, 0x17);
  EXPECT_TRUE(round_trip(m) == m);
}

TEST(CmMad, SidrRepGoldenAndRoundTrip) {
  SidrRep m;
  m.request_id = 0x99887766;
  m.status = static_cast<uint8_t>(SidrStatus::kReject);
  m.add_info_length = 72;
  m.vendor_id = 0x02c9aa;
  m.qpn = 0x000123;
  m.service_id = service_id(kPsUdp, 4791);
  m.qkey = 0x01234567;
  fill(m.add_info, 0x70);
  fill(m.private_data, 0x77);
  Bytes e = golden_hdr(0x18);
  e[24 + 0] = 0x99, e[24 + 1] = 0x88, e[24 + 2] = 0x77, e[24 + 3] = 0x66;
  e[24 + 4] = 2;
  e[24 + 5] = 72;
  e[24 + 6] = 0x02, e[24 + 7] = 0xc9;                     // vendor high 16
  e[24 + 8] = 0x00, e[24 + 9] = 0x01, e[24 + 10] = 0x23;  // QPN
  e[24 + 11] = 0xaa;                                      // vendor low
  const uint8_t sid[8] = {0, 0, 0, 0, 0x01, 0x11, 0x12, 0xb7};
  std::memcpy(&e[24 + 12], sid, 8);
  e[24 + 20] = 0x01, e[24 + 21] = 0x23, e[24 + 22] = 0x45, e[24 + 23] = 0x67;
  fill_golden<72>(e, 24 + 24, 0x70);
  fill_golden<136>(e, 24 + 96, 0x77);
  check_golden(m, e, 0x18);
  m.status = 5;
  m.qpn = 0xffffff;
  EXPECT_TRUE(round_trip(m) == m);
}

TEST(CmMad, EncodersMaskToFieldWidths) {
  Req r = full_req();
  Req big = r;
  big.ece_vendor_id |= 0xff000000;
  big.local_qpn |= 0xff000000;
  big.local_eecn |= 0xff000000;
  big.remote_eecn |= 0xff000000;
  big.starting_psn |= 0xff000000;
  big.remote_cm_response_timeout |= 0xe0;
  big.transport_type |= 0xfc;
  big.local_cm_response_timeout |= 0xe0;
  big.retry_count |= 0xf8;
  big.path_mtu |= 0xf0;
  big.rnr_retry_count |= 0xf8;
  big.max_cm_retries |= 0xf0;
  big.extended_transport |= 0xf8;
  big.primary.flow_label |= 0xfff00000;
  big.primary.packet_rate |= 0xc0;
  big.primary.sl |= 0xf0;
  big.primary.local_ack_timeout |= 0xe0;
  big.alternate.flow_label |= 0xfff00000;
  big.alternate.packet_rate |= 0xc0;
  big.alternate.sl |= 0xf0;
  big.alternate.local_ack_timeout |= 0xe0;
  uint8_t a[kMadSize], b[kMadSize];
  encode(hdr(), r, a);
  encode(hdr(), big, b);
  EXPECT_EQ(std::memcmp(a, b, kMadSize), 0);

  Rep p;
  p.local_qpn = 0x123456;
  p.local_eecn = 0x654321;
  p.starting_psn = 0xabcdef;
  p.ece_vendor_id = 0x02c9aa;
  p.target_ack_delay = 15;
  p.failover = 1;
  p.rnr_retry_count = 3;
  p.responder_resources = 0x11;
  Rep pbig = p;
  pbig.local_qpn |= 0xff000000;
  pbig.local_eecn |= 0xff000000;
  pbig.starting_psn |= 0xff000000;
  pbig.ece_vendor_id |= 0xff000000;
  pbig.target_ack_delay |= 0xe0;
  pbig.failover |= 0xfc;
  pbig.rnr_retry_count |= 0xf8;
  encode(hdr(), p, a);
  encode(hdr(), pbig, b);
  EXPECT_EQ(std::memcmp(a, b, kMadSize), 0);

  Mra m;
  m.message_mraed = 0xff;
  m.service_timeout = 0xff;
  encode(hdr(), m, a);
  EXPECT_EQ(a[24 + 8], 0xc0);
  EXPECT_EQ(a[24 + 9], 0xf8);
  EXPECT_EQ(a[24 + 10], 0);

  Rej j;
  j.message_rejected = 0xff;
  j.ari_length = 0xff;
  encode(hdr(), j, a);
  EXPECT_EQ(a[24 + 8], 0xc0);
  EXPECT_EQ(a[24 + 9], 0xfe);

  Dreq d;
  d.remote_qpn = 0xffabcdef;
  encode(hdr(), d, a);
  EXPECT_EQ(a[24 + 8], 0xab);
  EXPECT_EQ(a[24 + 11], 0);

  SidrRep s;
  s.qpn = 0xff000001;
  s.vendor_id = 0xff02c9aa;
  encode(hdr(), s, a);
  EXPECT_EQ(a[24 + 6], 0x02);
  EXPECT_EQ(a[24 + 7], 0xc9);
  EXPECT_EQ(a[24 + 8], 0x00);
  EXPECT_EQ(a[24 + 10], 0x01);
  EXPECT_EQ(a[24 + 11], 0xaa);
}

TEST(CmMad, EncodeSetsAttrIdAndZeroPads) {
  uint8_t mad[kMadSize];
  std::memset(mad, 0xee, sizeof mad);
  MadHdr h = hdr();
  h.attr_id = static_cast<uint16_t>(Attr::kReq);
  encode(h, Rtu{}, mad);  // attr_id follows the message, not the header
  EXPECT_EQ(mad[16], 0x00);
  EXPECT_EQ(mad[17], 0x14);
  EXPECT_EQ(mad[18], 0x00);
  EXPECT_EQ(mad[19], 0x00);
  for (size_t i = 24; i < kMadSize; ++i) EXPECT_EQ(mad[i], 0) << i;
}

TEST(CmMad, DecodeHdrChecksEachField) {
  uint8_t good[kMadSize];
  encode(hdr(), Drep{}, good);
  MadHdr h;
  ASSERT_EQ(decode_hdr(good, sizeof good, h), DecodeError::kOk);
  EXPECT_EQ(h.base_version, 1);
  EXPECT_EQ(h.mgmt_class, 0x07);
  EXPECT_EQ(h.class_version, 2);
  EXPECT_EQ(h.method, 0x03);
  EXPECT_EQ(h.status, 0);
  EXPECT_EQ(h.tid, kTid);
  EXPECT_EQ(h.attr_id, 0x16);
  EXPECT_EQ(h.attr_mod, kAttrMod);

  // A longer buffer (a UD payload with trailing bytes) is fine.
  std::vector<uint8_t> longer(good, good + kMadSize);
  longer.resize(300);
  EXPECT_EQ(decode_hdr(longer.data(), longer.size(), h), DecodeError::kOk);

  // Short: nothing is read.
  EXPECT_EQ(decode_hdr(good, kMadSize - 1, h), DecodeError::kShort);
  EXPECT_EQ(decode_hdr(good, kMadHdrSize, h), DecodeError::kShort);
  EXPECT_EQ(decode_hdr(nullptr, 0, h), DecodeError::kShort);

  struct Case {
    size_t at;
    uint8_t value;
    DecodeError want;
  };
  const Case cases[] = {
      {0, 0, DecodeError::kBaseVersion},
      {0, 2, DecodeError::kBaseVersion},
      {1, 0x04, DecodeError::kClass},  // SA
      {1, 0x81, DecodeError::kClass},
      {2, 1, DecodeError::kClassVersion},
      {2, 3, DecodeError::kClassVersion},
      {3, 0x01, DecodeError::kMethod},        // GET
      {3, 0x81, DecodeError::kMethod},        // GET response
      {17, 0x01, DecodeError::kUnknownAttr},  // ClassPortInfo
      {17, 0x0f, DecodeError::kUnknownAttr},
      {17, 0x19, DecodeError::kUnknownAttr},  // LAP
      {17, 0x1a, DecodeError::kUnknownAttr},  // APR
      {16, 0x01, DecodeError::kUnknownAttr},  // 0x0116
  };
  for (const Case& c : cases) {
    uint8_t bad[kMadSize];
    std::memcpy(bad, good, kMadSize);
    bad[c.at] = c.value;
    EXPECT_EQ(decode_hdr(bad, sizeof bad, h), c.want)
        << "byte " << c.at << " = " << int{c.value} << ": "
        << decode_error_name(decode_hdr(bad, sizeof bad, h));
  }
  for (uint16_t a = 0x10; a <= 0x18; ++a) {
    uint8_t ok[kMadSize];
    std::memcpy(ok, good, kMadSize);
    ok[17] = static_cast<uint8_t>(a);
    EXPECT_EQ(decode_hdr(ok, sizeof ok, h), DecodeError::kOk) << a;
  }
}

TEST(CmMad, DecodeErrorNames) {
  EXPECT_STREQ(decode_error_name(DecodeError::kOk), "ok");
  EXPECT_STREQ(decode_error_name(DecodeError::kShort), "short");
  EXPECT_STREQ(decode_error_name(DecodeError::kUnknownAttr), "unknown_attr");
  EXPECT_STREQ(decode_error_name(static_cast<DecodeError>(200)), "?");
}

TEST(CmMad, CmaHdrV4) {
  CmaHdr c;
  c.ip_version = 4;
  c.src_port = 0xc123;
  c.src_addr[12] = 10, c.src_addr[13] = 77, c.src_addr[14] = 0,
  c.src_addr[15] = 2;
  c.dst_addr[12] = 10, c.dst_addr[13] = 77, c.dst_addr[14] = 0,
  c.dst_addr[15] = 1;
  uint8_t b[kCmaHdrSize];
  encode(c, b);
  const uint8_t want[kCmaHdrSize] = {
      0x00, 0x40, 0xc1, 0x23,                          // version, IPv4, port
      0,    0,    0,    0,    0, 0, 0, 0, 0, 0, 0, 0,  // src pad
      10,   77,   0,    2,                             // src 10.77.0.2
      0,    0,    0,    0,    0, 0, 0, 0, 0, 0, 0, 0,  // dst pad
      10,   77,   0,    1};                            // dst 10.77.0.1
  EXPECT_EQ(std::memcmp(b, want, kCmaHdrSize), 0);
  CmaHdr d;
  ASSERT_TRUE(decode(b, d));
  EXPECT_TRUE(d == c);

  // The pad is not read for IPv4 (cma.c reads ip4.addr only); the low nibble
  // of byte 1 is ignored.
  uint8_t dirty[kCmaHdrSize];
  std::memcpy(dirty, want, kCmaHdrSize);
  dirty[1] = 0x4f;
  dirty[4] = 0xff;
  dirty[30] = 0xff;
  ASSERT_TRUE(decode(dirty, d));
  EXPECT_TRUE(d == c);

  // Encode writes the pad as zeros even if the caller left bytes there.
  CmaHdr messy = c;
  messy.src_addr[0] = 0xff;
  encode(messy, b);
  EXPECT_EQ(std::memcmp(b, want, kCmaHdrSize), 0);
}

TEST(CmMad, CmaHdrV6) {
  CmaHdr c;
  c.ip_version = 6;
  c.src_port = 40000;
  fill(c.src_addr, 0xfd);
  fill(c.dst_addr, 0xfe);
  uint8_t b[kCmaHdrSize];
  encode(c, b);
  EXPECT_EQ(b[0], 0x00);
  EXPECT_EQ(b[1], 0x60);
  EXPECT_EQ(b[2], 0x9c);  // 40000 = 0x9c40
  EXPECT_EQ(b[3], 0x40);
  EXPECT_EQ(std::memcmp(b + 4, c.src_addr, 16), 0);
  EXPECT_EQ(std::memcmp(b + 20, c.dst_addr, 16), 0);
  CmaHdr d;
  ASSERT_TRUE(decode(b, d));
  EXPECT_TRUE(d == c);
}

TEST(CmMad, CmaHdrRefusals) {
  CmaHdr c;
  c.ip_version = 4;
  uint8_t b[kCmaHdrSize];
  encode(c, b);
  CmaHdr d;
  ASSERT_TRUE(decode(b, d));
  uint8_t bad[kCmaHdrSize];
  std::memcpy(bad, b, kCmaHdrSize);
  bad[0] = 1;  // cma_version
  EXPECT_FALSE(decode(bad, d));
  for (uint8_t v : {0x00, 0x50, 0x70, 0xf0, 0x04, 0x06}) {
    std::memcpy(bad, b, kCmaHdrSize);
    bad[1] = v;
    EXPECT_FALSE(decode(bad, d)) << int{v};
  }
}

TEST(CmMad, ReqPrivateDataCarriesCmaHdr) {
  // rdma_connect on an IP id: cma_hdr first, then up to 56 bytes of user data.
  CmaHdr c;
  c.ip_version = 4;
  c.src_port = 0xc000;
  c.src_addr[12] = 10, c.dst_addr[12] = 10;
  Req r;
  encode(c, r.private_data);
  std::memset(r.private_data + kCmaHdrSize, 0x5a, kReqUserDataSize);
  uint8_t mad[kMadSize];
  encode(hdr(), r, mad);
  EXPECT_EQ(mad[24 + 140 + 1], 0x40);
  EXPECT_EQ(mad[24 + 140 + kCmaHdrSize], 0x5a);
  EXPECT_EQ(mad[kMadSize - 1], 0x5a);
  Req d;
  decode(mad, d);
  CmaHdr dc;
  ASSERT_TRUE(decode(d.private_data, dc));
  EXPECT_TRUE(dc == c);
  static_assert(kReqUserDataSize == 56 && kSidrReqUserDataSize == 180);
}

TEST(CmMad, ServiceId) {
  EXPECT_EQ(service_id(0x0106, 7174), 0x0000000001061c06u);
  EXPECT_EQ(service_id(kPsTcp, 7174), 0x0000000001061c06u);
  EXPECT_EQ(service_id(kPsUdp, 0xffff), 0x000000000111ffffu);
  EXPECT_EQ(service_id(kPsIb, 1), 0x00000000013f0001u);
  static_assert(service_id(kPsTcp, 0) == 0x01060000);
}

TEST(CmMad, TimeoutMs) {
  EXPECT_EQ(timeout_ms(16), 256u);
  EXPECT_EQ(timeout_ms(20), 4096u);
  EXPECT_EQ(timeout_ms(3), 1u);
  EXPECT_EQ(timeout_ms(0), 1u);
  EXPECT_EQ(timeout_ms(8), 1u);
  EXPECT_EQ(timeout_ms(9), 2u);
  EXPECT_EQ(timeout_ms(17), 512u);
  EXPECT_EQ(timeout_ms(24), 65536u);
  EXPECT_EQ(timeout_ms(31), 1u << 23);
  EXPECT_EQ(timeout_ms(255), 1u << 23);  // clamped, no overflow
}

TEST(CmMad, Constants) {
  EXPECT_EQ(kMadSize, 256u);
  EXPECT_EQ(kMadHdrSize, 24u);
  EXPECT_EQ(kQp1Qkey, 0x80010000u);
  MadHdr h;
  EXPECT_EQ(h.base_version, 1);
  EXPECT_EQ(h.mgmt_class, 0x07);
  EXPECT_EQ(h.class_version, 2);
  EXPECT_EQ(h.method, 0x03);
  Req r{};
  EXPECT_EQ(r.local_qpn, 0u);
  EXPECT_EQ(r.private_data[91], 0);
  EXPECT_EQ(r.primary.local_lid, 0xffff);
  EXPECT_EQ(r.primary.hop_limit, 64);
}
