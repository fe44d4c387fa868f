// FileSystemWriter and the checkpoint directory: overlapping saves, orphans
// of interrupted saves, and hostile checkpoints.
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
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/fault_injection.h"
#include "io/file_system.h"
#include "io/file_system_storage.h"
#include "io/fs_layout.h"
#include "io/fs_test_helpers.h"
#include "io/metadata_format.h"
#include "io/testing/fake_planners.h"
#include "io/testing/metadata_surgery.h"
#include "io/testing/sample_state.h"

namespace dcp {
namespace {

using ::dcp::fs_testing::CommittedDataFiles;
using ::dcp::fs_testing::DataFiles;
using ::dcp::fs_testing::ExpectLoads;
using ::dcp::fs_testing::List;
using ::dcp::fs_testing::LoadSample;
using ::dcp::fs_testing::NewTestDir;
using ::dcp::fs_testing::ReadMetadataOf;
using ::dcp::fs_testing::Sample;
using ::dcp::fs_testing::Save;
using ::dcp::testing::FakeLoadPlanner;
using ::dcp::testing::FakeSavePlanner;
using ::dcp::testing::FlipByte;
using ::dcp::testing::LoadOneRank;
using ::dcp::testing::PatternTensor;
using ::dcp::testing::SaveOneRank;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsSupersetOf;
using ::testing::SizeIs;
using ::testing::UnorderedElementsAreArray;

// Saves into one directory that overlap, and what a save removes.

// A save of `sample` into `dir` stopped after WriteData (set up, data
// written, nothing committed); Commit() finishes it.
class OpenSave {
 public:
  OpenSave(const std::string& dir, const Sample& sample)
      : writer_(dir), planner_(sample.SavePlanner()) {}

  absl::Status Start() {
    DCP_RETURN_IF_ERROR(writer_.Reset(""));
    DCP_RETURN_IF_ERROR(writer_.SetUp(true, 0, false));
    DCP_ASSIGN_OR_RETURN(SavePlan local, planner_.CreateLocalPlan());
    DCP_ASSIGN_OR_RETURN(global_, planner_.CreateGlobalPlan({local}));
    DCP_ASSIGN_OR_RETURN(std::vector<SavePlan> plans,
                         writer_.PrepareGlobalPlan(global_.first));
    DCP_ASSIGN_OR_RETURN(results_,
                         writer_.WriteData(plans[0], planner_).Wait());
    return absl::OkStatus();
  }
  absl::Status Commit() {
    DCP_RETURN_IF_ERROR(writer_.Finish(global_.second, {results_}));
    return writer_.MarkCommitted();
  }
  const FileSystemWriter& writer() const { return writer_; }

