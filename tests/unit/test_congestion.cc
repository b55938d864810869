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

TEST(PipeEstimate, HighestRateTimesLowestRoundTripOverTheirEpochs) {
  PipeEstimate e;
  EXPECT_EQ(e.packets(), 0u) << "no sample: no pipe";
  // 40 packets in 20 us: 2 per us; then a slower, longer round trip.
  e.on_sample(1'000, 20'000, 40);
  EXPECT_EQ(e.packets(), 40u);
  e.on_sample(2'000, 50'000, 25);
  EXPECT_EQ(e.packets(), 40u) << "max rate 2/us x min RTT 20 us";
  // A shorter round trip later: the pipe is the best rate over it.
  e.on_sample(3'000, 10'000, 5);
  EXPECT_EQ(e.packets(), 20u);
  // The rate samples age out after one to two rate epochs...
  const uint64_t r = PipeEstimate::kRateEpochNs;
  e.on_sample(1'000 + r, 50'000, 25);  // 0.5/us; the old epoch still counts
  EXPECT_EQ(e.packets(), 20u);
  e.on_sample(1'000 + 3 * r, 50'000, 25);
  EXPECT_EQ(e.packets(), 5u) << "0.5/us x 10 us";
  // ...the round trips after one to two RTT epochs.
  e.on_sample(1'000 + 2 * PipeEstimate::kRttEpochNs + 3 * r, 40'000, 20);
  EXPECT_EQ(e.packets(), 20u) << "0.5/us x 40 us";
}

TEST(LossWindow, ALossCutsNoLowerThanThePipe) {
  CcParams p = params();
  LossWindow w;
  w.reset(p, 0);
  w.on_progress(p, 28);  // slow start 4 -> 32
  ASSERT_EQ(w.window(), 32u);
  // The path delivered 24 packets per 10 us round trip.
  w.pipe().on_sample(1'000, 10'000, 24);
  EXPECT_TRUE(w.on_loss(p, 28, 60));
  EXPECT_EQ(w.window(), 24u) << "not 16: a window of the pipe costs nothing";
  // A window already below the pipe is halved: the pipe never raises it.
  w.on_timeout(p, 30);   // nothing sent past 30 yet
  w.on_progress(p, 36);  // 8 more ACKed: slow start 2 -> 10 (ssthresh 12)
  ASSERT_EQ(w.window(), 10u);
  EXPECT_TRUE(w.on_loss(p, 36, 80));
  EXPECT_EQ(w.window(), 10u) << "min(cwnd, pipe) = cwnd: kept";
  p.pipe_floor = false;
  EXPECT_TRUE(w.on_loss(p, 80, 90));
  EXPECT_EQ(w.window(), 5u) << "pipe_floor off: halved";
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
  // A pool larger than the window (what grants fill) is divided instead;
  // a smaller one changes nothing.
  EXPECT_EQ(s.share(4, 2, 64), 16u);
  EXPECT_EQ(s.share(4, 2, 8), 8u);
  EXPECT_EQ(s.share(1, 2, 64), 64u);
}

TEST(SharedWindow, GrowsWithEveryQpsAcksAndCutsOncePerWindow) {
  const CcParams p = params();
  SharedWindow s;
  s.reset(p);
  s.on_acked(p, 16, 32);  // slow start: 32 -> 48
  EXPECT_EQ(s.window(), 48u);
  // Two QPs see losses of the same congestion event: one cut.
  EXPECT_TRUE(s.on_loss(p));
  EXPECT_EQ(s.window(), 24u);
  EXPECT_FALSE(s.on_loss(p));
  EXPECT_EQ(s.window(), 24u);
  // Congestion avoidance: 24 ACKed packets add one; 25 are also a whole
  // window of data since the cut, so the next loss is news.
  s.on_acked(p, 25, 24);
  EXPECT_EQ(s.window(), 25u);
  EXPECT_TRUE(s.on_loss(p));
  EXPECT_EQ(s.window(), 12u);
  // Never below the floor, never above the maximum.
  for (int i = 0; i < 10; ++i) {
    s.on_acked(p, 100, p.shared_max_window);
    s.on_loss(p);
  }
  EXPECT_EQ(s.window(), p.shared_min_window);
  for (int i = 0; i < 1000; ++i) s.on_acked(p, 1000, p.shared_max_window);
  EXPECT_EQ(s.window(), p.shared_max_window);
}

