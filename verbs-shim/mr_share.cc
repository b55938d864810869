// Zero-copy memory registration; see mr_share.h.
#include "verbs-shim/mr_share.h"

#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace urnic::shim {

namespace {

constexpr uint64_t kPage = 4096;
constexpr size_t kPagemapBatch = 65536;  // entries read at once (512 KiB)

std::string hex(uint64_t v) {
  char b[24];
  snprintf(b, sizeof b, "0x%" PRIx64, v);
  return b;
}

// Linux 6.11's PROCMAP_QUERY (uapi linux/fs.h), spelled out: Debian 12's
// headers predate it. One ioctl on /proc/self/maps describes the mapping
// at (or after) an address: ~0.6 us here, where reading the whole file
// took 30-55 us for 65-80 mappings (2026-12-01, Linux 6.18 guest).
struct ProcmapQuery {
  uint64_t size;
  uint64_t query_flags;
  uint64_t query_addr;
  uint64_t vma_start;
  uint64_t vma_end;
  uint64_t vma_flags;
  uint64_t vma_page_size;
  uint64_t vma_offset;
  uint64_t inode;
  uint32_t dev_major;
  uint32_t dev_minor;
  uint32_t vma_name_size;
  uint32_t build_id_size;
  uint64_t vma_name_addr;
  uint64_t build_id_addr;
};
constexpr unsigned long kProcmapQuery = _IOWR('f', 17, ProcmapQuery);
constexpr uint64_t kVmaReadable = 0x01, kVmaWritable = 0x02,
                   kVmaExecutable = 0x04, kVmaShared = 0x08,
                   kCoveringOrNextVma = 0x10;
// Whether to ask: cleared for good when the kernel does not know the
// ioctl (ENOTTY), or by a test.
std::atomic<bool> g_vma_query{true};

// Reads a whole /proc file (its size is unknown in advance).
bool read_proc(const char* path, std::string* out) {
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  out->clear();
  char buf[65536];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out->append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return true;
}

// Whole pages are read, wherever the registered objects in them end: not
// for AddressSanitizer to judge (nor is the pwrite below, a raw syscall).
__attribute__((no_sanitize("address"))) bool all_zero(const uint8_t* p) {
  const uint64_t* w = reinterpret_cast<const uint64_t*>(p);
  for (size_t i = 0; i < kPage / 8; i += 8) {
    if (w[i] | w[i + 1] | w[i + 2] | w[i + 3] | w[i + 4] | w[i + 5] | w[i + 6] |
        w[i + 7])
      return false;
  }
  return true;
}

}  // namespace

struct MrShare::Vma {
  uint64_t start = 0, end = 0;
  int prot = PROT_NONE;
  bool shared = false;
  uint64_t offset = 0;
  unsigned dev_major = 0, dev_minor = 0;
  uint64_t ino = 0;
  std::string path;
};

// A maximal stretch of not-yet-shared pages, made into one memfd (or
// appended to the memfd of the segment right before it).
struct MrShare::Run {
  uint64_t start = 0, end = 0;
  std::vector<const Vma*> vmas;  // the private mappings it spans
  std::shared_ptr<File> extend;  // append to this file instead of a new one
  uint64_t extend_key = 0;       // the segment being extended
};

MrShare::File::~File() {
  if (fd >= 0) close(fd);
}

MrShare::Result::~Result() {
  for (const Piece& p : pieces)
    if (p.fd >= 0) close(p.fd);
}

MrShare& MrShare::instance() {
  static MrShare* s = new MrShare;  // never destroyed: used until exit
  return *s;
}

size_t MrShare::segments() {
  std::lock_guard g(mu_);
  return segs_.size();
}

bool MrShare::use_vma_query(bool on) {
  if (!on) {
    g_vma_query.store(false);
    return false;
  }
  g_vma_query.store(true);
  std::vector<Vma> v;
  uint64_t a = 0, b = 0;
  const uint64_t here = reinterpret_cast<uint64_t>(&v);
  return query_vmas(here, here + 1, here, &v, &a, &b) == 0 &&
         g_vma_query.load();
}