 private:
  FileSystemWriter writer_;
  FakeSavePlanner planner_;
  std::pair<std::vector<SavePlan>, Metadata> global_;
  std::vector<WriteResult> results_;
};

TEST(ConcurrentSaveTest, SecondSaveFailsNamingTheHolderAndNothingIsLost) {
  // Before the lock, save B listed save A's unfinished data file as "old",
  // committed, and removed it; A then committed metadata naming it.
  const std::string dir = NewTestDir("concurrent");
  const Sample previous = Sample::Make(1);
  ASSERT_TRUE(Save(dir, previous).ok());
  OpenSave a(dir, Sample::Make(2));
  ASSERT_TRUE(a.Start().ok());
  const std::vector<std::string> during = List(dir);
  EXPECT_THAT(during, ::testing::Contains(std::string(kDirectoryLockFileName)));

  absl::Status b = Save(dir, Sample::Make(3));
  EXPECT_EQ(b.code(), absl::StatusCode::kFailedPrecondition) << b;
  EXPECT_THAT(b.message(),
              AllOf(HasSubstr(dir), HasSubstr(absl::StrCat("pid ", ::getpid())),
                    HasSubstr(a.writer().save_id()), HasSubstr("overlap")));
  EXPECT_EQ(List(dir), during);  // B wrote and removed nothing.
  ExpectLoads(dir, previous);

  ASSERT_TRUE(a.Commit().ok());
  ExpectLoads(dir, Sample::Make(2));
  // The lock went with A's commit, and its file with it.
  ASSERT_TRUE(Save(dir, Sample::Make(3)).ok());
  ExpectLoads(dir, Sample::Make(3));
  EXPECT_THAT(
      List(dir),
      ::testing::Not(::testing::Contains(std::string(kDirectoryLockFileName))));
}

TEST(ConcurrentSaveTest, AbortReleasesTheDirectory) {
  const std::string dir = NewTestDir("concurrent_abort");
  FileSystemWriter a(dir);
  ASSERT_TRUE(a.SetUp(true, 0, false).ok());
  EXPECT_EQ(Save(dir, Sample::Make(1)).code(),
            absl::StatusCode::kFailedPrecondition);
  a.Abort();
  EXPECT_TRUE(Save(dir, Sample::Make(1)).ok());
  EXPECT_THAT(
      List(dir),
      ::testing::Not(::testing::Contains(std::string(kDirectoryLockFileName))));
}

TEST(ConcurrentSaveTest, ASaveInAnotherProcessHoldsTheDirectory) {
  const std::string dir = NewTestDir("concurrent_fork");
  ASSERT_TRUE(Save(dir, Sample::Make(1)).ok());
  int ready[2], go[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(go), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Save 2 up to its commit, then wait for the parent's word.
    ::close(ready[0]);
    ::close(go[1]);
    OpenSave save(dir, Sample::Make(2));
    if (!save.Start().ok()) ::_exit(2);
    char c = 'x';
    if (::write(ready[1], &c, 1) != 1 || ::read(go[0], &c, 1) != 1) {
      ::_exit(3);
    }
    ::_exit(save.Commit().ok() ? 0 : 1);
  }
  ::close(ready[1]);
  ::close(go[0]);
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1) << "the child's save did not start";
  absl::Status second = Save(dir, Sample::Make(3));
  ASSERT_EQ(::write(go[1], "x", 1), 1);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
  ::close(ready[0]);
  ::close(go[1]);
  EXPECT_EQ(second.code(), absl::StatusCode::kFailedPrecondition) << second;
  EXPECT_THAT(second.message(), HasSubstr(absl::StrCat("pid ", child, " ")));
  ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << wstatus;
  ExpectLoads(dir, Sample::Make(2));
}

TEST(ConcurrentSaveTest,
     SharedHoldersKeepExclusiveOnesOutAndTheLastRemovesTheFile) {
  const std::string dir = NewTestDir("lock_modes");
  FileSystemBase& fs = LocalFileSystem();
  const std::string file = JoinPath(dir, kDirectoryLockFileName);
  auto a = fs.LockDirectory(dir, "shared a", LockMode::kShared);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = fs.LockDirectory(dir, "shared b", LockMode::kShared);
  ASSERT_TRUE(b.ok()) << b.status();
  auto exclusive = fs.LockDirectory(dir, "alone", LockMode::kExclusive);
  EXPECT_EQ(exclusive.status().code(), absl::StatusCode::kFailedPrecondition)
      << exclusive.status();
  EXPECT_THAT(exclusive.status().message(),
              AllOf(HasSubstr(dir), HasSubstr("shared b")));
  EXPECT_TRUE(IsLockHeld(exclusive.status()));
  a->reset();  // Not the last: the file stays, and so does the lock.
  EXPECT_TRUE(std::filesystem::exists(file));
  EXPECT_EQ(
      fs.LockDirectory(dir, "alone", LockMode::kExclusive).status().code(),
      absl::StatusCode::kFailedPrecondition);
  b->reset();  // The last shared holder removes the file.
  EXPECT_FALSE(std::filesystem::exists(file));
  exclusive = fs.LockDirectory(dir, "alone", LockMode::kExclusive);
  ASSERT_TRUE(exclusive.ok()) << exclusive.status();
  auto shared = fs.LockDirectory(dir, "shared c", LockMode::kShared);
  EXPECT_EQ(shared.status().code(), absl::StatusCode::kFailedPrecondition)
      << shared.status();
  EXPECT_THAT(shared.status().message(), HasSubstr("alone"));
  EXPECT_TRUE(IsLockHeld(shared.status()));
  exclusive->reset();
  EXPECT_FALSE(std::filesystem::exists(file));
}

// A lock file that is no regular file is a lock no one can take, not one
// held (which a waiter could wait for).
TEST(ConcurrentSaveTest, ALockFileThatIsNoFileIsNotHeld) {
  const std::string dir = NewTestDir("lock_not_a_file");
  FileSystemBase& fs = LocalFileSystem();
  ASSERT_TRUE(
      fs.CreateDir(JoinPath(dir, kDirectoryLockFileName)).ok());  // EISDIR
  auto lock = fs.LockDirectory(dir, "me", LockMode::kExclusive);
  ASSERT_FALSE(lock.ok());
  EXPECT_FALSE(IsLockHeld(lock.status())) << lock.status();
  EXPECT_FALSE(IsLockHeld(absl::FailedPreconditionError("x")));
}

// A save of all ranks together and rank-local saves into one directory
// exclude each other while they run (each refuses the other's committed
// metadata only once it is there), while rank-local saves of different
// ranks run together.
// A rank-local save runs alone (the engine passes rank 0): its failures
// name the group rank it saves for.
TEST(RankLocalTest, FailuresNameTheGroupRank) {
  const std::string dir = NewTestDir("rank_local_names");
  FaultInjectionFileSystem faulty(LocalFileSystem());
  faulty.Inject(Fault{FaultOp::kOpen, EIO, ".dcp-probe-", 0});
  FileSystemWriterOptions options;
  options.file_system = &faulty;
  FileSystemWriter writer(dir, options);
  ASSERT_TRUE(writer.SelectRankLocal(3).ok());
  absl::Status s = writer.SetUp(true, 0, false);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("rank 3: checkpoint directory"));
  EXPECT_THAT(s.message(), ::testing::Not(HasSubstr("rank 0")));
}

