// NetFR's context array (seed 002): every posted work request that will
// complete owns one context for its lifetime, and the 64-bit wr_id names
// it. NetFR puts a pointer there; this table hands out indices instead, so
// a completion's wr_id is bounds-checked before it is used.
#pragma once

#include <cstdint>
#include <vector>

#include "perf/seeds_common.h"

namespace netfr {

template <typename Ctx>
class ContextTable {
 public:
  explicit ContextTable(uint32_t capacity) : ctx_(capacity), free_(capacity) {
    for (uint32_t i = 0; i < capacity; ++i) free_[i] = capacity - 1 - i;
  }

  // A free context and its wr_id; exits if none is left (a sizing bug).
  uint64_t acquire(const Ctx& c) {
    if (free_.empty()) seeds::die(seeds::kSetup, "context table full");
    const uint32_t i = free_.back();
    free_.pop_back();  // no reallocation: capacity never grows
    ctx_[i] = c;
    return i;
  }

  Ctx& at(uint64_t wr_id) {
    if (wr_id >= ctx_.size())
      seeds::die(seeds::kCompletion, "completion with unknown wr_id %llu",
                 static_cast<unsigned long long>(wr_id));
    return ctx_[wr_id];
  }

  void release(uint64_t wr_id) { free_.push_back(uint32_t(wr_id)); }

 private:
  std::vector<Ctx> ctx_;
  std::vector<uint32_t> free_;
};

}  // namespace netfr
