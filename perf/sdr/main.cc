// sdr: SDR-RDMA's chunked transfer (seed 001) on plain libibverbs. The
// server (no host argument) is the receiver holding the message table;
// the client is the sender and brings the test parameters. Connection
// set-up here; the roles are sender.cc and receiver.cc.
#include <cinttypes>

#include "perf/sdr/imm.h"
#include "perf/sdr/sdr.h"

namespace sdr {
namespace {

using seeds::die;

constexpr uint16_t kDefaultPort = 18515;
constexpr uint32_t kSendDepth = 512;
constexpr uint32_t kRecvDepth = 4096;

enum : int {
  kOptSlots = seeds::kOptFirstOwn,
  kOptChunk,
  kOptUc,
  kOptDropPpm,
  kOptSeed,
  kOptNackUs,
};

[[noreturn]] void usage(int code) {
  printf(
      "usage: sdr [options]          receiver (server)\n"
      "       sdr [options] HOST     sender (client; its options rule)\n"
      "%s"
      "  -s BYTES        message size (default 65536)\n"
      "  -n COUNT        messages (default 1000)\n"
      "  --slots N       message slots in the receiver's table, 1..%u "
      "(default 16)\n"
      "  --chunk BYTES   chunk size (default: the path MTU, one packet)\n"
      "  --uc            UC instead of RC (no transport retries)\n"
      "  --drop-ppm N    sender: skip N of every million chunk posts\n"
      "  --seed S        seed of those decisions (default 1)\n"
      "  --nack-us US    report missing chunks US after the \"sent\" notice\n"
      "                  when the end-of-round marker was lost (default "
      "10000)\n",
      seeds::kCommonHelp, kMaxSlots);
  exit(code);
}

Options parse(int argc, char** argv) {
  Options o;
  o.common.tcp_port = kDefaultPort;
  std::vector<option> longs(std::begin(seeds::kCommonLong),
                            std::end(seeds::kCommonLong));
  longs.push_back({"slots", required_argument, nullptr, kOptSlots});
  longs.push_back({"chunk", required_argument, nullptr, kOptChunk});
  longs.push_back({"uc", no_argument, nullptr, kOptUc});
  longs.push_back({"drop-ppm", required_argument, nullptr, kOptDropPpm});
  longs.push_back({"seed", required_argument, nullptr, kOptSeed});
  longs.push_back({"nack-us", required_argument, nullptr, kOptNackUs});
  longs.push_back({"help", no_argument, nullptr, 'h'});
  longs.push_back({nullptr, 0, nullptr, 0});
  const std::string shorts = std::string(seeds::kCommonShort) + "s:n:";
  for (int c; (c = getopt_long(argc, argv, shorts.c_str(), longs.data(),
                               nullptr)) != -1;) {
    if (seeds::parse_common(c, optarg, o.common)) continue;
    switch (c) {
      case 's':
        o.p.msg_size =
            uint32_t(seeds::parse_u64("-s", optarg, kHeaderBytes, 1u << 30));
        break;
      case 'n':
        o.p.count = seeds::parse_u64("-n", optarg, 1, 1u << 30);
        break;
      case kOptSlots:
        o.p.slots = uint32_t(seeds::parse_u64("--slots", optarg, 1, kMaxSlots));
        break;
      case kOptChunk:
        o.p.chunk = uint32_t(seeds::parse_u64("--chunk", optarg, 64, 1u << 30));
        break;
      case kOptUc:
        o.p.uc = 1;
        break;
      case kOptDropPpm:
        o.drop_ppm =
            uint32_t(seeds::parse_u64("--drop-ppm", optarg, 0, 999'999));
        break;
      case kOptSeed:
        o.seed = seeds::parse_u64("--seed", optarg, 0, ~0ull);
        break;
      case kOptNackUs:
        o.p.nack_us =
            uint32_t(seeds::parse_u64("--nack-us", optarg, 1, 10'000'000));
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

// Receives consumed by WRITE_WITH_IMM carry no data: no scatter list.
void post_receives(Conn& c) {
  ibv_recv_wr wr{};
  for (uint32_t i = 0; i < c.rq_depth; ++i) {
    ibv_recv_wr* bad = nullptr;
    if (const int rc = ibv_post_recv(c.qp, &wr, &bad))
      die(seeds::kSetup, "ibv_post_recv: %s", strerror(rc));
  }
}

void set_chunks(Conn& c) {
  c.nchunks = (c.p.msg_size + c.table.chunk - 1) / c.table.chunk;
  if (c.table.chunk < kHeaderBytes || c.nchunks > kMaxChunks)
    die(seeds::kUsage, "%u B messages in %u B chunks: at most %u chunks",
        c.p.msg_size, c.table.chunk, kMaxChunks);
}

void check_params(const Params& p) {
  if (p.magic != kMagic || p.slots == 0 || p.slots > kMaxSlots ||
      p.msg_size < kHeaderBytes || p.count == 0)
    die(seeds::kUsage, "bad parameters from the sender");
}

// Receiver: the CQ and the table in its root MR; chunks of the path MTU
// (the smaller port MTU) unless --chunk.
void make_table(Conn& c, uint32_t peer_mtu) {
  c.rq_depth = std::min<uint32_t>(kRecvDepth, uint32_t(c.dev.attr.max_qp_wr));
  c.cq = seeds::make_cq(c.dev, c.rq_depth + 16);
  c.table.chunk = c.p.chunk ? c.p.chunk
                            : seeds::mtu_bytes(std::min<uint32_t>(
                                  c.dev.port.active_mtu, peer_mtu));
  set_chunks(c);
  c.table.stride = (c.p.msg_size + 4095) & ~4095u;
  const size_t len = size_t{c.p.slots} * c.table.stride;
  c.buf = seeds::make_buffer(c.dev, len,
                             IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  c.table.addr = reinterpret_cast<uintptr_t>(c.buf.p);
  c.table.rkey = c.buf.mr->rkey;
}

ibv_qp* make_qp(Conn& c, uint32_t send_wr, uint32_t recv_wr,
                seeds::QpEnd& self) {
  return seeds::make_qp(c.dev, c.p.uc ? IBV_QPT_UC : IBV_QPT_RC, c.cq, send_wr,
                        recv_wr, self);
}

// Receiver: parameters from the client; the table; QP to RTR/RTS with
// every receive posted before the sender learns the table.
void setup_receiver(Conn& c, const Options& o) {
  auto tcp = std::make_unique<seeds::SideChannel>();
  tcp->accept_one(o.common.tcp_port);
  c.ch = std::move(tcp);
  c.ch->recv_obj(c.p);
  check_params(c.p);
  seeds::QpEnd self, peer;
  c.ch->recv_obj(peer);
  make_table(c, peer.mtu);
  c.qp = make_qp(c, 1, c.rq_depth, self);
  post_receives(c);
  seeds::connect_qp(c.dev, c.qp, self, peer);
  c.ch->send_obj(self);
  c.ch->send_obj(c.table);
}

void setup_sender(Conn& c, const Options& o) {
  auto tcp = std::make_unique<seeds::SideChannel>();
  tcp->connect_to(o.common.host, o.common.tcp_port);
  c.ch = std::move(tcp);
  c.p = o.p;
  c.ch->send_obj(c.p);
  c.sq_depth = std::min<uint32_t>(kSendDepth, uint32_t(c.dev.attr.max_qp_wr));
  c.cq = seeds::make_cq(c.dev, c.sq_depth + 16);
  seeds::QpEnd self, peer;
  c.qp = make_qp(c, c.sq_depth, 1, self);
  c.ch->send_obj(self);
  c.ch->recv_obj(peer);
  c.ch->recv_obj(c.table);
  set_chunks(c);
  c.buf = seeds::make_buffer(c.dev, size_t{c.p.slots} * c.table.stride,
                             IBV_ACCESS_LOCAL_WRITE);
  seeds::connect_qp(c.dev, c.qp, self, peer);
}

// --cm: the control connection's REQ carries the parameters and the
// sender's port MTU, its REP the table. Over RC the data QP is a second
// connection; urnic's RDMA CM connects RC (and UD) QPs only, so a UC QP
// is connected by hand with the QP ends sent over the control channel,
// as over TCP.
struct Hello {
  Params p;
  uint32_t mtu = 0;  // the sender's ibv_mtu
  uint32_t pad = 0;
};
static_assert(sizeof(Hello) <= seeds::kCmReqData);
static_assert(sizeof(Table) <= seeds::kCmRepData);

void cm_receiver(Conn& c, const Options& o) {
  c.cm = std::make_unique<seeds::Cm>(o.common);
  c.cm->listen();
  Hello h;
  rdma_cm_id* ctl = c.cm->request(&h, sizeof h, true);
  c.dev = seeds::Cm::device(ctl, o.common.gid_index);
  c.ch = std::make_unique<seeds::CmChannel>(*c.cm, c.dev, ctl);
  c.p = h.p;
  check_params(c.p);
  make_table(c, h.mtu);
  if (c.p.uc) {
    seeds::QpEnd self, peer;
    c.qp = make_qp(c, 1, c.rq_depth, self);
    post_receives(c);
    c.cm->accept(ctl, &c.table, sizeof c.table);
    c.ch->recv_obj(peer);
    seeds::connect_qp(c.dev, c.qp, self, peer);
    c.ch->send_obj(self);
  } else {
    c.cm->accept(ctl, &c.table, sizeof c.table);
    seeds::CmDataReq r;
    rdma_cm_id* id = c.cm->request(&r, sizeof r);
    if (r.magic != kMagic) die(seeds::kSetup, "a connection not from sdr");
    c.qp = c.cm->create_qp(id, c.dev, c.cq, c.cq, 1, c.rq_depth);
    post_receives(c);
    c.cm->accept(id, nullptr, 0);
  }
  c.cm->finish_accept();
}

void cm_sender(Conn& c, const Options& o) {
  c.cm = std::make_unique<seeds::Cm>(o.common);
  c.p = o.p;
  rdma_cm_id* ctl = c.cm->resolve();
  c.dev = seeds::Cm::device(ctl, o.common.gid_index);
  const Hello h{c.p, c.dev.port.active_mtu, 0};
  c.ch = seeds::CmChannel::connect(*c.cm, c.dev, ctl, &h, sizeof h, &c.table,
                                   sizeof c.table);
  set_chunks(c);
  c.sq_depth = std::min<uint32_t>(kSendDepth, uint32_t(c.dev.attr.max_qp_wr));
  c.cq = seeds::make_cq(c.dev, c.sq_depth + 16);
  if (c.p.uc) {
    seeds::QpEnd self, peer;
    c.qp = make_qp(c, c.sq_depth, 1, self);
    c.ch->send_obj(self);
    c.ch->recv_obj(peer);
    seeds::connect_qp(c.dev, c.qp, self, peer);
  } else {
    rdma_cm_id* id = c.cm->resolve();
    c.qp = c.cm->create_qp(id, c.dev, c.cq, c.cq, c.sq_depth, 1);
    const seeds::CmDataReq r{kMagic, 0};
    c.cm->connect(id, &r, sizeof r, nullptr, 0);
  }
  c.buf = seeds::make_buffer(c.dev, size_t{c.p.slots} * c.table.stride,
                             IBV_ACCESS_LOCAL_WRITE);
}

}  // namespace
}  // namespace sdr

int main(int argc, char** argv) {
  seeds::g_prog = "sdr";
  const sdr::Options o = sdr::parse(argc, argv);
  sdr::Conn c;
  const bool receiver = o.common.host.empty();
  if (!o.common.cm)
    c.dev = seeds::open_device(o.common.dev, o.common.gid_index);
  if (receiver) {
    (o.common.cm ? sdr::cm_receiver : sdr::setup_receiver)(c, o);
    printf(
        "sdr receiver on %s: %s, %u slots of %u B in one MR, %u B chunks, "
        "%u receives posted%s\n",
        c.dev.name.c_str(), sdr::mode(c.p), c.p.slots, c.p.msg_size,
        c.table.chunk, c.rq_depth, o.common.cm ? ", RDMA CM" : "");
  } else {
    (o.common.cm ? sdr::cm_sender : sdr::setup_sender)(c, o);
    printf("sdr sender on %s: %s, %" PRIu64
           " messages of %u B, %u B chunks, %u slots, drop %u ppm%s\n",
           c.dev.name.c_str(), sdr::mode(c.p), c.p.count, c.p.msg_size,
           c.table.chunk, c.p.slots, o.drop_ppm,
           o.common.cm ? ", RDMA CM" : "");
  }
  fflush(stdout);
  return receiver ? sdr::run_receiver(c, o) : sdr::run_sender(c, o);
}