TEST(SharedWindow, GrowsOnlyWhileHalfOfItIsInUse) {
  const CcParams p = params();
  SharedWindow s;
  s.reset(p);
  ASSERT_EQ(s.window(), 32u);
  // One QP with 10 packets in flight, ACKed for ever: the window that does
  // not limit it stays as it is.
  for (int i = 0; i < 1000; ++i) s.on_acked(p, 10, 10);
  EXPECT_EQ(s.window(), 32u);
  EXPECT_EQ(s.delivered(), 10000u);
  // Half of it in use: it grows (slow start).
  s.on_acked(p, 16, 16);
  EXPECT_EQ(s.window(), 48u);
  // The ACKs still count towards the next cut while it does not grow: a
  // loss after a window of data ACKed is news.
  EXPECT_TRUE(s.on_loss(p));
  EXPECT_EQ(s.window(), 24u);
  s.on_acked(p, 24, 4);
  EXPECT_EQ(s.window(), 24u);
  EXPECT_TRUE(s.on_loss(p));
  EXPECT_EQ(s.window(), 12u);
}

// DCQCN reaction point: a reference trace worked out by hand from the
// algorithm (SIGCOMM 2015, ConnectX parameter semantics) with the firmware
// defaults: g = 1019/1024, alpha period 1 us, first alpha 1023/1024, cuts by
// alpha/2 at most every 4 us, increase events every 300 us or 32767 bytes,
// one event of fast recovery, AI 5 Mb/s, HAI 50 Mb/s.
constexpr uint64_t kUs = 1000;

CcParams dcqcn_params() {
  CcParams p;
  p.dcqcn = true;
  p.dcqcn_params = kConnectXDcqcn;
  p.line_rate_mbps = 10000;
  p.pace_burst_bytes = 16384;
  return p;
}

TEST(DcqcnRate, StartsUnlimitedAndTheFirstCnpHalvesTheLineRate) {
  const CcParams p = dcqcn_params();
  DcqcnRate r;
  DcqcnShare s;
  uint64_t at = 0;
  EXPECT_FALSE(r.limited());
  EXPECT_TRUE(r.may_send(p, 0, &at, s));
  ASSERT_TRUE(r.on_cnp(p, 0, s));
  EXPECT_TRUE(r.limited());
  // Rt = line; Rc = 10000 * (1 - (1023/1024) / 2).
  EXPECT_DOUBLE_EQ(r.target_mbps(), 10000.0);
  EXPECT_DOUBLE_EQ(r.rate_mbps(), 5004.8828125);
}

TEST(DcqcnRate, OneCutPerMonitorPeriodAlphaFollowsTheCnps) {
  const CcParams p = dcqcn_params();
  DcqcnRate r;
  DcqcnShare s;
  ASSERT_TRUE(r.on_cnp(p, 0, s));
  // 2 us later: alpha rises for the period [0, 1 us) that had a CNP and
  // decays for [1, 2 us); no cut inside rate_reduce_monitor_period.
  EXPECT_FALSE(r.on_cnp(p, 2 * kUs, s));
  EXPECT_NEAR(r.alpha(), 0.99415014, 1e-8);
  EXPECT_DOUBLE_EQ(r.rate_mbps(), 5004.8828125);
  // 10 us: a cut. Alpha: up for [2, 3 us), down for the 7 periods after.
  // Rt = the rate before the cut, Rc = Rc * (1 - alpha / 2).
  EXPECT_TRUE(r.on_cnp(p, 10 * kUs, s));
  EXPECT_NEAR(r.alpha(), 0.96069172, 1e-8);
  EXPECT_DOUBLE_EQ(r.target_mbps(), 5004.8828125);
  EXPECT_NEAR(r.rate_mbps(), 2600.80808, 1e-4);
}

