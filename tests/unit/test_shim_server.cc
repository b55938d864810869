// The service side of the verbs shim, driven in-process: the test plays
// the shim (control requests, shared rings, doorbells) against a real
// Device + Engine whose frames loop back through the wire codec.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "dataplane/service/shim_server.h"
#include "dataplane/wire/codec.h"

namespace urnic::service {
namespace {

using namespace urnic::shim;

constexpr uint32_t kRemoteAll =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
    IBV_ACCESS_REMOTE_ATOMIC;

// Frames the engine sends are decoded and fed back to it (one device
// talking to its own GID, as two applications on one urnicd do).
class LoopIo : public transport::PacketIo {
 public:
  bool transmit(const transport::TxFrame& f) override {
    std::vector<uint8_t> b(f.frame_len());
    f.copy_to(b.data());
    frames.push_back(std::move(b));
    return true;
  }
  std::deque<std::vector<uint8_t>> frames;
};

struct Reply {
  int status = 0;
  std::string payload;
  std::vector<int> fds;
  template <typename T>
  T as() const {
    T v{};
    EXPECT_EQ(payload.size(), sizeof v) << payload;
    std::memcpy(&v, payload.data(), std::min(sizeof v, payload.size()));
    return v;
  }
};

struct UdSends;

struct ShimServerTest : ::testing::Test {
  // `homes` engines (worker lcores), run in turn by run(): frames go to the
  // engine their destination QPN names, as urnicd's workers steer them.
  explicit ShimServerTest(config::ClientLimitsConfig l = {}, uint32_t homes = 1,
                          TxMemory* tx = nullptr)
      : limits(l),
        tx_memory(tx),
        dev(device()),
        engines(make_engines(dev, io, homes)),
        gates(homes),
        bells(make_bells(homes)),
        srv(env()) {
    ci.id = 7;
    ci.pid = getpid();
  }
  ~ShimServerTest() override {
    srv.on_close(ci);
    for (auto& [p, n] : maps) munmap(p, n);
    for (int fd : bells) close(fd);
    for (int fd : client_bells) close(fd);
  }
  static std::vector<int> make_bells(uint32_t homes) {
    std::vector<int> v;
    for (uint32_t h = 0; h < homes; ++h)
      v.push_back(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    return v;
  }
  static transport::DeviceConfig device() {
    transport::DeviceConfig dc;
    dc.mac = {{2, 0, 0, 0, 0, 1}};
    wire::gid_from_ipv4(0x0a000001, dc.gids[0]);
    dc.num_gids = 1;
    dc.key_seed = 1;
    return dc;
  }
  static std::vector<std::unique_ptr<transport::Engine>> make_engines(
      transport::Device& d, LoopIo& io, uint32_t homes) {
    std::vector<std::unique_ptr<transport::Engine>> v;
    for (uint32_t h = 0; h < homes; ++h) {
      transport::EngineConfig ec;
      ec.home = h;
      ec.homes = homes;
      v.push_back(std::make_unique<transport::Engine>(d, io, ec));
    }
    return v;
  }
  ShimEnv env() {
    ShimEnv e;
    e.dev = &dev;
    for (auto& en : engines) e.engines.push_back(en.get());
    // Never running: park() returns at once.
    for (LcoreGate& g : gates) e.gates.push_back(&g);
    e.bells = bells;
    e.info.num_gids = 1;
    e.client_limits = limits;
    e.tx_memory = tx_memory;
    e.mcast_changed = [this](const uint8_t g[16], bool joined) {
      group_changes.push_back(std::to_string(g[15]) + (joined ? "+" : "-"));
    };
    return e;
  }
  std::vector<std::string> group_changes;  // ShimEnv::mcast_changed calls

  template <typename T>
  Reply call(Op op, const T& body, std::vector<int> fds = {}) {
    return call_raw(
        op, std::string(reinterpret_cast<const char*>(&body), sizeof body),
        std::move(fds));
  }
  Reply call_raw(Op op, std::string body, std::vector<int> fds = {}) {
    CtlRequest req{&ci, static_cast<ctl::Op>(op), body, fds};
    CtlReply rep;
    srv.handle(req, rep);
    for (int fd : fds)
      if (fd >= 0) close(fd);  // what ControlServer does
    return {rep.status, rep.payload, rep.fds};
  }
  void* map(int fd, size_t len) {
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    EXPECT_NE(p, MAP_FAILED);
    close(fd);
    maps.push_back({p, len});
    return p;
  }
  uint32_t rung = 0;  // QP/SRQ doorbells served so far
  // Runs the lcore side until nothing moves.
  void run() {
    for (int i = 0; i < 1000; ++i) {
      uint32_t work = 0;
      now += 1000;
      for (uint32_t h = 0; h < engines.size(); ++h) {
        work += srv.doorbells_st(h, &rung);
        work += engines[h]->poll(now);
      }
      work += deliver();
      if (!work) return;
    }
  }
  // The frames sent so far, each to the engine its destination QPN names,
  // and no doorbell served: an lcore that took its doorbells and then the
  // frames that arrived meanwhile.
  uint32_t deliver() {
    uint32_t n = 0;
    for (; !io.frames.empty(); ++n) {
      std::vector<uint8_t> b = std::move(io.frames.front());
      io.frames.pop_front();
      wire::FrameInfo fi;
      wire::decode(b.data(), static_cast<uint32_t>(b.size()), fi);
      EXPECT_EQ(fi.kind, wire::FrameKind::kRoce);
      const wire::ConstBuf seg{b.data(), static_cast<uint32_t>(b.size())};
      engines[engines[0]->home_of(fi.roce.dqpn)]->rx(fi, {&seg, 1}, now);
    }
    return n;
  }
  uint64_t ectr(transport::ECtr c) const {
    uint64_t n = 0;
    for (const auto& e : engines) n += e->counters().get(c);
    return n;
  }

  void open() {
    int sv[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    async_fd = sv[0];
    Reply r = call(Op::kOpen, OpenReq{}, {sv[1]});
    ASSERT_EQ(r.status, 0) << r.payload;
    ASSERT_EQ(r.fds.size(), 1 + engines.size());  // the page, a bell each
    EXPECT_EQ(r.as<OpenRep>().homes, engines.size());
    client_bells.assign(r.fds.begin() + 1, r.fds.end());
    db = static_cast<DoorbellPage*>(map(r.fds[0], page_round(sizeof *db)));
  }
  uint32_t handle(const Reply& r) {
    EXPECT_EQ(r.status, 0) << r.payload;
    return r.as<HandleRep>().handle;
  }

  struct Cq {
    uint32_t h;
    CqShared* sh;
    ibv_wc* ring;
  };
  Cq create_cq(uint32_t cqe, uint32_t channel = kNoHandle) {
    Reply r = call(Op::kCreateCq, CreateCqReq{cqe, channel});
    EXPECT_EQ(r.status, 0) << r.payload;
    const auto rep = r.as<CreateCqRep>();
    auto* sh = static_cast<CqShared*>(map(r.fds.at(0), rep.map_len));
    return {
        rep.handle, sh,
        reinterpret_cast<ibv_wc*>(reinterpret_cast<uint8_t*>(sh) + sh->offset)};
  }
  bool poll(Cq& cq, ibv_wc* wc) {
    const uint32_t c = cq.sh->cons.load();
    if (c == cq.sh->prod.load()) return false;
    *wc = cq.ring[c & (cq.sh->size - 1)];
    cq.sh->cons.store(c + 1);
    return true;
  }

  struct Qp {
    uint32_t h, qpn, doorbell;
    QpShared* sh;
    ShmSendWqe* sq;
    ShmRecvWqe* rq;
  };
  // A create request of `wr` WRs and one SGE each way, one CQ for both.
  static CreateQpReq qp_req(uint32_t pd, uint32_t cq,
                            ibv_qp_type t = IBV_QPT_RC, uint32_t wr = 4) {
    CreateQpReq q;
    q.pd = pd;
    q.send_cq = q.recv_cq = cq;
    q.qp_type = t;
    q.cap.max_send_wr = q.cap.max_recv_wr = wr;
    q.cap.max_send_sge = q.cap.max_recv_sge = 1;
    return q;
  }
  Qp create_qp(uint32_t pd, uint32_t cq, ibv_qp_type t = IBV_QPT_RC,
               uint32_t srq = kNoHandle) {
    CreateQpReq q = qp_req(pd, cq, t, 16);
    q.srq = srq;
    q.cap.max_send_sge = q.cap.max_recv_sge = 2;
    q.cap.max_inline_data = 64;
    Reply r = call(Op::kCreateQp, q);
    EXPECT_EQ(r.status, 0) << r.payload;
    const auto rep = r.as<CreateQpRep>();
    auto* base = static_cast<uint8_t*>(map(r.fds.at(0), rep.map_len));
    auto* sh = reinterpret_cast<QpShared*>(base);
    EXPECT_EQ(sh->sq_size, rep.cap.max_send_wr);
    return {rep.handle,
            rep.qpn,
            rep.doorbell,
            sh,
            reinterpret_cast<ShmSendWqe*>(base + sh->sq_offset),
            reinterpret_cast<ShmRecvWqe*>(base + sh->rq_offset)};
  }
  // `n` QPs of a new SRQ (with a new PD and CQ), in INIT: entering error,
  // each raises LAST_WQE_REACHED (IBTA 11.6.3).
  std::vector<Qp> srq_qps_in_init(int n) {
    const uint32_t pd = handle(call_raw(Op::kAllocPd, ""));
    const uint32_t cq = create_cq(16).h;
    Reply r = call(Op::kCreateSrq, CreateSrqReq{pd, 8, 1, 0});
    EXPECT_EQ(r.status, 0) << r.payload;
    for (int fd : r.fds) close(fd);
    std::vector<Qp> qps;
    for (int i = 0; i < n; ++i) {
      qps.push_back(create_qp(pd, cq, IBV_QPT_RC, r.as<CreateSrqRep>().handle));
      EXPECT_EQ(modify(qps.back(), IBV_QPS_INIT), 0);
    }
    return qps;
  }
  int modify(const Qp& q, ibv_qp_state s, uint32_t dqpn = 0) {
    ModifyQpReq m;
    m.handle = q.h;
    m.attr.qp_state = s;
    if (s == IBV_QPS_INIT) {
      m.mask =
          IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
      m.attr.port_num = 1;
      m.attr.qp_access_flags = kRemoteAll;
    } else if (s == IBV_QPS_RTR) {
      m.mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
               IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
      m.attr.path_mtu = IBV_MTU_1024;
      m.attr.dest_qp_num = dqpn;
      m.attr.max_dest_rd_atomic = 1;
      m.attr.min_rnr_timer = 12;
      m.attr.ah_attr.is_global = 1;
      m.attr.ah_attr.port_num = 1;
      std::memcpy(m.attr.ah_attr.grh.dgid.raw, dev.config().gids[0], 16);
    } else if (s == IBV_QPS_RTS) {
      m.mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
               IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
      m.attr.timeout = 14;
      m.attr.retry_cnt = 7;
      m.attr.rnr_retry = 7;
      m.attr.max_rd_atomic = 1;
    } else {
      m.mask = IBV_QP_STATE;
    }
    return call(Op::kModifyQp, m).status;
  }
  void connect(const Qp& a, const Qp& b) {
    ASSERT_EQ(modify(a, IBV_QPS_INIT), 0);
    ASSERT_EQ(modify(b, IBV_QPS_INIT), 0);
    ASSERT_EQ(modify(a, IBV_QPS_RTR, b.qpn), 0);
    ASSERT_EQ(modify(b, IBV_QPS_RTR, a.qpn), 0);
    ASSERT_EQ(modify(a, IBV_QPS_RTS), 0);
    ASSERT_EQ(modify(b, IBV_QPS_RTS), 0);
  }
  // A UD QP to RTS, Q_Key 0x1234.
  void ud_to_rts(const Qp& q) {
    ModifyQpReq m;
    m.handle = q.h;
    m.mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
    m.attr.qp_state = IBV_QPS_INIT;
    m.attr.port_num = 1;
    m.attr.qkey = 0x1234;
    ASSERT_EQ(call(Op::kModifyQp, m).status, 0);
    m.mask = IBV_QP_STATE;
    m.attr.qp_state = IBV_QPS_RTR;
    ASSERT_EQ(call(Op::kModifyQp, m).status, 0);
    m.mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
    m.attr.qp_state = IBV_QPS_RTS;
    ASSERT_EQ(call(Op::kModifyQp, m).status, 0);
  }
  UdSends ud_sends(uint32_t send_flags);
  std::vector<ibv_wc> ud_received(UdSends& u);
  void post(Qp& q, const ShmSendWqe& w) {
    const uint32_t p = q.sh->sq_prod.load();
    q.sq[p & (q.sh->sq_size - 1)] = w;
    q.sh->sq_prod.store(p + 1, std::memory_order_release);
    ring_doorbell(*db, q.doorbell);
  }

  // An "application buffer": a sealed memfd both sides map.
  struct Buf {
    uint8_t* p;
    uint32_t h, lkey, rkey;
  };
  Buf reg(uint32_t pd, size_t len, bool seal = true) {
    Buf b;
    reg_reply(pd, len, seal, &b);
    return b;
  }
  // The service's reply to a kRegMr of `len` fresh bytes; *out (if given)
  // the buffer, with its handle and keys when registered.
  Reply reg_reply(uint32_t pd, size_t len, bool seal = true,
                  Buf* out = nullptr) {
    const int fd = memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(len)), 0);
    if (seal) fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK);
    auto* p = static_cast<uint8_t*>(
        mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    maps.push_back({p, len});
    RegMrReq r;
    r.pd = pd;
    r.access = kRemoteAll;
    r.addr = r.iova = r.map_start = reinterpret_cast<uint64_t>(p);
    r.length = r.map_len = len;
    r.npieces = 1;
    r.pieces[0] = {0, len};
    Reply rep = call(Op::kRegMr, r, {fd});
    if (out) {
      *out = {p, 0, 0, 0};
      if (!rep.status) {
        const auto m = rep.as<RegMrRep>();
        *out = {p, m.handle, m.lkey, m.rkey};
      }
    }
    return rep;
  }

