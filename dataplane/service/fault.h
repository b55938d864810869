// Fault injection on the port: one stage per worker lcore and direction,
// between the transport and the PMD (config `fault`, urnicctl fault). It
// loses, corrupts, duplicates, reorders, queues behind a bottleneck rate
// (tail drop, ECN CE marking above a threshold) and delays RoCEv2 frames,
// each decision drawn from one seeded generator and counted. The frames
// themselves are reached through `Ops` (rte_mbuf* in the service, a test
// type in the unit test), so the policy has no DPDK in it.
//
// Used by its lcore only (`_st`); set() only while that lcore is parked.
// Nothing here allocates after construction.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>

#include "config/urnic_config.h"
#include "dataplane/stats/counters.h"
#include "dataplane/transport/bottleneck.h"

namespace urnic::service {

// The stage's counters, rx or tx.
struct FaultCtrs {
  stats::Ctr drop, burst_drop, corrupt, duplicate, reorder, queue_drop, ce;
};
inline constexpr FaultCtrs kRxFaultCtrs{
    stats::Ctr::rx_fault_drop,     stats::Ctr::rx_fault_burst_drop,
    stats::Ctr::rx_fault_corrupt,  stats::Ctr::rx_fault_duplicate,
    stats::Ctr::rx_fault_reorder,  stats::Ctr::rx_fault_queue_drop,
    stats::Ctr::rx_fault_ce_marked};
inline constexpr FaultCtrs kTxFaultCtrs{
    stats::Ctr::tx_fault_drop,     stats::Ctr::tx_fault_burst_drop,
    stats::Ctr::tx_fault_corrupt,  stats::Ctr::tx_fault_duplicate,
    stats::Ctr::tx_fault_reorder,  stats::Ctr::tx_fault_queue_drop,
    stats::Ctr::tx_fault_ce_marked};

inline bool fault_on(const config::FaultDirConfig& d) {
  return d.drop_ppm || d.burst_ppm || d.corrupt_ppm || d.duplicate_ppm ||
         d.reorder_ppm || d.delay_us || d.rate_mbps;
}

// Ops: using Pkt = ...; uint32_t len(Pkt); Pkt copy(Pkt) (null when out of
// buffers); void corrupt(Pkt, uint64_t random); bool mark_ce(Pkt) (false:
// not ECN-capable); void free(Pkt).
template <class Ops>
class FaultStage {
 public:
  using Pkt = typename Ops::Pkt;
  static constexpr uint32_t kQueue = 1024;  // frames waiting, per direction
  static constexpr uint64_t kReorderHoldNs = 1'000'000;

  FaultStage(Ops ops, stats::LcoreCounters& ctr, const FaultCtrs& names)
      : ops_(ops), ctr_(ctr), names_(names), q_(new Slot[kQueue]) {}
  ~FaultStage() { drain(); }
  FaultStage(const FaultStage&) = delete;
  FaultStage& operator=(const FaultStage&) = delete;

  // Control thread, lcore parked. Frames already queued keep their times.
  void set(const config::FaultDirConfig& d, uint64_t seed) {
    d_ = d;
    on_ = fault_on(d);
    rng_ = seed;
    burst_left_ = 0;
    link_.set(d.rate_mbps, uint64_t{d.queue_kb} * 1024,
              uint64_t{d.ecn_kb} * 1024);
  }
  bool on() const { return on_; }
  // Frames waiting (queued, delayed or held back).
  bool pending() const { return n_ || held_; }

  // A frame enters the stage at `now`.
  void push_st(Pkt p, uint64_t now) {
    if (burst_left_) {
      --burst_left_;
      return lose(p, names_.burst_drop);
    }
    if (chance(d_.burst_ppm)) {
      burst_left_ = d_.burst_len - 1;
      return lose(p, names_.burst_drop);
    }
    if (chance(d_.drop_ppm)) return lose(p, names_.drop);
    if (chance(d_.corrupt_ppm)) {
      ops_.corrupt(p, next());
      ctr_.inc(names_.corrupt);
    }
    Pkt dup{};
    if (chance(d_.duplicate_ppm)) {
      dup = ops_.copy(p);
      if (dup) ctr_.inc(names_.duplicate);
    }
    if (!held_ && chance(d_.reorder_ppm)) {
      held_ = p;
      held_gap_ = d_.reorder_gap;
      held_since_ = now;
      ctr_.inc(names_.reorder);
    } else {
      enqueue(p, now);
    }
    if (dup) enqueue(dup, now);
  }

  // Hands every frame due at `now` to out(Pkt), in order. Returns the count.
  template <class F>
  uint32_t pop_st(uint64_t now, F&& out) {
    if (held_ && now - held_since_ >= kReorderHoldNs) release_held(now);
    uint32_t k = 0;
    while (n_ && q_[head_].due <= now) {
      out(q_[head_].p);
      head_ = (head_ + 1) % kQueue;
      --n_;
      ++k;
    }
    return k;
  }

  // Frees every waiting frame (shutdown).
  void drain() {
    while (n_) {
      ops_.free(q_[head_].p);
      head_ = (head_ + 1) % kQueue;
      --n_;
    }
    if (held_) ops_.free(held_);
    held_ = Pkt{};
  }

 private:
  struct Slot {
    Pkt p{};
    uint64_t due = 0;
  };

  uint64_t next() {  // splitmix64
    uint64_t z = (rng_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  bool chance(uint32_t ppm) { return ppm && next() % 1'000'000 < ppm; }
  void lose(Pkt p, stats::Ctr c) {
    ctr_.inc(c);
    ops_.free(p);
  }

  // Bottleneck (rate, buffer, ECN), then delay; FIFO so `due` only grows.
  void enqueue(Pkt p, uint64_t now) {
    uint64_t depart = now;
    switch (link_.admit(now, ops_.len(p), &depart)) {
      case transport::Bottleneck::Verdict::kDrop:
        return lose(p, names_.queue_drop);
      case transport::Bottleneck::Verdict::kMark:
        if (ops_.mark_ce(p)) ctr_.inc(names_.ce);
        break;
      case transport::Bottleneck::Verdict::kPass:
        break;
    }
    const uint64_t due =
        std::max(depart + uint64_t{d_.delay_us} * 1000, last_due_);
    if (n_ == kQueue) return lose(p, names_.queue_drop);
    q_[(head_ + n_) % kQueue] = {p, due};
    ++n_;
    last_due_ = due;
    if (held_ && --held_gap_ == 0) release_held(now);
  }
  void release_held(uint64_t now) {
    Pkt p = held_;
    held_ = Pkt{};
    enqueue(p, now);
  }

  Ops ops_;
  stats::LcoreCounters& ctr_;
  FaultCtrs names_;
  config::FaultDirConfig d_;
  bool on_ = false;
  uint64_t rng_ = 0;
  uint32_t burst_left_ = 0;
  transport::Bottleneck link_;
  uint64_t last_due_ = 0;
  std::unique_ptr<Slot[]> q_;
  uint32_t head_ = 0, n_ = 0;
  Pkt held_{};
  uint32_t held_gap_ = 0;
  uint64_t held_since_ = 0;
};

}  // namespace urnic::service
