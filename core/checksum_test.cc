#include "core/checksum.h"

#include <xxhash.h>

#include <algorithm>
#include <cstddef>
#include <random>
#include <string>
#include <vector>

#include "core/internal/xxh3_avx2.h"
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

// The AVX2 build of XXH3 that Checksum picks on CPUs with AVX2 gives the
// library's values for every length class XXH3 treats apart (0-16, 17-128,
// 129-240, long inputs in stripes, blocks and a partial last stripe) at
// every alignment.
TEST(Checksum, Avx2VariantMatchesTheLibrary) {
  ASSERT_TRUE(internal::Xxh3Avx2Built()) << "core/BUILD.bazel gives -mavx2";
  if (!__builtin_cpu_supports("avx2")) GTEST_SKIP() << "no AVX2 on this CPU";
  std::vector<unsigned char> data((size_t{4} << 20) + 64);
  std::mt19937_64 random(17);
  for (auto& b : data) b = static_cast<unsigned char>(random());
  std::vector<size_t> sizes;
  for (size_t n = 0; n <= 2100; ++n) sizes.push_back(n);
  for (size_t n : {4095, 4096, 4097, 65535, 65536, 1 << 20, (4 << 20) + 3}) {
    sizes.push_back(n);
  }
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t n : sizes) {
      const unsigned char* p = data.data() + offset;
      ASSERT_EQ(internal::Xxh3Avx2(p, n), XXH3_64bits(p, n))
          << "size " << n << " offset " << offset;
      ASSERT_EQ(Checksum(p, n), XXH3_64bits(p, n))
          << "size " << n << " offset " << offset;
    }
  }
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
