// testpmd-layout text and JSON renderings of a stats snapshot.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include "dataplane/stats/report.h"

using namespace urnic::stats;

namespace {
Snapshot snap(uint64_t t_ns, uint64_t rx, uint64_t rx_bytes) {
  Snapshot s;
  s.time_ns = t_ns;
  s.port.name = "net_af_packet";
  s.port.ipackets = rx;
  s.port.ibytes = rx_bytes;
  s.port.opackets = rx / 2;
  s.port.obytes = rx_bytes / 2;
  LcoreSnapshot l;
  l.lcore = 1;
  l.v[static_cast<size_t>(Ctr::rx_packets)] = rx;
  l.v[static_cast<size_t>(Ctr::roce_rx)] = 5;
  l.malformed[static_cast<size_t>(urnic::wire::Malformed::kBadIcrc)] = 3;
  l.v[static_cast<size_t>(Ctr::malformed)] = 3;
  s.lcores.push_back(l);
  return s;
}
}  // namespace

TEST(Stats, TextHasTestpmdLayoutAndRates) {
  const Snapshot a = snap(1'000'000'000, 100, 10'000);
  const Snapshot b = snap(3'000'000'000, 300, 30'000);
  const std::string t = format_text(b, &a);
  EXPECT_NE(t.find("NIC statistics for port 0"), std::string::npos);
  EXPECT_NE(t.find("RX-packets: 300"), std::string::npos);
  EXPECT_NE(t.find("Throughput (since last show)"), std::string::npos);
  // 200 packets and 20000 bytes over 2 s.
  EXPECT_NE(t.find("Rx-pps:          100"), std::string::npos) << t;
  EXPECT_NE(t.find("Rx-bps:        80000"), std::string::npos) << t;
  EXPECT_NE(t.find("ICRC-errors: 3"), std::string::npos) << t;
  EXPECT_NE(t.find("malformed bad_icrc"), std::string::npos) << t;
  // Without a previous snapshot, rates are zero rather than invented.
  EXPECT_NE(format_text(b, nullptr).find("Rx-pps:            0"),
            std::string::npos);
}

TEST(Stats, JsonParsesAndNamesEveryCounter) {
  const Snapshot a = snap(1'000'000'000, 100, 10'000);
  const Snapshot b = snap(2'000'000'000, 300, 30'000);
  const YAML::Node j = YAML::Load(format_json(b, &a));  // JSON is YAML
  EXPECT_EQ(j["port"]["rx_packets"].as<uint64_t>(), 300u);
  EXPECT_EQ(j["throughput"]["rx_pps"].as<uint64_t>(), 200u);
  EXPECT_EQ(j["malformed"]["bad_icrc"].as<uint64_t>(), 3u);
  EXPECT_EQ(j["totals"].size(), kNumCtr);
  EXPECT_EQ(j["lcores"][0]["roce_rx"].as<uint64_t>(), 5u);
}
