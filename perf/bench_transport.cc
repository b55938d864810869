// Requester -> responder -> completer pipeline of two transport engines
// joined by a lossless in-memory wire (frames copied once, as a NIC's DMA
// would; decoded with ICRC check on arrival). Reports packets/s and ns per
// operation for RC WRITE, SEND and READ at several message sizes, one core
// running both ends. Not a test: run by hand or by perf/run-suite.
#include <benchmark/benchmark.h>
#include <x86intrin.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "dataplane/transport/engine.h"
#include "dataplane/wire/codec.h"
#include "tests/support/engine_host.h"

namespace {

using namespace urnic;
using namespace urnic::transport;

// A fixed ring of frame buffers: no allocation per packet.
class Wire : public PacketIo {
 public:
  explicit Wire(uint32_t slots = 4096) : buf_(slots), len_(slots) {
    for (auto& b : buf_) b.resize(9216);
  }
  bool transmit(const TxFrame& f) override {
    if (tail_ - head_ == buf_.size()) return false;
    len_[tail_ % buf_.size()] = f.copy_to(buf_[tail_ % buf_.size()].data());
    ++tail_;
    return true;
  }
  // Delivers every queued frame to `to`; returns how many.
  uint32_t deliver(Engine& to, uint64_t now) {
    uint32_t n = 0;
    wire::FrameInfo fi;
    while (head_ != tail_) {
      const uint32_t i = head_ % buf_.size();
      wire::decode(buf_[i].data(), len_[i], fi);
      if (fi.kind == wire::FrameKind::kRoce) {
        const wire::ConstBuf seg{buf_[i].data(), len_[i]};
        to.rx(fi, {&seg, 1}, now);
      }
      ++head_;
      ++n;
    }
    return n;
  }

