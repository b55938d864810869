// The port's GID table, derived from its addresses (RoCEv2 GIDs are IP
// addresses, Annex A17.8). urnic's layout: index 0 the IPv4-mapped GID, so
// perftest's default -x 0 and ibv_*_pingpong -g 0 work; then, if IPv6 is
// configured, the link-local fe80::/64 EUI-64 address and the configured
// address. The kernel's layout (port.gid_layout: kernel; needs IPv6), as
// rxe shows it on an interface with IPv6: the link-local address first
// (the default GID), then the IPv4-mapped one at 1 (what scripts written
// for rxe pass as -g 1 / -x 1), then the configured address.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "dataplane/host/host.h"

namespace urnic::host {

struct GidTable {
  static constexpr uint32_t kMax = 3;
  uint8_t gid[kMax][16] = {};
  uint32_t count = 0;

  explicit GidTable(const HostAddrs& h) {
    const bool ll_first = h.kernel_gid_layout && h.has_ipv6;
    if (ll_first) std::memcpy(gid[count++], h.ipv6_ll, 16);
    wire::gid_from_ipv4(h.ipv4, gid[count++]);
    if (h.has_ipv6) {
      if (!ll_first) std::memcpy(gid[count++], h.ipv6_ll, 16);
      std::memcpy(gid[count++], h.ipv6, 16);
    }
  }
  // Index of `g`, or -1.
  int find(const uint8_t g[16]) const {
    for (uint32_t i = 0; i < count; ++i)
      if (std::memcmp(gid[i], g, 16) == 0) return static_cast<int>(i);
    return -1;
  }
};

// "0000:0000:0000:0000:0000:ffff:0a4d:0001", the form ibv_devinfo prints.
std::string format_gid(const uint8_t g[16]);

}  // namespace urnic::host
