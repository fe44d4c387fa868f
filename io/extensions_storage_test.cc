// FileSystemWriter/Reader with stream extensions (zstd): every dtype round
// trips bit for bit, compressible tensors shrink and incompressible ones are
// stored as they are, a resharded load decodes only the blocks it touches,
// unknown extensions and major versions fail naming the tensor and the
// descriptor, a corrupt compressed block is a checksum error naming the
// file and the tensor, and faults at the writes of encoded items keep the
// previous checkpoint.
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/extensions.h"
#include "io/fault_injection.h"
#include "io/file_system.h"
#include "io/file_system_storage.h"
#include "io/metadata_format.h"
#include "io/testing/fake_planners.h"
#include "io/testing/metadata_surgery.h"
#include "io/testing/sample_state.h"

namespace dcp {
namespace {

using ::dcp::testing::FakeLoadPlanner;
using ::dcp::testing::FakeSavePlanner;
using ::dcp::testing::ListNames;
using ::dcp::testing::LoadOneRank;
using ::dcp::testing::NewTestDir;
using ::dcp::testing::SaveOneRank;
using ::testing::HasSubstr;

constexpr int64_t kBlock = 64 << 10;  // Checksum blocks of the tests.

// A tensor whose bytes are low-entropy (zstd shrinks them) or random.
Tensor MakeTensor(DType dtype, Shape sizes, bool compressible, uint32_t seed) {
  Tensor t = Tensor::Empty(dtype, std::move(sizes));
  auto* bytes = static_cast<uint8_t*>(t.data());
  std::mt19937 gen(seed);
  for (size_t i = 0; i < t.nbytes(); ++i) {
    bytes[i] = compressible ? static_cast<uint8_t>((i / 7 + seed) % 5)
                            : static_cast<uint8_t>(gen());
  }
  return t;
}

// One large tensor of every dtype (compressible), a random one, a small one
// (packed, never encoded) and a bytes value.
std::map<std::string, Tensor> State(uint32_t seed) {
  std::map<std::string, Tensor> state;
  for (int code = 0; code < kNumDTypes; ++code) {
    const DType dtype = *DTypeFromCode(code);
    // 5 blocks and a partial one, whatever the element size.
    const int64_t elements =
        (5 * kBlock + 1000) / static_cast<int64_t>(ElementSize(dtype));
    state[absl::StrCat("w.", DTypeName(dtype))] =
        MakeTensor(dtype, {elements}, /*compressible=*/true, seed + code);
  }
  state["adam.random"] =
      MakeTensor(DType::kF32, {3 * kBlock / 4}, /*compressible=*/false, seed);
  state["small"] = MakeTensor(DType::kF32, {100}, true, seed);
  return state;
}

FileSystemWriterOptions ZstdOptions(bool direct_io, int threads) {
  FileSystemWriterOptions options;
  options.extensions = *ParseCompression("zstd:3");
  options.checksum_block_size = kBlock;
  options.direct_io = direct_io;
  options.thread_count = threads;
  return options;
}

absl::Status Save(const std::string& dir,
                  const std::map<std::string, Tensor>& state,
                  FileSystemWriterOptions options) {
  FakeSavePlanner planner;
  for (const auto& [fqn, t] : state) planner.AddTensor(fqn, t);
  planner.AddBytes("step", "step-7");
  FileSystemWriter writer(dir, options);
  return SaveOneRank(writer, planner);
}

absl::StatusOr<Metadata> ReadMetadata(const std::string& dir) {
  FileSystemReader reader(dir);
  return reader.ReadMetadata();
}

// Loads every tensor of `state` whole and compares bytes.
absl::Status LoadAndCompare(const std::string& dir,
                            const std::map<std::string, Tensor>& state,
                            FileSystemReaderOptions options = {}) {
  FileSystemReader reader(dir, options);
  FakeLoadPlanner planner;
  std::map<std::string, Tensor> loaded;
  for (const auto& [fqn, t] : state) {
    loaded[fqn] = Tensor::Empty(t.dtype(), t.sizes());
    planner.SetDestination(MetadataIndex(fqn, Shape(t.sizes().size(), 0)),
                           loaded[fqn]);
  }
  DCP_RETURN_IF_ERROR(LoadOneRank(reader, planner));
  for (const auto& [fqn, t] : state) {
    if (std::memcmp(loaded[fqn].data(), t.data(), t.nbytes()) != 0) {
      return absl::InternalError(absl::StrCat(fqn, " differs"));
    }
  }
  if (planner.bytes().at("step") != "step-7") {
    return absl::InternalError("step differs");
  }
  return absl::OkStatus();
}

struct RoundTripCase {
  bool direct_io;
  int threads;
};

class ZstdRoundTripTest : public ::testing::TestWithParam<RoundTripCase> {};

TEST_P(ZstdRoundTripTest, EveryDtypeComesBackAndOnlyShrinkingBlocksAreEncoded) {
  const std::string dir = NewTestDir("zstd_round_trip");
  const auto state = State(1);
  ASSERT_TRUE(
      Save(dir, state, ZstdOptions(GetParam().direct_io, GetParam().threads))
          .ok());
  absl::Status loaded = LoadAndCompare(dir, state);
  ASSERT_TRUE(loaded.ok()) << loaded;
  // The same state loads again through a reader with several threads.
  FileSystemReaderOptions threads;
  threads.thread_count = 3;
  threads.read_window_bytes = 3 * kBlock;
  loaded = LoadAndCompare(dir, state, threads);
  ASSERT_TRUE(loaded.ok()) << loaded;

  absl::StatusOr<Metadata> metadata = ReadMetadata(dir);
  ASSERT_TRUE(metadata.ok()) << metadata.status();
  // dcp-2's extension records, in dcp-3 for the dtypes after the first 17.
  EXPECT_EQ(metadata->version, kLaterDTypesFormatVersion);
  for (const auto& [index, info] : metadata->storage_data) {
    SCOPED_TRACE(index.ToString());
    if (index.fqn == "small" || index.fqn == "step") {
      EXPECT_TRUE(info.extensions.empty());
      continue;
    }
    EXPECT_THAT(info.extensions, ::testing::ElementsAre("zstd/1.0"));
    EXPECT_EQ(info.offset % 4096, 0);
    ASSERT_EQ(info.block_lengths.size(), info.block_checksums.size());
    if (index.fqn == "adam.random") {
      // Incompressible: every block stored as it is.
      EXPECT_EQ(info.length, info.raw_length);
      for (size_t b = 0; b < info.block_lengths.size(); ++b) {
        EXPECT_EQ(info.block_lengths[b],
                  std::min<int64_t>(kBlock, info.raw_length - b * kBlock));
      }
    } else {
      EXPECT_LT(info.length * 10, info.raw_length);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ZstdRoundTripTest,
                         ::testing::Values(RoundTripCase{true, 1},
                                           RoundTripCase{false, 1},
                                           RoundTripCase{true, 3}),
                         [](const auto& info) {
                           return absl::StrCat(
                               info.param.direct_io ? "direct" : "buffered",
                               info.param.threads);
                         });

TEST(ZstdStorageTest, WithoutExtensionsTheCheckpointIsVersion1) {
  const std::string dir = NewTestDir("no_extensions");
  FileSystemWriterOptions options = ZstdOptions(true, 1);
  options.extensions.clear();
  std::map<std::string, Tensor> state = State(2);
  // The first 17 dtypes: a later one would make it dcp-3.
  for (uint32_t code = kFirstLaterDTypeCode; code < kNumDTypes; ++code) {
    state.erase(absl::StrCat("w.", DTypeName(*DTypeFromCode(code))));
  }
  ASSERT_TRUE(Save(dir, state, options).ok());
  absl::StatusOr<Metadata> metadata = ReadMetadata(dir);
  ASSERT_TRUE(metadata.ok());
  EXPECT_EQ(metadata->version, kFormatVersion);
  for (const auto& [index, info] : metadata->storage_data) {
    EXPECT_TRUE(info.extensions.empty()) << index.ToString();
  }
}

// Four "ranks" each save a quarter of the rows of a [64, N] tensor (as
// four chunks); three load a third each, so every load reads parts of the
// chunks, block by block.
TEST(ZstdStorageTest, ResavedOnFourLoadsOnThreeByteExact) {
  const std::string dir = NewTestDir("zstd_reshard");
  constexpr int64_t kRows = 60, kCols = 3000;  // f32: 12000 bytes a row.
  const Tensor full = MakeTensor(DType::kF32, {kRows, kCols}, true, 5);
  const Tensor random = MakeTensor(DType::kF32, {kRows, kCols}, false, 6);
  FakeSavePlanner save;
  for (int rank = 0; rank < 4; ++rank) {
    const int64_t rows = kRows / 4;
    for (const auto& [fqn, source] :
         {std::pair<std::string, const Tensor*>{"w", &full}, {"m", &random}}) {
      Tensor chunk = Tensor::Empty(DType::kF32, {rows, kCols});
      std::memcpy(chunk.data(),
                  static_cast<const std::byte*>(source->data()) +
                      rank * rows * kCols * 4,
                  chunk.nbytes());
      save.AddShard(fqn, {kRows, kCols}, {rank * rows, 0}, chunk);
    }
  }
  {
    FileSystemWriter writer(dir, ZstdOptions(true, 2));
    ASSERT_TRUE(SaveOneRank(writer, save).ok());
  }
  FileSystemReader reader(dir);
  absl::StatusOr<Metadata> metadata = reader.ReadMetadata();
  ASSERT_TRUE(metadata.ok());
  // Every rank's chunk of "w" was compressed.
  for (const auto& [index, info] : metadata->storage_data) {
    if (index.fqn == "w") {
      EXPECT_LT(info.length, info.raw_length);
    }
  }
  for (int rank = 0; rank < 3; ++rank) {
    SCOPED_TRACE(rank);
    const int64_t begin = rank * kRows / 3, end = (rank + 1) * kRows / 3;
    FakeLoadPlanner planner;
    LoadPlan plan;
    std::map<std::string, Tensor> dests;
    for (const std::string fqn : {"w", "m"}) {
      const auto& tensor =
          std::get<TensorStorageMetadata>(metadata->state_dict_metadata[fqn]);
      dests[fqn] = Tensor::Empty(DType::kF32, {end - begin, kCols});
      planner.SetDestination(MetadataIndex(fqn, Shape{begin, 0}), dests[fqn]);
      for (size_t c = 0; c < tensor.chunks.size(); ++c) {
        const ChunkStorageMetadata& chunk = tensor.chunks[c];
        const int64_t lo = std::max(begin, chunk.offsets[0]);
        const int64_t hi = std::min(end, chunk.offsets[0] + chunk.sizes[0]);
        if (lo >= hi) continue;
        ReadItem item;
        item.type = LoadItemType::kTensor;
        item.storage_index =
            MetadataIndex(fqn, chunk.offsets, static_cast<int64_t>(c));
        item.dest_index = MetadataIndex(fqn, Shape{begin, 0});
        item.storage_offsets = {lo - chunk.offsets[0], 0};
        item.dest_offsets = {lo - begin, 0};
        item.lengths = {hi - lo, kCols};
        plan.items.push_back(item);
      }
    }
    FileSystemReader rank_reader(dir);
    ASSERT_TRUE(LoadOneRank(rank_reader, planner, &plan).ok());
    EXPECT_EQ(std::memcmp(dests["w"].data(),
                          static_cast<const std::byte*>(full.data()) +
                              begin * kCols * 4,
                          dests["w"].nbytes()),
              0);
    EXPECT_EQ(std::memcmp(dests["m"].data(),
                          static_cast<const std::byte*>(random.data()) +
                              begin * kCols * 4,
                          dests["m"].nbytes()),
              0);
  }
}

// Rewrites the descriptor every encoded item of `dir` records.
void RewriteDescriptor(const std::string& dir, const std::string& descriptor) {
  ASSERT_TRUE(testing::RewriteMetadataFile(dir, [&](format::Metadata& p) {
                for (int i = 0; i < p.extensions_size(); ++i) {
                  p.set_extensions(i, descriptor);
                }
              }).ok());
}

TEST(ZstdStorageTest, UnknownExtensionOrMajorVersionNamesTensorAndDescriptor) {
  const auto state = State(3);
  for (const auto& [descriptor, expected] :
       std::vector<std::pair<std::string, std::string>>{
           {"lz4/1.0", "which this dcp does not know (known: zstd/1.0)"},
           {"zstd/2.0", "reads zstd major version 1"}}) {
    SCOPED_TRACE(descriptor);
    const std::string dir = NewTestDir("unknown_extension");
    ASSERT_TRUE(Save(dir, state, ZstdOptions(true, 1)).ok());
    RewriteDescriptor(dir, descriptor);
    absl::Status loaded = LoadAndCompare(dir, state);
    EXPECT_EQ(loaded.code(), absl::StatusCode::kFailedPrecondition) << loaded;
    EXPECT_THAT(loaded.message(), HasSubstr("tensor adam.random@[0]"));
    EXPECT_THAT(loaded.message(), HasSubstr(descriptor));
    EXPECT_THAT(loaded.message(), HasSubstr(expected));
  }
  // A newer minor version of zstd/1 reads.
  const std::string dir = NewTestDir("minor_version");
  ASSERT_TRUE(Save(dir, state, ZstdOptions(true, 1)).ok());
  RewriteDescriptor(dir, "zstd/1.9");
  EXPECT_TRUE(LoadAndCompare(dir, state).ok());
  // A reader given a registry without zstd refuses it.
  ExtensionRegistry empty;
  FileSystemReaderOptions options;
  options.extensions = &empty;
  absl::Status loaded = LoadAndCompare(dir, state, options);
  EXPECT_EQ(loaded.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(loaded.message(), HasSubstr("known: none"));
}

TEST(ZstdStorageTest, CorruptCompressedBlockIsChecksumErrorNamingFileTensor) {
  const std::string dir = NewTestDir("corrupt_block");
  const auto state = State(4);
  ASSERT_TRUE(Save(dir, state, ZstdOptions(true, 1)).ok());
  absl::StatusOr<Metadata> metadata = ReadMetadata(dir);
  ASSERT_TRUE(metadata.ok());
  const StorageInfo& info =
      metadata->storage_data.at(MetadataIndex("w.F32", Shape{0}));
  ASSERT_LT(info.block_lengths[2], kBlock);  // A compressed block.
  const int64_t block2 =
      info.offset + info.block_lengths[0] + info.block_lengths[1];
  const std::string path = JoinPath(dir, info.relative_path);
  testing::FlipByte(path, block2 + info.block_lengths[2] / 2);
  absl::Status loaded = LoadAndCompare(dir, state);
  EXPECT_EQ(loaded.code(), absl::StatusCode::kDataLoss) << loaded;
  EXPECT_THAT(loaded.message(), HasSubstr("checksum mismatch in w.F32@[0]"));
  EXPECT_THAT(loaded.message(), HasSubstr(path));
  EXPECT_THAT(loaded.message(), HasSubstr(absl::StrCat("offset ", block2)));
}

TEST(ZstdStorageTest, TruncatedFileOfCompressedItemsIsDataLoss) {
  const std::string dir = NewTestDir("truncated_compressed");
  const auto state = State(5);
  FileSystemWriterOptions options = ZstdOptions(false, 1);
  ASSERT_TRUE(Save(dir, state, options).ok());
  absl::StatusOr<Metadata> metadata = ReadMetadata(dir);
  ASSERT_TRUE(metadata.ok());
  const std::string path =
      JoinPath(dir, metadata->storage_data.begin()->second.relative_path);
  absl::StatusOr<std::unique_ptr<File>> file =
      LocalFileSystem().OpenForWrite(path, OpenOptions{/*exclusive=*/false});
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Truncate(4096).ok());
  ASSERT_TRUE((*file)->Close().ok());
  absl::Status loaded = LoadAndCompare(dir, state);
  EXPECT_EQ(loaded.code(), absl::StatusCode::kDataLoss) << loaded;
  EXPECT_THAT(loaded.message(), HasSubstr("truncated"));
}

struct FaultCase {
  std::string name;
  Fault fault;
  absl::StatusCode code;
  bool direct_io = true;
};

class ZstdSaveFaultTest : public ::testing::TestWithParam<FaultCase> {};

// The writes of encoded items (the last ones of each file) fail: the save
// fails naming the file, the directory holds exactly what it held, and the
// previous (compressed) checkpoint loads.
TEST_P(ZstdSaveFaultTest, FailsAndKeepsThePreviousCheckpoint) {
  const FaultCase& c = GetParam();
  const std::string dir = NewTestDir(c.name);
  const auto old_state = State(6);
  ASSERT_TRUE(Save(dir, old_state, ZstdOptions(c.direct_io, 1)).ok());
  const std::vector<std::string> before = ListNames(dir);
  FaultInjectionFileSystem faulty(LocalFileSystem());
  faulty.Inject(c.fault);
  FileSystemWriterOptions options = ZstdOptions(c.direct_io, 2);
  options.file_system = &faulty;
  options.io_mode = IoMode::kPosix;
  absl::Status saved = Save(dir, State(7), options);
  EXPECT_EQ(saved.code(), c.code) << saved;
  EXPECT_THAT(saved.message(), HasSubstr(".distcp"));
  EXPECT_EQ(faulty.open_files(), 0);
  EXPECT_EQ(ListNames(dir), before);
  absl::Status loaded = LoadAndCompare(dir, old_state);
  EXPECT_TRUE(loaded.ok()) << loaded;
}

INSTANTIATE_TEST_SUITE_P(
    Sites, ZstdSaveFaultTest,
    ::testing::Values(
        // Each file's first write is its pack or first encoded item; later
        // ones are encoded items' buffers.
        FaultCase{"first_write_eio", Fault{FaultOp::kWrite, EIO, ".distcp", 1},
                  absl::StatusCode::kDataLoss},
        FaultCase{"later_write_enospc",
                  Fault{FaultOp::kWrite, ENOSPC, ".distcp", 4},
                  absl::StatusCode::kResourceExhausted},
        FaultCase{"short_write",
                  Fault{FaultOp::kWrite, ENOSPC, ".distcp", 3, true},
                  absl::StatusCode::kResourceExhausted},
        FaultCase{"buffered_write_eio",
                  Fault{FaultOp::kWrite, EIO, ".distcp", 5},
                  absl::StatusCode::kDataLoss, /*direct_io=*/false},
        FaultCase{"fsync_eio", Fault{FaultOp::kSync, EIO, ".distcp", 1},
                  absl::StatusCode::kDataLoss}),
    [](const auto& info) { return info.param.name; });

// A compressible tensor and a random one (each several blocks, encoded
// block by block), a small one (packed) and the bytes value Save adds.
std::map<std::string, Tensor> FewTensors(uint32_t seed) {
  return {{"w", MakeTensor(DType::kF32, {5 * kBlock / 4 + 100}, true, seed)},
          {"adam.random", MakeTensor(DType::kBF16, {kBlock}, false, seed)},
          {"small", MakeTensor(DType::kF32, {100}, true, seed)}};
}

// The files the metadata committed in `dir` names, the metadata included.
std::set<std::string> CommittedFiles(const std::string& dir) {
  absl::StatusOr<Metadata> metadata = ReadMetadata(dir);
  if (!metadata.ok()) return {};
  std::set<std::string> files = {kMetadataFileName};
  for (const auto& [index, info] : metadata->storage_data) {
    files.insert(info.relative_path);
  }
  return files;
}

// One failed file-system call (EIO) at each call of a compressed save in
// turn, the save's error path and Abort going on: a failure before the
// commit fails the save and leaves the previous checkpoint loadable and the
// directory as it was (but for a writability probe it failed to remove);
// after the commit the new checkpoint loads and nothing but the previous
// checkpoint's files is left besides it. No file stays open either way.
TEST(ZstdStorageTest, AFailureAtEveryCallKeepsTheOldCheckpointOrTheNewOne) {
  const auto old_state = FewTensors(8), new_state = FewTensors(9);
  for (bool direct_io : {true, false}) {
    SCOPED_TRACE(direct_io ? "direct" : "buffered");
    const std::string dir = NewTestDir("zstd_every_call");
    int kept_old = 0, took_new = 0;
    for (int64_t nth = 1;; ++nth) {
      ASSERT_TRUE(Save(dir, old_state, ZstdOptions(direct_io, 1)).ok());
      const std::vector<std::string> before = ListNames(dir);
      FaultInjectionFileSystem faulty(LocalFileSystem());
      faulty.Inject(Fault{FaultOp::kAny, EIO, "", nth});
      FileSystemWriterOptions options = ZstdOptions(direct_io, 2);
      options.file_system = &faulty;
      options.io_mode = IoMode::kPosix;
      absl::Status saved = Save(dir, new_state, options);
      const std::string where =
          absl::StrCat("EIO at call ", nth, ": ", saved.ToString());
      EXPECT_EQ(faulty.open_files(), 0) << where;
      // The save ended before its nth call: every call has failed once.
      if (faulty.calls(FaultOp::kAny) < nth) {
        EXPECT_TRUE(saved.ok()) << where;
        EXPECT_TRUE(LoadAndCompare(dir, new_state).ok()) << where;
        break;
      }
      if (LoadAndCompare(dir, old_state).ok()) {
        ++kept_old;
        EXPECT_FALSE(saved.ok()) << where;
        // As it was, but for a writability probe whose removal was the
        // failed call: that one stays, named in the error.
        std::vector<std::string> left = ListNames(dir);
        std::erase_if(left, [&](const std::string& name) {
          return name.starts_with(".dcp-probe-") &&
                 absl::StrContains(saved.message(), name);
        });
        EXPECT_EQ(left, before) << where;
        continue;
      }
      absl::Status loaded = LoadAndCompare(dir, new_state);
      ASSERT_TRUE(loaded.ok()) << where << " left neither: " << loaded;
      ++took_new;
      const std::set<std::string> committed = CommittedFiles(dir);
      for (const std::string& name : ListNames(dir)) {
        EXPECT_TRUE(committed.contains(name) ||
                    absl::c_linear_search(before, name))
            << where << " left " << name;
      }
    }
    EXPECT_GT(kept_old, 10);
    EXPECT_GT(took_new, 0);
  }
}

// A failed call (EIO) at each file-system call of a load of encoded items
// in turn (reads decoded on three threads, a window of two blocks): the
// load fails naming the file it was at, or, for a call it can do without,
// loads every byte; no file stays open.
TEST(ZstdStorageTest, AFailedCallAtAnyStepOfALoadIsAClearError) {
  const std::string dir = NewTestDir("zstd_load_faults");
  const auto state = FewTensors(10);
  ASSERT_TRUE(Save(dir, state, ZstdOptions(true, 2)).ok());
  int failures = 0;
  for (int64_t nth = 1;; ++nth) {
    FaultInjectionFileSystem faulty(LocalFileSystem());
    faulty.Inject(Fault{FaultOp::kAny, EIO, "", nth});
    FileSystemReaderOptions options;
    options.file_system = &faulty;
    options.io_mode = IoMode::kPosix;
    options.thread_count = 3;
    options.read_window_bytes = 2 * kBlock;
    absl::Status loaded = LoadAndCompare(dir, state, options);
    EXPECT_EQ(faulty.open_files(), 0) << "call " << nth;
    if (faulty.calls(FaultOp::kAny) < nth) {  // No call failed.
      EXPECT_TRUE(loaded.ok()) << loaded;
      break;
    }
    if (loaded.ok()) continue;
    ++failures;
    EXPECT_NE(loaded.code(), absl::StatusCode::kInternal) << loaded;
    EXPECT_THAT(loaded.message(), HasSubstr(dir)) << "call " << nth;
  }
  EXPECT_GT(failures, 3);
}

}  // namespace
}  // namespace dcp
