// Test and benchmark support for programs that drive transport engines
// directly (no service, no shim): a host (device, engine, PD, CQ, one MR)
// and the RESET -> RTS bring-up of a QP, the way an application's three
// modify_qp calls would do it (the unit tests, bench_transport, converge).
// Header-only.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "dataplane/transport/engine.h"
#include "dataplane/wire/codec.h"

namespace urnic::test {

// Every GID resolves to one MAC: the peer's, on a two-host wire.
class FixedMacResolver : public transport::Resolver {
 public:
  wire::MacAddr mac{};
  int resolve(const uint8_t*, wire::MacAddr* out) override {
    *out = mac;
    return 0;
  }
};

// Host `id` (1..254): MAC 02:00:00:00:00:id, GID ::ffff:10.0.0.id, every
// packet addressed to host `peer`'s MAC; a PD, a CQ and one MR with every
// access over `mem`.
struct EngineHost {
  transport::DeviceConfig dc;
  FixedMacResolver res;
  std::unique_ptr<transport::Device> dev;
  std::unique_ptr<transport::Engine> eng;
  transport::Pd* pd = nullptr;
  transport::Cq* cq = nullptr;
  transport::Mr* mr = nullptr;
  std::vector<uint8_t> mem;

  static void gid(uint8_t id, uint8_t out[16]) {
    wire::gid_from_ipv4(0x0a000000u | id, out);
  }
  // 0, or the errno of the first step that failed.
  int init(uint8_t id, uint8_t peer, size_t bytes, transport::PacketIo& io,
           const transport::EngineConfig& ec = {}) {
    mem.assign(bytes, id);
    dc.mac = {{2, 0, 0, 0, 0, id}};
    gid(id, dc.gids[0]);
    dc.num_gids = 1;
    dc.key_seed = id;
    res.mac = {{2, 0, 0, 0, 0, peer}};
    dev = std::make_unique<transport::Device>(dc, &res);
    eng = std::make_unique<transport::Engine>(*dev, io, ec);
    if (int rc = dev->alloc_pd(&pd)) return rc;
    if (int rc = dev->create_cq(65536, &cq)) return rc;
    return dev->reg_mr(pd, mem.data(), mem.size(),
                       reinterpret_cast<uint64_t>(mem.data()),
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                           IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC,
                       &mr);
  }
};

// What a RESET -> INIT -> RTR -> RTS bring-up sets (RC, UC or UD).
struct QpPath {
  ibv_qp_type type = IBV_QPT_RC;
  uint32_t peer_qpn = 0;      // RC, UC
  uint8_t peer_gid[16] = {};  // RC, UC
  uint8_t hop_limit = 64;
  uint32_t sq_psn = 100;  // ours; the peer's rq_psn must match
  uint32_t rq_psn = 100;  // the peer's sq_psn
  ibv_mtu mtu = IBV_MTU_4096;
  unsigned access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                    IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_LOCAL_WRITE;
  uint32_t qkey = 0x11111111;  // UD
  uint8_t timeout = 14;        // RC: 67 ms, perftest's
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;
  uint8_t min_rnr_timer = 1;
  uint8_t max_rd_atomic = 16;       // RC, initiator
  uint8_t max_dest_rd_atomic = 16;  // RC, responder
  ibv_qp_state until = IBV_QPS_RTS;
};

// The three modify_qp calls an application makes (or fewer: p.until), each
// with the attribute mask ib_modify_qp_is_ok asks of the QP's type. 0, or
// the errno of the first that failed.
inline int bring_up(transport::Engine& e, transport::Qp* qp, const QpPath& p) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = 1;
  int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
  if (p.type == IBV_QPT_UD) {
    a.qkey = p.qkey;
    mask |= IBV_QP_QKEY;
  } else {
    a.qp_access_flags = p.access;
    mask |= IBV_QP_ACCESS_FLAGS;
  }
  if (int rc = e.modify_qp(qp, a, mask)) return rc;
  if (p.until == IBV_QPS_INIT) return 0;

  a = {};
  a.qp_state = IBV_QPS_RTR;
  mask = IBV_QP_STATE;
  if (p.type != IBV_QPT_UD) {
    a.path_mtu = p.mtu;
    a.dest_qp_num = p.peer_qpn;
    a.rq_psn = p.rq_psn;
    a.ah_attr.is_global = 1;
    a.ah_attr.port_num = 1;
    std::memcpy(a.ah_attr.grh.dgid.raw, p.peer_gid, 16);
    a.ah_attr.grh.sgid_index = 0;
    a.ah_attr.grh.hop_limit = p.hop_limit;
    mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    if (p.type == IBV_QPT_RC) {
      a.max_dest_rd_atomic = p.max_dest_rd_atomic;
      a.min_rnr_timer = p.min_rnr_timer;
      mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    }
  }
  if (int rc = e.modify_qp(qp, a, mask)) return rc;
  if (p.until == IBV_QPS_RTR) return 0;

  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = p.sq_psn;
  mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
  if (p.type == IBV_QPT_RC) {
    a.timeout = p.timeout;
    a.retry_cnt = p.retry_cnt;
    a.rnr_retry = p.rnr_retry;
    a.max_rd_atomic = p.max_rd_atomic;
    mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
            IBV_QP_MAX_QP_RD_ATOMIC;
  }
  return e.modify_qp(qp, a, mask);
}

}  // namespace urnic::test