int MrShare::query_vmas(uint64_t lo, uint64_t hi, uint64_t here,
                        std::vector<Vma>* out, uint64_t* here_lo,
                        uint64_t* here_hi) {
  // Opened per call, not kept: a kept fd would describe the parent's
  // mappings in a forked child, and a program may close or reuse numbers
  // it does not know of (one open and close per registration).
  const int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  char name[PATH_MAX + 32];  // a path, " (deleted)" and the NUL
  ProcmapQuery q;
  auto ask = [&](uint64_t addr, uint64_t flags) {
    q = {};
    q.size = sizeof q;
    q.query_flags = flags;
    q.query_addr = addr;
    q.vma_name_addr = reinterpret_cast<uint64_t>(name);
    q.vma_name_size = sizeof name;
    return ioctl(fd, kProcmapQuery, &q) == 0 ? 0 : errno;
  };
  int rc = ask(here, 0);
  if (rc == 0) {
    *here_lo = q.vma_start;
    *here_hi = q.vma_end;
  }
  for (uint64_t at = lo; rc == 0 && at < hi; at = q.vma_end) {
    rc = ask(at, kCoveringOrNextVma);
    if (rc == ENOENT || (rc == 0 && q.vma_start >= hi)) {
      rc = 0;  // nothing more below hi
      break;
    }
    if (rc) break;
    Vma v;
    v.start = q.vma_start;
    v.end = q.vma_end;
    v.prot = ((q.vma_flags & kVmaReadable) ? PROT_READ : 0) |
             ((q.vma_flags & kVmaWritable) ? PROT_WRITE : 0) |
             ((q.vma_flags & kVmaExecutable) ? PROT_EXEC : 0);
    v.shared = q.vma_flags & kVmaShared;
    v.offset = q.vma_offset;
    v.dev_major = q.dev_major;
    v.dev_minor = q.dev_minor;
    v.ino = q.inode;
    if (q.vma_name_size > 1) v.path.assign(name, q.vma_name_size - 1);
    out->push_back(std::move(v));
  }
  close(fd);
  if (rc == ENOTTY) g_vma_query.store(false);  // older than Linux 6.11
  return rc;
}

int MrShare::read_vmas(uint64_t lo, uint64_t hi, uint64_t here,
                       std::vector<Vma>* out, uint64_t* here_lo,
                       uint64_t* here_hi) {
  std::string maps;
  if (!read_proc("/proc/self/maps", &maps)) return errno ? errno : EIO;
  for (size_t pos = 0; pos < maps.size();) {
    size_t eol = maps.find('\n', pos);
    if (eol == std::string::npos) eol = maps.size();
    const char* line = maps.c_str() + pos;
    const size_t n = eol - pos;
    pos = eol + 1;
    // The bounds first: only the few lines that matter are parsed whole.
    char* end = nullptr;
    const uint64_t s = strtoull(line, &end, 16);
    if (end == line || *end != '-') continue;
    const uint64_t e = strtoull(end + 1, nullptr, 16);
    if (here >= s && here < e) *here_lo = s, *here_hi = e;
    if (e <= lo || s >= hi) continue;
    const std::string l(line, n);
    Vma v;
    char perms[8] = {};
    int path_at = 0;
    unsigned long long off, ino;
    if (sscanf(l.c_str(), "%*x-%*x %7s %llx %x:%x %llu %n", perms, &off,
               &v.dev_major, &v.dev_minor, &ino, &path_at) < 5)
      continue;
    v.start = s;
    v.end = e;
    v.offset = off;
    v.ino = ino;
    if (path_at > 0 && static_cast<size_t>(path_at) <= l.size())
      v.path = l.substr(path_at);
    v.prot = (perms[0] == 'r' ? PROT_READ : 0) |
             (perms[1] == 'w' ? PROT_WRITE : 0) |
             (perms[2] == 'x' ? PROT_EXEC : 0);
    v.shared = perms[3] == 's';
    out->push_back(std::move(v));
  }
  return 0;
}

