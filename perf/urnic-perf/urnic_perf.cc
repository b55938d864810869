// urnic-perf: a verbs load generator (client/server over a TCP side
// channel, like perftest) for urnic through its shim and, unchanged, for
// any other verbs device. Bandwidth, message-rate and latency modes for
// WRITE, WRITE_WITH_IMM, READ, SEND, fetch-and-add and compare-and-swap;
// N QPs over M threads (TBB); CQ moderation, chained posting, a data
// verification mode; testpmd-style live statistics, urnicd's own per-QP
// counters next to them, and a JSON result for scripts.
#include <arpa/inet.h>
#include <getopt.h>
#include <infiniband/verbs.h>
#include <malloc.h>
#include <poll.h>
#include <sys/wait.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "perf/urnic-perf/exchange.h"
#include "perf/urnic-perf/service_stats.h"
#include "tests/support/verbs_bringup.h"

namespace urnic::perf {
namespace {

enum class Op : uint32_t {
  kWrite,
  kWriteImm,
  kRead,
  kSend,
  kFetchAdd,
  kCmpSwap
};
enum class Mode : uint32_t { kBw, kLat, kRate };
constexpr const char* kOpNames[] = {"write", "write_imm", "read",
                                    "send",  "fetch_add", "cmp_swap"};
constexpr const char* kModeNames[] = {"bw", "lat", "rate"};
constexpr uint32_t kMaxSizes = 32;

bool is_atomic(Op o) {
  return o == Op::kFetchAdd || o == Op::kCmpSwap;
}
// Ops that consume a receive WR on the peer.
bool uses_recv(Op o) {
  return o == Op::kSend || o == Op::kWriteImm;
}

// The test, as the client sends it to the server (fixed layout).
struct Params {
  uint32_t magic = 0x55504632;  // "UPF2"
  Op op = Op::kWrite;
  Mode mode = Mode::kBw;
  uint32_t qps = 1, threads = 1, depth = 0, batch = 1, cq_mod = 1;
  uint32_t nsizes = 1;
  uint32_t sizes[kMaxSizes] = {65536};
  uint32_t verify = 0, mtu = 0, inline_max = 0, rd_atomic = 16;
  uint32_t duration_ms = 5000, warmup_ms = 1000;
  uint64_t iters = 0;
  uint32_t slots = 1;  // message slots per QP in each side's buffer
  uint32_t timeout = 14, retry_cnt = 7, rnr_retry = 7;
  uint32_t hold_s = 0;
  uint32_t events = 0;  // wait on a completion channel instead of spinning
};

struct Options {
  Params p;
  bool server = false;
  std::string host, dev, json_path, urnicd, trace_path;
  uint16_t port = 18516;
  int ib_port = 1, gid_index = 0;
  uint32_t period_ms = 1000, show_qps = 16;
  uint32_t gap_us = 0;  // client, lat: idle time before each op
  bool loop = false;
};

[[noreturn]] void die(int code, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));
void die(int code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "urnic-perf: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(code);
}

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u +
         static_cast<uint64_t>(ts.tv_nsec);
}

uint64_t rss_kib() {
  FILE* f = fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  uint64_t v = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %" SCNu64, &v) == 1) break;
  fclose(f);
  return v;
}

// Verification pattern of message `seq` of QP `qp`: 8-byte words from a
// mix of (qp, seq, word index); a short message takes a prefix.
uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}
void fill(uint8_t* p, uint32_t len, uint32_t qp, uint64_t seq) {
  for (uint32_t i = 0; i < len; i += 8) {
    const uint64_t w = mix((uint64_t{qp} << 40) ^ (seq << 16) ^ i);
    std::memcpy(p + i, &w, std::min<uint32_t>(8, len - i));
  }
}
bool check(const uint8_t* p, uint32_t len, uint32_t qp, uint64_t seq) {
  for (uint32_t i = 0; i < len; i += 8) {
    const uint64_t w = mix((uint64_t{qp} << 40) ^ (seq << 16) ^ i);
    if (std::memcmp(p + i, &w, std::min<uint32_t>(8, len - i)) != 0)
      return false;
  }
  return true;
}

struct QpCtx {
  ibv_qp* qp = nullptr;
  uint32_t index = 0;
  uint8_t* local = nullptr;  // this QP's slots in our MR
  QpWire remote;
  // Written by the owning thread, read by the printer.
  std::atomic<uint64_t> ops{0}, outstanding{0}, errors{0}, verify_errors{0};
  uint64_t posted = 0;     // WRs posted (this size)
  uint64_t completed = 0;  // WRs retired (this size)
  uint64_t next_seq = 0;   // message sequence (across sizes: atomics)
  uint64_t done_seq = 0;   // first sequence not yet retired
  uint64_t recv_posted = 0, recv_seen = 0;
  uint64_t since_signal = 0;
};

struct Run {
  Options o;
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_mr* mr = nullptr;
  uint8_t* buf = nullptr;
  size_t buf_len = 0;
  uint32_t max_size = 0;
  ibv_port_attr port{};
  ibv_gid gid{};
  std::vector<ibv_cq*> cqs;                 // one per thread
  std::vector<ibv_comp_channel*> channels;  // one per CQ with --events
  std::vector<std::unique_ptr<QpCtx>> qps;
  std::vector<std::vector<QpCtx*>> by_thread;
  std::atomic<int> phase{0};  // 0 warmup, 1 measure, 2 stop
  std::atomic<bool> failed{false};
  std::atomic<uint32_t> threads_seen{0};
  std::string fail_msg;
  std::vector<std::vector<double>> lat;  // per thread, microseconds
  bool corrupt = false;
  uint64_t cq_room = 0;              // CQEs a thread's CQ can hold
  uint32_t recv_depth = 0;           // receives kept posted per QP
  std::vector<uint64_t> thread_out;  // send WRs outstanding per thread
  // Heap bytes the verbs library (the shim, under LD_PRELOAD) kept across
  // our ibv_create_qp calls (mallinfo2; 0 where an ASan allocator replaces
  // malloc): its own per-QP memory, apart from ours and from the rings.
  int64_t qp_lib_heap = 0;
};

// malloc's bytes in use: the arenas' and the chunks it mmapped apart
// (blocks of 128 KiB and more, such as a lookup table that has grown).
int64_t heap_in_use() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<int64_t>(m.uordblks + m.hblkhd);
}

uint32_t slot_bytes(const Run& r) {
  return std::max<uint32_t>(r.max_size, 8);
}
uint8_t* slot(Run& r, QpCtx& q, uint64_t i) {
  return q.local + (i % r.o.p.slots) * slot_bytes(r);
}
uint64_t remote_slot(Run& r, QpCtx& q, uint64_t i) {
  return q.remote.addr + (i % r.o.p.slots) * slot_bytes(r);
}
// WRITE latency: the last byte of message `seq` marks its arrival; it
// differs from what the slot held the previous time round.
uint8_t tag(const Run& r, uint64_t seq) {
  return static_cast<uint8_t>(1 + (seq / r.o.p.slots) % 255);
}

void fail(Run& r, const std::string& m) {
  bool expected = false;
  if (r.failed.compare_exchange_strong(expected, true)) r.fail_msg = m;
  r.phase.store(2);
}

