// `dcp inspect` and `dcp verify` on intact and hostile checkpoints: a
// crafted checkpoint is an error naming what is wrong, never a read outside
// the checkpoint, a hang or an unbounded allocation. `dcp verify --clean`
// removes exactly the orphans of interrupted saves, under the saves' lock.
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/state_dict.h"
#include "engine/checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/extensions.h"
#include "io/file_system.h"
#include "io/file_system_storage.h"
#include "io/hf_storage.h"
#include "io/mega_storage.h"
#include "io/metadata_format.h"
#include "io/testing/fake_planners.h"
#include "io/testing/metadata_surgery.h"
#include "io/testing/sample_state.h"
#include "tools/commands.h"

namespace dcp {
namespace {

using ::dcp::testing::ClaimLength;
using ::dcp::testing::FlipByte;
using ::dcp::testing::ListNames;
using ::dcp::testing::NewTestDir;
using ::dcp::testing::RewriteMetadataFile;
using ::dcp::testing::SampleState;
using ::dcp::testing::SaveSample;
using ::dcp::testing::StoredItemPosition;
using ::testing::AllOf;
using ::testing::HasSubstr;

// The data files of the checkpoint in `dir`.
std::vector<std::string> DataFiles(const std::string& dir) {
  std::vector<std::string> out;
  for (const std::string& name : ::dcp::testing::ListNames(dir)) {
    if (name.size() > 7 && name.substr(name.size() - 7) == ".distcp") {
      out.push_back(name);
    }
  }
  return out;
}

TEST(InspectTest, VerifyReadsLargeBlocksInPiecesAndFindsAFlippedByte) {
  const std::string dir = NewTestDir("verify_large_blocks");
  FileSystemWriterOptions options;
  options.checksum_block_size = kMaxChecksumBlockSize;
  ASSERT_TRUE(SaveSample(dir, SampleState::Make(1), options).ok());
  EXPECT_TRUE(RunInspect(dir).ok());
  absl::Status verified = RunVerify(dir);
  EXPECT_TRUE(verified.ok()) << verified;

  const Metadata metadata = *FileSystemReader(dir).ReadMetadata();
  const StorageInfo& big =
      metadata.storage_data.at(MetadataIndex("big", Shape{0}));
  FlipByte(JoinPath(dir, big.relative_path), big.offset + 5000);
  verified = RunVerify(dir);
  EXPECT_EQ(verified.code(), absl::StatusCode::kDataLoss) << verified;
  EXPECT_THAT(verified.message(),
              AllOf(HasSubstr("big"), HasSubstr("checksum mismatch")));
}

// A compressed checkpoint: `dcp verify` decodes its encoded blocks, and
// refuses an encoding this build cannot decode (a load would fail).
TEST(InspectTest, VerifyDecodesCompressedBlocksAndNamesUnknownEncodings) {
  const std::string dir = NewTestDir("verify_compressed");
  Tensor zeros = Tensor::Empty(DType::kF32, {1 << 18});
  std::memset(zeros.data(), 0, zeros.nbytes());
  StateDict state;
  state["zeros"] = zeros;
  FileSystemWriterOptions options;
  options.checksum_block_size = 64 << 10;
  options.extensions = *ParseCompression("zstd");
  FileSystemWriter writer(dir, options);
  SaveOptions save;
  save.no_dist = true;
  ASSERT_TRUE(SaveStateDict(state, writer, save).ok());
  const Metadata metadata = *FileSystemReader(dir).ReadMetadata();
  const StorageInfo& info =
      metadata.storage_data.at(MetadataIndex("zeros", Shape{0}));
  ASSERT_EQ(info.extensions, std::vector<std::string>{"zstd/1.0"});
  ASSERT_LT(info.length, info.RawLength());  // Blocks were encoded.
  absl::Status verified = RunVerify(dir);
  EXPECT_TRUE(verified.ok()) << verified;

  ASSERT_TRUE(RewriteMetadataFile(dir, [](format::Metadata& proto) {
                for (std::string& e : *proto.mutable_extensions()) {
                  e = "zstd/2.0";
                }
              }).ok());
  verified = RunVerify(dir);
  EXPECT_EQ(verified.code(), absl::StatusCode::kDataLoss) << verified;
  EXPECT_THAT(verified.message(),
              AllOf(HasSubstr("zeros"), HasSubstr("cannot be decoded"),
                    HasSubstr("zstd/2.0")));
}

TEST(InspectTest, DataFileOutsideTheCheckpointIsRefusedUnread) {
  const std::string root = NewTestDir("verify_traversal");
  const std::string dir = JoinPath(root, "ckpt");
  ASSERT_TRUE(SaveSample(dir, SampleState::Make(1)).ok());
  // An identical copy outside: following the name would verify fine.
  const std::string name = DataFiles(dir).at(0);
  ASSERT_TRUE(LocalFileSystem().CreateDir(JoinPath(root, "outside")).ok());
  std::filesystem::copy_file(JoinPath(dir, name),
                             JoinPath(root, "outside/" + name));
  ASSERT_TRUE(RewriteMetadataFile(dir, [&](format::Metadata& proto) {
                *proto.mutable_files(0) = "../outside/" + name;
              }).ok());
  for (absl::Status status : {RunInspect(dir), RunVerify(dir)}) {
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
    EXPECT_THAT(status.message(), HasSubstr("../outside/" + name));
  }
}

TEST(InspectTest, AFilePassedForItsCheckpointIsNamedAsAFile) {
  const std::string dir = NewTestDir("inspect_a_file");
  ASSERT_TRUE(SaveSample(dir, SampleState::Make(1)).ok());
  const std::string file = dir + "/.metadata";
  for (const auto& run : {RunInspect, RunVerify, RunClean}) {
    absl::Status status = run(file);
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_THAT(status.message(),
                HasSubstr(file + " is a file, not a checkpoint directory"));
  }
}

TEST(InspectTest, ATorchSaveFileAndATorchDcpDirectoryAreNamedWithTheirFix) {
  const std::string dir = NewTestDir("inspect_foreign");
  const std::string pt = dir + "/model.pt";
  std::ofstream(pt, std::ios::binary) << "PK\x03\x04 torch.save";
  const std::string torchs = dir + "/torch_dcp";
  std::filesystem::create_directories(torchs);
  std::ofstream(torchs + "/.metadata", std::ios::binary)
      << std::string("\x80\x04\x95 pickled", 12);
  std::ofstream(torchs + "/__0_0.distcp", std::ios::binary) << "data";
  for (const auto& run : {RunInspect, RunVerify}) {
    absl::Status status = run(pt);
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_THAT(status.message(),
                AllOf(HasSubstr(pt + " is a file, not a checkpoint directory"),
                      HasSubstr("dcp.format_utils torch_to_dcp " + pt)));
    status = run(torchs);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << status;
    EXPECT_THAT(status.message(),
                AllOf(HasSubstr("written by torch.distributed.checkpoint"),
                      HasSubstr("torch_dcp_to_dcp " + torchs + " NEW_DIR")));
  }
}

TEST(InspectTest, HugeChecksumBlockIsDataLossNotAnAbort) {
  // One 2^50-byte block: verify once allocated a buffer of the block.
  const std::string dir = NewTestDir("verify_huge_block");
  ASSERT_TRUE(SaveSample(dir, SampleState::Make(1)).ok());
  ASSERT_TRUE(RewriteMetadataFile(dir, [](format::Metadata& proto) {
                proto.set_checksum_block_size(int64_t{1} << 62);
                proto.set_storage_length(StoredItemPosition(proto, "step"),
                                         int64_t{1} << 50);
              }).ok());
  absl::Status status = RunVerify(dir);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr("checksum_block_size"));
}

TEST(InspectTest, ItemPastTheEndOfItsFileIsReportedUnread) {
  // "step" claims 1 TiB, with the 1024 checksums of 1 GiB blocks it needs.
  const std::string dir = NewTestDir("verify_past_end");
  ASSERT_TRUE(SaveSample(dir, SampleState::Make(1)).ok());
  ASSERT_TRUE(RewriteMetadataFile(dir, [](format::Metadata& proto) {
                ASSERT_TRUE(ClaimLength(proto, "step", int64_t{1} << 40,
                                        kMaxChecksumBlockSize));
              }).ok());
  absl::Status status = RunVerify(dir);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("step"), HasSubstr("truncated")));
}

