// LcoreGate: how the control thread stops a worker lcore at a safe point
// to change what the lcore reads (object tables, QPs), and ParkGuard.
#pragma once

#include <sched.h>

#include <atomic>
#include <cstdint>
#include <span>

namespace urnic::service {

// Parks a worker lcore at a safe point (top of its loop, no references
// held) so the control thread can change what the lcore reads. Control
// operations are rare (set-up and tear-down); a park costs the data path
// a few microseconds.
//
// A generation handshake, not a "parked" flag: park() makes the request
// word odd (a new generation g) and waits until the lcore acknowledges
// exactly g; unpark() makes it even. A flag that the lcore clears after
// leaving its spin can still read "parked" from the previous request when
// the lcore was preempted between the two, and park() would return while
// the lcore runs. One caller at a time (the control thread).
class LcoreGate {
 public:
  struct NoHook {
    void operator()() const {}
  };
  // Worker, once per loop iteration. `after_spin` runs when the lcore has
  // been released, before it goes on (a seam for the stress test).
  template <typename AfterSpin = NoHook>
  void check_st(AfterSpin after_spin = {}) {
    const uint32_t g = req_.load(std::memory_order_acquire);
    if (!(g & 1)) return;
    ack_.store(g, std::memory_order_release);
    while (req_.load(std::memory_order_acquire) == g) __builtin_ia32_pause();
    after_spin();
  }
  void set_running(bool r) { running_.store(r, std::memory_order_release); }
  // Control thread. Returns once the lcore is parked (or not running).
  void park() {
    const uint32_t g = req_.fetch_add(1, std::memory_order_acq_rel) + 1;
    while (ack_.load(std::memory_order_acquire) != g &&
           running_.load(std::memory_order_acquire))
      sched_yield();
  }
  void unpark() { req_.fetch_add(1, std::memory_order_acq_rel); }

 private:
  std::atomic<uint32_t> req_{0};  // control thread; odd: park requested
  std::atomic<uint32_t> ack_{0};  // lcore: the generation it parked for
  std::atomic<bool> running_{false};
};

class ParkGuard {
 public:
  explicit ParkGuard(LcoreGate& g) : g_(g) { g_.park(); }
  ~ParkGuard() { g_.unpark(); }
  ParkGuard(const ParkGuard&) = delete;
  ParkGuard& operator=(const ParkGuard&) = delete;

 private:
  LcoreGate& g_;
};

// Parks every lcore (objects any of them may read: MRs, CQs, PDs, the
// client list). None waits for another at the top of its loop, so parking
// them one after the other cannot deadlock.
class ParkAll {
 public:
  explicit ParkAll(std::span<LcoreGate* const> gates) : gates_(gates) {
    for (LcoreGate* g : gates_) g->park();
  }
  ~ParkAll() {
    for (LcoreGate* g : gates_) g->unpark();
  }
  ParkAll(const ParkAll&) = delete;
  ParkAll& operator=(const ParkAll&) = delete;

 private:
  std::span<LcoreGate* const> gates_;
};

}  // namespace urnic::service
