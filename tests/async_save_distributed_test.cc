// AsyncSave on three processes (Gloo) where one rank's staging fails: that
// rank still takes part in the save, so every rank's upload fails at once
// with a CheckpointException naming it (none waits for it until the group
// times out), and the next save of all three commits.
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/future.h"
#include "engine/async_save.h"
#include "engine/checkpoint.h"
#include "gtest/gtest.h"
#include "tests/comm/multiprocess.h"
#include "tests/global_tensors.h"

namespace dcp {
namespace {

using ::dcp::testing::Check;
using ::dcp::testing::FreshTestDir;
using ::dcp::testing::RunGlooWorld;

constexpr int kRanks = 3;

// Staging that fails, as a device copy or a copy-on-write fill might.
class FailingStager final : public AsyncStager {
 public:
  Future<StateDict> Stage(const StateDict&) override {
    Promise<StateDict> failed;
    failed.Set(absl::DataLossError("staging copy of \"w\" failed"));
    return failed.future();
  }
  bool should_synchronize_after_execute() const override { return false; }
  absl::Status SynchronizeStaging() override { return absl::OkStatus(); }
  void Close() override {}
};

TEST(AsyncSaveDistributed, AFailedStageFailsEveryRankAndTheNextSaveCommits) {
  const std::string dir = FreshTestDir("async_staging_failure");
  ASSERT_EQ(RunGlooWorld(
                kRanks,
                [&](int rank, comm::ProcessGroup& group) {
                  AsyncCheckpointer checkpointer;
                  FailingStager failing;
                  auto save = [&](int64_t step, bool fail) {
                    Tensor w = Tensor::Empty(DType::kI64, {1});
                    *static_cast<int64_t*>(w.data()) = step;
                    StateDict state;
                    state[absl::StrCat("w", rank)] = w;
                    AsyncSaveOptions options;
                    options.save.checkpoint_id = dir;
                    options.save.process_group = &group;
                    if (fail && rank == 1) options.async_stager = &failing;
                    return checkpointer.AsyncSave(state, options)
                        .upload_completion.Wait()
                        .status();
                  };
                  absl::Status failed = save(1, /*fail=*/true);
                  if (int rc = Check(
                          !failed.ok() &&
                              absl::StrContains(failed.message(), "rank 1") &&
                              absl::StrContains(failed.message(),
                                                "staging copy of \"w\" failed"),
                          rank, failed.ToString())) {
                    return rc;
                  }
                  absl::Status saved = save(2, /*fail=*/false);
                  return Check(saved.ok(), rank, saved.ToString());
                }),
            0);
  StateDict state;
  for (int rank = 0; rank < kRanks; ++rank) {
    state[absl::StrCat("w", rank)] = Tensor::Empty(DType::kI64, {1});
  }
  LoadOptions load;
  load.checkpoint_id = dir;
  ASSERT_TRUE(Load(state, load).ok());
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_EQ(
        *static_cast<int64_t*>(state[absl::StrCat("w", rank)].tensor().data()),
        2);
  }
}

}  // namespace
}  // namespace dcp
