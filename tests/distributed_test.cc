// Distributed save and load across real processes: one forked process per
// rank, Gloo over tcp on 127.0.0.1, rendezvous in a FileStore. Checks
// resharding across rank counts byte by byte, that replicated tensors are
// stored once, and that a failing or killed rank reaches every other rank as
// an error naming it, with no checkpoint committed.
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "comm/process_group_factory.h"
#include "core/checkpoint_exception.h"
#include "engine/checkpoint.h"
#include "gtest/gtest.h"
#include "io/fault_injection.h"
#include "io/file_system_storage.h"
#include "planner/default_planner.h"
#include "planner/plan_cache.h"
#include "tests/comm/multiprocess.h"
#include "tests/global_tensors.h"
#include "tests/test_util.h"

namespace dcp {
namespace {

using ::dcp::testing::Check;
using ::dcp::testing::FreshTestDir;
using ::dcp::testing::GlobalTensor;
using ::dcp::testing::RankExit;
using ::dcp::testing::RunRanks;

// The global tensors, under "model" in the state dict.
const std::vector<GlobalTensor>& Globals() {
  static const auto* globals = new std::vector<GlobalTensor>{
      {"row", DType::kF32, {10, 6}},
      {"block", DType::kBF16, {8, 8}},
      {"uneven", DType::kI64, {7, 5}},
      {"replicated", DType::kF32, {33}},
  };
  return *globals;
}

// One rank's chunks of each tensor (testing::ChunkLayout).
using Layout = testing::ChunkLayout;

// 4 ranks: rows split unevenly, 2x2 blocks, uneven column split, replicas.
Layout SaveLayout(int rank) {
  const int64_t row_starts[] = {0, 1, 3, 6, 10};
  // Rank 2 holds 0 columns, at the offset where rank 3 starts.
  const int64_t col_starts[] = {0, 2, 3, 3, 5};
  Layout layout;
  layout["row"] = {
      {{row_starts[rank], 0}, {row_starts[rank + 1] - row_starts[rank], 6}}};
  layout["block"] = {{{(rank / 2) * 4, (rank % 2) * 4}, {4, 4}}};
  layout["uneven"] = {
      {{0, col_starts[rank]}, {7, col_starts[rank + 1] - col_starts[rank]}}};
  layout["replicated"] = {};
  return layout;
}

// Loading into `world` ranks (2 or 3) with a different sharding: columns
// for "row", rows for "block", a whole replica of "uneven" on every rank.
Layout LoadLayout(int rank, int world) {
  Layout layout;
  auto [c0, nc] = testing::EvenSplit(6, rank, world);
  layout["row"] = {{{0, c0}, {10, nc}}};
  auto [r0, nr] = testing::EvenSplit(8, rank, world);
  layout["block"] = {{{r0, 0}, {nr, 8}}};
  layout["uneven"] = {};
  layout["replicated"] = {};
  return layout;
}

StateDict BuildState(const Layout& layout, bool fill, int64_t step) {
  StateDict state;
  state["model"] = testing::BuildState(Globals(), layout, fill);
  state["step"] = step;
  return state;
}

// Checks every byte of every tensor in `state` (laid out by `layout`).
std::string CheckState(StateDict& state, const Layout& layout,
                       int64_t want_step) {
  const std::string problem =
      testing::VerifyState(state["model"].dict(), Globals(), layout);
  if (!problem.empty()) return problem;
  if (state["step"].int_value() != want_step) return "step differs";
  return "";
}

std::unique_ptr<comm::ProcessGroup> JoinGroup(int rank, int world,
                                              const std::string& store,
                                              absl::Duration timeout) {
  comm::RendezvousInfo info;
  info.rank = rank;
  info.world_size = world;
  info.store = comm::StoreAddress{comm::StoreAddress::Kind::kFile, store};
  comm::ProcessGroupOptions options;
  options.backend = comm::Backend::kGloo;
  options.timeout = timeout;
  options.connect_timeout = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<comm::ProcessGroup>> group =
      comm::CreateProcessGroup(info, options);
  if (!group.ok()) {
    std::fprintf(stderr, "[rank %d] %s\n", rank,
                 group.status().ToString().c_str());
    return nullptr;
  }
  return *std::move(group);
}

absl::Status SaveOnRank(comm::ProcessGroup* group, const std::string& dir,
                        const StateDict& state,
                        FileSystemBase* file_system = nullptr) {
  FileSystemWriterOptions writer_options;
  writer_options.file_system = file_system;
  FileSystemWriter writer(dir, writer_options);
  SaveOptions options;
  options.process_group = group;
  absl::Status reset = writer.Reset(dir);
  if (!reset.ok()) return reset;
  return SaveStateDict(state, writer, options).status();
}

absl::Status LoadOnRank(comm::ProcessGroup* group, const std::string& dir,
                        StateDict& state) {
  LoadOptions options;
  options.checkpoint_id = dir;
  options.process_group = group;
  return Load(state, options);
}

// A rank-local save: each rank writes with its own writer (on `file_system`
// when given) in DIR/rank-R.
absl::Status SaveRankLocal(comm::ProcessGroup& group, const std::string& dir,
                           const StateDict& state,
                           FileSystemBase* file_system = nullptr) {
  FileSystemWriterOptions writer_options;
  writer_options.file_system = file_system;
  FileSystemWriter writer(dir, writer_options);
  SaveOptions save;
  save.process_group = &group;
  save.use_collectives = false;
  return SaveStateDict(state, writer, save).status();
}

// Forks `n` ranks that join a fresh Gloo group and run `body` with it.
std::vector<RankExit> RunGroupRanks(
    int n, const std::function<int(int, comm::ProcessGroup&)>& body,
    absl::Duration timeout = absl::Seconds(30)) {
  const std::string rdv = FreshTestDir("rdv");
  return RunRanks(
      n,
      [&](int rank) {
        auto group = JoinGroup(rank, n, rdv, timeout);
        if (int rc = Check(group != nullptr, rank, "join")) return rc;
        return body(rank, *group);
      },
      absl::Seconds(60));
}

void ExpectAllExitedCleanly(const std::vector<RankExit>& exits) {
  for (size_t r = 0; r < exits.size(); ++r) {
    EXPECT_TRUE(exits[r].exited && exits[r].exit_code == 0)
        << "rank " << r << " exit " << exits[r].exit_code << " signal "
        << exits[r].signal << " timed out " << exits[r].timed_out;
  }
}

TEST(Distributed, SaveOnFourRanksLoadOnTwoAndThree) {
  const std::string dir = FreshTestDir("dist-ckpt");
  ExpectAllExitedCleanly(
      RunGroupRanks(4, [&](int rank, comm::ProcessGroup& group) {
        absl::Status s =
            SaveOnRank(&group, dir, BuildState(SaveLayout(rank), true, 42));
        return Check(s.ok(), rank, s.ToString());
      }));

  // Replicated items are stored once: one location each, and the stored
  // lengths add up to exactly the unique bytes. In a block: the reader's
  // I/O threads end before the next ranks are forked (ThreadSanitizer
  // refuses threads started in the child of a multi-threaded fork).
  {
    FileSystemReader reader(dir);
    ASSERT_TRUE(reader.Reset(dir).ok());
    absl::StatusOr<Metadata> metadata = reader.ReadMetadata();
    ASSERT_TRUE(metadata.ok()) << metadata.status();
    int64_t stored = 0, replicated_items = 0;
    for (const auto& [index, info] : metadata->storage_data) {
      stored += info.length;
      if (index.fqn == "model.replicated") ++replicated_items;
    }
    int64_t unique = 0;
    for (const GlobalTensor& g : Globals()) {
      unique += NumElements(g.shape) * ElementSize(g.dtype);
    }
    EXPECT_EQ(replicated_items, 1);
    EXPECT_EQ(stored - 9 /* the encoded int "step" */, unique);
  }

  for (int world : {2, 3}) {
    ExpectAllExitedCleanly(
        RunGroupRanks(world, [&](int rank, comm::ProcessGroup& group) {
          const Layout layout = LoadLayout(rank, world);
          StateDict state = BuildState(layout, false, 0);
          absl::Status s = LoadOnRank(&group, dir, state);
          if (int rc = Check(s.ok(), rank, s.ToString())) return rc;
          const std::string problem = CheckState(state, layout, 42);
          return Check(problem.empty(), rank, problem);
        }));
  }
}

TEST(Distributed, FailedWriteOnRankTwoFailsEveryRankAndCommitsNothing) {
  const std::string dir = FreshTestDir("dist-fail");
  // A committed checkpoint that the failed save must leave intact.
  ExpectAllExitedCleanly(
      RunGroupRanks(4, [&](int rank, comm::ProcessGroup& group) {
        absl::Status s =
            SaveOnRank(&group, dir, BuildState(SaveLayout(rank), true, 1));
        return Check(s.ok(), rank, s.ToString());
      }));
  const std::set<std::string> before = testing::ListFiles(dir);

  ExpectAllExitedCleanly(RunGroupRanks(4, [&](int rank,
                                              comm::ProcessGroup& group) {
    FaultInjectionFileSystem faulty(LocalFileSystem());
    if (rank == 2) faulty.Inject(Fault{.op = FaultOp::kWrite, .error = EIO});
    absl::Status s =
        SaveOnRank(&group, dir, BuildState(SaveLayout(rank), true, 2), &faulty);
    if (int rc = Check(!s.ok(), rank, "save succeeded")) return rc;
    auto failures = CheckpointFailures(s);
    if (int rc = Check(failures.has_value() && failures->count(2) == 1, rank,
                       "no failure listed for rank 2: " + s.ToString())) {
      return rc;
    }
    if (int rc = Check(s.code() == absl::StatusCode::kDataLoss, rank,
                       "code " + s.ToString())) {
      return rc;
    }
    return Check(s.message().find("rank 2") != absl::string_view::npos, rank,
                 "message does not name rank 2: " + s.ToString());
  }));
  EXPECT_EQ(testing::ListFiles(dir), before);
  // The old checkpoint still loads bit-exactly (single process, whole).
  StateDict state = BuildState(LoadLayout(0, 1), false, 0);
  ASSERT_TRUE(LoadOnRank(nullptr, dir, state).ok());
  EXPECT_EQ(CheckState(state, LoadLayout(0, 1), 1), "");
}

// Forwards every SavePlanner call to a DefaultSavePlanner; tests override
// the one they watch.
class ForwardingSavePlanner : public SavePlanner {
 public:
  explicit ForwardingSavePlanner(DefaultSavePlannerOptions options = {})
      : inner_(std::move(options)) {}
  absl::Status SetUp(const StateDict& sd, const StorageMeta& meta,
                     bool coord) override {
    return inner_.SetUp(sd, meta, coord);
  }
  absl::StatusOr<SavePlan> CreateLocalPlan() override {
    return inner_.CreateLocalPlan();
  }
  absl::StatusOr<std::pair<std::vector<SavePlan>, Metadata>> CreateGlobalPlan(
      std::vector<SavePlan> plans) override {
    return inner_.CreateGlobalPlan(std::move(plans));
  }
  absl::StatusOr<SavePlan> FinishPlan(SavePlan plan) override {
    return inner_.FinishPlan(std::move(plan));
  }
  absl::StatusOr<WriteValue> ResolveData(const WriteItem& item) override {
    return inner_.ResolveData(item);
  }