 private:
  std::vector<std::vector<uint8_t>> buf_;
  std::vector<uint32_t> len_;
  uint64_t head_ = 0, tail_ = 0;
};

// A host with its own wire out (test::EngineHost).
struct Host : test::EngineHost {
  Wire out;
  Host(uint8_t id, uint8_t peer, size_t bytes) {
    if (init(id, peer, bytes, out)) std::abort();
  }
};

void connect(Host& h, Qp* qp, uint32_t peer_qpn, uint8_t peer_id) {
  test::QpPath p;
  p.peer_qpn = peer_qpn;
  test::EngineHost::gid(peer_id, p.peer_gid);
  if (test::bring_up(*h.eng, qp, p)) std::abort();
}

struct Pair {
  Host a{1, 2, 1 << 22}, b{2, 1, 1 << 22};
  Qp* qa = nullptr;
  Qp* qb = nullptr;
  uint64_t now = 0;
  Pair() {
    QpInitAttr ia;
    ia.pd = a.pd;
    ia.send_cq = ia.recv_cq = a.cq;
    ia.cap = {1024, 1024, 1, 1, 0};
    a.eng->create_qp(ia, &qa);
    QpInitAttr ib;
    ib.pd = b.pd;
    ib.send_cq = ib.recv_cq = b.cq;
    ib.cap = {1024, 1024, 1, 1, 0};
    b.eng->create_qp(ib, &qb);
    connect(a, qa, qb->qpn(), 2);
    connect(b, qb, qa->qpn(), 1);
  }
  // Runs both engines until `n` completions arrived at A (and B's receives
  // at B when `recv`). Returns packets moved.
  uint64_t pump(uint32_t want_a, uint32_t want_b) {
    ibv_wc wc[64];
    uint32_t got_a = 0, got_b = 0;
    uint64_t pkts = 0;
    while (got_a < want_a || got_b < want_b) {
      now += 100;
      a.eng->poll(now);
      pkts += a.out.deliver(*b.eng, now);
      b.eng->poll(now);
      pkts += b.out.deliver(*a.eng, now);
      for (int n; (n = a.cq->poll(wc)) > 0;) {
        for (int i = 0; i < n; ++i)
          if (wc[i].status != IBV_WC_SUCCESS) std::abort();
        got_a += n;
      }
      for (int n; (n = b.cq->poll(wc)) > 0;) {
        for (int i = 0; i < n; ++i)
          if (wc[i].status != IBV_WC_SUCCESS) std::abort();
        got_b += n;
      }
    }
    return pkts;
  }
};

// One batch = `depth` WRs of `size` bytes posted, then pumped to completion.
void run(benchmark::State& st, ibv_wr_opcode op) {
  const uint32_t size = static_cast<uint32_t>(st.range(0));
  const uint32_t depth =
      std::max<uint32_t>(1, std::min<uint32_t>(64, (1u << 21) / (size + 1)));
  Pair p;
  uint64_t pkts = 0, ops = 0;
  for (auto _ : st) {
    for (uint32_t i = 0; i < depth; ++i) {
      if (op == IBV_WR_SEND) {
        RecvWr r;
        r.wr_id = i;
        r.num_sge = 1;
        r.sg_list[0] = {reinterpret_cast<uint64_t>(p.b.mem.data()), size,
                        p.b.mr->lkey()};
        p.b.eng->post_recv(p.qb, r);
      }
      SendWr w;
      w.wr_id = i;
      w.opcode = op;
      w.send_flags = IBV_SEND_SIGNALED;
      w.num_sge = 1;
      w.sg_list[0] = {reinterpret_cast<uint64_t>(p.a.mem.data()) +
                          uint64_t{i} * size % (1u << 21),
                      size, p.a.mr->lkey()};
      w.remote_addr = reinterpret_cast<uint64_t>(p.b.mem.data()) +
                      uint64_t{i} * size % (1u << 21);
      w.rkey = p.b.mr->rkey();
      if (p.a.eng->post_send(p.qa, w)) std::abort();
    }
    pkts += p.pump(depth, op == IBV_WR_SEND ? depth : 0);
    ops += depth;
  }
  st.counters["pkts/s"] = benchmark::Counter(static_cast<double>(pkts),
                                             benchmark::Counter::kIsRate);
  st.counters["ns/op"] = benchmark::Counter(
      static_cast<double>(ops),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  st.counters["Gb/s"] = benchmark::Counter(
      static_cast<double>(ops) * size * 8 / 1e9, benchmark::Counter::kIsRate);
  st.SetItemsProcessed(static_cast<int64_t>(ops));
}

void BM_RcWrite(benchmark::State& st) {
  run(st, IBV_WR_RDMA_WRITE);
}
void BM_RcSend(benchmark::State& st) {
  run(st, IBV_WR_SEND);
}
void BM_RcRead(benchmark::State& st) {
  run(st, IBV_WR_RDMA_READ);
}

// Copies `bytes` from one half of `mem` to the other, `at` moving on: what
// the kernel's copies of each frame (af_packet rings, skbs, veth) do to the
// caches under urnicd on af_packet, where a QP's state and payload are cold
// again at its next turn.
void pollute(std::vector<uint8_t>& mem, size_t& at, size_t bytes) {
  const size_t half = mem.size() / 2;
  while (bytes > 0) {
    const size_t n = std::min({bytes, half - at, size_t{64} << 10});
    std::memcpy(mem.data() + half + at, mem.data() + at, n);
    at = (at + n) % half;
    bytes -= n;
  }
  benchmark::DoNotOptimize(mem.data());
}

// WRITE 64 KiB on each of N QP pairs at once, 1 KiB MTU (a veth's): the
// per-QP cost of each end. The receiving engine's cycles (decode, rx, its
// ACKs) per data packet and the sending engine's (its poll, the ACKs it
// takes) per data packet, measured apart with the TSC. Each QP writes its
// own 64 KiB of the peer's memory, as urnic-perf's QPs do, or (second
// argument 1) all write the same 64 KiB: then the payload stays in the
// cache and what grows with N is the per-QP state alone.
// The third argument, if not 0, is that many bytes copied through 128 MiB
// per packet delivered, between the timed parts (pollute()).
void BM_RcWriteQps(benchmark::State& st) {
  const uint32_t nqp = static_cast<uint32_t>(st.range(0));
  const bool shared = st.range(1) != 0;
  const size_t dirty = static_cast<size_t>(st.range(2));
  // One 128 MiB buffer for every run of the benchmark, made on first use.
  static std::vector<uint8_t> junk;
  if (dirty && junk.empty()) junk.assign(size_t{128} << 20, 1);
  size_t junk_at = 0;
  constexpr uint32_t kSize = 64 << 10;
  Host a{1, 2, size_t{nqp} * kSize}, b{2, 1, size_t{nqp} * kSize};
  std::vector<Qp*> qa(nqp), qb(nqp);
  for (uint32_t i = 0; i < nqp; ++i) {
    QpInitAttr ia;
    ia.pd = a.pd;
    ia.send_cq = ia.recv_cq = a.cq;
    ia.cap = {4, 4, 1, 1, 0};
    QpInitAttr ib = ia;
    ib.pd = b.pd;
    ib.send_cq = ib.recv_cq = b.cq;
    if (a.eng->create_qp(ia, &qa[i]) || b.eng->create_qp(ib, &qb[i]))
      std::abort();
  }
  for (uint32_t i = 0; i < nqp; ++i) {
    test::QpPath p;
    p.mtu = IBV_MTU_1024;
    p.peer_qpn = qb[i]->qpn();
    test::EngineHost::gid(2, p.peer_gid);
    if (test::bring_up(*a.eng, qa[i], p)) std::abort();
    p.peer_qpn = qa[i]->qpn();
    test::EngineHost::gid(1, p.peer_gid);
    if (test::bring_up(*b.eng, qb[i], p)) std::abort();
  }
  uint64_t now = 0, data = 0, rx_cyc = 0, tx_cyc = 0;
  ibv_wc wc[64];
  for (auto _ : st) {
    for (uint32_t i = 0; i < nqp; ++i) {
      SendWr w;
      w.wr_id = i;
      w.opcode = IBV_WR_RDMA_WRITE;
      w.send_flags = IBV_SEND_SIGNALED;
      w.num_sge = 1;
      const uint64_t off = shared ? 0 : uint64_t{i} * kSize;
      w.sg_list[0] = {reinterpret_cast<uint64_t>(a.mem.data()) + off, kSize,
                      a.mr->lkey()};
      w.remote_addr = reinterpret_cast<uint64_t>(b.mem.data()) + off;
      w.rkey = b.mr->rkey();
      if (a.eng->post_send(qa[i], w)) std::abort();
    }
    for (uint32_t done = 0; done < nqp;) {
      now += 100;
      uint64_t t0 = __rdtsc();
      a.eng->poll(now);
      uint64_t t1 = __rdtsc();
      const uint32_t sent = a.out.deliver(*b.eng, now);
      data += sent;
      b.eng->poll(now);
      uint64_t t2 = __rdtsc();
      if (dirty) pollute(junk, junk_at, dirty * sent);
      uint64_t t3 = __rdtsc();
      b.out.deliver(*a.eng, now);
      uint64_t t4 = __rdtsc();
      tx_cyc += (t1 - t0) + (t4 - t3);
      rx_cyc += t2 - t1;
      for (int n; (n = a.cq->poll(wc)) > 0; done += n)
        for (int i = 0; i < n; ++i)
          if (wc[i].status != IBV_WC_SUCCESS) std::abort();
    }
  }
  st.counters["rx_cyc/pkt"] = static_cast<double>(rx_cyc) / data;
  st.counters["tx_cyc/pkt"] = static_cast<double>(tx_cyc) / data;
  st.counters["Gb/s"] = benchmark::Counter(
      static_cast<double>(st.iterations()) * nqp * kSize * 8 / 1e9,
      benchmark::Counter::kIsRate);
}

BENCHMARK(BM_RcWrite)->Arg(64)->Arg(1024)->Arg(4096)->Arg(65536);
BENCHMARK(BM_RcSend)->Arg(64)->Arg(1024)->Arg(4096)->Arg(65536);
BENCHMARK(BM_RcRead)->Arg(64)->Arg(1024)->Arg(4096)->Arg(65536);
BENCHMARK(BM_RcWriteQps)
    ->ArgsProduct({{1, 16, 256, 1024}, {0, 1}, {0}})
    ->ArgsProduct({{1, 256}, {0}, {4096}})
    ->ArgNames({"qps", "shared", "dirty"});

}  // namespace

BENCHMARK_MAIN();
