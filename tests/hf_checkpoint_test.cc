// Hugging Face checkpoints through the public API (dcp::Save / dcp::Load
// with HuggingFaceStorageWriter / HuggingFaceStorageReader): every dtype,
// the directory layout and index, file mappings, resharded loads that read
// only their slice, distributed saves with consolidation on one rank, and
// that failures and crashes at any step leave the old checkpoint or the new
// one, never a mix.
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/dtype_convert.h"
#include "core/state_dict.h"
#include "engine/checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/fault_injection.h"
#include "io/hf_storage.h"
#include "io/safetensors.h"
#include "io/testing/fake_planners.h"
#include "nlohmann/json.hpp"
#include "planner/default_planner.h"
#include "tests/crash_points.h"
#include "tests/test_util.h"

namespace dcp {
namespace {

using ::dcp::testing::ListFiles;
using ::dcp::testing::MakeTempDir;
using ::dcp::testing::SeededTensor;
using ::testing::HasSubstr;
using Json = nlohmann::json;

absl::StatusOr<Metadata> SaveHf(const std::string& dir, const StateDict& state,
                                HuggingFaceStorageWriterOptions options = {}) {
  HuggingFaceStorageWriter writer(dir, std::move(options));
  SaveOptions save;
  save.storage_writer = &writer;
  return Save(state, save);
}

absl::Status LoadHf(const std::string& dir, StateDict& state,
                    HuggingFaceStorageReaderOptions options = {},
                    int64_t* bytes_read = nullptr) {
  HuggingFaceStorageReader reader(dir, options);
  LoadOptions load;
  load.storage_reader = &reader;
  absl::Status status = Load(state, load);
  if (bytes_read != nullptr) *bytes_read = reader.bytes_read();
  return status;
}

// Zero-filled tensors shaped like `state`'s.
StateDict ZerosLike(const StateDict& state) {
  StateDict out;
  for (const auto& [key, value] : state) {
    out[key] = Tensor::Empty(value.tensor().dtype(), value.tensor().sizes());
  }
  return out;
}

void ExpectEqualStates(const StateDict& want, const StateDict& got) {
  ASSERT_EQ(want.size(), got.size());
  for (const auto& [key, value] : want) {
    ASSERT_TRUE(got.contains(key)) << key;
    EXPECT_TRUE(value.tensor().BytesEqual(got.at(key).tensor())) << key;
  }
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

SafetensorsHeader HeaderOf(const std::string& path) {
  absl::StatusOr<SafetensorsHeader> header =
      ParseSafetensors(ReadAll(path), path);
  EXPECT_TRUE(header.ok()) << header.status();
  return header.ok() ? *header : SafetensorsHeader{};
}

// A state of every dtype safetensors has, 0-d and zero-size tensors, and
// tensors large and oddly sized enough to take the O_DIRECT and bounce
// paths of the writer and reader.
StateDict EveryDTypeState(uint64_t seed) {
  StateDict state;
  for (int i = 0; i < kNumDTypes; ++i) {
    const DType dtype = static_cast<DType>(i);
    if (!InSafetensors(dtype)) continue;  // Not in the format.
    state[absl::StrCat("t.", DTypeName(dtype))] =
        SeededTensor(dtype, {3, 5}, seed + i);
  }
  state["t.scalar"] = SeededTensor(DType::kF64, {}, seed + 100);
  state["t.empty"] = SeededTensor(DType::kF32, {4, 0, 2}, seed + 101);
  state["t.odd"] = SeededTensor(DType::kU8, {4097}, seed + 102);
  state["t.large"] = SeededTensor(DType::kF32, {300, 1000}, seed + 103);
  state["t.large_bf16"] = SeededTensor(DType::kBF16, {513, 1025}, seed + 104);
  return state;
}

class HfRoundTrip : public ::testing::TestWithParam<bool> {};

TEST_P(HfRoundTrip, EveryDTypeAndTheDirectoryLayout) {
  const bool direct = GetParam();
  const std::string dir = MakeTempDir("hf_roundtrip");
  const StateDict saved = EveryDTypeState(7);
  HuggingFaceStorageWriterOptions writer_options;
  writer_options.direct_io = direct;
  absl::StatusOr<Metadata> metadata = SaveHf(dir, saved, writer_options);
  ASSERT_TRUE(metadata.ok()) << metadata.status();
  const std::string file = HfFileName(1, 1);
  EXPECT_EQ(ListFiles(dir), (std::set<std::string>{file, kHfIndexFileName}));

  StateDict loaded = ZerosLike(saved);
  HuggingFaceStorageReaderOptions reader_options;
  reader_options.direct_io = direct;
  ASSERT_TRUE(LoadHf(dir, loaded, reader_options).ok());
  ExpectEqualStates(saved, loaded);

  // The file: "format": "pt", data 4 KiB aligned, every tensor's bytes.
  const SafetensorsHeader header = HeaderOf(JoinPath(dir, file));
  EXPECT_EQ(header.metadata.at("format"), "pt");
  EXPECT_EQ(header.data_start() % 4096, 0);
  EXPECT_EQ(header.tensors.size(), saved.size());
  const std::string bytes = ReadAll(JoinPath(dir, file));
  int64_t total = 0;
  for (const SafetensorsTensor& t : header.tensors) {
    const Tensor& want = saved.at(t.name).tensor();
    EXPECT_EQ(t.dtype, want.dtype()) << t.name;
    EXPECT_EQ(t.shape, want.sizes()) << t.name;
    EXPECT_EQ(std::string(bytes, header.data_start() + t.begin, want.nbytes()),
              std::string(static_cast<const char*>(want.data()), want.nbytes()))
        << t.name;
    total += t.end - t.begin;
  }
  // The index: total_size and a weight_map entry per tensor.
  const Json index = Json::parse(ReadAll(JoinPath(dir, kHfIndexFileName)));
  EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), total);
  EXPECT_EQ(index["weight_map"].size(), saved.size());
  for (const auto& [key, value] : saved) {
    EXPECT_EQ(index["weight_map"][key], file) << key;
  }
  // Save's metadata says where each tensor is.
  for (const SafetensorsTensor& t : header.tensors) {
    const StorageInfo& info = metadata->storage_data.at(
        MetadataIndex(t.name, Shape(t.shape.size(), 0)));
    EXPECT_EQ(info.relative_path, file);
    EXPECT_EQ(info.offset, header.data_start() + t.begin);
  }
}

INSTANTIATE_TEST_SUITE_P(DirectIo, HfRoundTrip, ::testing::Bool());

TEST(HfCheckpoint, NestedStateDictUsesFlattenedNames) {
  const std::string dir = MakeTempDir("hf_nested");
  StateDict saved;
  saved["model"] = StateDict{
      {"layers",
       StateList{StateDict{{"w", SeededTensor(DType::kBF16, {4, 4}, 1)}}}}};
  ASSERT_TRUE(SaveHf(dir, saved).ok());
  const SafetensorsHeader header = HeaderOf(JoinPath(dir, HfFileName(1, 1)));
  ASSERT_EQ(header.tensors.size(), 1u);
  EXPECT_EQ(header.tensors[0].name, "model.layers.0.w");
  StateDict loaded;
  loaded["model"] = StateDict{
      {"layers",
       StateList{StateDict{{"w", Tensor::Empty(DType::kBF16, {4, 4})}}}}};
  ASSERT_TRUE(LoadHf(dir, loaded).ok());
  EXPECT_TRUE(
      loaded["model"]
          .dict()["layers"]
          .list()[0]
          .dict()["w"]
          .tensor()
          .BytesEqual(
              saved["model"].dict()["layers"].list()[0].dict()["w"].tensor()));
}

TEST(HfCheckpoint, WhatSafetensorsCannotHoldIsRefusedByName) {
  const std::string dir = MakeTempDir("hf_refused");
  StateDict with_int;
  with_int["w"] = SeededTensor(DType::kF32, {2}, 1);
  with_int["step"] = int64_t{3};
  absl::StatusOr<Metadata> saved = SaveHf(dir, with_int);
  ASSERT_FALSE(saved.ok());
  EXPECT_EQ(saved.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(saved.status().message(), HasSubstr("\"step\" is not a tensor"));

  StateDict complex;
  complex["c"] = SeededTensor(DType::kC128, {2}, 1);
  saved = SaveHf(dir, complex);
  ASSERT_FALSE(saved.ok());
  EXPECT_THAT(saved.status().message(), HasSubstr("\"c\" has dtype C128"));

  StateDict unmapped;
  unmapped["a"] = SeededTensor(DType::kF32, {2}, 1);
  unmapped["b"] = SeededTensor(DType::kF32, {2}, 2);
  HuggingFaceStorageWriterOptions options;
  options.fqn_to_index_mapping = {{"a", 1}};
  saved = SaveHf(dir, unmapped, options);
  ASSERT_FALSE(saved.ok());
  EXPECT_THAT(saved.status().message(), HasSubstr("no file for tensor \"b\""));
  // Nothing was written, not even a temporary file.
  EXPECT_TRUE(ListFiles(dir).empty());
}

TEST(HfCheckpoint, FqnToIndexMappingChoosesTheFiles) {
  const std::string dir = MakeTempDir("hf_mapping");
  StateDict saved;
  saved["a"] = SeededTensor(DType::kF32, {8, 8}, 1);
  saved["b"] = SeededTensor(DType::kI64, {5}, 2);
  saved["c"] = SeededTensor(DType::kBF16, {3, 3}, 3);
  HuggingFaceStorageWriterOptions options;
  options.fqn_to_index_mapping = {{"a", 1}, {"b", 2}, {"c", 2}};
  options.thread_count = 2;
  ASSERT_TRUE(SaveHf(dir, saved, options).ok());
  const std::string one = HfFileName(1, 2), two = HfFileName(2, 2);
  EXPECT_EQ(one, "model-00001-of-00002.safetensors");
  EXPECT_EQ(ListFiles(dir),
            (std::set<std::string>{one, two, kHfIndexFileName}));
  EXPECT_EQ(HeaderOf(JoinPath(dir, one)).tensors.size(), 1u);
  EXPECT_EQ(HeaderOf(JoinPath(dir, two)).tensors.size(), 2u);
  const Json index = Json::parse(ReadAll(JoinPath(dir, kHfIndexFileName)));
  EXPECT_EQ(index["weight_map"]["a"], one);
  EXPECT_EQ(index["weight_map"]["b"], two);
  EXPECT_EQ(index["weight_map"]["c"], two);
  EXPECT_EQ(index["metadata"]["total_size"], 8 * 8 * 4 + 5 * 8 + 9 * 2);
  StateDict loaded = ZerosLike(saved);
  ASSERT_TRUE(LoadHf(dir, loaded).ok());
  ExpectEqualStates(saved, loaded);
}

// A new save replaces the checkpoint's files and what interrupted saves
// left, nothing else.
TEST(HfCheckpoint, ResaveReplacesTheCheckpointFilesOnly) {
  const std::string dir = MakeTempDir("hf_resave");
  StateDict first;
  first["a"] = SeededTensor(DType::kF32, {4}, 1);
  first["b"] = SeededTensor(DType::kF32, {4}, 2);
  HuggingFaceStorageWriterOptions two_files;
  two_files.fqn_to_index_mapping = {{"a", 1}, {"b", 2}};
  ASSERT_TRUE(SaveHf(dir, first, two_files).ok());
  // What else lives in a model directory stays.
  std::ofstream(JoinPath(dir, "config.json")) << "{}";
  std::ofstream(JoinPath(dir, "adapter_model.safetensors")) << "not ours";
  // An interrupted save's probe file goes.
  std::ofstream(JoinPath(dir, ".dcp-probe-3-00000000deadbeef"));

  StateDict second;
  second["a"] = SeededTensor(DType::kF32, {4}, 3);
  second["b"] = SeededTensor(DType::kF32, {4}, 4);
  ASSERT_TRUE(SaveHf(dir, second).ok());
  EXPECT_EQ(ListFiles(dir), (std::set<std::string>{
                                HfFileName(1, 1), kHfIndexFileName,
                                "config.json", "adapter_model.safetensors"}));
  StateDict loaded = ZerosLike(second);
  ASSERT_TRUE(LoadHf(dir, loaded).ok());
  ExpectEqualStates(second, loaded);
}

TEST(HfCheckpoint, ReshardedLoadsReadOnlyTheirSlice) {
  const std::string dir = MakeTempDir("hf_reshard");
  const Tensor w = SeededTensor(DType::kF32, {256, 512}, 5);
  const Tensor wide = SeededTensor(DType::kU8, {8, 262144}, 6);
  StateDict saved;
  saved["w"] = w;
  saved["wide"] = wide;
  ASSERT_TRUE(SaveHf(dir, saved).ok());
  // Expected bytes of a box of a row-major tensor.
  auto box = [](const Tensor& t, int64_t r0, int64_t nr, int64_t c0,
                int64_t nc) {
    Tensor out = Tensor::Empty(t.dtype(), {nr, nc});
    const size_t es = ElementSize(t.dtype());
    for (int64_t r = 0; r < nr; ++r) {
      std::memcpy(static_cast<char*>(out.data()) + r * nc * es,
                  static_cast<const char*>(t.data()) +
                      ((r0 + r) * t.sizes()[1] + c0) * es,
                  nc * es);
    }
    return out;
  };
  for (bool direct : {false, true}) {
    HuggingFaceStorageReaderOptions options;
    options.direct_io = direct;
    options.read_window_bytes = 1 << 20;  // Several windows.
    // Rows [64, 128) of w: exactly those bytes are read.
    StateDict rows;
    rows["w"] =
        ShardedTensor(DType::kF32, {256, 512},
                      {Shard{{64, 0}, Tensor::Empty(DType::kF32, {64, 512})}});
    rows["wide"] = ShardedTensor(
        DType::kU8, {8, 262144},
        {Shard{{0, 65536}, Tensor::Empty(DType::kU8, {8, 65536})}});
    int64_t read = 0;
    ASSERT_TRUE(LoadHf(dir, rows, options, &read).ok());
    EXPECT_TRUE(rows["w"].sharded_tensor().local_shards()[0].tensor.BytesEqual(
        box(w, 64, 64, 0, 512)));
    EXPECT_TRUE(
        rows["wide"].sharded_tensor().local_shards()[0].tensor.BytesEqual(
            box(wide, 0, 8, 65536, 65536)));
    // w's 64 rows, and 8 runs of 64 KiB of `wide` (its gaps are larger than
    // what is read through); O_DIRECT rounds each read out to 4 KiB.
    const int64_t want = 64 * 512 * 4 + 8 * 65536;
    if (direct) {
      EXPECT_GE(read, want);
      EXPECT_LE(read, want + 9 * 2 * 4096);
    } else {
      EXPECT_EQ(read, want);
    }
    // Two column shards of w on "one rank": each row's runs are close, so
    // the rows are read through (w once, not twice).
    StateDict cols;
    cols["w"] = ShardedTensor(
        DType::kF32, {256, 512},
        {Shard{{0, 0}, Tensor::Empty(DType::kF32, {256, 100})},
         Shard{{0, 300}, Tensor::Empty(DType::kF32, {256, 212})}});
    cols["wide"] = Tensor::Empty(DType::kU8, {8, 262144});
    ASSERT_TRUE(LoadHf(dir, cols, options, &read).ok());
    const auto& shards = cols["w"].sharded_tensor().local_shards();
    EXPECT_TRUE(shards[0].tensor.BytesEqual(box(w, 0, 256, 0, 100)));
    EXPECT_TRUE(shards[1].tensor.BytesEqual(box(w, 0, 256, 300, 212)));
    EXPECT_TRUE(cols["wide"].tensor().BytesEqual(wide));
  }
}

// BF16 safetensors loaded into F32 tensors with convert_dtypes (a
// released model fine-tuned in F32): every element widened exactly, a
// resharded slice too, and the reader holds about two windows of
// temporaries, not all of them.
TEST(HfCheckpoint, ConvertingLoadHoldsAboutTwoWindowsOfTemporaries) {
  const std::string dir = MakeTempDir("hf_convert");
  StateDict saved;
  for (int i = 0; i < 30; ++i) {
    saved[absl::StrCat("layer", i)] = SeededTensor(DType::kBF16, {128, 256}, i);
  }
  ASSERT_TRUE(SaveHf(dir, saved).ok());
  auto widened = [](const Tensor& t) {
    Tensor out = Tensor::Empty(DType::kF32, t.sizes());
    ConvertElements(static_cast<const std::byte*>(t.data()), DType::kBF16,
                    t.numel(), static_cast<std::byte*>(out.data()),
                    DType::kF32);
    return out;
  };
  for (bool direct : {false, true}) {
    SCOPED_TRACE(direct ? "direct" : "buffered");
    HuggingFaceStorageReaderOptions options;
    options.direct_io = direct;
    options.read_window_bytes = 128 << 10;  // Two 64 KiB tensors.
    HuggingFaceStorageReader reader(dir, options);
    StateDict sd;
    for (const auto& [name, value] : saved) {
      sd[name] = Tensor::Empty(DType::kF32, {128, 256});
    }
    // Rows [32, 96) of layer0 into an F32 shard.
    sd["layer0"] =
        ShardedTensor(DType::kF32, {128, 256},
                      {Shard{{32, 0}, Tensor::Empty(DType::kF32, {64, 256})}});
    DefaultLoadPlanner planner({.convert_dtypes = true});
    LoadOptions load;
    load.storage_reader = &reader;
    load.planner = &planner;
    ASSERT_TRUE(Load(sd, load).ok());
    for (const auto& [name, value] : saved) {
      const Tensor want = widened(value.tensor());
      if (name == "layer0") {
        const Tensor& shard =
            sd[name].sharded_tensor().local_shards()[0].tensor;
        EXPECT_EQ(
            std::memcmp(shard.data(),
                        static_cast<const char*>(want.data()) + 32 * 256 * 4,
                        shard.nbytes()),
            0);
        continue;
      }
      EXPECT_TRUE(sd[name].tensor().BytesEqual(want)) << name;
    }
    // All of them would be 30 * 64 KiB.
    EXPECT_GT(planner.peak_temporary_bytes(), 0);
    EXPECT_LE(planner.peak_temporary_bytes(),
              2 * options.read_window_bytes + (64 << 10));
  }
}

TEST(HfCheckpoint, LoadsASingleModelSafetensorsFile) {
  const std::string dir = MakeTempDir("hf_single");
  const Tensor a = SeededTensor(DType::kI32, {6, 7}, 1);
  const Tensor b = SeededTensor(DType::kF8E5M2, {9}, 2);
  std::vector<SafetensorsTensor> layout = {{"b", DType::kF8E5M2, {9}},
                                           {"a", DType::kI32, {6, 7}}};
  absl::StatusOr<std::string> head = EncodeSafetensorsHeader(layout, {});
  ASSERT_TRUE(head.ok());
  {
    std::ofstream out(JoinPath(dir, kHfSingleFileName), std::ios::binary);
    out << *head;
    out.write(static_cast<const char*>(b.data()), b.nbytes());
    out.write(static_cast<const char*>(a.data()), a.nbytes());
  }
  StateDict loaded;
  loaded["a"] = Tensor::Empty(DType::kI32, {6, 7});
  loaded["b"] = Tensor::Empty(DType::kF8E5M2, {9});
  ASSERT_TRUE(LoadHf(dir, loaded).ok());
  EXPECT_TRUE(loaded["a"].tensor().BytesEqual(a));
  EXPECT_TRUE(loaded["b"].tensor().BytesEqual(b));
}

TEST(HfCheckpoint, MalformedDirectoriesAreDataLossNamingTheFile) {
  const std::string dir = MakeTempDir("hf_malformed");
  StateDict saved;
  saved["a"] = SeededTensor(DType::kF32, {4}, 1);
  saved["b"] = SeededTensor(DType::kF32, {4}, 2);
  HuggingFaceStorageWriterOptions options;
  options.fqn_to_index_mapping = {{"a", 1}, {"b", 2}};
  ASSERT_TRUE(SaveHf(dir, saved, options).ok());
  const std::string index_path = JoinPath(dir, kHfIndexFileName);
  const std::string good_index = ReadAll(index_path);
  auto load_error = [&]() {
    StateDict loaded = ZerosLike(saved);
    return LoadHf(dir, loaded);
  };
  // An index naming a file outside the directory.
  std::ofstream(index_path, std::ios::trunc)
      << R"({"weight_map": {"a": "../escape.safetensors"}})";
  absl::Status status = load_error();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr("not a file name in the directory"));
  // An index naming a file longer than a file name can be.
  std::ofstream(index_path, std::ios::trunc)
      << R"({"weight_map": {"a": ")" << std::string(300, 'm') << R"("}})";
  status = load_error();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr("not a file name in the directory"));
  // An index that is not JSON.
  std::ofstream(index_path, std::ios::trunc) << "{";
  status = load_error();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr(kHfIndexFileName));
  // An index naming a tensor its file lacks.
  std::ofstream(index_path, std::ios::trunc)
      << absl::StrCat(R"({"weight_map": {"a": ")", HfFileName(2, 2), R"("}})");
  status = load_error();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr("has no such tensor"));
  std::ofstream(index_path, std::ios::trunc) << good_index;
  // A truncated data file.
  const std::string file = JoinPath(dir, HfFileName(2, 2));
  std::filesystem::resize_file(file, std::filesystem::file_size(file) - 1);
  status = load_error();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr(file));
  EXPECT_THAT(status.message(), HasSubstr("truncated"));
  // No checkpoint at all.
  StateDict loaded = ZerosLike(saved);
  EXPECT_EQ(LoadHf(MakeTempDir("hf_empty"), loaded).code(),
            absl::StatusCode::kNotFound);
}

