// DeviceRuntime over the CUDA runtime API (libcudart_static). Compiled by the
// host compiler: no kernels here.
//
// Handles: a DeviceStream* / DeviceEvent* points at a small heap record that
// remembers the device the CUDA object belongs to, so every call can make
// that device current first (the current device is per host thread, and the
// staging threads are not the thread that created the stream). Calls that
// select a device give the thread its previous device back (ScopedDevice):
// they may run on the caller's thread, whose current device torch reads.
#include "cuda/internal/cuda_runtime.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "core/status.h"
#include "cuda/device_runtime.h"
#include "cuda/internal/scoped_device.h"

namespace dcp::cuda_internal {
namespace {

absl::StatusCode CodeFor(cudaError_t err) {
  switch (err) {
    case cudaErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidMemcpyDirection:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidDevice:
      return absl::StatusCode::kInvalidArgument;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorInitializationError:
    case cudaErrorCudartUnloading:
      return absl::StatusCode::kFailedPrecondition;
    case cudaErrorHostMemoryAlreadyRegistered:
      return absl::StatusCode::kAlreadyExists;
    case cudaErrorHostMemoryNotRegistered:
      return absl::StatusCode::kNotFound;
    case cudaErrorNotReady:
      return absl::StatusCode::kUnavailable;
    case cudaErrorNotSupported:
      return absl::StatusCode::kUnimplemented;
    default:
      // Launch failures, illegal addresses, ECC errors: sticky device faults.
      return absl::StatusCode::kInternal;
  }
}

// "what: <cuda message> (cudaErrorName)".
absl::Status CudaStatus(cudaError_t err, absl::string_view what) {
  return absl::Status(CodeFor(err), absl::StrFormat("%s: %s (%s)", what,
                                                    cudaGetErrorString(err),
                                                    cudaGetErrorName(err)));
}

#define DCP_CUDA_CHECK(expr, what)              \
  do {                                          \
    const cudaError_t dcp_cuda_err_ = (expr);   \
    if (dcp_cuda_err_ != cudaSuccess) {         \
      return CudaStatus(dcp_cuda_err_, (what)); \
    }                                           \
  } while (false)

struct CudaStreamRecord {
  cudaStream_t stream = nullptr;
  int device = 0;
};

struct CudaEventRecord {
  cudaEvent_t event = nullptr;
  int device = 0;
};

CudaStreamRecord* AsRecord(DeviceStream* s) {
  return reinterpret_cast<CudaStreamRecord*>(s);
}
CudaEventRecord* AsRecord(DeviceEvent* e) {
  return reinterpret_cast<CudaEventRecord*>(e);
}

cudaMemcpyKind ToCuda(CopyKind kind) {
  switch (kind) {
    case CopyKind::kHostToHost:
      return cudaMemcpyHostToHost;
    case CopyKind::kHostToDevice:
      return cudaMemcpyHostToDevice;
    case CopyKind::kDeviceToHost:
      return cudaMemcpyDeviceToHost;
    case CopyKind::kDeviceToDevice:
      return cudaMemcpyDeviceToDevice;
  }
  return cudaMemcpyDefault;
}

absl::Status SetDevice(int device, absl::string_view what) {
  DCP_CUDA_CHECK(cudaSetDevice(device),
                 absl::StrFormat("%s: cudaSetDevice(%d)", what, device));
  return absl::OkStatus();
}

// cuMemGetAddressRange: CUresult (CUdeviceptr* base, size_t* size,
// CUdeviceptr ptr).
using GetAddressRangeFn = int (*)(unsigned long long*, size_t*,
                                  unsigned long long);

GetAddressRangeFn GetAddressRange() {
  static const auto fn = reinterpret_cast<GetAddressRangeFn>(
      DriverEntryPoint("cuMemGetAddressRange"));
  return fn;
}

// Makes `device` current on the calling thread until `scope` ends.
absl::Status EnterDevice(ScopedDevice& scope, int device,
                         absl::string_view what) {
  DCP_CUDA_CHECK(scope.Enter(device),
                 absl::StrFormat("%s: selecting device %d", what, device));
  return absl::OkStatus();
}

class CudaRuntime final : public DeviceRuntime {
 public:
  explicit CudaRuntime(int device_count) : device_count_(device_count) {}

