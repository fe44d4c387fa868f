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
// an event the caller recorded (the save waits for the work before its
// latest record). dcp makes its copy streams wait on the device. The
// handles are the device runtime's native ones: cudaStream_t / cudaEvent_t
// on CUDA (a torch stream's `cuda_stream`, an event's `cuda_event`; a null
// stream is the legacy default stream, torch's default), the host
// runtime's DeviceStream* / DeviceEvent* on the host runtime. Not owned;
// they must stay valid until the save's staging is done. Every device
// tensor of the save must be on `device` (kInvalidArgument otherwise).
struct DeviceWait {
  enum class Kind { kNone, kStream, kEvent };
  Kind kind = Kind::kNone;
  int device = 0;
  void* handle = nullptr;  // The stream or the event.

  static DeviceWait Stream(int device, void* stream) {
    return {Kind::kStream, device, stream};
  }
  static DeviceWait Event(int device, void* event) {
    return {Kind::kEvent, device, event};
  }
  bool empty() const { return kind == Kind::kNone; }
};

}  // namespace dcp

#endif  // DCP_CORE_DEVICE_H_
