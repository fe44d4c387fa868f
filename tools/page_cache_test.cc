#include "tools/page_cache.h"

#include <sys/vfs.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "io/testing/page_residency.h"

namespace dcp {
namespace {

namespace fs = std::filesystem;

constexpr long kTmpfsMagic = 0x01021994;

void WriteFile(const fs::path& path, size_t size) {
  std::ofstream out(path, std::ios::binary);
  std::string bytes(size, 'x');
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
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
    const testing::Residency r =
        testing::PageResidency((dir / "a.distcp").string());
    EXPECT_LT(r.resident, r.pages / 2);
  }
  EXPECT_EQ(WarmPageCache(dir.string()), (int64_t{8} << 20) + 3 + 100);
  const testing::Residency r =
      testing::PageResidency((dir / "a.distcp").string());
  EXPECT_EQ(r.resident, r.pages);
}

TEST(PageCacheTest, AMissingDirectoryIsNoError) {
  EXPECT_EQ(WarmPageCache("/nonexistent/dcp-page-cache"), 0);
  DropPageCache("/nonexistent/dcp-page-cache");
}

}  // namespace
}  // namespace dcp
