// libFuzzer target: the verbs shim's service side
// (dataplane/service/shim_server.cc), driven in-process as in
// tests/unit/test_shim_server.cc: a real Device + Engine whose frames loop
// back through the wire codec, two clients (ClientInfo ids 1 and 2) of one
// ShimServer. The input is a little program of control requests (every
// verbs op, sometimes any op number; bodies of the right size built from
// fuzzed fields with handles drawn from earlier replies, the other client's
// or random; sometimes hostile lengths; fds where a request takes them,
// sometimes wrong ones), client closes, and writes into the shared memory
// the service returned (rings, doorbell page, CQ words) followed by the
// lcore side (doorbells_st, Engine::poll, loopback). Checked (abort() when
// broken), besides what the sanitizers catch:
//   - a reply's status is 0 or a negative errno; a failed reply carries no
//     fds; a successful one the reply struct of its op;
//   - once both clients are closed, stats() shows qps, cqs, mrs and pds 0
//     (and the Device no SRQs, AHs).
// Every fd opened here, and every fd a reply returns, is closed before the
// input ends (checked: the process has as many fds open as before); every
// mapping is unmapped.
//
// Program format (bytes past the input's end read as 0). Byte 0: setup
// flags (bit 0: tight client_limits; bit 1: ShimServer::shutdown() after
// the program, before the clients close). Then operations, one byte `op`, its
// kind op % 16, then its operands:
//   0-9    REQUEST  sel shape ...  sel&1 the client; (sel>>1)%8: 0-5 a
//                   verbs op 100 + u8 % 26, 6 any u16, 7 a CM op or 125-199;
//                   shape%16: 0-11 the op's struct, 12 hostile length
//                   (u8 bytes of input), 13 struct +/- 1..4 bytes, 14 empty,
//                   15 struct with u8%4 byte patches; then the op's fields
//   10     CLOSE    c              on_close(client c&1)
//   11,12  SCRIBBLE c what ...     garbage or WQEs into shared memory, then
//                                  the lcore side runs
//   13     RUN                     the lcore side until quiet (bounded)
//   14     PUMP                    pump_events(), drain event sockets,
//                                  objects_text(), qp_owners()
//   15     RING     c idx(u16)     ring any doorbell index, then RUN
// Multi-byte numbers are little-endian.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "dataplane/service/shim_server.h"
#include "dataplane/wire/codec.h"

