// Test and benchmark support: brings an engine's RC QP from RESET to RTS
// against a peer, the way an application's three modify_qp calls would.
// Header-only; used by the benchmarks and simulations that drive engines
// directly (no service, no shim).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <cstring>

#include "dataplane/transport/engine.h"

namespace urnic::test {

struct RcPath {
  uint32_t peer_qpn = 0;
  uint8_t peer_gid[16] = {};
  uint32_t sq_psn = 100;  // ours; the peer's rq_psn must match
  uint32_t rq_psn = 100;  // the peer's sq_psn
  ibv_mtu mtu = IBV_MTU_4096;
  uint8_t timeout = 14;  // 67 ms, perftest's
  uint8_t rd_atomic = 16;
};

// 0, or the first modify_qp's error.
inline int connect_rc(transport::Engine& e, transport::Qp* qp,
                      const RcPath& p) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                      IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_LOCAL_WRITE;
  if (int rc = e.modify_qp(
          qp, a,
          IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    return rc;
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = p.mtu;
  a.dest_qp_num = p.peer_qpn;
  a.rq_psn = p.rq_psn;
  a.max_dest_rd_atomic = p.rd_atomic;
  a.min_rnr_timer = 1;
  a.ah_attr.is_global = 1;
  a.ah_attr.port_num = 1;
  std::memcpy(a.ah_attr.grh.dgid.raw, p.peer_gid, 16);
  if (int rc = e.modify_qp(
          qp, a,
          IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
              IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    return rc;
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = p.sq_psn;
  a.timeout = p.timeout;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = p.rd_atomic;
  return e.modify_qp(qp, a,
                     IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
                         IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                         IBV_QP_MAX_QP_RD_ATOMIC);
}

}  // namespace urnic::test