TEST(InspectTest, VerifyRefusesFifosAndSymlinksWithoutFollowingThem) {
  const std::string root = NewTestDir("verify_fifo");
  const std::string dir = JoinPath(root, "ckpt");
  ASSERT_TRUE(SaveSample(dir, SampleState::Make(1)).ok());
  const std::string file = JoinPath(dir, DataFiles(dir).at(0));
  const std::string elsewhere = JoinPath(root, "elsewhere.distcp");
  ASSERT_EQ(::rename(file.c_str(), elsewhere.c_str()), 0);
  ASSERT_EQ(::symlink(elsewhere.c_str(), file.c_str()), 0);
  absl::Status status = RunVerify(dir);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr("symbolic link"));

  ASSERT_EQ(::unlink(file.c_str()), 0);
  ASSERT_EQ(::mkfifo(file.c_str(), 0644), 0);
  status = RunVerify(dir);  // A FIFO's open would wait for a writer.
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr("FIFO"));
}

// Writes `bytes` bytes to `dir`/`name`.
void WriteFileOfSize(const std::string& dir, const std::string& name,
                     int64_t bytes) {
  std::ofstream(JoinPath(dir, name)) << std::string(bytes, 'o');
}

// RunClean's exit status and what it printed.
std::pair<absl::Status, std::string> CleanAndCapture(const std::string& dir) {
  ::testing::internal::CaptureStdout();
  absl::Status status = RunClean(dir);
  return {status, ::testing::internal::GetCapturedStdout()};
}

