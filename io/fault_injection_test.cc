// Saves and loads under injected faults: every fault site in a save returns
// the right code and a message naming operation and file, commits no
// metadata, leaves the previous checkpoint loadable bit for bit and the
// directory as it was, and leaks no descriptor or thread; simulated crashes
// at every step leave the old or the new checkpoint complete; load faults
// are clear errors.
#include "io/fault_injection.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file_system_storage.h"
#include "io/metadata_format.h"
#include "io/testing/fake_planners.h"
#include "io/testing/sample_state.h"

namespace dcp {
namespace {

using ::dcp::testing::ListNames;
using ::dcp::testing::LoadAndCompare;
using ::dcp::testing::NewTestDir;
using ::dcp::testing::SampleState;
using ::dcp::testing::SaveSample;
using ::testing::AllOf;
using ::testing::HasSubstr;

int CountEntries(const char* dir) {
  int n = 0;
  if (DIR* d = ::opendir(dir)) {
    while (::readdir(d) != nullptr) ++n;
    ::closedir(d);
  }
  return n;
}

// The threads of this process, tid to name, not counting the kernel's
// io_uring workers ("iou-wrk-*": they serve the thread that submitted and
// the kernel retires them after a few idle seconds, so they are no leak of
// ours).
std::map<pid_t, std::string> Threads() {
  std::map<pid_t, std::string> threads;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (dirent* entry = ::readdir(d)) {
      if (entry->d_name[0] == '.') continue;
      std::ifstream comm(
          absl::StrCat("/proc/self/task/", entry->d_name, "/comm"));
      std::string name;
      std::getline(comm, name);
      if (name.rfind("iou-", 0) != 0) {
        threads.emplace(static_cast<pid_t>(std::atoi(entry->d_name)), name);
      }
    }
    ::closedir(d);
  }
  return threads;
}

// Whether thread `tid` of this process is past exit_mm (no "VmSize" line in
// its status, or gone): exiting.
bool ThreadExiting(pid_t tid) {
  std::ifstream status(absl::StrCat("/proc/self/task/", tid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmSize:", 0) == 0) return false;
  }
  return true;
}

// The threads started since `before` that are still running, "tid:name"
// each. A joined thread can still be listed in /proc (pthread_join returns
// when the kernel clears the thread id, before the thread has exited), so
// each new thread is waited for through a thread pidfd, which becomes
// readable once the thread has exited; one still running after 30 s is a
// leak. Where thread pidfds are missing (kernels before 6.9) or refused, a
// thread past exit_mm counts as exited (a narrower window, not closed).
std::vector<std::string> ThreadsStartedSince(
    const std::map<pid_t, std::string>& before) {
  constexpr unsigned kPidfdThread = O_EXCL;  // PIDFD_THREAD, Linux 6.9.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::vector<std::string> running;
  for (const auto& [tid, name] : Threads()) {
    if (before.contains(tid)) continue;
    const int fd =
        static_cast<int>(::syscall(SYS_pidfd_open, tid, kPidfdThread));
    if (fd < 0 && errno == ESRCH) continue;  // Gone since the listing.
    bool exited = false;
    if (fd >= 0) {
      int ready;
      do {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now());
        pollfd waiting{fd, POLLIN, 0};
        ready = ::poll(&waiting, 1,
                       static_cast<int>(std::max<int64_t>(left.count(), 0)));
      } while (ready < 0 && errno == EINTR);
      exited = ready == 1;
      ::close(fd);
    } else {
      exited = ThreadExiting(tid);
    }
    if (!exited) running.push_back(absl::StrCat(tid, ":", name));
  }
  return running;
}

struct SaveFaultCase {
  std::string name;
  Fault fault;
  absl::StatusCode code;
  std::vector<std::string> message_parts;
  int64_t fail_writes_after = -1;  // FailWritesAfter instead of `fault`.
  // The site exists only for O_DIRECT files (preallocation): skipped where
  // the test directory's file system refuses O_DIRECT (tmpfs).
  bool needs_direct = false;
  // The site exists only in buffered saves with writeback: the save runs
  // with direct_io off and writeback every 2 KiB (the sample's files are a
  // few KiB).
  bool buffered_writeback = false;
};

// Whether files in `dir` open with O_DIRECT.
bool SupportsDirectIo(const std::string& dir) {
  const std::string probe = dir + "/.direct-probe";
  absl::StatusOr<std::unique_ptr<File>> file = LocalFileSystem().OpenForWrite(
      probe, OpenOptions{/*exclusive=*/true, /*direct=*/true});
  if (!file.ok()) return false;
  const bool direct = (*file)->direct();
  (*file)->Close().IgnoreError();
  LocalFileSystem().RemoveFile(probe).IgnoreError();
  return direct;
}

class SaveFaultTest : public ::testing::TestWithParam<SaveFaultCase> {};

TEST_P(SaveFaultTest, FailsCleanlyAndKeepsThePreviousCheckpoint) {
  const SaveFaultCase& c = GetParam();
  const std::string dir = NewTestDir(c.name);
  if (c.needs_direct && !SupportsDirectIo(dir)) {
    GTEST_SKIP() << dir << " refuses O_DIRECT, so nothing is preallocated";
  }
  const SampleState old_state = SampleState::Make(1);
  ASSERT_TRUE(SaveSample(dir, old_state).ok());
  const std::vector<std::string> before = ListNames(dir);
  const int fds_before = CountEntries("/proc/self/fd");
  const std::map<pid_t, std::string> threads_before = Threads();

  for (IoMode mode : {IoMode::kPosix, IoMode::kAuto}) {
    FaultInjectionFileSystem faulty(LocalFileSystem());
    if (c.fail_writes_after >= 0) {
      faulty.FailWritesAfter(c.fail_writes_after);
    } else {
      faulty.Inject(c.fault);
    }
    FileSystemWriterOptions options;
    options.file_system = &faulty;
    options.io_mode = mode;
    options.thread_count = 2;
    if (c.buffered_writeback) {
      options.direct_io = false;
      options.writeback_bytes = 2048;
    }
    absl::Status status = SaveSample(dir, SampleState::Make(2), options);
    EXPECT_EQ(status.code(), c.code) << IoModeName(mode) << ": " << status;
    for (const std::string& part : c.message_parts) {
      EXPECT_THAT(status.message(), HasSubstr(part)) << IoModeName(mode);
    }
    EXPECT_EQ(faulty.open_files(), 0) << IoModeName(mode);
  }
  EXPECT_EQ(ListNames(dir), before);
  absl::Status loaded = LoadAndCompare(dir, old_state);
  EXPECT_TRUE(loaded.ok()) << loaded;
  EXPECT_EQ(CountEntries("/proc/self/fd"), fds_before);
  EXPECT_THAT(ThreadsStartedSince(threads_before), ::testing::IsEmpty());
}

Fault F(FaultOp op, int error, std::string path, int64_t nth = 1,
        bool short_write = false) {
  return Fault{op, error, std::move(path), nth, short_write};
}

INSTANTIATE_TEST_SUITE_P(
    Sites, SaveFaultTest,
    ::testing::Values(
        SaveFaultCase{"mkdir",
                      F(FaultOp::kMkdir, EACCES, ""),
                      absl::StatusCode::kPermissionDenied,
                      {"mkdir"}},
        SaveFaultCase{"open_probe",
                      F(FaultOp::kOpen, EROFS, ".dcp-probe"),
                      absl::StatusCode::kPermissionDenied,
                      {"not writable", ".dcp-probe"}},
        SaveFaultCase{"open_data",
                      F(FaultOp::kOpen, EACCES, ".distcp"),
                      absl::StatusCode::kPermissionDenied,
                      {"open for write", ".distcp", "rank 0"}},
        SaveFaultCase{"fallocate_enospc",
                      F(FaultOp::kPreallocate, ENOSPC, ".distcp"),
                      absl::StatusCode::kResourceExhausted,
                      {"fallocate", ".distcp", "length=", "rank 0"},
                      -1,
                      /*needs_direct=*/true},
        SaveFaultCase{"write_eio",
                      F(FaultOp::kWrite, EIO, ".distcp"),
                      absl::StatusCode::kDataLoss,
                      {"pwrite", ".distcp", "offset=", "rank 0"}},
        SaveFaultCase{"write_enospc",
                      F(FaultOp::kWrite, ENOSPC, ".distcp", 2),
                      absl::StatusCode::kResourceExhausted,
                      {"pwrite", ".distcp", "offset="}},
        SaveFaultCase{"short_write",
                      F(FaultOp::kWrite, ENOSPC, ".distcp", 1, true),
                      absl::StatusCode::kResourceExhausted,
                      {"pwrite", ".distcp"}},
        SaveFaultCase{"enospc_after_bytes",
                      Fault{},
                      absl::StatusCode::kResourceExhausted,
                      {"pwrite", "offset="},
                      5000},
        SaveFaultCase{"writeback_eio",
                      F(FaultOp::kWriteback, EIO, ".distcp"),
                      absl::StatusCode::kDataLoss,
                      {"sync_file_range", ".distcp", "offset=", "rank 0"},
                      -1,
                      /*needs_direct=*/false,
                      /*buffered_writeback=*/true},
        SaveFaultCase{"fsync_data",
                      F(FaultOp::kSync, EIO, ".distcp"),
                      absl::StatusCode::kDataLoss,
                      {"fsync", ".distcp"}},
        SaveFaultCase{"close_data",
                      F(FaultOp::kClose, EIO, ".distcp"),
                      absl::StatusCode::kDataLoss,
                      {"close", ".distcp"}},
        SaveFaultCase{"syncdir_data",
                      F(FaultOp::kSyncDir, EIO, ""),
                      absl::StatusCode::kDataLoss,
                      {"fsync directory"}},
        SaveFaultCase{"open_metadata",
                      F(FaultOp::kOpen, ENOSPC, ".metadata.tmp"),
                      absl::StatusCode::kResourceExhausted,
                      {"open for write", ".metadata.tmp"}},
        SaveFaultCase{"write_metadata",
                      F(FaultOp::kWrite, EIO, ".metadata.tmp"),
                      absl::StatusCode::kDataLoss,
                      {"pwrite", ".metadata.tmp"}},
        SaveFaultCase{"fsync_metadata",
                      F(FaultOp::kSync, EIO, ".metadata.tmp"),
                      absl::StatusCode::kDataLoss,
                      {"fsync", ".metadata.tmp"}},
        SaveFaultCase{"close_metadata",
                      F(FaultOp::kClose, EIO, ".metadata.tmp"),
                      absl::StatusCode::kDataLoss,
                      {"close", ".metadata.tmp"}},
        SaveFaultCase{"rename_metadata",
                      F(FaultOp::kRename, EIO, ""),
                      absl::StatusCode::kDataLoss,
                      {"rename", ".metadata.tmp"}}),
    [](const ::testing::TestParamInfo<SaveFaultCase>& info) {
      return info.param.name;
    });

TEST(FaultInjectionTest, FailuresAfterTheRenameLeaveTheNewCheckpoint) {
  // The directory fsync after the rename, and the removal of replaced files,
  // fail after the commit point: the save reports it, the new checkpoint is
  // the one that loads, and nothing of it is removed.
  for (FaultOp op : {FaultOp::kSyncDir, FaultOp::kUnlink}) {
    const std::string dir = NewTestDir("after_commit");
    ASSERT_TRUE(SaveSample(dir, SampleState::Make(1)).ok());
    FaultInjectionFileSystem faulty(LocalFileSystem());
    // The second directory fsync is the commit's; unlinks of data files only
    // happen in MarkCommitted.
    faulty.Inject(op == FaultOp::kSyncDir ? F(op, EIO, "", 2)
                                          : F(op, EIO, ".distcp"));
    FileSystemWriterOptions options;
    options.file_system = &faulty;
    const SampleState new_state = SampleState::Make(2);
    absl::Status status = SaveSample(dir, new_state, options);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
    absl::Status loaded = LoadAndCompare(dir, new_state);
    EXPECT_TRUE(loaded.ok()) << FaultOpName(op) << ": " << loaded;
  }
}

TEST(FaultInjectionTest, OutOfSpaceSaysWhatOrphansFreedAndWhatRemains) {
  // Two orphans of interrupted saves; one cannot be removed. The save runs
  // out of space: its message says what the cleanup freed and what is left.
  const std::string dir = NewTestDir("enospc_orphans");
  const SampleState old_state = SampleState::Make(1);
  ASSERT_TRUE(SaveSample(dir, old_state).ok());
  const std::string freed = "__0_00000000000000aa_0.distcp";
  const std::string stuck = "__0_00000000000000bb_0.distcp";
  std::ofstream(JoinPath(dir, freed)) << std::string(3000, 'o');
  std::ofstream(JoinPath(dir, stuck)) << std::string(5000, 'o');
  FaultInjectionFileSystem faulty(LocalFileSystem());
  faulty.Inject(F(FaultOp::kUnlink, EACCES, stuck));
  faulty.FailWritesAfter(1000);
  FileSystemWriterOptions options;
  options.file_system = &faulty;
  absl::Status status = SaveSample(dir, SampleState::Make(2), options);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat(
                  "removed 1 orphaned file(s) of interrupted saves (3000 "
                  "bytes) from ",
                  dir,
                  "; 1 orphaned file(s) of interrupted saves (5000 "
                  "bytes) remain in ",
                  dir)));
  EXPECT_THAT(status.message(), HasSubstr(stuck));  // The unlink's error.
  const std::vector<std::string> after = ListNames(dir);
  EXPECT_THAT(after, ::testing::Not(::testing::Contains(freed)));
  EXPECT_THAT(after, ::testing::Contains(stuck));
  EXPECT_TRUE(LoadAndCompare(dir, old_state).ok());

  // Without orphans there is nothing to add; with an unreadable metadata
  // the message says why none were looked for.
  FaultInjectionFileSystem full(LocalFileSystem());
  full.FailWritesAfter(1000);
  options.file_system = &full;
  ASSERT_EQ(::unlink(JoinPath(dir, stuck).c_str()), 0);
  status = SaveSample(dir, SampleState::Make(2), options);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_THAT(status.message(), ::testing::Not(HasSubstr("orphaned")));
  std::ofstream(JoinPath(dir, kMetadataFileName)) << "not a metadata file";
  status = SaveSample(dir, SampleState::Make(2), options);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("orphaned files of interrupted saves in " + dir +
                              " were not removed"),
                    HasSubstr("is not a dcp metadata file")));
}

