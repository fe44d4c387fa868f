#include "tests/test_util.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace dcp::testing {

namespace fs = std::filesystem;

std::string MakeTempDir(const std::string& tag) {
  static std::atomic<int> counter{0};
  const char* root = std::getenv("TEST_TMPDIR");
  fs::path dir = fs::path(root != nullptr ? root : "/tmp") /
                 absl::StrCat(tag, "-", ::getpid(), "-", counter++);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

Tensor SeededTensor(DType dtype, Shape sizes, uint64_t seed) {
  Tensor t = Tensor::Empty(dtype, std::move(sizes));
  auto* out = static_cast<unsigned char*>(t.data());
  uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (size_t i = 0; i < t.nbytes(); ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out[i] = static_cast<unsigned char>(x);
  }
  return t;
}

std::set<std::string> ListFiles(const std::string& dir) {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.is_regular_file()) names.insert(entry.path().filename());
  }
  return names;
}

}  // namespace dcp::testing
