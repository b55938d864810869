// Loss-driven congestion window of an RC requester: how many packets (PSNs)
// a QP may have unacknowledged, for ports where nobody marks ECN. AIMD as
// in TCP NewReno (RFC 5681/6582), counted in packets: slow start to
// ssthresh, then one packet per window of ACKed packets; a loss (a go-back
// after a sequence NAK or a response gap) halves the window once per
// window of data (the recovery point), but not below the pipe the path
// was seen to hold (PipeEstimate); a retransmit timeout drops it to the
// minimum. The wire behaviour stays IBTA go-back-N (9.7.5.2.2); what changes
// is how much is resent at once: a loss costs a window cut, not a storm.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "dataplane/transport/psn.h"

namespace urnic::transport {

// DCQCN reaction point (Zhu et al., "Congestion Control for Large-Scale
// RDMA Deployments", SIGCOMM 2015), parameters under the names of NVIDIA
// ConnectX firmware (mlxconfig / mlx5 roce_rp). Rates in Mb/s, times in
// microseconds, alpha and g in 1/1024. The defaults are ConnectX's except
// four time and event scales: a software NIC on shared cores hears a CNP
// every 0.1-1 ms, not every few microseconds, and with alpha decaying every
// 1 us and rate increases every 300 us or 32 KiB, alpha was near 0 at
// each CNP, the cuts were ~1 % and the increases won (perf/README.md,
// "bottleneck"). kConnectXDcqcn below has the firmware's values.
struct DcqcnParams {
  uint32_t rpg_max_rate = 0;  // line rate; 0: the port's link speed
  uint32_t rpg_min_rate = 1;
  uint32_t rate_to_set_on_first_cnp = 0;  // 0: cut from rpg_max_rate
  uint32_t rpg_min_dec_fac = 50;  // %: one cut leaves at least this share
  uint32_t rpg_gd = 11;           // a cut is Rc * alpha / 2^(rpg_gd - 10)
  uint32_t dce_tcp_g = 1019;      // alpha = alpha * g (+ (1 - g) on a CNP)
  uint32_t dce_tcp_rtt = 100;     // alpha update period (ConnectX: 1)
  uint32_t initial_alpha_value = 1023;
  uint32_t rate_reduce_monitor_period = 4;  // at most one cut per period
  // Rate-increase timer (ConnectX: 300) and byte counter, bytes (ConnectX:
  // 32767): increases come from the timer, alike for every QP, so two
  // flows converge within 100 ms (perf/converge; 1000 us / 5 Mb/s /
  // 512 KiB did not in 180 ms), shared between the limited QPs
  // (rpg_time_share_qps) so that many QPs do not fill the switch buffer.
  // perf/README.md "converge".
  uint32_t rpg_time_reset = 100;
  uint32_t rpg_byte_reset = 10485760;
  // F: events per stage before advancing (ConnectX: 1; DCQCN's paper: 5).
  uint32_t rpg_threshold = 5;
  uint32_t rpg_ai_rate = 20;   // additive increase of the target (CX: 5)
  uint32_t rpg_hai_rate = 50;  // hyper increase of the target
  // k: with N > k QPs of one engine rate-limited, each QP's increase timer
  // runs N/k times slower, so together they climb like k QPs. Per-QP
  // timers add up with the QP count (64 QPs through 2 Gb/s filled the
  // switch buffer with fast increases); 0: off, as ConnectX.
  uint32_t rpg_time_share_qps = 2;
};

// What the DCQCN reaction points of one engine share: the QPs its
// increase timer is shared between (rpg_time_share_qps), those that are
// limited() and have something to send. A limited QP whose send queue ran
// dry keeps its rate but is not counted until it has work again, so idle
// QPs do not slow the busy ones' increases.
struct DcqcnShare {
  uint32_t limited = 0;  // QPs whose DcqcnRate is counted(): limited, busy
};

// ConnectX-4 and later firmware defaults (mlxconfig).
constexpr DcqcnParams kConnectXDcqcn = {
    .rpg_max_rate = 0,
    .rpg_min_rate = 1,
    .rate_to_set_on_first_cnp = 0,
    .rpg_min_dec_fac = 50,
    .rpg_gd = 11,
    .dce_tcp_g = 1019,
    .dce_tcp_rtt = 1,
    .initial_alpha_value = 1023,
    .rate_reduce_monitor_period = 4,
    .rpg_time_reset = 300,
    .rpg_byte_reset = 32767,
    .rpg_threshold = 1,
    .rpg_ai_rate = 5,
    .rpg_hai_rate = 50,
    .rpg_time_share_qps = 0,
};

struct CcParams {
  bool window = true;  // false: max_unacked alone limits a QP
  // A loss cuts a window no lower than the pipe (PipeEstimate): random
  // loss then costs go-back-N's resends, not the window. false: halve.
  bool pipe_floor = true;
  uint32_t init_window = 32;  // packets, at RTS and after a reset
  uint32_t min_window = 2;    // packets, after a timeout (and the floor)
  uint32_t max_window = 512;  // packets: EngineConfig::max_unacked
  // The window all RC QPs of one engine (lcore) share (SharedWindow).
  uint32_t shared_init_window = 256;
  uint32_t shared_min_window = 16;
  // The default is no ceiling (the config's 0). Uncapped, the window grown
  // by every ACK while nothing is lost held 1 100-2 900 packets in flight
  // at 256 QPs on a 4096-frame af_packet ring, a standing queue that cost
  // the sender ~1 000 cycles per packet; capped at max_unacked it cost
  // memif's 256 QPs a fifth of their goodput and bought af_packet's none
  // (perf/README.md, "The standing queue"): a knob, not a default.
  uint32_t shared_max_window = 1u << 20;
  // Grants (Engine::cc_may_send, dataplane/NOTES.md): a QP with nothing in
  // flight starts only with room for `grant` packets in the shared window
  // (or while fewer QPs send than it holds grants), in FIFO order; one sending
  // yields after kGrantBursts x grant packets while others wait. Without it,
  // 256 QPs sharing 512 packets each hold two and every packet or two asks for
  // an ACK. 0: off.
  uint32_t grant = 16;
  static constexpr uint32_t kGrantBursts = 4;
  // While the QPs with work would fill the limit twice over with grants, a
  // grant is this many times `grant`: 32 packets, one transmit turn
  // (tx_quantum, 32 KiB) at a 1 KiB MTU. Each turn ends in an ACK, so 256 QPs
  // on one lcore sent 6.3 ACKs per 100 packets with grants of 16 and 4.5 with
  // 32; with 16 QPs (not crowded) the grant stays, as longer ones cost two
  // workers there.
  static constexpr uint32_t kCrowdedGrants = 2;
  // The floor of what grants fill (Engine::cc_limit), min_window per QP
  // with work, is dropped to min_window per QP in flight while the
  // engine's requesters resend more than kFloorResentPct % of what they
  // send: judged per kFloorSample packets sent, and once dropped it stays
  // so for kFloorHold samples. 1 024 QPs kept 2 048 packets in flight into
  // a 512-frame af_packet ring, resent 48 % of them and failed with retry
  // exceeded (perf/README.md, "the grants' floor under heavy loss").
  static constexpr uint32_t kFloorSample = 8192;
  static constexpr uint32_t kFloorResentPct = 10;
  static constexpr uint32_t kFloorHold = 8;
  // ECN (RFC 3168 marks, RoCEv2 CNPs, Annex A17.9): RC data packets leave
  // ECT(0); a responder answers a CE-marked packet with a CNP, at most one
  // per QP per cnp_interval_ns; a CNP cuts the requester's windows as a
  // loss would (once per window of data), without resending anything.
  bool ecn = true;
  uint64_t cnp_interval_ns = 50'000;
  // dcqcn: a CNP cuts the QP's rate (DcqcnRate) instead of its windows;
  // the windows still react to losses.
  bool dcqcn = true;
  DcqcnParams dcqcn_params;
  // A paced QP may send this many bytes at once after a pause (its token
  // bucket's depth): small enough that many QPs' bursts do not overrun a
  // switch buffer together, large enough for an lcore that was off the CPU.
  uint32_t pace_burst_bytes = 4096;
  uint64_t line_rate_mbps = 100'000;  // rpg_max_rate when that is 0
};

// Which sample wins in WindowedBest, and the value of no sample (it loses
// to every sample).
template <typename T>
struct Highest {
  static constexpr T kNone = T{};
  bool operator()(T a, T b) const { return a > b; }
};
template <typename T>
struct Lowest {
  static constexpr T kNone = std::numeric_limits<T>::max();
  bool operator()(T a, T b) const { return a < b; }
};

// The best sample of the last one to two epochs: two buckets of an epoch
// each, this one's and the last one's (a sample counts for one to two
// epochs). get() without a time reads the buckets as of the last sample.
template <typename T, uint64_t kEpochNs, typename Better>
class WindowedBest {
 public:
  void reset() { *this = WindowedBest{}; }
  void on_sample(uint64_t now, T v) {
    roll(now);
    if (Better{}(v, b_[1])) b_[1] = v;
  }
  T get() const { return Better{}(b_[0], b_[1]) ? b_[0] : b_[1]; }
  T get(uint64_t now) {
    roll(now);
    return get();
  }