  absl::string_view name() const override { return "cuda"; }
  bool is_host() const override { return false; }
  int DeviceCount() const override { return device_count_; }

  absl::StatusOr<DeviceProperties> GetDeviceProperties(
      int device) const override {
    DCP_RETURN_IF_ERROR(CheckDevice(device, "GetDeviceProperties"));
    cudaDeviceProp prop;
    DCP_CUDA_CHECK(cudaGetDeviceProperties(&prop, device),
                   absl::StrFormat("cudaGetDeviceProperties(%d)", device));
    DeviceProperties out;
    out.ordinal = device;
    out.name = prop.name;
    out.total_memory = prop.totalGlobalMem;
    out.compute_major = prop.major;
    out.compute_minor = prop.minor;
    out.async_engine_count = prop.asyncEngineCount;
    out.pci_bus_id = prop.pciBusID;
    return out;
  }

  absl::StatusOr<DeviceStream*> CreateStream(int device) override {
    DCP_RETURN_IF_ERROR(CheckDevice(device, "CreateStream"));
    ScopedDevice scope;
    DCP_RETURN_IF_ERROR(EnterDevice(scope, device, "CreateStream"));
    auto record = std::make_unique<CudaStreamRecord>();
    record->device = device;
    DCP_CUDA_CHECK(
        cudaStreamCreateWithFlags(&record->stream, cudaStreamNonBlocking),
        absl::StrFormat("cudaStreamCreateWithFlags on device %d", device));
    return reinterpret_cast<DeviceStream*>(record.release());
  }

  absl::Status DestroyStream(DeviceStream* stream) override {
    if (stream == nullptr) return absl::OkStatus();
    std::unique_ptr<CudaStreamRecord> record(AsRecord(stream));
    ScopedDevice scope;
    DCP_RETURN_IF_ERROR(EnterDevice(scope, record->device, "DestroyStream"));
    const cudaError_t sync = cudaStreamSynchronize(record->stream);
    const cudaError_t destroy = cudaStreamDestroy(record->stream);
    DCP_CUDA_CHECK(sync, "DestroyStream: cudaStreamSynchronize");
    DCP_CUDA_CHECK(destroy, "cudaStreamDestroy");
    return absl::OkStatus();
  }

  absl::Status SynchronizeStream(DeviceStream* stream) override {
    DCP_RETURN_IF_ERROR(CheckStream(stream, "SynchronizeStream"));
    ScopedDevice scope;
    DCP_RETURN_IF_ERROR(
        EnterDevice(scope, AsRecord(stream)->device, "SynchronizeStream"));
    DCP_CUDA_CHECK(cudaStreamSynchronize(AsRecord(stream)->stream),
                   "cudaStreamSynchronize");
    return absl::OkStatus();
  }

  absl::Status StreamWaitEvent(DeviceStream* stream,
                               DeviceEvent* event) override {
    DCP_RETURN_IF_ERROR(CheckStream(stream, "StreamWaitEvent"));
    DCP_RETURN_IF_ERROR(CheckEvent(event, "StreamWaitEvent"));
    ScopedDevice scope;
    DCP_RETURN_IF_ERROR(
        EnterDevice(scope, AsRecord(stream)->device, "StreamWaitEvent"));
    DCP_CUDA_CHECK(cudaStreamWaitEvent(AsRecord(stream)->stream,
                                       AsRecord(event)->event, 0),
                   "cudaStreamWaitEvent");
    return absl::OkStatus();
  }