TEST(FaultInjectionTest, UnreadablePreviousMetadataNamesNothingToRemove) {
  // The save replaces a checkpoint whose metadata it cannot read: it
  // commits, and removes none of the old files, nor what looks like an
  // orphan, as nothing proves they are unreferenced.
  const std::string dir = NewTestDir("unreadable_previous");
  ASSERT_TRUE(SaveSample(dir, SampleState::Make(1)).ok());
  std::ofstream(JoinPath(dir, "__0_00000000deadbeef_0.distcp")) << "orphan?";
  const std::vector<std::string> before = ListNames(dir);
  FaultInjectionFileSystem faulty(LocalFileSystem());
  faulty.Inject(F(FaultOp::kRead, EIO, ".metadata"));
  FileSystemWriterOptions options;
  options.file_system = &faulty;
  ASSERT_TRUE(SaveSample(dir, SampleState::Make(2), options).ok());
  EXPECT_TRUE(LoadAndCompare(dir, SampleState::Make(2)).ok());
  const std::vector<std::string> after = ListNames(dir);
  for (const std::string& name : before) {
    if (name == kMetadataFileName) continue;
    EXPECT_THAT(after, ::testing::Contains(name));
  }
}

TEST(FaultInjectionTest, PreallocatesOnlyODirectDataFiles) {
  // fallocate reserves the blocks O_DIRECT writes go to; a buffered file is
  // laid out by the page cache (on tmpfs fallocate would zero every page
  // before the write copies over it).
  for (bool direct : {false, true}) {
    const std::string dir = NewTestDir(direct ? "prealloc_direct" : "prealloc");
    if (direct && !SupportsDirectIo(dir)) continue;
    FaultInjectionFileSystem counting(LocalFileSystem());
    FileSystemWriterOptions options;
    options.file_system = &counting;
    options.direct_io = direct;
    options.thread_count = 2;
    ASSERT_TRUE(SaveSample(dir, SampleState::Make(1), options).ok());
    int64_t data_files = 0;
    for (const std::string& name : ListNames(dir)) {
      if (name.size() > 7 && name.substr(name.size() - 7) == ".distcp") {
        ++data_files;
      }
    }
    ASSERT_GT(data_files, 0);
    EXPECT_EQ(counting.calls(FaultOp::kPreallocate), direct ? data_files : 0)
        << (direct ? "O_DIRECT" : "buffered");
    EXPECT_TRUE(LoadAndCompare(dir, SampleState::Make(1)).ok());
  }
}

