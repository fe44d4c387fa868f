// DeviceRuntime: the only door to a GPU. Streams, events, copies between host
// and device, pinned host memory and device memory, behind an interface whose
// header includes no CUDA header, so every layer above cuda/ builds and tests
// on a machine without a GPU.
//
// Two implementations:
//   * CUDA (cuda/cuda_runtime.cc): the CUDA runtime API, linked statically.
//   * Host (cuda/host_runtime.h): "device" memory is host memory, each stream
//     is a worker thread with a FIFO queue and events complete when the
//     stream's worker reaches them, so ordering and overlap bugs in the
//     staging pipeline show up in ordinary tests.
//
// Handles (DeviceStream*, DeviceEvent*) are opaque and owned by the runtime
// that created them; destroy them with the same runtime before it goes away.
// OwnedStream / OwnedEvent below do that automatically.
//
// Thread safety: every method may be called from any thread. A stream
// executes its operations in the order they were enqueued; operations on
// different streams are unordered unless joined by StreamWaitEvent.
//
// Errors: every failure is an absl::Status whose message names the operation
// ("cudaMemcpyAsync D2H 1048576 bytes dst=0x... src=0x...: invalid argument
// (cudaErrorInvalidValue)"). Failures of work already enqueued surface at
// the next SynchronizeStream / SynchronizeEvent / QueryEvent, as on CUDA.
// kInvalidArgument for bad arguments, kResourceExhausted when memory runs
// out, kFailedPrecondition when no usable device exists, kAlreadyExists /
// kNotFound for double (un)registration, kInternal for a device fault (a
// sticky CUDA error: the process should stop using the device).
#ifndef DCP_CUDA_DEVICE_RUNTIME_H_
#define DCP_CUDA_DEVICE_RUNTIME_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/device.h"

namespace dcp {

// Opaque: never defined; each implementation casts its own handle type.
struct DeviceStream;
struct DeviceEvent;

// Which implementation CreateDeviceRuntime returns.
enum class DeviceRuntimeMode {
  kAuto,  // CUDA when a device is usable, else host (said once on stderr
          // where a CUDA driver is installed; silent without one).
  kCuda,  // CUDA or kFailedPrecondition.
  kHost,  // Always the host-memory implementation.
};

// "auto", "cuda", "host".
absl::string_view DeviceRuntimeModeName(DeviceRuntimeMode mode);
// Parses the names above; kInvalidArgument otherwise.
absl::StatusOr<DeviceRuntimeMode> ParseDeviceRuntimeMode(
    absl::string_view text);

// Direction of a copy. The runtime checks nothing about the pointers beyond
// what the implementation can (the host runtime checks that device pointers
// come from AllocateDevice, which catches a host tensor staged as device).
enum class CopyKind {
  kHostToHost,
  kHostToDevice,
  kDeviceToHost,
  kDeviceToDevice,
};

// "H2H", "H2D", "D2H", "D2D".
absl::string_view CopyKindName(CopyKind kind);

struct DeviceProperties {
  int ordinal = 0;
  std::string name;         // "NVIDIA H200" or "host-memory device".
  size_t total_memory = 0;  // Bytes of device memory.
  int compute_major = 0;    // Compute capability (0.0 for the host device).
  int compute_minor = 0;
  int async_engine_count = 0;  // Copy engines: how many copies can overlap.
  int pci_bus_id = -1;         // -1 when unknown.
  bool is_host_emulation = false;
};

// A device allocation: [base, base + size).
struct DeviceAllocation {
  const std::byte* base = nullptr;
  size_t size = 0;
};

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;

  // "cuda" or "host".
  virtual absl::string_view name() const = 0;
  // True for the host-memory implementation (no real device).
  virtual bool is_host() const = 0;

  // Number of devices (the host runtime reports one pretend device).
  virtual int DeviceCount() const = 0;
  // kInvalidArgument for an ordinal outside [0, DeviceCount()).
  virtual absl::StatusOr<DeviceProperties> GetDeviceProperties(
      int device) const = 0;

