#include "staging/device_fp8_dequant.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "cuda/fp8_dequant.h"

namespace dcp {

DeviceFp8Dequantizer::DeviceFp8Dequantizer(DeviceRuntime* runtime)
    : runtime_(runtime) {}

DeviceFp8Dequantizer::~DeviceFp8Dequantizer() {
  absl::MutexLock lock(&mu_);
  after_.Reset();
  for (auto& [device, lanes] : idle_lanes_) {
    for (std::unique_ptr<Lane>& lane : lanes) DestroyLane(std::move(lane));
  }
  for (auto& [key, ptr] : scales_) runtime_->FreeDevice(ptr).IgnoreError();
}

absl::StatusOr<std::unique_ptr<DeviceFp8Dequantizer::Lane>>
DeviceFp8Dequantizer::TakeLane(int device) {
  {
    absl::MutexLock lock(&mu_);
    std::vector<std::unique_ptr<Lane>>& idle = idle_lanes_[device];
    if (!idle.empty()) {
      std::unique_ptr<Lane> lane = std::move(idle.back());
      idle.pop_back();
      return lane;
    }
  }
  auto lane = std::make_unique<Lane>();
  lane->device = device;
  DCP_ASSIGN_OR_RETURN(lane->stream, MakeOwnedStream(*runtime_, device));
  return lane;
}

void DeviceFp8Dequantizer::ReturnLane(std::unique_ptr<Lane> lane) {
  absl::MutexLock lock(&mu_);
  idle_lanes_[lane->device].push_back(std::move(lane));
}

void DeviceFp8Dequantizer::DestroyLane(std::unique_ptr<Lane> lane) {
  runtime_->SynchronizeStream(lane->stream.get()).IgnoreError();
  if (lane->scratch != nullptr) {
    runtime_->FreeDevice(lane->scratch).IgnoreError();
  }
  lane->stream.Reset();
}

absl::StatusOr<const float*> DeviceFp8Dequantizer::DeviceScales(
    const std::string& name, absl::Span<const float> host, int device) {
  const std::pair<std::string, int> key(name, device);
  {
    absl::MutexLock lock(&mu_);
    auto it = scales_.find(key);
    if (it != scales_.end()) return static_cast<const float*>(it->second);
  }
  const size_t bytes = host.size() * sizeof(float);
  const std::string what = absl::StrCat("copying the scale ", name, " (", bytes,
                                        " bytes) to device ", device);
  absl::StatusOr<void*> copy = runtime_->AllocateDevice(device, bytes);
  if (!copy.ok()) return Annotate(copy.status(), what);
  // On a lane's stream, waited for: a synchronous Copy from pageable memory
  // may return before the bytes land, and the kernels run on other streams.
  absl::StatusOr<std::unique_ptr<Lane>> lane = TakeLane(device);
  absl::Status status = lane.status();
  if (status.ok()) {
    status =
        runtime_->CopyAsync(*copy, host.data(), bytes, CopyKind::kHostToDevice,
                            (*lane)->stream.get());
    if (status.ok())
      status = runtime_->SynchronizeStream((*lane)->stream.get());
    if (status.ok()) {
      ReturnLane(*std::move(lane));
    } else {
      DestroyLane(*std::move(lane));
    }
  }
  if (!status.ok()) {
    runtime_->FreeDevice(*copy).IgnoreError();
    return Annotate(status, what);
  }
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = scales_.emplace(key, *copy);
  if (!inserted) runtime_->FreeDevice(*copy).IgnoreError();  // Lost a race.
  return static_cast<const float*>(it->second);
}

absl::Status DeviceFp8Dequantizer::OrderAfter(const DeviceWait& wait) {
  OwnedEvent after;
  if (!wait.empty()) {
    if (wait.device < 0 || wait.device >= runtime_->DeviceCount()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the caller's stream to wait for is on cuda:", wait.device, "; the ",
          runtime_->name(), " runtime has ", runtime_->DeviceCount(),
          " device(s)"));
    }
    // Captured now, on a lane's stream: an event recorded after the wait
    // completes when the caller's work as it stands now is done.
    DCP_ASSIGN_OR_RETURN(after, MakeOwnedEvent(*runtime_, wait.device,
                                               /*enable_timing=*/false));
    DCP_ASSIGN_OR_RETURN(std::unique_ptr<Lane> lane, TakeLane(wait.device));
    absl::Status status = runtime_->StreamWaitNative(lane->stream.get(), wait);
    if (status.ok())
      status = runtime_->RecordEvent(after.get(), lane->stream.get());
    if (!status.ok()) {
      DestroyLane(std::move(lane));
      return Annotate(status, "waiting for the caller's stream");
    }
    ReturnLane(std::move(lane));
  }
  // The event replaced may still be waited for by a lane's stream: both
  // runtimes keep it until that wait is over.
  absl::MutexLock lock(&mu_);
  after_ = std::move(after);
  return absl::OkStatus();
}

