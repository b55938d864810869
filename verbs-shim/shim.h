// Internal declarations of liburnic-verbs.so (the LD_PRELOAD verbs shim):
// the objects behind the ibv_* handles it gives out, the control-socket
// client, and how calls reach the real libibverbs for other devices.
#pragma once

#include <infiniband/verbs.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#include "dataplane/hostif/abi.h"
#include "verbs-shim/handle_table.h"

// Every exported verb. Unversioned definitions in a preloaded library win
// over libibverbs' versioned ones, whatever version the caller asked for.
#define URNIC_EXPORT extern "C" __attribute__((visibility("default")))

// verbs.h turns these into inline helpers over the exported symbols, which
// are ours.
#undef ibv_reg_mr
#undef ibv_reg_mr_iova
#undef ibv_query_port

// Declared in rdma-core's driver.h only (a private export tools use).
enum ibv_gid_type_sysfs {
  IBV_GID_TYPE_SYSFS_IB_ROCE_V1,
  IBV_GID_TYPE_SYSFS_ROCE_V2,
};
URNIC_EXPORT int ibv_query_gid_type(struct ibv_context* context,
                                    uint8_t port_num, unsigned int index,
                                    enum ibv_gid_type_sysfs* type);

namespace urnic::shim {

// --- reaching the real libibverbs ------------------------------------------

// The next definition after this library (libibverbs), or nullptr.
void* find_real(const char* name, const char* version);

// REAL(ibv_alloc_pd, "IBVERBS_1.1") is a pointer of the function's type,
// looked up until found (a program may load libibverbs after its first
// verb reached this library), then kept: find_real pins its library.
#define URNIC_REAL(fn, ver)                                              \
  ([]() {                                                                \
    static std::atomic<void*> urnic_real_cache{nullptr};                 \
    void* urnic_real = urnic_real_cache.load(std::memory_order_acquire); \
    if (!urnic_real) {                                                   \
      urnic_real = ::urnic::shim::find_real(#fn, ver);                   \
      if (urnic_real)                                                    \
        urnic_real_cache.store(urnic_real, std::memory_order_release);   \
    }                                                                    \
    return reinterpret_cast<decltype(&fn)>(urnic_real);                  \
  }())

// nullptr with errno set: how a verb returning an object fails.
template <typename T>
T* fail(int err) {
  errno = err;
  return nullptr;
}

// --- diagnostics
// --------------------------------------------------------------

// One line to stderr, prefixed "urnic: ".
void say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// Service refusals are printed unless URNIC_QUIET is set.
bool quiet();

// Cooperative polling (URNIC_POLL_YIELD=N, default 0 = off): every Nth
// empty CQ poll of a thread calls sched_yield(), so a urnicd worker sharing
// its CPU runs at once instead of after the scheduler's slice
// (milliseconds). For machines with fewer cores than pollers; a thread alone
// on its CPU pays one system call per N empty polls.
void empty_poll();

// A minimal lock for the data path: no system call when uncontended, and
// the holder never sleeps.
class SpinLock {
 public:
  void lock() {
    while (locked_.exchange(true, std::memory_order_acquire))
      while (locked_.load(std::memory_order_relaxed)) __builtin_ia32_pause();
  }
  void unlock() { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

// --- devices
// -------------------------------------------------------------------

constexpr int kMaxDevices = 16;

struct Device {
  ibv_device dev{};  // first: the application holds &dev
  int index = 0;
  std::string path;  // the service's control socket
  std::mutex mu;     // guards the fields below
  bool have_info = false;
  OpenRep info;  // from the last open (or a probe)
  std::atomic<bool> down_reported{false};
  std::atomic<bool> lost_reported{false};
};

// Our device for `d`, or nullptr when `d` is another provider's.
Device* urnic_device(const ibv_device* d);
// The device attributes, asking the service if no context has been opened
// yet. False if the service cannot be reached.
bool device_info(Device& d, OpenRep* out);

// What a path names among the files a kernel verbs device has (files.cc
// answers open/stat/access for them).
enum class DevPath {
  kNone,     // not a urnic device's path: the real file system's
  kNode,     // /dev/infiniband/<dev_name>: the character device
  kDir,      // a sysfs directory
  kFile,     // a sysfs file; *content is what it reads
  kMissing,  // below a urnic device's sysfs directory, but absent: *err
};
DevPath device_path(const char* path, std::string* content, int* err);

// The RDMA CM node (rdmacm.cc): open() of /dev/infiniband/rdma_cm is an
// event channel of the first urnic device's service (cm_service_path()).
bool is_cm_node(const char* path);
int cm_open(int flags);  // an fd, or -1 with errno
std::string cm_service_path();

// --- contexts
// -------------------------------------------------------------------

struct Context;

// What the application sees: a verbs_context (ibv_context last, as
// verbs_get_ctx() requires), then the way back to our Context.
struct CtxBox {
  verbs_context vctx;
  Context* self;
};
static_assert(std::is_standard_layout_v<CtxBox>);

struct Qp;
struct Cq;
struct Srq;

struct Context {
  CtxBox box{};
  Device* dev = nullptr;
  int ctl_fd = -1;
  // Set when the service connection failed (or in a forked child): every
  // later call fails with EIO without touching the socket.
  std::atomic<bool> dead{false};
  // A forked child: its rings and doorbell page are not mapped here
  // (MADV_DONTFORK), so nothing may even read them.
  std::atomic<bool> in_child{false};
  std::mutex ctl_mu;           // one request, one reply
  std::unique_ptr<char[]> rx;  // reply buffer, ctl::kMaxMsg bytes
  DoorbellPage* db = nullptr;
  size_t db_len = 0;
  OpenRep info;
  // The worker lcores' bells, by home (info.homes of them): written after
  // ringing a doorbell whose lcore waits for events (ring_and_wake()).
  std::array<int, kSummaryWords> bells = [] {
    std::array<int, kSummaryWords> b;
    b.fill(-1);
    return b;
  }();
  void close_bells() {
    for (int& b : bells) {
      if (b >= 0) close(b);
      b = -1;
    }
  }
  std::atomic<bool> async_eof{false};
  std::mutex obj_mu;  // the handle maps (events look objects up)
  HandleTable<Qp> qps;
  HandleTable<Cq> cqs;
  HandleTable<Srq> srqs;
  std::vector<int> channel_fds;  // our ends of the completion channels

  ibv_context* ibv() { return &box.vctx.context; }

  // One control request: `req` (+ fds, which stay the caller's) and a reply
  // of exactly `rep_len` bytes (+ exactly `nrep_fds` fds). Returns 0 or an
  // errno value (also stored in errno); a refusal's message is printed as
  // "urnic: <what>: ...". A dead service connection gives EIO.
  int call(Op op, const char* what, const void* req, size_t req_len,
           const int* fds, int nfds, void* rep, size_t rep_len,
           int* rep_fds = nullptr, int nrep_fds = 0);
  // Marks the context unusable and says so once.
  void lost(const char* why);
  // Whether the service's end of the control connection is gone (killed:
  // a SIGTERM'd service says so in the doorbell page instead), waiting up
  // to `wait_ms` for it. One poll(2); the connection is not read.
  bool hung_up(int wait_ms = 0) const;
  // A queue that stays full: ENOMEM, or EIO (and lost()) when the service
  // is gone, so that a program posting in a loop hears why.
  int full_or_gone();
};

// Rings doorbell `doorbell` of the context, and the bell of the lcore that
// serves it when that lcore waits for events (DoorbellPage::waiting).
void ring_and_wake(Context& ctx, uint32_t doorbell);

// The Context of an ibv_context we made (its CtxBox).
inline Context& ctx_of(ibv_context* c) {
  auto* vctx = reinterpret_cast<verbs_context*>(
      reinterpret_cast<char*>(c) - offsetof(verbs_context, context));
  return *reinterpret_cast<CtxBox*>(vctx)->self;
}
inline bool is_urnic(const ibv_context* c) {
  return c && urnic_device(c->device) != nullptr;
}

// Every open urnic context (for fork handling).
void register_context(Context* c);
void unregister_context(Context* c);

// --- objects
// ---------------------------------------------------------------------

struct Channel {
  ibv_comp_channel ch{};  // first
  uint32_t handle = 0;
};

struct Cq {
  ibv_cq_ex cqx{};  // first; ibv_cq is its prefix
  Context* ctx = nullptr;
  uint32_t handle = 0;  // ours (HandleTable); the application can write cqx's
  Channel* channel = nullptr;
  CqShared* sh = nullptr;
  ibv_wc* ring = nullptr;
  uint32_t mask = 0;
  uint32_t cons = 0;            // our consumer index (published to sh->cons)
  uint32_t empty_polls = 0;     // service_gone() counts them (under lock)
  const ibv_wc* cur = nullptr;  // ibv_cq_ex polling: the current entry
  void* map = nullptr;
  size_t map_len = 0;
  uint32_t events = 0;  // completion events delivered (ibv_get_cq_event)
  // Async events handed out (ibv_get_async_event, under Context::obj_mu):
  // destroy waits until the application acknowledged as many.
  uint32_t async_reported = 0;
  SpinLock lock;
};
static_assert(std::is_standard_layout_v<Cq>);

struct Srq {
  ibv_srq srq{};  // first
  Context* ctx = nullptr;
  uint32_t handle = 0;  // ours (HandleTable)
  SrqShared* sh = nullptr;
  ShmRecvWqe* ring = nullptr;
  uint32_t size = 0;
  uint32_t prod = 0;
  uint32_t max_sge = 0;
  uint32_t doorbell = 0;
  void* map = nullptr;
  size_t map_len = 0;
  uint32_t events_reported = 0;  // as Cq::async_reported
  SpinLock lock;
};
static_assert(std::is_standard_layout_v<Srq>);

// A QP: the shim's state, then (at kQpVerbsOffset, PlainQp / ExQp) what
// the application holds: an ibv_qp, or for a QP created with
// send_ops_flags an ibv_qp_ex, whose first member is that ibv_qp, and the
// ibv_wr_* batch. Only those carry the ibv_qp_ex's 192 B of function
// pointers. The state is kept to what posting needs, in the narrowest
// types the service's limits allow (checked at create): at 16384 QPs every
// byte here is 16 KiB. new_qp / delete_qp allocate and free them.
struct Qp {
  QpShared* sh = nullptr;  // the mapping starts here: header, then rings
  uint32_t handle = 0;     // ours; the application can write ibv_qp's
  uint32_t sq_prod = 0, rq_prod = 0;  // ours; published with release
  uint32_t sq_off = 0, rq_off = 0;    // of the rings in the mapping
  uint32_t map_len = 0;
  std::atomic<uint32_t> path_mtu{0};  // bytes, once set by ibv_modify_qp
  ibv_qp_type type = IBV_QPT_RC;
  // Granted (ibv_qp_cap; the WR counts are the service's to report).
  uint16_t max_inline = 0;                     // <= kMaxInline
  uint8_t max_send_sge = 0, max_recv_sge = 0;  // <= kMaxSge
  uint16_t doorbell = 0;                       // < kMaxDoorbells
  uint8_t sq_log = 0, rq_log = 0;              // ring sizes, log2
  bool has_srq = false;
  bool ex = false;  // created with send_ops_flags (ibv_qp_to_qp_ex)
  SpinLock sq_lock, rq_lock;
  uint32_t events_reported = 0;  // as Cq::async_reported

  ibv_qp* ibv();
  const ibv_qp* ibv() const;
  ibv_qp_ex* ibv_ex() { return reinterpret_cast<ibv_qp_ex*>(ibv()); }  // ex
  // From ibv_qp.context, which every verb reads anyway to tell our QPs
  // from another provider's (is_urnic): an application that overwrites it
  // breaks only itself, as before.
  Context& ctx() const { return ctx_of(ibv()->context); }
  uint32_t sq_size() const { return 1u << sq_log; }
  uint32_t rq_size() const { return has_srq ? 0 : 1u << rq_log; }
  ShmSendWqe* sq() const {
    return reinterpret_cast<ShmSendWqe*>(reinterpret_cast<char*>(sh) + sq_off);
  }
  ShmRecvWqe* rq() const {
    return reinterpret_cast<ShmRecvWqe*>(reinterpret_cast<char*>(sh) + rq_off);
  }
};
static_assert(std::is_standard_layout_v<Qp>);
static_assert(kMaxInline <= UINT16_MAX && kMaxSge <= UINT8_MAX &&
              kMaxDoorbells <= UINT16_MAX + 1);

// An ibv_wr_* batch (between wr_start and wr_complete / wr_abort).
struct WrBatch {
  ShmSendWqe* cur = nullptr;
  uint32_t n = 0;  // WQEs built
  int err = 0;     // first error
  bool ud_set = false;
};

struct PlainQp {
  Qp q;
  ibv_qp v{};
};
struct ExQp {
  Qp q;
  ibv_qp_ex v{};  // v.qp_base is the ibv_qp
  WrBatch wr;
};
static_assert(std::is_standard_layout_v<PlainQp> &&
              std::is_standard_layout_v<ExQp>);
static_assert(offsetof(PlainQp, v) == offsetof(ExQp, v) &&
              offsetof(ExQp, v.qp_base) == offsetof(ExQp, v));
inline constexpr size_t kQpVerbsOffset = offsetof(PlainQp, v);

// The batch of a QP created with send_ops_flags (the only ones whose
// ibv_qp_ex, and so whose ibv_wr_* calls, the application can reach).
inline WrBatch& wr_batch(Qp& q) {
  return reinterpret_cast<ExQp*>(&q)->wr;  // q is its first member
}

inline ibv_qp* Qp::ibv() {
  return reinterpret_cast<ibv_qp*>(reinterpret_cast<char*>(this) +
                                   kQpVerbsOffset);
}
inline const ibv_qp* Qp::ibv() const {
  return reinterpret_cast<const ibv_qp*>(reinterpret_cast<const char*>(this) +
                                         kQpVerbsOffset);
}
// The QP of the application's handle (container-of).
inline Qp& qp_of(ibv_qp* q) {
  return *reinterpret_cast<Qp*>(reinterpret_cast<char*>(q) - kQpVerbsOffset);
}
inline Qp& qp_of(ibv_qp_ex* q) {
  return qp_of(&q->qp_base);
}
// A zeroed QP with `ex` set, or nullptr; delete_qp frees either form.
inline Qp* new_qp(bool ex) {
  if (ex) {
    auto* x = new (std::nothrow) ExQp;
    if (!x) return nullptr;
    x->q.ex = true;
    return &x->q;
  }
  auto* p = new (std::nothrow) PlainQp;
  return p ? &p->q : nullptr;
}
inline void delete_qp(Qp* q) {
  if (!q) return;
  if (q->ex)
    delete reinterpret_cast<ExQp*>(q);  // q is its first member
  else
    delete reinterpret_cast<PlainQp*>(q);
}
inline Cq& cq_of(ibv_cq* c) {
  return *reinterpret_cast<Cq*>(c);
}
inline Cq& cq_of(ibv_cq_ex* c) {
  return *reinterpret_cast<Cq*>(c);
}
inline Srq& srq_of(ibv_srq* s) {
  return *reinterpret_cast<Srq*>(s);
}

// Maps `len` bytes of a service-made fd (MAP_SHARED, not inherited by
// children) and closes it. nullptr on failure (errno set).
void* map_service_fd(int fd, size_t len);

// Data path (datapath.cc).
int post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
int bind_mw(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind* mb);
ibv_mw* alloc_mw(ibv_pd* pd, ibv_mw_type type);
int dealloc_mw(ibv_mw* mw);
int post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);
int post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad);
int poll_cq(ibv_cq* cq, int n, ibv_wc* wc);
int req_notify_cq(ibv_cq* cq, int solicited_only);
// Drops the unpolled completions of QP `qpn` from `cq` (null: none), the
// others kept in order: a QP moved to RESET or destroyed leaves nothing
// behind, as mlx5 and mlx4 clean their CQs (mlx5_cq_clean).
void cq_clean(ibv_cq* cq, uint32_t qpn);
// Fills the ibv_qp_ex function table for the ops in send_ops_flags.
void set_qp_ex_ops(Qp& q, uint64_t send_ops_flags);
void set_cq_ex_ops(Cq& c);

// Verbs context ops (objects.cc) installed by ibv_open_device.
ibv_cq_ex* create_cq_ex(ibv_context* ctx, ibv_cq_init_attr_ex* attr);
ibv_qp* create_qp_ex(ibv_context* ctx, ibv_qp_init_attr_ex* attr);
ibv_srq* create_srq_ex(ibv_context* ctx, ibv_srq_init_attr_ex* attr);

// After an object is destroyed: its unread async events leave the socket
// (abi.h, kAsyncRequeue). Call with the object gone from the handle maps.
void purge_async_events(Context& c);
void install_fork_handlers();  // events.cc

// urnic's side of each verb in verbs.def (forward.cc exports the verbs and
// sends calls here when the object is urnic's).
namespace ours {
#define URNIC_VERB(result, name, version, missing, params, args) \
  result name params;
#define URNIC_VERB_FIXED(...)
#include "verbs-shim/verbs.def"
#undef URNIC_VERB
#undef URNIC_VERB_FIXED
}  // namespace ours

}  // namespace urnic::shim
