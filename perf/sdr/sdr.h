// sdr: what main.cc hands to the two roles once the QP is connected.
#pragma once

#include <infiniband/verbs.h>

#include <memory>

#include "perf/sdr/protocol.h"
#include "perf/seeds_cm.h"
#include "perf/seeds_common.h"
#include "perf/seeds_tcp.h"
#include "perf/seeds_verbs.h"

namespace sdr {

struct Options {
  seeds::Common common;
  Params p;
  uint32_t drop_ppm = 0;  // sender: chunk posts skipped on purpose
  uint64_t seed = 1;      // of the drop decisions
};

struct Conn {
  seeds::Device dev;
  std::unique_ptr<seeds::Cm> cm;       // --cm
  std::unique_ptr<seeds::Channel> ch;  // TCP, or SENDs with --cm
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  seeds::Buffer buf;     // receiver: the root MR (slot table); sender: sources
  Params p;              // as agreed (the client's)
  Table table;           // the receiver's (its root MR, stride, chunk size)
  uint32_t nchunks = 0;  // chunks per message
  uint32_t rq_depth = 0;
  uint32_t sq_depth = 0;
};

int run_sender(Conn& c, const Options& o);
int run_receiver(Conn& c, const Options& o);

inline const char* mode(const Params& p) {
  return p.uc ? "UC" : "RC";
}

}  // namespace sdr
