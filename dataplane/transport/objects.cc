// Verbs objects: creation, limits, key generation and access checks.
#include "dataplane/transport/objects.h"

#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <new>

#include "dataplane/wire/codec.h"

namespace urnic::transport {
namespace {

constexpr uint32_t kEventRing = 1024;

// A dead slot of an object table (the one that died last), or a new one.
// Slots never move (lcores hold pointers to the objects). It used to scan
// the table for a dead slot, with every lcore parked: a registration took
// 142-170 us at 30 000 MRs against 62-79 at the first 2 000 (2026-12-01).
template <typename T>
T* take_slot(std::vector<std::unique_ptr<T>>& v, std::vector<uint32_t>& dead,
             uint32_t* index) {
  if (!dead.empty()) {
    *index = dead.back();
    dead.pop_back();
    return v[*index].get();
  }
  v.push_back(std::make_unique<T>());
  *index = static_cast<uint32_t>(v.size() - 1);
  return v.back().get();
}

// Lays out a CQ block of `cqe` entries in `shared` (shim::CqShared, then
// the ring at a page boundary); *ring is where its entries go.
shim::CqShared* cq_block(void* shared, uint32_t cqe, ibv_wc** ring) {
  auto* sh = new (shared) shim::CqShared;
  sh->size = shim::ring_slots(cqe);
  sh->offset = static_cast<uint32_t>(shim::page_round(sizeof(shim::CqShared)));
  *ring = reinterpret_cast<ibv_wc*>(static_cast<uint8_t*>(shared) + sh->offset);
  return sh;
}

}  // namespace

Device::Device(const DeviceConfig& cfg, Resolver* resolver)
    : cfg_(cfg),
      resolver_(resolver),
      events_(std::make_unique<EventSlot[]>(kEventRing)),
      nevents_(kEventRing) {
  for (uint64_t i = 0; i < nevents_; ++i)
    events_[i].seq.store(i, std::memory_order_relaxed);
  uint64_t seed = cfg.key_seed;
  if (seed == 0) {
    std::random_device rd;
    seed = uint64_t{rd()} << 32 | rd();
  }
  key_rng_.seed(seed);
}

Device::~Device() = default;

int Device::alloc_pd(Pd** out) {
  if (npd_ >= cfg_.limits.max_pd) return ENOMEM;
  uint32_t idx;
  Pd* pd = take_slot(pds_, dead_pds_, &idx);
  *pd = Pd{};
  pd->handle_ = idx;
  pd->live_ = true;
  ++npd_;
  *out = pd;
  return 0;
}

int Device::dealloc_pd(Pd* pd) {
  if (!pd || !pd->live_) return EINVAL;
  if (pd->users_) return EBUSY;
  pd->live_ = false;
  dead_pds_.push_back(pd->handle_);
  --npd_;
  return 0;
}

// lkey/rkey: table index in the upper 24 bits, 8 random bits below, never
// the same as the previous key of that slot (a stale key stays invalid).
// A key for table slot `index` whose low byte differs from the slot's
// previous key (`old`), so a stale key of the slot is refused.
uint32_t Device::new_key(uint32_t index, uint32_t old) {
  old &= 0xff;
  uint32_t low;
  do {
    low = static_cast<uint32_t>(key_rng_() & 0xff);
  } while (low == old);
  return index << 8 | low;
}

int Device::reg_mr(Pd* pd, void* host, uint64_t length, uint64_t iova,
                   uint32_t access, Mr** out) {
  if (!pd || !pd->live_) return EINVAL;
  if (const int e = hostif::mr_access_error(access)) return e;
  if (length > cfg_.limits.max_mr_size) return EINVAL;
  if (!host && length) return EINVAL;
  if (iova + length < iova) return EINVAL;
  if (nmr_ >= cfg_.limits.max_mr) return ENOMEM;
  uint32_t idx;
  Mr* mr = take_slot(mrs_, dead_mrs_, &idx);
  if (idx >= kMwIndex) {  // not with max_mr < 2^23
    dead_mrs_.push_back(idx);
    return ENOMEM;
  }
  const uint32_t key = new_key(idx, mr->lkey_);
  *mr = Mr{};
  mr->pd_ = pd;
  mr->host_ = static_cast<uint8_t*>(host);
  mr->iova_ = iova;
  mr->length_ = length;
  mr->access_ = access;
  mr->lkey_ = mr->rkey_ = key;
  mr->live_ = true;
  ++pd->users_;
  ++nmr_;
  *out = mr;
  return 0;
}

int Device::dereg_mr(Mr* mr) {
  if (!mr || !mr->live_) return EINVAL;
  if (mr->mw_binds_) return EBUSY;
  mr->live_ = false;
  dead_mrs_.push_back(mr->lkey_ >> 8);
  --mr->pd_->users_;
  --nmr_;
  return 0;
}

int Device::rereg_mr(Mr* mr, Mr* fresh) {
  if (!mr || !mr->live_ || !fresh || !fresh->live_ || mr == fresh)
    return EINVAL;
  if (mr->mw_binds_) return EBUSY;
  --mr->pd_->users_;  // fresh's PD holds one user already: now mr's
  mr->pd_ = fresh->pd_;
  mr->host_ = fresh->host_;
  mr->iova_ = fresh->iova_;
  mr->length_ = fresh->length_;
  mr->access_ = fresh->access_;
  fresh->live_ = false;
  dead_mrs_.push_back(fresh->lkey_ >> 8);
  --nmr_;
  return 0;
}

int Device::alloc_mw(Pd* pd, ibv_mw_type type, Mw** out) {
  if (!pd || !pd->live_) return EINVAL;
  if (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2) return EINVAL;
  if (nmw_ >= cfg_.limits.max_mr) return ENOMEM;
  uint32_t idx;
  Mw* mw = take_slot(mws_, dead_mws_, &idx);
  if (idx >= kMwIndex) {  // not with max_mr < 2^23
    dead_mws_.push_back(idx);
    return ENOMEM;
  }
  const uint32_t key = new_key(kMwIndex + idx, mw->rkey_);
  *mw = Mw{};
  mw->pd_ = pd;
  mw->type_ = type;
  mw->rkey_ = key;
  mw->live_ = true;
  ++pd->users_;
  ++nmw_;
  *out = mw;
  return 0;
}

// Ends a window's binding (it keeps its rkey; no remote access).
void Device::unbind(Mw& mw) {
  --mw.mr_->mw_binds_;
  mw.mr_ = nullptr;
  mw.va_ = mw.length_ = 0;
  mw.access_ = 0;
  mw.qpn_ = 0;
}

int Device::dealloc_mw(Mw* mw) {
  MwLock lock(mw_lock_);
  if (!mw || !mw->live_) return EINVAL;
  if (mw->mr_) unbind(*mw);
  mw->live_ = false;
  dead_mws_.push_back((mw->rkey_ >> 8) - kMwIndex);
  --mw->pd_->users_;
  --nmw_;
  return 0;
}

Mw* Device::mw_by_rkey(uint32_t rkey) const {
  const uint32_t idx = rkey >> 8;
  if (idx < kMwIndex || idx - kMwIndex >= mws_.size()) return nullptr;
  Mw* mw = mws_[idx - kMwIndex].get();
  return mw->live_ && mw->rkey_ == rkey ? mw : nullptr;
}

ibv_wc_status Device::bind_mw(const Pd* pd, uint32_t qpn, const MwBind& b) {
  MwLock lock(mw_lock_);
  Mw* mw = mw_by_rkey(b.mw_rkey);
  if (!mw || mw->pd_ != pd) return IBV_WC_MW_BIND_ERR;
  // The new rkey keeps the window's index; only its key byte is the
  // consumer's (ibv_inc_rkey).
  if ((b.new_rkey >> 8) != (b.mw_rkey >> 8)) return IBV_WC_MW_BIND_ERR;
  constexpr uint32_t kRemote = IBV_ACCESS_REMOTE_WRITE |
                               IBV_ACCESS_REMOTE_READ |
                               IBV_ACCESS_REMOTE_ATOMIC;
  // Local write and MW bind mean nothing for a window and are taken, as
  // rxe takes them (RXE_ACCESS_SUPPORTED_MW) and mlx5 passes them on;
  // zero-based and anything else: refused.
  constexpr uint32_t kIgnored = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND;
  if (b.access & ~(kRemote | kIgnored)) return IBV_WC_MW_BIND_ERR;
  if (b.length == 0) {  // type 1 unbind (10.6.7.2.1)
    if (mw->type_ != IBV_MW_TYPE_1) return IBV_WC_MW_BIND_ERR;
    if (mw->mr_) unbind(*mw);
    mw->rkey_ = b.new_rkey;
    return IBV_WC_SUCCESS;
  }
  // A type 2 window is bound once until invalidated.
  if (mw->type_ == IBV_MW_TYPE_2 && mw->mr_) return IBV_WC_MW_BIND_ERR;
  Mr* mr = mr_by_lkey(b.mr_lkey);
  if (!mr || mr->pd_ != pd || !(mr->access_ & IBV_ACCESS_MW_BIND) ||
      !mr->contains(b.addr, b.length))
    return IBV_WC_MW_BIND_ERR;
  // Remote write/atomic through a window need local write on its MR.
  if ((b.access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
      !(mr->access_ & IBV_ACCESS_LOCAL_WRITE))
    return IBV_WC_MW_BIND_ERR;
  if (mw->mr_) unbind(*mw);  // type 1 rebind
  mw->mr_ = mr;
  ++mr->mw_binds_;
  mw->va_ = b.addr;
  mw->length_ = b.length;
  mw->access_ = b.access & kRemote;
  mw->qpn_ = mw->type_ == IBV_MW_TYPE_2 ? qpn : 0;
  mw->rkey_ = b.new_rkey;
  return IBV_WC_SUCCESS;
}

ibv_wc_status Device::local_invalidate(const Pd* pd, uint32_t rkey) {
  MwLock lock(mw_lock_);
  Mw* mw = mw_by_rkey(rkey);
  if (!mw || mw->pd_ != pd || mw->type_ != IBV_MW_TYPE_2 || !mw->mr_)
    return IBV_WC_LOC_QP_OP_ERR;
  unbind(*mw);
  return IBV_WC_SUCCESS;
}

bool Device::remote_invalidate(const Pd* pd, uint32_t qpn, uint32_t rkey) {
  MwLock lock(mw_lock_);
  Mw* mw = mw_by_rkey(rkey);
  if (!mw || mw->pd_ != pd || mw->type_ != IBV_MW_TYPE_2 || !mw->mr_ ||
      mw->qpn_ != qpn)
    return false;
  unbind(*mw);
  return true;
}

Mr* Device::mr_by_lkey(uint32_t lkey) const {
  const uint32_t idx = lkey >> 8;
  if (idx >= mrs_.size()) return nullptr;
  Mr* mr = mrs_[idx].get();
  return mr->live_ && mr->lkey_ == lkey ? mr : nullptr;
}

Mr* Device::mr_by_rkey(uint32_t rkey) const {
  const uint32_t idx = rkey >> 8;
  if (idx >= mrs_.size()) return nullptr;
  Mr* mr = mrs_[idx].get();
  return mr->live_ && mr->rkey_ == rkey ? mr : nullptr;
}

AccessError Device::check_local(const Pd* pd, uint32_t lkey, uint64_t va,
                                uint64_t len, uint32_t rights, Mr** out) const {
  Mr* mr = mr_by_lkey(lkey);
  if (!mr) return AccessError::kBadKey;
  if (mr->pd_ != pd) return AccessError::kPd;
  if (!mr->contains(va, len)) return AccessError::kBounds;
  if ((mr->access_ & rights) != rights) return AccessError::kRights;
  *out = mr;
  return AccessError::kOk;
}

AccessError Device::check_remote(const Pd* pd, uint32_t rkey, uint64_t va,
                                 uint64_t len, uint32_t rights, Mr** out,
                                 uint32_t qpn) const {
  if ((rkey >> 8) >= kMwIndex) {
    MwLock lock(mw_lock_);
    const Mw* mw = mw_by_rkey(rkey);
    if (!mw || !mw->mr_) return AccessError::kBadKey;
    if (mw->pd_ != pd) return AccessError::kPd;
    if (mw->type_ == IBV_MW_TYPE_2 && mw->qpn_ != qpn)
      return AccessError::kBadKey;  // another QP's window
    if (!(va >= mw->va_ && va - mw->va_ <= mw->length_ &&
          len <= mw->length_ - (va - mw->va_)))
      return AccessError::kBounds;
    if ((mw->access_ & rights) != rights) return AccessError::kRights;
    *out = mw->mr_;  // the bytes: inside the MR, as the bind checked
    return AccessError::kOk;
  }
  Mr* mr = mr_by_rkey(rkey);
  if (!mr) return AccessError::kBadKey;
  if (mr->pd_ != pd) return AccessError::kPd;
  if (!mr->contains(va, len)) return AccessError::kBounds;
  if ((mr->access_ & rights) != rights) return AccessError::kRights;
  *out = mr;
  return AccessError::kOk;
}

int Device::create_cq(uint32_t cqe, Cq** out, void* shared) {
  if (cqe == 0 || cqe > cfg_.limits.max_cqe) return EINVAL;
  if (ncq_ >= cfg_.limits.max_cq) return ENOMEM;
  uint32_t idx;
  Cq* cq = take_slot(cqs_, dead_cqs_, &idx);
  *cq = Cq{};
  cq->slot_ = idx;
  if (!shared) {
    cq->own_ = std::make_unique<Cq::Page[]>(shim::cq_shared_len(cqe) /
                                            sizeof(Cq::Page));
    shared = cq->own_.get();  // value-initialised: zero
  }
  cq->sh_ = cq_block(shared, cqe, &cq->ring_);
  cq->cap_ = cqe;
  cq->mask_ = cq->sh_->size - 1;
  cq->dev_ = this;
  cq->live_ = true;
  ++ncq_;
  *out = cq;
  return 0;
}

int Device::resize_cq(Cq* cq, uint32_t cqe, void* shared) {
  if (!cq || !cq->live_ || cqe == 0 || cqe > cfg_.limits.max_cqe) return EINVAL;
  // What the consumer has not polled yet; a consumer index claiming more
  // than the ring holds is not believed (as in push()).
  const uint32_t cons = cq->sh_->cons.load(std::memory_order_acquire);
  const uint32_t held = cq->tail_ - cons;
  if (held > cq->cap_ || cqe < held) return EINVAL;
  std::unique_ptr<Cq::Page[]> own;
  if (!shared) {
    own = std::make_unique<Cq::Page[]>(shim::cq_shared_len(cqe) /
                                       sizeof(Cq::Page));
    shared = own.get();
  }
  ibv_wc* ring;
  shim::CqShared* sh = cq_block(shared, cqe, &ring);
  for (uint32_t i = 0; i < held; ++i)
    ring[i] = cq->ring_[(cons + i) & cq->mask_];
  sh->prod.store(held, std::memory_order_relaxed);
  sh->error.store(cq->sh_->error.load(std::memory_order_relaxed),
                  std::memory_order_relaxed);
  sh->arm.store(cq->sh_->arm.load(std::memory_order_relaxed),
                std::memory_order_release);
  cq->sh_ = sh;
  cq->ring_ = ring;
  cq->own_ = std::move(own);  // frees the old block when it was ours
  cq->cap_ = cqe;
  cq->mask_ = sh->size - 1;
  cq->tail_ = cq->pub_ = held;
  return 0;
}

int Device::destroy_cq(Cq* cq) {
  if (!cq || !cq->live_) return EINVAL;
  if (cq->users_) return EBUSY;
  cq->live_ = false;
  dead_cqs_.push_back(cq->slot_);
  if (cq->notify_fd_ >= 0) close(cq->notify_fd_);
  *cq = Cq{};
  --ncq_;
  return 0;
}

uint32_t Cq::size() const {
  return std::atomic_ref<uint32_t>(const_cast<uint32_t&>(pub_))
             .load(std::memory_order_acquire) -
         sh_->cons.load(std::memory_order_acquire);
}

int Cq::poll(std::span<ibv_wc> out) {
  uint32_t head = sh_->cons.load(std::memory_order_relaxed);
  const uint32_t prod = sh_->prod.load(std::memory_order_acquire);
  uint32_t n = 0;
  while (n < out.size() && head != prod) out[n++] = ring_[head++ & mask_];
  sh_->cons.store(head, std::memory_order_release);
  return static_cast<int>(n);
}

void Cq::req_notify(bool solicited_only) {
  // A solicited-only request does not narrow an armed "all" (verbs).
  if (sh_->arm.load(std::memory_order_relaxed) != shim::kArmAll)
    sh_->arm.store(solicited_only ? shim::kArmSolicited : shim::kArmAll,
                   std::memory_order_release);
}

namespace {
template <class T>
void bump(T& v, T n = 1) {  // a counter several lcores may add to
  std::atomic_ref<T>(v).fetch_add(n, std::memory_order_relaxed);
}
}  // namespace

// QPs of several engines (lcores) may complete into one CQ. A producer
// reserves a slot by CAS on tail_, writes it, then publishes in reservation
// order (waiting for the producers before it, as an MP rte_ring does); the
// wait is on the service's own pub_, never on the shared block, which the
// application can write. A CQ used by one lcore never waits.
bool Cq::push(const ibv_wc& wc, bool solicited) {
  std::atomic_ref<uint32_t> tail(tail_);
  uint32_t t;
  for (;;) {
    // tail, then cons (the acquire keeps the order): cons is then as new as
    // t or newer, so t - cons never overstates what is in the ring and a
    // "full" is real. The cost is that t may be older than what the
    // application already consumed (other lcores pushed meanwhile): t - cons
    // is then negative, and we read tail again (as rte_ring does, with the
    // opposite sign convention).
    t = tail.load(std::memory_order_acquire);
    const uint32_t cons = sh_->cons.load(std::memory_order_acquire);
    uint32_t used = t - cons;
    if (static_cast<int32_t>(used) < 0) {
      // The consumer index comes from another process: one ahead of every
      // completion ever reserved is a lie, treated as a full ring (below);
      // otherwise t was stale.
      if (static_cast<int32_t>(tail.load(std::memory_order_acquire) - cons) >=
          0)
        continue;
      used = cap_;
    }
    if (std::atomic_ref<bool>(error_).load(std::memory_order_relaxed) ||
        used >= cap_) {
      bump(overflows_);
      if (!std::atomic_ref<bool>(error_).exchange(true,
                                                  std::memory_order_relaxed)) {
        sh_->error.store(1, std::memory_order_release);
        dev_->raise({IBV_EVENT_CQ_ERR, 0, this, nullptr, owner_});
      }
      return false;
    }
    // Release: a producer that later reads this tail (acquire, above) then
    // sees a cons at least as new as the one this reservation was checked
    // against (free on x86 and ARMv8; the C++ model needs it).
    if (tail.compare_exchange_weak(t, t + 1, std::memory_order_release,
                                   std::memory_order_relaxed))
      break;
  }
  ring_[t & mask_] = wc;
  std::atomic_ref<uint32_t> pub(pub_);
  // The producer before us is between its reservation and its publish (a
  // 64 B copy); if it was preempted there (lcores sharing CPUs), give the
  // CPU back rather than spin through a scheduler slice.
  for (uint32_t spins = 0; pub.load(std::memory_order_acquire) != t; ++spins)
    if (spins >= 4096) sched_yield();
  // prod before pub_: the next producer stores its prod only after seeing
  // our pub_, so the application's prod never moves backwards.
  sh_->prod.store(t + 1, std::memory_order_release);
  pub.store(t + 1, std::memory_order_release);
  // Store prod, then load arm; the application stores arm, then loads prod.
  // Without a full fence on both sides each could miss the other's store:
  // a completion neither polled nor notified (abi.h, CqShared::arm).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const uint32_t arm = sh_->arm.load(std::memory_order_acquire);
  // A completion in error counts as solicited (ibv_req_notify_cq(3), IBTA
  // 11.4.2.2): an application waiting for solicited events only still
  // hears of a failed send or a flush.
  if (arm == shim::kArmAll || (arm == shim::kArmSolicited &&
                               (solicited || wc.status != IBV_WC_SUCCESS))) {
    if (sh_->arm.exchange(0, std::memory_order_acq_rel) != 0) {
      bump(events_);
      // One datagram to the completion channel; never blocks the lcore (a
      // channel nobody reads loses events, counted, not the data path).
      if (notify_fd_ >= 0 &&
          send(notify_fd_, &notify_cookie_, sizeof notify_cookie_,
               MSG_DONTWAIT | MSG_NOSIGNAL) != sizeof notify_cookie_)
        bump(notify_failures_);
    }
  }
  return true;
}

int Device::create_srq(Pd* pd, uint32_t max_wr, uint32_t max_sge, Srq** out) {
  if (!pd || !pd->live_) return EINVAL;
  if (max_wr == 0 || max_wr > cfg_.limits.max_srq_wr) return EINVAL;
  if (max_sge == 0 || max_sge > cfg_.limits.max_sge) return EINVAL;
  if (nsrq_ >= cfg_.limits.max_srq) return ENOMEM;
  uint32_t idx;
  Srq* srq = take_slot(srqs_, dead_srqs_, &idx);
  *srq = Srq{};
  srq->slot_ = idx;
  srq->ring_.resize(max_wr);
  srq->max_sge_ = max_sge;
  srq->pd_ = pd;
  srq->dev_ = this;
  srq->live_ = true;
  ++pd->users_;
  ++nsrq_;
  *out = srq;
  return 0;
}

int Device::modify_srq(Srq* srq, const ibv_srq_attr& attr, int mask) {
  if (!srq || !srq->live_) return EINVAL;
  if (mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT)) return EINVAL;
  if (mask & IBV_SRQ_MAX_WR) return EINVAL;  // no resizing
  if (mask & IBV_SRQ_LIMIT) {
    if (attr.srq_limit > srq->max_wr()) return EINVAL;
    srq->limit_ = attr.srq_limit;
  }
  return 0;
}

int Device::destroy_srq(Srq* srq) {
  if (!srq || !srq->live_) return EINVAL;
  if (srq->users_) return EBUSY;
  srq->live_ = false;
  dead_srqs_.push_back(srq->slot_);
  srq->ring_ = {};
  --srq->pd_->users_;
  --nsrq_;
  return 0;
}

int Srq::post(const RecvWr& wr) {
  if (wr.num_sge > max_sge_) return EINVAL;
  if (tail_ - head_ >= ring_.size()) return ENOMEM;
  ring_[tail_ % ring_.size()] = wr;
  ++tail_;
  return 0;
}

bool Srq::pop(RecvWr& out) {
  if (head_ == tail_) return false;
  out = ring_[head_ % ring_.size()];
  ++head_;
  if (pub_done_)
    pub_done_->store(static_cast<uint32_t>(head_), std::memory_order_release);
  // IBTA 10.2.9.2: the limit event fires once when the count drops below
  // the armed limit, then the limit disarms.
  if (limit_ && tail_ - head_ < limit_) {
    limit_ = 0;
    dev_->raise({IBV_EVENT_SRQ_LIMIT_REACHED, 0, nullptr, this, owner_});
  }
  return true;
}

int Device::resolve_path(const ibv_ah_attr& attr, Path* out) {
  if (!attr.is_global) return EINVAL;  // RoCE needs a GRH
  const ibv_global_route& g = attr.grh;
  if (g.sgid_index >= cfg_.num_gids) return EINVAL;
  Path p;
  std::memcpy(p.dgid, g.dgid.raw, 16);
  p.sgid_index = g.sgid_index;
  p.hop_limit = g.hop_limit ? g.hop_limit : 64;
  p.traffic_class = g.traffic_class;
  p.flow_label = g.flow_label & 0xfffff;
  p.sl = attr.sl;
  static constexpr uint8_t kZero[16] = {};
  if (std::memcmp(p.dgid, kZero, 16) == 0) return EINVAL;
  bool local = false;
  for (uint32_t i = 0; i < cfg_.num_gids; ++i)
    local |= std::memcmp(cfg_.gids[i], p.dgid, 16) == 0;
  if (local) {
    p.dmac = cfg_.mac;
  } else if (wire::gid_is_multicast(p.dgid)) {
    wire::multicast_mac(p.dgid, p.dmac);  // no neighbour to ask
  } else {
    if (!resolver_) return EHOSTUNREACH;
    const int rc = resolver_->resolve(p.dgid, &p.dmac);
    if (rc) return rc;
  }
  *out = p;
  return 0;
}

int Device::mcast_join(const Gid& gid) {
  const Limits& l = cfg_.limits;
  if (nmcast_ >= l.max_total_mcast_qp_attach) return ENOMEM;
  auto it = mcast_.find(gid);
  if (it == mcast_.end()) {
    if (mcast_.size() >= l.max_mcast_grp) return ENOMEM;
    it = mcast_.emplace(gid, 0).first;
  } else if (it->second >= l.max_mcast_qp_attach) {
    return ENOMEM;
  }
  ++nmcast_;
  if (++it->second == 1 && mcast_hook_) mcast_hook_(gid, true);
  return 0;
}

void Device::mcast_leave(const Gid& gid) {
  auto it = mcast_.find(gid);
  if (it == mcast_.end()) return;
  --nmcast_;
  if (--it->second != 0) return;
  mcast_.erase(it);
  if (mcast_hook_) mcast_hook_(gid, false);
}

bool Device::mcast_group(const uint8_t gid[16]) const {
  return !mcast_.empty() && mcast_.count(to_gid(gid)) != 0;
}

int Device::create_ah(Pd* pd, const ibv_ah_attr& attr, Ah** out) {
  if (!pd || !pd->live_) return EINVAL;
  if (nah_ >= cfg_.limits.max_ah) return ENOMEM;
  Path p;
  const int rc = resolve_path(attr, &p);
  if (rc) return rc;
  uint32_t idx;
  Ah* ah = take_slot(ahs_, dead_ahs_, &idx);
  *ah = Ah{};
  ah->slot_ = idx;
  ah->path_ = p;
  ah->pd_ = pd;
  ah->live_ = true;
  ++pd->users_;
  ++nah_;
  *out = ah;
  return 0;
}

int Device::destroy_ah(Ah* ah) {
  if (!ah || !ah->live_) return EINVAL;
  ah->live_ = false;
  dead_ahs_.push_back(ah->slot_);
  --ah->pd_->users_;
  --nah_;
  return 0;
}

// A slot is free for position p when its seq is p, holds p's event when it
// is p + 1; the consumer frees it for p + nevents_.
void Device::raise(const AsyncEvent& ev) {
  uint64_t t = ev_tail_.load(std::memory_order_relaxed);
  for (;;) {
    EventSlot& s = events_[t & (nevents_ - 1)];
    const uint64_t seq = s.seq.load(std::memory_order_acquire);
    if (seq == t) {
      if (ev_tail_.compare_exchange_weak(t, t + 1, std::memory_order_relaxed)) {
        s.ev = ev;
        s.seq.store(t + 1, std::memory_order_release);
        return;
      }
    } else if (static_cast<int64_t>(seq - t) < 0) {
      events_dropped_.fetch_add(1, std::memory_order_relaxed);  // full
      return;
    } else {
      t = ev_tail_.load(std::memory_order_relaxed);
    }
  }
}

bool Device::next_event(AsyncEvent* out) {
  const uint64_t h = ev_head_.load(std::memory_order_relaxed);
  EventSlot& s = events_[h & (nevents_ - 1)];
  if (s.seq.load(std::memory_order_acquire) != h + 1) return false;
  *out = s.ev;
  s.seq.store(h + nevents_, std::memory_order_release);
  ev_head_.store(h + 1, std::memory_order_relaxed);
  return true;
}

}  // namespace urnic::transport
