// The RDMA CM service side (dataplane/service/cm_server.cc) driven in-process:
// two CmServers, A (10.99.0.1) and B (10.99.0.2), play librdmacm's ucma
// commands; the test is the network between them (CM MADs are captured as
// frames, then delivered, dropped, duplicated or forged) and reads each
// channel's event socket. Facts: verbs-shim/RDMACM-NOTES.md.
#include <arpa/inet.h>
#include <endian.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dataplane/service/cm_server.h"
#include "dataplane/wire/cm_mad.h"
#include "dataplane/wire/codec.h"

namespace urnic::service {
namespace {

namespace cm = wire::cm;
using cm::Attr;

// enum rdma_cm_event_type (librdmacm rdma_cma.h), as ucma passes it on.
enum : uint32_t {
  RDMA_CM_EVENT_ADDR_RESOLVED = 0,
  RDMA_CM_EVENT_ROUTE_RESOLVED = 2,
  RDMA_CM_EVENT_CONNECT_REQUEST = 4,
  RDMA_CM_EVENT_CONNECT_RESPONSE = 5,
  RDMA_CM_EVENT_UNREACHABLE = 7,
  RDMA_CM_EVENT_REJECTED = 8,
  RDMA_CM_EVENT_ESTABLISHED = 9,
  RDMA_CM_EVENT_DISCONNECTED = 10,
  RDMA_CM_EVENT_MULTICAST_JOIN = 12,
  RDMA_CM_EVENT_TIMEWAIT_EXIT = 15,
};

constexpr uint32_t kIpA = 0x0a630001, kIpB = 0x0a630002;  // 10.99.0.1, .2
constexpr uint16_t kPort = 7174;
constexpr uint64_t kServiceId = 0x01061C06;  // RDMA_PS_TCP << 16 | 7174
constexpr uint64_t kMs = 1'000'000;
// Linux's waits with the default timeouts (RDMACM-NOTES.md §3.6): a REQ is
// resent after 2 * conv(packet life 16) + conv(CM response timeout 20), a
// REP after conv(the REQ's local CM response timeout 20); timewait is
// conv(ACK timeout 17); after an MRA with service timeout 24 the REQ waits
// conv(24) + conv(17).
constexpr uint64_t kReqWaitMs = 2 * 256 + 4096;
constexpr uint64_t kRepWaitMs = 4096;
constexpr uint64_t kTimewaitMs = 512;
constexpr uint64_t kMraWaitMs = 65536 + 512;
constexpr uint8_t kMaxCmRetries = 15;

// The uids librdmacm would pass (its id_priv pointers).
constexpr uint64_t kUidListen = 0x11110000, kUidA = 0xaaaa0000,
                   kUidB = 0xbbbb0000;
// A group, and the uids librdmacm gives its joins (its cma_multicast
// pointers).
constexpr uint32_t kGroup = 0xef010101;  // 239.1.1.1
constexpr uint64_t kUidMc = 0x3c3c0000, kUidMc2 = 0x3c3c0100;

void gid(uint32_t ip, uint8_t out[16]) {
  wire::gid_from_ipv4(ip, out);
}
std::array<uint8_t, 16> gid(uint32_t ip) {
  std::array<uint8_t, 16> g;
  wire::gid_from_ipv4(ip, g.data());
  return g;
}
std::array<uint8_t, 16> arr16(const uint8_t* p) {
  std::array<uint8_t, 16> g;
  std::memcpy(g.data(), p, 16);
  return g;
}
uint32_t ipv4_of(const uint8_t cma_addr[16]) {
  uint32_t be;
  std::memcpy(&be, cma_addr + 12, 4);
  return ntohl(be);
}

// One urnicd: its CM and the frames it handed to a worker.
struct Node {
  Node(const char* n, uint32_t a, uint64_t g) : name(n), ip(a), guid(g) {}
  const char* name;
  uint32_t ip;
  uint64_t guid;  // network order, as ibv_get_device_guid
  struct Frame {
    std::array<uint8_t, 16> dgid;
    std::vector<uint8_t> bytes;
  };
  std::deque<Frame> tx;
  std::unique_ptr<CmServer> srv;
  uint64_t next_client = 1;
};

// An event channel: a control connection with its event socket.
struct Chan {
  Node* node = nullptr;
  ClientInfo ci;
  int fd = -1;  // the application's end of the event socket
};

// A CM MAD as it went on the wire.
struct Mad {
  std::array<uint8_t, 16> dgid{};
  std::vector<uint8_t> frame;
  wire::RoceFields f;
  std::array<uint8_t, cm::kMadSize> b{};
  cm::MadHdr h;
  template <typename M>
  M as() const {
    M m;
    cm::decode(b.data(), m);
    return m;
  }
};

struct Res {
  int status = 0;
  std::string payload;
  template <typename T>
  T as() const {
    T v{};
    EXPECT_EQ(payload.size(), sizeof v) << payload;
    std::memcpy(&v, payload.data(), std::min(sizeof v, payload.size()));
    return v;
  }
};

// rdma_conn_param as librdmacm fills it for rdma_connect / rdma_accept.
struct Param {
  uint32_t qp_num = 0;
  uint8_t responder_resources = 1, initiator_depth = 1;
  std::string_view pdata;
};

class CmServerTest : public ::testing::Test {
 protected:
  CmServerTest() {
    start(A);
    start(B);
    a = open(A);
    b = open(B);
  }
  ~CmServerTest() override {
    A.srv.reset();
    B.srv.reset();
    for (int fd : fds_) close(fd);
  }

  void start(Node& n, uint64_t listen_grace_ms = 0) {
    CmEnv e;
    e.listen_grace_ns = listen_grace_ms * kMs;
    e.addrs.mac = {{0x02, 0, 0, 0, 0x63, static_cast<uint8_t>(n.ip)}};
    e.addrs.ipv4 = n.ip;
    e.addrs.ipv4_prefix = 24;
    e.sgid_index = 1;
    e.node_guid = n.guid;
    e.send_frame = [&n](const uint8_t dgid[16], const uint8_t* f,
                        uint32_t len) {
      n.tx.push_back({arr16(dgid), std::vector<uint8_t>(f, f + len)});
      return true;
    };
    e.neighbour = [](const uint8_t*) { return 0; };
    n.srv = std::make_unique<CmServer>(std::move(e));
    n.srv->tick(now);
  }

  // A with config cm.listen_grace_ms = `ms` (and a new channel a).
  void restart_a(uint64_t ms) {
    A.srv.reset();
    A.tx.clear();
    start(A, ms);
    a = open(A);
  }
  // A with a 100 ms listen grace and no listener gets B's REQ.
  void request_held_by_a() {
    restart_a(100);
    ASSERT_NO_FATAL_FAILURE(connect_from_b());
    req = take(B, Attr::kReq);
    deliver(req, A);
  }

  // --- time ---------------------------------------------------------------
  void advance(uint64_t ms) {
    now += ms * kMs;
    A.srv->tick(now);
    B.srv->tick(now);
  }

