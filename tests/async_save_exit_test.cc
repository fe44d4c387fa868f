// The process-wide AsyncSave at process exit: an upload that has not
// started when the process exits fails with kCancelled instead of running
// (its options may point at objects the exit is destroying), and the exit
// does not hang. Runs in a forked child, which calls std::exit.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "engine/async_save.h"
#include "gtest/gtest.h"
#include "tests/comm/multiprocess.h"
#include "tests/held_stager.h"
#include "tests/test_util.h"

namespace dcp {
namespace {

using ::dcp::testing::HeldStager;
using ::dcp::testing::MakeTempDir;
using ::dcp::testing::RankExit;
using ::dcp::testing::RunRanks;
using ::dcp::testing::SeededTensor;

TEST(AsyncSaveAtExit, UploadsNotStartedFailInsteadOfRunning) {
  const std::string held_dir = MakeTempDir("exit-held");
  const std::string queued_dir = MakeTempDir("exit-queued");
  const std::string outcome_path = MakeTempDir("exit-outcome") + "/outcome";
  const std::vector<RankExit> exits = RunRanks(
      1,
      [&](int) {
        StateDict state;
        state["w"] = SeededTensor(DType::kF32, {64}, 1);
        HeldStager held;
        AsyncSaveOptions first;
        first.save.checkpoint_id = held_dir;
        first.async_stager = &held;
        // Uploads run in call order: the second waits behind the first,
        // whose staging is held until the second has an outcome.
        AsyncSave(state, first);
        AsyncSaveOptions second;
        second.save.checkpoint_id = queued_dir;
        AsyncSave(state, second)
            .upload_completion.OnReady(
                [&](const absl::StatusOr<Metadata>& result) {
                  std::ofstream(outcome_path)
                      << absl::StatusCodeToString(result.status().code()) << " "
                      << result.status().message();
                  held.Release(state);
                });
        std::exit(0);  // Locals stay alive: exit does not unwind the stack.
        return 0;
      },
      absl::Seconds(30));
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_FALSE(exits[0].timed_out) << "the exit hung";
  EXPECT_TRUE(exits[0].exited && exits[0].exit_code == 0)
      << "exit " << exits[0].exit_code << " signal " << exits[0].signal;
  std::stringstream outcome;
  outcome << std::ifstream(outcome_path).rdbuf();
  EXPECT_EQ(outcome.str().rfind("CANCELLED ", 0), 0u) << outcome.str();
  EXPECT_FALSE(testing::ListFiles(queued_dir).count(".metadata"))
      << "the queued upload ran during exit";
}

}  // namespace
}  // namespace dcp
