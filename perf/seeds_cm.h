// --cm: connection set-up with librdmacm (RDMA CM) instead of the TCP side
// channel. The server listens on -b ADDR (default 0.0.0.0) and -p PORT;
// the client resolves the server's RDMA address. The first connection is
// the control channel (CmChannel: the side channel's bytes, in SENDs on
// its own RC QP); its REQ's private data carries the test parameters and
// its REP's the receiver's memory. Each data QP is one more connection,
// made with rdma_create_qp on the same device. Once connected they are
// the same RC QPs as without --cm: nothing here is on the data path.
#pragma once

#include <netdb.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "perf/seeds_common.h"
#include "perf/seeds_tcp.h"
#include "perf/seeds_verbs.h"

namespace seeds {

inline constexpr size_t kCmReqData = 56;   // private data of a REQ (IP ids)
inline constexpr size_t kCmRepData = 196;  // of a REP

// A data connection's REQ: the program and which of its QPs this is.
struct CmDataReq {
  uint32_t magic = 0;
  uint32_t index = 0;
};

class Cm {
 public:
  explicit Cm(const Common& o) : o_(o), timeout_ms_(int(o.timeout_s) * 1000) {
    ch_ = rdma_create_event_channel();
    if (!ch_) die(kSetup, "rdma_create_event_channel: %s", strerror(errno));
  }
  Cm(const Cm&) = delete;
  Cm& operator=(const Cm&) = delete;
  ~Cm() {  // the peer sees DISCONNECTED (as when this process dies)
    for (rdma_cm_id* id : connected_) rdma_disconnect(id);
  }

  // Server: listens on -b ADDR, -p PORT.
  void listen() {
    listen_ = new_id();
    sockaddr_storage sa = address(o_.bind);
    if (rdma_bind_addr(listen_, reinterpret_cast<sockaddr*>(&sa)) ||
        rdma_listen(listen_, 4))
      die(kSetup, "RDMA CM listen on %s port %u: %s", o_.bind.c_str(),
          o_.tcp_port, strerror(errno));
  }

  // Server: the next connection request, its private data copied to
  // `priv` (the first waits as long as it takes, as accept(2)).
  rdma_cm_id* request(void* priv, size_t len, bool first = false) {
    rdma_cm_event* ev =
        wait_for(RDMA_CM_EVENT_CONNECT_REQUEST, first ? -1 : timeout_ms_);
    copy_private(ev, priv, len);
    rdma_cm_id* id = ev->id;
    rdma_ack_cm_event(ev);
    return id;
  }

  // Server: accepts `id` (its QP made) with `priv` in the REP.
  void accept(rdma_cm_id* id, const void* priv, size_t len) {
    rdma_conn_param p = conn_param(priv, len);
    if (rdma_accept(id, &p)) die(kSetup, "rdma_accept: %s", strerror(errno));
    connected_.push_back(id);
  }

  // Server: every accepted connection is ESTABLISHED; stops listening
  // (a later client is refused).
  void finish_accept() {
    while (established_ < connected_.size()) {
      rdma_cm_event* ev = wait_for(RDMA_CM_EVENT_ESTABLISHED, timeout_ms_);
      rdma_ack_cm_event(ev);
      ++established_;
    }
    rdma_destroy_id(listen_);
    listen_ = nullptr;
  }

