// sdr sender: each message goes to a free slot of the receiver's table as
// one RDMA_WRITE_WITH_IMM per chunk (the immediate names slot, chunk and
// the slot's use count) and an end-of-round marker. The receiver answers
// on the side channel with the chunks still missing (resent, with a new
// marker: repeat until complete) or with "complete", which frees the slot.
// --drop-ppm skips chunk posts on purpose (seeded), first sends and
// resends alike, to exercise that path without a lossy link.
#include <arpa/inet.h>

#include <bit>
#include <cinttypes>

#include "perf/sdr/imm.h"
#include "perf/sdr/sdr.h"

namespace sdr {
namespace {

using seeds::die;
using seeds::now_ns;

constexpr uint32_t kBatch = 16;        // WRs per ibv_post_send
constexpr uint32_t kSignalEvery = 64;  // one signaled WR in this many
constexpr uint64_t kControlNs = 20'000;
// wr_id: the WR's place in the SQ (high 32 bits); on a round's end marker
// also kRoundEnd, the slot (bits 16..25) and its use (low 16 bits).
constexpr uint64_t kRoundEnd = uint64_t{1} << 31;
// With at most sq_depth WRs outstanding and sq_depth >= 4 * kSignalEvery,
// a full SQ always holds signaled WRs, so waiting for room ends.
static_assert(kBatch <= kSignalEvery);

class Sender {
 public:
  Sender(Conn& c, const Options& o)
      : c_(c), o_(o), p_(c.p), missing_((c.nchunks + 63) / 64), rng_(o.seed) {
    if (c.sq_depth < 4 * kSignalEvery)
      die(seeds::kSetup, "send queue of %u WRs is too small", c.sq_depth);
    for (uint32_t s = 0; s < p_.slots; ++s) free_[nfree_++] = s;
  }

