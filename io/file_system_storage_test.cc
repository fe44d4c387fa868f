#include "io/file_system_storage.h"

#include <fcntl.h>
#include <linux/capability.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file_system.h"
#include "io/fs_layout.h"
#include "io/fs_test_helpers.h"
#include "io/io_engine.h"
#include "io/metadata_format.h"
#include "io/testing/fake_planners.h"
#include "io/testing/metadata_surgery.h"
#include "io/testing/page_residency.h"
#include "io/testing/sample_state.h"

namespace dcp {
namespace {

using ::dcp::testing::FakeLoadPlanner;
using ::dcp::testing::FakeSavePlanner;
using ::dcp::testing::FlipByte;
using ::dcp::testing::LoadOneRank;
using ::dcp::testing::PatternTensor;
using ::dcp::testing::SaveOneRank;
using ::dcp::testing::WholeItemLoadPlan;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsSupersetOf;
using ::testing::SizeIs;
using ::testing::UnorderedElementsAre;
using ::testing::UnorderedElementsAreArray;

using ::dcp::fs_testing::DataFiles;
using ::dcp::fs_testing::ExpectLoads;
using ::dcp::fs_testing::List;
using ::dcp::fs_testing::LoadSample;
using ::dcp::fs_testing::NewTestDir;
using ::dcp::fs_testing::ReadMetadataOf;
using ::dcp::fs_testing::Sample;
using ::dcp::fs_testing::Save;

struct Layout {
  bool single_file_per_rank;
  int thread_count;
  IoMode mode;
  bool direct_io;
};

class RoundTripTest : public ::testing::TestWithParam<Layout> {};

TEST_P(RoundTripTest, EveryByteComesBackAndLargeTensorsAre4KiBAligned) {
  const std::string dir = NewTestDir("roundtrip");
  FileSystemWriterOptions options;
  options.single_file_per_rank = GetParam().single_file_per_rank;
  options.thread_count = GetParam().thread_count;
  options.io_mode = GetParam().mode;
  options.direct_io = GetParam().direct_io;
  options.checksum_block_size = 1000;  // Several blocks for "big".
  const Sample sample = Sample::Make(7);
  ASSERT_TRUE(Save(dir, sample, options).ok());
  for (bool direct_load : {false, true}) {
    FileSystemReaderOptions reader_options;
    reader_options.io_mode = GetParam().mode;
    reader_options.direct_io = direct_load;
    reader_options.thread_count = GetParam().thread_count;
    absl::Status loaded =
        ::dcp::testing::LoadAndCompare(dir, sample, reader_options);
    EXPECT_TRUE(loaded.ok()) << "direct_load=" << direct_load << ": " << loaded;
  }

  absl::StatusOr<Metadata> metadata = ReadMetadataOf(dir);
  ASSERT_TRUE(metadata.ok()) << metadata.status();
  EXPECT_EQ(metadata->version, kFormatVersion);
  EXPECT_EQ(metadata->checksum_block_size, 1000);
  EXPECT_THAT(metadata->storage_data, SizeIs(9));
  for (const auto& [index, info] : metadata->storage_data) {
    // Tensors over 64 KiB start on 4 KiB boundaries; smaller items are
    // packed 64 bytes apart (docs/FORMAT.md section 2).
    if (index.offset.has_value()) {
      EXPECT_EQ(info.offset % (info.length > (64 << 10) ? 4096 : 64), 0)
          << index.ToString();
    }
  }
  const StorageInfo& big =
      metadata->storage_data.at(MetadataIndex("big", Shape{0}));
  EXPECT_EQ(big.length, 6000);
  EXPECT_THAT(big.block_checksums, SizeIs(6));
  const size_t expected_files =
      options.single_file_per_rank ? options.thread_count : 9;
  EXPECT_THAT(DataFiles(dir), SizeIs(expected_files));
  for (const std::string& name : DataFiles(dir)) {
    EXPECT_THAT(name, AllOf(HasSubstr("__0_"), HasSubstr(".distcp")));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, RoundTripTest,
    ::testing::Values(Layout{true, 1, IoMode::kAuto, false},
                      Layout{true, 3, IoMode::kAuto, false},
                      Layout{false, 2, IoMode::kAuto, false},
                      Layout{true, 1, IoMode::kPosix, false},
                      Layout{true, 2, IoMode::kAuto, true},
                      Layout{false, 1, IoMode::kPosix, true}));

TEST(FileSystemStorageTest, ReshardsBoxesAndReadsSharedItemsForEachUse) {
  // Two row shards loaded as their column block [:, 1:4] (two boxes, one
  // from each shard) and, a second time, whole.
  const std::string dir = NewTestDir("reshard");
  const fs_testing::RowShardedColumnBlock w;
  FakeSavePlanner save;
  w.AddShards(save);
  FileSystemWriter writer(dir);
  ASSERT_TRUE(SaveOneRank(writer, save).ok());

  FakeLoadPlanner load;
  Tensor block = Tensor::Empty(DType::kI32, {4, 3});
  Tensor whole = Tensor::Empty(DType::kI32, {4, 6});
  load.SetDestination(MetadataIndex("w", Shape{0, 1}), block);
  load.SetDestination(MetadataIndex("w", Shape{0, 0}), whole);
  LoadPlan plan;
  for (int64_t row : {0, 2}) {
    ReadItem item = fs_testing::RowShardedColumnBlock::BlockItem(row);
    plan.items.push_back(item);
    item.storage_offsets = {0, 0};
    item.dest_index = MetadataIndex("w", Shape{0, 0});
    item.lengths = {2, 6};
    plan.items.push_back(item);
  }
  FileSystemReader reader(dir);
  absl::Status status = LoadOneRank(reader, load, &plan);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(whole.BytesEqual(w.full));
  w.ExpectBlock(block);
  EXPECT_EQ(load.commits(), 4);
}

TEST(FileSystemStorageTest, NoMetadataMeansNoCheckpoint) {
  const std::string dir = NewTestDir("uncommitted");
  FileSystemWriter writer(dir);
  FakeSavePlanner planner = Sample::Make(1).SavePlanner();
  ASSERT_TRUE(writer.SetUp(true, 0, false).ok());
  std::vector<SavePlan> plans =
      *writer.PrepareGlobalPlan({*planner.CreateLocalPlan()});
  ASSERT_TRUE(writer.WriteData(plans[0], planner).Wait().ok());
  // The data file and the coordinator's marker of the save in progress.
  EXPECT_THAT(
      DataFiles(dir),
      UnorderedElementsAre(::testing::StartsWith("__0_"),
                           internal_fs::SaveMarkerFileName(writer.save_id())));

  absl::StatusOr<Metadata> metadata = ReadMetadataOf(dir);
  EXPECT_EQ(metadata.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(metadata.status().message(),
              HasSubstr(absl::StrCat("no committed checkpoint in ", dir)));
  writer.Abort();
  EXPECT_THAT(List(dir), SizeIs(0));
}

TEST(FileSystemStorageTest, AnAbsentDirectoryIsNamedAsAbsent) {
  const std::string dir = NewTestDir("absent") + "/not-there";
  absl::StatusOr<Metadata> metadata = ReadMetadataOf(dir);
  EXPECT_EQ(metadata.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(metadata.status().message(),
              HasSubstr(absl::StrCat("no checkpoint at ", dir,
                                     ": the directory does not exist")));
}

template <typename Options>
concept HasCacheStagedStateDict = requires(Options options) {
  options.cache_staged_state_dict;
};

// The writer stages nothing (AsyncSave's stager does, and
// StagingOptions::cache_staged_state_dict keeps its memory): an option of
// that name here would be read by nothing.
TEST(FileSystemStorageTest, WriterOptionsHaveNoStagingCache) {
  struct WithCache {
    bool cache_staged_state_dict;
  };
  static_assert(HasCacheStagedStateDict<WithCache>);
  EXPECT_FALSE(HasCacheStagedStateDict<FileSystemWriterOptions>);
}

// A rank-local save writes DIR/rank-R and leaves the writer's path alone;
// the next Reset ends it. The reader finds rank-local checkpoints by rank
// 0's and refuses a directory that also holds its own checkpoint.
TEST(FileSystemStorageTest, RankLocalLayoutLeavesThePathAndIsDetected) {
  const std::string dir = NewTestDir("rank-local");
  const Sample sample = Sample::Make(3);
  FileSystemWriter writer(dir);
  for (int rank : {1, 0}) {
    FakeSavePlanner planner = sample.SavePlanner();
    ASSERT_TRUE(SaveOneRank(writer, planner, true, rank).ok());
    EXPECT_EQ(writer.path(), dir);
    EXPECT_EQ(writer.directory(), RankLocalDirectory(dir, rank));
  }
  EXPECT_THAT(List(dir), ElementsAre("rank-0", "rank-1"));
  EXPECT_EQ(RankLocalDirectory(dir, 1), dir + "/rank-1");

  FileSystemReader reader(dir);
  absl::StatusOr<bool> rank_local = reader.DetectRankLocal(1);
  ASSERT_TRUE(rank_local.ok()) << rank_local.status();
  EXPECT_TRUE(*rank_local);
  EXPECT_EQ(reader.path(), dir);
  EXPECT_EQ(reader.directory(), dir + "/rank-1");
  FakeLoadPlanner load_planner;
  sample.Destinations(load_planner);
  EXPECT_TRUE(LoadOneRank(reader, load_planner).ok());

  // Reset ends the selection: this save is the directory's own, which a
  // directory holding rank-local checkpoints refuses (naming them).
  FakeSavePlanner planner = sample.SavePlanner();
  absl::Status refused = SaveOneRank(writer, planner);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(refused.message(), HasSubstr(dir + "/rank-0/.metadata"));
  EXPECT_EQ(writer.directory(), dir);
  EXPECT_THAT(List(dir), ElementsAre("rank-0", "rank-1"));
  // Both layouts, put together by hand: the reader refuses to guess.
  std::filesystem::copy_file(dir + "/rank-0/.metadata", dir + "/.metadata");
  ASSERT_TRUE(reader.Reset("").ok());
  EXPECT_EQ(reader.directory(), dir);
  rank_local = reader.DetectRankLocal(1);
  EXPECT_EQ(rank_local.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(rank_local.status().message(),
              AllOf(HasSubstr(dir + "/.metadata"),
                    HasSubstr(dir + "/rank-0/.metadata")));
}

// A rank-R directory that is a symbolic link is neither saved into (the
// save would clean up "orphans" among files outside the checkpoint) nor
// loaded from.
TEST(FileSystemStorageTest, RankLocalDirectoryBehindASymlinkIsRefused) {
  const std::string dir = NewTestDir("rank-local-link");
  const std::string outside = NewTestDir("rank-local-victim");
  for (const char* name : {"__0_0123456789abcdef_0.distcp", "notes.txt"}) {
    std::ofstream(outside + "/" + name) << "x";
  }
  std::filesystem::create_directory_symlink(outside,
                                            RankLocalDirectory(dir, 0));
  const Sample sample = Sample::Make(3);
  FileSystemWriter writer(dir);
  FakeSavePlanner planner = sample.SavePlanner();
  absl::Status status = SaveOneRank(writer, planner, true, 0);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr(dir + "/rank-0"), HasSubstr("symbolic link")));
  EXPECT_THAT(List(outside),
              ElementsAre("__0_0123456789abcdef_0.distcp", "notes.txt"));

  // Rank 1's directory moved away and linked back: rank 0 loads, rank 1
  // is refused.
  const std::string saved = NewTestDir("rank-local-saved");
  FileSystemWriter saving(saved);
  for (int rank : {0, 1}) {
    FakeSavePlanner p = sample.SavePlanner();
    ASSERT_TRUE(SaveOneRank(saving, p, true, rank).ok());
  }
  const std::string moved = NewTestDir("rank-local-moved") + "/rank-1";
  std::filesystem::rename(RankLocalDirectory(saved, 1), moved);
  std::filesystem::create_directory_symlink(moved,
                                            RankLocalDirectory(saved, 1));
  FileSystemReader reader(saved);
  EXPECT_TRUE(reader.DetectRankLocal(0).ok());
  ASSERT_TRUE(reader.Reset("").ok());
  absl::StatusOr<bool> detected = reader.DetectRankLocal(1);
  EXPECT_EQ(detected.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(detected.status().message(), HasSubstr("symbolic link"));
}

TEST(FileSystemStorageTest, OverwriteKeepsOldCheckpointUntilCommit) {
  const std::string dir = NewTestDir("overwrite");
  const Sample old_sample = Sample::Make(1);
  ASSERT_TRUE(Save(dir, old_sample).ok());
  const std::vector<std::string> old_files = DataFiles(dir);

  const Sample new_sample = Sample::Make(2);
  FileSystemWriter writer(dir);
  FakeSavePlanner planner = new_sample.SavePlanner();
  ASSERT_TRUE(writer.Reset("").ok());
  ASSERT_TRUE(writer.SetUp(true, 0, false).ok());
  auto global = *planner.CreateGlobalPlan({*planner.CreateLocalPlan()});
  std::vector<SavePlan> plans = *writer.PrepareGlobalPlan(global.first);
  absl::StatusOr<std::vector<WriteResult>> results =
      writer.WriteData(plans[0], planner).Wait();
  ASSERT_TRUE(results.ok()) << results.status();
  // New data is written, not committed: the old checkpoint loads unchanged.
  ExpectLoads(dir, old_sample);
  EXPECT_THAT(DataFiles(dir), IsSupersetOf(old_files));

  ASSERT_TRUE(writer.Finish(global.second, {*results}).ok());
  // Committed: the new checkpoint loads, old files are still there until
  // MarkCommitted.
  ExpectLoads(dir, new_sample);
  EXPECT_THAT(DataFiles(dir), IsSupersetOf(old_files));
  ASSERT_TRUE(writer.MarkCommitted().ok());
  ExpectLoads(dir, new_sample);
  std::vector<std::string> new_files;
  for (const WriteResult& r : *results) {
    new_files.push_back(r.storage_data.relative_path);
  }
  std::sort(new_files.begin(), new_files.end());
  new_files.erase(std::unique(new_files.begin(), new_files.end()),
                  new_files.end());
  EXPECT_THAT(DataFiles(dir), UnorderedElementsAreArray(new_files));
  for (const std::string& old : old_files) {
    EXPECT_THAT(new_files, ::testing::Not(::testing::Contains(old)));
  }
}

TEST(FileSystemStorageTest, OverwriteFalseRefusesCommittedCheckpoint) {
  const std::string dir = NewTestDir("no_overwrite");
  const Sample sample = Sample::Make(1);
  FileSystemWriterOptions options;
  options.overwrite = false;
  ASSERT_TRUE(Save(dir, sample, options).ok());  // Empty dir: allowed.
  const std::vector<std::string> before = List(dir);
  absl::Status status = Save(dir, Sample::Make(2), options);
  EXPECT_EQ(status.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(status.message(), AllOf(HasSubstr(dir), HasSubstr("overwrite")));
  EXPECT_EQ(List(dir), before);
  ExpectLoads(dir, sample);
}

// Runs `fn` in a child process without CAP_DAC_OVERRIDE (so permission bits
// bind even for root) and returns its status code and message.
std::pair<int, std::string> RunWithoutDacOverride(
    const std::function<absl::Status()>& fn) {
  int pipe_fds[2];
  EXPECT_EQ(::pipe(pipe_fds), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(pipe_fds[0]);
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct data[2] = {};
    if (::syscall(SYS_capget, &header, data) == 0) {
      data[0].effective &= ~(1u << CAP_DAC_OVERRIDE);
      data[0].effective &= ~(1u << CAP_DAC_READ_SEARCH);
      ::syscall(SYS_capset, &header, data);
    }
    absl::Status status = fn();
    std::string out =
        absl::StrCat(static_cast<int>(status.code()), " ", status.message());
    (void)!::write(pipe_fds[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::string out;
  char buffer[512];
  ssize_t n;
  while ((n = ::read(pipe_fds[0], buffer, sizeof(buffer))) > 0) {
    out.append(buffer, n);
  }
  ::close(pipe_fds[0]);
  int wstatus = 0;
  ::waitpid(pid, &wstatus, 0);
  const size_t space = out.find(' ');
  return {std::atoi(out.substr(0, space).c_str()),
          space == std::string::npos ? "" : out.substr(space + 1)};
}

TEST(FileSystemStorageTest, ReadOnlyDirectoryIsPermissionDeniedNamingPath) {
  const std::string dir = NewTestDir("readonly");
  ASSERT_EQ(::chmod(dir.c_str(), 0555), 0);
  auto [code, message] =
      RunWithoutDacOverride([&] { return Save(dir, Sample::Make(1)); });
  ::chmod(dir.c_str(), 0755);
  EXPECT_EQ(code, static_cast<int>(absl::StatusCode::kPermissionDenied))
      << message;
  EXPECT_THAT(message, HasSubstr(dir));
  EXPECT_THAT(List(dir), SizeIs(0));
}

// Where the saved checkpoint in `dir` keeps the Sample's item "big": its
// storage entry and the data file's path.
std::pair<StorageInfo, std::string> WhereBigLies(const std::string& dir) {
  const Metadata metadata = *ReadMetadataOf(dir);
  const StorageInfo info =
      metadata.storage_data.at(MetadataIndex("big", Shape{0}));
  return {info, JoinPath(dir, info.relative_path)};
}

TEST(FileSystemStorageTest, FlippedByteIsDataLossNamingTensorFileOffset) {
  const std::string dir = NewTestDir("corrupt");
  const Sample sample = Sample::Make(4);
  FileSystemWriterOptions options;
  options.checksum_block_size = 1024;
  ASSERT_TRUE(Save(dir, sample, options).ok());
  const auto [info, file] = WhereBigLies(dir);
  FlipByte(file, info.offset + 2 * 1024 + 5);  // In the third block.

  absl::Status status = LoadSample(dir, sample);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("big"), HasSubstr(file),
                    HasSubstr(absl::StrCat("offset ", info.offset + 2048))));
}

TEST(FileSystemStorageTest, TruncatedDataFileIsDataLoss) {
  const std::string dir = NewTestDir("truncated");
  const Sample sample = Sample::Make(5);
  ASSERT_TRUE(Save(dir, sample).ok());
  const auto [info, file] = WhereBigLies(dir);
  ASSERT_EQ(::truncate(file.c_str(), info.offset + 10), 0);

  for (bool direct : {false, true}) {
    FileSystemReaderOptions options;
    options.direct_io = direct;
    absl::Status status = ::dcp::testing::LoadAndCompare(dir, sample, options);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << direct;
    EXPECT_THAT(status.message(), AllOf(HasSubstr("truncated"), HasSubstr(file),
                                        HasSubstr("big")));
  }
}

TEST(FileSystemStorageTest, MissingDataFileIsDataLossNamingFileAndItem) {
  const std::string dir = NewTestDir("missing_data_file");
  const Sample sample = Sample::Make(5);
  ASSERT_TRUE(Save(dir, sample).ok());
  const auto [info, file] = WhereBigLies(dir);
  ASSERT_EQ(::unlink(file.c_str()), 0);
  absl::Status status = ::dcp::testing::LoadAndCompare(dir, sample);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("reading big"),
                    HasSubstr("data file " + file + " is missing"),
                    HasSubstr("the checkpoint is incomplete")));
}

TEST(FileSystemStorageTest,
     ACheckpointReplacedDuringALoadIsAbortedNotDataLoss) {
  const std::string dir = NewTestDir("replaced_during_load");
  const Sample sample = Sample::Make(5);
  for (const bool remove : {false, true}) {
    ASSERT_TRUE(Save(dir, sample).ok());
    FileSystemReader reader(dir);
    FakeLoadPlanner planner;
    sample.Destinations(planner);
    absl::StatusOr<Metadata> metadata = reader.ReadMetadata();
    ASSERT_TRUE(metadata.ok()) << metadata.status();
    ASSERT_TRUE(reader.SetUp(*metadata, true).ok());
    // Between the read of the metadata and of the data, another save's
    // commit replaces the data files (or the checkpoint is removed).
    if (remove) {
      std::filesystem::remove_all(dir);
    } else {
      ASSERT_TRUE(Save(dir, Sample::Make(6)).ok());
    }
    absl::Status status =
        reader.ReadData(WholeItemLoadPlan(*metadata), planner).Wait();
    EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
    EXPECT_THAT(
        status.message(),
        AllOf(HasSubstr(absl::StrCat(
                  "the checkpoint in ", dir,
                  remove ? " was removed" : " was replaced by another save",
                  " while this load read it")),
              HasSubstr("is missing"), HasSubstr("load again")));
    std::filesystem::create_directories(dir);
  }
  // A file missing under the metadata that is still committed is damage.
  ASSERT_TRUE(Save(dir, sample).ok());
  ASSERT_EQ(::unlink(WhereBigLies(dir).second.c_str()), 0);
  EXPECT_EQ(::dcp::testing::LoadAndCompare(dir, sample).code(),
            absl::StatusCode::kDataLoss);
}

TEST(FileSystemStorageTest, ASaveRefusesADirectoryOfTorchsCheckpointFormat) {
  const std::string dir = NewTestDir("torch_dcp_dir");
  // torch.distributed.checkpoint's files: a pickled .metadata and its data.
  std::ofstream(dir + "/.metadata", std::ios::binary)
      << std::string("\x80\x04\x95 not dcp", 12);
  std::ofstream(dir + "/__0_0.distcp", std::ios::binary) << "torch data";
  absl::Status saved = Save(dir, Sample::Make(1));
  EXPECT_EQ(saved.code(), absl::StatusCode::kFailedPrecondition) << saved;
  EXPECT_THAT(saved.message(),
              AllOf(HasSubstr(dir + " holds a checkpoint written by "
                                    "torch.distributed.checkpoint"),
                    HasSubstr("torch_dcp_to_dcp")));
  EXPECT_THAT(List(dir), UnorderedElementsAre(".metadata", "__0_0.distcp"));
  // Damaged metadata of dcp's own is replaced as before.
  std::ofstream(dir + "/.metadata", std::ios::binary) << "DCPgarbage";
  std::filesystem::remove(dir + "/__0_0.distcp");
  EXPECT_TRUE(Save(dir, Sample::Make(1)).ok());
  ExpectLoads(dir, Sample::Make(1));
}

TEST(FileSystemStorageTest, GarbageMetadataIsDataLoss) {
  const std::string dir = NewTestDir("garbage");
  ASSERT_TRUE(Save(dir, Sample::Make(1)).ok());
  std::ofstream(JoinPath(dir, kMetadataFileName), std::ios::trunc)
      << "garbage that is not a checkpoint";
  absl::StatusOr<Metadata> metadata = ReadMetadataOf(dir);
  EXPECT_EQ(metadata.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(metadata.status().message(),
              HasSubstr(JoinPath(dir, kMetadataFileName)));
}

TEST(FileSystemStorageTest, AbortLeavesExactlyTheFilesThatWereThere) {
  const std::string dir = NewTestDir("abort");
  const Sample old_sample = Sample::Make(1);
  ASSERT_TRUE(Save(dir, old_sample).ok());
  std::ofstream(JoinPath(dir, "user_notes.txt")) << "keep me";
  const std::vector<std::string> before = List(dir);

  FileSystemWriterOptions options;
  options.single_file_per_rank = false;
  FileSystemWriter writer(dir, options);
  FakeSavePlanner planner = Sample::Make(2).SavePlanner();
  ASSERT_TRUE(writer.Reset("").ok());
  ASSERT_TRUE(writer.SetUp(true, 0, false).ok());
  std::vector<SavePlan> plans =
      *writer.PrepareGlobalPlan({*planner.CreateLocalPlan()});
  ASSERT_TRUE(writer.WriteData(plans[0], planner).Wait().ok());
  EXPECT_GT(List(dir).size(), before.size());
  writer.Abort();
  writer.Abort();  // Idempotent.
  EXPECT_EQ(List(dir), before);
  ExpectLoads(dir, old_sample);
}

TEST(FileSystemStorageTest, DeviceTensorIsRejectedNamingIt) {
  const std::string dir = NewTestDir("device");
  float value = 1;
  FakeSavePlanner planner;
  planner.AddTensor("gpu.w", Tensor::Wrap(TensorView(&value, DType::kF32, {1},
                                                     {1}, Device::Cuda(0))));
  FileSystemWriter writer(dir);
  absl::Status status = SaveOneRank(writer, planner);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("gpu.w"));
  EXPECT_THAT(List(dir), SizeIs(0));
}

// Files on tmpfs open buffered even when O_DIRECT is asked for, so a
// destination at any address is read in place, without a bounce copy.
TEST(FileSystemStorageTest, MemoryBackedFilesReadInPlaceAtAnyAlignment) {
  if (!::dcp::testing::IsWritableTmpfs("/dev/shm")) {
    GTEST_SKIP() << "no writable tmpfs at /dev/shm";
  }
  const std::string dir =
      absl::StrCat("/dev/shm/dcp-fs-storage-test-", ::getpid());
  std::filesystem::create_directories(dir);
  absl::Cleanup remove = [&] { std::filesystem::remove_all(dir); };
  FakeSavePlanner save;
  Tensor t = PatternTensor(DType::kF32, {256, 64}, 9);  // 64 KiB.
  save.AddTensor("t", t);
  FileSystemWriter writer(dir);
  ASSERT_TRUE(SaveOneRank(writer, save).ok());
  // 64 bytes past a 4 KiB boundary, as torch's CPU allocations often are.
  std::vector<std::byte> memory(t.nbytes() + 8192);
  auto* base = reinterpret_cast<std::byte*>(
      (reinterpret_cast<uintptr_t>(memory.data()) + 4095) & ~uintptr_t{4095});
  Tensor dest =
      Tensor::Wrap(TensorView(base + 64, DType::kF32, Shape{256, 64}));
  FakeLoadPlanner planner;
  planner.SetDestination(MetadataIndex("t", Shape{0, 0}), dest);
  FileSystemReaderOptions options;
  options.direct_io = true;
  FileSystemReader reader(dir, options);
  absl::Status loaded = LoadOneRank(reader, planner);
  EXPECT_TRUE(loaded.ok()) << loaded;
  EXPECT_TRUE(dest.BytesEqual(t));
  EXPECT_EQ(reader.peak_bounce_bytes(), 0);
}

}  // namespace
}  // namespace dcp

namespace dcp {
namespace {

TEST(FileSystemStorageTest, DirectIoWritesUnalignedMemoryThroughBoundedBounce) {
  // 36 MiB + 100 bytes at an address that is not 4 KiB aligned: more bounce
  // chunks than the in-flight budget holds, and a partial last block.
  const std::string dir = NewTestDir("unaligned_direct");
  const size_t bytes = (size_t{36} << 20) + 100;
  std::vector<uint8_t> storage(bytes + 64);
  uint8_t* data = storage.data() + 8;
  for (size_t i = 0; i < bytes; ++i)
    data[i] = static_cast<uint8_t>(i * 131 + 7);
  Sample sample;
  sample.tensors["unaligned"] =
      Tensor::Wrap(TensorView(data, DType::kU8, {static_cast<int64_t>(bytes)}));
  sample.bytes["note"] = "after the big tensor";
  FileSystemWriterOptions options;
  options.direct_io = true;
  ASSERT_TRUE(Save(dir, sample, options).ok());
  FileSystemReaderOptions reader_options;
  reader_options.direct_io = true;
  absl::Status loaded =
      ::dcp::testing::LoadAndCompare(dir, sample, reader_options);
  EXPECT_TRUE(loaded.ok()) << loaded;
}

}  // namespace
}  // namespace dcp

namespace dcp {
namespace {

TEST(FileSystemStorageTest, TwoRanksShareADirectoryAndAbortAfterCommitKeepsIt) {
  // Rank 1 is not the coordinator: it writes its own files, the coordinator
  // commits both ranks' results; an Abort on rank 1 after MarkCommitted
  // removes nothing.
  const std::string dir = NewTestDir("two_ranks");
  FakeSavePlanner planner0, planner1;
  Tensor a = PatternTensor(DType::kF32, {100}, 1);
  Tensor b = PatternTensor(DType::kI16, {3, 7}, 2);
  planner0.AddTensor("a", a);
  planner1.AddTensor("b", b);
  FileSystemWriter rank0(dir), rank1(dir);
  ASSERT_TRUE(rank0.SetUp(true, 0, true).ok());
  ASSERT_TRUE(rank1.SetUp(false, 1, true).ok());
  std::vector<SavePlan> plans = *rank0.PrepareGlobalPlan(
      {*planner0.CreateLocalPlan(), *planner1.CreateLocalPlan()});
  absl::StatusOr<std::vector<WriteResult>> r0 =
      rank0.WriteData(plans[0], planner0).Wait();
  absl::StatusOr<std::vector<WriteResult>> r1 =
      rank1.WriteData(plans[1], planner1).Wait();
  ASSERT_TRUE(r0.ok() && r1.ok());
  EXPECT_THAT(r1->front().storage_data.relative_path, HasSubstr("__1_"));
  Metadata metadata = planner0.GlobalMetadata();
  Metadata m1 = planner1.GlobalMetadata();
  metadata.state_dict_metadata.merge(m1.state_dict_metadata);
  ASSERT_TRUE(rank0.Finish(metadata, {*r0, *r1}).ok());
  ASSERT_TRUE(rank0.MarkCommitted().ok());
  ASSERT_TRUE(rank1.MarkCommitted().ok());
  rank1.Abort();
  rank0.Abort();

  FileSystemReader reader(dir);
  FakeLoadPlanner load;
  Tensor a2 = Tensor::Empty(DType::kF32, {100});
  Tensor b2 = Tensor::Empty(DType::kI16, {3, 7});
  load.SetDestination(MetadataIndex("a", Shape{0}), a2);
  load.SetDestination(MetadataIndex("b", Shape{0, 0}), b2);
  absl::Status status = LoadOneRank(reader, load);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(a2.BytesEqual(a));
  EXPECT_TRUE(b2.BytesEqual(b));
}

}  // namespace
}  // namespace dcp

namespace dcp {
namespace {

// Calls fn(index) for every index of a box of `lengths` (row-major order).
template <typename Fn>
void ForEachIndex(const Shape& lengths, Fn fn) {
  if (NumElements(lengths) == 0) return;
  Shape index(lengths.size(), 0);
  for (;;) {
    fn(index);
    size_t d = lengths.size();
    while (d > 0 && ++index[d - 1] == lengths[d - 1]) index[--d] = 0;
    if (d == 0) return;
  }
}

int64_t Offset(const Shape& index, const Shape& strides) {
  int64_t offset = 0;
  for (size_t d = 0; d < index.size(); ++d) offset += index[d] * strides[d];
  return offset;
}

struct Box {
  Shape offsets;
  Shape sizes;
};

// The box of `a` and `b` in common, or nullopt.
std::optional<Box> Intersect(const Box& a, const Box& b) {
  Box out;
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    const int64_t lo = std::max(a.offsets[d], b.offsets[d]);
    const int64_t hi =
        std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d]);
    if (hi <= lo) return std::nullopt;
    out.offsets.push_back(lo);
    out.sizes.push_back(hi - lo);
  }
  return out;
}

// A tensor saved as the chunks `stored` of `full` and loaded as the boxes
// `wanted` (each into a destination of its own, contiguous or with its last
// two dimensions swapped in memory).
struct ReshardCase {
  std::string fqn;
  Tensor full;
  std::vector<Box> stored;
  std::vector<Box> wanted;
  std::vector<bool> transposed;  // Per wanted box.
};

// Builds the chunk's bytes by plain indexing (not through CopyBox).
Tensor Extract(const Tensor& full, const Box& box) {
  Tensor out = Tensor::Empty(full.dtype(), box.sizes);
  const size_t es = ElementSize(full.dtype());
  const Shape full_strides = ContiguousStrides(full.sizes());
  const Shape out_strides = ContiguousStrides(box.sizes);
  const auto* src = static_cast<const std::byte*>(full.data());
  auto* dst = static_cast<std::byte*>(out.data());
  ForEachIndex(box.sizes, [&](const Shape& i) {
    Shape global = i;
    for (size_t d = 0; d < i.size(); ++d) global[d] += box.offsets[d];
    std::memcpy(dst + Offset(i, out_strides) * es,
                src + Offset(global, full_strides) * es, es);
  });
  return out;
}

class ReshardedLoadTest
    : public ::testing::TestWithParam<std::tuple<bool, int>> {};

TEST_P(ReshardedLoadTest, NdBoxesAreByteExactWithTinyBounceBudget) {
  const auto [direct, threads] = GetParam();
  const std::string dir = NewTestDir("reshard_nd");
  std::vector<ReshardCase> cases;
  // F64 [8, 16, 100] in a 2x2 grid of chunks; loaded as a 2x2 grid across
  // the last two dimensions, one of them transposed in memory, and whole
  // (transposed: never read in place).
  cases.push_back({"f64",
                   PatternTensor(DType::kF64, {8, 16, 100}, 1),
                   {{{0, 0, 0}, {4, 8, 100}},
                    {{0, 8, 0}, {4, 8, 100}},
                    {{4, 0, 0}, {4, 8, 100}},
                    {{4, 8, 0}, {4, 8, 100}}},
                   {{{0, 0, 0}, {8, 7, 33}},
                    {{0, 7, 0}, {8, 9, 33}},
                    {{0, 0, 33}, {8, 7, 67}},
                    {{0, 7, 33}, {8, 9, 67}},
                    {{1, 0, 0}, {7, 16, 100}}},
                   {false, true, false, false, true}});
  // BF16 [3, 4, 5, 64] stored whole, loaded as an inner box.
  cases.push_back({"bf16",
                   PatternTensor(DType::kBF16, {3, 4, 5, 64}, 2),
                   {{{0, 0, 0, 0}, {3, 4, 5, 64}}},
                   {{{1, 1, 2, 10}, {2, 3, 3, 40}}},
                   {false}});
  FakeSavePlanner save;
  int64_t largest_chunk = 0;
  for (const ReshardCase& c : cases) {
    for (const Box& box : c.stored) {
      Tensor chunk = Extract(c.full, box);
      largest_chunk = std::max<int64_t>(largest_chunk, chunk.nbytes());
      save.AddShard(c.fqn, c.full.sizes(), box.offsets, chunk);
    }
  }
  FileSystemWriterOptions writer_options;
  writer_options.direct_io = direct;
  // Not a multiple of 8: F64 elements straddle checksum blocks.
  writer_options.checksum_block_size = 1004;
  FileSystemWriter writer(dir, writer_options);
  ASSERT_TRUE(SaveOneRank(writer, save).ok());

  FakeLoadPlanner load;
  LoadPlan plan;
  std::vector<Tensor> buffers;  // Keeps the transposed views' memory.
  std::vector<std::pair<const ReshardCase*, size_t>> destinations;
  std::vector<Tensor> views;
  for (const ReshardCase& c : cases) {
    for (size_t w = 0; w < c.wanted.size(); ++w) {
      const Box& want = c.wanted[w];
      Tensor dest;
      if (c.transposed[w]) {
        const size_t r = want.sizes.size();
        Shape memory = want.sizes;
        std::swap(memory[r - 1], memory[r - 2]);
        buffers.push_back(Tensor::Empty(c.full.dtype(), memory));
        Shape strides = ContiguousStrides(memory);
        std::swap(strides[r - 1], strides[r - 2]);
        dest = Tensor::Wrap(TensorView(buffers.back().data(), c.full.dtype(),
                                       want.sizes, strides, Device::Cpu()));
      } else {
        dest = Tensor::Empty(c.full.dtype(), want.sizes);
      }
      Shape dest_key = want.offsets;
      dest_key.push_back(static_cast<int64_t>(w));  // Unique per wanted box.
      load.SetDestination(MetadataIndex(c.fqn, dest_key), dest);
      views.push_back(dest);
      destinations.push_back({&c, w});
      for (const Box& stored : c.stored) {
        std::optional<Box> common = Intersect(want, stored);
        if (!common.has_value()) continue;
        ReadItem item;
        item.storage_index = MetadataIndex(c.fqn, stored.offsets);
        item.dest_index = MetadataIndex(c.fqn, dest_key);
        for (size_t d = 0; d < want.sizes.size(); ++d) {
          item.storage_offsets.push_back(common->offsets[d] -
                                         stored.offsets[d]);
          item.dest_offsets.push_back(common->offsets[d] - want.offsets[d]);
        }
        item.lengths = common->sizes;
        plan.items.push_back(item);
      }
    }
  }
  FileSystemReaderOptions reader_options;
  reader_options.direct_io = direct;
  reader_options.thread_count = threads;
  reader_options.read_window_bytes = 1;  // The smallest pieces there are.
  FileSystemReader reader(dir, reader_options);
  absl::Status status = LoadOneRank(reader, load, &plan);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(load.commits(), static_cast<int>(plan.items.size()));

  for (size_t v = 0; v < views.size(); ++v) {
    const ReshardCase& c = *destinations[v].first;
    const Box& want = c.wanted[destinations[v].second];
    const TensorView& view = views[v].view();
    const size_t es = ElementSize(c.full.dtype());
    const Shape full_strides = ContiguousStrides(c.full.sizes());
    const auto* full = static_cast<const std::byte*>(c.full.data());
    const auto* got = static_cast<const std::byte*>(view.data());
    int64_t mismatches = 0;
    ForEachIndex(want.sizes, [&](const Shape& i) {
      Shape global = i;
      for (size_t d = 0; d < i.size(); ++d) global[d] += want.offsets[d];
      if (std::memcmp(got + Offset(i, view.strides()) * es,
                      full + Offset(global, full_strides) * es, es) != 0) {
        ++mismatches;
      }
    });
    EXPECT_EQ(mismatches, 0) << c.fqn << " box " << v;
  }
  // Two windows of the smallest piece: two checksum blocks (an element may
  // straddle), plus up to 4 KiB on each side for O_DIRECT alignment.
  const int64_t bound = 2 * (2 * 1004 + (direct ? 2 * 4096 : 0));
  EXPECT_GT(reader.peak_bounce_bytes(), 0);
  EXPECT_LE(reader.peak_bounce_bytes(), bound);
  EXPECT_LT(bound, largest_chunk);  // So the bound means something.
}

INSTANTIATE_TEST_SUITE_P(DirectAndThreads, ReshardedLoadTest,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(1, 3)));

TEST(FileSystemStorageTest, SmallItemsCountTheirAlignedBounceAgainstTheWindow) {
  // 300 items of 100 bytes, packed at unaligned offsets: under O_DIRECT
  // each is read through a bounce buffer of whole 4 KiB blocks, and those
  // blocks (not the 100 bytes) count against the window.
  const std::string dir = NewTestDir("small_items_window");
  FakeSavePlanner save;
  std::vector<Tensor> originals;
  for (int i = 0; i < 300; ++i) {
    originals.push_back(PatternTensor(DType::kF32, {25}, 100 + i));
    save.AddTensor(absl::StrCat("t", i), originals.back());
  }
  FileSystemWriter writer(dir);
  ASSERT_TRUE(SaveOneRank(writer, save).ok());
  FakeLoadPlanner planner;
  std::vector<Tensor> dests;
  for (int i = 0; i < 300; ++i) {
    dests.push_back(Tensor::Empty(DType::kF32, {25}));
    planner.SetDestination(MetadataIndex(absl::StrCat("t", i), Shape{0}),
                           dests.back());
  }
  FileSystemReaderOptions options;
  options.direct_io = true;
  options.read_window_bytes = 16 << 10;
  FileSystemReader reader(dir, options);
  ASSERT_TRUE(LoadOneRank(reader, planner).ok());
  for (int i = 0; i < 300; ++i) {
    EXPECT_TRUE(dests[i].BytesEqual(originals[i])) << i;
  }
  // Two windows in memory at once, each within read_window_bytes.
  EXPECT_GT(reader.peak_bounce_bytes(), 0);
  EXPECT_LE(reader.peak_bounce_bytes(), 2 * options.read_window_bytes);
}

// Counts the read requests it passes on to a POSIX engine.
class ReadCountingEngine : public IoEngine {
 public:
  absl::string_view name() const override { return "read-counting"; }
  std::vector<Future<size_t>> Submit(
      absl::Span<const IoRequest> batch) override {
    for (const IoRequest& r : batch) reads += r.op == IoRequest::Op::kRead;
    return inner_->Submit(batch);
  }
  int reads = 0;