namespace {

// Parses one /proc/self/maps line: a MAP_SHARED mapping of one of our MR
// memfds ("/memfd:urnic-mr (deleted)")? No allocation: the child may not
// touch its heap before the heap's pages are private again.
bool is_mr_mapping(const char* line, size_t n, uint64_t* s, uint64_t* e,
                   uint64_t* off, uint64_t* ino) {
  char* end = nullptr;
  *s = strtoull(line, &end, 16);
  if (!end || *end != '-') return false;
  *e = strtoull(end + 1, &end, 16);
  if (!end || *end != ' ' || end + 5 > line + n || end[4] != 's') return false;
  // "rw-s OFFSET MAJ:MIN INODE path"
  *off = strtoull(end + 6, &end, 16);
  if (!end || *end != ' ') return false;
  while (end < line + n && *end == ' ') ++end;
  while (end < line + n && *end != ' ') ++end;  // the device
  *ino = strtoull(end, nullptr, 10);
  static constexpr char kTag[] = "/memfd:urnic-mr";
  for (size_t i = 0; i + sizeof kTag - 1 <= n; ++i)
    if (std::memcmp(line + i, kTag, sizeof kTag - 1) == 0) return true;
  return false;
}

// Copies one page word by word, uninstrumented: under ASan the page may
// hold heap redzones, which are ours to copy but an instrumented (or
// intercepted) memcpy would report. Volatile keeps the compiler from
// turning the loop back into a memcpy call.
__attribute__((no_sanitize("address"))) void copy_page(void* dst,
                                                       const void* src,
                                                       size_t n) {
  auto* d = static_cast<volatile uint64_t*>(dst);
  auto* s = static_cast<const volatile uint64_t*>(src);
  for (size_t i = 0; i < n / sizeof(uint64_t); ++i) d[i] = s[i];
}

}  // namespace

namespace {

// Copies the pages memfd `mfd` holds in [base, base + len) from src to dst
// (their mappings of it): SEEK_DATA counts pages in swap as data, where
// mincore() calls them absent. False if the memfd cannot say.
bool copy_data_pages(int mfd, off_t base, size_t len, uint8_t* dst,
                     const uint8_t* src) {
  const off_t end = base + static_cast<off_t>(len);
  for (off_t pos = base; pos < end;) {
    off_t d = lseek(mfd, pos, SEEK_DATA);
    if (d < 0) return errno == ENXIO;  // no data past pos
    if (d >= end) break;
    off_t h = lseek(mfd, d, SEEK_HOLE);
    if (h < 0 || h > end) h = end;
    d -= d % static_cast<off_t>(kPage);
    for (off_t o = d; o < h; o += static_cast<off_t>(kPage))
      copy_page(dst + (o - base), src + (o - base), kPage);
    pos = h;
  }
  return true;
}

// Copies the pages of src that mincore() says are resident.
void copy_resident_pages(uint8_t* dst, const uint8_t* src, size_t len) {
  static unsigned char resident[1 << 16];
  for (size_t off = 0; off < len; off += kPage * sizeof resident) {
    const size_t chunk = std::min(len - off, kPage * sizeof resident);
    if (mincore(const_cast<uint8_t*>(src) + off, chunk, resident) != 0)
      std::memset(resident, 1, sizeof resident);
    for (size_t i = 0; i * kPage < chunk; ++i)
      if (resident[i] & 1)
        copy_page(dst + off + i * kPage, src + off + i * kPage, kPage);
  }
}

}  // namespace

