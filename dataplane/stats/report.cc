#include "dataplane/stats/report.h"

#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace urnic::stats {
namespace {

struct Rates {
  uint64_t rx_pps = 0, rx_bps = 0, tx_pps = 0, tx_bps = 0;
};

Rates rates(const Snapshot& cur, const Snapshot* prev) {
  Rates r;
  if (!prev || cur.time_ns <= prev->time_ns) return r;
  const double dt = static_cast<double>(cur.time_ns - prev->time_ns) / 1e9;
  auto per_s = [dt](uint64_t a, uint64_t b) {
    return a >= b ? static_cast<uint64_t>(static_cast<double>(a - b) / dt) : 0;
  };
  r.rx_pps = per_s(cur.port.ipackets, prev->port.ipackets);
  r.tx_pps = per_s(cur.port.opackets, prev->port.opackets);
  r.rx_bps = per_s(cur.port.ibytes, prev->port.ibytes) * 8;
  r.tx_bps = per_s(cur.port.obytes, prev->port.obytes) * 8;
  return r;
}

void appendf(std::string& s, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));
void appendf(std::string& s, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  const int n = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n > 0)
    s.append(buf, std::min<size_t>(static_cast<size_t>(n), sizeof buf - 1));
}

// The lcore's shared congestion window, as JSON fields.
void append_cc(std::string& s, const LcoreSnapshot& l) {
  appendf(s,
          ",\"cc_shared_window\":%" PRIu64 ",\"cc_in_flight\":%" PRIu64
          ",\"cc_active_qps\":%" PRIu64 ",\"cc_waiting_qps\":%" PRIu64,
          l.cc_shared_window, l.cc_in_flight, l.cc_active_qps,
          l.cc_waiting_qps);
}

}  // namespace

void LcoreSnapshot::read(const LcoreCounters& c) {
  for (size_t i = 0; i < kNumCtr; ++i)
    v[i] = c.v[i].load(std::memory_order_relaxed);
  for (size_t i = 0; i < kNumMalformed; ++i)
    malformed[i] = c.malformed[i].load(std::memory_order_relaxed);
}

void LcoreSnapshot::read_transport(const transport::EngineCounters& c) {
  for (size_t i = 0; i < transport::kNumECtr; ++i)
    transport[i] = c.get(static_cast<transport::ECtr>(i));
}

uint64_t Snapshot::total(transport::ECtr c) const {
  uint64_t t = 0;
  for (const auto& l : lcores) t += l.transport[static_cast<size_t>(c)];
  return t;
}

uint64_t Snapshot::total(Ctr c) const {
  uint64_t t = 0;
  for (const auto& l : lcores) t += l.get(c);
  return t;
}
uint64_t Snapshot::total(wire::Malformed m) const {
  uint64_t t = 0;
  for (const auto& l : lcores) t += l.get(m);
  return t;
}

