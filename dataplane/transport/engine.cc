// Engine: QP lifetime and attributes (ibv_create/modify/query/destroy_qp),
// posting, packet dispatch to the roles, the poll loop, and the helpers the
// roles share (packet encoding, completions, error flush).
#include "dataplane/transport/engine.h"

#include <arpa/inet.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>

#include "dataplane/transport/psn.h"
#include "dataplane/transport/qp_attr.h"
#include "dataplane/transport/roles.h"

namespace urnic::transport {

const char* const kECtrNames[kNumECtr] = {
#define URNIC_ECTR_NAME(n) #n,
    URNIC_ENGINE_COUNTERS(URNIC_ECTR_NAME)
#undef URNIC_ECTR_NAME
};

namespace {

uint32_t ring_size(uint32_t n) {
  return std::bit_ceil(n ? n : 1u);
}

ibv_wc_opcode wc_opcode(ibv_wr_opcode op) {
  switch (op) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      return IBV_WC_RDMA_WRITE;
    case IBV_WR_RDMA_READ:
      return IBV_WC_RDMA_READ;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
      return IBV_WC_COMP_SWAP;
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      return IBV_WC_FETCH_ADD;
    case IBV_WR_ATOMIC_WRITE:
      return IBV_WC_ATOMIC_WRITE;
    case IBV_WR_BIND_MW:
      return IBV_WC_BIND_MW;
    case IBV_WR_LOCAL_INV:
      return IBV_WC_LOCAL_INV;
    default:
      return IBV_WC_SEND;  // SEND, SEND_WITH_IMM, SEND_WITH_INV
  }
}

}  // namespace

Engine::Engine(Device& dev, PacketIo& io, const EngineConfig& cfg,
               uint64_t now_ns)
    : dev_(dev),
      io_(io),
      cfg_(cfg),
      timers_(now_ns, cfg.timer_tick_ns),
      now_(now_ns) {
  if (cfg_.ack_req_every == 0) cfg_.ack_req_every = 1;
  if (cfg_.max_unacked == 0) cfg_.max_unacked = 1;
  if (cfg_.tx_budget == 0) cfg_.tx_budget = 1;
  if (cfg_.tx_quantum == 0) cfg_.tx_quantum = 1;
  if (cfg_.homes == 0) cfg_.homes = 1;
  if (cfg_.home >= cfg_.homes) cfg_.home = cfg_.homes - 1;
  cfg_.cc.max_window = cfg_.max_unacked;
  cc_shared_.reset(cfg_.cc);
  // Slot numbers need room for max_qp slots above the reserved QPNs; what
  // is left of the 24 bits tags each reuse of a slot.
  // Every engine may hold max_qp QPs (QPs on an SRQ go where the SRQ is).
  qpn_slot_bits_ = static_cast<uint32_t>(
      std::bit_width(uint64_t{dev_.limits().max_qp} * cfg_.homes + kFirstQpn));
  qpn_slot_bits_ = std::clamp(qpn_slot_bits_, 8u, 24u);
  uint64_t seed = dev_.config().key_seed;
  if (seed == 0) {
    std::random_device rd;
    seed = uint64_t{rd()} << 32 | rd();
  }
  // Each engine of a device draws its own generations.
  qpn_rng_.seed(static_cast<uint32_t>(seed ^ (seed >> 32) ^ 0x51ed2701u ^
                                      (cfg_.home * 0x9e3779b9u)));
}

void Engine::cc_sync(Qp& qp) {
  int32_t out = 0;
  if (qp.type_ == IBV_QPT_RC &&
      (qp.state_ == IBV_QPS_RTS || qp.state_ == IBV_QPS_SQD))
    out = std::max(psn_diff(qp.req_.psn, qp.comp_.psn), 0);
  else
    cc_release(qp);
  const auto now = static_cast<uint32_t>(out);
  if (now == qp.cc_out_) return;
  if (qp.cc_out_ == 0) ++cc_active_;
  if (now == 0) --cc_active_;
  const bool drained = now < qp.cc_out_;
  cc_in_flight_ = cc_in_flight_ + now - qp.cc_out_;
  qp.cc_out_ = now;
  if (drained && !cc_wait_.empty()) cc_wake();
}

bool Engine::cc_may_send(Qp& qp, int32_t out) {
  if (!cfg_.cc.window || cfg_.cc.grant == 0) return true;
  if (out > 0) {
    // Sending already. Past its grant it also needs room in the shared
    // window (the share, limit / QPs in flight, shrinks as QPs are
    // admitted, while what the older ones have in flight drains only with
    // their ACKs); after kGrantBursts grants while others wait its turn
    // ends, and it queues again once drained. Either way the last packet
    // before the stop asks for an ACK (cc_turn_ends), else one more goes
    // that does: an unanswered tail would wait for a probe. Its ACKs make
    // it ready again.
    if (qp.req_.pkts_since_ackreq != 0) return true;
    const CcTurns t = cc_turns();
    if (static_cast<uint32_t>(out) >= t.grant && t.committed >= t.limit)
      return false;
    return cc_wait_.empty() || qp.cc_burst_ < t.grant * CcParams::kGrantBursts;
  }
  if (qp.cc_admitted_) return true;  // the requester takes the grant once sent
  if (!cc_wait_.empty() || !cc_admissible()) {
    if (!qp.cc_wait_link_.on) {
      ctr_.inc(ECtr::cc_grant_waits);
      cc_wait_.push_back(qp);
      ++cc_waiting_;
    }
    // Someone in flight or granted wakes the queue; with no one, now.
    if (cc_active_ + cc_granted_ == 0) cc_wake();
    return false;
  }
  return true;
}

bool Engine::cc_admissible() const {
  if (cc_active_ + cc_granted_ == 0) return true;  // someone has to go
  // Room for a grant; or, while no more than the limit is committed, fewer
  // QPs sending than the limit holds grants: a QP whose peer went silent
  // keeps its packets counted until its timeout (for ever with timeout 0)
  // and must not hold up the others' turns. In flight stays within the
  // limit plus one grant.
  const CcTurns t = cc_turns();
  return t.committed + t.grant <= t.limit ||
         (t.committed <= t.limit &&
          (uint64_t{cc_active_} + cc_granted_ + 1) * t.grant <= t.limit);
}

// Grants go in queue order while the head is admissible.
void Engine::cc_wake() {
  while (!cc_wait_.empty() && cc_admissible()) {
    Qp* qp = cc_wait_.pop_front();
    --cc_waiting_;
    qp->cc_admitted_ = true;
    ++cc_granted_;
    make_ready(*qp);
  }
}

void Engine::cc_release(Qp& qp) {
  if (qp.cc_wait_link_.on) {
    cc_wait_.remove(qp);  // O(queue): off the packet path (state changes)
    --cc_waiting_;
  }
  if (!qp.cc_admitted_) return;
  qp.cc_admitted_ = false;
  --cc_granted_;
  if (!cc_wait_.empty()) cc_wake();
}

uint32_t Engine::cc_window(const Qp& qp) const {
  if (!cfg_.cc.window) return cfg_.max_unacked;
  // This QP counts among the active ones once it has a packet in flight.
  const uint32_t active = cc_active_ + (qp.cc_out_ ? 0 : 1);
  // With grants the QPs in flight divide what grants fill (cc_limit).
  const uint64_t share = cc_shared_.share(
      active, std::max(cfg_.cc.min_window, 1u), cfg_.cc.grant ? cc_limit() : 0);
  return static_cast<uint32_t>(std::min<uint64_t>(qp.cc_.window(), share));
}

