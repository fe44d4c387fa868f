// The commit journal (io/internal/commit_journal.h): journals found on
// disk are validated before anything is renamed or removed, and a journal
// left behind is completed exactly once.
#include "io/internal/commit_journal.h"

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
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

// The local file system, telling the test when a lock was refused
// because another holder has it.
class LockWatchingFileSystem final : public FileSystemBase {
 public:
  absl::Notification refused;

  absl::StatusOr<std::unique_ptr<File>> OpenForWrite(
      const std::string& path, const OpenOptions& options) override {
    return base_.OpenForWrite(path, options);
  }
  absl::StatusOr<std::unique_ptr<File>> OpenForRead(
      const std::string& path, const OpenOptions& options) override {
    return base_.OpenForRead(path, options);
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    return base_.Rename(from, to);
  }
  absl::Status RemoveFile(const std::string& path) override {
    return base_.RemoveFile(path);
  }
  absl::Status CreateDir(const std::string& path) override {
    return base_.CreateDir(path);
  }
  absl::StatusOr<bool> Exists(const std::string& path) override {
    return base_.Exists(path);
  }
  absl::StatusOr<std::vector<std::string>> ListDir(
      const std::string& path) override {
    return base_.ListDir(path);
  }
  absl::Status SyncDir(const std::string& path) override {
    return base_.SyncDir(path);
  }
  absl::StatusOr<std::unique_ptr<DirectoryLock>> LockDirectory(
      const std::string& dir, absl::string_view holder,
      LockMode mode) override {
    auto lock = base_.LockDirectory(dir, holder, mode);
    if (absl::IsFailedPrecondition(lock.status()) &&
        !refused.HasBeenNotified()) {
      refused.Notify();
    }
    return lock;
  }

 private:
  FileSystemBase& base_ = LocalFileSystem();
};

// A directory with a decided commit pending: a.model's new bytes under
// their temporary name, the journal naming the rename.
std::string PendingCommitDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = JoinPath(base != nullptr ? base : "/tmp", name);
  FileSystemBase& fs = LocalFileSystem();
  EXPECT_TRUE(fs.CreateDir(dir).ok());
  EXPECT_TRUE(WriteSmallFile(fs, JoinPath(dir, ".a.model.tmp-0123456789abcdef"),
                             "new", false)
                  .ok());
  CommitJournal journal;
  journal.renames = {{".a.model.tmp-0123456789abcdef", "a.model"}};
  EXPECT_TRUE(WriteSmallFile(fs, JoinPath(dir, ".journal"),
                             EncodeCommitJournal(journal), true)
                  .ok());
  return dir;
}

// CompletePendingCommitForRead of `dir` on its own thread, which the
// constructor lets start and returns once its first try found the
// directory's lock held by someone else.
class WaitingReader {
 public:
  explicit WaitingReader(const std::string& dir)
      : thread_([this, dir] {
          status_ =
              CompletePendingCommitForRead(fs_, dir, ".journal", IsModelFile);
        }) {
    fs_.refused.WaitForNotification();
  }

  // What the read returned.
  absl::Status Join() {
    thread_.join();
    return status_;
  }

 private:
  LockWatchingFileSystem fs_;
  absl::Status status_;
  std::thread thread_;
};

// The ranks of a restarted job load one directory together: while one
// holds the lock completing the commit, another waits for it instead of
// refusing (and then finds the commit done).
TEST(CommitJournal, AReaderWaitsForAnotherCompletingTheCommit) {
  const std::string dir = PendingCommitDir("journal-wait");
  FileSystemBase& local = LocalFileSystem();
  auto other = local.LockDirectory(dir, "another rank", LockMode::kExclusive);
  ASSERT_TRUE(other.ok()) << other.status();
  WaitingReader reader(dir);
  // The other rank completes the commit and lets go.
  ASSERT_TRUE(CompleteCommit(local, dir, ".journal", IsModelFile, true).ok());
  other->reset();
  absl::Status read = reader.Join();
  EXPECT_TRUE(read.ok()) << read;
  EXPECT_EQ(*ReadSmallFile(local, JoinPath(dir, "a.model"), 100), "new");
}

// A holder that lets go without completing (a save that failed): the
// waiting reader takes the lock and completes the commit itself.
TEST(CommitJournal, AReaderCompletesWhatTheHolderLeft) {
  const std::string dir = PendingCommitDir("journal-left");
  FileSystemBase& local = LocalFileSystem();
  auto other = local.LockDirectory(dir, "a failing save", LockMode::kExclusive);
  ASSERT_TRUE(other.ok()) << other.status();
  WaitingReader reader(dir);
  other->reset();
  absl::Status read = reader.Join();
  EXPECT_TRUE(read.ok()) << read;
  EXPECT_EQ(*ReadSmallFile(local, JoinPath(dir, "a.model"), 100), "new");
  EXPECT_FALSE(*local.Exists(JoinPath(dir, ".journal")));
}

