#include "staging/internal/copy_streams.h"

#include <utility>

#include "core/status.h"

namespace dcp::internal_staging {

absl::StatusOr<DeviceStream*> CopyStreams::Next(int device) {
  absl::MutexLock lock(&mu_);
  std::vector<OwnedStream>& streams = streams_[device];
  if (streams.empty()) {
    for (int i = 0; i < streams_per_device_; ++i) {
      DCP_ASSIGN_OR_RETURN(OwnedStream stream,
                           MakeOwnedStream(*runtime_, device));
      streams.push_back(std::move(stream));
    }
  }
  size_t& next = next_[device];
  return streams[next++ % streams.size()].get();
}

absl::Status CopyStreams::WaitFor(const DeviceWait& wait) {
  if (wait.empty()) return absl::OkStatus();
  DCP_RETURN_IF_ERROR(Next(wait.device).status());  // Creates the streams.
  absl::MutexLock lock(&mu_);
  for (OwnedStream& stream : streams_[wait.device]) {
    DCP_RETURN_IF_ERROR(runtime_->StreamWaitNative(stream.get(), wait));
  }
  return absl::OkStatus();
}

absl::StatusOr<OwnedEvent> CopyStreams::TakeEvent(int device) {
  {
    absl::MutexLock lock(&mu_);
    std::vector<OwnedEvent>& free = free_events_[device];
    if (!free.empty()) {
      OwnedEvent event = std::move(free.back());
      free.pop_back();
      return event;
    }
  }
  return MakeOwnedEvent(*runtime_, device, /*enable_timing=*/false);
}

void CopyStreams::ReturnEvent(int device, OwnedEvent event) {
  if (event.get() == nullptr) return;
  absl::MutexLock lock(&mu_);
  free_events_[device].push_back(std::move(event));
}

}  // namespace dcp::internal_staging
