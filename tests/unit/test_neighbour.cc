// Neighbour cache timing rules and the pending-packet queue.
#include <gtest/gtest.h>

#include <vector>

#include "dataplane/host/neighbour.h"
#include "dataplane/host/pending.h"
#include "dataplane/wire/codec.h"

using namespace urnic;
using host::Lookup;

namespace {
constexpr uint64_t kSec = 1'000'000'000;
host::NeighbourParams params() {
  host::NeighbourParams p;
  p.entries = 16;
  p.reachable_ns = 10 * kSec;
  p.retry_ns = 1 * kSec;
  p.retries = 3;
  return p;
}
void gid(uint32_t ip, uint8_t g[16]) {
  wire::gid_from_ipv4(ip, g);
}
const wire::MacAddr kMac{{2, 0, 0, 0, 0, 9}};
}  // namespace

TEST(Neighbour, RetriesThenFailsThenStartsOver) {
  host::NeighbourTable nt(params());
  uint8_t g[16];
  gid(0x0a000002, g);
  wire::MacAddr m;
  EXPECT_TRUE(nt.start(g, 0));          // first request
  EXPECT_FALSE(nt.start(g, kSec / 2));  // not yet due
  EXPECT_EQ(nt.lookup(g, kSec / 2, m), Lookup::kPending);
  EXPECT_TRUE(nt.start(g, kSec));       // retry 2
  EXPECT_TRUE(nt.start(g, 2 * kSec));   // retry 3
  EXPECT_FALSE(nt.start(g, 3 * kSec));  // exhausted
  EXPECT_EQ(nt.lookup(g, 3 * kSec, m), Lookup::kFailed);
  // After a hold-down of one retry period a new resolution may begin.
  EXPECT_TRUE(nt.start(g, 4 * kSec));
  EXPECT_EQ(nt.lookup(g, 4 * kSec, m), Lookup::kPending);
}

TEST(Neighbour, LearnedEntriesExpire) {
  host::NeighbourTable nt(params());
  uint8_t g[16];
  gid(0x0a000003, g);
  wire::MacAddr m;
  ASSERT_TRUE(nt.learn(g, kMac, 0, true));
  EXPECT_EQ(nt.lookup(g, 9 * kSec, m), Lookup::kHit);
  EXPECT_EQ(m, kMac);
  EXPECT_EQ(nt.lookup(g, 10 * kSec, m), Lookup::kPending);
  EXPECT_TRUE(nt.start(g, 10 * kSec));  // re-resolve
}

TEST(Neighbour, FullTableRefusesAndReusesExpired) {
  host::NeighbourTable nt(params());
  bool full = false;
  uint32_t added = 0;
  for (uint32_t i = 0; i < 64; ++i) {
    uint8_t g[16];
    gid(0x0b000000 + i, g);
    if (nt.learn(g, kMac, 0, true)) ++added;
  }
  EXPECT_LE(added, nt.capacity());
  EXPECT_GE(added, nt.capacity() / 2);
  // Everything has expired at t=20s: new addresses take stale slots.
  uint8_t g[16];
  gid(0x0c000001, g);
  EXPECT_TRUE(nt.start(g, 20 * kSec, &full));
  EXPECT_FALSE(full);
}

TEST(Pending, SendsOnResolveDropsOnFailureAndBoundsTheQueue) {
  host::NeighbourTable nt(params());
  host::PendingQueue<int> q(3);
  uint8_t a[16], b[16];
  gid(0x0a000002, a);
  gid(0x0a000003, b);
  EXPECT_TRUE(q.push(1, a));
  EXPECT_TRUE(q.push(2, b));
  EXPECT_TRUE(q.push(3, a));
  EXPECT_FALSE(q.push(4, a));  // bounded: the caller drops and counts
  std::vector<int> sent, dropped;
  std::vector<uint32_t> requests;
  auto poll = [&](uint64_t now) {
    q.poll(
        nt, now, [&](int h, const wire::MacAddr&) { sent.push_back(h); },
        [&](int h) { dropped.push_back(h); },
        [&](const uint8_t* g) { requests.push_back(wire::gid_to_ipv4(g)); });
  };
  poll(0);
  EXPECT_EQ(requests.size(), 2u);  // one per address, not per packet
  nt.learn(a, kMac, kSec / 2, false);
  poll(kSec / 2);
  EXPECT_EQ(sent, (std::vector<int>{1, 3}));  // in order
  for (uint64_t t = 1; t <= 4; ++t) poll(t * kSec);
  EXPECT_EQ(dropped, (std::vector<int>{2}));
  EXPECT_EQ(q.size(), 0u);
  EXPECT_EQ(requests.size(), 4u);  // b: 3 tries; a: 1
}

// A multicast group needs no ARP or ND: its MAC is the group's (RFC 1112
// 6.4: 01:00:5e + low 23 bits; RFC 2464 7: 33:33 + low 32 bits), at once.
TEST(Neighbour, GroupsResolveToTheirMacWithoutAsking) {
  host::NeighbourTable nt(params());
  uint8_t g[16];
  gid(0xef810203, g);  // 239.129.2.3: bit 24 of the group is not in the MAC
  wire::MacAddr m;
  EXPECT_EQ(nt.lookup(g, 0, m), Lookup::kHit);
  EXPECT_EQ(m, (wire::MacAddr{{0x01, 0x00, 0x5e, 0x01, 0x02, 0x03}}));
  const uint8_t v6[16] = {0xff, 0x0e, 0, 0, 0,    0,    0,    0,
                          0,    0,    0, 0, 0x12, 0x34, 0x56, 0x78};
  EXPECT_EQ(nt.lookup(v6, 0, m), Lookup::kHit);
  EXPECT_EQ(m, (wire::MacAddr{{0x33, 0x33, 0x12, 0x34, 0x56, 0x78}}));
}
