// The port's fault-injection stage (dataplane/service/fault.h) on test
// frames: every action, its counter, its order, replay by seed, and that
// nothing is lost track of (each frame is delivered or freed exactly once).
#include <gtest/gtest.h>

#include <vector>

#include "dataplane/service/fault.h"

namespace urnic::service {
namespace {

using stats::Ctr;

struct Frame {
  uint32_t id = 0;
  uint32_t len = 1000;
  bool ect = true;
  bool ce = false;
  bool corrupt = false;
  bool copy = false;
};

// Frames live in a test-owned pool; the stage sees pointers.
struct Pool {
  std::vector<std::unique_ptr<Frame>> all;
  int live = 0;
  Frame* make(uint32_t id, uint32_t len = 1000) {
    all.push_back(std::make_unique<Frame>(Frame{id, len}));
    ++live;
    return all.back().get();
  }
};

struct TestOps {
  using Pkt = Frame*;
  Pool* pool;
  uint32_t len(Frame* f) const { return f->len; }
  Frame* copy(Frame* f) const {
    Frame* c = pool->make(f->id, f->len);
    c->copy = true;
    return c;
  }
  void corrupt(Frame* f, uint64_t) const { f->corrupt = true; }
  bool mark_ce(Frame* f) const {
    if (!f->ect) return false;
    f->ce = true;
    return true;
  }
  void free(Frame*) const { --pool->live; }
};

class FaultStageTest : public ::testing::Test {
 protected:
  using Stage = FaultStage<TestOps>;
  void make(const config::FaultDirConfig& d, uint64_t seed = 1) {
    stage_ = std::make_unique<Stage>(TestOps{&pool_}, ctr_, kTxFaultCtrs);
    stage_->set(d, seed);
  }
  // Pushes frames 0..n-1 at `now`, `gap_ns` apart; returns what came out
  // by `until` (popping as time goes).
  std::vector<Frame*> run(uint32_t n, uint64_t gap_ns = 0, uint64_t until = 0,
                          uint32_t len = 1000) {
    std::vector<Frame*> out;
    auto take = [&](Frame* f) {
      out.push_back(f);
      --pool_.live;  // delivered
    };
    uint64_t t = 0;
    for (uint32_t i = 0; i < n; ++i, t += gap_ns) {
      stage_->pop_st(t, take);
      stage_->push_st(pool_.make(i, len), t);
    }
    stage_->pop_st(std::max(t, until), take);
    return out;
  }
  uint64_t c(Ctr x) const { return ctr_.get(x); }

