// Executor: where continuations and background work run. A type-erased task
// sink injected into components, so tests can run everything inline and
// deterministically while production uses a thread pool.
#ifndef DCP_CORE_EXECUTOR_H_
#define DCP_CORE_EXECUTOR_H_

#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace dcp {

using Task = absl::AnyInvocable<void() &&>;

class Executor {
 public:
  virtual ~Executor() = default;
  // Runs `task` at some point; never drops it. Thread-safe.
  virtual void Schedule(Task task) = 0;
};

// Runs each task immediately on the calling thread.
class InlineExecutor final : public Executor {
 public:
  void Schedule(Task task) override { std::move(task)(); }
};

// The process-wide inline executor.
Executor& InlineExecutorInstance();

// A fixed set of worker threads draining one FIFO queue. The destructor runs
// every task already scheduled, then joins the workers.
class ThreadPool final : public Executor {
 public:
  // Starts num_threads workers (at least one). When a thread cannot be
  // started, the ones already running are stopped and the std::system_error
  // (or std::bad_alloc) is rethrown.
  explicit ThreadPool(int num_threads);
  ~ThreadPool() override;
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Schedule(Task task) override;
  int num_threads() const { return static_cast<int>(workers_.size()); }

 private:
  void WorkerLoop();
  // Lets the workers drain the queue, joins them.
  void Stop();

  absl::Mutex mu_;
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace dcp

#endif  // DCP_CORE_EXECUTOR_H_
