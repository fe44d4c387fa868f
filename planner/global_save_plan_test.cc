#include "planner/global_save_plan.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dcp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

WriteItem Chunk(const std::string& name, Shape offsets, Shape sizes,
                Shape global, DType dtype = DType::kF32) {
  WriteItem item;
  item.index = MetadataIndex(name, offsets);
  item.type = WriteItemType::kShard;
  item.tensor_data = TensorWriteData{{offsets, sizes}, {dtype}, global};
  return item;
}

WriteItem Whole(const std::string& name, Shape sizes,
                DType dtype = DType::kF32) {
  WriteItem item = Chunk(name, Shape(sizes.size(), 0), sizes, sizes, dtype);
  item.type = WriteItemType::kTensor;
  return item;
}

WriteItem Value(const std::string& name, int64_t nbytes) {
  WriteItem item;
  item.index = MetadataIndex(name);
  item.type = WriteItemType::kBytesIO;
  item.bytes_io_data = BytesIOWriteData{nbytes};
  return item;
}

absl::StatusOr<GlobalSavePlan> Build(
    std::vector<std::vector<WriteItem>> items,
    DedupPolicy policy = DedupPolicy::kBalanceBytes) {
  std::vector<SavePlan> plans(items.size());
  for (size_t r = 0; r < items.size(); ++r) plans[r].items = items[r];
  return BuildGlobalSavePlan(std::move(plans), {}, policy);
}

std::vector<int64_t> Loads(const GlobalSavePlan& plan) {
  std::vector<int64_t> loads;
  for (const SavePlan& p : plan.plans) {
    int64_t bytes = 0;
    for (const WriteItem& item : p.items) bytes += item.StorageBytes();
    loads.push_back(bytes);
  }
  return loads;
}

TEST(GlobalSavePlanTest, ReplicatedItemsAreWrittenOnce) {
  std::vector<std::vector<WriteItem>> items(4);
  for (int r = 0; r < 4; ++r) {
    items[r] = {Whole("a", {4}), Whole("b", {4}),  Whole("c", {4}),
                Whole("d", {4}), Value("step", 9), Chunk("s", {r}, {1}, {4})};
  }
  absl::StatusOr<GlobalSavePlan> plan = Build(items);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::map<std::string, int> writers;
  for (const SavePlan& p : plan->plans) {
    for (const WriteItem& item : p.items) ++writers[item.index.ToString()];
  }
  EXPECT_EQ(writers.size(), 9u);
  for (const auto& [name, count] : writers) EXPECT_EQ(count, 1) << name;
  // Balanced: each rank writes one shard and one of a..d.
  for (const SavePlan& p : plan->plans) EXPECT_GE(p.items.size(), 2u);
  EXPECT_EQ(plan->metadata.state_dict_metadata.size(), 6u);

  absl::StatusOr<GlobalSavePlan> lowest =
      Build(items, DedupPolicy::kLowestRank);
  ASSERT_TRUE(lowest.ok());
  EXPECT_EQ(lowest->plans[0].items.size(), 6u);
  for (int r = 1; r < 4; ++r) EXPECT_EQ(lowest->plans[r].items.size(), 1u);
}

