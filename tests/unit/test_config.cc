// Tests for the urnicd YAML configuration loader (config/urnic_config.h):
// shipped configs, round trips, every tests/config-bad/ file, overrides and
// the address helpers.

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "config/urnic_config.h"
#include "dataplane/service/engine_config.h"
#include "dataplane/transport/congestion.h"
#include "dataplane/transport/types.h"

#ifndef URNIC_SOURCE_DIR
#error "URNIC_SOURCE_DIR must be defined to the source tree root"
#endif

namespace urnic::config {

// gtest prints a Config through this (found by ADL) in failure messages.
void PrintTo(const Config& cfg, std::ostream* os) {
  *os << "\n" << dump(cfg);
}

namespace {

namespace fs = std::filesystem;

const fs::path kSourceDir = URNIC_SOURCE_DIR;

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// config/urnicd.yaml and config/examples/*.yaml.
std::vector<fs::path> shipped_configs() {
  std::vector<fs::path> files = {kSourceDir / "config" / "urnicd.yaml"};
  for (const auto& e :
       fs::directory_iterator(kSourceDir / "config" / "examples")) {
    if (e.path().extension() == ".yaml") files.push_back(e.path());
  }
  std::sort(files.begin() + 1, files.end());
  return files;
}

// The message of the ConfigError that f throws, or "" (and a failure).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError thrown";
  return {};
}

std::string parse_error(const std::string& yaml,
                        const std::vector<std::string>& overrides = {}) {
  return error_of([&] { parse(yaml, "t.yaml", overrides); });
}

// A minimal valid document to build test cases on.
constexpr const char* kMinimal =
    "port:\n"
    "  vdev: net_null0\n"
    "  ipv4: 10.0.0.1/24\n";

// The documented defaults: the struct initialisers plus what the demo
// config/urnicd.yaml sets on top (README.md, "Defaults").
Config documented_default() {
  Config c;
  c.eal.file_prefix = "urnicd";
  c.port.vdev =
      "net_af_packet0,iface=urnic-svc,qpairs=1,blocksz=4096,framesz=2048,"
      "framecnt=4096,qdisc_bypass=0";
  c.port.ipv4 = {.addr = 0x0a4d0001, .prefix = 24, .present = true};
  return c;
}

TEST(ConfigDefaults, StructDefaultsAreTheDocumentedOnes) {
  const Config c;
  EXPECT_EQ(c.eal.main_lcore, 0u);
  EXPECT_EQ(c.eal.workers, std::vector<uint32_t>{1});
  EXPECT_FALSE(c.eal.huge);
  EXPECT_EQ(c.eal.memory_mb, 256u);
  EXPECT_EQ(c.eal.log_level, "notice");
  EXPECT_EQ(c.port.mtu, 1500u);
  EXPECT_EQ(c.port.rx_desc, 1024);
  EXPECT_EQ(c.port.ttl, 64);
  EXPECT_EQ(c.mempool.mbufs, 8191u);
  EXPECT_EQ(c.mempool.cache, 256u);
  EXPECT_EQ(c.mempool.data_room, 2176);
  EXPECT_EQ(c.lcores.burst, 32);
  EXPECT_EQ(c.lcores.idle.sleep_us, 50u);
  EXPECT_EQ(c.lcores.idle.no_qp_sleep_us, 1000u);
  EXPECT_EQ(c.lcores.idle.wait_ms, 100u);
  EXPECT_EQ(c.control.socket, "/run/urnic/urnicd.sock");
  EXPECT_EQ(c.control.mode, 0660u);
  EXPECT_EQ(c.stats.period_ms, 1000u);
  EXPECT_EQ(c.arp.entries, 1024u);
}

TEST(ConfigDefaults, LimitsDefaultsAreTheDeviceLimits) {
  const LimitsConfig l;
  EXPECT_EQ(l.max_qp, 16384u);
  EXPECT_EQ(l.max_qp_wr, 4096u);
  EXPECT_EQ(l.max_sge, 16u);
  EXPECT_EQ(l.max_inline, 256u);
  EXPECT_EQ(l.max_cq, 16384u);
  EXPECT_EQ(l.max_cqe, 4194303u);
  EXPECT_EQ(l.max_mr, 65536u);
  EXPECT_EQ(l.max_mr_size, 1099511627776u);
  EXPECT_EQ(l.max_pd, 16384u);
  EXPECT_EQ(l.max_srq, 4096u);
  EXPECT_EQ(l.max_srq_wr, 16384u);
  EXPECT_EQ(l.max_ah, 65536u);
  EXPECT_EQ(l.max_msg_sz, 2147483648u);
  EXPECT_EQ(l.max_rd_atomic, 16);
  EXPECT_EQ(l.max_dest_rd_atomic, 16);

  // The same values as the engine's own defaults (the config library does
  // not include the transport headers, so check here they did not drift).
  const transport::Limits d;
  EXPECT_EQ(l.max_qp, d.max_qp);
  EXPECT_EQ(l.max_qp_wr, d.max_qp_wr);
  EXPECT_EQ(l.max_sge, d.max_sge);
  EXPECT_EQ(l.max_sge, transport::kMaxSge);
  EXPECT_EQ(l.max_inline, d.max_inline);
  EXPECT_EQ(l.max_inline, transport::kMaxInline);
  EXPECT_EQ(l.max_cq, d.max_cq);
  EXPECT_EQ(l.max_cqe, d.max_cqe);
  EXPECT_EQ(l.max_mr, d.max_mr);
  EXPECT_EQ(l.max_mr_size, d.max_mr_size);
  EXPECT_EQ(l.max_pd, d.max_pd);
  EXPECT_EQ(l.max_srq, d.max_srq);
  EXPECT_EQ(l.max_srq_wr, d.max_srq_wr);
  EXPECT_EQ(l.max_ah, d.max_ah);
  EXPECT_EQ(l.max_msg_sz, d.max_msg_sz);
  EXPECT_EQ(l.max_rd_atomic, d.max_rd_atomic);
  EXPECT_EQ(l.max_dest_rd_atomic, d.max_dest_rd_atomic);
}

TEST(ConfigDefaults, TransportDefaults) {
  const TransportConfig t;
  EXPECT_EQ(t.ack_req_every, 32u);
  EXPECT_EQ(t.max_unacked, 512u);
  EXPECT_EQ(t.tx_budget, 64u);
  EXPECT_EQ(t.tx_quantum, 32768u);
  EXPECT_EQ(t.timer_tick_us, 1u);
  EXPECT_EQ(t.tail_probe_us, 200u);
  EXPECT_TRUE(t.zero_copy_tx);
  EXPECT_EQ(t.cc.algorithm, "dcqcn");
  EXPECT_EQ(t.cc.init_window, 32u);
  EXPECT_EQ(t.cc.min_window, 2u);
  EXPECT_TRUE(t.cc.pipe_floor);
  EXPECT_EQ(t.cc.shared_max_window, 0u);  // no ceiling
  // The config's DCQCN defaults are the engine's (congestion.h).
  const transport::DcqcnParams e;
  const DcqcnConfig& d = t.cc.dcqcn;
  EXPECT_EQ(d.rpg_max_rate, e.rpg_max_rate);
  EXPECT_EQ(d.rpg_min_rate, e.rpg_min_rate);
  EXPECT_EQ(d.rate_to_set_on_first_cnp, e.rate_to_set_on_first_cnp);
  EXPECT_EQ(d.rpg_min_dec_fac, e.rpg_min_dec_fac);
  EXPECT_EQ(d.rpg_gd, e.rpg_gd);
  EXPECT_EQ(d.dce_tcp_g, e.dce_tcp_g);
  EXPECT_EQ(d.dce_tcp_rtt, e.dce_tcp_rtt);
  EXPECT_EQ(d.initial_alpha_value, e.initial_alpha_value);
  EXPECT_EQ(d.rate_reduce_monitor_period, e.rate_reduce_monitor_period);
  EXPECT_EQ(d.rpg_time_reset, e.rpg_time_reset);
  EXPECT_EQ(d.rpg_byte_reset, e.rpg_byte_reset);
  EXPECT_EQ(d.rpg_threshold, e.rpg_threshold);
  EXPECT_EQ(d.rpg_ai_rate, e.rpg_ai_rate);
  EXPECT_EQ(d.rpg_hai_rate, e.rpg_hai_rate);
  EXPECT_EQ(d.rpg_time_share_qps, e.rpg_time_share_qps);
  EXPECT_EQ(t.cc.pace_burst_kb * 1024, transport::CcParams{}.pace_burst_bytes);
}

// Every `transport:` key reaches the engine (service::engine_config):
// each set to a value of its own, none its default, so a key the mapping
// drops or swaps with another shows.
TEST(ConfigEngine, EveryTransportKeyReachesTheEngine) {
  TransportConfig t;
  uint32_t v = 1000;
  for (uint32_t* f :
       {&t.ack_req_every, &t.max_unacked, &t.tx_budget, &t.tx_quantum,
        &t.poll_budget, &t.timer_tick_us, &t.tail_probe_us, &t.cc.init_window,
        &t.cc.min_window, &t.cc.shared_init_window, &t.cc.shared_min_window,
        &t.cc.shared_max_window, &t.cc.grant, &t.cc.cnp_interval_us,
        &t.cc.pace_burst_kb})
    *f = ++v;
  DcqcnConfig& d = t.cc.dcqcn;
  for (uint32_t* f :
       {&d.rpg_max_rate, &d.rpg_min_rate, &d.rate_to_set_on_first_cnp,
        &d.rpg_min_dec_fac, &d.rpg_gd, &d.dce_tcp_g, &d.dce_tcp_rtt,
        &d.initial_alpha_value, &d.rate_reduce_monitor_period,
        &d.rpg_time_reset, &d.rpg_byte_reset, &d.rpg_threshold, &d.rpg_ai_rate,
        &d.rpg_hai_rate, &d.rpg_time_share_qps})
    *f = ++v;
  t.cc.pipe_floor = false;
  t.cc.ecn = false;
  for (const char* algo : {"off", "window", "dcqcn"}) {
    SCOPED_TRACE(algo);
    t.cc.algorithm = algo;
    const transport::EngineConfig e = service::engine_config(t, 12345);
    EXPECT_EQ(e.cc.window, std::string(algo) != "off");
    EXPECT_EQ(e.cc.dcqcn, std::string(algo) == "dcqcn");
  }
  const transport::EngineConfig e = service::engine_config(t, 12345);
  EXPECT_EQ(e.ack_req_every, t.ack_req_every);
  EXPECT_EQ(e.max_unacked, t.max_unacked);
  EXPECT_EQ(e.tx_budget, t.tx_budget);
  EXPECT_EQ(e.tx_quantum, t.tx_quantum);
  EXPECT_EQ(e.poll_budget, t.poll_budget);
  EXPECT_EQ(e.timer_tick_ns, uint64_t{t.timer_tick_us} * 1000);
  EXPECT_EQ(e.tail_probe_ns, uint64_t{t.tail_probe_us} * 1000);
  const transport::CcParams& c = e.cc;
  EXPECT_EQ(c.init_window, t.cc.init_window);
  EXPECT_EQ(c.min_window, t.cc.min_window);
  EXPECT_FALSE(c.pipe_floor);
  EXPECT_EQ(c.shared_init_window, t.cc.shared_init_window);
  EXPECT_EQ(c.shared_min_window, t.cc.shared_min_window);
  EXPECT_EQ(c.shared_max_window, t.cc.shared_max_window);
  EXPECT_EQ(c.grant, t.cc.grant);
  EXPECT_FALSE(c.ecn);
  EXPECT_EQ(c.cnp_interval_ns, uint64_t{t.cc.cnp_interval_us} * 1000);
  EXPECT_EQ(c.pace_burst_bytes, t.cc.pace_burst_kb * 1024);
  EXPECT_EQ(c.line_rate_mbps, 12345u);
  const transport::DcqcnParams& p = c.dcqcn_params;
  EXPECT_EQ(p.rpg_max_rate, d.rpg_max_rate);
  EXPECT_EQ(p.rpg_min_rate, d.rpg_min_rate);
  EXPECT_EQ(p.rate_to_set_on_first_cnp, d.rate_to_set_on_first_cnp);
  EXPECT_EQ(p.rpg_min_dec_fac, d.rpg_min_dec_fac);
  EXPECT_EQ(p.rpg_gd, d.rpg_gd);
  EXPECT_EQ(p.dce_tcp_g, d.dce_tcp_g);
  EXPECT_EQ(p.dce_tcp_rtt, d.dce_tcp_rtt);
  EXPECT_EQ(p.initial_alpha_value, d.initial_alpha_value);
  EXPECT_EQ(p.rate_reduce_monitor_period, d.rate_reduce_monitor_period);
  EXPECT_EQ(p.rpg_time_reset, d.rpg_time_reset);
  EXPECT_EQ(p.rpg_byte_reset, d.rpg_byte_reset);
  EXPECT_EQ(p.rpg_threshold, d.rpg_threshold);
  EXPECT_EQ(p.rpg_ai_rate, d.rpg_ai_rate);
  EXPECT_EQ(p.rpg_hai_rate, d.rpg_hai_rate);
  EXPECT_EQ(p.rpg_time_share_qps, d.rpg_time_share_qps);
  // shared_max_window 0: no ceiling, the engine's own default.
  t.cc.shared_max_window = 0;
  EXPECT_EQ(service::engine_config(t, 12345).cc.shared_max_window,
            transport::CcParams{}.shared_max_window);
}

TEST(ConfigDefaults, EmbeddedDefaultHasLimitsAndTransportDefaults) {
  const Config c = parse(embedded_default(), "<embedded>");
  EXPECT_EQ(dump(Config{.limits = c.limits, .transport = c.transport}),
            dump(Config{}));
  EXPECT_EQ(c.limits.max_mr_size, uint64_t{1} << 40);
  EXPECT_EQ(c.transport.max_unacked, 512u);
}

TEST(ConfigDefaults, EmbeddedDefaultParsesToDocumentedDefaults) {
  const Config c = parse(embedded_default(), "<embedded>");
  EXPECT_EQ(c, documented_default());
  EXPECT_EQ(c.source, "<embedded>");
}

TEST(ConfigDefaults, EmbeddedDefaultIsConfigUrnicdYaml) {
  EXPECT_EQ(embedded_default(),
            read_text(kSourceDir / "config" / "urnicd.yaml"));
}

TEST(ConfigDefaults, MinimalDocumentGetsStructDefaults) {
  Config expected;
  expected.port.vdev = "net_null0";
  expected.port.ipv4 = {.addr = 0x0a000001, .prefix = 24, .present = true};
  EXPECT_EQ(parse(kMinimal, "t.yaml"), expected);
}

TEST(ConfigShipped, EveryShippedConfigParsesAndRoundTrips) {
  const auto files = shipped_configs();
  EXPECT_GE(files.size(), 6u);  // urnicd.yaml + 5 examples
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    Config c;
    ASSERT_NO_THROW(c = load_file(f.string())) << [&] {
      try {
        load_file(f.string());
      } catch (const ConfigError& e) {
        return std::string(e.what());
      }
      return std::string();
    }();
    EXPECT_EQ(c.source, f.string());
    const std::string text = dump(c);
    const Config back = parse(text, "<dump>");
    EXPECT_EQ(back, c);
    EXPECT_EQ(dump(back), text);  // dump is a fixed point
  }
}

