// netfr: NetFR's frame relay (seed 002) on plain libibverbs: RDMA WRITE
// into the receiver's ring + SEND notify, credits, a total order across
// two RC QPs. The server (no host argument) receives; the client sends
// and brings the test parameters. Connection set-up here; the roles are
// sender.cc and receiver.cc.
#include <cinttypes>

#include "perf/netfr/netfr.h"

namespace netfr {
namespace {

using seeds::die;

constexpr uint16_t kDefaultPort = 18516;

enum : int { kOptRate = seeds::kOptFirstOwn, kOptRing };

[[noreturn]] void usage(int code) {
  printf(
      "usage: netfr [options]          receiver (server)\n"
      "       netfr [options] HOST     sender (client; its options rule)\n"
      "%s"
      "  -s BYTES        frame size (default 65536)\n"
      "  -n COUNT        frames (default 10000)\n"
      "  --rate FPS      frames per second (default 0: as fast as credits "
      "allow)\n"
      "  --ring N        receiver buffers, and credits, per QP (default 16)\n",
      seeds::kCommonHelp);
  exit(code);
}

Options parse(int argc, char** argv) {
  Options o;
  o.common.tcp_port = kDefaultPort;
  std::vector<option> longs(std::begin(seeds::kCommonLong),
                            std::end(seeds::kCommonLong));
  longs.push_back({"rate", required_argument, nullptr, kOptRate});
  longs.push_back({"ring", required_argument, nullptr, kOptRing});
  longs.push_back({"help", no_argument, nullptr, 'h'});
  longs.push_back({nullptr, 0, nullptr, 0});
  const std::string shorts = std::string(seeds::kCommonShort) + "s:n:";
  for (int c; (c = getopt_long(argc, argv, shorts.c_str(), longs.data(),
                               nullptr)) != -1;) {
    if (seeds::parse_common(c, optarg, o.common)) continue;
    switch (c) {
      case 's':
        o.p.frame_size = uint32_t(seeds::parse_u64("-s", optarg, 1, 1u << 30));
        break;
      case 'n':
        o.p.count = seeds::parse_u64("-n", optarg, 1, 1u << 30);
        break;
      case kOptRate:
        o.p.rate_fps =
            uint32_t(seeds::parse_u64("--rate", optarg, 0, 1u << 30));
        break;
      case kOptRing:
        o.p.ring = uint32_t(seeds::parse_u64("--ring", optarg, 1, 1024));
        break;
      case 'h':
        usage(0);
      default:
        usage(seeds::kUsage);
    }
  }
  if (optind + 1 < argc) usage(seeds::kUsage);
  if (optind < argc) o.common.host = argv[optind];
  o.p.verify = o.common.verify;
  return o;
}

// Both QPs and the CQ; their ends go to the peer.
void make_qps(Conn& c, uint32_t recv_depth, seeds::QpEnd* self) {
  c.sq_depth = 2 * c.p.ring + 8;  // sender: WRITE + SEND per credit
  c.cq = seeds::make_cq(c.dev, kQps * (c.sq_depth + recv_depth) + 16);
  for (uint32_t q = 0; q < kQps; ++q)
    c.qp[q] = seeds::make_qp(c.dev, IBV_QPT_RC, c.cq, c.sq_depth, recv_depth,
                             self[q]);
}

void connect_qps(Conn& c, const seeds::QpEnd* self, const seeds::QpEnd* peer) {
  for (uint32_t q = 0; q < kQps; ++q)
    seeds::connect_qp(c.dev, c.qp[q], self[q], peer[q]);
}

void setup_receiver(Conn& c, const Options& o) {
  c.ch.accept_one(o.common.tcp_port);
  c.ch.recv_obj(c.p);
  if (c.p.magic != kMagic || c.p.ring == 0 || c.p.ring > 1024 ||
      c.p.frame_size == 0 || c.p.count == 0)
    die(seeds::kUsage, "bad parameters from the sender");
  seeds::QpEnd self[kQps], peer[kQps];
  make_qps(c, c.p.ring, self);
  c.ch.recv_obj(peer);
  c.ring.stride = (c.p.frame_size + 63) & ~63u;
  c.buf = seeds::make_buffer(c.dev, buffer_bytes(c.p, c.ring.stride),
                             IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  c.ring.addr = reinterpret_cast<uintptr_t>(c.buf.p);
  c.ring.rkey = c.buf.mr->rkey;
  connect_qps(c, self, peer);
  c.ch.send_obj(self);
  c.ch.send_obj(c.ring);
  printf("netfr receiver on %s: %u QPs x %u ring buffers of %u B, %" PRIu64
         " frames\n",
         c.dev.name.c_str(), kQps, c.p.ring, c.p.frame_size, c.p.count);
}

void setup_sender(Conn& c, const Options& o) {
  c.ch.connect_to(o.common.host, o.common.tcp_port);
  c.p = o.p;
  c.ch.send_obj(c.p);
  seeds::QpEnd self[kQps], peer[kQps];
  make_qps(c, c.p.ring + 2, self);
  c.ch.send_obj(self);
  c.ch.recv_obj(peer);
  c.ch.recv_obj(c.ring);
  c.buf = seeds::make_buffer(c.dev, buffer_bytes(c.p, c.ring.stride),
                             IBV_ACCESS_LOCAL_WRITE);
  connect_qps(c, self, peer);
  printf("netfr sender on %s: %" PRIu64
         " frames of %u B over %u QPs, %u "
         "credits each, rate %s\n",
         c.dev.name.c_str(), c.p.count, c.p.frame_size, kQps, c.p.ring,
         c.p.rate_fps ? std::to_string(c.p.rate_fps).c_str() : "max");
}

}  // namespace
}  // namespace netfr

int main(int argc, char** argv) {
  seeds::g_prog = "netfr";
  const netfr::Options o = netfr::parse(argc, argv);
  netfr::Conn c;
  c.dev = seeds::open_device(o.common.dev, o.common.gid_index);
  const bool receiver = o.common.host.empty();
  if (receiver)
    netfr::setup_receiver(c, o);
  else
    netfr::setup_sender(c, o);
  fflush(stdout);
  return receiver ? netfr::run_receiver(c, o) : netfr::run_sender(c, o);
}
