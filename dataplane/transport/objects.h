// Verbs objects the transport works on: PD, MR, CQ, SRQ, AH and the Device
// that owns them. Created and destroyed on the control path (which may
// allocate); used on the data path without allocation. lkey/rkey are an
// index plus random bits, so keys cannot be guessed from one another.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "dataplane/hostif/abi.h"
#include "dataplane/transport/types.h"
#include "dataplane/wire/headers.h"

namespace urnic::transport {

class Device;

// Who the control plane says owns a QP, CQ or SRQ (the service: a client
// and its handle; opaque here). Set before any lcore can reach the object
// and copied into the object's async events, so that routing an event is a
// lookup, not a search through every client's objects.
struct Owner {
  uint64_t client = 0;
  uint32_t handle = 0;
};

class Pd {
 public:
  uint32_t handle() const { return handle_; }

  bool live() const { return live_; }

 private:
  friend class Device;
  uint32_t handle_ = 0;
  uint32_t users_ = 0;  // MRs, QPs, SRQs, AHs on this PD
  bool live_ = false;
};

class Mr {
 public:
  Pd* pd() const { return pd_; }
  uint32_t lkey() const { return lkey_; }
  uint32_t rkey() const { return rkey_; }
  uint64_t iova() const { return iova_; }
  uint64_t length() const { return length_; }
  uint32_t access() const { return access_; }
  // True if [va, va+len) lies inside the region (overflow-safe).
  bool contains(uint64_t va, uint64_t len) const {
    return va >= iova_ && va - iova_ <= length_ &&
           len <= length_ - (va - iova_);
  }
  // Host address of `va`; valid only after contains().
  uint8_t* host(uint64_t va) const { return host_ + (va - iova_); }

  bool live() const { return live_; }

 private:
  friend class Device;
  Pd* pd_ = nullptr;
  uint8_t* host_ = nullptr;
  uint64_t iova_ = 0;
  uint64_t length_ = 0;
  uint32_t access_ = 0;
  uint32_t lkey_ = 0;
  uint32_t rkey_ = 0;
  uint32_t mw_binds_ = 0;  // windows bound to it (deregistration: EBUSY)
  bool live_ = false;
};

// Memory window (IBTA 10.6.7): a remote-access view of part of an MR,
// bound and invalidated through a QP's send queue. Type 1 belongs to its
// PD and is rebound at will; type 2 is bound once by one QP (and only that
// QP's peer may use it) until invalidated (LOCAL_INV, or a peer's
// SEND_WITH_INV). Its rkeys live in the upper half of the key space (index
// bit 23), so an MR key and an MW key never collide.
class Mw {
 public:
  Pd* pd() const { return pd_; }
  ibv_mw_type type() const { return type_; }
  uint32_t rkey() const { return rkey_; }
  bool bound() const { return mr_ != nullptr; }

  bool live() const { return live_; }

 private:
  friend class Device;
  Pd* pd_ = nullptr;
  ibv_mw_type type_ = IBV_MW_TYPE_1;
  uint32_t rkey_ = 0;
  Mr* mr_ = nullptr;  // bound to; null: free (no remote access)
  uint64_t va_ = 0;
  uint64_t length_ = 0;
  uint32_t access_ = 0;
  uint32_t qpn_ = 0;  // type 2: the QP it was bound through
  bool live_ = false;
};

// Completion queue. Overflow is an error, never a silent loss: the CQ goes
// to error, the completion that did not fit is counted, an IBV_EVENT_CQ_ERR
// is queued, and the QP that completed into it moves to error.
//
// The ring is a shim::CqShared block: in the service it lives in memory
// shared with the application (which polls and arms it without a system
// call); in tests the Device allocates it. The consumer index and the arm
// word are written by the consumer, so the engine clamps what it reads.
class Cq {
 public:
  uint32_t capacity() const { return cap_; }
  // ibv_poll_cq (in-process consumers): copies up to out.size() completions.
  int poll(std::span<ibv_wc> out);
  // ibv_req_notify_cq: the next completion (the next solicited one if
  // `solicited_only`) raises a completion event.
  void req_notify(bool solicited_only);
  // Read relaxed: engines on other lcores may be counting.
  uint64_t events() const { return relaxed(events_); }  // events raised
  bool in_error() const { return relaxed(error_); }
  uint64_t overflows() const { return relaxed(overflows_); }
  uint32_t size() const;
  // A completion event also sends `cookie` (8 bytes) on `fd` (a completion
  // channel's socket); the Cq owns fd from here on.
  void set_notify(int fd, uint64_t cookie) {
    notify_fd_ = fd;
    notify_cookie_ = cookie;
  }
  uint64_t notify_failures() const { return relaxed(notify_failures_); }
  void set_owner(const Owner& o) { owner_ = o; }

