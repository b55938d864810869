// YAML decoding for urnicd. Every key lives in one table per section struct
// (Schema<S>::kFields); decode, dump, operator== and the override path check
// all walk those tables, so adding a key is one table row plus a README line.

#include "config/urnic_config.h"

#include <arpa/inet.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <sstream>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <variant>

namespace urnic::config {
namespace internal {
// Generated from config/urnicd.yaml by config/embed.py.
extern const char kEmbeddedUrnicdYaml[];
}  // namespace internal

namespace {

// Limits taken from Debian 12's DPDK 22.11 build; this library deliberately
// does not depend on DPDK (the fuzz build links it without DPDK).
constexpr uint64_t kMaxLcore = 127;         // RTE_MAX_LCORE - 1
constexpr uint64_t kMempoolCacheMax = 512;  // RTE_MEMPOOL_CACHE_MAX_SIZE
constexpr uint64_t kIpv6MinMtu = 1280;      // RFC 8200
constexpr size_t kSunPathMax = 107;         // sizeof(sun_path) - NUL
constexpr size_t kFilePrefixMax = 64;
// Hard limits of the transport engine (dataplane/transport/types.h), which
// this library does not include either.
constexpr uint64_t kTransportMaxSge = 16;              // transport::kMaxSge
constexpr uint64_t kTransportMaxInline = 256;          // transport::kMaxInline
constexpr uint64_t kMaxMrSizeMax = uint64_t{1} << 48;  // 256 TiB
constexpr std::string_view kOverrideFile = "<override>";
constexpr std::string_view kIntTag = "tag:yaml.org,2002:int";
constexpr std::string_view kBoolTag = "tag:yaml.org,2002:bool";

// ---------------------------------------------------------------------------
// Schema tables.

// How an integer is written: control.mode is chmod-style octal.
enum class IntFormat : uint8_t { kDecimal, kOctalMode };

// Validates a decoded string and may canonicalise it; returns an error text,
// empty when the value is acceptable.
using StringCheck = std::string (*)(std::string& value);

template <class S>
using Member = std::variant<
    uint64_t S::*, uint32_t S::*, uint16_t S::*, uint8_t S::*, bool S::*,
    std::string S::*, std::vector<uint32_t> S::*, std::vector<std::string> S::*,
    Ipv4Cidr S::*, Ipv6Cidr S::*, EalConfig S::*, PortConfig S::*,
    MempoolConfig S::*, LcoreConfig S::*, IdleConfig S::*, ControlConfig S::*,
    StatsConfig S::*, ArpConfig S::*, CmConfig S::*, LimitsConfig S::*,
    TransportConfig S::*, CcConfig S::*, DcqcnConfig S::*, FaultConfig S::*,
    FaultDirConfig S::*, ClientLimitsConfig S::*>;

template <class S>
struct Field {
  std::string_view key;
  Member<S> member;
  uint64_t min = 0;  // integer range, per element for integer lists
  uint64_t max = 0;
  IntFormat format = IntFormat::kDecimal;
  StringCheck check = nullptr;
  bool required = false;  // must be present and non-empty
};

// What the leaf decoders and the emitter need of a row. Not its section:
// a std::visit over Member<S> instantiates every alternative for every
// section, and the leaves taking Field<S> were compiled ~17 times each
// (this file took 44-62 s to compile, 157 s under ASan).
struct Rules {
  uint64_t min = 0, max = 0;
  IntFormat format = IntFormat::kDecimal;
  StringCheck check = nullptr;
  bool required = false;
};
template <class S>
constexpr Rules rules_of(const Field<S>& f) {
  return {f.min, f.max, f.format, f.check, f.required};
}

template <class S>
struct Schema;  // specialised below for each section struct

template <class T>
concept Section = requires {
  Schema<T>::kFields;
};

template <class M>
struct MemberTraits;
template <class S, class T>
struct MemberTraits<T S::*> {
  using Type = T;
};
template <class M>
using MemberType = typename MemberTraits<M>::Type;

std::string check_log_level(std::string& v);
std::string check_file_prefix(std::string& v);
std::string check_pci(std::string& v);
std::string check_vdev(std::string& v);
std::string check_mac(std::string& v);
std::string check_socket_path(std::string& v);
std::string check_cc_algorithm(std::string& v);
std::string check_gid_layout(std::string& v);

template <>
struct Schema<EalConfig> {
  using S = EalConfig;
  static constexpr Field<S> kFields[] = {
      {.key = "main_lcore", .member = &S::main_lcore, .max = kMaxLcore},
      {.key = "workers", .member = &S::workers, .max = kMaxLcore},
      {.key = "huge", .member = &S::huge},
      {.key = "memory_mb", .member = &S::memory_mb, .min = 16, .max = 1048576},
      {.key = "file_prefix",
       .member = &S::file_prefix,
       .check = check_file_prefix},
      {.key = "log_level", .member = &S::log_level, .check = check_log_level},
      {.key = "extra_args", .member = &S::extra_args},
  };
};

template <>
struct Schema<PortConfig> {
  using S = PortConfig;
  static constexpr Field<S> kFields[] = {
      {.key = "pci", .member = &S::pci, .check = check_pci},
      {.key = "vdev", .member = &S::vdev, .check = check_vdev},
      {.key = "mtu", .member = &S::mtu, .min = 576, .max = 9000},
      {.key = "mac", .member = &S::mac, .check = check_mac},
      {.key = "rx_desc", .member = &S::rx_desc, .min = 64, .max = 16384},
      {.key = "tx_desc", .member = &S::tx_desc, .min = 64, .max = 16384},
      {.key = "vlan", .member = &S::vlan, .max = 4094},
      {.key = "ipv4", .member = &S::ipv4, .required = true},
      {.key = "ipv6", .member = &S::ipv6},
      {.key = "ttl", .member = &S::ttl, .min = 1, .max = 255},
      {.key = "promiscuous", .member = &S::promiscuous},
      {.key = "gid_layout",
       .member = &S::gid_layout,
       .check = check_gid_layout},
  };
};

template <>
struct Schema<MempoolConfig> {
  using S = MempoolConfig;
  static constexpr Field<S> kFields[] = {
      {.key = "mbufs", .member = &S::mbufs, .min = 1023, .max = 4194304},
      {.key = "cache", .member = &S::cache, .max = kMempoolCacheMax},
      {.key = "data_room", .member = &S::data_room, .min = 1024, .max = 65535},
  };
};

template <>
struct Schema<IdleConfig> {
  using S = IdleConfig;
  static constexpr Field<S> kFields[] = {
      {.key = "spin_polls", .member = &S::spin_polls, .max = 16777216},
      {.key = "pause_polls", .member = &S::pause_polls, .max = 16777216},
      {.key = "sleep_us", .member = &S::sleep_us, .max = 1000000},
      {.key = "no_qp_sleep_us", .member = &S::no_qp_sleep_us, .max = 1000000},
      {.key = "wait_ms", .member = &S::wait_ms, .max = 10000},
      {.key = "yield", .member = &S::yield},
  };
};

template <>
struct Schema<LcoreConfig> {
  using S = LcoreConfig;
  static constexpr Field<S> kFields[] = {
      {.key = "burst", .member = &S::burst, .min = 1, .max = kMaxBurst},
      {.key = "idle", .member = &S::idle},
  };
};

template <>
struct Schema<ControlConfig> {
  using S = ControlConfig;
  static constexpr Field<S> kFields[] = {
      {.key = "socket", .member = &S::socket, .check = check_socket_path},
      {.key = "mode",
       .member = &S::mode,
       .max = 0777,
       .format = IntFormat::kOctalMode},
      {.key = "owner", .member = &S::owner},
      {.key = "group", .member = &S::group},
      {.key = "allow_users", .member = &S::allow_users},
      {.key = "allow_groups", .member = &S::allow_groups},
  };
};

template <>
struct Schema<StatsConfig> {
  using S = StatsConfig;
  static constexpr Field<S> kFields[] = {
      {.key = "period_ms", .member = &S::period_ms, .max = 3600000},
      {.key = "print_on_exit", .member = &S::print_on_exit},
  };
};

template <>
struct Schema<ArpConfig> {
  using S = ArpConfig;
  static constexpr Field<S> kFields[] = {
      {.key = "entries", .member = &S::entries, .min = 16, .max = 1048576},
      {.key = "reachable_ms",
       .member = &S::reachable_ms,
       .min = 1000,
       .max = 3600000},
      {.key = "retry_ms", .member = &S::retry_ms, .min = 10, .max = 60000},
      {.key = "retries", .member = &S::retries, .min = 1, .max = 100},
      {.key = "queue_len", .member = &S::queue_len, .max = 65536},
  };
};

template <>
struct Schema<CmConfig> {
  using S = CmConfig;
  static constexpr Field<S> kFields[] = {
      {.key = "listen_grace_ms", .member = &S::listen_grace_ms, .max = 2000},
  };
};

template <>
struct Schema<LimitsConfig> {
  using S = LimitsConfig;
  static constexpr Field<S> kFields[] = {
      {.key = "max_qp", .member = &S::max_qp, .min = 1, .max = 1048576},
      {.key = "max_qp_wr", .member = &S::max_qp_wr, .min = 1, .max = 32768},
      {.key = "max_sge",
       .member = &S::max_sge,
       .min = 1,
       .max = kTransportMaxSge},
      {.key = "max_inline",
       .member = &S::max_inline,
       .max = kTransportMaxInline},
      {.key = "max_cq", .member = &S::max_cq, .min = 1, .max = 1048576},
      {.key = "max_cqe", .member = &S::max_cqe, .min = 1, .max = 4194304},
      {.key = "max_mr", .member = &S::max_mr, .min = 1, .max = 8388607},
      {.key = "max_mr_size",
       .member = &S::max_mr_size,
       .min = 4096,
       .max = kMaxMrSizeMax},
      {.key = "max_pd", .member = &S::max_pd, .min = 1, .max = 1048576},
      {.key = "max_srq", .member = &S::max_srq, .max = 1048576},
      {.key = "max_srq_wr", .member = &S::max_srq_wr, .min = 1, .max = 1048576},
      {.key = "max_ah", .member = &S::max_ah, .min = 1, .max = 16777216},
      {.key = "max_msg_sz",
       .member = &S::max_msg_sz,
       .min = 1,
       .max = 2147483648},
      {.key = "max_rd_atomic",
       .member = &S::max_rd_atomic,
       .min = 1,
       .max = 255},
      {.key = "max_dest_rd_atomic",
       .member = &S::max_dest_rd_atomic,
       .min = 1,
       .max = 255},
  };
};

template <>
struct Schema<ClientLimitsConfig> {
  using S = ClientLimitsConfig;
  static constexpr Field<S> kFields[] = {
      {.key = "max_pd", .member = &S::max_pd, .max = 1048576},
      {.key = "max_cq", .member = &S::max_cq, .max = 1048576},
      {.key = "max_qp", .member = &S::max_qp, .max = 1048576},
      {.key = "max_srq", .member = &S::max_srq, .max = 1048576},
      {.key = "max_mr", .member = &S::max_mr, .max = 8388607},
      {.key = "max_mr_bytes",
       .member = &S::max_mr_bytes,
       .max = uint64_t{1} << 50},
      {.key = "max_ah", .member = &S::max_ah, .max = 16777216},
      {.key = "max_wr", .member = &S::max_wr, .max = 1u << 30},
  };
};

template <>
struct Schema<DcqcnConfig> {
  using S = DcqcnConfig;
  static constexpr Field<S> kFields[] = {
      {.key = "rpg_max_rate", .member = &S::rpg_max_rate, .max = 400000},
      {.key = "rpg_min_rate",
       .member = &S::rpg_min_rate,
       .min = 1,
       .max = 400000},
      {.key = "rate_to_set_on_first_cnp",
       .member = &S::rate_to_set_on_first_cnp,
       .max = 400000},
      {.key = "rpg_min_dec_fac", .member = &S::rpg_min_dec_fac, .max = 100},
      {.key = "rpg_gd", .member = &S::rpg_gd, .min = 10, .max = 20},
      {.key = "dce_tcp_g", .member = &S::dce_tcp_g, .max = 1024},
      {.key = "dce_tcp_rtt",
       .member = &S::dce_tcp_rtt,
       .min = 1,
       .max = 131071},
      {.key = "initial_alpha_value",
       .member = &S::initial_alpha_value,
       .min = 1,
       .max = 1024},
      {.key = "rate_reduce_monitor_period",
       .member = &S::rate_reduce_monitor_period,
       .max = 1000000},
      {.key = "rpg_time_reset",
       .member = &S::rpg_time_reset,
       .min = 1,
       .max = 1000000},
      {.key = "rpg_byte_reset", .member = &S::rpg_byte_reset, .max = 1u << 30},
      {.key = "rpg_threshold", .member = &S::rpg_threshold, .max = 31},
      {.key = "rpg_ai_rate", .member = &S::rpg_ai_rate, .max = 400000},
      {.key = "rpg_hai_rate", .member = &S::rpg_hai_rate, .max = 400000},
      {.key = "rpg_time_share_qps",
       .member = &S::rpg_time_share_qps,
       .max = 1000000},
  };
};

template <>
struct Schema<CcConfig> {
  using S = CcConfig;
  static constexpr Field<S> kFields[] = {
      {.key = "algorithm",
       .member = &S::algorithm,
       .check = check_cc_algorithm},
      {.key = "init_window",
       .member = &S::init_window,
       .min = 1,
       .max = 8388607},
      {.key = "min_window", .member = &S::min_window, .min = 1, .max = 8388607},
      {.key = "pipe_floor", .member = &S::pipe_floor},
      {.key = "shared_init_window",
       .member = &S::shared_init_window,
       .min = 1,
       .max = 1048576},
      {.key = "shared_min_window",
       .member = &S::shared_min_window,
       .min = 1,
       .max = 1048576},
      {.key = "shared_max_window",
       .member = &S::shared_max_window,
       .max = 1048576},
      {.key = "grant", .member = &S::grant, .max = 1048576},
      {.key = "ecn", .member = &S::ecn},
      {.key = "cnp_interval_us", .member = &S::cnp_interval_us, .max = 1000000},
      {.key = "pace_burst_kb",
       .member = &S::pace_burst_kb,
       .min = 1,
       .max = 1024},
      {.key = "dcqcn", .member = &S::dcqcn},
  };
};

template <>
struct Schema<TransportConfig> {
  using S = TransportConfig;
  static constexpr Field<S> kFields[] = {
      {.key = "ack_req_every",
       .member = &S::ack_req_every,
       .min = 1,
       .max = 1024},
      {.key = "max_unacked",
       .member = &S::max_unacked,
       .min = 1,
       .max = 8388607},
      {.key = "tx_budget", .member = &S::tx_budget, .min = 1, .max = 1024},
      {.key = "tx_quantum",
       .member = &S::tx_quantum,
       .min = 256,
       .max = 1048576},
      {.key = "poll_budget", .member = &S::poll_budget, .min = 1, .max = 65536},
      {.key = "timer_tick_us",
       .member = &S::timer_tick_us,
       .min = 1,
       .max = 1000},
      {.key = "tail_probe_us", .member = &S::tail_probe_us, .max = 1000000},
      {.key = "zero_copy_tx", .member = &S::zero_copy_tx},
      {.key = "cc", .member = &S::cc},
  };
};

template <>
struct Schema<FaultDirConfig> {
  using S = FaultDirConfig;
  static constexpr uint64_t kPpm = 1'000'000;
  static constexpr Field<S> kFields[] = {
      {.key = "drop_ppm", .member = &S::drop_ppm, .max = kPpm},
      {.key = "burst_ppm", .member = &S::burst_ppm, .max = kPpm},
      {.key = "burst_len", .member = &S::burst_len, .min = 1, .max = 1000000},
      {.key = "corrupt_ppm", .member = &S::corrupt_ppm, .max = kPpm},
      {.key = "duplicate_ppm", .member = &S::duplicate_ppm, .max = kPpm},
      {.key = "reorder_ppm", .member = &S::reorder_ppm, .max = kPpm},
      {.key = "reorder_gap", .member = &S::reorder_gap, .min = 1, .max = 1000},
      {.key = "delay_us", .member = &S::delay_us, .max = 1000000},
      {.key = "rate_mbps", .member = &S::rate_mbps, .max = 400000},
      {.key = "queue_kb", .member = &S::queue_kb, .min = 2, .max = 1048576},
      {.key = "ecn_kb", .member = &S::ecn_kb, .max = 1048576},
  };
};

template <>
struct Schema<FaultConfig> {
  using S = FaultConfig;
  static constexpr Field<S> kFields[] = {
      {.key = "seed", .member = &S::seed, .max = UINT64_MAX},
      {.key = "rx", .member = &S::rx},
      {.key = "tx", .member = &S::tx},
  };
};

template <>
struct Schema<Config> {
  using S = Config;
  // Config::source is bookkeeping, not configuration: not in the table.
  static constexpr Field<S> kFields[] = {
      {.key = "eal", .member = &S::eal},
      {.key = "port", .member = &S::port},
      {.key = "mempool", .member = &S::mempool},
      {.key = "lcores", .member = &S::lcores},
      {.key = "control", .member = &S::control},
      {.key = "stats", .member = &S::stats},
      {.key = "arp", .member = &S::arp},
      {.key = "cm", .member = &S::cm},
      {.key = "limits", .member = &S::limits},
      {.key = "client_limits", .member = &S::client_limits},
      {.key = "transport", .member = &S::transport},
      {.key = "fault", .member = &S::fault},
  };
};

// Compile-time guard that every struct member has a table row: counts the
// members of the aggregate by probing brace-initialisation arity.
struct AnyMember {
  template <class T>
  operator T() const;  // never defined: only used in unevaluated context
};

template <class S, class... A>
consteval size_t member_count() {
  if constexpr (requires { S{A{}..., AnyMember{}}; }) {
    return member_count<S, A..., AnyMember>();
  } else {
    return sizeof...(A);
  }
}

// Integer ranges must fit the member type, and only integers carry ranges.
template <Section S>
consteval bool ranges_fit() {
  for (const auto& f : Schema<S>::kFields) {
    const bool ok = std::visit(
        [&](auto m) {
          using T = MemberType<decltype(m)>;
          if constexpr (std::is_same_v<T, std::vector<uint32_t>>) {
            return f.min <= f.max && f.max <= UINT32_MAX;
          } else if constexpr (std::is_integral_v<T> &&
                               !std::is_same_v<T, bool>) {
            return f.min <= f.max && f.max <= std::numeric_limits<T>::max();
          } else {
            return f.min == 0 && f.max == 0;
          }
        },
        f.member);
    if (!ok) return false;
  }
  return true;
}

template <Section S>
consteval bool table_complete(size_t untabled_members) {
  return member_count<S>() == std::size(Schema<S>::kFields) + untabled_members;
}

static_assert(table_complete<Config>(1));  // + Config::source
static_assert(table_complete<EalConfig>(0));
static_assert(table_complete<PortConfig>(0));
static_assert(table_complete<MempoolConfig>(0));
static_assert(table_complete<LcoreConfig>(0));
static_assert(table_complete<IdleConfig>(0));
static_assert(table_complete<ControlConfig>(0));
static_assert(table_complete<StatsConfig>(0));
static_assert(table_complete<ArpConfig>(0));
static_assert(table_complete<CmConfig>(0));
static_assert(table_complete<LimitsConfig>(0));
static_assert(table_complete<ClientLimitsConfig>(0));
static_assert(table_complete<TransportConfig>(0));
static_assert(table_complete<CcConfig>(0));
static_assert(table_complete<FaultConfig>(0));
static_assert(table_complete<FaultDirConfig>(0));
static_assert(ranges_fit<EalConfig>() && ranges_fit<PortConfig>() &&
              ranges_fit<MempoolConfig>() && ranges_fit<LcoreConfig>() &&
              ranges_fit<IdleConfig>() && ranges_fit<ControlConfig>() &&
              ranges_fit<StatsConfig>() && ranges_fit<ArpConfig>() &&
              ranges_fit<CmConfig>() && ranges_fit<LimitsConfig>() &&
              ranges_fit<TransportConfig>() && ranges_fit<CcConfig>() &&
              ranges_fit<FaultConfig>() && ranges_fit<FaultDirConfig>() &&
              ranges_fit<ClientLimitsConfig>());

// ---------------------------------------------------------------------------
// Small text helpers.

bool is_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') ||
         (c >= 'A' && c <= 'F');
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return c - 'A' + 10;
}

bool is_ident(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '_';
}

std::string lower(std::string s) {
  for (char& c : s) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return s;
}

std::string trim(std::string_view s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string_view::npos) return {};
  const auto last = s.find_last_not_of(" \t");
  return std::string(s.substr(first, last - first + 1));
}

