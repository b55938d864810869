// mcast_check: UD multicast with plain verbs (no RDMA CM), every message
// checked. An unmodified libibverbs program: it does not link the shim;
// tests/integration/verbs_shim.sh runs it under LD_PRELOAD.
//
//   mcast_check recv GROUP COUNT [QPS]
//     QPS UD QPs (default 1) join GROUP (an IPv4 multicast address) with
//     COUNT receives posted each, print "ready", and wait (20 s at most)
//     until each has COUNT messages: every one exactly once, in order, the
//     bytes the sender wrote, the GRH area naming GROUP as destination.
//   mcast_check send GROUP COUNT SIZE
//     COUNT messages of SIZE bytes (12 to 4096, within the path MTU) to GROUP,
//     DQPN 0xFFFFFF, each waited for (its completion) before the next.
// Exit status: 0 all checked; 1 set-up failure; 2 usage; 5 a message was
// missing, repeated, out of order or wrong.
#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr uint32_t kQkey = 0x11111111;
constexpr uint32_t kMagic = 0x6d636b31;  // "mck1"
constexpr uint32_t kGrh = 40;
constexpr int kTimeoutS = 20;

[[noreturn]] void die(const char* what) {
  fprintf(stderr, "mcast_check: %s: %s\n", what, strerror(errno));
  exit(1);
}

uint8_t pattern(uint32_t seq, uint32_t i) {
  return static_cast<uint8_t>(seq * 7 + i * 13 + 1);
}

struct Dev {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  int gid_index = -1;
  ibv_gid group{};
};

Dev open_dev(const char* group_ip) {
  Dev d;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list || n == 0) die("no RDMA device");
  d.ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (!d.ctx) die("ibv_open_device");
  d.pd = ibv_alloc_pd(d.ctx);
  if (!d.pd) die("ibv_alloc_pd");
  in_addr a{};
  if (inet_pton(AF_INET, group_ip, &a) != 1) {
    fprintf(stderr, "mcast_check: %s is not an IPv4 address\n", group_ip);
    exit(2);
  }
  d.group.raw[10] = d.group.raw[11] = 0xff;  // IPv4-mapped (RoCEv2)
  std::memcpy(d.group.raw + 12, &a, 4);
  // The port's IPv4 GID: the source of what we send.
  for (int i = 0; i < 16; ++i) {
    ibv_gid g;
    if (ibv_query_gid(d.ctx, 1, i, &g)) break;
    if (g.raw[10] == 0xff && g.raw[11] == 0xff) {
      d.gid_index = i;
      break;
    }
  }
  if (d.gid_index < 0) die("no IPv4 GID on port 1");
  return d;
}

ibv_qp* ud_qp(Dev& d, ibv_cq* cq, uint32_t recv_wr) {
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_UD;
  ia.cap.max_send_wr = 16;
  ia.cap.max_recv_wr = recv_wr;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  ibv_qp* qp = ibv_create_qp(d.pd, &ia);
  if (!qp) die("ibv_create_qp");
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qkey = kQkey;
  if (ibv_modify_qp(
          qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
    die("INIT");
  a.qp_state = IBV_QPS_RTR;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE)) die("RTR");
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 0;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN)) die("RTS");
  return qp;
}

