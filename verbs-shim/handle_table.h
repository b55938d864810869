// The shim's handle -> object tables (QPs, CQs, SRQs of one context): what
// async events, completion channels and close look objects up by. An open
// addressing table of object pointers, keyed by the `handle` field the shim
// keeps in each object (not the copy in the application's ibv_* struct,
// which the application can write). 8 bytes a slot at a load of 3/8..3/4:
// at 16384 QPs 32768 slots, 256 KiB (16 B per QP), where
// std::unordered_map took ~40 B per entry (a node and a bucket). It grows,
// never shrinks: what a peak of objects needed stays until the context
// closes. Linear probing with backward-shift deletion, so no tombstones;
// callers lock (Context::obj_mu).
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

namespace urnic::shim {

template <class T>
class HandleTable {
 public:
  T* find(uint32_t h) const {
    if (!size_) return nullptr;
    for (size_t i = slot(h);; i = (i + 1) & mask_) {
      T* o = slots_[i];
      if (!o) return nullptr;
      if (o->handle == h) return o;
    }
  }

  // 0, or (nothing changed) EEXIST if an object with that handle is in it,
  // ENOMEM if the table could not grow.
  int insert(T* obj) {
    if (find(obj->handle)) return EEXIST;
    if ((size_ + 1) * 4 > cap() * 3 && !grow()) return ENOMEM;
    size_t i = slot(obj->handle);
    while (slots_[i]) i = (i + 1) & mask_;
    slots_[i] = obj;
    ++size_;
    return 0;
  }

  // The object removed, or nullptr if there was none.
  T* erase(uint32_t h) {
    if (!size_) return nullptr;
    size_t i = slot(h);
    for (; slots_[i]; i = (i + 1) & mask_)
      if (slots_[i]->handle == h) break;
    T* const gone = slots_[i];
    if (!gone) return nullptr;
    // Backward shift: pull later members of the probe run into the hole
    // unless their home slot lies cyclically in (hole, j].
    for (size_t j = (i + 1) & mask_; slots_[j]; j = (j + 1) & mask_) {
      const size_t home = slot(slots_[j]->handle);
      if (((j - home) & mask_) >= ((j - i) & mask_)) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = nullptr;
    --size_;
    return gone;
  }

  template <class F>
  void for_each(F&& f) const {
    for (size_t i = 0; size_ && i <= mask_; ++i)
      if (slots_[i]) f(slots_[i]);
  }
  void clear() {
    slots_.reset();
    mask_ = 0;
    size_ = 0;
  }
  size_t size() const { return size_; }

 private:
  size_t cap() const { return slots_ ? mask_ + 1 : 0; }
  // Fibonacci hashing: handles are consecutive numbers, spread them.
  size_t slot(uint32_t h) const {
    return static_cast<size_t>((uint64_t{h} * 0x9e3779b97f4a7c15ull) >> 32) &
           mask_;
  }
  bool grow() {
    const size_t n = cap() ? cap() * 2 : 16;
    std::unique_ptr<T*[]> s(new (std::nothrow) T*[n]());
    if (!s) return false;
    const size_t old_cap = cap();
    std::unique_ptr<T*[]> old = std::move(slots_);
    slots_ = std::move(s);
    mask_ = n - 1;
    for (size_t i = 0; i < old_cap; ++i) {
      if (!old[i]) continue;
      size_t j = slot(old[i]->handle);
      while (slots_[j]) j = (j + 1) & mask_;
      slots_[j] = old[i];
    }
    return true;
  }

  std::unique_ptr<T*[]> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace urnic::shim
