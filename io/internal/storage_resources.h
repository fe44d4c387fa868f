// Internal to io/: what a storage writer or reader uses when its options
// do not give it one: the local file system, an I/O engine of its own, and
// device staging made on first use.
//
// Thread safety: each function's note.
#ifndef DCP_IO_INTERNAL_STORAGE_RESOURCES_H_
#define DCP_IO_INTERNAL_STORAGE_RESOURCES_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "io/file_system.h"
#include "io/io_engine.h"

namespace dcp {

class DeviceStaging;  // staging/device_staging.h

namespace internal_io {

// `fs`, or the local file system when it is null. Thread-safe.
FileSystemBase* OrLocal(FileSystemBase* fs);

// `given`, or a new engine of `mode` kept in `owned` (a set-up failure goes
// to `error`, which the storage reports at SetUp). Call it from the
// storage's constructor.
IoEngine* EngineOrOwn(IoEngine* given, IoMode mode,
                      std::unique_ptr<IoEngine>& owned, absl::Status& error);

// The staging pool a reader creates for device destinations.
inline constexpr size_t kReadStagingPoolBytes = size_t{64} << 20;

// A reader's staging for device destinations: `given`, or the one kept in
// `owned`, made with a pool of kReadStagingPoolBytes on the first call.
// Its pool's error (DeviceStaging::Pool) when the pool cannot be had. Not
// thread-safe: call it from the thread that plans the reads.
absl::StatusOr<DeviceStaging*> ReadStaging(
    DeviceStaging* given, std::unique_ptr<DeviceStaging>& owned);

// A writer's own staging for `thread_count` writer threads: each copies
// `per_thread_copy_ahead` bytes ahead (at least two chunks), rounded up to
// whole chunks. The pool is made on first use. Thread-safe.
std::unique_ptr<DeviceStaging> NewWriteStaging(int64_t per_thread_copy_ahead,
                                               int thread_count);

}  // namespace internal_io
}  // namespace dcp

#endif  // DCP_IO_INTERNAL_STORAGE_RESOURCES_H_