 private:
  void roll(uint64_t now) {
    if (now - epoch_ < kEpochNs) return;
    b_[0] = now - epoch_ >= 2 * kEpochNs ? Better::kNone : b_[1];
    b_[1] = Better::kNone;
    epoch_ = now;
  }
  T b_[2] = {Better::kNone, Better::kNone};  // the last epoch, this one
  uint64_t epoch_ = 0;
};

// The pipe: how many packets the path holds without a queue, the highest
// delivery rate lately times the lowest round trip lately (BBR's BtlBw x
// RTprop, draft-cardwell-iccrg-bbr-congestion-control 4.1). A window at
// least this large loses no throughput, and as the rate comes from what
// was delivered it is never above what the window let through. Samples:
// one timed packet per round trip (Karn: none across a go-back).
class PipeEstimate {
 public:
  static constexpr uint64_t kRateEpochNs = 10'000'000;    // 10-20 ms
  static constexpr uint64_t kRttEpochNs = 1'000'000'000;  // 1-2 s
  void reset() { *this = PipeEstimate{}; }
  // A round trip of `rtt_ns`, in which `delivered` packets were ACKed.
  void on_sample(uint64_t now, uint64_t rtt_ns, uint64_t delivered) {
    if (rtt_ns == 0) return;
    rtt_.on_sample(now, rtt_ns);
    rate_.on_sample(now, double(delivered) / double(rtt_ns));
  }
  uint32_t packets() const {
    const uint64_t rtt = rtt_.get();
    if (rtt == UINT64_MAX) return 0;
    const double p = rate_.get() * double(rtt);
    return p >= double(UINT32_MAX) ? UINT32_MAX
                                   : static_cast<uint32_t>(std::lround(p));
  }

