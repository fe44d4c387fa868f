// DeviceStaging: what a storage writer or reader needs to move tensors
// between device memory and files, behind one object, so that io/ never
// names the device runtime:
//   * a DeviceRuntime (given, or CreateDeviceRuntime(kAuto) on first use);
//   * one bounded HostBufferPool, created on first use and shared by every
//     caller (so the memory bound holds for all writer threads together);
//   * save side: Stage() streams tensors through the pool with a
//     StagingPipeline per concurrent caller (copy of piece k+1 overlaps the
//     caller's write of piece k);
//   * load side: AcquireChunk() + UploadRuns() copy filled chunks to
//     device memory through one DeviceUploader (created on first use),
//     which releases each chunk when its copy has landed; Flush() waits for
//     all of them.
//
// Lifetime: every PoolChunk handed out (in a StagedPiece or by
// AcquireChunk) must be released before the DeviceStaging is destroyed (the
// pool's memory is registered with the runtime this object may own).
//
// Thread safety: all methods are thread-safe. Concurrent Stage calls run on
// separate pipelines and compete for the same pool chunks.
#ifndef DCP_STAGING_DEVICE_STAGING_H_
#define DCP_STAGING_DEVICE_STAGING_H_

#include <sys/uio.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "core/device.h"
#include "cuda/device_runtime.h"
#include "staging/device_uploader.h"
#include "staging/host_buffer_pool.h"
#include "staging/staging_pipeline.h"

namespace dcp {

struct DeviceStagingOptions {
  // The pool bound, rounded down to whole chunks (at least two, so a copy
  // can run while the previous piece is written).
  size_t pool_bytes = size_t{64} << 20;
  // Bytes per chunk (a piece of a tensor): see HostBufferPoolOptions.
  size_t chunk_bytes = size_t{8} << 20;
  // Copy streams per device (see StagingPipelineOptions).
  int num_streams = 2;
  // Page-lock the pool (needed for asynchronous copies on CUDA).
  bool use_pinned_memory = true;
};

class DeviceStaging {
 public:
  // `runtime` is not owned and may be null (then the auto runtime is created
  // on first use and owned). A runtime passed in must outlive this object.
  explicit DeviceStaging(DeviceStagingOptions options = {},
                         DeviceRuntime* runtime = nullptr);
  ~DeviceStaging();
  DeviceStaging(const DeviceStaging&) = delete;
  DeviceStaging& operator=(const DeviceStaging&) = delete;

  // The pool, created on the first call (with the runtime). Its Regions()
  // are what an I/O engine registers as fixed buffers. The runtime's error
  // or kResourceExhausted when the pool cannot be had; the same error again
  // on later calls.
  absl::StatusOr<HostBufferPool*> Pool();

  // Streams every item through the pool into `consumer` (see
  // StagingPipeline::Run for the order, the errors, who owns the chunk and
  // `wait`).
  absl::Status Stage(absl::Span<const PipelineItem> items,
                     PieceConsumer consumer, const DeviceWait& wait = {});

  // Load side. A free chunk of the pool (blocks while all are leased).
  absl::StatusOr<PoolChunk> AcquireChunk();
  // Copies the runs out of `chunk` to memory of `device` and releases the
  // chunk once the copies have landed: DeviceUploader::UploadRuns of this
  // object's uploader (contract and errors there).
  absl::Status UploadRuns(PoolChunk chunk, absl::Span<const UploadRun> runs,
                          Device device);
  // Waits for every upload so far; the first error of any of them. After an
  // error the next upload starts clean. Call it when no upload is running.
  absl::Status Flush();
  // The load side's stream rule: every copy that UploadRuns enqueues from now
  // on (until a failed Flush) starts on the device only after the caller's
  // work `wait` names (DeviceUploader::WaitFor); the host does not block.
  // A no-op for an empty wait; the runtime's error otherwise.
  absl::Status OrderUploadsAfter(const DeviceWait& wait);
  // The wait the last OrderUploadsAfter was given (empty after Flush or
  // before any): other device work of the same load (the fp8 dequantizer's
  // lanes) orders itself after it too.
  DeviceWait UploadWait();

  // Devices the runtime has (creating the runtime if needed; 0 on error).
  int DeviceCount();
  // The runtime (created with the pool if needed; owned by this object or
  // the caller, alive as long as this object). The same error as Pool().
  absl::StatusOr<DeviceRuntime*> Runtime();
  const DeviceStagingOptions& options() const { return options_; }

 private:
  absl::Status EnsureLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The uploader, created on first use.
  absl::StatusOr<DeviceUploader*> Uploader();
  absl::StatusOr<std::unique_ptr<StagingPipeline>> TakePipeline();
  void ReturnPipeline(std::unique_ptr<StagingPipeline> pipeline);

  const DeviceStagingOptions options_;

  absl::Mutex mu_;
  DeviceRuntime* runtime_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<DeviceRuntime> owned_runtime_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<HostBufferPool> pool_ ABSL_GUARDED_BY(mu_);
  absl::Status setup_error_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<StagingPipeline>> idle_pipelines_
      ABSL_GUARDED_BY(mu_);
  std::unique_ptr<DeviceUploader> uploader_ ABSL_GUARDED_BY(mu_);
  DeviceWait upload_wait_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dcp

#endif  // DCP_STAGING_DEVICE_STAGING_H_