TEST(ConfigShipped, ExamplesSetWhatTheyPromise) {
  const auto dir = kSourceDir / "config" / "examples";
  const Config e1000 = load_file((dir / "e1000-vfio.yaml").string());
  EXPECT_EQ(e1000.port.pci, "0000:00:03.0");
  EXPECT_TRUE(e1000.port.vdev.empty());
  EXPECT_TRUE(e1000.eal.huge);

  const Config igb = load_file((dir / "igb-vfio.yaml").string());
  EXPECT_FALSE(igb.port.pci.empty());
  EXPECT_EQ(igb.eal.main_lcore, 0u);
  EXPECT_EQ(igb.eal.workers, (std::vector<uint32_t>{1, 2}));

  const Config afp = load_file((dir / "af_packet.yaml").string());
  EXPECT_TRUE(afp.port.ipv6.present);
  EXPECT_EQ(afp.port.vdev.rfind("net_af_packet", 0), 0u);

  // The memif pair shares the memif socket and id, differs in the rest.
  const Config a = load_file((dir / "memif-a.yaml").string());
  const Config b = load_file((dir / "memif-b.yaml").string());
  // memif takes its MAC as a devarg (it cannot be changed after probe).
  EXPECT_EQ(a.port.vdev,
            "net_memif0,role=server,socket=/run/urnic/memif.sock,id=0,"
            "mac=02:00:00:88:00:01");
  EXPECT_EQ(b.port.vdev,
            "net_memif0,role=client,socket=/run/urnic/memif.sock,id=0,"
            "mac=02:00:00:88:00:02");
  EXPECT_NE(a.eal.file_prefix, b.eal.file_prefix);
  EXPECT_NE(a.control.socket, b.control.socket);
  EXPECT_TRUE(a.port.mac.empty() && b.port.mac.empty());
  EXPECT_EQ(format_ipv4(a.port.ipv4.addr), "10.88.0.1");
  EXPECT_EQ(format_ipv4(b.port.ipv4.addr), "10.88.0.2");
  EXPECT_EQ(a.port.ipv4.prefix, 24);
  EXPECT_EQ(b.port.ipv4.prefix, 24);
}

