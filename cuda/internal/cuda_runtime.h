// The CUDA implementation of DeviceRuntime, reached only through
// CreateDeviceRuntime (cuda/device_runtime.h). Internal to cuda/.
#ifndef DCP_CUDA_INTERNAL_CUDA_RUNTIME_H_
#define DCP_CUDA_INTERNAL_CUDA_RUNTIME_H_

#include <memory>

#include "absl/status/statusor.h"
#include "cuda/device_runtime.h"

namespace dcp::cuda_internal {

// A runtime over the CUDA runtime API. kFailedPrecondition (naming the CUDA
// error) when there is no driver or no device.
absl::StatusOr<std::unique_ptr<DeviceRuntime>> CreateCudaRuntime();

// cudaGetDeviceCount: the count, or the CUDA error as a Status
// (kFailedPrecondition for "no driver" and "no device").
absl::StatusOr<int> QueryCudaDeviceCount();

// Whether the CUDA driver (libcuda.so.1) can be loaded: false on a machine
// with no GPU driver installed. Checked once.
bool CudaDriverInstalled();

}  // namespace dcp::cuda_internal

#endif  // DCP_CUDA_INTERNAL_CUDA_RUNTIME_H_
