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
#include "comm/process_group_factory.h"
#include "engine/checkpoint.h"
#include "gtest/gtest.h"
#include "io/hf_storage.h"
#include "tests/comm/multiprocess.h"
#include "tests/test_util.h"

namespace dcp {
namespace {

using ::dcp::testing::Check;
using ::dcp::testing::FreshTestDir;
using ::dcp::testing::ListFiles;
using ::dcp::testing::RankExit;
using ::dcp::testing::RunRanks;

struct Global {
  std::string name;
  DType dtype;
  Shape shape;
};

const std::vector<Global>& Globals() {
  static const auto* globals = new std::vector<Global>{
      {"row", DType::kF32, {10, 6}},
      {"block", DType::kBF16, {8, 8}},
      {"cols", DType::kI64, {7, 5}},
      {"fp8", DType::kF8E4M3, {12}},
  };
  return *globals;
}

// Element `flat` of tensor `name`, byte `b`: any rank can fill or check any
// chunk.
uint8_t ByteAt(const std::string& name, int64_t flat, size_t b) {
  uint64_t h = 1469598103934665603ULL;
  for (char c : name) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ULL;
  h ^= static_cast<uint64_t>(flat) * 0x9E3779B97F4A7C15ULL + b;
  h *= 0xBF58476D1CE4E5B9ULL;
  return static_cast<uint8_t>(h >> 29);
}

// Fills (fill) or checks the chunk of `g` at `offsets`.
bool Visit(const Global& g, const Shape& offsets, Tensor& chunk, bool fill) {
  const size_t es = ElementSize(g.dtype);
  const Shape& sizes = chunk.sizes();
  auto* data = static_cast<uint8_t*>(chunk.data());
  for (int64_t i = 0; i < chunk.numel(); ++i) {
    int64_t rem = i, flat = 0, stride = 1;
    Shape local(sizes.size());
    for (size_t d = sizes.size(); d-- > 0;) {
      local[d] = rem % sizes[d];
      rem /= sizes[d];
    }
    for (size_t d = sizes.size(); d-- > 0;) {
      flat += (local[d] + offsets[d]) * stride;
      stride *= g.shape[d];
    }
    for (size_t b = 0; b < es; ++b) {
      if (fill) {
        data[i * es + b] = ByteAt(g.name, flat, b);
      } else if (data[i * es + b] != ByteAt(g.name, flat, b)) {
        return false;
      }
    }
  }
  return true;
}

// tensor -> this rank's chunks (offsets, sizes); none: a whole replica.
using Layout = std::map<std::string, std::vector<std::pair<Shape, Shape>>>;

Layout SaveLayout(int rank) {
  const int64_t rows[] = {0, 1, 3, 6, 10};
  const int64_t cols[] = {0, 2, 3, 3, 5};  // Rank 2 holds no columns.
  Layout layout;
  layout["row"] = {{{rows[rank], 0}, {rows[rank + 1] - rows[rank], 6}}};
  layout["block"] = {{{(rank / 2) * 4, (rank % 2) * 4}, {4, 4}}};
  layout["cols"] = {{{0, cols[rank]}, {7, cols[rank + 1] - cols[rank]}}};
  layout["fp8"] = {};
  return layout;
}

Layout LoadLayout(int rank, int world) {
  auto split = [&](int64_t n) {
    const int64_t base = n / world, extra = n % world;
    return std::make_pair(rank * base + std::min<int64_t>(rank, extra),
                          base + (rank < extra ? 1 : 0));
  };
  Layout layout;
  auto [c0, nc] = split(6);
  layout["row"] = {{{0, c0}, {10, nc}}};
  auto [r0, nr] = split(8);
  layout["block"] = {{{r0, 0}, {nr, 8}}};
  layout["cols"] = {};
  auto [f0, nf] = split(12);
  layout["fp8"] = {{{f0}, {nf}}};
  return layout;
}

StateDict Build(const Layout& layout, bool fill) {
  StateDict state;
  for (const Global& g : Globals()) {
    const auto& chunks = layout.at(g.name);
    if (chunks.empty()) {
      Tensor t = Tensor::Empty(g.dtype, g.shape);
      if (fill) Visit(g, Shape(g.shape.size(), 0), t, true);
      state[g.name] = t;
      continue;
    }
    std::vector<Shard> shards;
    for (const auto& [offsets, sizes] : chunks) {
      Tensor t = Tensor::Empty(g.dtype, sizes);
      if (fill) Visit(g, offsets, t, true);
      shards.push_back(Shard{offsets, t});
    }
    state[g.name] = ShardedTensor(g.dtype, g.shape, std::move(shards));
  }
  return state;
}

std::string Verify(StateDict& state, const Layout& layout) {
  for (const Global& g : Globals()) {
    StateValue& v = state[g.name];
    if (layout.at(g.name).empty()) {
      if (!Visit(g, Shape(g.shape.size(), 0), v.tensor(), false)) {
        return g.name + " differs";
      }
      continue;
    }
    for (Shard& shard : v.sharded_tensor().mutable_local_shards()) {
      if (!Visit(g, shard.offsets, shard.tensor, false)) {
        return absl::StrCat(g.name, " at ", ShapeToString(shard.offsets),
                            " differs");
      }
    }
  }
  return "";
}

std::vector<RankExit> RunGroup(
    int n, const std::function<int(int, comm::ProcessGroup&)>& body) {
  const std::string rdv = FreshTestDir("hf_rdv");
  return RunRanks(
      n,
      [&](int rank) {
        comm::RendezvousInfo info;
        info.rank = rank;
        info.world_size = n;
        info.store = comm::StoreAddress{comm::StoreAddress::Kind::kFile, rdv};
        comm::ProcessGroupOptions options;
        options.backend = comm::Backend::kGloo;
        options.timeout = absl::Seconds(30);
        options.connect_timeout = absl::Seconds(30);
        auto group = comm::CreateProcessGroup(info, options);
        if (int rc = Check(group.ok(), rank, group.status().ToString())) {
          return rc;
        }
        return body(rank, **group);
      },
      absl::Seconds(90));
}

void ExpectClean(const std::vector<RankExit>& exits) {
  for (size_t r = 0; r < exits.size(); ++r) {
    EXPECT_TRUE(exits[r].exited && exits[r].exit_code == 0)
        << "rank " << r << " exit " << exits[r].exit_code << " signal "
        << exits[r].signal << " timed out " << exits[r].timed_out;
  }
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
  const Layout layout = LoadLayout(rank, world);
  StateDict state = Build(layout, false);
  HuggingFaceStorageReader reader(dir);
  LoadOptions load;
  load.storage_reader = &reader;
  load.process_group = &group;
  absl::Status status = Load(state, load);
  if (int rc = Check(status.ok(), rank, status.ToString())) return rc;
  const std::string problem = Verify(state, layout);
  return Check(problem.empty(), rank, problem);
}

TEST(HfDistributed, ShardsOnFourRanksConsolidateAndLoadOnTwoAndThree) {
  const std::string dir = FreshTestDir("hf_dist");
  HuggingFaceStorageWriterOptions options;
  options.save_distributed = true;
  options.enable_consolidation = true;
  options.fqn_to_index_mapping = {
      {"row", 1}, {"block", 1}, {"cols", 2}, {"fp8", 2}};
  ExpectClean(RunGroup(4, [&](int rank, comm::ProcessGroup& group) {
    return SaveRank(group, rank, dir, Build(SaveLayout(rank), true), options);
  }));
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
    ExpectClean(RunGroup(world, [&](int rank, comm::ProcessGroup& group) {
      return LoadRank(group, rank, dir, world);
    }));
    // The shards alone load too.
    ExpectClean(RunGroup(world, [&](int rank, comm::ProcessGroup& group) {
      return LoadRank(group, rank, JoinPath(dir, kHfShardedDirName), world);
    }));
  }
}

TEST(HfDistributed, ReplicasSpreadOverRanksGiveOneWriterPerFile) {
  const std::string dir = FreshTestDir("hf_replicas");
  Layout replicated;
  for (const Global& g : Globals()) replicated[g.name] = {};
  HuggingFaceStorageWriterOptions options;
  options.fqn_to_index_mapping = {
      {"row", 1}, {"block", 1}, {"cols", 1}, {"fp8", 1}};
  ExpectClean(RunGroup(3, [&](int rank, comm::ProcessGroup& group) {
    return SaveRank(group, rank, dir, Build(replicated, true), options);
  }));
  // The planner balances the replicas over the ranks, so file 1's tensors
  // come from several ranks: one file per writing rank, renumbered.
  const std::set<std::string> files = ListFiles(dir);
  EXPECT_TRUE(files.contains(kHfIndexFileName));
  EXPECT_GE(files.size(), 3u);
  for (int world : {1, 2}) {
    ExpectClean(RunGroup(world, [&](int rank, comm::ProcessGroup& group) {
      return LoadRank(group, rank, dir, world);
    }));
  }
}

}  // namespace
}  // namespace dcp
