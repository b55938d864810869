// The service side of the verbs shim (dataplane/hostif/abi.h): per-client verbs
// objects on the control thread, and the doorbell/ring path on the worker
// lcores.
//
// Threads: handle()/on_close()/pump_events() run on the control thread and
// may allocate; they change the Device, an Engine and the lcore-visible
// tables only while the lcores that read them are parked at the top of
// their loops (LcoreGate): a QP's own engine and doorbell table park its
// home lcore only, objects every lcore may use (MRs, CQs, PDs, the client
// list) park them all. doorbells_st() runs on each worker lcore (its home
// index) and never allocates. The two halves live in two files:
// shim_server.cc (control thread) and shim_server_lcore.cc (worker lcores).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/urnic_config.h"
#include "dataplane/hostif/abi.h"
#include "dataplane/service/control.h"
#include "dataplane/service/lcore_gate.h"
#include "dataplane/transport/engine.h"

namespace urnic::service {

// A mapping of shared memory in the service.
struct Mapping {
  void* base = nullptr;
  size_t len = 0;
  // Set for a view of the application's own file (map_foreign_view,
  // foreign::add()ed): what was mapped, whole (huge) pages wider than
  // [base, base + len), which munmap takes whole.
  void* whole = nullptr;
  size_t whole_len = 0;
};

// Application memory the worker lcores may transmit from without a copy
// (zero-copy TX). map_dma() makes a range reachable by the port's DMA (a
// PCI port pins its pages: slow, so on a thread of the TxMemory's own when
// dma_is_slow(), its future ready later; always with the lcores running);
// map() then records
// the outcome and says whether the range can be sent from at all; add()
// makes it visible to the lcores. add/remove run while every worker lcore
// is parked (remove of a range never added need not be); a removed range
// may still be referenced by mbufs in flight: busy() says so, and the
// caller unmaps it only once busy() is false. A map_dma() that succeeded is
// always followed by map() with its result (which takes ownership of the
// DMA mapping; remove() then gives it back).
class TxMemory {
 public:
  virtual ~TxMemory() = default;
  virtual bool dma_is_slow() const = 0;
  // Control thread; the future holds 0 or an errno.
  virtual std::future<int> map_dma(void* base, size_t len) = 0;
  // Control thread; false: it is copied.
  virtual bool map(void* base, size_t len, int dma_error) = 0;
  virtual void add(void* base, size_t len) = 0;
  virtual void remove(void* base) = 0;
  virtual bool busy(void* base) = 0;
};

// What the control thread needs of the rest of the service.
struct ShimEnv {
  transport::Device* dev = nullptr;
  // One per worker lcore (its home index): the engine that owns the QPs
  // homed there and the gate that parks the lcore. At most
  // shim::kSummaryWords.
  std::vector<transport::Engine*> engines;
  std::vector<LcoreGate*> gates;
  // Whether the neighbour cache knows `dgid`: 0 if it does (or the GID is
  // ours); EINPROGRESS while the lcore resolves it (the request is then
  // deferred, CtlReply::later, and asked again: `attempt`, first arrived at
  // `since_ns`); a positive errno once it gave up. Never blocks: a peer
  // that does not answer ARP held the control thread, and every other
  // client, for 3 s. Never called while the lcore is parked.
  std::function<int(const uint8_t dgid[16], uint32_t attempt,
                    uint64_t since_ns)>
      warm_neighbour;
  shim::OpenRep info;  // device/port attributes and GIDs
  // Each worker's bell (an eventfd, by home; the server keeps them): a
  // client gets a copy of each at open and writes one after ringing a
  // doorbell whose lcore waits (shim::DoorbellPage::waiting).
  std::vector<int> bells;
  std::function<void(ibv_port_attr&)> port_state;  // live link state
  TxMemory* tx_memory = nullptr;  // null: the lcore copies every payload
  config::ClientLimitsConfig client_limits;  // 0s: no per-client limit
  // A multicast group got its first member on the device (`joined`) or
  // lost its last: the service tells the link (IGMP). Control thread.
  std::function<void(const uint8_t gid[16], bool joined)> mcast_changed;
};

// Counters the control thread keeps (read by stats).
struct ShimCounters {
  std::atomic<uint64_t> clients{0}, clients_closed{0}, requests{0},
      request_errors{0}, doorbells{0}, bad_wqes{0}, async_events{0},
      async_deferred{0}, async_dropped{0}, client_limit_refusals{0},
      mcast_joins{0}, mcast_leaves{0},  // groups new to / gone from the device
      sends_at_destroy{0};  // QPs that went with sends posted, not yet taken
};

class ShimServer final : public transport::RecvSource {
 public:
  explicit ShimServer(ShimEnv env);
  ~ShimServer() override;
  ShimServer(const ShimServer&) = delete;
  ShimServer& operator=(const ShimServer&) = delete;

