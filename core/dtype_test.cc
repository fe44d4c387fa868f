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
