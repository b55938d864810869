// Two competing RC flows through one switch queue, in virtual time: do
// they converge to fair shares, how fast, and what happens to the queue?
// Two transport engines (the real ones, as urnicd runs them) joined by the
// simulated link (dataplane/transport/sim_link.h) whose A->B direction is
// a bottleneck with a buffer and ECN marking. Host A sends RDMA WRITEs on
// N QPs; flow k starts at k x stagger. B counts the payload of the
// packets its responder accepts (the next PSN; not a duplicate, nor one
// dropped after a gap: goodput, not what the wire carried), per QP and
// per bin. Deterministic: the same arguments print the same
// numbers, on any machine, however loaded (time is simulated, not
// measured). Not a test: run by hand or by perf/run-suite.
//
//   build/perf/converge [flows=2] [stagger_ms=20] [ms=200] [bin_ms=2]
//       [rate_mbps=10000] [line_mbps=25000] [queue_kb=256] [ecn_kb=32]
//       [delay_us=2] [loss=P] [msg=65536] [depth=16] [fair=0.8]
//       [timeline=1] [check_ms=N] [stop_ms=N keep=K [check_stop_ms=N]]
//       [transport.KEY=VALUE]...
//
// transport.KEY=VALUE: urnicd's configuration keys (config/README.md),
// e.g. transport.cc.algorithm=window or transport.cc.dcqcn.rpg_ai_rate=20;
// the engines get exactly the settings urnicd would make of them
// (service/engine_config.h), its defaults otherwise.
// rate_mbps=0: no switch queue (the hosts' line rate is the limit).
// loss: the probability that the link loses a frame, each direction.
//
// check_ms: exit 1 unless the flows converged within N ms (a regression
// check of the congestion control, deterministic).
// "Converged": from some bin on, to the end of the run, every bin's
// slowest flow gets at least `fair` of its fastest flow's bytes (0.8 is
// Jain's index >= 0.988 for two flows). Printed as the time from the last
// flow's start.
//
// stop_ms: from then on only the first `keep` flows post new messages; the
// others finish what they posted and go quiet, rate-limited as they were.
// Printed: how long the kept flows take to get together 90 % of what all
// flows got before the stop (rate-limited QPs that went quiet must not
// slow the busy ones' increases: DcqcnShare); check_stop_ms: exit 1
// unless within N ms.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "config/urnic_config.h"
#include "dataplane/service/engine_config.h"
#include "dataplane/transport/engine.h"
#include "dataplane/transport/sim_link.h"
#include "dataplane/wire/codec.h"
#include "tests/support/engine_host.h"

