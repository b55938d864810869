// The zero-copy registration logic of the verbs shim (verbs-shim/
// mr_share.h), in-process and without a service: pages become MAP_SHARED
// memfd pages in place, contents kept, reused when registered again.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/auxv.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "verbs-shim/mr_share.h"

namespace urnic::shim {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kMaxPieces = 64;

// The /proc/self/maps line of the mapping holding `p`.
std::string maps_line(const void* p) {
  std::ifstream f("/proc/self/maps");
  const auto a = reinterpret_cast<uintptr_t>(p);
  for (std::string line; std::getline(f, line);) {
    unsigned long s, e;
    if (sscanf(line.c_str(), "%lx-%lx", &s, &e) == 2 && a >= s && a < e)
      return line;
  }
  return "";
}

bool is_shared(const void* p) {
  const std::string l = maps_line(p);
  const size_t sp = l.find(' ');
  return sp != std::string::npos && l.size() > sp + 4 && l[sp + 4] == 's';
}

long resident_pages() {
  std::ifstream f("/proc/self/statm");
  long size = 0, rss = 0;
  f >> size >> rss;
  return rss;
}

void* map_anon(size_t len) {
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

// What the service would see at [addr, addr + len): the pieces' memfds at
// their offsets, in address order.
bool service_view_equals(const MrShare::Result& r, const void* addr,
                         size_t len) {
  const auto a = reinterpret_cast<uint64_t>(addr);
  uint64_t at = r.map_start;
  size_t checked = 0;
  for (const MrShare::Piece& p : r.pieces) {
    const uint64_t lo = std::max(a, at);
    const uint64_t hi = std::min(a + len, at + p.length);
    if (lo < hi) {
      std::string buf(hi - lo, '\0');
      if (pread(p.fd, buf.data(), buf.size(),
                static_cast<off_t>(p.fd_offset + (lo - at))) !=
              static_cast<ssize_t>(buf.size()) ||
          std::memcmp(buf.data(), reinterpret_cast<const void*>(lo),
                      buf.size()) != 0)
        return false;
      checked += buf.size();
    }
    at += p.length;
  }
  return checked == len;
}

uint64_t total_len(const MrShare::Result& r) {
  uint64_t t = 0;
  for (const MrShare::Piece& p : r.pieces) t += p.length;
  return t;
}

// Every test runs twice: the mappings asked of the kernel one by one
// (PROCMAP_QUERY, Linux 6.11; skipped on older kernels), and read from the
// whole of /proc/self/maps, as on Debian 12's own kernel.
class MrShareTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (!MrShare::use_vma_query(GetParam()) && GetParam())
      GTEST_SKIP() << "this kernel has no PROCMAP_QUERY";
  }
  void TearDown() override { MrShare::use_vma_query(true); }
  MrShare& s = MrShare::instance();
  std::string why;
};

INSTANTIATE_TEST_SUITE_P(Maps, MrShareTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "Query" : "Text";
                         });

TEST_P(MrShareTest, UnalignedHeapBufferKeepsContentsAndNeighbours) {
  // Heap memory around the buffer (malloc metadata, other objects) shares
  // its pages: all of it must survive.
  auto* before = static_cast<char*>(malloc(100));
  auto* buf = static_cast<char*>(malloc(10000));
  auto* after = static_cast<char*>(malloc(100));
  std::memset(before, 'b', 100);
  std::memset(after, 'a', 100);
  for (int i = 0; i < 10000; ++i) buf[i] = static_cast<char>(i * 7);
  MrShare::Result r;
  ASSERT_EQ(s.share(buf + 3, 9000, true, kMaxPieces, &r, &why), 0) << why;
  const uint64_t lo = reinterpret_cast<uint64_t>(buf + 3) & ~(kPage - 1);
  EXPECT_EQ(r.map_start, lo);
  EXPECT_EQ(
      r.map_start + r.map_len,
      (reinterpret_cast<uint64_t>(buf + 3 + 9000) + kPage - 1) & ~(kPage - 1));
  EXPECT_EQ(total_len(r), r.map_len);
  EXPECT_TRUE(is_shared(buf + 3));
  for (int i = 0; i < 10000; ++i) ASSERT_EQ(buf[i], static_cast<char>(i * 7));
  for (int i = 0; i < 100; ++i) ASSERT_EQ(before[i], 'b');
  for (int i = 0; i < 100; ++i) ASSERT_EQ(after[i], 'a');
  EXPECT_TRUE(service_view_equals(r, buf + 3, 9000));
  // Truly shared: the application's writes are the service's reads.
  buf[5000] = 42;
  EXPECT_TRUE(service_view_equals(r, buf + 3, 9000));
  // The heap still works.
  free(before);
  free(after);
  void* more = malloc(50000);
  EXPECT_NE(more, nullptr);
  free(more);
  free(buf);
}