TEST(ConcurrentSaveTest, TheTwoLayoutsNeverSaveIntoOneDirectoryAtOnce) {
  const std::string dir = NewTestDir("layout_locks");
  FileSystemWriter together(dir);
  ASSERT_TRUE(together.SetUp(true, 0, true).ok());
  FileSystemWriter rank1(dir);
  ASSERT_TRUE(rank1.SelectRankLocal(1).ok());
  absl::Status s = rank1.SetUp(true, 1, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), AllOf(HasSubstr(dir), HasSubstr("overlap"),
                                 HasSubstr(together.save_id())));
  together.Abort();

  ASSERT_TRUE(rank1.SetUp(true, 1, false).ok());
  FileSystemWriter rank0(dir);
  ASSERT_TRUE(rank0.SelectRankLocal(0).ok());
  ASSERT_TRUE(rank0.SetUp(true, 0, false).ok());
  s = together.SetUp(true, 0, true);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("rank-local"));
  rank1.Abort();
  EXPECT_EQ(together.SetUp(true, 0, true).code(),
            absl::StatusCode::kFailedPrecondition);
  rank0.Abort();
  ASSERT_TRUE(together.SetUp(true, 0, true).ok());
  together.Abort();
  EXPECT_THAT(
      List(dir),
      ::testing::Not(::testing::Contains(std::string(kDirectoryLockFileName))));
}

