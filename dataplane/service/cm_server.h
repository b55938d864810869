// RDMA CM in urnicd: the kernel's ucma (the commands librdmacm writes to
// /dev/infiniband/rdma_cm, forwarded by verbs-shim/rdmacm.cc) over an IBTA
// communication manager that speaks CM MADs on QP1 (IBTA vol. 1 ch. 12, as
// Linux's cm.c and cma.c put them on RoCEv2), so urnic connects to urnic and
// to the kernel's CM (rxe, RoCE HCAs).
//
// Threads: everything here runs on the control thread. Received MADs come
// from the workers by ring (daemon.cc), sent ones go to a worker as whole
// frames (CmEnv::send_frame); MADs between two ids of this service are
// looped back here, encoded and decoded like any other.
#pragma once

#include <rdma/ib_user_verbs.h>
#include <rdma/rdma_user_cm.h>
#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "dataplane/host/host.h"
#include "dataplane/hostif/abi.h"
#include "dataplane/service/control.h"
#include "dataplane/wire/cm_mad.h"

namespace urnic::service {

struct CmEnv {
  host::HostAddrs addrs;   // the port's addresses (IPv4 ids only for now)
  int sgid_index = 0;      // the IPv4-mapped GID's index (AV sgid_index)
  uint64_t node_guid = 0;  // network byte order, as ibv_get_device_guid
  uint8_t active_mtu = IBV_MTU_1024;  // enum ibv_mtu
  uint8_t ca_ack_delay = 15;          // ibv_device_attr.local_ca_ack_delay
  uint16_t vlan_tci = 0;              // port.vlan (0: untagged)
  // A whole RoCEv2 frame to `dgid` (its destination MAC is filled in by the
  // worker once the neighbour is known). False when it could not be queued
  // (the CM's retransmission covers it).
  std::function<bool(const uint8_t dgid[16], const uint8_t* frame,
                     uint32_t len)>
      send_frame;
  // Whether `dgid`'s MAC is known: 0 yes (a multicast group's always: it
  // is the group's), EINPROGRESS asked (ask again later), EHOSTUNREACH
  // resolution failed.
  std::function<int(const uint8_t dgid[16])> neighbour;
  // CM response timeout (IBTA 12.7.29: 4.096 us * 2^t) and retries of a REQ,
  // REP or DREQ, as Linux's cma uses them.
  uint8_t cm_response_timeout = 20;
  uint8_t max_cm_retries = 15;
  // How long a REQ or SIDR_REQ for a service nobody listens on is held for
  // a listener before it is refused (config cm.listen_grace_ms; 0: at once).
  uint64_t listen_grace_ns = 0;
};

struct CmCounters {
  // af_ib_refused: librdmacm's AF_IB commands, which it sends first and
  // falls back from to the IP ones (once per process): not errors.
  std::atomic<uint64_t> channels{0}, ids{0}, commands{0}, command_errors{0},
      af_ib_refused{0}, mads_rx{0}, mads_tx{0}, mads_bad{0}, mads_unmatched{0},
      mads_retransmitted{0}, rej_tx{0}, rej_rx{0}, events{0}, events_dropped{0},
      connections{0}, timeouts{0};
  // Multicast (JOIN_IP_MCAST / JOIN_MCAST / LEAVE_MCAST): joins and leaves
  // done, those refused, and the memberships held now (freed by a leave,
  // the id's destruction or its channel's close).
  std::atomic<uint64_t> mcast_joins{0}, mcast_leaves{0}, mcast_refused{0},
      mcast_groups{0};
  // Ids that started listening (rdma_listen) since start, and those
  // listening now: "is my server listening yet?" for an operator, and what
  // a test waits for before it starts a client.
  std::atomic<uint64_t> listens{0}, listening{0};
  // REQs and SIDR_REQs held for a listener (CmEnv::listen_grace_ns), and
  // those refused when their hold ended with nobody listening.
  std::atomic<uint64_t> req_holds{0}, req_hold_expired{0};
};

class CmServer {
 public:
  explicit CmServer(CmEnv env);
  ~CmServer();
  CmServer(const CmServer&) = delete;
  CmServer& operator=(const CmServer&) = delete;