 private:
  std::unique_ptr<IoEngine> inner_ = NewPosixIoEngine({});
};

TEST(FileSystemStorageTest, SmallItemsThatFollowEachOtherShareOneRead) {
  // 300 items of 100 bytes packed into one file in name order (as the
  // default planner plans them): read in runs, each item still checked
  // against its own checksums.
  const std::string dir = NewTestDir("small_items_coalesced");
  FakeSavePlanner save;
  std::vector<Tensor> originals;
  for (int i = 0; i < 300; ++i) {
    originals.push_back(PatternTensor(DType::kF32, {25}, 100 + i));
    save.AddTensor(absl::StrFormat("t%03d", i), originals.back());
  }
  FileSystemWriter writer(dir);
  ASSERT_TRUE(SaveOneRank(writer, save).ok());
  const std::vector<std::string> files = DataFiles(dir);
  ASSERT_THAT(files, SizeIs(1));
  auto load = [&](bool direct, ReadCountingEngine& engine,
                  std::vector<Tensor>& dests) {
    FakeLoadPlanner planner;
    dests.clear();
    for (int i = 0; i < 300; ++i) {
      dests.push_back(Tensor::Empty(DType::kF32, {25}));
      planner.SetDestination(
          MetadataIndex(absl::StrFormat("t%03d", i), Shape{0}), dests.back());
    }
    FileSystemReaderOptions options;
    options.direct_io = direct;
    options.io_engine = &engine;
    FileSystemReader reader(dir, options);
    return LoadOneRank(reader, planner);
  };
  for (bool direct : {false, true}) {
    SCOPED_TRACE(direct ? "direct" : "buffered");
    ReadCountingEngine engine;
    std::vector<Tensor> dests;
    ASSERT_TRUE(load(direct, engine, dests).ok());
    for (int i = 0; i < 300; ++i) {
      EXPECT_TRUE(dests[i].BytesEqual(originals[i])) << i;
    }
    // 30,000 bytes in one file: one read, not one per item.
    EXPECT_EQ(engine.reads, 1);
  }
  // A flipped byte inside the run names its own item.
  const Metadata metadata = *ReadMetadataOf(dir);
  const StorageInfo& info =
      metadata.storage_data.at(MetadataIndex("t150", Shape{0}));
  FlipByte(JoinPath(dir, info.relative_path), info.offset + 7);
  for (bool direct : {false, true}) {
    ReadCountingEngine engine;
    std::vector<Tensor> dests;
    absl::Status status = load(direct, engine, dests);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << direct;
    EXPECT_THAT(status.message(),
                AllOf(HasSubstr("t150"), HasSubstr("checksum mismatch"),
                      HasSubstr(absl::StrCat("offset ", info.offset))))
        << direct;
  }
}

TEST(FileSystemStorageTest, WholeChunkLoadsReadInPlaceWithoutBounce) {
  const std::string dir = NewTestDir("zero_copy");
  FakeSavePlanner save;
  Tensor t = PatternTensor(DType::kF32, {256, 64}, 9);  // 64 KiB, aligned.
  save.AddTensor("t", t);
  FileSystemWriter writer(dir);
  ASSERT_TRUE(SaveOneRank(writer, save).ok());
  FakeLoadPlanner planner;
  Tensor dest = Tensor::Empty(DType::kF32, {256, 64});
  planner.SetDestination(MetadataIndex("t", Shape{0, 0}), dest);
  for (bool direct : {false, true}) {
    FileSystemReaderOptions options;
    options.direct_io = direct;
    FileSystemReader reader(dir, options);
    ASSERT_TRUE(LoadOneRank(reader, planner).ok());
    EXPECT_TRUE(dest.BytesEqual(t));
    EXPECT_EQ(reader.peak_bounce_bytes(), 0) << direct;
  }
}

}  // namespace
}  // namespace dcp

