// urnicd's parts: the port (EAL, ethdev, mempool), the worker lcores (one
// run-to-completion loop each) and the control thread (socket + stats).
#pragma once

#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <rte_ring.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "config/urnic_config.h"
#include "dataplane/host/gid_table.h"
#include "dataplane/host/host.h"
#include "dataplane/host/pending.h"
#include "dataplane/service/fault.h"
#include "dataplane/service/shim_server.h"
#include "dataplane/service/zero_copy.h"
#include "dataplane/stats/report.h"
#include "dataplane/transport/engine.h"

namespace urnic::service {

// Set by SIGINT/SIGTERM; every loop checks it.
extern std::atomic<bool> g_quit;

uint64_t now_ns();  // CLOCK_MONOTONIC

// Builds the EAL argument vector from the config (exposed for tests/logs).
std::vector<std::string> eal_args(const config::Config& cfg, const char* prog);
// Whether eal.extra_args maps lcores to CPUs (--lcores); else each lcore
// id (main and workers) is the CPU it runs on.
bool lcores_mapped(const config::EalConfig& e);
// Before EAL: an lcore id that is no CPU this process may run on (its
// affinity mask), unmapped; empty if all are. EAL's own refusal of it
// says only "initialisation failed".
std::string check_cpus(const config::EalConfig& e);
// The --vdev argument for port.vdev: net_af_packet without framecnt gets
// kAfPacketFrames (2048 B frames' worth) per queue pair, and without framesz
// frames that hold one of `mtu`; net_memif without bsize gets buffers that
// hold a frame of `mtu` when its default ones do not (port.cc says why).
constexpr uint32_t kAfPacketFrames = 4096;
constexpr uint32_t kMemifBuffer = 2048;    // DPDK's default memif bsize
constexpr uint32_t kAfPacketFrame = 2048;  // DPDK's default af_packet framesz
constexpr uint32_t kFrameOverhead = 18;    // Ethernet header + a VLAN tag
// TPACKET2_HDRLEN (a TPACKET_V2 header and a sockaddr_ll, aligned), before
// the packet in each kernel ring frame.
constexpr uint32_t kAfPacketFrameHdr = 52;
std::string vdev_spec(const std::string& vdev, uint32_t mtu);

// Frames one worker may hold for another (the hand-off ring, per worker):
// counted in the mempool's minimum (port.cc) when there are two workers.
constexpr uint32_t kHandoffRing = 1024;
// Frames a worker keeps, per other worker, while that worker's hand-off
// ring is full: the rest of a burst fits. Meanwhile it leaves its own RX
// queue unread, so a backlog waits (or is dropped, counted as RX-missed) in
// the port's ring rather than being lost between workers.
constexpr uint32_t kHandoffHold = 2 * config::kMaxBurst;

struct PortInfo {
  uint16_t port_id = 0;
  uint16_t nb_queues = 1;
  std::string driver;
  uint64_t rx_offloads = 0, tx_offloads = 0;
  rte_mempool* pool = nullptr;
  uint32_t mtu = 1500;
  bool started = false;  // rte_eth_dev_start succeeded
  bool rss = false;      // RSS configured over the queues
  // Our station address. On net_af_packet a configured port.mac stays ours
  // alone (the kernel interface keeps its own; see port_setup).
  uint8_t mac[6] = {};
  bool soft_mac = false;
  bool promisc_set = false;  // we turned promiscuous mode on: off at teardown
  // net_af_packet: the PMD's sockets, whose kernel rings' drops
  // port_ring_drops() reads (the PMD reports none: imissed stays 0).
  std::vector<int> ring_fds;
  // By queue: fds readable when a frame waits in that queue (af_packet's
  // ring sockets, AF_XDP's sockets), which wake a waiting worker (wake.h).
  // Empty: the port cannot wake its workers; they sleep timed sleeps.
  std::vector<std::vector<int>> rx_wake_fds;
  // rx_wake_fds are the queues' RX interrupt eventfds (a PCI port on
  // vfio-pci): a worker enables its queue's interrupt while it waits.
  bool rx_intr = false;
  // What wakes a waiting worker (rx_wake_fds set), or why nothing can.
  std::string wake_why;
};

// Probes the one configured port, configures min(workers, PMD limit)
// queues and the offloads the PMD reports, starts it. Throws on failure.
PortInfo port_setup(const config::Config& cfg);
void port_read_stats(const PortInfo& p, stats::PortSnapshot& out);
// Link state only (port_read_stats includes it).
void port_read_link(const PortInfo& p, stats::PortSnapshot& out);
void port_teardown(PortInfo& p);  // idempotent
// Frames the port's kernel rings dropped since the last call (af_packet;
// 0 for other ports). Control thread.
uint64_t port_ring_drops(const PortInfo& p);

// A request from the control thread to a worker (rte_ring of pointers).
struct Command {
  // kPing: one ICMP echo to gid. kResolve: start ARP/ND for gid.
  // kSendFrame: transmit `frame` (a whole frame but for its destination
  // MAC) to gid, resolving it first; the worker owns the mbuf from then on.
  enum class Kind : uint8_t { kPing, kResolve, kSendFrame } kind = Kind::kPing;
  uint8_t gid[16] = {};
  rte_mbuf* frame = nullptr;
  std::atomic<int> result{1};  // 1: pending, then 0 or -errno
  Command() = default;
  Command(const Command&) = delete;
  Command& operator=(const Command&) = delete;
  ~Command() {
    if (frame) rte_pktmbuf_free(frame);  // never taken (shutdown)
  }
};

// The fault stage's view of an mbuf (fault.h). Writes only into the first
// segment, which is always the port's own buffer (a zero-copy payload is an
// external buffer further down the chain: the application's memory).
struct MbufFaultOps {
  using Pkt = rte_mbuf*;
  rte_mempool* pool = nullptr;
  uint32_t len(rte_mbuf* m) const { return m->pkt_len; }
  rte_mbuf* copy(rte_mbuf* m) const {
    return rte_pktmbuf_copy(m, pool, 0, UINT32_MAX);
  }
  void corrupt(rte_mbuf* m, uint64_t random) const;
  bool mark_ce(rte_mbuf* m) const;
  void free(rte_mbuf* m) const { rte_pktmbuf_free(m); }
};

// Per-lcore state; touched only by its lcore except the counters (read
// relaxed by the control thread) and the command ring (SP/SC). It is the
// transport engine's PacketIo: frames the engine builds become mbufs on
// this lcore's TX queue.
class alignas(64) Worker final : public transport::PacketIo {
 public:
  Worker(const config::Config& cfg, const PortInfo& port,
         const host::HostAddrs& addrs, host::NeighbourTable& nt,
         transport::Device& dev, uint32_t lcore, uint16_t queue,
         uint32_t homes = 1);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  static int launch(void* self);  // rte_eal_remote_launch entry
  uint32_t lcore() const { return lcore_; }
  uint16_t queue() const { return queue_; }
  const stats::LcoreCounters& counters() const { return ctr_; }
  const transport::EngineCounters& transport_counters() const {
    return engine_.counters();
  }
  // Control thread: hands a command over; false if the ring is full.
  bool post(Command* c) {
    if (rte_ring_enqueue(cmd_ring_, c) != 0) return false;
    wake_.ring();
    return true;
  }
  // The eventfd that wakes this worker when it waits (wake.h); clients get
  // a copy.
  int bell() const { return wake_.bell(); }
  // Ends a wait now (shutdown: g_quit is read once per pass).
  void wake() { wake_.ring_always(); }
  LcoreGate& gate() { return gate_; }
  transport::Engine& engine() { return engine_; }
  // Home `queue()` of QPs: this worker serves the shim's doorbells of the
  // QPs and SRQs homed here. With `peers` (every worker, by home index; at
  // least two) a RoCE frame for a QP of another worker goes to that worker
  // by ring (MP/SC), decoded and checked once, here.
  void serve(ShimServer* shim, std::span<Worker* const> peers);
  void set_zero_copy(const ZeroCopyTx* zc) { zc_ = zc; }
  // Where frames for QP1 (CM MADs) go: the control thread's ring (MP/SC).
  void set_gsi(rte_ring* r) { gsi_ = r; }
  // Control thread, before launch or while parked: the fault stages' new
  // settings (each direction and lcore draws from its own stream of `seed`).
  void set_fault(const config::FaultConfig& f, uint64_t seed);

