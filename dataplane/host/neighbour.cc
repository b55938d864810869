#include "dataplane/host/neighbour.h"

#include <bit>

#include "dataplane/wire/codec.h"

namespace urnic::host {
namespace {
constexpr uint32_t kMaxProbe = 16;
}

NeighbourTable::NeighbourTable(const NeighbourParams& p)
    : p_(p),
      cap_(std::bit_ceil(std::max<uint32_t>(p.entries, 16))),
      e_(new Entry[cap_]) {}

uint32_t NeighbourTable::slot_of(const uint8_t a[16]) const {
  // FNV-1a over the 16 bytes: spreads IPv4-mapped addresses that differ only
  // in the last byte.
  uint32_t h = 2166136261u;
  for (int i = 0; i < 16; ++i) h = (h ^ a[i]) * 16777619u;
  return h & (cap_ - 1);
}

void NeighbourTable::lock() const {
  while (lock_.exchange(true, std::memory_order_acquire)) {
    while (lock_.load(std::memory_order_relaxed)) {
    }
  }
}
void NeighbourTable::unlock() const {
  lock_.store(false, std::memory_order_release);
}

Lookup NeighbourTable::lookup(const uint8_t a[16], uint64_t now,
                              wire::MacAddr& mac) const {
  if (wire::gid_is_multicast(a)) {  // no ARP or ND for a group
    wire::multicast_mac(a, mac);
    return Lookup::kHit;
  }
  uint32_t s = slot_of(a);
  for (uint32_t i = 0; i < kMaxProbe; ++i, s = (s + 1) & (cap_ - 1)) {
    const Entry& e = e_[s];
    for (;;) {
      const uint32_t seq0 = e.seq.load(std::memory_order_acquire);
      if (seq0 & 1) continue;  // writer active: retry
      const uint8_t state = e.state;
      const bool match = std::memcmp(e.addr, a, 16) == 0;
      const wire::MacAddr m = e.mac;
      const uint64_t deadline = e.deadline;
      const uint8_t tries = e.tries;
      std::atomic_thread_fence(std::memory_order_acquire);
      if (e.seq.load(std::memory_order_relaxed) != seq0) continue;
      if (state == kEmpty) return Lookup::kPending;
      if (!match) break;
      if (state == kReachable && now < deadline) {
        mac = m;
        return Lookup::kHit;
      }
      if (state == kIncomplete && tries >= p_.retries && now >= deadline)
        return Lookup::kFailed;
      return Lookup::kPending;
    }
  }
  return Lookup::kPending;
}

NeighbourTable::Entry* NeighbourTable::find_locked(const uint8_t a[16],
                                                   bool create, uint64_t now) {
  uint32_t s = slot_of(a);
  Entry* reuse = nullptr;
  for (uint32_t i = 0; i < kMaxProbe; ++i, s = (s + 1) & (cap_ - 1)) {
    Entry& e = e_[s];
    if (e.state == kEmpty) {
      if (!create) return nullptr;
      return reuse ? reuse : &e;
    }
    if (std::memcmp(e.addr, a, 16) == 0) return &e;
    // An expired mapping or a failed resolution may be taken over; lookups
    // of other keys still probe past it because it stays non-empty.
    const bool stale = (e.state == kReachable && now >= e.deadline) ||
                       (e.state == kIncomplete && e.tries >= p_.retries &&
                        now >= e.deadline + p_.retry_ns);
    if (stale && !reuse) reuse = &e;
  }
  return create ? reuse : nullptr;
}

bool NeighbourTable::start(const uint8_t a[16], uint64_t now, bool* full) {
  if (full) *full = false;
  lock();
  Entry* e = find_locked(a, true, now);
  bool send = false;
  if (!e) {
    if (full) *full = true;
  } else {
    const bool same = e->state != kEmpty && std::memcmp(e->addr, a, 16) == 0;
    const bool live = same && e->state == kReachable && now < e->deadline;
    const bool failed_recently = same && e->state == kIncomplete &&
                                 e->tries >= p_.retries &&
                                 now < e->deadline + p_.retry_ns;
    const bool due = !same || e->state != kIncomplete || now >= e->deadline;
    if (!live && !failed_recently && due) {
      e->seq.fetch_add(1, std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_release);
      if (!same || e->state != kIncomplete || e->tries >= p_.retries)
        e->tries = 0;
      std::memcpy(e->addr, a, 16);
      e->state = kIncomplete;
      e->tries = static_cast<uint8_t>(e->tries + 1);
      e->deadline = now + p_.retry_ns;
      e->seq.fetch_add(1, std::memory_order_release);
      send = true;
    }
  }
  unlock();
  return send;
}

bool NeighbourTable::learn(const uint8_t a[16], const wire::MacAddr& mac,
                           uint64_t now, bool create) {
  lock();
  Entry* e = find_locked(a, create, now);
  const bool ok =
      e && (create || (e->state != kEmpty && std::memcmp(e->addr, a, 16) == 0));
  if (ok) {
    e->seq.fetch_add(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    std::memcpy(e->addr, a, 16);
    e->mac = mac;
    e->state = kReachable;
    e->tries = 0;
    e->deadline = now + p_.reachable_ns;
    e->seq.fetch_add(1, std::memory_order_release);
  }
  unlock();
  return ok;
}

uint32_t NeighbourTable::size() const {
  uint32_t n = 0;
  for (uint32_t i = 0; i < cap_; ++i)
    n += e_[i].state != kEmpty;  // racy snapshot: stats only
  return n;
}

}  // namespace urnic::host