std::string join(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

std::string format_mac(const uint8_t mac[6]) {
  char buf[18];
  std::snprintf(buf, sizeof buf, "%02x:%02x:%02x:%02x:%02x:%02x", mac[0],
                mac[1], mac[2], mac[3], mac[4], mac[5]);
  return buf;
}

std::string format_mode(uint64_t mode) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04llo",
                static_cast<unsigned long long>(mode));
  return buf;
}

// Parses the digits of a CIDR prefix: 1..3 decimal digits, no sign.
bool parse_prefix(std::string_view s, unsigned max, uint8_t& out) {
  if (s.empty() || s.size() > 3) return false;
  unsigned v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<unsigned>(c - '0');
  }
  if ((s.size() > 1 && s[0] == '0') || v > max) return false;
  out = static_cast<uint8_t>(v);
  return true;
}

// Splits "address/prefix" with a prefix in 1..max_bits.
bool split_cidr(const std::string& s, unsigned max_bits, std::string& addr,
                uint8_t& prefix) {
  const auto slash = s.find('/');
  if (slash == std::string::npos) return false;
  addr = s.substr(0, slash);
  return parse_prefix(std::string_view(s).substr(slash + 1), max_bits,
                      prefix) &&
         prefix != 0;
}

// Config strings end up in argv, paths and devargs: one line of valid UTF-8
// (which also makes dump() round trips exact).
bool is_printable_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if (c < 0x20 || c == 0x7f) return false;
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t cp = 0;
    if ((c & 0xe0) == 0xc0) {
      len = 2;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    constexpr uint32_t kMinForLen[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMinForLen[len] || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff) || (cp >= 0x80 && cp < 0xa0)) {
      return false;  // overlong, out of range, surrogate, C1 control
    }
    i += len;
  }
  return true;
}

