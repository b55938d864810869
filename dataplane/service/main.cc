// urnicd: owns one Ethernet port through DPDK, runs the worker lcores, and
// serves the control socket and periodic stats from the main lcore.
#include <arpa/inet.h>
#include <getopt.h>
#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_lcore.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <thread>

#include "dataplane/service/cm_server.h"
#include "dataplane/service/control.h"
#include "dataplane/service/service.h"

using namespace urnic;
using namespace urnic::service;

namespace {

void usage(FILE* f) {
  fprintf(f,
          "usage: urnicd [-c FILE] [-o key=value]... [--check-config] "
          "[--print-config]\n"
          "  -c FILE          configuration (default: the embedded demo "
          "config)\n"
          "  -o key=value     override one key, e.g. -o eal.file_prefix=x\n"
          "  --check-config   validate the configuration and exit\n"
          "  --print-config   print the effective configuration and exit\n");
}

void on_signal(int) {
  g_quit.store(true);
}

// GID -> MAC for the transport (create_ah, modify_qp): the neighbour cache
// only, never waiting (it runs while worker lcores are parked);
// ShimEnv::warm_neighbour fills the cache first.
class NeighbourResolver final : public transport::Resolver {
 public:
  explicit NeighbourResolver(const host::NeighbourTable& nt) : nt_(nt) {}
  int resolve(const uint8_t dgid[16], wire::MacAddr* mac) override {
    return nt_.lookup(dgid, now_ns(), *mac) == host::Lookup::kHit
               ? 0
               : EHOSTUNREACH;
  }

 private:
  const host::NeighbourTable& nt_;
};

// The attributes ibv_query_device / ibv_query_port report: the service's
// configured limits, as they are.
shim::OpenRep shim_info(const transport::DeviceConfig& dc) {
  shim::OpenRep r;
  const transport::Limits& l = dc.limits;
  ibv_device_attr& d = r.device;
  snprintf(d.fw_ver, sizeof d.fw_ver, "urnic %s", URNIC_VERSION);
  // EUI-64 from the MAC (as RoCE HCAs derive theirs), network byte order.
  const uint8_t* m = dc.mac.b;
  const uint8_t g[8] = {
      static_cast<uint8_t>(m[0] ^ 2), m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]};
  std::memcpy(&r.node_guid, g, 8);
  d.node_guid = d.sys_image_guid = r.node_guid;
  d.max_mr_size = l.max_mr_size;
  d.page_size_cap = 4096;
  // 0x02554e ("\x02UN"): the 0x02 bit of the first octet makes it a
  // locally administered identifier, a value the IEEE never assigns as an
  // OUI, so no vendor's special cases (UCX's, perftest's) apply; 0 looked
  // like "no device" and rxe's 0xffffff would take rxe's.
  d.vendor_id = 0x02554e;
  d.vendor_part_id = 1;
  d.hw_ver = 1;
  d.max_qp = static_cast<int>(l.max_qp);
  d.max_qp_wr = static_cast<int>(l.max_qp_wr);
  // Memory windows: type 1 and type 2B (bound to a QP and its PD).
  d.device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN |
                       IBV_DEVICE_PORT_ACTIVE_EVENT | IBV_DEVICE_MEM_WINDOW |
                       IBV_DEVICE_MEM_WINDOW_TYPE_2B;
  d.max_sge = d.max_sge_rd = static_cast<int>(l.max_sge);
  d.max_cq = static_cast<int>(l.max_cq);
  d.max_cqe = static_cast<int>(l.max_cqe);
  d.max_mr = static_cast<int>(l.max_mr);
  d.max_mw = static_cast<int>(l.max_mr);  // windows share the MR key limit
  d.max_pd = static_cast<int>(l.max_pd);
  d.max_qp_rd_atom = l.max_dest_rd_atomic;
  d.max_qp_init_rd_atom = l.max_rd_atomic;
  d.max_res_rd_atom = static_cast<int>(l.max_qp) * l.max_dest_rd_atomic;
  d.atomic_cap = IBV_ATOMIC_HCA;
  d.max_ah = static_cast<int>(l.max_ah);
  d.max_srq = static_cast<int>(l.max_srq);
  d.max_srq_wr = static_cast<int>(l.max_srq_wr);
  d.max_srq_sge = static_cast<int>(l.max_sge);
  d.max_pkeys = 1;
  d.local_ca_ack_delay = 15;
  d.phys_port_cnt = 1;
  ibv_port_attr& p = r.port;
  p.state = IBV_PORT_ACTIVE;
  p.max_mtu = IBV_MTU_4096;
  p.active_mtu = dc.active_mtu;
  p.gid_tbl_len = dc.num_gids;
  p.port_cap_flags = 0;
  p.max_msg_sz = l.max_msg_sz;
  p.pkey_tbl_len = 1;
  p.lid = 0;
  p.sm_lid = 0;
  p.lmc = 0;
  p.max_vl_num = 1;
  p.active_width = 2;  // 4X
  p.active_speed = 1;  // SDR: the numbers describe nothing real
  p.phys_state = 5;    // LinkUp
  p.link_layer = IBV_LINK_LAYER_ETHERNET;
  r.num_gids = dc.num_gids;
  for (uint32_t i = 0; i < dc.num_gids; ++i) {
    std::memcpy(r.gids[i], dc.gids[i], 16);
    r.gid_is_ipv4[i] = wire::gid_is_ipv4(dc.gids[i]);
  }
  std::memcpy(r.mac, dc.mac.b, 6);
  snprintf(r.service_version, sizeof r.service_version, "%s", URNIC_VERSION);
  return r;
}