// One mutation per configuration field, each away from the struct default.
// Keep in sync with urnic_config.h; CountsEveryKey checks the count.
const std::vector<std::pair<const char*, std::function<void(Config&)>>>&
field_mutations() {
  static const std::vector<std::pair<const char*, std::function<void(Config&)>>>
      kMutations = {
          {"eal.main_lcore", [](Config& c) { c.eal.main_lcore = 3; }},
          {"eal.workers",
           [](Config& c) {
             c.eal.workers = {5, 4, 127};
           }},
          {"eal.huge", [](Config& c) { c.eal.huge = true; }},
          {"eal.memory_mb", [](Config& c) { c.eal.memory_mb = 1024; }},
          {"eal.file_prefix", [](Config& c) { c.eal.file_prefix = "x-1.y"; }},
          {"eal.log_level", [](Config& c) { c.eal.log_level = "debug"; }},
          {"eal.extra_args",
           [](Config& c) {
             // Strings YAML would otherwise read as other types or syntax.
             c.eal.extra_args = {"--vdev=net_null1,size=64",
                                 "",
                                 "true",
                                 "~",
                                 "null",
                                 "0660",
                                 "#x",
                                 " lead",
                                 "a: b",
                                 "quote\"back\\slash",
                                 "[1]",
                                 "caf\u00e9 \u2192 \U0001f600"};
           }},
          {"port.pci", [](Config& c) { c.port.pci = "0000:3b:00.1"; }},
          {"port.vdev", [](Config& c) { c.port.vdev = "net_tap0,iface=t"; }},
          {"port.mtu", [](Config& c) { c.port.mtu = 4200; }},
          {"port.mac", [](Config& c) { c.port.mac = "0a:1b:2c:3d:4e:5f"; }},
          {"port.rx_desc", [](Config& c) { c.port.rx_desc = 4096; }},
          {"port.tx_desc", [](Config& c) { c.port.tx_desc = 512; }},
          {"port.vlan", [](Config& c) { c.port.vlan = 4094; }},
          {"port.ipv4",
           [](Config& c) {
             c.port.ipv4 = {.addr = 0xc0a80102, .prefix = 30, .present = true};
           }},
          {"port.ipv6",
           [](Config& c) {
             c.port.ipv6.present = true;
             c.port.ipv6.prefix = 48;
             ASSERT_TRUE(parse_ipv6("2001:db8::42", c.port.ipv6.addr));
           }},
          {"port.ttl", [](Config& c) { c.port.ttl = 255; }},
          {"port.promiscuous", [](Config& c) { c.port.promiscuous = false; }},
          {"port.gid_layout",
           [](Config& c) {
             c.port.gid_layout = "kernel";  // needs IPv6
             c.port.ipv6.present = true;
             c.port.ipv6.prefix = 64;
             ASSERT_TRUE(parse_ipv6("fd00::1", c.port.ipv6.addr));
           }},
          {"mempool.mbufs", [](Config& c) { c.mempool.mbufs = 65535; }},
          {"mempool.cache", [](Config& c) { c.mempool.cache = 512; }},
          {"mempool.data_room", [](Config& c) { c.mempool.data_room = 9216; }},
          {"lcores.burst", [](Config& c) { c.lcores.burst = 64; }},
          {"lcores.idle.spin_polls",
           [](Config& c) { c.lcores.idle.spin_polls = 0; }},
          {"lcores.idle.pause_polls",
           [](Config& c) { c.lcores.idle.pause_polls = 1; }},
          {"lcores.idle.sleep_us",
           [](Config& c) { c.lcores.idle.sleep_us = 0; }},
          {"lcores.idle.no_qp_sleep_us",
           [](Config& c) { c.lcores.idle.no_qp_sleep_us = 0; }},
          {"lcores.idle.wait_ms", [](Config& c) { c.lcores.idle.wait_ms = 0; }},
          {"lcores.idle.yield", [](Config& c) { c.lcores.idle.yield = true; }},
          {"control.socket",
           [](Config& c) { c.control.socket = "/tmp/urnic test.sock"; }},
          {"control.mode", [](Config& c) { c.control.mode = 0600; }},
          {"control.owner", [](Config& c) { c.control.owner = "urnic"; }},
          {"control.group", [](Config& c) { c.control.group = "1001"; }},
          {"control.allow_users",
           [](Config& c) {
             c.control.allow_users = {"alice", "1002"};
           }},
          {"control.allow_groups",
           [](Config& c) { c.control.allow_groups = {"rdma"}; }},
          {"stats.period_ms", [](Config& c) { c.stats.period_ms = 0; }},
          {"stats.print_on_exit",
           [](Config& c) { c.stats.print_on_exit = false; }},
          {"arp.entries", [](Config& c) { c.arp.entries = 16; }},
          {"arp.reachable_ms", [](Config& c) { c.arp.reachable_ms = 1000; }},
          {"arp.retry_ms", [](Config& c) { c.arp.retry_ms = 60000; }},
          {"arp.retries", [](Config& c) { c.arp.retries = 100; }},
          {"arp.queue_len", [](Config& c) { c.arp.queue_len = 0; }},
          {"cm.listen_grace_ms", [](Config& c) { c.cm.listen_grace_ms = 0; }},
          {"limits.max_qp", [](Config& c) { c.limits.max_qp = 262144; }},
          {"limits.max_qp_wr", [](Config& c) { c.limits.max_qp_wr = 32768; }},
          {"limits.max_sge", [](Config& c) { c.limits.max_sge = 1; }},
          {"limits.max_inline", [](Config& c) { c.limits.max_inline = 0; }},
          {"limits.max_cq", [](Config& c) { c.limits.max_cq = 1; }},
          {"limits.max_cqe", [](Config& c) { c.limits.max_cqe = 4194304; }},
          {"limits.max_mr", [](Config& c) { c.limits.max_mr = 8388607; }},
          {"limits.max_mr_size",
           [](Config& c) { c.limits.max_mr_size = uint64_t{1} << 48; }},
          {"limits.max_pd", [](Config& c) { c.limits.max_pd = 7; }},
          {"limits.max_srq", [](Config& c) { c.limits.max_srq = 0; }},
          {"limits.max_srq_wr",
           [](Config& c) { c.limits.max_srq_wr = 1048576; }},
          {"limits.max_ah", [](Config& c) { c.limits.max_ah = 16777216; }},
          {"limits.max_msg_sz", [](Config& c) { c.limits.max_msg_sz = 1; }},
          {"limits.max_rd_atomic",
           [](Config& c) { c.limits.max_rd_atomic = 255; }},
          {"limits.max_dest_rd_atomic",
           [](Config& c) { c.limits.max_dest_rd_atomic = 1; }},
          {"client_limits.max_pd",
           [](Config& c) { c.client_limits.max_pd = 2; }},
          {"client_limits.max_cq",
           [](Config& c) { c.client_limits.max_cq = 3; }},
          {"client_limits.max_qp",
           [](Config& c) { c.client_limits.max_qp = 4; }},
          {"client_limits.max_srq",
           [](Config& c) { c.client_limits.max_srq = 5; }},
          {"client_limits.max_mr",
           [](Config& c) { c.client_limits.max_mr = 6; }},
          {"client_limits.max_mr_bytes",
           [](Config& c) { c.client_limits.max_mr_bytes = 1ull << 40; }},
          {"client_limits.max_ah",
           [](Config& c) { c.client_limits.max_ah = 7; }},
          {"client_limits.max_wr",
           [](Config& c) { c.client_limits.max_wr = 1u << 30; }},
          {"transport.ack_req_every",
           [](Config& c) { c.transport.ack_req_every = 1024; }},
          {"transport.max_unacked",
           [](Config& c) { c.transport.max_unacked = 8388607; }},
          {"transport.tx_budget", [](Config& c) { c.transport.tx_budget = 1; }},
          {"transport.tx_quantum",
           [](Config& c) { c.transport.tx_quantum = 4096; }},
          {"transport.poll_budget",
           [](Config& c) { c.transport.poll_budget = 64; }},
          {"transport.timer_tick_us",
           [](Config& c) { c.transport.timer_tick_us = 1000; }},
          {"transport.tail_probe_us",
           [](Config& c) { c.transport.tail_probe_us = 500; }},
          {"transport.zero_copy_tx",
           [](Config& c) { c.transport.zero_copy_tx = false; }},
          {"transport.cc.algorithm",
           [](Config& c) { c.transport.cc.algorithm = "off"; }},
          {"transport.cc.init_window",
           [](Config& c) { c.transport.cc.init_window = 64; }},
          {"transport.cc.min_window",
           [](Config& c) { c.transport.cc.min_window = 8; }},
          {"transport.cc.pipe_floor",
           [](Config& c) { c.transport.cc.pipe_floor = false; }},
          {"transport.cc.shared_init_window",
           [](Config& c) { c.transport.cc.shared_init_window = 1024; }},
          {"transport.cc.shared_min_window",
           [](Config& c) { c.transport.cc.shared_min_window = 32; }},
          {"transport.cc.shared_max_window",
           [](Config& c) { c.transport.cc.shared_max_window = 4096; }},
          {"transport.cc.grant", [](Config& c) { c.transport.cc.grant = 0; }},
          {"transport.cc.ecn", [](Config& c) { c.transport.cc.ecn = false; }},
          {"transport.cc.cnp_interval_us",
           [](Config& c) { c.transport.cc.cnp_interval_us = 4; }},
          {"transport.cc.pace_burst_kb",
           [](Config& c) { c.transport.cc.pace_burst_kb = 8; }},
          {"transport.cc.dcqcn.rpg_max_rate",
           [](Config& c) { c.transport.cc.dcqcn.rpg_max_rate = 25000; }},
          {"transport.cc.dcqcn.rpg_min_rate",
           [](Config& c) { c.transport.cc.dcqcn.rpg_min_rate = 10; }},
          {"transport.cc.dcqcn.rate_to_set_on_first_cnp",
           [](Config& c) {
             c.transport.cc.dcqcn.rate_to_set_on_first_cnp = 1000;
           }},
          {"transport.cc.dcqcn.rpg_min_dec_fac",
           [](Config& c) { c.transport.cc.dcqcn.rpg_min_dec_fac = 25; }},
          {"transport.cc.dcqcn.rpg_gd",
           [](Config& c) { c.transport.cc.dcqcn.rpg_gd = 10; }},
          {"transport.cc.dcqcn.dce_tcp_g",
           [](Config& c) { c.transport.cc.dcqcn.dce_tcp_g = 1000; }},
          {"transport.cc.dcqcn.dce_tcp_rtt",
           [](Config& c) { c.transport.cc.dcqcn.dce_tcp_rtt = 55; }},
          {"transport.cc.dcqcn.initial_alpha_value",
           [](Config& c) { c.transport.cc.dcqcn.initial_alpha_value = 512; }},
          {"transport.cc.dcqcn.rate_reduce_monitor_period",
           [](Config& c) {
             c.transport.cc.dcqcn.rate_reduce_monitor_period = 50;
           }},
          {"transport.cc.dcqcn.rpg_time_reset",
           [](Config& c) { c.transport.cc.dcqcn.rpg_time_reset = 55; }},
          {"transport.cc.dcqcn.rpg_byte_reset",
           [](Config& c) { c.transport.cc.dcqcn.rpg_byte_reset = 0; }},
          {"transport.cc.dcqcn.rpg_threshold",
           [](Config& c) { c.transport.cc.dcqcn.rpg_threshold = 2; }},
          {"transport.cc.dcqcn.rpg_ai_rate",
           [](Config& c) { c.transport.cc.dcqcn.rpg_ai_rate = 40; }},
          {"transport.cc.dcqcn.rpg_hai_rate",
           [](Config& c) { c.transport.cc.dcqcn.rpg_hai_rate = 100; }},
          {"transport.cc.dcqcn.rpg_time_share_qps",
           [](Config& c) { c.transport.cc.dcqcn.rpg_time_share_qps = 4; }},
          {"fault.seed", [](Config& c) { c.fault.seed = 42; }},
          {"fault.rx.drop_ppm", [](Config& c) { c.fault.rx.drop_ppm = 1000; }},
          {"fault.rx.burst_ppm", [](Config& c) { c.fault.rx.burst_ppm = 100; }},
          {"fault.rx.burst_len", [](Config& c) { c.fault.rx.burst_len = 3; }},
          {"fault.rx.corrupt_ppm",
           [](Config& c) { c.fault.rx.corrupt_ppm = 10; }},
          {"fault.rx.duplicate_ppm",
           [](Config& c) { c.fault.rx.duplicate_ppm = 20; }},
          {"fault.rx.reorder_ppm",
           [](Config& c) { c.fault.rx.reorder_ppm = 30; }},
          {"fault.rx.reorder_gap",
           [](Config& c) { c.fault.rx.reorder_gap = 2; }},
          {"fault.rx.delay_us", [](Config& c) { c.fault.rx.delay_us = 100; }},
          {"fault.rx.rate_mbps",
           [](Config& c) { c.fault.rx.rate_mbps = 1000; }},
          {"fault.rx.queue_kb", [](Config& c) { c.fault.rx.queue_kb = 64; }},
          {"fault.rx.ecn_kb",
           [](Config& c) {
             c.fault.rx.ecn_kb = 16;
             c.fault.rx.rate_mbps = 100;
           }},
          {"fault.tx.drop_ppm", [](Config& c) { c.fault.tx.drop_ppm = 1000; }},
          {"fault.tx.burst_ppm", [](Config& c) { c.fault.tx.burst_ppm = 100; }},
          {"fault.tx.burst_len", [](Config& c) { c.fault.tx.burst_len = 3; }},
          {"fault.tx.corrupt_ppm",
           [](Config& c) { c.fault.tx.corrupt_ppm = 10; }},
          {"fault.tx.duplicate_ppm",
           [](Config& c) { c.fault.tx.duplicate_ppm = 20; }},
          {"fault.tx.reorder_ppm",
           [](Config& c) { c.fault.tx.reorder_ppm = 30; }},
          {"fault.tx.reorder_gap",
           [](Config& c) { c.fault.tx.reorder_gap = 2; }},
          {"fault.tx.delay_us", [](Config& c) { c.fault.tx.delay_us = 100; }},
          {"fault.tx.rate_mbps",
           [](Config& c) { c.fault.tx.rate_mbps = 1000; }},
          {"fault.tx.queue_kb", [](Config& c) { c.fault.tx.queue_kb = 64; }},
          {"fault.tx.ecn_kb",
           [](Config& c) {
             c.fault.tx.ecn_kb = 16;
             c.fault.tx.rate_mbps = 100;
           }},
      };
  return kMutations;
}