  // Engine side. False if the CQ is full (or already in error).
  bool push(const ibv_wc& wc, bool solicited);

  bool live() const { return live_; }

 private:
  friend class Device;
  template <class T>
  static T relaxed(const T& v) {
    return std::atomic_ref<T>(const_cast<T&>(v))
        .load(std::memory_order_relaxed);
  }
  shim::CqShared* sh_ = nullptr;
  ibv_wc* ring_ = nullptr;
  // The block, when not shared: page-aligned as a shared mapping is
  // (CqShared is cache-line aligned; the ring starts at a page).
  struct alignas(shim::kPageSize) Page {
    uint8_t bytes[shim::kPageSize];
  };
  std::unique_ptr<Page[]> own_;
  uint32_t cap_ = 0;   // completions it holds (what create_cq granted)
  uint32_t mask_ = 0;  // ring slots - 1 (slots: a power of two >= cap_)
  // Producer indices (push(): std::atomic_ref, several lcores): tail_
  // reserved, pub_ published (and copied to sh_->prod).
  uint32_t tail_ = 0;
  uint32_t pub_ = 0;
  uint64_t events_ = 0;
  uint64_t overflows_ = 0;
  uint64_t notify_failures_ = 0;
  int notify_fd_ = -1;
  uint64_t notify_cookie_ = 0;
  Owner owner_;
  bool error_ = false;
  uint32_t users_ = 0;  // QPs completing into it
  Device* dev_ = nullptr;
  bool live_ = false;
  uint32_t slot_ = 0;  // index in the Device's table
};

// Shared receive queue.
class Srq {
 public:
  Pd* pd() const { return pd_; }
  uint32_t max_wr() const { return static_cast<uint32_t>(ring_.size()); }
  uint32_t max_sge() const { return max_sge_; }
  uint32_t size() const { return static_cast<uint32_t>(tail_ - head_); }
  uint32_t limit() const { return limit_; }
  // The consumer index is also stored (release) here when set: the shim's
  // shared SRQ ring frees a slot for each WQE taken.
  void set_publish(std::atomic<uint32_t>* done) { pub_done_ = done; }
  void set_owner(const Owner& o) { owner_ = o; }
  // The host's handle of the ring the application posts to (opaque here;
  // RecvSource::refill's).
  void set_recv_ring(void* r) { recv_ring_ = r; }
  void* recv_ring() const { return recv_ring_; }
  // ibv_post_srq_recv: 0, ENOMEM (full) or EINVAL (too many SGEs).
  int post(const RecvWr& wr);
  // Engine side: takes the oldest WQE; raises the limit event when the
  // count drops below an armed limit.
  bool pop(RecvWr& out);

  bool live() const { return live_; }

