// check_modify_qp against an independent transcription of the IBTA / Linux
// qp_state_table (RC, UC, UD) and the value ranges urnic accepts.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>

#include "dataplane/transport/qp_attr.h"
#include "dataplane/wire/codec.h"

namespace urnic::transport {
namespace {

constexpr ibv_qp_type kTypes[] = {IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD};
constexpr ibv_qp_state kStates[] = {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR,
                                    IBV_QPS_RTS,   IBV_QPS_SQD,  IBV_QPS_SQE,
                                    IBV_QPS_ERR};

// Every mask bit verbs.h defines.
constexpr uint32_t kDefinedBits[] = {IBV_QP_STATE,
                                     IBV_QP_CUR_STATE,
                                     IBV_QP_EN_SQD_ASYNC_NOTIFY,
                                     IBV_QP_ACCESS_FLAGS,
                                     IBV_QP_PKEY_INDEX,
                                     IBV_QP_PORT,
                                     IBV_QP_QKEY,
                                     IBV_QP_AV,
                                     IBV_QP_PATH_MTU,
                                     IBV_QP_TIMEOUT,
                                     IBV_QP_RETRY_CNT,
                                     IBV_QP_RNR_RETRY,
                                     IBV_QP_RQ_PSN,
                                     IBV_QP_MAX_QP_RD_ATOMIC,
                                     IBV_QP_ALT_PATH,
                                     IBV_QP_MIN_RNR_TIMER,
                                     IBV_QP_SQ_PSN,
                                     IBV_QP_MAX_DEST_RD_ATOMIC,
                                     IBV_QP_PATH_MIG_STATE,
                                     IBV_QP_CAP,
                                     IBV_QP_DEST_QPN,
                                     IBV_QP_RATE_LIMIT};

struct Masks {
  uint32_t req;
  uint32_t opt;
};

// Expected (required, optional) masks without IBV_QP_STATE, or nullopt for a
// transition the table does not have. Written per type, from the kernel
// table's RC/UC/UD columns.
std::optional<Masks> expected(ibv_qp_type type, ibv_qp_state from,
                              ibv_qp_state to) {
  const bool rc = type == IBV_QPT_RC;
  const bool uc = type == IBV_QPT_UC;
  const bool ud = type == IBV_QPT_UD;
  if (to == IBV_QPS_RESET) return Masks{0, 0};
  if (to == IBV_QPS_ERR) {
    if (from == IBV_QPS_RESET) return std::nullopt;
    return Masks{0, 0};
  }
  if (from == IBV_QPS_RESET && to == IBV_QPS_INIT) {
    if (ud) return Masks{IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY, 0};
    return Masks{IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0};
  }
  if (from == IBV_QPS_INIT && to == IBV_QPS_INIT) {
    if (ud) return Masks{0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY};
    return Masks{0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS};
  }
  if (from == IBV_QPS_INIT && to == IBV_QPS_RTR) {
    if (ud) return Masks{0, IBV_QP_PKEY_INDEX | IBV_QP_QKEY};
    const uint32_t opt =
        IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX;
    const uint32_t uc_req =
        IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    if (uc) return Masks{uc_req, opt};
    return Masks{uc_req | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
                 opt};
  }
  if (from == IBV_QPS_RTR && to == IBV_QPS_RTS) {
    if (ud) return Masks{IBV_QP_SQ_PSN, IBV_QP_CUR_STATE | IBV_QP_QKEY};
    if (uc) {
      return Masks{IBV_QP_SQ_PSN, IBV_QP_CUR_STATE | IBV_QP_ALT_PATH |
                                      IBV_QP_ACCESS_FLAGS |
                                      IBV_QP_PATH_MIG_STATE};
    }
    return Masks{IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
                 IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS |
                     IBV_QP_MIN_RNR_TIMER | IBV_QP_PATH_MIG_STATE};
  }
  if ((from == IBV_QPS_RTS || from == IBV_QPS_SQD) && to == IBV_QPS_RTS) {
    if (ud) return Masks{0, IBV_QP_CUR_STATE | IBV_QP_QKEY};
    const uint32_t uc_opt = IBV_QP_CUR_STATE | IBV_QP_ALT_PATH |
                            IBV_QP_ACCESS_FLAGS | IBV_QP_PATH_MIG_STATE;
    if (uc) return Masks{0, uc_opt};
    return Masks{0, uc_opt | IBV_QP_MIN_RNR_TIMER};
  }
  if (from == IBV_QPS_RTS && to == IBV_QPS_SQD) {
    return Masks{0, IBV_QP_EN_SQD_ASYNC_NOTIFY};
  }
  if (from == IBV_QPS_SQD && to == IBV_QPS_SQD) {
    if (ud) return Masks{0, IBV_QP_PKEY_INDEX | IBV_QP_QKEY};
    const uint32_t uc_opt = IBV_QP_AV | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS |
                            IBV_QP_PKEY_INDEX | IBV_QP_PATH_MIG_STATE;
    if (uc) return Masks{0, uc_opt};
    return Masks{0, uc_opt | IBV_QP_PORT | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                        IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER};
  }
  if (from == IBV_QPS_SQE && to == IBV_QPS_RTS) {
    if (ud) return Masks{0, IBV_QP_CUR_STATE | IBV_QP_QKEY};
    if (uc) return Masks{0, IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS};
    if (rc) return Masks{0, 0};
  }
  return std::nullopt;
}

Limits test_limits() {
  Limits lim;
  lim.max_rd_atomic = 8;
  lim.max_dest_rd_atomic = 4;
  lim.gid_table_len = 3;
  return lim;
}

// Attributes with every field valid, so only the mask decides.
ibv_qp_attr good_attr(ibv_qp_state from, ibv_qp_state to) {
  ibv_qp_attr a;
  std::memset(&a, 0, sizeof(a));
  a.qp_state = to;
  a.cur_qp_state = from;
  a.path_mtu = IBV_MTU_1024;
  a.path_mig_state = IBV_MIG_MIGRATED;
  a.qkey = 0x11111111;
  a.rq_psn = 0x123456;
  a.sq_psn = 0xabcdef;
  a.dest_qp_num = 0x12;
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  a.ah_attr.is_global = 1;
  a.ah_attr.port_num = 1;
  a.ah_attr.grh.sgid_index = 0;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.grh.dgid.raw[10] = 0xff;  // ::ffff:10.0.0.2
  a.ah_attr.grh.dgid.raw[11] = 0xff;
  a.ah_attr.grh.dgid.raw[12] = 10;
  a.ah_attr.grh.dgid.raw[15] = 2;
  a.pkey_index = 0;
  a.en_sqd_async_notify = 1;
  a.max_rd_atomic = 1;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.port_num = 1;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  return a;
}

std::string describe(ibv_qp_type type, ibv_qp_state from, ibv_qp_state to,
                     uint32_t mask) {
  const char* t = type == IBV_QPT_RC ? "RC" : type == IBV_QPT_UC ? "UC" : "UD";
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%s %s->%s mask 0x%x", t, qp_state_name(from),
                qp_state_name(to), mask);
  return buf;
}

// Expects EINVAL with a non-empty reason.
void expect_rejected(ibv_qp_type type, ibv_qp_state from, ibv_qp_state to,
                     const ibv_qp_attr& a, uint32_t mask, const Limits& lim,
                     int err = EINVAL) {
  const char* why = nullptr;
  EXPECT_EQ(check_modify_qp(type, from, a, static_cast<int>(mask), lim, &why),
            err)
      << describe(type, from, to, mask);
  ASSERT_NE(why, nullptr) << describe(type, from, to, mask);
  EXPECT_GT(std::strlen(why), 0u);
}

// Expects success, and `why` left as it was.
void expect_accepted(ibv_qp_type type, ibv_qp_state from, ibv_qp_state to,
                     const ibv_qp_attr& a, uint32_t mask, const Limits& lim) {
  const char* why = "untouched";
  EXPECT_EQ(check_modify_qp(type, from, a, static_cast<int>(mask), lim, &why),
            0)
      << describe(type, from, to, mask) << ": " << why;
  EXPECT_STREQ(why, "untouched");
}

// Runs the mask checks for one transition, with `state_bit` IBV_QP_STATE
// or 0 (then only from == to makes sense).
void check_transition(ibv_qp_type type, ibv_qp_state from, ibv_qp_state to,
                      uint32_t state_bit, const Limits& lim) {
  const ibv_qp_attr a = good_attr(from, to);
  const std::optional<Masks> exp = expected(type, from, to);
  if (!exp) {
    expect_rejected(type, from, to, a, state_bit, lim);
    uint32_t all = 0;
    for (uint32_t bit : kDefinedBits) all |= bit;
    // IBV_QP_RATE_LIMIT among them: EOPNOTSUPP before the table is read.
    expect_rejected(type, from, to, a, (all & ~IBV_QP_STATE) | state_bit, lim,
                    EOPNOTSUPP);
    expect_rejected(type, from, to, a,
                    (all & ~(IBV_QP_STATE | IBV_QP_RATE_LIMIT)) | state_bit,
                    lim);
    return;
  }
  const uint32_t base = exp->req | state_bit;
  expect_accepted(type, from, to, a, base, lim);
  for (uint32_t bit : kDefinedBits) {
    if (bit == IBV_QP_STATE) continue;
    if (exp->req & bit) {
      expect_rejected(type, from, to, a, base & ~bit, lim);
    } else if (exp->opt & bit) {
      // Allowed by the table, but urnic has no alternate path (APM).
      if (bit == IBV_QP_ALT_PATH) {
        expect_rejected(type, from, to, a, base | bit, lim);
      } else {
        expect_accepted(type, from, to, a, base | bit, lim);
      }
    } else {
      expect_rejected(type, from, to, a, base | bit, lim,
                      bit == IBV_QP_RATE_LIMIT ? EOPNOTSUPP : EINVAL);
    }
  }
  // Bits verbs.h does not define: EOPNOTSUPP, as rdma-core and rxe.
  expect_rejected(type, from, to, a, base | (1u << 21), lim, EOPNOTSUPP);
  expect_rejected(type, from, to, a, base | (1u << 30), lim, EOPNOTSUPP);
  // All optional bits at once (less the unsupported alternate path).
  expect_accepted(type, from, to, a, base | (exp->opt & ~IBV_QP_ALT_PATH), lim);
}

TEST(QpAttr, TransitionTableWithState) {
  const Limits lim = test_limits();
  int allowed = 0;
  for (ibv_qp_type type : kTypes) {
    for (ibv_qp_state from : kStates) {
      for (ibv_qp_state to : kStates) {
        check_transition(type, from, to, IBV_QP_STATE, lim);
        if (expected(type, from, to)) ++allowed;
      }
    }
  }
  // Per type: 7 to RESET, 6 to ERR, RESET->INIT, INIT->INIT, INIT->RTR,
  // RTR->RTS, RTS->RTS, RTS->SQD, SQD->RTS, SQD->SQD, SQE->RTS.
  EXPECT_EQ(allowed, 3 * 22);
}

TEST(QpAttr, TransitionTableWithoutState) {
  // Without IBV_QP_STATE the request is cur->cur: only rows the table has.
  const Limits lim = test_limits();
  for (ibv_qp_type type : kTypes) {
    for (ibv_qp_state s : kStates) check_transition(type, s, s, 0, lim);
  }
  const ibv_qp_attr a = good_attr(IBV_QPS_RTS, IBV_QPS_RTS);
  expect_accepted(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_RTS, a, IBV_QP_MIN_RNR_TIMER,
                  lim);
  expect_rejected(IBV_QPT_RC, IBV_QPS_RTR, IBV_QPS_RTR, a, IBV_QP_MIN_RNR_TIMER,
                  lim);
  expect_rejected(IBV_QPT_UD, IBV_QPS_SQE, IBV_QPS_SQE, a, IBV_QP_QKEY, lim);
  expect_accepted(IBV_QPT_UD, IBV_QPS_RESET, IBV_QPS_RESET, a, 0, lim);
  expect_accepted(IBV_QPT_UD, IBV_QPS_ERR, IBV_QPS_ERR, a, 0, lim);
}

TEST(QpAttr, ManPageBringUp) {
  // The sequences of the ibv_modify_qp man page, RC and UD.
  const Limits lim = test_limits();
  ibv_qp_attr a = good_attr(IBV_QPS_RESET, IBV_QPS_INIT);
  EXPECT_EQ(check_modify_qp(IBV_QPT_RC, IBV_QPS_RESET, a,
                            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                IBV_QP_ACCESS_FLAGS,
                            lim),
            0);
  EXPECT_EQ(
      check_modify_qp(
          IBV_QPT_UD, IBV_QPS_RESET, a,
          IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY, lim),
      0);
  a.qp_state = IBV_QPS_RTR;
  EXPECT_EQ(
      check_modify_qp(IBV_QPT_RC, IBV_QPS_INIT, a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                          IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
                      lim),
      0);
  EXPECT_EQ(check_modify_qp(IBV_QPT_UD, IBV_QPS_INIT, a, IBV_QP_STATE, lim), 0);
  a.qp_state = IBV_QPS_RTS;
  EXPECT_EQ(check_modify_qp(IBV_QPT_RC, IBV_QPS_RTR, a,
                            IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
                                IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                IBV_QP_MAX_QP_RD_ATOMIC,
                            lim),
            0);
  EXPECT_EQ(check_modify_qp(IBV_QPT_UD, IBV_QPS_RTR, a,
                            IBV_QP_STATE | IBV_QP_SQ_PSN, lim),
            0);
}

TEST(QpAttr, WhyNamesMissingBitAndTransition) {
  const Limits lim = test_limits();
  const ibv_qp_attr a = good_attr(IBV_QPS_INIT, IBV_QPS_RTR);
  const char* why = nullptr;
  EXPECT_EQ(check_modify_qp(IBV_QPT_RC, IBV_QPS_INIT, a,
                            IBV_QP_STATE | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                IBV_QP_MIN_RNR_TIMER,
                            lim, &why),
            EINVAL);
  ASSERT_NE(why, nullptr);
  EXPECT_STREQ(why, "missing required attribute IBV_QP_AV for INIT->RTR");

  why = nullptr;
  ibv_qp_attr b = good_attr(IBV_QPS_RESET, IBV_QPS_RTS);
  EXPECT_EQ(
      check_modify_qp(IBV_QPT_UC, IBV_QPS_RESET, b, IBV_QP_STATE, lim, &why),
      EINVAL);
  ASSERT_NE(why, nullptr);
  EXPECT_STREQ(why, "QP state transition RESET->RTS not allowed");

  why = nullptr;
  b = good_attr(IBV_QPS_RTS, IBV_QPS_RTS);
  EXPECT_EQ(check_modify_qp(IBV_QPT_RC, IBV_QPS_RTS, b,
                            IBV_QP_STATE | IBV_QP_QKEY, lim, &why),
            EINVAL);
  ASSERT_NE(why, nullptr);
  EXPECT_NE(std::strstr(why, "IBV_QP_QKEY"), nullptr) << why;

  // Without `why` the result is the same.
  EXPECT_EQ(check_modify_qp(IBV_QPT_RC, IBV_QPS_RTS, b,
                            IBV_QP_STATE | IBV_QP_QKEY, lim),
            EINVAL);
}

TEST(QpAttr, ResetToErrIsNotInTheTable) {
  // IBTA / Linux: ERR is reachable from every state but RESET.
  const Limits lim = test_limits();
  const ibv_qp_attr a = good_attr(IBV_QPS_RESET, IBV_QPS_ERR);
  for (ibv_qp_type type : kTypes) {
    expect_rejected(type, IBV_QPS_RESET, IBV_QPS_ERR, a, IBV_QP_STATE, lim);
    expect_accepted(type, IBV_QPS_INIT, IBV_QPS_ERR, a, IBV_QP_STATE, lim);
  }
}

TEST(QpAttr, CurStateMustMatch) {
  const Limits lim = test_limits();
  const uint32_t mask = IBV_QP_STATE | IBV_QP_CUR_STATE | IBV_QP_SQ_PSN;
  ibv_qp_attr a = good_attr(IBV_QPS_RTR, IBV_QPS_RTS);
  expect_accepted(IBV_QPT_UD, IBV_QPS_RTR, IBV_QPS_RTS, a, mask, lim);
  for (ibv_qp_state s : kStates) {
    if (s == IBV_QPS_RTR) continue;
    a.cur_qp_state = s;
    expect_rejected(IBV_QPT_UD, IBV_QPS_RTR, IBV_QPS_RTS, a, mask, lim);
  }
  // Not allowed at all before RTR, even when it matches.
  a = good_attr(IBV_QPS_INIT, IBV_QPS_INIT);
  expect_rejected(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_INIT, a,
                  IBV_QP_CUR_STATE | IBV_QP_PORT, lim);
}

TEST(QpAttr, AvRequiresGrh) {
  const Limits lim = test_limits();
  const auto exp = expected(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTR);
  ASSERT_TRUE(exp.has_value());
  const uint32_t mask = exp->req | IBV_QP_STATE;
  ibv_qp_attr a = good_attr(IBV_QPS_INIT, IBV_QPS_RTR);
  expect_accepted(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTR, a, mask, lim);
  a.ah_attr.is_global = 0;
  expect_rejected(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTR, a, mask, lim);
  a.ah_attr.is_global = 1;
  std::memset(a.ah_attr.grh.dgid.raw, 0, sizeof(a.ah_attr.grh.dgid.raw));
  expect_rejected(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTR, a, mask, lim);
  a.ah_attr.grh.dgid.raw[15] = 1;  // ::1 is not all zero
  expect_accepted(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTR, a, mask, lim);
  // Not looked at on RoCE; the flow label's low 20 bits are used, as by the
  // kernel's drivers (UCX passes 0xffffffff).
  a.ah_attr.static_rate = 0xff;
  a.ah_attr.dlid = 0xffff;
  a.ah_attr.grh.flow_label = 0xffffffff;
  expect_accepted(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTR, a, mask, lim);
  // A connection has one peer: a multicast group (239.1.1.1, ff0e::1) is
  // never a connected QP's destination.
  wire::gid_from_ipv4(0xef010101, a.ah_attr.grh.dgid.raw);
  expect_rejected(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTR, a, mask, lim);
  std::memset(a.ah_attr.grh.dgid.raw, 0, sizeof(a.ah_attr.grh.dgid.raw));
  a.ah_attr.grh.dgid.raw[0] = 0xff;
  a.ah_attr.grh.dgid.raw[1] = 0x0e;
  a.ah_attr.grh.dgid.raw[15] = 1;
  expect_rejected(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTR, a, mask, lim);
}

TEST(QpAttr, UnsupportedFeatures) {
  const Limits lim = test_limits();
  // Alternate path: allowed by the table for RC at INIT->RTR, but no APM.
  ibv_qp_attr a = good_attr(IBV_QPS_INIT, IBV_QPS_RTR);
  const auto exp = expected(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTR);
  ASSERT_TRUE(exp.has_value());
  const char* why = nullptr;
  EXPECT_EQ(check_modify_qp(
                IBV_QPT_RC, IBV_QPS_INIT, a,
                static_cast<int>(exp->req | IBV_QP_STATE | IBV_QP_ALT_PATH),
                lim, &why),
            EINVAL);
  ASSERT_NE(why, nullptr);
  EXPECT_NE(std::strstr(why, "ALT_PATH"), nullptr) << why;
  // Path migration state: only MIGRATED.
  a = good_attr(IBV_QPS_RTS, IBV_QPS_RTS);
  expect_accepted(IBV_QPT_UC, IBV_QPS_RTS, IBV_QPS_RTS, a,
                  IBV_QP_PATH_MIG_STATE, lim);
  for (ibv_mig_state m : {IBV_MIG_REARM, IBV_MIG_ARMED}) {
    a.path_mig_state = m;
    expect_rejected(IBV_QPT_UC, IBV_QPS_RTS, IBV_QPS_RTS, a,
                    IBV_QP_PATH_MIG_STATE, lim);
  }
  // Rate limit and QP resize: never for RC/UC/UD.
  a = good_attr(IBV_QPS_RTS, IBV_QPS_RTS);
  for (ibv_qp_type type : kTypes) {
    expect_rejected(type, IBV_QPS_RTR, IBV_QPS_RTS, a,
                    IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_RATE_LIMIT, lim,
                    EOPNOTSUPP);
    expect_rejected(type, IBV_QPS_RTS, IBV_QPS_RTS, a, IBV_QP_RATE_LIMIT, lim,
                    EOPNOTSUPP);
    expect_rejected(type, IBV_QPS_RTS, IBV_QPS_RTS, a, IBV_QP_CAP, lim);
  }
}

TEST(QpAttr, BadTypeOrState) {
  const Limits lim = test_limits();
  ibv_qp_attr a = good_attr(IBV_QPS_RESET, IBV_QPS_INIT);
  const uint32_t mask =
      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
  const char* why = nullptr;
  EXPECT_EQ(check_modify_qp(IBV_QPT_RAW_PACKET, IBV_QPS_RESET, a,
                            static_cast<int>(mask), lim, &why),
            EINVAL);
  EXPECT_NE(why, nullptr);
  expect_rejected(IBV_QPT_UD, IBV_QPS_UNKNOWN, IBV_QPS_INIT, a, mask, lim);
  a.qp_state = IBV_QPS_UNKNOWN;
  expect_rejected(IBV_QPT_UD, IBV_QPS_RESET, IBV_QPS_UNKNOWN, a, mask, lim);
  a.qp_state = IBV_QPS_INIT;
  expect_accepted(IBV_QPT_UD, IBV_QPS_RESET, IBV_QPS_INIT, a, mask, lim);
}

// One value bound: `inside` is accepted, `outside` rejected, with the
// transition's required mask plus `bit`.
struct Bound {
  const char* name;
  ibv_qp_type type;
  ibv_qp_state from;
  ibv_qp_state to;
  uint32_t bit;
  void (*set)(ibv_qp_attr&, uint32_t);
  uint32_t inside;
  uint32_t outside;
};

TEST(QpAttr, ValueBounds) {
  const Limits lim = test_limits();
  const Bound bounds[] = {
      {"path_mtu high", IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QP_PATH_MTU,
       [](ibv_qp_attr& a, uint32_t v) { a.path_mtu = static_cast<ibv_mtu>(v); },
       IBV_MTU_4096, IBV_MTU_4096 + 1},
      {"path_mtu low", IBV_QPT_UC, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QP_PATH_MTU,
       [](ibv_qp_attr& a, uint32_t v) { a.path_mtu = static_cast<ibv_mtu>(v); },
       IBV_MTU_256, 0},
      {"dest_qp_num", IBV_QPT_UC, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QP_DEST_QPN,
       [](ibv_qp_attr& a, uint32_t v) { a.dest_qp_num = v; }, 0xffffff,
       0x1000000},
      {"timeout", IBV_QPT_RC, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_TIMEOUT,
       [](ibv_qp_attr& a, uint32_t v) { a.timeout = static_cast<uint8_t>(v); },
       31, 32},
      {"retry_cnt", IBV_QPT_RC, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_RETRY_CNT,
       [](ibv_qp_attr& a, uint32_t v) {
         a.retry_cnt = static_cast<uint8_t>(v);
       },
       7, 8},
      {"rnr_retry", IBV_QPT_RC, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_RNR_RETRY,
       [](ibv_qp_attr& a, uint32_t v) {
         a.rnr_retry = static_cast<uint8_t>(v);
       },
       7, 8},
      {"min_rnr_timer", IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTR,
       IBV_QP_MIN_RNR_TIMER,
       [](ibv_qp_attr& a, uint32_t v) {
         a.min_rnr_timer = static_cast<uint8_t>(v);
       },
       31, 32},
      {"max_rd_atomic", IBV_QPT_RC, IBV_QPS_RTR, IBV_QPS_RTS,
       IBV_QP_MAX_QP_RD_ATOMIC,
       [](ibv_qp_attr& a, uint32_t v) {
         a.max_rd_atomic = static_cast<uint8_t>(v);
       },
       lim.max_rd_atomic, lim.max_rd_atomic + 1u},
      {"max_dest_rd_atomic", IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTR,
       IBV_QP_MAX_DEST_RD_ATOMIC,
       [](ibv_qp_attr& a, uint32_t v) {
         a.max_dest_rd_atomic = static_cast<uint8_t>(v);
       },
       lim.max_dest_rd_atomic, lim.max_dest_rd_atomic + 1u},
      {"port_num high", IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PORT,
       [](ibv_qp_attr& a, uint32_t v) { a.port_num = static_cast<uint8_t>(v); },
       1, 2},
      {"port_num low", IBV_QPT_UD, IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PORT,
       [](ibv_qp_attr& a, uint32_t v) { a.port_num = static_cast<uint8_t>(v); },
       1, 0},
      {"pkey_index", IBV_QPT_UC, IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PKEY_INDEX,
       [](ibv_qp_attr& a, uint32_t v) {
         a.pkey_index = static_cast<uint16_t>(v);
       },
       0, 1},
      {"qp_access_flags", IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_INIT,
       IBV_QP_ACCESS_FLAGS,
       [](ibv_qp_attr& a, uint32_t v) { a.qp_access_flags = v; },
       // rxe takes (and ignores) MR flags an application passes along:
       // MW bind, on-demand paging, the flush rights, relaxed ordering.
       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
           IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
           IBV_ACCESS_MW_BIND | IBV_ACCESS_ON_DEMAND | (3u << 8) |
           IBV_ACCESS_RELAXED_ORDERING,
       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_HUGETLB},
      {"qp_access_flags zero", IBV_QPT_UC, IBV_QPS_SQE, IBV_QPS_RTS,
       IBV_QP_ACCESS_FLAGS,
       [](ibv_qp_attr& a, uint32_t v) { a.qp_access_flags = v; }, 0,
       IBV_ACCESS_ZERO_BASED},
      {"ah sgid_index", IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QP_AV,
       [](ibv_qp_attr& a, uint32_t v) {
         a.ah_attr.grh.sgid_index = static_cast<uint8_t>(v);
       },
       lim.gid_table_len - 1u, lim.gid_table_len},
      {"ah port_num", IBV_QPT_UC, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QP_AV,
       [](ibv_qp_attr& a, uint32_t v) {
         a.ah_attr.port_num = static_cast<uint8_t>(v);
       },
       1, 2},
      {"ah port_num 0", IBV_QPT_UC, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QP_AV,
       [](ibv_qp_attr& a, uint32_t v) {
         a.ah_attr.port_num = static_cast<uint8_t>(v);
       },
       0, 0xff},
      {"ah is_global", IBV_QPT_UC, IBV_QPS_SQD, IBV_QPS_SQD, IBV_QP_AV,
       [](ibv_qp_attr& a, uint32_t v) {
         a.ah_attr.is_global = static_cast<uint8_t>(v);
       },
       1, 0},
      {"retry_cnt at SQD", IBV_QPT_RC, IBV_QPS_SQD, IBV_QPS_SQD,
       IBV_QP_RETRY_CNT,
       [](ibv_qp_attr& a, uint32_t v) {
         a.retry_cnt = static_cast<uint8_t>(v);
       },
       0, 8},
  };
  for (const Bound& b : bounds) {
    SCOPED_TRACE(b.name);
    const std::optional<Masks> exp = expected(b.type, b.from, b.to);
    ASSERT_TRUE(exp.has_value());
    // The bit under test must be one the transition takes.
    ASSERT_NE((exp->req | exp->opt) & b.bit, 0u);
    const uint32_t mask =
        exp->req | b.bit | (b.from != b.to ? IBV_QP_STATE : 0);
    ibv_qp_attr a = good_attr(b.from, b.to);
    b.set(a, b.inside);
    expect_accepted(b.type, b.from, b.to, a, mask, lim);
    b.set(a, b.outside);
    expect_rejected(b.type, b.from, b.to, a, mask, lim);
    // A value outside the range is not looked at when its bit is not set
    // (only possible for an optional bit).
    if ((exp->req & b.bit) == 0) {
      expect_accepted(b.type, b.from, b.to, a, mask & ~b.bit, lim);
    }
  }
}

// PSNs wider than 24 bits are taken, as rxe and mlx5 take them (their low
// 24 bits; the engine's side: test_transport_objects).
TEST(QpAttr, PsnsWiderThan24BitsAreTaken) {
  const Limits lim = test_limits();
  for (const ibv_qp_state from : {IBV_QPS_INIT, IBV_QPS_RTR}) {
    const ibv_qp_state to = from == IBV_QPS_INIT ? IBV_QPS_RTR : IBV_QPS_RTS;
    ibv_qp_attr a = good_attr(from, to);
    a.rq_psn = 0x7f123456;  // RTR takes rq_psn, RTS sq_psn
    a.sq_psn = 0xffffffff;
    const std::optional<Masks> exp = expected(IBV_QPT_RC, from, to);
    ASSERT_TRUE(exp.has_value());
    expect_accepted(IBV_QPT_RC, from, to, a, exp->req | IBV_QP_STATE, lim);
  }
}

// A port whose MTU carries 1 KiB packets (1500 B, rxe's and urnicd's
// max_mtu then): a larger path MTU is refused with the reason, as rxe
// refuses one above its netdev's; perftest and ibv_rc_pingpong -m 4096
// otherwise connected and retried into error.
TEST(QpAttr, PathMtuAboveThePortsIsRefused) {
  Limits lim = test_limits();
  lim.max_path_mtu = IBV_MTU_1024;
  const std::optional<Masks> exp =
      expected(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTR);
  ASSERT_TRUE(exp.has_value());
  const uint32_t mask = exp->req | IBV_QP_PATH_MTU | IBV_QP_STATE;
  ibv_qp_attr a = good_attr(IBV_QPS_INIT, IBV_QPS_RTR);
  a.path_mtu = IBV_MTU_1024;
  expect_accepted(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTR, a, mask, lim);
  for (ibv_mtu m : {IBV_MTU_2048, IBV_MTU_4096}) {
    a.path_mtu = m;
    const char* why = nullptr;
    EXPECT_EQ(check_modify_qp(IBV_QPT_RC, IBV_QPS_INIT, a,
                              static_cast<int>(mask), lim, &why),
              EINVAL);
    ASSERT_NE(why, nullptr);
    EXPECT_NE(std::strstr(why, "max_mtu"), nullptr) << why;
  }
}

TEST(QpAttr, StateNames) {
  EXPECT_STREQ(qp_state_name(IBV_QPS_RESET), "RESET");
  EXPECT_STREQ(qp_state_name(IBV_QPS_INIT), "INIT");
  EXPECT_STREQ(qp_state_name(IBV_QPS_RTR), "RTR");
  EXPECT_STREQ(qp_state_name(IBV_QPS_RTS), "RTS");
  EXPECT_STREQ(qp_state_name(IBV_QPS_SQD), "SQD");
  EXPECT_STREQ(qp_state_name(IBV_QPS_SQE), "SQE");
  EXPECT_STREQ(qp_state_name(IBV_QPS_ERR), "ERR");
  EXPECT_STREQ(qp_state_name(IBV_QPS_UNKNOWN), "UNKNOWN");
}

}  // namespace
}  // namespace urnic::transport
