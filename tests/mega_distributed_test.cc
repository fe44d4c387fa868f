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
#include "io/fault_injection.h"
#include "io/mega_format.h"
#include "io/mega_storage.h"
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

// Rank `rank`'s own tensor, which holds the step of the save and lands in
// that rank's file.
std::string TagOf(int rank) { return absl::StrCat("tag", rank); }

// Four ranks save over a committed checkpoint; the coordinator's commit
// is decided (its journal durable), then renaming the first file fails.
// Every rank reports the failure, and the directory then loads whole as
// one checkpoint, each rank's file of the same save. Disabled: it loads a
// mix without a word ("2111": rank 0's file of the failed save, the
// others' of the old one): after the failed reduce the other ranks' Abort
// removes their temporary files (they do not know the commit was decided),
// and the coordinator's Abort completes the journal, skipping the renames
// whose sources are gone (io/commit_journal.cc), so the new index names
// the old files. Enable once decided commits keep every rank's files.
TEST(MegaDistributed,
     DISABLED_AFailureOnceTheCommitIsDecidedLeavesOneCheckpoint) {
  const std::string dir = FreshTestDir("mega_decided");
  auto save = [&](int64_t step, bool fail) {
    return RunGlooWorld(4, [&](int rank, comm::ProcessGroup& group) {
      FaultInjectionFileSystem faulty(LocalFileSystem());
      // The journal's rename is the first, the files' renames follow.
      if (fail && rank == 0) {
        faulty.Inject(Fault{.op = FaultOp::kRename, .error = EIO, .nth = 2});
      }
      MegaStorageWriterOptions options;
      options.file_system = &faulty;
      MegaStorageWriter writer(dir, options);
      StateDict state = BuildState(kGlobals, SaveLayout(rank), /*fill=*/true);
      Tensor tag = Tensor::Empty(DType::kI64, {1});
      *static_cast<int64_t*>(tag.data()) = step;
      state[TagOf(rank)] = tag;
      SaveOptions save;
      save.storage_writer = &writer;
      save.process_group = &group;
      absl::Status status = Save(state, save).status();
      return Check(status.ok() != fail, rank, status.ToString());
    });
  };
  ASSERT_EQ(save(1, /*fail=*/false), 0);
  ASSERT_EQ(save(2, /*fail=*/true), 0);
  ChunkLayout whole;
  for (const GlobalTensor& g : kGlobals) whole[g.name] = {};
  StateDict state = BuildState(kGlobals, whole, /*fill=*/false);
  for (int rank = 0; rank < 4; ++rank) {
    state[TagOf(rank)] = Tensor::Empty(DType::kI64, {1});
  }
  LoadOptions load;
  load.checkpoint_id = dir;
  absl::Status loaded = Load(state, load);
  ASSERT_TRUE(loaded.ok()) << loaded;
  EXPECT_EQ(VerifyState(state, kGlobals, whole), "");
  std::string steps;
  for (int rank = 0; rank < 4; ++rank) {
    absl::StrAppend(&steps,
                    *static_cast<int64_t*>(state[TagOf(rank)].tensor().data()));
  }
  EXPECT_TRUE(steps == "1111" || steps == "2222")
      << "each rank's file from save: " << steps;
}

}  // namespace
}  // namespace dcp
