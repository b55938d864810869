// The control-socket client: one SEQPACKET message per request and per
// reply (ctl::Hdr + payload, fds by SCM_RIGHTS), and the plumbing shared by
// every verb (real-function lookup, diagnostics).
#include "verbs-shim/ctl.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "verbs-shim/shim.h"

namespace urnic::shim {

void* find_real(const char* name, const char* version) {
  void* p = version ? dlvsym(RTLD_NEXT, name, version) : nullptr;
  if (!p) p = dlsym(RTLD_NEXT, name);
  // The pointer is kept (URNIC_REAL), so the library it is in must stay:
  // this one does not link libibverbs or librdmacm, and a plugin that
  // loaded them may unload them (Open MPI's btl ofi with no provider
  // unloads libfabric and libibverbs), after which the pointer reached
  // whatever was mapped there next (SIGSEGV in MPI_Init). RTLD_NODELETE on
  // the loaded library keeps it; RTLD_NOLOAD never loads another.
  Dl_info info;
  if (p && dladdr(p, &info) && info.dli_fname)
    dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
  return p;
}

void say(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  fprintf(stderr, "urnic: %s\n", buf);
}

bool quiet() {
  static const bool q = [] {
    const char* e = getenv("URNIC_QUIET");
    return e && *e && strcmp(e, "0") != 0;
  }();
  return q;
}

namespace {
thread_local uint32_t t_empty_polls = 0;

int64_t now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1000000;
}
// Generous: creating an AH or moving a QP to RTR waits for ARP.
constexpr int kCallTimeoutMs = 60000;
}  // namespace

void empty_poll() {
  static const uint32_t after = [] {
    const char* e = getenv("URNIC_POLL_YIELD");
    return e ? static_cast<uint32_t>(strtoul(e, nullptr, 10)) : 0u;
  }();
  if (after && ++t_empty_polls >= after) {
    t_empty_polls = 0;
    sched_yield();
  }
}

namespace {

// Open MPI 4.1's MPI_Rget (osc ucx) completes its request with a fetch-add
// issued after the READ and a ucp_worker_fence. Over UCX's rc_verbs that
// fetch-add is an active message (verbs have no SWAP, so UCX emulates
// every atomic): a SEND whose reply lands in the receive CQ, while the
// READ's data reaches the application's buffer only when UCX handles the
// READ's completion from the send CQ. The READ's responses arrive before
// the reply (the peer answers after its responder served the READ), but
// UCX's progress skips the send CQ whenever the receive CQ had something:
// a rank that was off the CPU meanwhile handles the reply first and
// returns from MPI_Wait before the data is there (1 881 of 2 000 Rgets on
// two services and two ranks sharing 2 vCPUs; 0 with the switch below).
// UCX's own switch polls the send CQ on every progress; it is the default
// of programs this library is loaded into unless their environment sets
// it or URNIC_UCX_DEFAULTS=0 (README: Environment; UCX-NOTES.md).
//
// Only where UCX may open rc_verbs: UCX warns about every UCX_* variable no
// component read ("unused env variable"), so with UCX_TLS=ud_v the switch
// would only add a warning.
bool ucx_may_use_rc_verbs(std::string_view tls) {
  if (tls.empty()) return true;  // UCX's default: every transport
  const bool exclude = tls.front() == '^';
  if (exclude) tls.remove_prefix(1);
  bool named = false;
  while (!tls.empty()) {
    const size_t comma = tls.find(',');
    const std::string_view t = tls.substr(0, comma);
    // The names and aliases that take in rc_verbs (UCX 1.13's
    // ucp_tl_aliases; "rc" is rc_verbs or rc_mlx5, whichever exists).
    named = named || t == "rc_verbs" || t == "rc_v" || t == "rc" || t == "ib" ||
            t == "all";
    tls = comma == std::string_view::npos ? "" : tls.substr(comma + 1);
  }
  return exclude != named;
}

__attribute__((constructor)) void ucx_defaults() {
  const char* e = getenv("URNIC_UCX_DEFAULTS");
  if (e && std::string_view(e) == "0") return;
  const char* tls = getenv("UCX_TLS");
  if (ucx_may_use_rc_verbs(tls ? tls : ""))
    setenv("UCX_RC_VERBS_TX_POLL_ALWAYS", "y", 0);
}

}  // namespace

