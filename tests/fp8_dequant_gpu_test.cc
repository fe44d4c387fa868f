// DequantizeFp8BlocksOnDevice (cuda/fp8_dequant.h) against the CPU path
// (io/quantized_dequant.h), bit for bit: all 256 fp8 bytes, a matrix whose
// edge blocks are clipped, a window that starts inside a block, each target.
// GPU cases skip when CudaDeviceCount() == 0; the host runtime is refused.
#include <cstring>
#include <vector>

#include "cuda/device_runtime.h"
#include "cuda/fp8_dequant.h"
#include "gtest/gtest.h"
#include "io/quantized_dequant.h"

namespace dcp {
namespace {

TEST(Fp8DequantDevice, HostRuntimeIsRefused) {
  std::unique_ptr<DeviceRuntime> host =
      *CreateDeviceRuntime(DeviceRuntimeMode::kHost);
  Fp8BlockDequantArgs args;
  args.rows = args.cols = 1;
  EXPECT_EQ(DequantizeFp8BlocksOnDevice(*host, nullptr, args).code(),
            absl::StatusCode::kFailedPrecondition);
}

class Fp8DequantGpu : public ::testing::TestWithParam<DType> {};

TEST_P(Fp8DequantGpu, MatchesTheCpuPathBitForBit) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  std::unique_ptr<DeviceRuntime> cuda =
      *CreateDeviceRuntime(DeviceRuntimeMode::kCuda);
  const DType dtype = GetParam();
  const int64_t es = static_cast<int64_t>(ElementSize(dtype));
  const int64_t block = 128, rows = 300, cols = 517;  // Clipped edges.
  const Shape scale_shape = *Fp8ScaleShape({rows, cols}, block);
  std::vector<uint8_t> fp8(rows * cols);
  for (size_t i = 0; i < fp8.size(); ++i) fp8[i] = (i * 131 + i / 7) & 0xff;
  std::vector<float> scales(scale_shape[0] * scale_shape[1]);
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = 0.37f * (i + 1) - 2;
  // The window: rows [70, 290), columns [100, 517).
  const int64_t r0 = 70, c0 = 100, wr = 220, wc = cols - c0;
  std::vector<std::byte> want(wr * wc * es);
  for (int64_t r = 0; r < wr; ++r) {
    DequantizeFp8Row(fp8.data() + (r0 + r) * cols + c0, wc, c0,
                     scales.data() + ((r0 + r) / block) * scale_shape[1], block,
                     dtype, want.data() + r * wc * es);
  }
  void* d_fp8 = *cuda->AllocateDevice(0, fp8.size());
  void* d_scales = *cuda->AllocateDevice(0, scales.size() * 4);
  void* d_out = *cuda->AllocateDevice(0, want.size());
  ASSERT_TRUE(
      cuda->Copy(d_fp8, fp8.data(), fp8.size(), CopyKind::kHostToDevice).ok());
  ASSERT_TRUE(cuda->Copy(d_scales, scales.data(), scales.size() * 4,
                         CopyKind::kHostToDevice)
                  .ok());
  DeviceStream* stream = *cuda->CreateStream(0);
  Fp8BlockDequantArgs args;
  args.fp8 = static_cast<const std::byte*>(d_fp8) + r0 * cols + c0;
  args.fp8_row_stride = cols;
  args.scales = static_cast<const float*>(d_scales);
  args.scale_row_stride = scale_shape[1];
  args.out = d_out;
  args.out_row_stride = wc;
  args.target = dtype == DType::kF32    ? DequantTarget::kF32
                : dtype == DType::kBF16 ? DequantTarget::kBF16
                                        : DequantTarget::kF16;
  args.rows = wr;
  args.cols = wc;
  args.row0 = r0;
  args.col0 = c0;
  args.block = block;
  ASSERT_TRUE(DequantizeFp8BlocksOnDevice(*cuda, stream, args).ok());
  ASSERT_TRUE(cuda->SynchronizeStream(stream).ok());
  std::vector<std::byte> got(want.size());
  ASSERT_TRUE(
      cuda->Copy(got.data(), d_out, got.size(), CopyKind::kDeviceToHost).ok());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size()), 0);
  ASSERT_TRUE(cuda->DestroyStream(stream).ok());
  for (void* p : {d_fp8, d_scales, d_out})
    ASSERT_TRUE(cuda->FreeDevice(p).ok());
}

INSTANTIATE_TEST_SUITE_P(Targets, Fp8DequantGpu,
                         ::testing::Values(DType::kF32, DType::kBF16,
                                           DType::kF16),
                         [](const auto& info) {
                           return std::string(DTypeName(info.param));
                         });

}  // namespace
}  // namespace dcp
