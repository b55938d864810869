// Test-only LD_PRELOAD library: widens the window of a race between EAL's
// interrupt thread and urnicd's main thread at shutdown, so that a test
// hits it every run instead of once in a few hundred CI runs.
//  - recvmsg() called on EAL's interrupt thread ("eal-intr-thread": memif
//    reads its control socket there) first sleeps URNIC_TEST_INTR_DELAY_US;
//  - rte_eal_cleanup() returns only URNIC_TEST_EXIT_HOLD_US after it ran,
//    so a PMD handler still running late shows (a crash) before exit.
// Each says so on stderr the first time it acts, so a test can check that
// the window was really there.
#include <dlfcn.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

long env_us(const char* name) {
  const char* v = getenv(name);
  return v ? strtol(v, nullptr, 10) : 0;
}

bool on_interrupt_thread() {
  char name[32] = {};
  pthread_getname_np(pthread_self(), name, sizeof name);
  return strstr(name, "intr") != nullptr;
}

std::atomic<bool> said_delay{false};

}  // namespace

extern "C" ssize_t recvmsg(int fd, struct msghdr* msg, int flags) {
  using Fn = ssize_t (*)(int, struct msghdr*, int);
  static const auto real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "recvmsg"));
  const long us = env_us("URNIC_TEST_INTR_DELAY_US");
  if (us > 0 && on_interrupt_thread()) {
    if (!said_delay.exchange(true))
      fprintf(stderr, "intr_delay: interrupt thread's recvmsg delayed %ld us\n",
              us);
    usleep(static_cast<useconds_t>(us));
  }
  return real(fd, msg, flags);
}

extern "C" int rte_eal_cleanup(void) {
  using Fn = int (*)();
  static const auto real =
      reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "rte_eal_cleanup"));
  const int rc = real();
  if (const long us = env_us("URNIC_TEST_EXIT_HOLD_US"); us > 0) {
    fprintf(stderr, "intr_delay: holding exit %ld us after rte_eal_cleanup\n",
            us);
    usleep(static_cast<useconds_t>(us));
  }
  return rc;
}