int connect_service(const std::string& path, int* fd_out) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (path.size() >= sizeof sa.sun_path) return ENAMETOOLONG;
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  // Non-blocking: a service that is stopped or wedged accepts nothing, and
  // once its listen backlog is full a blocking connect would wait forever.
  // EAGAIN (backlog full) is tried again for as long as a call may take.
  const int fd =
      socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return errno;
  const int64_t deadline = now_ms() + kCallTimeoutMs;
  for (;;) {
    if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) break;
    if (errno == EINTR) continue;
    if (errno == EAGAIN && now_ms() < deadline) {
      poll(nullptr, 0, 10);
      continue;
    }
    const int e = errno == EAGAIN ? ETIMEDOUT : errno;
    close(fd);
    return e;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  *fd_out = fd;
  return 0;
}

int transact(int fd, uint16_t op, const void* body, size_t len, const int* fds,
             int nfds, char* buf, size_t buflen, Reply* rep, int timeout_ms) {
  rep->status = 0;
  rep->payload = {};
  rep->nfds = 0;
  ctl::Hdr h;
  h.op = op;
  h.len = static_cast<uint32_t>(len);
  iovec iov[2] = {{&h, sizeof h}, {const_cast<void*>(body), len}};
  msghdr mh{};
  mh.msg_iov = iov;
  mh.msg_iovlen = len ? 2 : 1;
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * kMaxMrPieces)];
  if (nfds > 0) {
    if (nfds > static_cast<int>(kMaxMrPieces)) return EINVAL;
    mh.msg_control = cbuf;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    cmsghdr* cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    std::memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
  }
  ssize_t n;
  do {
    n = sendmsg(fd, &mh, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  // A refusal at accept time (permissions) arrives as a reply even though
  // the service closed before reading: read it before giving up.
  const int send_err = n < 0 ? errno : 0;

  // The wait is for timeout_ms in all, however many signals interrupt it:
  // a program with a fast interval timer (a sampling profiler's SIGPROF)
  // would otherwise restart it for ever.
  pollfd p{fd, POLLIN, 0};
  const int64_t deadline = now_ms() + timeout_ms;
  int pr;
  for (;;) {
    const int64_t left = std::max<int64_t>(deadline - now_ms(), 0);
    pr = poll(&p, 1, static_cast<int>(left));
    if (pr >= 0 || errno != EINTR) break;
  }
  if (pr == 0) return ETIMEDOUT;
  if (pr < 0) return errno;

  iovec riov{buf, buflen};
  msghdr rh{};
  rh.msg_iov = &riov;
  rh.msg_iovlen = 1;
  alignas(cmsghdr) char rcbuf[CMSG_SPACE(sizeof(int) * kMaxReplyFds)];
  rh.msg_control = rcbuf;
  rh.msg_controllen = sizeof rcbuf;
  do {
    n = recvmsg(fd, &rh, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  for (cmsghdr* cm = CMSG_FIRSTHDR(&rh); cm; cm = CMSG_NXTHDR(&rh, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
    const size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; ++i) {
      int f;
      std::memcpy(&f, CMSG_DATA(cm) + i * sizeof(int), sizeof f);
      if (rep->nfds < kMaxReplyFds)
        rep->fds[rep->nfds++] = f;
      else
        close(f);
    }
  }
  if (n <= 0) {
    rep->close_fds();
    if (n < 0) return errno;
    return send_err ? send_err : ECONNRESET;
  }
  ctl::Hdr r;
  if (static_cast<size_t>(n) < sizeof r || (rh.msg_flags & MSG_TRUNC)) {
    rep->close_fds();
    return EPROTO;
  }
  std::memcpy(&r, buf, sizeof r);
  if (r.magic != ctl::kMagic || r.len != static_cast<size_t>(n) - sizeof r) {
    rep->close_fds();
    return EPROTO;
  }
  rep->status = r.status;
  rep->payload = std::string_view(buf + sizeof r, r.len);
  return 0;
}

void Reply::close_fds() {
  for (int i = 0; i < nfds; ++i) close(fds[i]);
  nfds = 0;
}

int hello(const std::string& path, std::string* text, HelloFail* how) {
  *how = HelloFail::kConnect;
  int fd;
  int rc = connect_service(path, &fd);
  if (rc) return rc;
  char buf[4096];
  Reply rep;
  rc = transact(fd, static_cast<uint16_t>(ctl::Op::kHello), nullptr, 0, nullptr,
                0, buf, sizeof buf, &rep, 5000);
  close(fd);
  *how = HelloFail::kNoAnswer;
  if (rc) return rc;
  rep.close_fds();
  text->assign(rep.payload);
  if (rep.status < 0) {
    *how = HelloFail::kRefused;
    return -rep.status;
  }
  *how = HelloFail::kNone;
  return 0;
}

// --- Context
// ------------------------------------------------------------------

void Context::lost(const char* why) {
  if (dead.exchange(true)) return;
  if (!dev->lost_reported.exchange(true))
    say("lost the connection to urnicd at %s (%s): its contexts are unusable "
        "(the service exited or was restarted?)",
        dev->path.c_str(), why);
}

bool Context::hung_up(int wait_ms) const {
  if (ctl_fd < 0) return true;
  pollfd p{ctl_fd, POLLRDHUP, 0};
  return poll(&p, 1, wait_ms) > 0 &&
         (p.revents & (POLLHUP | POLLRDHUP | POLLERR));
}

int Context::full_or_gone() {
  if (!hung_up()) return ENOMEM;
  lost("its control connection hung up");
  return EIO;
}

int Context::call(Op op, const char* what, const void* req, size_t req_len,
                  const int* fds, int nfds, void* rep, size_t rep_len,
                  int* rep_fds, int nrep_fds) {
  if (dead.load(std::memory_order_acquire)) {
    errno = EIO;
    return EIO;
  }
  std::lock_guard g(ctl_mu);
  if (dead.load(std::memory_order_acquire) || ctl_fd < 0) {
    errno = EIO;
    return EIO;
  }
  Reply r;
  const int rc = transact(ctl_fd, static_cast<uint16_t>(op), req, req_len, fds,
                          nfds, rx.get(), ctl::kMaxMsg, &r, kCallTimeoutMs);
  if (rc) {
    // The request/reply stream is out of step or gone: nothing more can be
    // asked on it.
    lost(rc == ETIMEDOUT ? "no reply within 60 s" : strerror(rc));
    errno = EIO;
    return EIO;
  }
  if (r.status < 0) {
    r.close_fds();
    // The service's reason, where it gave one beyond the errno the caller
    // gets anyway: a bare EINVAL prints nothing, as other providers do
    // (libfabric's verbs provider sizes its inline data by trying: 16
    // lines of "Invalid argument" from one fi_info).
    if (!quiet() && std::string_view(r.payload.data(), r.payload.size()) !=
                        std::string_view(strerror(-r.status)))
      say("%s: %.*s", what, static_cast<int>(r.payload.size()),
          r.payload.data());
    errno = -r.status;
    return -r.status;
  }
  if (r.payload.size() != rep_len || r.nfds != nrep_fds) {
    r.close_fds();
    say("%s: malformed reply from urnicd (%zu bytes, %d fds; expected %zu, "
        "%d): is it the urnicd this liburnic-verbs.so was built with?",
        what, r.payload.size(), r.nfds, rep_len, nrep_fds);
    errno = EPROTO;
    return EPROTO;
  }
  if (rep_len) std::memcpy(rep, r.payload.data(), rep_len);
  for (int i = 0; i < nrep_fds; ++i) rep_fds[i] = r.fds[i];
  return 0;
}

void* map_service_fd(int fd, size_t len) {
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int e = errno;
  close(fd);
  if (p == MAP_FAILED) {
    errno = e;
    return nullptr;
  }
  // A forked child must not reach the parent's queues (see events.cc).
  madvise(p, len, MADV_DONTFORK);
  return p;
}

}  // namespace urnic::shim