void Engine::send_cnp(Qp& qp) {
  if (!cfg_.cc.ecn || qp.type_ == IBV_QPT_UD) return;
  if (qp.cnp_sent_ && now_ - qp.cnp_sent_ns_ < cfg_.cc.cnp_interval_ns) return;
  // Annex A17.9.3: opcode CNP, the flow's source QP as DestQP, BECN set,
  // 16 reserved bytes; sent not ECN-capable (it must not be marked itself).
  wire::RoceFields f = qp.tmpl_;
  f.opcode = wire::opcode::kCnp;
  f.psn = 0;
  f.becn = true;
  f.ack_req = false;
  f.payload_len = 0;
  f.tclass &= 0xfc;
  // Sent from the receive path: it must not end the current transmit turn.
  const bool refused = tx_refused_;
  const int64_t turn = turn_left_;
  if (send_packet(qp, f, {})) {  // refused: the next CE mark tries again
    qp.cnp_sent_ = true;
    qp.cnp_sent_ns_ = now_;
    ctr_.inc(ECtr::cnps_tx);
    ++qp.ctr_.cnps_tx;
  }
  tx_refused_ = refused;
  turn_left_ = turn;
}

uint32_t Engine::make_qpn(uint32_t slot) const {
  const uint32_t gen_mask = (1u << (24 - qpn_slot_bits_)) - 1;
  return (slot_gen_[slot] & gen_mask) << qpn_slot_bits_ |
         (kFirstQpn + slot * cfg_.homes + cfg_.home);
}

Engine::~Engine() {
  for (auto& q : qps_) {
    if (q) cancel_timers(*q);
  }
}

// --- control path ---------------------------------------------------------

int Engine::create_qp(QpInitAttr& a, Qp** out) {
  const Limits& lim = dev_.limits();
  if (a.qp_type != IBV_QPT_RC && a.qp_type != IBV_QPT_UC &&
      a.qp_type != IBV_QPT_UD)
    return EINVAL;
  if (!a.pd || !a.send_cq || !a.recv_cq) return EINVAL;
  if (a.srq && a.srq->pd() != a.pd) return EINVAL;
  ibv_qp_cap& c = a.cap;
  if (c.max_send_wr > lim.max_qp_wr || c.max_send_sge > lim.max_sge ||
      c.max_inline_data > lim.max_inline)
    return EINVAL;
  if (!a.srq && (c.max_recv_wr > lim.max_qp_wr || c.max_recv_sge > lim.max_sge))
    return EINVAL;
  // The device's count includes this engine's QPs.
  if (dev_.qp_total() >= lim.max_qp) return ENOMEM;

  // A new slot while the table may still grow (and the slot fits the QPN's
  // 24 bits: config keeps max_qp x workers within 2^20, so only a bare
  // engine meets this), else the slot freed longest ago (cyclic reuse),
  // with its next generation.
  const auto fresh = static_cast<uint32_t>(qps_.size());
  const bool fits =
      kFirstQpn + uint64_t{fresh} * cfg_.homes + cfg_.home < (1u << 24);
  uint32_t idx;
  if (fits && (fresh < lim.max_qp || free_qp_.empty())) {
    idx = fresh;
    qps_.emplace_back();
    slot_gen_.push_back(qpn_rng_());
  } else if (!free_qp_.empty()) {
    idx = free_qp_.front();
    free_qp_.pop_front();
    ++slot_gen_[idx];
  } else {
    return ENOMEM;
  }
  // 0xffffff addresses multicast groups: never a QP's own number.
  if (make_qpn(idx) == 0xffffff) ++slot_gen_[idx];
  auto qp = std::make_unique<Qp>();
  qp->index_ = idx;
  qp->qpn_ = make_qpn(idx);
  qp->type_ = a.qp_type;
  qp->pd_ = a.pd;
  qp->send_cq_ = a.send_cq;
  qp->recv_cq_ = a.recv_cq;
  qp->srq_ = a.srq;
  qp->sq_sig_all_ = a.sq_sig_all;
  qp->block_mcast_lb_ = a.block_self_mcast_lb;
  c.max_send_wr = ring_size(c.max_send_wr);
  c.max_send_sge = c.max_send_sge ? c.max_send_sge : 1;
  // Inline room of at least what the WQE's gather list takes (an ibv_sge
  // per SGE), as rxe and mlx5 size it: ibv_create_qp(3) grants caps >= the
  // request, and programs post small inline sends on a QP created with
  // max_inline_data 0 (rdmacm-utils' rdma_xclient: 16 bytes).
  c.max_inline_data = std::min<uint32_t>(
      lim.max_inline,
      std::max<uint32_t>(c.max_inline_data, c.max_send_sge * sizeof(ibv_sge)));
  qp->sq_.resize(c.max_send_wr);
  qp->sq_mask_ = c.max_send_wr - 1;
  // Per-WQE room from the caps: SGEs, their resolution, inline bytes.
  qp->sq_sge_.resize(size_t{c.max_send_wr} * c.max_send_sge);
  qp->sq_host_.resize(size_t{c.max_send_wr} * c.max_send_sge);
  qp->sq_inline_.resize(size_t{c.max_send_wr} * c.max_inline_data);
  if (a.qp_type == IBV_QPT_UD) qp->sq_av_.resize(c.max_send_wr);
  for (uint32_t i = 0; i < c.max_send_wr; ++i) {
    SendWqe& w = qp->sq_[i];
    w.sge = &qp->sq_sge_[size_t{i} * c.max_send_sge];
    w.host_sg = &qp->sq_host_[size_t{i} * c.max_send_sge];
    w.inline_data = c.max_inline_data
                        ? &qp->sq_inline_[size_t{i} * c.max_inline_data]
                        : nullptr;
  }
  if (a.srq) {
    c.max_recv_wr = 0;
    c.max_recv_sge = 0;
  } else {
    c.max_recv_wr = ring_size(c.max_recv_wr);
    c.max_recv_sge = c.max_recv_sge ? c.max_recv_sge : 1;
    qp->rq_.resize(c.max_recv_wr);
    qp->rq_mask_ = c.max_recv_wr - 1;
    qp->rq_sge_.resize(size_t{c.max_recv_wr} * c.max_recv_sge);
    for (uint32_t i = 0; i < c.max_recv_wr; ++i)
      qp->rq_[i].sge = &qp->rq_sge_[size_t{i} * c.max_recv_sge];
  }
  qp->cap_ = c;
  // RoCEv2 UDP source port: per-QP entropy for ECMP (Annex A17.4.2.1).
  qp->udp_sport_ = static_cast<uint16_t>(cfg_.udp_sport_base |
                                         ((qp->qpn_ * 0x9e37u) & 0x3fff));
  qp->retrans_timer_.owner = qp.get();
  qp->retrans_timer_.kind = kRetransTimer;
  qp->rnr_timer_.owner = qp.get();
  qp->rnr_timer_.kind = kRnrTimer;
  qp->pace_timer_.owner = qp.get();
  qp->pace_timer_.kind = kPaceTimer;
  qp->probe_timer_.owner = qp.get();
  qp->probe_timer_.kind = kProbeTimer;
  qp->res_.resize(1);
  qp->size_rd_reqs();
  Device::hold(a.pd);
  Device::hold(a.send_cq);
  Device::hold(a.recv_cq);
  if (a.srq) Device::hold(a.srq);
  *out = qp.get();
  qps_[idx] = std::move(qp);
  ++nqp_;
  dev_.count_qp(1);
  return 0;
}