void setup(Run& r) {
  Params& p = r.o.p;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list || n == 0)
    die(1, "no RDMA device (ibv_get_device_list: %s)",
        n == 0 ? "none found" : strerror(errno));
  ibv_device* d = nullptr;
  for (int i = 0; i < n; ++i)
    if (r.o.dev.empty() || r.o.dev == ibv_get_device_name(list[i])) {
      d = list[i];
      break;
    }
  if (!d) die(1, "device %s not found", r.o.dev.c_str());
  r.o.dev = ibv_get_device_name(d);
  r.ctx = ibv_open_device(d);
  ibv_free_device_list(list);
  if (!r.ctx)
    die(1, "ibv_open_device(%s): %s", r.o.dev.c_str(), strerror(errno));
  if (ibv_query_port(r.ctx, static_cast<uint8_t>(r.o.ib_port), &r.port))
    die(1, "ibv_query_port: %s", strerror(errno));
  if (ibv_query_gid(r.ctx, static_cast<uint8_t>(r.o.ib_port), r.o.gid_index,
                    &r.gid))
    die(1, "ibv_query_gid(%d): %s", r.o.gid_index, strerror(errno));
  ibv_device_attr da{};
  if (ibv_query_device(r.ctx, &da))
    die(1, "ibv_query_device: %s", strerror(errno));
  p.rd_atomic = std::min<uint32_t>(
      p.rd_atomic, static_cast<uint32_t>(
                       std::min(da.max_qp_rd_atom, da.max_qp_init_rd_atom)));
  if (p.rd_atomic == 0) p.rd_atomic = 1;
  if (!p.mtu) p.mtu = r.port.active_mtu;
  r.pd = ibv_alloc_pd(r.ctx);
  if (!r.pd) die(1, "ibv_alloc_pd: %s", strerror(errno));

  r.max_size = 0;
  for (uint32_t i = 0; i < p.nsizes; ++i)
    r.max_size = std::max(r.max_size, p.sizes[i]);
  r.buf_len = size_t{p.qps} * p.slots * slot_bytes(r);
  if (r.buf_len > (size_t{8} << 30))
    die(2, "buffer of %zu bytes (qps x slots x size) is too large", r.buf_len);
  r.buf =
      static_cast<uint8_t*>(aligned_alloc(4096, (r.buf_len + 4095) & ~4095ull));
  if (!r.buf) die(1, "out of memory for %zu bytes", r.buf_len);
  std::memset(r.buf, 0, r.buf_len);
  r.mr = ibv_reg_mr(r.pd, r.buf, r.buf_len,
                    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                        IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
  if (!r.mr) die(1, "ibv_reg_mr(%zu bytes): %s", r.buf_len, strerror(errno));

  const uint32_t t = p.threads;
  r.by_thread.assign(t, {});
  r.lat.assign(t, {});
  const uint32_t per_thread = (p.qps + t - 1) / t;
  const uint32_t sq = p.depth + p.batch, rq = uses_recv(p.op) ? p.depth : 1;
  // One CQ per thread, as large as its QPs' queues or the device allows;
  // when smaller, a thread keeps at most that many operations outstanding
  // (and the server posts fewer receives) so it never overflows.
  const uint64_t want = uint64_t{per_thread} * (sq + rq) + 16;
  const uint64_t cqe =
      std::min<uint64_t>(want, static_cast<uint64_t>(std::max(da.max_cqe, 32)));
  r.cq_room = cqe - 16;
  r.recv_depth = p.depth;
  if (uses_recv(p.op) && uint64_t{per_thread} * (p.depth + 1) > r.cq_room / 2)
    r.recv_depth = static_cast<uint32_t>(
        std::max<uint64_t>(1, r.cq_room / 2 / per_thread));
  if (cqe < want)
    fprintf(stderr,
            "urnic-perf: note: CQs of %" PRIu64
            " entries (device max): at most "
            "%" PRIu64
            " operations outstanding per thread, %u receives per QP\n",
            cqe, r.cq_room / 2, r.recv_depth);
  r.thread_out.assign(t, 0);
  for (uint32_t i = 0; i < t; ++i) {
    ibv_comp_channel* ch = nullptr;
    if (p.events) {
      ch = ibv_create_comp_channel(r.ctx);
      if (!ch) die(1, "ibv_create_comp_channel: %s", strerror(errno));
      r.channels.push_back(ch);
    }
    ibv_cq* cq = ibv_create_cq(r.ctx, static_cast<int>(cqe), nullptr, ch, 0);
    if (!cq) die(1, "ibv_create_cq(%" PRIu64 "): %s", cqe, strerror(errno));
    r.cqs.push_back(cq);
  }
  std::mt19937 rng(static_cast<uint32_t>(now_ns()));
  for (uint32_t i = 0; i < p.qps; ++i) {
    auto q = std::make_unique<QpCtx>();
    q->index = i;
    q->local = r.buf + size_t{i} * p.slots * slot_bytes(r);
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = r.cqs[i % t];
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = sq;
    a.cap.max_recv_wr = rq;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    a.cap.max_inline_data = p.inline_max;
    const int64_t heap0 = heap_in_use();
    q->qp = ibv_create_qp(r.pd, &a);
    r.qp_lib_heap += heap_in_use() - heap0;
    if (!q->qp)
      die(1, "ibv_create_qp #%u (send %u recv %u): %s", i, sq, rq,
          strerror(errno));
    urnic::test::RcPath rp;
    rp.port = static_cast<uint8_t>(r.o.ib_port);
    if (const int rc = urnic::test::rc_to_init(q->qp, rp))
      die(1, "ibv_modify_qp(INIT) #%u: %s", i, strerror(rc));
    q->remote.psn = rng() & 0xffffff;  // our PSN, sent to the peer
    r.by_thread[i % t].push_back(q.get());
    r.qps.push_back(std::move(q));
  }
}

void connect_qps(Run& r, const std::vector<QpWire>& peer) {
  const Params& p = r.o.p;
  for (auto& qp : r.qps) {
    QpCtx& q = *qp;
    const QpWire& w = peer[q.index];
    urnic::test::RcPath rp;
    rp.dest_qpn = w.qpn;
    std::memcpy(rp.dgid.raw, w.gid, 16);
    rp.sgid_index = static_cast<uint8_t>(r.o.gid_index);
    rp.port = static_cast<uint8_t>(r.o.ib_port);
    rp.mtu = static_cast<ibv_mtu>(p.mtu);
    rp.rq_psn = w.psn;
    rp.sq_psn = q.remote.psn;  // ours, sent to the peer
    rp.rd_atomic = static_cast<uint8_t>(p.rd_atomic);
    rp.min_rnr_timer = 1;
    rp.timeout = static_cast<uint8_t>(p.timeout);
    rp.retry_cnt = static_cast<uint8_t>(p.retry_cnt);
    rp.rnr_retry = static_cast<uint8_t>(p.rnr_retry);
    if (const int rc = urnic::test::rc_to_rtr(q.qp, rp))
      die(1, "ibv_modify_qp(RTR) #%u: %s", q.index, strerror(rc));
    if (const int rc = urnic::test::rc_to_rts(q.qp, rp))
      die(1, "ibv_modify_qp(RTS) #%u: %s", q.index, strerror(rc));
    q.remote = w;
  }
}

std::vector<QpWire> my_wire(Run& r) {
  std::vector<QpWire> v(r.qps.size());
  for (auto& q : r.qps) {
    QpWire& w = v[q->index];
    w.qpn = q->qp->qp_num;
    w.psn = q->remote.psn;
    std::memcpy(w.gid, r.gid.raw, 16);
    w.rkey = r.mr->rkey;
    w.addr = reinterpret_cast<uint64_t>(q->local);
  }
  return v;
}

bool post_recv(Run& r, QpCtx& q) {
  const uint64_t seq = q.recv_posted;
  ibv_sge sge{reinterpret_cast<uint64_t>(slot(r, q, seq)), slot_bytes(r),
              r.mr->lkey};
  ibv_recv_wr wr{};
  wr.wr_id = (uint64_t{q.index} << 32) | (seq & 0xffffffff);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  if (const int rc = ibv_post_recv(q.qp, &wr, &bad)) {
    fail(r, std::string("ibv_post_recv: ") + strerror(rc));
    return false;
  }
  ++q.recv_posted;
  return true;
}

// Builds and posts up to `n` chained WRs of `size` on q.
bool post_send(Run& r, QpCtx& q, uint32_t size, uint32_t n, bool force_signal) {
  const Params& p = r.o.p;
  ibv_send_wr wrs[64];
  ibv_sge sges[64];
  n = std::min<uint32_t>(n, 64);
  for (uint32_t k = 0; k < n; ++k) {
    const uint64_t seq = q.next_seq++;
    ibv_send_wr& wr = wrs[k];
    wr = {};
    uint8_t* local = slot(r, q, seq);
    uint32_t len = is_atomic(p.op) ? 8 : size;
    if (p.verify &&
        (p.op == Op::kWrite || p.op == Op::kWriteImm || p.op == Op::kSend)) {
      fill(local, len, q.index, seq);
      if (r.corrupt && q.index == 0 && seq == 5 && len) local[0] ^= 0xff;
    }
    if (p.mode == Mode::kLat && p.op == Op::kWrite && len)
      local[len - 1] = tag(r, seq);
    sges[k] = {reinterpret_cast<uint64_t>(local), len, r.mr->lkey};
    wr.sg_list = &sges[k];
    wr.num_sge = len ? 1 : 0;
    wr.next = k + 1 < n ? &wrs[k + 1] : nullptr;
    const bool sig =
        force_signal || ++q.since_signal >= p.cq_mod ||
        q.outstanding.load(std::memory_order_relaxed) + k + 1 >= p.depth;
    if (sig) {
      wr.send_flags |= IBV_SEND_SIGNALED;
      q.since_signal = 0;
    }
    wr.wr_id = (uint64_t{q.index} << 32) | (seq & 0xffffffff);
    switch (p.op) {
      case Op::kWrite:
      case Op::kWriteImm:
        wr.opcode =
            p.op == Op::kWrite ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_WRITE_WITH_IMM;
        wr.imm_data = htonl(static_cast<uint32_t>(seq));
        wr.wr.rdma.remote_addr = remote_slot(r, q, seq);
        wr.wr.rdma.rkey = q.remote.rkey;
        break;
      case Op::kRead:
        wr.opcode = IBV_WR_RDMA_READ;
        wr.wr.rdma.remote_addr = remote_slot(r, q, seq);
        wr.wr.rdma.rkey = q.remote.rkey;
        break;
      case Op::kSend:
        wr.opcode = IBV_WR_SEND;
        break;
      case Op::kFetchAdd:
      case Op::kCmpSwap:
        wr.opcode = p.op == Op::kFetchAdd ? IBV_WR_ATOMIC_FETCH_AND_ADD
                                          : IBV_WR_ATOMIC_CMP_AND_SWP;
        wr.wr.atomic.remote_addr = q.remote.addr;  // slot 0: the counter
        wr.wr.atomic.rkey = q.remote.rkey;
        wr.wr.atomic.compare_add = p.op == Op::kFetchAdd ? 1 : seq;
        wr.wr.atomic.swap = seq + 1;
        break;
    }
    if (len && len <= p.inline_max && !is_atomic(p.op) && p.op != Op::kRead)
      wr.send_flags |= IBV_SEND_INLINE;
  }
  ibv_send_wr* bad = nullptr;
  if (const int rc = ibv_post_send(q.qp, wrs, &bad)) {
    fail(r,
         "ibv_post_send (qp " + std::to_string(q.index) + "): " + strerror(rc));
    return false;
  }
  q.posted += n;
  q.outstanding.fetch_add(n, std::memory_order_relaxed);
  return true;
}