void collect_leaf_keys(const YAML::Node& node, const std::string& path,
                       std::vector<std::string>& out) {
  if (!node.IsMap()) {
    out.push_back(path);
    return;
  }
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    collect_leaf_keys(kv.second, path.empty() ? key : path + "." + key, out);
  }
}

TEST(ConfigRoundTrip, MutationsCoverEveryKeyOfDump) {
  std::vector<std::string> keys;
  collect_leaf_keys(YAML::Load(dump(Config{})), "", keys);
  std::vector<std::string> mutated;
  for (const auto& m : field_mutations()) mutated.push_back(m.first);
  EXPECT_EQ(keys, mutated);
}

TEST(ConfigRoundTrip, EqualityComparesEveryField) {
  const Config base;
  EXPECT_EQ(base, Config{});
  for (const auto& [name, mutate] : field_mutations()) {
    Config c;
    mutate(c);
    EXPECT_FALSE(c == base) << name << " is not compared";
  }
}

TEST(ConfigRoundTrip, EqualityIgnoresSourceAndAbsentAddressBytes) {
  Config a;
  Config b;
  b.source = "elsewhere.yaml";
  b.port.ipv6.addr[3] = 7;  // not present: the bytes mean nothing
  EXPECT_EQ(a, b);
}

TEST(ConfigRoundTrip, EveryFieldNonDefault) {
  Config c;
  for (const auto& m : field_mutations()) m.second(c);
  c.port.vdev.clear();  // exactly one of pci / vdev
  const std::string text = dump(c);
  Config back;
  ASSERT_NO_THROW(back = parse(text, "<dump>")) << text;
  EXPECT_EQ(back, c);
  EXPECT_EQ(back.source, "<dump>");
}

