// ICRC against golden vectors made by independent code (scapy for IPv4, a
// zlib-based derivation for IPv6): tests/golden/README.md.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "dataplane/wire/codec.h"
#include "dataplane/wire/icrc.h"

using namespace urnic::wire;

namespace {

struct Vector {
  std::string name;
  int ipver;
  bool valid;
  std::vector<uint8_t> frame;
};

std::vector<Vector> load() {
  std::ifstream in(URNIC_SOURCE_DIR "/tests/golden/icrc_vectors.txt");
  std::vector<Vector> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    Vector v;
    std::string hex;
    int valid;
    ls >> v.name >> v.ipver >> valid >> hex;
    v.valid = valid;
    for (size_t i = 0; i + 1 < hex.size(); i += 2)
      v.frame.push_back(
          static_cast<uint8_t>(std::stoi(hex.substr(i, 2), nullptr, 16)));
    out.push_back(std::move(v));
  }
  return out;
}

}  // namespace

TEST(Icrc, GoldenVectors) {
  const auto vectors = load();
  ASSERT_GE(vectors.size(), 150u);
  int v4 = 0, v6 = 0, bad = 0;
  for (const Vector& v : vectors) {
    SCOPED_TRACE(v.name);
    FrameInfo fi;
    decode(v.frame.data(), static_cast<uint32_t>(v.frame.size()), fi);
    if (v.valid) {
      ASSERT_EQ(fi.kind, FrameKind::kRoce) << malformed_name(fi.why);
      EXPECT_EQ(fi.roce.ipv6, v.ipver == 6);
      (v.ipver == 6 ? v6 : v4)++;
    } else {
      // A corrupted IP source makes it fail the IPv4 header checksum first.
      ASSERT_EQ(fi.kind, FrameKind::kMalformed);
      EXPECT_TRUE(fi.why == Malformed::kBadIcrc ||
                  fi.why == Malformed::kIpChecksum)
          << malformed_name(fi.why);
      ++bad;
    }
  }
  EXPECT_GE(v4, 80);
  EXPECT_GE(v6, 50);
  EXPECT_GE(bad, 10);
}

// The same frames split into many pieces (an mbuf chain) verify the same.
TEST(Icrc, ChainedSegments) {
  for (const Vector& v : load()) {
    if (!v.valid) continue;
    SCOPED_TRACE(v.name);
    const uint32_t len = static_cast<uint32_t>(v.frame.size());
    const uint32_t head = std::min<uint32_t>(len, 128);  // headers intact
    std::vector<ConstBuf> segs{{v.frame.data(), head}};
    for (uint32_t off = head, k = 1; off < len; off += k, k = k % 7 + 1)
      segs.push_back({v.frame.data() + off, std::min(k, len - off)});
    FrameInfo fi;
    decode(segs, len, fi);
    EXPECT_EQ(fi.kind, FrameKind::kRoce) << malformed_name(fi.why);
  }
}

// Headers and a tail in one CRC call (a small payload) give what chaining
// them gives, on both sides of kInlineTail, with and without a pad.
TEST(Icrc, InlineTailMatchesChained) {
  std::vector<uint8_t> pkt(60 + 8 + 12 + 28 + 600);
  for (size_t i = 0; i < pkt.size(); ++i)
    pkt[i] = static_cast<uint8_t>(i * 131 + 7);
  for (const bool ipv6 : {false, true}) {
    const uint32_t ip_len = ipv6 ? 40 : 20;
    for (const uint32_t ext : {0u, 16u, 28u}) {
      const uint8_t* tail = pkt.data() + ip_len + 8 + 12 + ext;
      for (uint32_t n = 0; n <= Icrc::kInlineTail + 44; n += (n < 8 ? 1 : 13)) {
        for (uint32_t zeros = 0; zeros < 4; ++zeros) {
          SCOPED_TRACE(testing::Message()
                       << "ipv6 " << ipv6 << " ext " << ext << " tail " << n
                       << " zeros " << zeros);
          Icrc chained;
          chained.begin(pkt.data(), ip_len, ipv6, ext);
          chained.update(tail, n);
          const uint8_t z[3] = {};
          chained.update(z, zeros);
          Icrc inlined;
          inlined.begin(pkt.data(), ip_len, ipv6, ext, n ? tail : nullptr, n,
                        zeros);
          EXPECT_EQ(inlined.value(), chained.value());
        }
      }
    }
  }
}

