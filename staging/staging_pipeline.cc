#include "staging/staging_pipeline.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"
#include "cuda/host_copy.h"
#include "staging/internal/copy_streams.h"

namespace dcp {
namespace {

std::string DescribeItem(const PipelineItem& item, size_t index) {
  return absl::StrFormat(
      "staging item %d%s (destination %d, %s %s %s)", index,
      item.name.empty() ? "" : absl::StrCat(" \"", item.name, "\""),
      item.destination, item.source.device().ToString(),
      DTypeName(item.source.dtype()), ShapeToString(item.source.sizes()));
}

}  // namespace

StagingPipeline::StagingPipeline(DeviceRuntime* runtime, HostBufferPool* pool,
                                 StagingPipelineOptions options)
    : runtime_(runtime),
      pool_(pool),
      options_(options),
      streams_(std::make_unique<internal_staging::CopyStreams>(
          runtime, options.num_streams)) {}

StagingPipeline::~StagingPipeline() = default;

void StagingPipeline::Produce(absl::Span<const PipelineItem> items) {
  absl::Status error;
  const size_t chunk_bytes = pool_->chunk_bytes();
  for (size_t i = 0; i < items.size() && error.ok(); ++i) {
    const TensorView& src = items[i].source;
    const size_t total = src.nbytes();
    const bool on_device = src.device().is_cuda();
    const int device = on_device ? src.device().index : 0;
    size_t offset = 0;
    do {
      {
        absl::MutexLock lock(&mu_);
        if (stop_) {
          error = absl::CancelledError("stopped");
          break;
        }
      }
      InFlight piece;
      piece.item = i;
      piece.offset = offset;
      piece.length = std::min(chunk_bytes, total - offset);
      piece.last = offset + piece.length == total;
      piece.device = device;
      if (piece.length > 0) {
        absl::StatusOr<PoolChunk> chunk = pool_->Acquire();
        if (!chunk.ok()) {
          error = Annotate(chunk.status(), DescribeItem(items[i], i));
          break;
        }
        piece.chunk = *std::move(chunk);
        const auto* from = static_cast<const std::byte*>(src.data()) + offset;
        if (!on_device) {
          // Host memory is copied here, not on a device's stream, which
          // would create a CUDA context on device 0 for a job that may not
          // use that device. The piece needs no event: its bytes are there.
          BulkHostCopy(piece.chunk.data(), from, piece.length);
        } else {
          absl::StatusOr<DeviceStream*> stream = streams_->Next(device);
          absl::StatusOr<OwnedEvent> event =
              stream.ok() ? streams_->TakeEvent(device) : stream.status();
          if (!event.ok()) {
            error = Annotate(event.status(), DescribeItem(items[i], i));
            break;
          }
          piece.event = *std::move(event);
          absl::Status copied =
              runtime_->CopyAsync(piece.chunk.data(), from, piece.length,
                                  CopyKind::kDeviceToHost, *stream);
          if (copied.ok()) {
            copied = runtime_->RecordEvent(piece.event.get(), *stream);
            if (!copied.ok()) {
              // The copy is enqueued without an event to wait for: the
              // chunk goes back to the pool only once the stream has run
              // it (its error, if any, is the one reported).
              runtime_->SynchronizeStream(*stream).IgnoreError();
            }
          }
          if (!copied.ok()) {
            error = Annotate(
                copied, absl::StrFormat("%s offset %d",
                                        DescribeItem(items[i], i), offset));
            break;
          }
        }
      }
      offset += piece.length;
      absl::MutexLock lock(&mu_);
      queue_.push_back(std::move(piece));
    } while (offset < total);
  }
  absl::MutexLock lock(&mu_);
  producer_done_ = true;
  if (!error.ok() && !absl::IsCancelled(error)) producer_error_ = error;
}

absl::Status StagingPipeline::Run(absl::Span<const PipelineItem> items,
                                  PieceConsumer consumer,
                                  const DeviceWait& wait) {
  stats_ = Stats{};
  for (size_t i = 0; i < items.size() && !wait.empty(); ++i) {
    const Device device = items[i].source.device();
    if (device.is_cuda() && device.index != wait.device) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s is on %s, but the caller's stream to wait for "
          "(SaveOptions::device_wait) is on cuda:%d",
          DescribeItem(items[i], i), device.ToString(), wait.device));
    }
  }
  DCP_RETURN_IF_ERROR(
      Annotate(streams_->WaitFor(wait), "waiting for the caller's stream"));
  for (size_t i = 0; i < items.size(); ++i) {
    const TensorView& src = items[i].source;
    if (!src.is_contiguous()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s is not contiguous; make it contiguous before staging",
          DescribeItem(items[i], i)));
    }
    if (src.device().is_cuda() &&
        (src.device().index < 0 ||
         src.device().index >= runtime_->DeviceCount())) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: the %s runtime has %d device(s)", DescribeItem(items[i], i),
          runtime_->name(), runtime_->DeviceCount()));
    }
    if (src.nbytes() > 0 && src.data() == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s has no data", DescribeItem(items[i], i)));
    }
  }
  {
    absl::MutexLock lock(&mu_);
    queue_.clear();
    producer_done_ = false;
    stop_ = false;
    producer_error_ = absl::OkStatus();
  }
  std::thread producer([this, items] { Produce(items); });

  absl::Status first_error;
  while (true) {
    InFlight piece;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || producer_done_;
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) break;  // Producer finished and all consumed.
      piece = std::move(queue_.front());
      queue_.pop_front();
    }
    absl::Status copied = piece.event.get() == nullptr
                              ? absl::OkStatus()
                              : runtime_->SynchronizeEvent(piece.event.get());
    streams_->ReturnEvent(piece.device, std::move(piece.event));
    if (!first_error.ok()) continue;  // Draining after an error.
    absl::Status result;
    if (!copied.ok()) {
      result = Annotate(
          copied, absl::StrFormat("copy of %s offset %d",
                                  DescribeItem(items[piece.item], piece.item),
                                  piece.offset));
    } else {
      StagedPiece staged;
      staged.item = piece.item;
      staged.destination = items[piece.item].destination;
      staged.offset = piece.offset;
      staged.length = piece.length;
      staged.last = piece.last;
      staged.chunk = std::move(piece.chunk);
      ++stats_.pieces;
      stats_.bytes += staged.length;
      result = consumer(std::move(staged));
    }
    if (!result.ok()) {
      first_error = std::move(result);
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
  }
  producer.join();
  if (!first_error.ok()) return first_error;
  absl::MutexLock lock(&mu_);
  return producer_error_;
}

}  // namespace dcp