Qp* Engine::find_qp(uint32_t qpn) const {
  const uint32_t low = qpn & ((1u << qpn_slot_bits_) - 1);
  if (low < kFirstQpn || (low - kFirstQpn) % cfg_.homes != cfg_.home)
    return nullptr;  // another engine's
  const uint32_t idx = (low - kFirstQpn) / cfg_.homes;
  if (idx >= qps_.size()) return nullptr;
  Qp* qp = qps_[idx].get();
  return qp && qp->qpn_ == qpn ? qp : nullptr;  // a stale generation: none
}

int Engine::attach_mcast(Qp* qp, const uint8_t gid[16], const char** why) {
  auto fail = [why](const char* w, int err) {
    if (why != nullptr) *why = w;
    return err;
  };
  if (!qp || find_qp(qp->qpn_) != qp) return EINVAL;
  if (qp->type_ != IBV_QPT_UD)
    return fail("only UD QPs join multicast groups (IBTA 10.5.2)", EINVAL);
  if (!wire::gid_is_multicast(gid))
    return fail("not a multicast GID (224.0.0.0/4 or ff00::/8)", EINVAL);
  const Gid g = to_gid(gid);
  std::vector<Qp*>& m = mcast_[g];
  if (std::find(m.begin(), m.end(), qp) != m.end()) return 0;  // as rxe
  if (const int rc = dev_.mcast_join(g)) {
    if (m.empty()) mcast_.erase(g);
    return fail(
        "multicast limit reached (max_mcast_grp, max_mcast_qp_attach or "
        "max_total_mcast_qp_attach)",
        rc);
  }
  m.push_back(qp);
  ++qp->mcast_;
  return 0;
}

int Engine::detach_mcast(Qp* qp, const uint8_t gid[16], const char** why) {
  if (!qp || find_qp(qp->qpn_) != qp) return EINVAL;
  if (const auto it = mcast_.find(to_gid(gid)); it != mcast_.end()) {
    std::vector<Qp*>& m = it->second;
    if (const auto at = std::find(m.begin(), m.end(), qp); at != m.end()) {
      leave_group(it, at);
      return 0;
    }
  }
  if (why != nullptr) *why = "the QP is not attached to this group";
  return EINVAL;
}

Engine::McastMap::iterator Engine::leave_group(McastMap::iterator g,
                                               std::vector<Qp*>::iterator at) {
  --(*at)->mcast_;
  g->second.erase(at);
  dev_.mcast_leave(g->first);
  return g->second.empty() ? mcast_.erase(g) : std::next(g);
}

int Engine::destroy_qp(Qp* qp) {
  if (!qp || find_qp(qp->qpn_) != qp) return EINVAL;
  // Out of its groups (the service refuses a verbs destroy while attached,
  // as the kernel does; a client that died is cleaned up here).
  for (auto it = mcast_.begin(); it != mcast_.end();) {
    std::vector<Qp*>& m = it->second;
    const auto at = std::find(m.begin(), m.end(), qp);
    it = at == m.end() ? std::next(it) : leave_group(it, at);
  }
  qp->state_ = IBV_QPS_RESET;  // out of the shared window's count
  cc_sync(*qp);
  qp->rate_.reset(dcqcn_share_);  // out of the limited QPs' count
  cancel_timers(*qp);
  unlink_ready(*qp);
  Device::release(qp->pd_);
  Device::release(qp->send_cq_);
  Device::release(qp->recv_cq_);
  if (qp->srq_) Device::release(qp->srq_);
  const uint32_t idx = qp->index_;
  qps_[idx].reset();
  free_qp_.push_back(idx);
  --nqp_;
  dev_.count_qp(-1);
  return 0;
}

void Engine::reset_qp(Qp& qp) {
  cancel_timers(qp);
  unlink_ready(qp);
  // Called before the state changes (cc_sync would still see RTS): out of
  // the grant queue, its grant back.
  cc_release(qp);
  qp.cc_burst_ = 0;
  qp.sq_head_ = qp.sq_next_ = qp.sq_tail_ = 0;
  qp.rq_head_ = qp.rq_tail_ = 0;
  qp.sq_pub_bias_ = qp.rq_pub_bias_ = 0;
  qp.publish_sq();
  qp.publish_rq();
  qp.req_ = {};  // and with rd_atomic 0 the request ring is empty
  qp.comp_ = {};
  qp.cc_.reset(cfg_.cc, 0);
  qp.ctr_.cc_window.set(qp.cc_.window());
  qp.rate_.reset(dcqcn_share_);
  qp.ctr_.cc_rate_mbps.set(0);
  qp.probes_ = 0;
  qp.probe_due_ = false;
  qp.probe_one_ = false;
  qp.srtt_ns_ = 0;
  qp.ctr_.srtt_us.set(0);
  qp.rttvar_ns_ = 0;
  qp.pause_.reset();
  qp.rtt_timing_ = false;
  cc_sync(qp);
  qp.resp_ = {};
  for (RespResource& r : qp.res_) r = {};
  qp.res_next_ = 0;
}

