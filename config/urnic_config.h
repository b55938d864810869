// urnicd configuration: one struct per YAML section, defaults in the member
// initialisers, a table-driven YAML decoder and a dump for round trips.
// Schema and defaults are documented in config/README.md.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace urnic::config {

// Thrown by parse() and load_file(); message is
// "FILE:LINE:COL: key 'a.b.c': what" (FILE is "<override>" for -o errors).
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct EalConfig {
  uint32_t main_lcore = 0;              // control thread
  std::vector<uint32_t> workers = {1};  // pinned data-path lcores
  bool huge = false;                    // false: --no-huge (IOVA as VA)
  uint32_t memory_mb = 256;             // -m
  std::string file_prefix = "urnic";    // --file-prefix
  std::string log_level = "notice";     // --log-level (EAL/PMD)
  std::vector<std::string> extra_args;  // appended verbatim
};

struct Ipv4Cidr {
  uint32_t addr = 0;  // host byte order
  uint8_t prefix = 0;
  bool present = false;
};

struct Ipv6Cidr {
  uint8_t addr[16] = {};
  uint8_t prefix = 0;
  bool present = false;
};

struct PortConfig {
  // Exactly one of pci / vdev is set: a PCI address (e1000/igb bound to
  // vfio-pci) or a DPDK vdev string ("net_af_packet0,iface=veth0").
  std::string pci;
  std::string vdev;
  uint32_t mtu = 1500;  // IP MTU; RoCE path MTU derives from it
  std::string mac;      // empty: use the port's own MAC
  uint16_t rx_desc = 1024;
  uint16_t tx_desc = 1024;
  uint16_t vlan = 0;                 // 0: untagged; 1..4094: one 802.1Q tag
  Ipv4Cidr ipv4;                     // required
  Ipv6Cidr ipv6;                     // optional
  uint8_t ttl = 64;                  // IPv4 TTL / IPv6 hop limit we send
  bool promiscuous = true;           // needed for memif/af_packet peers' MACs
  std::string gid_layout = "urnic";  // "urnic" or "kernel" (gid_table.h)
};

struct MempoolConfig {
  uint32_t mbufs = 8191;      // per port; 2^n - 1 is optimal for rte_mempool
  uint32_t cache = 256;       // per-lcore cache
  uint16_t data_room = 2176;  // RTE_MBUF_DEFAULT_BUF_SIZE
};

// Idle back-off of a worker lcore: busy-poll for spin_polls empty bursts,
// then rte_pause() (or sched_yield() with yield) for pause_polls more, then
// sleep sleep_us per empty poll. sleep_us = 0 keeps pure busy polling
// (benchmarks). With yield and spin_polls not given, spin_polls is
// kSpinPollsYield: a worker that shares its CPU yields at its first empty
// poll (perf/README.md, "Request / response latency and the idle
// back-off"). While the service has no QP at all and a worker has had
// nothing to do for a second, its sleeps are no_qp_sleep_us instead (when
// longer and sleep_us is not 0): nothing can then wait on it but address
// resolution, pings, CM MADs and control commands, and 50 us sleeps cost
// an idle worker ~30 % of a core on a VM (perf/README.md, "An idle
// service"). Where the port can wake the worker (af_packet, AF_XDP) and
// nothing but a frame or a work request can give it work, it waits for
// those instead of sleeping, up to wait_ms (0: never; the timed sleeps).
struct IdleConfig {
  static constexpr uint32_t kSpinPollsYield = 0;
  uint32_t spin_polls = 256;
  uint32_t pause_polls = 4096;
  uint32_t sleep_us = 50;
  uint32_t no_qp_sleep_us = 1000;
  uint32_t wait_ms = 100;
  bool yield = false;
};

// The worker keeps RX and TX arrays of this many mbufs on its stack/state.
constexpr uint16_t kMaxBurst = 64;
// Worker lcores of a service: each is the home of some QPs and owns whole
// summary words of a client's doorbell page (dataplane/hostif/abi.h
// kSummaryWords; the service checks they agree).
constexpr uint32_t kMaxWorkers = 16;

struct LcoreConfig {
  uint16_t burst = 32;  // 1..kMaxBurst
  IdleConfig idle;
};

struct ControlConfig {
  std::string socket = "/run/urnic/urnicd.sock";
  uint32_t mode = 0660;  // YAML digits are always octal: 0660, 660, "0660"
  std::string owner;     // user name or uid of the socket file; "": ours
  std::string group;     // group name or gid of the socket file; "": ours
  // Who may use the service (names or numbers, checked with SO_PEERCRED
  // and SO_PEERGROUPS at connect). Both empty: whoever the socket's mode
  // lets in. root and the service's own user are always allowed.
  std::vector<std::string> allow_users;
  std::vector<std::string> allow_groups;
};

struct StatsConfig {
  uint32_t period_ms = 1000;  // 0: no periodic print
  bool print_on_exit = true;
};

