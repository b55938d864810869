// The transport timer wheel: fires at expiry (never early, at most one tick
// late), in order, exactly once, including re-arms from inside callbacks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "dataplane/transport/timer_wheel.h"

using namespace urnic::transport;

namespace {

constexpr uint64_t kUs = 1000;
constexpr uint64_t kSec = 1000 * 1000 * kUs;

// A timer that records the time it fired.
struct Probe {
  TimerNode node;
  uint64_t fired_at = 0;
  uint32_t fires = 0;
};

// Advances `w` to `now` and records the fire on each Probe.
uint32_t advance_probes(TimerWheel& w, uint64_t now) {
  return w.advance(now, [now](TimerNode& t) {
    auto* p = static_cast<Probe*>(t.owner);
    p->fired_at = now;
    ++p->fires;
  });
}

void make_probes(std::vector<Probe>& v, size_t n) {
  v.resize(n);
  for (Probe& p : v) p.node.owner = &p;
}

TEST(TimerWheel, FiresAtFirstStepAtOrAfterExpiryNeverBefore) {
  // Expiries on and off tick boundaries, across one revolution (4096 us).
  const std::vector<uint64_t> expiries = {
      1, 999, 1000, 1001, 4096, 5500, 4096 * kUs, 4096 * kUs + 1, 9000 * kUs};
  for (uint64_t step : {kUs, uint64_t{100}}) {
    std::vector<Probe> v;
    make_probes(v, expiries.size());
    TimerWheel w;
    for (size_t i = 0; i < v.size(); ++i) w.arm(v[i].node, expiries[i]);
    for (uint64_t now = step; now <= 10000 * kUs; now += step) {
      advance_probes(w, now);
      for (size_t i = 0; i < v.size(); ++i) {
        // Not before its expiry, and once due not a tick later.
        if (now < expiries[i]) {
          ASSERT_EQ(v[i].fires, 0u) << expiries[i] << " at " << now;
        }
        if (now >= expiries[i] + kUs) {
          ASSERT_EQ(v[i].fires, 1u) << expiries[i] << " at " << now;
        }
      }
    }
    for (size_t i = 0; i < v.size(); ++i) {
      EXPECT_EQ(v[i].fires, 1u);
      EXPECT_GE(v[i].fired_at, expiries[i]);
      EXPECT_LT(v[i].fired_at, expiries[i] + kUs);
      if (step == kUs) {  // on 1 us steps: the first step at/after expiry
        EXPECT_EQ(v[i].fired_at, (expiries[i] + kUs - 1) / kUs * kUs);
      }
    }
    EXPECT_EQ(w.size(), 0u);
  }
}

TEST(TimerWheel, StartTimeAndOwnerKindPassedBack) {
  const uint64_t start = 123456789012345;  // a TSC-like origin, mid-tick
  TimerWheel w(start);
  EXPECT_EQ(w.now_tick(), start / kUs);
  int owner = 0;
  TimerNode t;
  t.owner = &owner;
  t.kind = 7;
  w.arm(t, start + 10 * kUs);  // 345 ns into a tick: due at the next one
  const uint64_t due = (start + 10 * kUs) / kUs * kUs + kUs;
  EXPECT_EQ(w.advance(due - 1, [](TimerNode&) {}), 0u);
  uint32_t calls = 0;
  EXPECT_EQ(w.advance(due,
                      [&](TimerNode& n) {
                        ++calls;
                        EXPECT_EQ(&n, &t);
                        EXPECT_EQ(n.owner, &owner);
                        EXPECT_EQ(n.kind, 7);
                        EXPECT_FALSE(n.armed());  // unlinked before fn
                      }),
            1u);
  EXPECT_EQ(calls, 1u);
  EXPECT_EQ(w.now_tick(), due / kUs);
}

// While its owner is off the CPU the wheel's clock stands still: a timer
// armed before the pause fires that much later; one armed after it, at its
// time.
TEST(TimerWheel, StoppedClockDelaysWhatWasArmedBefore) {
  TimerWheel w(0);
  TimerNode before, after;
  std::vector<TimerNode*> fired;
  auto fn = [&](TimerNode& n) { fired.push_back(&n); };
  w.arm(before, 100 * kUs);
  EXPECT_EQ(w.advance(40 * kUs, fn), 0u);
  // Paused from 40 to 90 us: 50 us that do not count.
  w.stop_clock(50 * kUs);
  w.arm(after, 90 * kUs + 30 * kUs);
  EXPECT_EQ(w.advance(90 * kUs, fn), 0u);
  EXPECT_EQ(w.advance(120 * kUs - 1, fn), 0u);
  EXPECT_EQ(w.advance(120 * kUs, fn), 1u);
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_EQ(fired[0], &after);
  EXPECT_EQ(w.advance(150 * kUs - 1, fn), 0u);
  EXPECT_EQ(w.advance(150 * kUs, fn), 1u);
  ASSERT_EQ(fired.size(), 2u);
  EXPECT_EQ(fired[1], &before);
  EXPECT_EQ(w.size(), 0u);
}

TEST(TimerWheel, PastExpiryFiresAtNextAdvanceEvenWithoutTimeMoving) {
  TimerWheel w(50 * kUs);
  std::vector<Probe> v;
  make_probes(v, 3);
  w.arm(v[0].node, 0);
  w.arm(v[1].node, 50 * kUs);  // exactly now
  w.arm(v[2].node, 50 * kUs + 1);
  EXPECT_EQ(advance_probes(w, 50 * kUs), 2u);  // same tick as the start
  EXPECT_EQ(v[0].fires, 1u);
  EXPECT_EQ(v[1].fires, 1u);
  EXPECT_EQ(v[2].fires, 0u);
  EXPECT_EQ(advance_probes(w, 51 * kUs), 1u);
  EXPECT_EQ(v[2].fires, 1u);
}

TEST(TimerWheel, Cancel) {
  TimerWheel w;
  std::vector<Probe> v;
  make_probes(v, 4);
  for (Probe& p : v) w.arm(p.node, 10 * kUs);  // all in one slot
  TimerNode never_armed;
  w.cancel(never_armed);  // no-op
  EXPECT_FALSE(never_armed.armed());
  w.cancel(v[0].node);  // head of the slot
  w.cancel(v[2].node);  // middle
  w.cancel(v[3].node);  // tail
  w.cancel(v[3].node);  // again: no-op
  EXPECT_FALSE(v[0].node.armed());
  EXPECT_TRUE(v[1].node.armed());
  EXPECT_EQ(w.size(), 1u);
  EXPECT_EQ(advance_probes(w, 1 * kSec), 1u);
  EXPECT_EQ(v[0].fires + v[2].fires + v[3].fires, 0u);
  EXPECT_EQ(v[1].fires, 1u);
  EXPECT_EQ(w.size(), 0u);
}

TEST(TimerWheel, RearmMoves) {
  TimerWheel w;
  Probe p;
  p.node.owner = &p;
  w.arm(p.node, 10 * kUs);
  w.arm(p.node, 50 * kUs);  // later
  EXPECT_EQ(w.size(), 1u);
  for (uint64_t now = kUs; now < 50 * kUs; now += kUs) {
    ASSERT_EQ(advance_probes(w, now), 0u) << now;
  }
  EXPECT_EQ(advance_probes(w, 50 * kUs), 1u);

  w.arm(p.node, 100 * kUs);
  w.arm(p.node, 60 * kUs);  // earlier
  EXPECT_EQ(advance_probes(w, 59 * kUs), 0u);
  EXPECT_EQ(advance_probes(w, 60 * kUs), 1u);
  EXPECT_EQ(p.fired_at, 60 * kUs);

  // Into the same slot one revolution later (4096 slots of 1 us).
  w.arm(p.node, 70 * kUs);
  w.arm(p.node, 70 * kUs + 4096 * kUs);
  EXPECT_EQ(advance_probes(w, 71 * kUs), 0u);
  EXPECT_EQ(advance_probes(w, 70 * kUs + 4096 * kUs), 1u);
  EXPECT_EQ(p.fires, 3u);
  EXPECT_EQ(w.size(), 0u);
}

TEST(TimerWheel, SizeAccounting) {
  TimerWheel w;
  std::vector<Probe> v;
  make_probes(v, 3);
  EXPECT_EQ(w.size(), 0u);
  w.arm(v[0].node, 5 * kUs);
  w.arm(v[1].node, 10 * kUs);
  w.arm(v[2].node, 10 * kSec);
  EXPECT_EQ(w.size(), 3u);
  w.arm(v[1].node, 6 * kUs);  // re-arm: still 3
  EXPECT_EQ(w.size(), 3u);
  w.cancel(v[2].node);
  w.cancel(v[2].node);
  EXPECT_EQ(w.size(), 2u);
  size_t size_in_fn = 99;
  w.advance(5 * kUs, [&](TimerNode&) { size_in_fn = w.size(); });
  EXPECT_EQ(size_in_fn, 1u);  // the fired one no longer counts
  EXPECT_EQ(w.size(), 1u);
  advance_probes(w, 6 * kUs);
  EXPECT_EQ(w.size(), 0u);
  for (const Probe& p : v) EXPECT_FALSE(p.node.armed());
}

TEST(TimerWheel, RearmSelfIntoSameSlotNextRevolution) {
  TimerWheel w(0, kUs, 64);
  Probe p;
  p.node.owner = &p;
  w.arm(p.node, 10 * kUs);
  std::vector<uint64_t> fired;
  auto fn = [&](TimerNode& t) {
    fired.push_back(w.now_tick());
    if (fired.size() < 3) w.arm(t, (w.now_tick() + 64) * kUs);  // same slot
  };
  for (uint64_t now = kUs; now <= 300 * kUs; now += kUs) w.advance(now, fn);
  EXPECT_EQ(fired, (std::vector<uint64_t>{10, 74, 138}));
  EXPECT_EQ(w.size(), 0u);
}

TEST(TimerWheel, CallbackCancelsOrMovesTimersInTheSlotBeingWalked) {
  TimerWheel w;
  std::vector<Probe> v;
  make_probes(v, 4);
  for (Probe& p : v) w.arm(p.node, 10 * kUs);  // one slot, this order
  std::vector<Probe*> order;
  auto fn = [&](TimerNode& t) {
    auto* p = static_cast<Probe*>(t.owner);
    order.push_back(p);
    ++p->fires;
    if (p == &v[0]) {
      w.cancel(v[1].node);             // not yet reached in this slot
      w.arm(v[2].node, 20 * kUs);      // moved away before it is reached
      w.arm(v[3].node, 10 * kUs + 1);  // moved later within the slot list
    }
  };
  EXPECT_EQ(w.advance(10 * kUs, fn), 1u);
  EXPECT_EQ(order, (std::vector<Probe*>{&v[0]}));
  EXPECT_EQ(w.advance(11 * kUs, fn), 1u);
  EXPECT_EQ(w.advance(20 * kUs, fn), 1u);
  EXPECT_EQ(order, (std::vector<Probe*>{&v[0], &v[3], &v[2]}));
  EXPECT_EQ(v[1].fires, 0u);
  EXPECT_EQ(w.size(), 0u);
}

TEST(TimerWheel, RearmFromCallbackForNowOrPastFiresOnNextAdvance) {
  TimerWheel w;
  std::vector<Probe> v;
  make_probes(v, 3);
  w.arm(v[0].node, 10 * kUs);
  w.arm(v[1].node, 10 * kUs);  // same slot, after v[0]
  uint32_t calls = 0;
  auto fn = [&](TimerNode& t) {
    ++calls;
    auto* p = static_cast<Probe*>(t.owner);
    ++p->fires;
    if (p->fires == 1 && p != &v[2]) {
      if (p == &v[0]) w.arm(t, 10 * kUs);  // exactly now, own slot
      if (p == &v[1]) w.arm(t, 3 * kUs);   // in the past
      w.arm(v[2].node, 0);                 // another timer, long past
    }
  };
  // Re-armed for <= now: does not fire again in this call (no livelock).
  EXPECT_EQ(w.advance(10 * kUs, fn), 2u);
  EXPECT_EQ(calls, 2u);
  EXPECT_EQ(w.size(), 3u);
  // Next call, even at the same time: all three fire once.
  EXPECT_EQ(w.advance(10 * kUs, fn), 3u);
  EXPECT_EQ(v[0].fires, 2u);
  EXPECT_EQ(v[1].fires, 2u);
  EXPECT_EQ(v[2].fires, 1u);
  EXPECT_EQ(w.size(), 0u);
  EXPECT_EQ(w.advance(10 * kUs, fn), 0u);
}

TEST(TimerWheel, LongJumpFiresEverythingDueExactlyOnce) {
  std::mt19937_64 rng(7);
  const size_t n = 20000;
  std::vector<Probe> v;
  make_probes(v, n);
  std::vector<uint64_t> exp(n);
  TimerWheel w;  // one revolution = 4.096 ms
  for (size_t i = 0; i < n; ++i) {
    exp[i] = rng() % (20 * kSec);  // half due within the jump
    w.arm(v[i].node, exp[i]);
  }
  const uint64_t now = 10 * kSec;
  size_t due = std::count_if(exp.begin(), exp.end(),
                             [&](uint64_t e) { return e <= now; });
  EXPECT_EQ(advance_probes(w, now), due);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(v[i].fires, exp[i] <= now ? 1u : 0u) << exp[i];
  }
  EXPECT_EQ(w.size(), n - due);
  EXPECT_EQ(advance_probes(w, now), 0u);
  // The rest still fire on time after the jump.
  for (uint64_t t = now; t <= 20 * kSec; t += kSec / 1000) advance_probes(w, t);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(v[i].fires, 1u);
    if (exp[i] > now) {
      ASSERT_GE(v[i].fired_at, exp[i]);
      ASSERT_LT(v[i].fired_at, exp[i] + kSec / 1000);  // the step size
    }
  }
  EXPECT_EQ(w.size(), 0u);
}

