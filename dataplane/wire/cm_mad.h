// IBTA Communication Management MADs (vol. 1 ch. 12) as Linux sends them on
// RoCEv2 QP1, and the RDMA CM header in their private data: encode/decode on
// plain 256-byte buffers, no DPDK. Facts: verbs-shim/RDMACM-NOTES.md §3.
#pragma once

#include <cstddef>
#include <cstdint>

namespace urnic::wire::cm {

constexpr uint32_t kMadSize = 256;  // every CM MAD is 256 bytes
constexpr uint32_t kMadHdrSize = 24;
constexpr uint32_t kMsgSize = kMadSize - kMadHdrSize;  // 232
constexpr uint32_t kQp1Qkey = 0x80010000;              // GSI Q_Key
constexpr uint8_t kBaseVersion = 1, kMgmtClassCm = 0x07, kClassVersion = 2,
                  kMethodSend = 0x03;

// Attribute IDs (ib_cm.h). LAP/APR (0x19/0x1A) are not handled.
enum class Attr : uint16_t {
  kReq = 0x10,
  kMra = 0x11,
  kRej = 0x12,
  kRep = 0x13,
  kRtu = 0x14,
  kDreq = 0x15,
  kDrep = 0x16,
  kSidrReq = 0x17,
  kSidrRep = 0x18
};

// The common MAD header (ch. 13 MAD base format; Linux struct ib_mad_hdr,
// cm_format_mad_hdr). tid: high 32 bits the sender's MAD agent, low 32 its
// local comm ID. attr_mod carries the ECE options in REQ/REP/SIDR_REP, else 0.
struct MadHdr {
  uint8_t base_version = kBaseVersion, mgmt_class = kMgmtClassCm,
          class_version = kClassVersion, method = kMethodSend;
  uint16_t status = 0;
  uint16_t class_specific = 0;
  uint64_t tid = 0;
  uint16_t attr_id = 0;
  uint32_t attr_mod = 0;
  bool operator==(const MadHdr&) const = default;
};

// Why decode_hdr refused a MAD (Linux drops all of these silently).
// GCC's -Wshadow flags scoped enumerators named like the constants above,
// though DecodeError::kBaseVersion cannot hide kBaseVersion.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow"
enum class DecodeError : uint8_t {
  kOk,
  kShort,         // fewer than kMadSize bytes
  kBaseVersion,   // not 1
  kClass,         // not the CM class 0x07
  kClassVersion,  // not 2 (Linux's CM agent registers version 2 only)
  kMethod,        // not SEND
  kUnknownAttr,   // not one of Attr (includes LAP, APR, ClassPortInfo)
  kCount
};
#pragma GCC diagnostic pop
const char* decode_error_name(DecodeError);

// Reads the 24-byte header of a MAD of `len` bytes and checks base version 1,
// class 0x07, class version 2, method SEND, attr one of Attr, len >=
// kMadSize. Nothing is read, and `out` is left alone, when len < kMadSize.
DecodeError decode_hdr(const uint8_t* p, size_t len, MadHdr& out);
void encode_hdr(const MadHdr& h, uint8_t* p);  // writes 24 bytes

// Private data sizes (ib_cm.h ib_cm_data_size).
constexpr size_t kReqPrivateDataSize = 92, kMraPrivateDataSize = 222,
                 kRejPrivateDataSize = 148, kRejAriSize = 72,
                 kRepPrivateDataSize = 196, kRtuPrivateDataSize = 224,
                 kDreqPrivateDataSize = 220, kDrepPrivateDataSize = 224,
                 kSidrReqPrivateDataSize = 216, kSidrRepInfoSize = 72,
                 kSidrRepPrivateDataSize = 136;

// The primary (or alternate) path fields of a REQ (Table 106, bytes 52..95
// after the header; the alternate path at 96..139). On RoCE with hop limit >
// 1 Linux sends both LIDs as 0xFFFF and ignores them on receipt.
struct Path {
  uint16_t local_lid = 0xffff, remote_lid = 0xffff;
  uint8_t local_gid[16]{}, remote_gid[16]{};
  uint32_t flow_label = 0;  // 20 bits
  uint8_t packet_rate = 0;  // 6 bits
  uint8_t traffic_class = 0, hop_limit = 64;
  uint8_t sl = 0;  // 4 bits
  bool subnet_local = false;
  uint8_t local_ack_timeout = 0;  // 5 bits
  bool operator==(const Path&) const = default;
};

// REQ (Table 106).
struct Req {
  uint32_t local_comm_id = 0;
  uint32_t ece_vendor_id = 0;  // 24 bits
  uint64_t service_id = 0;
  uint64_t local_ca_guid = 0;  // raw value, written big-endian
  uint32_t local_qkey = 0;
  uint32_t local_qpn = 0;  // 24
  uint8_t responder_resources = 0;
  uint32_t local_eecn = 0;  // 24
  uint8_t initiator_depth = 0;
  uint32_t remote_eecn = 0;                // 24
  uint8_t remote_cm_response_timeout = 0;  // 5
  uint8_t transport_type = 0;              // 2: 0 RC, 1 UC, 3 XRC
  bool flow_control = false;
  uint32_t starting_psn = 0;              // 24
  uint8_t local_cm_response_timeout = 0;  // 5
  uint8_t retry_count = 0;                // 3
  uint16_t pkey = 0;
  uint8_t path_mtu = 0;  // 4, IB enum 1..5
  bool rdc_exists = false;
  uint8_t rnr_retry_count = 0;  // 3
  uint8_t max_cm_retries = 0;   // 4
  bool srq = false;
  uint8_t extended_transport = 0;  // 3
  Path primary;
  // Decoded as Linux does (cm_req_has_alt_path): an alternate path is
  // present iff its local LID is non-zero. Without one, `alternate` is
  // encoded as zeros and decoded as Path{}.
  bool has_alternate = false;
  Path alternate;
  bool sap_supported = false;  // byte 139 [5:1]
  uint8_t private_data[kReqPrivateDataSize]{};
  bool operator==(const Req&) const = default;
};

// MRA (Table 107).
struct Mra {
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  uint8_t message_mraed = 0;    // 2: 0 REQ, 1 REP, 2 other (LAP)
  uint8_t service_timeout = 0;  // 5
  uint8_t private_data[kMraPrivateDataSize]{};
  bool operator==(const Mra&) const = default;
};

// REJ (Table 108). reason: RejReason below.
struct Rej {
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  uint8_t message_rejected = 0;  // 2: 0 REQ, 1 REP, 2 other
  uint8_t ari_length = 0;        // 7
  uint16_t reason = 0;
  uint8_t ari[kRejAriSize]{};
  uint8_t private_data[kRejPrivateDataSize]{};
  bool operator==(const Rej&) const = default;
};

// REP (Table 110).
struct Rep {
  uint32_t local_comm_id = 0, remote_comm_id = 0, local_qkey = 0,
           local_qpn = 0 /*24*/, local_eecn = 0 /*24*/, starting_psn = 0 /*24*/;
  uint32_t ece_vendor_id = 0;  // 24: high byte at 15, mid at 19, low at 23
  uint8_t responder_resources = 0, initiator_depth = 0,
          target_ack_delay = 0 /*5*/, failover = 0 /*2*/;
  bool flow_control = false;
  uint8_t rnr_retry_count = 0;  // 3
  bool srq = false;
  uint64_t local_ca_guid = 0;
  uint8_t private_data[kRepPrivateDataSize]{};
  bool operator==(const Rep&) const = default;
};

// RTU (Table 111).
struct Rtu {
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  uint8_t private_data[kRtuPrivateDataSize]{};
  bool operator==(const Rtu&) const = default;
};

// DREQ (Table 112). Linux drops a DREQ whose remote_qpn is not its QP.
struct Dreq {
  uint32_t local_comm_id = 0, remote_comm_id = 0, remote_qpn = 0 /*24*/;
  uint8_t private_data[kDreqPrivateDataSize]{};
  bool operator==(const Dreq&) const = default;
};

// DREP (Table 113).
struct Drep {
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  uint8_t private_data[kDrepPrivateDataSize]{};
  bool operator==(const Drep&) const = default;
};

// SIDR_REQ (Table 119).
struct SidrReq {
  uint32_t request_id = 0;
  uint16_t pkey = 0;
  uint64_t service_id = 0;
  uint8_t private_data[kSidrReqPrivateDataSize]{};
  bool operator==(const SidrReq&) const = default;
};

// SIDR_REP (Table 120). status: SidrStatus below.
struct SidrRep {
  uint32_t request_id = 0;
  uint8_t status = 0;
  uint8_t add_info_length = 0;
  uint32_t vendor_id = 0;  // 24: high 16 bits at 6..7, low 8 at 11
  uint32_t qpn = 0;        // 24
  uint64_t service_id = 0;
  uint32_t qkey = 0;
  uint8_t add_info[kSidrRepInfoSize]{};
  uint8_t private_data[kSidrRepPrivateDataSize]{};
  bool operator==(const SidrRep&) const = default;
};

// REJ reasons (ib_cm.h ib_cm_rej_reason).
enum class RejReason : uint16_t {
  kNoQp = 1,
  kNoEec = 2,
  kNoResources = 3,
  kTimeout = 4,
  kUnsupported = 5,
  kInvalidCommId = 6,
  kInvalidCommInstance = 7,
  kInvalidServiceId = 8,  // no listener for the service ID
  kInvalidTransportType = 9,
  kStaleConn = 10,  // (remote QPN, CA GUID) still in timewait
  kRdcNotExist = 11,
  kInvalidGid = 12,
  kInvalidLid = 13,
  kInvalidSl = 14,
  kInvalidTrafficClass = 15,
  kInvalidHopLimit = 16,
  kInvalidPacketRate = 17,
  kInvalidAltGid = 18,
  kInvalidAltLid = 19,
  kInvalidAltSl = 20,
  kInvalidAltTrafficClass = 21,
  kInvalidAltHopLimit = 22,
  kInvalidAltPacketRate = 23,
  kPortCmRedirect = 24,
  kPortRedirect = 25,
  kInvalidMtu = 26,
  kInsufficientRespResources = 27,
  kConsumerDefined = 28,  // rdma_reject, listener-side refusals
  kInvalidRnrRetry = 29,
  kDuplicateLocalCommId = 30,
  kInvalidClassVersion = 31,
  kInvalidFlowLabel = 32,
  kInvalidAltFlowLabel = 33,
  kVendorOptionNotSupported = 35,
};

// SIDR_REP status (ib_cm.h ib_cm_sidr_status).
enum class SidrStatus : uint8_t {
  kSuccess = 0,
  kUnsupported = 1,  // no listener
  kReject = 2,
  kNoQp = 3,
  kRedirect = 4,
  kUnsupportedVersion = 5,
};

// encode: writes the whole 256-byte MAD: the header `h` with attr_id set from
// the message type, then the message, zero padding. Values are masked to
// their field widths. decode: reads the message part of a MAD whose header
// decode_hdr accepted (any 256 bytes are safe to pass).
void encode(const MadHdr& h, const Req& m, uint8_t out[kMadSize]);
void encode(const MadHdr& h, const Mra& m, uint8_t out[kMadSize]);
void encode(const MadHdr& h, const Rej& m, uint8_t out[kMadSize]);
void encode(const MadHdr& h, const Rep& m, uint8_t out[kMadSize]);
void encode(const MadHdr& h, const Rtu& m, uint8_t out[kMadSize]);
void encode(const MadHdr& h, const Dreq& m, uint8_t out[kMadSize]);
void encode(const MadHdr& h, const Drep& m, uint8_t out[kMadSize]);
void encode(const MadHdr& h, const SidrReq& m, uint8_t out[kMadSize]);
void encode(const MadHdr& h, const SidrRep& m, uint8_t out[kMadSize]);
void decode(const uint8_t mad[kMadSize], Req& out);
void decode(const uint8_t mad[kMadSize], Mra& out);
void decode(const uint8_t mad[kMadSize], Rej& out);
void decode(const uint8_t mad[kMadSize], Rep& out);
void decode(const uint8_t mad[kMadSize], Rtu& out);
void decode(const uint8_t mad[kMadSize], Dreq& out);
void decode(const uint8_t mad[kMadSize], Drep& out);
void decode(const uint8_t mad[kMadSize], SidrReq& out);
void decode(const uint8_t mad[kMadSize], SidrRep& out);

// The RDMA CM header that opens the private data of a REQ / SIDR_REQ for IP
// ids (Linux cma.c cma_hdr, 36 bytes); user data follows it, so at most 56
// bytes fit in a REQ and 180 in a SIDR_REQ.
struct CmaHdr {
  uint8_t cma_version = 0;
  uint8_t ip_version = 0;  // 4 or 6, stored in the high nibble of byte 1
  uint16_t src_port = 0;   // the active side's source port
  uint8_t src_addr[16]{};  // IPv4: the address in the last 4 bytes, rest 0
  uint8_t dst_addr[16]{};
  bool operator==(const CmaHdr&) const = default;
};
constexpr size_t kCmaHdrSize = 36;
constexpr size_t kReqUserDataSize = kReqPrivateDataSize - kCmaHdrSize;  // 56
constexpr size_t kSidrReqUserDataSize =
    kSidrReqPrivateDataSize - kCmaHdrSize;  // 180
// For IPv4, the first 12 bytes of each address are written (and decoded) as
// 0, as cma.c's union cma_ip_addr reads only the last 4.
void encode(const CmaHdr& h, uint8_t out[kCmaHdrSize]);
// False for cma_version != 0 or ip_version not 4/6.
bool decode(const uint8_t in[kCmaHdrSize], CmaHdr& out);

// RDMA CM port spaces (rdma_cma.h enum rdma_ucm_port_space).
constexpr uint16_t kPsIpoib = 0x0002, kPsIb = 0x013f, kPsTcp = 0x0106,
                   kPsUdp = 0x0111;
// The service ID of an RDMA CM port space (ps already carries the 0x01
// prefix, e.g. RDMA_PS_TCP=0x0106): ps << 16 | port (rdma_get_service_id).
constexpr uint64_t service_id(uint16_t ps, uint16_t port) {
  return uint64_t{ps} << 16 | port;
}

// IBTA 4.096 us * 2^t, as Linux cm_convert_to_ms approximates it:
// 2^max(t-8,0) ms. t is a 5-bit field; larger values count as 31.
uint32_t timeout_ms(uint8_t t);

}  // namespace urnic::wire::cm
