// Wake: how an idle worker lcore waits for work instead of sleeping a fixed
// time. Each timed sleep and its wake-up cost the test VM ~25 us of CPU:
// 50 us sleeps kept a worker holding an idle QP ~30 % busy (perf/README.md,
// "An idle service"). A waiting lcore sleeps in epoll_wait on
//  - its port queue's readiness fds (af_packet's ring sockets: readable
//    when a frame is in the ring; edge-triggered, each frame an edge), and
//  - its bell, an eventfd that whoever hands it work writes once the work
//    is published and the lcore says it waits: a client's shim after a
//    doorbell (shim::DoorbellPage::waiting, a copy of the bell given at
//    kOpen), another worker after a hand-off, the control thread after a
//    park request or a command.
//
// The protocol is the Dekker pattern of LcoreGate::park: the lcore stores
// "waiting" (announce_st), then polls everything once more, then waits;
// each giver publishes its work, then loads "waiting" (seq_cst both), so
// either the poll sees the work or the giver rings. announce_st first
// empties the epoll set's stale edges and the bell, so a wait returns for
// what came after that last poll, not for frames read long ago (a frame
// or a bell after the emptying is either polled or ends the wait).
#pragma once

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace urnic::service {

class Wake {
 public:
  Wake() {
    ep_ = epoll_create1(EPOLL_CLOEXEC);
    bell_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (ep_ < 0 || bell_ < 0)
      throw std::runtime_error(std::string("worker wake-up: ") +
                               strerror(errno));
    add(bell_, EPOLLIN);  // level: read by announce_st
  }
  ~Wake() {
    if (ep_ >= 0) close(ep_);
    if (bell_ >= 0) close(bell_);
  }
  Wake(const Wake&) = delete;
  Wake& operator=(const Wake&) = delete;

  // Set-up: a readiness fd of the lcore's RX queue (never read here).
  void watch_rx(int fd) {
    add(fd, EPOLLIN | EPOLLET);
    ++rx_;
  }
  // Whether a frame reaching the lcore's queue wakes it.
  bool covers_rx() const { return rx_ > 0; }
  int bell() const { return bell_; }

  // Anyone, after publishing work for the lcore.
  void ring() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (waiting_.load(std::memory_order_relaxed)) ring_always();
  }
  void ring_always() {
    const uint64_t one = 1;
    (void)!write(bell_, &one, sizeof one);
  }

  // Lcore: from here every giver rings; the lcore must poll everything once
  // more before wait_st.
  void announce_st() {
    epoll_event ev[kEvents];
    while (epoll_wait(ep_, ev, kEvents, 0) == kEvents) {
    }
    uint64_t v;
    (void)!read(bell_, &v, sizeof v);
    waiting_.store(true, std::memory_order_seq_cst);
  }
  bool announced_st() const { return waiting_.load(std::memory_order_relaxed); }
  // Lcore, announced and polled: sleeps until a frame or a bell, at most
  // `ms`. Returns what ended it: kTimedOut, or kRx and/or kBell.
  static constexpr unsigned kTimedOut = 0, kRx = 1, kBell = 2;
  unsigned wait_st(int ms) {
    epoll_event ev[kEvents];
    const int n = epoll_wait(ep_, ev, kEvents, ms);
    unsigned why = kTimedOut;
    for (int i = 0; i < n; ++i) why |= ev[i].data.fd == bell_ ? kBell : kRx;
    return why;
  }
  void withdraw_st() { waiting_.store(false, std::memory_order_relaxed); }

 private:
  static constexpr int kEvents = 8;

  void add(int fd, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.fd = fd;
    if (epoll_ctl(ep_, EPOLL_CTL_ADD, fd, &ev) != 0)
      throw std::runtime_error(std::string("worker wake-up: epoll_ctl: ") +
                               strerror(errno));
  }

  int ep_ = -1;
  int bell_ = -1;
  uint32_t rx_ = 0;
  std::atomic<bool> waiting_{false};
};

}  // namespace urnic::service