// A send-side completion: every WR up to and including it is retired.
void retire(Run& r, QpCtx& q, const ibv_wc& wc, uint32_t size, bool count) {
  const Params& p = r.o.p;
  const uint64_t low = wc.wr_id & 0xffffffff;
  // The full sequence: the retired one is at most posted-1 and at least
  // done_seq.
  uint64_t seq = (q.done_seq & ~0xffffffffull) | low;
  if (seq < q.done_seq) seq += 1ull << 32;
  const uint64_t n = seq + 1 - q.done_seq;
  if (p.verify) {
    if (p.op == Op::kRead) {
      // One WR per completion in verify mode: check its slot.
      if (!check(slot(r, q, seq), size, q.index, seq % p.slots))
        q.verify_errors.fetch_add(1, std::memory_order_relaxed);
    } else if (is_atomic(p.op)) {
      uint64_t orig;
      std::memcpy(&orig, slot(r, q, seq), 8);
      if (orig != seq) q.verify_errors.fetch_add(1, std::memory_order_relaxed);
    }
  }
  q.done_seq = seq + 1;
  q.completed += n;
  q.outstanding.fetch_sub(n, std::memory_order_relaxed);
  if (count && (r.phase.load(std::memory_order_relaxed) == 1 || p.iters))
    q.ops.fetch_add(n, std::memory_order_relaxed);
}

// A receive completion (SEND / WRITE_WITH_IMM): checked, then reposted.
bool received(Run& r, QpCtx& q, const ibv_wc& wc, uint32_t size, bool count) {
  const Params& p = r.o.p;
  const uint64_t seq = q.recv_seen++;
  if (p.verify) {
    const uint8_t* data = slot(r, q, seq);
    bool ok = wc.byte_len == size;
    if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM)
      ok = ok && ntohl(wc.imm_data) == static_cast<uint32_t>(seq);
    ok = ok && check(data, size, q.index, seq);
    if (!ok) q.verify_errors.fetch_add(1, std::memory_order_relaxed);
  }
  if (count && (r.phase.load(std::memory_order_relaxed) == 1 || p.iters))
    q.ops.fetch_add(1, std::memory_order_relaxed);
  return post_recv(r, q);
}

bool wc_ok(Run& r, const ibv_wc& wc) {
  if (wc.status == IBV_WC_SUCCESS) return true;
  QpCtx& q = *r.qps[wc.wr_id >> 32];
  q.errors.fetch_add(1, std::memory_order_relaxed);
  char m[200];
  snprintf(m, sizeof m,
           "completion error on qp %u (qpn 0x%x): %s (wr_id seq %u)", q.index,
           wc.qp_num, ibv_wc_status_str(wc.status),
           static_cast<uint32_t>(wc.wr_id));
  fail(r, m);
  return false;
}

// --- one thread's share of a size
// ---------------------------------------

// ibv_poll_cq on thread t's CQ. With --events an empty CQ is armed, looked
// at once more (a completion that came between the poll and the arm raises
// no event), then waited on for up to 10 ms, so that the caller sees the
// phase change: the thread leaves the CPU to the service (perftest -e).
int poll_cq(Run& r, uint32_t t, int n, ibv_wc* wc, bool may_wait = true) {
  int k = ibv_poll_cq(r.cqs[t], n, wc);
  if (k != 0 || !r.o.p.events || !may_wait) return k;
  if (ibv_req_notify_cq(r.cqs[t], 0) != 0) return -1;
  k = ibv_poll_cq(r.cqs[t], n, wc);
  if (k != 0) return k;
  ibv_comp_channel* ch = r.channels[t];
  pollfd pfd{ch->fd, POLLIN, 0};
  if (poll(&pfd, 1, 10) > 0) {
    ibv_cq* cq = nullptr;
    void* cq_ctx = nullptr;
    if (ibv_get_cq_event(ch, &cq, &cq_ctx) != 0) return -1;
    ibv_ack_cq_events(cq, 1);
  }
  return ibv_poll_cq(r.cqs[t], n, wc);
}

void client_bw(Run& r, uint32_t t, uint32_t size) {
  const Params& p = r.o.p;
  std::vector<QpCtx*>& mine = r.by_thread[t];
  ibv_wc wc[32];
  const uint32_t depth = p.depth;
  uint64_t& tout = r.thread_out[t];
  // CQEs this thread's sends may occupy: half the CQ when receives share it.
  const uint64_t room = uses_recv(p.op) ? r.cq_room / 2 : r.cq_room;
  // Each pass starts one QP further: when the CQ budget binds, the first
  // QPs of the list would otherwise take it all and the rest starve (Jain
  // 0.3-0.55 at 16 QPs was this loop, not the NIC).
  size_t first = 0;
  for (;;) {
    const int ph = r.phase.load(std::memory_order_relaxed);
    bool more = false, posted = false;
    first = first + 1 < mine.size() ? first + 1 : 0;
    for (size_t j = 0; j < mine.size(); ++j) {
      QpCtx* q = mine[(first + j) % mine.size()];
      const uint64_t out = q->outstanding.load(std::memory_order_relaxed);
      const bool want = ph < 2 && (!p.iters || q->posted < p.iters);
      if (want && out + p.batch <= depth && tout + p.batch <= room) {
        uint32_t n = p.batch;
        if (p.iters)
          n = static_cast<uint32_t>(std::min<uint64_t>(n, p.iters - q->posted));
        // Signal the last WR before the thread's budget or -n stops
        // posting, or an unsignaled tail would never complete.
        const bool last =
            tout + n + p.batch > room || (p.iters && q->posted + n >= p.iters);
        if (!post_send(r, *q, size, n, last)) return;
        tout += n;
        posted = true;
      } else if (ph == 2 && out && q->since_signal && tout < room) {
        // Posting stopped (the run's end) behind an unsignaled WR (--cq-mod,
        // a queue --batch left short of full): one signaled WR more retires
        // them all.
        if (!post_send(r, *q, size, 1, true)) return;
        ++tout;
      }
      if (want || q->outstanding.load(std::memory_order_relaxed)) more = true;
    }
    if (!more) return;
    // --events: wait only when no QP could take another WR this pass.
    const int k = poll_cq(r, t, 32, wc, !posted);
    if (k < 0) {
      fail(r, "ibv_poll_cq failed");
      return;
    }
    for (int i = 0; i < k; ++i) {
      if (!wc_ok(r, wc[i])) return;
      QpCtx& q = *r.qps[wc[i].wr_id >> 32];
      const uint64_t before = q.outstanding.load(std::memory_order_relaxed);
      retire(r, q, wc[i], size, true);
      tout -= before - q.outstanding.load(std::memory_order_relaxed);
    }
    if (r.failed.load(std::memory_order_relaxed)) return;
  }
}

// Server side of SEND / WRITE_WITH_IMM bandwidth: take, check, repost.
void server_recv(Run& r, uint32_t t, uint32_t size) {
  ibv_wc wc[32];
  while (r.phase.load(std::memory_order_relaxed) < 2) {
    const int k = poll_cq(r, t, 32, wc);
    if (k < 0) {
      fail(r, "ibv_poll_cq failed");
      return;
    }
    for (int i = 0; i < k; ++i) {
      if (!wc_ok(r, wc[i])) return;
      if (wc[i].opcode & IBV_WC_RECV)
        if (!received(r, *r.qps[wc[i].wr_id >> 32], wc[i], size, true)) return;
    }
  }
}

