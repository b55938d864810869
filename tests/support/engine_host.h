// Test and benchmark support for programs that drive transport engines
// directly (no service, no shim): a host (device, engine, PD, CQ, one MR)
// and the RESET -> RTS bring-up of an RC QP, the way an application's
// three modify_qp calls would do it. Header-only.
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
