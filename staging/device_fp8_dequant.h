// DeviceFp8Dequantizer: block-scaled fp8 rows read on the host, dequantized
// by the device (cuda/fp8_dequant.h) straight into device memory, for a
// reader loading quantized weights into device tensors
// (io/hf_quantized_reader.cc). Only the fp8 bytes (one per element) and each
// scale tensor, once, cross to the device, where dequantizing on the CPU
// would copy 2-4 bytes per element.
//
// Per device it holds the device copies of scale tensors (DeviceScales) and
// lanes: a stream and a device scratch buffer each, one lane per concurrent
// Dequantize call, its scratch grown to the largest window it has held.
// Dequantize copies one window's fp8 rows into a lane's scratch, launches
// the kernel on the lane's stream and waits for it: when it returns, the
// output is in device memory and the host rows may be reused. The lanes'
// streams are dcp's own, so a load's device wait (LoadOptions::device_wait:
// the caller's work that may still use the destination tensors) is given
// to OrderAfter, and every later copy and kernel starts after that work.
//
// With the host runtime the same path runs ("device" memory is host memory,
// the kernel its CPU twin), so tests exercise it without a GPU.
//
// Lifetime: the runtime must outlive this object; destruction waits for the
// lanes' streams and frees every device buffer this object allocated.
//
// Thread safety: all methods are thread-safe.
#ifndef DCP_STAGING_DEVICE_FP8_DEQUANT_H_
#define DCP_STAGING_DEVICE_FP8_DEQUANT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "core/device.h"
#include "core/dtype.h"
#include "cuda/device_runtime.h"
#include "cuda/fp8_dequant.h"

namespace dcp {

// One window of a 2-D slice of a quantized weight: the kernel's arguments
// (cuda/fp8_dequant.h: `rows` x `cols` elements whose first element sits at
// row `row0`, column `col0` of the slice), except that `region.fp8` is host
// memory (row r's `cols` fp8 bytes at fp8 + r * fp8_row_stride), which
// Dequantize copies to the device; `region.scales` (DeviceScales) and
// `region.out` are memory of `device`.
struct Fp8DeviceWindow {
  Fp8BlockDequantArgs region;
  int device = 0;
};

class DeviceFp8Dequantizer {
 public:
  // `runtime` is not owned.
  explicit DeviceFp8Dequantizer(DeviceRuntime* runtime);
  ~DeviceFp8Dequantizer();
  DeviceFp8Dequantizer(const DeviceFp8Dequantizer&) = delete;
  DeviceFp8Dequantizer& operator=(const DeviceFp8Dequantizer&) = delete;

  // The copy on `device` of the scale tensor `name` whose values are `host`:
  // made by the first call for (name, device), returned by later ones (which
  // do not look at `host` again); valid while this object lives. The
  // runtime's error naming the scale (kResourceExhausted when device memory
  // runs out).
  absl::StatusOr<const float*> DeviceScales(const std::string& name,
                                            absl::Span<const float> host,
                                            int device);

  // Dequantizes `window` into window.region.out and waits until it is
  // there. Rows far apart in the host buffer are packed first, so a lane's
  // scratch holds at most twice the window's elements. kInvalidArgument for
  // negative sizes or strides; kResourceExhausted when the
  // scratch cannot be allocated (nothing was written: the caller may
  // dequantize on the CPU instead); the runtime's or the kernel's error
  // otherwise.
  absl::Status Dequantize(const Fp8DeviceWindow& window);

  // Makes every later Dequantize wait, on the device, for the caller's
  // work `wait` names as it stands now (a stream's work so far, an event's
  // latest record; core/device.h) before its copy and its kernel start;
  // the host does not block. Replaces the previous wait; an empty wait
  // clears it. Call it before the Dequantize calls of a load, with the
  // load's device wait. kInvalidArgument for a device the runtime does not
  // have; the runtime's error otherwise (the previous wait then stays).
  absl::Status OrderAfter(const DeviceWait& wait);

 private:
  struct Lane {
    int device = 0;
    OwnedStream stream;
    void* scratch = nullptr;
    int64_t scratch_bytes = 0;
    std::vector<uint8_t> packed;  // Host rows packed for one copy.
  };

  // An idle lane of `device`, or a new one.
  absl::StatusOr<std::unique_ptr<Lane>> TakeLane(int device);
  void ReturnLane(std::unique_ptr<Lane> lane);
  // Waits for the lane's stream and frees what it holds (errors dropped:
  // used after failures and at destruction).
  void DestroyLane(std::unique_ptr<Lane> lane);

  DeviceRuntime* const runtime_;
  absl::Mutex mu_;
  std::map<int, std::vector<std::unique_ptr<Lane>>> idle_lanes_
      ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, int>, void*> scales_ ABSL_GUARDED_BY(mu_);
  // Completes when the work OrderAfter captured is done; empty: none.
  OwnedEvent after_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dcp

#endif  // DCP_STAGING_DEVICE_FP8_DEQUANT_H_
