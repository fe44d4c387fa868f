#include "io/fs_commit.h"

#include <cerrno>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/fault_injection.h"
#include "io/file_system.h"
#include "io/fs_layout.h"
#include "io/metadata_format.h"

namespace dcp::internal_fs {
namespace {

using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

std::string FreshDir(const std::string& name) {
  std::string dir = JoinPath(::testing::TempDir(), name);
  std::system(absl::StrCat("rm -rf '", dir, "'").c_str());
  EXPECT_TRUE(LocalFileSystem().CreateDir(dir).ok());
  return dir;
}

// A metadata payload naming the one data file `file`.
std::string Encoded(const std::string& file) {
  Metadata m;
  m.state_dict_metadata["extra"] = BytesStorageMetadata{};
  m.storage_data[MetadataIndex("extra")] = {file, 0, 0, {}};
  m.version = kFormatVersion;
  absl::StatusOr<std::string> bytes = EncodeMetadata(m);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return *bytes;
}

void Touch(const std::string& path) {
  absl::StatusOr<std::unique_ptr<File>> file =
      LocalFileSystem().OpenForWrite(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE((*file)->Close().ok());
}

const std::string kOld = DataFileName(DataFilePrefix(0, "0000000000000001"), 0);
const std::string kNew = DataFileName(DataFilePrefix(0, "0000000000000002"), 0);

TEST(FsCommit, TheRenamedMetadataIsTheCommittedOneAndNoTempRemains) {
  const std::string dir = FreshDir("commit_ok");
  EXPECT_TRUE(
      absl::IsNotFound(ReadMetadataFile(LocalFileSystem(), dir).status()));
  EXPECT_THAT(*CommittedFileNames(LocalFileSystem(), dir), ElementsAre());
  CreatedFiles created;
  ASSERT_TRUE(WriteMetadataFile(LocalFileSystem(), dir, "0000000000000002",
                                Encoded(kNew), /*sync=*/true, created)
                  .ok());
  EXPECT_THAT(*CommittedFileNames(LocalFileSystem(), dir), ElementsAre(kNew));
  EXPECT_THAT(*LocalFileSystem().ListDir(dir),
              ElementsAre(std::string(kMetadataFileName)));
}

// A load pointed at a run's root (checkpoints in step-N subdirectories)
// names them; rank-local and unfinished ones are not named.
TEST(FsCommit, AMissingMetadataNamesTheCheckpointsInSubdirectories) {
  const std::string dir = FreshDir("commit_run_root");
  absl::Status status = ReadMetadataFile(LocalFileSystem(), dir).status();
  EXPECT_THAT(status.message(),
              ::testing::HasSubstr("a save that did not finish leaves none"));
  for (const char* sub : {"step-100", "step-200", "step-300", "rank-0"}) {
    ASSERT_TRUE(LocalFileSystem().CreateDir(JoinPath(dir, sub)).ok());
  }
  for (const char* sub : {"step-100", "step-200", "rank-0"}) {
    Touch(JoinPath(JoinPath(dir, sub), kMetadataFileName));
  }
  // ReadMetadataFile (a save's setup reads it too) does not list DIR.
  status = ReadMetadataFile(LocalFileSystem(), dir).status();
  EXPECT_THAT(status.message(),
              ::testing::HasSubstr("a save that did not finish leaves none"));
  status = NameCheckpointsInside(LocalFileSystem(), dir, status);
  EXPECT_TRUE(absl::IsNotFound(status)) << status;
  EXPECT_THAT(status.message(),
              ::testing::HasSubstr(
                  "but its subdirectories step-100, step-200 hold one each: "
                  "pass one of them"));
}

TEST(FsCommit, AFailedRenameLeavesTheOldCheckpointAndAbortRemovesTheTemp) {
  const std::string dir = FreshDir("commit_rename_fails");
  CreatedFiles ignored;
  ASSERT_TRUE(WriteMetadataFile(LocalFileSystem(), dir, "0000000000000001",
                                Encoded(kOld), true, ignored)
                  .ok());
  FaultInjectionFileSystem faulty(LocalFileSystem());
  faulty.Inject({.op = FaultOp::kRename});
  CreatedFiles created;
  EXPECT_FALSE(WriteMetadataFile(faulty, dir, "0000000000000002", Encoded(kNew),
                                 true, created)
                   .ok());
  EXPECT_THAT(*CommittedFileNames(LocalFileSystem(), dir), ElementsAre(kOld));
  created.RemoveAll(LocalFileSystem());
  EXPECT_THAT(*LocalFileSystem().ListDir(dir),
              ElementsAre(std::string(kMetadataFileName)));
}

// Over NFS a rename the server did can be reported failed (ENOENT for a
// retried request): the commit happened, so it is success, and nothing of
// the new checkpoint may be taken for a leftover.
TEST(FsCommit, ARenameDoneButReportedFailedIsTheCommit) {
  const std::string dir = FreshDir("commit_rename_lost_reply");
  CreatedFiles ignored;
  ASSERT_TRUE(WriteMetadataFile(LocalFileSystem(), dir, "0000000000000001",
                                Encoded(kOld), true, ignored)
                  .ok());
  FaultInjectionFileSystem faulty(LocalFileSystem());
  faulty.Inject({.op = FaultOp::kRename, .error = ENOENT, .after = true});
  CreatedFiles created;
  absl::Status status = WriteMetadataFile(faulty, dir, "0000000000000002",
                                          Encoded(kNew), true, created);
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_THAT(*CommittedFileNames(LocalFileSystem(), dir), ElementsAre(kNew));
  EXPECT_THAT(*LocalFileSystem().ListDir(dir),
              ElementsAre(std::string(kMetadataFileName)));
}

// Reported failed and not done (the source is still there), or done by
// someone else (the target holds other bytes): the rename's error.
TEST(FsCommit, AFailedRenameIsNotTakenForADoneOne) {
  const std::string dir = FreshDir("commit_rename_not_done");
  const std::string from = JoinPath(dir, "from");
  const std::string to = JoinPath(dir, "to");
  {
    auto file = LocalFileSystem().OpenForWrite(from);
    ASSERT_TRUE(file.ok());
    ASSERT_TRUE((*file)
                    ->PWrite(0, {reinterpret_cast<const std::byte*>("abc"), 3})
                    .ok());
    ASSERT_TRUE((*file)->Close().ok());
  }
  FaultInjectionFileSystem faulty(LocalFileSystem());
  faulty.Inject({.op = FaultOp::kRename, .error = ENOENT});
  EXPECT_TRUE(absl::IsNotFound(RenameCommitFile(faulty, from, to, "abc")));
  faulty.Inject({.op = FaultOp::kRename, .error = ENOENT, .after = true});
  EXPECT_TRUE(absl::IsNotFound(RenameCommitFile(faulty, from, to, "abd")));
  EXPECT_THAT(*LocalFileSystem().ListDir(dir), ElementsAre("to"));
}

TEST(FsCommit, ACrashBeforeTheDirectorySyncBringsTheOldCheckpointBack) {
  const std::string dir = FreshDir("commit_crash");
  FaultInjectionFileSystem faulty(LocalFileSystem());
  CreatedFiles created;
  ASSERT_TRUE(WriteMetadataFile(faulty, dir, "0000000000000001", Encoded(kOld),
                                true, created)
                  .ok());
  ASSERT_TRUE(faulty.SyncDir(dir).ok());
  ASSERT_TRUE(WriteMetadataFile(faulty, dir, "0000000000000002", Encoded(kNew),
                                true, created)
                  .ok());
  // The rename is not durable until the caller's SyncDir.
  faulty.SimulateCrash();
  EXPECT_THAT(*CommittedFileNames(LocalFileSystem(), dir), ElementsAre(kOld));
}

TEST(FsCommit, OnlyReplacedFilesTheNewCheckpointDoesNotNameAreRemoved) {
  const std::string dir = FreshDir("commit_replace");
  const std::string kept =
      DataFileName(DataFilePrefix(1, "0000000000000001"), 0);
  const std::string other = "notes.txt";
  for (const std::string& name : {kOld, kNew, kept, other}) {
    Touch(JoinPath(dir, name));
  }
  const std::string gone =
      DataFileName(DataFilePrefix(2, "0000000000000001"), 0);
  ASSERT_TRUE(RemoveReplacedFiles(LocalFileSystem(), dir, {kOld, kept, gone},
                                  {kNew, kept}, true)
                  .ok());
  EXPECT_THAT(*LocalFileSystem().ListDir(dir),
              UnorderedElementsAre(kNew, kept, other));
}

TEST(FsCommit, CreatedFilesForgottenAfterTheCommitAreKept) {
  const std::string dir = FreshDir("commit_forget");
  CreatedFiles created;
  Touch(JoinPath(dir, kNew));
  created.Record(JoinPath(dir, kNew));
  created.Forget();
  created.RemoveAll(LocalFileSystem());
  EXPECT_THAT(*LocalFileSystem().ListDir(dir), ElementsAre(kNew));
  created.Record(JoinPath(dir, kNew));
  created.RemoveAll(LocalFileSystem());
  EXPECT_THAT(*LocalFileSystem().ListDir(dir), ElementsAre());
}

}  // namespace
}  // namespace dcp::internal_fs