TEST(GlobalSavePlanTest, MetadataChunksSortedWithIndexHints) {
  absl::StatusOr<GlobalSavePlan> plan =
      Build({{Chunk("t", {2, 0}, {2, 3}, {4, 3})},
             {Chunk("t", {0, 0}, {2, 3}, {4, 3})}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  const auto& t = std::get<TensorStorageMetadata>(
      plan->metadata.state_dict_metadata.at("t"));
  ASSERT_EQ(t.chunks.size(), 2u);
  EXPECT_EQ(t.chunks[0].offsets, (Shape{0, 0}));
  EXPECT_EQ(plan->plans[0].items[0].index.index, 1);
  EXPECT_EQ(plan->plans[1].items[0].index.index, 0);
  EXPECT_EQ(plan->metadata.version, kFormatVersion);
}

// Random workloads: pinned items per rank plus items replicated over groups
// of 2-8 consecutive ranks. The most loaded rank stays within 1.05x the
// ideal share plus one item.
TEST(GlobalSavePlanTest, BalancedDedupIsWithinBound) {
  std::mt19937_64 rng(1234);
  for (int num_ranks : {8, 64, 512, 4096}) {
    std::vector<std::vector<WriteItem>> items(num_ranks);
    std::vector<int64_t> pinned(num_ranks, 0);
    int64_t total = 0;
    int64_t max_item = 0;
    const int per_rank = num_ranks >= 4096 ? 4 : 16;
    int id = 0;
    for (int r = 0; r < num_ranks; ++r) {
      for (int k = 0; k < per_rank; ++k) {
        const int64_t n = 1 + rng() % 1000;
        items[r].push_back(Whole(absl::StrCat("p", id++), {n}, DType::kU8));
        pinned[r] += n;
        total += n;
        max_item = std::max(max_item, n);
      }
    }
    // Bytes of the items held only within [first, first + group), by first.
    std::vector<std::vector<std::pair<int, int64_t>>> by_first(num_ranks);
    for (int k = 0; k < per_rank * num_ranks / 2; ++k) {
      const int group = 2 + rng() % 7;
      const int first = rng() % (num_ranks - group + 1);
      const int64_t n = 1 + rng() % 4000;
      const std::string name = absl::StrCat("r", id++);
      for (int r = first; r < first + group; ++r) {
        items[r].push_back(Whole(name, {n}, DType::kU8));
      }
      by_first[first].push_back({first + group, n});
      total += n;
      max_item = std::max(max_item, n);
    }
    absl::StatusOr<GlobalSavePlan> plan = Build(items);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const std::vector<int64_t> loads = Loads(*plan);
    int64_t sum = 0;
    for (int64_t l : loads) sum += l;
    EXPECT_EQ(sum, total);
    // The ideal share: no schedule beats the bytes a window of ranks must
    // write alone (its pinned items and the items held only inside it),
    // spread evenly over the window; the whole job is the widest window.
    double ideal = static_cast<double>(total) / num_ranks;
    for (int begin = 0; begin < num_ranks; ++begin) {
      int64_t inside = 0;
      for (int end = begin + 1; end <= std::min(num_ranks, begin + 64); ++end) {
        inside += pinned[end - 1];
        for (int f = begin; f < end; ++f) {
          for (const auto& [last, n] : by_first[f]) {
            if (last == end) inside += n;
          }
        }
        ideal = std::max(ideal, static_cast<double>(inside) / (end - begin));
      }
    }
    const int64_t most = *std::max_element(loads.begin(), loads.end());
    EXPECT_LE(most, 1.05 * ideal + max_item)
        << num_ranks << " ranks: ideal " << ideal;
  }
}

TEST(GlobalSavePlanTest, ChunkOutOfBounds) {
  absl::Status status = Build({{Chunk("w", {0, 0}, {2, 4}, {4, 4})},
                               {Chunk("w", {2, 1}, {2, 4}, {4, 4})}})
                            .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("tensor \"w\""),
                    HasSubstr("offsets [2, 1] sizes [2, 4]] from rank 1"),
                    HasSubstr("outside the tensor's shape [4, 4]")));
}

TEST(GlobalSavePlanTest, OverlappingChunks1d) {
  absl::Status status = Build({{Chunk("w", {0, 0}, {3, 4}, {4, 4})},
                               {Chunk("w", {2, 0}, {2, 4}, {4, 4})}})
                            .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("tensor \"w\""), HasSubstr("from rank 0"),
                    HasSubstr("from rank 1"), HasSubstr("overlap")));
}