int Engine::modify_qp(Qp* qp, const ibv_qp_attr& attr, int mask,
                      const char** why) {
  if (!qp || find_qp(qp->qpn_) != qp) return EINVAL;
  const int rc =
      check_modify_qp(qp->type_, qp->state_, attr, mask, dev_.limits(), why);
  if (rc) return rc;
  // Out of SQD, or to SQD again with new attributes, only once the send
  // queue has drained (query_qp's sq_draining false, IBV_EVENT_SQ_DRAINED):
  // a WR still unacknowledged would go on under the new path or timers.
  // To ERR is always allowed. rxe refuses the same (rxe_qp_chk_attr).
  if ((mask & IBV_QP_STATE) && qp->sq_draining() &&
      attr.qp_state != IBV_QPS_ERR) {
    if (why != nullptr)
      *why = "the send queue is still draining (wait for IBV_EVENT_SQ_DRAINED)";
    return EINVAL;
  }
  Path path = qp->path_;
  if (mask & IBV_QP_AV) {
    const int r = dev_.resolve_path(attr.ah_attr, &path);
    if (r) return r;
  }
  const ibv_qp_state from = qp->state_;
  const ibv_qp_state to = (mask & IBV_QP_STATE) ? attr.qp_state : from;

  // Attributes (validated above).
  ibv_qp_attr& s = qp->attr_;
  if (mask & IBV_QP_AV) {
    qp->path_ = path;
    s.ah_attr = attr.ah_attr;
  }
  if (mask & IBV_QP_PATH_MTU) {
    s.path_mtu = attr.path_mtu;
    qp->mtu_ = mtu_bytes(attr.path_mtu);
  }
  if (mask & IBV_QP_DEST_QPN) qp->dest_qpn_ = s.dest_qp_num = attr.dest_qp_num;
  if (mask & IBV_QP_QKEY) qp->qkey_ = s.qkey = attr.qkey;
  if (mask & IBV_QP_ACCESS_FLAGS)
    qp->access_ = s.qp_access_flags = attr.qp_access_flags;
  if (mask & IBV_QP_PKEY_INDEX) s.pkey_index = attr.pkey_index;
  if (mask & IBV_QP_PORT) s.port_num = attr.port_num;
  if (mask & IBV_QP_TIMEOUT) {
    s.timeout = attr.timeout;
    // IBTA 9.7.6.1.3: 4.096 us * 2^timeout; 0 disables the timer.
    qp->timeout_ns_ = attr.timeout ? uint64_t{4096} << attr.timeout : 0;
  }
  if (mask & IBV_QP_RETRY_CNT) qp->retry_cnt_ = s.retry_cnt = attr.retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) qp->rnr_retry_ = s.rnr_retry = attr.rnr_retry;
  if (mask & IBV_QP_MIN_RNR_TIMER)
    qp->min_rnr_timer_ = s.min_rnr_timer = attr.min_rnr_timer;
  if (mask & IBV_QP_MAX_QP_RD_ATOMIC) {
    s.max_rd_atomic = attr.max_rd_atomic;
    // 0 would forbid READ/ATOMIC altogether; such WRs would then wait
    // forever, so one credit is the floor (as rxe does).
    qp->max_rd_atomic_ = attr.max_rd_atomic ? attr.max_rd_atomic : 1;
    qp->size_rd_reqs();
  }
  if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) {
    s.max_dest_rd_atomic = attr.max_dest_rd_atomic;
    // 0: no READ or ATOMIC may come; one that does is an invalid request
    // (as rxe's check_resource). The ring keeps a slot for its arithmetic.
    qp->max_dest_rd_atomic_ = attr.max_dest_rd_atomic;
    qp->res_.assign(std::max<uint32_t>(attr.max_dest_rd_atomic, 1),
                    RespResource{});
    qp->res_next_ = 0;
  }
  if (mask & IBV_QP_RQ_PSN) {
    s.rq_psn = attr.rq_psn & kPsnMask;  // as query_qp reports it on rxe
    qp->resp_.epsn = attr.rq_psn & kPsnMask;
    qp->resp_.sw_psn = psn_add(qp->resp_.epsn, kPsnMask);
  }
  if (mask & IBV_QP_SQ_PSN) {
    s.sq_psn = attr.sq_psn & kPsnMask;
    qp->req_.psn = qp->comp_.psn = attr.sq_psn & kPsnMask;
    qp->req_.max_psn = qp->req_.psn;
    qp->ackreq_psn_ = psn_add(qp->req_.psn, kPsnMask);  // none sent yet
    qp->cc_.reset(cfg_.cc, qp->req_.psn);
    qp->ctr_.cc_window.set(qp->cc_.window());
    qp->rate_.reset(dcqcn_share_);
    qp->ctr_.cc_rate_mbps.set(0);
  }
  if (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY)
    qp->sqd_notify_ = attr.en_sqd_async_notify;

  if (mask & (IBV_QP_AV | IBV_QP_DEST_QPN)) {
    // Per-packet headers start from this copy (no address work per packet).
    qp->tmpl_ = {};
    fill_addr(*qp, qp->path_, qp->tmpl_);
    qp->tmpl_.dqpn = qp->dest_qpn_;
    wire::build_template(qp->tmpl_, qp->hdr_);
  }

  // Transition side effects.
  if (to == IBV_QPS_RESET && from != IBV_QPS_RESET) {
    reset_qp(*qp);
    qp->set_state(IBV_QPS_RESET);
    return 0;
  }
  if (to == IBV_QPS_ERR) {
    to_error(*qp);
    return 0;
  }
  qp->set_state(to);
  cc_sync(*qp);
  if (to == IBV_QPS_RTS && from != IBV_QPS_RTS) {
    qp->comp_.retries_left = qp->retry_cnt_;
    qp->comp_.rnr_left = qp->rnr_retry_;
    if (qp->sq_next_ != qp->sq_tail_) make_ready(*qp);
  }
  if (to == IBV_QPS_SQD && from == IBV_QPS_RTS) {
    qp->comp_.drained_sent = false;
    Completer::check_head_st(*this, *qp);
  }
  return 0;
}

int Engine::query_qp(const Qp* qp, ibv_qp_attr* attr, QpInitAttr* init) const {
  if (!qp || find_qp(qp->qpn_) != qp) return EINVAL;
  if (attr) {
    *attr = qp->attr_;
    attr->qp_state = attr->cur_qp_state = qp->state_;
    attr->cap = qp->cap_;
    attr->sq_draining = qp->sq_draining();
    attr->sq_psn = qp->req_.psn;
    attr->rq_psn = qp->resp_.epsn;
  }
  if (init) {
    init->qp_type = qp->type_;
    init->pd = qp->pd_;
    init->send_cq = qp->send_cq_;
    init->recv_cq = qp->recv_cq_;
    init->srq = qp->srq_;
    init->cap = qp->cap_;
    init->sq_sig_all = qp->sq_sig_all_;
  }
  return 0;
}

// --- posting ----------------------------------------------------------------

int Engine::post_send(Qp* qp, const SendWrHead& wr, const Sge* sges) {
  switch (qp->state_) {
    case IBV_QPS_RTS:
    case IBV_QPS_SQD:
      break;
    case IBV_QPS_ERR:
    case IBV_QPS_SQE: {
      // Verbs: WRs posted in ERR complete with a flush error.
      ibv_wc wc{};
      wc.wr_id = wr.wr_id;
      wc.status = IBV_WC_WR_FLUSH_ERR;
      wc.opcode = wc_opcode(wr.opcode);
      wc.qp_num = qp->qpn_;
      ctr_.inc(ECtr::wqes_flushed);
      push_cqe(*qp, qp->send_cq_, wc, false);
      return 0;
    }
    default:
      return EINVAL;
  }
  if (!valid_opcode(qp->type_, wr.opcode)) return EINVAL;
  if (wr.num_sge > qp->cap_.max_send_sge || wr.num_sge > kMaxSge) return EINVAL;
  uint64_t len = 0;
  for (uint32_t i = 0; i < wr.num_sge; ++i) len += sges[i].length;
  const bool inl = wr.send_flags & IBV_SEND_INLINE;
  if (len > dev_.limits().max_msg_sz) return EINVAL;
  // PSNs compare within a 2^23 window (psn.h): a message of more packets
  // than half of it (2 GiB at MTU 256) could not be tracked.
  if (len / qp->mtu_ >= (kPsnHalf >> 1)) return EINVAL;
  // A UD message over the port MTU is taken and never sent (Requester,
  // C10-93.1.1).
  if (qp->type_ == IBV_QPT_UD && !wr.ah) return EINVAL;
  // An atomic's target must be 8-byte aligned (IBTA 9.4.5): refused at post,
  // as rxe does, instead of costing both QPs a NAK and the error state.
  if (is_atomic(wr.opcode) && (len != 8 || wr.remote_addr % 8)) return EINVAL;
  if (wr.opcode == IBV_WR_ATOMIC_WRITE && wr.num_sge) return EINVAL;
  if (inl && (is_rd_atomic(wr.opcode) || len > qp->cap_.max_inline_data))
    return EINVAL;
  if (qp->sq_tail_ - qp->sq_head_ > qp->sq_mask_) return ENOMEM;

  SendWqe& w = qp->sqe(qp->sq_tail_);
  w.wr = wr;  // the head; the SGEs into the QP's array
  if (qp->type_ == IBV_QPT_UD)
    qp->sq_av_[qp->sq_tail_ & qp->sq_mask_] = wr.ah->path();
  if (!inl) std::copy_n(sges, wr.num_sge, w.sge);
  w.length = static_cast<uint32_t>(len);
  w.started = w.resolved = w.done = false;
  w.local_err = IBV_WC_SUCCESS;
  w.first_psn = w.last_psn = w.npkts = 0;  // assigned when it starts
  if (inl) {
    // Inline data is copied now: the caller may reuse its buffer at once.
    uint32_t off = 0;
    for (uint32_t i = 0; i < wr.num_sge; ++i) {
      const Sge& s = sges[i];
      if (s.length)
        std::memcpy(w.inline_data + off, reinterpret_cast<const void*>(s.addr),
                    s.length);
      off += s.length;
    }
    w.host_sg[0] = {w.inline_data, w.length};
    w.wr.num_sge = 1;
    w.resolved = true;
  }
  ++qp->sq_tail_;
  ctr_.inc(ECtr::send_wqes);
  if (qp->state_ == IBV_QPS_RTS) make_ready(*qp);
  return 0;
}

