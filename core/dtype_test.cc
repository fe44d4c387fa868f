#include "core/dtype.h"

#include "core/device.h"
#include "gtest/gtest.h"

namespace dcp {
namespace {

TEST(DType, NamesRoundTripForEveryType) {
  for (int i = 0; i < kNumDTypes; ++i) {
    const DType dtype = static_cast<DType>(i);
    absl::StatusOr<DType> parsed = DTypeFromName(DTypeName(dtype));
    ASSERT_TRUE(parsed.ok()) << DTypeName(dtype);
    EXPECT_EQ(*parsed, dtype);
    EXPECT_EQ(*DTypeFromCode(i), dtype);
  }
  EXPECT_EQ(ElementSize(DType::kBF16), 2u);
  EXPECT_EQ(ElementSize(DType::kF8E4M3), 1u);
  EXPECT_EQ(ElementSize(DType::kC64), 8u);
  EXPECT_EQ(DTypeName(DType::kF8E5M2), "F8_E5M2");
}

// The dtypes of MX and NVFP4 training and of ROCm's float8, numbered
// after the first 17 (the on-disk codes never change).
TEST(DType, LaterDtypesKeepTheirCodesSizesAndNames) {
  EXPECT_EQ(static_cast<int>(DType::kF8E4M3FNUZ), 17);
  EXPECT_EQ(static_cast<int>(DType::kC32), 21);
  EXPECT_EQ(DTypeName(DType::kF8E8M0), "F8_E8M0");
  EXPECT_EQ(DTypeName(DType::kF8E5M2FNUZ), "F8_E5M2FNUZ");
  EXPECT_EQ(ElementSize(DType::kF4E2M1X2), 1u);  // a packed pair
  EXPECT_EQ(ElementSize(DType::kC32), 4u);
  for (DType in : {DType::kF8E4M3FNUZ, DType::kF8E5M2FNUZ, DType::kF8E8M0,
                   DType::kBF16, DType::kC64}) {
    EXPECT_TRUE(InSafetensors(in)) << DTypeName(in);
  }
  for (DType out : {DType::kC128, DType::kC32, DType::kF4E2M1X2}) {
    EXPECT_FALSE(InSafetensors(out)) << DTypeName(out);
  }
}

TEST(DType, RejectsUnknown) {
  EXPECT_EQ(DTypeFromName("f32").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DTypeFromCode(200).status().code(), absl::StatusCode::kDataLoss);
}

TEST(Device, ParsesAndPrints) {
  EXPECT_EQ(Device::Parse("cpu")->ToString(), "cpu");
  EXPECT_EQ(*Device::Parse("cuda:3"), Device::Cuda(3));
  EXPECT_EQ(*Device::Parse("cuda"), Device::Cuda(0));
  absl::Status bad = Device::Parse("cuda:x").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("cuda:x"), absl::string_view::npos);
}

}  // namespace
}  // namespace dcp