  absl::Status StreamWaitNative(DeviceStream* stream,
                                const DeviceWait& wait) override {
    if (wait.empty()) return absl::OkStatus();
    DCP_RETURN_IF_ERROR(CheckStream(stream, "StreamWaitNative"));
    ScopedDevice scope;
    DCP_RETURN_IF_ERROR(
        EnterDevice(scope, AsRecord(stream)->device, "StreamWaitNative"));
    cudaEvent_t event = nullptr;
    cudaEvent_t marker = nullptr;
    if (wait.kind == DeviceWait::Kind::kEvent) {
      event = static_cast<cudaEvent_t>(wait.handle);
    } else {
      // The caller's stream (null: the legacy default stream, which dcp's
      // non-blocking copy streams do not follow by themselves): mark where
      // it is now, and wait for the mark.
      cudaStream_t caller = wait.handle != nullptr
                                ? static_cast<cudaStream_t>(wait.handle)
                                : cudaStreamLegacy;
      DCP_CUDA_CHECK(cudaEventCreateWithFlags(&marker, cudaEventDisableTiming),
                     "StreamWaitNative: cudaEventCreateWithFlags");
      const cudaError_t recorded = cudaEventRecord(marker, caller);
      if (recorded != cudaSuccess) {
        cudaEventDestroy(marker);
        DCP_CUDA_CHECK(recorded,
                       absl::StrFormat("StreamWaitNative: cudaEventRecord on "
                                       "the caller's stream %p",
                                       wait.handle));
      }
      event = marker;
    }
    const cudaError_t waited =
        cudaStreamWaitEvent(AsRecord(stream)->stream, event, 0);
    // Destroying a recorded event is safe: CUDA frees it once it completes.
    if (marker != nullptr) cudaEventDestroy(marker);
    DCP_CUDA_CHECK(waited, "StreamWaitNative: cudaStreamWaitEvent");
    return absl::OkStatus();
  }

  absl::StatusOr<DeviceEvent*> CreateEvent(int device,
                                           bool enable_timing) override {
    DCP_RETURN_IF_ERROR(CheckDevice(device, "CreateEvent"));
    ScopedDevice scope;
    DCP_RETURN_IF_ERROR(EnterDevice(scope, device, "CreateEvent"));
    auto record = std::make_unique<CudaEventRecord>();
    record->device = device;
    DCP_CUDA_CHECK(
        cudaEventCreateWithFlags(&record->event, enable_timing
                                                     ? cudaEventDefault
                                                     : cudaEventDisableTiming),
        absl::StrFormat("cudaEventCreateWithFlags on device %d", device));
    return reinterpret_cast<DeviceEvent*>(record.release());
  }

  absl::Status DestroyEvent(DeviceEvent* event) override {
    if (event == nullptr) return absl::OkStatus();
    std::unique_ptr<CudaEventRecord> record(AsRecord(event));
    ScopedDevice scope;
    // Destroyed even where its device cannot be entered (not leaked).
    const absl::Status entered =
        EnterDevice(scope, record->device, "DestroyEvent");
    DCP_CUDA_CHECK(cudaEventDestroy(record->event), "cudaEventDestroy");
    DCP_RETURN_IF_ERROR(entered);
    return absl::OkStatus();
  }

  absl::Status RecordEvent(DeviceEvent* event, DeviceStream* stream) override {
    DCP_RETURN_IF_ERROR(CheckStream(stream, "RecordEvent"));
    DCP_RETURN_IF_ERROR(CheckEvent(event, "RecordEvent"));
    ScopedDevice scope;
    DCP_RETURN_IF_ERROR(
        EnterDevice(scope, AsRecord(stream)->device, "RecordEvent"));
    DCP_CUDA_CHECK(
        cudaEventRecord(AsRecord(event)->event, AsRecord(stream)->stream),
        "cudaEventRecord");
    return absl::OkStatus();
  }

  absl::StatusOr<bool> QueryEvent(DeviceEvent* event) override {
    DCP_RETURN_IF_ERROR(CheckEvent(event, "QueryEvent"));
    ScopedDevice scope;
    DCP_RETURN_IF_ERROR(
        EnterDevice(scope, AsRecord(event)->device, "QueryEvent"));
    const cudaError_t err = cudaEventQuery(AsRecord(event)->event);
    if (err == cudaSuccess) return true;
    if (err == cudaErrorNotReady) return false;
    return CudaStatus(err, "cudaEventQuery");
  }

