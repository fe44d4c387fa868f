// Internal to io/: what the storage writers and readers use to run work on
// several threads, keep the first error, and hold O_DIRECT-ready memory.
#ifndef DCP_IO_INTERNAL_PARALLEL_WORK_H_
#define DCP_IO_INTERNAL_PARALLEL_WORK_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "core/executor.h"

namespace dcp::internal_io {

// The alignment of O_DIRECT transfers (file offset, length and memory) that
// every file system dcp writes accepts: the largest logical block size in
// use. Data files place tensors on multiples of it (docs/FORMAT.md).
inline constexpr int64_t kDirectIoAlignment = 4096;

inline constexpr int64_t AlignUp(int64_t value, int64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}
inline constexpr int64_t AlignDown(int64_t value, int64_t alignment) {
  return value / alignment * alignment;
}

// A kDirectIoAlignment aligned heap buffer (ready for O_DIRECT reads and
// writes).
struct AlignedBuffer {
  explicit AlignedBuffer(size_t size_in)
      : size(static_cast<int64_t>(size_in)),
        data(static_cast<std::byte*>(
            ::operator new[](std::max<size_t>(size_in, 1),
                             std::align_val_t{kDirectIoAlignment}))) {}
  ~AlignedBuffer() {
    ::operator delete[](data, std::align_val_t{kDirectIoAlignment});
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  int64_t size;
  std::byte* data;
};

// The pool of a storage writer or reader, made with `threads` threads on
// the first call and kept in `pool` (so calls and read windows reuse its
// threads instead of starting new ones). Not thread-safe: call it from the
// thread that drives the storage.
inline Executor& PoolOf(std::unique_ptr<ThreadPool>& pool, int threads) {
  if (pool == nullptr)
    pool = std::make_unique<ThreadPool>(std::max(1, threads));
  return *pool;
}

// Runs fn(0) on the calling thread and fn(1) .. fn(count - 1) as tasks of
// `executor`, and returns once every call that started has returned. A task
// the executor has not started by the time fn(0) returns is skipped, so fn
// must be a worker loop that takes its work from shared state (an atomic
// index) and leaves nothing undone when fewer workers run. Never waits for
// a free executor thread: calling it from a task of the same executor (even
// a one-thread pool) cannot deadlock.
template <typename Fn>
void RunWorkers(Executor& executor, int count, Fn fn) {
  struct Gate {
    absl::Mutex mu;
    int active ABSL_GUARDED_BY(mu) = 0;
    bool closed ABSL_GUARDED_BY(mu) = false;
  };
  auto gate = std::make_shared<Gate>();
  for (int i = 1; i < count; ++i) {
    executor.Schedule([gate, &fn, i] {
      {
        absl::MutexLock lock(&gate->mu);
        if (gate->closed) return;
        ++gate->active;
      }
      fn(i);
      absl::MutexLock lock(&gate->mu);
      --gate->active;
    });
  }
  fn(0);
  absl::MutexLock lock(&gate->mu);
  gate->closed = true;
  gate->mu.Await(absl::Condition(
      +[](int* active) { return *active == 0; }, &gate->active));
}

// The first error of several workers (sticky). Thread-safe. Code on one
// thread keeps its first error with absl::Status::Update instead.
class FirstError {
 public:
  void Update(absl::Status status) {
    if (status.ok()) return;
    absl::MutexLock lock(&mu_);
    status_.Update(std::move(status));
    failed_.store(true, std::memory_order_relaxed);
  }
  bool failed() const { return failed_.load(std::memory_order_relaxed); }
  absl::Status status() {
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  absl::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> failed_{false};
};

}  // namespace dcp::internal_io

#endif  // DCP_IO_INTERNAL_PARALLEL_WORK_H_
