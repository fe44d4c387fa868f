// Helpers shared by the cross-component tests: temporary directories under
// $TEST_TMPDIR, seeded tensors, and directory listings.
#ifndef DCP_TESTS_TEST_UTIL_H_
#define DCP_TESTS_TEST_UTIL_H_

#include <cstdint>
#include <set>
#include <string>

#include "core/tensor.h"

namespace dcp::testing {

// A fresh, empty directory under $TEST_TMPDIR (or /tmp) named after `tag`.
std::string MakeTempDir(const std::string& tag);

// A host tensor of `dtype`/`sizes` whose bytes are a function of `seed`.
Tensor SeededTensor(DType dtype, Shape sizes, uint64_t seed);

// Names of the regular files directly in `dir`, sorted.
std::set<std::string> ListFiles(const std::string& dir);

}  // namespace dcp::testing

#endif  // DCP_TESTS_TEST_UTIL_H_
