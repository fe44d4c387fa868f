#include "planner/chunk_geometry.h"

#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dcp {
namespace {

using ::testing::HasSubstr;

ChunkStorageMetadata RandomBox(std::mt19937_64& rng, const Shape& global) {
  ChunkStorageMetadata c;
  for (int64_t g : global) {
    const int64_t a = rng() % (g + 1);
    const int64_t b = rng() % (g + 1);
    c.offsets.push_back(std::min(a, b));
    c.sizes.push_back(std::max(a, b) - std::min(a, b));
  }
  return c;
}

// Elements of `global` (row-major positions) inside `c`.
std::vector<int64_t> Cells(const ChunkStorageMetadata& c, const Shape& global) {
  std::vector<int64_t> out;
  const int64_t n = NumElements(c.sizes);
  const Shape strides = ContiguousStrides(global);
  for (int64_t k = 0; k < n; ++k) {
    int64_t rest = k;
    int64_t pos = 0;
    for (size_t d = c.sizes.size(); d-- > 0;) {
      pos += (c.offsets[d] + rest % c.sizes[d]) * strides[d];
      rest /= c.sizes[d];
    }
    out.push_back(pos);
  }
  return out;
}

TEST(ChunkGeometryTest, ForEachOverlapMatchesAllPairs) {
  std::mt19937_64 rng(99);
  for (int trial = 0; trial < 2000; ++trial) {
    const size_t rank = rng() % 5;
    Shape global;
    for (size_t d = 0; d < rank; ++d) global.push_back(rng() % 7);
    std::vector<ChunkStorageMetadata> a(rng() % 6), b(rng() % 6);
    for (auto& c : a) c = RandomBox(rng, global);
    for (auto& c : b) c = RandomBox(rng, global);
    std::set<std::pair<size_t, size_t>> want;
    for (size_t i = 0; i < a.size(); ++i) {
      for (size_t j = 0; j < b.size(); ++j) {
        if (IntersectChunks(a[i], b[j]).has_value()) want.insert({i, j});
      }
    }
    std::set<std::pair<size_t, size_t>> got;
    ForEachOverlap(
        a, b, [&](size_t i, size_t j, const ChunkStorageMetadata& box) {
          EXPECT_TRUE(got.insert({i, j}).second) << "pair reported twice";
          EXPECT_EQ(box, *IntersectChunks(a[i], b[j]));
        });
    EXPECT_EQ(got, want) << "trial " << trial;
  }
}

// ValidateTiling agrees with counting every element, on random (mostly
// invalid) box sets and on random guillotine tilings (valid).
TEST(ChunkGeometryTest, ValidateTilingMatchesCellCount) {
  std::mt19937_64 rng(7);
  int valid = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const size_t rank = rng() % 4;
    Shape global;
    for (size_t d = 0; d < rank; ++d) global.push_back(1 + rng() % 4);
    std::vector<ChunkStorageMetadata> chunks;
    if (trial % 2 == 0) {
      // Guillotine cuts, then maybe one perturbation.
      chunks.push_back({Shape(rank, 0), global});
      for (int cut = 0; cut < 4 && rank > 0; ++cut) {
        const size_t pick = rng() % chunks.size();
        const size_t d = rng() % rank;
        ChunkStorageMetadata c = chunks[pick];
        if (c.sizes[d] < 2) continue;
        const int64_t at = 1 + rng() % (c.sizes[d] - 1);
        ChunkStorageMetadata rest = c;
        chunks[pick].sizes[d] = at;
        rest.offsets[d] += at;
        rest.sizes[d] -= at;
        chunks.push_back(rest);
      }
      if (rng() % 3 == 0 && rank > 0) {
        ChunkStorageMetadata& c = chunks[rng() % chunks.size()];
        const size_t d = rng() % rank;
        if (rng() % 2 && c.offsets[d] > 0) {
          --c.offsets[d];
        } else if (c.sizes[d] > 0) {
          --c.sizes[d];
        }
      }
    } else {
      chunks.resize(rng() % 5);
      for (auto& c : chunks) c = RandomBox(rng, global);
    }
    std::vector<int> count(NumElements(global), 0);
    for (const auto& c : chunks) {
      for (int64_t cell : Cells(c, global)) ++count[cell];
    }
    const bool exact =
        std::all_of(count.begin(), count.end(), [](int c) { return c == 1; });
    absl::Status status = ValidateTiling(
        "t", global, chunks, [&](size_t i) { return absl::StrCat("#", i); });
    EXPECT_EQ(status.ok(), exact) << "trial " << trial << " shape "
                                  << ShapeToString(global) << ": " << status;
    if (!exact) {
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
      const bool overlap =
          std::any_of(count.begin(), count.end(), [](int c) { return c > 1; });
      EXPECT_THAT(status.message(),
                  HasSubstr(overlap ? "overlap" : "cover the whole tensor"))
          << "trial " << trial;
    }
    valid += exact;
  }
  EXPECT_GT(valid, 500);
}

TEST(ChunkGeometryTest, HighRankUsesSweep) {
  const Shape global(12, 2);
  std::vector<ChunkStorageMetadata> halves(2, {Shape(12, 0), global});
  halves[0].sizes[5] = 1;
  halves[1].offsets[5] = 1;
  halves[1].sizes[5] = 1;
  auto describe = [](size_t i) { return absl::StrCat("#", i); };
  EXPECT_TRUE(ValidateTiling("t", global, halves, describe).ok());
  halves[1].sizes[7] = 1;
  EXPECT_THAT(ValidateTiling("t", global, halves, describe).message(),
              HasSubstr("hold 3072 of 4096 elements"));
}

TEST(ChunkGeometryTest, RankMismatch) {
  absl::Status status = ValidateTiling("t", {4}, {{{0, 0}, {4, 1}}},
                                       [](size_t) { return std::string("c"); });
  EXPECT_THAT(status.message(),
              HasSubstr("chunk c has rank 2 but the tensor's shape is [4]"));
}

}  // namespace
}  // namespace dcp