 private:
  void loop_st();
  bool can_wait_st() const;
  void announce_st();
  void withdraw_st();
  void wake_handed_st();
  void handle_st(rte_mbuf* m, uint64_t now);
  void commands_st(uint64_t now);
  void send_ip_st(rte_mbuf* m, const uint8_t gid[16], uint64_t now);
  void send_resolve_request_st(const uint8_t gid[16]);
  void tx_st(rte_mbuf* m);
  void tx_flush_st();     // what the PMD does not take stays buffered
  void tx_drop_all_st();  // shutdown: frees (and counts) what is buffered
  bool accept_l2_st(const rte_mbuf* m);
  uint32_t local_rx_st(uint64_t now);
  void handoff_rx_st(rte_mbuf* m, uint64_t now);
  void mcast_rx_st(rte_mbuf* m, const wire::FrameInfo& fi,
                   std::span<const wire::ConstBuf> segs, uint64_t now);
  void igmp_rx_st(const uint8_t* frame, uint32_t len, const wire::FrameInfo& fi,
                  uint64_t now);
  void hand_off_st(uint32_t home, rte_mbuf* m);
  bool release_held_st();  // true when no frame is held for another worker
  void rx_st(rte_mbuf* m, uint64_t now);  // through the RX fault stage
  uint32_t fault_release_st(uint64_t now);
  // PacketIo: copies the frame into (chained) mbufs from the port's pool;
  // false when the pool is empty (the engine retries on a later poll).
  // Zero-copy external buffers come with shared-memory MRs.
  bool transmit(const transport::TxFrame& f) override;

