#include "planner/default_planner.h"

#include <cmath>
#include <cstring>
#include <random>

#include "core/dtype_convert.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/in_memory_checkpoint.h"
#include "planner/value_codec.h"

namespace dcp {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

Tensor RandomTensor(DType dtype, Shape sizes, uint64_t seed) {
  Tensor t = Tensor::Empty(dtype, std::move(sizes));
  std::mt19937_64 rng(seed);
  auto* p = static_cast<unsigned char*>(t.data());
  for (size_t i = 0; i < t.nbytes(); ++i)
    p[i] = static_cast<unsigned char>(rng());
  return t;
}

// The chunk [offsets, offsets + sizes) of a contiguous host tensor, copied.
Tensor Slice(const Tensor& full, const Shape& offsets, const Shape& sizes) {
  Tensor out = Tensor::Empty(full.dtype(), sizes);
  const Shape zeros(sizes.size(), 0);
  CopyBox(static_cast<const char*>(full.data()), full.sizes(), offsets,
          out.view(), zeros, sizes);
  return out;
}

ShardedTensor Shards(const Tensor& full,
                     const std::vector<std::pair<Shape, Shape>>& boxes) {
  std::vector<Shard> shards;
  for (const auto& [offsets, sizes] : boxes) {
    shards.push_back({offsets, Slice(full, offsets, sizes)});
  }
  return ShardedTensor(full.dtype(), full.sizes(), std::move(shards));
}

ShardedTensor EmptyShards(DType dtype, const Shape& global,
                          const std::vector<std::pair<Shape, Shape>>& boxes) {
  std::vector<Shard> shards;
  for (const auto& [offsets, sizes] : boxes) {
    shards.push_back({offsets, Tensor::Empty(dtype, sizes)});
  }
  return ShardedTensor(dtype, global, std::move(shards));
}

absl::StatusOr<InMemoryCheckpoint> SaveOne(const StateDict& sd,
                                           DefaultSavePlannerOptions o = {}) {
  DefaultSavePlanner planner(o);
  return SaveInMemory({&sd}, {&planner});
}

absl::Status LoadOne(const InMemoryCheckpoint& ckpt, StateDict& sd,
                     DefaultLoadPlannerOptions o = {}) {
  DefaultLoadPlanner planner(o);
  return LoadFromMemory(ckpt, {&sd}, {&planner});
}

TEST(DefaultPlannerTest, EveryDTypeRoundTrips) {
  StateDict saved;
  StateDict loaded;
  for (int code = 0; code < kNumDTypes; ++code) {
    const DType dtype = *DTypeFromCode(code);
    const std::string name(DTypeName(dtype));
    saved[name] = RandomTensor(dtype, {3, 5}, code);
    loaded[name] = Tensor::Empty(dtype, {3, 5});
  }
  absl::StatusOr<InMemoryCheckpoint> ckpt = SaveOne(saved);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ASSERT_TRUE(LoadOne(*ckpt, loaded).ok());
  for (const auto& [name, value] : saved) {
    EXPECT_TRUE(value.tensor().BytesEqual(loaded[name].tensor())) << name;
    const auto& meta = std::get<TensorStorageMetadata>(
        ckpt->metadata.state_dict_metadata.at(name));
    EXPECT_EQ(DTypeName(meta.properties.dtype), name);
  }
  EXPECT_EQ(ckpt->metadata.version, kFormatVersion);
  EXPECT_EQ(ckpt->metadata.storage_meta->checkpoint_id, "memory");
}

TEST(DefaultPlannerTest, ScalarAndZeroSizeTensors) {
  StateDict saved{{"scalar", RandomTensor(DType::kF64, {}, 1)},
                  {"empty", Tensor::Empty(DType::kF32, {4, 0, 3})},
                  {"empty1d", Tensor::Empty(DType::kI8, {0})}};
  StateDict loaded{{"scalar", Tensor::Empty(DType::kF64, {})},
                   {"empty", Tensor::Empty(DType::kF32, {4, 0, 3})},
                   {"empty1d", Tensor::Empty(DType::kI8, {0})}};
  absl::StatusOr<InMemoryCheckpoint> ckpt = SaveOne(saved);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ASSERT_TRUE(LoadOne(*ckpt, loaded).ok());
  EXPECT_TRUE(saved["scalar"].tensor().BytesEqual(loaded["scalar"].tensor()));
  EXPECT_EQ(ckpt->items.at(MetadataIndex("scalar", Shape{})).size(), 8u);
  EXPECT_EQ(ckpt->items.at(MetadataIndex("empty", Shape{0, 0, 0})).size(), 0u);
}

TEST(DefaultPlannerTest, LocalPlanItemsAndMetadata) {
  Tensor full = RandomTensor(DType::kF32, {4, 6}, 3);
  StateDict sd{{"w", RandomTensor(DType::kBF16, {2, 3}, 2)},
               {"st", Shards(full, {{{0, 0}, {4, 2}}, {{0, 2}, {4, 4}}})},
               {"step", int64_t{7}}};
  DefaultSavePlanner planner;
  ASSERT_TRUE(planner.SetUp(sd, StorageMeta{}, true).ok());
  absl::StatusOr<SavePlan> plan = planner.CreateLocalPlan();
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->items.size(), 4u);
  // Sorted by name: st (two shards), step, w.
  EXPECT_EQ(plan->items[0].type, WriteItemType::kShard);
  EXPECT_EQ(plan->items[0].index, MetadataIndex("st", Shape{0, 0}));
  EXPECT_EQ(plan->items[1].index, MetadataIndex("st", Shape{0, 2}));
  EXPECT_EQ(plan->items[1].tensor_data->chunk.sizes, (Shape{4, 4}));
  EXPECT_EQ(plan->items[1].tensor_data->size, (Shape{4, 6}));
  EXPECT_EQ(plan->items[2].type, WriteItemType::kBytesIO);
  EXPECT_EQ(plan->items[2].bytes_io_data->nbytes, 9);
  EXPECT_EQ(plan->items[3].type, WriteItemType::kTensor);
  EXPECT_EQ(plan->items[3].index, MetadataIndex("w", Shape{0, 0}));
  EXPECT_EQ(plan->items[3].StorageBytes(), 12);

