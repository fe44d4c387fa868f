#include "core/box_copy.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace dcp {
namespace {

// Integers drawn uniformly from [lo, hi], the same sequence for a seed.
class Uniform {
 public:
  explicit Uniform(uint64_t seed) : rng_(seed) {}
  int64_t operator()(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }

 private:
  std::mt19937_64 rng_;
};

TEST(CopyBoxTest, CopiesInnerBoxOf3dChunkIntoOffsetOfDestination) {
  // Source 3x4x5 holding 0..59; box [1:3, 1:3, 2:5] into a 4x3x4 destination
  // at [1, 0, 1].
  std::vector<int32_t> src(60);
  std::iota(src.begin(), src.end(), 0);
  std::vector<int32_t> dst(48, -1);
  TensorView view(dst.data(), DType::kI32, {4, 3, 4});
  ASSERT_TRUE(CopyBox(reinterpret_cast<const std::byte*>(src.data()), {3, 4, 5},
                      {1, 1, 2}, 4, view, {1, 0, 1}, {2, 2, 3})
                  .ok());
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 3; ++j) {
      for (int k = 0; k < 4; ++k) {
        const int32_t got = dst[(i * 3 + j) * 4 + k];
        const bool inside = i >= 1 && i < 3 && j < 2 && k >= 1 && k < 4;
        const int32_t want =
            inside ? ((i - 1 + 1) * 4 + (j + 1)) * 5 + (k - 1 + 2) : -1;
        ASSERT_EQ(got, want) << i << "," << j << "," << k;
      }
    }
  }
}

TEST(CopyBoxTest, CopiesIntoStridedDestination) {
  // A transposed 3x2 view over a 2x3 buffer.
  std::vector<int16_t> src = {1, 2, 3, 4, 5, 6};  // 3x2.
  std::vector<int16_t> buffer(6, 0);
  TensorView transposed(buffer.data(), DType::kI16, {3, 2}, {1, 3},
                        Device::Cpu());
  ASSERT_TRUE(CopyBox(reinterpret_cast<const std::byte*>(src.data()), {3, 2},
                      {0, 0}, 2, transposed, {0, 0}, {3, 2})
                  .ok());
  EXPECT_EQ(buffer, (std::vector<int16_t>{1, 3, 5, 2, 4, 6}));
}

TEST(CopyBoxTest, ScalarAndEmptyBoxes) {
  double src = 2.5, dst = 0;
  ASSERT_TRUE(CopyBox(reinterpret_cast<const std::byte*>(&src), {}, {}, 8,
                      TensorView(&dst, DType::kF64, {}), {}, {})
                  .ok());
  EXPECT_EQ(dst, 2.5);
  float f = 1;
  EXPECT_TRUE(CopyBox(reinterpret_cast<const std::byte*>(&src), {0, 3}, {0, 0},
                      4, TensorView(&f, DType::kF32, {0, 3}), {0, 0}, {0, 3})
                  .ok());
}

