// The files a kernel verbs device has, for programs that look at them
// directly instead of through libibverbs: UCX (and with it Open MPI) skips a
// device whose /dev/infiniband/<dev_name> is not a character device it may
// open, and reads the port's GID types and the device's NUMA placement from
// sysfs with plain open()/read(). Only urnic devices' own paths
// (device_path() in device.cc) are answered here; every other path goes to
// libc unchanged, after one prefix comparison.
//
// The answers are what the kernel would give: the node is a character
// device (major 231, the uverbs major; it cannot be opened, as a node with
// no driver: ENXIO), sysfs files read as the ibv_read_sysfs_file answers and
// cannot be written, sysfs directories exist (but cannot be listed).

// This file defines open and open64 (and stat, stat64, ...) themselves:
// glibc's fortified open() is an inline wrapper, and with 64-bit file
// offsets its headers rename open to open64 (the same on x86_64).
#undef _FORTIFY_SOURCE
#undef _FILE_OFFSET_BITS
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>

#include "verbs-shim/shim.h"

namespace urnic::shim {
namespace {

constexpr unsigned kUverbsMajor = 231;  // Linux's IB_UVERBS_MAJOR

int fail(int err) {
  errno = err;
  return -1;
}

// An fd that reads `content` and a newline from its start, as a sysfs
// attribute reads.
int content_fd(std::string content, int flags) {
  content += '\n';
  if ((flags & O_ACCMODE) != O_RDONLY || (flags & O_CREAT)) return fail(EACCES);
  if (flags & O_DIRECTORY) return fail(ENOTDIR);
  const int fd =
      memfd_create("urnic-sysfs", (flags & O_CLOEXEC) ? MFD_CLOEXEC : 0u);
  if (fd < 0) return -1;
  const ssize_t n = write(fd, content.data(), content.size());
  if (n != static_cast<ssize_t>(content.size()) || lseek(fd, 0, SEEK_SET)) {
    const int e = n < 0 ? errno : EIO;
    close(fd);
    return fail(e);
  }
  return fd;
}

// open() of a urnic path: an fd, or -1 with errno. kNone is not handled.
int open_device_path(DevPath kind, const std::string& content, int err,
                     int flags) {
  switch (kind) {
    case DevPath::kFile:
      return content_fd(content, flags);
    case DevPath::kNode:
      return fail(ENXIO);
    case DevPath::kDir:
      return fail((flags & O_ACCMODE) != O_RDONLY ? EISDIR : ENOTSUP);
    case DevPath::kMissing:
    case DevPath::kNone:
      break;
  }
  return fail(err);
}

int stat_device_path(DevPath kind, int err, struct stat* st) {
  if (kind == DevPath::kMissing) return fail(err);
  std::memset(st, 0, sizeof *st);
  st->st_uid = 0;
  st->st_gid = 0;
  st->st_blksize = 4096;
  switch (kind) {
    case DevPath::kNode:
      st->st_mode = S_IFCHR | 0666;
      st->st_nlink = 1;
      st->st_rdev = makedev(kUverbsMajor, 192);
      break;
    case DevPath::kDir:
      st->st_mode = S_IFDIR | 0555;
      st->st_nlink = 2;
      break;
    default:  // a file: sysfs reports a page, whatever it holds
      st->st_mode = S_IFREG | 0444;
      st->st_nlink = 1;
      st->st_size = 4096;
      break;
  }
  return 0;
}

bool read_only_mode(const char* mode) {
  return mode && mode[0] == 'r' && !strchr(mode, '+');
}

template <typename Fn>
int open_common(Fn real, const char* path, int flags, mode_t mode) {
  if (is_cm_node(path)) {
    // urnic's RDMA CM; without a urnicd to talk to, the kernel's (rxe or a
    // HCA), so a stray LD_PRELOAD does not take rdma_cm away.
    const int fd = cm_open(flags);
    if (fd >= 0 || errno != ENODEV || !real) return fd;
    return real(path, flags, mode);
  }
  std::string content;
  int err = ENOENT;
  const DevPath kind = device_path(path, &content, &err);
  if (kind != DevPath::kNone)
    return open_device_path(kind, content, err, flags);
  if (!real) return fail(ENOSYS);
  return real(path, flags, mode);
}

template <typename Fn>
FILE* fopen_common(Fn real, const char* path, const char* mode) {
  std::string content;
  int err = ENOENT;
  const DevPath kind = device_path(path, &content, &err);
  if (kind == DevPath::kNone) {
    if (!real) {
      errno = ENOSYS;
      return nullptr;
    }
    return real(path, mode);
  }
  const int flags = (read_only_mode(mode) ? O_RDONLY : O_RDWR) |
                    (mode && strchr(mode, 'e') ? O_CLOEXEC : 0);
  const int fd = open_device_path(kind, content, err, flags);
  if (fd < 0) return nullptr;
  FILE* f = fdopen(fd, mode);
  if (!f) {
    const int e = errno;
    close(fd);
    errno = e;
  }
  return f;
}

template <typename Fn, typename Stat>
int stat_common(Fn real, const char* path, Stat* st) {
  static_assert(sizeof(Stat) == sizeof(struct stat));
  std::string content;
  int err = ENOENT;
  const DevPath kind = device_path(path, &content, &err);
  if (kind != DevPath::kNone)
    return stat_device_path(kind, err, reinterpret_cast<struct stat*>(st));
  if (!real) return fail(ENOSYS);
  return real(path, st);
}

mode_t mode_arg(int flags, va_list ap) {
  return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE
             ? static_cast<mode_t>(va_arg(ap, unsigned))
             : 0;
}

}  // namespace
}  // namespace urnic::shim

using namespace urnic::shim;

URNIC_EXPORT int open(const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  const mode_t mode = mode_arg(flags, ap);
  va_end(ap);
  return open_common(URNIC_REAL(open, nullptr), path, flags, mode);
}

// On LP64 glibc the *64 variants are the same functions: the same body.
static_assert(sizeof(off_t) == 8, "open64 is open only with a 64-bit off_t");
URNIC_EXPORT int open64(const char* path, int flags, ...)
    __attribute__((alias("open")));

URNIC_EXPORT FILE* fopen(const char* path, const char* mode) {
  return fopen_common(URNIC_REAL(fopen, nullptr), path, mode);
}

URNIC_EXPORT FILE* fopen64(const char* path, const char* mode)
    __attribute__((alias("fopen")));

URNIC_EXPORT int stat(const char* path, struct stat* st) {
  return stat_common(URNIC_REAL(stat, "GLIBC_2.33"), path, st);
}

URNIC_EXPORT int stat64(const char* path, struct stat64* st) {
  return stat_common(URNIC_REAL(stat64, "GLIBC_2.33"), path, st);
}

URNIC_EXPORT int lstat(const char* path, struct stat* st) {
  return stat_common(URNIC_REAL(lstat, "GLIBC_2.33"), path, st);
}

URNIC_EXPORT int lstat64(const char* path, struct stat64* st) {
  return stat_common(URNIC_REAL(lstat64, "GLIBC_2.33"), path, st);
}

URNIC_EXPORT int access(const char* path, int how) {
  std::string content;
  int err = ENOENT;
  switch (device_path(path, &content, &err)) {
    case DevPath::kNone:
      break;
    case DevPath::kNode:
      return 0;
    case DevPath::kDir:
    case DevPath::kFile:
      return (how & W_OK) ? fail(EACCES) : 0;
    case DevPath::kMissing:
      return fail(err);
  }
  auto real = URNIC_REAL(access, nullptr);
  return real ? real(path, how) : fail(ENOSYS);
}