// A MEGA directory (a directory path or a mega:// id): inspect lists it,
// verify checks every block and names a flipped byte.
TEST(InspectTest, MegaDirectoriesAreInspectedAndVerified) {
  const std::string dir = NewTestDir("inspect_mega");
  const SampleState sample = SampleState::Make(4);
  {
    MegaStorageWriter writer(dir);
    ::dcp::testing::FakeSavePlanner planner = sample.SavePlanner();
    ASSERT_TRUE(::dcp::testing::SaveOneRank(writer, planner).ok());
  }
  EXPECT_TRUE(RunInspect(dir).ok());
  absl::Status verified = RunVerify(dir);
  EXPECT_TRUE(verified.ok()) << verified;
  verified = RunVerify("mega://" + dir);
  EXPECT_TRUE(verified.ok()) << verified;

  const Metadata metadata = *MegaStorageReader(dir).ReadMetadata();
  const auto& [index, info] = *metadata.storage_data.begin();
  FlipByte(JoinPath(dir, info.relative_path), info.offset);
  verified = RunVerify(dir);
  EXPECT_EQ(verified.code(), absl::StatusCode::kDataLoss) << verified;
  EXPECT_THAT(std::string(verified.message()),
              AllOf(HasSubstr(index.fqn), HasSubstr("checksum mismatch")));
}

// A tensor its chunks do not cover (a crafted shape, grown past its chunks)
// fails verify, as it fails a load.
TEST(InspectTest, VerifyFindsTensorsTheirChunksDoNotCover) {
  const std::string dir = NewTestDir("verify_uncovered");
  ASSERT_TRUE(SaveSample(dir, SampleState::Make(0)).ok());
  ASSERT_TRUE(RunVerify(dir).ok());
  // 0-d tensors have no sizes: the first size is the first dimension of
  // the first tensor that has one.
  ASSERT_TRUE(RewriteMetadataFile(dir, [](format::Metadata& proto) {
                proto.set_tensor_size(0, proto.tensor_size(0) + 1);
              }).ok());
  absl::Status status = RunVerify(dir);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("but its chunks hold"));
}

// Saves a sample into `dir`/rank-0 and rank-1 as a rank-local save of two
// ranks whose records claim the world sizes `world_sizes`.
void SaveRankLocal(const std::string& dir,
                   const std::array<int32_t, 2>& world_sizes) {
  for (int rank = 0; rank < 2; ++rank) {
    const std::string rank_dir = RankLocalDirectory(dir, rank);
    ASSERT_TRUE(SaveSample(rank_dir, SampleState::Make(rank)).ok());
    const int32_t world_size = world_sizes[rank];
    ASSERT_TRUE(RewriteMetadataFile(rank_dir, [&](format::Metadata& proto) {
                  proto.mutable_rank_local()->set_group_save_id("g");
                  proto.mutable_rank_local()->set_rank(rank);
                  proto.mutable_rank_local()->set_world_size(world_size);
                }).ok());
  }
}

