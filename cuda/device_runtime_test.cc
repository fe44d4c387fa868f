// The factory on whatever machine runs the test: "auto" gives CUDA where a
// GPU is usable and the host runtime elsewhere; "cuda" without a GPU is a
// clean error, not a crash.
#include "cuda/device_runtime.h"

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dcp {
namespace {

using ::testing::HasSubstr;

TEST(DeviceRuntimeModeTest, NamesRoundTrip) {
  for (DeviceRuntimeMode mode :
       {DeviceRuntimeMode::kAuto, DeviceRuntimeMode::kCuda,
        DeviceRuntimeMode::kHost}) {
    absl::StatusOr<DeviceRuntimeMode> parsed =
        ParseDeviceRuntimeMode(DeviceRuntimeModeName(mode));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, mode);
  }
  absl::StatusOr<DeviceRuntimeMode> bad = ParseDeviceRuntimeMode("gpu");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("gpu"));
}

TEST(DeviceRuntimeFactoryTest, CudaDeviceCountNeverFails) {
  EXPECT_GE(CudaDeviceCount(), 0);
  EXPECT_EQ(CudaDeviceCount(), CudaDeviceCount());
}

TEST(DeviceRuntimeFactoryTest, AutoPicksCudaOnlyWithAGpu) {
  absl::StatusOr<std::unique_ptr<DeviceRuntime>> runtime =
      CreateDeviceRuntime(DeviceRuntimeMode::kAuto);
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  if (CudaDeviceCount() == 0) {
    EXPECT_TRUE((*runtime)->is_host());
    EXPECT_EQ((*runtime)->name(), "host");
  } else {
    EXPECT_FALSE((*runtime)->is_host());
    EXPECT_EQ((*runtime)->name(), "cuda");
    EXPECT_EQ((*runtime)->DeviceCount(), CudaDeviceCount());
  }
}

TEST(DeviceRuntimeFactoryTest, ExplicitCudaFailsCleanlyWithoutAGpu) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is present";
  absl::StatusOr<std::unique_ptr<DeviceRuntime>> runtime =
      CreateDeviceRuntime(DeviceRuntimeMode::kCuda);
  ASSERT_FALSE(runtime.ok());
  EXPECT_EQ(runtime.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(runtime.status().message(), HasSubstr("no usable CUDA device"));
  EXPECT_THAT(runtime.status().message(), HasSubstr("'host'"));
}

TEST(DeviceRuntimeFactoryTest, HostModeAlwaysWorks) {
  absl::StatusOr<std::unique_ptr<DeviceRuntime>> runtime =
      CreateDeviceRuntime(DeviceRuntimeMode::kHost);
  ASSERT_TRUE(runtime.ok());
  EXPECT_TRUE((*runtime)->is_host());
  EXPECT_EQ((*runtime)->DeviceCount(), 1);
}

}  // namespace
}  // namespace dcp
