#include "cuda/device_runtime.h"

#include <atomic>
#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "cuda/host_runtime.h"
#include "cuda/internal/cuda_runtime.h"

namespace dcp {

absl::string_view DeviceRuntimeModeName(DeviceRuntimeMode mode) {
  switch (mode) {
    case DeviceRuntimeMode::kAuto:
      return "auto";
    case DeviceRuntimeMode::kCuda:
      return "cuda";
    case DeviceRuntimeMode::kHost:
      return "host";
  }
  return "unknown";
}

absl::StatusOr<DeviceRuntimeMode> ParseDeviceRuntimeMode(
    absl::string_view text) {
  if (text == "auto") return DeviceRuntimeMode::kAuto;
  if (text == "cuda") return DeviceRuntimeMode::kCuda;
  if (text == "host") return DeviceRuntimeMode::kHost;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown device runtime mode '", text, "'; use auto, cuda or host"));
}

absl::string_view CopyKindName(CopyKind kind) {
  switch (kind) {
    case CopyKind::kHostToHost:
      return "H2H";
    case CopyKind::kHostToDevice:
      return "H2D";
    case CopyKind::kDeviceToHost:
      return "D2H";
    case CopyKind::kDeviceToDevice:
      return "D2D";
  }
  return "?";
}

int CudaDeviceCount() {
  absl::StatusOr<int> count = cuda_internal::QueryCudaDeviceCount();
  return count.ok() ? *count : 0;
}

absl::StatusOr<std::unique_ptr<DeviceRuntime>> CreateDeviceRuntime(
    DeviceRuntimeMode mode) {
  switch (mode) {
    case DeviceRuntimeMode::kHost:
      return CreateHostRuntime();
    case DeviceRuntimeMode::kCuda:
      return cuda_internal::CreateCudaRuntime();
    case DeviceRuntimeMode::kAuto: {
      absl::StatusOr<int> count = cuda_internal::QueryCudaDeviceCount();
      if (count.ok() && *count > 0) return cuda_internal::CreateCudaRuntime();
      // Said once, where a driver is installed but gives no usable device
      // (a GPU machine misconfigured: CUDA_VISIBLE_DEVICES, an old
      // driver). A machine without a GPU driver has no fast path to fall
      // back from: nothing is said there.
      static std::atomic<bool> said_once{false};
      if (cuda_internal::CudaDriverInstalled() && !said_once.exchange(true)) {
        const std::string reason =
            count.ok() ? std::string("cudaGetDeviceCount found 0 devices")
                       : std::string(count.status().message());
        std::fprintf(stderr,
                     "dcp: no usable CUDA device (%s); device runtime 'auto' "
                     "uses host memory\n",
                     reason.c_str());
      }
      return CreateHostRuntime();
    }
  }
  return absl::InvalidArgumentError("unknown DeviceRuntimeMode");
}

absl::StatusOr<OwnedStream> MakeOwnedStream(DeviceRuntime& runtime,
                                            int device) {
  DCP_ASSIGN_OR_RETURN(DeviceStream * stream, runtime.CreateStream(device));
  return OwnedStream(&runtime, stream);
}

absl::StatusOr<OwnedEvent> MakeOwnedEvent(DeviceRuntime& runtime, int device,
                                          bool enable_timing) {
  DCP_ASSIGN_OR_RETURN(DeviceEvent * event,
                       runtime.CreateEvent(device, enable_timing));
  return OwnedEvent(&runtime, event);
}

}  // namespace dcp
