// Per-lcore hashed timing wheel for the transport engine's timers
// (retransmit, RNR, ...): O(1) arm/cancel, no allocation after construction.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace urnic::transport {

// The links of a circular list; a slot's sentinel head is only this.
struct TimerLink {
  TimerLink* prev = nullptr;
  TimerLink* next = nullptr;
};

// Intrusive: embedded in its owner (a QP has one per timer), so arming never
// allocates. An armed node must be cancelled before its owner is destroyed.
struct TimerNode : TimerLink {
  uint64_t expire_tick = 0;
  void* owner = nullptr;  // set by the owner, passed back untouched
  uint8_t kind = 0;       // set by the owner, passed back untouched

  bool armed() const { return next != nullptr; }
};

// Slot = expire_tick & (slots - 1), each a circular list with a sentinel
// head. A timer more than one revolution away stays in its slot and is
// skipped until its round comes. A bit per slot says it may hold timers, so
// advance() visits only those: after a lcore was off the CPU for
// milliseconds it reads 512 B of bits, not the 64 KiB of 4096 sentinels.
// A slot whose bit is clear has a head never written or left behind: arm()
// links it afresh. So a new wheel writes only its bits, and the sentinels'
// pages stay untouched until timers land there (an engine is made per
// worker, but also per input by the fuzzers and per test).
// Used by one lcore only: not thread-safe.
class TimerWheel {
 public:
  // tick_ns: resolution. slots: rounded up to a power of two. now_ns: start.
  explicit TimerWheel(uint64_t now_ns = 0, uint64_t tick_ns = 1000,
                      uint32_t slots = 4096)
      : tick_ns_(std::max<uint64_t>(tick_ns, 1)),
        mask_(std::bit_ceil(std::max<uint32_t>(slots, 1)) - 1),
        now_tick_(now_ns / tick_ns_),
        // Default-initialised: no write until a slot is first armed.
        slots_(std::make_unique_for_overwrite<TimerLink[]>(mask_ + 1)),
        occupied_((mask_ + 64) / 64) {
    init(due_);
  }
  // Sentinels point to themselves: the wheel cannot be copied or moved.
  TimerWheel(const TimerWheel&) = delete;
  TimerWheel& operator=(const TimerWheel&) = delete;

  // Arms (or re-arms, moving it) `t` to fire at the first advance() with
  // now_ns >= expire_ns rounded up to a tick: never early, less than one tick
  // late. A time in the past fires at the next advance().
  void arm(TimerNode& t, uint64_t expire_ns) {
    expire_ns = expire_ns > stopped_ns_ ? expire_ns - stopped_ns_ : 0;
    if (t.armed()) {
      unlink(t);
    } else {
      ++size_;
    }
    // Round up: a timer may fire up to one tick late, never early.
    t.expire_tick = expire_ns / tick_ns_ + (expire_ns % tick_ns_ != 0);
    // Slots up to now_tick_ have been walked already; a timer due by then
    // waits on due_, which the next advance() fires first.
    if (t.expire_tick <= now_tick_) {
      push_back(due_, t);
    } else {
      const uint64_t slot = t.expire_tick & mask_;
      uint64_t& word = occupied_[slot / 64];
      const uint64_t bit = uint64_t{1} << slot % 64;
      if (!(word & bit)) {
        init(slots_[slot]);
        word |= bit;
      }
      push_back(slots_[slot], t);
    }
  }

  // No-op if not armed.
  void cancel(TimerNode& t) {
    if (!t.armed()) return;
    unlink(t);
    --size_;
  }

