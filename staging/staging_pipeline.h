// StagingPipeline: streams tensor bytes through a bounded HostBufferPool to a
// consumer (the writer), overlapping the device-to-host copy of piece k+1
// with the consumer's work on piece k.
//
// Each item is cut into pieces of at most pool->chunk_bytes(). A producer
// thread leases a chunk per piece (blocking while the pool is exhausted: that
// is what bounds memory), enqueues the copy on one of `num_streams` streams
// of the item's device (round robin), and records an event after it (a host
// item's piece it copies itself, so a job without device tensors on device
// 0 never touches that device). The
// calling thread waits for each piece's event in order and hands the piece to
// the consumer. The consumer owns the chunk lease inside the piece: it may
// drop it on return (synchronous write) or keep it until its asynchronous
// write completes (io_uring: use piece.chunk.index() as the fixed-buffer
// index); either way the chunk returns to the pool when the lease dies.
// Memory never exceeds the pool, however large the items are.
//
// Errors are sticky (first one wins): a failed copy or a consumer error stops
// new copies, the remaining pieces are dropped without reaching the
// consumer, and Run returns the error annotated with the item, destination
// and offset. The consumer must eventually release every lease it keeps, or
// the producer blocks forever on an exhausted pool.
//
// Thread safety: one Run at a time per pipeline. The pool may be shared with
// other users; the runtime and pool must outlive the pipeline.
#ifndef DCP_STAGING_STAGING_PIPELINE_H_
#define DCP_STAGING_STAGING_PIPELINE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "core/tensor.h"
#include "cuda/device_runtime.h"
#include "staging/host_buffer_pool.h"

namespace dcp {

namespace internal_staging {
class CopyStreams;
}  // namespace internal_staging

struct StagingPipelineOptions {
  // Copy streams per device; pieces go round robin. Copies are queued ahead
  // on each stream, so one stream already keeps a copy engine busy with
  // large pieces; a second hides the per-copy latency of small pieces
  // (bench/staging_bench sweeps 1-4 streams).
  int num_streams = 2;
};

// One contiguous range of tensor memory to stage.
struct PipelineItem {
  // Contiguous; host memory (copied by the producer thread with
  // BulkHostCopy, no device stream) or CUDA memory of a device the runtime
  // has. Must stay valid and unchanged until
  // Run returns.
  TensorView source;
  // The caller's id for where the bytes go (a WriteItem index, a file
  // offset); handed back with each piece.
  uint64_t destination = 0;
  // What the item is, for error messages (a tensor's name); may be empty.
  std::string name;
};

// A staged piece: bytes [offset, offset + length) of item `item`.
struct StagedPiece {
  size_t item = 0;
  uint64_t destination = 0;
  size_t offset = 0;
  size_t length = 0;
  bool last = false;  // Last piece of its item.
  // The lease holding the bytes; invalid for an empty item (length 0).
  PoolChunk chunk;

  absl::Span<const std::byte> bytes() const { return {chunk.data(), length}; }
};

// Called on Run's thread, once per piece, in item and offset order. A non-OK
// result stops the pipeline and becomes Run's result.
using PieceConsumer = absl::AnyInvocable<absl::Status(StagedPiece piece)>;

class StagingPipeline {
 public:
  struct Stats {
    size_t pieces = 0;  // Pieces handed to the consumer.
    size_t bytes = 0;   // Bytes in those pieces.
  };

  // `runtime` and `pool` are not owned. Streams and events are created on
  // first use and reused by later Runs.
  StagingPipeline(DeviceRuntime* runtime, HostBufferPool* pool,
                  StagingPipelineOptions options = {});
  ~StagingPipeline();
  StagingPipeline(const StagingPipeline&) = delete;
  StagingPipeline& operator=(const StagingPipeline&) = delete;

  // Stages every item and feeds the consumer; returns when every piece was
  // consumed or dropped after an error. kInvalidArgument (before any copy)
  // for a non-contiguous item or an unknown device. No copy starts, on the
  // device, before the caller's work `wait` names is done.
  absl::Status Run(absl::Span<const PipelineItem> items, PieceConsumer consumer,
                   const DeviceWait& wait = {});

  // Counters of the last Run.
  Stats last_stats() const { return stats_; }

 private:
  // A piece whose copy is enqueued (or an empty item's marker).
  struct InFlight {
    size_t item = 0;
    size_t offset = 0;
    size_t length = 0;
    bool last = false;
    int device = 0;
    PoolChunk chunk;
    OwnedEvent event;  // Empty for a zero-length piece.
  };

  void Produce(absl::Span<const PipelineItem> items);

  DeviceRuntime* const runtime_;
  HostBufferPool* const pool_;
  const StagingPipelineOptions options_;

  std::unique_ptr<internal_staging::CopyStreams> streams_;

  // The hand-off between producer and consumer.
  absl::Mutex mu_;
  std::deque<InFlight> queue_ ABSL_GUARDED_BY(mu_);
  bool producer_done_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status producer_error_ ABSL_GUARDED_BY(mu_);

  Stats stats_;
};

}  // namespace dcp

#endif  // DCP_STAGING_STAGING_PIPELINE_H_