  // Client: a new id, address and route resolved to the server's.
  rdma_cm_id* resolve() {
    rdma_cm_id* id = new_id();
    sockaddr_storage sa = address(o_.host);
    if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&sa), 2000))
      die(kSetup, "rdma_resolve_addr(%s): %s", o_.host.c_str(),
          strerror(errno));
    rdma_ack_cm_event(wait_for(RDMA_CM_EVENT_ADDR_RESOLVED, timeout_ms_));
    if (rdma_resolve_route(id, 2000))
      die(kSetup, "rdma_resolve_route: %s", strerror(errno));
    rdma_ack_cm_event(wait_for(RDMA_CM_EVENT_ROUTE_RESOLVED, timeout_ms_));
    return id;
  }

  // Client: connects `id` (its QP made), `priv` in the REQ; the REP's
  // private data is copied to `rep`. False when nobody listens on the
  // port (REJECTED, reason 8) and `refusal_ok`; any other failure exits.
  bool connect(rdma_cm_id* id, const void* priv, size_t len, void* rep,
               size_t rep_len, bool refusal_ok = false) {
    rdma_conn_param p = conn_param(priv, len);
    if (rdma_connect(id, &p)) die(kSetup, "rdma_connect: %s", strerror(errno));
    rdma_cm_event* ev = wait_for(RDMA_CM_EVENT_ESTABLISHED, timeout_ms_, true);
    if (ev->event == RDMA_CM_EVENT_REJECTED && ev->status == 8) {
      if (!refusal_ok)
        die(kSetup, "RDMA CM: nobody listens on %s port %u (REJECTED 8)",
            o_.host.c_str(), o_.tcp_port);
      rdma_ack_cm_event(ev);
      return false;
    }
    if (ev->event != RDMA_CM_EVENT_ESTABLISHED) fail(ev);
    copy_private(ev, rep, rep_len);
    rdma_ack_cm_event(ev);
    connected_.push_back(id);
    return true;
  }

  // An RC QP on `id`, on d's PD and the given CQs (rdma_create_qp).
  ibv_qp* create_qp(rdma_cm_id* id, Device& d, ibv_cq* send_cq, ibv_cq* recv_cq,
                    uint32_t send_wr, uint32_t recv_wr) {
    if (id->verbs != d.ctx)
      die(kSetup, "RDMA CM ids of one program on two devices");
    ibv_qp_init_attr a{};
    a.send_cq = send_cq;
    a.recv_cq = recv_cq;
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = send_wr;
    a.cap.max_recv_wr = recv_wr;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    if (rdma_create_qp(id, d.pd, &a))
      die(kSetup, "rdma_create_qp(send %u, recv %u): %s", send_wr, recv_wr,
          strerror(errno));
    return id->qp;
  }

  int fd() const { return ch_->fd; }
  bool was_closed() const { return closed_; }

  // True once a connection was closed (the peer is done or gone: its
  // DREQ, also sent for it by its service when it dies). Never blocks.
  bool closed() {
    pollfd p{ch_->fd, POLLIN, 0};
    while (!closed_ && poll(&p, 1, 0) > 0) {
      rdma_cm_event* ev = nullptr;
      if (rdma_get_cm_event(ch_, &ev)) break;
      if (ev->event == RDMA_CM_EVENT_ESTABLISHED)  // an accepted one's
        ++established_;
      else if (ev->event != RDMA_CM_EVENT_TIMEWAIT_EXIT)
        closed_ = true;
      rdma_ack_cm_event(ev);
    }
    return closed_;
  }

  // The device of a resolved or requested id (-d does not apply).
  static Device device(rdma_cm_id* id, int gid_index) {
    Device d;
    d.ctx = id->verbs;
    d.port_num = id->port_num;
    d.name = ibv_get_device_name(id->verbs->device);
    init_device(d, gid_index);
    return d;
  }

 private:
  rdma_cm_id* new_id() {
    rdma_cm_id* id = nullptr;
    if (rdma_create_id(ch_, &id, nullptr, RDMA_PS_TCP))
      die(kSetup, "rdma_create_id: %s", strerror(errno));
    return id;
  }

  sockaddr_storage address(const std::string& host) const {
    addrinfo hints{};
    hints.ai_family = AF_INET;  // urnic's RDMA CM: IPv4
    addrinfo* res = nullptr;
    if (const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res))
      die(kSetup, "%s: %s", host.c_str(), gai_strerror(rc));
    sockaddr_storage sa{};
    memcpy(&sa, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    reinterpret_cast<sockaddr_in*>(&sa)->sin_port = htons(o_.tcp_port);
    return sa;
  }

  static rdma_conn_param conn_param(const void* priv, size_t len) {
    rdma_conn_param p{};
    p.private_data = priv;
    p.private_data_len = uint8_t(len);
    p.responder_resources = p.initiator_depth = 1;
    p.retry_count = 7;
    p.rnr_retry_count = 7;  // as connect_qp: retry RNR forever
    return p;
  }

  static void copy_private(rdma_cm_event* ev, void* to, size_t len) {
    if (ev->param.conn.private_data_len < len)
      die(kSetup, "%s with %u bytes of private data, want %zu",
          rdma_event_str(ev->event), ev->param.conn.private_data_len, len);
    if (len) memcpy(to, ev->param.conn.private_data, len);
  }

  [[noreturn]] static void fail(rdma_cm_event* ev) {
    die(ev->event == RDMA_CM_EVENT_DISCONNECTED ? kPeerLost : kSetup,
        "RDMA CM: %s (status %d)", rdma_event_str(ev->event), ev->status);
  }

  // The next event, which must be `want` (or, with any_ok, anything the
  // caller looks at); exits on another one or after timeout_ms (-1: none).
  rdma_cm_event* wait_for(rdma_cm_event_type want, int timeout_ms,
                          bool any_ok = false) {
    pollfd p{ch_->fd, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0)
      die(kSetup, "RDMA CM: no %s within %d ms", rdma_event_str(want),
          timeout_ms);
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(ch_, &ev))
      die(kSetup, "rdma_get_cm_event: %s", strerror(errno));
    if (ev->event == want || any_ok) return ev;
    if (ev->event == RDMA_CM_EVENT_ESTABLISHED) {  // an accepted one's
      rdma_ack_cm_event(ev);
      ++established_;
      return wait_for(want, timeout_ms, any_ok);
    }
    fail(ev);
  }

  const Common& o_;
  const int timeout_ms_;
  rdma_event_channel* ch_ = nullptr;
  rdma_cm_id* listen_ = nullptr;
  std::vector<rdma_cm_id*> connected_;
  size_t established_ = 0;
  bool closed_ = false;
};

