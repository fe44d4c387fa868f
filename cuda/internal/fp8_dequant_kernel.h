// The launcher compiled by nvcc (cuda/fp8_dequant.cu): plain types only,
// so that cuda/fp8_dequant.cc, compiled by the host compiler, can call it.
// Internal to cuda/.
#ifndef DCP_CUDA_INTERNAL_FP8_DEQUANT_KERNEL_H_
#define DCP_CUDA_INTERNAL_FP8_DEQUANT_KERNEL_H_

#include <cstdint>

namespace dcp::cuda_internal {

// Launches the kernel on `stream` (a cudaStream_t); `target` 0 = f32,
// 1 = bf16, 2 = f16. Returns the cudaError_t of the launch as an int.
int LaunchFp8BlockDequant(const void* fp8, int64_t fp8_row_stride,
                          const float* scales, int64_t scale_row_stride,
                          void* out, int64_t out_row_stride, int target,
                          int64_t rows, int64_t cols, int64_t row0,
                          int64_t col0, int64_t block, void* stream);

}  // namespace dcp::cuda_internal

#endif  // DCP_CUDA_INTERNAL_FP8_DEQUANT_KERNEL_H_