// A save's process forks (a data-loader worker) and dies without releasing
// its lock: the child's copy of the lock's descriptor must not keep the
// directory locked while the child lives.
TEST(ConcurrentSaveTest, AForkedChildDoesNotKeepADeadHoldersLock) {
  const std::string dir = NewTestDir("lock_fork_child");
  int ready[2], go[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(go), 0);
  const pid_t holder = ::fork();
  ASSERT_GE(holder, 0);
  if (holder == 0) {
    ::close(ready[0]);
    ::close(go[1]);
    auto lock = LocalFileSystem().LockDirectory(dir, "the holder",
                                                LockMode::kExclusive);
    if (!lock.ok()) ::_exit(2);
    const pid_t worker = ::fork();
    if (worker < 0) ::_exit(3);
    if (worker == 0) {
      // Past fork(2), so the fork handlers have run here: says so, then
      // lives until the test's word, holding whatever it kept.
      char c = 'x';
      if (::write(ready[1], &c, 1) != 1) ::_exit(4);
      ::close(ready[1]);
      ::_exit(::read(go[0], &c, 1) == 1 ? 0 : 1);
    }
    ::_exit(0);  // Dies holding the lock: no destructor runs.
  }
  ::close(ready[1]);
  ::close(go[0]);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(holder, &wstatus, 0), holder);
  ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << wstatus;
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1) << "the worker was not started";
  // The lock file is still there, and the worker is still alive.
  EXPECT_TRUE(std::filesystem::exists(JoinPath(dir, kDirectoryLockFileName)));
  absl::StatusOr<std::unique_ptr<DirectoryLock>> lock =
      LocalFileSystem().LockDirectory(dir, "the next saver",
                                      LockMode::kExclusive);
  ASSERT_EQ(::write(go[1], "x", 1), 1);
  ::close(ready[0]);
  ::close(go[1]);
  EXPECT_TRUE(lock.ok()) << lock.status();
}

// Writes a file of `bytes` bytes at `dir`/`name`.
void WriteFileOfSize(const std::string& dir, const std::string& name,
                     int64_t bytes) {
  std::ofstream(JoinPath(dir, name)) << std::string(bytes, 'o');
}

// Names shaped like the writer's files but not quite, and other files that
// are not the writer's: no cleanup may touch them.
const std::vector<std::string>& Strangers() {
  static const auto* names = new std::vector<std::string>{
      "notes.txt",
      "__notes.distcp",
      "__0_DEADBEEF00000000_0.distcp",  // Upper-case save id.
      "__0_00000000deadbee_0.distcp",   // 15 hex digits.
      "__0_00000000deadbeef_0.distcp.bak",
      "__x_00000000deadbeef_0.distcp",
      ".metadata.tmp-user",
      ".metadata.tmp-00000000deadbeef.old",
  };
  return *names;
}

TEST(OrphanTest, ASaveRemovesTheOrphansOfInterruptedSavesAndNothingElse) {
  const std::string root = NewTestDir("orphans");
  const std::string dir = JoinPath(root, "ckpt");
  ASSERT_TRUE(Save(dir, Sample::Make(1)).ok());
  const std::vector<std::string> old_files = DataFiles(dir);
  // What interrupted saves leave: data files of several ranks and saves, a
  // temporary metadata file.
  const std::vector<std::string> orphans = {
      ".metadata.tmp-00000000deadbeef", "__0_00000000deadbeef_0.distcp",
      "__0_00000000deadbeef_1.distcp", "__12_0123456789abcdef_3.distcp"};
  for (size_t i = 0; i < orphans.size(); ++i) {
    WriteFileOfSize(dir, orphans[i], 1000 * (i + 1));
  }
  for (const std::string& name : Strangers()) WriteFileOfSize(dir, name, 10);
  // Named like a data file, but a link (to a file outside) and a FIFO.
  WriteFileOfSize(root, "target", 10);
  ASSERT_EQ(::symlink(JoinPath(root, "target").c_str(),
                      JoinPath(dir, "__1_00000000deadbeef_0.distcp").c_str()),
            0);
  ASSERT_EQ(
      ::mkfifo(JoinPath(dir, "__2_00000000deadbeef_0.distcp").c_str(), 0644),
      0);

  FileSystemWriter writer(dir);
  FakeSavePlanner planner = Sample::Make(2).SavePlanner();
  ASSERT_TRUE(SaveOneRank(writer, planner).ok());
  ExpectLoads(dir, Sample::Make(2));
  EXPECT_THAT(writer.orphan_cleanup().removed,
              ElementsAre(orphans[0], orphans[1], orphans[2], orphans[3]));
  EXPECT_EQ(writer.orphan_cleanup().removed_bytes, 10000);
  EXPECT_TRUE(writer.orphan_cleanup().left.empty());
  EXPECT_TRUE(writer.orphan_cleanup().status.ok());
  std::vector<std::string> expected = Strangers();
  expected.push_back("__1_00000000deadbeef_0.distcp");
  expected.push_back("__2_00000000deadbeef_0.distcp");
  for (const std::string& name : CommittedDataFiles(dir)) {
    expected.push_back(name);
  }
  expected.push_back(kMetadataFileName);
  EXPECT_THAT(List(dir), UnorderedElementsAreArray(expected));
  for (const std::string& name : old_files) {
    EXPECT_THAT(List(dir), ::testing::Not(::testing::Contains(name)));
  }
  EXPECT_THAT(List(root), ::testing::Contains("target"));
}

