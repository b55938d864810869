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
  bool window = true;         // false: max_unacked alone limits a QP
  uint32_t init_window = 32;  // packets, at RTS and after a reset
  uint32_t min_window = 2;    // packets, after a timeout (and the floor)
  uint32_t max_window = 512;  // packets: EngineConfig::max_unacked
  // The window all RC QPs of one engine (lcore) share (SharedWindow).
  uint32_t shared_init_window = 256;
  uint32_t shared_min_window = 16;
  uint32_t shared_max_window = 1u << 20;
  // ECN (RFC 3168 marks, RoCEv2 CNPs, Annex A17.9): RC data packets leave
  // ECT(0); a responder answers a CE-marked packet with a CNP, at most one
  // per QP per cnp_interval_ns; a CNP cuts the requester's windows as a
  // loss would (once per window of data), without resending anything.
  bool ecn = true;
  uint64_t cnp_interval_ns = 50'000;
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
  // acknowledges. Returns that number of packets.
  uint32_t on_progress(const CcParams& p, uint32_t psn) {
    const int32_t n = psn_diff(psn, acked_psn_);
    if (n <= 0) return 0;
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
    return static_cast<uint32_t>(n);
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

// One AIMD window over the packets in flight of all RC QPs of an engine
// (one lcore, in practice one port and few peers): per-QP windows alone add
// up to more than the path holds once there are many QPs (256 QPs x 32
// packets overran a 512-frame af_packet ring at once). Each QP may use its
// share, window / QPs with packets in flight (at least min_window), and
// its own window, whichever is smaller. Grown by every QP's ACKs; cut by a
// loss or timeout of any QP at most once per window of data ACKed (losses
// of one congestion event arrive at many QPs).
class SharedWindow {
 public:
  void reset(const CcParams& p) {
    cwnd_ = std::clamp(p.shared_init_window, floor(p), p.shared_max_window);
    ssthresh_ = p.shared_max_window;
    acc_ = 0;
    acked_since_cut_ = 0;
    cut_ = false;
  }
  uint32_t window() const { return cwnd_; }
  // At least `floor` packets (min_window): with one packet in flight every
  // loss is a retransmit timeout, and retry_cnt of them in a row fail the QP.
  uint32_t share(uint32_t active, uint32_t floor) const {
    return std::max(cwnd_ / std::max(active, 1u), floor);
  }
  void on_acked(const CcParams& p, uint32_t n) {
    acked_since_cut_ += n;
    if (cwnd_ < ssthresh_) {
      const uint32_t grow = std::min(n, ssthresh_ - cwnd_);
      cwnd_ += grow;
      n -= grow;
    }
    acc_ += n;
    while (acc_ >= cwnd_ && cwnd_ < p.shared_max_window) {
      acc_ -= cwnd_;
      ++cwnd_;
    }
    cwnd_ = std::min(cwnd_, p.shared_max_window);
  }
  // Returns true if the window was cut.
  bool on_loss(const CcParams& p) {
    if (cut_ && acked_since_cut_ < cwnd_) return false;
    ssthresh_ = std::max(cwnd_ / 2, floor(p));
    cwnd_ = ssthresh_;
    acc_ = 0;
    acked_since_cut_ = 0;
    cut_ = true;
    return true;
  }

 private:
  static uint32_t floor(const CcParams& p) {
    return std::clamp(p.shared_min_window, 1u, p.shared_max_window);
  }
  uint32_t cwnd_ = 256;
  uint32_t ssthresh_ = 1u << 20;
  uint32_t acc_ = 0;
  uint32_t acked_since_cut_ = 0;
  bool cut_ = false;
};

}  // namespace urnic::transport
