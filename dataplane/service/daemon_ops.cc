// urnicd's control socket: its own operations (the shim's and the RDMA
// CM's requests go to their servers), answered on the control thread.
#include <rte_cycles.h>

#include <algorithm>
#include <charconv>
#include <random>
#include <sstream>

#include "dataplane/host/gid_table.h"
#include "dataplane/service/daemon.h"
#include "dataplane/service/fault.h"

namespace urnic::service {

uint64_t random_fault_seed() {
  return std::random_device{}() | 1ull << 32;
}

std::string fault_text(const config::FaultConfig& f) {
  config::Config c;
  c.fault = f;
  // dump() writes every section; keep the fault one, flattened.
  std::string out, prefix;
  std::istringstream in(config::dump(c));
  bool in_fault = false;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const size_t indent = line.find_first_not_of(' ');
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = line.substr(indent, colon - indent);
    std::string value = line.substr(colon + 1);
    value.erase(0, value.find_first_not_of(' '));
    if (indent == 0) {
      in_fault = key == "fault";
      continue;
    }
    if (!in_fault) continue;
    if (value.empty()) {
      prefix = key + ".";
      continue;
    }
    out += "fault." + (indent > 2 ? prefix : "") + key + "=" + value + "\n";
  }
  return out;
}

void Daemon::handle(CtlRequest& req, CtlReply& rep) {
  if (CmServer::is_cm_op(static_cast<uint16_t>(req.op))) {
    cm_->handle(req, rep);
    return;
  }
  if (ShimServer::is_shim_op(static_cast<uint16_t>(req.op))) {
    shim_->handle(req, rep);
    return;
  }
  rep.payload = op(req.op, req.body, rep.status);
}

std::string Daemon::op(ctl::Op op, std::string_view body, int& status) {
  switch (op) {
    case ctl::Op::kObjects:
      return shim_->objects_text();
    case ctl::Op::kHello:
      return "urnicd " URNIC_VERSION " proto " + std::to_string(ctl::kVersion);
    case ctl::Op::kStatsText:
    case ctl::Op::kStatsJson: {
      stats::Snapshot s = snapshot();
      std::string out = op == ctl::Op::kStatsJson
                            ? stats::format_json(s, &last_query_)
                            : stats::format_text(s, &last_query_);
      last_query_ = std::move(s);
      return out;
    }
    case ctl::Op::kQpStats:
    case ctl::Op::kQpStatsText:
      return qp_stats(op, body, status);
    case ctl::Op::kGids: {
      const host::GidTable gids(addrs_);
      std::string out;
      for (uint32_t i = 0; i < gids.count; ++i)
        out += std::to_string(i) + " " + host::format_gid(gids.gid[i]) +
               (wire::gid_is_ipv4(gids.gid[i]) ? " RoCEv2 IPv4\n"
                                               : " RoCEv2 IPv6\n");
      return out;
    }
    case ctl::Op::kFault:
      return fault(body, status);
    case ctl::Op::kPing:
      return ping(body, status);
  }
  status = -EOPNOTSUPP;
  return "unknown operation " + std::to_string(static_cast<int>(op));
}

// One page of per-QP rows from QPN `body` on, in QPN order, with the next
// page's first QPN.
std::string Daemon::qp_stats(ctl::Op op, std::string_view body, int& status) {
  // A page stays well under ctl::kMaxMsg (~25 numbers per row).
  constexpr size_t kPage = 256;
  uint32_t from = 0;
  if (!body.empty() &&
      std::from_chars(body.data(), body.data() + body.size(), from).ptr !=
          body.data() + body.size()) {
    status = -EINVAL;
    return "not a QPN: " + std::string(body);
  }
  const auto owners = shim_->qp_owners();
  // Pages in QPN order (the table is not: QPNs carry a generation in their
  // upper bits).
  std::vector<const transport::Qp*> page;
  for (auto& w : workers_)
    w->engine().for_each_qp([&](const transport::Qp& q) {
      if (q.qpn() >= from) page.push_back(&q);
    });
  const auto by_qpn = [](const transport::Qp* a, const transport::Qp* b) {
    return a->qpn() < b->qpn();
  };
  uint32_t next = 0;
  if (page.size() > kPage) {
    std::nth_element(page.begin(), page.begin() + kPage, page.end(), by_qpn);
    next = page[kPage]->qpn();
    page.resize(kPage);
  }
  std::sort(page.begin(), page.end(), by_qpn);
  std::vector<stats::QpRow> rows;
  for (const transport::Qp* qp : page) {
    const transport::Qp& q = *qp;
    stats::QpRow& r = rows.emplace_back();
    r.read(q);
    r.lcore = peers_[workers_[0]->engine().home_of(q.qpn())]->lcore();
    const auto it = std::lower_bound(owners.begin(), owners.end(),
                                     std::pair<uint32_t, pid_t>{q.qpn(), 0});
    if (it != owners.end() && it->first == q.qpn()) r.pid = it->second;
  }
  const stats::Snapshot s = snapshot();
  return op == ctl::Op::kQpStats
             ? stats::format_qps_json(s, rte_get_tsc_hz(), rows, next)
             : stats::format_qps_text(s, rte_get_tsc_hz(), rows, next);
}