TEST_P(MrShareTest, SameBufferTwiceReusesTheSegment) {
  const size_t len = 16 * kPage;
  auto* p = static_cast<uint8_t*>(map_anon(len));
  ASSERT_NE(p, nullptr);
  std::memset(p, 0x5a, len);
  MrShare::Result r1, r2;
  ASSERT_EQ(s.share(p, len, true, kMaxPieces, &r1, &why), 0) << why;
  const size_t segs = s.segments();
  const std::string line = maps_line(p);
  ASSERT_EQ(s.share(p, len, true, kMaxPieces, &r2, &why), 0) << why;
  EXPECT_EQ(s.segments(), segs);
  EXPECT_EQ(maps_line(p), line);  // not remapped
  ASSERT_EQ(r1.pieces.size(), 1u);
  ASSERT_EQ(r2.pieces.size(), 1u);
  EXPECT_EQ(r1.pieces[0].fd_offset, r2.pieces[0].fd_offset);
  // Both fds are the same memory.
  p[100] = 0x11;
  EXPECT_TRUE(service_view_equals(r1, p, len));
  EXPECT_TRUE(service_view_equals(r2, p, len));
  munmap(p, len);
}

TEST_P(MrShareTest, OverlappingRegistrations) {
  const size_t len = 64 * kPage;
  auto* p = static_cast<uint8_t*>(map_anon(len));
  ASSERT_NE(p, nullptr);
  for (size_t i = 0; i < len; ++i) p[i] = static_cast<uint8_t>(i % 251);
  MrShare::Result a, b, c;
  // The middle first, then a range over its tail, then all of it.
  ASSERT_EQ(s.share(p + 16 * kPage, 16 * kPage, true, kMaxPieces, &a, &why), 0)
      << why;
  ASSERT_EQ(s.share(p + 24 * kPage + 5, 20 * kPage, true, kMaxPieces, &b, &why),
            0)
      << why;
  // The tail part grew the first memfd: one piece.
  EXPECT_EQ(b.pieces.size(), 1u);
  ASSERT_EQ(s.share(p, len, true, kMaxPieces, &c, &why), 0) << why;
  EXPECT_EQ(total_len(c), len);
  EXPECT_LE(c.pieces.size(), 3u);
  for (size_t i = 0; i < len; ++i)
    ASSERT_EQ(p[i], static_cast<uint8_t>(i % 251)) << i;
  p[30 * kPage] = 7;
  EXPECT_TRUE(service_view_equals(a, p + 16 * kPage, 16 * kPage));
  EXPECT_TRUE(service_view_equals(b, p + 24 * kPage + 5, 20 * kPage));
  EXPECT_TRUE(service_view_equals(c, p, len));
  munmap(p, len);
}

TEST_P(MrShareTest, AdjacentRegistrationsStayOneFile) {
  const size_t len = 8 * kPage;
  auto* p = static_cast<uint8_t*>(map_anon(len));
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, len);
  MrShare::Result a, b, all;
  ASSERT_EQ(s.share(p, 4 * kPage, true, kMaxPieces, &a, &why), 0) << why;
  ASSERT_EQ(s.share(p + 4 * kPage, 4 * kPage, true, kMaxPieces, &b, &why), 0)
      << why;
  ASSERT_EQ(s.share(p, len, true, kMaxPieces, &all, &why), 0) << why;
  EXPECT_EQ(all.pieces.size(), 1u);
  munmap(p, len);
}