 private:
  WindowedBest<double, kRateEpochNs, Highest<double>> rate_;  // packets/ns
  WindowedBest<uint64_t, kRttEpochNs, Lowest<uint64_t>> rtt_;
};

// The longest silence of a QP's peer lately (Qp::pause_), 1-2 s.
using RecentMax = WindowedBest<uint64_t, 1'000'000'000, Highest<uint64_t>>;

// A loss cuts `cwnd` in half, but not below the pipe (if it held that
// much) nor below `floor`.
inline uint32_t cut_to(const CcParams& p, uint32_t cwnd, uint32_t floor,
                       const PipeEstimate& pipe) {
  // One pipe, not BBR's two: on this machine's 2 shared vCPUs two pipes at
  // 1 % loss resent 66 % of the packets for 12 % more goodput than one
  // (perf/README.md): go-back-N resends what is in flight at each loss.
  const uint32_t keep = p.pipe_floor ? std::min(cwnd, pipe.packets()) : 0;
  return std::max({cwnd / 2, keep, floor});
}

class LossWindow {
 public:
  // At RTS (sq_psn known) and after a modify to RESET.
  void reset(const CcParams& p, uint32_t psn) {
    cwnd_ = std::clamp(p.init_window, floor(p), p.max_window);
    ssthresh_ = p.max_window;
    acc_ = 0;
    acked_psn_ = psn;
    recovering_ = false;
    delivered_ = 0;
    pipe_.reset();
  }
  uint32_t window() const { return cwnd_; }
  // Packets ACKed since the reset (the pipe's delivery-rate samples).
  uint64_t delivered() const { return delivered_; }
  PipeEstimate& pipe() { return pipe_; }
  const PipeEstimate& pipe() const { return pipe_; }
  uint32_t ssthresh() const { return ssthresh_; }

