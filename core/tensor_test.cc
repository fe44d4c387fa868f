#include "core/tensor.h"

#include <cstring>
#include <numeric>

#include "core/sharded_tensor.h"
#include "gtest/gtest.h"

namespace dcp {
namespace {

TEST(Tensor, ZeroDimAndZeroElement) {
  Tensor scalar = Tensor::Empty(DType::kF64, {});
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.nbytes(), 8u);
  Tensor empty = Tensor::Empty(DType::kF32, {3, 0, 2});
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(empty.nbytes(), 0u);
  EXPECT_TRUE(empty.view().is_contiguous());
}

TEST(Tensor, CheckedCountsRejectNegativeSizesAndOverflow) {
  EXPECT_EQ(CheckedNumElements({}), 1);
  EXPECT_EQ(CheckedNumElements({3, 4}), 12);
  // A zero size empties the shape even when the other sizes would overflow.
  EXPECT_EQ(CheckedNumElements({int64_t{1} << 40, int64_t{1} << 40, 0}), 0);
  EXPECT_EQ(CheckedNumElements({int64_t{1} << 32, int64_t{1} << 32}),
            std::nullopt);
  EXPECT_EQ(CheckedNumElements({2, -1}), std::nullopt);
  EXPECT_EQ(CheckedNumBytes(DType::kF32, {5, 7}), 140);
  // 2^61 elements fit int64_t; their bytes at 8 per element do not.
  EXPECT_EQ(CheckedNumBytes(DType::kF64, {int64_t{1} << 61}), std::nullopt);
}

TEST(Tensor, EmptyOfAnOverflowingShapeThrowsInsteadOfWrapping) {
  // 2^62 float elements: 2^64 bytes, which wraps to 0 in 64 bits.
  EXPECT_THROW(Tensor::Empty(DType::kF32, {int64_t{1} << 62}), std::bad_alloc);
  EXPECT_THROW(Tensor::Empty(DType::kF32, {-4}), std::bad_alloc);
}

TEST(Tensor, EmptyIsAlignedAndZeroed) {
  Tensor t = Tensor::Empty(DType::kI32, {5, 7});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 4096, 0u);
  for (int i = 0; i < 35; ++i) EXPECT_EQ(static_cast<int32_t*>(t.data())[i], 0);
}

TEST(Tensor, ContiguousCopyOfTransposedView) {
  std::vector<int32_t> data(6);
  std::iota(data.begin(), data.end(), 0);  // [[0,1,2],[3,4,5]]
  // Transpose: shape [3,2], strides [1,3].
  TensorView transposed(data.data(), DType::kI32, {3, 2}, {1, 3},
                        Device::Cpu());
  EXPECT_FALSE(transposed.is_contiguous());
  absl::StatusOr<Tensor> copy = Tensor::Wrap(transposed).ContiguousHostCopy();
  ASSERT_TRUE(copy.ok());
  const int32_t* out = static_cast<const int32_t*>(copy->data());
  EXPECT_EQ(std::vector<int32_t>(out, out + 6),
            (std::vector<int32_t>{0, 3, 1, 4, 2, 5}));
}

TEST(Tensor, DeviceTensorCannotBeCopiedOnHost) {
  TensorView view(reinterpret_cast<void*>(0x1000), DType::kF32, {4},
                  Device::Cuda(0));
  EXPECT_EQ(Tensor::Wrap(view).ContiguousHostCopy().status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ShardedTensor, ValidateRejectsOutOfBounds) {
  ShardedTensor ok(DType::kF32, {4, 4},
                   {Shard{{0, 0}, Tensor::Empty(DType::kF32, {2, 4})}});
  EXPECT_TRUE(ok.Validate("w").ok());
  ShardedTensor bad(DType::kF32, {4, 4},
                    {Shard{{3, 0}, Tensor::Empty(DType::kF32, {2, 4})}});
  absl::Status s = bad.Validate("layer.w");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("layer.w"), absl::string_view::npos);
  ShardedTensor wrong_dtype(DType::kF32, {4},
                            {Shard{{0}, Tensor::Empty(DType::kI8, {4})}});
  EXPECT_FALSE(wrong_dtype.Validate("w").ok());
}

}  // namespace
}  // namespace dcp
