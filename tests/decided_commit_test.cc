// A save on four processes (Gloo) over a committed checkpoint, through each
// storage, whose coordinator fails once its commit is decided: the native
// writer's directory fsync after the .metadata rename, the first file
// rename after MEGA's or Hugging Face's journal is durable. Every rank
// reports the failure, and the directory must then load as one checkpoint:
// each rank saves a tensor of its own, holding the save's step, into a
// file of its own, and all four must come from the same save.
//
// Every rank keeps what it wrote: the coordinator broadcasts that its
// commit was decided (StorageWriter::CommitDecided), the other ranks call
// MarkCommitted instead of Abort, and the coordinator's Abort completes a
// decided MEGA or Hugging Face commit.
#include <unistd.h>

#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/checkpoint.h"
#include "gtest/gtest.h"
#include "io/fault_injection.h"
#include "io/file_system_storage.h"
#include "io/hf_storage.h"
#include "io/mega_storage.h"
#include "tests/comm/multiprocess.h"
#include "tests/global_tensors.h"

namespace dcp {
namespace {

using ::dcp::testing::Check;
using ::dcp::testing::FreshTestDir;
using ::dcp::testing::RunGlooWorld;

constexpr int kRanks = 4;

struct Storage {
  std::string name;
  // A writer into `dir` through `fs`.
  std::function<std::unique_ptr<StorageWriter>(const std::string& dir,
                                               FileSystemBase* fs)>
      writer;
  std::function<std::unique_ptr<StorageReader>(const std::string& dir)> reader;
  // Fails the coordinator once its commit is decided.
  Fault fault;

  friend void PrintTo(const Storage& storage, std::ostream* os) {
    *os << storage.name;
  }
};

// Rank `rank`'s own tensor.
std::string TagOf(int rank) { return absl::StrCat("tag", rank); }

std::vector<Storage> Storages() {
  const Fault second_rename{.op = FaultOp::kRename, .error = EIO, .nth = 2};
  std::map<std::string, int> file_per_rank;
  for (int rank = 0; rank < kRanks; ++rank) {
    file_per_rank[TagOf(rank)] = rank + 1;
  }
  return {
      {"native",
       [](const std::string& dir, FileSystemBase* fs) {
         FileSystemWriterOptions options;
         options.file_system = fs;
         return std::make_unique<FileSystemWriter>(dir, options);
       },
       [](const std::string& dir) {
         return std::make_unique<FileSystemReader>(dir);
       },
       // The first makes the data files' names durable, the second the
       // .metadata rename.
       Fault{.op = FaultOp::kSyncDir, .error = EIO, .nth = 2}},
      {"mega",
       [](const std::string& dir, FileSystemBase* fs) {
         MegaStorageWriterOptions options;
         options.file_system = fs;
         return std::make_unique<MegaStorageWriter>(dir, options);
       },
       [](const std::string& dir) {
         return std::make_unique<MegaStorageReader>(dir);
       },
       // The journal's rename is the first.
       second_rename},
      {"hf",
       [file_per_rank](const std::string& dir, FileSystemBase* fs) {
         HuggingFaceStorageWriterOptions options;
         options.file_system = fs;
         options.fqn_to_index_mapping = file_per_rank;
         return std::make_unique<HuggingFaceStorageWriter>(dir, options);
       },
       [](const std::string& dir) {
         return std::make_unique<HuggingFaceStorageReader>(dir);
       },
       second_rename},
  };
}

class DecidedCommitTest : public ::testing::TestWithParam<Storage> {};

TEST_P(DecidedCommitTest, AFailureOnceTheCommitIsDecidedLeavesOneCheckpoint) {
  const Storage& storage = GetParam();
  const std::string dir = FreshTestDir(storage.name);
  auto save = [&](int64_t step, bool fail) {
    return RunGlooWorld(kRanks, [&](int rank, comm::ProcessGroup& group) {
      FaultInjectionFileSystem faulty(LocalFileSystem());
      if (fail && rank == 0) faulty.Inject(storage.fault);
      std::unique_ptr<StorageWriter> writer = storage.writer(dir, &faulty);
      Tensor tag = Tensor::Empty(DType::kI64, {1});
      *static_cast<int64_t*>(tag.data()) = step;
      StateDict state;
      state[TagOf(rank)] = tag;
      SaveOptions save;
      save.storage_writer = writer.get();
      save.process_group = &group;
      absl::Status status = Save(state, save).status();
      return Check(status.ok() != fail, rank, status.ToString());
    });
  };
  ASSERT_EQ(save(1, /*fail=*/false), 0);
  ASSERT_EQ(save(2, /*fail=*/true), 0);
  StateDict state;
  for (int rank = 0; rank < kRanks; ++rank) {
    state[TagOf(rank)] = Tensor::Empty(DType::kI64, {1});
  }
  std::unique_ptr<StorageReader> reader = storage.reader(dir);
  LoadOptions load;
  load.storage_reader = reader.get();
  absl::Status loaded = Load(state, load);
  ASSERT_TRUE(loaded.ok()) << loaded;
  std::string steps;
  for (int rank = 0; rank < kRanks; ++rank) {
    absl::StrAppend(&steps,
                    *static_cast<int64_t*>(state[TagOf(rank)].tensor().data()));
  }
  EXPECT_TRUE(steps == "1111" || steps == "2222")
      << "each rank's file from save: " << steps;
}

// The local file system, except that the process exits (as if killed) at
// its `nth` directory sync.
class ExitAtSyncDir final : public FileSystemBase {
 public:
  explicit ExitAtSyncDir(int nth) : nth_(nth) {}
  absl::StatusOr<std::unique_ptr<File>> OpenForWrite(
      const std::string& path, const OpenOptions& options) override {
    return fs_.OpenForWrite(path, options);
  }
  absl::StatusOr<std::unique_ptr<File>> OpenForRead(
      const std::string& path, const OpenOptions& options) override {
    return fs_.OpenForRead(path, options);
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    return fs_.Rename(from, to);
  }
  absl::Status RemoveFile(const std::string& path) override {
    return fs_.RemoveFile(path);
  }
  absl::Status CreateDir(const std::string& path) override {
    return fs_.CreateDir(path);
  }
  absl::StatusOr<bool> Exists(const std::string& path) override {
    return fs_.Exists(path);
  }
  absl::StatusOr<bool> IsSymbolicLink(const std::string& path) override {
    return fs_.IsSymbolicLink(path);
  }
  absl::StatusOr<std::vector<std::string>> ListDir(
      const std::string& path) override {
    return fs_.ListDir(path);
  }
  absl::Status SyncDir(const std::string& path) override {
    absl::Status status = fs_.SyncDir(path);
    if (++syncs_ == nth_) _exit(0);
    return status;
  }
  absl::StatusOr<std::unique_ptr<DirectoryLock>> LockDirectory(
      const std::string& dir, absl::string_view holder,
      LockMode mode) override {
    return fs_.LockDirectory(dir, holder, mode);
  }