namespace {

using namespace urnic;
using namespace urnic::transport;

constexpr uint64_t kUs = 1000, kMs = 1000 * kUs;

struct Args {
  uint64_t flows = 2, stagger_ms = 20, ms = 200, bin_ms = 2;
  uint64_t rate_mbps = 10'000, line_mbps = 25'000;
  uint64_t queue_kb = 256, ecn_kb = 32, delay_us = 2;
  uint64_t msg = 65536, depth = 16;
  double fair = 0.8;
  double loss = 0;  // random loss on the link, both directions
  uint64_t timeline = 1;
  uint64_t check_ms = 0;           // exit 1 unless converged within this
  uint64_t stop_ms = 0, keep = 1;  // flows >= keep stop posting at stop_ms
  uint64_t check_stop_ms = 0;      // exit 1 unless the kept flows got 90 %
  config::Config cfg;              // urnicd's, with the transport.* arguments
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(
      stderr,
      "converge: %s\nusage: converge [flows=N] [stagger_ms=N] "
      "[ms=N] [bin_ms=N] [rate_mbps=N] [line_mbps=N] [queue_kb=N] "
      "[ecn_kb=N] [delay_us=N] [loss=P] [msg=N] [depth=N] [fair=F] "
      "[timeline=0|1] [check_ms=N] [stop_ms=N keep=K [check_stop_ms=N]] "
      "[transport.KEY=VALUE]...\n",
      why);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  std::map<std::string, uint64_t*> u = {{"flows", &a.flows},
                                        {"stagger_ms", &a.stagger_ms},
                                        {"ms", &a.ms},
                                        {"bin_ms", &a.bin_ms},
                                        {"rate_mbps", &a.rate_mbps},
                                        {"line_mbps", &a.line_mbps},
                                        {"queue_kb", &a.queue_kb},
                                        {"ecn_kb", &a.ecn_kb},
                                        {"delay_us", &a.delay_us},
                                        {"msg", &a.msg},
                                        {"depth", &a.depth},
                                        {"timeline", &a.timeline},
                                        {"check_ms", &a.check_ms},
                                        {"stop_ms", &a.stop_ms},
                                        {"keep", &a.keep},
                                        {"check_stop_ms", &a.check_stop_ms}};
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    const char* eq = std::strchr(argv[i], '=');
    if (!eq) usage(argv[i]);
    const std::string k(argv[i], static_cast<size_t>(eq - argv[i]));
    const char* v = eq + 1;
    char* end = nullptr;
    if (k.rfind("transport.", 0) == 0) {
      overrides.push_back(argv[i]);
    } else if (k == "loss") {
      a.loss = std::strtod(v, &end);
      if (*end || a.loss < 0 || a.loss >= 1) usage("loss is in [0, 1)");
    } else if (k == "fair") {
      a.fair = std::strtod(v, &end);
      if (*end || a.fair <= 0 || a.fair > 1) usage("fair is in (0, 1]");
    } else if (auto it = u.find(k); it != u.end()) {
      *it->second = std::strtoull(v, &end, 10);
      if (!*v || *end) usage(argv[i]);
    } else {
      usage(argv[i]);
    }
  }
  if (a.flows < 1 || a.flows > 64) usage("flows is 1..64");
  if (!a.bin_ms || !a.ms || !a.line_mbps || !a.depth)
    usage("bin_ms, ms, line_mbps and depth must be positive");
  if (a.msg < 1 || a.msg > (1u << 20)) usage("msg is 1..1048576");
  if (a.stop_ms && (a.stop_ms >= a.ms || !a.keep || a.keep >= a.flows))
    usage("stop_ms is below ms, keep is 1..flows-1");
  if (a.check_stop_ms && !a.stop_ms) usage("check_stop_ms needs stop_ms");
  // The stopped flows get nothing after the stop, so no run converges.
  if (a.check_ms && a.stop_ms) usage("check_ms and stop_ms do not go together");
  try {
    a.cfg = config::parse(config::embedded_default(), "<converge>", overrides);
  } catch (const config::ConfigError& e) {
    usage(e.what());
  }
  return a;
}

// A NIC transmit queue at line rate, a few µs deep, into the link.
class LineIo final : public PacketIo {
 public:
  LineIo(SimLink& link, int ep, const uint64_t* now, uint64_t line_mbps)
      : link_(link), ep_(ep), now_(now), ns_per_byte_(8000.0 / line_mbps) {}
  bool transmit(const TxFrame& f) override {
    const uint64_t now = *now_;
    const uint64_t start = std::max(now, free_at_);
    if (start - now > kQueueNs) return false;
    buf_.resize(f.frame_len());
    f.copy_to(buf_.data());
    free_at_ = start + static_cast<uint64_t>(buf_.size() * ns_per_byte_);
    link_.send(ep_, buf_, free_at_);
    return true;
  }
  uint64_t room_at() const {
    return free_at_ > kQueueNs / 2 ? free_at_ - kQueueNs / 2 : 0;
  }

 private:
  static constexpr uint64_t kQueueNs = 4 * kUs;
  SimLink& link_;
  int ep_;
  const uint64_t* now_;
  double ns_per_byte_;
  uint64_t free_at_ = 0;
  std::vector<uint8_t> buf_;
};

// A host (test::EngineHost) whose NIC sends at line rate into the link.
struct Host : test::EngineHost {
  std::unique_ptr<LineIo> io;
  Host(uint8_t id, uint8_t peer, SimLink& link, const uint64_t* now,
       const Args& a)
      : io(std::make_unique<LineIo>(link, id - 1, now, a.line_mbps)) {
    if (init(id, peer, 2 * a.msg * a.depth, *io,
             service::engine_config(a.cfg.transport, a.line_mbps)))
      usage("could not set up a host");
  }
};

