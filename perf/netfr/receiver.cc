// netfr receiver: a notify on either QP says a frame is in the ring; the
// frame waits in the reorder window until every earlier sequence number
// is delivered, then it is delivered (checked with --verify, its latency
// taken), its ring buffer is free again, and the QP's credits go back to
// the sender in batches of a quarter ring as a zero-length
// SEND_WITH_IMM carrying the running count.
#include <arpa/inet.h>

#include <algorithm>
#include <cinttypes>

#include "perf/netfr/context_table.h"
#include "perf/netfr/netfr.h"
#include "perf/netfr/reorder.h"

namespace netfr {
namespace {

using seeds::die;
using seeds::now_ns;

constexpr uint64_t kControlNs = 20'000;

struct Ctx {
  enum Kind : uint8_t { kNotify, kCredit } kind = kNotify;
  uint32_t qp = 0;
  uint32_t buf = 0;  // kNotify: the notify receive buffer
};

class Receiver {
 public:
  Receiver(Conn& c, const Options& o)
      : c_(c),
        o_(o),
        p_(c.p),
        // Per QP: its ring's notify receives (reposted with the same
        // context) and the credit SENDs not yet completed, up to its send
        // queue (return_credits).
        table_(kQps * (p_.ring + c.sq_depth)),
        reorder_(kQps * p_.ring),
        credit_batch_(std::max(1u, p_.ring / 4)),
        lat_(p_.count) {}

