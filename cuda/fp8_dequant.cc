#include "cuda/fp8_dequant.h"

#include <cuda_runtime.h>

#include <cstddef>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "core/fp8_dequant_row.h"
#include "core/status.h"
#include "cuda/internal/fp8_dequant_kernel.h"
#include "cuda/internal/scoped_device.h"

namespace dcp {
namespace {

// By DequantTarget value.
constexpr DType kTargetDTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

// kInvalidArgument unless [ptr, ptr + bytes) lies in one AllocateDevice
// allocation of `runtime` (the host runtime's stand-in for a device fault).
absl::Status CheckInDeviceMemory(DeviceRuntime& runtime, const void* ptr,
                                 int64_t bytes, const char* what) {
  absl::StatusOr<DeviceAllocation> allocation = runtime.FindAllocation(0, ptr);
  const auto* at = static_cast<const std::byte*>(ptr);
  if (!allocation.ok() ||
      at + bytes > allocation->base + static_cast<int64_t>(allocation->size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("fp8 dequantization: the ", what, " (", bytes,
                     " bytes) is not in one device allocation"));
  }
  return absl::OkStatus();
}

// The host runtime's kernel: the stream's earlier work first, then the CPU
// row function on the calling thread.
absl::Status DequantizeOnHost(DeviceRuntime& runtime, DeviceStream* stream,
                              const Fp8BlockDequantArgs& args) {
  if (stream != nullptr) DCP_RETURN_IF_ERROR(runtime.SynchronizeStream(stream));
  if (args.rows == 0 || args.cols == 0) return absl::OkStatus();
  const DType dtype = kTargetDTypes[static_cast<int>(args.target)];
  const int64_t es = static_cast<int64_t>(ElementSize(dtype));
  const int64_t last_row = args.rows - 1;
  DCP_RETURN_IF_ERROR(CheckInDeviceMemory(
      runtime, args.fp8, last_row * args.fp8_row_stride + args.cols, "input"));
  DCP_RETURN_IF_ERROR(CheckInDeviceMemory(
      runtime, args.out, (last_row * args.out_row_stride + args.cols) * es,
      "output"));
  const int64_t scale_floats =
      (args.row0 + last_row) / args.block * args.scale_row_stride +
      (args.col0 + args.cols - 1) / args.block + 1;
  DCP_RETURN_IF_ERROR(CheckInDeviceMemory(
      runtime, args.scales, scale_floats * int64_t{sizeof(float)}, "scales"));
  const auto* fp8 = static_cast<const uint8_t*>(args.fp8);
  auto* out = static_cast<std::byte*>(args.out);
  for (int64_t r = 0; r < args.rows; ++r) {
    DequantizeFp8Row(
        fp8 + r * args.fp8_row_stride, args.cols, args.col0,
        args.scales + (args.row0 + r) / args.block * args.scale_row_stride,
        args.block, dtype, out + r * args.out_row_stride * es);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DequantTarget> DequantTargetOf(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return DequantTarget::kF32;
    case DType::kBF16:
      return DequantTarget::kBF16;
    case DType::kF16:
      return DequantTarget::kF16;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("fp8 dequantization writes F32, BF16 or F16, not ",
                       DTypeName(dtype)));
  }
}

absl::Status DequantizeFp8BlocksOnDevice(DeviceRuntime& runtime,
                                         DeviceStream* stream,
                                         const Fp8BlockDequantArgs& args) {
  if (args.rows < 0 || args.cols < 0 || args.block < 1 || args.row0 < 0 ||
      args.col0 < 0 || args.fp8_row_stride < 0 || args.out_row_stride < 0 ||
      args.scale_row_stride < 0 || static_cast<int>(args.target) < 0 ||
      static_cast<int>(args.target) > 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("fp8 dequantization of ", args.rows, "x", args.cols,
                     " at (", args.row0, ", ", args.col0, ") in blocks of ",
                     args.block, " (row strides ", args.fp8_row_stride, ", ",
                     args.scale_row_stride, ", ", args.out_row_stride, ")"));
  }
  if (runtime.is_host()) return DequantizeOnHost(runtime, stream, args);
  // CUDA launches only onto streams of the current device: the stream's,
  // for the launch only.
  void* native = runtime.NativeStream(stream);
  cuda_internal::ScopedDevice scope;
  int err = cudaSuccess;
  if (native != nullptr) {
    int device = 0;
    err = cudaStreamGetDevice(static_cast<cudaStream_t>(native), &device);
    if (err == cudaSuccess) err = scope.Enter(device);
  }
  if (err == cudaSuccess) {
    err = cuda_internal::LaunchFp8BlockDequant(
        args.fp8, args.fp8_row_stride, args.scales, args.scale_row_stride,
        args.out, args.out_row_stride, static_cast<int>(args.target), args.rows,
        args.cols, args.row0, args.col0, args.block, native);
  }
  if (err != cudaSuccess) {
    const cudaError_t e = static_cast<cudaError_t>(err);
    return absl::InternalError(absl::StrCat(
        "launching the fp8 dequantization kernel (", args.rows, "x", args.cols,
        "): ", cudaGetErrorString(e), " (", cudaGetErrorName(e), ")"));
  }
  return absl::OkStatus();
}

}  // namespace dcp