  // The oldest unacknowledged PSN moved to `psn`: grow by the packets it
  // acknowledges. Returns that number of packets.
  uint32_t on_progress(const CcParams& p, uint32_t psn) {
    const int32_t n = psn_diff(psn, acked_psn_);
    if (n <= 0) return 0;
    acked_psn_ = psn;
    delivered_ += static_cast<uint32_t>(n);
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
    ssthresh_ = cut_to(p, cwnd_, floor(p), pipe_);
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
  uint64_t delivered_ = 0;
  PipeEstimate pipe_;
};

// The DCQCN reaction point of one QP with its pacer. A QP starts unlimited
// (no pacing, no cost); its first CNP sets the current rate Rc and the
// target Rt to the line rate and cuts Rc by alpha/2 (at most one cut per
// rate_reduce_monitor_period); alpha follows the CNPs of each dce_tcp_rtt
// period. Without CNPs, every rpg_time_reset and every rpg_byte_reset bytes
// sent is a rate-increase event: fast recovery (Rc halfway to Rt) for the
// first rpg_threshold events of both counters, then additive increase of
// Rt by rpg_ai_rate, hyper increase by i * rpg_hai_rate once both counters
// passed the threshold; Rc goes halfway to the new Rt. At the line rate
// the QP is unlimited again. Time is passed in (ns), nothing here sleeps:
// the pacer says when the QP may send next and the engine revisits it then.
// Timer events are taken lazily, when the QP sends or gets a CNP, which is
// when the hardware's timer events would show. `share` is the engine's
// (DcqcnShare): every call that may change counted() keeps its count.
class DcqcnRate {
 public:
  void reset(DcqcnShare& share) { set_limited(share, false); }
  // Nothing to send (true) or something (false): nothing_to_send() as the
  // requester, the responder and to_error see it (roles.h).
  void set_idle(DcqcnShare& share, bool idle) {
    if (idle == idle_) return;
    const bool was = counted();
    idle_ = idle;
    recount(share, was);
  }
  bool limited() const { return limited_; }
  bool idle() const { return idle_; }
  bool counted() const { return limited_ && !idle_; }
  double rate_mbps() const { return rc_; }
  // For the cc_rate_mbps counter: 0 while unlimited.
  uint64_t gauge_mbps() const {
    return limited_ ? static_cast<uint64_t>(rc_) : 0;
  }
  double target_mbps() const { return rt_; }
  double alpha() const { return alpha_; }

  // A CNP for this QP. Returns true if the rate was cut.
  bool on_cnp(const CcParams& cc, uint64_t now, DcqcnShare& share) {
    const DcqcnParams& p = cc.dcqcn_params;
    const double line = line_rate(cc);
    if (!limited_) {
      set_limited(share, true);
      alpha_ = std::min(p.initial_alpha_value, 1024u) / 1024.0;
      alpha_ns_ = now;
      cnp_in_period_ = true;
      tokens_ = cc.pace_burst_bytes;
      tokens_ns_ = now;
      if (p.rate_to_set_on_first_cnp) {
        rc_ = rt_ =
            std::clamp(double(p.rate_to_set_on_first_cnp), min_rate(cc), line);
        restart(now);
        return true;
      }
      rc_ = rt_ = line;
    } else {
      update_alpha(p, now);
      cnp_in_period_ = true;
      if (now - cut_ns_ < uint64_t{p.rate_reduce_monitor_period} * 1000)
        return false;
    }
    rt_ = rc_;
    const uint32_t shift = std::clamp(p.rpg_gd, 10u, 20u) - 10;
    const double cut = rc_ * alpha_ / double(1u << shift);
    rc_ = std::max({rc_ - cut, rc_ * std::min(p.rpg_min_dec_fac, 100u) / 100.0,
                    min_rate(cc)});
    restart(now);
    return true;
  }

