// Where a tensor's bytes live: host memory or a CUDA device.
#ifndef DCP_CORE_DEVICE_H_
#define DCP_CORE_DEVICE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dcp {

struct Device {
  enum class Kind { kCpu, kCuda };

  Kind kind = Kind::kCpu;
  int index = 0;  // Device ordinal for kCuda; 0 for kCpu.

  static Device Cpu() { return Device{}; }
  static Device Cuda(int index) { return Device{Kind::kCuda, index}; }

  bool is_cpu() const { return kind == Kind::kCpu; }
  bool is_cuda() const { return kind == Kind::kCuda; }

  // "cpu" or "cuda:N".
  std::string ToString() const;

  // Parses "cpu", "cuda" (ordinal 0) or "cuda:N".
  static absl::StatusOr<Device> Parse(absl::string_view text);

  friend bool operator==(const Device& a, const Device& b) {
    return a.kind == b.kind && a.index == b.index;
  }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};

// Device work a save must wait for before it copies device tensors: the
// caller's stream (the save waits for everything enqueued on it so far) or
// an event the caller recorded (the save waits for the work before it). dcp
// makes its copy streams wait on the device, never the host. The handles
// are the device runtime's native ones: cudaStream_t / cudaEvent_t on CUDA
// (a torch stream's `cuda_stream`, an event's `cuda_event`), the host
// runtime's DeviceStream* / DeviceEvent* on the host runtime. Not owned;
// they must stay valid until the save's staging is done. Only tensors on
// `device` are ordered; with both set, the event is used.
struct DeviceWait {
  int device = 0;
  void* stream = nullptr;
  void* event = nullptr;

  bool empty() const { return stream == nullptr && event == nullptr; }
};

}  // namespace dcp

#endif  // DCP_CORE_DEVICE_H_