  absl::Status SynchronizeEvent(DeviceEvent* event) override {
    DCP_RETURN_IF_ERROR(CheckEvent(event, "SynchronizeEvent"));
    ScopedDevice scope;
    DCP_RETURN_IF_ERROR(
        EnterDevice(scope, AsRecord(event)->device, "SynchronizeEvent"));
    DCP_CUDA_CHECK(cudaEventSynchronize(AsRecord(event)->event),
                   "cudaEventSynchronize");
    return absl::OkStatus();
  }

  absl::StatusOr<double> ElapsedMillis(DeviceEvent* start,
                                       DeviceEvent* end) override {
    DCP_RETURN_IF_ERROR(CheckEvent(start, "ElapsedMillis"));
    DCP_RETURN_IF_ERROR(CheckEvent(end, "ElapsedMillis"));
    ScopedDevice scope;
    DCP_RETURN_IF_ERROR(
        EnterDevice(scope, AsRecord(start)->device, "ElapsedMillis"));
    float ms = 0;
    const cudaError_t err =
        cudaEventElapsedTime(&ms, AsRecord(start)->event, AsRecord(end)->event);
    if (err == cudaErrorNotReady || err == cudaErrorInvalidResourceHandle) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "cudaEventElapsedTime: %s (%s); both events must be recorded, "
          "complete and created with timing",
          cudaGetErrorString(err), cudaGetErrorName(err)));
    }
    DCP_CUDA_CHECK(err, "cudaEventElapsedTime");
    return static_cast<double>(ms);
  }

  absl::Status CopyAsync(void* dst, const void* src, size_t bytes,
                         CopyKind kind, DeviceStream* stream) override {
    DCP_RETURN_IF_ERROR(CheckStream(stream, "CopyAsync"));
    if (bytes == 0) return absl::OkStatus();
    ScopedDevice scope;
    DCP_RETURN_IF_ERROR(
        EnterDevice(scope, AsRecord(stream)->device, "CopyAsync"));
    DCP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, ToCuda(kind),
                                   AsRecord(stream)->stream),
                   absl::StrFormat("cudaMemcpyAsync %s %d bytes dst=%p src=%p",
                                   CopyKindName(kind), bytes, dst, src));
    return absl::OkStatus();
  }

  absl::Status Copy(void* dst, const void* src, size_t bytes,
                    CopyKind kind) override {
    if (bytes == 0) return absl::OkStatus();
    // Issued, and waited for, on the legacy default stream of the device
    // that holds the device side (the calling thread's device otherwise).
    const void* device_side = kind == CopyKind::kDeviceToHost ? src
                              : kind == CopyKind::kHostToHost ? nullptr
                                                              : dst;
    ScopedDevice scope;
    if (device_side != nullptr) {
      cudaPointerAttributes attributes{};
      if (cudaPointerGetAttributes(&attributes, device_side) != cudaSuccess) {
        cudaGetLastError();  // Not sticky: cudaMemcpy reports a bad pointer.
      } else if (attributes.type == cudaMemoryTypeDevice &&
                 attributes.device >= 0) {
        DCP_RETURN_IF_ERROR(EnterDevice(scope, attributes.device, "Copy"));
      }
    }
    const std::string what =
        absl::StrFormat("cudaMemcpy %s %d bytes dst=%p src=%p",
                        CopyKindName(kind), bytes, dst, src);
    DCP_CUDA_CHECK(cudaMemcpy(dst, src, bytes, ToCuda(kind)), what);
    // cudaMemcpy returns before the bytes land for a pageable-host-to-device
    // copy (once they are in the driver's staging memory) and for a
    // device-to-device one; callers read the memory on dcp's non-blocking
    // streams, which do not follow the legacy stream.
    if (kind == CopyKind::kHostToDevice || kind == CopyKind::kDeviceToDevice) {
      DCP_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy),
                     absl::StrCat(what, ": cudaStreamSynchronize"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<void*> AllocatePinned(size_t bytes) override {
    ScopedDevice scope;
    DCP_RETURN_IF_ERROR(EnterContextDevice(scope, "AllocatePinned"));
    void* p = nullptr;
    DCP_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocPortable),
                   absl::StrFormat("cudaHostAlloc %d bytes", bytes));
    return p;
  }

  absl::Status FreePinned(void* ptr) override {
    if (ptr == nullptr) return absl::OkStatus();
    ScopedDevice scope;
    DCP_RETURN_IF_ERROR(EnterContextDevice(scope, "FreePinned"));
    DCP_CUDA_CHECK(cudaFreeHost(ptr), absl::StrFormat("cudaFreeHost %p", ptr));
    return absl::OkStatus();
  }

  absl::Status RegisterHost(void* ptr, size_t bytes) override {
    ScopedDevice scope;
    DCP_RETURN_IF_ERROR(EnterContextDevice(scope, "RegisterHost"));
    DCP_CUDA_CHECK(
        cudaHostRegister(ptr, bytes, cudaHostRegisterPortable),
        absl::StrFormat("cudaHostRegister %p length=%d", ptr, bytes));
    return absl::OkStatus();
  }

  absl::Status UnregisterHost(void* ptr) override {
    ScopedDevice scope;
    DCP_RETURN_IF_ERROR(EnterContextDevice(scope, "UnregisterHost"));
    DCP_CUDA_CHECK(cudaHostUnregister(ptr),
                   absl::StrFormat("cudaHostUnregister %p", ptr));
    return absl::OkStatus();
  }

  absl::StatusOr<void*> AllocateDevice(int device, size_t bytes) override {
    DCP_RETURN_IF_ERROR(CheckDevice(device, "AllocateDevice"));
    ScopedDevice scope;
    DCP_RETURN_IF_ERROR(EnterDevice(scope, device, "AllocateDevice"));
    void* p = nullptr;
    DCP_CUDA_CHECK(
        cudaMalloc(&p, bytes),
        absl::StrFormat("cudaMalloc %d bytes on device %d", bytes, device));
    return p;
  }

  absl::Status FreeDevice(void* ptr) override {
    if (ptr == nullptr) return absl::OkStatus();
    // On the device that holds `ptr`, found from a device that has a
    // context: neither call creates one on the thread's device 0.
    ScopedDevice context_scope;
    DCP_RETURN_IF_ERROR(EnterContextDevice(context_scope, "FreeDevice"));
    ScopedDevice scope;
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, ptr) != cudaSuccess) {
      cudaGetLastError();  // Not sticky: cudaFree reports a bad pointer.
    } else if (attributes.type == cudaMemoryTypeDevice &&
               attributes.device >= 0) {
      DCP_RETURN_IF_ERROR(EnterDevice(scope, attributes.device, "FreeDevice"));
    }
    DCP_CUDA_CHECK(cudaFree(ptr), absl::StrFormat("cudaFree %p", ptr));
    return absl::OkStatus();
  }

  absl::StatusOr<DeviceAllocation> FindAllocation(int device,
                                                  const void* ptr) override {
    DCP_RETURN_IF_ERROR(CheckDevice(device, "FindAllocation"));
    ScopedDevice scope;
    DCP_RETURN_IF_ERROR(EnterDevice(scope, device, "FindAllocation"));
    // With unified addressing cuMemGetAddressRange also resolves pinned
    // host memory (cudaHostAlloc, cudaHostRegister): only memory the runtime
    // calls device memory of `device` (or managed memory) qualifies.
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, ptr) != cudaSuccess) {
      cudaGetLastError();  // Not sticky; clear it for later checks.
      attributes.type = cudaMemoryTypeUnregistered;
    }
    const bool on_device = (attributes.type == cudaMemoryTypeDevice &&
                            attributes.device == device) ||
                           attributes.type == cudaMemoryTypeManaged;
    if (!on_device) {
      return absl::NotFoundError(absl::StrFormat(
          "FindAllocation %p: not device memory of device %d (CUDA memory "
          "type %d, device %d)",
          ptr, device, static_cast<int>(attributes.type), attributes.device));
    }
    const GetAddressRangeFn get_range = GetAddressRange();
    unsigned long long base = 0;
    size_t size = 0;
    // Driver API errors (CUDA_ERROR_INVALID_VALUE for memory that is not
    // device memory) are not sticky and leave the runtime's error alone.
    if (get_range == nullptr ||
        get_range(&base, &size, reinterpret_cast<unsigned long long>(ptr)) !=
            0 ||
        size == 0) {
      return absl::NotFoundError(absl::StrFormat(
          "FindAllocation %p: cuMemGetAddressRange found no device "
          "allocation on device %d",
          ptr, device));
    }
    return DeviceAllocation{reinterpret_cast<const std::byte*>(base), size};
  }

  void* NativeStream(DeviceStream* stream) override {
    return stream == nullptr ? nullptr : AsRecord(stream)->stream;
  }

  absl::StatusOr<int> SetCurrentDevice(int device) override {
    DCP_RETURN_IF_ERROR(CheckDevice(device, "SetCurrentDevice"));
    int previous = 0;
    DCP_CUDA_CHECK(cudaGetDevice(&previous), "SetCurrentDevice: cudaGetDevice");
    if (previous == device) return previous;
    const bool give_back = HasActiveContext(previous);
    DCP_RETURN_IF_ERROR(SetDevice(device, "SetCurrentDevice"));
    return give_back ? previous : -1;
  }

 private:
  // Pinning memory (portable: usable from every context) needs a current
  // context: on a thread whose current device has none (a staging thread
  // reports device 0), the calls above use a device that has one (the
  // job's), rather than create a context, and its memory, on device 0.
  absl::Status EnterContextDevice(ScopedDevice& scope,
                                  absl::string_view what) const {
    int current = 0;
    DCP_CUDA_CHECK(cudaGetDevice(&current),
                   absl::StrCat(what, ": cudaGetDevice"));
    if (HasActiveContext(current)) return absl::OkStatus();
    for (int d = 0; d < device_count_; ++d) {
      if (d != current && HasActiveContext(d)) {
        return EnterDevice(scope, d, what);
      }
    }
    return absl::OkStatus();  // No context anywhere: the current device's.
  }

  absl::Status CheckDevice(int device, absl::string_view what) const {
    if (device < 0 || device >= device_count_) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: device %d does not exist (%d CUDA devices)",
                          what, device, device_count_));
    }
    return absl::OkStatus();
  }

  static absl::Status CheckStream(DeviceStream* stream,
                                  absl::string_view what) {
    if (stream == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: null stream", what));
    }
    return absl::OkStatus();
  }

  static absl::Status CheckEvent(DeviceEvent* event, absl::string_view what) {
    if (event == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: null event", what));
    }
    return absl::OkStatus();
  }

  const int device_count_;
};

}  // namespace