 private:
  friend class Device;
  std::vector<RecvWr> ring_;
  uint64_t head_ = 0;
  uint64_t tail_ = 0;
  uint32_t max_sge_ = 0;
  uint32_t limit_ = 0;  // armed when non-zero (ibv_modify_srq IBV_SRQ_LIMIT)
  std::atomic<uint32_t>* pub_done_ = nullptr;
  void* recv_ring_ = nullptr;
  Owner owner_;
  Pd* pd_ = nullptr;
  Device* dev_ = nullptr;
  uint32_t users_ = 0;
  bool live_ = false;
  uint32_t slot_ = 0;  // index in the Device's table
};

// A resolved address: everything the headers of a packet to it carry.
struct Path {
  wire::MacAddr dmac{};
  uint8_t dgid[16] = {};
  uint8_t sgid_index = 0;
  uint8_t hop_limit = 64;
  uint8_t traffic_class = 0;
  uint32_t flow_label = 0;
  uint8_t sl = 0;
};

class Ah {
 public:
  const Path& path() const { return path_; }
  Pd* pd() const { return pd_; }

  bool live() const { return live_; }

 private:
  friend class Device;
  Path path_;
  Pd* pd_ = nullptr;
  bool live_ = false;
  uint32_t slot_ = 0;  // index in the Device's table
};

struct AsyncEvent {
  ibv_event_type type;
  uint32_t qpn = 0;    // QP events
  Cq* cq = nullptr;    // IBV_EVENT_CQ_ERR
  Srq* srq = nullptr;  // IBV_EVENT_SRQ_LIMIT_REACHED / SRQ_ERR
  Owner owner;         // the object's, when raised
};

// GID -> MAC for a destination (the service asks its neighbour cache; tests
// use a table). Called on the control path only (create_ah, modify_qp).
class Resolver {
 public:
  virtual ~Resolver() = default;
  // 0 with *mac set, or a positive errno (EHOSTUNREACH).
  virtual int resolve(const uint8_t dgid[16], wire::MacAddr* mac) = 0;
};

constexpr uint32_t kMaxGids = 16;

struct DeviceConfig {
  Limits limits;
  wire::MacAddr mac{};
  uint8_t gids[kMaxGids][16] = {};  // index 0: IPv4-mapped
  uint8_t num_gids = 0;
  bool vlan = false;
  uint16_t vlan_tci = 0;
  uint64_t key_seed = 0;              // 0: keys seeded from std::random_device
  ibv_mtu active_mtu = IBV_MTU_4096;  // port MTU: the UD message limit
};

// Result of checking a key against an access (IBTA 9.7.5.1: an invalid
// key, bounds, access right or PD all give the same Remote Access NAK).
enum class AccessError : uint8_t { kOk, kBadKey, kPd, kBounds, kRights };

class Device {
 public:
  explicit Device(const DeviceConfig& cfg, Resolver* resolver = nullptr);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const DeviceConfig& config() const { return cfg_; }
  const Limits& limits() const { return cfg_.limits; }