TEST(HfCheckpoint, SaveDistributedOnOneRankWritesShardsWithShardingInfo) {
  const std::string dir = MakeTempDir("hf_distributed");
  StateDict saved;
  saved["w"] =
      ShardedTensor(DType::kF32, {8, 3},
                    {Shard{{4, 0}, SeededTensor(DType::kF32, {4, 3}, 1)},
                     Shard{{0, 0}, SeededTensor(DType::kF32, {4, 3}, 2)}});
  HuggingFaceStorageWriterOptions options;
  options.save_distributed = true;
  // Two chunks of one tensor on one rank: one safetensors key each is
  // impossible.
  absl::StatusOr<Metadata> result = SaveHf(dir, saved, options);
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(), HasSubstr("more than one chunk"));

  saved["w"] = SeededTensor(DType::kF32, {8, 3}, 3);
  saved["b"] = SeededTensor(DType::kBF16, {5}, 4);
  ASSERT_TRUE(SaveHf(dir, saved, options).ok());
  // In the directory itself, as PyTorch's writer puts them without
  // consolidation (its reader looks there).
  const std::string shard = HfFileName(1, 1, /*shard=*/1);
  EXPECT_EQ(shard, "shard-00001-model-00001-of-00001.safetensors");
  EXPECT_EQ(ListFiles(dir), (std::set<std::string>{shard}));
  EXPECT_FALSE(std::filesystem::exists(JoinPath(dir, kHfShardedDirName)));
  const SafetensorsHeader header = HeaderOf(JoinPath(dir, shard));
  EXPECT_EQ(header.metadata.at("format"), "pt");
  const Json sharding = Json::parse(header.metadata.at(kHfShardingInfoKey));
  EXPECT_EQ(sharding["w"][kHfSavedOffsetsKey], Json::array({0, 0}));
  EXPECT_EQ(sharding["b"][kHfSavedOffsetsKey], Json::array({0}));
  // The directory loads.
  StateDict loaded = ZerosLike(saved);
  ASSERT_TRUE(LoadHf(dir, loaded).ok());
  ExpectEqualStates(saved, loaded);
}

