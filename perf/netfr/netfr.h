// netfr: what main.cc hands to the two roles once both QPs are connected.
#pragma once

#include <infiniband/verbs.h>

#include <memory>

#include "perf/netfr/protocol.h"
#include "perf/seeds_cm.h"
#include "perf/seeds_common.h"
#include "perf/seeds_tcp.h"
#include "perf/seeds_verbs.h"

namespace netfr {

struct Options {
  seeds::Common common;
  Params p;
};

struct Conn {
  seeds::Device dev;
  std::unique_ptr<seeds::Cm> cm;       // --cm
  std::unique_ptr<seeds::Channel> ch;  // TCP, or SENDs with --cm
  ibv_cq* cq = nullptr;  // one CQ for both QPs, sends and receives
  ibv_qp* qp[kQps] = {};
  // Receiver: the ring, then kQps x ring notify receive buffers.
  // Sender: kQps x ring staging buffers, then as many notify buffers.
  seeds::Buffer buf;
  Params p;   // as agreed (the client's)
  Ring ring;  // the receiver's
  uint32_t sq_depth = 0;

  uint8_t* frame(uint32_t q, uint32_t i) const {
    return buf.p + (size_t{q} * p.ring + i) * ring.stride;
  }
  Notify* notify(uint32_t q, uint32_t i) const {
    return reinterpret_cast<Notify*>(buf.p +
                                     size_t{kQps} * p.ring * ring.stride) +
           (q * p.ring + i);
  }
  uint64_t remote_frame(uint32_t q, uint32_t i) const {
    return ring.addr + (uint64_t{q} * p.ring + i) * ring.stride;
  }
};

inline size_t buffer_bytes(const Params& p, uint32_t stride) {
  return size_t{kQps} * p.ring * (size_t{stride} + sizeof(Notify));
}

int run_sender(Conn& c, const Options& o);
int run_receiver(Conn& c, const Options& o);

}  // namespace netfr