int receive(Dev& d, uint32_t count, uint32_t nqp) {
  const uint32_t slot = 4096 + kGrh;
  std::vector<uint8_t> buf(size_t{slot} * count * nqp);
  ibv_mr* mr = ibv_reg_mr(d.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  if (!mr) die("ibv_reg_mr");
  ibv_cq* cq =
      ibv_create_cq(d.ctx, static_cast<int>(count * nqp), nullptr, nullptr, 0);
  if (!cq) die("ibv_create_cq");
  std::vector<ibv_qp*> qps;
  for (uint32_t q = 0; q < nqp; ++q) {
    ibv_qp* qp = ud_qp(d, cq, count);
    for (uint32_t i = 0; i < count; ++i) {
      const uint64_t idx = uint64_t{q} * count + i;
      ibv_sge s{reinterpret_cast<uintptr_t>(&buf[idx * slot]), slot, mr->lkey};
      ibv_recv_wr w{}, *bad;
      w.wr_id = idx;
      w.sg_list = &s;
      w.num_sge = 1;
      if (ibv_post_recv(qp, &w, &bad)) die("ibv_post_recv");
    }
    if (int rc = ibv_attach_mcast(qp, &d.group, 0)) {
      errno = rc;
      die("ibv_attach_mcast");
    }
    qps.push_back(qp);
  }
  printf("ready\n");
  fflush(stdout);
  std::vector<uint32_t> next(nqp, 0);
  uint32_t got = 0, bad_msgs = 0;
  const auto end =
      std::chrono::steady_clock::now() + std::chrono::seconds(kTimeoutS);
  while (got + bad_msgs < count * nqp &&
         std::chrono::steady_clock::now() < end) {
    ibv_wc wc[16];
    const int n = ibv_poll_cq(cq, 16, wc);
    if (n < 0) die("ibv_poll_cq");
    for (int k = 0; k < n; ++k) {
      const uint32_t q = static_cast<uint32_t>(wc[k].wr_id / count);
      const uint8_t* m = &buf[wc[k].wr_id * slot];
      std::string why;
      uint32_t hdr[3] = {};
      if (wc[k].status != IBV_WC_SUCCESS) {
        why = std::string("status ") + ibv_wc_status_str(wc[k].status);
      } else if (wc[k].qp_num != qps[q]->qp_num) {
        why = "completion for another QP";
      } else if (!(wc[k].wc_flags & IBV_WC_GRH) || wc[k].byte_len < kGrh + 12) {
        why = "no GRH or too short";
      } else if (std::memcmp(m + 20 + 16, d.group.raw + 12, 4) != 0) {
        why = "GRH destination is not the group";
      } else {
        std::memcpy(hdr, m + kGrh, sizeof hdr);
        if (hdr[0] != kMagic || hdr[2] != wc[k].byte_len - kGrh)
          why = "bad header";
        else if (hdr[1] != next[q])
          why = "sequence " + std::to_string(hdr[1]) + ", expected " +
                std::to_string(next[q]);
        for (uint32_t i = 12; why.empty() && i < hdr[2]; ++i)
          if (m[kGrh + i] != pattern(hdr[1], i))
            why = "byte " + std::to_string(i) + " differs";
      }
      if (!why.empty()) {
        fprintf(stderr, "mcast_check: QP %u message %u: %s\n", q, next[q],
                why.c_str());
        ++bad_msgs;
      } else {
        ++got;
      }
      ++next[q];
    }
  }
  printf("received %u of %u on %u QPs, %u wrong\n", got, count * nqp, nqp,
         bad_msgs);
  for (ibv_qp* qp : qps) {
    if (int rc = ibv_detach_mcast(qp, &d.group, 0)) {
      errno = rc;
      die("ibv_detach_mcast");
    }
    if (ibv_destroy_qp(qp)) die("ibv_destroy_qp");
  }
  if (ibv_destroy_cq(cq)) die("ibv_destroy_cq");
  if (ibv_dereg_mr(mr)) die("ibv_dereg_mr");
  return got == count * nqp && bad_msgs == 0 ? 0 : 5;
}

int send(Dev& d, uint32_t count, uint32_t size) {
  std::vector<uint8_t> buf(size);
  ibv_mr* mr = ibv_reg_mr(d.pd, buf.data(), buf.size(), 0);
  if (!mr) die("ibv_reg_mr");
  ibv_cq* cq = ibv_create_cq(d.ctx, 16, nullptr, nullptr, 0);
  if (!cq) die("ibv_create_cq");
  ibv_qp* qp = ud_qp(d, cq, 1);
  ibv_ah_attr aa{};
  aa.is_global = 1;
  aa.grh.dgid = d.group;
  aa.grh.sgid_index = static_cast<uint8_t>(d.gid_index);
  aa.grh.hop_limit = 64;
  aa.port_num = 1;
  ibv_ah* ah = ibv_create_ah(d.pd, &aa);
  if (!ah) die("ibv_create_ah (group)");
  for (uint32_t seq = 0; seq < count; ++seq) {
    const uint32_t hdr[3] = {kMagic, seq, size};
    std::memcpy(buf.data(), hdr, sizeof hdr);
    for (uint32_t i = 12; i < size; ++i) buf[i] = pattern(seq, i);
    ibv_sge s{reinterpret_cast<uintptr_t>(buf.data()), size, mr->lkey};
    ibv_send_wr w{}, *bad;
    w.wr_id = seq;
    w.sg_list = &s;
    w.num_sge = 1;
    w.opcode = IBV_WR_SEND;
    w.send_flags = IBV_SEND_SIGNALED;
    w.wr.ud.ah = ah;
    w.wr.ud.remote_qpn = 0xffffff;
    w.wr.ud.remote_qkey = kQkey;
    if (ibv_post_send(qp, &w, &bad)) die("ibv_post_send");
    ibv_wc wc;
    int n;
    while ((n = ibv_poll_cq(cq, 1, &wc)) == 0) {
    }
    if (n < 0 || wc.status != IBV_WC_SUCCESS) {
      fprintf(stderr, "mcast_check: send %u: %s\n", seq,
              n < 0 ? "poll failed" : ibv_wc_status_str(wc.status));
      exit(1);  // its objects go with the process, as any dying client's
    }
  }
  printf("sent %u messages of %u bytes\n", count, size);
  if (ibv_destroy_ah(ah)) die("ibv_destroy_ah");
  if (ibv_destroy_qp(qp)) die("ibv_destroy_qp");
  if (ibv_destroy_cq(cq)) die("ibv_destroy_cq");
  if (ibv_dereg_mr(mr)) die("ibv_dereg_mr");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr,
            "usage: mcast_check recv GROUP COUNT [QPS] | send GROUP COUNT "
            "SIZE\n");
    return 2;
  }
  const std::string mode = argv[1];
  const uint32_t count = static_cast<uint32_t>(strtoul(argv[3], nullptr, 0));
  Dev d = open_dev(argv[2]);
  int rc = 2;
  if (mode == "recv") {
    const uint32_t nqp =
        argc > 4 ? static_cast<uint32_t>(strtoul(argv[4], nullptr, 0)) : 1;
    if (count && nqp) rc = receive(d, count, nqp);
  } else if (mode == "send" && argc > 4) {
    const uint32_t size = static_cast<uint32_t>(strtoul(argv[4], nullptr, 0));
    if (size >= 12 && size <= 4096) rc = send(d, count, size);
  }
  // Everything it made goes back: a leak checker has nothing to report.
  if (ibv_dealloc_pd(d.pd)) die("ibv_dealloc_pd");
  if (ibv_close_device(d.ctx)) die("ibv_close_device");
  return rc;
}