// Waits for the next completion of `kind` on q's thread CQ; other send
// completions are retired as they come. False on error or stop.
bool wait_wc(Run& r, uint32_t t, QpCtx& q, bool want_recv, uint32_t size,
             ibv_wc& out) {
  for (;;) {
    if (r.phase.load(std::memory_order_relaxed) == 2) return false;
    ibv_wc wc;
    const int k = poll_cq(r, t, 1, &wc);
    if (k < 0) {
      fail(r, "ibv_poll_cq failed");
      return false;
    }
    if (k == 0) continue;
    if (!wc_ok(r, wc)) return false;
    QpCtx& w = *r.qps[wc.wr_id >> 32];
    const bool is_recv = wc.opcode & IBV_WC_RECV;
    if (!is_recv) retire(r, w, wc, size, false);  // counted where timed
    if (&w == &q && is_recv == want_recv) {
      out = wc;
      return true;
    }
  }
}

void client_lat(Run& r, uint32_t t, uint32_t size) {
  const Params& p = r.o.p;
  std::vector<QpCtx*>& mine = r.by_thread[t];
  std::vector<double>& lat = r.lat[t];
  const bool pingpong = p.op == Op::kWrite || uses_recv(p.op);
  uint64_t n = 0;
  for (;;) {
    for (QpCtx* q : mine) {
      const int ph = r.phase.load(std::memory_order_relaxed);
      if (ph == 2 || (p.iters && n >= p.iters * mine.size())) return;
      ++n;
      // --gap: traffic that comes and goes (a request now and then), so
      // the service's lcores have gone idle when it comes; not timed.
      if (r.o.gap_us) {
        const timespec ts{static_cast<time_t>(r.o.gap_us / 1000000),
                          static_cast<long>(r.o.gap_us % 1000000) * 1000};
        nanosleep(&ts, nullptr);
      }
      const uint64_t t0 = now_ns();
      ibv_wc wc;
      const uint64_t seq = q->next_seq;
      if (!post_send(r, *q, size, 1, true)) return;
      if (p.op == Op::kWrite) {
        // The server writes the same sequence back into our slot.
        volatile uint8_t* last = slot(r, *q, seq) + (size ? size - 1 : 0);
        const uint8_t want = tag(r, seq);
        while (*last != want)
          if (r.phase.load(std::memory_order_relaxed) == 2) return;
        if (!wait_wc(r, t, *q, false, size, wc)) return;
      } else if (uses_recv(p.op)) {
        if (!wait_wc(r, t, *q, true, size, wc)) return;
        if (!received(r, *q, wc, size, false)) return;
      } else {
        if (!wait_wc(r, t, *q, false, size, wc)) return;
      }
      const double us = static_cast<double>(now_ns() - t0) / 1000.0;
      if (r.phase.load(std::memory_order_relaxed) == 1 || p.iters) {
        // Ping-pong latency is half the round trip (as perftest reports).
        if (lat.size() < lat.capacity()) lat.push_back(pingpong ? us / 2 : us);
        q->ops.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
}

// The server's half of a ping-pong: answer every message on its QPs.
void server_pong(Run& r, uint32_t t, uint32_t size) {
  const Params& p = r.o.p;
  std::vector<QpCtx*>& mine = r.by_thread[t];
  while (r.phase.load(std::memory_order_relaxed) < 2) {
    for (QpCtx* q : mine) {
      const uint64_t seq = q->next_seq;
      if (p.op == Op::kWrite) {
        volatile uint8_t* last = slot(r, *q, seq) + (size ? size - 1 : 0);
        if (*last != tag(r, seq)) continue;
      } else {
        ibv_wc wc;
        if (poll_cq(r, t, 1, &wc) != 1) continue;
        if (!wc_ok(r, wc)) return;
        QpCtx& w = *r.qps[wc.wr_id >> 32];
        if (!(wc.opcode & IBV_WC_RECV)) {
          retire(r, w, wc, size, false);
          continue;
        }
        if (!received(r, w, wc, size, true)) return;
        if (!post_send(r, w, size, 1, true)) return;
        continue;
      }
      if (!post_send(r, *q, size, 1, true)) return;
      ibv_wc wc;
      if (!wait_wc(r, t, *q, false, size, wc)) return;
    }
  }
}

// --- output
// --------------------------------------------------------------

struct Result {
  uint32_t size = 0;
  uint64_t ops = 0, errors = 0, verify_errors = 0;
  double seconds = 0, mops = 0, gbps = 0;
  bool has_lat = false;
  double lmin = 0, lmed = 0, l99 = 0, l999 = 0, lmax = 0, lavg = 0;
  std::vector<uint64_t> per_qp;
  // The service's counters of these QPs over the measured period only
  // (--urnicd, bw/rate): not the warm-up, not the drain after it.
  std::map<std::string, uint64_t> svc_window;
};

struct Printer {
  Run& r;
  ServiceStats svc;
  bool svc_warned = false;
  uint64_t t_prev = 0;
  std::vector<uint64_t> prev_ops;
  ServiceSample prev_svc;
  std::unordered_set<uint32_t> qpns;

  explicit Printer(Run& run) : r(run), svc(run.o.urnicd) {
    for (auto& q : r.qps) qpns.insert(q->qp->qp_num);
    prev_ops.assign(r.qps.size(), 0);
  }
  ServiceSample sample() {
    if (!svc.enabled()) return {};
    ServiceSample s = svc.sample(qpns);
    if (!s.ok && !svc_warned) {
      fprintf(stderr, "urnic-perf: %s; going on without service counters\n",
              svc.error().c_str());
      svc_warned = true;
    }
    return s;
  }
  void start() {
    t_prev = now_ns();
    for (size_t i = 0; i < r.qps.size(); ++i)
      prev_ops[i] = r.qps[i]->ops.load(std::memory_order_relaxed);
    prev_svc = sample();
  }
  static std::string svc_qp(const ServiceSample& s, uint32_t qpn,
                            const char* k) {
    if (!s.ok) return "-";
    auto it = s.per_qp.find(qpn);
    if (it == s.per_qp.end()) return "-";
    auto v = it->second.find(k);
    return v == it->second.end() ? "-" : std::to_string(v->second);
  }
  void show(uint32_t size, double elapsed_s) {
    const uint64_t t = now_ns();
    const double dt = static_cast<double>(t - t_prev) / 1e9;
    t_prev = t;
    const ServiceSample s = sample();
    printf(
        "\n  ######################## urnic-perf statistics (%.1f s, %u B) "
        "########################\n",
        elapsed_s, size);
    uint64_t tot = 0, tot_d = 0, outst = 0, errs = 0;
    for (size_t i = 0; i < r.qps.size(); ++i) {
      QpCtx& q = *r.qps[i];
      const uint64_t ops = q.ops.load(std::memory_order_relaxed);
      const uint64_t d = ops - prev_ops[i];
      prev_ops[i] = ops;
      tot += ops;
      tot_d += d;
      outst += q.outstanding.load(std::memory_order_relaxed);
      errs += q.errors.load(std::memory_order_relaxed);
      if (i < r.o.show_qps)
        printf(
            "  QP %-4zu (qpn 0x%-5x): ops: %-10" PRIu64
            " ops/s: %-10.0f "
            "Gb/s: %-7.3f outstanding: %-5" PRIu64
            " retx: %s  naks: %s  "
            "errors: %" PRIu64 "\n",
            i, q.qp->qp_num, ops, d / dt,
            static_cast<double>(d) * size * 8 / dt / 1e9,
            q.outstanding.load(std::memory_order_relaxed),
            svc_qp(s, q.qp->qp_num, "retransmits").c_str(),
            s.ok ? std::to_string(naks(s.per_qp.count(q.qp->qp_num)
                                           ? s.per_qp.at(q.qp->qp_num)
                                           : std::map<std::string, uint64_t>{}))
                       .c_str()
                 : "-",
            q.errors.load(std::memory_order_relaxed));
    }
    if (r.qps.size() > r.o.show_qps)
      printf("  ... %zu more QPs\n", r.qps.size() - r.o.show_qps);
    printf("  Total: ops: %-12" PRIu64 " outstanding: %-6" PRIu64
           " errors: %" PRIu64 "\n",
           tot, outst, errs);
    printf("  Throughput (since last show)\n    Mops/s: %-10.4f Gb/s: %.3f\n",
           tot_d / dt / 1e6, static_cast<double>(tot_d) * size * 8 / dt / 1e9);
    if (s.ok) {
      for (const auto& l : s.lcores) {
        const ServiceSample::Lcore* pl = nullptr;
        for (const auto& x : prev_svc.lcores)
          if (x.lcore == l.lcore) pl = &x;
        const uint64_t b = l.cycles_busy - (pl ? pl->cycles_busy : 0);
        const uint64_t i = l.cycles_idle - (pl ? pl->cycles_idle : 0);
        const uint64_t db = l.doorbells - (pl ? pl->doorbells : 0);
        printf("  urnicd lcore %u (%u QPs): busy %.1f%%  doorbells/s %.0f",
               l.lcore, l.qps,
               b + i
                   ? 100.0 * static_cast<double>(b) / static_cast<double>(b + i)
                   : 0.0,
               db / dt);
        if (&l == &s.lcores.front()) {  // the service's transport totals
          auto delta = [&](const char* k) {
            const uint64_t a = s.sum.count(k) ? s.sum.at(k) : 0;
            const uint64_t z = prev_svc.sum.count(k) ? prev_svc.sum.at(k) : 0;
            return a - z;
          };
          printf("  retransmits +%" PRIu64 "  timeouts +%" PRIu64
                 "  NAKs rx seq/rnr/other +%" PRIu64 "/+%" PRIu64 "/+%" PRIu64
                 "  RNR waits +%" PRIu64,
                 delta("retransmits"), delta("timeouts"), delta("naks_seq_rx"),
                 delta("naks_rnr_rx"),
                 delta("naks_access_rx") + delta("naks_inv_req_rx") +
                     delta("naks_op_rx"),
                 delta("rnr_waits"));
        }
        printf("\n");
      }
      prev_svc = s;
    }
    printf(
        "  ##############################################################"
        "##############\n");
    fflush(stdout);
  }
  static uint64_t naks(const std::map<std::string, uint64_t>& v) {
    uint64_t n = 0;
    for (const auto& [k, x] : v)
      if (k.rfind("naks_", 0) == 0 && k.size() > 3 &&
          k.compare(k.size() - 3, 3, "_rx") == 0)
        n += x;
    return n;
  }
};

void print_summary(const Run& r, const std::vector<Result>& res) {
  const Params& p = r.o.p;
  printf(
      "\n urnic-perf %s %s on %s: %u QP(s) x %u thread(s), depth %u, "
      "batch %u, cq-mod %u, mtu %u%s\n",
      kOpNames[static_cast<int>(p.op)], kModeNames[static_cast<int>(p.mode)],
      r.o.dev.c_str(), p.qps, p.threads, p.depth, p.batch, p.cq_mod,
      128u << p.mtu, p.verify ? ", verified" : "");
  if (p.mode == Mode::kLat) {
    printf(" %8s %10s %9s %9s %9s %9s %9s %9s %9s\n", "#bytes", "#ops",
           "min[us]", "median", "p99", "p99.9", "max", "avg", "errors");
    for (const Result& x : res)
      printf(" %8u %10" PRIu64 " %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9" PRIu64
             "\n",
             x.size, x.ops, x.lmin, x.lmed, x.l99, x.l999, x.lmax, x.lavg,
             x.errors + x.verify_errors);
  } else {
    printf(" %8s %12s %9s %10s %10s %8s %8s\n", "#bytes", "#ops", "seconds",
           "Mops/s", "Gb/s", "errors", "verify");
    for (const Result& x : res)
      printf(
          " %8u %12" PRIu64 " %9.3f %10.4f %10.3f %8" PRIu64 " %8" PRIu64 "\n",
          x.size, x.ops, x.seconds, x.mops, x.gbps, x.errors, x.verify_errors);
  }
  fflush(stdout);
}

void appendf(std::string& s, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));
void appendf(std::string& s, const char* fmt, ...) {
  char b[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b, sizeof b, fmt, ap);
  va_end(ap);
  s += b;
}

std::string to_json(const Run& r, const std::vector<Result>& res,
                    const ServiceSample* svc, const uint64_t mem[3]) {
  const Params& p = r.o.p;
  std::string s;
  appendf(
      s,
      "{\"tool\":\"urnic-perf\",\"version\":1,\"role\":\"%s\",\"dev\":\"%s\","
      "\"op\":\"%s\",\"mode\":\"%s\",\"qps\":%u,\"threads\":%u,"
      "\"threads_seen\":%u,\"depth\":%u,\"batch\":%u,\"cq_mod\":%u,"
      "\"mtu\":%u,\"verify\":%s,\"events\":%s,\"results\":[",
      r.o.server ? "server" : "client", r.o.dev.c_str(),
      kOpNames[static_cast<int>(p.op)], kModeNames[static_cast<int>(p.mode)],
      p.qps, p.threads, r.threads_seen.load(), p.depth, p.batch, p.cq_mod,
      128u << p.mtu, p.verify ? "true" : "false", p.events ? "true" : "false");
  for (size_t i = 0; i < res.size(); ++i) {
    const Result& x = res[i];
    appendf(s,
            "%s{\"size\":%u,\"ops\":%" PRIu64
            ",\"seconds\":%.6f,\"mops\":%.6f,"
            "\"gbps\":%.6f,\"errors\":%" PRIu64 ",\"verify_errors\":%" PRIu64,
            i ? "," : "", x.size, x.ops, x.seconds, x.mops, x.gbps, x.errors,
            x.verify_errors);
    if (x.has_lat)
      appendf(s,
              ",\"latency_us\":{\"min\":%.3f,\"median\":%.3f,\"p99\":%.3f,"
              "\"p999\":%.3f,\"max\":%.3f,\"avg\":%.3f}",
              x.lmin, x.lmed, x.l99, x.l999, x.lmax, x.lavg);
    s += ",\"per_qp\":[";
    for (size_t k = 0; k < x.per_qp.size(); ++k)
      appendf(s, "%s{\"qp\":%zu,\"qpn\":%u,\"ops\":%" PRIu64 "}", k ? "," : "",
              k, r.qps[k]->qp->qp_num, x.per_qp[k]);
    s += "]";
    if (!x.svc_window.empty()) {
      s += ",\"service_window\":{";
      bool first = true;
      for (const auto& [k, v] : x.svc_window) {
        appendf(s, "%s\"%s\":%" PRIu64, first ? "" : ",", k.c_str(), v);
        first = false;
      }
      s += "}";
    }
    s += "}";
  }
  s += "],\"service\":";
  if (svc && svc->ok) {
    s += "{";
    bool first = true;
    for (const auto& [k, v] : svc->sum) {
      appendf(s, "%s\"%s\":%" PRIu64, first ? "" : ",", k.c_str(), v);
      first = false;
    }
    appendf(s, "%s\"lcores\":[", first ? "" : ",");
    for (size_t i = 0; i < svc->lcores.size(); ++i) {
      const auto& l = svc->lcores[i];
      appendf(s,
              "%s{\"lcore\":%u,\"qps\":%u,\"cycles_busy\":%" PRIu64
              ",\"cycles_idle\":%" PRIu64 ",\"doorbells\":%" PRIu64 "}",
              i ? "," : "", l.lcore, l.qps, l.cycles_busy, l.cycles_idle,
              l.doorbells);
    }
    s += "]}";
  } else {
    s += "null";
  }
  if (mem) {
    // What the rings for these QPs and CQs take in the shim's layout
    // (dataplane/hostif/abi.h: 336 B per send WQE, 272 B per receive WQE, 64 B
    // per CQE slot): an estimate from the requested capacities.
    const uint64_t sq = p.depth + p.batch, rq = uses_recv(p.op) ? p.depth : 1;
    const uint64_t ring = uint64_t{p.qps} * (sq * 336 + rq * 272) +
                          uint64_t{p.qps} * (sq + rq) * 64;
    appendf(s,
            ",\"memory\":{\"rss_kib_start\":%" PRIu64
            ",\"rss_kib_device\":%" PRIu64 ",\"rss_kib_qps\":%" PRIu64
            ",\"qps\":%u,\"ring_bytes\":%" PRIu64
            ",\"buffer_bytes\":%zu"
            ",\"qp_lib_heap_bytes\":%" PRId64 "}",
            mem[0], mem[1], mem[2], p.qps, ring, r.buf_len, r.qp_lib_heap);
  }
  s += "}\n";
  return s;
}

Result summarize(Run& r, uint32_t size, double seconds) {
  Result x;
  x.size = size;
  x.seconds = seconds;
  for (auto& q : r.qps) {
    const uint64_t o = q->ops.load();
    x.per_qp.push_back(o);
    x.ops += o;
    x.errors += q->errors.load();
    x.verify_errors += q->verify_errors.load();
  }
  x.mops = seconds > 0 ? static_cast<double>(x.ops) / seconds / 1e6 : 0;
  x.gbps =
      seconds > 0 ? static_cast<double>(x.ops) * size * 8 / seconds / 1e9 : 0;
  std::vector<double> all;
  for (auto& v : r.lat) all.insert(all.end(), v.begin(), v.end());
  if (!all.empty()) {
    std::sort(all.begin(), all.end());
    auto pct = [&](double q) {
      return all[std::min(
          all.size() - 1,
          static_cast<size_t>(q * static_cast<double>(all.size())))];
    };
    x.has_lat = true;
    x.lmin = all.front();
    x.lmax = all.back();
    x.lmed = pct(0.5);
    x.l99 = pct(0.99);
    x.l999 = pct(0.999);
    double sum = 0;
    for (double v : all) sum += v;
    x.lavg = sum / static_cast<double>(all.size());
  }
  return x;
}

void reset_counts(Run& r) {
  for (auto& q : r.qps) {
    q->ops = 0;
    q->posted = q->completed = 0;
  }
  for (auto& v : r.lat) v.clear();
}

// Runs `body(thread)` on the run's threads (a TBB arena of that many
// slots) while the calling thread drives the phases and prints.
template <class F>
void run_threads(Run& r, F body, const std::function<void()>& driver) {
  std::atomic<bool> done{false};
  std::set<int> seen;
  std::mutex seen_mu;
  std::thread drv([&] {
    driver();
    done = true;
  });
  tbb::task_arena arena(static_cast<int>(r.o.p.threads));
  arena.execute([&] {
    tbb::parallel_for(
        0u, r.o.p.threads,
        [&](uint32_t t) {
          {
            std::lock_guard g(seen_mu);
            seen.insert(tbb::this_task_arena::current_thread_index());
          }
          body(t);
        },
        tbb::simple_partitioner());
  });
  drv.join();
  r.threads_seen = static_cast<uint32_t>(seen.size());
}

[[noreturn]] void peer_lost() {
  die(3, "the peer closed the connection (it exited or was killed)");
}

int run_client(Run& r, Channel& ch) {
  Params& p = r.o.p;
  std::vector<Result> results;
  Printer pr(r);
  std::unique_ptr<FILE, int (*)(FILE*)> trace_file(nullptr, fclose);
  if (!r.o.trace_path.empty()) {
    trace_file.reset(fopen(r.o.trace_path.c_str(), "w"));
    if (!trace_file) die(1, "%s: %s", r.o.trace_path.c_str(), strerror(errno));
  }
  FILE* const trace_f = trace_file.get();
  for (uint32_t si = 0; si < p.nsizes && !r.failed; ++si) {
    const uint32_t size = is_atomic(p.op) ? 8 : p.sizes[si];
    reset_counts(r);
    if (p.mode == Mode::kLat)
      for (auto& v : r.lat)
        v.reserve(p.iters ? p.iters * r.by_thread[0].size() : 4'000'000);
    if (!ch.send_msg({Msg::kBegin, si})) peer_lost();
    CtlMsg ack;
    if (!ch.recv_msg(ack) || ack.type != Msg::kBegin) peer_lost();
    r.phase = p.iters ? 1 : 0;
    uint64_t t_start = now_ns(), t_end = 0;
    ServiceSample win0, win1;
    // --trace: a line every ~10 ms (perf/bottleneck STAGGER_MS: how two
    // flows share a bottleneck over time, across processes).
    uint64_t next_trace = 0;
    auto trace = [&] {
      if (!trace_f || now_ns() < next_trace) return;
      next_trace = now_ns() + 10'000'000;
      fprintf(trace_f, "%" PRIu64 " %u", now_ns(), size);
      for (auto& q : r.qps)
        fprintf(trace_f, " %" PRIu64, q->ops.load(std::memory_order_relaxed));
      fputc('\n', trace_f);
      fflush(trace_f);  // a client stopped by a signal keeps its trace
    };
    auto driver = [&] {
      if (!p.iters) {
        // Warm-up (not measured), then the measured period with live
        // output, then stop; the threads drain what is outstanding.
        const uint64_t w_end = now_ns() + uint64_t{p.warmup_ms} * 1'000'000;
        while (now_ns() < w_end && !r.failed) {
          usleep(1000);
          trace();
        }
        t_start = now_ns();
        pr.start();
        win0 = pr.prev_svc;
        r.phase = 1;
        const uint64_t end = t_start + uint64_t{p.duration_ms} * 1'000'000;
        uint64_t next = t_start + uint64_t{r.o.period_ms} * 1'000'000;
        while (now_ns() < end && !r.failed) {
          usleep(1000);
          trace();
          if (r.o.period_ms && now_ns() >= next) {
            pr.show(size, static_cast<double>(now_ns() - t_start) / 1e9);
            next += uint64_t{r.o.period_ms} * 1'000'000;
          }
          if (ch.readable(0)) {  // the server only speaks when asked
            fail(r, "the peer closed the connection");
          }
        }
        t_end = now_ns();
        r.phase = 2;  // before the sample: its paging must not count ops
        win1 = pr.sample();
      }
    };
    pr.start();
    if (p.mode == Mode::kLat)
      run_threads(
          r, [&](uint32_t t) { client_lat(r, t, size); }, driver);
    else
      run_threads(
          r, [&](uint32_t t) { client_bw(r, t, size); }, driver);
    if (p.iters) t_end = now_ns();
    r.phase = 2;
    // The server's verdict (and its receive count) for this size.
    CtlMsg end{Msg::kEnd, si};
    if (!ch.send_msg(end)) peer_lost();
    if (p.verify && p.op == Op::kWrite) {
      std::vector<uint64_t> n(r.qps.size());
      for (auto& q : r.qps) n[q->index] = q->next_seq;
      if (!ch.send_all(n.data(), n.size() * 8)) peer_lost();
    }
    CtlMsg res;
    if (!ch.recv_msg(res) || res.type != Msg::kResult) peer_lost();
    Result x = summarize(r, size, static_cast<double>(t_end - t_start) / 1e9);
    if (win0.ok && win1.ok)
      for (const auto& [k, v] : win1.sum) {
        // Levels, not counts (qp.h): a difference means nothing.
        if (k == "cc_window" || k == "cc_rate_mbps" || k == "nak_cause" ||
            k == "srtt_us")
          continue;
        const auto it = win0.sum.find(k);
        x.svc_window[k] = v - (it == win0.sum.end() ? 0 : it->second);
      }
    x.verify_errors += res.b;
    x.errors += res.c;
    if (res.b)
      fprintf(stderr,
              "urnic-perf: the server found %" PRIu64
              " message(s) that fail verification\n",
              res.b);
    results.push_back(std::move(x));
  }
  ch.send_msg({Msg::kBye, 0});
  print_summary(r, results);
  ServiceSample svc = pr.sample();
  if (!r.o.json_path.empty()) {
    const std::string js = to_json(r, results, &svc, nullptr);
    FILE* f = r.o.json_path == "-" ? stdout : fopen(r.o.json_path.c_str(), "w");
    if (!f) die(1, "%s: %s", r.o.json_path.c_str(), strerror(errno));
    fputs(js.c_str(), f);
    if (f != stdout) fclose(f);
  }
  if (r.threads_seen < p.threads)
    fprintf(stderr, "urnic-perf: note: only %u of %u threads ran at once\n",
            r.threads_seen.load(), p.threads);
  if (r.failed) die(4, "%s", r.fail_msg.c_str());
  uint64_t verr = 0;
  for (const Result& x : results) verr += x.verify_errors;
  if (verr) die(5, "verification failed: %" PRIu64 " bad message(s)", verr);
  return 0;
}

int run_server(Run& r, Channel& ch) {
  Params& p = r.o.p;
  for (;;) {
    CtlMsg m;
    if (!ch.recv_msg(m)) peer_lost();
    if (m.type == Msg::kBye) return 0;
    if (m.type != Msg::kBegin || m.size_index >= p.nsizes)
      die(1, "protocol error from the client (message %u)",
          static_cast<uint32_t>(m.type));
    const uint32_t size = is_atomic(p.op) ? 8 : p.sizes[m.size_index];
    reset_counts(r);
    r.phase = 1;
    const bool active = p.mode == Mode::kLat
                            ? (p.op == Op::kWrite || uses_recv(p.op))
                            : uses_recv(p.op);
    CtlMsg end;
    auto driver = [&] {
      ch.send_msg({Msg::kBegin, m.size_index});
      if (!ch.recv_msg(end)) {
        fail(r, "the peer closed the connection");
        return;
      }
      r.phase = 2;
    };
    if (active) {
      if (p.mode == Mode::kLat)
        run_threads(
            r, [&](uint32_t t) { server_pong(r, t, size); }, driver);
      else
        run_threads(
            r, [&](uint32_t t) { server_recv(r, t, size); }, driver);
    } else {
      driver();
    }
    if (r.failed && r.fail_msg.find("closed") != std::string::npos) peer_lost();
    uint64_t verr = 0, errs = 0, ops = 0;
    if (p.verify && p.op == Op::kWrite) {
      // The last message written to each slot must be intact.
      std::vector<uint64_t> n(r.qps.size());
      if (!ch.recv_all(n.data(), n.size() * 8)) peer_lost();
      for (auto& q : r.qps) {
        for (uint64_t s = 0; s < p.slots && s < n[q->index]; ++s) {
          const uint64_t last =
              (n[q->index] - 1) - ((n[q->index] - 1 - s) % p.slots);
          if (!check(slot(r, *q, last), size, q->index, last)) ++verr;
        }
      }
    }
    for (auto& q : r.qps) {
      verr += q->verify_errors.exchange(0);
      errs += q->errors.load();
      ops += q->ops.load();
    }
    if (verr)
      fprintf(stderr,
              "urnic-perf: %" PRIu64
              " received message(s) fail "
              "verification (size %u)\n",
              verr, size);
    if (!ch.send_msg({Msg::kResult, m.size_index, ops, verr, errs}))
      peer_lost();
    if (r.failed) die(4, "%s", r.fail_msg.c_str());
  }
}

void usage(FILE* f) {
  fprintf(
      f,
      "usage: urnic-perf --server [options]        (server)\n"
      "       urnic-perf [options] HOST            (client)\n"
      "  -d, --dev NAME        device (default: the first)\n"
      "  -i, --ib-port N       port (1)          -x, --gid-index N  GID (0)\n"
      "  -p, --port N          TCP port (18516)\n"
      "  -o, --op OP           write write_imm read send fetch_add cmp_swap\n"
      "  -m, --mode MODE       bw (stream --depth WRs per QP), rate (the "
      "same,\n"
      "                        reported in Mops/s), lat (one op per QP at a "
      "time;\n"
      "                        WRITE/SEND/WRITE_IMM ping-pong: half the round\n"
      "                        trip, as perftest; READ/atomics: post to "
      "completion)\n"
      "  -s, --size BYTES      message size (65536; atomics: 8)\n"
      "      --sizes A,B,...   several sizes     -a, --sweep  2 B .. 64 KiB\n"
      "  -q, --qps N           QPs (1)           -t, --threads M  TBB threads "
      "(1)\n"
      "      --depth N         outstanding WRs per QP (bw/rate 64, lat 1)\n"
      "  -e, --events          wait for completions on a completion channel\n"
      "                        instead of polling without pause (perftest "
      "-e)\n"
      "      --batch B         WRs chained per ibv_post_send (1)\n"
      "      --cq-mod K        signal one WR in K (1)\n"
      "      --inline N        max inline bytes (0)\n"
      "  -D, --duration SEC    measured time per size (5)  --warmup SEC (1)\n"
      "  -n, --iters N         ops per QP instead of a duration\n"
      "      --period MS       live statistics period (1000; 0: none)\n"
      "      --show-qps N      QP lines in the live output (16)\n"
      "      --verify          check every message's data (see "
      "perf/README.md)\n"
      "      --json FILE       results as JSON ('-': stdout)\n"
      "      --trace FILE      every ~10 ms (with -D): CLOCK_MONOTONIC ns, "
      "the size,\n"
      "                        each QP's ops (0 until the warm-up ends)\n"
      "      --urnicd SOCKET   show urnicd's per-QP counters (default\n"
      "                        $URNIC_SOCKET's first entry, if set)\n"
      "      --mtu N           256..4096 (default: the port's active MTU)\n"
      "      --rd-atomic N     outstanding READ/atomics per QP (16)\n"
      "      --timeout N --retry-cnt N --rnr-retry N   (14, 7, 7)\n"
      "      --hold SEC        connect the QPs, report RSS, wait, exit\n"
      "      --gap US          lat: sleep US before each op (not timed): the\n"
      "                        service is idle when it comes\n"
      "      --loop            server: serve clients until killed\n"
      "      --slots N         at least N message slots per QP in each side's\n"
      "                        buffer (1; --verify: 2 x depth), WRs cycling\n"
      "                        through them: the memory the run touches\n"
      "Environment: URNIC_PERF_CORRUPT=1 makes the client damage one payload\n"
      "(a check that --verify works).\n");
}

uint32_t parse_u32(const char* s, const char* what) {
  char* e = nullptr;
  errno = 0;
  const unsigned long v = strtoul(s, &e, 10);
  if (errno || !e || *e || v > UINT32_MAX) die(2, "bad %s: %s", what, s);
  return static_cast<uint32_t>(v);
}

Options parse(int argc, char** argv) {
  Options o;
  Params& p = o.p;
  enum {
    kSizes = 1000,
    kDepth,
    kBatch,
    kCqMod,
    kInline,
    kWarmup,
    kPeriod,
    kShow,
    kVerify,
    kJson,
    kUrnicd,
    kMtu,
    kRdAtomic,
    kTimeout,
    kRetry,
    kRnr,
    kHold,
    kServer,
    kLoop,
    kTrace,
    kGap,
    kSlots
  };
  static const option kLong[] = {
      {"dev", 1, nullptr, 'd'},          {"ib-port", 1, nullptr, 'i'},
      {"gid-index", 1, nullptr, 'x'},    {"port", 1, nullptr, 'p'},
      {"op", 1, nullptr, 'o'},           {"mode", 1, nullptr, 'm'},
      {"size", 1, nullptr, 's'},         {"sizes", 1, nullptr, kSizes},
      {"sweep", 0, nullptr, 'a'},        {"qps", 1, nullptr, 'q'},
      {"threads", 1, nullptr, 't'},      {"depth", 1, nullptr, kDepth},
      {"batch", 1, nullptr, kBatch},     {"cq-mod", 1, nullptr, kCqMod},
      {"inline", 1, nullptr, kInline},   {"duration", 1, nullptr, 'D'},
      {"warmup", 1, nullptr, kWarmup},   {"iters", 1, nullptr, 'n'},
      {"period", 1, nullptr, kPeriod},   {"show-qps", 1, nullptr, kShow},
      {"verify", 0, nullptr, kVerify},   {"json", 1, nullptr, kJson},
      {"trace", 1, nullptr, kTrace},     {"urnicd", 1, nullptr, kUrnicd},
      {"mtu", 1, nullptr, kMtu},         {"rd-atomic", 1, nullptr, kRdAtomic},
      {"timeout", 1, nullptr, kTimeout}, {"retry-cnt", 1, nullptr, kRetry},
      {"rnr-retry", 1, nullptr, kRnr},   {"hold", 1, nullptr, kHold},
      {"server", 0, nullptr, kServer},   {"loop", 0, nullptr, kLoop},
      {"gap", 1, nullptr, kGap},         {"slots", 1, nullptr, kSlots},
      {"events", 0, nullptr, 'e'},       {"help", 0, nullptr, 'h'},
      {nullptr, 0, nullptr, 0}};
  if (const char* e = getenv("URNIC_SOCKET")) {
    o.urnicd = e;
    o.urnicd = o.urnicd.substr(0, o.urnicd.find(':'));
  }
  bool depth_set = false;
  uint32_t slots_min = 1;
  int c;
  while ((c = getopt_long(argc, argv, "d:i:x:p:o:m:s:aq:t:D:n:eh", kLong,
                          nullptr)) != -1) {
    switch (c) {
      case 'd':
        o.dev = optarg;
        break;
      case 'i':
        o.ib_port = static_cast<int>(parse_u32(optarg, "ib-port"));
        break;
      case 'x':
        o.gid_index = static_cast<int>(parse_u32(optarg, "gid-index"));
        break;
      case 'p':
        o.port = static_cast<uint16_t>(parse_u32(optarg, "port"));
        break;
      case 'o': {
        bool ok = false;
        for (uint32_t i = 0; i < std::size(kOpNames); ++i)
          if (std::strcmp(optarg, kOpNames[i]) == 0) {
            p.op = static_cast<Op>(i);
            ok = true;
          }
        if (!ok) die(2, "unknown op %s", optarg);
        break;
      }
      case 'm': {
        bool ok = false;
        for (uint32_t i = 0; i < std::size(kModeNames); ++i)
          if (std::strcmp(optarg, kModeNames[i]) == 0) {
            p.mode = static_cast<Mode>(i);
            ok = true;
          }
        if (!ok) die(2, "unknown mode %s", optarg);
        break;
      }
      case 's':
        p.nsizes = 1;
        p.sizes[0] = parse_u32(optarg, "size");
        break;
      case kSizes: {
        p.nsizes = 0;
        std::string s = optarg;
        size_t pos = 0;
        while (pos <= s.size() && p.nsizes < kMaxSizes) {
          const size_t e = s.find(',', pos);
          p.sizes[p.nsizes++] =
              parse_u32(s.substr(pos, e - pos).c_str(), "sizes");
          if (e == std::string::npos) break;
          pos = e + 1;
        }
        break;
      }
      case 'a':
        p.nsizes = 0;
        for (uint32_t s = 2; s <= 65536; s *= 2) p.sizes[p.nsizes++] = s;
        break;
      case 'q':
        p.qps = parse_u32(optarg, "qps");
        break;
      case 't':
        p.threads = parse_u32(optarg, "threads");
        break;
      case kDepth:
        p.depth = parse_u32(optarg, "depth");
        depth_set = true;
        break;
      case kBatch:
        p.batch = parse_u32(optarg, "batch");
        break;
      case kCqMod:
        p.cq_mod = parse_u32(optarg, "cq-mod");
        break;
      case kInline:
        p.inline_max = parse_u32(optarg, "inline");
        break;
      case 'D':
        p.duration_ms = parse_u32(optarg, "duration") * 1000;
        break;
      case kWarmup:
        p.warmup_ms = parse_u32(optarg, "warmup") * 1000;
        break;
      case 'n':
        p.iters = parse_u32(optarg, "iters");
        break;
      case kPeriod:
        o.period_ms = parse_u32(optarg, "period");
        break;
      case kShow:
        o.show_qps = parse_u32(optarg, "show-qps");
        break;
      case kVerify:
        p.verify = 1;
        break;
      case kJson:
        o.json_path = optarg;
        break;
      case kTrace:
        o.trace_path = optarg;
        break;
      case kUrnicd:
        o.urnicd = optarg;
        break;
      case kMtu: {
        const uint32_t m = parse_u32(optarg, "mtu");
        p.mtu = m == 256    ? 1
                : m == 512  ? 2
                : m == 1024 ? 3
                : m == 2048 ? 4
                : m == 4096 ? 5
                            : 0;
        if (!p.mtu) die(2, "mtu must be 256, 512, 1024, 2048 or 4096");
        break;
      }
      case kRdAtomic:
        p.rd_atomic = parse_u32(optarg, "rd-atomic");
        break;
      case kGap:
        o.gap_us = parse_u32(optarg, "gap");
        break;
      case kSlots:
        slots_min = parse_u32(optarg, "slots");
        if (slots_min == 0 || slots_min > 65536)
          die(2, "slots must be 1..65536");
        break;
      case kTimeout:
        p.timeout = parse_u32(optarg, "timeout");
        break;
      case kRetry:
        p.retry_cnt = parse_u32(optarg, "retry-cnt");
        break;
      case kRnr:
        p.rnr_retry = parse_u32(optarg, "rnr-retry");
        break;
      case kHold:
        p.hold_s = parse_u32(optarg, "hold");
        break;
      case kServer:
        o.server = true;
        break;
      case kLoop:
        o.loop = true;
        break;
      case 'e':
        p.events = 1;
        break;
      case 'h':
        usage(stdout);
        exit(0);
      default:
        usage(stderr);
        exit(2);
    }
  }
  if (optind < argc) o.host = argv[optind++];
  if (optind != argc || (o.server == !o.host.empty())) {
    usage(stderr);
    exit(2);
  }
  if (!depth_set) p.depth = p.mode == Mode::kLat ? 1 : 64;
  if (p.qps == 0 || p.threads == 0 || p.depth == 0 || p.batch == 0 ||
      p.cq_mod == 0 || p.nsizes == 0)
    die(2, "qps, threads, depth, batch, cq-mod and sizes must be > 0");
  if (p.threads > p.qps)
    die(2, "more threads (%u) than QPs (%u)", p.threads, p.qps);
  if (p.batch > 64) die(2, "batch is at most 64");
  if (o.gap_us && p.mode != Mode::kLat) die(2, "--gap is for -m lat");
  if (p.events && p.mode == Mode::kLat && p.op == Op::kWrite)
    die(2, "--events: a WRITE ping-pong waits on memory, not on the CQ");
  if (!o.trace_path.empty() && p.iters)
    die(2, "--trace needs a duration (-D), not -n");
  if (p.batch > p.depth)
    die(2, "batch (%u) exceeds depth (%u)", p.batch, p.depth);
  if (is_atomic(p.op)) {
    p.nsizes = 1;
    p.sizes[0] = 8;
  }
  if (p.mode == Mode::kLat) {
    p.depth = 1;
    p.batch = 1;
    p.cq_mod = 1;
    if (p.op == Op::kWrite)
      for (uint32_t i = 0; i < p.nsizes; ++i)
        if (p.sizes[i] == 0) die(2, "WRITE latency needs a size of at least 1");
  }
  // Verification needs to see each READ/atomic result: one CQE per WR.
  if (p.verify && (p.op == Op::kRead || is_atomic(p.op))) p.cq_mod = 1;
  if (p.verify && uses_recv(p.op))
    for (uint32_t i = 0; i < p.nsizes; ++i)
      if (p.sizes[i] == 0) die(2, "--verify needs sizes > 0");
  // Slots: one per QP unless data is checked (then enough that a slot is
  // never rewritten before it was checked: the sender's depth plus the
  // receiver's receive queue), and the READ source slots.
  // --slots asks for more: a buffer footprint that does not depend on the
  // QP count (1 QP x 256 slots touches what 256 QPs x 1 slot do).
  p.slots = std::max(p.verify ? 2 * p.depth : 1, slots_min);
  if (p.mode == Mode::kLat) p.slots = std::max<uint32_t>(p.slots, 256);
  return o;
}

// Forks; the parent waits for the child and returns false, the child
// returns true and serves exactly one client.
bool serve_in_child() {
  fflush(stdout);
  fflush(stderr);
  const pid_t child = fork();
  if (child < 0) die(1, "fork: %s", strerror(errno));
  if (child == 0) return true;
  int st = 0;
  while (waitpid(child, &st, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(st) && WEXITSTATUS(st) != 0)
    fprintf(stderr,
            "urnic-perf: a client's session ended with status %d; serving "
            "the next client\n",
            WEXITSTATUS(st));
  else if (WIFSIGNALED(st))
    fprintf(stderr,
            "urnic-perf: a client's session ended by signal %d; serving "
            "the next client\n",
            WTERMSIG(st));
  return false;
}

}  // namespace
}  // namespace urnic::perf

int main(int argc, char** argv) {
  using namespace urnic::perf;
  Options o = parse(argc, argv);
  Run r;
  r.o = o;
  r.corrupt = getenv("URNIC_PERF_CORRUPT") && !o.server;
  uint64_t mem[3] = {rss_kib(), 0, 0};
  do {
    Channel ch;
    std::string err;
    if (o.server) {
      if (!ch.listen_accept(o.port, err)) die(1, "%s", err.c_str());
      // --loop: each client is served by a child process, so whatever ends
      // one session (the client killed, a failed QP, a protocol error) ends
      // only that one; the next client is served after it.
      if (o.loop) {
        if (!serve_in_child()) continue;
        o.loop = false;  // the child: this client, then exit
      }
      if (!ch.recv_all(&r.o.p, sizeof r.o.p) || r.o.p.magic != Params{}.magic)
        die(1, "the client sent no valid parameters");
    } else {
      if (!ch.connect_to(o.host, o.port, err)) die(1, "%s", err.c_str());
    }
    setup(r);
    mem[1] = rss_kib();
    if (!o.server && !ch.send_all(&r.o.p, sizeof r.o.p)) peer_lost();
    // READ sources and atomic counters hold known values before anyone
    // connects.
    for (auto& q : r.qps)
      for (uint64_t s = 0; s < r.o.p.slots; ++s) {
        if (r.o.p.op == Op::kRead && r.o.p.verify)
          fill(slot(r, *q, s), slot_bytes(r), q->index, s);
      }
    for (auto& q : r.qps)
      if (uses_recv(r.o.p.op))
        for (uint32_t k = 0; k < r.recv_depth; ++k)
          if (!post_recv(r, *q)) die(1, "%s", r.fail_msg.c_str());
    std::vector<QpWire> mine = my_wire(r), peer(r.qps.size());
    if (!ch.send_all(mine.data(), mine.size() * sizeof(QpWire)) ||
        !ch.recv_all(peer.data(), peer.size() * sizeof(QpWire)))
      peer_lost();
    connect_qps(r, peer);
    // Both sides in RTS before the first message.
    CtlMsg ready{Msg::kBegin, UINT32_MAX};
    if (!ch.send_msg(ready) || !ch.recv_msg(ready)) peer_lost();
    mem[2] = rss_kib();
    int rc = 0;
    if (r.o.p.hold_s) {
      printf("urnic-perf: %u QPs up; RSS %" PRIu64 " KiB at start, %" PRIu64
             " KiB with the device open, %" PRIu64 " KiB with the QPs\n",
             r.o.p.qps, mem[0], mem[1], mem[2]);
      fflush(stdout);
      if (!o.server) {
        sleep(r.o.p.hold_s);
        ch.send_msg({Msg::kBye, 0});
        if (!o.json_path.empty()) {
          const std::string js = to_json(r, {}, nullptr, mem);
          FILE* f =
              o.json_path == "-" ? stdout : fopen(o.json_path.c_str(), "w");
          if (f) {
            fputs(js.c_str(), f);
            if (f != stdout) fclose(f);
          }
        }
      } else {
        CtlMsg m;
        ch.recv_msg(m);  // kBye or the client is gone: both end the hold
      }
    } else {
      rc = o.server ? run_server(r, ch) : run_client(r, ch);
    }
    for (auto& q : r.qps) ibv_destroy_qp(q->qp);
    r.qps.clear();
    for (ibv_cq* cq : r.cqs) ibv_destroy_cq(cq);
    r.cqs.clear();
    for (ibv_comp_channel* cc : r.channels) ibv_destroy_comp_channel(cc);
    r.channels.clear();
    ibv_dereg_mr(r.mr);
    ibv_dealloc_pd(r.pd);
    ibv_close_device(r.ctx);
    free(r.buf);
    r.by_thread.clear();
    r.o = o;
    if (rc) return rc;
  } while (o.server && o.loop);
  return 0;
}
