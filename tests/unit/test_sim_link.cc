// The simulated link the transport tests will run over: deterministic per
// seed, impairments at the configured rates, corruption caught by the ICRC.
#include <gtest/gtest.h>

#include <vector>

#include "dataplane/transport/psn.h"
#include "dataplane/transport/sim_link.h"
#include "dataplane/wire/codec.h"

using namespace urnic;
using namespace urnic::transport;

namespace {

std::vector<uint8_t> roce_frame(uint32_t psn, uint8_t tclass = 0) {
  wire::RoceFields f;
  f.tclass = tclass;
  wire::gid_from_ipv4(0x0a000001, f.sgid);
  wire::gid_from_ipv4(0x0a000002, f.dgid);
  f.opcode = wire::opcode::kRcSendOnly;
  f.psn = psn;
  f.payload_len = 64;
  std::vector<uint8_t> pl(64, static_cast<uint8_t>(psn)), buf(256);
  buf.resize(wire::encode_frame(f, pl.data(), buf.data(), 256));
  return buf;
}

// Sends n frames over `link` one per µs, drains everything; returns PSNs in
// arrival order (-1 for frames that no longer decode).
std::vector<int64_t> run(SimLink& link, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i)
    link.send(0, roce_frame(psn_add(0xfffff0, i)), i * 1000ull);
  std::vector<std::vector<uint8_t>> got;
  link.receive(1, UINT64_MAX - 1, got);
  std::vector<int64_t> psns;
  for (auto& f : got) {
    wire::FrameInfo fi;
    wire::decode(f.data(), static_cast<uint32_t>(f.size()), fi);
    psns.push_back(fi.kind == wire::FrameKind::kRoce
                       ? static_cast<int64_t>(fi.roce.psn)
                       : int64_t{-1});
  }
  return psns;
}

}  // namespace

TEST(Psn, WrapAndWindow) {
  EXPECT_EQ(psn_add(0xffffff, 2), 1u);
  EXPECT_TRUE(psn_before(0xffffff, 0));
  EXPECT_TRUE(psn_after(3, 0xfffffd));
  EXPECT_EQ(psn_diff(0x7fffff, 0), 0x7fffff);
  EXPECT_EQ(psn_diff(0x800000, 0), -0x800000);  // the window's edge
}

TEST(SimLink, PerfectLinkKeepsOrderAndBytes) {
  SimLink link(SimLinkParams{});
  const auto psns = run(link, 1000);
  ASSERT_EQ(psns.size(), 1000u);
  for (uint32_t i = 0; i < 1000; ++i) EXPECT_EQ(psns[i], psn_add(0xfffff0, i));
}

TEST(SimLink, DelayIsRespected) {
  SimLinkParams p;
  p.delay_ns = 5000;
  SimLink link(p);
  link.send(1, roce_frame(1), 100);
  std::vector<std::vector<uint8_t>> got;
  EXPECT_EQ(link.receive(0, 5099, got), 0u);
  EXPECT_EQ(link.next_arrival(0), 5100u);
  EXPECT_EQ(link.receive(0, 5100, got), 1u);
  EXPECT_EQ(link.next_arrival(0), UINT64_MAX);
}

TEST(SimLink, SameSeedSameDeliveries) {
  SimLinkParams p;
  p.seed = 42;
  p.loss = 0.05;
  p.duplicate = 0.05;
  p.reorder = 0.05;
  p.corrupt = 0.05;
  p.jitter_ns = 3000;
  SimLink a(p), b(p);
  const auto first = run(a, 5000);
  EXPECT_EQ(first, run(b, 5000));
  p.seed = 43;
  SimLink c(p);
  EXPECT_NE(first, run(c, 5000));
}

