// verbs_extended: an unmodified libibverbs program for the verbs that
// perftest and the ibverbs-utils do not exercise on urnic. perftest 4.5
// posts with ibv_wr_* only on mlx5 and EFA devices (everywhere else it uses
// ibv_post_send) and polls with ibv_poll_cq, so without this program the
// shim's ibv_qp_ex / ibv_cq_ex paths would run in no test. On one device
// (default urnic0), with QPs connected to each other through the device's
// own GIDs, it checks:
//  a) queries: ibv_query_port through the old-ABI symbol (the pre-1.1
//     layout, nothing written past it), the GID table as ibv_query_gid,
//     ibv_query_gid_ex, ibv_query_gid_table, ibv_query_gid_type and the
//     sysfs files (ibv_read_sysfs_file) report it, P_Key and sysfs answers,
//     the device node and sysfs files through stat/access/open/fopen;
//  b) ibv_qp_ex on RC: one ibv_wr_start/ibv_wr_complete batch of every
//     operation (RDMA WRITE, unsignaled WRITE, SEND, SEND_WITH_IMM,
//     WRITE_WITH_IMM, both atomics, READ) with every data setter (sge, sge
//     list, inline data, inline data list), completions read through
//     ibv_start_poll/next_poll/end_poll and ibv_wc_read_*, receives on an
//     SRQ from ibv_create_srq_ex, a completion channel event; then
//     ibv_post_send and ibv_poll_cq on the same QP and CQs;
//  c) ibv_wr_* refusals: each bad batch returns its exact error from
//     ibv_wr_complete and posts nothing of the batch; ibv_wr_abort posts
//     nothing; the QP then works;
//  d) completion channels: O_NONBLOCK, solicited-only arming, one event per
//     arm, two CQs on one channel, EBUSY while CQs use it;
//  e) async events: SRQ limit (once), last WQE of an SRQ QP, SQ drained,
//     CQ overrun (then ibv_poll_cq fails with EIO);
//  f) UD through ibv_wr_set_ud_addr from every GID (IPv4-mapped, and IPv6
//     when the service has port.ipv6): the wc, the GRH and the payload
//     byte for byte, a reply through ibv_create_ah_from_wc, the MTU limit
//     and a wrong Q_Key;
//  g) ibv_resize_cq: growing with completions in flight loses and reorders
//     none, limits, shrinking;
//  h) memory windows: type 1 through ibv_bind_mw and type 2 through
//     ibv_wr_bind_mw, WRITE/READ through their rkeys, bounds, the MR busy
//     while bound, SEND_WITH_INV invalidating a type 2 window.
//
// It links only libibverbs; tests/integration/verbs_shim.sh runs it with
// LD_PRELOAD=liburnic-verbs.so and URNIC_SOCKET. Every check prints
// "ok - ..." or "FAIL - ..."; the exit status is 1 when any check failed.
// Every wait is bounded: 5 s for what must happen, 300 ms of silence for
// what must not.
//   usage: verbs_extended [DEVICE]
#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/support/verbs_bringup.h"

// Exported by libibverbs (IBVERBS_1.0) but declared only in rdma-core's
// driver.h, which is not installed.
extern "C" int ibv_read_sysfs_file(const char* dir, const char* file, char* buf,
                                   size_t size);

namespace {

using urnic::test::rc_connect;
using urnic::test::RcPath;

constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                        IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
constexpr auto kDeadline = std::chrono::seconds(5);
constexpr int kQuietMs = 300;
constexpr size_t kBufLen = 64 * 1024;
constexpr size_t kGrhLen = 40;
constexpr uint32_t kQkey = 0x11111111;
constexpr size_t kMaxGids = 64;
constexpr uint64_t kRcOps =
    IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
    IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
    IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
    IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_SEND_WITH_INV;
// IBV_GID_TYPE_SYSFS_ROCE_V2 of rdma-core's enum ibv_gid_type_sysfs
// (driver.h).
constexpr int kGidTypeSysfsRoceV2 = 1;

int g_passed = 0;
int g_failed = 0;

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

bool check(bool ok, const std::string& name, const std::string& detail = "") {
  if (ok) {
    printf("ok - %s\n", name.c_str());
    ++g_passed;
  } else {
    printf("FAIL - %s%s%s\n", name.c_str(), detail.empty() ? "" : ": ",
           detail.c_str());
    ++g_failed;
  }
  fflush(stdout);
  return ok;
}

// A setup step that must work for a section to mean anything (creating a
// QP, moving it to RTS, ...). The section is reported failed and the next
// one runs.
struct SetupError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string err_text(int e) {
  return fmt("%d (%s)", e, strerror(e));
}

// Deterministic byte pattern per (seed, offset).
void fill(void* p, size_t len, uint32_t seed) {
  auto* b = static_cast<uint8_t*>(p);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < len; ++i) {
    x = x * 1103515245u + 12345u;
    b[i] = static_cast<uint8_t>(x >> 16);
  }
}
bool same_as_pattern(const void* p, size_t len, uint32_t seed) {
  std::vector<uint8_t> want(len);
  fill(want.data(), len, seed);
  return memcmp(p, want.data(), len) == 0;
}

bool same_gid(const ibv_gid& a, const ibv_gid& b) {
  return memcmp(a.raw, b.raw, 16) == 0;
}
bool is_ipv4_mapped(const ibv_gid& g) {
  static const uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return memcmp(g.raw, kPrefix, 12) == 0;
}
std::string gid_text(const ibv_gid& g) {
  char s[INET6_ADDRSTRLEN];
  return inet_ntop(AF_INET6, g.raw, s, sizeof s) ? s : "?";
}
// The kernel's sysfs spelling: eight groups of four hex digits.
std::string gid_sysfs_text(const ibv_gid& g) {
  std::string s;
  for (int i = 0; i < 16; i += 2)
    s += fmt("%s%02x%02x", i ? ":" : "", g.raw[i], g.raw[i + 1]);
  return s;
}