// Probe files hold no data: the next save's sweep removes the ones that
// interrupted saves left, and a rank whose probe the sweep took first (it
// is gone before the rank removes it) has still probed successfully.
TEST(OrphanTest, ProbesOfInterruptedSavesGoAndAProbeAlreadyGoneIsNoError) {
  const std::string dir = NewTestDir("orphan_probes");
  ASSERT_TRUE(Save(dir, Sample::Make(1)).ok());
  const std::vector<std::string> probes = {".dcp-probe-0-00000000deadbeef",
                                           ".dcp-probe-7-0123456789abcdef"};
  for (const std::string& name : probes) WriteFileOfSize(dir, name, 0);
  FileSystemWriter writer(dir);
  FakeSavePlanner planner = Sample::Make(2).SavePlanner();
  ASSERT_TRUE(SaveOneRank(writer, planner).ok());
  EXPECT_THAT(writer.orphan_cleanup().removed,
              ElementsAre(probes[0], probes[1]));
  std::vector<std::string> expected = CommittedDataFiles(dir);
  expected.push_back(kMetadataFileName);
  EXPECT_THAT(List(dir), UnorderedElementsAreArray(expected));

  FaultInjectionFileSystem faulty(LocalFileSystem());
  faulty.Inject(Fault{FaultOp::kUnlink, ENOENT, ".dcp-probe-", 0});
  FileSystemWriterOptions options;
  options.file_system = &faulty;
  FileSystemWriter swept(dir, options);
  FakeSavePlanner planner3 = Sample::Make(3).SavePlanner();
  absl::Status saved = SaveOneRank(swept, planner3);
  ASSERT_TRUE(saved.ok()) << saved;
  EXPECT_GE(faulty.calls(FaultOp::kUnlink), 1);
  ExpectLoads(dir, Sample::Make(3));
  // The failed removal left the probe; the next save sweeps it.
  EXPECT_THAT(List(dir), Contains(::testing::StartsWith(".dcp-probe-0-")));
  ASSERT_TRUE(Save(dir, Sample::Make(4)).ok());
  expected = CommittedDataFiles(dir);
  expected.push_back(kMetadataFileName);
  EXPECT_THAT(List(dir), UnorderedElementsAreArray(expected));
}

TEST(OrphanTest, OrphansGoAtSetUpBeforeTheSaveWritesAnything) {
  const std::string dir = NewTestDir("orphans_setup");
  const Sample sample = Sample::Make(1);
  ASSERT_TRUE(Save(dir, sample).ok());
  const std::vector<std::string> committed = List(dir);
  WriteFileOfSize(dir, "__0_00000000deadbeef_0.distcp", 4096);
  FileSystemWriter writer(dir);
  ASSERT_TRUE(writer.SetUp(true, 0, false).ok());
  // Only the lock and the save's marker were added; the committed
  // checkpoint is untouched.
  std::vector<std::string> expected = committed;
  expected.push_back(kDirectoryLockFileName);
  expected.push_back(internal_fs::SaveMarkerFileName(writer.save_id()));
  EXPECT_THAT(List(dir), UnorderedElementsAreArray(expected));
  ExpectLoads(dir, sample);
  writer.Abort();
  EXPECT_EQ(List(dir), committed);
}

