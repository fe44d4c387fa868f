// STYLE rule 7: mode "auto" says once, on stderr, that it falls back to host
// memory. Its own binary, so no other test has printed the notice before.
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
  if (CudaDeviceCount() > 0) {
    EXPECT_EQ(Count(err, "uses host memory"), 0) << err;
  } else {
    EXPECT_EQ(Count(err, "uses host memory"), 1) << err;
    EXPECT_EQ(Count(err, "no usable CUDA device"), 1) << err;
    // Without a driver at all the line says so, not "driver version is
    // insufficient" (what the CUDA runtime reports then).
    if (void* driver = dlopen("libcuda.so.1", RTLD_LAZY)) {
      dlclose(driver);
    } else {
      EXPECT_EQ(Count(err, "no CUDA driver (libcuda.so.1 cannot be loaded)"), 1)
          << err;
      EXPECT_EQ(Count(err, "insufficient"), 0) << err;
    }
  }
}

}  // namespace
}  // namespace dcp
