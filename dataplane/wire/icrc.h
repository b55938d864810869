// RoCEv2 Invariant CRC (IBTA Annex A17.3.3): CRC-32 over 8 bytes of 0xFF
// (the masked LRH), the IP/UDP/BTH headers with their variant fields set to
// ones, and the rest of the packet up to the ICRC. CRC-32 is ISA-L's
// crc32_gzip_refl, which chains: the header and each payload piece (mbuf
// segment, external buffer) are fed in turn without copying.
#pragma once

#include <cstddef>
#include <cstdint>

namespace urnic::wire {

class Icrc {
 public:
  // Starts the CRC with the masked headers. `l3` points at the IPv4 or IPv6
  // header, followed contiguously by the UDP header, the BTH and `ext_len`
  // bytes of extension headers (at most 28); `ip_hdr_len` includes IPv4
  // options. Headers go through one CRC call: ISA-L's fixed cost per call
  // dominates for small buffers.
  void begin(const uint8_t* l3, uint32_t ip_hdr_len, bool ipv6,
             uint32_t ext_len = 0) {
    begin(l3, ip_hdr_len, ipv6, ext_len, nullptr, 0, 0);
  }
  // The same, followed by `tail` (the payload, in one piece) and `zeros`
  // zero bytes (the pad): still one CRC call when they fit in
  // kInlineTail bytes, which costs less than the copy (ISA-L's fixed cost
  // per call was half the CRC time of a 64-byte packet), else chained.
  static constexpr uint32_t kInlineTail = 256;
  void begin(const uint8_t* l3, uint32_t ip_hdr_len, bool ipv6,
             uint32_t ext_len, const uint8_t* tail, uint32_t tail_len,
             uint32_t zeros);
  // The whole ICRC of a packet held contiguously in memory the caller owns
  // and may have written to: `l3` as above, `len` bytes from it up to the
  // ICRC, and 8 writable bytes before it (the Ethernet header's tail). For
  // one CRC call over it all (a larger payload than kInlineTail otherwise
  // takes a second), those 8 bytes and the variant fields are set to ones
  // for the call and restored after it: on return the bytes are as before.
  void in_place(uint8_t* l3, uint32_t ip_hdr_len, bool ipv6, uint32_t len);
  // Adds bytes that follow (extension headers, payload, pad).
  void update(const uint8_t* p, size_t n);
  // The ICRC value; on the wire it is stored least significant byte first.
  uint32_t value() const { return crc_; }

  static void store(uint8_t* p, uint32_t icrc) {
    for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(icrc >> (8 * i));
  }
  static uint32_t load(const uint8_t* p) {
    return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 |
           uint32_t{p[3]} << 24;
  }

 private:
  uint32_t crc_ = 0;
};

// Plain CRC-32 (IEEE, reflected) over a buffer, chained from `crc`.
uint32_t crc32(uint32_t crc, const uint8_t* p, size_t n);

}  // namespace urnic::wire
