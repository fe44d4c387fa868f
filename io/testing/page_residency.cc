#include "io/testing/page_residency.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include "io/file_system.h"

namespace dcp::testing {

Residency PageResidency(const std::string& path) {
  Residency out{-1, -1};
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    ::close(fd);
    return out;
  }
  const size_t size = static_cast<size_t>(info.st_size);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  if (size == 0) {
    ::close(fd);
    return {0, 0};
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return out;
  std::vector<unsigned char> in_core((size + page - 1) / page);
  const bool ok = ::mincore(map, size, in_core.data()) == 0;
  ::munmap(map, size);
  if (!ok) return out;
  out.pages = static_cast<int64_t>(in_core.size());
  out.resident = 0;
  for (unsigned char c : in_core) out.resident += c & 1;
  return out;
}

Residency AwaitMostlyDropped(const std::string& path) {
  Residency r = PageResidency(path);
  for (int i = 0; i < 200 && r.resident * 2 >= r.pages; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    r = PageResidency(path);
  }
  return r;
}

void DropCachedPages(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

bool KernelTakesUncachedWrites(const std::string& dir) {
  const std::string path = dir + "/.uncached_probe";
  const int fd = dir.empty()
                     ? ::memfd_create("uncached_probe", MFD_CLOEXEC)
                     : ::open(path.c_str(),
                              O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  char byte = 1;
  iovec one{&byte, 1};
  const bool taken = ::pwritev2(fd, &one, 1, 0, kRwfDontCache) == 1;
  ::close(fd);
  if (!dir.empty()) ::unlink(path.c_str());
  return taken;
}

bool DropsCleanPages(const std::string& dir) {
  struct statfs fs {};
  if (::statfs(dir.c_str(), &fs) != 0) return false;
  return fs.f_type != TMPFS_MAGIC && fs.f_type != RAMFS_MAGIC;
}

bool IsWritableTmpfs(const std::string& dir) {
  struct statfs fs;
  return ::statfs(dir.c_str(), &fs) == 0 &&
         static_cast<long>(fs.f_type) == TMPFS_MAGIC &&
         ::access(dir.c_str(), W_OK) == 0;
}

}  // namespace dcp::testing
