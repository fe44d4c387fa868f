#include "cuda/host_copy.h"

#include <vector>

#include "gtest/gtest.h"

namespace dcp {
namespace {

TEST(BulkHostCopyTest, ByteExactForAnyAlignmentAndTail) {
  const size_t max = kBulkHostCopyThreshold * 2 + 200;
  std::vector<unsigned char> src(max + 64), dst(max + 64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = (i * 37 + 11) & 0xff;
  for (size_t n : {size_t{0}, size_t{1}, size_t{63}, kBulkHostCopyThreshold - 1,
                   kBulkHostCopyThreshold, kBulkHostCopyThreshold + 1,
                   kBulkHostCopyThreshold * 2 + 77}) {
    for (size_t src_off : {0, 1, 7, 16}) {
      for (size_t dst_off : {0, 3, 15, 32}) {
        std::fill(dst.begin(), dst.end(), 0xee);
        BulkHostCopy(dst.data() + dst_off, src.data() + src_off, n);
        for (size_t i = 0; i < dst_off; ++i) ASSERT_EQ(dst[i], 0xee);
        ASSERT_TRUE(std::equal(src.begin() + src_off, src.begin() + src_off + n,
                               dst.begin() + dst_off))
            << n << " " << src_off << " " << dst_off;
        ASSERT_EQ(dst[dst_off + n], 0xee);  // Nothing written past the end.
      }
    }
  }
}

}  // namespace
}  // namespace dcp