std::string format_text(const Snapshot& cur, const Snapshot* prev) {
  const PortSnapshot& p = cur.port;
  const Rates r = rates(cur, prev);
  std::string s;
  appendf(s,
          "\n  ######################## NIC statistics for port %-2u "
          "#########################\n",
          p.port_id);
  appendf(s,
          "  RX-packets: %-10" PRIu64 " RX-missed: %-10" PRIu64
          " RX-bytes:  %-" PRIu64 "\n",
          p.ipackets, p.imissed, p.ibytes);
  appendf(s, "  RX-errors: %" PRIu64 "\n", p.ierrors);
  appendf(s, "  RX-nombuf:  %-10" PRIu64 "\n", p.rx_nombuf);
  appendf(s,
          "  TX-packets: %-10" PRIu64 " TX-errors: %-10" PRIu64
          " TX-bytes:  %-" PRIu64 "\n",
          p.opackets, p.oerrors, p.obytes);
  appendf(s, "\n  Throughput (since last show)\n");
  appendf(s, "  Rx-pps: %12" PRIu64 "          Rx-bps: %12" PRIu64 "\n",
          r.rx_pps, r.rx_bps);
  appendf(s, "  Tx-pps: %12" PRIu64 "          Tx-bps: %12" PRIu64 "\n",
          r.tx_pps, r.tx_bps);
  appendf(s,
          "  ---------------------- urnic (%s, link %s %u Mb/s) "
          "----------------------\n",
          p.name.c_str(), p.link_up ? "up" : "down", p.link_speed_mbps);
  appendf(s,
          "  RoCE-rx: %-10" PRIu64 " ICRC-errors: %-8" PRIu64
          " Malformed: %-8" PRIu64 " Non-RoCE: %" PRIu64 "\n",
          cur.total(Ctr::roce_rx), cur.total(wire::Malformed::kBadIcrc),
          cur.total(Ctr::malformed),
          cur.total(Ctr::non_roce_ignored) + cur.total(Ctr::other_l2));
  appendf(s,
          "  ARP req/rep rx: %" PRIu64 "/%" PRIu64 "  tx: %" PRIu64 "/%" PRIu64
          "   ICMP echo: %" PRIu64 "  ICMPv6 echo: %" PRIu64
          "  ND ns/na: %" PRIu64 "/%" PRIu64 "  neigh: %u\n",
          cur.total(Ctr::arp_rx_request), cur.total(Ctr::arp_rx_reply),
          cur.total(Ctr::arp_tx_request), cur.total(Ctr::arp_tx_reply),
          cur.total(Ctr::icmp_echo_rx), cur.total(Ctr::icmp6_echo_rx),
          cur.total(Ctr::nd_rx_ns), cur.total(Ctr::nd_tx_na),
          cur.neigh_entries);
  for (size_t m = 1; m < kNumMalformed; ++m) {
    const auto why = static_cast<wire::Malformed>(m);
    if (const uint64_t n = cur.total(why))
      appendf(s, "  malformed %-20s %" PRIu64 "\n", wire::malformed_name(why),
              n);
  }
  // Transport counters that moved (all of them are in the JSON).
  bool any = false;
  for (size_t i = 0; i < transport::kNumECtr; ++i) {
    const uint64_t n = cur.total(static_cast<transport::ECtr>(i));
    if (!n) continue;
    appendf(s, "%s%s %" PRIu64,
            any ? "  " : "  transport: ", transport::kECtrNames[i], n);
    any = true;
  }
  if (any) s += "\n";
  // Fault injection (config fault, urnicctl fault): what it did, if anything.
  any = false;
  for (auto i = static_cast<size_t>(Ctr::rx_fault_drop);
       i <= static_cast<size_t>(Ctr::tx_fault_ce_marked); ++i) {
    const uint64_t n = cur.total(static_cast<Ctr>(i));
    if (!n) continue;
    appendf(s, "%s%s %" PRIu64, any ? "  " : "  fault: ", kCtrNames[i], n);
    any = true;
  }
  if (any) s += "\n";
  if (!p.zero_copy_tx.empty())
    appendf(s,
            "  zero-copy TX: %s; payload copied %" PRIu64
            " B, referenced %" PRIu64 " B\n",
            p.zero_copy_tx.c_str(), cur.total(Ctr::tx_copy_bytes),
            cur.total(Ctr::tx_zero_copy_bytes));
  for (size_t i = 0; i < cur.shim.size(); ++i)
    appendf(s, "%s%s %" PRIu64 "%s", i ? "  " : "  shim: ", cur.shim[i].first,
            cur.shim[i].second, i + 1 == cur.shim.size() ? "\n" : "");
  for (const LcoreSnapshot& l : cur.lcores) {
    const uint64_t busy = l.get(Ctr::cycles_busy);
    const uint64_t all = busy + l.get(Ctr::cycles_idle);
    appendf(s,
            "  lcore %-3u queue %-2u QPs %-6u rx %-10" PRIu64 " tx %-10" PRIu64
            " tx-drop %-6" PRIu64 " busy %5.1f%%\n",
            l.lcore, l.queue, l.qps, l.get(Ctr::rx_packets),
            l.get(Ctr::tx_packets), l.get(Ctr::tx_dropped),
            all ? 100.0 * static_cast<double>(busy) / static_cast<double>(all)
                : 0.0);
  }
  appendf(s,
          "  ####################################################"
          "########################\n");
  return s;
}