int Engine::post_recv(Qp* qp, uint64_t wr_id, uint32_t num_sge,
                      const Sge* sges) {
  if (qp->srq_) return EINVAL;
  if (qp->state_ == IBV_QPS_RESET) return EINVAL;
  if (num_sge > qp->cap_.max_recv_sge) return EINVAL;
  if (qp->state_ == IBV_QPS_ERR) {
    ibv_wc wc{};
    wc.wr_id = wr_id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = IBV_WC_RECV;
    wc.qp_num = qp->qpn_;
    ctr_.inc(ECtr::wqes_flushed);
    push_cqe(*qp, qp->recv_cq_, wc, false);
    return 0;
  }
  if (qp->rq_tail_ - qp->rq_head_ > qp->rq_mask_) return ENOMEM;
  RecvWqe& r = qp->rq_[qp->rq_tail_ & qp->rq_mask_];
  r.wr_id = wr_id;
  r.num_sge = num_sge;
  std::copy_n(sges, num_sge, r.sge);
  ++qp->rq_tail_;
  ctr_.inc(ECtr::recv_wqes);
  return 0;
}

void Engine::fail_unposted_send(Qp* qp, uint64_t wr_id, ibv_wr_opcode op,
                                ibv_wc_status st) {
  ibv_wc wc{};
  wc.wr_id = wr_id;
  wc.status = st;
  wc.opcode = wc_opcode(op);
  wc.qp_num = qp->qpn_;
  ctr_.inc(ECtr::local_errors);
  push_cqe(*qp, qp->send_cq_, wc, false);
  ++qp->sq_pub_bias_;
  qp->publish_sq();
  to_error(*qp);
}

void Engine::fail_unposted_recv(Qp* qp, uint64_t wr_id, ibv_wc_status st) {
  ibv_wc wc{};
  wc.wr_id = wr_id;
  wc.status = st;
  wc.opcode = IBV_WC_RECV;
  wc.qp_num = qp->qpn_;
  ctr_.inc(ECtr::local_errors);
  push_cqe(*qp, qp->recv_cq_, wc, false);
  ++qp->rq_pub_bias_;
  qp->publish_rq();
  to_error(*qp);
}

// --- data path --------------------------------------------------------------

void Engine::rx(const wire::FrameInfo& fi, std::span<const wire::ConstBuf> segs,
                uint64_t now_ns) {
  now_ = now_ns;
  ctr_.inc(ECtr::rx_packets);
  const wire::RoceFields& f = fi.roce;
  if (f.dqpn == wire::kMulticastQpn) {
    mcast_rx(fi, segs);
    return;
  }
  Qp* qp = find_qp(f.dqpn);
  if (!qp) {
    ctr_.inc(ECtr::rx_no_qp);
    return;
  }
  if (!wire::pkey_ok(f.pkey)) {
    ctr_.inc(ECtr::rx_bad_pkey);
    return;
  }
  // A connected QP hears its peer only: the packet's source GID is the QP's
  // destination and its destination the QP's source (rxe's check_addr;
  // IBTA 9.6.1's source check). Anyone else on the link who guessed a QPN
  // and a PSN is dropped and counted. Set from RTR on; before, the state
  // checks below drop the packet.
  if (qp->type_ != IBV_QPT_UD && qp->state_ != IBV_QPS_RESET &&
      qp->state_ != IBV_QPS_INIT &&
      (std::memcmp(f.sgid, qp->tmpl_.dgid, 16) != 0 ||
       std::memcmp(f.dgid, qp->tmpl_.sgid, 16) != 0)) {
    ctr_.inc(ECtr::rx_bad_addr);
    return;
  }
  const wire::OpcodeInfo& op = *fi.op;
  if (op.mask & wire::kCnpOp) {  // for our requester (Annex A17.9.3)
    if (qp->type_ == IBV_QPT_UD) {
      ctr_.inc(ECtr::rx_bad_type);
    } else if (qp->state_ != IBV_QPS_RTS && qp->state_ != IBV_QPS_SQD) {
      ctr_.inc(ECtr::rx_bad_state);
    } else {
      ++qp->ctr_.rx_packets;
      Completer::cnp_st(*this, *qp);
    }
    return;
  }
  const uint32_t want = qp->type_ == IBV_QPT_RC   ? wire::kRc
                        : qp->type_ == IBV_QPT_UC ? wire::kUc
                                                  : wire::kUd;
  if (!(op.mask & want)) {
    ctr_.inc(ECtr::rx_bad_type);
    return;
  }
  const RxPkt p{fi, f, op, segs};
  ++qp->ctr_.rx_packets;
  if (op.mask & wire::kReq) {
    if (qp->state_ == IBV_QPS_RESET || qp->state_ == IBV_QPS_INIT ||
        qp->state_ == IBV_QPS_ERR) {
      ctr_.inc(ECtr::rx_bad_state);
      return;
    }
    Responder::rx_st(*this, *qp, p);
  } else {
    if (qp->state_ != IBV_QPS_RTS && qp->state_ != IBV_QPS_SQD) {
      ctr_.inc(ECtr::rx_bad_state);
      return;
    }
    Completer::rx_st(*this, *qp, p);
  }
}

void Engine::mcast_rx(const wire::FrameInfo& fi,
                      std::span<const wire::ConstBuf> segs) {
  const wire::RoceFields& f = fi.roce;
  // The worker took the frame for a group some engine has members of;
  // this one may have none.
  const auto it = mcast_.empty() ? mcast_.end() : mcast_.find(to_gid(f.dgid));
  if (it == mcast_.end()) return;
  if (!wire::pkey_ok(f.pkey)) {
    ctr_.inc(ECtr::rx_bad_pkey);
    return;
  }
  const wire::OpcodeInfo& op = *fi.op;
  if (!(op.mask & wire::kUd)) {  // only UD SENDs go to groups
    ctr_.inc(ECtr::rx_bad_type);
    return;
  }
  ctr_.inc(ECtr::rx_mcast);
  const RxPkt p{fi, f, op, segs};
  for (Qp* qp : it->second) {
    // A UD QP receives from RTR on (IBTA 10.3.1); in ERR its RQ is flushed.
    if (qp->state_ == IBV_QPS_RESET || qp->state_ == IBV_QPS_INIT ||
        qp->state_ == IBV_QPS_ERR) {
      ctr_.inc(ECtr::rx_bad_state);
      continue;
    }
    ctr_.inc(ECtr::rx_mcast_copies);
    ++qp->ctr_.rx_packets;
    Responder::rx_st(*this, *qp, p);
  }
}

