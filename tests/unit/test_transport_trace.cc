// Protocol traces of the transport engine (dataplane/transport), one test per
// rule of BEHAVIOUR.md / IBTA vol. 1 ch. 9. The test plays the peer: it
// crafts frames with wire::encode_frame and hands them to engine.rx(), and it
// reads back everything the QP under test transmits through a capturing
// PacketIo. Time is virtual (ns passed to rx/poll). Each test reads as a
// trace: what is posted or injected, then `// Expect:` what goes on the wire
// and into the CQs.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "dataplane/transport/engine.h"
#include "dataplane/transport/psn.h"
#include "dataplane/wire/codec.h"
#include "tests/support/engine_host.h"

namespace urnic::transport {
namespace {

namespace op = wire::opcode;

constexpr wire::MacAddr kOurMac{{0x02, 0x00, 0x00, 0x00, 0x00, 0x01}};
constexpr wire::MacAddr kPeerMac{{0x02, 0x00, 0x00, 0x00, 0x00, 0x02}};
constexpr uint32_t kOurIp = 0x0a000001;    // 10.0.0.1
constexpr uint32_t kPeerIp = 0x0a000002;   // 10.0.0.2
constexpr uint32_t kGroupIp = 0xef010101;  // 239.1.1.1
constexpr uint32_t kPeerQpn = 0x0abcde;
constexpr uint64_t kPeerVa = 0x00007f0000001000;  // the peer's memory
constexpr uint32_t kPeerRkey = 0x00c0ffee;
constexpr uint32_t kSqPsn = 0x000100;  // our requester's first PSN
constexpr uint32_t kRqPsn = 0x000500;  // our responder's first ePSN

// AETH syndromes (IBTA 9.3.5, table 43).
constexpr uint8_t kAck = 0x1f;  // ACK with credits 0x1f ("invalid")
constexpr uint8_t kRnrNak = 0x20;
constexpr uint8_t kNakSeq = 0x60;
constexpr uint8_t kNakInvReq = 0x61;
constexpr uint8_t kNakRemAccess = 0x62;

constexpr uint64_t kUs = 1000;
constexpr uint64_t kMs = 1000 * kUs;
// Timers may fire up to a timer-wheel tick late, never early.
constexpr uint64_t kSlack = 50 * kUs;
constexpr uint32_t kMemSize = 1 << 20;
constexpr unsigned kAllAccess =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
    IBV_ACCESS_REMOTE_ATOMIC;

// Local ACK timeout: 4.096 us * 2^t (IBTA 9.7.6.1.3).
constexpr uint64_t ack_timeout_ns(uint8_t t) {
  return uint64_t{4096} << t;
}

// IBTA table 45: RNR NAK timer field -> minimum wait, in microseconds.
constexpr uint64_t kRnrTableUs[32] = {
    655360, 10,    20,    30,     40,     60,     80,     120,
    160,    240,   320,   480,    640,    960,    1280,   1920,
    2560,   3840,  5120,  7680,   10240,  15360,  20480,  30720,
    40960,  61440, 81920, 122880, 163840, 245760, 327680, 491520};
constexpr uint64_t rnr_wait_ns(uint8_t code) {
  return kRnrTableUs[code & 31] * kUs;
}

// One transmitted packet, decoded.
struct Pkt {
  wire::RoceFields f;
  std::vector<uint8_t> payload;
};

std::string dump(const std::vector<Pkt>& pkts) {
  std::ostringstream os;
  os << pkts.size() << " packet(s):";
  for (const Pkt& p : pkts) {
    const wire::OpcodeInfo& i = wire::opcode_info(p.f.opcode);
    os << "\n  " << (i.valid() ? i.name : "?") << std::hex << " psn=0x"
       << p.f.psn << " dqpn=0x" << p.f.dqpn << std::dec
       << " ackreq=" << p.f.ack_req << " len=" << p.payload.size();
    if (i.has_ext(wire::Ext::kReth))
      os << std::hex << " reth(va=0x" << p.f.reth_va << " rkey=0x"
         << p.f.reth_rkey << std::dec << " len=" << p.f.reth_len << ")";
    if (i.has_ext(wire::Ext::kAeth))
      os << std::hex << " aeth(syn=0x" << unsigned{p.f.aeth_syndrome}
         << " msn=0x" << p.f.aeth_msn << ")" << std::dec;
  }
  return os.str();
}

std::vector<uint8_t> pattern(uint32_t len, uint8_t seed) {
  std::vector<uint8_t> v(len);
  for (uint32_t i = 0; i < len; ++i)
    v[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 8));
  return v;
}

std::vector<uint8_t> slice(const std::vector<uint8_t>& v, size_t off,
                           size_t len) {
  return {v.begin() + off, v.begin() + off + len};
}

class TestResolver : public Resolver {
 public:
  int resolve(const uint8_t dgid[16], wire::MacAddr* mac) override {
    uint8_t peer[16];
    wire::gid_from_ipv4(kPeerIp, peer);
    if (std::memcmp(dgid, peer, 16) != 0) return EHOSTUNREACH;
    *mac = kPeerMac;
    return 0;
  }
};

class CaptureIo : public PacketIo {
 public:
  bool transmit(const TxFrame& f) override {
    if (room == 0) return false;  // TX queue full
    if (room > 0) --room;
    std::vector<uint8_t> b(f.frame_len());
    EXPECT_EQ(f.copy_to(b.data()), b.size());
    frames.push_back(std::move(b));
    loop_to_members.push_back(f.loop_to_members);
    return true;
  }
  std::vector<std::vector<uint8_t>> frames;
  std::vector<bool> loop_to_members;  // TxFrame's, per frame
  int64_t room = -1;  // frames the TX queue still takes; -1: unlimited
};

struct QpOpts {
  uint8_t timeout = 14;  // 67 ms: out of the way unless a test wants it
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;
  uint8_t min_rnr_timer = 12;  // 0.64 ms
  uint8_t max_rd_atomic = 16;
  uint8_t max_dest_rd_atomic = 16;
  unsigned access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                    IBV_ACCESS_REMOTE_ATOMIC;
  uint32_t qkey = 0x11111111;  // UD
  ibv_qp_state until = IBV_QPS_RTS;
  uint32_t max_send_wr = 128;
  Cq* send_cq = nullptr;  // default: the fixture's scq_
  Srq* srq = nullptr;
};

class TransportTrace : public ::testing::Test {
 protected:
  void SetUp() override {
    mem_.reset(new uint8_t[kMemSize]);
    std::memset(mem_.get(), 0, kMemSize);
    DeviceConfig cfg;
    cfg.mac = kOurMac;
    wire::gid_from_ipv4(kOurIp, cfg.gids[0]);
    cfg.num_gids = 1;
    cfg.key_seed = 0x5eed;
    dev_ = std::make_unique<Device>(cfg, &resolver_);
    // The congestion window off: these traces pin the IBTA wire behaviour
    // with max_unacked as the only limit; the window has its own traces.
    engine_ = std::make_unique<Engine>(*dev_, io_, no_cc(), 0);
    ASSERT_EQ(dev_->alloc_pd(&pd_), 0);
    ASSERT_EQ(
        dev_->reg_mr(pd_, mem_.get(), kMemSize, addr(0), kAllAccess, &mr_), 0);
    ASSERT_EQ(dev_->create_cq(256, &scq_), 0);
    ASSERT_EQ(dev_->create_cq(256, &rcq_), 0);
  }

  // --- set-up -------------------------------------------------------------

  static EngineConfig no_cc() {
    EngineConfig ec;
    ec.cc.window = false;
    ec.tail_probe_ns = 0;  // the timeout traces pin IBTA's timer alone
    return ec;
  }
  // The tail-loss probe traces: no_cc() with a 200 us probe floor.
  static EngineConfig with_probe() {
    EngineConfig ec = no_cc();
    ec.tail_probe_ns = 200 * 1000;
    return ec;
  }
  // As if the QP had timed one round trip of `ns` (RFC 6298 2.2): the
  // tail-loss probe waits for a first sample.
  void measured_rtt(uint64_t ns) {
    qp_->srtt_ns_ = ns;
    qp_->rttvar_ns_ = ns / 2;
  }
  // A READ of `remote` (4 KiB, four responses) into 0x20000 at time 0,
  // whose FIRST (P) and MIDDLE (P+1) responses arrive at 10 us; P+2 and
  // P+3 are lost.
  void read_half_answered(const std::vector<uint8_t>& remote) {
    ASSERT_EQ(post(rdma(1, IBV_WR_RDMA_READ, {sge(0x20000, 4096)}, kPeerVa)),
              0);
    poll(0);
    ASSERT_EQ(sent().size(), 1u);
    now_ = 10 * kUs;
    inject(read_resp(op::kRcReadRespFirst, kSqPsn), slice(remote, 0, 1024));
    inject(pkt(op::kRcReadRespMiddle, kSqPsn + 1), slice(remote, 1024, 1024));
    poll(10 * kUs);
  }
  // The rest of that READ arrives at `at`: it completes with all 4 KiB.
  void read_rest_answered(const std::vector<uint8_t>& remote, uint64_t at) {
    inject(read_resp(op::kRcReadRespFirst, kSqPsn + 2),
           slice(remote, 2048, 1024));
    inject(read_resp(op::kRcReadRespLast, kSqPsn + 3, 1),
           slice(remote, 3072, 1024));
    poll(at);
    auto wc = cq_poll();
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].wr_id, 1u);
    EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc[0].opcode, IBV_WC_RDMA_READ);
    EXPECT_EQ(bytes(0x20000, 4096), remote);
  }
  // Posts n 8-byte SENDs and sends them at time 0 (one packet each).
  void send_burst(uint32_t n) {
    for (uint64_t i = 0; i < n; ++i)
      ASSERT_EQ(post(wr(i + 1, IBV_WR_SEND, {sge(0, 8)})), 0);
    poll(0);
    ASSERT_EQ(sent().size(), n);
  }
  void use_engine(const EngineConfig& ec) {
    engine_.reset();
    engine_ = std::make_unique<Engine>(*dev_, io_, ec, 0);
  }

  static ibv_ah_attr peer_ah_attr() {
    ibv_ah_attr ah{};
    ah.is_global = 1;
    wire::gid_from_ipv4(kPeerIp, ah.grh.dgid.raw);
    ah.grh.sgid_index = 0;
    ah.grh.hop_limit = 64;
    ah.port_num = 1;
    return ah;
  }

  Qp* create_qp(ibv_qp_type type, const QpOpts& o = {}) {
    QpInitAttr a;
    a.qp_type = type;
    a.pd = pd_;
    a.send_cq = o.send_cq ? o.send_cq : scq_;
    a.recv_cq = rcq_;
    a.srq = o.srq;
    a.cap.max_send_wr = o.max_send_wr;
    a.cap.max_recv_wr = 128;
    a.cap.max_send_sge = 4;
    a.cap.max_recv_sge = 4;
    a.cap.max_inline_data = kMaxInline;
    Qp* qp = nullptr;
    EXPECT_EQ(engine_->create_qp(a, &qp), 0);
    return qp;
  }

  // RESET -> INIT -> RTR -> RTS (or up to o.until) with the verbs masks of
  // ib_modify_qp_is_ok for each transition (tests/support). 0 or the
  // failing errno.
  int bring_up(Qp* qp, ibv_qp_type type, uint32_t peer_qpn, uint32_t sq_psn,
               uint32_t rq_psn, ibv_mtu mtu, const QpOpts& o = {}) {
    test::QpPath p;
    p.type = type;
    p.peer_qpn = peer_qpn;
    wire::gid_from_ipv4(kPeerIp, p.peer_gid);
    p.sq_psn = sq_psn;
    p.rq_psn = rq_psn;
    p.mtu = mtu;
    p.access = o.access;
    p.qkey = o.qkey;
    p.timeout = o.timeout;
    p.retry_cnt = o.retry_cnt;
    p.rnr_retry = o.rnr_retry;
    p.min_rnr_timer = o.min_rnr_timer;
    p.max_rd_atomic = o.max_rd_atomic;
    p.max_dest_rd_atomic = o.max_dest_rd_atomic;
    p.until = o.until;
    return test::bring_up(*engine_, qp, p);
  }

  // Creates the QP under test (qp_) and brings it up; nullptr on failure.
  Qp* up(ibv_qp_type type = IBV_QPT_RC, const QpOpts& o = {},
         uint32_t sq_psn = kSqPsn, uint32_t rq_psn = kRqPsn,
         ibv_mtu mtu = IBV_MTU_1024) {
    qp_ = create_qp(type, o);
    if (!qp_) return nullptr;
    int rc = bring_up(qp_, type, kPeerQpn, sq_psn, rq_psn, mtu, o);
    EXPECT_EQ(rc, 0) << "bring_up";
    return rc == 0 ? qp_ : nullptr;
  }

  // The i-th of several RC QPs on one engine: peer QPN kPeerQpn + i, send
  // PSNs from sq_psn_of(i), a 1 KiB MTU, brought up to RTS; nullptr (and
  // a failure) if it did not come up.
  static uint32_t sq_psn_of(int i) {
    return kSqPsn + static_cast<uint32_t>(i) * 4096;
  }
  Qp* up_rc(int i) {
    Qp* q = create_qp(IBV_QPT_RC);
    if (!q) {
      ADD_FAILURE() << "create_qp " << i;
      return nullptr;
    }
    const int rc = bring_up(q, IBV_QPT_RC, kPeerQpn + static_cast<uint32_t>(i),
                            sq_psn_of(i), kRqPsn, IBV_MTU_1024);
    EXPECT_EQ(rc, 0) << "bring_up " << i;
    return rc == 0 ? q : nullptr;
  }

  int to_error(Qp* qp) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    return engine_->modify_qp(qp, a, IBV_QP_STATE);
  }

  // --- memory -------------------------------------------------------------

  uint64_t addr(uint64_t off) const {
    return reinterpret_cast<uint64_t>(mem_.get() + off);
  }
  uint8_t* at(uint64_t off) { return mem_.get() + off; }
  Sge sge(uint64_t off, uint32_t len) const {
    return Sge{addr(off), len, mr_->lkey()};
  }
  void put(uint64_t off, const std::vector<uint8_t>& v) {
    std::memcpy(at(off), v.data(), v.size());
  }
  std::vector<uint8_t> bytes(uint64_t off, uint32_t len) {
    return {at(off), at(off) + len};
  }
  uint64_t u64(uint64_t off) {
    uint64_t v;
    std::memcpy(&v, at(off), 8);
    return v;
  }
  void set_u64(uint64_t off, uint64_t v) { std::memcpy(at(off), &v, 8); }

  // --- work requests ------------------------------------------------------

  static SendWr wr(uint64_t id, ibv_wr_opcode opcode,
                   std::initializer_list<Sge> sges,
                   uint32_t flags = IBV_SEND_SIGNALED) {
    SendWr w;
    w.wr_id = id;
    w.opcode = opcode;
    w.send_flags = flags;
    for (const Sge& s : sges) w.sg_list[w.num_sge++] = s;
    return w;
  }
  static SendWr rdma(uint64_t id, ibv_wr_opcode opcode,
                     std::initializer_list<Sge> sges, uint64_t va,
                     uint32_t rkey = kPeerRkey,
                     uint32_t flags = IBV_SEND_SIGNALED) {
    SendWr w = wr(id, opcode, sges, flags);
    w.remote_addr = va;
    w.rkey = rkey;
    return w;
  }
  static RecvWr rwr(uint64_t id, std::initializer_list<Sge> sges) {
    RecvWr w;
    w.wr_id = id;
    for (const Sge& s : sges) w.sg_list[w.num_sge++] = s;
    return w;
  }
  int post(const SendWr& w) { return engine_->post_send(qp_, w); }
  int post_recv(const RecvWr& w) { return engine_->post_recv(qp_, w); }

  // --- the peer -----------------------------------------------------------

  static wire::RoceFields pkt(uint8_t opcode, uint32_t psn,
                              bool ack_req = false) {
    wire::RoceFields f;
    f.opcode = opcode;
    f.psn = psn & kPsnMask;
    f.ack_req = ack_req;
    return f;
  }
  static wire::RoceFields ack(uint32_t psn, uint32_t msn = 0,
                              uint8_t syndrome = kAck) {
    wire::RoceFields f = pkt(op::kRcAck, psn);
    f.aeth_syndrome = syndrome;
    f.aeth_msn = msn;
    return f;
  }
  static wire::RoceFields nak(uint32_t psn, uint8_t syndrome) {
    return ack(psn, 0, syndrome);
  }
  static wire::RoceFields read_resp(uint8_t opcode, uint32_t psn,
                                    uint32_t msn = 0) {
    wire::RoceFields f = pkt(opcode, psn);
    f.aeth_syndrome = kAck;
    f.aeth_msn = msn;
    return f;
  }
  wire::RoceFields write_req(uint8_t opcode, uint32_t psn, bool ack_req,
                             uint64_t va, uint32_t len, uint32_t rkey = 0) {
    wire::RoceFields f = pkt(opcode, psn, ack_req);
    f.reth_va = va;
    f.reth_rkey = rkey ? rkey : mr_->rkey();
    f.reth_len = len;
    return f;
  }

  // Encodes `f` as a frame from the peer to us (MACs, GIDs, dqpn = the QP
  // under test unless f.dqpn is set), decodes it and hands it to the engine
  // at the current virtual time.
  void inject(wire::RoceFields f, std::span<const uint8_t> payload = {}) {
    f.dst_mac = kOurMac;
    f.src_mac = kPeerMac;
    wire::gid_from_ipv4(inject_from_, f.sgid);
    wire::gid_from_ipv4(inject_to_, f.dgid);
    if (f.dqpn == 0) f.dqpn = qp_->qpn();
    f.payload_len = static_cast<uint32_t>(payload.size());
    last_frame_.assign(16384, 0);
    const uint32_t n = wire::encode_frame(
        f, payload.empty() ? nullptr : payload.data(), last_frame_.data(),
        static_cast<uint32_t>(last_frame_.size()));
    ASSERT_GT(n, 0u) << "encode_frame";
    last_frame_.resize(n);
    last_fi_ = {};
    wire::decode(last_frame_.data(), n, last_fi_);
    ASSERT_EQ(last_fi_.kind, wire::FrameKind::kRoce)
        << wire::malformed_name(last_fi_.why);
    const wire::ConstBuf seg{last_frame_.data(), n};
    engine_->rx(last_fi_, {&seg, 1}, now_);
  }
  void inject(const wire::RoceFields& f, const std::vector<uint8_t>& payload) {
    inject(f, std::span<const uint8_t>(payload));
  }

  // Runs the engine at virtual time t until it has nothing left to do now.
  void poll(uint64_t t) {
    now_ = t;
    for (int i = 0; i < 1000 && engine_->poll(now_) > 0; ++i) {
    }
  }
  void poll() { poll(now_); }
  // The QP to `st` (IBV_QP_STATE alone): modify_qp's result.
  int to_state(ibv_qp_state st, const char** why = nullptr) {
    ibv_qp_attr a{};
    a.qp_state = st;
    return engine_->modify_qp(qp_, a, IBV_QP_STATE, why);
  }
  int sq_draining() {  // query_qp's
    ibv_qp_attr q{};
    EXPECT_EQ(engine_->query_qp(qp_, &q, nullptr), 0);
    return q.sq_draining;
  }
  // A running lcore: polls every `step` up to `t`.
  void run_until(uint64_t t, uint64_t step = 50 * kUs) {
    for (uint64_t n = now_ + step; n < t; n += step) poll(n);
    poll(t);
  }

  // Everything transmitted since the last call, decoded. Every frame must
  // be a valid RoCEv2 frame (ICRC checked) from us to the peer.
  std::vector<Pkt> sent() {
    std::vector<Pkt> out;
    uint8_t our_gid[16], peer_gid[16];
    wire::gid_from_ipv4(kOurIp, our_gid);
    wire::gid_from_ipv4(kPeerIp, peer_gid);
    for (const std::vector<uint8_t>& b : io_.frames) {
      wire::FrameInfo fi;
      wire::decode(b.data(), static_cast<uint32_t>(b.size()), fi);
      EXPECT_EQ(fi.kind, wire::FrameKind::kRoce)
          << "transmitted frame does not decode: "
          << wire::malformed_name(fi.why);
      if (fi.kind != wire::FrameKind::kRoce) continue;
      Pkt p;
      p.f = fi.roce;
      p.payload.assign(b.begin() + fi.payload_off,
                       b.begin() + fi.payload_off + fi.roce.payload_len);
      EXPECT_EQ(p.f.src_mac, kOurMac);
      EXPECT_EQ(p.f.dst_mac, kPeerMac);
      EXPECT_FALSE(p.f.ipv6);
      EXPECT_EQ(std::memcmp(p.f.sgid, our_gid, 16), 0);
      EXPECT_EQ(std::memcmp(p.f.dgid, peer_gid, 16), 0);
      out.push_back(std::move(p));
    }
    io_.frames.clear();
    return out;
  }

  static std::vector<Pkt> without_acks(const std::vector<Pkt>& v) {
    std::vector<Pkt> out;
    for (const Pkt& p : v)
      if (p.f.opcode != op::kRcAck) out.push_back(p);
    return out;
  }
  static std::vector<Pkt> only_acks(const std::vector<Pkt>& v) {
    std::vector<Pkt> out;
    for (const Pkt& p : v)
      if (p.f.opcode == op::kRcAck) out.push_back(p);
    return out;
  }

  std::vector<ibv_wc> cq_poll(Cq* cq = nullptr) {
    if (!cq) cq = scq_;
    std::vector<ibv_wc> out;
    ibv_wc wc[16];
    for (int n; (n = cq->poll(wc)) > 0;) out.insert(out.end(), wc, wc + n);
    return out;
  }
  std::vector<ibv_wc> rcq_poll() { return cq_poll(rcq_); }
  uint32_t inject_from_ = kPeerIp;  // the IPv4 source inject() puts
  uint32_t inject_to_ = kOurIp;     // and its destination
  // The asynchronous events raised for qp_ since the last call.
  std::vector<ibv_event_type> qp_events() {
    std::vector<ibv_event_type> out;
    for (AsyncEvent ev; dev_->next_event(&ev);)
      if (ev.qpn == qp_->qpn() && !ev.cq && !ev.srq) out.push_back(ev.type);
    return out;
  }

  uint64_t ctr(ECtr c) const { return engine_->counters().get(c); }

  std::unique_ptr<uint8_t[]> mem_;
  TestResolver resolver_;
  CaptureIo io_;
  std::unique_ptr<Device> dev_;
  std::unique_ptr<Engine> engine_;
  Pd* pd_ = nullptr;
  Mr* mr_ = nullptr;
  Cq* scq_ = nullptr;
  Cq* rcq_ = nullptr;
  Qp* qp_ = nullptr;
  uint64_t now_ = 0;
  std::vector<uint8_t> last_frame_;
  wire::FrameInfo last_fi_;
};

// wr_id and status; the opcode too for a successful completion (it is
// undefined in an error completion).
#define EXPECT_WC(wc, id, st, opc)   \
  do {                               \
    EXPECT_EQ((wc).wr_id, (id));     \
    EXPECT_EQ((wc).status, (st));    \
    if ((st) == IBV_WC_SUCCESS) {    \
      EXPECT_EQ((wc).opcode, (opc)); \
    }                                \
  } while (0)

// ===========================================================================
// Requester: segmentation and headers
// ===========================================================================

TEST_F(TransportTrace, SendIsCutIntoFirstMiddleLastWithGather) {
  ASSERT_TRUE(up());
  put(0x0000, pattern(1000, 1));
  put(0x4000, pattern(1500, 2));
  put(0x8000, pattern(500, 3));
  std::vector<uint8_t> msg = bytes(0x0000, 1000);
  for (auto v : {bytes(0x4000, 1500), bytes(0x8000, 500)})
    msg.insert(msg.end(), v.begin(), v.end());

  // Post: SEND 3000 bytes gathered from three SGEs, MTU 1024.
  ASSERT_EQ(post(wr(1, IBV_WR_SEND,
                    {sge(0x0000, 1000), sge(0x4000, 1500), sge(0x8000, 500)})),
            0);
  poll(0);
  auto p = sent();
  // Expect: SEND_FIRST P (1024), SEND_MIDDLE P+1 (1024), SEND_LAST P+2 (952)
  // with AckReq, all to the peer QP, payload = the gathered bytes in order.
  ASSERT_EQ(p.size(), 3u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcSendFirst);
  EXPECT_EQ(p[1].f.opcode, op::kRcSendMiddle);
  EXPECT_EQ(p[2].f.opcode, op::kRcSendLast);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(p[i].f.psn, kSqPsn + i);
    EXPECT_EQ(p[i].f.dqpn, kPeerQpn);
    EXPECT_EQ(p[i].f.pkey, 0xffff);
  }
  EXPECT_EQ(p[0].payload, slice(msg, 0, 1024));
  EXPECT_EQ(p[1].payload, slice(msg, 1024, 1024));
  EXPECT_EQ(p[2].payload, slice(msg, 2048, 952));
  EXPECT_TRUE(p[2].f.ack_req);
  EXPECT_FALSE(p[2].f.se);
  // Expect: nothing completes before the ACK.
  EXPECT_TRUE(cq_poll().empty());

  // Peer: ACK P+2.
  inject(ack(kSqPsn + 2, 1));
  poll(10 * kUs);
  // Expect: IBV_WC_SEND, byte_len 3000.
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_SEND);
  EXPECT_EQ(wc[0].byte_len, 3000u);
  EXPECT_EQ(wc[0].qp_num, qp_->qpn());
  EXPECT_TRUE(sent().empty());
}

TEST_F(TransportTrace, WriteOnlyCarriesReth) {
  ASSERT_TRUE(up());
  put(0x1000, pattern(512, 9));
  // Post: RDMA WRITE 512 bytes to the peer's kPeerVa + 0x40.
  ASSERT_EQ(
      post(rdma(2, IBV_WR_RDMA_WRITE, {sge(0x1000, 512)}, kPeerVa + 0x40)), 0);
  poll(0);
  auto p = sent();
  // Expect: RDMA_WRITE_ONLY P, RETH(va, rkey, 512), AckReq, the bytes.
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcWriteOnly);
  EXPECT_EQ(p[0].f.psn, kSqPsn);
  EXPECT_EQ(p[0].f.reth_va, kPeerVa + 0x40);
  EXPECT_EQ(p[0].f.reth_rkey, kPeerRkey);
  EXPECT_EQ(p[0].f.reth_len, 512u);
  EXPECT_TRUE(p[0].f.ack_req);
  EXPECT_EQ(p[0].payload, bytes(0x1000, 512));

  inject(ack(kSqPsn, 1));
  poll(5 * kUs);
  // Expect: IBV_WC_RDMA_WRITE, byte_len 512.
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 2u, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(wc[0].byte_len, 512u);
}

TEST_F(TransportTrace, MultiPacketWriteHasRethOnFirstOnly) {
  ASSERT_TRUE(up());
  put(0x1000, pattern(2500, 4));
  // Post: RDMA WRITE 2500 bytes.
  ASSERT_EQ(post(rdma(3, IBV_WR_RDMA_WRITE, {sge(0x1000, 2500)}, kPeerVa)), 0);
  poll(0);
  auto p = sent();
  // Expect: WRITE_FIRST P with RETH(total length 2500), WRITE_MIDDLE P+1,
  // WRITE_LAST P+2 (AckReq); no RETH after the first.
  ASSERT_EQ(p.size(), 3u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcWriteFirst);
  EXPECT_EQ(p[0].f.reth_va, kPeerVa);
  EXPECT_EQ(p[0].f.reth_rkey, kPeerRkey);
  EXPECT_EQ(p[0].f.reth_len, 2500u);
  EXPECT_EQ(p[1].f.opcode, op::kRcWriteMiddle);
  EXPECT_EQ(p[1].f.reth_len, 0u);
  EXPECT_EQ(p[2].f.opcode, op::kRcWriteLast);
  EXPECT_TRUE(p[2].f.ack_req);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(p[i].f.psn, kSqPsn + i);
    EXPECT_EQ(p[i].payload,
              bytes(0x1000 + 1024 * i, std::min(1024u, 2500 - 1024 * i)));
  }
}

TEST_F(TransportTrace, WriteWithImmCarriesImmOnLastOnly) {
  ASSERT_TRUE(up());
  put(0x1000, pattern(2100, 5));
  // Post: WRITE_WITH_IMM 2100 bytes, imm 0xdeadbeef; then a 64-byte one.
  SendWr w = rdma(4, IBV_WR_RDMA_WRITE_WITH_IMM, {sge(0x1000, 2100)}, kPeerVa);
  w.imm_data = htonl(0xdeadbeef);
  ASSERT_EQ(post(w), 0);
  SendWr w2 =
      rdma(5, IBV_WR_RDMA_WRITE_WITH_IMM, {sge(0x1000, 64)}, kPeerVa + 0x8000);
  w2.imm_data = htonl(0x01020304);
  ASSERT_EQ(post(w2), 0);
  poll(0);
  auto p = sent();
  // Expect: WRITE_FIRST (RETH, no imm), WRITE_MIDDLE,
  // WRITE_LAST_WITH_IMM imm 0xdeadbeef; then WRITE_ONLY_WITH_IMM (RETH + imm).
  ASSERT_EQ(p.size(), 4u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcWriteFirst);
  EXPECT_EQ(p[0].f.reth_len, 2100u);
  EXPECT_EQ(p[1].f.opcode, op::kRcWriteMiddle);
  EXPECT_EQ(p[2].f.opcode, op::kRcWriteLastImm);
  EXPECT_EQ(p[2].f.imm, 0xdeadbeefu);
  EXPECT_EQ(p[2].f.psn, kSqPsn + 2);
  EXPECT_EQ(p[2].payload, bytes(0x1000 + 2048, 52));
  EXPECT_TRUE(p[2].f.ack_req);
  EXPECT_EQ(p[3].f.opcode, op::kRcWriteOnlyImm);
  EXPECT_EQ(p[3].f.psn, kSqPsn + 3);
  EXPECT_EQ(p[3].f.imm, 0x01020304u);
  EXPECT_EQ(p[3].f.reth_va, kPeerVa + 0x8000);
  EXPECT_EQ(p[3].f.reth_len, 64u);

  inject(ack(kSqPsn + 3, 2));
  poll(5 * kUs);
  // Expect: both complete as IBV_WC_RDMA_WRITE.
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_WC(wc[0], 4u, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(wc[0].byte_len, 2100u);
  EXPECT_WC(wc[1], 5u, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE);
}

TEST_F(TransportTrace, InlineSendCarriesBytesCopiedAtPost) {
  ASSERT_TRUE(up());
  // An unregistered stack buffer: inline data needs no lkey.
  std::vector<uint8_t> src = pattern(200, 0x33);
  const std::vector<uint8_t> original = src;
  SendWr w =
      wr(6, IBV_WR_SEND, {Sge{reinterpret_cast<uint64_t>(src.data()), 200, 0}},
         IBV_SEND_SIGNALED | IBV_SEND_INLINE);
  // Post, then overwrite the source before the engine runs.
  ASSERT_EQ(post(w), 0);
  std::fill(src.begin(), src.end(), 0xee);
  poll(0);
  auto p = sent();
  // Expect: SEND_ONLY with the bytes as they were at post time.
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcSendOnly);
  EXPECT_EQ(p[0].payload, original);

  inject(ack(kSqPsn, 1));
  poll(5 * kUs);
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 6u, IBV_WC_SUCCESS, IBV_WC_SEND);
  EXPECT_EQ(wc[0].byte_len, 200u);
}

TEST_F(TransportTrace, UnsignaledWrHasNoCompletionButLaterSignaledOneDoes) {
  ASSERT_TRUE(up());
  // Post: SEND wr 1 unsignaled, SEND wr 2 signaled.
  ASSERT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 16)}, 0)), 0);
  ASSERT_EQ(post(wr(2, IBV_WR_SEND, {sge(0, 16)})), 0);
  poll(0);
  auto p = sent();
  ASSERT_EQ(p.size(), 2u) << dump(p);
  // Peer ACKs wr 1 only. Expect: no CQE.
  inject(ack(kSqPsn, 1));
  poll(5 * kUs);
  EXPECT_TRUE(cq_poll().empty());
  // Peer ACKs wr 2. Expect: exactly one CQE, wr 2.
  inject(ack(kSqPsn + 1, 2));
  poll(6 * kUs);
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 2u, IBV_WC_SUCCESS, IBV_WC_SEND);
}

