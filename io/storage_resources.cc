#include "io/internal/storage_resources.h"

#include <algorithm>
#include <utility>

#include "core/status.h"
#include "io/internal/parallel_work.h"
#include "staging/device_staging.h"

namespace dcp::internal_io {

FileSystemBase* OrLocal(FileSystemBase* fs) {
  return fs != nullptr ? fs : &LocalFileSystem();
}

IoEngine* EngineOrOwn(IoEngine* given, IoMode mode,
                      std::unique_ptr<IoEngine>& owned, absl::Status& error) {
  if (given != nullptr) return given;
  IoEngineOptions options;
  options.mode = mode;
  absl::StatusOr<std::unique_ptr<IoEngine>> engine = NewIoEngine(options);
  if (!engine.ok()) {
    error = engine.status();
    return nullptr;
  }
  owned = *std::move(engine);
  return owned.get();
}

absl::StatusOr<DeviceStaging*> ReadStaging(
    DeviceStaging* given, std::unique_ptr<DeviceStaging>& owned) {
  DeviceStaging* staging = given;
  if (staging == nullptr) {
    if (owned == nullptr) {
      DeviceStagingOptions staging_options;
      staging_options.pool_bytes = kReadStagingPoolBytes;
      owned = std::make_unique<DeviceStaging>(staging_options);
    }
    staging = owned.get();
  }
  DCP_RETURN_IF_ERROR(staging->Pool().status());
  return staging;
}

std::unique_ptr<DeviceStaging> NewWriteStaging(int64_t per_thread_copy_ahead,
                                               int thread_count) {
  DeviceStagingOptions staging_options;
  const int64_t chunk = static_cast<int64_t>(staging_options.chunk_bytes);
  staging_options.pool_bytes = static_cast<size_t>(
      AlignUp(std::max(per_thread_copy_ahead, 2 * chunk), chunk) *
      thread_count);
  return std::make_unique<DeviceStaging>(staging_options);
}

}  // namespace dcp::internal_io
