// Work run on EAL's interrupt thread, where PMDs run their control handlers
// (memif reads its control socket there; e1000/igb, tap take link
// interrupts there). urnicd uses it for the two steps of its shutdown that
// must not overlap those handlers:
//  - the port's stop and close: memif frees per-device state from its
//    handler when the peer goes (EOF) and from dev_stop/close; run from the
//    main thread the two raced (SEGV in memif_intr_handler);
//  - rte_eal_cleanup: DPDK 22.11 unmaps its memory there but leaves the
//    interrupt thread running, and memif's server never unregisters its
//    listener, so the thread's next rebuild of its wait list reads that
//    source's freed handle. park() stops the thread (in our callback, for
//    the rest of the process) before cleanup.
// Control path only; one caller at a time (the main lcore).
#pragma once

#include <functional>

namespace urnic::service::intr_thread {

// Runs fn on the interrupt thread, after any handler running there, and
// waits for it. false: the thread did not take it within timeout_ms (a
// handler stuck) or our callback could not be registered; fn was then not
// called and never will be: the caller runs it on its own thread.
bool run(const std::function<void()>& fn, int timeout_ms);

// Leaves the interrupt thread blocked in our callback until the process
// exits: no PMD handler runs and no wait list is rebuilt after this.
// false: as for run() (the thread was not parked).
// Parking again is a no-op that returns true; run() after a park returns
// false.
bool park(int timeout_ms);

// The end of an EAL process: the thread parked (timeout_ms), rte_eal_cleanup,
// and, in a primary, the runtime directory EAL leaves behind
// (/var/run/dpdk/<file_prefix>: the shared config and memory-table files,
// ~3.3 MB with --no-huge). One per prefix ever used piled up where prefixes
// are made per run (the tests': 1 534 of them, 4.7 GB, after a few runs of
// the suite, in RAM where /run is a tmpfs). A secondary's belongs to its
// primary.
void eal_cleanup(int timeout_ms);

}  // namespace urnic::service::intr_thread