// Each tests/config-bad/*.yaml starts with "# expect: SUBSTRING".
TEST(ConfigBad, EveryBadFileFailsWithItsExpectedMessage) {
  const fs::path dir = kSourceDir / "tests" / "config-bad";
  size_t count = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".yaml") continue;
    ++count;
    const std::string path = e.path().string();
    SCOPED_TRACE(path);
    std::ifstream in(e.path());
    std::string first;
    std::getline(in, first);
    constexpr std::string_view kPrefix = "# expect: ";
    ASSERT_EQ(first.rfind(kPrefix, 0), 0u) << "first line: " << first;
    std::string expect = first.substr(kPrefix.size());
    while (!expect.empty() && (expect.back() == ' ' || expect.back() == '\r')) {
      expect.pop_back();
    }
    ASSERT_FALSE(expect.empty());
    const std::string msg = error_of([&] { load_file(path); });
    EXPECT_NE(msg.find(expect), std::string::npos)
        << "message: " << msg << "\nexpected to contain: " << expect;
    EXPECT_EQ(msg.rfind(path + ":", 0), 0u) << "message: " << msg;
  }
  EXPECT_GE(count, 13u);
}

TEST(ConfigErrors, ExactMessageFormat) {
  EXPECT_EQ(parse_error(std::string(kMinimal) + "  mtu: 100000\n"),
            "t.yaml:4:8: key 'port.mtu': out of range [576, 9000], got "
            "100000");
  EXPECT_EQ(parse_error(std::string(kMinimal) + "  mtux: 1\n"),
            "t.yaml:4:3: key 'port.mtux': unknown key (did you mean "
            "'port.mtu'?)");
}

TEST(ConfigErrors, EmptyValueIsReportedAtItsKey) {
  EXPECT_EQ(parse_error(std::string(kMinimal) + "  mtu:\nstats: {}\n"),
            "t.yaml:4:3: key 'port.mtu': expected an integer, got nothing");
}

TEST(ConfigErrors, StrayFlowTokensAreSyntaxErrors) {
  // yaml-cpp 0.7's LoadAll() never returns on these; Load() ignores them.
  EXPECT_EQ(parse_error(",a"),
            "t.yaml:1:1: YAML syntax error: unexpected \",\"");
  EXPECT_EQ(parse_error(std::string(kMinimal) + "]\n")
                .rfind("t.yaml:4:1: YAML syntax error: ", 0),
            0u);
  EXPECT_EQ(parse_error("}").rfind("t.yaml:1:1: YAML syntax error: ", 0), 0u);
}

TEST(ConfigErrors, DocumentMarkersAreAllowed) {
  EXPECT_NO_THROW(
      parse("%YAML 1.2\n---\n" + std::string(kMinimal) + "...\n", "t.yaml"));
}