TEST_F(TransportTrace, SolicitedSendSetsSeOnLastPacket) {
  ASSERT_TRUE(up());
  // Post: SEND 1500 bytes with IBV_SEND_SOLICITED.
  ASSERT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 1500)},
                    IBV_SEND_SIGNALED | IBV_SEND_SOLICITED)),
            0);
  poll(0);
  auto p = sent();
  // Expect: SE only on SEND_LAST.
  ASSERT_EQ(p.size(), 2u) << dump(p);
  EXPECT_FALSE(p[0].f.se);
  EXPECT_TRUE(p[1].f.se);
}

TEST_F(TransportTrace, AckReqAtLeastEveryNthPacket) {
  ASSERT_TRUE(up(IBV_QPT_RC, {}, kSqPsn, kRqPsn, IBV_MTU_256));
  const uint32_t n = engine_->config().ack_req_every;
  // Post: one SEND of 3n+5 packets at MTU 256.
  const uint32_t pkts = 3 * n + 5;
  ASSERT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, pkts * 256)})), 0);
  poll(0);
  auto p = sent();
  ASSERT_EQ(p.size(), pkts) << dump(p);
  // Expect: no run of more than n packets without AckReq; last has it.
  uint32_t run = 0;
  for (const Pkt& k : p) {
    run = k.f.ack_req ? 0 : run + 1;
    EXPECT_LT(run, n) << "psn 0x" << std::hex << k.f.psn;
  }
  EXPECT_TRUE(p.back().f.ack_req);
}

TEST_F(TransportTrace, FetchAddSendsAtomicEthAndStoresOriginal) {
  ASSERT_TRUE(up());
  set_u64(0xb000, 0);
  // Post: FETCH_ADD +5 at kPeerVa, original into local 8 bytes.
  SendWr w = rdma(1, IBV_WR_ATOMIC_FETCH_AND_ADD, {sge(0xb000, 8)}, kPeerVa);
  w.compare_add = 5;
  ASSERT_EQ(post(w), 0);
  // Post: CMP_SWAP compare 0x10 swap 0x20.
  SendWr c = rdma(2, IBV_WR_ATOMIC_CMP_AND_SWP, {sge(0xb008, 8)}, kPeerVa + 8);
  c.compare_add = 0x10;
  c.swap = 0x20;
  ASSERT_EQ(post(c), 0);
  poll(0);
  auto p = sent();
  // Expect: FETCH_ADD P (AtomicETH va, rkey, add 5), CMP_SWAP P+1.
  ASSERT_EQ(p.size(), 2u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcFetchAdd);
  EXPECT_EQ(p[0].f.psn, kSqPsn);
  EXPECT_EQ(p[0].f.atomic_va, kPeerVa);
  EXPECT_EQ(p[0].f.atomic_rkey, kPeerRkey);
  EXPECT_EQ(p[0].f.atomic_swap_add, 5u);
  EXPECT_TRUE(p[0].f.ack_req);
  EXPECT_EQ(p[1].f.opcode, op::kRcCmpSwap);
  EXPECT_EQ(p[1].f.psn, kSqPsn + 1);
  EXPECT_EQ(p[1].f.atomic_swap_add, 0x20u);
  EXPECT_EQ(p[1].f.atomic_compare, 0x10u);

  // Peer: ATOMIC_ACKs with the original values.
  auto a = read_resp(op::kRcAtomicAck, kSqPsn, 1);
  a.atomic_orig = 0x1122334455667788;
  inject(a);
  a = read_resp(op::kRcAtomicAck, kSqPsn + 1, 2);
  a.atomic_orig = 0x10;
  inject(a);
  poll(5 * kUs);
  // Expect: originals in local memory (host order), two CQEs.
  EXPECT_EQ(u64(0xb000), 0x1122334455667788u);
  EXPECT_EQ(u64(0xb008), 0x10u);
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_FETCH_ADD);
  EXPECT_EQ(wc[0].byte_len, 8u);
  EXPECT_WC(wc[1], 2u, IBV_WC_SUCCESS, IBV_WC_COMP_SWAP);
}

TEST_F(TransportTrace, PostSendRejectsInvalidWrs) {
  ASSERT_TRUE(up());
  // Atomic with a local SGE list that is not 8 bytes: EINVAL.
  SendWr a = rdma(1, IBV_WR_ATOMIC_FETCH_AND_ADD, {sge(0, 4)}, kPeerVa);
  EXPECT_EQ(post(a), EINVAL);
  // An atomic whose remote address is not 8-byte aligned: EINVAL (rxe's
  // validate_send_wr), not a NAK that takes both QPs to error.
  EXPECT_EQ(post(rdma(1, IBV_WR_ATOMIC_CMP_AND_SWP, {sge(0, 8)}, kPeerVa + 4)),
            EINVAL);
  // Inline longer than max_inline_data (kMaxInline): EINVAL.
  std::vector<uint8_t> big(kMaxInline + 1);
  EXPECT_EQ(
      post(wr(2, IBV_WR_SEND,
              {Sge{reinterpret_cast<uint64_t>(big.data()), kMaxInline + 1, 0}},
              IBV_SEND_SIGNALED | IBV_SEND_INLINE)),
      EINVAL);
  // Nothing went out, nothing completed, QP still RTS.
  poll(0);
  EXPECT_TRUE(sent().empty());
  EXPECT_TRUE(cq_poll().empty());
  EXPECT_EQ(qp_->state(), IBV_QPS_RTS);
}

TEST_F(TransportTrace, UcRejectsReadAndAtomics) {
  ASSERT_TRUE(up(IBV_QPT_UC));
  EXPECT_EQ(post(rdma(1, IBV_WR_RDMA_READ, {sge(0, 8)}, kPeerVa)), EINVAL);
  EXPECT_EQ(post(rdma(2, IBV_WR_ATOMIC_FETCH_AND_ADD, {sge(0, 8)}, kPeerVa)),
            EINVAL);
  EXPECT_EQ(post(rdma(3, IBV_WR_RDMA_WRITE, {sge(0, 8)}, kPeerVa)), 0);
}

TEST_F(TransportTrace, BadLkeyCompletesWithLocProtErr) {
  ASSERT_TRUE(up());
  // Post: SEND whose SGE lkey is wrong, then a good SEND.
  ASSERT_EQ(post(wr(1, IBV_WR_SEND, {Sge{addr(0), 64, mr_->lkey() ^ 0xff}})),
            0);
  ASSERT_EQ(post(wr(2, IBV_WR_SEND, {sge(0, 64)})), 0);
  poll(0);
  // Expect: nothing sent for wr 1; wr 1 LOC_PROT_ERR, wr 2 flushed, QP ERR.
  auto p = sent();
  for (const Pkt& k : p) EXPECT_NE(k.f.psn, kSqPsn) << dump(p);
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_WC(wc[0], 1u, IBV_WC_LOC_PROT_ERR, IBV_WC_SEND);
  EXPECT_WC(wc[1], 2u, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND);
  EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
}

TEST_F(TransportTrace, PostSendQueueFullAndTooManySges) {
  QpOpts o;
  o.max_send_wr = 4;
  ASSERT_TRUE(up(IBV_QPT_RC, o));
  QpInitAttr init;
  ASSERT_EQ(engine_->query_qp(qp_, nullptr, &init), 0);
  const uint32_t depth = init.cap.max_send_wr;
  ASSERT_GE(depth, 4u);
  ASSERT_LE(depth, 64u);
  // More SGEs than granted: EINVAL.
  if (init.cap.max_send_sge < kMaxSge) {
    SendWr w = wr(99, IBV_WR_SEND, {});
    w.num_sge = init.cap.max_send_sge + 1;
    for (uint32_t i = 0; i < w.num_sge; ++i) w.sg_list[i] = sge(16 * i, 16);
    EXPECT_EQ(post(w), EINVAL);
  }
  // Fill the send queue without running the engine; one more: ENOMEM.
  for (uint32_t i = 0; i < depth; ++i)
    ASSERT_EQ(post(wr(i + 1, IBV_WR_SEND, {sge(0, 8)})), 0) << i;
  EXPECT_EQ(post(wr(100, IBV_WR_SEND, {sge(0, 8)})), ENOMEM);
  poll(0);
  auto p = sent();
  ASSERT_EQ(p.size(), depth) << dump(p);
  EXPECT_EQ(p.back().f.psn, kSqPsn + depth - 1);
}

TEST_F(TransportTrace, WindowLimitsUnackedPsns) {
  // An engine whose requester window is 4 PSNs.
  EngineConfig ec = no_cc();
  ec.max_unacked = 4;
  engine_.reset();
  engine_ = std::make_unique<Engine>(*dev_, io_, ec, 0);
  ASSERT_TRUE(up());
  // Post: six single-packet SENDs.
  for (uint64_t i = 0; i < 6; ++i)
    ASSERT_EQ(post(wr(i + 1, IBV_WR_SEND, {sge(0, 8)})), 0);
  poll(0);
  auto p = sent();
  // Expect: only P..P+3 go out.
  ASSERT_EQ(p.size(), 4u) << dump(p);
  EXPECT_EQ(p[3].f.psn, kSqPsn + 3);
  poll(10 * kUs);
  EXPECT_TRUE(sent().empty());
  // Peer: ACK P+1. Expect: wr 1, 2 complete; P+4, P+5 go out.
  inject(ack(kSqPsn + 1, 2));
  poll(20 * kUs);
  EXPECT_EQ(cq_poll().size(), 2u);
  p = sent();
  ASSERT_EQ(p.size(), 2u) << dump(p);
  EXPECT_EQ(p[0].f.psn, kSqPsn + 4);
  EXPECT_EQ(p[1].f.psn, kSqPsn + 5);
}

// The congestion window (congestion.h): a QP starts with init_window
// packets in flight, the packet that fills the window asks for an ACK, and
// each ACKed packet grows the window by one (slow start).
TEST_F(TransportTrace, CongestionWindowStartsSmallAndGrowsOnAcks) {
  EngineConfig ec;
  ec.cc.init_window = 4;
  use_engine(ec);
  ASSERT_TRUE(up());
  // Post: twenty single-packet SENDs.
  for (uint64_t i = 0; i < 20; ++i)
    ASSERT_EQ(post(wr(i + 1, IBV_WR_SEND, {sge(0, 8)})), 0);
  poll(0);
  auto p = sent();
  // Expect: P..P+3, AckReq on P+3 (the window is full after it).
  ASSERT_EQ(p.size(), 4u) << dump(p);
  EXPECT_TRUE(p[3].f.ack_req);
  // Peer: ACK P+3. Expect: the window grew by 4 to 8: P+4..P+11 go out,
  // AckReq on P+11.
  inject(ack(kSqPsn + 3, 4));
  poll(10 * kUs);
  EXPECT_EQ(cq_poll().size(), 4u);
  p = sent();
  ASSERT_EQ(p.size(), 8u) << dump(p);
  EXPECT_EQ(p[0].f.psn, kSqPsn + 4);
  EXPECT_EQ(p[7].f.psn, kSqPsn + 11);
  EXPECT_TRUE(p[7].f.ack_req);
  EXPECT_EQ(qp_->counters().cc_window.get(), 8u);
}

// urnicctl qps shows a QP's smoothed round trip (srtt_us): one AckReq
// packet timed at a time, RFC 6298's average of the samples.
TEST_F(TransportTrace, QpCountersShowTheSmoothedRoundTrip) {
  ASSERT_TRUE(up());
  EXPECT_EQ(qp_->counters().srtt_us.get(), 0u);  // no sample yet
  ASSERT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 8)})), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 1u);
  // Peer: ACK after 80 us (inject hands it to the engine at its clock).
  // Expect: the first sample is the round trip.
  poll(80 * kUs);
  inject(ack(kSqPsn, 1));
  poll(80 * kUs);
  EXPECT_EQ(cq_poll().size(), 1u);
  EXPECT_EQ(qp_->counters().srtt_us.get(), 80u);
  // A second request, answered after 160 us: 7/8 of 80 and 1/8 of 160.
  ASSERT_EQ(post(wr(2, IBV_WR_SEND, {sge(0, 8)})), 0);
  poll(100 * kUs);
  ASSERT_EQ(sent().size(), 1u);
  poll(260 * kUs);
  inject(ack(kSqPsn + 1, 2));
  poll(260 * kUs);
  EXPECT_EQ(cq_poll().size(), 1u);
  EXPECT_EQ(qp_->counters().srtt_us.get(), 90u);
}

// AckReq at least twice per window is judged on the QP's own window, not on
// its share of the shared one: while other QPs divide that, they keep the
// pipe full as this one waits, and asking twice per share doubled the ACKs
// a 16-QP receiver sent (perf/README.md, "One ACK per QP's run").
TEST_F(TransportTrace, AckReqSpacingFollowsTheQpsOwnWindow) {
  for (const bool own_small : {false, true}) {
    SCOPED_TRACE(own_small);
    EngineConfig ec;
    ec.cc.init_window = own_small ? 16 : 64;
    ec.cc.shared_init_window = own_small ? 64 : 16;
    ec.cc.shared_min_window = 4;
    use_engine(ec);
    ASSERT_TRUE(up());
    ASSERT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 64 * 1024)})), 0);  // 64 pkts
    poll(0);
    const auto p = sent();
    // Expect: 16 packets either way (the share, or the QP's own window).
    // Own window 64, share 16: only the 16th asks (it fills the window).
    // Own window 16: the 8th too (twice per window).
    ASSERT_EQ(p.size(), 16u) << dump(p);
    for (size_t i = 0; i < p.size(); ++i)
      EXPECT_EQ(p[i].f.ack_req, i == 15 || (own_small && i == 7))
          << "packet " << i << dump(p);
  }
}

// The engine's shared window (all RC QPs of one lcore): a QP may have its
// share of it in flight when that is less than its own window, and every
// ACK grows both.
TEST_F(TransportTrace, SharedWindowLimitsAQpToItsShare) {
  EngineConfig ec;
  ec.cc.init_window = 16;
  ec.cc.shared_init_window = 8;
  ec.cc.shared_min_window = 4;
  use_engine(ec);
  ASSERT_TRUE(up());
  for (uint64_t i = 0; i < 40; ++i)
    ASSERT_EQ(post(wr(i + 1, IBV_WR_SEND, {sge(0, 8)})), 0);
  poll(0);
  auto p = sent();
  // Expect: the shared window's 8, not the QP's 16; AckReq on the 8th.
  ASSERT_EQ(p.size(), 8u) << dump(p);
  EXPECT_TRUE(p[7].f.ack_req);
  EXPECT_EQ(engine_->cc_active_qps(), 1u);
  EXPECT_EQ(engine_->cc_in_flight(), 8u);
  // Peer: ACK P+7. Expect: shared 8 -> 16 (QP 16 -> 24): P+8..P+23.
  inject(ack(kSqPsn + 7, 8));
  poll(10 * kUs);
  EXPECT_EQ(cq_poll().size(), 8u);
  p = sent();
  ASSERT_EQ(p.size(), 16u) << dump(p);
  EXPECT_EQ(p[0].f.psn, kSqPsn + 8);
  EXPECT_EQ(engine_->cc_shared_window(), 16u);
  // Peer: ACK all of them. Expect: nothing in flight, no QP counted active.
  inject(ack(kSqPsn + 23, 24));
  poll(20 * kUs);
  EXPECT_EQ(cq_poll().size(), 16u);
  sent();
  inject(ack(kSqPsn + 39, 40));
  poll(30 * kUs);
  EXPECT_EQ(cq_poll().size(), 16u);
  EXPECT_EQ(engine_->cc_in_flight(), 0u);
  EXPECT_EQ(engine_->cc_active_qps(), 0u);
}

// A lone QP held to 8 packets in flight by its own window: its ACKs do not
// grow the shared window past twice that (RFC 7661's validation). Grown by
// every ACK, one QP's 4 s took it to ~750 k packets, and 256 QPs started
// next all went at once into a 512-frame ring (perf/README.md, "256 QPs on
// a 512-frame ring").
TEST_F(TransportTrace, SharedWindowDoesNotGrowWhereItDoesNotLimit) {
  EngineConfig ec;
  ec.max_unacked = 8;  // the QP's own window at most
  ec.cc.init_window = 8;
  ec.cc.shared_init_window = 16;
  ec.cc.shared_min_window = 4;
  use_engine(ec);
  ASSERT_TRUE(up());
  constexpr uint32_t kWrs = 400;
  uint32_t posted = 0, done = 0, max_shared = 0;
  for (int round = 0; round < 200 && done < kWrs; ++round) {
    // Keep the send queue full (ENOMEM: no room until completions).
    while (posted < kWrs && post(wr(posted + 1, IBV_WR_SEND, {sge(0, 8)})) == 0)
      ++posted;
    poll(static_cast<uint64_t>(round) * 10 * kUs);
    auto p = sent();
    EXPECT_LE(p.size(), 8u) << dump(p);
    if (!p.empty()) {
      const uint32_t last = p.back().f.psn;
      inject(ack(last, last - kSqPsn + 1));
    }
    done += static_cast<uint32_t>(cq_poll().size());
    max_shared = std::max(max_shared, engine_->cc_shared_window());
  }
  EXPECT_EQ(done, kWrs);
  // 16, grown once by the 8 ACKed while 8 were in use (2 x 8 >= 16), then
  // no more: 8 in use is less than half of 24.
  EXPECT_EQ(max_shared, 24u);
}

// The shared window's ceiling (CcParams::shared_max_window). Four QPs
// that lose nothing, each ACKed every 10 us up to its newest packet, grow
// the window past their own windows' 4 x 32 by default (no ceiling),
// while at least half of it is in use, and, with a ceiling of 64,
// to that and no further, in flight within it and one grant (16, the
// default). Uncapped, 256 QPs on a lossless af_packet port held 1 100-2 900
// packets in flight, a standing queue in the peer's ring; capped by
// default at max_unacked, 256 QPs on memif lost a fifth of their goodput
// (perf/README.md, "The standing queue").
TEST_F(TransportTrace, SharedWindowStopsAtItsCeiling) {
  constexpr int kQps = 4;
  struct Run {
    uint32_t max_shared = 0, done = 0;
    uint64_t max_in_flight = 0;
  };
  auto run = [&](uint32_t ceiling) {
    EngineConfig ec;
    ec.max_unacked = 32;
    ec.cc.init_window = 32;
    ec.cc.shared_init_window = 16;
    ec.cc.shared_min_window = 4;
    ec.cc.shared_max_window = ceiling;
    ec.tail_probe_ns = 0;
    use_engine(ec);
    std::vector<Qp*> qps;
    Run r;
    for (int i = 0; i < kQps; ++i) {
      Qp* q = up_rc(i);
      if (!q) return r;
      qps.push_back(q);
    }
    constexpr uint32_t kWrs = 600;  // per QP
    std::vector<uint32_t> posted(kQps, 0);
    for (int round = 0; round < 400 && r.done < kQps * kWrs; ++round) {
      for (int i = 0; i < kQps; ++i) {
        while (posted[i] < kWrs &&
               engine_->post_send(
                   qps[i], wr(posted[i] + 1, IBV_WR_SEND, {sge(0, 8)})) == 0)
          ++posted[i];
      }
      poll(static_cast<uint64_t>(round) * 10 * kUs);
      r.max_in_flight = std::max(r.max_in_flight, engine_->cc_in_flight());
      std::vector<int64_t> newest(kQps, -1);
      for (const Pkt& p : sent()) {
        const int i = static_cast<int>(p.f.dqpn - kPeerQpn);
        EXPECT_TRUE(i >= 0 && i < kQps) << dump({p});
        if (i >= 0 && i < kQps) newest[i] = p.f.psn;
      }
      for (int i = 0; i < kQps; ++i) {
        if (newest[i] < 0) continue;
        const auto psn = static_cast<uint32_t>(newest[i]);
        wire::RoceFields a = ack(psn, psn - sq_psn_of(i) + 1);
        a.dqpn = qps[i]->qpn();
        inject(a);
      }
      for (const ibv_wc& wc : cq_poll()) {
        EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
        ++r.done;
      }
      r.max_shared = std::max(r.max_shared, engine_->cc_shared_window());
    }
    EXPECT_EQ(ctr(ECtr::cc_shared_cuts), 0u);
    return r;
  };
  const Run by_default = run(CcParams{}.shared_max_window);
  EXPECT_EQ(by_default.done, kQps * 600u);
  EXPECT_GT(by_default.max_shared, kQps * 32u);  // no ceiling, not 4 x 32
  EXPECT_GT(by_default.max_in_flight, 64u + 16);
  EXPECT_LE(by_default.max_in_flight, kQps * 32u);  // their own windows
  const Run set = run(64);
  EXPECT_EQ(set.done, kQps * 600u);
  EXPECT_EQ(set.max_shared, 64u);
  EXPECT_LE(set.max_in_flight, 64u + 16);
  EXPECT_GT(set.max_in_flight, 32u + 16);
  std::printf(
      "[ ceiling  ] default: window %u at most, %lu in flight; 64: %u, %lu\n",
      by_default.max_shared,
      static_cast<unsigned long>(by_default.max_in_flight), set.max_shared,
      static_cast<unsigned long>(set.max_in_flight));
}

// Grants of the shared window (CcParams::grant): 16 QPs with work share a
// window of 32 packets. The peer answers each QP's newest packet that asked
// for an ACK, every 10 us. With grants of 8, at most 4 QPs (and one
// draining) have packets in flight, each asks for an ACK once per 4
// packets, in flight stays within the window plus one grant, and every QP
// gets its turns and completes. Without grants (0), all 16 share the 32
// and ask for ACKs at least 1.25 times as often, each on the packet that
// fills its share of 2 (measured: 179 vs 128; 233 while a QP also asked
// twice per share rather than twice per window of its own).
// The grant traces' engine: QP windows of 64, a shared window from `init`
// to `max` packets (floor 16), grants of `grant`, no tail-loss probes.
EngineConfig grant_engine(uint32_t init, uint32_t max, uint32_t grant) {
  EngineConfig ec;
  ec.cc.init_window = 64;
  ec.cc.shared_init_window = init;
  ec.cc.shared_min_window = 16;
  ec.cc.shared_max_window = max;
  ec.cc.grant = grant;
  ec.tail_probe_ns = 0;
  return ec;
}

struct GrantRun {
  uint32_t data = 0, ack_reqs = 0, max_active = 0, waits = 0;
  uint64_t max_in_flight = 0;
  int rounds = 0;
  bool all_done = false;
  std::vector<int> first_round;  // per QP: the round of its first packet
};

TEST_F(TransportTrace, SharedWindowGrantsTakeTurns) {
  constexpr int kQps = 16;
  constexpr uint32_t kWrs = 8;  // 4 KiB SENDs: 4 packets each
  auto run = [&](uint32_t grant) {
    use_engine(grant_engine(32, 32, grant));
    std::vector<Qp*> qps;
    GrantRun r;
    r.first_round.assign(kQps, -1);
    for (int i = 0; i < kQps; ++i) {
      Qp* q = up_rc(i);
      if (!q) return r;
      for (uint32_t k = 0; k < kWrs; ++k)
        EXPECT_EQ(engine_->post_send(q, wr(k + 1, IBV_WR_SEND, {sge(0, 4096)})),
                  0);
      qps.push_back(q);
    }
    std::vector<uint32_t> done(kQps, 0);
    for (; r.rounds < 400 && !r.all_done; ++r.rounds) {
      poll(static_cast<uint64_t>(r.rounds) * 10 * kUs);
      r.max_in_flight = std::max(r.max_in_flight, engine_->cc_in_flight());
      r.max_active = std::max(r.max_active, engine_->cc_active_qps());
      std::vector<int64_t> ack_to(kQps, -1);
      for (const Pkt& p : sent()) {
        const int i = static_cast<int>(p.f.dqpn - kPeerQpn);
        EXPECT_TRUE(i >= 0 && i < kQps) << dump({p});
        if (i < 0 || i >= kQps) continue;
        ++r.data;
        if (r.first_round[i] < 0) r.first_round[i] = r.rounds;
        if (p.f.ack_req) {
          ++r.ack_reqs;
          ack_to[i] = p.f.psn;
        }
      }
      for (int i = 0; i < kQps; ++i) {
        if (ack_to[i] < 0) continue;
        const auto psn = static_cast<uint32_t>(ack_to[i]);
        wire::RoceFields a = ack(psn, (psn - sq_psn_of(i) + 1) / 4);
        a.dqpn = qps[i]->qpn();
        inject(a);
      }
      for (const ibv_wc& wc : cq_poll()) {
        EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
        for (int i = 0; i < kQps; ++i)
          if (wc.qp_num == qps[i]->qpn()) ++done[i];
      }
      r.all_done = std::all_of(done.begin(), done.end(),
                               [&](uint32_t d) { return d == kWrs; });
    }
    r.waits = static_cast<uint32_t>(ctr(ECtr::cc_grant_waits));
    return r;
  };

  const GrantRun on = run(8);
  EXPECT_TRUE(on.all_done) << on.rounds << " rounds";
  EXPECT_EQ(on.data, kQps * kWrs * 4);  // nothing lost: nothing resent
  EXPECT_LE(on.max_active, 5u);
  EXPECT_LE(on.max_in_flight, 32u + 8u);
  EXPECT_GE(on.waits, 12u);  // QPs 5..16 waited for their first grant
  EXPECT_LE(on.ack_reqs * 4, on.data) << on.ack_reqs << " of " << on.data;
  for (int i = 0; i < kQps; ++i)
    EXPECT_GE(on.first_round[i], 0) << "QP " << i << " never sent";

  const GrantRun off = run(0);
  EXPECT_TRUE(off.all_done) << off.rounds << " rounds";
  EXPECT_EQ(off.max_active, static_cast<uint32_t>(kQps));
  EXPECT_EQ(off.waits, 0u);
  EXPECT_GE(off.ack_reqs * 4, on.ack_reqs * 5)
      << off.ack_reqs << " of " << off.data;
  std::printf(
      "[ grants   ] %u data packets: grants of 8: %u asked for an "
      "ACK, %u QPs at most in flight, %d rounds; none: %u, %u, %d\n",
      on.data, on.ack_reqs, on.max_active, on.rounds, off.ack_reqs,
      off.max_active, off.rounds);
}

// The grants' floor, min_window per QP with work, counts only the QPs in
// flight or granted while the requesters resend more than 10 % of what
// they send (judged per 8 192 packets, held for 8 such samples): 1 024 QPs
// kept 2 048 packets in flight into a 512-frame ring, resent half of them
// and failed with retry exceeded (perf/README.md).
TEST_F(TransportTrace, HeavyResendingDropsTheGrantFloorToTheQpsInFlight) {
  // A shared window of 16 (its ceiling) under a floor capped at 64 (the
  // initial window, GrantFloorStopsAtTheInitialSharedWindow).
  use_engine(grant_engine(64, 16, 8));
  constexpr int kQps = 32;
  for (int i = 0; i < kQps; ++i) {
    Qp* q = up_rc(i);
    ASSERT_NE(q, nullptr);
    ASSERT_EQ(engine_->post_send(q, wr(1, IBV_WR_SEND, {sge(0, 4096)})), 0);
  }
  poll(0);
  sent();
  const Engine& e = *engine_;
  const uint64_t in_flight_qps = e.cc_active_ + e.cc_granted_;
  ASSERT_LT(in_flight_qps, uint64_t{kQps});
  // Expect: min_window (2) per QP with work, above the shared window (16).
  EXPECT_EQ(e.cc_limit(), 2u * (e.cc_active_ + e.cc_waiting_));
  EXPECT_EQ(e.cc_active_ + e.cc_waiting_, uint32_t{kQps});
  auto sample = [&](uint32_t pct) {  // one sample, pct % of it resent
    const uint32_t n = CcParams::kFloorSample * pct / 100;
    for (uint32_t i = 0; i < CcParams::kFloorSample; ++i)
      engine_->cc_floor_count(i < n);
  };
  sample(10);  // not more than the threshold
  EXPECT_EQ(e.cc_limit(), 2u * kQps);
  sample(11);
  EXPECT_EQ(ctr(ECtr::cc_floor_drops), 1u);
  EXPECT_EQ(e.cc_limit(), std::max<uint64_t>(16, 2 * in_flight_qps));
  for (uint32_t k = 0; k + 1 < CcParams::kFloorHold; ++k) sample(0);
  EXPECT_EQ(e.cc_limit(), std::max<uint64_t>(16, 2 * in_flight_qps)) << "held";
  sample(0);
  EXPECT_EQ(e.cc_limit(), 2u * kQps) << "restored";
  EXPECT_EQ(ctr(ECtr::cc_floor_drops), 1u);
}

// The grants' floor, min_window per QP with work, stops at the initial
// shared window: 32 QPs with work have a floor of 32, not 64. With grants
// of 8 they would fill it eight times over, so a grant is twice that (16):
// two QPs go at a time, 16 packets each, the 16th asking for the ACK. Two
// or six QPs with work (16 or 48 packets of grants: not twice over) are not
// crowded and get grants of 8.
TEST_F(TransportTrace, GrantFloorStopsAtTheInitialSharedWindow) {
  use_engine(grant_engine(32, 32, 8));
  const Engine& e = *engine_;
  std::vector<Qp*> qps;
  auto post = [&](Qp* q) {
    for (uint64_t k = 0; k < 8; ++k)  // 4 KiB SENDs: 32 packets
      ASSERT_EQ(engine_->post_send(q, wr(k + 1, IBV_WR_SEND, {sge(0, 4096)})),
                0);
  };
  for (int i = 0; i < 2; ++i) {
    qps.push_back(up_rc(i));
    ASSERT_NE(qps.back(), nullptr);
  }
  post(qps[0]);
  post(qps[1]);
  poll(0);
  EXPECT_EQ(e.cc_grant(), 8u) << "two QPs: not crowded";
  EXPECT_EQ(e.cc_limit(), 32u);
  const auto first = sent();
  for (int i = 2; i < 32; ++i) {
    qps.push_back(up_rc(i));
    ASSERT_NE(qps.back(), nullptr);
    post(qps.back());
    if (i != 5) continue;
    // Six QPs' grants of 8 (48) fill the limit of 32 once over, not twice:
    // not crowded yet.
    poll(kUs / 2);
    ASSERT_EQ(e.cc_active_ + e.cc_granted_ + e.cc_waiting_, 6u);
    EXPECT_EQ(e.cc_limit(), 32u);
    EXPECT_EQ(e.cc_grant(), 8u) << "six QPs: once over, not crowded";
  }
  poll(kUs);
  EXPECT_EQ(sent().size(), 0u) << "the window is full";
  EXPECT_EQ(e.cc_active_ + e.cc_granted_ + e.cc_waiting_, 32u);
  EXPECT_EQ(e.cc_limit(), 32u) << "2 x 32 QPs, capped at the initial 32";
  EXPECT_EQ(e.cc_grant(), 16u) << "crowded: twice the grant of 8";

  // Drain QPs 0 and 1 with one ACK each: the next two in the queue take
  // grants of 16 and stop there, the last packet of each asking for an ACK.
  std::vector<int64_t> last(2, -1);
  for (const Pkt& p : first) {
    const int i = static_cast<int>(p.f.dqpn - kPeerQpn);
    ASSERT_TRUE(i == 0 || i == 1) << dump({p});
    last[i] = p.f.psn;
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_GE(last[i], 0);
    const auto psn = static_cast<uint32_t>(last[i]);
    wire::RoceFields a = ack(psn, (psn - sq_psn_of(i) + 1) / 4);
    a.dqpn = qps[i]->qpn();
    inject(a);
  }
  poll(2 * kUs);
  std::map<int, std::vector<Pkt>> by_qp;
  for (const Pkt& p : sent())
    by_qp[static_cast<int>(p.f.dqpn - kPeerQpn)].push_back(p);
  ASSERT_EQ(by_qp.size(), 2u);
  for (const auto& [i, pkts] : by_qp) {
    EXPECT_GE(i, 2) << "QPs 0 and 1 queue behind the others";
    EXPECT_EQ(pkts.size(), 16u) << "QP " << i;
    EXPECT_TRUE(pkts.back().f.ack_req) << "QP " << i;
  }
}

