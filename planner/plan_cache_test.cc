#include "planner/plan_cache.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/default_planner.h"
#include "planner/in_memory_checkpoint.h"

namespace dcp {
namespace {

using ::testing::HasSubstr;

constexpr int kRanks = 8;

Tensor Filled(DType dtype, Shape sizes, uint8_t byte) {
  Tensor t = Tensor::Empty(dtype, std::move(sizes));
  std::memset(t.data(), byte, t.nbytes());
  return t;
}

// Rank r's state: a replicated tensor, a row shard, a replicated value.
StateDict RankState(int r, DType dtype, const std::string& prefix,
                    int64_t rows_per_rank = 2) {
  std::vector<Shard> shards = {
      {{r * rows_per_rank, 0}, Filled(dtype, {rows_per_rank, 3}, r)}};
  return StateDict{
      {prefix, StateDict{{"bias", Filled(dtype, {5}, 0xb)},
                         {"w", ShardedTensor(dtype, {kRanks * rows_per_rank, 3},
                                             std::move(shards))},
                         {"step", int64_t{1}}}}};
}

class PlanCacheTest : public ::testing::Test {
 protected:
  PlanCacheTest() {
    for (int r = 0; r < kRanks; ++r) {
      caches_.push_back(std::make_shared<SavePlanCache>(4));
    }
  }

  absl::StatusOr<InMemoryCheckpoint> Save(DType dtype,
                                          const std::string& prefix,
                                          int64_t rows = 2) {
    std::vector<StateDict> states;
    for (int r = 0; r < kRanks; ++r)
      states.push_back(RankState(r, dtype, prefix, rows));
    std::vector<std::unique_ptr<DefaultSavePlanner>> planners;
    std::vector<const StateDict*> sds;
    std::vector<SavePlanner*> ps;
    for (int r = 0; r < kRanks; ++r) {
      planners.push_back(
          std::make_unique<DefaultSavePlanner>(DefaultSavePlannerOptions{
              .enable_plan_caching = true, .plan_cache = caches_[r]}));
      sds.push_back(&states[r]);
      ps.push_back(planners.back().get());
    }
    return SaveInMemory(sds, ps);
  }

  static int Markers(const std::vector<SavePlan>& plans) {
    int n = 0;
    for (const SavePlan& p : plans) n += IsUnchangedSavePlan(p) ? 1 : 0;
    return n;
  }

