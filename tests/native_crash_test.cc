// The native format's durability under a crash at every step of a save:
// a FileSystemWriter save over a previous checkpoint (and into an empty
// directory) dies at each of its file-system calls in turn (every write,
// fsync, rename, unlink and directory fsync of the data files and the
// commit), then the power goes (what was not fsynced is dropped). The
// directory must then load as the previous checkpoint or the new one, byte
// for byte, never neither; and what is left besides the loaded checkpoint's
// files is only what the next save removes as orphans (RemoveOrphans), after
// which exactly the loaded checkpoint's files remain.
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/state_dict.h"
#include "engine/checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/fault_injection.h"
#include "io/file_system_storage.h"
#include "io/metadata_format.h"
#include "io/testing/fake_planners.h"
#include "tests/crash_points.h"
#include "tests/test_util.h"

namespace dcp {
namespace {

using ::dcp::testing::CrashPoint;
using ::dcp::testing::ForEachCrashPoint;
using ::dcp::testing::ListFiles;
using ::dcp::testing::MakeTempDir;
using ::dcp::testing::SeededTensor;

// A checkpoint's content: whole tensors (one of them, "z", compressible
// and large enough to go through a writer's extensions), and one tensor
// saved as two chunks (two items, and with one file per item two files,
// for it).
struct Content {
  StateDict tensors;
  Tensor sharded;