// User text in double quotes for messages, with unprintable bytes escaped.
std::string quote(std::string_view s) {
  const bool utf8_ok = is_printable_utf8(s);
  std::string out = "\"";
  for (char c : s) {
    const auto b = static_cast<unsigned char>(c);
    if (b < 0x20 || b == 0x7f || (b >= 0x80 && !utf8_ok)) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", b);
      out += buf;
    } else {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
  }
  return out + "\"";
}

constexpr std::string_view kNotText =
    "expected one line of printable UTF-8 text, got ";

// Edit distance, for "did you mean" hints on unknown keys.
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min(
          {row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// ---------------------------------------------------------------------------
// String checks referenced from the tables.

constexpr std::array<std::string_view, 8> kLogLevels = {
    "emerg", "alert", "crit", "err", "warning", "notice", "info", "debug"};

std::string check_log_level(std::string& v) {
  if (std::find(kLogLevels.begin(), kLogLevels.end(), v) != kLogLevels.end()) {
    return {};
  }
  return "expected one of emerg, alert, crit, err, warning, notice, info, "
         "debug, got " +
         quote(v);
}

std::string check_cc_algorithm(std::string& v) {
  if (v == "window" || v == "dcqcn" || v == "off") return {};
  return "expected window, dcqcn or off, got " + quote(v);
}

std::string check_gid_layout(std::string& v) {
  if (v == "urnic" || v == "kernel") return {};
  return "expected urnic or kernel, got " + quote(v);
}

std::string check_file_prefix(std::string& v) {
  // It names files under /var/run/dpdk and hugetlbfs: keep it a plain name.
  const bool chars_ok = std::all_of(v.begin(), v.end(), [](char c) {
    return is_ident(c) || c == '-' || c == '.';
  });
  if (v.empty() || v.size() > kFilePrefixMax || !chars_ok || v[0] == '.') {
    return "expected 1-64 characters of [A-Za-z0-9_.-] not starting with "
           "'.', got " +
           quote(v);
  }
  return {};
}

std::string check_pci(std::string& v) {
  if (v.empty()) return {};
  // [DDDD:]BB:DD.F, canonicalised to DPDK's device name 0000:bb:dd.f.
  std::string s = v.size() == 7 ? "0000:" + v : v;
  const bool ok = s.size() == 12 && s[4] == ':' && s[7] == ':' &&
                  s[10] == '.' && s[11] >= '0' && s[11] <= '7' &&
                  std::all_of(s.begin(), s.begin() + 4, is_hex) &&
                  is_hex(s[5]) && is_hex(s[6]) && is_hex(s[8]) && is_hex(s[9]);
  if (!ok) {
    return "expected a PCI address DDDD:BB:DD.F such as 0000:00:03.0, got " +
           quote(v);
  }
  v = lower(s);
  return {};
}

std::string check_vdev(std::string& v) {
  if (v.empty()) return {};
  // "driverN[,key=value...]": the driver name must be a plain identifier.
  const auto name = std::string_view(v).substr(0, v.find(','));
  const bool ok = !name.empty() &&
                  std::all_of(name.begin(), name.end(), is_ident) &&
                  v.find_first_of(" \t\r\n") == std::string::npos;
  if (!ok) {
    return "expected a DPDK vdev string such as "
           "\"net_af_packet0,iface=veth0\", got " +
           quote(v);
  }
  return {};
}

std::string check_mac(std::string& v) {
  if (v.empty()) return {};
  uint8_t mac[6];
  if (!parse_mac(v, mac)) {
    return "expected a MAC address xx:xx:xx:xx:xx:xx, got " + quote(v);
  }
  // The port sends from this address: group or all-zero MACs break peers.
  if ((mac[0] & 1) != 0 ||
      std::all_of(mac, mac + 6, [](uint8_t b) { return b == 0; })) {
    return "expected a unicast, non-zero MAC address, got " + quote(v);
  }
  v = format_mac(mac);
  return {};
}

std::string check_socket_path(std::string& v) {
  if (v.empty() || v[0] != '/' || v.size() > kSunPathMax) {
    return "expected an absolute path of at most 107 bytes, got " + quote(v);
  }
  return {};
}

// Parses "a.b.c.d/p", rejecting addresses a port cannot own.
std::string parse_cidr4(const std::string& s, Ipv4Cidr& out) {
  const std::string usage =
      "expected an IPv4 address with prefix length such as 10.0.0.1/24, got " +
      quote(s);
  std::string text;
  uint32_t addr = 0;
  uint8_t prefix = 0;
  if (!split_cidr(s, 32, text, prefix) || !parse_ipv4(text, addr)) return usage;
  const uint32_t top = addr >> 24;
  if (addr == 0 || addr == UINT32_MAX || top == 0 || top == 127 || top >= 224) {
    return "expected a unicast IPv4 address, got " + quote(s);
  }
  // The subnet's own address and its broadcast address name no host (a
  // /31 and a /32 have neither, RFC 3021).
  const uint32_t host = prefix >= 31 ? 0 : ~uint32_t{0} >> prefix;
  if (host && ((addr & host) == 0 || (addr & host) == host)) {
    return "expected a host address, got the " +
           std::string((addr & host) == 0 ? "network" : "broadcast") +
           " address of its subnet " + quote(s);
  }
  out = {.addr = addr, .prefix = prefix, .present = true};
  return {};
}

std::string parse_cidr6(const std::string& s, Ipv6Cidr& out) {
  const std::string usage =
      "expected an IPv6 address with prefix length such as fd00::1/64, got " +
      quote(s);
  std::string text;
  Ipv6Cidr c;
  if (!split_cidr(s, 128, text, c.prefix) || !parse_ipv6(text, c.addr))
    return usage;
  static constexpr uint8_t kLoopback[16] = {0, 0, 0, 0, 0, 0, 0, 0,
                                            0, 0, 0, 0, 0, 0, 0, 1};
  const bool unspecified =
      std::all_of(c.addr, c.addr + 16, [](uint8_t b) { return b == 0; });
  if (unspecified || c.addr[0] == 0xff ||
      std::memcmp(c.addr, kLoopback, 16) == 0) {
    return "expected a unicast IPv6 address, got " + quote(s);
  }
  c.present = true;
  out = c;
  return {};
}

std::string format_cidr(const Ipv4Cidr& c) {
  return c.present ? format_ipv4(c.addr) + "/" + std::to_string(c.prefix) : "";
}

std::string format_cidr(const Ipv6Cidr& c) {
  return c.present ? format_ipv6(c.addr) + "/" + std::to_string(c.prefix) : "";
}

// ---------------------------------------------------------------------------
// Scalar decoding. YAML 1.2 core schema: integers are decimal, 0x hex or 0o
// octal (so 0660 is decimal 660), booleans are true/false only.

struct IntText {
  bool valid = false;
  bool negative = false;
  bool overflow = false;
  uint64_t value = 0;
};

IntText parse_int_text(std::string_view s) {
  IntText r;
  unsigned base = 10;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'o')) {
    base = s[1] == 'x' ? 16 : 8;
    s.remove_prefix(2);
  } else if (!s.empty() && (s[0] == '-' || s[0] == '+')) {
    r.negative = s[0] == '-';
    s.remove_prefix(1);
  }
  if (s.empty()) return r;
  for (char c : s) {
    unsigned d = 0;
    if (base == 16 && is_hex(c)) {
      d = static_cast<unsigned>(hex_value(c));
    } else if (c >= '0' && c <= '9' && static_cast<unsigned>(c - '0') < base) {
      d = static_cast<unsigned>(c - '0');
    } else {
      return r;
    }
    if (r.value > (UINT64_MAX - d) / base) r.overflow = true;
    r.value = r.overflow ? 0 : r.value * base + d;
  }
  r.valid = true;
  if (r.negative && r.value == 0 && !r.overflow) r.negative = false;  // -0
  return r;
}