  // Rate-increase events up to `now` and `bytes` just sent.
  void on_sent(const CcParams& cc, uint64_t now, uint32_t bytes,
               DcqcnShare& share) {
    if (!limited_) return;
    const DcqcnParams& p = cc.dcqcn_params;
    tokens_ -= bytes;
    if (p.rpg_byte_reset) {
      bytes_ += bytes;
      while (limited_ && bytes_ >= p.rpg_byte_reset) {
        bytes_ -= p.rpg_byte_reset;
        increase(cc, &bc_, share);
      }
    }
    advance(cc, now, share);
  }

  // Timer events up to `now`, then: may the QP send a frame now? If not,
  // *at is when it may.
  bool may_send(const CcParams& cc, uint64_t now, uint64_t* at,
                DcqcnShare& share) {
    if (!limited_) return true;
    advance(cc, now, share);
    if (!limited_) return true;
    // Mb/s = bits per microsecond: rc_ / 8000 bytes per nanosecond.
    tokens_ = std::min(tokens_ + double(now - tokens_ns_) * rc_ / 8000.0,
                       double(cc.pace_burst_bytes));
    tokens_ns_ = now;
    if (tokens_ > 0) return true;
    *at = now + static_cast<uint64_t>(-tokens_ * 8000.0 / rc_) + 1;
    return false;
  }

