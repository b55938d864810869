// libFuzzer target: the transport engine (dataplane/transport) on a live QP
// set, frames into it from a fake peer (issue 14, item 3). One Engine with
// an RC, a UC and a UD QP in RTS, one MR with every right and one with
// remote read only, receives and a few sends posted (WRITE, READ, SEND,
// CMP_SWP, FETCH_ADD, ATOMIC_WRITE on RC; SEND, WRITE on UC; SEND on UD),
// as tests/unit/test_transport_trace.cc sets it up. The input is then a
// little program, read with FuzzedDataProvider:
//   - packets "from the peer": mostly well-formed RoceFields (an opcode of
//     the QP's type from wire/opcode.h, PSN near the responder's ePSN or the
//     requester's outstanding window, rkeys mostly the MR's, va inside / at
//     the edge / outside, lengths around the MTU, AETH ACK / RNR / NAK
//     syndromes, read responses, atomic ACKs, CNPs, CE marks), encoded with
//     wire::encode_frame, decoded and handed to Engine::rx;
//   - such a frame with header / payload bytes overwritten and the ICRC
//     recomputed, or raw bytes (both decoded first: only kRoce reaches rx);
//   - poll(now + delta) with deltas around the ACK timeout, the RNR timer
//     and beyond, so timers fire;
//   - new post_send / post_recv, a QP to ERR, an ERR QP back through RESET
//     to RTS, the TX queue full or not.
// Checked after every operation (abort() when broken), besides what the
// sanitizers catch:
//   - every transmitted frame decodes as a valid RoCEv2 frame (ICRC);
//   - every CQE has a known status, comes from one of our QPs, on the CQ of
//     the queue it was posted to, with a wr_id posted there and not yet
//     completed; a successful receive's (IBV_WC_RECV) byte_len fits the
//     posted buffers;
//   - counters: completions == CQEs read + cq_overflows.
// At the end every QP goes to ERR: every signaled send and every receive
// still outstanding must have completed (unless a CQ overflowed).
// Seeds: none needed (an empty input already runs the set-up and the
// initial posts); libFuzzer grows the corpus at run time.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <unordered_map>
#include <vector>

#include "dataplane/transport/engine.h"
#include "dataplane/transport/psn.h"
#include "dataplane/wire/codec.h"

namespace {

using namespace urnic;
using namespace urnic::transport;
namespace op = wire::opcode;

constexpr wire::MacAddr kOurMac{{0x02, 0x00, 0x00, 0x00, 0x00, 0x01}};
constexpr wire::MacAddr kPeerMac{{0x02, 0x00, 0x00, 0x00, 0x00, 0x02}};
constexpr uint32_t kOurIp = 0x0a000001;
constexpr uint32_t kPeerIp = 0x0a000002;
constexpr uint32_t kGroupIp = 0xef000001;  // 239.0.0.1, the UD QP's group
constexpr uint32_t kPeerQpn[3] = {0x0abcde, 0x0abcdf, 0x0abce0};
constexpr uint64_t kPeerVa = 0x00007f0000001000;
constexpr uint32_t kPeerRkey = 0x00c0ffee;
constexpr uint32_t kQkey = 0x11111111;
constexpr uint32_t kMem1 = 32 * 1024;  // MR 1: every right
constexpr uint32_t kMem2 = 4 * 1024;   // MR 2: remote read only
constexpr uint32_t kFrameCap = 16384;
constexpr int kMaxOps = 3000;
constexpr unsigned kAllAccess =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
    IBV_ACCESS_REMOTE_ATOMIC;

// AETH syndromes (IBTA 9.3.5).
constexpr uint8_t kAckSyn = 0x1f;
constexpr uint8_t kRnrNak = 0x20;
constexpr uint8_t kNakSeq = 0x60;

constexpr uint64_t kRnrTableUs[32] = {
    655360, 10,    20,    30,     40,     60,     80,     120,
    160,    240,   320,   480,    640,    960,    1280,   1920,
    2560,   3840,  5120,  7680,   10240,  15360,  20480,  30720,
    40960,  61440, 81920, 122880, 163840, 245760, 327680, 491520};

[[noreturn]] void fail(const char* what, uint64_t a = 0, uint64_t b = 0) {
  std::fprintf(stderr, "fuzz_engine: invariant broken: %s (%llu, %llu)\n", what,
               static_cast<unsigned long long>(a),
               static_cast<unsigned long long>(b));
  std::abort();
}

class PeerResolver : public Resolver {
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
    if (room == 0) return false;
    if (room > 0) --room;
    const uint32_t len = f.frame_len();
    if (len > sizeof(buf)) fail("TX frame too long", len);
    if (f.copy_to(buf) != len) fail("TxFrame::copy_to length", len);
    wire::FrameInfo fi;
    wire::decode(buf, len, fi);
    if (fi.kind != wire::FrameKind::kRoce)
      fail("transmitted frame does not decode", static_cast<uint64_t>(fi.why));
    ++frames;
    return true;
  }
  uint8_t buf[kFrameCap];
  uint64_t frames = 0;
  int64_t room = -1;  // -1: unlimited
};