  static bool is_cm_op(uint16_t op) {
    return op == static_cast<uint16_t>(shim::Op::kCmOpen) ||
           op == static_cast<uint16_t>(shim::Op::kCmCommand);
  }
  void handle(CtlRequest& req, CtlReply& rep);
  // A control connection closed: its channel's ids go, as ucma_close.
  void on_close(const ClientInfo& ci);
  // A RoCEv2 frame for QP1, decoded (`f`, the MAD in `mad`/`len`).
  void rx(const wire::RoceFields& f, const uint8_t* mad, uint32_t len,
          uint64_t now);
  // Timers: address resolution, retransmission, timewait. Cheap when idle.
  void tick(uint64_t now);
  // Service shutdown: every connection is disconnected (DREQ), every
  // channel told DEVICE_REMOVAL.
  void shutdown(uint64_t now);
  std::vector<std::pair<const char*, uint64_t>> stats() const;
  // Something is in flight (a MAD to loop back, an address being resolved,
  // a message awaiting its answer): the control loop should poll often.
  bool busy() const;
  const CmCounters& counters() const { return ctr_; }

 private:
  enum class St : uint8_t {
    kIdle,
    kAddrQuery,  // resolving the destination's MAC
    kAddrResolved,
    kRouteResolved,
    kListen,
    kReqSent,  // active: REQ out, waiting for REP (or MRA, REJ)
    kRepRcvd,  // active: CONNECT_RESPONSE given, RTU when accepted
    kReqRcvd,  // passive: CONNECT_REQUEST given, waiting for accept
    kRepSent,  // passive: REP out, waiting for RTU
    kEstablished,
    kDreqSent,
    kDreqRcvd,  // DISCONNECTED given; DREP when the user disconnects
    kTimewait,
    kDisconnected,  // timewait over, or a refused / failed connection
  };
  struct Channel;
  struct Id {
    uint32_t id = 0;
    Channel* ch = nullptr;
    uint64_t uid = 0;
    bool uid_set = true;  // a passive id's events wait for its ACCEPT
    uint16_t ps = 0;
    uint8_t qp_type = 0;  // IBV_QPT_RC / IBV_QPT_UD
    St st = St::kIdle;
    uint16_t family = 0;              // what the user gave: AF_INET or AF_INET6
    uint32_t src_ip = 0, dst_ip = 0;  // IPv4, host order
    uint16_t src_port = 0, dst_port = 0;
    bool bound = false;
    bool device = false;  // bound to urnic's port (not a wildcard)
    // A loopback address the user bound: Linux binds it as the wildcard
    // (cma_any_addr) and reports it as the id's address (src_ip stays 0).
    uint32_t loop_ip = 0;
    uint8_t tos = 0;
    bool reuseaddr = false, afonly = false;
    uint8_t ack_timeout = 0;  // RDMA_OPTION_ID_ACK_TIMEOUT, 0: not set
    uint32_t backlog = 0;
    uint32_t listener = 0;  // passive: the listener that made it
    // The connection (Linux cm_id_priv fields of the same meaning).
    uint32_t local_comm_id = 0, remote_comm_id = 0;
    uint64_t remote_guid = 0;
    uint64_t tid = 0;
    uint32_t local_qpn = 0, remote_qpn = 0;
    uint32_t seq_num = 0;  // our random PSN: our rq_psn
    uint32_t sq_psn = 0;   // the peer's starting PSN
    uint8_t mtu = IBV_MTU_1024;
    uint8_t responder_resources = 0, initiator_depth = 0;
    uint8_t retry_count = 7, rnr_retry_count = 7, flow_control = 0, srq = 0;
    uint8_t qp_timeout = 0;  // the QP's local ACK timeout
    // How long a REQ, REP or DREQ of this connection waits for its answer,
    // and how often it is sent again (Linux cm_id_priv timeout_ms and
    // max_cm_retries: the active side's own, the passive side's from the
    // REQ).
    uint64_t cm_wait_ns = 0;
    uint8_t cm_retries = 15;
    uint32_t flow_label = 0;
    uint16_t udp_sport = 0xc000;
    // The last MAD sent that is retransmitted until answered.
    std::array<uint8_t, wire::cm::kMadSize> mad{};
    bool mad_valid = false;
    uint32_t retries_left = 0;
    uint64_t retry_at = 0;     // ns; 0: no timer
    uint64_t retry_every = 0;  // ns
    uint64_t deadline = 0;     // address resolution / timewait end
    // REJ / DREQ / event private data kept for the user.
    uint32_t event_pending = 0;
    std::vector<uint32_t> mcasts;  // its multicast memberships' handles
  };
  // A multicast membership (the kernel's ucma_multicast), by its handle,
  // which its events carry as their id (and the join's uid).
  struct Mcast {
    uint32_t id = 0;           // the id that joined
    uint32_t events_sent = 0;  // its events handed to the event socket
  };
  struct Channel {
    uint64_t client = 0;
    pid_t pid = 0;
    uid_t uid = 0;
    int ev_fd = -1;
    uint64_t token = 0;
    std::vector<uint32_t> ids;
    std::deque<shim::CmEventMsg> backlog;  // the socket was full
  };

