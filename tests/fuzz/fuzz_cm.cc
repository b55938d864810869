// libFuzzer target: urnicd's RDMA CM (dataplane/service/cm_server.cc), two
// CmServers, A (10.99.0.1) and B (10.99.0.2), driven as in
// tests/unit/test_cm_server.cc: the input is a little program of ucma
// commands on up to 3 event channels per server, network actions on the CM
// MADs each server sent (deliver, drop, duplicate, corrupt), forged MADs,
// time and channel closes. Checked after each operation and at the end
// (abort() when broken), besides what the sanitizers catch:
//   - every event read from a channel's socket is a whole CmEventMsg with a
//     known event number, for an id its server created (CREATE_ID) or
//     announced (CONNECT_REQUEST); ids are never handed out twice (once an
//     application closed its end of an event socket, announcements may be
//     lost: then any id the server can have given out passes);
//   - cm_channels is the number of channels open, cm_ids at most the ids
//     created plus one per MAD received;
//   - once every channel is closed and the timers have run out, both servers
//     report cm_ids 0, cm_channels 0, cm_mcast_groups 0 and cm_listening 0.
// Every fd a server holds is closed before the input ends (the event socket
// pairs themselves are kept for the next input: Pairs).
//
// Program format (tests/fuzz/cm_seeds.py writes seeds in it; keep the two in
// step). Bytes past the input's end read as 0. Each operation is one byte
// `op`, its kind op % 16, then its operands:
//   0      OPEN   slot flags       slot % 6: A's channels 0-2, B's 3-5.
//                                  flags: 1 bad ABI, 2 body one byte long,
//                                  4 no fd, 8 small socket buffer,
//                                  16 another uid (MIGRATE_ID refuses)
//   1-5    CMD    slot sel mode args...  a ucma command (see command())
//   6,7,15 NET    src idx action [patches]  one frame that src&1 (A, B) sent
//   8      INJECT to src hdr ...   a MAD from outside (see inject())
//   9,10   TIME   amount(u16) how  now += amount ms (x10 if how&4), then
//                                  how%4: 1 A ticks, 2 B ticks, else both
//   11     CLOSE  slot             the control connection closes
//   12     ENV    node mode        node&1's neighbour answer: mode%3 0 known,
//                                  1 EINPROGRESS, 2 EHOSTUNREACH
//   13     STALL  slot what        what%3: 0 stop reading its events, 1 read
//                                  them again, 2 the application closes its
//                                  end of the event socket
//   14     SHUTDOWN node           CmServer::shutdown
// Multi-byte numbers are little-endian.
#include <arpa/inet.h>
#include <endian.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "dataplane/service/cm_server.h"
#include "dataplane/wire/cm_mad.h"
#include "dataplane/wire/codec.h"
#include "dataplane/wire/opcode.h"

namespace {

using namespace urnic;
using service::CmEnv;
using service::CmServer;
using service::CtlReply;
using service::CtlRequest;
namespace cm = wire::cm;

constexpr uint32_t kIp[2] = {0x0a630001, 0x0a630002};  // 10.99.0.1, .2
// Other hosts on the link (not urnic), and one off it (no route).
constexpr uint32_t kIpThird = 0x0a630003, kIpUnknown = 0x0a630009,
                   kIpOffLink = 0x0a620001;
constexpr uint16_t kPort = 7174;
constexpr uint64_t kMs = 1'000'000;
constexpr int kSlotsPerNode = 3;
constexpr int kSlots = 2 * kSlotsPerNode;
constexpr size_t kMaxFrames = 64;   // per node, oldest dropped
constexpr size_t kMaxHistory = 32;  // MADs kept as templates
constexpr int kMaxOps = 1000;

bool trace_on() {
  static const bool on = getenv("URNIC_FUZZ_CM_TRACE") != nullptr;
  return on;
}
#define TRACE(...)                  \
  do {                              \
    if (trace_on()) {               \
      fprintf(stderr, __VA_ARGS__); \
      fputc('\n', stderr);          \
    }                               \
  } while (0)

[[noreturn]] void fail(const char* what, uint64_t a = 0, uint64_t b = 0) {
  fprintf(stderr, "fuzz_cm: invariant broken: %s (%llu, %llu)\n", what,
          static_cast<unsigned long long>(a),
          static_cast<unsigned long long>(b));
  abort();
}

struct Reader {
  const uint8_t* p;
  size_t n;
  size_t i = 0;
  bool done() const { return i >= n; }
  uint8_t u8() { return i < n ? p[i++] : 0; }
  uint16_t u16() {
    const uint16_t lo = u8();
    return static_cast<uint16_t>(lo | u8() << 8);
  }
  uint32_t u32() {
    const uint32_t lo = u16();
    return lo | uint32_t{u16()} << 16;
  }
  uint64_t u64() {
    const uint64_t lo = u32();
    return lo | uint64_t{u32()} << 32;
  }
  void bytes(uint8_t* out, size_t k) {
    for (size_t j = 0; j < k; ++j) out[j] = u8();
  }
};

template <typename T>
std::string bytes_of(const T& v) {
  return std::string(reinterpret_cast<const char*>(&v), sizeof v);
}

// Event socket pairs outlive an input: creating one and tearing it down
// was a third of this target's time (syscalls are dear in a VM). The server
// gets a dup of the pair's service end, as ControlServer hands it the fd
// that came with a request; the pair comes back here once the server closed
// its dup, read empty and with its send buffer as it was. A pair whose
// application end was closed (STALL) is closed, not reused.
class Pairs {
 public:
  struct Pair {
    int app = -1, svc = -1;
    bool small = false;  // the service end's send buffer was shrunk
  };
  Pair get() {
    if (!free_.empty()) {
      const Pair p = free_.back();
      free_.pop_back();
      return p;
    }
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
      fail("socketpair", errno);
    if (!sndbuf_) {
      socklen_t len = sizeof sndbuf_;
      getsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &sndbuf_, &len);
    }
    return {sv[0], sv[1]};
  }
  void shrink(Pair& p) {
    const int small = 1;  // the kernel's minimum
    setsockopt(p.svc, SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
    p.small = true;
  }
  void put(Pair p) {
    if (p.app < 0) {
      close(p.svc);
      return;
    }
    shim::CmEventMsg m;
    while (recv(p.app, &m, sizeof m, MSG_DONTWAIT | MSG_TRUNC) > 0) {
    }
    if (p.small) {
      const int v = sndbuf_ / 2;  // the kernel doubles what it is given
      setsockopt(p.svc, SOL_SOCKET, SO_SNDBUF, &v, sizeof v);
      p.small = false;
    }
    free_.push_back(p);
  }

 private:
  std::vector<Pair> free_;
  int sndbuf_ = 0;
};

Pairs& pairs() {
  static Pairs p;
  return p;
}

// One urnicd's CM, the frames it handed to a worker, and what the
// application side has learnt from it.
struct Node {
  int index = 0;
  uint32_t ip = 0;
  uint64_t guid = 0;
  std::unique_ptr<CmServer> srv;
  std::deque<std::vector<uint8_t>> tx;
  int neighbour = 0;
  uint64_t next_client = 1;
  std::unordered_set<uint32_t> known;  // ids created or announced
  uint64_t creates = 0;                // successful CREATE_IDs
  int open = 0;                        // channels open
  // An application closed its end of an event socket while the channel
  // stayed open: events (an announcement among them) may have been lost.
  bool lossy = false;
  uint64_t events_seen = 0;  // cm_events when the fuzzer last looked
};

// An event channel slot: a control connection with its event socket.
struct Slot {
  Node* node = nullptr;
  service::ClientInfo ci;
  bool open = false;
  // The event socket pair while the channel is open; pair.app is the
  // application's end, -1 once it closed it.
  Pairs::Pair pair;
  bool stalled = false;
  uint64_t token = 0;
};

struct Deferred {
  Node* node;
  shim::CmEventMsg m;
};

class World {
 public:
  World() {
    for (int i = 0; i < 2; ++i) start(nodes_[i], i);
    for (int s = 0; s < kSlots; ++s)
      slots_[s].node = &nodes_[s / kSlotsPerNode];
  }
  ~World() {
    for (auto& s : slots_) close_slot(s);
  }