// Two shards that claim the same elements of a tensor: kDataLoss naming
// both files (planner/chunk_geometry.h's ValidateTiling).
TEST(HfCheckpoint, OverlappingShardsAreDataLoss) {
  const std::string dir = MakeTempDir("hf_overlap");
  StateDict saved{{"w", SeededTensor(DType::kF32, {8, 3}, 1)}};
  HuggingFaceStorageWriterOptions options;
  options.save_distributed = true;
  ASSERT_TRUE(SaveHf(dir, saved, options).ok());
  std::filesystem::copy_file(JoinPath(dir, HfFileName(1, 1, 1)),
                             JoinPath(dir, HfFileName(1, 1, 2)));
  StateDict loaded = ZerosLike(saved);
  const absl::Status status = LoadHf(dir, loaded);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr("overlap"));
  EXPECT_THAT(status.message(), HasSubstr(HfFileName(1, 1, 1)));
  EXPECT_THAT(status.message(), HasSubstr(HfFileName(1, 1, 2)));
}

TEST(HfCheckpoint, ConsolidationStreamsWithinItsBudget) {
  const std::string dir = MakeTempDir("hf_consolidate");
  StateDict saved;
  saved["big"] = SeededTensor(DType::kF32, {3, 1 << 19}, 1);  // 6 MiB.
  saved["rows"] = SeededTensor(DType::kBF16, {4096, 300}, 2);
  saved["small"] = SeededTensor(DType::kI8, {7}, 3);
  saved["scalar"] = SeededTensor(DType::kF64, {}, 4);
  saved["empty"] = SeededTensor(DType::kF32, {0, 5}, 5);
  for (bool direct : {false, true}) {
    HuggingFaceStorageWriterOptions options;
    options.save_distributed = true;
    options.enable_consolidation = true;
    options.consolidation_buffer_bytes = 1 << 20;
    options.thread_count_consolidation = 2;
    options.fqn_to_index_mapping = {
        {"big", 1}, {"rows", 2}, {"small", 2}, {"scalar", 2}, {"empty", 1}};
    options.direct_io = direct;
    HuggingFaceStorageWriter writer(dir, options);
    SaveOptions save;
    save.storage_writer = &writer;
    ASSERT_TRUE(Save(saved, save).ok());
    // Two threads of at most 1 MiB each (the floor per thread).
    EXPECT_GT(writer.consolidation_peak_bytes(), 0);
    EXPECT_LE(writer.consolidation_peak_bytes(), 2 << 20);
    EXPECT_EQ(ListFiles(dir),
              (std::set<std::string>{HfFileName(1, 2), HfFileName(2, 2),
                                     kHfIndexFileName}));
    EXPECT_EQ(
        ListFiles(JoinPath(dir, kHfShardedDirName)),
        (std::set<std::string>{HfFileName(1, 2, 1), HfFileName(2, 2, 1)}));
    const SafetensorsHeader header = HeaderOf(JoinPath(dir, HfFileName(1, 2)));
    EXPECT_FALSE(header.metadata.contains(kHfShardingInfoKey));
    StateDict loaded = ZerosLike(saved);
    ASSERT_TRUE(LoadHf(dir, loaded).ok());
    ExpectEqualStates(saved, loaded);
  }
}

