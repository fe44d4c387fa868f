// Machinery shared by the IoEngine implementations: splitting requests into
// bounded parts, joining part results into the request's future, and holding
// each fsync until the writes before it to the same file have completed.
// Implementations provide StartParts (issue the parts) and call
// CompletePart once per part.
#ifndef DCP_IO_INTERNAL_IO_ENGINE_BASE_H_
#define DCP_IO_INTERNAL_IO_ENGINE_BASE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "io/io_engine.h"

namespace dcp::internal_io {

class IoEngineBase;

// One user request being served; shared by its parts.
struct RequestState {
  IoEngineBase* engine = nullptr;
  Promise<size_t> promise;
  std::atomic<size_t> parts_left{0};
  std::atomic<size_t> transferred{0};
  absl::Mutex mu;
  absl::Status error ABSL_GUARDED_BY(mu);
};

// One bounded transfer (or an fsync) handed to an implementation.
struct Part {
  IoRequest::Op op = IoRequest::Op::kWrite;
  File* file = nullptr;
  int64_t offset = 0;
  std::byte* data = nullptr;
  size_t length = 0;
  size_t done = 0;  // Bytes transferred so far (implementations resubmit).
  // io_uring: the transfer in flight carries RWF_DONTCACHE
  // (File::uncached).
  bool uncached = false;
  std::shared_ptr<RequestState> request;
};

// Records the result of a part (bytes transferred, or the error) and
// fulfils the request's future after its last part. Any thread.
void CompletePart(std::unique_ptr<Part> part, absl::StatusOr<size_t> result);

// A message for a failed part: "pwrite PATH offset=O length=L".
std::string PartContext(const Part& part);

// Performs `part` synchronously with the File's own methods (which loop over
// EINTR and short transfers). Used by the POSIX engine and for files
// without a native descriptor.
absl::StatusOr<size_t> RunPartWithFile(const Part& part);

class IoEngineBase : public IoEngine {
 public:
  explicit IoEngineBase(const IoEngineOptions& options)
      : max_transfer_(options.max_transfer == 0 ? size_t{1} << 20
                                                : options.max_transfer),
        max_buffered_read_(options.max_buffered_read == 0
                               ? max_transfer_
                               : options.max_buffered_read) {}

  std::vector<Future<size_t>> Submit(absl::Span<const IoRequest> batch) final;

  // Called by CompletePart once a request's future is fulfilled.
  void RequestDone();

 protected:
  // Blocks until every submitted request has completed. Implementations call
  // it first in their destructor, before stopping their threads.
  void WaitIdle();

  // Issues every part; each must eventually reach CompletePart exactly once.
  // Parts are heap objects owned by the implementation from here on.
  virtual void StartParts(std::vector<std::unique_ptr<Part>> parts) = 0;

 private:
  const size_t max_transfer_;
  const size_t max_buffered_read_;
  absl::Mutex mu_;
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // Writes not yet known complete, per file, for the fsyncs and writebacks
  // that must follow them. Completed ones are pruned once the list has
  // doubled since the last pruning (at least kFirstPrune entries), so a
  // submit costs O(1) amortized however many writes are outstanding: a
  // scan on every submit made saves of 100,000 small tensors quadratic.
  struct PendingWrites {
    static constexpr size_t kFirstPrune = 64;
    std::vector<Future<size_t>> writes;
    size_t prune_at = kFirstPrune;
  };
  absl::flat_hash_map<File*, PendingWrites> pending_writes_
      ABSL_GUARDED_BY(mu_);
  // The map drops files whose writes have all completed once it holds this
  // many files; then twice what is left (at least 256), so many open files
  // do not bring the per-submit scan back.
  size_t prune_files_at_ ABSL_GUARDED_BY(mu_) = 256;
};

}  // namespace dcp::internal_io

#endif  // DCP_IO_INTERNAL_IO_ENGINE_BASE_H_
