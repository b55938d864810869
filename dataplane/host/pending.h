// Bounded per-lcore queue of packets waiting for neighbour resolution. The
// owning lcore polls it each loop; a packet leaves when its address
// resolves (sent), when resolution fails (dropped), or never enters when the
// queue is full (dropped by the caller). Storage is fixed at construction.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>

#include "dataplane/host/neighbour.h"

namespace urnic::host {

template <typename Handle>
class PendingQueue {
 public:
  explicit PendingQueue(uint32_t cap) : cap_(cap), q_(new Item[cap]) {}

  uint32_t size() const { return n_; }
  bool push(Handle h, const uint8_t gid[16]) {
    if (n_ == cap_) return false;
    Item& it = q_[(head_ + n_) % cap_];
    it.h = h;
    std::memcpy(it.gid, gid, 16);
    ++n_;
    return true;
  }

  // send(h, mac): resolved; drop(h): failed; request(gid): (re)send the
  // ARP/NS now. Each queued packet is looked at once per call.
  template <typename Send, typename Drop, typename Request>
  void poll(NeighbourTable& nt, uint64_t now, Send&& send, Drop&& drop,
            Request&& request) {
    for (uint32_t k = n_; k > 0; --k) {
      Item it = q_[head_];
      head_ = (head_ + 1) % cap_;
      --n_;
      wire::MacAddr mac;
      switch (nt.lookup(it.gid, now, mac)) {
        case Lookup::kHit:
          send(it.h, mac);
          break;
        case Lookup::kFailed:
          drop(it.h);
          break;
        case Lookup::kPending:
          if (nt.start(it.gid, now)) request(it.gid);
          q_[(head_ + n_) % cap_] = it;
          ++n_;
          break;
      }
    }
  }

  template <typename Drop>
  void clear(Drop&& drop) {
    for (; n_ > 0; --n_, head_ = (head_ + 1) % cap_) drop(q_[head_].h);
  }

 private:
  struct Item {
    Handle h{};
    uint8_t gid[16] = {};
  };
  uint32_t cap_;
  uint32_t head_ = 0;
  uint32_t n_ = 0;
  std::unique_ptr<Item[]> q_;
};

}  // namespace urnic::host