  // Control thread.
  static bool is_shim_op(uint16_t op) { return op >= 100 && op < 200; }
  void handle(CtlRequest& req, CtlReply& rep);
  void on_close(const ClientInfo& ci);
  void pump_events();  // the Device's async events -> clients' sockets
  // The port's link went down or up: IBV_EVENT_PORT_ERR / PORT_ACTIVE for
  // port 1 to every client (as rxe raises them; query_device says the
  // device does, IBV_DEVICE_PORT_ACTIVE_EVENT).
  void port_event(bool up);
  // Service shutdown, after the lcores stopped and before the control
  // connections close: every QP goes to error (its outstanding WRs complete
  // with IBV_WC_WR_FLUSH_ERR in the application's CQ, armed completion
  // channels fire) and every client gets IBV_EVENT_DEVICE_FATAL. Once.
  void shutdown();
  size_t clients_open() const { return live_.size(); }
  std::string objects_text() const;  // `urnicctl objects`
  const ShimCounters& counters() const { return ctr_; }
  // Counters and live object counts, by name (stats).
  std::vector<std::pair<const char*, uint64_t>> stats() const;

  // Worker lcore `home`: serves the rung doorbells of the QPs and SRQs
  // homed there; returns WQEs taken and adds the doorbells served to *rung.
  uint32_t doorbells_st(uint32_t home, uint32_t* rung);
  // Lcore of `home`: marks it waiting for events (or no longer) in every
  // live client's doorbell page, so that a client that rings one of its
  // doorbells writes its bell (shim::DoorbellPage::waiting). The client
  // list changes only while every lcore is parked: a waiting lcore is
  // woken (its bell) and unmarks itself before it parks.
  void set_waiting_st(uint32_t home, bool waiting);
  // The engine's lcore, for a QP or SRQ homed there whose queue it found
  // empty (transport::RecvSource).
  bool refill(transport::Qp& qp) override;
  bool refill(transport::Srq& srq) override;
  // Control thread: QPN -> the pid of the client that owns it.
  std::vector<std::pair<uint32_t, pid_t>> qp_owners() const;
  // QPs over all engines.
  size_t qp_count() const;

