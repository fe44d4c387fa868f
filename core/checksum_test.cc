#include "core/checksum.h"

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dcp {
namespace {

TEST(Checksum, KnownValueAndStreamingAgrees) {
  // XXH3-64 of the empty input with seed 0 (xxHash reference value).
  EXPECT_EQ(Checksum("", 0), 0x2D06800538D394C2ULL);
  std::string data(100000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  StreamingChecksum stream;
  stream.Update(data.data(), 1);
  stream.Update(data.data() + 1, 4095);
  stream.Update(data.data() + 4096, data.size() - 4096);
  EXPECT_EQ(stream.Digest(), Checksum(data.data(), data.size()));
  data[500] ^= 1;
  EXPECT_NE(stream.Digest(), Checksum(data.data(), data.size()));
}

TEST(BlockChecksums, OnePerBlockTheLastShorter) {
  std::vector<std::byte> data(10000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = std::byte(i * 13);
  const std::vector<uint64_t> sums = BlockChecksums(data.data(), 10000, 4096);
  ASSERT_EQ(sums.size(), 3u);
  EXPECT_EQ(sums[0], Checksum(data.data(), 4096));
  EXPECT_EQ(sums[1], Checksum(data.data() + 4096, 4096));
  EXPECT_EQ(sums[2], Checksum(data.data() + 8192, 10000 - 8192));
  EXPECT_TRUE(BlockChecksums(data.data(), 0, 4096).empty());
}

TEST(BlockChecksummer, PiecesGiveTheWholesChecksumsAndItemsStaySeparate) {
  std::vector<std::byte> data(10000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = std::byte(i * 31);
  BlockChecksummer summer(4096);
  // Pieces that straddle block boundaries.
  for (int64_t pos = 0; pos < 10000; pos += 3000) {
    summer.Update(data.data() + pos, std::min<int64_t>(3000, 10000 - pos));
  }
  EXPECT_EQ(summer.Finish(), BlockChecksums(data.data(), 10000, 4096));
  // The next item starts from nothing.
  summer.Update(data.data(), 100);
  EXPECT_EQ(summer.Finish(), BlockChecksums(data.data(), 100, 4096));
  EXPECT_TRUE(summer.Finish().empty());
}

}  // namespace
}  // namespace dcp