  // ---- Streams -----------------------------------------------------------
  // A new non-blocking stream on `device`. The caller destroys it with
  // DestroyStream (or holds it in an OwnedStream).
  virtual absl::StatusOr<DeviceStream*> CreateStream(int device) = 0;
  // Waits for the stream's pending work, then releases it. nullptr is a
  // no-op.
  virtual absl::Status DestroyStream(DeviceStream* stream) = 0;
  // Blocks until every operation enqueued on `stream` so far has finished;
  // returns the first error the stream hit.
  virtual absl::Status SynchronizeStream(DeviceStream* stream) = 0;
  // Makes later work on `stream` wait until `event`'s recorded work is done
  // (without blocking the caller).
  virtual absl::Status StreamWaitEvent(DeviceStream* stream,
                                       DeviceEvent* event) = 0;
  // Makes later work on `stream` wait until the work `wait` names is done
  // (core/device.h: the caller's native stream or event), without blocking
  // the host. kInvalidArgument for a handle the runtime does not know (the
  // host runtime checks; CUDA reports what the driver says).
  virtual absl::Status StreamWaitNative(DeviceStream* stream,
                                        const DeviceWait& wait) = 0;

  // ---- Events ------------------------------------------------------------
  // A new event for `device`. `enable_timing` allows ElapsedMillis (and costs
  // a little on CUDA). An event never recorded counts as complete.
  virtual absl::StatusOr<DeviceEvent*> CreateEvent(int device,
                                                   bool enable_timing) = 0;
  // Releases the event; nullptr is a no-op.
  virtual absl::Status DestroyEvent(DeviceEvent* event) = 0;
  // Captures the work enqueued on `stream` so far; the event completes when
  // that work is done. Re-recording replaces the previous capture.
  virtual absl::Status RecordEvent(DeviceEvent* event,
                                   DeviceStream* stream) = 0;
  // True when the captured work is done, false while it is pending.
  virtual absl::StatusOr<bool> QueryEvent(DeviceEvent* event) = 0;
  // Blocks until the captured work is done.
  virtual absl::Status SynchronizeEvent(DeviceEvent* event) = 0;
  // Milliseconds between two completed timing events.
  // kFailedPrecondition when either is pending, unrecorded or not timing.
  virtual absl::StatusOr<double> ElapsedMillis(DeviceEvent* start,
                                               DeviceEvent* end) = 0;

  // ---- Copies ------------------------------------------------------------
  // Enqueues a copy of `bytes` bytes on `stream` and returns at once. Both
  // buffers must stay valid until the stream has passed the copy (record an
  // event after it). For truly asynchronous D2H/H2D on CUDA the host side
  // must be pinned (AllocatePinned or RegisterHost); pageable host memory
  // makes CUDA copy synchronously through its own bounce buffer.
  virtual absl::Status CopyAsync(void* dst, const void* src, size_t bytes,
                                 CopyKind kind, DeviceStream* stream) = 0;
  // A copy that has finished when it returns (legacy default stream on
  // CUDA; on the calling thread for the host runtime).
  virtual absl::Status Copy(void* dst, const void* src, size_t bytes,
                            CopyKind kind) = 0;

  // ---- Memory ------------------------------------------------------------
  // Page-locked host memory usable by every device, at least 4 KiB aligned.
  // kResourceExhausted when it cannot be had.
  virtual absl::StatusOr<void*> AllocatePinned(size_t bytes) = 0;
  virtual absl::Status FreePinned(void* ptr) = 0;
  // Page-locks existing host memory [ptr, ptr + bytes) so async copies can
  // use it in place (the staging pool uses this on its own mmap).
  // kAlreadyExists when (part of) the range is already registered.
  virtual absl::Status RegisterHost(void* ptr, size_t bytes) = 0;
  // kNotFound when `ptr` was not registered.
  virtual absl::Status UnregisterHost(void* ptr) = 0;
  // Device memory on `device`; kResourceExhausted when it cannot be had.
  virtual absl::StatusOr<void*> AllocateDevice(int device, size_t bytes) = 0;
  virtual absl::Status FreeDevice(void* ptr) = 0;
  // The device allocation on `device` that holds `ptr`: its first byte and
  // its size. One copy may span any bytes of one allocation (all of them
  // are mapped), never two. kNotFound when `ptr` is not in device memory
  // of `device` the runtime can place, pinned host memory included (callers
  // then copy each buffer by itself).
  virtual absl::StatusOr<DeviceAllocation> FindAllocation(int device,
                                                          const void* ptr) = 0;

