// Stats snapshots and their two renderings: testpmd's "NIC statistics"
// layout for people, JSON for scripts. Built on the control thread only.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dataplane/stats/counters.h"
#include "dataplane/transport/engine.h"
#include "dataplane/transport/qp.h"

namespace urnic::stats {

struct PortSnapshot {
  uint16_t port_id = 0;
  std::string name;  // PMD driver name
  // "on", "on (...)" or "off: why" (urnicd decides at start).
  std::string zero_copy_tx;
  bool link_up = false;
  uint32_t link_speed_mbps = 0;
  // rte_eth_stats
  uint64_t ipackets = 0, opackets = 0, ibytes = 0, obytes = 0;
  uint64_t imissed = 0, ierrors = 0, oerrors = 0, rx_nombuf = 0;
  // The mbuf pool: free mbufs (incl. per-lcore caches) of total. An idle
  // service gets back to its idle value; a steady drop is a leak.
  uint64_t mbufs_avail = 0, mbufs_total = 0;
};

struct LcoreSnapshot {
  uint32_t lcore = 0;
  uint16_t queue = 0;
  uint32_t qps = 0;  // QPs homed on this lcore (its engine's)
  // Its engine's shared congestion window: the window, the packets in
  // flight under it, the QPs with packets in flight and those waiting for
  // a grant (transport/engine.h, CcGauges).
  uint64_t cc_shared_window = 0, cc_in_flight = 0, cc_active_qps = 0,
           cc_waiting_qps = 0;
  uint64_t v[kNumCtr] = {};
  uint64_t malformed[kNumMalformed] = {};
  uint64_t transport[transport::kNumECtr] = {};  // the lcore's engine

  uint64_t get(Ctr c) const { return v[static_cast<size_t>(c)]; }
  uint64_t get(wire::Malformed m) const {
    return malformed[static_cast<size_t>(m)];
  }
  void read(const LcoreCounters& c);
  void read_transport(const transport::EngineCounters& c);
};

struct Snapshot {
  uint64_t time_ns = 0;  // CLOCK_MONOTONIC
  uint64_t uptime_ns = 0;
  uint64_t tsc_hz = 0;  // the unit of the lcores' cycle counters
  PortSnapshot port;
  std::vector<LcoreSnapshot> lcores;
  uint32_t neigh_entries = 0;
  // The verbs shim's service side (clients, requests, doorbells, ...), by
  // name; shown when non-empty.
  std::vector<std::pair<const char*, uint64_t>> shim;

  uint64_t total(Ctr c) const;
  uint64_t total(wire::Malformed m) const;
  uint64_t total(transport::ECtr c) const;
};

// One QP's counters (urnicctl qps, urnic-perf --urnicd).
struct QpRow {
  uint32_t qpn = 0;
  int32_t pid = 0;  // the shim client owning it; 0: none
  uint32_t lcore = 0;
  uint64_t v[transport::kNumQpCtr] = {};
  void read(const transport::Qp& qp);
};

// testpmd's layout: totals, then "Throughput (since last show)" against
// `prev` (rates are 0 when prev is null), then urnic's own counters.
std::string format_text(const Snapshot& cur, const Snapshot* prev);
// {"port": {...}, "throughput": {...}, "totals": {...}, "malformed":
//  {...}, "transport": {...}, "shim": {...}, "lcores": [...]} with every
//  counter by name.
std::string format_json(const Snapshot& cur, const Snapshot* prev);

// ctl::Op::kQpStats: {"time_ns", "tsc_hz", "lcores": [poll accounting,
// doorbells, ...], "qp_fields": [names], "qps": [[values in that order]],
// "next": QPN to ask for next or 0}. One page of QPs (the caller pages).
std::string format_qps_json(const Snapshot& cur, uint64_t tsc_hz,
                            const std::vector<QpRow>& rows, uint32_t next);
// The same for people: a per-lcore busy line each, then one row per QP.
std::string format_qps_text(const Snapshot& cur, uint64_t tsc_hz,
                            const std::vector<QpRow>& rows, uint32_t next);

}  // namespace urnic::stats