class Run {
 public:
  explicit Run(const Args& a)
      : a_(a),
        link_([&] {
          SimLinkParams l;
          l.delay_ns = a.delay_us * kUs;
          l.rate_mbps = a.rate_mbps;  // A->B: the bottleneck
          l.queue_bytes = a.queue_kb * 1024;
          l.ecn_bytes = a.ecn_kb * 1024;
          l.loss = a.loss;
          return l;
        }()),
        a_host_(1, 2, link_, &now_, a),
        b_host_(2, 1, link_, &now_, a) {
    bins_ = a.ms / a.bin_ms;
    for (uint64_t k = 0; k < a.flows; ++k) {
      Flow f;
      QpInitAttr ia;
      ia.pd = a_host_.pd;
      ia.send_cq = ia.recv_cq = a_host_.cq;
      ia.cap = {static_cast<uint32_t>(a.depth), 1, 1, 1, 0};
      QpInitAttr ib = ia;
      ib.pd = b_host_.pd;
      ib.send_cq = ib.recv_cq = b_host_.cq;
      if (a_host_.eng->create_qp(ia, &f.qa) ||
          b_host_.eng->create_qp(ib, &f.qb))
        usage("could not create the QPs");
      test::QpPath pa, pb;
      pa.peer_qpn = f.qb->qpn();
      test::EngineHost::gid(2, pa.peer_gid);
      pb.peer_qpn = f.qa->qpn();
      test::EngineHost::gid(1, pb.peer_gid);
      if (test::bring_up(*a_host_.eng, f.qa, pa) ||
          test::bring_up(*b_host_.eng, f.qb, pb))
        usage("could not connect the QPs");
      f.start = k * a.stagger_ms * kMs;
      f.expect = pa.sq_psn & transport::kPsnMask;
      f.bytes.assign(bins_, 0);
      flows_.push_back(std::move(f));
    }
  }

  void run();
  int report() const;
  // ms from the stopped flows' going quiet to 90 %; UINT64_MAX: never.
  uint64_t report_stop(uint64_t first_bin) const;

 private:
  struct Flow {
    Qp* qa = nullptr;
    Qp* qb = nullptr;
    uint64_t start = 0;
    bool started = false;
    uint64_t posted = 0, done = 0;
    std::vector<uint64_t> bytes;  // payload B accepted, per bin
    uint32_t expect = 0;          // the next PSN B's responder takes
  };

  void post(Flow& f) {
    const uint64_t slot = f.posted % a_.depth;
    SendWr w;
    w.wr_id = static_cast<uint64_t>(&f - flows_.data());
    w.opcode = IBV_WR_RDMA_WRITE;
    w.send_flags = IBV_SEND_SIGNALED;
    w.num_sge = 1;
    w.sg_list[0] = {
        reinterpret_cast<uint64_t>(a_host_.mem.data()) + slot * a_.msg,
        static_cast<uint32_t>(a_.msg), a_host_.mr->lkey()};
    w.remote_addr =
        reinterpret_cast<uint64_t>(b_host_.mem.data()) + slot * a_.msg;
    w.rkey = b_host_.mr->rkey();
    if (a_host_.eng->post_send(f.qa, w)) usage("post_send failed");
    ++f.posted;
  }
  uint32_t deliver(Host& to, int ep);
  uint32_t completions();

  Args a_;
  SimLink link_;
  uint64_t now_ = 0;
  Host a_host_, b_host_;
  uint64_t bins_ = 0;
  std::vector<Flow> flows_;
  std::vector<std::vector<uint8_t>> rx_;
  // Per bin: the bytes arriving frames found queued ahead, and how many.
  std::vector<double> queue_sum_;
  std::vector<uint64_t> queue_n_;
};