  static Content Make(uint64_t seed) {
    Content c;
    c.tensors["a"] = SeededTensor(DType::kF32, {64, 33}, seed);
    c.tensors["b"] = SeededTensor(DType::kBF16, {4097}, seed + 1);
    c.tensors["c"] = SeededTensor(DType::kI64, {3}, seed + 2);
    c.sharded = SeededTensor(DType::kU8, {6, 1000}, seed + 3);
    Tensor z = Tensor::Empty(DType::kF32, {40000});
    auto* values = static_cast<float*>(z.data());
    for (int64_t i = 0; i < 40000; ++i) {
      values[i] = static_cast<float>((i + seed) % 5);
    }
    c.tensors["z"] = std::move(z);
    return c;
  }
};

testing::FakeSavePlanner PlannerOf(const Content& content) {
  testing::FakeSavePlanner planner;
  for (const auto& [fqn, value] : content.tensors) {
    planner.AddTensor(fqn, value.tensor());
  }
  const Shape global = content.sharded.sizes();
  const Shape half = {global[0] / 2, global[1]};
  for (int64_t part = 0; part < 2; ++part) {
    Tensor chunk = Tensor::Empty(DType::kU8, half);
    const int64_t bytes = chunk.nbytes();
    std::memcpy(
        chunk.data(),
        static_cast<const std::byte*>(content.sharded.data()) + part * bytes,
        bytes);
    planner.AddShard("sharded", global, {part * half[0], 0}, std::move(chunk));
  }
  return planner;
}

// Whether `dir` loads as `want`, every byte.
bool LoadsAs(const std::string& dir, const Content& want) {
  StateDict loaded;
  for (const auto& [fqn, value] : want.tensors) {
    loaded[fqn] = Tensor::Empty(value.tensor().dtype(), value.tensor().sizes());
  }
  loaded["sharded"] = Tensor::Empty(DType::kU8, want.sharded.sizes());
  FileSystemReaderOptions options;
  options.direct_io = false;
  FileSystemReader reader(dir, options);
  LoadOptions load;
  load.storage_reader = &reader;
  if (!Load(loaded, load).ok()) return false;
  for (const auto& [fqn, value] : want.tensors) {
    if (!value.tensor().BytesEqual(loaded.at(fqn).tensor())) return false;
  }
  return want.sharded.BytesEqual(loaded.at("sharded").tensor());
}

// The files of the checkpoint committed in `dir`: its metadata file and the
// data files the metadata names; empty without a committed checkpoint.
std::set<std::string> CommittedFiles(const std::string& dir) {
  FileSystemReader reader(dir);
  absl::StatusOr<Metadata> metadata = reader.ReadMetadata();
  if (!metadata.ok()) return {};
  std::set<std::string> files = {kMetadataFileName};
  for (const auto& [index, info] : metadata->storage_data) {
    files.insert(info.relative_path);
  }
  return files;
}

struct Layout {
  std::string name;
  bool single_file_per_rank;
  int thread_count;
  bool previous;  // A checkpoint is there before the save.
  // FileSystemWriterOptions::extensions, as ParseCompression reads it.
  std::string compression = "none";
};

class NativeCrashTest : public ::testing::TestWithParam<Layout> {};

TEST_P(NativeCrashTest, EveryStepLeavesTheOldOrTheNewCheckpointAndNoStrays) {
  const Layout& layout = GetParam();
  const Content old_content = Content::Make(1);
  const Content new_content = Content::Make(100);
  FileSystemWriterOptions options;
  options.direct_io = false;  // The crash model tracks the page cache.
  options.single_file_per_rank = layout.single_file_per_rank;
  options.thread_count = layout.thread_count;
  options.io_mode = IoMode::kPosix;
  options.extensions = *ParseCompression(layout.compression);

  std::string dir;
  std::set<std::string> old_files;
  int old_seen = 0, new_seen = 0, empty_seen = 0;
  int64_t save_calls = 0;  // Of the save that completed.
  auto prepare = [&] {
    dir = MakeTempDir(absl::StrCat("native_crash_", layout.name));
    if (!layout.previous) return;
    FileSystemWriter writer(dir, options);
    testing::FakeSavePlanner planner = PlannerOf(old_content);
    ASSERT_TRUE(testing::SaveOneRank(writer, planner).ok());
    old_files = ListFiles(dir);
    if (layout.compression != "none") {  // "z" went through zstd.
      FileSystemReader reader(dir);
      absl::StatusOr<Metadata> metadata = reader.ReadMetadata();
      ASSERT_TRUE(metadata.ok());
      const StorageInfo& z =
          metadata->storage_data.at(MetadataIndex("z", Shape{0}));
      ASSERT_FALSE(z.extensions.empty());
      ASSERT_LT(z.length, z.raw_length);
    }
  };
  auto save = [&](FileSystemBase& fs) {
    FileSystemWriterOptions faulty = options;
    faulty.file_system = &fs;
    FileSystemWriter writer(dir, faulty);
    testing::FakeSavePlanner planner = PlannerOf(new_content);
    // No Abort: the process is gone.
    return testing::SaveOneRank(writer, planner, /*abort_on_failure=*/false);
  };
  auto check = [&](const CrashPoint& point) {
    const std::string where =
        absl::StrCat(layout.name, ": crash at call ", point.call, " (",
                     point.status.ToString(), ")");
    if (point.completed) {
      ASSERT_TRUE(point.status.ok()) << where;
      save_calls = point.file_system->calls(FaultOp::kAny);
      // Every kind of step was a crash point on the way.
      for (FaultOp op :
           {FaultOp::kOpen, FaultOp::kWrite, FaultOp::kSync, FaultOp::kClose,
            FaultOp::kRename, FaultOp::kSyncDir}) {
        EXPECT_GT(point.file_system->calls(op), 0) << FaultOpName(op);
      }
      if (layout.previous) {
        EXPECT_GT(point.file_system->calls(FaultOp::kUnlink), 0);
      }
    }
    const std::set<std::string> left = ListFiles(dir);
    const bool is_old = layout.previous && LoadsAs(dir, old_content);
    const bool is_new = LoadsAs(dir, new_content);
    const std::set<std::string> committed = CommittedFiles(dir);
    if (is_old) {
      ++old_seen;
      EXPECT_FALSE(point.completed) << where;
      EXPECT_EQ(committed, old_files) << where;
    } else if (is_new) {
      ++new_seen;
    } else {
      // Only a first save may leave nothing, and then no metadata.
      ASSERT_FALSE(layout.previous) << where << " left neither checkpoint";
      EXPECT_TRUE(committed.empty()) << where;
      ++empty_seen;
    }
    // Besides the committed files only orphans are left, and the next
    // save's cleanup removes exactly them.
    const OrphanCleanup cleanup = RemoveOrphans(LocalFileSystem(), dir);
    EXPECT_TRUE(cleanup.status.ok()) << where << ": " << cleanup.status;
    EXPECT_TRUE(cleanup.left.empty()) << where;
    std::set<std::string> expected_left = committed;
    expected_left.insert(cleanup.removed.begin(), cleanup.removed.end());
    EXPECT_EQ(left, expected_left) << where;
    EXPECT_EQ(ListFiles(dir), committed) << where;
  };
  const int64_t points = ForEachCrashPoint(prepare, save, check);
  // A crash at each call of the save, then the save that completed.
  EXPECT_EQ(points, save_calls + 1);
  EXPECT_GT(points, 15);
  EXPECT_GT(new_seen, 0);
  if (layout.previous) {
    EXPECT_GT(old_seen, 0);
  } else {
    EXPECT_GT(empty_seen, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, NativeCrashTest,
    ::testing::Values(Layout{"one_file", true, 1, true},
                      Layout{"file_per_item_two_threads", false, 2, true},
                      Layout{"first_save", true, 1, false},
                      Layout{"zstd", true, 2, true, "zstd"}),
    [](const ::testing::TestParamInfo<Layout>& info) {
      return info.param.name;
    });

}  // namespace
}  // namespace dcp
