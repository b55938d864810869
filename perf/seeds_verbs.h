// Plain libibverbs set-up for the seed programs: open a device, make
// buffers, CQs and RC/UC QPs, move a QP to RTS with the peer's end (RoCE:
// GRH with the GID), and turn a failed work completion into an exit.
#pragma once

#include <infiniband/verbs.h>

#include <cerrno>
#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "perf/seeds_common.h"

namespace seeds {

struct Device {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_port_attr port{};
  ibv_device_attr attr{};
  ibv_gid gid{};
  int gid_index = 0;
  uint8_t port_num = 1;
  std::string name;
};

// Queries an open device (d.ctx, d.port_num) and allocates its PD.
inline void init_device(Device& d, int gid_index) {
  if (ibv_query_device(d.ctx, &d.attr))
    die(kSetup, "ibv_query_device: %s", strerror(errno));
  if (ibv_query_port(d.ctx, d.port_num, &d.port))
    die(kSetup, "ibv_query_port: %s", strerror(errno));
  if (d.port.state != IBV_PORT_ACTIVE)
    die(kSetup, "%s port %u is not active", d.name.c_str(), d.port_num);
  d.gid_index = gid_index;
  if (ibv_query_gid(d.ctx, d.port_num, gid_index, &d.gid))
    die(kSetup, "ibv_query_gid(%d): %s", gid_index, strerror(errno));
  d.pd = ibv_alloc_pd(d.ctx);
  if (!d.pd) die(kSetup, "ibv_alloc_pd: %s", strerror(errno));
}

inline Device open_device(const std::string& want, int gid_index) {
  Device d;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list || n == 0) die(kSetup, "no RDMA device found");
  ibv_device* dev = nullptr;
  for (int i = 0; i < n && !dev; ++i)
    if (want.empty() || want == ibv_get_device_name(list[i])) dev = list[i];
  if (!dev) die(kSetup, "device %s not found", want.c_str());
  d.name = ibv_get_device_name(dev);
  d.ctx = ibv_open_device(dev);
  ibv_free_device_list(list);
  if (!d.ctx)
    die(kSetup, "ibv_open_device(%s): %s", d.name.c_str(), strerror(errno));
  init_device(d, gid_index);
  return d;
}

// Page-aligned, zeroed, registered memory (never freed: lives as long as
// the program).
struct Buffer {
  uint8_t* p = nullptr;
  size_t len = 0;
  ibv_mr* mr = nullptr;
};
inline Buffer make_buffer(Device& d, size_t len, int access) {
  Buffer b;
  b.len = len;
  b.p =
      static_cast<uint8_t*>(aligned_alloc(4096, (len + 4095) & ~size_t{4095}));
  if (!b.p) die(kSetup, "out of memory for %zu bytes", len);
  memset(b.p, 0, len);
  b.mr = ibv_reg_mr(d.pd, b.p, len, access);
  if (!b.mr) die(kSetup, "ibv_reg_mr(%zu bytes): %s", len, strerror(errno));
  return b;
}

inline ibv_cq* make_cq(Device& d, uint32_t entries) {
  const int n = std::min<int>(int(entries), d.attr.max_cqe);
  ibv_cq* cq = ibv_create_cq(d.ctx, n, nullptr, nullptr, 0);
  if (!cq) die(kSetup, "ibv_create_cq(%d): %s", n, strerror(errno));
  return cq;
}

// What the peer needs to reach one QP (host byte order: both ends of a
// seed program are little-endian machines).
struct QpEnd {
  uint32_t qpn = 0;
  uint32_t psn = 0;
  uint8_t gid[16] = {};
  uint32_t mtu = 0;  // ibv_mtu of the port: the path MTU is the smaller
  uint32_t pad = 0;
};

inline uint32_t mtu_bytes(uint32_t mtu) {
  return 128u << mtu;
}  // IBV_MTU_*

// An RC or UC QP in INIT, remote write allowed; its end for the peer.
inline ibv_qp* make_qp(Device& d, ibv_qp_type type, ibv_cq* cq,
                       uint32_t send_wr, uint32_t recv_wr, QpEnd& end) {
  ibv_qp_init_attr a{};
  a.send_cq = a.recv_cq = cq;
  a.qp_type = type;
  a.cap.max_send_wr = send_wr;
  a.cap.max_recv_wr = recv_wr;
  a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  ibv_qp* qp = ibv_create_qp(d.pd, &a);
  if (!qp)
    die(kSetup, "ibv_create_qp(%s, send %u, recv %u): %s",
        type == IBV_QPT_UC ? "UC" : "RC", send_wr, recv_wr, strerror(errno));
  ibv_qp_attr m{};
  m.qp_state = IBV_QPS_INIT;
  m.port_num = d.port_num;
  m.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  if (ibv_modify_qp(
          qp, &m,
          IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    die(kSetup, "ibv_modify_qp(INIT): %s", strerror(errno));
  end.qpn = qp->qp_num;
  end.psn = std::random_device{}() & 0xffffff;
  memcpy(end.gid, d.gid.raw, 16);
  end.mtu = d.port.active_mtu;
  return qp;
}

// INIT -> RTR -> RTS towards `peer`. RC: retries 7, RNR retries forever
// (the receiver reposts), ~67 ms ACK timeout. UC has none of these.
inline void connect_qp(const Device& d, ibv_qp* qp, const QpEnd& self,
                       const QpEnd& peer) {
  const bool rc = qp->qp_type == IBV_QPT_RC;
  ibv_qp_attr m{};
  m.qp_state = IBV_QPS_RTR;
  m.path_mtu = static_cast<ibv_mtu>(std::min(self.mtu, peer.mtu));
  m.dest_qp_num = peer.qpn;
  m.rq_psn = peer.psn;
  m.max_dest_rd_atomic = 1;
  m.min_rnr_timer = 1;
  m.ah_attr.is_global = 1;
  memcpy(m.ah_attr.grh.dgid.raw, peer.gid, 16);
  m.ah_attr.grh.sgid_index = static_cast<uint8_t>(d.gid_index);
  m.ah_attr.grh.hop_limit = 64;
  m.ah_attr.port_num = d.port_num;
  int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
             IBV_QP_RQ_PSN;
  if (rc) mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  if (ibv_modify_qp(qp, &m, mask))
    die(kSetup, "ibv_modify_qp(RTR): %s", strerror(errno));
  m = {};
  m.qp_state = IBV_QPS_RTS;
  m.sq_psn = self.psn;
  m.timeout = 14;
  m.retry_cnt = 7;
  m.rnr_retry = 7;
  m.max_rd_atomic = 1;
  mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
  if (rc)
    mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
            IBV_QP_MAX_QP_RD_ATOMIC;
  if (ibv_modify_qp(qp, &m, mask))
    die(kSetup, "ibv_modify_qp(RTS): %s", strerror(errno));
}

// A failed completion ends the program with its status.
inline void check_wc(const ibv_wc& wc) {
  if (wc.status != IBV_WC_SUCCESS)
    die(kCompletion,
        "completion error: %s (status %d, opcode %d, wr_id %" PRIu64
        ", qp 0x%x, vendor_err 0x%x)",
        ibv_wc_status_str(wc.status), int(wc.status), int(wc.opcode),
        uint64_t(wc.wr_id), wc.qp_num, wc.vendor_err);
}

}  // namespace seeds