  const config::Config& cfg_;
  const PortInfo& port_;
  const host::HostAddrs& addrs_;
  const host::GidTable gids_;
  host::NeighbourTable& nt_;
  uint32_t lcore_;
  uint16_t queue_;
  uint16_t burst_;
  uint16_t vlan_tci_;
  // Since when the engine's timers wait for a full RX ring to be read (0:
  // they do not); they run at least every kTimerDeferNs.
  static constexpr uint64_t kTimerDeferNs = 2'000'000;
  uint64_t timers_deferred_ns_ = 0;
  stats::LcoreCounters ctr_;
  rte_ring* cmd_ring_ = nullptr;
  host::PendingQueue<rte_mbuf*> pending_;
  uint16_t tx_n_ = 0;
  uint16_t ping_seq_ = 0;
  uint64_t igmp_answered_ns_ = 0;  // when an IGMP query was last answered
  rte_mbuf* tx_[config::kMaxBurst];
  transport::Engine engine_;
  Wake wake_;
  LcoreGate gate_;
  ShimServer* shim_ = nullptr;
  const ZeroCopyTx* zc_ = nullptr;  // null: every payload is copied
  std::span<Worker* const> peers_;  // by home; empty with one worker
  rte_ring* gsi_ = nullptr;         // QP1 frames to the control thread
  rte_ring* handoff_ = nullptr;     // RoCE frames for our QPs (MP/SC)
  // Frames for another worker whose hand-off ring was full, oldest first
  // (order per QP holds: nothing overtakes them), by home; see kHandoffHold.
  struct Held {
    rte_mbuf* m[kHandoffHold];
    uint32_t head = 0, n = 0;
  };
  std::vector<Held> held_;  // sized by serve(); empty with one worker
  uint32_t held_total_ = 0;
  uint32_t handed_ = 0;  // bit per home: frames handed off this pass
  // Frames to our own MAC (a QP talking to a QP of this service) loop back
  // here, whole and with their ICRC, and are received on the next loop.
  static constexpr uint32_t kLoopSize = 1024;
  rte_mbuf* loop_[kLoopSize];
  uint32_t loop_head_ = 0, loop_tail_ = 0;
  FaultStage<MbufFaultOps> rx_fault_;
  FaultStage<MbufFaultOps> tx_fault_;
  uint64_t now_ = 0;  // this loop's time (transmit() has no `now`)
  // A gap between passes this long or longer (beyond the idle the loop
  // chose: a sleep, a wait, a yield) is a pause of the lcore's
  // (Engine::lcore_paused): a pass takes microseconds.
  static constexpr uint64_t kPauseNs = 500'000;
  // How late a yield or a sleep may come back and still be idle the lcore
  // chose: the turns of the CPU's other runnable threads (4 ms ticks here,
  // a few of them). Beyond it the lcore was stopped (SIGSTOP, a vCPU
  // descheduled), and the rest is a pause.
  static constexpr uint64_t kIdleLateNs = 20'000'000;
  // After a park, how long the idle lcore polls before its back-off
  // resumes (loop_st: the next park of a run finds it awake).
  static constexpr uint64_t kControlBurstNs = 1'000'000;
  // With no QP on the device, how long without work before the idle
  // back-off takes lcores.idle.no_qp_sleep_us instead of sleep_us.
  static constexpr uint64_t kQuietNs = 1'000'000'000;
  // handle_st's decoding, reused: decode() fills it whole, and a local
  // would be zeroed once more for every packet by its initializers.
  wire::FrameInfo rx_fi_;
};

// An IGMPv2 report (or with `leave` a Leave Group) for IPv4 `group` in a
// new mbuf of `pool` (host::build_igmp), or null when the pool is empty.
rte_mbuf* igmp_frame(rte_mempool* pool, const host::HostAddrs& a,
                     uint16_t vlan_tci, uint32_t group, bool leave);

// Device attributes of the port: MAC, GIDs, limits, and the largest IB MTU
// whose RoCEv2 packets fit the IP MTU.
transport::DeviceConfig device_config(const config::Config& cfg,
                                      const PortInfo& port,
                                      const host::HostAddrs& addrs);

}  // namespace urnic::service