  // ---- For libraries that take native handles (NCCL) ----------------------
  // The native handle of `stream`: its cudaStream_t on CUDA, the
  // DeviceStream* itself on the host runtime (as in core/device.h's
  // DeviceWait). Valid while `stream` is.
  virtual void* NativeStream(DeviceStream* stream) = 0;
  // Makes `device` current on the calling thread, for libraries that read
  // the current device instead of taking one (ncclCommInitRank); returns
  // the device current before, to give back afterwards, or -1 when there is
  // nothing to give back: that device has no context yet (a thread that
  // never used CUDA reports device 0), and making it current again would
  // create one, and its memory, on a GPU the job may not use.
  // kInvalidArgument for an ordinal outside [0, DeviceCount()).
  virtual absl::StatusOr<int> SetCurrentDevice(int device) = 0;
};

// Number of usable CUDA devices. 0 when the driver is missing or too old, or
// when there is no device: never an error, and safe on any machine (the CUDA
// runtime is linked statically and loads the driver lazily).
int CudaDeviceCount();

// Returns the runtime chosen by `mode` (see DeviceRuntimeMode). kAuto falls
// back to the host runtime when CudaDeviceCount() == 0, writing one line to
// stderr the first time it does so in the process where a CUDA driver is
// installed (none on a machine without a GPU driver). kCuda returns
// kFailedPrecondition naming the CUDA error when no device is usable.
absl::StatusOr<std::unique_ptr<DeviceRuntime>> CreateDeviceRuntime(
    DeviceRuntimeMode mode);

// RAII holder of a stream or event: destroys the handle with its runtime
// (an error on destruction is dropped: there is nobody to report it to).
template <typename Handle, absl::Status (DeviceRuntime::*kDestroy)(Handle*)>
class OwnedDeviceHandle {
 public:
  OwnedDeviceHandle() = default;
  OwnedDeviceHandle(DeviceRuntime* runtime, Handle* handle)
      : runtime_(runtime), handle_(handle) {}
  OwnedDeviceHandle(OwnedDeviceHandle&& other) noexcept {
    *this = std::move(other);
  }
  OwnedDeviceHandle& operator=(OwnedDeviceHandle&& other) noexcept {
    Reset();
    runtime_ = std::exchange(other.runtime_, nullptr);
    handle_ = std::exchange(other.handle_, nullptr);
    return *this;
  }
  ~OwnedDeviceHandle() { Reset(); }

  Handle* get() const { return handle_; }
  void Reset() {
    if (runtime_ != nullptr && handle_ != nullptr) {
      (runtime_->*kDestroy)(handle_).IgnoreError();
    }
    handle_ = nullptr;
  }

 private:
  DeviceRuntime* runtime_ = nullptr;
  Handle* handle_ = nullptr;
};

using OwnedStream =
    OwnedDeviceHandle<DeviceStream, &DeviceRuntime::DestroyStream>;
using OwnedEvent = OwnedDeviceHandle<DeviceEvent, &DeviceRuntime::DestroyEvent>;

// Convenience: create a stream / event already wrapped.
absl::StatusOr<OwnedStream> MakeOwnedStream(DeviceRuntime& runtime, int device);
absl::StatusOr<OwnedEvent> MakeOwnedEvent(DeviceRuntime& runtime, int device,
                                          bool enable_timing);

}  // namespace dcp

#endif  // DCP_CUDA_DEVICE_RUNTIME_H_
