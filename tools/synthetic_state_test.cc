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

TEST(SyntheticStateTest, TheSizeTensorsShapeGivesBackTheState) {
  for (int64_t total :
       {int64_t{0}, int64_t{3} << 20, (int64_t{64} << 20) + 12345}) {
    const Shape shape = SyntheticSizeTensorShape(total);
    absl::StatusOr<int64_t> again = SyntheticTotalBytesForShape(shape);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(SyntheticSizeTensorShape(*again), shape) << total;
    SyntheticStateOptions options;
    options.total_bytes = *again;
    options.fill = false;
    const StateDict state = MakeSyntheticState(options);
    EXPECT_EQ(state.at("model")
                  .dict()
                  .at("layers.0")
                  .dict()
                  .at("weight")
                  .sharded_tensor()
                  .global_sizes(),
              shape);
  }
  // Shapes no synthetic state has, and one whose state overflows int64.
  for (const Shape& shape :
       {Shape{}, Shape{0, 1024}, Shape{5, 1000}, Shape{5, 1024, 1},
        Shape{int64_t{1} << 50, 1024}}) {
    EXPECT_EQ(SyntheticTotalBytesForShape(shape).status().code(),
              absl::StatusCode::kInvalidArgument)
        << ShapeToString(shape);
  }
}

}  // namespace
}  // namespace dcp
