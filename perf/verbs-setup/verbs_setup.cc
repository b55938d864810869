// verbs-setup: what the control path costs an application, verb by verb.
// Creates N RC QPs on one context, moves each through INIT, RTR (to
// itself: its own GID and QPN, so no peer is needed) and RTS, then
// destroys them all; registers and deregisters an MR, registers fresh
// memory, and creates and destroys a CQ N / 16 times. Prints the mean and p50 /
// p99 latency of each verb in microseconds, and the total per QP. Any
// libibverbs device works; through urnic's shim every one of these verbs is a
// request to urnicd's control thread, and most park the worker lcore that owns
// the object (perf/README.md, "control path"; run by perf/control-path).
//
// usage: verbs-setup [-n QPS] [-d DEVICE] [--json]
#include <infiniband/verbs.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/support/verbs_bringup.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Series {
  const char* name;
  std::vector<double> us;
  double mean() const {
    double s = 0;
    for (double v : us) s += v;
    return us.empty() ? 0 : s / static_cast<double>(us.size());
  }
  double pct(double p) {
    if (us.empty()) return 0;
    std::vector<double> v = us;
    const auto k = static_cast<size_t>(p * static_cast<double>(v.size() - 1));
    std::nth_element(v.begin(), v.begin() + static_cast<long>(k), v.end());
    return v[k];
  }
};

// Runs `f` (returning 0 on success), appends its latency; exits on error.
template <typename F>
void timed(Series& s, F f) {
  const auto t0 = Clock::now();
  const int rc = f();
  const auto t1 = Clock::now();
  if (rc) {
    fprintf(stderr, "verbs-setup: %s failed: %s\n", s.name, strerror(rc));
    exit(1);
  }
  s.us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
}

[[noreturn]] void usage() {
  fprintf(stderr, "usage: verbs-setup [-n QPS] [-d DEVICE] [--json]\n");
  exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  int n = 1000;
  const char* want = nullptr;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-n" && i + 1 < argc) {
      n = atoi(argv[++i]);
    } else if (a == "-d" && i + 1 < argc) {
      want = argv[++i];
    } else if (a == "--json") {
      json = true;
    } else {
      usage();
    }
  }
  if (n < 1) usage();
  int ndev = 0;
  ibv_device** list = ibv_get_device_list(&ndev);
  ibv_device* dev = nullptr;
  for (int i = 0; list && i < ndev; ++i)
    if (!want || strcmp(ibv_get_device_name(list[i]), want) == 0)
      dev = dev ? dev : list[i];
  if (!dev) {
    fprintf(stderr, "verbs-setup: no device %s\n", want ? want : "at all");
    return 1;
  }
  ibv_context* ctx = ibv_open_device(dev);
  ibv_pd* pd = ctx ? ibv_alloc_pd(ctx) : nullptr;
  ibv_cq* cq = pd ? ibv_create_cq(ctx, 256, nullptr, nullptr, 0) : nullptr;
  ibv_gid gid{};
  if (!cq || ibv_query_gid(ctx, 1, 0, &gid)) {
    fprintf(stderr, "verbs-setup: opening %s: %s\n", ibv_get_device_name(dev),
            strerror(errno));
    return 1;
  }
  Series create{"ibv_create_qp", {}}, init{"modify INIT", {}},
      rtr{"modify RTR", {}}, rts{"modify RTS", {}},
      destroy{"ibv_destroy_qp", {}}, reg{"ibv_reg_mr", {}},
      dereg{"ibv_dereg_mr", {}}, fresh{"ibv_reg_mr new", {}},
      mkcq{"ibv_create_cq", {}}, rmcq{"ibv_destroy_cq", {}};
  std::vector<ibv_qp*> qps(static_cast<size_t>(n));
  const auto t_start = Clock::now();
  for (ibv_qp*& qp : qps) {
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = 16;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    timed(create, [&] {
      qp = ibv_create_qp(pd, &ia);
      return qp ? 0 : errno;
    });
    // The three transitions every verbs program writes (RcPath's defaults
    // are perftest's), to itself: its own GID and QPN.
    urnic::test::RcPath path;
    path.dest_qpn = qp->qp_num;
    path.dgid = gid;
    timed(init, [&] { return urnic::test::rc_to_init(qp, path); });
    timed(rtr, [&] { return urnic::test::rc_to_rtr(qp, path); });
    timed(rts, [&] { return urnic::test::rc_to_rts(qp, path); });
  }
  for (ibv_qp* qp : qps) timed(destroy, [&] { return ibv_destroy_qp(qp); });
  std::vector<char> mem(1 << 16);
  // An int: ibv_reg_mr (a macro) ANDs the flags with an ib_uverbs enum,
  // which clang refuses for an ibv_access_flags operand
  // (-Wdeprecated-enum-enum-conversion).
  const int access = IBV_ACCESS_LOCAL_WRITE;
  for (int i = 0; i < std::max(1, n / 16); ++i) {
    ibv_mr* mr = nullptr;
    timed(reg, [&] {
      mr = ibv_reg_mr(pd, mem.data(), mem.size(), access);
      return mr ? 0 : errno;
    });
    timed(dereg, [&] { return ibv_dereg_mr(mr); });
    // Memory never registered before (an rcache miss in UCX): the shim
    // first makes its pages shared, contents kept.
    void* m = mmap(nullptr, mem.size(), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
      perror("verbs-setup: mmap");
      return 1;
    }
    std::memset(m, i, mem.size());
    timed(fresh, [&] {
      mr = ibv_reg_mr(pd, m, mem.size(), access);
      return mr ? 0 : errno;
    });
    ibv_dereg_mr(mr);
    munmap(m, mem.size());
    ibv_cq* c = nullptr;
    timed(mkcq, [&] {
      c = ibv_create_cq(ctx, 64, nullptr, nullptr, 0);
      return c ? 0 : errno;
    });
    timed(rmcq, [&] { return ibv_destroy_cq(c); });
  }
  const double wall_s =
      std::chrono::duration<double>(Clock::now() - t_start).count();
  Series* all[] = {&create, &init,  &rtr,   &rts,  &destroy,
                   &reg,    &dereg, &fresh, &mkcq, &rmcq};
  const double per_qp =
      create.mean() + init.mean() + rtr.mean() + rts.mean() + destroy.mean();
  if (json) {
    printf("{\"qps\": %d, \"wall_s\": %.3f, \"per_qp_us\": %.1f", n, wall_s,
           per_qp);
    for (Series* s : all)
      printf(
          ", \"%s\": {\"mean_us\": %.1f, \"p50_us\": %.1f, \"p99_us\": %.1f}",
          s->name, s->mean(), s->pct(0.5), s->pct(0.99));
    printf("}\n");
  } else {
    printf(
        "%d QPs on %s in %.2f s: %.1f us per QP (create, 3 modifies, "
        "destroy)\n",
        n, ibv_get_device_name(dev), wall_s, per_qp);
    printf("  %-16s %9s %9s %9s\n", "verb", "mean us", "p50 us", "p99 us");
    for (Series* s : all)
      printf("  %-16s %9.1f %9.1f %9.1f\n", s->name, s->mean(), s->pct(0.5),
             s->pct(0.99));
  }
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  ibv_free_device_list(list);
  return 0;
}