// The RDMA CM (dataplane/service/cm_server.h).
struct CmConfig {
  // A REQ or SIDR_REQ for a service nobody listens on waits this long for a
  // listener before it is refused (REJ "invalid service ID" / SIDR_REP
  // "unsupported"); 0 refuses it at once, as Linux's CM does.
  uint32_t listen_grace_ms = 100;
};

struct ArpConfig {
  uint32_t entries = 1024;  // neighbour cache capacity
  uint32_t reachable_ms = 300000;
  uint32_t retry_ms = 1000;
  uint32_t retries = 3;
  uint32_t queue_len = 64;  // packets held per lcore awaiting resolution
};

// Device limits the service reports to applications (ibv_query_device) and
// enforces. Defaults are those of transport::Limits
// (dataplane/transport/types.h); this library does not include it.
struct LimitsConfig {
  uint32_t max_qp = 16384;
  uint32_t max_qp_wr = 4096;  // per send / receive queue
  uint32_t max_sge = 16;      // <= transport::kMaxSge
  uint32_t max_inline = 256;  // bytes, <= transport::kMaxInline
  uint32_t max_cq = 16384;
  // What ConnectX reports. libfabric's ofi_rxm asks (384 + 384) x 256 =
  // 196 608 (its CQ spans FI_UNIVERSE_SIZE peers); a CQ's ring is shared
  // memory, its pages allocated as completions reach them.
  uint32_t max_cqe = 4194303;
  uint32_t max_mr = 65536;
  uint64_t max_mr_size = uint64_t{1} << 40;  // bytes
  uint32_t max_pd = 16384;
  uint32_t max_srq = 4096;
  uint32_t max_srq_wr = 16384;
  uint32_t max_ah = 65536;
  uint32_t max_msg_sz = uint32_t{1} << 31;  // bytes
  uint8_t max_rd_atomic = 16;       // outstanding reads/atomics we initiate
  uint8_t max_dest_rd_atomic = 16;  // responder resources per QP
};

// Per-client limits: what one verbs context (one ibv_open_device through
// the shim, one control connection) may hold. 0: only the device's limits
// (`limits`) apply. Over a limit the verbs call fails with ENOMEM, as it
// does when a device runs out of the object.
struct ClientLimitsConfig {
  uint32_t max_pd = 0;
  uint32_t max_cq = 0;
  uint32_t max_qp = 0;
  uint32_t max_srq = 0;
  uint32_t max_mr = 0;
  uint64_t max_mr_bytes = 0;  // registered bytes, all its MRs together
  uint32_t max_ah = 0;
  // Work requests asked for: max_send_wr + max_recv_wr of its QPs (without
  // the receive side of QPs on an SRQ) and max_wr of its SRQs.
  uint32_t max_wr = 0;
};

// DCQCN reaction point (transport/congestion.h DcqcnParams): the names of
// NVIDIA ConnectX firmware and its defaults but for four time and event
// scales (congestion.h and config/README.md say why). Rates Mb/s, times
// microseconds.
struct DcqcnConfig {
  uint32_t rpg_max_rate = 0;  // 0: the port's link speed
  uint32_t rpg_min_rate = 1;
  uint32_t rate_to_set_on_first_cnp = 0;
  uint32_t rpg_min_dec_fac = 50;
  uint32_t rpg_gd = 11;
  uint32_t dce_tcp_g = 1019;
  uint32_t dce_tcp_rtt = 100;  // ConnectX: 1
  uint32_t initial_alpha_value = 1023;
  uint32_t rate_reduce_monitor_period = 4;
  uint32_t rpg_time_reset = 100;       // ConnectX: 300
  uint32_t rpg_byte_reset = 10485760;  // ConnectX: 32767
  uint32_t rpg_threshold = 5;          // ConnectX: 1
  uint32_t rpg_ai_rate = 20;           // ConnectX: 5
  uint32_t rpg_hai_rate = 50;
  uint32_t rpg_time_share_qps = 2;  // ConnectX: none (0)
};

// Congestion control of RC requesters (transport/congestion.h).
//   window: a loss-driven window per QP (AIMD in packets: halved once per
//           window on a loss, minimum after a timeout, +1 per window ACKed);
//           a CNP cuts the windows as a loss would
//   dcqcn:  the same windows for losses; a CNP cuts the QP's rate (DCQCN),
//           and the QP is paced at that rate
//   off:    every QP may have max_unacked packets in flight
struct CcConfig {
  std::string algorithm = "dcqcn";
  uint32_t init_window = 32;  // packets in flight a QP starts with
  uint32_t min_window = 2;    // packets, after a timeout (and the floor)
  // A loss cuts a window no lower than the packets the path was seen to
  // hold (highest delivery rate x lowest round trip lately); false: halve.
  bool pipe_floor = true;
  // The window all RC QPs of a worker lcore share: each QP may use its
  // share (window / QPs with packets in flight) or its own, the smaller.
  uint32_t shared_init_window = 256;
  uint32_t shared_min_window = 16;
  // Its ceiling; 0: none.
  uint32_t shared_max_window = 0;
  // Grants of the shared window: a QP with nothing in flight starts only
  // when the window has room for this many packets (or fewer QPs send
  // than it holds grants), QPs waiting queue in order, and a QP yields after 4
  // x grant packets while others wait. Many QPs then take turns with useful
  // windows instead of each holding a few packets (an ACK per packet or two).
  // 0: off.
  uint32_t grant = 16;
  // ECN: RC data leaves ECT(0); CE-marked packets are answered with a CNP
  // (at most one per QP per cnp_interval_us); a CNP cuts the windows.
  bool ecn = true;
  uint32_t cnp_interval_us = 50;
  uint32_t pace_burst_kb = 4;  // depth of a paced QP's token bucket
  DcqcnConfig dcqcn;
};

