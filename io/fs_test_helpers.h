// Test helpers shared by the FileSystemWriter/Reader tests
// (file_system_storage_test.cc, fs_directory_test.cc): what a checkpoint
// directory holds, and saves and loads of a SampleState.
#ifndef DCP_IO_FS_TEST_HELPERS_H_
#define DCP_IO_FS_TEST_HELPERS_H_

#include <cstdint>
#include <cstring>
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

// A resharding case: `full`, a 4x6 int32 tensor, saved as two row shards of
// "w" (rows 0-1 and 2-3), loaded as its column block [:, 1:4] (destination
// index ("w", {0, 1}), one read item from each shard).
struct RowShardedColumnBlock {
  Tensor full = ::dcp::testing::PatternTensor(DType::kI32, {4, 6}, 3);

  // Adds the two row shards to `save`.
  void AddShards(::dcp::testing::FakeSavePlanner& save) const {
    const auto* src = static_cast<const int32_t*>(full.data());
    for (int64_t row : {0, 2}) {
      Tensor shard = Tensor::Empty(DType::kI32, {2, 6});
      std::memcpy(shard.data(), src + row * 6, 2 * 6 * 4);
      save.AddShard("w", {4, 6}, {row, 0}, shard);
    }
  }
  // The read item that copies shard `row`'s part of the block.
  static ReadItem BlockItem(int64_t row) {
    ReadItem item;
    item.storage_index = MetadataIndex("w", Shape{row, 0});
    item.storage_offsets = {0, 1};
    item.dest_index = MetadataIndex("w", Shape{0, 1});
    item.dest_offsets = {row, 0};
    item.lengths = {2, 3};
    return item;
  }
  // Expects the 4x3 `block` to hold full[:, 1:4].
  void ExpectBlock(const Tensor& block) const {
    const auto* src = static_cast<const int32_t*>(full.data());
    const auto* got = static_cast<const int32_t*>(block.data());
    for (int r = 0; r < 4; ++r) {
      for (int c = 0; c < 3; ++c) {
        ASSERT_EQ(got[r * 3 + c], src[r * 6 + c + 1]) << r << "," << c;
      }
    }
  }
};

}  // namespace dcp::fs_testing

#endif  // DCP_IO_FS_TEST_HELPERS_H_