TEST(HfCheckpoint, RepeatedSavesWithPlanCaching) {
  const std::string dir = MakeTempDir("hf_plan_cache");
  DefaultSavePlannerOptions planner_options;
  planner_options.enable_plan_caching = true;
  DefaultSavePlanner planner(planner_options);
  HuggingFaceStorageWriterOptions options;
  options.fqn_to_index_mapping = {{"a", 1}, {"b", 2}};
  HuggingFaceStorageWriter writer(dir, options);
  SaveOptions save;
  save.planner = &planner;
  for (uint64_t seed : {1, 2, 3}) {
    StateDict state;
    state["a"] = SeededTensor(DType::kF32, {16}, seed);
    state["b"] = SeededTensor(DType::kBF16, {8, 2}, seed + 10);
    absl::StatusOr<Metadata> saved = SaveStateDict(state, writer, save);
    ASSERT_TRUE(saved.ok()) << "save " << seed << ": " << saved.status();
    StateDict loaded = ZerosLike(state);
    ASSERT_TRUE(LoadHf(dir, loaded).ok());
    ExpectEqualStates(state, loaded);
  }
  EXPECT_EQ(ListFiles(dir),
            (std::set<std::string>{HfFileName(1, 2), HfFileName(2, 2),
                                   kHfIndexFileName}));
}