  auto global = planner.CreateGlobalPlan({*plan});
  ASSERT_TRUE(global.ok()) << global.status();
  const Metadata& md = global->second;
  ASSERT_EQ(md.state_dict_metadata.size(), 3u);
  const auto& st =
      std::get<TensorStorageMetadata>(md.state_dict_metadata.at("st"));
  ASSERT_EQ(st.chunks.size(), 2u);
  EXPECT_EQ(st.chunks[1].offsets, (Shape{0, 2}));
  EXPECT_TRUE(std::holds_alternative<BytesStorageMetadata>(
      md.state_dict_metadata.at("step")));
  EXPECT_EQ(global->first[0].items[1].index.index, 1);

  absl::StatusOr<WriteValue> step = planner.ResolveData(plan->items[2]);
  ASSERT_TRUE(step.ok());
  EXPECT_EQ(std::get<std::string>(*step), *EncodeValue(StateValue(int64_t{7})));
  absl::StatusOr<WriteValue> shard = planner.ResolveData(plan->items[1]);
  ASSERT_TRUE(shard.ok());
  EXPECT_TRUE(std::get<Tensor>(*shard).BytesEqual(
      sd["st"].sharded_tensor().local_shards()[1].tensor));
  WriteItem unknown = plan->items[3];
  unknown.index.fqn = "nope";
  EXPECT_EQ(planner.ResolveData(unknown).status().code(),
            absl::StatusCode::kNotFound);
  // Chunks this rank did not plan: a tensor at another offset, a shard at
  // none of the local shards' offsets.
  WriteItem moved = plan->items[3];
  moved.index.offset = Shape{0, 1};
  EXPECT_EQ(planner.ResolveData(moved).status().code(),
            absl::StatusCode::kNotFound);
  WriteItem other_shard = plan->items[1];
  other_shard.index.offset = Shape{0, 4};
  absl::Status status = planner.ResolveData(other_shard).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("st@[0, 4]"));
}

TEST(DefaultPlannerTest, TwoLocalShardsAtOneOffsetAreRefused) {
  Tensor full = RandomTensor(DType::kF32, {4, 6}, 3);
  StateDict sd{{"st", Shards(full, {{{0, 2}, {4, 4}}, {{0, 2}, {4, 4}}})}};
  DefaultSavePlannerOptions options;
  DefaultSavePlanner planner(options);
  absl::Status status = planner.SetUp(sd, StorageMeta{}, true);
  if (status.ok()) status = planner.CreateLocalPlan().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
}

// What no reader takes is refused at the save, naming it: a name holding a
// NUL byte, a tensor of more than kMaxTensorDims dimensions.
TEST(DefaultPlannerTest, NulNamesAndTooManyDimensionsAreRefused) {
  const std::string nul("w\0x", 3);
  for (const auto& [sd, expected] :
       {std::pair<StateDict, std::string>{{{nul, int64_t{1}}}, "w\\x00x"},
        {{{"wide", Tensor::Empty(DType::kF32, Shape(kMaxTensorDims + 1, 1))}},
         "\"wide\" has 65 dimensions"}}) {
    DefaultSavePlanner planner;
    absl::Status status = planner.SetUp(sd, StorageMeta{}, true);
    if (status.ok()) status = planner.CreateLocalPlan().status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), HasSubstr(expected));
  }
  StateDict widest{{"w", Tensor::Empty(DType::kF32, Shape(kMaxTensorDims, 1))}};
  DefaultSavePlanner planner;
  ASSERT_TRUE(planner.SetUp(widest, StorageMeta{}, true).ok());
  EXPECT_TRUE(planner.CreateLocalPlan().ok());
}

