// The overwrite crash property for a real process: a save (Save with the
// writer's default options but POSIX I/O) over an existing checkpoint whose
// process is killed (SIGKILL) at any of its file-system calls leaves the
// directory holding one complete, loadable checkpoint, the old one or the
// new one, never a mix; and the next process saves there (no stale lock or
// leftover blocks it). The kill point is chosen by call count, not time:
// the child's file system fails its k-th call and every later one
// (Fault::crash: no further I/O), and the child kills itself when Save
// returns. The page cache survives, as it does a kill; the power-loss
// variant of each step is tests/native_crash_test.cc.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/checkpoint.h"
#include "gtest/gtest.h"
#include "io/fault_injection.h"
#include "io/file_system.h"
#include "io/file_system_storage.h"
#include "tests/test_util.h"
#include "tools/synthetic_state.h"

namespace dcp {
namespace {

constexpr int64_t kStateBytes = int64_t{8} << 20;

StateDict StateFor(uint64_t seed, bool fill = true) {
  SyntheticStateOptions options;
  options.total_bytes = kStateBytes;
  options.seed = seed;
  options.fill = fill;
  return MakeSyntheticState(options);
}

absl::Status SaveTo(const std::string& dir, uint64_t seed) {
  SaveOptions options;
  options.checkpoint_id = dir;
  return Save(StateFor(seed), options).status();
}

// Which seed's state `dir` holds, or an error when it holds no complete
// checkpoint matching one of `candidates`.
absl::StatusOr<uint64_t> LoadedSeed(const std::string& dir,
                                    std::vector<uint64_t> candidates) {
  StateDict loaded = StateFor(0, /*fill=*/false);
  LoadOptions options;
  options.checkpoint_id = dir;
  absl::Status s = Load(loaded, options);
  if (!s.ok()) return s;
  for (uint64_t seed : candidates) {
    if (CompareStates(StateFor(seed), loaded).ok()) return seed;
  }
  return absl::DataLossError("loaded state matches neither checkpoint");
}

// Forks a child that saves `seed` into `dir`, its `crash_call`-th
// file-system call and every later one failing, and that is killed
// (SIGKILL) once Save returns after the crash. Returns true when the save
// completed before reaching that call (the child then exits 0).
bool SaveAndKillAtCall(const std::string& dir, uint64_t seed,
                       int64_t crash_call) {
  pid_t pid = ::fork();
  if (pid == 0) {
    FaultInjectionFileSystem faulty(LocalFileSystem());
    Fault crash;
    crash.op = FaultOp::kAny;
    crash.nth = crash_call;
    crash.crash = true;
    faulty.Inject(crash);
    FileSystemWriterOptions writer_options;
    writer_options.file_system = &faulty;
    writer_options.io_mode = IoMode::kPosix;  // Every write is a call.
    FileSystemWriter writer(dir, writer_options);
    SaveOptions options;
    options.storage_writer = &writer;
    const absl::Status s = Save(StateFor(seed), options).status();
    if (s.ok() && faulty.calls(FaultOp::kAny) < crash_call) ::_exit(0);
    ::raise(SIGKILL);
    ::_exit(3);  // Unreachable.
  }
  int wstatus = 0;
  EXPECT_EQ(::waitpid(pid, &wstatus, 0), pid);
  const bool completed = WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0;
  EXPECT_TRUE(completed ||
              (WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL))
      << "status " << wstatus;
  return completed;
}

TEST(CrashDuringOverwrite, AKillAtEveryCallLeavesOneCompleteCheckpoint) {
  const std::string dir = testing::MakeTempDir("crash");
  ASSERT_TRUE(SaveTo(dir, 1).ok());
  uint64_t current = 1;
  int finished = 0, interrupted = 0;
  uint64_t next = 2;
  // Kill at call 1, 2, ... until a save completes before its kill call.
  bool done = false;
  for (int64_t call = 1; !done; ++call) {
    ASSERT_LT(call, 10000) << "the save never completed";
    const uint64_t seed = next++;
    done = SaveAndKillAtCall(dir, seed, call);
    absl::StatusOr<uint64_t> loaded = LoadedSeed(dir, {current, seed});
    ASSERT_TRUE(loaded.ok()) << "after a kill at call " << call
                             << " of the save: " << loaded.status();
    if (done) {
      EXPECT_EQ(*loaded, seed) << "the save reported success";
    }
    (*loaded == seed ? finished : interrupted)++;
    current = *loaded;
  }
  RecordProperty("finished", finished);
  RecordProperty("interrupted", interrupted);
  EXPECT_GT(interrupted, 0);
  // Kills after the commit point keep the new checkpoint.
  EXPECT_GT(finished, 1);
  // A later save in this process still works and leaves a loadable
  // checkpoint.
  ASSERT_TRUE(SaveTo(dir, 100).ok());
  EXPECT_EQ(*LoadedSeed(dir, {100}), 100u);
}

}  // namespace
}  // namespace dcp