// Applies "key=value" words to the fault settings in effect (checked as the
// config file is: unknown keys and out-of-range values are refused, nothing
// changes), then hands them to the lcores, each parked meanwhile. Replies
// with the settings in effect.
std::string Daemon::fault(std::string_view body, int& status) {
  std::vector<std::string> overrides;
  std::istringstream words{std::string(body)};
  for (std::string w; words >> w;)
    overrides.push_back(w.starts_with("fault.") ? w : "fault." + w);
  if (overrides.empty()) return fault_text(fault_);
  config::Config c = cfg_;
  c.fault = fault_;
  try {
    c = config::parse(config::dump(c), "urnicctl fault", overrides);
  } catch (const config::ConfigError& e) {
    status = -EINVAL;
    return e.what();
  }
  // The dump carries the seed in effect, so 0 here was asked for: a new
  // random one, as at start (config/README.md).
  if (!c.fault.seed) c.fault.seed = random_fault_seed();
  fault_ = c.fault;
  for (auto& w : workers_) {
    ParkGuard parked(w->gate());
    w->set_fault(fault_, fault_.seed);
  }
  return fault_text(fault_);
}

std::string Daemon::ping(std::string_view body, int& status) {
  uint32_t ip;
  if (!config::parse_ipv4(std::string(body), ip)) {
    status = -EINVAL;
    return "not an IPv4 address: " + std::string(body);
  }
  auto c = std::make_unique<Command>();
  c->kind = Command::Kind::kPing;
  wire::gid_from_ipv4(ip, c->gid);
  if (!post(std::move(c))) {
    status = -EBUSY;
    return "worker command ring full";
  }
  return "echo request queued to " + std::string(body);
}

stats::Snapshot Daemon::snapshot() {
  stats::Snapshot s;
  s.time_ns = now_ns();
  s.uptime_ns = s.time_ns - t0_;
  s.tsc_hz = rte_get_tsc_hz();
  port_read_stats(port_, s.port);
  // RX-missed: what the NIC missed, or on af_packet what the kernel's ring
  // dropped before the PMD saw it.
  ring_drops_ += port_ring_drops(port_);
  s.port.imissed += ring_drops_;
  s.port.zero_copy_tx = zero_copy_state_;
  for (auto& w : workers_) {
    stats::LcoreSnapshot l;
    l.lcore = w->lcore();
    l.queue = w->queue();
    l.qps = static_cast<uint32_t>(w->engine().qp_count());
    const transport::Engine::CcGauges& g = w->engine().cc_gauges();
    l.cc_shared_window = g.shared_window.get();
    l.cc_in_flight = g.in_flight.get();
    l.cc_active_qps = g.active_qps.get();
    l.cc_waiting_qps = g.waiting_qps.get();
    l.read(w->counters());
    l.read_transport(w->transport_counters());
    s.lcores.push_back(l);
  }
  s.neigh_entries = neigh_->size();
  if (shim_) s.shim = shim_->stats();
  if (cm_)
    for (const auto& kv : cm_->stats()) s.shim.push_back(kv);
  if (ctl_) s.shim.push_back({"control_refusals", ctl_->refused()});
  if (zero_copy_) {
    s.shim.push_back({"zero_copy_views", zero_copy_->views()});
    s.shim.push_back({"zero_copy_map_failures", zero_copy_->map_failures()});
  }
  return s;
}

}  // namespace urnic::service
