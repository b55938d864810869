// The transport engine end to end: two hosts (a Device and an Engine each)
// joined by a seeded SimLink, driven in virtual time.
//
// Workload: RC QP pairs (one with an SRQ on B's side), a UD pair and a UC
// pair; each direction of each pair posts a seeded random mix of SEND,
// SEND_WITH_IMM, RDMA_WRITE, RDMA_WRITE_WITH_IMM, RDMA_READ and both atomics
// (0 B .. 4 MiB, multi-SGE, inline, unsignaled, fenced), keeping a bounded
// number outstanding and its receive queue stocked.
//
// Reference model: every QP direction owns disjoint memory (a "sink" for
// READ/atomic results and SEND/WRITE sources on the requester, a "remote"
// region and a receive ring on the responder; sources mostly come from an
// immutable pattern area), and the orderings RC leaves undefined are fenced
// (a WRITE/atomic over the source of an unfinished READ, a SEND/WRITE whose
// source is the destination of an unfinished READ/atomic). So applying each
// WR to a model copy of the memory at post time, in post order, gives the
// final memory of both hosts, each READ's data and each atomic's original
// value. Receives are matched to messages in order (RC; UC/UD on the clean
// link), or checked for being an exact copy of some sent message (UC/UD on
// impaired links, where messages are lost, duplicated and reordered).
//
// At the end: every send WR completed exactly once, in post order, with its
// wr_id, SUCCESS, opcode, byte_len; every receive as expected; both hosts'
// memory byte-identical to the model; every QP still in RTS.
//
// The link: each host transmits into a 25 Gb/s queue of bounded depth (a
// full queue refuses the frame, as a NIC TX ring does, plus rare random
// refusals), then the SimLink adds delay, loss, duplication, reordering and
// bit flips. Received frames go through wire::decode (a flipped bit fails
// the ICRC or the IPv4 checksum: dropped and counted) and an L2 filter, now
// and then split into two segments, to Engine::rx. Virtual time jumps to the
// next event (arrival, room in a transmit queue, end of a dry receive queue)
// or by 50 us when idle, so retransmit and RNR timers fire.
//
// Replay: URNIC_SIM_SEED=<seed> (and URNIC_SIM_OPS=<n>, default 100000) with
// --gtest_filter=<the test>; a failing run prints the exact line. Debug aids:
// URNIC_SIM_TRACE_QPN=<qpn> prints every frame to that QPN (both hosts use
// the same QPNs for a pair), URNIC_SIM_VERBOSE=1 per-QP counters.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "dataplane/transport/engine.h"
#include "dataplane/transport/objects.h"
#include "dataplane/transport/qp_attr.h"
#include "dataplane/transport/sim_link.h"
#include "dataplane/transport/types.h"
#include "dataplane/wire/codec.h"
#include "tests/support/engine_host.h"

using namespace urnic;
using namespace urnic::transport;

namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * 1024;
constexpr uint64_t kUs = 1000;
constexpr uint64_t kMs = 1000 * kUs;

// Virtual time steps while nothing is in flight, so timers fire.
constexpr uint64_t kIdleStepNs = 50 * kUs;
// No completion for this long (virtual) means the run is stuck.
constexpr uint64_t kStallNs = 3000 * kMs;
// Simulated NIC transmit queue: 25 Gb/s (0.32 ns a byte), at most
// SimParams::tx_queue_ns of frames queued.
constexpr uint64_t tx_ns(uint64_t bytes) {
  return (bytes * 8 + 24) / 25;
}
// Delay jitter stays below the serialization time of the smallest frame (an
// ACK, 62 bytes: 19.8 ns), so it varies the delay without reordering; the
// SimLink's `reorder` knob does the reordering (RoCE expects an in-order
// network: jitter of a few frame times reorders nearly every frame, and
// go-back-N then resends almost everything, until retry_cnt runs out).
constexpr uint64_t kJitterNs = 16;
static_assert(kJitterNs < tx_ns(62));
constexpr uint32_t kMaxFailures = 12;

constexpr uint32_t kUdQkey = 0x11223344;
constexpr uint32_t kAccessAll =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
    IBV_ACCESS_REMOTE_ATOMIC;

uint64_t env_u64(const char* name, uint64_t def) {
  const char* s = std::getenv(name);
  if (s == nullptr || *s == '\0') return def;
  return std::strtoull(s, nullptr, 0);
}