// A directory of rank-local checkpoints (DIR/rank-R, use_collectives
// false): inspect and verify go through each rank's, and a flipped byte in
// one fails verify naming it.
TEST(InspectTest, RankLocalCheckpointsAreInspectedAndVerifiedRankByRank) {
  const std::string dir = NewTestDir("inspect_rank_local");
  SaveRankLocal(dir, {2, 2});
  EXPECT_TRUE(RunInspect(dir).ok());
  absl::Status verified = RunVerify(dir);
  EXPECT_TRUE(verified.ok()) << verified;
  const std::string second = RankLocalDirectory(dir, 1);
  const Metadata metadata = *FileSystemReader(second).ReadMetadata();
  const StorageInfo& big =
      metadata.storage_data.at(MetadataIndex("big", Shape{0}));
  FlipByte(JoinPath(second, big.relative_path), big.offset + 10);
  verified = RunVerify(dir);
  EXPECT_EQ(verified.code(), absl::StatusCode::kDataLoss) << verified;
  EXPECT_THAT(std::string(verified.message()),
              AllOf(HasSubstr("rank-1"), HasSubstr("big")));
}

// Rank 0's record of the world size is not trusted to list directories (a
// crafted 2^31 - 1 made inspect build two billion paths); a rank directory
// that is a symbolic link is reported, not followed.
TEST(InspectTest, RankLocalWorldSizeAndLinkedRanksAreProblemsNotFollowed) {
  const std::string dir = NewTestDir("inspect_rank_local_hostile");
  SaveRankLocal(dir, {INT32_MAX, 2});
  for (const auto& run : {RunInspect, RunVerify}) {
    absl::Status status = run(dir);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
    EXPECT_THAT(std::string(status.message()),
                AllOf(HasSubstr("2 of the 2147483647"),
                      HasSubstr(dir + "/rank-2 is missing")));
  }
  ASSERT_TRUE(RewriteMetadataFile(RankLocalDirectory(dir, 0),
                                  [](format::Metadata& proto) {
                                    proto.mutable_rank_local()->set_world_size(
                                        2);
                                  })
                  .ok());
  EXPECT_TRUE(RunVerify(dir).ok());
  // Ranks holding different saves (killed while they committed).
  ASSERT_TRUE(RewriteMetadataFile(
                  RankLocalDirectory(dir, 1),
                  [](format::Metadata& proto) {
                    proto.mutable_rank_local()->set_group_save_id("other");
                  })
                  .ok());
  absl::Status mixed = RunVerify(dir);
  EXPECT_EQ(mixed.code(), absl::StatusCode::kDataLoss) << mixed;
  EXPECT_THAT(std::string(mixed.message()),
              AllOf(HasSubstr(dir + "/rank-1 holds save other and rank 0 "
                                    "save g"),
                    HasSubstr("different saves")));
  const std::string moved = NewTestDir("inspect_rank_local_moved") + "/r1";
  std::filesystem::rename(RankLocalDirectory(dir, 1), moved);
  std::filesystem::create_directory_symlink(moved, RankLocalDirectory(dir, 1));
  absl::Status linked = RunVerify(dir);
  EXPECT_EQ(linked.code(), absl::StatusCode::kFailedPrecondition) << linked;
  EXPECT_THAT(std::string(linked.message()),
              AllOf(HasSubstr(dir + "/rank-1"), HasSubstr("symbolic link")));
}

