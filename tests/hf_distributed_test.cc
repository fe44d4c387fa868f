// Hugging Face checkpoints across real processes (one forked process per
// rank, Gloo over tcp on 127.0.0.1): save_distributed on four ranks with
// consolidation, loaded into two and three ranks with other shardings
// (from the consolidated files and from the shards); and a save without
// save_distributed whose replicated tensors the planner spreads over the
// ranks, so each file has one writer.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/checkpoint.h"
#include "gtest/gtest.h"
#include "io/hf_storage.h"
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

const std::vector<GlobalTensor>& Globals() {
  static const auto* globals = new std::vector<GlobalTensor>{
      {"row", DType::kF32, {10, 6}},
      {"block", DType::kBF16, {8, 8}},
      {"cols", DType::kI64, {7, 5}},
      {"fp8", DType::kF8E4M3, {12}},
  };
  return *globals;
}

ChunkLayout SaveLayout(int rank) {
  const int64_t rows[] = {0, 1, 3, 6, 10};
  const int64_t cols[] = {0, 2, 3, 3, 5};  // Rank 2 holds no columns.
  ChunkLayout layout;
  layout["row"] = {{{rows[rank], 0}, {rows[rank + 1] - rows[rank], 6}}};
  layout["block"] = {{{(rank / 2) * 4, (rank % 2) * 4}, {4, 4}}};
  layout["cols"] = {{{0, cols[rank]}, {7, cols[rank + 1] - cols[rank]}}};
  layout["fp8"] = {};
  return layout;
}

ChunkLayout LoadLayout(int rank, int world) {
  ChunkLayout layout;
  auto [c0, nc] = EvenSplit(6, rank, world);
  layout["row"] = {{{0, c0}, {10, nc}}};
  auto [r0, nr] = EvenSplit(8, rank, world);
  layout["block"] = {{{r0, 0}, {nr, 8}}};
  layout["cols"] = {};
  auto [f0, nf] = EvenSplit(12, rank, world);
  layout["fp8"] = {{{f0}, {nf}}};
  return layout;
}

int SaveRank(comm::ProcessGroup& group, int rank, const std::string& dir,
             const StateDict& state, HuggingFaceStorageWriterOptions options) {
  HuggingFaceStorageWriter writer(dir, options);
  SaveOptions save;
  save.storage_writer = &writer;
  save.process_group = &group;
  absl::Status status = Save(state, save).status();
  return Check(status.ok(), rank, status.ToString());
}

int LoadRank(comm::ProcessGroup& group, int rank, const std::string& dir,
             int world) {
  const ChunkLayout layout = LoadLayout(rank, world);
  StateDict state = BuildState(Globals(), layout, /*fill=*/false);
  HuggingFaceStorageReader reader(dir);
  LoadOptions load;
  load.storage_reader = &reader;
  load.process_group = &group;
  absl::Status status = Load(state, load);
  if (int rc = Check(status.ok(), rank, status.ToString())) return rc;
  const std::string problem = VerifyState(state, Globals(), layout);
  return Check(problem.empty(), rank, problem);
}

TEST(HfDistributed, ShardsOnFourRanksConsolidateAndLoadOnTwoAndThree) {
  const std::string dir = FreshTestDir("hf_dist");
  HuggingFaceStorageWriterOptions options;
  options.save_distributed = true;
  options.enable_consolidation = true;
  options.fqn_to_index_mapping = {
      {"row", 1}, {"block", 1}, {"cols", 2}, {"fp8", 2}};
  EXPECT_EQ(RunGlooWorld(4,
                         [&](int rank, comm::ProcessGroup& group) {
                           return SaveRank(
                               group, rank, dir,
                               BuildState(Globals(), SaveLayout(rank),
                                          /*fill=*/true),
                               options);
                         }),
            0);
  EXPECT_EQ(ListFiles(dir),
            (std::set<std::string>{HfFileName(1, 2), HfFileName(2, 2),
                                   kHfIndexFileName}));
  // Rank 2 holds no columns of "cols" (an empty chunk) and fp8 is
  // replicated (written once, by whichever rank the planner chose).
  const std::set<std::string> shards =
      ListFiles(JoinPath(dir, kHfShardedDirName));
  EXPECT_GE(shards.size(), 8u);
  EXPECT_TRUE(shards.contains(HfFileName(1, 2, 4)));
  for (int world : {2, 3}) {
    EXPECT_EQ(RunGlooWorld(world,
                           [&](int rank, comm::ProcessGroup& group) {
                             return LoadRank(group, rank, dir, world);
                           }),
              0);
    // The shards alone load too.
    EXPECT_EQ(RunGlooWorld(world,
                           [&](int rank, comm::ProcessGroup& group) {
                             return LoadRank(group, rank,
                                             JoinPath(dir, kHfShardedDirName),
                                             world);
                           }),
              0);
  }
}

TEST(HfDistributed, ReplicasSpreadOverRanksGiveOneWriterPerFile) {
  const std::string dir = FreshTestDir("hf_replicas");
  ChunkLayout replicated;
  for (const GlobalTensor& g : Globals()) replicated[g.name] = {};
  HuggingFaceStorageWriterOptions options;
  options.fqn_to_index_mapping = {
      {"row", 1}, {"block", 1}, {"cols", 1}, {"fp8", 1}};
  EXPECT_EQ(RunGlooWorld(3,
                         [&](int rank, comm::ProcessGroup& group) {
                           return SaveRank(group, rank, dir,
                                           BuildState(Globals(), replicated,
                                                      /*fill=*/true),
                                           options);
                         }),
            0);
  // The planner balances the replicas over the ranks, so file 1's tensors
  // come from several ranks: one file per writing rank, renumbered.
  const std::set<std::string> files = ListFiles(dir);
  EXPECT_TRUE(files.contains(kHfIndexFileName));
  EXPECT_GE(files.size(), 3u);
  for (int world : {1, 2}) {
    EXPECT_EQ(RunGlooWorld(world,
                           [&](int rank, comm::ProcessGroup& group) {
                             return LoadRank(group, rank, dir, world);
                           }),
              0);
  }
}

}  // namespace
}  // namespace dcp
