// rte_dev_dma_map/unmap are still experimental in DPDK 22.11 (the only way
// to DMA-map external memory for a device independently of its bus).
#define ALLOW_EXPERIMENTAL_API 1

#include "dataplane/service/zero_copy.h"

#include <rte_dev.h>
#include <rte_errno.h>
#include <rte_memory.h>

#include <algorithm>

namespace urnic::service {

namespace {

constexpr size_t kPage = 4096;  // views are whole 4 KiB pages (op_reg_mr)

void no_free(void*, void*) {}  // the memory belongs to the application

template <class V>
V* find_base(std::vector<V>& v, const void* base, size_t* at) {
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i].base == base) return *at = i, &v[i];
  return nullptr;
}

}  // namespace

int PciDmaMapper::map(void* base, size_t len) {
  // IOVAs unknown to EAL (nullptr): with IOVA as VA the IOVA is the address.
  if (rte_extmem_register(base, len, nullptr, 0, kPage) != 0) return rte_errno;
  if (rte_dev_dma_map(dev_, base, reinterpret_cast<uintptr_t>(base), len) !=
      0) {
    const int e = rte_errno;
    rte_extmem_unregister(base, len);
    return e ? e : EIO;
  }
  return 0;
}

void PciDmaMapper::unmap(void* base, size_t len) {
  // Failures are not actionable here (the device may be closed at exit).
  rte_dev_dma_unmap(dev_, base, reinterpret_cast<uintptr_t>(base), len);
  rte_extmem_unregister(base, len);
}

DmaThread::DmaThread(DmaMapper& m) : m_(m), t_([this] { run(); }) {}

DmaThread::~DmaThread() {
  {
    std::lock_guard g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  t_.join();
}

std::future<int> DmaThread::map(void* base, size_t len) {
  std::lock_guard g(mu_);
  q_.push_back({true, base, len, {}});
  std::future<int> f = q_.back().done.get_future();
  cv_.notify_all();
  return f;
}

void DmaThread::unmap(void* base, size_t len) {
  std::lock_guard g(mu_);
  q_.push_back({false, base, len, {}});
  cv_.notify_all();
}

void DmaThread::drain() {
  std::unique_lock l(mu_);
  idle_.wait(l, [&] { return q_.empty() && !running_; });
}

void DmaThread::run() {
  std::unique_lock l(mu_);
  for (;;) {
    cv_.wait(l, [&] { return stop_ || !q_.empty(); });
    if (q_.empty()) return;  // stop_, and nothing left to run
    Job j = std::move(q_.front());
    q_.pop_front();
    running_ = true;
    l.unlock();
    if (j.map) {
      j.done.set_value(m_.map(j.base, j.len));
    } else {
      m_.unmap(j.base, j.len);
    }
    l.lock();
    running_ = false;
    if (q_.empty()) idle_.notify_all();
  }
}

ZeroCopyTx::ZeroCopyTx(std::unique_ptr<DmaMapper> dma) : dma_(std::move(dma)) {
  if (dma_) dma_thread_ = std::make_unique<DmaThread>(*dma_);
}

ZeroCopyTx::~ZeroCopyTx() {
  for (View& v : views_) release(v);
  for (View& v : mapped_) release(v);
  for (View& v : retired_) release(v);
}

void ZeroCopyTx::release(View& v) {
  if (dma_thread_) dma_thread_->unmap(const_cast<uint8_t*>(v.base), v.len);
  delete v.shinfo;
  v.shinfo = nullptr;
}

std::future<int> ZeroCopyTx::map_dma(void* base, size_t len) {
  if (dma_thread_) return dma_thread_->map(base, len);
  std::promise<int> none;  // nothing to map
  none.set_value(0);
  return none.get_future();
}

bool ZeroCopyTx::map(void* base, size_t len, int dma_error) {
  if (dma_error) {
    ++map_failures_;
    last_error_ = dma_error;
    return false;  // this memory is copied
  }
  auto* si = new rte_mbuf_ext_shared_info{};
  si->free_cb = no_free;
  rte_mbuf_ext_refcnt_set(si, kTableRefs);
  mapped_.push_back({static_cast<const uint8_t*>(base), len, si});
  return true;
}

void ZeroCopyTx::add(void* base, size_t len) {
  size_t i;
  View* m = find_base(mapped_, base, &i);
  if (!m || m->len != len) return;  // not mapped: copied
  const View v = *m;
  mapped_.erase(mapped_.begin() + static_cast<ptrdiff_t>(i));
  views_.insert(std::upper_bound(views_.begin(), views_.end(), v,
                                 [](const View& a, const View& b) {
                                   return a.base < b.base;
                                 }),
                v);
}

void ZeroCopyTx::remove(void* base) {
  size_t i;
  for (std::vector<View>* from : {&views_, &mapped_}) {
    if (!find_base(*from, base, &i)) continue;
    retired_.push_back((*from)[i]);
    from->erase(from->begin() + static_cast<ptrdiff_t>(i));
    return;
  }
}

bool ZeroCopyTx::busy(void* base) {
  size_t i;
  View* v = find_base(retired_, base, &i);
  if (!v) return false;
  if (rte_mbuf_ext_refcnt_read(v->shinfo) > kTableRefs) return true;
  release(*v);  // nothing can take a new reference: it is out of views_
  retired_.erase(retired_.begin() + static_cast<ptrdiff_t>(i));
  return false;
}

const ZeroCopyTx::View* ZeroCopyTx::find(const uint8_t* p, uint32_t len) const {
  // Views do not overlap (each is its own mapping): the candidate is the
  // last one starting at or below p.
  auto it = std::upper_bound(
      views_.begin(), views_.end(), p,
      [](const uint8_t* x, const View& v) { return x < v.base; });
  if (it == views_.begin()) return nullptr;
  --it;
  const size_t off = static_cast<size_t>(p - it->base);
  return off < it->len && len <= it->len - off ? &*it : nullptr;
}

}  // namespace urnic::service
