// A small state to save and load in storage tests (tensors of several dtypes
// and shapes, including 0-d and empty ones, plus byte values), with helpers
// that save it and check a load bit for bit.
#ifndef DCP_IO_TESTING_SAMPLE_STATE_H_
#define DCP_IO_TESTING_SAMPLE_STATE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/tensor.h"
#include "io/file_system_storage.h"
#include "io/testing/fake_planners.h"

namespace dcp::testing {

struct SampleState {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> bytes;

  // Values are a function of `seed`.
  static SampleState Make(uint32_t seed);

  FakeSavePlanner SavePlanner() const;
  // Registers fresh zeroed destinations for every tensor with `planner`.
  std::map<std::string, Tensor> Destinations(FakeLoadPlanner& planner) const;
};

// A new empty directory under $TEST_TMPDIR.
std::string NewTestDir(const std::string& name);

// The sorted entry names of `dir`.
std::vector<std::string> ListNames(const std::string& dir);

// Flips one bit of the byte at `offset` of the file at `path`.
void FlipByte(const std::string& path, int64_t offset);

// Saves `sample` into `dir` with a FileSystemWriter.
absl::Status SaveSample(const std::string& dir, const SampleState& sample,
                        FileSystemWriterOptions options = {},
                        bool abort_on_failure = true);

// Loads `dir` into fresh destinations; OK only if the load succeeds and
// every tensor and byte value equals `sample`'s (kInternal naming the first
// difference otherwise).
absl::Status LoadAndCompare(const std::string& dir, const SampleState& sample,
                            FileSystemReaderOptions options = {});

}  // namespace dcp::testing

#endif  // DCP_IO_TESTING_SAMPLE_STATE_H_