TEST(OrphanTest, InterruptedSavesDoNotAccumulate) {
  // Each save below stops after writing its data (the process "dies": no
  // Abort, no commit). The next one removes what it left, so the directory
  // never holds more than the checkpoint and one interrupted save's files.
  const std::string dir = NewTestDir("orphans_interrupted");
  ASSERT_TRUE(Save(dir, Sample::Make(1)).ok());
  const std::vector<std::string> committed = List(dir);
  std::vector<std::string> left_by_previous;
  for (uint32_t seed = 2; seed < 5; ++seed) {
    OpenSave save(dir, Sample::Make(seed));
    ASSERT_TRUE(save.Start().ok());
    EXPECT_EQ(save.writer().orphan_cleanup().removed, left_by_previous);
    left_by_previous.clear();
    for (const std::string& name : List(dir)) {
      if (!absl::c_linear_search(committed, name) &&
          name != kDirectoryLockFileName) {
        left_by_previous.push_back(name);
      }
    }
    // Its data file and its marker.
    EXPECT_THAT(left_by_previous, SizeIs(2));
  }  // Each writer goes without Abort: its files stay behind.
  ExpectLoads(dir, Sample::Make(1));
  ASSERT_TRUE(Save(dir, Sample::Make(5)).ok());
  ExpectLoads(dir, Sample::Make(5));
  std::vector<std::string> expected = CommittedDataFiles(dir);
  expected.push_back(kMetadataFileName);
  EXPECT_THAT(List(dir), UnorderedElementsAreArray(expected));
}

TEST(OrphanTest, WithoutMetadataEveryFileOfTheWritersNamingIsAnOrphan) {
  // A first save into the directory was interrupted: nothing is committed.
  const std::string dir = NewTestDir("orphans_first_save");
  WriteFileOfSize(dir, "__0_00000000deadbeef_0.distcp", 100);
  WriteFileOfSize(dir, "__1_00000000deadbeef_0.distcp", 200);
  for (const std::string& name : Strangers()) WriteFileOfSize(dir, name, 10);
  OrphanCleanup cleanup = RemoveOrphans(LocalFileSystem(), dir);
  EXPECT_TRUE(cleanup.status.ok()) << cleanup.status;
  EXPECT_THAT(cleanup.removed, ElementsAre("__0_00000000deadbeef_0.distcp",
                                           "__1_00000000deadbeef_0.distcp"));
  EXPECT_EQ(cleanup.removed_bytes, 300);
  EXPECT_THAT(List(dir), UnorderedElementsAreArray(Strangers()));
  EXPECT_EQ(cleanup.Summary(dir),
            absl::StrCat("removed 2 orphaned file(s) of interrupted saves "
                         "(300 bytes) from ",
                         dir));
  // Nothing left to find, nothing to say.
  cleanup = RemoveOrphans(LocalFileSystem(), dir);
  EXPECT_TRUE(cleanup.removed.empty());
  EXPECT_EQ(cleanup.Summary(dir), "");
}

TEST(OrphanTest, UnreadableMetadataLeavesEveryFile) {
  // Which files a metadata that cannot be decoded names is unknown: neither
  // RemoveOrphans nor a save removes anything.
  const std::string dir = NewTestDir("orphans_unreadable");
  ASSERT_TRUE(Save(dir, Sample::Make(1)).ok());
  WriteFileOfSize(dir, "__0_00000000deadbeef_0.distcp", 100);
  FlipByte(JoinPath(dir, kMetadataFileName), 40);  // Payload checksum fails.
  const std::vector<std::string> before = List(dir);
  OrphanCleanup cleanup = RemoveOrphans(LocalFileSystem(), dir);
  EXPECT_EQ(cleanup.status.code(), absl::StatusCode::kDataLoss)
      << cleanup.status;
  EXPECT_TRUE(cleanup.removed.empty());
  EXPECT_THAT(cleanup.Summary(dir),
              AllOf(HasSubstr("were not removed"), HasSubstr(".metadata")));
  EXPECT_EQ(List(dir), before);

  FileSystemWriter writer(dir);
  FakeSavePlanner planner = Sample::Make(2).SavePlanner();
  ASSERT_TRUE(SaveOneRank(writer, planner).ok());
  ExpectLoads(dir, Sample::Make(2));
  EXPECT_EQ(writer.orphan_cleanup().status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(List(dir), IsSupersetOf(before));
}

}  // namespace
}  // namespace dcp

