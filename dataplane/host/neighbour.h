// Neighbour cache shared by the lcores of one port: IPv4 (as IPv4-mapped
// GIDs, resolved by ARP) and IPv6 (resolved by ND) in one fixed-size,
// open-addressed table allocated at start-up. Lookups are lock-free (a
// seqlock per entry); updates, rare, take one spinlock, never sleep.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>

#include "dataplane/wire/headers.h"

namespace urnic::host {

struct NeighbourParams {
  uint32_t entries = 1024;
  uint64_t reachable_ns = 300'000'000'000;  // a learned MAC's lifetime
  uint64_t retry_ns = 1'000'000'000;        // between requests
  uint32_t retries = 3;                     // requests before giving up
};

enum class Lookup : uint8_t {
  kHit,      // mac is valid
  kPending,  // a request is outstanding: queue the packet
  kFailed,   // retries exhausted: drop the packet
};

class NeighbourTable {
 public:
  explicit NeighbourTable(const NeighbourParams& p);

  // Lock-free. Reports kPending for an address never asked about, too; the
  // caller then calls start() to decide whether to send a request.
  Lookup lookup(const uint8_t addr[16], uint64_t now, wire::MacAddr& mac) const;

  // Starts resolution (or a retry) if one is due at `now`. Returns true if
  // the caller must transmit a request now; false if a request is already
  // outstanding and not yet due, or the table is full (*full set).
  bool start(const uint8_t addr[16], uint64_t now, bool* full = nullptr);

  // Records a learned mapping. `create`: add a new entry (we were asked by
  // that host, or we asked it); otherwise only refresh an existing one, so
  // unsolicited replies cannot fill the table.
  bool learn(const uint8_t addr[16], const wire::MacAddr& mac, uint64_t now,
             bool create);

  uint32_t capacity() const { return cap_; }
  uint32_t size() const;  // entries in use (for stats)

 private:
  enum State : uint8_t { kEmpty, kIncomplete, kReachable };
  struct alignas(64) Entry {
    std::atomic<uint32_t> seq{0};  // odd while being written
    uint8_t state = kEmpty;
    uint8_t tries = 0;
    uint8_t addr[16] = {};
    wire::MacAddr mac{};
    uint64_t deadline = 0;  // kReachable: expiry; kIncomplete: next retry
  };
  uint32_t slot_of(const uint8_t addr[16]) const;
  Entry* find_locked(const uint8_t addr[16], bool create, uint64_t now);
  void lock() const;
  void unlock() const;

  NeighbourParams p_;
  uint32_t cap_;  // power of two
  std::unique_ptr<Entry[]> e_;
  mutable std::atomic<bool> lock_{false};
};

}  // namespace urnic::host
