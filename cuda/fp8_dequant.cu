// The fp8 block dequantization kernel (cuda/fp8_dequant.h). Each thread
// produces one element; a 2-D grid of 256-thread blocks covers the window
// (x over columns, y over rows, looping when the grid's y is capped). The
// E4M3 decode and the rounding match io/quantized_dequant.cc exactly: the
// fp8 value is exact in float, one float multiply, then round to nearest
// even into bf16/f16.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/internal/fp8_dequant_kernel.h"

namespace dcp::cuda_internal {
namespace {

__device__ __forceinline__ float E4M3ToFloat(uint8_t b) {
  const int exponent = (b >> 3) & 0xf;
  const int mantissa = b & 0x7;
  float magnitude;
  if (exponent == 0xf && mantissa == 0x7) {
    magnitude = __int_as_float(0x7fc00000);  // NaN.
  } else if (exponent == 0) {
    magnitude = ldexpf(static_cast<float>(mantissa), -9);
  } else {
    magnitude = ldexpf(1.0f + mantissa * 0.125f, exponent - 7);
  }
  return (b & 0x80) ? -magnitude : magnitude;
}

__device__ __forceinline__ uint16_t ToBf16(float v) {
  uint32_t bits = __float_as_uint(v);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x40);
  }
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

__device__ __forceinline__ uint16_t ToF16(float v) {
  return __half_as_ushort(__float2half_rn(v));
}

__global__ void Fp8BlockDequantKernel(const uint8_t* fp8, int64_t fp8_stride,
                                      const float* scales, int64_t scale_stride,
                                      void* out, int64_t out_stride, int target,
                                      int64_t rows, int64_t cols, int64_t row0,
                                      int64_t col0, int64_t block) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const int64_t scale_col = (col0 + c) / block;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const float s = scales[((row0 + r) / block) * scale_stride + scale_col];
    const float v = E4M3ToFloat(fp8[r * fp8_stride + c]) * s;
    const int64_t at = r * out_stride + c;
    if (target == 0) {
      static_cast<float*>(out)[at] = v;
    } else if (target == 1) {
      static_cast<uint16_t*>(out)[at] = ToBf16(v);
    } else {
      static_cast<uint16_t*>(out)[at] = ToF16(v);
    }
  }
}

}  // namespace

int LaunchFp8BlockDequant(const void* fp8, int64_t fp8_row_stride,
                          const float* scales, int64_t scale_row_stride,
                          void* out, int64_t out_row_stride, int target,
                          int64_t rows, int64_t cols, int64_t row0,
                          int64_t col0, int64_t block, void* stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const dim3 grid(static_cast<unsigned>((cols + kThreads - 1) / kThreads),
                  static_cast<unsigned>(rows < 65535 ? rows : 65535));
  // cudaGetLastError after the launch also returns an earlier, unrelated
  // non-sticky error of this thread: clear it first.
  cudaGetLastError();
  Fp8BlockDequantKernel<<<grid, kThreads, 0,
                          static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint8_t*>(fp8), fp8_row_stride, scales,
      scale_row_stride, out, out_row_stride, target, rows, cols, row0, col0,
      block);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace dcp::cuda_internal
