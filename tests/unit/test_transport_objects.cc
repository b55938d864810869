// Verbs objects of the transport: keys, access checks, limits, lifetimes,
// and create_qp's capability checks.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <set>
#include <thread>
#include <vector>

#include "dataplane/transport/engine.h"

namespace urnic::transport {
namespace {

class NullIo : public PacketIo {
 public:
  bool transmit(const TxFrame&) override { return true; }
};

DeviceConfig small_device() {
  DeviceConfig dc;
  dc.mac = {{2, 0, 0, 0, 0, 1}};
  wire::gid_from_ipv4(0x0a000001, dc.gids[0]);
  dc.num_gids = 1;
  dc.key_seed = 42;
  return dc;
}

// A PD and a CQ of `dev`, and the attributes of a small RC QP on them.
void small_qp(Device& dev, QpInitAttr* a) {
  Pd* pd;
  Cq* cq;
  ASSERT_EQ(dev.alloc_pd(&pd), 0);
  ASSERT_EQ(dev.create_cq(16, &cq), 0);
  a->pd = pd;
  a->send_cq = a->recv_cq = cq;
  a->cap = {4, 4, 1, 1, 0};
}

constexpr uint32_t kRemoteAll =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
    IBV_ACCESS_REMOTE_ATOMIC;

TEST(TransportObjects, KeysAreIndexPlusRandomAndStaleKeysDie) {
  Device dev(small_device());
  Pd* pd;
  ASSERT_EQ(dev.alloc_pd(&pd), 0);
  std::vector<uint8_t> buf(4096);
  Mr* mr;
  ASSERT_EQ(dev.reg_mr(pd, buf.data(), buf.size(), 0x1000, kRemoteAll, &mr), 0);
  const uint32_t old_key = mr->rkey();
  EXPECT_EQ(dev.mr_by_rkey(old_key), mr);
  // Same index, different low bits: a neighbour key guess fails.
  EXPECT_EQ(dev.mr_by_rkey(old_key ^ 1), nullptr);
  EXPECT_EQ(dev.mr_by_rkey((old_key & ~0xffu) | ((old_key + 1) & 0xff)),
            nullptr);
  ASSERT_EQ(dev.dereg_mr(mr), 0);
  EXPECT_EQ(dev.mr_by_rkey(old_key), nullptr);
  // Re-registration reuses the slot with a different key: the stale one
  // stays invalid.
  Mr* mr2;
  ASSERT_EQ(dev.reg_mr(pd, buf.data(), buf.size(), 0x1000, kRemoteAll, &mr2),
            0);
  EXPECT_EQ(mr2->rkey() >> 8, old_key >> 8);
  EXPECT_NE(mr2->rkey(), old_key);
  EXPECT_EQ(dev.mr_by_rkey(old_key), nullptr);
  EXPECT_EQ(dev.mr_by_rkey(mr2->rkey()), mr2);
}

TEST(TransportObjects, DeadSlotsAreReusedBeforeTablesGrow) {
  // Every kind of object, created, destroyed in a scattered order and
  // created again: the second round takes exactly the slots of the first
  // (MR and MW indices from their keys, PDs from their handles), and the
  // last slot to die is the first taken.
  Device dev(small_device());
  std::vector<uint8_t> buf(64);
  constexpr int kN = 64;
  auto order = [](int i) { return (i * 37) % kN; };  // a permutation
  std::vector<Pd*> pds(kN);
  std::vector<Mr*> mrs(kN);
  std::vector<Mw*> mws(kN);
  std::vector<Cq*> cqs(kN);
  std::vector<Srq*> srqs(kN);
  std::vector<Ah*> ahs(kN);
  std::set<uint32_t> first_pd, first_mr, first_mw;
  Pd* pd;
  ASSERT_EQ(dev.alloc_pd(&pd), 0);
  ibv_ah_attr own{};  // to the device's own GID: resolves without a peer
  own.is_global = 1;
  wire::gid_from_ipv4(0x0a000001, own.grh.dgid.raw);
  for (int round = 0; round < 2; ++round) {
    std::set<uint32_t> pd_idx, mr_idx, mw_idx;
    for (int i = 0; i < kN; ++i) {
      ASSERT_EQ(dev.alloc_pd(&pds[i]), 0);
      ASSERT_EQ(dev.reg_mr(pd, buf.data(), buf.size(), 0, 0, &mrs[i]), 0);
      ASSERT_EQ(dev.alloc_mw(pd, IBV_MW_TYPE_2, &mws[i]), 0);
      ASSERT_EQ(dev.create_cq(4, &cqs[i]), 0);
      ASSERT_EQ(dev.create_srq(pd, 4, 1, &srqs[i]), 0);
      ASSERT_EQ(dev.create_ah(pd, own, &ahs[i]), 0);
      pd_idx.insert(pds[i]->handle());
      mr_idx.insert(mrs[i]->lkey() >> 8);
      mw_idx.insert(mws[i]->rkey() >> 8);
    }
    if (round == 0) {
      first_pd = pd_idx, first_mr = mr_idx, first_mw = mw_idx;
    } else {
      EXPECT_EQ(pd_idx, first_pd);
      EXPECT_EQ(mr_idx, first_mr);
      EXPECT_EQ(mw_idx, first_mw);
    }
    for (int i = 0; i < kN; ++i) {
      const int k = order(i);
      ASSERT_EQ(dev.dealloc_pd(pds[k]), 0);
      ASSERT_EQ(dev.dereg_mr(mrs[k]), 0);
      ASSERT_EQ(dev.dealloc_mw(mws[k]), 0);
      ASSERT_EQ(dev.destroy_cq(cqs[k]), 0);
      ASSERT_EQ(dev.destroy_srq(srqs[k]), 0);
      ASSERT_EQ(dev.destroy_ah(ahs[k]), 0);
    }
  }
  // The objects that died last are the ones handed out next.
  Mr* mr;
  Cq* cq;
  Srq* srq;
  Ah* ah;
  ASSERT_EQ(dev.reg_mr(pd, buf.data(), buf.size(), 0, 0, &mr), 0);
  ASSERT_EQ(dev.create_cq(4, &cq), 0);
  ASSERT_EQ(dev.create_srq(pd, 4, 1, &srq), 0);
  ASSERT_EQ(dev.create_ah(pd, own, &ah), 0);
  EXPECT_EQ(mr, mrs[order(kN - 1)]);
  EXPECT_EQ(cq, cqs[order(kN - 1)]);
  EXPECT_EQ(srq, srqs[order(kN - 1)]);
  EXPECT_EQ(ah, ahs[order(kN - 1)]);
}

TEST(TransportObjects, KeysDoNotFollowASequence) {
  Device dev(small_device());
  Pd* pd;
  ASSERT_EQ(dev.alloc_pd(&pd), 0);
  std::vector<uint8_t> buf(64);
  std::set<uint32_t> low;
  for (int i = 0; i < 64; ++i) {
    Mr* mr;
    ASSERT_EQ(dev.reg_mr(pd, buf.data(), buf.size(), 0, 0, &mr), 0);
    low.insert(mr->lkey() & 0xff);
  }
  // 64 keys drawn from 256 values: a counter would give 1 distinct value.
  EXPECT_GT(low.size(), 30u);
}

TEST(TransportObjects, AccessChecks) {
  Device dev(small_device());
  Pd *pd, *other;
  ASSERT_EQ(dev.alloc_pd(&pd), 0);
  ASSERT_EQ(dev.alloc_pd(&other), 0);
  std::vector<uint8_t> buf(4096);
  Mr *ro, *rw;
  ASSERT_EQ(
      dev.reg_mr(pd, buf.data(), 1024, 0x10000, IBV_ACCESS_REMOTE_READ, &ro),
      0);
  ASSERT_EQ(dev.reg_mr(pd, buf.data() + 1024, 1024, 0x20000, kRemoteAll, &rw),
            0);
  Mr* got;
  EXPECT_EQ(dev.check_remote(pd, ro->rkey(), 0x10000, 1024,
                             IBV_ACCESS_REMOTE_READ, &got),
            AccessError::kOk);
  EXPECT_EQ(got, ro);
  EXPECT_EQ(got->host(0x10010), buf.data() + 0x10);
  EXPECT_EQ(dev.check_remote(pd, ro->rkey(), 0x10000, 1,
                             IBV_ACCESS_REMOTE_WRITE, &got),
            AccessError::kRights);
  EXPECT_EQ(dev.check_remote(other, ro->rkey(), 0x10000, 1,
                             IBV_ACCESS_REMOTE_READ, &got),
            AccessError::kPd);
  EXPECT_EQ(dev.check_remote(pd, ro->rkey(), 0x10000, 1025,
                             IBV_ACCESS_REMOTE_READ, &got),
            AccessError::kBounds);
  EXPECT_EQ(
      dev.check_remote(pd, ro->rkey(), 0xffff, 1, IBV_ACCESS_REMOTE_READ, &got),
      AccessError::kBounds);
  // Overflowing va + len must not wrap into the region.
  EXPECT_EQ(dev.check_remote(pd, rw->rkey(), 0x20010, UINT64_MAX - 8,
                             IBV_ACCESS_REMOTE_WRITE, &got),
            AccessError::kBounds);
  EXPECT_EQ(dev.check_remote(pd, rw->rkey() + 0x100, 0x20000, 1,
                             IBV_ACCESS_REMOTE_WRITE, &got),
            AccessError::kBadKey);
  // lkeys are checked the same way (local write for receive buffers).
  EXPECT_EQ(
      dev.check_local(pd, ro->lkey(), 0x10000, 8, IBV_ACCESS_LOCAL_WRITE, &got),
      AccessError::kRights);
  EXPECT_EQ(
      dev.check_local(pd, rw->lkey(), 0x20000, 8, IBV_ACCESS_LOCAL_WRITE, &got),
      AccessError::kOk);
}

TEST(TransportObjects, RegMrRulesAndLimits) {
  DeviceConfig dc = small_device();
  dc.limits.max_mr = 2;
  Device dev(dc);
  Pd* pd;
  ASSERT_EQ(dev.alloc_pd(&pd), 0);
  std::vector<uint8_t> buf(64);
  Mr* mr;
  // verbs: remote write / atomic need local write.
  EXPECT_EQ(dev.reg_mr(pd, buf.data(), 64, 0, IBV_ACCESS_REMOTE_WRITE, &mr),
            EINVAL);
  EXPECT_EQ(dev.reg_mr(pd, buf.data(), 64, 0, IBV_ACCESS_REMOTE_ATOMIC, &mr),
            EINVAL);
  EXPECT_EQ(dev.reg_mr(pd, buf.data(), 64, 0, 1u << 30, &mr), EINVAL);
  EXPECT_EQ(dev.reg_mr(pd, buf.data(), 64, UINT64_MAX - 8, 0, &mr), EINVAL);
  // Features urnic lacks (ib_check_mr_access: EOPNOTSUPP): on-demand paging
  // and the FLUSH placement rights (bits 8, 9). The HUGETLB hint is taken.
  EXPECT_EQ(dev.reg_mr(pd, buf.data(), 64, 0, IBV_ACCESS_ON_DEMAND, &mr),
            EOPNOTSUPP);
  EXPECT_EQ(dev.reg_mr(pd, buf.data(), 64, 0, 1u << 9, &mr), EOPNOTSUPP);
  ASSERT_EQ(dev.reg_mr(pd, buf.data(), 64, 0, IBV_ACCESS_HUGETLB, &mr), 0);
  ASSERT_EQ(dev.dereg_mr(mr), 0);
  ASSERT_EQ(dev.reg_mr(pd, buf.data(), 64, 0, 0, &mr), 0);
  ASSERT_EQ(dev.reg_mr(pd, buf.data(), 64, 0, 0, &mr), 0);
  EXPECT_EQ(dev.reg_mr(pd, buf.data(), 64, 0, 0, &mr), ENOMEM);
  EXPECT_EQ(dev.num_mrs(), 2u);
  // A PD in use cannot go.
  EXPECT_EQ(dev.dealloc_pd(pd), EBUSY);
  ASSERT_EQ(dev.dereg_mr(mr), 0);
  EXPECT_EQ(dev.dereg_mr(mr), EINVAL);  // twice
}

TEST(TransportObjects, CreateQpChecksCapsAndLimit) {
  DeviceConfig dc = small_device();
  dc.limits.max_qp = 3;
  Device dev(dc);
  NullIo io;
  Engine eng(dev, io);
  Pd* pd;
  Cq* cq;
  ASSERT_EQ(dev.alloc_pd(&pd), 0);
  ASSERT_EQ(dev.create_cq(16, &cq), 0);
  QpInitAttr a;
  a.pd = pd;
  a.send_cq = a.recv_cq = cq;
  a.cap = {16, 16, kMaxSge + 1, 1, 0};
  Qp* qp;
  EXPECT_EQ(eng.create_qp(a, &qp), EINVAL);  // too many SGEs
  a.cap = {16, 16, 1, 1, kMaxInline + 1};
  EXPECT_EQ(eng.create_qp(a, &qp), EINVAL);  // inline too large
  a.cap = {dc.limits.max_qp_wr + 1, 16, 1, 1, 0};
  EXPECT_EQ(eng.create_qp(a, &qp), EINVAL);  // queue too deep
  a.qp_type = IBV_QPT_RAW_PACKET;
  a.cap = {16, 16, 1, 1, 0};
  EXPECT_EQ(eng.create_qp(a, &qp), EINVAL);
  a.qp_type = IBV_QPT_RC;
  // Granted caps are at least what was asked.
  a.cap = {10, 5, 16, 16, 256};
  ASSERT_EQ(eng.create_qp(a, &qp), 0);
  EXPECT_GE(a.cap.max_send_wr, 10u);
  EXPECT_GE(a.cap.max_recv_wr, 5u);
  EXPECT_EQ(a.cap.max_send_sge, 16u);
  EXPECT_EQ(a.cap.max_inline_data, 256u);
  EXPECT_EQ(eng.find_qp(qp->qpn()), qp);
  ASSERT_EQ(eng.destroy_qp(qp), 0);
  // No inline asked for: the room of the gather list is granted (an
  // ibv_sge per SGE, as rxe), never above the device's limit.
  a.cap = {10, 5, 1, 1, 0};
  ASSERT_EQ(eng.create_qp(a, &qp), 0);
  EXPECT_EQ(a.cap.max_inline_data, sizeof(ibv_sge));
  ASSERT_EQ(eng.destroy_qp(qp), 0);
  a.cap = {10, 5, 4, 1, 8};
  ASSERT_EQ(eng.create_qp(a, &qp), 0);
  EXPECT_EQ(a.cap.max_inline_data, 4 * sizeof(ibv_sge));
  ASSERT_EQ(eng.destroy_qp(qp), 0);
  a.cap = {10, 5, 16, 16, 0};
  ASSERT_EQ(eng.create_qp(a, &qp), 0);
  EXPECT_EQ(a.cap.max_inline_data, kMaxInline);  // 16 x 16 = 256
  ASSERT_EQ(eng.destroy_qp(qp), 0);
  a.cap = {10, 5, 16, 16, 256};
  ASSERT_EQ(eng.create_qp(a, &qp), 0);
  EXPECT_GE(qp->qpn(), kFirstQpn);  // 0 and 1 are special QPs
  Qp *q2, *q3;
  ASSERT_EQ(eng.create_qp(a, &q2), 0);
  ASSERT_EQ(eng.create_qp(a, &q3), 0);
  EXPECT_EQ(eng.create_qp(a, &qp), ENOMEM);  // max_qp reached
  // The CQ and PD are held while QPs use them.
  EXPECT_EQ(dev.destroy_cq(cq), EBUSY);
  EXPECT_EQ(dev.dealloc_pd(pd), EBUSY);
  const uint32_t gone = q2->qpn();
  ASSERT_EQ(eng.destroy_qp(q2), 0);
  EXPECT_EQ(eng.find_qp(gone), nullptr);
  EXPECT_EQ(eng.qp_count(), 2u);
  ASSERT_EQ(eng.create_qp(a, &q2), 0);  // the slot comes back
}

// QPNs: a slot is reused only when the table is full, oldest freed first,
// and then with a new generation in the upper bits, so a stale packet of a
// destroyed QP finds no QP; the first QPNs come from the key seed, not a
// counter from 0x11.
TEST(TransportObjects, QpnsAreNotReusedSoonAndNotASequence) {
  DeviceConfig dc = small_device();
  dc.limits.max_qp = 16;
  Device dev(dc);
  NullIo io;
  Engine eng(dev, io);
  QpInitAttr a;
  ASSERT_NO_FATAL_FAILURE(small_qp(dev, &a));
  auto create = [&] {
    QpInitAttr c = a;
    Qp* qp = nullptr;
    EXPECT_EQ(eng.create_qp(c, &qp), 0);
    return qp;
  };
  // Connection after connection (create, destroy): every QPN differs, and
  // none is the old fixed first QPN.
  std::set<uint32_t> seen;
  std::vector<uint32_t> order;
  for (int i = 0; i < 2000; ++i) {
    Qp* qp = create();
    ASSERT_NE(qp, nullptr);
    const uint32_t qpn = qp->qpn();
    EXPECT_TRUE(seen.insert(qpn).second) << "QPN 0x" << std::hex << qpn;
    EXPECT_GT(qpn, 1u);
    EXPECT_LT(qpn, 0xffffffu);
    EXPECT_EQ(eng.find_qp(qpn), qp);
    order.push_back(qpn);
    ASSERT_EQ(eng.destroy_qp(qp), 0);
    EXPECT_EQ(eng.find_qp(qpn), nullptr);  // a stale QPN finds nothing
  }
  // Slots go round: the first 16 connections used 16 different slots.
  std::set<uint32_t> low;
  for (int i = 0; i < 16; ++i) low.insert(order[i] & 0xff);
  EXPECT_EQ(low.size(), 16u);
  // Not consecutive numbers either.
  int consecutive = 0;
  for (size_t i = 1; i < order.size(); ++i)
    consecutive += order[i] == order[i - 1] + 1;
  EXPECT_LT(consecutive, 20);
  // A live QP is found only by its exact QPN (its generation included).
  // (max_qp 16 + 17 reserved QPNs: 6 slot bits, 18 generation bits.)
  Qp* live = create();
  for (uint32_t g = 1; g < 8; ++g)
    EXPECT_EQ(eng.find_qp(live->qpn() ^ (g << 6)), nullptr);
  // Another seed, other QPNs (what a remote peer could not predict).
  DeviceConfig dc2 = dc;
  dc2.key_seed = 43;
  Device dev2(dc2);
  Engine eng2(dev2, io);
  Pd* pd2;
  Cq* cq2;
  ASSERT_EQ(dev2.alloc_pd(&pd2), 0);
  ASSERT_EQ(dev2.create_cq(16, &cq2), 0);
  QpInitAttr b = a;
  b.pd = pd2;
  b.send_cq = b.recv_cq = cq2;
  Qp* other;
  ASSERT_EQ(eng2.create_qp(b, &other), 0);
  EXPECT_NE(other->qpn(), order[0]);
}

// QPs spread over the engines of one device (one per worker lcore): the
// QPN says whose QP it is, each engine finds only its own, and max_qp
// holds for the device.
TEST(TransportObjects, EnginesOfOneDeviceSplitTheQpnSpace) {
  DeviceConfig dc = small_device();
  dc.limits.max_qp = 6;
  Device dev(dc);
  NullIo io;
  EngineConfig e0, e1;
  e0.homes = e1.homes = 2;
  e1.home = 1;
  Engine eng0(dev, io, e0), eng1(dev, io, e1);
  QpInitAttr a;
  ASSERT_NO_FATAL_FAILURE(small_qp(dev, &a));
  std::vector<Qp*> q0, q1;
  for (int i = 0; i < 3; ++i) {
    QpInitAttr c = a;
    Qp* qp;
    ASSERT_EQ(eng0.create_qp(c, &qp), 0);
    q0.push_back(qp);
    c = a;
    ASSERT_EQ(eng1.create_qp(c, &qp), 0);
    q1.push_back(qp);
  }
  Qp* none;
  QpInitAttr c = a;
  EXPECT_EQ(eng0.create_qp(c, &none), ENOMEM);  // 6 on the device
  c = a;
  EXPECT_EQ(eng1.create_qp(c, &none), ENOMEM);
  EXPECT_EQ(dev.qp_total(), 6u);
  std::set<uint32_t> qpns;
  for (Qp* qp : q0) {
    EXPECT_EQ(eng0.home_of(qp->qpn()), 0u);
    EXPECT_EQ(eng1.home_of(qp->qpn()), 0u);
    EXPECT_EQ(eng0.find_qp(qp->qpn()), qp);
    EXPECT_EQ(eng1.find_qp(qp->qpn()), nullptr);
    qpns.insert(qp->qpn());
  }
  for (Qp* qp : q1) {
    EXPECT_EQ(eng0.home_of(qp->qpn()), 1u);
    EXPECT_EQ(eng1.find_qp(qp->qpn()), qp);
    EXPECT_EQ(eng0.find_qp(qp->qpn()), nullptr);
    qpns.insert(qp->qpn());
  }
  EXPECT_EQ(qpns.size(), 6u);
  ASSERT_EQ(eng1.destroy_qp(q1[0]), 0);
  EXPECT_EQ(dev.qp_total(), 5u);
  c = a;
  EXPECT_EQ(eng0.create_qp(c, &none), 0);  // room again, on either
}

// QPs of two lcores complete into one CQ at once: every completion arrives
// once, each producer's in its order.
TEST(TransportObjects, CqTakesCompletionsFromTwoLcoresAtOnce) {
  Device dev(small_device());
  Cq* cq;
  ASSERT_EQ(dev.create_cq(256, &cq), 0);
  constexpr uint64_t kEach = 200'000;
  std::atomic<bool> failed{false};
  auto produce = [&](uint64_t who) {
    for (uint64_t i = 0; i < kEach; ++i) {
      while (cq->size() + 2 > cq->capacity()) std::this_thread::yield();
      ibv_wc wc{};
      wc.wr_id = who << 32 | i;
      if (!cq->push(wc, false)) {  // a (false) overflow: the CQ is in error
        ADD_FAILURE() << "push " << i << " of producer " << who << " failed";
        failed = true;
        return;
      }
    }
  };
  std::thread p0(produce, 0), p1(produce, 1);
  uint64_t next[2] = {0, 0};
  ibv_wc wc[32];
  // The consumer also checks that a failed producer ends the test rather
  // than leaving it to the harness's timeout.
  while (next[0] + next[1] < 2 * kEach && !failed) {
    const int n = cq->poll(wc);
    for (int i = 0; i < n; ++i) {
      const uint64_t who = wc[i].wr_id >> 32;
      EXPECT_LT(who, 2u);
      EXPECT_EQ(wc[i].wr_id & 0xffffffff, next[who & 1]);
      ++next[who & 1];
    }
  }
  p0.join();
  p1.join();
  ASSERT_FALSE(failed);
  EXPECT_EQ(cq->poll(wc), 0);
  EXPECT_FALSE(cq->in_error());
  EXPECT_EQ(cq->overflows(), 0u);
}

// Asynchronous events raised by two lcores at once: each arrives once, in
// its producer's order, or is counted as dropped (the ring is full).
TEST(TransportObjects, AsyncEventsFromTwoLcores) {
  Device dev(small_device());
  constexpr uint32_t kEach = 100'000;
  std::atomic<int> done{0};
  auto produce = [&](uint32_t who) {
    for (uint32_t i = 0; i < kEach; ++i)
      dev.raise({IBV_EVENT_QP_FATAL, who << 24 | i, nullptr, nullptr});
    done.fetch_add(1);
  };
  std::thread p0(produce, 0), p1(produce, 1);
  int64_t last[2] = {-1, -1};
  uint64_t got = 0;
  AsyncEvent ev;
  for (;;) {
    const bool finished = done.load() == 2;
    while (dev.next_event(&ev)) {
      const uint32_t who = ev.qpn >> 24, i = ev.qpn & 0xffffff;
      ASSERT_LT(who, 2u);
      ASSERT_GT(static_cast<int64_t>(i), last[who]);
      last[who] = i;
      ++got;
    }
    if (finished) break;
  }
  p0.join();
  p1.join();
  EXPECT_EQ(got + dev.events_dropped(), 2u * kEach);
  EXPECT_GT(got, 0u);
}

TEST(TransportObjects, CqPollAndNotify) {
  Device dev(small_device());
  Cq* cq;
  ASSERT_EQ(dev.create_cq(4, &cq), 0);
  EXPECT_EQ(dev.create_cq(0, &cq), EINVAL);
  ibv_wc wc{};
  cq->req_notify(true);  // solicited only
  wc.wr_id = 1;
  ASSERT_TRUE(cq->push(wc, false));
  EXPECT_EQ(cq->events(), 0u);  // not solicited: no event
  wc.wr_id = 2;
  ASSERT_TRUE(cq->push(wc, true));
  EXPECT_EQ(cq->events(), 1u);
  wc.wr_id = 3;
  ASSERT_TRUE(cq->push(wc, true));
  EXPECT_EQ(cq->events(), 1u);  // disarmed after one event
  ibv_wc out[8];
  ASSERT_EQ(cq->poll(out), 3);
  EXPECT_EQ(out[0].wr_id, 1u);
  EXPECT_EQ(out[2].wr_id, 3u);
  EXPECT_EQ(cq->poll(out), 0);
  // A completion in error is solicited (ibv_req_notify_cq(3)): a failed
  // send or a flush wakes a solicited-only waiter.
  cq->req_notify(true);
  wc.wr_id = 4;
  wc.status = IBV_WC_WR_FLUSH_ERR;
  ASSERT_TRUE(cq->push(wc, false));
  EXPECT_EQ(cq->events(), 2u);
  ASSERT_EQ(cq->poll(out), 1);
  EXPECT_EQ(out[0].status, IBV_WC_WR_FLUSH_ERR);
}

TEST(TransportObjects, CqResizeKeepsUnpolledCompletionsInOrder) {
  Device dev(small_device());
  Cq* cq;
  ASSERT_EQ(dev.create_cq(4, &cq), 0);
  ibv_wc wc{}, out[16];
  // Wrap the ring first, so the unpolled entries straddle its end.
  for (uint64_t id = 1; id <= 3; ++id) {
    wc.wr_id = id;
    ASSERT_TRUE(cq->push(wc, false));
  }
  ASSERT_EQ(cq->poll({out, 2}), 2);
  for (uint64_t id = 4; id <= 6; ++id) {
    wc.wr_id = id;
    ASSERT_TRUE(cq->push(wc, false));
  }
  ASSERT_EQ(cq->size(), 4u);                // full
  EXPECT_EQ(dev.resize_cq(cq, 3), EINVAL);  // 4 completions held
  EXPECT_EQ(dev.resize_cq(cq, 0), EINVAL);
  EXPECT_EQ(cq->capacity(), 4u);
  cq->req_notify(false);
  ASSERT_EQ(dev.resize_cq(cq, 12), 0);
  EXPECT_EQ(cq->capacity(), 12u);
  EXPECT_EQ(cq->size(), 4u);
  for (uint64_t id = 7; id <= 14; ++id) {  // 8 more: 12 held, none lost
    wc.wr_id = id;
    ASSERT_TRUE(cq->push(wc, false));
  }
  EXPECT_EQ(cq->events(), 1u);  // the arm survived the move
  EXPECT_FALSE(cq->in_error());
  ASSERT_EQ(cq->poll(out), 12);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(out[i].wr_id, 3u + i);
  // Shrinking to what it holds (nothing now) works too.
  ASSERT_EQ(dev.resize_cq(cq, 1), 0);
  wc.wr_id = 15;
  ASSERT_TRUE(cq->push(wc, false));
  ASSERT_EQ(cq->poll(out), 1);
  EXPECT_EQ(out[0].wr_id, 15u);
}

TEST(TransportObjects, SrqLimitEventFiresOnceWhenArmed) {
  Device dev(small_device());
  Pd* pd;
  Srq* srq;
  ASSERT_EQ(dev.alloc_pd(&pd), 0);
  ASSERT_EQ(dev.create_srq(pd, 8, 2, &srq), 0);
  RecvWr r;
  r.num_sge = 3;
  EXPECT_EQ(srq->post(r), EINVAL);  // more SGEs than max_sge
  r.num_sge = 1;
  for (int i = 0; i < 8; ++i) ASSERT_EQ(srq->post(r), 0);
  EXPECT_EQ(srq->post(r), ENOMEM);
  ibv_srq_attr at{};
  at.srq_limit = 9;
  EXPECT_EQ(dev.modify_srq(srq, at, IBV_SRQ_LIMIT), EINVAL);
  EXPECT_EQ(dev.modify_srq(srq, at, IBV_SRQ_MAX_WR), EINVAL);
  at.srq_limit = 6;
  ASSERT_EQ(dev.modify_srq(srq, at, IBV_SRQ_LIMIT), 0);
  RecvWr out;
  AsyncEvent ev;
  ASSERT_TRUE(srq->pop(out));  // 7 left
  ASSERT_TRUE(srq->pop(out));  // 6 left: not below the limit yet
  EXPECT_FALSE(dev.next_event(&ev));
  ASSERT_TRUE(srq->pop(out));  // 5 left: below 6
  ASSERT_TRUE(dev.next_event(&ev));
  EXPECT_EQ(ev.type, IBV_EVENT_SRQ_LIMIT_REACHED);
  EXPECT_EQ(ev.srq, srq);
  ASSERT_TRUE(srq->pop(out));
  EXPECT_FALSE(dev.next_event(&ev));  // disarmed
}

TEST(TransportObjects, AhNeedsGrhAndAResolvableGid) {
  Device dev(small_device());  // no resolver
  Pd* pd;
  ASSERT_EQ(dev.alloc_pd(&pd), 0);
  ibv_ah_attr a{};
  Ah* ah;
  EXPECT_EQ(dev.create_ah(pd, a, &ah), EINVAL);  // RoCE needs a GRH
  a.is_global = 1;
  wire::gid_from_ipv4(0x0a000002, a.grh.dgid.raw);
  EXPECT_EQ(dev.create_ah(pd, a, &ah), EHOSTUNREACH);
  a.grh.sgid_index = 1;
  EXPECT_EQ(dev.create_ah(pd, a, &ah), EINVAL);  // no such GID
  // Our own GID: loopback through our own MAC.
  a.grh.sgid_index = 0;
  wire::gid_from_ipv4(0x0a000001, a.grh.dgid.raw);
  ASSERT_EQ(dev.create_ah(pd, a, &ah), 0);
  EXPECT_EQ(ah->path().dmac, small_device().mac);
  EXPECT_EQ(ah->path().hop_limit, 64);
}

}  // namespace
}  // namespace urnic::transport