TEST(TimerWheel, HourLongTimerAndHugeJump) {
  // IB local ACK timeout 31: 4.096 us * 2^31 = 2^43 ns, about 2.4 hours.
  const uint64_t timeout = uint64_t{1} << 43;
  const uint64_t start = 5 * kSec;
  TimerWheel w(start);
  Probe p;
  p.node.owner = &p;
  w.arm(p.node, start + timeout);
  // Coarse steps (each walks all slots once), then up to the expiry.
  for (uint64_t t = start; t < start + timeout; t += 60 * kSec) {
    ASSERT_EQ(advance_probes(w, t), 0u);
  }
  const uint64_t due = (start + timeout + kUs - 1) / kUs * kUs;
  EXPECT_EQ(advance_probes(w, due - 1), 0u);
  EXPECT_EQ(advance_probes(w, due), 1u);
  // A jump of ~12 days must not walk 10^12 ticks one by one (would time out).
  w.arm(p.node, start + timeout + 1);
  EXPECT_EQ(advance_probes(w, start + timeout + 1000000 * kSec), 1u);
  EXPECT_EQ(p.fires, 2u);
}

// Random arms, cancels and re-arms (some from inside callbacks) against a
// reference std::multimap. Every advance must fire exactly the timers the
// reference says are due, in expiry order unless the step spanned a whole
// revolution (then each slot is walked once, in slot order).
void run_against_reference(uint32_t slots, uint64_t seed) {
  constexpr uint32_t kTimers = 2000;
  const uint64_t revolution = slots * kUs;
  const uint64_t run_ns = std::max(60 * 1000 * kUs, 100 * revolution);
  std::mt19937_64 rng(seed);
  auto below = [&](uint64_t n) { return rng() % n; };

  TimerWheel w(0, kUs, slots);
  std::vector<TimerNode> nodes(kTimers);
  auto id_of = [&](TimerNode& t) {
    return static_cast<uint32_t>(&t - nodes.data());
  };

  // Key: the tick a timer is due at. One armed for an already walked tick is
  // due at the next advance, so its key is the tick it was armed at.
  using RefMap = std::multimap<uint64_t, uint32_t>;
  RefMap ref;
  std::vector<RefMap::iterator> where(kTimers, ref.end());
  std::vector<uint64_t> key(kTimers);
  std::vector<bool> due_now(kTimers, false);  // expected in this advance
  uint64_t now = 0;

  // Short (retransmit-like), beyond one and several revolutions, and hours.
  auto delay = [&]() -> uint64_t {
    uint64_t r = below(100);
    if (r < 50) return 4 * kUs + below(100 * kUs);
    if (r < 80) return below(2 * revolution);
    if (r < 95) return below(10 * revolution);
    return 3600 * kSec + below(3600 * kSec);
  };
  auto forget = [&](uint32_t id) {
    if (where[id] != ref.end()) ref.erase(where[id]);
    where[id] = ref.end();
    due_now[id] = false;
  };
  auto arm_at = [&](uint32_t id, uint64_t expire_ns) {
    forget(id);
    w.arm(nodes[id], expire_ns);
    key[id] = std::max((expire_ns + kUs - 1) / kUs, w.now_tick());
    where[id] = ref.emplace(key[id], id);
  };
  auto cancel = [&](uint32_t id) {
    forget(id);
    w.cancel(nodes[id]);
  };
  auto any_id = [&] { return static_cast<uint32_t>(below(kTimers)); };

  for (uint32_t i = 0; i < kTimers; ++i) arm_at(i, delay());
  uint64_t total_fired = 0, jumps = 0;
  while (now < run_ns) {
    for (uint64_t k = below(4); k > 0; --k) {
      uint64_t r = below(6);
      if (r < 2) cancel(any_id());
      if (r >= 2 && r < 5) arm_at(any_id(), now + delay());
      if (r == 5) arm_at(any_id(), below(now + 1));  // in the past
    }
    // Mostly sub-tick to few-tick steps; now and then over a revolution.
    now +=
        below(300) == 0 ? revolution + below(3 * revolution) : below(3 * kUs);
    const uint64_t cur = now / kUs;
    const bool ordered = cur - w.now_tick() < slots;
    jumps += !ordered;

    size_t expected = 0;
    while (!ref.empty() && ref.begin()->first <= cur) {
      uint32_t id = ref.begin()->second;
      ref.erase(ref.begin());
      where[id] = ref.end();
      due_now[id] = true;
      ++expected;
    }
    uint64_t last_key = 0;
    uint32_t fired = 0;
    uint32_t n = w.advance(now, [&](TimerNode& t) {
      uint32_t id = id_of(t);
      ASSERT_TRUE(due_now[id]) << "id " << id << " at " << now;
      due_now[id] = false;
      ++fired;
      ASSERT_LE(t.expire_tick, cur);  // never early
      if (ordered) {
        ASSERT_GE(key[id], last_key);
        last_key = key[id];
      }
      uint64_t r = below(10);
      if (r < 5) arm_at(id, now + delay());         // periodic
      if (r == 5) cancel(any_id());                 // maybe one still due
      if (r == 6) arm_at(any_id(), now + delay());  // maybe one still due
      if (r == 7) arm_at(id, below(now + 1));       // past: next call
    });
    ASSERT_EQ(n, fired);
    // Every expected timer fired, unless fn cancelled or moved it first.
    ASSERT_TRUE(
        std::none_of(due_now.begin(), due_now.end(), [](bool b) { return b; }));
    ASSERT_LE(fired, expected);
    ASSERT_EQ(w.size(), ref.size());
    total_fired += fired;
  }
  // The run exercised what it claims to.
  EXPECT_GT(total_fired, 10000u);
  EXPECT_GT(jumps, 10u);
  // Finally jump past the hour-long ones: everything left fires, once.
  size_t left = ref.size();
  EXPECT_GT(left, 0u);
  std::vector<uint32_t> count(kTimers);
  EXPECT_EQ(w.advance(now + 3 * 3600 * kSec,
                      [&](TimerNode& t) { ++count[id_of(t)]; }),
            left);
  for (auto& [k, id] : ref) EXPECT_EQ(count[id], 1u) << id;
  EXPECT_EQ(w.size(), 0u);
}