TEST(SimLink, ImpairmentsHappenAtTheirRates) {
  SimLinkParams p;
  p.seed = 7;
  p.loss = 0.10;
  p.duplicate = 0.02;
  p.reorder = 0.05;
  p.corrupt = 0.03;
  SimLink link(p);
  const uint32_t n = 100000;
  const auto psns = run(link, n);
  const SimLinkStats& st = link.stats(0);
  EXPECT_EQ(st.sent, n);
  // Binomial: 5 standard deviations is far outside noise for a fixed seed.
  // Duplication, reordering and corruption apply to frames not lost.
  const double kept = static_cast<double>(n - st.lost);
  EXPECT_NEAR(st.lost, 0.10 * n, 5 * 95);
  EXPECT_NEAR(st.duplicated, 0.02 * kept, 5 * 45);
  EXPECT_NEAR(st.reordered, 0.05 * kept, 5 * 70);
  EXPECT_NEAR(st.corrupted, 0.03 * kept, 5 * 55);
  EXPECT_EQ(st.delivered, psns.size());
  EXPECT_EQ(psns.size(), n - st.lost + st.duplicated);
  // Every flipped bit is caught by the decoder (ICRC or a header check).
  int64_t bad = 0, out_of_order = 0;
  int64_t last = -1;
  for (int64_t v : psns) {
    if (v < 0) {
      ++bad;
      continue;
    }
    const uint32_t rel =
        static_cast<uint32_t>(psn_diff(static_cast<uint32_t>(v), 0xfffff0));
    if (last >= 0 && rel < last) ++out_of_order;
    last = rel;
  }
  // A flip in the Ethernet addresses (12 of 146 bytes) is outside every
  // check, as on a real wire; everything else must be caught.
  EXPECT_GE(bad, static_cast<int64_t>(st.corrupted) * 85 / 100);
  EXPECT_LE(bad, static_cast<int64_t>(st.corrupted + st.duplicated));
  EXPECT_GT(out_of_order, 0);
}

// The switch queue: frames leave at the bottleneck rate, those arriving
// above the ECN threshold are marked CE (ECT ones only), a full buffer
// drops, and the queue never holds more than its buffer.
TEST(SimLink, BottleneckPacesMarksAndDrops) {
  SimLinkParams p;
  p.delay_ns = 0;
  p.rate_mbps = 1000;  // 8 ns a byte
  p.queue_bytes = 10 * 1024;
  p.ecn_bytes = 2 * 1024;
  SimLink link(p);
  const uint32_t len = static_cast<uint32_t>(roce_frame(0).size());
  // 200 frames at once, alternately ECT(0) and not ECN-capable.
  const uint32_t n = 200, fit = p.queue_bytes / len;  // the buffer holds
  ASSERT_LT(fit, n);
  for (uint32_t i = 0; i < n; ++i)
    link.send(0, roce_frame(i, i % 2 ? 0x02 : 0x00), 0);
  const SimLinkStats& st = link.stats(0);
  EXPECT_EQ(st.queue_drops, n - fit);
  EXPECT_LE(link.queue(0).peak_bytes(), static_cast<double>(p.queue_bytes));
  // Frames that found more than 2 KiB ahead, and ECT: every other one.
  uint32_t marks = 0;
  for (uint32_t i = 0; i < fit; ++i)
    if (i % 2 && i * len > p.ecn_bytes) ++marks;
  EXPECT_EQ(st.ce_marked, marks);
  // Departures are one frame time apart; CE survives the ICRC.
  std::vector<std::vector<uint8_t>> got;
  for (uint32_t i = 1; i <= fit; ++i) {
    const uint64_t done = uint64_t{i} * len * 8;
    EXPECT_EQ(link.receive(1, done - 1, got), 0u) << "frame " << i;
    ASSERT_EQ(link.receive(1, done, got), 1u) << "frame " << i;
  }
  uint32_t ce = 0;
  for (auto& f : got) {
    wire::FrameInfo fi;
    wire::decode(f.data(), static_cast<uint32_t>(f.size()), fi);
    ASSERT_EQ(fi.kind, wire::FrameKind::kRoce);
    if ((fi.roce.tclass & 3) == 3) ++ce;
  }
  EXPECT_EQ(ce, marks);
}
