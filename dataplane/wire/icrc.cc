// ICRC masking rules: IBTA Annex A17.3.3 (RoCEv2), as also applied by Linux
// rxe. Masked: IPv4 TOS, TTL, header checksum; IPv6 traffic class, flow
// label, hop limit; UDP checksum; BTH FECN/BECN/Resv6a byte.
#include "dataplane/wire/icrc.h"

#include <isa-l/crc.h>

#include <cstring>

#include "dataplane/wire/headers.h"
#include "dataplane/wire/opcode.h"

namespace urnic::wire {

uint32_t crc32(uint32_t crc, const uint8_t* p, size_t n) {
  return crc32_gzip_refl(crc, p, n);
}

void Icrc::begin(const uint8_t* l3, uint32_t ip_hdr_len, bool ipv6,
                 uint32_t ext_len) {
  // 8 (LRH) + 60 (max IPv4 header; IPv6 is 40) + UDP + BTH + the largest
  // extension header set of the opcode table.
  uint8_t buf[8 + 60 + sizeof(UdpHdr) + sizeof(Bth) + kMaxExtLen];
  if (ext_len > kMaxExtLen) {  // not from the opcode table: chain it
    begin(l3, ip_hdr_len, ipv6, 0);
    update(l3 + ip_hdr_len + sizeof(UdpHdr) + sizeof(Bth), ext_len);
    return;
  }
  const uint32_t hdrs = ip_hdr_len + sizeof(UdpHdr) + sizeof(Bth) + ext_len;
  std::memset(buf, 0xff, 8);
  std::memcpy(buf + 8, l3, hdrs);
  uint8_t* ip = buf + 8;
  if (ipv6) {
    // Byte 0 keeps the version nibble; TC and flow label become all ones.
    ip[0] |= 0x0f;
    ip[1] = ip[2] = ip[3] = 0xff;
    ip[7] = 0xff;  // hop limit
  } else {
    ip[1] = 0xff;            // TOS (DSCP + ECN)
    ip[8] = 0xff;            // TTL
    ip[10] = ip[11] = 0xff;  // header checksum
  }
  uint8_t* udp = ip + ip_hdr_len;
  udp[6] = udp[7] = 0xff;  // UDP checksum
  uint8_t* bth = udp + sizeof(UdpHdr);
  bth[4] = 0xff;  // FECN, BECN, Resv6a
  crc_ = crc32(0, buf, 8 + hdrs);
}

void Icrc::update(const uint8_t* p, size_t n) {
  crc_ = crc32(crc_, p, n);
}

}  // namespace urnic::wire