  static ShmSendWqe send_wqe(const Buf& from, uint32_t len) {
    ShmSendWqe w{};
    w.wr_id = 10;
    w.opcode = IBV_WR_SEND;
    w.send_flags = IBV_SEND_SIGNALED;
    w.num_sge = 1;
    w.sge[0] = {reinterpret_cast<uint64_t>(from.p), len, from.lkey};
    return w;
  }
  static ShmSendWqe write_wqe(const Buf& from, const Buf& to, uint32_t len) {
    ShmSendWqe w = send_wqe(from, len);
    w.wr_id = 42;
    w.opcode = IBV_WR_RDMA_WRITE;
    w.remote_addr = reinterpret_cast<uint64_t>(to.p);
    w.rkey = to.rkey;
    return w;
  }
  static ShmRecvWqe recv_wqe(const Buf& to, uint32_t len) {
    ShmRecvWqe w{};
    w.wr_id = 9;
    w.num_sge = 1;
    w.sge[0] = {reinterpret_cast<uint64_t>(to.p), len, to.lkey};
    return w;
  }
  // A client with a PD, a CQ and two connected RC QPs on it.
  struct Pair {
    uint32_t pd;
    Cq cq;
    Qp a, b;
  };
  Pair connected_pair() {
    open();
    const uint32_t pd = handle(call_raw(Op::kAllocPd, ""));
    Cq cq = create_cq(64);
    Qp a = create_qp(pd, cq.h), b = create_qp(pd, cq.h);
    connect(a, b);
    return {pd, cq, a, b};
  }
  // An RDMA WRITE of `len` pattern bytes (i * seed) from `from` into `to`
  // on p.a, run to its completion: its status (GENERAL_ERR if none came).
  ibv_wc_status write_through(const Pair& p, const Buf& from, const Buf& to,
                              uint32_t len, uint8_t seed) {
    for (uint32_t i = 0; i < len; ++i)
      from.p[i] = static_cast<uint8_t>(i * seed);
    Qp a = p.a;
    post(a, write_wqe(from, to, len));
    run();
    ibv_wc wc;
    Cq cq = p.cq;
    return poll(cq, &wc) ? wc.status : IBV_WC_GENERAL_ERR;
  }
  // Posts `w` on `q` and sends its frame (not yet delivered): the lcore
  // served the doorbells, and nothing else was posted before it did.
  void send_now(Qp& q, const ShmSendWqe& w) {
    post(q, w);
    uint32_t r = 0;
    ASSERT_EQ(srv.doorbells_st(0, &r), 1u);
    engines[0]->poll(now);
    ASSERT_FALSE(io.frames.empty());
  }