struct Posted {
  int qp;  // index into Fuzz::qps
  bool recv;
  bool signaled;
  uint32_t cap;  // receive: bytes the buffers hold
};

class Fuzz {
 public:
  explicit Fuzz(FuzzedDataProvider& in) : in_(in) {}

  void run() {
    setup();
    for (int n = 0; n < kMaxOps && in_.remaining_bytes() > 0; ++n) {
      step();
      after_op();
    }
    finish();
  }

 private:
  // --- set-up ---------------------------------------------------------------

  void setup() {
    mtu_enum_ = static_cast<ibv_mtu>(in_.ConsumeIntegralInRange<int>(1, 5));
    mtu_ = mtu_bytes(mtu_enum_);
    EngineConfig ec;
    ec.cc.window = in_.ConsumeBool();
    ec.cc.ecn = in_.ConsumeBool();
    ec.cc.dcqcn = in_.ConsumeBool();
    ec.tail_probe_ns = in_.ConsumeBool() ? 200 * 1000 : 0;
    ec.ack_req_every = in_.ConsumeIntegralInRange<uint32_t>(1, 32);
    timeout_ = in_.ConsumeIntegralInRange<uint8_t>(0, 14);
    retry_cnt_ = in_.ConsumeIntegralInRange<uint8_t>(0, 7);
    rnr_retry_ = in_.ConsumeIntegralInRange<uint8_t>(0, 7);
    min_rnr_ = in_.ConsumeIntegralInRange<uint8_t>(0, 31);
    max_rd_ = in_.ConsumeIntegralInRange<uint8_t>(1, 16);
    max_dest_rd_ = in_.ConsumeIntegralInRange<uint8_t>(1, 16);

    mem1_.reset(new uint8_t[kMem1]());
    mem2_.reset(new uint8_t[kMem2]());
    DeviceConfig cfg;
    cfg.mac = kOurMac;
    wire::gid_from_ipv4(kOurIp, cfg.gids[0]);
    cfg.num_gids = 1;
    cfg.key_seed = 0x5eed;
    dev_ = std::make_unique<Device>(cfg, &resolver_);
    engine_ = std::make_unique<Engine>(*dev_, io_, ec, 0);
    if (dev_->alloc_pd(&pd_) ||
        dev_->reg_mr(pd_, mem1_.get(), kMem1, addr1(0), kAllAccess, &mr1_) ||
        dev_->reg_mr(pd_, mem2_.get(), kMem2, addr2(0),
                     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ, &mr2_) ||
        dev_->create_cq(512, &scq_) || dev_->create_cq(512, &rcq_))
      fail("set-up: device objects");
    ibv_ah_attr ah = peer_ah_attr();
    if (dev_->create_ah(pd_, ah, &ah_)) fail("set-up: create_ah");

    const ibv_qp_type types[3] = {IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD};
    for (int i = 0; i < 3; ++i) {
      QpInitAttr a;
      a.qp_type = types[i];
      a.pd = pd_;
      a.send_cq = scq_;
      a.recv_cq = rcq_;
      a.cap.max_send_wr = 32;
      a.cap.max_recv_wr = 32;
      a.cap.max_send_sge = 4;
      a.cap.max_recv_sge = 4;
      a.cap.max_inline_data = kMaxInline;
      if (engine_->create_qp(a, &qps_[i])) fail("set-up: create_qp", i);
      types_[i] = types[i];
      bring_up(i);
    }
    // The UD QP is a member of group 239.0.0.1: frames to DQPN 0xFFFFFF
    // for it reach it (Engine::mcast_rx).
    uint8_t group[16];
    wire::gid_from_ipv4(kGroupIp, group);
    if (engine_->attach_mcast(qps_[2], group)) fail("set-up: attach_mcast");
    for (int i = 0; i < 3; ++i)
      for (int k = 0; k < 4; ++k) post_recv(i);
    // The initial sends.
    const ibv_wr_opcode rc_ops[] = {IBV_WR_RDMA_WRITE,
                                    IBV_WR_RDMA_READ,
                                    IBV_WR_SEND,
                                    IBV_WR_ATOMIC_CMP_AND_SWP,
                                    IBV_WR_ATOMIC_FETCH_AND_ADD,
                                    IBV_WR_ATOMIC_WRITE};
    for (ibv_wr_opcode o : rc_ops) post_send(0, o);
    post_send(1, IBV_WR_SEND);
    post_send(1, IBV_WR_RDMA_WRITE);
    post_send(2, IBV_WR_SEND);
    poll(0);
    after_op();
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

  // RESET -> INIT -> RTR -> RTS with fresh PSNs from the input.
  void bring_up(int i) {
    Qp* qp = qps_[i];
    const ibv_qp_type type = types_[i];
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = 1;
    int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
    if (type == IBV_QPT_UD) {
      a.qkey = kQkey;
      mask |= IBV_QP_QKEY;
    } else {
      a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                          IBV_ACCESS_REMOTE_ATOMIC;
      mask |= IBV_QP_ACCESS_FLAGS;
    }
    if (engine_->modify_qp(qp, a, mask)) fail("bring_up: INIT", i);
    a = {};
    a.qp_state = IBV_QPS_RTR;
    mask = IBV_QP_STATE;
    if (type != IBV_QPT_UD) {
      a.ah_attr = peer_ah_attr();
      a.path_mtu = mtu_enum_;
      a.dest_qp_num = kPeerQpn[i];
      a.rq_psn = in_.ConsumeIntegral<uint32_t>() & kPsnMask;
      mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
      if (type == IBV_QPT_RC) {
        a.max_dest_rd_atomic = max_dest_rd_;
        a.min_rnr_timer = min_rnr_;
        mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
      }
    }
    if (engine_->modify_qp(qp, a, mask)) fail("bring_up: RTR", i);
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = in_.ConsumeIntegral<uint32_t>() & kPsnMask;
    mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
    if (type == IBV_QPT_RC) {
      a.timeout = timeout_;
      a.retry_cnt = retry_cnt_;
      a.rnr_retry = rnr_retry_;
      a.max_rd_atomic = max_rd_;
      mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
              IBV_QP_MAX_QP_RD_ATOMIC;
    }
    if (engine_->modify_qp(qp, a, mask)) fail("bring_up: RTS", i);
  }

  uint64_t addr1(uint64_t off) const {
    return reinterpret_cast<uint64_t>(mem1_.get()) + off;
  }
  uint64_t addr2(uint64_t off) const {
    return reinterpret_cast<uint64_t>(mem2_.get()) + off;
  }

  // A length around the MTU (or small, or zero).
  uint32_t len_near_mtu() {
    switch (in_.ConsumeIntegralInRange<int>(0, 7)) {
      case 0:
        return 0;
      case 1:
        return in_.ConsumeIntegralInRange<uint32_t>(1, 64);
      case 2:
        return mtu_ - 1;
      case 3:
        return mtu_;
      case 4:
        return mtu_ + 1;
      case 5:
        return 2 * mtu_ + in_.ConsumeIntegralInRange<uint32_t>(0, 3);
      case 6:
        return in_.ConsumeIntegralInRange<uint32_t>(0, 3 * mtu_);
      default:
        return in_.ConsumeIntegralInRange<uint32_t>(0, 4 * mtu_);
    }
  }

  // A local SGE: mostly inside MR 1, sometimes a bad lkey or out of range.
  Sge local_sge(uint32_t len) {
    // Rarely bad: a bad receive SGE moves an RC QP to ERR.
    const int how = in_.ConsumeIntegralInRange<int>(0, 63);
    if (len > kMem1) len = kMem1;
    Sge s{addr1(in_.ConsumeIntegralInRange<uint32_t>(0, kMem1 - len)), len,
          mr1_->lkey()};
    if (how == 62) s.lkey = in_.ConsumeIntegral<uint32_t>();
    if (how == 63) s.addr = addr1(kMem1 - len / 2);  // runs off the end
    if (how == 61) s.lkey = mr2_->lkey();
    return s;
  }

  // --- posting --------------------------------------------------------------

  void post_send(int i, ibv_wr_opcode opc) {
    SendWr w;
    w.wr_id = next_id_++;
    w.opcode = opc;
    w.send_flags =
        in_.ConsumeIntegralInRange<int>(0, 3) ? IBV_SEND_SIGNALED : 0;
    if (in_.ConsumeIntegralInRange<int>(0, 7) == 0)
      w.send_flags |= IBV_SEND_FENCE;
    if (in_.ConsumeIntegralInRange<int>(0, 7) == 0)
      w.send_flags |= IBV_SEND_SOLICITED;
    w.remote_addr = kPeerVa + in_.ConsumeIntegralInRange<uint32_t>(0, 4096);
    w.rkey = kPeerRkey;
    if (is_atomic(opc)) {
      w.remote_addr &= ~uint64_t{7};
      w.sg_list[0] = local_sge(8);
      w.num_sge = 1;
      w.compare_add = in_.ConsumeIntegral<uint64_t>();
      w.swap = in_.ConsumeIntegral<uint64_t>();
    } else if (opc == IBV_WR_ATOMIC_WRITE) {
      w.remote_addr &= ~uint64_t{7};
      w.compare_add = in_.ConsumeIntegral<uint64_t>();
    } else {
      const uint32_t nsge = in_.ConsumeIntegralInRange<uint32_t>(0, 3);
      for (uint32_t k = 0; k < nsge; ++k) {
        uint32_t len = len_near_mtu() / (nsge ? nsge : 1);
        if (types_[i] == IBV_QPT_UD && len > 512) len = 512;
        w.sg_list[w.num_sge++] = local_sge(len);
      }
      uint32_t total = 0;
      for (uint32_t k = 0; k < w.num_sge; ++k) total += w.sg_list[k].length;
      if (opc != IBV_WR_RDMA_READ && total <= kMaxInline &&
          in_.ConsumeIntegralInRange<int>(0, 3) == 0 &&
          w.sg_list[0].lkey == mr1_->lkey())
        w.send_flags |= IBV_SEND_INLINE;
    }
    if (types_[i] == IBV_QPT_UD) {
      w.ah = ah_;
      w.remote_qpn = kPeerQpn[2];
      w.remote_qkey = kQkey;
    }
    // Inline data is read at post time: only from inside MR 1.
    if (w.send_flags & IBV_SEND_INLINE)
      for (uint32_t k = 0; k < w.num_sge; ++k)
        if (w.sg_list[k].addr + w.sg_list[k].length > addr1(kMem1))
          w.send_flags &= ~IBV_SEND_INLINE;
    const bool sig = w.send_flags & IBV_SEND_SIGNALED;
    if (engine_->post_send(qps_[i], w) == 0) {
      posted_[w.wr_id] = {i, false, sig, 0};
      ++posted_sends_;
    }
  }

  void post_recv(int i) {
    RecvWr w;
    w.wr_id = next_id_++;
    const uint32_t nsge = in_.ConsumeIntegralInRange<uint32_t>(1, 3);
    uint32_t cap = 0;
    for (uint32_t k = 0; k < nsge; ++k) {
      uint32_t len = len_near_mtu();
      if (types_[i] == IBV_QPT_UD && k == 0) len += kGrhLen();
      w.sg_list[w.num_sge++] = local_sge(len);
      cap += w.sg_list[k].length;
    }
    if (engine_->post_recv(qps_[i], w) == 0)
      posted_[w.wr_id] = {i, true, true, cap};
  }
  static constexpr uint32_t kGrhLen() { return 40; }

  ibv_wr_opcode fuzz_send_op(int i) {
    static constexpr ibv_wr_opcode kOps[] = {
        IBV_WR_SEND,
        IBV_WR_SEND_WITH_IMM,
        IBV_WR_RDMA_WRITE,
        IBV_WR_RDMA_WRITE_WITH_IMM,
        IBV_WR_RDMA_READ,
        IBV_WR_ATOMIC_CMP_AND_SWP,
        IBV_WR_ATOMIC_FETCH_AND_ADD,
        IBV_WR_ATOMIC_WRITE,
    };
    ibv_wr_opcode o = in_.PickValueInArray(kOps);
    if (!valid_opcode(types_[i], o)) o = IBV_WR_SEND;
    return o;
  }

  // --- time -----------------------------------------------------------------

  void poll(uint64_t t) {
    now_ = t;
    for (int k = 0; k < 200 && engine_->poll(now_) > 0; ++k) {
    }
  }

  uint64_t delta() {
    const uint64_t ack_to = timeout_ ? uint64_t{4096} << timeout_ : 0;
    switch (in_.ConsumeIntegralInRange<int>(0, 7)) {
      case 0:
        return 0;
      case 1:
        return in_.ConsumeIntegralInRange<uint64_t>(0, 20'000);
      case 2:
        return ack_to + in_.ConsumeIntegralInRange<uint64_t>(0, 100'000);
      case 3:
        return ack_to * in_.ConsumeIntegralInRange<uint64_t>(1, 4);
      case 4:
        return kRnrTableUs[in_.ConsumeIntegralInRange<int>(0, 31)] * 1000 +
               in_.ConsumeIntegralInRange<uint64_t>(0, 100'000);
      case 5:
        return in_.ConsumeIntegralInRange<uint64_t>(0, 1'000'000);
      case 6:
        return 200'000 + in_.ConsumeIntegralInRange<uint64_t>(0, 200'000);
      default:
        return in_.ConsumeIntegralInRange<uint64_t>(0, 2'000'000'000);
    }
  }

  // --- packets from the peer ------------------------------------------------

  uint32_t psn_near(uint32_t base) {
    switch (in_.ConsumeIntegralInRange<int>(0, 7)) {
      case 0:
        return in_.ConsumeIntegral<uint32_t>() & kPsnMask;
      case 1:
        return (base + in_.ConsumeIntegralInRange<int32_t>(-64, 64)) & kPsnMask;
      case 2:
        return (base + kPsnHalf + in_.ConsumeIntegralInRange<int32_t>(-2, 2)) &
               kPsnMask;
      default:
        return (base + in_.ConsumeIntegralInRange<int32_t>(-3, 3)) & kPsnMask;
    }
  }

  // A PSN for a response: near the requester's outstanding window.
  uint32_t resp_psn(const Qp& qp) {
    const uint32_t una = qp.comp_.psn, nxt = qp.req_.psn;
    const uint32_t span = (nxt - una) & kPsnMask;
    switch (in_.ConsumeIntegralInRange<int>(0, 5)) {
      case 0:
        return psn_near(una);
      case 1:
        return psn_near(nxt);
      case 2:
        return (nxt - 1) & kPsnMask;
      default:
        return (una + in_.ConsumeIntegralInRange<uint32_t>(
                          0, span < 4096 ? span : 4096)) &
               kPsnMask;
    }
  }

  uint8_t pick_opcode(int i) {
    static constexpr uint8_t kRc[] = {op::kRcSendFirst,
                                      op::kRcSendMiddle,
                                      op::kRcSendLast,
                                      op::kRcSendLastImm,
                                      op::kRcSendOnly,
                                      op::kRcSendOnlyImm,
                                      op::kRcWriteFirst,
                                      op::kRcWriteMiddle,
                                      op::kRcWriteLast,
                                      op::kRcWriteLastImm,
                                      op::kRcWriteOnly,
                                      op::kRcWriteOnlyImm,
                                      op::kRcReadRequest,
                                      op::kRcReadRespFirst,
                                      op::kRcReadRespMiddle,
                                      op::kRcReadRespLast,
                                      op::kRcReadRespOnly,
                                      op::kRcAck,
                                      op::kRcAtomicAck,
                                      op::kRcCmpSwap,
                                      op::kRcFetchAdd,
                                      op::kRcSendLastInv,
                                      op::kRcSendOnlyInv,
                                      op::kRcAtomicWrite,
                                      op::kRcAck,
                                      op::kRcAck,
                                      op::kRcReadRespOnly,
                                      op::kRcAtomicAck,
                                      op::kCnp};
    static constexpr uint8_t kUc[] = {op::kUcBase + op::kRcSendFirst,
                                      op::kUcBase + op::kRcSendMiddle,
                                      op::kUcBase + op::kRcSendLast,
                                      op::kUcBase + op::kRcSendLastImm,
                                      op::kUcBase + op::kRcSendOnly,
                                      op::kUcBase + op::kRcSendOnlyImm,
                                      op::kUcBase + op::kRcWriteFirst,
                                      op::kUcBase + op::kRcWriteMiddle,
                                      op::kUcBase + op::kRcWriteLast,
                                      op::kUcBase + op::kRcWriteLastImm,
                                      op::kUcBase + op::kRcWriteOnly,
                                      op::kUcBase + op::kRcWriteOnlyImm,
                                      op::kCnp};
    static constexpr uint8_t kUd[] = {op::kUdSendOnly, op::kUdSendOnlyImm,
                                      op::kCnp};
    if (in_.ConsumeIntegralInRange<int>(0, 31) == 0) {
      // Any opcode the codec knows (a wrong transport type included).
      for (;;) {
        const uint8_t o = in_.ConsumeIntegral<uint8_t>();
        if (wire::opcode_info(o).valid() || in_.remaining_bytes() == 0)
          return o;
      }
    }
    if (types_[i] == IBV_QPT_RC) return in_.PickValueInArray(kRc);
    if (types_[i] == IBV_QPT_UC) return in_.PickValueInArray(kUc);
    return in_.PickValueInArray(kUd);
  }

  uint8_t syndrome() {
    switch (in_.ConsumeIntegralInRange<int>(0, 7)) {
      case 0:
      case 1:
      case 2:
        return kAckSyn;
      case 3:
        return in_.ConsumeIntegralInRange<uint8_t>(0, 0x1f);  // ACK + credits
      case 4:
        return kRnrNak | in_.ConsumeIntegralInRange<uint8_t>(0, 31);
      case 5:
        return kNakSeq + in_.ConsumeIntegralInRange<uint8_t>(0, 4);
      case 6:
        return 0x60 | in_.ConsumeIntegralInRange<uint8_t>(0, 0x1f);
      default:
        return in_.ConsumeIntegral<uint8_t>();
    }
  }

  uint32_t rkey() {
    switch (in_.ConsumeIntegralInRange<int>(0, 9)) {
      case 0:
        return mr2_->rkey();
      case 1:
        return in_.ConsumeIntegral<uint32_t>();
      case 2:
        return mr1_->rkey() ^ 1;
      default:
        return mr1_->rkey();
    }
  }

  // A remote va for an access of `len` bytes with `rk`.
  uint64_t remote_va(uint32_t rk, uint64_t len, bool align8) {
    const bool two = rk == mr2_->rkey();
    const uint64_t base = two ? addr2(0) : addr1(0);
    const uint64_t size = two ? kMem2 : kMem1;
    uint64_t va;
    switch (in_.ConsumeIntegralInRange<int>(0, 7)) {
      case 0:
        va = base + size - (len < size ? len : size);  // at the edge
        break;
      case 1:
        va = base + size - (len < size ? len : size) + 1;  // just past it
        break;
      case 2:
        va = base - in_.ConsumeIntegralInRange<uint64_t>(1, 16);
        break;
      case 3:
        va = in_.ConsumeIntegral<uint64_t>();
        break;
      case 4:
        va = base + size;
        break;
      default:
        va = base + in_.ConsumeIntegralInRange<uint64_t>(0, size);
        break;
    }
    if (align8 && in_.ConsumeIntegralInRange<int>(0, 7)) va &= ~uint64_t{7};
    return va;
  }

  void inject_packet(int mode) {
    const int i = in_.ConsumeIntegralInRange<int>(0, 2);
    Qp* qp = qps_[i];
    wire::RoceFields f;
    f.opcode = pick_opcode(i);
    const wire::OpcodeInfo& info = wire::opcode_info(f.opcode);
    f.dqpn = qp->qpn();
    bool to_group = false;
    if (in_.ConsumeIntegralInRange<int>(0, 31) == 0) {
      f.dqpn = in_.ConsumeBool()
                   ? qps_[in_.ConsumeIntegralInRange<int>(0, 2)]->qpn()
                   : (in_.ConsumeIntegral<uint32_t>() & kPsnMask);
      // A top byte of 0xff in that number: to the group, or its QPN alone.
      if ((f.dqpn >> 16) == 0xff) {
        to_group = f.dqpn & 1;
        f.dqpn = wire::kMulticastQpn;
      }
    }
    if (info.valid() && info.has(wire::kResp))
      f.psn = resp_psn(*qp);
    else
      f.psn = psn_near(qp->resp_.epsn);
    f.ack_req = in_.ConsumeBool();
    f.se = in_.ConsumeIntegralInRange<int>(0, 7) == 0;
    if (in_.ConsumeIntegralInRange<int>(0, 31) == 0)
      f.pkey = in_.ConsumeIntegral<uint16_t>();
    const int ecn = in_.ConsumeIntegralInRange<int>(0, 7);
    if (ecn == 0) f.tclass = 0x3;  // CE
    if (ecn == 1) f.tclass = in_.ConsumeIntegral<uint8_t>();
    f.becn = ecn == 2;
    f.fecn = ecn == 3;

    uint32_t len = len_near_mtu();
    f.reth_rkey = rkey();
    f.reth_len = len;
    if (in_.ConsumeIntegralInRange<int>(0, 15) == 0)
      f.reth_len = in_.ConsumeIntegral<uint32_t>();
    else if (info.valid() && info.has(wire::kAtomicWrite) &&
             in_.ConsumeIntegralInRange<int>(0, 3))
      f.reth_len = 8;  // ATOMIC WRITE: 8 bytes, mostly
    f.reth_va = remote_va(f.reth_rkey, f.reth_len,
                          info.valid() && info.has(wire::kAtomicWrite));
    f.aeth_syndrome = syndrome();
    f.aeth_msn = in_.ConsumeBool()
                     ? (qp->resp_.msn & kPsnMask)
                     : (in_.ConsumeIntegral<uint32_t>() & kPsnMask);
    f.atomic_rkey = rkey();
    f.atomic_va = remote_va(f.atomic_rkey, 8, true);
    f.atomic_swap_add = in_.ConsumeIntegral<uint64_t>();
    f.atomic_compare = in_.ConsumeBool() ? 0 : in_.ConsumeIntegral<uint64_t>();
    f.atomic_orig = in_.ConsumeIntegral<uint64_t>();
    f.imm = in_.ConsumeIntegral<uint32_t>();
    f.ieth_rkey =
        in_.ConsumeBool() ? mr1_->rkey() : in_.ConsumeIntegral<uint32_t>();
    f.deth_qkey = in_.ConsumeIntegralInRange<int>(0, 7)
                      ? kQkey
                      : in_.ConsumeIntegral<uint32_t>();
    f.deth_src_qp = kPeerQpn[2];

    // Payload: a consistent length for the opcode most of the time.
    uint32_t plen = 0;
    if (info.valid() && info.has(wire::kPayload)) {
      if (info.has(wire::kAtomicWrite))
        plen = in_.ConsumeIntegralInRange<int>(0, 7) ? 8 : len_near_mtu();
      else if (info.has(wire::kMiddle) || info.has(wire::kFirst))
        plen = in_.ConsumeIntegralInRange<int>(0, 3) ? mtu_ : len_near_mtu();
      else if (info.has(wire::kReth) && in_.ConsumeBool())
        plen = f.reth_len;
      else
        plen = len_near_mtu();
      if (plen > 4200) plen = 4200;
    }
    f.payload_len = plen;
    f.dst_mac = kOurMac;
    f.src_mac = kPeerMac;
    wire::gid_from_ipv4(kPeerIp, f.sgid);
    wire::gid_from_ipv4(to_group ? kGroupIp : kOurIp, f.dgid);
    if (to_group) wire::multicast_mac(f.dgid, f.dst_mac);
    if (in_.ConsumeIntegralInRange<int>(0, 15) == 0) f.vlan = true;

    payload_.assign(plen, 0);
    const std::vector<uint8_t> pb =
        in_.ConsumeBytes<uint8_t>(plen < 16 ? plen : 16);
    for (uint32_t k = 0; k < plen; ++k)
      payload_[k] =
          pb.empty() ? static_cast<uint8_t>(k * 7) : pb[k % pb.size()];
    const uint32_t n =
        wire::encode_frame(f, payload_.data(), frame_, kFrameCap);
    if (n == 0) return;  // the codec refuses (no payload allowed, ...)

    if (mode == 1) {
      // Overwrite a few bytes after the BTH opcode (headers, payload) and
      // recompute the ICRC over the result.
      const uint32_t hl = wire::header_len(f);
      const uint32_t first = hl - static_cast<uint32_t>(info.hdr_len) + 1;
      const uint32_t end = hl + plen;
      const int k = in_.ConsumeIntegralInRange<int>(1, 4);
      for (int m = 0; m < k && end > first; ++m)
        frame_[in_.ConsumeIntegralInRange<uint32_t>(first, end - 1)] =
            in_.ConsumeIntegral<uint8_t>();
      const wire::ConstBuf pl{frame_ + hl, plen};
      wire::encode_trailer(frame_, f, {&pl, plen ? 1u : 0u},
                           frame_ + hl + plen);
    }
    deliver(n);
  }

  void inject_raw() {
    const std::vector<uint8_t> b =
        in_.ConsumeBytes<uint8_t>(in_.ConsumeIntegralInRange<uint32_t>(0, 512));
    if (!b.empty()) std::memcpy(frame_, b.data(), b.size());
    deliver(static_cast<uint32_t>(b.size()));
  }

  void deliver(uint32_t n) {
    wire::FrameInfo fi;
    wire::decode(frame_, n, fi);
    if (fi.kind != wire::FrameKind::kRoce) return;
    const wire::ConstBuf seg{frame_, n};
    engine_->rx(fi, {&seg, 1}, now_);
    ++injected_;
  }

  // --- the program ----------------------------------------------------------

  void step() {
    const int kind = in_.ConsumeIntegralInRange<int>(0, 19);
    if (kind <= 9) {
      inject_packet(0);
    } else if (kind == 10) {
      inject_packet(1);
    } else if (kind == 11) {
      inject_raw();
    } else if (kind <= 14) {
      poll(now_ + delta());
    } else if (kind == 15) {
      const int i = in_.ConsumeIntegralInRange<int>(0, 2);
      post_send(i, fuzz_send_op(i));
      if (in_.ConsumeBool()) poll(now_);
    } else if (kind == 16) {
      post_recv(in_.ConsumeIntegralInRange<int>(0, 2));
    } else if (kind == 17) {
      io_.room = in_.ConsumeBool() ? -1 : in_.ConsumeIntegralInRange<int>(0, 4);
    } else if (kind == 18) {
      poll(now_);
    } else {
      control();
    }
  }

  void control() {
    const int i = in_.ConsumeIntegralInRange<int>(0, 2);
    Qp* qp = qps_[i];
    if (qp->state() == IBV_QPS_ERR && in_.ConsumeBool()) {
      // Back to RTS: RESET discards what is queued without completions.
      drain();
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_RESET;
      if (engine_->modify_qp(qp, a, IBV_QP_STATE)) fail("ERR -> RESET", i);
      for (auto it = posted_.begin(); it != posted_.end();)
        it = it->second.qp == i ? posted_.erase(it) : std::next(it);
      bring_up(i);
      for (int k = 0; k < 2; ++k) post_recv(i);
      return;
    }
    if (in_.ConsumeIntegralInRange<int>(0, 3) == 0) {
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_ERR;
      engine_->modify_qp(qp, a, IBV_QP_STATE);
    }
  }

  // --- checks ---------------------------------------------------------------

  void drain() {
    ibv_wc wc[32];
    for (Cq* cq : {scq_, rcq_}) {
      for (int n; (n = cq->poll(wc)) > 0;)
        for (int k = 0; k < n; ++k) check_cqe(wc[k], cq == rcq_);
    }
    AsyncEvent ev;
    while (dev_->next_event(&ev)) {
    }
  }

  void check_cqe(const ibv_wc& wc, bool recv_cq) {
    ++cqes_;
    if (wc.status > IBV_WC_GENERAL_ERR) fail("CQE status", wc.status, wc.wr_id);
    auto it = posted_.find(wc.wr_id);
    if (it == posted_.end()) fail("CQE for a wr_id not outstanding", wc.wr_id);
    const Posted p = it->second;
    if (p.recv != recv_cq) fail("CQE on the wrong CQ", wc.wr_id, recv_cq);
    if (wc.qp_num != qps_[p.qp]->qpn())
      fail("CQE qp_num is not the posting QP", wc.wr_id, wc.qp_num);
    // (A WRITE with immediate reports the bytes written, not received.)
    if (p.recv && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV &&
        wc.byte_len > p.cap)
      fail("receive byte_len beyond the posted buffers", wc.byte_len, p.cap);
    posted_.erase(it);
  }

  void after_op() {
    drain();
    const EngineCounters& c = engine_->counters();
    const uint64_t comps = c.get(ECtr::completions);
    const uint64_t over = c.get(ECtr::cq_overflows);
    if (comps != cqes_ + over)
      fail("completions != CQEs read + overflows", comps, cqes_ + over);
    if (c.get(ECtr::send_wqes) > posted_sends_)
      fail("send_wqes above the sends posted", c.get(ECtr::send_wqes),
           posted_sends_);
  }

  void finish() {
    io_.room = -1;
    for (int i = 0; i < 3; ++i) {
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_ERR;
      engine_->modify_qp(qps_[i], a, IBV_QP_STATE);
    }
    poll(now_ + 1'000'000'000);
    after_op();
    if (std::getenv("FUZZ_ENGINE_DUMP")) dump();
    if (engine_->counters().get(ECtr::cq_overflows)) return;
    for (const auto& [id, p] : posted_)
      if (p.recv || p.signaled) fail("WR never completed after ERR", id, p.qp);
  }

  // FUZZ_ENGINE_DUMP=1 (replaying a corpus): what one input reached.
  void dump() const {
    std::fprintf(stderr, "injected %llu cqes %llu:",
                 static_cast<unsigned long long>(injected_),
                 static_cast<unsigned long long>(cqes_));
    for (size_t k = 0; k < kNumECtr; ++k)
      if (uint64_t v = engine_->counters().v[k].load())
        std::fprintf(stderr, " %s=%llu", kECtrNames[k],
                     static_cast<unsigned long long>(v));
    std::fprintf(stderr, "\n");
  }

  FuzzedDataProvider& in_;
  PeerResolver resolver_;
  CaptureIo io_;
  std::unique_ptr<uint8_t[]> mem1_, mem2_;
  std::unique_ptr<Device> dev_;
  std::unique_ptr<Engine> engine_;
  Pd* pd_ = nullptr;
  Mr* mr1_ = nullptr;
  Mr* mr2_ = nullptr;
  Cq* scq_ = nullptr;
  Cq* rcq_ = nullptr;
  Ah* ah_ = nullptr;
  Qp* qps_[3] = {};
  ibv_qp_type types_[3] = {};
  ibv_mtu mtu_enum_ = IBV_MTU_1024;
  uint32_t mtu_ = 1024;
  uint8_t timeout_ = 14, retry_cnt_ = 7, rnr_retry_ = 7, min_rnr_ = 12;
  uint8_t max_rd_ = 16, max_dest_rd_ = 16;
  uint64_t now_ = 0;
  uint64_t next_id_ = 1;
  uint64_t cqes_ = 0;
  uint64_t posted_sends_ = 0;
  uint64_t injected_ = 0;
  std::unordered_map<uint64_t, Posted> posted_;
  std::vector<uint8_t> payload_;
  uint8_t frame_[kFrameCap];
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  auto f = std::make_unique<Fuzz>(in);
  f->run();
  return 0;
}