  void run(Reader& r) {
    for (int ops = 0; !r.done() && ops < kMaxOps; ++ops) {
      const uint8_t op = r.u8();
      switch (op % 16) {
        case 0:
          open(r);
          break;
        case 1:
        case 2:
        case 3:
        case 4:
        case 5:
          command(r);
          break;
        case 6:
        case 7:
        case 15:
          net(r);
          break;
        case 8:
          inject(r);
          break;
        case 9:
        case 10:
          time(r);
          break;
        case 11:
          close_slot(slots_[r.u8() % kSlots]);
          break;
        case 12: {
          Node& n = nodes_[r.u8() & 1];
          static constexpr int kAnswers[3] = {0, EINPROGRESS, EHOSTUNREACH};
          n.neighbour = kAnswers[r.u8() % 3];
          break;
        }
        case 13:
          stall(r);
          break;
        case 14: {
          Node& n = nodes_[r.u8() & 1];
          TRACE("%c shutdown", 'A' + n.index);
          n.srv->shutdown(now_);
          break;
        }
      }
      after_op();
    }
    finish();
  }

 private:
  // --- setup --------------------------------------------------------------
  void start(Node& n, int i) {
    n.index = i;
    n.ip = kIp[i];
    n.guid = htobe64(0x0200'63ff'fe00'0001ull + i);
    CmEnv e;
    e.addrs.mac = {{0x02, 0, 0, 0, 0x63, static_cast<uint8_t>(n.ip)}};
    e.addrs.ipv4 = n.ip;
    e.addrs.ipv4_prefix = 24;
    e.sgid_index = 1;
    e.node_guid = n.guid;
    e.send_frame = [this, &n](const uint8_t*, const uint8_t* f, uint32_t len) {
      std::vector<uint8_t> fr(f, f + len);
      remember(fr);
      if (n.tx.size() >= kMaxFrames) n.tx.pop_front();
      n.tx.push_back(std::move(fr));
      return true;
    };
    e.neighbour = [&n](const uint8_t*) { return n.neighbour; };
    n.srv = std::make_unique<CmServer>(std::move(e));
    n.srv->tick(now_);
  }

  // A sent MAD, kept as a template for forged ones.
  void remember(const std::vector<uint8_t>& fr) {
    wire::FrameInfo fi;
    wire::decode(fr.data(), static_cast<uint32_t>(fr.size()), fi);
    if (fi.kind != wire::FrameKind::kRoce || fi.roce.payload_len < cm::kMadSize)
      return;
    std::array<uint8_t, cm::kMadSize> m;
    std::memcpy(m.data(), fr.data() + fi.payload_off, cm::kMadSize);
    if (history_.size() >= kMaxHistory) history_.pop_front();
    history_.push_back(m);
  }

  // --- control requests ---------------------------------------------------
  struct Res {
    int status = 0;
    std::string payload;
  };
  Res request(Slot& s, shim::Op op, const std::string& body,
              std::vector<int> fds = {}) {
    if (!s.ci.id) s.ci.id = s.node->next_client++;
    // Exactly the body's bytes on the heap, so that ASan sees any read past
    // them.
    std::unique_ptr<char[]> buf(new char[body.size()]);
    std::memcpy(buf.get(), body.data(), body.size());
    CtlRequest req{&s.ci, static_cast<ctl::Op>(op),
                   std::string_view(buf.get(), body.size()), fds};
    CtlReply rep;
    s.node->srv->handle(req, rep);
    for (int fd : fds)
      if (fd >= 0) close(fd);  // what ControlServer does with the rest
    if (rep.status > 0) fail("positive reply status", rep.status);
    if (!rep.fds.empty()) fail("CM reply with fds", rep.fds.size());
    return {rep.status, rep.payload};
  }

  void open(Reader& r) {
    Slot& s = slots_[r.u8() % kSlots];
    const uint8_t flags = r.u8();
    Pairs::Pair p = pairs().get();
    if (flags & 8) pairs().shrink(p);
    const bool was_open = s.open;
    if (!was_open) {
      s.ci = {};
      s.ci.id = s.node->next_client++;
      s.ci.pid = 4242;
      s.ci.uid = (flags & 16) ? 1001 : 1000;
    }
    shim::CmOpenReq o;
    if (flags & 1) o.abi = shim::kShimAbi + 1;
    std::string body = bytes_of(o);
    if (flags & 2) body.resize(1);
    std::vector<int> fds;
    if (!(flags & 4)) fds.push_back(fcntl(p.svc, F_DUPFD_CLOEXEC, 0));
    const Res res = request(s, shim::Op::kCmOpen, body, fds);
    TRACE("%c open slot %d flags %x: %d", 'A' + s.node->index,
          static_cast<int>(&s - slots_), flags, res.status);
    if (res.status != 0 || was_open) {
      if (res.status == 0) fail("a second channel on one connection");
      pairs().put(p);
      return;
    }
    if (res.payload.size() != sizeof(shim::CmOpenRep))
      fail("CmOpenRep size", res.payload.size());
    shim::CmOpenRep rep;
    std::memcpy(&rep, res.payload.data(), sizeof rep);
    s.token = rep.token;
    s.open = true;
    s.pair = p;
    s.stalled = false;
    ++s.node->open;
  }

  // CMD: slot sel mode, then (modes 0-2) the command's operands:
  //   sel % 20: 0 CREATE_ID uid ps qpt | 1 DESTROY_ID id | 2 BIND_IP id addr
  //   port | 3 RESOLVE_IP id dst port src sport timeout | 4 RESOLVE_ROUTE id
  //   | 5 QUERY_ROUTE id option | 6 CONNECT id param | 7 LISTEN id backlog
  //   | 8 ACCEPT id uid param | 9 REJECT id reason pdlen | 10 DISCONNECT id
  //   | 11 INIT_QP_ATTR id state | 12 SET_OPTION id level name len value
  //   | 13 MIGRATE_ID id from | 14 NOTIFY id event | 15 BIND, 16 QUERY,
  //   17 RESOLVE_ADDR, 18 GET_EVENT id | 19 JOIN_IP_MCAST id group | 20
  //   JOIN_MCAST id group flags | 21 LEAVE_MCAST handle | 22 cmd(u32) id
  //   group: bit 7 clear: 239.0.0.(g & 3), else an address as put_addr's.
  //   id: a byte, 0xff: a u32 follows. param: qpn(u16) responder_resources
  //   initiator_depth retry rnr flags(1 flow control, 2 srq) pdlen valid.
  //   mode & 3: 0, 1 the struct as librdmacm writes it; 2 then resized by a
  //   signed byte; 3 raw: cmd sel as above, in(u16) % 1024, that many bytes.
  //   mode & 4: a malformed header: a byte, %3: 0 `in` one more than the
  //   body, 1 optlen past the maximum, 2 the body shorter than the header.
  void command(Reader& r) {
    Slot& s = slots_[r.u8() % kSlots];
    const uint8_t sel = r.u8() % 23;
    const uint8_t mode = r.u8();
    Node& n = *s.node;
    const uint32_t peer = kIp[n.index ^ 1];
    static constexpr uint32_t kCmds[23] = {RDMA_USER_CM_CMD_CREATE_ID,
                                           RDMA_USER_CM_CMD_DESTROY_ID,
                                           RDMA_USER_CM_CMD_BIND_IP,
                                           RDMA_USER_CM_CMD_RESOLVE_IP,
                                           RDMA_USER_CM_CMD_RESOLVE_ROUTE,
                                           RDMA_USER_CM_CMD_QUERY_ROUTE,
                                           RDMA_USER_CM_CMD_CONNECT,
                                           RDMA_USER_CM_CMD_LISTEN,
                                           RDMA_USER_CM_CMD_ACCEPT,
                                           RDMA_USER_CM_CMD_REJECT,
                                           RDMA_USER_CM_CMD_DISCONNECT,
                                           RDMA_USER_CM_CMD_INIT_QP_ATTR,
                                           RDMA_USER_CM_CMD_SET_OPTION,
                                           RDMA_USER_CM_CMD_MIGRATE_ID,
                                           RDMA_USER_CM_CMD_NOTIFY,
                                           RDMA_USER_CM_CMD_BIND,
                                           RDMA_USER_CM_CMD_QUERY,
                                           RDMA_USER_CM_CMD_RESOLVE_ADDR,
                                           RDMA_USER_CM_CMD_GET_EVENT,
                                           RDMA_USER_CM_CMD_JOIN_IP_MCAST,
                                           RDMA_USER_CM_CMD_JOIN_MCAST,
                                           RDMA_USER_CM_CMD_LEAVE_MCAST,
                                           0};
    shim::CmCommandReq q;
    q.cmd = sel == 22 ? r.u32() : kCmds[sel];
    // MIGRATE_ID moves events counted before into another socket.
    poll_due_ |= q.cmd == RDMA_USER_CM_CMD_MIGRATE_ID;
    q.out = 512;
    std::string body, opt;
    auto id_arg = [&]() -> uint32_t {
      const uint8_t v = r.u8();
      return v == 0xff ? r.u32() : v;
    };
    if ((mode & 3) == 3) {
      body.resize(r.u16() % 1024);
      r.bytes(reinterpret_cast<uint8_t*>(body.data()), body.size());
    } else {
      switch (sel) {
        case 0: {
          rdma_ucm_create_id c{};
          c.uid = 0x1000 | r.u8();
          static constexpr uint16_t kPs[4] = {cm::kPsTcp, cm::kPsUdp, cm::kPsIb,
                                              cm::kPsIpoib};
          const uint8_t ps = r.u8() % 5;
          c.ps = ps < 4 ? kPs[ps] : r.u16();
          const uint8_t qpt = r.u8() % 3;
          c.qp_type = qpt == 0 ? IBV_QPT_RC : qpt == 1 ? IBV_QPT_UD : r.u8();
          body = bytes_of(c);
          break;
        }
        case 1: {
          rdma_ucm_destroy_id c{};
          c.id = id_arg();
          body = bytes_of(c);
          break;
        }
        case 2: {
          rdma_ucm_bind_ip c{};
          c.id = id_arg();
          const uint8_t a = r.u8();
          put_addr(r, c.addr, a, port_arg(r), n.ip, peer);
          body = bytes_of(c);
          break;
        }
        case 3: {
          rdma_ucm_resolve_ip c{};
          c.id = id_arg();
          const uint8_t d = r.u8();
          put_addr(r, c.dst_addr, d, port_arg(r), n.ip, peer);
          const uint8_t sa = r.u8();
          const uint16_t sp = port_arg(r);
          if (!(sa & 0x80)) put_addr(r, c.src_addr, sa, sp, n.ip, peer);
          c.timeout_ms = r.u8() * 20u;
          body = bytes_of(c);
          break;
        }
        case 4: {
          rdma_ucm_resolve_route c{};
          c.id = id_arg();
          c.timeout_ms = 2000;
          body = bytes_of(c);
          break;
        }
        case 5: {
          rdma_ucm_query c{};
          c.id = id_arg();
          c.option = r.u8();
          body = bytes_of(c);
          break;
        }
        case 6: {
          rdma_ucm_connect c{};
          c.id = id_arg();
          conn_param(r, c.conn_param);
          body = bytes_of(c);
          break;
        }
        case 7: {
          rdma_ucm_listen c{};
          c.id = id_arg();
          const uint8_t b = r.u8();
          c.backlog = b == 0xff ? r.u32() : b;
          body = bytes_of(c);
          break;
        }
        case 8: {
          rdma_ucm_accept c{};
          c.id = id_arg();
          c.uid = 0x2000 | r.u8();
          conn_param(r, c.conn_param);
          body = bytes_of(c);
          break;
        }
        case 9: {
          rdma_ucm_reject c{};
          c.id = id_arg();
          c.reason = r.u8();
          c.private_data_len = r.u8();
          for (size_t i = 0; i < sizeof c.private_data; ++i)
            c.private_data[i] = static_cast<uint8_t>('r' + i);
          body = bytes_of(c);
          break;
        }
        case 10: {
          rdma_ucm_disconnect c{};
          c.id = id_arg();
          body = bytes_of(c);
          break;
        }
        case 11: {
          rdma_ucm_init_qp_attr c{};
          c.id = id_arg();
          c.qp_state = r.u8();
          body = bytes_of(c);
          break;
        }
        case 12: {
          rdma_ucm_set_option c{};
          c.id = id_arg();
          const uint8_t level = r.u8() % 3;
          c.level = level == 0   ? RDMA_OPTION_ID
                    : level == 1 ? RDMA_OPTION_IB
                                 : r.u32();
          c.optname = r.u8();
          const uint8_t len = r.u8();
          const uint8_t val = r.u8();
          static constexpr uint32_t kLens[3] = {1, sizeof(int), 0};
          const uint32_t optlen = (len & 3) < 3
                                      ? kLens[len & 3]
                                      : r.u16() % (shim::kCmMaxOption + 1);
          opt.assign(optlen, static_cast<char>(val));
          c.optlen = optlen + ((len & 0x80) ? 1 : 0);
          body = bytes_of(c);
          break;
        }
        case 13: {
          rdma_ucm_migrate_id c{};
          c.id = id_arg();
          const uint8_t from = r.u8();
          q.migrate_from = from == 0xff ? r.u64() : slots_[from % kSlots].token;
          body = bytes_of(c);
          break;
        }
        case 14: {
          rdma_ucm_notify c{};
          c.id = id_arg();
          c.event = r.u8();
          body = bytes_of(c);
          break;
        }
        case 19:
        case 20: {
          const uint32_t id = id_arg();
          const uint8_t g = r.u8();
          sockaddr_in6 a{};
          if (g & 0x80) {
            put_addr(r, a, r.u8(), port_arg(r), n.ip, peer);
          } else {
            auto* in = reinterpret_cast<sockaddr_in*>(&a);
            in->sin_family = AF_INET;
            in->sin_addr.s_addr = htonl(0xef000000u | (g & 3));
          }
          if (sel == 19) {
            rdma_ucm_join_ip_mcast c{};
            c.uid = 0x2000 | g;
            c.id = id;
            c.addr = a;
            body = bytes_of(c);
          } else {
            rdma_ucm_join_mcast c{};
            c.uid = 0x2000 | g;
            c.id = id;
            c.addr_size = (g & 0x40) ? r.u16() : sizeof(sockaddr_in);
            c.join_flags = (g & 0x20) ? r.u16() : (g >> 2) & 1;
            std::memcpy(&c.addr, &a, sizeof a);
            body = bytes_of(c);
          }
          break;
        }
        case 21: {
          rdma_ucm_destroy_id c{};
          c.id = id_arg();
          body = bytes_of(c);
          break;
        }
        default: {
          // Commands urnic refuses, or an unknown number: an id and zeros.
          body.assign(sizeof(rdma_ucm_resolve_addr), '\0');
          const uint32_t id = id_arg();
          std::memcpy(body.data(), &id, sizeof id);
          break;
        }
      }
      if ((mode & 3) == 2) {
        const int delta = static_cast<int8_t>(r.u8());
        body.resize(static_cast<size_t>(
            std::max(0, static_cast<int>(body.size()) + delta)));
      }
    }
    q.in = static_cast<uint16_t>(body.size());
    q.optlen = static_cast<uint32_t>(opt.size());
    std::string msg = bytes_of(q) + body + opt;
    if (mode & 4) {
      switch (r.u8() % 3) {
        case 0:
          ++q.in;
          msg = bytes_of(q) + body + opt;
          break;
        case 1:
          opt.assign(shim::kCmMaxOption + 1, 'o');
          q.optlen = static_cast<uint32_t>(opt.size());
          msg = bytes_of(q) + body + opt;
          break;
        case 2:
          msg.resize(sizeof q - 1);
          break;
      }
    }
    const Res res = request(s, shim::Op::kCmCommand, msg);
    TRACE("%c slot %d cmd %u in %u: %d %s", 'A' + n.index,
          static_cast<int>(&s - slots_), q.cmd, q.in, res.status,
          res.status ? res.payload.c_str() : "");
    if (res.status == 0 && q.cmd == RDMA_USER_CM_CMD_CREATE_ID) {
      if (res.payload.size() != sizeof(rdma_ucm_create_id_resp))
        fail("CREATE_ID reply size", res.payload.size());
      rdma_ucm_create_id_resp c;
      std::memcpy(&c, res.payload.data(), sizeof c);
      if (c.id == 0 || !n.known.insert(c.id).second)
        fail("CREATE_ID gave an id in use or 0", c.id);
      ++n.creates;
      TRACE("%c   id %u", 'A' + n.index, c.id);
    }
  }

  static uint16_t port_arg(Reader& r) {
    const uint8_t p = r.u8();
    switch (p) {
      case 0:
        return 0;
      case 1:
        return kPort;
      case 2:
        return kPort + 1;
      case 3:
        return r.u16();
      default:
        return static_cast<uint16_t>(32768 + p);
    }
  }

  // sel & 7: 0 own address, 1 the peer's, 2 0, 3 an unknown neighbour,
  // 4 off the link, 5 a third host, 6 a u32 follows, 7 broadcast. sel >> 3
  // & 3: AF_INET, AF_INET6 (::ffff:a.b.c.d or ::), a global IPv6 address,
  // a u16 family.
  static void put_addr(Reader& r, sockaddr_in6& slot, uint8_t sel,
                       uint16_t port, uint32_t own, uint32_t peer) {
    uint32_t ip = 0;
    switch (sel & 7) {
      case 0:
        ip = own;
        break;
      case 1:
        ip = peer;
        break;
      case 2:
        ip = 0;
        break;
      case 3:
        ip = kIpUnknown;
        break;
      case 4:
        ip = kIpOffLink;
        break;
      case 5:
        ip = kIpThird;
        break;
      case 6:
        ip = r.u32();
        break;
      case 7:
        ip = 0x0a6300ff;
        break;
    }
    std::memset(&slot, 0, sizeof slot);
    switch (sel >> 3 & 3) {
      case 0: {
        sockaddr_in s{};
        s.sin_family = AF_INET;
        s.sin_port = htons(port);
        s.sin_addr.s_addr = htonl(ip);
        std::memcpy(&slot, &s, sizeof s);
        break;
      }
      case 1:
        slot.sin6_family = AF_INET6;
        slot.sin6_port = htons(port);
        if (ip) {
          slot.sin6_addr.s6_addr[10] = slot.sin6_addr.s6_addr[11] = 0xff;
          const uint32_t be = htonl(ip);
          std::memcpy(&slot.sin6_addr.s6_addr[12], &be, 4);
        }
        break;
      case 2:
        slot.sin6_family = AF_INET6;
        slot.sin6_port = htons(port);
        slot.sin6_addr.s6_addr[0] = 0x20;
        slot.sin6_addr.s6_addr[1] = 0x01;
        slot.sin6_addr.s6_addr[15] = 1;
        break;
      case 3:
        slot.sin6_family = r.u16();
        slot.sin6_port = htons(port);
        std::memcpy(&slot.sin6_addr.s6_addr[12], &ip, 4);
        break;
    }
  }

  static void conn_param(Reader& r, rdma_ucm_conn_param& p) {
    p.qp_num = r.u16();
    p.responder_resources = r.u8();
    p.initiator_depth = r.u8();
    p.retry_count = r.u8();
    p.rnr_retry_count = r.u8();
    const uint8_t f = r.u8();
    p.flow_control = f & 1;
    p.srq = f >> 1 & 1;
    p.private_data_len = r.u8();
    p.valid = r.u8();
    for (size_t i = 0; i < sizeof p.private_data; ++i)
      p.private_data[i] = static_cast<uint8_t>('p' + i);
  }

  // --- the network --------------------------------------------------------
  // NET src idx action: action % 8: 0-2 deliver, 3 drop, 4 deliver a copy
  // (kept to deliver again), 5 deliver with MAD bytes patched (npatch % 8,
  // then offset value pairs), 6 deliver with header fields changed (a
  // byte: 1 opcode, 2 Q_Key, 4 source GID, 8 not IPv4, 16 DQPN), 7 deliver
  // to the sender itself.
  void net(Reader& r) {
    Node& from = nodes_[r.u8() & 1];
    const uint8_t idx = r.u8();
    const uint8_t action = r.u8() % 8;
    if (from.tx.empty()) return;
    const size_t i = idx % from.tx.size();
    std::vector<uint8_t> fr = from.tx[i];
    if (action != 4) from.tx.erase(from.tx.begin() + static_cast<long>(i));
    if (action == 3) return;
    wire::FrameInfo fi;
    wire::decode(fr.data(), static_cast<uint32_t>(fr.size()), fi);
    if (fi.kind != wire::FrameKind::kRoce) fail("a CM frame does not decode");
    Node* to = nullptr;
    for (Node& n : nodes_) {
      uint8_t g[16];
      wire::gid_from_ipv4(n.ip, g);
      if (std::memcmp(g, fi.roce.dgid, 16) == 0) to = &n;
    }
    if (action == 7) to = &from;
    TRACE("net %c -> %s: action %u", 'A' + from.index,
          to ? (to->index ? "B" : "A") : "-", action);
    if (!to) return;  // a host that is not here
    std::vector<uint8_t> mad(fr.begin() + fi.payload_off,
                             fr.begin() + fi.payload_off + fi.roce.payload_len);
    wire::RoceFields f = fi.roce;
    if (action == 5) patch(r, mad.data(), mad.size());
    if (action == 6) change_fields(r, f);
    deliver(*to, f, mad);
  }

  static void patch(Reader& r, uint8_t* mad, size_t len) {
    const uint8_t np = r.u8() % 8;
    for (uint8_t k = 0; k < np; ++k) {
      const uint8_t off = r.u8();
      const uint8_t val = r.u8();
      if (off < len) mad[off] = val;
    }
  }

  static void change_fields(Reader& r, wire::RoceFields& f) {
    const uint8_t c = r.u8();
    if (c & 1) f.opcode = r.u8();
    if (c & 2) f.deth_qkey = r.u32();
    if (c & 4) f.sgid[15] = r.u8();
    if (c & 8) f.sgid[10] = 0;
    if (c & 16) f.dqpn = r.u8();
  }

  // rx with exactly the MAD's bytes on the heap.
  void deliver(Node& to, const wire::RoceFields& f,
               const std::vector<uint8_t>& mad) {
    std::unique_ptr<uint8_t[]> buf(new uint8_t[mad.size()]);
    std::memcpy(buf.get(), mad.data(), mad.size());
    to.srv->rx(f, buf.get(), static_cast<uint32_t>(mad.size()), now_);
  }

  // INJECT to src hdr ...: a MAD to node to&1 from src % 4: 0 the peer, 1
  // itself, 2 a third host, 3 a non-IPv4 GID. to & 2: a changed header
  // field follows (as NET action 6). hdr % 4: 0 a MAD the servers sent (a
  // byte picks it, 0 the newest) with bytes patched (as NET action 5); 1 an
  // answer to one: picked so, then attr (a byte, % 9 + 0x10), its comm IDs
  // swapped (but for SIDR), the rest of the message zero, then patched; 2 a
  // valid header, attr (a byte: % 9 + 0x10, 0xff: a u16 follows) and tid (a
  // byte), then a byte n and n bytes of message; 3 256 raw bytes. Then a
  // length byte: < 0xf8 the MAD is 256 bytes, else a byte gives it.
  void inject(Reader& r) {
    const uint8_t t = r.u8();
    Node& to = nodes_[t & 1];
    const uint8_t src = r.u8() % 4;
    const uint8_t hdr = r.u8() % 4;
    std::vector<uint8_t> mad(cm::kMadSize, 0);
    if (hdr < 2) {
      const uint8_t k = r.u8();
      if (!history_.empty())
        std::memcpy(mad.data(),
                    history_[history_.size() - 1 - k % history_.size()].data(),
                    cm::kMadSize);
      if (hdr == 1) {
        const uint16_t attr = static_cast<uint16_t>(0x10 + r.u8() % 9);
        mad[16] = static_cast<uint8_t>(attr >> 8);
        mad[17] = static_cast<uint8_t>(attr);
        if (attr != static_cast<uint16_t>(cm::Attr::kSidrReq) &&
            attr != static_cast<uint16_t>(cm::Attr::kSidrRep)) {
          uint8_t ids[8];
          std::memcpy(ids, &mad[24], 8);
          std::memcpy(&mad[24], ids + 4, 4);
          std::memcpy(&mad[28], ids, 4);
          std::memset(&mad[32], 0, cm::kMadSize - 32);
        } else {
          std::memset(&mad[28], 0, cm::kMadSize - 28);
        }
      }
      patch(r, mad.data(), mad.size());
    } else if (hdr == 2) {
      cm::MadHdr h;
      const uint8_t a = r.u8();
      h.attr_id = a == 0xff ? r.u16() : static_cast<uint16_t>(0x10 + a % 9);
      h.tid = r.u8();
      cm::encode_hdr(h, mad.data());
      const uint8_t nb = r.u8();
      r.bytes(mad.data() + cm::kMadHdrSize, std::min<size_t>(nb, cm::kMsgSize));
    } else {
      r.bytes(mad.data(), mad.size());
    }
    const uint8_t l = r.u8();
    if (l >= 0xf8) mad.resize(r.u8());
    wire::RoceFields f;
    const uint32_t sip = src == 0   ? kIp[to.index ^ 1]
                         : src == 1 ? to.ip
                                    : kIpThird;
    wire::gid_from_ipv4(sip, f.sgid);
    if (src == 3) f.sgid[10] = f.sgid[11] = 0;
    wire::gid_from_ipv4(to.ip, f.dgid);
    f.udp_sport = static_cast<uint16_t>(0xc000 | t >> 3);
    f.opcode = wire::opcode::kUdSendOnly;
    f.dqpn = 1;
    f.deth_qkey = cm::kQp1Qkey;
    f.deth_src_qp = 1;
    f.payload_len = static_cast<uint32_t>(mad.size());
    if (t & 2) change_fields(r, f);
    TRACE("inject -> %c: src %u hdr %u len %zu", 'A' + to.index, src, hdr,
          mad.size());
    deliver(to, f, mad);
  }

  void time(Reader& r) {
    const uint16_t amount = r.u16();
    const uint8_t how = r.u8();
    now_ += amount * kMs * ((how & 4) ? 10 : 1);
    TRACE("time +%u%s", amount, (how & 4) ? "0" : "");
    poll_due_ = true;  // a tick sends what waited in a backlog
    // urnicd asks busy() to choose how long to wait before the next tick.
    for (Node& n : nodes_) (void)n.srv->busy();
    if (how % 4 != 2) nodes_[0].srv->tick(now_);
    if (how % 4 != 1) nodes_[1].srv->tick(now_);
  }

  void close_slot(Slot& s) {
    if (!s.open) return;
    TRACE("%c close slot %d", 'A' + s.node->index,
          static_cast<int>(&s - slots_));
    drain(s);
    s.node->srv->on_close(s.ci);  // closes its dup of the service end
    pairs().put(s.pair);
    s.pair = {};
    s.open = false;
    s.stalled = false;
    s.ci.id = 0;  // the next open is another connection
    --s.node->open;
  }

  void stall(Reader& r) {
    poll_due_ = true;  // a channel read again has its events waiting
    Slot& s = slots_[r.u8() % kSlots];
    const uint8_t what = r.u8() % 3;
    if (!s.open || s.pair.app < 0) return;
    if (what == 0) s.stalled = true;
    if (what == 1) s.stalled = false;
    if (what == 2) {
      drain(s);
      close(s.pair.app);
      s.pair.app = -1;
      s.node->lossy = true;
    }
  }

  // --- checks -------------------------------------------------------------
  // ADDR_RESOLVED .. TIMEWAIT_EXIT, MULTICAST_JOIN and _ERROR, ADDR_CHANGE.
  static bool valid_event(uint32_t e) { return e <= 13 || e == 15; }

  void drain(Slot& s) {
    if (s.pair.app < 0) return;
    for (;;) {
      shim::CmEventMsg m;
      const ssize_t got =
          recv(s.pair.app, &m, sizeof m, MSG_DONTWAIT | MSG_TRUNC);
      if (got < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
        fail("recv on an event socket", errno);
      }
      if (got == 0) return;  // the service closed its end
      if (got != static_cast<ssize_t>(sizeof m))
        fail("event message size", static_cast<uint64_t>(got));
      ++events_read_;
      check_event(*s.node, m);
    }
  }

  void check_event(Node& n, const shim::CmEventMsg& m) {
    TRACE("%c   event %u id %u (count %u) status %d", 'A' + n.index,
          m.resp.event, m.resp.id, m.count_id,
          static_cast<int32_t>(m.resp.status));
    if (!valid_event(m.resp.event)) fail("event number", m.resp.event);
    if (m.resp.event == 4) {  // CONNECT_REQUEST: announces resp.id
      if (m.resp.id == 0 || !n.known.insert(m.resp.id).second)
        fail("CONNECT_REQUEST for an id in use or 0", m.resp.id);
      if (!n.known.count(m.count_id)) deferred_.push_back({&n, m});
      return;
    }
    if (m.resp.event == 12 || m.resp.event == 13) {
      // MULTICAST_JOIN/ERROR: resp.id is the membership's handle, counted
      // against the id that joined.
      if (!n.known.count(m.count_id))
        fail("a multicast event for an id never created", m.count_id);
      return;
    }
    if (m.count_id != m.resp.id)
      fail("count_id of an event", m.count_id, m.resp.id);
    if (!n.known.count(m.resp.id)) deferred_.push_back({&n, m});
  }

  // An event whose id is not known yet may be for an id whose
  // CONNECT_REQUEST waits in a channel not read yet (MIGRATE_ID, STALL).
  void recheck(bool final) {
    for (auto it = deferred_.begin(); it != deferred_.end();) {
      Node& n = *it->node;
      const uint32_t id =
          it->m.resp.event == 4 ? it->m.count_id : it->m.resp.id;
      if (n.known.count(id)) {
        it = deferred_.erase(it);
        continue;
      }
      if (final) {
        // With events lost, any id the server may have given out passes.
        if (!n.lossy || id == 0 || id > n.creates + stat(n, "cm_mads_rx"))
          fail("an event for an id never created nor announced", id,
               it->m.resp.event);
      }
      ++it;
    }
    if (final) deferred_.clear();
  }

  static uint64_t stat(const Node& n, const char* name) {
    for (const auto& [k, v] : n.srv->stats())
      if (std::strcmp(k, name) == 0) return v;
    fail("no such counter");
  }

  // After every operation, so without a strcmp per counter (libFuzzer
  // hooks strcmp and costs more than the operation): the positions of the
  // counters in stats() are looked up once, names checked by pointer.
  enum Ctr { kChannels, kIds, kMadsRx, kEvents, kCtrs };
  struct StatIndex {
    size_t pos[kCtrs] = {};
    const char* name[kCtrs] = {};
  };
  static StatIndex stat_index(const Node& n) {
    static const char* const kNames[kCtrs] = {"cm_channels", "cm_ids",
                                              "cm_mads_rx", "cm_events"};
    StatIndex ix;
    const auto all = n.srv->stats();
    for (int j = 0; j < kCtrs; ++j) {
      size_t i = 0;
      while (i < all.size() && std::strcmp(all[i].first, kNames[j]) != 0) ++i;
      if (i == all.size()) fail("no such counter");
      ix.pos[j] = i;
      ix.name[j] = all[i].first;
    }
    return ix;
  }

  // Checks the counters; true when either server counted an event since the
  // last call.
  bool check_stats() {
    bool evented = false;
    for (Node& n : nodes_) {
      static const StatIndex ix = stat_index(n);
      const auto all = n.srv->stats();
      uint64_t v[kCtrs];
      for (int j = 0; j < kCtrs; ++j) {
        if (ix.pos[j] >= all.size() || all[ix.pos[j]].first != ix.name[j])
          fail("counters moved");
        v[j] = all[ix.pos[j]].second;
      }
      const uint64_t ch = v[kChannels], ids = v[kIds], mads = v[kMadsRx];
      if (ch != static_cast<uint64_t>(n.open))
        fail("cm_channels", ch, static_cast<uint64_t>(n.open));
      if (ids > n.creates + mads)
        fail("cm_ids more than were created", ids, n.creates);
      evented |= v[kEvents] != n.events_seen;
      n.events_seen = v[kEvents];
    }
    return evented;
  }

  void after_op() {
    // Poll only when an event can have been sent: syscalls are most of this
    // target's time (each dear in a VM), and most operations send none.
    // Reading the servers' counters does not depend on what the sockets
    // hold, so checking them first finds the same.
    if (check_stats() || poll_due_) {
      poll_due_ = false;
      // One poll() over the sockets instead of a recv() each.
      pollfd pf[kSlots];
      Slot* ps[kSlots];
      nfds_t n = 0;
      for (Slot& s : slots_)
        if (s.open && !s.stalled && s.pair.app >= 0) {
          pf[n] = {s.pair.app, POLLIN, 0};
          ps[n++] = &s;
        }
      // EINTR (a signal, libFuzzer's timer): nothing read, try next time.
      const int ready = n ? poll(pf, n, 0) : 0;
      if (ready < 0 && errno != EINTR) fail("poll on the event sockets", errno);
      poll_due_ = ready < 0;
      for (nfds_t i = 0; ready > 0 && i < n; ++i)
        if (pf[i].revents) drain(*ps[i]);
    }
    recheck(false);
  }

  void finish() {
    // Read everything, including what waits in a server's backlog for a
    // full socket (a tick sends it).
    for (int round = 0; round < 256; ++round) {
      const uint64_t before = events_read_;
      for (Slot& s : slots_)
        if (s.open) drain(s);
      if (round && events_read_ == before) break;
      for (Node& n : nodes_) n.srv->tick(now_);
    }
    recheck(true);
    check_stats();
    for (Slot& s : slots_) close_slot(s);
    // Past every timer: REQ/REP/DREQ retries, timewait, address queries.
    for (int i = 0; i < 4; ++i) {
      now_ += 3600'000 * kMs;
      for (Node& n : nodes_) n.srv->tick(now_);
    }
    for (Node& n : nodes_) {
      const uint64_t ids = stat(n, "cm_ids"), ch = stat(n, "cm_channels");
      if (ids != 0 || ch != 0)
        fail("ids or channels left after every channel closed", ids, ch);
      if (const uint64_t mc = stat(n, "cm_mcast_groups"))
        fail("multicast memberships left after every channel closed", mc);
      if (const uint64_t l = stat(n, "cm_listening"))
        fail("listeners left after every channel closed", l);
    }
  }

  uint64_t now_ = 1000 * 1000 * kMs;  // ns; any non-zero start
  Node nodes_[2];
  Slot slots_[kSlots];
  std::deque<std::array<uint8_t, cm::kMadSize>> history_;
  std::vector<Deferred> deferred_;
  uint64_t events_read_ = 0;
  // The sockets may hold events no counter moved for (a MIGRATE_ID, a tick,
  // a channel read again, a poll() cut short by a signal): poll after this
  // operation whatever cm_events says.
  bool poll_due_ = false;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 16384) return 0;
  Reader r{data, size};
  World w;
  w.run(r);
  return 0;
}