TEST(FaultInjectionTest, StartsWritebackOnlyForBufferedSyncedDataFiles) {
  // A buffered save with sync_files hands every writeback_bytes of each data
  // file to StartWriteback as it goes; O_DIRECT files have no dirty pages,
  // and without sync_files the save does not wait for the disk at all.
  struct Case {
    const char* name;
    bool direct;
    bool sync_files;
    int64_t writeback_bytes;
    bool expect_writeback;
  };
  for (const Case& c : {Case{"buffered", false, true, 2048, true},
                        Case{"direct", true, true, 2048, false},
                        Case{"no_sync", false, false, 2048, false},
                        Case{"off", false, true, 0, false}}) {
    const std::string dir = NewTestDir(absl::StrCat("writeback_", c.name));
    if (c.direct && !SupportsDirectIo(dir)) continue;
    FaultInjectionFileSystem counting(LocalFileSystem());
    FileSystemWriterOptions options;
    options.file_system = &counting;
    options.direct_io = c.direct;
    options.sync_files = c.sync_files;
    options.writeback_bytes = c.writeback_bytes;
    options.thread_count = 2;
    ASSERT_TRUE(SaveSample(dir, SampleState::Make(1), options).ok()) << c.name;
    int64_t data_bytes = 0;
    for (const std::string& name : ListNames(dir)) {
      if (name.size() > 7 && name.substr(name.size() - 7) == ".distcp") {
        data_bytes +=
            *(*LocalFileSystem().OpenForRead(dir + "/" + name))->Size();
      }
    }
    ASSERT_GT(data_bytes, 4 * 2048) << c.name;
    const int64_t calls = counting.calls(FaultOp::kWriteback);
    if (c.expect_writeback) {
      // Each call covers at least writeback_bytes, and at most that plus
      // one 4 KiB piece (an item that starts past the boundary).
      EXPECT_LE(calls, data_bytes / 2048) << c.name;
      EXPECT_GE(calls, data_bytes / (2048 + 4096) - 2) << c.name;
      EXPECT_GT(calls, 0) << c.name;
    } else {
      EXPECT_EQ(calls, 0) << c.name;
    }
    absl::Status loaded = LoadAndCompare(dir, SampleState::Make(1));
    EXPECT_TRUE(loaded.ok()) << c.name << ": " << loaded;
  }
}