void Engine::fire_timer(TimerNode& t) {
  Qp& qp = *static_cast<Qp*>(t.owner);
  if (t.kind == kPaceTimer) {
    // The pacer has tokens again; send_st re-checks everything else.
    if (qp.sq_next_ != qp.sq_tail_ || Responder::read_pending(qp))
      make_ready(qp);
    return;
  }
  if (t.kind == kProbeTimer) {
    // Set before the probe's due time (restarted since): on to it. Even
    // when that time has passed too (the lcore was off the CPU), so the
    // probe fires on the next advance, after the retransmit timer that was
    // due before it, as if it had been set on time (a timeout cancels it).
    if (qp.probe_set_ns_ != qp.probe_due_ns_) {
      qp.probe_set_ns_ = qp.probe_due_ns_;
      timers_.arm(qp.probe_timer_, qp.probe_set_ns_);
      return;
    }
    Completer::probe_st(*this, qp);
    return;
  }
  Completer::timer_st(*this, qp, static_cast<TimerKind>(t.kind));
}

void Engine::lcore_paused(uint64_t now_ns, uint64_t ns) {
  timers_.stop_clock(ns);
  resumed_ns_ = now_ns;
}

uint32_t Engine::poll(uint64_t now_ns, bool timers) {
  now_ = now_ns;
  gauges_.shared_window.set(cc_shared_.window());
  gauges_.in_flight.set(cc_in_flight_);
  gauges_.active_qps.set(cc_active_);
  gauges_.waiting_qps.set(cc_waiting_);
  const uint32_t fired =
      timers ? timers_.advance(now_ns, [this](TimerNode& t) { fire_timer(t); })
             : 0;
  // Frames this poll gave the PacketIo (tx_fill); the poll's work is
  // these and the timers fired.
  uint32_t handed = 0;
  // ACK-sized responses first, unless read responses for earlier PSNs of
  // the same QP are still to go (then the data pass sends them in order).
  while (Qp* qp = ack_.pop_front()) {
    if (Responder::read_pending(*qp)) continue;
    tx_refused_ = false;
    turn_left_ = INT64_MAX;  // ACK-sized packets only
    bool more = false;
    handed += Responder::send_st(*this, *qp, cfg_.tx_budget, &more);
    if (tx_refused_) {
      ack_.push_front(*qp);
      return fired + handed;
    }
  }
  // One pass over the QPs that have transmit work; a QP that still has
  // some afterwards goes to the back of the list. The pass ends after
  // poll_budget packets (the caller's loop returns to RX), and another
  // follows while the poll has handed over fewer than tx_fill frames.
  uint32_t left = cfg_.poll_budget;
  Qp* end = ready_.tail();
  uint32_t pass_from = handed;
  while (Qp* qp = ready_.pop_front()) {
    tx_refused_ = false;
    // Round-robin by bytes: a QP's turn ends after tx_quantum bytes (or
    // tx_budget packets), so a bulk sender cannot hold the port while
    // another QP's READ response waits. A turn cut short by a full TX queue
    // or by the poll budget resumes with what was left of it, not with a
    // fresh quantum.
    const uint32_t turn = qp->turn_cont_ ? qp->turn_pkts_ : cfg_.tx_budget;
    const uint32_t budget = std::min(turn, left);
    turn_left_ = qp->turn_cont_ ? qp->turn_bytes_ : cfg_.tx_quantum;
    qp->turn_cont_ = false;
    bool more = false;
    uint32_t sent = Responder::send_st(*this, *qp, budget, &more);
    bool more_req = false;
    if (!more) sent += Requester::send_st(*this, *qp, budget - sent, &more_req);
    left -= sent;
    handed += sent;
    const bool cut = budget < turn && sent == budget && (more || more_req);
    if (tx_refused_ || cut) {
      // TX is full, or this poll's budget is spent: this QP keeps its place
      // at the front and the pass ends.
      if (sent < turn && turn_left_ > 0) {
        qp->turn_cont_ = true;
        qp->turn_pkts_ = turn - sent;
        qp->turn_bytes_ = turn_left_;
        ready_.push_front(*qp);
      } else {
        make_ready(*qp);  // its turn is over: to the back
      }
      break;
    }
    if (more || more_req) make_ready(*qp);
    if (left == 0) break;
    if (qp == end) {
      // A pass that sent something but less than a burst: round again.
      if (handed == pass_from || handed >= cfg_.tx_fill) break;
      end = ready_.tail();
      pass_from = handed;
    }
  }
  return fired + handed;
}

// --- shared helpers ---------------------------------------------------------

void Engine::unlink_ready(Qp& qp) {
  ready_.remove(qp);
  ack_.remove(qp);
}

void Engine::fill_addr(const Qp& qp, const Path& path,
                       wire::RoceFields& f) const {
  const DeviceConfig& dc = dev_.config();
  f.dst_mac = path.dmac;
  f.src_mac = dc.mac;
  f.vlan = dc.vlan;
  f.vlan_tci = dc.vlan_tci;
  std::memcpy(f.sgid, dc.gids[path.sgid_index], 16);
  std::memcpy(f.dgid, path.dgid, 16);
  f.ipv6 = !(wire::gid_is_ipv4(f.sgid) && wire::gid_is_ipv4(f.dgid));
  f.tclass = path.traffic_class;
  f.ttl = path.hop_limit;
  f.flow_label = path.flow_label;
  f.udp_sport = qp.udp_sport_;
}

bool Engine::send_packet(Qp& qp, wire::RoceFields& f,
                         std::span<const wire::ConstBuf> payload, bool stable) {
  uint8_t hdr[128];
  uint8_t trailer[8];
  const uint32_t hl = qp.type_ == IBV_QPT_UD
                          ? wire::encode_headers(f, hdr, sizeof(hdr))
                          : wire::encode_headers(qp.hdr_, f, hdr, sizeof(hdr));
  if (hl == 0) return true;  // cannot happen for our own fields; dropped
  TxFrame tf;
  tf.hdr = hdr;
  tf.hdr_len = hl;
  tf.stable = stable;
  tf.loop_to_members = qp.type_ == IBV_QPT_UD && !qp.block_mcast_lb_ &&
                       dev_.mcast_groups() != 0 &&
                       wire::gid_is_multicast(f.dgid) &&
                       dev_.mcast_group(f.dgid);
  wire::ConstBuf copy;
  if (!stable && f.payload_len > sizeof bounce_) {
    // Summed by the PacketIo over the copy it makes anyway.
    tf.unsealed = &f;
    tf.trailer_len = wire::trailer_len(f.payload_len);
  } else {
    if (!stable && !payload.empty()) {
      uint32_t n = 0;
      for (const wire::ConstBuf& b : payload) {
        if (n + b.len > sizeof bounce_) return true;  // > payload_len: never
        std::memcpy(bounce_ + n, b.data, b.len);
        n += b.len;
      }
      copy = {bounce_, n};
      payload = {&copy, 1};
    }
    tf.trailer = trailer;
    tf.trailer_len = wire::encode_trailer(hdr, f, payload, trailer);
  }
  tf.payload = payload;
  if (!io_.transmit(tf)) {
    tx_refused_ = true;
    ctr_.inc(ECtr::tx_full);
    return false;
  }
  const uint32_t flen = tf.frame_len();
  last_tx_len_ = flen;
  ctr_.inc(ECtr::tx_packets);
  ctr_.inc(ECtr::tx_bytes, flen);
  turn_left_ -= flen;
  ++qp.ctr_.tx_packets;
  return true;
}