  int command(Channel& ch, const shim::CmCommandReq& req, const uint8_t* body,
              const uint8_t* opt, std::string& out);
  int cmd_create(Channel& ch, const uint8_t* b, std::string& out);
  int cmd_destroy(Id& id);
  int cmd_bind_ip(Id& id, const uint8_t* b);
  int cmd_resolve_ip(Id& id, const uint8_t* b, uint64_t now);
  int cmd_resolve_route(Id& id);
  int cmd_query_route(const Id& id, std::string& out);
  int cmd_listen(Id& id, const uint8_t* b);
  int cmd_connect(Id& id, const uint8_t* b, uint64_t now);
  int cmd_accept(Id& id, const uint8_t* b, uint64_t now);
  int cmd_reject(Id& id, const uint8_t* b);
  int cmd_disconnect(Id& id, uint64_t now);
  int cmd_init_qp_attr(const Id& id, const uint8_t* b, std::string& out);
  int cmd_set_option(Id& id, const uint8_t* b, const uint8_t* opt,
                     uint32_t optlen);
  int cmd_migrate(Channel& to, Id& id);
  // JOIN_IP_MCAST / JOIN_MCAST: `sa` the group's sockaddr, `addr_size` its
  // length as JOIN_MCAST gives it (JOIN_IP_MCAST: its family's).
  int cmd_join(Id& id, uint64_t uid, const uint8_t* sa, uint16_t addr_size,
               uint16_t join_flags, std::string& out);
  int cmd_leave(Channel& ch, uint32_t handle, std::string& out);
  void drop_mcast(uint32_t handle);  // forgets a membership

  // What a REQ or SIDR_REQ asks for (its RDMA CM header, service ID).
  struct Incoming {
    wire::cm::CmaHdr hdr;
    bool ip = false;            // a valid IPv4 RDMA CM header
    bool ip_service = false;    // an RDMA CM service ID (ps << 16 | port)
    uint32_t src = 0, dst = 0;  // IPv4, host order
    uint16_t ps = 0, port = 0;
  };
  Incoming incoming(const uint8_t* pdata, uint64_t service_id) const;
  Id* listener(uint8_t type, const Incoming& in);
  Id* passive_id(Id& lis, const Incoming& in, uint64_t tid);
  void alloc_comm(Id& id);
  static constexpr uint32_t kMaxIds = 65535;
  static constexpr size_t kMaxMcasts = 65535;
  uint32_t alloc_id();  // 1..kMaxIds, or 0 when all are taken
  Id* find(Channel& ch, uint32_t id);
  Id* by_comm(uint32_t local_comm_id);
  void drop(Id& id);  // removes an id from every table
  // 0 if `ip`:`port` may be bound, else the errno Linux's cma_check_port
  // gives: EADDRNOTAVAIL when either address is the wildcard, EADDRINUSE.
  int port_conflict(uint16_t ps, uint32_t ip, uint16_t port,
                    const Id* except) const;
  int auto_bind(Id& id);
  bool local_ip(uint32_t ip) const;
  bool on_link(uint32_t ip) const;

  // Events: queued to the channel's socket in order.
  void emit(Id& id, uint32_t event, int32_t status,
            const std::function<void(rdma_ucm_event_resp&)>& fill = nullptr,
            uint32_t count_id = 0);
  void flush(Channel& ch);
  void conn_param(const Id& id, rdma_ucm_conn_param& p, const uint8_t* pdata,
                  size_t plen) const;