TEST(ConfigErrors, LoadFileMissing) {
  EXPECT_EQ(error_of([] { load_file("/nonexistent/urnicd.yaml"); }),
            "cannot open /nonexistent/urnicd.yaml: No such file or directory");
}

TEST(ConfigErrors, EmptyDocumentOnlyMissesThePort) {
  EXPECT_EQ(parse_error(""),
            "t.yaml:1:1: key 'port.ipv4': missing required key");
  EXPECT_EQ(parse_error("# nothing\n"),
            "t.yaml:1:1: key 'port.ipv4': missing required key");
}

TEST(ConfigScalars, Integers) {
  const auto burst = [](const std::string& v) {
    return parse(std::string(kMinimal) + "lcores: {burst: " + v + "}\n", "t")
        .lcores.burst;
  };
  EXPECT_EQ(burst("64"), 64);
  EXPECT_EQ(burst("+64"), 64);
  EXPECT_EQ(burst("0x40"), 64);
  EXPECT_EQ(burst("0o100"), 64);
  EXPECT_EQ(burst("064"), 64);  // YAML 1.2: leading zeros stay decimal
  EXPECT_EQ(burst("!!int 64"), 64);
  for (const char* bad : {"\"64\"", "'64'", "6.4e1", "64.0", "0x", "1_000",
                          "[64]", "{a: 1}", "sixty"}) {
    EXPECT_NE(
        parse_error(std::string(kMinimal) + "lcores: {burst: " + bad + "}\n")
            .find("expected an integer"),
        std::string::npos)
        << bad;
  }
  for (const char* bad : {"0", "-1", "65", "99999999999999999999999"}) {
    EXPECT_NE(
        parse_error(std::string(kMinimal) + "lcores: {burst: " + bad + "}\n")
            .find("out of range [1, 64]"),
        std::string::npos)
        << bad;
  }
}

TEST(ConfigScalars, SixtyFourBitMrSize) {
  const auto mr_size = [](const std::string& v) {
    return parse(std::string(kMinimal) + "limits: {max_mr_size: " + v + "}\n",
                 "t")
        .limits.max_mr_size;
  };
  EXPECT_EQ(mr_size("4096"), 4096u);
  EXPECT_EQ(mr_size("281474976710656"), uint64_t{1} << 48);
  EXPECT_EQ(mr_size("0x10000000000"), uint64_t{1} << 40);
  for (const char* bad : {"4095", "281474976710657", "18446744073709551615",
                          "18446744073709551616", "-1"}) {
    EXPECT_NE(parse_error(std::string(kMinimal) +
                          "limits: {max_mr_size: " + bad + "}\n")
                  .find("key 'limits.max_mr_size': out of range [4096, "
                        "281474976710656], got "),
              std::string::npos)
        << bad;
  }
  // The 64-bit value survives dump() unchanged.
  Config c = parse(kMinimal, "t");
  c.limits.max_mr_size = (uint64_t{1} << 48) - 1;
  EXPECT_NE(dump(c).find("max_mr_size: 281474976710655"), std::string::npos);
  EXPECT_EQ(parse(dump(c), "<dump>"), c);
}

TEST(ConfigScalars, LimitsAndTransportRanges) {
  struct Case {
    const char* section;
    const char* key;
    const char* value;
    const char* range;
  };
  for (const Case& k : {
           Case{"limits", "max_qp", "0", "[1, 1048576]"},
           Case{"limits", "max_qp_wr", "32769", "[1, 32768]"},
           Case{"limits", "max_sge", "17", "[1, 16]"},
           Case{"limits", "max_inline", "257", "[0, 256]"},
           Case{"limits", "max_cqe", "4194305", "[1, 4194304]"},
           Case{"limits", "max_mr", "8388608", "[1, 8388607]"},
           Case{"limits", "max_srq", "1048577", "[0, 1048576]"},
           Case{"limits", "max_ah", "16777217", "[1, 16777216]"},
           Case{"limits", "max_msg_sz", "2147483649", "[1, 2147483648]"},
           Case{"limits", "max_rd_atomic", "0", "[1, 255]"},
           Case{"limits", "max_dest_rd_atomic", "256", "[1, 255]"},
           Case{"transport", "ack_req_every", "1025", "[1, 1024]"},
           Case{"transport", "max_unacked", "8388608", "[1, 8388607]"},
           Case{"transport", "tx_budget", "0", "[1, 1024]"},
           Case{"transport", "tx_quantum", "255", "[256, 1048576]"},
           Case{"transport", "timer_tick_us", "1001", "[1, 1000]"},
       }) {
    const std::string key = std::string(k.section) + "." + k.key;
    SCOPED_TRACE(key);
    EXPECT_EQ(parse_error(std::string(kMinimal) + k.section + ":\n  " + k.key +
                          ": " + k.value + "\n"),
              "t.yaml:5:" + std::to_string(std::strlen(k.key) + 5) + ": key '" +
                  key + "': out of range " + k.range + ", got " + k.value);
  }
}

TEST(ConfigScalars, Booleans) {
  const auto huge = [](const std::string& v) {
    return parse(std::string(kMinimal) + "eal: {huge: " + v + "}\n", "t")
        .eal.huge;
  };
  EXPECT_TRUE(huge("true"));
  EXPECT_TRUE(huge("True"));
  EXPECT_FALSE(huge("FALSE"));
  for (const char* bad : {"yes", "no", "on", "1", "\"true\""}) {
    EXPECT_NE(parse_error(std::string(kMinimal) + "eal: {huge: " + bad + "}\n")
                  .find("expected a boolean"),
              std::string::npos)
        << bad;
  }
}

TEST(ConfigScalars, ControlModeDigitsAreAlwaysOctal) {
  const auto mode = [](const std::string& v) {
    return parse(std::string(kMinimal) + "control: {mode: " + v + "}\n", "t")
        .control.mode;
  };
  EXPECT_EQ(mode("0660"), 0660u);
  EXPECT_EQ(mode("660"), 0660u);
  EXPECT_EQ(mode("\"0640\""), 0640u);
  EXPECT_EQ(mode("'600'"), 0600u);
  EXPECT_EQ(mode("0o644"), 0644u);
  EXPECT_EQ(mode("0"), 0u);
  EXPECT_EQ(mode("0777"), 0777u);
  for (const char* bad : {"0x1b0", "0668", "rw", "-660", "[660]"}) {
    EXPECT_NE(
        parse_error(std::string(kMinimal) + "control: {mode: " + bad + "}\n")
            .find("expected an octal file mode"),
        std::string::npos)
        << bad;
  }
  EXPECT_NE(parse_error(std::string(kMinimal) + "control: {mode: 1777}\n")
                .find("out of range [0000, 0777], got 1777"),
            std::string::npos);
  // dump writes the mode the way it is read back.
  Config c = parse(kMinimal, "t");
  c.control.mode = 0604;
  EXPECT_NE(dump(c).find("mode: 0604"), std::string::npos);
}

TEST(ConfigScalars, StringsAreCanonicalised) {
  const Config c = parse(
      "port:\n  pci: 00:1F.7\n  mac: 0A:BB:cc:DD:ee:FF\n  ipv4: 10.0.0.1/8\n"
      "  ipv6: FD00:0:0::0001/64\n",
      "t");
  EXPECT_EQ(c.port.pci, "0000:00:1f.7");
  EXPECT_EQ(c.port.mac, "0a:bb:cc:dd:ee:ff");
  EXPECT_NE(dump(c).find("ipv6: \"fd00::1/64\""), std::string::npos);
}