namespace urnic::transport {
namespace {

// Frames the engine sends come back to it: two QPs of one device talking
// through the device's own GID (the loopback the service does for two
// programs on one urnicd).
class LoopIo : public PacketIo {
 public:
  std::vector<std::vector<uint8_t>> q;
  uint32_t room = UINT32_MAX;  // frames accepted until refilled
  // Runs before the frame is copied (what the application may do to its
  // memory between the engine building a frame and the PMD taking it).
  std::function<void(const TxFrame&)> before_copy;
  bool transmit(const TxFrame& f) override {
    if (room == 0) return false;
    --room;
    if (before_copy) before_copy(f);
    std::vector<uint8_t> b(f.frame_len());
    f.copy_to(b.data());
    q.push_back(std::move(b));
    return true;
  }
};

struct Loopback : ::testing::Test {
  DeviceConfig dc = [] {
    DeviceConfig c = small_device();
    // GID 1: an IPv6 address (fd00::1), so packets use IPv6 headers.
    const uint8_t v6[16] = {0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    std::memcpy(c.gids[1], v6, 16);
    c.num_gids = 2;
    c.limits.gid_table_len = 2;
    return c;
  }();
  Device dev{dc};
  LoopIo io;
  Engine eng{dev, io};
  Pd* pd = nullptr;
  Cq* cq = nullptr;
  Mr* mr = nullptr;
  std::vector<uint8_t> mem = std::vector<uint8_t>(1 << 16);
  uint64_t now = 0;
  uint32_t ipv6_frames = 0;

  void SetUp() override {
    ASSERT_EQ(dev.alloc_pd(&pd), 0);
    ASSERT_EQ(dev.create_cq(64, &cq), 0);
    ASSERT_EQ(
        dev.reg_mr(pd, mem.data(), mem.size(),
                   reinterpret_cast<uint64_t>(mem.data()), kRemoteAll, &mr),
        0);
  }
  Qp* make(ibv_qp_type t) {
    QpInitAttr a;
    a.qp_type = t;
    a.pd = pd;
    a.send_cq = a.recv_cq = cq;
    a.cap = {16, 16, 2, 2, 64};
    Qp* qp = nullptr;
    EXPECT_EQ(eng.create_qp(a, &qp), 0);
    return qp;
  }
  ibv_ah_attr ah6() const {
    ibv_ah_attr a{};
    a.is_global = 1;
    a.port_num = 1;
    a.grh.sgid_index = 1;
    std::memcpy(a.grh.dgid.raw, dc.gids[1], 16);
    return a;
  }
  uint64_t va(uint32_t off) {
    return reinterpret_cast<uint64_t>(mem.data()) + off;
  }
  // A signaled WRITE or READ of `len` bytes between offsets of mem.
  SendWr rdma(uint64_t id, ibv_wr_opcode op, uint32_t local, uint32_t len,
              uint32_t remote) {
    SendWr w;
    w.wr_id = id;
    w.opcode = op;
    w.send_flags = IBV_SEND_SIGNALED;
    w.num_sge = 1;
    w.sg_list[0] = {va(local), len, mr->lkey()};
    w.remote_addr = va(remote);
    w.rkey = mr->rkey();
    return w;
  }
  void up_rc(Qp* qp, uint32_t peer, ibv_mtu mtu = IBV_MTU_1024,
             uint32_t psn = 7) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = kRemoteAll;
    ASSERT_EQ(eng.modify_qp(qp, a,
                            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                IBV_QP_ACCESS_FLAGS),
              0);
    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = mtu;
    a.dest_qp_num = peer;
    a.rq_psn = psn;
    a.max_dest_rd_atomic = 4;
    a.min_rnr_timer = 1;
    a.ah_attr = ah6();
    ASSERT_EQ(
        eng.modify_qp(qp, a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                          IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
        0);
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = psn;
    a.timeout = 10;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 4;
    ASSERT_EQ(eng.modify_qp(qp, a,
                            IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
                                IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                IBV_QP_MAX_QP_RD_ATOMIC),
              0);
  }
  void up_ud(Qp* qp) {  // qkey 0x1111
    ibv_qp_attr at{};
    at.qp_state = IBV_QPS_INIT;
    at.port_num = 1;
    at.qkey = 0x1111;
    ASSERT_EQ(eng.modify_qp(
                  qp, at,
                  IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY),
              0);
    at = {};
    at.qp_state = IBV_QPS_RTR;
    ASSERT_EQ(eng.modify_qp(qp, at, IBV_QP_STATE), 0);
    at.qp_state = IBV_QPS_RTS;
    at.sq_psn = 1;
    ASSERT_EQ(eng.modify_qp(qp, at, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
  }
  // Runs the loop until `n` completions are in; returns them.
  std::vector<ibv_wc> run(size_t n) {
    std::vector<ibv_wc> out;
    for (int i = 0; i < 10000 && out.size() < n; ++i) {
      now += 1000;
      eng.poll(now);
      auto frames = std::move(io.q);
      io.q.clear();
      for (auto& b : frames) {
        wire::FrameInfo fi;
        wire::decode(b.data(), static_cast<uint32_t>(b.size()), fi);
        EXPECT_EQ(fi.kind, wire::FrameKind::kRoce);
        if (fi.kind != wire::FrameKind::kRoce) continue;
        ipv6_frames += fi.roce.ipv6;
        const wire::ConstBuf seg{b.data(), static_cast<uint32_t>(b.size())};
        eng.rx(fi, {&seg, 1}, now);
      }
      ibv_wc wc[8];
      for (int k; (k = cq->poll(wc)) > 0;) out.insert(out.end(), wc, wc + k);
    }
    return out;
  }
};

TEST_F(Loopback, RcOverIpv6GidsWriteReadSend) {
  Qp* a = make(IBV_QPT_RC);
  Qp* b = make(IBV_QPT_RC);
  up_rc(a, b->qpn());
  up_rc(b, a->qpn());
  uint8_t* m = mem.data();
  for (uint32_t i = 0; i < 3000; ++i) m[i] = static_cast<uint8_t>(i * 7);
  RecvWr r;
  r.wr_id = 9;
  r.num_sge = 1;
  r.sg_list[0] = {va(0x8000), 4096, mr->lkey()};
  ASSERT_EQ(eng.post_recv(b, r), 0);
  SendWr w = rdma(1, IBV_WR_RDMA_WRITE, 0, 3000, 0x4000);
  ASSERT_EQ(eng.post_send(a, w), 0);
  w.wr_id = 2;
  w.opcode = IBV_WR_RDMA_READ;
  w.sg_list[0] = {va(0xc000), 3000, mr->lkey()};
  ASSERT_EQ(eng.post_send(a, w), 0);
  w.wr_id = 3;
  w.opcode = IBV_WR_SEND_WITH_IMM;
  w.imm_data = htonl(0x1234);
  w.sg_list[0] = {va(0), 100, mr->lkey()};
  ASSERT_EQ(eng.post_send(a, w), 0);
  auto wc = run(4);
  ASSERT_EQ(wc.size(), 4u);
  for (const ibv_wc& c : wc) EXPECT_EQ(c.status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(m + 0x4000, m, 3000), 0);  // WRITE landed
  EXPECT_EQ(std::memcmp(m + 0xc000, m, 3000), 0);  // READ brought it back
  EXPECT_EQ(std::memcmp(m + 0x8000, m, 100), 0);   // SEND payload
  bool recv_seen = false;
  for (const ibv_wc& c : wc) {
    if (c.opcode != IBV_WC_RECV) continue;
    recv_seen = true;
    EXPECT_EQ(c.wr_id, 9u);
    EXPECT_EQ(c.byte_len, 100u);
    EXPECT_EQ(ntohl(c.imm_data), 0x1234u);
    EXPECT_EQ(c.src_qp, a->qpn());
  }
  EXPECT_TRUE(recv_seen);
  EXPECT_GT(ipv6_frames, 5u);
}

// A PSN wider than 24 bits (lrand48() unmasked) is taken as its low 24
// bits, as rxe and mlx5 take it; query_qp reports those.
TEST_F(Loopback, PsnsWiderThan24BitsUseTheirLow24) {
  Qp* a = make(IBV_QPT_RC);
  Qp* b = make(IBV_QPT_RC);
  up_rc(a, b->qpn(), IBV_MTU_1024, 0x7ffffffe);
  up_rc(b, a->qpn(), IBV_MTU_1024, 0x7ffffffe);
  ibv_qp_attr q{};
  QpInitAttr init{};
  ASSERT_EQ(eng.query_qp(a, &q, &init), 0);
  EXPECT_EQ(q.sq_psn, 0xfffffeu);
  EXPECT_EQ(q.rq_psn, 0xfffffeu);
  // Across the 24-bit wrap: WRITE of 3 packets from PSN 0xfffffe.
  uint8_t* m = mem.data();
  for (uint32_t i = 0; i < 3000; ++i) m[i] = static_cast<uint8_t>(i * 3);
  ASSERT_EQ(eng.post_send(a, rdma(1, IBV_WR_RDMA_WRITE, 0, 3000, 0x4000)), 0);
  auto wc = run(1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(m + 0x4000, m, 3000), 0);
}

TEST_F(Loopback, UdOverIpv6CarriesTheIpv6HeaderAsGrh) {
  Qp* a = make(IBV_QPT_UD);
  Qp* b = make(IBV_QPT_UD);
  up_ud(a);
  up_ud(b);
  Ah* ah;
  ASSERT_EQ(dev.create_ah(pd, ah6(), &ah), 0);
  uint8_t* m = mem.data();
  for (uint32_t i = 0; i < 200; ++i) m[i] = static_cast<uint8_t>(i + 1);
  RecvWr r;
  r.wr_id = 5;
  r.num_sge = 1;
  r.sg_list[0] = {reinterpret_cast<uint64_t>(m) + 0x1000, 1024, mr->lkey()};
  ASSERT_EQ(eng.post_recv(b, r), 0);
  SendWr w;
  w.wr_id = 1;
  w.opcode = IBV_WR_SEND;
  w.send_flags = IBV_SEND_SIGNALED;
  w.num_sge = 1;
  w.sg_list[0] = {reinterpret_cast<uint64_t>(m), 200, mr->lkey()};
  w.ah = ah;
  w.remote_qpn = b->qpn();
  w.remote_qkey = 0x1111;
  ASSERT_EQ(eng.post_send(a, w), 0);
  auto wc = run(2);
  ASSERT_EQ(wc.size(), 2u);
  const ibv_wc* rc = wc[0].opcode == IBV_WC_RECV ? &wc[0] : &wc[1];
  EXPECT_EQ(rc->status, IBV_WC_SUCCESS);
  EXPECT_EQ(rc->byte_len, 200u + kGrhSize);
  EXPECT_TRUE(rc->wc_flags & IBV_WC_GRH);
  EXPECT_EQ(rc->src_qp, a->qpn());
  // The GRH slot holds the IPv6 header: version 6, next header UDP, our
  // GID as both source and destination (loopback).
  const uint8_t* grh = m + 0x1000;
  EXPECT_EQ(grh[0] >> 4, 6);
  EXPECT_EQ(grh[6], wire::kIpProtoUdp);
  EXPECT_EQ(std::memcmp(grh + 8, dc.gids[1], 16), 0);
  EXPECT_EQ(std::memcmp(grh + 24, dc.gids[1], 16), 0);
  EXPECT_EQ(std::memcmp(grh + kGrhSize, m, 200), 0);
}

// A payload the verbs contract lets change before the frame has left (a
// UD send, a READ response) carries the ICRC of the bytes the frame
// holds, whenever the memory changes: here after the engine built the
// frame and before the PacketIo copies it. A large one is summed as it is
// copied (TxFrame::unsealed), a small one copied by the engine; an RC
// request's payload is neither (stable: the application leaves it alone
// until the ACK, so zero-copy TX may reference it and the engine sums it).
TEST_F(Loopback, PayloadThatMayChangeCarriesTheIcrcOfWhatLeaves) {
  Qp* u = make(IBV_QPT_UD);
  Qp* v = make(IBV_QPT_UD);
  up_ud(u);
  up_ud(v);
  Qp* a = make(IBV_QPT_RC);
  Qp* b = make(IBV_QPT_RC);
  up_rc(a, b->qpn());
  up_rc(b, a->qpn());
  Ah* ah;
  ASSERT_EQ(dev.create_ah(pd, ah6(), &ah), 0);
  uint8_t* m = mem.data();
  for (uint32_t i = 0; i < 0x4000; ++i) m[i] = static_cast<uint8_t>(i);
  uint32_t unsealed = 0, sealed_unstable = 0, stable = 0;
  io.before_copy = [&](const TxFrame& f) {
    unsealed += f.unsealed != nullptr;
    sealed_unstable += !f.stable && !f.unsealed && !f.payload.empty();
    stable += f.stable && !f.payload.empty();
    if (f.stable) return;  // the verbs contract: unchanged until the ACK
    // Rewrite every payload byte the frame points at in our memory (the
    // small send's points at the engine's copy).
    for (const wire::ConstBuf& pc : f.payload)
      if (pc.data >= m && pc.data < m + 0x4000)
        for (uint32_t i = 0; i < pc.len; ++i)
          const_cast<uint8_t*>(pc.data)[i] ^= 0xa5;
  };
  RecvWr r;
  r.num_sge = 1;
  for (uint32_t i = 0; i < 2; ++i) {
    r.wr_id = 10 + i;
    r.sg_list[0] = {va(0x8000 + i * 0x800), 0x800, mr->lkey()};
    ASSERT_EQ(eng.post_recv(v, r), 0);
  }
  SendWr w;
  w.opcode = IBV_WR_SEND;
  w.send_flags = IBV_SEND_SIGNALED;
  w.ah = ah;
  w.remote_qpn = v->qpn();
  w.remote_qkey = 0x1111;
  w.wr_id = 1;
  w.num_sge = 2;  // two pieces, summed as copied
  w.sg_list[0] = {va(0), 600, mr->lkey()};
  w.sg_list[1] = {va(600), 400, mr->lkey()};
  ASSERT_EQ(eng.post_send(u, w), 0);
  w.wr_id = 2;
  w.num_sge = 1;
  w.sg_list[0] = {va(0x1000), 100, mr->lkey()};  // copied by the engine
  ASSERT_EQ(eng.post_send(u, w), 0);
  // READ of 3000 B: three 1 KiB responses of b's memory; WRITE of 2000 B:
  // two 1 KiB requests, stable.
  ASSERT_EQ(eng.post_send(a, rdma(3, IBV_WR_RDMA_READ, 0xc000, 3000, 0x2000)),
            0);
  ASSERT_EQ(eng.post_send(a, rdma(4, IBV_WR_RDMA_WRITE, 0x3000, 2000, 0x5000)),
            0);
  auto wc = run(6);
  ASSERT_EQ(wc.size(), 6u);
  for (const ibv_wc& c : wc) EXPECT_EQ(c.status, IBV_WC_SUCCESS) << c.wr_id;
  EXPECT_EQ(unsealed, 4u);         // the 1000 B send, 3 READ responses
  EXPECT_EQ(sealed_unstable, 1u);  // the 100 B send
  EXPECT_EQ(stable, 2u);           // the WRITE's (a READ request has none)
  EXPECT_EQ(std::memcmp(m + 0x5000, m + 0x3000, 2000), 0);
  // What arrived is what the memory held when each frame was copied: by
  // the PacketIo (rewritten), by the engine for the small send (not).
  for (uint32_t i = 0; i < 1000; ++i)
    ASSERT_EQ(m[0x8000 + kGrhSize + i], static_cast<uint8_t>(i ^ 0xa5)) << i;
  for (uint32_t i = 0; i < 100; ++i)
    ASSERT_EQ(m[0x8800 + kGrhSize + i], static_cast<uint8_t>(0x1000 + i)) << i;
  for (uint32_t i = 0; i < 3000; ++i)
    ASSERT_EQ(m[0xc000 + i], static_cast<uint8_t>((0x2000 + i) ^ 0xa5)) << i;
}

// A bulk sender cannot hold a congested port: with TX accepting one frame
// per poll, a 16-byte SEND on another QP leaves within one byte quantum of
// the bulk QP's frames, not after its whole 256 KiB message.
TEST_F(Loopback, FullTxIsSharedRoundRobinByBytes) {
  Qp* a1 = make(IBV_QPT_RC);
  Qp* a2 = make(IBV_QPT_RC);
  Qp* b1 = make(IBV_QPT_RC);
  Qp* b2 = make(IBV_QPT_RC);
  up_rc(a1, b1->qpn());
  up_rc(b1, a1->qpn());
  up_rc(a2, b2->qpn());
  up_rc(b2, a2->qpn());
  const uint64_t base = reinterpret_cast<uint64_t>(mem.data());
  SendWr w;
  w.wr_id = 1;
  w.opcode = IBV_WR_RDMA_WRITE;
  w.num_sge = 1;
  w.sg_list[0] = {base, 1 << 15, mr->lkey()};
  w.remote_addr = base + (1 << 15);
  w.rkey = mr->rkey();
  for (int i = 0; i < 8; ++i) ASSERT_EQ(eng.post_send(a1, w), 0);  // 256 KiB
  SendWr s;
  s.wr_id = 2;
  s.opcode = IBV_WR_RDMA_WRITE;
  s.num_sge = 1;
  s.sg_list[0] = {base, 16, mr->lkey()};
  s.remote_addr = base + 100;
  s.rkey = mr->rkey();
  ASSERT_EQ(eng.post_send(a2, s), 0);
  // Expect: the small WRITE from a2 leaves within tx_quantum (32 KiB by
  // default) of a1's 1 KiB frames, one frame per poll: by about the 31st
  // (the quantum counts whole frames), not after a1's 256.
  int polls = 0;
  bool seen = false;
  while (!seen && polls < 400) {
    io.room = 1;
    now += 1000;
    eng.poll(now);
    ++polls;
    for (auto& b : io.q) {
      wire::FrameInfo fi;
      wire::decode(b.data(), static_cast<uint32_t>(b.size()), fi);
      seen |= fi.kind == wire::FrameKind::kRoce && fi.roce.dqpn == b2->qpn();
    }
    io.q.clear();
  }
  EXPECT_TRUE(seen);
  const int turn = static_cast<int>(eng.config().tx_quantum / 1024);
  EXPECT_LE(polls, turn + 4) << "the small WRITE waited behind the bulk sender";
}

// A 2 GiB message is 2^23 packets at MTU 256: more than the PSN comparison
// window can track, so it is refused at post time; at MTU 1024 it fits.
TEST_F(Loopback, MessageLongerThanHalfThePsnWindowIsRefused) {
  Qp* a = make(IBV_QPT_RC);
  Qp* b = make(IBV_QPT_RC);
  Qp* c = make(IBV_QPT_RC);
  up_rc(a, b->qpn(), IBV_MTU_256);
  up_rc(c, b->qpn(), IBV_MTU_1024);
  SendWr w;
  w.opcode = IBV_WR_RDMA_READ;
  w.num_sge = 1;
  w.sg_list[0] = {reinterpret_cast<uint64_t>(mem.data()), 0x80000000u,
                  mr->lkey()};
  w.remote_addr = 0x1000;
  w.rkey = mr->rkey();
  EXPECT_EQ(eng.post_send(a, w), EINVAL);
  EXPECT_EQ(eng.post_send(c, w), 0);
}

}  // namespace
}  // namespace urnic::transport