 private:
  struct QpObj {
    transport::Qp* qp = nullptr;
    Mapping mem;
    shim::QpShared* sh = nullptr;
    shim::ShmSendWqe* sq = nullptr;
    shim::ShmRecvWqe* rq = nullptr;
    // The service's own copy of the ring sizes (powers of two): the copy in
    // `sh` is the application's to overwrite and is never read back.
    uint32_t sq_size = 0, rq_size = 0;
    uint32_t home = 0;  // the worker (engine) that owns the QP
    uint32_t doorbell = 0;
    uint32_t sq_seen = 0, rq_seen = 0;  // lcore: WQEs taken from the rings
    bool broken = false;                // the application corrupted a ring
    uint32_t pd = 0, send_cq = 0, recv_cq = 0, srq = 0;
    uint32_t wrs = 0;  // charged to the client's client_limits.max_wr
  };
  struct SrqObj {
    transport::Srq* srq = nullptr;
    Mapping mem;
    shim::SrqShared* sh = nullptr;
    shim::ShmRecvWqe* ring = nullptr;
    uint32_t size = 0;  // slots; never read back from `sh`
    // Its QPs are homed with it: one lcore takes its WQEs (single consumer).
    uint32_t home = 0;
    uint32_t doorbell = 0;
    uint32_t seen = 0;
    bool broken = false;
    uint32_t pd = 0;
    uint32_t wrs = 0;  // charged to the client's client_limits.max_wr
  };
  struct CqObj {
    transport::Cq* cq = nullptr;
    Mapping mem;
    uint32_t channel = 0;
  };
  struct MrObj {
    transport::Mr* mr = nullptr;
    Mapping view;
    uint64_t bytes = 0;  // registered length (client_limits.max_mr_bytes)
  };
  struct AhObj {
    transport::Ah* ah = nullptr;
    uint32_t pd = 0;
  };
  struct Target {  // what a doorbell index rings
    QpObj* qp = nullptr;
    SrqObj* srq = nullptr;
  };
  // An MR's view being DMA-mapped on another thread (TxMemory::map_dma):
  // pinning a large MR's pages would hold the control thread, and every
  // client, for as long.
  struct PendingMr {
    Mapping view;
    shim::RegMrReq req;    // as checked
    std::future<int> dma;  // map_dma's result; not valid(): queued
  };
  struct Client {
    ClientInfo info;
    bool open = false;
    int async_fd = -1;
    Mapping db_mem;
    shim::DoorbellPage* db = nullptr;
    uint32_t next_handle = 1;
    std::map<uint32_t, transport::Pd*> pds;
    std::map<uint32_t, MrObj> mrs;
    std::map<uint32_t, transport::Mw*> mws;
    std::map<uint32_t, int> channels;  // handle -> service end of socket
    std::map<uint32_t, CqObj> cqs;
    std::map<uint32_t, std::unique_ptr<SrqObj>> srqs;
    std::map<uint32_t, std::unique_ptr<QpObj>> qps;
    std::map<uint32_t, AhObj> ahs;
    // Per home lcore (only that lcore reads its table): doorbell index ->
    // Target through db_local(); free indices for reuse.
    std::vector<Target> targets[shim::kSummaryWords];
    std::vector<uint32_t> free_doorbells[shim::kSummaryWords];
    uint64_t mr_bytes = 0;  // sums of MrObj::bytes and of QpObj/SrqObj::wrs
    uint64_t wrs = 0;
    // A kRegMr whose DMA mapping runs off the control thread; the request
    // is deferred (CtlReply::later) until it is done.
    std::optional<PendingMr> pending_mr;
    // Async events the socket had no room for (the application reads them
    // slower than they come: a flush of many QPs), in order, sent as room
    // comes; the kernel's uverbs queues them without bound, and a program
    // waiting for LAST_WQE_REACHED before destroying a QP must get it.
    std::deque<shim::AsyncMsg> async_backlog;
  };