namespace dcp {
namespace {

// Data files are preallocated to their planned size; a value that resolves
// to fewer bytes than planned must not leave reserved space behind.
TEST(FileSystemStorageTest, DataFilesEndWhereTheirLastItemEnds) {
  for (bool direct : {false, true}) {
    for (int64_t overplanned : {int64_t{0}, int64_t{100000}}) {
      const std::string dir = NewTestDir("file_end");
      FakeSavePlanner planner;
      planner.AddTensor("t", PatternTensor(DType::kF32, {1000}, 1));
      planner.AddBytes("z_note", std::string(777, 'n'));  // Last in the file.
      FileSystemWriterOptions options;
      options.direct_io = direct;
      FileSystemWriter writer(dir, options);
      ASSERT_TRUE(writer.Reset("").ok());
      ASSERT_TRUE(writer.SetUp(true, 0, false).ok());
      SavePlan plan = *planner.CreateLocalPlan();
      for (WriteItem& item : plan.items) {
        if (item.bytes_io_data.has_value()) {
          item.bytes_io_data->nbytes += overplanned;
        }
      }
      std::vector<SavePlan> plans = *writer.PrepareGlobalPlan({plan});
      absl::StatusOr<std::vector<WriteResult>> results =
          writer.WriteData(plans[0], planner).Wait();
      ASSERT_TRUE(results.ok()) << results.status();
      int64_t end = 0;
      std::string file;
      for (const WriteResult& r : *results) {
        end = std::max(end, r.storage_data.offset + r.storage_data.length);
        file = JoinPath(dir, r.storage_data.relative_path);
      }
      if (direct) end = (end + 4095) / 4096 * 4096;
      struct stat st;
      ASSERT_EQ(::stat(file.c_str(), &st), 0);
      EXPECT_EQ(st.st_size, end)
          << "direct=" << direct << " overplanned=" << overplanned;
    }
  }
}

// Buffered saves and loads are uncached by default: once a save has
// committed, the page cache holds little of the data files where the kernel
// takes RWF_DONTCACHE, and once a load from a cold cache is done, little
// where the file system drops clean pages (not tmpfs); elsewhere, as with
// the options off, most of them. Either way every byte loads back.
TEST(FileSystemStorageTest, BufferedSavesAndLoadsLeaveThePageCacheByDefault) {
  for (bool uncached : {true, false}) {
    const std::string dir = NewTestDir(uncached ? "uncached" : "cached");
    const bool save_drops = uncached && testing::KernelTakesUncachedWrites(dir);
    const bool load_drops = uncached && testing::DropsCleanPages(dir);
    testing::SampleState sample = testing::SampleState::Make(4);
    sample.tensors["large"] = PatternTensor(DType::kU8, {8 << 20}, 5);
    std::vector<std::string> files;
    // Sums the data files' cached pages; checks against `dropped`.
    auto expect_cached = [&](bool dropped, const std::string& what) {
      int64_t resident = 0, pages = 0;
      for (const std::string& path : files) {
        const testing::Residency r = dropped ? testing::AwaitMostlyDropped(path)
                                             : testing::PageResidency(path);
        resident += r.resident;
        pages += r.pages;
      }
      ASSERT_GE(pages, 2048) << what;
      if (dropped) {
        EXPECT_LT(resident * 2, pages) << what << " " << dir;
      } else {
        EXPECT_GT(resident * 2, pages) << what << " " << dir;
      }
    };
    FileSystemWriterOptions save_options;
    save_options.direct_io = false;
    save_options.uncached_writes = uncached;
    ASSERT_TRUE(testing::SaveSample(dir, sample, save_options).ok());
    for (const std::string& name : testing::ListNames(dir)) {
      if (absl::EndsWith(name, ".distcp")) files.push_back(JoinPath(dir, name));
    }
    expect_cached(save_drops, "after the save");
    for (const std::string& path : files) testing::DropCachedPages(path);
    FileSystemReaderOptions load_options;
    load_options.direct_io = false;
    load_options.uncached_reads = uncached;
    absl::Status loaded = testing::LoadAndCompare(dir, sample, load_options);
    EXPECT_TRUE(loaded.ok()) << loaded;
    expect_cached(load_drops, "after the load");
  }
}

}  // namespace
}  // namespace dcp