// A QP whose peer went silent keeps its packets counted until its timeout
// (for ever with timeout 0) and must not hold up another QP's first grant:
// admission also counts senders, not only packets in flight.
TEST_F(TransportTrace, GrantsDoNotWaitForASilentPeer) {
  use_engine(grant_engine(64, 64, 16));
  QpOpts o;
  o.timeout = 0;  // no Local ACK Timeout: A's packets stay in flight
  ASSERT_TRUE(up(IBV_QPT_RC, o));
  for (uint64_t i = 0; i < 64; ++i)
    ASSERT_EQ(post(wr(i + 1, IBV_WR_SEND, {sge(0, 1024)})), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 64u);  // the whole shared window; no ACK comes
  Qp* b = create_qp(IBV_QPT_RC);
  ASSERT_EQ(bring_up(b, IBV_QPT_RC, kPeerQpn + 1, kSqPsn, kRqPsn, IBV_MTU_1024),
            0);
  for (uint64_t i = 0; i < 4; ++i)
    ASSERT_EQ(engine_->post_send(b, wr(i + 1, IBV_WR_SEND, {sge(0, 1024)})), 0);
  poll(10 * kUs);
  const auto p = sent();
  ASSERT_EQ(p.size(), 4u) << dump(p);
  for (const Pkt& x : p) EXPECT_EQ(x.f.dqpn, kPeerQpn + 1);
  EXPECT_EQ(ctr(ECtr::cc_grant_waits), 0u);
}

// A QP moved from RTS straight to RESET while it waits for a grant leaves
// the queue: it is never granted one it cannot use (which would count as
// in flight for ever).
TEST_F(TransportTrace, GrantQueueForgetsAQpReset) {
  use_engine(grant_engine(16, 16, 16));  // a grant is half the limit: 8
  ASSERT_TRUE(up());
  std::vector<Qp*> q{qp_};
  for (uint32_t k = 1; k < 3; ++k) {
    q.push_back(create_qp(IBV_QPT_RC));
    ASSERT_EQ(bring_up(q[k], IBV_QPT_RC, kPeerQpn + k, kSqPsn + k * 4096,
                       kRqPsn, IBV_MTU_1024),
              0);
  }
  // A and B fill the window between them (16 + 8); C waits.
  for (uint32_t k = 0; k < 3; ++k)
    for (uint64_t i = 0; i < 16; ++i)
      ASSERT_EQ(
          engine_->post_send(q[k], wr(i + 1, IBV_WR_SEND, {sge(0, 1024)})), 0);
  poll(0);
  auto p = sent();
  uint32_t per[3] = {};
  for (const Pkt& x : p) ++per[x.f.dqpn - kPeerQpn];
  EXPECT_EQ(per[0], 16u) << dump(p);
  EXPECT_EQ(per[1], 8u) << dump(p);
  EXPECT_EQ(per[2], 0u) << dump(p);
  EXPECT_EQ(ctr(ECtr::cc_grant_waits), 1u);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RESET;
  ASSERT_EQ(engine_->modify_qp(q[2], a, IBV_QP_STATE), 0);
  // The peer ACKs everything A and B sent: nothing in flight, nobody
  // granted, nobody waiting.
  wire::RoceFields ack_a = ack(kSqPsn + 15, 16);
  inject(ack_a);
  wire::RoceFields ack_b = ack(kSqPsn + 4096 + 7, 8);
  ack_b.dqpn = q[1]->qpn();
  inject(ack_b);
  poll(10 * kUs);
  EXPECT_EQ(engine_->cc_granted_qps(), 0u);
  sent();
  ack_b = ack(kSqPsn + 4096 + 15, 16);
  ack_b.dqpn = q[1]->qpn();
  inject(ack_b);
  poll(20 * kUs);
  EXPECT_EQ(engine_->cc_in_flight(), 0u);
  EXPECT_EQ(engine_->cc_active_qps(), 0u);
  EXPECT_EQ(engine_->cc_granted_qps(), 0u);
}

// ECN, requester side: RC data leaves ECT(0); a CNP (Annex A17.9) halves
// the window once per window of data and resends nothing.
TEST_F(TransportTrace, CnpCutsTheWindowOnceAndResendsNothing) {
  EngineConfig ec;
  ec.cc.init_window = 16;
  ec.cc.dcqcn = false;  // algorithm window: a CNP cuts the windows
  use_engine(ec);
  ASSERT_TRUE(up());
  for (uint64_t i = 0; i < 40; ++i)
    ASSERT_EQ(post(wr(i + 1, IBV_WR_SEND, {sge(0, 8)})), 0);
  poll(0);
  auto p = sent();
  ASSERT_EQ(p.size(), 16u);
  for (const auto& x : p) EXPECT_EQ(x.f.tclass & 0x3, 0x2) << "ECT(0)";
  // A CNP from another address, and one with a P_Key outside the table:
  // dropped, counted, nothing cut.
  wire::RoceFields cnp = pkt(op::kCnp, 0);
  cnp.becn = true;
  inject_from_ = kPeerIp + 7;
  inject(cnp);
  inject_from_ = kPeerIp;
  wire::RoceFields foreign = cnp;
  foreign.pkey = 0x1234;
  inject(foreign);
  poll(5 * kUs);
  EXPECT_EQ(ctr(ECtr::rx_bad_addr), 1u);
  EXPECT_EQ(ctr(ECtr::rx_bad_pkey), 1u);
  EXPECT_EQ(ctr(ECtr::cnps_rx), 0u);
  // Peer: two CNPs (its path marked CE twice within one window).
  inject(cnp);
  inject(cnp);
  poll(10 * kUs);
  // Expect: no packet at all (16 in flight, window 16 -> 8), one cut.
  EXPECT_TRUE(sent().empty());
  EXPECT_EQ(ctr(ECtr::cnps_rx), 2u);
  EXPECT_EQ(ctr(ECtr::cc_window_cuts), 1u);
  EXPECT_EQ(ctr(ECtr::retransmits), 0u);
  EXPECT_EQ(qp_->counters().cc_window.get(), 8u);
  // Peer: ACK all 16. Expect: new data, not a resend: P+16 on.
  inject(ack(kSqPsn + 15, 16));
  poll(20 * kUs);
  EXPECT_EQ(cq_poll().size(), 16u);
  p = sent();
  ASSERT_FALSE(p.empty());
  EXPECT_EQ(p[0].f.psn, kSqPsn + 16);
}

// DCQCN on a 10 Gb/s line whose first CNP sets the rate to 100 Mb/s (12.5
// bytes per us) and that raises it in no trace (20 ms to its first
// increase); a paced QP's burst is `burst_bytes`.
namespace {
EngineConfig dcqcn_cut_to_100mbps(uint32_t burst_bytes) {
  EngineConfig ec;
  ec.cc.dcqcn = true;
  ec.cc.line_rate_mbps = 10000;
  ec.cc.dcqcn_params.rate_to_set_on_first_cnp = 100;
  ec.cc.dcqcn_params.rpg_time_reset = 20000;
  ec.cc.pace_burst_bytes = burst_bytes;
  return ec;
}
}  // namespace

// DCQCN, reaction point: with cc.dcqcn (the default) a CNP cuts the QP's rate,
// not its windows, and the requester then leaves at that rate: one burst of
// tokens, then what the rate earns, put back on the wire by the pace timer.
TEST_F(TransportTrace, CnpUnderDcqcnPacesTheQpAtTheCutRate) {
  EngineConfig ec = dcqcn_cut_to_100mbps(16384);
  ec.cc.init_window = 16;
  ec.tail_probe_ns = 0;  // no ACKs come in this trace: no probes either
  use_engine(ec);
  ASSERT_TRUE(up());
  for (uint64_t i = 0; i < 64; ++i)
    ASSERT_EQ(post(wr(i + 1, IBV_WR_SEND, {sge(0, 1024)})), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 16u);  // the window, unpaced
  wire::RoceFields cnp = pkt(op::kCnp, 0);
  cnp.becn = true;
  now_ = 5 * kUs;
  inject(cnp);
  EXPECT_EQ(ctr(ECtr::cc_rate_cuts), 1u);
  EXPECT_EQ(ctr(ECtr::cc_window_cuts), 0u);
  EXPECT_EQ(qp_->counters().cc_rate_mbps.get(), 100u);
  // All 16 ACKed: the window (now 32) would let 32 more go; the pacer lets
  // its 16 KiB burst go (15 frames of 1082 bytes and one on the rest).
  now_ = 10 * kUs;
  inject(ack(kSqPsn + 15, 16));
  poll(10 * kUs);
  auto p = sent();
  EXPECT_EQ(p.size(), 16u) << dump(p);
  EXPECT_TRUE(sent().empty());
  poll(50 * kUs);
  EXPECT_TRUE(sent().empty()) << "40 us earn 500 bytes: still in debt";
  // 1 ms at 100 Mb/s is 12500 bytes: 11 or 12 frames, sent when the pace
  // timer fires; nothing was resent.
  poll(1010 * kUs);
  p = sent();
  EXPECT_GE(p.size(), 10u) << dump(p);
  EXPECT_LE(p.size(), 13u) << dump(p);
  EXPECT_EQ(ctr(ECtr::retransmits), 0u);
}

// A paced QP stops on its pacer with packets out that have not asked for
// an ACK; meanwhile more QPs start sending and its share of the shared
// window falls below what it has out. Its next packet goes anyway and
// asks: nothing else would answer the unasked ones but the Local ACK
// Timeout (64 QPs through a 2 Gb/s bottleneck: ~740 timeouts in 3 s with
// nothing lost, perf/README.md "bottleneck").
TEST_F(TransportTrace, APacedQpWhoseShareShrankAsksForAnAck) {
  EngineConfig ec = dcqcn_cut_to_100mbps(4096);
  ec.cc.init_window = 64;
  ec.cc.shared_init_window = 16;
  ec.cc.shared_min_window = 16;
  ec.cc.shared_max_window = 16;  // a QP's share: 16 / QPs in flight
  ec.cc.grant = 0;
  ec.tail_probe_ns = 0;
  use_engine(ec);
  ASSERT_TRUE(up());
  // One 64-packet WRITE: only its last packet asks by itself.
  ASSERT_EQ(post(rdma(1, IBV_WR_RDMA_WRITE, {sge(0, 65536)}, kPeerVa)), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 16u);  // the shared window, unpaced
  wire::RoceFields cnp = pkt(op::kCnp, 0);
  cnp.becn = true;
  now_ = 5 * kUs;
  inject(cnp);
  ASSERT_EQ(qp_->counters().cc_rate_mbps.get(), 100u);
  // 16 ACKed: the pacer lets its 4 KiB burst go, none of it asking.
  now_ = 10 * kUs;
  inject(ack(kSqPsn + 15, 0));
  poll(10 * kUs);
  auto p = sent();
  ASSERT_EQ(p.size(), 4u) << dump(p);
  for (const Pkt& x : p) ASSERT_FALSE(x.f.ack_req) << dump(p);
  // Three more QPs with packets in flight: the share is 16 / 4 = 4.
  for (uint32_t i = 1; i <= 3; ++i) {
    Qp* q = up_rc(static_cast<int>(i));
    ASSERT_NE(q, nullptr);
    ASSERT_EQ(engine_->post_send(q, wr(100 + i, IBV_WR_SEND, {sge(0, 1024)})),
              0);
  }
  poll(20 * kUs);
  ASSERT_EQ(sent().size(), 3u);
  ASSERT_EQ(engine_->cc_active_qps(), 4u);
  // Expect: once the pacer allows (~1 ms at 100 Mb/s), one more packet
  // from qp_, past its share of 4, asking for the ACK of all five.
  poll(2 * kMs);
  p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.dqpn, kPeerQpn);
  EXPECT_EQ(p[0].f.psn, kSqPsn + 20);
  EXPECT_TRUE(p[0].f.ack_req);
  // Its ACK brings progress, not a retry.
  now_ = 2100 * kUs;
  inject(ack(kSqPsn + 20, 0));
  poll(2100 * kUs);
  EXPECT_EQ(ctr(ECtr::timeouts), 0u);
  EXPECT_EQ(ctr(ECtr::retransmits), 0u);
  // Limited with the WRITE unfinished: it shares the DCQCN timer; in the
  // error state it sends nothing and no longer does.
  EXPECT_EQ(engine_->dcqcn_sharing_qps(), 1u);
  ASSERT_EQ(to_error(qp_), 0);
  EXPECT_EQ(engine_->dcqcn_sharing_qps(), 0u);
}

// ECN, responder side: a CE-marked request is answered with a CNP to the
// sending QP (BECN set, not ECN-capable itself), at most one per interval.
TEST_F(TransportTrace, CeMarkedRequestIsAnsweredWithOneCnpPerInterval) {
  EngineConfig ec;
  ec.cc.cnp_interval_ns = 50 * kUs;
  use_engine(ec);
  QpOpts o;
  o.access = IBV_ACCESS_REMOTE_WRITE;
  ASSERT_TRUE(up(IBV_QPT_RC, o));
  auto ce_write = [&](uint32_t i) {
    wire::RoceFields f =
        write_req(op::kRcWriteOnly, kRqPsn + i, false, addr(0), 8);
    f.tclass = 0x3;  // CE
    inject(f, std::vector<uint8_t>(8, 1));
  };
  now_ = 1 * kUs;
  ce_write(0);
  ce_write(1);
  poll(2 * kUs);
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kCnp);
  EXPECT_EQ(p[0].f.dqpn, kPeerQpn);
  EXPECT_TRUE(p[0].f.becn);
  EXPECT_EQ(p[0].f.tclass & 0x3, 0);
  // 20 us later: still inside the interval. 60 us later: a new CNP.
  now_ = 21 * kUs;
  ce_write(2);
  poll(22 * kUs);
  EXPECT_TRUE(sent().empty());
  now_ = 61 * kUs;
  ce_write(3);
  poll(62 * kUs);
  p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kCnp);
  EXPECT_EQ(ctr(ECtr::cnps_tx), 2u);
  EXPECT_EQ(qp_->counters().cnps_tx.get(), 2u);
  // The writes themselves were executed as usual.
  EXPECT_EQ(ctr(ECtr::rx_out_of_seq), 0u);
}

// UC has no window and no ACKs: DCQCN's rate is all it can back off with.
// Its data leaves ECN-capable, a CE-marked UC request is answered with a
// CNP, and a CNP cuts the UC requester's rate, which then paces it. Until
// 2026-11-29 only RC was: a UC stream filled a marking switch queue
// unchecked (TransportSim.BottleneckUc).
TEST_F(TransportTrace, UcIsEctAnsweredWithCnpsAndPacedByDcqcn) {
  EngineConfig ec = dcqcn_cut_to_100mbps(16384);
  ec.cc.cnp_interval_ns = 50 * kUs;
  use_engine(ec);
  QpOpts o;
  o.access = IBV_ACCESS_REMOTE_WRITE;
  ASSERT_TRUE(up(IBV_QPT_UC, o));
  // Responder: a CE-marked UC WRITE, executed, and a CNP back.
  now_ = 1 * kUs;
  wire::RoceFields w =
      write_req(op::kUcBase + op::kRcWriteOnly, kRqPsn, false, addr(0), 8);
  w.tclass = 0x3;  // CE
  inject(w, std::vector<uint8_t>(8, 7));
  poll(2 * kUs);
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kCnp);
  EXPECT_EQ(p[0].f.dqpn, kPeerQpn);
  EXPECT_EQ(bytes(0, 8), std::vector<uint8_t>(8, 7));
  EXPECT_EQ(qp_->counters().cnps_tx.get(), 1u);
  // Requester: unpaced, ECT(0), until a CNP.
  for (uint64_t i = 0; i < 8; ++i)
    ASSERT_EQ(post(rdma(i + 1, IBV_WR_RDMA_WRITE, {sge(0, 1024)}, kPeerVa)), 0);
  poll(3 * kUs);
  p = sent();
  ASSERT_EQ(p.size(), 8u) << dump(p);
  for (const Pkt& k : p) EXPECT_EQ(k.f.tclass & 0x3, 0x2) << dump(p);
  wire::RoceFields cnp = pkt(op::kCnp, 0);
  cnp.becn = true;
  now_ = 5 * kUs;
  inject(cnp);
  EXPECT_EQ(qp_->counters().cnps_rx.get(), 1u);
  EXPECT_EQ(qp_->counters().cc_rate_cuts.get(), 1u);
  EXPECT_EQ(qp_->counters().cc_rate_mbps.get(), 100u);
  // Now paced at 100 Mb/s: the 16 KiB burst (15 frames of 1098 bytes, the
  // last into debt), then 12.5 bytes per us, put on the wire by the pace
  // timer: 1 ms later 12500 bytes, 11 or 12 frames more.
  for (uint64_t i = 0; i < 48; ++i)
    ASSERT_EQ(post(rdma(i + 9, IBV_WR_RDMA_WRITE, {sge(0, 1024)}, kPeerVa)), 0);
  poll(6 * kUs);
  p = sent();
  EXPECT_EQ(p.size(), 15u) << dump(p);
  poll(1006 * kUs);
  p = sent();
  EXPECT_GE(p.size(), 10u) << dump(p);
  EXPECT_LE(p.size(), 13u) << dump(p);
}

// With algorithm window UC has nothing a CNP could cut: its data leaves
// not ECN-capable (a marking queue drops it as before) and a CNP is only
// counted.
TEST_F(TransportTrace, UcUnderTheWindowAlgorithmIsNotEctAndOnlyCountsCnps) {
  EngineConfig ec;
  ec.cc.dcqcn = false;
  use_engine(ec);
  ASSERT_TRUE(up(IBV_QPT_UC));
  ASSERT_EQ(post(rdma(1, IBV_WR_RDMA_WRITE, {sge(0, 1024)}, kPeerVa)), 0);
  poll(0);
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.tclass & 0x3, 0) << dump(p);
  wire::RoceFields cnp = pkt(op::kCnp, 0);
  cnp.becn = true;
  inject(cnp);
  EXPECT_EQ(qp_->counters().cnps_rx.get(), 1u);
  EXPECT_EQ(ctr(ECtr::cc_rate_cuts), 0u);
  EXPECT_EQ(ctr(ECtr::cc_window_cuts), 0u);
  EXPECT_EQ(ctr(ECtr::rx_bad_type), 0u);
}

// READ data flows responder -> requester, so ECN and DCQCN run the other
// way: READ responses leave ECN-capable and are paced at the QP's DCQCN
// rate (cut by a CNP like its requests), and a CE-marked READ response is
// answered with a CNP by the requester. Without this a READ-heavy peer
// filled a marking switch queue unchecked (TransportSim.BottleneckLoss1).
TEST_F(TransportTrace, ReadResponsesAreEctPacedAndAnsweredWithCnps) {
  EngineConfig ec = dcqcn_cut_to_100mbps(4096);
  ec.tail_probe_ns = 0;
  use_engine(ec);
  ASSERT_TRUE(up());
  put(0x60000, pattern(8192, 0x21));
  // Responder side: a CNP cuts this QP to 100 Mb/s, then the peer READs
  // 8 KiB (8 responses of 1 KiB): the 4 KiB burst goes, the rest waits for
  // the pace timer.
  wire::RoceFields cnp = pkt(op::kCnp, 0);
  cnp.becn = true;
  now_ = 1 * kUs;
  inject(cnp);
  EXPECT_EQ(ctr(ECtr::cc_rate_cuts), 1u);
  inject(write_req(op::kRcReadRequest, kRqPsn, true, addr(0x60000), 8192));
  poll(2 * kUs);
  auto p = without_acks(sent());
  ASSERT_GE(p.size(), 3u) << dump(p);
  ASSERT_LE(p.size(), 5u) << dump(p);
  for (const auto& x : p) EXPECT_EQ(x.f.tclass & 0x3, 0x2) << "ECT(0)";
  // Limited with responses due: it shares the DCQCN timer (its empty send
  // queue does not make it idle).
  EXPECT_EQ(engine_->dcqcn_sharing_qps(), 1u);
  // 8 KiB at 100 Mb/s: ~655 us for all. By 1 ms the timer sent the rest,
  // in order.
  size_t n = p.size();
  uint32_t next = kRqPsn + static_cast<uint32_t>(n);
  for (uint64_t t = 50; t <= 1000 && n < 8; t += 50) {
    poll(t * kUs);
    for (const auto& x : without_acks(sent())) {
      EXPECT_EQ(x.f.psn, next++);
      EXPECT_EQ(x.f.tclass & 0x3, 0x2);
      ++n;
    }
  }
  EXPECT_EQ(n, 8u);
  EXPECT_EQ(engine_->dcqcn_sharing_qps(), 0u);  // all sent: idle
  // Requester side: our READ's response comes back CE-marked: a CNP to
  // the responder's QP.
  ASSERT_EQ(post(rdma(1, IBV_WR_RDMA_READ, {sge(0, 100)}, kPeerVa)), 0);
  poll(1100 * kUs);
  p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcReadRequest);
  const uint64_t cnps = ctr(ECtr::cnps_tx);
  wire::RoceFields r = read_resp(op::kRcReadRespOnly, kSqPsn, 1);
  r.tclass = 0x3;  // CE
  now_ = 1110 * kUs;
  inject(r, pattern(100, 7));
  poll(1111 * kUs);
  p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kCnp);
  EXPECT_EQ(p[0].f.dqpn, kPeerQpn);
  EXPECT_EQ(ctr(ECtr::cnps_tx), cnps + 1);
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_RDMA_READ);
}

// A sequence NAK: go-back-N from the NAKed PSN as before, but the window is
// halved first, so only half as many packets are resent at once; a second
// NAK inside the same window of data is the same congestion event.
TEST_F(TransportTrace, SequenceNakHalvesTheWindowOncePerWindow) {
  EngineConfig ec;
  ec.cc.init_window = 16;
  use_engine(ec);
  ASSERT_TRUE(up());
  for (uint64_t i = 0; i < 40; ++i)
    ASSERT_EQ(post(wr(i + 1, IBV_WR_SEND, {sge(0, 8)})), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 16u);
  // Peer: NAK (PSN sequence error) at P+2: P, P+1 arrived, P+2 was lost.
  now_ = 10 * kUs;
  inject(nak(kSqPsn + 2, kNakSeq));
  poll(10 * kUs);
  // Expect: wr 1, 2 complete (implied ACK: slow start 16 -> 18), then the
  // window is cut once, 18 -> 9; P+2.. resent, 9 packets: P+2..P+10.
  EXPECT_EQ(cq_poll().size(), 2u);
  auto p = sent();
  ASSERT_EQ(p.size(), 9u) << dump(p);
  EXPECT_EQ(p[0].f.psn, kSqPsn + 2);
  EXPECT_EQ(p[8].f.psn, kSqPsn + 10);
  EXPECT_TRUE(p[8].f.ack_req);
  EXPECT_EQ(ctr(ECtr::cc_window_cuts), 1u);
  // Peer: a NAK at P+5 (P+5 of the first flight was lost too). Expect: the
  // go-back to P+5, but no second cut: the window stays 9 (ssthresh 9: the
  // 3 packets the NAK acknowledged are 3/9 of the next increase).
  inject(nak(kSqPsn + 5, kNakSeq));
  poll(20 * kUs);
  p = sent();
  ASSERT_FALSE(p.empty());
  EXPECT_EQ(p[0].f.psn, kSqPsn + 5);
  EXPECT_EQ(ctr(ECtr::cc_window_cuts), 1u);
  EXPECT_EQ(qp_->counters().cc_window.get(), 9u);
}

// A retransmit timeout: nothing came back at all, the window drops to
// min_window; then slow start from there.
TEST_F(TransportTrace, RetransmitTimeoutDropsTheWindowToTheMinimum) {
  EngineConfig ec;
  ec.cc.init_window = 16;
  ec.cc.min_window = 2;
  use_engine(ec);
  QpOpts o;
  o.timeout = 10;
  ASSERT_TRUE(up(IBV_QPT_RC, o));
  const uint64_t T = ack_timeout_ns(10);
  for (uint64_t i = 0; i < 20; ++i)
    ASSERT_EQ(post(wr(i + 1, IBV_WR_SEND, {sge(0, 8)})), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 16u);
  poll(T + kSlack);
  auto p = sent();
  // Expect: P, P+1 again (window 2), AckReq on P+1.
  ASSERT_EQ(p.size(), 2u) << dump(p);
  EXPECT_EQ(p[0].f.psn, kSqPsn);
  EXPECT_TRUE(p[1].f.ack_req);
  EXPECT_EQ(ctr(ECtr::timeouts), 1u);
  EXPECT_EQ(ctr(ECtr::cc_window_cuts), 1u);
  // Peer: ACK P+1. Expect: slow start, 4 packets: P+2..P+5.
  now_ = T + 10 * kUs;
  inject(ack(kSqPsn + 1, 2));
  poll(T + 20 * kUs);
  p = sent();
  ASSERT_EQ(p.size(), 4u) << dump(p);
  EXPECT_EQ(p[0].f.psn, kSqPsn + 2);
}

// A resend leads the pass after its go-back: QP 0's packet times out while
// QP 1 has a full turn of new data queued. A receiver whose ring is nearly
// full drops the tail of a transmit burst; the resend used to come after
// every other QP's data, at that tail, and on af_packet one QP's resend was
// dropped at each of its 8 tries until retry exceeded (perf/README.md,
// "resends first").
TEST_F(TransportTrace, ResendAfterATimeoutLeadsTheNextPass) {
  EngineConfig ec;
  ec.tail_probe_ns = 0;
  use_engine(ec);
  QpOpts o;
  o.timeout = 10;
  const uint64_t T = ack_timeout_ns(10);
  Qp* q0 = create_qp(IBV_QPT_RC, o);
  Qp* q1 = create_qp(IBV_QPT_RC, o);
  ASSERT_EQ(bring_up(q0, IBV_QPT_RC, kPeerQpn, kSqPsn, kRqPsn, IBV_MTU_1024, o),
            0);
  ASSERT_EQ(bring_up(q1, IBV_QPT_RC, kPeerQpn + 1, kSqPsn + 4096, kRqPsn,
                     IBV_MTU_1024, o),
            0);
  ASSERT_EQ(engine_->post_send(q0, wr(1, IBV_WR_SEND, {sge(0, 8)})), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 1u);
  // QP 1's work arrives before QP 0's timer fires: it is ready first.
  for (uint64_t k = 0; k < 8; ++k)
    ASSERT_EQ(engine_->post_send(q1, wr(k + 1, IBV_WR_SEND, {sge(0, 4096)})),
              0);
  poll(T + kSlack);
  const auto p = sent();
  EXPECT_EQ(ctr(ECtr::timeouts), 1u);
  ASSERT_GE(p.size(), 2u) << dump(p);
  // Expect: QP 0's resend (P) first, then QP 1's new data.
  EXPECT_EQ(p[0].f.dqpn, kPeerQpn) << dump(p);
  EXPECT_EQ(p[0].f.psn, kSqPsn);
  EXPECT_EQ(p[1].f.dqpn, kPeerQpn + 1);
  // The grants' floor sees every RC data packet sent, and the resend as
  // one (HeavyResendingDropsTheGrantFloorToTheQpsInFlight).
  EXPECT_EQ(engine_->cc_floor_sent_, 1 + p.size());
  EXPECT_EQ(engine_->cc_floor_resent_, 1u);
}

// A poll fills the caller's transmit burst (EngineConfig::tx_fill): one QP
// with data sends one turn (tx_quantum, here 16 KiB: 16 packets of 1 KiB) per
// pass; a pass that sent less than tx_fill goes round again, and none starts
// once tx_fill packets are sent. On af_packet a half-full burst costs a sendto
// of a full one (perf/README.md, "Full bursts").
TEST_F(TransportTrace, APollFillsTheTransmitBurst) {
  for (const uint32_t fill : {1u, 32u, 40u}) {
    SCOPED_TRACE(fill);
    EngineConfig ec;
    ec.tx_fill = fill;
    ec.tx_quantum = 16384;
    ec.cc.window = false;  // the window does not stop it at 32
    use_engine(ec);
    Qp* q = create_qp(IBV_QPT_RC);
    ASSERT_EQ(bring_up(q, IBV_QPT_RC, kPeerQpn, kSqPsn, kRqPsn, IBV_MTU_1024),
              0);
    for (uint64_t k = 0; k < 16; ++k)  // 64 packets
      ASSERT_EQ(engine_->post_send(q, wr(k + 1, IBV_WR_SEND, {sge(0, 4096)})),
                0);
    engine_->poll(0);  // one poll (the fixture's poll() runs to idle)
    // Expect: one turn; two (32 >= 32); three (48 >= 40).
    const auto p = sent();
    EXPECT_EQ(p.size(), fill == 1 ? 16u : fill == 32 ? 32u : 48u) << dump(p);
    EXPECT_TRUE(engine_->busy());  // the rest waits for the next poll
  }
  // An ACK the poll sends fills the burst too: with tx_fill 17, one ACK and
  // one turn of 16 packets make it, and no second pass starts.
  EngineConfig ec;
  ec.tx_fill = 17;
  ec.tx_quantum = 16384;
  ec.cc.window = false;
  use_engine(ec);
  qp_ = create_qp(IBV_QPT_RC);
  ASSERT_EQ(bring_up(qp_, IBV_QPT_RC, kPeerQpn, kSqPsn, kRqPsn, IBV_MTU_1024),
            0);
  for (uint64_t k = 0; k < 16; ++k)
    ASSERT_EQ(post(wr(k + 1, IBV_WR_SEND, {sge(0, 4096)})), 0);
  ASSERT_EQ(post_recv(rwr(7, {sge(0x10000, 64)})), 0);
  inject(pkt(op::kRcSendOnly, kRqPsn, true), pattern(8, 1));
  engine_->poll(0);
  const auto p = sent();
  EXPECT_EQ(p.size(), 17u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcAck) << dump(p);
}

TEST_F(TransportTrace, TxFullLosesNothing) {
  ASSERT_TRUE(up());
  put(0, pattern(2500, 0x5a));
  // The TX queue takes one frame, then is full.
  io_.room = 1;
  ASSERT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 2500)})), 0);
  poll(0);
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcSendFirst);
  EXPECT_GE(ctr(ECtr::tx_full), 1u);
  EXPECT_TRUE(engine_->busy());
  // TX has room again. Expect: the rest, in order, nothing lost or doubled.
  io_.room = -1;
  poll(1 * kUs);
  p = sent();
  ASSERT_EQ(p.size(), 2u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcSendMiddle);
  EXPECT_EQ(p[0].f.psn, kSqPsn + 1);
  EXPECT_EQ(p[0].payload, bytes(1024, 1024));
  EXPECT_EQ(p[1].f.opcode, op::kRcSendLast);
  EXPECT_EQ(p[1].f.psn, kSqPsn + 2);
  // Responder side: an ACK due while TX is full is sent later.
  ASSERT_EQ(post_recv(rwr(7, {sge(0x10000, 64)})), 0);
  io_.room = 0;
  inject(pkt(op::kRcSendOnly, kRqPsn, true), pattern(8, 1));
  poll(2 * kUs);
  EXPECT_TRUE(sent().empty());
  io_.room = -1;
  poll(3 * kUs);
  p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcAck);
  EXPECT_EQ(p[0].f.psn, kRqPsn);
}

TEST_F(TransportTrace, SqdQueuesPostedWrsUntilRts) {
  ASSERT_TRUE(up());
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_SQD;
  ASSERT_EQ(engine_->modify_qp(qp_, a, IBV_QP_STATE), 0);
  // Post in SQD: accepted, not sent.
  ASSERT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 8)})), 0);
  poll(0);
  EXPECT_TRUE(sent().empty());
  // SQD -> RTS. Expect: the WR goes out.
  a.qp_state = IBV_QPS_RTS;
  ASSERT_EQ(engine_->modify_qp(qp_, a, IBV_QP_STATE), 0);
  poll(1 * kUs);
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.psn, kSqPsn);
}

