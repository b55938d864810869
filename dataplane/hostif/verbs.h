// Verbs rules the device and its driver (the verbs shim) share: the
// limits of a WR and which send opcodes a QP type takes. Part of the
// host interface (dataplane/hostif): includes nothing of urnic, so the
// shim, the transport engine and the service can all include it.
#pragma once

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdint>

namespace urnic::hostif {

constexpr uint32_t kMaxSge = 16;      // per WR, send and receive
constexpr uint32_t kMaxInline = 256;  // bytes of inline send data

constexpr bool is_atomic(ibv_wr_opcode op) {
  return op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD;
}
// READ, atomics and ATOMIC WRITE hold a max_rd_atomic credit (the
// responder keeps a resource for each, IBTA 9.7.5.1.4 / A19.4).
constexpr bool is_rd_atomic(ibv_wr_opcode op) {
  return op == IBV_WR_RDMA_READ || is_atomic(op) || op == IBV_WR_ATOMIC_WRITE;
}
// READ and atomics complete with their response (data, original value); an
// ACK alone cannot complete them. ATOMIC WRITE completes with an ACK.
constexpr bool needs_response(ibv_wr_opcode op) {
  return op == IBV_WR_RDMA_READ || is_atomic(op);
}

// Which send opcodes a QP type takes (IBTA 9.2; verbs: UD sends only, UC
// no READ or atomics). Also the verbs shim's post-time check.
constexpr bool valid_opcode(ibv_qp_type t, ibv_wr_opcode op) {
  switch (op) {
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM:
      return true;
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      return t != IBV_QPT_UD;
    case IBV_WR_RDMA_READ:
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
    case IBV_WR_ATOMIC_WRITE:
    case IBV_WR_SEND_WITH_INV:
      return t == IBV_QPT_RC;
    case IBV_WR_LOCAL_INV:
    case IBV_WR_BIND_MW:
      return t == IBV_QPT_RC || t == IBV_QPT_UC;
    default:
      return false;  // TSO, FLUSH, ...
  }
}

// Operations the requester executes itself, sending nothing: memory window
// bind and local invalidate (IBTA 10.6.7, 10.6.6.5).
constexpr bool is_local_op(ibv_wr_opcode op) {
  return op == IBV_WR_BIND_MW || op == IBV_WR_LOCAL_INV;
}

// The access flags an MR may have (the optional range is dropped before).
// IBV_ACCESS_HUGETLB is a hint the kernel takes from any device; urnic
// ignores it.
constexpr uint32_t kMrAccessKnown =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
    IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND | IBV_ACCESS_HUGETLB;
// IBV_ACCESS_FLUSH_GLOBAL/PERSISTENT: bits 8 and 9 as the kernel numbers
// them, not in rdma-core 44's verbs.h.
constexpr uint32_t kAccessFlushRights = 3u << 8;
// Features urnic does not have: on-demand paging and the FLUSH placement
// rights.
constexpr uint32_t kMrAccessUnsupported =
    IBV_ACCESS_ON_DEMAND | kAccessFlushRights;

// Whether an MR's access flags are ones verbs take, as the kernel's
// ib_check_mr_access: remote write or atomic only with local write, and no
// unknown flag (EINVAL); a known feature the device lacks is EOPNOTSUPP
// (ibv_reg_mr(3)). The shim checks before it touches any page, the device
// again.
constexpr int mr_access_error(uint32_t access) {
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
      !(access & IBV_ACCESS_LOCAL_WRITE))
    return EINVAL;
  if (access & ~(kMrAccessKnown | kMrAccessUnsupported)) return EINVAL;
  if (access & kMrAccessUnsupported) return EOPNOTSUPP;
  return 0;
}

// An application's iova sits where its address sits within a page (the
// kernel's ib_uverbs_reg_mr refuses start and hca_va with different page
// offsets; so do rxe and mlx5 under it).
constexpr bool mr_iova_valid(uint64_t addr, uint64_t iova) {
  return (addr & 4095) == (iova & 4095);
}

// The port's active_width and active_speed (ibv_port_attr's encodings) for
// an Ethernet link of `mbps`, as Linux reports them for a RoCE port whose
// driver gives no lane count (ib_get_eth_speed); an unknown speed (0) is
// taken as 1 Gb/s, as there. UCX estimates a device's bandwidth from them.
struct IbLinkRate {
  uint8_t width;  // 1: 1X, 16: 2X, 2: 4X
  uint8_t speed;  // 1: SDR, 2: DDR, 8: FDR10, 32: EDR, 64: HDR, 128: NDR
};
constexpr IbLinkRate ib_link_rate(uint32_t mbps) {
  if (mbps <= 1000) return {1, 1};     // 1X SDR
  if (mbps <= 10000) return {1, 8};    // 1X FDR10
  if (mbps <= 20000) return {2, 2};    // 4X DDR
  if (mbps <= 25000) return {1, 32};   // 1X EDR
  if (mbps <= 40000) return {2, 8};    // 4X FDR10
  if (mbps <= 50000) return {16, 32};  // 2X EDR
  if (mbps <= 100000) return {2, 32};  // 4X EDR
  if (mbps <= 200000) return {2, 64};  // 4X HDR
  return {2, 128};                     // 4X NDR
}

}  // namespace urnic::hostif
