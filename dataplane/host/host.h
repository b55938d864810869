// The service's presence as an IP host: ARP responder/resolver, ICMP echo,
// IPv6 neighbour discovery and ICMPv6 echo. Replies are written in place
// into the received frame (no allocation); requests into a caller buffer.
#pragma once

#include <cstdint>

#include "dataplane/host/neighbour.h"
#include "dataplane/stats/counters.h"
#include "dataplane/wire/codec.h"

namespace urnic::host {

struct HostAddrs {
  wire::MacAddr mac{};
  uint32_t ipv4 = 0;  // host order
  uint8_t ipv4_prefix = 24;
  bool has_ipv6 = false;
  uint8_t ipv6[16] = {};     // configured global/ULA address
  uint8_t ipv6_ll[16] = {};  // fe80::/64 EUI-64 from the MAC
  uint8_t ttl = 64;
  // GID table order (gid_table.h): false urnic's (IPv4 first), true the
  // kernel's for rxe (IPv6 link-local first).
  bool kernel_gid_layout = false;

  bool owns_ipv6(const uint8_t a[16]) const;
};

// Builds the link-local address fe80::EUI-64(mac) (RFC 4291 app. A).
void ipv6_link_local(const wire::MacAddr& mac, uint8_t out[16]);

// Outcome of handling one frame.
enum class HostVerdict : uint8_t {
  kConsumed,  // counted, nothing to send; the caller frees the frame
  kReply,     // the frame was rewritten in place: transmit it, *len bytes
};

// `frame`/`len`: the first segment of a frame that decode() classified as
// kArp / kIcmpv4 / kIcmpv6 (`fi`). `now` in ns, for the neighbour cache.
HostVerdict handle_arp(const HostAddrs& h, NeighbourTable& nt,
                       stats::LcoreCounters& c, uint8_t* frame, uint32_t* len,
                       const wire::FrameInfo& fi, uint64_t now);
HostVerdict handle_icmpv4(const HostAddrs& h, stats::LcoreCounters& c,
                          uint8_t* frame, uint32_t* len,
                          const wire::FrameInfo& fi);
// `cap`: bytes writable at `frame` (a neighbour advertisement may be longer
// than the solicitation it answers).
HostVerdict handle_icmpv6(const HostAddrs& h, NeighbourTable& nt,
                          stats::LcoreCounters& c, uint8_t* frame,
                          uint32_t* len, uint32_t cap,
                          const wire::FrameInfo& fi, uint64_t now);

// Request builders: write a whole frame (padded to 60 bytes) to `buf` (at
// least 128 bytes) and return its length. `vlan_tci` 0: untagged.
uint32_t build_arp_request(const HostAddrs& h, uint16_t vlan_tci,
                           uint32_t target_ipv4, uint8_t* buf);
uint32_t build_neighbour_solicit(const HostAddrs& h, uint16_t vlan_tci,
                                 const uint8_t target[16], uint8_t* buf);
// An ICMP echo request to `dst_ipv4` with a zero destination MAC, to be
// filled in once the neighbour resolves.
uint32_t build_icmp_echo_request(const HostAddrs& h, uint16_t vlan_tci,
                                 uint32_t dst_ipv4, uint16_t id, uint16_t seq,
                                 uint8_t* buf);
// IGMPv2 (RFC 2236): a Membership Report for IPv4 group `group` (to the
// group), or with `leave` a Leave Group (to 224.0.0.2, all routers), with
// the IP Router Alert option and TTL 1 (section 2), the destination MAC
// the group's. Switches that snoop IGMP learn from these where to send the
// group's frames.
uint32_t build_igmp(const HostAddrs& h, uint16_t vlan_tci, uint32_t group,
                    bool leave, uint8_t* buf);
// An IGMP Membership Query (type 0x11: v1, v2 and v3 queries, RFC 3376
// 4.1) in the `len` bytes at `l4`, its checksum valid: true, and *group
// the group it asks about (0: every group).
bool igmp_query(const uint8_t* l4, uint32_t len, uint32_t* group);

// Picks ARP or NS by the address family of the GID.
uint32_t build_resolve_request(const HostAddrs& h, uint16_t vlan_tci,
                               const uint8_t gid[16], uint8_t* buf);

// ICMPv6 checksum over the IPv6 pseudo-header and `len` bytes at `l4`.
uint16_t icmpv6_checksum(const wire::Ipv6Hdr& ip, const uint8_t* l4,
                         uint32_t len);

}  // namespace urnic::host
