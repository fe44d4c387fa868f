// `dcp convert` (tools/convert.h): dcp -> Hugging Face -> dcp is bit for bit
// for every dtype safetensors holds, with tensors split into row windows
// and files; a checkpoint saved by three ranks converts to full tensors;
// --dtype converts floating tensors only; bad arguments are named.
#include "tools/convert.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "comm/process_group_factory.h"
#include "core/state_dict.h"
#include "engine/checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file_system_storage.h"
#include "io/hf_storage.h"
#include "io/mega_storage.h"
#include "io/quantized_dequant.h"
#include "io/safetensors.h"
#include "io/testing/metadata_surgery.h"
#include "nlohmann/json.hpp"
#include "tests/comm/multiprocess.h"
#include "tests/test_util.h"

namespace dcp {
namespace {

using ::dcp::testing::ListFiles;
using ::dcp::testing::MakeTempDir;
using ::dcp::testing::SeededTensor;
using ::testing::HasSubstr;
using Json = nlohmann::json;

absl::Status SaveDcp(const StateDict& state, const std::string& dir) {
  SaveOptions save;
  save.checkpoint_id = dir;
  save.no_dist = true;
  return Save(state, save).status();
}

StateDict ZerosLike(const StateDict& state) {
  StateDict out;
  for (const auto& [name, value] : state) {
    out[name] = Tensor::Empty(value.tensor().dtype(), value.tensor().sizes());
    // An empty tensor has no memory (data() is null): memset of null is
    // undefined even for 0 bytes.
    if (out[name].tensor().nbytes() > 0) {
      std::memset(out[name].tensor().data(), 0, out[name].tensor().nbytes());
    }
  }
  return out;
}

absl::Status LoadDcp(StateDict& state, const std::string& dir) {
  LoadOptions load;
  load.checkpoint_id = dir;
  load.no_dist = true;
  return Load(state, load);
}

absl::Status LoadHf(StateDict& state, const std::string& dir) {
  HuggingFaceStorageReader reader(dir);
  LoadOptions load;
  load.storage_reader = &reader;
  load.no_dist = true;
  return Load(state, load);
}

ConvertOptions Options(const std::string& to) {
  ConvertOptions options;
  options.to = to;
  options.threads = 2;
  return options;
}

TEST(Convert, RoundTripIsBitIdenticalForEveryDtype) {
  StateDict state;
  uint64_t seed = 1;
  for (DType dtype :
       {DType::kBool, DType::kU8, DType::kI8, DType::kU16, DType::kI16,
        DType::kU32, DType::kI32, DType::kU64, DType::kI64, DType::kF16,
        DType::kBF16, DType::kF32, DType::kF64, DType::kF8E4M3, DType::kF8E5M2,
        DType::kC64}) {
    const std::string name(DTypeName(dtype));
    state[name + ".rows"] = SeededTensor(dtype, {37, 11}, seed++);
    state[name + ".scalar"] = SeededTensor(dtype, {}, seed++);
  }
  state["empty"] = SeededTensor(DType::kF32, {0, 4}, seed++);
  state["big"] = SeededTensor(DType::kF32, {300, 129}, seed++);
  const std::string root = MakeTempDir("convert");
  const std::string src = root + "/src", hf = root + "/hf",
                    back = root + "/back";
  ASSERT_TRUE(SaveDcp(state, src).ok());

  ConvertOptions options = Options("safetensors");
  options.max_shard_bytes = 40000;  // Several files; "big" alone is 154800.
  options.buffer_bytes = 20000;     // "big" in windows of 38 rows.
  ASSERT_TRUE(RunConvert(src, hf, options).ok());

  // Files the index names, each a valid safetensors file; nothing else.
  std::ifstream in(hf + "/" + kHfIndexFileName);
  std::stringstream text;
  text << in.rdbuf();
  const Json index = Json::parse(text.str());
  std::set<std::string> named;
  for (const auto& [tensor, file] : index["weight_map"].items()) {
    named.insert(file.get<std::string>());
  }
  EXPECT_GE(named.size(), 3u);  // "big" alone in one.
  std::set<std::string> expected = named;
  expected.insert(kHfIndexFileName);
  EXPECT_EQ(ListFiles(hf), expected);
  EXPECT_EQ(index["weight_map"].size(), state.size());
  for (const std::string& file : named) {
    std::ifstream f(hf + "/" + file, std::ios::binary);
    std::stringstream bytes;
    bytes << f.rdbuf();
    absl::StatusOr<SafetensorsHeader> header =
        ParseSafetensors(bytes.str(), file);
    ASSERT_TRUE(header.ok()) << header.status();
    EXPECT_EQ(header->metadata.at("format"), "pt");
  }
  StateDict from_hf = ZerosLike(state);
  ASSERT_TRUE(LoadHf(from_hf, hf).ok());
  for (const auto& [name, value] : state) {
    EXPECT_TRUE(from_hf[name].tensor().BytesEqual(value.tensor())) << name;
  }

  ASSERT_TRUE(RunConvert(hf, back, Options("dcp")).ok());
  StateDict loaded = ZerosLike(state);
  ASSERT_TRUE(LoadDcp(loaded, back).ok());
  for (const auto& [name, value] : state) {
    EXPECT_TRUE(loaded[name].tensor().BytesEqual(value.tensor())) << name;
  }
}

TEST(Convert, CheckpointOfThreeRanksBecomesFullTensors) {
  const std::string root = MakeTempDir("convert3");
  const std::string src = root + "/src", hf = root + "/hf";
  const std::string rendezvous = root + "/rdv";
  std::filesystem::create_directories(rendezvous);
  const Tensor w = SeededTensor(DType::kBF16, {9, 70}, 7);
  const Tensor b = SeededTensor(DType::kI64, {12}, 8);
  std::vector<testing::RankExit> exits = testing::RunRanks(
      3,
      [&](int rank) {
        comm::RendezvousInfo info;
        info.rank = rank;
        info.world_size = 3;
        info.store =
            comm::StoreAddress{comm::StoreAddress::Kind::kFile, rendezvous};
        comm::ProcessGroupOptions group_options;
        group_options.backend = comm::Backend::kGloo;
        group_options.timeout = absl::Seconds(30);
        group_options.connect_timeout = absl::Seconds(30);
        auto group = comm::CreateProcessGroup(info, group_options);
        if (int rc =
                testing::Check(group.ok(), rank, group.status().ToString())) {
          return rc;
        }
        // Rows [3r, 3r + 3) of w, elements [4r, 4r + 4) of b.
        Tensor rows = Tensor::Empty(DType::kBF16, {3, 70});
        std::memcpy(rows.data(),
                    static_cast<const char*>(w.data()) + rank * 3 * 70 * 2,
                    rows.nbytes());
        Tensor part = Tensor::Empty(DType::kI64, {4});
        std::memcpy(part.data(),
                    static_cast<const char*>(b.data()) + rank * 4 * 8,
                    part.nbytes());
        StateDict state;
        state["w"] =
            ShardedTensor(DType::kBF16, {9, 70}, {Shard{{rank * 3, 0}, rows}});
        state["b"] =
            ShardedTensor(DType::kI64, {12}, {Shard{{rank * 4}, part}});
        SaveOptions save;
        save.checkpoint_id = src;
        save.process_group = group->get();
        absl::Status saved = Save(state, save).status();
        return testing::Check(saved.ok(), rank, saved.ToString());
      },
      absl::Seconds(90));
  for (const testing::RankExit& exit : exits) {
    ASSERT_TRUE(exit.exited && exit.exit_code == 0);
  }
  ConvertOptions options = Options("safetensors");
  options.buffer_bytes = 300;  // w in windows of two rows.
  ASSERT_TRUE(RunConvert(src, hf, options).ok());
  StateDict loaded;
  loaded["w"] = Tensor::Empty(DType::kBF16, {9, 70});
  loaded["b"] = Tensor::Empty(DType::kI64, {12});
  ASSERT_TRUE(LoadHf(loaded, hf).ok());
  EXPECT_TRUE(loaded["w"].tensor().BytesEqual(w));
  EXPECT_TRUE(loaded["b"].tensor().BytesEqual(b));
}

TEST(Convert, DtypeConvertsFloatingTensorsOnly) {
  const std::vector<float> values = {1.0f, 1.00390625f, 3.14159f, -2.5f};
  Tensor f32 = Tensor::Empty(DType::kF32, {4});
  std::memcpy(f32.data(), values.data(), 16);
  StateDict state;
  state["f32"] = f32;
  state["i32"] = SeededTensor(DType::kI32, {5}, 3);
  const std::string root = MakeTempDir("convert_dtype");
  ASSERT_TRUE(SaveDcp(state, root + "/src").ok());
  ConvertOptions options = Options("safetensors");
  options.dtype = DType::kBF16;
  ASSERT_TRUE(RunConvert(root + "/src", root + "/hf", options).ok());
  StateDict hf;
  hf["f32"] = Tensor::Empty(DType::kBF16, {4});
  hf["i32"] = Tensor::Empty(DType::kI32, {5});
  ASSERT_TRUE(LoadHf(hf, root + "/hf").ok());
  std::vector<uint16_t> bf16(4);
  std::memcpy(bf16.data(), hf["f32"].tensor().data(), 8);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(bf16[i], FloatToBf16(values[i])) << i;
  EXPECT_EQ(bf16[1], 0x3f80);  // The tie rounds to even: 1.0.
  EXPECT_TRUE(hf["i32"].tensor().BytesEqual(state["i32"].tensor()));

  // Back to dcp as f32: the bf16 values, exactly.
  options = Options("dcp");
  options.dtype = DType::kF32;
  ASSERT_TRUE(RunConvert(root + "/hf", root + "/back", options).ok());
  StateDict back;
  back["f32"] = Tensor::Empty(DType::kF32, {4});
  back["i32"] = Tensor::Empty(DType::kI32, {5});
  ASSERT_TRUE(LoadDcp(back, root + "/back").ok());
  std::vector<float> got(4);
  std::memcpy(got.data(), back["f32"].tensor().data(), 16);
  EXPECT_EQ(got, (std::vector<float>{1.0f, 1.0f, 3.140625f, -2.5f}));
  EXPECT_TRUE(back["i32"].tensor().BytesEqual(state["i32"].tensor()));
}

// Hugging Face -> dcp streams: with a small buffer every tensor larger than
// it is saved as several row chunks, one batch of windows after another
// (here one written per batch), and the checkpoint loads bit for bit, also
// converted to another dtype; only .metadata and the data files it names
// are left.
TEST(Convert, ToDcpStreamsInBatchesOfTheBuffer) {
  StateDict state;
  state["big"] = SeededTensor(DType::kBF16, {300, 129}, 11);  // 77400 bytes.
  state["i64"] = SeededTensor(DType::kI64, {1000}, 12);       // 8000 bytes.
  state["scalar"] = SeededTensor(DType::kF32, {}, 13);
  state["empty"] = SeededTensor(DType::kF16, {0, 3}, 14);
  state["f32"] = SeededTensor(DType::kF32, {7, 5}, 15);
  const std::string root = MakeTempDir("convert_stream");
  const std::string src = root + "/src", hf = root + "/hf",
                    back = root + "/back", wide = root + "/wide";
  ASSERT_TRUE(SaveDcp(state, src).ok());
  ASSERT_TRUE(RunConvert(src, hf, Options("safetensors")).ok());

  ConvertOptions options = Options("dcp");
  options.buffer_bytes = 10000;  // "big" in windows of 38 rows.
  ASSERT_TRUE(RunConvert(hf, back, options).ok());
  StateDict loaded = ZerosLike(state);
  ASSERT_TRUE(LoadDcp(loaded, back).ok());
  for (const auto& [name, value] : state) {
    EXPECT_TRUE(loaded[name].tensor().BytesEqual(value.tensor())) << name;
  }
  FileSystemReader reader(back);
  absl::StatusOr<Metadata> metadata = reader.ReadMetadata();
  ASSERT_TRUE(metadata.ok()) << metadata.status();
  const auto& big =
      std::get<TensorStorageMetadata>(metadata->state_dict_metadata.at("big"));
  EXPECT_EQ(big.chunks.size(), 8u);  // ceil(300 / 38).
  std::set<std::string> expected{".metadata"};
  for (const auto& [index, info] : metadata->storage_data) {
    expected.insert(info.relative_path);
  }
  EXPECT_GE(expected.size(), 9u);  // Batches write files of their own.
  EXPECT_EQ(ListFiles(back), expected);

  // To f32: the floating tensors widen exactly, the integers are kept.
  options.dtype = DType::kF32;
  ASSERT_TRUE(RunConvert(hf, wide, options).ok());
  StateDict widened;
  widened["big"] = Tensor::Empty(DType::kF32, {300, 129});
  widened["i64"] = Tensor::Empty(DType::kI64, {1000});
  widened["scalar"] = Tensor::Empty(DType::kF32, {});
  widened["empty"] = Tensor::Empty(DType::kF32, {0, 3});
  widened["f32"] = Tensor::Empty(DType::kF32, {7, 5});
  ASSERT_TRUE(LoadDcp(widened, wide).ok());
  const auto* bf16 = static_cast<const uint16_t*>(state["big"].tensor().data());
  const auto* f32 = static_cast<const float*>(widened["big"].tensor().data());
  for (int64_t i = 0; i < 300 * 129; ++i) {
    const uint32_t bits = uint32_t{bf16[i]} << 16;
    float expect;
    std::memcpy(&expect, &bits, 4);
    if (std::isnan(expect)) {
      ASSERT_TRUE(std::isnan(f32[i])) << i;
    } else {
      ASSERT_EQ(f32[i], expect) << i;
    }
  }
  EXPECT_TRUE(widened["i64"].tensor().BytesEqual(state["i64"].tensor()));
  EXPECT_TRUE(widened["f32"].tensor().BytesEqual(state["f32"].tensor()));
  EXPECT_TRUE(widened["scalar"].tensor().BytesEqual(state["scalar"].tensor()));
}

// Rows wider than the buffer are read in windows inside the row (runs of
// the first dimension whose slices fit), both ways, bit for bit.
TEST(Convert, RowsWiderThanTheBufferGoInWindowsInsideTheRow) {
  StateDict state;
  state["wide"] = SeededTensor(DType::kF32, {2, 3000}, 21);  // 12000 B rows.
  state["cube"] = SeededTensor(DType::kBF16, {2, 3, 2500}, 22);  // 15000 B.
  state["small"] = SeededTensor(DType::kI32, {5}, 23);
  const std::string root = MakeTempDir("convert_wide_rows");
  const std::string src = root + "/src", hf = root + "/hf",
                    back = root + "/back";
  ASSERT_TRUE(SaveDcp(state, src).ok());
  ConvertOptions options = Options("safetensors");
  options.buffer_bytes = 4000;
  ASSERT_TRUE(RunConvert(src, hf, options).ok());
  StateDict from_hf = ZerosLike(state);
  ASSERT_TRUE(LoadHf(from_hf, hf).ok());
  options.to = "dcp";
  ASSERT_TRUE(RunConvert(hf, back, options).ok());
  StateDict loaded = ZerosLike(state);
  ASSERT_TRUE(LoadDcp(loaded, back).ok());
  for (const auto& [name, value] : state) {
    EXPECT_TRUE(from_hf[name].tensor().BytesEqual(value.tensor())) << name;
    EXPECT_TRUE(loaded[name].tensor().BytesEqual(value.tensor())) << name;
  }
  absl::StatusOr<Metadata> metadata = FileSystemReader(back).ReadMetadata();
  ASSERT_TRUE(metadata.ok()) << metadata.status();
  auto chunks = [&](const std::string& name) {
    return std::get<TensorStorageMetadata>(
               metadata->state_dict_metadata.at(name))
        .chunks.size();
  };
  EXPECT_EQ(chunks("wide"), 6u);   // 3 runs of 1000 columns per row.
  EXPECT_EQ(chunks("cube"), 12u);  // 2000 + 500 elements per (i, j).
  EXPECT_EQ(chunks("small"), 1u);
}

// A MEGA checkpoint converts too, by its directory or its mega:// URI.
TEST(Convert, MegaCheckpointsConvertToSafetensors) {
  StateDict state;
  state["w"] = SeededTensor(DType::kBF16, {40, 7}, 41);
  state["s"] = SeededTensor(DType::kF32, {}, 42);
  const std::string root = MakeTempDir("convert_mega");
  MegaStorageWriter writer(root + "/mega");
  SaveOptions save;
  save.storage_writer = &writer;
  save.no_dist = true;
  ASSERT_TRUE(Save(state, save).ok());
  for (const std::string& src : {root + "/mega", "mega://" + root + "/mega"}) {
    SCOPED_TRACE(src);
    const std::string hf = root + "/hf" + std::to_string(src.size());
    ConvertOptions options = Options("safetensors");
    options.buffer_bytes = 100;  // w in windows of 7 rows.
    const absl::Status status = RunConvert(src, hf, options);
    ASSERT_TRUE(status.ok()) << status;
    StateDict loaded = ZerosLike(state);
    ASSERT_TRUE(LoadHf(loaded, hf).ok());
    for (const auto& [name, value] : state) {
      EXPECT_TRUE(loaded[name].tensor().BytesEqual(value.tensor())) << name;
    }
  }
}

// A tensor its chunks do not cover (a crafted shape, grown past its only
// chunk: `dcp verify` passes it) is refused before anything is written,
// instead of sizing a window from the claimed shape.
TEST(Convert, TensorItsChunksDoNotCoverIsDataLossAndWritesNothing) {
  StateDict state;
  state["a"] = SeededTensor(DType::kF32, {3, 4}, 31);
  state["b"] = SeededTensor(DType::kF32, {2}, 32);
  const std::string root = MakeTempDir("convert_uncovered");
  const std::string src = root + "/src", dst = root + "/dst";
  ASSERT_TRUE(SaveDcp(state, src).ok());
  ASSERT_TRUE(dcp::testing::RewriteMetadataFile(src, [](format::Metadata& p) {
                p.set_tensor_size(1, int64_t{1} << 38);  // a: [3, 2^38].
              }).ok());
  absl::Status status = RunConvert(src, dst, Options("safetensors"));
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(
      status.message(),
      HasSubstr(src + ": tensor a has shape [3, 274877906944] but its chunks "
                      "hold 12 of its 824633720832 elements"));
  EXPECT_FALSE(std::filesystem::exists(dst));
}

TEST(Convert, PrefixExportsTheTensorsUnderItWithoutIt) {
  StateDict state;
  state["model.layers.0.weight"] = SeededTensor(DType::kBF16, {64, 33}, 1);
  state["model.norm"] = SeededTensor(DType::kF32, {33}, 2);
  state["optim.state.model.norm.exp_avg"] = SeededTensor(DType::kF32, {33}, 3);
  state["model_extra"] = SeededTensor(DType::kF32, {2}, 4);
  state["model.step"] = int64_t{7};
  const std::string root = MakeTempDir("convert_prefix");
  ASSERT_TRUE(SaveDcp(state, root + "/src").ok());
  ConvertOptions options = Options("safetensors");
  options.prefix = "model";
  options.buffer_bytes = 1000;  // Windows: the source names them in full.
  ASSERT_TRUE(RunConvert(root + "/src", root + "/hf", options).ok());
  StateDict from_hf;
  from_hf["layers.0.weight"] = SeededTensor(DType::kBF16, {64, 33}, 9);
  from_hf["norm"] = SeededTensor(DType::kF32, {33}, 9);
  ASSERT_TRUE(LoadHf(from_hf, root + "/hf").ok());
  EXPECT_TRUE(from_hf["layers.0.weight"].tensor().BytesEqual(
      state["model.layers.0.weight"].tensor()));
  EXPECT_TRUE(
      from_hf["norm"].tensor().BytesEqual(state["model.norm"].tensor()));
  std::ifstream in(root + "/hf/" + kHfIndexFileName);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(Json::parse(text.str())["weight_map"].size(), 2u);

  options.prefix = "absent";
  absl::Status status = RunConvert(root + "/src", root + "/none", options);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("holds no tensors named absent.*"));
  EXPECT_FALSE(std::filesystem::exists(root + "/none"));
  EXPECT_THAT(ParseConvertFlags("dcp", "", "", 1, "model").status().message(),
              HasSubstr("--prefix"));
  EXPECT_THAT(
      ParseConvertFlags("safetensors", "", "", 1, "model.").status().message(),
      HasSubstr("--prefix \"model.\""));
  EXPECT_THAT(ParseConvertFlags("safetensors", "", "", 1, "optim..state")
                  .status()
                  .message(),
              HasSubstr("--prefix \"optim..state\""));
}

TEST(Convert, BadArgumentsAreNamed) {
  auto message = [](const absl::StatusOr<ConvertOptions>& r) {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(r.status().message());
  };
  EXPECT_THAT(message(ParseConvertFlags("hf", "", "", 1)), HasSubstr("--to"));
  EXPECT_THAT(message(ParseConvertFlags("dcp", "5XB", "", 1)),
              HasSubstr("--max-shard-size \"5XB\""));
  EXPECT_THAT(message(ParseConvertFlags("dcp", "0", "", 1)),
              HasSubstr("--max-shard-size"));
  EXPECT_THAT(message(ParseConvertFlags("dcp", "", "f8", 1)),
              HasSubstr("--dtype must be bf16, f16 or f32, not \"f8\""));
  EXPECT_THAT(message(ParseConvertFlags("dcp", "", "", 0)),
              HasSubstr("--threads"));
  absl::StatusOr<ConvertOptions> ok =
      ParseConvertFlags("safetensors", "500MiB", "BF16", 3);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->max_shard_bytes, int64_t{500} << 20);
  EXPECT_EQ(ok->dtype, DType::kBF16);