TEST_P(MrShareTest, LargeMostlyUntouchedBufferStaysCheap) {
  // 1.5 GiB from malloc, a few pages written: registering must neither
  // make the rest resident nor take long.
  const size_t len = size_t{3} << 29;
  // meson test sets MALLOC_PERTURB_, which would write every byte.
  mallopt(M_PERTURB, 0);
  auto* p = static_cast<uint8_t*>(malloc(len));
  ASSERT_NE(p, nullptr);
  for (size_t off : {size_t{0}, size_t{1} << 20, len / 2, len - 1})
    p[off] = static_cast<uint8_t>(off % 200 + 1);
  const long rss0 = resident_pages();
  const auto t0 = std::chrono::steady_clock::now();
  MrShare::Result r;
  ASSERT_EQ(s.share(p, len, true, kMaxPieces, &r, &why), 0) << why;
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  const long rss1 = resident_pages();
  EXPECT_LT((rss1 - rss0) * long{kPage}, long{64} << 20)
      << "RSS grew by " << (rss1 - rss0) * long{kPage} / (1 << 20) << " MiB";
  EXPECT_LT(secs, 5.0);
  for (size_t off : {size_t{0}, size_t{1} << 20, len / 2, len - 1})
    EXPECT_EQ(p[off], static_cast<uint8_t>(off % 200 + 1));
  EXPECT_EQ(p[12345678], 0);
  EXPECT_TRUE(is_shared(p + len / 2));
  EXPECT_LT((resident_pages() - rss0) * long{kPage}, long{64} << 20);
  free(p);
}

// fork() promises the child a copy-on-write view: its writes (to the buffer
// or to heap metadata sharing the buffer's pages) must not reach the parent
// or the service. The shim's fork handler calls privatize_in_child().
TEST_P(MrShareTest, ForkedChildGetsPrivateCopies) {
  const size_t len = 8 * kPage;
  auto* p = static_cast<uint8_t*>(map_anon(len));
  ASSERT_NE(p, nullptr);
  std::memset(p, 'a', 3 * kPage);  // pages 3..7 stay untouched (zero)
  MrShare::Result r;
  ASSERT_EQ(s.share(p, len, true, kMaxPieces, &r, &why), 0) << why;
  ASSERT_TRUE(is_shared(p));
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    s.privatize_in_child();
    const bool ok = !is_shared(p) && p[0] == 'a' && p[3 * kPage - 1] == 'a' &&
                    p[3 * kPage] == 0 && p[len - 1] == 0;
    std::memset(p, 'c', len);
    _exit(ok ? 0 : 1);
  }
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0)
      << "the child did not see its private copy";
  EXPECT_EQ(p[0], 'a');  // the child's writes stayed in the child
  EXPECT_EQ(p[len - 1], 0);
  EXPECT_TRUE(is_shared(p));
  EXPECT_TRUE(service_view_equals(r, p, len));
  munmap(p, len);
}