bool Engine::push_cqe(Qp& qp, Cq* cq, const ibv_wc& wc, bool solicited) {
  ctr_.inc(ECtr::completions);
  if (cq->push(wc, solicited)) return true;
  // Overflow: the CQ is in error (and raised CQ_ERR); the QP cannot report
  // completions any more, so it goes to error as well (IBTA 11.4.2.1).
  ctr_.inc(ECtr::cq_overflows);
  ++qp.ctr_.cq_overflows;
  if (qp.state_ != IBV_QPS_ERR) to_error(qp);
  return false;
}

void Engine::complete_head(Qp& qp, ibv_wc_status st) {
  SendWqe& w = qp.sqe(qp.sq_head_);
  ++qp.sq_head_;
  qp.publish_sq();
  if (qp.sq_next_ - qp.sq_head_ > qp.sq_tail_ - qp.sq_head_)
    qp.sq_next_ = qp.sq_head_;  // head overtook the requester (UC/UD)
  const bool signaled = st != IBV_WC_SUCCESS || qp.sq_sig_all_ ||
                        (w.wr.send_flags & IBV_SEND_SIGNALED);
  if (!signaled) return;
  ibv_wc wc{};
  wc.wr_id = w.wr.wr_id;
  wc.status = st;
  wc.opcode = wc_opcode(w.wr.opcode);
  wc.byte_len = w.length;
  wc.qp_num = qp.qpn_;
  push_cqe(qp, qp.send_cq_, wc, false);
}

void Engine::fail_head(Qp& qp, ibv_wc_status st) {
  if (qp.state_ == IBV_QPS_ERR) return;
  if (qp.sq_head_ != qp.sq_tail_) complete_head(qp, st);
  if (qp.state_ != IBV_QPS_ERR) to_error(qp);
}

void Engine::to_error(Qp& qp) {
  if (qp.state_ == IBV_QPS_ERR) return;
  qp.set_state(IBV_QPS_ERR);
  cc_sync(qp);
  cancel_timers(qp);
  qp.rate_.set_idle(dcqcn_share_, true);  // sends nothing more
  unlink_ready(qp);
  // Every WR still on the send queue completes with a flush error, in order,
  // signaled or not (the IBTA's QP Error state; rule number unchecked, so
  // none is given).
  while (qp.sq_head_ != qp.sq_tail_) {
    SendWqe& w = qp.sqe(qp.sq_head_);
    ibv_wc wc{};
    wc.wr_id = w.wr.wr_id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = wc_opcode(w.wr.opcode);
    wc.qp_num = qp.qpn_;
    ++qp.sq_head_;
    ctr_.inc(ECtr::wqes_flushed);
    ctr_.inc(ECtr::completions);
    if (!qp.send_cq_->push(wc, false)) {
      ctr_.inc(ECtr::cq_overflows);
      ++qp.ctr_.cq_overflows;
    }
  }
  qp.sq_next_ = qp.sq_head_;
  qp.publish_sq();
  qp.req_.rd_atomic = 0;  // no response is awaited any more
  auto flush_recv = [&](uint64_t wr_id) {
    ibv_wc wc{};
    wc.wr_id = wr_id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = IBV_WC_RECV;
    wc.qp_num = qp.qpn_;
    ctr_.inc(ECtr::wqes_flushed);
    ctr_.inc(ECtr::completions);
    if (!qp.recv_cq_->push(wc, false)) {
      ctr_.inc(ECtr::cq_overflows);
      ++qp.ctr_.cq_overflows;
    }
  };
  // A receive WR taken by a message in progress is older than the queue.
  if (qp.resp_.have_recv) {
    flush_recv(qp.resp_.recv.wr_id);
    qp.resp_.have_recv = false;
  }
  while (qp.rq_head_ != qp.rq_tail_) {
    flush_recv(qp.rq_[qp.rq_head_ & qp.rq_mask_].wr_id);
    ++qp.rq_head_;
  }
  qp.publish_rq();
  qp.resp_.ack_pending = false;
  for (RespResource& r : qp.res_) r.pending = false;
  qp.res_any_pending_ = false;
  // IBTA 11.6.3: a QP on an SRQ reports its last WQE when it enters error.
  if (qp.srq_)
    dev_.raise(
        {IBV_EVENT_QP_LAST_WQE_REACHED, qp.qpn_, nullptr, nullptr, qp.owner_});
}

void Engine::arm_retrans(Qp& qp) {
  if (qp.timeout_ns_ && !qp.retrans_timer_.armed())
    timers_.arm(qp.retrans_timer_, now_ + qp.timeout_ns_);
}

void Engine::arm_probe(Qp& qp) {
  // Not before the QP's first round-trip sample (RFC 8985 7.2 falls back to
  // a 1 s PTO; the Local ACK Timeout is that here): 256 QPs started at once
  // on af_packet each probed at the floor while their first ACKs waited in
  // the peer's queue, and resent their way into retry exceeded.
  if (!cfg_.tail_probe_ns || !qp.srtt_ns_) return;
  // RFC 8985's 2 x SRTT, and RFC 6298's SRTT + 4 x RTTVAR: on shared cores
  // the round trip jumps when a peer's lcore is descheduled, and a probe
  // then would only resend what is on its way. Nor shorter than the
  // peer's pauses of the last 1-2 s (Qp::pause_): the scheduler's slices
  // (4 ms here) are not in the round trip's samples, and a probe time under
  // them fired, and cut the window, every time the peer's lcore was off
  // the CPU (perf/README.md, "the peer's pauses").
  qp.probe_from_ns_ = now_;
  const uint64_t pto = std::max(probe_time(qp), qp.pause_.get(now_))
                       << std::min(qp.probes_, 16u);
  // Only ahead of the timeout: at that point the timeout's retry is due.
  if (qp.timeout_ns_ && pto >= qp.timeout_ns_) {
    timers_.cancel(qp.probe_timer_);
    return;
  }
  // From the newest solicited send, as RFC 8985 7.2 restarts it on every
  // transmission: a paced QP's packets between AckReqs are answered by the
  // next AckReq, and timing from the first of them fired probes for
  // packets that had arrived (perf/README.md, "tail-loss probe").
  // That is once per packet for small messages: a timer set no later than
  // the new time stays where it is, and moves on when it fires.
  qp.probe_due_ns_ = now_ + pto;
  if (qp.probe_timer_.armed() && qp.probe_set_ns_ <= qp.probe_due_ns_) return;
  qp.probe_set_ns_ = qp.probe_due_ns_;
  timers_.arm(qp.probe_timer_, qp.probe_set_ns_);
}

void Engine::cancel_retrans(Qp& qp) {
  timers_.cancel(qp.retrans_timer_);
  timers_.cancel(qp.probe_timer_);
}

void Engine::cancel_timers(Qp& qp) {
  cancel_retrans(qp);
  timers_.cancel(qp.rnr_timer_);
  timers_.cancel(qp.pace_timer_);
}

