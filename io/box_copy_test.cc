#include "io/box_copy.h"

#include <cstdint>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"

namespace dcp {
namespace {

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
}

}  // namespace
}  // namespace dcp