void MrShare::privatize_in_child() {
  // The registry may describe memory the application has since unmapped;
  // the kernel's view is the truth: privatize what is mapped from our
  // memfds right now.
  static char buf[1 << 16];
  struct Range {
    uint64_t start, end, off, ino;  // as /proc/self/maps gives them
  };
  static Range ranges[4096];
  size_t nr = 0, have = 0;
  const int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  for (;;) {
    const ssize_t k = read(fd, buf + have, sizeof buf - have);
    if (k <= 0) break;
    have += static_cast<size_t>(k);
    size_t pos = 0;
    for (;;) {
      const char* nl =
          static_cast<const char*>(std::memchr(buf + pos, '\n', have - pos));
      if (!nl) break;
      const size_t n = static_cast<size_t>(nl - (buf + pos));
      if (nr < std::size(ranges)) {
        Range& g = ranges[nr];
        if (is_mr_mapping(buf + pos, n, &g.start, &g.end, &g.off, &g.ino)) ++nr;
      }
      pos += n + 1;
    }
    std::memmove(buf, buf + pos, have - pos);  // keep a partial line
    have -= pos;
  }
  close(fd);
  for (size_t r = 0; r < nr; ++r) {
    const Range& g = ranges[r];
    const size_t len = g.end - g.start;
    void* at = reinterpret_cast<void*>(g.start);
    void* tmp = mmap(nullptr, len, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (tmp == MAP_FAILED) continue;  // the child keeps the shared view
    auto* dst = static_cast<uint8_t*>(tmp);
    const auto* src = static_cast<const uint8_t*>(at);
    // Only pages the memfd holds have data; the rest read as zero, which
    // the fresh anonymous mapping already is. The memfd says which; for
    // one no longer in the registry, mincore() does.
    int mfd = -1;
    for (const auto& [start, seg] : segs_) {
      if (seg.file && static_cast<uint64_t>(seg.file->ino) == g.ino) {
        mfd = seg.file->fd;
        break;
      }
    }
    if (mfd < 0 ||
        !copy_data_pages(mfd, static_cast<off_t>(g.off), len, dst, src))
      copy_resident_pages(dst, src, len);
    if (mremap(tmp, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, at) == MAP_FAILED)
      munmap(tmp, len);
  }
  // The registry stays: share() checks it against /proc/self/maps, where
  // these ranges are private now, so the child shares them afresh.
}

void MrShare::forget(uint64_t a, uint64_t b) {
  auto it = segs_.upper_bound(a);
  if (it != segs_.begin()) --it;
  while (it != segs_.end() && it->first < b) {
    const uint64_t s = it->first;
    const uint64_t e = s + it->second.len;
    if (e <= a) {
      ++it;
      continue;
    }
    Segment seg = it->second;
    it = segs_.erase(it);
    if (s < a) segs_[s] = {a - s, seg.file, seg.fd_off};
    if (e > b) segs_[b] = {e - b, seg.file, seg.fd_off + (b - s)};
  }
}

namespace {

// What the critical section needs, prepared beforehand: between copying a
// page and mapping the memfd over it nothing here allocates or writes to
// memory outside this job, the scratch buffer and the stack.
struct CopyPart {
  uint64_t a, b;
  int prot;
  bool anon;
};
struct CopyJob {
  const CopyPart* parts;
  size_t nparts;
  uint64_t run_start;
  int fd;
  uint64_t base_off;  // file offset of run_start
  int pagemap_fd;     // -1: look at every page
  uint64_t* scratch;  // kPagemapBatch entries
  int err;
  uint64_t err_addr;
  const char* err_what;
};

bool flush(CopyJob& j, uint64_t a, uint64_t b) {
  while (a < b) {
    const ssize_t n =
        syscall(SYS_pwrite64, j.fd, reinterpret_cast<const void*>(a), b - a,
                static_cast<off_t>(j.base_off + (a - j.run_start)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      j.err = n < 0 ? errno : EIO;
      j.err_addr = a;
      j.err_what = "copying into the memfd";
      return false;
    }
    a += static_cast<uint64_t>(n);
  }
  return true;
}

// Copies the pages worth copying: present or swapped (anonymous memory:
// never-touched pages read as zero and must stay unallocated), and not all
// zero. File-backed private pages are all looked at (not present means
// "still in the file", not zero).
bool copy_part(CopyJob& j, const CopyPart& p) {
  uint64_t span_a = 0, span_b = 0;  // pending write
  for (uint64_t base = p.a; base < p.b;) {
    const uint64_t npages =
        std::min<uint64_t>((p.b - base) / kPage, kPagemapBatch);
    bool use_map = p.anon && j.pagemap_fd >= 0;
    if (use_map) {
      const size_t want = npages * 8;
      size_t got = 0;
      while (got < want) {
        const ssize_t n =
            pread(j.pagemap_fd, reinterpret_cast<char*>(j.scratch) + got,
                  want - got, static_cast<off_t>((base / kPage) * 8 + got));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += static_cast<size_t>(n);
      }
      use_map = got == want;
    }
    for (uint64_t i = 0; i < npages; ++i) {
      const uint64_t pg = base + i * kPage;
      bool copy = true;
      if (use_map) copy = (j.scratch[i] >> 62) & 3;  // present | swapped
      if (copy) copy = !all_zero(reinterpret_cast<const uint8_t*>(pg));
      if (copy) {
        if (span_b != pg) {
          if (span_b > span_a && !flush(j, span_a, span_b)) return false;
          span_a = pg;
        }
        span_b = pg + kPage;
      }
    }
    base += npages * kPage;
  }
  return span_b <= span_a || flush(j, span_a, span_b);
}

void copy_and_map(CopyJob& j) {
  for (size_t i = 0; i < j.nparts; ++i) {
    const CopyPart& p = j.parts[i];
    if (!copy_part(j, p)) return;
    void* at = reinterpret_cast<void*>(p.a);
    void* m = mmap(at, p.b - p.a, p.prot, MAP_SHARED | MAP_FIXED, j.fd,
                   static_cast<off_t>(j.base_off + (p.a - j.run_start)));
    if (m != at) {
      j.err = errno;
      j.err_addr = p.a;
      j.err_what = "mapping the memfd in place";
      return;
    }
  }
}

void* copy_thread(void* arg) {
  copy_and_map(*static_cast<CopyJob*>(arg));
  return nullptr;
}

}  // namespace

int MrShare::make_run(Run& run, uint64_t stack_lo, uint64_t stack_hi,
                      std::string* why) {
  const uint64_t len = run.end - run.start;
  std::shared_ptr<File> file = run.extend;
  uint64_t base_off = 0;
  if (file) {
    base_off = file->size;
    if (ftruncate(file->fd, static_cast<off_t>(base_off + len)) != 0) {
      const int e = errno;
      *why = std::string("growing the memfd: ") + strerror(e);
      return e;
    }
  } else {
    file = std::make_shared<File>();
    file->fd = memfd_create("urnic-mr", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    struct stat st;
    // Sealed against shrinking: the service maps it and must never fault.
    if (file->fd < 0 || ftruncate(file->fd, static_cast<off_t>(len)) != 0 ||
        fcntl(file->fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0 ||
        fstat(file->fd, &st) != 0) {
      const int e = errno;
      *why = std::string("memfd: ") + strerror(e);
      return e;
    }
    file->dev = st.st_dev;
    file->ino = st.st_ino;
  }

  std::vector<CopyPart> parts;
  parts.reserve(run.vmas.size());
  for (const Vma* v : run.vmas) {
    const uint64_t a = std::max(v->start, run.start);
    const uint64_t b = std::min(v->end, run.end);
    parts.push_back({a, b, v->prot, v->ino == 0});
  }
  // Scratch outside the heap: it may be written while heap pages of the
  // run are between copy and remap.
  void* scratch = mmap(nullptr, kPagemapBatch * 8, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (scratch == MAP_FAILED) {
    const int e = errno;
    *why = std::string("scratch: ") + strerror(e);
    return e;
  }
  CopyJob job{};
  job.parts = parts.data();
  job.nparts = parts.size();
  job.run_start = run.start;
  job.fd = file->fd;
  job.base_off = base_off;
  job.pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  job.scratch = static_cast<uint64_t*>(scratch);
  if (run.start < stack_hi && stack_lo < run.end) {
    // The run covers this thread's stack: the copy must not race our own
    // frames. Another thread does it while this one sleeps in the kernel
    // (everything we wrote is then in the pages it copies).
    pthread_t t;
    const int rc = pthread_create(&t, nullptr, copy_thread, &job);
    if (rc != 0) {
      job.err = rc;
      job.err_what = "starting the copy thread";
    } else {
      pthread_join(t, nullptr);
    }
  } else {
    copy_and_map(job);
  }
  if (job.pagemap_fd >= 0) close(job.pagemap_fd);
  munmap(scratch, kPagemapBatch * 8);
  if (job.err) {
    *why = std::string(job.err_what) + " at " + hex(job.err_addr) + ": " +
           strerror(job.err);
    return job.err;
  }

  if (run.extend) {
    file->size = base_off + len;
    segs_[run.extend_key].len += len;
  } else {
    file->size = len;
    segs_[run.start] = {len, file, 0};
  }
  return 0;
}

int MrShare::share(const void* addr, size_t len, bool writable,
                   size_t max_pieces, Result* out, std::string* why) {
  std::lock_guard g(mu_);
  const uint64_t a0 = reinterpret_cast<uint64_t>(addr);
  if (len == 0) {
    *why = "zero length";
    return EINVAL;
  }
  if (a0 + len < a0 || a0 + len > UINT64_MAX - kPage) {
    *why = "the range wraps around";
    return EINVAL;
  }
  const uint64_t lo = a0 & ~(kPage - 1);
  const uint64_t hi = (a0 + len + kPage - 1) & ~(kPage - 1);

  // The mappings involved: the range, the page before it (a segment there
  // may be extended) and this thread's stack.
  uint64_t stack_lo = 0, stack_hi = 0;
  std::vector<Vma> vmas;
  const uint64_t want_lo = lo >= kPage ? lo - kPage : lo;
  const uint64_t here = reinterpret_cast<uint64_t>(&vmas);
  int qrc = g_vma_query.load()
                ? query_vmas(want_lo, hi, here, &vmas, &stack_lo, &stack_hi)
                : ENOTTY;
  if (qrc) {  // no query (older kernel), or it failed: the text says all
    vmas.clear();
    qrc = read_vmas(want_lo, hi, here, &vmas, &stack_lo, &stack_hi);
  }
  if (qrc) {
    *why = std::string("/proc/self/maps: ") + strerror(qrc);
    return qrc;
  }

  // Every page mapped, readable (and writable if asked).
  uint64_t at = lo;
  for (const Vma& v : vmas) {
    if (v.end <= lo) continue;
    if (v.start > at) break;
    if (!(v.prot & PROT_READ)) {
      *why = "memory at " + hex(std::max(v.start, lo)) + " is not readable";
      return EFAULT;
    }
    if (writable && !(v.prot & PROT_WRITE)) {
      *why = "memory at " + hex(std::max(v.start, lo)) +
             " is read-only but the access flags allow writes";
      return EFAULT;
    }
    at = v.end;
    if (at >= hi) break;
  }
  if (at < hi) {
    *why = "page " + hex(at) + " is not mapped";
    return EFAULT;
  }

  // Classify: pages already shared (ours, and the registry agrees with the
  // mapping) become pieces of their segment; private pages become runs.
  struct Planned {
    std::shared_ptr<File> file;  // null: a fresh run
    uint64_t fd_off = 0;
    uint64_t len = 0;
    int run = -1;  // index into runs
  };
  std::vector<Planned> plan;
  std::vector<Run> runs;
  auto seg_at = [&](uint64_t x) -> std::map<uint64_t, Segment>::iterator {
    auto it = segs_.upper_bound(x);
    if (it == segs_.begin()) return segs_.end();
    --it;
    return x < it->first + it->second.len ? it : segs_.end();
  };
  auto matches = [](const Vma& v, uint64_t seg_start, const Segment& s) {
    return v.shared && v.ino == s.file->ino &&
           v.dev_major == major(s.file->dev) &&
           v.dev_minor == minor(s.file->dev) &&
           v.offset - v.start == s.fd_off - seg_start;
  };
  for (const Vma& v : vmas) {
    const uint64_t a = std::max(v.start, lo), b = std::min(v.end, hi);
    if (a >= b) continue;
    const auto ours = seg_at(a);
    if (v.shared &&
        (ours == segs_.end() || !matches(v, ours->first, ours->second))) {
      // The application's own shared memory (a file, POSIX or System V
      // shared memory, hugetlbfs, MAP_SHARED|MAP_ANONYMOUS) is shared
      // already: the service maps the same file (it opens this mapping
      // itself), so nothing moves, and huge pages, which a memfd of ours
      // could not take over at an unaligned range, are fine.
      const std::string what =
          v.path.empty() ? std::string("anonymous shared memory") : v.path;
      if (v.start > lo || v.end < hi) {
        *why = "memory at " + hex(a) + " is a MAP_SHARED mapping (" + what +
               ") not made by this library: a registration must lie within "
               "one such mapping";
        return EINVAL;
      }
      if (!(v.prot & PROT_WRITE)) {
        *why = "memory at " + hex(a) + " is a read-only MAP_SHARED mapping (" +
               what + "): only writable ones can be";
        return EINVAL;
      }
      // Whatever the registry said of these addresses is stale: they are
      // the mapping's now.
      forget(lo, hi);
      out->map_start = lo;
      out->map_len = hi - lo;
      out->pieces.clear();
      out->pieces.push_back(
          {-1, v.offset + (lo - v.start), hi - lo, v.start, v.end});
      return 0;
    }
    if (v.shared) {
      for (uint64_t x = a; x < b;) {
        auto it = seg_at(x);
        if (it == segs_.end() || !matches(v, it->first, it->second)) {
          *why = "memory at " + hex(x) + " is a MAP_SHARED mapping (" +
                 (v.path.empty() ? std::string("anonymous shared memory")
                                 : v.path) +
                 ") not made by this library";
          return EINVAL;
        }
        const uint64_t e = std::min(b, it->first + it->second.len);
        plan.push_back(
            {it->second.file, it->second.fd_off + (x - it->first), e - x, -1});
        x = e;
      }
      continue;
    }
    if (v.path == "[vdso]" || v.path == "[vvar]" || v.path == "[vsyscall]" ||
        v.path.find("anon_hugepage") != std::string::npos ||
        v.path.rfind("/dev/hugepages", 0) == 0) {
      *why = "memory at " + hex(a) + " is a special mapping (" + v.path + ")";
      return EINVAL;
    }
    // Private now: whatever the registry said about it is stale (the
    // application unmapped our segment and mapped something else).
    forget(a, b);
    if (!plan.empty() && plan.back().run >= 0 &&
        runs[plan.back().run].end == a) {
      Run& r = runs[plan.back().run];
      r.end = b;
      r.vmas.push_back(&v);
      plan.back().len += b - a;
    } else {
      Run r;
      r.start = a;
      r.end = b;
      r.vmas.push_back(&v);
      runs.push_back(std::move(r));
      plan.push_back({nullptr, 0, b - a, static_cast<int>(runs.size() - 1)});
    }
  }

  // A run right after the segment that ends its memfd grows that memfd:
  // adjacent registrations then stay one piece (and one file).
  for (Run& r : runs) {
    if (r.start < kPage) continue;
    auto it = seg_at(r.start - kPage);
    if (it == segs_.end() || it->first + it->second.len != r.start) continue;
    const Segment& s = it->second;
    if (s.fd_off + s.len != s.file->size) continue;
    bool ok = false;
    for (const Vma& v : vmas)
      if (v.start < r.start && v.end >= r.start) ok = matches(v, it->first, s);
    if (!ok) continue;
    // Only one run may grow a given file.
    bool taken = false;
    for (const Run& o : runs) taken = taken || o.extend == s.file;
    if (taken) continue;
    r.extend = s.file;
    r.extend_key = it->first;
  }
  for (Planned& p : plan) {
    if (p.run < 0 || !runs[p.run].extend) continue;
    p.file = runs[p.run].extend;
    p.fd_off = p.file->size;
  }
  size_t npieces = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    const bool joins = i > 0 && plan[i].file &&
                       plan[i - 1].file == plan[i].file &&
                       plan[i - 1].fd_off + plan[i - 1].len == plan[i].fd_off;
    if (!joins) ++npieces;
  }
  if (npieces > max_pieces) {
    *why = "the range spans " + std::to_string(npieces) +
           " separately shared pieces (at most " + std::to_string(max_pieces) +
           "); register it before its parts, or in smaller MRs";
    return EINVAL;
  }

  for (size_t i = 0; i < runs.size(); ++i) {
    const int rc = make_run(runs[i], stack_lo, stack_hi, why);
    if (rc) return rc;
    for (Planned& p : plan)
      if (p.run == static_cast<int>(i) && !p.file) {
        p.file = segs_[runs[i].start].file;
        p.fd_off = 0;
      }
  }

  out->map_start = lo;
  out->map_len = hi - lo;
  out->pieces.clear();
  const File* last = nullptr;
  for (const Planned& p : plan) {
    if (last == p.file.get() && !out->pieces.empty()) {
      Piece& q = out->pieces.back();
      if (q.fd_offset + q.length == p.fd_off) {
        q.length += p.len;
        continue;
      }
    }
    const int fd = fcntl(p.file->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) {
      const int e = errno;
      *why = std::string("dup: ") + strerror(e);
      return e;
    }
    out->pieces.push_back({fd, p.fd_off, p.len});
    last = p.file.get();
  }
  return 0;
}

}  // namespace urnic::shim
