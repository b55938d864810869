// CM MAD and cma_hdr encode/decode. Offsets in the message code are bytes
// after the 24-byte MAD header, as in the IBTA tables; bit fields use the
// tables' byte[bit:width] notation (bit 0 = the byte's MSB).
#include "dataplane/wire/cm_mad.h"

#include <algorithm>
#include <cstring>
#include <iterator>

#include "dataplane/wire/byteorder.h"

namespace urnic::wire::cm {

namespace {

constexpr const char* kDecodeErrorNames[] = {
    "ok",     "short",        "base_version", "class", "class_version",
    "method", "unknown_attr",
};
static_assert(std::size(kDecodeErrorNames) ==
              static_cast<size_t>(DecodeError::kCount));

// 24-bit fields are the top 24 bits of a big-endian 32-bit word: 3 bytes.
uint32_t load_be24(const uint8_t* p) {
  return uint32_t{p[0]} << 16 | uint32_t{p[1]} << 8 | p[2];
}
void store_be24(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v >> 16);
  p[1] = static_cast<uint8_t>(v >> 8);
  p[2] = static_cast<uint8_t>(v);
}
uint64_t load_be64(const uint8_t* p) {
  return uint64_t{load_be32(p)} << 32 | load_be32(p + 4);
}
void store_be64(uint8_t* p, uint64_t v) {
  store_be32(p, static_cast<uint32_t>(v >> 32));
  store_be32(p + 4, static_cast<uint32_t>(v));
}

// byte[bit:width]: `width` bits starting `bit` bits below the MSB. put_bits
// ORs into a zeroed buffer.
constexpr uint8_t field_mask(unsigned width) {
  return static_cast<uint8_t>((1u << width) - 1);
}
void put_bits(uint8_t* byte, unsigned bit, unsigned width, uint32_t v) {
  *byte |= static_cast<uint8_t>((v & field_mask(width)) << (8 - bit - width));
}
uint8_t get_bits(const uint8_t* byte, unsigned bit, unsigned width) {
  return static_cast<uint8_t>((*byte >> (8 - bit - width)) & field_mask(width));
}

bool known_attr(uint16_t a) {
  return a >= static_cast<uint16_t>(Attr::kReq) &&
         a <= static_cast<uint16_t>(Attr::kSidrRep);
}

// Zeroes the MAD, writes the header with attr_id = a, returns the message.
uint8_t* begin(const MadHdr& h, Attr a, uint8_t* out) {
  std::memset(out, 0, kMadSize);
  MadHdr hdr = h;
  hdr.attr_id = static_cast<uint16_t>(a);
  encode_hdr(hdr, out);
  return out + kMadHdrSize;
}

template <size_t N>
void put_mem(uint8_t* dst, const uint8_t (&src)[N]) {
  std::memcpy(dst, src, N);
}
template <size_t N>
void get_mem(uint8_t (&dst)[N], const uint8_t* src) {
  std::memcpy(dst, src, N);
}

// Table 106, the path block: primary at 52, alternate at 96 (44 bytes).
constexpr size_t kPrimaryPath = 52, kAlternatePath = 96, kPathSize = 44;

void put_path(uint8_t* p, const Path& x) {
  store_be16(p + 0, x.local_lid);
  store_be16(p + 2, x.remote_lid);
  std::memcpy(p + 4, x.local_gid, 16);
  std::memcpy(p + 20, x.remote_gid, 16);
  // Word at 36: flow label in the top 20 bits, packet rate in byte 39 [2:6].
  store_be32(p + 36, (x.flow_label & 0xfffff) << 12);
  put_bits(p + 39, 2, 6, x.packet_rate);
  p[40] = x.traffic_class;
  p[41] = x.hop_limit;
  put_bits(p + 42, 0, 4, x.sl);
  put_bits(p + 42, 4, 1, x.subnet_local);
  put_bits(p + 43, 0, 5, x.local_ack_timeout);
}

void get_path(const uint8_t* p, Path& x) {
  x.local_lid = load_be16(p + 0);
  x.remote_lid = load_be16(p + 2);
  std::memcpy(x.local_gid, p + 4, 16);
  std::memcpy(x.remote_gid, p + 20, 16);
  x.flow_label = load_be32(p + 36) >> 12;
  x.packet_rate = get_bits(p + 39, 2, 6);
  x.traffic_class = p[40];
  x.hop_limit = p[41];
  x.sl = get_bits(p + 42, 0, 4);
  x.subnet_local = get_bits(p + 42, 4, 1);
  x.local_ack_timeout = get_bits(p + 43, 0, 5);
}

// cma_hdr (cma.c): version 0, IP version in the high nibble of byte 1, port
// at 2, source address at 4, destination at 20.
void put_cma_addr(uint8_t* p, const uint8_t (&a)[16], bool v4) {
  if (v4)
    std::memcpy(p + 12, a + 12, 4);
  else
    std::memcpy(p, a, 16);
}
void get_cma_addr(uint8_t (&a)[16], const uint8_t* p, bool v4) {
  std::memset(a, 0, 16);
  if (v4)
    std::memcpy(a + 12, p + 12, 4);
  else
    std::memcpy(a, p, 16);
}

}  // namespace

