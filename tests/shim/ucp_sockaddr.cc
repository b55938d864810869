// UCX's client/server connection, as UCX-Py, Dask or Spark-UCX make it: a
// ucp_listener on a socket address, a client endpoint created with the
// server's address (UCP_EP_PARAMS_FLAGS_CLIENT_SERVER), the connection set up
// by a connection manager (UCX_SOCKADDR_TLS_PRIORITY=rdmacm: the RDMA CM,
// which the verbs shim hands to urnicd). The client sends ITERS tagged
// messages of SIZE bytes, the server checks every byte and answers each with
// its own pattern, which the client checks. Exit 0 only when all arrived
// intact.
//   server: ucp_sockaddr [-p PORT] [-s SIZE] [-n ITERS] -l LISTEN_IP
//   client: ucp_sockaddr [-p PORT] [-s SIZE] [-n ITERS] SERVER_IP
#include <arpa/inet.h>
#include <netinet/in.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>

static ucp_conn_request_h g_conn = nullptr;  // the server's one request

static void die(const char* what, ucs_status_t st) {
  fprintf(stderr, "ucp_sockaddr: %s: %s\n", what, ucs_status_string(st));
  exit(1);
}

static ucp_listener_h g_lis = nullptr;

static void on_conn(ucp_conn_request_h req, void*) {
  if (g_conn) {  // one client only
    ucp_listener_reject(g_lis, req);
    return;
  }
  g_conn = req;
}

static void on_ep_error(void*, ucp_ep_h, ucs_status_t st) {
  fprintf(stderr, "ucp_sockaddr: endpoint error: %s\n", ucs_status_string(st));
}

static double now_s() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// Waits for a request (null: done at once) within 30 s.
static void wait_req(ucp_worker_h w, void* req, const char* what) {
  if (req == nullptr) return;
  if (UCS_PTR_IS_ERR(req)) die(what, UCS_PTR_STATUS(req));
  const double until = now_s() + 30;
  ucs_status_t st;
  while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS) {
    ucp_worker_progress(w);
    if (now_s() > until) die(what, UCS_ERR_TIMED_OUT);
  }
  ucp_request_free(req);
  if (st != UCS_OK) die(what, st);
}

static uint8_t pattern(uint32_t seed, size_t i) {
  return static_cast<uint8_t>(seed * 131u + i * 7u + (i >> 8));
}

static void fill(uint8_t* b, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; ++i) b[i] = pattern(seed, i);
}

static int check(const uint8_t* b, size_t n, uint32_t seed, const char* who) {
  for (size_t i = 0; i < n; ++i)
    if (b[i] != pattern(seed, i)) {
      fprintf(stderr, "ucp_sockaddr: %s message %u: byte %zu wrong\n", who,
              seed, i);
      return 1;
    }
  return 0;
}

int main(int argc, char** argv) {
  int port = 13337, iters = 20, opt;
  size_t size = 1 << 20;
  const char* listen_ip = nullptr;
  while ((opt = getopt(argc, argv, "p:s:n:l:")) != -1) {
    if (opt == 'p')
      port = atoi(optarg);
    else if (opt == 's')
      size = strtoull(optarg, nullptr, 0);
    else if (opt == 'n')
      iters = atoi(optarg);
    else if (opt == 'l')
      listen_ip = optarg;
    else
      return 2;
  }
  const char* server_ip = optind < argc ? argv[optind] : nullptr;
  if ((listen_ip == nullptr) == (server_ip == nullptr) || size == 0 ||
      iters <= 0) {
    fprintf(stderr, "usage: %s [-p PORT] [-s SIZE] [-n ITERS] (-l IP | IP)\n",
            argv[0]);
    return 2;
  }

  ucp_params_t pp{};
  pp.field_mask = UCP_PARAM_FIELD_FEATURES;
  pp.features = UCP_FEATURE_TAG;
  ucp_context_h ctx;
  ucs_status_t st = ucp_init(&pp, nullptr, &ctx);
  if (st != UCS_OK) die("ucp_init", st);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h w;
  if ((st = ucp_worker_create(ctx, &wp, &w)) != UCS_OK)
    die("ucp_worker_create", st);

  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, listen_ip ? listen_ip : server_ip, &sa.sin_addr) !=
      1) {
    fprintf(stderr, "ucp_sockaddr: not an IPv4 address\n");
    return 2;
  }
  ucp_ep_h ep;
  ucp_ep_params_t ep_params{};
  ep_params.field_mask =
      UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep_params.err_handler.cb = on_ep_error;
  if (listen_ip) {
    ucp_listener_params_t lp{};
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR |
                    UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
    lp.sockaddr.addrlen = sizeof sa;
    lp.conn_handler.cb = on_conn;
    if ((st = ucp_listener_create(w, &lp, &g_lis)) != UCS_OK)
      die("ucp_listener_create", st);
    printf("listening on %s:%d\n", listen_ip, port);
    fflush(stdout);
    const double until = now_s() + 30;
    while (!g_conn) {
      ucp_worker_progress(w);
      if (now_s() > until) die("waiting for a client", UCS_ERR_TIMED_OUT);
    }
    ep_params.field_mask |= UCP_EP_PARAM_FIELD_CONN_REQUEST;
    ep_params.conn_request = g_conn;
  } else {
    ep_params.field_mask |=
        UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
    ep_params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep_params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
    ep_params.sockaddr.addrlen = sizeof sa;
  }
  if ((st = ucp_ep_create(w, &ep_params, &ep)) != UCS_OK)
    die("ucp_ep_create", st);

  std::vector<uint8_t> out_buf(size), in_buf(size);
  uint8_t* out = out_buf.data();
  uint8_t* in = in_buf.data();
  ucp_request_param_t rp{};
  int bad = 0;
  const double t0 = now_s();
  for (int i = 0; i < iters && !bad; ++i) {
    const auto mine = static_cast<uint32_t>(listen_ip ? 2 * i + 1 : 2 * i);
    const uint32_t theirs = mine ^ 1;
    memset(in, 0, size);
    fill(out, size, mine);
    if (listen_ip) {  // receive, check, answer
      wait_req(w, ucp_tag_recv_nbx(w, in, size, theirs, ~0ull, &rp), "recv");
      bad = check(in, size, theirs, "server");
      wait_req(w, ucp_tag_send_nbx(ep, out, size, mine, &rp), "send");
    } else {  // send, receive the answer, check
      void* r = ucp_tag_recv_nbx(w, in, size, theirs, ~0ull, &rp);
      wait_req(w, ucp_tag_send_nbx(ep, out, size, mine, &rp), "send");
      wait_req(w, r, "recv");
      bad = check(in, size, theirs, "client");
    }
  }
  const double dt = now_s() - t0;
  if (!bad)
    printf("%d x %zu B each way, verified, %.1f us per round trip\n", iters,
           size, dt / iters * 1e6);

  // Both ends flush and close; the client's close is the server's cue too.
  ucp_request_param_t cp{};
  cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  cp.flags = bad ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  void* cr = ucp_ep_close_nbx(ep, &cp);
  if (cr && !UCS_PTR_IS_ERR(cr)) {
    const double until = now_s() + 10;
    while (ucp_request_check_status(cr) == UCS_INPROGRESS && now_s() < until)
      ucp_worker_progress(w);
    ucp_request_free(cr);
  }
  if (g_lis) ucp_listener_destroy(g_lis);
  ucp_worker_destroy(w);
  ucp_cleanup(ctx);
  return bad;
}