// A destination whose elements share memory (stride 0, an expanded view)
// is refused by name: a load would put several saved elements in one place.
// Transposed and padded views are loaded.
TEST(DefaultPlannerTest, DestinationsWhoseElementsShareMemoryAreRefused) {
  StateDict saved{{"w", RandomTensor(DType::kF32, {4, 3}, 9)}};
  absl::StatusOr<InMemoryCheckpoint> ckpt = SaveOne(saved);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  std::vector<float> memory(64, 0.0f);
  StateDict expanded{{"w", Tensor::Wrap(TensorView(memory.data(), DType::kF32,
                                                   {4, 3}, {0, 1}, Device{}))}};
  absl::Status status = LoadOne(*ckpt, expanded);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("\"w\""), HasSubstr("share memory"),
                    HasSubstr("strides [0, 1]")));
  StateDict padded{{"w", Tensor::Wrap(TensorView(memory.data(), DType::kF32,
                                                 {4, 3}, {1, 5}, Device{}))}};
  ASSERT_TRUE(LoadOne(*ckpt, padded).ok());
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t c = 0; c < 3; ++c) {
      EXPECT_EQ(memory[r + 5 * c], static_cast<const float*>(
                                       saved["w"].tensor().data())[r * 3 + c]);
    }
  }
}

TEST(DefaultPlannerTest, NonContiguousHostTensorIsCopiedContiguous) {
  Tensor base = RandomTensor(DType::kI32, {3, 4}, 5);
  // The transpose: sizes [4, 3], strides [1, 4].
  Tensor transposed = Tensor::WithOwner(
      TensorView(base.data(), DType::kI32, {4, 3}, {1, 4}, Device{}), nullptr);
  StateDict sd{{"t", transposed}};
  absl::StatusOr<InMemoryCheckpoint> ckpt = SaveOne(sd);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const std::string& bytes = ckpt->items.at(MetadataIndex("t", Shape{0, 0}));
  ASSERT_EQ(bytes.size(), 48u);
  const auto* src = static_cast<const int32_t*>(base.data());
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 3; ++j) {
      int32_t v;
      std::memcpy(&v, bytes.data() + (i * 3 + j) * 4, 4);
      EXPECT_EQ(v, src[j * 4 + i]);
    }
  }
  // And loads back into a strided destination.
  Tensor dest_base = Tensor::Empty(DType::kI32, {3, 4});
  StateDict loaded{
      {"t", Tensor::WithOwner(TensorView(dest_base.data(), DType::kI32, {4, 3},
                                         {1, 4}, Device{}),
                              nullptr)}};
  ASSERT_TRUE(LoadOne(*ckpt, loaded).ok());
  EXPECT_TRUE(dest_base.BytesEqual(base));
}

TEST(DefaultPlannerTest, NestedStateDictAndValuesRoundTrip) {
  StateDict saved{
      {"model", StateDict{{"layer.0", RandomTensor(DType::kF16, {8}, 9)},
                          {"bias", RandomTensor(DType::kF32, {2}, 10)}}},
      {"optim",
       StateDict{
           {"state", StateList{StateDict{
                         {"step", int64_t{12}},
                         {"exp_avg", RandomTensor(DType::kF32, {2}, 11)}}}},
           {"lr", 0.125},
           {"amsgrad", true},
           {"name", "adam"},
           {"blob", Bytes{std::string("\0\1\2", 3)}},
           {"none", StateValue()}}}};
  StateDict loaded{
      {"model", StateDict{{"layer.0", Tensor::Empty(DType::kF16, {8})},
                          {"bias", Tensor::Empty(DType::kF32, {2})}}},
      {"optim",
       StateDict{{"state", StateList{StateDict{
                               {"step", int64_t{0}},
                               {"exp_avg", Tensor::Empty(DType::kF32, {2})}}}},
                 {"lr", 0.0},
                 {"amsgrad", false},
                 {"name", ""},
                 {"blob", Bytes{}},
                 {"none", int64_t{5}}}}};
  absl::StatusOr<InMemoryCheckpoint> ckpt = SaveOne(saved);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  // The key with a dot keeps its path in the mapping.
  const ObjectPath& path = ckpt->metadata.flatten_mapping.at("model.layer.0");
  ASSERT_EQ(path.size(), 2u);
  EXPECT_EQ(std::get<std::string>(path[1]), "layer.0");
  const ObjectPath& list_path =
      ckpt->metadata.flatten_mapping.at("optim.state.0.step");
  EXPECT_EQ(std::get<int64_t>(list_path[2]), 0);

  ASSERT_TRUE(LoadOne(*ckpt, loaded).ok());
  const StateDict& optim = loaded["optim"].dict();
  EXPECT_EQ(optim.at("state").list()[0].dict().at("step").int_value(), 12);
  EXPECT_EQ(optim.at("lr").double_value(), 0.125);
  EXPECT_TRUE(optim.at("amsgrad").bool_value());
  EXPECT_EQ(optim.at("name").string_value(), "adam");
  EXPECT_EQ(optim.at("blob").bytes_value().data, std::string("\0\1\2", 3));
  EXPECT_EQ(optim.at("none").kind(), StateValue::Kind::kNone);
  EXPECT_TRUE(loaded["model"].dict().at("layer.0").tensor().BytesEqual(
      saved["model"].dict().at("layer.0").tensor()));
  EXPECT_TRUE(
      optim.at("state").list()[0].dict().at("exp_avg").tensor().BytesEqual(
          saved["optim"]
              .dict()
              .at("state")
              .list()[0]
              .dict()
              .at("exp_avg")
              .tensor()));
}

