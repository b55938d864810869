// ibv_modify_qp validator. Transitions and required/optional attribute masks:
// IBTA vol.1 11.2.4 (Modify QP, state transition attribute table), as Linux
// drivers/infiniband/core/verbs.c qp_state_table encodes it for RC, UC, UD.
#include "dataplane/transport/qp_attr.h"

#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "dataplane/hostif/verbs.h"
#include "dataplane/wire/codec.h"

namespace urnic::transport {
namespace {

constexpr int kNumStates = IBV_QPS_ERR + 1;

constexpr const char* kStateNames[kNumStates] = {"RESET", "INIT", "RTR", "RTS",
                                                 "SQD",   "SQE",  "ERR"};

// Compared as int: the value comes from the caller and may be anything.
constexpr bool valid_state(ibv_qp_state s) {
  const int v = static_cast<int>(s);
  return v >= IBV_QPS_RESET && v <= IBV_QPS_ERR;
}

// Column of the transition table for a QP type.
enum TypeIndex { kRc, kUc, kUd, kNumTypes };

constexpr int type_index(ibv_qp_type t) {
  switch (t) {
    case IBV_QPT_RC:
      return kRc;
    case IBV_QPT_UC:
      return kUc;
    case IBV_QPT_UD:
      return kUd;
    default:
      return -1;
  }
}

// Short names for the table rows below (the verbs enum values).
constexpr uint32_t kCurState = IBV_QP_CUR_STATE;
constexpr uint32_t kSqdNotify = IBV_QP_EN_SQD_ASYNC_NOTIFY;
constexpr uint32_t kAccess = IBV_QP_ACCESS_FLAGS;
constexpr uint32_t kPkey = IBV_QP_PKEY_INDEX;
constexpr uint32_t kPort = IBV_QP_PORT;
constexpr uint32_t kQkey = IBV_QP_QKEY;
constexpr uint32_t kAv = IBV_QP_AV;
constexpr uint32_t kPathMtu = IBV_QP_PATH_MTU;
constexpr uint32_t kTimeout = IBV_QP_TIMEOUT;
constexpr uint32_t kRetryCnt = IBV_QP_RETRY_CNT;
constexpr uint32_t kRnrRetry = IBV_QP_RNR_RETRY;
constexpr uint32_t kRqPsn = IBV_QP_RQ_PSN;
constexpr uint32_t kMaxRdAtomic = IBV_QP_MAX_QP_RD_ATOMIC;
constexpr uint32_t kAltPath = IBV_QP_ALT_PATH;
constexpr uint32_t kMinRnrTimer = IBV_QP_MIN_RNR_TIMER;
constexpr uint32_t kSqPsn = IBV_QP_SQ_PSN;
constexpr uint32_t kMaxDestRdAtomic = IBV_QP_MAX_DEST_RD_ATOMIC;
constexpr uint32_t kPathMig = IBV_QP_PATH_MIG_STATE;
constexpr uint32_t kDestQpn = IBV_QP_DEST_QPN;

// One row per allowed transition. IBV_QP_STATE is implied by every row with
// from != to and is never listed. A pair that has no row is not allowed
// (notably RESET->ERR: the spec table and Linux both leave it out, so a QP
// must reach INIT before it can be moved to ERR).
struct Transition {
  ibv_qp_state from;
  ibv_qp_state to;
  uint32_t req[kNumTypes];  // indexed by TypeIndex: RC, UC, UD
  uint32_t opt[kNumTypes];
};

constexpr Transition kTransitions[] = {
    // Any state -> RESET, and any state but RESET -> ERR: IBV_QP_STATE only.
    {IBV_QPS_RESET, IBV_QPS_RESET, {}, {}},
    {IBV_QPS_INIT, IBV_QPS_RESET, {}, {}},
    {IBV_QPS_RTR, IBV_QPS_RESET, {}, {}},
    {IBV_QPS_RTS, IBV_QPS_RESET, {}, {}},
    {IBV_QPS_SQD, IBV_QPS_RESET, {}, {}},
    {IBV_QPS_SQE, IBV_QPS_RESET, {}, {}},
    {IBV_QPS_ERR, IBV_QPS_RESET, {}, {}},
    {IBV_QPS_INIT, IBV_QPS_ERR, {}, {}},
    {IBV_QPS_RTR, IBV_QPS_ERR, {}, {}},
    {IBV_QPS_RTS, IBV_QPS_ERR, {}, {}},
    {IBV_QPS_SQD, IBV_QPS_ERR, {}, {}},
    {IBV_QPS_SQE, IBV_QPS_ERR, {}, {}},
    {IBV_QPS_ERR, IBV_QPS_ERR, {}, {}},

    // Bring-up. UD carries its Q_Key instead of access flags; only the
    // connected types learn a remote QP (AV, DEST_QPN, PSNs) at RTR.
    {IBV_QPS_RESET,
     IBV_QPS_INIT,
     {kPkey | kPort | kAccess, kPkey | kPort | kAccess, kPkey | kPort | kQkey},
     {}},
    {IBV_QPS_INIT,
     IBV_QPS_INIT,
     {},
     {kPkey | kPort | kAccess, kPkey | kPort | kAccess, kPkey | kPort | kQkey}},
    {IBV_QPS_INIT,
     IBV_QPS_RTR,
     {kAv | kPathMtu | kDestQpn | kRqPsn | kMaxDestRdAtomic | kMinRnrTimer,
      kAv | kPathMtu | kDestQpn | kRqPsn, 0},
     {kAltPath | kAccess | kPkey, kAltPath | kAccess | kPkey, kPkey | kQkey}},
    {IBV_QPS_RTR,
     IBV_QPS_RTS,
     {kTimeout | kRetryCnt | kRnrRetry | kSqPsn | kMaxRdAtomic, kSqPsn, kSqPsn},
     {kCurState | kAltPath | kAccess | kMinRnrTimer | kPathMig,
      kCurState | kAltPath | kAccess | kPathMig, kCurState | kQkey}},

    // Changes while running, SQ drain and recovery from SQ error.
    {IBV_QPS_RTS,
     IBV_QPS_RTS,
     {},
     {kCurState | kAccess | kAltPath | kPathMig | kMinRnrTimer,
      kCurState | kAccess | kAltPath | kPathMig, kCurState | kQkey}},
    {IBV_QPS_RTS, IBV_QPS_SQD, {}, {kSqdNotify, kSqdNotify, kSqdNotify}},
    {IBV_QPS_SQD,
     IBV_QPS_RTS,
     {},
     {kCurState | kAltPath | kAccess | kMinRnrTimer | kPathMig,
      kCurState | kAltPath | kAccess | kPathMig, kCurState | kQkey}},
    // SQD is where a connected QP may be re-pointed (AV, port, timers).
    {IBV_QPS_SQD,
     IBV_QPS_SQD,
     {},
     {kPort | kAv | kTimeout | kRetryCnt | kRnrRetry | kMaxRdAtomic |
          kMaxDestRdAtomic | kAltPath | kAccess | kPkey | kMinRnrTimer |
          kPathMig,
      kAv | kAltPath | kAccess | kPkey | kPathMig, kPkey | kQkey}},
    // SQE is entered only by UC and UD (an RC send error moves the QP to
    // ERR), so RC has no attributes here; the row is allowed for all types
    // as in the kernel table.
    {IBV_QPS_SQE, IBV_QPS_RTS, {}, {0, kCurState | kAccess, kCurState | kQkey}},
};

constexpr const Transition* find_transition(ibv_qp_state from,
                                            ibv_qp_state to) {
  for (const Transition& t : kTransitions) {
    if (t.from == from && t.to == to) return &t;
  }
  return nullptr;
}

// Names of the mask bits by bit position ("" for bits verbs.h leaves
// unused), for the messages below.
constexpr int kNumMaskBits = 26;
constexpr std::string_view kBitNames[kNumMaskBits] = {
    "IBV_QP_STATE",
    "IBV_QP_CUR_STATE",
    "IBV_QP_EN_SQD_ASYNC_NOTIFY",
    "IBV_QP_ACCESS_FLAGS",
    "IBV_QP_PKEY_INDEX",
    "IBV_QP_PORT",
    "IBV_QP_QKEY",
    "IBV_QP_AV",
    "IBV_QP_PATH_MTU",
    "IBV_QP_TIMEOUT",
    "IBV_QP_RETRY_CNT",
    "IBV_QP_RNR_RETRY",
    "IBV_QP_RQ_PSN",
    "IBV_QP_MAX_QP_RD_ATOMIC",
    "IBV_QP_ALT_PATH",
    "IBV_QP_MIN_RNR_TIMER",
    "IBV_QP_SQ_PSN",
    "IBV_QP_MAX_DEST_RD_ATOMIC",
    "IBV_QP_PATH_MIG_STATE",
    "IBV_QP_CAP",
    "IBV_QP_DEST_QPN",
    "",
    "",
    "",
    "",
    "IBV_QP_RATE_LIMIT",
};
static_assert(IBV_QP_DEST_QPN == 1 << 20 && IBV_QP_RATE_LIMIT == 1 << 25);

constexpr uint32_t known_bits() {
  uint32_t m = 0;
  for (int i = 0; i < kNumMaskBits; ++i) {
    if (!kBitNames[i].empty()) m |= uint32_t{1} << i;
  }
  return m;
}
constexpr uint32_t kKnownBits = known_bits();

// `why` must point at static storage, and the messages name the bit and the
// transition, so they are assembled at compile time.
struct Why {
  char text[96] = {};
};

consteval Why make_why(std::initializer_list<std::string_view> parts) {
  Why w;
  size_t n = 0;
  for (std::string_view p : parts) {
    for (char c : p) w.text[n++] = c;  // overflow fails to compile
  }
  w.text[n] = '\0';
  return w;
}

struct BadTransitionWhy {
  Why with_state[kNumStates][kNumStates];  // IBV_QP_STATE: from -> to
  Why without_state[kNumStates];           // no IBV_QP_STATE: cur -> cur
};

consteval BadTransitionWhy make_bad_transition_why() {
  BadTransitionWhy b;
  for (int f = 0; f < kNumStates; ++f) {
    for (int t = 0; t < kNumStates; ++t) {
      b.with_state[f][t] = make_why({"QP state transition ", kStateNames[f],
                                     "->", kStateNames[t], " not allowed"});
    }
    b.without_state[f] = make_why({"attributes cannot be modified in ",
                                   kStateNames[f], " without IBV_QP_STATE"});
  }
  return b;
}
constexpr BadTransitionWhy kBadTransitionWhy = make_bad_transition_why();

// A missing required bit for a transition: one message per (row, bit) that
// some QP type requires.
struct MissingWhy {
  ibv_qp_state from;
  ibv_qp_state to;
  uint32_t bit;
  Why why;
};

constexpr uint32_t required_union(const Transition& t) {
  return t.req[kRc] | t.req[kUc] | t.req[kUd];
}

constexpr size_t count_required_bits() {
  size_t n = 0;
  for (const Transition& t : kTransitions) {
    n += static_cast<size_t>(std::popcount(required_union(t)));
  }
  return n;
}

template <size_t N>
struct MissingWhyTable {
  MissingWhy entries[N];
};

consteval MissingWhyTable<count_required_bits()> make_missing_why() {
  MissingWhyTable<count_required_bits()> table{};
  size_t n = 0;
  for (const Transition& t : kTransitions) {
    for (uint32_t m = required_union(t); m != 0; m &= m - 1) {
      const int bit = std::countr_zero(m);
      table.entries[n++] = {
          t.from, t.to, uint32_t{1} << bit,
          make_why({"missing required attribute ", kBitNames[bit], " for ",
                    kStateNames[t.from], "->", kStateNames[t.to]})};
    }
  }
  return table;
}
constexpr auto kMissingWhy = make_missing_why();

// A bit that is neither required nor optional: one message per bit.
struct NotAllowedWhy {
  Why by_bit[kNumMaskBits];
};

consteval NotAllowedWhy make_not_allowed_why() {
  NotAllowedWhy table;
  for (int bit = 0; bit < kNumMaskBits; ++bit) {
    table.by_bit[bit] = make_why(
        {kBitNames[bit], " not allowed for this QP type and transition"});
  }
  return table;
}
constexpr NotAllowedWhy kNotAllowedWhy = make_not_allowed_why();

const char* missing_why(ibv_qp_state from, ibv_qp_state to, uint32_t bit) {
  for (const MissingWhy& m : kMissingWhy.entries) {
    if (m.from == from && m.to == to && m.bit == bit) return m.why.text;
  }
  return "missing required attribute";  // unreachable: table built from rows
}

constexpr uint32_t lowest_bit(uint32_t m) {
  return m & (~m + 1);
}

constexpr uint32_t kMaxPsn = 0xffffff;  // 24-bit PSNs and QPNs
constexpr uint8_t kPort1 = 1;           // urnic exposes one port
// The access flags a QP takes, as rxe's RXE_ACCESS_SUPPORTED_QP: local
// write and the remote rights it grants, and MR properties an application
// passes along with them, which mean nothing for a QP and are ignored (MW
// bind, on-demand paging, the two flush rights: bits 8 and 9 as the kernel
// numbers them, and the optional range, relaxed ordering among them).
// Zero-based and huge-page flags stay refused, as there.
constexpr unsigned kQpAccessFlags =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
    IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND | IBV_ACCESS_ON_DEMAND |
    hostif::kAccessFlushRights | IBV_ACCESS_OPTIONAL_RANGE;

bool gid_is_zero(const ibv_gid& g) {
  for (uint8_t b : g.raw) {
    if (b != 0) return false;
  }
  return true;
}

// Value checks for the attributes in `mask` (already known to be allowed).
const char* check_values(const ibv_qp_attr& a, uint32_t mask,
                         const Limits& lim) {
  // No automatic path migration: there is no alternate path to load, and
  // the only migration state is the one a QP starts in.
  if (mask & kAltPath) {
    return "IBV_QP_ALT_PATH not supported (no automatic path migration)";
  }
  if ((mask & kPathMig) && a.path_mig_state != IBV_MIG_MIGRATED) {
    return "path_mig_state other than IBV_MIG_MIGRATED not supported";
  }
  if ((mask & kPathMtu) &&
      (a.path_mtu < IBV_MTU_256 || a.path_mtu > IBV_MTU_4096)) {
    return "path_mtu out of range";
  }
  // A packet of a larger MTU would not fit the port's frames: every one
  // would be dropped on the way out and the QP would retry into error.
  // Refused (stricter than rxe, whose max_mtu is always 4096 and which
  // takes any path MTU; its oversized frames are dropped by the netdev).
  if ((mask & kPathMtu) && a.path_mtu > lim.max_path_mtu) {
    return "path_mtu above the port's max_mtu (the port's MTU does not carry "
           "it; ibv_query_port)";
  }
  // sq_psn / rq_psn are not refused above 24 bits: rxe and mlx5 take the
  // low 24 (an application's lrand48() unmasked works there), and so does
  // the engine.
  if ((mask & kDestQpn) && a.dest_qp_num > kMaxPsn) {
    return "dest_qp_num out of range";
  }
  // Field widths on the wire / in the spec: Local ACK Timeout 5 bits,
  // retry counts 3 bits (rnr_retry 7 = infinite), RNR NAK timer 5 bits.
  if ((mask & kTimeout) && a.timeout > 31) return "timeout out of range";
  if ((mask & kRetryCnt) && a.retry_cnt > 7) return "retry_cnt out of range";
  if ((mask & kRnrRetry) && a.rnr_retry > 7) return "rnr_retry out of range";
  if ((mask & kMinRnrTimer) && a.min_rnr_timer > 31) {
    return "min_rnr_timer out of range";
  }
  if ((mask & kMaxRdAtomic) && a.max_rd_atomic > lim.max_rd_atomic) {
    return "max_rd_atomic above the device limit";
  }
  if ((mask & kMaxDestRdAtomic) &&
      a.max_dest_rd_atomic > lim.max_dest_rd_atomic) {
    return "max_dest_rd_atomic above the device limit";
  }
  if ((mask & kPort) && a.port_num != kPort1) return "port_num must be 1";
  // One P_Key table entry, the default P_Key (RoCE has no partitions).
  if ((mask & kPkey) && a.pkey_index != 0) return "pkey_index must be 0";
  if ((mask & kAccess) && (a.qp_access_flags & ~kQpAccessFlags) != 0) {
    return "qp_access_flags has a bit a QP does not take (zero-based, "
           "huge pages, or unknown)";
  }
  if (mask & kAv) {
    if (const char* w = check_av(a.ah_attr, lim)) return w;
    // Groups take UD SENDs only (IBTA 10.5.2): a connection has one peer.
    if (wire::gid_is_multicast(a.ah_attr.grh.dgid.raw))
      return "ah_attr.grh.dgid is a multicast group: only UD sends to groups";
  }
  // IBV_QP_QKEY: any 32-bit value; IBV_QP_EN_SQD_ASYNC_NOTIFY: a flag.
  return nullptr;
}

}  // namespace

// Address vector for RoCE: everything is routed on the GRH (the dgid gives
// the IP destination), so dlid, src_path_bits and static_rate are not looked
// at: there is no rate limiter, the rate is whatever the link gives.
// grh.flow_label is not checked either: like the kernel's drivers, only its
// low 20 bits are used (UCX passes 0xffffffff for "none").
const char* check_av(const ibv_ah_attr& ah, const Limits& lim) {
  if (ah.is_global != 1) return "AV without GRH (is_global 0): RoCE needs one";
  if (ah.grh.sgid_index >= lim.gid_table_len) {
    return "ah_attr.grh.sgid_index beyond the GID table";
  }
  // 0 means "the QP's port", as several providers accept.
  if (ah.port_num != 0 && ah.port_num != kPort1) {
    return "ah_attr.port_num out of range";
  }
  if (gid_is_zero(ah.grh.dgid)) return "ah_attr.grh.dgid is all zero";
  return nullptr;
}

int check_modify_qp(ibv_qp_type type, ibv_qp_state cur, const ibv_qp_attr& attr,
                    int mask, const Limits& lim, const char** why) {
  auto fail = [why](const char* w, int err = EINVAL) {
    if (why != nullptr) *why = w;
    return err;
  };
  const int t = type_index(type);
  if (t < 0) return fail("QP type is not RC, UC or UD");
  if (!valid_state(cur)) return fail("current QP state out of range");
  const auto m = static_cast<uint32_t>(mask);
  // EOPNOTSUPP, as rdma-core's ibv_cmd_modify_qp and rxe say for a bit
  // past the standard ones (code that probes for a feature tests it).
  if ((m & ~kKnownBits) != 0) {
    return fail("unknown attribute mask bit", EOPNOTSUPP);
  }
  // The table never allows it for RC/UC/UD, but say why: there is no
  // per-QP rate limiter.
  if (m & IBV_QP_RATE_LIMIT) {
    return fail("IBV_QP_RATE_LIMIT not supported (no rate limiter)",
                EOPNOTSUPP);
  }

  ibv_qp_state next = cur;
  if (m & IBV_QP_STATE) {
    if (!valid_state(attr.qp_state)) return fail("qp_state out of range");
    next = attr.qp_state;
  }
  const Transition* tr = find_transition(cur, next);
  if (tr == nullptr) {
    return fail((m & IBV_QP_STATE)
                    ? kBadTransitionWhy.with_state[cur][next].text
                    : kBadTransitionWhy.without_state[cur].text);
  }
  const uint32_t req = tr->req[t];
  const uint32_t opt = tr->opt[t];
  if (const uint32_t missing = req & ~m) {
    return fail(missing_why(cur, next, lowest_bit(missing)));
  }
  if (const uint32_t extra = m & ~(req | opt | IBV_QP_STATE)) {
    return fail(kNotAllowedWhy.by_bit[std::countr_zero(extra)].text);
  }
  // The caller's idea of the current state must be right, or the request
  // was built for a different transition.
  if ((m & kCurState) && attr.cur_qp_state != cur) {
    return fail("cur_qp_state does not match the QP state");
  }
  if (const char* w = check_values(attr, m, lim)) return fail(w);
  return 0;
}

const char* qp_state_name(ibv_qp_state s) {
  return valid_state(s) ? kStateNames[s] : "UNKNOWN";
}

}  // namespace urnic::transport
