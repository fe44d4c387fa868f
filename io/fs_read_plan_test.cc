#include "io/fs_read_plan.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dcp::internal_fs {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A metadata of one f32 tensor "w" of 100 elements in one chunk, and one
// bytes value "b".
Metadata OneTensor() {
  Metadata m;
  TensorStorageMetadata w;
  w.properties.dtype = DType::kF32;
  w.size = {100};
  w.chunks = {{{0}, {100}}};
  m.state_dict_metadata["w"] = w;
  m.state_dict_metadata["b"] = BytesStorageMetadata{};
  m.storage_data[MetadataIndex("w", Shape{0})] = {"f", 4096, 400, {}};
  m.storage_data[MetadataIndex("b")] = {"f", 0, 10, {}};
  return m;
}

ReadItem Box(int64_t begin, int64_t end) {
  ReadItem item;
  item.storage_index = MetadataIndex("w", Shape{0});
  item.dest_index = MetadataIndex("w", Shape{begin});
  item.storage_offsets = {begin};
  item.dest_offsets = {0};
  item.lengths = {end - begin};
  return item;
}

TEST(FsReadPlan, ItemsAreGroupedByStoredItemAndEachCheckedOnce) {
  const Metadata m = OneTensor();
  LoadPlan plan;
  plan.items = {Box(0, 10), Box(50, 60)};
  ReadItem bytes;
  bytes.type = LoadItemType::kBytesIO;
  bytes.storage_index = MetadataIndex("b");
  plan.items.push_back(bytes);
  int checks = 0;
  absl::StatusOr<std::vector<StoredItem>> stored = GroupReadItems(
      plan, m, "/ckpt", [&](const MetadataIndex&, const StorageInfo&) {
        ++checks;
        return absl::OkStatus();
      });
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(checks, 2);
  ASSERT_EQ(stored->size(), 2u);
  EXPECT_TRUE((*stored)[0].is_tensor);
  EXPECT_EQ((*stored)[0].uses.size(), 2u);
  EXPECT_EQ((*stored)[0].chunk_sizes, Shape{100});
  EXPECT_EQ((*stored)[0].element_size, 4u);
  EXPECT_FALSE((*stored)[1].is_tensor);
  EXPECT_EQ((*stored)[1].info->length, 10);
}

TEST(FsReadPlan, MetadataThatDoesNotBackAnItemIsDataLossNamingTheDirectory) {
  auto group = [](const Metadata& m, ReadItem item) {
    LoadPlan plan;
    plan.items = {std::move(item)};
    return GroupReadItems(plan, m, "/ckpt",
                          [](const MetadataIndex&, const StorageInfo&) {
                            return absl::OkStatus();
                          })
        .status();
  };
  Metadata m = OneTensor();
  ReadItem missing = Box(0, 1);
  missing.storage_index = MetadataIndex("v", Shape{0});
  absl::Status status = group(m, missing);
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("/ckpt has no storage entry"));

  m.storage_data[MetadataIndex("w", Shape{0})].length = 396;
  status = group(m, Box(0, 1));
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("stores 396 bytes"));

  m = OneTensor();
  std::get<TensorStorageMetadata>(m.state_dict_metadata["w"])
      .chunks[0]
      .offsets = {5};
  status = group(m, Box(0, 1));
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("no tensor chunk"));

  // The check's own error comes back.
  LoadPlan plan;
  plan.items = {Box(0, 1)};
  const Metadata good = OneTensor();
  status = GroupReadItems(plan, good, "/ckpt",
                          [](const MetadataIndex&, const StorageInfo&) {
                            return absl::DataLossError("file truncated");
                          })
               .status();
  EXPECT_THAT(status.message(), HasSubstr("file truncated"));
}

TEST(FsReadPlan, PiecesCoverTheBoxesInWholeBlocksMergingSharedBlocks) {
  const Metadata m = OneTensor();
  LoadPlan plan;
  // 4-byte elements, 64-byte blocks (16 elements), pieces of 2 blocks.
  plan.items = {Box(10, 20), Box(25, 40), Box(80, 90), Box(95, 95)};
  std::vector<StoredItem> stored = *GroupReadItems(
      plan, m, "/ckpt", [](const MetadataIndex&, const StorageInfo&) {
        return absl::OkStatus();
      });
  // [10, 20) and [25, 40) share block 1: one span, cut at 2 blocks.
  EXPECT_THAT(PlanPieces(stored[0], 64, 128),
              ElementsAre(ReadPiece{0, 2, 10, 32}, ReadPiece{2, 3, 32, 40},
                          ReadPiece{5, 6, 80, 90}));
  // A piece holds at least one block, however small piece_bytes is.
  EXPECT_THAT(PlanPieces(stored[0], 64, 1).size(), 4u);
  plan.items = {Box(3, 3)};
  stored = *GroupReadItems(plan, m, "/ckpt",
                           [](const MetadataIndex&, const StorageInfo&) {
                             return absl::OkStatus();
                           });
  EXPECT_TRUE(PlanPieces(stored[0], 64, 128).empty());
}

TEST(FsReadPlan, OnlyAWholeChunkIntoAWholeAlignedHostTensorIsReadInPlace) {
  const Metadata m = OneTensor();
  LoadPlan plan;
  plan.items = {Box(0, 100)};
  std::vector<StoredItem> stored = *GroupReadItems(
      plan, m, "/ckpt", [](const MetadataIndex&, const StorageInfo&) {
        return absl::OkStatus();
      });
  Tensor dest = Tensor::Empty(DType::kF32, {100});
  EXPECT_TRUE(CanReadInPlace(stored[0], dest.view(), /*direct=*/true));
  // Unaligned memory: buffered only.
  std::vector<float> memory(101);
  TensorView unaligned(memory.data() + 1, DType::kF32, {100});
  if (reinterpret_cast<uintptr_t>(memory.data() + 1) % 4096 != 0) {
    EXPECT_FALSE(CanReadInPlace(stored[0], unaligned, true));
  }
  EXPECT_TRUE(CanReadInPlace(stored[0], unaligned, false));
  // A larger destination, or a part of the chunk: not in place.
  Tensor larger = Tensor::Empty(DType::kF32, {200});
  EXPECT_FALSE(CanReadInPlace(stored[0], larger.view(), false));
  plan.items = {Box(0, 50)};
  stored = *GroupReadItems(plan, m, "/ckpt",
                           [](const MetadataIndex&, const StorageInfo&) {
                             return absl::OkStatus();
                           });
  EXPECT_FALSE(CanReadInPlace(stored[0], dest.view(), false));
}

}  // namespace
}  // namespace dcp::internal_fs
