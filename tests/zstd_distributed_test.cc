// Native checkpoints compressed with zstd across real processes (one forked
// process per rank, Gloo over tcp on 127.0.0.1): four ranks save row,
// column and 2-d block chunks of compressible and random tensors through
// FileSystemWriters with extensions; three ranks load them with other
// shardings, so each reads parts of several chunks, once through the reader
// the checkpoint_id selects and once through a FileSystemReader with two
// threads and a read window of one block. Every byte is checked.
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/extensions.h"
#include "io/file_system_storage.h"
#include "tests/comm/multiprocess.h"
#include "tests/global_tensors.h"

namespace dcp {
namespace {

using ::dcp::testing::BuildState;
using ::dcp::testing::Check;
using ::dcp::testing::ChunkLayout;
using ::dcp::testing::EvenSplit;
using ::dcp::testing::FreshTestDir;
using ::dcp::testing::GlobalTensor;
using ::dcp::testing::RunGlooWorld;
using ::dcp::testing::VerifyState;
using ::testing::ElementsAre;

constexpr int64_t kStep = 4242;

// Each saved chunk of the first three is over 64 KiB (so it goes through
// the extensions; 5 to 7 blocks of 16 KiB); "norm" is small (packed,
// stored as it is).
const std::vector<GlobalTensor> kGlobals = {
    {"emb", DType::kF32, {640, 160}, /*compressible=*/true},
    {"moments", DType::kF32, {384, 192}, /*compressible=*/false},
    {"ids", DType::kI64, {96, 512}, /*compressible=*/true},
    {"norm", DType::kBF16, {1000}, /*compressible=*/false},
};

// Four ranks: emb by rows, moments by 2x2 blocks, ids by columns, a replica
// of norm.
ChunkLayout SaveLayout(int rank) {
  ChunkLayout layout;
  auto [r0, nr] = EvenSplit(640, rank, 4);
  layout["emb"] = {{{r0, 0}, {nr, 160}}};
  layout["moments"] = {{{(rank / 2) * 192, (rank % 2) * 96}, {192, 96}}};
  auto [c0, nc] = EvenSplit(512, rank, 4);
  layout["ids"] = {{{0, c0}, {96, nc}}};
  layout["norm"] = {};
  return layout;
}

// Three ranks: emb by rows (across the saved chunks' bounds), moments by
// columns, ids by rows, norm split.
ChunkLayout LoadLayout(int rank) {
  ChunkLayout layout;
  auto [r0, nr] = EvenSplit(640, rank, 3);
  layout["emb"] = {{{r0, 0}, {nr, 160}}};
  auto [c0, nc] = EvenSplit(192, rank, 3);
  layout["moments"] = {{{0, c0}, {384, nc}}};
  auto [i0, ni] = EvenSplit(96, rank, 3);
  layout["ids"] = {{{i0, 0}, {ni, 512}}};
  auto [n0, nn] = EvenSplit(1000, rank, 3);
  layout["norm"] = {{{n0}, {nn}}};
  return layout;
}

// Loads this rank's chunks (LoadLayout) through `load` and checks them.
int LoadAndVerify(int rank, const LoadOptions& load, const std::string& how) {
  const ChunkLayout layout = LoadLayout(rank);
  StateDict state = BuildState(kGlobals, layout, /*fill=*/false);
  state["step"] = int64_t{-1};
  absl::Status status = Load(state, load);
  if (int rc = Check(status.ok(), rank, how + ": " + status.ToString())) {
    return rc;
  }
  const std::string problem = VerifyState(state, kGlobals, layout);
  if (int rc = Check(problem.empty(), rank, how + ": " + problem)) return rc;
  return Check(state["step"].int_value() == kStep, rank, how + ": step");
}

// Saves on four ranks with checksum (and compression) blocks of `block`
// bytes, checks what was stored, and loads on three.
void SaveOnFourLoadOnThree(int64_t block) {
  const std::string dir = FreshTestDir("zstd_dist");
  EXPECT_EQ(RunGlooWorld(4,
                         [&](int rank, comm::ProcessGroup& group) {
                           FileSystemWriterOptions options;
                           options.extensions = *ParseCompression("zstd:3");
                           options.checksum_block_size = block;
                           options.thread_count = 2;
                           FileSystemWriter writer(dir, options);
                           StateDict state = BuildState(
                               kGlobals, SaveLayout(rank), /*fill=*/true);
                           state["step"] = kStep;
                           SaveOptions save;
                           save.storage_writer = &writer;
                           save.checkpoint_id = dir;
                           save.process_group = &group;
                           absl::Status status = Save(state, save).status();
                           return Check(status.ok(), rank, status.ToString());
                         }),
            0);

  // Every chunk of the large tensors went through zstd, block by block:
  // the compressible ones shrank, the random ones were stored as they are.
  {
    FileSystemReader reader(dir);
    absl::StatusOr<Metadata> metadata = reader.ReadMetadata();
    ASSERT_TRUE(metadata.ok()) << metadata.status();
    EXPECT_EQ(metadata->version, kExtensionsFormatVersion);
    EXPECT_EQ(metadata->checksum_block_size, block);
    std::map<std::string, int> items;
    for (const auto& [index, info] : metadata->storage_data) {
      SCOPED_TRACE(index.ToString());
      ++items[index.fqn];
      if (index.fqn == "norm" || index.fqn == "step") {
        EXPECT_TRUE(info.extensions.empty());
        continue;
      }
      EXPECT_THAT(info.extensions, ElementsAre("zstd/1.0"));
      EXPECT_EQ(info.block_lengths.size(),
                static_cast<size_t>((info.raw_length + block - 1) / block));
      if (index.fqn == "moments") {
        EXPECT_EQ(info.length, info.raw_length);
      } else {
        EXPECT_LT(info.length, info.raw_length);
      }
    }
    EXPECT_EQ(
        items,
        (std::map<std::string, int>{
            {"emb", 4}, {"ids", 4}, {"moments", 4}, {"norm", 1}, {"step", 1}}));
  }

  EXPECT_EQ(RunGlooWorld(3,
                         [&](int rank, comm::ProcessGroup& group) {
                           LoadOptions by_id;
                           by_id.checkpoint_id = dir;
                           by_id.process_group = &group;
                           if (int rc = LoadAndVerify(rank, by_id, "by id")) {
                             return rc;
                           }
                           FileSystemReaderOptions options;
                           options.thread_count = 2;
                           options.read_window_bytes = block;
                           FileSystemReader reader(dir, options);
                           LoadOptions windowed;
                           windowed.storage_reader = &reader;
                           windowed.process_group = &group;
                           return LoadAndVerify(rank, windowed, "windowed");
                         }),
            0);
}

TEST(ZstdDistributed, SavedOnFourRanksLoadsOnThreeByteExact) {
  SaveOnFourLoadOnThree(FileSystemWriterOptions{}.checksum_block_size);
}

// Blocks of 16 KiB: each chunk is 5 to 7 blocks, and each load reads only
// some of them. The metadata the coordinator broadcasts must carry the
// writer's block size (StorageWriter::DescribeCommit), or the extension
// records, cut into 16 KiB blocks, do not encode.
TEST(ZstdDistributed, SmallBlocksSavedOnFourRanksLoadOnThree) {
  SaveOnFourLoadOnThree(16 << 10);
}

}  // namespace
}  // namespace dcp
