// The device's host interface (as rxe's uapi header): the contract between
// liburnic-verbs.so (the shim, in the application) and urnicd (the
// service): control messages on the Unix SEQPACKET socket, and
// the layouts of the memory both map. Both sides are built from this header
// in one tree; kShimAbi changes whenever anything here changes.
//
// Control: every request is one message `ctl::Hdr` + a request struct below
// (+ SCM_RIGHTS fds where noted); every reply is `ctl::Hdr` (status 0 or
// -errno) + a reply struct, or + a UTF-8 error message when status < 0
// (+ fds where noted). One socket connection is one ibv_context: when it
// closes (exit, crash, kill -9), the service releases every object of it.
//
// Memory the application can write (rings, doorbells, CQ consumer index,
// CQ arm word) is untrusted: the service copies each WQE out before
// validating it and clamps every index it reads.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_user_cm.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "dataplane/hostif/ctl_proto.h"
#include "dataplane/hostif/verbs.h"

namespace urnic::shim {

constexpr uint32_t kShimAbi = 8;  // OpenReq.abi must equal this
using hostif::kMaxInline;
using hostif::kMaxSge;
constexpr uint32_t kMaxGids = 16;
constexpr uint32_t kMaxMrPieces = 64;  // fds in one kRegMr
// Doorbell indices per context (QPs and SRQs share the space).
constexpr uint32_t kMaxDoorbells = 65536;
constexpr uint32_t kNoHandle = 0;  // handles are never 0

// --- control operations (ctl::Op values 100+; 1..99 are urnicctl's) --------
enum class Op : uint16_t {
  kOpen = 100,      // OpenReq + fd: async-event socket (shim end kept)
                    //   -> OpenRep + fds: doorbell page (DoorbellPage),
                    //   then OpenRep.homes bells (eventfds, by home)
  kQueryPort,       // -> ibv_port_attr
  kAllocPd,         // -> HandleRep
  kDeallocPd,       // HandleReq
  kRegMr,           // RegMrReq + npieces fds -> RegMrRep
  kDeregMr,         // HandleReq
  kCreateChannel,   // fd: completion-event socket -> HandleRep
  kDestroyChannel,  // HandleReq (EBUSY while a CQ uses it)
  kCreateCq,        // CreateCqReq -> CreateCqRep + fd: CQ memory (CqShared)
  kDestroyCq,       // HandleReq
  kCreateSrq,       // CreateSrqReq -> CreateSrqRep + fd: SRQ memory
  kModifySrq,       // ModifySrqReq
  kQuerySrq,        // HandleReq -> ibv_srq_attr
  kDestroySrq,      // HandleReq
  kCreateQp,        // CreateQpReq -> CreateQpRep + fd: QP memory (QpShared)
  kModifyQp,        // ModifyQpReq -> ModifyQpRep
  kQueryQp,         // HandleReq -> QueryQpRep
  kDestroyQp,       // HandleReq
  kCreateAh,        // CreateAhReq -> HandleRep
  kDestroyAh,       // HandleReq
  kAsyncRequeue,    // AsyncRequeueReq: send these events again (see below)
  kResizeCq,        // ResizeCqReq -> CreateCqRep + fd: the CQ's new memory
  kAllocMw,         // AllocMwReq -> AllocMwRep
  kDeallocMw,       // HandleReq
  kAttachMcast,     // McastReq
  kDetachMcast,     // McastReq
  kReregMr,         // ReregMrReq -> RegMrRep (the keys `handle` had)
  // RDMA CM (verbs-shim/rdmacm.cc, dataplane/service/cm_server.cc): one
  // connection per event channel (an open of /dev/infiniband/rdma_cm).
  kCmOpen = 150,  // CmOpenReq + fd: the channel's event socket -> CmOpenRep
  kCmCommand,     // CmCommandReq + the ucma command body (+ option bytes)
                  //   -> the command's response bytes (none for most)
};

struct OpenReq {
  uint32_t abi = kShimAbi;
  uint32_t pid = 0;  // informational; the service uses SO_PEERCRED
};

struct OpenRep {
  uint32_t abi = kShimAbi;
  uint32_t num_gids = 0;
  ibv_device_attr device{};  // the service's limits, as they are
  ibv_port_attr port{};      // port 1 (the only one)
  uint8_t gids[kMaxGids][16] = {};
  uint8_t gid_is_ipv4[kMaxGids] = {};  // RoCEv2 over IPv4 (mapped) or IPv6
  uint8_t mac[6] = {};
  uint16_t pad = 0;
  uint64_t node_guid = 0;  // network byte order, EUI-64 from the MAC
  char service_version[32] = {};
  // Worker lcores serving doorbells (1..kSummaryWords): the reply carries
  // one bell per home after the doorbell page (DoorbellPage::waiting).
  uint32_t homes = 1;
};

struct HandleReq {
  uint32_t handle = 0;
};
struct HandleRep {
  uint32_t handle = 0;
};

// The MR's page-rounded range [map_start, map_start + map_len) is backed by
// `npieces` memfd pieces, in address order, each (fd i, offset, length); the
// service maps them into one contiguous view. [addr, addr + length) is the
// registered range inside it; iova is what remote peers and SGEs use.
// Each fd must be a memfd sealed with F_SEAL_SHRINK (memfd_create with
// MFD_ALLOW_SEALING, then fcntl F_ADD_SEALS): otherwise the application
// could shrink it under the service, whose next access would fault.
//
// A piece with vma_end != 0 comes with no fd: it is the application's own
// writable MAP_SHARED mapping [vma_start, vma_end) of a regular file (a
// file, POSIX or System V shared memory, hugetlbfs, shared anonymous
// memory), fd_offset bytes into the file. The service opens that mapping
// itself (/proc/<pid>/map_files, the pid from SO_PEERCRED) and checks it
// against the client's /proc/<pid>/maps; such a piece is the MR's only
// one. The file cannot be sealed: the service catches the SIGBUS of an
// access past a shrunk end (dataplane/service/foreign_memory.h).
struct MrPiece {
  uint64_t fd_offset = 0;
  uint64_t length = 0;
  uint64_t vma_start = 0;
  uint64_t vma_end = 0;
};
struct RegMrReq {
  uint32_t pd = 0;
  uint32_t access = 0;  // IBV_ACCESS_*
  uint64_t addr = 0;
  uint64_t length = 0;
  uint64_t iova = 0;
  uint64_t map_start = 0;
  uint64_t map_len = 0;
  uint32_t npieces = 0;
  uint32_t pad = 0;
  MrPiece pieces[kMaxMrPieces];
};
// ibv_rereg_mr: `fresh`, a registration of the new range/PD/access just
// made (kRegMr), takes the place of `handle`, which keeps its keys (as
// rxe and mlx5 keep them): a peer's rkey stays valid. `fresh` is gone
// after it; on an error both stay as they were.
struct ReregMrReq {
  uint32_t handle = 0;
  uint32_t fresh = 0;
};
struct RegMrRep {
  uint32_t handle = 0;
  uint32_t lkey = 0;
  uint32_t rkey = 0;
};

struct CreateCqReq {
  uint32_t cqe = 0;
  uint32_t channel = kNoHandle;  // completion channel handle, or none
};
struct CreateCqRep {
  uint32_t handle = 0;
  uint32_t cqe = 0;      // usable entries (>= asked)
  uint64_t map_len = 0;  // bytes of the passed fd to map
};

struct AllocMwReq {
  uint32_t pd = 0;
  uint32_t type = 0;  // ibv_mw_type
};
struct AllocMwRep {
  uint32_t handle = 0;
  uint32_t rkey = 0;
};

// The CQ moves to new memory with its unpolled completions first; the
// application must not poll it during the call (the shim holds its lock).
struct ResizeCqReq {
  uint32_t handle = 0;
  uint32_t cqe = 0;
};

struct CreateSrqReq {
  uint32_t pd = 0;
  uint32_t max_wr = 0;
  uint32_t max_sge = 0;
  // Ignored: ibv_create_srq(3) calls the limit irrelevant at creation (mlx5
  // and rxe ignore it); ibv_modify_srq arms it. Kept for the layout.
  uint32_t srq_limit = 0;
};
struct CreateSrqRep {
  uint32_t handle = 0;
  uint32_t max_wr = 0;  // granted (ring slots; a power of two)
  uint32_t max_sge = 0;
  uint32_t doorbell = 0;  // index in the context's DoorbellPage
  uint64_t map_len = 0;
};
struct ModifySrqReq {
  uint32_t handle = 0;
  int32_t mask = 0;  // ibv_srq_attr_mask
  ibv_srq_attr attr{};
};

struct CreateQpReq {
  uint32_t pd = 0;
  uint32_t send_cq = 0;
  uint32_t recv_cq = 0;
  uint32_t srq = kNoHandle;
  uint32_t qp_type = IBV_QPT_RC;
  uint32_t sq_sig_all = 0;
  uint32_t create_flags = 0;  // IBV_QP_CREATE_BLOCK_SELF_MCAST_LB only
  ibv_qp_cap cap{};
};
struct CreateQpRep {
  uint32_t handle = 0;
  uint32_t qpn = 0;
  ibv_qp_cap cap{};       // granted: what the queues really hold
  uint32_t doorbell = 0;  // index in the context's DoorbellPage
  uint32_t pad = 0;
  uint64_t map_len = 0;
};

struct ModifyQpReq {
  uint32_t handle = 0;
  int32_t mask = 0;  // ibv_qp_attr_mask
  ibv_qp_attr attr{};
};
struct ModifyQpRep {
  uint32_t state = 0;  // the QP's state afterwards
};
struct QueryQpRep {
  ibv_qp_attr attr{};
  ibv_qp_cap cap{};
  uint32_t sq_sig_all = 0;
  uint32_t pad = 0;
};

// ibv_attach_mcast / ibv_detach_mcast. The LID is not sent: RoCE has none
// (rxe ignores it too).
struct McastReq {
  uint32_t qp = 0;  // the QP's handle
  uint8_t gid[16] = {};
};

struct CreateAhReq {
  uint32_t pd = 0;
  uint32_t pad = 0;
  ibv_ah_attr attr{};
};

// --- events the service sends ----------------------------------------------
// On a completion channel's socket: one message per event, 8 bytes: the CQ's
// handle (uint64_t). On the context's async socket: one AsyncMsg.
struct AsyncMsg {
  uint32_t type = 0;    // ibv_event_type
  uint32_t handle = 0;  // QP / CQ / SRQ handle (port events: port number)
};
// When the application destroys an object, events for it still unread in
// the async socket must vanish (as with the kernel's verbs: poll() must not
// report an event ibv_get_async_event would then skip). The shim drains the
// socket without blocking, drops those, and asks the service to send the
// others again, so the socket alone keeps the events and the service's
// close still reads as EOF.
constexpr uint32_t kMaxRequeue = 64;
struct AsyncRequeueReq {
  uint32_t n = 0;
  uint32_t pad = 0;
  AsyncMsg msgs[kMaxRequeue];
};

// --- RDMA CM
// ------------------------------------------------------------------ The
// kernel's ucma commands (rdma/rdma_user_cm.h) travel as librdmacm wrote them;
// the shim adds what lives in its own address space: the bytes an option
// pointer names (SET_OPTION) and which channel an fd is (MIGRATE_ID).
struct CmOpenReq {
  uint32_t abi = kShimAbi;
  uint32_t pid = 0;
};
struct CmOpenRep {
  uint64_t token = 0;  // names this channel in another's MIGRATE_ID
};
constexpr uint32_t kCmMaxOption = 256;
struct CmCommandReq {
  uint32_t cmd = 0;           // RDMA_USER_CM_CMD_*
  uint16_t in = 0;            // body bytes that follow
  uint16_t out = 0;           // response bytes the caller has room for
  uint64_t migrate_from = 0;  // MIGRATE_ID: the old channel's token
  uint32_t optlen = 0;        // SET_OPTION: option bytes after the body
  uint32_t pad = 0;
};
// One message on a channel's event socket per event, in order. `count_id`
// is the id whose events_reported it counts in (the listener's for a
// CONNECT_REQUEST, whose resp.id is the new id).
struct CmEventMsg {
  uint32_t count_id = 0;
  uint32_t pad = 0;
  rdma_ucm_event_resp resp{};
};

// --- shared memory -----------------------------------------------------------
// Every ring index runs freely (uint32_t, wraps); slots = index & (size-1).
// The producer owns its index and publishes with release after writing the
// slot; the consumer reads it with acquire.

// A send WQE as the shim writes it (a copy of ibv_send_wr without pointers).
struct ShmSge {  // trivial: it sits in a union
  uint64_t addr;
  uint32_t length;
  uint32_t lkey;
};
struct ShmSendWqe {
  uint64_t wr_id;
  uint64_t remote_addr;  // RDMA and atomics
  uint64_t compare_add;  // atomics
  uint64_t swap;
  uint32_t opcode;      // ibv_wr_opcode
  uint32_t send_flags;  // IBV_SEND_*
  uint32_t num_sge;     // SGEs in sge[] (0 when inline)
  // Network byte order; LOCAL_INV and SEND_WITH_INV: the rkey to
  // invalidate; BIND_MW: the window's current rkey (which window).
  uint32_t imm_data;
  uint32_t rkey;         // RDMA, atomics; BIND_MW: the window's new rkey
  uint32_t ah;           // UD: AH handle
  uint32_t remote_qpn;   // UD
  uint32_t remote_qkey;  // UD
  uint32_t inline_len;   // IBV_SEND_INLINE: bytes in inline_data
  // BIND_MW: the MR's lkey; remote_addr, compare_add and swap carry the
  // range's address, its length and the window's access flags.
  uint32_t bind_lkey;
  uint32_t pad[2];
  union {
    ShmSge sge[kMaxSge];
    uint8_t inline_data[kMaxInline];
  };
};
static_assert(sizeof(ShmSendWqe) == 336);

struct ShmRecvWqe {
  uint64_t wr_id;
  uint32_t num_sge;
  uint32_t pad;
  ShmSge sge[kMaxSge];
};
static_assert(sizeof(ShmRecvWqe) == 272);

// QP memory: this header, then sq_size ShmSendWqe at sq_offset, then
// rq_size ShmRecvWqe at rq_offset (rq_size 0 with an SRQ).
struct alignas(64) QpShared {
  // Written by the service at creation; read-only for the shim.
  uint32_t sq_size = 0, rq_size = 0;      // slots, powers of two
  uint32_t sq_offset = 0, rq_offset = 0;  // bytes from the start
  // Service-owned: the QP's state (ibv_qp_state) as the transport sees it
  // (it moves to ERR on its own); the shim checks it at post time.
  alignas(64) std::atomic<uint32_t> state{IBV_QPS_RESET};
  // Shim-owned producer indices (WQEs posted).
  alignas(64) std::atomic<uint32_t> sq_prod{0};
  alignas(64) std::atomic<uint32_t> rq_prod{0};
  // Service-owned: WQEs retired (completed or flushed, signaled or not):
  // their slots may be reused. Send slots are freed in order, like a HCA's.
  alignas(64) std::atomic<uint32_t> sq_done{0};
  alignas(64) std::atomic<uint32_t> rq_done{0};
};

// SRQ memory: this header, then size ShmRecvWqe at offset.
struct alignas(64) SrqShared {
  uint32_t size = 0, offset = 0;
  alignas(64) std::atomic<uint32_t> prod{0};  // shim
  alignas(64) std::atomic<uint32_t> done{0};  // service: WQEs taken
};

// CQ memory: this header, then size ibv_wc at offset. The service produces;
// the application consumes (ibv_poll_cq) and arms (ibv_req_notify_cq).
struct alignas(64) CqShared {
  uint32_t size = 0, offset = 0;
  alignas(64) std::atomic<uint32_t> prod{0};  // service
  // Service-owned: set when a completion did not fit (the CQ is in error,
  // IBV_EVENT_CQ_ERR was sent); ibv_poll_cq then fails.
  std::atomic<uint32_t> error{0};
  alignas(64) std::atomic<uint32_t> cons{0};  // application
  // Application stores kArmAll or kArmSolicited; the service exchanges it
  // back to 0 when it sends the event on the completion channel.
  // Each side stores, then loads the other's word (application: arm, then
  // prod when it polls; service: prod, then arm), so each needs a full
  // (seq_cst) fence between the two: otherwise both can read the old value
  // and the completion is neither polled nor notified.
  alignas(64) std::atomic<uint32_t> arm{0};
};
constexpr uint32_t kArmAll = 1;
constexpr uint32_t kArmSolicited = 2;

// Per-context doorbells: after publishing a producer index, the shim sets
// bit `doorbell` in bits[], then (if the bit was clear) the matching
// summary bit, then that summary word's bit in `pending`, all with release.
// A service lcore takes its own summary words' bits out of pending
// (fetch_and), then exchanges those summary words, then the bit words, to 0
// (acquire) and drains the queues whose bits were set: work per loop
// follows what was rung, not how many QPs exist. The service hands out
// doorbell indices so that each summary word (4096 indices) belongs to one
// lcore (doorbell_home): lcores never take each other's bits.
//
// `waiting` is the service's: bit h is set while the lcore of home h waits
// for events instead of polling (idle). A shim that set a pending bit then
// reads it and, if its lcore's bit is set, writes that lcore's bell (an
// eventfd from kOpen's reply). Both sides store, then load the other's word
// (the shim pending then waiting; the lcore waiting then pending, in the
// poll before it waits), so both are seq_cst: otherwise each can miss the
// other's store and the WQE waits for the lcore's next timeout.
//
// `closed` is the service's: set once it has stopped serving this context
// (shutdown: every QP flushed, no more WQEs taken or completions made). The
// shim reads it when a CQ is empty, so polling a dead device fails instead
// of spinning forever; it shares pending's line, which a post touches anyway.
constexpr uint32_t kDoorbellsPerSummary = 64 * 64;
constexpr uint32_t kSummaryWords = kMaxDoorbells / kDoorbellsPerSummary;
static_assert(kSummaryWords <= 32, "pending has a bit per summary word");
static_assert(1 + kSummaryWords <= ctl::kMaxReplyFds,
              "kOpen's reply: the doorbell page and a bell per home");
struct alignas(64) DoorbellPage {
  alignas(64) std::atomic<uint32_t> pending{0};
  std::atomic<uint32_t> closed{0};
  std::atomic<uint32_t> waiting{0};
  alignas(64) std::atomic<uint64_t> summary[kSummaryWords]{};
  alignas(64) std::atomic<uint64_t> bits[kMaxDoorbells / 64]{};
};

// The home (worker lcore, 0..homes-1) that serves doorbell `index`.
constexpr uint32_t doorbell_home(uint32_t index, uint32_t homes) {
  return (index / kDoorbellsPerSummary) % homes;
}

// Returns true when this call made the doorbell pending (false: it already
// was, and whoever made it so wakes the lcore if needed).
inline bool ring_doorbell(DoorbellPage& db, uint32_t index) {
  const uint64_t bit = uint64_t{1} << (index % 64);
  const uint32_t w = index / 64;
  if (db.bits[w].fetch_or(bit, std::memory_order_acq_rel) & bit) return false;
  db.summary[w / 64].fetch_or(uint64_t{1} << (w % 64),
                              std::memory_order_release);
  db.pending.fetch_or(1u << (w / 64), std::memory_order_seq_cst);
  return true;
}

// After ring_doorbell returned true: whether the lcore serving `index`
// waits for events, so that the shim must write its bell.
inline bool doorbell_wakes(const DoorbellPage& db, uint32_t index,
                           uint32_t homes) {
  const uint32_t w = db.waiting.load(std::memory_order_seq_cst);
  return w && ((w >> doorbell_home(index, homes)) & 1);  // busy: no division
}

// Every shared block is laid out in pages of this size.
constexpr size_t kPageSize = 4096;
constexpr size_t page_round(size_t n) {
  return (n + kPageSize - 1) & ~(kPageSize - 1);
}
constexpr size_t qp_shared_len(uint32_t sq, uint32_t rq) {
  return page_round(sizeof(QpShared)) +
         page_round(size_t{sq} * sizeof(ShmSendWqe)) +
         page_round(size_t{rq} * sizeof(ShmRecvWqe));
}

constexpr uint32_t ring_slots(uint32_t n) {  // a power of two >= n (>= 1)
  uint32_t s = 1;
  while (s < n) s <<= 1;
  return s;
}
constexpr size_t cq_shared_len(uint32_t cqe) {
  return page_round(sizeof(CqShared)) +
         page_round(size_t{ring_slots(cqe)} * sizeof(ibv_wc));
}
constexpr size_t srq_shared_len(uint32_t max_wr) {
  return page_round(sizeof(SrqShared)) +
         page_round(size_t{ring_slots(max_wr)} * sizeof(ShmRecvWqe));
}

}  // namespace urnic::shim