  Pool pool_;
  stats::LcoreCounters ctr_;
  std::unique_ptr<Stage> stage_;
};

TEST_F(FaultStageTest, AllZeroIsOffAndPassesFramesInOrder) {
  config::FaultDirConfig d;
  EXPECT_FALSE(fault_on(d));
  make(d);
  EXPECT_FALSE(stage_->on());
  const auto out = run(100);
  ASSERT_EQ(out.size(), 100u);
  for (uint32_t i = 0; i < 100; ++i) EXPECT_EQ(out[i]->id, i);
  EXPECT_EQ(pool_.live, 0);
}

TEST_F(FaultStageTest, RandomLossIsCountedAndReplaysBySeed) {
  config::FaultDirConfig d;
  d.drop_ppm = 100'000;  // 10 %
  make(d, 7);
  EXPECT_TRUE(stage_->on());
  const auto a = run(20000);
  const uint64_t dropped = c(Ctr::tx_fault_drop);
  EXPECT_EQ(a.size() + dropped, 20000u);
  EXPECT_GT(dropped, 1800u);
  EXPECT_LT(dropped, 2200u);
  EXPECT_EQ(pool_.live, 0);
  // The same seed drops the same frames.
  std::vector<uint32_t> ids_a;
  for (Frame* f : a) ids_a.push_back(f->id);
  stage_->set(d, 7);
  const auto b = run(20000);
  std::vector<uint32_t> ids_b;
  for (Frame* f : b) ids_b.push_back(f->id);
  EXPECT_EQ(ids_a, ids_b);
}

TEST_F(FaultStageTest, BurstsLoseBurstLenFramesInARow) {
  config::FaultDirConfig d;
  d.burst_ppm = 10'000;
  d.burst_len = 5;
  make(d);
  const auto out = run(20000);
  const uint64_t lost = c(Ctr::tx_fault_burst_drop);
  ASSERT_GT(lost, 0u);
  EXPECT_EQ(out.size() + lost, 20000u);
  // Every gap in the delivered ids is a whole number of bursts.
  uint32_t expect = 0;
  for (Frame* f : out) {
    EXPECT_EQ((f->id - expect) % 5, 0u) << "gap before " << f->id;
    expect = f->id + 1;
  }
}

TEST_F(FaultStageTest, CorruptAndDuplicate) {
  config::FaultDirConfig d;
  d.corrupt_ppm = 1'000'000;
  d.duplicate_ppm = 1'000'000;
  make(d);
  const auto out = run(10);
  ASSERT_EQ(out.size(), 20u);
  for (uint32_t i = 0; i < 10; ++i) {
    // The copy follows its original at once.
    EXPECT_EQ(out[2 * i]->id, i);
    EXPECT_FALSE(out[2 * i]->copy);
    EXPECT_EQ(out[2 * i + 1]->id, i);
    EXPECT_TRUE(out[2 * i + 1]->copy);
    EXPECT_TRUE(out[2 * i]->corrupt);
  }
  EXPECT_EQ(c(Ctr::tx_fault_corrupt), 10u);
  EXPECT_EQ(c(Ctr::tx_fault_duplicate), 10u);
  EXPECT_EQ(pool_.live, 0);
}

TEST_F(FaultStageTest, AReorderedFrameComesAfterGapLaterFrames) {
  config::FaultDirConfig d;
  d.reorder_ppm = 1'000'000;  // every frame, one held at a time
  d.reorder_gap = 3;
  make(d);
  const auto out = run(8);
  // 0 held; 1, 2, 3 pass, then 0; 4 held; 5, 6, 7 pass, then 4.
  std::vector<uint32_t> ids;
  for (Frame* f : out) ids.push_back(f->id);
  EXPECT_EQ(ids, (std::vector<uint32_t>{1, 2, 3, 0, 5, 6, 7, 4}));
  EXPECT_EQ(c(Ctr::tx_fault_reorder), 2u);
  // A held frame with nothing behind it leaves after 1 ms.
  stage_->push_st(pool_.make(100), 0);
  EXPECT_TRUE(stage_->pending());
  std::vector<Frame*> late;
  stage_->pop_st(Stage::kReorderHoldNs - 1,
                 [&](Frame* f) { late.push_back(f); });
  EXPECT_TRUE(late.empty());
  stage_->pop_st(Stage::kReorderHoldNs, [&](Frame* f) {
    late.push_back(f);
    --pool_.live;
  });
  ASSERT_EQ(late.size(), 1u);
  EXPECT_EQ(late[0]->id, 100u);
  EXPECT_EQ(pool_.live, 0);
}

TEST_F(FaultStageTest, DelayHoldsEveryFrame) {
  config::FaultDirConfig d;
  d.delay_us = 50;
  make(d);
  for (uint32_t i = 0; i < 5; ++i) stage_->push_st(pool_.make(i), 1000);
  std::vector<Frame*> out;
  auto take = [&](Frame* f) {
    out.push_back(f);
    --pool_.live;
  };
  stage_->pop_st(1000 + 49'999, take);
  EXPECT_TRUE(out.empty());
  stage_->pop_st(1000 + 50'000, take);
  EXPECT_EQ(out.size(), 5u);
  EXPECT_FALSE(stage_->pending());
}

TEST_F(FaultStageTest, BottleneckPacesTailDropsAndMarksEct) {
  config::FaultDirConfig d;
  d.rate_mbps = 1000;  // 1024 B take 8.192 us
  d.queue_kb = 8;
  d.ecn_kb = 4;
  make(d);
  // 20 frames of 1 KiB at once: the first leaves after 8.192 us, each next
  // one 8.192 us later; what would wait beyond 8 KiB is dropped; frames
  // with more than 4 KiB ahead of them are marked.
  std::vector<Frame*> in;
  for (uint32_t i = 0; i < 20; ++i) {
    in.push_back(pool_.make(i, 1024));
    in.back()->ect = i != 6;  // frame 6 is not ECN-capable
    stage_->push_st(in.back(), 0);
  }
  EXPECT_EQ(c(Ctr::tx_fault_queue_drop), 12u);  // 8 fit in 8 KiB
  std::vector<Frame*> out;
  auto take = [&](Frame* f) {
    out.push_back(f);
    --pool_.live;
  };
  stage_->pop_st(8191, take);
  EXPECT_TRUE(out.empty());
  stage_->pop_st(8192, take);
  EXPECT_EQ(out.size(), 1u);
  stage_->pop_st(8 * 8192, take);
  ASSERT_EQ(out.size(), 8u);
  // 0..4 had at most 4 KiB ahead; 5..7 more: marked, except 6 (not ECT).
  for (uint32_t i = 0; i < 8; ++i)
    EXPECT_EQ(out[i]->ce, i >= 5 && i != 6) << "frame " << i;
  EXPECT_EQ(c(Ctr::tx_fault_ce_marked), 2u);
  EXPECT_EQ(pool_.live, 0);
}

TEST_F(FaultStageTest, AFullQueueDropsAndDrainFreesTheRest) {
  config::FaultDirConfig d;
  d.delay_us = 1000;
  make(d);
  for (uint32_t i = 0; i < Stage::kQueue + 10; ++i)
    stage_->push_st(pool_.make(i), 0);
  EXPECT_EQ(c(Ctr::tx_fault_queue_drop), 10u);
  EXPECT_EQ(pool_.live, static_cast<int>(Stage::kQueue));
  stage_->drain();
  EXPECT_EQ(pool_.live, 0);
  EXPECT_FALSE(stage_->pending());
}

}  // namespace
}  // namespace urnic::service