uint32_t Run::deliver(Host& to, int ep) {
  rx_.clear();
  link_.receive(ep, now_, rx_);
  const uint64_t bin = std::min(now_ / (a_.bin_ms * kMs), bins_ - 1);
  for (std::vector<uint8_t>& f : rx_) {
    wire::FrameInfo fi;
    const uint32_t len = static_cast<uint32_t>(f.size());
    wire::decode(f.data(), len, fi);
    if (fi.kind != wire::FrameKind::kRoce) continue;
    if (ep == 1) {  // A's data reaching B: credit its flow
      for (Flow& fl : flows_) {
        if (fl.qb->qpn() != fi.roce.dqpn || fi.roce.psn != fl.expect) continue;
        fl.bytes[bin] += fi.roce.payload_len;
        fl.expect = transport::psn_add(fl.expect, 1);
      }
    }
    const wire::ConstBuf seg{f.data(), len};
    to.eng->rx(fi, {&seg, 1}, now_);
  }
  return static_cast<uint32_t>(rx_.size());
}

uint32_t Run::completions() {
  ibv_wc wc[64];
  uint32_t n = 0;
  for (int k; (k = a_host_.cq->poll(wc)) > 0;) {
    for (int i = 0; i < k; ++i) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        std::fprintf(stderr, "converge: flow %" PRIu64 " failed: status %d\n",
                     wc[i].wr_id, static_cast<int>(wc[i].status));
        std::exit(1);
      }
      Flow& f = flows_[wc[i].wr_id];
      ++f.done;
      const bool stopped =
          a_.stop_ms && now_ >= a_.stop_ms * kMs && wc[i].wr_id >= a_.keep;
      if (now_ < a_.ms * kMs && !stopped) post(f);
    }
    n += static_cast<uint32_t>(k);
  }
  for (int k; (k = b_host_.cq->poll(wc)) > 0;) n += static_cast<uint32_t>(k);
  return n;
}

void Run::run() {
  queue_sum_.assign(bins_, 0);
  queue_n_.assign(bins_, 0);
  uint64_t admitted = 0;  // the queue's running sums, last read
  double ahead = 0;
  while (now_ < a_.ms * kMs) {
    uint32_t work = 0;
    for (Flow& f : flows_) {
      if (!f.started && now_ >= f.start) {
        f.started = true;
        for (uint64_t i = 0; i < a_.depth; ++i) post(f);
        ++work;
      }
    }
    work += deliver(b_host_, 1) + deliver(a_host_, 0);
    work += a_host_.eng->poll(now_) + b_host_.eng->poll(now_);
    work += completions();
    // What the frames admitted since the last pass found queued ahead.
    const Bottleneck& q = link_.queue(0);
    const uint64_t bin = std::min(now_ / (a_.bin_ms * kMs), bins_ - 1);
    queue_sum_[bin] += q.ahead_sum() - ahead;
    queue_n_[bin] += q.admitted() - admitted;
    ahead = q.ahead_sum();
    admitted = q.admitted();
    if (work) continue;
    uint64_t next =
        std::min({now_ + kUs, link_.next_arrival(0), link_.next_arrival(1)});
    for (Host* h : {&a_host_, &b_host_})
      if (h->eng->busy()) next = std::min(next, h->io->room_at());
    now_ = std::max(next, now_ + 1);
  }
}