const char* decode_error_name(DecodeError e) {
  const auto i = static_cast<size_t>(e);
  return i < std::size(kDecodeErrorNames) ? kDecodeErrorNames[i] : "?";
}

// MAD header: 0 base version, 1 class, 2 class version, 3 method, 4 status,
// 6 class specific, 8 TID, 16 attribute ID, 18 reserved, 20 attribute mod.
DecodeError decode_hdr(const uint8_t* p, size_t len, MadHdr& out) {
  if (len < kMadSize) return DecodeError::kShort;
  out.base_version = p[0];
  out.mgmt_class = p[1];
  out.class_version = p[2];
  out.method = p[3];
  out.status = load_be16(p + 4);
  out.class_specific = load_be16(p + 6);
  out.tid = load_be64(p + 8);
  out.attr_id = load_be16(p + 16);
  out.attr_mod = load_be32(p + 20);
  if (out.base_version != kBaseVersion) return DecodeError::kBaseVersion;
  if (out.mgmt_class != kMgmtClassCm) return DecodeError::kClass;
  if (out.class_version != kClassVersion) return DecodeError::kClassVersion;
  if (out.method != kMethodSend) return DecodeError::kMethod;
  if (!known_attr(out.attr_id)) return DecodeError::kUnknownAttr;
  return DecodeError::kOk;
}

void encode_hdr(const MadHdr& h, uint8_t* p) {
  p[0] = h.base_version;
  p[1] = h.mgmt_class;
  p[2] = h.class_version;
  p[3] = h.method;
  store_be16(p + 4, h.status);
  store_be16(p + 6, h.class_specific);
  store_be64(p + 8, h.tid);
  store_be16(p + 16, h.attr_id);
  store_be16(p + 18, 0);
  store_be32(p + 20, h.attr_mod);
}

// Table 106 REQ.
void encode(const MadHdr& h, const Req& m, uint8_t out[kMadSize]) {
  uint8_t* p = begin(h, Attr::kReq, out);
  store_be32(p + 0, m.local_comm_id);
  store_be24(p + 5, m.ece_vendor_id);
  store_be64(p + 8, m.service_id);
  store_be64(p + 16, m.local_ca_guid);
  store_be32(p + 28, m.local_qkey);
  store_be24(p + 32, m.local_qpn);
  p[35] = m.responder_resources;
  store_be24(p + 36, m.local_eecn);
  p[39] = m.initiator_depth;
  store_be24(p + 40, m.remote_eecn);
  put_bits(p + 43, 0, 5, m.remote_cm_response_timeout);
  put_bits(p + 43, 5, 2, m.transport_type);
  put_bits(p + 43, 7, 1, m.flow_control);
  store_be24(p + 44, m.starting_psn);
  put_bits(p + 47, 0, 5, m.local_cm_response_timeout);
  put_bits(p + 47, 5, 3, m.retry_count);
  store_be16(p + 48, m.pkey);
  put_bits(p + 50, 0, 4, m.path_mtu);
  put_bits(p + 50, 4, 1, m.rdc_exists);
  put_bits(p + 50, 5, 3, m.rnr_retry_count);
  put_bits(p + 51, 0, 4, m.max_cm_retries);
  put_bits(p + 51, 4, 1, m.srq);
  put_bits(p + 51, 5, 3, m.extended_transport);
  put_path(p + kPrimaryPath, m.primary);
  if (m.has_alternate) put_path(p + kAlternatePath, m.alternate);
  put_bits(p + 139, 5, 1, m.sap_supported);
  put_mem(p + 140, m.private_data);
}

