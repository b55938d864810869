// One EAL interrupt source of our own (an eventfd, RTE_INTR_HANDLE_EXT) whose
// callback runs the job the main thread queued. Registered on first use and
// never unregistered: unregistering makes the thread rebuild its wait list,
// which is what must not happen near rte_eal_cleanup.
// rte_intr_instance_alloc and its setters are experimental in DPDK 22.11 (the
// only way to build an interrupt handle since the struct became opaque).
#define ALLOW_EXPERIMENTAL_API 1

#include "dataplane/service/intr_thread.h"

#include <rte_eal.h>
#include <rte_interrupts.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>

namespace urnic::service::intr_thread {
namespace {

enum class State { kIdle, kQueued, kRunning, kDone };

struct Executor {
  std::mutex mu;
  std::condition_variable cv;
  State state = State::kIdle;
  const std::function<void()>* fn = nullptr;
  bool park = false;    // block after fn, for good
  bool parked = false;  // a park was taken: the thread takes nothing more
  int efd = -1;
  bool registered = false;
};

// Never destroyed: a parked interrupt thread outlives static destructors.
Executor& executor() {
  static Executor* e = new Executor;
  return *e;
}

void on_interrupt(void* arg) {
  auto& e = *static_cast<Executor*>(arg);
  uint64_t n;
  // EAGAIN (a spurious wake-up) is harmless: the state says if there is work.
  [[maybe_unused]] const ssize_t r = read(e.efd, &n, sizeof n);
  std::unique_lock lk(e.mu);
  if (e.state != State::kQueued) return;
  e.state = State::kRunning;
  const std::function<void()>* fn = e.fn;
  lk.unlock();
  (*fn)();
  lk.lock();
  e.state = State::kDone;
  const bool park = e.park;
  e.cv.notify_all();
  lk.unlock();
  while (park) sleep(3600);
}

bool ensure_registered(Executor& e) {
  if (e.registered) return true;
  if (e.efd < 0) e.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (e.efd < 0) return false;
  rte_intr_handle* h = rte_intr_instance_alloc(RTE_INTR_INSTANCE_F_PRIVATE);
  if (h == nullptr) return false;
  if (rte_intr_type_set(h, RTE_INTR_HANDLE_EXT) != 0 ||
      rte_intr_fd_set(h, e.efd) != 0 ||
      rte_intr_callback_register(h, on_interrupt, &e) != 0) {
    rte_intr_instance_free(h);
    return false;
  }
  // EAL keeps its own copy of the handle; ours is no longer needed.
  rte_intr_instance_free(h);
  e.registered = true;
  return true;
}

bool submit(const std::function<void()>& fn, bool park, int timeout_ms) {
  Executor& e = executor();
  if (!ensure_registered(e)) {
    fprintf(stderr,
            "urnicd: cannot register with EAL's interrupt thread; shutting "
            "down from the main thread\n");
    return false;
  }
  std::unique_lock lk(e.mu);
  if (e.parked) return park;
  e.fn = &fn;
  e.park = park;
  e.state = State::kQueued;
  const uint64_t one = 1;
  if (write(e.efd, &one, sizeof one) < 0) {
    e.state = State::kIdle;
    return false;
  }
  e.cv.wait_for(lk, std::chrono::milliseconds(timeout_ms),
                [&] { return e.state == State::kDone; });
  if (e.state == State::kQueued) {  // not taken: withdrawn, never runs
    e.state = State::kIdle;
    fprintf(stderr,
            "urnicd: EAL's interrupt thread busy for %d ms (a PMD handler "
            "stuck?); shutting down from the main thread\n",
            timeout_ms);
    return false;
  }
  // Taken: wait for it however long it takes (it is ours, not a handler's).
  e.cv.wait(lk, [&] { return e.state == State::kDone; });
  if (!park) e.state = State::kIdle;
  e.parked = park;
  return true;
}

}  // namespace

bool run(const std::function<void()>& fn, int timeout_ms) {
  return submit(fn, false, timeout_ms);
}

bool park(int timeout_ms) {
  static const std::function<void()> nothing = [] {};
  return submit(nothing, true, timeout_ms);
}

namespace {

// The files in it, not recursively, then the directory if that emptied it.
void remove_runtime_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::error_code rm;  // a failed remove does not end the walk
  for (fs::directory_iterator it(dir, ec);
       !ec && it != fs::directory_iterator(); it.increment(ec))
    if (!it->is_directory(rm)) fs::remove(it->path(), rm);
  fs::remove(dir, rm);  // fails, harmlessly, if anything is left
}

}  // namespace

void eal_cleanup(int timeout_ms) {
  park(timeout_ms);
  const bool primary = rte_eal_process_type() == RTE_PROC_PRIMARY;
  const std::string dir = rte_eal_get_runtime_dir();
  rte_eal_cleanup();
  if (primary && !dir.empty()) remove_runtime_dir(dir);
}

}  // namespace urnic::service::intr_thread
