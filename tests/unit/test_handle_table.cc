// HandleTable (verbs-shim/handle_table.h) against std::unordered_map as the
// reference: random inserts, erases and lookups, with handles that collide
// into long probe runs, so that backward-shift deletion is exercised where
// runs wrap around the end of the table.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <memory>
#include <random>
#include <unordered_map>
#include <vector>

#include "verbs-shim/handle_table.h"

namespace {

struct Obj {
  uint32_t handle = 0;
};

using urnic::shim::HandleTable;

// Every handle the reference holds is found, maps to its object, and the
// table holds nothing else.
void expect_same(const HandleTable<Obj>& t,
                 const std::unordered_map<uint32_t, Obj*>& ref) {
  ASSERT_EQ(t.size(), ref.size());
  for (const auto& [h, o] : ref) ASSERT_EQ(t.find(h), o) << "handle " << h;
  size_t seen = 0;
  t.for_each([&](Obj* o) {
    ++seen;
    auto it = ref.find(o->handle);
    ASSERT_NE(it, ref.end());
    EXPECT_EQ(it->second, o);
  });
  EXPECT_EQ(seen, ref.size());
}

TEST(HandleTable, EmptyFindsNothing) {
  HandleTable<Obj> t;
  EXPECT_EQ(t.find(0), nullptr);
  EXPECT_EQ(t.find(7), nullptr);
  EXPECT_EQ(t.erase(7), nullptr);
  EXPECT_EQ(t.size(), 0u);
}

TEST(HandleTable, RefusesADuplicateHandle) {
  HandleTable<Obj> t;
  Obj a{5}, b{5};
  EXPECT_EQ(t.insert(&a), 0);
  EXPECT_EQ(t.insert(&b), EEXIST);
  EXPECT_EQ(t.find(5), &a);
  EXPECT_EQ(t.size(), 1u);
  EXPECT_EQ(t.erase(5), &a);
  EXPECT_EQ(t.find(5), nullptr);
  EXPECT_EQ(t.insert(&b), 0);
  EXPECT_EQ(t.find(5), &b);
}

// What the shim does: handles handed out in order, objects destroyed in
// any order, the table grown through many sizes and emptied again (its
// slots stay: it never shrinks).
TEST(HandleTable, ConsecutiveHandlesThroughGrowthAndBack) {
  HandleTable<Obj> t;
  std::unordered_map<uint32_t, Obj*> ref;
  std::vector<std::unique_ptr<Obj>> objs;
  for (uint32_t h = 1; h <= 20000; ++h) {
    objs.push_back(std::make_unique<Obj>(Obj{h}));
    ASSERT_EQ(t.insert(objs.back().get()), 0);
    ref[h] = objs.back().get();
  }
  expect_same(t, ref);
  std::mt19937 rng(1);
  std::vector<uint32_t> order;
  for (auto& [h, o] : ref) order.push_back(h);
  std::shuffle(order.begin(), order.end(), rng);
  for (size_t i = 0; i < order.size(); ++i) {
    ASSERT_EQ(t.erase(order[i]), ref[order[i]]);
    ref.erase(order[i]);
    if (i % 997 == 0) expect_same(t, ref);
  }
  expect_same(t, ref);
}

// Random operations over a small key space (many hits on the same slots,
// clusters that wrap), checked against the reference after each one.
TEST(HandleTable, MatchesAReferenceMapUnderRandomOperations) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    HandleTable<Obj> t;
    std::unordered_map<uint32_t, Obj*> ref;
    std::vector<std::unique_ptr<Obj>> objs;
    std::mt19937 rng(seed);
    const uint32_t keys = 8 + seed * 13;
    for (int op = 0; op < 4000; ++op) {
      // Handles spaced by a power of two land on few home slots.
      const uint32_t h = (rng() % keys) << (seed % 3 == 0 ? 12 : 0);
      switch (rng() % 3) {
        case 0: {
          objs.push_back(std::make_unique<Obj>(Obj{h}));
          const bool fresh = !ref.count(h);
          ASSERT_EQ(t.insert(objs.back().get()), fresh ? 0 : EEXIST);
          if (fresh) ref[h] = objs.back().get();
          break;
        }
        case 1: {
          auto it = ref.find(h);
          ASSERT_EQ(t.erase(h), it == ref.end() ? nullptr : it->second);
          if (it != ref.end()) ref.erase(it);
          break;
        }
        default: {
          auto it = ref.find(h);
          ASSERT_EQ(t.find(h), it == ref.end() ? nullptr : it->second);
        }
      }
      if (op % 50 == 0) expect_same(t, ref);
    }
    expect_same(t, ref);
    t.clear();
    EXPECT_EQ(t.size(), 0u);
    EXPECT_EQ(t.find(ref.empty() ? 0 : ref.begin()->first), nullptr);
  }
}

}  // namespace
