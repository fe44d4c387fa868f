#include "staging/device_staging.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace dcp {

DeviceStaging::DeviceStaging(DeviceStagingOptions options,
                             DeviceRuntime* runtime)
    : options_(options), runtime_(runtime) {}

DeviceStaging::~DeviceStaging() {
  // Copies still in flight land before the pool and the runtime go (the
  // members are destroyed uploader, pipelines, pool, runtime).
  absl::MutexLock lock(&mu_);
  if (uploader_ != nullptr) uploader_->Flush().IgnoreError();
}

absl::Status DeviceStaging::EnsureLocked() {
  if (pool_ != nullptr) return absl::OkStatus();
  if (!setup_error_.ok()) return setup_error_;
  if (runtime_ == nullptr) {
    absl::StatusOr<std::unique_ptr<DeviceRuntime>> created =
        CreateDeviceRuntime(DeviceRuntimeMode::kAuto);
    if (!created.ok()) {
      setup_error_ = Annotate(created.status(), "device staging runtime");
      return setup_error_;
    }
    owned_runtime_ = *std::move(created);
    runtime_ = owned_runtime_.get();
  }
  HostBufferPoolOptions pool_options;
  pool_options.chunk_bytes = std::max<size_t>(options_.chunk_bytes, 4096);
  pool_options.total_bytes =
      std::max(options_.pool_bytes, 2 * pool_options.chunk_bytes);
  pool_options.use_pinned_memory = options_.use_pinned_memory;
  absl::StatusOr<std::unique_ptr<HostBufferPool>> pool =
      HostBufferPool::Create(runtime_, pool_options);
  if (!pool.ok()) {
    setup_error_ = Annotate(pool.status(),
                            absl::StrCat("device staging pool of ",
                                         pool_options.total_bytes, " bytes"));
    return setup_error_;
  }
  pool_ = *std::move(pool);
  return absl::OkStatus();
}

absl::StatusOr<HostBufferPool*> DeviceStaging::Pool() {
  absl::MutexLock lock(&mu_);
  DCP_RETURN_IF_ERROR(EnsureLocked());
  return pool_.get();
}

int DeviceStaging::DeviceCount() {
  absl::MutexLock lock(&mu_);
  if (!EnsureLocked().ok()) return 0;
  return runtime_->DeviceCount();
}

absl::StatusOr<DeviceRuntime*> DeviceStaging::Runtime() {
  absl::MutexLock lock(&mu_);
  DCP_RETURN_IF_ERROR(EnsureLocked());
  return runtime_;
}

absl::StatusOr<std::unique_ptr<StagingPipeline>> DeviceStaging::TakePipeline() {
  absl::MutexLock lock(&mu_);
  DCP_RETURN_IF_ERROR(EnsureLocked());
  if (!idle_pipelines_.empty()) {
    std::unique_ptr<StagingPipeline> pipeline =
        std::move(idle_pipelines_.back());
    idle_pipelines_.pop_back();
    return pipeline;
  }
  StagingPipelineOptions pipeline_options;
  pipeline_options.num_streams = options_.num_streams;
  return std::make_unique<StagingPipeline>(runtime_, pool_.get(),
                                           pipeline_options);
}

void DeviceStaging::ReturnPipeline(std::unique_ptr<StagingPipeline> pipeline) {
  absl::MutexLock lock(&mu_);
  idle_pipelines_.push_back(std::move(pipeline));
}

absl::Status DeviceStaging::Stage(absl::Span<const PipelineItem> items,
                                  PieceConsumer consumer,
                                  const DeviceWait& wait) {
  DCP_ASSIGN_OR_RETURN(std::unique_ptr<StagingPipeline> pipeline,
                       TakePipeline());
  absl::Status status = pipeline->Run(items, std::move(consumer), wait);
  ReturnPipeline(std::move(pipeline));
  return status;
}

absl::StatusOr<PoolChunk> DeviceStaging::AcquireChunk() {
  HostBufferPool* pool;
  {
    absl::MutexLock lock(&mu_);
    DCP_RETURN_IF_ERROR(EnsureLocked());
    pool = pool_.get();
  }
  return pool->Acquire();  // Not under mu_: it blocks until a chunk is free.
}

absl::StatusOr<DeviceUploader*> DeviceStaging::Uploader() {
  absl::MutexLock lock(&mu_);
  DCP_RETURN_IF_ERROR(EnsureLocked());
  if (uploader_ == nullptr) {
    StagingPipelineOptions uploader_options;
    uploader_options.num_streams = options_.num_streams;
    uploader_ = std::make_unique<DeviceUploader>(runtime_, uploader_options);
  }
  return uploader_.get();
}

absl::Status DeviceStaging::UploadRuns(PoolChunk chunk,
                                       absl::Span<const UploadRun> runs,
                                       Device device) {
  DCP_ASSIGN_OR_RETURN(DeviceUploader * uploader, Uploader());
  return uploader->UploadRuns(std::move(chunk), runs, device);
}

absl::Status DeviceStaging::OrderUploadsAfter(const DeviceWait& wait) {
  {
    absl::MutexLock lock(&mu_);
    upload_wait_ = wait;
  }
  if (wait.empty()) return absl::OkStatus();
  DCP_ASSIGN_OR_RETURN(DeviceUploader * uploader, Uploader());
  return uploader->WaitFor(wait);
}

DeviceWait DeviceStaging::UploadWait() {
  absl::MutexLock lock(&mu_);
  return upload_wait_;
}

absl::Status DeviceStaging::Flush() {
  absl::MutexLock lock(&mu_);
  upload_wait_ = DeviceWait{};
  if (uploader_ == nullptr) return absl::OkStatus();
  absl::Status status = uploader_->Flush();
  // A failed copy is sticky in the uploader; the next load starts clean.
  if (!status.ok()) uploader_.reset();
  return status;
}

}  // namespace dcp