TEST(TimerWheel, RandomAgainstReferenceSmallWheel) {
  run_against_reference(256, 1);
}

TEST(TimerWheel, RandomAgainstReferenceDefaultWheel) {
  run_against_reference(4096, 2);
}

TEST(TimerWheel, HundredThousandTimers) {
  const size_t n = 100000;
  std::mt19937_64 rng(3);
  std::vector<Probe> v;
  make_probes(v, n);
  std::vector<uint64_t> exp(n);
  TimerWheel w;
  for (size_t i = 0; i < n; ++i) {
    exp[i] = rng() % (20 * 1000 * kUs);  // 20 ms: ~5 revolutions
    w.arm(v[i].node, exp[i]);
  }
  EXPECT_EQ(w.size(), n);
  uint64_t fired = 0;
  for (uint64_t now = 0; now <= 20 * 1000 * kUs; now += kUs) {
    fired += advance_probes(w, now);
  }
  EXPECT_EQ(fired, n);
  EXPECT_EQ(w.size(), 0u);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(v[i].fires, 1u);
    ASSERT_EQ(v[i].fired_at, (exp[i] + kUs - 1) / kUs * kUs);
  }
}

}  // namespace

// Fewer slots than one word of the occupancy bitmap, and a size that is not
// a multiple of it: the walk must wrap at the wheel's end, not the word's.
TEST(TimerWheel, RandomAgainstReferenceTinyWheels) {
  run_against_reference(8, 3);
  run_against_reference(96, 4);  // rounded up to 128: two words
}