namespace {

using namespace urnic;
using namespace urnic::shim;
using service::ClientInfo;
using service::CtlReply;
using service::CtlRequest;
using service::ShimServer;

constexpr size_t kMaxOps = 96;
constexpr size_t kMaxMaps = 64;  // per input; further fds are just closed
// This target found two bugs, both fixed: kDeregMr unmapped an MR that
// posted WQEs still pointed into (SEGV at their (re)transmission), and
// kModifyQp read a client's out-of-range enum values (UBSan). Both kinds
// of input are sent unchanged.

#define CHECK(c)                                                          \
  do {                                                                    \
    if (!(c)) {                                                           \
      std::fprintf(stderr, "fuzz_shim: check failed: %s (line %d)\n", #c, \
                   __LINE__);                                             \
      std::abort();                                                       \
    }                                                                     \
  } while (0)

class Reader {
 public:
  Reader(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  bool done() const { return i_ >= n_; }
  uint8_t u8() { return i_ < n_ ? d_[i_++] : 0; }
  uint16_t u16() { return static_cast<uint16_t>(u8() | u8() << 8); }
  uint32_t u32() { return u16() | static_cast<uint32_t>(u16()) << 16; }
  uint64_t u64() { return u32() | static_cast<uint64_t>(u32()) << 32; }
  void bytes(void* out, size_t n) {
    auto* o = static_cast<uint8_t*>(out);
    for (size_t k = 0; k < n; ++k) o[k] = u8();
  }

 private:
  const uint8_t* d_;
  size_t n_;
  size_t i_ = 0;
};

class LoopIo : public transport::PacketIo {
 public:
  bool transmit(const transport::TxFrame& f) override {
    if (frames.size() >= 256) return false;
    std::vector<uint8_t> b(f.frame_len());
    f.copy_to(b.data());
    frames.push_back(std::move(b));
    return true;
  }
  std::deque<std::vector<uint8_t>> frames;
};

enum Kind { kPd, kMr, kMw, kCh, kCq, kSrq, kQp, kAh, kKinds };

struct Map {
  void* p = nullptr;
  size_t len = 0;
};
struct QpMap {  // a QP's memory as created (the shim's view)
  QpShared* sh = nullptr;
  uint32_t sq_size = 0, rq_size = 0, doorbell = 0, qpn = 0;
  ShmSendWqe* sq = nullptr;
  ShmRecvWqe* rq = nullptr;
};
struct SrqMap {
  SrqShared* sh = nullptr;
  uint32_t size = 0, doorbell = 0;
  ShmRecvWqe* ring = nullptr;
};
struct MrInfo {
  uint32_t lkey = 0, rkey = 0;
  uint64_t iova = 0, len = 0;
};

struct Client {
  ClientInfo ci;
  std::vector<uint32_t> h[kKinds];  // live handles by kind
  std::vector<int> fds;             // our ends of sockets
  DoorbellPage* db = nullptr;
  std::vector<QpMap> qps;
  std::vector<SrqMap> srqs;
  std::vector<CqShared*> cqs;
  std::vector<MrInfo> mrs;
  std::vector<Map> raw;  // every mapping (for scribbles)
  void forget() {
    for (auto& v : h) v.clear();
    db = nullptr;
    qps.clear();
    srqs.clear();
    cqs.clear();
    mrs.clear();
    raw.clear();
  }
};

transport::DeviceConfig device() {
  transport::DeviceConfig dc;
  dc.mac = {{2, 0, 0, 0, 0, 1}};
  wire::gid_from_ipv4(0x0a000001, dc.gids[0]);
  dc.num_gids = 1;
  dc.key_seed = 1;
  // Small enough that hostile sizes stay cheap, yet reachable.
  dc.limits.max_qp_wr = 256;
  dc.limits.max_cqe = 1024;
  dc.limits.max_srq_wr = 256;
  dc.limits.max_qp = 64;
  dc.limits.max_cq = 64;
  dc.limits.max_mr = 64;
  dc.limits.max_pd = 64;
  dc.limits.max_srq = 16;
  dc.limits.max_ah = 64;
  return dc;
}

// The payload size of a successful reply.
size_t reply_size(Op op) {
  switch (op) {
    case Op::kOpen:
      return sizeof(OpenRep);
    case Op::kQueryPort:
      return sizeof(ibv_port_attr);
    case Op::kAllocPd:
    case Op::kCreateChannel:
    case Op::kCreateAh:
      return sizeof(HandleRep);
    case Op::kRegMr:
      return sizeof(RegMrRep);
    case Op::kCreateCq:
    case Op::kResizeCq:
      return sizeof(CreateCqRep);
    case Op::kCreateSrq:
      return sizeof(CreateSrqRep);
    case Op::kQuerySrq:
      return sizeof(ibv_srq_attr);
    case Op::kCreateQp:
      return sizeof(CreateQpRep);
    case Op::kModifyQp:
      return sizeof(ModifyQpRep);
    case Op::kQueryQp:
      return sizeof(QueryQpRep);
    case Op::kAllocMw:
      return sizeof(AllocMwRep);
    default:
      return 0;
  }
}

struct Fuzz {
  explicit Fuzz(Reader& in, config::ClientLimitsConfig limits)
      : in(in),
        dev(device()),
        eng0(dev, io, home_config(0)),
        eng1(dev, io, home_config(1)),
        srv(env(limits)) {
    for (int i = 0; i < 2; ++i) {
      cl[i].ci.id = static_cast<uint64_t>(i + 1);
      cl[i].ci.pid = 1000 + i;
    }
  }
  ~Fuzz() {
    for (auto& m : maps) munmap(m.p, m.len);
  }

  // Two engines, as urnicd's two workers: QPs spread over both, CQs
  // shared between them, SRQ QPs with their SRQ.
  static transport::EngineConfig home_config(uint32_t home) {
    transport::EngineConfig ec;
    ec.home = home;
    ec.homes = 2;
    return ec;
  }
  transport::Engine& engine(uint32_t home) { return home ? eng1 : eng0; }

  service::ShimEnv env(config::ClientLimitsConfig limits) {
    service::ShimEnv e;
    e.dev = &dev;
    e.engines = {&eng0, &eng1};
    e.gates = {&gate0, &gate1};  // never running: park() returns at once
    e.info.num_gids = 1;
    e.client_limits = limits;
    return e;
  }

  // --- handles and values ------------------------------------------------
  uint32_t pick(int c, Kind k) {
    const uint8_t b = in.u8();
    const auto& mine = cl[c].h[k];
    const auto& other = cl[c ^ 1].h[k];
    switch (b % 8) {
      case 6:
        if (!other.empty()) return other[in.u8() % other.size()];
        break;
      case 7:
        return b & 8 ? in.u32() : (b >> 4);  // random, or small (0: none)
      default:
        if (!mine.empty()) return mine[in.u8() % mine.size()];
    }
    return in.u8();
  }
  uint32_t small(uint32_t max) {  // mostly sensible, sometimes anything
    const uint8_t b = in.u8();
    if (b >= 240) return in.u32();
    return b % (max + 1);
  }
  void drop(int c, Kind k, uint32_t h) {
    auto& v = cl[c].h[k];
    auto it = std::find(v.begin(), v.end(), h);
    if (it != v.end()) v.erase(it);
  }
  void* map_fd(int c, int fd, size_t len) {
    if (maps.size() >= kMaxMaps || len == 0 || len > (64u << 20))
      return nullptr;
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return nullptr;
    maps.push_back({p, len});
    cl[c].raw.push_back({p, len});
    return p;
  }
  int sock(int c, bool nonblock) {
    int sv[2];
    if (socketpair(
            AF_UNIX,
            SOCK_SEQPACKET | SOCK_CLOEXEC | (nonblock ? SOCK_NONBLOCK : 0), 0,
            sv) != 0)
      return -1;
    cl[c].fds.push_back(sv[0]);
    return sv[1];
  }
  // A memfd of `len` bytes (sealed against shrinking unless told not to).
  static int memfd(size_t len, bool seal) {
    const int fd = memfd_create("f", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return -1;
    if (ftruncate(fd, static_cast<off_t>(len)) != 0) {
      close(fd);
      return -1;
    }
    if (seal) fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK);
    return fd;
  }