std::string format_json(const Snapshot& cur, const Snapshot* prev) {
  const PortSnapshot& p = cur.port;
  const Rates r = rates(cur, prev);
  std::string s = "{";
  appendf(s,
          "\"uptime_ns\":%" PRIu64 ",\"tsc_hz\":%" PRIu64
          ",\"port\":{\"id\":%u,\"driver\":\"",
          cur.uptime_ns, cur.tsc_hz, p.port_id);
  // Driver names are identifiers and the zero-copy state urnicd's own
  // text; both escaped defensively.
  auto put = [&s](const std::string& text) {
    for (char ch : text)
      if (ch != '"' && ch != '\\' && static_cast<unsigned char>(ch) >= 0x20)
        s += ch;
  };
  put(p.name);
  s += "\",\"zero_copy_tx\":\"";
  put(p.zero_copy_tx);
  appendf(s, "\",\"link_up\":%s,\"link_speed_mbps\":%u,",
          p.link_up ? "true" : "false", p.link_speed_mbps);
  appendf(s,
          "\"rx_packets\":%" PRIu64 ",\"rx_missed\":%" PRIu64
          ",\"rx_bytes\":%" PRIu64 ",\"rx_errors\":%" PRIu64
          ",\"rx_nombuf\":%" PRIu64 ",\"tx_packets\":%" PRIu64
          ",\"tx_errors\":%" PRIu64 ",\"tx_bytes\":%" PRIu64
          ",\"mbufs_avail\":%" PRIu64 ",\"mbufs_total\":%" PRIu64 "},",
          p.ipackets, p.imissed, p.ibytes, p.ierrors, p.rx_nombuf, p.opackets,
          p.oerrors, p.obytes, p.mbufs_avail, p.mbufs_total);
  appendf(s,
          "\"throughput\":{\"rx_pps\":%" PRIu64 ",\"rx_bps\":%" PRIu64
          ",\"tx_pps\":%" PRIu64 ",\"tx_bps\":%" PRIu64 "},",
          r.rx_pps, r.rx_bps, r.tx_pps, r.tx_bps);
  appendf(s, "\"neigh_entries\":%u,\"totals\":{", cur.neigh_entries);
  for (size_t i = 0; i < kNumCtr; ++i)
    appendf(s, "%s\"%s\":%" PRIu64, i ? "," : "", kCtrNames[i],
            cur.total(static_cast<Ctr>(i)));
  s += "},\"malformed\":{";
  for (size_t m = 1; m < kNumMalformed; ++m) {
    const auto why = static_cast<wire::Malformed>(m);
    appendf(s, "%s\"%s\":%" PRIu64, m > 1 ? "," : "", wire::malformed_name(why),
            cur.total(why));
  }
  s += "},\"transport\":{";
  for (size_t i = 0; i < transport::kNumECtr; ++i)
    appendf(s, "%s\"%s\":%" PRIu64, i ? "," : "", transport::kECtrNames[i],
            cur.total(static_cast<transport::ECtr>(i)));
  s += "},\"shim\":{";
  for (size_t i = 0; i < cur.shim.size(); ++i)
    appendf(s, "%s\"%s\":%" PRIu64, i ? "," : "", cur.shim[i].first,
            cur.shim[i].second);
  s += "},\"lcores\":[";
  for (size_t k = 0; k < cur.lcores.size(); ++k) {
    const LcoreSnapshot& l = cur.lcores[k];
    appendf(s, "%s{\"lcore\":%u,\"queue\":%u,\"qps\":%u", k ? "," : "", l.lcore,
            l.queue, l.qps);
    append_cc(s, l);
    for (size_t i = 0; i < kNumCtr; ++i)
      appendf(s, ",\"%s\":%" PRIu64, kCtrNames[i], l.v[i]);
    s += "}";
  }
  s += "]}\n";
  return s;
}

void QpRow::read(const transport::Qp& qp) {
  qpn = qp.qpn();
  size_t i = 0;
  qp.counters().for_each([&](const char*, uint64_t x) { v[i++] = x; });
}

namespace {

double busy_pct(const LcoreSnapshot& l) {
  const uint64_t b = l.get(Ctr::cycles_busy), i = l.get(Ctr::cycles_idle);
  return b + i ? 100.0 * static_cast<double>(b) / static_cast<double>(b + i)
               : 0.0;
}

}  // namespace

std::string format_qps_json(const Snapshot& cur, uint64_t tsc_hz,
                            const std::vector<QpRow>& rows, uint32_t next) {
  std::string s;
  appendf(s, "{\"time_ns\":%" PRIu64 ",\"tsc_hz\":%" PRIu64 ",\"lcores\":[",
          cur.time_ns, tsc_hz);
  constexpr Ctr kLcoreFields[] = {
      Ctr::poll_busy, Ctr::poll_idle, Ctr::cycles_busy, Ctr::cycles_idle,
      Ctr::doorbells, Ctr::shim_wqes, Ctr::rx_packets,  Ctr::tx_packets};
  for (size_t k = 0; k < cur.lcores.size(); ++k) {
    const LcoreSnapshot& l = cur.lcores[k];
    appendf(s, "%s{\"lcore\":%u,\"qps\":%u", k ? "," : "", l.lcore, l.qps);
    append_cc(s, l);
    for (Ctr c : kLcoreFields)
      appendf(s, ",\"%s\":%" PRIu64, kCtrNames[static_cast<size_t>(c)],
              l.get(c));
    s += "}";
  }
  s += "],\"qp_fields\":[\"qpn\",\"pid\",\"lcore\"";
  for (const char* n : transport::kQpCtrNames) appendf(s, ",\"%s\"", n);
  // nak_cause is an index into this list (qp.h, URNIC_RESP_RESULTS).
  s += "],\"nak_causes\":[";
  for (size_t k = 0; k < transport::kNumRespResults; ++k)
    appendf(s, "%s\"%s\"", k ? "," : "", transport::kRespResultNames[k]);
  s += "],\"qps\":[";
  for (size_t k = 0; k < rows.size(); ++k) {
    const QpRow& q = rows[k];
    appendf(s, "%s[%u,%d,%u", k ? "," : "", q.qpn, q.pid, q.lcore);
    for (uint64_t v : q.v) appendf(s, ",%" PRIu64, v);
    s += "]";
  }
  appendf(s, "],\"next\":%u}\n", next);
  return s;
}