  int run() {
    t_start_ = last_progress_ = last_live_ = now_ns();
    uint64_t last_ctl = 0;
    while (!done_) {
      poll_cq();
      if (nfree_ && started_ < p_.count) start_message();
      const uint64_t now = now_ns();
      if (now - last_ctl < kControlNs) continue;
      last_ctl = now;
      control(now);
      live(now);
      if (now - last_progress_ > uint64_t{o_.common.timeout_s} * 1'000'000'000)
        die(seeds::kPeerLost, "peer lost: no answer for %u s",
            o_.common.timeout_s);
    }
    if (status_ == seeds::kVerify)
      die(seeds::kVerify, "the receiver found a byte that was not sent");
    if (status_ != seeds::kOk || completed_ != p_.count)
      die(seeds::kPeerLost,
          "the receiver ended with status %u after %" PRIu64 " messages",
          status_, completed_);
    summary();
    return seeds::kOk;
  }

 private:
  void start_message() {
    const uint32_t s = free_[free_head_];
    free_head_ = (free_head_ + 1) % kMaxSlots;
    --nfree_;
    const uint32_t use = use_[s];
    uint8_t* m = c_.buf.p + size_t{s} * c_.table.stride;
    if (p_.verify)
      seeds::fill_pattern(m, kHeaderBytes, p_.msg_size, pattern_seed(s, use));
    if (started_ == corrupt_) m[p_.msg_size - 1] ^= 0x20;
    const MsgHeader h{now_ns(), s, use};
    memcpy(m, &h, sizeof h);
    for (uint32_t ch = 0; ch < c_.nchunks; ++ch) post_chunk(s, use, ch);
    end_round(s, use);
    ++started_;
  }

  // Resends the chunks of (s, use) the receiver listed in missing_.
  void resend(uint32_t s, uint32_t use) {
    for (uint32_t w = 0; w < missing_.size(); ++w)
      for (uint64_t bits = missing_[w]; bits; bits &= bits - 1) {
        const uint32_t ch = w * 64 + uint32_t(std::countr_zero(bits));
        if (ch >= c_.nchunks) break;
        if (post_chunk(s, use, ch)) ++resent_;
      }
    end_round(s, use);
  }

  // Queues the WRITE_WITH_IMM of chunk ch; false when --drop-ppm skipped it.
  bool post_chunk(uint32_t s, uint32_t use, uint32_t ch) {
    if (o_.drop_ppm && rng_.next() % 1'000'000 < o_.drop_ppm) {
      ++dropped_;
      return false;
    }
    if (nbatch_ == kBatch) flush();
    const size_t off =
        size_t{s} * c_.table.stride + size_t{ch} * c_.table.chunk;
    ibv_sge& g = sge_[nbatch_];
    g.addr = reinterpret_cast<uintptr_t>(c_.buf.p + off);
    g.length =
        std::min<uint32_t>(c_.table.chunk, p_.msg_size - ch * c_.table.chunk);
    g.lkey = c_.buf.mr->lkey;
    ibv_send_wr& w = wr_[nbatch_];
    w = {};
    w.wr_id = uint64_t{posted_ + nbatch_} << 32;  // its place in the SQ
    w.sg_list = &g;
    w.num_sge = 1;
    w.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    w.imm_data = htonl(encode_imm(s, ch, use & kUserMask));
    w.wr.rdma.remote_addr = c_.table.addr + off;
    w.wr.rdma.rkey = c_.table.rkey;
    if (++unsignaled_ == kSignalEvery) {
      w.send_flags = IBV_SEND_SIGNALED;
      unsignaled_ = 0;
    }
    ++nbatch_;
    ++chunks_posted_;
    return true;
  }

  // Ends a round: a zero-length WRITE_WITH_IMM naming the marker chunk.
  // Behind the round's chunks on the same QP, it tells the receiver that
  // whatever has not arrived by then is lost. It is signaled and tagged
  // with (slot, use): its completion sends the "sent" notice on the side
  // channel, the fallback should the marker itself be lost.
  void end_round(uint32_t s, uint32_t use) {
    if (nbatch_ == kBatch) flush();
    ibv_send_wr& w = wr_[nbatch_++];
    w = {};
    w.wr_id = uint64_t{posted_ + nbatch_ - 1} << 32 | kRoundEnd |
              uint64_t{s} << 16 | (use & 0xffff);
    w.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    w.send_flags = IBV_SEND_SIGNALED;
    w.imm_data = htonl(encode_imm(s, kMarkerChunk, use & kUserMask));
    w.wr.rdma.remote_addr = c_.table.addr + size_t{s} * c_.table.stride;
    w.wr.rdma.rkey = c_.table.rkey;
    unsignaled_ = 0;
    flush();
  }

  void flush() {
    if (!nbatch_) return;
    for (uint32_t i = 0; i + 1 < nbatch_; ++i) wr_[i].next = &wr_[i + 1];
    for (uint64_t t0 = 0; posted_ - done_wrs_ + nbatch_ > c_.sq_depth;) {
      poll_cq();
      const uint64_t now = now_ns();
      if (!t0) t0 = now;
      if (now - t0 > uint64_t{o_.common.timeout_s} * 1'000'000'000)
        die(seeds::kPeerLost, "peer lost: send queue full for %u s",
            o_.common.timeout_s);
    }
    ibv_send_wr* bad = nullptr;
    if (const int rc = ibv_post_send(c_.qp, wr_, &bad))
      die(seeds::kSetup, "ibv_post_send: %s", strerror(rc));
    posted_ += nbatch_;
    nbatch_ = 0;
  }

  void poll_cq() {
    ibv_wc wc[16];
    const int n = ibv_poll_cq(c_.cq, 16, wc);
    if (n < 0) die(seeds::kCompletion, "ibv_poll_cq failed (%d)", n);
    for (int i = 0; i < n; ++i) {
      if (wc[i].status != IBV_WC_SUCCESS) wc_error(wc[i]);
      const uint64_t id = wc[i].wr_id;
      done_wrs_ = uint32_t(id >> 32) + 1;  // completions come in SQ order
      if (!(id & kRoundEnd)) continue;
      const uint32_t s = uint32_t(id >> 16) & (kMaxSlots - 1);
      if ((use_[s] & 0xffff) == (id & 0xffff))  // else completed meanwhile
        c_.ch->send_obj(CtlMsg{Ctl::kSent, s, use_[s], 0});
    }
  }

  // A failed completion. When the receiver ended first (a verification
  // failure, or it is gone) its side channel says so: that is the error.
  [[noreturn]] void wc_error(const ibv_wc& wc) {
    while (c_.ch->readable(100)) {  // EOF: exits "peer lost"
      CtlMsg m;
      c_.ch->recv_obj(m);
      if (m.type == Ctl::kMissing && m.nwords == missing_.size())
        c_.ch->recv_all(missing_.data(), m.nwords * sizeof(uint64_t));
      if (m.type == Ctl::kDone && m.slot == seeds::kVerify)
        die(seeds::kVerify, "the receiver found a byte that was not sent");
    }
    seeds::check_wc(wc);
    abort();  // check_wc exits on an error status
  }

  void control(uint64_t now) {
    while (c_.ch->readable()) {
      CtlMsg m;
      c_.ch->recv_obj(m);
      last_progress_ = now;
      if (m.type == Ctl::kDone) {
        done_ = true;
        status_ = m.slot;
        return;
      }
      if (m.slot >= p_.slots)
        die(seeds::kPeerLost, "side channel: slot %u out of range", m.slot);
      if (m.type == Ctl::kComplete && m.use == use_[m.slot]) {
        ++use_[m.slot];
        free_[(free_head_ + nfree_++) % kMaxSlots] = m.slot;
        if (++completed_ == p_.count) t_end_ = last_progress_;
      } else if (m.type == Ctl::kMissing && m.nwords == missing_.size()) {
        c_.ch->recv_all(missing_.data(), m.nwords * sizeof(uint64_t));
        ++missing_reports_;
        if (m.use == use_[m.slot]) resend(m.slot, m.use);
      } else {
        die(seeds::kPeerLost, "side channel: unexpected message %u (slot %u)",
            unsigned(m.type), m.slot);
      }
    }
  }

  void live(uint64_t now) {
    if (!o_.common.period_ms ||
        now - last_live_ < uint64_t{o_.common.period_ms} * 1'000'000)
      return;
    const double dt = double(now - last_live_) / 1e9;
    printf("  TX-messages: %-10" PRIu64 " TX-chunks: %-12" PRIu64
           " Tx-msg/s: %-10.0f dropped: %-8" PRIu64 " resent: %" PRIu64 "\n",
           completed_, chunks_posted_, double(completed_ - live_msgs_) / dt,
           dropped_, resent_);
    fflush(stdout);
    live_msgs_ = completed_;
    last_live_ = now;
  }

  void summary() {
    const double secs = double(t_end_ - t_start_) / 1e9;
    char title[128];
    snprintf(title, sizeof title, "sdr sender, %s, %" PRIu64 " x %u B",
             mode(p_), p_.count, p_.msg_size);
    seeds::banner(title);
    printf("  TX-messages: %-12" PRIu64 " TX-chunks: %-12" PRIu64
           " Chunk-size: %u B (%u per message)\n",
           completed_, chunks_posted_, c_.table.chunk, c_.nchunks);
    printf("  Dropped-on-purpose: %-5" PRIu64 " Resent-chunks: %-8" PRIu64
           " Missing-reports: %" PRIu64 "\n",
           dropped_, resent_, missing_reports_);
    printf("  Rate: %.0f msg/s   Goodput: %.3f Gb/s   Time: %.3f s\n",
           double(completed_) / secs,
           double(completed_) * p_.msg_size * 8 / secs / 1e9, secs);
    printf("  (first post -> last \"complete\" from the receiver)\n");
    seeds::banner_end();
    fflush(stdout);
  }

  Conn& c_;
  const Options& o_;
  const Params p_;
  std::vector<uint64_t> missing_;  // bitmap of a kMissing message
  seeds::Rng rng_;
  const uint64_t corrupt_ = seeds::corrupt_index();
  uint32_t free_[kMaxSlots];  // FIFO of free slots
  uint32_t free_head_ = 0, nfree_ = 0;
  uint32_t use_[kMaxSlots] = {};  // messages completed per slot
  ibv_send_wr wr_[kBatch];
  ibv_sge sge_[kBatch];
  uint32_t nbatch_ = 0, unsignaled_ = 0;
  uint32_t posted_ = 0, done_wrs_ = 0;  // WRs posted and completed (wrap)
  bool done_ = false;
  uint32_t status_ = 0;
  uint64_t started_ = 0, completed_ = 0, chunks_posted_ = 0, dropped_ = 0,
           resent_ = 0, missing_reports_ = 0;
  uint64_t t_start_ = 0, t_end_ = 0, last_progress_ = 0, last_live_ = 0,
           live_msgs_ = 0;
};

}  // namespace

int run_sender(Conn& c, const Options& o) {
  return Sender(c, o).run();
}

}  // namespace sdr