// Overlap and a hole of the same volume: the element count matches, the
// tiling does not.
TEST(GlobalSavePlanTest, OverlapHiddenByHole2d) {
  absl::Status status = Build({{Chunk("g", {0, 0}, {2, 2}, {4, 4})},
                               {Chunk("g", {0, 2}, {2, 2}, {4, 4})},
                               {Chunk("g", {2, 0}, {2, 2}, {4, 4})},
                               {Chunk("g", {1, 1}, {2, 2}, {4, 4})}})
                            .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("tensor \"g\""),
                    HasSubstr("[offsets [1, 1] sizes [2, 2]] from rank 3"),
                    HasSubstr("overlap")));
}

TEST(GlobalSavePlanTest, IncompleteCoverage) {
  absl::Status status = Build({{Chunk("g", {0, 0}, {2, 2}, {4, 4})},
                               {Chunk("g", {0, 2}, {2, 2}, {4, 4})},
                               {Chunk("g", {2, 0}, {2, 2}, {4, 4})}})
                            .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("tensor \"g\" of shape [4, 4]"),
                                      HasSubstr("hold 12 of 16 elements")));
  status = Build({{Chunk("v", {0}, {3}, {8})}, {Chunk("v", {5}, {3}, {8})}})
               .status();
  EXPECT_THAT(status.message(),
              HasSubstr("no chunk holds index 3 of dimension 0"));
}

TEST(GlobalSavePlanTest, ValidGridAndZeroSizeChunks) {
  std::vector<std::vector<WriteItem>> items(1);
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) {
      items[0].push_back(
          Chunk("g", {i * 2, j * 3}, {2, j == 2 ? 1 : 3}, {6, 7}));
    }
  }
  items[0].push_back(Chunk("g", {6, 0}, {0, 7}, {6, 7}));
  items[0].push_back(Chunk("z", {0, 0}, {0, 5}, {0, 5}));
  items[0].push_back(Chunk("s", {}, {}, {}));
  absl::StatusOr<GlobalSavePlan> plan = Build(items);
  ASSERT_TRUE(plan.ok()) << plan.status();
}

TEST(GlobalSavePlanTest, RanksDisagree) {
  absl::Status status =
      Build({{Whole("w", {4}, DType::kF32)}, {Whole("w", {4}, DType::kBF16)}})
          .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("\"w\": rank 0 saves it with dtype F32"),
                    HasSubstr("rank 1 with dtype BF16")));
  status = Build({{Chunk("w", {0}, {2}, {4})}, {Chunk("w", {2}, {2}, {5})}})
               .status();
  EXPECT_THAT(status.message(), HasSubstr("global shape [4] but rank 1 with "
                                          "global shape [5]"));
  status = Build({{Chunk("w", {0}, {2}, {4})}, {Chunk("w", {0}, {3}, {4})}})
               .status();
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("rank 0 saves the chunk at offsets [0] with "
                              "sizes [2] but rank 1 with sizes [3]")));
  status = Build({{Value("w", 3)}, {Whole("w", {4})}}).status();
  EXPECT_THAT(status.message(), HasSubstr("kind a non-tensor value"));
}

TEST(GlobalSavePlanTest, FlattenMappingsMergeAndConflict) {
  std::vector<SavePlan> plans(2);
  plans[0].items = {Value("a.b", 1), Value("l.0", 1)};
  plans[1].items = {Value("a.b", 1), Value("l.0", 1)};
  const FlattenMapping full = {{"a.b", {"a", "b"}},
                               {"l.0", {"l", int64_t{0}}},
                               {"k.v", {"k.v"}}};  // A leaf without items.
  std::vector<SavePlannerData> data(2);
  SetCompactMapping(plans[0].items, full, &data[0]);
  EXPECT_EQ(data[0].list_masks, (std::vector<uint64_t>{0, 2}));
  EXPECT_EQ(data[0].mapping.size(), 1u);
  SetCompactMapping(plans[1].items, full, &data[1]);
  absl::StatusOr<GlobalSavePlan> plan =
      BuildGlobalSavePlan(plans, data, DedupPolicy::kBalanceBytes);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->metadata.flatten_mapping, full);
  // Rank 1 sends a full (uncompacted) mapping: same result.
  data[1] = SavePlannerData{};
  data[1].mapping = full;
  plan = BuildGlobalSavePlan(plans, data, DedupPolicy::kBalanceBytes);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->metadata.flatten_mapping, full);
  // Rank 1 disagrees on a path.
  data[1].mapping["a.b"] = {"a.b"};
  EXPECT_THAT(
      BuildGlobalSavePlan(plans, data, DedupPolicy::kBalanceBytes)
          .status()
          .message(),
      HasSubstr("\"a.b\": rank 0 flattens it from path [\"a\", \"b\"] but "
                "rank 1 from a different path [\"a.b\"]"));
  SetCompactMapping(plans[1].items, {{"a.b", {"a", "b"}}, {"l.0", {"l", "0"}}},
                    &data[1]);
  EXPECT_THAT(BuildGlobalSavePlan(plans, data, DedupPolicy::kBalanceBytes)
                  .status()
                  .message(),
              HasSubstr("\"l.0\": rank 0 flattens it from path [\"l\", 0] but "
                        "rank 1 from a different path [\"l\", \"0\"]"));
}