 private:
  DefaultSavePlanner inner_;
};

// Kills its process the first time it is asked for data: a rank that dies
// in the middle of writing.
class DyingPlanner final : public ForwardingSavePlanner {
 public:
  absl::StatusOr<WriteValue> ResolveData(const WriteItem& item) override {
    ::kill(::getpid(), SIGKILL);
    return ForwardingSavePlanner::ResolveData(item);
  }
};

TEST(Distributed, KilledRankIsReportedByTheOthersWithinTheTimeout) {
  const std::string dir = FreshTestDir("dist-kill");
  const absl::Duration timeout = absl::Seconds(5);
  std::vector<RankExit> exits = RunGroupRanks(
      4,
      [&](int rank, comm::ProcessGroup& group) {
        DyingPlanner dying;
        FileSystemWriter writer(dir);
        SaveOptions options;
        options.process_group = &group;
        if (rank == 1) options.planner = &dying;
        const absl::Time start = absl::Now();
        absl::Status s = SaveStateDict(BuildState(SaveLayout(rank), true, 3),
                                       writer, options)
                             .status();
        const absl::Duration took = absl::Now() - start;
        if (int rc = Check(s.code() == absl::StatusCode::kDeadlineExceeded ||
                               s.code() == absl::StatusCode::kUnavailable,
                           rank, "code: " + s.ToString())) {
          return rc;
        }
        if (int rc =
                Check(s.message().find("rank 1") != absl::string_view::npos,
                      rank, "lost rank not named: " + s.ToString())) {
          return rc;
        }
        // Reported through the timeout, not a hang: the bound is loose
        // enough for any machine and far below the test's own limit.
        return Check(took < timeout + absl::Seconds(60), rank,
                     absl::StrCat("took ", absl::FormatDuration(took)));
      },
      timeout);
  EXPECT_EQ(exits[1].signal, SIGKILL);
  for (int r : {0, 2, 3}) {
    EXPECT_TRUE(exits[r].exited && exits[r].exit_code == 0) << "rank " << r;
  }
  EXPECT_FALSE(testing::ListFiles(dir).count(".metadata"));
}

// Counts the local plans that travel as "unchanged" markers.
class MarkerCountingPlanner final : public ForwardingSavePlanner {
 public:
  using ForwardingSavePlanner::ForwardingSavePlanner;
  absl::StatusOr<SavePlan> CreateLocalPlan() override {
    absl::StatusOr<SavePlan> plan = ForwardingSavePlanner::CreateLocalPlan();
    if (plan.ok() && IsUnchangedSavePlan(*plan)) ++markers;
    return plan;
  }
  int markers = 0;
};

// Plan caching across real processes: the second save of an unchanged
// layout sends markers, and a dtype change invalidates the cache; every
// checkpoint still loads bit-exactly.
TEST(Distributed, PlanCachingAcrossProcesses) {
  const std::string dir = FreshTestDir("dist-cache");
  ExpectAllExitedCleanly(RunGroupRanks(4, [&](int rank,
                                              comm::ProcessGroup& group) {
    DefaultSavePlannerOptions options;
    options.enable_plan_caching = true;
    options.plan_cache = std::make_shared<SavePlanCache>();
    MarkerCountingPlanner planner(options);
    const Layout layout = SaveLayout(rank);
    for (int64_t step : {1, 2}) {
      FileSystemWriter writer(dir);
      SaveOptions save;
      save.process_group = &group;
      save.planner = &planner;
      absl::Status s =
          SaveStateDict(BuildState(layout, true, step), writer, save).status();
      if (int rc = Check(s.ok(), rank, "save: " + s.ToString())) return rc;
    }
    if (int rc = Check(planner.markers == 1, rank,
                       absl::StrCat("markers sent: ", planner.markers))) {
      return rc;
    }
    StateDict state = BuildState(layout, false, 0);
    absl::Status s = LoadOnRank(&group, dir, state);
    if (int rc = Check(s.ok(), rank, "load: " + s.ToString())) return rc;
    const std::string problem = CheckState(state, layout, 2);
    if (int rc = Check(problem.empty(), rank, problem)) return rc;
    // Same names, shapes and byte sizes, another dtype (F32 -> I32): a
    // cache that ignored dtype would reuse a plan with the wrong dtype.
    StateDict changed = BuildState(layout, true, 3);
    changed["model"].dict()["replicated"] = Tensor::Empty(DType::kI32, {33});
    FileSystemWriter writer(dir);
    SaveOptions save;
    save.process_group = &group;
    save.planner = &planner;
    s = SaveStateDict(changed, writer, save).status();
    if (int rc = Check(s.ok(), rank, "save 3: " + s.ToString())) return rc;
    return Check(planner.markers == 1, rank,
                 absl::StrCat("a changed plan travelled as a marker: ",
                              planner.markers));
  }));
  FileSystemReader reader(dir);
  ASSERT_TRUE(reader.Reset(dir).ok());
  absl::StatusOr<Metadata> metadata = reader.ReadMetadata();
  ASSERT_TRUE(metadata.ok()) << metadata.status();
  const auto& replicated = std::get<TensorStorageMetadata>(
      metadata->state_dict_metadata.at("model.replicated"));
  EXPECT_EQ(replicated.properties.dtype, DType::kI32);
}

// use_collectives=false: every rank saves its own part under DIR/rank-R
// with rank-local metadata; a load on the same rank count finds it.
TEST(Distributed, RankLocalSaveAndLoadWithoutCollectives) {
  const std::string dir = FreshTestDir("dist-local");
  ExpectAllExitedCleanly(
      RunGroupRanks(4, [&](int rank, comm::ProcessGroup& group) {
        const Layout layout = SaveLayout(rank);
        SaveOptions save;
        save.checkpoint_id = dir;
        save.process_group = &group;
        save.use_collectives = false;
        absl::Status s = Save(BuildState(layout, true, 7), save).status();
        if (int rc = Check(s.ok(), rank, "save: " + s.ToString())) return rc;
        StateDict state = BuildState(layout, false, 0);
        s = LoadOnRank(&group, dir, state);
        if (int rc = Check(s.ok(), rank, "load: " + s.ToString())) return rc;
        const std::string problem = CheckState(state, layout, 7);
        return Check(problem.empty(), rank, problem);
      }));
  EXPECT_FALSE(testing::ListFiles(dir).count(".metadata"));
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(
        testing::ListFiles(absl::StrCat(dir, "/rank-", r)).count(".metadata"))
        << "rank " << r;
  }
}

// One writer per rank reused for rank-local saves: each lands in DIR/rank-R
// and the writer keeps DIR as its location (never DIR/rank-R/rank-R).
TEST(Distributed, RankLocalSavesLeaveTheWritersLocationAlone) {
  const std::string dir = FreshTestDir("dist-local-reuse");
  ExpectAllExitedCleanly(RunGroupRanks(2, [&](int rank,
                                              comm::ProcessGroup& group) {
    const Layout layout = SaveLayout(rank);
    FileSystemWriter writer(dir);
    SaveOptions save;
    save.process_group = &group;
    save.use_collectives = false;
    for (int64_t step : {1, 2}) {
      absl::Status s =
          SaveStateDict(BuildState(layout, true, step), writer, save).status();
      if (int rc = Check(s.ok(), rank,
                         absl::StrCat("save ", step, ": ", s.ToString()))) {
        return rc;
      }
      if (int rc = Check(writer.path() == dir, rank,
                         "the writer moved to " + writer.path())) {
        return rc;
      }
    }
    StateDict state = BuildState(layout, false, 0);
    absl::Status s = LoadOnRank(&group, dir, state);
    if (int rc = Check(s.ok(), rank, "load: " + s.ToString())) return rc;
    const std::string problem = CheckState(state, layout, 2);
    return Check(problem.empty(), rank, problem);
  }));
  for (int r = 0; r < 2; ++r) {
    const std::string rank_dir = absl::StrCat(dir, "/rank-", r);
    EXPECT_TRUE(testing::ListFiles(rank_dir).count(".metadata")) << rank_dir;
    EXPECT_FALSE(std::filesystem::exists(absl::StrCat(rank_dir, "/rank-", r)))
        << "nested rank directory under " << rank_dir;
  }
}

// A save refuses to put a checkpoint of the other layout beside a
// committed one (the directory would hold both), whichever came first; the
// committed checkpoint stays and loads.
TEST(Distributed, SavesRefuseToMixTheLayoutsInOneDirectory) {
  const std::string shared_first = FreshTestDir("dist-shared-first");
  const std::string local_first = FreshTestDir("dist-local-first");
  ExpectAllExitedCleanly(
      RunGroupRanks(4, [&](int rank, comm::ProcessGroup& group) {
        const Layout layout = SaveLayout(rank);
        absl::Status s =
            SaveOnRank(&group, shared_first, BuildState(layout, true, 1));
        if (int rc = Check(s.ok(), rank, "shared save: " + s.ToString())) {
          return rc;
        }
        s = SaveRankLocal(group, shared_first, BuildState(layout, true, 2));
        if (int rc = Check(
                s.code() == absl::StatusCode::kFailedPrecondition &&
                    absl::StrContains(s.message(), shared_first + "/.metadata"),
                rank, "rank-local save beside a shared one: " + s.ToString())) {
          return rc;
        }
        s = SaveRankLocal(group, local_first, BuildState(layout, true, 3));
        if (int rc = Check(s.ok(), rank, "rank-local save: " + s.ToString())) {
          return rc;
        }
        s = SaveOnRank(&group, local_first, BuildState(layout, true, 4));
        if (int rc = Check(
                s.code() == absl::StatusCode::kFailedPrecondition &&
                    absl::StrContains(s.message(),
                                      local_first + "/rank-0/.metadata"),
                rank, "shared save beside rank-local ones: " + s.ToString())) {
          return rc;
        }
        StateDict state = BuildState(layout, false, 0);
        s = LoadOnRank(&group, local_first, state);
        if (int rc = Check(s.ok(), rank, "load: " + s.ToString())) return rc;
        return Check(CheckState(state, layout, 3).empty(), rank,
                     "the rank-local checkpoint changed");
      }));
  // The refused saves left no file (a rank's empty directory may stay).
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(
        testing::ListFiles(absl::StrCat(shared_first, "/rank-", r)).empty())
        << "rank " << r;
  }
  EXPECT_FALSE(std::filesystem::exists(local_first + "/.metadata"));
}