// Crafted and hostile checkpoints: every case is a clear error, never a
// crash, a hang, an unbounded allocation or a read outside the checkpoint.
namespace dcp {
namespace {

using ::dcp::testing::ClaimLength;
using ::dcp::testing::RewriteMetadataFile;

TEST(HostileCheckpointTest, ChunkSizesWhoseBytesWrapAreDataLossNotACrash) {
  // w is 4 x 6 int32 (96 bytes). Its chunk claims 4 x (2^62 + 6) elements:
  // 4 bytes each, that wraps to 96 bytes, which once passed the length
  // check and sent the copy far past the 96-byte buffer.
  const std::string dir = NewTestDir("wrapped_chunk");
  FakeSavePlanner save;
  save.AddTensor("w", PatternTensor(DType::kI32, {4, 6}, 1));
  FileSystemWriter writer(dir);
  ASSERT_TRUE(SaveOneRank(writer, save).ok());
  ASSERT_TRUE(RewriteMetadataFile(dir, [](format::Metadata& proto) {
                proto.set_chunk_sizes(1, (int64_t{1} << 62) + 6);
              }).ok());

  FakeLoadPlanner load;
  Tensor dest = Tensor::Empty(DType::kI32, {4, 6});
  load.SetDestination(MetadataIndex("w", Shape{0, 0}), dest);
  LoadPlan plan;
  ReadItem item;
  item.storage_index = MetadataIndex("w", Shape{0, 0});
  item.storage_offsets = {0, 0};
  item.dest_index = MetadataIndex("w", Shape{0, 0});
  item.dest_offsets = {0, 0};
  item.lengths = {4, 6};
  plan.items.push_back(item);
  FileSystemReader reader(dir);
  absl::Status status = LoadOneRank(reader, load, &plan);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("tensor w"), HasSubstr("outside")));
}

TEST(HostileCheckpointTest, ItemLongerThanItsFileIsDataLossBeforeAllocating) {
  // The bytes value "step" claims 1 TiB (with a consistent 1024 checksums of
  // 1 GiB blocks): reading it whole once meant allocating 1 TiB.
  const std::string dir = NewTestDir("huge_item");
  ASSERT_TRUE(Save(dir, Sample::Make(1)).ok());
  ASSERT_TRUE(RewriteMetadataFile(dir, [](format::Metadata& proto) {
                ASSERT_TRUE(ClaimLength(proto, "step", int64_t{1} << 40,
                                        kMaxChecksumBlockSize));
              }).ok());
  absl::Status status = LoadSample(dir, Sample::Make(1));
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), AllOf(HasSubstr("step"), HasSubstr("truncated"),
                                      HasSubstr(".distcp")));
}

TEST(HostileCheckpointTest, ItemLargerThanMemoryIsAnErrorNotAnAbort) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "sanitizers report a 1 TiB allocation instead of failing it";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  GTEST_SKIP() << "sanitizers report a 1 TiB allocation instead of failing it";
#endif
#endif
  // As above, but the data files are sparse files long enough for the
  // claim: the read buffer of 1 TiB cannot be had, which once threw
  // std::bad_alloc on a reader thread and aborted the process.
  const std::string dir = NewTestDir("huge_sparse_item");
  ASSERT_TRUE(Save(dir, Sample::Make(1)).ok());
  ASSERT_TRUE(RewriteMetadataFile(dir, [](format::Metadata& proto) {
                ASSERT_TRUE(ClaimLength(proto, "step", int64_t{1} << 40,
                                        kMaxChecksumBlockSize));
              }).ok());
  for (const std::string& name : DataFiles(dir)) {
    if (::truncate(JoinPath(dir, name).c_str(), int64_t{1} << 41) != 0) {
      GTEST_SKIP() << "no 2 TiB sparse file here: " << std::strerror(errno);
    }
  }
  absl::Status status = LoadSample(dir, Sample::Make(1));
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr("step"), HasSubstr("cannot allocate"),
                    HasSubstr(".distcp")));
}