TEST(ConfigScalars, EmptyOptionalValues) {
  const Config c = parse(
      "port:\n  vdev: net_null0\n  pci:\n  mac: \"\"\n  ipv6:\n"
      "  ipv4: 10.0.0.1/24\neal:\n  extra_args:\nlcores:\n  idle:\n",
      "t");
  EXPECT_TRUE(c.port.pci.empty());
  EXPECT_TRUE(c.port.mac.empty());
  EXPECT_FALSE(c.port.ipv6.present);
  EXPECT_TRUE(c.eal.extra_args.empty());
  EXPECT_EQ(c.lcores.idle.sleep_us, IdleConfig{}.sleep_us);
}

TEST(ConfigScalars, StringsMustBeOneLineOfUtf8) {
  EXPECT_EQ(
      parse(std::string(kMinimal) + "eal: {extra_args: [\"\u00e9\"]}\n", "t")
          .eal.extra_args,
      std::vector<std::string>{"\u00e9"});
  // YAML escapes for TAB, LF, NUL and C1 NEL; raw invalid UTF-8 bytes.
  const std::vector<std::string> bads = {"\"a\\tb\"",
                                         "\"a\\nb\"",
                                         "\"a\\0b\"",
                                         "\"\\x85\"",
                                         "a\x95"
                                         "b",
                                         "\xc0\xaf"};
  for (const std::string& bad : bads) {
    SCOPED_TRACE(bad);
    EXPECT_NE(parse_error(std::string(kMinimal) + "eal: {extra_args: [" + bad +
                          "]}\n")
                  .find("expected one line of printable UTF-8 text"),
              std::string::npos);
    EXPECT_NE(
        parse_error(std::string(kMinimal) + "control: {socket: " + bad + "}\n")
            .find("key 'control.socket'"),
        std::string::npos);
  }
  // Messages escape what they quote.
  EXPECT_NE(parse_error(std::string(kMinimal) + "eal: {log_level: \"x\\ty\"}\n")
                .find("a quoted string \"x\\x09y\""),
            std::string::npos);
}

TEST(ConfigScalars, AddressesAUnitCannotOwnAreRejected) {
  for (const char* bad : {"0.0.0.0/8", "127.0.0.1/8", "224.0.0.1/4",
                          "255.255.255.255/32", "10.0.0.1/0", "10.0.0.1/024"}) {
    EXPECT_NE(parse_error(std::string("port: {vdev: x, ipv4: ") + bad + "}\n")
                  .find("key 'port.ipv4'"),
              std::string::npos)
        << bad;
  }
  for (const char* bad :
       {"::/64", "::1/128", "ff02::1/64", "fd00::1/129", "fd00::1"}) {
    EXPECT_NE(parse_error(std::string(kMinimal) + "  ipv6: " + bad + "\n")
                  .find("key 'port.ipv6'"),
              std::string::npos)
        << bad;
  }
}

TEST(ConfigOverrides, SetsAScalar) {
  const Config c = parse(embedded_default(), "<embedded>", {"port.mtu=9000"});
  EXPECT_EQ(c.port.mtu, 9000u);
  Config expected = documented_default();
  expected.port.mtu = 9000;
  EXPECT_EQ(c, expected);
}

