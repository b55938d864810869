// verbs_misuse: an unmodified libibverbs program that misuses the verbs API
// on one device (default urnic0) and checks that every misuse is refused the
// way the verbs contract says, and that memory registration keeps the
// program's memory intact. RC QP pairs are connected to each other on the
// same device (loopback through the device's own GID 0).
//
// It links only libibverbs; tests/integration/verbs_shim.sh runs it with
// LD_PRELOAD=liburnic-verbs.so and URNIC_SOCKET. Every check prints
// "ok - ..." or "FAIL - ..."; the exit status is 1 when any check failed.
// Every wait is bounded (5 s per completion).
//   usage: verbs_misuse [DEVICE]
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <linux/magic.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/verbs_bringup.h"

namespace {

using urnic::test::rc_connect;
using urnic::test::rc_to_init;
using urnic::test::rc_to_rtr;
using urnic::test::rc_to_rts;
using urnic::test::RcPath;

constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                        IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
constexpr auto kWcDeadline = std::chrono::seconds(5);
constexpr size_t kScratch = 64 * 1024;
constexpr size_t kGiB = size_t{1} << 30;

int g_passed = 0;
int g_failed = 0;
volatile int g_child_var = 0;  // written by the forked child only

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

struct Dev {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_gid gid{};
  uint8_t* scratch = nullptr;  // kScratch bytes, registered as scratch_mr
  ibv_mr* scratch_mr = nullptr;
};

// One RC QP with its own send and receive CQ.
struct End {
  ibv_cq* scq = nullptr;
  ibv_cq* rcq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_qp_cap cap{};  // as granted by ibv_create_qp
};
struct Pair {
  End a, b;
};

End create_end(Dev& d, ibv_pd* pd, uint32_t send_wr, uint32_t recv_wr) {
  End e;
  e.scq = ibv_create_cq(d.ctx, 256, nullptr, nullptr, 0);
  e.rcq = ibv_create_cq(d.ctx, 256, nullptr, nullptr, 0);
  if (!e.scq || !e.rcq) throw SetupError("ibv_create_cq: " + err_text(errno));
  ibv_qp_init_attr ia{};
  ia.send_cq = e.scq;
  ia.recv_cq = e.rcq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = send_wr;
  ia.cap.max_recv_wr = recv_wr;
  ia.cap.max_send_sge = 2;
  ia.cap.max_recv_sge = 2;
  e.qp = ibv_create_qp(pd, &ia);
  if (!e.qp) throw SetupError("ibv_create_qp: " + err_text(errno));
  e.cap = ia.cap;
  return e;
}

void check_modify(int rc, const char* what) {
  if (rc)
    throw SetupError(
        fmt("ibv_modify_qp to %s: %s", what, err_text(rc).c_str()));
}
RcPath path(uint32_t remote_qpn = 0, const ibv_gid& gid = {}) {
  RcPath p;
  p.dest_qpn = remote_qpn;
  p.dgid = gid;
  p.access = kAccess;
  return p;
}
void to_init(ibv_qp* qp) {
  check_modify(rc_to_init(qp, path()), "INIT");
}
void to_rtr(ibv_qp* qp, uint32_t remote_qpn, const ibv_gid& gid) {
  check_modify(rc_to_rtr(qp, path(remote_qpn, gid)), "RTR");
}
void to_rts(ibv_qp* qp) {
  check_modify(rc_to_rts(qp, path()), "RTS");
}
void connect(Dev& d, Pair& p) {
  to_init(p.a.qp);
  to_init(p.b.qp);
  to_rtr(p.a.qp, p.b.qp->qp_num, d.gid);
  to_rtr(p.b.qp, p.a.qp->qp_num, d.gid);
  to_rts(p.a.qp);
  to_rts(p.b.qp);
}

void destroy_end(End& e) {
  if (e.qp) ibv_destroy_qp(e.qp);
  if (e.scq) ibv_destroy_cq(e.scq);
  if (e.rcq) ibv_destroy_cq(e.rcq);
  e = End{};
}

// A pair of RC QPs on `pd` (default: the device's PD), connected to each
// other unless `connected` is false (then both are in RESET). Destroyed
// when it goes out of scope.
struct ScopedPair {
  Pair p;
  ScopedPair(Dev& d, bool connected = true, ibv_pd* pd = nullptr,
             uint32_t send_wr = 64, uint32_t recv_wr = 64) {
    try {
      p.a = create_end(d, pd ? pd : d.pd, send_wr, recv_wr);
      p.b = create_end(d, pd ? pd : d.pd, send_wr, recv_wr);
      if (connected) connect(d, p);
    } catch (...) {
      destroy_end(p.a);
      destroy_end(p.b);
      throw;
    }
  }
  ~ScopedPair() {
    destroy_end(p.a);
    destroy_end(p.b);
  }
  ScopedPair(const ScopedPair&) = delete;
  ScopedPair& operator=(const ScopedPair&) = delete;
};

struct ScopedMr {
  ibv_mr* mr = nullptr;
  explicit ScopedMr(ibv_mr* m) : mr(m) {}
  ~ScopedMr() {
    if (mr) ibv_dereg_mr(mr);
  }
  ScopedMr(const ScopedMr&) = delete;
  ScopedMr& operator=(const ScopedMr&) = delete;
};

ibv_mr* must_reg(ibv_pd* pd, void* addr, size_t len, int access = kAccess) {
  ibv_mr* mr = ibv_reg_mr(pd, addr, len, access);
  if (!mr)
    throw SetupError(
        fmt("ibv_reg_mr(%p, %zu): %s", addr, len, err_text(errno).c_str()));
  return mr;
}

// Waits (bounded) for one completion on `cq`.
bool wait_wc(ibv_cq* cq, ibv_wc* wc, std::string* why) {
  const auto end = std::chrono::steady_clock::now() + kWcDeadline;
  for (;;) {
    int n = ibv_poll_cq(cq, 1, wc);
    if (n < 0) {
      *why = fmt("ibv_poll_cq returned %d", n);
      return false;
    }
    if (n == 1) return true;
    if (std::chrono::steady_clock::now() > end) {
      *why = "no completion within 5 s";
      return false;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// True when no completion arrives on `cq` for `ms` milliseconds.
bool quiet_for(ibv_cq* cq, int ms, std::string* why) {
  const auto end =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end) {
    ibv_wc wc{};
    int n = ibv_poll_cq(cq, 1, &wc);
    if (n != 0) {
      *why = n < 0 ? fmt("ibv_poll_cq returned %d", n)
                   : fmt("unexpected completion wr_id %llu status %s",
                         static_cast<unsigned long long>(wc.wr_id),
                         ibv_wc_status_str(wc.status));
      return false;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

ibv_send_wr rdma_wr(ibv_wr_opcode op, ibv_sge* sge, uint64_t raddr,
                    uint32_t rkey, uint64_t wr_id) {
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.opcode = op;
  wr.sg_list = sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  return wr;
}

// What one signaled WR came to.
struct Outcome {
  int post_rc = 0;
  bool completed = false;
  ibv_wc wc{};
  std::string why;
  std::string text() const {
    if (post_rc) return "ibv_post_send returned " + err_text(post_rc);
    if (!completed) return why;
    return fmt("wc wr_id %llu status %s (%d) opcode %d",
               static_cast<unsigned long long>(wc.wr_id),
               ibv_wc_status_str(wc.status), wc.status, wc.opcode);
  }
  bool is(ibv_wc_status s, uint64_t wr_id) const {
    return post_rc == 0 && completed && wc.status == s && wc.wr_id == wr_id;
  }
};

// Posts one signaled RDMA op on `e` and waits for its completion.
Outcome rdma(End& e, ibv_wr_opcode op, const void* laddr, uint32_t len,
             uint32_t lkey, uint64_t raddr, uint32_t rkey, uint64_t wr_id) {
  Outcome o;
  ibv_sge sge{reinterpret_cast<uint64_t>(laddr), len, lkey};
  ibv_send_wr wr = rdma_wr(op, &sge, raddr, rkey, wr_id);
  ibv_send_wr* bad = nullptr;
  o.post_rc = ibv_post_send(e.qp, &wr, &bad);
  if (o.post_rc) return o;
  o.completed = wait_wc(e.scq, &o.wc, &o.why);
  return o;
}

uint64_t addr_of(const void* p) {
  return reinterpret_cast<uint64_t>(p);
}

// The data check used for every MR: an RDMA WRITE from (local, lkey) into
// (remote, rkey) must land in the program's memory at `remote`; then the
// program writes `remote` itself and an RDMA READ of it into `local` must
// see exactly that. Returns "" or what went wrong.
std::string write_read(End& e, uint8_t* local, uint32_t lkey, uint8_t* remote,
                       uint32_t rkey, uint32_t len, uint32_t seed) {
  fill(local, len, seed);
  Outcome w = rdma(e, IBV_WR_RDMA_WRITE, local, len, lkey, addr_of(remote),
                   rkey, 1000 + seed);
  if (!w.is(IBV_WC_SUCCESS, 1000 + seed)) return "RDMA WRITE: " + w.text();
  if (!same_as_pattern(remote, len, seed))
    return "RDMA WRITE completed but the program does not see the data";
  fill(remote, len, seed + 1);
  memset(local, 0, len);
  Outcome r = rdma(e, IBV_WR_RDMA_READ, local, len, lkey, addr_of(remote), rkey,
                   2000 + seed);
  if (!r.is(IBV_WC_SUCCESS, 2000 + seed)) return "RDMA READ: " + r.text();
  if (!same_as_pattern(local, len, seed + 1))
    return "RDMA READ completed but did not return the program's data";
  return "";
}

uint32_t g_seed = 1;
// write_read with the scratch MR as the local side.
std::string write_read_scratch(Dev& d, End& e, uint8_t* remote, uint32_t rkey,
                               uint32_t len) {
  g_seed += 2;
  return write_read(e, d.scratch, d.scratch_mr->lkey, remote, rkey, len,
                    g_seed);
}

ibv_qp_state qp_state(ibv_qp* qp) {
  ibv_qp_attr a{};
  ibv_qp_init_attr ia{};
  if (ibv_query_qp(qp, &a, IBV_QP_STATE, &ia)) return IBV_QPS_UNKNOWN;
  return a.qp_state;
}

// --- a) posting to a QP in the wrong state ---------------------------------
void section_states(Dev& d) {
  ScopedPair sp(d, /*connected=*/false);
  End& a = sp.p.a;
  uint8_t* target = d.scratch + kScratch / 2;
  ibv_sge sge{addr_of(d.scratch), 64, d.scratch_mr->lkey};
  ibv_send_wr wr =
      rdma_wr(IBV_WR_RDMA_WRITE, &sge, addr_of(target), d.scratch_mr->rkey, 11);
  ibv_send_wr* bad = nullptr;
  int rc = ibv_post_send(a.qp, &wr, &bad);
  check(rc == EINVAL, "a) ibv_post_send on a RESET QP returns EINVAL",
        "returned " + err_text(rc));
  check(rc == 0 || bad == &wr, "a) ... and *bad_wr is that WR",
        fmt("bad_wr %p, wr %p", static_cast<void*>(bad),
            static_cast<void*>(&wr)));

  ibv_recv_wr rwr{};
  rwr.wr_id = 12;
  rwr.sg_list = &sge;
  rwr.num_sge = 1;
  ibv_recv_wr* rbad = nullptr;
  rc = ibv_post_recv(a.qp, &rwr, &rbad);
  check(rc == EINVAL, "a) ibv_post_recv on a RESET QP returns EINVAL",
        "returned " + err_text(rc));

  to_init(a.qp);
  bad = nullptr;
  wr.wr_id = 13;
  rc = ibv_post_send(a.qp, &wr, &bad);
  check(rc == EINVAL, "a) ibv_post_send on an INIT QP returns EINVAL",
        "returned " + err_text(rc));

  // The refused WRs must not run once the QP can send.
  to_init(sp.p.b.qp);
  to_rtr(a.qp, sp.p.b.qp->qp_num, d.gid);
  to_rtr(sp.p.b.qp, a.qp->qp_num, d.gid);
  to_rts(a.qp);
  to_rts(sp.p.b.qp);
  std::string why;
  check(quiet_for(a.scq, 300, &why) && quiet_for(a.rcq, 1, &why),
        "a) refused WRs never execute once the QP reaches RTS", why);
  why = write_read_scratch(d, a, target, d.scratch_mr->rkey, 4096);
  check(why.empty(), "a) the same QP then does WRITE/READ normally", why);
}

// A QP moved to RESET (or destroyed) takes its unpolled completions with
// it, as mlx5 cleans its CQs: a QP brought back from ERR does not poll its
// old flushes first. Another QP's completions on the same CQ stay.
void section_reset_cleans(Dev& d) {
  ScopedPair sp(d);
  End& a = sp.p.a;
  ibv_qp_init_attr ia{};
  ia.send_cq = a.scq;
  ia.recv_cq = a.rcq;  // shares a's receive CQ
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 4;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  ibv_qp* other = ibv_create_qp(d.pd, &ia);
  if (!other) throw SetupError("ibv_create_qp: " + err_text(errno));
  to_init(other);
  ibv_sge sge{addr_of(d.scratch), 64, d.scratch_mr->lkey};
  auto post_recv = [&](ibv_qp* qp, uint64_t id) {
    ibv_recv_wr r{};
    r.wr_id = id;
    r.sg_list = &sge;
    r.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    return ibv_post_recv(qp, &r, &bad);
  };
  int rc = post_recv(a.qp, 1) | post_recv(a.qp, 2) | post_recv(other, 3) |
           post_recv(a.qp, 4);
  ibv_qp_attr err{};
  err.qp_state = IBV_QPS_ERR;
  rc |= ibv_modify_qp(a.qp, &err, IBV_QP_STATE) |
        ibv_modify_qp(other, &err, IBV_QP_STATE);
  if (rc) throw SetupError("post_recv/modify to ERR: " + err_text(rc));
  // The four flushes (a's three, other's one) arrive, unpolled.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ibv_qp_attr reset{};
  reset.qp_state = IBV_QPS_RESET;
  rc = ibv_modify_qp(a.qp, &reset, IBV_QP_STATE);
  ibv_wc wc[8];
  const int n = ibv_poll_cq(a.rcq, 8, wc);
  check(rc == 0 && n == 1 && wc[0].wr_id == 3 &&
            wc[0].qp_num == other->qp_num &&
            wc[0].status == IBV_WC_WR_FLUSH_ERR,
        "a) ibv_modify_qp to RESET drops that QP's unpolled completions; "
        "another QP's flush on the same CQ stays",
        fmt("rc %d, %d polled%s", rc, n,
            n > 0 ? fmt(", first wr_id %" PRIu64 " qp %#x status %d",
                        wc[0].wr_id, wc[0].qp_num, wc[0].status)
                        .c_str()
                  : ""));
  // Back to RTS: the QP works, and polls nothing old.
  to_init(a.qp);
  to_rtr(a.qp, sp.p.b.qp->qp_num, d.gid);
  to_rts(a.qp);
  ibv_qp_attr rb{};
  rb.qp_state = IBV_QPS_RESET;
  rc = ibv_modify_qp(sp.p.b.qp, &rb, IBV_QP_STATE);  // b restarts too
  if (rc) throw SetupError("b to RESET: " + err_text(rc));
  to_init(sp.p.b.qp);
  to_rtr(sp.p.b.qp, a.qp->qp_num, d.gid);
  to_rts(sp.p.b.qp);
  std::string why = write_read_scratch(d, a, d.scratch + kScratch / 2,
                                       d.scratch_mr->rkey, 4096);
  check(why.empty() && quiet_for(a.rcq, 1, &why),
        "a) ... brought back to RTS it does WRITE/READ, nothing old polled",
        why);
  // Destroying a QP drops its unpolled completions likewise.
  rc = ibv_modify_qp(other, &reset, IBV_QP_STATE);
  to_init(other);
  rc |= post_recv(other, 6) | post_recv(a.qp, 5);
  rc |= ibv_modify_qp(other, &err, IBV_QP_STATE) |
        ibv_modify_qp(a.qp, &err, IBV_QP_STATE);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const int left = rc == 0 ? ibv_destroy_qp(other) : -1;
  ibv_wc w2[4];
  const int m = ibv_poll_cq(a.rcq, 4, w2);
  check(left == 0 && m == 1 && w2[0].wr_id == 5,
        "a) ibv_destroy_qp drops that QP's unpolled completions, the others "
        "stay",
        fmt("rc %d destroy %d, %d polled", rc, left, m));
}

// --- b) an lkey of another PD; the QP in error flushes --------------------
void section_other_pd(Dev& d) {
  ibv_pd* pd2 = ibv_alloc_pd(d.ctx);
  if (!pd2) throw SetupError("ibv_alloc_pd: " + err_text(errno));
  std::vector<uint8_t> buf2(4096);
  fill(buf2.data(), buf2.size(), 77);
  {
    ScopedMr m2(must_reg(pd2, buf2.data(), buf2.size()));
    ScopedPair sp(d);
    End& a = sp.p.a;
    uint8_t* target = d.scratch + kScratch / 2;
    fill(target, 256, 5);
    Outcome o = rdma(a, IBV_WR_RDMA_WRITE, buf2.data(), 256, m2.mr->lkey,
                     addr_of(target), d.scratch_mr->rkey, 21);
    check(o.post_rc == 0, "b) WRITE with another PD's lkey: post returns 0",
          o.text());
    check(o.is(IBV_WC_LOC_PROT_ERR, 21),
          "b) WRITE with another PD's lkey completes IBV_WC_LOC_PROT_ERR",
          o.text());
    check(same_as_pattern(target, 256, 5),
          "b) ... and the other PD's data was not written to the target");
    ibv_qp_state st = qp_state(a.qp);
    check(st == IBV_QPS_ERR, "b) ... and the QP is in the error state",
          fmt("ibv_query_qp state %d", st));

    Outcome f = rdma(a, IBV_WR_RDMA_WRITE, d.scratch, 64, d.scratch_mr->lkey,
                     addr_of(target), d.scratch_mr->rkey, 22);
    check(f.is(IBV_WC_WR_FLUSH_ERR, 22),
          "b) a valid WRITE posted afterwards completes IBV_WC_WR_FLUSH_ERR",
          f.text());
    check(same_as_pattern(target, 256, 5),
          "b) ... and the flushed WRITE did not write the target");

    ibv_sge sge{addr_of(d.scratch), 64, d.scratch_mr->lkey};
    ibv_recv_wr rwr{};
    rwr.wr_id = 23;
    rwr.sg_list = &sge;
    rwr.num_sge = 1;
    ibv_recv_wr* rbad = nullptr;
    int rc = ibv_post_recv(a.qp, &rwr, &rbad);
    ibv_wc wc{};
    std::string why;
    bool got = rc == 0 && wait_wc(a.rcq, &wc, &why);
    check(got && wc.wr_id == 23 && wc.status == IBV_WC_WR_FLUSH_ERR,
          "b) a receive posted afterwards completes IBV_WC_WR_FLUSH_ERR",
          rc     ? "ibv_post_recv returned " + err_text(rc)
          : !got ? why
                 : fmt("wr_id %llu status %s",
                       static_cast<unsigned long long>(wc.wr_id),
                       ibv_wc_status_str(wc.status)));
  }
  int rc = ibv_dealloc_pd(pd2);
  check(rc == 0, "b) the second PD deallocates once its MR is gone",
        err_text(rc));
}

// --- c) local and remote bounds -------------------------------------------
void section_bounds(Dev& d) {
  // 5000 bytes registered at an unaligned address inside a 6000-byte
  // buffer: the bounds are the MR's bytes, not its pages.
  std::vector<uint8_t> lbuf(6000);
  uint8_t* l = lbuf.data() + 3;
  ScopedMr lm(must_reg(d.pd, l, 5000));
  {
    ScopedPair sp(d);
    Outcome o = rdma(sp.p.a, IBV_WR_RDMA_WRITE, l + 4990, 20, lm.mr->lkey,
                     addr_of(d.scratch + kScratch / 2), d.scratch_mr->rkey, 31);
    check(o.is(IBV_WC_LOC_PROT_ERR, 31),
          "c) a WRITE whose SGE runs 10 bytes past its MR's end completes "
          "IBV_WC_LOC_PROT_ERR",
          o.text());
  }
  {
    ScopedPair sp(d);
    memset(d.scratch, 0, 4096);
    Outcome o = rdma(sp.p.a, IBV_WR_RDMA_READ, l + 4990, 20, lm.mr->lkey,
                     addr_of(d.scratch), d.scratch_mr->rkey, 32);
    check(o.is(IBV_WC_LOC_PROT_ERR, 32),
          "c) a READ into an SGE that runs past its MR's end completes "
          "IBV_WC_LOC_PROT_ERR",
          o.text());
  }

  std::vector<uint8_t> rbuf(6000);
  uint8_t* r = rbuf.data() + 5;
  fill(rbuf.data(), rbuf.size(), 33);
  ScopedMr rm(must_reg(d.pd, r, 5000));
  fill(d.scratch, 4096, 34);
  {
    ScopedPair sp(d);
    Outcome o = rdma(sp.p.a, IBV_WR_RDMA_WRITE, d.scratch, 20,
                     d.scratch_mr->lkey, addr_of(r + 4990), rm.mr->rkey, 35);
    check(o.is(IBV_WC_REM_ACCESS_ERR, 35),
          "c) an RDMA WRITE running past the end of the remote MR completes "
          "IBV_WC_REM_ACCESS_ERR at the requester",
          o.text());
  }
  {
    ScopedPair sp(d);
    Outcome o = rdma(sp.p.a, IBV_WR_RDMA_WRITE, d.scratch, 32,
                     d.scratch_mr->lkey, addr_of(r) - 16, rm.mr->rkey, 36);
    check(o.is(IBV_WC_REM_ACCESS_ERR, 36),
          "c) an RDMA WRITE starting before the remote MR completes "
          "IBV_WC_REM_ACCESS_ERR",
          o.text());
  }
  {
    ScopedPair sp(d);
    Outcome o =
        rdma(sp.p.a, IBV_WR_RDMA_WRITE, d.scratch, 64, d.scratch_mr->lkey,
             addr_of(r) + 64 * 1024, rm.mr->rkey, 37);
    check(o.is(IBV_WC_REM_ACCESS_ERR, 37),
          "c) an RDMA WRITE far outside the remote MR completes "
          "IBV_WC_REM_ACCESS_ERR",
          o.text());
  }
  check(same_as_pattern(rbuf.data(), rbuf.size(), 33),
        "c) none of the refused WRITEs changed a byte of the buffer around "
        "the remote MR");
  {
    ScopedPair sp(d);
    Outcome o = rdma(sp.p.a, IBV_WR_RDMA_READ, d.scratch, 64,
                     d.scratch_mr->lkey, addr_of(r + 4990), rm.mr->rkey, 38);
    check(o.is(IBV_WC_REM_ACCESS_ERR, 38),
          "c) an RDMA READ past the end of the remote MR completes "
          "IBV_WC_REM_ACCESS_ERR",
          o.text());
  }
  {
    // Access rights: a remote MR without REMOTE_WRITE refuses WRITEs.
    std::vector<uint8_t> ro(4096);
    fill(ro.data(), ro.size(), 39);
    ScopedMr rom(must_reg(d.pd, ro.data(), ro.size(),
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ));
    ScopedPair sp(d);
    Outcome o = rdma(sp.p.a, IBV_WR_RDMA_WRITE, d.scratch, 64,
                     d.scratch_mr->lkey, addr_of(ro.data()), rom.mr->rkey, 40);
    check(o.is(IBV_WC_REM_ACCESS_ERR, 40) &&
              same_as_pattern(ro.data(), ro.size(), 39),
          "c) an RDMA WRITE to an MR without REMOTE_WRITE completes "
          "IBV_WC_REM_ACCESS_ERR and writes nothing",
          o.text());
  }
}

// --- d) more WRs than the queues hold --------------------------------------
void section_overflow(Dev& d) {
  // Ask for sizes that are not powers of two: what ibv_create_qp reports
  // back is the contract, whatever the rings really hold.
  ScopedPair sp(d, /*connected=*/false, nullptr, 5, 5);
  End& a = sp.p.a;
  End& b = sp.p.b;
  check(a.cap.max_send_wr >= 5 && a.cap.max_recv_wr >= 5,
        "d) ibv_create_qp reports at least the queue sizes asked for",
        fmt("max_send_wr %u max_recv_wr %u", a.cap.max_send_wr,
            a.cap.max_recv_wr));

  // Receives: b in INIT takes receives but nothing consumes them.
  to_init(a.qp);
  to_init(b.qp);
  const uint32_t rcap = b.cap.max_recv_wr;
  std::vector<ibv_sge> rsge(rcap + 1);
  std::vector<ibv_recv_wr> rwr(rcap + 1);
  for (uint32_t i = 0; i <= rcap; ++i) {
    rsge[i] = {addr_of(d.scratch + i * 64), 64, d.scratch_mr->lkey};
    rwr[i].wr_id = 100 + i;
    rwr[i].sg_list = &rsge[i];
    rwr[i].num_sge = 1;
    rwr[i].next = i < rcap ? &rwr[i + 1] : nullptr;
  }
  ibv_recv_wr* rbad = nullptr;
  int rc = ibv_post_recv(b.qp, rwr.data(), &rbad);
  check(rc == ENOMEM,
        fmt("d) posting %u receives to a queue of max_recv_wr %u returns "
            "ENOMEM",
            rcap + 1, rcap),
        "returned " + err_text(rc));
  check(rbad == &rwr[rcap],
        "d) ... and *bad_wr is the receive that did not fit",
        fmt("bad_wr is entry %td", rbad ? rbad - rwr.data() : -1));

  to_rtr(a.qp, b.qp->qp_num, d.gid);
  to_rtr(b.qp, a.qp->qp_num, d.gid);
  to_rts(a.qp);
  to_rts(b.qp);
  // The receives that fit are all there: rcap SENDs each complete one.
  bool all = true;
  std::string why;
  for (uint32_t i = 0; i < rcap && all; ++i) {
    Outcome o = rdma(a, IBV_WR_SEND, d.scratch + kScratch / 2, 16,
                     d.scratch_mr->lkey, 0, 0, 200 + i);
    ibv_wc wc{};
    if (!o.is(IBV_WC_SUCCESS, 200 + i)) {
      all = false;
      why = fmt("SEND %u: ", i) + o.text();
    } else if (!wait_wc(b.rcq, &wc, &why)) {
      all = false;
      why = fmt("receive %u: ", i) + why;
    } else if (wc.status != IBV_WC_SUCCESS || wc.wr_id != 100 + i) {
      all = false;
      why = fmt("receive %u: wr_id %llu status %s", i,
                static_cast<unsigned long long>(wc.wr_id),
                ibv_wc_status_str(wc.status));
    }
  }
  check(all,
        fmt("d) the %u receives before bad_wr were posted, in order", rcap),
        why);

  // Sends: b has no receive left, so a SEND is RNR-retried forever
  // (rnr_retry 7) and nothing behind it can complete: the queue stays full.
  const uint32_t scap = a.cap.max_send_wr;
  std::vector<ibv_sge> ssge(scap + 2);
  std::vector<ibv_send_wr> swr(scap + 2);
  for (uint32_t i = 0; i < scap + 2; ++i) {
    ssge[i] = {addr_of(d.scratch + kScratch / 2), 16, d.scratch_mr->lkey};
    swr[i].wr_id = 300 + i;
    swr[i].opcode = IBV_WR_SEND;
    swr[i].sg_list = &ssge[i];
    swr[i].num_sge = 1;
    swr[i].send_flags = IBV_SEND_SIGNALED;
    swr[i].next = i < scap ? &swr[i + 1] : nullptr;
  }
  ibv_send_wr* sbad = nullptr;
  rc = ibv_post_send(a.qp, swr.data(), &sbad);
  check(rc == ENOMEM,
        fmt("d) posting %u sends to a queue of max_send_wr %u returns ENOMEM",
            scap + 1, scap),
        "returned " + err_text(rc));
  check(sbad == &swr[scap], "d) ... and *bad_wr is the send that did not fit",
        fmt("bad_wr is entry %td", sbad ? sbad - swr.data() : -1));
  sbad = nullptr;
  rc = ibv_post_send(a.qp, &swr[scap + 1], &sbad);
  check(rc == ENOMEM && sbad == &swr[scap + 1],
        "d) one more send while the queue is full: ENOMEM, *bad_wr is it",
        "returned " + err_text(rc));
}

// --- e) memory registration -------------------------------------------------
void sub_unaligned_malloc(Dev& d, End& e) {
  auto* p = static_cast<uint8_t*>(malloc(10000));
  if (!p) throw SetupError("malloc");
  fill(p, 10000, 51);
  uint8_t* u = p + 1;  // registered: p[1] .. p[9998]
  ibv_mr* mr = ibv_reg_mr(d.pd, u, 9998, kAccess);
  if (check(mr != nullptr, "e) ibv_reg_mr of malloc(10000)+1, 9998 bytes",
            err_text(errno))) {
    check(same_as_pattern(p, 10000, 51),
          "e) ... the buffer and the bytes around it keep their contents");
    std::string why = write_read_scratch(d, e, u, mr->rkey, 9998);
    check(why.empty(),
          "e) ... RDMA WRITE into it is visible to the program "
          "and READ sees the program's writes",
          why);
    why = write_read(e, u, mr->lkey, d.scratch, d.scratch_mr->rkey, 9998, 52);
    check(why.empty(), "e) ... it works as the local side (lkey) too", why);
    p[0] = 0xa5;
    p[9999] = 0x5a;
    int rc = ibv_dereg_mr(mr);
    check(rc == 0 && p[0] == 0xa5 && p[9999] == 0x5a,
          "e) ... ibv_dereg_mr returns 0 and the program's memory stays",
          err_text(rc));
  }
  // The heap still works around it.
  std::vector<void*> blocks;
  for (int i = 0; i < 100; ++i) blocks.push_back(malloc(100 + i * 37));
  for (void* b : blocks) free(b);
  free(p);
}

void sub_overlapping(Dev& d, End& e) {
  auto* buf = static_cast<uint8_t*>(aligned_alloc(4096, 16384));
  if (!buf) throw SetupError("aligned_alloc");
  ibv_mr* m1 = ibv_reg_mr(d.pd, buf, 8192, kAccess);
  int e1 = errno;
  ibv_mr* m2 = ibv_reg_mr(d.pd, buf + 4096, 8192, kAccess);
  int e2 = errno;
  if (check(m1 && m2,
            "e) two overlapping MRs (buf..+8192 and buf+4096..+12288)",
            fmt("first %s, second %s", m1 ? "ok" : err_text(e1).c_str(),
                m2 ? "ok" : err_text(e2).c_str()))) {
    std::string why = write_read_scratch(d, e, buf, m1->rkey, 8192);
    check(why.empty(), "e) ... the first works over its whole range", why);
    why = write_read_scratch(d, e, buf + 4096, m2->rkey, 8192);
    check(why.empty(), "e) ... the second works over its whole range", why);
    // Written through one, read through the other.
    fill(d.scratch, 4096, 53);
    Outcome w = rdma(e, IBV_WR_RDMA_WRITE, d.scratch, 4096, d.scratch_mr->lkey,
                     addr_of(buf + 4096), m1->rkey, 54);
    memset(d.scratch + 8192, 0, 4096);
    Outcome r = rdma(e, IBV_WR_RDMA_READ, d.scratch + 8192, 4096,
                     d.scratch_mr->lkey, addr_of(buf + 4096), m2->rkey, 55);
    check(w.is(IBV_WC_SUCCESS, 54) && r.is(IBV_WC_SUCCESS, 55) &&
              same_as_pattern(d.scratch + 8192, 4096, 53),
          "e) ... the overlap written through the first reads back through "
          "the second",
          w.text() + "; " + r.text());
    int rc = ibv_dereg_mr(m1);
    m1 = nullptr;
    why = write_read_scratch(d, e, buf + 4096, m2->rkey, 8192);
    check(rc == 0 && why.empty(),
          "e) ... after deregistering the first, the second still works",
          rc ? "dereg: " + err_text(rc) : why);
  }
  if (m1) ibv_dereg_mr(m1);
  if (m2) ibv_dereg_mr(m2);
  free(buf);
}

void sub_twice(Dev& d, End& e) {
  auto* buf = static_cast<uint8_t*>(aligned_alloc(4096, 8192));
  if (!buf) throw SetupError("aligned_alloc");
  ibv_mr* m1 = ibv_reg_mr(d.pd, buf, 8192, kAccess);
  ibv_mr* m2 = ibv_reg_mr(d.pd, buf, 8192, kAccess);
  if (check(m1 && m2, "e) the same buffer registered twice", err_text(errno))) {
    check(m1->lkey != m2->lkey && m1->rkey != m2->rkey,
          "e) ... the two registrations have different keys",
          fmt("lkeys %#x %#x rkeys %#x %#x", m1->lkey, m2->lkey, m1->rkey,
              m2->rkey));
    std::string why = write_read_scratch(d, e, buf, m1->rkey, 8192);
    check(why.empty(), "e) ... the first rkey works", why);
    why = write_read_scratch(d, e, buf, m2->rkey, 8192);
    check(why.empty(), "e) ... the second rkey works", why);
    why = write_read(e, buf, m2->lkey, d.scratch, d.scratch_mr->rkey, 8192, 56);
    check(why.empty(), "e) ... the second lkey works", why);
    int rc = ibv_dereg_mr(m1);
    m1 = nullptr;
    why = write_read_scratch(d, e, buf, m2->rkey, 8192);
    check(rc == 0 && why.empty(),
          "e) ... after deregistering one, the other still works",
          rc ? "dereg: " + err_text(rc) : why);
  }
  if (m1) ibv_dereg_mr(m1);
  if (m2) ibv_dereg_mr(m2);
  free(buf);
}

void sub_rereg(Dev& d) {
  auto* buf = static_cast<uint8_t*>(aligned_alloc(4096, 8192));
  if (!buf) throw SetupError("aligned_alloc");
  ibv_mr* m = must_reg(d.pd, buf, 8192);
  const uint32_t old_rkey = m->rkey;
  int rc = ibv_dereg_mr(m);
  check(rc == 0, "e) ibv_dereg_mr", err_text(rc));
  ibv_mr* m2 = ibv_reg_mr(d.pd, buf, 8192, kAccess);
  if (check(m2 != nullptr, "e) the same buffer registered again after dereg",
            err_text(errno))) {
    {
      ScopedPair sp(d);
      std::string why = write_read_scratch(d, sp.p.a, buf, m2->rkey, 8192);
      check(why.empty(), "e) ... the new rkey works", why);
    }
    ScopedPair sp(d);
    fill(buf, 8192, 57);
    fill(d.scratch, 64, 58);
    Outcome o = rdma(sp.p.a, IBV_WR_RDMA_WRITE, d.scratch, 64,
                     d.scratch_mr->lkey, addr_of(buf), old_rkey, 59);
    check(o.is(IBV_WC_REM_ACCESS_ERR, 59) && same_as_pattern(buf, 8192, 57),
          "e) ... a WRITE with the deregistered MR's rkey completes "
          "IBV_WC_REM_ACCESS_ERR and writes nothing",
          o.text() + fmt(" (old rkey %#x, new rkey %#x)", old_rkey, m2->rkey));
    ibv_dereg_mr(m2);
  }
  free(buf);
}

// ibv_rereg_mr: new access, new translation, input errors (the MR unchanged).
void sub_rereg_mr(Dev& d) {
  auto* a = static_cast<uint8_t*>(aligned_alloc(4096, 8192));
  auto* b = static_cast<uint8_t*>(aligned_alloc(4096, 8192));
  if (!a || !b) throw SetupError("aligned_alloc");
  ibv_mr* m = must_reg(d.pd, a, 8192);
  const uint32_t rkey0 = m->rkey;

  int rc = ibv_rereg_mr(m, 1 << 7, nullptr, nullptr, 0, 0);
  const int e1 = errno;
  const int rc2 =
      ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_PD, nullptr, nullptr, 0, 0);
  const int e2 = errno;
  const int rc3 = ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr,
                               nullptr, 8192, 0);
  check(rc == IBV_REREG_MR_ERR_INPUT && e1 == EINVAL &&
            rc2 == IBV_REREG_MR_ERR_INPUT && e2 == EINVAL &&
            rc3 == IBV_REREG_MR_ERR_INPUT && m->rkey == rkey0,
        "e) ibv_rereg_mr with an unknown flag, CHANGE_PD without a PD, "
        "CHANGE_TRANSLATION without an address: IBV_REREG_MR_ERR_INPUT, "
        "EINVAL, the MR unchanged",
        fmt("%d/%d %d/%d %d", rc, e1, rc2, e2, rc3));
  {
    ScopedPair sp(d);
    std::string why = write_read_scratch(d, sp.p.a, a, m->rkey, 8192);
    check(why.empty(), "e) ... and it still works", why);
  }

  // Remote READ only: a WRITE through the same rkey is refused.
  rc = ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  check(rc == 0 && m->rkey == rkey0,
        "e) ibv_rereg_mr CHANGE_ACCESS to remote read only, the keys kept",
        fmt("rc %d errno %s rkey %#x -> %#x", rc, err_text(errno).c_str(),
            rkey0, m->rkey));
  {
    ScopedPair sp(d);
    fill(a, 8192, 71);
    fill(d.scratch, 64, 72);
    Outcome o = rdma(sp.p.a, IBV_WR_RDMA_WRITE, d.scratch, 64,
                     d.scratch_mr->lkey, addr_of(a), m->rkey, 73);
    check(o.is(IBV_WC_REM_ACCESS_ERR, 73) && same_as_pattern(a, 8192, 71),
          "e) ... a remote WRITE to it completes IBV_WC_REM_ACCESS_ERR and "
          "writes nothing",
          o.text());
  }
  {
    ScopedPair sp(d);
    Outcome o = rdma(sp.p.a, IBV_WR_RDMA_READ, d.scratch, 64,
                     d.scratch_mr->lkey, addr_of(a), m->rkey, 74);
    check(o.is(IBV_WC_SUCCESS, 74) && same_as_pattern(d.scratch, 64, 71),
          "e) ... a remote READ of it works", o.text());
  }

  // New translation (and write access back): b is the MR now, a is not.
  const uint32_t rkey1 = m->rkey;
  rc = ibv_rereg_mr(
      m, IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS, nullptr,
      b, 4096, kAccess);
  check(rc == 0 && m->addr == b && m->length == 4096,
        "e) ibv_rereg_mr CHANGE_TRANSLATION to another buffer: addr and "
        "length updated",
        fmt("rc %d errno %s addr %p length %zu", rc, err_text(errno).c_str(),
            m->addr, m->length));
  {
    ScopedPair sp(d);
    std::string why = write_read_scratch(d, sp.p.a, b, m->rkey, 4096);
    check(why.empty(), "e) ... WRITE and READ through its rkey reach b", why);
  }
  {
    ScopedPair sp(d);
    fill(a, 8192, 75);
    Outcome o = rdma(sp.p.a, IBV_WR_RDMA_WRITE, d.scratch, 64,
                     d.scratch_mr->lkey, addr_of(a), rkey1, 76);
    check(rkey1 == m->rkey && o.is(IBV_WC_REM_ACCESS_ERR, 76) &&
              same_as_pattern(a, 8192, 75),
          "e) ... the keys stay (as on rxe and mlx5); a WRITE to a, outside "
          "the MR now, is refused and a is untouched",
          o.text() + fmt(" (rkey %#x -> %#x)", rkey1, m->rkey));
  }
  check(ibv_dereg_mr(m) == 0, "e) ibv_dereg_mr of the re-registered MR");
  free(a);
  free(b);
}

void sub_fork(Dev& d, End& e) {
  auto* buf = static_cast<uint8_t*>(aligned_alloc(4096, 8192));
  if (!buf) throw SetupError("aligned_alloc");
  fill(buf, 8192, 60);
  ScopedMr m(must_reg(d.pd, buf, 8192));
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    // fork() promises copy-on-write: the child scribbles over the
    // registered buffer (and mallocs, touching heap pages that may share
    // pages with registrations); none of it may reach the parent.
    g_child_var = 42;
    const bool saw_parent_data = same_as_pattern(buf, 8192, 60);
    std::memset(buf, 0xee, 8192);
    void* junk = malloc(100000);
    if (junk) std::memset(junk, 0xdd, 100000);
    free(junk);
    // The parent's queues are not the child's (nor even mapped here):
    // polling and posting fail with EIO instead of touching them.
    ibv_wc wc;
    const int polled = ibv_poll_cq(e.scq, 1, &wc);
    const int poll_err = errno;
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    const int posted = ibv_post_send(e.qp, &wr, &bad);
    _exit(g_child_var == 42 && saw_parent_data && polled == -1 &&
                  poll_err == EIO && posted == EIO
              ? 0
              : 1);
  }
  int status = 0;
  bool reaped = pid > 0 && waitpid(pid, &status, 0) == pid;
  check(reaped && WIFEXITED(status) && WEXITSTATUS(status) == 0,
        "e) fork() after ibv_reg_mr: the child runs, sees the MR's data, "
        "gets EIO from ibv_poll_cq and ibv_post_send, and exits 0",
        fmt("pid %d status %#x", pid, status));
  check(g_child_var == 0 && same_as_pattern(buf, 8192, 60),
        "e) ... the parent's memory is its own (the child's writes to a "
        "variable and over the registered buffer are not seen)");
  std::string why = write_read_scratch(d, e, buf, m.mr->rkey, 8192);
  check(why.empty(),
        "e) ... the parent still does RDMA WRITE/READ on the MR correctly",
        why);
}

// ibv_fork_init (UCX calls it by default) changes nothing for urnic memory:
// a child still gets the registered pages (copies), also once they are
// deregistered and the heap reuses them (it used to MADV_DONTFORK them for
// good, and such a child died on its heap).
void sub_fork_init(Dev& d, End& e) {
  const int rc = ibv_fork_init();
  const ibv_fork_status st = ibv_is_fork_initialized();
  check(rc == 0 && (st == IBV_FORK_UNNEEDED || st == IBV_FORK_ENABLED),
        "e) ibv_fork_init returns 0; ibv_is_fork_initialized says UNNEEDED "
        "(or ENABLED, for another provider's devices)",
        fmt("rc %d status %d", rc, st));
  auto* buf = static_cast<uint8_t*>(aligned_alloc(4096, 8192));
  if (!buf) throw SetupError("aligned_alloc");
  fill(buf, 8192, 68);
  {
    ScopedMr m(must_reg(d.pd, buf, 8192));
    std::string why = write_read_scratch(d, e, buf, m.mr->rkey, 8192);
    check(why.empty(), "e) ... RDMA on an MR registered after it", why);
  }
  fill(buf, 8192, 69);
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) _exit(same_as_pattern(buf, 8192, 69) ? 0 : 1);
  int status = 0;
  const bool reaped = pid > 0 && waitpid(pid, &status, 0) == pid;
  check(reaped && WIFEXITED(status) && WEXITSTATUS(status) == 0,
        "e) ... fork() after ibv_dereg_mr: the child reads what the parent "
        "wrote there, and exits 0",
        fmt("pid %d status %#x", pid, status));
  free(buf);
}

// A MAP_SHARED mapping of a file the program made itself: the service
// maps the file as it is. Data both ways; then the program shrinks the
// file under the MR (nothing can seal it): a WRITE into the vanished pages
// completes, the service stays up (section f), and counts the pages.
void sub_file_mapping(Dev& d, End& e) {
  char path[] = "/dev/shm/verbs_misuse.XXXXXX";  // tmpfs: memory
  int fd = mkstemp(path);
  if (fd < 0) throw SetupError("mkstemp: " + err_text(errno));
  unlink(path);
  const size_t len = 65536;
  if (ftruncate(fd, len) != 0) {
    close(fd);
    throw SetupError("ftruncate: " + err_text(errno));
  }
  void* map = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    close(fd);
    throw SetupError("mmap: " + err_text(errno));
  }
  auto* p = static_cast<uint8_t*>(map);
  fill(p, len, 61);
  errno = 0;
  ibv_mr* mr = ibv_reg_mr(d.pd, p + 100, len - 200, kAccess);
  if (check(mr != nullptr,
            "e) ibv_reg_mr of a MAP_SHARED mapping of a regular file",
            err_text(errno))) {
    check(same_as_pattern(p, len, 61), "e) ... the mapping keeps its contents");
    std::string why = write_read_scratch(d, e, p + 100, mr->rkey, 8192);
    check(why.empty(),
          "e) ... RDMA WRITE into it is visible to the program and READ "
          "sees the program's writes",
          why);
    // The file shrinks to nothing: the program's own pages are gone (it
    // must not touch them now), the service's view of them too.
    const int trc = ftruncate(fd, 0);
    Outcome o = rdma(e, IBV_WR_RDMA_WRITE, d.scratch, 4096, d.scratch_mr->lkey,
                     addr_of(p + 8192), mr->rkey, 62);
    check(trc == 0 && o.is(IBV_WC_SUCCESS, 62),
          "e) ... the program truncates the file: a WRITE into the vanished "
          "pages completes and the service goes on",
          o.text());
    const int rc = ibv_dereg_mr(mr);
    check(rc == 0, "e) ... ibv_dereg_mr", err_text(rc));
  }
  munmap(map, len);
  close(fd);
  // A disk file's mapping is refused: its page faults would stall the
  // service's lcores. (Where /var/tmp is memory too, nothing to check.)
  char disk[] = "/var/tmp/verbs_misuse.XXXXXX";
  fd = mkstemp(disk);
  struct statfs fs;
  if (fd < 0 || fstatfs(fd, &fs) != 0 || fs.f_type == TMPFS_MAGIC) {
    if (fd >= 0) close(fd);
    if (fd >= 0) unlink(disk);
    return;
  }
  unlink(disk);
  void* dm =
      ftruncate(fd, 8192) == 0
          ? mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
          : MAP_FAILED;
  close(fd);
  if (dm == MAP_FAILED) throw SetupError("mmap of a disk file");
  errno = 0;
  ibv_mr* dmr = ibv_reg_mr(d.pd, dm, 8192, kAccess);
  const int de = errno;
  check(!dmr && de == EINVAL,
        "e) ibv_reg_mr of a MAP_SHARED mapping of a disk file fails with "
        "EINVAL",
        dmr ? std::string("it succeeded") : "errno " + err_text(de));
  if (dmr) ibv_dereg_mr(dmr);
  munmap(dm, 8192);
}

// Whether the page at `p` is still private anonymous memory (not turned
// into the shared memfd pages a registration makes of it).
bool still_private(const void* p) {
  FILE* f = fopen("/proc/self/maps", "re");
  if (!f) return false;
  const auto a = reinterpret_cast<uintptr_t>(p);
  char line[512];
  bool priv = false;
  while (fgets(line, sizeof line, f)) {
    uintptr_t lo, hi;
    char perms[8];
    if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %7s", &lo, &hi, perms) != 3)
      continue;
    if (a < lo || a >= hi) continue;
    priv = perms[3] == 'p' && !strstr(line, "memfd:");
    break;
  }
  fclose(f);
  return priv;
}

// A registration verbs refuse (bad access flags, an iova off the address's
// place in its page) fails with EINVAL before any page is touched: the
// memory stays the program's private memory, as the kernel checks first.
void sub_refused_leaves_memory(Dev& d) {
  const size_t len = 3 * 4096;
  void* map = mmap(nullptr, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) throw SetupError("mmap: " + err_text(errno));
  auto* p = static_cast<uint8_t*>(map);
  fill(p, len, 67);
  struct Bad {
    const char* what;
    int access;
    uint64_t iova;
    int err;
  } bad[] = {
      {"REMOTE_WRITE without LOCAL_WRITE", IBV_ACCESS_REMOTE_WRITE, 0, EINVAL},
      {"REMOTE_ATOMIC without LOCAL_WRITE", IBV_ACCESS_REMOTE_ATOMIC, 0,
       EINVAL},
      {"an unknown access bit", IBV_ACCESS_LOCAL_WRITE | (1 << 14), 0, EINVAL},
      {"an iova 8 bytes off the address's page offset", kAccess, addr_of(p) + 8,
       EINVAL},
      // A feature urnic lacks: EOPNOTSUPP, as the kernel's
      // ib_check_mr_access for a device without on-demand paging.
      {"IBV_ACCESS_ON_DEMAND", kAccess | IBV_ACCESS_ON_DEMAND, 0, EOPNOTSUPP},
  };
  for (const Bad& b : bad) {
    errno = 0;
    ibv_mr* mr = b.iova ? ibv_reg_mr_iova(d.pd, p, len, b.iova, b.access)
                        : ibv_reg_mr(d.pd, p, len, b.access);
    const int e = errno;
    check(!mr && e == b.err && still_private(p) && still_private(p + 4096),
          fmt("e) ibv_reg_mr with %s fails with %s and leaves the memory "
              "private",
              b.what, b.err == EINVAL ? "EINVAL" : "EOPNOTSUPP"),
          mr ? std::string("it succeeded") : "errno " + err_text(e));
    if (mr) ibv_dereg_mr(mr);
  }
  // IBV_ACCESS_HUGETLB is a hint every kernel device takes.
  ibv_mr* hint = ibv_reg_mr(d.pd, p, len, kAccess | IBV_ACCESS_HUGETLB);
  check(hint != nullptr,
        "e) ibv_reg_mr with the IBV_ACCESS_HUGETLB hint succeeds",
        err_text(errno));
  if (hint) ibv_dereg_mr(hint);
  // The same page offset, another page: fine, and reachable at the iova.
  ibv_mr* mr = ibv_reg_mr_iova(d.pd, p, len, 0x7000000000ull, kAccess);
  check(mr != nullptr,
        "e) ibv_reg_mr_iova with a page-aligned iova for a page-aligned "
        "address succeeds",
        err_text(errno));
  if (mr) ibv_dereg_mr(mr);
  check(same_as_pattern(p, len, 67), "e) ... the program's data is intact");
  munmap(map, len);
}

void sub_huge_mr(Dev& d, End& e) {
  const size_t len = kGiB + kGiB / 2;
  const size_t off_read = kGiB + kGiB / 4;
  const size_t off_write = kGiB + 2 * kGiB / 5;  // 1.4 GiB
  void* map = mmap(nullptr, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (map == MAP_FAILED) throw SetupError("mmap 1.5 GiB: " + err_text(errno));
  auto* big = static_cast<uint8_t*>(map);
  fill(big, 4096, 62);
  fill(big + off_read, 4096, 63);
  const auto t0 = std::chrono::steady_clock::now();
  ibv_mr* mr = ibv_reg_mr(d.pd, big, len, kAccess);
  const int err = errno;
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  if (check(mr != nullptr,
            fmt("e) ibv_reg_mr of a 1.5 GiB anonymous mapping (%.2f s)", secs),
            err_text(err))) {
    check(same_as_pattern(big, 4096, 62) &&
              same_as_pattern(big + off_read, 4096, 63),
          "e) ... the program's data at 0 and 1.25 GiB is intact");
    memset(d.scratch, 0, 4096);
    Outcome r = rdma(e, IBV_WR_RDMA_READ, d.scratch, 4096, d.scratch_mr->lkey,
                     addr_of(big + off_read), mr->rkey, 64);
    check(r.is(IBV_WC_SUCCESS, 64) && same_as_pattern(d.scratch, 4096, 63),
          "e) ... an RDMA READ at offset 1.25 GiB returns the program's data",
          r.text());
    fill(d.scratch, 4096, 65);
    Outcome w = rdma(e, IBV_WR_RDMA_WRITE, d.scratch, 4096, d.scratch_mr->lkey,
                     addr_of(big + off_write), mr->rkey, 66);
    check(
        w.is(IBV_WC_SUCCESS, 66) && same_as_pattern(big + off_write, 4096, 65),
        "e) ... an RDMA WRITE at offset 1.4 GiB is visible to the program",
        w.text());
    int rc = ibv_dereg_mr(mr);
    check(rc == 0, "e) ... ibv_dereg_mr of the 1.5 GiB MR", err_text(rc));
  }
  munmap(map, len);
}

// System V shared memory (shmget), where perftest --use_hugepages and
// other programs put their buffers: the service maps the segment itself.
// Plain pages, and huge pages (SHM_HUGETLB) where the machine has some
// free, with a range that starts inside one huge page and ends in the
// next.
void sub_sysv(Dev& d, End& e) {
  struct Kind {
    const char* what;
    int flags;
    size_t seg, off, len;
  } kinds[] = {
      {"plain pages", 0, size_t{1} << 20, 4096 + 100, 200000},
      {"huge pages (SHM_HUGETLB)", SHM_HUGETLB, size_t{4} << 20,
       (size_t{2} << 20) - 8192 + 5, 3 * 65536},
  };
  for (const Kind& k : kinds) {
    const int id = shmget(IPC_PRIVATE, k.seg, IPC_CREAT | 0600 | k.flags);
    if (id < 0 && (k.flags & SHM_HUGETLB)) {
      printf("skip: e) System V %s: shmget: %s (no huge pages free)\n", k.what,
             err_text(errno).c_str());
      continue;
    }
    if (id < 0) throw SetupError("shmget: " + err_text(errno));
    void* at = shmat(id, nullptr, 0);
    shmctl(id, IPC_RMID, nullptr);  // gone once detached, as perftest does
    if (at == reinterpret_cast<void*>(-1))
      throw SetupError("shmat: " + err_text(errno));
    auto* seg = static_cast<uint8_t*>(at);
    fill(seg, k.seg, 71);
    uint8_t* u = seg + k.off;
    ibv_mr* mr = ibv_reg_mr(d.pd, u, k.len, kAccess);
    if (check(mr != nullptr,
              fmt("e) ibv_reg_mr of System V shared memory, %s: %zu bytes "
                  "at offset %zu",
                  k.what, k.len, k.off),
              err_text(errno))) {
      check(same_as_pattern(seg, k.seg, 71),
            "e) ... the segment keeps its contents");
      const uint32_t n = 65536;  // the first and the last 64 KiB
      std::string why = write_read_scratch(d, e, u, mr->rkey, n);
      if (why.empty())
        why = write_read_scratch(d, e, u + k.len - n, mr->rkey, n);
      check(why.empty(),
            "e) ... RDMA WRITE into it is visible to the program and READ "
            "sees the program's writes",
            why);
      why = write_read(e, u + k.len - n, mr->lkey, d.scratch,
                       d.scratch_mr->rkey, n, 72);
      check(why.empty(), "e) ... it works as the local side (lkey) too", why);
      const int rc = ibv_dereg_mr(mr);
      check(rc == 0, "e) ... ibv_dereg_mr", err_text(rc));
    }
    shmdt(at);
  }
  // An attachment the program can only read is not shared for writes (the
  // shim's check), nor at all: the service maps what it shares writable.
  const int id = shmget(IPC_PRIVATE, 65536, IPC_CREAT | 0600);
  if (id < 0) throw SetupError("shmget: " + err_text(errno));
  void* ro = shmat(id, nullptr, SHM_RDONLY);
  shmctl(id, IPC_RMID, nullptr);
  if (ro == reinterpret_cast<void*>(-1))
    throw SetupError("shmat: " + err_text(errno));
  errno = 0;
  ibv_mr* w = ibv_reg_mr(d.pd, ro, 65536, kAccess);
  const int ew = errno;
  errno = 0;
  ibv_mr* r = ibv_reg_mr(d.pd, ro, 65536, IBV_ACCESS_REMOTE_READ);
  const int er = errno;
  check(!w && ew == EFAULT && !r && er == EINVAL,
        "e) ibv_reg_mr of a read-only System V attachment fails (EFAULT with "
        "write access, EINVAL without)",
        fmt("%s errno %s, %s errno %s", w ? "registered" : "refused",
            err_text(ew).c_str(), r ? "registered" : "refused",
            err_text(er).c_str()));
  if (w) ibv_dereg_mr(w);
  if (r) ibv_dereg_mr(r);
  shmdt(ro);
}

void section_mrs(Dev& d) {
  {
    ScopedPair sp(d);
    sub_unaligned_malloc(d, sp.p.a);
    sub_overlapping(d, sp.p.a);
    sub_twice(d, sp.p.a);
  }
  sub_rereg(d);
  sub_rereg_mr(d);
  {
    ScopedPair sp(d);
    sub_fork(d, sp.p.a);
    sub_fork_init(d, sp.p.a);
  }
  {
    ScopedPair sp(d);
    sub_file_mapping(d, sp.p.a);
    sub_sysv(d, sp.p.a);
  }
  sub_refused_leaves_memory(d);
  {
    ScopedPair sp(d);
    sub_huge_mr(d, sp.p.a);
  }
}

// --- f) the service is still healthy ---------------------------------------
void section_health(Dev& d) {
  std::vector<uint8_t> buf(32768);
  ScopedMr m(must_reg(d.pd, buf.data(), buf.size()));
  ScopedPair sp(d);
  std::string why =
      write_read_scratch(d, sp.p.a, buf.data(), m.mr->rkey, buf.size());
  check(why.empty(), "f) a fresh QP pair still does a WRITE/READ round trip",
        why);
}

// --- h) verbs urnic does not implement, multicast on RC ---------------------
// Each gives the documented refusal on urnic objects (verbs-shim/verbs.def,
// URNIC_VERB_FIXED) and leaves the objects usable.
void section_unimplemented(Dev& d) {
  ScopedPair sp(d);
  ibv_qp* qp = sp.p.a.qp;
  ibv_gid mgid{};
  mgid.raw[0] = 0xff;
  // Multicast is UD's (IBTA 10.5.2): an RC QP joins nothing, and what it
  // did not join it cannot leave.
  check(ibv_attach_mcast(qp, &mgid, 0) == EINVAL,
        "h) ibv_attach_mcast of an RC QP returns EINVAL");
  check(ibv_detach_mcast(qp, &mgid, 0) == EINVAL,
        "h) ibv_detach_mcast of a group not joined returns EINVAL");
  check(ibv_attach_mcast(qp, nullptr, 0) == EINVAL,
        "h) ibv_attach_mcast without a GID returns EINVAL");
  // Of the QP create flags urnic takes BLOCK_SELF_MCAST_LB only.
  ibv_qp_init_attr_ex xa{};
  xa.qp_type = IBV_QPT_UD;
  xa.send_cq = xa.recv_cq = sp.p.a.scq;
  xa.cap.max_send_wr = xa.cap.max_recv_wr = 4;
  xa.cap.max_send_sge = xa.cap.max_recv_sge = 1;
  xa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
  xa.pd = d.pd;
  xa.create_flags = IBV_QP_CREATE_SCATTER_FCS;
  errno = 0;
  check(ibv_create_qp_ex(d.ctx, &xa) == nullptr && errno == EOPNOTSUPP,
        "h) ibv_create_qp_ex with IBV_QP_CREATE_SCATTER_FCS fails with "
        "EOPNOTSUPP",
        err_text(errno));
  xa.create_flags = IBV_QP_CREATE_BLOCK_SELF_MCAST_LB;
  ibv_qp* quiet = ibv_create_qp_ex(d.ctx, &xa);
  check(quiet != nullptr,
        "h) ibv_create_qp_ex with IBV_QP_CREATE_BLOCK_SELF_MCAST_LB succeeds",
        err_text(errno));
  if (quiet) ibv_destroy_qp(quiet);
  ibv_ece ece{};
  check(ibv_query_ece(qp, &ece) == EOPNOTSUPP,
        "h) ibv_query_ece returns EOPNOTSUPP");
  check(ibv_set_ece(qp, &ece) == EOPNOTSUPP,
        "h) ibv_set_ece returns EOPNOTSUPP");
  check(ibv_query_qp_data_in_order(qp, IBV_WR_RDMA_WRITE, 0) == 0,
        "h) ibv_query_qp_data_in_order promises nothing (0)");
  check(ibv_get_device_index(d.ctx->device) == -1,
        "h) ibv_get_device_index is -1 (no kernel device)");
  errno = 0;
  check(ibv_import_pd(d.ctx, 1) == nullptr && errno == EOPNOTSUPP,
        "h) ibv_import_pd fails with EOPNOTSUPP", err_text(errno));
  errno = 0;
  check(ibv_import_mr(d.pd, 1) == nullptr && errno == EOPNOTSUPP,
        "h) ibv_import_mr fails with EOPNOTSUPP", err_text(errno));
  errno = 0;
  check(ibv_reg_dmabuf_mr(d.pd, 0, 4096, 0, -1, IBV_ACCESS_LOCAL_WRITE) ==
                nullptr &&
            errno == EOPNOTSUPP,
        "h) ibv_reg_dmabuf_mr fails with EOPNOTSUPP", err_text(errno));
  ibv_unimport_pd(d.pd);  // must not touch urnic's PD
  ibv_unimport_mr(d.scratch_mr);
  std::vector<uint8_t> buf(4096);
  ScopedMr m(must_reg(d.pd, buf.data(), buf.size()));
  std::string why =
      write_read_scratch(d, sp.p.a, buf.data(), m.mr->rkey, buf.size());
  check(why.empty(), "h) ... and the PD, MR and QP still work", why);
}

void run(const char* name, void (*fn)(Dev&), Dev& d) {
  try {
    fn(d);
  } catch (const SetupError& e) {
    check(false, fmt("%s: setup", name), e.what());
  }
}

// --- g) an AH to a peer that never answers ARP ------------------------------
// The service resolves the MAC without blocking its control thread: this
// context's ibv_create_ah waits, then fails with EHOSTUNREACH (about 3 s),
// while another context of the same process is served at once (the
// control thread used to wait the 3 s out, holding every client).
ibv_device* g_dev = nullptr;

void section_silent_peer(Dev& d) {
  ibv_gid silent = d.gid;  // ::ffff:a.b.c.x: the same /24, nobody there
  silent.raw[15] = d.gid.raw[15] == 0xfe ? 0xfd : 0xfe;
  ibv_context* other = ibv_open_device(g_dev);
  if (!check(other != nullptr, "g) a second context", err_text(errno))) return;
  ibv_ah* ah = nullptr;
  int ah_errno = 0;
  double ah_s = 0;
  std::thread t([&] {
    ibv_ah_attr a{};
    a.is_global = 1;
    a.port_num = 1;
    a.grh.dgid = silent;
    a.grh.sgid_index = 0;
    a.grh.hop_limit = 64;
    const auto t0 = std::chrono::steady_clock::now();
    ah = ibv_create_ah(d.pd, &a);
    ah_errno = errno;
    ah_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
               .count();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  double slowest_ms = 0;
  bool ok = true;
  for (int i = 0; i < 10; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    ibv_pd* pd = ibv_alloc_pd(other);
    ok = ok && pd && ibv_dealloc_pd(pd) == 0;
    slowest_ms = std::max(slowest_ms, std::chrono::duration<double, std::milli>(
                                          std::chrono::steady_clock::now() - t0)
                                          .count());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  t.join();
  check(ok && slowest_ms < 500,
        "g) another context is served while an AH waits for ARP",
        fmt("slowest alloc+dealloc %.0f ms", slowest_ms));
  check(!ah && ah_errno == EHOSTUNREACH && ah_s > 2 && ah_s < 10,
        "g) ibv_create_ah to a GID nobody answers fails with EHOSTUNREACH",
        fmt("%s after %.1f s", ah ? "created" : err_text(ah_errno).c_str(),
            ah_s));
  if (ah) ibv_destroy_ah(ah);
  check(ibv_close_device(other) == 0, "g) the second context closes");
}

}  // namespace

int main(int argc, char** argv) {
  const char* want = argc > 1 ? argv[1] : "urnic0";
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ibv_device* dev = nullptr;
  for (int i = 0; list && i < n; ++i)
    if (strcmp(ibv_get_device_name(list[i]), want) == 0) dev = list[i];
  if (!check(dev != nullptr, fmt("device %s found", want),
             fmt("%d devices", n)))
    return 1;
  Dev d;
  d.ctx = ibv_open_device(dev);
  if (!check(d.ctx != nullptr, "ibv_open_device", err_text(errno))) return 1;
  int rc = ibv_query_gid(d.ctx, 1, 0, &d.gid);
  static const uint8_t kZero[16] = {};
  if (!check(rc == 0 && memcmp(d.gid.raw, kZero, 16) != 0,
             "GID index 0 of port 1", err_text(rc)))
    return 1;
  d.pd = ibv_alloc_pd(d.ctx);
  if (!check(d.pd != nullptr, "ibv_alloc_pd", err_text(errno))) return 1;
  d.scratch = static_cast<uint8_t*>(aligned_alloc(4096, kScratch));
  d.scratch_mr = ibv_reg_mr(d.pd, d.scratch, kScratch, kAccess);
  if (!check(d.scratch_mr != nullptr, "ibv_reg_mr of the scratch buffer",
             err_text(errno)))
    return 1;

  run("a) wrong QP state", section_states, d);
  run("a) RESET and destroy clean the CQ", section_reset_cleans, d);
  run("b) another PD's lkey", section_other_pd, d);
  run("c) bounds", section_bounds, d);
  run("d) queue overflow", section_overflow, d);
  run("e) memory registration", section_mrs, d);
  run("f) health", section_health, d);
  g_dev = dev;
  run("g) a silent peer", section_silent_peer, d);
  run("h) verbs urnic does not implement", section_unimplemented, d);

  check(ibv_dereg_mr(d.scratch_mr) == 0, "ibv_dereg_mr of the scratch buffer");
  check(ibv_dealloc_pd(d.pd) == 0, "ibv_dealloc_pd");
  check(ibv_close_device(d.ctx) == 0, "ibv_close_device");
  ibv_free_device_list(list);
  free(d.scratch);
  printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed ? 1 : 0;
}