// "got ..." text for type errors.
std::string describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Sequence:
      return "a sequence";
    case YAML::NodeType::Scalar: {
      const std::string& s = n.Scalar();
      return (n.Tag() == "!" ? "a quoted string " : "") +
             quote(s.size() > 40 ? s.substr(0, 40) + "..." : s);
    }
    default:
      return "nothing";
  }
}

bool is_plain_scalar(const YAML::Node& n, std::string_view explicit_tag) {
  return n.IsScalar() && (n.Tag() == "?" || n.Tag() == explicit_tag);
}

// ---------------------------------------------------------------------------
// The decoder: YAML tree (file + overrides) -> Config, with locations.

// Where something is in what the user wrote: a file or an -o override.
struct Loc {
  std::string file;
  int line = 1;  // 1-based
  int col = 1;
};

std::string prefix(const Loc& loc) {
  return loc.file + ":" + std::to_string(loc.line) + ":" +
         std::to_string(loc.col) + ": ";
}

[[noreturn]] void fail(const Loc& loc, std::string_view key,
                       std::string_view what) {
  throw ConfigError(prefix(loc) + "key '" + std::string(key) +
                    "': " + std::string(what));
}

[[noreturn]] void fail_plain(const Loc& loc, std::string_view what) {
  throw ConfigError(prefix(loc) + std::string(what));
}

Loc loc_at(std::string file, const YAML::Mark& mark, int col_offset = 0) {
  Loc loc{std::move(file), 1, 1 + col_offset};
  if (!mark.is_null()) {
    loc.line = mark.line + 1;
    loc.col = mark.column + 1 + (mark.line == 0 ? col_offset : 0);
  }
  return loc;
}

// Records where each document starts, building nothing.
class DocumentStarts : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override {
    marks.push_back(mark);
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}

  std::vector<YAML::Mark> marks;
};

