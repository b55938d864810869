#include "dataplane/service/foreign_memory.h"

#include <signal.h>
#include <sys/mman.h>

#include <atomic>
#include <mutex>

namespace urnic::service::foreign {

namespace {

// A fixed table the handler can scan without locks: a slot is published by
// its `lo` (release, after hi and page) and cleared by storing 0.
struct Slot {
  std::atomic<uintptr_t> lo{0};
  std::atomic<uintptr_t> hi{0};
  std::atomic<uintptr_t> page{0};
};
Slot g_views[kMaxViews];
std::atomic<uint64_t> g_faults{0};
struct sigaction g_prev {};
std::once_flag g_installed;

void on_sigbus(int sig, siginfo_t* si, void* uc) {
  const auto a = reinterpret_cast<uintptr_t>(si->si_addr);
  for (Slot& s : g_views) {
    const uintptr_t lo = s.lo.load(std::memory_order_acquire);
    if (lo == 0 || a < lo || a >= s.hi.load(std::memory_order_relaxed))
      continue;
    const uintptr_t page = s.page.load(std::memory_order_relaxed);
    // mmap is async-signal-safe in practice (a system call); the faulting
    // access runs again on return and finds the zero page.
    void* p = mmap(reinterpret_cast<void*>(a & ~(page - 1)), page,
                   PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (p != MAP_FAILED) {
      g_faults.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    break;
  }
  // Not a view's: what was there before.
  if ((g_prev.sa_flags & SA_SIGINFO) && g_prev.sa_sigaction) {
    g_prev.sa_sigaction(sig, si, uc);
    return;
  }
  if (g_prev.sa_handler != SIG_DFL && g_prev.sa_handler != SIG_IGN &&
      g_prev.sa_handler != nullptr) {
    g_prev.sa_handler(sig);
    return;
  }
  signal(sig, SIG_DFL);  // the access faults again: the default action
}

}  // namespace

void install() {
  std::call_once(g_installed, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &g_prev);
  });
}

bool add(void* base, size_t len, size_t page) {
  for (Slot& s : g_views) {
    if (s.lo.load(std::memory_order_relaxed) != 0) continue;
    s.hi.store(reinterpret_cast<uintptr_t>(base) + len,
               std::memory_order_relaxed);
    s.page.store(page, std::memory_order_relaxed);
    s.lo.store(reinterpret_cast<uintptr_t>(base), std::memory_order_release);
    return true;
  }
  return false;
}

void remove(void* base) {
  const auto lo = reinterpret_cast<uintptr_t>(base);
  for (Slot& s : g_views)
    if (s.lo.load(std::memory_order_relaxed) == lo) {
      s.lo.store(0, std::memory_order_release);
      return;
    }
}

uint64_t faults() {
  return g_faults.load(std::memory_order_relaxed);
}

}  // namespace urnic::service::foreign
