// Test and benchmark support for libibverbs programs (verbs_misuse,
// verbs_extended, payload_reuse, urnic-perf): the RESET -> INIT -> RTR ->
// RTS bring-up of an RC, UC or UD QP with the three ibv_modify_qp calls and
// attribute masks every such program writes (IBTA 11.2.4.2 / the ibv_modify_qp
// man page: the attributes each transition requires). Plain libibverbs, nothing
// of urnic: the programs stay unmodified verbs clients. Header-only.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

namespace urnic::test {

// Where an RC QP sends and what it allows. Defaults are perftest's.
struct RcPath {
  uint32_t dest_qpn = 0;
  ibv_gid dgid{};
  uint8_t sgid_index = 0;
  uint8_t port = 1;
  ibv_mtu mtu = IBV_MTU_1024;
  uint32_t rq_psn = 0, sq_psn = 0;
  uint8_t rd_atomic = 1;  // max_rd_atomic and max_dest_rd_atomic
  uint8_t min_rnr_timer = 12;
  uint8_t timeout = 14, retry_cnt = 7, rnr_retry = 7;
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
               IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
};

// Each returns 0 or ibv_modify_qp's error (an errno value).
inline int rc_to_init(ibv_qp* qp, const RcPath& p) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = p.port;
  a.qp_access_flags = static_cast<unsigned>(p.access);
  return ibv_modify_qp(
      qp, &a,
      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

inline int rc_to_rtr(ibv_qp* qp, const RcPath& p) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = p.mtu;
  a.dest_qp_num = p.dest_qpn;
  a.rq_psn = p.rq_psn;
  a.max_dest_rd_atomic = p.rd_atomic;
  a.min_rnr_timer = p.min_rnr_timer;
  a.ah_attr.is_global = 1;  // RoCE: every path is a GRH path
  a.ah_attr.grh.dgid = p.dgid;
  a.ah_attr.grh.sgid_index = p.sgid_index;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = p.port;
  return ibv_modify_qp(qp, &a,
                       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                           IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                           IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

inline int rc_to_rts(ibv_qp* qp, const RcPath& p) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = p.sq_psn;
  a.max_rd_atomic = p.rd_atomic;
  a.timeout = p.timeout;
  a.retry_cnt = p.retry_cnt;
  a.rnr_retry = p.rnr_retry;
  return ibv_modify_qp(qp, &a,
                       IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC |
                           IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                           IBV_QP_RNR_RETRY);
}

// All three; on failure *step (if given) names the state that was refused.
inline int rc_connect(ibv_qp* qp, const RcPath& p,
                      const char** step = nullptr) {
  const char* s = "INIT";
  int rc = rc_to_init(qp, p);
  if (!rc) s = "RTR", rc = rc_to_rtr(qp, p);
  if (!rc) s = "RTS", rc = rc_to_rts(qp, p);
  if (step) *step = s;
  return rc;
}

// UD: INIT (P_Key index 0, `port`, `qkey`), RTR, RTS; no path (each
// send names its AH).
inline int ud_connect(ibv_qp* qp, uint32_t qkey, uint8_t port = 1,
                      const char** step = nullptr) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = port;
  a.qkey = qkey;
  const char* s = "INIT";
  int rc = ibv_modify_qp(
      qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
  if (!rc) {
    s = "RTR";
    a = {};
    a.qp_state = IBV_QPS_RTR;
    rc = ibv_modify_qp(qp, &a, IBV_QP_STATE);
  }
  if (!rc) {
    s = "RTS";
    a = {};
    a.qp_state = IBV_QPS_RTS;
    rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
  }
  if (step) *step = s;
  return rc;
}

// UC: the RC transitions without the attributes only RC has (responder
// resources, RNR, timeout and retries: ibv_modify_qp(3) refuses them).
inline int uc_connect(ibv_qp* qp, const RcPath& p,
                      const char** step = nullptr) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = p.port;
  a.qp_access_flags = static_cast<unsigned>(
      p.access & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
  const char* s = "INIT";
  int rc = ibv_modify_qp(
      qp, &a,
      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  if (!rc) {
    s = "RTR";
    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = p.mtu;
    a.dest_qp_num = p.dest_qpn;
    a.rq_psn = p.rq_psn;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = p.dgid;
    a.ah_attr.grh.sgid_index = p.sgid_index;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = p.port;
    rc = ibv_modify_qp(qp, &a,
                       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                           IBV_QP_DEST_QPN | IBV_QP_RQ_PSN);
  }
  if (!rc) {
    s = "RTS";
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = p.sq_psn;
    rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
  }
  if (step) *step = s;
  return rc;
}

}  // namespace urnic::test