int Run::report() const {
  const uint64_t n = flows_.size();
  const double bin_s = static_cast<double>(a_.bin_ms) / 1000;
  auto gbps = [&](uint64_t bytes) { return bytes * 8 / bin_s / 1e9; };
  std::printf("converge: %" PRIu64 " flows (WRITE %" PRIu64 " B x %" PRIu64
              "), cc=%s, %" PRIu64 " Mb/s bottleneck from %" PRIu64
              " Mb/s hosts, %" PRIu64 " KiB buffer, ECN above %" PRIu64
              " KiB, %" PRIu64 " us one-way, flow k starts at k x %" PRIu64
              " ms, %" PRIu64 " ms simulated\n",
              n, a_.msg, a_.depth, a_.cfg.transport.cc.algorithm.c_str(),
              a_.rate_mbps, a_.line_mbps, a_.queue_kb, a_.ecn_kb, a_.delay_us,
              a_.stagger_ms, a_.ms);
  const uint64_t last_start = flows_.back().start;
  const uint64_t first_bin = last_start / (a_.bin_ms * kMs);
  // From the last start on: the first bin after which every bin is fair.
  uint64_t conv = bins_;
  for (uint64_t b = bins_; b-- > first_bin;) {
    uint64_t lo = UINT64_MAX, hi = 0;
    for (const Flow& f : flows_) {
      lo = std::min(lo, f.bytes[b]);
      hi = std::max(hi, f.bytes[b]);
    }
    if (hi == 0 || static_cast<double>(lo) < a_.fair * hi) break;
    conv = b;
  }
  if (a_.timeline) {
    std::printf("  %8s", "t ms");
    for (uint64_t k = 0; k < n && k < 8; ++k)
      std::printf("  flow%-2" PRIu64 "Gb/s", k);
    std::printf("  %10s %9s\n", "Jain", "queue KiB");
    for (uint64_t b = 0; b < bins_; ++b) {
      double s = 0, s2 = 0;
      std::printf("  %8" PRIu64, b * a_.bin_ms);
      uint64_t active = 0;
      for (uint64_t k = 0; k < n; ++k) {
        const double r = gbps(flows_[k].bytes[b]);
        if (k < 8) std::printf("  %10.3f", r);
        if (flows_[k].start <= b * a_.bin_ms * kMs) {
          s += r;
          s2 += r * r;
          ++active;
        }
      }
      std::printf("  %10.3f %9.1f%s\n", s2 > 0 ? s * s / (active * s2) : 0.0,
                  queue_n_[b] ? queue_sum_[b] / queue_n_[b] / 1024 : 0.0,
                  b == conv ? "  <- converged" : "");
    }
  }
  // Summary over the time all flows ran.
  uint64_t total = 0;
  std::vector<uint64_t> per(n, 0);
  for (uint64_t k = 0; k < n; ++k)
    for (uint64_t b = first_bin; b < bins_; ++b) per[k] += flows_[k].bytes[b];
  double s = 0, s2 = 0;
  for (uint64_t k = 0; k < n; ++k) {
    total += per[k];
    s += static_cast<double>(per[k]);
    s2 += static_cast<double>(per[k]) * static_cast<double>(per[k]);
  }
  const double secs = static_cast<double>(bins_ - first_bin) * bin_s;
  const SimLinkStats& st = link_.stats(0);
  double q = 0;
  uint64_t qn = 0;
  for (uint64_t b = first_bin; b < bins_; ++b) {
    q += queue_sum_[b];
    qn += queue_n_[b];
  }
  const EngineCounters& ca = a_host_.eng->counters();
  const EngineCounters& cb = b_host_.eng->counters();
  const uint64_t data = ca.get(ECtr::tx_packets);
  std::printf(
      "  all flows on: %.3f Gb/s (%.1f %% of the bottleneck), Jain %.3f; "
      "queue seen by arrivals: mean %.1f KiB, peak %.1f KiB; drops %" PRIu64
      " CE %" PRIu64 " | A: tx %" PRIu64 " retx %" PRIu64
      " (%.2f %%) timeouts %" PRIu64 " CNPs rx %" PRIu64 " rate cuts %" PRIu64
      " window cuts %" PRIu64 " | B: CNPs tx %" PRIu64 "\n",
      total * 8 / secs / 1e9,
      100.0 * total * 8 / secs / 1e6 /
          static_cast<double>(a_.rate_mbps ? a_.rate_mbps : a_.line_mbps),
      s2 > 0 ? s * s / (static_cast<double>(n) * s2) : 0.0,
      qn ? q / qn / 1024 : 0.0, link_.queue(0).peak_bytes() / 1024,
      st.queue_drops, st.ce_marked, data, ca.get(ECtr::retransmits),
      data ? 100.0 * ca.get(ECtr::retransmits) / data : 0.0,
      ca.get(ECtr::timeouts), ca.get(ECtr::cnps_rx), ca.get(ECtr::cc_rate_cuts),
      ca.get(ECtr::cc_window_cuts), cb.get(ECtr::cnps_tx));
  for (uint64_t k = 0; k < n && k < 8; ++k) {
    const QpCounters& c = flows_[k].qa->counters();
    std::printf("  flow %" PRIu64 ": %" PRIu64 " messages, tx %" PRIu64
                " retx %" PRIu64 " CNPs rx %" PRIu64 " rate cuts %" PRIu64
                " window %" PRIu64 " rate now %" PRIu64 " Mb/s\n",
                k, flows_[k].done, c.tx_packets.get(), c.retransmits.get(),
                c.cnps_rx.get(), c.cc_rate_cuts.get(), c.cc_window.get(),
                c.cc_rate_mbps.get());
  }
  const uint64_t conv_ms = (conv - first_bin) * a_.bin_ms;
  if (conv < bins_) {
    std::printf("  converged (every %" PRIu64 " ms bin within %.0f %%) %" PRIu64
                " ms after the last flow started\n",
                a_.bin_ms, 100 * (1 - a_.fair), conv_ms);
  } else if (first_bin >= bins_) {
    std::printf("  the last flow starts after the run: ms=%" PRIu64
                " is shorter than flows x stagger_ms\n",
                bins_ * a_.bin_ms);
  } else {
    std::printf("  not converged within %" PRIu64 " ms of the last start\n",
                (bins_ - first_bin) * a_.bin_ms);
  }
  const uint64_t stop_ms = a_.stop_ms ? report_stop(first_bin) : 0;
  if (a_.check_stop_ms && stop_ms > a_.check_stop_ms) {
    std::printf("FAIL: the kept flows not at 90 %% within %" PRIu64 " ms\n",
                a_.check_stop_ms);
    return 1;
  }
  if (a_.check_ms && (conv >= bins_ || conv_ms > a_.check_ms)) {
    std::printf("FAIL: not converged within %" PRIu64 " ms\n", a_.check_ms);
    return 1;
  }
  return 0;
}

