// sdr receiver: one loop, two stages. The backend stage drains the CQ
// (each RDMA_WRITE_WITH_IMM completion names its slot, chunk and use in
// the immediate), marks the chunk in the slot's backend bitmap and reposts
// the receive it consumed; the frontend stage reports the chunks marked
// since it last looked (checking their bytes with --verify) and completes
// a message when all its chunks are in. A round of chunks that ends
// incomplete gets its missing-chunk bitmap sent back (UC loses; RC only
// misses chunks dropped on purpose).
//
// One thread rather than two: on small machines (2 vCPUs shared with the
// urnicd workers) a second busy poller costs more than it gives, and the
// hand-off between the stages (bitmaps + touched queue, slot_table.h) is
// the one two threads would use, so the split stays a local change.
#include <arpa/inet.h>

#include <bit>
#include <cinttypes>
#include <cstdarg>

#include "perf/sdr/imm.h"
#include "perf/sdr/sdr.h"
#include "perf/sdr/slot_table.h"

namespace sdr {
namespace {

using seeds::die;
using seeds::now_ns;

constexpr int kPoll = 32;                // completions per backend poll
constexpr uint64_t kControlNs = 20'000;  // side channel / timer period

class Receiver {
 public:
  Receiver(Conn& c, const Options& o)
      : c_(c),
        o_(o),
        p_(c.p),
        table_(c.buf.p, p_.slots, c.table.stride, c.nchunks),
        missing_(table_.words()),
        lat_(p_.count) {
    for (int i = 0; i < kPoll; ++i) {
      recv_[i] = {};
      recv_[i].next = i + 1 < kPoll ? &recv_[i + 1] : nullptr;
    }
  }