bool CudaDriverInstalled() {
  static const bool installed = [] {
    void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (driver == nullptr) return false;
    dlclose(driver);
    return true;
  }();
  return installed;
}

absl::StatusOr<int> QueryCudaDeviceCount() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // Do not leave the error for an unrelated call.
    // The runtime says "driver version is insufficient" also when there is
    // no driver at all: say which.
    if (err == cudaErrorInsufficientDriver && !CudaDriverInstalled()) {
      return absl::FailedPreconditionError(
          "no CUDA driver (libcuda.so.1 cannot be loaded)");
    }
    return CudaStatus(err, "cudaGetDeviceCount");
  }
  return count;
}

absl::StatusOr<std::unique_ptr<DeviceRuntime>> CreateCudaRuntime() {
  absl::StatusOr<int> count = QueryCudaDeviceCount();
  if (!count.ok()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "no usable CUDA device: %s; use device runtime mode 'auto' or 'host' "
        "on a machine without a GPU",
        count.status().message()));
  }
  if (*count == 0) {
    return absl::FailedPreconditionError(
        "no usable CUDA device: cudaGetDeviceCount found 0 devices; use "
        "device runtime mode 'auto' or 'host' on a machine without a GPU");
  }
  return std::unique_ptr<DeviceRuntime>(new CudaRuntime(*count));
}

}  // namespace dcp::cuda_internal