// Parses text holding at most one YAML document (a Null node if none).
// Errors name `file`; col_offset shifts columns of the first line (an
// override's value starts after "key="). A first pass walks the documents
// itself because yaml-cpp 0.7 never consumes a stray ',' ']' or '}' outside
// a collection: LoadAll() then loops forever and Load() ignores the rest.
YAML::Node load_single_document(const std::string& text,
                                const std::string& file, int col_offset) {
  try {
    std::istringstream in(text);
    YAML::Parser parser(in);
    DocumentStarts starts;
    while (parser.HandleNextDocument(starts)) {
      const auto& m = starts.marks;
      if (m.size() >= 2 && m[m.size() - 1].pos == m[m.size() - 2].pos) {
        const auto pos = static_cast<size_t>(m.back().pos);
        fail_plain(loc_at(file, m.back(), col_offset),
                   "YAML syntax error: unexpected " +
                       quote(pos < text.size() ? text.substr(pos, 1) : ""));
      }
    }
    if (starts.marks.size() > 1) {
      fail_plain(loc_at(file, starts.marks[1], col_offset),
                 "expected a single YAML document");
    }
    return YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    fail_plain(loc_at(file, e.mark, col_offset), "YAML syntax error: " + e.msg);
  }
}

// A row's member in one object, its type erased: what it is, where, and
// for a section how to decode, emit and compare it. Each section visits
// its Member<S> once, in ref(), rather than at every use: a std::visit
// instantiates all of Member<S>'s alternatives for every section, and six
// of them made this file the slowest of the tree to compile.
enum class Kind : uint8_t {
  kU64,
  kU32,
  kU16,
  kU8,
  kBool,
  kString,
  kU32List,
  kStringList,
  kCidr4,
  kCidr6,
  kSection
};
class Decoder;
struct SectionOps {
  void (*decode)(Decoder&, const YAML::Node&, const std::string&, const Loc&,
                 void*);
  void (*emit)(YAML::Emitter&, const void*);
  bool (*equal)(const void*, const void*);
};
struct Ref {
  Kind kind;
  void* p;
  const SectionOps* ops = nullptr;  // a section's
};
template <Section T>
const SectionOps& section_ops();

Ref make_ref(uint64_t& v) {
  return {Kind::kU64, &v};
}
Ref make_ref(uint32_t& v) {
  return {Kind::kU32, &v};
}
Ref make_ref(uint16_t& v) {
  return {Kind::kU16, &v};
}
Ref make_ref(uint8_t& v) {
  return {Kind::kU8, &v};
}
Ref make_ref(bool& v) {
  return {Kind::kBool, &v};
}
Ref make_ref(std::string& v) {
  return {Kind::kString, &v};
}
Ref make_ref(std::vector<uint32_t>& v) {
  return {Kind::kU32List, &v};
}
Ref make_ref(std::vector<std::string>& v) {
  return {Kind::kStringList, &v};
}
Ref make_ref(Ipv4Cidr& v) {
  return {Kind::kCidr4, &v};
}
Ref make_ref(Ipv6Cidr& v) {
  return {Kind::kCidr6, &v};
}
template <Section T>
Ref make_ref(T& v) {
  return {Kind::kSection, &v, &section_ops<T>()};
}
// `s` is only read through the result where it is const (emit, equal).
template <class S>
Ref ref(const Field<S>& f, const S& s) {
  return std::visit([&](auto m) { return make_ref(const_cast<S&>(s).*m); },
                    f.member);
}

// f(the member, typed) for a leaf of any kind but kSection.
template <class F>
auto on_leaf(const Ref& r, F&& f) {
  switch (r.kind) {
    case Kind::kU64:
      return f(static_cast<uint64_t*>(r.p));
    case Kind::kU32:
      return f(static_cast<uint32_t*>(r.p));
    case Kind::kU16:
      return f(static_cast<uint16_t*>(r.p));
    case Kind::kU8:
      return f(static_cast<uint8_t*>(r.p));
    case Kind::kBool:
      return f(static_cast<bool*>(r.p));
    case Kind::kString:
      return f(static_cast<std::string*>(r.p));
    case Kind::kU32List:
      return f(static_cast<std::vector<uint32_t>*>(r.p));
    case Kind::kStringList:
      return f(static_cast<std::vector<std::string>*>(r.p));
    case Kind::kCidr4:
      return f(static_cast<Ipv4Cidr*>(r.p));
    case Kind::kCidr6:
      return f(static_cast<Ipv6Cidr*>(r.p));
    case Kind::kSection:
      break;
  }
  __builtin_unreachable();
}

class Decoder {
 public:
  explicit Decoder(std::string source) : source_(std::move(source)) {}

  YAML::Node load_document(const std::string& text) const;
  void apply_override(YAML::Node& root, const std::string& text);
  void decode(const YAML::Node& root, Config& cfg);

  // SectionOps::decode of section T.
  template <Section T>
  static void decode_thunk(Decoder& d, const YAML::Node& v,
                           const std::string& path, const Loc& loc, void* out) {
    d.decode_section(v, path, loc, *static_cast<T*>(out));
  }

 private:
  template <Section S>
  void decode_section(const YAML::Node& node, const std::string& path,
                      const Loc& where, S& out);
  // The member `r` from `v`: by its kind, a leaf below or a section.
  void decode_ref(const YAML::Node& v, const std::string& path, const Loc& loc,
                  const Rules& f, const Ref& r);
  void decode_member(const YAML::Node& v, const std::string& path,
                     const Loc& loc, const Rules& f, uint64_t& out) {
    out = decode_uint(v, path, loc, f);
  }
  void decode_member(const YAML::Node& v, const std::string& path,
                     const Loc& loc, const Rules& f, uint32_t& out) {
    out = static_cast<uint32_t>(decode_uint(v, path, loc, f));
  }
  void decode_member(const YAML::Node& v, const std::string& path,
                     const Loc& loc, const Rules& f, uint16_t& out) {
    out = static_cast<uint16_t>(decode_uint(v, path, loc, f));
  }
  void decode_member(const YAML::Node& v, const std::string& path,
                     const Loc& loc, const Rules& f, uint8_t& out) {
    out = static_cast<uint8_t>(decode_uint(v, path, loc, f));
  }
  void decode_member(const YAML::Node& v, const std::string& path,
                     const Loc& loc, const Rules& f, bool& out);
  void decode_member(const YAML::Node& v, const std::string& path,
                     const Loc& loc, const Rules& f, std::string& out);
  void decode_member(const YAML::Node& v, const std::string& path,
                     const Loc& loc, const Rules& f,
                     std::vector<uint32_t>& out);
  void decode_member(const YAML::Node& v, const std::string& path,
                     const Loc& loc, const Rules& f,
                     std::vector<std::string>& out);
  template <class Cidr>
  requires std::is_same_v<Cidr, Ipv4Cidr> || std::is_same_v<Cidr, Ipv6Cidr>
  void decode_member(const YAML::Node& v, const std::string& path,
                     const Loc& loc, const Rules& f, Cidr& out);

  uint64_t decode_uint(const YAML::Node& v, const std::string& path,
                       const Loc& loc, const Rules& f) const;

  void set_path(YAML::Node node, std::span<const std::string> parts,
                const YAML::Node& value, const std::string& walked) const;
  void check_cross_fields(const Config& cfg) const;

  // Override column offset of the longest overridden prefix of path, if any.
  const int* override_of(const std::string& path) const;
  Loc locate(const std::string& path, const YAML::Mark& mark) const;
  // A key's value: points at the value, or at the key when the value is
  // empty (yaml-cpp marks an empty value at the next token).
  Loc locate(const std::string& path, const YAML::Node& key,
             const YAML::Node& value) const;
  // Best location recorded for path or its nearest recorded ancestor.
  Loc recorded(std::string path) const;

  std::string source_;
  // Dotted path -> column offset of its value in the override text.
  std::map<std::string, int> overrides_;
  // Dotted path (list elements as path[i]) -> where its value was written.
  std::map<std::string, Loc> seen_;
  Loc root_loc_;
};