// A directory holding a checkpoint of all ranks and rank-local ones (put
// together by hand: saves refuse to): which is newer is unknown, so every
// rank's load fails naming both.
TEST(Distributed, LoadRefusesBothLayoutsInOneDirectory) {
  const std::string dir = FreshTestDir("dist-both-layouts");
  const std::string local = FreshTestDir("dist-both-layouts-local");
  ExpectAllExitedCleanly(
      RunGroupRanks(4, [&](int rank, comm::ProcessGroup& group) {
        const Layout layout = SaveLayout(rank);
        absl::Status s = SaveOnRank(&group, dir, BuildState(layout, true, 1));
        if (int rc = Check(s.ok(), rank, "shared save: " + s.ToString())) {
          return rc;
        }
        s = SaveRankLocal(group, local, BuildState(layout, true, 2));
        if (int rc = Check(s.ok(), rank, "rank-local save: " + s.ToString())) {
          return rc;
        }
        return 0;
      }));
  for (int r = 0; r < 4; ++r) {
    std::filesystem::rename(absl::StrCat(local, "/rank-", r),
                            absl::StrCat(dir, "/rank-", r));
  }
  ExpectAllExitedCleanly(RunGroupRanks(4, [&](int rank,
                                              comm::ProcessGroup& group) {
    const Layout layout = SaveLayout(rank);
    StateDict state = BuildState(layout, false, 0);
    absl::Status s = LoadOnRank(&group, dir, state);
    if (int rc = Check(s.code() == absl::StatusCode::kFailedPrecondition, rank,
                       "load: " + s.ToString())) {
      return rc;
    }
    for (const std::string& path : {absl::StrCat(dir, "/.metadata"),
                                    absl::StrCat(dir, "/rank-0/.metadata")}) {
      if (int rc = Check(absl::StrContains(s.message(), path), rank,
                         absl::StrCat("load error does not name ", path, ": ",
                                      s.ToString()))) {
        return rc;
      }
    }
    return 0;
  }));
}

