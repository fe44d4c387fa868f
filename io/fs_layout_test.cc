#include "io/fs_layout.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dcp::internal_fs {
namespace {

using ::testing::ElementsAre;

TEST(FsLayout, NamesTheWriterGivesAreRecognisedAndNoOthers) {
  const std::string id = NewSaveId();
  EXPECT_TRUE(IsSaveId(id)) << id;
  EXPECT_NE(NewSaveId(), id);
  const std::string data = DataFileName(DataFilePrefix(3, id), 12);
  EXPECT_EQ(data, "__3_" + id + "_12.distcp");
  EXPECT_TRUE(IsDataFileName(data));
  EXPECT_TRUE(IsTempMetadataFileName(TempMetadataFileName(id)));
  for (const char* other :
       {"__3_0123456789abcdef_.distcp", "__x_0123456789abcdef_1.distcp",
        "__3_0123456789ABCDEF_1.distcp", "__3_0123456789abcde_1.distcp",
        "_3_0123456789abcdef_1.distcp", "__3_0123456789abcdef_1.distcpx",
        "__3_0123456789abcdef_1_2.distcp", ".metadata", "data.distcp"}) {
    EXPECT_FALSE(IsDataFileName(other)) << other;
  }
  EXPECT_FALSE(IsTempMetadataFileName(".metadata.tmp-xyz"));
  EXPECT_FALSE(IsTempMetadataFileName(".metadata"));
}

TEST(FsLayout, ItemsAreBalancedByBytesAndKeepPlanOrder) {
  // Largest first, each to the lightest file (ties: the lower index):
  // 40 -> 0, 30 -> 1, 20 -> 1, 10 -> 0, 5 -> 0 (50 each before it).
  EXPECT_THAT(AssignItemsToFiles({10, 40, 30, 20, 5}, 2, true),
              ElementsAre(ElementsAre(0, 1, 4), ElementsAre(2, 3)));
  // More threads than items: one file per item.
  EXPECT_THAT(AssignItemsToFiles({1, 2}, 8, true),
              ElementsAre(ElementsAre(1), ElementsAre(0)));
  EXPECT_THAT(AssignItemsToFiles({1, 2, 3}, 0, true),
              ElementsAre(ElementsAre(0, 1, 2)));
  EXPECT_THAT(AssignItemsToFiles({1, 2}, 1, false),
              ElementsAre(ElementsAre(0), ElementsAre(1)));
  EXPECT_TRUE(AssignItemsToFiles({}, 4, true).empty());
}

TEST(FsLayout, TensorsAlignedSmallHostItemsPacked) {
  const FileLayout layout = LayOutFile(
      {
          {100, true, false},             // Packed at 0.
          {10, false, false},             // Packed 64 apart: 128.
          {200000, true, false},          // Too large: aligned after the pack.
          {50, true, true},               // Device: never packed, aligned.
          {kPackItemBytes, true, false},  // A new pack, aligned.
          {0, false, false},              // Empty: not packed.
      },
      /*direct_io=*/false);
  EXPECT_THAT(layout.offset,
              ElementsAre(0, 128, 4096, 4096 + 200704, 4096 + 204800,
                          4096 + 204800 + kPackItemBytes));
  EXPECT_THAT(layout.pack, ElementsAre(0, 0, -1, -1, 1, -1));
  ASSERT_EQ(layout.packs.size(), 2u);
  EXPECT_EQ(layout.packs[0].start, 0);
  EXPECT_EQ(layout.packs[0].used, 138);
  EXPECT_EQ(layout.packs[0].first_item, 0u);
  EXPECT_EQ(layout.packs[1].start, 4096 + 204800);
  EXPECT_EQ(layout.packs[1].first_item, 4u);
  EXPECT_EQ(layout.end, 4096 + 204800 + kPackItemBytes);
}

TEST(FsLayout, PacksCloseWhenFullAndBytesFollowUnalignedWhenBuffered) {
  std::vector<LayoutItem> items(17, LayoutItem{kPackItemBytes, true, false});
  const FileLayout full = LayOutFile(items, /*direct_io=*/true);
  // 16 items of 64 KiB fill a 1 MiB pack; the 17th opens the next.
  EXPECT_EQ(full.packs.size(), 2u);
  EXPECT_EQ(full.offset[16], kPackBytes);
  EXPECT_EQ(full.end, kPackBytes + kPackItemBytes);

  const std::vector<LayoutItem> bytes = {{100000, false, false},
                                         {70000, false, false}};
  EXPECT_THAT(LayOutFile(bytes, /*direct_io=*/false).offset,
              ElementsAre(0, 100000));
  const FileLayout direct = LayOutFile(bytes, /*direct_io=*/true);
  EXPECT_THAT(direct.offset, ElementsAre(0, 102400));
  EXPECT_EQ(direct.end, 102400 + 73728);
}

}  // namespace
}  // namespace dcp::internal_fs
