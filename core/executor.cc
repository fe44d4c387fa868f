#include "core/executor.h"

namespace dcp {

Executor& InlineExecutorInstance() {
  static InlineExecutor* const executor = new InlineExecutor;
  return *executor;
}

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads < 1) num_threads = 1;
  try {
    workers_.reserve(num_threads);
    for (int i = 0; i < num_threads; ++i) {
      workers_.emplace_back([this] { WorkerLoop(); });
    }
  } catch (...) {
    // The threads already running are joined before the exception leaves
    // (a joinable std::thread destroyed would terminate the process).
    Stop();
    throw;
  }
}

ThreadPool::~ThreadPool() { Stop(); }

void ThreadPool::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& worker : workers_) worker.join();
  workers_.clear();
}

void ThreadPool::Schedule(Task task) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
}

void ThreadPool::WorkerLoop() {
  while (true) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](ThreadPool* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
            return self->stopping_ || !self->queue_.empty();
          },
          this));
      if (queue_.empty()) return;  // stopping_ and drained.
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    std::move(task)();
  }
}

}  // namespace dcp