TEST(DcqcnRate, FastRecoveryThenAdditiveThenHyperIncrease) {
  const CcParams p = dcqcn_params();
  DcqcnRate r;
  DcqcnShare s;
  ASSERT_TRUE(r.on_cnp(p, 0, s));
  ASSERT_FALSE(r.on_cnp(p, 2 * kUs, s));
  ASSERT_TRUE(r.on_cnp(p, 10 * kUs, s));
  uint64_t at = 0;
  // 310 us: the first timer event after the cut is fast recovery: Rc goes
  // halfway to Rt, Rt stays.
  r.may_send(p, 310 * kUs, &at, s);
  EXPECT_NEAR(r.target_mbps(), 5004.8828125, 1e-9);
  EXPECT_NEAR(r.rate_mbps(), 3802.84545, 1e-4);
  // 610 us: the timer stage passed rpg_threshold: additive increase.
  r.may_send(p, 610 * kUs, &at, s);
  EXPECT_NEAR(r.target_mbps(), 5009.8828125, 1e-9);
  EXPECT_NEAR(r.rate_mbps(), 4406.36413, 1e-4);
  // rpg_byte_reset bytes sent: a byte-counter event, still additive (the
  // byte stage has not passed the threshold yet).
  r.on_sent(p, 620 * kUs, 32767, s);
  EXPECT_NEAR(r.target_mbps(), 5014.8828125, 1e-9);
  EXPECT_NEAR(r.rate_mbps(), 4710.62347, 1e-4);
  // 910 us: both stages passed it: hyper increase, Rt += 1 * 50.
  r.may_send(p, 910 * kUs, &at, s);
  EXPECT_NEAR(r.target_mbps(), 5064.8828125, 1e-9);
  EXPECT_NEAR(r.rate_mbps(), 4887.75314, 1e-4);
}

TEST(DcqcnRate, BackToUnlimitedAtTheLineRate) {
  const CcParams p = dcqcn_params();
  DcqcnRate r;
  DcqcnShare s;
  ASSERT_TRUE(r.on_cnp(p, 0, s));
  uint64_t at = 0;
  // Rt = line: every event halves the gap; 13 halvings of 4995 Mb/s leave
  // less than 1 Mb/s.
  r.may_send(p, 12 * 300 * kUs, &at, s);
  EXPECT_TRUE(r.limited());
  r.may_send(p, 13 * 300 * kUs, &at, s);
  EXPECT_FALSE(r.limited());
  // The next CNP starts over from the line rate.
  ASSERT_TRUE(r.on_cnp(p, 14 * 300 * kUs, s));
  EXPECT_DOUBLE_EQ(r.rate_mbps(), 5004.8828125);
}

TEST(DcqcnRate, RespectsMinDecFacMinRateAndRateOnFirstCnp) {
  CcParams p = dcqcn_params();
  p.dcqcn_params.rpg_min_dec_fac = 80;  // a cut keeps at least 80 %
  DcqcnRate r;
  DcqcnShare s;
  ASSERT_TRUE(r.on_cnp(p, 0, s));
  EXPECT_DOUBLE_EQ(r.rate_mbps(), 8000.0);
  p.dcqcn_params.rpg_min_dec_fac = 0;
  p.dcqcn_params.rpg_min_rate = 5000;  // 8000 * (1 - 0.96 / 2) is less
  ASSERT_TRUE(r.on_cnp(p, 10 * kUs, s));
  EXPECT_DOUBLE_EQ(r.rate_mbps(), 5000.0);
  DcqcnRate first;
  p.dcqcn_params.rate_to_set_on_first_cnp = 6000;
  ASSERT_TRUE(first.on_cnp(p, 0, s));
  EXPECT_DOUBLE_EQ(first.rate_mbps(), 6000.0);
  EXPECT_DOUBLE_EQ(first.target_mbps(), 6000.0);
}

TEST(DcqcnRate, PacerSpendsItsBurstThenSaysWhenToSendAgain) {
  CcParams p = dcqcn_params();
  p.dcqcn_params.rate_to_set_on_first_cnp = 1000;  // 1 Gb/s: 8 ns per byte
  DcqcnRate r;
  DcqcnShare s;
  ASSERT_TRUE(r.on_cnp(p, 0, s));
  uint64_t at = 0;
  ASSERT_TRUE(r.may_send(p, 0, &at, s));
  r.on_sent(p, 0, 16384, s);  // the whole burst
  EXPECT_FALSE(r.may_send(p, 0, &at, s));
  EXPECT_EQ(at, 1u);  // tokens are exactly 0: as soon as any accrue
  r.on_sent(p, 0, 0, s);
  ASSERT_TRUE(r.may_send(p, 1, &at, s));
  r.on_sent(p, 1, 1000, s);  // 1000 bytes in debt: 8 us at 1 Gb/s
  EXPECT_FALSE(r.may_send(p, 1, &at, s));
  EXPECT_NEAR(static_cast<double>(at), 1 + 8000, 2);
  EXPECT_TRUE(r.may_send(p, at, &at, s));
}