// A QP in SQD with a WR still unacknowledged is draining: a modify out of
// SQD (or SQD -> SQD) is refused until it drains, except to ERR (as rxe).
TEST_F(TransportTrace, SqdRefusesModifyWhileDraining) {
  ASSERT_TRUE(up());
  ASSERT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 8)})), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 1u);
  ASSERT_EQ(to_state(IBV_QPS_SQD), 0);
  EXPECT_EQ(sq_draining(), 1);
  const char* why = nullptr;
  EXPECT_EQ(to_state(IBV_QPS_RTS, &why), EINVAL);
  ASSERT_NE(why, nullptr);
  EXPECT_NE(std::string(why).find("draining"), std::string::npos) << why;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_SQD;
  a.retry_cnt = 3;
  EXPECT_EQ(engine_->modify_qp(qp_, a, IBV_QP_STATE | IBV_QP_RETRY_CNT),
            EINVAL);
  EXPECT_EQ(qp_->state(), IBV_QPS_SQD);
  // The ACK drains it: now the modify goes through.
  inject(ack(kSqPsn, 1));
  poll(5 * kUs);
  ASSERT_EQ(cq_poll().size(), 1u);
  EXPECT_EQ(sq_draining(), 0);
  EXPECT_EQ(to_state(IBV_QPS_RTS), 0);
  EXPECT_EQ(qp_->state(), IBV_QPS_RTS);
}

// A WR sent in part (TX full after its first packet) is draining too:
// query_qp once said it was not (it looked only at whole WRs).
TEST_F(TransportTrace, SqdWithAHalfSentWrIsDraining) {
  ASSERT_TRUE(up());
  io_.room = 1;
  ASSERT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 2500)})), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 1u);
  ASSERT_EQ(to_state(IBV_QPS_SQD), 0);
  EXPECT_EQ(sq_draining(), 1);
  EXPECT_EQ(to_state(IBV_QPS_RTS), EINVAL);
}

// To ERR while draining is allowed: the outstanding WR is flushed.
TEST_F(TransportTrace, SqdToErrWhileDrainingFlushes) {
  ASSERT_TRUE(up());
  ASSERT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 8)})), 0);
  poll(0);
  ASSERT_EQ(to_state(IBV_QPS_SQD), 0);
  ASSERT_EQ(to_state(IBV_QPS_ERR), 0);
  poll(1 * kUs);
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 1u, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND);
}

TEST_F(TransportTrace, LocalProtectionErrorCompletesAfterEarlierWrs) {
  ASSERT_TRUE(up());
  // Post: good SEND wr 1, SEND wr 2 with a bad lkey, SEND wr 3.
  ASSERT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 8)})), 0);
  ASSERT_EQ(post(wr(2, IBV_WR_SEND, {Sge{addr(0), 8, mr_->lkey() ^ 0xff}})), 0);
  ASSERT_EQ(post(wr(3, IBV_WR_SEND, {sge(0, 8)})), 0);
  poll(0);
  // Expect: only wr 1 goes out; nothing completes before its ACK.
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.psn, kSqPsn);
  EXPECT_TRUE(cq_poll().empty());
  // Peer: ACK P. Expect: wr 1 SUCCESS, wr 2 LOC_PROT_ERR, wr 3 flushed.
  inject(ack(kSqPsn, 1));
  poll(5 * kUs);
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 3u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_SEND);
  EXPECT_WC(wc[1], 2u, IBV_WC_LOC_PROT_ERR, IBV_WC_SEND);
  EXPECT_WC(wc[2], 3u, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND);
  EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
  EXPECT_TRUE(sent().empty());
}

// ===========================================================================
// Completer: ACKs
// ===========================================================================

TEST_F(TransportTrace, AckCompletesCoveredWrsOnly) {
  ASSERT_TRUE(up());
  ASSERT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 100)})), 0);
  ASSERT_EQ(post(wr(2, IBV_WR_SEND, {sge(0, 100)})), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 2u);
  // Peer: ACK P. Expect: wr 1 only.
  inject(ack(kSqPsn, 1));
  poll(5 * kUs);
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_SEND);
  EXPECT_EQ(wc[0].byte_len, 100u);
  // Peer: ACK P+1. Expect: wr 2.
  inject(ack(kSqPsn + 1, 2));
  poll(6 * kUs);
  wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 2u, IBV_WC_SUCCESS, IBV_WC_SEND);
  EXPECT_EQ(ctr(ECtr::acks_rx), 2u);
}

TEST_F(TransportTrace, CoalescedAckCompletesSeveralWrsInOrder) {
  ASSERT_TRUE(up());
  // Post: SEND, SEND (2 packets), WRITE: PSNs P, P+1..P+2, P+3.
  ASSERT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 10)})), 0);
  ASSERT_EQ(post(wr(2, IBV_WR_SEND, {sge(0, 2000)})), 0);
  ASSERT_EQ(post(rdma(3, IBV_WR_RDMA_WRITE, {sge(0, 30)}, kPeerVa)), 0);
  poll(0);
  auto p = sent();
  ASSERT_EQ(p.size(), 4u) << dump(p);
  EXPECT_EQ(p[3].f.psn, kSqPsn + 3);
  // Peer: one ACK for P+3.
  inject(ack(kSqPsn + 3, 3));
  poll(5 * kUs);
  // Expect: three CQEs in SQ order.
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 3u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_SEND);
  EXPECT_EQ(wc[0].byte_len, 10u);
  EXPECT_WC(wc[1], 2u, IBV_WC_SUCCESS, IBV_WC_SEND);
  EXPECT_EQ(wc[1].byte_len, 2000u);
  EXPECT_WC(wc[2], 3u, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(wc[2].byte_len, 30u);
}

TEST_F(TransportTrace, DuplicateAckIsIgnoredAndCounted) {
  ASSERT_TRUE(up());
  ASSERT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 8)})), 0);
  ASSERT_EQ(post(wr(2, IBV_WR_SEND, {sge(0, 8)})), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 2u);
  inject(ack(kSqPsn, 1));
  poll(5 * kUs);
  ASSERT_EQ(cq_poll().size(), 1u);
  const uint64_t dup0 = ctr(ECtr::rx_dup);
  // Peer: the same ACK P again (older than the oldest unacked P+1).
  inject(ack(kSqPsn, 1));
  poll(6 * kUs);
  // Expect: ignored: no CQE, nothing sent, counted rx_dup.
  EXPECT_TRUE(cq_poll().empty());
  EXPECT_TRUE(sent().empty());
  EXPECT_EQ(ctr(ECtr::rx_dup), dup0 + 1);
  // Peer: ACK P+1. Expect: wr 2 completes.
  inject(ack(kSqPsn + 1, 2));
  poll(7 * kUs);
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 2u, IBV_WC_SUCCESS, IBV_WC_SEND);
}

TEST_F(TransportTrace, GhostAckBeyondSentIsIgnoredAndCounted) {
  ASSERT_TRUE(up());
  ASSERT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 8)})), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 1u);
  // Peer: ACK P+5, never sent.
  inject(ack(kSqPsn + 5, 1));
  poll(5 * kUs);
  // Expect: ignored, counted rx_ghost_ack; wr 1 still outstanding.
  EXPECT_TRUE(cq_poll().empty());
  EXPECT_EQ(ctr(ECtr::rx_ghost_ack), 1u);
  EXPECT_EQ(qp_->state(), IBV_QPS_RTS);
  // Peer: the real ACK P. Expect: wr 1 completes.
  inject(ack(kSqPsn, 1));
  poll(6 * kUs);
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_SEND);
}

// ===========================================================================
// Responder
// ===========================================================================

TEST_F(TransportTrace, InOrderSendFillsRecvAndIsAckedWithMsn) {
  ASSERT_TRUE(up());
  // Post: RECV 0x77 (100 + 4000 bytes), RECV 0x78 (same).
  ASSERT_EQ(post_recv(rwr(0x77, {sge(0x10000, 100), sge(0x20000, 4000)})), 0);
  ASSERT_EQ(post_recv(rwr(0x78, {sge(0x30000, 100), sge(0x40000, 4000)})), 0);
  // Peer: SEND_ONLY ePSN, AckReq, 64 bytes.
  const auto m1 = pattern(64, 0x40);
  inject(pkt(op::kRcSendOnly, kRqPsn, true), m1);
  poll(1 * kUs);
  auto p = sent();
  // Expect: ACK psn ePSN, syndrome 0x1f, MSN 1.
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcAck);
  EXPECT_EQ(p[0].f.psn, kRqPsn);
  EXPECT_EQ(p[0].f.dqpn, kPeerQpn);
  EXPECT_EQ(p[0].f.aeth_syndrome, kAck);
  EXPECT_EQ(p[0].f.aeth_msn, 1u);
  // Expect: IBV_WC_RECV wr 0x77, byte_len 64, data in the first SGE.
  auto wc = rcq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 0x77u, IBV_WC_SUCCESS, IBV_WC_RECV);
  EXPECT_EQ(wc[0].byte_len, 64u);
  EXPECT_EQ(wc[0].qp_num, qp_->qpn());
  EXPECT_EQ(wc[0].wc_flags & IBV_WC_WITH_IMM, 0u);
  EXPECT_EQ(bytes(0x10000, 64), m1);

  // Peer: SEND_FIRST/MIDDLE/LAST_WITH_IMM (1024+1024+300), AckReq on last.
  const auto m2 = pattern(2348, 0x50);
  inject(pkt(op::kRcSendFirst, kRqPsn + 1), slice(m2, 0, 1024));
  inject(pkt(op::kRcSendMiddle, kRqPsn + 2), slice(m2, 1024, 1024));
  auto last = pkt(op::kRcSendLastImm, kRqPsn + 3, true);
  last.imm = 0x01020304;
  inject(last, slice(m2, 2048, 300));
  poll(2 * kUs);
  p = sent();
  // Expect: one ACK psn ePSN+3, MSN 2.
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcAck);
  EXPECT_EQ(p[0].f.psn, kRqPsn + 3);
  EXPECT_EQ(p[0].f.aeth_msn, 2u);
  // Expect: RECV wr 0x78, byte_len 2348, WITH_IMM, scattered 100 + 2248.
  wc = rcq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 0x78u, IBV_WC_SUCCESS, IBV_WC_RECV);
  EXPECT_EQ(wc[0].byte_len, 2348u);
  EXPECT_TRUE(wc[0].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(wc[0].imm_data, htonl(0x01020304));
  EXPECT_EQ(bytes(0x30000, 100), slice(m2, 0, 100));
  EXPECT_EQ(bytes(0x40000, 2248), slice(m2, 100, 2248));
}

TEST_F(TransportTrace, WriteWithImmConsumesRecvAndCompletesRecvRdmaWithImm) {
  ASSERT_TRUE(up());
  std::memset(at(0x10000), 0xaa, 64);
  ASSERT_EQ(post_recv(rwr(5, {sge(0x10000, 64)})), 0);
  // Peer: WRITE_ONLY_WITH_IMM 200 bytes to 0x30000, imm 0xcafef00d.
  const auto data = pattern(200, 0x61);
  auto f = write_req(op::kRcWriteOnlyImm, kRqPsn, true, addr(0x30000), 200);
  f.imm = 0xcafef00d;
  inject(f, data);
  poll(1 * kUs);
  // Expect: data in memory, ACK ePSN MSN 1.
  EXPECT_EQ(bytes(0x30000, 200), data);
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.psn, kRqPsn);
  EXPECT_EQ(p[0].f.aeth_syndrome, kAck);
  EXPECT_EQ(p[0].f.aeth_msn, 1u);
  // Expect: RECV_RDMA_WITH_IMM wr 5, byte_len 200, imm; receive buffer not
  // written.
  auto wc = rcq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 5u, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(wc[0].byte_len, 200u);
  EXPECT_TRUE(wc[0].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(wc[0].imm_data, htonl(0xcafef00d));
  EXPECT_EQ(bytes(0x10000, 64), std::vector<uint8_t>(64, 0xaa));
}

// A receive buffer is checked where the message reaches it, as rxe checks
// where it copies: a WRITE with immediate reaches none, a 100-byte SEND only
// the first. A bad lkey beyond is never looked at; one the SEND reaches is
// a local protection error (remote operational NAK).
TEST_F(TransportTrace, ReceiveBuffersAreCheckedOnlyWhereTheMessageLands) {
  ASSERT_TRUE(up());
  Sge bad = sge(0x11000, 64);
  bad.lkey ^= 0x5a5a00;
  ASSERT_EQ(post_recv(rwr(1, {bad})), 0);
  ASSERT_EQ(post_recv(rwr(2, {sge(0x12000, 128), bad})), 0);
  ASSERT_EQ(post_recv(rwr(3, {sge(0x13000, 64), bad})), 0);
  // Peer: WRITE_ONLY_WITH_IMM 32 bytes (takes wr 1), SEND_ONLY 100 bytes
  // (wr 2: its first buffer holds it), SEND_ONLY 100 bytes (wr 3: needs the
  // bad second buffer).
  auto f = write_req(op::kRcWriteOnlyImm, kRqPsn, true, addr(0x30000), 32);
  f.imm = 7;
  inject(f, pattern(32, 1));
  inject(pkt(op::kRcSendOnly, kRqPsn + 1, true), pattern(100, 2));
  inject(pkt(op::kRcSendOnly, kRqPsn + 2, true), pattern(100, 3));
  poll(1 * kUs);
  auto wc = rcq_poll();
  ASSERT_EQ(wc.size(), 3u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_WC(wc[1], 2u, IBV_WC_SUCCESS, IBV_WC_RECV);
  EXPECT_EQ(bytes(0x12000, 100), pattern(100, 2));
  EXPECT_EQ(wc[2].wr_id, 3u);
  EXPECT_EQ(wc[2].status, IBV_WC_LOC_PROT_ERR);
  auto p = sent();
  ASSERT_FALSE(p.empty());
  EXPECT_EQ(p.back().f.aeth_syndrome, 0x63);  // remote operational error
  EXPECT_EQ(p.back().f.psn, kRqPsn + 2);
  EXPECT_EQ(ctr(ECtr::rx_recv_bad_lkey), 1u);
}

TEST_F(TransportTrace, MultiPacketWriteLandsInMemory) {
  ASSERT_TRUE(up());
  const auto data = pattern(2500, 0x71);
  // Peer: WRITE_FIRST (RETH 2500), WRITE_MIDDLE, WRITE_LAST (AckReq).
  inject(write_req(op::kRcWriteFirst, kRqPsn, false, addr(0x50000), 2500),
         slice(data, 0, 1024));
  inject(pkt(op::kRcWriteMiddle, kRqPsn + 1), slice(data, 1024, 1024));
  inject(pkt(op::kRcWriteLast, kRqPsn + 2, true), slice(data, 2048, 452));
  poll(1 * kUs);
  // Expect: all 2500 bytes written; one ACK ePSN+2 MSN 1; no receive CQE.
  EXPECT_EQ(bytes(0x50000, 2500), data);
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcAck);
  EXPECT_EQ(p[0].f.psn, kRqPsn + 2);
  EXPECT_EQ(p[0].f.aeth_msn, 1u);
  EXPECT_TRUE(rcq_poll().empty());
}

TEST_F(TransportTrace, DuplicateSendIsReAckedNotExecuted) {
  ASSERT_TRUE(up());
  for (uint64_t i = 0; i < 3; ++i)
    ASSERT_EQ(post_recv(rwr(i + 1, {sge(0x10000 + 0x1000 * i, 256)})), 0);
  // Peer: SEND_ONLY R and R+1, both acknowledged.
  inject(pkt(op::kRcSendOnly, kRqPsn, true), pattern(32, 1));
  inject(pkt(op::kRcSendOnly, kRqPsn + 1, true), pattern(32, 2));
  poll(1 * kUs);
  ASSERT_EQ(sent().size(), 1u);
  ASSERT_EQ(rcq_poll().size(), 2u);
  // Peer: SEND R again (it missed the ACK and went back).
  inject(pkt(op::kRcSendOnly, kRqPsn, true), pattern(32, 1));
  poll(2 * kUs);
  // Expect: re-ACK with PSN ePSN-1 = R+1, MSN 2; no receive consumed;
  // counted rx_dup.
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcAck);
  EXPECT_EQ(p[0].f.aeth_syndrome, kAck);
  EXPECT_EQ(p[0].f.psn, kRqPsn + 1);
  EXPECT_EQ(p[0].f.aeth_msn, 2u);
  EXPECT_TRUE(rcq_poll().empty());
  EXPECT_EQ(ctr(ECtr::rx_dup), 1u);
  // Peer: the next new SEND R+2 lands in RECV 3.
  inject(pkt(op::kRcSendOnly, kRqPsn + 2, true), pattern(32, 3));
  poll(3 * kUs);
  auto wc = rcq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 3u, IBV_WC_SUCCESS, IBV_WC_RECV);
}

// Only the peer an RC QP is connected to may speak to it (rxe check_addr):
// a packet from another address, or to an address that is not the QP's
// own, right QPN and PSN, is dropped and counted, and the peer's is taken.
TEST_F(TransportTrace, RcPacketFromAnotherAddressIsDropped) {
  ASSERT_TRUE(up());
  ASSERT_EQ(post_recv(rwr(1, {sge(0x10000, 256)})), 0);
  inject_from_ = kPeerIp + 7;
  inject(pkt(op::kRcSendOnly, kRqPsn, true), pattern(32, 1));
  inject_from_ = kPeerIp;
  inject_to_ = kOurIp + 7;
  inject(pkt(op::kRcSendOnly, kRqPsn, true), pattern(32, 1));
  inject_to_ = kOurIp;
  poll(1 * kUs);
  EXPECT_TRUE(sent().empty());
  EXPECT_TRUE(rcq_poll().empty());
  EXPECT_EQ(ctr(ECtr::rx_bad_addr), 2u);
  inject(pkt(op::kRcSendOnly, kRqPsn, true), pattern(32, 1));
  poll(2 * kUs);
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.aeth_syndrome, kAck);
  EXPECT_EQ(rcq_poll().size(), 1u);
}

// A duplicate WRITE is acknowledged up to the last SEND/WRITE executed,
// never with the PSN of a READ or ATOMIC executed after it: at an rxe
// requester a plain ACK at a pending READ's PSN completes that READ without
// its data (rxe_comp.c), and ours takes it as an implied NAK.
TEST_F(TransportTrace, DuplicateWriteIsNotAckedWithALaterReadsPsn) {
  ASSERT_TRUE(up());
  put(0x60000, pattern(64, 0x21));
  // Peer: WRITE_ONLY R (AckReq), READ R+1 (64 B), ATOMIC FETCH_ADD R+2.
  inject(write_req(op::kRcWriteOnly, kRqPsn, true, addr(0x10000), 16),
         pattern(16, 1));
  inject(write_req(op::kRcReadRequest, kRqPsn + 1, true, addr(0x60000), 64));
  auto a = pkt(op::kRcFetchAdd, kRqPsn + 2, true);
  a.atomic_va = addr(0x70000);
  a.atomic_rkey = mr_->rkey();
  a.atomic_swap_add = 1;
  inject(a);
  poll(1 * kUs);
  sent();
  // Peer: the READ response and the atomic ACK were lost; it goes back to
  // R and sends the WRITE again.
  inject(write_req(op::kRcWriteOnly, kRqPsn, true, addr(0x10000), 16),
         pattern(16, 1));
  poll(2 * kUs);
  // Expect: ACK with PSN R (the WRITE), not R+2 (ePSN - 1, the atomic).
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcAck);
  EXPECT_EQ(p[0].f.aeth_syndrome, kAck);
  EXPECT_EQ(p[0].f.psn, kRqPsn);
  EXPECT_EQ(ctr(ECtr::rx_dup), 1u);
  // The READ and the ATOMIC asked again are answered from their resources.
  inject(write_req(op::kRcReadRequest, kRqPsn + 1, true, addr(0x60000), 64));
  inject(a);
  poll(3 * kUs);
  p = sent();
  ASSERT_EQ(p.size(), 2u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcReadRespOnly);
  EXPECT_EQ(p[0].f.psn, kRqPsn + 1);
  EXPECT_EQ(p[1].f.opcode, op::kRcAtomicAck);
  EXPECT_EQ(p[1].f.psn, kRqPsn + 2);
  EXPECT_EQ(u64(0x70000), 1u);  // added once
}

TEST_F(TransportTrace, DuplicateReadIsReplayedIncludingSubRange) {
  ASSERT_TRUE(up());
  put(0x60000, pattern(2500, 0x11));
  // Peer: READ_REQUEST ePSN, RETH(0x60000, 2500).
  auto rd = write_req(op::kRcReadRequest, kRqPsn, true, addr(0x60000), 2500);
  inject(rd);
  poll(1 * kUs);
  auto p = without_acks(sent());
  // Expect: READ_RESPONSE FIRST R (1024), MIDDLE R+1 (1024), LAST R+2 (452),
  // AETH ACK on FIRST and LAST.
  ASSERT_EQ(p.size(), 3u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcReadRespFirst);
  EXPECT_EQ(p[1].f.opcode, op::kRcReadRespMiddle);
  EXPECT_EQ(p[2].f.opcode, op::kRcReadRespLast);
  EXPECT_EQ(p[0].f.aeth_syndrome, kAck);
  EXPECT_EQ(p[2].f.aeth_syndrome, kAck);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(p[i].f.psn, kRqPsn + i);
    EXPECT_EQ(p[i].payload,
              bytes(0x60000 + 1024 * i, std::min(1024u, 2500 - 1024 * i)));
  }

  // The memory changes; the peer repeats the whole request (responses lost).
  put(0x60000, pattern(2500, 0x22));
  inject(rd);
  poll(2 * kUs);
  p = without_acks(sent());
  // Expect: replayed at R, R+1, R+2 with the same lengths (current memory).
  ASSERT_EQ(p.size(), 3u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcReadRespFirst);
  EXPECT_EQ(p[2].f.opcode, op::kRcReadRespLast);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(p[i].f.psn, kRqPsn + i);
    EXPECT_EQ(p[i].payload,
              bytes(0x60000 + 1024 * i, std::min(1024u, 2500 - 1024 * i)));
  }
  EXPECT_GE(ctr(ECtr::read_replays), 1u);
  EXPECT_GE(ctr(ECtr::rx_dup), 1u);

  // Peer: sub-range re-request: PSN R+1, va + 1024, len 1476.
  auto sub = write_req(op::kRcReadRequest, kRqPsn + 1, true,
                       addr(0x60000 + 1024), 1476);
  inject(sub);
  poll(3 * kUs);
  p = without_acks(sent());
  // Expect: FIRST R+1 (1024 from va+1024), LAST R+2 (452 from va+2048).
  ASSERT_EQ(p.size(), 2u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcReadRespFirst);
  EXPECT_EQ(p[0].f.psn, kRqPsn + 1);
  EXPECT_EQ(p[0].payload, bytes(0x60000 + 1024, 1024));
  EXPECT_EQ(p[1].f.opcode, op::kRcReadRespLast);
  EXPECT_EQ(p[1].f.psn, kRqPsn + 2);
  EXPECT_EQ(p[1].payload, bytes(0x60000 + 2048, 452));

  // Peer: a new READ at R+3 (ePSN was not moved by the replays).
  inject(write_req(op::kRcReadRequest, kRqPsn + 3, true, addr(0x60000), 8));
  poll(4 * kUs);
  p = without_acks(sent());
  // Expect: READ_RESPONSE_ONLY R+3.
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcReadRespOnly);
  EXPECT_EQ(p[0].f.psn, kRqPsn + 3);
  EXPECT_EQ(p[0].payload, bytes(0x60000, 8));
  EXPECT_EQ(qp_->state(), IBV_QPS_RTS);
}

TEST_F(TransportTrace, DuplicateAtomicReturnsSavedValueWithoutReexecuting) {
  ASSERT_TRUE(up());
  set_u64(0x70000, 100);
  // Peer: FETCH_ADD +5 at ePSN.
  auto fa = pkt(op::kRcFetchAdd, kRqPsn, true);
  fa.atomic_va = addr(0x70000);
  fa.atomic_rkey = mr_->rkey();
  fa.atomic_swap_add = 5;
  inject(fa);
  poll(1 * kUs);
  auto p = sent();
  // Expect: ATOMIC_ACK R orig 100, MSN 1; memory 105.
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcAtomicAck);
  EXPECT_EQ(p[0].f.psn, kRqPsn);
  EXPECT_EQ(p[0].f.aeth_syndrome, kAck);
  EXPECT_EQ(p[0].f.aeth_msn, 1u);
  EXPECT_EQ(p[0].f.atomic_orig, 100u);
  EXPECT_EQ(u64(0x70000), 105u);

  // Peer: the same FETCH_ADD again (its ACK was lost).
  inject(fa);
  poll(2 * kUs);
  p = sent();
  // Expect: ATOMIC_ACK R with the saved original 100; memory still 105.
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcAtomicAck);
  EXPECT_EQ(p[0].f.psn, kRqPsn);
  EXPECT_EQ(p[0].f.atomic_orig, 100u);
  EXPECT_EQ(u64(0x70000), 105u);
  EXPECT_EQ(ctr(ECtr::atomic_replays), 1u);

  // Peer: a new CMP_SWAP(105 -> 7) at R+1. Expect: orig 105, memory 7.
  auto cs = pkt(op::kRcCmpSwap, kRqPsn + 1, true);
  cs.atomic_va = addr(0x70000);
  cs.atomic_rkey = mr_->rkey();
  cs.atomic_compare = 105;
  cs.atomic_swap_add = 7;
  inject(cs);
  poll(3 * kUs);
  p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.psn, kRqPsn + 1);
  EXPECT_EQ(p[0].f.atomic_orig, 105u);
  EXPECT_EQ(u64(0x70000), 7u);
}

TEST_F(TransportTrace, OutOfSequenceGetsOneNakPerGap) {
  ASSERT_TRUE(up());
  auto w = [&](uint32_t psn) {
    return write_req(op::kRcWriteOnly, psn, true,
                     addr(0x10000 + 64 * ((psn - kRqPsn) & 0xff)), 16);
  };
  // Peer: WRITE at ePSN+2 (ePSN and ePSN+1 lost).
  inject(w(kRqPsn + 2), pattern(16, 2));
  poll(1 * kUs);
  auto p = sent();
  // Expect: one NAK seq error with PSN ePSN; nothing written.
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcAck);
  EXPECT_EQ(p[0].f.aeth_syndrome, kNakSeq);
  EXPECT_EQ(p[0].f.psn, kRqPsn);
  EXPECT_EQ(bytes(0x10000 + 128, 16), std::vector<uint8_t>(16, 0));
  // Peer: ePSN+3, still out of sequence. Expect: dropped silently.
  inject(w(kRqPsn + 3), pattern(16, 3));
  poll(2 * kUs);
  EXPECT_TRUE(sent().empty());
  EXPECT_EQ(ctr(ECtr::naks_seq_tx), 1u);
  EXPECT_GE(ctr(ECtr::rx_out_of_seq), 1u);
  // Peer: go-back-N from ePSN: ePSN, ePSN+1.
  inject(w(kRqPsn), pattern(16, 0));
  inject(w(kRqPsn + 1), pattern(16, 1));
  poll(3 * kUs);
  p = sent();
  // Expect: accepted: one coalesced ACK ePSN+1 MSN 2; data written.
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.aeth_syndrome, kAck);
  EXPECT_EQ(p[0].f.psn, kRqPsn + 1);
  EXPECT_EQ(p[0].f.aeth_msn, 2u);
  EXPECT_EQ(bytes(0x10000, 16), pattern(16, 0));
  EXPECT_EQ(bytes(0x10000 + 64, 16), pattern(16, 1));
  // Peer: a new gap: ePSN+4 while ePSN+2 is expected.
  inject(w(kRqPsn + 4), pattern(16, 4));
  poll(4 * kUs);
  p = sent();
  // Expect: a new NAK seq error with PSN ePSN+2.
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.aeth_syndrome, kNakSeq);
  EXPECT_EQ(p[0].f.psn, kRqPsn + 2);
  EXPECT_EQ(ctr(ECtr::naks_seq_tx), 2u);
}

TEST_F(TransportTrace, SendWithoutRecvGetsRnrNakWithMinRnrTimer) {
  QpOpts o;
  o.min_rnr_timer = 14;
  ASSERT_TRUE(up(IBV_QPT_RC, o));
  // Peer: SEND_ONLY ePSN, no receive WR posted.
  inject(pkt(op::kRcSendOnly, kRqPsn, true), pattern(40, 1));
  poll(1 * kUs);
  auto p = sent();
  // Expect: RNR NAK 0x20|14 with this packet's PSN; no completion.
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcAck);
  EXPECT_EQ(p[0].f.aeth_syndrome, kRnrNak | 14);
  EXPECT_EQ(p[0].f.psn, kRqPsn);
  EXPECT_TRUE(rcq_poll().empty());
  EXPECT_EQ(ctr(ECtr::naks_rnr_tx), 1u);
  // Post a RECV; the peer retries the same PSN (ePSN was not advanced).
  ASSERT_EQ(post_recv(rwr(9, {sge(0x10000, 64)})), 0);
  inject(pkt(op::kRcSendOnly, kRqPsn, true), pattern(40, 1));
  poll(2 * kMs);
  p = sent();
  // Expect: ACK ePSN MSN 1; RECV completes with 40 bytes.
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.aeth_syndrome, kAck);
  EXPECT_EQ(p[0].f.psn, kRqPsn);
  EXPECT_EQ(p[0].f.aeth_msn, 1u);
  auto wc = rcq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 9u, IBV_WC_SUCCESS, IBV_WC_RECV);
  EXPECT_EQ(wc[0].byte_len, 40u);
}

TEST_F(TransportTrace, RecvTooSmallNaksInvalidRequestAndFailsRecv) {
  ASSERT_TRUE(up());
  ASSERT_EQ(post_recv(rwr(3, {sge(0x10000, 32)})), 0);
  // Peer: SEND_ONLY of 64 bytes into a 32-byte receive buffer.
  inject(pkt(op::kRcSendOnly, kRqPsn, true), pattern(64, 1));
  poll(1 * kUs);
  auto p = sent();
  // Expect: NAK invalid request; RECV wr 3 LOC_LEN_ERR; QP ERR.
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.aeth_syndrome, kNakInvReq);
  EXPECT_EQ(p[0].f.psn, kRqPsn);
  auto wc = rcq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 3u, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV);
  EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
  // The receive's completion reports it: no asynchronous error too.
  EXPECT_TRUE(qp_events().empty());
  EXPECT_EQ(ctr(ECtr::rx_recv_too_small), 1u);
  EXPECT_EQ(ctr(ECtr::rx_bad_length), 0u);
  EXPECT_EQ(qp_->counters().nak_cause.get(),
            static_cast<uint64_t>(RespResult::recv_too_small));
}

TEST_F(TransportTrace, MisalignedAtomicNaksInvalidRequest) {
  ASSERT_TRUE(up());
  set_u64(0x70000, 1);
  auto fa = pkt(op::kRcFetchAdd, kRqPsn, true);
  fa.atomic_va = addr(0x70004);  // not 8-byte aligned
  fa.atomic_rkey = mr_->rkey();
  fa.atomic_swap_add = 1;
  inject(fa);
  poll(1 * kUs);
  auto p = sent();
  // Expect: NAK invalid request, no ATOMIC_ACK, memory untouched.
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcAck);
  EXPECT_EQ(p[0].f.aeth_syndrome, kNakInvReq);
  EXPECT_EQ(p[0].f.psn, kRqPsn);
  EXPECT_EQ(u64(0x70000), 1u);
  EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
  EXPECT_EQ(qp_events(), std::vector<ibv_event_type>{IBV_EVENT_QP_REQ_ERR});
  EXPECT_EQ(ctr(ECtr::rx_atomic_misaligned), 1u);
  EXPECT_EQ(ctr(ECtr::rx_bad_length), 0u);
  EXPECT_EQ(qp_->counters().nak_cause.get(),
            static_cast<uint64_t>(RespResult::atomic_misaligned));
}

