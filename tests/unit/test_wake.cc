// Wake (dataplane/service/wake.h): an announced lcore's wait returns for a
// bell or a readiness edge of a watched fd, stale edges and bells from
// before the announcement are dropped, and a ring() to an lcore that has
// not announced writes nothing; park() rings a waiting lcore. The
// doorbell page's half of the protocol (ring_doorbell, doorbell_wakes).
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "dataplane/hostif/abi.h"
#include "dataplane/service/lcore_gate.h"
#include "dataplane/service/wake.h"

namespace urnic::service {
namespace {

void poke(int fd) {
  const uint64_t one = 1;
  ASSERT_EQ(write(fd, &one, sizeof one), 8);
}

TEST(Wake, NotAnnouncedRingWritesNothing) {
  Wake w;
  w.ring();  // nobody waits: no write
  w.announce_st();
  EXPECT_EQ(w.wait_st(0), Wake::kTimedOut);
}

TEST(Wake, AnnouncedRingWakesTheWait) {
  Wake w;
  w.announce_st();
  w.ring();
  EXPECT_EQ(w.wait_st(10000), Wake::kBell);
  w.withdraw_st();
  EXPECT_FALSE(w.announced_st());
}

TEST(Wake, BellFromAnotherThreadEndsAWait) {
  Wake w;
  w.announce_st();
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    w.ring();
  });
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(w.wait_st(10000), Wake::kBell);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  t.join();
}

TEST(Wake, TimesOutWithoutEvents) {
  Wake w;
  w.announce_st();
  EXPECT_EQ(w.wait_st(5), Wake::kTimedOut);
}

TEST(Wake, WatchedFdEdgeWakesAndStaleEdgesAreDropped) {
  Wake w;
  EXPECT_FALSE(w.covers_rx());
  const int rx = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ASSERT_GE(rx, 0);
  w.watch_rx(rx);
  EXPECT_TRUE(w.covers_rx());
  poke(rx);         // a frame read long ago (never consumed here)
  w.ring_always();  // a bell from before
  w.announce_st();  // drops both
  EXPECT_EQ(w.wait_st(0), Wake::kTimedOut);
  poke(rx);  // a new frame: a new edge
  EXPECT_EQ(w.wait_st(10000), Wake::kRx);
  w.withdraw_st();
  close(rx);
}

TEST(Wake, ParkRingsAWaitingLcore) {
  Wake w;
  LcoreGate g;
  g.set_wake(&w);
  g.set_running(true);
  std::atomic<bool> woke{false}, polled{false};
  std::thread lcore([&] {
    // The worker's order: announce, poll once more (the gate), wait. A
    // park requested after the announcement is either seen by that poll
    // or rings the bell; never slept through (10 s bound).
    w.announce_st();
    polled = g.check_st();
    if (!polled) woke = w.wait_st(10000) == Wake::kBell;
    w.withdraw_st();
    while (!polled && !g.check_st()) {
    }
    g.set_running(false);
  });
  while (!w.announced_st()) std::this_thread::yield();
  g.park();
  g.unpark();
  lcore.join();
  EXPECT_TRUE(polled.load() || woke.load());
}

TEST(DoorbellPage, RingReportsWhetherTheLcoreMustBeWoken) {
  auto db = std::make_unique<shim::DoorbellPage>();
  const uint32_t homes = 2;
  const uint32_t on1 = shim::kDoorbellsPerSummary + 5;  // summary word 1
  EXPECT_EQ(shim::doorbell_home(5, homes), 0u);
  EXPECT_EQ(shim::doorbell_home(on1, homes), 1u);
  EXPECT_TRUE(shim::ring_doorbell(*db, 5));
  EXPECT_FALSE(shim::ring_doorbell(*db, 5));  // pending already
  EXPECT_FALSE(shim::doorbell_wakes(*db, 5, homes));
  db->waiting.store(1u << 1);
  EXPECT_FALSE(shim::doorbell_wakes(*db, 5, homes));
  EXPECT_TRUE(shim::ring_doorbell(*db, on1));
  EXPECT_TRUE(shim::doorbell_wakes(*db, on1, homes));
}

}  // namespace
}  // namespace urnic::service
