// ScopedDevice: makes a CUDA device current on the calling thread for a
// scope, then gives the thread its previous device back. dcp's runtime
// calls may run on the caller's thread (the Python thread, whose current
// device torch reads), and the current device is per thread. Internal to
// cuda/; compiled by the host compiler.
#ifndef DCP_CUDA_INTERNAL_SCOPED_DEVICE_H_
#define DCP_CUDA_INTERNAL_SCOPED_DEVICE_H_

#include <cuda_runtime_api.h>

namespace dcp::cuda_internal {

// A driver API function through the runtime's entry point query, so that
// no libcuda link is needed; null when the driver lacks it.
inline void* DriverEntryPoint(const char* symbol) {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(symbol, &f, 12000, cudaEnableDefault,
                                       &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();  // Not sticky; clear it for later checks.
    return nullptr;
  }
  return f;
}

// Whether `device`'s primary context exists already, so that making the
// device current creates nothing (cuDevicePrimaryCtxGetState: CUresult
// (CUdevice dev, unsigned int* flags, int* active); a CUdevice is the
// device ordinal). True when the driver cannot say.
inline bool HasActiveContext(int device) {
  using GetStateFn = int (*)(int, unsigned int*, int*);
  static const auto get_state = reinterpret_cast<GetStateFn>(
      DriverEntryPoint("cuDevicePrimaryCtxGetState"));
  if (get_state == nullptr) return true;
  unsigned int flags = 0;
  int active = 0;
  return get_state(device, &flags, &active) != 0 || active != 0;
}

// Since CUDA 12 cudaSetDevice creates the device's primary context, so a
// previous device that has none (a thread that never used CUDA reports
// device 0) is not restored: that would put a context, and its memory, on
// a GPU the job may not use (torch's device guards skip it likewise).
class ScopedDevice {
 public:
  ScopedDevice() = default;
  ~ScopedDevice() {
    if (previous_ >= 0 && HasActiveContext(previous_) &&
        cudaSetDevice(previous_) != cudaSuccess) {
      cudaGetLastError();  // Nobody to report it to; keep it from others.
    }
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

  // Makes `device` current until the scope ends. Call at most once per
  // scope. The error of cudaGetDevice / cudaSetDevice.
  cudaError_t Enter(int device) {
    int current = 0;
    cudaError_t err = cudaGetDevice(&current);
    if (err != cudaSuccess || current == device) return err;
    err = cudaSetDevice(device);
    if (err == cudaSuccess) previous_ = current;
    return err;
  }

 private:
  int previous_ = -1;  // -1: nothing to restore.
};

}  // namespace dcp::cuda_internal

#endif  // DCP_CUDA_INTERNAL_SCOPED_DEVICE_H_