TEST(DefaultPlannerTest, WithoutFlatteningNestingIsRejected) {
  StateDict sd{{"a", StateDict{{"b", int64_t{1}}}}};
  DefaultSavePlanner planner({.flatten_state_dict = false});
  absl::Status status = planner.SetUp(sd, StorageMeta{}, true);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("flatten_state_dict"));
  StateDict flat{{"a", int64_t{1}}, {"t", RandomTensor(DType::kU8, {3}, 1)}};
  absl::StatusOr<InMemoryCheckpoint> ckpt =
      SaveOne(flat, {.flatten_state_dict = false});
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_TRUE(ckpt->metadata.flatten_mapping.empty());
  StateDict loaded{{"a", int64_t{0}}, {"t", Tensor::Empty(DType::kU8, {3})}};
  ASSERT_TRUE(LoadOne(*ckpt, loaded, {.flatten_state_dict = false}).ok());
  EXPECT_EQ(loaded["a"].int_value(), 1);
}

// Saved 1-d [0, 4) and [4, 10); requested [2, 7) gives two boxes with
// offsets relative to each chunk.
TEST(DefaultPlannerTest, ReadItemOffsetsAreRelativeToChunks) {
  Tensor full = RandomTensor(DType::kI16, {10}, 4);
  StateDict s0{{"x", Shards(full, {{{0}, {4}}})}};
  StateDict s1{{"x", Shards(full, {{{4}, {6}}})}};
  DefaultSavePlanner p0, p1;
  absl::StatusOr<InMemoryCheckpoint> ckpt =
      SaveInMemory({&s0, &s1}, {&p0, &p1});
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();

  StateDict dest{{"x", EmptyShards(DType::kI16, {10}, {{{2}, {5}}})}};
  DefaultLoadPlanner planner;
  ASSERT_TRUE(planner.SetUp(&dest, ckpt->metadata, true).ok());
  absl::StatusOr<LoadPlan> plan = planner.CreateLocalPlan();
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->items.size(), 2u);
  const ReadItem& a = plan->items[0];
  EXPECT_EQ(a.dest_index, MetadataIndex("x", Shape{2}));
  EXPECT_EQ(a.storage_index, MetadataIndex("x", Shape{0}));
  EXPECT_EQ(a.storage_index.index, 0);
  EXPECT_THAT(a.dest_offsets, ElementsAre(0));
  EXPECT_THAT(a.storage_offsets, ElementsAre(2));
  EXPECT_THAT(a.lengths, ElementsAre(2));
  const ReadItem& b = plan->items[1];
  EXPECT_EQ(b.storage_index, MetadataIndex("x", Shape{4}));
  EXPECT_EQ(b.storage_index.index, 1);
  EXPECT_THAT(b.dest_offsets, ElementsAre(2));
  EXPECT_THAT(b.storage_offsets, ElementsAre(0));
  EXPECT_THAT(b.lengths, ElementsAre(3));
  absl::StatusOr<TensorView> view = planner.ResolveTensor(a);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->data(),
            dest["x"].sharded_tensor().local_shards()[0].tensor.data());
}

