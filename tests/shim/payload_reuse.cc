// payload_reuse: an unmodified libibverbs program whose memory changes while
// a device may still be sending from it, as the verbs contract allows:
//   ud, uc   the server sends COUNT messages from one buffer, waits for each
//            send's completion and overwrites the buffer at once (a UD or
//            UC send completes when it has left, before any ACK); the
//            client receives them and checks every byte.
//   read     the server keeps rewriting its memory while the client READs
//            it COUNT times (the bytes may be any mix of old and new, but
//            every response packet must be valid).
// A device that referenced such memory after the completion, or computed
// the ICRC of a READ response over other bytes than it sent, loses
// messages to bad ICRCs (tests/integration/verbs_shim.sh checks the
// receiving service's counter too).
// The two ends exchange QPN, GID, address and rkey over TCP, as perftest
// does (the seed programs' seeds::SideChannel); flow control is a credit byte
// per 64 messages received. Every wait is bounded. Exit status 0 only when
// every message arrived intact (ud, uc) or every READ completed (read).
//   usage: payload_reuse -t ud|uc|read [-n COUNT] -p PORT [HOST]
#include <infiniband/verbs.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "perf/seeds_tcp.h"
#include "tests/support/verbs_bringup.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kWait = std::chrono::seconds(10);
constexpr uint32_t kQkey = 0x11111111;
constexpr uint32_t kRecvs = 256;  // receives posted; the sender's credit
constexpr uint32_t kCreditEvery = 64;
constexpr uint32_t kGrh = 40;          // a UD receive starts with the GRH
constexpr size_t kReadMem = 1u << 20;  // what the READs read, rewritten
constexpr uint32_t kReadLen = 65536;

enum class Mode { kUd, kUc, kRead };

struct Info {  // exchanged over TCP
  uint32_t qpn;
  uint32_t rkey;
  uint64_t addr;
  uint8_t gid[16];
};

[[noreturn]] void die(const char* what) {
  std::perror(what);
  std::exit(2);
}

uint8_t pattern(uint32_t seq, uint32_t i) {
  return static_cast<uint8_t>(seq * 7 + i);
}

// One completion (or none within kWait: 0 returned, wc untouched).
int poll_one(ibv_cq* cq, ibv_wc* wc) {
  const auto end = Clock::now() + kWait;
  while (Clock::now() < end) {
    const int k = ibv_poll_cq(cq, 1, wc);
    if (k != 0) return k;
  }
  return 0;
}