void decode(const uint8_t mad[kMadSize], Req& m) {
  const uint8_t* p = mad + kMadHdrSize;
  m.local_comm_id = load_be32(p + 0);
  m.ece_vendor_id = load_be24(p + 5);
  m.service_id = load_be64(p + 8);
  m.local_ca_guid = load_be64(p + 16);
  m.local_qkey = load_be32(p + 28);
  m.local_qpn = load_be24(p + 32);
  m.responder_resources = p[35];
  m.local_eecn = load_be24(p + 36);
  m.initiator_depth = p[39];
  m.remote_eecn = load_be24(p + 40);
  m.remote_cm_response_timeout = get_bits(p + 43, 0, 5);
  m.transport_type = get_bits(p + 43, 5, 2);
  m.flow_control = get_bits(p + 43, 7, 1);
  m.starting_psn = load_be24(p + 44);
  m.local_cm_response_timeout = get_bits(p + 47, 0, 5);
  m.retry_count = get_bits(p + 47, 5, 3);
  m.pkey = load_be16(p + 48);
  m.path_mtu = get_bits(p + 50, 0, 4);
  m.rdc_exists = get_bits(p + 50, 4, 1);
  m.rnr_retry_count = get_bits(p + 50, 5, 3);
  m.max_cm_retries = get_bits(p + 51, 0, 4);
  m.srq = get_bits(p + 51, 4, 1);
  m.extended_transport = get_bits(p + 51, 5, 3);
  get_path(p + kPrimaryPath, m.primary);
  // cm_req_has_alt_path: the alternate local LID (at 96) is non-zero.
  m.has_alternate = load_be16(p + kAlternatePath) != 0;
  m.alternate = Path{};
  if (m.has_alternate) get_path(p + kAlternatePath, m.alternate);
  m.sap_supported = get_bits(p + 139, 5, 1);
  get_mem(m.private_data, p + 140);
}
static_assert(kAlternatePath + kPathSize == 140 &&
              140 + kReqPrivateDataSize == kMsgSize);

// Table 107 MRA.
void encode(const MadHdr& h, const Mra& m, uint8_t out[kMadSize]) {
  uint8_t* p = begin(h, Attr::kMra, out);
  store_be32(p + 0, m.local_comm_id);
  store_be32(p + 4, m.remote_comm_id);
  put_bits(p + 8, 0, 2, m.message_mraed);
  put_bits(p + 9, 0, 5, m.service_timeout);
  put_mem(p + 10, m.private_data);
}

void decode(const uint8_t mad[kMadSize], Mra& m) {
  const uint8_t* p = mad + kMadHdrSize;
  m.local_comm_id = load_be32(p + 0);
  m.remote_comm_id = load_be32(p + 4);
  m.message_mraed = get_bits(p + 8, 0, 2);
  m.service_timeout = get_bits(p + 9, 0, 5);
  get_mem(m.private_data, p + 10);
}
static_assert(10 + kMraPrivateDataSize == kMsgSize);

// Table 108 REJ.
void encode(const MadHdr& h, const Rej& m, uint8_t out[kMadSize]) {
  uint8_t* p = begin(h, Attr::kRej, out);
  store_be32(p + 0, m.local_comm_id);
  store_be32(p + 4, m.remote_comm_id);
  put_bits(p + 8, 0, 2, m.message_rejected);
  put_bits(p + 9, 0, 7, m.ari_length);
  store_be16(p + 10, m.reason);
  put_mem(p + 12, m.ari);
  put_mem(p + 84, m.private_data);
}

void decode(const uint8_t mad[kMadSize], Rej& m) {
  const uint8_t* p = mad + kMadHdrSize;
  m.local_comm_id = load_be32(p + 0);
  m.remote_comm_id = load_be32(p + 4);
  m.message_rejected = get_bits(p + 8, 0, 2);
  m.ari_length = get_bits(p + 9, 0, 7);
  m.reason = load_be16(p + 10);
  get_mem(m.ari, p + 12);
  get_mem(m.private_data, p + 84);
}
static_assert(12 + kRejAriSize == 84 && 84 + kRejPrivateDataSize == kMsgSize);