  // --- channels and commands ----------------------------------------------
  Res request(Chan& c, shim::Op op, std::string body,
              std::vector<int> fds = {}) {
    CtlRequest creq{&c.ci, static_cast<ctl::Op>(op), body, fds};
    CtlReply crep;
    c.node->srv->handle(creq, crep);
    for (int fd : fds)
      if (fd >= 0) close(fd);  // what ControlServer does with the rest
    return {crep.status, crep.payload};
  }
  // rdma_create_event_channel: a control connection and its event socket.
  Chan open(Node& n) {
    Chan c;
    c.node = &n;
    c.ci.id = n.next_client++;
    c.ci.pid = getpid();
    c.ci.uid = getuid();
    int sv[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    c.fd = sv[0];
    fds_.push_back(c.fd);
    Res r = request(c, shim::Op::kCmOpen, bytes(shim::CmOpenReq{}), {sv[1]});
    EXPECT_EQ(r.status, 0) << r.payload;
    EXPECT_NE(r.as<shim::CmOpenRep>().token, 0u);
    return c;
  }
  template <typename T>
  static std::string bytes(const T& v) {
    return std::string(reinterpret_cast<const char*>(&v), sizeof v);
  }
  // One ucma write: `cmd`, `in` body bytes, then option bytes.
  Res ucma(Chan& c, uint32_t cmd, std::string body, std::string opt = {}) {
    shim::CmCommandReq q;
    q.cmd = cmd;
    q.in = static_cast<uint16_t>(body.size());
    q.out = 512;
    q.optlen = static_cast<uint32_t>(opt.size());
    return request(c, shim::Op::kCmCommand, bytes(q) + body + opt);
  }

  uint32_t create_id(Chan& c, uint64_t uid, uint16_t ps = cm::kPsTcp,
                     uint8_t qp_type = IBV_QPT_RC) {
    rdma_ucm_create_id q{};
    q.uid = uid;
    q.ps = ps;
    q.qp_type = qp_type;
    Res r = ucma(c, RDMA_USER_CM_CMD_CREATE_ID, bytes(q));
    EXPECT_EQ(r.status, 0) << r.payload;
    return r.as<rdma_ucm_create_id_resp>().id;
  }
  static void put_sin(sockaddr_in6& slot, uint32_t ip, uint16_t port) {
    sockaddr_in s{};
    s.sin_family = AF_INET;
    s.sin_port = htons(port);
    s.sin_addr.s_addr = htonl(ip);
    std::memset(&slot, 0, sizeof slot);
    std::memcpy(&slot, &s, sizeof s);
  }
  int bind_ip(Chan& c, uint32_t id, uint32_t ip, uint16_t port) {
    rdma_ucm_bind_ip q{};
    put_sin(q.addr, ip, port);
    q.id = id;
    return ucma(c, RDMA_USER_CM_CMD_BIND_IP, bytes(q)).status;
  }
  int resolve_ip(Chan& c, uint32_t id, uint32_t dst, uint16_t port) {
    rdma_ucm_resolve_ip q{};
    put_sin(q.dst_addr, dst, port);
    q.id = id;
    q.timeout_ms = 2000;
    return ucma(c, RDMA_USER_CM_CMD_RESOLVE_IP, bytes(q)).status;
  }
  int resolve_route(Chan& c, uint32_t id) {
    rdma_ucm_resolve_route q{};
    q.id = id;
    q.timeout_ms = 2000;
    return ucma(c, RDMA_USER_CM_CMD_RESOLVE_ROUTE, bytes(q)).status;
  }
  int listen(Chan& c, uint32_t id, uint32_t backlog = 8) {
    rdma_ucm_listen q{};
    q.id = id;
    q.backlog = backlog;
    return ucma(c, RDMA_USER_CM_CMD_LISTEN, bytes(q)).status;
  }
  static void put_param(rdma_ucm_conn_param& p, const Param& v) {
    p.qp_num = v.qp_num;
    p.responder_resources = v.responder_resources;
    p.initiator_depth = v.initiator_depth;
    p.retry_count = 7;
    p.rnr_retry_count = 7;
    std::memcpy(p.private_data, v.pdata.data(), v.pdata.size());
    p.private_data_len = static_cast<uint8_t>(v.pdata.size());
    p.valid = 1;
  }
  int connect(Chan& c, uint32_t id, const Param& v) {
    rdma_ucm_connect q{};
    put_param(q.conn_param, v);
    q.id = id;
    return ucma(c, RDMA_USER_CM_CMD_CONNECT, bytes(q)).status;
  }
  // rdma_accept (passive side), with the QP's parameters.
  int accept(Chan& c, uint32_t id, uint64_t uid, const Param& v) {
    rdma_ucm_accept q{};
    q.uid = uid;
    put_param(q.conn_param, v);
    q.id = id;
    return ucma(c, RDMA_USER_CM_CMD_ACCEPT, bytes(q)).status;
  }
  // librdmacm after CONNECT_RESPONSE: ACCEPT with `valid` 0.
  int accept_response(Chan& c, uint32_t id, uint64_t uid) {
    rdma_ucm_accept q{};
    q.uid = uid;
    q.id = id;
    return ucma(c, RDMA_USER_CM_CMD_ACCEPT, bytes(q)).status;
  }
  int reject(Chan& c, uint32_t id, std::string_view pdata) {
    rdma_ucm_reject q{};
    q.id = id;
    q.private_data_len = static_cast<uint8_t>(pdata.size());
    std::memcpy(q.private_data, pdata.data(), pdata.size());
    return ucma(c, RDMA_USER_CM_CMD_REJECT, bytes(q)).status;
  }
  int disconnect(Chan& c, uint32_t id) {
    rdma_ucm_disconnect q{};
    q.id = id;
    return ucma(c, RDMA_USER_CM_CMD_DISCONNECT, bytes(q)).status;
  }
  int destroy_id(Chan& c, uint32_t id) {
    rdma_ucm_destroy_id q{};
    q.id = id;
    Res r = ucma(c, RDMA_USER_CM_CMD_DESTROY_ID, bytes(q));
    if (r.status == 0) {
      EXPECT_EQ(r.payload.size(), sizeof(rdma_ucm_destroy_id_resp));
    }
    return r.status;
  }
  ib_uverbs_qp_attr init_qp_attr(Chan& c, uint32_t id, uint32_t state) {
    rdma_ucm_init_qp_attr q{};
    q.id = id;
    q.qp_state = state;
    Res r = ucma(c, RDMA_USER_CM_CMD_INIT_QP_ATTR, bytes(q));
    EXPECT_EQ(r.status, 0) << r.payload;
    return r.as<ib_uverbs_qp_attr>();
  }
  rdma_ucm_query_route_resp query_route(Chan& c, uint32_t id) {
    rdma_ucm_query q{};
    q.id = id;
    Res r = ucma(c, RDMA_USER_CM_CMD_QUERY_ROUTE, bytes(q));
    EXPECT_EQ(r.status, 0) << r.payload;
    return r.as<rdma_ucm_query_route_resp>();
  }
  int set_option(Chan& c, uint32_t id, uint32_t level, uint32_t name,
                 std::string opt) {
    rdma_ucm_set_option q{};
    q.id = id;
    q.level = level;
    q.optname = name;
    q.optlen = static_cast<uint32_t>(opt.size());
    return ucma(c, RDMA_USER_CM_CMD_SET_OPTION, bytes(q), opt).status;
  }

  // rdma_join_multicast without AF_IB (librdmacm's JOIN_IP_MCAST).
  Res join_ip(Chan& c, uint32_t id, uint64_t uid, uint32_t group) {
    rdma_ucm_join_ip_mcast q{};
    q.uid = uid;
    put_sin(q.addr, group, 0);
    q.id = id;
    return ucma(c, RDMA_USER_CM_CMD_JOIN_IP_MCAST, bytes(q));
  }
  // rdma_join_multicast_ex with AF_IB support (JOIN_MCAST).
  Res join(Chan& c, uint32_t id, uint64_t uid, uint32_t group, uint16_t flags,
           uint16_t addr_size = sizeof(sockaddr_in)) {
    rdma_ucm_join_mcast q{};
    q.uid = uid;
    q.id = id;
    q.addr_size = addr_size;
    q.join_flags = flags;
    sockaddr_in s{};
    s.sin_family = AF_INET;
    s.sin_addr.s_addr = htonl(group);
    std::memcpy(&q.addr, &s, sizeof s);
    return ucma(c, RDMA_USER_CM_CMD_JOIN_MCAST, bytes(q));
  }
  Res leave(Chan& c, uint32_t handle) {
    rdma_ucm_destroy_id q{};
    q.id = handle;
    return ucma(c, RDMA_USER_CM_CMD_LEAVE_MCAST, bytes(q));
  }
  // A UD id of RDMA_PS_UDP on B, resolved to the group as mckey does.
  void resolve_group_from_b() {
    bid = create_id(b, kUidB, cm::kPsUdp, IBV_QPT_UD);
    ASSERT_EQ(resolve_ip(b, bid, kGroup, 0), 0);
    ASSERT_EQ(event(b, RDMA_CM_EVENT_ADDR_RESOLVED).resp.id, bid);
  }
  // MULTICAST_JOIN as Linux's cma gives it for a RoCEv2 port: the
  // membership's uid and handle, QPN 0xFFFFFF, RDMA_UDP_QKEY, the MGID
  // ::ffff:group, the IPv4 GID's index, hop limit 64, nothing else.
  void expect_join_event(const shim::CmEventMsg& m, uint32_t id, uint64_t uid,
                         uint32_t handle, uint32_t group) {
    EXPECT_EQ(m.resp.event, RDMA_CM_EVENT_MULTICAST_JOIN);
    EXPECT_EQ(m.resp.status, 0u);
    EXPECT_EQ(m.resp.uid, uid);
    EXPECT_EQ(m.resp.id, handle);
    EXPECT_EQ(m.count_id, id);  // the shim counts it against the id too
    const rdma_ucm_ud_param& u = m.resp.param.ud;
    EXPECT_EQ(u.qp_num, 0xFFFFFFu);
    EXPECT_EQ(u.qkey, 0x01234567u);
    EXPECT_EQ(u.private_data_len, 0);
    const ib_uverbs_ah_attr& ah = u.ah_attr;
    std::array<uint8_t, 16> mgid{};
    mgid[10] = mgid[11] = 0xff;
    const uint32_t be = htonl(group);
    std::memcpy(&mgid[12], &be, 4);
    EXPECT_EQ(arr16(ah.grh.dgid), mgid);
    EXPECT_EQ(ah.grh.sgid_index, 1);  // CmEnv's sgid_index
    EXPECT_EQ(ah.grh.hop_limit, 64);
    EXPECT_EQ(ah.grh.traffic_class, 0);
    EXPECT_EQ(ah.grh.flow_label, 0u);
    EXPECT_EQ(ah.is_global, 1);
    EXPECT_EQ(ah.port_num, 1);
    EXPECT_EQ(ah.dlid, 0);
    EXPECT_EQ(ah.sl, 0);
    EXPECT_EQ(ah.static_rate, 0);
  }

  // --- events ---------------------------------------------------------------
  std::vector<shim::CmEventMsg> events(Chan& c) {
    std::vector<shim::CmEventMsg> v;
    shim::CmEventMsg m;
    while (recv(c.fd, &m, sizeof m, MSG_DONTWAIT) ==
           static_cast<ssize_t>(sizeof m))
      v.push_back(m);
    return v;
  }
  // The one event `c` has now, of type `type`.
  shim::CmEventMsg event(Chan& c, uint32_t type) {
    const auto v = events(c);
    EXPECT_EQ(v.size(), 1u) << c.node->name << ": events queued";
    if (v.empty()) return {};
    EXPECT_EQ(v[0].resp.event, type) << c.node->name;
    return v[0];
  }

  // --- the network
  // ------------------------------------------------------------ The oldest
  // frame `n` sent, which must be a CM MAD of type `a`.
  Mad take(Node& n, Attr want) {
    Mad m;
    if (n.tx.empty()) {
      ADD_FAILURE() << n.name << " sent nothing; expected attr 0x" << std::hex
                    << static_cast<int>(want);
      return m;
    }
    m.dgid = n.tx.front().dgid;
    m.frame = std::move(n.tx.front().bytes);
    n.tx.pop_front();
    wire::FrameInfo fi;
    wire::decode(m.frame.data(), static_cast<uint32_t>(m.frame.size()), fi);
    EXPECT_EQ(fi.kind, wire::FrameKind::kRoce) << wire::malformed_name(fi.why);
    if (fi.kind != wire::FrameKind::kRoce) return m;
    m.f = fi.roce;
    EXPECT_EQ(m.f.payload_len, cm::kMadSize);
    std::memcpy(m.b.data(), m.frame.data() + fi.payload_off,
                std::min<uint32_t>(m.f.payload_len, cm::kMadSize));
    EXPECT_EQ(cm::decode_hdr(m.b.data(), cm::kMadSize, m.h),
              cm::DecodeError::kOk);
    EXPECT_EQ(m.h.attr_id, static_cast<uint16_t>(want))
        << n.name << " sent attr 0x" << std::hex << m.h.attr_id;
    return m;
  }
  // wire::decode the frame and hand it to `to`'s CM, as a worker does.
  void deliver(const std::vector<uint8_t>& frame, Node& to) {
    wire::FrameInfo fi;
    wire::decode(frame.data(), static_cast<uint32_t>(frame.size()), fi);
    ASSERT_EQ(fi.kind, wire::FrameKind::kRoce);
    ASSERT_EQ(fi.roce.dqpn, 1u);
    to.srv->rx(fi.roce, frame.data() + fi.payload_off, fi.roce.payload_len,
               now);
  }
  void deliver(const Mad& m, Node& to) { deliver(m.frame, to); }
  // A frame from `from` to `to`'s QP1 carrying `mad`, built by hand.
  std::vector<uint8_t> forge(const Node& from, const Node& to,
                             const uint8_t* mad, uint32_t qkey = cm::kQp1Qkey) {
    wire::RoceFields f;
    f.src_mac = {{0x02, 0, 0, 0, 0x63, static_cast<uint8_t>(from.ip)}};
    f.dst_mac = {{0x02, 0, 0, 0, 0x63, static_cast<uint8_t>(to.ip)}};
    gid(from.ip, f.sgid);
    gid(to.ip, f.dgid);
    f.opcode = wire::opcode::kUdSendOnly;
    f.dqpn = 1;
    f.deth_qkey = qkey;
    f.deth_src_qp = 1;
    f.payload_len = cm::kMadSize;
    std::vector<uint8_t> buf(512);
    buf.resize(wire::encode_frame(f, mad, buf.data(),
                                  static_cast<uint32_t>(buf.size())));
    EXPECT_FALSE(buf.empty());
    return buf;
  }

  // A MAD between the two CMs: from QP1 to QP1, GSI Q_Key, the right GIDs.
  static void expect_qp1(const Mad& m, const Node& from, const Node& to) {
    EXPECT_EQ(m.dgid, gid(to.ip));
    EXPECT_EQ(m.f.opcode, wire::opcode::kUdSendOnly);
    EXPECT_EQ(m.f.dqpn, 1u);
    EXPECT_EQ(m.f.deth_src_qp, 1u);
    EXPECT_EQ(m.f.deth_qkey, cm::kQp1Qkey);
    EXPECT_EQ(m.f.pkey, 0xffff);
    EXPECT_EQ(arr16(m.f.sgid), gid(from.ip));
    EXPECT_EQ(arr16(m.f.dgid), gid(to.ip));
    EXPECT_EQ(m.h.class_version, cm::kClassVersion);
    EXPECT_EQ(m.h.method, cm::kMethodSend);
  }

  uint64_t stat(const Node& n, std::string_view name) const {
    for (const auto& [k, v] : n.srv->stats())
      if (name == k) return v;
    ADD_FAILURE() << "no counter " << name;
    return 0;
  }

  // --- common openings
  // -------------------------------------------------------- A listens
  // on 10.99.0.1:7174; B resolves it and sends its REQ, which stays in B.tx.
  void listen_and_connect(Param bp = {0x123, 1, 1, "hello A"}) {
    lis = create_id(a, kUidListen);
    ASSERT_EQ(bind_ip(a, lis, kIpA, kPort), 0);
    ASSERT_EQ(listen(a, lis), 0);
    connect_from_b(bp);
  }
  void connect_from_b(Param bp = {0x123, 1, 1, "hello A"}) {
    bid = create_id(b, kUidB);
    ASSERT_EQ(resolve_ip(b, bid, kIpA, kPort), 0);
    ASSERT_EQ(event(b, RDMA_CM_EVENT_ADDR_RESOLVED).resp.id, bid);
    ASSERT_EQ(resolve_route(b, bid), 0);
    ASSERT_EQ(event(b, RDMA_CM_EVENT_ROUTE_RESOLVED).resp.id, bid);
    ASSERT_EQ(connect(b, bid, bp), 0);
  }
  // ... A gets the REQ and its CONNECT_REQUEST.
  void request_reaches_a() {
    ASSERT_NO_FATAL_FAILURE(listen_and_connect());
    req = take(B, Attr::kReq);
    deliver(req, A);
    const auto cr = event(a, RDMA_CM_EVENT_CONNECT_REQUEST);
    ASSERT_EQ(cr.resp.uid, kUidListen);
    aid = cr.resp.id;
  }
  // ... and the rest of the handshake: REP, RTU, ESTABLISHED.
  void establish() {
    ASSERT_NO_FATAL_FAILURE(request_reaches_a());
    ASSERT_NO_FATAL_FAILURE(accept_on_a());
  }
  // ... the accept of aid on A: REP, RTU, ESTABLISHED.
  void accept_on_a() {
    ASSERT_EQ(accept(a, aid, kUidA, {0x456, 1, 1, ""}), 0);
    rep = take(A, Attr::kRep);
    deliver(rep, B);
    ASSERT_EQ(event(b, RDMA_CM_EVENT_CONNECT_RESPONSE).resp.id, bid);
    ASSERT_EQ(accept_response(b, bid, kUidB), 0);
    deliver(take(B, Attr::kRtu), A);
    ASSERT_EQ(event(a, RDMA_CM_EVENT_ESTABLISHED).resp.id, aid);
    ASSERT_TRUE(A.tx.empty());
    ASSERT_TRUE(B.tx.empty());
  }

  uint64_t now = 1000 * 1000 * kMs;  // ns; any non-zero start
  Node A{"A", kIpA, htobe64(0x0200'63ff'fe00'0001)};
  Node B{"B", kIpB, htobe64(0x0200'63ff'fe00'0002)};
  std::vector<int> fds_;
  Chan a, b;  // one event channel on each
  uint32_t lis = 0, aid = 0, bid = 0;
  Mad req, rep;
};

// 1. rdma_listen / rdma_resolve_addr / rdma_resolve_route / rdma_connect /
// rdma_accept, message by message, with what INIT_QP_ATTR answers on both
// sides. B asks for 4 responder resources and 2 initiator depth, A for 3 and
// 1, so that each side seeing the other's pair swapped shows.
TEST_F(CmServerTest, RcConnectionTrace) {
  // A: rdma_create_id, rdma_bind_addr(10.99.0.1:7174), rdma_listen.
  lis = create_id(a, kUidListen);
  ASSERT_EQ(bind_ip(a, lis, kIpA, kPort), 0);
  ASSERT_EQ(listen(a, lis), 0);
  // B: rdma_resolve_addr(10.99.0.1:7174).
  bid = create_id(b, kUidB);
  ASSERT_EQ(resolve_ip(b, bid, kIpA, kPort), 0);
  // Expect: ADDR_RESOLVED at once (the neighbour is known).
  auto ev = event(b, RDMA_CM_EVENT_ADDR_RESOLVED);
  EXPECT_EQ(ev.resp.id, bid);
  EXPECT_EQ(ev.resp.uid, kUidB);
  EXPECT_EQ(ev.resp.status, 0u);
  // B: rdma_resolve_route. Expect: ROUTE_RESOLVED, one path A <- B.
  ASSERT_EQ(resolve_route(b, bid), 0);
  EXPECT_EQ(event(b, RDMA_CM_EVENT_ROUTE_RESOLVED).resp.id, bid);
  const auto route = query_route(b, bid);
  EXPECT_EQ(route.node_guid, B.guid);
  EXPECT_EQ(route.num_paths, 1u);
  EXPECT_EQ(arr16(route.ib_route[0].sgid), gid(kIpB));
  EXPECT_EQ(arr16(route.ib_route[0].dgid), gid(kIpA));
  sockaddr_in src, dst;
  std::memcpy(&src, &route.src_addr, sizeof src);
  std::memcpy(&dst, &route.dst_addr, sizeof dst);
  EXPECT_EQ(src.sin_family, AF_INET);
  EXPECT_EQ(ntohl(src.sin_addr.s_addr), kIpB);
  EXPECT_EQ(ntohl(dst.sin_addr.s_addr), kIpA);
  EXPECT_EQ(ntohs(dst.sin_port), kPort);
  const uint16_t bport = ntohs(src.sin_port);  // ephemeral
  EXPECT_GE(bport, 32768);

  // B: rdma_connect(QP 0x123, resources 4/2, "hello A").
  ASSERT_EQ(connect(b, bid, {0x123, 4, 2, "hello A"}), 0);
  // Expect: a REQ from B to A's QP1, and B's CM waiting on it.
  req = take(B, Attr::kReq);
  expect_qp1(req, B, A);
  EXPECT_TRUE(B.srv->busy());
  const auto q = req.as<cm::Req>();
  EXPECT_EQ(q.service_id, kServiceId);
  EXPECT_EQ(req.h.tid & 0xffffffff, q.local_comm_id);
  EXPECT_NE(q.local_comm_id, 0u);
  EXPECT_EQ(q.local_ca_guid, be64toh(B.guid));
  EXPECT_EQ(q.local_qpn, 0x123u);
  EXPECT_EQ(q.responder_resources, 4);
  EXPECT_EQ(q.initiator_depth, 2);
  EXPECT_EQ(q.transport_type, 0);  // RC
  EXPECT_EQ(q.local_cm_response_timeout, 20);
  EXPECT_EQ(q.remote_cm_response_timeout, 20);
  EXPECT_EQ(q.max_cm_retries, kMaxCmRetries);
  EXPECT_EQ(q.retry_count, 7);
  EXPECT_EQ(q.rnr_retry_count, 7);
  EXPECT_EQ(q.pkey, 0xffff);
  EXPECT_EQ(q.path_mtu, IBV_MTU_1024);
  EXPECT_EQ(arr16(q.primary.local_gid), gid(kIpB));
  EXPECT_EQ(arr16(q.primary.remote_gid), gid(kIpA));
  EXPECT_EQ(q.primary.local_lid, 0xffff);
  EXPECT_EQ(q.primary.remote_lid, 0xffff);
  EXPECT_EQ(q.primary.hop_limit, 64);
  EXPECT_EQ(q.primary.flow_label, (bport * 31u + kPort) & 0xfffff);
  EXPECT_EQ(q.primary.local_ack_timeout, 17);  // cm_ack_timeout(15, 16)
  EXPECT_FALSE(q.has_alternate);
  // ... its private data: the cma header, then the user's.
  cm::CmaHdr ch;
  ASSERT_TRUE(cm::decode(q.private_data, ch));
  EXPECT_EQ(ch.cma_version, 0);
  EXPECT_EQ(ch.ip_version, 4);
  EXPECT_EQ(ch.src_port, bport);
  EXPECT_EQ(ipv4_of(ch.src_addr), kIpB);
  EXPECT_EQ(ipv4_of(ch.dst_addr), kIpA);
  EXPECT_EQ(
      std::string_view(
          reinterpret_cast<const char*>(q.private_data) + cm::kCmaHdrSize, 8),
      std::string_view("hello A\0", 8));
  EXPECT_TRUE(A.tx.empty() && B.tx.empty());

  deliver(req, A);
  // Expect: CONNECT_REQUEST on A's channel: the listener's uid (and count),
  // a new id, B's QP, the resources swapped, 56 bytes of user data.
  ev = event(a, RDMA_CM_EVENT_CONNECT_REQUEST);
  EXPECT_EQ(ev.count_id, lis);
  EXPECT_EQ(ev.resp.uid, kUidListen);
  aid = ev.resp.id;
  EXPECT_NE(aid, lis);
  EXPECT_NE(aid, 0u);
  EXPECT_EQ(ev.resp.status, 0u);
  EXPECT_EQ(ev.resp.param.conn.qp_num, 0x123u);
  EXPECT_EQ(ev.resp.param.conn.responder_resources, 2);
  EXPECT_EQ(ev.resp.param.conn.initiator_depth, 4);
  EXPECT_EQ(ev.resp.param.conn.private_data_len, cm::kReqUserDataSize);
  EXPECT_STREQ(reinterpret_cast<const char*>(ev.resp.param.conn.private_data),
               "hello A");
  // ... and the new id routes back to B.
  const auto aroute = query_route(a, aid);
  std::memcpy(&src, &aroute.src_addr, sizeof src);
  std::memcpy(&dst, &aroute.dst_addr, sizeof dst);
  EXPECT_EQ(ntohl(src.sin_addr.s_addr), kIpA);
  EXPECT_EQ(ntohs(src.sin_port), kPort);
  EXPECT_EQ(ntohl(dst.sin_addr.s_addr), kIpB);
  EXPECT_EQ(ntohs(dst.sin_port), bport);

  // A: rdma_accept(QP 0x456, resources 3/1, "hello B"): librdmacm moves the
  // QP to RTR and RTS first. Expect: RTR toward B's QP at A's own PSN, RTS
  // from B's PSN.
  const auto artr = init_qp_attr(a, aid, IBV_QPS_RTR);
  EXPECT_EQ(artr.dest_qp_num, 0x123u);
  EXPECT_EQ(arr16(artr.ah_attr.grh.dgid), gid(kIpB));
  const auto arts = init_qp_attr(a, aid, IBV_QPS_RTS);
  EXPECT_EQ(arts.sq_psn, q.starting_psn);
  ASSERT_EQ(accept(a, aid, kUidA, {0x456, 3, 1, "hello B"}), 0);
  // Expect: a REP from A to B, answering the REQ (its TID, its comm ID).
  rep = take(A, Attr::kRep);
  expect_qp1(rep, A, B);
  const auto p = rep.as<cm::Rep>();
  EXPECT_EQ(rep.h.tid, req.h.tid);
  EXPECT_EQ(p.remote_comm_id, q.local_comm_id);
  EXPECT_NE(p.local_comm_id, 0u);
  EXPECT_EQ(p.local_qpn, 0x456u);
  EXPECT_EQ(p.local_ca_guid, be64toh(A.guid));
  EXPECT_EQ(p.responder_resources, 3);
  EXPECT_EQ(p.initiator_depth, 1);
  EXPECT_EQ(p.target_ack_delay, 15);
  EXPECT_EQ(p.rnr_retry_count, 7);
  EXPECT_STREQ(reinterpret_cast<const char*>(p.private_data), "hello B");
  // Expect: A's RTR receives from the REP's PSN, its RTS sends from the
  // REQ's (asked again after the accept, as perftest does).
  EXPECT_EQ(init_qp_attr(a, aid, IBV_QPS_RTR).rq_psn, p.starting_psn);
  EXPECT_EQ(artr.rq_psn, p.starting_psn);
  EXPECT_EQ(init_qp_attr(a, aid, IBV_QPS_RTS).sq_psn, q.starting_psn);
  EXPECT_TRUE(events(a).empty());

  deliver(rep, B);
  // Expect: CONNECT_RESPONSE on B: A's QP, A's resources swapped, the REP's
  // 196 bytes of private data.
  ev = event(b, RDMA_CM_EVENT_CONNECT_RESPONSE);
  EXPECT_EQ(ev.resp.id, bid);
  EXPECT_EQ(ev.resp.uid, kUidB);
  EXPECT_EQ(ev.resp.param.conn.qp_num, 0x456u);
  EXPECT_EQ(ev.resp.param.conn.responder_resources, 1);
  EXPECT_EQ(ev.resp.param.conn.initiator_depth, 3);
  EXPECT_EQ(ev.resp.param.conn.private_data_len, cm::kRepPrivateDataSize);
  EXPECT_STREQ(reinterpret_cast<const char*>(ev.resp.param.conn.private_data),
               "hello B");

  // B: INIT_QP_ATTR INIT, RTR, RTS (ucma_process_conn_resp).
  const auto binit = init_qp_attr(b, bid, IBV_QPS_INIT);
  EXPECT_EQ(binit.qp_attr_mask,
            static_cast<uint32_t>(IBV_QP_STATE | IBV_QP_ACCESS_FLAGS |
                                  IBV_QP_PKEY_INDEX | IBV_QP_PORT));
  EXPECT_EQ(
      binit.qp_access_flags,
      static_cast<uint32_t>(IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                            IBV_ACCESS_REMOTE_ATOMIC));
  const auto brtr = init_qp_attr(b, bid, IBV_QPS_RTR);
  EXPECT_EQ(
      brtr.qp_attr_mask,
      static_cast<uint32_t>(IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                            IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                            IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER));
  EXPECT_EQ(brtr.qp_state, static_cast<uint32_t>(IBV_QPS_RTR));
  EXPECT_EQ(brtr.dest_qp_num, 0x456u);
  EXPECT_EQ(brtr.rq_psn, q.starting_psn);
  EXPECT_EQ(brtr.path_mtu, static_cast<uint32_t>(IBV_MTU_1024));
  EXPECT_EQ(brtr.max_dest_rd_atomic, 1);  // A's initiator depth
  EXPECT_EQ(arr16(brtr.ah_attr.grh.dgid), gid(kIpA));
  EXPECT_EQ(brtr.ah_attr.grh.sgid_index, 1);
  EXPECT_EQ(brtr.ah_attr.grh.hop_limit, 64);
  EXPECT_EQ(brtr.ah_attr.grh.flow_label, q.primary.flow_label);
  EXPECT_EQ(brtr.ah_attr.is_global, 1);
  EXPECT_EQ(brtr.ah_attr.port_num, 1);
  const auto brts = init_qp_attr(b, bid, IBV_QPS_RTS);
  EXPECT_EQ(brts.qp_attr_mask,
            static_cast<uint32_t>(IBV_QP_STATE | IBV_QP_SQ_PSN |
                                  IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                  IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC));
  EXPECT_EQ(brts.sq_psn, p.starting_psn);
  EXPECT_EQ(brts.max_rd_atomic, 3);  // A's responder resources
  EXPECT_EQ(brts.timeout, 17);       // cm_ack_timeout(15, 17 - 1)
  EXPECT_EQ(brts.retry_cnt, 7);
  EXPECT_EQ(brts.rnr_retry, 7);

  // B: ACCEPT with `valid` 0. Expect: the RTU, and no event on B (librdmacm
  // reports ESTABLISHED itself).
  ASSERT_EQ(accept_response(b, bid, kUidB), 0);
  const Mad rtu = take(B, Attr::kRtu);
  expect_qp1(rtu, B, A);
  EXPECT_EQ(rtu.as<cm::Rtu>().local_comm_id, q.local_comm_id);
  EXPECT_EQ(rtu.as<cm::Rtu>().remote_comm_id, p.local_comm_id);
  EXPECT_TRUE(events(b).empty());

  deliver(rtu, A);
  // Expect: ESTABLISHED on A, under the uid A gave at its accept.
  ev = event(a, RDMA_CM_EVENT_ESTABLISHED);
  EXPECT_EQ(ev.resp.id, aid);
  EXPECT_EQ(ev.resp.uid, kUidA);
  EXPECT_EQ(ev.count_id, aid);
  EXPECT_EQ(ev.resp.status, 0u);

  // Nothing else goes out, now or on a timer.
  advance(kReqWaitMs * 2);
  EXPECT_TRUE(A.tx.empty());
  EXPECT_TRUE(B.tx.empty());
  EXPECT_TRUE(events(a).empty());
  EXPECT_TRUE(events(b).empty());
  EXPECT_FALSE(A.srv->busy());
  EXPECT_FALSE(B.srv->busy());
  EXPECT_EQ(stat(A, "cm_connections"), 1u);
  EXPECT_EQ(stat(B, "cm_connections"), 1u);
  EXPECT_EQ(stat(A, "cm_mads_retransmitted"), 0u);
  EXPECT_EQ(stat(B, "cm_mads_retransmitted"), 0u);
}

// 2. A REQ for a service nobody listens on (A listens on 7175, not 7174).
TEST_F(CmServerTest, NoListenerIsRej8) {
  lis = create_id(a, kUidListen);
  ASSERT_EQ(bind_ip(a, lis, kIpA, kPort + 1), 0);
  ASSERT_EQ(listen(a, lis), 0);
  ASSERT_NO_FATAL_FAILURE(connect_from_b());
  req = take(B, Attr::kReq);
  const auto q = req.as<cm::Req>();
  deliver(req, A);
  // Expect: REJ "invalid service ID" (8) for the REQ: its TID, its comm ID
  // as the remote one, no local one; no event and no id on A.
  const Mad rej = take(A, Attr::kRej);
  expect_qp1(rej, A, B);
  const auto r = rej.as<cm::Rej>();
  EXPECT_EQ(rej.h.tid, req.h.tid);
  EXPECT_EQ(r.reason, 8);
  EXPECT_EQ(r.message_rejected, 0);  // the REQ
  EXPECT_EQ(r.local_comm_id, 0u);
  EXPECT_EQ(r.remote_comm_id, q.local_comm_id);
  EXPECT_TRUE(events(a).empty());
  EXPECT_EQ(stat(A, "cm_ids"), 1u);  // the listener
  EXPECT_EQ(stat(A, "cm_listening"), 1u);
  EXPECT_EQ(stat(A, "cm_listens"), 1u);

  deliver(rej, B);
  // Expect: REJECTED on B with status 8; the REQ is not sent again.
  const auto ev = event(b, RDMA_CM_EVENT_REJECTED);
  EXPECT_EQ(ev.resp.id, bid);
  EXPECT_EQ(ev.resp.uid, kUidB);
  EXPECT_EQ(static_cast<int32_t>(ev.resp.status), 8);
  advance(kReqWaitMs);
  EXPECT_TRUE(B.tx.empty());
  // The refused id goes quietly.
  EXPECT_EQ(destroy_id(b, bid), 0);
  EXPECT_TRUE(B.tx.empty());
  EXPECT_EQ(stat(A, "cm_rej_tx"), 1u);
  EXPECT_EQ(stat(B, "cm_rej_rx"), 1u);
}

// 2a. With cm.listen_grace_ms, a REQ that finds no listener waits for one
// (perftest -R's client connects right after the handshake after which its
// server listens): no REJ, no event; the same REQ again (a retransmission)
// is not held twice; the rdma_listen for its port takes it at once.
TEST_F(CmServerTest, RequestWaitsForTheListener) {
  ASSERT_NO_FATAL_FAILURE(request_held_by_a());
  EXPECT_TRUE(A.tx.empty());
  EXPECT_TRUE(events(a).empty());
  EXPECT_TRUE(A.srv->busy());  // the control loop ticks for the hold
  EXPECT_EQ(stat(A, "cm_req_holds"), 1u);
  deliver(req, A);
  EXPECT_EQ(stat(A, "cm_req_holds"), 1u);
  advance(60);
  EXPECT_TRUE(A.tx.empty());
  // A listener on another port does not take it.
  const uint32_t other = create_id(a, 0x61);
  ASSERT_EQ(bind_ip(a, other, kIpA, kPort + 1), 0);
  ASSERT_EQ(listen(a, other), 0);
  EXPECT_TRUE(A.tx.empty());
  EXPECT_TRUE(events(a).empty());
  // Its own does, and the connection completes.
  lis = create_id(a, kUidListen);
  ASSERT_EQ(bind_ip(a, lis, kIpA, kPort), 0);
  ASSERT_EQ(listen(a, lis), 0);
  const auto cr = event(a, RDMA_CM_EVENT_CONNECT_REQUEST);
  EXPECT_EQ(cr.resp.uid, kUidListen);
  aid = cr.resp.id;
  EXPECT_TRUE(A.tx.empty());
  ASSERT_NO_FATAL_FAILURE(accept_on_a());
  // Past the grace nothing more happens: the hold is over.
  advance(200);
  EXPECT_TRUE(A.tx.empty());
  EXPECT_EQ(stat(A, "cm_req_hold_expired"), 0u);
  EXPECT_EQ(stat(A, "cm_rej_tx"), 0u);
  EXPECT_EQ(stat(A, "cm_connections"), 1u);
}

// 2b. A held REQ nobody listens for is refused when the grace ends: REJ 8
// for it, REJECTED on B, as without the grace but later.
TEST_F(CmServerTest, HeldRequestIsRefusedAfterTheGrace) {
  ASSERT_NO_FATAL_FAILURE(request_held_by_a());
  advance(99);
  EXPECT_TRUE(A.tx.empty());
  advance(1);
  const Mad rej = take(A, Attr::kRej);
  EXPECT_EQ(rej.h.tid, req.h.tid);
  EXPECT_EQ(rej.as<cm::Rej>().reason, 8);
  EXPECT_EQ(rej.as<cm::Rej>().remote_comm_id, req.as<cm::Req>().local_comm_id);
  EXPECT_FALSE(A.srv->busy());
  deliver(rej, B);
  EXPECT_EQ(static_cast<int32_t>(event(b, RDMA_CM_EVENT_REJECTED).resp.status),
            8);
  EXPECT_EQ(stat(A, "cm_req_holds"), 1u);
  EXPECT_EQ(stat(A, "cm_req_hold_expired"), 1u);
  EXPECT_EQ(stat(A, "cm_rej_tx"), 1u);
  // A listener after the refusal changes nothing.
  lis = create_id(a, kUidListen);
  ASSERT_EQ(bind_ip(a, lis, kIpA, kPort), 0);
  ASSERT_EQ(listen(a, lis), 0);
  EXPECT_TRUE(events(a).empty());
}

// 2b'. A held REQ its sender withdraws (rdma_destroy_id in REQ_SENT: REJ
// "timeout" naming it by CA GUID and comm ID) is forgotten: a listener
// later gets no CONNECT_REQUEST for it, and nothing is refused.
TEST_F(CmServerTest, WithdrawnRequestLeavesTheHold) {
  ASSERT_NO_FATAL_FAILURE(request_held_by_a());
  ASSERT_EQ(destroy_id(b, bid), 0);
  const Mad rej = take(B, Attr::kRej);
  EXPECT_EQ(rej.as<cm::Rej>().reason,
            static_cast<uint16_t>(cm::RejReason::kTimeout));
  deliver(rej, A);
  EXPECT_FALSE(A.srv->busy());
  EXPECT_EQ(stat(A, "cm_mads_unmatched"), 0u);
  lis = create_id(a, kUidListen);
  ASSERT_EQ(bind_ip(a, lis, kIpA, kPort), 0);
  ASSERT_EQ(listen(a, lis), 0);
  advance(200);
  EXPECT_TRUE(events(a).empty());
  EXPECT_TRUE(A.tx.empty());
  EXPECT_EQ(stat(A, "cm_req_hold_expired"), 0u);
}

// 2c. A SIDR_REQ (a UD id's rdma_connect) waits for a UD listener alike,
// and is answered "unsupported" when the grace ends without one.
TEST_F(CmServerTest, SidrRequestWaitsForTheListener) {
  restart_a(100);
  auto sidr_from_b = [&](uint64_t uid) {
    bid = create_id(b, uid, cm::kPsUdp, IBV_QPT_UD);
    ASSERT_EQ(resolve_ip(b, bid, kIpA, kPort), 0);
    ASSERT_EQ(event(b, RDMA_CM_EVENT_ADDR_RESOLVED).resp.id, bid);
    ASSERT_EQ(resolve_route(b, bid), 0);
    ASSERT_EQ(event(b, RDMA_CM_EVENT_ROUTE_RESOLVED).resp.id, bid);
    ASSERT_EQ(connect(b, bid, {0x123, 0, 0, "ud"}), 0);
  };
  ASSERT_NO_FATAL_FAILURE(sidr_from_b(kUidB));
  const Mad q1 = take(B, Attr::kSidrReq);
  deliver(q1, A);
  EXPECT_TRUE(A.tx.empty());
  advance(50);
  lis = create_id(a, kUidListen, cm::kPsUdp, IBV_QPT_UD);
  ASSERT_EQ(bind_ip(a, lis, kIpA, kPort), 0);
  ASSERT_EQ(listen(a, lis), 0);
  EXPECT_EQ(event(a, RDMA_CM_EVENT_CONNECT_REQUEST).resp.uid, kUidListen);
  ASSERT_EQ(destroy_id(a, lis), 0);
  // Another, with nobody listening any more: "unsupported" after 100 ms.
  ASSERT_NO_FATAL_FAILURE(sidr_from_b(kUidB + 1));
  const Mad q2 = take(B, Attr::kSidrReq);
  deliver(q2, A);
  advance(99);
  EXPECT_TRUE(A.tx.empty());
  advance(1);
  const Mad r = take(A, Attr::kSidrRep);
  EXPECT_EQ(r.h.tid, q2.h.tid);
  EXPECT_EQ(r.as<cm::SidrRep>().status,
            static_cast<uint8_t>(cm::SidrStatus::kUnsupported));
  EXPECT_EQ(stat(A, "cm_req_holds"), 2u);
  EXPECT_EQ(stat(A, "cm_req_hold_expired"), 1u);
}

// A loopback address binds as the wildcard, as on Linux (cma_any_addr):
// no device behind the id, the bound address reported as given, the port
// taken on every address, and a request to the port's address is the
// listener's. libfabric's verbs provider binds "localhost" so (the passive
// endpoint of fi_pingpong -e msg and -e rdm over ofi_rxm); refused, every
// MSG endpoint failed with ENODATA.
TEST_F(CmServerTest, LoopbackBindIsTheWildcard) {
  constexpr uint32_t kLoop = 0x7f000001;  // 127.0.0.1
  lis = create_id(a, kUidListen);
  ASSERT_EQ(bind_ip(a, lis, kLoop, kPort), 0);
  const auto bound = query_route(a, lis);
  EXPECT_EQ(bound.node_guid, 0u);  // no device: id->verbs stays NULL
  EXPECT_EQ(bound.port_num, 0u);
  sockaddr_in src;
  std::memcpy(&src, &bound.src_addr, sizeof src);
  EXPECT_EQ(ntohl(src.sin_addr.s_addr), kLoop);
  EXPECT_EQ(ntohs(src.sin_port), kPort);
  // The port is the wildcard's: another address of 127/8, the port's own
  // and the wildcard all conflict with it (EADDRNOTAVAIL, cma_check_port).
  {
    const uint32_t x[3] = {create_id(a, 0x71), create_id(a, 0x72),
                           create_id(a, 0x73)};
    EXPECT_EQ(bind_ip(a, x[0], 0x7f000102, kPort), -EADDRNOTAVAIL);
    EXPECT_EQ(bind_ip(a, x[1], kIpA, kPort), -EADDRNOTAVAIL);
    EXPECT_EQ(bind_ip(a, x[2], 0, kPort), -EADDRNOTAVAIL);
    for (uint32_t i : x) EXPECT_EQ(destroy_id(a, i), 0);
  }
  // Another address that is not the port's still is not bindable.
  const uint32_t other = create_id(a, 0x74);
  EXPECT_EQ(bind_ip(a, other, kIpB, kPort + 9), -EADDRNOTAVAIL);
  EXPECT_EQ(destroy_id(a, other), 0);

  ASSERT_EQ(listen(a, lis), 0);
  ASSERT_NO_FATAL_FAILURE(connect_from_b());
  req = take(B, Attr::kReq);
  deliver(req, A);
  const auto cr = event(a, RDMA_CM_EVENT_CONNECT_REQUEST);
  EXPECT_EQ(cr.resp.uid, kUidListen);
  // The request's id is on the port, with the address B sent to.
  const auto child = query_route(a, cr.resp.id);
  EXPECT_EQ(child.node_guid, A.guid);
  std::memcpy(&src, &child.src_addr, sizeof src);
  EXPECT_EQ(ntohl(src.sin_addr.s_addr), kIpA);
  EXPECT_TRUE(A.tx.empty());  // no REJ
}

// 3. rdma_disconnect on both sides: DREQ, DREP, then timewait.
TEST_F(CmServerTest, DisconnectAndTimewait) {
  ASSERT_NO_FATAL_FAILURE(establish());
  const auto q = req.as<cm::Req>();
  const auto p = rep.as<cm::Rep>();
  // B: rdma_disconnect. Expect: a DREQ naming A's QP.
  ASSERT_EQ(disconnect(b, bid), 0);
  const Mad dreq = take(B, Attr::kDreq);
  expect_qp1(dreq, B, A);
  const auto d = dreq.as<cm::Dreq>();
  EXPECT_EQ(d.local_comm_id, q.local_comm_id);
  EXPECT_EQ(d.remote_comm_id, p.local_comm_id);
  EXPECT_EQ(d.remote_qpn, 0x456u);
  deliver(dreq, A);
  // Expect: DISCONNECTED on A, nothing sent yet.
  auto ev = event(a, RDMA_CM_EVENT_DISCONNECTED);
  EXPECT_EQ(ev.resp.id, aid);
  EXPECT_EQ(ev.resp.uid, kUidA);
  EXPECT_EQ(ev.resp.status, 0u);
  EXPECT_TRUE(A.tx.empty());
  // A: rdma_disconnect. Expect: the DREP for that DREQ.
  ASSERT_EQ(disconnect(a, aid), 0);
  const Mad drep = take(A, Attr::kDrep);
  expect_qp1(drep, A, B);
  EXPECT_EQ(drep.h.tid, dreq.h.tid);
  EXPECT_EQ(drep.as<cm::Drep>().local_comm_id, p.local_comm_id);
  EXPECT_EQ(drep.as<cm::Drep>().remote_comm_id, q.local_comm_id);
  deliver(drep, B);
  // Expect: DISCONNECTED on B.
  ev = event(b, RDMA_CM_EVENT_DISCONNECTED);
  EXPECT_EQ(ev.resp.id, bid);
  EXPECT_EQ(ev.resp.status, 0u);
  // B: rdma_disconnect again, as applications do on every DISCONNECTED
  // event. Expect: 0 (Linux ignores the DREQ/DREP it cannot send), and
  // nothing sent.
  EXPECT_EQ(disconnect(b, bid), 0);
  EXPECT_TRUE(B.tx.empty());
  // Expect: TIMEWAIT_EXIT on both after conv(17) = 512 ms, not before; the
  // DREQ is not sent again.
  advance(kTimewaitMs - 1);
  EXPECT_TRUE(events(a).empty());
  EXPECT_TRUE(events(b).empty());
  advance(1);
  ev = event(b, RDMA_CM_EVENT_TIMEWAIT_EXIT);
  EXPECT_EQ(ev.resp.event, 15u);
  EXPECT_EQ(ev.resp.id, bid);
  EXPECT_EQ(event(a, RDMA_CM_EVENT_TIMEWAIT_EXIT).resp.id, aid);
  advance(kReqWaitMs * 2);
  EXPECT_TRUE(A.tx.empty());
  EXPECT_TRUE(B.tx.empty());
  // Once the timewait is over too: 0, nothing sent.
  EXPECT_EQ(disconnect(a, aid), 0);
  EXPECT_TRUE(A.tx.empty());
  EXPECT_EQ(destroy_id(b, bid), 0);
  EXPECT_EQ(destroy_id(a, aid), 0);
  EXPECT_TRUE(A.tx.empty());
  EXPECT_TRUE(B.tx.empty());
}

// 3b. B's DREQ comes again before A's user has called rdma_disconnect: a
// duplicate, dropped (Linux cm_dreq_handler, DREQ_RCVD). The DREP means
// "the user has disconnected" and goes out only at A's rdma_disconnect.
TEST_F(CmServerTest, DuplicateDreqWaitsForTheUser) {
  ASSERT_NO_FATAL_FAILURE(establish());
  ASSERT_EQ(disconnect(b, bid), 0);
  const Mad dreq = take(B, Attr::kDreq);
  deliver(dreq, A);
  EXPECT_EQ(event(a, RDMA_CM_EVENT_DISCONNECTED).resp.id, aid);
  // Expect: B's DREQ again after its wait; A's user is still busy.
  advance(kReqWaitMs);
  const Mad dreq2 = take(B, Attr::kDreq);
  EXPECT_EQ(dreq2.b, dreq.b);
  deliver(dreq2, A);
  // Expect: no DREP and no second event from A.
  EXPECT_TRUE(A.tx.empty());
  EXPECT_TRUE(events(a).empty());
  // A: rdma_disconnect. Expect: now the DREP.
  ASSERT_EQ(disconnect(a, aid), 0);
  EXPECT_EQ(take(A, Attr::kDrep).h.tid, dreq.h.tid);
  EXPECT_TRUE(A.tx.empty());
}

// 3c. A REQ from a QP whose last connection with A is still in timewait
// (same CA GUID, same QPN) is stale: REJ 10 and no CONNECT_REQUEST (Linux
// cm_req_handler -> cm_insert_remote_qpn; RDMACM-NOTES.md §3.6, §4 slice 2).
TEST_F(CmServerTest, ReqFromQpInTimewaitIsRej10) {
  ASSERT_NO_FATAL_FAILURE(establish());
  ASSERT_EQ(disconnect(b, bid), 0);
  deliver(take(B, Attr::kDreq), A);
  EXPECT_EQ(event(a, RDMA_CM_EVENT_DISCONNECTED).resp.id, aid);
  ASSERT_EQ(disconnect(a, aid), 0);  // A enters timewait
  deliver(take(A, Attr::kDrep), B);
  EXPECT_EQ(event(b, RDMA_CM_EVENT_DISCONNECTED).resp.id, bid);
  // B connects again at once, from QP 0x123, with a new id.
  const uint32_t bid2 = create_id(b, kUidB + 1);
  ASSERT_EQ(resolve_ip(b, bid2, kIpA, kPort), 0);
  EXPECT_EQ(event(b, RDMA_CM_EVENT_ADDR_RESOLVED).resp.id, bid2);
  ASSERT_EQ(resolve_route(b, bid2), 0);
  EXPECT_EQ(event(b, RDMA_CM_EVENT_ROUTE_RESOLVED).resp.id, bid2);
  ASSERT_EQ(connect(b, bid2, {0x123, 1, 1, ""}), 0);
  const Mad req2 = take(B, Attr::kReq);
  deliver(req2, A);
  // Expect: REJ "stale connection" (10) for that REQ, no CONNECT_REQUEST.
  EXPECT_TRUE(events(a).empty());
  ASSERT_EQ(A.tx.size(), 1u);
  const Mad rej = take(A, Attr::kRej);
  EXPECT_EQ(rej.h.tid, req2.h.tid);
  EXPECT_EQ(rej.as<cm::Rej>().reason, 10);
  EXPECT_EQ(rej.as<cm::Rej>().remote_comm_id, req2.as<cm::Req>().local_comm_id);
  EXPECT_TRUE(events(a).empty());
}

// 4. A REQ nobody answers: resent unchanged every 4.6 s, 15 times, then
// UNREACHABLE.
TEST_F(CmServerTest, ReqRetransmittedThenUnreachable) {
  ASSERT_NO_FATAL_FAILURE(listen_and_connect());
  req = take(B, Attr::kReq);  // lost
  advance(kReqWaitMs - 1);
  EXPECT_TRUE(B.tx.empty());
  // Expect: the same MAD again at 2 * 256 + 4096 ms.
  advance(1);
  Mad again = take(B, Attr::kReq);
  EXPECT_EQ(again.b, req.b);
  expect_qp1(again, B, A);
  EXPECT_EQ(stat(B, "cm_mads_retransmitted"), 1u);
  for (int i = 2; i <= kMaxCmRetries; ++i) {
    advance(kReqWaitMs);
    again = take(B, Attr::kReq);
    EXPECT_EQ(again.b, req.b) << "retry " << i;
  }
  EXPECT_EQ(stat(B, "cm_mads_retransmitted"), kMaxCmRetries);
  EXPECT_TRUE(events(b).empty());
  // Expect: after the 15th retry's wait, UNREACHABLE (-ETIMEDOUT) and no
  // 17th REQ.
  advance(kReqWaitMs);
  EXPECT_TRUE(B.tx.empty());
  const auto ev = event(b, RDMA_CM_EVENT_UNREACHABLE);
  EXPECT_EQ(ev.resp.id, bid);
  EXPECT_EQ(static_cast<int32_t>(ev.resp.status), -ETIMEDOUT);
  EXPECT_EQ(stat(B, "cm_timeouts"), 1u);
  advance(kReqWaitMs);
  EXPECT_TRUE(B.tx.empty());
  EXPECT_TRUE(events(b).empty());
  EXPECT_TRUE(events(a).empty());
}

// 4b. RDMA_OPTION_ID_ACK_TIMEOUT set before rdma_connect is the path's
// packet life + 1, as cma.c builds a RoCE route: the REQ asks the peer for
// that local ACK timeout (cm_ack_timeout(15, 20 - 1) = 20), and the REQ's
// wait is 2 * conv(19) + the response timeout (cm.c).
TEST_F(CmServerTest, AckTimeoutOptionReachesTheReq) {
  lis = create_id(a, kUidListen);
  ASSERT_EQ(bind_ip(a, lis, kIpA, kPort), 0);
  ASSERT_EQ(listen(a, lis), 0);
  bid = create_id(b, kUidB);
  ASSERT_EQ(set_option(b, bid, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT,
                       std::string(1, '\x14')),
            0);
  ASSERT_EQ(resolve_ip(b, bid, kIpA, kPort), 0);
  ASSERT_EQ(event(b, RDMA_CM_EVENT_ADDR_RESOLVED).resp.id, bid);
  ASSERT_EQ(resolve_route(b, bid), 0);
  ASSERT_EQ(event(b, RDMA_CM_EVENT_ROUTE_RESOLVED).resp.id, bid);
  ASSERT_EQ(connect(b, bid, {0x123, 1, 1, "hello A"}), 0);
  req = take(B, Attr::kReq);  // lost
  EXPECT_EQ(req.as<cm::Req>().primary.local_ack_timeout, 20);
  const uint64_t wait_ms = 2 * 2048 + 4096;  // conv(19) = 2^11 ms (cm.c)
  advance(wait_ms - 1);
  EXPECT_TRUE(B.tx.empty());
  advance(1);
  EXPECT_EQ(take(B, Attr::kReq).b, req.b);
}

// 5a. The REP is lost: B's REQ comes again and A answers it with the same
// REP, without a second CONNECT_REQUEST.
TEST_F(CmServerTest, LostRepAnsweredOnDuplicateReq) {
  ASSERT_NO_FATAL_FAILURE(request_reaches_a());
  // The REQ comes again before A's user has answered. Expect: no second
  // CONNECT_REQUEST; an MRA for the REQ (service timeout 24) tells B to
  // wait longer, as Linux's passive side does for a user-space consumer.
  deliver(req, A);
  EXPECT_TRUE(events(a).empty());
  const auto mra = take(A, Attr::kMra).as<cm::Mra>();
  EXPECT_EQ(mra.message_mraed, 0u);
  EXPECT_EQ(mra.service_timeout, 24u);
  EXPECT_EQ(mra.remote_comm_id, req.as<cm::Req>().local_comm_id);
  EXPECT_TRUE(A.tx.empty());
  advance(1000);  // A's user takes a second to accept
  ASSERT_EQ(accept(a, aid, kUidA, {0x456, 1, 1, "hello B"}), 0);
  rep = take(A, Attr::kRep);  // lost
  // Expect: B's REQ again 4.6 s after the first.
  advance(kReqWaitMs - 1000);
  const Mad req2 = take(B, Attr::kReq);
  EXPECT_EQ(req2.b, req.b);
  deliver(req2, A);
  // Expect: the same REP again, no event on A.
  const Mad rep2 = take(A, Attr::kRep);
  EXPECT_EQ(rep2.b, rep.b);
  expect_qp1(rep2, A, B);
  EXPECT_TRUE(A.tx.empty());
  EXPECT_TRUE(events(a).empty());
  EXPECT_EQ(stat(A, "cm_ids"), 2u);  // the listener and one connection
  deliver(rep2, B);
  // Expect: CONNECT_RESPONSE on B; the handshake ends as usual.
  EXPECT_EQ(event(b, RDMA_CM_EVENT_CONNECT_RESPONSE).resp.param.conn.qp_num,
            0x456u);
  ASSERT_EQ(accept_response(b, bid, kUidB), 0);
  deliver(take(B, Attr::kRtu), A);
  EXPECT_EQ(event(a, RDMA_CM_EVENT_ESTABLISHED).resp.id, aid);
}

// 5b. The RTU is lost: A's REP comes again and B, established, sends the RTU
// again without a second CONNECT_RESPONSE.
TEST_F(CmServerTest, LostRtuResentOnDuplicateRep) {
  ASSERT_NO_FATAL_FAILURE(request_reaches_a());
  ASSERT_EQ(accept(a, aid, kUidA, {0x456, 1, 1, ""}), 0);
  rep = take(A, Attr::kRep);
  deliver(rep, B);
  EXPECT_EQ(event(b, RDMA_CM_EVENT_CONNECT_RESPONSE).resp.id, bid);
  ASSERT_EQ(accept_response(b, bid, kUidB), 0);
  const Mad rtu = take(B, Attr::kRtu);  // lost
  // Expect: A resends the REP, unchanged, when its wait runs out.
  advance(kReqWaitMs);
  const Mad rep2 = take(A, Attr::kRep);
  EXPECT_EQ(rep2.b, rep.b);
  EXPECT_EQ(stat(A, "cm_mads_retransmitted"), 1u);
  deliver(rep2, B);
  // Expect: the RTU again, and no event on B.
  const Mad rtu2 = take(B, Attr::kRtu);
  EXPECT_EQ(rtu2.b, rtu.b);
  EXPECT_TRUE(events(b).empty());
  deliver(rtu2, A);
  // Expect: ESTABLISHED on A, and the REP timer stopped.
  EXPECT_EQ(event(a, RDMA_CM_EVENT_ESTABLISHED).resp.uid, kUidA);
  advance(kReqWaitMs * 2);
  EXPECT_TRUE(A.tx.empty());
  EXPECT_TRUE(B.tx.empty());
}

// 5c. The REP's wait: Linux's passive side resends the REP after the REQ's
// local CM response timeout alone (cm_req_handler: timeout_ms =
// conv(local_cm_response_timeout) = 4096 ms; RDMACM-NOTES.md §3.6), not
// after the REQ's 2 * packet life + response timeout.
TEST_F(CmServerTest, RepResentAfterReqLocalResponseTimeout) {
  ASSERT_NO_FATAL_FAILURE(request_reaches_a());
  ASSERT_EQ(accept(a, aid, kUidA, {0x456, 1, 1, ""}), 0);
  rep = take(A, Attr::kRep);  // lost
  advance(kRepWaitMs - 1);
  EXPECT_TRUE(A.tx.empty());
  // Expect: the REP again at 4096 ms.
  advance(1);
  ASSERT_EQ(A.tx.size(), 1u);
  EXPECT_EQ(take(A, Attr::kRep).b, rep.b);
}

// 6. A answers the REQ with an MRA (service timeout 24: 67 s): B waits that
// long instead of resending at 4.6 s.
TEST_F(CmServerTest, MraDelaysReqRetransmission) {
  ASSERT_NO_FATAL_FAILURE(request_reaches_a());
  const auto q = req.as<cm::Req>();
  // The MRA a kernel CM sends for a REQ its user has not answered yet.
  cm::MadHdr h;
  h.tid = req.h.tid;
  cm::Mra m;
  m.local_comm_id = 0x0a0a0a0a;
  m.remote_comm_id = q.local_comm_id;
  m.message_mraed = 0;  // the REQ
  m.service_timeout = 24;
  uint8_t mad[cm::kMadSize];
  cm::encode(h, m, mad);
  deliver(forge(A, B, mad), B);
  // Expect: nothing at the normal wait ...
  advance(kReqWaitMs);
  EXPECT_TRUE(B.tx.empty());
  EXPECT_EQ(stat(B, "cm_mads_retransmitted"), 0u);
  advance(kMraWaitMs - kReqWaitMs - 1);
  EXPECT_TRUE(B.tx.empty());
  // ... the REQ again once conv(24) + conv(17) has passed.
  advance(1);
  EXPECT_EQ(take(B, Attr::kReq).b, req.b);
  EXPECT_EQ(stat(B, "cm_mads_retransmitted"), 1u);
  EXPECT_TRUE(events(b).empty());
}

// 7. rdma_reject with private data: REJ 28 carrying it; REJECTED 28 on B.
TEST_F(CmServerTest, RejectCarriesPrivateData) {
  ASSERT_NO_FATAL_FAILURE(request_reaches_a());
  const auto q = req.as<cm::Req>();
  ASSERT_EQ(reject(a, aid, "go away"), 0);
  // Expect: REJ "consumer defined" (28) for the REQ, with "go away".
  const Mad rej = take(A, Attr::kRej);
  expect_qp1(rej, A, B);
  const auto r = rej.as<cm::Rej>();
  EXPECT_EQ(rej.h.tid, req.h.tid);
  EXPECT_EQ(r.reason, 28);
  EXPECT_EQ(r.message_rejected, 0);
  EXPECT_EQ(r.remote_comm_id, q.local_comm_id);
  EXPECT_EQ(std::memcmp(r.private_data, "go away", 8), 0);
  // The REJ is lost, B's REQ comes again: the same REJ again, at once (not
  // silence until B gives up a minute later), and no second
  // CONNECT_REQUEST.
  deliver(req, A);
  EXPECT_EQ(take(A, Attr::kRej).b, rej.b);
  EXPECT_TRUE(events(a).empty());
  deliver(rej, B);
  // Expect: REJECTED (28) on B with the REJ's 148 bytes of private data.
  const auto ev = event(b, RDMA_CM_EVENT_REJECTED);
  EXPECT_EQ(ev.resp.id, bid);
  EXPECT_EQ(static_cast<int32_t>(ev.resp.status), 28);
  EXPECT_EQ(ev.resp.param.conn.private_data_len, cm::kRejPrivateDataSize);
  EXPECT_STREQ(reinterpret_cast<const char*>(ev.resp.param.conn.private_data),
               "go away");
  // The rejected id goes quietly; B's REQ is not resent.
  EXPECT_EQ(destroy_id(a, aid), 0);
  advance(kReqWaitMs);
  EXPECT_TRUE(A.tx.empty());
  EXPECT_TRUE(B.tx.empty());
}

// 8a. A's control connection closes (the process died) while connected:
// its CM sends the DREQ (Linux cm_destroy_id in ESTABLISHED).
TEST_F(CmServerTest, CloseWhileEstablishedSendsDreq) {
  ASSERT_NO_FATAL_FAILURE(establish());
  const auto q = req.as<cm::Req>();
  const auto p = rep.as<cm::Rep>();
  A.srv->on_close(a.ci);
  // Expect: DREQ naming B's QP; A keeps no channel and no id.
  const Mad dreq = take(A, Attr::kDreq);
  expect_qp1(dreq, A, B);
  const auto d = dreq.as<cm::Dreq>();
  EXPECT_EQ(d.local_comm_id, p.local_comm_id);
  EXPECT_EQ(d.remote_comm_id, q.local_comm_id);
  EXPECT_EQ(d.remote_qpn, 0x123u);
  EXPECT_EQ(stat(A, "cm_channels"), 0u);
  EXPECT_EQ(stat(A, "cm_ids"), 0u);
  EXPECT_EQ(stat(A, "cm_listening"), 0u);  // the listener went with it
  EXPECT_EQ(stat(A, "cm_listens"), 1u);
  deliver(dreq, B);
  // Expect: DISCONNECTED on B; its DREP finds nothing on A.
  EXPECT_EQ(event(b, RDMA_CM_EVENT_DISCONNECTED).resp.id, bid);
  ASSERT_EQ(disconnect(b, bid), 0);
  const Mad drep = take(B, Attr::kDrep);
  EXPECT_EQ(drep.h.tid, dreq.h.tid);
  deliver(drep, A);
  EXPECT_TRUE(A.tx.empty());
  EXPECT_EQ(stat(A, "cm_mads_unmatched"), 1u);
  advance(kReqWaitMs * 2);
  EXPECT_TRUE(A.tx.empty());
}

// 8b. rdma_destroy_id on a connection request not yet answered: REJ 28.
TEST_F(CmServerTest, DestroyReqRcvdIdSendsRej28) {
  ASSERT_NO_FATAL_FAILURE(request_reaches_a());
  const auto q = req.as<cm::Req>();
  ASSERT_EQ(destroy_id(a, aid), 0);
  const Mad rej = take(A, Attr::kRej);
  expect_qp1(rej, A, B);
  const auto r = rej.as<cm::Rej>();
  EXPECT_EQ(rej.h.tid, req.h.tid);
  EXPECT_EQ(r.reason, 28);
  EXPECT_EQ(r.message_rejected, 0);
  EXPECT_EQ(r.remote_comm_id, q.local_comm_id);
  deliver(rej, B);
  EXPECT_EQ(static_cast<int32_t>(event(b, RDMA_CM_EVENT_REJECTED).resp.status),
            28);
  EXPECT_EQ(stat(A, "cm_ids"), 1u);  // the listener
  EXPECT_TRUE(events(a).empty());
}

// 8c. B gives up (rdma_destroy_id) while its REQ waits at A: REJ "timeout"
// (4) with B's CA GUID as ARI (Linux cm_destroy_id in REQ_SENT). A finds the
// request by (ARI GUID, B's comm ID) (cm_acquire_rejected_id) and drops it,
// so A's later rdma_accept fails and sends nothing.
TEST_F(CmServerTest, WithdrawnRequestCannotBeAccepted) {
  ASSERT_NO_FATAL_FAILURE(request_reaches_a());
  const auto q = req.as<cm::Req>();
  ASSERT_EQ(destroy_id(b, bid), 0);
  const Mad rej = take(B, Attr::kRej);
  expect_qp1(rej, B, A);
  const auto r = rej.as<cm::Rej>();
  EXPECT_EQ(rej.h.tid, req.h.tid);
  EXPECT_EQ(r.reason, 4);
  EXPECT_EQ(r.local_comm_id, q.local_comm_id);
  EXPECT_EQ(r.remote_comm_id, 0u);
  EXPECT_EQ(r.ari_length, 8);
  EXPECT_EQ(std::memcmp(r.ari, &B.guid, 8), 0);
  deliver(rej, A);
  EXPECT_EQ(stat(A, "cm_mads_unmatched"), 0u);
  // Expect: A's accept of the withdrawn request fails; no REP.
  EXPECT_NE(accept(a, aid, kUidA, {0x456, 1, 1, ""}), 0);
  EXPECT_TRUE(A.tx.empty());
}

// 9a. Commands an application (or a broken shim) should not be able to use
// to confuse the service.
TEST_F(CmServerTest, HostileCommands) {
  const uint32_t id = create_id(a, kUidA);
  // Each command's struct cut short by one byte: EINVAL, before any id is
  // looked at.
  const std::pair<uint32_t, size_t> sizes[] = {
      {RDMA_USER_CM_CMD_CREATE_ID, sizeof(rdma_ucm_create_id)},
      {RDMA_USER_CM_CMD_DESTROY_ID, sizeof(rdma_ucm_destroy_id)},
      {RDMA_USER_CM_CMD_BIND_IP, sizeof(rdma_ucm_bind_ip)},
      {RDMA_USER_CM_CMD_RESOLVE_IP, sizeof(rdma_ucm_resolve_ip)},
      {RDMA_USER_CM_CMD_RESOLVE_ROUTE, sizeof(rdma_ucm_resolve_route)},
      {RDMA_USER_CM_CMD_QUERY_ROUTE, sizeof(rdma_ucm_query)},
      {RDMA_USER_CM_CMD_CONNECT, sizeof(rdma_ucm_connect)},
      {RDMA_USER_CM_CMD_LISTEN, sizeof(rdma_ucm_listen)},
      {RDMA_USER_CM_CMD_ACCEPT, sizeof(rdma_ucm_accept)},
      {RDMA_USER_CM_CMD_REJECT, sizeof(rdma_ucm_reject)},
      {RDMA_USER_CM_CMD_DISCONNECT, sizeof(rdma_ucm_disconnect)},
      {RDMA_USER_CM_CMD_INIT_QP_ATTR, sizeof(rdma_ucm_init_qp_attr)},
      {RDMA_USER_CM_CMD_SET_OPTION, sizeof(rdma_ucm_set_option)},
      {RDMA_USER_CM_CMD_MIGRATE_ID, sizeof(rdma_ucm_migrate_id)},
  };
  for (const auto& [cmd, size] : sizes) {
    std::string body(size - 1, '\0');
    std::memcpy(body.data(), &id, std::min<size_t>(4, body.size()));
    EXPECT_EQ(ucma(a, cmd, body).status, -EINVAL) << "command " << cmd;
  }
  // `in` that disagrees with the bytes sent: EINVAL.
  shim::CmCommandReq c;
  c.cmd = RDMA_USER_CM_CMD_DISCONNECT;
  c.in = 64;
  rdma_ucm_disconnect dq{};
  dq.id = id;
  EXPECT_EQ(request(a, shim::Op::kCmCommand, bytes(c) + bytes(dq)).status,
            -EINVAL);
  EXPECT_EQ(request(a, shim::Op::kCmCommand, "abc").status, -EINVAL);
  // More option bytes than any option has: EINVAL.
  EXPECT_EQ(set_option(a, id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS,
                       std::string(shim::kCmMaxOption + 1, 'x')),
            -EINVAL);
  // An option whose length is not its type's: EINVAL; other levels: ENOSYS.
  EXPECT_EQ(set_option(a, id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, "abcd"),
            -EINVAL);
  EXPECT_EQ(set_option(a, id, RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, "x"),
            -ENOSYS);
  EXPECT_EQ(set_option(a, id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, "\x20"), 0);

  // Another channel of A names this channel's id: EINVAL, and the id stays.
  Chan other = open(A);
  EXPECT_EQ(resolve_route(other, id), -EINVAL);
  EXPECT_EQ(listen(other, id), -EINVAL);
  EXPECT_EQ(destroy_id(other, id), -EINVAL);
  EXPECT_EQ(bind_ip(a, id, kIpA, kPort), 0);
  // The same port again: EADDRINUSE for the same address, EADDRNOTAVAIL
  // when either address is the wildcard (Linux's cma_check_port).
  {
    const uint32_t x[4] = {create_id(a, 0x71), create_id(a, 0x72),
                           create_id(a, 0x73), create_id(a, 0x74)};
    EXPECT_EQ(bind_ip(a, x[0], kIpA, kPort), -EADDRINUSE);
    EXPECT_EQ(bind_ip(a, x[1], 0, kPort), -EADDRNOTAVAIL);
    EXPECT_EQ(bind_ip(a, x[2], 0, kPort + 7), 0);
    EXPECT_EQ(bind_ip(a, x[3], kIpA, kPort + 7), -EADDRNOTAVAIL);
    for (uint32_t i : x) EXPECT_EQ(destroy_id(a, i), 0);
  }
  // An id number never given out: EINVAL. So is one never connecting (no
  // IB CM id behind it, Linux's rdma_disconnect).
  EXPECT_EQ(disconnect(a, 0xdead), -EINVAL);
  EXPECT_EQ(disconnect(a, id), -EINVAL);

  // A command librdmacm never sends (GET_OPTION has no kernel handler
  // either) and one past the table: ENOSYS.
  EXPECT_EQ(ucma(a, RDMA_USER_CM_CMD_GET_OPTION, std::string(16, '\0')).status,
            -ENOSYS);
  EXPECT_EQ(ucma(a, 99, std::string(16, '\0')).status, -ENOSYS);
  // BIND with an AF_IB address (librdmacm's probe): EAFNOSUPPORT, so it
  // keeps to the IP commands.
  rdma_ucm_bind bq{};
  bq.id = id;
  bq.addr_size = 48;
  bq.addr.ss_family = 27;  // AF_IB
  const uint64_t errors = stat(A, "cm_command_errors");
  EXPECT_EQ(ucma(a, RDMA_USER_CM_CMD_BIND, bytes(bq)).status, -EAFNOSUPPORT);
  // Counted apart: every librdmacm process sends one.
  EXPECT_EQ(stat(A, "cm_af_ib_refused"), 1u);
  EXPECT_EQ(stat(A, "cm_command_errors"), errors);

  // A control connection without a channel: EBADF; a second channel on
  // one connection: EBUSY; another shim ABI: EPROTO.
  Chan none;
  none.node = &A;
  none.ci.id = 99;
  EXPECT_EQ(disconnect(none, id), -EBADF);
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  fds_.push_back(sv[0]);
  EXPECT_EQ(
      request(a, shim::Op::kCmOpen, bytes(shim::CmOpenReq{}), {sv[1]}).status,
      -EBUSY);
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  fds_.push_back(sv[0]);
  shim::CmOpenReq old;
  old.abi = shim::kShimAbi - 1;
  EXPECT_EQ(request(none, shim::Op::kCmOpen, bytes(old), {sv[1]}).status,
            -EPROTO);

  EXPECT_EQ(stat(A, "cm_ids"), 1u);
  EXPECT_TRUE(events(a).empty());
  EXPECT_TRUE(A.tx.empty());
  EXPECT_EQ(destroy_id(a, id), 0);
  EXPECT_EQ(stat(A, "cm_ids"), 0u);
}

// 9b. MADs the GSI would not take: counted as bad, nothing else happens.
TEST_F(CmServerTest, BadMadsChangeNothing) {
  lis = create_id(a, kUidListen);
  ASSERT_EQ(bind_ip(a, lis, kIpA, kPort), 0);
  ASSERT_EQ(listen(a, lis), 0);
  ASSERT_NO_FATAL_FAILURE(connect_from_b());
  req = take(B, Attr::kReq);
  // The REQ with class version 1 (Linux's agent registers version 2 only).
  auto bad = req.b;
  bad[2] = 1;
  deliver(forge(B, A, bad.data()), A);
  EXPECT_EQ(stat(A, "cm_mads_bad"), 1u);
  // The REQ with another Q_Key than QP1's.
  deliver(forge(B, A, req.b.data(), 0x80010001), A);
  EXPECT_EQ(stat(A, "cm_mads_bad"), 2u);
  // The REQ cut to 255 bytes.
  A.srv->rx(req.f, req.b.data(), cm::kMadSize - 1, now);
  EXPECT_EQ(stat(A, "cm_mads_bad"), 3u);
  // The REQ with a P_Key outside the table (rxe check_keys drops it).
  wire::RoceFields other = req.f;
  other.pkey = 0x1234;
  A.srv->rx(other, req.b.data(), cm::kMadSize, now);
  EXPECT_EQ(stat(A, "cm_mads_bad"), 4u);
  // Expect: no event, no answer, no new id.
  EXPECT_TRUE(events(a).empty());
  EXPECT_TRUE(A.tx.empty());
  EXPECT_EQ(stat(A, "cm_ids"), 1u);
  // The REQ itself still connects.
  deliver(req, A);
  EXPECT_EQ(event(a, RDMA_CM_EVENT_CONNECT_REQUEST).resp.uid, kUidListen);
  EXPECT_EQ(stat(A, "cm_mads_bad"), 4u);
}

// 9c. A DREQ for a connection A does not know still gets a DREP (Linux
// cm_issue_drep), so the peer does not wait out its retries.
TEST_F(CmServerTest, UnknownDreqGetsDrep) {
  cm::MadHdr h;
  h.tid = 0x0000000712345678;
  cm::Dreq d;
  d.local_comm_id = 0x12345678;
  d.remote_comm_id = 0x0badc0de;
  d.remote_qpn = 0x777;
  uint8_t mad[cm::kMadSize];
  cm::encode(h, d, mad);
  deliver(forge(B, A, mad), A);
  // Expect: DREP to B: the DREQ's TID, its comm IDs swapped.
  const Mad drep = take(A, Attr::kDrep);
  expect_qp1(drep, A, B);
  EXPECT_EQ(drep.h.tid, h.tid);
  EXPECT_EQ(drep.as<cm::Drep>().local_comm_id, 0x0badc0deu);
  EXPECT_EQ(drep.as<cm::Drep>().remote_comm_id, 0x12345678u);
  EXPECT_TRUE(A.tx.empty());
  EXPECT_TRUE(events(a).empty());
}

// 10a. mckey's rdma_resolve_addr to a group: ADDR_RESOLVED at once (no ARP:
// a group's MAC is its own), the id bound to urnic's port and address, and
// nothing sent. A group is joined, never routed to or connected to.
TEST_F(CmServerTest, MulticastResolveGivesAddrResolved) {
  bid = create_id(b, kUidB, cm::kPsUdp, IBV_QPT_UD);
  ASSERT_EQ(resolve_ip(b, bid, kGroup, 0), 0);
  const auto ev = event(b, RDMA_CM_EVENT_ADDR_RESOLVED);
  EXPECT_EQ(ev.resp.id, bid);
  EXPECT_EQ(ev.resp.uid, kUidB);
  EXPECT_EQ(ev.resp.status, 0u);
  EXPECT_FALSE(B.srv->busy());
  // librdmacm's QUERY_ROUTE on ADDR_RESOLVED: B's address and port, the
  // group as the destination, no path.
  const auto qr = query_route(b, bid);
  EXPECT_EQ(qr.node_guid, B.guid);
  EXPECT_EQ(qr.port_num, 1);
  EXPECT_EQ(qr.num_paths, 0);
  sockaddr_in src, dst;
  std::memcpy(&src, &qr.src_addr, sizeof src);
  std::memcpy(&dst, &qr.dst_addr, sizeof dst);
  EXPECT_EQ(src.sin_family, AF_INET);
  EXPECT_EQ(ntohl(src.sin_addr.s_addr), kIpB);
  EXPECT_NE(src.sin_port, 0);
  EXPECT_EQ(ntohl(dst.sin_addr.s_addr), kGroup);
  // rdma_create_qp's INIT attributes: RDMA_UDP_QKEY.
  const auto qa = init_qp_attr(b, bid, IBV_QPS_INIT);
  EXPECT_EQ(qa.qkey, 0x01234567u);
  EXPECT_EQ(qa.qp_attr_mask & IBV_QP_QKEY, static_cast<uint32_t>(IBV_QP_QKEY));
  // No route to a group, no connection: EINVAL with the reason, no MAD.
  rdma_ucm_resolve_route rq{};
  rq.id = bid;
  const Res rr = ucma(b, RDMA_USER_CM_CMD_RESOLVE_ROUTE, bytes(rq));
  EXPECT_EQ(rr.status, -EINVAL);
  EXPECT_NE(rr.payload.find("multicast"), std::string::npos) << rr.payload;
  rdma_ucm_connect cq{};
  put_param(cq.conn_param, {0x123, 0, 0, ""});
  cq.id = bid;
  const Res cr = ucma(b, RDMA_USER_CM_CMD_CONNECT, bytes(cq));
  EXPECT_EQ(cr.status, -EINVAL);
  EXPECT_NE(cr.payload.find("multicast"), std::string::npos) << cr.payload;
  EXPECT_TRUE(events(b).empty());
  EXPECT_TRUE(B.tx.empty());
  EXPECT_EQ(stat(B, "cm_mads_tx"), 0u);
}

// 10b. JOIN_IP_MCAST (librdmacm without AF_IB): the membership's handle in
// the reply, then MULTICAST_JOIN naming the membership (the join's uid, the
// handle) with the group's AH. No frame goes out (no IGMP, no MAD).
TEST_F(CmServerTest, JoinIpMcastGivesHandleAndEvent) {
  ASSERT_NO_FATAL_FAILURE(resolve_group_from_b());
  const Res r = join_ip(b, bid, kUidMc, kGroup);
  ASSERT_EQ(r.status, 0) << r.payload;
  const uint32_t h = r.as<rdma_ucm_create_id_resp>().id;
  EXPECT_NE(h, 0u);
  const auto ev = event(b, RDMA_CM_EVENT_MULTICAST_JOIN);
  expect_join_event(ev, bid, kUidMc, h, kGroup);
  EXPECT_TRUE(B.tx.empty());
  EXPECT_EQ(stat(B, "cm_mcast_joins"), 1u);
  EXPECT_EQ(stat(B, "cm_mcast_groups"), 1u);
  EXPECT_EQ(stat(B, "cm_mcast_refused"), 0u);
  EXPECT_EQ(stat(B, "cm_command_errors"), 0u);
}

// 10c. JOIN_MCAST from an id only bound (ADDR_BOUND), as a full and as a
// send-only full member; the same group twice is two memberships (Linux's
// rdma_join_multicast does not look for one). Other join_flags, or an
// address size not the family's: EINVAL, no event.
TEST_F(CmServerTest, JoinMcastBothFlags) {
  bid = create_id(b, kUidB, cm::kPsUdp, IBV_QPT_UD);
  ASSERT_EQ(bind_ip(b, bid, kIpB, kPort), 0);
  const Res full = join(b, bid, kUidMc, kGroup, RDMA_MC_JOIN_FLAG_FULLMEMBER);
  ASSERT_EQ(full.status, 0) << full.payload;
  const uint32_t h1 = full.as<rdma_ucm_create_id_resp>().id;
  expect_join_event(event(b, RDMA_CM_EVENT_MULTICAST_JOIN), bid, kUidMc, h1,
                    kGroup);
  const Res send_only =
      join(b, bid, kUidMc2, kGroup, RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER);
  ASSERT_EQ(send_only.status, 0) << send_only.payload;
  const uint32_t h2 = send_only.as<rdma_ucm_create_id_resp>().id;
  EXPECT_NE(h2, h1);
  expect_join_event(event(b, RDMA_CM_EVENT_MULTICAST_JOIN), bid, kUidMc2, h2,
                    kGroup);
  // Another group on the same id.
  const Res other = join(b, bid, kUidMc, 0xe0000001, 0);  // 224.0.0.1
  ASSERT_EQ(other.status, 0) << other.payload;
  expect_join_event(event(b, RDMA_CM_EVENT_MULTICAST_JOIN), bid, kUidMc,
                    other.as<rdma_ucm_create_id_resp>().id, 0xe0000001);
  EXPECT_EQ(stat(B, "cm_mcast_groups"), 3u);

  const Res bad_flags = join(b, bid, kUidMc, kGroup, 2);
  EXPECT_EQ(bad_flags.status, -EINVAL);
  EXPECT_NE(bad_flags.payload.find("join_flags"), std::string::npos)
      << bad_flags.payload;
  EXPECT_EQ(join(b, bid, kUidMc, kGroup, 0xffff).status, -EINVAL);
  EXPECT_EQ(join(b, bid, kUidMc, kGroup, 0, sizeof(sockaddr_in6)).status,
            -EINVAL);
  EXPECT_EQ(join(b, bid, kUidMc, kGroup, 0, 0).status, -EINVAL);
  EXPECT_TRUE(events(b).empty());
  EXPECT_EQ(stat(B, "cm_mcast_joins"), 3u);
  EXPECT_EQ(stat(B, "cm_mcast_refused"), 4u);
  EXPECT_EQ(stat(B, "cm_mcast_groups"), 3u);
}

// 10d. Joins Linux refuses, with its errno, each with a reason and no
// event.
TEST_F(CmServerTest, JoinRefusals) {
  auto refused = [&](const Res& r, int err, std::string_view why) {
    EXPECT_EQ(r.status, -err) << r.payload;
    EXPECT_NE(r.payload.find(why), std::string::npos) << r.payload;
  };
  // Not bound to the port (ucma_get_ctx_dev): a new id, one bound to the
  // wildcard address.
  const uint32_t fresh = create_id(b, 0x51, cm::kPsUdp, IBV_QPT_UD);
  refused(join_ip(b, fresh, kUidMc, kGroup), EINVAL, "bound");
  const uint32_t any = create_id(b, 0x52, cm::kPsUdp, IBV_QPT_UD);
  ASSERT_EQ(bind_ip(b, any, 0, kPort), 0);
  refused(join_ip(b, any, kUidMc, kGroup), EINVAL, "bound");
  // An RC id of RDMA_PS_TCP (Linux's are RC: rdma_join_multicast wants UD).
  const uint32_t rc = create_id(b, 0x53);
  ASSERT_EQ(resolve_ip(b, rc, kGroup, 0), 0);
  ASSERT_EQ(event(b, RDMA_CM_EVENT_ADDR_RESOLVED).resp.id, rc);
  refused(join_ip(b, rc, kUidMc, kGroup), EINVAL, "UD");
  // RDMA_PS_IPOIB: Linux never binds one to a RoCE port.
  const uint32_t ipoib = create_id(b, 0x54, cm::kPsIpoib, IBV_QPT_UD);
  ASSERT_EQ(bind_ip(b, ipoib, kIpB, kPort), 0);
  refused(join_ip(b, ipoib, kUidMc, kGroup), EINVAL, "IPOIB");
  // A UD id whose route was resolved (to a unicast peer): not ADDR_BOUND or
  // ADDR_RESOLVED any more.
  const uint32_t routed = create_id(b, 0x55, cm::kPsUdp, IBV_QPT_UD);
  ASSERT_EQ(resolve_ip(b, routed, kIpA, kPort), 0);
  ASSERT_EQ(event(b, RDMA_CM_EVENT_ADDR_RESOLVED).resp.id, routed);
  ASSERT_EQ(resolve_route(b, routed), 0);
  ASSERT_EQ(event(b, RDMA_CM_EVENT_ROUTE_RESOLVED).resp.id, routed);
  refused(join_ip(b, routed, kUidMc, kGroup), EINVAL, "ADDR_BOUND");
  // A ready id, groups that are not: unicast, zero, IPv6.
  ASSERT_NO_FATAL_FAILURE(resolve_group_from_b());
  refused(join_ip(b, bid, kUidMc, kIpA), EINVAL, "not a multicast");
  refused(join_ip(b, bid, kUidMc, 0), EINVAL, "zero");
  rdma_ucm_join_ip_mcast v6{};
  v6.uid = kUidMc;
  v6.id = bid;
  v6.addr.sin6_family = AF_INET6;
  v6.addr.sin6_addr.s6_addr[0] = 0xff;
  v6.addr.sin6_addr.s6_addr[1] = 0x0e;
  v6.addr.sin6_addr.s6_addr[15] = 1;  // ff0e::1
  refused(ucma(b, RDMA_USER_CM_CMD_JOIN_IP_MCAST, bytes(v6)), EOPNOTSUPP,
          "IPv6");
  // No room for the reply (ucma_process_join's ENOSPC).
  shim::CmCommandReq q;
  q.cmd = RDMA_USER_CM_CMD_JOIN_IP_MCAST;
  rdma_ucm_join_ip_mcast j{};
  j.uid = kUidMc;
  put_sin(j.addr, kGroup, 0);
  j.id = bid;
  q.in = sizeof j;
  q.out = sizeof(rdma_ucm_create_id_resp) - 1;
  EXPECT_EQ(request(b, shim::Op::kCmCommand, bytes(q) + bytes(j)).status,
            -ENOSPC);
  // Another channel's id.
  Chan other = open(B);
  EXPECT_EQ(join_ip(other, bid, kUidMc, kGroup).status, -EINVAL);
  // Expect: nothing joined, nothing told, every refusal counted.
  EXPECT_TRUE(events(b).empty());
  EXPECT_TRUE(events(other).empty());
  EXPECT_EQ(stat(B, "cm_mcast_joins"), 0u);
  EXPECT_EQ(stat(B, "cm_mcast_groups"), 0u);
  EXPECT_EQ(stat(B, "cm_mcast_refused"), 10u);
  // The id still joins.
  EXPECT_EQ(join_ip(b, bid, kUidMc, kGroup).status, 0);
  EXPECT_EQ(event(b, RDMA_CM_EVENT_MULTICAST_JOIN).resp.uid, kUidMc);
}

// 10e. LEAVE_MCAST: events_reported counts the membership's events handed
// to the event socket (the shim answers with those it gave out), and the
// membership goes: a second leave is ENOENT (ucma_leave_multicast), another
// channel's leave EINVAL.
TEST_F(CmServerTest, LeaveReturnsEventsReported) {
  ASSERT_NO_FATAL_FAILURE(resolve_group_from_b());
  const Res j = join_ip(b, bid, kUidMc, kGroup);
  ASSERT_EQ(j.status, 0) << j.payload;
  const uint32_t h = j.as<rdma_ucm_create_id_resp>().id;
  ASSERT_EQ(event(b, RDMA_CM_EVENT_MULTICAST_JOIN).resp.id, h);
  Chan other = open(B);
  EXPECT_EQ(leave(other, h).status, -EINVAL);
  EXPECT_EQ(stat(B, "cm_mcast_groups"), 1u);
  const Res l = leave(b, h);
  ASSERT_EQ(l.status, 0) << l.payload;
  EXPECT_EQ(l.as<rdma_ucm_destroy_id_resp>().events_reported, 1u);
  EXPECT_EQ(stat(B, "cm_mcast_leaves"), 1u);
  EXPECT_EQ(stat(B, "cm_mcast_groups"), 0u);
  const Res again = leave(b, h);
  EXPECT_EQ(again.status, -ENOENT);
  EXPECT_NE(again.payload.find("multicast"), std::string::npos)
      << again.payload;
  EXPECT_EQ(leave(b, 0xdead).status, -ENOENT);
  // A leave cut short: EINVAL.
  EXPECT_EQ(ucma(b, RDMA_USER_CM_CMD_LEAVE_MCAST,
                 std::string(sizeof(rdma_ucm_destroy_id) - 1, '\0'))
                .status,
            -EINVAL);
  EXPECT_EQ(stat(B, "cm_mcast_refused"), 4u);
  EXPECT_EQ(stat(B, "cm_mcast_leaves"), 1u);
  // The id is as it was: it joins again.
  const Res j2 = join_ip(b, bid, kUidMc2, kGroup);
  ASSERT_EQ(j2.status, 0) << j2.payload;
  EXPECT_NE(j2.as<rdma_ucm_create_id_resp>().id, h);
  EXPECT_EQ(event(b, RDMA_CM_EVENT_MULTICAST_JOIN).resp.uid, kUidMc2);
  EXPECT_TRUE(events(other).empty());
}

// 10f. rdma_destroy_id with memberships, and a client that dies with some:
// they go with the id (ucma_cleanup_multicast), nothing is left.
TEST_F(CmServerTest, DestroyAndCloseFreeMemberships) {
  ASSERT_NO_FATAL_FAILURE(resolve_group_from_b());
  const uint32_t h1 =
      join_ip(b, bid, kUidMc, kGroup).as<rdma_ucm_create_id_resp>().id;
  const uint32_t h2 =
      join(b, bid, kUidMc2, 0xef010102, 1).as<rdma_ucm_create_id_resp>().id;
  EXPECT_EQ(events(b).size(), 2u);
  EXPECT_EQ(stat(B, "cm_mcast_groups"), 2u);
  ASSERT_EQ(destroy_id(b, bid), 0);
  EXPECT_EQ(stat(B, "cm_mcast_groups"), 0u);
  EXPECT_EQ(stat(B, "cm_ids"), 0u);
  EXPECT_EQ(leave(b, h1).status, -ENOENT);
  EXPECT_EQ(leave(b, h2).status, -ENOENT);
  EXPECT_EQ(stat(B, "cm_mcast_leaves"), 0u);

  // A second channel whose process dies with two ids, one with a
  // membership.
  Chan dying = open(B);
  ASSERT_EQ(stat(B, "cm_channels"), 2u);
  const uint32_t x = create_id(dying, 0x61, cm::kPsUdp, IBV_QPT_UD);
  const uint32_t y = create_id(dying, 0x62, cm::kPsUdp, IBV_QPT_UD);
  ASSERT_EQ(bind_ip(dying, x, kIpB, kPort), 0);
  const Res j = join(dying, x, kUidMc, kGroup, 0);
  ASSERT_EQ(j.status, 0) << j.payload;
  ASSERT_EQ(bind_ip(dying, y, kIpB, kPort + 1), 0);
  EXPECT_EQ(stat(B, "cm_mcast_groups"), 1u);
  EXPECT_EQ(stat(B, "cm_ids"), 2u);
  B.srv->on_close(dying.ci);
  EXPECT_EQ(stat(B, "cm_mcast_groups"), 0u);
  EXPECT_EQ(stat(B, "cm_ids"), 0u);
  EXPECT_EQ(stat(B, "cm_channels"), 1u);
  EXPECT_EQ(leave(b, j.as<rdma_ucm_create_id_resp>().id).status, -ENOENT);
  EXPECT_EQ(stat(B, "cm_mcast_joins"), 3u);
}

}  // namespace
}  // namespace urnic::service
