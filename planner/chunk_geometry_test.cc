#include "planner/chunk_geometry.h"

#include <algorithm>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dcp {
namespace {

using ::testing::AllOf;
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

// A shape of rank < 4 with dimensions in [1, max_dim].
Shape RandomShape(std::mt19937_64& rng, int64_t max_dim) {
  Shape global(rng() % 4);
  for (int64_t& d : global) d = 1 + rng() % max_dim;
  return global;
}

// Splits the whole of `global` by up to `cuts` random guillotine cuts (a
// valid tiling).
std::vector<ChunkStorageMetadata> GuillotineTiling(std::mt19937_64& rng,
                                                   const Shape& global,
                                                   int cuts) {
  const size_t rank = global.size();
  std::vector<ChunkStorageMetadata> chunks = {{Shape(rank, 0), global}};
  for (int cut = 0; cut < cuts && rank > 0; ++cut) {
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
  return chunks;
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

// FindCoveringChunks: on tilings sorted by offset it finds exactly the
// overlapping chunks, and always on splits along one dimension; whenever it
// answers (any input), its boxes tile the requested chunk exactly once.
TEST(ChunkGeometryTest, FindCoveringChunksIsExactWhenItAnswers) {
  std::mt19937_64 rng(5);
  int answered_tilings = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const Shape global = RandomShape(rng, 6);
    const size_t rank = global.size();
    std::vector<ChunkStorageMetadata> saved;
    // 0: split along one dimension, 1: tiling, 2: random boxes.
    const int kind = rank == 0 ? 2 : trial % 3;
    if (kind == 0) {
      // Split along one dimension, in order: the fast path must answer.
      const size_t d = rng() % rank;
      for (int64_t at = 0; at < global[d];) {
        const int64_t len = 1 + rng() % (global[d] - at);
        ChunkStorageMetadata c{Shape(rank, 0), global};
        c.offsets[d] = at;
        c.sizes[d] = len;
        saved.push_back(c);
        at += len;
      }
    } else if (kind == 1) {
      // Guillotine tiling, sorted by offset as metadata keeps it.
      saved = GuillotineTiling(rng, global, 5);
      std::sort(
          saved.begin(), saved.end(),
          [](const ChunkStorageMetadata& a, const ChunkStorageMetadata& b) {
            return a.offsets < b.offsets;
          });
    } else {
      saved.resize(rng() % 5);
      for (auto& c : saved) c = RandomBox(rng, global);
    }
    const ChunkStorageMetadata want = RandomBox(rng, global);
    std::vector<ChunkOverlap> out = {{99, {}}};  // Kept as it is.
    const bool answered = FindCoveringChunks(want, saved, &out);
    ASSERT_GE(out.size(), 1u);
    EXPECT_EQ(out[0].saved, 99u);
    if (!answered) {
      EXPECT_EQ(out.size(), 1u) << "trial " << trial;
      EXPECT_NE(kind, 0) << "trial " << trial << " shape "
                         << ShapeToString(global);
      continue;
    }
    out.erase(out.begin());
    std::vector<int> count(NumElements(global), 0);
    for (const ChunkOverlap& o : out) {
      ASSERT_LT(o.saved, saved.size());
      EXPECT_EQ(o.box, *IntersectChunks(want, saved[o.saved]));
      for (int64_t cell : Cells(o.box, global)) ++count[cell];
    }
    for (int64_t cell : Cells(want, global)) {
      EXPECT_EQ(count[cell], 1) << "trial " << trial;
      count[cell] = 0;
    }
    EXPECT_TRUE(
        std::all_of(count.begin(), count.end(), [](int c) { return c == 0; }))
        << "trial " << trial << ": a box outside the requested chunk";
    if (kind != 2) {
      // A tiling: exactly the overlapping chunks.
      std::set<size_t> got;
      for (const ChunkOverlap& o : out) got.insert(o.saved);
      std::set<size_t> expected;
      for (size_t j = 0; j < saved.size(); ++j) {
        if (IntersectChunks(want, saved[j]).has_value()) expected.insert(j);
      }
      EXPECT_EQ(got, expected) << "trial " << trial;
      ++answered_tilings;
    }
  }
  EXPECT_GT(answered_tilings, 1000);
}

// ValidateTiling agrees with counting every element, on random (mostly
// invalid) box sets and on random guillotine tilings (valid).
TEST(ChunkGeometryTest, ValidateTilingMatchesCellCount) {
  std::mt19937_64 rng(7);
  int valid = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const Shape global = RandomShape(rng, 4);
    const size_t rank = global.size();
    std::vector<ChunkStorageMetadata> chunks;
    if (trial % 2 == 0) {
      // Guillotine cuts, then maybe one perturbation.
      chunks = GuillotineTiling(rng, global, 4);
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

// A rank-10 grid of 1024 one-element chunks is past the corner test's
// budget (its 2^10 corners per chunk once took 80 KB and a millisecond per
// chunk): the sweep decides, with the same answers.
TEST(ChunkGeometryTest, ManyHighRankChunksUseTheSweep) {
  const Shape global(10, 2);
  std::vector<ChunkStorageMetadata> cells;
  for (int64_t cell = 0; cell < 1024; ++cell) {
    ChunkStorageMetadata c{Shape(10, 0), Shape(10, 1)};
    for (int d = 0; d < 10; ++d) c.offsets[d] = (cell >> d) & 1;
    cells.push_back(c);
  }
  auto describe = [](size_t i) { return absl::StrCat("#", i); };
  EXPECT_TRUE(ValidateTiling("t", global, cells, describe).ok());
  std::vector<ChunkStorageMetadata> missing(cells.begin() + 1, cells.end());
  EXPECT_THAT(ValidateTiling("t", global, missing, describe).message(),
              HasSubstr("hold 1023 of 1024 elements"));
  cells.push_back(cells[7]);
  EXPECT_THAT(ValidateTiling("t", global, cells, describe).message(),
              AllOf(HasSubstr("#7"), HasSubstr("#1024")));
}

// A scalar (rank 0) is one element: one chunk covers it, none leaves it
// uncovered. The uncovered case reaches the corner-count test with no
// coordinates at all (an empty vector, which it once indexed; caught by
// bazel test --config=asan).
TEST(ChunkGeometryTest, ScalarTiling) {
  auto describe = [](size_t i) { return absl::StrCat("#", i); };
  EXPECT_TRUE(ValidateTiling("s", {}, {{{}, {}}}, describe).ok());
  absl::Status none = ValidateTiling("s", {}, {}, describe);
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.message(), HasSubstr("cover the whole tensor"));
}

TEST(ChunkGeometryTest, RankMismatch) {
  absl::Status status = ValidateTiling("t", {4}, {{{0, 0}, {4, 1}}},
                                       [](size_t) { return std::string("c"); });
  EXPECT_THAT(status.message(),
              HasSubstr("chunk c has rank 2 but the tensor's shape is [4]"));
}

}  // namespace
}  // namespace dcp