  // --- requests ------------------------------------------------------------
  template <typename T>
  static std::string raw(const T& v) {
    return std::string(reinterpret_cast<const char*>(&v), sizeof v);
  }

  void fill_modify_qp(int c, ModifyQpReq& m) {
    m.handle = pick(c, kQp);
    const uint8_t how = in.u8();
    const auto s = static_cast<ibv_qp_state>(how % 8 <= 6 ? how % 8 : 3);
    m.attr.qp_state = s;
    if (how & 0x80) {  // fuzzed attributes
      in.bytes(&m.attr, sizeof m.attr);
      m.mask = static_cast<int32_t>(in.u32());
      return;
    }
    if (s == IBV_QPS_INIT) {
      m.mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
      m.attr.port_num = 1;
      m.attr.qp_access_flags = in.u8() & 0x1f;
      m.mask |= (how & 0x40) ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS;
      m.attr.qkey = in.u32();
    } else if (s == IBV_QPS_RTR) {
      m.mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
               IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
      if (how & 0x40) m.mask = IBV_QP_STATE;  // UD
      m.attr.path_mtu = static_cast<ibv_mtu>(1 + in.u8() % 5);
      // A QPN this server gave out, mostly.
      std::vector<uint32_t> qpns;
      for (auto& cc : cl)
        for (auto& q : cc.qps) qpns.push_back(q.qpn);
      const uint8_t b = in.u8();
      m.attr.dest_qp_num = !qpns.empty() && b < 224 ? qpns[b % qpns.size()]
                                                    : in.u32() & 0xffffff;
      m.attr.rq_psn = in.u32() & 0xffffff;
      m.attr.max_dest_rd_atomic = in.u8() % 4;
      m.attr.min_rnr_timer = in.u8() % 32;
      m.attr.ah_attr.is_global = 1;
      m.attr.ah_attr.port_num = 1;
      m.attr.ah_attr.grh.sgid_index = in.u8() % 4 == 0 ? in.u8() : 0;
      std::memcpy(m.attr.ah_attr.grh.dgid.raw, dev.config().gids[0], 16);
    } else if (s == IBV_QPS_RTS) {
      m.mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
               IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
      if (how & 0x40) m.mask = IBV_QP_STATE | IBV_QP_SQ_PSN;  // UD
      m.attr.timeout = in.u8() % 32;
      m.attr.retry_cnt = in.u8() % 8;
      m.attr.rnr_retry = in.u8() % 8;
      m.attr.sq_psn = in.u32() & 0xffffff;
      m.attr.max_rd_atomic = in.u8() % 4;
    } else {
      m.mask = IBV_QP_STATE;
      if (how & 0x40) {
        m.mask |= static_cast<int32_t>(in.u32());
        in.bytes(&m.attr, sizeof m.attr);
        m.attr.qp_state = s;
      }
    }
  }

