// DeviceFp8Dequantizer on the host runtime (the path a CUDA device takes,
// with host memory as device memory): windows of strided host rows equal
// DequantizeFp8Row bit for bit, only fp8 bytes and each scale tensor once
// cross to the "device", scratch exhaustion leaves the output untouched,
// and nothing reaches the device before the caller's work (OrderAfter).
#include "staging/device_fp8_dequant.h"

#include <atomic>
#include <cstring>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "core/device.h"
#include "core/fp8_dequant_row.h"
#include "cuda/fp8_dequant.h"
#include "cuda/host_runtime.h"
#include "gtest/gtest.h"

namespace dcp {
namespace {

constexpr int64_t kRows = 9, kCols = 70, kBlock = 4;
constexpr int64_t kScaleCols = (kCols + kBlock - 1) / kBlock;

std::vector<uint8_t> Fp8() {
  std::vector<uint8_t> fp8(kRows * kCols);
  for (size_t i = 0; i < fp8.size(); ++i) fp8[i] = (i * 37 + i / 5) & 0xff;
  return fp8;
}

std::vector<float> Scales() {
  std::vector<float> scales(((kRows + kBlock - 1) / kBlock) * kScaleCols);
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = 0.75f * i - 3;
  return scales;
}

// Rows [r0, r0 + rows), columns [c0, c0 + cols) of the matrix, on the CPU.
std::vector<std::byte> Want(int64_t r0, int64_t rows, int64_t c0, int64_t cols,
                            DType dtype) {
  const std::vector<uint8_t> fp8 = Fp8();
  const std::vector<float> scales = Scales();
  const int64_t es = static_cast<int64_t>(ElementSize(dtype));
  std::vector<std::byte> want(rows * cols * es);
  for (int64_t r = 0; r < rows; ++r) {
    DequantizeFp8Row(fp8.data() + (r0 + r) * kCols + c0, cols, c0,
                     scales.data() + (r0 + r) / kBlock * kScaleCols, kBlock,
                     dtype, want.data() + r * cols * es);
  }
  return want;
}

struct Fixture {
  explicit Fixture(size_t device_limit = 0) {
    HostRuntimeOptions options;
    options.copy_observer = [this](const HostCopyTrace& trace) {
      if (trace.phase == HostCopyTrace::Phase::kStart &&
          trace.kind == CopyKind::kHostToDevice) {
        h2d_bytes += trace.bytes;
      }
    };
    options.device_memory_limit = device_limit;
    runtime = CreateHostRuntime(options);
  }
  std::atomic<size_t> h2d_bytes{0};
  std::unique_ptr<DeviceRuntime> runtime;
};

class DeviceFp8DequantizerTest : public ::testing::TestWithParam<DType> {};

TEST_P(DeviceFp8DequantizerTest, StridedWindowsMatchTheCpuRows) {
  const DType dtype = GetParam();
  const int64_t es = static_cast<int64_t>(ElementSize(dtype));
  Fixture f;
  const std::vector<uint8_t> fp8 = Fp8();
  const std::vector<float> scales = Scales();
  {
    DeviceFp8Dequantizer dequantizer(f.runtime.get());
    absl::StatusOr<const float*> d_scales =
        dequantizer.DeviceScales("w_scale_inv", scales, 0);
    ASSERT_TRUE(d_scales.ok()) << d_scales.status();
    EXPECT_EQ(*dequantizer.DeviceScales("w_scale_inv", scales, 0), *d_scales);
    EXPECT_EQ(f.h2d_bytes, scales.size() * sizeof(float));
    struct Case {
      int64_t r0, rows, c0, cols;
      size_t copied;  // Fp8 bytes that cross to the device.
    };
    // Inside blocks, ending on the clipped edge block; rows 70 bytes apart
    // copied with their gaps (span <= 2x) or packed (span > 2x).
    for (const Case& c :
         {Case{1, 7, 3, 50, 6 * 70 + 50}, Case{2, 6, 66, 4, 6 * 4},
          Case{0, 9, 0, 70, 9 * 70}, Case{5, 1, 9, 1, 1}}) {
      const size_t before = f.h2d_bytes;
      void* out = *f.runtime->AllocateDevice(0, c.rows * c.cols * es);
      Fp8DeviceWindow window;
      Fp8BlockDequantArgs& region = window.region;
      region.fp8 = fp8.data() + c.r0 * kCols + c.c0;
      region.fp8_row_stride = kCols;
      region.rows = c.rows;
      region.cols = c.cols;
      region.row0 = c.r0;
      region.col0 = c.c0;
      region.block = kBlock;
      region.scales = *d_scales;
      region.scale_row_stride = kScaleCols;
      region.out = out;
      region.out_row_stride = c.cols;
      region.target = *DequantTargetOf(dtype);
      ASSERT_TRUE(dequantizer.Dequantize(window).ok());
      EXPECT_EQ(f.h2d_bytes - before, c.copied) << c.r0 << "," << c.c0;
      const std::vector<std::byte> want =
          Want(c.r0, c.rows, c.c0, c.cols, dtype);
      std::vector<std::byte> got(want.size());
      ASSERT_TRUE(
          f.runtime->Copy(got.data(), out, got.size(), CopyKind::kDeviceToHost)
              .ok());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size()), 0)
          << c.r0 << "," << c.c0;
      ASSERT_TRUE(f.runtime->FreeDevice(out).ok());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, DeviceFp8DequantizerTest,
                         ::testing::Values(DType::kF32, DType::kBF16,
                                           DType::kF16),
                         [](const auto& info) {
                           return std::string(DTypeName(info.param));
                         });

TEST(DeviceFp8Dequantizer, ExhaustedScratchWritesNothing) {
  // Room for the output and the scales, not for the scratch (the host
  // runtime rounds each allocation up to a page).
  Fixture f(/*device_limit=*/2 * 4096);
  DeviceFp8Dequantizer dequantizer(f.runtime.get());
  const std::vector<uint8_t> fp8 = Fp8();
  const std::vector<float> scales = Scales();
  absl::StatusOr<const float*> d_scales =
      dequantizer.DeviceScales("s", scales, 0);
  ASSERT_TRUE(d_scales.ok()) << d_scales.status();
  void* out = *f.runtime->AllocateDevice(0, 4);
  std::memset(out, 0x5a, 4);
  Fp8DeviceWindow window;
  Fp8BlockDequantArgs& region = window.region;
  region.fp8 = fp8.data();
  region.fp8_row_stride = kCols;
  region.rows = region.cols = 1;
  region.block = kBlock;
  region.scales = *d_scales;
  region.scale_row_stride = kScaleCols;
  region.out = out;
  region.out_row_stride = 1;
  absl::Status status = dequantizer.Dequantize(window);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_NE(status.message().find("device scratch of 1 bytes"),
            absl::string_view::npos)
      << status;
  EXPECT_EQ(*static_cast<uint32_t*>(out), 0x5a5a5a5au);
  ASSERT_TRUE(f.runtime->FreeDevice(out).ok());

  region.rows = -1;
  EXPECT_EQ(dequantizer.Dequantize(window).code(),
            absl::StatusCode::kInvalidArgument);
}

// The caller's stream is still writing the destination (a copy the
// observer holds back) when the load starts: the window's copy and kernel
// must wait for it, so the dequantized values are what is left. The held
// copy goes when a stream waits for the caller's stream (a correct order)
// or when the window's copy starts first (a broken one, which fails).
TEST(DeviceFp8Dequantizer, WaitsForTheCallersStream) {
  constexpr DType kDType = DType::kF32;
  const std::vector<uint8_t> fp8 = Fp8();
  const std::vector<float> scales = Scales();
  absl::Mutex mu;
  DeviceStream* caller_stream = nullptr;
  bool released = false;
  bool caller_copy_landed = false;
  bool window_copy_after_caller = false;
  HostRuntimeOptions options;
  options.copy_observer = [&](const HostCopyTrace& trace) {
    absl::MutexLock lock(&mu);
    if (trace.kind == CopyKind::kDeviceToDevice) {
      if (trace.phase == HostCopyTrace::Phase::kStart) {
        mu.Await(absl::Condition(&released));
      } else {
        caller_copy_landed = true;
      }
    } else if (trace.kind == CopyKind::kHostToDevice &&
               trace.phase == HostCopyTrace::Phase::kStart &&
               trace.src == fp8.data()) {
      window_copy_after_caller = caller_copy_landed;
      released = true;
    }
  };
  options.wait_observer = [&](const HostWaitTrace& trace) {
    absl::MutexLock lock(&mu);
    if (caller_stream != nullptr && trace.recorder == caller_stream) {
      released = true;
    }
  };
  std::unique_ptr<DeviceRuntime> runtime = CreateHostRuntime(options);
  DeviceFp8Dequantizer dequantizer(runtime.get());
  absl::StatusOr<const float*> d_scales =
      dequantizer.DeviceScales("s", scales, 0);
  ASSERT_TRUE(d_scales.ok()) << d_scales.status();
  const size_t bytes = kRows * kCols * ElementSize(kDType);
  void* out = *runtime->AllocateDevice(0, bytes);
  void* stale = *runtime->AllocateDevice(0, bytes);
  std::memset(stale, 0x77, bytes);
  absl::StatusOr<OwnedStream> caller = MakeOwnedStream(*runtime, 0);
  ASSERT_TRUE(caller.ok()) << caller.status();
  {
    absl::MutexLock lock(&mu);
    caller_stream = caller->get();
  }
  ASSERT_TRUE(runtime
                  ->CopyAsync(out, stale, bytes, CopyKind::kDeviceToDevice,
                              caller->get())
                  .ok());
  ASSERT_TRUE(dequantizer
                  .OrderAfter(DeviceWait::Stream(
                      0, runtime->NativeStream(caller->get())))
                  .ok());

  Fp8DeviceWindow window;
  Fp8BlockDequantArgs& region = window.region;
  region.fp8 = fp8.data();
  region.fp8_row_stride = kCols;
  region.rows = kRows;
  region.cols = kCols;
  region.block = kBlock;
  region.scales = *d_scales;
  region.scale_row_stride = kScaleCols;
  region.out = out;
  region.out_row_stride = kCols;
  region.target = *DequantTargetOf(kDType);
  ASSERT_TRUE(dequantizer.Dequantize(window).ok());
  {
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(window_copy_after_caller);
  }
  const std::vector<std::byte> want = Want(0, kRows, 0, kCols, kDType);
  EXPECT_EQ(std::memcmp(out, want.data(), want.size()), 0);

  // An empty wait clears it; a device the runtime lacks is refused.
  EXPECT_TRUE(dequantizer.OrderAfter(DeviceWait{}).ok());
  EXPECT_EQ(dequantizer.OrderAfter(DeviceWait::Stream(3, nullptr)).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(runtime->SynchronizeStream(caller->get()).ok());
  ASSERT_TRUE(runtime->FreeDevice(out).ok());
  ASSERT_TRUE(runtime->FreeDevice(stale).ok());
}

}  // namespace
}  // namespace dcp
