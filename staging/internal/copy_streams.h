// CopyStreams: per-device sets of copy streams (handed out round robin) and a
// free list of events, created on first use and reused. Internal to staging/.
//
// Thread safety: all methods are thread-safe.
#ifndef DCP_STAGING_INTERNAL_COPY_STREAMS_H_
#define DCP_STAGING_INTERNAL_COPY_STREAMS_H_

#include <cstddef>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cuda/device_runtime.h"

namespace dcp::internal_staging {

class CopyStreams {
 public:
  // `runtime` is not owned and must outlive this object.
  CopyStreams(DeviceRuntime* runtime, int streams_per_device)
      : runtime_(runtime),
        streams_per_device_(streams_per_device < 1 ? 1 : streams_per_device) {}

  // The next stream of `device`, round robin.
  absl::StatusOr<DeviceStream*> Next(int device);
  // Makes every stream of wait.device (created if need be) wait, on the
  // device, for the caller's work `wait` names. A no-op for an empty wait.
  absl::Status WaitFor(const DeviceWait& wait);
  // A non-timing event of `device` (recycled or new).
  absl::StatusOr<OwnedEvent> TakeEvent(int device);
  // Gives an event back for reuse; an empty one is ignored.
  void ReturnEvent(int device, OwnedEvent event);

 private:
  DeviceRuntime* const runtime_;
  const int streams_per_device_;
  absl::Mutex mu_;
  std::map<int, std::vector<OwnedStream>> streams_ ABSL_GUARDED_BY(mu_);
  std::map<int, size_t> next_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::vector<OwnedEvent>> free_events_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dcp::internal_staging

#endif  // DCP_STAGING_INTERNAL_COPY_STREAMS_H_
