// EAL arguments and port bring-up. Offloads and queue counts come from
// rte_eth_dev_info, so e1000 "em" (one queue), igb (RSS), af_packet, tap,
// memif and ring ports all come up with what they actually have.
#include <dirent.h>
#include <fcntl.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_kvargs.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "dataplane/service/intr_thread.h"
#include "dataplane/service/service.h"

namespace urnic::service {
namespace {

std::string fmt(const char* f, auto... a) {
  char buf[512];
  snprintf(buf, sizeof buf, f, a...);
  return buf;
}

// The value of `key` in a vdev spec ("name,k=v,..."), parsed by DPDK's own
// rte_kvargs; "" when absent.
std::string vdev_arg(const std::string& vdev, const char* key) {
  const size_t comma = vdev.find(',');
  if (comma == std::string::npos) return {};
  rte_kvargs* kv = rte_kvargs_parse(vdev.c_str() + comma + 1, nullptr);
  if (!kv) return {};
  const char* v = rte_kvargs_get(kv, key);
  std::string out = v ? v : "";
  rte_kvargs_free(kv);
  return out;
}

// The number `key` holds in a vdev spec, or `dflt` when absent.
uint32_t vdev_num(const std::string& vdev, const char* key, uint32_t dflt) {
  const std::string v = vdev_arg(vdev, key);
  return v.empty() ? dflt
                   : static_cast<uint32_t>(strtoul(v.c_str(), nullptr, 0));
}

// The PMD's sockets of `domain` (AF_PACKET, AF_XDP) found among our own
// descriptors (DPDK does not hand them out), in fd order: the PMDs open
// them one per queue, in queue order. af_packet's are those bound to the
// vdev's interface; an AF_XDP socket cannot say where it is bound
// (getsockname), but urnicd opens none of its own.
std::vector<int> pmd_sockets(const std::string& vdev, int domain) {
  std::vector<int> fds;
  const unsigned ifindex = if_nametoindex(vdev_arg(vdev, "iface").c_str());
  DIR* d = opendir("/proc/self/fd");
  if (!ifindex || !d) {
    if (d) closedir(d);
    return fds;
  }
  while (dirent* e = readdir(d)) {
    char* end;
    const long l = std::strtol(e->d_name, &end, 10);
    const int fd = static_cast<int>(l);
    if (*end || end == e->d_name || fd == dirfd(d)) continue;
    int dom = 0;
    socklen_t len = sizeof dom;
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &dom, &len) != 0 || dom != domain)
      continue;
    if (domain == AF_PACKET) {
      sockaddr_ll ll{};
      socklen_t llen = sizeof ll;
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&ll), &llen) != 0 ||
          ll.sll_ifindex != static_cast<int>(ifindex))
        continue;
    }
    fds.push_back(fd);
  }
  closedir(d);
  std::sort(fds.begin(), fds.end());
  return fds;
}

// A PCI device's sysfs directory. `addr` as in port.pci; sysfs names carry
// the domain.
std::string pci_sysfs(const std::string& addr) {
  return "/sys/bus/pci/devices/" +
         (std::count(addr.begin(), addr.end(), ':') == 1 ? "0000:" + addr
                                                         : addr);
}

// The kernel driver a PCI device is bound to ("vfio-pci", "uio_pci_generic",
// ...), "" if unknown.
std::string pci_kernel_driver(const std::string& addr) {
  char buf[256];
  const std::string link = pci_sysfs(addr) + "/driver";
  const ssize_t n = readlink(link.c_str(), buf, sizeof buf - 1);
  if (n <= 0) return "";
  buf[n] = 0;
  const char* slash = strrchr(buf, '/');
  return slash ? slash + 1 : buf;
}

// Whether the device has the MSI-X capability (PCI 3.0 6.8.2: capability
// ID 0x11 in the list at config offset 0x34). Per-queue RX interrupts need
// a vector per queue: without MSI-X (82540EM, QEMU's e1000) EAL fails to
// enable them ("Error enabling MSI-X interrupts") and the PMD starts all
// the same, so a waiting worker would hear no frame at all.
bool pci_has_msix(const std::string& addr) {
  uint8_t cfg[256] = {};
  const int fd = open((pci_sysfs(addr) + "/config").c_str(), O_RDONLY);
  if (fd < 0) return false;
  const ssize_t n = pread(fd, cfg, sizeof cfg, 0);
  close(fd);
  if (n < 0x40 || !(cfg[0x06] & 0x10)) return false;  // no capability list
  uint8_t at = cfg[0x34] & 0xfc;
  for (int hops = 0; at >= 0x40 && at + 1 < n && hops < 48; ++hops) {
    if (cfg[at] == 0x11) return true;
    at = cfg[at + 1] & 0xfc;
  }
  return false;
}