// Owns one verbs object; destroy() reports what the destroy verb returned.
template <typename T, int (*kDestroy)(T*)>
class Owned {
 public:
  Owned() = default;
  explicit Owned(T* p) : p_(p) {}
  ~Owned() {
    if (p_) kDestroy(p_);
  }
  Owned(Owned&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  Owned& operator=(Owned&& o) noexcept {
    if (this != &o) {
      if (p_) kDestroy(p_);
      p_ = std::exchange(o.p_, nullptr);
    }
    return *this;
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  T* get() const { return p_; }
  T* operator->() const { return p_; }
  explicit operator bool() const { return p_ != nullptr; }
  int destroy() {
    T* p = std::exchange(p_, nullptr);
    return p ? kDestroy(p) : 0;
  }

 private:
  T* p_ = nullptr;
};
using QpPtr = Owned<ibv_qp, ibv_destroy_qp>;
using CqPtr = Owned<ibv_cq, ibv_destroy_cq>;
using SrqPtr = Owned<ibv_srq, ibv_destroy_srq>;
using AhPtr = Owned<ibv_ah, ibv_destroy_ah>;
using ChannelPtr = Owned<ibv_comp_channel, ibv_destroy_comp_channel>;

// A registered, zeroed, page-aligned buffer.
struct Buffer {
  uint8_t* p = nullptr;
  ibv_mr* mr = nullptr;
  Buffer(ibv_pd* pd, size_t len) {
    p = static_cast<uint8_t*>(aligned_alloc(4096, len));
    if (!p) throw SetupError("aligned_alloc");
    memset(p, 0, len);
    mr = ibv_reg_mr(pd, p, len, kAccess);
    if (!mr) {
      const int e = errno;
      free(p);
      throw SetupError("ibv_reg_mr: " + err_text(e));
    }
  }
  ~Buffer() {
    ibv_dereg_mr(mr);
    free(p);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  uint64_t addr(size_t off) const {
    return reinterpret_cast<uint64_t>(p + off);
  }
  uint32_t lkey() const { return mr->lkey; }
  uint32_t rkey() const { return mr->rkey; }
};

struct Dev {
  ibv_device* dev = nullptr;
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_port_attr port{};             // ibv_query_port at start
  std::vector<ibv_gid_entry> gids;  // ibv_query_gid_table at start
  uint32_t mtu() const { return 128u << port.active_mtu; }  // bytes
};

// --- objects -----------------------------------------------------------------

CqPtr make_cq(Dev& d, int cqe, ibv_comp_channel* ch = nullptr,
              void* cq_context = nullptr) {
  ibv_cq* cq = ibv_create_cq(d.ctx, cqe, cq_context, ch, 0);
  if (!cq) throw SetupError("ibv_create_cq: " + err_text(errno));
  return CqPtr(cq);
}

// An ibv_cq_ex with the standard wc_flags; `cq` owns it.
struct CqEx {
  ibv_cq_ex* ex = nullptr;
  CqPtr cq;
};
CqEx make_cq_ex(Dev& d, uint32_t cqe, ibv_comp_channel* ch = nullptr,
                void* cq_context = nullptr) {
  ibv_cq_init_attr_ex a{};
  a.cqe = cqe;
  a.cq_context = cq_context;
  a.channel = ch;
  a.wc_flags = IBV_WC_STANDARD_FLAGS;
  CqEx c;
  c.ex = ibv_create_cq_ex(d.ctx, &a);
  if (!c.ex) throw SetupError("ibv_create_cq_ex: " + err_text(errno));
  c.cq = CqPtr(ibv_cq_ex_to_cq(c.ex));
  return c;
}

struct QpSpec {
  ibv_qp_type type = IBV_QPT_RC;
  ibv_cq* scq = nullptr;
  ibv_cq* rcq = nullptr;
  ibv_srq* srq = nullptr;
  uint64_t ops = 0;  // send_ops_flags; 0: a QP without ibv_qp_ex
  uint32_t send_wr = 32;
  uint32_t recv_wr = 32;
  uint32_t sge = 4;
  uint32_t inline_data = 64;
};

// ibv_create_qp_ex as the spec says; NULL and errno as the verb left them.
ibv_qp* try_create_qp(Dev& d, const QpSpec& s, ibv_qp_cap* granted) {
  ibv_qp_init_attr_ex a{};
  a.qp_type = s.type;
  a.send_cq = s.scq;
  a.recv_cq = s.rcq;
  a.srq = s.srq;
  a.cap.max_send_wr = s.send_wr;
  a.cap.max_recv_wr = s.srq ? 0 : s.recv_wr;
  a.cap.max_send_sge = s.sge;
  a.cap.max_recv_sge = s.srq ? 0 : s.sge;
  a.cap.max_inline_data = s.inline_data;
  a.comp_mask = IBV_QP_INIT_ATTR_PD;
  a.pd = d.pd;
  if (s.ops) {
    a.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    a.send_ops_flags = s.ops;
  }
  ibv_qp* qp = ibv_create_qp_ex(d.ctx, &a);
  if (qp && granted) *granted = a.cap;
  return qp;
}
QpPtr make_qp(Dev& d, const QpSpec& s, ibv_qp_cap* granted = nullptr) {
  ibv_qp* qp = try_create_qp(d, s, granted);
  if (!qp) throw SetupError("ibv_create_qp_ex: " + err_text(errno));
  return QpPtr(qp);
}
ibv_qp_ex* qp_ex(const QpPtr& qp) {
  ibv_qp_ex* x = ibv_qp_to_qp_ex(qp.get());
  if (!x) throw SetupError("ibv_qp_to_qp_ex returned NULL");
  return x;
}

// Both RC QPs to RTS, each aimed at the other through GID 0.
void connect_rc(Dev& d, ibv_qp* a, ibv_qp* b) {
  for (ibv_qp* qp : {a, b}) {
    RcPath p;
    p.dest_qpn = (qp == a ? b : a)->qp_num;
    p.dgid = d.gids[0].gid;
    p.rd_atomic = 4;
    p.access = kAccess;
    const char* step = "";
    if (const int rc = rc_connect(qp, p, &step))
      throw SetupError(
          fmt("ibv_modify_qp to %s: %s", step, err_text(rc).c_str()));
  }
}

// Two RC QPs connected to each other through the device's own GID: a
// completes on a_scq/a_rcq with ibv_qp_ex ops `a_ops`, b on b_scq/b_rcq
// with `b_ops` (0: a QP without ibv_qp_ex).
struct RcPair {
  QpPtr a, b;
};
RcPair rc_pair(Dev& d, ibv_cq* a_scq, ibv_cq* a_rcq, ibv_cq* b_scq,
               ibv_cq* b_rcq, uint64_t a_ops, uint64_t b_ops = 0) {
  QpSpec sa;
  sa.scq = a_scq;
  sa.rcq = a_rcq;
  sa.ops = a_ops;
  QpSpec sb;
  sb.scq = b_scq;
  sb.rcq = b_rcq;
  sb.ops = b_ops;
  RcPair p{make_qp(d, sa), make_qp(d, sb)};
  connect_rc(d, p.a.get(), p.b.get());
  return p;
}

void ud_to_rts(ibv_qp* qp) {
  const char* step = "";
  if (const int rc = urnic::test::ud_connect(qp, kQkey, 1, &step))
    throw SetupError(
        fmt("ibv_modify_qp to %s: %s", step, err_text(rc).c_str()));
}

// An AH to this device's own GID `index`, sent from that GID.
AhPtr make_ah(Dev& d, size_t index) {
  ibv_ah_attr a{};
  a.is_global = 1;
  a.grh.dgid = d.gids[index].gid;
  a.grh.sgid_index = static_cast<uint8_t>(index);
  a.grh.hop_limit = 64;
  a.port_num = 1;
  ibv_ah* ah = ibv_create_ah(d.pd, &a);
  if (!ah)
    throw SetupError(
        fmt("ibv_create_ah (GID %zu): %s", index, err_text(errno).c_str()));
  return AhPtr(ah);
}

void post_recv(ibv_qp* qp, ibv_srq* srq, uint64_t wr_id, const Buffer& b,
               size_t off, uint32_t len) {
  ibv_sge s{b.addr(off), len, b.lkey()};
  ibv_recv_wr r{};
  r.wr_id = wr_id;
  r.sg_list = &s;
  r.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  const int rc =
      srq ? ibv_post_srq_recv(srq, &r, &bad) : ibv_post_recv(qp, &r, &bad);
  if (rc) throw SetupError("posting a receive: " + err_text(rc));
}

// --- completions -------------------------------------------------------------

std::string wc_text(const ibv_wc& w) {
  return fmt(
      "wr_id %llu status %s opcode %d byte_len %u wc_flags %#x imm %#x "
      "qp_num %u src_qp %u",
      static_cast<unsigned long long>(w.wr_id), ibv_wc_status_str(w.status),
      w.opcode, w.byte_len, w.wc_flags, ntohl(w.imm_data), w.qp_num, w.src_qp);
}

// What a completion must say; byte_len/src_qp/imm only when given.
struct WantWc {
  uint64_t wr_id;
  ibv_wc_opcode opcode;
  uint32_t qp_num;
  int64_t byte_len = -1;
  int64_t imm = -1;  // host order; -1: the WC must not carry IBV_WC_WITH_IMM
  int64_t src_qp = -1;
  bool grh = false;  // IBV_WC_GRH must be set (UD receives)
};
// "" when `w` is what `want` says, else what differs.
std::string wc_mismatch(const ibv_wc& w, const WantWc& want) {
  const bool has_imm = w.wc_flags & IBV_WC_WITH_IMM;
  const bool ok =
      w.status == IBV_WC_SUCCESS && w.wr_id == want.wr_id &&
      w.opcode == want.opcode && w.qp_num == want.qp_num &&
      (want.byte_len < 0 || w.byte_len == want.byte_len) &&
      (want.imm < 0 ? !has_imm : has_imm && ntohl(w.imm_data) == want.imm) &&
      (want.src_qp < 0 || w.src_qp == want.src_qp) &&
      (!want.grh || (w.wc_flags & IBV_WC_GRH));
  if (ok) return "";
  return "got " + wc_text(w) +
         fmt("; want wr_id %llu opcode %d qp_num %u",
             static_cast<unsigned long long>(want.wr_id), want.opcode,
             want.qp_num) +
         (want.byte_len >= 0
              ? fmt(" byte_len %lld", static_cast<long long>(want.byte_len))
              : "") +
         (want.imm >= 0 ? fmt(" imm %#llx", static_cast<long long>(want.imm))
                        : " no imm") +
         (want.src_qp >= 0
              ? fmt(" src_qp %lld", static_cast<long long>(want.src_qp))
              : "") +
         (want.grh ? " GRH" : "");
}
std::string wcs_mismatch(const std::vector<ibv_wc>& got,
                         const std::vector<WantWc>& want) {
  if (got.size() != want.size())
    return fmt("%zu completions, want %zu", got.size(), want.size()) +
           (got.empty() ? "" : "; first: " + wc_text(got[0]));
  for (size_t i = 0; i < got.size(); ++i) {
    std::string why = wc_mismatch(got[i], want[i]);
    if (!why.empty()) return fmt("completion %zu: ", i) + why;
  }
  return "";
}

// Up to `n` completions from `cq` within 5 s, through ibv_poll_cq.
std::vector<ibv_wc> poll_cq(ibv_cq* cq, size_t n, std::string* why) {
  std::vector<ibv_wc> out;
  const auto end = std::chrono::steady_clock::now() + kDeadline;
  while (out.size() < n) {
    ibv_wc w[16];
    const int k = ibv_poll_cq(
        cq, static_cast<int>(std::min<size_t>(16, n - out.size())), w);
    if (k < 0) {
      *why =
          fmt("ibv_poll_cq returned %d (errno %s)", k, err_text(errno).c_str());
      break;
    }
    out.insert(out.end(), w, w + k);
    if (k) continue;
    if (std::chrono::steady_clock::now() > end) {
      *why = fmt("%zu of %zu completions within 5 s", out.size(), n);
      break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return out;
}

// The current entry of a polled ibv_cq_ex, through its read_* functions.
ibv_wc read_wc(ibv_cq_ex* cq) {
  ibv_wc w{};
  w.wr_id = cq->wr_id;
  w.status = cq->status;
  w.opcode = ibv_wc_read_opcode(cq);
  w.vendor_err = ibv_wc_read_vendor_err(cq);
  w.byte_len = ibv_wc_read_byte_len(cq);
  w.imm_data = ibv_wc_read_imm_data(cq);
  w.qp_num = ibv_wc_read_qp_num(cq);
  w.src_qp = ibv_wc_read_src_qp(cq);
  w.wc_flags = ibv_wc_read_wc_flags(cq);
  w.slid = static_cast<uint16_t>(ibv_wc_read_slid(cq));
  w.sl = ibv_wc_read_sl(cq);
  w.dlid_path_bits = ibv_wc_read_dlid_path_bits(cq);
  return w;
}

// Up to `n` completions from `cq` within 5 s, through ibv_start_poll /
// ibv_next_poll / ibv_end_poll; any return other than 0 or ENOENT is an
// error.
std::vector<ibv_wc> poll_cq_ex(ibv_cq_ex* cq, size_t n, std::string* why) {
  std::vector<ibv_wc> out;
  const auto end = std::chrono::steady_clock::now() + kDeadline;
  while (out.size() < n) {
    ibv_poll_cq_attr attr{};
    int rc = ibv_start_poll(cq, &attr);
    if (rc == ENOENT) {
      if (std::chrono::steady_clock::now() > end) {
        *why = fmt("%zu of %zu completions within 5 s", out.size(), n);
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      continue;
    }
    if (rc) {
      *why = "ibv_start_poll returned " + err_text(rc);
      break;
    }
    for (;;) {
      out.push_back(read_wc(cq));
      if (out.size() == n) break;
      rc = ibv_next_poll(cq);
      if (rc == ENOENT) break;
      if (rc) {
        *why = "ibv_next_poll returned " + err_text(rc);
        break;
      }
    }
    ibv_end_poll(cq);
    if (!why->empty()) break;
  }
  return out;
}

// True when `cq` stays empty for kQuietMs.
bool quiet(ibv_cq* cq, std::string* why) {
  const auto end =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(kQuietMs);
  while (std::chrono::steady_clock::now() < end) {
    ibv_wc w{};
    const int n = ibv_poll_cq(cq, 1, &w);
    if (n != 0) {
      *why = n < 0 ? fmt("ibv_poll_cq returned %d", n)
                   : "unexpected completion: " + wc_text(w);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

// Waits up to `ms` for `fd` to be readable.
bool readable(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

// The next completion event of `ch` (its fd is O_NONBLOCK), within 5 s.
bool next_cq_event(ibv_comp_channel* ch, ibv_cq** cq, void** cq_context,
                   std::string* why) {
  const auto end = std::chrono::steady_clock::now() + kDeadline;
  for (;;) {
    if (ibv_get_cq_event(ch, cq, cq_context) == 0) return true;
    if (errno != EAGAIN) {
      *why = "ibv_get_cq_event: " + err_text(errno);
      return false;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      *why = "no completion event within 5 s";
      return false;
    }
    readable(ch->fd, static_cast<int>(left.count()));
  }
}

// The next async event of `ctx` (its async_fd is O_NONBLOCK), within 5 s.
// The caller acknowledges it.
bool next_async(ibv_context* ctx, ibv_async_event* ev, std::string* why) {
  const auto end = std::chrono::steady_clock::now() + kDeadline;
  for (;;) {
    if (ibv_get_async_event(ctx, ev) == 0) return true;
    if (errno != EAGAIN) {
      *why = "ibv_get_async_event: " + err_text(errno);
      return false;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      *why = "no async event within 5 s";
      return false;
    }
    readable(ctx->async_fd, static_cast<int>(left.count()));
  }
}

std::string event_text(const ibv_async_event& ev) {
  return fmt("%s (%d), element %p", ibv_event_type_str(ev.event_type),
             ev.event_type, static_cast<void*>(ev.element.qp));
}

// The next async event is `type` for `element` (a QP, CQ or SRQ pointer).
void expect_async(Dev& d, ibv_event_type type, const void* element,
                  const std::string& name) {
  ibv_async_event ev{};
  std::string why;
  if (!next_async(d.ctx, &ev, &why)) {
    check(false, name, why);
    return;
  }
  const void* got =
      type == IBV_EVENT_CQ_ERR ? ev.element.cq
      : type == IBV_EVENT_SRQ_ERR || type == IBV_EVENT_SRQ_LIMIT_REACHED
          ? static_cast<const void*>(ev.element.srq)
          : static_cast<const void*>(ev.element.qp);
  check(ev.event_type == type && got == element, name,
        "got " + event_text(ev) +
            fmt(", want %s for %p", ibv_event_type_str(type), element));
  ibv_ack_async_event(&ev);
}

// No async event for kQuietMs; "" or the event that came.
std::string async_quiet(Dev& d) {
  if (!readable(d.ctx->async_fd, kQuietMs)) return "";
  ibv_async_event ev{};
  if (ibv_get_async_event(d.ctx, &ev) != 0)
    return "async_fd readable, ibv_get_async_event: " + err_text(errno);
  std::string got = "unexpected async event " + event_text(ev);
  ibv_ack_async_event(&ev);
  return got;
}

// --- ibv_wr_* helpers --------------------------------------------------------

// One RDMA WRITE of `len` bytes from b[src] to b[dst] as a batch of its own.
int wr_write(ibv_qp_ex* x, uint64_t wr_id, const Buffer& b, size_t src,
             size_t dst, uint32_t len) {
  ibv_wr_start(x);
  x->wr_id = wr_id;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(x, b.rkey(), b.addr(dst));
  ibv_wr_set_sge(x, b.lkey(), b.addr(src), len);
  return ibv_wr_complete(x);
}

// One SEND of b[off, off+len) with `flags` as a batch of its own.
int wr_send(ibv_qp_ex* x, uint64_t wr_id, unsigned flags, const Buffer& b,
            size_t off, uint32_t len) {
  ibv_wr_start(x);
  x->wr_id = wr_id;
  x->wr_flags = flags;
  ibv_wr_send(x);
  ibv_wr_set_sge(x, b.lkey(), b.addr(off), len);
  return ibv_wr_complete(x);
}

// --- a) queries --------------------------------------------------------------

// ibv_read_sysfs_file below the device's ibdev_path: the text, or "" with
// *rc/*err set.
std::string sysfs(const Dev& d, const std::string& file, int* rc,
                  int* err = nullptr, const char* dir = nullptr) {
  char buf[128] = {};
  errno = 0;
  *rc = ibv_read_sysfs_file(dir ? dir : d.dev->ibdev_path, file.c_str(), buf,
                            sizeof buf);
  if (err) *err = errno;
  return *rc >= 0 ? std::string(buf) : "";
}

// The device's files as programs that bypass libibverbs see them (UCX:
// stat and access of the /dev/infiniband node, open/read of sysfs).
void section_kernel_files(Dev& d, const std::string& base) {
  const std::string node = std::string("/dev/infiniband/") + d.dev->dev_name;
  struct stat st {};
  int rc = stat(node.c_str(), &st);
  const int acc = access(node.c_str(), R_OK | W_OK);
  check(rc == 0 && S_ISCHR(st.st_mode) && acc == 0,
        "a) " + node + " is a character device, readable and writable",
        fmt("stat rc %d mode %#o, access rc %d", rc, st.st_mode, acc));
  const std::string types = base + "ports/1/gid_attrs/types/0";
  char buf[64] = {};
  int fd = open(types.c_str(), O_RDONLY | O_CLOEXEC);
  const ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
  if (fd >= 0) close(fd);
  check(n >= 0 && std::string(buf) == "RoCE v2\n",
        "a) open/read of sysfs gid_attrs/types/0 gives \"RoCE v2\\n\"",
        fmt("read %zd \"%s\"", n, buf));
  char line[64] = {};
  FILE* f = fopen((base + "ports/1/state").c_str(), "re");
  const bool got = f && fgets(line, sizeof line, f);
  if (f) fclose(f);
  check(got && std::string(line) == "4: ACTIVE\n",
        "a) fopen/fgets of sysfs ports/1/state gives \"4: ACTIVE\\n\"",
        fmt("\"%s\"", line));
  errno = 0;
  fd = open(types.c_str(), O_WRONLY);
  const int werr = errno;
  if (fd >= 0) close(fd);
  errno = 0;
  rc = stat((base + "ports/1/no_such_file").c_str(), &st);
  const int serr = errno;
  check(fd < 0 && werr == EACCES && rc == -1 && serr == ENOENT,
        "a) sysfs files cannot be opened for writing (EACCES); a missing one "
        "is ENOENT to stat",
        fmt("open fd %d errno %d, stat rc %d errno %d", fd, werr, rc, serr));
}

void section_queries(Dev& d) {
  const size_t n = d.gids.size();
  const size_t tbl = static_cast<size_t>(d.port.gid_tbl_len);
  check(d.port.state == IBV_PORT_ACTIVE &&
            d.port.link_layer == IBV_LINK_LAYER_ETHERNET && tbl >= n,
        "a) ibv_query_port: ACTIVE, Ethernet, gid_tbl_len covers the GIDs",
        fmt("state %d link_layer %d gid_tbl_len %d, %zu GIDs", d.port.state,
            d.port.link_layer, d.port.gid_tbl_len, n));
  ibv_device_attr da{};
  const int qrc = ibv_query_device(d.ctx, &da);
  check(
      qrc == 0 && da.vendor_id == 0x02554e && da.vendor_part_id == 1,
      "a) ibv_query_device: vendor_id 0x02554e, vendor_part_id 1",
      fmt("rc %d vendor_id %#x part %u", qrc, da.vendor_id, da.vendor_part_id));

  // Programs built against a verbs.h older than the extended query_port
  // call the exported symbol with the shorter struct: it must be filled as
  // the new verb fills it, up to `flags`, and nothing after it written.
  ibv_port_attr now{};
  int rc = ibv_query_port(d.ctx, 1, &now);
  ibv_port_attr old;
  memset(&old, 0xa5, sizeof old);
  const int old_rc =
      (ibv_query_port)(d.ctx, 1,
                       reinterpret_cast<_compat_ibv_port_attr*>(&old));
  const size_t compat_len = offsetof(ibv_port_attr, flags) + 1;
  check(rc == 0 && old_rc == 0 && memcmp(&old, &now, compat_len) == 0,
        "a) the old-ABI ibv_query_port symbol fills the pre-1.1 layout as "
        "the new verb does",
        fmt("rc %d/%d; old: state %d active_mtu %d gid_tbl_len %d "
            "link_layer %d; new: state %d active_mtu %d gid_tbl_len %d "
            "link_layer %d",
            old_rc, rc, old.state, old.active_mtu, old.gid_tbl_len,
            old.link_layer, now.state, now.active_mtu, now.gid_tbl_len,
            now.link_layer));
  const auto* tail = reinterpret_cast<const uint8_t*>(&old);
  bool untouched = true;
  for (size_t i = compat_len; i < sizeof old; ++i)
    untouched = untouched && tail[i] == 0xa5;
  check(untouched, "a) ... and writes nothing past `flags`",
        fmt("port_cap_flags2 now %#x", old.port_cap_flags2));
  rc = ibv_query_port(d.ctx, 2, &now);
  const int old2 =
      (ibv_query_port)(d.ctx, 2,
                       reinterpret_cast<_compat_ibv_port_attr*>(&old));
  check(rc == EINVAL && old2 == EINVAL,
        "a) port 2 (there is one port): EINVAL from both ibv_query_port ABIs",
        fmt("new %s, old %s", err_text(rc).c_str(), err_text(old2).c_str()));

  // The GID table, as every query reports it.
  using QueryGidType = int (*)(ibv_context*, uint8_t, unsigned, int*);
  // A private rdma-core export (driver.h): looked up at run time so that
  // this binary does not bind to one rdma-core's private symbol version.
  auto query_gid_type =
      reinterpret_cast<QueryGidType>(dlsym(RTLD_DEFAULT, "ibv_query_gid_type"));
  check(query_gid_type != nullptr, "a) ibv_query_gid_type is exported");
  check(is_ipv4_mapped(d.gids[0].gid),
        "a) GID 0 is the IPv4-mapped address of port.ipv4",
        gid_text(d.gids[0].gid));
  for (size_t i = 0; i < n; ++i) {
    const ibv_gid_entry& t = d.gids[i];
    const std::string name = fmt("a) GID %zu (%s)", i, gid_text(t.gid).c_str());
    ibv_gid g{};
    const int grc = ibv_query_gid(d.ctx, 1, static_cast<int>(i), &g);
    ibv_gid_entry e{};
    const int erc = ibv_query_gid_ex(d.ctx, 1, static_cast<uint32_t>(i), &e, 0);
    int src;
    const std::string text = sysfs(d, fmt("ports/1/gids/%zu", i), &src);
    check(t.gid_index == i && t.port_num == 1 && grc == 0 &&
              same_gid(g, t.gid) && erc == 0 && same_gid(e.gid, t.gid) &&
              e.gid_index == i && e.port_num == 1 &&
              text == gid_sysfs_text(t.gid),
          name +
              ": ibv_query_gid_table, ibv_query_gid, ibv_query_gid_ex "
              "and sysfs ports/1/gids agree",
          fmt("table index %u port %u; query_gid rc %d %s; query_gid_ex rc "
              "%d %s index %u; sysfs rc %d \"%s\"",
              t.gid_index, t.port_num, grc, gid_text(g).c_str(), erc,
              gid_text(e.gid).c_str(), e.gid_index, src, text.c_str()));
    int type = -1;
    const int trc =
        query_gid_type
            ? query_gid_type(d.ctx, 1, static_cast<unsigned>(i), &type)
            : -2;
    int yrc;
    const std::string ytext =
        sysfs(d, fmt("ports/1/gid_attrs/types/%zu", i), &yrc);
    check(t.gid_type == IBV_GID_TYPE_ROCE_V2 &&
              e.gid_type == IBV_GID_TYPE_ROCE_V2 && trc == 0 &&
              type == kGidTypeSysfsRoceV2 && ytext == "RoCE v2" &&
              yrc == static_cast<int>(ytext.size()),
          name +
              ": RoCE v2 in the table, ibv_query_gid_ex, "
              "ibv_query_gid_type and sysfs gid_attrs/types",
          fmt("table %u, _ex %u, ibv_query_gid_type rc %d type %d, sysfs rc "
              "%d \"%s\"",
              t.gid_type, e.gid_type, trc, type, yrc, ytext.c_str()));
  }
  {
    ibv_gid g{};
    errno = 0;
    const int grc = ibv_query_gid(d.ctx, 1, static_cast<int>(tbl), &g);
    const int gerr = errno;
    ibv_gid_entry e{};
    const int erc =
        ibv_query_gid_ex(d.ctx, 1, static_cast<uint32_t>(tbl), &e, 0);
    int type = -1;
    errno = 0;
    const int trc = query_gid_type ? query_gid_type(d.ctx, 1, tbl, &type) : -2;
    const int terr = errno;
    int src, serr;
    sysfs(d, fmt("ports/1/gids/%zu", tbl), &src, &serr);
    check(grc == -1 && gerr == EINVAL && erc == EINVAL && trc == -1 &&
              terr == EINVAL && src == -1 && serr == ENOENT,
          fmt("a) GID index %zu (= gid_tbl_len): ibv_query_gid and "
              "ibv_query_gid_type -1/EINVAL, ibv_query_gid_ex EINVAL, sysfs "
              "gids ENOENT",
              tbl),
          fmt("query_gid rc %d errno %d; _ex %s; gid_type rc %d errno %d; "
              "sysfs rc %d errno %d",
              grc, gerr, err_text(erc).c_str(), trc, terr, src, serr));
  }
  {
    std::vector<ibv_gid_entry> small(n);
    const ssize_t got = ibv_query_gid_table(d.ctx, small.data(), n - 1, 0);
    check(got == -EINVAL,
          fmt("a) ibv_query_gid_table with room for %zu of %zu entries: "
              "-EINVAL",
              n - 1, n),
          fmt("returned %zd", got));
  }

  // sysfs as rdma-core tools read it.
  int rc1, rc2;
  const std::string nt = sysfs(d, "node_type", &rc1);
  const std::string base =
      std::string("/sys/class/infiniband/") + ibv_get_device_name(d.dev) + "/";
  const std::string nt2 = sysfs(d, "node_type", &rc2, nullptr, base.c_str());
  check(nt == "1: CA" && rc1 == 5 && nt2 == nt && rc2 == 5,
        "a) sysfs node_type is \"1: CA\" (length returned, from ibdev_path "
        "and from /sys/class/infiniband/NAME/)",
        fmt("rc %d \"%s\", rc %d \"%s\"", rc1, nt.c_str(), rc2, nt2.c_str()));
  const uint64_t guid = be64toh(ibv_get_device_guid(d.dev));
  const std::string want_guid =
      fmt("%04x:%04x:%04x:%04x", static_cast<unsigned>(guid >> 48),
          static_cast<unsigned>((guid >> 32) & 0xffff),
          static_cast<unsigned>((guid >> 16) & 0xffff),
          static_cast<unsigned>(guid & 0xffff));
  const std::string ng = sysfs(d, "node_guid", &rc1);
  check(guid != 0 && ng == want_guid,
        "a) sysfs node_guid is ibv_get_device_guid",
        fmt("sysfs \"%s\", guid %s", ng.c_str(), want_guid.c_str()));
  const std::string ll = sysfs(d, "ports/1/link_layer", &rc1);
  const std::string st = sysfs(d, "ports/1/state", &rc2);
  check(ll == "Ethernet" && st == "4: ACTIVE",
        "a) sysfs ports/1/link_layer \"Ethernet\", ports/1/state \"4: ACTIVE\"",
        fmt("\"%s\", \"%s\"", ll.c_str(), st.c_str()));
  const std::string pk = sysfs(d, "ports/1/pkeys/0", &rc1);
  __be16 pkey = 0;
  rc = ibv_query_pkey(d.ctx, 1, 0, &pkey);
  const int pidx = ibv_get_pkey_index(d.ctx, 1, htons(0xffff));
  check(pk == "0xffff" && rc == 0 && pkey == htons(0xffff) && pidx == 0,
        "a) P_Key 0 is 0xffff (sysfs, ibv_query_pkey, ibv_get_pkey_index)",
        fmt("sysfs \"%s\", ibv_query_pkey rc %d %#x, index %d", pk.c_str(), rc,
            ntohs(pkey), pidx));
  int err;
  sysfs(d, "ports/1/no_such_file", &rc1, &err);
  check(rc1 == -1 && err == ENOENT,
        "a) sysfs: an unknown file of the device is -1, errno ENOENT",
        fmt("rc %d errno %d", rc1, err));
  section_kernel_files(d, base);
}

// --- b) ibv_qp_ex on RC ------------------------------------------------------

void section_wr_rc(Dev& d) {
  // Offsets in the section's buffer.
  constexpr size_t kSrc = 0;           // 1024 bytes, pattern 11
  constexpr size_t kReadSrc = 1024;    // 256 bytes, pattern 12
  constexpr size_t kWriteDst = 4096;   // signaled WRITE target
  constexpr size_t kWriteDst2 = 5120;  // unsignaled WRITE target
  constexpr size_t kReadDst = 8192;
  constexpr size_t kAtomic = 12288;  // the remote counter; results at +64/+128
  constexpr size_t kWimmDst = 16384;
  constexpr size_t kRecv = 32768;  // four 1024-byte receives
  constexpr uint32_t kImmSend = 0x01020304;
  constexpr uint32_t kImmWrite = 0xabcd0001;

  Buffer buf(d.pd, kBufLen);
  fill(buf.p + kSrc, 1024, 11);
  fill(buf.p + kReadSrc, 256, 12);
  memset(buf.p + kRecv, 0xee, 4096);
  uint64_t counter = 5;
  memcpy(buf.p + kAtomic, &counter, 8);

  ChannelPtr ch(ibv_create_comp_channel(d.ctx));
  if (!ch) throw SetupError("ibv_create_comp_channel: " + err_text(errno));
  int rcq_tag = 0;
  CqEx scq = make_cq_ex(d, 64);
  CqEx rcq = make_cq_ex(d, 64, ch.get(), &rcq_tag);
  {
    ibv_cq_init_attr_ex a{};
    a.cqe = 16;
    a.wc_flags =
        uint64_t{IBV_WC_STANDARD_FLAGS} | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
    errno = 0;
    ibv_cq_ex* bad = ibv_create_cq_ex(d.ctx, &a);
    const int e = errno;
    check(!bad && e == EOPNOTSUPP,
          "b) ibv_create_cq_ex asking for completion timestamps: NULL, errno "
          "EOPNOTSUPP",
          bad ? "it succeeded" : "errno " + err_text(e));
    if (bad) ibv_destroy_cq(ibv_cq_ex_to_cq(bad));
  }

  // IBV_SRQ_INIT_ATTR_CQ makes verbs.h call the provider's create_srq_ex
  // (PD and TYPE alone would be turned into ibv_create_srq).
  int srq_tag = 0;
  ibv_srq_init_attr_ex sa{};
  sa.comp_mask =
      IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_CQ;
  sa.pd = d.pd;
  sa.srq_type = IBV_SRQT_BASIC;
  sa.cq = rcq.cq.get();
  sa.srq_context = &srq_tag;
  sa.attr.max_wr = 16;
  sa.attr.max_sge = 2;
  SrqPtr srq(ibv_create_srq_ex(d.ctx, &sa));
  const int srq_err = errno;
  check(srq && sa.attr.max_wr >= 16 && sa.attr.max_sge >= 2 &&
            srq->srq_context == &srq_tag && srq->pd == d.pd,
        "b) ibv_create_srq_ex (basic): max_wr/max_sge granted at least as "
        "asked, srq_context and pd kept",
        srq ? fmt("max_wr %u max_sge %u", sa.attr.max_wr, sa.attr.max_sge)
            : "errno " + err_text(srq_err));
  if (!srq) throw SetupError("ibv_create_srq_ex failed");
  {
    ibv_srq_init_attr_ex xa = sa;
    xa.srq_type = IBV_SRQT_XRC;
    errno = 0;
    ibv_srq* x = ibv_create_srq_ex(d.ctx, &xa);
    const int e = errno;
    check(!x && e == EOPNOTSUPP,
          "b) ibv_create_srq_ex of an XRC SRQ: NULL, errno EOPNOTSUPP",
          x ? "it succeeded" : "errno " + err_text(e));
    if (x) ibv_destroy_srq(x);
  }

  QpSpec spec;
  spec.scq = scq.cq.get();
  spec.rcq = rcq.cq.get();
  spec.ops = kRcOps;
  ibv_qp_cap cap{};
  QpPtr a = make_qp(d, spec, &cap);
  spec.srq = srq.get();
  QpPtr b = make_qp(d, spec);
  {
    QpSpec bad = spec;
    bad.srq = nullptr;
    bad.ops |= IBV_QP_EX_WITH_TSO;
    errno = 0;
    ibv_qp* x = try_create_qp(d, bad, nullptr);
    const int e = errno;
    check(!x && e == EOPNOTSUPP,
          "b) ibv_create_qp_ex of an RC QP with IBV_QP_EX_WITH_TSO: NULL, "
          "errno EOPNOTSUPP",
          x ? "it succeeded" : "errno " + err_text(e));
    if (x) ibv_destroy_qp(x);
    bad.ops = 0;
    QpPtr classic = make_qp(d, bad);
    check(ibv_qp_to_qp_ex(classic.get()) == nullptr,
          "b) ibv_qp_to_qp_ex of a QP created without send_ops_flags is NULL");
  }
  ibv_qp_ex* ax = ibv_qp_to_qp_ex(a.get());
  check(ax != nullptr && cap.max_inline_data >= 64,
        "b) ibv_qp_to_qp_ex of a QP created with send_ops_flags; "
        "max_inline_data granted",
        fmt("max_inline_data %u", cap.max_inline_data));
  if (!ax) throw SetupError("no ibv_qp_ex");
  connect_rc(d, a.get(), b.get());

  for (uint32_t i = 0; i < 4; ++i)
    post_recv(nullptr, srq.get(), 100 + i, buf, kRecv + i * 1024, 1024);
  int rc = ibv_req_notify_cq(rcq.cq.get(), 0);
  if (rc) throw SetupError("ibv_req_notify_cq: " + err_text(rc));

  char hello[] = "hello inline";  // 13 bytes with its NUL
  ibv_sge two[2] = {{buf.addr(kSrc), 10, buf.lkey()},
                    {buf.addr(kSrc + 100), 20, buf.lkey()}};
  char part1[] = "first-";
  char part2[] = "second";
  // The empty middle part has no address (UCX's zero-length messages).
  ibv_data_buf parts[3] = {{part1, 6}, {nullptr, 0}, {part2, 6}};

  ibv_wr_start(ax);
  ax->wr_id = 1;
  ax->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(ax, buf.rkey(), buf.addr(kWriteDst));
  ibv_wr_set_sge(ax, buf.lkey(), buf.addr(kSrc), 256);
  ax->wr_id = 2;
  ax->wr_flags = 0;  // unsignaled: its data lands, no completion
  ibv_wr_rdma_write(ax, buf.rkey(), buf.addr(kWriteDst2));
  ibv_wr_set_sge(ax, buf.lkey(), buf.addr(kSrc + 512), 64);
  ax->wr_id = 3;
  ax->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(ax);
  ibv_wr_set_inline_data(ax, hello, sizeof hello);
  ax->wr_id = 4;
  ibv_wr_send_imm(ax, htonl(kImmSend));
  ibv_wr_set_sge_list(ax, 2, two);
  ax->wr_id = 5;
  ibv_wr_rdma_write_imm(ax, buf.rkey(), buf.addr(kWimmDst), htonl(kImmWrite));
  ibv_wr_set_inline_data_list(ax, 3, parts);
  ax->wr_id = 6;
  ibv_wr_atomic_fetch_add(ax, buf.rkey(), buf.addr(kAtomic), 3);
  ibv_wr_set_sge(ax, buf.lkey(), buf.addr(kAtomic + 64), 8);
  ax->wr_id = 7;
  ibv_wr_atomic_cmp_swp(ax, buf.rkey(), buf.addr(kAtomic), 8, 100);
  ibv_wr_set_sge(ax, buf.lkey(), buf.addr(kAtomic + 128), 8);
  ax->wr_id = 8;
  ibv_wr_rdma_read(ax, buf.rkey(), buf.addr(kReadSrc));
  ibv_wr_set_sge(ax, buf.lkey(), buf.addr(kReadDst), 256);
  rc = ibv_wr_complete(ax);
  check(rc == 0,
        "b) ibv_wr_complete of one batch: WRITE, unsignaled WRITE, SEND "
        "(inline), SEND_WITH_IMM (sge list), WRITE_WITH_IMM (inline list), "
        "FETCH_ADD, CMP_SWP, READ",
        "returned " + err_text(rc));

  const uint32_t aq = a->qp_num;
  const uint32_t bq = b->qp_num;
  std::string why;
  std::vector<ibv_wc> got = poll_cq_ex(scq.ex, 7, &why);
  if (why.empty())
    why = wcs_mismatch(got, {{1, IBV_WC_RDMA_WRITE, aq},
                             {3, IBV_WC_SEND, aq},
                             {4, IBV_WC_SEND, aq},
                             {5, IBV_WC_RDMA_WRITE, aq},
                             {6, IBV_WC_FETCH_ADD, aq, 8},
                             {7, IBV_WC_COMP_SWAP, aq, 8},
                             {8, IBV_WC_RDMA_READ, aq, 256}});
  check(why.empty(),
        "b) start/next/end_poll and ibv_wc_read_*: the 7 signaled WRs "
        "complete in order (wr_id, opcode, qp_num; byte_len of READ and "
        "atomics)",
        why);
  ibv_poll_cq_attr pa{};
  rc = ibv_start_poll(scq.ex, &pa);
  if (rc == 0) {
    why = "another completion: " + wc_text(read_wc(scq.ex));
    ibv_end_poll(scq.ex);
  }
  check(rc == ENOENT,
        "b) ... and nothing more (the unsignaled WRITE has no completion; "
        "ibv_start_poll returns ENOENT)",
        rc == 0 ? why : "returned " + err_text(rc));
  check(memcmp(buf.p + kWriteDst, buf.p + kSrc, 256) == 0 &&
            memcmp(buf.p + kWriteDst2, buf.p + kSrc + 512, 64) == 0,
        "b) both WRITEs (signaled and unsignaled) landed byte for byte");
  check(same_as_pattern(buf.p + kReadDst, 256, 12),
        "b) the READ returned the remote bytes");
  uint64_t now_val, fetched, swapped;
  memcpy(&now_val, buf.p + kAtomic, 8);
  memcpy(&fetched, buf.p + kAtomic + 64, 8);
  memcpy(&swapped, buf.p + kAtomic + 128, 8);
  check(fetched == 5 && swapped == 8 && now_val == 100,
        "b) FETCH_ADD(+3) of 5 returned 5, CMP_SWP(8 -> 100) returned 8, "
        "the counter is 100",
        fmt("fetched %llu, compared %llu, counter %llu",
            static_cast<unsigned long long>(fetched),
            static_cast<unsigned long long>(swapped),
            static_cast<unsigned long long>(now_val)));
  check(memcmp(buf.p + kWimmDst, "first-second", 12) == 0,
        "b) WRITE_WITH_IMM from an inline data list landed byte for byte");

  ibv_cq* ecq = nullptr;
  void* ectx = nullptr;
  why.clear();
  const bool ev =
      readable(ch->fd, 5000) && ibv_get_cq_event(ch.get(), &ecq, &ectx) == 0;
  check(ev && ecq == rcq.cq.get() && ectx == &rcq_tag,
        "b) the receive CQ's channel delivers one event for it (its "
        "cq_context kept)",
        ev ? fmt("cq %p context %p", static_cast<void*>(ecq), ectx)
           : "no event within 5 s");
  if (ev) ibv_ack_cq_events(ecq, 1);

  why.clear();
  got = poll_cq_ex(rcq.ex, 3, &why);
  if (why.empty())
    why = wcs_mismatch(got,
                       {{100, IBV_WC_RECV, bq, sizeof hello},
                        {101, IBV_WC_RECV, bq, 30, kImmSend},
                        {102, IBV_WC_RECV_RDMA_WITH_IMM, bq, 12, kImmWrite}});
  check(why.empty(),
        "b) SRQ receives: SEND, SEND_WITH_IMM, WRITE_WITH_IMM in order "
        "(wr_id, opcode, byte_len, imm, qp_num of the SRQ's QP)",
        why);
  uint8_t want_imm_send[30];  // the two SGEs, gathered
  memcpy(want_imm_send, buf.p + kSrc, 10);
  memcpy(want_imm_send + 10, buf.p + kSrc + 100, 20);
  check(memcmp(buf.p + kRecv, hello, sizeof hello) == 0 &&
            memcmp(buf.p + kRecv + 1024, want_imm_send, 30) == 0,
        "b) the inline SEND and the two-SGE SEND arrived byte for byte");
  bool untouched = true;
  for (size_t i = 0; i < 1024; ++i)
    untouched = untouched && buf.p[kRecv + 2048 + i] == 0xee;
  check(untouched, "b) the receive WRITE_WITH_IMM consumed was not written to");

  // The classic verbs on the same QP and CQs.
  ibv_sge s{buf.addr(kSrc), 64, buf.lkey()};
  ibv_send_wr w{};
  w.wr_id = 9;
  w.opcode = IBV_WR_SEND;
  w.sg_list = &s;
  w.num_sge = 1;
  w.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  rc = ibv_post_send(a.get(), &w, &bad);
  why.clear();
  got = rc ? std::vector<ibv_wc>{} : poll_cq(scq.cq.get(), 1, &why);
  std::string why2;
  std::vector<ibv_wc> got2 =
      rc ? std::vector<ibv_wc>{} : poll_cq(rcq.cq.get(), 1, &why2);
  if (rc) why = "ibv_post_send returned " + err_text(rc);
  if (why.empty()) why = wcs_mismatch(got, {{9, IBV_WC_SEND, aq}});
  if (why.empty()) why = why2;
  if (why.empty()) why = wcs_mismatch(got2, {{103, IBV_WC_RECV, bq, 64}});
  check(why.empty() && memcmp(buf.p + kRecv + 3072, buf.p + kSrc, 64) == 0,
        "b) ibv_post_send on the same QP, ibv_poll_cq on the ibv_cq_ex CQs: "
        "the SEND and its receive complete, data byte for byte",
        why);

  ibv_srq_attr q{};
  rc = ibv_query_srq(srq.get(), &q);
  check(rc == 0 && q.max_wr >= 16 && q.srq_limit == 0,
        "b) ibv_query_srq: max_wr as granted, no limit armed",
        fmt("rc %d max_wr %u srq_limit %u", rc, q.max_wr, q.srq_limit));

  const int r1 = a.destroy(), r2 = b.destroy(), r3 = srq.destroy(),
            r4 = rcq.cq.destroy(), r5 = scq.cq.destroy(), r6 = ch.destroy();
  check(!r1 && !r2 && !r3 && !r4 && !r5 && !r6,
        "b) the QPs, SRQ, ibv_cq_ex CQs and channel destroy cleanly",
        fmt("%d %d %d %d %d %d", r1, r2, r3, r4, r5, r6));
}

// --- c) ibv_wr_* refusals ----------------------------------------------------

void section_wr_refusals(Dev& d) {
  constexpr size_t kSrc = 0;
  constexpr size_t kDst = 8192;  // no refused batch may touch it
  constexpr size_t kAtomic = 16384;
  Buffer buf(d.pd, kBufLen);
  fill(buf.p + kSrc, 4096, 21);
  fill(buf.p + kDst, 4096, 22);

  CqPtr scq = make_cq(d, 256);
  CqPtr rcq = make_cq(d, 256);
  QpSpec spec;
  spec.scq = scq.get();
  spec.rcq = rcq.get();
  spec.ops = kRcOps;
  spec.send_wr = 5;  // not a power of two: the granted value is the contract
  spec.sge = 2;
  ibv_qp_cap cap{};
  QpPtr a = make_qp(d, spec, &cap);
  QpPtr b = make_qp(d, spec);
  QpPtr idle = make_qp(d, spec);  // stays in RESET
  connect_rc(d, a.get(), b.get());
  AhPtr ah = make_ah(d, 0);
  ibv_qp_ex* ax = qp_ex(a);

  auto write_to_dst = [&](ibv_qp_ex* x, uint64_t wr_id) {
    x->wr_id = wr_id;
    x->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_rdma_write(x, buf.rkey(), buf.addr(kDst));
    ibv_wr_set_sge(x, buf.lkey(), buf.addr(kSrc), 256);
  };
  std::vector<uint8_t> big(cap.max_inline_data + 1, 0x33);
  std::vector<ibv_sge> sges(cap.max_send_sge + 1,
                            ibv_sge{buf.addr(kSrc), 8, buf.lkey()});
  struct Case {
    std::string name;
    int want;
    std::function<void(ibv_qp_ex*)> build;
    ibv_qp_ex* qx;
  };
  const std::vector<Case> cases = {
      {fmt("inline data of max_inline_data + 1 (%u) bytes",
           cap.max_inline_data + 1),
       EINVAL,
       [&](ibv_qp_ex* x) {
         x->wr_id = 33;
         ibv_wr_send(x);
         ibv_wr_set_inline_data(x, big.data(), big.size());
       },
       ax},
      {"a valid WRITE then an atomic with a 4-byte SGE", EINVAL,
       [&](ibv_qp_ex* x) {
         write_to_dst(x, 34);
         x->wr_id = 35;
         ibv_wr_atomic_cmp_swp(x, buf.rkey(), buf.addr(kAtomic), 0, 1);
         ibv_wr_set_sge(x, buf.lkey(), buf.addr(kAtomic + 64), 4);
       },
       ax},
      {"an atomic with inline data", EINVAL,
       [&](ibv_qp_ex* x) {
         x->wr_id = 36;
         ibv_wr_atomic_fetch_add(x, buf.rkey(), buf.addr(kAtomic), 1);
         ibv_wr_set_inline_data(x, big.data(), 8);
       },
       ax},
      {fmt("ibv_wr_set_sge_list of max_send_sge + 1 (%u) SGEs",
           cap.max_send_sge + 1),
       EINVAL,
       [&](ibv_qp_ex* x) {
         x->wr_id = 37;
         ibv_wr_send(x);
         ibv_wr_set_sge_list(x, sges.size(), sges.data());
       },
       ax},
      {"a data setter before any operation", EINVAL,
       [&](ibv_qp_ex* x) {
         ibv_wr_set_sge(x, buf.lkey(), buf.addr(kSrc), 8);
         write_to_dst(x, 38);
       },
       ax},
      {"ibv_wr_set_ud_addr on an RC QP", EINVAL,
       [&](ibv_qp_ex* x) {
         write_to_dst(x, 39);
         ibv_wr_set_ud_addr(x, ah.get(), b->qp_num, kQkey);
       },
       ax},
      {fmt("max_send_wr + 1 (%u) WRITEs in one batch", cap.max_send_wr + 1),
       ENOMEM,
       [&](ibv_qp_ex* x) {
         for (uint32_t i = 0; i <= cap.max_send_wr; ++i)
           write_to_dst(x, 40 + i);
       },
       ax},
      {"a WRITE on a QP in RESET", EINVAL,
       [&](ibv_qp_ex* x) { write_to_dst(x, 60); }, qp_ex(idle)},
  };
  for (const Case& c : cases) {
    ibv_wr_start(c.qx);
    c.build(c.qx);
    const int rc = ibv_wr_complete(c.qx);
    check(rc == c.want,
          "c) " + c.name + ": ibv_wr_complete returns " + err_text(c.want),
          "returned " + err_text(rc));
  }
  ibv_wr_start(ax);
  write_to_dst(ax, 61);
  ibv_wr_abort(ax);

  std::string why;
  const bool none = quiet(scq.get(), &why) && quiet(rcq.get(), &why);
  check(none && same_as_pattern(buf.p + kDst, 4096, 22),
        "c) none of the refused batches (nor the WRs before the bad one) "
        "and no aborted one ran: no completion, the target unchanged",
        none ? "the target was written" : why);

  int rc = wr_write(ax, 62, buf, kSrc, kDst, 256);
  why.clear();
  std::vector<ibv_wc> got =
      rc ? std::vector<ibv_wc>{} : poll_cq(scq.get(), 1, &why);
  if (rc) why = "ibv_wr_complete returned " + err_text(rc);
  if (why.empty())
    why = wcs_mismatch(got, {{62, IBV_WC_RDMA_WRITE, a->qp_num}});
  std::vector<uint8_t> want(4096);
  fill(want.data(), want.size(), 22);
  memcpy(want.data(), buf.p + kSrc, 256);
  check(
      why.empty() && memcmp(buf.p + kDst, want.data(), 4096) == 0,
      "c) the QP then runs a valid batch: the WRITE completes and lands, "
      "nothing else written",
      why.empty() ? "the target is not the old bytes under the WRITE's" : why);

  ibv_sge s{buf.addr(kSrc), 8, buf.lkey()};
  ibv_send_wr w{};
  w.wr_id = 63;
  w.opcode = IBV_WR_LOCAL_INV;
  w.sg_list = &s;
  w.num_sge = 1;
  w.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  rc = ibv_post_send(a.get(), &w, &bad);
  check(rc == EINVAL && bad == &w,
        "c) ibv_post_send of IBV_WR_LOCAL_INV with an SGE (it carries no "
        "data): EINVAL, *bad_wr is it",
        "returned " + err_text(rc));
}

// --- d) completion channels --------------------------------------------------

void section_channels(Dev& d) {
  constexpr size_t kSrc = 0;
  constexpr size_t kRecv = 8192;
  Buffer buf(d.pd, kBufLen);
  fill(buf.p + kSrc, 256, 41);

  ChannelPtr ch(ibv_create_comp_channel(d.ctx));
  if (!ch) throw SetupError("ibv_create_comp_channel: " + err_text(errno));
  int rtag = 0, stag = 0;
  CqPtr rcq = make_cq(d, 64, ch.get(), &rtag);  // b's receives
  CqPtr scq = make_cq(d, 64, ch.get(), &stag);  // a's sends
  CqPtr other = make_cq(d, 64);                 // a's receives, b's sends
  auto [a, b] = rc_pair(d, scq.get(), other.get(), other.get(), rcq.get(),
                        IBV_QP_EX_WITH_SEND);
  ibv_qp_ex* ax = qp_ex(a);
  for (uint32_t i = 0; i < 8; ++i)
    post_recv(b.get(), nullptr, 200 + i, buf, kRecv + i * 256, 256);
  const uint32_t aq = a->qp_num, bq = b->qp_num;

  // One SEND: its send and receive completions, "" or what went wrong.
  auto send_one = [&](uint64_t wr_id, unsigned flags, uint64_t recv_id) {
    const int rc = wr_send(ax, wr_id, flags, buf, kSrc, 32);
    if (rc) return "ibv_wr_complete returned " + err_text(rc);
    std::string why;
    std::vector<ibv_wc> s = poll_cq(scq.get(), 1, &why);
    if (why.empty()) why = wcs_mismatch(s, {{wr_id, IBV_WC_SEND, aq}});
    if (!why.empty()) return "send: " + why;
    std::vector<ibv_wc> r = poll_cq(rcq.get(), 1, &why);
    if (why.empty()) why = wcs_mismatch(r, {{recv_id, IBV_WC_RECV, bq, 32}});
    if (!why.empty()) return "receive: " + why;
    return std::string();
  };

  // A signal whose handler has no SA_RESTART ends a blocked
  // ibv_get_cq_event with -1, errno EINTR, as libibverbs' read() does: an
  // event loop a signal handler stops must not hang.
  {
    struct sigaction sa {
    }, old{};
    sa.sa_handler = [](int) {};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, &old);
    struct Wait {
      std::atomic<bool> done{false};
      int rc = 0, err = 0;
    };
    auto w = std::make_shared<Wait>();
    std::thread t([w, c = ch.get()] {
      ibv_cq* q = nullptr;
      void* x = nullptr;
      w->rc = ibv_get_cq_event(c, &q, &x);
      w->err = errno;
      w->done = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    pthread_kill(t.native_handle(), SIGUSR1);
    for (int i = 0; i < 50 && !w->done; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const bool ended = w->done;
    if (ended)
      t.join();
    else
      t.detach();  // blocked for good: the check below fails
    sigaction(SIGUSR1, &old, nullptr);
    check(ended && w->rc == -1 && w->err == EINTR,
          "d) a signal without SA_RESTART ends a blocked ibv_get_cq_event: "
          "-1, errno EINTR",
          ended ? fmt("rc %d errno %s", w->rc, err_text(w->err).c_str())
                : "still blocked 5 s after the signal");
  }

  const int fl = fcntl(ch->fd, F_GETFL);
  const bool nb = fl >= 0 && fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) == 0;
  ibv_cq* ecq = nullptr;
  void* ectx = nullptr;
  errno = 0;
  int rc = ibv_get_cq_event(ch.get(), &ecq, &ectx);
  int e = errno;
  check(nb && rc == -1 && e == EAGAIN,
        "d) ibv_get_cq_event on an O_NONBLOCK channel with nothing pending: "
        "-1, errno EAGAIN",
        fmt("rc %d errno %s", rc, err_text(e).c_str()));

  rc = ibv_req_notify_cq(rcq.get(), 1);
  std::string why = rc ? "ibv_req_notify_cq: " + err_text(rc)
                       : send_one(1, IBV_SEND_SIGNALED, 200);
  check(why.empty() && !readable(ch->fd, kQuietMs),
        "d) armed solicited-only: a SEND without IBV_SEND_SOLICITED "
        "completes and raises no event",
        why.empty() ? "the channel became readable" : why);

  why = send_one(2, IBV_SEND_SIGNALED | IBV_SEND_SOLICITED, 201);
  std::string ewhy;
  bool ev = next_cq_event(ch.get(), &ecq, &ectx, &ewhy);
  check(why.empty() && ev && ecq == rcq.get() && ectx == &rtag,
        "d) ... a SEND with IBV_SEND_SOLICITED raises one event for that CQ "
        "(its cq_context)",
        !why.empty() ? why
        : !ev        ? ewhy
                     : fmt("cq %p context %p", static_cast<void*>(ecq), ectx));
  if (ev) ibv_ack_cq_events(ecq, 1);

  why = send_one(3, IBV_SEND_SIGNALED | IBV_SEND_SOLICITED, 202);
  check(why.empty() && !readable(ch->fd, kQuietMs),
        "d) one event per arm: the next solicited SEND, not re-armed, "
        "raises none",
        why.empty() ? "the channel became readable" : why);

  // Both CQs on the channel armed: one SEND, one event for each.
  const int r1 = ibv_req_notify_cq(rcq.get(), 0);
  const int r2 = ibv_req_notify_cq(scq.get(), 0);
  why = r1 || r2 ? "ibv_req_notify_cq failed"
                 : send_one(4, IBV_SEND_SIGNALED, 203);
  int seen_r = 0, seen_s = 0;
  ewhy.clear();
  for (int i = 0; i < 2 && ewhy.empty(); ++i) {
    if (!next_cq_event(ch.get(), &ecq, &ectx, &ewhy)) break;
    if (ecq == rcq.get() && ectx == &rtag)
      ++seen_r;
    else if (ecq == scq.get() && ectx == &stag)
      ++seen_s;
    else
      ewhy = fmt("event for cq %p context %p", static_cast<void*>(ecq), ectx);
    ibv_ack_cq_events(ecq, 1);
  }
  check(why.empty() && ewhy.empty() && seen_r == 1 && seen_s == 1 &&
            !readable(ch->fd, kQuietMs),
        "d) two CQs armed on one channel: one SEND gives exactly one event "
        "for each, each with its own cq_context",
        !why.empty() ? why
                     : ewhy + fmt(" (receive CQ %d, send CQ %d events)", seen_r,
                                  seen_s));

  rc = ibv_destroy_comp_channel(ch.get());
  check(rc == EBUSY, "d) ibv_destroy_comp_channel while two CQs use it: EBUSY",
        "returned " + err_text(rc));
  const int ra = a.destroy(), rb = b.destroy(), rr = rcq.destroy();
  rc = ibv_destroy_comp_channel(ch.get());
  check(!ra && !rb && !rr && rc == EBUSY,
        "d) ... still EBUSY while one of them is left",
        fmt("destroy %d %d %d; returned %s", ra, rb, rr, err_text(rc).c_str()));
  const int rs = scq.destroy();
  rc = ch.destroy();
  check(rs == 0 && rc == 0,
        "d) ... and 0 once the last CQ using it is destroyed",
        fmt("ibv_destroy_cq %d, ibv_destroy_comp_channel %s", rs,
            err_text(rc).c_str()));
}

// --- e) async events ---------------------------------------------------------

void section_async(Dev& d) {
  constexpr size_t kSrc = 0;
  constexpr size_t kDst = 8192;
  constexpr size_t kRecv = 16384;
  Buffer buf(d.pd, kBufLen);
  fill(buf.p + kSrc, 4096, 51);

  const int fl = fcntl(d.ctx->async_fd, F_GETFL);
  if (fl < 0 || fcntl(d.ctx->async_fd, F_SETFL, fl | O_NONBLOCK) != 0)
    throw SetupError("O_NONBLOCK on async_fd: " + err_text(errno));
  std::string why = async_quiet(d);
  check(why.empty(),
        "e) no async event pending at the start (none for objects destroyed "
        "before)",
        why);

  // SRQ limit, then the last WQE of a QP on that SRQ.
  {
    CqPtr scq = make_cq(d, 64);
    CqPtr rcq = make_cq(d, 64);
    ibv_srq_init_attr si{};
    si.attr.max_wr = 16;
    si.attr.max_sge = 1;
    SrqPtr srq(ibv_create_srq(d.pd, &si));
    if (!srq) throw SetupError("ibv_create_srq: " + err_text(errno));
    QpSpec spec;
    spec.scq = scq.get();
    spec.rcq = rcq.get();
    spec.ops = IBV_QP_EX_WITH_SEND;
    QpPtr a = make_qp(d, spec);
    spec.srq = srq.get();
    QpPtr b = make_qp(d, spec);
    connect_rc(d, a.get(), b.get());
    ibv_qp_ex* ax = qp_ex(a);
    for (uint32_t i = 0; i < 4; ++i)
      post_recv(nullptr, srq.get(), 300 + i, buf, kRecv + i * 256, 256);
    ibv_srq_attr lim{};
    lim.srq_limit = 2;
    int rc = ibv_modify_srq(srq.get(), &lim, IBV_SRQ_LIMIT);
    ibv_srq_attr q{};
    const int qrc = ibv_query_srq(srq.get(), &q);
    check(rc == 0 && qrc == 0 && q.srq_limit == 2,
          "e) ibv_modify_srq arms the SRQ limit at 2 (4 receives posted), "
          "ibv_query_srq reports it",
          fmt("modify %s, query rc %d srq_limit %u", err_text(rc).c_str(), qrc,
              q.srq_limit));
    auto send_one = [&](uint64_t i) {
      const int r = wr_send(ax, i, IBV_SEND_SIGNALED, buf, kSrc, 16);
      if (r) return "ibv_wr_complete returned " + err_text(r);
      std::string w;
      std::vector<ibv_wc> s = poll_cq(scq.get(), 1, &w);
      if (w.empty()) w = wcs_mismatch(s, {{i, IBV_WC_SEND, a->qp_num}});
      if (!w.empty()) return "send: " + w;
      std::vector<ibv_wc> r2 = poll_cq(rcq.get(), 1, &w);
      if (w.empty())
        w = wcs_mismatch(r2, {{300 + i, IBV_WC_RECV, b->qp_num, 16}});
      return w.empty() ? w : "receive: " + w;
    };
    why = send_one(0);
    if (why.empty()) why = send_one(1);
    if (why.empty()) why = async_quiet(d);
    check(why.empty(),
          "e) two receives taken (2 left, not below the limit): no async "
          "event",
          why);
    why = send_one(2);
    check(why.empty(), "e) a third receive taken (1 left)", why);
    expect_async(d, IBV_EVENT_SRQ_LIMIT_REACHED, srq.get(),
                 "e) ... IBV_EVENT_SRQ_LIMIT_REACHED for that SRQ");
    why = send_one(3);
    if (why.empty()) why = async_quiet(d);
    check(why.empty(),
          "e) the limit fires once: the fourth receive raises no event", why);

    ibv_qp_attr x{};
    x.qp_state = IBV_QPS_ERR;
    rc = ibv_modify_qp(b.get(), &x, IBV_QP_STATE);
    check(rc == 0, "e) ibv_modify_qp of the SRQ's QP to ERR", err_text(rc));
    expect_async(d, IBV_EVENT_QP_LAST_WQE_REACHED, b.get(),
                 "e) ... IBV_EVENT_QP_LAST_WQE_REACHED for that QP");
  }

  // An event whose object is destroyed before it is read goes with it, as
  // with the kernel's verbs: poll() on async_fd must not report an event
  // ibv_get_async_event would then skip (and block on).
  {
    CqPtr scq = make_cq(d, 64);
    CqPtr rcq = make_cq(d, 64);
    ibv_srq_init_attr si{};
    si.attr.max_wr = 16;
    si.attr.max_sge = 1;
    SrqPtr srq(ibv_create_srq(d.pd, &si));
    if (!srq) throw SetupError("ibv_create_srq: " + err_text(errno));
    QpSpec spec;
    spec.scq = scq.get();
    spec.rcq = rcq.get();
    spec.ops = IBV_QP_EX_WITH_SEND;
    QpPtr a = make_qp(d, spec);
    spec.srq = srq.get();
    QpPtr b = make_qp(d, spec);
    connect_rc(d, a.get(), b.get());
    for (uint32_t i = 0; i < 2; ++i)
      post_recv(nullptr, srq.get(), 400 + i, buf, kRecv + i * 256, 256);
    ibv_srq_attr lim{};
    lim.srq_limit = 2;
    if (ibv_modify_srq(srq.get(), &lim, IBV_SRQ_LIMIT) != 0)
      throw SetupError("ibv_modify_srq");
    std::string w;
    if (wr_send(qp_ex(a), 9, IBV_SEND_SIGNALED, buf, kSrc, 16) == 0) {
      poll_cq(scq.get(), 1, &w);
      if (w.empty()) poll_cq(rcq.get(), 1, &w);
    } else {
      w = "ibv_wr_complete failed";
    }
    const bool pending = w.empty() && readable(d.ctx->async_fd, 2000);
    // The QP on the SRQ first, then the SRQ.
    const int rc = b.destroy() | a.destroy() | srq.destroy();
    check(rc == 0 && pending && !readable(d.ctx->async_fd, 300),
          "e) an unread SRQ_LIMIT_REACHED of a destroyed SRQ goes with it "
          "(async_fd no longer readable)",
          w.empty()
              ? fmt("destroy rc %d, pending before destroy: %d", rc, pending)
              : w);
  }

  // SQ drained.
  {
    CqPtr cq = make_cq(d, 64);
    QpSpec spec;
    spec.scq = cq.get();
    spec.rcq = cq.get();
    spec.ops = IBV_QP_EX_WITH_RDMA_WRITE;
    QpPtr a = make_qp(d, spec);
    QpPtr b = make_qp(d, spec);
    connect_rc(d, a.get(), b.get());
    ibv_qp_ex* ax = qp_ex(a);
    ibv_qp_attr x{};
    x.qp_state = IBV_QPS_SQD;
    x.en_sqd_async_notify = 1;
    int rc =
        ibv_modify_qp(a.get(), &x, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY);
    check(rc == 0,
          "e) ibv_modify_qp RTS -> SQD with IBV_QP_EN_SQD_ASYNC_NOTIFY",
          err_text(rc));
    expect_async(d, IBV_EVENT_SQ_DRAINED, a.get(),
                 "e) ... IBV_EVENT_SQ_DRAINED for that QP");
    ibv_qp_attr qa{};
    ibv_qp_init_attr qi{};
    const int qrc = ibv_query_qp(a.get(), &qa, IBV_QP_STATE, &qi);
    x = {};
    x.qp_state = IBV_QPS_RTS;
    rc = ibv_modify_qp(a.get(), &x, IBV_QP_STATE);
    why = rc ? "back to RTS: " + err_text(rc) : "";
    if (why.empty()) {
      rc = wr_write(ax, 70, buf, kSrc, kDst, 512);
      if (rc) why = "ibv_wr_complete returned " + err_text(rc);
    }
    if (why.empty()) {
      std::vector<ibv_wc> got = poll_cq(cq.get(), 1, &why);
      if (why.empty())
        why = wcs_mismatch(got, {{70, IBV_WC_RDMA_WRITE, a->qp_num}});
    }
    check(qrc == 0 && qa.qp_state == IBV_QPS_SQD && why.empty() &&
              memcmp(buf.p + kDst, buf.p + kSrc, 512) == 0,
          "e) ibv_query_qp says SQD; back in RTS the QP WRITEs again",
          fmt("query rc %d state %d; ", qrc, qa.qp_state) + why);
    // ibv_get_async_event(3): an object's destroy waits until every async
    // event handed out for it has been acknowledged (a thread may still be
    // reading the event's element). To SQD again, the event kept unacked.
    x = {};
    x.qp_state = IBV_QPS_SQD;
    x.en_sqd_async_notify = 1;
    rc = ibv_modify_qp(a.get(), &x, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY);
    why = rc ? "to SQD: " + err_text(rc) : "";
    ibv_async_event ev{};
    if (why.empty() && next_async(d.ctx, &ev, &why) &&
        (ev.event_type != IBV_EVENT_SQ_DRAINED || ev.element.qp != a.get())) {
      why = "got " + event_text(ev);
      ibv_ack_async_event(&ev);
    }
    if (why.empty()) {
      std::atomic<int> done{-1};
      std::thread t([&] { done = a.destroy(); });
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      const bool waited = done.load() == -1;
      ibv_ack_async_event(&ev);
      t.join();
      if (!waited)
        why = "ibv_destroy_qp returned before the event was acknowledged";
      else if (done.load() != 0)
        why = "ibv_destroy_qp: " + err_text(done.load());
    }
    check(why.empty(),
          "e) ibv_destroy_qp waits until the QP's async event is "
          "acknowledged, then returns 0",
          why);
  }

  // CQ overrun.
  {
    CqPtr tiny = make_cq(d, 2);
    CqPtr rcq = make_cq(d, 64);
    const uint32_t cqe = static_cast<uint32_t>(tiny->cqe);
    QpSpec spec;
    spec.scq = tiny.get();
    spec.rcq = rcq.get();
    spec.ops = IBV_QP_EX_WITH_RDMA_WRITE;
    spec.send_wr = cqe + 4;
    QpPtr a = make_qp(d, spec);
    spec.scq = rcq.get();
    QpPtr b = make_qp(d, spec);
    connect_rc(d, a.get(), b.get());
    ibv_qp_ex* ax = qp_ex(a);
    ibv_wr_start(ax);
    for (uint32_t i = 0; i <= cqe; ++i) {
      ax->wr_id = 80 + i;
      ax->wr_flags = IBV_SEND_SIGNALED;
      ibv_wr_rdma_write(ax, buf.rkey(), buf.addr(kDst + i * 64));
      ibv_wr_set_sge(ax, buf.lkey(), buf.addr(kSrc), 64);
    }
    const int rc = ibv_wr_complete(ax);
    check(rc == 0,
          fmt("e) %u signaled WRITEs posted on a QP whose send CQ holds %u",
              cqe + 1, cqe),
          "ibv_wr_complete returned " + err_text(rc));
    expect_async(d, IBV_EVENT_CQ_ERR, tiny.get(),
                 "e) ... the overrun raises IBV_EVENT_CQ_ERR for that CQ");
    std::vector<ibv_wc> got(cqe + 1);
    const int n =
        ibv_poll_cq(tiny.get(), static_cast<int>(cqe + 1), got.data());
    got.resize(n > 0 ? n : 0);
    std::vector<WantWc> want;
    for (uint32_t i = 0; i < cqe; ++i)
      want.push_back({80 + i, IBV_WC_RDMA_WRITE, a->qp_num});
    why = wcs_mismatch(got, want);
    ibv_wc extra{};
    errno = 0;
    const int n2 = ibv_poll_cq(tiny.get(), 1, &extra);
    const int e = errno;
    check(why.empty() && n2 == -1 && e == EIO,
          "e) ... the CQ gives the completions it held, in order, then "
          "ibv_poll_cq fails with EIO",
          why + fmt("; then ibv_poll_cq returned %d errno %d", n2, e));
  }

  // A READ of memory registered without REMOTE_READ: the requester's WR
  // fails with REM_ACCESS_ERR; the responder's QP enters ERR with no
  // receive WR to carry the cause, so its application gets
  // IBV_EVENT_QP_ACCESS_ERR (IBTA C9-222.1), as from mlx5 and rxe.
  {
    CqPtr scq = make_cq(d, 64);
    CqPtr rcq = make_cq(d, 64);
    RcPair p = rc_pair(d, scq.get(), rcq.get(), scq.get(), rcq.get(),
                       IBV_QP_EX_WITH_RDMA_READ);
    void* mem = aligned_alloc(4096, 4096);
    if (!mem) throw SetupError("aligned_alloc");
    ibv_mr* local_only = ibv_reg_mr(d.pd, mem, 4096, IBV_ACCESS_LOCAL_WRITE);
    if (!local_only) {
      free(mem);
      throw SetupError("ibv_reg_mr: " + err_text(errno));
    }
    ibv_qp_ex* ax = qp_ex(p.a);
    ibv_wr_start(ax);
    ax->wr_id = 90;
    ax->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_rdma_read(ax, local_only->rkey, reinterpret_cast<uint64_t>(mem));
    ibv_wr_set_sge(ax, buf.lkey(), buf.addr(kDst), 64);
    const int rc = ibv_wr_complete(ax);
    why = rc ? "ibv_wr_complete returned " + err_text(rc) : "";
    std::vector<ibv_wc> s;
    if (why.empty()) s = poll_cq(scq.get(), 1, &why);
    if (why.empty() &&
        (s[0].wr_id != 90 || s[0].status != IBV_WC_REM_ACCESS_ERR))
      why = fmt("wr_id %llu status %s",
                static_cast<unsigned long long>(s[0].wr_id),
                ibv_wc_status_str(s[0].status));
    check(why.empty(),
          "e) an RDMA READ of an MR without REMOTE_READ completes "
          "IBV_WC_REM_ACCESS_ERR",
          why);
    expect_async(d, IBV_EVENT_QP_ACCESS_ERR, p.b.get(),
                 "e) ... the responder's QP gets IBV_EVENT_QP_ACCESS_ERR");
    ibv_dereg_mr(local_only);
    free(mem);
  }
  why = async_quiet(d);
  check(why.empty(), "e) no other async event was raised", why);
}

// --- f) UD and the AH from a received GRH ------------------------------------

void section_ud(Dev& d) {
  constexpr size_t kSrc = 0;        // 4096 bytes, pattern 61
  constexpr size_t kRecv1 = 8192;   // u1's receive (replies)
  constexpr size_t kRecv2 = 16384;  // u2's receive, room for GRH + 4096
  Buffer buf(d.pd, kBufLen);
  fill(buf.p + kSrc, 4096, 61);

  CqEx cq1 = make_cq_ex(d, 64);
  CqEx cq2 = make_cq_ex(d, 64);
  QpSpec spec;
  spec.type = IBV_QPT_UD;
  spec.scq = cq1.cq.get();
  spec.rcq = cq1.cq.get();
  spec.ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
  spec.sge = 1;
  {
    QpSpec bad = spec;
    bad.ops |= IBV_QP_EX_WITH_RDMA_WRITE;
    errno = 0;
    ibv_qp* x = try_create_qp(d, bad, nullptr);
    const int e = errno;
    check(!x && e == EOPNOTSUPP,
          "f) ibv_create_qp_ex of a UD QP with IBV_QP_EX_WITH_RDMA_WRITE: "
          "NULL, errno EOPNOTSUPP",
          x ? "it succeeded" : "errno " + err_text(e));
    if (x) ibv_destroy_qp(x);
  }
  QpPtr u1 = make_qp(d, spec);
  spec.scq = cq2.cq.get();
  spec.rcq = cq2.cq.get();
  QpPtr u2 = make_qp(d, spec);
  ud_to_rts(u1.get());
  ud_to_rts(u2.get());
  ibv_qp_ex* x1 = qp_ex(u1);
  ibv_qp_ex* x2 = qp_ex(u2);
  const uint32_t q1 = u1->qp_num, q2 = u2->qp_num;

  bool saw_ipv6 = false;
  for (size_t g = 0; g < d.gids.size(); ++g) {
    const ibv_gid& gid = d.gids[g].gid;
    const bool v4 = is_ipv4_mapped(gid);
    saw_ipv6 = saw_ipv6 || !v4;
    const std::string name = fmt("f) from GID %zu (%s %s)", g,
                                 v4 ? "IPv4" : "IPv6", gid_text(gid).c_str());
    const uint32_t imm = 0x5a000000u | static_cast<uint32_t>(g);
    AhPtr ah = make_ah(d, g);
    memset(buf.p + kRecv1, 0xee, 4096);
    memset(buf.p + kRecv2, 0xee, 4096 + kGrhLen);
    post_recv(u2.get(), nullptr, 1000 + g, buf, kRecv2, kGrhLen + 512);
    post_recv(u1.get(), nullptr, 2000 + g, buf, kRecv1, kGrhLen + 512);

    ibv_wr_start(x1);
    x1->wr_id = 10 + g;
    x1->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_send_imm(x1, htonl(imm));
    ibv_wr_set_sge(x1, buf.lkey(), buf.addr(kSrc + g), 100);
    ibv_wr_set_ud_addr(x1, ah.get(), q2, kQkey);
    int rc = ibv_wr_complete(x1);
    std::string why =
        rc ? "ibv_wr_complete returned " + err_text(rc) : std::string();
    std::vector<ibv_wc> s, r;
    if (why.empty()) s = poll_cq_ex(cq1.ex, 1, &why);
    if (why.empty()) why = wcs_mismatch(s, {{10 + g, IBV_WC_SEND, q1}});
    if (why.empty()) r = poll_cq_ex(cq2.ex, 1, &why);
    if (why.empty())
      why = wcs_mismatch(
          r, {{1000 + g, IBV_WC_RECV, q2, kGrhLen + 100, imm, q1, true}});
    if (!check(why.empty(),
               name + ": ibv_wr_send_imm + ibv_wr_set_ud_addr: the send "
                      "completes, the receive has byte_len GRH + 100, GRH "
                      "flag, imm, src_qp",
               why))
      continue;
    const ibv_wc wc = r[0];
    check(wc.sl == (v4 ? 0xa : 0x9),
          name +
              ": wc.sl is the RoCE packet type as ConnectX reports it "
              "(0xa RoCEv2/IPv4, 0x9 RoCEv2/IPv6; UCX's ud_verbs reads it)",
          fmt("sl %#x", wc.sl));
    uint8_t* rb = buf.p + kRecv2;
    check(memcmp(rb + kGrhLen, buf.p + kSrc + g, 100) == 0 &&
              rb[kGrhLen + 100] == 0xee,
          name +
              ": the payload follows the 40-byte GRH byte for byte, "
              "nothing after it");
    auto* grh = reinterpret_cast<ibv_grh*>(rb);
    if (v4) {
      const uint8_t* ip4 = rb + 20;
      check(ip4[0] == 0x45 && ip4[9] == IPPROTO_UDP &&
                memcmp(ip4 + 12, gid.raw + 12, 4) == 0 &&
                memcmp(ip4 + 16, gid.raw + 12, 4) == 0,
            name +
                ": the GRH holds the IPv4 header (UDP, source and "
                "destination this address) in its last 20 bytes",
            fmt("version/ihl %#x protocol %u src %u.%u.%u.%u dst "
                "%u.%u.%u.%u",
                ip4[0], ip4[9], ip4[12], ip4[13], ip4[14], ip4[15], ip4[16],
                ip4[17], ip4[18], ip4[19]));
    } else {
      check((rb[0] >> 4) == 6 && grh->next_hdr == IPPROTO_UDP &&
                same_gid(grh->sgid, gid) && same_gid(grh->dgid, gid),
            name +
                ": the GRH is the IPv6 header (UDP, sgid and dgid this "
                "GID)",
            fmt("version %u next_hdr %u sgid %s dgid %s", rb[0] >> 4,
                grh->next_hdr, gid_text(grh->sgid).c_str(),
                gid_text(grh->dgid).c_str()));
    }
    ibv_wc wcc = wc;
    ibv_ah_attr from{};
    rc = ibv_init_ah_from_wc(d.ctx, 1, &wcc, grh, &from);
    check(rc == 0 && from.is_global && same_gid(from.grh.dgid, gid) &&
              from.grh.sgid_index == g && from.port_num == 1,
          name +
              ": ibv_init_ah_from_wc: global, the sender's GID as dgid, "
              "this GID's index as sgid_index",
          fmt("rc %d is_global %u dgid %s sgid_index %u port %u", rc,
              from.is_global, gid_text(from.grh.dgid).c_str(),
              from.grh.sgid_index, from.port_num));

    AhPtr back(ibv_create_ah_from_wc(d.pd, &wcc, grh, 1));
    char reply[32];
    fill(reply, sizeof reply, 62 + static_cast<uint32_t>(g));
    why = back ? "" : "ibv_create_ah_from_wc: " + err_text(errno);
    if (why.empty()) {
      ibv_wr_start(x2);
      x2->wr_id = 20 + g;
      x2->wr_flags = IBV_SEND_SIGNALED;
      ibv_wr_send(x2);
      ibv_wr_set_inline_data(x2, reply, sizeof reply);
      ibv_wr_set_ud_addr(x2, back.get(), wc.src_qp, kQkey);
      rc = ibv_wr_complete(x2);
      if (rc) why = "ibv_wr_complete returned " + err_text(rc);
    }
    if (why.empty()) s = poll_cq_ex(cq2.ex, 1, &why);
    if (why.empty()) why = wcs_mismatch(s, {{20 + g, IBV_WC_SEND, q2}});
    if (why.empty()) r = poll_cq_ex(cq1.ex, 1, &why);
    if (why.empty())
      why = wcs_mismatch(r, {{2000 + g, IBV_WC_RECV, q1, kGrhLen + sizeof reply,
                              -1, q2, true}});
    check(why.empty() &&
              memcmp(buf.p + kRecv1 + kGrhLen, reply, sizeof reply) == 0,
          name +
              ": an inline reply through the AH from "
              "ibv_create_ah_from_wc reaches the sender (src_qp, "
              "payload byte for byte)",
          why.empty() ? "the payload differs" : why);
  }
  if (!saw_ipv6)
    printf(
        "# no IPv6 GID on %s (the service has no port.ipv6): the IPv6 UD "
        "round trip is not run\n",
        ibv_get_device_name(d.dev));

  // Limits, through GID 0.
  AhPtr ah = make_ah(d, 0);
  const uint32_t mtu = d.mtu();
  ibv_wr_start(x1);
  x1->wr_id = 90;
  x1->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(x1);
  ibv_wr_set_sge(x1, buf.lkey(), buf.addr(kSrc), 100);
  int rc = ibv_wr_complete(x1);
  check(rc == EINVAL,
        "f) a UD SEND without ibv_wr_set_ud_addr: ibv_wr_complete returns "
        "EINVAL",
        "returned " + err_text(rc));

  memset(buf.p + kRecv2, 0xee, 4096 + kGrhLen);
  post_recv(u2.get(), nullptr, 3000, buf, kRecv2, kGrhLen + 4096);
  ibv_wr_start(x1);
  x1->wr_id = 91;
  x1->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(x1);
  ibv_wr_set_sge(x1, buf.lkey(), buf.addr(kSrc), mtu + 1);
  ibv_wr_set_ud_addr(x1, ah.get(), q2, kQkey);
  rc = ibv_wr_complete(x1);
  {
    // IBTA C10-93.1.1 (and rxe): no packet, no error.
    std::string why0 =
        rc ? "ibv_wr_complete returned " + err_text(rc) : std::string();
    std::vector<ibv_wc> s0;
    if (why0.empty()) s0 = poll_cq_ex(cq1.ex, 1, &why0);
    if (why0.empty()) why0 = wcs_mismatch(s0, {{91, IBV_WC_SEND, q1}});
    if (why0.empty()) quiet(cq2.cq.get(), &why0);
    check(why0.empty(),
          fmt("f) a UD SEND of port MTU + 1 (%u) bytes completes at the "
              "sender and sends nothing (C10-93.1.1): no receive completion",
              mtu + 1),
          why0);
  }

  // A wrong Q_Key: sent, silently dropped; the receive stays posted.
  ibv_wr_start(x1);
  x1->wr_id = 92;
  x1->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(x1);
  ibv_wr_set_sge(x1, buf.lkey(), buf.addr(kSrc), 64);
  ibv_wr_set_ud_addr(x1, ah.get(), q2, kQkey + 1);
  rc = ibv_wr_complete(x1);
  std::string why =
      rc ? "ibv_wr_complete returned " + err_text(rc) : std::string();
  std::vector<ibv_wc> s;
  if (why.empty()) s = poll_cq_ex(cq1.ex, 1, &why);
  if (why.empty()) why = wcs_mismatch(s, {{92, IBV_WC_SEND, q1}});
  if (why.empty()) quiet(cq2.cq.get(), &why);
  check(why.empty(),
        "f) a UD SEND with the wrong Q_Key completes at the sender and is "
        "dropped: no receive completion",
        why);

  // Exactly the path MTU is delivered, into the receive still posted.
  ibv_wr_start(x1);
  x1->wr_id = 93;
  x1->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(x1);
  ibv_wr_set_sge(x1, buf.lkey(), buf.addr(kSrc), mtu);
  ibv_wr_set_ud_addr(x1, ah.get(), q2, kQkey);
  rc = ibv_wr_complete(x1);
  why = rc ? "ibv_wr_complete returned " + err_text(rc) : std::string();
  std::vector<ibv_wc> r;
  if (why.empty()) s = poll_cq_ex(cq1.ex, 1, &why);
  if (why.empty()) why = wcs_mismatch(s, {{93, IBV_WC_SEND, q1}});
  if (why.empty()) r = poll_cq_ex(cq2.ex, 1, &why);
  if (why.empty())
    why =
        wcs_mismatch(r, {{3000, IBV_WC_RECV, q2,
                          static_cast<int64_t>(kGrhLen + mtu), -1, q1, true}});
  check(why.empty() && memcmp(buf.p + kRecv2 + kGrhLen, buf.p + kSrc, mtu) == 0,
        fmt("f) a UD SEND of exactly the port MTU (%u bytes) is delivered "
            "byte for byte to the receive the dropped ones left",
            mtu),
        why.empty() ? "the payload differs" : why);

  // Sends whose AH is destroyed as soon as they are posted, without a poll
  // in between (mckey's sender does this): each took the AH's address at
  // the post, as on a NIC that writes it into the WQE (mlx5).
  {
    constexpr uint32_t kN = 16, kLen = 64, kSlot = kGrhLen + kLen;
    memset(buf.p + kRecv2, 0xee, kN * kSlot);
    for (uint32_t i = 0; i < kN; ++i)
      post_recv(u2.get(), nullptr, 4000 + i, buf, kRecv2 + i * kSlot, kSlot);
    AhPtr gone = make_ah(d, 0);
    ibv_wr_start(x1);
    for (uint32_t i = 0; i < kN; ++i) {
      x1->wr_id = 100 + i;
      x1->wr_flags = IBV_SEND_SIGNALED;
      ibv_wr_send(x1);
      ibv_wr_set_sge(x1, buf.lkey(), buf.addr(kSrc + i), kLen);
      ibv_wr_set_ud_addr(x1, gone.get(), q2, kQkey);
    }
    rc = ibv_wr_complete(x1);
    const int drc = gone.destroy();
    why = rc || drc ? fmt("ibv_wr_complete %d, ibv_destroy_ah %d", rc, drc)
                    : std::string();
    std::vector<WantWc> ws, wr;
    for (uint32_t i = 0; i < kN; ++i) {
      ws.push_back({100 + i, IBV_WC_SEND, q1});
      wr.push_back({4000 + i, IBV_WC_RECV, q2, kSlot, -1, q1, true});
    }
    if (why.empty()) s = poll_cq_ex(cq1.ex, kN, &why);
    if (why.empty()) why = wcs_mismatch(s, ws);
    if (why.empty()) r = poll_cq_ex(cq2.ex, kN, &why);
    if (why.empty()) why = wcs_mismatch(r, wr);
    for (uint32_t i = 0; why.empty() && i < kN; ++i)
      if (memcmp(buf.p + kRecv2 + i * kSlot + kGrhLen, buf.p + kSrc + i,
                 kLen) != 0)
        why = fmt("message %u differs", i);
    check(why.empty(),
          fmt("f) %u UD SENDs whose AH is destroyed right after the post "
              "(no poll between): all complete and arrive byte for byte",
              kN),
          why);
  }

  const int r1 = u1.destroy(), r2 = u2.destroy(), r3 = ah.destroy(),
            r4 = cq1.cq.destroy(), r5 = cq2.cq.destroy();
  check(!r1 && !r2 && !r3 && !r4 && !r5,
        "f) the UD QPs, AH and ibv_cq_ex CQs destroy cleanly",
        fmt("%d %d %d %d %d", r1, r2, r3, r4, r5));
}

void run(const char* name, void (*fn)(Dev&), Dev& d) {
  try {
    fn(d);
  } catch (const SetupError& e) {
    check(false, fmt("%s: setup", name), e.what());
  }
}

}  // namespace

// --- g) ibv_resize_cq
// ---------------------------------------------------------

void section_resize_cq(Dev& d) {
  constexpr size_t kSrc = 0;
  constexpr size_t kRecv = 8192;
  constexpr uint32_t kBatch = 24;  // more than the CQ held before growing
  Buffer buf(d.pd, kBufLen);
  fill(buf.p + kSrc, 256, 51);
  CqPtr scq = make_cq(d, 4);  // a's sends: resized
  CqPtr other = make_cq(d, 64);
  CqPtr rcq = make_cq(d, 64);
  auto [a, b] = rc_pair(d, scq.get(), other.get(), other.get(), rcq.get(),
                        IBV_QP_EX_WITH_SEND);
  ibv_qp_ex* ax = qp_ex(a);
  for (uint32_t i = 0; i < 3 + kBatch + 1; ++i)  // + the last send's
    post_recv(b.get(), nullptr, 300 + i, buf, kRecv + i * 64, 64);
  const int cqe0 = scq->cqe;

  // Three sends, then the resize while their completions may still be on
  // the way: whether they land before or after the move, none is lost.
  std::string why;
  for (uint64_t i = 0; i < 3 && why.empty(); ++i)
    if (const int rc = wr_send(ax, 500 + i, IBV_SEND_SIGNALED, buf, kSrc, 16))
      why = "ibv_wr_complete returned " + err_text(rc);
  int rc = why.empty() ? ibv_resize_cq(scq.get(), 64) : -1;
  check(why.empty() && rc == 0 && scq->cqe >= 64 && cqe0 >= 4,
        "g) ibv_resize_cq from 4 to 64 with completions outstanding: 0, "
        "cq->cqe updated",
        fmt("%s rc %d cqe %d -> %d", why.c_str(), rc, cqe0, scq->cqe));
  for (uint64_t i = 3; i < 3 + kBatch && why.empty(); ++i)
    if (const int r = wr_send(ax, 500 + i, IBV_SEND_SIGNALED, buf, kSrc, 16))
      why = "ibv_wr_complete returned " + err_text(r);
  std::vector<ibv_wc> got;
  if (why.empty()) got = poll_cq(scq.get(), 3 + kBatch, &why);
  for (size_t i = 0; why.empty() && i < got.size(); ++i)
    if (got[i].wr_id != 500 + i || got[i].status != IBV_WC_SUCCESS)
      why = fmt("completion %zu: wr_id %llu status %s", i,
                static_cast<unsigned long long>(got[i].wr_id),
                ibv_wc_status_str(got[i].status));
  check(why.empty(),
        fmt("g) every one of %u send completions arrives once, in order, "
            "across the resize and beyond the old size",
            3 + kBatch),
        why);
  if (why.empty()) poll_cq(rcq.get(), 3 + kBatch, &why);
  check(why.empty(), "g) and the peer received them all", why);

  ibv_device_attr da{};
  ibv_query_device(d.ctx, &da);
  const int big = ibv_resize_cq(scq.get(), da.max_cqe + 1);
  const int zero = ibv_resize_cq(scq.get(), 0);
  const int shrink = ibv_resize_cq(scq.get(), 2);
  check(big == EINVAL && zero == EINVAL && shrink == 0 && scq->cqe >= 2,
        "g) ibv_resize_cq beyond max_cqe or to 0 is EINVAL; shrinking an "
        "empty CQ works",
        fmt("max_cqe+1 %d, 0 %d, 2 %d (cqe %d)", big, zero, shrink, scq->cqe));
  rc = wr_send(ax, 900, IBV_SEND_SIGNALED, buf, kSrc, 16);
  got.clear();
  why = rc ? "ibv_wr_complete returned " + err_text(rc) : std::string();
  if (why.empty()) got = poll_cq(scq.get(), 1, &why);
  if (why.empty()) why = wcs_mismatch(got, {{900, IBV_WC_SEND, a->qp_num}});
  check(why.empty(), "g) the shrunk CQ completes the next send", why);
}

// --- h) memory windows -------------------------------------------------------

// One RDMA op of `len` bytes between b[local] and (raddr, rkey); its
// completion status, or -1 if none came.
int rdma_status(ibv_qp_ex* x, ibv_cq* cq, bool write, uint64_t wr_id,
                const Buffer& b, size_t local, uint64_t raddr, uint32_t rkey,
                uint32_t len) {
  ibv_wr_start(x);
  x->wr_id = wr_id;
  x->wr_flags = IBV_SEND_SIGNALED;
  if (write)
    ibv_wr_rdma_write(x, rkey, raddr);
  else
    ibv_wr_rdma_read(x, rkey, raddr);
  ibv_wr_set_sge(x, b.lkey(), b.addr(local), len);
  if (ibv_wr_complete(x)) return -1;
  const auto end = std::chrono::steady_clock::now() + kDeadline;
  while (std::chrono::steady_clock::now() < end) {
    ibv_wc w;
    const int k = ibv_poll_cq(cq, 1, &w);
    if (k < 0) return -1;
    if (k == 1) return w.status;
  }
  return -1;
}

void section_mw(Dev& d) {
  constexpr size_t kSrc = 0, kWin = 8192, kRecv = 16384, kRead = 24576;
  ibv_device_attr da{};
  const int qrc = ibv_query_device(d.ctx, &da);
  check(qrc == 0 && (da.device_cap_flags & IBV_DEVICE_MEM_WINDOW) &&
            (da.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) &&
            da.max_mw > 0,
        "h) ibv_query_device: MEM_WINDOW, MEM_WINDOW_TYPE_2B, max_mw > 0",
        fmt("flags %#llx max_mw %d",
            static_cast<unsigned long long>(da.device_cap_flags), da.max_mw));
  Buffer buf(d.pd, kBufLen);
  fill(buf.p + kSrc, 256, 81);
  // The windows' MR: the same pages, registered with MW_BIND.
  ibv_mr* bmr = ibv_reg_mr(d.pd, buf.p, kBufLen, kAccess | IBV_ACCESS_MW_BIND);
  if (!bmr) throw SetupError("ibv_reg_mr with MW_BIND: " + err_text(errno));
  CqPtr acq = make_cq(d, 64), bcq = make_cq(d, 64), brcq = make_cq(d, 64);
  constexpr uint64_t kBindOps =
      kRcOps | IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV;
  auto [a, b] =
      rc_pair(d, acq.get(), acq.get(), bcq.get(), brcq.get(), kRcOps, kBindOps);
  ibv_qp_ex* ax = qp_ex(a);
  const uint32_t bq = b->qp_num;
  std::string why;

  // Type 1, bound by ibv_bind_mw on b: [kWin, +256), remote write and read.
  ibv_mw* m1 = ibv_alloc_mw(d.pd, IBV_MW_TYPE_1);
  if (!check(m1 != nullptr, "h) ibv_alloc_mw type 1", err_text(errno))) {
    ibv_dereg_mr(bmr);
    return;
  }
  const uint32_t rkey0 = m1->rkey;
  ibv_mw_bind mb{};
  mb.wr_id = 700;
  mb.send_flags = IBV_SEND_SIGNALED;
  mb.bind_info = {bmr, buf.addr(kWin), 256,
                  IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ};
  int rc = ibv_bind_mw(b.get(), m1, &mb);
  std::vector<ibv_wc> got;
  if (rc) why = "ibv_bind_mw returned " + err_text(rc);
  if (why.empty()) got = poll_cq(bcq.get(), 1, &why);
  if (why.empty()) why = wcs_mismatch(got, {{700, IBV_WC_BIND_MW, bq}});
  check(why.empty() && m1->rkey != rkey0,
        "h) ibv_bind_mw of a type 1 window: IBV_WC_BIND_MW, a new rkey", why);
  rc = rdma_status(ax, acq.get(), true, 701, buf, kSrc, buf.addr(kWin + 64),
                   m1->rkey, 128);
  check(
      rc == IBV_WC_SUCCESS && memcmp(buf.p + kWin + 64, buf.p + kSrc, 128) == 0,
      "h) a WRITE through the window's rkey lands inside it",
      fmt("status %d", rc));
  rc = rdma_status(ax, acq.get(), false, 702, buf, kRead, buf.addr(kWin + 64),
                   m1->rkey, 128);
  check(rc == IBV_WC_SUCCESS && memcmp(buf.p + kRead, buf.p + kSrc, 128) == 0,
        "h) a READ through it returns those bytes", fmt("status %d", rc));
  const int busy = ibv_dereg_mr(bmr);
  check(busy == EBUSY, "h) ibv_dereg_mr of the MR under a bound window: EBUSY",
        "returned " + err_text(busy));
  const uint32_t lkey_before = bmr->lkey;
  errno = 0;
  const int rr = ibv_rereg_mr(bmr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr,
                              0, kAccess);
  const int rr_err = errno;
  rc = rdma_status(ax, acq.get(), false, 704, buf, kRead, buf.addr(kWin + 64),
                   m1->rkey, 64);
  check(rr == IBV_REREG_MR_ERR_INPUT && rr_err == EBUSY &&
            bmr->lkey == lkey_before && rc == IBV_WC_SUCCESS,
        "h) ibv_rereg_mr of that MR: IBV_REREG_MR_ERR_INPUT, EBUSY, the MR "
        "and the window unchanged and working",
        fmt("rc %d errno %d, lkey %#x -> %#x, READ status %d", rr, rr_err,
            lkey_before, bmr->lkey, rc));
  // Beyond the window: the QP of the access fails (a fresh pair after).
  rc = rdma_status(ax, acq.get(), true, 703, buf, kSrc, buf.addr(kWin + 200),
                   m1->rkey, 128);
  check(rc == IBV_WC_REM_ACCESS_ERR,
        "h) a WRITE past the window's end: IBV_WC_REM_ACCESS_ERR",
        fmt("status %d", rc));
  check(ibv_dealloc_mw(m1) == 0, "h) ibv_dealloc_mw of the bound window");

  // Type 2 on a fresh pair: bound by a BIND_MW WR through ibv_wr_bind_mw,
  // used, then invalidated by the peer's SEND_WITH_INV.
  auto [a2, b2] =
      rc_pair(d, acq.get(), acq.get(), bcq.get(), brcq.get(), kRcOps, kBindOps);
  ax = qp_ex(a2);
  ibv_qp_ex* bx = qp_ex(b2);
  const uint32_t bq2 = b2->qp_num;
  ibv_mw* m2 = ibv_alloc_mw(d.pd, IBV_MW_TYPE_2);
  if (!check(m2 != nullptr, "h) ibv_alloc_mw type 2", err_text(errno))) {
    ibv_dereg_mr(bmr);
    return;
  }
  const uint32_t rkey2 = ibv_inc_rkey(m2->rkey);
  ibv_wr_start(bx);
  bx->wr_id = 710;
  bx->wr_flags = IBV_SEND_SIGNALED;
  const ibv_mw_bind_info bi{bmr, buf.addr(kWin), 256, IBV_ACCESS_REMOTE_WRITE};
  ibv_wr_bind_mw(bx, m2, rkey2, &bi);
  rc = ibv_wr_complete(bx);
  why = rc ? "ibv_wr_complete returned " + err_text(rc) : std::string();
  got.clear();
  if (why.empty()) got = poll_cq(bcq.get(), 1, &why);
  if (why.empty()) why = wcs_mismatch(got, {{710, IBV_WC_BIND_MW, bq2}});
  check(why.empty() && m2->rkey == rkey2,
        "h) ibv_wr_bind_mw of a type 2 window: IBV_WC_BIND_MW, mw->rkey is "
        "the one given",
        why);
  rc = rdma_status(ax, acq.get(), true, 711, buf, kSrc, buf.addr(kWin), rkey2,
                   64);
  check(rc == IBV_WC_SUCCESS, "h) a WRITE through the type 2 window",
        fmt("status %d", rc));
  post_recv(b2.get(), nullptr, 720, buf, kRecv, 64);
  ibv_wr_start(ax);
  ax->wr_id = 712;
  ax->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send_inv(ax, rkey2);
  ibv_wr_set_sge(ax, buf.lkey(), buf.addr(kSrc), 16);
  rc = ibv_wr_complete(ax);
  why = rc ? "ibv_wr_complete returned " + err_text(rc) : std::string();
  got.clear();
  if (why.empty()) got = poll_cq(brcq.get(), 1, &why);
  if (why.empty() && !(got[0].wc_flags & IBV_WC_WITH_INV))
    why = "no IBV_WC_WITH_INV";
  if (why.empty() && got[0].invalidated_rkey != rkey2)
    why = fmt("invalidated_rkey %#x", got[0].invalidated_rkey);
  if (why.empty()) poll_cq(acq.get(), 1, &why);
  check(why.empty(),
        "h) ibv_wr_send_inv: the receive completes with IBV_WC_WITH_INV and "
        "the window's rkey",
        why);
  rc = rdma_status(ax, acq.get(), true, 713, buf, kSrc, buf.addr(kWin), rkey2,
                   64);
  check(rc == IBV_WC_REM_ACCESS_ERR,
        "h) the invalidated rkey is refused: IBV_WC_REM_ACCESS_ERR",
        fmt("status %d", rc));
  check(ibv_dealloc_mw(m2) == 0, "h) ibv_dealloc_mw of the type 2 window");
  check(ibv_dereg_mr(bmr) == 0,
        "h) ibv_dereg_mr once no window is bound to it");
}

// --- i) ATOMIC_WRITE
// ------------------------------------------------------------

// One ibv_wr_atomic_write of `value` to (raddr, rkey); its completion, or
// status -1 if none came.
ibv_wc atomic_write(ibv_qp_ex* x, ibv_cq* cq, uint64_t wr_id, uint64_t raddr,
                    uint32_t rkey, uint64_t value) {
  ibv_wc w{};
  w.status = static_cast<ibv_wc_status>(-1);
  ibv_wr_start(x);
  x->wr_id = wr_id;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_atomic_write(x, rkey, raddr, &value);
  value = ~value;  // the 8 bytes were taken at the call
  if (ibv_wr_complete(x)) return w;
  const auto end = std::chrono::steady_clock::now() + kDeadline;
  while (std::chrono::steady_clock::now() < end) {
    const int k = ibv_poll_cq(cq, 1, &w);
    if (k < 0) break;
    if (k == 1) return w;
  }
  w.status = static_cast<ibv_wc_status>(-1);
  return w;
}

void section_atomic_write(Dev& d) {
  constexpr size_t kWord = 4096;
  Buffer buf(d.pd, kBufLen);
  CqPtr acq = make_cq(d, 64), bcq = make_cq(d, 64);
  constexpr uint64_t kOps = kRcOps | IBV_QP_EX_WITH_ATOMIC_WRITE;
  auto [a, b] = rc_pair(d, acq.get(), acq.get(), bcq.get(), bcq.get(), kOps);
  const uint64_t v = 0x0123456789abcdefull;
  ibv_wc w =
      atomic_write(qp_ex(a), acq.get(), 800, buf.addr(kWord), buf.rkey(), v);
  uint64_t got = 0;
  memcpy(&got, buf.p + kWord, 8);
  check(w.status == IBV_WC_SUCCESS && w.opcode == IBV_WC_ATOMIC_WRITE &&
            w.wr_id == 800 && got == v,
        "i) ibv_wr_atomic_write: IBV_WC_ATOMIC_WRITE, the 8 bytes in place",
        fmt("status %d opcode %d, word %#llx", static_cast<int>(w.status),
            static_cast<int>(w.opcode), static_cast<unsigned long long>(got)));
  // Not 8-byte aligned: the responder refuses it (invalid request), the
  // word is untouched.
  w = atomic_write(qp_ex(a), acq.get(), 801, buf.addr(kWord + 4), buf.rkey(),
                   1);
  memcpy(&got, buf.p + kWord, 8);
  check(
      w.status == IBV_WC_REM_INV_REQ_ERR && got == v,
      "i) a misaligned ATOMIC_WRITE: IBV_WC_REM_INV_REQ_ERR, memory as it was",
      fmt("status %d", static_cast<int>(w.status)));
  // Through ibv_post_send there is no room for the 8 bytes: refused, as
  // rdma-core's providers refuse it.
  auto [a2, b2] = rc_pair(d, acq.get(), acq.get(), bcq.get(), bcq.get(), kOps);
  ibv_send_wr sw{};
  sw.wr_id = 802;
  sw.opcode = IBV_WR_ATOMIC_WRITE;
  sw.send_flags = IBV_SEND_SIGNALED;
  sw.wr.rdma.remote_addr = buf.addr(kWord);
  sw.wr.rdma.rkey = buf.rkey();
  ibv_send_wr* bad = nullptr;
  const int rc = ibv_post_send(a2.get(), &sw, &bad);
  check(rc == EINVAL && bad == &sw,
        "i) IBV_WR_ATOMIC_WRITE through ibv_post_send: EINVAL",
        "returned " + err_text(rc));
  // A QP created without IBV_QP_EX_WITH_ATOMIC_WRITE has no such op.
  QpSpec sp;
  sp.scq = sp.rcq = acq.get();
  sp.ops = kRcOps;
  QpPtr plain = make_qp(d, sp);
  check(qp_ex(plain)->wr_atomic_write == nullptr,
        "i) wr_atomic_write unset without IBV_QP_EX_WITH_ATOMIC_WRITE");
}

// j) A service that accepts connections and never answers (stopped,
// wedged) under a program with a fast interval timer (a sampling profiler's
// SIGPROF, here SIGALRM every millisecond without SA_RESTART): the shim's
// calls still end after their timeout. Until 2026-11-29 each EINTR
// restarted the wait, so such a program hung in ibv_get_device_list for
// ever. The child (this program re-run with --wedged-child, URNIC_SOCKET
// set to the listening socket, which is never accept()ed) times its
// ibv_get_device_list; the shim's device probe waits 5 s for a reply.
int wedged_child() {
  struct sigaction sa {};
  sa.sa_handler = [](int) {};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGALRM, &sa, nullptr);  // no SA_RESTART
  itimerval it{};
  it.it_interval.tv_usec = 1000;
  it.it_value.tv_usec = 1000;
  setitimer(ITIMER_REAL, &it, nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  int n = -1;
  ibv_device** list = ibv_get_device_list(&n);
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  it = {};
  setitimer(ITIMER_REAL, &it, nullptr);
  bool ours = false;
  for (int i = 0; list && i < n; ++i)
    ours |= strncmp(ibv_get_device_name(list[i]), "urnic", 5) == 0;
  if (list) ibv_free_device_list(list);
  printf("wedged child: ibv_get_device_list took %.1f s, urnic device %s\n", s,
         ours ? "listed" : "not listed");
  return !ours && s >= 4 && s < 20 ? 0 : 1;
}

void section_wedged_service(const char* self) {
  char dir[] = "/tmp/urnic-wedged.XXXXXX";
  if (!check(mkdtemp(dir) != nullptr, "j) mkdtemp", err_text(errno))) return;
  const std::string path = std::string(dir) + "/wedged.sock";
  const int l = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path.c_str());
  const bool listening =
      l >= 0 && bind(l, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0 &&
      listen(l, 8) == 0;
  if (check(listening, "j) a listening socket that never accepts",
            err_text(errno))) {
    const pid_t pid = fork();
    if (pid == 0) {
      setenv("URNIC_SOCKET", path.c_str(), 1);
      execl(self, self, "--wedged-child", static_cast<char*>(nullptr));
      _exit(127);
    }
    int st = 0;
    bool ended = false;
    for (int i = 0; i < 400 && !ended; ++i) {  // 40 s
      ended = waitpid(pid, &st, WNOHANG) == pid;
      if (!ended) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (!ended) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
    }
    check(ended && WIFEXITED(st) && WEXITSTATUS(st) == 0,
          "j) a service that never answers, a 1 kHz timer signal without "
          "SA_RESTART: ibv_get_device_list ends after the 5 s probe and "
          "lists no urnic device",
          ended ? fmt("child status 0x%x", st)
                : "still blocked after 40 s: killed");
  }
  if (l >= 0) close(l);
  unlink(path.c_str());
  rmdir(dir);
}

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "--wedged-child") == 0) return wedged_child();
  const char* want = argc > 1 ? argv[1] : "urnic0";
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  Dev d;
  for (int i = 0; list && i < n; ++i)
    if (strcmp(ibv_get_device_name(list[i]), want) == 0) d.dev = list[i];
  if (!check(d.dev != nullptr, fmt("device %s found", want),
             fmt("%d devices", n)))
    return 1;
  d.ctx = ibv_open_device(d.dev);
  if (!check(d.ctx != nullptr, "ibv_open_device", err_text(errno))) return 1;
  int rc = ibv_query_port(d.ctx, 1, &d.port);
  if (!check(rc == 0, "ibv_query_port of port 1", err_text(rc))) return 1;
  std::vector<ibv_gid_entry> tbl(kMaxGids);
  const ssize_t ngids = ibv_query_gid_table(d.ctx, tbl.data(), tbl.size(), 0);
  if (!check(ngids >= 1, "ibv_query_gid_table", fmt("returned %zd", ngids)))
    return 1;
  d.gids.assign(tbl.begin(), tbl.begin() + ngids);
  d.pd = ibv_alloc_pd(d.ctx);
  if (!check(d.pd != nullptr, "ibv_alloc_pd", err_text(errno))) return 1;

  run("a) queries", section_queries, d);
  run("b) ibv_qp_ex on RC", section_wr_rc, d);
  run("c) ibv_wr_* refusals", section_wr_refusals, d);
  run("d) completion channels", section_channels, d);
  run("e) async events", section_async, d);
  run("f) UD", section_ud, d);
  run("g) ibv_resize_cq", section_resize_cq, d);
  run("h) memory windows", section_mw, d);
  run("i) ATOMIC_WRITE", section_atomic_write, d);
  section_wedged_service("/proc/self/exe");

  check(ibv_dealloc_pd(d.pd) == 0, "ibv_dealloc_pd");
  check(ibv_close_device(d.ctx) == 0, "ibv_close_device");
  ibv_free_device_list(list);
  printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed ? 1 : 0;
}
