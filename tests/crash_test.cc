// The overwrite crash property: a save over an existing checkpoint that is
// killed (SIGKILL) at any instant leaves the directory holding one complete,
// loadable checkpoint: the old one or the new one, never a mix.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "engine/checkpoint.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "tools/synthetic_state.h"

namespace dcp {
namespace {

constexpr int64_t kStateBytes = int64_t{48} << 20;

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

// Forks a child that saves `seed` into `dir` and kills it `delay` after it
// signals that it is about to start the save. Returns true when the child
// finished before the kill.
bool SaveAndKill(const std::string& dir, uint64_t seed,
                 std::chrono::microseconds delay) {
  int ready[2];
  EXPECT_EQ(::pipe(ready), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(ready[0]);
    StateDict state = StateFor(seed);
    SaveOptions options;
    options.checkpoint_id = dir;
    (void)!::write(ready[1], "x", 1);
    absl::Status s = Save(state, options).status();
    ::_exit(s.ok() ? 0 : 1);
  }
  ::close(ready[1]);
  char c;
  EXPECT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  std::this_thread::sleep_for(delay);
  ::kill(pid, SIGKILL);
  int wstatus = 0;
  ::waitpid(pid, &wstatus, 0);
  return WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0;
}

TEST(CrashDuringOverwrite, AlwaysLeavesOneCompleteCheckpoint) {
  const std::string dir = testing::MakeTempDir("crash");
  ASSERT_TRUE(SaveTo(dir, 1).ok());
  uint64_t current = 1;
  int finished = 0, interrupted = 0;
  // Delays spread over a save of kStateBytes, from "before the first write"
  // to "after the commit", so kills land in every phase.
  const int delays_us[] = {0,     200,   1000,   3000,   8000,   15000,
                           30000, 60000, 100000, 150000, 250000, 400000};
  uint64_t next = 2;
  for (int delay : delays_us) {
    const uint64_t seed = next++;
    const bool done = SaveAndKill(dir, seed, std::chrono::microseconds(delay));
    absl::StatusOr<uint64_t> loaded = LoadedSeed(dir, {current, seed});
    ASSERT_TRUE(loaded.ok())
        << "after a kill " << delay << "us into the save: " << loaded.status();
    if (done) {
      EXPECT_EQ(*loaded, seed) << "the save reported success";
    }
    (*loaded == seed ? finished : interrupted)++;
    current = *loaded;
  }
  // Both outcomes occurred: the kills really landed inside saves.
  RecordProperty("finished", finished);
  RecordProperty("interrupted", interrupted);
  EXPECT_GT(interrupted, 0);
  // A later save still works and leaves a loadable checkpoint.
  ASSERT_TRUE(SaveTo(dir, 100).ok());
  EXPECT_EQ(*LoadedSeed(dir, {100}), 100u);
}

}  // namespace
}  // namespace dcp