// A rank-local save that commits on ranks 0 and 2 and fails on rank 1
// leaves rank 1's previous checkpoint beside the others' new ones: the
// load refuses the mix on every rank, naming who holds which save, and
// changes nothing.
TEST(Distributed, RankLocalCheckpointsOfDifferentSavesAreRefusedOnLoad) {
  const std::string dir = FreshTestDir("dist-local-mixed");
  ExpectAllExitedCleanly(RunGroupRanks(3, [&](int rank,
                                              comm::ProcessGroup& group) {
    const Layout layout = SaveLayout(rank);
    absl::Status s = SaveRankLocal(group, dir, BuildState(layout, true, 1));
    if (int rc = Check(s.ok(), rank, "save 1: " + s.ToString())) return rc;
    FaultInjectionFileSystem faulty(LocalFileSystem());
    if (rank == 1) faulty.Inject(Fault{.op = FaultOp::kWrite, .error = EIO});
    s = SaveRankLocal(group, dir, BuildState(layout, true, 2), &faulty);
    if (int rc = Check(!s.ok(), rank, "save 2 succeeded")) return rc;

    StateDict state = BuildState(layout, false, 0);
    s = LoadOnRank(&group, dir, state);
    if (int rc = Check(s.code() == absl::StatusCode::kDataLoss, rank,
                       "load: " + s.ToString())) {
      return rc;
    }
    for (absl::string_view part :
         {absl::string_view("come from different saves"),
          absl::string_view("ranks 0, 2 hold save "),
          absl::string_view("rank 1 holds save "), absl::string_view(dir)}) {
      if (int rc = Check(absl::StrContains(s.message(), part), rank,
                         absl::StrCat("load error lacks \"", part,
                                      "\": ", s.ToString()))) {
        return rc;
      }
    }
    return Check(
        state["step"].int_value() == 0 &&
            !testing::VerifyState(state["model"].dict(), Globals(), layout)
                 .empty(),
        rank, "the refused load changed the state");
  }));
  // Each rank's own checkpoint is still whole: rank 1's from save 1.
  for (int r = 0; r < 3; ++r) {
    StateDict state = BuildState(SaveLayout(r), false, 0);
    LoadOptions options;
    options.checkpoint_id = absl::StrCat(dir, "/rank-", r);
    options.no_dist = true;
    ASSERT_TRUE(Load(state, options).ok()) << "rank " << r;
    EXPECT_EQ(state["step"].int_value(), r == 1 ? 1 : 2) << "rank " << r;
  }
}