// Sorted names of every file under `dir` (sharded/ too).
std::set<std::string> AllFiles(const std::string& dir) {
  std::set<std::string> names = ListFiles(dir);
  for (const std::string& name : ListFiles(JoinPath(dir, kHfShardedDirName))) {
    names.insert(absl::StrCat(kHfShardedDirName, "/", name));
  }
  return names;
}

// Whether loading `dir` gives `want` (every byte).
bool LoadsAs(const std::string& dir, const StateDict& want) {
  StateDict loaded = ZerosLike(want);
  if (!LoadHf(dir, loaded).ok()) return false;
  for (const auto& [key, value] : want) {
    if (!value.tensor().BytesEqual(loaded.at(key).tensor())) return false;
  }
  return true;
}

StateDict SmallState(uint64_t seed) {
  StateDict state;
  state["a"] = SeededTensor(DType::kF32, {64, 33}, seed);
  state["b"] = SeededTensor(DType::kBF16, {100}, seed + 1);
  state["c"] = SeededTensor(DType::kI64, {3}, seed + 2);
  return state;
}

// A failed call at every step of a save (one operation at a time) leaves
// the old checkpoint, or, once the commit was decided, the new one; never
// a mix, and no file of the failed save behind.
TEST(HfCheckpoint, AFailureAtAnyStepKeepsTheOldCheckpointOrTheNewOne) {
  for (bool distributed : {false, true}) {
    const std::string dir = MakeTempDir("hf_faults");
    FaultInjectionFileSystem faulty(LocalFileSystem());
    HuggingFaceStorageWriterOptions options;
    options.file_system = &faulty;
    options.fqn_to_index_mapping = {{"a", 1}, {"b", 2}, {"c", 2}};
    options.save_distributed = distributed;
    options.enable_consolidation = distributed;
    const StateDict old_state = SmallState(1), new_state = SmallState(50);
    ASSERT_TRUE(SaveHf(dir, old_state, options).ok());
    const std::set<std::string> files = AllFiles(dir);
    int failures = 0, kept_old = 0;
    for (int64_t nth = 1;; ++nth) {
      const int64_t before = faulty.calls(FaultOp::kAny);
      faulty.Inject(Fault{FaultOp::kAny, EIO, dir, nth});
      absl::StatusOr<Metadata> saved = SaveHf(dir, new_state, options);
      faulty.ClearFaults();
      if (saved.ok() && faulty.calls(FaultOp::kAny) - before < nth) break;
      ++failures;
      const bool old_one = LoadsAs(dir, old_state);
      EXPECT_TRUE(old_one || LoadsAs(dir, new_state))
          << "fault at call " << nth << ": " << saved.status();
      if (old_one) {
        ++kept_old;
        EXPECT_FALSE(saved.ok()) << "call " << nth;
      }
      EXPECT_EQ(AllFiles(dir), files)
          << "call " << nth << ": " << saved.status();
      // Back to the old checkpoint for the next round.
      ASSERT_TRUE(SaveHf(dir, old_state, options).ok());
    }
    EXPECT_GT(failures, 10);
    EXPECT_GT(kept_old, 5);
  }
}

