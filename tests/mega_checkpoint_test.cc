// MEGA checkpoints through the public API (dcp::Save / dcp::Load with
// MegaStorageWriter / MegaStorageReader, and with mega:// checkpoint ids):
// every dtype and non-tensor values, the file layout (magic, 4 KiB aligned
// entries), file mappings, resharded slice loads, corrupted headers,
// truncated shards, wrong indexes and data, and that failures and crashes
// at any I/O step of a save leave the old checkpoint or the new one.
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/state_dict.h"
#include "engine/checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/fault_injection.h"
#include "io/mega_format.h"
#include "io/mega_storage.h"
#include "io/testing/fake_planners.h"
#include "nlohmann/json.hpp"
#include "tests/crash_points.h"
#include "tests/test_util.h"

namespace dcp {
namespace {

using ::dcp::testing::ListFiles;
using ::dcp::testing::MakeTempDir;
using ::dcp::testing::SeededTensor;
using ::testing::AllOf;
using ::testing::HasSubstr;
using Json = nlohmann::json;

absl::StatusOr<Metadata> SaveMega(const std::string& dir,
                                  const StateDict& state,
                                  MegaStorageWriterOptions options = {}) {
  MegaStorageWriter writer(dir, std::move(options));
  SaveOptions save;
  save.storage_writer = &writer;
  return Save(state, save);
}

absl::Status LoadMega(const std::string& dir, StateDict& state,
                      MegaStorageReaderOptions options = {}) {
  MegaStorageReader reader(dir, options);
  LoadOptions load;
  load.storage_reader = &reader;
  return Load(state, load);
}

// Empty tensors shaped like `state`'s; other values as they are.
StateDict EmptyLike(const StateDict& state) {
  StateDict out;
  for (const auto& [key, value] : state) {
    out[key] = value.is_tensor()
                   ? StateValue(Tensor::Empty(value.tensor().dtype(),
                                              value.tensor().sizes()))
                   : StateValue(int64_t{-1});
  }
  return out;
}

void ExpectEqualStates(const StateDict& want, const StateDict& got) {
  ASSERT_EQ(want.size(), got.size());
  for (const auto& [key, value] : want) {
    ASSERT_TRUE(got.contains(key)) << key;
    if (value.is_tensor()) {
      EXPECT_TRUE(value.tensor().BytesEqual(got.at(key).tensor())) << key;
    } else {
      EXPECT_EQ(value.int_value(), got.at(key).int_value()) << key;
    }
  }
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

MegaHeader HeaderOf(const std::string& path) {
  const std::string bytes = ReadAll(path);
  absl::StatusOr<MegaHeader> header =
      DecodeMegaHeader(bytes, static_cast<int64_t>(bytes.size()), path);
  EXPECT_TRUE(header.ok()) << header.status();
  return header.ok() ? *header : MegaHeader{};
}

// Every dtype dcp has, 0-d and zero-size tensors, a non-tensor value, and
// tensors large and oddly sized enough to take the O_DIRECT and bounce
// paths of the writer and reader.
StateDict EveryDTypeState(uint64_t seed) {
  StateDict state;
  for (int i = 0; i < kNumDTypes; ++i) {
    const DType dtype = static_cast<DType>(i);
    state[absl::StrCat("t.", DTypeName(dtype))] =
        SeededTensor(dtype, {3, 5}, seed + i);
  }
  state["t.scalar"] = SeededTensor(DType::kF64, {}, seed + 100);
  state["t.empty"] = SeededTensor(DType::kF32, {4, 0, 2}, seed + 101);
  state["t.odd"] = SeededTensor(DType::kU8, {4097}, seed + 102);
  state["t.large"] = SeededTensor(DType::kF32, {300, 1000}, seed + 103);
  state["t.large_bf16"] = SeededTensor(DType::kBF16, {513, 1025}, seed + 104);
  state["step"] = int64_t{1234567} + static_cast<int64_t>(seed);
  return state;
}

class MegaRoundTrip : public ::testing::TestWithParam<bool> {};

TEST_P(MegaRoundTrip, EveryDTypeAndTheFileLayout) {
  const bool direct = GetParam();
  const std::string dir = MakeTempDir("mega_roundtrip");
  const StateDict saved = EveryDTypeState(7);
  MegaStorageWriterOptions writer_options;
  writer_options.direct_io = direct;
  writer_options.checksum_block_size = 64 << 10;  // Several blocks.
  absl::StatusOr<Metadata> metadata = SaveMega(dir, saved, writer_options);
  ASSERT_TRUE(metadata.ok()) << metadata.status();
  EXPECT_EQ(ListFiles(dir),
            (std::set<std::string>{kMegaSingleFileName, kMegaIndexFileName}));
  StateDict loaded = EmptyLike(saved);
  MegaStorageReaderOptions reader_options;
  reader_options.direct_io = direct;
  ASSERT_TRUE(LoadMega(dir, loaded, reader_options).ok());
  ExpectEqualStates(saved, loaded);

  // The file: magic and version first, every entry 4 KiB aligned with the
  // value's bytes, checksums per 64 KiB block.
  const std::string path = JoinPath(dir, kMegaSingleFileName);
  const std::string bytes = ReadAll(path);
  EXPECT_EQ(bytes.substr(0, kMegaMagicBytes),
            std::string(kMegaMagic, kMegaMagicBytes));
  const MegaHeader header = HeaderOf(path);
  EXPECT_EQ(header.data_start % kMegaAlignment, 0);
  EXPECT_EQ(header.checksum_block_size, 64 << 10);
  ASSERT_EQ(header.entries.size(), saved.size());
  for (const MegaEntry& e : header.entries) {
    EXPECT_EQ((header.data_start + e.begin) % kMegaAlignment, 0) << e.name;
    EXPECT_EQ(e.checksums.size(), (e.length + (64 << 10) - 1) / (64 << 10));
    if (!e.is_tensor) {
      EXPECT_EQ(e.name, "step");
      continue;
    }
    const Tensor& want = saved.at(e.name).tensor();
    EXPECT_EQ(e.dtype, want.dtype()) << e.name;
    EXPECT_EQ(e.shape, want.sizes()) << e.name;
    EXPECT_EQ(std::string(bytes, header.data_start + e.begin, want.nbytes()),
              std::string(static_cast<const char*>(want.data()), want.nbytes()))
        << e.name;
    // Save's metadata says where each tensor is.
    const StorageInfo& info =
        metadata->storage_data.at(MetadataIndex(e.name, e.offsets));
    EXPECT_EQ(info.relative_path, kMegaSingleFileName);
    EXPECT_EQ(info.offset, header.data_start + e.begin);
    EXPECT_EQ(info.block_checksums, e.checksums);
  }
  const Json index = Json::parse(ReadAll(JoinPath(dir, kMegaIndexFileName)));
  EXPECT_EQ(index["format"], "mega");
  EXPECT_EQ(index["weight_map"].size(), saved.size());
  EXPECT_EQ(index["weight_map"]["t.BF16"], Json::array({kMegaSingleFileName}));
}

INSTANTIATE_TEST_SUITE_P(DirectIo, MegaRoundTrip, ::testing::Bool());

TEST(MegaCheckpoint, FqnToIndexMappingChoosesTheFiles) {
  const std::string dir = MakeTempDir("mega_mapping");
  StateDict saved;
  saved["a"] = SeededTensor(DType::kF32, {10}, 1);
  saved["b"] = SeededTensor(DType::kI64, {3, 3}, 2);
  saved["c"] = SeededTensor(DType::kBF16, {7}, 3);
  MegaStorageWriterOptions options;
  options.fqn_to_index_mapping = {{"a", 1}, {"b", 2}, {"c", 2}};
  ASSERT_TRUE(SaveMega(dir, saved, options).ok());
  EXPECT_EQ(ListFiles(dir), (std::set<std::string>{"model-00001-of-00002.mega",
                                                   "model-00002-of-00002.mega",
                                                   kMegaIndexFileName}));
  const Json index = Json::parse(ReadAll(JoinPath(dir, kMegaIndexFileName)));
  EXPECT_EQ(index["weight_map"]["b"],
            Json::array({"model-00002-of-00002.mega"}));
  EXPECT_EQ(index["metadata"]["total_size"], 40 + 72 + 14);
  StateDict loaded = EmptyLike(saved);
  ASSERT_TRUE(LoadMega(dir, loaded).ok());
  ExpectEqualStates(saved, loaded);

  // A value the mapping lacks is named.
  saved["d"] = SeededTensor(DType::kU8, {1}, 4);
  absl::StatusOr<Metadata> missing = SaveMega(dir, saved, options);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(), HasSubstr("\"d\""));
  // A re-save with one file replaces both (and only MEGA files).
  WriteAll(JoinPath(dir, "config.json"), "{}");
  saved.erase("d");
  ASSERT_TRUE(SaveMega(dir, saved).ok());
  EXPECT_EQ(ListFiles(dir),
            (std::set<std::string>{kMegaSingleFileName, kMegaIndexFileName,
                                   "config.json"}));
}

// Expected bytes of rows [r0, r0 + nr) and columns [c0, c0 + nc) of a
// row-major 2-d tensor.
Tensor Box(const Tensor& t, int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
  Tensor out = Tensor::Empty(t.dtype(), {nr, nc});
  const size_t es = ElementSize(t.dtype());
  for (int64_t r = 0; r < nr; ++r) {
    std::memcpy(static_cast<char*>(out.data()) + r * nc * es,
                static_cast<const char*>(t.data()) +
                    ((r0 + r) * t.sizes()[1] + c0) * es,
                nc * es);
  }
  return out;
}

TEST(MegaCheckpoint, ReshardedLoadsReadTheirSlice) {
  const std::string dir = MakeTempDir("mega_reshard");
  const Tensor w = SeededTensor(DType::kF32, {256, 512}, 5);
  StateDict saved;
  saved["w"] = w;
  MegaStorageWriterOptions writer_options;
  writer_options.checksum_block_size = 16 << 10;
  ASSERT_TRUE(SaveMega(dir, saved, writer_options).ok());
  for (bool direct : {false, true}) {
    MegaStorageReaderOptions options;
    options.direct_io = direct;
    options.read_window_bytes = 64 << 10;  // Several windows.
    StateDict parts;
    parts["w"] = ShardedTensor(
        DType::kF32, {256, 512},
        {Shard{{64, 0}, Tensor::Empty(DType::kF32, {64, 512})},
         Shard{{200, 300}, Tensor::Empty(DType::kF32, {30, 212})}});
    ASSERT_TRUE(LoadMega(dir, parts, options).ok());
    const auto& shards = parts["w"].sharded_tensor().local_shards();
    EXPECT_TRUE(shards[0].tensor.BytesEqual(Box(w, 64, 64, 0, 512)));
    EXPECT_TRUE(shards[1].tensor.BytesEqual(Box(w, 200, 30, 300, 212)));
  }
}

// A checkpoint saved as row chunks by "two ranks" (two writers driven by
// hand, one file per rank) loads whole and as other slices.
TEST(MegaCheckpoint, ChunksOfTwoWritersLoadWholeAndResharded) {
  const std::string dir = MakeTempDir("mega_chunks");
  const Tensor w = SeededTensor(DType::kBF16, {10, 6}, 9);
  testing::FakeSavePlanner rank0, rank1;
  rank0.AddShard("w", {10, 6}, {0, 0}, Box(w, 0, 4, 0, 6));
  rank1.AddShard("w", {10, 6}, {4, 0}, Box(w, 4, 6, 0, 6));
  MegaStorageWriter w0(dir), w1(dir);
  ASSERT_TRUE(w0.SetUp(true, 0, true).ok());
  ASSERT_TRUE(w1.SetUp(false, 1, true).ok());
  absl::StatusOr<std::vector<SavePlan>> plans =
      w0.PrepareGlobalPlan({rank0.Plan(), rank1.Plan()});
  ASSERT_TRUE(plans.ok()) << plans.status();
  auto r0 = w0.WriteData((*plans)[0], rank0).Wait();
  auto r1 = w1.WriteData((*plans)[1], rank1).Wait();
  ASSERT_TRUE(r0.ok() && r1.ok());
  Metadata global = rank0.GlobalMetadata();
  ASSERT_TRUE(w0.Finish(global, {*r0, *r1}).ok());
  ASSERT_TRUE(w0.MarkCommitted().ok());
  EXPECT_EQ(ListFiles(dir), (std::set<std::string>{"model-00001-of-00002.mega",
                                                   "model-00002-of-00002.mega",
                                                   kMegaIndexFileName}));
  StateDict whole;
  whole["w"] = Tensor::Empty(DType::kBF16, {10, 6});
  ASSERT_TRUE(LoadMega(dir, whole).ok());
  EXPECT_TRUE(whole["w"].tensor().BytesEqual(w));
  StateDict cols;
  cols["w"] =
      ShardedTensor(DType::kBF16, {10, 6},
                    {Shard{{0, 2}, Tensor::Empty(DType::kBF16, {10, 3})}});
  ASSERT_TRUE(LoadMega(dir, cols).ok());
  EXPECT_TRUE(cols["w"].sharded_tensor().local_shards()[0].tensor.BytesEqual(
      Box(w, 0, 10, 2, 3)));
}

TEST(MegaCheckpoint, URIsAndPlainPathsNameTheDirectory) {
  const std::string dir = MakeTempDir("mega_uri");
  StateDict saved;
  saved["x"] = SeededTensor(DType::kI32, {17}, 3);
  // mega:///abs/dir, no storage writer: the registry picks MEGA.
  SaveOptions save;
  save.checkpoint_id = absl::StrCat("mega://", dir);
  ASSERT_EQ(dir.front(), '/');
  ASSERT_TRUE(Save(saved, save).ok());
  EXPECT_EQ(ListFiles(dir),
            (std::set<std::string>{kMegaSingleFileName, kMegaIndexFileName}));
  // mega://rel/dir (relative to the working directory).
  const std::string rel =
      std::filesystem::relative(dir, std::filesystem::current_path());
  StateDict loaded = EmptyLike(saved);
  LoadOptions load;
  load.checkpoint_id = absl::StrCat("mega://", rel);
  ASSERT_TRUE(Load(loaded, load).ok());
  ExpectEqualStates(saved, loaded);
  // A plain path holding a MEGA index loads as MEGA.
  loaded = EmptyLike(saved);
  load.checkpoint_id = dir;
  ASSERT_TRUE(Load(loaded, load).ok());
  ExpectEqualStates(saved, loaded);
  // The writer and reader take URIs too; "mega://" alone names nothing.
  loaded = EmptyLike(saved);
  ASSERT_TRUE(LoadMega(absl::StrCat("mega://", dir), loaded).ok());
  EXPECT_EQ(MegaPathFromId("mega://").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MegaPathFromId("s3://bucket").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*MegaPathFromId("mega://a/b"), "a/b");
  EXPECT_EQ(*MegaPathFromId("mega:///a/b"), "/a/b");
}

// A directory whose files were tampered with: each a clear error naming
// the file (and the tensor).
TEST(MegaCheckpoint, DamagedFilesAreClearErrors) {
  const std::string dir = MakeTempDir("mega_damaged");
  StateDict saved;
  saved["a"] = SeededTensor(DType::kF32, {1000}, 1);
  saved["b"] = SeededTensor(DType::kF16, {3000}, 2);
  MegaStorageWriterOptions options;
  options.fqn_to_index_mapping = {{"a", 1}, {"b", 2}};
  ASSERT_TRUE(SaveMega(dir, saved, options).ok());
  const std::string file1 = JoinPath(dir, "model-00001-of-00002.mega");
  const std::string file2 = JoinPath(dir, "model-00002-of-00002.mega");
  const std::string index = JoinPath(dir, kMegaIndexFileName);
  const std::string good1 = ReadAll(file1), good_index = ReadAll(index);
  auto load = [&] {
    StateDict loaded = EmptyLike(saved);
    return LoadMega(dir, loaded);
  };
  auto expect = [&](absl::StatusCode code,
                    const std::vector<std::string>& parts) {
    absl::Status status = load();
    EXPECT_EQ(status.code(), code) << status;
    for (const std::string& part : parts) {
      EXPECT_THAT(status.message(), HasSubstr(part));
    }
  };
  // A byte of the JSON header.
  std::string bytes = good1;
  bytes[kMegaPreambleBytes + 5] ^= 0x20;
  WriteAll(file1, bytes);
  expect(absl::StatusCode::kDataLoss, {file1, "checksum"});
  // The magic.
  bytes = good1;
  bytes[1] = 'X';
  WriteAll(file1, bytes);
  expect(absl::StatusCode::kDataLoss, {file1, "magic"});
  // A later major version.
  bytes = good1;
  bytes[8] = 2;
  WriteAll(file1, bytes);
  expect(absl::StatusCode::kUnimplemented, {file1, "version 2"});
  // Truncated data, and a file cut inside its header.
  WriteAll(file1, good1.substr(0, good1.size() - 100));
  expect(absl::StatusCode::kDataLoss, {file1, "truncated"});
  WriteAll(file1, good1.substr(0, 20));
  expect(absl::StatusCode::kDataLoss, {file1});
  // A data byte: the native reader's checksum mismatch names the tensor.
  bytes = good1;
  bytes[bytes.size() - 1] ^= 1;
  WriteAll(file1, bytes);
  expect(absl::StatusCode::kDataLoss, {"checksum mismatch", "model-00001"});
  WriteAll(file1, good1);
  ASSERT_TRUE(load().ok());
  // The index maps a tensor to the wrong file, or lists a missing one.
  Json json = Json::parse(good_index);
  json["weight_map"]["b"] = Json::array({"model-00001-of-00002.mega"});
  WriteAll(index, json.dump());
  expect(absl::StatusCode::kDataLoss,
         {index, "\"b\"", "model-00002-of-00002.mega", "wrong index"});
  json = Json::parse(good_index);
  json["weight_map"]["ghost"] = Json::array({"model-00001-of-00002.mega"});
  WriteAll(index, json.dump());
  expect(absl::StatusCode::kDataLoss, {index, "\"ghost\""});
  json = Json::parse(good_index);
  json["files"].push_back("model-00009-of-00009.mega");
  WriteAll(index, json.dump());
  expect(absl::StatusCode::kDataLoss, {"model-00009-of-00009.mega"});
  json["files"] = Json::array({"../etc/passwd"});
  WriteAll(index, json.dump());
  expect(absl::StatusCode::kDataLoss, {"../etc/passwd"});
  WriteAll(index, "{not json");
  expect(absl::StatusCode::kDataLoss, {index, "JSON"});
  // No index: no checkpoint.
  std::filesystem::remove(index);
  expect(absl::StatusCode::kNotFound, {"no MEGA checkpoint", dir});
  std::filesystem::remove(file2);
}

StateDict SmallState(uint64_t seed) {
  StateDict state;
  state["a"] = SeededTensor(DType::kF32, {3000}, seed);
  state["b"] = SeededTensor(DType::kBF16, {5, 700}, seed + 1);
  state["c"] = SeededTensor(DType::kU8, {10}, seed + 2);
  return state;
}

std::set<std::string> AllFiles(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

bool LoadsAs(const std::string& dir, const StateDict& want) {
  StateDict loaded = EmptyLike(want);
  if (!LoadMega(dir, loaded).ok()) return false;
  for (const auto& [key, value] : want) {
    if (!value.tensor().BytesEqual(loaded.at(key).tensor())) return false;
  }
  return true;
}

// A failed call at every I/O step of a save (one at a time) leaves the old
// checkpoint, or, once the commit was decided, the new one; never a mix,
// and no file of the failed save behind.
TEST(MegaCheckpoint, AFailureAtAnyStepKeepsTheOldCheckpointOrTheNewOne) {
  for (bool direct : {false, true}) {
    const std::string dir = MakeTempDir("mega_faults");
    FaultInjectionFileSystem faulty(LocalFileSystem());
    MegaStorageWriterOptions options;
    options.file_system = &faulty;
    options.direct_io = direct;
    options.fqn_to_index_mapping = {{"a", 1}, {"b", 2}, {"c", 2}};
    const StateDict old_state = SmallState(1), new_state = SmallState(50);
    ASSERT_TRUE(SaveMega(dir, old_state, options).ok());
    const std::set<std::string> files = AllFiles(dir);
    int failures = 0, kept_old = 0;
    for (int64_t nth = 1;; ++nth) {
      const int64_t before = faulty.calls(FaultOp::kAny);
      faulty.Inject(Fault{FaultOp::kAny, EIO, dir, nth});
      absl::StatusOr<Metadata> saved = SaveMega(dir, new_state, options);
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
      ASSERT_TRUE(SaveMega(dir, old_state, options).ok());
    }
    EXPECT_GT(failures, 10);
    EXPECT_GT(kept_old, 5);
  }
}

TEST(MegaCheckpoint, OutOfSpaceKeepsTheOldCheckpoint) {
  const std::string dir = MakeTempDir("mega_enospc");
  FaultInjectionFileSystem faulty(LocalFileSystem());
  MegaStorageWriterOptions options;
  options.file_system = &faulty;
  const StateDict old_state = SmallState(1);
  ASSERT_TRUE(SaveMega(dir, old_state, options).ok());
  const std::set<std::string> files = AllFiles(dir);
  faulty.FailWritesAfter(5000);
  absl::StatusOr<Metadata> saved = SaveMega(dir, SmallState(9), options);
  faulty.ClearFaults();
  ASSERT_FALSE(saved.ok());
  EXPECT_EQ(saved.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(LoadsAs(dir, old_state));
  EXPECT_EQ(AllFiles(dir), files);
}

// A failed call (EIO) at each file-system call of a load in turn: the load
// fails naming the file (in the directory) it was at, or, for a call it can
// do without or one of describing the files (tried again: a commit may be
// renaming them), loads every byte; no file stays open.
TEST(MegaCheckpoint, AFailedCallAtAnyStepOfALoadIsAClearError) {
  const std::string dir = MakeTempDir("mega_load_faults");
  MegaStorageWriterOptions writer_options;
  writer_options.fqn_to_index_mapping = {{"a", 1}, {"b", 2}, {"c", 2}};
  writer_options.checksum_block_size = 4096;  // Several blocks a tensor.
  const StateDict saved = SmallState(3);
  ASSERT_TRUE(SaveMega(dir, saved, writer_options).ok());
  int failures = 0;
  int recovered = 0;
  for (int64_t nth = 1;; ++nth) {
    FaultInjectionFileSystem faulty(LocalFileSystem());
    faulty.Inject(Fault{FaultOp::kAny, EIO, "", nth});
    MegaStorageReaderOptions options;
    options.file_system = &faulty;
    options.thread_count = 2;
    StateDict loaded = EmptyLike(saved);
    absl::Status status = LoadMega(dir, loaded, options);
    EXPECT_EQ(faulty.open_files(), 0) << "call " << nth;
    if (faulty.calls(FaultOp::kAny) < nth) {  // No call failed.
      ASSERT_TRUE(status.ok()) << status;
      ExpectEqualStates(saved, loaded);
      break;
    }
    if (status.ok()) {  // Done without, or tried again.
      ExpectEqualStates(saved, loaded);
      ++recovered;
      continue;
    }
    ++failures;
    EXPECT_THAT(status.message(), HasSubstr(dir)) << "call " << nth;
  }
  EXPECT_GT(failures, 3);
  EXPECT_GT(failures + recovered, 5);
  EXPECT_TRUE(LoadsAs(dir, saved));
}

// A crash (the process dies at a file-system call, then the power goes)
// at every call of a save over an older checkpoint: the directory then
// loads as the old checkpoint, the new one, or is refused as an
// interrupted commit, which the next save's SetUp completes.
TEST(MegaCheckpoint, ACrashAtAnyPointIsRecovered) {
  const StateDict old_state = SmallState(1), new_state = SmallState(80);
  const std::string dir = MakeTempDir("mega_crash");
  MegaStorageWriterOptions options;
  options.fqn_to_index_mapping = {{"a", 1}, {"b", 2}, {"c", 2}};
  options.direct_io = false;  // The crash model drops unsynced bytes.
  auto planner_of = [](const StateDict& state) {
    testing::FakeSavePlanner planner;
    for (const auto& [key, value] : state) {
      planner.AddTensor(key, value.tensor());
    }
    return planner;
  };
  int completed_by_load = 0, old_seen = 0, new_seen = 0;
  const int64_t points = testing::ForEachCrashPoint(
      [&] {
        std::filesystem::remove_all(dir);
        ASSERT_TRUE(SaveMega(dir, old_state, options).ok());
      },
      [&](FileSystemBase& fs) {
        MegaStorageWriterOptions faulty = options;
        faulty.file_system = &fs;
        MegaStorageWriter writer(dir, faulty);
        testing::FakeSavePlanner planner = planner_of(new_state);
        return testing::SaveOneRank(writer, planner,
                                    /*abort_on_failure=*/false);
      },
      [&](const testing::CrashPoint& point) {
        // A journal there records a decided commit: the load completes it
        // (under the directory's lock) and finds the new checkpoint.
        const std::string journal = dir + "/" + kMegaCommitJournalName;
        const bool pending = std::filesystem::exists(journal);
        StateDict loaded = EmptyLike(old_state);
        absl::Status status = LoadMega(dir, loaded);
        ASSERT_TRUE(status.ok())
            << "crash at call " << point.call << ": " << status;
        if (pending) {
          ++completed_by_load;
          EXPECT_FALSE(std::filesystem::exists(journal));
          EXPECT_TRUE(LoadsAs(dir, new_state))
              << "crash at call " << point.call;
        }
        const bool is_old = LoadsAs(dir, old_state);
        const bool is_new = LoadsAs(dir, new_state);
        EXPECT_TRUE(is_old || is_new) << "crash at call " << point.call;
        if (point.completed) {
          EXPECT_TRUE(is_new) << point.status;
        }
        old_seen += is_old;
        new_seen += is_new;
      });
  EXPECT_GT(points, 10);
  EXPECT_GT(completed_by_load, 0);
  EXPECT_GT(old_seen, 0);
  EXPECT_GT(new_seen, 0);
}

}  // namespace
}  // namespace dcp