// "fault.key=value" lines, the whole fault section.
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

// The kFault operation: applies "key=value" words to the settings in
// effect (checked as the config file is: unknown keys and out-of-range
// values are refused, nothing changes), then `apply()` hands them to the
// lcores. Replies with the settings in effect.
template <class Apply>
std::string fault_request(const config::Config& cfg, std::string_view body,
                          config::FaultConfig& fault, int& status,
                          Apply&& apply) {
  std::vector<std::string> overrides;
  std::istringstream words{std::string(body)};
  for (std::string w; words >> w;)
    overrides.push_back(w.starts_with("fault.") ? w : "fault." + w);
  if (overrides.empty()) return fault_text(fault);
  config::Config c = cfg;
  c.fault = fault;
  try {
    c = config::parse(config::dump(c), "urnicctl fault", overrides);
  } catch (const config::ConfigError& e) {
    status = -EINVAL;
    return e.what();
  }
  if (!c.fault.seed) c.fault.seed = fault.seed;
  fault = c.fault;
  apply();
  return fault_text(fault);
}

host::HostAddrs make_addrs(const config::Config& cfg, const PortInfo& p) {
  host::HostAddrs h;
  rte_ether_addr mac;
  rte_eth_macaddr_get(p.port_id, &mac);
  std::memcpy(h.mac.b, mac.addr_bytes, 6);
  h.ipv4 = cfg.port.ipv4.addr;
  h.ipv4_prefix = cfg.port.ipv4.prefix;
  h.ttl = cfg.port.ttl;
  if (cfg.port.ipv6.present) {
    h.has_ipv6 = true;
    std::memcpy(h.ipv6, cfg.port.ipv6.addr, 16);
    host::ipv6_link_local(h.mac, h.ipv6_ll);
  }
  h.kernel_gid_layout = cfg.port.gid_layout == "kernel";
  return h;
}

// A configuration EAL accepted but urnicd cannot run is refused here, before
// any port or lcore starts (a worker lcore that does not exist would never
// answer a park and would hang the control thread). Empty: fine.
std::string check_eal(const config::Config& cfg,
                      const std::vector<std::string>& args, int parsed) {
  // rte_eal_init stops at the first argument it does not take; what is
  // left was meant for EAL (a YAML list split where a quoted string was
  // meant, e.g. [--lcores=0@0,1@1]).
  if (static_cast<size_t>(parsed) + 1 < args.size())
    return "EAL did not take argument '" + args[parsed + 1] +
           "' (from eal.extra_args: quote an option whose value has commas, "
           "e.g. eal.extra_args=['--lcores=0@0,1@1'])";
  for (uint32_t w : cfg.eal.workers) {
    if (w == rte_get_main_lcore())
      return "worker lcore " + std::to_string(w) +
             " is the main lcore (eal.main_lcore)";
    if (w >= RTE_MAX_LCORE || !rte_lcore_is_enabled(w))
      return "worker lcore " + std::to_string(w) +
             " is not an EAL lcore (eal.workers lists lcores; an --lcores in "
             "eal.extra_args must define each of them)";
  }
  return {};
}