TEST_F(TransportTrace, AtomicWriteSendsRethAndEightBytesCompletesOnAck) {
  ASSERT_TRUE(up());
  // Post: ATOMIC_WRITE of 8 bytes (as they lie in memory) to kPeerVa, then
  // a SEND behind it.
  SendWr w = rdma(1, IBV_WR_ATOMIC_WRITE, {}, kPeerVa);
  const uint8_t value[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  std::memcpy(&w.compare_add, value, 8);
  ASSERT_EQ(post(w), 0);
  ASSERT_EQ(post(wr(2, IBV_WR_SEND, {sge(0, 16)})), 0);
  poll(0);
  auto p = sent();
  // Expect: RC_ATOMIC_WRITE P (RETH va, rkey, length 8; payload = the 8
  // bytes; AckReq), then the SEND at P+1.
  ASSERT_EQ(p.size(), 2u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcAtomicWrite);
  EXPECT_EQ(p[0].f.psn, kSqPsn);
  EXPECT_EQ(p[0].f.reth_va, kPeerVa);
  EXPECT_EQ(p[0].f.reth_rkey, kPeerRkey);
  EXPECT_EQ(p[0].f.reth_len, 8u);
  EXPECT_EQ(p[0].payload, std::vector<uint8_t>(value, value + 8));
  EXPECT_TRUE(p[0].f.ack_req);
  EXPECT_EQ(p[1].f.psn, kSqPsn + 1);
  // Peer: one ACK for both. Expect: ATOMIC_WRITE then SEND complete.
  inject(ack(kSqPsn + 1, 2));
  poll(1 * kUs);
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_ATOMIC_WRITE);
  EXPECT_WC(wc[1], 2u, IBV_WC_SUCCESS, IBV_WC_SEND);
}

TEST_F(TransportTrace, AtomicWriteHoldsAReadAtomicCredit) {
  QpOpts o;
  o.max_rd_atomic = 1;
  ASSERT_TRUE(up(IBV_QPT_RC, o));
  // Post: two ATOMIC_WRITEs; max_rd_atomic 1 (the responder keeps a
  // resource for each, as for READ and atomics).
  ASSERT_EQ(post(rdma(1, IBV_WR_ATOMIC_WRITE, {}, kPeerVa)), 0);
  ASSERT_EQ(post(rdma(2, IBV_WR_ATOMIC_WRITE, {}, kPeerVa + 8)), 0);
  poll(0);
  // Expect: only the first goes until it is acknowledged.
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  inject(ack(kSqPsn, 1));
  poll(1 * kUs);
  p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.psn, kSqPsn + 1);
  EXPECT_EQ(p[0].f.reth_va, kPeerVa + 8);
  // An ATOMIC_WRITE carries no SGE: one with data is refused at post.
  EXPECT_EQ(post(rdma(3, IBV_WR_ATOMIC_WRITE, {sge(0, 8)}, kPeerVa)), EINVAL);
}

TEST_F(TransportTrace, AtomicWriteExecutesOnceAndIsAnsweredAsARead) {
  ASSERT_TRUE(up());
  set_u64(0x70000, 1);
  const uint64_t v = 0x1122334455667788;
  std::vector<uint8_t> bytes8(8);
  std::memcpy(bytes8.data(), &v, 8);
  // Peer: ATOMIC_WRITE of v at ePSN with AckReq.
  auto aw = write_req(op::kRcAtomicWrite, kRqPsn, true, addr(0x70000), 8);
  inject(aw, bytes8);
  poll(1 * kUs);
  auto p = sent();
  // Expect: the word is v, and the answer is an RDMA READ RESPONSE ONLY R
  // without data, AETH ACK, MSN 1 (IBTA 1.5 A19.4; rxe's
  // send_read_response_ack, which rxe's completer waits for).
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcReadRespOnly);
  EXPECT_EQ(p[0].f.aeth_syndrome, kAck);
  EXPECT_EQ(p[0].f.psn, kRqPsn);
  EXPECT_EQ(p[0].f.aeth_msn, 1u);
  EXPECT_TRUE(p[0].payload.empty());
  EXPECT_EQ(u64(0x70000), v);
  EXPECT_EQ(ctr(ECtr::atomic_writes), 1u);
  // The application changes the word; the same ATOMIC_WRITE comes again
  // (its response was lost). Expect: the response again, from the
  // responder resource, the word not written again.
  set_u64(0x70000, 42);
  inject(aw, bytes8);
  poll(2 * kUs);
  p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcReadRespOnly);
  EXPECT_EQ(p[0].f.psn, kRqPsn);
  EXPECT_TRUE(p[0].payload.empty());
  EXPECT_EQ(u64(0x70000), 42u);
  EXPECT_EQ(ctr(ECtr::atomic_writes), 1u);
  // Without a responder resource (max_dest_rd_atomic 0) it is an invalid
  // request, not executed (rxe's check_resource counts it as a READ).
  QpOpts o;
  o.max_dest_rd_atomic = 0;
  ASSERT_TRUE(up(IBV_QPT_RC, o));
  inject(aw, bytes8);
  poll(3 * kUs);
  p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.aeth_syndrome, kNakInvReq);
  EXPECT_EQ(u64(0x70000), 42u);
}

// rxe answers an ATOMIC_WRITE with a READ RESPONSE ONLY without data:
// that completes it (an ACK does too: AtomicWriteSendsRethAndEight...).
TEST_F(TransportTrace, AtomicWriteCompletesOnAnEmptyReadResponse) {
  ASSERT_TRUE(up());
  ASSERT_EQ(post(rdma(1, IBV_WR_ATOMIC_WRITE, {}, kPeerVa)), 0);
  ASSERT_EQ(post(wr(2, IBV_WR_SEND, {sge(0, 16)})), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 2u);
  auto rsp = pkt(op::kRcReadRespOnly, kSqPsn, false);
  rsp.aeth_syndrome = kAck;
  inject(rsp);
  poll(1 * kUs);
  // Expect: the ATOMIC_WRITE completes, nothing is resent; the SEND waits
  // for its ACK.
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_ATOMIC_WRITE);
  EXPECT_TRUE(sent().empty());
  EXPECT_EQ(ctr(ECtr::rx_out_of_seq), 0u);
  inject(ack(kSqPsn + 1, 2));
  poll(2 * kUs);
  wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 2u, IBV_WC_SUCCESS, IBV_WC_SEND);
}

TEST_F(TransportTrace, AtomicWriteRefusals) {
  // Misaligned: NAK invalid request, memory untouched.
  ASSERT_TRUE(up());
  set_u64(0x70000, 1);
  inject(write_req(op::kRcAtomicWrite, kRqPsn, true, addr(0x70004), 8),
         std::vector<uint8_t>(8, 0xee));
  poll(1 * kUs);
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.aeth_syndrome, kNakInvReq);
  EXPECT_EQ(u64(0x70000), 1u);
  EXPECT_EQ(ctr(ECtr::rx_atomic_misaligned), 1u);

  // A QP without remote write: NAK remote access (C9-88), counted.
  QpOpts o;
  o.access = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  ASSERT_TRUE(up(IBV_QPT_RC, o));
  inject(write_req(op::kRcAtomicWrite, kRqPsn, true, addr(0x70000), 8),
         std::vector<uint8_t>(8, 0xee));
  poll(2 * kUs);
  p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.aeth_syndrome, kNakRemAccess);
  EXPECT_EQ(u64(0x70000), 1u);
  EXPECT_EQ(ctr(ECtr::rx_qp_access), 1u);

  // A payload that is not 8 bytes: NAK invalid request.
  ASSERT_TRUE(up());
  inject(write_req(op::kRcAtomicWrite, kRqPsn, true, addr(0x70000), 8),
         std::vector<uint8_t>(4, 0xee));
  poll(3 * kUs);
  p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.aeth_syndrome, kNakInvReq);
  EXPECT_EQ(u64(0x70000), 1u);
}

TEST_F(TransportTrace, MrInUseWhileAPostedWriteStillPointsIntoIt) {
  ASSERT_TRUE(up());
  EXPECT_FALSE(engine_->mr_in_use(*mr_));
  // Post: a WRITE from the MR; once sent its buffers are resolved to host
  // pointers, which a retransmission reads again.
  ASSERT_EQ(post(rdma(1, IBV_WR_RDMA_WRITE, {sge(0, 64)}, kPeerVa)), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 1u);
  // Expect: the MR may not be unmapped until the WRITE is acknowledged.
  EXPECT_TRUE(engine_->mr_in_use(*mr_));
  inject(ack(kSqPsn, 1));
  poll(1 * kUs);
  ASSERT_EQ(cq_poll().size(), 1u);
  EXPECT_FALSE(engine_->mr_in_use(*mr_));
  // A WRITE into it in progress (FIRST of two) holds it too.
  inject(write_req(op::kRcWriteFirst, kRqPsn, false, addr(0x1000), 2048),
         std::vector<uint8_t>(1024, 7));
  poll(2 * kUs);
  EXPECT_TRUE(engine_->mr_in_use(*mr_));
}

TEST_F(TransportTrace, MrInUseWhileReadResponsesAreStillToSend) {
  ASSERT_TRUE(up());
  // The peer READs 8 KiB: until the 8 responses are out they read the MR.
  inject(write_req(op::kRcReadRequest, kRqPsn, true, addr(0x60000), 8192));
  EXPECT_TRUE(engine_->mr_in_use(*mr_));
  poll(1 * kUs);
  EXPECT_EQ(without_acks(sent()).size(), 8u);
  EXPECT_FALSE(engine_->mr_in_use(*mr_));
  // A duplicate of the READ (its responses lost) reads it again.
  inject(write_req(op::kRcReadRequest, kRqPsn, true, addr(0x60000), 8192));
  EXPECT_TRUE(engine_->mr_in_use(*mr_));
  poll(2 * kUs);
  EXPECT_FALSE(engine_->mr_in_use(*mr_));
}

TEST_F(TransportTrace, ZeroLengthWriteDoesNotCheckRkey) {
  ASSERT_TRUE(up());
  // Peer: WRITE_ONLY length 0 with a bogus rkey and va.
  inject(write_req(op::kRcWriteOnly, kRqPsn, true, 0x1234, 0, 0xbadbad));
  poll(1 * kUs);
  auto p = sent();
  // Expect: plain ACK, QP stays RTS.
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.aeth_syndrome, kAck);
  EXPECT_EQ(p[0].f.psn, kRqPsn);
  EXPECT_EQ(qp_->state(), IBV_QPS_RTS);
}

TEST_F(TransportTrace, PacketsForQpNotReadyOrUnknownAreDropped) {
  QpOpts o;
  o.until = IBV_QPS_INIT;
  ASSERT_TRUE(up(IBV_QPT_RC, o));
  ASSERT_EQ(post_recv(rwr(1, {sge(0x10000, 64)})), 0);
  // Peer: SEND to a QP in INIT. Expect: dropped, rx_bad_state, no reply.
  inject(pkt(op::kRcSendOnly, kRqPsn, true), pattern(8, 1));
  poll(1 * kUs);
  EXPECT_TRUE(sent().empty());
  EXPECT_TRUE(rcq_poll().empty());
  EXPECT_EQ(ctr(ECtr::rx_bad_state), 1u);
  // Peer: SEND to a QPN that does not exist. Expect: rx_no_qp.
  auto f = pkt(op::kRcSendOnly, kRqPsn, true);
  f.dqpn = 0xfffff0;
  inject(f, pattern(8, 1));
  poll(2 * kUs);
  EXPECT_TRUE(sent().empty());
  EXPECT_EQ(ctr(ECtr::rx_no_qp), 1u);
}

TEST_F(TransportTrace, CoalescedAckCarriesEpsnMinusOne) {
  ASSERT_TRUE(up());
  // Peer: WRITE_ONLY R with AckReq, WRITE_ONLY R+1 without; then poll.
  inject(write_req(op::kRcWriteOnly, kRqPsn, true, addr(0x30000), 16),
         pattern(16, 1));
  inject(write_req(op::kRcWriteOnly, kRqPsn + 1, false, addr(0x30100), 16),
         pattern(16, 2));
  poll(1 * kUs);
  auto p = sent();
  // Expect: one ACK, PSN = ePSN-1 = R+1, MSN 2 (BEHAVIOUR.md: coalesced).
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcAck);
  EXPECT_EQ(p[0].f.aeth_syndrome, kAck);
  EXPECT_EQ(p[0].f.psn, kRqPsn + 1);
  EXPECT_EQ(p[0].f.aeth_msn, 2u);
}

TEST_F(TransportTrace, AckIsNotSentAheadOfEarlierReadResponses) {
  ASSERT_TRUE(up());
  put(0x60000, pattern(2000, 3));
  // Peer: READ R (2000 bytes: R, R+1), WRITE_ONLY R+2 with AckReq.
  inject(write_req(op::kRcReadRequest, kRqPsn, true, addr(0x60000), 2000));
  inject(write_req(op::kRcWriteOnly, kRqPsn + 2, true, addr(0x30000), 16),
         pattern(16, 1));
  poll(1 * kUs);
  auto p = sent();
  // Expect: READ_RESPONSE_FIRST R, READ_RESPONSE_LAST R+1, then ACK R+2.
  ASSERT_EQ(p.size(), 3u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcReadRespFirst);
  EXPECT_EQ(p[0].f.psn, kRqPsn);
  EXPECT_EQ(p[1].f.opcode, op::kRcReadRespLast);
  EXPECT_EQ(p[1].f.psn, kRqPsn + 1);
  EXPECT_EQ(p[1].payload, bytes(0x60000 + 1024, 976));
  EXPECT_EQ(p[2].f.opcode, op::kRcAck);
  EXPECT_EQ(p[2].f.psn, kRqPsn + 2);
  EXPECT_EQ(p[2].f.aeth_msn, 2u);
}

TEST_F(TransportTrace, MoreReadsThanMaxDestRdAtomicNakInvalidRequest) {
  QpOpts o;
  o.max_dest_rd_atomic = 1;
  ASSERT_TRUE(up(IBV_QPT_RC, o));
  // Peer: READ R and READ R+1 back to back (the requester ignores our
  // limit of one outstanding READ/ATOMIC).
  inject(write_req(op::kRcReadRequest, kRqPsn, true, addr(0x60000), 8));
  inject(write_req(op::kRcReadRequest, kRqPsn + 1, true, addr(0x60000), 8));
  poll(1 * kUs);
  auto p = sent();
  // Expect: the first is answered, the second gets NAK invalid request.
  ASSERT_EQ(p.size(), 2u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcReadRespOnly);
  EXPECT_EQ(p[0].f.psn, kRqPsn);
  EXPECT_EQ(p[1].f.opcode, op::kRcAck);
  EXPECT_EQ(p[1].f.aeth_syndrome, kNakInvReq);
  EXPECT_EQ(p[1].f.psn, kRqPsn + 1);
  EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
  EXPECT_EQ(ctr(ECtr::rx_rd_atomic_over), 1u);
  EXPECT_EQ(ctr(ECtr::rx_bad_length), 0u);
  EXPECT_EQ(qp_->counters().nak_cause.get(),
            static_cast<uint64_t>(RespResult::rd_atomic_over));
}

// max_dest_rd_atomic 0 grants no responder resource: a READ or an ATOMIC
// is an invalid request (rxe's check_resource), not served from a floor.
TEST_F(TransportTrace, NoResponderResourcesNakRead) {
  QpOpts o;
  o.max_dest_rd_atomic = 0;
  ASSERT_TRUE(up(IBV_QPT_RC, o));
  inject(write_req(op::kRcReadRequest, kRqPsn, true, addr(0x60000), 8));
  poll(1 * kUs);
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcAck);
  EXPECT_EQ(p[0].f.aeth_syndrome, kNakInvReq);
  EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
  EXPECT_EQ(qp_->counters().nak_cause.get(),
            static_cast<uint64_t>(RespResult::rd_atomic_over));
}

TEST_F(TransportTrace, NoResponderResourcesNakAtomic) {
  QpOpts o;
  o.max_dest_rd_atomic = 0;
  ASSERT_TRUE(up(IBV_QPT_RC, o));
  set_u64(0x60000, 5);
  auto fa = pkt(op::kRcFetchAdd, kRqPsn, true);
  fa.atomic_va = addr(0x60000);
  fa.atomic_rkey = mr_->rkey();
  fa.atomic_swap_add = 1;
  inject(fa);
  poll(1 * kUs);
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcAck);
  EXPECT_EQ(p[0].f.aeth_syndrome, kNakInvReq);
  EXPECT_EQ(u64(0x60000), 5u);  // not executed
  EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
}

TEST_F(TransportTrace, SolicitedOnlyNotifyWakesOnSolicitedCompletion) {
  ASSERT_TRUE(up());
  ASSERT_EQ(post_recv(rwr(1, {sge(0x10000, 64)})), 0);
  ASSERT_EQ(post_recv(rwr(2, {sge(0x10100, 64)})), 0);
  rcq_->req_notify(true);
  // Peer: SEND_ONLY without SE. Expect: a completion, no event.
  inject(pkt(op::kRcSendOnly, kRqPsn, true), pattern(8, 1));
  poll(1 * kUs);
  EXPECT_EQ(rcq_poll().size(), 1u);
  EXPECT_EQ(rcq_->events(), 0u);
  // Peer: SEND_ONLY with SE. Expect: a completion and one event.
  auto f = pkt(op::kRcSendOnly, kRqPsn + 1, true);
  f.se = true;
  inject(f, pattern(8, 2));
  poll(2 * kUs);
  EXPECT_EQ(rcq_poll().size(), 1u);
  EXPECT_EQ(rcq_->events(), 1u);
}

TEST_F(TransportTrace, SrqFeedsReceivesAndKeepsItsWrsOnQpError) {
  Srq* srq = nullptr;
  ASSERT_EQ(dev_->create_srq(pd_, 8, 4, &srq), 0);
  QpOpts o;
  o.srq = srq;
  ASSERT_TRUE(up(IBV_QPT_RC, o));
  for (uint64_t i = 0; i < 3; ++i)
    ASSERT_EQ(srq->post(rwr(i + 1, {sge(0x10000 + 0x1000 * i, 256)})), 0);
  ibv_srq_attr sa{};
  sa.srq_limit = 2;
  ASSERT_EQ(dev_->modify_srq(srq, sa, IBV_SRQ_LIMIT), 0);
  EXPECT_EQ(post_recv(rwr(9, {sge(0x10000, 8)})), EINVAL);  // RQ is the SRQ
  // Peer: two SENDs. Expect: SRQ WRs 1 and 2 in order; the limit event
  // when fewer than 2 remain.
  inject(pkt(op::kRcSendOnly, kRqPsn, true), pattern(32, 1));
  inject(pkt(op::kRcSendOnly, kRqPsn + 1, true), pattern(48, 2));
  poll(1 * kUs);
  auto wc = rcq_poll();
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_RECV);
  EXPECT_EQ(wc[0].byte_len, 32u);
  EXPECT_WC(wc[1], 2u, IBV_WC_SUCCESS, IBV_WC_RECV);
  EXPECT_EQ(bytes(0x11000, 48), pattern(48, 2));
  EXPECT_EQ(srq->size(), 1u);
  bool limit_event = false;
  for (AsyncEvent ev; dev_->next_event(&ev);)
    limit_event |= ev.type == IBV_EVENT_SRQ_LIMIT_REACHED && ev.srq == srq;
  EXPECT_TRUE(limit_event);
  // QP -> ERR. Expect: no receive flushed; the SRQ keeps its WR.
  ASSERT_EQ(to_error(qp_), 0);
  poll(2 * kUs);
  EXPECT_TRUE(rcq_poll().empty());
  EXPECT_EQ(srq->size(), 1u);
}

TEST_F(TransportTrace, RestOfRnrNakedMessageIsDroppedSilently) {
  ASSERT_TRUE(up());
  const auto m = pattern(2148, 0x44);
  auto send3 = [&] {
    inject(pkt(op::kRcSendFirst, kRqPsn), slice(m, 0, 1024));
    inject(pkt(op::kRcSendMiddle, kRqPsn + 1), slice(m, 1024, 1024));
    inject(pkt(op::kRcSendLast, kRqPsn + 2, true), slice(m, 2048, 100));
  };
  // Peer: a 3-packet SEND, no receive WR posted.
  send3();
  poll(1 * kUs);
  auto p = sent();
  // Expect: one RNR NAK at R; MIDDLE/LAST dropped without a sequence NAK.
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.aeth_syndrome & 0xe0, kRnrNak);
  EXPECT_EQ(p[0].f.psn, kRqPsn);
  EXPECT_EQ(ctr(ECtr::naks_seq_tx), 0u);
  // A RECV is posted; the peer retries the whole message.
  ASSERT_EQ(post_recv(rwr(4, {sge(0x10000, 4096)})), 0);
  send3();
  poll(1 * kMs);
  p = sent();
  // Expect: ACK R+2 MSN 1 and the receive completion.
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.aeth_syndrome, kAck);
  EXPECT_EQ(p[0].f.psn, kRqPsn + 2);
  EXPECT_EQ(p[0].f.aeth_msn, 1u);
  auto wc = rcq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 4u, IBV_WC_SUCCESS, IBV_WC_RECV);
  EXPECT_EQ(wc[0].byte_len, 2148u);
  EXPECT_EQ(bytes(0x10000, 2148), m);
}

// ===========================================================================
// Requester: RNR
// ===========================================================================

TEST_F(TransportTrace, RnrNakWaitsTable45TimeThenRetransmits) {
  ASSERT_TRUE(up());
  const auto data = pattern(300, 0x21);
  put(0, data);
  ASSERT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 300)})), 0);
  poll(0);
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  // Peer at t=100us: RNR NAK P, timer code 14 (1.28 ms).
  const uint64_t t_nak = 100 * kUs;
  now_ = t_nak;
  inject(nak(kSqPsn, kRnrNak | 14));
  poll(t_nak);
  // Expect: nothing until 1.28 ms after the NAK.
  EXPECT_TRUE(sent().empty());
  poll(t_nak + rnr_wait_ns(14) - 1);
  p = sent();
  EXPECT_TRUE(p.empty()) << dump(p);
  // Expect: then the same SEND_ONLY P is retransmitted.
  poll(t_nak + rnr_wait_ns(14) + kSlack);
  p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcSendOnly);
  EXPECT_EQ(p[0].f.psn, kSqPsn);
  EXPECT_EQ(p[0].payload, data);
  EXPECT_TRUE(cq_poll().empty());
  EXPECT_EQ(ctr(ECtr::naks_rnr_rx), 1u);
  EXPECT_EQ(ctr(ECtr::rnr_waits), 1u);
  // Peer: ACK P. Expect: success.
  inject(ack(kSqPsn, 1));
  poll();
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_SEND);
}

TEST_F(TransportTrace, RnrRetryExhaustedCompletesRnrRetryExcErr) {
  QpOpts o;
  o.rnr_retry = 2;
  ASSERT_TRUE(up(IBV_QPT_RC, o));
  ASSERT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 8)})), 0);
  ASSERT_EQ(post(wr(2, IBV_WR_SEND, {sge(0, 8)}, 0)), 0);  // unsignaled
  poll(0);
  ASSERT_EQ(sent().size(), 2u);
  uint64_t t = 0;
  // Two RNR NAKs (code 1: 10 us): each is followed by a resend from P.
  for (int i = 0; i < 2; ++i) {
    t += 20 * kUs;
    now_ = t;
    inject(nak(kSqPsn, kRnrNak | 1));
    t += rnr_wait_ns(1) + kSlack;
    poll(t);
    auto p = sent();
    ASSERT_GE(p.size(), 1u) << "retry " << i;
    EXPECT_EQ(p[0].f.psn, kSqPsn);
    EXPECT_EQ(p[0].f.opcode, op::kRcSendOnly);
  }
  // Third RNR NAK: retries exhausted.
  t += 20 * kUs;
  now_ = t;
  inject(nak(kSqPsn, kRnrNak | 1));
  poll(t + rnr_wait_ns(1) + kSlack);
  // Expect: no resend; wr 1 RNR_RETRY_EXC_ERR, wr 2 flushed; QP ERR.
  auto p = sent();
  EXPECT_TRUE(p.empty()) << dump(p);
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_WC(wc[0], 1u, IBV_WC_RNR_RETRY_EXC_ERR, IBV_WC_SEND);
  EXPECT_WC(wc[1], 2u, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND);
  EXPECT_EQ(wc[0].qp_num, qp_->qpn());
  EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
}

TEST_F(TransportTrace, RnrRetry7IsInfinite) {
  QpOpts o;
  o.rnr_retry = 7;
  ASSERT_TRUE(up(IBV_QPT_RC, o));
  ASSERT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 8)})), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 1u);
  uint64_t t = 0;
  // 20 RNR NAKs, each followed by a resend of P.
  for (int i = 0; i < 20; ++i) {
    t += 20 * kUs;
    now_ = t;
    inject(nak(kSqPsn, kRnrNak | 1));
    t += rnr_wait_ns(1) + kSlack;
    poll(t);
    auto p = sent();
    ASSERT_EQ(p.size(), 1u) << "rnr " << i << " " << dump(p);
    EXPECT_EQ(p[0].f.psn, kSqPsn);
  }
  EXPECT_TRUE(cq_poll().empty());
  // Peer: ACK. Expect: success.
  inject(ack(kSqPsn, 1));
  poll();
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_SEND);
  EXPECT_EQ(ctr(ECtr::rnr_waits), 20u);
}

TEST_F(TransportTrace, RnrNakImpliesAckAndCode0Waits655Ms) {
  ASSERT_TRUE(up());  // retransmit timeout 67 ms: must not fire meanwhile
  ASSERT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 8)})), 0);
  ASSERT_EQ(post(wr(2, IBV_WR_SEND, {sge(0, 8)})), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 2u);
  // Peer at 10 us: RNR NAK at P+1, timer code 0 (655.36 ms).
  now_ = 10 * kUs;
  inject(nak(kSqPsn + 1, kRnrNak | 0));
  poll(10 * kUs);
  // Expect: wr 1 (P) completes: implied ACK.
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_SEND);
  // Expect: nothing until 655.36 ms after the NAK, then P+1 again.
  poll(10 * kUs + 100 * kMs);
  poll(10 * kUs + rnr_wait_ns(0) - 1);
  auto p = sent();
  EXPECT_TRUE(p.empty()) << dump(p);
  poll(10 * kUs + rnr_wait_ns(0) + kSlack);
  p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.psn, kSqPsn + 1);
  EXPECT_EQ(p[0].f.opcode, op::kRcSendOnly);
}

TEST_F(TransportTrace, RnrRetryZeroFailsOnFirstRnrNak) {
  QpOpts o;
  o.rnr_retry = 0;
  ASSERT_TRUE(up(IBV_QPT_RC, o));
  ASSERT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 8)})), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 1u);
  inject(nak(kSqPsn, kRnrNak | 1));
  poll(1 * kMs);
  // Expect: no retry at all; RNR_RETRY_EXC_ERR.
  auto p = sent();
  EXPECT_TRUE(p.empty()) << dump(p);
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 1u, IBV_WC_RNR_RETRY_EXC_ERR, IBV_WC_SEND);
  EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
}

// ===========================================================================
// Requester: retransmit timer, go-back-N
// ===========================================================================

TEST_F(TransportTrace, RetransmitTimerResendsSamePacketAfterTimeout) {
  QpOpts o;
  o.timeout = 10;  // 4.194304 ms
  ASSERT_TRUE(up(IBV_QPT_RC, o));
  const uint64_t T = ack_timeout_ns(10);
  const auto data = pattern(100, 0x31);
  put(0, data);
  ASSERT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 100)})), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 1u);
  // Expect: nothing before 4.096 us * 2^10.
  poll(T - 1);
  auto p = sent();
  EXPECT_TRUE(p.empty()) << dump(p);
  // Expect: after it, the same SEND_ONLY P with the same bytes.
  poll(T + kSlack);
  p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcSendOnly);
  EXPECT_EQ(p[0].f.psn, kSqPsn);
  EXPECT_TRUE(p[0].f.ack_req);
  EXPECT_EQ(p[0].payload, data);
  EXPECT_EQ(ctr(ECtr::timeouts), 1u);
  EXPECT_GE(ctr(ECtr::retransmits), 1u);
  inject(ack(kSqPsn, 1));
  poll();
  EXPECT_EQ(cq_poll().size(), 1u);
}

// The Local ACK Timeout stands still while the lcore is off the CPU
// (Engine::lcore_paused): the ACK may have been waiting in its ring, and a
// stopped service timed out what had arrived (perf/README.md, "the
// lcore's own pauses"). Late, never early.
TEST_F(TransportTrace, LocalAckTimeoutStandsStillWhileTheLcoreIsPaused) {
  QpOpts o;
  o.timeout = 10;  // 4.194304 ms
  ASSERT_TRUE(up(IBV_QPT_RC, o));
  const uint64_t T = ack_timeout_ns(10);
  ASSERT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 100)})), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 1u);
  // Off the CPU from 1 ms to 4 ms.
  poll(kMs);
  engine_->lcore_paused(4 * kMs, 3 * kMs);
  poll(T + kSlack);
  auto p = sent();
  EXPECT_TRUE(p.empty()) << dump(p);
  EXPECT_EQ(ctr(ECtr::timeouts), 0u);
  poll(T + 3 * kMs - kUs);
  EXPECT_TRUE(sent().empty());
  poll(T + 3 * kMs + kSlack);
  p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.psn, kSqPsn);
  EXPECT_EQ(ctr(ECtr::timeouts), 1u);
  // A timer armed after the pause runs on its own time: the resend's
  // timeout, T after it.
  const uint64_t resent = T + 3 * kMs + kSlack;
  poll(resent + T - kUs);
  EXPECT_TRUE(sent().empty());
  poll(resent + T + kSlack);
  EXPECT_EQ(sent().size(), 1u);
  EXPECT_EQ(ctr(ECtr::timeouts), 2u);
  inject(ack(kSqPsn, 1));
  poll();
  EXPECT_EQ(cq_poll().size(), 1u);
}

// Tail-loss probe: with nothing acknowledged for tail_probe_ns (no RTT
// sample yet), the last packet goes again with AckReq; the ACK it draws
// completes everything. No timeout, no retry spent.
TEST_F(TransportTrace, TailProbeResendsTheLastPacketAndItsAckCompletes) {
  use_engine(with_probe());
  ASSERT_TRUE(up());
  measured_rtt(kUs);
  ASSERT_NO_FATAL_FAILURE(send_burst(4));
  poll(199 * kUs);
  EXPECT_TRUE(sent().empty());
  poll(201 * kUs);
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.psn, kSqPsn + 3);
  EXPECT_TRUE(p[0].f.ack_req);
  EXPECT_EQ(ctr(ECtr::tail_probes), 1u);
  EXPECT_EQ(ctr(ECtr::timeouts), 0u);
  // Peer: it had all four; only its ACK was lost. The duplicate draws a
  // new one.
  inject(ack(kSqPsn + 3, 4));
  poll(202 * kUs);
  EXPECT_EQ(cq_poll().size(), 4u);
  poll(10'000 * kUs);
  EXPECT_TRUE(sent().empty()) << "nothing outstanding: no more probes";
}

// The responder's one NAK was lost: it had P, missed P+1 and drops what
// follows, the two probes of P+3 too. The third probe sends P+1 alone; its
// ACK is progress, and the next probe of the last packet draws the NAK
// for P+2, from which the requester goes back N.
TEST_F(TransportTrace, TailProbeRecoversFromALostNak) {
  use_engine(with_probe());
  ASSERT_TRUE(up());
  measured_rtt(kUs);
  ASSERT_NO_FATAL_FAILURE(send_burst(4));
  inject(ack(kSqPsn, 1));
  poll(10 * kUs);
  EXPECT_EQ(cq_poll().size(), 1u);
  poll(211 * kUs);  // from the ACK: 200 us
  ASSERT_EQ(sent().size(), 1u);
  poll(612 * kUs);
  ASSERT_EQ(sent().size(), 1u);
  poll(1413 * kUs);
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.psn, kSqPsn + 1);
  EXPECT_TRUE(p[0].f.ack_req);
  inject(ack(kSqPsn + 1, 2));
  poll(1420 * kUs);
  EXPECT_EQ(cq_poll().size(), 1u);
  EXPECT_TRUE(sent().empty()) << "nothing new to send: P+2, P+3 are out";
  poll(1621 * kUs);  // 200 us after the progress
  p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.psn, kSqPsn + 3);
  inject(nak(kSqPsn + 2, kNakSeq));
  poll(1622 * kUs);
  p = sent();
  ASSERT_EQ(p.size(), 2u) << dump(p);
  EXPECT_EQ(p[0].f.psn, kSqPsn + 2);
  EXPECT_EQ(p[1].f.psn, kSqPsn + 3);
  inject(ack(kSqPsn + 3, 4));
  poll(1630 * kUs);
  EXPECT_EQ(cq_poll().size(), 2u);
  EXPECT_EQ(ctr(ECtr::timeouts), 0u);
  EXPECT_EQ(ctr(ECtr::tail_probes), 4u);
}