  int run() {
    const uint64_t t_start = now_ns();
    last_progress_ = last_live_ = t_start;
    uint64_t last_ctl = 0;
    while (completed_ < p_.count) {
      backend();
      table_.drain([this](uint32_t s, uint32_t c) { report_chunk(s, c); },
                   [this](uint32_t s) { slot_done(s); });
      const uint64_t now = now_ns();
      if (now - last_ctl < kControlNs) continue;
      last_ctl = now;
      control(now);
      nack_timer(now);
      live(now);
      if (now - last_progress_ > uint64_t{o_.common.timeout_s} * 1'000'000'000)
        die(seeds::kPeerLost, "peer lost: nothing received for %u s",
            o_.common.timeout_s);
    }
    c_.ch->send_obj(CtlMsg{Ctl::kDone, seeds::kOk, 0, 0});
    summary();
    c_.ch->wait_close(5000);
    return seeds::kOk;
  }

 private:
  // Stage 1: completions -> backend bitmaps; receives reposted.
  void backend() {
    ibv_wc wc[kPoll];
    const int n = ibv_poll_cq(c_.cq, kPoll, wc);
    if (n < 0) die(seeds::kCompletion, "ibv_poll_cq failed (%d)", n);
    cq_empty_ = n == 0;
    if (n == 0) return;
    const uint64_t now = now_ns();
    if (!t_first_) t_first_ = now;
    last_progress_ = now;
    for (int i = 0; i < n; ++i) {
      seeds::check_wc(wc[i]);
      if (wc[i].opcode != IBV_WC_RECV_RDMA_WITH_IMM)
        die(seeds::kCompletion, "unexpected completion (opcode %d)",
            int(wc[i].opcode));
      const Imm im = decode_imm(ntohl(wc[i].imm_data));
      if (im.msg_id >= table_.size() ||
          (im.chunk >= c_.nchunks && im.chunk != kMarkerChunk)) {
        ++bad_imm_;
        continue;
      }
      SlotTable::Slot& sl = table_.slot(im.msg_id);
      const bool current = (sl.use & kUserMask) == im.user;
      if (im.chunk == kMarkerChunk) {  // every chunk before it is in
        sl.round_end |= current;       // (else: its message is complete)
        continue;
      }
      if (!current) {
        ++stale_;  // a late write of the slot's previous message
        continue;
      }
      if (!table_.mark(im.msg_id, im.chunk)) {
        ++dup_;
        continue;
      }
      sl.last_ns = now;
      ++chunks_;
    }
    ibv_recv_wr* bad = nullptr;
    recv_[n - 1].next = nullptr;
    const int rc = ibv_post_recv(c_.qp, recv_, &bad);
    recv_[n - 1].next = n < kPoll ? &recv_[n] : nullptr;
    if (rc) die(seeds::kSetup, "ibv_post_recv: %s", strerror(rc));
  }

  // Stage 2, per chunk: the application sees chunk c of slot s.
  void report_chunk(uint32_t s, uint32_t c) {
    if (!p_.verify) return;
    const uint8_t* m = table_.message(s);
    const uint32_t use = table_.slot(s).use;
    size_t from = size_t{c} * c_.table.chunk;
    const size_t to = std::min<size_t>(p_.msg_size, from + c_.table.chunk);
    if (c == 0) {
      MsgHeader h;
      memcpy(&h, m, sizeof h);
      if (h.slot != s || h.use != use)
        fail_verify("slot %u use %u: header names slot %u use %u", s, use,
                    h.slot, h.use);
      from = kHeaderBytes;
    }
    const size_t bad = seeds::check_pattern(m, from, to, pattern_seed(s, use));
    if (bad != to)
      fail_verify("slot %u use %u chunk %u: byte %zu is 0x%02x, want 0x%02x", s,
                  use, c, bad, m[bad],
                  seeds::pattern_byte(pattern_seed(s, use), bad));
  }

  // Stage 2, per touched slot: a message whose chunks are all reported.
  void slot_done(uint32_t s) {
    SlotTable::Slot& sl = table_.slot(s);
    if (sl.reported < c_.nchunks) return;
    const uint64_t now = now_ns();
    MsgHeader h;
    memcpy(&h, table_.message(s), sizeof h);
    lat_[completed_] = now - h.t0_ns;
    ++completed_;
    t_last_ = now;
    c_.ch->send_obj(CtlMsg{Ctl::kComplete, s, sl.use, 0});
    table_.recycle(s);
  }

  void control(uint64_t now) {
    while (c_.ch->readable()) {
      CtlMsg m;
      c_.ch->recv_obj(m);
      if (m.type != Ctl::kSent || m.slot >= table_.size())
        die(seeds::kPeerLost, "side channel: unexpected message %u",
            unsigned(m.type));
      SlotTable::Slot& sl = table_.slot(m.slot);
      if (m.use != sl.use) continue;  // completed meanwhile
      sl.due = true;
      sl.last_ns = now;
      last_progress_ = now;
    }
  }

  // Selective resend: the sender learns which chunks of a message are
  // missing when the round's end marker arrived (on one path, everything
  // sent before it that is not here is lost) or, should the marker be
  // lost, when the sender said the round is out and nothing came for
  // --nack-us.
  void nack_timer(uint64_t now) {
    const uint64_t quiet = uint64_t{p_.nack_us} * 1000;
    for (uint32_t s = 0; s < table_.size(); ++s) {
      SlotTable::Slot& sl = table_.slot(s);
      if (sl.round_end || (sl.due && cq_empty_ && now - sl.last_ns >= quiet))
        nack(s);
    }
  }

  void nack(uint32_t s) {
    SlotTable::Slot& sl = table_.slot(s);
    table_.missing(s, missing_.data());
    uint32_t n = 0;
    for (uint64_t w : missing_) n += uint32_t(std::popcount(w));
    c_.ch->send_obj(CtlMsg{Ctl::kMissing, s, sl.use, table_.words()});
    c_.ch->send_all(missing_.data(), missing_.size() * sizeof(uint64_t));
    if (sl.round_end) ++marker_nacks_;
    sl.round_end = sl.due = false;
    ++missing_reports_;
    missing_chunks_ += n;
  }

  void live(uint64_t now) {
    if (!o_.common.period_ms ||
        now - last_live_ < uint64_t{o_.common.period_ms} * 1'000'000)
      return;
    const double dt = double(now - last_live_) / 1e9;
    const double msgs = double(completed_ - live_msgs_);
    printf("  RX-messages: %-10" PRIu64 " RX-chunks: %-12" PRIu64
           " Rx-msg/s: %-10.0f Rx-Gb/s: %-8.3f missing-reports: %" PRIu64 "\n",
           completed_, chunks_, msgs / dt, msgs * p_.msg_size * 8 / dt / 1e9,
           missing_reports_);
    fflush(stdout);
    live_msgs_ = completed_;
    last_live_ = now;
  }

  void summary() {
    const double secs = double(t_last_ - t_first_) / 1e9;
    const auto l = seeds::percentiles(lat_, completed_);
    char title[128];
    snprintf(title, sizeof title, "sdr receiver, %s, %" PRIu64 " x %u B",
             mode(p_), p_.count, p_.msg_size);
    seeds::banner(title);
    printf("  RX-messages: %-12" PRIu64 " RX-chunks: %-12" PRIu64
           " RX-bytes: %" PRIu64 "\n",
           completed_, chunks_, completed_ * p_.msg_size);
    printf("  Duplicate-chunks: %-7" PRIu64 " Stale-chunks: %-9" PRIu64
           " Bad-imm: %" PRIu64 "\n",
           dup_, stale_, bad_imm_);
    printf("  Missing-reports: %-8" PRIu64 " Missing-chunks: %-9" PRIu64
           " On-marker: %" PRIu64 "\n",
           missing_reports_, missing_chunks_, marker_nacks_);
    printf("  Rate: %.0f msg/s   Goodput: %.3f Gb/s   Time: %.3f s\n",
           double(completed_) / secs,
           double(completed_) * p_.msg_size * 8 / secs / 1e9, secs);
    printf(
        "  Completion latency (us): p50 %.1f  p99 %.1f  p99.9 %.1f  "
        "max %.1f  avg %.1f\n",
        l.p50, l.p99, l.p999, l.max, l.avg);
    printf(
        "  (first chunk posted -> last chunk reported; CLOCK_MONOTONIC of "
        "both ends: one host)\n");
    if (p_.verify)
      printf("  Verified: every byte of %" PRIu64 " messages\n", completed_);
    seeds::banner_end();
    fflush(stdout);
  }

  // Tells the sender (so it exits with the same status), then exits.
  [[noreturn, gnu::format(printf, 2, 3)]] void fail_verify(const char* fmt,
                                                           ...) {
    c_.ch->send_obj(CtlMsg{Ctl::kDone, seeds::kVerify, 0, 0});
    c_.ch->wait_close(2000);  // closing first could reset what it has to read
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    die(seeds::kVerify, "verification failed: %s", what);
  }

  Conn& c_;
  const Options& o_;
  const Params p_;
  SlotTable table_;
  std::vector<uint64_t> missing_;
  std::vector<uint64_t> lat_;  // ns per completed message
  ibv_recv_wr recv_[kPoll];
  bool cq_empty_ = false;
  uint64_t completed_ = 0, chunks_ = 0, dup_ = 0, stale_ = 0, bad_imm_ = 0,
           missing_reports_ = 0, missing_chunks_ = 0, marker_nacks_ = 0;
  uint64_t t_first_ = 0, t_last_ = 0, last_progress_ = 0, last_live_ = 0,
           live_msgs_ = 0;
};

}  // namespace

int run_receiver(Conn& c, const Options& o) {
  return Receiver(c, o).run();
}

}  // namespace sdr