absl::Status DeviceFp8Dequantizer::Dequantize(const Fp8DeviceWindow& window) {
  const Fp8BlockDequantArgs& region = window.region;
  if (region.rows < 0 || region.cols < 0 || region.fp8_row_stride < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("fp8 window of ", region.rows, "x", region.cols,
                     " with row stride ", region.fp8_row_stride));
  }
  if (region.rows == 0 || region.cols == 0) return absl::OkStatus();
  DCP_ASSIGN_OR_RETURN(std::unique_ptr<Lane> lane, TakeLane(window.device));

  // The bytes to copy: the rows with what lies between them, or packed when
  // that is more than the rows themselves.
  const auto* host = static_cast<const uint8_t*>(region.fp8);
  const int64_t dense = region.rows * region.cols;
  const int64_t span = (region.rows - 1) * region.fp8_row_stride + region.cols;
  const uint8_t* src = host;
  int64_t src_stride = region.fp8_row_stride;
  int64_t bytes = span;
  if (region.rows > 1 && region.fp8_row_stride != region.cols &&
      span > 2 * dense) {
    lane->packed.resize(dense);
    for (int64_t r = 0; r < region.rows; ++r) {
      std::memcpy(lane->packed.data() + r * region.cols,
                  host + r * region.fp8_row_stride, region.cols);
    }
    src = lane->packed.data();
    src_stride = region.cols;
    bytes = dense;
  }
  if (lane->scratch_bytes < bytes) {
    // The lane's stream is idle: every Dequantize waits for it.
    if (lane->scratch != nullptr) {
      absl::Status freed = runtime_->FreeDevice(lane->scratch);
      lane->scratch = nullptr;
      lane->scratch_bytes = 0;
      if (!freed.ok()) {
        DestroyLane(std::move(lane));
        return freed;
      }
    }
    absl::StatusOr<void*> scratch =
        runtime_->AllocateDevice(window.device, static_cast<size_t>(bytes));
    if (!scratch.ok()) {
      ReturnLane(std::move(lane));
      return Annotate(
          scratch.status(),
          absl::StrCat("device scratch of ", bytes,
                       " bytes for fp8 rows on device ", window.device));
    }
    lane->scratch = *scratch;
    lane->scratch_bytes = bytes;
  }

  Fp8BlockDequantArgs args = region;  // The fp8 rows as they lie on device.
  args.fp8 = lane->scratch;
  args.fp8_row_stride = src_stride;
  DeviceStream* stream = lane->stream.get();
  absl::Status status;
  {
    // The kernel writes the caller's tensor: not before the caller's work
    // on it (OrderAfter) is done.
    absl::MutexLock lock(&mu_);
    if (after_.get() != nullptr) {
      status = Annotate(runtime_->StreamWaitEvent(stream, after_.get()),
                        "waiting for the caller's stream");
    }
  }
  if (status.ok()) {
    status = runtime_->CopyAsync(lane->scratch, src, static_cast<size_t>(bytes),
                                 CopyKind::kHostToDevice, stream);
  }
  if (status.ok())
    status = DequantizeFp8BlocksOnDevice(*runtime_, stream, args);
  if (status.ok()) status = runtime_->SynchronizeStream(stream);
  if (!status.ok()) {
    // The stream may hold a sticky error; the lane is not reused.
    DestroyLane(std::move(lane));
    return status;
  }
  ReturnLane(std::move(lane));
  return absl::OkStatus();
}

}  // namespace dcp
