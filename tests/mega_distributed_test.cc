// MEGA checkpoints across real processes (one forked process per rank,
// Gloo over tcp on 127.0.0.1), chosen by the checkpoint_id alone: four
// ranks save row, column and 2-d block shards of tensors of several dtypes
// (and a replicated one) to mega://DIR, one file per rank; three ranks
// load them by the plain path with another sharding.
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/checkpoint.h"
#include "gtest/gtest.h"
#include "io/mega_format.h"
#include "tests/comm/multiprocess.h"
#include "tests/global_tensors.h"
#include "tests/test_util.h"

namespace dcp {
namespace {

using ::dcp::testing::BuildState;
using ::dcp::testing::Check;
using ::dcp::testing::ChunkLayout;
using ::dcp::testing::EvenSplit;
using ::dcp::testing::FreshTestDir;
using ::dcp::testing::GlobalTensor;
using ::dcp::testing::ListFiles;
using ::dcp::testing::RunGlooWorld;
using ::dcp::testing::VerifyState;

const std::vector<GlobalTensor> kGlobals = {
    {"emb", DType::kBF16, {12, 5}},
    {"proj", DType::kF32, {6, 8}},
    {"grid", DType::kI16, {4, 4}},
    {"scale", DType::kF8E5M2, {9}},
};

// Four ranks save emb by rows, proj by columns, grid by 2x2 blocks and a
// replica of scale.
ChunkLayout SaveLayout(int rank) {
  ChunkLayout layout;
  auto [r0, nr] = EvenSplit(12, rank, 4);
  layout["emb"] = {{{r0, 0}, {nr, 5}}};
  auto [c0, nc] = EvenSplit(8, rank, 4);
  layout["proj"] = {{{0, c0}, {6, nc}}};
  layout["grid"] = {{{(rank / 2) * 2, (rank % 2) * 2}, {2, 2}}};
  layout["scale"] = {};
  return layout;
}

// Three ranks load emb by rows and proj by columns (split three ways, so
// across the saved chunks' bounds), grid by rows and scale split.
ChunkLayout LoadLayout(int rank) {
  ChunkLayout layout;
  auto [r0, nr] = EvenSplit(12, rank, 3);
  layout["emb"] = {{{r0, 0}, {nr, 5}}};
  auto [c0, nc] = EvenSplit(8, rank, 3);
  layout["proj"] = {{{0, c0}, {6, nc}}};
  auto [g0, ng] = EvenSplit(4, rank, 3);
  layout["grid"] = {{{g0, 0}, {ng, 4}}};
  auto [f0, nf] = EvenSplit(9, rank, 3);
  layout["scale"] = {{{f0}, {nf}}};
  return layout;
}

TEST(MegaDistributed, SavedOnFourRanksLoadsOnThree) {
  const std::string dir = FreshTestDir("mega_dist");
  EXPECT_EQ(RunGlooWorld(4,
                         [&](int rank, comm::ProcessGroup& group) {
                           SaveOptions save;
                           save.checkpoint_id = absl::StrCat("mega://", dir);
                           save.process_group = &group;
                           absl::Status status =
                               Save(BuildState(kGlobals, SaveLayout(rank),
                                               /*fill=*/true),
                                    save)
                                   .status();
                           return Check(status.ok(), rank, status.ToString());
                         }),
            0);
  // Every rank wrote its chunks into a file of its own.
  std::set<std::string> files = ListFiles(dir);
  EXPECT_TRUE(files.contains(kMegaIndexFileName));
  EXPECT_TRUE(files.contains("model-00004-of-00004.mega"));
  EXPECT_EQ(files.size(), 5u);
  EXPECT_EQ(
      RunGlooWorld(3,
                   [&](int rank, comm::ProcessGroup& group) {
                     const ChunkLayout layout = LoadLayout(rank);
                     StateDict state =
                         BuildState(kGlobals, layout, /*fill=*/false);
                     LoadOptions load;
                     load.checkpoint_id = dir;
                     load.process_group = &group;
                     absl::Status status = Load(state, load);
                     if (int rc = Check(status.ok(), rank, status.ToString())) {
                       return rc;
                     }
                     const std::string problem =
                         VerifyState(state, kGlobals, layout);
                     return Check(problem.empty(), rank, problem);
                   }),
      0);
}

}  // namespace
}  // namespace dcp
