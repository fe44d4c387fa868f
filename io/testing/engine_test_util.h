// Helpers shared by the I/O engine tests (io/io_engine_test.cc,
// io/io_engine_behaviour_test.cc).
#ifndef DCP_IO_TESTING_ENGINE_TEST_UTIL_H_
#define DCP_IO_TESTING_ENGINE_TEST_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "io/file_system.h"

namespace dcp::testing {

// A fresh path under TEST_TMPDIR (a counter keeps names apart).
inline std::string TestPath(const std::string& name) {
  static int counter = 0;
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name, "_", counter++);
}

// `size` pseudo-random bytes from `seed`.
inline std::vector<std::byte> Pattern(size_t size, uint32_t seed) {
  std::vector<std::byte> out(size);
  uint32_t state = seed * 2654435761u + 7;
  for (std::byte& b : out) {
    state = state * 1664525u + 1013904223u;
    b = static_cast<std::byte>(state >> 24);
  }
  return out;
}

// The whole file at `path`.
inline std::vector<std::byte> ReadWhole(const std::string& path) {
  std::unique_ptr<File> file = *LocalFileSystem().OpenForRead(path);
  std::vector<std::byte> out(*file->Size());
  EXPECT_EQ(*file->PRead(0, absl::MakeSpan(out)), out.size());
  return out;
}

}  // namespace dcp::testing

#endif  // DCP_IO_TESTING_ENGINE_TEST_UTIL_H_
