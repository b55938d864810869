// Per-lcore counters: one enum, one name table checked against it at
// compile time, one writer (the owning lcore) and relaxed-atomic readers.
#pragma once

#include <atomic>
#include <cstdint>

#include "dataplane/wire/codec.h"

namespace urnic::stats {

// clang-format off
#define URNIC_COUNTERS(X)                                                    \
  X(rx_packets)        X(rx_bytes)          X(tx_packets)                    \
  X(tx_bytes)          X(tx_dropped)        X(rx_bursts)                     \
  X(roce_rx)           X(not_for_us)                                         \
  X(vlan_mismatch)     X(other_l2)          X(non_roce_ignored)              \
  X(arp_rx_request)    X(arp_rx_reply)      X(arp_tx_request)                \
  X(arp_tx_reply)      X(arp_ignored)       X(icmp_echo_rx)                  \
  X(icmp_echo_tx)      X(icmp_other)        X(icmp6_echo_rx)                 \
  X(icmp6_echo_tx)     X(icmp6_other)       X(nd_rx_ns)                      \
  X(nd_rx_na)          X(nd_tx_ns)          X(nd_tx_na)                      \
  X(nd_ignored)        X(neigh_resolved)    X(neigh_failed)                  \
  X(neigh_table_full)  X(pending_queued)    X(pending_sent)                  \
  X(pending_dropped)   X(malformed)         X(poll_busy)                     \
  X(poll_idle)         X(cycles_busy)       X(cycles_idle)               \
  X(icmp_echo_reply_rx) X(icmp_echo_req_tx) X(commands)                     \
  X(roce_loopback)     X(roce_handoff)      X(roce_handoff_dropped)          \
  X(shim_wqes)         X(tx_zero_copy)      X(doorbells)                     \
  X(tx_copy_bytes)     X(tx_zero_copy_bytes)                                 \
  X(tx_ring_full)      X(gsi_rx)            X(gsi_dropped)                   \
  X(rx_fault_drop)     X(rx_fault_burst_drop) X(rx_fault_corrupt)            \
  X(rx_fault_duplicate) X(rx_fault_reorder) X(rx_fault_queue_drop)           \
  X(rx_fault_ce_marked) X(tx_fault_drop)    X(tx_fault_burst_drop)           \
  X(tx_fault_corrupt)  X(tx_fault_duplicate) X(tx_fault_reorder)             \
  X(tx_fault_queue_drop) X(tx_fault_ce_marked) X(tx_bursts)           \
  X(roce_handoff_held) X(rx_held)          X(lcore_pauses)                  \
  X(lcore_paused_us)   X(timers_deferred)   X(mcast_rx)                      \
  X(mcast_not_joined)  X(mcast_loopback)    X(igmp_queries_rx)               \
  X(igmp_queries_ignored) X(igmp_reports_tx) X(igmp_other)                 \
  X(idle_sleeps)        X(idle_sleeps_no_qp)  X(idle_waits)                   \
  X(idle_wait_timeouts) X(idle_wakes_rx)
// clang-format on

enum class Ctr : uint16_t {
#define URNIC_CTR_ENUM(n) n,
  URNIC_COUNTERS(URNIC_CTR_ENUM)
#undef URNIC_CTR_ENUM
      kCount
};
constexpr size_t kNumCtr = static_cast<size_t>(Ctr::kCount);
constexpr const char* kCtrNames[] = {
#define URNIC_CTR_NAME(n) #n,
    URNIC_COUNTERS(URNIC_CTR_NAME)
#undef URNIC_CTR_NAME
};
static_assert(std::size(kCtrNames) == kNumCtr);

constexpr size_t kNumMalformed = static_cast<size_t>(wire::Malformed::kCount);

// Written only by its owning lcore: a plain load+store (no locked RMW) is
// enough for one writer; readers on other threads load relaxed.
struct alignas(64) LcoreCounters {
  std::atomic<uint64_t> v[kNumCtr] = {};
  std::atomic<uint64_t> malformed[kNumMalformed] = {};

  void add(Ctr c, uint64_t n = 1) { bump(v[static_cast<size_t>(c)], n); }
  void inc(Ctr c) { add(c, 1); }
  void add_malformed(wire::Malformed m) {
    bump(malformed[static_cast<size_t>(m)], 1);
    inc(Ctr::malformed);
  }
  uint64_t get(Ctr c) const {
    return v[static_cast<size_t>(c)].load(std::memory_order_relaxed);
  }
  uint64_t get(wire::Malformed m) const {
    return malformed[static_cast<size_t>(m)].load(std::memory_order_relaxed);
  }

 private:
  static void bump(std::atomic<uint64_t>& a, uint64_t n) {
    a.store(a.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
};

}  // namespace urnic::stats
