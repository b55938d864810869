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

// The CQ for both QPs.
void make_cq(Conn& c, uint32_t recv_depth) {
  c.sq_depth = 2 * c.p.ring + 8;  // sender: WRITE + SEND per credit
  c.cq = seeds::make_cq(c.dev, kQps * (c.sq_depth + recv_depth) + 16);
}

// Both QPs; their ends go to the peer.
void make_qps(Conn& c, uint32_t recv_depth, seeds::QpEnd* self) {
  for (uint32_t q = 0; q < kQps; ++q)
    c.qp[q] = seeds::make_qp(c.dev, IBV_QPT_RC, c.cq, c.sq_depth, recv_depth,
                             self[q]);
}

void connect_qps(Conn& c, const seeds::QpEnd* self, const seeds::QpEnd* peer) {
  for (uint32_t q = 0; q < kQps; ++q)
    seeds::connect_qp(c.dev, c.qp[q], self[q], peer[q]);
}

void check_params(const Params& p) {
  if (p.magic != kMagic || p.ring == 0 || p.ring > 1024 || p.frame_size == 0 ||
      p.count == 0)
    die(seeds::kUsage, "bad parameters from the sender");
}

// Receiver: the ring and the notify buffers, in one MR.
void make_ring(Conn& c) {
  c.ring.stride = (c.p.frame_size + 63) & ~63u;
  c.buf = seeds::make_buffer(c.dev, buffer_bytes(c.p, c.ring.stride),
                             IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  c.ring.addr = reinterpret_cast<uintptr_t>(c.buf.p);
  c.ring.rkey = c.buf.mr->rkey;
}

void setup_receiver(Conn& c, const Options& o) {
  auto tcp = std::make_unique<seeds::SideChannel>();
  tcp->accept_one(o.common.tcp_port);
  c.ch = std::move(tcp);
  c.ch->recv_obj(c.p);
  check_params(c.p);
  seeds::QpEnd self[kQps], peer[kQps];
  make_cq(c, c.p.ring);
  make_qps(c, c.p.ring, self);
  c.ch->recv_obj(peer);
  make_ring(c);
  connect_qps(c, self, peer);
  c.ch->send_obj(self);
  c.ch->send_obj(c.ring);
}

void setup_sender(Conn& c, const Options& o) {
  auto tcp = std::make_unique<seeds::SideChannel>();
  tcp->connect_to(o.common.host, o.common.tcp_port);
  c.ch = std::move(tcp);
  c.p = o.p;
  c.ch->send_obj(c.p);
  seeds::QpEnd self[kQps], peer[kQps];
  make_cq(c, c.p.ring + 2);
  make_qps(c, c.p.ring + 2, self);
  c.ch->send_obj(self);
  c.ch->recv_obj(peer);
  c.ch->recv_obj(c.ring);
  c.buf = seeds::make_buffer(c.dev, buffer_bytes(c.p, c.ring.stride),
                             IBV_ACCESS_LOCAL_WRITE);
  connect_qps(c, self, peer);
}

// --cm: the control connection's REQ carries the parameters, its REP the
// ring; then QP q is connection q + 1, its REQ naming q.
static_assert(sizeof(Params) <= seeds::kCmReqData);
static_assert(sizeof(Ring) <= seeds::kCmRepData);

void cm_receiver(Conn& c, const Options& o) {
  c.cm = std::make_unique<seeds::Cm>(o.common);
  c.cm->listen();
  rdma_cm_id* ctl = c.cm->request(&c.p, sizeof c.p, true);
  c.dev = seeds::Cm::device(ctl, o.common.gid_index);
  c.ch = std::make_unique<seeds::CmChannel>(*c.cm, c.dev, ctl);
  check_params(c.p);
  make_cq(c, c.p.ring);
  make_ring(c);
  c.cm->accept(ctl, &c.ring, sizeof c.ring);
  for (uint32_t q = 0; q < kQps; ++q) {
    seeds::CmDataReq r;
    rdma_cm_id* id = c.cm->request(&r, sizeof r);
    if (r.magic != kMagic || r.index != q)
      die(seeds::kSetup, "connection %u: not netfr's QP %u", q + 1, q);
    c.qp[q] = c.cm->create_qp(id, c.dev, c.cq, c.cq, c.sq_depth, c.p.ring);
    c.cm->accept(id, nullptr, 0);
  }
  c.cm->finish_accept();
}

void cm_sender(Conn& c, const Options& o) {
  c.cm = std::make_unique<seeds::Cm>(o.common);
  c.p = o.p;
  rdma_cm_id* ctl = c.cm->resolve();
  c.dev = seeds::Cm::device(ctl, o.common.gid_index);
  c.ch = seeds::CmChannel::connect(*c.cm, c.dev, ctl, &c.p, sizeof c.p, &c.ring,
                                   sizeof c.ring);
  make_cq(c, c.p.ring + 2);
  for (uint32_t q = 0; q < kQps; ++q) {
    rdma_cm_id* id = c.cm->resolve();
    c.qp[q] = c.cm->create_qp(id, c.dev, c.cq, c.cq, c.sq_depth, c.p.ring + 2);
    const seeds::CmDataReq r{kMagic, q};
    c.cm->connect(id, &r, sizeof r, nullptr, 0);
  }
  c.buf = seeds::make_buffer(c.dev, buffer_bytes(c.p, c.ring.stride),
                             IBV_ACCESS_LOCAL_WRITE);
}

}  // namespace
}  // namespace netfr

int main(int argc, char** argv) {
  seeds::g_prog = "netfr";
  const netfr::Options o = netfr::parse(argc, argv);
  netfr::Conn c;
  const bool receiver = o.common.host.empty();
  if (!o.common.cm)
    c.dev = seeds::open_device(o.common.dev, o.common.gid_index);
  const char* how = o.common.cm ? ", RDMA CM" : "";
  if (receiver) {
    (o.common.cm ? netfr::cm_receiver : netfr::setup_receiver)(c, o);
    printf("netfr receiver on %s: %u QPs x %u ring buffers of %u B, %" PRIu64
           " frames%s\n",
           c.dev.name.c_str(), netfr::kQps, c.p.ring, c.p.frame_size, c.p.count,
           how);
  } else {
    (o.common.cm ? netfr::cm_sender : netfr::setup_sender)(c, o);
    printf("netfr sender on %s: %" PRIu64
           " frames of %u B over %u QPs, %u credits each, rate %s%s\n",
           c.dev.name.c_str(), c.p.count, c.p.frame_size, netfr::kQps, c.p.ring,
           c.p.rate_fps ? std::to_string(c.p.rate_fps).c_str() : "max", how);
  }
  fflush(stdout);
  return receiver ? netfr::run_receiver(c, o) : netfr::run_sender(c, o);
}
