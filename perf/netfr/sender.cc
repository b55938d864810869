// netfr sender: frame k goes on QP k % 2 as an RDMA WRITE into the next
// buffer of that QP's half of the receiver's ring, chained with a SEND
// notify (sequence number, length, post time) in one ibv_post_send: the
// notify leaves as soon as the WRITE is done, with no round trip through
// this program. A frame needs a credit of its QP; the receiver returns
// credits as it delivers. Without one the sender stalls (counted).
#include <arpa/inet.h>

#include <cinttypes>

#include "perf/netfr/context_table.h"
#include "perf/netfr/netfr.h"

namespace netfr {
namespace {

using seeds::die;
using seeds::now_ns;

constexpr uint64_t kControlNs = 20'000;

struct Ctx {
  enum Kind : uint8_t { kNotify, kCredit } kind = kNotify;
  uint32_t qp = 0;
  uint64_t seq = 0;  // kNotify: the frame
};

class Sender {
 public:
  Sender(Conn& c, const Options& o)
      // Per QP: the credit receives (ring + 2, reposted with the same
      // context) and a notify per frame until its SEND completes: up to
      // half the send queue (WRITE + SEND per frame), not the ring's
      // credits, since a credit can come back before the ACK that
      // completes the frame's SEND (Linux rxe defers ACKs: a table of
      // 2 x ring + 2 per QP ran out against it).
      : c_(c), o_(o), p_(c.p), table_(kQps * (c.sq_depth / 2 + p_.ring + 2)) {}

  int run() {
    post_credit_receives();
    uint32_t ready = 0;  // the receiver's notify receives are posted
    c_.ch->recv_obj(ready);
    t_start_ = last_live_ = last_progress_ = now_ns();
    const uint64_t period =
        p_.rate_fps ? 1'000'000'000ull / p_.rate_fps : 0;  // ns per frame
    uint64_t last_ctl = 0;
    while (!done_) {
      poll_cq();
      const uint64_t now = now_ns();
      if (now - last_ctl >= kControlNs) {
        last_ctl = now;
        control(now);
        live(now);
      }
      if (seq_ == p_.count) continue;  // waiting for the receiver's "done"
      const uint64_t due = t_start_ + seq_ * period;
      if (now < due) {
        if (due - now > 200'000) pause_until(due - 100'000);
        continue;
      }
      const uint32_t q = uint32_t(seq_ % kQps);
      if (sq_used_[q] + 2 > c_.sq_depth) continue;  // completions to poll
      if (sent_[q] - credited_[q] >= p_.ring) {     // no credit: a stall
        if (!stalled_) {
          stalled_ = true;
          ++stalls_;
          stall_from_ = now;
        }
        continue;
      }
      if (stalled_) {
        stalled_ = false;
        stall_ns_ += now - stall_from_;
      }
      post_frame(q);
    }
    if (done_status_ == seeds::kVerify)
      die(seeds::kVerify, "the receiver found a byte that was not sent");
    if (done_status_ != seeds::kOk)
      die(seeds::kPeerLost, "the receiver ended with status %u", done_status_);
    summary();
    return seeds::kOk;
  }

 private:
  // Receives for the credit SEND_WITH_IMMs: no data, one per credit.
  void post_credit_receives() {
    for (uint32_t q = 0; q < kQps; ++q)
      for (uint32_t i = 0; i < p_.ring + 2; ++i)
        post_credit_receive(table_.acquire(Ctx{Ctx::kCredit, q, 0}));
  }
  void post_credit_receive(uint64_t wr_id) {
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    ibv_recv_wr* bad = nullptr;
    if (const int rc = ibv_post_recv(c_.qp[table_.at(wr_id).qp], &wr, &bad))
      die(seeds::kSetup, "ibv_post_recv: %s", strerror(rc));
  }

  void post_frame(uint32_t q) {
    const uint32_t i = sent_[q] % p_.ring;
    uint8_t* frame = c_.frame(q, i);
    if (p_.verify)
      seeds::fill_pattern(frame, 0, p_.frame_size, pattern_seed(seq_));
    if (seq_ == corrupt_) frame[p_.frame_size / 2] ^= 0x20;
    Notify* n = c_.notify(q, i);
    *n = Notify{seq_, now_ns(), i, p_.frame_size};

    ibv_sge sge[2];
    sge[0] = {reinterpret_cast<uintptr_t>(frame), p_.frame_size,
              c_.buf.mr->lkey};
    sge[1] = {reinterpret_cast<uintptr_t>(n), sizeof(Notify), c_.buf.mr->lkey};
    ibv_send_wr wr[2] = {};
    wr[0].next = &wr[1];
    wr[0].sg_list = &sge[0];
    wr[0].num_sge = 1;
    wr[0].opcode = IBV_WR_RDMA_WRITE;  // unsignaled: the SEND covers it
    wr[0].wr.rdma.remote_addr = c_.remote_frame(q, i);
    wr[0].wr.rdma.rkey = c_.ring.rkey;
    wr[1].wr_id = table_.acquire(Ctx{Ctx::kNotify, q, seq_});
    wr[1].sg_list = &sge[1];
    wr[1].num_sge = 1;
    wr[1].opcode = IBV_WR_SEND;
    wr[1].send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    if (const int rc = ibv_post_send(c_.qp[q], wr, &bad))
      die(seeds::kSetup, "ibv_post_send: %s", strerror(rc));
    ++sent_[q];
    sq_used_[q] += 2;
    ++seq_;
  }