  // Control path: 0 or a positive errno (EINVAL bad argument, ENOMEM limit
  // reached, EBUSY object still in use).
  int alloc_pd(Pd** out);
  int dealloc_pd(Pd* pd);
  // `host` is where [iova, iova+length) lives in this process (the same as
  // iova for ibv_reg_mr). REMOTE_WRITE/ATOMIC require LOCAL_WRITE (verbs).
  int reg_mr(Pd* pd, void* host, uint64_t length, uint64_t iova,
             uint32_t access, Mr** out);
  // ibv_rereg_mr keeping the keys: `mr` takes `fresh`'s range, PD and
  // access, and `fresh` goes (its slot and keys freed). EBUSY while
  // windows are bound to `mr`. Lcores parked.
  int rereg_mr(Mr* mr, Mr* fresh);
  int dereg_mr(Mr* mr);  // EBUSY while windows are bound to it
  // ibv_alloc_mw / ibv_dealloc_mw (dealloc unbinds a bound window).
  int alloc_mw(Pd* pd, ibv_mw_type type, Mw** out);
  int dealloc_mw(Mw* mw);
  // Executed by the requester of QP `qpn` (PD `pd`) in send-queue order:
  // a bind (IBV_WC_MW_BIND_ERR if any rule of 10.6.7.2 fails) and a local
  // invalidate of a type 2 window (IBV_WC_LOC_QP_OP_ERR if it is not one,
  // bound, of this PD). IBV_WC_SUCCESS otherwise.
  ibv_wc_status bind_mw(const Pd* pd, uint32_t qpn, const MwBind& b);
  ibv_wc_status local_invalidate(const Pd* pd, uint32_t rkey);
  // SEND_WITH_INV received on QP `qpn`: invalidates the type 2 window
  // `rkey` bound through that QP. False if it is no such window.
  bool remote_invalidate(const Pd* pd, uint32_t qpn, uint32_t rkey);
  Mw* mw_by_rkey(uint32_t rkey) const;
  // capacity == cqe. With `shared` (shim::cq_shared_len(cqe) bytes,
  // zeroed, owned by the caller and outliving the CQ) the ring lives there.
  int create_cq(uint32_t cqe, Cq** out, void* shared = nullptr);
  // ibv_resize_cq: the CQ moves to a ring of at least `cqe` entries in
  // `shared` (cq_shared_len(cqe) bytes; allocated here when null), with its
  // unpolled completions in order at its start, its arm and error state
  // kept. EINVAL for a size out of range or below the completions it holds
  // (the CQ is unchanged then). A shared old block is the caller's to
  // free; one the Device allocated is freed here.
  int resize_cq(Cq* cq, uint32_t cqe, void* shared = nullptr);
  int destroy_cq(Cq* cq);
  int create_srq(Pd* pd, uint32_t max_wr, uint32_t max_sge, Srq** out);
  // IBV_SRQ_LIMIT arms the limit event; IBV_SRQ_MAX_WR is not resizable
  // (EINVAL), as on many devices.
  int modify_srq(Srq* srq, const ibv_srq_attr& attr, int mask);
  int destroy_srq(Srq* srq);
  int create_ah(Pd* pd, const ibv_ah_attr& attr, Ah** out);
  int destroy_ah(Ah* ah);
  // ibv_ah_attr -> Path (GRH required on RoCE; MAC via the resolver, or
  // our own MAC for one of our GIDs: loopback).
  int resolve_path(const ibv_ah_attr& attr, Path* out);

  // Data path lookups (no allocation). A key is valid only while its MR is.
  Mr* mr_by_lkey(uint32_t lkey) const;
  Mr* mr_by_rkey(uint32_t rkey) const;
  // Checks a local SGE / remote access of [va, va+len) with `rights`
  // (IBV_ACCESS_* bits; 0 for a local read) on `pd`.
  AccessError check_local(const Pd* pd, uint32_t lkey, uint64_t va,
                          uint64_t len, uint32_t rights, Mr** out) const;
  // An rkey may name an MR or a bound memory window (of this PD, and for
  // type 2 bound through QP `qpn`); *out is the MR that holds the bytes.
  AccessError check_remote(const Pd* pd, uint32_t rkey, uint64_t va,
                           uint64_t len, uint32_t rights, Mr** out,
                           uint32_t qpn = 0) const;

  // Asynchronous events (fixed ring; overflow counted). raise() runs on any
  // engine's lcore (several at once: each slot has a sequence word, as in
  // D. Vyukov's bounded MPMC queue), next_event() on one consumer thread.
  void raise(const AsyncEvent& ev);
  bool next_event(AsyncEvent* out);
  uint64_t events_dropped() const {
    return events_dropped_.load(std::memory_order_relaxed);
  }

  // Object counts, for limits and `urnicctl`.
  uint32_t num_pds() const { return npd_; }
  uint32_t num_mrs() const { return nmr_; }
  uint32_t num_mws() const { return nmw_; }
  uint32_t num_cqs() const { return ncq_; }
  uint32_t num_srqs() const { return nsrq_; }
  uint32_t num_ahs() const { return nah_; }
  // QPs of every engine on this device (each engine adds its own; control
  // thread), so max_qp holds for the device. Atomic: a worker reads it
  // unparked to choose its idle sleep (no QP anywhere: a longer one).
  uint32_t qp_total() const { return nqp_.load(std::memory_order_relaxed); }
  void count_qp(int d) {
    nqp_.fetch_add(static_cast<uint32_t>(d), std::memory_order_relaxed);
  }

