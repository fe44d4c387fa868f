// Load-time resharding property test: random shapes (up to 4-d, zero-size
// dimensions included), random saved layouts over random rank counts (some
// chunks replicated), random requested layouts; the loaded bytes must equal
// the reference, and the global load plan's read dedup must read every
// needed stored item exactly once.
#include <random>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"
#include "planner/default_planner.h"
#include "planner/global_load_plan.h"
#include "planner/in_memory_checkpoint.h"

namespace dcp {
namespace {

using Box = std::pair<Shape, Shape>;  // offsets, sizes

// Random guillotine partition of the whole tensor into up to `pieces` boxes.
std::vector<Box> RandomTiling(std::mt19937_64& rng, const Shape& global,
                              int pieces) {
  std::vector<Box> boxes = {{Shape(global.size(), 0), global}};
  for (int cut = 1; cut < pieces && !global.empty(); ++cut) {
    const size_t pick = rng() % boxes.size();
    const size_t d = rng() % global.size();
    Box& b = boxes[pick];
    if (b.second[d] < 2) continue;
    const int64_t at = 1 + rng() % (b.second[d] - 1);
    Box rest = b;
    b.second[d] = at;
    rest.first[d] += at;
    rest.second[d] -= at;
    boxes.push_back(rest);
  }
  return boxes;
}

Tensor RandomTensor(std::mt19937_64& rng, DType dtype, const Shape& sizes) {
  Tensor t = Tensor::Empty(dtype, sizes);
  auto* p = static_cast<unsigned char*>(t.data());
  for (size_t i = 0; i < t.nbytes(); ++i)
    p[i] = static_cast<unsigned char>(rng());
  return t;
}

Tensor Slice(const Tensor& full, const Box& box) {
  Tensor out = Tensor::Empty(full.dtype(), box.second);
  CopyBox(static_cast<const char*>(full.data()), full.sizes(), box.first,
          out.view(), Shape(box.second.size(), 0), box.second);
  return out;
}

void CheckReadDedup(const std::vector<LoadPlan>& plans, const Metadata& md) {
  // Every needed stored item: read by the rank itself, or received from a
  // reader that lists this rank.
  absl::flat_hash_set<MetadataIndex> needed;
  for (size_t r = 0; r < plans.size(); ++r) {
    absl::flat_hash_map<MetadataIndex, int32_t> from;
    for (const SharedRead& s : plans[r].received_from) {
      ASSERT_EQ(s.ranks.size(), 1u);
      from[s.storage_index] = s.ranks[0];
      const auto& peers = plans[s.ranks[0]].read_for_peers;
      auto it =
          std::find_if(peers.begin(), peers.end(), [&](const SharedRead& p) {
            return p.storage_index == s.storage_index;
          });
      ASSERT_NE(it, peers.end());
      EXPECT_NE(std::find(it->ranks.begin(), it->ranks.end(), r),
                it->ranks.end());
    }
    for (const ReadItem& item : plans[r].items)
      needed.insert(item.storage_index);
  }
  const std::vector<int64_t> per_rank = ReadBytesPerRank(plans, md);
  int64_t total = 0;
  for (int64_t b : per_rank) total += b;
  int64_t want = 0;
  for (const MetadataIndex& index : needed) {
    const auto& t =
        std::get<TensorStorageMetadata>(md.state_dict_metadata.at(index.fqn));
    for (const auto& c : t.chunks) {
      if (c.offsets == *index.offset) {
        want += NumElements(c.sizes) * ElementSize(t.properties.dtype);
      }
    }
  }
  EXPECT_EQ(total, want) << "each needed stored item is read exactly once";
}

TEST(ReshardingPropertyTest, RandomLayoutsLoadExactBytes) {
  std::mt19937_64 rng(20261202);
  const DType dtypes[] = {DType::kU8, DType::kBF16, DType::kF32, DType::kF64};
  int nonempty = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    SCOPED_TRACE(trial);
    const size_t rank = rng() % 5;
    Shape global;
    for (size_t d = 0; d < rank; ++d) {
      global.push_back(rng() % 10 == 0 ? 0 : 1 + rng() % 6);
    }
    const DType dtype = dtypes[rng() % 4];
    const Tensor full = RandomTensor(rng, dtype, global);
    nonempty += full.numel() > 0;

    // Saved: a tiling spread over 1-6 ranks; some boxes also on a second
    // rank (replicated, written once).
    const int save_ranks = 1 + rng() % 6;
    std::vector<std::vector<Box>> saved_boxes(save_ranks);
    for (const Box& b : RandomTiling(rng, global, 1 + rng() % 8)) {
      const int r = rng() % save_ranks;
      saved_boxes[r].push_back(b);
      const int other = rng() % save_ranks;
      if (rng() % 4 == 0 && other != r) saved_boxes[other].push_back(b);
    }
    std::vector<StateDict> saved(save_ranks);
    std::vector<DefaultSavePlanner> save_planners(save_ranks);
    std::vector<const StateDict*> sds;
    std::vector<SavePlanner*> sps;
    for (int r = 0; r < save_ranks; ++r) {
      std::vector<Shard> shards;
      for (const Box& b : saved_boxes[r])
        shards.push_back({b.first, Slice(full, b)});
      saved[r]["t"] = ShardedTensor(dtype, global, std::move(shards));
      sds.push_back(&saved[r]);
      sps.push_back(&save_planners[r]);
    }
    absl::StatusOr<InMemoryCheckpoint> ckpt = SaveInMemory(sds, sps);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();

    // Requested: another tiling over 1-4 ranks, some boxes on two ranks.
    const int load_ranks = 1 + rng() % 4;
    std::vector<std::vector<Box>> want_boxes(load_ranks);
    for (const Box& b : RandomTiling(rng, global, 1 + rng() % 8)) {
      want_boxes[rng() % load_ranks].push_back(b);
      if (rng() % 3 == 0) want_boxes[rng() % load_ranks].push_back(b);
    }
    std::vector<StateDict> dest(load_ranks);
    std::vector<DefaultLoadPlanner> load_planners(load_ranks);
    std::vector<StateDict*> dps;
    std::vector<LoadPlanner*> lps;
    for (int r = 0; r < load_ranks; ++r) {
      std::vector<Shard> shards;
      std::set<Shape> seen;
      for (const Box& b : want_boxes[r]) {
        if (seen.insert(b.first).second) {
          shards.push_back({b.first, Tensor::Empty(dtype, b.second)});
        }
      }
      dest[r]["t"] = ShardedTensor(dtype, global, std::move(shards));
      dps.push_back(&dest[r]);
      lps.push_back(&load_planners[r]);
    }
    ASSERT_TRUE(LoadFromMemory(*ckpt, dps, lps).ok());
    for (int r = 0; r < load_ranks; ++r) {
      for (const Shard& s : dest[r]["t"].sharded_tensor().local_shards()) {
        ASSERT_TRUE(
            s.tensor.BytesEqual(Slice(full, {s.offsets, s.tensor.sizes()})))
            << "rank " << r << " shard at " << ShapeToString(s.offsets);
      }
    }
    // Read dedup over the same local plans.
    std::vector<LoadPlan> local;
    for (int r = 0; r < load_ranks; ++r) {
      DefaultLoadPlanner p;
      ASSERT_TRUE(p.SetUp(dps[r], ckpt->metadata, r == 0).ok());
      local.push_back(*p.CreateLocalPlan());
    }
    CheckReadDedup(BuildGlobalLoadPlan(std::move(local), ckpt->metadata),
                   ckpt->metadata);
  }
  EXPECT_GT(nonempty, 1000);
}

TEST(GlobalLoadPlanTest, ReplicatedLoadIsReadOnceAndBalanced) {
  // Four ranks each load four whole replicated tensors of equal size: each
  // rank reads one and receives three.
  StateDict sd;
  for (const char* name : {"a", "b", "c", "d"}) {
    sd[name] = Tensor::Empty(DType::kF32, {16});
  }
  DefaultSavePlanner saver;
  absl::StatusOr<InMemoryCheckpoint> ckpt = SaveInMemory({&sd}, {&saver});
  ASSERT_TRUE(ckpt.ok());
  std::vector<LoadPlan> local;
  std::vector<StateDict> dest(4, sd);
  for (int r = 0; r < 4; ++r) {
    DefaultLoadPlanner p;
    ASSERT_TRUE(p.SetUp(&dest[r], ckpt->metadata, r == 0).ok());
    local.push_back(*p.CreateLocalPlan());
  }
  DefaultLoadPlanner coordinator;
  ASSERT_TRUE(coordinator.SetUp(&dest[0], ckpt->metadata, true).ok());
  absl::StatusOr<std::vector<LoadPlan>> global =
      coordinator.CreateGlobalPlan(local);
  ASSERT_TRUE(global.ok());
  EXPECT_EQ(ReadBytesPerRank(*global, ckpt->metadata),
            (std::vector<int64_t>{64, 64, 64, 64}));
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ((*global)[r].items.size(), 4u);  // Items are kept.
    ASSERT_EQ((*global)[r].read_for_peers.size(), 1u);
    EXPECT_EQ((*global)[r].read_for_peers[0].ranks.size(), 3u);
    EXPECT_EQ((*global)[r].received_from.size(), 3u);
  }
  DefaultLoadPlanner no_dedup({.dedup_reads = false});
  ASSERT_TRUE(no_dedup.SetUp(&dest[0], ckpt->metadata, true).ok());
  absl::StatusOr<std::vector<LoadPlan>> plain =
      no_dedup.CreateGlobalPlan(local);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(ReadBytesPerRank(*plain, ckpt->metadata),
            (std::vector<int64_t>{256, 256, 256, 256}));
}

}  // namespace
}  // namespace dcp