  // The struct of `op` from fuzzed fields; fds it takes appended to *fds.
  std::string body(int c, Op op, std::vector<int>* fds) {
    switch (op) {
      case Op::kOpen: {
        OpenReq o;
        const uint8_t b = in.u8();
        if (b % 8 == 7) o.abi = in.u32();
        if (b % 16 != 14) fds->push_back(sock(c, true));
        return raw(o);
      }
      case Op::kRegMr: {
        RegMrReq r{};
        r.pd = pick(c, kPd);
        r.access = in.u8() & 0x3f;
        if (in.u8() == 255) r.access = in.u32();
        const uint8_t b = in.u8();
        const uint32_t n = 1 + b % 3;
        uint64_t total = 0;
        for (uint32_t i = 0; i < n; ++i) {
          const uint8_t p = in.u8();
          const uint64_t pages = 1 + p % 3;
          const uint64_t off = (p >> 2) % 4 == 0 ? 4096 : 0;
          r.pieces[i] = {off, pages * 4096};
          total += pages * 4096;
          // Sometimes unsealed, short, or not a memfd at all.
          int fd;
          switch (p >> 5) {
            case 0:
              fd = memfd(off + pages * 4096, false);
              break;
            case 1:
              fd = memfd(off + pages * 4096 - 4096, true);
              break;
            case 2:
              if (p & 16) {
                int sv[2];
                fd = socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0
                         ? (close(sv[1]), sv[0])
                         : -1;
              } else {
                fd = memfd(off + pages * 4096 + 8192, true);
              }
              break;
            default:
              fd = memfd(off + pages * 4096, true);
          }
          if (fd >= 0) fds->push_back(fd);
        }
        r.npieces = (b & 0x80) ? in.u8() : n;
        r.map_start = uint64_t{0x10000} << (in.u8() % 20);
        r.map_len = (b & 0x40) ? in.u64() : total;
        const uint8_t a = in.u8();
        r.addr = r.map_start + (a % 4 == 3 ? in.u64() : (a % 4) * 512);
        r.length = a & 0x80 ? in.u64() : total - (r.addr - r.map_start) % total;
        r.iova = (a & 0x40) ? in.u64() : r.addr;
        if (b & 0x20) r.pieces[in.u8() % kMaxMrPieces] = {in.u64(), in.u64()};
        if (b & 0x10) {
          // A piece of the client's own mapping (no fd; the service opens
          // it, which these clients' made-up pids do not have).
          const uint8_t v = in.u8();
          MrPiece& q = r.pieces[v % 4 == 3 ? in.u8() % kMaxMrPieces : 0];
          q.vma_start = r.map_start - (v & 4 ? 4096 : 0);
          q.vma_end =
              v & 8 ? in.u64() : r.map_start + total + (v & 16 ? 4096 : 0);
          if (v & 32)
            for (int fd : *fds) close(fd);
          if (v & 32) fds->clear();
        }
        return raw(r);
      }
      case Op::kCreateCq: {
        CreateCqReq r;
        r.cqe = small(1100);
        r.channel = in.u8() & 1 ? pick(c, kCh) : kNoHandle;
        return raw(r);
      }
      case Op::kResizeCq: {
        ResizeCqReq r;
        r.handle = pick(c, kCq);
        r.cqe = small(1100);
        return raw(r);
      }
      case Op::kCreateSrq: {
        CreateSrqReq r;
        r.pd = pick(c, kPd);
        r.max_wr = small(300);
        r.max_sge = small(18);
        r.srq_limit = small(r.max_wr < 300 ? r.max_wr + 1 : 300);
        return raw(r);
      }
      case Op::kModifySrq: {
        ModifySrqReq r;
        r.handle = pick(c, kSrq);
        r.mask =
            static_cast<int32_t>(in.u8() % 4 == 3 ? in.u32() : in.u8() % 4);
        r.attr.max_wr = small(300);
        r.attr.srq_limit = small(300);
        return raw(r);
      }
      case Op::kCreateQp: {
        CreateQpReq r;
        r.pd = pick(c, kPd);
        r.send_cq = pick(c, kCq);
        r.recv_cq = in.u8() & 1 ? r.send_cq : pick(c, kCq);
        r.srq = in.u8() % 4 == 0 ? pick(c, kSrq) : kNoHandle;
        const uint8_t t = in.u8();
        r.qp_type = t < 200   ? IBV_QPT_RC
                    : t < 230 ? IBV_QPT_UD
                    : t < 250 ? IBV_QPT_UC
                              : in.u32();
        const uint8_t sig = in.u8();
        r.sq_sig_all = sig & 1;
        // Bit 7: create flags (mostly the one urnic takes, else any).
        if (sig & 0x80)
          r.create_flags =
              sig & 2 ? IBV_QP_CREATE_BLOCK_SELF_MCAST_LB : in.u32();
        r.cap.max_send_wr = small(300);
        r.cap.max_recv_wr = small(300);
        r.cap.max_send_sge = small(18);
        r.cap.max_recv_sge = small(18);
        r.cap.max_inline_data = small(300);
        return raw(r);
      }
      case Op::kModifyQp: {
        ModifyQpReq m;
        fill_modify_qp(c, m);
        return raw(m);
      }
      case Op::kCreateAh: {
        CreateAhReq a;
        a.pd = pick(c, kPd);
        const uint8_t b = in.u8();
        if (b & 0x80) {
          in.bytes(&a.attr, sizeof a.attr);
        } else {
          a.attr.is_global = b & 1;
          a.attr.port_num = b & 2 ? in.u8() : 1;
          a.attr.grh.sgid_index = b & 4 ? in.u8() : 0;
          a.attr.grh.hop_limit = 64;
          std::memcpy(a.attr.grh.dgid.raw, dev.config().gids[0], 16);
          if (b & 8) in.bytes(a.attr.grh.dgid.raw, 16);
        }
        return raw(a);
      }
      case Op::kAsyncRequeue: {
        AsyncRequeueReq q{};
        q.n = small(70);
        for (uint32_t i = 0; i < std::min(q.n, kMaxRequeue) && i < 4; ++i)
          q.msgs[i] = {in.u8(), pick(c, kQp)};
        return raw(q);
      }
      case Op::kAllocMw: {
        AllocMwReq r;
        r.pd = pick(c, kPd);
        const uint8_t t = in.u8();
        r.type = t < 250 ? 1 + t % 2 : in.u32();
        return raw(r);
      }
      case Op::kCreateChannel: {
        if (in.u8() % 8 != 7) fds->push_back(sock(c, in.u8() % 8 != 0));
        return {};
      }
      case Op::kQueryPort:
      case Op::kAllocPd:
        return {};
      case Op::kDeallocPd:
        return raw(HandleReq{pick(c, kPd)});
      case Op::kDeregMr:
        return raw(HandleReq{pick(c, kMr)});
      case Op::kReregMr:
        return raw(ReregMrReq{pick(c, kMr), pick(c, kMr)});
      case Op::kDestroyChannel:
        return raw(HandleReq{pick(c, kCh)});
      case Op::kDestroyCq:
        return raw(HandleReq{pick(c, kCq)});
      case Op::kQuerySrq:
      case Op::kDestroySrq:
        return raw(HandleReq{pick(c, kSrq)});
      case Op::kQueryQp:
      case Op::kDestroyQp:
        return raw(HandleReq{pick(c, kQp)});
      case Op::kDestroyAh:
        return raw(HandleReq{pick(c, kAh)});
      case Op::kDeallocMw:
        return raw(HandleReq{pick(c, kMw)});
      case Op::kAttachMcast:
      case Op::kDetachMcast: {
        // A QP (UD or not) and a group: one of four, or any 16 bytes.
        McastReq r;
        r.qp = pick(c, kQp);
        const uint8_t g = in.u8();
        if (g & 0x80)
          in.bytes(r.gid, 16);
        else
          wire::gid_from_ipv4(0xef000000u | (g % 4), r.gid);
        return raw(r);
      }
      default:
        return raw(HandleReq{in.u32()});
    }
  }