// Per queue, the fds that become readable when a frame waits in it (a
// waiting worker's wake-up, wake.h): af_packet's ring sockets and AF_XDP's
// sockets. When there are not one per queue, every queue gets all of them
// (a frame for another queue then only costs a spurious wake-up).
std::vector<std::vector<int>> rx_wake_fds(const std::vector<int>& socks,
                                          uint16_t queues) {
  std::vector<std::vector<int>> out(socks.empty() ? 0 : queues);
  for (uint16_t q = 0; q < out.size(); ++q) {
    if (socks.size() == queues)
      out[q].push_back(socks[q]);
    else
      out[q] = socks;
  }
  return out;
}

}  // namespace

// net_af_packet's kernel ring holds 512 frames by default: a burst that
// arrives while the lcore is off the CPU (a shared core, a VM) overflows it,
// and the kernel drops frames the PMD never reports. RC resends them; UD
// and UC lose whole messages (perftest -c UD and -c UC hung on a veth pair).
// 4096 frames (8 MiB per ring, one ring per queue pair, at the default
// 2 KiB frames) unless the spec sets its own. With two queue pairs a worker
// back from a pause pulls a backlog of up to that many frames, half of them
// for the other worker: the hand-off holds what the other's ring cannot
// take and stops reading the port meanwhile (Worker::hand_off_st), so the
// backlog waits in the kernel's ring instead of overflowing ours.
//
// net_memif carries a frame in one buffer of bsize bytes (2048 by default)
// or, when longer, in a chain of them; DPDK 22.11's memif breaks chains: its
// transmit never clears the "next" flag of a chain's first buffer, so a
// later single-buffer frame in that slot claims a successor and the
// receiver reads far past the ring's head (measured: one frame received
// ~800 times, retry exceeded). A frame never crosses buffers when bsize
// holds the largest one, so a port.mtu above what 2048 B hold gets a bsize
// that does, unless the spec sets its own (port_setup then keeps the MTU
// within it).
std::string vdev_spec(const std::string& vdev, uint32_t mtu) {
  const uint32_t frame = mtu + kFrameOverhead;
  if (vdev.rfind("net_af_packet", 0) == 0) {
    // A kernel ring frame holds the packet after a TPACKET2 header: 2048 B
    // (the PMD's default) carry an MTU up to 1978. A larger port.mtu gets
    // frames that hold it, in 1 KiB steps, four to a block (the PMD finds
    // frame i at i x framesz, so a block must hold whole frames, and a
    // block is whole pages), and a frame count that keeps the ring's bytes
    // (the time a burst may wait for the lcore) as 4096 frames of 2048 B
    // had them, a whole number of blocks.
    std::string out = vdev;
    const bool own = !vdev_arg(vdev, "framesz").empty() ||
                     !vdev_arg(vdev, "blocksz").empty();
    uint32_t framesz = std::max(1u, vdev_num(vdev, "framesz", kAfPacketFrame));
    // The PMD's default block is a page.
    uint32_t per_block =
        std::max(1u, vdev_num(vdev, "blocksz", 4096) / framesz);
    if (!own && frame + kAfPacketFrameHdr > framesz) {
      framesz = (frame + kAfPacketFrameHdr + 1023) / 1024 * 1024;
      per_block = 4;
      out += ",framesz=" + std::to_string(framesz) +
             ",blocksz=" + std::to_string(framesz * per_block);
    }
    if (vdev_arg(vdev, "framecnt").empty()) {
      const uint32_t n =
          std::max(512u, kAfPacketFrames * kAfPacketFrame / framesz);
      out += ",framecnt=" + std::to_string(n / per_block * per_block);
    }
    return out;
  }
  if (vdev.rfind("net_memif", 0) == 0 && vdev_arg(vdev, "bsize").empty() &&
      frame > kMemifBuffer)
    return vdev + ",bsize=" + std::to_string((frame + 127) / 128 * 128);
  return vdev;
}

