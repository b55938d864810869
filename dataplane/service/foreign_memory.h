// Application memory the service maps from the application's own shared
// mappings (a file, POSIX or System V shared memory, hugetlbfs, shared
// anonymous memory: ShimServer::map_foreign_view), not from a memfd of the
// shim's. Such a file cannot be sealed: its owner may shrink it under the
// service, whose next access there would raise SIGBUS. A SIGBUS handler
// puts a private zero page (of the view's page size) over the vanished
// page and counts it, so the access completes, reads zeros or writes
// nowhere, and the service goes on: the application truncated memory it
// had registered, and only its own data is lost, as when a HCA DMAs into
// pages a process no longer maps. A SIGBUS anywhere else keeps its
// previous disposition.
#pragma once

#include <cstddef>
#include <cstdint>

namespace urnic::service::foreign {

// Installs the handler once (idempotent; before any view is added).
void install();
// Records a view [base, base + len) mapped with `page`-sized pages (the
// file's: 4 KiB, or a huge page); false when the table is full (kMaxViews).
// Control thread only.
constexpr size_t kMaxViews = 4096;
bool add(void* base, size_t len, size_t page);
// Forgets the view starting at `base`, before it is unmapped (no lcore
// touches it any more). Control thread only.
void remove(void* base);
// Pages replaced after their file shrank, since the start.
uint64_t faults();

}  // namespace urnic::service::foreign
