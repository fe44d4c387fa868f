#include "io/internal/read_drop_behind.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace dcp {
namespace {

using Ranges = ReadDropBehind::Ranges;
constexpr int64_t kMiB = int64_t{1} << 20;

// A file read front to back in 1 MiB parts: every whole 4 MiB stretch is
// dropped as soon as its last part is in, once.
TEST(ReadDropBehindTest, InOrderReadsDropEachAlignedStretchOnce) {
  ReadDropBehind drop(4 * kMiB);
  Ranges all;
  for (int64_t i = 0; i < 10; ++i) {
    Ranges got = drop.Done(i * kMiB, kMiB);
    if ((i + 1) % 4 == 0) {
      EXPECT_EQ(got, (Ranges{{(i - 3) * kMiB, (i + 1) * kMiB}})) << i;
    } else {
      EXPECT_TRUE(got.empty()) << i;
    }
  }
  // The tail [8, 10) MiB is not a whole stretch: it waits for Rest.
  EXPECT_EQ(drop.Rest(), (Ranges{{8 * kMiB, 10 * kMiB}}));
  EXPECT_TRUE(drop.Rest().empty());
}

// Parts completing out of order: nothing next to a part still out is
// dropped, and every byte read is dropped exactly once by the end.
TEST(ReadDropBehindTest, OutOfOrderReadsNeverDropPastAPendingRead) {
  constexpr int64_t kBase = 3 * kMiB + 12345;  // Unaligned start.
  constexpr int kParts = 40;
  std::vector<int> order(kParts);
  for (int i = 0; i < kParts; ++i) order[i] = i;
  std::mt19937 rng(7);
  std::shuffle(order.begin(), order.end(), rng);
  ReadDropBehind drop(4 * kMiB);
  std::vector<bool> read(kParts, false);
  std::vector<int> dropped_times(kParts * 2 + 8, 0);  // Per MiB of file.
  auto part_of = [&](int64_t byte) { return (byte - kBase) / kMiB; };
  for (int p : order) {
    read[p] = true;
    for (const auto& [begin, end] : drop.Done(kBase + p * kMiB, kMiB)) {
      ASSERT_LT(begin, end);
      EXPECT_EQ(begin % (4 * kMiB), 0);
      EXPECT_EQ(end % (4 * kMiB), 0);
      // Every part the range touches has been read.
      for (int64_t q = part_of(begin); q <= part_of(end - 1); ++q) {
        EXPECT_TRUE(read[q]) << "dropped [" << begin << ", " << end
                             << ") while part " << q << " is out";
      }
      for (int64_t m = begin / kMiB; m < end / kMiB; ++m) ++dropped_times[m];
    }
  }
  const Ranges rest = drop.Rest();
  int64_t rest_bytes = 0;
  for (const auto& [begin, end] : rest) rest_bytes += end - begin;
  int64_t dropped_bytes = 0;
  for (int64_t m = 0; m < static_cast<int64_t>(dropped_times.size()); ++m) {
    EXPECT_LE(dropped_times[m], 1) << "MiB " << m << " dropped twice";
    dropped_bytes += dropped_times[m] * kMiB;
  }
  EXPECT_EQ(dropped_bytes + rest_bytes, kParts * kMiB);
}

// Runs that never touch keep their own ends; a read joining two runs drops
// the stretches that now lie wholly inside the joined run.
TEST(ReadDropBehindTest, JoiningRunsDropsTheStretchBetweenThem) {
  ReadDropBehind drop(4 * kMiB);
  EXPECT_TRUE(drop.Done(0, 3 * kMiB).empty());
  EXPECT_EQ(drop.Done(5 * kMiB, 7 * kMiB), (Ranges{{8 * kMiB, 12 * kMiB}}));
  EXPECT_EQ(drop.Done(3 * kMiB, 2 * kMiB), (Ranges{{0, 8 * kMiB}}));
  EXPECT_TRUE(drop.Done(0, 0).empty());
  EXPECT_TRUE(drop.Rest().empty());
}

}  // namespace
}  // namespace dcp