 private:
  static double line_rate(const CcParams& cc) {
    const uint32_t m = cc.dcqcn_params.rpg_max_rate;
    return double(m ? m : cc.line_rate_mbps);
  }
  static double min_rate(const CcParams& cc) {
    return std::clamp(double(cc.dcqcn_params.rpg_min_rate), 1.0, line_rate(cc));
  }
  // After a cut: both increase counters and their stages start over.
  void restart(uint64_t now) {
    cut_ns_ = now;
    timer_ns_ = now;
    bytes_ = 0;
    t_ = bc_ = 0;
  }
  // Closes the alpha periods that ended before `now`: the one a CNP came
  // in raises alpha, the rest decay it.
  void update_alpha(const DcqcnParams& p, uint64_t now) {
    const uint64_t period = uint64_t{std::max(p.dce_tcp_rtt, 1u)} * 1000;
    if (now - alpha_ns_ < period) return;
    const uint64_t n = (now - alpha_ns_) / period;
    const double g = std::min(p.dce_tcp_g, 1024u) / 1024.0;
    alpha_ = cnp_in_period_ ? g * alpha_ + (1 - g) : g * alpha_;
    if (n > 1) alpha_ *= std::pow(g, double(n - 1));
    alpha_ns_ += n * period;
    cnp_in_period_ = false;
  }
  void set_limited(DcqcnShare& share, bool on) {
    const bool was = counted();
    limited_ = on;
    recount(share, was);
  }
  void recount(DcqcnShare& share, bool was) const {
    if (was != counted()) was ? --share.limited : ++share.limited;
  }
  void advance(const CcParams& cc, uint64_t now, DcqcnShare& share) {
    const DcqcnParams& p = cc.dcqcn_params;
    uint64_t period = uint64_t{std::max(p.rpg_time_reset, 1u)} * 1000;
    if (p.rpg_time_share_qps && share.limited > p.rpg_time_share_qps)
      period = period * share.limited / p.rpg_time_share_qps;
    // A long quiet spell takes the QP back to the line rate at once, not
    // through thousands of additive steps on one poll.
    if (now - timer_ns_ > 100'000 * period) set_limited(share, false);
    while (limited_ && now - timer_ns_ >= period) {
      timer_ns_ += period;
      increase(cc, &t_, share);
    }
  }
  // One increase event of the timer (t_) or byte counter (bc_) stage.
  void increase(const CcParams& cc, uint32_t* stage, DcqcnShare& share) {
    const DcqcnParams& p = cc.dcqcn_params;
    const uint32_t f = p.rpg_threshold;
    if (std::max(t_, bc_) < f) {
      // fast recovery: towards the rate before the last cut
    } else if (std::min(t_, bc_) < f) {
      rt_ += p.rpg_ai_rate;
    } else {
      rt_ += double(p.rpg_hai_rate) * (std::min(t_, bc_) - f + 1);
    }
    ++*stage;
    const double line = line_rate(cc);
    rt_ = std::min(rt_, line);
    rc_ = (rt_ + rc_) / 2;
    // Within 1 Mb/s of the line rate (halving never quite gets there).
    if (rc_ >= line - 1) set_limited(share, false);
  }

  bool limited_ = false;
  bool idle_ = false;  // nothing to send (set_idle): not in share.limited
  double rc_ = 0;      // current rate, Mb/s
  double rt_ = 0;      // target rate, Mb/s
  double alpha_ = 1;
  uint64_t alpha_ns_ = 0;  // start of the open alpha period
  bool cnp_in_period_ = false;
  uint64_t cut_ns_ = 0;    // last cut
  uint64_t timer_ns_ = 0;  // last timer event (or cut)
  uint64_t bytes_ = 0;     // sent since the last byte-counter event
  uint32_t t_ = 0;         // timer events since the last cut
  uint32_t bc_ = 0;        // byte-counter events since the last cut
  double tokens_ = 0;      // pacer: bytes that may leave now
  uint64_t tokens_ns_ = 0;
};

// One AIMD window over the packets in flight of all RC QPs of an engine
// (one lcore, in practice one port and few peers): per-QP windows alone add
// up to more than the path holds once there are many QPs (256 QPs x 32
// packets overran a 512-frame af_packet ring at once). Each QP may use its
// share, window / QPs with packets in flight (at least min_window), and
// its own window, whichever is smaller. Grown by every QP's ACKs while at
// least half of it is in use; cut by a loss or timeout of any QP at most
// once per window of data ACKed (losses of one congestion event arrive at
// many QPs).
class SharedWindow {
 public:
  void reset(const CcParams& p) {
    cwnd_ = std::clamp(p.shared_init_window, floor(p), p.shared_max_window);
    ssthresh_ = p.shared_max_window;
    acc_ = 0;
    acked_since_cut_ = 0;
    cut_ = false;
    delivered_ = 0;
    pipe_.reset();
  }
  uint32_t window() const { return cwnd_; }
  uint64_t delivered() const { return delivered_; }
  PipeEstimate& pipe() { return pipe_; }
  // At least `floor` packets (min_window): with one packet in flight every
  // loss is a retransmit timeout, and retry_cnt of them in a row fail the QP.
  // `pool`: divide that instead where it is more than the window (the
  // packets grants fill). Runs for every packet: one division at most.
  uint64_t share(uint32_t active, uint32_t floor, uint64_t pool = 0) const {
    pool = std::max<uint64_t>(pool, cwnd_);
    if (active > 1) pool /= active;
    return std::max<uint64_t>(pool, floor);
  }
  // `n` packets ACKed while `used` were in flight or granted. A window
  // that does not limit is not grown (as RFC 7661 validates TCP's): one QP
  // running alone, its own window 512, grew the shared one to 751 216
  // packets in 3.7 s. 256 QPs starting next were all let in at once, and a
  // window that size is cut once per that many packets ACKed: they then
  // overran a 512-frame af_packet ring for seconds (perf/README.md, "256
  // QPs on a 512-frame ring").
  void on_acked(const CcParams& p, uint32_t n, uint64_t used) {
    acked_since_cut_ += n;
    delivered_ += n;
    if (2 * used < cwnd_) return;
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
    ssthresh_ = cut_to(p, cwnd_, floor(p), pipe_);
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
  uint64_t delivered_ = 0;  // packets ACKed over all QPs
  PipeEstimate pipe_;       // of all QPs together
};

}  // namespace urnic::transport