 private:
  FileSystemBase& fs_ = LocalFileSystem();
  const int nth_;
  int syncs_ = 0;
};

// The coordinator commits (the native .metadata rename is durable) and is
// gone before it can tell the others: they cannot know the outcome, so they
// keep their files, which the committed checkpoint names.
TEST(CoordinatorGoneAfterCommit, TheOtherRanksKeepTheirFiles) {
  const std::string dir = FreshTestDir("gone_after_commit");
  auto save = [&](int64_t step, bool exit_after_commit) {
    return RunGlooWorld(kRanks, [&](int rank, comm::ProcessGroup& group) {
      // The first sync makes the data files' names durable, the second the
      // .metadata rename.
      ExitAtSyncDir exiting(exit_after_commit && rank == 0 ? 2 : 0);
      FileSystemWriterOptions options;
      options.file_system = &exiting;
      FileSystemWriter writer(dir, options);
      Tensor tag = Tensor::Empty(DType::kI64, {1});
      *static_cast<int64_t*>(tag.data()) = step;
      StateDict state;
      state[TagOf(rank)] = tag;
      SaveOptions save;
      save.storage_writer = &writer;
      save.process_group = &group;
      absl::Status status = Save(state, save).status();
      if (!exit_after_commit)
        return Check(status.ok(), rank, status.ToString());
      return Check(
          !status.ok() && absl::StrContains(status.message(), "kept its files"),
          rank, status.ToString());
    });
  };
  ASSERT_EQ(save(1, /*exit_after_commit=*/false), 0);
  ASSERT_EQ(save(2, /*exit_after_commit=*/true), 0);
  StateDict state;
  for (int rank = 0; rank < kRanks; ++rank) {
    state[TagOf(rank)] = Tensor::Empty(DType::kI64, {1});
  }
  FileSystemReader reader(dir);
  LoadOptions load;
  load.storage_reader = &reader;
  absl::Status loaded = Load(state, load);
  ASSERT_TRUE(loaded.ok()) << loaded;
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_EQ(*static_cast<int64_t*>(state[TagOf(rank)].tensor().data()), 2)
        << "rank " << rank;
  }
}

INSTANTIATE_TEST_SUITE_P(Storages, DecidedCommitTest,
                         ::testing::ValuesIn(Storages()),
                         [](const ::testing::TestParamInfo<Storage>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace dcp