// The MTU of a vdev whose PMD refused port.mtu because DPDK 22.11 has it
// report a 1518 B frame (memif, af_packet: ethdev checks the MTU against
// that before the PMD sees it), though it carries any frame that fits its
// buffers (vdev_spec sized them). 0: not such a vdev.
static uint32_t buffer_bound_mtu(const config::Config& cfg,
                                 const std::string& spec,
                                 const std::string& driver,
                                 std::string* buffers) {
  uint32_t room = 0;
  if (driver == "net_memif") {
    room = vdev_num(spec, "bsize", kMemifBuffer);
    *buffers = fmt("bsize=%u", room);
  } else if (driver == "net_af_packet") {
    const uint32_t framesz = vdev_num(spec, "framesz", kAfPacketFrame);
    room = std::max(framesz, kAfPacketFrameHdr) - kAfPacketFrameHdr;
    *buffers =
        fmt("framesz=%u,blocksz=%u,framecnt=%u", framesz,
            vdev_num(spec, "blocksz", 4096), vdev_num(spec, "framecnt", 512));
  } else {
    return 0;
  }
  if (room < 576 + kFrameOverhead)
    throw std::runtime_error(
        fmt("%s: buffers of %u B hold no frame of an MTU of 576 or more",
            driver.c_str(), room));
  uint32_t mtu = std::min<uint32_t>(cfg.port.mtu, room - kFrameOverhead);
  if (driver == "net_af_packet") {
    // The kernel interface must pass the frames too: raise its MTU as the
    // PMD's own mtu_set would (ethdev never calls it above 1500 here).
    const std::string ifname = vdev_arg(spec, "iface");
    const int s = socket(AF_INET, SOCK_DGRAM, 0);
    ifreq ifr{};
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", ifname.c_str());
    if (s >= 0 && ioctl(s, SIOCGIFMTU, &ifr) == 0 &&
        static_cast<uint32_t>(ifr.ifr_mtu) < mtu) {
      ifreq set = ifr;
      set.ifr_mtu = static_cast<int>(mtu);
      if (ioctl(s, SIOCSIFMTU, &set) != 0) {
        fprintf(stderr,
                "urnicd: %s: cannot raise the interface's MTU from %d to %u "
                "(%s): the port keeps %d\n",
                ifname.c_str(), ifr.ifr_mtu, mtu, strerror(errno), ifr.ifr_mtu);
        mtu = static_cast<uint32_t>(ifr.ifr_mtu);
      }
    }
    if (s >= 0) close(s);
  }
  return mtu;
}

bool lcores_mapped(const config::EalConfig& e) {
  for (const auto& x : e.extra_args)
    if (x.rfind("--lcores", 0) == 0) return true;
  return false;
}

std::string check_cpus(const config::EalConfig& e) {
  if (lcores_mapped(e)) return {};
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return {};
  auto bad = [&](uint32_t l) {
    return l >= CPU_SETSIZE || !CPU_ISSET(l, &set);
  };
  auto refuse = [&](const char* key, uint32_t lcore) {
    std::string allowed;
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set))
        allowed += (allowed.empty() ? "" : ",") + std::to_string(c);
    return std::string(key) + ": lcore " + std::to_string(lcore) +
           " is no CPU urnicd may run on (allowed: " + allowed +
           "); to run lcores on other CPUs map them with "
           "eal.extra_args=['--lcores=...']";
  };
  if (bad(e.main_lcore)) return refuse("eal.main_lcore", e.main_lcore);
  for (uint32_t w : e.workers)
    if (bad(w)) return refuse("eal.workers", w);
  return {};
}

