// ZeroCopyTx: which application memory the lcores may attach to frames,
// and when its DMA mapping may go (dataplane/service/zero_copy.h). No EAL:
// the shared-info reference counts are plain atomics, the DMA mapper a fake.
#include <gtest/gtest.h>

#include <cerrno>
#include <future>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "dataplane/service/zero_copy.h"

namespace urnic::service {
namespace {

struct FakeDma final : DmaMapper {
  struct Log {
    std::vector<std::pair<void*, size_t>> mapped, unmapped;
    std::vector<std::pair<bool, void*>> order;  // (map?, base) as run
    std::vector<std::thread::id> threads;
    int fail = 0;  // errno the next map returns
  };
  explicit FakeDma(Log* log) : log_(log) {}
  int map(void* base, size_t len) override {
    log_->threads.push_back(std::this_thread::get_id());
    log_->order.emplace_back(true, base);
    if (const int e = std::exchange(log_->fail, 0)) return e;
    log_->mapped.emplace_back(base, len);
    return 0;
  }
  void unmap(void* base, size_t len) override {
    log_->threads.push_back(std::this_thread::get_id());
    log_->order.emplace_back(false, base);
    log_->unmapped.emplace_back(base, len);
  }
  Log* log_;
};

alignas(4096) uint8_t mem_a[4 * 4096];
alignas(4096) uint8_t mem_b[2 * 4096];

// What the worker does when it chains a piece: one reference per mbuf (the
// PMD's free drops it: rte_mbuf_ext_refcnt_update(shinfo, -1) below).
void take(const ZeroCopyTx::View* v) {
  rte_mbuf_ext_refcnt_update(v->shinfo, 1);
}

// What ShimServer does: the DMA mapping (possibly on another thread), then
// map() with its result.
bool map_both(ZeroCopyTx& zc, void* base, size_t len) {
  return zc.map(base, len, zc.map_dma(base, len).get());
}

TEST(ZeroCopy, VdevViewsNeedNoMapping) {
  ZeroCopyTx zc;
  EXPECT_TRUE(map_both(zc, mem_a, sizeof mem_a));
  EXPECT_EQ(zc.find(mem_a, 64), nullptr);  // mapped, not yet visible
  zc.add(mem_a, sizeof mem_a);
  const ZeroCopyTx::View* v = zc.find(mem_a + 100, 1000);
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->base, mem_a);
  // Pieces must lie wholly inside one view.
  EXPECT_EQ(zc.find(mem_a + sizeof mem_a - 10, 20), nullptr);
  EXPECT_EQ(zc.find(mem_b, 10), nullptr);
  EXPECT_EQ(zc.views(), 1u);
}

TEST(ZeroCopy, MappedForTheDeviceUntilTheLastMbufIsBack) {
  FakeDma::Log log;
  ZeroCopyTx zc(std::make_unique<FakeDma>(&log));
  ASSERT_TRUE(map_both(zc, mem_a, sizeof mem_a));
  ASSERT_TRUE(map_both(zc, mem_b, sizeof mem_b));
  ASSERT_EQ(log.mapped.size(), 2u);
  zc.add(mem_a, sizeof mem_a);
  zc.add(mem_b, sizeof mem_b);
  const ZeroCopyTx::View* v = zc.find(mem_b + 4096, 4096);
  ASSERT_NE(v, nullptr);
  take(v);
  take(v);
  rte_mbuf_ext_shared_info* si = v->shinfo;
  zc.remove(mem_b);  // deregistered while two frames are in flight
  EXPECT_EQ(zc.find(mem_b + 4096, 4096), nullptr);
  EXPECT_TRUE(zc.busy(mem_b));
  zc.drain_dma();
  EXPECT_TRUE(log.unmapped.empty());
  rte_mbuf_ext_refcnt_update(si, -1);
  EXPECT_TRUE(zc.busy(mem_b));
  rte_mbuf_ext_refcnt_update(si, -1);  // the PMD freed the last one
  EXPECT_FALSE(zc.busy(mem_b));
  zc.drain_dma();
  ASSERT_EQ(log.unmapped.size(), 1u);
  EXPECT_EQ(log.unmapped[0].first, mem_b);
  EXPECT_EQ(log.unmapped[0].second, sizeof mem_b);
  EXPECT_FALSE(zc.busy(mem_b));  // gone: nothing to wait for
  // The other view is untouched.
  EXPECT_NE(zc.find(mem_a, 4096), nullptr);
}

// The DMA work runs on the DmaThread, never on the caller's, in the order
// it was queued: a view's unmap before a new view's map at the same
// addresses.
TEST(ZeroCopy, DmaWorkRunsOnItsOwnThreadInOrder) {
  FakeDma::Log log;
  ZeroCopyTx zc(std::make_unique<FakeDma>(&log));
  ASSERT_TRUE(map_both(zc, mem_a, sizeof mem_a));
  zc.add(mem_a, sizeof mem_a);
  zc.remove(mem_a);
  EXPECT_FALSE(zc.busy(mem_a));  // released: its unmap queued
  std::future<int> again = zc.map_dma(mem_a, sizeof mem_a);
  EXPECT_EQ(again.get(), 0);
  ASSERT_TRUE(zc.map(mem_a, sizeof mem_a, 0));
  zc.drain_dma();
  ASSERT_EQ(log.order.size(), 3u);
  EXPECT_EQ(log.order[0], std::make_pair(true, static_cast<void*>(mem_a)));
  EXPECT_EQ(log.order[1], std::make_pair(false, static_cast<void*>(mem_a)));
  EXPECT_EQ(log.order[2], std::make_pair(true, static_cast<void*>(mem_a)));
  for (std::thread::id t : log.threads)
    EXPECT_NE(t, std::this_thread::get_id());
}

TEST(ZeroCopy, MappingFailureMeansCopy) {
  FakeDma::Log log;
  ZeroCopyTx zc(std::make_unique<FakeDma>(&log));
  log.fail = ENOSPC;  // e.g. EAL out of memseg lists
  EXPECT_FALSE(map_both(zc, mem_a, sizeof mem_a));
  zc.add(mem_a, sizeof mem_a);  // the caller does not add it; harmless
  EXPECT_EQ(zc.find(mem_a, 64), nullptr);
  EXPECT_EQ(zc.map_failures(), 1u);
  EXPECT_EQ(zc.last_map_error(), ENOSPC);
  zc.drain_dma();
  EXPECT_TRUE(log.unmapped.empty());
  EXPECT_FALSE(zc.busy(mem_a));
}

TEST(ZeroCopy, RegistrationFailureUnmapsWhatWasNeverAdded) {
  FakeDma::Log log;
  ZeroCopyTx zc(std::make_unique<FakeDma>(&log));
  ASSERT_TRUE(map_both(zc, mem_a, sizeof mem_a));
  zc.remove(mem_a);  // reg_mr failed after map (op_reg_mr)
  EXPECT_FALSE(zc.busy(mem_a));
  zc.drain_dma();
  ASSERT_EQ(log.unmapped.size(), 1u);
  zc.add(mem_a, sizeof mem_a);  // too late: not mapped any more
  EXPECT_EQ(zc.find(mem_a, 64), nullptr);
}

TEST(ZeroCopy, TeardownUnmapsEverything) {
  FakeDma::Log log;
  {
    ZeroCopyTx zc(std::make_unique<FakeDma>(&log));
    ASSERT_TRUE(map_both(zc, mem_a, sizeof mem_a));
    ASSERT_TRUE(map_both(zc, mem_b, sizeof mem_b));
    zc.add(mem_a, sizeof mem_a);
    const ZeroCopyTx::View* v = zc.find(mem_a, 64);
    ASSERT_NE(v, nullptr);
    take(v);  // still referenced: the port stopped (it freed nothing yet)
    zc.remove(mem_a);
    EXPECT_TRUE(zc.busy(mem_a));
  }
  EXPECT_EQ(log.unmapped.size(), 2u);
}

// Lcores attach to one view at once: with the table holding a single
// reference, rte_mbuf_ext_refcnt_update's sole-owner path (read 1, store 2)
// lost references and the count ended below the table's.
TEST(ZeroCopy, ConcurrentAttachAndFreeKeepTheCount) {
  ZeroCopyTx zc;
  ASSERT_TRUE(map_both(zc, mem_a, sizeof mem_a));
  zc.add(mem_a, sizeof mem_a);
  const ZeroCopyTx::View* v = zc.find(mem_a, 64);
  ASSERT_NE(v, nullptr);
  auto churn = [v] {
    for (int i = 0; i < 200000; ++i) {
      take(v);
      rte_mbuf_ext_refcnt_update(v->shinfo, -1);
    }
  };
  std::thread t1(churn), t2(churn), t3(churn);
  t1.join();
  t2.join();
  t3.join();
  EXPECT_EQ(rte_mbuf_ext_refcnt_read(v->shinfo), ZeroCopyTx::kTableRefs);
  zc.remove(mem_a);
  EXPECT_FALSE(zc.busy(mem_a));
}

TEST(ZeroCopy, ManyViewsFoundByAddress) {
  alignas(4096) static uint8_t pool[64 * 4096];
  ZeroCopyTx zc;
  // Every other page a view, added in reverse order.
  for (int i = 31; i >= 0; --i) {
    uint8_t* p = pool + 2 * i * 4096;
    ASSERT_TRUE(map_both(zc, p, 4096));
    zc.add(p, 4096);
  }
  for (int i = 0; i < 32; ++i) {
    const ZeroCopyTx::View* v = zc.find(pool + 2 * i * 4096 + 10, 100);
    ASSERT_NE(v, nullptr);
    EXPECT_EQ(v->base, pool + 2 * i * 4096);
    EXPECT_EQ(zc.find(pool + (2 * i + 1) * 4096 + 10, 100), nullptr);
  }
}

}  // namespace
}  // namespace urnic::service
