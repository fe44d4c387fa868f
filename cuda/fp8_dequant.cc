#include "cuda/fp8_dequant.h"

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "cuda/internal/fp8_dequant_kernel.h"

namespace dcp {

absl::Status DequantizeFp8BlocksOnDevice(DeviceRuntime& runtime,
                                         DeviceStream* stream,
                                         const Fp8BlockDequantArgs& args) {
  if (runtime.is_host()) {
    return absl::FailedPreconditionError(
        "fp8 dequantization on a device needs the CUDA runtime; the host "
        "runtime has no device to run it on");
  }
  if (args.rows < 0 || args.cols < 0 || args.block < 1 || args.row0 < 0 ||
      args.col0 < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fp8 dequantization of ", args.rows, "x", args.cols, " at (", args.row0,
        ", ", args.col0, ") in blocks of ", args.block));
  }
  const int err = cuda_internal::LaunchFp8BlockDequant(
      args.fp8, args.fp8_row_stride, args.scales, args.scale_row_stride,
      args.out, args.out_row_stride, static_cast<int>(args.target), args.rows,
      args.cols, args.row0, args.col0, args.block,
      runtime.NativeStream(stream));
  if (err != cudaSuccess) {
    const cudaError_t e = static_cast<cudaError_t>(err);
    return absl::InternalError(absl::StrCat(
        "launching the fp8 dequantization kernel (", args.rows, "x", args.cols,
        "): ", cudaGetErrorString(e), " (", cudaGetErrorName(e), ")"));
  }
  return absl::OkStatus();
}

}  // namespace dcp