// With no time to wait, a held lock is refused at once, naming the journal
// and the holder; the commit stays pending for whoever comes next.
TEST(CommitJournal, AReaderThatMayNotWaitRefusesNamingTheHolder) {
  const std::string dir = PendingCommitDir("journal-nowait");
  FileSystemBase& local = LocalFileSystem();
  auto other = local.LockDirectory(dir, "pid 1 on host h (a save)",
                                   LockMode::kExclusive);
  ASSERT_TRUE(other.ok()) << other.status();
  absl::Status read = CompletePendingCommitForRead(
      local, dir, ".journal", IsModelFile, absl::ZeroDuration());
  EXPECT_EQ(read.code(), absl::StatusCode::kFailedPrecondition) << read;
  EXPECT_THAT(read.message(), HasSubstr(JoinPath(dir, ".journal")));
  EXPECT_THAT(read.message(), HasSubstr("pid 1 on host h (a save)"));
  EXPECT_TRUE(*local.Exists(JoinPath(dir, ".journal")));
}

// A lock no one can take (its file is a directory) is refused at once, not
// waited for as if another held it.
TEST(CommitJournal, AReaderDoesNotWaitForALockNoOneCanTake) {
  const std::string dir = PendingCommitDir("journal-lock-dir");
  FileSystemBase& local = LocalFileSystem();
  ASSERT_TRUE(local.CreateDir(JoinPath(dir, kDirectoryLockFileName)).ok());
  absl::Status read = CompletePendingCommitForRead(local, dir, ".journal",
                                                   IsModelFile, absl::Hours(1));
  EXPECT_EQ(read.code(), absl::StatusCode::kFailedPrecondition) << read;
  EXPECT_THAT(read.message(), HasSubstr("a directory"));
  EXPECT_TRUE(*local.Exists(JoinPath(dir, ".journal")));
}

// A save finding the lock held by a load that completes a pending commit
// (or found it completed) waits for that load instead of failing; a lock
// held by another save is refused at once, naming the holder.
TEST(CommitJournal, ASaveWaitsForALoadHoldingTheLockButNotForASave) {
  const std::string dir = PendingCommitDir("journal-save-after-load");
  FileSystemBase& local = LocalFileSystem();
  auto load = local.LockDirectory(
      dir, absl::StrCat("pid 1 on host h", kReaderLockHolder),
      LockMode::kExclusive);
  ASSERT_TRUE(load.ok()) << load.status();
  LockWatchingFileSystem fs;
  JournaledSave save;
  absl::Status locked;
  std::thread saver([&] {
    locked = save.LockAndRecover(fs, dir, "pid 2 on host h (a save)",
                                 [] { return absl::OkStatus(); });
  });
  fs.refused.WaitForNotification();  // Its first try found the load.
  load->reset();
  saver.join();
  EXPECT_TRUE(locked.ok()) << locked;
  save.Reset();

  auto other = local.LockDirectory(dir, "pid 3 on host h (a save)",
                                   LockMode::kExclusive);
  ASSERT_TRUE(other.ok()) << other.status();
  JournaledSave second;
  locked = second.LockAndRecover(local, dir, "pid 4 on host h (a save)",
                                 [] { return absl::OkStatus(); });
  EXPECT_EQ(locked.code(), absl::StatusCode::kFailedPrecondition) << locked;
  EXPECT_THAT(locked.message(), HasSubstr("pid 3 on host h (a save)"));
  other->reset();

  // A holder that has just locked and not described itself yet (an empty
  // description) is asked again rather than refused.
  auto fresh = local.LockDirectory(dir, "", LockMode::kExclusive);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  LockWatchingFileSystem watching;
  JournaledSave third;
  std::thread waiter([&] {
    locked = third.LockAndRecover(watching, dir, "pid 5 on host h (a save)",
                                  [] { return absl::OkStatus(); });
  });
  watching.refused.WaitForNotification();
  fresh->reset();
  waiter.join();
  EXPECT_TRUE(locked.ok()) << locked;
}

// A description failing with kDataLoss (a file the index names missing
// while a commit renames) is tried again, three tries in all; other
// failures and successes are returned at once.
TEST(CommitJournal, DescribingRetriesOnlyDataLossAndAtMostThreeTimes) {
  int calls = 0;
  absl::StatusOr<Metadata> described =
      DescribeWhileCommitsMayRun([&]() -> absl::StatusOr<Metadata> {
        if (++calls < 3) return absl::DataLossError("a file is missing");
        return Metadata{};
      });
  EXPECT_TRUE(described.ok()) << described.status();
  EXPECT_EQ(calls, 3);
  calls = 0;
  described = DescribeWhileCommitsMayRun([&]() -> absl::StatusOr<Metadata> {
    ++calls;
    return absl::DataLossError("damaged");
  });
  EXPECT_EQ(described.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(calls, 3);
  calls = 0;
  described = DescribeWhileCommitsMayRun([&]() -> absl::StatusOr<Metadata> {
    ++calls;
    return absl::NotFoundError("no checkpoint");
  });
  EXPECT_EQ(described.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace dcp::internal_io
