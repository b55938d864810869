// A deterministic simulated link between two endpoints for transport tests
// and benchmarks: seeded loss, duplication, reordering, bit corruption and
// delay with jitter, and a switch queue in each direction (a bottleneck
// rate, tail drop, ECN CE marking above a threshold). Same seed, same sends ->
// same deliveries, so a failing seed replays exactly. Test-side code: it
// allocates freely.
#pragma once

#include <cstdint>
#include <queue>
#include <random>
#include <span>
#include <vector>

#include "dataplane/transport/bottleneck.h"

namespace urnic::transport {

struct SimLinkParams {
  uint64_t seed = 1;
  double loss = 0;       // probability a frame is dropped
  double duplicate = 0;  // probability a frame is delivered twice
  double reorder = 0;    // probability a frame is held back
  double corrupt = 0;    // probability one bit of a frame is flipped
  uint64_t delay_ns = 1000;
  uint64_t jitter_ns = 0;            // uniform extra delay
  uint64_t reorder_hold_ns = 20000;  // extra delay of a held-back frame
  // The switch queue (Bottleneck) a frame passes before the impairments
  // above; rate 0: none.
  uint64_t rate_mbps = 0;
  uint64_t queue_bytes = 0;
  uint64_t ecn_bytes = 0;  // 0: no marking
};

struct SimLinkStats {
  uint64_t sent = 0, lost = 0, duplicated = 0, reordered = 0, corrupted = 0,
           delivered = 0, queue_drops = 0, ce_marked = 0;
};

class SimLink {
 public:
  explicit SimLink(const SimLinkParams& p) : p_(p), rng_(p.seed) {
    for (Bottleneck& b : queue_) b.set(p.rate_mbps, p.queue_bytes, p.ecn_bytes);
  }

  // Endpoint `from` (0 or 1) sends a frame to the other one at `now_ns`.
  void send(int from, std::span<const uint8_t> frame, uint64_t now_ns);
  // Appends frames that reached endpoint `to` by `now_ns`, in arrival order
  // (ties in send order). Returns how many.
  size_t receive(int to, uint64_t now_ns,
                 std::vector<std::vector<uint8_t>>& out);
  // Arrival time of the next frame for `to`; UINT64_MAX if none in flight.
  uint64_t next_arrival(int to) const;
  const SimLinkStats& stats(int from) const { return stats_[from]; }
  // The switch queue frames from `from` pass.
  const Bottleneck& queue(int from) const { return queue_[from]; }

 private:
  struct InFlight {
    uint64_t at;
    uint64_t seq;  // tie-break: keeps equal-time frames in send order
    std::vector<uint8_t> bytes;
    bool operator>(const InFlight& o) const {
      return at != o.at ? at > o.at : seq > o.seq;
    }
  };
  bool chance(double p) {
    return p > 0 && std::uniform_real_distribution<>(0, 1)(rng_) < p;
  }
  uint64_t delay();

  SimLinkParams p_;
  std::mt19937_64 rng_;
  uint64_t seq_ = 0;
  std::priority_queue<InFlight, std::vector<InFlight>, std::greater<>> q_[2];
  SimLinkStats stats_[2];
  Bottleneck queue_[2];
};

}  // namespace urnic::transport
