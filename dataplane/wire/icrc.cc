// ICRC masking rules: IBTA Annex A17.3.3 (RoCEv2), as also applied by Linux
// rxe. Masked: IPv4 TOS, TTL, header checksum; IPv6 traffic class, flow
// label, hop limit; UDP checksum; BTH FECN/BECN/Resv6a byte.
#include "dataplane/wire/icrc.h"

#include <isa-l/crc.h>

#include <algorithm>
#include <cstring>

#include "dataplane/wire/headers.h"
#include "dataplane/wire/opcode.h"

namespace urnic::wire {

uint32_t crc32(uint32_t crc, const uint8_t* p, size_t n) {
  return crc32_gzip_refl(crc, p, n);
}

namespace {

// Sets the variant fields of the IP, UDP and BTH headers at `ip` to ones
// (Annex A17.3.3).
void mask_variant(uint8_t* ip, uint32_t ip_hdr_len, bool ipv6) {
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
}

}  // namespace

void Icrc::in_place(uint8_t* l3, uint32_t ip_hdr_len, bool ipv6, uint32_t len) {
  // Everything written lies in these bytes: the 8 before l3 and the
  // headers through the BTH's fifth byte.
  uint8_t saved[8 + 60 + sizeof(UdpHdr) + 5];
  const uint32_t n = 8 + ip_hdr_len + sizeof(UdpHdr) + 5;
  uint8_t* start = l3 - 8;
  std::memcpy(saved, start, n);
  std::memset(start, 0xff, 8);
  mask_variant(l3, ip_hdr_len, ipv6);
  crc_ = crc32(0, start, 8 + size_t{len});
  std::memcpy(start, saved, n);
}

void Icrc::begin(const uint8_t* l3, uint32_t ip_hdr_len, bool ipv6,
                 uint32_t ext_len, const uint8_t* tail, uint32_t tail_len,
                 uint32_t zeros) {
  // 8 (LRH) + 60 (max IPv4 header; IPv6 is 40) + UDP + BTH + the largest
  // extension header set of the opcode table, then a small tail.
  uint8_t buf[8 + 60 + sizeof(UdpHdr) + sizeof(Bth) + kMaxExtLen + kInlineTail];
  if (ext_len > kMaxExtLen || uint64_t{tail_len} + zeros > kInlineTail) {
    // Chained: extension headers not from the opcode table, or a tail
    // whose copy would cost more than a second call.
    begin(l3, ip_hdr_len, ipv6, ext_len > kMaxExtLen ? 0 : ext_len);
    if (ext_len > kMaxExtLen)
      update(l3 + ip_hdr_len + sizeof(UdpHdr) + sizeof(Bth), ext_len);
    if (tail_len) update(tail, tail_len);
    static constexpr uint8_t kZeros[4] = {};
    for (uint32_t n; zeros; zeros -= n) {
      n = std::min<uint32_t>(zeros, sizeof kZeros);
      update(kZeros, n);
    }
    return;
  }
  const uint32_t hdrs = ip_hdr_len + sizeof(UdpHdr) + sizeof(Bth) + ext_len;
  std::memset(buf, 0xff, 8);
  std::memcpy(buf + 8, l3, hdrs);
  mask_variant(buf + 8, ip_hdr_len, ipv6);
  uint8_t* end = buf + 8 + hdrs;
  if (tail_len) std::memcpy(end, tail, tail_len);
  std::memset(end + tail_len, 0, zeros);
  crc_ = crc32(0, buf, 8 + hdrs + tail_len + zeros);
}

void Icrc::update(const uint8_t* p, size_t n) {
  crc_ = crc32(crc_, p, n);
}

}  // namespace urnic::wire
