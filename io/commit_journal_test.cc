// The commit journal (io/internal/commit_journal.h): journals found on
// disk are validated before anything is renamed or removed, and a journal
// left behind is completed exactly once.
#include "io/internal/commit_journal.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dcp::internal_io {
namespace {

using ::testing::HasSubstr;

bool IsModelFile(absl::string_view relative) {
  return absl::EndsWith(relative, ".model") || relative == "index.json";
}

absl::Status Decode(const std::string& text) {
  return DecodeCommitJournal(text, "dir/.journal", IsModelFile).status();
}

TEST(CommitJournal, RoundTripAndRefusals) {
  CommitJournal journal;
  journal.renames = {{".a.model.tmp-0123456789abcdef", "a.model"},
                     {"sub/.b.model.tmp-0123456789abcdef", "sub/b.model"},
                     {".index.json.tmp-0123456789abcdef", "index.json"}};
  journal.removals = {"old.model"};
  absl::StatusOr<CommitJournal> decoded =
      DecodeCommitJournal(EncodeCommitJournal(journal), "j", IsModelFile);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->renames, journal.renames);
  EXPECT_EQ(decoded->removals, journal.removals);

  const std::string tmp = "\".a.model.tmp-0123456789abcdef\"";
  for (const std::string& bad : {
           std::string("{\"renames\": 3, \"removals\": []}"),
           std::string("not json"),
           // Not from a temporary name; to a name the storage does not own;
           // across directories; out of the directory.
           std::string(
               R"({"renames": [["a.model", "b.model"]], "removals": []})"),
           absl::StrCat(R"({"renames": [[)", tmp,
                        R"(, "passwd"]], "removals": []})"),
           absl::StrCat(R"({"renames": [[)", tmp,
                        R"(, "sub/a.model"]], "removals": []})"),
           absl::StrCat(R"({"renames": [[)", tmp,
                        R"(, "../a.model"]], "removals": []})"),
           std::string(R"({"renames": [], "removals": ["notes.txt"]})"),
           std::string(R"({"renames": [], "removals": ["../x.model"]})"),
       }) {
    absl::Status status = Decode(bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << bad;
    EXPECT_THAT(status.message(), HasSubstr("dir/.journal")) << bad;
  }
  EXPECT_FALSE(IsTemporaryFileName(".a.tmp-0123456789ABCDEF"));
  EXPECT_FALSE(IsTemporaryFileName("a.tmp-0123456789abcdef"));
  EXPECT_TRUE(IsTemporaryFileName(".a.tmp-0123456789abcdef"));
}

TEST(CommitJournal, ALeftJournalIsCompletedOnce) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = JoinPath(base != nullptr ? base : "/tmp", "journal");
  FileSystemBase& fs = LocalFileSystem();
  ASSERT_TRUE(fs.CreateDir(dir).ok());
  ASSERT_TRUE(WriteSmallFile(fs, JoinPath(dir, ".a.model.tmp-0123456789abcdef"),
                             "new", false)
                  .ok());
  ASSERT_TRUE(WriteSmallFile(fs, JoinPath(dir, "a.model"), "old", false).ok());
  ASSERT_TRUE(WriteSmallFile(fs, JoinPath(dir, "gone.model"), "x", false).ok());
  CommitJournal journal;
  journal.renames = {{".a.model.tmp-0123456789abcdef", "a.model"}};
  journal.removals = {"gone.model", "never.model"};
  ASSERT_TRUE(WriteSmallFile(fs, JoinPath(dir, ".journal"),
                             EncodeCommitJournal(journal), true)
                  .ok());
  ASSERT_TRUE(CompleteCommit(fs, dir, ".journal", IsModelFile, true).ok());
  EXPECT_EQ(*ReadSmallFile(fs, JoinPath(dir, "a.model"), 100), "new");
  EXPECT_FALSE(*fs.Exists(JoinPath(dir, "gone.model")));
  EXPECT_FALSE(*fs.Exists(JoinPath(dir, ".journal")));
  // Nothing left to do.
  EXPECT_TRUE(CompleteCommit(fs, dir, ".journal", IsModelFile, true).ok());
  EXPECT_EQ(ReadSmallFile(fs, JoinPath(dir, "a.model"), 2).status().code(),
            absl::StatusCode::kDataLoss);
}

// A journal whose renamed file is missing under both names: the save's
// data is gone, which completing must say rather than report success.
TEST(CommitJournal, AFileMissingUnderBothNamesIsDataLoss) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir =
      JoinPath(base != nullptr ? base : "/tmp", "journal-missing");
  FileSystemBase& fs = LocalFileSystem();
  ASSERT_TRUE(fs.CreateDir(dir).ok());
  ASSERT_TRUE(WriteSmallFile(fs, JoinPath(dir, ".b.model.tmp-0123456789abcdef"),
                             "new b", false)
                  .ok());
  CommitJournal journal;
  journal.renames = {{".a.model.tmp-0123456789abcdef", "a.model"},
                     {".b.model.tmp-0123456789abcdef", "b.model"}};
  ASSERT_TRUE(WriteSmallFile(fs, JoinPath(dir, ".journal"),
                             EncodeCommitJournal(journal), true)
                  .ok());
  absl::Status status = CompleteCommit(fs, dir, ".journal", IsModelFile, true);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(std::string(status.message()),
              ::testing::HasSubstr("a.model are both missing"));
  EXPECT_TRUE(*fs.Exists(JoinPath(dir, ".journal")));  // Kept, as evidence.
}

}  // namespace
}  // namespace dcp::internal_io