std::vector<std::string> eal_args(const config::Config& cfg, const char* prog) {
  const config::EalConfig& e = cfg.eal;
  std::vector<std::string> a = {prog};
  std::string lcores = std::to_string(e.main_lcore);
  for (uint32_t w : e.workers) lcores += "," + std::to_string(w);
  // An explicit --lcores in extra_args maps lcores to CPUs (e.g. two
  // workers sharing a CPU on a small machine) and replaces -l.
  if (!lcores_mapped(e)) a.insert(a.end(), {"-l", lcores});
  a.insert(a.end(),
           {"--main-lcore", std::to_string(e.main_lcore), "--file-prefix",
            e.file_prefix, "-m", std::to_string(e.memory_mb), "--log-level",
            "lib.eal:" + e.log_level, "--log-level", "pmd.*:" + e.log_level});
  if (!e.huge) a.push_back("--no-huge");
  if (!cfg.port.pci.empty()) {
    a.insert(a.end(), {"-a", cfg.port.pci});
  } else {
    a.insert(a.end(),
             {"--no-pci", "--vdev", vdev_spec(cfg.port.vdev, cfg.port.mtu)});
  }
  for (const auto& x : e.extra_args) a.push_back(x);
  return a;
}

PortInfo port_setup(const config::Config& cfg) {
  PortInfo p;
  if (rte_eth_dev_count_avail() != 1)
    throw std::runtime_error(
        fmt("expected exactly one port from '%s', found %u (see the EAL lines "
            "above: a PCI NIC must be bound to vfio-pci, or to uio_pci_generic "
            "with eal.huge: true since it needs physical addresses; a vdev's "
            "interface or socket must exist)",
            cfg.port.pci.empty() ? cfg.port.vdev.c_str() : cfg.port.pci.c_str(),
            rte_eth_dev_count_avail()));
  uint16_t pid = 0;
  RTE_ETH_FOREACH_DEV(pid) {
    break;
  }
  p.port_id = pid;

  rte_eth_dev_info info;
  if (int rc = rte_eth_dev_info_get(pid, &info); rc != 0)
    throw std::runtime_error(fmt("rte_eth_dev_info_get: %s", strerror(-rc)));
  p.driver = info.driver_name ? info.driver_name : "?";
  const uint16_t workers = static_cast<uint16_t>(cfg.eal.workers.size());
  p.nb_queues = std::min<uint16_t>(
      workers, std::min(info.max_rx_queues, info.max_tx_queues));
  if (p.nb_queues == 0) throw std::runtime_error("port has no RX/TX queues");

  rte_eth_conf conf{};
  if (p.nb_queues > 1) {
    const uint64_t hf =
        (RTE_ETH_RSS_IP | RTE_ETH_RSS_UDP) & info.flow_type_rss_offloads;
    if (hf) {
      conf.rxmode.mq_mode = RTE_ETH_MQ_RX_RSS;
      conf.rx_adv_conf.rss_conf.rss_hf = hf;
      p.rss = true;
    }
    // Without RSS a PMD may still spread flows over its queues itself
    // (af_packet fanout, multi-queue tap, a memif peer); a queue that gets
    // nothing only costs an idle worker.
  }
  // Capability-gated offloads: used where present, never demanded.
  p.rx_offloads = info.rx_offload_capa & RTE_ETH_RX_OFFLOAD_IPV4_CKSUM;
  p.tx_offloads = info.tx_offload_capa & RTE_ETH_TX_OFFLOAD_MULTI_SEGS;
  // The --vdev EAL was given (eal_args), "" for a PCI port.
  const std::string spec =
      cfg.port.pci.empty() ? vdev_spec(cfg.port.vdev, cfg.port.mtu) : "";
  uint32_t frame = cfg.port.mtu + kFrameOverhead;
  if (p.driver == "net_af_packet") {
    // Its RX queue wants an mbuf to hold a whole ring frame past the
    // TPACKET2 header's sockaddr_ll (the PMD's rx_queue_setup).
    const uint32_t framesz = vdev_num(spec, "framesz", kAfPacketFrame);
    const uint32_t ring =
        framesz -
        std::min<uint32_t>(framesz, kAfPacketFrameHdr - sizeof(sockaddr_ll));
    frame = std::max(frame, ring);
  }
  if (frame + RTE_PKTMBUF_HEADROOM > uint32_t{cfg.mempool.data_room}) {
    if (!(info.rx_offload_capa & RTE_ETH_RX_OFFLOAD_SCATTER))
      throw std::runtime_error(fmt(
          "port.mtu %u needs mbufs of %u bytes or RX scatter, which %s lacks; "
          "raise mempool.data_room",
          cfg.port.mtu, frame + RTE_PKTMBUF_HEADROOM, p.driver.c_str()));
    p.rx_offloads |= RTE_ETH_RX_OFFLOAD_SCATTER;
  }
  conf.rxmode.offloads = p.rx_offloads;
  conf.txmode.offloads = p.tx_offloads;
  // A PCI port on vfio-pci with MSI-X: per-queue RX interrupts (an eventfd
  // each) wake a waiting worker (wake.h). uio gives no per-queue
  // interrupt. Only PMDs seen to raise them on the queue's fd: igb did
  // (tools/vm-rxe-interop, idle_wakes_rx); the em PMD on an 82574 (MSI-X)
  // took the enable and no frame ever woke a worker. A PMD that cannot
  // start with them is started without (below).
  const std::string kdrv =
      cfg.port.pci.empty() ? "" : pci_kernel_driver(cfg.port.pci);
  const bool msix = kdrv == "vfio-pci" && pci_has_msix(cfg.port.pci);
  const bool intr_pmd = p.driver == "net_e1000_igb";
  conf.intr_conf.rxq = cfg.lcores.idle.wait_ms && msix && intr_pmd;
  if (int rc = rte_eth_dev_configure(pid, p.nb_queues, p.nb_queues, &conf))
    throw std::runtime_error(fmt("rte_eth_dev_configure: %s", strerror(-rc)));

  uint16_t mtu = 0;
  if (rte_eth_dev_get_mtu(pid, &mtu) == 0 && mtu != cfg.port.mtu) {
    if (rte_eth_dev_set_mtu(pid, static_cast<uint16_t>(cfg.port.mtu)) == 0) {
      mtu = static_cast<uint16_t>(cfg.port.mtu);
    } else if (std::string bufs; const uint32_t bound = buffer_bound_mtu(
                                     cfg, spec, p.driver, &bufs)) {
      mtu = static_cast<uint16_t>(bound);
      printf(
          "urnicd: port MTU %u on %s (its PMD reports 1518 B but carries any "
          "frame its buffers hold: %s; the peer needs the same port.mtu)\n",
          mtu, p.driver.c_str(), bufs.c_str());
    } else {
      fprintf(stderr, "urnicd: port MTU stays %u (PMD refused %u)\n", mtu,
              cfg.port.mtu);
    }
  }
  p.mtu = mtu ? std::min<uint32_t>(mtu, cfg.port.mtu) : cfg.port.mtu;

  uint16_t nb_rxd = cfg.port.rx_desc, nb_txd = cfg.port.tx_desc;
  if (int rc = rte_eth_dev_adjust_nb_rx_tx_desc(pid, &nb_rxd, &nb_txd))
    throw std::runtime_error(fmt("adjust descriptors: %s", strerror(-rc)));

  // Every RX descriptor holds an mbuf, TX rings and per-lcore caches hold
  // more; a pool smaller than that starves RX silently, so refuse it here.
  // With two workers or more, hand-off rings and the frames held for them
  // (kHandoffHold per other worker) keep received mbufs too.
  const uint64_t need =
      uint64_t{p.nb_queues} * (nb_rxd + nb_txd) +
      uint64_t{p.nb_queues} * cfg.mempool.cache +
      uint64_t{p.nb_queues} * 2 * config::kMaxBurst +
      (p.nb_queues > 1 ? uint64_t{p.nb_queues} *
                             (kHandoffRing + (p.nb_queues - 1u) * kHandoffHold)
                       : 0);
  if (cfg.mempool.mbufs < need)
    throw std::runtime_error(
        fmt("mempool.mbufs %u is too small: %u queue(s) x (%u RX + %u TX "
            "descriptors) plus caches need %llu",
            cfg.mempool.mbufs, p.nb_queues, nb_rxd, nb_txd,
            static_cast<unsigned long long>(need)));
  const int socket = rte_eth_dev_socket_id(pid);
  // With several workers an mbuf carries the frame's decoding in its private
  // area when one worker hands it to the QP's home worker (decoded once).
  const uint16_t priv = p.nb_queues > 1
                            ? static_cast<uint16_t>(RTE_ALIGN_CEIL(
                                  sizeof(wire::FrameInfo), RTE_MBUF_PRIV_ALIGN))
                            : 0;
  p.pool = rte_pktmbuf_pool_create(
      "urnic_mbuf_p0", cfg.mempool.mbufs, cfg.mempool.cache, priv,
      cfg.mempool.data_room, socket < 0 ? SOCKET_ID_ANY : socket);
  if (!p.pool)
    throw std::runtime_error(
        fmt("mempool of %u mbufs: %s (raise eal.memory_mb?)", cfg.mempool.mbufs,
            rte_strerror(rte_errno)));
  auto setup_queues = [&] {
    for (uint16_t q = 0; q < p.nb_queues; ++q) {
      rte_eth_rxconf rxc = info.default_rxconf;
      rxc.offloads = p.rx_offloads;
      if (int rc = rte_eth_rx_queue_setup(pid, q, nb_rxd, socket, &rxc, p.pool))
        throw std::runtime_error(fmt("rx queue %u: %s", q, strerror(-rc)));
      rte_eth_txconf txc = info.default_txconf;
      txc.offloads = p.tx_offloads;
      if (int rc = rte_eth_tx_queue_setup(pid, q, nb_txd, socket, &txc))
        throw std::runtime_error(fmt("tx queue %u: %s", q, strerror(-rc)));
    }
  };
  setup_queues();
  // af_packet shares its interface with the kernel, and its PMD would set
  // port.mac on that interface. We keep it to ourselves instead, as a second
  // station on the segment: the kernel then sees our frames as addressed to
  // another host and drops them on entry, rather than routing (and
  // rejecting) each one, and its own traffic keeps its address.
  // The config check refuses it without port.promiscuous (urnic_config.cc).
  p.soft_mac = !cfg.port.mac.empty() && p.driver == "net_af_packet";
  rte_ether_addr mac{};
  if (!cfg.port.mac.empty()) config::parse_mac(cfg.port.mac, mac.addr_bytes);
  if (!cfg.port.mac.empty() && !p.soft_mac) {
    if (int rc = rte_eth_dev_default_mac_addr_set(pid, &mac))
      throw std::runtime_error(
          fmt("setting port.mac %s: %s", cfg.port.mac.c_str(), strerror(-rc)));
  }
  // Promiscuous mode is set before the start, where a failure leaves
  // nothing to undo (af_packet: interface flags), and is cleared again at
  // teardown if we set it: the kernel interface outlives us.
  const bool was_promisc = rte_eth_promiscuous_get(pid) == 1;
  if (cfg.port.promiscuous) {
    if (rte_eth_promiscuous_enable(pid) == 0) {
      p.promisc_set = !was_promisc;
    } else if (p.soft_mac) {
      throw std::runtime_error(fmt(
          "%s: promiscuous mode failed; port.mac needs it", p.driver.c_str()));
    }
  }
  int rc = rte_eth_dev_start(pid);
  if (rc && conf.intr_conf.rxq) {
    fprintf(stderr,
            "urnicd: %s: start with RX interrupts failed (%s): started "
            "without; idle workers sleep timed sleeps\n",
            p.driver.c_str(), strerror(-rc));
    conf.intr_conf.rxq = 0;
    p.wake_why = "it would not start with RX interrupts";
    conf.rxmode.mtu = mtu;  // a new configure resets it otherwise
    if (int c = rte_eth_dev_configure(pid, p.nb_queues, p.nb_queues, &conf))
      throw std::runtime_error(fmt("rte_eth_dev_configure: %s", strerror(-c)));
    setup_queues();
    rc = rte_eth_dev_start(pid);
  }
  if (rc) throw std::runtime_error(fmt("rte_eth_dev_start: %s", strerror(-rc)));
  p.started = true;
  // Promiscuous/all-multicast are best effort: ND needs solicited-node
  // multicast; PMDs without the ops still deliver what is addressed to us
  // (a software address receives nothing without it: refused above). Some
  // PMDs take the mode only once started: asked again.
  if (cfg.port.promiscuous && rte_eth_promiscuous_get(pid) != 1) {
    if (rte_eth_promiscuous_enable(pid) == 0)
      p.promisc_set = !was_promisc;
    else
      fprintf(stderr, "urnicd: %s: promiscuous mode not supported\n",
              p.driver.c_str());
  }
  rte_eth_allmulticast_enable(pid);
  if (!p.soft_mac) rte_eth_macaddr_get(pid, &mac);
  std::memcpy(p.mac, mac.addr_bytes, 6);
  if (p.driver == "net_af_packet") {
    p.ring_fds = pmd_sockets(cfg.port.vdev, AF_PACKET);
    p.rx_wake_fds = rx_wake_fds(p.ring_fds, p.nb_queues);
  } else if (p.driver == "net_af_xdp") {
    p.rx_wake_fds =
        rx_wake_fds(pmd_sockets(cfg.port.vdev, AF_XDP), p.nb_queues);
  } else if (conf.intr_conf.rxq) {
    std::vector<std::vector<int>> fds(p.nb_queues);
    for (uint16_t q = 0; q < p.nb_queues; ++q) {
      const int fd = rte_eth_dev_rx_intr_ctl_q_get_fd(pid, q);
      // A PMD without the enable op would hand out an fd that never fires.
      const int en = fd < 0 ? -1 : rte_eth_dev_rx_intr_enable(pid, q);
      if (en == 0) rte_eth_dev_rx_intr_disable(pid, q);
      if (fd < 0 || en != 0) {
        fds.clear();  // all or none: one queue without wakes its worker late
        p.wake_why = fd < 0 ? "the PMD gave no RX interrupt fd"
                            : "the PMD cannot enable RX interrupts";
        break;
      }
      fds[q].push_back(fd);
    }
    p.rx_wake_fds = std::move(fds);
    p.rx_intr = !p.rx_wake_fds.empty();
  }
  if (!p.rx_wake_fds.empty()) {
    p.wake_why =
        p.rx_intr ? "its queue's RX interrupt (vfio)" : "the PMD's socket";
  } else if (p.wake_why.empty()) {  // else a failed start or fd said why
    if (cfg.port.pci.empty())
      p.wake_why = p.driver + " has no RX wake-up source";
    else if (kdrv != "vfio-pci")
      p.wake_why = "PCI on " + (kdrv.empty() ? std::string("?") : kdrv) +
                   ": no per-queue RX interrupts (vfio-pci has them)";
    else if (!msix)
      p.wake_why = "the device has no MSI-X for per-queue RX interrupts";
    else
      p.wake_why = p.driver + ": per-queue RX interrupts not known to work";
  }
  return p;
}

