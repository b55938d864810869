// RDMA CM in urnicd: ucma commands from the shim, IB CM MADs on QP1.
// Facts (commands, MAD fields, timers, what Linux sends and checks) are in
// verbs-shim/RDMACM-NOTES.md; behaviour follows Linux's cma.c and cm.c where
// the IBTA leaves a choice, so a kernel peer sees what it would see from
// another kernel.
#include "dataplane/service/cm_server.h"

#include <arpa/inet.h>
#include <endian.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <type_traits>

#include "dataplane/wire/codec.h"
#include "dataplane/wire/opcode.h"

namespace urnic::service {

namespace cm = wire::cm;

namespace {

// enum rdma_cm_event_type (librdmacm's rdma_cma.h; the kernel passes the
// same numbers through ucma).
enum Event : uint32_t {
  kAddrResolved = 0,
  kAddrError = 1,
  kRouteResolved = 2,
  kRouteError = 3,
  kConnectRequest = 4,
  kConnectResponse = 5,
  kConnectError = 6,
  kUnreachable = 7,
  kRejected = 8,
  kEstablished = 9,
  kDisconnected = 10,
  kDeviceRemoval = 11,
  kMulticastJoin = 12,
  kMulticastError = 13,
  kTimewaitExit = 15,
};

bool mcast_event(uint32_t event) {
  return event == kMulticastJoin || event == kMulticastError;
}

constexpr uint32_t kUdpQkey = 0x01234567;  // RDMA_UDP_QKEY (cma.c)
constexpr uint8_t kPacketLife = 16;        // CMA_IBOE_PACKET_LIFETIME (cma.c)
constexpr uint32_t kMaxBacklog = 1024;
// A multicast group's AH, as Linux's cma makes it for a RoCEv2 join
// (cma_iboe_join_multicast, cma_make_mc_event): hop limit
// IPV6_DEFAULT_HOPLIMIT for an IPv4 group (and QPN 0xFFFFFF).
constexpr uint8_t kMcastHopLimit = 64;
constexpr uint16_t kEphemeralLo = 32768, kEphemeralHi = 60999;

// The path's packet life time: RDMA_OPTION_ID_ACK_TIMEOUT - 1 once set (cma.c
// builds a RoCE route so), else kPacketLife. The REQ's local ACK timeout,
// the REQ's wait and the timewait follow from it, as in Linux's cm.c.
uint8_t packet_life(uint8_t ack_timeout_option) {
  return ack_timeout_option ? ack_timeout_option - 1 : kPacketLife;
}

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename T>
void append(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// IBTA 12.7.34/Linux cm_ack_timeout(): the local ACK timeout a QP gets from
// the CA's ACK delay and the path's packet life time.
uint8_t ack_timeout(uint8_t ca_ack_delay, uint8_t packet_life) {
  int t = packet_life + 1;
  if (t >= ca_ack_delay)
    t += ca_ack_delay >= t - 1;
  else
    t = ca_ack_delay + (t >= ca_ack_delay - 1);
  return static_cast<uint8_t>(std::min(31, t));
}

uint64_t ms_ns(uint64_t ms) {
  return ms * 1'000'000;
}

// URNIC_CM_TRACE=1 in urnicd's environment: one line per CM MAD sent or
// received, for following a connection (or an interop problem) by eye.
bool trace_on() {
  static const bool on = getenv("URNIC_CM_TRACE") != nullptr;
  return on;
}

const char* attr_name(uint16_t a) {
  switch (static_cast<cm::Attr>(a)) {
    case cm::Attr::kReq:
      return "REQ";
    case cm::Attr::kMra:
      return "MRA";
    case cm::Attr::kRej:
      return "REJ";
    case cm::Attr::kRep:
      return "REP";
    case cm::Attr::kRtu:
      return "RTU";
    case cm::Attr::kDreq:
      return "DREQ";
    case cm::Attr::kDrep:
      return "DREP";
    case cm::Attr::kSidrReq:
      return "SIDR_REQ";
    case cm::Attr::kSidrRep:
      return "SIDR_REP";
  }
  return "?";
}

void trace(const char* dir, uint32_t peer, const uint8_t* mad) {
  if (!trace_on()) return;
  // Every CM message opens with the two comm IDs (SIDR: the request ID).
  fprintf(stderr,
          "urnicd: cm %s %s %u.%u.%u.%u local_comm %08x remote_comm %08x\n",
          dir, attr_name(wire::load_be16(mad + 16)), peer >> 24,
          (peer >> 16) & 255, (peer >> 8) & 255, peer & 255,
          wire::load_be32(mad + 24), wire::load_be32(mad + 28));
}

// An IPv4 address from a sockaddr slot (sockaddr_in, or sockaddr_in6 holding
// :: or ::ffff:a.b.c.d). False for other IPv6 addresses and families.
bool parse_addr(const uint8_t* sa, uint16_t* family, uint32_t* ip,
                uint16_t* port) {
  *family = load<uint16_t>(sa);
  *port = ntohs(load<uint16_t>(sa + 2));
  if (*family == AF_INET) {
    *ip = ntohl(load<uint32_t>(sa + 4));
    return true;
  }
  if (*family != AF_INET6) return false;
  const uint8_t* a = sa + 8;  // sin6_addr
  static constexpr uint8_t kMapped[12] = {0, 0, 0, 0, 0,    0,
                                          0, 0, 0, 0, 0xff, 0xff};
  static constexpr uint8_t kZero[16] = {};
  if (std::memcmp(a, kZero, 16) == 0) {
    *ip = 0;
    return true;
  }
  if (std::memcmp(a, kMapped, 12) != 0) return false;
  *ip = ntohl(load<uint32_t>(a + 12));
  return true;
}

// Writes an address into a 28-byte sockaddr_in6 slot, in `family`'s form.
void put_addr(uint8_t* slot, uint16_t family, uint32_t ip, uint16_t port) {
  std::memset(slot, 0, sizeof(sockaddr_in6));
  if (family == AF_INET6) {
    sockaddr_in6 s{};
    s.sin6_family = AF_INET6;
    s.sin6_port = htons(port);
    if (ip) {
      s.sin6_addr.s6_addr[10] = s.sin6_addr.s6_addr[11] = 0xff;
      const uint32_t be = htonl(ip);
      std::memcpy(&s.sin6_addr.s6_addr[12], &be, 4);
    }
    std::memcpy(slot, &s, sizeof s);
  } else {
    sockaddr_in s{};
    s.sin_family = AF_INET;
    s.sin_port = htons(port);
    s.sin_addr.s_addr = htonl(ip);
    std::memcpy(slot, &s, sizeof s);
  }
}

void gid_of(uint32_t ip, uint8_t gid[16]) {
  wire::gid_from_ipv4(ip, gid);
}

// Kernel randomness by getrandom(2): no fd to open per draw (a
// std::random_device is constructed, probed and destroyed per use), and
// unpredictable to another local client, which sees its own tokens and PSNs.
uint64_t random_u64() {
  uint64_t v = 0;
  if (getrandom(&v, sizeof v, 0) == static_cast<ssize_t>(sizeof v)) return v;
  std::random_device rd;  // EINTR or no getrandom: the slow way
  return uint64_t{rd()} << 32 | rd();
}

}  // namespace

CmServer::CmServer(CmEnv env) : env_(std::move(env)) {
  // Local comm IDs must not repeat across restarts either (a peer in
  // timewait would take a reused one for a duplicate): random start.
  next_comm_ = static_cast<uint32_t>(random_u64()) | 1;
}

CmServer::~CmServer() {
  for (auto& [client, ch] : channels_)
    if (ch.ev_fd >= 0) close(ch.ev_fd);
}

std::vector<std::pair<const char*, uint64_t>> CmServer::stats() const {
  auto v = [](const std::atomic<uint64_t>& a) {
    return a.load(std::memory_order_relaxed);
  };
  return {{"cm_channels", v(ctr_.channels)},
          {"cm_ids", v(ctr_.ids)},
          {"cm_commands", v(ctr_.commands)},
          {"cm_command_errors", v(ctr_.command_errors)},
          {"cm_af_ib_refused", v(ctr_.af_ib_refused)},
          {"cm_mads_rx", v(ctr_.mads_rx)},
          {"cm_mads_tx", v(ctr_.mads_tx)},
          {"cm_mads_bad", v(ctr_.mads_bad)},
          {"cm_mads_unmatched", v(ctr_.mads_unmatched)},
          {"cm_mads_retransmitted", v(ctr_.mads_retransmitted)},
          {"cm_rej_tx", v(ctr_.rej_tx)},
          {"cm_rej_rx", v(ctr_.rej_rx)},
          {"cm_events", v(ctr_.events)},
          {"cm_events_dropped", v(ctr_.events_dropped)},
          {"cm_connections", v(ctr_.connections)},
          {"cm_timeouts", v(ctr_.timeouts)},
          {"cm_mcast_joins", v(ctr_.mcast_joins)},
          {"cm_mcast_leaves", v(ctr_.mcast_leaves)},
          {"cm_mcast_refused", v(ctr_.mcast_refused)},
          {"cm_mcast_groups", v(ctr_.mcast_groups)},
          {"cm_listens", v(ctr_.listens)},
          {"cm_listening", v(ctr_.listening)},
          {"cm_req_holds", v(ctr_.req_holds)},
          {"cm_req_hold_expired", v(ctr_.req_hold_expired)}};
}

// --- control requests --------------------------------------------------------

void CmServer::handle(CtlRequest& req, CtlReply& rep) {
  why_.clear();
  af_ib_ = false;
  ctr_.commands.fetch_add(1, std::memory_order_relaxed);
  int rc = 0;
  std::string out;
  const uint64_t client = req.client->id;
  if (req.op == static_cast<ctl::Op>(shim::Op::kCmOpen)) {
    shim::CmOpenReq o;
    if (req.body.size() != sizeof o || req.fds.size() != 1) {
      rc = -EINVAL;
      why_ = "malformed channel open";
    } else if (std::memcpy(&o, req.body.data(), sizeof o),
               o.abi != shim::kShimAbi) {
      rc = -EPROTO;
      why_ = "shim ABI " + std::to_string(o.abi) + ", urnicd speaks " +
             std::to_string(shim::kShimAbi);
    } else if (channels_.count(client)) {
      rc = -EBUSY;
      why_ = "this connection has a channel already";
    } else {
      Channel& ch = channels_[client];
      ch.client = client;
      ch.pid = req.client->pid;
      ch.uid = req.client->uid;
      ch.ev_fd = req.fds[0];
      req.fds.clear();
      fcntl(ch.ev_fd, F_SETFL, fcntl(ch.ev_fd, F_GETFL) | O_NONBLOCK);
      ch.token = random_u64();
      shim::CmOpenRep r;
      r.token = ch.token;
      append(out, r);
      ctr_.channels.fetch_add(1, std::memory_order_relaxed);
    }
  } else {
    auto it = channels_.find(client);
    shim::CmCommandReq c;
    if (it == channels_.end()) {
      rc = -EBADF;
      why_ = "no RDMA CM channel on this connection";
    } else if (req.body.size() < sizeof c ||
               (std::memcpy(&c, req.body.data(), sizeof c),
                req.body.size() != sizeof c + c.in + c.optlen) ||
               c.optlen > shim::kCmMaxOption) {
      rc = -EINVAL;
      why_ = "malformed RDMA CM command";
    } else {
      const auto* body =
          reinterpret_cast<const uint8_t*>(req.body.data()) + sizeof c;
      rc = command(it->second, c, body, body + c.in, out);
    }
  }
  if (rc < 0) {
    (af_ib_ ? ctr_.af_ib_refused : ctr_.command_errors)
        .fetch_add(1, std::memory_order_relaxed);
    rep.status = rc;
    rep.payload = why_.empty() ? std::string(strerror(-rc)) : why_;
    return;
  }
  rep.payload = std::move(out);
}

// Ids are small numbers, as the kernel's (librdmacm keeps its ids in an
// index map of 16-bit indices), given out cyclically so that a number is not
// reused while events of its last owner may still be on their way.
uint32_t CmServer::alloc_id() {
  for (uint32_t tries = 0; tries < kMaxIds; ++tries) {
    const uint32_t n = next_id_;
    next_id_ = next_id_ % kMaxIds + 1;
    if (!ids_.count(n)) return n;
  }
  return 0;
}

CmServer::Id* CmServer::find(Channel& ch, uint32_t id) {
  auto it = ids_.find(id);
  return it != ids_.end() && it->second.ch == &ch ? &it->second : nullptr;
}

CmServer::Id* CmServer::by_comm(uint32_t local_comm_id) {
  auto it = comm_.find(local_comm_id);
  if (it == comm_.end()) return nullptr;
  auto id = ids_.find(it->second);
  return id == ids_.end() ? nullptr : &id->second;
}

int CmServer::command(Channel& ch, const shim::CmCommandReq& req,
                      const uint8_t* b, const uint8_t* opt, std::string& out) {
  const uint64_t now = now_;
  // Each command's struct must fit; the id is found where that struct has
  // it. Commands librdmacm sends only with AF_IB support (BIND, QUERY,
  // RESOLVE_ADDR) are refused, so it falls back to the IP commands.
  auto need = [&](size_t n) { return req.in >= n; };
  // A command on one id: its struct must fit, its id be this channel's.
  auto on = [&]<typename Cmd>(std::type_identity<Cmd>, auto&& fn) -> int {
    if (!need(sizeof(Cmd))) return -EINVAL;
    Id* id = find(ch, load<uint32_t>(b + offsetof(Cmd, id)));
    if (!id) {
      why_ = "no such RDMA CM id on this channel";
      return -EINVAL;
    }
    return fn(*id);
  };
  using std::type_identity;
  switch (req.cmd) {
    case RDMA_USER_CM_CMD_CREATE_ID:
      if (!need(sizeof(rdma_ucm_create_id))) return -EINVAL;
      return cmd_create(ch, b, out);
    case RDMA_USER_CM_CMD_DESTROY_ID:
      return on(type_identity<rdma_ucm_destroy_id>{}, [&](Id& id) {
        append(out, rdma_ucm_destroy_id_resp{});  // the shim counts events
        return cmd_destroy(id);
      });
    case RDMA_USER_CM_CMD_BIND_IP:
      return on(type_identity<rdma_ucm_bind_ip>{},
                [&](Id& id) { return cmd_bind_ip(id, b); });
    case RDMA_USER_CM_CMD_RESOLVE_IP:
      return on(type_identity<rdma_ucm_resolve_ip>{},
                [&](Id& id) { return cmd_resolve_ip(id, b, now); });
    case RDMA_USER_CM_CMD_RESOLVE_ROUTE:
      return on(type_identity<rdma_ucm_resolve_route>{},
                [&](Id& id) { return cmd_resolve_route(id); });
    case RDMA_USER_CM_CMD_QUERY_ROUTE:
      return on(type_identity<rdma_ucm_query>{},
                [&](Id& id) { return cmd_query_route(id, out); });
    case RDMA_USER_CM_CMD_CONNECT:
      return on(type_identity<rdma_ucm_connect>{},
                [&](Id& id) { return cmd_connect(id, b, now); });
    case RDMA_USER_CM_CMD_LISTEN:
      return on(type_identity<rdma_ucm_listen>{}, [&](Id& id) {
        const int rc = cmd_listen(id, b);
        if (rc == 0) release_held(now);
        return rc;
      });
    case RDMA_USER_CM_CMD_ACCEPT:
      return on(type_identity<rdma_ucm_accept>{},
                [&](Id& id) { return cmd_accept(id, b, now); });
    case RDMA_USER_CM_CMD_REJECT:
      return on(type_identity<rdma_ucm_reject>{},
                [&](Id& id) { return cmd_reject(id, b); });
    case RDMA_USER_CM_CMD_DISCONNECT:
      return on(type_identity<rdma_ucm_disconnect>{},
                [&](Id& id) { return cmd_disconnect(id, now); });
    case RDMA_USER_CM_CMD_INIT_QP_ATTR:
      return on(type_identity<rdma_ucm_init_qp_attr>{},
                [&](Id& id) { return cmd_init_qp_attr(id, b, out); });
    case RDMA_USER_CM_CMD_SET_OPTION:
      return on(type_identity<rdma_ucm_set_option>{},
                [&](Id& id) { return cmd_set_option(id, b, opt, req.optlen); });
    case RDMA_USER_CM_CMD_MIGRATE_ID: {
      if (!need(sizeof(rdma_ucm_migrate_id))) return -EINVAL;
      Channel* from = nullptr;
      for (auto& [client, c] : channels_)
        if (c.token == req.migrate_from && c.uid == ch.uid) from = &c;
      if (!from) {
        why_ = "MIGRATE_ID: the old channel is not this user's";
        return -EINVAL;
      }
      Id* m =
          find(*from, load<uint32_t>(b + offsetof(rdma_ucm_migrate_id, id)));
      if (!m) return -EINVAL;
      append(out, rdma_ucm_migrate_resp{});  // the shim counts events
      return cmd_migrate(ch, *m);
    }
    case RDMA_USER_CM_CMD_BIND:
    case RDMA_USER_CM_CMD_RESOLVE_ADDR:
    case RDMA_USER_CM_CMD_QUERY:
      why_ = "AF_IB addresses are not supported (IP ids only)";
      af_ib_ = true;
      return -EAFNOSUPPORT;
    case RDMA_USER_CM_CMD_NOTIFY:
      return 0;  // no alternate paths: nothing to tell the CM
    case RDMA_USER_CM_CMD_JOIN_IP_MCAST:
    case RDMA_USER_CM_CMD_JOIN_MCAST:
    case RDMA_USER_CM_CMD_LEAVE_MCAST: {
      int rc;
      if (req.out < (req.cmd == RDMA_USER_CM_CMD_LEAVE_MCAST
                         ? sizeof(rdma_ucm_destroy_id_resp)
                         : sizeof(rdma_ucm_create_id_resp))) {
        why_ = "no room for the multicast command's response";
        rc = -ENOSPC;  // ucma_process_join, ucma_leave_multicast
      } else if (req.cmd == RDMA_USER_CM_CMD_LEAVE_MCAST) {
        rc =
            need(sizeof(rdma_ucm_destroy_id))
                ? cmd_leave(
                      ch, load<uint32_t>(b + offsetof(rdma_ucm_destroy_id, id)),
                      out)
                : -EINVAL;
      } else if (req.cmd == RDMA_USER_CM_CMD_JOIN_IP_MCAST) {
        // The kernel makes it a JOIN_MCAST of a full member
        // (ucma_join_ip_multicast).
        rc = on(type_identity<rdma_ucm_join_ip_mcast>{}, [&](Id& id) {
          const auto c = load<rdma_ucm_join_ip_mcast>(b);
          const uint16_t size = c.addr.sin6_family == AF_INET6
                                    ? sizeof(sockaddr_in6)
                                    : sizeof(sockaddr_in);
          return cmd_join(id, c.uid, b + offsetof(rdma_ucm_join_ip_mcast, addr),
                          size, RDMA_MC_JOIN_FLAG_FULLMEMBER, out);
        });
      } else {
        rc = on(type_identity<rdma_ucm_join_mcast>{}, [&](Id& id) {
          const auto c = load<rdma_ucm_join_mcast>(b);
          return cmd_join(id, c.uid, b + offsetof(rdma_ucm_join_mcast, addr),
                          c.addr_size, c.join_flags, out);
        });
      }
      if (rc < 0) {
        ctr_.mcast_refused.fetch_add(1, std::memory_order_relaxed);
        if (why_.empty()) why_ = "multicast command refused";
      }
      return rc;
    }
    default:
      why_ = "RDMA CM command " + std::to_string(req.cmd) +
             " is not supported by urnic";
      return -ENOSYS;
  }
}

int CmServer::cmd_create(Channel& ch, const uint8_t* b, std::string& out) {
  const auto c = load<rdma_ucm_create_id>(b);
  if (c.ps != cm::kPsTcp && c.ps != cm::kPsUdp && c.ps != cm::kPsIb &&
      c.ps != cm::kPsIpoib) {
    why_ = "unknown port space";
    return -EINVAL;
  }
  if (c.qp_type != IBV_QPT_RC && c.qp_type != IBV_QPT_UD) {
    why_ = "RDMA CM ids are RC or UD";
    return -EINVAL;
  }
  const uint32_t nid = alloc_id();
  if (!nid) {
    why_ = "too many RDMA CM ids";
    return -ENOMEM;
  }
  Id& id = ids_[nid];
  id.id = nid;
  id.ch = &ch;
  id.uid = c.uid;
  id.ps = c.ps;
  id.qp_type = c.qp_type;
  id.seq_num = random_u64() & wire::kMask24;
  ch.ids.push_back(id.id);
  ctr_.ids.fetch_add(1, std::memory_order_relaxed);
  rdma_ucm_create_id_resp r{};
  r.id = id.id;
  append(out, r);
  return 0;
}

void CmServer::drop(Id& id) {
  // Its memberships go with it (ucma_cleanup_multicast); events of theirs
  // still queued carry its count id, which the shim no longer knows.
  for (uint32_t h : std::vector<uint32_t>(id.mcasts)) drop_mcast(h);
  stop_timer(id);
  if (id.local_comm_id) comm_.erase(id.local_comm_id);
  if (id.ch) {
    auto& v = id.ch->ids;
    v.erase(std::remove(v.begin(), v.end(), id.id), v.end());
  }
  if (id.st == St::kListen)
    ctr_.listening.fetch_sub(1, std::memory_order_relaxed);
  ctr_.ids.fetch_sub(1, std::memory_order_relaxed);
  ids_.erase(id.id);
}

// rdma_destroy_id: what the IB CM sends when its cm_id goes in each state
// (Linux cm_destroy_id), then the id is forgotten.
int CmServer::cmd_destroy(Id& id) {
  const uint32_t peer = id.dst_ip;
  // A UD id's only CM exchange is SIDR: nothing to end on the wire (an
  // unanswered SIDR_REQ just stops being sent).
  switch (id.qp_type == IBV_QPT_UD ? St::kIdle : id.st) {
    case St::kReqSent:
      send_rej(peer, id.tid, id.local_comm_id, 0, 2,
               static_cast<uint16_t>(cm::RejReason::kTimeout), nullptr, 0);
      break;
    case St::kReqRcvd:
    case St::kRepRcvd:
    case St::kRepSent:
      // In REQ_RCVD Linux sends local comm ID 0 (cm_format_rej).
      send_rej(peer, id.tid, id.st == St::kReqRcvd ? 0 : id.local_comm_id,
               id.remote_comm_id,
               id.st == St::kReqRcvd   ? 0
               : id.st == St::kRepRcvd ? 1
                                       : 2,
               static_cast<uint16_t>(cm::RejReason::kConsumerDefined), nullptr,
               0);
      break;
    case St::kEstablished:
      send_dreq(id, now_);
      break;
    case St::kDreqRcvd:
      send_drep(peer, id.tid, id.local_comm_id, id.remote_comm_id);
      break;
    default:
      break;
  }
  drop(id);
  return 0;
}

bool CmServer::local_ip(uint32_t ip) const {
  return ip == env_.addrs.ipv4;
}

bool CmServer::on_link(uint32_t ip) const {
  const uint32_t p = env_.addrs.ipv4_prefix;
  const uint32_t mask = p == 0 ? 0 : ~uint32_t{0} << (32 - p);
  return (ip & mask) == (env_.addrs.ipv4 & mask);
}

int CmServer::port_conflict(uint16_t ps, uint32_t ip, uint16_t port,
                            const Id* except) const {
  for (const auto& [n, o] : ids_) {
    // Ids a listener made share its port and do not hold it: the port can
    // be listened on again once the listener is gone (perftest -R does).
    if (&o == except || !o.bound || o.listener || o.ps != ps ||
        o.src_port != port)
      continue;
    if (ip && o.src_ip && ip != o.src_ip) continue;
    if (except && except->reuseaddr && o.reuseaddr && o.st != St::kListen)
      continue;
    return !ip || !o.src_ip ? EADDRNOTAVAIL : EADDRINUSE;
  }
  return 0;
}

int CmServer::auto_bind(Id& id) {
  if (!id.bound) {
    // A random start, then every port of the range once (Linux's
    // ephemeral choice): random picks alone could miss the last free one.
    const uint32_t span = kEphemeralHi - kEphemeralLo + 1;
    const auto start = static_cast<uint32_t>(random_u64() % span);
    uint16_t port = 0;
    for (uint32_t tries = 0; tries < span; ++tries) {
      const auto p =
          static_cast<uint16_t>(kEphemeralLo + (start + tries) % span);
      if (!port_conflict(id.ps, 0, p, &id)) {
        port = p;
        break;
      }
    }
    if (!port) {
      why_ = "no free port in the ephemeral range";
      return -EADDRINUSE;
    }
    id.src_port = port;
    id.bound = true;
    if (!id.family) id.family = AF_INET;
  }
  if (!id.src_ip) {
    id.src_ip = env_.addrs.ipv4;
    id.loop_ip = 0;
    id.device = true;
  }
  return 0;
}

int CmServer::cmd_bind_ip(Id& id, const uint8_t* b) {
  const auto c = load<rdma_ucm_bind_ip>(b);
  if (id.bound || id.st != St::kIdle) return -EINVAL;
  uint16_t family, port;
  uint32_t ip;
  if (!parse_addr(reinterpret_cast<const uint8_t*>(&c.addr), &family, &ip,
                  &port)) {
    why_ = "only IPv4 addresses (or :: / ::ffff:a.b.c.d) can be bound";
    return -EAFNOSUPPORT;
  }
  // 127.0.0.0/8 binds as the wildcard does, as on Linux (cma_any_addr
  // counts loopback addresses as "any"): no device, a listen on every
  // address. libfabric's verbs provider binds "localhost" so to learn that
  // a passive endpoint is not tied to a device (vrb_fill_addr).
  const uint32_t loop = wire::ipv4_is_loopback(ip) ? ip : 0;
  if (loop) ip = 0;
  if (ip && !local_ip(ip)) {
    why_ = "the address is not urnic's";
    return -EADDRNOTAVAIL;
  }
  id.family = family;
  if (port) {
    if (const int e = port_conflict(id.ps, ip, port, &id)) return -e;
    id.src_port = port;
    id.bound = true;
  } else if (int rc = auto_bind(id)) {
    return rc;
  }
  id.src_ip = ip;
  id.loop_ip = loop;
  id.device = ip != 0;
  return 0;
}

int CmServer::cmd_resolve_ip(Id& id, const uint8_t* b, uint64_t now) {
  const auto c = load<rdma_ucm_resolve_ip>(b);
  if (id.st != St::kIdle && id.st != St::kAddrResolved) return -EINVAL;
  uint16_t family, port;
  uint32_t ip;
  if (!parse_addr(reinterpret_cast<const uint8_t*>(&c.dst_addr), &family, &ip,
                  &port) ||
      ip == 0) {
    why_ = "only IPv4 destinations are supported";
    return -EAFNOSUPPORT;
  }
  uint16_t sfam, sport;
  uint32_t sip;
  if (!id.bound && c.src_addr.sin6_family &&
      parse_addr(reinterpret_cast<const uint8_t*>(&c.src_addr), &sfam, &sip,
                 &sport) &&
      (sip || sport)) {
    if (sip && !local_ip(sip)) return -EADDRNOTAVAIL;
    if (const int e = sport ? port_conflict(id.ps, sip, sport, &id) : 0)
      return -e;
    id.family = sfam;
    id.src_port = sport;
    id.bound = sport != 0;
  }
  if (!id.family) id.family = family;
  if (int rc = auto_bind(id)) return rc;
  id.dst_ip = ip;
  id.dst_port = port;
  id.st = St::kAddrQuery;
  id.deadline = now + ms_ns(c.timeout_ms ? c.timeout_ms : 2000);
  // A group (mckey's rdma_resolve_addr before its join) resolves at once
  // on the port, as Linux's does (its MAC is the group's, no ARP).
  if (!on_link(ip) && !local_ip(ip) && !wire::ipv4_is_multicast(ip)) {
    // No routing beyond the port's subnet (urnic has no gateway).
    id.st = St::kIdle;
    emit(id, kAddrError, -ENETUNREACH);
    return 0;
  }
  tick(now);  // resolved at once when the neighbour is known
  return 0;
}

int CmServer::cmd_resolve_route(Id& id) {
  if (wire::ipv4_is_multicast(id.dst_ip)) {
    // A group is joined (JOIN_MCAST), never connected to: no path, and no
    // REQ or SIDR_REQ to a multicast address.
    why_ = "the destination is a multicast group: join it, do not route to it";
    return -EINVAL;
  }
  if (id.st != St::kAddrResolved) return -EINVAL;
  // RoCE: the path follows from the addresses (cma_resolve_iboe_route).
  id.st = St::kRouteResolved;
  emit(id, kRouteResolved, 0);
  return 0;
}

int CmServer::cmd_query_route(const Id& id, std::string& out) {
  rdma_ucm_query_route_resp r{};
  if (id.device) {
    r.node_guid = env_.node_guid;
    r.port_num = 1;
  }
  r.ibdev_index = UINT32_MAX;  // as a kernel without device indices
  ib_user_path_rec& p = r.ib_route[0];
  gid_of(id.src_ip, p.sgid);
  if (id.dst_ip) gid_of(id.dst_ip, p.dgid);
  p.pkey = htons(0xffff);
  const bool routed =
      id.st >= St::kRouteResolved && id.st != St::kListen && id.dst_ip;
  if (routed) {
    // One path record, as cma fills it for RoCE (ib_copy_path_rec_to_user).
    r.num_paths = 1;
    p.dlid = p.slid = 0;
    p.flow_label = htonl(id.flow_label);
    p.reversible = 1;
    p.mtu = id.mtu;
    p.hop_limit = env_.addrs.ttl;
    p.traffic_class = id.tos;
    p.numb_path = 1;
    p.mtu_selector = p.rate_selector = p.packet_life_time_selector = 2;
    p.rate = 0;
    p.packet_life_time = packet_life(id.ack_timeout);
  }
  put_addr(reinterpret_cast<uint8_t*>(&r.src_addr), id.family,
           id.src_ip ? id.src_ip : id.loop_ip, id.src_port);
  if (id.dst_ip || id.dst_port)
    put_addr(reinterpret_cast<uint8_t*>(&r.dst_addr), id.family, id.dst_ip,
             id.dst_port);
  append(out, r);
  return 0;
}

int CmServer::cmd_listen(Id& id, const uint8_t* b) {
  const auto c = load<rdma_ucm_listen>(b);
  if (id.st == St::kListen) {
    id.backlog =
        c.backlog == 0 || c.backlog > kMaxBacklog ? kMaxBacklog : c.backlog;
    return 0;
  }
  if (id.st != St::kIdle || id.listener) return -EINVAL;
  if (!id.bound) {
    // rdma_listen on an unbound id listens on every address.
    id.family = AF_INET;
    const uint32_t keep = id.src_ip;
    if (int rc = auto_bind(id)) return rc;
    id.src_ip = keep;
    id.device = keep != 0;
  }
  id.st = St::kListen;
  ctr_.listens.fetch_add(1, std::memory_order_relaxed);
  ctr_.listening.fetch_add(1, std::memory_order_relaxed);
  id.backlog =
      c.backlog == 0 || c.backlog > kMaxBacklog ? kMaxBacklog : c.backlog;
  return 0;
}

// --- connecting --------------------------------------------------------------

void CmServer::alloc_comm(Id& id) {
  while (next_comm_ == 0 || comm_.count(next_comm_)) ++next_comm_;
  id.local_comm_id = next_comm_++;
  comm_[id.local_comm_id] = id.id;
}

// The RDMA CM header opening a REQ's or SIDR_REQ's private data, and the
// port space and port its service ID names (cma_save_ip4_info).
CmServer::Incoming CmServer::incoming(const uint8_t* pdata,
                                      uint64_t service_id) const {
  Incoming in;
  in.ip = cm::decode(pdata, in.hdr) && in.hdr.ip_version == 4;
  if (in.ip) {
    std::memcpy(&in.dst, in.hdr.dst_addr + 12, 4);
    std::memcpy(&in.src, in.hdr.src_addr + 12, 4);
    in.dst = ntohl(in.dst);
    in.src = ntohl(in.src);
  }
  in.ps = static_cast<uint16_t>(service_id >> 16);
  in.port = static_cast<uint16_t>(service_id);
  in.ip_service = (service_id >> 32) == 0;
  return in;
}

// The listener of `type` a request is for: its port space and port, on the
// address it was sent to or on every address.
CmServer::Id* CmServer::listener(uint8_t type, const Incoming& in) {
  if (!in.ip_service) return nullptr;
  for (auto& [n, o] : ids_)
    if (o.st == St::kListen && o.qp_type == type && o.ps == in.ps &&
        o.src_port == in.port && (!o.src_ip || o.src_ip == in.dst))
      return &o;
  return nullptr;
}

// A new passive id on the listener's channel, its addresses from the RDMA
// CM header; its events wait for the user's accept. Null if no id is free.
CmServer::Id* CmServer::passive_id(Id& lis, const Incoming& in, uint64_t tid) {
  const uint32_t nid = alloc_id();
  if (!nid) return nullptr;
  Id& id = ids_[nid];
  id.id = nid;
  id.ch = lis.ch;
  id.uid_set = false;
  id.ps = in.ps;
  id.qp_type = lis.qp_type;
  id.st = St::kReqRcvd;
  id.family = AF_INET;
  id.src_ip = in.dst;
  id.src_port = in.port;
  id.dst_ip = in.src;
  id.dst_port = in.hdr.src_port;
  id.bound = id.device = true;
  id.listener = lis.id;
  id.tid = tid;
  return &id;
}

cm::MadHdr CmServer::hdr_for(const Id& id) const {
  cm::MadHdr h;
  h.tid = id.tid;
  return h;
}

uint64_t CmServer::req_wait_ns(uint8_t life) const {
  // The active side waits 2 * packet life + the remote CM response timeout
  // it asks for (cm.c ib_send_cm_req): 4.6 s with Linux's values.
  return ms_ns(2ull * cm::timeout_ms(life) +
               cm::timeout_ms(env_.cm_response_timeout));
}

int CmServer::cmd_connect(Id& id, const uint8_t* b, uint64_t now) {
  const auto c = load<rdma_ucm_connect>(b);
  if (wire::ipv4_is_multicast(id.dst_ip)) {
    why_ = "the destination is a multicast group: join it, do not connect";
    return -EINVAL;
  }
  if (id.st != St::kRouteResolved) return -EINVAL;
  const rdma_ucm_conn_param& p = c.conn_param;
  if (id.qp_type == IBV_QPT_UD) return sidr_connect(id, p, now);
  if (p.private_data_len > cm::kReqUserDataSize) {
    why_ = "at most 56 bytes of private data fit in a REQ";
    return -EINVAL;
  }
  id.local_qpn = p.qp_num & wire::kMask24;
  id.responder_resources = p.responder_resources;
  id.initiator_depth = p.initiator_depth;
  id.retry_count = std::min<uint8_t>(7, p.retry_count);
  id.rnr_retry_count = std::min<uint8_t>(7, p.rnr_retry_count);
  id.flow_control = p.flow_control;
  id.srq = p.srq;
  id.mtu = env_.active_mtu;
  id.qp_timeout = ack_timeout(env_.ca_ack_delay, packet_life(id.ack_timeout));
  id.flow_label = (uint32_t{id.src_port} * 31 + id.dst_port) & 0xfffff;
  alloc_comm(id);
  id.tid = uint64_t{0x75726e69} << 32 | id.local_comm_id;  // "urni"
  id.udp_sport = static_cast<uint16_t>(0xc000 | (id.local_comm_id & 0x3fff));

  cm::Req r;
  r.local_comm_id = id.local_comm_id;
  r.service_id = cm::service_id(id.ps, id.dst_port);
  r.local_ca_guid = be64toh(env_.node_guid);
  r.local_qpn = id.local_qpn;
  r.responder_resources = id.responder_resources;
  r.initiator_depth = id.initiator_depth;
  r.remote_cm_response_timeout = env_.cm_response_timeout;
  r.transport_type = 0;  // RC
  r.flow_control = id.flow_control;
  r.starting_psn = id.seq_num;
  r.local_cm_response_timeout = env_.cm_response_timeout;
  r.retry_count = id.retry_count;
  r.pkey = 0xffff;
  r.path_mtu = id.mtu;
  r.rnr_retry_count = id.rnr_retry_count;
  r.max_cm_retries = env_.max_cm_retries;
  r.srq = id.srq;
  gid_of(id.src_ip, r.primary.local_gid);
  gid_of(id.dst_ip, r.primary.remote_gid);
  r.primary.flow_label = id.flow_label;
  r.primary.traffic_class = id.tos;
  r.primary.hop_limit = env_.addrs.ttl;
  r.primary.local_ack_timeout = id.qp_timeout;
  cma_hdr(id, r.private_data);
  std::memcpy(r.private_data + cm::kCmaHdrSize, p.private_data,
              p.private_data_len);
  cm::encode(hdr_for(id), r, id.mad.data());
  id.st = St::kReqSent;
  id.cm_wait_ns = req_wait_ns(packet_life(id.ack_timeout));
  id.cm_retries = env_.max_cm_retries;
  id.retries_left = id.cm_retries;
  id.retry_every = id.cm_wait_ns;
  send_tracked(id, now);
  return 0;
}

void CmServer::conn_param(const Id& id, rdma_ucm_conn_param& p,
                          const uint8_t* pdata, size_t plen) const {
  p.qp_num = id.remote_qpn;
  // The peer's resources as this side's: swapped (cm_format_req_event).
  p.responder_resources = id.responder_resources;
  p.initiator_depth = id.initiator_depth;
  p.flow_control = id.flow_control;
  p.retry_count = id.retry_count;
  p.rnr_retry_count = id.rnr_retry_count;
  p.srq = id.srq;
  if (pdata) {
    plen = std::min(plen, sizeof p.private_data);
    std::memcpy(p.private_data, pdata, plen);
    p.private_data_len = static_cast<uint8_t>(plen);
  }
}

int CmServer::cmd_accept(Id& id, const uint8_t* b, uint64_t now) {
  const auto c = load<rdma_ucm_accept>(b);
  const rdma_ucm_conn_param& p = c.conn_param;
  if (id.st == St::kRepRcvd) {
    // Active side, after CONNECT_RESPONSE: librdmacm has moved the QP to
    // RTS and reports ESTABLISHED itself; the RTU tells the peer.
    cm::Rtu r;
    r.local_comm_id = id.local_comm_id;
    r.remote_comm_id = id.remote_comm_id;
    uint8_t mad[cm::kMadSize];
    cm::encode(hdr_for(id), r, mad);
    send(id.dst_ip, mad, id.udp_sport);
    id.st = St::kEstablished;
    ctr_.connections.fetch_add(1, std::memory_order_relaxed);
    return 0;
  }
  if (id.st != St::kReqRcvd) return -EINVAL;
  id.uid = c.uid;
  id.uid_set = true;
  if (id.qp_type == IBV_QPT_UD) {
    if (p.private_data_len > cm::kSidrRepPrivateDataSize) return -EINVAL;
    id.local_qpn = p.qp_num & wire::kMask24;
    sidr_reply(id, cm::SidrStatus::kSuccess, p.private_data,
               p.private_data_len);
    return 0;
  }
  if (p.valid) {
    if (p.private_data_len > cm::kRepPrivateDataSize) return -EINVAL;
    id.local_qpn = p.qp_num & wire::kMask24;
    id.responder_resources = p.responder_resources;
    id.initiator_depth = p.initiator_depth;
    id.rnr_retry_count = std::min<uint8_t>(7, p.rnr_retry_count);
    id.flow_control = p.flow_control;
    id.srq = p.srq;
  }
  cm::Rep r;
  r.local_comm_id = id.local_comm_id;
  r.remote_comm_id = id.remote_comm_id;
  r.local_qpn = id.local_qpn;
  r.starting_psn = id.seq_num;
  r.responder_resources = id.responder_resources;
  r.initiator_depth = id.initiator_depth;
  r.target_ack_delay = env_.ca_ack_delay;
  r.flow_control = id.flow_control;
  r.rnr_retry_count = id.rnr_retry_count;
  r.srq = id.srq;
  r.local_ca_guid = be64toh(env_.node_guid);
  if (p.valid) std::memcpy(r.private_data, p.private_data, p.private_data_len);
  cm::encode(hdr_for(id), r, id.mad.data());
  id.st = St::kRepSent;
  id.retries_left = id.cm_retries;
  id.retry_every = id.cm_wait_ns;
  send_tracked(id, now);
  return 0;
}

int CmServer::cmd_reject(Id& id, const uint8_t* b) {
  const auto c = load<rdma_ucm_reject>(b);
  if (id.st != St::kReqRcvd && id.st != St::kRepRcvd) return -EINVAL;
  if (id.qp_type == IBV_QPT_UD) {
    if (c.private_data_len > cm::kSidrRepPrivateDataSize) return -EINVAL;
    sidr_reply(id, cm::SidrStatus::kReject, c.private_data, c.private_data_len);
    return 0;
  }
  if (c.private_data_len > cm::kRejPrivateDataSize) return -EINVAL;
  // cma accepts only 28 (consumer defined) and 35 (ECE); 0 means 28.
  uint16_t reason = static_cast<uint16_t>(cm::RejReason::kConsumerDefined);
  if (c.reason == 35) reason = 35;
  const bool req_rcvd = id.st == St::kReqRcvd;
  stop_timer(id);
  // The REJ of a REQ is kept: should it be lost, the REQ comes again and
  // gets it again (on_req), where silence left the peer retrying its REQ
  // for a minute and more.
  send_rej(id.dst_ip, id.tid, req_rcvd ? 0 : id.local_comm_id,
           id.remote_comm_id, req_rcvd ? 0 : 1, reason, c.private_data,
           c.private_data_len, req_rcvd ? id.mad.data() : nullptr);
  id.mad_valid = req_rcvd;
  comm_.erase(id.local_comm_id);
  id.local_comm_id = 0;
  id.st = St::kDisconnected;
  return 0;
}

int CmServer::cmd_disconnect(Id& id, uint64_t now) {
  if (id.qp_type == IBV_QPT_UD) return 0;  // no connection (SIDR only)
  switch (id.st) {
    case St::kEstablished:
    case St::kRepSent:
    case St::kRepRcvd:
      send_dreq(id, now);
      return 0;
    case St::kDreqRcvd:
      send_drep(id.dst_ip, id.tid, id.local_comm_id, id.remote_comm_id);
      enter_timewait(id, now);
      return 0;
    case St::kDreqSent:
      return 0;  // already under way
    case St::kReqSent:
    case St::kReqRcvd:
    case St::kTimewait:
    case St::kDisconnected:
      // The id has its IB CM id: Linux's rdma_disconnect tries a DREQ,
      // then a DREP, ignores that neither can go in this state and returns
      // 0 (an application may disconnect on every DISCONNECTED event).
      return 0;
    default:
      return -EINVAL;  // never connecting: no IB CM id (Linux's EINVAL)
  }
}

int CmServer::cmd_init_qp_attr(const Id& id, const uint8_t* b,
                               std::string& out) {
  const auto c = load<rdma_ucm_init_qp_attr>(b);
  ib_uverbs_qp_attr a{};
  a.qp_state = c.qp_state;
  a.port_num = 1;
  const bool cm_known = id.st == St::kReqSent || id.st == St::kReqRcvd ||
                        id.st == St::kRepRcvd || id.st == St::kRepSent ||
                        id.st == St::kEstablished;
  if (id.qp_type == IBV_QPT_UD || !cm_known) {
    // No CM exchange yet (cma_ib_init_qp_attr): INIT only.
    if (c.qp_state != IBV_QPS_INIT) return -EINVAL;
    a.qp_attr_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
    if (id.qp_type == IBV_QPT_UD) {
      a.qp_attr_mask |= IBV_QP_QKEY;
      a.qkey = kUdpQkey;
    } else {
      a.qp_attr_mask |= IBV_QP_ACCESS_FLAGS;
      a.qp_access_flags = 0;
    }
    append(out, a);
    return 0;
  }
  // Linux ib_cm_init_qp_attr (cm_init_qp_{init,rtr,rts}_attr).
  switch (c.qp_state) {
    case IBV_QPS_INIT:
      a.qp_attr_mask =
          IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
      a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
      if (id.responder_resources)
        a.qp_access_flags |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
      break;
    case IBV_QPS_RTR:
      if (id.st == St::kReqSent) return -EINVAL;  // no peer QP yet
      a.qp_attr_mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                       IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                       IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
      a.path_mtu = id.mtu;
      a.dest_qp_num = id.remote_qpn;
      a.rq_psn = id.seq_num;
      a.max_dest_rd_atomic = id.responder_resources;
      a.min_rnr_timer = 0;
      gid_of(id.dst_ip, a.ah_attr.grh.dgid);
      a.ah_attr.grh.flow_label = id.flow_label;
      a.ah_attr.grh.sgid_index = static_cast<uint8_t>(env_.sgid_index);
      a.ah_attr.grh.hop_limit = env_.addrs.ttl;
      a.ah_attr.grh.traffic_class = id.tos;
      a.ah_attr.is_global = 1;
      a.ah_attr.port_num = 1;
      break;
    case IBV_QPS_RTS:
      if (id.st == St::kReqSent) return -EINVAL;
      a.qp_attr_mask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
                       IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                       IBV_QP_MAX_QP_RD_ATOMIC;
      a.sq_psn = id.sq_psn;
      a.timeout = id.ack_timeout ? id.ack_timeout : id.qp_timeout;
      a.retry_cnt = id.retry_count;
      a.rnr_retry = id.rnr_retry_count;
      a.max_rd_atomic = id.initiator_depth;
      break;
    default:
      return -EINVAL;
  }
  append(out, a);
  return 0;
}

int CmServer::cmd_set_option(Id& id, const uint8_t* b, const uint8_t* opt,
                             uint32_t optlen) {
  const auto c = load<rdma_ucm_set_option>(b);
  if (c.optlen != optlen) return -EINVAL;
  if (c.level != RDMA_OPTION_ID) {
    why_ = "only RDMA_OPTION_ID options are supported";
    return -ENOSYS;
  }
  switch (c.optname) {
    case RDMA_OPTION_ID_TOS:
      if (optlen != 1) return -EINVAL;
      id.tos = opt[0];
      return 0;
    case RDMA_OPTION_ID_REUSEADDR:
      if (optlen != sizeof(int)) return -EINVAL;
      id.reuseaddr = load<int>(opt) != 0;
      return 0;
    case RDMA_OPTION_ID_AFONLY:
      if (optlen != sizeof(int)) return -EINVAL;
      id.afonly = load<int>(opt) != 0;
      return 0;
    case RDMA_OPTION_ID_ACK_TIMEOUT:
      if (optlen != 1) return -EINVAL;
      id.ack_timeout = std::min<uint8_t>(31, opt[0]);
      return 0;
    default:
      return -ENOSYS;
  }
}

int CmServer::cmd_migrate(Channel& to, Id& id) {
  Channel& from = *id.ch;
  if (&from == &to) return 0;
  auto& v = from.ids;
  v.erase(std::remove(v.begin(), v.end(), id.id), v.end());
  to.ids.push_back(id.id);
  id.ch = &to;
  // Events not yet in the old socket follow the id; ones already there were
  // counted by the shim against the old channel and go with it.
  for (auto it = from.backlog.begin(); it != from.backlog.end();) {
    // A membership's events carry its handle as their id, and the id's as
    // their count id.
    if (it->resp.id == id.id ||
        (mcast_event(it->resp.event) && it->count_id == id.id)) {
      to.backlog.push_back(*it);
      it = from.backlog.erase(it);
    } else {
      ++it;
    }
  }
  flush(to);
  return 0;
}

// --- multicast
// -----------------------------------------------------------------

// rdma_join_multicast: the kernel's ucma_process_join, then cma's
// rdma_join_multicast and cma_iboe_join_multicast, their checks in their
// order. The group is "joined" at once (a RoCE port has no SA to ask): the
// reply names the membership, MULTICAST_JOIN follows with the group's AH.
int CmServer::cmd_join(Id& id, uint64_t uid, const uint8_t* sa,
                       uint16_t addr_size, uint16_t join_flags,
                       std::string& out) {
  const uint16_t family = load<uint16_t>(sa);
  if (family == AF_IB) {  // librdmacm joins by IP unless it has AF_IB
    why_ = "AF_IB multicast groups are not supported (IP groups only)";
    return -EAFNOSUPPORT;
  }
  const size_t fsize = family == AF_INET    ? sizeof(sockaddr_in)
                       : family == AF_INET6 ? sizeof(sockaddr_in6)
                                            : 0;
  if (!fsize || addr_size != fsize) {
    why_ = "JOIN_MCAST: the group's address size is not its family's";
    return -EINVAL;
  }
  if (join_flags != RDMA_MC_JOIN_FLAG_FULLMEMBER &&
      join_flags != RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER) {
    why_ = "JOIN_MCAST: join_flags " + std::to_string(join_flags) +
           " is neither a full nor a send-only full member";
    return -EINVAL;
  }
  if (!id.device) {  // ucma_get_ctx_dev
    why_ =
        "a multicast join needs an id bound to urnic's port (bind its "
        "address or resolve one first)";
    return -EINVAL;
  }
  if (id.st != St::kIdle && id.st != St::kAddrResolved) {
    why_ = "a multicast join needs an id in ADDR_BOUND or ADDR_RESOLVED";
    return -EINVAL;
  }
  if (id.ps == cm::kPsTcp || id.qp_type != IBV_QPT_UD) {
    why_ = "only UD ids join multicast groups (RDMA_PS_UDP, RDMA_PS_IB UD)";
    return -EINVAL;
  }
  if (id.ps == cm::kPsIpoib) {
    // Linux never binds an RDMA_PS_IPOIB id to a RoCE port
    // (cma_acquire_dev_by_src_ip), so it never gets this far.
    why_ = "RDMA_PS_IPOIB ids cannot join groups on a RoCE port";
    return -EINVAL;
  }
  uint16_t f, port;
  uint32_t group = 0;
  const bool ipv4 = parse_addr(sa, &f, &group, &port);
  if (ipv4 && group == 0) {  // cma_zero_addr
    why_ = "the multicast group is the zero address";
    return -EINVAL;
  }
  if (family == AF_INET6) {
    // Linux joins IPv4 groups only on a RoCEv2 port (no MLD):
    // cma_iboe_join_multicast's ENOTSUPP.
    why_ = "IPv6 multicast groups are not supported on RoCEv2";
    return -EOPNOTSUPP;
  }
  if (!wire::ipv4_is_multicast(group)) {
    why_ = "the group is not a multicast address (224.0.0.0/4)";
    return -EINVAL;
  }
  if (mcasts_.size() >= kMaxMcasts) {
    why_ = "too many multicast memberships";
    return -ENOMEM;
  }
  uint32_t h = 0;
  while (!h) {  // cyclic, so a handle left is not soon given out again
    const uint32_t n = next_mcast_;
    next_mcast_ = n == UINT32_MAX ? 1 : n + 1;
    if (!mcasts_.count(n)) h = n;
  }
  // A second join of the same group makes a second membership, as Linux's
  // (rdma_join_multicast does not look for one).
  // (Send-only or not changes nothing here: a send-only member's QP is not
  // attached, librdmacm's ucma_process_join.)
  mcasts_[h].id = id.id;
  id.mcasts.push_back(h);
  ctr_.mcast_joins.fetch_add(1, std::memory_order_relaxed);
  ctr_.mcast_groups.fetch_add(1, std::memory_order_relaxed);
  rdma_ucm_create_id_resp r{};
  r.id = h;
  append(out, r);
  // No IGMP report goes out from here (the kernel's cma_igmp_send does,
  // for a full member): urnicd reports a group when a QP of the device
  // first attaches to it (ibv_attach_mcast, which librdmacm calls on this
  // event for a full member), Daemon::mcast_changed.
  //
  // The event as cma_make_mc_event / ib_init_ah_from_mcmember make it for
  // RoCEv2, ucma_set_event_context naming the membership (uid, handle):
  // MGID ::ffff:a.b.c.d (cma_iboe_set_mgid), no LID, SL, rate, flow label
  // or traffic class, the Q_Key of the port space (cma_set_default_qkey).
  emit(id, kMulticastJoin, 0, [&](rdma_ucm_event_resp& e) {
    e.uid = uid;
    e.id = h;
    rdma_ucm_ud_param& u = e.param.ud;
    u.qp_num = wire::kMulticastQpn;
    u.qkey = kUdpQkey;
    gid_of(group, u.ah_attr.grh.dgid);
    u.ah_attr.grh.sgid_index = static_cast<uint8_t>(env_.sgid_index);
    u.ah_attr.grh.hop_limit = kMcastHopLimit;
    u.ah_attr.is_global = 1;
    u.ah_attr.port_num = 1;
  });
  return 0;
}

// rdma_leave_multicast (ucma_leave_multicast): the membership goes, with
// its events not yet in the socket (ucma_cleanup_mc_events). The reply
// counts its events the socket got; the shim answers with those it handed
// out and drops the rest when they come.
int CmServer::cmd_leave(Channel& ch, uint32_t handle, std::string& out) {
  auto it = mcasts_.find(handle);
  if (it == mcasts_.end()) {
    why_ = "no such multicast membership";
    return -ENOENT;
  }
  auto id = ids_.find(it->second.id);
  if (id == ids_.end() || id->second.ch != &ch) {
    why_ = "the multicast membership is another channel's";
    return -EINVAL;
  }
  const uint32_t owner = it->second.id;
  auto& bl = ch.backlog;
  bl.erase(std::remove_if(bl.begin(), bl.end(),
                          [&](const shim::CmEventMsg& m) {
                            return mcast_event(m.resp.event) &&
                                   m.resp.id == handle && m.count_id == owner;
                          }),
           bl.end());
  rdma_ucm_destroy_id_resp r{};
  r.events_reported = it->second.events_sent;
  append(out, r);
  drop_mcast(handle);
  ctr_.mcast_leaves.fetch_add(1, std::memory_order_relaxed);
  return 0;
}

void CmServer::drop_mcast(uint32_t handle) {
  auto it = mcasts_.find(handle);
  if (it == mcasts_.end()) return;
  auto id = ids_.find(it->second.id);
  if (id != ids_.end()) {
    auto& v = id->second.mcasts;
    v.erase(std::remove(v.begin(), v.end(), handle), v.end());
  }
  mcasts_.erase(it);
  ctr_.mcast_groups.fetch_sub(1, std::memory_order_relaxed);
}

// --- events ------------------------------------------------------------------

void CmServer::emit(Id& id, uint32_t event, int32_t status,
                    const std::function<void(rdma_ucm_event_resp&)>& fill,
                    uint32_t count_id) {
  // A passive id's events reach the user only once it is accepted (Linux
  // ucma_event_handler drops them while the uid is unset).
  if (!id.ch || (!id.uid_set && event != kConnectRequest)) {
    ctr_.events_dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  shim::CmEventMsg m;
  m.count_id = count_id ? count_id : id.id;
  m.resp.uid = id.uid;
  m.resp.id = id.id;
  m.resp.event = event;
  m.resp.status = static_cast<uint32_t>(status);
  if (fill) fill(m.resp);
  id.ch->backlog.push_back(m);
  ctr_.events.fetch_add(1, std::memory_order_relaxed);
  flush(*id.ch);
}

void CmServer::flush(Channel& ch) {
  while (!ch.backlog.empty()) {
    const ssize_t n =
        ::send(ch.ev_fd, &ch.backlog.front(), sizeof(shim::CmEventMsg),
               MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;  // next tick
    if (n < 0) {
      // The application closed its end: nobody will read these.
      ctr_.events_dropped.fetch_add(ch.backlog.size(),
                                    std::memory_order_relaxed);
      ch.backlog.clear();
      return;
    }
    const shim::CmEventMsg& m = ch.backlog.front();
    if (mcast_event(m.resp.event)) {
      auto mc = mcasts_.find(m.resp.id);
      if (mc != mcasts_.end() && mc->second.id == m.count_id)
        ++mc->second.events_sent;
    }
    ch.backlog.pop_front();
  }
}

void CmServer::on_close(const ClientInfo& ci) {
  auto it = channels_.find(ci.id);
  if (it == channels_.end()) return;
  Channel& ch = it->second;
  const std::vector<uint32_t> ids = ch.ids;
  for (uint32_t n : ids) {
    auto id = ids_.find(n);
    if (id != ids_.end()) cmd_destroy(id->second);
  }
  if (ch.ev_fd >= 0) close(ch.ev_fd);
  channels_.erase(it);
  ctr_.channels.fetch_sub(1, std::memory_order_relaxed);
}

bool CmServer::busy() const {
  if (!loop_.empty() || !held_.empty()) return true;
  for (const auto& [n, id] : ids_)
    if (id.retry_at || id.st == St::kAddrQuery) return true;
  return false;
}

void CmServer::shutdown(uint64_t now) {
  if (shut_down_) return;
  shut_down_ = true;
  now_ = now;
  // Refused: nobody will listen now (the REJs reach the wire only if the
  // workers still run; else the peers' REQs time out).
  release_held(now, true);
  for (auto& [n, id] : ids_)
    if (id.st != St::kListen) emit(id, kDeviceRemoval, 0);
}

// --- MADs --------------------------------------------------------------------

void CmServer::send(uint32_t peer_ip, const uint8_t mad[cm::kMadSize],
                    uint16_t sport) {
  // A UD SEND_ONLY from QP1 to QP1 (IBTA 13.5.1; Linux mad.c): GSI Q_Key,
  // default P_Key.
  wire::RoceFields f;
  f.src_mac = env_.addrs.mac;
  f.vlan = env_.vlan_tci != 0;
  f.vlan_tci = env_.vlan_tci;
  gid_of(env_.addrs.ipv4, f.sgid);
  gid_of(peer_ip, f.dgid);
  f.ttl = env_.addrs.ttl;
  f.udp_sport = sport;
  f.opcode = wire::opcode::kUdSendOnly;
  f.dqpn = 1;
  f.psn = psn_++ & wire::kMask24;
  f.deth_qkey = cm::kQp1Qkey;
  f.deth_src_qp = 1;
  f.payload_len = cm::kMadSize;
  uint8_t frame[512];
  const uint32_t len = wire::encode_frame(f, mad, frame, sizeof frame);
  if (!len) return;
  ctr_.mads_tx.fetch_add(1, std::memory_order_relaxed);
  trace("tx", peer_ip, mad);
  if (local_ip(peer_ip)) {
    loop_.emplace_back(frame, frame + len);  // handled on the next tick
    return;
  }
  if (env_.send_frame) env_.send_frame(f.dgid, frame, len);
}

void CmServer::send_tracked(Id& id, uint64_t now) {
  send(id.dst_ip, id.mad.data(), id.udp_sport);
  id.mad_valid = true;
  id.retry_at = now + id.retry_every;
}

void CmServer::stop_timer(Id& id) {
  id.mad_valid = false;
  id.retry_at = 0;
}

void CmServer::send_rej(uint32_t peer_ip, uint64_t tid, uint32_t local_comm,
                        uint32_t remote_comm, uint8_t msg_rejected,
                        uint16_t reason, const uint8_t* pdata, size_t plen,
                        uint8_t* keep) {
  cm::MadHdr h;
  h.tid = tid;
  cm::Rej r;
  r.local_comm_id = local_comm;
  r.remote_comm_id = remote_comm;
  r.message_rejected = msg_rejected;
  r.reason = reason;
  if (reason == static_cast<uint16_t>(cm::RejReason::kTimeout)) {
    // ARI: our CA GUID, so the peer can find the REQ (cm_acquire_rejected_id)
    const uint64_t g = env_.node_guid;
    std::memcpy(r.ari, &g, 8);
    r.ari_length = 8;
  }
  if (pdata)
    std::memcpy(r.private_data, pdata,
                std::min<size_t>(plen, sizeof r.private_data));
  uint8_t mad[cm::kMadSize];
  cm::encode(h, r, mad);
  if (keep) std::memcpy(keep, mad, cm::kMadSize);
  ctr_.rej_tx.fetch_add(1, std::memory_order_relaxed);
  send(peer_ip, mad, 0xc000);
}

// MRA (IBTA 12.6.6): the message `mraed` (0 REQ, 1 REP) arrived again
// while our user has not answered it; the peer waits the service timeout
// (24: 4.096 us * 2^24, about 69 s) before its next try. Like Linux, only
// when a duplicate shows the peer is waiting (cm_dup_req_handler).
void CmServer::send_mra(const Id& id, uint8_t mraed) {
  cm::Mra m;
  m.local_comm_id = id.local_comm_id;
  m.remote_comm_id = id.remote_comm_id;
  m.message_mraed = mraed;
  m.service_timeout = 24;
  uint8_t mad[cm::kMadSize];
  cm::encode(hdr_for(id), m, mad);
  send(id.dst_ip, mad, id.udp_sport);
}

void CmServer::send_dreq(Id& id, uint64_t now) {
  cm::Dreq d;
  d.local_comm_id = id.local_comm_id;
  d.remote_comm_id = id.remote_comm_id;
  d.remote_qpn = id.remote_qpn;
  cm::encode(hdr_for(id), d, id.mad.data());
  id.st = St::kDreqSent;
  id.retries_left = id.cm_retries;
  id.retry_every =
      id.cm_wait_ns ? id.cm_wait_ns : req_wait_ns(packet_life(id.ack_timeout));
  send_tracked(id, now);
}

void CmServer::send_drep(uint32_t peer_ip, uint64_t tid, uint32_t local_comm,
                         uint32_t remote_comm) {
  cm::MadHdr h;
  h.tid = tid;
  cm::Drep d;
  d.local_comm_id = local_comm;
  d.remote_comm_id = remote_comm;
  uint8_t mad[cm::kMadSize];
  cm::encode(h, d, mad);
  send(peer_ip, mad, 0xc000);
}

void CmServer::enter_timewait(Id& id, uint64_t now) {
  stop_timer(id);
  id.st = St::kTimewait;
  id.deadline = now + ms_ns(cm::timeout_ms(id.qp_timeout));
}

void CmServer::rx(const wire::RoceFields& f, const uint8_t* mad, uint32_t len,
                  uint64_t now) {
  now_ = now;
  ctr_.mads_rx.fetch_add(1, std::memory_order_relaxed);
  cm::MadHdr h;
  // The GSI takes UD sends with its Q_Key and a P_Key of the table only
  // (IBTA 10.2.4; rxe check_keys).
  if (f.opcode != wire::opcode::kUdSendOnly || f.deth_qkey != cm::kQp1Qkey ||
      !wire::pkey_ok(f.pkey) || !wire::gid_is_ipv4(f.sgid) ||
      cm::decode_hdr(mad, len, h) != cm::DecodeError::kOk) {
    ctr_.mads_bad.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  trace("rx", wire::gid_to_ipv4(f.sgid), mad);
  switch (static_cast<cm::Attr>(h.attr_id)) {
    case cm::Attr::kReq:
      on_req(f, h, mad, now);
      break;
    case cm::Attr::kRep:
      on_rep(f, h, mad, now);
      break;
    case cm::Attr::kRtu:
      on_rtu(mad);
      break;
    case cm::Attr::kRej:
      on_rej(mad, now);
      break;
    case cm::Attr::kMra:
      on_mra(mad, now);
      break;
    case cm::Attr::kDreq:
      on_dreq(f, h, mad, now);
      break;
    case cm::Attr::kDrep:
      on_drep(mad, now);
      break;
    case cm::Attr::kSidrReq:
      on_sidr_req(f, h, mad);
      break;
    case cm::Attr::kSidrRep:
      on_sidr_rep(mad);
      break;
  }
}

void CmServer::on_req(const wire::RoceFields& f, const cm::MadHdr& h,
                      const uint8_t* mad, uint64_t now) {
  cm::Req q;
  cm::decode(mad, q);
  const uint32_t peer = wire::gid_to_ipv4(f.sgid);
  // A REQ we already have: the REP is what got lost (cm_insert_remote_id).
  for (auto& [n, o] : ids_) {
    if (o.listener && o.remote_comm_id == q.local_comm_id &&
        o.remote_guid == q.local_ca_guid && o.dst_ip == peer) {
      if (o.st == St::kRepSent && o.mad_valid)
        send(o.dst_ip, o.mad.data(), o.udp_sport);
      else if (o.st == St::kReqRcvd)
        send_mra(o, 0);  // our user has not answered yet: wait longer
      else if (o.st == St::kDisconnected && o.mad_valid)
        send(o.dst_ip, o.mad.data(), 0xc000);  // the REJ, lost
      return;
    }
  }
  // The same remote QP (CA GUID, QPN) still connected or in timewait here:
  // REJ "stale connection", and a live old connection is ended
  // (cm_match_req / cm_insert_remote_qpn).
  for (auto& [n, o] : ids_) {
    if (o.qp_type != IBV_QPT_RC || o.remote_guid != q.local_ca_guid ||
        o.remote_qpn != q.local_qpn || o.dst_ip != peer)
      continue;
    if (o.st == St::kTimewait || o.st == St::kEstablished ||
        o.st == St::kRepSent || o.st == St::kDreqSent ||
        o.st == St::kDreqRcvd) {
      send_rej(peer, h.tid, 0, q.local_comm_id, 0,
               static_cast<uint16_t>(cm::RejReason::kStaleConn), nullptr, 0);
      if (o.st == St::kEstablished) send_dreq(o, now);
      return;
    }
  }
  const Incoming in = incoming(q.private_data, q.service_id);
  Id* lis = listener(IBV_QPT_RC, in);
  if (!lis) {
    // Nobody listens on this service ID (yet): held for a listener no longer
    // than half of what the active side waits for our answer, then REJ
    // "invalid service ID", echoing the REQ's TID (Linux cm_issue_rej).
    if (hold(f, h, mad,
             ms_ns(cm::timeout_ms(q.remote_cm_response_timeout)) / 2))
      return;
    send_rej(peer, h.tid, 0, q.local_comm_id, 0,
             static_cast<uint16_t>(cm::RejReason::kInvalidServiceId), nullptr,
             0);
    return;
  }
  // What Linux's cma refuses with REJ 28: no RDMA CM header, an address
  // that is not ours, a source that is not the sender (cma_ib_id_from_event).
  if (!in.ip || !local_ip(in.dst) || in.src != peer) {
    send_rej(peer, h.tid, 0, q.local_comm_id, 0,
             static_cast<uint16_t>(cm::RejReason::kConsumerDefined), nullptr,
             0);
    return;
  }
  if (q.transport_type != 0) {
    send_rej(peer, h.tid, 0, q.local_comm_id, 0,
             static_cast<uint16_t>(cm::RejReason::kInvalidTransportType),
             nullptr, 0);
    return;
  }
  uint32_t waiting = 0;
  for (auto& [n, o] : ids_)
    if (o.listener == lis->id && o.st == St::kReqRcvd) ++waiting;
  // Full: the REQ will come again (also one a LISTEN released from the hold
  // beyond its backlog: after the peer's CM response timeout).
  if (waiting >= lis->backlog) return;

  Id* child = passive_id(*lis, in, h.tid);
  if (!child) return;  // no id to give: the REQ will come again
  Id& id = *child;     // references to the others stay valid (node map)
  id.tos = q.primary.traffic_class;
  id.seq_num = random_u64() & wire::kMask24;
  alloc_comm(id);
  id.remote_comm_id = q.local_comm_id;
  id.remote_guid = q.local_ca_guid;
  id.remote_qpn = q.local_qpn;
  id.sq_psn = q.starting_psn;
  id.mtu = std::min<uint8_t>(q.path_mtu ? q.path_mtu : uint8_t{IBV_MTU_1024},
                             env_.active_mtu);
  id.responder_resources = q.initiator_depth;
  id.initiator_depth = q.responder_resources;
  id.retry_count = q.retry_count;
  id.rnr_retry_count = q.rnr_retry_count;
  id.flow_control = q.flow_control;
  id.srq = q.srq;
  // The REP waits the REQ's local CM response timeout (cm_req_handler).
  id.cm_wait_ns = ms_ns(cm::timeout_ms(q.local_cm_response_timeout));
  id.cm_retries = q.max_cm_retries;
  id.flow_label = q.primary.flow_label;
  id.qp_timeout = ack_timeout(
      env_.ca_ack_delay,
      q.primary.local_ack_timeout ? q.primary.local_ack_timeout - 1 : 0);
  id.udp_sport = f.udp_sport;
  lis->ch->ids.push_back(id.id);
  ctr_.ids.fetch_add(1, std::memory_order_relaxed);
  const uint64_t luid = lis->uid;
  emit(
      id, kConnectRequest, 0,
      [&](rdma_ucm_event_resp& e) {
        e.uid = luid;
        conn_param(id, e.param.conn, q.private_data + cm::kCmaHdrSize,
                   cm::kReqUserDataSize);
      },
      lis->id);
  (void)now;
}

void CmServer::on_rep(const wire::RoceFields& f, const cm::MadHdr& h,
                      const uint8_t* mad, uint64_t now) {
  (void)f;
  (void)h;
  cm::Rep r;
  cm::decode(mad, r);
  Id* id = by_comm(r.remote_comm_id);
  if (!id) {
    ctr_.mads_unmatched.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (id->st == St::kEstablished && id->remote_comm_id == r.local_comm_id) {
    // Our RTU was lost (cm_dup_rep_handler): send it again.
    cm::Rtu u;
    u.local_comm_id = id->local_comm_id;
    u.remote_comm_id = id->remote_comm_id;
    uint8_t out[cm::kMadSize];
    cm::encode(hdr_for(*id), u, out);
    send(id->dst_ip, out, id->udp_sport);
    return;
  }
  if (id->st == St::kRepRcvd && id->remote_comm_id == r.local_comm_id) {
    send_mra(*id, 1);  // our user has not accepted it yet: wait longer
    return;
  }
  if (id->st != St::kReqSent) return;
  stop_timer(*id);
  id->remote_comm_id = r.local_comm_id;
  id->remote_guid = r.local_ca_guid;
  id->remote_qpn = r.local_qpn;
  id->sq_psn = r.starting_psn;
  // The REP's resources as ours, swapped (cm_rep_handler).
  id->responder_resources = r.initiator_depth;
  id->initiator_depth = r.responder_resources;
  id->rnr_retry_count = r.rnr_retry_count;
  id->flow_control = r.flow_control;
  id->srq = r.srq;
  id->qp_timeout = ack_timeout(r.target_ack_delay, id->qp_timeout - 1);
  id->st = St::kRepRcvd;
  Id& ref = *id;
  emit(ref, kConnectResponse, 0, [&](rdma_ucm_event_resp& e) {
    conn_param(ref, e.param.conn, r.private_data, cm::kRepPrivateDataSize);
  });
  (void)now;
}

void CmServer::on_rtu(const uint8_t* mad) {
  cm::Rtu r;
  cm::decode(mad, r);
  Id* id = by_comm(r.remote_comm_id);
  if (!id || id->st != St::kRepSent || id->remote_comm_id != r.local_comm_id) {
    ctr_.mads_unmatched.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  stop_timer(*id);
  id->st = St::kEstablished;
  ctr_.connections.fetch_add(1, std::memory_order_relaxed);
  Id& ref = *id;
  emit(ref, kEstablished, 0, [&](rdma_ucm_event_resp& e) {
    conn_param(ref, e.param.conn, r.private_data, 0);
  });
}

void CmServer::on_rej(const uint8_t* mad, uint64_t now) {
  cm::Rej r;
  cm::decode(mad, r);
  ctr_.rej_rx.fetch_add(1, std::memory_order_relaxed);
  Id* id = by_comm(r.remote_comm_id);
  if (!id && r.reason == static_cast<uint16_t>(cm::RejReason::kTimeout) &&
      r.ari_length >= 8) {
    // A REQ its sender withdrew (destroyed in REQ_SENT) names itself by the
    // sender's CA GUID in the ARI and its comm ID (cm_acquire_rejected_id).
    uint64_t guid;
    std::memcpy(&guid, r.ari, 8);
    guid = be64toh(guid);
    for (auto& [n, o] : ids_)
      if (o.listener && o.remote_guid == guid &&
          o.remote_comm_id == r.local_comm_id)
        id = &o;
    // Or a REQ still held for a listener: it is forgotten, not given to one.
    const size_t held = held_.size();
    std::erase_if(held_, [&](const Held& o) {
      if (o.h.attr_id != static_cast<uint16_t>(cm::Attr::kReq)) return false;
      cm::Req q;
      cm::decode(o.mad.data(), q);
      return q.local_ca_guid == guid && q.local_comm_id == r.local_comm_id;
    });
    if (!id && held_.size() != held) return;
  }
  if (!id || (id->st != St::kReqSent && id->st != St::kReqRcvd &&
              id->st != St::kRepSent && id->st != St::kRepRcvd &&
              id->st != St::kEstablished)) {
    ctr_.mads_unmatched.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  stop_timer(*id);
  Id& ref = *id;
  if (ref.st == St::kEstablished) {
    // A REJ after the connection was up (our RTU was lost and the peer gave
    // up): timewait, and the user is told (cm_rej_handler).
    enter_timewait(ref, now);
  } else {
    comm_.erase(ref.local_comm_id);
    ref.local_comm_id = 0;
    ref.st = St::kDisconnected;
  }
  // The user sees the IB reason as the status (positive) and the private
  // data (ucma's REJECTED).
  emit(ref, kRejected, r.reason, [&](rdma_ucm_event_resp& e) {
    std::memcpy(e.param.conn.private_data, r.private_data,
                sizeof r.private_data);
    e.param.conn.private_data_len = sizeof r.private_data;
  });
}

void CmServer::on_mra(const uint8_t* mad, uint64_t now) {
  cm::Mra m;
  cm::decode(mad, m);
  Id* id = by_comm(m.remote_comm_id);
  if (!id || !id->mad_valid) {
    ctr_.mads_unmatched.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  // Only an MRA of what we are waiting for counts: 0 the REQ, 1 the REP.
  if ((m.message_mraed == 0 && id->st != St::kReqSent) ||
      (m.message_mraed == 1 && id->st != St::kRepSent) || m.message_mraed > 1) {
    ctr_.mads_unmatched.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  // The peer needs longer (its user has not answered): wait the service
  // timeout it names before resending (cm_mra_handler).
  id->retry_at = now + ms_ns(cm::timeout_ms(m.service_timeout) +
                             cm::timeout_ms(id->qp_timeout));
}

void CmServer::on_dreq(const wire::RoceFields& f, const cm::MadHdr& h,
                       const uint8_t* mad, uint64_t now) {
  cm::Dreq d;
  cm::decode(mad, d);
  Id* id = by_comm(d.remote_comm_id);
  const uint32_t peer = wire::gid_to_ipv4(f.sgid);
  if (!id || id->remote_comm_id != d.local_comm_id) {
    // Answered anyway, so the peer does not wait out its retries
    // (cm_issue_drep).
    send_drep(peer, h.tid, d.remote_comm_id, d.local_comm_id);
    return;
  }
  if (d.remote_qpn != id->local_qpn) {
    ctr_.mads_unmatched.fetch_add(1, std::memory_order_relaxed);
    return;  // not our QP (cm_dreq_handler)
  }
  switch (id->st) {
    case St::kEstablished:
    case St::kRepSent:
    case St::kRepRcvd:
      stop_timer(*id);
      id->st = St::kDreqRcvd;
      id->tid = h.tid;
      emit(*id, kDisconnected, 0);
      break;
    case St::kDreqSent:
      // Both sides disconnect at once.
      send_drep(id->dst_ip, h.tid, id->local_comm_id, id->remote_comm_id);
      enter_timewait(*id, now);
      emit(*id, kDisconnected, 0);
      break;
    case St::kTimewait:
      send_drep(id->dst_ip, h.tid, id->local_comm_id, id->remote_comm_id);
      break;
    case St::kDreqRcvd:
      // A repeated DREQ: the DREP waits for our user's rdma_disconnect
      // (Linux counts and drops it in DREQ_RCVD).
      ctr_.mads_unmatched.fetch_add(1, std::memory_order_relaxed);
      break;
    default:
      break;
  }
}

void CmServer::on_drep(const uint8_t* mad, uint64_t now) {
  cm::Drep d;
  cm::decode(mad, d);
  Id* id = by_comm(d.remote_comm_id);
  if (!id || id->st != St::kDreqSent) {
    ctr_.mads_unmatched.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  enter_timewait(*id, now);
  emit(*id, kDisconnected, 0);
}

// --- SIDR: UD ids
// ---------------------------------------------------------------

void CmServer::cma_hdr(const Id& id, uint8_t out[cm::kCmaHdrSize]) const {
  // The addresses the passive side's id takes (cma_format_hdr).
  cm::CmaHdr ch;
  ch.ip_version = 4;
  ch.src_port = id.src_port;
  const uint32_t sbe = htonl(id.src_ip), dbe = htonl(id.dst_ip);
  std::memcpy(ch.src_addr + 12, &sbe, 4);
  std::memcpy(ch.dst_addr + 12, &dbe, 4);
  cm::encode(ch, out);
}

void CmServer::ah_of(const Id& id, ib_uverbs_ah_attr& ah) const {
  gid_of(id.dst_ip, ah.grh.dgid);
  ah.grh.flow_label = id.flow_label;
  ah.grh.sgid_index = static_cast<uint8_t>(env_.sgid_index);
  ah.grh.hop_limit = env_.addrs.ttl;
  ah.grh.traffic_class = id.tos;
  ah.is_global = 1;
  ah.port_num = 1;
}

int CmServer::sidr_connect(Id& id, const rdma_ucm_conn_param& p, uint64_t now) {
  if (p.private_data_len > cm::kSidrReqUserDataSize) {
    why_ = "at most 180 bytes of private data fit in a SIDR_REQ";
    return -EINVAL;
  }
  id.local_qpn = p.qp_num & wire::kMask24;
  alloc_comm(id);
  id.tid = uint64_t{0x75726e69} << 32 | id.local_comm_id;
  id.udp_sport = static_cast<uint16_t>(0xc000 | (id.local_comm_id & 0x3fff));
  cm::SidrReq r;
  r.request_id = id.local_comm_id;
  r.pkey = 0xffff;
  r.service_id = cm::service_id(id.ps, id.dst_port);
  cma_hdr(id, r.private_data);
  std::memcpy(r.private_data + cm::kCmaHdrSize, p.private_data,
              p.private_data_len);
  cm::encode(hdr_for(id), r, id.mad.data());
  id.st = St::kReqSent;
  id.retries_left = env_.max_cm_retries;
  id.retry_every = ms_ns(cm::timeout_ms(env_.cm_response_timeout));
  send_tracked(id, now);
  return 0;
}

// The answer to a SIDR_REQ: sent once, kept for a repeated request.
void CmServer::sidr_reply(Id& id, cm::SidrStatus st, const uint8_t* pdata,
                          size_t plen) {
  cm::MadHdr h;
  h.tid = id.tid;
  cm::SidrRep r;
  r.request_id = id.remote_comm_id;
  r.status = static_cast<uint8_t>(st);
  r.service_id = cm::service_id(id.ps, id.src_port);
  if (st == cm::SidrStatus::kSuccess) {
    r.qpn = id.local_qpn;
    r.qkey = kUdpQkey;
  }
  if (pdata)
    std::memcpy(r.private_data, pdata,
                std::min<size_t>(plen, sizeof r.private_data));
  cm::encode(h, r, id.mad.data());
  id.mad_valid = true;  // for duplicates; no timer
  id.retry_at = 0;
  send(id.dst_ip, id.mad.data(), id.udp_sport);
  id.st = st == cm::SidrStatus::kSuccess ? St::kEstablished : St::kDisconnected;
}

void CmServer::on_sidr_req(const wire::RoceFields& f, const cm::MadHdr& h,
                           const uint8_t* mad) {
  cm::SidrReq q;
  cm::decode(mad, q);
  const uint32_t peer = wire::gid_to_ipv4(f.sgid);
  for (auto& [n, o] : ids_) {
    if (o.listener && o.qp_type == IBV_QPT_UD &&
        o.remote_comm_id == q.request_id && o.dst_ip == peer) {
      if (o.mad_valid) send(o.dst_ip, o.mad.data(), o.udp_sport);
      return;  // answered again, or the user has not answered yet
    }
  }
  auto reply = [&](cm::SidrStatus st) {
    cm::SidrRep r;
    r.request_id = q.request_id;
    r.service_id = q.service_id;
    r.status = static_cast<uint8_t>(st);
    uint8_t out[cm::kMadSize];
    cm::encode(h, r, out);
    send(peer, out, 0xc000);
  };
  const Incoming in = incoming(q.private_data, q.service_id);
  Id* lis = listener(IBV_QPT_UD, in);
  if (!lis) {
    // No UD listener (yet): held for one, then "unsupported"
    // (cm_sidr_req_handler). A SIDR_REQ says nothing of its timeout; Linux's
    // cma waits 4 s, longer than the longest grace.
    if (hold(f, h, mad, UINT64_MAX)) return;
    reply(cm::SidrStatus::kUnsupported);
    return;
  }
  if (!in.ip || !local_ip(in.dst) || in.src != peer) {
    reply(cm::SidrStatus::kReject);
    return;
  }
  Id* child = passive_id(*lis, in, h.tid);
  if (!child) return;  // the SIDR_REQ will come again
  Id& id = *child;
  id.remote_comm_id = q.request_id;
  id.udp_sport = f.udp_sport;
  lis->ch->ids.push_back(id.id);
  ctr_.ids.fetch_add(1, std::memory_order_relaxed);
  const uint64_t luid = lis->uid;
  emit(
      id, kConnectRequest, 0,
      [&](rdma_ucm_event_resp& e) {
        e.uid = luid;
        // No AH: the passive side answers with ibv_create_ah_from_wc.
        std::memcpy(e.param.ud.private_data, q.private_data + cm::kCmaHdrSize,
                    cm::kSidrReqUserDataSize);
        e.param.ud.private_data_len = cm::kSidrReqUserDataSize;
      },
      lis->id);
}

bool CmServer::hold(const wire::RoceFields& f, const cm::MadHdr& h,
                    const uint8_t* mad, uint64_t wait_ns) {
  if (refuse_ || env_.listen_grace_ns == 0) return false;
  const uint32_t peer = wire::gid_to_ipv4(f.sgid);
  for (const Held& o : held_)
    if (o.h.tid == h.tid && o.h.attr_id == h.attr_id &&
        wire::gid_to_ipv4(o.f.sgid) == peer)
      return true;  // sent again while held
  if (held_.size() >= kMaxHeld) return false;
  Held& o = held_.emplace_back();
  o.f = f;
  o.h = h;
  std::memcpy(o.mad.data(), mad, cm::kMadSize);
  o.until = now_ + std::min(env_.listen_grace_ns, wait_ns);
  ctr_.req_holds.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void CmServer::release_held(uint64_t now, bool all) {
  if (held_.empty()) return;
  std::deque<Held> todo;
  todo.swap(held_);
  for (Held& o : todo) {
    const bool req = o.h.attr_id == static_cast<uint16_t>(cm::Attr::kReq);
    Id* lis;
    if (req) {
      cm::Req q;
      cm::decode(o.mad.data(), q);
      lis = listener(IBV_QPT_RC, incoming(q.private_data, q.service_id));
    } else {
      cm::SidrReq q;
      cm::decode(o.mad.data(), q);
      lis = listener(IBV_QPT_UD, incoming(q.private_data, q.service_id));
    }
    if (!lis && now < o.until && !all) {
      held_.push_back(std::move(o));
      continue;
    }
    if (!lis) ctr_.req_hold_expired.fetch_add(1, std::memory_order_relaxed);
    // Handled as if it came now: taken by the listener, or refused.
    refuse_ = true;
    if (req)
      on_req(o.f, o.h, o.mad.data(), now);
    else
      on_sidr_req(o.f, o.h, o.mad.data());
    refuse_ = false;
  }
}

void CmServer::on_sidr_rep(const uint8_t* mad) {
  cm::SidrRep r;
  cm::decode(mad, r);
  Id* id = by_comm(r.request_id);
  if (!id || id->qp_type != IBV_QPT_UD || id->st != St::kReqSent) {
    ctr_.mads_unmatched.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  stop_timer(*id);
  comm_.erase(id->local_comm_id);
  id->local_comm_id = 0;
  Id& ref = *id;
  // cma_sidr_rep_handler: a refusal is UNREACHABLE with the SIDR status; a
  // Q_Key other than the port space's is refused too.
  if (r.status != static_cast<uint8_t>(cm::SidrStatus::kSuccess) ||
      r.qkey != kUdpQkey) {
    ref.st = St::kDisconnected;
    emit(ref, kUnreachable, r.status ? r.status : -EINVAL);
    return;
  }
  ref.remote_qpn = r.qpn;
  ref.st = St::kEstablished;
  emit(ref, kEstablished, 0, [&](rdma_ucm_event_resp& e) {
    e.param.ud.qp_num = r.qpn;
    e.param.ud.qkey = r.qkey;
    ah_of(ref, e.param.ud.ah_attr);
    std::memcpy(e.param.ud.private_data, r.private_data, sizeof r.private_data);
    e.param.ud.private_data_len = sizeof r.private_data;
  });
}

// --- timers ------------------------------------------------------------------

void CmServer::tick(uint64_t now) {
  now_ = now;
  release_held(now);
  while (!loop_.empty()) {
    std::vector<uint8_t> fr = std::move(loop_.front());
    loop_.pop_front();
    wire::FrameInfo fi;
    wire::decode(fr.data(), static_cast<uint32_t>(fr.size()), fi);
    if (fi.kind == wire::FrameKind::kRoce && fi.roce.dqpn == 1)
      rx(fi.roce, fr.data() + fi.payload_off, fi.roce.payload_len, now);
  }
  for (auto& [n, id] : ids_) {
    switch (id.st) {
      case St::kAddrQuery: {
        uint8_t g[16];
        gid_of(id.dst_ip, g);
        const int r = local_ip(id.dst_ip) ? 0 : env_.neighbour(g);
        if (r == 0) {
          id.st = St::kAddrResolved;
          emit(id, kAddrResolved, 0);
        } else if (r != EINPROGRESS || now >= id.deadline) {
          id.st = St::kIdle;
          emit(id, kAddrError, r == EINPROGRESS ? -ETIMEDOUT : -r);
        }
        break;
      }
      case St::kTimewait:
        if (now >= id.deadline) {
          id.st = St::kDisconnected;
          comm_.erase(id.local_comm_id);
          id.local_comm_id = 0;
          emit(id, kTimewaitExit, 0);
        }
        break;
      default:
        if (!id.retry_at || now < id.retry_at) break;
        if (id.retries_left) {
          --id.retries_left;
          ctr_.mads_retransmitted.fetch_add(1, std::memory_order_relaxed);
          send(id.dst_ip, id.mad.data(), id.udp_sport);
          id.retry_at = now + id.retry_every;
          break;
        }
        // Out of retries (cm_process_send_error): the connection failed.
        ctr_.timeouts.fetch_add(1, std::memory_order_relaxed);
        stop_timer(id);
        if (id.st == St::kDreqSent) {
          enter_timewait(id, now);
          emit(id, kDisconnected, -ETIMEDOUT);
        } else {
          comm_.erase(id.local_comm_id);
          id.local_comm_id = 0;
          id.st = St::kDisconnected;
          emit(id, kUnreachable, -ETIMEDOUT);
        }
        break;
    }
  }
  for (auto& [client, ch] : channels_)
    if (!ch.backlog.empty()) flush(ch);
}

}  // namespace urnic::service