// The control channel over RDMA CM: the bytes of send_all travel in
// SENDs of at most kMsg bytes on an RC QP of its own (RNR retried
// forever: no credits needed), received into kDepth buffers that are
// reposted once read. EOF is a closed connection (Cm::closed) or a
// failed completion. An empty receive CQ is armed and waited for with
// poll(2) on its completion channel and the CM's event channel at once,
// so a quiet channel costs what TCP's does: one poll(2) per readable(),
// and no empty ibv_poll_cq (which may yield the CPU: URNIC_POLL_YIELD).
class CmChannel final : public Channel {
 public:
  // Client: the control connection to the server, whose first id (address
  // resolved, device d opened on it) is `id`: retried for 5 s while
  // nobody listens, as the TCP side channel does while the server starts.
  static std::unique_ptr<CmChannel> connect(Cm& cm, Device& d, rdma_cm_id* id,
                                            const void* priv, size_t len,
                                            void* rep, size_t rep_len) {
    auto ch = std::make_unique<CmChannel>(cm, d, id);
    for (int attempt = 1;
         !cm.connect(id, priv, len, rep, rep_len, attempt < 50); ++attempt) {
      ch->detach(id);
      usleep(100'000);
      id = cm.resolve();
      ch->attach(id);
    }
    return ch;
  }

  // Server: on a requested id (accepted by the caller); client: see above.
  CmChannel(Cm& cm, Device& d, rdma_cm_id* id) : cm_(cm), d_(d) {
    cc_ = ibv_create_comp_channel(d.ctx);
    if (!cc_) die(kSetup, "ibv_create_comp_channel: %s", strerror(errno));
    rcq_ = ibv_create_cq(d.ctx, kDepth, nullptr, cc_, 0);
    if (!rcq_) die(kSetup, "ibv_create_cq: %s", strerror(errno));
    scq_ = make_cq(d, kDepth);
    buf_ = make_buffer(d, 2 * kDepth * kMsg, IBV_ACCESS_LOCAL_WRITE);
    attach(id);
  }

  void send_all(const void* p, size_t n) override {
    const auto* b = static_cast<const uint8_t*>(p);
    while (n) {
      while (sent_ - acked_ == kDepth) {  // every SEND is signaled
        ibv_wc wc[kDepth];
        const int k = ibv_poll_cq(scq_, int(kDepth), wc);
        for (int i = 0; i < k; ++i)
          if (wc[i].status != IBV_WC_SUCCESS)
            lost(ibv_wc_status_str(wc[i].status));
        if (k > 0) acked_ += uint32_t(k);
        if (cm_.closed()) lost("closed");
      }
      const uint32_t k = uint32_t(std::min<size_t>(n, kMsg));
      uint8_t* m = buf_.p + size_t(kDepth + sent_ % kDepth) * kMsg;
      memcpy(m, b, k);
      ibv_sge sge{reinterpret_cast<uintptr_t>(m), k, buf_.mr->lkey};
      ibv_send_wr wr{};
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = IBV_WR_SEND;
      wr.send_flags = IBV_SEND_SIGNALED;
      ibv_send_wr* bad = nullptr;
      if (const int rc = ibv_post_send(qp_, &wr, &bad))
        die(kSetup, "control channel: ibv_post_send: %s", strerror(rc));
      ++sent_;
      b += k;
      n -= k;
    }
  }

  void recv_all(void* p, size_t n) override {
    auto* b = static_cast<uint8_t*>(p);
    while (n) {
      while (!next()) {
        if (eof_ || cm_.closed()) {
          armed_ = false;  // what arrived before the end is read first
          if (!next()) lost("closed");
        } else {
          readable(1000);
        }
      }
      const size_t k = std::min<size_t>(n, len_ - off_);
      memcpy(b, buf_.p + size_t(cur_) * kMsg + off_, k);
      off_ += uint32_t(k);
      b += k;
      n -= k;
      if (off_ == len_) repost(cur_);
    }
  }

  bool readable(int timeout_ms) override {
    const uint64_t end = now_ns() + uint64_t(timeout_ms) * 1'000'000;
    for (;;) {
      if (next() || eof_ || cm_.was_closed()) return true;
      pollfd p[2] = {{cc_->fd, POLLIN, 0}, {cm_.fd(), POLLIN, 0}};
      const uint64_t now = now_ns();
      const int ms = now < end ? int((end - now + 999'999) / 1'000'000) : 0;
      if (poll(p, 2, ms) <= 0) return false;
      if (p[0].revents) {  // a completion event: the CQ is no longer armed
        ibv_cq* cq = nullptr;
        void* ctx = nullptr;
        if (ibv_get_cq_event(cc_, &cq, &ctx) == 0) ibv_ack_cq_events(cq, 1);
        armed_ = false;
      }
      if (p[1].revents) cm_.closed();
    }
  }

  void wait_close(int ms) override {
    for (uint64_t end = now_ns() + uint64_t(ms) * 1'000'000;
         !cm_.closed() && now_ns() < end;) {
      pollfd p{cm_.fd(), POLLIN, 0};
      poll(&p, 1, 10);
    }
  }

 private:
  static constexpr uint32_t kDepth = 64;  // SENDs in flight, receives
  static constexpr uint32_t kMsg = 1024;  // bytes per SEND
  static constexpr uint32_t kBatch = 16;  // completions per poll

  // A QP on `id` with every receive posted.
  void attach(rdma_cm_id* id) {
    qp_ = cm_.create_qp(id, d_, scq_, rcq_, kDepth, kDepth);
    for (uint32_t i = 0; i < kDepth; ++i) repost(i);
  }

  // After a refusal: the id and its QP go, with the QP's flushed receives.
  void detach(rdma_cm_id* id) {
    rdma_destroy_qp(id);
    rdma_destroy_id(id);
    for (ibv_wc wc; ibv_poll_cq(rcq_, 1, &wc) > 0;) {
    }
    iwc_ = nwc_ = 0;
    arming_ = armed_ = false;
  }

  void repost(uint32_t i) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf_.p + size_t(i) * kMsg), kMsg,
                buf_.mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    if (const int rc = ibv_post_recv(qp_, &wr, &bad))
      die(kSetup, "control channel: ibv_post_recv: %s", strerror(rc));
    off_ = len_ = 0;
  }

  // True when a received message has bytes left to read (cur_, off_).
  // Completions are polled in batches unless the CQ is armed. A batch that
  // drains it arms it, and the next poll that finds it empty leaves it
  // armed, to be waited for (a completion before the arm raises no event:
  // the CQ is looked at once after arming). So an isolated message costs
  // one empty poll.
  bool next() {
    while (off_ == len_ && !eof_) {
      if (iwc_ == nwc_) {
        if (armed_) return false;
        const int k = ibv_poll_cq(rcq_, kBatch, wc_);
        if (k < 0) die(kSetup, "control channel: ibv_poll_cq failed");
        if (k == 0 && arming_) {
          armed_ = true;
          arming_ = false;
          return false;
        }
        if (k < int(kBatch) && !arming_) {
          if (ibv_req_notify_cq(rcq_, 0))
            die(kSetup, "control channel: ibv_req_notify_cq failed");
          arming_ = true;
        }
        iwc_ = 0;
        nwc_ = uint32_t(k);
        continue;
      }
      const ibv_wc& wc = wc_[iwc_++];
      if (wc.qp_num != qp_->qp_num) continue;  // a refused attempt's flush
      if (wc.status != IBV_WC_SUCCESS) {
        eof_ = true;  // flushed: the connection is gone
        break;
      }
      cur_ = uint32_t(wc.wr_id);
      off_ = 0;
      len_ = wc.byte_len;
      if (!len_) repost(cur_);
    }
    return off_ < len_;
  }

  [[noreturn]] static void lost(const char* why) {
    die(kPeerLost, "peer lost: control connection: %s", why);
  }

  Cm& cm_;
  Device& d_;
  ibv_comp_channel* cc_ = nullptr;
  ibv_cq* rcq_ = nullptr;
  ibv_cq* scq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  Buffer buf_;  // kDepth receive buffers, then kDepth send buffers
  uint32_t sent_ = 0, acked_ = 0;
  uint32_t cur_ = 0, off_ = 0, len_ = 0;  // the message being read
  ibv_wc wc_[kBatch];  // polled, wc_[iwc_, nwc_) not yet looked at
  uint32_t iwc_ = 0, nwc_ = 0;
  bool arming_ = false;  // the receive CQ was armed since it was drained
  bool armed_ = false;   // and then found empty: wait for its event
  bool eof_ = false;
};

}  // namespace seeds