// The sentinel heads are not written until a slot is first armed: a wheel
// built on memory full of stale pointers (a freed block the allocator hands
// back) must treat every slot as empty, and a slot emptied by a visit and
// armed again must start afresh.
TEST(TimerWheel, SlotsNeverArmedReadAsEmptyOnRecycledMemory) {
  constexpr uint32_t kSlots = 64;
  for (int round = 0; round < 3; ++round) {
    {
      // Same size as the wheel's heads: glibc gives the block back next.
      std::unique_ptr<TimerLink[]> junk(new TimerLink[kSlots]);
      for (uint32_t i = 0; i < kSlots; ++i)
        junk[i].prev = junk[i].next = &junk[(i * 7 + 3) % kSlots];
    }
    TimerWheel w(0, kUs, kSlots);
    std::vector<Probe> v;
    make_probes(v, 3 * kSlots);
    // Nothing armed: a full revolution and more fires nothing.
    EXPECT_EQ(advance_probes(w, 2 * kSlots * kUs), 0u);
    // Every slot, then each emptied by its visit, then every slot again with
    // some armed a revolution out (they stay through the first visit).
    for (uint32_t i = 0; i < kSlots; ++i)
      w.arm(v[i].node, (2 * kSlots + 1 + i) * kUs);
    EXPECT_EQ(advance_probes(w, (3 * kSlots + 1) * kUs), kSlots);
    for (uint32_t i = 0; i < 2 * kSlots; ++i)
      w.arm(v[kSlots + i].node, (3 * kSlots + 2 + i) * kUs);
    EXPECT_EQ(advance_probes(w, (4 * kSlots + 1) * kUs), kSlots);
    EXPECT_EQ(w.size(), kSlots);
    EXPECT_EQ(advance_probes(w, (5 * kSlots + 1) * kUs), kSlots);
    for (const Probe& p : v) EXPECT_EQ(p.fires, 1u);
    EXPECT_EQ(w.size(), 0u);
  }
}