// Rank-local checkpoints load only on the rank count that saved them: on
// fewer ranks every rank fails naming the count.
TEST(Distributed, RankLocalCheckpointsOnFewerRanksAreRefused) {
  const std::string dir = FreshTestDir("dist-local-fewer");
  ExpectAllExitedCleanly(
      RunGroupRanks(3, [&](int rank, comm::ProcessGroup& group) {
        absl::Status s =
            SaveRankLocal(group, dir, BuildState(SaveLayout(rank), true, 1));
        return Check(s.ok(), rank, "save: " + s.ToString());
      }));
  ExpectAllExitedCleanly(
      RunGroupRanks(2, [&](int rank, comm::ProcessGroup& group) {
        StateDict state = BuildState(SaveLayout(rank), false, 0);
        absl::Status s = LoadOnRank(&group, dir, state);
        if (int rc = Check(s.code() == absl::StatusCode::kFailedPrecondition,
                           rank, "load: " + s.ToString())) {
          return rc;
        }
        return Check(absl::StrContains(s.message(),
                                       "of 3, but this load "
                                       "runs on 2 ranks"),
                     rank, "load error: " + s.ToString());
      }));
}

// A rank whose checkpoint id names no storage fails inside the shared
// steps, so every rank fails at once naming it (instead of the others
// waiting for it until the group times out): a save, then a load.
TEST(Distributed, ARankWhoseStorageCannotBeMadeFailsEveryRankNamingIt) {
  const std::string dir = FreshTestDir("dist-no-storage");
  ExpectAllExitedCleanly(RunGroupRanks(2, [&](int rank,
                                              comm::ProcessGroup& group) {
    const std::string id = rank == 1 ? "nosuch://" + dir : dir;
    SaveOptions save;
    save.checkpoint_id = id;
    save.process_group = &group;
    absl::Status s = Save(BuildState(SaveLayout(rank), true, 1), save).status();
    auto failures = CheckpointFailures(s);
    if (int rc = Check(failures.has_value() && failures->count(1) == 1 &&
                           absl::StrContains(s.message(), "nosuch"),
                       rank, "save: " + s.ToString())) {
      return rc;
    }
    StateDict state = BuildState(SaveLayout(rank), false, 0);
    LoadOptions load;
    load.checkpoint_id = id;
    load.process_group = &group;
    s = Load(state, load);
    failures = CheckpointFailures(s);
    return Check(failures.has_value() && failures->count(1) == 1 &&
                     absl::StrContains(s.message(), "nosuch"),
                 rank, "load: " + s.ToString());
  }));
  EXPECT_FALSE(testing::ListFiles(dir).count(".metadata"));
}

}  // namespace
}  // namespace dcp
