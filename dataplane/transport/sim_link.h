// A deterministic simulated link between two endpoints for transport tests
// and benchmarks: seeded loss, duplication, reordering, bit corruption and
// delay with jitter. Same seed, same sends -> same deliveries, so a failing
// seed replays exactly. Test-side code: it allocates freely.
#pragma once

#include <cstdint>
#include <queue>
#include <random>
#include <span>
#include <vector>

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
};

struct SimLinkStats {
  uint64_t sent = 0, lost = 0, duplicated = 0, reordered = 0, corrupted = 0,
           delivered = 0;
};

class SimLink {
 public:
  explicit SimLink(const SimLinkParams& p) : p_(p), rng_(p.seed) {}

  // Endpoint `from` (0 or 1) sends a frame to the other one at `now_ns`.
  void send(int from, std::span<const uint8_t> frame, uint64_t now_ns);
  // Appends frames that reached endpoint `to` by `now_ns`, in arrival order
  // (ties in send order). Returns how many.
  size_t receive(int to, uint64_t now_ns,
                 std::vector<std::vector<uint8_t>>& out);
  // Arrival time of the next frame for `to`; UINT64_MAX if none in flight.
  uint64_t next_arrival(int to) const;
  const SimLinkStats& stats(int from) const { return stats_[from]; }

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
};

}  // namespace urnic::transport