std::string format_qps_text(const Snapshot& cur, uint64_t tsc_hz,
                            const std::vector<QpRow>& rows, uint32_t next) {
  std::string s;
  (void)tsc_hz;
  for (const LcoreSnapshot& l : cur.lcores)
    appendf(s,
            "lcore %u: %u QPs, busy %.1f%% (polls busy %" PRIu64
            " idle %" PRIu64 "), doorbells %" PRIu64 ", shim WQEs %" PRIu64
            "; shared window %" PRIu64 ", in flight %" PRIu64 " (%" PRIu64
            " QPs, %" PRIu64 " waiting)\n",
            l.lcore, l.qps, busy_pct(l), l.get(Ctr::poll_busy),
            l.get(Ctr::poll_idle), l.get(Ctr::doorbells), l.get(Ctr::shim_wqes),
            l.cc_shared_window, l.cc_in_flight, l.cc_active_qps,
            l.cc_waiting_qps);
  using transport::kNumQpCtr;
  auto at = [](const QpRow& q, const char* name) -> uint64_t {
    for (size_t i = 0; i < kNumQpCtr; ++i)
      if (std::strcmp(transport::kQpCtrNames[i], name) == 0) return q.v[i];
    return 0;
  };
  auto sum = [&](const QpRow& q, const char* dir) {
    uint64_t n = 0;
    for (const char* t : {"seq", "rnr", "access", "inv_req", "op"})
      n += at(q, ("naks_" + std::string(t) + "_" + dir).c_str());
    return n;
  };
  appendf(s,
          "%8s %7s %5s %12s %12s %8s %6s %6s %8s %8s %10s %10s %7s %7s %5s "
          "%5s %6s %8s %7s %7s %7s %6s  %s\n",
          "qpn", "pid", "lcore", "tx_pkts", "rx_pkts", "retx", "tmo", "rnr",
          "dup", "oos", "acks_tx", "acks_rx", "nak_rx", "nak_tx", "cqovf",
          "cwnd", "cuts", "srtt_us", "cnp_tx", "cnp_rx", "rate", "rcuts",
          "nak_cause");
  for (const QpRow& q : rows) {
    // DCQCN rate in Mb/s; "-" while the QP is not rate-limited.
    char rate[24] = "-";
    if (const uint64_t r = at(q, "cc_rate_mbps"))
      snprintf(rate, sizeof rate, "%" PRIu64, r);
    // Why the QP last refused a request (its fatal NAK); "-" if never.
    const uint64_t why = at(q, "nak_cause");
    const char* cause = why == 0 ? "-"
                        : why < transport::kNumRespResults
                            ? transport::kRespResultNames[why]
                            : "?";
    appendf(s,
            "%#8x %7d %5u %12" PRIu64 " %12" PRIu64 " %8" PRIu64 " %6" PRIu64
            " %6" PRIu64 " %8" PRIu64 " %8" PRIu64 " %10" PRIu64 " %10" PRIu64
            " %7" PRIu64 " %7" PRIu64 " %5" PRIu64 " %5" PRIu64 " %6" PRIu64
            " %8" PRIu64 " %7" PRIu64 " %7" PRIu64 " %7s %6" PRIu64 "  %s\n",
            q.qpn, q.pid, q.lcore, at(q, "tx_packets"), at(q, "rx_packets"),
            at(q, "retransmits"), at(q, "timeouts"), at(q, "rnr_waits"),
            at(q, "dup_packets"), at(q, "out_of_seq"), at(q, "acks_tx"),
            at(q, "acks_rx"), sum(q, "rx"), sum(q, "tx"), at(q, "cq_overflows"),
            at(q, "cc_window"), at(q, "cc_window_cuts"), at(q, "srtt_us"),
            at(q, "cnps_tx"), at(q, "cnps_rx"), rate, at(q, "cc_rate_cuts"),
            cause);
  }
  if (next) appendf(s, "next %u\n", next);
  return s;
}

}  // namespace urnic::stats