  void request() {
    const uint8_t sel = in.u8();
    const int c = sel & 1;
    uint16_t opn;
    switch ((sel >> 1) % 8) {
      case 6:
        opn = in.u16();
        break;
      case 7: {
        const uint8_t b = in.u8();
        opn = b < 64 ? 150 + b % 2 : 125 + b % 75;
        break;
      }
      default:
        opn = 100 + in.u8() % 27;
    }
    const Op op = static_cast<Op>(opn);
    const uint8_t shape = in.u8() % 16;
    std::vector<int> fds;
    std::string b;
    if (shape < 12 || shape >= 13) b = body(c, op, &fds);
    if (shape == 12) {
      b.resize(in.u8());
      for (auto& ch : b) ch = static_cast<char>(in.u8());
      if (in.u8() & 1) fds.push_back(sock(c, true));
    } else if (shape == 13) {
      const uint8_t d = in.u8();
      const size_t n = 1 + d % 4;
      if (d & 0x80)
        b.resize(b.size() > n ? b.size() - n : 0);
      else
        b.append(n, static_cast<char>(d));
    } else if (shape == 14) {
      b.clear();
    } else if (shape == 15) {
      for (int k = in.u8() % 4; k > 0 && !b.empty(); --k) {
        const uint16_t at = in.u16();
        b[at % b.size()] = static_cast<char>(in.u8());
      }
    }
    CtlRequest req{&cl[c].ci, static_cast<ctl::Op>(opn), b, fds};
    CtlReply rep;
    srv.handle(req, rep);
    for (int fd : fds)
      if (fd >= 0) close(fd);  // what ControlServer does
    if (trace)
      std::fprintf(stderr, "client %d op %u body %zu: %d %s\n", c, opn,
                   b.size(), rep.status, rep.status ? rep.payload.c_str() : "");
    CHECK(rep.status <= 0 && rep.status > -4096);
    if (rep.status < 0) {
      CHECK(rep.fds.empty());
      CHECK(!rep.payload.empty());
      return;
    }
    if (ShimServer::is_shim_op(opn) && opn <= 123)
      CHECK(rep.payload.size() == reply_size(op));
    learn(c, op, b, rep);
    for (int fd : rep.fds) close(fd);
  }

  template <typename T>
  static T as(const std::string& s) {
    T v{};
    std::memcpy(&v, s.data(), std::min(sizeof v, s.size()));
    return v;
  }

