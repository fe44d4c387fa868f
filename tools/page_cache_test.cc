#include "tools/page_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dcp {
namespace {

namespace fs = std::filesystem;

constexpr long kTmpfsMagic = 0x01021994;

void WriteFile(const fs::path& path, size_t size) {
  std::ofstream out(path, std::ios::binary);
  std::string bytes(size, 'x');
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Pages of `path` in the page cache, and the file's page count.
std::pair<size_t, size_t> ResidentPages(const fs::path& path) {
  const size_t size = fs::file_size(path);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t pages = (size + page - 1) / page;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  std::vector<unsigned char> in_core(pages);
  ::mincore(map, size, in_core.data());
  ::munmap(map, size);
  size_t resident = 0;
  for (unsigned char c : in_core) resident += c & 1;
  return {resident, pages};
}

fs::path NewDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  fs::path dir = fs::path(tmp != nullptr ? tmp : "/tmp") / "page_cache_test";
  fs::remove_all(dir);
  fs::create_directories(dir / "sub");
  return dir;
}

bool OnTmpfs(const fs::path& dir) {
  struct statfs info {};
  return ::statfs(dir.c_str(), &info) == 0 && info.f_type == kTmpfsMagic;
}

TEST(PageCacheTest, DropEvictsAndWarmReadsEveryFileBack) {
  const fs::path dir = NewDir();
  WriteFile(dir / "a.distcp", (size_t{8} << 20) + 3);
  WriteFile(dir / "sub" / ".metadata", 100);
  DropPageCache(dir.string());
  // tmpfs keeps its pages (they are the file); elsewhere the written pages
  // leave the cache, so that the warm-up below has something to bring back.
  if (!OnTmpfs(dir)) {
    const auto [resident, pages] = ResidentPages(dir / "a.distcp");
    EXPECT_LT(resident, pages / 2);
  }
  EXPECT_EQ(WarmPageCache(dir.string()), (int64_t{8} << 20) + 3 + 100);
  const auto [resident, pages] = ResidentPages(dir / "a.distcp");
  EXPECT_EQ(resident, pages);
}

TEST(PageCacheTest, AMissingDirectoryIsNoError) {
  EXPECT_EQ(WarmPageCache("/nonexistent/dcp-page-cache"), 0);
  DropPageCache("/nonexistent/dcp-page-cache");
}

}  // namespace
}  // namespace dcp