// Unlike tests/native_crash_test.cc, where the process dies at the call
// (it and every later call fail), here only the call fails (EIO): the save's
// error path goes on doing I/O, then the power goes.
TEST(FaultInjectionTest, AFailureAtEveryStepThenPowerLossLeavesOldOrNew) {
  // Count the file-system calls of a clean save, then fail each one.
  int64_t total = 0;
  {
    const std::string dir = NewTestDir("crash_count");
    ASSERT_TRUE(SaveSample(dir, SampleState::Make(1)).ok());
    FaultInjectionFileSystem counting(LocalFileSystem());
    FileSystemWriterOptions options;
    options.file_system = &counting;
    ASSERT_TRUE(SaveSample(dir, SampleState::Make(2), options).ok());
    total = counting.calls(FaultOp::kAny);
  }
  ASSERT_GT(total, 10);
  const SampleState old_state = SampleState::Make(1);
  const SampleState new_state = SampleState::Make(2);
  int old_seen = 0, new_seen = 0;
  for (int64_t k = 1; k <= total + 1; ++k) {
    const std::string dir = NewTestDir("crash");
    ASSERT_TRUE(SaveSample(dir, old_state).ok());
    FaultInjectionFileSystem faulty(LocalFileSystem());
    faulty.Inject(F(FaultOp::kAny, EIO, "", k));
    FileSystemWriterOptions options;
    options.file_system = &faulty;
    options.io_mode = IoMode::kPosix;
    // kill -9: no Abort, no cleanup; then the power goes.
    SaveSample(dir, new_state, options, /*abort_on_failure=*/false)
        .IgnoreError();
    faulty.SimulateCrash();
    if (LoadAndCompare(dir, old_state).ok()) {
      ++old_seen;
    } else {
      absl::Status loaded = LoadAndCompare(dir, new_state);
      ASSERT_TRUE(loaded.ok()) << "crash at call " << k << " of " << total
                               << " left neither checkpoint: " << loaded;
      ++new_seen;
    }
  }
  EXPECT_GT(old_seen, 0);
  EXPECT_GT(new_seen, 0);  // Crashes after the commit keep the new one.
}

