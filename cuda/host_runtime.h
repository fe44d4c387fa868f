// The host-memory DeviceRuntime: what dcp uses on a machine without a GPU,
// and what every pipeline test runs against.
//
// It behaves like a device as far as ordering goes: each stream is a worker
// thread draining a FIFO queue, copies run on that worker, an event completes
// when the stream's worker reaches it, and StreamWaitEvent makes a worker
// wait for another stream. So code that forgets to wait for an event before
// reading a staged buffer reads stale bytes here too, and overlap between
// copies and their consumer can be observed (see HostRuntimeOptions).
//
// "Device" memory is ordinary host memory; it reports one pretend device
// (ordinal 0) named "host-memory device". Device-side pointers passed to a
// copy must lie inside an AllocateDevice allocation, and host-side pointers
// must not: kInvalidArgument otherwise. Unknown stream or event handles are
// kInvalidArgument. A failed copy (see copy_fault) makes its stream's error
// sticky: SynchronizeStream and every event recorded afterwards on that
// stream report it, and later copies on the stream are skipped.
#ifndef DCP_CUDA_HOST_RUNTIME_H_
#define DCP_CUDA_HOST_RUNTIME_H_

#include <cstddef>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "cuda/device_runtime.h"

namespace dcp {

// One copy as the stream worker sees it, for observers and fault injection.
struct HostCopyTrace {
  enum class Phase { kStart, kEnd };
  Phase phase = Phase::kStart;
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
  CopyKind kind = CopyKind::kHostToHost;
  DeviceStream* stream = nullptr;  // nullptr for synchronous Copy.
};

// A stream worker about to block in a StreamWaitEvent (or StreamWaitNative)
// whose event its recording stream has not reached yet.
struct HostWaitTrace {
  DeviceStream* stream = nullptr;    // The stream that waits.
  DeviceStream* recorder = nullptr;  // The stream the event was recorded on.
};

struct HostRuntimeOptions {
  // Called on the stream worker right before (kStart) and right after (kEnd)
  // each copy. Tests use it to record sequences or to hold a copy back until
  // something else happened. Must be thread-safe; may block.
  std::function<void(const HostCopyTrace&)> copy_observer;
  // Called on the stream worker before each async copy (phase kStart); a
  // non-OK result fails that copy instead of performing it (the stream's
  // error becomes sticky, as a CUDA fault would).
  std::function<absl::Status(const HostCopyTrace&)> copy_fault;
  // Called on the stream worker right before it blocks in a wait (see
  // HostWaitTrace); a wait whose event was reached already calls nothing.
  // Tests use it to release held work only once a wait for it is in place.
  // Must be thread-safe; may block, but not on the awaited event.
  std::function<void(const HostWaitTrace&)> wait_observer;
  // Bytes AllocateDevice may hand out in total; 0 means no limit. Beyond it
  // AllocateDevice returns kResourceExhausted, like cudaMalloc.
  size_t device_memory_limit = 0;
};

// A new host runtime. Destroying it joins every stream worker after its
// pending work and frees what was left allocated.
std::unique_ptr<DeviceRuntime> CreateHostRuntime(
    HostRuntimeOptions options = {});

}  // namespace dcp

#endif  // DCP_CUDA_HOST_RUNTIME_H_