// A sharded tensor whose every shard is empty while its global shape is
// not: no rank plans an item for it, and the save fails the coverage check
// instead of leaving the tensor out. Empty shards on some ranks are fine;
// with full coverage off, the tensor is left out as before. A cached plan
// is not reused when only the unheld tensors changed (flattening off, so
// the flatten mapping does not change either).
TEST(DefaultPlannerTest, TensorNoRankHoldsFailsCoverage) {
  Tensor full = RandomTensor(DType::kF32, {4, 2}, 5);
  const ShardedTensor whole = Shards(full, {{{0, 0}, {4, 2}}});
  const ShardedTensor empty =
      EmptyShards(DType::kF32, {4, 2}, {{{4, 0}, {0, 2}}});
  const ShardedTensor no_shards = EmptyShards(DType::kF32, {4, 2}, {});
  for (bool caching : {false, true}) {
    std::vector<DefaultSavePlannerOptions> o(2);
    for (DefaultSavePlannerOptions& rank_options : o) {
      rank_options.flatten_state_dict = false;
      rank_options.enable_plan_caching = caching;
      rank_options.plan_cache = std::make_shared<SavePlanCache>();
    }
    auto save = [&](const StateDict& s0, const StateDict& s1) {
      DefaultSavePlanner p0(o[0]), p1(o[1]);
      return SaveInMemory({&s0, &s1}, {&p0, &p1});
    };
    // Rank 1 holds nothing of "w": rank 0 covers it.
    const StateDict held{{"w", whole}};
    const StateDict unheld{{"w", empty}};
    for (int repeat = 0; repeat < 2; ++repeat) {
      absl::StatusOr<InMemoryCheckpoint> ckpt = save(held, unheld);
      ASSERT_TRUE(ckpt.ok()) << ckpt.status();
      EXPECT_TRUE(ckpt->metadata.state_dict_metadata.contains("w"));
    }
    // Nobody holds "extra"; rank 0's items are as before.
    absl::StatusOr<InMemoryCheckpoint> ckpt = save(
        {{"w", whole}, {"extra", empty}}, {{"w", empty}, {"extra", no_shards}});
    ASSERT_FALSE(ckpt.ok()) << caching;
    EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(ckpt.status().message(),
                AllOf(HasSubstr("tensor \"extra\" of shape [4, 2]"),
                      HasSubstr("no rank holds any of its elements"),
                      HasSubstr("rank 0 holds none")));
    ckpt = save(unheld, unheld);
    ASSERT_FALSE(ckpt.ok()) << caching;
    EXPECT_THAT(ckpt.status().message(),
                AllOf(HasSubstr("tensor \"w\" of shape [4, 2]"),
                      HasSubstr("no rank holds any of its elements")));
  }
  // The ranks that hold none of a tensor must agree with those that do.
  for (bool full_coverage : {true, false}) {
    DefaultSavePlannerOptions o;
    o.require_full_coverage = full_coverage;
    DefaultSavePlanner p0(o), p1(o), p2(o), p3(o);
    const StateDict held{{"w", whole}};
    const StateDict other_shape{
        {"w", EmptyShards(DType::kF32, {8, 2}, {{{8, 0}, {0, 2}}})}};
    absl::StatusOr<InMemoryCheckpoint> ckpt =
        SaveInMemory({&held, &other_shape}, {&p0, &p1});
    ASSERT_FALSE(ckpt.ok());
    EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(ckpt.status().message(),
                AllOf(HasSubstr("\"w\": rank 1 has a sharded tensor of shape "
                                "[8, 2]"),
                      HasSubstr("rank 0 has a tensor of shape [4, 2]")));
    const StateDict value{{"w", int64_t{3}}};
    ckpt = SaveInMemory({&value, &other_shape}, {&p2, &p3});
    ASSERT_FALSE(ckpt.ok());
    EXPECT_THAT(ckpt.status().message(),
                HasSubstr("rank 0 has a non-tensor value"));
  }
  DefaultSavePlannerOptions partial;
  partial.require_full_coverage = false;
  DefaultSavePlanner p0(partial), p1(partial);
  const StateDict s0{{"w", whole}, {"extra", empty}};
  const StateDict s1{{"w", empty}, {"extra", no_shards}};
  absl::StatusOr<InMemoryCheckpoint> ckpt =
      SaveInMemory({&s0, &s1}, {&p0, &p1});
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_TRUE(ckpt->metadata.state_dict_metadata.contains("w"));
  EXPECT_FALSE(ckpt->metadata.state_dict_metadata.contains("extra"));
}