  // A successful reply: its handles, keys and memory.
  void learn(int c, Op op, const std::string& body, const CtlReply& rep) {
    Client& k = cl[c];
    const int fd = rep.fds.empty() ? -1 : rep.fds[0];
    const HandleReq hr = as<HandleReq>(body);
    switch (op) {
      case Op::kOpen:
        CHECK(rep.fds.size() == 1);
        k.db = static_cast<DoorbellPage*>(
            map_fd(c, fd, page_round(sizeof(DoorbellPage))));
        break;
      case Op::kAllocPd:
        k.h[kPd].push_back(as<HandleRep>(rep.payload).handle);
        break;
      case Op::kCreateChannel:
        k.h[kCh].push_back(as<HandleRep>(rep.payload).handle);
        break;
      case Op::kCreateAh:
        k.h[kAh].push_back(as<HandleRep>(rep.payload).handle);
        break;
      case Op::kAllocMw:
        k.h[kMw].push_back(as<AllocMwRep>(rep.payload).handle);
        break;
      case Op::kRegMr: {
        const auto m = as<RegMrRep>(rep.payload);
        const auto r = as<RegMrReq>(body);
        k.h[kMr].push_back(m.handle);
        k.mrs.push_back({m.lkey, m.rkey, r.iova, r.length});
        break;
      }
      case Op::kCreateCq:
      case Op::kResizeCq: {
        CHECK(rep.fds.size() == 1);
        const auto r = as<CreateCqRep>(rep.payload);
        if (op == Op::kCreateCq) k.h[kCq].push_back(r.handle);
        if (auto* p = static_cast<CqShared*>(map_fd(c, fd, r.map_len)))
          k.cqs.push_back(p);
        break;
      }
      case Op::kCreateSrq: {
        CHECK(rep.fds.size() == 1);
        const auto r = as<CreateSrqRep>(rep.payload);
        k.h[kSrq].push_back(r.handle);
        if (auto* p = static_cast<SrqShared*>(map_fd(c, fd, r.map_len)))
          k.srqs.push_back({p, r.max_wr, r.doorbell,
                            reinterpret_cast<ShmRecvWqe*>(
                                reinterpret_cast<uint8_t*>(p) + p->offset)});
        break;
      }
      case Op::kCreateQp: {
        CHECK(rep.fds.size() == 1);
        const auto r = as<CreateQpRep>(rep.payload);
        k.h[kQp].push_back(r.handle);
        auto* base = static_cast<uint8_t*>(map_fd(c, fd, r.map_len));
        if (!base) break;
        auto* sh = reinterpret_cast<QpShared*>(base);
        CHECK(sh->sq_size == r.cap.max_send_wr);
        CHECK(sh->rq_size == r.cap.max_recv_wr);
        CHECK(r.map_len == qp_shared_len(sh->sq_size, sh->rq_size));
        k.qps.push_back({sh, sh->sq_size, sh->rq_size, r.doorbell, r.qpn,
                         reinterpret_cast<ShmSendWqe*>(base + sh->sq_offset),
                         reinterpret_cast<ShmRecvWqe*>(base + sh->rq_offset)});
        break;
      }
      case Op::kDeallocPd:
        drop(c, kPd, hr.handle);
        break;
      case Op::kDeregMr:
        drop(c, kMr, hr.handle);
        break;
      case Op::kReregMr: {
        const auto r = as<ReregMrReq>(body);
        CHECK(as<RegMrRep>(rep.payload).handle == r.handle);
        drop(c, kMr, r.fresh);
        break;
      }
      case Op::kDestroyChannel:
        drop(c, kCh, hr.handle);
        break;
      case Op::kDestroyCq:
        drop(c, kCq, hr.handle);
        break;
      case Op::kDestroySrq:
        drop(c, kSrq, hr.handle);
        break;
      case Op::kDestroyQp:
        drop(c, kQp, hr.handle);
        break;
      case Op::kDestroyAh:
        drop(c, kAh, hr.handle);
        break;
      case Op::kDeallocMw:
        drop(c, kMw, hr.handle);
        break;
      default:
        break;
    }
  }

  // --- the lcore side and shared memory -----------------------------------
  void run() {
    for (int i = 0; i < 64; ++i) {
      uint32_t work = 0;
      now += 1'000'000;
      for (uint32_t h = 0; h < 2; ++h) {
        // As a worker about to wait: marked waiting in every client's
        // page, polled once more, unmarked (Worker::announce_st).
        if (i & 1) srv.set_waiting_st(h, true);
        work += srv.doorbells_st(h, &rung);
        if (i & 1) srv.set_waiting_st(h, false);
        work += engine(h).poll(now);
      }
      for (int f = 0; f < 64 && !io.frames.empty(); ++f) {
        std::vector<uint8_t> b = std::move(io.frames.front());
        io.frames.pop_front();
        wire::FrameInfo fi;
        wire::decode(b.data(), static_cast<uint32_t>(b.size()), fi);
        if (fi.kind != wire::FrameKind::kRoce) continue;
        const wire::ConstBuf seg{b.data(), static_cast<uint32_t>(b.size())};
        engine(eng0.home_of(fi.roce.dqpn)).rx(fi, {&seg, 1}, now);
        ++work;
      }
      if (!work) return;
    }
  }

