#include "core/checkpoint_exception.h"

#include "gtest/gtest.h"

namespace dcp {
namespace {

TEST(CheckpointException, CombinesAndRecoversPerRankFailures) {
  std::map<int, absl::Status> failures = {
      {1, absl::AbortedError("peer failed")},
      {2, absl::ResourceExhaustedError("pwrite /ckpt/__2_0.distcp: ENOSPC")},
  };
  absl::Status combined = MakeCheckpointException("save", failures);
  EXPECT_EQ(combined.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(combined.message().find("failed on 2 ranks"),
            absl::string_view::npos);
  EXPECT_NE(combined.message().find("rank 2: RESOURCE_EXHAUSTED"),
            absl::string_view::npos);
  std::optional<std::map<int, absl::Status>> back =
      CheckpointFailures(combined);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(*back, failures);
}

// A rank's message that starts with its own rank (storage errors do) names
// it once in the combined message; the failure itself is kept as it was.
TEST(CheckpointException, ARankNamedByItsMessageIsNamedOnce) {
  std::map<int, absl::Status> failures = {
      {1, absl::DataLossError("rank 1: writing w: EIO")},
      {3, absl::DataLossError("rank 2: told by rank 2")},
  };
  absl::Status combined = MakeCheckpointException("save", failures);
  EXPECT_EQ(combined.message(),
            "checkpoint save failed on 2 ranks; rank 1: DATA_LOSS: writing w: "
            "EIO; rank 3: DATA_LOSS: rank 2: told by rank 2");
  EXPECT_EQ(*CheckpointFailures(combined), failures);
}

TEST(CheckpointException, EmptyIsOkAndPlainStatusHasNoFailures) {
  EXPECT_TRUE(MakeCheckpointException("load", {}).ok());
  EXPECT_FALSE(CheckpointFailures(absl::InternalError("x")).has_value());
}

}  // namespace
}  // namespace dcp