TEST(Icrc, Crc32IsIeee) {
  const uint8_t msg[] = "123456789";
  EXPECT_EQ(crc32(0, msg, 9), 0xcbf43926u);  // the CRC-32 check value
  EXPECT_EQ(crc32(crc32(0, msg, 4), msg + 4, 5), 0xcbf43926u);
}

// Masked in place (one CRC call) gives what the copied headers chained with
// the payload give, for IPv4 with and without options and IPv6, and leaves
// every byte, the 8 before the IP header included, as it was.
TEST(Icrc, InPlaceMatchesChained) {
  for (const uint32_t ip_len : {20u, 24u, 60u, 40u}) {
    const bool ipv6 = ip_len == 40;
    for (const uint32_t ext : {0u, 16u, 28u}) {
      for (const uint32_t n : {0u, 1u, 257u, 1024u, 4096u}) {
        SCOPED_TRACE(testing::Message()
                     << "ip " << ip_len << " ext " << ext << " payload " << n);
        std::vector<uint8_t> buf(14 + ip_len + 8 + 12 + ext + n);
        for (size_t i = 0; i < buf.size(); ++i)
          buf[i] = static_cast<uint8_t>(i * 29 + 3);
        const std::vector<uint8_t> before = buf;
        uint8_t* l3 = buf.data() + 14;
        const uint32_t hdrs = ip_len + 8 + 12 + ext;
        Icrc chained;
        chained.begin(l3, ip_len, ipv6, ext);
        chained.update(l3 + hdrs, n);
        Icrc in_place;
        in_place.in_place(l3, ip_len, ipv6, hdrs + n);
        EXPECT_EQ(in_place.value(), chained.value());
        EXPECT_EQ(buf, before);
      }
    }
  }
}

// decode() given the frame as writable checks the same ICRCs (the large
// payloads through Icrc::in_place) and gives the frame back unchanged.
TEST(Icrc, GoldenVectorsWritable) {
  int large = 0;
  for (const Vector& v : load()) {
    SCOPED_TRACE(v.name);
    std::vector<uint8_t> frame = v.frame;
    const uint32_t len = static_cast<uint32_t>(frame.size());
    FrameInfo ro, rw;
    decode(v.frame.data(), len, ro);
    const ConstBuf seg{frame.data(), len};
    decode({&seg, 1}, len, rw, false, frame.data());
    EXPECT_EQ(rw.kind, ro.kind);
    EXPECT_EQ(rw.why, ro.why);
    EXPECT_EQ(frame, v.frame);
    if (ro.kind == FrameKind::kRoce && rw.roce.payload_len > Icrc::kInlineTail)
      ++large;
  }
  EXPECT_GE(large, 5);  // vectors large enough for the in-place path
}

// And that path is the one taken: a large packet handed over as writable
// but held in read-only memory faults in decode(), where a small one (its
// headers copied, the payload behind them) decodes from the same memory.
TEST(IcrcDeathTest, LargePacketIsSummedInPlace) {
  const Vector* big = nullptr;
  const Vector* small = nullptr;
  const std::vector<Vector> vectors = load();
  for (const Vector& v : vectors) {
    FrameInfo fi;
    decode(v.frame.data(), static_cast<uint32_t>(v.frame.size()), fi);
    if (fi.kind != FrameKind::kRoce) continue;
    if (!big && fi.roce.payload_len > Icrc::kInlineTail) big = &v;
    if (!small && fi.roce.payload_len <= 64) small = &v;
  }
  ASSERT_TRUE(big && small);
  auto read_only = [](const std::vector<uint8_t>& f) {
    void* p = mmap(nullptr, f.size(), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(p, MAP_FAILED);
    std::memcpy(p, f.data(), f.size());
    EXPECT_EQ(mprotect(p, f.size(), PROT_READ), 0);
    return static_cast<uint8_t*>(p);
  };
  auto decode_writable = [](uint8_t* p, size_t n) {
    const ConstBuf seg{p, static_cast<uint32_t>(n)};
    FrameInfo fi;
    decode({&seg, 1}, seg.len, fi, false, p);
    return fi.kind;
  };
  uint8_t* s = read_only(small->frame);
  EXPECT_EQ(decode_writable(s, small->frame.size()), FrameKind::kRoce);
  uint8_t* b = read_only(big->frame);
  EXPECT_DEATH(decode_writable(b, big->frame.size()), "");
  munmap(s, small->frame.size());
  munmap(b, big->frame.size());
}