  // Fires every armed timer whose expiry (rounded up to a tick) is <= now_ns:
  // unlinks it, then calls fn(TimerNode&). fn may arm or cancel any timer; one
  // it re-arms for a time
  // <= now_ns fires on the next call, not this one. Returns the number fired.
  template <typename Fn>
  uint32_t advance(uint64_t now_ns, Fn&& fn) {
    now_ns = now_ns > stopped_ns_ ? now_ns - stopped_ns_ : 0;
    // A stale now_ns (behind the wheel) must not make the tick count wrap.
    uint64_t cur = std::max(now_ns / tick_ns_, now_tick_);
    uint64_t first = now_tick_ + 1;
    // After a long sleep every slot is due at most once: visiting each slot
    // once is enough, however many revolutions went by.
    uint64_t walk = std::min<uint64_t>(cur - now_tick_, mask_ + 1);
    // Updated before any fn runs, so fn's re-arms for <= now land on due_.
    now_tick_ = cur;
    uint32_t fired = fire(due_, fn);
    // Slots first .. first + walk - 1 (mod slots), in tick order, a bit word
    // at a time. A slot's bit is cleared once a visit leaves it empty (a
    // cancel leaves the bit set: the next visit finds the slot empty).
    uint64_t pos = first & mask_;
    while (walk > 0) {
      const uint64_t bit = pos % 64;
      const uint64_t n = std::min({64 - bit, walk, mask_ + 1 - pos});
      uint64_t& word = occupied_[pos / 64];
      uint64_t bits = word >> bit;
      if (n < 64) bits &= (uint64_t{1} << n) - 1;
      while (bits != 0) {
        const uint64_t k = static_cast<uint64_t>(std::countr_zero(bits));
        bits &= bits - 1;
        TimerLink& head = slots_[pos + k];
        fired += fire(head, fn);
        if (head.next == &head) word &= ~(uint64_t{1} << (bit + k));
      }
      pos = (pos + n) & mask_;
      walk -= n;
    }
    return fired;
  }

  // The wheel's clock stands still for `ns` (its owner was off the CPU, and
  // read nothing meanwhile): every timer armed fires that much later, and
  // the times passed in from now on are taken that much earlier. At most
  // the time since the last advance(), so the clock never goes back.
  void stop_clock(uint64_t ns) { stopped_ns_ += ns; }

  size_t size() const { return size_; }            // armed timers
  uint64_t now_tick() const { return now_tick_; }  // on the wheel's clock

 private:
  static void init(TimerLink& head) { head.prev = head.next = &head; }

  static void push_back(TimerLink& head, TimerNode& t) {
    t.prev = head.prev;
    t.next = &head;
    head.prev->next = &t;
    head.prev = &t;
  }

  // Clears the links too: armed() is false from here on.
  static void unlink(TimerNode& t) {
    t.prev->next = t.next;
    t.next->prev = t.prev;
    t.prev = t.next = nullptr;
  }

  // Fires the due timers of `list` and keeps the others. The list is first
  // moved to a local head: timers fn arms into `list` go to the (now empty)
  // real head and are not seen by this walk, and fn may unlink any node still
  // pending, since each one is taken from the local head only when reached.
  template <typename Fn>
  uint32_t fire(TimerLink& list, Fn& fn) {
    if (list.next == &list) return 0;
    TimerLink pending;
    pending.next = list.next;
    pending.prev = list.prev;
    pending.next->prev = &pending;
    pending.prev->next = &pending;
    init(list);
    uint32_t fired = 0;
    while (pending.next != &pending) {
      // Every link but a sentinel is a TimerNode's.
      TimerNode& t = static_cast<TimerNode&>(*pending.next);
      unlink(t);
      if (t.expire_tick > now_tick_) {  // a later revolution
        push_back(list, t);
        continue;
      }
      --size_;
      ++fired;
      fn(t);
    }
    return fired;
  }

  uint64_t tick_ns_;
  uint64_t mask_;      // slots - 1
  uint64_t now_tick_;  // every tick up to this one has been walked
  std::unique_ptr<TimerLink[]> slots_;  // sentinel heads, valid if occupied
  std::vector<uint64_t> occupied_;      // bit per slot: may hold timers
  TimerLink due_;                       // armed for a tick already walked
  size_t size_ = 0;
  uint64_t stopped_ns_ = 0;  // the clock stood still this long (stop_clock)
};

}  // namespace urnic::transport