uint64_t Run::report_stop(uint64_t first_bin) const {
  const uint64_t stop_bin = a_.stop_ms / a_.bin_ms;
  const double bin_s = static_cast<double>(a_.bin_ms) / 1000;
  auto bin_gbps = [&](uint64_t b, uint64_t flows) {
    uint64_t sum = 0;
    for (uint64_t k = 0; k < flows; ++k) sum += flows_[k].bytes[b];
    return static_cast<double>(sum) * 8 / bin_s / 1e9;
  };
  double before = 0;
  for (uint64_t b = first_bin; b < stop_bin; ++b)
    before += bin_gbps(b, flows_.size());
  if (stop_bin <= first_bin) {
    std::printf("  stop_ms is before the last flow started\n");
    return UINT64_MAX;
  }
  before /= static_cast<double>(stop_bin - first_bin);
  // The stopped flows finish the messages they had posted first: count
  // from the first bin in which none of them delivered anything.
  uint64_t quiet = stop_bin;
  while (quiet < bins_ &&
         bin_gbps(quiet, flows_.size()) > bin_gbps(quiet, a_.keep))
    ++quiet;
  uint64_t reached = bins_;
  for (uint64_t b = quiet; b < bins_ && reached == bins_; ++b)
    if (bin_gbps(b, a_.keep) >= 0.9 * before) reached = b;
  std::printf("  %" PRIu64 " of %zu flows stopped posting at %" PRIu64
              " ms and were quiet from %" PRIu64 " ms; the other %" PRIu64
              " got (Gb/s per %" PRIu64 " ms bin from then)",
              flows_.size() - a_.keep, flows_.size(), a_.stop_ms,
              quiet * a_.bin_ms, a_.keep, a_.bin_ms);
  for (uint64_t b = quiet; b < bins_ && b < quiet + 8; ++b)
    std::printf(" %.2f", bin_gbps(b, a_.keep));
  if (reached == bins_) {
    std::printf("; never 90 %% of the %.3f Gb/s all got before\n", before);
    return UINT64_MAX;
  }
  const uint64_t ms = (reached - quiet + 1) * a_.bin_ms;
  std::printf("; 90 %% of the %.3f Gb/s all got before %" PRIu64 " ms later\n",
              before, ms);
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  Run r(a);
  r.run();
  return r.report();
}