void Engine::rtt_progress(Qp& qp) {
  // Progress after probes: a peer that was running answers a probe within
  // a round trip. An answer a probe time or more after the newest one
  // (and not one that waited for this lcore) means the peer had paused,
  // and for the whole silence: the data was late, not lost. No duplicate
  // says so: a responder asked again for a READ it has not finished
  // starts over from the PSN asked (ours and rxe's), so each response
  // still comes once.
  if (qp.probes_ && now_ - qp.probe_sent_ns_ >= probe_time(qp) &&
      qp.probe_sent_ns_ >= resumed_ns_) {
    qp.pause_.on_sample(now_, now_ - qp.probe_t0_ns_);
    ctr_.inc(ECtr::probe_pauses);
  }
  qp.probes_ = 0;
  if (!qp.rtt_timing_ || !psn_after(qp.comp_.psn, qp.rtt_psn_)) return;
  qp.rtt_timing_ = false;
  const uint64_t sample = now_ - qp.rtt_sent_ns_;
  qp.cc_.pipe().on_sample(now_, sample, qp.cc_.delivered() - qp.rtt_delivered_);
  cc_shared_.pipe().on_sample(
      now_, sample, cc_shared_.delivered() - qp.rtt_shared_delivered_);
  if (!qp.srtt_ns_) {  // RFC 6298 2.2, 2.3
    qp.srtt_ns_ = sample;
    qp.rttvar_ns_ = sample / 2;
  } else {
    const uint64_t dev =
        sample > qp.srtt_ns_ ? sample - qp.srtt_ns_ : qp.srtt_ns_ - sample;
    qp.rttvar_ns_ = (3 * qp.rttvar_ns_ + dev) / 4;
    qp.srtt_ns_ = (7 * qp.srtt_ns_ + sample) / 8;
  }
  qp.ctr_.srtt_us.set(qp.srtt_ns_ / 1000);
}

// --- payload helpers --------------------------------------------------------

uint32_t gather(const HostSge* sg, uint32_t nsg, uint32_t off, uint32_t len,
                wire::ConstBuf* out) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < nsg && len; ++i) {
    if (off >= sg[i].len) {
      off -= sg[i].len;
      continue;
    }
    const uint32_t take = std::min(sg[i].len - off, len);
    out[n++] = {sg[i].p + off, take};
    len -= take;
    off = 0;
  }
  return n;
}

void scatter(const HostSge* sg, uint32_t nsg, uint32_t dst_off,
             std::span<const wire::ConstBuf> segs, uint32_t src_off,
             uint32_t len) {
  uint32_t si = 0;
  uint32_t soff = src_off;
  while (si < segs.size() && soff >= segs[si].len) soff -= segs[si++].len;
  for (uint32_t i = 0; i < nsg && len; ++i) {
    if (dst_off >= sg[i].len) {
      dst_off -= sg[i].len;
      continue;
    }
    uint32_t room = std::min(sg[i].len - dst_off, len);
    uint8_t* d = sg[i].p + dst_off;
    dst_off = 0;
    len -= room;
    while (room && si < segs.size()) {
      const uint32_t take = std::min(room, segs[si].len - soff);
      std::memcpy(d, segs[si].data + soff, take);
      d += take;
      room -= take;
      soff += take;
      if (soff == segs[si].len) {
        ++si;
        soff = 0;
      }
    }
  }
}

void prefetch(const HostSge* sg, uint32_t nsg, uint32_t off, uint32_t len,
              bool write) {
  wire::ConstBuf pieces[kMaxSge];  // nsg <= kMaxSge, as for gather's callers
  const uint32_t n = gather(sg, nsg, off, len, pieces);
  for (uint32_t i = 0; i < n; ++i)
    prefetch(pieces[i].data, pieces[i].len, write);
}

uint64_t rnr_timer_ns(uint8_t code) {
  // IBTA vol. 1 table 45, in units of 10 us; code 0 is the longest.
  static constexpr uint32_t kTenUs[32] = {
      65536, 1,    2,    3,    4,    6,     8,     12,    16,    24,   32,
      48,    64,   96,   128,  192,  256,   384,   512,   768,   1024, 1536,
      2048,  3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152};
  return uint64_t{kTenUs[code & 31]} * 10000;
}

bool Qp::uses_memory(const uint8_t* lo, const uint8_t* hi) const {
  auto in = [&](const uint8_t* p, uint32_t len) {
    return p && len && p < hi && p + len > lo;
  };
  for (uint32_t i = sq_head_; i != sq_tail_; ++i) {
    const SendWqe& w = sq_[i & sq_mask_];
    if (!w.resolved) continue;  // still lkeys: checked when resolved
    for (uint32_t k = 0; k < w.wr.num_sge && k < kMaxSge; ++k)
      if (in(w.host_sg[k].p, w.host_sg[k].len)) return true;
  }
  if (resp_.have_recv)
    for (uint32_t k = 0; k < resp_.recv_nsg && k < kMaxSge; ++k)
      if (in(resp_.recv_sg[k].p, resp_.recv_sg[k].len)) return true;
  if (resp_.msg == Resp::kWrite && in(resp_.wr_p, resp_.wr_left)) return true;
  // res_any_pending_ is set with every pending resource: an idle QP's ring
  // (up to 16 cold cache lines) is not walked. Every ibv_dereg_mr asks this
  // of each QP of the engine, lcores parked: 228-358 us at 16 384 QPs
  // before, 172-253 after (2026-12-01).
  if (res_any_pending_)
    for (const RespResource& r : res_)
      if (r.pending && r.kind == RespResource::kRead && in(r.tx_p, r.tx_left))
        return true;
  return false;
}

// The ring is walked from the oldest request, where a response usually
// belongs, without a division per step (its size need not be a power of
// two: max_rd_atomic).
const Qp::RdReq* Qp::rd_req_at(uint32_t psn) const {
  const uint32_t n = static_cast<uint32_t>(rd_reqs_.size());
  uint32_t i = rd_head_;
  for (uint32_t k = 0; k < req_.rd_atomic; ++k) {
    const RdReq& r = rd_reqs_[i];
    if (psn_diff(psn, r.first_psn) >= 0 && psn_diff(psn, r.last_psn) <= 0)
      return &r;
    if (++i == n) i = 0;
  }
  return nullptr;
}

void Qp::retire_rd_reqs() {
  const uint32_t n = static_cast<uint32_t>(rd_reqs_.size());
  while (req_.rd_atomic && psn_before(rd_reqs_[rd_head_].last_psn, comp_.psn)) {
    if (++rd_head_ == n) rd_head_ = 0;
    --req_.rd_atomic;
  }
}

void Qp::push_rd_req(uint32_t first_psn, uint32_t last_psn) {
  const uint32_t n = static_cast<uint32_t>(rd_reqs_.size());
  uint32_t i = rd_head_ + req_.rd_atomic++;
  if (i >= n) i -= n;
  rd_reqs_[i] = {first_psn, last_psn};
}

void Qp::size_rd_reqs() {
  const uint32_t n = static_cast<uint32_t>(rd_reqs_.size());
  std::vector<RdReq> v(std::max<uint32_t>(max_rd_atomic_, req_.rd_atomic));
  for (uint32_t i = 0; i < req_.rd_atomic; ++i)
    v[i] = rd_reqs_[(rd_head_ + i) % n];
  rd_reqs_ = std::move(v);
  rd_head_ = 0;
}

bool Engine::mr_in_use(const Mr& mr) const {
  const uint8_t* lo = mr.host(mr.iova());
  const uint8_t* hi = lo + mr.length();
  for (const std::unique_ptr<Qp>& q : qps_)
    if (q && q->pd_ == mr.pd() && q->uses_memory(lo, hi)) return true;
  return false;
}

}  // namespace urnic::transport
