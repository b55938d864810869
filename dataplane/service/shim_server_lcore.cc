// The service side of the verbs shim, lcore half: each worker serves the
// doorbells of the QPs and SRQs homed on it and hands their new WQEs to its
// engine (shim_server.h has the threads; shim_server.cc the control
// thread's half). Never allocates; reads the application's rings only
// through copies and clamped indices.
#include <bit>
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "dataplane/service/shim_server.h"

namespace urnic::service {

using namespace urnic::shim;

namespace {

constexpr uint32_t kSendFlagsKnown =
    IBV_SEND_FENCE | IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_INLINE;

// A WQE slot's fixed part, before its SGEs (or inline bytes).
constexpr size_t kSendHead = offsetof(ShmSendWqe, sge);
constexpr size_t kRecvHead = offsetof(ShmRecvWqe, sge);
static_assert(kSendHead == 80 && kRecvHead == 16);
// SGEs are copied from a slot into the engine's type byte for byte.
static_assert(sizeof(ShmSge) == sizeof(transport::Sge) &&
              offsetof(ShmSge, addr) == offsetof(transport::Sge, addr) &&
              offsetof(ShmSge, length) == offsetof(transport::Sge, length) &&
              offsetof(ShmSge, lkey) == offsetof(transport::Sge, lkey));
static_assert(std::is_trivially_copyable_v<transport::Sge>);

}  // namespace

uint32_t ShimServer::doorbells_st(uint32_t home, uint32_t* rung) {
  uint32_t mine = 0;  // this home's summary words, as pending bits
  for (uint32_t j = home; j < kSummaryWords; j += homes()) mine |= 1u << j;
  const std::vector<Target>* targets = nullptr;
  uint32_t taken = 0;
  for (Client* c : live_) {
    DoorbellPage& db = *c->db;
    if (!(db.pending.load(std::memory_order_relaxed) & mine)) continue;
    uint32_t words = db.pending.fetch_and(~mine, std::memory_order_acquire);
    words &= mine;
    if (!words) continue;
    ctr_.doorbells.fetch_add(1, std::memory_order_relaxed);
    targets = &c->targets[home];
    while (words) {
      const uint32_t s = static_cast<uint32_t>(std::countr_zero(words));
      words &= words - 1;
      uint64_t sum = db.summary[s].exchange(0, std::memory_order_acquire);
      while (sum) {
        const uint32_t w = s * 64 + std::countr_zero(sum);
        sum &= sum - 1;
        uint64_t bits = db.bits[w].exchange(0, std::memory_order_acquire);
        while (bits) {
          const uint32_t idx = w * 64 + std::countr_zero(bits);
          bits &= bits - 1;
          const uint32_t local = db_local(idx, homes());
          if (local >= targets->size()) continue;  // never handed out
          ++*rung;
          const Target& t = (*targets)[local];
          if (t.qp) drain_qp_st(*c, *t.qp, &taken);
          if (t.srq) drain_srq_st(*t.srq, &taken);
        }
      }
    }
  }
  return taken;
}

void ShimServer::set_waiting_st(uint32_t home, bool waiting) {
  const uint32_t bit = 1u << home;
  for (Client* c : live_) {
    if (waiting)
      c->db->waiting.fetch_or(bit, std::memory_order_seq_cst);
    else
      c->db->waiting.fetch_and(~bit, std::memory_order_relaxed);
  }
}

namespace {

// The application wrote the slots on another core: each WQE's first read
// waited for its cache lines (half of drain_qp_st's samples in a 64 B
// WRITE profile). Fetching a few slots ahead overlaps those waits.
constexpr uint32_t kPrefetchAhead = 4;

template <typename Slot>
void prefetch_slot(const Slot* ring, uint32_t size, uint32_t i) {
  const auto* p = reinterpret_cast<const char*>(&ring[i & (size - 1)]);
  // The head and the first SGEs: what every WQE reads. The builtin, not
  // rte_prefetch0: this file builds without DPDK (fuzz_shim).
  __builtin_prefetch(p, 0, 3);
  __builtin_prefetch(p + 64, 0, 3);
  __builtin_prefetch(p + 127, 0, 3);
}

}  // namespace

// Receive WQEs first: a SEND in the same burst finds its buffer.
bool ShimServer::drain_qp_st(Client& c, QpObj& q, uint32_t* taken) {
  if (!drain_rq_st(q, taken)) return false;
  transport::Engine& eng = *env_.engines[q.home];
  transport::Qp* qp = q.qp;
  uint64_t bad = 0;

  const uint32_t sprod = q.sh->sq_prod.load(std::memory_order_acquire);
  if (sprod - q.sq_seen > q.sq_size) {
    q.broken = true;
    ctr_.bad_wqes.fetch_add(1, std::memory_order_relaxed);
    eng.to_error(*qp);
    return false;
  }
  for (uint32_t i = 0; i < kPrefetchAhead && q.sq_seen + i != sprod; ++i)
    prefetch_slot(q.sq, q.sq_size, q.sq_seen + i);
  for (; q.sq_seen != sprod; ++q.sq_seen) {
    if (sprod - q.sq_seen > kPrefetchAhead)
      prefetch_slot(q.sq, q.sq_size, q.sq_seen + kPrefetchAhead);
    // The head (80 B) first; SGEs only as many as it says, straight into
    // what the engine takes (it copies them once more, into the QP).
    const ShmSendWqe& slot = q.sq[q.sq_seen & (q.sq_size - 1)];
    ShmSendWqe w;
    std::memcpy(&w, &slot, kSendHead);
    transport::SendWrHead wr;
    transport::Sge sges[kMaxSge];
    wr.wr_id = w.wr_id;
    // An opcode the enum does not hold is never converted to it (UBSan).
    bool ok = w.opcode <= IBV_WR_SEND_WITH_INV ||  // through SEND_WITH_INV
              w.opcode == IBV_WR_ATOMIC_WRITE;
    wr.opcode = ok ? static_cast<ibv_wr_opcode>(w.opcode) : IBV_WR_SEND;
    wr.send_flags = w.send_flags & kSendFlagsKnown;
    wr.imm_data = w.imm_data;
    wr.remote_addr = w.remote_addr;
    wr.rkey = w.rkey;
    wr.compare_add = w.compare_add;
    wr.swap = w.swap;
    wr.remote_qpn = w.remote_qpn & 0xffffff;
    wr.remote_qkey = w.remote_qkey;
    if (ok && wr.opcode == IBV_WR_BIND_MW) {
      // abi.h: which window, its new rkey, the MR, range and rights.
      wr.bind = {w.imm_data,    w.rkey,
                 w.bind_lkey,   static_cast<uint32_t>(w.swap),
                 w.remote_addr, w.compare_add};
      ok = ok && w.num_sge == 0 && !(wr.send_flags & IBV_SEND_INLINE);
    }
    if (wr.send_flags & IBV_SEND_INLINE) {
      // The engine copies the inline bytes at post time, once, from the
      // slot itself: they are payload, nothing the service interprets, and
      // the slot stays the application's own until the WQE retires.
      ok = ok && w.inline_len <= kMaxInline;
      wr.num_sge = 1;
      sges[0] = {reinterpret_cast<uint64_t>(slot.inline_data), w.inline_len, 0};
    } else {
      ok = ok && w.num_sge <= kMaxSge;
      wr.num_sge = ok ? w.num_sge : 0;
      std::memcpy(sges, slot.sge, wr.num_sge * sizeof(ShmSge));
    }
    if (ok && qp->type() == IBV_QPT_UD) {
      auto it = c.ahs.find(w.ah);
      ok = it != c.ahs.end() && it->second.pd == q.pd;
      if (ok) wr.ah = it->second.ah;
    }
    const int rc = ok ? eng.post_send(qp, wr, sges) : EINVAL;
    if (rc) {
      ++bad;
      eng.fail_unposted_send(qp, w.wr_id, ok ? wr.opcode : IBV_WR_SEND,
                             IBV_WC_LOC_QP_OP_ERR);
    }
    ++*taken;
  }
  if (bad) ctr_.bad_wqes.fetch_add(bad, std::memory_order_relaxed);
  return true;
}

bool ShimServer::drain_rq_st(QpObj& q, uint32_t* taken) {
  if (q.broken) return false;
  transport::Engine& eng = *env_.engines[q.home];
  transport::Qp* qp = q.qp;
  uint64_t bad = 0;
  const uint32_t rprod = q.sh->rq_prod.load(std::memory_order_acquire);
  if (rprod - q.rq_seen > q.rq_size) {
    q.broken = true;  // an index no correct producer can write
    ctr_.bad_wqes.fetch_add(1, std::memory_order_relaxed);
    eng.to_error(*qp);
    return false;
  }
  for (uint32_t i = 0; i < kPrefetchAhead && q.rq_seen + i != rprod; ++i)
    prefetch_slot(q.rq, q.rq_size, q.rq_seen + i);
  for (; q.rq_seen != rprod; ++q.rq_seen) {
    if (rprod - q.rq_seen > kPrefetchAhead)
      prefetch_slot(q.rq, q.rq_size, q.rq_seen + kPrefetchAhead);
    // Each byte of the slot is read once: the head, then as many SGEs as
    // the copied head says (bounded), then validated from the copies.
    const ShmRecvWqe& slot = q.rq[q.rq_seen & (q.rq_size - 1)];
    ShmRecvWqe w;
    std::memcpy(&w, &slot, kRecvHead);
    transport::Sge sges[kMaxSge];
    int rc = EINVAL;
    if (w.num_sge <= kMaxSge) {
      std::memcpy(sges, slot.sge, w.num_sge * sizeof(ShmSge));
      rc = eng.post_recv(qp, w.wr_id, w.num_sge, sges);
    }
    if (rc) {
      ++bad;
      eng.fail_unposted_recv(qp, w.wr_id, IBV_WC_LOC_QP_OP_ERR);
    }
    ++*taken;
  }
  if (bad) ctr_.bad_wqes.fetch_add(bad, std::memory_order_relaxed);
  return true;
}

// The responder found the queue empty (transport::RecvSource, counted
// there): what the application posted since the lcore last served its
// doorbell. The bit stays rung; serving it later finds nothing new.
bool ShimServer::refill(transport::Qp& qp) {
  auto* q = static_cast<QpObj*>(qp.recv_ring_);
  uint32_t taken = 0;
  return q && drain_rq_st(*q, &taken) && taken;
}

bool ShimServer::refill(transport::Srq& srq) {
  auto* s = static_cast<SrqObj*>(srq.recv_ring());
  uint32_t taken = 0;
  return s && drain_srq_st(*s, &taken) && taken;
}

bool ShimServer::drain_srq_st(SrqObj& s, uint32_t* taken) {
  if (s.broken) return false;
  const uint32_t prod = s.sh->prod.load(std::memory_order_acquire);
  if (prod - s.seen > s.size) {
    s.broken = true;
    ctr_.bad_wqes.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  for (; s.seen != prod; ++s.seen) {
    const ShmRecvWqe& slot = s.ring[s.seen & (s.size - 1)];
    ShmRecvWqe w;
    std::memcpy(&w, &slot, kRecvHead);
    transport::RecvWr wr;
    wr.wr_id = w.wr_id;
    // A WQE the SRQ refuses still takes its slot (as an empty receive), so
    // the application's ring keeps counting.
    wr.num_sge = w.num_sge <= s.srq->max_sge() ? w.num_sge : 0;
    if (wr.num_sge != w.num_sge)
      ctr_.bad_wqes.fetch_add(1, std::memory_order_relaxed);
    std::memcpy(wr.sg_list, slot.sge, wr.num_sge * sizeof(ShmSge));
    s.srq->post(wr);
    ++*taken;
  }
  return true;
}

}  // namespace urnic::service