TEST(CopyBoxTest, RejectsBoxOutsideEitherArrayAndElementMismatch) {
  std::vector<float> src(6), dst(6);
  TensorView view(dst.data(), DType::kF32, {2, 3});
  const auto* s = reinterpret_cast<const std::byte*>(src.data());
  EXPECT_EQ(CopyBox(s, {2, 3}, {1, 0}, 4, view, {0, 0}, {2, 3}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CopyBox(s, {2, 3}, {0, 0}, 4, view, {0, 1}, {2, 3}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CopyBox(s, {6}, {0}, 4, view, {0, 0}, {2, 3}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CopyBox(s, {2, 3}, {0, 0}, 8, view, {0, 0}, {1, 1}).code(),
            absl::StatusCode::kInvalidArgument);
  // offset + length overflows int64: wrapped, it would look inside.
  EXPECT_EQ(CopyBox(s, {2, 3}, {0, INT64_MAX}, 4, view, {0, 0}, {1, 2}).code(),
            absl::StatusCode::kInvalidArgument);
}

// Random N-d boxes, destinations (contiguous and transposed) and windows:
// copying window by window gives exactly what one CopyBox gives, and each
// window is read only inside its bounds (bytes around it are poison).
TEST(CopyBoxPartTest, WindowByWindowEqualsWholeCopyForRandomBoxes) {
  Uniform uniform(42);
  for (int trial = 0; trial < 400; ++trial) {
    const int rank = static_cast<int>(uniform(1, 4));
    Shape sizes, offsets, lengths, dst_sizes, dst_offsets;
    for (int d = 0; d < rank; ++d) {
      sizes.push_back(uniform(1, 7));
      offsets.push_back(uniform(0, sizes[d] - 1));
      lengths.push_back(uniform(0, sizes[d] - offsets[d]));
      dst_offsets.push_back(uniform(0, 2));
      dst_sizes.push_back(dst_offsets[d] + lengths[d] + uniform(0, 2));
    }
    const int64_t n = NumElements(sizes);
    std::vector<int32_t> src(n);
    std::iota(src.begin(), src.end(), 1000);
    const bool transposed = rank >= 2 && uniform(0, 1) == 1;
    // Destination memory: a contiguous array, or one whose last two
    // dimensions are swapped in memory (a transposed view).
    Shape memory_sizes = dst_sizes;
    if (transposed) std::swap(memory_sizes[rank - 1], memory_sizes[rank - 2]);
    Shape strides = ContiguousStrides(memory_sizes);
    if (transposed) std::swap(strides[rank - 1], strides[rank - 2]);
    const int64_t dst_n = NumElements(dst_sizes);
    std::vector<int32_t> want(dst_n, -1), got(dst_n, -1);
    TensorView want_view(want.data(), DType::kI32, dst_sizes, strides,
                         Device::Cpu());
    TensorView got_view(got.data(), DType::kI32, dst_sizes, strides,
                        Device::Cpu());
    ASSERT_TRUE(CopyBox(reinterpret_cast<const std::byte*>(src.data()), sizes,
                        offsets, 4, want_view, dst_offsets, lengths)
                    .ok());
    // Random cut points split [0, n) into windows.
    std::vector<int64_t> cuts = {0, n};
    for (int c = static_cast<int>(uniform(0, 5)); c > 0; --c) {
      cuts.push_back(uniform(0, n));
    }
    std::sort(cuts.begin(), cuts.end());
    for (size_t w = 0; w + 1 < cuts.size(); ++w) {
      const int64_t begin = cuts[w], end = cuts[w + 1];
      std::vector<int32_t> window(end - begin + 8, -7);  // Poison around.
      std::copy(src.begin() + begin, src.begin() + end, window.begin() + 4);
      ASSERT_TRUE(
          CopyBoxPart(reinterpret_cast<const std::byte*>(window.data() + 4),
                      begin, end, sizes, offsets, 4, got_view, dst_offsets,
                      lengths)
              .ok());
    }
    ASSERT_EQ(got, want) << "trial " << trial << " sizes "
                         << ShapeToString(sizes) << " box at "
                         << ShapeToString(offsets) << " of "
                         << ShapeToString(lengths);
    // The span holds every box element.
    auto [first, last] = BoxSpan(sizes, offsets, lengths);
    if (NumElements(lengths) > 0) {
      std::vector<int32_t> inside(dst_n, -1);
      TensorView inside_view(inside.data(), DType::kI32, dst_sizes, strides,
                             Device::Cpu());
      ASSERT_TRUE(
          CopyBoxPart(reinterpret_cast<const std::byte*>(src.data() + first),
                      first, last, sizes, offsets, 4, inside_view, dst_offsets,
                      lengths)
              .ok());
      ASSERT_EQ(inside, want) << "trial " << trial;
    }
  }
}

TEST(CopyBoxPartTest, ScalarAndRejectedWindows) {
  double src = 2.5, dst = 0;
  TensorView view(&dst, DType::kF64, {});
  const auto* s = reinterpret_cast<const std::byte*>(&src);
  ASSERT_TRUE(CopyBoxPart(s, 0, 0, {}, {}, 8, view, {}, {}).ok());
  EXPECT_EQ(dst, 0);
  ASSERT_TRUE(CopyBoxPart(s, 0, 1, {}, {}, 8, view, {}, {}).ok());
  EXPECT_EQ(dst, 2.5);
  std::vector<float> chunk(6), out(6);
  TensorView out_view(out.data(), DType::kF32, {2, 3});
  const auto* c = reinterpret_cast<const std::byte*>(chunk.data());
  EXPECT_EQ(
      CopyBoxPart(c, 4, 7, {2, 3}, {0, 0}, 4, out_view, {0, 0}, {2, 3}).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      CopyBoxPart(c, 3, 2, {2, 3}, {0, 0}, 4, out_view, {0, 0}, {2, 3}).code(),
      absl::StatusCode::kInvalidArgument);
}

// The chunk elements of a random box, found by brute force, against the box
// index geometry: BoxElementsBefore, ChunkElementOfBoxElement and
// RowMajorCoordinates.
TEST(BoxIndexTest, ElementsBeforeAndChunkElementMatchBruteForce) {
  Uniform uniform(11);
  for (int trial = 0; trial < 300; ++trial) {
    const int rank = static_cast<int>(uniform(0, 4));
    Shape sizes, offsets, lengths;
    for (int d = 0; d < rank; ++d) {
      sizes.push_back(uniform(1, 5));
      offsets.push_back(uniform(0, sizes[d] - 1));
      lengths.push_back(uniform(1, sizes[d] - offsets[d]));
    }
    std::vector<int64_t> members;
    const int64_t n = NumElements(sizes);
    for (int64_t e = 0; e < n; ++e) {
      const Shape coords = RowMajorCoordinates(e, sizes);
      int64_t linear = 0;
      bool inside = true;
      for (int d = 0; d < rank; ++d) {
        linear = linear * sizes[d] + coords[d];
        inside &=
            coords[d] >= offsets[d] && coords[d] < offsets[d] + lengths[d];
      }
      ASSERT_EQ(linear, e) << "trial " << trial;
      if (inside) members.push_back(e);
    }
    ASSERT_EQ(static_cast<int64_t>(members.size()), NumElements(lengths));
    for (int64_t e = 0; e <= n + 1; ++e) {
      const int64_t expected =
          std::lower_bound(members.begin(), members.end(), e) - members.begin();
      ASSERT_EQ(BoxElementsBefore(sizes, offsets, lengths, e), expected)
          << "trial " << trial << " e " << e;
    }
    for (size_t b = 0; b < members.size(); ++b) {
      ASSERT_EQ(ChunkElementOfBoxElement(sizes, offsets, lengths, b),
                members[b]);
    }
  }
}

}  // namespace
}  // namespace dcp
