// LcoreGate: while park() has returned and unpark() has not been called,
// the worker lcore runs none of its loop body. A stress of park/unpark
// against a running "lcore" thread, with the lcore delayed right after it
// is released (the preemption that made the old flag-based gate return
// from park() while the lcore ran).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "dataplane/service/lcore_gate.h"

namespace urnic::service {
namespace {

struct Lcore {
  LcoreGate gate;
  std::atomic<bool> stop{false};
  std::atomic<bool> inside{false};  // the lcore is in its loop body
  std::atomic<uint64_t> loops{0};
  uint64_t table = 0;  // what the control thread changes while parked

  template <typename Hook>
  void run(Hook hook) {
    uint64_t seen = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      gate.check_st(hook);
      inside.store(true, std::memory_order_seq_cst);
      seen += table;  // a read the control thread must never race with
      for (int i = 0; i < 50; ++i) __builtin_ia32_pause();
      inside.store(false, std::memory_order_seq_cst);
      loops.fetch_add(1, std::memory_order_relaxed);
    }
    gate.set_running(false);
    (void)seen;
  }
};

// Counts the times the lcore was seen in its loop body while parked.
uint64_t stress(Lcore& l, int rounds, std::chrono::microseconds hold) {
  uint64_t violations = 0;
  for (int r = 0; r < rounds; ++r) {
    l.gate.park();
    const auto until = std::chrono::steady_clock::now() + hold;
    while (std::chrono::steady_clock::now() < until)
      if (l.inside.load(std::memory_order_seq_cst)) ++violations;
    ++l.table;
    l.gate.unpark();
  }
  return violations;
}

TEST(LcoreGate, ParkHoldsTheLcoreEvenWhenItIsPreemptedOnRelease) {
  Lcore l;
  l.gate.set_running(true);
  // The lcore sleeps right after it is released: a following park() must
  // wait for it to come round again, not take it for still parked.
  std::thread t([&] {
    l.run([] { std::this_thread::sleep_for(std::chrono::microseconds(20)); });
  });
  const uint64_t v = stress(l, 3000, std::chrono::microseconds(60));
  l.stop = true;
  t.join();
  EXPECT_EQ(v, 0u);
  EXPECT_GT(l.loops.load(), 0u);
}

TEST(LcoreGate, ParkHoldsAFreeRunningLcore) {
  Lcore l;
  l.gate.set_running(true);
  std::thread t([&] { l.run(LcoreGate::NoHook{}); });
  const uint64_t v = stress(l, 20000, std::chrono::microseconds(2));
  l.stop = true;
  t.join();
  EXPECT_EQ(v, 0u);
}

TEST(LcoreGate, ParkReturnsAtOnceWhenTheLcoreIsNotRunning) {
  LcoreGate g;
  g.park();  // never running: must not wait
  g.unpark();
  g.set_running(true);
  g.set_running(false);  // the lcore left its loop
  g.park();
  g.unpark();
  SUCCEED();
}

}  // namespace
}  // namespace urnic::service
