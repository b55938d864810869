// LcoreGate: how the control thread stops a worker lcore at a safe point
// to change what the lcore reads (object tables, QPs), and ParkGuard.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <ctime>
#include <span>

#include "dataplane/service/wake.h"

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
  // Worker, once per loop iteration; true if it was parked. `after_spin`
  // runs when the lcore has been released, before it goes on (a seam for
  // the stress test).
  template <typename AfterSpin = NoHook>
  bool check_st(AfterSpin after_spin = {}) {
    const uint32_t g = req_.load(std::memory_order_acquire);
    if (!(g & 1)) return false;
    ack_.store(g, std::memory_order_seq_cst);
    if (waiting_.load(std::memory_order_seq_cst)) wake(&ack_);
    while (req_.load(std::memory_order_acquire) == g) __builtin_ia32_pause();
    after_spin();
    return true;
  }
  // Worker, idle: sleeps up to `ns`, or until park() asks for the lcore.
  // A park used to wait out the sleep (lcores.idle.sleep_us: 50 us asked,
  // 137 us taken on the test VM), four times per QP set up. The futex word
  // is the request word: FUTEX_WAIT sleeps only while it still holds the
  // generation read here, so a park() that moved it first is never slept
  // through; `sleeping_` spares park() the wake syscall otherwise.
  void sleep_st(uint64_t ns) {
    const uint32_t g = req_.load(std::memory_order_acquire);
    if (g & 1) return;  // a park is waiting: back to the gate
    sleeping_.store(true, std::memory_order_seq_cst);
    wait(&req_, g, ns);
    sleeping_.store(false, std::memory_order_relaxed);
  }
  // Set-up: how park() reaches the lcore when it waits for events.
  void set_wake(Wake* w) { wake_ = w; }
  void set_running(bool r) {
    running_.store(r, std::memory_order_seq_cst);
    if (!r && waiting_.load(std::memory_order_seq_cst)) wake(&ack_);
  }
  // Control thread. Returns once the lcore is parked (or not running).
  void park() {
    // seq_cst with sleep_st's store of `sleeping_` and the futex's own
    // read of the word: either this sees the lcore asleep and wakes it, or
    // its FUTEX_WAIT sees the new generation and does not sleep.
    const uint32_t g = req_.fetch_add(1, std::memory_order_seq_cst) + 1;
    if (sleeping_.load(std::memory_order_seq_cst)) wake(&req_);
    if (wake_) wake_->ring();
    // A polling lcore answers within microseconds. After that, block until
    // it acks (check_st wakes us) rather than sched_yield: on a CPU shared
    // with other runnable threads a yield gave the CPU away for a whole
    // time slice, milliseconds per park (perf/README.md, "control path").
    for (uint32_t i = 0; i < kSpinBeforeBlock; ++i) {
      if (parked(g)) return;
      __builtin_ia32_pause();
    }
    waiting_.store(true, std::memory_order_seq_cst);
    for (;;) {
      const uint32_t a = ack_.load(std::memory_order_seq_cst);
      if (a == g || !running_.load(std::memory_order_seq_cst)) break;
      wait(&ack_, a, kBlockNs);  // the bound only guards against the
                                 // lcore dying without a word
    }
    waiting_.store(false, std::memory_order_relaxed);
  }
  void unpark() { req_.fetch_add(1, std::memory_order_acq_rel); }

 private:
  static constexpr uint32_t kSpinBeforeBlock = 2000;  // 49 us on the test VM
  static constexpr uint64_t kBlockNs = 1000000;

  bool parked(uint32_t g) const {
    return ack_.load(std::memory_order_acquire) == g ||
           !running_.load(std::memory_order_acquire);
  }
  // The futex word of an atomic is the atomic itself (lock-free, 4 bytes).
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
                std::atomic<uint32_t>::is_always_lock_free);
  static uint32_t* word(std::atomic<uint32_t>* a) {
    return reinterpret_cast<uint32_t*>(a);
  }
  // FUTEX_WAIT sleeps only while *a still holds `expect` (up to `ns`).
  static void wait(std::atomic<uint32_t>* a, uint32_t expect, uint64_t ns) {
    timespec ts{static_cast<time_t>(ns / 1000000000),
                static_cast<long>(ns % 1000000000)};
    syscall(SYS_futex, word(a), FUTEX_WAIT_PRIVATE, expect, &ts, nullptr, 0);
  }
  static void wake(std::atomic<uint32_t>* a) {
    syscall(SYS_futex, word(a), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
  }

  Wake* wake_ = nullptr;
  std::atomic<uint32_t> req_{0};  // control thread; odd: park requested
  std::atomic<uint32_t> ack_{0};  // lcore: the generation it parked for
  std::atomic<bool> running_{false};
  std::atomic<bool> sleeping_{false};  // lcore: in (or entering) sleep_st
  std::atomic<bool> waiting_{false};   // control: blocked in park()
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

// With g's lcore parked (by the caller): lets it run one whole pass of its
// loop, then parks it again. The released lcore leaves its spin and goes
// on; the new request makes its next check park it.
inline void run_one_pass(LcoreGate& g) {
  g.unpark();
  g.park();
}

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
