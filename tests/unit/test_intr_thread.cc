// intr_thread: work run on EAL's interrupt thread (dataplane/service/
// intr_thread.h) — that it runs there, after a handler already running,
// is withdrawn (never run) when the thread stays busy past the timeout, and
// that park() leaves the thread taking nothing more, and that eal_cleanup
// removes EAL's runtime directory. A real EAL (no
// hugepages, no PCI, a file prefix of its own); a second interrupt source of
// the test's own plays a PMD's slow handler.
#define ALLOW_EXPERIMENTAL_API 1

#include <gtest/gtest.h>
#include <pthread.h>
#include <rte_eal.h>
#include <rte_interrupts.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "dataplane/service/intr_thread.h"

namespace urnic::service {
namespace {

using Clock = std::chrono::steady_clock;

class EalEnv : public ::testing::Environment {
 public:
  void SetUp() override {
    std::vector<std::string> args = {"test_intr_thread",
                                     "-l",
                                     "0",
                                     "--no-huge",
                                     "-m",
                                     "64",
                                     "--no-pci",
                                     "--file-prefix",
                                     "ut-intr-" + std::to_string(getpid()),
                                     "--log-level",
                                     "lib.eal:error"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    ASSERT_GE(rte_eal_init(static_cast<int>(argv.size()), argv.data()), 0);
  }
  // As urnicd ends: the thread parked (already, by the last test), then
  // EAL's cleanup, and its runtime directory gone with it.
  void TearDown() override {
    const std::string dir = rte_eal_get_runtime_dir();
    ASSERT_TRUE(std::filesystem::is_directory(dir)) << dir;
    intr_thread::eal_cleanup(2000);
    EXPECT_FALSE(std::filesystem::exists(dir)) << dir;
  }
};
const auto* const env = ::testing::AddGlobalTestEnvironment(new EalEnv);

// A PMD-like handler of the test's own: busy for `busy_ms` each time its
// eventfd is written.
struct SlowHandler {
  int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  rte_intr_handle* h = nullptr;
  std::atomic<int> busy_ms{0};
  std::atomic<bool> running{false};
  std::atomic<Clock::rep> ended{0};

  static void cb(void* arg) {
    auto* s = static_cast<SlowHandler*>(arg);
    uint64_t n;
    [[maybe_unused]] const ssize_t r = read(s->efd, &n, sizeof n);
    s->running = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(s->busy_ms.load()));
    s->ended = Clock::now().time_since_epoch().count();
    s->running = false;
  }
  SlowHandler() {
    h = rte_intr_instance_alloc(RTE_INTR_INSTANCE_F_PRIVATE);
    rte_intr_type_set(h, RTE_INTR_HANDLE_EXT);
    rte_intr_fd_set(h, efd);
    rte_intr_callback_register(h, cb, this);
  }
  ~SlowHandler() {
    rte_intr_callback_unregister_sync(h, cb, this);
    rte_intr_instance_free(h);
    close(efd);
  }
  // Starts a busy spell and returns once the handler is in it.
  void occupy(int ms) {
    busy_ms = ms;
    const uint64_t one = 1;
    ASSERT_EQ(write(efd, &one, sizeof one), 8);
    while (!running) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
};

std::string thread_name() {
  char name[32] = {};
  pthread_getname_np(pthread_self(), name, sizeof name);
  return name;
}

TEST(IntrThread, RunsOnTheInterruptThread) {
  std::string where;
  EXPECT_TRUE(intr_thread::run([&] { where = thread_name(); }, 2000));
  EXPECT_NE(where.find("intr"), std::string::npos) << where;
  EXPECT_NE(thread_name().find("intr"), 0u);  // not this thread
  // Again: the source stays registered and takes more work.
  int n = 0;
  EXPECT_TRUE(intr_thread::run([&] { ++n; }, 2000));
  EXPECT_TRUE(intr_thread::run([&] { ++n; }, 2000));
  EXPECT_EQ(n, 2);
}

TEST(IntrThread, RunsAfterAHandlerAlreadyRunning) {
  SlowHandler slow;
  slow.occupy(300);
  Clock::rep ran_at = 0;
  EXPECT_TRUE(intr_thread::run(
      [&] { ran_at = Clock::now().time_since_epoch().count(); }, 5000));
  EXPECT_FALSE(slow.running);
  EXPECT_GE(ran_at, slow.ended.load());
}

TEST(IntrThread, WithdrawnWhenTheThreadStaysBusy) {
  SlowHandler slow;
  slow.occupy(800);
  std::atomic<int> calls{0};
  const auto t0 = Clock::now();
  EXPECT_FALSE(intr_thread::run([&] { ++calls; }, 100));
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(700));
  // The handler ends and the thread polls our source again: the withdrawn
  // job must not run late (its captures would be gone by then).
  while (slow.running)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(calls.load(), 0);
  // And the next job runs.
  EXPECT_TRUE(intr_thread::run([&] { ++calls; }, 2000));
  EXPECT_EQ(calls.load(), 1);
}

// Last: irreversible.
TEST(IntrThread, ParkedTakesNothingMore) {
  EXPECT_TRUE(intr_thread::park(2000));
  EXPECT_TRUE(intr_thread::park(2000));  // again: nothing to do
  std::atomic<int> calls{0};
  EXPECT_FALSE(intr_thread::run([&] { ++calls; }, 200));
  // Nor does any other handler run.
  SlowHandler other;
  other.busy_ms = 0;
  const uint64_t one = 1;
  ASSERT_EQ(write(other.efd, &one, sizeof one), 8);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(calls.load(), 0);
  EXPECT_EQ(other.ended.load(), 0);
}

}  // namespace
}  // namespace urnic::service