TEST(FaultInjectionTest, ACrashFaultFailsEveryLaterCall) {
  const std::string dir = NewTestDir("crash_fault");
  FaultInjectionFileSystem faulty(LocalFileSystem());
  Fault crash = F(FaultOp::kOpen, EIO, ".distcp", 2);
  crash.crash = true;
  faulty.Inject(crash);
  // Calls before the crash, other operations included, go through.
  ASSERT_TRUE(faulty.CreateDir(dir + "/sub").ok());
  absl::StatusOr<std::unique_ptr<File>> first =
      faulty.OpenForWrite(dir + "/a.distcp", OpenOptions{});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(
      faulty.OpenForWrite(dir + "/b.distcp", OpenOptions{}).status().code(),
      absl::StatusCode::kDataLoss);
  // From then on every operation on every path fails.
  EXPECT_FALSE(faulty.ListDir(dir).ok());
  EXPECT_FALSE(faulty.SyncDir(dir).ok());
  EXPECT_FALSE((*first)->Close().ok());
  EXPECT_EQ(faulty.open_files(), 0);
  EXPECT_EQ(ListNames(dir), (std::vector<std::string>{"a.distcp", "sub"}));
  faulty.ClearFaults();
  EXPECT_TRUE(faulty.SyncDir(dir).ok());
}

