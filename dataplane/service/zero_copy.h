// Zero-copy transmit: application memory (MR views) that the worker lcores
// chain into frames as external mbuf buffers instead of copying it.
#pragma once

#include <rte_mbuf.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dataplane/service/shim_server.h"

struct rte_device;

namespace urnic::service {

// How a view becomes reachable by the port's DMA engine. Vdev ports need
// nothing (their PMDs copy out of the mbuf on the CPU); a PCI device reads
// the payload itself, so its IOMMU (or the bus) must map the pages first.
class DmaMapper {
 public:
  virtual ~DmaMapper() = default;
  // Any one thread at a time (DmaThread), lcores running (pinning pages is
  // slow). 0 or an errno.
  virtual int map(void* base, size_t len) = 0;
  virtual void unmap(void* base, size_t len) = 0;
};

// A PCI device with IOVA as VA (vfio behind an IOMMU): the view is
// registered as external memory (rte_extmem_register) and DMA-mapped for
// the device at IOVA = its address in urnicd (rte_dev_dma_map), so an
// mbuf's buf_iova is simply the payload's address. Each registration takes
// one of EAL's RTE_MAX_MEMSEG_LISTS memseg lists: past that, views copy.
class PciDmaMapper final : public DmaMapper {
 public:
  explicit PciDmaMapper(rte_device* dev) : dev_(dev) {}
  int map(void* base, size_t len) override;
  void unmap(void* base, size_t len) override;

 private:
  rte_device* dev_;
};

// Every DMA map and unmap of a port, one after the other on a thread of
// their own: pinning is slow, and DPDK's vfio layer holds a spinlock across
// the map ioctl, so an unmap on the control thread would spin until an
// unrelated pinning ended. In order: an unmap of a range goes before a
// later map of the same addresses (a new view may reuse them).
class DmaThread {
 public:
  explicit DmaThread(DmaMapper& m);
  ~DmaThread();  // runs what is queued, then stops
  DmaThread(const DmaThread&) = delete;
  DmaThread& operator=(const DmaThread&) = delete;
  std::future<int> map(void* base, size_t len);
  void unmap(void* base, size_t len);
  void drain();  // returns once everything queued so far has run

 private:
  struct Job {
    bool map;
    void* base;
    size_t len;
    std::promise<int> done;
  };
  void run();
  DmaMapper& m_;
  std::mutex mu_;
  std::condition_variable cv_;    // a job, or stop_
  std::condition_variable idle_;  // the queue ran empty
  std::deque<Job> q_;
  bool running_ = false;  // a job taken off q_ is running
  bool stop_ = false;
  std::thread t_;
};

// The views the lcores may attach: a payload piece inside a view becomes an
// mbuf attached to it as an external buffer. One rte_mbuf_ext_shared_info
// per view counts the mbufs in flight on top of the table's own kTableRefs;
// a removed view is unmapped (DMA, then by the caller) only when that count
// is back to kTableRefs.
//
// Threads: map_dma() and map() on the control thread with the lcores
// running (the DMA mapping itself on the DmaThread); add() and remove()
// while every lcore is parked; find() on the lcores; busy() on the control
// thread (it reads the counts the lcores' frees decrement; a view's DMA
// unmap is queued to the DmaThread).
class ZeroCopyTx final : public TxMemory {
 public:
  // Two, not one: rte_mbuf_ext_refcnt_update takes a non-atomic path when
  // it reads 1 (it assumes a sole owner), and every lcore attaches to the
  // same view; above 1 every update is an atomic add.
  static constexpr uint16_t kTableRefs = 2;
  // The count is 16 bits: past this many mbufs in flight on one view the
  // lcores copy instead of wrapping it.
  static constexpr uint16_t kMaxInFlight = 60000;
  struct View {
    const uint8_t* base;
    size_t len;
    rte_mbuf_ext_shared_info* shinfo;
  };
  // dma: null for ports that need no mapping.
  explicit ZeroCopyTx(std::unique_ptr<DmaMapper> dma = nullptr);
  ~ZeroCopyTx() override;  // unmaps what is left: after the port stopped
  ZeroCopyTx(const ZeroCopyTx&) = delete;
  ZeroCopyTx& operator=(const ZeroCopyTx&) = delete;

  bool dma_is_slow() const override { return dma_ != nullptr; }
  std::future<int> map_dma(void* base, size_t len) override;
  // Waits for the DMA mappings and unmappings queued so far (tests).
  void drain_dma() {
    if (dma_thread_) dma_thread_->drain();
  }
  bool map(void* base, size_t len, int dma_error) override;
  void add(void* base, size_t len) override;
  void remove(void* base) override;
  bool busy(void* base) override;
  // Transport lcore: the view holding [p, p+len), or null.
  const View* find(const uint8_t* p, uint32_t len) const;

  // Control thread, for stats: views the lcores may attach, and views
  // copied because mapping them failed (with the last error).
  size_t views() const { return views_.size(); }
  uint64_t map_failures() const { return map_failures_; }
  int last_map_error() const { return last_error_; }

 private:
  void release(View& v);  // DMA unmap, shared info freed

  std::unique_ptr<DmaMapper> dma_;
  std::unique_ptr<DmaThread> dma_thread_;  // with dma_; goes first
  std::vector<View> views_;    // sorted by base; changed only while parked
  std::vector<View> mapped_;   // map()ped, not yet add()ed
  std::vector<View> retired_;  // removed, maybe still referenced
  uint64_t map_failures_ = 0;
  int last_error_ = 0;
};

}  // namespace urnic::service
