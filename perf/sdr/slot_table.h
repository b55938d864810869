// The receiver's message table (seed 001): one root MR cut into slots of
// `stride` bytes, message id = slot index. Per slot, the backend bitmap
// (chunks whose WRITE_WITH_IMM completed; written by the backend stage)
// and the frontend bitmap (chunks already reported to the application;
// written by the frontend stage), and a queue of slots the backend touched
// since the frontend last looked. One thread runs both stages, so these
// are plain words; split over two threads they would become atomics.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <vector>

namespace sdr {

class SlotTable {
 public:
  struct Slot {
    uint32_t use = 0;       // messages completed in this slot so far
    uint32_t received = 0;  // bits set in the backend bitmap
    uint32_t reported = 0;  // bits set in the frontend bitmap
    uint32_t dirty_lo = ~0u, dirty_hi = 0;  // backend words changed
    bool touched = false;                   // in the frontend's queue
    bool due = false;        // the sender said every chunk is out
    bool round_end = false;  // the end-of-round marker arrived
    uint64_t last_ns = 0;    // last chunk or "sent" notice
  };

  SlotTable(uint8_t* base, uint32_t slots, uint32_t stride, uint32_t nchunks)
      : base_(base),
        stride_(stride),
        nchunks_(nchunks),
        words_((nchunks + 63) / 64),
        slots_(slots),
        backend_(size_t{slots} * words_),
        frontend_(size_t{slots} * words_),
        touched_(slots) {}

  uint32_t size() const { return uint32_t(slots_.size()); }
  uint32_t words() const { return words_; }
  Slot& slot(uint32_t s) { return slots_[s]; }
  uint8_t* message(uint32_t s) { return base_ + size_t{s} * stride_; }
  const uint64_t* backend(uint32_t s) const {
    return &backend_[size_t{s} * words_];
  }

  // Backend: chunk c of slot s arrived. False when it had already.
  bool mark(uint32_t s, uint32_t c) {
    uint64_t& w = backend_[size_t{s} * words_ + c / 64];
    const uint64_t bit = uint64_t{1} << (c % 64);
    if (w & bit) return false;
    w |= bit;
    Slot& sl = slots_[s];
    ++sl.received;
    sl.dirty_lo = std::min(sl.dirty_lo, c / 64);
    sl.dirty_hi = std::max(sl.dirty_hi, c / 64);
    if (!sl.touched) {
      sl.touched = true;
      touched_[ntouched_++] = s;
    }
    return true;
  }

  // Frontend: calls chunk(s, c) for every chunk the backend marked since
  // the last call, for each touched slot s, then slot_done(s) after.
  template <typename OnChunk, typename OnSlot>
  void drain(OnChunk&& chunk, OnSlot&& slot_done) {
    for (uint32_t i = 0; i < ntouched_; ++i) {
      const uint32_t s = touched_[i];
      Slot& sl = slots_[s];
      uint64_t* be = &backend_[size_t{s} * words_];
      uint64_t* fe = &frontend_[size_t{s} * words_];
      for (uint32_t w = sl.dirty_lo; w <= sl.dirty_hi; ++w) {
        uint64_t fresh = be[w] & ~fe[w];
        fe[w] |= fresh;
        for (; fresh; fresh &= fresh - 1) {
          ++sl.reported;
          chunk(s, w * 64 + uint32_t(std::countr_zero(fresh)));
        }
      }
      sl.dirty_lo = ~0u;
      sl.dirty_hi = 0;
      sl.touched = false;
      slot_done(s);
    }
    ntouched_ = 0;
  }

  // The missing chunks of slot s as a bitmap of words() words.
  void missing(uint32_t s, uint64_t* out) const {
    const uint64_t* be = backend(s);
    for (uint32_t w = 0; w < words_; ++w) out[w] = ~be[w];
    if (nchunks_ % 64) out[words_ - 1] &= (uint64_t{1} << (nchunks_ % 64)) - 1;
  }

  // The message in slot s is complete and handed over: the next use.
  void recycle(uint32_t s) {
    memset(&backend_[size_t{s} * words_], 0, words_ * sizeof(uint64_t));
    memset(&frontend_[size_t{s} * words_], 0, words_ * sizeof(uint64_t));
    Slot& sl = slots_[s];
    const uint32_t use = sl.use + 1;
    sl = Slot{};
    sl.use = use;
  }

 private:
  uint8_t* base_;
  uint32_t stride_, nchunks_, words_;
  std::vector<Slot> slots_;
  std::vector<uint64_t> backend_, frontend_;
  std::vector<uint32_t> touched_;
  uint32_t ntouched_ = 0;
};

}  // namespace sdr
