// Test helpers shared by the FileSystemWriter/Reader tests
// (file_system_storage_test.cc, fs_directory_test.cc): what a checkpoint
// directory holds, and saves and loads of a SampleState.
#ifndef DCP_IO_FS_TEST_HELPERS_H_
#define DCP_IO_FS_TEST_HELPERS_H_

#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "io/file_system.h"
#include "io/file_system_storage.h"
#include "io/metadata_format.h"
#include "io/testing/fake_planners.h"
#include "io/testing/sample_state.h"

namespace dcp::fs_testing {

using Sample = ::dcp::testing::SampleState;
using ::dcp::testing::NewTestDir;

inline std::vector<std::string> List(const std::string& dir) {
  return ::dcp::testing::ListNames(dir);
}

// The entries of `dir` but the metadata file and a save's lock file.
inline std::vector<std::string> DataFiles(const std::string& dir) {
  std::vector<std::string> out;
  for (const std::string& name : List(dir)) {
    if (name != kMetadataFileName && name != kDirectoryLockFileName) {
      out.push_back(name);
    }
  }
  return out;
}

inline absl::Status Save(const std::string& dir, const Sample& sample,
                         FileSystemWriterOptions options = {}) {
  return ::dcp::testing::SaveSample(dir, sample, options);
}

// Loads `dir` into fresh destinations for `sample`'s tensors.
inline absl::Status LoadSample(const std::string& dir, const Sample& sample) {
  FileSystemReader reader(dir);
  ::dcp::testing::FakeLoadPlanner planner;
  sample.Destinations(planner);
  return ::dcp::testing::LoadOneRank(reader, planner);
}

// Loads `dir` and checks that it holds exactly `sample`'s bytes.
inline void ExpectLoads(const std::string& dir, const Sample& sample) {
  absl::Status status = ::dcp::testing::LoadAndCompare(dir, sample);
  EXPECT_TRUE(status.ok()) << status;
}

inline absl::StatusOr<Metadata> ReadMetadataOf(const std::string& dir) {
  return FileSystemReader(dir).ReadMetadata();
}

// The data files the committed metadata of `dir` names, sorted.
inline std::vector<std::string> CommittedDataFiles(const std::string& dir) {
  std::set<std::string> names;
  absl::StatusOr<Metadata> metadata = ReadMetadataOf(dir);
  if (metadata.ok()) {
    for (const auto& [index, info] : metadata->storage_data) {
      names.insert(info.relative_path);
    }
  }
  return {names.begin(), names.end()};
}

}  // namespace dcp::fs_testing

#endif  // DCP_IO_FS_TEST_HELPERS_H_