// rpg_time_share_qps = k: with N > k QPs of the engine rate-limited, each
// QP's increase timer runs N/k times slower; back to its own period when
// fewer are limited. The count follows every way in and out of limited().
TEST(DcqcnRate, TimeShareSlowsEachTimerWhileMoreThanKQpsAreLimited) {
  CcParams p = dcqcn_params();  // rpg_time_reset 300 us
  p.dcqcn_params.rpg_time_share_qps = 2;
  DcqcnShare s;
  DcqcnRate q[4];
  for (DcqcnRate& r : q) ASSERT_TRUE(r.on_cnp(p, 0, s));
  EXPECT_EQ(s.limited, 4u);
  uint64_t at = 0;
  // 4 limited, k 2: a 600 us period. Nothing at 310 us.
  q[0].may_send(p, 310 * kUs, &at, s);
  EXPECT_DOUBLE_EQ(q[0].rate_mbps(), 5004.8828125);
  // 610 us: one fast-recovery event, Rc halfway to Rt (the line rate).
  q[0].may_send(p, 610 * kUs, &at, s);
  EXPECT_NEAR(q[0].rate_mbps(), 7502.44140625, 1e-6);
  // Two QPs leave the limited set: 2 <= k, the 300 us period again.
  q[2].reset(s);
  q[3].reset(s);
  EXPECT_EQ(s.limited, 2u);
  q[1].may_send(p, 310 * kUs, &at, s);
  EXPECT_NEAR(q[1].rate_mbps(), 7502.44140625, 1e-6);
  // Off (0): each QP its own timer whatever the count.
  p.dcqcn_params.rpg_time_share_qps = 0;
  DcqcnShare s2;
  DcqcnRate r[4];
  for (DcqcnRate& x : r) ASSERT_TRUE(x.on_cnp(p, 0, s2));
  r[0].may_send(p, 310 * kUs, &at, s2);
  EXPECT_NEAR(r[0].rate_mbps(), 7502.44140625, 1e-6);
  // Back at the line rate counts as leaving too.
  r[1].may_send(p, 13 * 300 * kUs, &at, s2);
  EXPECT_FALSE(r[1].limited());
  EXPECT_EQ(s2.limited, 3u);
}

// A limited QP whose send queue ran dry keeps its rate but does not share
// the timer until it has work again: quiet QPs do not slow the busy ones.
TEST(DcqcnRate, AnIdleLimitedQpIsNotCountedInTheShare) {
  CcParams p = dcqcn_params();  // rpg_time_reset 300 us
  p.dcqcn_params.rpg_time_share_qps = 2;
  DcqcnShare s;
  DcqcnRate q[4];
  for (DcqcnRate& r : q) ASSERT_TRUE(r.on_cnp(p, 0, s));
  ASSERT_EQ(s.limited, 4u);
  q[2].set_idle(s, true);
  q[3].set_idle(s, true);
  q[3].set_idle(s, true);  // said twice: counted once
  EXPECT_EQ(s.limited, 2u);
  EXPECT_TRUE(q[2].limited());
  EXPECT_DOUBLE_EQ(q[2].rate_mbps(), 5004.8828125);
  // 2 <= k: q[1]'s own 300 us period.
  uint64_t at = 0;
  q[1].may_send(p, 310 * kUs, &at, s);
  EXPECT_NEAR(q[1].rate_mbps(), 7502.44140625, 1e-6);
  // Idle before its first CNP: counted once it has work again, and no
  // longer once reset.
  DcqcnRate x;
  x.set_idle(s, true);
  ASSERT_TRUE(x.on_cnp(p, 0, s));
  EXPECT_EQ(s.limited, 2u);
  x.set_idle(s, false);
  EXPECT_EQ(s.limited, 3u);
  x.reset(s);
  EXPECT_EQ(s.limited, 2u);
  x.set_idle(s, true);
  x.set_idle(s, false);
  EXPECT_EQ(s.limited, 2u);
  q[2].set_idle(s, false);
  EXPECT_EQ(s.limited, 3u);
}

}  // namespace
}  // namespace urnic::transport