  config::ClientLimitsConfig limits;
  TxMemory* tx_memory;
  transport::Device dev;
  LoopIo io;
  std::vector<std::unique_ptr<transport::Engine>> engines;
  std::vector<LcoreGate> gates;
  std::vector<int> bells;         // the workers' (ShimEnv::bells)
  std::vector<int> client_bells;  // the copies open() got
  ShimServer srv;
  ClientInfo ci;
  int async_fd = -1;
  DoorbellPage* db = nullptr;
  uint64_t now = 0;
  std::vector<std::pair<void*, size_t>> maps;
};

TEST_F(ShimServerTest, FirstRequestMustBeOpenAndAbiIsChecked) {
  Reply r = call_raw(Op::kAllocPd, "");
  EXPECT_EQ(r.status, -EPROTO);
  OpenReq o;
  o.abi = kShimAbi + 1;
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
  r = call(Op::kOpen, o, {sv[1]});
  close(sv[0]);
  EXPECT_EQ(r.status, -EPROTONOSUPPORT);
  EXPECT_NE(r.payload.find("shim ABI"), std::string::npos) << r.payload;
  open();
  r = call(Op::kOpen, OpenReq{});
  EXPECT_EQ(r.status, -EPROTO);  // already open
}

// A client gets a copy of each worker's bell at open; a worker that waits
// marks itself in the client's page (DoorbellPage::waiting), and the
// client's write to its copy is a write to the worker's bell.
TEST_F(ShimServerTest, OpenPassesTheBellsAndWaitingMarksThePage) {
  open();
  ASSERT_EQ(client_bells.size(), 1u);
  EXPECT_EQ(db->waiting.load(), 0u);
  srv.set_waiting_st(0, true);
  EXPECT_EQ(db->waiting.load(), 1u);
  const uint64_t one = 1;
  ASSERT_EQ(write(client_bells[0], &one, sizeof one), 8);
  uint64_t v = 0;
  ASSERT_EQ(read(bells[0], &v, sizeof v), 8);
  EXPECT_EQ(v, 1u);
  srv.set_waiting_st(0, false);
  EXPECT_EQ(db->waiting.load(), 0u);
}

// An MR in a System V attachment (shmget, as perftest --use_hugepages
// makes): no fd; the service opens the attachment itself and checks it
// against the client's maps. A WRITE lands in the segment. A piece that
// claims another offset in the segment than the attachment's, a range
// past the attachment, or a piece with an fd beside it are refused.
TEST_F(ShimServerTest, SysvAttachmentRegisteredWithoutFd) {
  if (geteuid() != 0) GTEST_SKIP() << "another's map_files need CAP_SYS_ADMIN";
  const Pair p = connected_pair();
  const uint64_t pg = 4096;
  const int id = shmget(IPC_PRIVATE, 4 * pg, IPC_CREAT | 0600);
  ASSERT_GE(id, 0);
  void* at = shmat(id, nullptr, 0);
  shmctl(id, IPC_RMID, nullptr);
  ASSERT_NE(at, reinterpret_cast<void*>(-1));
  auto* seg = static_cast<uint8_t*>(at);
  const uint64_t base = reinterpret_cast<uint64_t>(seg);
  auto sysv = [&](uint64_t off, uint64_t start, uint64_t len,
                  std::vector<int> fds = {}) {
    RegMrReq r;
    r.pd = p.pd;
    r.access = kRemoteAll;
    r.addr = r.iova = r.map_start = start;
    r.length = r.map_len = len;
    r.npieces = 1;
    r.pieces[0] = {off, len, base, base + 4 * pg};
    return call(Op::kRegMr, r, std::move(fds));
  };
  EXPECT_EQ(sysv(0, base + pg, pg).status, -EINVAL);       // offset
  EXPECT_EQ(sysv(pg, base + pg, 4 * pg).status, -EINVAL);  // past it
  const int fd = memfd_create("t", MFD_CLOEXEC);
  EXPECT_EQ(sysv(pg, base + pg, pg, {fd}).status, -EINVAL);  // an fd too
  Reply ok = sysv(pg, base + pg, 2 * pg);
  ASSERT_EQ(ok.status, 0) << ok.payload;
  const auto m = ok.as<RegMrRep>();
  const Buf dst{seg + pg, m.handle, m.lkey, m.rkey};
  const Buf src = reg(p.pd, 8192);
  EXPECT_EQ(write_through(p, src, dst, 5000, 11), IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(src.p, seg + pg, 5000), 0);  // in the segment
  shmdt(at);
}

// An MR in a file the client mapped MAP_SHARED: the service maps the file
// itself. The client may shrink the file under it (nothing seals it): the
// service's next access past the end is a SIGBUS, which puts a zero page
// there and is counted, and the service goes on.
TEST_F(ShimServerTest, SharedFileMrSurvivesTheFileShrinking) {
  if (geteuid() != 0) GTEST_SKIP() << "another's map_files need CAP_SYS_ADMIN";
  const Pair p = connected_pair();
  const uint64_t pg = 4096;
  char path[] = "/dev/shm/test_shim_serverXXXXXX";  // tmpfs: memory
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  unlink(path);
  ASSERT_EQ(ftruncate(fd, 4 * pg), 0);
  auto* f = static_cast<uint8_t*>(
      mmap(nullptr, 4 * pg, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  ASSERT_NE(f, MAP_FAILED);
  const uint64_t base = reinterpret_cast<uint64_t>(f);
  RegMrReq r;
  r.pd = p.pd;
  r.access = kRemoteAll;
  r.addr = r.iova = r.map_start = base;
  r.length = r.map_len = 4 * pg;
  r.npieces = 1;
  r.pieces[0] = {0, 4 * pg, base, base + 4 * pg};
  Reply ok = call(Op::kRegMr, r);
  ASSERT_EQ(ok.status, 0) << ok.payload;
  const auto m = ok.as<RegMrRep>();
  const Buf dst{f, m.handle, m.lkey, m.rkey};
  const Buf src = reg(p.pd, 8192);
  EXPECT_EQ(write_through(p, src, dst, 4096, 3), IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(src.p, f, 4096), 0);  // in the file
  auto truncated = [&] {
    for (const auto& [k, v] : srv.stats())
      if (std::string(k) == "mr_pages_truncated") return v;
    return uint64_t{0};
  };
  const uint64_t before = truncated();
  ASSERT_EQ(ftruncate(fd, 0), 0);  // the file's pages are gone
  // Written to a zero page.
  EXPECT_EQ(write_through(p, src, dst, 4096, 5), IBV_WC_SUCCESS);
  EXPECT_GE(truncated(), before + 1);
  EXPECT_EQ(call(Op::kDeregMr, HandleReq{m.handle}).status, 0);
  munmap(f, 4 * pg);
  close(fd);
}

// ibv_rereg_mr: a fresh registration takes the MR's place and keys. A
// WRITE through the old rkey lands in the new range; the fresh handle is
// gone; a pair that is not two MRs of the client is refused.
TEST_F(ShimServerTest, ReregKeepsTheKeys) {
  const Pair p = connected_pair();
  Buf old = reg(p.pd, 8192), fresh = reg(p.pd, 8192), src = reg(p.pd, 4096);
  EXPECT_EQ(call(Op::kReregMr, ReregMrReq{old.h, old.h}).status, -EINVAL);
  EXPECT_EQ(call(Op::kReregMr, ReregMrReq{old.h, 999}).status, -EINVAL);
  Reply r = call(Op::kReregMr, ReregMrReq{old.h, fresh.h});
  ASSERT_EQ(r.status, 0) << r.payload;
  const auto m = r.as<RegMrRep>();
  EXPECT_EQ(m.handle, old.h);
  EXPECT_EQ(m.lkey, old.lkey);
  EXPECT_EQ(m.rkey, old.rkey);
  EXPECT_EQ(call(Op::kDeregMr, HandleReq{fresh.h}).status, -EINVAL);
  // The MR is fresh's memory now, under the old keys and address: the
  // iova is what the registration said, fresh's address.
  const Buf into{fresh.p, old.h, old.lkey, old.rkey};
  EXPECT_EQ(write_through(p, src, into, 4096, 13), IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(src.p, fresh.p, 4096), 0);
  EXPECT_EQ(call(Op::kDeregMr, HandleReq{old.h}).status, 0);
}

TEST_F(ShimServerTest, WriteThroughSharedRingsAndDoorbell) {
  open();
  const uint32_t pd = handle(call_raw(Op::kAllocPd, ""));
  Cq cq = create_cq(64);
  Qp a = create_qp(pd, cq.h), b = create_qp(pd, cq.h);
  EXPECT_EQ(a.sh->state.load(), IBV_QPS_RESET);
  connect(a, b);
  EXPECT_EQ(a.sh->state.load(), IBV_QPS_RTS);
  Buf src = reg(pd, 8192), dst = reg(pd, 8192);
  ASSERT_NE(src.h, 0u);
  for (int i = 0; i < 5000; ++i) src.p[i] = static_cast<uint8_t>(i * 7);
  post(a, write_wqe(src, dst, 5000));
  run();
  EXPECT_EQ(rung, 1u);  // one QP doorbell served
  ibv_wc wc;
  ASSERT_TRUE(poll(cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.wr_id, 42u);
  EXPECT_EQ(wc.qp_num, a.qpn);
  EXPECT_EQ(std::memcmp(src.p, dst.p, 5000), 0);  // the service wrote here
  EXPECT_EQ(a.sh->sq_done.load(), 1u);
  EXPECT_FALSE(poll(cq, &wc));

  // Inline SEND into a posted receive.
  ShmRecvWqe r{};
  r.wr_id = 9;
  r.num_sge = 1;
  r.sge[0] = {reinterpret_cast<uint64_t>(dst.p), 100, dst.lkey};
  b.rq[0] = r;
  b.sh->rq_prod.store(1);
  ring_doorbell(*db, b.doorbell);
  ShmSendWqe s{};
  s.wr_id = 10;
  s.opcode = IBV_WR_SEND;
  s.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  s.inline_len = 5;
  std::memcpy(s.inline_data, "hello", 5);
  post(a, s);
  run();
  std::vector<ibv_wc> got;
  while (poll(cq, &wc)) got.push_back(wc);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(std::memcmp(dst.p, "hello", 5), 0);
  EXPECT_EQ(b.sh->rq_done.load(), 1u);
  EXPECT_EQ(rung, 3u);  // then b's receive ring and a's send ring
  EXPECT_EQ(srv.counters().bad_wqes.load(), 0u);
}

// A SEND that arrives after the application posted its receive, but before
// the lcore served that receive's doorbell (it took the doorbells, then was
// off the CPU while the peer sent): the responder takes the posted receive
// from the ring instead of finding the queue empty. Before, UD and UC lost
// the message (rx_no_recv: verbs_shim.sh's payload_reuse lost 7 of 5000)
// and RC sent an RNR NAK.
TEST_F(ShimServerTest, AReceivePostedBeforeItsSendArrivedIsFoundUnrung) {
  auto [pd, cq, a, b] = connected_pair();
  Buf src = reg(pd, 4096), dst = reg(pd, 4096);
  std::memcpy(src.p, "posted in time", 15);
  ASSERT_NO_FATAL_FAILURE(send_now(a, send_wqe(src, 15)));  // b's ring empty
  // Posted and rung now; the SEND arrives before the doorbell is served.
  b.rq[0] = recv_wqe(dst, 100);
  b.sh->rq_prod.store(1, std::memory_order_release);
  ring_doorbell(*db, b.doorbell);
  deliver();
  EXPECT_EQ(ectr(transport::ECtr::recv_refills), 1u);
  EXPECT_EQ(ectr(transport::ECtr::rx_no_recv), 0u);
  EXPECT_EQ(ectr(transport::ECtr::naks_rnr_tx), 0u);
  run();  // the ACK; serving b's doorbell now finds nothing new
  std::vector<ibv_wc> got;
  ibv_wc wc;
  while (poll(cq, &wc)) got.push_back(wc);
  ASSERT_EQ(got.size(), 2u);
  for (const ibv_wc& c : got) EXPECT_EQ(c.status, IBV_WC_SUCCESS);
  const ibv_wc& recv = got[0].opcode == IBV_WC_RECV ? got[0] : got[1];
  EXPECT_EQ(recv.wr_id, 9u);
  EXPECT_EQ(recv.byte_len, 15u);
  EXPECT_STREQ(reinterpret_cast<const char*>(dst.p), "posted in time");
  EXPECT_EQ(b.sh->rq_done.load(), 1u);
  EXPECT_EQ(ectr(transport::ECtr::recv_wqes), 1u);  // taken once
  EXPECT_EQ(ectr(transport::ECtr::rx_no_recv), 0u);
}

// The same for a QP of an SRQ: the SRQ's ring is read when it is empty.
TEST_F(ShimServerTest, AnSrqReceivePostedBeforeItsSendArrivedIsFoundUnrung) {
  open();
  const uint32_t pd = handle(call_raw(Op::kAllocPd, ""));
  Cq cq = create_cq(64);
  Reply sr = call(Op::kCreateSrq, CreateSrqReq{pd, 8, 1, 0});
  ASSERT_EQ(sr.status, 0) << sr.payload;
  const auto srep = sr.as<CreateSrqRep>();
  auto* ssh = static_cast<SrqShared*>(map(sr.fds.at(0), srep.map_len));
  auto* ring = reinterpret_cast<ShmRecvWqe*>(reinterpret_cast<uint8_t*>(ssh) +
                                             ssh->offset);
  Qp a = create_qp(pd, cq.h), b = create_qp(pd, cq.h, IBV_QPT_RC, srep.handle);
  connect(a, b);
  Buf src = reg(pd, 4096), dst = reg(pd, 4096);
  std::memcpy(src.p, "shared", 7);
  ASSERT_NO_FATAL_FAILURE(send_now(a, send_wqe(src, 7)));
  ring[0] = recv_wqe(dst, 100);
  ssh->prod.store(1, std::memory_order_release);
  ring_doorbell(*db, srep.doorbell);
  deliver();
  EXPECT_EQ(ectr(transport::ECtr::recv_refills), 1u);
  EXPECT_EQ(ectr(transport::ECtr::naks_rnr_tx), 0u);
  run();
  ibv_wc wc;
  int recvs = 0;
  while (poll(cq, &wc)) {
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    recvs += wc.opcode == IBV_WC_RECV;
  }
  EXPECT_EQ(recvs, 1);
  EXPECT_STREQ(reinterpret_cast<const char*>(dst.p), "shared");
  EXPECT_EQ(ssh->done.load(), 1u);
}

// The ring the refill reads was corrupted (an index no producer can write):
// the QP goes to error there and then, and answers the SEND with nothing.
TEST_F(ShimServerTest, ARefillThatFindsACorruptRingLeavesTheQpInError) {
  auto [pd, cq, a, b] = connected_pair();
  Buf src = reg(pd, 4096);
  ASSERT_NO_FATAL_FAILURE(send_now(a, send_wqe(src, 8)));
  b.sh->rq_prod.store(1000, std::memory_order_release);  // ring: 16 slots
  deliver();
  EXPECT_EQ(b.sh->state.load(), IBV_QPS_ERR);
  EXPECT_EQ(srv.counters().bad_wqes.load(), 1u);
  EXPECT_EQ(ectr(transport::ECtr::naks_rnr_tx), 0u);
  EXPECT_EQ(ectr(transport::ECtr::recv_refills), 0u);
  EXPECT_TRUE(io.frames.empty());              // no answer from b
  EXPECT_EQ(a.sh->state.load(), IBV_QPS_RTS);  // a is left alone
}

// Nothing posted: the refill finds nothing, and RC answers with an RNR NAK
// as before (9.7.5.2.8).
TEST_F(ShimServerTest, NoReceivePostedIsStillAnRnrNak) {
  auto [pd, cq, a, b] = connected_pair();
  Buf src = reg(pd, 4096);
  post(a, send_wqe(src, 8));
  run();
  EXPECT_GE(ectr(transport::ECtr::naks_rnr_tx), 1u);
  EXPECT_EQ(ectr(transport::ECtr::recv_refills), 0u);
  ibv_wc wc;
  EXPECT_FALSE(poll(cq, &wc));  // waiting for a receive (rnr_retry 7)
}

TEST_F(ShimServerTest, BadWqeCompletesInErrorAndCorruptIndexKillsOnlyThatQp) {
  open();
  const uint32_t pd = handle(call_raw(Op::kAllocPd, ""));
  Cq cq = create_cq(64);
  Qp a = create_qp(pd, cq.h), b = create_qp(pd, cq.h);
  Qp c = create_qp(pd, cq.h), d = create_qp(pd, cq.h);
  connect(a, b);
  connect(c, d);
  ShmSendWqe w{};
  w.wr_id = 5;
  w.opcode = 99;  // no such opcode
  w.send_flags = IBV_SEND_SIGNALED;
  post(a, w);
  run();
  ibv_wc wc;
  ASSERT_TRUE(poll(cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_LOC_QP_OP_ERR);
  EXPECT_EQ(wc.wr_id, 5u);
  EXPECT_EQ(a.sh->state.load(), IBV_QPS_ERR);
  EXPECT_EQ(a.sh->sq_done.load(), 1u);  // the slot is free again
  EXPECT_EQ(srv.counters().bad_wqes.load(), 1u);

  // A producer index no correct shim can write: the QP goes to error, the
  // service reads nothing past the ring.
  c.sh->sq_prod.store(c.sh->sq_size + 3);
  ring_doorbell(*db, c.doorbell);
  run();
  EXPECT_EQ(c.sh->state.load(), IBV_QPS_ERR);
  EXPECT_EQ(d.sh->state.load(), IBV_QPS_RTS);
  EXPECT_EQ(b.sh->state.load(), IBV_QPS_RTS);
}

// The ring sizes in the QP and SRQ headers are the application's memory: a
// client that rewrites them (and then a producer index that fits the forged
// size) must not move the service outside the rings it mapped. Before the
// service kept its own copy, this read ~1 M slots past a 16-slot ring.
TEST_F(ShimServerTest, AHostileRingHeaderCannotMoveTheServiceOutOfItsRings) {
  open();
  const uint32_t pd = handle(call_raw(Op::kAllocPd, ""));
  Cq cq = create_cq(64);
  Qp a = create_qp(pd, cq.h), b = create_qp(pd, cq.h);
  Qp c = create_qp(pd, cq.h), d = create_qp(pd, cq.h);
  connect(a, b);
  connect(c, d);
  const uint32_t real_sq = c.sh->sq_size;
  c.sh->sq_size = c.sh->rq_size = 1u << 30;
  c.sh->sq_offset = c.sh->rq_offset = 0;  // not read either
  c.sh->rq_prod.store(1u << 20);
  c.sh->sq_prod.store(1u << 20);
  ring_doorbell(*db, c.doorbell);
  Reply r = call(Op::kCreateSrq, CreateSrqReq{pd, 8, 1, 0});
  ASSERT_EQ(r.status, 0) << r.payload;
  const auto srep = r.as<CreateSrqRep>();
  auto* ssh = static_cast<SrqShared*>(map(r.fds.at(0), srep.map_len));
  ssh->size = 1u << 30;
  ssh->prod.store(1u << 20);
  ring_doorbell(*db, srep.doorbell);
  run();
  // Expect: the forged QP is in error, nothing was taken from its rings,
  // the SRQ took nothing, and the client's other QPs still work.
  EXPECT_EQ(c.sh->state.load(), IBV_QPS_ERR);
  EXPECT_EQ(c.sh->sq_done.load(), 0u);
  EXPECT_EQ(ssh->done.load(), 0u);
  EXPECT_GE(srv.counters().bad_wqes.load(), 2u);
  EXPECT_EQ(d.sh->state.load(), IBV_QPS_RTS);
  Buf src = reg(pd, 4096), dst = reg(pd, 4096);
  std::memset(src.p, 0x5a, 4096);
  // The shim's own view of the ring: the size it was given at create time.
  c.sh->sq_size = real_sq;
  post(a, write_wqe(src, dst, 4096));
  run();
  ibv_wc wc;
  std::vector<ibv_wc> got;
  while (poll(cq, &wc)) got.push_back(wc);
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got.back().status, IBV_WC_SUCCESS);
  EXPECT_EQ(got.back().qp_num, a.qpn);
  EXPECT_EQ(dst.p[4095], 0x5a);
}

TEST_F(ShimServerTest, ModifyToResetKeepsTheApplicationsIndices) {
  auto [pd, cq, a, b] = connected_pair();
  Buf src = reg(pd, 4096), dst = reg(pd, 4096);
  post(a, write_wqe(src, dst, 8));
  run();
  ibv_wc wc;
  ASSERT_TRUE(poll(cq, &wc));
  ASSERT_EQ(modify(a, IBV_QPS_RESET), 0);
  ASSERT_EQ(modify(b, IBV_QPS_RESET), 0);
  EXPECT_EQ(a.sh->sq_done.load(), a.sh->sq_prod.load());
  connect(a, b);
  src.p[0] = 0x5a;
  post(a, write_wqe(src, dst, 8));
  run();
  ASSERT_TRUE(poll(cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(dst.p[0], 0x5a);
  EXPECT_EQ(a.sh->sq_done.load(), 2u);
}

// A link change reaches every client as IBV_EVENT_PORT_ERR / PORT_ACTIVE
// for port 1 (rxe raises them; UCX listens for PORT_ERR).
TEST_F(ShimServerTest, LinkChangesAreAsyncPortEvents) {
  open();
  srv.port_event(false);
  srv.port_event(true);
  AsyncMsg m[2];
  for (AsyncMsg& x : m)
    ASSERT_EQ(recv(async_fd, &x, sizeof x, MSG_DONTWAIT),
              static_cast<ssize_t>(sizeof x));
  EXPECT_EQ(m[0].type, static_cast<uint32_t>(IBV_EVENT_PORT_ERR));
  EXPECT_EQ(m[0].handle, 1u);
  EXPECT_EQ(m[1].type, static_cast<uint32_t>(IBV_EVENT_PORT_ACTIVE));
  EXPECT_EQ(m[1].handle, 1u);
}

// An async event reaches the client that owns its object, with that
// client's handle, and no other client (both clients' handles start at 1);
// one raised just before its QP is destroyed is dropped, and counted.
TEST_F(ShimServerTest, AsyncEventsReachTheObjectsOwnerOnly) {
  auto next = [](int fd, AsyncMsg* m) {
    return recv(fd, m, sizeof *m, MSG_DONTWAIT) == sizeof *m;
  };
  // Per client: QPs on an SRQ.
  const ClientInfo a = ci;
  open();
  const std::vector<Qp> qa = srq_qps_in_init(2);
  const int a_fd = async_fd;
  ci.id = 8;
  const ClientInfo b = ci;
  open();
  const std::vector<Qp> qb = srq_qps_in_init(1);
  const int b_fd = async_fd;
  ASSERT_EQ(qa[0].h, qb[0].h);

  AsyncMsg m;
  ASSERT_EQ(modify(qb[0], IBV_QPS_ERR), 0);
  srv.pump_events();
  ASSERT_TRUE(next(b_fd, &m));
  EXPECT_EQ(m.type, static_cast<uint32_t>(IBV_EVENT_QP_LAST_WQE_REACHED));
  EXPECT_EQ(m.handle, qb[0].h);
  EXPECT_FALSE(next(a_fd, &m));

  ci = a;
  ASSERT_EQ(modify(qa[1], IBV_QPS_ERR), 0);
  srv.pump_events();
  ASSERT_TRUE(next(a_fd, &m));
  EXPECT_EQ(m.handle, qa[1].h);
  EXPECT_FALSE(next(a_fd, &m));
  EXPECT_FALSE(next(b_fd, &m));

  const uint64_t dropped = srv.counters().async_dropped.load();
  ASSERT_EQ(modify(qa[0], IBV_QPS_ERR), 0);
  ASSERT_EQ(call(Op::kDestroyQp, HandleReq{qa[0].h}).status, 0);
  srv.pump_events();
  EXPECT_FALSE(next(a_fd, &m));
  EXPECT_FALSE(next(b_fd, &m));
  EXPECT_EQ(srv.counters().async_dropped.load(), dropped + 1);
  srv.on_close(b);
  close(a_fd);
  close(b_fd);
}

// More events than the async socket holds (a flush of many QPs): none is
// lost. They wait in the service, in order, and go as the application
// reads; an event requeued by the shim goes before them; the events of a
// QP destroyed meanwhile leave with it.
TEST_F(ShimServerTest, AsyncEventsWaitForRoomInTheSocket) {
  open();
  constexpr int kQps = 600;  // the socket holds a few hundred
  std::vector<uint32_t> hs;
  for (const Qp& qp : srq_qps_in_init(kQps)) {
    hs.push_back(qp.h);
    ASSERT_EQ(modify(qp, IBV_QPS_ERR), 0);  // LAST_WQE_REACHED
  }
  srv.pump_events();
  std::vector<uint32_t> got;
  auto drain = [&] {
    AsyncMsg m;
    while (recv(async_fd, &m, sizeof m, MSG_DONTWAIT) == sizeof m) {
      EXPECT_EQ(m.type, static_cast<uint32_t>(IBV_EVENT_QP_LAST_WQE_REACHED));
      got.push_back(m.handle);
    }
  };
  const uint64_t deferred = srv.counters().async_deferred.load();
  ASSERT_GT(deferred, 0u) << "the socket took all " << kQps;
  // The shim requeues an event it drained (hs[0]'s, as after a destroy
  // of another object): it goes before every held one. The last QP is
  // destroyed: its held event goes with it.
  AsyncRequeueReq rq;
  rq.n = 1;
  rq.msgs[0] = {IBV_EVENT_QP_LAST_WQE_REACHED, hs[0]};
  ASSERT_EQ(call(Op::kAsyncRequeue, rq).status, 0);
  ASSERT_EQ(call(Op::kDestroyQp, HandleReq{hs.back()}).status, 0);
  drain();
  const size_t in_socket = got.size();
  ASSERT_EQ(in_socket, kQps - deferred);
  for (int i = 0; i < 100 && got.size() < kQps; ++i) {
    srv.pump_events();
    drain();
  }
  // Expect: every QP's event once, in order, hs[0]'s again right after
  // what the socket held, none for the destroyed QP, nothing dropped.
  ASSERT_EQ(got.size(), static_cast<size_t>(kQps)) << "1 requeued, 1 gone";
  EXPECT_EQ(got[in_socket], hs[0]);
  std::vector<uint32_t> want(hs.begin(), hs.end() - 1);
  want.insert(want.begin() + static_cast<ptrdiff_t>(in_socket), hs[0]);
  EXPECT_EQ(got, want);
  EXPECT_EQ(srv.counters().async_dropped.load(), 0u);
}

TEST_F(ShimServerTest, CompletionChannelIsSignalledOnlyWhenArmed) {
  open();
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK, 0, sv), 0);
  const uint32_t ch = handle(call(Op::kCreateChannel, 0, {sv[1]}));
  const uint32_t pd = handle(call_raw(Op::kAllocPd, ""));
  Cq cq = create_cq(16, ch);
  Qp a = create_qp(pd, cq.h), b = create_qp(pd, cq.h);
  connect(a, b);
  Buf src = reg(pd, 4096), dst = reg(pd, 4096);
  post(a, write_wqe(src, dst, 8));
  run();
  uint64_t h = 0;
  EXPECT_LT(recv(sv[0], &h, sizeof h, 0), 0);  // not armed: no event
  cq.sh->arm.store(kArmAll);
  post(a, write_wqe(src, dst, 8));
  run();
  ASSERT_EQ(recv(sv[0], &h, sizeof h, 0), 8);
  EXPECT_EQ(h, cq.h);
  EXPECT_EQ(cq.sh->arm.load(), 0u);  // one event per arm
  // The channel cannot go while a CQ uses it.
  EXPECT_EQ(call(Op::kDestroyChannel, HandleReq{ch}).status, -EBUSY);
  close(sv[0]);
}

TEST_F(ShimServerTest, ModifyQpRefusalSaysWhy) {
  open();
  const uint32_t pd = handle(call_raw(Op::kAllocPd, ""));
  Cq cq = create_cq(16);
  Qp a = create_qp(pd, cq.h);
  ModifyQpReq m;
  m.handle = a.h;
  m.mask = IBV_QP_STATE;
  m.attr.qp_state = IBV_QPS_RTS;  // RESET -> RTS is not a transition
  Reply r = call(Op::kModifyQp, m);
  EXPECT_EQ(r.status, -EINVAL);
  EXPECT_NE(r.payload.find("modify_qp refused: "), std::string::npos)
      << r.payload;
  EXPECT_GT(r.payload.size(), std::string("modify_qp refused: ").size());
  // A value over the device limit names it (perftest against rxe asks for
  // max_dest_rd_atomic 128).
  ASSERT_EQ(modify(a, IBV_QPS_INIT), 0);
  m.mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
           IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  m.attr.qp_state = IBV_QPS_RTR;
  m.attr.path_mtu = IBV_MTU_1024;
  m.attr.max_dest_rd_atomic = 128;
  m.attr.ah_attr.is_global = 1;
  m.attr.ah_attr.port_num = 1;
  std::memcpy(m.attr.ah_attr.grh.dgid.raw, dev.config().gids[0], 16);
  r = call(Op::kModifyQp, m);
  EXPECT_EQ(r.status, -EINVAL);
  EXPECT_NE(r.payload.find("rd_atomic"), std::string::npos) << r.payload;
}

// An AH refused says why, as a QP's AV does (qperf's UD tests make AHs
// without a GRH; they got "Invalid argument" and nothing else).
TEST_F(ShimServerTest, CreateAhRefusalSaysWhy) {
  open();
  const uint32_t pd = handle(call_raw(Op::kAllocPd, ""));
  CreateAhReq a;
  a.pd = pd;
  a.attr.port_num = 1;
  a.attr.dlid = 3;  // an InfiniBand AV: no GRH
  Reply r = call(Op::kCreateAh, a);
  EXPECT_EQ(r.status, -EINVAL);
  EXPECT_NE(r.payload.find("GRH"), std::string::npos) << r.payload;
  a.attr.is_global = 1;  // and a zero destination GID
  r = call(Op::kCreateAh, a);
  EXPECT_EQ(r.status, -EINVAL);
  EXPECT_NE(r.payload.find("dgid"), std::string::npos) << r.payload;
  std::memcpy(a.attr.grh.dgid.raw, dev.config().gids[0], 16);
  EXPECT_EQ(call(Op::kCreateAh, a).status, 0);  // its own GID: no ARP
}

// Two UD QPs in RTS (s sends to r), r's receives posted and rung, an AH
// for this device's own GID, and kMsgs sends of kLen bytes posted on s
// (rung, not served).
struct UdSends {
  static constexpr uint32_t kMsgs = 3, kLen = 100, kGrh = transport::kGrhSize,
                            kSlot = kLen + kGrh;
  ShimServerTest::Cq cq;
  ShimServerTest::Qp s, r;
  ShimServerTest::Buf src, dst;
  uint32_t ah;
};

UdSends ShimServerTest::ud_sends(uint32_t send_flags) {
  open();
  const uint32_t pd = handle(call_raw(Op::kAllocPd, ""));
  Cq cq = create_cq(64);
  Qp s = create_qp(pd, cq.h, IBV_QPT_UD), r = create_qp(pd, cq.h, IBV_QPT_UD);
  ud_to_rts(s);
  ud_to_rts(r);
  UdSends u{cq, s, r, reg(pd, 4096), reg(pd, 4096), 0};
  for (uint32_t i = 0; i < u.kMsgs; ++i) {
    ShmRecvWqe w{};
    w.wr_id = 100 + i;
    w.num_sge = 1;
    w.sge[0] = {reinterpret_cast<uint64_t>(u.dst.p + i * u.kSlot), u.kSlot,
                u.dst.lkey};
    r.rq[i] = w;
  }
  r.sh->rq_prod.store(u.kMsgs, std::memory_order_release);
  ring_doorbell(*db, r.doorbell);
  CreateAhReq a;
  a.pd = pd;
  a.attr.is_global = 1;
  a.attr.port_num = 1;
  std::memcpy(a.attr.grh.dgid.raw, dev.config().gids[0], 16);
  u.ah = handle(call(Op::kCreateAh, a));
  for (uint32_t i = 0; i < u.kMsgs; ++i) {
    std::memset(u.src.p + i * u.kLen, 'a' + i, u.kLen);
    ShmSendWqe w{};
    w.wr_id = i;
    w.opcode = IBV_WR_SEND;
    w.send_flags = send_flags;
    w.num_sge = 1;
    w.sge[0] = {reinterpret_cast<uint64_t>(u.src.p + i * u.kLen), u.kLen,
                u.src.lkey};
    w.ah = u.ah;
    w.remote_qpn = r.qpn;
    w.remote_qkey = 0x1234;
    post(s, w);
  }
  return u;
}

// r received every send of ud_sends, in order and intact; s's completions
// (if signaled) are returned.
std::vector<ibv_wc> ShimServerTest::ud_received(UdSends& u) {
  std::vector<ibv_wc> sent, got;
  for (ibv_wc wc; poll(u.cq, &wc);)
    (wc.qp_num == u.s.qpn ? sent : got).push_back(wc);
  EXPECT_EQ(got.size(), u.kMsgs);
  for (uint32_t i = 0; i < std::min<size_t>(got.size(), u.kMsgs); ++i) {
    EXPECT_EQ(got[i].status, IBV_WC_SUCCESS) << i;
    EXPECT_EQ(got[i].byte_len, u.kSlot) << i;
    EXPECT_EQ(std::memcmp(u.dst.p + i * u.kSlot + u.kGrh, u.src.p + i * u.kLen,
                          u.kLen),
              0)
        << i;
  }
  return sent;
}

// A UD send takes its AH's address when posted, as a NIC that writes the
// address vector into the WQE does (mlx5): destroying the AH right after
// the post loses nothing. mckey's sender posts its sends, leaves the group
// and destroys its AH without polling; its service used to find the AH
// gone when the lcore got to the ring (all 20 sends refused, bad_wqes).
TEST_F(ShimServerTest, AnAhDestroyedRightAfterThePostStillCarriesTheSends) {
  UdSends u = ud_sends(IBV_SEND_SIGNALED);
  // Destroyed before the lcore served the doorbell.
  ASSERT_EQ(call(Op::kDestroyAh, HandleReq{u.ah}).status, 0);
  EXPECT_EQ(dev.num_ahs(), 0u);
  run();
  const std::vector<ibv_wc> sent = ud_received(u);
  ASSERT_EQ(sent.size(), u.kMsgs);
  for (uint32_t i = 0; i < u.kMsgs; ++i) {
    EXPECT_EQ(sent[i].status, IBV_WC_SUCCESS) << i;
    EXPECT_EQ(sent[i].wr_id, i);
  }
  EXPECT_EQ(srv.counters().bad_wqes.load(), 0u);
  EXPECT_EQ(ectr(transport::ECtr::local_errors), 0u);
  // A handle already destroyed is still refused (nothing left to serve).
  EXPECT_EQ(call(Op::kDestroyAh, HandleReq{u.ah}).status, -EINVAL);
}

// Sends posted right before ibv_destroy_qp still leave, as on rxe (which
// sends a UD WQE within ibv_post_send) or a NIC: the lcore runs a pass for
// them before the QP goes. libfabric's ofi_rxd posts its last ACK and
// destroys the QP at once; its peer waited for that ACK for ever. The
// test's lcore runs a pass only when released from a park, so nothing
// else would have sent them.
TEST_F(ShimServerTest, SendsPostedRightBeforeTheDestroyStillLeave) {
  UdSends u = ud_sends(0);
  gates[0].set_running(true);
  std::atomic<bool> stop{false};
  std::thread lcore([&] {
    uint64_t t = now;
    while (!stop.load()) {
      if (!gates[0].check_st()) continue;
      uint32_t served = 0;
      srv.doorbells_st(0, &served);
      engines[0]->poll(t += 1000);
    }
  });
  EXPECT_EQ(call(Op::kDestroyQp, HandleReq{u.s.h}).status, 0);
  stop = true;
  lcore.join();
  gates[0].set_running(false);
  EXPECT_EQ(srv.counters().sends_at_destroy.load(), 1u);
  run();  // the frames reach r
  ud_received(u);
  // Nothing posted, nothing to wait for: no pass.
  EXPECT_EQ(call(Op::kDestroyQp, HandleReq{u.r.h}).status, 0);
  EXPECT_EQ(srv.counters().sends_at_destroy.load(), 1u);
}

// A controlled Q_Key (bit 31) needs CAP_NET_RAW, as Linux's uverbs asks:
// a client whose capabilities cannot be read and that is not root gets
// EPERM and the reason; an ordinary Q_Key is fine; root may.
class ShimServerQkeyTest : public ShimServerTest {
 protected:
  // Opens as `uid` (pid 0: no /proc entry to read) and moves a new UD QP
  // to INIT with `qkey`.
  Reply init_ud(uid_t uid, uint32_t qkey) {
    ci.uid = uid;
    ci.pid = 0;
    open();
    const uint32_t pd = handle(call_raw(Op::kAllocPd, ""));
    Cq cq = create_cq(16);
    Qp u = create_qp(pd, cq.h, IBV_QPT_UD);
    ModifyQpReq m;
    m.handle = u.h;
    m.mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
    m.attr.qp_state = IBV_QPS_INIT;
    m.attr.port_num = 1;
    m.attr.qkey = qkey;
    return call(Op::kModifyQp, m);
  }
};

TEST_F(ShimServerQkeyTest, AControlledQkeyNeedsCapNetRaw) {
  const Reply r = init_ud(1000, 0x80010000);
  EXPECT_EQ(r.status, -EPERM);
  EXPECT_NE(r.payload.find("CAP_NET_RAW"), std::string::npos) << r.payload;
}

TEST_F(ShimServerQkeyTest, AnOrdinaryQkeyNeedsNothing) {
  EXPECT_EQ(init_ud(1000, 0x11111111).status, 0);
}

TEST_F(ShimServerQkeyTest, RootMaySetAControlledQkey) {
  EXPECT_EQ(init_ud(0, 0x80010000).status, 0);
}

TEST_F(ShimServerTest, RefusesForeignHandlesAndUnsealedMemory) {
  open();
  const uint32_t pd = handle(call_raw(Op::kAllocPd, ""));
  Cq cq = create_cq(16);
  CreateQpReq q = qp_req(pd, cq.h);
  q.recv_cq = 12345;  // not ours
  EXPECT_EQ(call(Op::kCreateQp, q).status, -EINVAL);
  Buf loose = reg(pd, 4096, /*seal=*/false);
  EXPECT_EQ(loose.h, 0u);  // could be shrunk under the service: refused
  EXPECT_EQ(call(Op::kDeallocPd, HandleReq{pd + 100}).status, -EINVAL);
  // A PD in use cannot go.
  Buf b = reg(pd, 4096);
  ASSERT_NE(b.h, 0u);
  EXPECT_EQ(call(Op::kDeallocPd, HandleReq{pd}).status, -EBUSY);
  // A memory window of a type verbs does not have, or on another's PD.
  EXPECT_EQ(call(Op::kAllocMw, AllocMwReq{pd, 99}).status, -EINVAL);
  EXPECT_EQ(call(Op::kAllocMw, AllocMwReq{pd + 100, IBV_MW_TYPE_2}).status,
            -EINVAL);
  EXPECT_EQ(call(Op::kAllocMw, AllocMwReq{pd, IBV_MW_TYPE_2}).status, 0);
}

// ibv_create_srq(3): srq_limit is irrelevant at creation (mlx5 and rxe
// ignore it): any value is accepted and no limit is armed; ibv_modify_srq
// arms one.
TEST_F(ShimServerTest, CreateSrqIgnoresTheLimit) {
  open();
  const uint32_t pd = handle(call_raw(Op::kAllocPd, ""));
  for (const uint32_t limit : {0u, 4u, 100u, UINT32_MAX}) {
    Reply r = call(Op::kCreateSrq, CreateSrqReq{pd, 16, 1, limit});
    ASSERT_EQ(r.status, 0) << limit << ": " << r.payload;
    const uint32_t h = r.as<CreateSrqRep>().handle;
    Reply q = call(Op::kQuerySrq, HandleReq{h});
    ASSERT_EQ(q.status, 0) << q.payload;
    EXPECT_EQ(q.as<ibv_srq_attr>().srq_limit, 0u) << limit;
    EXPECT_GE(q.as<ibv_srq_attr>().max_wr, 16u);
    EXPECT_EQ(call(Op::kDestroySrq, HandleReq{h}).status, 0);
  }
  // What create checks is still checked.
  EXPECT_EQ(call(Op::kCreateSrq, CreateSrqReq{pd, 0, 1, 0}).status, -EINVAL);
}

TEST_F(ShimServerTest, ClosingTheClientReleasesEverything) {
  open();
  const uint32_t pd = handle(call_raw(Op::kAllocPd, ""));
  Cq cq = create_cq(16);
  Qp a = create_qp(pd, cq.h), b = create_qp(pd, cq.h);
  connect(a, b);
  ASSERT_NE(reg(pd, 4096).h, 0u);
  CreateSrqReq s{pd, 8, 1, 0};
  EXPECT_EQ(call(Op::kCreateSrq, s).status, 0);
  EXPECT_EQ(srv.qp_count(), 2u);
  EXPECT_EQ(dev.num_mrs(), 1u);
  srv.on_close(ci);
  EXPECT_EQ(srv.qp_count(), 0u);
  EXPECT_EQ(dev.num_mrs(), 0u);
  EXPECT_EQ(dev.num_cqs(), 0u);
  EXPECT_EQ(dev.num_srqs(), 0u);
  EXPECT_EQ(dev.num_pds(), 0u);
  EXPECT_EQ(srv.counters().clients_closed.load(), 1u);
}

// ibv_attach_mcast / ibv_detach_mcast through the service: a UD QP joins,
// a refusal says why, a QP still attached cannot be destroyed (EBUSY, as
// the kernel's uverbs says), and a client that dies leaves its groups.
TEST_F(ShimServerTest, MulticastAttachDetachAndDestroy) {
  open();
  const uint32_t pd = handle(call_raw(Op::kAllocPd, ""));
  Cq cq = create_cq(16);
  Qp u = create_qp(pd, cq.h, IBV_QPT_UD);
  Qp rc = create_qp(pd, cq.h);
  McastReq m;
  m.qp = u.h;
  wire::gid_from_ipv4(0xef010101, m.gid);  // 239.1.1.1
  EXPECT_EQ(call(Op::kAttachMcast, m).status, 0);
  EXPECT_EQ(call(Op::kAttachMcast, m).status, 0);  // again: one membership
  EXPECT_EQ(dev.mcast_attached(), 1u);
  EXPECT_TRUE(dev.mcast_group(m.gid));
  McastReq bad = m;
  bad.qp = rc.h;
  Reply r = call(Op::kAttachMcast, bad);
  EXPECT_EQ(r.status, -EINVAL);
  EXPECT_NE(r.payload.find("UD"), std::string::npos) << r.payload;
  bad.qp = 999;  // not the client's
  EXPECT_EQ(call(Op::kAttachMcast, bad).status, -EINVAL);
  r = call(Op::kDestroyQp, HandleReq{u.h});
  EXPECT_EQ(r.status, -EBUSY);
  EXPECT_NE(r.payload.find("ibv_detach_mcast"), std::string::npos) << r.payload;
  EXPECT_EQ(call(Op::kDetachMcast, m).status, 0);
  r = call(Op::kDetachMcast, m);
  EXPECT_EQ(r.status, -EINVAL);
  EXPECT_NE(r.payload.find("not attached"), std::string::npos) << r.payload;
  EXPECT_EQ(call(Op::kDestroyQp, HandleReq{u.h}).status, 0);
  EXPECT_EQ(dev.mcast_attached(), 0u);
  // Attached when the client goes: out of the group with its QP.
  Qp v = create_qp(pd, cq.h, IBV_QPT_UD);
  m.qp = v.h;
  EXPECT_EQ(call(Op::kAttachMcast, m).status, 0);
  srv.on_close(ci);
  EXPECT_EQ(dev.mcast_attached(), 0u);
  EXPECT_EQ(dev.mcast_groups(), 0u);
  EXPECT_FALSE(dev.mcast_group(m.gid));
  // The service was told when the group got its first member and lost
  // its last (IGMP report, leave): by the detach, then by the close.
  EXPECT_EQ(group_changes, (std::vector<std::string>{"1+", "1-", "1+", "1-"}));
}

// Of the QP create flags only BLOCK_SELF_MCAST_LB is taken (mckey -l).
TEST_F(ShimServerTest, CreateFlagsOnlyBlockSelfMcastLoopback) {
  open();
  const uint32_t pd = handle(call_raw(Op::kAllocPd, ""));
  Cq cq = create_cq(16);
  CreateQpReq q = qp_req(pd, cq.h, IBV_QPT_UD);
  q.create_flags = IBV_QP_CREATE_SCATTER_FCS;
  Reply r = call(Op::kCreateQp, q);
  EXPECT_EQ(r.status, -EOPNOTSUPP);
  EXPECT_NE(r.payload.find("BLOCK_SELF_MCAST_LB"), std::string::npos)
      << r.payload;
  q.create_flags = IBV_QP_CREATE_BLOCK_SELF_MCAST_LB;
  r = call(Op::kCreateQp, q);
  ASSERT_EQ(r.status, 0) << r.payload;
  for (int fd : r.fds) close(fd);
  uint32_t blocked = 0;
  for (auto& e : engines)
    e->for_each_qp(
        [&](const transport::Qp& qp) { blocked += qp.block_mcast_lb_; });
  EXPECT_EQ(blocked, 1u);
}

// Zero-copy memory of a PCI port whose DMA mapping (pinning) takes until
// let_go(): as with a large MR on vfio.
struct SlowDma final : TxMemory {
  bool dma_is_slow() const override { return true; }
  // As ZeroCopyTx's DmaThread: the mapping runs elsewhere, the future
  // tells.
  std::future<int> map_dma(void*, size_t) override {
    started.fetch_add(1);
    return std::async(std::launch::async, [this] {
      std::unique_lock l(mu);
      cv.wait(l, [&] { return released; });
      return 0;
    });
  }
  bool map(void* base, size_t, int dma_error) override {
    ++maps;
    if (dma_error) return false;
    live.insert(base);
    return true;
  }
  void add(void*, size_t) override { ++adds; }
  void remove(void* base) override { live.erase(base); }
  bool busy(void*) override { return false; }
  void let_go() {
    {
      std::lock_guard l(mu);
      released = true;
    }
    cv.notify_all();
  }
  std::mutex mu;
  std::condition_variable cv;
  bool released = false;
  std::atomic<int> started{0};
  std::set<void*> live;  // DMA-mapped views map() took over, not removed
  int maps = 0;
  int adds = 0;
};

// First base: it outlives the ShimServer that points at it.
struct SlowDmaHolder {
  SlowDma slow;
};
struct ShimServerSlowDmaTest : SlowDmaHolder, ShimServerTest {
  ShimServerSlowDmaTest() : ShimServerTest({}, 1, &slow) {}
  ~ShimServerSlowDmaTest() override { slow.let_go(); }  // before srv goes
  // A kRegMr of `len` fresh sealed bytes, asked as ControlServer asks a
  // deferred request: the same bytes and fds, attempt by attempt.
  struct Pending {
    RegMrReq r{};
    std::string body;
    std::vector<int> fds;
    uint32_t attempt = 0;
  };
  Pending start_reg(uint32_t pd, size_t len) {
    Pending p;
    const int fd = memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(len)), 0);
    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK);
    auto* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    maps.push_back({m, len});
    p.r.pd = pd;
    p.r.access = kRemoteAll;
    p.r.addr = p.r.iova = p.r.map_start = reinterpret_cast<uint64_t>(m);
    p.r.length = p.r.map_len = len;
    p.r.npieces = 1;
    p.r.pieces[0] = {0, len};
    p.body.assign(reinterpret_cast<const char*>(&p.r), sizeof p.r);
    p.fds = {fd};
    return p;
  }
  CtlReply ask(Pending& p) {
    CtlRequest req{&ci, static_cast<ctl::Op>(Op::kRegMr), p.body, p.fds};
    req.attempt = p.attempt++;
    CtlReply rep;
    srv.handle(req, rep);
    return rep;
  }
  void done(Pending& p) {
    for (int fd : p.fds)
      if (fd >= 0) close(fd);
    p.fds.clear();
  }
  // Runs f as another client (`id`), opened first.
  template <typename F>
  void as_client(uint64_t id, F f) {
    const ClientInfo mine = ci;
    ci.id = id;
    if (!opened.count(id)) {
      opened.insert(id);
      int sv[2];
      ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
      others_fds.push_back(sv[0]);
      Reply r = call(Op::kOpen, OpenReq{}, {sv[1]});
      ASSERT_EQ(r.status, 0) << r.payload;
      for (int fd : r.fds) close(fd);
    }
    f();
    ci = mine;
  }
  std::set<uint64_t> opened;
  std::vector<int> others_fds;
};

// Pinning a large MR for a PCI port's DMA used to hold the control thread,
// and so every client, for as long: now the registration is deferred while
// its pages are mapped on another thread, and the control thread serves on.
TEST_F(ShimServerSlowDmaTest,
       ARegistrationWaitsForItsDmaMappingOffTheControlThread) {
  open();
  const uint32_t pd = handle(call_raw(Op::kAllocPd, ""));
  Pending p = start_reg(pd, 4 * 4096);
  CtlReply rep = ask(p);  // returns although the mapping cannot finish
  EXPECT_TRUE(rep.later);
  EXPECT_EQ(rep.status, 0);
  // The memfd went with the first attempt (the view holds the memory): a
  // few clients waiting must not hold the service's descriptors.
  EXPECT_EQ(p.fds.at(0), -1);
  for (int i = 0; i < 500 && slow.started.load() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(slow.started.load(), 1);
  EXPECT_TRUE(ask(p).later);  // still mapping
  EXPECT_EQ(dev.num_mrs(), 0u);
  // Another registration body from the same client is not mixed with it.
  Pending other = start_reg(pd, 4096);
  CtlReply busy = ask(other);
  EXPECT_FALSE(busy.later);
  EXPECT_EQ(busy.status, -EBUSY) << busy.payload;
  done(other);

  slow.let_go();
  for (int i = 0; i < 500 && rep.later; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    rep = ask(p);
  }
  done(p);
  ASSERT_FALSE(rep.later);
  ASSERT_EQ(rep.status, 0) << rep.payload;
  Reply r{rep.status, rep.payload, rep.fds};
  const auto m = r.as<RegMrRep>();
  EXPECT_NE(m.lkey, 0u);
  EXPECT_EQ(dev.num_mrs(), 1u);
  EXPECT_EQ(slow.started.load(), 1);  // mapped once, not per attempt
  EXPECT_EQ(slow.live.size(), 1u);
  EXPECT_EQ(slow.adds, 1);
  EXPECT_EQ(call(Op::kDeregMr, HandleReq{m.handle}).status, 0);
  EXPECT_TRUE(slow.live.empty());
  EXPECT_EQ(dev.num_mrs(), 0u);
}

// At most four pinnings run at once; the others wait their turn, and all
// complete once the mappings can.
TEST_F(ShimServerSlowDmaTest, AtMostFourMappingsRunAndTheRestQueue) {
  std::vector<Pending> ps(6);
  for (uint64_t i = 0; i < ps.size(); ++i)
    as_client(100 + i, [&] {
      const uint32_t pd = handle(call_raw(Op::kAllocPd, ""));
      ps[i] = start_reg(pd, 4096);
      EXPECT_TRUE(ask(ps[i]).later);
    });
  for (int i = 0; i < 200 && slow.started.load() < 4; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(slow.started.load(), 4);
  slow.let_go();
  size_t registered = 0;
  for (int round = 0; round < 1000 && registered < ps.size(); ++round) {
    registered = 0;
    for (uint64_t i = 0; i < ps.size(); ++i) {
      if (ps[i].fds.empty()) {  // answered
        ++registered;
        continue;
      }
      as_client(100 + i, [&] {
        CtlReply rep = ask(ps[i]);
        if (!rep.later) {
          EXPECT_EQ(rep.status, 0) << rep.payload;
          done(ps[i]);
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(registered, ps.size());
  EXPECT_EQ(slow.started.load(), 6);
  EXPECT_EQ(dev.num_mrs(), 6u);
  for (uint64_t i = 0; i < ps.size(); ++i)
    as_client(100 + i, [&] { srv.on_close(ci); });
  for (int fd : others_fds) close(fd);
  EXPECT_TRUE(slow.live.empty());
}

// A view larger than the pages of the registered range is refused: on a
// PCI port the view is what gets pinned.
TEST_F(ShimServerSlowDmaTest, AViewBeyondTheRangesPagesIsRefused) {
  open();
  const uint32_t pd = handle(call_raw(Op::kAllocPd, ""));
  Pending p = start_reg(pd, 4 * 4096);
  p.r.length = 100;  // one page's worth, four pages mapped
  p.body.assign(reinterpret_cast<const char*>(&p.r), sizeof p.r);
  CtlReply rep = ask(p);
  EXPECT_FALSE(rep.later);
  EXPECT_EQ(rep.status, -EINVAL);
  EXPECT_NE(rep.payload.find("more than the registered range"),
            std::string::npos)
      << rep.payload;
  EXPECT_EQ(slow.started.load(), 0);
  done(p);
}

// A client that goes while its MR is being mapped: the mapping is finished
// and given back once it is done; nothing is registered.
TEST_F(ShimServerSlowDmaTest, AClientThatGoesMidMappingLeavesNothingMapped) {
  open();
  const uint32_t pd = handle(call_raw(Op::kAllocPd, ""));
  Pending p = start_reg(pd, 4096);
  EXPECT_TRUE(ask(p).later);
  srv.on_close(ci);
  done(p);
  EXPECT_EQ(dev.num_pds(), 0u);
  srv.pump_events();  // the mapping is not done: it stays pending
  EXPECT_EQ(slow.maps, 0);
  slow.let_go();
  for (int i = 0; i < 1000 && slow.maps == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    srv.pump_events();
  }
  EXPECT_EQ(slow.started.load(), 1);
  EXPECT_EQ(slow.maps, 1);
  EXPECT_TRUE(slow.live.empty());
  EXPECT_EQ(slow.adds, 0);
  EXPECT_EQ(dev.num_mrs(), 0u);
}

// Per-client limits (config client_limits): the object over the limit is
// refused with ENOMEM and a message naming the limit, counted; what is
// destroyed is given back; nothing else changes.
struct ShimServerLimitTest : ShimServerTest {
  static config::ClientLimitsConfig tight() {
    config::ClientLimitsConfig l;
    l.max_pd = 1;
    l.max_cq = 2;
    l.max_qp = 2;
    l.max_mr = 2;
    l.max_mr_bytes = 3 * 4096;
    l.max_srq = 1;
    l.max_wr = 16 + 16 + 16 + 16 + 8;  // two QPs of create_qp() and an SRQ
    return l;
  }
  ShimServerLimitTest() : ShimServerTest(tight()) {}
  uint64_t refusals() const {
    return srv.counters().client_limit_refusals.load();
  }
};

TEST_F(ShimServerLimitTest, EachLimitRefusesWithEnomemAndGivesBackOnDestroy) {
  open();
  const uint32_t pd = handle(call_raw(Op::kAllocPd, ""));
  Reply r = call_raw(Op::kAllocPd, "");
  EXPECT_EQ(r.status, -ENOMEM);
  EXPECT_NE(r.payload.find("client_limits.max_pd is 1"), std::string::npos)
      << r.payload;
  EXPECT_EQ(refusals(), 1u);

  Cq cq = create_cq(16);
  create_cq(16);
  EXPECT_EQ(call(Op::kCreateCq, CreateCqReq{16, kNoHandle}).status, -ENOMEM);

  // MRs: two of 4 KiB fit; a third MR is over max_mr, 8 KiB more over
  // max_mr_bytes; after a dereg the bytes are back.
  Buf m1 = reg(pd, 4096);
  ASSERT_NE(m1.h, 0u);
  Reply big = reg_reply(pd, 3 * 4096);
  EXPECT_EQ(big.status, -ENOMEM);
  EXPECT_NE(big.payload.find("max_mr_bytes"), std::string::npos) << big.payload;
  ASSERT_NE(reg(pd, 4096).h, 0u);
  EXPECT_EQ(reg_reply(pd, 4096).status, -ENOMEM);  // max_mr
  EXPECT_EQ(call(Op::kDeregMr, HandleReq{m1.h}).status, 0);
  ASSERT_NE(reg(pd, 8192).h, 0u);  // 4 KiB + 8 KiB <= 12 KiB

  // QPs and work requests: two QPs of 16 + 16, then an SRQ of 8 fits
  // max_wr exactly; a third QP is over max_qp, an SRQ of 1 more over
  // max_wr (and max_srq).
  Qp a = create_qp(pd, cq.h);
  Qp b = create_qp(pd, cq.h);
  CreateSrqReq s{pd, 8, 1, 0};
  Reply sr = call(Op::kCreateSrq, s);
  ASSERT_EQ(sr.status, 0) << sr.payload;
  const CreateQpReq q = qp_req(pd, cq.h, IBV_QPT_RC, 1);
  r = call(Op::kCreateQp, q);
  EXPECT_EQ(r.status, -ENOMEM);
  EXPECT_NE(r.payload.find("max_qp"), std::string::npos) << r.payload;
  EXPECT_EQ(call(Op::kCreateSrq, CreateSrqReq{pd, 1, 1, 0}).status, -ENOMEM);
  // Destroying a QP gives back its slot and its 32 WRs.
  EXPECT_EQ(call(Op::kDestroyQp, HandleReq{a.h}).status, 0);
  r = call(Op::kCreateQp, q);
  EXPECT_EQ(r.status, 0) << r.payload;
  EXPECT_EQ(srv.qp_count(), 2u);
  (void)b;
  // pd, cq, MR bytes, MR count, QP count, SRQ: six refusals.
  EXPECT_EQ(refusals(), 6u);
}

// Two worker lcores (homes), as urnicd with two queues: QPs are spread
// over both engines, each lcore serves only its own QPs' doorbells, a CQ
// shared by QPs of both gets every completion, and QPs of an SRQ live with
// it (one lcore takes its WQEs).
struct ShimServerTwoHomesTest : ShimServerTest {
  ShimServerTwoHomesTest() : ShimServerTest({}, 2) {}
  uint32_t home(uint32_t qpn) const { return engines[0]->home_of(qpn); }
};

TEST_F(ShimServerTwoHomesTest, QpsSpreadAndTalkAcrossEnginesThroughOneCq) {
  open();
  const uint32_t pd = handle(call_raw(Op::kAllocPd, ""));
  Cq cq = create_cq(64);
  Qp a = create_qp(pd, cq.h), b = create_qp(pd, cq.h);
  Qp c = create_qp(pd, cq.h), d = create_qp(pd, cq.h);
  EXPECT_EQ(engines[0]->qp_count(), 2u);
  EXPECT_EQ(engines[1]->qp_count(), 2u);
  EXPECT_NE(home(a.qpn), home(b.qpn));
  EXPECT_NE(home(c.qpn), home(d.qpn));
  // Each engine finds only its own QPs: a frame is run where it belongs.
  for (const Qp* q : {&a, &b, &c, &d}) {
    EXPECT_NE(engines[home(q->qpn)]->find_qp(q->qpn), nullptr);
    EXPECT_EQ(engines[home(q->qpn) ^ 1]->find_qp(q->qpn), nullptr);
  }
  connect(a, b);
  connect(c, d);
  Buf src = reg(pd, 1 << 16), dst = reg(pd, 1 << 16);
  for (size_t i = 0; i < (1 << 16); ++i)
    src.p[i] = static_cast<uint8_t>(i * 13);
  // a (one home) writes the first half into b's memory, d (the other)
  // the second half into c's: completions of both homes in one CQ.
  for (int i = 0; i < 8; ++i) {
    ShmSendWqe w = write_wqe(src, dst, 4096);
    w.sge[0].addr += i * 4096;
    w.remote_addr += i * 4096;
    w.wr_id = 100 + i;
    post(a, w);
    w.sge[0].addr += 32768;
    w.remote_addr += 32768;
    w.wr_id = 200 + i;
    post(d, w);
  }
  run();
  std::vector<uint64_t> from_a, from_d;
  ibv_wc wc;
  while (poll(cq, &wc)) {
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    (wc.qp_num == a.qpn ? from_a : from_d).push_back(wc.wr_id);
  }
  ASSERT_EQ(from_a.size(), 8u);
  ASSERT_EQ(from_d.size(), 8u);
  for (int i = 0; i < 8; ++i) {  // in order per QP, none lost or doubled
    EXPECT_EQ(from_a[i], 100u + i);
    EXPECT_EQ(from_d[i], 200u + i);
  }
  EXPECT_EQ(std::memcmp(src.p, dst.p, 1 << 16), 0);
  EXPECT_GT(engines[0]->counters().get(transport::ECtr::tx_packets), 0u);
  EXPECT_GT(engines[1]->counters().get(transport::ECtr::tx_packets), 0u);
}

TEST_F(ShimServerTwoHomesTest, EachLcoreServesOnlyItsOwnDoorbells) {
  auto [pd, cq, a, b] = connected_pair();
  Buf src = reg(pd, 4096), dst = reg(pd, 4096);
  post(a, write_wqe(src, dst, 100));
  const uint32_t other = home(a.qpn) ^ 1;
  uint32_t r = 0;
  EXPECT_EQ(srv.doorbells_st(other, &r), 0u);  // not its QP: left rung
  EXPECT_EQ(r, 0u);
  EXPECT_NE(db->pending.load(), 0u);
  EXPECT_EQ(srv.doorbells_st(home(a.qpn), &r), 1u);
  EXPECT_EQ(r, 1u);
  EXPECT_EQ(db->pending.load(), 0u);
  run();
  ibv_wc wc;
  ASSERT_TRUE(poll(cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
}

TEST_F(ShimServerTwoHomesTest, QpsOfAnSrqLiveWithIt) {
  open();
  const uint32_t pd = handle(call_raw(Op::kAllocPd, ""));
  Cq cq = create_cq(64);
  // One QP first, so that the SRQ's home is not simply engine 0's turn.
  Qp first = create_qp(pd, cq.h);
  Reply sr = call(Op::kCreateSrq, CreateSrqReq{pd, 8, 1, 0});
  ASSERT_EQ(sr.status, 0) << sr.payload;
  const uint32_t srq = sr.as<CreateSrqRep>().handle;
  std::vector<uint32_t> homes;
  for (int i = 0; i < 4; ++i) {
    CreateQpReq q;
    q.pd = pd;
    q.send_cq = q.recv_cq = cq.h;
    q.srq = srq;
    q.cap.max_send_wr = 4;
    q.cap.max_send_sge = 1;
    Reply r = call(Op::kCreateQp, q);
    ASSERT_EQ(r.status, 0) << r.payload;
    homes.push_back(home(r.as<CreateQpRep>().qpn));
  }
  for (uint32_t h : homes) EXPECT_EQ(h, homes[0]);
  EXPECT_NE(homes[0], home(first.qpn));  // the SRQ went to the emptier one
}

}  // namespace
}  // namespace urnic::service
