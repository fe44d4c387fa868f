#include "tools/synthetic_state.h"

#include <cstring>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dcp {
namespace {

using ::testing::HasSubstr;

TEST(SyntheticStateTest, VerifyAcceptsTheGeneratedStateOnEveryRank) {
  for (int rank : {0, 2}) {
    SyntheticStateOptions options;
    options.total_bytes = 3 << 20;
    options.seed = 5;
    options.rank = rank;
    options.world_size = 3;
    const StateDict state = MakeSyntheticState(options);
    EXPECT_TRUE(VerifySyntheticState(state, options).ok()) << rank;
    EXPECT_TRUE(CompareStates(state, MakeSyntheticState(options)).ok());
  }
}

TEST(SyntheticStateTest, VerifyNamesTheFirstDifferingKeyAndOffset) {
  SyntheticStateOptions options;
  options.total_bytes = 3 << 20;
  StateDict state = MakeSyntheticState(options);
  SyntheticStateOptions other_seed = options;
  other_seed.seed = 2;
  EXPECT_EQ(VerifySyntheticState(state, other_seed).code(),
            absl::StatusCode::kDataLoss);

  // One flipped byte inside a row-sharded weight.
  const Shard& shard = state["model"]
                           .dict()["layers.3"]
                           .dict()["weight"]
                           .sharded_tensor()
                           .local_shards()[0];
  static_cast<unsigned char*>(shard.tensor.data())[1000] ^= 1;
  absl::Status status = VerifySyntheticState(state, options);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(),
              testing::AllOf(HasSubstr("model.layers.3.weight"),
                             HasSubstr("byte offset 1000")));

  // A zero-filled destination is not the state.
  SyntheticStateOptions empty = options;
  empty.fill = false;
  EXPECT_FALSE(VerifySyntheticState(MakeSyntheticState(empty), options).ok());
}

}  // namespace
}  // namespace dcp
