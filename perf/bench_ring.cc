// Ring microbenchmarks: DPDK rte_ring as urnicd uses it (command ring
// SP/SC, RoCE hand-off ring MP/SC) and the verbs shim's shared send queue
// with its doorbell page (dataplane/hostif/abi.h), producer and consumer in one
// thread (cross-core variants gave no stable numbers on the shared 2-vCPU
// VM and were dropped). The shim ring is driven with abi.h's own types and
// ring_doorbell(); the consumer side repeats the steps of
// ShimServer::doorbells_st and drain_qp_st (pending -> summary -> bits
// exchanges, acquire load of the producer index, copy the WQE out, release
// store of the done index) without the verbs layer, so the numbers are the
// ring's cost.
#include <benchmark/benchmark.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ring.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "dataplane/hostif/abi.h"

namespace {

rte_ring* make_ring(const char* name, unsigned flags, unsigned size = 4096) {
  rte_ring* r = rte_ring_create(name, size, SOCKET_ID_ANY, flags);
  if (!r) {
    fprintf(stderr, "rte_ring_create(%s): %s\n", name, rte_strerror(rte_errno));
    abort();
  }
  return r;
}

// One thread: enqueue a burst, dequeue it. ns per element.
void BM_RteRingSameThread(benchmark::State& st) {
  const unsigned burst = static_cast<unsigned>(st.range(0));
  const bool mp = st.range(1) != 0;
  static int id = 0;
  const std::string name = "bench_st_" + std::to_string(id++);
  rte_ring* r =
      make_ring(name.c_str(), (mp ? 0 : RING_F_SP_ENQ) | RING_F_SC_DEQ);
  void* objs[64];
  for (unsigned i = 0; i < 64; ++i) objs[i] = &objs[i];
  void* out[64];
  for (auto _ : st) {
    if (burst == 1) {
      rte_ring_enqueue(r, objs[0]);
      rte_ring_dequeue(r, out);
    } else {
      rte_ring_enqueue_burst(r, objs, burst, nullptr);
      rte_ring_dequeue_burst(r, out, burst, nullptr);
    }
    benchmark::DoNotOptimize(out[0]);
  }
  st.SetItemsProcessed(static_cast<int64_t>(st.iterations()) * burst);
  st.SetLabel(mp ? "MP/SC" : "SP/SC");
  rte_ring_free(r);
}
BENCHMARK(BM_RteRingSameThread)
    ->Args({1, 0})
    ->Args({8, 0})
    ->Args({32, 0})
    ->Args({32, 1});

// The shim's send queue: one QP's ring in "shared memory" plus a doorbell
// page, as dataplane/hostif/abi.h lays them out.
struct ShimQueue {
  static constexpr uint32_t kSlots = 256;
  urnic::shim::QpShared sh;
  std::unique_ptr<urnic::shim::ShmSendWqe[]> sq{
      new urnic::shim::ShmSendWqe[kSlots]()};
  std::unique_ptr<urnic::shim::DoorbellPage> db{
      new urnic::shim::DoorbellPage()};
  uint32_t doorbell = 5;
  uint32_t prod = 0;  // the application's copy
  uint32_t seen = 0;  // the service's copy

  // The application: verbs-shim/datapath.cc post_send: room check against
  // sq_done, WQE into the slot, release store of sq_prod, ring_doorbell.
  bool post(const urnic::shim::ShmSendWqe& w) {
    if (prod - sh.sq_done.load(std::memory_order_acquire) >= kSlots)
      return false;
    sq[prod & (kSlots - 1)] = w;
    ++prod;
    sh.sq_prod.store(prod, std::memory_order_release);
    urnic::shim::ring_doorbell(*db, doorbell);
    return true;
  }
  // The service: ShimServer::doorbells_st + drain_qp_st, minus the engine.
  uint32_t serve(urnic::shim::ShmSendWqe& out) {
    urnic::shim::DoorbellPage& d = *db;
    constexpr uint32_t kMine = ~0u;  // one lcore: every summary word
    if (!(d.pending.load(std::memory_order_relaxed) & kMine)) return 0;
    uint32_t words = d.pending.fetch_and(~kMine, std::memory_order_acquire);
    uint32_t taken = 0;
    while (words) {
      const uint32_t s = static_cast<uint32_t>(std::countr_zero(words));
      words &= words - 1;
      uint64_t sum = d.summary[s].exchange(0, std::memory_order_acquire);
      while (sum) {
        const uint32_t w = s * 64 + std::countr_zero(sum);
        sum &= sum - 1;
        uint64_t bits = d.bits[w].exchange(0, std::memory_order_acquire);
        while (bits) {
          bits &= bits - 1;
          const uint32_t p = sh.sq_prod.load(std::memory_order_acquire);
          // As drain_qp_st: the head, then as many SGEs as it says.
          for (; seen != p; ++seen, ++taken) {
            const urnic::shim::ShmSendWqe& slot = sq[seen & (kSlots - 1)];
            std::memcpy(&out, &slot, offsetof(urnic::shim::ShmSendWqe, sge));
            if (out.num_sge <= urnic::shim::kMaxSge)
              std::memcpy(out.sge, slot.sge,
                          out.num_sge * sizeof(urnic::shim::ShmSge));
          }
          // The engine retires at completion; here at once.
          sh.sq_done.store(seen, std::memory_order_release);
        }
      }
    }
    return taken;
  }
};

void BM_ShimSqSameThread(benchmark::State& st) {
  auto q = std::make_unique<ShimQueue>();
  urnic::shim::ShmSendWqe w{}, out{};
  w.opcode = IBV_WR_RDMA_WRITE;
  w.num_sge = 1;
  for (auto _ : st) {
    q->post(w);
    benchmark::DoNotOptimize(q->serve(out));
  }
  st.SetItemsProcessed(static_cast<int64_t>(st.iterations()));
  st.SetLabel(std::to_string(sizeof w) + " B WQE + doorbell");
}
BENCHMARK(BM_ShimSqSameThread);

}  // namespace

int main(int argc, char** argv) {
  const std::string prefix = "bench-ring-" + std::to_string(getpid());
  std::vector<std::string> eal = {
      argv[0],          "--no-huge",     "-m",   "128",         "--no-pci",
      "--no-telemetry", "--file-prefix", prefix, "--log-level", "error"};
  std::vector<char*> ev;
  for (std::string& s : eal) ev.push_back(s.data());
  if (rte_eal_init(static_cast<int>(ev.size()), ev.data()) < 0) {
    fprintf(stderr, "rte_eal_init: %s\n", rte_strerror(rte_errno));
    return 1;
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  rte_eal_cleanup();
  return 0;
}