  int run() {
    for (uint32_t q = 0; q < kQps; ++q)
      for (uint32_t i = 0; i < p_.ring; ++i)
        post_notify_receive(table_.acquire(Ctx{Ctx::kNotify, q, i}));
    // The sender starts once it has our QP ends: receives are posted.
    c_.ch->send_obj(uint32_t{1});
    last_progress_ = last_live_ = now_ns();
    uint64_t last_ctl = 0;
    while (delivered_ < p_.count) {
      poll_cq();
      deliver();
      return_credits();
      const uint64_t now = now_ns();
      if (now - last_ctl < kControlNs) continue;
      last_ctl = now;
      if (c_.ch->readable())
        die(seeds::kPeerLost, "peer lost: side channel closed");
      live(now);
      if (now - last_progress_ > uint64_t{o_.common.timeout_s} * 1'000'000'000)
        die(seeds::kPeerLost, "peer lost: nothing received for %u s",
            o_.common.timeout_s);
    }
    c_.ch->send_obj(Done{seeds::kOk, 0});
    summary();
    c_.ch->wait_close(5000);
    return seeds::kOk;
  }

 private:
  void post_notify_receive(uint64_t wr_id) {
    const Ctx& x = table_.at(wr_id);
    ibv_sge sge{reinterpret_cast<uintptr_t>(c_.notify(x.qp, x.buf)),
                sizeof(Notify), c_.buf.mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    if (const int rc = ibv_post_recv(c_.qp[x.qp], &wr, &bad))
      die(seeds::kSetup, "ibv_post_recv: %s", strerror(rc));
  }

  void poll_cq() {
    ibv_wc wc[32];
    const int n = ibv_poll_cq(c_.cq, 32, wc);
    if (n < 0) die(seeds::kCompletion, "ibv_poll_cq failed (%d)", n);
    if (n == 0) return;
    const uint64_t now = now_ns();
    last_progress_ = now;
    if (!t_first_) t_first_ = now;
    for (int k = 0; k < n; ++k) {
      seeds::check_wc(wc[k]);
      Ctx& x = table_.at(wc[k].wr_id);
      if (x.kind == Ctx::kCredit) {  // a credit SEND went out
        --credit_sends_[x.qp];
        table_.release(wc[k].wr_id);
        continue;
      }
      if (wc[k].byte_len != sizeof(Notify))
        die(seeds::kCompletion, "notify of %u bytes", wc[k].byte_len);
      const Notify nt = *c_.notify(x.qp, x.buf);
      post_notify_receive(wc[k].wr_id);  // the copy above freed its buffer
      if (nt.buf >= p_.ring || nt.len > c_.ring.stride)
        die(seeds::kCompletion, "notify names buffer %u, %u bytes", nt.buf,
            nt.len);
      if (reorder_.insert(Arrival{nt.seq, nt.t_ns, x.qp, nt.buf, nt.len}))
        ++reordered_;
    }
  }

  // Hands over every frame that is next in order.
  void deliver() {
    for (const Arrival* a; (a = reorder_.front());) {
      const uint64_t now = now_ns();
      lat_[delivered_] = now - a->t_ns;
      if (p_.verify) check(*a);
      ++freed_[a->qp];
      ++delivered_;
      t_last_ = now;
      reorder_.pop();
    }
  }

  void check(const Arrival& a) {
    const uint8_t* f = c_.frame(a.qp, a.buf);
    const uint64_t seed = pattern_seed(a.seq);
    const size_t bad = seeds::check_pattern(f, 0, a.len, seed);
    if (a.len != p_.frame_size || bad != a.len) {
      c_.ch->send_obj(Done{seeds::kVerify, 0});
      c_.ch->wait_close(2000);  // closing first could reset what it must read
      die(seeds::kVerify,
          "verification failed: frame %" PRIu64
          " (QP %u, buffer %u, %u B): "
          "byte %zu is 0x%02x, want 0x%02x",
          a.seq, a.qp, a.buf, a.len, bad, bad < a.len ? f[bad] : 0,
          bad < a.len ? seeds::pattern_byte(seed, bad) : 0);
    }
  }

  // Credits back once a quarter of a QP's ring is free (at most a few
  // credit SENDs outstanding per QP: they fit in its send queue).
  void return_credits() {
    for (uint32_t q = 0; q < kQps; ++q) {
      if (freed_[q] - returned_[q] < credit_batch_ ||
          credit_sends_[q] + 1 > c_.sq_depth)
        continue;
      ibv_send_wr wr{};
      wr.wr_id = table_.acquire(Ctx{Ctx::kCredit, q, 0});
      wr.opcode = IBV_WR_SEND_WITH_IMM;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.imm_data = htonl(freed_[q]);
      ibv_send_wr* bad = nullptr;
      if (const int rc = ibv_post_send(c_.qp[q], &wr, &bad))
        die(seeds::kSetup, "ibv_post_send: %s", strerror(rc));
      returned_[q] = freed_[q];
      ++credit_sends_[q];
    }
  }

  void live(uint64_t now) {
    if (!o_.common.period_ms ||
        now - last_live_ < uint64_t{o_.common.period_ms} * 1'000'000)
      return;
    const double dt = double(now - last_live_) / 1e9;
    const double f = double(delivered_ - live_frames_);
    printf("  RX-frames: %-10" PRIu64
           " Rx-fps: %-10.0f Rx-Gb/s: %-8.3f "
           "reordered: %" PRIu64 "\n",
           delivered_, f / dt, f * p_.frame_size * 8 / dt / 1e9, reordered_);
    fflush(stdout);
    live_frames_ = delivered_;
    last_live_ = now;
  }

  void summary() {
    const double secs = double(t_last_ - t_first_) / 1e9;
    const auto l = seeds::percentiles(lat_, delivered_);
    char title[128];
    snprintf(title, sizeof title, "netfr receiver, %" PRIu64 " frames of %u B",
             p_.count, p_.frame_size);
    seeds::banner(title);
    printf("  RX-frames: %-12" PRIu64
           " QP0: %-10u QP1: %-10u Reordered: %" PRIu64 "\n",
           delivered_, freed_[0], freed_[1], reordered_);
    printf("  Rate: %.0f frames/s   %.3f Gb/s   Time: %.3f s\n",
           double(delivered_) / secs,
           double(delivered_) * p_.frame_size * 8 / secs / 1e9, secs);
    printf(
        "  Latency (us): p50 %.1f  p99 %.1f  p99.9 %.1f  max %.1f  avg %.1f\n",
        l.p50, l.p99, l.p999, l.max, l.avg);
    printf(
        "  (sender's post -> in-order delivery; CLOCK_MONOTONIC of both "
        "ends: one host)\n");
    if (p_.verify)
      printf("  Verified: every byte of %" PRIu64 " frames\n", delivered_);
    seeds::banner_end();
    fflush(stdout);
  }

  Conn& c_;
  const Options& o_;
  const Params p_;
  ContextTable<Ctx> table_;
  Reorder reorder_;
  const uint32_t credit_batch_;
  std::vector<uint64_t> lat_;  // ns per delivered frame
  uint32_t freed_[kQps] = {}, returned_[kQps] = {}, credit_sends_[kQps] = {};
  uint64_t delivered_ = 0, reordered_ = 0;
  uint64_t t_first_ = 0, t_last_ = 0, last_progress_ = 0, last_live_ = 0,
           live_frames_ = 0;
};

}  // namespace

int run_receiver(Conn& c, const Options& o) {
  return Receiver(c, o).run();
}

}  // namespace netfr