  // Multicast groups with members on any engine, for the limits and for
  // the lcores' "is anyone here a member" (frames to other groups are not
  // ours). Changed by engines' attach/detach with every lcore parked;
  // read by any lcore.
  int mcast_join(const Gid& gid);  // 0 or ENOMEM (a limit)
  void mcast_leave(const Gid& gid);
  bool mcast_group(const uint8_t gid[16]) const;
  uint32_t mcast_groups() const { return static_cast<uint32_t>(mcast_.size()); }
  uint32_t mcast_attached() const { return nmcast_; }
  // Called (control thread) when a group gets its first member on the
  // device (`joined`) or loses its last, however that happens.
  using McastHook = std::function<void(const Gid& gid, bool joined)>;
  void set_mcast_hook(McastHook h) { mcast_hook_ = std::move(h); }
  // f(const Gid&) for every group (any lcore; no allocation).
  template <class F>
  void for_each_mcast_group(F&& f) const {
    for (const auto& e : mcast_) f(e.first);
  }

  // Engine bookkeeping of which objects QPs use.
  static void hold(Pd* pd) { ++pd->users_; }
  static void release(Pd* pd) { --pd->users_; }
  static void hold(Cq* cq) { ++cq->users_; }
  static void release(Cq* cq) { --cq->users_; }
  static void hold(Srq* srq) { ++srq->users_; }
  static void release(Srq* srq) { --srq->users_; }

 private:
  static constexpr uint32_t kMwIndex = 1u << 23;  // MW key indices from here
  static void unbind(Mw& mw);
  uint32_t new_key(uint32_t index, uint32_t old);

  DeviceConfig cfg_;
  Resolver* resolver_;
  std::mt19937_64 key_rng_;
  std::vector<std::unique_ptr<Pd>> pds_;
  std::vector<std::unique_ptr<Mr>> mrs_;  // index = key >> 8
  std::vector<std::unique_ptr<Mw>> mws_;  // index = (key >> 8) - kMwIndex
  std::vector<std::unique_ptr<Cq>> cqs_;
  std::vector<std::unique_ptr<Srq>> srqs_;
  std::vector<std::unique_ptr<Ah>> ahs_;
  // The dead slots of each table, the one to reuse last: taking a slot is
  // O(1) however many objects live.
  std::vector<uint32_t> dead_pds_, dead_mrs_, dead_mws_, dead_cqs_, dead_srqs_,
      dead_ahs_;
  uint32_t npd_ = 0, nmr_ = 0, nmw_ = 0, ncq_ = 0, nsrq_ = 0, nah_ = 0;
  std::atomic<uint32_t> nqp_{0};
  std::map<Gid, uint32_t> mcast_;  // group -> members
  uint32_t nmcast_ = 0;            // attachments
  McastHook mcast_hook_;
  struct EventSlot {
    std::atomic<uint64_t> seq{0};
    AsyncEvent ev;
  };
  std::unique_ptr<EventSlot[]> events_;
  uint64_t nevents_ = 0;                           // a power of two
  std::atomic<uint64_t> ev_head_{0}, ev_tail_{0};  // consumer / producers
  std::atomic<uint64_t> events_dropped_{0};
  // Memory windows are bound and invalidated by the QPs' lcores (any of
  // them) and looked up by any responder: their fields change only under
  // this lock. MR keys, the common case, take no lock.
  mutable std::atomic_flag mw_lock_ = ATOMIC_FLAG_INIT;
  struct MwLock {
    explicit MwLock(std::atomic_flag& f) : f_(f) {
      while (f_.test_and_set(std::memory_order_acquire))
        while (f_.test(std::memory_order_relaxed)) {
        }
    }
    ~MwLock() { f_.clear(std::memory_order_release); }
    std::atomic_flag& f_;
  };
};

}  // namespace urnic::transport
