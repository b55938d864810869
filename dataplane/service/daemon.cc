// urnicd's control side: the parts and their lifetime (daemon.h).
#include "dataplane/service/daemon.h"

#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "dataplane/host/gid_table.h"
#include "dataplane/hostif/verbs.h"
#include "dataplane/service/fault.h"

namespace urnic::service {

namespace {

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

host::HostAddrs make_addrs(const config::Config& cfg, const PortInfo& p) {
  host::HostAddrs h;
  std::memcpy(h.mac.b, p.mac, 6);
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

}  // namespace

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
  d.max_mcast_grp = static_cast<int>(l.max_mcast_grp);
  d.max_mcast_qp_attach = static_cast<int>(l.max_mcast_qp_attach);
  d.max_total_mcast_qp_attach = static_cast<int>(l.max_total_mcast_qp_attach);
  d.max_pkeys = 1;
  d.local_ca_ack_delay = 15;
  d.phys_port_cnt = 1;
  ibv_port_attr& p = r.port;
  p.state = IBV_PORT_ACTIVE;
  p.max_mtu = static_cast<ibv_mtu>(dc.limits.max_path_mtu);
  p.active_mtu = dc.active_mtu;
  p.gid_tbl_len = dc.num_gids;
  p.port_cap_flags = 0;
  p.max_msg_sz = l.max_msg_sz;
  p.pkey_tbl_len = 1;
  p.lid = 0;
  p.sm_lid = 0;
  p.lmc = 0;
  p.max_vl_num = 1;
  const hostif::IbLinkRate rate = hostif::ib_link_rate(0);  // port_state
  p.active_width = rate.width;
  p.active_speed = rate.speed;
  p.phys_state = 5;  // LinkUp
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

void Daemon::start() {
  port_ = port_setup(cfg_);
  addrs_ = make_addrs(cfg_, port_);
  host::NeighbourParams np;
  np.entries = cfg_.arp.entries;
  np.reachable_ns = uint64_t{cfg_.arp.reachable_ms} * 1'000'000;
  np.retry_ns = uint64_t{cfg_.arp.retry_ms} * 1'000'000;
  np.retries = cfg_.arp.retries;
  neigh_ = std::make_unique<host::NeighbourTable>(np);
  resolver_ = std::make_unique<NeighbourResolver>(*neigh_);
  dc_ = device_config(cfg_, port_, addrs_);
  device_ = std::make_unique<transport::Device>(dc_, resolver_.get());
  // One worker per queue; each is the home of some QPs (the QPN says
  // whose: Engine::home_of).
  for (uint16_t q = 0; q < port_.nb_queues; ++q)
    workers_.push_back(std::make_unique<Worker>(cfg_, port_, addrs_, *neigh_,
                                                *device_, cfg_.eal.workers[q],
                                                q, port_.nb_queues));
  for (auto& w : workers_) peers_.push_back(w.get());
  // Fault injection: the settings in effect and their seed (0 in the
  // config: a random one, printed so that a run can be replayed).
  fault_ = cfg_.fault;
  if (!fault_.seed) fault_.seed = random_fault_seed();
  for (auto& w : workers_) w->set_fault(fault_, fault_.seed);
  if (fault_on(fault_.rx) || fault_on(fault_.tx))
    printf("urnicd: fault injection on (seed %" PRIu64 "):\n%s", fault_.seed,
           fault_text(fault_).c_str());
  ShimEnv env = shim_env();
  zero_copy_state_ = zero_copy_setup();
  if (zero_copy_) {
    env.tx_memory = zero_copy_.get();
    for (auto& w : workers_) w->set_zero_copy(zero_copy_.get());
  }
  printf("urnicd: zero-copy TX %s\n", zero_copy_state_.c_str());
  if (!cfg_.lcores.idle.wait_ms)
    printf("urnicd: idle workers sleep timed sleeps (lcores.idle.wait_ms 0)\n");
  else if (port_.rx_wake_fds.empty())
    printf("urnicd: idle workers sleep timed sleeps (%s)\n",
           port_.wake_why.c_str());
  else
    printf("urnicd: idle workers wait for events (a frame: %s)\n",
           port_.wake_why.c_str());
  shim_ = std::make_unique<ShimServer>(std::move(env));
  for (auto& w : workers_) w->serve(shim_.get(), peers_);
  // RDMA CM: MADs for QP1 reach the control thread by ring; the ones
  // it sends leave through worker 0 as commands.
  gsi_ = rte_ring_create("urnic_gsi", 1024, SOCKET_ID_ANY, RING_F_SC_DEQ);
  if (!gsi_)
    throw std::runtime_error("GSI ring: " +
                             std::string(rte_strerror(rte_errno)));
  for (auto& w : workers_) w->set_gsi(gsi_);
  cm_ = std::make_unique<CmServer>(cm_env());
  printf(
      "urnicd: port %u (%s) mac %02x:%02x:%02x:%02x:%02x:%02x%s mtu %u "
      "queues %u%s ipv4 %s/%u%s%s\n",
      port_.port_id, port_.driver.c_str(), addrs_.mac.b[0], addrs_.mac.b[1],
      addrs_.mac.b[2], addrs_.mac.b[3], addrs_.mac.b[4], addrs_.mac.b[5],
      port_.soft_mac ? " (ours; the interface keeps its own)" : "", port_.mtu,
      port_.nb_queues,
      port_.nb_queues < 2 ? ""
      : port_.rss         ? " (RSS)"
                          : " (spread by the PMD)",
      config::format_ipv4(cfg_.port.ipv4.addr).c_str(), cfg_.port.ipv4.prefix,
      addrs_.has_ipv6 ? " ipv6 " : "",
      addrs_.has_ipv6 ? config::format_ipv6(addrs_.ipv6).c_str() : "");
  if (port_.nb_queues < cfg_.eal.workers.size())
    printf("urnicd: %s offers %u queue(s): %zu worker lcore(s) idle\n",
           port_.driver.c_str(), port_.nb_queues,
           cfg_.eal.workers.size() - port_.nb_queues);

  t0_ = now_ns();
  last_query_ = snapshot();
  ctl_ = std::make_unique<ControlServer>(
      cfg_.control,
      [this](CtlRequest& req, CtlReply& rep) { handle(req, rep); },
      [this](const ClientInfo& ci) {
        cm_->on_close(ci);
        shim_->on_close(ci);
      });
  start_workers();
  printf("urnicd: control socket %s\n", ctl_->path().c_str());
  fflush(stdout);
}

void Daemon::start_workers() {
  for (auto& w : workers_) {
    w->gate().set_running(true);  // before launch: park() waits for it
    const int lrc = rte_eal_remote_launch(&Worker::launch, w.get(), w->lcore());
    if (lrc) {
      w->gate().set_running(false);
      throw std::runtime_error("cannot start worker lcore " +
                               std::to_string(w->lcore()) + ": " +
                               rte_strerror(-lrc));
    }
  }
}

ShimEnv Daemon::shim_env() {
  ShimEnv env;
  env.dev = device_.get();
  for (auto& w : workers_) {
    env.engines.push_back(&w->engine());
    env.gates.push_back(&w->gate());
    env.bells.push_back(w->bell());
  }
  env.info = shim_info(dc_);
  env.client_limits = cfg_.client_limits;
  env.port_state = [this](ibv_port_attr& pa) {
    stats::PortSnapshot ps;
    port_read_link(port_, ps);
    pa.state = ps.link_up ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
    pa.phys_state = ps.link_up ? 5 : 3;  // LinkUp : Disabled
    const hostif::IbLinkRate rate = hostif::ib_link_rate(ps.link_speed_mbps);
    pa.active_width = rate.width;
    pa.active_speed = rate.speed;
  };
  env.mcast_changed = [this](const uint8_t gid[16], bool joined) {
    mcast_changed(gid, joined);
  };
  env.warm_neighbour = [this](const uint8_t dgid[16], uint32_t attempt,
                              uint64_t since_ns) {
    return warm_neighbour(dgid, attempt, since_ns);
  };
  return env;
}

// IGMPv2 for an IPv4 group (a report when the device's first QP joins, a
// leave when its last one goes), so that switches snooping IGMP send the
// group's frames to this port, as the kernel's IGMP does for rxe. No MLD
// for IPv6 groups. The workers answer queries (Worker::igmp_rx_st).
void Daemon::mcast_changed(const uint8_t gid[16], bool joined) {
  if (!wire::gid_is_ipv4(gid) || lcores_stopped_) return;
  uint8_t frame[128];
  const uint32_t group = wire::gid_to_ipv4(gid);
  const uint32_t len =
      host::build_igmp(addrs_, cfg_.port.vlan, group, !joined, frame);
  uint8_t dst[16];
  wire::gid_from_ipv4(joined ? group : 0xe0000002u, dst);
  cm_send_frame(dst, frame, len);
}

// The service stops with groups still joined: each one's IGMP leave goes
// out now, from this thread on queue 0 (the workers have stopped), as when
// the last member leaves. The leaves the shim server's release of its
// clients reports afterwards would find no worker to send them.
void Daemon::leave_groups() {
  lcores_stopped_ = true;
  if (!port_.started || !device_) return;
  device_->for_each_mcast_group([&](const transport::Gid& g) {
    if (!wire::gid_is_ipv4(g.data())) return;
    rte_mbuf* m = igmp_frame(port_.pool, addrs_, cfg_.port.vlan,
                             wire::gid_to_ipv4(g.data()), true);
    if (m && rte_eth_tx_burst(port_.port_id, 0, &m, 1) != 1)
      rte_pktmbuf_free(m);
  });
}

// Asks worker 0 to resolve (at the first attempt and every 500th: about
// once a second at the control server's 2 ms retries) and says whether the
// cache has the MAC yet. A verbs client's modify_qp/create_ah waits for its
// reply, as on a kernel HCA, while every other client is served.
int Daemon::warm_neighbour(const uint8_t dgid[16], uint32_t attempt,
                           uint64_t since_ns) {
  for (uint32_t i = 0; i < dc_.num_gids; ++i)
    if (std::memcmp(dc_.gids[i], dgid, 16) == 0) return 0;  // ours
  wire::MacAddr mac;
  const uint64_t now = now_ns();
  if (neigh_->lookup(dgid, now, mac) == host::Lookup::kHit) return 0;
  if (now - since_ns >= 3'000'000'000ull || g_quit.load()) return EHOSTUNREACH;
  if (attempt % 500 == 0) {
    auto c = std::make_unique<Command>();
    c->kind = Command::Kind::kResolve;
    std::memcpy(c->gid, dgid, 16);
    post(std::move(c));
  }
  return EINPROGRESS;
}

CmEnv Daemon::cm_env() {
  CmEnv ce;
  ce.addrs = addrs_;
  uint8_t g4[16];
  wire::gid_from_ipv4(addrs_.ipv4, g4);
  ce.sgid_index = host::GidTable(addrs_).find(g4);
  ce.node_guid = shim_info(dc_).node_guid;
  ce.active_mtu = static_cast<uint8_t>(dc_.active_mtu);
  ce.vlan_tci = cfg_.port.vlan;
  ce.listen_grace_ns = uint64_t{cfg_.cm.listen_grace_ms} * 1'000'000;
  ce.send_frame = [this](const uint8_t dgid[16], const uint8_t* frame,
                         uint32_t len) {
    return cm_send_frame(dgid, frame, len);
  };
  ce.neighbour = [this](const uint8_t dgid[16]) { return cm_neighbour(dgid); };
  return ce;
}

bool Daemon::cm_send_frame(const uint8_t dgid[16], const uint8_t* frame,
                           uint32_t len) {
  rte_mbuf* m = rte_pktmbuf_alloc(port_.pool);
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
  return post(std::move(c));  // a Command not taken frees its frame
}

int Daemon::cm_neighbour(const uint8_t dgid[16]) {
  wire::MacAddr mac;
  const uint64_t now = now_ns();
  if (neigh_->lookup(dgid, now, mac) == host::Lookup::kHit) return 0;
  // The worker retries a resolution itself; asking again only restarts
  // one that failed (a few times a second is plenty).
  std::array<uint8_t, 16> g;
  std::memcpy(g.data(), dgid, 16);
  std::erase_if(cm_asked_, [&](const auto& kv) {
    return now - kv.second > 1'000'000'000;
  });
  if (auto it = cm_asked_.find(g);
      it != cm_asked_.end() && now - it->second < 200'000'000)
    return EINPROGRESS;
  cm_asked_[g] = now;
  auto c = std::make_unique<Command>();
  c->kind = Command::Kind::kResolve;
  std::memcpy(c->gid, dgid, 16);
  post(std::move(c));
  return EINPROGRESS;
}

bool Daemon::post(std::unique_ptr<Command> c) {
  if (!workers_[0]->post(c.get())) return false;
  commands_.push_back(std::move(c));
  return true;
}

void Daemon::serve() {
  last_print_ = snapshot();
  link_up_ = !last_print_.port.link_up;  // report the first state
  next_link_check_ = 0;
  next_print_ = now_ns() + uint64_t{cfg_.stats.period_ms} * 1000000;
  while (!g_quit.load()) {
    ctl_->poll(cm_->busy() ? 2 : 20);
    shim_->pump_events();
    poll_gsi();
    cm_->tick(now_ns());
    while (!commands_.empty() &&
           commands_.front()->result.load(std::memory_order_acquire) != 1)
      commands_.pop_front();
    if (now_ns() >= next_link_check_) check_link();
    if (cfg_.stats.period_ms && now_ns() >= next_print_) {
      stats::Snapshot s = snapshot();
      fputs(stats::format_text(s, &last_print_).c_str(), stdout);
      fflush(stdout);
      last_print_ = std::move(s);
      next_print_ += uint64_t{cfg_.stats.period_ms} * 1000000;
    }
  }
}

// CM MADs the workers received (whole frames, ICRC checked).
void Daemon::poll_gsi() {
  void* obj = nullptr;
  uint8_t buf[2048];
  while (rte_ring_dequeue(gsi_, &obj) == 0) {
    auto* m = static_cast<rte_mbuf*>(obj);
    const uint32_t len = std::min<uint32_t>(m->pkt_len, sizeof buf);
    const auto* p =
        static_cast<const uint8_t*>(rte_pktmbuf_read(m, 0, len, buf));
    wire::FrameInfo fi;
    wire::decode(p, len, fi);
    if (fi.kind == wire::FrameKind::kRoce)
      cm_->rx(fi.roce, p + fi.payload_off, fi.roce.payload_len, now_ns());
    rte_pktmbuf_free(m);
  }
}

// The payload goes out as mbufs chained after the header's: a PMD must
// say it transmits chains (MULTI_SEGS). net_af_xdp does not, and copies
// the first segment's bytes for the whole frame's length (a corrupt frame,
// an ICRC error at the peer); net_null puts nothing on a wire (own-GID
// loopback, perf/own-core, never reaches it), so it may. Vdev PMDs that
// take chains copy out of the mbuf on the CPU: any address will do. A PCI
// device reads the payload by DMA, so each registered MR is DMA-mapped for it
// (ZeroCopyTx::map), which needs IOVAs that are virtual addresses; with
// physical ones (uio_pci_generic, vfio without an IOMMU) the application's
// pages would have to be pinned and translated page by page, and a payload
// crossing a page split by physical contiguity: not done, they copy.
std::string Daemon::zero_copy_setup() {
  if (!cfg_.transport.zero_copy_tx)
    return "off: transport.zero_copy_tx is false";
  if (!(port_.tx_offloads & RTE_ETH_TX_OFFLOAD_MULTI_SEGS) &&
      port_.driver != "net_null")
    return "off: " + port_.driver +
           " cannot transmit chained mbufs (no MULTI_SEGS); payload is copied";
  if (cfg_.port.pci.empty()) {
    zero_copy_ = std::make_unique<ZeroCopyTx>();
    return "on";
  }
  if (rte_eal_iova_mode() != RTE_IOVA_VA)
    return "off: IOVA as PA (uio_pci_generic, or vfio without an IOMMU); "
           "payload is copied";
  rte_eth_dev_info info;
  if (rte_eth_dev_info_get(port_.port_id, &info) != 0 || !info.device)
    return "off: the port's device is unknown; payload is copied";
  zero_copy_ =
      std::make_unique<ZeroCopyTx>(std::make_unique<PciDmaMapper>(info.device));
  return "on (MRs DMA-mapped for the device, IOVA as VA)";
}

void Daemon::check_link() {
  stats::PortSnapshot ps;
  port_read_link(port_, ps);
  if (ps.link_up != link_up_) {
    link_up_ = ps.link_up;
    printf("urnicd: port %u link %s", port_.port_id, link_up_ ? "up" : "down");
    if (link_up_) printf(" %u Mb/s", ps.link_speed_mbps);
    printf("\n");
    shim_->port_event(link_up_);
  }
  next_link_check_ = now_ns() + 500'000'000;
}

// g_quit is set: every worker ends its pass and returns. One waiting for
// events (wake.h) would see it only when its wait ends.
void Daemon::join_workers() {
  for (auto& w : workers_) w->wake();
  rte_eal_mp_wait_lcore();
}

void Daemon::stop() {
  join_workers();
  leave_groups();
  cm_->shutdown(now_ns());
  if (const size_t live = shim_->clients_open()) {
    shim_->shutdown();
    printf(
        "urnicd: stopping with %zu client(s) attached: their QPs "
        "flushed, IBV_EVENT_DEVICE_FATAL sent\n",
        live);
  }
  if (cfg_.stats.print_on_exit) {
    stats::Snapshot s = snapshot();
    fputs(stats::format_text(s, &last_print_).c_str(), stdout);
  }
  teardown();
}

void Daemon::teardown() {
  g_quit.store(true);
  join_workers();
  if (shim_) shim_->shutdown();
  if (cm_) cm_->shutdown(now_ns());
  ctl_.reset();
  shim_.reset();  // releases what is left (lcores stopped)
  cm_.reset();
  if (gsi_) {
    void* m = nullptr;
    while (rte_ring_dequeue(gsi_, &m) == 0)
      rte_pktmbuf_free(static_cast<rte_mbuf*>(m));
    rte_ring_free(gsi_);
    gsi_ = nullptr;
  }
  workers_.clear();
  if (port_.started) port_teardown(port_);
  // After the port gave back every mbuf: DMA mappings go last.
  zero_copy_.reset();
}

}  // namespace urnic::service