// A 3-d tensor saved as uneven blocks by three ranks loads into a different
// uneven layout on two ranks, into a whole tensor, and back.
TEST(DefaultPlannerTest, ReshardsNdUnevenLayouts) {
  Tensor full = RandomTensor(DType::kF32, {5, 7, 3}, 21);
  const std::vector<std::vector<std::pair<Shape, Shape>>> saved_layout = {
      {{{0, 0, 0}, {2, 7, 3}}},
      {{{2, 0, 0}, {3, 3, 3}}, {{2, 3, 0}, {3, 4, 1}}},
      {{{2, 3, 1}, {3, 4, 2}}}};
  std::vector<StateDict> saved(3);
  std::vector<DefaultSavePlanner> sp(3);
  std::vector<const StateDict*> sds;
  std::vector<SavePlanner*> sps;
  for (int r = 0; r < 3; ++r) {
    saved[r]["t"] = Shards(full, saved_layout[r]);
    saved[r]["whole"] = full;  // Replicated: written once.
    sds.push_back(&saved[r]);
    sps.push_back(&sp[r]);
  }
  absl::StatusOr<InMemoryCheckpoint> ckpt = SaveInMemory(sds, sps);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();

  const std::vector<std::vector<std::pair<Shape, Shape>>> load_layout = {
      {{{0, 0, 0}, {5, 2, 3}}, {{0, 2, 0}, {1, 5, 3}}},
      {{{1, 2, 0}, {4, 5, 3}}}};
  std::vector<StateDict> dest(2);
  std::vector<DefaultLoadPlanner> lp(2);
  for (int r = 0; r < 2; ++r) {
    dest[r]["t"] = EmptyShards(DType::kF32, {5, 7, 3}, load_layout[r]);
    dest[r]["whole"] = EmptyShards(DType::kF32, {5, 7, 3}, load_layout[r]);
  }
  ASSERT_TRUE(
      LoadFromMemory(*ckpt, {&dest[0], &dest[1]}, {&lp[0], &lp[1]}).ok());
  for (int r = 0; r < 2; ++r) {
    for (const char* name : {"t", "whole"}) {
      const auto& shards = dest[r][name].sharded_tensor().local_shards();
      for (size_t i = 0; i < shards.size(); ++i) {
        EXPECT_TRUE(shards[i].tensor.BytesEqual(
            Slice(full, load_layout[r][i].first, load_layout[r][i].second)))
            << name << " rank " << r << " shard " << i;
      }
    }
  }
  StateDict whole{{"t", Tensor::Empty(DType::kF32, {5, 7, 3})},
                  {"whole", Tensor::Empty(DType::kF32, {5, 7, 3})}};
  ASSERT_TRUE(LoadOne(*ckpt, whole).ok());
  EXPECT_TRUE(whole["t"].tensor().BytesEqual(full));
  EXPECT_TRUE(whole["whole"].tensor().BytesEqual(full));
}

// The elements of contiguous host tensor `t` converted to `dtype`.
Tensor Converted(const Tensor& t, DType dtype) {
  Tensor out = Tensor::Empty(dtype, t.sizes());
  ConvertElements(static_cast<const std::byte*>(t.data()), t.dtype(), t.numel(),
                  static_cast<std::byte*>(out.data()), dtype);
  return out;
}

// convert_dtypes: a tensor saved as F32 by three ranks loads into BF16
// shards of another layout and into a strided F64 tensor, each element
// converted as ConvertElements converts it; the temporaries are gone once
// the load returns.
TEST(DefaultPlannerTest, ConvertDtypesReadsThroughTemporaries) {
  Tensor full = RandomTensor(DType::kF32, {4, 6}, 5);
  // Random bytes include NaNs, whose payloads need not survive: use
  // finite values.
  auto* values = static_cast<float*>(full.data());
  for (int64_t i = 0; i < full.numel(); ++i) {
    if (!std::isfinite(values[i])) values[i] = static_cast<float>(i) / 3;
  }
  std::vector<StateDict> saved(3);
  std::vector<DefaultSavePlanner> sp(3);
  const std::vector<std::pair<Shape, Shape>> layout = {
      {{0, 0}, {2, 6}}, {{2, 0}, {2, 3}}, {{2, 3}, {2, 3}}};
  for (int r = 0; r < 3; ++r) {
    saved[r]["w"] = Shards(full, {layout[r]});
  }
  absl::StatusOr<InMemoryCheckpoint> ckpt =
      SaveInMemory({&saved[0], &saved[1], &saved[2]}, {&sp[0], &sp[1], &sp[2]});
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();

  // Without the option: refused, naming both dtypes.
  StateDict bf16{{"w", EmptyShards(DType::kBF16, {4, 6},
                                   {{{1, 0}, {3, 4}}, {{0, 4}, {4, 2}}})}};
  absl::Status refused = LoadOne(*ckpt, bf16);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), AllOf(HasSubstr("BF16"), HasSubstr("F32")));

  DefaultLoadPlanner planner({.convert_dtypes = true});
  ASSERT_TRUE(LoadFromMemory(*ckpt, {&bf16}, {&planner}).ok());
  const Tensor want = Converted(full, DType::kBF16);
  const auto& shards = bf16["w"].sharded_tensor().local_shards();
  EXPECT_TRUE(shards[0].tensor.BytesEqual(Slice(want, {1, 0}, {3, 4})));
  EXPECT_TRUE(shards[1].tensor.BytesEqual(Slice(want, {0, 4}, {4, 2})));
  // Both chunks' temporaries (3x4 and 4x2 F32) were held at once at most.
  EXPECT_GT(planner.peak_temporary_bytes(), 0);
  EXPECT_LE(planner.peak_temporary_bytes(), (12 + 8) * 4);

  // A strided F64 destination: the transpose of a 6x4 buffer.
  std::vector<double> buffer(24, -1);
  StateDict f64{{"w", Tensor::Wrap(TensorView(buffer.data(), DType::kF64,
                                              {4, 6}, {1, 4}, Device{}))}};
  DefaultLoadPlanner to_f64({.convert_dtypes = true});
  ASSERT_TRUE(LoadFromMemory(*ckpt, {&f64}, {&to_f64}).ok());
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t j = 0; j < 6; ++j) {
      ASSERT_EQ(buffer[j * 4 + i], static_cast<double>(values[i * 6 + j]))
          << i << "," << j;
    }
  }
}

