// The receiver's total order across the two QPs (seed 002): frames carry
// a global sequence number; one arriving ahead of the next to deliver
// waits here until the gap before it is filled. At most `window` frames
// are in flight (the credits of both QPs), so a ring of that many entries
// indexed by seq % window holds every early one.
#pragma once

#include <cstdint>
#include <vector>

#include "perf/seeds_common.h"

namespace netfr {

struct Arrival {
  uint64_t seq = 0;
  uint64_t t_ns = 0;  // sender's post time
  uint32_t qp = 0;
  uint32_t buf = 0;
  uint32_t len = 0;
  bool present = false;
};

class Reorder {
 public:
  explicit Reorder(uint32_t window) : slots_(window) {}

  // Takes one arrival; true when it came ahead of the next in order.
  bool insert(const Arrival& a) {
    if (a.seq < next_ || a.seq >= next_ + slots_.size())
      seeds::die(seeds::kCompletion,
                 "frame %llu outside the window [%llu, %llu)",
                 static_cast<unsigned long long>(a.seq),
                 static_cast<unsigned long long>(next_),
                 static_cast<unsigned long long>(next_ + slots_.size()));
    Arrival& s = slots_[a.seq % slots_.size()];
    if (s.present)
      seeds::die(seeds::kCompletion, "frame %llu arrived twice",
                 static_cast<unsigned long long>(a.seq));
    s = a;
    s.present = true;
    return a.seq != next_;
  }

  // The next frame in order, if it is here (valid until pop()).
  const Arrival* front() const {
    const Arrival& s = slots_[next_ % slots_.size()];
    return s.present ? &s : nullptr;
  }
  void pop() {
    slots_[next_ % slots_.size()].present = false;
    ++next_;
  }
  uint64_t next() const { return next_; }

 private:
  std::vector<Arrival> slots_;
  uint64_t next_ = 0;
};

}  // namespace netfr