TEST(HostileCheckpointTest, DataFileOutsideTheCheckpointIsNeverOpened) {
  const std::string root = NewTestDir("traversal");
  const std::string dir = JoinPath(root, "ckpt");
  const Sample sample = Sample::Make(1);
  ASSERT_TRUE(Save(dir, sample).ok());
  // An identical copy outside: a load that followed the name would succeed.
  const std::string name = DataFiles(dir).at(0);
  ASSERT_TRUE(LocalFileSystem().CreateDir(JoinPath(root, "outside")).ok());
  std::filesystem::copy_file(JoinPath(dir, name),
                             JoinPath(root, "outside/" + name));
  ASSERT_TRUE(RewriteMetadataFile(dir, [&](format::Metadata& proto) {
                *proto.mutable_files(0) = "../outside/" + name;
              }).ok());
  absl::Status status = LoadSample(dir, sample);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr("../outside/" + name));
}

TEST(HostileCheckpointTest, SymlinkedDataFileIsNotFollowed) {
  const std::string root = NewTestDir("symlink");
  const std::string dir = JoinPath(root, "ckpt");
  const Sample sample = Sample::Make(1);
  ASSERT_TRUE(Save(dir, sample).ok());
  const std::string name = DataFiles(dir).at(0);
  const std::string elsewhere = JoinPath(root, "elsewhere.distcp");
  ASSERT_EQ(::rename(JoinPath(dir, name).c_str(), elsewhere.c_str()), 0);
  ASSERT_EQ(::symlink(elsewhere.c_str(), JoinPath(dir, name).c_str()), 0);
  absl::Status status = LoadSample(dir, sample);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr(name), HasSubstr("symbolic link")));
}

TEST(HostileCheckpointTest, FifosAreRefusedWithoutBlocking) {
  // A FIFO blocks open(2) until a writer comes: none will.
  const std::string dir = NewTestDir("fifo");
  const Sample sample = Sample::Make(1);
  ASSERT_TRUE(Save(dir, sample).ok());
  const std::string name = DataFiles(dir).at(0);
  ASSERT_EQ(::unlink(JoinPath(dir, name).c_str()), 0);
  ASSERT_EQ(::mkfifo(JoinPath(dir, name).c_str(), 0644), 0);
  absl::Status data = LoadSample(dir, sample);
  EXPECT_EQ(data.code(), absl::StatusCode::kFailedPrecondition) << data;
  EXPECT_THAT(data.message(), AllOf(HasSubstr(name), HasSubstr("FIFO")));

  const std::string metadata = JoinPath(dir, kMetadataFileName);
  ASSERT_EQ(::unlink(metadata.c_str()), 0);
  ASSERT_EQ(::mkfifo(metadata.c_str(), 0644), 0);
  absl::StatusOr<Metadata> read = ReadMetadataOf(dir);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(read.status().message(),
              AllOf(HasSubstr(metadata), HasSubstr("FIFO")));
  // A save over it reads no previous checkpoint there, and replaces it.
  ASSERT_TRUE(Save(dir, Sample::Make(2)).ok());
  ExpectLoads(dir, Sample::Make(2));
}

TEST(HostileCheckpointTest, HugeSparseMetadataIsRefusedUnread) {
  const std::string dir = NewTestDir("sparse_metadata");
  ASSERT_TRUE(Save(dir, Sample::Make(1)).ok());
  const std::string metadata = JoinPath(dir, kMetadataFileName);
  if (::truncate(metadata.c_str(), int64_t{100} << 30) != 0) {
    GTEST_SKIP() << "no 100 GiB sparse file here: " << std::strerror(errno);
  }
  absl::StatusOr<Metadata> read = ReadMetadataOf(dir);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(
      read.status().message(),
      AllOf(HasSubstr(metadata), HasSubstr("more than any dcp metadata file")));
}

}  // namespace
}  // namespace dcp