// Before its first round-trip sample a QP does not probe (RFC 8985 7.2
// would wait 1 s; the Local ACK Timeout is that here): 256 QPs started
// together on af_packet probed while their first ACKs were still queued at
// the peer, and resent their way into retry exceeded (perf/README.md).
TEST_F(TransportTrace, TailProbeWaitsForAFirstRoundTripSample) {
  use_engine(with_probe());
  QpOpts o;
  o.timeout = 10;  // 4.194304 ms
  ASSERT_TRUE(up(IBV_QPT_RC, o));
  ASSERT_NO_FATAL_FAILURE(send_burst(4));
  poll(ack_timeout_ns(10) - 1);
  EXPECT_TRUE(sent().empty());
  EXPECT_EQ(ctr(ECtr::tail_probes), 0u);
  poll(ack_timeout_ns(10) + kSlack);
  EXPECT_EQ(sent().size(), 4u) << "the timeout's go-back-N";
  EXPECT_EQ(ctr(ECtr::timeouts), 1u);
}

// The probe runs from the newest packet that asked for an ACK (RFC 8985
// 7.2 restarts it on every transmission), not from the oldest one still
// unanswered: a paced QP sends between AckReqs, and timing from the first
// of them fired probes for packets that had arrived (perf/README.md).
TEST_F(TransportTrace, TailProbeRunsFromTheNewestSolicitedSend) {
  use_engine(with_probe());
  ASSERT_TRUE(up());
  measured_rtt(kUs);
  ASSERT_NO_FATAL_FAILURE(send_burst(1));
  ASSERT_EQ(post(wr(2, IBV_WR_SEND, {sge(0, 8)})), 0);
  poll(150 * kUs);
  ASSERT_EQ(sent().size(), 1u);
  poll(349 * kUs);
  EXPECT_TRUE(sent().empty()) << "200 us after the second send, not the first";
  poll(351 * kUs);
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.psn, kSqPsn + 1);
  EXPECT_EQ(ctr(ECtr::tail_probes), 1u);
}

// The probe's timer stays where the first send set it and moves on when it
// fires (arm_probe: not once per packet). An lcore off the CPU past both
// the probe's due time and the retransmit timeout then runs the timeout's
// go-back alone, not a probe first (which the timeout would resend anyway).
TEST_F(TransportTrace, AfterAStallPastTheTimeoutNoProbeGoesFirst) {
  use_engine(with_probe());
  QpOpts o;
  o.timeout = 10;  // 4.194304 ms
  ASSERT_TRUE(up(IBV_QPT_RC, o));
  measured_rtt(kUs);
  ASSERT_NO_FATAL_FAILURE(send_burst(1));
  ASSERT_EQ(post(wr(2, IBV_WR_SEND, {sge(0, 8)})), 0);
  poll(150 * kUs);  // the second send: the probe is due at 350 us
  ASSERT_EQ(sent().size(), 1u);
  poll(ack_timeout_ns(10) + kSlack);  // one poll, 4 ms later
  auto p = sent();
  ASSERT_EQ(p.size(), 2u) << dump(p);
  EXPECT_EQ(p[0].f.psn, kSqPsn);
  EXPECT_EQ(ctr(ECtr::timeouts), 1u);
  EXPECT_EQ(ctr(ECtr::tail_probes), 0u);
  inject(ack(kSqPsn + 1, 2));
  poll(ack_timeout_ns(10) + 2 * kSlack);
  EXPECT_EQ(cq_poll().size(), 2u);
}

// A probe that finds an earlier packet missing draws a sequence NAK and
// the usual go-back from there.
TEST_F(TransportTrace, TailProbeAnsweredByASequenceNakGoesBack) {
  use_engine(with_probe());
  ASSERT_TRUE(up());
  measured_rtt(kUs);
  ASSERT_NO_FATAL_FAILURE(send_burst(4));
  poll(201 * kUs);
  ASSERT_EQ(sent().size(), 1u);
  inject(nak(kSqPsn + 1, kNakSeq));  // P arrived, P+1 did not
  poll(202 * kUs);
  auto p = sent();
  ASSERT_EQ(p.size(), 3u) << dump(p);
  EXPECT_EQ(p[0].f.psn, kSqPsn + 1);
  EXPECT_EQ(p[2].f.psn, kSqPsn + 3);
  EXPECT_EQ(ctr(ECtr::naks_seq_rx), 1u);
}

// A go-back's resend that stopped at the window (short of the highest PSN
// sent) and drew no answer is probed too: its last packet goes again.
// (With many QPs the probe may also find the window smaller than what is
// in flight: it goes anyway, probe_due_; perf/README.md "1 % loss" measured
// that case, 405 timeouts in 3 s at 16 QPs before, none after.)
TEST_F(TransportTrace, TailProbeCoversAWindowBoundGoBack) {
  EngineConfig ec;
  ec.cc.init_window = 16;
  ec.tail_probe_ns = 200 * kUs;
  use_engine(ec);
  ASSERT_TRUE(up());
  measured_rtt(kUs);
  ASSERT_NO_FATAL_FAILURE(send_burst(16));
  // Peer: P..P+2 arrived, P+3 did not: ACK P+2, NAK P+3. Slow start made
  // the window 19, the loss halves it to 9: the go-back resends P+3..P+11
  // and stops there, short of P+16.
  inject(ack(kSqPsn + 2, 3));
  inject(nak(kSqPsn + 3, kNakSeq));
  poll(10 * kUs);
  auto p = sent();
  ASSERT_EQ(p.size(), 9u) << dump(p);
  EXPECT_EQ(p[0].f.psn, kSqPsn + 3);
  // Nothing more comes back (the resend or its ACKs were lost). The probe
  // resends the last packet of the resend, P+11.
  poll(220 * kUs);
  p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.psn, kSqPsn + 11);
  EXPECT_TRUE(p[0].f.ack_req);
  EXPECT_EQ(ctr(ECtr::timeouts), 0u);
}

// Without any answer: the first two probes are the last packet, the next
// ones the oldest unacknowledged packet alone (the responder's one NAK for
// its gap may have been lost; or it is only slow, and a whole window
// resent would be wasted); they back off x2, and the Local ACK Timeout
// still fires when it would have without them.
TEST_F(TransportTrace, TailProbesBackOffAndTheTimeoutKeepsItsTime) {
  use_engine(with_probe());
  QpOpts o;
  o.timeout = 10;  // 4.194304 ms
  ASSERT_TRUE(up(IBV_QPT_RC, o));
  measured_rtt(kUs);
  const uint64_t T = ack_timeout_ns(10);
  ASSERT_NO_FATAL_FAILURE(send_burst(4));
  // Probes at 201 us, then 400, 800 and 1600 us after each: two of the
  // last packet, then of the first.
  for (uint64_t at : {201u, 602u, 1403u, 3004u}) {
    poll((at - 2) * kUs);
    EXPECT_TRUE(sent().empty()) << "before " << at << " us";
    poll(at * kUs);
    auto p = sent();
    ASSERT_EQ(p.size(), 1u) << at << " us: " << dump(p);
    EXPECT_EQ(p[0].f.psn, at < 1000 ? kSqPsn + 3 : kSqPsn);
    EXPECT_TRUE(p[0].f.ack_req);
  }
  EXPECT_EQ(ctr(ECtr::timeouts), 0u);
  EXPECT_EQ(ctr(ECtr::tail_probes), 4u);
  poll(T - 1);
  EXPECT_TRUE(sent().empty());
  poll(T + kSlack);
  auto p = sent();
  ASSERT_EQ(p.size(), 4u) << dump(p);
  EXPECT_EQ(p[0].f.psn, kSqPsn);
  EXPECT_EQ(ctr(ECtr::timeouts), 1u);
}

TEST_F(TransportTrace, RetryExhaustedAfterRetryCntRetransmitsThenFlush) {
  QpOpts o;
  o.timeout = 10;
  o.retry_cnt = 3;
  ASSERT_TRUE(up(IBV_QPT_RC, o));
  const uint64_t T = ack_timeout_ns(10);
  // Post: SEND wr 1, SEND wr 2 (unsignaled), WRITE wr 3; RECV wr 9.
  ASSERT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 8)})), 0);
  ASSERT_EQ(post(wr(2, IBV_WR_SEND, {sge(0, 8)}, 0)), 0);
  ASSERT_EQ(post(rdma(3, IBV_WR_RDMA_WRITE, {sge(0, 8)}, kPeerVa)), 0);
  ASSERT_EQ(post_recv(rwr(9, {sge(0x10000, 8)})), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 3u);
  // Three timeouts: each resends P, P+1, P+2 (never early).
  uint64_t t = 0;
  int resends_of_p = 0;
  for (int i = 0; i < 3; ++i) {
    poll(t + T - 1);
    auto early = sent();
    EXPECT_TRUE(early.empty()) << "retry " << i << " " << dump(early);
    t += T + kSlack;
    poll(t);
    auto p = sent();
    ASSERT_EQ(p.size(), 3u) << "retry " << i << " " << dump(p);
    for (uint32_t k = 0; k < 3; ++k) EXPECT_EQ(p[k].f.psn, kSqPsn + k);
    resends_of_p += p[0].f.psn == kSqPsn;
    EXPECT_TRUE(cq_poll().empty());
  }
  EXPECT_EQ(resends_of_p, 3);
  // Fourth timeout: retries exhausted.
  t += T + kSlack;
  poll(t);
  auto p = sent();
  // Expect: no 4th resend; wr 1 RETRY_EXC_ERR, wr 2 and 3 flushed in order
  // (wr 2 although unsignaled); RECV 9 flushed; QP ERR.
  EXPECT_TRUE(p.empty()) << dump(p);
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 3u);
  EXPECT_WC(wc[0], 1u, IBV_WC_RETRY_EXC_ERR, IBV_WC_SEND);
  EXPECT_WC(wc[1], 2u, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND);
  EXPECT_WC(wc[2], 3u, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND);
  auto rwc = rcq_poll();
  ASSERT_EQ(rwc.size(), 1u);
  EXPECT_WC(rwc[0], 9u, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV);
  EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
  EXPECT_EQ(ctr(ECtr::timeouts), 4u);
}

TEST_F(TransportTrace, PartialAckThenTimeoutResumesWriteMidMessage) {
  QpOpts o;
  o.timeout = 10;
  ASSERT_TRUE(up(IBV_QPT_RC, o));
  const uint64_t T = ack_timeout_ns(10);
  put(0x1000, pattern(4096, 0x41));
  // Post: WRITE 4096 bytes: WRITE_FIRST P .. WRITE_LAST P+3.
  ASSERT_EQ(post(rdma(1, IBV_WR_RDMA_WRITE, {sge(0x1000, 4096)}, kPeerVa)), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 4u);
  // Peer at 1 ms: ACK P+1 (the first half arrived), then silence.
  now_ = 1 * kMs;
  inject(ack(kSqPsn + 1, 0));
  poll(1 * kMs);
  EXPECT_TRUE(cq_poll().empty());
  EXPECT_TRUE(sent().empty());
  poll(1 * kMs + T + kSlack);
  auto p = sent();
  // Expect: resend from P+2 only: WRITE_MIDDLE P+2 (offset 2048, no RETH),
  // WRITE_LAST P+3 (offset 3072, AckReq).
  ASSERT_EQ(p.size(), 2u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcWriteMiddle);
  EXPECT_EQ(p[0].f.psn, kSqPsn + 2);
  EXPECT_EQ(p[0].payload, bytes(0x1000 + 2048, 1024));
  EXPECT_EQ(p[1].f.opcode, op::kRcWriteLast);
  EXPECT_EQ(p[1].f.psn, kSqPsn + 3);
  EXPECT_EQ(p[1].payload, bytes(0x1000 + 3072, 1024));
  EXPECT_TRUE(p[1].f.ack_req);
  // Peer: ACK P+3. Expect: the WRITE completes.
  inject(ack(kSqPsn + 3, 1));
  poll();
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(wc[0].byte_len, 4096u);
}

TEST_F(TransportTrace, PartlyAnsweredReadIsReRequestedForTheRest) {
  QpOpts o;
  o.timeout = 10;
  ASSERT_TRUE(up(IBV_QPT_RC, o));
  const uint64_t T = ack_timeout_ns(10);
  const auto remote = pattern(4096, 0x51);
  // Post: READ 4096 bytes from kPeerVa into local 0x20000.
  ASSERT_EQ(post(rdma(1, IBV_WR_RDMA_READ, {sge(0x20000, 4096)}, kPeerVa)), 0);
  poll(0);
  auto p = sent();
  // Expect: READ_REQUEST P, RETH(kPeerVa, rkey, 4096), AckReq.
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcReadRequest);
  EXPECT_EQ(p[0].f.psn, kSqPsn);
  EXPECT_EQ(p[0].f.reth_va, kPeerVa);
  EXPECT_EQ(p[0].f.reth_rkey, kPeerRkey);
  EXPECT_EQ(p[0].f.reth_len, 4096u);
  EXPECT_TRUE(p[0].f.ack_req);
  // Peer at 1 ms: READ_RESPONSE_FIRST P, MIDDLE P+1; the rest is lost.
  now_ = 1 * kMs;
  inject(read_resp(op::kRcReadRespFirst, kSqPsn), slice(remote, 0, 1024));
  inject(pkt(op::kRcReadRespMiddle, kSqPsn + 1), slice(remote, 1024, 1024));
  poll(1 * kMs);
  // Expect: data lands at (psn - first) * mtu; no completion yet.
  EXPECT_EQ(bytes(0x20000, 2048), slice(remote, 0, 2048));
  EXPECT_TRUE(cq_poll().empty());
  poll(1 * kMs + T + kSlack);
  p = sent();
  // Expect: READ_REQUEST P+2, RETH(kPeerVa + 2048, rkey, 2048).
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcReadRequest);
  EXPECT_EQ(p[0].f.psn, kSqPsn + 2);
  EXPECT_EQ(p[0].f.reth_va, kPeerVa + 2048);
  EXPECT_EQ(p[0].f.reth_rkey, kPeerRkey);
  EXPECT_EQ(p[0].f.reth_len, 2048u);
  // Peer: answers the re-request: FIRST P+2, LAST P+3.
  inject(read_resp(op::kRcReadRespFirst, kSqPsn + 2),
         slice(remote, 2048, 1024));
  inject(read_resp(op::kRcReadRespLast, kSqPsn + 3, 1),
         slice(remote, 3072, 1024));
  poll();
  // Expect: IBV_WC_RDMA_READ, 4096 bytes, all data in place.
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_RDMA_READ);
  EXPECT_EQ(wc[0].byte_len, 4096u);
  EXPECT_EQ(bytes(0x20000, 4096), remote);
  // The next request uses P+4.
  ASSERT_EQ(post(wr(2, IBV_WR_SEND, {sge(0, 8)})), 0);
  poll();
  p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.psn, kSqPsn + 4);
}

// A probe of a partly answered READ re-requests the rest, from the first
// missing response, never the READ's last packet alone: rxe (and 9.7.5.1.3,
// a re-request is the original READ or a subset of it) takes a duplicate
// READ as the new extent of its responder resource, so after a probe of
// the last 1 KiB it dropped the re-request for the gap before it, and the
// READ ran out of retries (tools/vm-rxe-interop, igb, ib_read_bw -q 8).
TEST_F(TransportTrace, TailProbeOfAPartlyAnsweredReadReRequestsTheRest) {
  use_engine(with_probe());
  ASSERT_TRUE(up());
  measured_rtt(kUs);
  const auto remote = pattern(4096, 0x53);
  ASSERT_NO_FATAL_FAILURE(read_half_answered(remote));
  EXPECT_TRUE(sent().empty());
  for (uint64_t at : {300u, 1000u, 3000u}) {
    poll(at * kUs);
    auto p = sent();
    ASSERT_EQ(p.size(), 1u) << at << " us: " << dump(p);
    EXPECT_EQ(p[0].f.opcode, op::kRcReadRequest);
    EXPECT_EQ(p[0].f.psn, kSqPsn + 2) << at << " us";
    EXPECT_EQ(p[0].f.reth_va, kPeerVa + 2048);
    EXPECT_EQ(p[0].f.reth_len, 2048u);
  }
  EXPECT_GE(ctr(ECtr::tail_probes), 3u);
  EXPECT_EQ(ctr(ECtr::timeouts), 0u);
  ASSERT_NO_FATAL_FAILURE(read_rest_answered(remote, 3001 * kUs));
}

// A READ's probe is answered by the responses it asks for, lost or late
// alike, never by a NAK: the probe itself is the loss, and cuts the QP's
// and the shared window once per window of data (as a sequence NAK does).
// Without the cut, READs whose tails were lost never shrank their windows
// (perf/README.md, "READ under load").
TEST_F(TransportTrace, TailProbeOfAReadCutsTheWindowsOncePerWindow) {
  EngineConfig ec;  // the windows on
  ec.tail_probe_ns = 200 * 1000;
  ec.cc.init_window = 16;
  use_engine(ec);
  ASSERT_TRUE(up());
  measured_rtt(kUs);
  const auto remote = pattern(4096, 0x5c);
  // Two responses ACKed: slow start 16 -> 18.
  ASSERT_NO_FATAL_FAILURE(read_half_answered(remote));
  EXPECT_EQ(qp_->counters().cc_window.get(), 18u);
  EXPECT_EQ(ctr(ECtr::cc_window_cuts), 0u);
  // The first probe re-asks for P+2.. and cuts both windows.
  poll(300 * kUs);
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcReadRequest);
  EXPECT_EQ(p[0].f.psn, kSqPsn + 2);
  EXPECT_EQ(ctr(ECtr::tail_probes), 1u);
  EXPECT_EQ(ctr(ECtr::cc_window_cuts), 1u);
  EXPECT_EQ(ctr(ECtr::cc_shared_cuts), 1u);
  EXPECT_EQ(qp_->counters().cc_window.get(), 9u);
  // The second probe of the same window cuts nothing more, and neither
  // spends a retry.
  poll(1000 * kUs);
  ASSERT_EQ(sent().size(), 1u);
  EXPECT_EQ(ctr(ECtr::tail_probes), 2u);
  EXPECT_EQ(ctr(ECtr::cc_window_cuts), 1u);
  EXPECT_EQ(qp_->counters().cc_window.get(), 9u);
  EXPECT_EQ(ctr(ECtr::timeouts), 0u);
  ASSERT_NO_FATAL_FAILURE(read_rest_answered(remote, 1001 * kUs));
}

// A READ of 4 KiB into 0x20000, posted and sent at `at`.
#define SEND_READ(id, at)                                                      \
  do {                                                                         \
    ASSERT_EQ(post(rdma(id, IBV_WR_RDMA_READ, {sge(0x20000, 4096)}, kPeerVa)), \
              0);                                                              \
    poll(at);                                                                  \
    ASSERT_EQ(sent().size(), 1u);                                              \
  } while (0)

// A probe answered a probe time or more after it: the peer had paused (a
// running one answers within a round trip), for the whole silence, and the
// probe time keeps that as its floor for 1-2 s (Qp::pause_); else it fires,
// and cuts the window, every time the peer's lcore is off the CPU a few ms
// (perf/README.md, "the peer's pauses"). Answered within a round trip, it
// found a loss: nothing is learnt.
TEST_F(TransportTrace, ProbeAnsweredLateTeachesTheProbeTimeThePeersPause) {
  EngineConfig ec;  // the windows on
  ec.tail_probe_ns = 200 * kUs;
  use_engine(ec);
  ASSERT_TRUE(up());
  measured_rtt(kUs);
  const auto remote = pattern(4096, 0x5c);
  // P and P+1 arrive at 10 us, the probe's time runs from there; the lcore
  // polls every 50 us while the peer is silent: probes at 250 us, 650 us
  // (backed off), ...
  ASSERT_NO_FATAL_FAILURE(read_half_answered(remote));
  run_until(4 * kMs);
  EXPECT_GE(ctr(ECtr::tail_probes), 3u);
  sent();
  // The rest comes at 4 ms, long after the newest probe: a pause of ~4 ms.
  ASSERT_NO_FATAL_FAILURE(read_rest_answered(remote, 4 * kMs));
  EXPECT_EQ(ctr(ECtr::probe_pauses), 1u);
  const uint64_t probes = ctr(ECtr::tail_probes);
  // The next READ's probe waits that pause out, not 200 us.
  SEND_READ(2, 10 * kMs);
  run_until(13950 * kUs);
  EXPECT_EQ(sent().size(), 0u);
  run_until(14050 * kUs);
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcReadRequest);
  EXPECT_EQ(p[0].f.psn, kSqPsn + 4);
  EXPECT_EQ(ctr(ECtr::tail_probes), probes + 1);
  // Answered 20 us after the probe: it found a loss; nothing is learnt.
  const auto more = pattern(4096, 0x3a);
  poll(14070 * kUs);
  inject(read_resp(op::kRcReadRespFirst, kSqPsn + 4), slice(more, 0, 1024));
  inject(pkt(op::kRcReadRespMiddle, kSqPsn + 5), slice(more, 1024, 1024));
  inject(pkt(op::kRcReadRespMiddle, kSqPsn + 6), slice(more, 2048, 1024));
  inject(read_resp(op::kRcReadRespLast, kSqPsn + 7, 1),
         slice(more, 3072, 1024));
  poll(14100 * kUs);
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 2u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(bytes(0x20000, 4096), more);
  EXPECT_EQ(ctr(ECtr::probe_pauses), 1u);
  // Two seconds later the pause is forgotten: 200 us again.
  SEND_READ(3, 2500 * kMs);
  run_until(2500 * kMs + 250 * kUs);
  p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.psn, kSqPsn + 8);
}

// An answer that waited for this lcore (off the CPU itself after the probe)
// says nothing of the peer's pauses.
TEST_F(TransportTrace, AnswerThatWaitedForThisLcoreTeachesNothing) {
  EngineConfig ec;
  ec.tail_probe_ns = 2 * kMs;
  use_engine(ec);
  ASSERT_TRUE(up());
  measured_rtt(kUs);
  const auto remote = pattern(4096, 0x5c);
  ASSERT_NO_FATAL_FAILURE(read_half_answered(remote));
  run_until(2050 * kUs);  // the probe, at 2.05 ms
  ASSERT_EQ(sent().size(), 1u);
  // This lcore is off the CPU until 5 ms; the answer was waiting in its
  // ring, 2.95 ms after the probe (a probe time is 2 ms).
  engine_->lcore_paused(5 * kMs, 2950 * kUs);
  poll(5 * kMs);
  ASSERT_NO_FATAL_FAILURE(read_rest_answered(remote, 5 * kMs));
  EXPECT_EQ(ctr(ECtr::probe_pauses), 0u);
  SEND_READ(2, 10 * kMs);
  run_until(12100 * kUs);
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.psn, kSqPsn + 4);
}
#undef SEND_READ

TEST_F(TransportTrace, AckCoveringUnansweredReadRetransmitsIt) {
  ASSERT_TRUE(up());
  // Post: READ 100 bytes (P), SEND (P+1).
  ASSERT_EQ(post(rdma(1, IBV_WR_RDMA_READ, {sge(0x20000, 100)}, kPeerVa)), 0);
  ASSERT_EQ(post(wr(2, IBV_WR_SEND, {sge(0, 8)})), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 2u);
  // Peer: ACK P+1 (so the read response for P was lost).
  inject(ack(kSqPsn + 1, 2));
  poll(5 * kUs);
  auto p = sent();
  // Expect: READ_REQUEST P again; nothing completes yet (SQ order).
  ASSERT_GE(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcReadRequest);
  EXPECT_EQ(p[0].f.psn, kSqPsn);
  EXPECT_EQ(p[0].f.reth_len, 100u);
  EXPECT_TRUE(cq_poll().empty());
  // Peer: READ_RESPONSE_ONLY P. Expect: READ then SEND complete.
  inject(read_resp(op::kRcReadRespOnly, kSqPsn, 1), pattern(100, 7));
  inject(ack(kSqPsn + 1, 2));
  poll(6 * kUs);
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_RDMA_READ);
  EXPECT_WC(wc[1], 2u, IBV_WC_SUCCESS, IBV_WC_SEND);
  EXPECT_EQ(bytes(0x20000, 100), pattern(100, 7));
}

TEST_F(TransportTrace, NakSeqErrorImpliesAckAndGoesBack) {
  ASSERT_TRUE(up());
  put(0, pattern(300, 0x61));
  // Post: three SENDs, PSNs P, P+1, P+2.
  for (uint64_t i = 0; i < 3; ++i)
    ASSERT_EQ(post(wr(i + 1, IBV_WR_SEND, {sge(100 * i, 100)})), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 3u);
  // Peer: NAK sequence error at P+1.
  inject(nak(kSqPsn + 1, kNakSeq));
  poll(5 * kUs);
  // Expect: wr 1 completes (implied ACK of P), P+1 and P+2 are resent as
  // they were.
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_SEND);
  auto p = sent();
  ASSERT_EQ(p.size(), 2u) << dump(p);
  EXPECT_EQ(p[0].f.psn, kSqPsn + 1);
  EXPECT_EQ(p[0].f.opcode, op::kRcSendOnly);
  EXPECT_EQ(p[0].payload, bytes(100, 100));
  EXPECT_EQ(p[1].f.psn, kSqPsn + 2);
  EXPECT_EQ(p[1].payload, bytes(200, 100));
  EXPECT_EQ(ctr(ECtr::naks_seq_rx), 1u);
  // Peer: ACK P+2. Expect: wr 2, wr 3.
  inject(ack(kSqPsn + 2, 3));
  poll(6 * kUs);
  wc = cq_poll();
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_WC(wc[0], 2u, IBV_WC_SUCCESS, IBV_WC_SEND);
  EXPECT_WC(wc[1], 3u, IBV_WC_SUCCESS, IBV_WC_SEND);
}

TEST_F(TransportTrace, RetryCnt7MeansSevenRetriesNotInfinite) {
  QpOpts o;
  o.timeout = 8;  // 1.048576 ms
  o.retry_cnt = 7;
  ASSERT_TRUE(up(IBV_QPT_RC, o));
  const uint64_t T = ack_timeout_ns(8);
  ASSERT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 8)})), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 1u);
  uint64_t t = 0;
  for (int i = 0; i < 7; ++i) {
    t += T + kSlack;
    poll(t);
    auto p = sent();
    ASSERT_EQ(p.size(), 1u) << "retry " << i << " " << dump(p);
    EXPECT_EQ(p[0].f.psn, kSqPsn);
  }
  t += T + kSlack;
  poll(t);
  // Expect: the 8th expiry fails the WR instead of an 8th retry.
  EXPECT_TRUE(sent().empty());
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 1u, IBV_WC_RETRY_EXC_ERR, IBV_WC_SEND);
}

TEST_F(TransportTrace, TimeoutZeroNeverRetransmits) {
  QpOpts o;
  o.timeout = 0;
  ASSERT_TRUE(up(IBV_QPT_RC, o));
  ASSERT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 8)})), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 1u);
  // Expect: nothing, however long we wait.
  for (uint64_t t = 1; t <= 10; ++t) poll(t * 1000 * kMs);
  EXPECT_TRUE(sent().empty());
  EXPECT_TRUE(cq_poll().empty());
  EXPECT_EQ(ctr(ECtr::timeouts), 0u);
  inject(ack(kSqPsn, 1));
  poll();
  EXPECT_EQ(cq_poll().size(), 1u);
}

TEST_F(TransportTrace, ReadResponseGapTriggersOneReRequest) {
  ASSERT_TRUE(up());
  const auto remote = pattern(3072, 0x71);
  // Post: READ 3072 bytes (PSNs P..P+2).
  ASSERT_EQ(post(rdma(1, IBV_WR_RDMA_READ, {sge(0x20000, 3072)}, kPeerVa)), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 1u);
  // Peer: READ_RESPONSE_FIRST P, (MIDDLE P+1 lost), LAST P+2.
  inject(read_resp(op::kRcReadRespFirst, kSqPsn), slice(remote, 0, 1024));
  inject(read_resp(op::kRcReadRespLast, kSqPsn + 2, 1),
         slice(remote, 2048, 1024));
  poll(10 * kUs);
  auto p = sent();
  // Expect: LAST dropped; READ_REQUEST P+1 for (va+1024, 2048).
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcReadRequest);
  EXPECT_EQ(p[0].f.psn, kSqPsn + 1);
  EXPECT_EQ(p[0].f.reth_va, kPeerVa + 1024);
  EXPECT_EQ(p[0].f.reth_len, 2048u);
  EXPECT_TRUE(cq_poll().empty());
  // Peer: the stale LAST P+2 once more. Expect: no second re-request.
  inject(read_resp(op::kRcReadRespLast, kSqPsn + 2, 1),
         slice(remote, 2048, 1024));
  poll(20 * kUs);
  p = sent();
  EXPECT_TRUE(p.empty()) << dump(p);
  // Peer: answers the re-request. Expect: READ completes with all bytes.
  inject(read_resp(op::kRcReadRespFirst, kSqPsn + 1),
         slice(remote, 1024, 1024));
  inject(read_resp(op::kRcReadRespLast, kSqPsn + 2, 1),
         slice(remote, 2048, 1024));
  poll(30 * kUs);
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_RDMA_READ);
  EXPECT_EQ(bytes(0x20000, 3072), remote);
}

TEST_F(TransportTrace, NakSeqErrorCountsAsRetry) {
  QpOpts o;
  o.retry_cnt = 1;
  ASSERT_TRUE(up(IBV_QPT_RC, o));
  ASSERT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 8)})), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 1u);
  // Peer: NAK seq at P. Expect: resend of P (the one retry).
  inject(nak(kSqPsn, kNakSeq));
  poll(5 * kUs);
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.psn, kSqPsn);
  // Peer: NAK seq at P again, no progress. Expect: ignored -- packets sent
  // before the go-back report the same gap, so one retry per gap; nothing
  // is resent and nothing completes.
  inject(nak(kSqPsn, kNakSeq));
  poll(10 * kUs);
  p = sent();
  EXPECT_TRUE(p.empty()) << dump(p);
  EXPECT_TRUE(cq_poll().empty());
  // Expect: the retransmit timer (4.096 us * 2^14) then finds the retry
  // budget spent: RETRY_EXC_ERR, nothing resent.
  poll(10 * kUs + (uint64_t{4096} << 14) + 2 * kUs);
  p = sent();
  EXPECT_TRUE(p.empty()) << dump(p);
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 1u, IBV_WC_RETRY_EXC_ERR, IBV_WC_SEND);
}

TEST_F(TransportTrace, LateAckAfterGoBackMovesRequesterForward) {
  QpOpts o;
  o.timeout = 10;
  ASSERT_TRUE(up(IBV_QPT_RC, o));
  const uint64_t T = ack_timeout_ns(10);
  for (uint64_t i = 0; i < 4; ++i)
    ASSERT_EQ(post(wr(i + 1, IBV_WR_SEND, {sge(0, 8)})), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 4u);
  // Timeout with room for one frame: only P is resent so far.
  io_.room = 1;
  poll(T + kSlack);
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.psn, kSqPsn);
  // Peer: the delayed ACK of the original P+3 arrives.
  inject(ack(kSqPsn + 3, 4));
  io_.room = -1;
  poll(T + kSlack + 10 * kUs);
  // Expect: all four complete; P+1..P+3 are not sent again.
  p = sent();
  EXPECT_TRUE(p.empty()) << dump(p);
  EXPECT_EQ(cq_poll().size(), 4u);
  EXPECT_EQ(ctr(ECtr::rx_ghost_ack), 0u);
  // The next WR uses P+4.
  ASSERT_EQ(post(wr(5, IBV_WR_SEND, {sge(0, 8)})), 0);
  poll();
  p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.psn, kSqPsn + 4);
}

// ===========================================================================
// Remote access and invalid requests
// ===========================================================================

