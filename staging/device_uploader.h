// DeviceUploader: the load-side twin of StagingPipeline. The reader fills
// pool chunks from files and hands each to Upload with its device
// destination; the uploader enqueues the host-to-device copy on one of the
// device's streams and returns at once, and a completion thread releases the
// chunk back to the pool when the copy's event has completed. So reads of
// chunk k+1 overlap the copy of chunk k, and memory stays bounded by the
// pool (the reader blocks in HostBufferPool::Acquire while every chunk is
// busy).
//
// Errors are sticky: the first failed copy is kept, later uploads are
// refused with it (their chunks released at once), and Flush returns it.
//
// Thread safety: Upload and Flush may be called from any thread. The runtime
// must outlive the uploader; destruction waits for every copy.
#ifndef DCP_STAGING_DEVICE_UPLOADER_H_
#define DCP_STAGING_DEVICE_UPLOADER_H_

#include <cstddef>
#include <deque>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "core/device.h"
#include "cuda/device_runtime.h"
#include "staging/host_buffer_pool.h"
#include "staging/staging_pipeline.h"

namespace dcp {

// One contiguous copy out of a chunk: bytes [chunk_offset, chunk_offset +
// length) of the chunk to `dst`.
struct UploadRun {
  size_t chunk_offset = 0;
  size_t length = 0;
  void* dst = nullptr;
};

class DeviceUploader {
 public:
  // Streams per device from options.num_streams.
  explicit DeviceUploader(DeviceRuntime* runtime,
                          StagingPipelineOptions options = {});
  // Waits for every copy, then stops the completion thread.
  ~DeviceUploader();
  DeviceUploader(const DeviceUploader&) = delete;
  DeviceUploader& operator=(const DeviceUploader&) = delete;

  // Copies chunk bytes [0, length) to `dst`, memory of `device` (a CUDA
  // device of the runtime; a CPU destination is copied on the calling
  // thread before this returns, on no device's stream). Takes the lease;
  // the chunk returns to its pool once the copy has landed. kInvalidArgument
  // for length > chunk size, a null destination or an unknown device; the
  // sticky error after a failure.
  absl::Status Upload(PoolChunk chunk, size_t length, void* dst, Device device);

  // Copies every run of the chunk to memory of `device` (one stream, in
  // order; for a destination box whose rows are not adjacent in memory) and
  // releases the chunk once the last copy has landed. kInvalidArgument for a
  // run outside the chunk or to a null destination; errors as Upload.
  absl::Status UploadRuns(PoolChunk chunk, absl::Span<const UploadRun> runs,
                          Device device);

  // Blocks until every copy enqueued so far has landed; returns the first
  // error of any of them (and keeps it).
  absl::Status Flush();

  // Makes every stream of wait.device wait, on the device, for the caller's
  // work `wait` names (a stream's work so far, or an event's latest
  // record): copies enqueued afterwards start after it. The host does not
  // block. A no-op for an empty wait; the runtime's error otherwise.
  absl::Status WaitFor(const DeviceWait& wait);

 private:
  struct Pending {
    PoolChunk chunk;
    OwnedEvent event;
    int device = 0;
  };
  void CompletionLoop();

  DeviceRuntime* const runtime_;
  std::unique_ptr<internal_staging::CopyStreams> streams_;

  absl::Mutex mu_;
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);
  size_t enqueued_ ABSL_GUARDED_BY(mu_) = 0;
  size_t landed_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread completion_;  // Last: starts after the members above exist.
};

}  // namespace dcp

#endif  // DCP_STAGING_DEVICE_UPLOADER_H_
