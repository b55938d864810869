// What the seed programs (perf/sdr, perf/netfr) share besides verbs and
// the side channel: exit codes and the one-line error, the clock, the
// options every program takes, the data pattern and latency percentiles.
#pragma once

#include <getopt.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace seeds {

// Exit codes (those of urnic-perf).
enum Exit : int {
  kOk = 0,
  kSetup = 1,       // device, memory, QP set-up
  kUsage = 2,       // bad options
  kPeerLost = 3,    // side channel closed, or no progress
  kCompletion = 4,  // a work completion with an error status
  kVerify = 5,      // a byte was not what was sent
};

inline const char* g_prog = "seeds";

// Prints "PROG: what" on stderr and exits with `code`.
[[noreturn, gnu::format(printf, 2, 3)]] inline void die(int code,
                                                        const char* fmt, ...) {
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fflush(stdout);
  fprintf(stderr, "%s: %s\n", g_prog, line);
  exit(code);
}

// CLOCK_MONOTONIC: comparable between processes on one host only.
inline uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000u + uint64_t(ts.tv_nsec);
}

// Options every seed program takes, perftest-style: no host = server.
struct Common {
  std::string dev;               // -d: default the first device
  int gid_index = 0;             // -g
  uint16_t tcp_port = 0;         // -p: the side channel's (--cm: RDMA CM's)
  std::string host;              // client role when given
  bool verify = false;           // --verify
  uint32_t period_ms = 1000;     // --period: live lines (0: none)
  uint32_t timeout_s = 10;       // --timeout: no progress for this long = lost
  bool cm = false;               // --cm: set up with RDMA CM (seeds_cm.h)
  std::string bind = "0.0.0.0";  // -b: the --cm server's address
};

inline uint64_t parse_u64(const char* opt, const char* s, uint64_t lo,
                          uint64_t hi) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = strtoull(s, &end, 0);
  if (errno || end == s || *end || v < lo || v > hi)
    die(kUsage, "%s: expected an integer in [%llu, %llu], got '%s'", opt,
        static_cast<unsigned long long>(lo),
        static_cast<unsigned long long>(hi), s);
  return v;
}

// getopt_long ids of the common long options (above any short option).
enum : int { kOptVerify = 1000, kOptPeriod, kOptTimeout, kOptCm, kOptFirstOwn };

inline constexpr option kCommonLong[] = {
    {"verify", no_argument, nullptr, kOptVerify},
    {"period", required_argument, nullptr, kOptPeriod},
    {"timeout", required_argument, nullptr, kOptTimeout},
    {"cm", no_argument, nullptr, kOptCm},
};
inline constexpr const char* kCommonShort = "b:d:g:p:h";
inline constexpr const char* kCommonHelp =
    "  -d DEV          verbs device (default: the first one)\n"
    "  -g GID_INDEX    source GID index (default 0)\n"
    "  -p PORT         TCP port of the side channel (--cm: RDMA CM port)\n"
    "  --cm            set up with RDMA CM (librdmacm), not TCP: HOST is\n"
    "                  then the server's RDMA address; -d does not apply\n"
    "  -b ADDR         --cm server: listen on ADDR (default 0.0.0.0)\n"
    "  --verify        check every byte received\n"
    "  --period MS     live statistics every MS ms (0: off; default 1000)\n"
    "  --timeout S     no progress for S seconds = peer lost (default 10)\n";

// Handles one common option; false when `c` is not one of them.
inline bool parse_common(int c, const char* arg, Common& o) {
  switch (c) {
    case 'b':
      o.bind = arg;
      return true;
    case 'd':
      o.dev = arg;
      return true;
    case 'g':
      o.gid_index = int(parse_u64("-g", arg, 0, 255));
      return true;
    case 'p':
      o.tcp_port = uint16_t(parse_u64("-p", arg, 1, 65535));
      return true;
    case kOptVerify:
      o.verify = true;
      return true;
    case kOptPeriod:
      o.period_ms = uint32_t(parse_u64("--period", arg, 0, 1u << 30));
      return true;
    case kOptTimeout:
      o.timeout_s = uint32_t(parse_u64("--timeout", arg, 1, 86400));
      return true;
    case kOptCm:
      o.cm = true;
      return true;
    default:
      return false;
  }
}

// The data pattern: byte i of the message with `seed`. Cheap, different
// per message and per position; fill and check agree on any endianness.
inline uint64_t pattern_word(uint64_t seed, uint64_t j) {
  uint64_t x = (seed ^ (j * 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
  return x ^ (x >> 31);
}
inline uint8_t pattern_byte(uint64_t seed, size_t i) {
  const uint64_t w = pattern_word(seed, i / 8);
  uint8_t b[8];
  memcpy(b, &w, 8);
  return b[i % 8];
}
// Writes bytes [from, to) of the message at `msg`.
inline void fill_pattern(uint8_t* msg, size_t from, size_t to, uint64_t seed) {
  size_t i = from;
  for (; i < to && i % 8; ++i) msg[i] = pattern_byte(seed, i);
  for (; i + 8 <= to; i += 8) {
    const uint64_t w = pattern_word(seed, i / 8);
    memcpy(msg + i, &w, 8);
  }
  for (; i < to; ++i) msg[i] = pattern_byte(seed, i);
}
// The first offset in [from, to) that differs from the pattern, or `to`.
inline size_t check_pattern(const uint8_t* msg, size_t from, size_t to,
                            uint64_t seed) {
  size_t i = from;
  for (; i < to && i % 8; ++i)
    if (msg[i] != pattern_byte(seed, i)) return i;
  for (; i + 8 <= to; i += 8) {
    const uint64_t w = pattern_word(seed, i / 8);
    if (memcmp(msg + i, &w, 8) != 0) break;
  }
  for (; i < to; ++i)
    if (msg[i] != pattern_byte(seed, i)) return i;
  return to;
}

// Latency summary in µs of samples in ns (sorts them).
struct Percentiles {
  double p50 = 0, p99 = 0, p999 = 0, max = 0, avg = 0;
};
inline Percentiles percentiles(std::vector<uint64_t>& ns, size_t n) {
  Percentiles r;
  if (n == 0) return r;
  std::sort(ns.begin(), ns.begin() + long(n));
  auto at = [&](double q) {
    return double(ns[size_t(q * double(n - 1))]) / 1e3;
  };
  r.p50 = at(0.5);
  r.p99 = at(0.99);
  r.p999 = at(0.999);
  r.max = double(ns[n - 1]) / 1e3;
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += double(ns[i]);
  r.avg = sum / double(n) / 1e3;
  return r;
}

// testpmd's banner lines around a block of statistics.
inline void banner(const char* title) {
  printf("\n  ---------------------- %s ----------------------\n", title);
}
inline void banner_end() {
  printf(
      "  ----------------------------------------------------------------"
      "------\n");
}

// SEEDS_CORRUPT=K (tests only): the sender flips a byte of its K-th
// message or frame after filling it, so --verify must catch it.
inline uint64_t corrupt_index() {
  const char* e = getenv("SEEDS_CORRUPT");
  return e ? strtoull(e, nullptr, 0) : ~uint64_t{0};
}

// xorshift64*: the seeded generator of --drop-ppm.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed ? seed : 0x9E3779B97F4A7C15ull) {}
  uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545F4914F6CDD1Dull;
  }
};

}  // namespace seeds