class TransportTraceAccess : public TransportTrace {
 protected:
  // Injects WRITE_ONLY (64 bytes) to (va, rkey); expects NAK remote access
  // error at ePSN, QP in ERR, the target untouched, the RECV flushed.
  void expect_access_nak(uint64_t va, uint32_t rkey, uint8_t* target,
                         RespResult why, ECtr why_ctr) {
    ASSERT_EQ(post_recv(rwr(9, {sge(0x10000, 64)})), 0);
    inject(write_req(op::kRcWriteOnly, kRqPsn, true, va, 64, rkey),
           pattern(64, 0x99));
    poll(1 * kUs);
    auto p = sent();
    // Expect: NAK 0x62 with the request's PSN; QP -> ERR.
    ASSERT_EQ(p.size(), 1u) << dump(p);
    EXPECT_EQ(p[0].f.opcode, op::kRcAck);
    EXPECT_EQ(p[0].f.aeth_syndrome, kNakRemAccess);
    EXPECT_EQ(p[0].f.psn, kRqPsn);
    EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
    EXPECT_EQ(ctr(ECtr::naks_access_tx), 1u);
    // One cause, one counter, and the QP remembers it (urnicctl qps).
    EXPECT_EQ(ctr(why_ctr), 1u);
    EXPECT_EQ(qp_->counters().nak_cause.get(), static_cast<uint64_t>(why));
    if (target) {
      EXPECT_EQ(std::vector<uint8_t>(target, target + 64),
                std::vector<uint8_t>(64, 0));
    }
    auto wc = rcq_poll();
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_WC(wc[0], 9u, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV);
    // No receive WQE reports a WRITE's access error: the responder's
    // client gets the affiliated asynchronous error (C9-222.1), once.
    EXPECT_EQ(qp_events(),
              std::vector<ibv_event_type>{IBV_EVENT_QP_ACCESS_ERR});
  }
};

TEST_F(TransportTraceAccess, WriteWithBadRkeyNaksRemoteAccess) {
  ASSERT_TRUE(up());
  expect_access_nak(addr(0x30000), mr_->rkey() ^ 0xff, at(0x30000),
                    RespResult::rkey_invalid, ECtr::rx_rkey_invalid);
}

TEST_F(TransportTraceAccess, WriteOutOfMrBoundsNaksRemoteAccess) {
  ASSERT_TRUE(up());
  Mr* small = nullptr;
  ASSERT_EQ(
      dev_->reg_mr(pd_, at(0x80000), 4096, addr(0x80000), kAllAccess, &small),
      0);
  // 64 bytes starting 32 bytes before the end of the 4 KiB region.
  expect_access_nak(addr(0x80000 + 4096 - 32), small->rkey(), nullptr,
                    RespResult::rkey_bounds, ECtr::rx_rkey_bounds);
  EXPECT_EQ(bytes(0x80000 + 4096 - 32, 32), std::vector<uint8_t>(32, 0));
}

TEST_F(TransportTraceAccess, WriteToMrWithoutRemoteWriteNaksRemoteAccess) {
  ASSERT_TRUE(up());
  Mr* ro = nullptr;
  ASSERT_EQ(dev_->reg_mr(pd_, at(0x80000), 4096, addr(0x80000),
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ, &ro),
            0);
  expect_access_nak(addr(0x80000), ro->rkey(), at(0x80000),
                    RespResult::rkey_rights, ECtr::rx_rkey_rights);
}

TEST_F(TransportTraceAccess, WriteToMrOfOtherPdNaksRemoteAccess) {
  ASSERT_TRUE(up());
  Pd* other = nullptr;
  ASSERT_EQ(dev_->alloc_pd(&other), 0);
  Mr* mr = nullptr;
  ASSERT_EQ(
      dev_->reg_mr(other, at(0x80000), 4096, addr(0x80000), kAllAccess, &mr),
      0);
  expect_access_nak(addr(0x80000), mr->rkey(), at(0x80000), RespResult::rkey_pd,
                    ECtr::rx_rkey_pd);
}

TEST_F(TransportTraceAccess, WriteToQpWithoutRemoteWriteAccessNaks) {
  QpOpts o;
  o.access = IBV_ACCESS_REMOTE_READ;  // the QP does not allow writes
  ASSERT_TRUE(up(IBV_QPT_RC, o));
  expect_access_nak(addr(0x30000), mr_->rkey(), at(0x30000),
                    RespResult::qp_access, ECtr::rx_qp_access);
}

TEST_F(TransportTrace, RemoteAccessNakFailsWrFlushesRest) {
  ASSERT_TRUE(up());
  // Post: WRITE wr 1 (P), SEND wr 2 (P+1); RECV wr 9.
  ASSERT_EQ(post(rdma(1, IBV_WR_RDMA_WRITE, {sge(0, 64)}, kPeerVa)), 0);
  ASSERT_EQ(post(wr(2, IBV_WR_SEND, {sge(0, 64)})), 0);
  ASSERT_EQ(post_recv(rwr(9, {sge(0x10000, 64)})), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 2u);
  // Peer: NAK remote access error at P.
  inject(nak(kSqPsn, kNakRemAccess));
  poll(5 * kUs);
  // Expect: wr 1 REM_ACCESS_ERR, wr 2 flushed, RECV flushed, QP ERR.
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_WC(wc[0], 1u, IBV_WC_REM_ACCESS_ERR, IBV_WC_RDMA_WRITE);
  EXPECT_WC(wc[1], 2u, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND);
  auto rwc = rcq_poll();
  ASSERT_EQ(rwc.size(), 1u);
  EXPECT_WC(rwc[0], 9u, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV);
  EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
  // Expect: nothing is resent later.
  poll(1000 * kMs);
  EXPECT_TRUE(sent().empty());
}

TEST_F(TransportTrace, InvalidRequestNakCompletesRemInvReqErr) {
  ASSERT_TRUE(up());
  ASSERT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 64)})), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 1u);
  inject(nak(kSqPsn, kNakInvReq));
  poll(5 * kUs);
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 1u, IBV_WC_REM_INV_REQ_ERR, IBV_WC_SEND);
  EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
}

TEST_F(TransportTrace, WriteMiddleWithoutFirstNaksInvalidRequest) {
  ASSERT_TRUE(up());
  // Peer: RDMA_WRITE_MIDDLE at ePSN, no message in progress.
  inject(pkt(op::kRcWriteMiddle, kRqPsn, true), pattern(1024, 1));
  poll(1 * kUs);
  auto p = sent();
  // Expect: NAK invalid request at ePSN; QP ERR.
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcAck);
  EXPECT_EQ(p[0].f.aeth_syndrome, kNakInvReq);
  EXPECT_EQ(p[0].f.psn, kRqPsn);
  EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
  EXPECT_EQ(ctr(ECtr::naks_inv_req_tx), 1u);
  EXPECT_EQ(qp_events(), std::vector<ibv_event_type>{IBV_EVENT_QP_REQ_ERR});
}

TEST_F(TransportTrace, WriteLongerThanItsRethNaksWithItsOwnCause) {
  ASSERT_TRUE(up());
  // Peer: WRITE_ONLY carrying 64 bytes for a RETH length of 32.
  inject(write_req(op::kRcWriteOnly, kRqPsn, true, addr(0x30000), 32),
         pattern(64, 1));
  poll(1 * kUs);
  auto p = sent();
  // Expect: NAK invalid request, counted as a write length error, and
  // that is the QP's last cause; nothing written.
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.aeth_syndrome, kNakInvReq);
  EXPECT_EQ(ctr(ECtr::rx_write_length), 1u);
  EXPECT_EQ(ctr(ECtr::rx_bad_length), 0u);
  EXPECT_EQ(qp_->counters().nak_cause.get(),
            static_cast<uint64_t>(RespResult::write_length));
  EXPECT_EQ(bytes(0x30000, 64), std::vector<uint8_t>(64, 0));
}

// A RETH length over 2^31 (the largest message, IBTA 9.4.3) is an invalid
// request before any rkey is looked at: a READ that long would take half
// the PSN space or more (at MTU 256, 2^23 PSNs and up).
TEST_F(TransportTrace, ReadLongerThanTheLargestMessageNaksInvalidRequest) {
  ASSERT_TRUE(up());
  inject(
      write_req(op::kRcReadRequest, kRqPsn, true, addr(0x30000), 0x80000001u));
  poll(1 * kUs);
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcAck);
  EXPECT_EQ(p[0].f.aeth_syndrome, kNakInvReq);
  EXPECT_EQ(p[0].f.psn, kRqPsn);
  EXPECT_EQ(ctr(ECtr::rx_msg_too_long), 1u);
  EXPECT_EQ(ctr(ECtr::rx_rkey_bounds), 0u);
  EXPECT_EQ(qp_->counters().nak_cause.get(),
            static_cast<uint64_t>(RespResult::msg_too_long));
  EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
}

TEST_F(TransportTrace, WriteLongerThanTheLargestMessageNaksInvalidRequest) {
  ASSERT_TRUE(up());
  inject(write_req(op::kRcWriteFirst, kRqPsn, true, addr(0x30000), 0x80000001u),
         pattern(1024, 1));
  poll(1 * kUs);
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.aeth_syndrome, kNakInvReq);
  EXPECT_EQ(ctr(ECtr::rx_msg_too_long), 1u);
  EXPECT_EQ(ctr(ECtr::rx_rkey_bounds), 0u);
  EXPECT_EQ(bytes(0x30000, 64), std::vector<uint8_t>(64, 0));
}

TEST_F(TransportTrace, ShortMiddlePacketNaksAsAnOpcodeLengthError) {
  ASSERT_TRUE(up());
  // Peer: WRITE_FIRST of one MTU, then a MIDDLE of 100 bytes (a MIDDLE
  // carries exactly one MTU).
  inject(write_req(op::kRcWriteFirst, kRqPsn, false, addr(0x30000), 4096),
         pattern(1024, 1));
  inject(pkt(op::kRcWriteMiddle, kRqPsn + 1, true), pattern(100, 2));
  poll(1 * kUs);
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.aeth_syndrome, kNakInvReq);
  EXPECT_EQ(p[0].f.psn, kRqPsn + 1);
  EXPECT_EQ(ctr(ECtr::rx_bad_length), 1u);
  EXPECT_EQ(qp_->counters().nak_cause.get(),
            static_cast<uint64_t>(RespResult::opcode_length));
}

TEST_F(TransportTrace, SendLastAfterWriteFirstNaksInvalidRequest) {
  ASSERT_TRUE(up());
  ASSERT_EQ(post_recv(rwr(1, {sge(0x10000, 4096)})), 0);
  // Peer: WRITE_FIRST at ePSN, then SEND_LAST at ePSN+1.
  inject(write_req(op::kRcWriteFirst, kRqPsn, false, addr(0x30000), 2048),
         pattern(1024, 1));
  inject(pkt(op::kRcSendLast, kRqPsn + 1, true), pattern(100, 2));
  poll(1 * kUs);
  auto p = sent();
  // Expect: NAK invalid request at ePSN+1.
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.aeth_syndrome, kNakInvReq);
  EXPECT_EQ(p[0].f.psn, kRqPsn + 1);
  EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
  EXPECT_EQ(ctr(ECtr::rx_bad_opcode_seq), 1u);
  EXPECT_EQ(qp_->counters().nak_cause.get(),
            static_cast<uint64_t>(RespResult::opcode_seq));
}

TEST_F(TransportTrace, RemoteAccessNakOnSecondWrImpliesAckOfFirst) {
  ASSERT_TRUE(up());
  // Post: SEND wr 1 (P), WRITE wr 2 (P+1), SEND wr 3 (P+2).
  ASSERT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 8)})), 0);
  ASSERT_EQ(post(rdma(2, IBV_WR_RDMA_WRITE, {sge(0, 8)}, kPeerVa)), 0);
  ASSERT_EQ(post(wr(3, IBV_WR_SEND, {sge(0, 8)})), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 3u);
  // Peer: NAK remote access error at P+1.
  inject(nak(kSqPsn + 1, kNakRemAccess));
  poll(5 * kUs);
  // Expect: wr 1 SUCCESS (implied ACK), wr 2 REM_ACCESS_ERR, wr 3 flushed.
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 3u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_SEND);
  EXPECT_WC(wc[1], 2u, IBV_WC_REM_ACCESS_ERR, IBV_WC_RDMA_WRITE);
  EXPECT_WC(wc[2], 3u, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND);
  EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
}

// ===========================================================================
// Memory windows (IBTA 10.6.7): bind and invalidate through the send queue,
// remote access through the window's rkey, SEND_WITH_INV
// ===========================================================================

class TransportTraceMw : public TransportTrace {
 protected:
  // An MR over [0x90000, +8 KiB) that windows may be bound to.
  Mr* bindable() {
    Mr* m = nullptr;
    EXPECT_EQ(dev_->reg_mr(pd_, at(0x90000), 8192, addr(0x90000),
                           kAllAccess | IBV_ACCESS_MW_BIND, &m),
              0);
    return m;
  }
  static SendWr bind(uint64_t id, const Mw* mw, uint32_t new_rkey, const Mr* mr,
                     uint64_t va, uint64_t len, uint32_t access) {
    SendWr w = wr(id, IBV_WR_BIND_MW, {});
    w.bind = {mw->rkey(), new_rkey, mr ? mr->lkey() : 0, access, va, len};
    return w;
  }
  static uint32_t inc(uint32_t rkey) {
    return (rkey & ~0xffu) | ((rkey + 1) & 0xff);
  }
};

TEST_F(TransportTraceMw, Type2BindGivesRemoteAccessUntilSendWithInvalidate) {
  ASSERT_TRUE(up());
  Mr* mr = bindable();
  Mw* mw = nullptr;
  ASSERT_EQ(dev_->alloc_mw(pd_, IBV_MW_TYPE_2, &mw), 0);
  const uint32_t rkey = inc(mw->rkey());
  // Post: BIND of [0x90100, +256) with remote write. Expect: no packet, a
  // BIND_MW completion, the window bound under the new rkey.
  ASSERT_EQ(
      post(bind(1, mw, rkey, mr, addr(0x90100), 256, IBV_ACCESS_REMOTE_WRITE)),
      0);
  poll(0);
  EXPECT_TRUE(sent().empty());
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_BIND_MW);
  EXPECT_EQ(mw->rkey(), rkey);
  EXPECT_EQ(dev_->dereg_mr(mr), EBUSY);  // a window is bound to it
  // Peer: WRITE of 64 bytes through the window. Expect: ACK, data there.
  inject(write_req(op::kRcWriteOnly, kRqPsn, true, addr(0x90100), 64, rkey),
         pattern(64, 7));
  poll(1 * kUs);
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.aeth_syndrome, kAck);
  EXPECT_EQ(bytes(0x90100, 64), pattern(64, 7));
  // Peer: SEND_ONLY_WITH_INVALIDATE of that rkey. Expect: the receive
  // completes with IBV_WC_WITH_INV and the rkey; the window is free.
  ASSERT_EQ(post_recv(rwr(5, {sge(0x10000, 64)})), 0);
  auto inv = pkt(op::kRcSendOnlyInv, kRqPsn + 1, true);
  inv.ieth_rkey = rkey;
  inject(inv, pattern(16, 8));
  poll(2 * kUs);
  sent();
  wc = rcq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 5u, IBV_WC_SUCCESS, IBV_WC_RECV);
  EXPECT_TRUE(wc[0].wc_flags & IBV_WC_WITH_INV);
  EXPECT_EQ(wc[0].invalidated_rkey, rkey);
  EXPECT_FALSE(mw->bound());
  EXPECT_EQ(dev_->dereg_mr(mr), 0);  // nothing bound any more
  // Peer: another WRITE through the old rkey. Expect: NAK remote access.
  inject(write_req(op::kRcWriteOnly, kRqPsn + 2, true, addr(0x90100), 64, rkey),
         pattern(64, 9));
  poll(3 * kUs);
  p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.aeth_syndrome, kNakRemAccess);
  EXPECT_EQ(ctr(ECtr::rx_rkey_invalid), 1u);
}

TEST_F(TransportTraceMw, WindowLimitsTheRangeAndRights) {
  ASSERT_TRUE(up());
  Mr* mr = bindable();
  Mw* mw = nullptr;
  ASSERT_EQ(dev_->alloc_mw(pd_, IBV_MW_TYPE_1, &mw), 0);
  const uint32_t rkey = inc(mw->rkey());
  ASSERT_EQ(
      post(bind(1, mw, rkey, mr, addr(0x90100), 256, IBV_ACCESS_REMOTE_READ)),
      0);
  poll(0);
  ASSERT_EQ(cq_poll().size(), 1u);
  // Peer: WRITE through a read-only window. Expect: NAK, rights.
  inject(write_req(op::kRcWriteOnly, kRqPsn, true, addr(0x90100), 8, rkey),
         pattern(8, 1));
  poll(1 * kUs);
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.aeth_syndrome, kNakRemAccess);
  EXPECT_EQ(ctr(ECtr::rx_rkey_rights), 1u);
  // The window's own checks, directly: inside it, beyond it, another PD.
  Mr* out = nullptr;
  EXPECT_EQ(dev_->check_remote(pd_, rkey, addr(0x90100), 256,
                               IBV_ACCESS_REMOTE_READ, &out),
            AccessError::kOk);
  EXPECT_EQ(out, mr);
  EXPECT_EQ(dev_->check_remote(pd_, rkey, addr(0x90100), 257,
                               IBV_ACCESS_REMOTE_READ, &out),
            AccessError::kBounds);
  EXPECT_EQ(dev_->check_remote(pd_, mw->rkey() ^ 0x1, addr(0x90100), 8,
                               IBV_ACCESS_REMOTE_READ, &out),
            AccessError::kBadKey);
}

TEST_F(TransportTraceMw, BindErrorsCompleteWithMwBindErr) {
  ASSERT_TRUE(up());
  Mw* mw = nullptr;
  ASSERT_EQ(dev_->alloc_mw(pd_, IBV_MW_TYPE_1, &mw), 0);
  // mr_ lacks IBV_ACCESS_MW_BIND: the bind fails, the QP goes to error.
  ASSERT_EQ(post(bind(7, mw, inc(mw->rkey()), mr_, addr(0), 64,
                      IBV_ACCESS_REMOTE_READ)),
            0);
  poll(0);
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 7u, IBV_WC_MW_BIND_ERR, IBV_WC_BIND_MW);
  EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
  EXPECT_FALSE(mw->bound());
}

TEST_F(TransportTraceMw, BindWaitsForEarlierWrsAndLocalInvalidate) {
  ASSERT_TRUE(up());
  Mr* mr = bindable();
  Mw* mw = nullptr;
  ASSERT_EQ(dev_->alloc_mw(pd_, IBV_MW_TYPE_2, &mw), 0);
  const uint32_t rkey = inc(mw->rkey());
  // Post: SEND (P), then BIND. Expect: the SEND goes, the BIND waits for
  // its ACK (nothing bound yet), then completes after it.
  ASSERT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 8)})), 0);
  ASSERT_EQ(
      post(bind(2, mw, rkey, mr, addr(0x90000), 64, IBV_ACCESS_REMOTE_READ)),
      0);
  poll(0);
  ASSERT_EQ(sent().size(), 1u);
  EXPECT_FALSE(mw->bound());
  inject(ack(kSqPsn));
  poll(1 * kUs);
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_SEND);
  EXPECT_WC(wc[1], 2u, IBV_WC_SUCCESS, IBV_WC_BIND_MW);
  EXPECT_TRUE(mw->bound());
  // A type 2 window is bound once: binding it again is an error (asked of
  // the device directly, which leaves the QP alone)...
  EXPECT_EQ(dev_->bind_mw(pd_, qp_->qpn(),
                          {rkey, inc(rkey), mr->lkey(), IBV_ACCESS_REMOTE_READ,
                           addr(0x90000), 64}),
            IBV_WC_MW_BIND_ERR);
  // ...but LOCAL_INV frees it, and then it can be bound again.
  SendWr li = wr(3, IBV_WR_LOCAL_INV, {});
  li.imm_data = rkey;
  ASSERT_EQ(post(li), 0);
  poll(2 * kUs);
  wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 3u, IBV_WC_SUCCESS, IBV_WC_LOCAL_INV);
  EXPECT_FALSE(mw->bound());
  ASSERT_EQ(post(bind(4, mw, inc(rkey), mr, addr(0x90000), 64,
                      IBV_ACCESS_REMOTE_READ)),
            0);
  poll(3 * kUs);
  wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 4u, IBV_WC_SUCCESS, IBV_WC_BIND_MW);
  // Deallocating a bound window unbinds it; its MR can go then.
  ASSERT_EQ(dev_->dealloc_mw(mw), 0);
  EXPECT_EQ(dev_->dereg_mr(mr), 0);
}

// Local write and MW bind in a bind's access flags mean nothing for a
// window: taken, as rxe takes them; zero-based is refused.
TEST_F(TransportTraceMw, BindTakesLocalFlagsAndRefusesZeroBased) {
  ASSERT_TRUE(up());
  Mr* mr = bindable();
  Mw* mw = nullptr;
  ASSERT_EQ(dev_->alloc_mw(pd_, IBV_MW_TYPE_1, &mw), 0);
  const uint32_t rkey = inc(mw->rkey());
  EXPECT_EQ(dev_->bind_mw(pd_, qp_->qpn(),
                          {mw->rkey(), inc(rkey), mr->lkey(),
                           IBV_ACCESS_REMOTE_READ | IBV_ACCESS_ZERO_BASED,
                           addr(0x90000), 64}),
            IBV_WC_MW_BIND_ERR);
  EXPECT_FALSE(mw->bound());
  EXPECT_EQ(dev_->bind_mw(pd_, qp_->qpn(),
                          {mw->rkey(), rkey, mr->lkey(),
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND |
                               IBV_ACCESS_REMOTE_WRITE,
                           addr(0x90000), 64}),
            IBV_WC_SUCCESS);
  EXPECT_TRUE(mw->bound());
  ASSERT_EQ(dev_->dealloc_mw(mw), 0);
  EXPECT_EQ(dev_->dereg_mr(mr), 0);
}

TEST_F(TransportTraceMw, SendWithInvalidateCarriesItsRkeyInTheIeth) {
  ASSERT_TRUE(up());
  SendWr w = wr(1, IBV_WR_SEND_WITH_INV, {sge(0, 16)});
  w.imm_data = 0x800123ab;
  ASSERT_EQ(post(w), 0);
  poll(0);
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcSendOnlyInv);
  EXPECT_EQ(p[0].f.ieth_rkey, 0x800123abu);
}

TEST_F(TransportTraceMw, SendWithInvalidateOfNoWindowFailsTheReceive) {
  ASSERT_TRUE(up());
  ASSERT_EQ(post_recv(rwr(5, {sge(0x10000, 64)})), 0);
  auto inv = pkt(op::kRcSendOnlyInv, kRqPsn, true);
  inv.ieth_rkey = mr_->rkey();  // an MR: not invalidatable
  inject(inv, pattern(16, 8));
  poll(1 * kUs);
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.aeth_syndrome, kNakInvReq);
  auto wc = rcq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 5u, IBV_WC_REM_INV_REQ_ERR, IBV_WC_RECV);
  EXPECT_EQ(ctr(ECtr::rx_invalidate_rkey), 1u);
}

// ===========================================================================
// PSN wrap-around
// ===========================================================================

TEST_F(TransportTrace, RequesterPsnWrapsAt2To24) {
  ASSERT_TRUE(up(IBV_QPT_RC, {}, 0xfffffe));
  put(0, pattern(4000, 0x13));
  // Post: SEND 4000 bytes = 4 packets from PSN 0xfffffe.
  ASSERT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 4000)})), 0);
  poll(0);
  auto p = sent();
  // Expect: PSNs fffffe, ffffff, 0, 1.
  ASSERT_EQ(p.size(), 4u) << dump(p);
  EXPECT_EQ(p[0].f.psn, 0xfffffeu);
  EXPECT_EQ(p[1].f.psn, 0xffffffu);
  EXPECT_EQ(p[2].f.psn, 0u);
  EXPECT_EQ(p[3].f.psn, 1u);
  EXPECT_EQ(p[0].f.opcode, op::kRcSendFirst);
  EXPECT_EQ(p[2].f.opcode, op::kRcSendMiddle);
  EXPECT_EQ(p[3].f.opcode, op::kRcSendLast);
  EXPECT_EQ(p[3].payload, bytes(3072, 928));
  // Peer: ACK 0 (partial: neither a ghost nor a duplicate).
  inject(ack(0, 0));
  poll(5 * kUs);
  EXPECT_TRUE(cq_poll().empty());
  EXPECT_EQ(ctr(ECtr::rx_ghost_ack), 0u);
  EXPECT_EQ(ctr(ECtr::rx_dup), 0u);
  // Peer: ACK 1. Expect: the SEND completes.
  inject(ack(1, 1));
  poll(6 * kUs);
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_SEND);
  EXPECT_EQ(wc[0].byte_len, 4000u);
}

TEST_F(TransportTrace, ResponderPsnWrapsAt2To24) {
  ASSERT_TRUE(up(IBV_QPT_RC, {}, kSqPsn, 0xffffff));
  // Peer: WRITE_ONLY at 0xffffff, then at 0.
  inject(write_req(op::kRcWriteOnly, 0xffffff, true, addr(0x30000), 16),
         pattern(16, 1));
  poll(1 * kUs);
  auto p = sent();
  // Expect: ACK 0xffffff MSN 1.
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.aeth_syndrome, kAck);
  EXPECT_EQ(p[0].f.psn, 0xffffffu);
  EXPECT_EQ(p[0].f.aeth_msn, 1u);
  inject(write_req(op::kRcWriteOnly, 0, true, addr(0x30100), 16),
         pattern(16, 2));
  poll(2 * kUs);
  p = sent();
  // Expect: ACK 0 MSN 2; both writes landed.
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.aeth_syndrome, kAck);
  EXPECT_EQ(p[0].f.psn, 0u);
  EXPECT_EQ(p[0].f.aeth_msn, 2u);
  EXPECT_EQ(bytes(0x30000, 16), pattern(16, 1));
  EXPECT_EQ(bytes(0x30100, 16), pattern(16, 2));
}

// ===========================================================================
// UD
// ===========================================================================

TEST_F(TransportTrace, UdSendCarriesDethAndQkey) {
  ASSERT_TRUE(up(IBV_QPT_UD));
  Ah* ah = nullptr;
  ASSERT_EQ(dev_->create_ah(pd_, peer_ah_attr(), &ah), 0);
  put(0, pattern(100, 0x17));
  // Post: SEND 100 bytes to QP 0x77, Q_Key 0x22222222.
  SendWr w = wr(1, IBV_WR_SEND, {sge(0, 100)});
  w.ah = ah;
  w.remote_qpn = 0x77;
  w.remote_qkey = 0x22222222;
  ASSERT_EQ(post(w), 0);
  // Post: SEND with remote_qkey high bit set: the QP's own Q_Key.
  SendWr w2 = w;
  w2.wr_id = 2;
  w2.remote_qkey = 0x80000000;
  ASSERT_EQ(post(w2), 0);
  poll(0);
  auto p = sent();
  // Expect: UD_SEND_ONLY to QP 0x77 with DETH(qkey, our QPN), the bytes.
  ASSERT_EQ(p.size(), 2u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kUdSendOnly);
  EXPECT_EQ(p[0].f.dqpn, 0x77u);
  EXPECT_EQ(p[0].f.deth_qkey, 0x22222222u);
  EXPECT_EQ(p[0].f.deth_src_qp, qp_->qpn());
  EXPECT_EQ(p[0].payload, bytes(0, 100));
  EXPECT_FALSE(p[0].f.ack_req);
  EXPECT_EQ(p[1].f.deth_qkey, 0x11111111u);  // QpOpts::qkey
  // Expect: both complete once sent (no ACK in UD).
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_SEND);
  EXPECT_EQ(wc[0].byte_len, 100u);
  EXPECT_WC(wc[1], 2u, IBV_WC_SUCCESS, IBV_WC_SEND);
}

TEST_F(TransportTrace, UdReceiveStartsWithGrhAndReportsSrcQp) {
  ASSERT_TRUE(up(IBV_QPT_UD));
  std::memset(at(0x10000), 0xaa, 1000);
  ASSERT_EQ(post_recv(rwr(3, {sge(0x10000, 1000)})), 0);
  // Peer: UD_SEND_ONLY from QP 0x55 with our Q_Key, 100 bytes.
  const auto data = pattern(100, 0x27);
  auto f = pkt(op::kUdSendOnly, 0x42);
  f.deth_qkey = 0x11111111;
  f.deth_src_qp = 0x55;
  inject(f, data);
  poll(1 * kUs);
  // Expect: no reply; IBV_WC_RECV, byte_len 140, GRH flag, src_qp 0x55.
  EXPECT_TRUE(sent().empty());
  auto wc = rcq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 3u, IBV_WC_SUCCESS, IBV_WC_RECV);
  EXPECT_EQ(wc[0].byte_len, 100u + kGrhSize);
  EXPECT_TRUE(wc[0].wc_flags & IBV_WC_GRH);
  EXPECT_EQ(wc[0].src_qp, 0x55u);
  EXPECT_EQ(wc[0].qp_num, qp_->qpn());
  // Expect: buffer = 20 zero bytes, the received IPv4 header, the payload.
  EXPECT_EQ(bytes(0x10000, 20), std::vector<uint8_t>(20, 0));
  EXPECT_EQ(bytes(0x10000 + 20, 20), slice(last_frame_, last_fi_.l3_off, 20));
  EXPECT_EQ(bytes(0x10000 + 40, 100), data);
}

TEST_F(TransportTrace, UdWrongQkeyIsDroppedAndCounted) {
  ASSERT_TRUE(up(IBV_QPT_UD));
  ASSERT_EQ(post_recv(rwr(3, {sge(0x10000, 1000)})), 0);
  // Peer: UD_SEND_ONLY with Q_Key 0x99999999 (ours is 0x11111111).
  auto f = pkt(op::kUdSendOnly, 1);
  f.deth_qkey = 0x99999999;
  f.deth_src_qp = 0x55;
  inject(f, pattern(10, 1));
  poll(1 * kUs);
  // Expect: dropped, counted rx_bad_qkey; the RECV stays posted.
  EXPECT_TRUE(rcq_poll().empty());
  EXPECT_EQ(ctr(ECtr::rx_bad_qkey), 1u);
  f.deth_qkey = 0x11111111;
  inject(f, pattern(10, 1));
  poll(2 * kUs);
  auto wc = rcq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 3u, IBV_WC_SUCCESS, IBV_WC_RECV);
  EXPECT_EQ(wc[0].byte_len, 10u + kGrhSize);
}

// Multicast (ibv_attach_mcast): UD QPs only, multicast GIDs only; attaching
// twice is one attachment; detaching what is not attached is refused.
TEST_F(TransportTrace, McastAttachTakesUdQpsAndGroupsOnly) {
  uint8_t group[16], unicast[16];
  wire::gid_from_ipv4(kGroupIp, group);
  wire::gid_from_ipv4(kPeerIp, unicast);
  Qp* rc = create_qp(IBV_QPT_RC);
  const char* why = nullptr;
  EXPECT_EQ(engine_->attach_mcast(rc, group, &why), EINVAL);
  EXPECT_NE(why, nullptr);
  ASSERT_TRUE(up(IBV_QPT_UD));
  why = nullptr;
  EXPECT_EQ(engine_->attach_mcast(qp_, unicast, &why), EINVAL);
  EXPECT_NE(why, nullptr);
  EXPECT_EQ(engine_->attach_mcast(qp_, group), 0);
  EXPECT_EQ(engine_->attach_mcast(qp_, group), 0);
  EXPECT_EQ(dev_->mcast_groups(), 1u);
  EXPECT_EQ(dev_->mcast_attached(), 1u);
  EXPECT_EQ(qp_->mcast_, 1u);
  EXPECT_TRUE(engine_->mcast_member(group));
  EXPECT_TRUE(dev_->mcast_group(group));
  EXPECT_EQ(engine_->detach_mcast(qp_, group), 0);
  EXPECT_EQ(engine_->detach_mcast(qp_, group), EINVAL);
  EXPECT_EQ(dev_->mcast_groups(), 0u);
  EXPECT_EQ(dev_->mcast_attached(), 0u);
  EXPECT_FALSE(engine_->mcast_member(group));
  EXPECT_FALSE(dev_->mcast_group(group));
}