// convert_dtypes converts floating-point dtypes only.
TEST(DefaultPlannerTest, ConvertDtypesLeavesIntegersRefused) {
  StateDict sd{{"i", RandomTensor(DType::kI32, {3}, 2)}};
  absl::StatusOr<InMemoryCheckpoint> ckpt = SaveOne(sd);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  StateDict dest{{"i", Tensor::Empty(DType::kI64, {3})}};
  absl::Status status = LoadOne(*ckpt, dest, {.convert_dtypes = true});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("I64"), HasSubstr("I32")));
  StateDict to_float{{"i", Tensor::Empty(DType::kF32, {3})}};
  EXPECT_EQ(LoadOne(*ckpt, to_float, {.convert_dtypes = true}).code(),
            absl::StatusCode::kInvalidArgument);
}

class LoadErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StateDict sd{{"a", RandomTensor(DType::kF32, {2, 3}, 1)},
                 {"n", int64_t{3}},
                 {"extra", RandomTensor(DType::kU8, {1}, 2)}};
    absl::StatusOr<InMemoryCheckpoint> ckpt = SaveOne(sd);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    ckpt_ = *std::move(ckpt);
  }
  absl::Status Load(StateDict& sd, DefaultLoadPlannerOptions o = {}) {
    return LoadOne(ckpt_, sd, o);
  }
  InMemoryCheckpoint ckpt_;
};

TEST_F(LoadErrorTest, MissingKeyIsNotFoundUnlessPartial) {
  StateDict sd{{"a", Tensor::Empty(DType::kF32, {2, 3})},
               {"gone", Tensor::Empty(DType::kF32, {1})},
               {"also_gone", int64_t{1}}};
  absl::Status status = Load(sd);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("\"also_gone\", \"gone\""),
                                      HasSubstr("allow_partial_load")));
  ASSERT_TRUE(Load(sd, {.allow_partial_load = true}).ok());
  EXPECT_EQ(sd["also_gone"].int_value(), 1);  // Untouched.
}

// The names one key deeper or shallower in the checkpoint: the message
// names the key one side lacks.
TEST(DefaultPlannerTest, MissingKeysNameTheOuterKeyOneSideLacks) {
  StateDict saved;
  saved["model"] = StateDict{{"bias", RandomTensor(DType::kF32, {2}, 1)}};
  absl::StatusOr<InMemoryCheckpoint> nested = SaveOne(saved);
  ASSERT_TRUE(nested.ok()) << nested.status();
  StateDict bare{{"bias", Tensor::Empty(DType::kF32, {2})}};
  absl::Status status = LoadOne(*nested, bare);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(),
              HasSubstr("(the checkpoint holds \"model.bias\": saved under "
                        "the key \"model\", which the state dict lacks?)"));
  absl::StatusOr<InMemoryCheckpoint> flat =
      SaveOne(StateDict{{"bias", RandomTensor(DType::kF32, {2}, 1)}});
  ASSERT_TRUE(flat.ok()) << flat.status();
  StateDict wrapped;
  wrapped["model"] = StateDict{{"bias", Tensor::Empty(DType::kF32, {2})}};
  status = LoadOne(*flat, wrapped);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(),
              HasSubstr("(the checkpoint holds \"bias\": saved without the "
                        "key \"model\" of the state dict?)"));
  // No hint where two saved names fit, or where the one that fits is the
  // state dict's own, or deeper than one key.
  StateDict two;
  two["a"] = StateDict{{"w", RandomTensor(DType::kF32, {2}, 1)}};
  two["b"] = StateDict{{"w", RandomTensor(DType::kF32, {2}, 1)}};
  two["c"] = StateDict{{"d", StateDict{{"v", int64_t{1}}}}};
  absl::StatusOr<InMemoryCheckpoint> ambiguous = SaveOne(two);
  ASSERT_TRUE(ambiguous.ok()) << ambiguous.status();
  for (const char* name : {"w", "v"}) {
    StateDict asks{{name, Tensor::Empty(DType::kF32, {2})}};
    status = LoadOne(*ambiguous, asks);
    EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
    EXPECT_THAT(status.message(), Not(HasSubstr("saved under"))) << name;
  }
  StateDict has_it{{"bias", Tensor::Empty(DType::kF32, {2})}};
  has_it["model"] = StateDict{{"bias", Tensor::Empty(DType::kF32, {2})}};
  status = LoadOne(*nested, has_it);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("no \"bias\""), Not(HasSubstr("saved under"))));
}