int run(const config::Config& cfg, char* prog) {
  std::vector<std::string> args = eal_args(cfg, prog);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int parsed = rte_eal_init(static_cast<int>(args.size()), argv.data());
  if (parsed < 0) {
    fprintf(stderr, "urnicd: EAL initialisation failed: %s\n",
            rte_strerror(rte_errno));
    return 1;
  }
  if (const std::string why = check_eal(cfg, args, parsed); !why.empty()) {
    fprintf(stderr, "urnicd: %s\n", why.c_str());
    rte_eal_cleanup();
    return 2;
  }
  int rc = 0;
  {
    // Declared before `workers` (destroyed after them) and outside the try,
    // so a worker lcore never sees them go away while it still runs.
    PortInfo port;
    host::HostAddrs addrs;
    std::unique_ptr<host::NeighbourTable> neigh;
    std::unique_ptr<NeighbourResolver> resolver;
    std::unique_ptr<transport::Device> device;
    std::vector<std::unique_ptr<Worker>> workers;
    std::vector<Worker*> peers;  // workers by home index
    std::unique_ptr<ZeroCopyTx> zero_copy;
    std::unique_ptr<ShimServer> shim;
    std::unique_ptr<CmServer> cm;
    rte_ring* gsi = nullptr;  // QP1 frames, workers -> control thread
    // After `shim`: closing a connection releases that client's objects in
    // the shim, so the connections must close first.
    std::unique_ptr<ControlServer> ctl;
    // Tear-down order on every path: lcores stop, clients are told and
    // disconnected, then objects, workers and the port go.
    auto teardown = [&] {
      g_quit.store(true);
      rte_eal_mp_wait_lcore();
      if (shim) shim->shutdown();
      if (cm) cm->shutdown(now_ns());
      ctl.reset();
      shim.reset();  // releases what is left (lcores stopped)
      cm.reset();
      if (gsi) {
        void* m = nullptr;
        while (rte_ring_dequeue(gsi, &m) == 0)
          rte_pktmbuf_free(static_cast<rte_mbuf*>(m));
        rte_ring_free(gsi);
        gsi = nullptr;
      }
      workers.clear();
      if (port.started) port_teardown(port);
    };
    try {
      port = port_setup(cfg);
      addrs = make_addrs(cfg, port);
      host::NeighbourParams np;
      np.entries = cfg.arp.entries;
      np.reachable_ns = uint64_t{cfg.arp.reachable_ms} * 1'000'000;
      np.retry_ns = uint64_t{cfg.arp.retry_ms} * 1'000'000;
      np.retries = cfg.arp.retries;
      neigh = std::make_unique<host::NeighbourTable>(np);
      resolver = std::make_unique<NeighbourResolver>(*neigh);
      const transport::DeviceConfig dc = device_config(cfg, port, addrs);
      device = std::make_unique<transport::Device>(dc, resolver.get());
      // One worker per queue; each is the home of some QPs (the QPN says
      // whose: Engine::home_of).
      for (uint16_t q = 0; q < port.nb_queues; ++q)
        workers.push_back(std::make_unique<Worker>(cfg, port, addrs, *neigh,
                                                   *device, cfg.eal.workers[q],
                                                   q, port.nb_queues));
      for (auto& w : workers) peers.push_back(w.get());
      // Fault injection: the settings in effect and their seed (0 in the
      // config: a random one, printed so that a run can be replayed).
      config::FaultConfig fault = cfg.fault;
      if (!fault.seed) fault.seed = std::random_device{}() | 1ull << 32;
      for (auto& w : workers) w->set_fault(fault, fault.seed);
      if (fault_on(fault.rx) || fault_on(fault.tx))
        printf("urnicd: fault injection on (seed %" PRIu64 "):\n%s", fault.seed,
               fault_text(fault).c_str());
      std::deque<std::unique_ptr<Command>> commands;
      ShimEnv env;
      env.dev = device.get();
      for (auto& w : workers) {
        env.engines.push_back(&w->engine());
        env.gates.push_back(&w->gate());
      }
      env.info = shim_info(dc);
      env.client_limits = cfg.client_limits;
      env.port_state = [&](ibv_port_attr& pa) {
        stats::PortSnapshot ps;
        port_read_link(port, ps);
        pa.state = ps.link_up ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
        pa.phys_state = ps.link_up ? 5 : 3;  // LinkUp : Disabled
      };
      // Asks worker 0 to resolve (at the first attempt and every 500th:
      // about once a second at the control server's 2 ms retries) and says
      // whether the cache has the MAC yet. A verbs client's
      // modify_qp/create_ah waits for its reply, as on a kernel HCA, while
      // every other client is served.
      env.warm_neighbour = [&](const uint8_t dgid[16], uint32_t attempt,
                               uint64_t since_ns) -> int {
        for (uint32_t i = 0; i < dc.num_gids; ++i)
          if (std::memcmp(dc.gids[i], dgid, 16) == 0) return 0;
        wire::MacAddr mac;
        const uint64_t now = now_ns();
        if (neigh->lookup(dgid, now, mac) == host::Lookup::kHit) return 0;
        if (now - since_ns >= 3'000'000'000ull || g_quit.load())
          return EHOSTUNREACH;
        if (attempt % 500 == 0) {
          auto c = std::make_unique<Command>();
          c->kind = Command::Kind::kResolve;
          std::memcpy(c->gid, dgid, 16);
          if (workers[0]->post(c.get())) commands.push_back(std::move(c));
        }
        return EINPROGRESS;
      };
      // Vdevs transmit from the application's pages directly; PCI ports
      // would need the pages DMA-mapped (rte_extmem_register): they copy.
      if (cfg.port.pci.empty() && cfg.transport.zero_copy_tx) {
        zero_copy = std::make_unique<ZeroCopyTx>();
        env.tx_memory = zero_copy.get();
        for (auto& w : workers) w->set_zero_copy(zero_copy.get());
      }
      shim = std::make_unique<ShimServer>(std::move(env));
      for (auto& w : workers) w->serve(shim.get(), peers);
      // RDMA CM: MADs for QP1 reach the control thread by ring; the ones
      // it sends leave through worker 0 as commands.
      gsi = rte_ring_create("urnic_gsi", 1024, SOCKET_ID_ANY, RING_F_SC_DEQ);
      if (!gsi)
        throw std::runtime_error("GSI ring: " +
                                 std::string(rte_strerror(rte_errno)));
      for (auto& w : workers) w->set_gsi(gsi);
      {
        CmEnv ce;
        ce.addrs = addrs;
        uint8_t g4[16];
        wire::gid_from_ipv4(addrs.ipv4, g4);
        ce.sgid_index = host::GidTable(addrs).find(g4);
        ce.node_guid = shim_info(dc).node_guid;
        ce.active_mtu = static_cast<uint8_t>(dc.active_mtu);
        ce.vlan_tci = cfg.port.vlan;
        ce.send_frame = [&](const uint8_t dgid[16], const uint8_t* frame,
                            uint32_t len) {
          rte_mbuf* m = rte_pktmbuf_alloc(port.pool);
          if (!m) return false;
          char* p = rte_pktmbuf_append(m, static_cast<uint16_t>(len));
          if (!p) {
            rte_pktmbuf_free(m);
            return false;
          }
          std::memcpy(p, frame, len);
          auto c = std::make_unique<Command>();
          c->kind = Command::Kind::kSendFrame;
          std::memcpy(c->gid, dgid, 16);
          c->frame = m;
          if (!workers[0]->post(c.get())) return false;  // c frees m
          commands.push_back(std::move(c));
          return true;
        };
        ce.neighbour = [&,
                        asked = std::map<std::array<uint8_t, 16>, uint64_t>{}](
                           const uint8_t dgid[16]) mutable -> int {
          wire::MacAddr mac;
          const uint64_t now = now_ns();
          if (neigh->lookup(dgid, now, mac) == host::Lookup::kHit) return 0;
          // The worker retries a resolution itself; asking again only
          // restarts one that failed (a few times a second is plenty).
          std::array<uint8_t, 16> g;
          std::memcpy(g.data(), dgid, 16);
          std::erase_if(asked, [&](const auto& kv) {
            return now - kv.second > 1'000'000'000;
          });
          if (auto it = asked.find(g);
              it != asked.end() && now - it->second < 200'000'000)
            return EINPROGRESS;
          asked[g] = now;
          auto c = std::make_unique<Command>();
          c->kind = Command::Kind::kResolve;
          std::memcpy(c->gid, dgid, 16);
          if (workers[0]->post(c.get())) commands.push_back(std::move(c));
          return EINPROGRESS;
        };
        cm = std::make_unique<CmServer>(std::move(ce));
      }
      printf(
          "urnicd: port %u (%s) mac %02x:%02x:%02x:%02x:%02x:%02x mtu %u "
          "queues %u%s ipv4 %s/%u%s%s\n",
          port.port_id, port.driver.c_str(), addrs.mac.b[0], addrs.mac.b[1],
          addrs.mac.b[2], addrs.mac.b[3], addrs.mac.b[4], addrs.mac.b[5],
          port.mtu, port.nb_queues,
          port.nb_queues < 2 ? ""
          : port.rss         ? " (RSS)"
                             : " (spread by the PMD)",
          config::format_ipv4(cfg.port.ipv4.addr).c_str(), cfg.port.ipv4.prefix,
          addrs.has_ipv6 ? " ipv6 " : "",
          addrs.has_ipv6 ? config::format_ipv6(addrs.ipv6).c_str() : "");
      if (port.nb_queues < cfg.eal.workers.size())
        printf("urnicd: %s offers %u queue(s): %zu worker lcore(s) idle\n",
               port.driver.c_str(), port.nb_queues,
               cfg.eal.workers.size() - port.nb_queues);

      const uint64_t t0 = now_ns();
      auto snapshot = [&] {
        stats::Snapshot s;
        s.time_ns = now_ns();
        s.uptime_ns = s.time_ns - t0;
        s.tsc_hz = rte_get_tsc_hz();
        port_read_stats(port, s.port);
        for (auto& w : workers) {
          stats::LcoreSnapshot l;
          l.lcore = w->lcore();
          l.queue = w->queue();
          l.qps = static_cast<uint32_t>(w->engine().qp_count());
          l.read(w->counters());
          l.read_transport(w->transport_counters());
          s.lcores.push_back(l);
        }
        s.neigh_entries = neigh->size();
        if (shim) s.shim = shim->stats();
        if (cm)
          for (const auto& kv : cm->stats()) s.shim.push_back(kv);
        if (ctl) s.shim.push_back({"control_refusals", ctl->refused()});
        return s;
      };
      stats::Snapshot last_query = snapshot();
      auto handle_ctl = [&](ctl::Op op, std::string_view body,
                            int& status) -> std::string {
        switch (op) {
          case ctl::Op::kObjects:
            return shim->objects_text();
          case ctl::Op::kHello:
            return "urnicd " URNIC_VERSION " proto " +
                   std::to_string(ctl::kVersion);
          case ctl::Op::kStatsText:
          case ctl::Op::kStatsJson: {
            stats::Snapshot s = snapshot();
            std::string out = op == ctl::Op::kStatsJson
                                  ? stats::format_json(s, &last_query)
                                  : stats::format_text(s, &last_query);
            last_query = std::move(s);
            return out;
          }
          case ctl::Op::kQpStats:
          case ctl::Op::kQpStatsText: {
            // A page stays well under ctl::kMaxMsg (~25 numbers per row).
            constexpr size_t kPage = 256;
            uint32_t from = 0;
            if (!body.empty() &&
                std::from_chars(body.data(), body.data() + body.size(), from)
                        .ptr != body.data() + body.size()) {
              status = -EINVAL;
              return "not a QPN: " + std::string(body);
            }
            const auto owners = shim->qp_owners();
            // Pages in QPN order (the table is not: QPNs carry a
            // generation in their upper bits).
            std::vector<const transport::Qp*> page;
            for (auto& w : workers)
              w->engine().for_each_qp([&](const transport::Qp& q) {
                if (q.qpn() >= from) page.push_back(&q);
              });
            const auto by_qpn = [](const transport::Qp* a,
                                   const transport::Qp* b) {
              return a->qpn() < b->qpn();
            };
            uint32_t next = 0;
            if (page.size() > kPage) {
              std::nth_element(page.begin(), page.begin() + kPage, page.end(),
                               by_qpn);
              next = page[kPage]->qpn();
              page.resize(kPage);
            }
            std::sort(page.begin(), page.end(), by_qpn);
            std::vector<stats::QpRow> rows;
            for (const transport::Qp* qp : page) {
              const transport::Qp& q = *qp;
              stats::QpRow& r = rows.emplace_back();
              r.read(q);
              r.lcore = peers[workers[0]->engine().home_of(q.qpn())]->lcore();
              const auto it =
                  std::lower_bound(owners.begin(), owners.end(),
                                   std::pair<uint32_t, pid_t>{q.qpn(), 0});
              if (it != owners.end() && it->first == q.qpn())
                r.pid = it->second;
            }
            const stats::Snapshot s = snapshot();
            return op == ctl::Op::kQpStats
                       ? stats::format_qps_json(s, rte_get_tsc_hz(), rows, next)
                       : stats::format_qps_text(s, rte_get_tsc_hz(), rows,
                                                next);
          }
          case ctl::Op::kGids: {
            const host::GidTable gids(addrs);
            std::string out;
            for (uint32_t i = 0; i < gids.count; ++i)
              out += std::to_string(i) + " " + host::format_gid(gids.gid[i]) +
                     (wire::gid_is_ipv4(gids.gid[i]) ? " RoCEv2 IPv4\n"
                                                     : " RoCEv2 IPv6\n");
            return out;
          }
          case ctl::Op::kFault:
            return fault_request(cfg, body, fault, status, [&] {
              for (auto& w : workers) {
                ParkGuard parked(w->gate());
                w->set_fault(fault, fault.seed);
              }
            });
          case ctl::Op::kPing: {
            uint32_t ip;
            if (!config::parse_ipv4(std::string(body), ip)) {
              status = -EINVAL;
              return "not an IPv4 address: " + std::string(body);
            }
            auto c = std::make_unique<Command>();
            c->kind = Command::Kind::kPing;
            wire::gid_from_ipv4(ip, c->gid);
            if (!workers[0]->post(c.get())) {
              status = -EBUSY;
              return "worker command ring full";
            }
            commands.push_back(std::move(c));
            return "echo request queued to " + std::string(body);
          }
        }
        status = -EOPNOTSUPP;
        return "unknown operation " + std::to_string(static_cast<int>(op));
      };
      auto handler = [&](CtlRequest& req, CtlReply& rep) {
        if (CmServer::is_cm_op(static_cast<uint16_t>(req.op))) {
          cm->handle(req, rep);
          return;
        }
        if (ShimServer::is_shim_op(static_cast<uint16_t>(req.op))) {
          shim->handle(req, rep);
          return;
        }
        rep.payload = handle_ctl(req.op, req.body, rep.status);
      };
      ctl = std::make_unique<ControlServer>(cfg.control, handler,
                                            [&](const ClientInfo& ci) {
                                              cm->on_close(ci);
                                              shim->on_close(ci);
                                            });

      for (auto& w : workers) {
        w->gate().set_running(true);  // before launch: park() waits for it
        const int lrc =
            rte_eal_remote_launch(&Worker::launch, w.get(), w->lcore());
        if (lrc) {
          w->gate().set_running(false);
          throw std::runtime_error("cannot start worker lcore " +
                                   std::to_string(w->lcore()) + ": " +
                                   rte_strerror(-lrc));
        }
      }
      printf("urnicd: control socket %s\n", ctl->path().c_str());
      fflush(stdout);

      stats::Snapshot last_print = snapshot();
      bool link_up = !last_print.port.link_up;  // report the first state
      uint64_t next_link_check = 0;
      uint64_t next_print = now_ns() + uint64_t{cfg.stats.period_ms} * 1000000;
      while (!g_quit.load()) {
        ctl->poll(cm->busy() ? 2 : 20);
        shim->pump_events();
        {
          // CM MADs the workers received (whole frames, ICRC checked).
          void* obj = nullptr;
          uint8_t buf[2048];
          while (rte_ring_dequeue(gsi, &obj) == 0) {
            auto* m = static_cast<rte_mbuf*>(obj);
            const uint32_t len = std::min<uint32_t>(m->pkt_len, sizeof buf);
            const auto* p =
                static_cast<const uint8_t*>(rte_pktmbuf_read(m, 0, len, buf));
            wire::FrameInfo fi;
            wire::decode(p, len, fi);
            if (fi.kind == wire::FrameKind::kRoce)
              cm->rx(fi.roce, p + fi.payload_off, fi.roce.payload_len,
                     now_ns());
            rte_pktmbuf_free(m);
          }
          cm->tick(now_ns());
        }
        while (!commands.empty() &&
               commands.front()->result.load(std::memory_order_acquire) != 1)
          commands.pop_front();
        if (now_ns() >= next_link_check) {
          stats::PortSnapshot ps;
          port_read_link(port, ps);
          if (ps.link_up != link_up) {
            link_up = ps.link_up;
            printf("urnicd: port %u link %s", port.port_id,
                   link_up ? "up" : "down");
            if (link_up) printf(" %u Mb/s", ps.link_speed_mbps);
            printf("\n");
          }
          next_link_check = now_ns() + 500'000'000;
        }
        if (cfg.stats.period_ms && now_ns() >= next_print) {
          stats::Snapshot s = snapshot();
          fputs(stats::format_text(s, &last_print).c_str(), stdout);
          fflush(stdout);
          last_print = std::move(s);
          next_print += uint64_t{cfg.stats.period_ms} * 1000000;
        }
      }
      rte_eal_mp_wait_lcore();
      cm->shutdown(now_ns());
      if (const size_t live = shim->clients_open()) {
        shim->shutdown();
        printf(
            "urnicd: stopping with %zu client(s) attached: their QPs "
            "flushed, IBV_EVENT_DEVICE_FATAL sent\n",
            live);
      }
      if (cfg.stats.print_on_exit) {
        stats::Snapshot s = snapshot();
        fputs(stats::format_text(s, &last_print).c_str(), stdout);
      }
      teardown();
      printf("urnicd: stopped\n");
    } catch (const std::exception& e) {
      fprintf(stderr, "urnicd: %s\n", e.what());
      teardown();
      rc = 1;
    }
  }
  rte_eal_cleanup();
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  std::string file;
  std::vector<std::string> overrides;
  bool check = false, print = false;
  static const option opts[] = {{"config", required_argument, nullptr, 'c'},
                                {"set", required_argument, nullptr, 'o'},
                                {"check-config", no_argument, nullptr, 'C'},
                                {"print-config", no_argument, nullptr, 'P'},
                                {"help", no_argument, nullptr, 'h'},
                                {nullptr, 0, nullptr, 0}};
  for (int ch; (ch = getopt_long(argc, argv, "c:o:h", opts, nullptr)) != -1;) {
    switch (ch) {
      case 'c':
        file = optarg;
        break;
      case 'o':
        overrides.push_back(optarg);
        break;
      case 'C':
        check = true;
        break;
      case 'P':
        print = true;
        break;
      case 'h':
        usage(stdout);
        return 0;
      default:
        usage(stderr);
        return 2;
    }
  }
  if (optind != argc) {
    usage(stderr);
    return 2;
  }
  config::Config cfg;
  try {
    cfg = file.empty() ? config::parse(config::embedded_default(), "<embedded>",
                                       overrides)
                       : config::load_file(file, overrides);
  } catch (const config::ConfigError& e) {
    fprintf(stderr, "urnicd: %s\n", e.what());
    return 2;
  }
  if (check) {
    printf("%s: OK\n", cfg.source.c_str());
    return 0;
  }
  if (print) {
    fputs(config::dump(cfg).c_str(), stdout);
    return 0;
  }
  try {
    ControlServer::ensure_free(cfg.control.socket);
  } catch (const std::exception& e) {
    fprintf(stderr, "urnicd: %s\n", e.what());
    return 1;
  }
  setvbuf(stdout, nullptr, _IOLBF, 0);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return run(cfg, argv[0]);
}
