// The transport engine's settings from urnicd's configuration (the
// `transport:` section), in one place: urnicd's workers and perf/converge
// (which simulates engines configured exactly as urnicd would) both use
// it. Header-only: needs the config and transport headers, not DPDK.
#pragma once

#include <cstdint>

#include "config/urnic_config.h"
#include "dataplane/transport/engine.h"

namespace urnic::service {

// `line_rate_mbps`: DCQCN's line rate when rpg_max_rate is 0 (the port's
// link speed).
inline transport::EngineConfig engine_config(const config::TransportConfig& t,
                                             uint64_t line_rate_mbps) {
  transport::EngineConfig ec;
  ec.ack_req_every = t.ack_req_every;
  ec.max_unacked = t.max_unacked;
  ec.tx_budget = t.tx_budget;
  ec.tx_quantum = t.tx_quantum;
  ec.poll_budget = t.poll_budget;
  ec.timer_tick_ns = t.timer_tick_us * 1000;
  ec.tail_probe_ns = uint64_t{t.tail_probe_us} * 1000;
  const config::CcConfig& cc = t.cc;
  ec.cc.window = cc.algorithm == "window" || cc.algorithm == "dcqcn";
  ec.cc.dcqcn = cc.algorithm == "dcqcn";
  ec.cc.init_window = cc.init_window;
  ec.cc.min_window = cc.min_window;
  ec.cc.pipe_floor = cc.pipe_floor;
  ec.cc.shared_init_window = cc.shared_init_window;
  ec.cc.shared_min_window = cc.shared_min_window;
  // 0: no ceiling, CcParams' own (2^20).
  if (cc.shared_max_window) ec.cc.shared_max_window = cc.shared_max_window;
  ec.cc.grant = cc.grant;
  ec.cc.ecn = cc.ecn;
  ec.cc.cnp_interval_ns = uint64_t{cc.cnp_interval_us} * 1000;
  const config::DcqcnConfig& d = cc.dcqcn;
  ec.cc.dcqcn_params = {
      .rpg_max_rate = d.rpg_max_rate,
      .rpg_min_rate = d.rpg_min_rate,
      .rate_to_set_on_first_cnp = d.rate_to_set_on_first_cnp,
      .rpg_min_dec_fac = d.rpg_min_dec_fac,
      .rpg_gd = d.rpg_gd,
      .dce_tcp_g = d.dce_tcp_g,
      .dce_tcp_rtt = d.dce_tcp_rtt,
      .initial_alpha_value = d.initial_alpha_value,
      .rate_reduce_monitor_period = d.rate_reduce_monitor_period,
      .rpg_time_reset = d.rpg_time_reset,
      .rpg_byte_reset = d.rpg_byte_reset,
      .rpg_threshold = d.rpg_threshold,
      .rpg_ai_rate = d.rpg_ai_rate,
      .rpg_hai_rate = d.rpg_hai_rate,
      .rpg_time_share_qps = d.rpg_time_share_qps,
  };
  ec.cc.line_rate_mbps = line_rate_mbps;
  ec.cc.pace_burst_bytes = cc.pace_burst_kb * 1024;
  return ec;
}

}  // namespace urnic::service