YAML::Node Decoder::load_document(const std::string& text) const {
  YAML::Node root = load_single_document(text, source_, 0);
  if (root.IsNull()) {
    return YAML::Node(YAML::NodeType::Map);  // empty file: all defaults
  }
  if (!root.IsMap()) {
    fail_plain(
        loc_at(source_, root.Mark()),
        "top level must be a map of sections (eal, port, mempool, "
        "lcores, control, stats, arp, cm, limits, client_limits, transport, "
        "fault), got " +
            describe(root));
  }
  return root;
}

// True when parts name a key or section in S's schema.
template <Section S>
bool known_path(std::span<const std::string> parts) {
  for (const auto& f : Schema<S>::kFields) {
    if (f.key != parts[0]) continue;
    if (parts.size() == 1) return true;
    return std::visit(
        [&](auto m) {
          using T = MemberType<decltype(m)>;
          if constexpr (Section<T>) {
            return known_path<T>(parts.subspan(1));
          } else {
            return false;
          }
        },
        f.member);
  }
  return false;
}

// Sets node[parts...] = value, creating intermediate maps. Nodes are passed
// by value because yaml-cpp's Node::operator= rebinds shared content.
void Decoder::set_path(YAML::Node node, std::span<const std::string> parts,
                       const YAML::Node& value,
                       const std::string& walked) const {
  const std::string& key = parts[0];
  if (parts.size() == 1) {
    node[key] = value;
    return;
  }
  const std::string path = join(walked, key);
  {
    YAML::Node existing = node[key];
    if (!existing.IsDefined() || existing.IsNull()) {
      node[key] = YAML::Node(YAML::NodeType::Map);
    } else if (!existing.IsMap()) {
      fail(locate(path, existing.Mark()), path,
           "expected a map, got " + describe(existing));
    }
  }
  set_path(node[key], parts.subspan(1), value, path);
}