// Transport engine tuning (transport::EngineConfig and the timer wheel).
struct TransportConfig {
  uint32_t ack_req_every = 32;  // AckReq on at least every Nth packet
  uint32_t max_unacked = 512;   // requester window, in packets (PSNs)
  uint32_t tx_budget = 64;      // packets one QP may send per poll
  uint32_t tx_quantum = 32768;  // bytes one QP may send per turn (DRR)
  uint32_t poll_budget = 256;   // packets one engine poll sends, all QPs
  uint32_t timer_tick_us = 1;   // timer wheel resolution
  // Tail-loss probe floor (transport::EngineConfig::tail_probe_ns); 0: off.
  uint32_t tail_probe_us = 200;
  // Transmit payload from the applications' registered memory as external
  // mbuf buffers instead of copying it (vdev ports, and PCI ports where the
  // IOVA is the VA: vfio; README.md says when it copies).
  bool zero_copy_tx = true;
  CcConfig cc;
};

// Fault injection on the port, one direction (dataplane/service/fault.h):
// applied to RoCEv2 frames only, in this order: burst loss, random loss,
// corruption, duplication, reordering, then the bottleneck queue (rate,
// tail drop, ECN CE marking) and the delay. Probabilities in parts per
// million. All zero (the default): the stage is off and costs nothing.
struct FaultDirConfig {
  uint32_t drop_ppm = 0;       // each frame lost with this probability
  uint32_t burst_ppm = 0;      // a frame starts a burst of losses
  uint32_t burst_len = 8;      // frames one burst loses
  uint32_t corrupt_ppm = 0;    // one byte flipped (the ICRC check fails)
  uint32_t duplicate_ppm = 0;  // sent twice
  uint32_t reorder_ppm = 0;    // held back behind reorder_gap later frames
  uint32_t reorder_gap = 4;
  uint32_t delay_us = 0;    // added to every frame's way
  uint32_t rate_mbps = 0;   // bottleneck rate; 0: none
  uint32_t queue_kb = 256;  // the bottleneck's buffer (tail drop above)
  uint32_t ecn_kb = 0;  // queue above which ECT frames are CE-marked; 0: never
};

struct FaultConfig {
  uint64_t seed = 0;  // 0: a random seed (printed at start)
  FaultDirConfig rx;
  FaultDirConfig tx;
};

struct Config {
  std::string source = "<embedded>";  // file name, for messages
  EalConfig eal;
  PortConfig port;
  MempoolConfig mempool;
  LcoreConfig lcores;
  ControlConfig control;
  StatsConfig stats;
  ArpConfig arp;
  CmConfig cm;
  LimitsConfig limits;
  ClientLimitsConfig client_limits;
  TransportConfig transport;
  FaultConfig fault;
};

// Parses YAML text. `source` names it in errors. `overrides` are
// "dotted.key=value" strings (urnicd -o) applied before decoding, with the
// value parsed as YAML. Throws ConfigError on unknown keys, wrong types,
// out-of-range values and missing required keys.
Config parse(const std::string& yaml_text, const std::string& source,
             const std::vector<std::string>& overrides = {});
Config load_file(const std::string& path,
                 const std::vector<std::string>& overrides = {});

// The default configuration compiled into urnicd (config/urnicd.yaml).
const std::string& embedded_default();

// Emits YAML that parse() turns back into an equal Config.
std::string dump(const Config& cfg);

// Compares every configuration field. Ignores `source` and the address bytes
// of an absent (present == false) Ipv4Cidr / Ipv6Cidr.
bool operator==(const Config& a, const Config& b);

// "a.b.c.d" <-> host-order uint32; "x:x::x" <-> 16 bytes.
bool parse_ipv4(const std::string& s, uint32_t& out);
bool parse_ipv6(const std::string& s, uint8_t out[16]);
bool parse_mac(const std::string& s, uint8_t out[6]);
std::string format_ipv4(uint32_t addr);
std::string format_ipv6(const uint8_t addr[16]);

}  // namespace urnic::config
