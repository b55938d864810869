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
  EXPECT_EQ(j["lcores"][0]["cc_shared_window"].as<uint32_t>(), 0u);
}

TEST(Stats, QpJsonNamesEveryFieldAndPages) {
  Snapshot s = snap(2'000'000'000, 300, 30'000);
  s.lcores[0].qps = 2;
  s.lcores[0].v[static_cast<size_t>(Ctr::doorbells)] = 42;
  s.lcores[0].v[static_cast<size_t>(Ctr::cycles_busy)] = 750;
  s.lcores[0].v[static_cast<size_t>(Ctr::cycles_idle)] = 250;
  s.lcores[0].cc_shared_window = 640;
  s.lcores[0].cc_in_flight = 512;
  s.lcores[0].cc_active_qps = 256;
  s.lcores[0].cc_waiting_qps = 3;
  std::vector<QpRow> rows(2);
  rows[0].qpn = 0x11;
  rows[0].pid = 1234;
  rows[0].lcore = 1;
  rows[1].qpn = 0x12;
  for (size_t i = 0; i < urnic::transport::kNumQpCtr; ++i) {
    rows[0].v[i] = i + 1;
    rows[1].v[i] = 100 + i;
  }
  const YAML::Node j =
      YAML::Load(format_qps_json(s, 2'000'000'000, rows, 0x99));
  EXPECT_EQ(j["tsc_hz"].as<uint64_t>(), 2'000'000'000u);
  EXPECT_EQ(j["next"].as<uint32_t>(), 0x99u);
  EXPECT_EQ(j["lcores"][0]["qps"].as<uint32_t>(), 2u);
  EXPECT_EQ(j["lcores"][0]["doorbells"].as<uint64_t>(), 42u);
  EXPECT_EQ(j["lcores"][0]["cc_shared_window"].as<uint32_t>(), 640u);
  EXPECT_EQ(j["lcores"][0]["cc_in_flight"].as<uint32_t>(), 512u);
  EXPECT_EQ(j["lcores"][0]["cc_active_qps"].as<uint32_t>(), 256u);
  EXPECT_EQ(j["lcores"][0]["cc_waiting_qps"].as<uint32_t>(), 3u);
  const YAML::Node f = j["qp_fields"];
  ASSERT_EQ(f.size(), 3 + urnic::transport::kNumQpCtr);
  ASSERT_EQ(j["qps"].size(), 2u);
  // Every named field holds its row's value.
  for (size_t i = 0; i < urnic::transport::kNumQpCtr; ++i) {
    EXPECT_EQ(f[3 + i].as<std::string>(), urnic::transport::kQpCtrNames[i]);
    EXPECT_EQ(j["qps"][0][3 + i].as<uint64_t>(), i + 1);
    EXPECT_EQ(j["qps"][1][3 + i].as<uint64_t>(), 100 + i);
  }
  EXPECT_EQ(j["qps"][0][0].as<uint32_t>(), 0x11u);
  EXPECT_EQ(j["qps"][0][1].as<int>(), 1234);
  // The text table: busy share from the cycle counters, one row per QP,
  // NAKs summed over their types, and where the next page starts.
  const std::string t = format_qps_text(s, 2'000'000'000, rows, 0x99);
  EXPECT_NE(t.find("busy 75.0%"), std::string::npos) << t;
  EXPECT_NE(t.find("doorbells 42"), std::string::npos) << t;
  EXPECT_NE(t.find("shared window 640, in flight 512 (256 QPs, 3 waiting)"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("0x11"), std::string::npos) << t;
  EXPECT_NE(t.find("\nnext 153\n"), std::string::npos) << t;
  uint64_t naks_rx = 0;
  for (size_t i = 0; i < urnic::transport::kNumQpCtr; ++i)
    if (std::string(urnic::transport::kQpCtrNames[i]).starts_with("naks_") &&
        std::string(urnic::transport::kQpCtrNames[i]).ends_with("_rx"))
      naks_rx += rows[1].v[i];
  EXPECT_NE(t.find(" " + std::to_string(naks_rx) + " "), std::string::npos)
      << t;
}

TEST(Stats, QpsNameTheLastNakCause) {
  Snapshot s = snap(2'000'000'000, 300, 30'000);
  std::vector<QpRow> rows(3);
  size_t at = 0;
  for (size_t i = 0; i < urnic::transport::kNumQpCtr; ++i)
    if (std::string(urnic::transport::kQpCtrNames[i]) == "nak_cause") at = i;
  ASSERT_NE(at, 0u);
  using urnic::transport::RespResult;
  rows[0].qpn = 0x21;  // never refused anything: "-"
  rows[1].qpn = 0x22;
  rows[1].v[at] = static_cast<uint64_t>(RespResult::atomic_misaligned);
  rows[2].qpn = 0x23;
  rows[2].v[at] = 200;  // not a cause: "?"
  const std::string t = format_qps_text(s, 2'000'000'000, rows, 0);
  EXPECT_NE(t.find("nak_cause"), std::string::npos) << t;
  EXPECT_NE(t.find("  atomic_misaligned\n"), std::string::npos) << t;
  EXPECT_NE(t.find("  -\n"), std::string::npos) << t;
  EXPECT_NE(t.find("  ?\n"), std::string::npos) << t;
  // JSON: the value and the list it indexes.
  const YAML::Node j = YAML::Load(format_qps_json(s, 2'000'000'000, rows, 0));
  const size_t k = static_cast<size_t>(RespResult::atomic_misaligned);
  EXPECT_EQ(j["nak_causes"][k].as<std::string>(), "atomic_misaligned");
  EXPECT_EQ(j["qps"][1][3 + at].as<uint64_t>(), k);
}
