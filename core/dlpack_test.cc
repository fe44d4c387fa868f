#include "core/dlpack.h"

#include <cstring>

#include "gtest/gtest.h"

namespace dcp {
namespace {

TEST(DLPack, ExportImportSharesMemoryAndKeepsItAlive) {
  Tensor original = Tensor::Empty(DType::kBF16, {3, 4});
  for (size_t i = 0; i < original.nbytes(); ++i) {
    static_cast<uint8_t*>(original.data())[i] = static_cast<uint8_t>(i);
  }
  absl::StatusOr<DLManagedTensor*> exported = ToDLPack(original);
  ASSERT_TRUE(exported.ok());
  EXPECT_EQ((*exported)->dl_tensor.dtype.code, kDLBfloat);
  EXPECT_EQ((*exported)->dl_tensor.ndim, 2);
  const void* data = original.data();
  original = Tensor();  // The export keeps the memory alive.
  absl::StatusOr<Tensor> imported = FromDLPack(*exported);
  ASSERT_TRUE(imported.ok());
  EXPECT_EQ(imported->data(), data);
  EXPECT_EQ(imported->dtype(), DType::kBF16);
  EXPECT_EQ(imported->sizes(), (Shape{3, 4}));
  EXPECT_EQ(static_cast<uint8_t*>(imported->data())[23], 23);
}

TEST(DLPack, EveryDTypeWithACodeRoundTrips) {
  for (int i = 0; i < kNumDTypes; ++i) {
    const DType dtype = static_cast<DType>(i);
    absl::StatusOr<DLManagedTensor*> exported =
        ToDLPack(Tensor::Empty(dtype, {2}));
    // Float8 and float4 have codes only from DLPack 1.1 (capi's bridge).
    if (dtype == DType::kF8E4M3 || dtype == DType::kF8E5M2 ||
        dtype == DType::kF8E4M3FNUZ || dtype == DType::kF8E5M2FNUZ ||
        dtype == DType::kF8E8M0 || dtype == DType::kF4E2M1X2) {
      EXPECT_EQ(exported.status().code(), absl::StatusCode::kInvalidArgument);
      continue;
    }
    ASSERT_TRUE(exported.ok()) << DTypeName(dtype);
    absl::StatusOr<Tensor> imported = FromDLPack(*exported);
    ASSERT_TRUE(imported.ok());
    EXPECT_EQ(imported->dtype(), dtype) << DTypeName(dtype);
  }
}

TEST(DLPack, ImportHonoursStridesOffsetAndDeleter) {
  static bool deleted = false;
  static int64_t shape[] = {2, 2};
  static int64_t strides[] = {1, 2};  // Transposed.
  static int32_t values[] = {0, 0, 10, 11, 12, 13};
  auto* managed = new DLManagedTensor{};
  managed->dl_tensor.data = values;
  managed->dl_tensor.byte_offset = 8;
  managed->dl_tensor.device = {kDLCPU, 0};
  managed->dl_tensor.ndim = 2;
  managed->dl_tensor.dtype = {kDLInt, 32, 1};
  managed->dl_tensor.shape = shape;
  managed->dl_tensor.strides = strides;
  managed->deleter = [](DLManagedTensor* self) {
    deleted = true;
    delete self;
  };
  {
    absl::StatusOr<Tensor> t = FromDLPack(managed);
    ASSERT_TRUE(t.ok());
    EXPECT_FALSE(t->view().is_contiguous());
    absl::StatusOr<Tensor> copy = t->ContiguousHostCopy();
    ASSERT_TRUE(copy.ok());
    const int32_t* out = static_cast<const int32_t*>(copy->data());
    EXPECT_EQ(std::vector<int32_t>(out, out + 4),
              (std::vector<int32_t>{10, 12, 11, 13}));
    EXPECT_FALSE(deleted);
  }
  EXPECT_TRUE(deleted);
}

TEST(DLPack, RejectsLanesAndUnknownDevices) {
  static bool deleted = false;
  auto* managed = new DLManagedTensor{};
  managed->dl_tensor.dtype = {kDLFloat, 32, 4};
  managed->dl_tensor.device = {kDLCPU, 0};
  managed->deleter = [](DLManagedTensor* self) {
    deleted = true;
    delete self;
  };
  EXPECT_EQ(FromDLPack(managed).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(deleted);  // Ownership was taken even on error.
}

}  // namespace
}  // namespace dcp
