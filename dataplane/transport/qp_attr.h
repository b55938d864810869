// ibv_modify_qp validation: the QP state transitions and per-transition
// attribute masks of IBTA vol.1 11.2.4 (Modify QP) as Linux encodes them in
// qp_state_table / ib_modify_qp_is_ok(), plus the attribute values urnic takes.
#pragma once

#include <infiniband/verbs.h>

#include "dataplane/transport/types.h"

namespace urnic::transport {

// Validates an ibv_modify_qp(attr, mask) request on a QP of `type`
// (IBV_QPT_RC, IBV_QPT_UC or IBV_QPT_UD) currently in state `cur`. Checks,
// in order: the transition cur -> (mask has IBV_QP_STATE ? attr.qp_state :
// cur) is in the table; every required mask bit is present and no bit is
// neither required nor optional; IBV_QP_CUR_STATE matches `cur`; the values
// of the attributes in the mask are in range for `lim` and supported.
// Returns 0, EOPNOTSUPP (a mask bit past the standard ones, or
// IBV_QP_RATE_LIMIT, as rdma-core and rxe) or EINVAL (positive errno).
// On failure, if `why` is non-null,
// *why points at a static string naming the problem; on success it is left
// untouched. Reads only the attr fields the mask selects.
int check_modify_qp(ibv_qp_type type, ibv_qp_state cur, const ibv_qp_attr& attr,
                    int mask, const Limits& lim, const char** why = nullptr);

// An address vector (a QP's or an AH's): nullptr if RoCE can use it, else
// what is wrong with it.
const char* check_av(const ibv_ah_attr& ah, const Limits& lim);

// "RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"; "UNKNOWN" otherwise.
const char* qp_state_name(ibv_qp_state s);

}  // namespace urnic::transport