  std::vector<std::shared_ptr<SavePlanCache>> caches_;
};

void ExpectSameCheckpoint(const InMemoryCheckpoint& a,
                          const InMemoryCheckpoint& b) {
  EXPECT_EQ(a.items, b.items);
  ASSERT_EQ(a.written.size(), b.written.size());
  for (size_t r = 0; r < a.written.size(); ++r) {
    ASSERT_EQ(a.written[r].size(), b.written[r].size()) << "rank " << r;
    for (size_t i = 0; i < a.written[r].size(); ++i) {
      EXPECT_EQ(a.written[r][i].index, b.written[r][i].index);
      EXPECT_EQ(a.written[r][i].index.index, b.written[r][i].index.index);
    }
  }
  EXPECT_EQ(a.metadata.state_dict_metadata.size(),
            b.metadata.state_dict_metadata.size());
  EXPECT_EQ(a.metadata.flatten_mapping, b.metadata.flatten_mapping);
}

TEST_F(PlanCacheTest, UnchangedPlansTravelAsMarkers) {
  absl::StatusOr<InMemoryCheckpoint> first = Save(DType::kF32, "model");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(Markers(first->local_plans), 0);
  EXPECT_EQ(Markers(first->central_plans), 0);

  absl::StatusOr<InMemoryCheckpoint> second = Save(DType::kF32, "model");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(Markers(second->local_plans), kRanks);
  EXPECT_EQ(Markers(second->central_plans), kRanks);
  for (const SavePlan& p : second->local_plans) {
    EXPECT_TRUE(p.items.empty());
    EXPECT_LT(p.planner_data.size(), 64u);
  }
  ExpectSameCheckpoint(*first, *second);
}

TEST_F(PlanCacheTest, DTypeChangeInvalidatesTheCache) {
  ASSERT_TRUE(Save(DType::kF32, "model").ok());
  absl::StatusOr<InMemoryCheckpoint> bf16 = Save(DType::kBF16, "model");
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(Markers(bf16->local_plans), 0);
  EXPECT_EQ(Markers(bf16->central_plans), 0);
  const auto& w = std::get<TensorStorageMetadata>(
      bf16->metadata.state_dict_metadata.at("model.w"));
  EXPECT_EQ(w.properties.dtype, DType::kBF16);
  EXPECT_EQ(bf16->items.at(MetadataIndex("model.bias", Shape{0})).size(), 10u);
}

TEST_F(PlanCacheTest, ShapeChangeInvalidatesTheCache) {
  ASSERT_TRUE(Save(DType::kF32, "model", 2).ok());
  absl::StatusOr<InMemoryCheckpoint> wider = Save(DType::kF32, "model", 3);
  ASSERT_TRUE(wider.ok()) << wider.status();
  EXPECT_EQ(Markers(wider->local_plans), 0);
  const auto& w = std::get<TensorStorageMetadata>(
      wider->metadata.state_dict_metadata.at("model.w"));
  EXPECT_EQ(w.size, (Shape{kRanks * 3, 3}));
}

TEST_F(PlanCacheTest, AlternatingStateDictsKeepBothCaches) {
  absl::StatusOr<InMemoryCheckpoint> model = Save(DType::kF32, "model");
  absl::StatusOr<InMemoryCheckpoint> optim = Save(DType::kF32, "optim");
  ASSERT_TRUE(model.ok() && optim.ok());
  for (int round = 0; round < 2; ++round) {
    absl::StatusOr<InMemoryCheckpoint> m = Save(DType::kF32, "model");
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(Markers(m->local_plans), kRanks);
    EXPECT_EQ(Markers(m->central_plans), kRanks);
    ExpectSameCheckpoint(*model, *m);
    absl::StatusOr<InMemoryCheckpoint> o = Save(DType::kF32, "optim");
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_EQ(Markers(o->local_plans), kRanks);
    ExpectSameCheckpoint(*optim, *o);
  }
}

TEST_F(PlanCacheTest, OneRankChangingReplansEveryone) {
  ASSERT_TRUE(Save(DType::kF32, "model").ok());
  // Rank 3 adds a value: its plan is new, the others stay markers, and the
  // result matches an uncached save.
  std::vector<StateDict> states;
  for (int r = 0; r < kRanks; ++r)
    states.push_back(RankState(r, DType::kF32, "model"));
  states[3]["extra"] = int64_t{42};
  std::vector<std::unique_ptr<DefaultSavePlanner>> cached, plain;
  std::vector<const StateDict*> sds;
  std::vector<SavePlanner*> cached_ps, plain_ps;
  for (int r = 0; r < kRanks; ++r) {
    cached.push_back(
        std::make_unique<DefaultSavePlanner>(DefaultSavePlannerOptions{
            .enable_plan_caching = true, .plan_cache = caches_[r]}));
    plain.push_back(std::make_unique<DefaultSavePlanner>());
    sds.push_back(&states[r]);
    cached_ps.push_back(cached.back().get());
    plain_ps.push_back(plain.back().get());
  }
  absl::StatusOr<InMemoryCheckpoint> got = SaveInMemory(sds, cached_ps);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(Markers(got->local_plans), kRanks - 1);
  EXPECT_FALSE(IsUnchangedSavePlan(got->local_plans[3]));
  absl::StatusOr<InMemoryCheckpoint> want = SaveInMemory(sds, plain_ps);
  ASSERT_TRUE(want.ok());
  ExpectSameCheckpoint(*want, *got);
  EXPECT_TRUE(got->metadata.state_dict_metadata.contains("extra"));
}

TEST_F(PlanCacheTest, CoordinatorWithoutCacheRefusesMarkers) {
  ASSERT_TRUE(Save(DType::kF32, "model").ok());
  caches_[0] = std::make_shared<SavePlanCache>(4);  // Coordinator restarted.
  absl::Status status = Save(DType::kF32, "model").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(),
              HasSubstr("rank 1 sent an unchanged-plan marker"));
}

// Every rank plans `dtype` state with its own caching planner (rank 0
// coordinates) under `save_id`; the coordinator's CreateSharedGlobalPlan, or
// CreateGlobalPlan with `by_value`; every rank finishes its plan.
class SharedMetadataTest : public PlanCacheTest {
 protected:
  struct Round {
    std::vector<SavePlan> local;
    SharedGlobalSavePlan global;
  };

