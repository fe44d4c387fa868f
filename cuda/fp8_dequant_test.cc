// DequantizeFp8BlocksOnDevice on the host runtime: the CPU twin of the
// kernel equals DequantizeFp8Row for every fp8 byte and each target, runs
// after the copies enqueued on its stream, and refuses buffers outside
// device allocations. (The CUDA kernel: tests/fp8_dequant_gpu_test.cc.)
#include "cuda/fp8_dequant.h"

#include <cstring>
#include <string>
#include <vector>

#include "core/fp8_dequant_row.h"
#include "cuda/host_runtime.h"
#include "gtest/gtest.h"

namespace dcp {
namespace {

class Fp8DequantHost : public ::testing::TestWithParam<DType> {};

TEST_P(Fp8DequantHost, MatchesTheRowFunctionAfterTheStreamsCopies) {
  const DType dtype = GetParam();
  const DequantTarget target = *DequantTargetOf(dtype);
  const int64_t es = static_cast<int64_t>(ElementSize(dtype));
  // 16 x 16 = every fp8 byte; blocks of 5 (clipped at the edges); the
  // window is rows [3, 16), columns [2, 16), written with a row stride of 20.
  const int64_t n = 16, block = 5, sc = 4, r0 = 3, c0 = 2;
  const int64_t rows = n - r0, cols = n - c0, out_stride = 20;
  std::vector<uint8_t> fp8(n * n);
  for (int i = 0; i < n * n; ++i) fp8[i] = static_cast<uint8_t>(i);
  std::vector<float> scales(sc * sc);
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = 1.5f * i - 7;
  std::vector<std::byte> want(rows * out_stride * es, std::byte{0x11});
  for (int64_t r = 0; r < rows; ++r) {
    DequantizeFp8Row(fp8.data() + (r0 + r) * n + c0, cols, c0,
                     scales.data() + (r0 + r) / block * sc, block, dtype,
                     want.data() + r * out_stride * es);
  }

  std::unique_ptr<DeviceRuntime> host = CreateHostRuntime();
  void* d_fp8 = *host->AllocateDevice(0, fp8.size());
  void* d_scales = *host->AllocateDevice(0, scales.size() * sizeof(float));
  void* d_out = *host->AllocateDevice(0, want.size());
  std::memset(d_out, 0x11, want.size());
  DeviceStream* stream = *host->CreateStream(0);
  // Enqueued, not waited for: the dequantization must run after them.
  ASSERT_TRUE(host->CopyAsync(d_fp8, fp8.data(), fp8.size(),
                              CopyKind::kHostToDevice, stream)
                  .ok());
  ASSERT_TRUE(host->CopyAsync(d_scales, scales.data(),
                              scales.size() * sizeof(float),
                              CopyKind::kHostToDevice, stream)
                  .ok());
  Fp8BlockDequantArgs args;
  args.fp8 = static_cast<const uint8_t*>(d_fp8) + r0 * n + c0;
  args.fp8_row_stride = n;
  args.scales = static_cast<const float*>(d_scales);
  args.scale_row_stride = sc;
  args.out = d_out;
  args.out_row_stride = out_stride;
  args.target = target;
  args.rows = rows;
  args.cols = cols;
  args.row0 = r0;
  args.col0 = c0;
  args.block = block;
  ASSERT_TRUE(DequantizeFp8BlocksOnDevice(*host, stream, args).ok());
  // Finished on return: no synchronization before reading.
  EXPECT_EQ(std::memcmp(d_out, want.data(), want.size()), 0);

  // A host buffer where device memory belongs.
  std::vector<std::byte> host_out(want.size());
  args.out = host_out.data();
  absl::Status status = DequantizeFp8BlocksOnDevice(*host, stream, args);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("output"), absl::string_view::npos);
  // The last row one element past the allocation.
  args.out = static_cast<std::byte*>(d_out) + (out_stride - cols + 1) * es;
  EXPECT_EQ(DequantizeFp8BlocksOnDevice(*host, stream, args).code(),
            absl::StatusCode::kInvalidArgument);
  args.out = d_out;
  args.block = 0;
  EXPECT_EQ(DequantizeFp8BlocksOnDevice(*host, stream, args).code(),
            absl::StatusCode::kInvalidArgument);

  ASSERT_TRUE(host->DestroyStream(stream).ok());
  for (void* p : {d_fp8, d_scales, d_out}) {
    ASSERT_TRUE(host->FreeDevice(p).ok());
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, Fp8DequantHost,
                         ::testing::Values(DType::kF32, DType::kBF16,
                                           DType::kF16),
                         [](const auto& info) {
                           return std::string(DTypeName(info.param));
                         });

TEST(Fp8DequantTarget, OnlyFloatTargets) {
  EXPECT_EQ(*DequantTargetOf(DType::kBF16), DequantTarget::kBF16);
  EXPECT_EQ(DequantTargetOf(DType::kI32).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dcp