// Posts `w` (one signaled WR of `len` bytes at `p`) and waits for its
// completion; false, said on stderr, if it failed or did not come.
bool post_wait(ibv_qp* qp, ibv_cq* cq, ibv_send_wr w, void* p, uint32_t len,
               uint32_t lkey) {
  ibv_sge s{reinterpret_cast<uintptr_t>(p), len, lkey};
  w.sg_list = &s;
  w.num_sge = 1;
  w.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad;
  if (ibv_post_send(qp, &w, &bad)) die("ibv_post_send");
  ibv_wc wc{};
  if (poll_one(cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS) return true;
  std::fprintf(stderr, "WR %llu: %s\n",
               static_cast<unsigned long long>(w.wr_id),
               wc.status ? ibv_wc_status_str(wc.status) : "no completion");
  return false;
}

void bring_up(Mode m, ibv_qp* qp, const Info& peer) {
  urnic::test::RcPath p;
  p.dest_qpn = peer.qpn;
  std::memcpy(p.dgid.raw, peer.gid, 16);
  p.rd_atomic = 4;
  const char* step = "";
  const int rc = m == Mode::kUd   ? urnic::test::ud_connect(qp, kQkey, 1, &step)
                 : m == Mode::kUc ? urnic::test::uc_connect(qp, p, &step)
                                  : urnic::test::rc_connect(qp, p, &step);
  if (rc) {
    std::fprintf(stderr, "modify_qp to %s: %s\n", step, std::strerror(rc));
    std::exit(2);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Mode mode = Mode::kUd;
  uint32_t count = 5000;
  const char* port = nullptr;
  const char* host = nullptr;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-t" && i + 1 < argc) {
      const std::string t = argv[++i];
      mode = t == "uc" ? Mode::kUc : t == "read" ? Mode::kRead : Mode::kUd;
    } else if (a == "-n" && i + 1 < argc) {
      count = static_cast<uint32_t>(std::atoi(argv[++i]));
    } else if (a == "-p" && i + 1 < argc) {
      port = argv[++i];
    } else {
      host = argv[i];
    }
  }
  if (!port || count == 0) {
    std::fprintf(stderr,
                 "usage: payload_reuse -t ud|uc|read [-n COUNT] -p PORT "
                 "[HOST]\n");
    return 2;
  }
  const bool server = host == nullptr;  // sends (ud, uc); is READ (read)
  const uint32_t len = mode == Mode::kUd ? 1000 : 3000;  // uc: 3 packets
  const uint32_t slot = len + kGrh;

  int ndev = 0;
  ibv_device** devs = ibv_get_device_list(&ndev);
  if (!devs || ndev == 0) die("no RDMA device");
  ibv_context* ctx = ibv_open_device(devs[0]);
  if (!ctx) die("ibv_open_device");
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ibv_cq* cq = ibv_create_cq(ctx, 2 * kRecvs, nullptr, nullptr, 0);
  if (!pd || !cq) die("pd/cq");
  const size_t bytes =
      mode == Mode::kRead ? kReadMem : size_t{slot} * kRecvs + 4096;
  std::vector<uint8_t> mem(bytes, 0);
  ibv_mr* mr =
      ibv_reg_mr(pd, mem.data(), bytes,
                 IBV_ACCESS_LOCAL_WRITE |
                     (mode == Mode::kRead ? IBV_ACCESS_REMOTE_READ : 0));
  if (!mr) die("ibv_reg_mr");
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = mode == Mode::kUd   ? IBV_QPT_UD
               : mode == Mode::kUc ? IBV_QPT_UC
                                   : IBV_QPT_RC;
  ia.cap = {kRecvs, kRecvs, 1, 1, 0};
  ibv_qp* qp = ibv_create_qp(pd, &ia);
  if (!qp) die("ibv_create_qp");

  Info me{}, peer{};
  me.qpn = qp->qp_num;
  me.rkey = mr->rkey;
  me.addr = reinterpret_cast<uintptr_t>(mem.data());
  ibv_gid gid;
  if (ibv_query_gid(ctx, 1, 0, &gid)) die("ibv_query_gid");
  std::memcpy(me.gid, gid.raw, 16);
  seeds::SideChannel ch;  // perftest's TCP exchange, as the seed programs'
  if (server)
    ch.accept_one(static_cast<uint16_t>(std::atoi(port)));
  else
    ch.connect_to(host, static_cast<uint16_t>(std::atoi(port)));
  ch.send_obj(me);
  ch.recv_obj(peer);
  bring_up(mode, qp, peer);
  ibv_wc wc{};

  if (mode == Mode::kRead && server) {
    // Rewrite the memory until the client says it is done.
    uint64_t v = 0;
    char done = 0;
    ch.send_obj(done);         // ready
    while (!ch.readable(0)) {  // the client's byte, or the client gone
      ++v;
      for (size_t i = 0; i + 8 <= bytes; i += 8) std::memcpy(&mem[i], &v, 8);
    }
    std::printf("server: rewrote its memory %llu times\n",
                static_cast<unsigned long long>(v));
    return 0;
  }
  if (mode == Mode::kRead) {
    char ready;
    ch.recv_obj(ready);
    for (uint32_t i = 0; i < count; ++i) {
      ibv_send_wr w{};
      w.wr_id = i;
      w.opcode = IBV_WR_RDMA_READ;
      w.wr.rdma.remote_addr = peer.addr + (i % 8) * kReadLen;
      w.wr.rdma.rkey = peer.rkey;
      if (!post_wait(qp, cq, w, mem.data(), kReadLen, mr->lkey)) return 1;
    }
    const char done = 1;
    ch.send_obj(done);
    std::printf("client: %u READs of %u bytes completed\n", count, kReadLen);
    return 0;
  }

  ibv_ah* ah = nullptr;
  if (mode == Mode::kUd && server) {
    ibv_ah_attr aa{};
    aa.is_global = 1;
    aa.port_num = 1;
    aa.grh.hop_limit = 64;
    std::memcpy(aa.grh.dgid.raw, peer.gid, 16);
    ah = ibv_create_ah(pd, &aa);
    if (!ah) die("ibv_create_ah");
  }
  const uint32_t off = mode == Mode::kUd ? kGrh : 0;  // where data lands
  if (!server) {
    auto post_recv = [&](uint32_t i) {
      ibv_sge s{reinterpret_cast<uintptr_t>(&mem[size_t{i} * slot]), slot,
                mr->lkey};
      ibv_recv_wr w{}, *bad;
      w.wr_id = i;
      w.sg_list = &s;
      w.num_sge = 1;
      if (ibv_post_recv(qp, &w, &bad)) die("ibv_post_recv");
    };
    for (uint32_t i = 0; i < kRecvs; ++i) post_recv(i);
    const char ready = 1;
    ch.send_obj(ready);
    uint32_t got = 0, corrupt = 0, out_of_order = 0;
    int64_t last = -1;
    while (got < count && poll_one(cq, &wc) == 1) {
      if (wc.status != IBV_WC_SUCCESS) {
        std::fprintf(stderr, "receive: %s\n", ibv_wc_status_str(wc.status));
        return 1;
      }
      const uint8_t* p = &mem[size_t{wc.wr_id} * slot + off];
      uint32_t seq;
      std::memcpy(&seq, p, 4);
      bool bad = wc.byte_len != len + off;
      for (uint32_t i = 4; i < len && !bad; ++i) bad = p[i] != pattern(seq, i);
      corrupt += bad;
      out_of_order += static_cast<int64_t>(seq) != last + 1;
      last = seq;
      post_recv(static_cast<uint32_t>(wc.wr_id));
      if (++got % kCreditEvery == 0) ch.send_obj(ready);  // a credit
    }
    std::printf(
        "client: received %u of %u, %u corrupt, %u after a gap (last %lld)\n",
        got, count, corrupt, out_of_order, static_cast<long long>(last));
    return got == count && corrupt == 0 ? 0 : 1;
  }
  char credit;
  ch.recv_obj(credit);  // the receives are posted
  uint64_t allowed = kRecvs;
  uint8_t* p = mem.data();
  for (uint32_t seq = 0; seq < count; ++seq) {
    while (seq >= allowed) {
      ch.recv_obj(credit);
      allowed += kCreditEvery;
    }
    std::memcpy(p, &seq, 4);
    for (uint32_t i = 4; i < len; ++i) p[i] = pattern(seq, i);
    ibv_send_wr w{};
    w.wr_id = seq;
    w.opcode = IBV_WR_SEND;
    if (ah) {
      w.wr.ud.ah = ah;
      w.wr.ud.remote_qpn = peer.qpn;
      w.wr.ud.remote_qkey = kQkey;
    }
    if (!post_wait(qp, cq, w, p, len, mr->lkey)) return 1;
    // Completed: the buffer is the program's again, and it changes now.
    std::memset(p, 0xAA, len);
  }
  std::printf("server: %u messages sent, the buffer rewritten after each\n",
              count);
  ch.wait_close(10'000);  // the client's credits until it has all
  return 0;
}