  Round Plan(DType dtype, const std::string& save_id, bool by_value = false) {
    if (planners_.empty()) {
      for (int r = 0; r < kRanks; ++r) {
        planners_.push_back(
            std::make_unique<DefaultSavePlanner>(DefaultSavePlannerOptions{
                .enable_plan_caching = true, .plan_cache = caches_[r]}));
      }
    }
    states_.clear();
    for (int r = 0; r < kRanks; ++r) {
      states_.push_back(RankState(r, dtype, "model"));
    }
    Round round;
    StorageMeta meta;
    meta.save_id = save_id;
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_TRUE(planners_[r]->SetUp(states_[r], meta, r == 0).ok());
      round.local.push_back(*planners_[r]->CreateLocalPlan());
    }
    if (by_value) {
      auto global = planners_[0]->CreateGlobalPlan(round.local);
      EXPECT_TRUE(global.ok()) << global.status();
      round.global.plans = std::move(global->first);
      round.global.metadata =
          std::make_shared<Metadata>(std::move(global->second));
    } else {
      auto global = planners_[0]->CreateSharedGlobalPlan(round.local);
      EXPECT_TRUE(global.ok()) << global.status();
      round.global = *std::move(global);
    }
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_TRUE(planners_[r]->FinishPlan(round.global.plans[r]).ok());
    }
    return round;
  }

  // The metadata without its storage_meta (the layout).
  static Metadata Layout(const Metadata& metadata) {
    Metadata copy = metadata;
    copy.storage_meta.reset();
    return copy;
  }

  std::vector<std::unique_ptr<DefaultSavePlanner>> planners_;
  std::vector<StateDict> states_;
};

TEST_F(SharedMetadataTest, SameMetadataAsTheCopyingPath) {
  // Uncached: both entry points of a fresh planner agree.
  std::vector<SavePlan> local;
  for (int r = 0; r < kRanks; ++r) {
    StateDict state = RankState(r, DType::kF32, "model");
    DefaultSavePlanner planner;
    ASSERT_TRUE(planner.SetUp(state, {}, r == 0).ok());
    local.push_back(*planner.CreateLocalPlan());
  }
  DefaultSavePlanner by_value;
  DefaultSavePlanner shared;
  auto a = by_value.CreateGlobalPlan(local);
  auto b = shared.CreateSharedGlobalPlan(local);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(a->second == *b->metadata);
  ASSERT_EQ(a->first.size(), b->plans.size());
  for (size_t r = 0; r < b->plans.size(); ++r) {
    EXPECT_EQ(EncodeSavePlan(a->first[r]), EncodeSavePlan(b->plans[r]));
  }

  // Cached: a re-plan from markers hands out the same layout, with the
  // current save's storage_meta, as the copying path does.
  Round first = Plan(DType::kF32, "s1");
  EXPECT_EQ(Markers(first.local), 0);
  EXPECT_TRUE(Layout(*first.global.metadata) == Layout(a->second));
  Round second = Plan(DType::kF32, "s2");
  EXPECT_EQ(Markers(second.local), kRanks);
  EXPECT_EQ(Markers(second.global.plans), kRanks);
  EXPECT_EQ(second.global.metadata->storage_meta->save_id, "s2");
  EXPECT_TRUE(Layout(*second.global.metadata) ==
              Layout(*first.global.metadata));
  Round copied = Plan(DType::kF32, "s3", /*by_value=*/true);
  EXPECT_EQ(Markers(copied.local), kRanks);
  Round shared_again = Plan(DType::kF32, "s3");
  EXPECT_TRUE(*copied.global.metadata == *shared_again.global.metadata);
}