void Decoder::apply_override(YAML::Node& root, const std::string& text) {
  const auto eq = text.find('=');
  const std::string key = trim(std::string_view(text).substr(0, eq));
  std::vector<std::string> parts;
  bool well_formed = eq != std::string::npos && !key.empty();
  for (size_t start = 0; well_formed;) {
    const auto dot = key.find('.', start);
    parts.push_back(key.substr(start, dot - start));
    well_formed = !parts.back().empty();
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  const auto key_start = text.find_first_not_of(" \t");
  const Loc key_loc{
      std::string(kOverrideFile), 1,
      key_start == std::string::npos ? 1 : 1 + static_cast<int>(key_start)};
  if (!well_formed) {
    fail_plain(key_loc, "malformed override " + quote(text) +
                            ": expected dotted.key=value");
  }
  if (!known_path<Config>(parts)) fail(key_loc, key, "unknown key");

  const int offset = static_cast<int>(eq + 1);
  const YAML::Node value = load_single_document(
      text.substr(eq + 1), std::string(kOverrideFile), offset);
  set_path(root, parts, value, "");
  // Anything previously overridden beneath key is gone now.
  for (auto it = overrides_.lower_bound(key);
       it != overrides_.end() && it->first.starts_with(key);) {
    const char next = it->first.size() > key.size() ? it->first[key.size()] : 0;
    it = (next == 0 || next == '.') ? overrides_.erase(it) : std::next(it);
  }
  overrides_[key] = offset;
}

const int* Decoder::override_of(const std::string& path) const {
  std::string p = path;
  while (!p.empty()) {
    const auto it = overrides_.find(p);
    if (it != overrides_.end()) return &it->second;
    const auto dot = p.rfind('.');
    p.resize(dot == std::string::npos ? 0 : dot);
  }
  return nullptr;
}

Loc Decoder::locate(const std::string& path, const YAML::Mark& mark) const {
  if (const int* offset = override_of(path)) {
    return loc_at(std::string(kOverrideFile), mark, *offset);
  }
  return loc_at(source_, mark);
}

Loc Decoder::locate(const std::string& path, const YAML::Node& key,
                    const YAML::Node& value) const {
  // An override's key is not in its text, so always point at its value.
  const bool use_value =
      override_of(path) != nullptr || (value.IsDefined() && !value.IsNull());
  return locate(path, use_value ? value.Mark() : key.Mark());
}

Loc Decoder::recorded(std::string path) const {
  while (!path.empty()) {
    const auto it = seen_.find(path);
    if (it != seen_.end()) return it->second;
    const auto cut = path.find_last_of(".[");
    path.resize(cut == std::string::npos ? 0 : cut);
  }
  return root_loc_;
}

template <Section S>
void Decoder::decode_section(const YAML::Node& node, const std::string& path,
                             const Loc& where, S& out) {
  constexpr auto& kFields = Schema<S>::kFields;
  std::array<bool, std::size(kFields)> seen{};
  if (node.IsDefined() && !node.IsNull()) {  // "idle:" alone means defaults
    if (!node.IsMap())
      fail(where, path, "expected a map, got " + describe(node));
    for (const auto& kv : node) {
      const YAML::Node& key = kv.first;
      const YAML::Node& value = kv.second;
      if (!key.IsScalar()) {
        fail(locate(path, key.Mark()), path, "keys must be plain names");
      }
      const std::string child = join(path, key.Scalar());
      const auto it =
          std::find_if(std::begin(kFields), std::end(kFields),
                       [&](const auto& f) { return f.key == key.Scalar(); });
      if (it == std::end(kFields)) {
        std::string what = "unknown key";
        size_t best = 3;  // suggest only near misses
        for (const auto& f : kFields) {
          const size_t d = edit_distance(f.key, key.Scalar());
          if (d < best && d < f.key.size()) {
            best = d;
            what = "unknown key (did you mean '" + join(path, f.key) + "'?)";
          }
        }
        fail(locate(child, key.Mark()), child, what);
      }
      const size_t index = static_cast<size_t>(it - std::begin(kFields));
      if (seen[index]) fail(locate(child, key.Mark()), child, "duplicate key");
      seen[index] = true;
      const Ref r = ref(*it, out);
      // Sections are reported at their key (missing keys inside them).
      const Loc loc = r.kind == Kind::kSection && override_of(child) == nullptr
                          ? locate(child, key.Mark())
                          : locate(child, key, value);
      seen_[child] = loc;
      decode_ref(value, child, loc, rules_of(*it), r);
    }
  }
  for (size_t i = 0; i < std::size(kFields); ++i) {
    if (seen[i]) continue;
    const auto& f = kFields[i];
    const std::string child = join(path, f.key);
    if (f.required) fail(where, child, "missing required key");
    // Absent sections still get their own required keys checked.
    const Ref r = ref(f, out);
    if (r.kind == Kind::kSection)
      r.ops->decode(*this, YAML::Node(), child, where, r.p);
  }
}

void Decoder::decode_ref(const YAML::Node& v, const std::string& path,
                         const Loc& loc, const Rules& f, const Ref& r) {
  if (r.kind == Kind::kSection) return r.ops->decode(*this, v, path, loc, r.p);
  on_leaf(r, [&](auto* leaf) { decode_member(v, path, loc, f, *leaf); });
}

uint64_t Decoder::decode_uint(const YAML::Node& v, const std::string& path,
                              const Loc& loc, const Rules& f) const {
  if (f.format == IntFormat::kOctalMode) {
    // chmod-style: the digits are octal whether written 0660, 660, "0660"
    // or 0o660 (YAML 1.2 would read a plain 0660 as decimal 660).
    std::string_view s;
    if (v.IsScalar()) s = v.Scalar();
    if (s.size() > 2 && s[0] == '0' && s[1] == 'o') s.remove_prefix(2);
    const bool octal =
        !s.empty() && std::all_of(s.begin(), s.end(),
                                  [](char c) { return c >= '0' && c <= '7'; });
    if (!octal) {
      fail(loc, path,
           "expected an octal file mode such as 0660, got " + describe(v));
    }
    const IntText t = parse_int_text("0o" + std::string(s));
    if (t.overflow || t.value > f.max) {
      fail(loc, path,
           "out of range [" + format_mode(f.min) + ", " + format_mode(f.max) +
               "], got " + std::string(v.Scalar()));
    }
    return t.value;
  }
  if (!is_plain_scalar(v, kIntTag)) {
    fail(loc, path, "expected an integer, got " + describe(v));
  }
  const IntText t = parse_int_text(v.Scalar());
  if (!t.valid) fail(loc, path, "expected an integer, got " + describe(v));
  if (t.negative || t.overflow || t.value < f.min || t.value > f.max) {
    fail(loc, path,
         "out of range [" + std::to_string(f.min) + ", " +
             std::to_string(f.max) + "], got " + v.Scalar());
  }
  return t.value;
}

void Decoder::decode_member(const YAML::Node& v, const std::string& path,
                            const Loc& loc, const Rules& /*f*/, bool& out) {
  if (is_plain_scalar(v, kBoolTag)) {
    const std::string& s = v.Scalar();
    if (s == "true" || s == "True" || s == "TRUE") {
      out = true;
      return;
    }
    if (s == "false" || s == "False" || s == "FALSE") {
      out = false;
      return;
    }
  }
  fail(loc, path, "expected a boolean (true or false), got " + describe(v));
}

void Decoder::decode_member(const YAML::Node& v, const std::string& path,
                            const Loc& loc, const Rules& f, std::string& out) {
  if (v.IsNull()) {
    out.clear();  // "mac:" alone is the same as mac: ""
  } else if (v.IsScalar()) {
    out = v.Scalar();
    if (!is_printable_utf8(out))
      fail(loc, path, std::string(kNotText) + describe(v));
  } else {
    fail(loc, path, "expected a string, got " + describe(v));
  }
  if (f.check != nullptr) {
    const std::string error = f.check(out);
    if (!error.empty()) fail(loc, path, error);
  }
}

void Decoder::decode_member(const YAML::Node& v, const std::string& path,
                            const Loc& loc, const Rules& f,
                            std::vector<uint32_t>& out) {
  out.clear();
  if (v.IsNull()) return;
  if (!v.IsSequence()) {
    fail(loc, path, "expected a sequence of integers, got " + describe(v));
  }
  for (const auto& element : v) {
    const Loc element_loc = locate(path, element.Mark());
    seen_[path + "[" + std::to_string(out.size()) + "]"] = element_loc;
    out.push_back(
        static_cast<uint32_t>(decode_uint(element, path, element_loc, f)));
  }
}

void Decoder::decode_member(const YAML::Node& v, const std::string& path,
                            const Loc& loc, const Rules& /*f*/,
                            std::vector<std::string>& out) {
  out.clear();
  if (v.IsNull()) return;
  if (!v.IsSequence()) {
    fail(loc, path, "expected a sequence of strings, got " + describe(v));
  }
  for (const auto& element : v) {
    if (!element.IsScalar()) {
      fail(locate(path, element.Mark()), path,
           "expected a sequence of strings, got " + describe(element));
    }
    if (!is_printable_utf8(element.Scalar())) {
      fail(locate(path, element.Mark()), path,
           std::string(kNotText) + describe(element));
    }
    out.push_back(element.Scalar());
  }
}

template <class Cidr>
requires std::is_same_v<Cidr, Ipv4Cidr> || std::is_same_v<Cidr, Ipv6Cidr>
void Decoder::decode_member(const YAML::Node& v, const std::string& path,
                            const Loc& loc, const Rules& f, Cidr& out) {
  constexpr bool kV4 = std::is_same_v<Cidr, Ipv4Cidr>;
  constexpr std::string_view kUsage =
      kV4 ? "expected an IPv4 address with prefix length such as 10.0.0.1/24"
          : "expected an IPv6 address with prefix length such as fd00::1/64";
  out = Cidr{};
  if (!v.IsNull() && !v.IsScalar()) {
    fail(loc, path, std::string(kUsage) + ", got " + describe(v));
  }
  const std::string text = v.IsScalar() ? v.Scalar() : "";
  if (text.empty()) {
    if (!f.required) return;  // optional address left out
    fail(loc, path, kUsage);
  }
  std::string error;
  if constexpr (kV4) {
    error = parse_cidr4(text, out);
  } else {
    error = parse_cidr6(text, out);
  }
  if (!error.empty()) fail(loc, path, error);
}

void Decoder::check_cross_fields(const Config& cfg) const {
  const PortConfig& port = cfg.port;
  if (port.pci.empty() == port.vdev.empty()) {
    const std::string what =
        "exactly one of port.pci and port.vdev must be set";
    if (port.pci.empty()) fail(recorded("port"), "port", what);
    fail(recorded("port.vdev"), "port.vdev", what);
  }
  if (port.gid_layout == "kernel" && !port.ipv6.present) {
    fail(recorded("port.gid_layout"), "port.gid_layout",
         "the kernel's GID layout starts with the IPv6 link-local GID: set "
         "port.ipv6 too");
  }
  // port.cc keeps port.mac in software on af_packet (the PMD would set it
  // on the kernel's interface); frames to it arrive only in promiscuous mode.
  if (port.vdev.starts_with("net_af_packet") && !port.mac.empty() &&
      !port.promiscuous) {
    fail(recorded("port.promiscuous"), "port.promiscuous",
         "port.mac on net_af_packet is urnicd's own address beside the "
         "kernel's: it needs port.promiscuous: true");
  }
  if (port.ipv6.present && port.mtu < kIpv6MinMtu) {
    fail(recorded("port.mtu"), "port.mtu",
         "IPv6 needs an MTU of at least 1280, got " + std::to_string(port.mtu));
  }

  const EalConfig& eal = cfg.eal;
  if (eal.workers.empty()) {
    fail(recorded("eal.workers"), "eal.workers",
         "at least one worker lcore is required");
  }
  // QPNs carry their worker (slot x workers + worker) in 24 bits, and keep
  // at least 4 bits of generation so that a stale packet misses a new QP.
  if (uint64_t{cfg.limits.max_qp} * std::max<size_t>(eal.workers.size(), 1) >
      (1u << 20)) {
    fail(recorded("limits.max_qp"), "limits.max_qp",
         "limits.max_qp " + std::to_string(cfg.limits.max_qp) + " x " +
             std::to_string(eal.workers.size()) +
             " worker lcores is over 1048576 (QPNs have 24 bits)");
  }
  if (eal.workers.size() > kMaxWorkers) {
    fail(recorded("eal.workers"), "eal.workers",
         std::to_string(eal.workers.size()) + " worker lcores; at most " +
             std::to_string(kMaxWorkers) +
             " (each is the home of QPs with its own share of a client's "
             "doorbell page)");
  }
  for (size_t i = 0; i < eal.workers.size(); ++i) {
    const std::string element = "eal.workers[" + std::to_string(i) + "]";
    if (eal.workers[i] == eal.main_lcore) {
      fail(recorded(element), "eal.workers",
           "worker lcore " + std::to_string(eal.workers[i]) +
               " is the main lcore");
    }
    if (std::find(eal.workers.begin(), eal.workers.begin() + i,
                  eal.workers[i]) != eal.workers.begin() + i) {
      fail(recorded(element), "eal.workers",
           "duplicate worker lcore " + std::to_string(eal.workers[i]));
    }
  }

  const TransportConfig& t = cfg.transport;
  if (t.cc.min_window > t.cc.init_window) {
    fail(recorded("transport.cc.min_window"), "transport.cc.min_window",
         "min_window " + std::to_string(t.cc.min_window) +
             " is above init_window " + std::to_string(t.cc.init_window));
  }
  if (t.cc.shared_min_window > t.cc.shared_init_window) {
    fail(recorded("transport.cc.shared_min_window"),
         "transport.cc.shared_min_window",
         "shared_min_window " + std::to_string(t.cc.shared_min_window) +
             " is above shared_init_window " +
             std::to_string(t.cc.shared_init_window));
  }
  if (t.cc.shared_max_window &&
      t.cc.shared_max_window < t.cc.shared_init_window) {
    fail(recorded("transport.cc.shared_max_window"),
         "transport.cc.shared_max_window",
         "shared_max_window " + std::to_string(t.cc.shared_max_window) +
             " is below shared_init_window " +
             std::to_string(t.cc.shared_init_window));
  }

  for (const auto& [name, d] : {std::pair{"fault.rx", &cfg.fault.rx},
                                std::pair{"fault.tx", &cfg.fault.tx}}) {
    if (d->ecn_kb > d->queue_kb) {
      const std::string key = std::string(name) + ".ecn_kb";
      fail(recorded(key), key,
           "ecn_kb " + std::to_string(d->ecn_kb) + " is above queue_kb " +
               std::to_string(d->queue_kb) + " (frames would be dropped " +
               "before they could be marked)");
    }
    if (d->ecn_kb && !d->rate_mbps) {
      const std::string key = std::string(name) + ".ecn_kb";
      fail(recorded(key), key,
           "ECN marking needs a queue: set " + std::string(name) +
               ".rate_mbps too");
    }
  }

  // rte_mempool_create() rejects cache * 1.5 > n.
  const MempoolConfig& mp = cfg.mempool;
  if (uint64_t{mp.cache} * 3 / 2 > mp.mbufs) {
    fail(recorded("mempool.cache"), "mempool.cache",
         "cache " + std::to_string(mp.cache) + " needs at least " +
             std::to_string(uint64_t{mp.cache} * 3 / 2) +
             " mbufs (DPDK requires cache * 1.5 <= mbufs), got " +
             std::to_string(mp.mbufs));
  }
}

void Decoder::decode(const YAML::Node& root, Config& cfg) {
  root_loc_ = loc_at(source_, root.Mark());
  decode_section(root, "", root_loc_, cfg);
  // A default that depends on another key (IdleConfig).
  IdleConfig& idle = cfg.lcores.idle;
  if (idle.yield && !seen_.contains("lcores.idle.spin_polls"))
    idle.spin_polls = IdleConfig::kSpinPollsYield;
  check_cross_fields(cfg);
}

// ---------------------------------------------------------------------------
// Dump and equality, driven by the same tables.

template <Section S>
void emit_section(YAML::Emitter& out, const S& s);

template <class T>
void emit_value(YAML::Emitter& out, IntFormat format, const T& v) {
  if constexpr (std::is_same_v<T, bool>) {
    out << (v ? "true" : "false");
  } else if constexpr (std::is_integral_v<T>) {
    out << (format == IntFormat::kOctalMode ? format_mode(v)
                                            : std::to_string(v));
  } else if constexpr (std::is_same_v<T, std::string>) {
    out << YAML::DoubleQuoted << v;
  } else if constexpr (std::is_same_v<T, std::vector<uint32_t>>) {
    out << YAML::Flow << YAML::BeginSeq;
    for (uint32_t x : v) out << std::to_string(x);
    out << YAML::EndSeq;
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    out << YAML::Flow << YAML::BeginSeq;
    for (const auto& x : v) out << YAML::DoubleQuoted << x;
    out << YAML::EndSeq;
  } else {
    out << YAML::DoubleQuoted << format_cidr(v);
  }
}

void emit_ref(YAML::Emitter& out, IntFormat format, const Ref& r) {
  if (r.kind == Kind::kSection) return r.ops->emit(out, r.p);
  on_leaf(r, [&](const auto* leaf) { emit_value(out, format, *leaf); });
}

template <Section S>
void emit_section(YAML::Emitter& out, const S& s) {
  out << YAML::BeginMap;
  for (const auto& f : Schema<S>::kFields) {
    out << YAML::Key << std::string(f.key) << YAML::Value;
    emit_ref(out, f.format, ref(f, s));
  }
  out << YAML::EndMap;
}

template <Section S>
bool equal(const S& a, const S& b);

template <class T>
bool equal_value(const T& a, const T& b) {
  if constexpr (std::is_same_v<T, Ipv4Cidr>) {
    // An absent address has no meaningful value.
    return a.present == b.present &&
           (!a.present || (a.addr == b.addr && a.prefix == b.prefix));
  } else if constexpr (std::is_same_v<T, Ipv6Cidr>) {
    return a.present == b.present &&
           (!a.present ||
            (std::memcmp(a.addr, b.addr, 16) == 0 && a.prefix == b.prefix));
  } else {
    return a == b;
  }
}

// `a` and `b` are the same row of two objects.
bool equal_ref(const Ref& a, const Ref& b) {
  if (a.kind == Kind::kSection) return a.ops->equal(a.p, b.p);
  return on_leaf(a, [&]<class T>(T* leaf) {
    return equal_value<T>(*leaf, *static_cast<const T*>(b.p));
  });
}

template <Section S>
bool equal(const S& a, const S& b) {
  return std::all_of(
      std::begin(Schema<S>::kFields), std::end(Schema<S>::kFields),
      [&](const auto& f) { return equal_ref(ref(f, a), ref(f, b)); });
}

template <Section T>
const SectionOps& section_ops() {
  static constexpr SectionOps kOps{
      &Decoder::decode_thunk<T>,
      [](YAML::Emitter& out, const void* p) {
        emit_section(out, *static_cast<const T*>(p));
      },
      [](const void* a, const void* b) {
        return equal(*static_cast<const T*>(a), *static_cast<const T*>(b));
      }};
  return kOps;
}

}  // namespace