TEST(ConfigOverrides, SetsASequence) {
  EXPECT_EQ(parse(kMinimal, "t", {"eal.workers=[2,3]"}).eal.workers,
            (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ(
      parse(kMinimal, "t", {"eal.extra_args=[--no-telemetry]"}).eal.extra_args,
      std::vector<std::string>{"--no-telemetry"});
}

TEST(ConfigOverrides, NestedKeysAndMissingSections) {
  const Config c = parse(kMinimal, "t",
                         {"lcores.idle.sleep_us=0", "stats.period_ms=5",
                          " port.ttl = 8", "control.mode=0600"});
  EXPECT_EQ(c.lcores.idle.sleep_us, 0u);
  EXPECT_EQ(c.lcores.idle.spin_polls, IdleConfig{}.spin_polls);
  EXPECT_EQ(c.stats.period_ms, 5u);
  EXPECT_EQ(c.port.ttl, 8);
  EXPECT_EQ(c.control.mode, 0600u);
}

TEST(ConfigOverrides, SetsLimitsAndTransport) {
  const Config c = parse(embedded_default(), "<embedded>",
                         {"limits.max_sge=4", "limits.max_mr_size=0x1000000000",
                          "limits.max_rd_atomic=255", "transport.tx_budget=8",
                          "transport.timer_tick_us=10"});
  Config expected = documented_default();
  expected.limits.max_sge = 4;
  expected.limits.max_mr_size = uint64_t{1} << 36;
  expected.limits.max_rd_atomic = 255;
  expected.transport.tx_budget = 8;
  expected.transport.timer_tick_us = 10;
  EXPECT_EQ(c, expected);
  // A whole section: the keys it omits get defaults.
  const Config d =
      parse(kMinimal, "t", {"transport={max_unacked: 64}", "limits={}"});
  EXPECT_EQ(d.transport.max_unacked, 64u);
  EXPECT_EQ(d.transport.ack_req_every, TransportConfig{}.ack_req_every);
  EXPECT_EQ(d.limits.max_qp, LimitsConfig{}.max_qp);
  EXPECT_EQ(parse_error(kMinimal, {"limits.max_sge=17"}),
            "<override>:1:16: key 'limits.max_sge': out of range [1, 16], got "
            "17");
  EXPECT_EQ(parse_error(kMinimal, {"transport.max_unacked=0"}),
            "<override>:1:23: key 'transport.max_unacked': out of range [1, "
            "8388607], got 0");
  EXPECT_EQ(parse_error(kMinimal, {"limits.max_qps=1"}),
            "<override>:1:1: key 'limits.max_qps': unknown key");
}

TEST(ConfigOverrides, ValueKeepsEqualsSignsAndLastWins) {
  const Config c =
      parse(kMinimal, "t",
            {"port.vdev=net_null1,size=64", "port.mtu=1400", "port.mtu=1450"});
  EXPECT_EQ(c.port.vdev, "net_null1,size=64");
  EXPECT_EQ(c.port.mtu, 1450u);
}

TEST(ConfigOverrides, SwitchFromVdevToPci) {
  const Config c = parse(embedded_default(), "<embedded>",
                         {"port.vdev=", "port.pci=0000:00:03.0"});
  EXPECT_EQ(c.port.pci, "0000:00:03.0");
  EXPECT_TRUE(c.port.vdev.empty());
}

// spin_polls left out: 256, or 0 once the worker yields its CPU; given,
// what was given.
TEST(ConfigOverrides, SpinPollsDefaultFollowsYield) {
  EXPECT_EQ(parse(kMinimal, "t", {}).lcores.idle.spin_polls, 256u);
  EXPECT_EQ(
      parse(kMinimal, "t", {"lcores.idle.yield=true"}).lcores.idle.spin_polls,
      IdleConfig::kSpinPollsYield);
  EXPECT_EQ(parse(kMinimal, "t",
                  {"lcores.idle.yield=true", "lcores.idle.spin_polls=64"})
                .lcores.idle.spin_polls,
            64u);
  EXPECT_EQ(parse(kMinimal, "t", {"lcores.idle={yield: true, spin_polls: 9}"})
                .lcores.idle.spin_polls,
            9u);
  // The embedded default leaves it out, so yield alone changes it there.
  EXPECT_EQ(parse(embedded_default(), "default", {"lcores.idle.yield=true"})
                .lcores.idle.spin_polls,
            IdleConfig::kSpinPollsYield);
}

TEST(ConfigOverrides, ReplacesAWholeSection) {
  const Config c = parse(kMinimal, "t", {"lcores.idle={spin_polls: 1}"});
  EXPECT_EQ(c.lcores.idle.spin_polls, 1u);
  EXPECT_EQ(c.lcores.idle.pause_polls, IdleConfig{}.pause_polls);
}

TEST(ConfigOverrides, AppliesToLoadFile) {
  const auto path = (kSourceDir / "config" / "examples" / "memif-a.yaml");
  EXPECT_EQ(load_file(path.string(), {"port.ipv4=10.88.0.9/24"}).port.ipv4.addr,
            0x0a580009u);
}

TEST(ConfigOverrides, UnknownKeysAreRejected) {
  EXPECT_EQ(parse_error(kMinimal, {"port.mtux=1"}),
            "<override>:1:1: key 'port.mtux': unknown key");
  EXPECT_EQ(parse_error(kMinimal, {"port.mtu.x=1"}),
            "<override>:1:1: key 'port.mtu.x': unknown key");
  EXPECT_EQ(parse_error(kMinimal, {"nosuch=1"}),
            "<override>:1:1: key 'nosuch': unknown key");
  // Inside a section value the column points into the override text.
  EXPECT_EQ(parse_error(kMinimal, {"lcores.idle={foo: 1}"}),
            "<override>:1:14: key 'lcores.idle.foo': unknown key");
}

TEST(ConfigOverrides, MalformedOverridesAreRejected) {
  for (const char* bad :
       {"port.mtu", "=5", "port..mtu=1", ".port=1", "port.=1", " =1"}) {
    EXPECT_EQ(parse_error(kMinimal, {bad}).rfind("<override>:1:", 0), 0u)
        << bad;
    EXPECT_NE(parse_error(kMinimal, {bad}).find("malformed override"),
              std::string::npos)
        << bad;
  }
}

TEST(ConfigOverrides, BadValuesAreReportedInTheOverride) {
  EXPECT_EQ(
      parse_error(kMinimal, {"port.mtu=abc"}),
      "<override>:1:10: key 'port.mtu': expected an integer, got \"abc\"");
  EXPECT_EQ(parse_error(kMinimal, {"port.mtu=99999"}),
            "<override>:1:10: key 'port.mtu': out of range [576, 9000], got "
            "99999");
  EXPECT_EQ(parse_error(kMinimal, {"eal.workers=[2,0]"}),
            "<override>:1:16: key 'eal.workers': worker lcore 0 is the main "
            "lcore");
  EXPECT_EQ(parse_error(kMinimal, {"eal.workers=[1,"})
                .rfind("<override>:1:13: YAML syntax error: ", 0),
            0u);
  EXPECT_EQ(parse_error(kMinimal, {"port=5"}),
            "<override>:1:6: key 'port': expected a map, got \"5\"");
}

TEST(ConfigOverrides, ValueMustBeOneWellFormedDocument) {
  // yaml-cpp by itself would ignore the stray ']' and accept [1, 2].
  EXPECT_EQ(parse_error(kMinimal, {"eal.workers=[1,2]]"})
                .rfind("<override>:1:18: YAML syntax error: ", 0),
            0u);
  EXPECT_EQ(parse_error(kMinimal, {"eal.workers=,"}),
            "<override>:1:13: YAML syntax error: unexpected \",\"");
  EXPECT_EQ(parse_error(kMinimal, {"eal.workers=[2]\n---\n[3]"}),
            "<override>:2:1: expected a single YAML document");
}

TEST(ConfigOverrides, OverrideCanFixTheFile) {
  const std::string broken = std::string(kMinimal) + "  mtu: jumbo\n";
  EXPECT_EQ(parse(broken, "t", {"port.mtu=1500"}).port.mtu, 1500u);
  EXPECT_NE(parse_error(broken).find("t.yaml:4:8: key 'port.mtu'"),
            std::string::npos);
}

TEST(ConfigHelpers, Ipv4) {
  uint32_t a = 0;
  ASSERT_TRUE(parse_ipv4("10.77.0.1", a));
  EXPECT_EQ(a, 0x0a4d0001u);
  EXPECT_EQ(format_ipv4(a), "10.77.0.1");
  EXPECT_EQ(format_ipv4(0xffffffffu), "255.255.255.255");
  ASSERT_TRUE(parse_ipv4("0.0.0.0", a));
  EXPECT_EQ(a, 0u);
  a = 42;
  for (const char* bad :
       {"", "10.77.0", "10.77.0.1.2", "256.1.1.1", "10.77.0.1 ", " 10.77.0.1",
        "10.77.0.1/24", "0x0a.0.0.1", "::1", "a.b.c.d"}) {
    EXPECT_FALSE(parse_ipv4(bad, a)) << bad;
  }
  EXPECT_FALSE(parse_ipv4(std::string("1.2.3.4\0junk", 12), a));
  EXPECT_EQ(a, 42u);  // untouched on failure
}

TEST(ConfigHelpers, Ipv6) {
  uint8_t a[16] = {};
  ASSERT_TRUE(parse_ipv6("fd00::1", a));
  const uint8_t kExpected[16] = {0xfd, 0, 0, 0, 0, 0, 0, 0,
                                 0,    0, 0, 0, 0, 0, 0, 1};
  EXPECT_EQ(std::memcmp(a, kExpected, 16), 0);
  EXPECT_EQ(format_ipv6(a), "fd00::1");
  ASSERT_TRUE(parse_ipv6("2001:0DB8:0000:0000:0000:0000:0000:0042", a));
  EXPECT_EQ(format_ipv6(a), "2001:db8::42");
  ASSERT_TRUE(parse_ipv6("::ffff:10.0.0.1", a));
  EXPECT_EQ(format_ipv6(a), "::ffff:10.0.0.1");
  for (const char* bad : {"", "fd00:::1", "fd00::g", "1.2.3.4", "fd00::1/64",
                          "1:2:3:4:5:6:7:8:9", " ::1"}) {
    EXPECT_FALSE(parse_ipv6(bad, a)) << bad;
  }
}

TEST(ConfigHelpers, Mac) {
  uint8_t m[6] = {};
  ASSERT_TRUE(parse_mac("02:00:00:00:00:01", m));
  const uint8_t kExpected[6] = {2, 0, 0, 0, 0, 1};
  EXPECT_EQ(std::memcmp(m, kExpected, 6), 0);
  ASSERT_TRUE(parse_mac("AA:bb:Cc:dD:ee:FF", m));
  EXPECT_EQ(m[0], 0xaa);
  EXPECT_EQ(m[5], 0xff);
  uint8_t untouched[6] = {9, 9, 9, 9, 9, 9};
  for (const char* bad :
       {"", "02:00:00:00:00", "02:00:00:00:00:01:", "02:00:00:00:00:0g",
        "02-00-00-00-00-01", "2:0:0:0:0:1", "0200.0000.0001",
        "02:00:00:00:00:001", " 02:00:00:00:00:01", "02:00:00:00:00:01 "}) {
    EXPECT_FALSE(parse_mac(bad, untouched)) << bad;
  }
  EXPECT_EQ(untouched[0], 9);
}

}  // namespace
}  // namespace urnic::config
