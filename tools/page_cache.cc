#include "tools/page_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <system_error>
#include <vector>

namespace dcp {
namespace {

// Calls `visit` with an open read-only descriptor of every regular file
// under `dir` that can be opened.
void ForEachFile(const std::string& dir,
                 const std::function<void(int)>& visit) {
  std::error_code ec;
  for (const auto& entry :
       std::filesystem::recursive_directory_iterator(dir, ec)) {
    if (!entry.is_regular_file()) continue;
    int fd = ::open(entry.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    visit(fd);
    ::close(fd);
  }
}

}  // namespace

void DropPageCache(const std::string& dir) {
  ForEachFile(dir, [](int fd) {
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  });
}

int64_t WarmPageCache(const std::string& dir) {
  std::vector<char> buffer(size_t{8} << 20);
  int64_t total = 0;
  ForEachFile(dir, [&](int fd) {
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    for (;;) {
      const ssize_t n = ::read(fd, buffer.data(), buffer.size());
      if (n > 0) {
        total += n;
      } else if (n == 0 || errno != EINTR) {
        break;
      }
    }
  });
  return total;
}

}  // namespace dcp