TEST_F(SharedMetadataTest, HeldMetadataNeverChanges) {
  Round first = Plan(DType::kF32, "s1");
  const Metadata layout = Layout(*first.global.metadata);
  // `first` still holds its metadata: the next save gets a copy.
  Round second = Plan(DType::kF32, "s2");
  EXPECT_NE(second.global.metadata.get(), first.global.metadata.get());
  EXPECT_EQ(first.global.metadata->storage_meta->save_id, "s1");
  EXPECT_EQ(second.global.metadata->storage_meta->save_id, "s2");
  // Once released, the cached metadata itself is handed out again.
  const Metadata* cached = second.global.metadata.get();
  second = {};
  Round third = Plan(DType::kF32, "s3");
  EXPECT_EQ(Markers(third.local), kRanks);
  EXPECT_EQ(third.global.metadata.get(), cached);
  EXPECT_EQ(third.global.metadata->storage_meta->save_id, "s3");
  EXPECT_TRUE(Layout(*third.global.metadata) == layout);
  EXPECT_EQ(first.global.metadata->storage_meta->save_id, "s1");
}

TEST_F(SharedMetadataTest, DTypeChangeInvalidatesTheSharedMetadata) {
  Round f32 = Plan(DType::kF32, "s1");
  const Metadata* cached = f32.global.metadata.get();
  f32 = {};
  // Same element size, other dtype: not a cache hit.
  Round i32 = Plan(DType::kI32, "s2");
  EXPECT_EQ(Markers(i32.local), 0);
  EXPECT_EQ(Markers(i32.global.plans), 0);
  EXPECT_NE(i32.global.metadata.get(), cached);
  for (const char* name : {"model.bias", "model.w"}) {
    EXPECT_EQ(std::get<TensorStorageMetadata>(
                  i32.global.metadata->state_dict_metadata.at(name))
                  .properties.dtype,
              DType::kI32)
        << name;
  }
}

TEST(PlanDigestTest, EveryFieldChangesTheDigest) {
  WriteItem item;
  item.index = MetadataIndex("t", Shape{0, 0});
  item.type = WriteItemType::kShard;
  item.tensor_data = TensorWriteData{{{0, 0}, {2, 2}}, {DType::kF32}, {4, 2}};
  const PlanDigest base = DigestSavePlan({item}, {});
  std::vector<WriteItem> variants(8, item);
  variants[0].index.fqn = "u";
  variants[1].index.offset = Shape{0, 1};
  variants[2].type = WriteItemType::kTensor;
  variants[3].tensor_data->chunk.sizes = {2, 1};
  variants[4].tensor_data->properties.dtype = DType::kI32;
  variants[5].tensor_data->size = {4, 3};
  variants[6].tensor_data->chunk.offsets = {1, 0};
  variants[7].bytes_io_data = BytesIOWriteData{0};
  for (size_t i = 0; i < variants.size(); ++i) {
    EXPECT_NE(DigestSavePlan({variants[i]}, {}), base) << i;
  }
  EXPECT_NE(DigestSavePlan({item}, {{"t", {"t"}}}), base);
  const PlanDigest unheld = DigestSavePlan({item}, {}, {{"v", Shape{4}}});
  EXPECT_NE(unheld, base);
  EXPECT_NE(DigestSavePlan({item}, {}, {{"v", Shape{5}}}), unheld);
  EXPECT_NE(DigestSavePlan({item}, {}, {{"x", Shape{4}}}), unheld);
  EXPECT_EQ(DigestSavePlan({item}, {}), base);
}

}  // namespace
}  // namespace dcp