TEST(FaultInjectionTest, SeededRandomFailuresNeverLeaveAMixedState) {
  const SampleState old_state = SampleState::Make(1);
  const SampleState new_state = SampleState::Make(2);
  int failed = 0;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    const std::string dir = NewTestDir("one_in_n");
    ASSERT_TRUE(SaveSample(dir, old_state).ok());
    FaultInjectionFileSystem faulty(LocalFileSystem());
    faulty.FailOneIn(12, seed);
    FileSystemWriterOptions options;
    options.file_system = &faulty;
    absl::Status saved = SaveSample(dir, new_state, options);
    faulty.ClearFaults();
    if (saved.ok() || LoadAndCompare(dir, new_state).ok()) {
      // A failure after the commit point still leaves the new checkpoint.
      EXPECT_TRUE(LoadAndCompare(dir, new_state).ok()) << seed;
    } else {
      ++failed;
      absl::Status loaded = LoadAndCompare(dir, old_state);
      EXPECT_TRUE(loaded.ok()) << "seed " << seed << ": " << loaded;
    }
  }
  EXPECT_GT(failed, 0);
}

struct LoadFaultCase {
  std::string name;
  Fault fault;
  absl::StatusCode code;
  std::vector<std::string> message_parts;
};

class LoadFaultTest : public ::testing::TestWithParam<LoadFaultCase> {};

TEST_P(LoadFaultTest, IsAClearError) {
  const LoadFaultCase& c = GetParam();
  const std::string dir = NewTestDir(c.name);
  const SampleState state = SampleState::Make(3);
  ASSERT_TRUE(SaveSample(dir, state).ok());
  for (IoMode mode : {IoMode::kPosix, IoMode::kAuto}) {
    FaultInjectionFileSystem faulty(LocalFileSystem());
    faulty.Inject(c.fault);
    FileSystemReaderOptions options;
    options.file_system = &faulty;
    options.io_mode = mode;
    options.thread_count = 2;
    absl::Status status = LoadAndCompare(dir, state, options);
    EXPECT_EQ(status.code(), c.code) << IoModeName(mode) << ": " << status;
    for (const std::string& part : c.message_parts) {
      EXPECT_THAT(status.message(), HasSubstr(part)) << IoModeName(mode);
    }
    EXPECT_EQ(faulty.open_files(), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Sites, LoadFaultTest,
    ::testing::Values(LoadFaultCase{"open_metadata",
                                    F(FaultOp::kOpen, EACCES, ".metadata"),
                                    absl::StatusCode::kPermissionDenied,
                                    {".metadata"}},
                      LoadFaultCase{"read_metadata",
                                    F(FaultOp::kRead, EIO, ".metadata"),
                                    absl::StatusCode::kDataLoss,
                                    {"pread", ".metadata"}},
                      // A data file the metadata names is missing: the
                      // checkpoint is incomplete.
                      LoadFaultCase{"open_data",
                                    F(FaultOp::kOpen, ENOENT, ".distcp"),
                                    absl::StatusCode::kDataLoss,
                                    {"is missing", ".distcp", "incomplete"}},
                      LoadFaultCase{"open_data_eacces",
                                    F(FaultOp::kOpen, EACCES, ".distcp"),
                                    absl::StatusCode::kPermissionDenied,
                                    {"open for read", ".distcp"}},
                      LoadFaultCase{"read_data",
                                    F(FaultOp::kRead, EIO, ".distcp", 1),
                                    absl::StatusCode::kDataLoss,
                                    {"pread", ".distcp", "offset="}}),
    [](const ::testing::TestParamInfo<LoadFaultCase>& info) {
      return info.param.name;
    });

}  // namespace
}  // namespace dcp