  const std::string root = MakeTempDir("convert_bad");
  StateDict state;
  state["c"] = SeededTensor(DType::kC128, {2}, 1);
  ASSERT_TRUE(SaveDcp(state, root + "/c128").ok());
  absl::Status status =
      RunConvert(root + "/c128", root + "/out", Options("safetensors"));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("tensor c"));
  EXPECT_THAT(status.message(), HasSubstr("C128"));

  status =
      RunConvert(root + "/nothing", root + "/out2", Options("safetensors"));
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  status = RunConvert(root + "/nothing", root + "/out3", Options("dcp"));
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;

  state["c"] = SeededTensor(DType::kF32, {2}, 1);
  ASSERT_TRUE(SaveDcp(state, root + "/f32").ok());
  std::filesystem::create_directories(root + "/full");
  std::ofstream(root + "/full/keep") << "x";
  status = RunConvert(root + "/f32", root + "/full", Options("safetensors"));
  EXPECT_EQ(status.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(status.message(), HasSubstr(root + "/full"));
  EXPECT_EQ(ListFiles(root + "/full"), std::set<std::string>{"keep"});
  status =
      RunConvert(root + "/f32", root + "/full/keep", Options("safetensors"));
  EXPECT_EQ(status.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(status.message(),
              HasSubstr(root + "/full/keep is a file, not a directory"));
}

}  // namespace
}  // namespace dcp
