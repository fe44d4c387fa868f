#include "io/fs_read_window.h"

#include <cstring>
#include <string>
#include <vector>

#include "core/checksum.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file_system.h"

namespace dcp::internal_fs {
namespace {

using ::testing::HasSubstr;

// A slot over a bytes item of `length` bytes at file offset 100, its data
// already in `data` (as a finished buffered read leaves it).
struct Fixture {
  explicit Fixture(int64_t length) : data(length) {
    for (int64_t i = 0; i < length; ++i) data[i] = std::byte(i * 7);
    info = {"__0_0123456789abcdef_0.distcp", 100, length,
            BlockChecksums(data.data(), length, kBlock)};
    stored.index = &index;
    stored.info = &info;
    file = *LocalFileSystem().OpenForWrite(
        JoinPath(::testing::TempDir(), "fs_read_window_test"), [] {
          OpenOptions o;
          o.exclusive = false;
          return o;
        }());
    slot.stored = &stored;
    slot.file = file.get();
    slot.first_block = 0;
    slot.end_block = ChecksumBlocks();
    slot.begin = 0;
    slot.end = length;
    slot.io_end = length;  // Stored as it is: the same bytes.
    slot.target = data.data();
  }
  int64_t ChecksumBlocks() const { return (info.length + kBlock - 1) / kBlock; }

  static constexpr int64_t kBlock = 64;
  std::vector<std::byte> data;
  MetadataIndex index{"extra"};
  StorageInfo info;
  StoredItem stored;
  std::unique_ptr<File> file;
  ReadSlot slot;
};

TEST(FsReadWindow, AllBytesMatchingTheirChecksumsVerify) {
  Fixture f(200);
  EXPECT_TRUE(VerifySlot(f.slot, 200, Fixture::kBlock).ok());
}

TEST(FsReadWindow, AFlippedByteIsDataLossNamingItemFileAndOffset) {
  Fixture f(200);
  f.data[130] ^= std::byte{1};
  absl::Status status = VerifySlot(f.slot, 200, Fixture::kBlock);
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  // Block 2 of the item: file offset 100 + 128.
  EXPECT_THAT(
      status.message(),
      AllOf(HasSubstr("checksum mismatch in extra"), HasSubstr(f.file->path()),
            HasSubstr("offset 228"), HasSubstr("length 64")));
}

TEST(FsReadWindow, AShortReadIsATruncatedFile) {
  Fixture f(200);
  absl::Status status = VerifySlot(f.slot, 150, Fixture::kBlock);
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_THAT(status.message(),
              HasSubstr("is truncated: extra needs bytes [100, 300) but the "
                        "file ends at offset 250"));
}

TEST(FsReadWindow, AwaitSlotCountsTheBytesPastTheAlignmentLead) {
  Fixture f(200);
  // An O_DIRECT read into a bounce buffer starting `lead` bytes early that
  // hit the end of the file.
  f.slot.lead = 100;
  f.slot.reads.push_back(Future<size_t>::Ready(size_t{250}));
  EXPECT_EQ(*AwaitSlot(f.slot), 150);
  f.slot.reads = {Future<size_t>::Ready(size_t{4096})};
  EXPECT_EQ(*AwaitSlot(f.slot), 200);
  f.slot.reads = {Future<size_t>::Ready(absl::DataLossError("EIO"))};
  EXPECT_TRUE(absl::IsDataLoss(AwaitSlot(f.slot).status()));
}

TEST(FsReadWindow, BounceMeterKeepsThePeak) {
  BounceMeter meter;
  {
    BounceBuffer a(100, meter);
    BounceBuffer b(50, meter);
  }
  BounceBuffer c(120, meter);
  EXPECT_EQ(meter.peak(), 150);
}

}  // namespace
}  // namespace dcp::internal_fs
