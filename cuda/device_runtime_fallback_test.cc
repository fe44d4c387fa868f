// STYLE rule 7: mode "auto" says once, on stderr, that it falls back to host
// memory where a CUDA driver is installed but gives no usable device; on a
// machine without a GPU driver it says nothing. Its own binary, so no other
// test has printed the notice before.
#include <dlfcn.h>

#include <string>

#include "cuda/device_runtime.h"
#include "gtest/gtest.h"

namespace dcp {
namespace {

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos;
       pos = text.find(what, pos + 1)) {
    ++n;
  }
  return n;
}

TEST(DeviceRuntimeFallbackTest, AutoSaysSoOnceOnStderr) {
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::unique_ptr<DeviceRuntime>> runtime =
        CreateDeviceRuntime(DeviceRuntimeMode::kAuto);
    ASSERT_TRUE(runtime.ok()) << runtime.status();
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY);
  if (driver != nullptr) dlclose(driver);
  if (CudaDeviceCount() > 0 || driver == nullptr) {
    // A GPU, or a machine without a GPU driver (nothing to fall back from):
    // nothing said.
    EXPECT_EQ(err, "");
    if (driver == nullptr) {
      // Mode "cuda" fails saying there is no driver, not "driver version is
      // insufficient" (what the CUDA runtime reports then).
      absl::StatusOr<std::unique_ptr<DeviceRuntime>> cuda =
          CreateDeviceRuntime(DeviceRuntimeMode::kCuda);
      ASSERT_FALSE(cuda.ok());
      EXPECT_EQ(Count(std::string(cuda.status().message()),
                      "no CUDA driver (libcuda.so.1 cannot be loaded)"),
                1)
          << cuda.status();
      EXPECT_EQ(Count(std::string(cuda.status().message()), "insufficient"), 0);
    }
  } else {
    // A driver that gives no usable device: said once.
    EXPECT_EQ(Count(err, "uses host memory"), 1) << err;
    EXPECT_EQ(Count(err, "no usable CUDA device"), 1) << err;
  }
}

}  // namespace
}  // namespace dcp