TEST(HfCheckpoint, OutOfSpaceKeepsTheOldCheckpoint) {
  const std::string dir = MakeTempDir("hf_enospc");
  FaultInjectionFileSystem faulty(LocalFileSystem());
  HuggingFaceStorageWriterOptions options;
  options.file_system = &faulty;
  const StateDict old_state = SmallState(1);
  ASSERT_TRUE(SaveHf(dir, old_state, options).ok());
  const std::set<std::string> files = AllFiles(dir);
  faulty.FailWritesAfter(5000);
  absl::StatusOr<Metadata> saved = SaveHf(dir, SmallState(9), options);
  faulty.ClearFaults();
  ASSERT_FALSE(saved.ok());
  EXPECT_EQ(saved.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(LoadsAs(dir, old_state));
  EXPECT_EQ(AllFiles(dir), files);
}

// A crash (the process killed, then the power lost) at each of a save's
// file-system calls: what the disk holds then loads as the old checkpoint
// or the new one; an interrupted (decided) commit is completed by the load.
TEST(HfCheckpoint, ACrashAtAnyPointIsRecovered) {
  const StateDict old_state = SmallState(1), new_state = SmallState(80);
  auto planner_of = [](const StateDict& state) {
    testing::FakeSavePlanner planner;
    for (const auto& [key, value] : state)
      planner.AddTensor(key, value.tensor());
    return planner;
  };
  HuggingFaceStorageWriterOptions options;
  options.fqn_to_index_mapping = {{"a", 1}, {"b", 2}, {"c", 2}};
  options.direct_io = false;  // The crash model drops unsynced bytes.
  std::string dir;
  auto prepare = [&] {
    dir = MakeTempDir("hf_crash");
    HuggingFaceStorageWriter writer(dir, options);
    testing::FakeSavePlanner planner = planner_of(old_state);
    ASSERT_TRUE(testing::SaveOneRank(writer, planner).ok());
  };
  auto save = [&](FileSystemBase& fs) {
    HuggingFaceStorageWriterOptions faulty = options;
    faulty.file_system = &fs;
    HuggingFaceStorageWriter writer(dir, faulty);
    testing::FakeSavePlanner planner = planner_of(new_state);
    // No Abort: the process is gone.
    return testing::SaveOneRank(writer, planner, /*abort_on_failure=*/false);
  };
  int completed_by_load = 0, old_seen = 0, new_seen = 0;
  auto check = [&](const testing::CrashPoint& point) {
    if (point.completed) {
      ASSERT_TRUE(point.status.ok()) << point.status;
    }
    // A journal there records a decided commit: the load completes it
    // (under the directory's lock) and finds the new checkpoint.
    const std::string journal = dir + "/" + kHfCommitJournalName;
    const bool pending = std::filesystem::exists(journal);
    StateDict loaded = ZerosLike(old_state);
    absl::Status status = LoadHf(dir, loaded);
    ASSERT_TRUE(status.ok())
        << "crash at call " << point.call << ": " << status;
    if (pending) {
      ++completed_by_load;
      EXPECT_FALSE(std::filesystem::exists(journal));
      EXPECT_TRUE(LoadsAs(dir, new_state)) << "crash at call " << point.call;
    }
    const bool is_old = LoadsAs(dir, old_state);
    const bool is_new = LoadsAs(dir, new_state);
    EXPECT_TRUE(is_old || is_new) << "crash at call " << point.call;
    old_seen += is_old;
    new_seen += is_new;
  };
  testing::ForEachCrashPoint(prepare, save, check);
  EXPECT_GT(completed_by_load, 0);
  EXPECT_GT(old_seen, 0);
  EXPECT_GT(new_seen, 0);
}

// A distributed save replaces the shards of the checkpoint there, whether
// they lie in the directory (PyTorch's writer, or more ranks than this
// save has) or in sharded/ (a consolidated save): none is left to be read
// beside the new ones.
TEST(HfCheckpoint, ADistributedSaveReplacesEveryEarlierShard) {
  const std::string dir = MakeTempDir("hf_replace_shards");
  HuggingFaceStorageWriterOptions options;
  options.save_distributed = true;
  const StateDict old_state = SmallState(1);
  ASSERT_TRUE(SaveHf(dir, old_state, options).ok());
  // What a save of two ranks, and a consolidated one, left.
  std::filesystem::copy_file(JoinPath(dir, HfFileName(1, 1, 1)),
                             JoinPath(dir, HfFileName(1, 1, 2)));
  std::filesystem::create_directory(JoinPath(dir, kHfShardedDirName));
  std::filesystem::copy_file(
      JoinPath(dir, HfFileName(1, 1, 1)),
      JoinPath(JoinPath(dir, kHfShardedDirName), HfFileName(1, 1, 1)));
  const StateDict new_state = SmallState(2);
  ASSERT_TRUE(SaveHf(dir, new_state, options).ok());
  EXPECT_EQ(AllFiles(dir), (std::set<std::string>{HfFileName(1, 1, 1)}));
  EXPECT_TRUE(LoadsAs(dir, new_state));
  // Consolidated: the full tensors and the index, its shards in sharded/.
  options.enable_consolidation = true;
  const StateDict third = SmallState(3);
  ASSERT_TRUE(SaveHf(dir, third, options).ok());
  EXPECT_EQ(AllFiles(dir),
            (std::set<std::string>{
                HfFileName(1, 1), kHfIndexFileName,
                absl::StrCat(kHfShardedDirName, "/", HfFileName(1, 1, 1))}));
  EXPECT_TRUE(LoadsAs(dir, third));
}

}  // namespace
}  // namespace dcp