// A missing name where the checkpoint holds something of another kind:
// the message says what.
TEST_F(LoadErrorTest, MissingKeyNamesWhatTheCheckpointHoldsInstead) {
  StateDict value_for_list{{"n", StateList{StateValue(int64_t{0})}}};
  absl::Status status = Load(value_for_list);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("no \"n.0\""),
                    HasSubstr("holds a single value at \"n\"")));
  StateDict sd;
  sd["l"] = StateList{StateValue(int64_t{1}), StateValue(int64_t{2})};
  absl::StatusOr<InMemoryCheckpoint> lists = SaveOne(sd);
  ASSERT_TRUE(lists.ok()) << lists.status();
  StateDict value_for_saved_list{{"l", int64_t{0}}};
  status = LoadOne(*lists, value_for_saved_list);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("no \"l\""), HasSubstr("holds \"l.0\"")));
}

TEST_F(LoadErrorTest, UnexpectedSavedKeysAreFine) {
  StateDict sd{{"n", int64_t{0}}};
  ASSERT_TRUE(Load(sd).ok());
  EXPECT_EQ(sd["n"].int_value(), 3);
}

TEST_F(LoadErrorTest, DTypeMismatchNamesBoth) {
  StateDict sd{{"a", Tensor::Empty(DType::kBF16, {2, 3})}};
  absl::Status status = Load(sd);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("\"a\""), HasSubstr("BF16"), HasSubstr("F32")));
}

TEST_F(LoadErrorTest, ShapeMismatchNamesBoth) {
  StateDict sd{{"a", EmptyShards(DType::kF32, {3, 2}, {{{0, 0}, {3, 2}}})}};
  absl::Status status = Load(sd);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("\"a\""), HasSubstr("[3, 2]"),
                                      HasSubstr("[2, 3]")));
}

TEST_F(LoadErrorTest, KindMismatch) {
  StateDict sd{{"n", Tensor::Empty(DType::kI64, {})}};
  absl::Status status = Load(sd);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("\"n\" is a tensor in the state dict "
                                          "but a non-tensor value"));
  StateDict sd2{{"a", int64_t{1}}};
  EXPECT_THAT(Load(sd2).message(), HasSubstr("but a tensor in the checkpoint"));
}

TEST_F(LoadErrorTest, CorruptValueIsDataLoss) {
  ckpt_.items[MetadataIndex("n")] = "\x01\x02";
  StateDict sd{{"n", int64_t{0}}};
  absl::Status status = Load(sd);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("value \"n\""));
}

TEST_F(LoadErrorTest, IncompleteChunkListIsDataLoss) {
  auto& meta = std::get<TensorStorageMetadata>(
      ckpt_.metadata.state_dict_metadata.at("a"));
  meta.chunks[0].sizes = {1, 3};
  StateDict sd{{"a", Tensor::Empty(DType::kF32, {2, 3})}};
  absl::Status status = Load(sd);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("holds 3 of 6 elements"));
}

// One rank's checkpoint of a rank-local save, loaded whole by itself: the
// error says what it is and how to load it, not "damaged metadata".
TEST_F(LoadErrorTest, OneRanksPartOfARankLocalSaveSaysSo) {
  auto& meta = std::get<TensorStorageMetadata>(
      ckpt_.metadata.state_dict_metadata.at("a"));
  meta.chunks[0].sizes = {1, 3};
  ckpt_.metadata.rank_local = RankLocalSave{"g", 1, 2};
  StateDict sd{{"a", Tensor::Empty(DType::kF32, {2, 3})}};
  absl::Status status = Load(sd);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("holds 3 of 6 elements"),
                    HasSubstr("rank 1's checkpoint of a rank-local save of 2 "
                              "ranks"),
                    Not(HasSubstr("damaged"))));
}

// Saved chunks that overlap each other can add up to the requested volume
// while leaving an element uncovered: the tiling is checked, not just the
// volume.
TEST_F(LoadErrorTest, OverlappingChunksHidingAGapAreDataLoss) {
  auto& meta = std::get<TensorStorageMetadata>(
      ckpt_.metadata.state_dict_metadata.at("a"));
  // [0:2, 0:2] and [0:1, 1:3]: 4 + 2 = 6 elements, but (1, 2) is in neither.
  meta.chunks = {{Shape{0, 0}, Shape{2, 2}}, {Shape{0, 1}, Shape{1, 2}}};
  StateDict sd{{"a", Tensor::Empty(DType::kF32, {2, 3})}};
  absl::Status status = Load(sd);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("chunks of tensor \"a\" overlap"),
                    HasSubstr("damaged metadata")));
}

TEST_F(LoadErrorTest, TwoLocalShardsAtOneOffsetAreRefused) {
  StateDict sd{{"a", EmptyShards(DType::kF32, {2, 3},
                                 {{{0, 0}, {2, 3}}, {{0, 0}, {1, 3}}})}};
  absl::Status status = Load(sd);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("\"a\" has two local shards at offsets [0, 0]"));
}

}  // namespace
}  // namespace dcp
