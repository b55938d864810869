// Zero-copy memory registration: the pages of a registered range become
// MAP_SHARED memfd pages at the same virtual addresses (contents kept), so
// that the service can map the very same memory (memory the program
// already shares, MAP_SHARED, the service maps as it is). No socket involved:
// the result is the list of (fd, offset, length) pieces kRegMr passes.
//
// Pages are shared once and stay shared (deregistration does not undo it);
// a range already shared is reused, never remapped (that would detach the
// service's view). The registry checks itself against /proc/self/maps, so
// memory the application unmapped and mapped again is shared afresh.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace urnic::shim {

class MrShare {
 public:
  struct Piece {
    int fd = -1;  // a duplicate, closed by ~Result
    uint64_t fd_offset = 0;
    uint64_t length = 0;
    // The application's own shared mapping (fd -1): [vma_start, vma_end)
    // maps the file the service opens itself (shim::MrPiece); the piece
    // is then the only one.
    uint64_t vma_start = 0;
    uint64_t vma_end = 0;
  };
  struct Result {
    uint64_t map_start = 0;  // page-rounded range, in address order
    uint64_t map_len = 0;
    std::vector<Piece> pieces;
    Result() = default;
    Result(const Result&) = delete;
    Result& operator=(const Result&) = delete;
    ~Result();
  };

  // Makes the pages of [addr, addr + len) shared. `writable`: the access
  // flags allow writes, so the pages must be writable. Returns 0, or EFAULT
  // (a hole, unreadable or read-only memory), EINVAL (a mapping that cannot
  // be shared: private hugetlb memory, [vdso]...; too many pieces; a range
  // beyond one of the program's own shared mappings) or another errno,
  // with the reason in *why. A range inside one writable MAP_SHARED
  // mapping the program made itself (a file, POSIX or System V shared
  // memory as perftest --use_hugepages makes, hugetlbfs, shared anonymous
  // memory) is shared already: it becomes one piece naming that mapping,
  // with no fd.
  int share(const void* addr, size_t len, bool writable, size_t max_pieces,
            Result* out, std::string* why);

  // In a forked child (fork handler, lock held): every shared segment the
  // child inherited becomes a private copy at the same address, so the
  // child's writes (heap metadata next to a buffer, say) cannot reach the
  // parent or the service -- the copy-on-write semantics fork() promises.
  // Allocates nothing.
  void privatize_in_child();
  size_t segments();  // registry entries (tests)

  // How share() learns the process's mappings: by asking the kernel for
  // the few it needs (PROCMAP_QUERY, Linux 6.11), or by reading the whole
  // of /proc/self/maps, as on older kernels. Tests turn the query off to
  // run the older way; true if the query is used (the kernel has it).
  static bool use_vma_query(bool on);

  // Fork handlers hold the lock across fork().
  void lock() { mu_.lock(); }
  void unlock() { mu_.unlock(); }

  static MrShare& instance();

 private:
  struct File {  // one memfd; segments may share it (by shared_ptr)
    int fd = -1;
    uint64_t size = 0;  // bytes
    dev_t dev = 0;
    ino_t ino = 0;
    File() = default;
    File(const File&) = delete;  // the fd is closed once
    File& operator=(const File&) = delete;
    ~File();
  };
  struct Segment {  // [start, start + len) maps file at fd_off
    uint64_t len = 0;
    std::shared_ptr<File> file;
    uint64_t fd_off = 0;
  };
  struct Vma;
  struct Run;

  void forget(uint64_t a, uint64_t b);  // drops registry coverage of [a, b)
  int make_run(Run& run, uint64_t stack_lo, uint64_t stack_hi,
               std::string* why);
  // The mappings overlapping [lo, hi), in address order, and the bounds of
  // the one holding `here`. 0 or an errno.
  static int query_vmas(uint64_t lo, uint64_t hi, uint64_t here,
                        std::vector<Vma>* out, uint64_t* here_lo,
                        uint64_t* here_hi);
  static int read_vmas(uint64_t lo, uint64_t hi, uint64_t here,
                       std::vector<Vma>* out, uint64_t* here_lo,
                       uint64_t* here_hi);

  std::mutex mu_;
  std::map<uint64_t, Segment> segs_;  // by start, non-overlapping
};

}  // namespace urnic::shim