// ---------------------------------------------------------------------------
// Public API.

Config parse(const std::string& yaml_text, const std::string& source,
             const std::vector<std::string>& overrides) {
  try {
    Decoder decoder(source);
    YAML::Node root = decoder.load_document(yaml_text);
    for (const auto& o : overrides) decoder.apply_override(root, o);
    Config cfg;
    cfg.source = source;
    decoder.decode(root, cfg);
    return cfg;
  } catch (const YAML::Exception& e) {
    // Not expected (the decoder avoids throwing yaml-cpp calls); keeps the
    // promise that only ConfigError escapes.
    throw ConfigError(prefix(loc_at(source, e.mark)) + "YAML error: " + e.msg);
  }
}

Config load_file(const std::string& path,
                 const std::vector<std::string>& overrides) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(
      std::fopen(path.c_str(), "rb"), std::fclose);
  if (!f) {
    throw ConfigError("cannot open " + path + ": " +
                      std::generic_category().message(errno));
  }
  std::string text;
  char buf[65536];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f.get())) > 0) text.append(buf, n);
  if (std::ferror(f.get())) {
    throw ConfigError("cannot read " + path + ": " +
                      std::generic_category().message(errno));
  }
  return parse(text, path, overrides);
}

const std::string& embedded_default() {
  static const std::string kText = internal::kEmbeddedUrnicdYaml;
  return kText;
}

std::string dump(const Config& cfg) {
  YAML::Emitter out;
  emit_section(out, cfg);
  return std::string(out.c_str()) + "\n";
}

bool operator==(const Config& a, const Config& b) {
  return equal(a, b);
}

bool parse_ipv4(const std::string& s, uint32_t& out) {
  in_addr a{};
  if (s.find('\0') != std::string::npos ||
      inet_pton(AF_INET, s.c_str(), &a) != 1) {
    return false;
  }
  out = ntohl(a.s_addr);
  return true;
}

bool parse_ipv6(const std::string& s, uint8_t out[16]) {
  in6_addr a{};
  if (s.find('\0') != std::string::npos ||
      inet_pton(AF_INET6, s.c_str(), &a) != 1) {
    return false;
  }
  std::memcpy(out, a.s6_addr, 16);
  return true;
}

bool parse_mac(const std::string& s, uint8_t out[6]) {
  if (s.size() != 17) return false;
  uint8_t mac[6];
  for (size_t i = 0; i < 6; ++i) {
    const char hi = s[i * 3];
    const char lo = s[i * 3 + 1];
    if (!is_hex(hi) || !is_hex(lo) || (i < 5 && s[i * 3 + 2] != ':')) {
      return false;
    }
    mac[i] = static_cast<uint8_t>(hex_value(hi) * 16 + hex_value(lo));
  }
  std::memcpy(out, mac, 6);
  return true;
}

std::string format_ipv4(uint32_t addr) {
  const in_addr a{.s_addr = htonl(addr)};
  char buf[INET_ADDRSTRLEN];
  return inet_ntop(AF_INET, &a, buf, sizeof buf);
}

std::string format_ipv6(const uint8_t addr[16]) {
  in6_addr a{};
  std::memcpy(a.s6_addr, addr, 16);
  char buf[INET6_ADDRSTRLEN];
  return inet_ntop(AF_INET6, &a, buf, sizeof buf);
}

}  // namespace urnic::config
