// `dcp inspect` and `dcp verify` on intact and hostile checkpoints: a
// crafted checkpoint is an error naming what is wrong, never a read outside
// the checkpoint, a hang or an unbounded allocation.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file_system.h"
#include "io/file_system_storage.h"
#include "io/metadata_format.h"
#include "io/testing/metadata_surgery.h"
#include "io/testing/sample_state.h"
#include "tools/commands.h"

namespace dcp {
namespace {

using ::dcp::testing::FlipByte;
using ::dcp::testing::NewTestDir;
using ::dcp::testing::ClaimLength;
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
  EXPECT_THAT(status.message(), AllOf(HasSubstr("step"), HasSubstr("truncated")));
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

}  // namespace
}  // namespace dcp
