// Loss-driven congestion window of an RC requester: how many packets (PSNs)
// a QP may have unacknowledged, for ports where nobody marks ECN. AIMD as
// in TCP NewReno (RFC 5681/6582), counted in packets: slow start to
// ssthresh, then one packet per window of ACKed packets; a loss (a go-back
// after a sequence NAK or a response gap) halves the window once per
// window of data (the recovery point), a retransmit timeout drops it to the
// minimum. The wire behaviour stays IBTA go-back-N (9.7.5.2.2); what changes
// is how much is resent at once: a loss costs a window cut, not a storm.
#pragma once

#include <algorithm>
#include <cstdint>

#include "dataplane/transport/psn.h"

namespace urnic::transport {

struct CcParams {
  bool window = true;        // false: max_unacked alone limits a QP
  uint32_t init_window = 32;  // packets, at RTS and after a reset
  uint32_t min_window = 2;    // packets, after a timeout (and the floor)
  uint32_t max_window = 512;  // packets: EngineConfig::max_unacked
};

class LossWindow {
 public:
  // At RTS (sq_psn known) and after a modify to RESET.
  void reset(const CcParams& p, uint32_t psn) {
    cwnd_ = std::clamp(p.init_window, floor(p), p.max_window);
    ssthresh_ = p.max_window;
    acc_ = 0;
    acked_psn_ = psn;
    recovering_ = false;
  }
  uint32_t window() const { return cwnd_; }
  uint32_t ssthresh() const { return ssthresh_; }

  // The oldest unacknowledged PSN moved to `psn`: grow by the packets it
  // acknowledges.
  void on_progress(const CcParams& p, uint32_t psn) {
    const int32_t n = psn_diff(psn, acked_psn_);
    if (n <= 0) return;
    acked_psn_ = psn;
    if (recovering_ && !psn_before(psn, recover_psn_)) recovering_ = false;
    uint32_t left = static_cast<uint32_t>(n);
    if (cwnd_ < ssthresh_) {  // slow start: one per packet ACKed
      const uint32_t grow = std::min(left, ssthresh_ - cwnd_);
      cwnd_ += grow;
      left -= grow;
    }
    acc_ += left;  // congestion avoidance: one per window ACKed
    while (acc_ >= cwnd_ && cwnd_ < p.max_window) {
      acc_ -= cwnd_;
      ++cwnd_;
    }
    if (cwnd_ >= p.max_window) {
      cwnd_ = p.max_window;
      acc_ = 0;
    }
  }
  // A loss at `psn` was detected (go-back-N starts there); `max_psn` is the
  // next PSN never sent. Returns true if the window was cut: once per
  // window of data, later losses before the recovery point are the same
  // congestion event.
  bool on_loss(const CcParams& p, uint32_t psn, uint32_t max_psn) {
    if (recovering_ && psn_before(psn, recover_psn_)) return false;
    ssthresh_ = std::max(cwnd_ / 2, floor(p));
    cwnd_ = ssthresh_;
    acc_ = 0;
    recovering_ = true;
    recover_psn_ = max_psn;
    return true;
  }
  // The retransmit timer expired: nothing came back for a whole timeout.
  void on_timeout(const CcParams& p, uint32_t max_psn) {
    ssthresh_ = std::max(cwnd_ / 2, floor(p));
    cwnd_ = floor(p);
    acc_ = 0;
    recovering_ = true;
    recover_psn_ = max_psn;
  }

 private:
  static uint32_t floor(const CcParams& p) {
    return std::clamp(p.min_window, 1u, p.max_window);
  }
  uint32_t cwnd_ = 32;
  uint32_t ssthresh_ = 512;
  uint32_t acc_ = 0;        // packets ACKed towards the next increase
  uint32_t acked_psn_ = 0;  // oldest unacknowledged PSN last seen
  uint32_t recover_psn_ = 0;
  bool recovering_ = false;
};

}  // namespace urnic::transport