  int dispatch(Client& c, CtlRequest& req, CtlReply& rep);
  // True (and why_ says which, the refusal counted) when adding `add` to
  // `have` goes over a client limit `max` (0: none).
  bool over_limit(const char* key, uint64_t have, uint64_t add, uint64_t max);
  int op_open(Client& c, CtlRequest& req, CtlReply& rep);
  int op_reg_mr(Client& c, CtlRequest& req, CtlReply& rep);
  int op_create_cq(Client& c, CtlRequest& req, CtlReply& rep);
  int op_resize_cq(Client& c, CtlRequest& req, CtlReply& rep);
  int op_create_srq(Client& c, CtlRequest& req, CtlReply& rep);
  int op_create_qp(Client& c, CtlRequest& req, CtlReply& rep);
  int op_modify_qp(Client& c, CtlRequest& req, CtlReply& rep);
  int op_query_qp(Client& c, CtlRequest& req, CtlReply& rep);
  int destroy_qp(Client& c, uint32_t h);
  // With q's lcore parked: the application rang for sends the lcore has
  // not taken yet.
  bool sends_untaken(const QpObj& q) const;
  int destroy_srq(Client& c, uint32_t h);
  void release_all(Client& c);
  // A group new to the device (`joined`) or gone from it (the device's
  // hook, under ParkAll or with the lcores stopped): counted, told.
  void mcast_changed(const transport::Gid& g, bool joined);
  // Waits (10 ms at most) until the sends posted on c's QPs that complete
  // into `cq` have completed: ibv_resize_cq then counts their entries.
  static void settle_sends(const Client& c, const transport::Cq* cq);
  // The view of a kRegMr, checked and mapped into the service.
  int map_mr_view(Client& c, const shim::RegMrReq& r, CtlRequest& req,
                  Mapping* view);
  // The same for an MR inside one of the client's own shared mappings (a
  // piece with vma_end, no fd; abi.h).
  int map_foreign_view(const Client& c, const shim::RegMrReq& r,
                       const CtlRequest& req, Mapping* view);
  // Queues p's DMA mapping (TxMemory::map_dma) unless kMaxDmaMapping are
  // queued already: then it waits here.
  bool start_dma(PendingMr& p);
  // Pending DMA mappings of clients that went: finished (TxMemory::map then
  // remove) and their views retired once done; all of them when `wait`.
  void finish_abandoned(bool wait);
  // A doorbell index in a summary word of `home`'s; UINT32_MAX: none left.
  uint32_t alloc_doorbell(Client& c, uint32_t home);
  Target& target(Client& c, uint32_t doorbell);
  // A doorbell index's place in its home's table (shim::doorbell_home says
  // which home; the inverse of alloc_doorbell).
  static uint32_t db_local(uint32_t doorbell, uint32_t homes) {
    return (doorbell / shim::kDoorbellsPerSummary) / homes *
               shim::kDoorbellsPerSummary +
           doorbell % shim::kDoorbellsPerSummary;
  }
  void free_doorbell(Client& c, uint32_t doorbell);
  uint32_t homes() const { return static_cast<uint32_t>(env_.engines.size()); }
  // Where a new QP goes: with its SRQ, else the engine with fewest QPs.
  uint32_t pick_home() const;
  std::span<LcoreGate* const> all_gates() const { return env_.gates; }
  bool drain_qp_st(Client& c, QpObj& q, uint32_t* taken);
  bool drain_rq_st(QpObj& q, uint32_t* taken);
  bool drain_srq_st(SrqObj& s, uint32_t* taken);
  bool send_async(const transport::AsyncEvent& ev);
  // Sends or, if the socket is full, holds in the client's backlog (up to
  // kMaxAsyncBacklog); false if lost. Never blocks.
  bool send_to(Client& c, const shim::AsyncMsg& m);
  void broadcast(const shim::AsyncMsg& m);  // to every client, counted
  // Sends what a client's backlog holds while its socket takes it; false
  // if some is left. The second: every client's, async_backlog_ updated.
  bool flush_async(Client& c);
  void flush_async();
  // Events for a destroyed object's handle leave the backlog with it.
  static void forget_async(Client& c, uint32_t handle);
  static constexpr size_t kMaxAsyncBacklog = 65536;  // 512 KiB a client
  // The MR's range goes (kDeregMr; kReregMr with `fresh` taking its place
  // and keys): EBUSY while an lcore uses it or windows are bound to it;
  // then its view is retired and its bytes uncounted.
  int drop_mr_range(Client& c, MrObj& m, transport::Mr* fresh);
  // MR views leave the lcore's table under the park; unmapped once no
  // mbuf refers to them (checked again by pump_events()).
  void retire_view(Mapping& m);
  void unmap_retired();

  ShimEnv env_;
  // Lcore-visible: the open clients (changed only while parked).
  std::vector<Client*> live_;
  std::map<uint64_t, std::unique_ptr<Client>> clients_;  // by ClientInfo::id
  std::vector<Mapping> retired_views_;    // still referenced by mbufs
  std::vector<PendingMr> abandoned_mrs_;  // see finish_abandoned
  // Mappings handed to the TxMemory bounded: a client that registers and
  // goes in a loop must not queue pinnings without end.
  static constexpr uint32_t kMaxDmaMapping = 4;
  uint32_t dma_mapping_ = 0;    // started, result not yet taken
  bool async_backlog_ = false;  // some client's backlog holds events
  ShimCounters ctr_;
  std::string why_;  // detail of the last refusal, sent with -errno
  bool shut_down_ = false;
};

}  // namespace urnic::service