// A module's state dict under one key ("model" -> "layers.0.w") travels as
// masks, not as explicit paths, and comes back whole in the metadata.
TEST(GlobalSavePlanTest, DottedKeysTravelAsMasks) {
  std::vector<SavePlan> plans(2);
  plans[0].items = {Value("m.l.0.w", 1), Value("m.l.1.w", 1), Value("s", 1)};
  plans[1].items = plans[0].items;
  const FlattenMapping full = {{"m.l.0.w", {"m", "l.0.w"}},
                               {"m.l.1.w", {"m", "l.1.w"}},
                               {"s", {"s"}},
                               {"x.y", {"x.y"}}};  // A leaf without items.
  std::vector<SavePlannerData> data(2);
  SetCompactMapping(plans[0].items, full, &data[0]);
  EXPECT_EQ(data[0].list_masks, (std::vector<uint64_t>{0, 0, 0}));
  EXPECT_EQ(data[0].joined_masks, (std::vector<uint64_t>{6, 6, 0}));
  EXPECT_EQ(data[0].mapping, (FlattenMapping{{"x.y", {"x.y"}}}));
  // Out of name order: the same data.
  std::vector<WriteItem> reversed(plans[0].items.rbegin(),
                                  plans[0].items.rend());
  SavePlannerData unordered;
  SetCompactMapping(reversed, full, &unordered);
  EXPECT_EQ(unordered.list_masks, (std::vector<uint64_t>{0, 0, 0}));
  EXPECT_EQ(unordered.joined_masks, (std::vector<uint64_t>{0, 6, 6}));
  EXPECT_EQ(unordered.mapping, data[0].mapping);
  // Rank 1 sends explicit paths: the same metadata.
  data[1].mapping = full;
  absl::StatusOr<GlobalSavePlan> plan =
      BuildGlobalSavePlan(plans, data, DedupPolicy::kBalanceBytes);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->metadata.flatten_mapping, full);
  // Rank 1 splits one name elsewhere.
  data[1].mapping["m.l.1.w"] = {"m", "l", int64_t{1}, "w"};
  EXPECT_THAT(BuildGlobalSavePlan(plans, data, DedupPolicy::kBalanceBytes)
                  .status()
                  .message(),
              HasSubstr("\"m.l.1.w\": rank 0 flattens it from path [\"m\", "
                        "\"l.1.w\"] but rank 1 from a different path [\"m\", "
                        "\"l\", 1, \"w\"]"));
  // Masks for both ranks that disagree.
  SetCompactMapping(plans[1].items, full, &data[1]);
  data[1].joined_masks[1] = 2;
  EXPECT_THAT(BuildGlobalSavePlan(plans, data, DedupPolicy::kBalanceBytes)
                  .status()
                  .message(),
              HasSubstr("from a different path [\"m\", \"l.1\", \"w\"]"));
}

}  // namespace
}  // namespace dcp