  // MADs.
  wire::cm::MadHdr hdr_for(const Id& id) const;
  void send(const uint32_t peer_ip, const uint8_t mad[wire::cm::kMadSize],
            uint16_t sport);
  void send_tracked(Id& id, uint64_t now);  // id.mad, with retransmission
  // keep: where to copy the REJ sent (for a duplicate REQ), or null.
  void send_rej(uint32_t peer_ip, uint64_t tid, uint32_t local_comm,
                uint32_t remote_comm, uint8_t msg_rejected, uint16_t reason,
                const uint8_t* pdata, size_t plen, uint8_t* keep = nullptr);
  void send_dreq(Id& id, uint64_t now);
  void send_mra(const Id& id, uint8_t mraed);
  void send_drep(uint32_t peer_ip, uint64_t tid, uint32_t local_comm,
                 uint32_t remote_comm);
  void on_req(const wire::RoceFields& f, const wire::cm::MadHdr& h,
              const uint8_t* mad, uint64_t now);
  void on_rep(const wire::RoceFields& f, const wire::cm::MadHdr& h,
              const uint8_t* mad, uint64_t now);
  void on_rtu(const uint8_t* mad);
  void on_rej(const uint8_t* mad, uint64_t now);
  void on_mra(const uint8_t* mad, uint64_t now);
  void on_dreq(const wire::RoceFields& f, const wire::cm::MadHdr& h,
               const uint8_t* mad, uint64_t now);
  void on_drep(const uint8_t* mad, uint64_t now);
  // SIDR (IBTA 12.11): how UD ids (RDMA_PS_UDP) find the peer's QPN and
  // Q_Key.
  int sidr_connect(Id& id, const rdma_ucm_conn_param& p, uint64_t now);
  void sidr_reply(Id& id, wire::cm::SidrStatus st, const uint8_t* pdata,
                  size_t plen);
  void on_sidr_req(const wire::RoceFields& f, const wire::cm::MadHdr& h,
                   const uint8_t* mad);
  void on_sidr_rep(const uint8_t* mad);
  // A REQ or SIDR_REQ that found no listener, held for one (Linux refuses
  // it at once; a client racing its server's rdma_listen then fails).
  struct Held {
    wire::RoceFields f;
    wire::cm::MadHdr h;
    std::array<uint8_t, wire::cm::kMadSize> mad{};
    uint64_t until = 0;  // ns: refused then
  };
  static constexpr size_t kMaxHeld = 256;
  // Holds the request unless the grace is off, the hold is full or it has
  // ended (`refuse`); true when held (or already held: a retransmission).
  bool hold(const wire::RoceFields& f, const wire::cm::MadHdr& h,
            const uint8_t* mad, uint64_t wait_ns);
  // The held requests a listener now takes go to on_req / on_sidr_req, those
  // whose hold ended (`now` past it) are refused; `all`: every one is.
  void release_held(uint64_t now, bool all = false);
  void ah_of(const Id& id, ib_uverbs_ah_attr& ah) const;
  void cma_hdr(const Id& id, uint8_t out[wire::cm::kCmaHdrSize]) const;
  void enter_timewait(Id& id, uint64_t now);
  void stop_timer(Id& id);
  uint64_t req_wait_ns(uint8_t packet_life) const;

  CmEnv env_;
  std::map<uint64_t, Channel> channels_;  // by control client id
  std::unordered_map<uint32_t, Id> ids_;
  std::unordered_map<uint32_t, uint32_t> comm_;  // local comm id -> id
  uint32_t next_id_ = 1;
  std::unordered_map<uint32_t, Mcast> mcasts_;  // by handle
  uint32_t next_mcast_ = 1;
  uint32_t next_comm_;
  uint32_t psn_ = 0;
  bool shut_down_ = false;                 // of the MADs we send (UD: any PSN)
  std::deque<std::vector<uint8_t>> loop_;  // MADs to ourselves
  std::deque<Held> held_;
  bool refuse_ = false;  // release_held: on_req / on_sidr_req hold nothing
  uint64_t now_ = 0;
  CmCounters ctr_;
  std::string why_;
  bool af_ib_ = false;  // the refused command was an AF_IB one
};

}  // namespace urnic::service
