// Types shared by the transport engine and its users: device limits, work
// requests as the engine stores them, and the verbs enums (from rdma-core's
// <infiniband/verbs.h>, so values the shim passes through need no
// translation: ibv_wc_status, ibv_wr_opcode, ibv_qp_state, attribute masks).
#pragma once

#include <infiniband/verbs.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string_view>

#include "dataplane/hostif/verbs.h"

namespace urnic::transport {

// Shared with the verbs shim (dataplane/hostif/verbs.h).
using hostif::is_atomic;
using hostif::is_local_op;
using hostif::is_rd_atomic;
using hostif::kMaxInline;
using hostif::kMaxSge;
using hostif::needs_response;
using hostif::valid_opcode;

// Device limits (config `limits:`). Reported by query_device as they are.
struct Limits {
  uint32_t max_qp = 16384;
  uint32_t max_qp_wr = 4096;  // per send / receive queue
  uint32_t max_sge = kMaxSge;
  uint32_t max_inline = kMaxInline;
  uint32_t max_cq = 16384;
  uint32_t max_cqe = 4194303;  // as config::LimitsConfig
  uint32_t max_mr = 65536;
  uint64_t max_mr_size = uint64_t{1} << 40;
  uint32_t max_pd = 16384;
  uint32_t max_srq = 4096;
  uint32_t max_srq_wr = 16384;
  uint32_t max_ah = 65536;
  uint32_t max_msg_sz = uint32_t{1} << 31;  // 2 GiB
  uint8_t max_rd_atomic = 16;       // outstanding reads/atomics we initiate
  uint8_t max_dest_rd_atomic = 16;  // responder resources per QP
  uint8_t gid_table_len = 3;        // valid sgid_index values: [0, len)
  // The largest path MTU the port's MTU carries (an ibv_mtu): the port's
  // max_mtu, as rxe reports its netdev's.
  uint8_t max_path_mtu = IBV_MTU_4096;
  // Multicast (ibv_attach_mcast), for the device: groups with a member,
  // members of one group, and attachments in all. Not configured: rxe's
  // order of magnitude, sized for a table searched per multicast packet.
  uint32_t max_mcast_grp = 1024;
  uint32_t max_mcast_qp_attach = 56;
  uint32_t max_total_mcast_qp_attach = 8192;
};

// A GID as a value (a multicast group's key).
using Gid = std::array<uint8_t, 16>;
inline Gid to_gid(const uint8_t g[16]) {
  Gid r;
  std::memcpy(r.data(), g, 16);
  return r;
}
struct GidHash {
  size_t operator()(const Gid& g) const {
    return std::hash<std::string_view>{}(
        {reinterpret_cast<const char*>(g.data()), g.size()});
  }
};

// Path MTU in bytes from the verbs enum (IBV_MTU_256 = 1 ... 4096 = 5).
constexpr uint32_t mtu_bytes(ibv_mtu m) {
  return 128u << static_cast<uint32_t>(m);
}
static_assert(mtu_bytes(IBV_MTU_256) == 256 && mtu_bytes(IBV_MTU_4096) == 4096);

// Packets (PSNs) a message of `len` bytes takes at path MTU `mtu` (a
// zero-length message still takes one).
constexpr uint32_t pkts_for(uint32_t len, uint32_t mtu) {
  return len ? (len - 1) / mtu + 1 : 1;
}
static_assert(pkts_for(0, 1024) == 1 && pkts_for(1024, 1024) == 1 &&
              pkts_for(1025, 1024) == 2 &&
              pkts_for(0x80000000u, 256) == 1u << 23);

// Trivial (no initialisers), so that an array of them on the WQE intake
// path costs nothing until filled; SendWr and RecvWr zero theirs.
struct Sge {
  uint64_t addr;
  uint32_t length;
  uint32_t lkey;
};

class Ah;

// IBV_WR_BIND_MW: which window (by its current rkey), the rkey it gets,
// and the range of which MR (by lkey) with which rights. length 0 unbinds
// a type 1 window.
struct MwBind {
  uint32_t mw_rkey = 0;
  uint32_t new_rkey = 0;
  uint32_t mr_lkey = 0;
  uint32_t access = 0;  // IBV_ACCESS_REMOTE_* (and ZERO_BASED: refused)
  uint64_t addr = 0;
  uint64_t length = 0;
};

// A send work request as posted (a copy of ibv_send_wr without pointers),
// in two parts: everything but the SGEs (what a QP's send queue keeps per
// WQE: its SGEs go to an array sized by the QP's max_send_sge), then the
// SGEs. With IBV_SEND_INLINE the sg_list addresses are read once, at post
// time.
struct SendWrHead {
  uint64_t wr_id = 0;
  ibv_wr_opcode opcode = IBV_WR_SEND;
  uint32_t send_flags = 0;  // IBV_SEND_SIGNALED | FENCE | SOLICITED | INLINE
  uint32_t num_sge = 0;
  MwBind bind;  // IBV_WR_BIND_MW
  // Network byte order, as in ibv_send_wr; for LOCAL_INV and SEND_WITH_INV
  // the rkey to invalidate (host order: ibv_send_wr's invalidate_rkey).
  uint32_t imm_data = 0;
  // RDMA (remote_addr, rkey) and atomics (remote_addr, rkey, compare_add,
  // swap); ATOMIC_WRITE: the 8 bytes to write, as they lie in memory, in
  // compare_add (it carries no SGE).
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint64_t compare_add = 0;
  uint64_t swap = 0;
  // UD: read at post only (the WQE keeps a copy of its address).
  const Ah* ah = nullptr;
  uint32_t remote_qpn = 0;
  uint32_t remote_qkey = 0;
};

struct SendWr : SendWrHead {
  Sge sg_list[kMaxSge]{};
};

struct RecvWr {
  uint64_t wr_id = 0;
  uint32_t num_sge = 0;
  Sge sg_list[kMaxSge]{};
};

// The 40-byte GRH a UD receive buffer starts with (IBTA 11.4.1.2; for
// RoCEv2 over IPv4 the IPv4 header sits in its last 20 bytes).
constexpr uint32_t kGrhSize = 40;

}  // namespace urnic::transport
