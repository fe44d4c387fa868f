#include "staging/device_uploader.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "core/status.h"
#include "cuda/host_copy.h"
#include "staging/internal/copy_streams.h"

namespace dcp {

DeviceUploader::DeviceUploader(DeviceRuntime* runtime,
                               StagingPipelineOptions options)
    : runtime_(runtime),
      streams_(std::make_unique<internal_staging::CopyStreams>(
          runtime, options.num_streams)),
      completion_([this] { CompletionLoop(); }) {}

DeviceUploader::~DeviceUploader() {
  Flush().IgnoreError();
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  completion_.join();
}

absl::Status DeviceUploader::Upload(PoolChunk chunk, size_t length, void* dst,
                                    Device device) {
  const UploadRun run{0, length, dst};
  return UploadRuns(std::move(chunk), {&run, 1}, device);
}

absl::Status DeviceUploader::UploadRuns(PoolChunk chunk,
                                        absl::Span<const UploadRun> runs,
                                        Device device) {
  {
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) return error_;
  }
  for (const UploadRun& run : runs) {
    if (!chunk.valid() || run.chunk_offset > chunk.size() ||
        run.length > chunk.size() - run.chunk_offset || run.dst == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "DeviceUploader::Upload: bytes [%d, %d) of a %s chunk of %d bytes "
          "to %p",
          run.chunk_offset, run.chunk_offset + run.length,
          chunk.valid() ? "leased" : "missing", chunk.size(), run.dst));
    }
  }
  if (!device.is_cuda()) {
    // Host memory is copied here, not on a device's stream, which would
    // create a CUDA context on device 0 for a job that may not use it. The
    // chunk returns to its pool when `chunk` goes.
    for (const UploadRun& run : runs) {
      BulkHostCopy(run.dst, chunk.data() + run.chunk_offset, run.length);
    }
    return absl::OkStatus();
  }
  const int ordinal = device.index;
  if (ordinal < 0 || ordinal >= runtime_->DeviceCount()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "DeviceUploader::Upload to %s: the %s runtime has %d device(s)",
        device.ToString(), runtime_->name(), runtime_->DeviceCount()));
  }
  Pending pending;
  pending.device = ordinal;
  DCP_ASSIGN_OR_RETURN(DeviceStream * stream, streams_->Next(ordinal));
  DCP_ASSIGN_OR_RETURN(pending.event, streams_->TakeEvent(ordinal));
  absl::Status copied;
  std::string where;
  for (const UploadRun& run : runs) {
    copied = runtime_->CopyAsync(run.dst, chunk.data() + run.chunk_offset,
                                 run.length, CopyKind::kHostToDevice, stream);
    if (!copied.ok()) {
      where = absl::StrFormat("upload of %d bytes to %s %p", run.length,
                              device.ToString(), run.dst);
      break;
    }
  }
  // From here a copy may be reading the chunk: it must stay leased until
  // the stream has passed it, even if a later step fails.
  if (copied.ok()) {
    copied = runtime_->RecordEvent(pending.event.get(), stream);
    where = absl::StrFormat("upload of %d run(s) to %s", runs.size(),
                            device.ToString());
  }
  if (!copied.ok()) {
    runtime_->SynchronizeStream(stream).IgnoreError();
    return Annotate(copied, where);
  }
  pending.chunk = std::move(chunk);
  absl::MutexLock lock(&mu_);
  pending_.push_back(std::move(pending));
  ++enqueued_;
  return absl::OkStatus();
}

absl::Status DeviceUploader::Flush() {
  absl::MutexLock lock(&mu_);
  const size_t target = enqueued_;
  auto landed = [this, target]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return landed_ >= target;
  };
  mu_.Await(absl::Condition(&landed));
  return error_;
}

absl::Status DeviceUploader::WaitFor(const DeviceWait& wait) {
  if (wait.empty()) return absl::OkStatus();
  if (wait.device < 0 || wait.device >= runtime_->DeviceCount()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the caller's stream to wait for is on cuda:%d; the %s runtime has "
        "%d device(s)",
        wait.device, runtime_->name(), runtime_->DeviceCount()));
  }
  return Annotate(streams_->WaitFor(wait), "waiting for the caller's stream");
}

void DeviceUploader::CompletionLoop() {
  while (true) {
    Pending pending;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !pending_.empty() || stopping_;
      };
      mu_.Await(absl::Condition(&ready));
      if (pending_.empty()) return;
      pending = std::move(pending_.front());
      pending_.pop_front();
    }
    absl::Status landed = runtime_->SynchronizeEvent(pending.event.get());
    streams_->ReturnEvent(pending.device, std::move(pending.event));
    pending.chunk.Release();  // Back to the pool: the copy has read it.
    absl::MutexLock lock(&mu_);
    if (!landed.ok() && error_.ok()) {
      error_ = Annotate(landed, "DeviceUploader: host-to-device copy");
    }
    ++landed_;
  }
}

}  // namespace dcp