// Table 110 REP. The ECE vendor ID sits in the low bytes of the three 24-bit
// words: high at 15, mid at 19, low at 23.
void encode(const MadHdr& h, const Rep& m, uint8_t out[kMadSize]) {
  uint8_t* p = begin(h, Attr::kRep, out);
  store_be32(p + 0, m.local_comm_id);
  store_be32(p + 4, m.remote_comm_id);
  store_be32(p + 8, m.local_qkey);
  store_be24(p + 12, m.local_qpn);
  p[15] = static_cast<uint8_t>(m.ece_vendor_id >> 16);
  store_be24(p + 16, m.local_eecn);
  p[19] = static_cast<uint8_t>(m.ece_vendor_id >> 8);
  store_be24(p + 20, m.starting_psn);
  p[23] = static_cast<uint8_t>(m.ece_vendor_id);
  p[24] = m.responder_resources;
  p[25] = m.initiator_depth;
  put_bits(p + 26, 0, 5, m.target_ack_delay);
  put_bits(p + 26, 5, 2, m.failover);
  put_bits(p + 26, 7, 1, m.flow_control);
  put_bits(p + 27, 0, 3, m.rnr_retry_count);
  put_bits(p + 27, 3, 1, m.srq);
  store_be64(p + 28, m.local_ca_guid);
  put_mem(p + 36, m.private_data);
}

void decode(const uint8_t mad[kMadSize], Rep& m) {
  const uint8_t* p = mad + kMadHdrSize;
  m.local_comm_id = load_be32(p + 0);
  m.remote_comm_id = load_be32(p + 4);
  m.local_qkey = load_be32(p + 8);
  m.local_qpn = load_be24(p + 12);
  m.local_eecn = load_be24(p + 16);
  m.starting_psn = load_be24(p + 20);
  m.ece_vendor_id = uint32_t{p[15]} << 16 | uint32_t{p[19]} << 8 | p[23];
  m.responder_resources = p[24];
  m.initiator_depth = p[25];
  m.target_ack_delay = get_bits(p + 26, 0, 5);
  m.failover = get_bits(p + 26, 5, 2);
  m.flow_control = get_bits(p + 26, 7, 1);
  m.rnr_retry_count = get_bits(p + 27, 0, 3);
  m.srq = get_bits(p + 27, 3, 1);
  m.local_ca_guid = load_be64(p + 28);
  get_mem(m.private_data, p + 36);
}
static_assert(36 + kRepPrivateDataSize == kMsgSize);

// Table 111 RTU.
void encode(const MadHdr& h, const Rtu& m, uint8_t out[kMadSize]) {
  uint8_t* p = begin(h, Attr::kRtu, out);
  store_be32(p + 0, m.local_comm_id);
  store_be32(p + 4, m.remote_comm_id);
  put_mem(p + 8, m.private_data);
}

void decode(const uint8_t mad[kMadSize], Rtu& m) {
  const uint8_t* p = mad + kMadHdrSize;
  m.local_comm_id = load_be32(p + 0);
  m.remote_comm_id = load_be32(p + 4);
  get_mem(m.private_data, p + 8);
}
static_assert(8 + kRtuPrivateDataSize == kMsgSize);

// Table 112 DREQ.
void encode(const MadHdr& h, const Dreq& m, uint8_t out[kMadSize]) {
  uint8_t* p = begin(h, Attr::kDreq, out);
  store_be32(p + 0, m.local_comm_id);
  store_be32(p + 4, m.remote_comm_id);
  store_be24(p + 8, m.remote_qpn);
  put_mem(p + 12, m.private_data);
}

void decode(const uint8_t mad[kMadSize], Dreq& m) {
  const uint8_t* p = mad + kMadHdrSize;
  m.local_comm_id = load_be32(p + 0);
  m.remote_comm_id = load_be32(p + 4);
  m.remote_qpn = load_be24(p + 8);
  get_mem(m.private_data, p + 12);
}
static_assert(12 + kDreqPrivateDataSize == kMsgSize);

