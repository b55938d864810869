// Internal interface between the engine and its three roles (one file
// each: requester.cc, completer.cc, responder.cc), as in rxe.
#pragma once

#include <cstdint>
#include <span>

#include "dataplane/transport/engine.h"

namespace urnic::transport {

// A received packet as the roles see it.
struct RxPkt {
  const wire::FrameInfo& fi;
  const wire::RoceFields& f;
  const wire::OpcodeInfo& op;
  std::span<const wire::ConstBuf> segs;
};

enum TimerKind : uint8_t { kRetransTimer, kRnrTimer, kPaceTimer, kProbeTimer };

// Builds packets from the send queue (IBTA 9.5, 9.7.1).
class Requester {
 public:
  // Sends up to `budget` packets; *more: stopped by the budget or full TX.
  static uint32_t send_st(Engine& e, Qp& qp, uint32_t budget, bool* more);
  // Repositions the requester at `psn` (go-back-N, or forward after an ACK
  // overtook it). The retransmit and probe timers are the caller's: a
  // retry restarts them, a tail-loss probe must not. kFirst: a resend from
  // a loss, timer or probe (not from within the QP's own turn) leads the
  // next pass (Engine::make_ready_first).
  enum class Queue { kInLine, kFirst };
  static void go_to_st(Engine& e, Qp& qp, uint32_t psn,
                       Queue q = Queue::kInLine);
};

// Handles ACKs, NAKs, read responses and atomic ACKs; owns the retransmit
// and RNR timers (IBTA 9.7.5.2, 9.9).
class Completer {
 public:
  static void rx_st(Engine& e, Qp& qp, const RxPkt& p);
  static void timer_st(Engine& e, Qp& qp, TimerKind kind);
  // A CNP for this QP: the path is congested (ECN), nothing was lost.
  static void cnp_st(Engine& e, Qp& qp);
  // The tail-loss probe timer: nothing was acknowledged for a while.
  static void probe_st(Engine& e, Qp& qp);
  // Completes WRs that need no more acknowledgement (head error, UC/UD).
  static void check_head_st(Engine& e, Qp& qp);
};

// Executes requests, answers them and generates receive completions (IBTA
// 9.7.5.1 for RC, 9.8 for UC and UD).
class Responder {
 public:
  static void rx_st(Engine& e, Qp& qp, const RxPkt& p);
  // Sends read responses, atomic ACKs and the deferred ACK/NAK.
  static uint32_t send_st(Engine& e, Qp& qp, uint32_t budget, bool* more);
  // True while read responses are still to be sent (an ACK must wait).
  static bool read_pending(const Qp& qp);
};

// Nothing for an RC QP to send at its rate: no request it may start (not
// RTS/SQD, or the send queue sent) and no READ response due. A rate-limited
// QP shares the DCQCN increase timer only while it has something
// (DcqcnShare); the requester and the responder update it as they pass.
bool nothing_to_send(const Qp& qp);

// Payload helpers shared by the roles (between SGE lists and frames).
// Gathers `len` bytes at offset `off` of a resolved SGE list into pieces;
// returns the number of pieces.
uint32_t gather(const HostSge* sg, uint32_t nsg, uint32_t off, uint32_t len,
                wire::ConstBuf* out);
// Copies `len` bytes starting at `src_off` of the frame segments into a
// resolved SGE list at offset `dst_off`.
void scatter(const HostSge* sg, uint32_t nsg, uint32_t dst_off,
             std::span<const wire::ConstBuf> segs, uint32_t src_off,
             uint32_t len);

// Asks for the cache lines of [p, p + len) ahead of use, or of `len`
// bytes at offset `off` of an SGE list: a QP's next packet reads or writes
// the application's memory right after this one's, and with many QPs
// (each its own buffers) that memory is cold: the copy and the ICRC would
// wait on it (perf/bench_transport BM_RcWriteQps).
inline void prefetch(const uint8_t* p, uint32_t len, bool write) {
  // Every line the range touches, the last one too when p is unaligned.
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + len;
  for (uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63}; a < end;
       a += 64) {
    const void* l = reinterpret_cast<const void*>(a);
    write ? __builtin_prefetch(l, 1, 3) : __builtin_prefetch(l, 0, 3);
  }
}
void prefetch(const HostSge* sg, uint32_t nsg, uint32_t off, uint32_t len,
              bool write);

// RNR timer code (IBTA table 45) to nanoseconds.
uint64_t rnr_timer_ns(uint8_t code);

}  // namespace urnic::transport