// A UD SEND to a group (DQPN 0xFFFFFF) reaches every member in a state that
// receives, each with its own copy and completion, the GRH area holding the
// group as destination; a member with another Q_Key drops it (counted), a
// QP that detached gets nothing.
TEST_F(TransportTrace, McastSendReachesEveryMember) {
  uint8_t group[16];
  wire::gid_from_ipv4(kGroupIp, group);
  ASSERT_TRUE(up(IBV_QPT_UD));
  Qp* a = qp_;
  Qp* b = up(IBV_QPT_UD);
  QpOpts other;
  other.qkey = 0x22222222;
  Qp* c = up(IBV_QPT_UD, other);
  Qp* gone = up(IBV_QPT_UD);
  ASSERT_TRUE(a && b && c && gone);
  for (Qp* q : {a, b, c, gone}) ASSERT_EQ(engine_->attach_mcast(q, group), 0);
  ASSERT_EQ(engine_->detach_mcast(gone, group), 0);
  ASSERT_EQ(engine_->post_recv(a, rwr(1, {sge(0x10000, 1000)})), 0);
  ASSERT_EQ(engine_->post_recv(b, rwr(2, {sge(0x20000, 1000)})), 0);
  ASSERT_EQ(engine_->post_recv(c, rwr(3, {sge(0x30000, 1000)})), 0);
  ASSERT_EQ(engine_->post_recv(gone, rwr(4, {sge(0x40000, 1000)})), 0);
  const auto data = pattern(100, 0x31);
  auto f = pkt(op::kUdSendOnly, 7);
  f.dqpn = wire::kMulticastQpn;
  f.deth_qkey = 0x11111111;
  f.deth_src_qp = 0x55;
  inject_to_ = kGroupIp;
  inject(f, data);
  poll(1 * kUs);
  auto wc = rcq_poll();
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_RECV);
  EXPECT_EQ(wc[0].qp_num, a->qpn());
  EXPECT_WC(wc[1], 2u, IBV_WC_SUCCESS, IBV_WC_RECV);
  EXPECT_EQ(wc[1].qp_num, b->qpn());
  for (const ibv_wc& w : wc) {
    EXPECT_EQ(w.byte_len, 100u + kGrhSize);
    EXPECT_EQ(w.src_qp, 0x55u);
    EXPECT_TRUE(w.wc_flags & IBV_WC_GRH);
  }
  for (uint64_t off : {0x10000, 0x20000}) {
    // The IPv4 header in the GRH area: destination 239.1.1.1.
    EXPECT_EQ(bytes(off + 20 + 16, 4), (std::vector<uint8_t>{239, 1, 1, 1}));
    EXPECT_EQ(bytes(off + 40, 100), data);
  }
  EXPECT_EQ(ctr(ECtr::rx_mcast), 1u);
  EXPECT_EQ(ctr(ECtr::rx_mcast_copies), 3u);
  EXPECT_EQ(ctr(ECtr::rx_bad_qkey), 1u);
  EXPECT_EQ(ctr(ECtr::rx_no_qp), 0u);
  EXPECT_TRUE(sent().empty());
  // A group nobody here joined: nothing delivered, nothing else counted.
  inject_to_ = kGroupIp + 1;
  inject(f, data);
  poll(2 * kUs);
  EXPECT_TRUE(rcq_poll().empty());
  EXPECT_EQ(ctr(ECtr::rx_mcast), 1u);
}

// To a group: the AH needs no neighbour (the group's MAC, RFC 1112 6.4),
// and the frame goes to 01:00:5e:01:01:01, 239.1.1.1, DQPN 0xFFFFFF. It
// is looped back to the device's own members only when there are some and
// the sender was not created with IBV_QP_CREATE_BLOCK_SELF_MCAST_LB.
TEST_F(TransportTrace, McastSendGoesToTheGroupsMac) {
  ASSERT_TRUE(up(IBV_QPT_UD));
  ibv_ah_attr attr = peer_ah_attr();
  wire::gid_from_ipv4(kGroupIp, attr.grh.dgid.raw);  // TestResolver: unknown
  Ah* ah = nullptr;
  ASSERT_EQ(dev_->create_ah(pd_, attr, &ah), 0);
  put(0, pattern(64, 0x44));
  SendWr w = wr(1, IBV_WR_SEND, {sge(0, 64)});
  w.ah = ah;
  w.remote_qpn = wire::kMulticastQpn;
  w.remote_qkey = 0x11111111;
  ASSERT_EQ(post(w), 0);
  poll(0);
  ASSERT_EQ(io_.frames.size(), 1u);
  const std::vector<uint8_t>& b = io_.frames[0];
  wire::FrameInfo fi;
  wire::decode(b.data(), static_cast<uint32_t>(b.size()), fi);
  ASSERT_EQ(fi.kind, wire::FrameKind::kRoce);
  const wire::MacAddr group_mac{{0x01, 0x00, 0x5e, 0x01, 0x01, 0x01}};
  EXPECT_EQ(fi.roce.dst_mac, group_mac);
  EXPECT_EQ(wire::gid_to_ipv4(fi.roce.dgid), kGroupIp);
  EXPECT_EQ(fi.roce.dqpn, wire::kMulticastQpn);
  EXPECT_EQ(fi.roce.opcode, op::kUdSendOnly);
  EXPECT_FALSE(io_.loop_to_members.at(0));  // no member here
  io_.frames.clear();
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_SEND);
  uint8_t group[16];
  wire::gid_from_ipv4(kGroupIp, group);
  ASSERT_EQ(engine_->attach_mcast(qp_, group), 0);
  ASSERT_EQ(post(w), 0);
  poll(1 * kUs);
  ASSERT_EQ(io_.frames.size(), 1u);
  EXPECT_TRUE(io_.loop_to_members.at(1));  // the sender itself is one
  io_.frames.clear();
  // A QP created with IBV_QP_CREATE_BLOCK_SELF_MCAST_LB: to the wire only.
  QpInitAttr a;
  a.qp_type = IBV_QPT_UD;
  a.pd = pd_;
  a.send_cq = scq_;
  a.recv_cq = rcq_;
  a.cap.max_send_wr = a.cap.max_recv_wr = 4;
  a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  a.block_self_mcast_lb = true;
  Qp* quiet = nullptr;
  ASSERT_EQ(engine_->create_qp(a, &quiet), 0);
  ASSERT_EQ(bring_up(quiet, IBV_QPT_UD, 0, kSqPsn, kRqPsn, IBV_MTU_1024), 0);
  ASSERT_EQ(engine_->post_send(quiet, w), 0);
  poll(2 * kUs);
  ASSERT_EQ(io_.frames.size(), 1u);
  EXPECT_FALSE(io_.loop_to_members.at(2));
}

// The device's limits hold (max_mcast_qp_attach members in one group), and
// a QP destroyed while attached leaves its groups.
TEST_F(TransportTrace, McastLimitsAndDestroyLeavesGroups) {
  uint8_t group[16], second[16];
  wire::gid_from_ipv4(kGroupIp, group);
  wire::gid_from_ipv4(kGroupIp + 1, second);
  const uint32_t max = dev_->limits().max_mcast_qp_attach;
  std::vector<Qp*> qps;
  for (uint32_t i = 0; i <= max; ++i) qps.push_back(create_qp(IBV_QPT_UD));
  for (uint32_t i = 0; i < max; ++i)
    ASSERT_EQ(engine_->attach_mcast(qps[i], group), 0) << i;
  const char* why = nullptr;
  EXPECT_EQ(engine_->attach_mcast(qps[max], group, &why), ENOMEM);
  EXPECT_NE(why, nullptr);
  EXPECT_EQ(engine_->attach_mcast(qps[max], second), 0);
  EXPECT_EQ(engine_->attach_mcast(qps[0], second), 0);
  EXPECT_EQ(dev_->mcast_attached(), max + 2);
  EXPECT_EQ(dev_->mcast_groups(), 2u);
  for (Qp* q : qps) ASSERT_EQ(engine_->destroy_qp(q), 0);
  EXPECT_EQ(dev_->mcast_attached(), 0u);
  EXPECT_EQ(dev_->mcast_groups(), 0u);
  EXPECT_FALSE(engine_->mcast_member(group));
  EXPECT_FALSE(engine_->mcast_member(second));
}

// C10-93.1.1: a UD message longer than the port MTU emits no packet and
// no error (rxe fakes its send); the next one goes as usual. A WRITE on UD
// is still refused at post.
TEST_F(TransportTrace, UdSendLongerThanPortMtuSendsNothingAndCompletes) {
  ASSERT_TRUE(up(IBV_QPT_UD));
  Ah* ah = nullptr;
  ASSERT_EQ(dev_->create_ah(pd_, peer_ah_attr(), &ah), 0);
  const uint32_t port_mtu = mtu_bytes(dev_->config().active_mtu);
  SendWr w = wr(1, IBV_WR_SEND, {sge(0, port_mtu + 1)});
  w.ah = ah;
  w.remote_qpn = 0x77;
  w.remote_qkey = 1;
  ASSERT_EQ(post(w), 0);
  SendWr ok = wr(2, IBV_WR_SEND, {sge(0, 64)});
  ok.ah = ah;
  ok.remote_qpn = 0x77;
  ok.remote_qkey = 1;
  ASSERT_EQ(post(ok), 0);
  poll(1 * kUs);
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.payload_len, 64u);
  auto wc = cq_poll(scq_);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_SEND);
  EXPECT_WC(wc[1], 2u, IBV_WC_SUCCESS, IBV_WC_SEND);
  EXPECT_EQ(ctr(ECtr::ud_too_long), 1u);
  w.opcode = IBV_WR_RDMA_WRITE;
  w.sg_list[0].length = 8;
  EXPECT_EQ(post(w), EINVAL);
}

// A UD send takes its AH's address at post, as a NIC that writes the
// address vector into the WQE does (mlx5): the AH destroyed after the post
// and its slot reused at once by an AH to another address, the send still
// goes where it was posted to, and the new AH's sends where they are.
TEST_F(TransportTrace, UdSendKeepsTheAddressOfAnAhDestroyedAfterThePost) {
  ASSERT_TRUE(up(IBV_QPT_UD));
  Ah* ah = nullptr;
  ASSERT_EQ(dev_->create_ah(pd_, peer_ah_attr(), &ah), 0);
  SendWr w = wr(1, IBV_WR_SEND, {sge(0, 64)});
  w.ah = ah;
  w.remote_qpn = 0x77;
  w.remote_qkey = 1;
  ASSERT_EQ(post(w), 0);
  ASSERT_EQ(dev_->destroy_ah(ah), 0);
  ibv_ah_attr other = peer_ah_attr();
  other.grh.hop_limit = 7;
  other.grh.traffic_class = 0x20;
  Ah* again = nullptr;
  ASSERT_EQ(dev_->create_ah(pd_, other, &again), 0);
  ASSERT_EQ(again, ah);  // the same slot, as the test means it
  SendWr w2 = w;
  w2.wr_id = 2;
  w2.ah = again;
  ASSERT_EQ(post(w2), 0);
  poll(1 * kUs);
  auto p = sent();
  ASSERT_EQ(p.size(), 2u) << dump(p);
  EXPECT_EQ(p[0].f.ttl, 64u);
  EXPECT_EQ(p[0].f.tclass >> 2, 0u);
  EXPECT_EQ(p[1].f.ttl, 7u);
  EXPECT_EQ(p[1].f.tclass >> 2, 0x20u >> 2);
  auto wc = cq_poll(scq_);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_SEND);
  EXPECT_WC(wc[1], 2u, IBV_WC_SUCCESS, IBV_WC_SEND);
  EXPECT_EQ(qp_->state(), IBV_QPS_RTS);
  EXPECT_EQ(ctr(ECtr::local_errors), 0u);
}

// ===========================================================================
// UC
// ===========================================================================

TEST_F(TransportTrace, UcLostMiddleDropsMessageNextIsReceived) {
  ASSERT_TRUE(up(IBV_QPT_UC));
  ASSERT_EQ(post_recv(rwr(1, {sge(0x10000, 4096)})), 0);
  ASSERT_EQ(post_recv(rwr(2, {sge(0x20000, 4096)})), 0);
  // Peer: UC SEND_FIRST R, (MIDDLE R+1 lost), SEND_LAST R+2.
  inject(pkt(op::kUcBase + op::kRcSendFirst, kRqPsn), pattern(1024, 1));
  inject(pkt(op::kUcBase + op::kRcSendLast, kRqPsn + 2), pattern(100, 2));
  poll(1 * kUs);
  // Expect: message dropped: no CQE, nothing sent (no ACK/NAK in UC).
  EXPECT_TRUE(rcq_poll().empty());
  EXPECT_TRUE(sent().empty());
  EXPECT_GE(ctr(ECtr::rx_uc_dropped), 1u);
  // Peer: UC SEND_ONLY R+3 (300 bytes).
  const auto m = pattern(300, 3);
  inject(pkt(op::kUcBase + op::kRcSendOnly, kRqPsn + 3), m);
  poll(2 * kUs);
  // Expect: received into the first RECV (the dropped message did not
  // consume it), 300 bytes.
  auto wc = rcq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_RECV);
  EXPECT_EQ(wc[0].byte_len, 300u);
  EXPECT_EQ(bytes(0x10000, 300), m);
  // Peer: a two-packet message R+4, R+5. Expect: wr 2, 1124 bytes.
  inject(pkt(op::kUcBase + op::kRcSendFirst, kRqPsn + 4), pattern(1024, 4));
  inject(pkt(op::kUcBase + op::kRcSendLast, kRqPsn + 5), pattern(100, 5));
  poll(3 * kUs);
  wc = rcq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 2u, IBV_WC_SUCCESS, IBV_WC_RECV);
  EXPECT_EQ(wc[0].byte_len, 1124u);
  EXPECT_EQ(bytes(0x20000 + 1024, 100), pattern(100, 5));
  EXPECT_TRUE(sent().empty());
}

TEST_F(TransportTrace, UcRequesterCompletesWhenSent) {
  ASSERT_TRUE(up(IBV_QPT_UC));
  ASSERT_EQ(post(rdma(1, IBV_WR_RDMA_WRITE, {sge(0, 2000)}, kPeerVa)), 0);
  poll(0);
  auto p = sent();
  // Expect: UC WRITE_FIRST (RETH), WRITE_LAST; completion without any ACK.
  ASSERT_EQ(p.size(), 2u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kUcBase + op::kRcWriteFirst);
  EXPECT_EQ(p[0].f.reth_len, 2000u);
  EXPECT_EQ(p[1].f.opcode, op::kUcBase + op::kRcWriteLast);
  EXPECT_EQ(p[1].f.psn, kSqPsn + 1);
  EXPECT_FALSE(p[1].f.ack_req);  // UC is never acknowledged
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(wc[0].byte_len, 2000u);
}

// ===========================================================================
// QP states and flush
// ===========================================================================

TEST_F(TransportTrace, ModifyToErrFlushesSendsAndRecvsInOrder) {
  ASSERT_TRUE(up());
  // Post: 3 SENDs (wr 2 unsignaled), 2 RECVs.
  ASSERT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 8)})), 0);
  ASSERT_EQ(post(wr(2, IBV_WR_SEND, {sge(0, 8)}, 0)), 0);
  ASSERT_EQ(post(wr(3, IBV_WR_SEND, {sge(0, 8)})), 0);
  ASSERT_EQ(post_recv(rwr(11, {sge(0x10000, 8)})), 0);
  ASSERT_EQ(post_recv(rwr(12, {sge(0x10000, 8)})), 0);
  poll(0);
  ASSERT_EQ(sent().size(), 3u);
  // modify_qp(ERR).
  ASSERT_EQ(to_error(qp_), 0);
  poll(1 * kUs);
  // Expect: 3 send FLUSH_ERRs (1, 2, 3) and 2 receive FLUSH_ERRs (11, 12).
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 3u);
  for (uint64_t i = 0; i < 3; ++i) {
    EXPECT_WC(wc[i], i + 1, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND);
    EXPECT_EQ(wc[i].qp_num, qp_->qpn());
  }
  auto rwc = rcq_poll();
  ASSERT_EQ(rwc.size(), 2u);
  EXPECT_WC(rwc[0], 11u, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV);
  EXPECT_WC(rwc[1], 12u, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV);
  EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
  EXPECT_TRUE(sent().empty());
}

TEST_F(TransportTrace, ErrFlushesRecvHeldByMessageInProgressFirst) {
  ASSERT_TRUE(up());
  ASSERT_EQ(post_recv(rwr(1, {sge(0x10000, 4096)})), 0);
  ASSERT_EQ(post_recv(rwr(2, {sge(0x20000, 4096)})), 0);
  // Peer: SEND_FIRST only: RECV wr 1 is now held by the message.
  inject(pkt(op::kRcSendFirst, kRqPsn), pattern(1024, 1));
  poll(1 * kUs);
  EXPECT_TRUE(rcq_poll().empty());
  // modify_qp(ERR). Expect: wr 1 (held) then wr 2, both FLUSH_ERR.
  ASSERT_EQ(to_error(qp_), 0);
  poll(2 * kUs);
  auto rwc = rcq_poll();
  ASSERT_EQ(rwc.size(), 2u);
  EXPECT_WC(rwc[0], 1u, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV);
  EXPECT_WC(rwc[1], 2u, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV);
}

TEST_F(TransportTrace, PostInErrCompletesWithFlushErr) {
  ASSERT_TRUE(up());
  ASSERT_EQ(to_error(qp_), 0);
  // Post in ERR: accepted, completes FLUSH_ERR, nothing sent.
  ASSERT_EQ(post(wr(4, IBV_WR_SEND, {sge(0, 8)})), 0);
  ASSERT_EQ(post_recv(rwr(13, {sge(0x10000, 8)})), 0);
  poll(1 * kUs);
  EXPECT_TRUE(sent().empty());
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 4u, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND);
  auto rwc = rcq_poll();
  ASSERT_EQ(rwc.size(), 1u);
  EXPECT_WC(rwc[0], 13u, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV);
}

TEST_F(TransportTrace, PostSendBeforeRtsIsEinval) {
  // RESET.
  qp_ = create_qp(IBV_QPT_RC);
  ASSERT_TRUE(qp_);
  EXPECT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 8)})), EINVAL);
  EXPECT_EQ(post_recv(rwr(1, {sge(0x10000, 8)})), EINVAL);
  // INIT.
  QpOpts o;
  o.until = IBV_QPS_INIT;
  ASSERT_EQ(
      bring_up(qp_, IBV_QPT_RC, kPeerQpn, kSqPsn, kRqPsn, IBV_MTU_1024, o), 0);
  EXPECT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 8)})), EINVAL);
  EXPECT_EQ(post_recv(rwr(1, {sge(0x10000, 8)})), 0);
  // RTR.
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.ah_attr = peer_ah_attr();
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = kPeerQpn;
  a.rq_psn = kRqPsn;
  a.max_dest_rd_atomic = 4;
  a.min_rnr_timer = 12;
  ASSERT_EQ(
      engine_->modify_qp(qp_, a,
                         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                             IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
      0);
  EXPECT_EQ(qp_->state(), IBV_QPS_RTR);
  EXPECT_EQ(post(wr(1, IBV_WR_SEND, {sge(0, 8)})), EINVAL);
  poll(0);
  EXPECT_TRUE(sent().empty());
  EXPECT_TRUE(cq_poll().empty());
  // RTR runs the responder: a SEND is received and ACKed.
  inject(pkt(op::kRcSendOnly, kRqPsn, true), pattern(8, 1));
  poll(1 * kUs);
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.aeth_syndrome, kAck);
  EXPECT_EQ(rcq_poll().size(), 1u);
}

// ===========================================================================
// CQ overflow
// ===========================================================================

TEST_F(TransportTrace, CqOverflowIsAnErrorWithAsyncEvent) {
  Cq* small = nullptr;
  ASSERT_EQ(dev_->create_cq(1, &small), 0);
  const uint32_t cap = small->capacity();
  ASSERT_GE(cap, 1u);
  ASSERT_LE(cap, 1000u);
  QpOpts o;
  o.send_cq = small;
  o.max_send_wr = cap + 1;
  ASSERT_TRUE(up(IBV_QPT_RC, o));
  // Post: cap+1 signaled SENDs; the peer ACKs them all.
  for (uint32_t i = 0; i <= cap; ++i)
    ASSERT_EQ(post(wr(i + 1, IBV_WR_SEND, {sge(0, 8)})), 0);
  poll(0);
  ASSERT_EQ(sent().size(), cap + 1);
  inject(ack(kSqPsn + cap, cap + 1));
  poll(5 * kUs);
  // Expect: the CQ is in error with an overflow counted, and an
  // IBV_EVENT_CQ_ERR for it is queued; the QP went to ERR.
  EXPECT_TRUE(small->in_error());
  EXPECT_GE(small->overflows(), 1u);
  EXPECT_GE(ctr(ECtr::cq_overflows), 1u);
  bool got_event = false;
  for (AsyncEvent ev; dev_->next_event(&ev);)
    if (ev.type == IBV_EVENT_CQ_ERR && ev.cq == small) got_event = true;
  EXPECT_TRUE(got_event);
  EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
}

// ===========================================================================
// Ordering: fence and READ/ATOMIC credits
// ===========================================================================

TEST_F(TransportTrace, FencedWriteWaitsForEarlierRead) {
  ASSERT_TRUE(up());
  // Post: READ 100 (wr 1), WRITE with IBV_SEND_FENCE (wr 2).
  ASSERT_EQ(post(rdma(1, IBV_WR_RDMA_READ, {sge(0x20000, 100)}, kPeerVa)), 0);
  ASSERT_EQ(post(rdma(2, IBV_WR_RDMA_WRITE, {sge(0, 64)}, kPeerVa + 0x1000,
                      kPeerRkey, IBV_SEND_SIGNALED | IBV_SEND_FENCE)),
            0);
  poll(0);
  auto p = sent();
  // Expect: only the READ_REQUEST P.
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcReadRequest);
  poll(50 * kUs);
  p = sent();
  EXPECT_TRUE(p.empty()) << dump(p);
  // Peer: READ_RESPONSE_ONLY P.
  inject(read_resp(op::kRcReadRespOnly, kSqPsn, 1), pattern(100, 9));
  poll(60 * kUs);
  // Expect: READ completes, then WRITE_ONLY P+1 goes out.
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_RDMA_READ);
  EXPECT_EQ(wc[0].byte_len, 100u);
  p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcWriteOnly);
  EXPECT_EQ(p[0].f.psn, kSqPsn + 1);
  EXPECT_EQ(p[0].f.reth_va, kPeerVa + 0x1000);
}

// A READ larger than the window is asked for in several requests, each a
// READ of its own extent with its own credit: what a lost response costs
// (the rest of its request, and what was in flight behind it) is bounded
// by the window, not by the READ. One 4 MiB READ at 1 % loss otherwise had
// 92 % of its responses sent again (perf/README.md, "Large READs on a
// lossy port").
class ReadPieces : public TransportTrace {
 protected:
  static constexpr uint32_t kLocal = 0x40000;
  static constexpr uint32_t kPiece = 64;  // the window at first, in packets
  // The windows on (kPiece packets at first), the QP at RTS, READ wr 1 of
  // `len` bytes from kPeerVa (remote_) posted; its first request, which
  // asks for the window, not for the READ.
  void start(uint32_t len, uint8_t seed) {
    EngineConfig ec;
    ec.cc.init_window = kPiece;
    use_engine(ec);
    ASSERT_TRUE(up());
    len_ = len;
    remote_ = pattern(len, seed);
    ASSERT_EQ(post(rdma(1, IBV_WR_RDMA_READ, {sge(kLocal, len)}, kPeerVa)), 0);
    poll(0);
    first_ = sent();
    ASSERT_EQ(first_.size(), 1u) << dump(first_);
    EXPECT_EQ(first_[0].f.opcode, op::kRcReadRequest);
    EXPECT_EQ(first_[0].f.psn, kSqPsn);
    EXPECT_EQ(first_[0].f.reth_va, kPeerVa);
    EXPECT_EQ(first_[0].f.reth_len, kPiece * 1024);
    EXPECT_TRUE(first_[0].f.ack_req);
  }
  // The responses to READ request `req`, as a responder sends them: FIRST
  // (or ONLY) at its PSN, LAST at its end; the `lose`th is not injected.
  void answer(const Pkt& req, uint32_t lose = UINT32_MAX) {
    const uint32_t n = (req.f.reth_len + 1023) / 1024;
    const uint32_t off = static_cast<uint32_t>(req.f.reth_va - kPeerVa);
    for (uint32_t i = 0; i < n; ++i) {
      const uint8_t opc = n == 1       ? op::kRcReadRespOnly
                          : i == 0     ? op::kRcReadRespFirst
                          : i == n - 1 ? op::kRcReadRespLast
                                       : op::kRcReadRespMiddle;
      if (i == lose) continue;
      const uint32_t len = std::min(1024u, req.f.reth_len - i * 1024);
      inject(read_resp(opc, req.f.psn + i, ++msn_),
             slice(remote_, off + i * 1024, len));
    }
  }
  // Answers the requests in `p` and every one they let go, 10 us apart
  // from `t`, until wr 1 completes; checks it and its data. Returns the
  // requests answered.
  std::vector<Pkt> answer_until_done(std::vector<Pkt> p, uint64_t t) {
    std::vector<Pkt> asked;
    std::vector<ibv_wc> wc;
    for (int round = 0; round < 10 && wc.empty(); ++round) {
      for (const Pkt& r : p) {
        EXPECT_EQ(r.f.opcode, op::kRcReadRequest) << dump(p);
        answer(r);
        asked.push_back(r);
      }
      t += 10 * kUs;
      poll(t);
      p = sent();
      wc = cq_poll();
    }
    EXPECT_EQ(wc.size(), 1u);
    if (!wc.empty()) {
      EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_RDMA_READ);
      EXPECT_EQ(wc[0].byte_len, len_);
    }
    EXPECT_EQ(bytes(kLocal, len_), remote_);
    return asked;
  }
  uint32_t len_ = 0;
  std::vector<uint8_t> remote_;
  std::vector<Pkt> first_;
  uint32_t msn_ = 0;
};

TEST_F(ReadPieces, ReadLargerThanTheWindowIsAskedForInPieces) {
  ASSERT_NO_FATAL_FAILURE(start(3 * kPiece * 1024, 0x61));
  const auto asked = answer_until_done(first_, 0);
  // Each answered request let the next go, from where the last ended.
  uint32_t next = kSqPsn;
  for (const Pkt& r : asked) {
    EXPECT_EQ(r.f.psn, next);
    EXPECT_EQ(r.f.reth_va, kPeerVa + (r.f.psn - kSqPsn) * 1024ull);
    EXPECT_EQ(r.f.reth_len % 1024, 0u);
    next += r.f.reth_len / 1024;
  }
  EXPECT_EQ(next, kSqPsn + 3 * kPiece);
  EXPECT_GE(asked.size(), 2u);
  EXPECT_EQ(ctr(ECtr::retransmits), 0u);
  // The credits are back, and the next request uses the next PSN.
  EXPECT_EQ(qp_->req_.rd_atomic, 0u);
  ASSERT_EQ(post(wr(2, IBV_WR_SEND, {sge(0, 8)})), 0);
  poll(200 * kUs);
  const auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.psn, kSqPsn + 3 * kPiece);
}

// A gap in one request's responses asks again for the rest of that request
// only (the extent the responder holds for it), never past its end.
TEST_F(ReadPieces, ALostResponseIsAskedAgainWithinItsRequest) {
  ASSERT_NO_FATAL_FAILURE(start(2 * kPiece * 1024, 0x62));
  // Response P+10 is lost; P+11.. arrive out of sequence.
  answer(first_[0], 10);
  poll(10 * kUs);
  const auto p = sent();
  // Asked again: P+10 to the request's end, not the READ's.
  ASSERT_FALSE(p.empty());
  EXPECT_EQ(p[0].f.opcode, op::kRcReadRequest);
  EXPECT_EQ(p[0].f.psn, kSqPsn + 10);
  EXPECT_EQ(p[0].f.reth_va, kPeerVa + 10 * 1024);
  EXPECT_EQ(p[0].f.reth_len, (kPiece - 10) * 1024);
  // P+11 to the request's end out of sequence, one go-back for them.
  EXPECT_EQ(ctr(ECtr::rx_out_of_seq), kPiece - 11);
  EXPECT_EQ(ctr(ECtr::retransmits), 1u);
  answer_until_done(p, 10 * kUs);
}

// A sequence NAK at a request boundary inside a READ (the responder lost
// the next request) acknowledges the requests before it, but not their
// responses: one still missing is asked for again, never skipped. (Taking
// the NAK's PSN as the oldest unacknowledged left a hole in the READ's
// data, which test_transport_sim's reference model caught.)
TEST_F(ReadPieces, NakAtARequestBoundaryAsksForTheMissingResponse) {
  ASSERT_NO_FATAL_FAILURE(start(2 * kPiece * 1024, 0x63));
  // All responses but the request's last (B-1) arrive; the second request
  // (from B) goes.
  const uint32_t b = kSqPsn + kPiece;
  answer(first_[0], kPiece - 1);
  poll(10 * kUs);
  auto p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.psn, b);
  // The responder lost it: NAK (PSN sequence error) for B.
  inject(nak(b, kNakSeq));
  poll(20 * kUs);
  p = sent();
  // B-1 asked for again (its own request's rest: 1 KiB); the window, cut
  // by the loss, has the second request wait for its answer.
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.psn, b - 1);
  EXPECT_EQ(p[0].f.reth_va, kPeerVa + (kPiece - 1) * 1024);
  EXPECT_EQ(p[0].f.reth_len, 1024u);
  EXPECT_EQ(ctr(ECtr::cc_window_cuts), 1u);
  // Then the second request again, as first sent.
  const auto asked = answer_until_done(p, 20 * kUs);
  ASSERT_EQ(asked.size(), 2u) << dump(asked);
  EXPECT_EQ(asked[1].f.psn, b);
  EXPECT_EQ(asked[1].f.reth_va, kPeerVa + kPiece * 1024);
  EXPECT_EQ(asked[1].f.reth_len, kPiece * 1024);
}

TEST_F(TransportTrace, MaxRdAtomicOneSerializesReads) {
  QpOpts o;
  o.max_rd_atomic = 1;
  ASSERT_TRUE(up(IBV_QPT_RC, o));
  // Post: READ wr 1 and READ wr 2, 100 bytes each.
  ASSERT_EQ(post(rdma(1, IBV_WR_RDMA_READ, {sge(0x20000, 100)}, kPeerVa)), 0);
  ASSERT_EQ(post(rdma(2, IBV_WR_RDMA_READ, {sge(0x21000, 100)}, kPeerVa)), 0);
  poll(0);
  auto p = sent();
  // Expect: only the first READ_REQUEST (P).
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcReadRequest);
  EXPECT_EQ(p[0].f.psn, kSqPsn);
  // Peer: READ_RESPONSE_ONLY P.
  inject(read_resp(op::kRcReadRespOnly, kSqPsn, 1), pattern(100, 1));
  poll(10 * kUs);
  // Expect: wr 1 completes; READ_REQUEST P+1 goes out.
  auto wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 1u, IBV_WC_SUCCESS, IBV_WC_RDMA_READ);
  p = sent();
  ASSERT_EQ(p.size(), 1u) << dump(p);
  EXPECT_EQ(p[0].f.opcode, op::kRcReadRequest);
  EXPECT_EQ(p[0].f.psn, kSqPsn + 1);
  inject(read_resp(op::kRcReadRespOnly, kSqPsn + 1, 2), pattern(100, 2));
  poll(20 * kUs);
  wc = cq_poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_WC(wc[0], 2u, IBV_WC_SUCCESS, IBV_WC_RDMA_READ);
  EXPECT_EQ(bytes(0x20000, 100), pattern(100, 1));
  EXPECT_EQ(bytes(0x21000, 100), pattern(100, 2));
}

}  // namespace
}  // namespace urnic::transport