// xoshiro256** seeded by splitmix64: small (each QP direction has its own),
// and the same numbers with every standard library.
class Rng {
 public:
  explicit Rng(uint64_t seed = 1) {
    for (uint64_t& w : s_) {
      seed += 0x9e3779b97f4a7c15ull;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      w = z ^ (z >> 31);
    }
  }
  uint64_t next() {
    const uint64_t r = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return r;
  }
  // Uniform in [lo, hi] (inclusive).
  uint64_t uniform(uint64_t lo, uint64_t hi) {
    return hi <= lo ? lo : lo + next() % (hi - lo + 1);
  }
  double real() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  bool chance(double p) { return p > 0 && real() < p; }
  template <class T>
  const T& pick(const std::vector<T>& v) {
    return v[uniform(0, v.size() - 1)];
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

uint64_t fnv(const uint8_t* p, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

// A FIFO over a vector (std::deque costs ~600 bytes even when empty, and the
// 16384-QP run has 32768 directions with several queues each).
template <class T>
class Fifo {
 public:
  bool empty() const { return head_ == v_.size(); }
  size_t size() const { return v_.size() - head_; }
  T& front() { return v_[head_]; }
  T& back() { return v_.back(); }
  T& operator[](size_t i) { return v_[head_ + i]; }
  const T& operator[](size_t i) const { return v_[head_ + i]; }
  void push_back(T x) { v_.push_back(std::move(x)); }
  void pop_front() {
    v_[head_] = T();
    if (++head_ == v_.size()) {
      v_.clear();
      head_ = 0;
    } else if (head_ >= 32 && head_ * 2 >= v_.size()) {
      v_.erase(v_.begin(), v_.begin() + static_cast<ptrdiff_t>(head_));
      head_ = 0;
    }
  }
  auto begin() { return v_.begin() + static_cast<ptrdiff_t>(head_); }
  auto end() { return v_.end(); }

 private:
  std::vector<T> v_;
  size_t head_ = 0;
};

const char* wr_op_name(ibv_wr_opcode op) {
  switch (op) {
    case IBV_WR_SEND:
      return "SEND";
    case IBV_WR_SEND_WITH_IMM:
      return "SEND_WITH_IMM";
    case IBV_WR_RDMA_WRITE:
      return "RDMA_WRITE";
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      return "RDMA_WRITE_WITH_IMM";
    case IBV_WR_RDMA_READ:
      return "RDMA_READ";
    case IBV_WR_ATOMIC_CMP_AND_SWP:
      return "ATOMIC_CMP_AND_SWP";
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      return "ATOMIC_FETCH_AND_ADD";
    default:
      return "?";
  }
}

const char* wc_status_name(ibv_wc_status s) {
  switch (s) {
    case IBV_WC_SUCCESS:
      return "SUCCESS";
    case IBV_WC_LOC_LEN_ERR:
      return "LOC_LEN_ERR";
    case IBV_WC_LOC_QP_OP_ERR:
      return "LOC_QP_OP_ERR";
    case IBV_WC_LOC_PROT_ERR:
      return "LOC_PROT_ERR";
    case IBV_WC_WR_FLUSH_ERR:
      return "WR_FLUSH_ERR";
    case IBV_WC_REM_INV_REQ_ERR:
      return "REM_INV_REQ_ERR";
    case IBV_WC_REM_ACCESS_ERR:
      return "REM_ACCESS_ERR";
    case IBV_WC_REM_OP_ERR:
      return "REM_OP_ERR";
    case IBV_WC_RETRY_EXC_ERR:
      return "RETRY_EXC_ERR";
    case IBV_WC_RNR_RETRY_EXC_ERR:
      return "RNR_RETRY_EXC_ERR";
    default:
      return "other";
  }
}

ibv_wc_opcode expected_wc_opcode(ibv_wr_opcode op) {
  switch (op) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      return IBV_WC_RDMA_WRITE;
    case IBV_WR_RDMA_READ:
      return IBV_WC_RDMA_READ;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
      return IBV_WC_COMP_SWAP;
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      return IBV_WC_FETCH_ADD;
    default:
      return IBV_WC_SEND;
  }
}

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

// Debug aid: URNIC_SIM_TRACE_QPN=<qpn> prints every frame to that QPN when
// it is sent (time: when it leaves the transmit queue; marked LOST, CORR,
// HELD or DUP by what the link did to it) and when it arrives, and every
// frame that arrives damaged. Off by default.
uint32_t trace_qpn() {
  static const uint32_t q =
      static_cast<uint32_t>(env_u64("URNIC_SIM_TRACE_QPN", 0));
  return q;
}

void trace_frame(uint64_t now, const char* host, const char* what,
                 const uint8_t* f, uint32_t len) {
  wire::FrameInfo fi;
  wire::decode(f, len, fi);
  if (fi.kind != wire::FrameKind::kRoce) {
    std::printf("%10" PRIu64 " %s %-8s (not RoCE: %s)\n", now, host, what,
                wire::malformed_name(fi.why));
    return;
  }
  const wire::RoceFields& r = fi.roce;
  if (r.dqpn != trace_qpn()) return;
  std::printf("%10" PRIu64 " %s %-8s %-22s psn %06x%s len %u", now, host, what,
              fi.op->name, r.psn, r.ack_req ? " A" : "  ", r.payload_len);
  if (fi.op->has_ext(wire::Ext::kReth)) {
    std::printf(" reth va %" PRIx64 " len %u", r.reth_va, r.reth_len);
  }
  if (fi.op->has_ext(wire::Ext::kAeth)) {
    std::printf(" aeth %02x msn %u", r.aeth_syndrome, r.aeth_msn);
  }
  std::printf("\n");
}

// ---------------------------------------------------------------------------
// Link side: a PacketIo into the SimLink, with a 25 Gb/s transmit queue
// (frames leave the host one after another; a full queue refuses, as a NIC
// TX ring does) and, optionally, random refusals.

class SimIo final : public PacketIo {
 public:
  SimIo(SimLink& link, int ep, const uint64_t* now, double refuse,
        uint64_t seed, uint64_t queue_ns)
      : link_(link),
        ep_(ep),
        now_(now),
        refuse_(refuse),
        rng_(seed),
        queue_ns_(queue_ns) {}

  bool transmit(const TxFrame& f) override {
    const uint64_t now = *now_;
    if (refuse_ > 0 && rng_.chance(refuse_)) {
      ++refused;
      return false;
    }
    const uint64_t start = std::max(now, free_at_);
    if (start - now > queue_ns_) {
      ++queue_full;
      return false;
    }
    const uint32_t len = f.frame_len();
    buf_.resize(len);
    f.copy_to(buf_.data());
    // The frame is sent when its last bit is.
    free_at_ = start + tx_ns(len);
    const SimLinkStats before = link_.stats(ep_);
    link_.send(ep_, buf_, free_at_);
    if (trace_qpn()) {
      // What the link did to it: lost, corrupted, held back, duplicated.
      const SimLinkStats& st = link_.stats(ep_);
      trace_frame(free_at_, ep_ ? "B" : "A",
                  st.lost != before.lost               ? "tx LOST"
                  : st.corrupted != before.corrupted   ? "tx CORR"
                  : st.reordered != before.reordered   ? "tx HELD"
                  : st.duplicated != before.duplicated ? "tx DUP"
                                                       : "tx",
                  buf_.data(), len);
    }
    ++frames;
    bytes += len;
    return true;
  }
  // When the engine should try again after a refusal: once half the queue
  // has drained (polling for every single freed slot costs a pass over all
  // ready QPs each time).
  uint64_t room_at() const {
    return free_at_ > queue_ns_ / 2 ? free_at_ - queue_ns_ / 2 : 0;
  }

  uint64_t refused = 0, queue_full = 0, frames = 0, bytes = 0;

 private:
  SimLink& link_;
  int ep_;
  const uint64_t* now_;
  double refuse_;
  Rng rng_;
  uint64_t queue_ns_;
  uint64_t free_at_ = 0;
  std::vector<uint8_t> buf_;
};

class TableResolver final : public Resolver {
 public:
  void add(const uint8_t gid[16], const wire::MacAddr& mac) {
    std::array<uint8_t, 16> g;
    std::memcpy(g.data(), gid, 16);
    t_.push_back({g, mac});
  }
  int resolve(const uint8_t dgid[16], wire::MacAddr* mac) override {
    for (const auto& [g, m] : t_) {
      if (std::memcmp(g.data(), dgid, 16) == 0) {
        *mac = m;
        return 0;
      }
    }
    return EHOSTUNREACH;
  }

 private:
  std::vector<std::pair<std::array<uint8_t, 16>, wire::MacAddr>> t_;
};

// ---------------------------------------------------------------------------
// Hosts, memory, QP directions.

struct Piece {
  uint64_t off;  // in the host's arena
  uint32_t len;
};

struct Region {
  uint64_t off = 0;
  uint64_t len = 0;
};

struct MrSpan {
  uint64_t off, len;
  Mr* mr;
  const char* what;
};

struct Dir;

struct Host {
  int idx = 0;
  const char* name = "";
  uint32_t ip = 0;
  uint8_t gid[16] = {};
  wire::MacAddr mac{};
  TableResolver resolver;
  std::unique_ptr<Device> dev;
  std::unique_ptr<SimIo> io;
  // One engine per worker lcore (SimParams::homes), sharing the host's
  // transmit queue; a QP lives in the engine its QPN names.
  std::vector<std::unique_ptr<Engine>> engs;
  Engine& eng_of(uint32_t qpn) { return *engs[engs[0]->home_of(qpn)]; }
  bool busy() const {
    for (const auto& e : engs)
      if (e->busy()) return true;
    return false;
  }
  Pd* pd = nullptr;
  std::vector<Cq*> scq, rcq;
  std::vector<Qp*> qps;
  Region src;  // immutable pattern: SEND/WRITE sources
  uint64_t size = 0;
  std::unique_ptr<uint8_t[]> mem, model;
  uint64_t iova_base = 0;
  std::vector<MrSpan> mrs;  // sorted by off
  std::unordered_map<uint32_t, Dir*> by_send_qpn, by_recv_qpn;
  uint64_t rx_frames = 0, icrc_drops = 0, other_drops = 0, l2_drops = 0,
           split_frames = 0;
  uint64_t last_poll = 0;

  uint64_t reserve(uint64_t len, uint64_t align) {
    size = (size + align - 1) / align * align;
    const uint64_t off = size;
    size += len;
    return off;
  }
  const MrSpan& span_of(uint64_t off) const {
    auto it =
        std::upper_bound(mrs.begin(), mrs.end(), off,
                         [](uint64_t o, const MrSpan& s) { return o < s.off; });
    return *(it - 1);
  }
  uint64_t iova(uint64_t off) const {
    const MrSpan& s = span_of(off);
    return s.mr->iova() + (off - s.off);
  }
  Sge sge(const Piece& p) const {
    const MrSpan& s = span_of(p.off);
    return Sge{s.mr->iova() + (p.off - s.off), p.len, s.mr->lkey()};
  }
};

enum class Kind : uint8_t { kRc, kUc, kUd };

const char* kind_name(Kind k) {
  return k == Kind::kRc ? "rc" : k == Kind::kUc ? "uc" : "ud";
}

// A posted send WR not yet retired (completed, or passed by a later
// completion when unsignaled).
struct SendRec {
  uint64_t wr_id = 0;
  uint64_t seq = 0;
  ibv_wr_opcode op = IBV_WR_SEND;
  uint32_t len = 0;
  uint32_t flags = 0;
  bool signaled = false;
  bool big = false;
  bool inl = false;
  uint32_t nsge = 0;
  std::vector<Piece> dest;  // READ/atomic: where the result lands (local)
  uint64_t rem_off = 0;     // remote range (arena offset on the responder)
  uint64_t rem_len = 0;
  std::vector<uint8_t> expect;  // READ data / atomic original (host order)
};

// A message that consumes a receive WR, as the model expects to see it.
struct Consumer {
  uint64_t send_wr_id = 0;
  uint64_t seq = 0;
  uint8_t kind = 0;  // 0 SEND, 1 SEND_WITH_IMM, 2 RDMA_WRITE_WITH_IMM
  uint32_t imm = 0;
  uint32_t len = 0;
  std::vector<uint8_t> payload;  // SEND data
};

struct RecvRec {
  uint64_t wr_id = 0;
  uint64_t seq = 0;
  std::vector<Piece> pieces;
  uint32_t cap = 0;  // bytes the buffers hold (UD: including the GRH)
  uint64_t span_off = 0, span_len = 0;  // in the receive ring (arena offsets)
};

// One direction of a QP pair: `rq` host's QP sends to `rs` host's QP.
struct Dir {
  int id = 0;
  std::string name;
  Kind kind = Kind::kRc;
  bool use_srq = false;
  bool exact = true;  // receives matched in order (else: membership)
  bool big = false;   // may move 1-4 MiB messages
  Host* rq = nullptr;
  Host* rs = nullptr;
  Qp* qp = nullptr;    // on rq
  Qp* peer = nullptr;  // on rs
  Srq* srq = nullptr;  // on rs, if use_srq
  Ah* ah = nullptr;    // UD
  uint32_t mtu = 1024;
  bool sig_all = false;
  Region sink, remote, ring;
  uint32_t cap = 1;         // outstanding send WRs
  uint32_t rq_cap = 1;      // posted receive WRs
  uint32_t recv_ahead = 1;  // receives kept posted beyond known messages
  uint32_t max_msg = 0;
  uint32_t max_sge = 1;
  uint32_t max_inline = 0;
  uint64_t quota = 0, posted = 0, seq = 0, rseq = 0;
  Fifo<SendRec> sq;
  Fifo<Consumer> cons;  // exact: posted, not yet received
  uint64_t cons_done = 0;
  Fifo<RecvRec> recvs;  // posted, not yet completed
  uint64_t recv_done = 0;
  uint64_t dry_until = 0;
  std::unordered_set<uint64_t> sent;  // !exact: digests of sent messages
  uint64_t send_wcs = 0, recv_wcs = 0, rnr_dry = 0;
  bool dirty = false;
  Rng rng;

  uint64_t cons_posted() const { return cons_done + cons.size(); }
  uint64_t recv_posted() const { return recv_done + recvs.size(); }
};

// ---------------------------------------------------------------------------

struct SimParams {
  const char* test = "";
  uint64_t seed = 1;
  double loss = 0, duplicate = 0, reorder = 0, corrupt = 0;
  uint64_t jitter_ns = 0;
  double tx_refuse = 0;            // random transmit() refusals
  uint64_t tx_queue_ns = 4 * kUs;  // transmit queue depth (in wire time)
  uint64_t ops = 100000;
  uint32_t rc_pairs = 8;
  uint32_t big_pairs = 2;  // RC pairs that may move 1-4 MiB (+ the SRQ pair)
  bool srq_pair = true, ud_pair = true, uc_pair = true;
  bool clean = false;  // no impairment: exact UC/UD, RNR by dry receive queues
  bool tiny = false;   // the many-QP run: smallest queues, small messages
  // A switch queue on the link (SimLinkParams): rate, buffer, ECN threshold,
  // and the share of the frames sent it may tail-drop (congestion control
  // is to keep it below).
  uint64_t rate_mbps = 0, queue_bytes = 0, ecn_bytes = 0;
  double max_queue_drops = 1;
  uint32_t homes = 1;     // engines per host (worker lcores)
  bool uc_paced = false;  // the UC pair must have been sent CNPs and paced
};

std::string describe(const SimParams& p) {
  return fmt(
      "%s seed=0x%" PRIx64 " ops=%" PRIu64
      " loss=%g dup=%g reorder=%g corrupt=%g jitter=%" PRIu64
      "ns tx_refuse=%g rc_pairs=%u%s\n  replay: URNIC_SIM_SEED=0x%" PRIx64
      " URNIC_SIM_OPS=%" PRIu64
      " build/tests/unit/test_transport_sim --gtest_filter=TransportSim.%s",
      p.test, p.seed, p.ops, p.loss, p.duplicate, p.reorder, p.corrupt,
      p.jitter_ns, p.tx_refuse, p.rc_pairs, p.tiny ? " (many QPs)" : "", p.seed,
      p.ops, p.test);
}

bool overlap(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen) {
  return alen && blen && a < b + blen && b < a + alen;
}

class Sim {
 public:
  explicit Sim(const SimParams& p);
  void run();

 private:
  // Set-up.
  void make_hosts();
  void make_pairs();
  void connect(Dir& ab, Dir& ba, Kind kind, uint32_t pair);
  void modify_to_rts(Qp* qp, Host& self, Host& peer, Kind kind, uint32_t mtu,
                     uint32_t dest_qpn, uint32_t sq_psn, uint32_t rq_psn,
                     uint8_t timeout, uint8_t min_rnr, uint8_t rd_atomic,
                     uint8_t dest_rd_atomic);

  // Workload.
  uint32_t refill(Dir& d);
  uint32_t post_recvs(Dir& d);
  bool post_one_send(Dir& d);
  uint32_t draw_size(Dir& d, bool big_ok);
  std::vector<Piece> split(Dir& d, uint64_t off, uint32_t len, uint32_t k,
                           uint32_t max_gap);
  uint32_t draw_sges(Dir& d, uint32_t len, uint32_t max);
  std::vector<Piece> source_pieces(Dir& d, uint32_t len, bool from_sink,
                                   uint32_t k);
  bool place_dest(Dir& d, uint64_t span, uint64_t* off);
  bool big_outstanding(Dir& d);
  bool ring_alloc(Dir& d, uint64_t n, uint64_t* off);

  // Completions.
  uint32_t poll_cqs();
  void on_send_wc(Host& h, const ibv_wc& wc);
  void on_recv_wc(Host& h, const ibv_wc& wc);
  void retire(Dir& d, SendRec& r, bool ok);
  // A QP that completed a WR in error: its first error is reported, the
  // flushes that follow are not.
  bool dead(const Dir& d) const {
    return dead_.count(d.qp) != 0 || dead_.count(d.peer) != 0;
  }
  bool check_grh(Dir& d, const uint8_t* g, bool imm, uint32_t len);

  // Driver.
  uint32_t deliver(Host& h);
  bool finished();
  void mark(Dir& d) {
    if (!d.dirty) {
      d.dirty = true;
      dirty_.push_back(&d);
    }
  }
  void final_checks();
  void report();

  void fail(const std::string& what);
  std::string wr_str(const Dir& d, const SendRec& r) const;
  std::string dump(Dir& d);
  bool stopped() const { return failures_ >= kMaxFailures || stuck_; }

  // Memory helpers.
  static std::vector<uint8_t> gather(const uint8_t* base,
                                     const std::vector<Piece>& ps,
                                     uint64_t max = UINT64_MAX);
  static void scatter(uint8_t* base, const std::vector<Piece>& ps,
                      const uint8_t* data, uint64_t len);

  SimParams p_;
  Rng rng_;
  SimLink link_;
  uint64_t now_ = 0;
  Host h_[2];
  std::vector<std::unique_ptr<Dir>> dirs_;
  std::vector<Dir*> dirty_, todo_;
  std::vector<Dir*> dry_;
  std::vector<std::vector<uint8_t>> rxq_;
  uint32_t failures_ = 0;
  bool stuck_ = false;
  std::unordered_set<const Qp*> dead_;
  uint64_t flushed_ = 0;
  uint64_t last_progress_ = 0;
  uint64_t ops_done_ = 0, recvs_done_ = 0;
  uint64_t loop_iters_ = 0;
  std::chrono::steady_clock::time_point t0_;
};

SimLinkParams link_params(const SimParams& p) {
  SimLinkParams l;
  l.seed = p.seed;
  l.loss = p.loss;
  l.duplicate = p.duplicate;
  l.reorder = p.reorder;
  l.corrupt = p.corrupt;
  l.delay_ns = 1000;
  l.jitter_ns = p.jitter_ns;
  l.reorder_hold_ns = 20000;
  l.rate_mbps = p.rate_mbps;
  l.queue_bytes = p.queue_bytes;
  l.ecn_bytes = p.ecn_bytes;
  return l;
}

Sim::Sim(const SimParams& p)
    : p_(p), rng_(p.seed ^ 0xa5a5a5a5a5a5a5a5ull), link_(link_params(p)) {}

void Sim::fail(const std::string& what) {
  ++failures_;
  ADD_FAILURE() << "t=" << now_ << "ns: " << what;
}

std::string Sim::wr_str(const Dir& d, const SendRec& r) const {
  return fmt(
      "%s WR #%" PRIu64 " wr_id=0x%" PRIx64 " %s len=%u sge=%u flags=0x%x%s%s",
      d.name.c_str(), r.seq, r.wr_id, wr_op_name(r.op), r.len, r.nsge, r.flags,
      r.signaled ? " signaled" : " unsignaled", r.inl ? " inline" : "");
}

std::string Sim::dump(Dir& d) {
  std::string s = fmt(
      "%s: qpn 0x%x (%s) -> qpn 0x%x (%s), mtu %u, posted %" PRIu64 "/%" PRIu64
      ", %zu outstanding, %zu messages and %zu receives pending",
      d.name.c_str(), d.qp->qpn(), qp_state_name(d.qp->state()), d.peer->qpn(),
      qp_state_name(d.peer->state()), d.mtu, d.posted, d.quota, d.sq.size(),
      d.cons.size(), d.recvs.size());
  if (!d.sq.empty()) s += "\n    oldest: " + wr_str(d, d.sq.front());
  const QpCounters& c = d.qp->counters();
  s += fmt("\n    requester qp: tx %" PRIu64 " rx %" PRIu64 " retx %" PRIu64
           " timeouts %" PRIu64 " rnr_waits %" PRIu64 " naks_rx %" PRIu64
           " acks_rx %" PRIu64,
           c.tx_packets.get(), c.rx_packets.get(), c.retransmits.get(),
           c.timeouts.get(), c.rnr_waits.get(), c.naks_rx(), c.acks_rx.get());
  const QpCounters& q = d.peer->counters();
  s += fmt("\n    responder qp: tx %" PRIu64 " rx %" PRIu64 " naks_tx %" PRIu64
           " dup %" PRIu64 " out_of_seq %" PRIu64 " acks_tx %" PRIu64,
           q.tx_packets.get(), q.rx_packets.get(), q.naks_tx(),
           q.dup_packets.get(), q.out_of_seq.get(), q.acks_tx.get());
  return s;
}

std::vector<uint8_t> Sim::gather(const uint8_t* base,
                                 const std::vector<Piece>& ps, uint64_t max) {
  std::vector<uint8_t> out;
  for (const Piece& p : ps) {
    if (out.size() >= max) break;
    const uint64_t n = std::min<uint64_t>(p.len, max - out.size());
    out.insert(out.end(), base + p.off, base + p.off + n);
  }
  return out;
}

void Sim::scatter(uint8_t* base, const std::vector<Piece>& ps,
                  const uint8_t* data, uint64_t len) {
  uint64_t done = 0;
  for (const Piece& p : ps) {
    if (done >= len) break;
    const uint64_t n = std::min<uint64_t>(p.len, len - done);
    std::memcpy(base + p.off, data + done, n);
    done += n;
  }
}

// ---------------------------------------------------------------------------
// Set-up

void Sim::make_hosts() {
  for (int i = 0; i < 2; ++i) {
    Host& h = h_[i];
    h.idx = i;
    h.name = i == 0 ? "A" : "B";
    h.ip = 0x0a000001u + static_cast<uint32_t>(i);
    wire::gid_from_ipv4(h.ip, h.gid);
    h.mac = wire::MacAddr{
        {0x02, 0x00, 0x5e, 0x00, 0x00, static_cast<uint8_t>(0x01 + i)}};
    h.iova_base = (0x7e00ull + static_cast<uint64_t>(i)) << 32;
  }
  for (int i = 0; i < 2; ++i) {
    Host& h = h_[i];
    Host& o = h_[1 - i];
    h.resolver.add(o.gid, o.mac);
    DeviceConfig cfg;
    cfg.mac = h.mac;
    std::memcpy(cfg.gids[0], h.gid, 16);
    cfg.num_gids = 1;
    cfg.key_seed = p_.seed * 2 + static_cast<uint64_t>(i) + 1;
    cfg.active_mtu = IBV_MTU_4096;
    h.dev = std::make_unique<Device>(cfg, &h.resolver);
    h.io = std::make_unique<SimIo>(link_, i, &now_, p_.tx_refuse,
                                   p_.seed + 77 + static_cast<uint64_t>(i),
                                   p_.tx_queue_ns);
    for (uint32_t e = 0; e < p_.homes; ++e) {
      EngineConfig ec;
      ec.home = e;
      ec.homes = p_.homes;
      h.engs.push_back(std::make_unique<Engine>(*h.dev, *h.io, ec, 0));
    }
    ASSERT_EQ(h.dev->alloc_pd(&h.pd), 0);
    const int ncq = p_.tiny ? 1 : 2;
    for (int c = 0; c < ncq; ++c) {
      Cq* cq = nullptr;
      ASSERT_EQ(h.dev->create_cq(p_.tiny ? 65536 : 4096, &cq), 0);
      h.scq.push_back(cq);
      ASSERT_EQ(h.dev->create_cq(p_.tiny ? 65536 : 4096, &cq), 0);
      h.rcq.push_back(cq);
    }
  }
}

void Sim::modify_to_rts(Qp* qp, Host& self, Host& peer, Kind kind, uint32_t mtu,
                        uint32_t dest_qpn, uint32_t sq_psn, uint32_t rq_psn,
                        uint8_t timeout, uint8_t min_rnr, uint8_t rd_atomic,
                        uint8_t dest_rd_atomic) {
  Engine& e = self.eng_of(qp->qpn());
  test::QpPath p;
  p.type = kind == Kind::kUd   ? IBV_QPT_UD
           : kind == Kind::kUc ? IBV_QPT_UC
                               : IBV_QPT_RC;
  p.qkey = kUdQkey;
  p.access = kAccessAll;
  p.mtu = mtu == 4096 ? IBV_MTU_4096 : IBV_MTU_1024;
  p.peer_qpn = dest_qpn;
  std::memcpy(p.peer_gid, peer.gid, 16);
  p.sq_psn = sq_psn;
  p.rq_psn = rq_psn;
  p.timeout = timeout;
  p.min_rnr_timer = min_rnr;
  p.max_rd_atomic = rd_atomic;
  p.max_dest_rd_atomic = dest_rd_atomic;
  ASSERT_EQ(test::bring_up(e, qp, p), 0) << "RESET->RTS";
  ASSERT_EQ(qp->state(), IBV_QPS_RTS);
}

// Both directions of one pair: memory, QPs, attributes.
void Sim::connect(Dir& ab, Dir& ba, Kind kind, uint32_t pair) {
  Host& a = h_[0];
  Host& b = h_[1];
  const bool tiny = p_.tiny;
  QpInitAttr ia[2];
  Qp* qp[2] = {nullptr, nullptr};
  Srq* srq = nullptr;
  if (ab.use_srq) {
    ASSERT_EQ(b.dev->create_srq(b.pd, 128, kMaxSge, &srq), 0);
    ab.srq = srq;
  }
  for (int i = 0; i < 2; ++i) {
    Host& h = h_[i];
    QpInitAttr& at = ia[i];
    at.qp_type = kind == Kind::kRc   ? IBV_QPT_RC
                 : kind == Kind::kUc ? IBV_QPT_UC
                                     : IBV_QPT_UD;
    at.pd = h.pd;
    at.send_cq = h.scq[pair % h.scq.size()];
    at.recv_cq = h.rcq[(pair / 2) % h.rcq.size()];
    at.srq = (i == 1) ? srq : nullptr;
    at.cap.max_send_wr = tiny ? 1 : 32;
    at.cap.max_recv_wr = tiny ? 1 : 64;
    at.cap.max_send_sge = tiny ? 1 : kMaxSge;
    at.cap.max_recv_sge = tiny ? 1 : kMaxSge;
    at.cap.max_inline_data = tiny ? 0 : kMaxInline;
    at.sq_sig_all = (i == 0 ? ab.sig_all : ba.sig_all);
    // With two engines, the pairs sharing a send CQ (pair % 2) or a
    // receive CQ ((pair / 2) % 2) are on different engines.
    Engine& eng = *h.engs[(pair + pair / 2) % p_.homes];
    const int rc = eng.create_qp(at, &qp[i]);
    ASSERT_EQ(rc, 0) << "create_qp #" << h.qps.size() << " on " << h.name;
    h.qps.push_back(qp[i]);
  }
  ab.qp = qp[0];
  ab.peer = qp[1];
  ba.qp = qp[1];
  ba.peer = qp[0];
  for (Dir* d : {&ab, &ba}) {
    d->kind = kind;
    d->max_sge = tiny ? 1 : kMaxSge;
    d->max_inline = tiny ? 0 : kMaxInline;
    d->cap =
        tiny ? 1
             : static_cast<uint32_t>(rng_.pick<uint32_t>({1, 2, 4, 8, 16, 24}));
    d->rq_cap = d->use_srq ? 128 : (tiny ? 1 : 64);
    d->exact = kind == Kind::kRc || p_.clean;
    if (kind == Kind::kRc) {
      d->recv_ahead = tiny ? 1 : static_cast<uint32_t>(rng_.uniform(1, 8));
    } else {
      d->recv_ahead = std::min<uint32_t>(d->rq_cap, d->cap + 16);
    }
    d->rq->by_send_qpn[d->qp->qpn()] = d;
    d->rs->by_recv_qpn[d->peer->qpn()] = d;
  }
  if (kind == Kind::kUd) {
    for (Dir* d : {&ab, &ba}) {
      ibv_ah_attr ah{};
      ah.is_global = 1;
      ah.port_num = 1;
      std::memcpy(ah.grh.dgid.raw, d->rs->gid, 16);
      ah.grh.sgid_index = 0;
      ah.grh.hop_limit = 64;
      ASSERT_EQ(d->rq->dev->create_ah(d->rq->pd, ah, &d->ah), 0);
    }
  }
  // Attributes: path MTU 1024 or 4096, random PSNs (some about to wrap),
  // timeout 8..10 (1..4 ms), RNR timer 0.01..0.06 ms.
  const uint32_t mtu = rng_.chance(0.5) ? 4096 : 1024;
  ab.mtu = ba.mtu = kind == Kind::kUd ? 4096 : mtu;
  uint32_t psn[2];
  for (uint32_t& x : psn) {
    x = rng_.chance(0.25)
            ? 0xffffff - static_cast<uint32_t>(rng_.uniform(0, 40))
            : static_cast<uint32_t>(rng_.uniform(0, 0xffffff));
  }
  const uint8_t timeout = static_cast<uint8_t>(rng_.uniform(8, 10));
  uint8_t rd[2], dest_rd[2];
  for (int i = 0; i < 2; ++i) {
    rd[i] = static_cast<uint8_t>(rng_.pick<uint32_t>({1, 2, 4, 8, 16}));
  }
  for (int i = 0; i < 2; ++i) {
    dest_rd[i] = rng_.chance(0.5) ? rd[1 - i] : 16;
  }
  const uint8_t min_rnr = static_cast<uint8_t>(rng_.uniform(1, 5));
  modify_to_rts(qp[0], a, b, kind, mtu, qp[1]->qpn(), psn[0], psn[1], timeout,
                min_rnr, rd[0], dest_rd[0]);
  modify_to_rts(qp[1], b, a, kind, mtu, qp[0]->qpn(), psn[1], psn[0], timeout,
                min_rnr, rd[1], dest_rd[1]);
}

void Sim::make_pairs() {
  struct Spec {
    Kind kind;
    bool srq, big;
  };
  std::vector<Spec> specs;
  for (uint32_t i = 0; i < p_.rc_pairs; ++i) {
    specs.push_back({Kind::kRc, false, !p_.tiny && i < p_.big_pairs});
  }
  if (p_.srq_pair) specs.push_back({Kind::kRc, true, p_.big_pairs > 0});
  if (p_.ud_pair) specs.push_back({Kind::kUd, false, false});
  if (p_.uc_pair) specs.push_back({Kind::kUc, false, false});

  const uint64_t ndirs = specs.size() * 2;
  const uint64_t per_dir = std::max<uint64_t>(1, p_.ops / ndirs);
  uint64_t left = std::max(p_.ops, ndirs);

  // Memory layout first (each host's arena), then the QPs.
  const uint64_t align = p_.tiny ? 64 : 4096;
  const uint64_t big_max = 4 * kMiB, small_max = p_.tiny ? 64 : 64 * kKiB;
  const uint64_t src_len = p_.tiny ? 64 * kKiB : big_max + 64 * kKiB;
  for (Host& h : h_) h.src = {h.reserve(src_len, align), src_len};
  for (size_t s = 0; s < specs.size(); ++s) {
    for (int i = 0; i < 2; ++i) {
      auto d = std::make_unique<Dir>();
      d->id = static_cast<int>(dirs_.size());
      d->rq = &h_[i];
      d->rs = &h_[1 - i];
      d->kind = specs[s].kind;
      d->use_srq = specs[s].srq && i == 0;
      d->big = specs[s].big;
      d->sig_all = !p_.tiny && s == 1;  // one pair: sq_sig_all
      d->rng = Rng(p_.seed * 1000003 + static_cast<uint64_t>(d->id));
      d->name = fmt("%s%zu%s %s->%s", kind_name(d->kind), s,
                    specs[s].srq ? "(srq)" : "", d->rq->name, d->rs->name);
      const bool exact = d->kind == Kind::kRc || p_.clean;
      if (d->kind == Kind::kUd) {
        d->max_msg = 4096;
      } else if (!exact) {
        d->max_msg = 16 * kKiB;
      } else {
        d->max_msg = static_cast<uint32_t>(d->big ? big_max : small_max);
      }
      const uint64_t m = d->max_msg;
      d->sink = {d->rq->reserve(p_.tiny ? 256 : m + m / 16 + 64 * kKiB, align),
                 p_.tiny ? 256 : m + m / 16 + 64 * kKiB};
      if (d->kind != Kind::kUd) {
        const uint64_t rlen = p_.tiny ? 256 : m + 64 * kKiB;
        d->remote = {d->rs->reserve(rlen, align), rlen};
      }
      uint64_t ring = 0;
      if (p_.tiny) {
        ring = 512;
      } else if (!exact || d->kind == Kind::kUd) {
        ring = (m + kGrhSize + 256) * 40;
      } else {
        ring = m + m / 8 + 256 * kKiB;
      }
      d->ring = {d->rs->reserve(ring, align), ring};
      d->quota = std::min(per_dir, left);
      left -= d->quota;
      dirs_.push_back(std::move(d));
    }
  }
  dirs_.back()->quota += left;

  // Arenas: seeded random contents, the model a copy; MRs with iova !=
  // host address.
  for (Host& h : h_) {
    h.size = (h.size + 4095) / 4096 * 4096;
    h.mem.reset(new uint8_t[h.size]);
    h.model.reset(new uint8_t[h.size]);
    Rng fill(p_.seed + 0x1234 + static_cast<uint64_t>(h.idx));
    for (uint64_t i = 0; i < h.size; i += 8) {
      const uint64_t v = fill.next();
      std::memcpy(h.mem.get() + i, &v, 8);
    }
    std::memcpy(h.model.get(), h.mem.get(), h.size);
    auto reg = [&](uint64_t off, uint64_t len, uint32_t access,
                   const char* what) {
      Mr* mr = nullptr;
      const int rc = h.dev->reg_mr(h.pd, h.mem.get() + off, len,
                                   h.iova_base + off, access, &mr);
      ASSERT_EQ(rc, 0) << "reg_mr " << what;
      h.mrs.push_back({off, len, mr, what});
    };
    reg(h.src.off, h.src.len, 0, "src");
    if (p_.tiny) {
      // One MR for all the QPs' regions (98304 regions > max_mr).
      const uint64_t off = h.src.off + h.src.len;
      reg(off, h.size - off, kAccessAll, "data");
    }
  }
  if (!p_.tiny) {
    // Own MR per region, in arena order.
    struct R {
      Host* h;
      Region r;
      uint32_t access;
      const char* what;
    };
    std::vector<R> rs;
    for (auto& d : dirs_) {
      rs.push_back({d->rq, d->sink, IBV_ACCESS_LOCAL_WRITE, "sink"});
      if (d->remote.len) rs.push_back({d->rs, d->remote, kAccessAll, "remote"});
      rs.push_back({d->rs, d->ring, IBV_ACCESS_LOCAL_WRITE, "recv"});
    }
    std::sort(rs.begin(), rs.end(),
              [](const R& x, const R& y) { return x.r.off < y.r.off; });
    for (const R& r : rs) {
      Mr* mr = nullptr;
      ASSERT_EQ(r.h->dev->reg_mr(r.h->pd, r.h->mem.get() + r.r.off, r.r.len,
                                 r.h->iova_base + r.r.off, r.access, &mr),
                0);
      r.h->mrs.push_back({r.r.off, r.r.len, mr, r.what});
    }
    for (Host& h : h_) {
      std::sort(h.mrs.begin(), h.mrs.end(),
                [](const MrSpan& x, const MrSpan& y) { return x.off < y.off; });
    }
  }

  for (size_t s = 0; s < specs.size(); ++s) {
    connect(*dirs_[2 * s], *dirs_[2 * s + 1], specs[s].kind,
            static_cast<uint32_t>(s));
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// ---------------------------------------------------------------------------
// Workload

// 3% empty, ~69% 1..256 B, ~28% 257 B..64 KiB (log-uniform), 0.3% 1..4 MiB
// where allowed.
uint32_t Sim::draw_size(Dir& d, bool big_ok) {
  Rng& r = d.rng;
  const double x = r.real();
  uint64_t n;
  if (p_.tiny) {
    n = x < 0.05 ? 0 : r.uniform(1, 64);
  } else if (x < 0.03) {
    n = 0;
  } else if (x < 0.72) {
    n = r.uniform(1, 256);
  } else if (x < 0.997 || !big_ok) {
    const uint64_t bits = r.uniform(9, 16);
    n = r.uniform((uint64_t{1} << (bits - 1)) + 1, uint64_t{1} << bits);
  } else {
    n = r.uniform(1 * kMiB, 4 * kMiB);
  }
  return static_cast<uint32_t>(std::min<uint64_t>(n, d.max_msg));
}

uint32_t Sim::draw_sges(Dir& d, uint32_t len, uint32_t max) {
  if (len == 0) return 0;
  max = std::min(max, d.max_sge);
  const double x = d.rng.real();
  uint32_t k = x < 0.6   ? 1
               : x < 0.9 ? static_cast<uint32_t>(d.rng.uniform(2, 4))
                         : static_cast<uint32_t>(d.rng.uniform(5, 16));
  return std::max<uint32_t>(1, std::min({k, max, len}));
}

// `len` bytes from `off` on, cut into `k` non-empty pieces with gaps of up to
// `max_gap` bytes between them (span: len + gaps <= len + (k-1)*max_gap).
std::vector<Piece> Sim::split(Dir& d, uint64_t off, uint32_t len, uint32_t k,
                              uint32_t max_gap) {
  std::vector<Piece> ps;
  if (k == 0) return ps;
  std::vector<uint32_t> cuts;
  for (uint32_t i = 1; i < k; ++i) {
    cuts.push_back(static_cast<uint32_t>(d.rng.uniform(1, len - 1)));
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  cuts.push_back(len);
  uint32_t prev = 0;
  for (uint32_t c : cuts) {
    ps.push_back({off, c - prev});
    off += c - prev;
    off += max_gap ? d.rng.uniform(0, max_gap) : 0;
    prev = c;
  }
  return ps;
}

// Sources of a SEND/WRITE: each piece at its own random place in the
// immutable pattern area, or (from_sink) in the direction's sink, where
// earlier READs and atomics land.
std::vector<Piece> Sim::source_pieces(Dir& d, uint32_t len, bool from_sink,
                                      uint32_t k) {
  std::vector<Piece> ps = split(d, 0, len, k, 0);
  const Region area = from_sink ? d.sink : d.rq->src;
  for (Piece& p : ps) p.off = area.off + d.rng.uniform(0, area.len - p.len);
  return ps;
}

bool Sim::big_outstanding(Dir& d) {
  for (SendRec& r : d.sq) {
    if (r.big) return true;
  }
  return false;
}

// A place in the sink for `span` bytes that no unretired READ/atomic result
// overlaps (so each one can be checked when it completes).
bool Sim::place_dest(Dir& d, uint64_t span, uint64_t* off) {
  std::vector<std::pair<uint64_t, uint64_t>> busy;  // [from, to)
  for (SendRec& r : d.sq) {
    for (const Piece& p : r.dest) busy.push_back({p.off, p.off + p.len});
  }
  for (int t = 0; t < 4; ++t) {
    const uint64_t o = d.sink.off + d.rng.uniform(0, d.sink.len - span);
    bool ok = true;
    for (auto& [f, e] : busy) ok = ok && !overlap(o, span, f, e - f);
    if (ok) {
      *off = o;
      return true;
    }
  }
  std::sort(busy.begin(), busy.end());
  std::vector<std::pair<uint64_t, uint64_t>> gaps;
  uint64_t at = d.sink.off;
  for (auto& [f, e] : busy) {
    if (f > at && f - at >= span) gaps.push_back({at, f});
    at = std::max(at, e);
  }
  if (d.sink.off + d.sink.len - at >= span) {
    gaps.push_back({at, d.sink.off + d.sink.len});
  }
  if (gaps.empty()) return false;
  const auto& g = gaps[d.rng.uniform(0, gaps.size() - 1)];
  *off = g.first + d.rng.uniform(0, g.second - g.first - span);
  return true;
}

// Receive buffers: a ring in posting order, freed in completion (= posting)
// order.
bool Sim::ring_alloc(Dir& d, uint64_t n, uint64_t* off) {
  n = std::max<uint64_t>(n, 1);
  const uint64_t base = d.ring.off, size = d.ring.len;
  if (n > size) return false;
  if (d.recvs.empty()) {
    *off = base;
    return true;
  }
  const uint64_t tail = d.recvs.front().span_off - base;
  const RecvRec& b = d.recvs.back();
  const uint64_t head = b.span_off - base + std::max<uint64_t>(b.span_len, 1);
  if (head > tail) {  // used: [tail, head)
    if (size - head >= n) {
      *off = base + head;
      return true;
    }
    if (tail >= n) {
      *off = base;
      return true;
    }
    return false;
  }
  if (tail - head >= n) {  // wrapped; free: [head, tail)
    *off = base + head;
    return true;
  }
  return false;
}

uint32_t Sim::post_recvs(Dir& d) {
  if (now_ < d.dry_until) return 0;
  uint32_t n = 0;
  const uint32_t grh = d.kind == Kind::kUd ? kGrhSize : 0;
  while (!stopped() && d.recvs.size() < d.rq_cap) {
    const uint64_t j = d.recv_posted();
    const bool needed = d.exact && j < d.cons_posted();
    if (!needed) {
      const uint64_t spare = d.exact ? j - d.cons_posted() : d.recvs.size();
      if (spare >= d.recv_ahead) break;
      // Clean link: now and then let an RC receive queue run dry for a
      // while, so SENDs meet RNR NAKs.
      if (p_.clean && d.kind == Kind::kRc && !p_.tiny && d.rng.chance(0.004)) {
        d.dry_until = now_ + d.rng.uniform(20, 400) * kUs;
        dry_.push_back(&d);
        ++d.rnr_dry;
        break;
      }
    }
    uint32_t cap;
    if (needed) {
      const Consumer& c = d.cons[j - d.cons_done];
      const uint32_t need = c.kind == 2 ? draw_size(d, false) : c.len;
      cap =
          need +
          (d.rng.chance(0.4) ? 0 : static_cast<uint32_t>(d.rng.uniform(1, 64)));
    } else if (!d.exact || d.kind == Kind::kUd) {
      cap = d.max_msg;  // any message must fit
    } else {
      cap =
          draw_size(d, d.big) +
          (d.rng.chance(0.3) ? 0 : static_cast<uint32_t>(d.rng.uniform(1, 64)));
      cap = std::min(cap, d.max_msg);
    }
    cap += grh;
    const uint32_t k = draw_sges(d, cap, 16);
    const uint32_t max_gap = p_.tiny ? 0 : 16;
    const uint64_t span = cap + uint64_t{max_gap} * (k ? k - 1 : 0);
    uint64_t off = 0;
    if (!ring_alloc(d, span, &off)) break;  // wait for receives to complete
    RecvRec rr;
    rr.seq = d.rseq++;
    rr.wr_id = (0xc3ull << 56) | (uint64_t(d.id) << 32) | rr.seq;
    rr.pieces = split(d, off, cap, k, max_gap);
    rr.cap = cap;
    rr.span_off = off;
    rr.span_len = span;
    RecvWr wr;
    wr.wr_id = rr.wr_id;
    wr.num_sge = static_cast<uint32_t>(rr.pieces.size());
    for (uint32_t i = 0; i < wr.num_sge; ++i) {
      wr.sg_list[i] = d.rs->sge(rr.pieces[i]);
    }
    const int rc = d.srq ? d.srq->post(wr)
                         : d.rs->eng_of(d.peer->qpn()).post_recv(d.peer, wr);
    if (rc != 0) {
      fail(fmt("%s: post_recv #%" PRIu64 " (%u SGEs, %u bytes) -> %d",
               d.name.c_str(), rr.seq, wr.num_sge, cap, rc));
      break;
    }
    d.recvs.push_back(std::move(rr));
    ++n;
  }
  return n;
}

bool Sim::post_one_send(Dir& d) {
  Rng& r = d.rng;
  Host& rq = *d.rq;
  Host& rs = *d.rs;
  // Which operation.
  ibv_wr_opcode op;
  const uint64_t x = r.uniform(0, 99);
  if (d.kind == Kind::kUd) {
    op = x < 70 ? IBV_WR_SEND : IBV_WR_SEND_WITH_IMM;
  } else if (d.kind == Kind::kUc) {
    op = x < 35   ? IBV_WR_SEND
         : x < 50 ? IBV_WR_SEND_WITH_IMM
         : x < 85 ? IBV_WR_RDMA_WRITE
                  : IBV_WR_RDMA_WRITE_WITH_IMM;
  } else {
    op = x < 18   ? IBV_WR_SEND
         : x < 28 ? IBV_WR_SEND_WITH_IMM
         : x < 46 ? IBV_WR_RDMA_WRITE
         : x < 56 ? IBV_WR_RDMA_WRITE_WITH_IMM
         : x < 78 ? IBV_WR_RDMA_READ
         : x < 89 ? IBV_WR_ATOMIC_CMP_AND_SWP
                  : IBV_WR_ATOMIC_FETCH_AND_ADD;
  }
  const uint64_t ci = d.cons_posted();
  // UC and UD drop a message that finds no receive WR: on the clean link,
  // post one only when its receive is there.
  const bool recv_known = d.exact && ci < d.recv_posted();
  if ((op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM ||
       op == IBV_WR_RDMA_WRITE_WITH_IMM) &&
      d.exact && d.kind != Kind::kRc && !recv_known) {
    if (d.kind == Kind::kUd) return false;
    op = IBV_WR_RDMA_WRITE;
  }
  const bool big_ok = d.big && !big_outstanding(d);
  bool is_atomic =
      op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD;
  uint32_t len = is_atomic ? 8 : draw_size(d, big_ok);

  // Local destination of READ / atomics: where no unfinished one lands (else
  // a WRITE instead).
  SendRec rec;
  if (op == IBV_WR_RDMA_READ || is_atomic) {
    const uint32_t k = is_atomic ? (r.chance(0.2) && d.max_sge > 1 ? 2 : 1)
                                 : draw_sges(d, len, 16);
    const uint32_t max_gap = p_.tiny ? 0 : 16;
    const uint64_t span = uint64_t{len} + uint64_t{max_gap} * (k ? k - 1 : 0);
    uint64_t off = 0;
    if (len == 0 || place_dest(d, span, &off)) {
      rec.dest = split(d, off, len, k, max_gap);
    } else {
      op = IBV_WR_RDMA_WRITE;
      is_atomic = false;
    }
  }
  const bool is_data = op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM ||
                       op == IBV_WR_RDMA_WRITE ||
                       op == IBV_WR_RDMA_WRITE_WITH_IMM;
  const bool is_send = op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM;
  const bool consumes = is_send || op == IBV_WR_RDMA_WRITE_WITH_IMM;
  rec.op = op;
  SendWr wr;
  wr.opcode = op;
  if (is_send && recv_known) {
    // The message must fit the receive WR it will land in: often exactly.
    const RecvRec& rr = d.recvs[ci - d.recv_done];
    const uint32_t room = rr.cap - (d.kind == Kind::kUd ? kGrhSize : 0);
    len = r.chance(0.5) ? room : std::min(len, room);
  }
  rec.len = len;
  rec.big = len > 64 * kKiB;

  std::vector<Piece> src;
  std::vector<uint8_t> data;  // what the message carries
  if (is_data) {
    rec.inl = d.max_inline > 0 && len <= d.max_inline && r.chance(0.3);
    const bool from_sink =
        !rec.inl && len > 0 && len <= d.sink.len / 2 && r.chance(0.1);
    src = source_pieces(d, len, from_sink, draw_sges(d, len, 16));
    data = gather(rq.model.get(), src);
    // A source where an unfinished READ/atomic lands: fence.
    for (SendRec& o : d.sq) {
      for (const Piece& q : o.dest) {
        for (const Piece& s : src) {
          if (overlap(s.off, s.len, q.off, q.len)) rec.flags |= IBV_SEND_FENCE;
        }
      }
    }
    if (rec.inl) rec.flags |= IBV_SEND_INLINE;
  }

  // Remote side of WRITE / READ / atomics.
  const bool remote_op = d.kind != Kind::kUd && !is_send;
  if (remote_op) {
    if (is_atomic) {
      rec.rem_off = r.chance(0.8)
                        ? d.remote.off + 8 * r.uniform(0, 7)
                        : d.remote.off + 8 * r.uniform(0, d.remote.len / 8 - 1);
      rec.rem_len = 8;
      wr.remote_addr = rs.iova(rec.rem_off);
      wr.rkey = rs.span_of(rec.rem_off).mr->rkey();
    } else if (len == 0 && r.chance(0.5)) {
      // A zero-length WRITE/READ: the rkey is not checked.
      wr.remote_addr = r.next();
      wr.rkey = static_cast<uint32_t>(r.next());
    } else {
      rec.rem_off = d.remote.off + r.uniform(0, d.remote.len - len);
      rec.rem_len = len;
      wr.remote_addr = rs.iova(rec.rem_off);
      wr.rkey = rs.span_of(rec.rem_off).mr->rkey();
    }
    // Changing what an unfinished READ reads: fence (a READ may be executed
    // again after a retransmission).
    if (op != IBV_WR_RDMA_READ) {
      for (SendRec& o : d.sq) {
        if (o.op == IBV_WR_RDMA_READ &&
            overlap(o.rem_off, o.rem_len, rec.rem_off, rec.rem_len)) {
          rec.flags |= IBV_SEND_FENCE;
        }
      }
    }
  }

  // The model, in post order.
  uint8_t* rmodel = rs.model.get();
  if (op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM) {
    if (rec.rem_len) std::memcpy(rmodel + rec.rem_off, data.data(), len);
  } else if (op == IBV_WR_RDMA_READ) {
    rec.expect.assign(rmodel + rec.rem_off, rmodel + rec.rem_off + rec.rem_len);
    scatter(rq.model.get(), rec.dest, rec.expect.data(), len);
  } else if (is_atomic) {
    uint64_t orig;
    std::memcpy(&orig, rmodel + rec.rem_off, 8);
    uint64_t v;
    if (op == IBV_WR_ATOMIC_CMP_AND_SWP) {
      wr.compare_add =
          r.chance(0.5) ? orig : orig ^ (uint64_t{1} << r.uniform(0, 63));
      wr.swap = r.next();
      v = orig == wr.compare_add ? wr.swap : orig;
    } else {
      wr.compare_add = r.chance(0.5) ? r.uniform(0, 1000) : r.next();
      v = orig + wr.compare_add;
    }
    std::memcpy(rmodel + rec.rem_off, &v, 8);
    rec.expect.resize(8);
    std::memcpy(rec.expect.data(), &orig, 8);
    scatter(rq.model.get(), rec.dest, rec.expect.data(), 8);
  }

  // Flags, ids.
  rec.seq = d.seq;
  rec.wr_id = (0x5aull << 56) | (uint64_t(d.id) << 32) | (d.seq & 0xffffffff);
  const bool last = d.posted + 1 == d.quota;
  rec.signaled =
      d.sig_all || last || d.sq.size() + 1 >= d.cap || !r.chance(0.2);
  if (rec.signaled && !d.sig_all) rec.flags |= IBV_SEND_SIGNALED;
  if (d.sig_all && r.chance(0.5)) rec.flags |= IBV_SEND_SIGNALED;
  if (r.chance(0.03)) rec.flags |= IBV_SEND_FENCE;
  if ((is_send || op == IBV_WR_RDMA_WRITE_WITH_IMM) && r.chance(0.1)) {
    rec.flags |= IBV_SEND_SOLICITED;
  }
  wr.send_flags = rec.flags;
  wr.wr_id = rec.wr_id;
  const std::vector<Piece>& local = is_data ? src : rec.dest;
  wr.num_sge = static_cast<uint32_t>(local.size());
  rec.nsge = wr.num_sge;
  for (uint32_t i = 0; i < wr.num_sge; ++i) {
    wr.sg_list[i] = rq.sge(local[i]);
    // Inline data is read by the CPU at post time: a process address, as
    // providers memcpy from sge.addr (the lkey is not used).
    if (rec.inl) {
      wr.sg_list[i].addr =
          reinterpret_cast<uintptr_t>(rq.mem.get() + local[i].off);
    }
  }
  const uint32_t imm = static_cast<uint32_t>(r.next());
  const bool has_imm =
      op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_RDMA_WRITE_WITH_IMM;
  if (has_imm) wr.imm_data = imm;
  if (d.kind == Kind::kUd) {
    wr.ah = d.ah;
    wr.remote_qpn = d.peer->qpn();
    wr.remote_qkey = r.chance(0.2) ? 0x80000000u : kUdQkey;
  }

  const int rc = rq.eng_of(d.qp->qpn()).post_send(d.qp, wr);
  if (rc != 0) {
    fail(fmt("post_send -> %d: ", rc) + wr_str(d, rec));
    return false;
  }
  ++d.seq;
  ++d.posted;
  if (consumes) {
    Consumer c;
    c.send_wr_id = rec.wr_id;
    c.seq = rec.seq;
    c.kind = op == IBV_WR_SEND ? 0 : op == IBV_WR_SEND_WITH_IMM ? 1 : 2;
    c.imm = has_imm ? imm : 0;
    c.len = len;
    if (is_send) c.payload = std::move(data);
    if (d.exact) {
      d.cons.push_back(std::move(c));
    } else {
      uint64_t h = fnv(c.payload.data(), c.payload.size());
      h = fnv(reinterpret_cast<const uint8_t*>(&c.imm), 4, h ^ c.kind);
      d.sent.insert(fnv(reinterpret_cast<const uint8_t*>(&len), 4, h));
    }
  }
  d.sq.push_back(std::move(rec));
  return true;
}

uint32_t Sim::refill(Dir& d) {
  if (dead(d)) return 0;
  uint32_t n = post_recvs(d);
  while (!stopped() && d.posted < d.quota && d.sq.size() < d.cap) {
    if (!post_one_send(d)) break;
    ++n;
  }
  return n + post_recvs(d);
}

// ---------------------------------------------------------------------------
// Completions

void Sim::retire(Dir& d, SendRec& r, bool ok) {
  if (ok && (r.op == IBV_WR_RDMA_READ || r.op == IBV_WR_ATOMIC_CMP_AND_SWP ||
             r.op == IBV_WR_ATOMIC_FETCH_AND_ADD)) {
    const std::vector<uint8_t> got = gather(d.rq->mem.get(), r.dest);
    if (got != r.expect) {
      size_t i = 0;
      while (i < got.size() && i < r.expect.size() && got[i] == r.expect[i])
        ++i;
      uint64_t e = 0, g = 0;
      if (r.expect.size() == 8 && got.size() == 8) {
        std::memcpy(&e, r.expect.data(), 8);
        std::memcpy(&g, got.data(), 8);
      }
      fail(fmt("%s: local result differs from byte %zu on (got %zu bytes)",
               wr_str(d, r).c_str(), i, got.size()) +
           (r.expect.size() == 8 ? fmt("; original value expected 0x%016" PRIx64
                                       " got 0x%016" PRIx64,
                                       e, g)
                                 : std::string()));
    }
  }
  ++ops_done_;
}

void Sim::on_send_wc(Host& h, const ibv_wc& wc) {
  auto it = h.by_send_qpn.find(wc.qp_num);
  if (it == h.by_send_qpn.end()) {
    fail(
        fmt("host %s: send completion for unknown qp_num 0x%x wr_id 0x%" PRIx64,
            h.name, wc.qp_num, wc.wr_id));
    return;
  }
  Dir& d = *it->second;
  mark(d);
  last_progress_ = now_;
  while (true) {
    if (d.sq.empty()) {
      fail(fmt("%s: send completion wr_id 0x%" PRIx64
               " status %s opcode %d matches no outstanding WR (a duplicate, "
               "or out of order)",
               d.name.c_str(), wc.wr_id, wc_status_name(wc.status),
               static_cast<int>(wc.opcode)));
      return;
    }
    SendRec& r = d.sq.front();
    if (r.wr_id == wc.wr_id) break;
    if (r.signaled) {
      fail(fmt("%s: completion wr_id 0x%" PRIx64 " (status %s) while ",
               d.name.c_str(), wc.wr_id, wc_status_name(wc.status)) +
           wr_str(d, r) + " has not completed (order or a lost completion)");
      // Resynchronise if the WR is further on; else drop this completion.
      bool found = false;
      for (SendRec& o : d.sq) found = found || o.wr_id == wc.wr_id;
      if (!found) return;
    }
    retire(d, r, true);
    d.sq.pop_front();
  }
  SendRec& r = d.sq.front();
  if (wc.status != IBV_WC_SUCCESS) {
    // The first error of a QP whose peer is alive is the finding; flushes,
    // and a requester timing out against a peer in ERR, follow from it.
    const bool peer_dead = dead_.count(d.peer) != 0;
    if (dead_.insert(d.qp).second && !peer_dead) {
      std::string hint;
      if (wc.status == IBV_WC_RETRY_EXC_ERR) {
        hint =
            fmt("\n  (with heavy loss retry_cnt+1 attempts in a row can all be "
                "lost; URNIC_SIM_TRACE_QPN=0x%x marks what the link dropped)",
                d.qp->qpn());
      }
      fail(fmt("status %s (vendor_err %u): ", wc_status_name(wc.status),
               wc.vendor_err) +
           wr_str(d, r) + "\n  " + dump(d) + hint);
    } else {
      ++flushed_;
    }
    retire(d, r, false);
    d.sq.pop_front();
    return;
  }
  const uint32_t blen = r.len;
  if (wc.opcode != expected_wc_opcode(r.op) || wc.byte_len != blen ||
      wc.qp_num != d.qp->qpn() || wc.wc_flags != 0) {
    fail(fmt("completion fields: opcode %d (want %d) byte_len %u (want %u) "
             "qp_num 0x%x (want 0x%x) wc_flags 0x%x (want 0): ",
             static_cast<int>(wc.opcode),
             static_cast<int>(expected_wc_opcode(r.op)), wc.byte_len, blen,
             wc.qp_num, d.qp->qpn(), wc.wc_flags) +
         wr_str(d, r));
  }
  if (!r.signaled && !d.sig_all) {
    fail("completion for an unsignaled WR: " + wr_str(d, r));
  }
  retire(d, r, true);
  d.sq.pop_front();
  ++d.send_wcs;
}

bool Sim::check_grh(Dir& d, const uint8_t* g, bool imm, uint32_t len) {
  for (int i = 0; i < 20; ++i) {
    if (g[i] != 0) return false;
  }
  const uint8_t* ip = g + 20;
  auto be16 = [](const uint8_t* p) { return uint32_t(p[0]) << 8 | p[1]; };
  auto be32 = [&](const uint8_t* p) { return be16(p) << 16 | be16(p + 2); };
  const uint32_t want_len =
      20 + 8 + 12 + 8 + (imm ? 4 : 0) + len + wire::pad_for(len) + 4;
  return ip[0] == 0x45 && ip[9] == 17 && be32(ip + 12) == d.rq->ip &&
         be32(ip + 16) == d.rs->ip && be16(ip + 2) == want_len;
}

void Sim::on_recv_wc(Host& h, const ibv_wc& wc) {
  auto it = h.by_recv_qpn.find(wc.qp_num);
  if (it == h.by_recv_qpn.end()) {
    fail(
        fmt("host %s: receive completion for unknown qp_num 0x%x wr_id "
            "0x%" PRIx64 " status %s",
            h.name, wc.qp_num, wc.wr_id, wc_status_name(wc.status)));
    return;
  }
  Dir& d = *it->second;
  mark(d);
  last_progress_ = now_;
  ++d.recv_wcs;
  ++recvs_done_;
  const std::string where =
      fmt("%s: receive completion wr_id 0x%" PRIx64, d.name.c_str(), wc.wr_id);
  if (d.recvs.empty()) {
    fail(where + " but no receive WR is posted");
    return;
  }
  RecvRec& rr = d.recvs.front();
  if (wc.wr_id != rr.wr_id) {
    fail(where + fmt(" but the oldest posted receive is 0x%" PRIx64
                     " (receives complete in posting order)",
                     rr.wr_id));
    return;
  }
  if (wc.status != IBV_WC_SUCCESS) {
    const bool peer_dead = dead_.count(d.qp) != 0;
    if (dead_.insert(d.peer).second && !peer_dead) {
      fail(where + fmt(" status %s", wc_status_name(wc.status)) + "\n  " +
           dump(d));
    } else {
      ++flushed_;
    }
    d.recvs.pop_front();
    ++d.recv_done;
    return;
  }
  const uint32_t grh = d.kind == Kind::kUd ? kGrhSize : 0;
  const bool imm = (wc.wc_flags & IBV_WC_WITH_IMM) != 0;
  std::vector<uint8_t> got;
  if (wc.opcode == IBV_WC_RECV) {
    if (wc.byte_len > rr.cap || wc.byte_len < grh) {
      fail(where + fmt(" byte_len %u: more than the buffers (%u) or less "
                       "than a GRH",
                       wc.byte_len, rr.cap));
      d.recvs.pop_front();
      ++d.recv_done;
      return;
    }
    got = gather(h.mem.get(), rr.pieces, wc.byte_len);
  }
  if (d.kind == Kind::kUd) {
    if (!(wc.wc_flags & IBV_WC_GRH) || wc.src_qp != d.qp->qpn()) {
      fail(where + fmt(" wc_flags 0x%x src_qp 0x%x (want GRH, 0x%x)",
                       wc.wc_flags, wc.src_qp, d.qp->qpn()));
    }
  }
  if (d.exact) {
    if (d.cons.empty()) {
      fail(where + " but no message was sent to it");
      d.recvs.pop_front();
      ++d.recv_done;
      return;
    }
    Consumer& c = d.cons.front();
    const bool want_imm = c.kind != 0;
    const ibv_wc_opcode want_op =
        c.kind == 2 ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
    const std::string msg =
        fmt(" for message #%" PRIu64 " (send wr_id 0x%" PRIx64 " %s len %u)",
            c.seq, c.send_wr_id,
            c.kind == 0   ? "SEND"
            : c.kind == 1 ? "SEND_WITH_IMM"
                          : "RDMA_WRITE_WITH_IMM",
            c.len);
    if (wc.opcode != want_op || wc.byte_len != c.len + grh || imm != want_imm ||
        (want_imm && wc.imm_data != c.imm) || wc.qp_num != d.peer->qpn()) {
      fail(where + msg +
           fmt(": opcode %d (want %d) byte_len %u (want %u) imm %d 0x%x "
               "(want %d 0x%x) qp_num 0x%x (want 0x%x)",
               static_cast<int>(wc.opcode), static_cast<int>(want_op),
               wc.byte_len, c.len + grh, imm, imm ? wc.imm_data : 0, want_imm,
               c.imm, wc.qp_num, d.peer->qpn()));
    } else if (c.kind != 2) {
      if (grh && !check_grh(d, got.data(), want_imm, c.len)) {
        fail(where + msg + ": GRH is not 20 zero bytes + the IPv4 header");
      }
      if (!std::equal(c.payload.begin(), c.payload.end(), got.begin() + grh)) {
        size_t i = 0;
        while (c.payload[i] == got[grh + i]) ++i;
        fail(where + msg + fmt(": data differs from byte %zu on", i));
      }
      // The model: the message (and the GRH as received) in the buffers.
      std::vector<uint8_t> m(got.begin(), got.begin() + grh);
      m.insert(m.end(), c.payload.begin(), c.payload.end());
      scatter(h.model.get(), rr.pieces, m.data(), m.size());
    }
    d.cons.pop_front();
    ++d.cons_done;
  } else {
    // Impaired UC/UD: an exact copy of some message that was sent.
    uint8_t kind = wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM ? 2 : imm ? 1 : 0;
    const uint32_t len = wc.byte_len - std::min(wc.byte_len, grh);
    const uint8_t* pl = got.size() >= grh ? got.data() + grh : nullptr;
    uint64_t hh = fnv(pl, kind == 2 ? 0 : len);
    const uint32_t im = imm ? wc.imm_data : 0;
    hh = fnv(reinterpret_cast<const uint8_t*>(&im), 4, hh ^ kind);
    hh = fnv(reinterpret_cast<const uint8_t*>(&len), 4, hh);
    if (!d.sent.count(hh) || wc.qp_num != d.peer->qpn()) {
      fail(where + fmt(" (opcode %d byte_len %u imm %d 0x%x qp_num 0x%x) is "
                       "not a copy of any message sent",
                       static_cast<int>(wc.opcode), wc.byte_len, imm, im,
                       wc.qp_num));
    }
    if (grh && got.size() >= grh && !check_grh(d, got.data(), imm, len)) {
      fail(where + ": GRH is not 20 zero bytes + the IPv4 header");
    }
    if (kind != 2) scatter(h.model.get(), rr.pieces, got.data(), got.size());
  }
  d.recvs.pop_front();
  ++d.recv_done;
}

uint32_t Sim::poll_cqs() {
  uint32_t n = 0;
  ibv_wc wcs[64];
  for (Host& h : h_) {
    for (Cq* cq : h.scq) {
      int k;
      while ((k = cq->poll(wcs)) > 0) {
        for (int i = 0; i < k; ++i) on_send_wc(h, wcs[i]);
        n += static_cast<uint32_t>(k);
      }
    }
    for (Cq* cq : h.rcq) {
      int k;
      while ((k = cq->poll(wcs)) > 0) {
        for (int i = 0; i < k; ++i) on_recv_wc(h, wcs[i]);
        n += static_cast<uint32_t>(k);
      }
    }
  }
  return n;
}

// ---------------------------------------------------------------------------
// Driver

uint32_t Sim::deliver(Host& h) {
  rxq_.clear();
  link_.receive(h.idx, now_, rxq_);
  for (std::vector<uint8_t>& f : rxq_) {
    const uint32_t len = static_cast<uint32_t>(f.size());
    if (trace_qpn()) trace_frame(now_, h.name, "rx", f.data(), len);
    wire::FrameInfo fi;
    wire::decode(f.data(), len, fi);
    if (fi.kind != wire::FrameKind::kRoce) {
      if (fi.why == wire::Malformed::kBadIcrc) {
        ++h.icrc_drops;
      } else {
        ++h.other_drops;
      }
      continue;
    }
    if (!(fi.roce.dst_mac == h.mac)) {  // the NIC's L2 filter
      ++h.l2_drops;
      continue;
    }
    wire::ConstBuf segs[2] = {{f.data(), len}, {nullptr, 0}};
    uint32_t nseg = 1;
    // Now and then as two segments (an mbuf chain), cut in the payload.
    if (fi.roce.payload_len > 1 && rng_.chance(0.05)) {
      const uint32_t cut = fi.payload_off + static_cast<uint32_t>(rng_.uniform(
                                                1, fi.roce.payload_len - 1));
      segs[0] = {f.data(), cut};
      segs[1] = {f.data() + cut, len - cut};
      nseg = 2;
      wire::decode({segs, 2}, len, fi);
      if (fi.kind != wire::FrameKind::kRoce) {
        fail("a frame no longer decodes when split in two segments");
        continue;
      }
      ++h.split_frames;
    }
    ++h.rx_frames;
    h.eng_of(fi.roce.dqpn).rx(fi, {segs, nseg}, now_);
  }
  return static_cast<uint32_t>(rxq_.size());
}

bool Sim::finished() {
  for (auto& d : dirs_) {
    if (dead(*d)) continue;
    if (d->posted < d->quota || !d->sq.empty()) return false;
    if (d->exact && !d->cons.empty()) return false;
  }
  return true;
}

void Sim::run() {
  t0_ = std::chrono::steady_clock::now();
  make_hosts();
  if (::testing::Test::HasFatalFailure()) return;
  make_pairs();
  if (::testing::Test::HasFatalFailure()) return;
  for (const Host& h : h_)
    for (const auto& e : h.engs)
      if (e->qp_count() == 0)
        fail(fmt("host %s: an engine without QPs", h.name));
  for (auto& d : dirs_) mark(*d);

  uint64_t same_time = 0;
  uint64_t drain_until = 0;
  bool draining = false;
  while (!stopped()) {
    ++loop_iters_;
    uint32_t work = deliver(h_[0]) + deliver(h_[1]);
    // While its transmit queue is congested a host's engine could send
    // nothing, and a pass over its ready QPs costs (16384 of them in
    // ManyQps): poll it again once the queue has room, and every 10 us for
    // its timers.
    for (Host& h : h_) {
      if (h.io->room_at() <= now_ || now_ >= h.last_poll + 10 * kUs) {
        h.last_poll = now_;
        for (auto& e : h.engs) work += e->poll(now_);
      }
    }
    work += poll_cqs();
    // Dry receive queues whose time is up.
    for (size_t i = 0; i < dry_.size();) {
      if (now_ >= dry_[i]->dry_until) {
        mark(*dry_[i]);
        dry_[i] = dry_.back();
        dry_.pop_back();
      } else {
        ++i;
      }
    }
    todo_.clear();
    todo_.swap(dirty_);
    for (Dir* d : todo_) {
      d->dirty = false;
      work += refill(*d);
    }
    if (stopped()) break;

    if (!draining && finished()) {
      draining = true;
      drain_until = now_ + 5 * kMs;
    }
    const bool quiet = link_.next_arrival(0) == UINT64_MAX &&
                       link_.next_arrival(1) == UINT64_MAX && !h_[0].busy() &&
                       !h_[1].busy();
    if (draining && now_ >= drain_until && quiet && work == 0) break;
    if (draining && now_ > drain_until + 1000 * kMs) {
      fail("the link never goes quiet after the last completion");
      stuck_ = true;
      break;
    }

    if (work > 0) {
      if (++same_time > 2000000) {
        fail("no virtual time progress: 2e6 loop iterations at one instant");
        stuck_ = true;
        break;
      }
      continue;
    }
    same_time = 0;
    // Advance virtual time to the next event.
    uint64_t next = now_ + kIdleStepNs;
    next = std::min({next, link_.next_arrival(0), link_.next_arrival(1)});
    for (Host& h : h_) {
      if (h.busy()) {
        next = std::min(next, std::max(h.io->room_at(), now_ + 1));
      }
    }
    for (Dir* d : dry_) next = std::min(next, d->dry_until);
    now_ = std::max(next, now_ + 1);
    if (now_ - last_progress_ > kStallNs && !draining) {
      std::string s =
          fmt("stalled: no completion for %" PRIu64 " ms of virtual time",
              kStallNs / kMs);
      int shown = 0;
      for (Host& h : h_)
        for (const auto& e : h.engs)
          s += fmt("\n  %s engine %u: shared window %u, in flight %" PRIu64
                   " on %u QPs, %u QPs granted not yet sending",
                   h.name, e->config().home, e->cc_shared_window(),
                   e->cc_in_flight(), e->cc_active_qps(), e->cc_granted_qps());
      for (auto& d : dirs_) {
        if ((!d->sq.empty() || (d->exact && !d->cons.empty())) && shown < 6) {
          s += "\n  " + dump(*d);
          ++shown;
        }
      }
      fail(s);
      stuck_ = true;
    }
  }
  // After a QP error the model no longer describes that QP's memory: the
  // first error is the finding.
  if (!stuck_ && failures_ < kMaxFailures && dead_.empty()) final_checks();
  if (!dead_.empty()) {
    std::printf("[ sim %-8s] %zu QP(s) went to error (%" PRIu64
                " flushed completions not reported); final checks skipped\n",
                p_.test, dead_.size(), flushed_);
  }
  report();
}

void Sim::final_checks() {
  // Every QP still in RTS, no CQ in error, no error events.
  for (Host& h : h_) {
    for (Qp* qp : h.qps) {
      if (qp->state() != IBV_QPS_RTS) {
        fail(fmt("host %s: qpn 0x%x is in %s at the end", h.name, qp->qpn(),
                 qp_state_name(qp->state())));
      }
    }
    for (Cq* cq : h.scq) {
      EXPECT_FALSE(cq->in_error());
      EXPECT_EQ(cq->overflows(), 0u);
      EXPECT_EQ(cq->size(), 0u);
    }
    for (Cq* cq : h.rcq) {
      EXPECT_FALSE(cq->in_error());
      EXPECT_EQ(cq->overflows(), 0u);
      EXPECT_EQ(cq->size(), 0u);
    }
    AsyncEvent ev;
    while (h.dev->next_event(&ev)) {
      fail(fmt("host %s: async event %d (qpn 0x%x)", h.name,
               static_cast<int>(ev.type), ev.qpn));
    }
  }
  for (auto& d : dirs_) {
    // UC on an impaired link: a message that loses a packet is dropped
    // after its first packets were placed (partial WRITEs in the remote
    // region; partial SENDs in a receive buffer that the next message then
    // reuses), so those bytes are undefined. Received messages were checked
    // one by one.
    if (d->kind == Kind::kUc && !d->exact) {
      for (const Region& r : {d->remote, d->ring}) {
        std::memcpy(d->rs->model.get() + r.off, d->rs->mem.get() + r.off,
                    r.len);
      }
    }
    if (d->exact && !d->cons.empty()) {
      fail(d->name + ": messages never received");
    }
  }
  // Memory: byte-identical to the model.
  for (Host& h : h_) {
    const uint8_t* m = h.mem.get();
    const uint8_t* e = h.model.get();
    if (std::memcmp(m, e, h.size) == 0) continue;
    uint64_t first = 0, count = 0;
    for (uint64_t i = 0; i < h.size; ++i) {
      if (m[i] != e[i]) {
        if (count++ == 0) first = i;
      }
    }
    std::string where = "?";
    for (auto& d : dirs_) {
      auto in = [&](const Region& r) {
        return first >= r.off && first < r.off + r.len;
      };
      if (d->rq == &h && in(d->sink)) {
        where = fmt("%s sink +%" PRIu64, d->name.c_str(), first - d->sink.off);
      }
      if (d->rs == &h && in(d->remote)) {
        where =
            fmt("%s remote +%" PRIu64, d->name.c_str(), first - d->remote.off);
      }
      if (d->rs == &h && in(d->ring)) {
        where = fmt("%s receive ring +%" PRIu64, d->name.c_str(),
                    first - d->ring.off);
      }
    }
    if (first >= h.src.off && first < h.src.off + h.src.len) where = "src";
    fail(fmt("host %s memory differs from the model in %" PRIu64
             " bytes; first at arena offset %" PRIu64
             " (%s): got 0x%02x want 0x%02x",
             h.name, count, first, where.c_str(), m[first], e[first]));
  }
}

void Sim::report() {
  // Per-QP counters add up to the engine's counter of the same name (every
  // QP of the run is still alive here): each event is counted once per QP.
  for (const auto& h : h_) {
    for (size_t i = 0; i < transport::kNumQpCtr; ++i) {
      for (size_t k = 0; k < kNumECtr; ++k) {
        if (std::strcmp(transport::kQpCtrNames[i], kECtrNames[k]) != 0)
          continue;
        uint64_t per_qp = 0, total = 0;
        for (const auto& e : h.engs) {
          e->for_each_qp([&](const Qp& q) {
            size_t j = 0;
            q.counters().for_each([&](const char*, uint64_t v) {
              if (j++ == i) per_qp += v;
            });
          });
          total += e->counters().get(static_cast<ECtr>(k));
        }
        if (per_qp != total)
          fail(fmt("host %s: per-QP %s sum %" PRIu64 " != engine %" PRIu64,
                   h.name, kECtrNames[k], per_qp, total));
      }
    }
  }
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_)
          .count();
  auto sum = [&](ECtr c) {
    uint64_t n = 0;
    for (const Host& h : h_)
      for (const auto& e : h.engs) n += e->counters().get(c);
    return n;
  };
  const SimLinkStats& s0 = link_.stats(0);
  const SimLinkStats& s1 = link_.stats(1);
  uint64_t dry = 0;
  for (auto& d : dirs_) dry += d->rnr_dry;
  std::printf(
      "[ sim %-8s] %zu QPs, ops %" PRIu64 " (posted), %" PRIu64
      " retired, %" PRIu64 " receives | frames %" PRIu64 " (A->B %" PRIu64
      ", B->A %" PRIu64 ") lost %" PRIu64 " dup %" PRIu64 " reordered %" PRIu64
      " corrupted %" PRIu64 " (icrc drops %" PRIu64 ", other %" PRIu64
      ", l2 %" PRIu64 ") tx refused %" PRIu64 " queue-full %" PRIu64
      "\n             retransmits %" PRIu64 " timeouts %" PRIu64
      " naks rx seq/rnr/other %" PRIu64 "/%" PRIu64 "/%" PRIu64
      " rnr_waits %" PRIu64 " rx_dup %" PRIu64 " out_of_seq %" PRIu64
      " uc_dropped %" PRIu64 " dry RQs %" PRIu64 " grant waits %" PRIu64
      " | sim %.3f ms, wall %.2f s, "
      "%" PRIu64 " loop iterations\n",
      p_.test, h_[0].qps.size() + h_[1].qps.size(),
      [&] {
        uint64_t n = 0;
        for (auto& d : dirs_) n += d->posted;
        return n;
      }(),
      ops_done_, recvs_done_, s0.sent + s1.sent, s0.sent, s1.sent,
      s0.lost + s1.lost, s0.duplicated + s1.duplicated,
      s0.reordered + s1.reordered, s0.corrupted + s1.corrupted,
      h_[0].icrc_drops + h_[1].icrc_drops,
      h_[0].other_drops + h_[1].other_drops, h_[0].l2_drops + h_[1].l2_drops,
      h_[0].io->refused + h_[1].io->refused,
      h_[0].io->queue_full + h_[1].io->queue_full, sum(ECtr::retransmits),
      sum(ECtr::timeouts), sum(ECtr::naks_seq_rx), sum(ECtr::naks_rnr_rx),
      sum(ECtr::naks_access_rx) + sum(ECtr::naks_inv_req_rx) +
          sum(ECtr::naks_op_rx),
      sum(ECtr::rnr_waits), sum(ECtr::rx_dup), sum(ECtr::rx_out_of_seq),
      sum(ECtr::rx_uc_dropped), dry, sum(ECtr::cc_grant_waits),
      static_cast<double>(now_) / kMs, wall, loop_iters_);
  if (p_.rate_mbps) {
    const double peak =
        std::max(link_.queue(0).peak_bytes(), link_.queue(1).peak_bytes());
    std::printf("             bottleneck %" PRIu64 " Mb/s, %" PRIu64
                " KiB buffer, ECN above %" PRIu64 " KiB: queue drops %" PRIu64
                " CE marked %" PRIu64 " peak %.1f KiB | CNPs tx %" PRIu64
                " rx %" PRIu64 " rate cuts %" PRIu64 " window cuts %" PRIu64
                "\n",
                p_.rate_mbps, p_.queue_bytes / 1024, p_.ecn_bytes / 1024,
                s0.queue_drops + s1.queue_drops, s0.ce_marked + s1.ce_marked,
                peak / 1024, sum(ECtr::cnps_tx), sum(ECtr::cnps_rx),
                sum(ECtr::cc_rate_cuts), sum(ECtr::cc_window_cuts));
    // What ECN is for: the queue marks, CNPs come back, rates are cut, and
    // the buffer is never overrun.
    if (p_.ecn_bytes) {
      if (s0.ce_marked + s1.ce_marked == 0)
        fail("the bottleneck marked nothing");
      if (sum(ECtr::cnps_tx) == 0 || sum(ECtr::cnps_rx) == 0)
        fail("no CNPs sent or received");
      if (sum(ECtr::cc_rate_cuts) == 0) fail("no DCQCN rate cut");
    }
    if (p_.uc_paced)
      for (auto& d : dirs_) {
        if (d->kind != Kind::kUc) continue;
        const QpCounters& c = d->qp->counters();
        std::printf("             %s: CNPs rx %" PRIu64 " rate cuts %" PRIu64
                    "\n",
                    d->name.c_str(), c.cnps_rx.get(), c.cc_rate_cuts.get());
        if (c.cnps_rx.get() == 0 || c.cc_rate_cuts.get() == 0)
          fail(d->name + ": a UC requester got no CNP or no rate cut");
      }
    if (peak > static_cast<double>(p_.queue_bytes))
      fail(fmt("the queue held %.0f bytes, above its %" PRIu64, peak,
               p_.queue_bytes));
    const uint64_t drops = s0.queue_drops + s1.queue_drops;
    if (static_cast<double>(drops) >
        p_.max_queue_drops * static_cast<double>(s0.sent + s1.sent))
      fail(fmt("the queue dropped %" PRIu64 " of %" PRIu64
               " frames, above %.1f %%",
               drops, s0.sent + s1.sent, 100 * p_.max_queue_drops));
  }
  if (env_u64("URNIC_SIM_VERBOSE", 0)) {
    for (auto& d : dirs_) {
      if (d->id >= 64) break;
      const QpCounters& c = d->qp->counters();
      std::printf("  %-16s qpn 0x%x mtu %u cap %u: %" PRIu64 " WRs, %" PRIu64
                  " send / %" PRIu64 " recv WCs; tx %" PRIu64 " retx %" PRIu64
                  " timeouts %" PRIu64 " rnr %" PRIu64 " naks_rx %" PRIu64
                  " dry %" PRIu64 "\n",
                  d->name.c_str(), d->qp->qpn(), d->mtu, d->cap, d->posted,
                  d->send_wcs, d->recv_wcs, c.tx_packets.get(),
                  c.retransmits.get(), c.timeouts.get(), c.rnr_waits.get(),
                  c.naks_rx(), d->rnr_dry);
    }
  }
  std::fflush(stdout);
}

SimParams params(const char* test, uint64_t seed) {
  SimParams p;
  p.test = test;
  p.seed = env_u64("URNIC_SIM_SEED", seed);
  p.ops = env_u64("URNIC_SIM_OPS", 100000);
  return p;
}

void run_sim(const SimParams& p) {
  SCOPED_TRACE(describe(p));
  Sim sim(p);
  sim.run();
}

SimParams impaired(SimParams p, double loss) {
  p.loss = loss;
  p.duplicate = 0.01;
  p.reorder = 0.01;
  p.corrupt = 0.005;
  p.jitter_ns = kJitterNs;
  p.tx_refuse = 0.001;
  return p;
}

// Tail drops stay under 1 % (2 % with the loss): with unpaced READ
// responses they were 3.2 % and 31 % (15 711 of 486 169, 525 038 of
// 1 718 069 frames).
SimParams through_bottleneck(SimParams p, double max_drops) {
  p.ud_pair = p.uc_pair = false;
  p.rate_mbps = 10'000;
  p.queue_bytes = 256 * 1024;
  p.ecn_bytes = 32 * 1024;
  p.max_queue_drops = max_drops;
  return p;
}

}  // namespace

// A perfect link: UC and UD are checked message by message, RC receive
// queues run dry now and then (RNR NAKs), transmit() refuses now and then.
TEST(TransportSim, Clean) {
  SimParams p = params("Clean", 0x5eed0001);
  p.clean = true;
  p.tx_refuse = 0.001;
  run_sim(p);
}

TEST(TransportSim, Loss0) {
  run_sim(impaired(params("Loss0", 0x5eed0002), 0));
}

TEST(TransportSim, Loss1) {
  run_sim(impaired(params("Loss1", 0x5eed0003), 0.01));
}

TEST(TransportSim, Loss10) {
  run_sim(impaired(params("Loss10", 0x5eed0004), 0.10));
}

// The RC pairs through a 10 Gb/s switch queue (the hosts send at 25 Gb/s)
// that marks ECN above 32 KiB of its 256 KiB: congestion control (on by
// default: DCQCN on CNPs, loss windows) keeps the data byte-exact while
// the queue marks, CNPs flow back and rates are cut; with 1 % loss too.
// Not UD: congestion control paces RC and UC QPs only, and the sim's UD
// pair, unpaced at 25 Gb/s, would keep the queue full and drop a third of
// all frames (RC QPs then exhaust their retries). UC: BottleneckUc.
TEST(TransportSim, Bottleneck) {
  run_sim(through_bottleneck(params("Bottleneck", 0x5eed0006), 0.01));
}

TEST(TransportSim, BottleneckLoss1) {
  run_sim(through_bottleneck(
      impaired(params("BottleneckLoss1", 0x5eed0007), 0.01), 0.02));
}

// The UC pair through the same queue (UD stays out: it is not paced): its
// data leaves ECN-capable, the responder answers CE marks with CNPs, and
// DCQCN paces the UC requester, so the queue drops stay as low as with RC
// alone. Until 2026-11-29 only RC was paced and a UC pair at 25 Gb/s kept
// the queue full.
TEST(TransportSim, BottleneckUc) {
  SimParams p = through_bottleneck(params("BottleneckUc", 0x5eed0009), 0.01);
  p.uc_pair = true;
  p.uc_paced = true;
  run_sim(p);
}

// QPs split over two engines per host (urnicd's two workers), CQs shared
// by QPs of both, over the 1 % lossy link: the same byte-exact checks.
TEST(TransportSim, TwoEnginesLoss1) {
  SimParams p = impaired(params("TwoEnginesLoss1", 0x5eed0008), 0.01);
  p.homes = 2;
  run_sim(p);
}

// 16384 RC QPs on each side (the default max_qp), smallest queues, a few
// operations on every one of them over a link with 1% loss.
TEST(TransportSim, ManyQps) {
  SimParams p = impaired(params("ManyQps", 0x5eed0005), 0.01);
  p.tiny = true;
  p.tx_queue_ns = 64 * kUs;
  p.rc_pairs = Limits{}.max_qp;
  p.big_pairs = 0;
  p.srq_pair = p.ud_pair = p.uc_pair = false;
  p.ops = std::max<uint64_t>(p.ops, 2ull * p.rc_pairs);
  run_sim(p);
}