  void poll_cq() {
    ibv_wc wc[32];
    const int n = ibv_poll_cq(c_.cq, 32, wc);
    if (n < 0) die(seeds::kCompletion, "ibv_poll_cq failed (%d)", n);
    if (n > 0) last_progress_ = now_ns();
    for (int k = 0; k < n; ++k) {
      if (wc[k].status != IBV_WC_SUCCESS) wc_error(wc[k]);
      Ctx& x = table_.at(wc[k].wr_id);
      if (x.kind == Ctx::kNotify) {  // the frame's WRITE and SEND are done
        sq_used_[x.qp] -= 2;
        table_.release(wc[k].wr_id);
      } else {  // credits: the receiver's running count for this QP
        if (!(wc[k].wc_flags & IBV_WC_WITH_IMM))
          die(seeds::kCompletion, "credit message without immediate");
        credited_[x.qp] = ntohl(wc[k].imm_data);
        post_credit_receive(wc[k].wr_id);
      }
    }
  }

  // A failed completion. When the receiver ended first (a verification
  // failure, or it is gone) its side channel says so: that is the error.
  [[noreturn]] void wc_error(const ibv_wc& wc) {
    if (c_.ch->readable(100)) {  // EOF: exits "peer lost"
      Done d;
      c_.ch->recv_obj(d);
      if (d.status == seeds::kVerify)
        die(seeds::kVerify, "the receiver found a byte that was not sent");
    }
    seeds::check_wc(wc);
    abort();  // check_wc exits on an error status
  }

  void control(uint64_t now) {
    if (!c_.ch->readable()) {
      if (now - last_progress_ > uint64_t{o_.common.timeout_s} * 1'000'000'000)
        die(seeds::kPeerLost, "peer lost: no answer for %u s",
            o_.common.timeout_s);
      return;
    }
    Done d;
    c_.ch->recv_obj(d);
    done_ = true;
    done_status_ = d.status;
    t_end_ = now;
  }

  // Sleeps when the next frame is far off: a sleeping sender leaves the
  // CPU to urnicd on small machines.
  void pause_until(uint64_t t) {
    timespec ts{time_t(t / 1'000'000'000), long(t % 1'000'000'000)};
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr);
  }

  void live(uint64_t now) {
    if (!o_.common.period_ms ||
        now - last_live_ < uint64_t{o_.common.period_ms} * 1'000'000)
      return;
    const double dt = double(now - last_live_) / 1e9;
    const double f = double(seq_ - live_seq_);
    printf("  TX-frames: %-10" PRIu64
           " Tx-fps: %-10.0f Tx-Gb/s: %-8.3f "
           "credit-stalls: %" PRIu64 "\n",
           seq_, f / dt, f * p_.frame_size * 8 / dt / 1e9, stalls_);
    fflush(stdout);
    live_seq_ = seq_;
    last_live_ = now;
  }

  void summary() {
    const double secs = double(t_end_ - t_start_) / 1e9;
    char title[128];
    snprintf(title, sizeof title, "netfr sender, %" PRIu64 " frames of %u B",
             p_.count, p_.frame_size);
    seeds::banner(title);
    printf("  TX-frames: %-12" PRIu64 " QP0: %-10u QP1: %u\n", seq_, sent_[0],
           sent_[1]);
    printf("  Credit-stalls: %-8" PRIu64
           " Stalled: %.3f ms   Credits per QP: "
           "%u\n",
           stalls_, double(stall_ns_) / 1e6, p_.ring);
    printf("  Rate: %.0f frames/s   %.3f Gb/s   Time: %.3f s   (target: %s)\n",
           double(seq_) / secs, double(seq_) * p_.frame_size * 8 / secs / 1e9,
           secs, p_.rate_fps ? std::to_string(p_.rate_fps).c_str() : "max");
    seeds::banner_end();
    fflush(stdout);
  }

  Conn& c_;
  const Options& o_;
  const Params p_;
  ContextTable<Ctx> table_;
  const uint64_t corrupt_ = seeds::corrupt_index();
  uint64_t seq_ = 0;  // next frame
  uint32_t sent_[kQps] = {}, credited_[kQps] = {}, sq_used_[kQps] = {};
  bool done_ = false, stalled_ = false;
  uint32_t done_status_ = 0;
  uint64_t stalls_ = 0, stall_ns_ = 0, stall_from_ = 0;
  uint64_t t_start_ = 0, t_end_ = 0, last_live_ = 0, live_seq_ = 0,
           last_progress_ = 0;
};

}  // namespace

int run_sender(Conn& c, const Options& o) {
  return Sender(c, o).run();
}

}  // namespace netfr