TEST(VerifyCleanTest, RemovesTheOrphansPrintsThemAndKeepsTheCheckpoint) {
  const std::string dir = NewTestDir("clean");
  ASSERT_TRUE(SaveSample(dir, SampleState::Make(1)).ok());
  const std::vector<std::string> checkpoint = ListNames(dir);
  WriteFileOfSize(dir, "__0_00000000deadbeef_0.distcp", 3000);
  WriteFileOfSize(dir, "__1_00000000deadbeef_0.distcp", 2000);
  WriteFileOfSize(dir, ".metadata.tmp-00000000deadbeef", 100);
  WriteFileOfSize(dir, "__keep_me.distcp", 10);
  WriteFileOfSize(dir, "notes.txt", 10);

  // verify passes, and says what --clean would remove.
  ::testing::internal::CaptureStdout();
  EXPECT_TRUE(RunVerify(dir).ok());
  EXPECT_THAT(::testing::internal::GetCapturedStdout(),
              HasSubstr("NOTE: 3 files (5100 bytes) that the checkpoint does "
                        "not use"));
  auto [status, out] = CleanAndCapture(dir);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_THAT(out, AllOf(HasSubstr("REMOVED  __0_00000000deadbeef_0.distcp\n"),
                         HasSubstr("REMOVED  __1_00000000deadbeef_0.distcp\n"),
                         HasSubstr("REMOVED  .metadata.tmp-00000000deadbeef\n"),
                         HasSubstr("3 orphaned files removed, 5100 bytes "
                                   "reclaimed")));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("keep_me")));
  std::vector<std::string> expected = checkpoint;
  expected.push_back("__keep_me.distcp");
  expected.push_back("notes.txt");
  EXPECT_THAT(ListNames(dir), ::testing::UnorderedElementsAreArray(expected));
  EXPECT_TRUE(RunVerify(dir).ok());

  std::tie(status, out) = CleanAndCapture(dir);  // Nothing left to remove.
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_THAT(out, HasSubstr("0 orphaned files removed, 0 bytes reclaimed"));
}

TEST(VerifyCleanTest, FailsNamingTheSaveThatHoldsTheDirectory) {
  const std::string dir = NewTestDir("clean_locked");
  ASSERT_TRUE(SaveSample(dir, SampleState::Make(1)).ok());
  WriteFileOfSize(dir, "__0_00000000deadbeef_0.distcp", 3000);
  const std::vector<std::string> before = ListNames(dir);
  {
    // A save that is writing holds the lock; its new files look like
    // orphans and must stay.
    absl::StatusOr<std::unique_ptr<DirectoryLock>> save_lock =
        LocalFileSystem().LockDirectory(
            dir, "pid 4242 on host trainer (save 00000000deadbeef)",
            LockMode::kExclusive);
    ASSERT_TRUE(save_lock.ok()) << save_lock.status();
    auto [status, out] = CleanAndCapture(dir);
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_THAT(status.message(),
                HasSubstr("pid 4242 on host trainer (save 00000000deadbeef)"));
    EXPECT_THAT(
        ListNames(dir),
        ::testing::Contains(std::string("__0_00000000deadbeef_0.distcp")));
  }
  EXPECT_EQ(ListNames(dir), before);  // The lock went with its holder.
  EXPECT_TRUE(CleanAndCapture(dir).first.ok());
}

TEST(VerifyCleanTest, RemovesNothingWhenTheMetadataCannotBeRead) {
  const std::string dir = NewTestDir("clean_unreadable");
  ASSERT_TRUE(SaveSample(dir, SampleState::Make(1)).ok());
  WriteFileOfSize(dir, "__0_00000000deadbeef_0.distcp", 3000);
  FlipByte(JoinPath(dir, kMetadataFileName), 40);
  const std::vector<std::string> before = ListNames(dir);
  auto [status, out] = CleanAndCapture(dir);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("were not removed"), HasSubstr("checksum")));
  EXPECT_THAT(out, HasSubstr("0 orphaned files removed"));
  EXPECT_EQ(ListNames(dir), before);
}

// A Hugging Face directory of two files and an index, written by dcp.
std::string SaveHfSample(const std::string& tag) {
  const std::string dir = NewTestDir(tag);
  StateDict state;
  state["a.weight"] = Tensor::Empty(DType::kBF16, {4, 6});
  state["b.bias"] = Tensor::Empty(DType::kI32, {5});
  state["c"] = Tensor::Empty(DType::kF32, {});
  for (auto& [name, value] : state) {
    std::memset(value.tensor().data(), 7, value.tensor().nbytes());
  }
  HuggingFaceStorageWriterOptions options;
  options.fqn_to_index_mapping = {{"a.weight", 1}, {"b.bias", 2}, {"c", 2}};
  HuggingFaceStorageWriter writer(dir, options);
  SaveOptions save;
  save.storage_writer = &writer;
  save.no_dist = true;
  EXPECT_TRUE(Save(state, save).ok());
  return dir;
}