  ShmSge sge(const Client& k) {
    ShmSge s{};
    const uint8_t b = in.u8();
    if (!k.mrs.empty() && b < 224) {
      const MrInfo& m = k.mrs[b % k.mrs.size()];
      const uint64_t off = m.len ? in.u16() % m.len : 0;
      s.addr = m.iova + off;
      s.length = static_cast<uint32_t>(
          std::min<uint64_t>(in.u16() % 9000, m.len - std::min(off, m.len)));
      s.lkey = m.lkey;
    } else {
      s.addr = in.u64();
      s.length = in.u32();
      s.lkey = in.u32();
    }
    return s;
  }

  void scribble() {
    const int c = in.u8() & 1;
    Client& k = cl[c];
    const uint8_t what = in.u8();
    uint32_t ring = UINT32_MAX;
    switch (what % 8) {
      case 0:
      case 1: {  // a send WQE
        if (k.qps.empty()) break;
        QpMap& q = k.qps[in.u8() % k.qps.size()];
        if (!q.sq_size) break;
        ShmSendWqe w{};
        w.wr_id = in.u8();
        const uint8_t o = in.u8();
        w.opcode = o < 240 ? o % 12 : in.u32();
        w.send_flags = in.u8() & 0xf;
        const uint8_t n = in.u8();
        w.num_sge = n < 250 ? n % 4 : in.u32();
        for (uint32_t i = 0; i < std::min(w.num_sge, 3u); ++i)
          w.sge[i] = sge(k);
        if (w.send_flags & IBV_SEND_INLINE) {
          w.inline_len = n < 250 ? in.u8() : in.u32();
        }
        const ShmSge remote = sge(k);
        uint32_t rkey = remote.lkey;
        for (auto& m : k.mrs)
          if (m.lkey == remote.lkey) rkey = m.rkey;
        w.remote_addr = in.u8() & 1 ? remote.addr & ~uint64_t{7} : in.u64();
        w.rkey = rkey;
        w.compare_add = in.u64();
        w.swap = in.u64();
        w.imm_data = in.u32();
        w.ah = pick(c, kAh);
        w.remote_qpn = q.qpn;
        if (!k.qps.empty()) w.remote_qpn = k.qps[in.u8() % k.qps.size()].qpn;
        w.remote_qkey = in.u32();
        w.bind_lkey = in.u32();
        const uint32_t p = q.sh->sq_prod.load(std::memory_order_relaxed);
        q.sq[p & (q.sq_size - 1)] = w;
        q.sh->sq_prod.store(p + 1, std::memory_order_release);
        ring = q.doorbell;
        break;
      }
      case 2: {  // a receive WQE (QP or SRQ)
        ShmRecvWqe w{};
        w.wr_id = in.u8();
        const uint8_t n = in.u8();
        w.num_sge = n < 250 ? n % 4 : in.u32();
        for (uint32_t i = 0; i < std::min(w.num_sge, 3u); ++i)
          w.sge[i] = sge(k);
        if (in.u8() & 1 && !k.srqs.empty()) {
          SrqMap& s = k.srqs[in.u8() % k.srqs.size()];
          const uint32_t p = s.sh->prod.load(std::memory_order_relaxed);
          s.ring[p & (s.size - 1)] = w;
          s.sh->prod.store(p + 1, std::memory_order_release);
          ring = s.doorbell;
        } else if (!k.qps.empty()) {
          QpMap& q = k.qps[in.u8() % k.qps.size()];
          if (!q.rq_size) break;
          const uint32_t p = q.sh->rq_prod.load(std::memory_order_relaxed);
          q.rq[p & (q.rq_size - 1)] = w;
          q.sh->rq_prod.store(p + 1, std::memory_order_release);
          ring = q.doorbell;
        }
        break;
      }
      case 3: {  // hostile ring headers and indices
        const uint8_t t = in.u8();
        if (t & 1 && !k.qps.empty()) {
          QpMap& q = k.qps[in.u8() % k.qps.size()];
          if (t & 2) q.sh->sq_size = in.u32();
          if (t & 4) q.sh->rq_size = in.u32();
          if (t & 8) q.sh->sq_offset = in.u32();
          if (t & 16) q.sh->sq_prod.store(in.u32());
          if (t & 32) q.sh->rq_prod.store(in.u32());
          if (t & 64) q.sh->sq_done.store(in.u32());
          if (t & 128) q.sh->state.store(in.u32());
          ring = q.doorbell;
        } else if (!k.srqs.empty()) {
          SrqMap& s = k.srqs[in.u8() % k.srqs.size()];
          if (t & 2) s.sh->size = in.u32();
          if (t & 4) s.sh->offset = in.u32();
          if (t & 8) s.sh->prod.store(in.u32());
          if (t & 16) s.sh->done.store(in.u32());
          ring = s.doorbell;
        }
        break;
      }
      case 4: {  // the CQ's application words
        if (k.cqs.empty()) break;
        CqShared* q = k.cqs[in.u8() % k.cqs.size()];
        const uint8_t t = in.u8();
        if (t & 1) q->arm.store(t & 2 ? in.u32() : kArmAll);
        if (t & 4) q->cons.store(in.u32());
        if (t & 8) q->size = in.u32();
        if (t & 16) q->prod.store(in.u32());
        break;
      }
      case 5: {  // the doorbell page: any words
        if (!k.db) break;
        const uint8_t t = in.u8();
        if (t & 1) k.db->pending.store(in.u32());
        if (t & 2)
          k.db->summary[in.u8() % std::size(k.db->summary)].store(in.u64());
        if (t & 4) k.db->bits[in.u16() % std::size(k.db->bits)].store(in.u64());
        if (t & 8) k.db->closed.store(in.u32());
        if (t & 16) k.db->waiting.store(in.u32());
        break;
      }
      default: {  // raw bytes anywhere in a mapping of this client
        if (k.raw.empty()) break;
        const Map& m = k.raw[in.u8() % k.raw.size()];
        const size_t off = in.u32() % m.len;
        const size_t n = std::min<size_t>(in.u8() % 64, m.len - off);
        in.bytes(static_cast<uint8_t*>(m.p) + off, n);
        if (k.db && in.u8() & 1) k.db->pending.store(1);
      }
    }
    if (trace)
      std::fprintf(stderr, "client %d scribble %u ring %d\n", c, what % 8,
                   static_cast<int>(ring));
    if (ring != UINT32_MAX && k.db && !(what & 0x80))
      ring_doorbell(*k.db, ring);
    run();
  }

