// A switch egress queue: frames leave one after another at `rate_mbps` from
// a buffer of `queue_bytes`; a frame that does not fit is dropped (tail
// drop), one that arrives above `ecn_bytes` of backlog is to be marked CE
// (DCQCN's step marking, Kmin = Kmax). Time is the caller's, in ns. Shared
// by the port's fault stage (dataplane/service/fault.h) and the simulated
// link of the transport tests (sim_link.h), so both model the same queue.
#pragma once

#include <algorithm>
#include <cstdint>

namespace urnic::transport {

class Bottleneck {
 public:
  enum class Verdict { kPass, kMark, kDrop };

  // rate_mbps 0: no bottleneck (every frame passes, departing at once).
  // ecn_bytes 0: no marking.
  void set(uint64_t rate_mbps, uint64_t queue_bytes, uint64_t ecn_bytes) {
    ns_per_byte_ = rate_mbps ? 8'000.0 / static_cast<double>(rate_mbps) : 0;
    queue_ = queue_bytes;
    ecn_ = ecn_bytes;
  }
  bool on() const { return ns_per_byte_ > 0; }

  // A frame of `len` bytes arrives at `now`. Unless it is dropped, *depart
  // is when its last byte has left.
  Verdict admit(uint64_t now, uint32_t len, uint64_t* depart) {
    if (!on()) {
      *depart = now;
      return Verdict::kPass;
    }
    const double ahead = backlog(now);  // bytes held before this frame
    if (ahead + len > static_cast<double>(queue_)) return Verdict::kDrop;
    const uint64_t start = std::max(free_at_, now);
    free_at_ = start + static_cast<uint64_t>(len * ns_per_byte_);
    *depart = free_at_;
    peak_ = std::max(peak_, ahead + len);
    ahead_sum_ += ahead;
    ++admitted_;
    return ecn_ && ahead > static_cast<double>(ecn_) ? Verdict::kMark
                                                     : Verdict::kPass;
  }
  // Bytes waiting at `now`.
  double backlog(uint64_t now) const {
    return on() && free_at_ > now
               ? static_cast<double>(free_at_ - now) / ns_per_byte_
               : 0;
  }
  // The most bytes ever held (this frame included) since construction.
  double peak_bytes() const { return peak_; }
  // Frames admitted, and the sum of the bytes each found ahead of it: their
  // ratio is the mean queue an arriving frame sees.
  uint64_t admitted() const { return admitted_; }
  double ahead_sum() const { return ahead_sum_; }

 private:
  double ns_per_byte_ = 0;
  uint64_t queue_ = 0, ecn_ = 0;
  uint64_t free_at_ = 0;  // when the queue has sent what it holds
  double peak_ = 0;
  double ahead_sum_ = 0;
  uint64_t admitted_ = 0;
};

}  // namespace urnic::transport