uint64_t port_ring_drops(const PortInfo& p) {
  uint64_t n = 0;
  for (int fd : p.ring_fds) {
    // tp_drops: frames the kernel found no free ring slot for. Reading
    // resets the socket's counts (packet(7)); DPDK never reads them.
    tpacket_stats_v3 st{};
    socklen_t len = sizeof st;
    if (getsockopt(fd, SOL_PACKET, PACKET_STATISTICS, &st, &len) == 0)
      n += st.tp_drops;
  }
  return n;
}

void port_read_stats(const PortInfo& p, stats::PortSnapshot& out) {
  out.port_id = p.port_id;
  out.name = p.driver;
  rte_eth_stats st{};
  if (rte_eth_stats_get(p.port_id, &st) == 0) {
    out.ipackets = st.ipackets;
    out.opackets = st.opackets;
    out.ibytes = st.ibytes;
    out.obytes = st.obytes;
    out.imissed = st.imissed;
    out.ierrors = st.ierrors;
    out.oerrors = st.oerrors;
    out.rx_nombuf = st.rx_nombuf;
  }
  if (p.pool) {
    out.mbufs_total = p.pool->size;
    out.mbufs_avail = rte_mempool_avail_count(p.pool);
  }
  port_read_link(p, out);
}

void port_read_link(const PortInfo& p, stats::PortSnapshot& out) {
  rte_eth_link link{};
  if (rte_eth_link_get_nowait(p.port_id, &link) == 0) {
    out.link_up = link.link_status == RTE_ETH_LINK_UP;
    out.link_speed_mbps = link.link_speed;
  }
}

void port_teardown(PortInfo& p) {
  if (!p.started) return;
  p.started = false;
  // On the interrupt thread, so that no PMD control handler runs meanwhile
  // (intr_thread.h: memif's peer-gone handler raced a close from here).
  const uint16_t port = p.port_id;
  const bool promisc = p.promisc_set;
  const auto close_port = [port, promisc] {
    if (promisc) rte_eth_promiscuous_disable(port);
    rte_eth_dev_stop(port);
    rte_eth_dev_close(port);
  };
  if (!intr_thread::run(close_port, 5000)) close_port();
  p.ring_fds.clear();  // closed with the device
  p.rx_wake_fds.clear();
}

}  // namespace urnic::service