TEST(InspectHfTest, ListsTensorsFilesAndSizes) {
  const std::string dir = SaveHfSample("inspect_hf");
  ::testing::internal::CaptureStdout();
  absl::Status status = RunInspect(dir);
  const std::string out = ::testing::internal::GetCapturedStdout();
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_THAT(out,
              AllOf(HasSubstr("Hugging Face checkpoint"), HasSubstr("a.weight"),
                    HasSubstr("BF16"), HasSubstr("[4, 6]"),
                    HasSubstr("model-00001-of-00002.safetensors"),
                    HasSubstr("model-00002-of-00002.safetensors"),
                    HasSubstr("3 tensors, 72 bytes of tensors")));
  ::testing::internal::CaptureStdout();
  status = RunVerify(dir);
  EXPECT_THAT(::testing::internal::GetCapturedStdout(),
              HasSubstr("OK: 2 files, 3 tensors"));
  EXPECT_TRUE(status.ok()) << status;
}

// --clean removes dcp's orphans: a Hugging Face or MEGA directory has none
// of dcp's committed files, and is left as it is.
TEST(InspectHfTest, CleanLeavesOtherFormatsAlone) {
  const std::string dir = SaveHfSample("clean_hf");
  const std::vector<std::string> before = ListNames(dir);
  ::testing::internal::CaptureStdout();
  absl::Status status = RunClean(dir);
  ::testing::internal::GetCapturedStdout();
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(ListNames(dir), before);
}

TEST(InspectHfTest, VerifyNamesATruncatedFile) {
  const std::string dir = SaveHfSample("verify_hf_truncated");
  const std::string file = dir + "/model-00002-of-00002.safetensors";
  std::filesystem::resize_file(file, std::filesystem::file_size(file) - 1);
  ::testing::internal::CaptureStdout();
  absl::Status status = RunVerify(dir);
  ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("model-00002-of-00002.safetensors"));
}

TEST(InspectHfTest, VerifyNamesIndexEntriesThatDisagreeWithTheFiles) {
  const std::string dir = SaveHfSample("verify_hf_index");
  // The index moves b.bias to file 1 and forgets c.
  std::ofstream(dir + "/" + kHfIndexFileName, std::ios::trunc)
      << R"({"metadata": {"total_size": 72}, "weight_map": {)"
      << R"("a.weight": "model-00001-of-00002.safetensors",)"
      << R"("b.bias": "model-00001-of-00002.safetensors"}})";
  ::testing::internal::CaptureStdout();
  absl::Status status = RunVerify(dir);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(out, AllOf(HasSubstr("maps b.bias to "
                                   "model-00001-of-00002.safetensors, which "
                                   "does not hold it"),
                         HasSubstr("CORRUPT")));
}

TEST(InspectHfTest, VerifyNotesTensorsTheIndexForgetsAndLoadsTakeThem) {
  const std::string dir = SaveHfSample("verify_hf_forgotten");
  std::ofstream(dir + "/" + kHfIndexFileName, std::ios::trunc)
      << R"({"metadata": {"total_size": 72}, "weight_map": {)"
      << R"("a.weight": "model-00001-of-00002.safetensors",)"
      << R"("b.bias": "model-00002-of-00002.safetensors"}})";
  ::testing::internal::CaptureStdout();
  absl::Status status = RunVerify(dir);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_THAT(out, AllOf(HasSubstr("NOTE model-00002-of-00002.safetensors "
                                   "holds c, which"),
                         HasSubstr("OK: 2 files, 3 tensors")));
  // As the note says: a load takes c from the file.
  StateDict state;
  state["c"] = Tensor::Empty(DType::kF32, {});
  HuggingFaceStorageReader reader(dir);
  LoadOptions load;
  load.storage_reader = &reader;
  load.no_dist = true;
  ASSERT_TRUE(Load(state, load).ok());
  unsigned char expected[4];
  std::memset(expected, 7, sizeof(expected));
  EXPECT_EQ(std::memcmp(state["c"].tensor().data(), expected, 4), 0);
}

}  // namespace
}  // namespace dcp
