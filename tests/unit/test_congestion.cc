// The congestion windows (dataplane/transport/congestion.h) as plain
// classes: the AIMD arithmetic, with no engine around them. How the
// requester uses them on the wire is in test_transport_trace.cc.
#include <gtest/gtest.h>

#include "dataplane/transport/congestion.h"

namespace urnic::transport {
namespace {

CcParams params() {
  CcParams p;
  p.init_window = 4;
  p.min_window = 2;
  p.max_window = 64;
  p.shared_init_window = 32;
  p.shared_min_window = 8;
  p.shared_max_window = 128;
  return p;
}

TEST(LossWindow, SlowStartThenOnePacketPerWindow) {
  const CcParams p = params();
  LossWindow w;
  w.reset(p, 100);
  EXPECT_EQ(w.window(), 4u);
  // Slow start: every ACKed packet adds one.
  EXPECT_EQ(w.on_progress(p, 104), 4u);
  EXPECT_EQ(w.window(), 8u);
  // An old or repeated PSN acknowledges nothing.
  EXPECT_EQ(w.on_progress(p, 104), 0u);
  EXPECT_EQ(w.on_progress(p, 103), 0u);
  EXPECT_EQ(w.window(), 8u);
  // A loss halves it (ssthresh 4); then congestion avoidance: 4 ACKed
  // packets per increase of one.
  EXPECT_TRUE(w.on_loss(p, 106, 112));
  EXPECT_EQ(w.window(), 4u);
  EXPECT_EQ(w.on_progress(p, 112), 8u);  // passes the recovery point
  EXPECT_EQ(w.window(), 5u);  // 4 -> 5 after 4; 4 of the next 5 counted
}

TEST(LossWindow, OneCutPerWindowOfData) {
  const CcParams p = params();
  LossWindow w;
  w.reset(p, 0);
  w.on_progress(p, 12);  // 4 -> 16
  ASSERT_EQ(w.window(), 16u);
  EXPECT_TRUE(w.on_loss(p, 14, 30));
  EXPECT_EQ(w.window(), 8u);
  // Losses before the recovery point (30) are the same congestion event.
  EXPECT_FALSE(w.on_loss(p, 20, 30));
  EXPECT_FALSE(w.on_loss(p, 29, 34));
  EXPECT_EQ(w.window(), 8u);
  // Past it, a new one.
  EXPECT_TRUE(w.on_loss(p, 30, 40));
  EXPECT_EQ(w.window(), 4u);
}

TEST(LossWindow, TimeoutDropsToTheFloorAndNeverBelow) {
  const CcParams p = params();
  LossWindow w;
  w.reset(p, 0);
  w.on_progress(p, 20);
  w.on_timeout(p, 40);
  EXPECT_EQ(w.window(), p.min_window);
  EXPECT_EQ(w.ssthresh(), 12u);  // half of 24
  for (uint32_t psn = 40; psn < 400; psn += 8) w.on_loss(p, psn, psn + 8);
  EXPECT_EQ(w.window(), p.min_window);
}

TEST(LossWindow, NeverAboveMaxUnacked) {
  const CcParams p = params();
  LossWindow w;
  w.reset(p, 0xfffff0);  // and across the 24-bit PSN wrap
  for (uint32_t i = 1; i <= 100; ++i)
    w.on_progress(p, (0xfffff0 + i * 16) & 0xffffff);
  EXPECT_EQ(w.window(), p.max_window);
}

TEST(LossWindow, InitWindowIsClampedToTheLimits) {
  CcParams p = params();
  p.init_window = 1000;
  LossWindow w;
  w.reset(p, 0);
  EXPECT_EQ(w.window(), p.max_window);
  p.init_window = 0;
  w.reset(p, 0);
  EXPECT_EQ(w.window(), p.min_window);
}

TEST(SharedWindow, ShareIsTheWindowOverActiveQpsWithAFloor) {
  const CcParams p = params();
  SharedWindow s;
  s.reset(p);
  EXPECT_EQ(s.window(), 32u);
  EXPECT_EQ(s.share(0, 2), 32u);  // no QP active: the whole window
  EXPECT_EQ(s.share(1, 2), 32u);
  EXPECT_EQ(s.share(4, 2), 8u);
  // Many QPs: each still gets the floor, so a lone lost packet is not
  // always a retransmit timeout.
  EXPECT_EQ(s.share(256, 2), 2u);
}

TEST(SharedWindow, GrowsWithEveryQpsAcksAndCutsOncePerWindow) {
  const CcParams p = params();
  SharedWindow s;
  s.reset(p);
  s.on_acked(p, 16);  // slow start: 32 -> 48
  EXPECT_EQ(s.window(), 48u);
  // Two QPs see losses of the same congestion event: one cut.
  EXPECT_TRUE(s.on_loss(p));
  EXPECT_EQ(s.window(), 24u);
  EXPECT_FALSE(s.on_loss(p));
  EXPECT_EQ(s.window(), 24u);
  // Congestion avoidance: 24 ACKed packets add one; 25 are also a whole
  // window of data since the cut, so the next loss is news.
  s.on_acked(p, 25);
  EXPECT_EQ(s.window(), 25u);
  EXPECT_TRUE(s.on_loss(p));
  EXPECT_EQ(s.window(), 12u);
  // Never below the floor, never above the maximum.
  for (int i = 0; i < 10; ++i) {
    s.on_acked(p, 100);
    s.on_loss(p);
  }
  EXPECT_EQ(s.window(), p.shared_min_window);
  for (int i = 0; i < 1000; ++i) s.on_acked(p, 1000);
  EXPECT_EQ(s.window(), p.shared_max_window);
}

}  // namespace
}  // namespace urnic::transport