  void close_client(int c) {
    srv.on_close(cl[c].ci);
    cl[c].forget();  // the mappings stay until the input ends (harmless)
    for (int fd : cl[c].fds) close(fd);
    cl[c].fds.clear();
  }

  void drain_sockets() {
    char buf[512];
    for (auto& k : cl)
      for (int fd : k.fds)
        for (int i = 0; i < 64; ++i)
          if (recv(fd, buf, sizeof buf, MSG_DONTWAIT) <= 0) break;
  }

  void program(bool shutdown) {
    for (size_t n = 0; n < kMaxOps && !in.done(); ++n) {
      const uint8_t op = in.u8();
      switch (op % 16) {
        case 10:
          close_client(in.u8() & 1);
          break;
        case 11:
        case 12:
          scribble();
          break;
        case 13:
          run();
          break;
        case 14:
          srv.pump_events();
          (void)srv.objects_text();
          (void)srv.qp_owners();
          drain_sockets();
          break;
        case 15: {
          Client& k = cl[in.u8() & 1];
          const uint16_t idx = in.u16();
          if (k.db) ring_doorbell(*k.db, idx);
          run();
          break;
        }
        default:
          request();
      }
    }
    run();
    srv.pump_events();
    if (shutdown) {  // as urnicd stops: after the lcores, before the closes
      srv.shutdown();
      drain_sockets();
    }
    close_client(0);
    close_client(1);
    CHECK(srv.clients_open() == 0);
    for (const auto& [name, v] : srv.stats()) {
      const std::string s = name;
      if (s == "qps" || s == "cqs" || s == "mrs" || s == "pds" ||
          s == "clients_open")
        CHECK(v == 0);
    }
    if (trace)
      for (const auto& [name, v] : srv.stats())
        std::fprintf(stderr, "%s %llu\n", name,
                     static_cast<unsigned long long>(v));
    CHECK(dev.num_srqs() == 0);
    CHECK(dev.num_ahs() == 0);
    CHECK(dev.mcast_attached() == 0 && dev.mcast_groups() == 0);
    CHECK(srv.qp_count() == 0);
  }

  Reader& in;
  transport::Device dev;
  LoopIo io;
  transport::Engine eng0, eng1;
  service::LcoreGate gate0, gate1;
  ShimServer srv;
  Client cl[2];
  std::vector<Map> maps;
  uint32_t rung = 0;
  uint64_t now = 0;
  // FUZZ_SHIM_TRACE=1: each request, its status and the final stats on
  // stderr (to check what a seed does).
  const bool trace = std::getenv("FUZZ_SHIM_TRACE") != nullptr;
};

// Open fds of this process (to check that an input leaves none behind).
size_t open_fds() {
  size_t n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d)) ++n;
    closedir(d);
  }
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const size_t fds_before = open_fds();
  Reader in(data, size);
  const uint8_t setup = in.u8();
  config::ClientLimitsConfig limits;
  if (setup & 1) {
    limits.max_pd = 2;
    limits.max_cq = 2;
    limits.max_qp = 3;
    limits.max_mr = 2;
    limits.max_mr_bytes = 3 * 4096;
    limits.max_srq = 1;
    limits.max_ah = 1;
    limits.max_wr = 64;
  }
  {
    Fuzz f(in, limits);
    f.program(setup & 2);
  }
  CHECK(open_fds() == fds_before);  // the service's and ours, all closed
  return 0;
}