// Table 113 DREP.
void encode(const MadHdr& h, const Drep& m, uint8_t out[kMadSize]) {
  uint8_t* p = begin(h, Attr::kDrep, out);
  store_be32(p + 0, m.local_comm_id);
  store_be32(p + 4, m.remote_comm_id);
  put_mem(p + 8, m.private_data);
}

void decode(const uint8_t mad[kMadSize], Drep& m) {
  const uint8_t* p = mad + kMadHdrSize;
  m.local_comm_id = load_be32(p + 0);
  m.remote_comm_id = load_be32(p + 4);
  get_mem(m.private_data, p + 8);
}
static_assert(8 + kDrepPrivateDataSize == kMsgSize);

// Table 119 SIDR_REQ.
void encode(const MadHdr& h, const SidrReq& m, uint8_t out[kMadSize]) {
  uint8_t* p = begin(h, Attr::kSidrReq, out);
  store_be32(p + 0, m.request_id);
  store_be16(p + 4, m.pkey);
  store_be64(p + 8, m.service_id);
  put_mem(p + 16, m.private_data);
}

void decode(const uint8_t mad[kMadSize], SidrReq& m) {
  const uint8_t* p = mad + kMadHdrSize;
  m.request_id = load_be32(p + 0);
  m.pkey = load_be16(p + 4);
  m.service_id = load_be64(p + 8);
  get_mem(m.private_data, p + 16);
}
static_assert(16 + kSidrReqPrivateDataSize == kMsgSize);

// Table 120 SIDR_REP. Vendor ID: high 16 bits at 6..7, low 8 at 11 (the low
// byte of the QPN word). Note: Linux's cm_format_sidr_rep writes only bits
// 8..15 into the 16-bit high part, so its top byte arrives as 0.
void encode(const MadHdr& h, const SidrRep& m, uint8_t out[kMadSize]) {
  uint8_t* p = begin(h, Attr::kSidrRep, out);
  store_be32(p + 0, m.request_id);
  p[4] = m.status;
  p[5] = m.add_info_length;
  store_be16(p + 6, static_cast<uint16_t>((m.vendor_id & kMask24) >> 8));
  store_be24(p + 8, m.qpn);
  p[11] = static_cast<uint8_t>(m.vendor_id);
  store_be64(p + 12, m.service_id);
  store_be32(p + 20, m.qkey);
  put_mem(p + 24, m.add_info);
  put_mem(p + 96, m.private_data);
}

void decode(const uint8_t mad[kMadSize], SidrRep& m) {
  const uint8_t* p = mad + kMadHdrSize;
  m.request_id = load_be32(p + 0);
  m.status = p[4];
  m.add_info_length = p[5];
  m.vendor_id = uint32_t{load_be16(p + 6)} << 8 | p[11];
  m.qpn = load_be24(p + 8);
  m.service_id = load_be64(p + 12);
  m.qkey = load_be32(p + 20);
  get_mem(m.add_info, p + 24);
  get_mem(m.private_data, p + 96);
}
static_assert(24 + kSidrRepInfoSize == 96 &&
              96 + kSidrRepPrivateDataSize == kMsgSize);

void encode(const CmaHdr& h, uint8_t out[kCmaHdrSize]) {
  std::memset(out, 0, kCmaHdrSize);
  const bool v4 = h.ip_version == 4;
  out[0] = h.cma_version;
  out[1] = static_cast<uint8_t>(h.ip_version << 4);
  store_be16(out + 2, h.src_port);
  put_cma_addr(out + 4, h.src_addr, v4);
  put_cma_addr(out + 20, h.dst_addr, v4);
}

bool decode(const uint8_t in[kCmaHdrSize], CmaHdr& out) {
  const uint8_t ver = in[1] >> 4;
  if (in[0] != 0 || (ver != 4 && ver != 6)) return false;
  const bool v4 = ver == 4;
  out.cma_version = in[0];
  out.ip_version = ver;
  out.src_port = load_be16(in + 2);
  get_cma_addr(out.src_addr, in + 4, v4);
  get_cma_addr(out.dst_addr, in + 20, v4);
  return true;
}

uint32_t timeout_ms(uint8_t t) {
  const unsigned e = std::min<unsigned>(t, 31);
  return uint32_t{1} << (e > 8 ? e - 8 : 0);
}

}  // namespace urnic::wire::cm