// A MAP_SHARED file mapping the program made itself is shared already:
// one piece naming the mapping and the file offset, no fd, nothing moved.
TEST_P(MrShareTest, SharedFileMappingIsOnePieceWithoutFd) {
  char path[] = "/tmp/test_mr_shareXXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  unlink(path);
  ASSERT_EQ(ftruncate(fd, 8 * kPage), 0);
  auto* p = static_cast<uint8_t*>(mmap(nullptr, 4 * kPage,
                                       PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                                       static_cast<off_t>(2 * kPage)));
  ASSERT_NE(p, MAP_FAILED);
  p[kPage] = 5;
  MrShare::Result r;
  ASSERT_EQ(s.share(p + kPage, 2 * kPage, true, kMaxPieces, &r, &why), 0)
      << why;
  ASSERT_EQ(r.pieces.size(), 1u);
  EXPECT_EQ(r.pieces[0].fd, -1);
  EXPECT_EQ(r.pieces[0].fd_offset, 3 * kPage);  // the file's, not the map's
  EXPECT_EQ(r.pieces[0].vma_start, reinterpret_cast<uint64_t>(p));
  EXPECT_EQ(r.pieces[0].vma_end, reinterpret_cast<uint64_t>(p) + 4 * kPage);
  EXPECT_EQ(maps_line(p).find("urnic-mr"), std::string::npos);  // untouched
  EXPECT_EQ(p[kPage], 5);
  // Shared anonymous memory likewise.
  void* a = mmap(nullptr, 2 * kPage, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(a, MAP_FAILED);
  MrShare::Result r2;
  ASSERT_EQ(s.share(a, 2 * kPage, true, kMaxPieces, &r2, &why), 0) << why;
  ASSERT_EQ(r2.pieces.size(), 1u);
  EXPECT_EQ(r2.pieces[0].fd, -1);
  munmap(a, 2 * kPage);
  munmap(p, 4 * kPage);
  close(fd);
}

// System V shared memory is shared already: one piece naming the
// attachment and the offset in the segment, no fd, nothing remapped.
TEST_P(MrShareTest, SysvAttachmentIsOnePieceWithoutFd) {
  const int id = shmget(IPC_PRIVATE, 8 * kPage, IPC_CREAT | 0600);
  ASSERT_GE(id, 0);
  void* at = shmat(id, nullptr, 0);
  shmctl(id, IPC_RMID, nullptr);
  ASSERT_NE(at, reinterpret_cast<void*>(-1));
  auto* p = static_cast<uint8_t*>(at);
  p[kPage + 100] = 7;
  MrShare::Result r;
  ASSERT_EQ(s.share(p + kPage + 100, 2 * kPage, true, kMaxPieces, &r, &why), 0)
      << why;
  ASSERT_EQ(r.pieces.size(), 1u);
  const MrShare::Piece& q = r.pieces[0];
  EXPECT_EQ(q.fd, -1);
  EXPECT_EQ(q.vma_start, reinterpret_cast<uint64_t>(p));
  EXPECT_EQ(q.vma_end, reinterpret_cast<uint64_t>(p) + 8 * kPage);
  EXPECT_EQ(q.fd_offset, kPage);
  EXPECT_EQ(q.length, 3 * kPage);  // the pages the range touches
  EXPECT_EQ(r.map_start, reinterpret_cast<uint64_t>(p) + kPage);
  EXPECT_EQ(r.map_len, 3 * kPage);
  EXPECT_NE(maps_line(p).find("SYSV"), std::string::npos) << maps_line(p);
  EXPECT_EQ(p[kPage + 100], 7);
  shmdt(at);
}

// A range beyond one attachment, or in one the program can only read:
// refused, saying why.
TEST_P(MrShareTest, SysvAcrossAttachmentsOrReadOnlyRefused) {
  const int id = shmget(IPC_PRIVATE, 2 * kPage, IPC_CREAT | 0600);
  ASSERT_GE(id, 0);
  // Room for the attachment and a private page right after it.
  auto* room = static_cast<uint8_t*>(map_anon(3 * kPage));
  ASSERT_NE(room, nullptr);
  void* at = shmat(id, room, SHM_REMAP);
  ASSERT_EQ(at, room) << std::strerror(errno);
  MrShare::Result r1;
  EXPECT_EQ(s.share(room + kPage, 2 * kPage, true, kMaxPieces, &r1, &why),
            EINVAL);
  EXPECT_NE(why.find("within one such mapping"), std::string::npos) << why;
  shmdt(at);
  munmap(room, 3 * kPage);
  void* ro = shmat(id, nullptr, SHM_RDONLY);
  shmctl(id, IPC_RMID, nullptr);
  ASSERT_NE(ro, reinterpret_cast<void*>(-1));
  MrShare::Result r2, r3;
  EXPECT_EQ(s.share(ro, kPage, true, kMaxPieces, &r2, &why), EFAULT);
  EXPECT_EQ(s.share(ro, kPage, false, kMaxPieces, &r3, &why), EINVAL);
  EXPECT_NE(why.find("read-only MAP_SHARED"), std::string::npos) << why;
  shmdt(ro);
}

TEST_P(MrShareTest, SpecialMappingRefusedByName) {
  // The vDSO is private and readable, but the kernel's own: only its name
  // tells it apart, from either source.
  const auto vdso = reinterpret_cast<void*>(getauxval(AT_SYSINFO_EHDR));
  ASSERT_NE(vdso, nullptr);
  MrShare::Result r;
  EXPECT_EQ(s.share(vdso, kPage, false, kMaxPieces, &r, &why), EINVAL);
  EXPECT_NE(why.find("[vdso]"), std::string::npos) << why;
  EXPECT_EQ(maps_line(vdso).find("urnic-mr"), std::string::npos);
}

TEST_P(MrShareTest, UnmappedHoleRefused) {
  auto* p = static_cast<uint8_t*>(map_anon(3 * kPage));
  ASSERT_NE(p, nullptr);
  std::memset(p, 9, 3 * kPage);
  ASSERT_EQ(munmap(p + kPage, kPage), 0);
  MrShare::Result r;
  EXPECT_EQ(s.share(p, 3 * kPage, true, kMaxPieces, &r, &why), EFAULT);
  EXPECT_NE(why.find("not mapped"), std::string::npos) << why;
  // Nothing was remapped.
  EXPECT_FALSE(is_shared(p));
  EXPECT_EQ(p[0], 9);
  munmap(p, 3 * kPage);
}

TEST_P(MrShareTest, ReadOnlyMemoryNeedsReadOnlyAccess) {
  auto* p = static_cast<uint8_t*>(map_anon(2 * kPage));
  ASSERT_NE(p, nullptr);
  p[0] = 3;
  ASSERT_EQ(mprotect(p, 2 * kPage, PROT_READ), 0);
  MrShare::Result r1, r2;
  EXPECT_EQ(s.share(p, 2 * kPage, true, kMaxPieces, &r1, &why), EFAULT);
  ASSERT_EQ(s.share(p, 2 * kPage, false, kMaxPieces, &r2, &why), 0) << why;
  EXPECT_EQ(p[0], 3);
  EXPECT_NE(maps_line(p).find("r--s"), std::string::npos) << maps_line(p);
  munmap(p, 2 * kPage);
}

TEST_P(MrShareTest, RemappedMemoryIsSharedAfresh) {
  // The application unmaps a registered range and maps new memory there:
  // the stale segment must not be reused (the service would see old
  // pages).
  const size_t len = 4 * kPage;
  auto* p = static_cast<uint8_t*>(map_anon(len));
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, len);
  MrShare::Result r1;
  ASSERT_EQ(s.share(p, len, true, kMaxPieces, &r1, &why), 0) << why;
  ASSERT_EQ(munmap(p, len), 0);
  void* q = mmap(p, len, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  ASSERT_EQ(q, p);
  std::memset(p, 2, len);
  MrShare::Result r2;
  ASSERT_EQ(s.share(p, len, true, kMaxPieces, &r2, &why), 0) << why;
  EXPECT_TRUE(is_shared(p));
  EXPECT_EQ(p[0], 2);
  EXPECT_TRUE(service_view_equals(r2, p, len));
  munmap(p, len);
}

TEST_P(MrShareTest, TooManyPiecesRefusedBeforeRemapping) {
  const size_t n = 8;
  auto* p = static_cast<uint8_t*>(map_anon(2 * n * kPage));
  ASSERT_NE(p, nullptr);
  std::memset(p, 4, 2 * n * kPage);
  // Every other page registered alone, from the top down (so none grows
  // another's memfd): a range over all of them has n pieces (each gap
  // grows the memfd of the page before it).
  for (size_t i = n; i-- > 0;) {
    MrShare::Result r;
    ASSERT_EQ(s.share(p + 2 * i * kPage, kPage, true, kMaxPieces, &r, &why), 0)
        << why;
  }
  const std::string gap = maps_line(p + kPage);
  MrShare::Result r;
  EXPECT_EQ(s.share(p, (2 * n - 1) * kPage, true, 4, &r, &why), EINVAL);
  EXPECT_NE(why.find("pieces"), std::string::npos) << why;
  EXPECT_FALSE(is_shared(p + kPage));  // the gaps were left alone
  ASSERT_EQ(s.share(p, (2 * n - 1) * kPage, true, kMaxPieces, &r, &why), 0)
      << why;
  EXPECT_EQ(total_len(r), (2 * n - 1) * kPage);
  munmap(p, 2 * n * kPage);
}

TEST_P(MrShareTest, StackBufferOfTheCallingThread) {
  // The copy must not lose this thread's own frames (same pages).
  volatile char buf[3 * kPage];
  for (size_t i = 0; i < sizeof buf; ++i) buf[i] = static_cast<char>(i);
  MrShare::Result r;
  ASSERT_EQ(
      s.share(const_cast<char*>(buf), sizeof buf, true, kMaxPieces, &r, &why),
      0)
      << why;
  for (size_t i = 0; i < sizeof buf; ++i)
    ASSERT_EQ(buf[i], static_cast<char>(i));
  EXPECT_TRUE(is_shared(const_cast<char*>(buf)));
}

TEST_P(MrShareTest, GlobalData) {
  static char data[5 * kPage] = {1, 2, 3};  // .data
  static char bss[5 * kPage];               // .bss
  bss[kPage] = 8;
  MrShare::Result r1, r2;
  ASSERT_EQ(s.share(data, sizeof data, true, kMaxPieces, &r1, &why), 0) << why;
  ASSERT_EQ(s.share(bss, sizeof bss, true, kMaxPieces, &r2, &why), 0) << why;
  EXPECT_EQ(data[0], 1);
  EXPECT_EQ(data[2], 3);
  EXPECT_EQ(bss[kPage], 8);
}

TEST_P(MrShareTest, ZeroLengthRefused) {
  char c = 0;
  MrShare::Result r;
  EXPECT_EQ(s.share(&c, 0, true, kMaxPieces, &r, &why), EINVAL);
}

}  // namespace
}  // namespace urnic::shim
