// A small Promise/Future over absl::StatusOr<T> (or absl::Status for void),
// with done-callbacks, Then-continuations on an injected Executor, blocking
// Wait(), and WhenAll. std::future has no continuations and makes threads
// park on get(); this one lets the I/O, staging and commit steps chain.
//
// Thread safety: all members are thread-safe. A callback registered on a
// ready future runs immediately on the registering thread; otherwise it runs
// on the thread that fulfils the promise. Fulfilling twice is ignored (the
// first result wins), so racing error paths cannot crash.
//
// Broken promises: copies of a Promise share one promise. When the last copy
// is destroyed before the future was fulfilled (a task dropped by its
// executor, an error path that forgot to Set), the future resolves with
// kCancelled "promise destroyed without a value", so a Wait() never waits
// for a value that nobody can give. Futures do not keep a promise alive.
#ifndef DCP_CORE_FUTURE_H_
#define DCP_CORE_FUTURE_H_

#include <atomic>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/executor.h"

namespace dcp {

// absl::Status for void, absl::StatusOr<T> otherwise.
template <typename T>
using ResultOf =
    std::conditional_t<std::is_void_v<T>, absl::Status, absl::StatusOr<T>>;

namespace internal_future {

template <typename T>
class SharedState {
 public:
  using Result = ResultOf<T>;
  using Callback = absl::AnyInvocable<void(const Result&) &&>;

  bool SetResult(Result result) {
    std::vector<Callback> callbacks;
    {
      absl::MutexLock lock(&mu_);
      if (result_.has_value()) return false;
      result_.emplace(std::move(result));
      callbacks.swap(callbacks_);
    }
    for (Callback& cb : callbacks) std::move(cb)(*result_);
    return true;
  }

  void AddCallback(Callback cb) {
    {
      absl::MutexLock lock(&mu_);
      if (!result_.has_value()) {
        callbacks_.push_back(std::move(cb));
        return;
      }
    }
    std::move(cb)(*result_);
  }

  bool ready() const {
    absl::MutexLock lock(&mu_);
    return result_.has_value();
  }

  const Result& Wait() const {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](const std::optional<Result>* r) { return r->has_value(); },
        &result_));
    return *result_;
  }

  bool WaitFor(absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(
        absl::Condition(
            +[](const std::optional<Result>* r) { return r->has_value(); },
            &result_),
        timeout);
  }

 private:
  mutable absl::Mutex mu_;
  std::optional<Result> result_ ABSL_GUARDED_BY(mu_);
  std::vector<Callback> callbacks_ ABSL_GUARDED_BY(mu_);
};

// Shared by the copies of one Promise: breaks the promise when the last
// copy goes (see the file comment).
template <typename T>
class PromiseLink {
 public:
  PromiseLink() : state(std::make_shared<SharedState<T>>()) {}
  ~PromiseLink() {
    state->SetResult(absl::CancelledError("promise destroyed without a value"));
  }
  PromiseLink(const PromiseLink&) = delete;
  PromiseLink& operator=(const PromiseLink&) = delete;

  const std::shared_ptr<SharedState<T>> state;
};

}  // namespace internal_future

template <typename T>
class Future;

// Copyable: copies share one promise, which breaks (the future resolves
// with kCancelled) if the last copy is destroyed without a Set.
template <typename T>
class Promise {
 public:
  using Result = ResultOf<T>;

  Promise() : link_(std::make_shared<internal_future::PromiseLink<T>>()) {}

  Future<T> future() const { return Future<T>(link_->state); }

  // Fulfils the future; returns false if it was already fulfilled.
  bool Set(Result result) const {
    return link_->state->SetResult(std::move(result));
  }

  bool ready() const { return link_->state->ready(); }

 private:
  std::shared_ptr<internal_future::PromiseLink<T>> link_;
};

template <typename T>
class Future {
 public:
  using Result = ResultOf<T>;

  // An invalid future; only assignment and valid() may be used.
  Future() = default;

  // A future that is already ready with `result`.
  static Future Ready(Result result) {
    Promise<T> promise;
    promise.Set(std::move(result));
    return promise.future();
  }

  bool valid() const { return state_ != nullptr; }
  bool ready() const { return state_->ready(); }

  // Blocks until ready; returns the result (valid while the future lives).
  const Result& Wait() const { return state_->Wait(); }

  // Blocks up to `timeout`; true when ready.
  bool WaitFor(absl::Duration timeout) const {
    return state_->WaitFor(timeout);
  }

  // Runs `cb(result)` once ready (see the file comment for which thread).
  void OnReady(absl::AnyInvocable<void(const Result&) &&> cb) const {
    state_->AddCallback(std::move(cb));
  }

  // Returns a future of fn(result) run on `executor` once this is ready.
  // `fn` returns ResultOf<U> (absl::Status when U is void).
  template <typename U, typename Fn>
  Future<U> Then(Executor& executor, Fn fn) const {
    Promise<U> promise;
    OnReady(
        [&executor, promise, fn = std::move(fn)](const Result& result) mutable {
          executor.Schedule([promise, fn = std::move(fn), result]() mutable {
            promise.Set(fn(result));
          });
        });
    return promise.future();
  }

 private:
  friend class Promise<T>;
  explicit Future(std::shared_ptr<internal_future::SharedState<T>> state)
      : state_(std::move(state)) {}

  std::shared_ptr<internal_future::SharedState<T>> state_;
};

// Blocks until every future is ready, failed or not, and returns their
// values in input order, or the first error in input order. For reads into
// buffers that must outlive all of them: an early return on the first
// error would free a buffer a later read still writes.
template <typename T>
absl::StatusOr<std::vector<T>> WaitAll(const std::vector<Future<T>>& futures) {
  std::vector<T> values;
  values.reserve(futures.size());
  absl::Status failed;
  for (const Future<T>& future : futures) {
    const ResultOf<T>& result = future.Wait();
    if (!result.ok()) {
      if (failed.ok()) failed = result.status();
      continue;
    }
    values.push_back(*result);
  }
  if (!failed.ok()) return failed;
  return values;
}

// Ready when every input is ready: OK if all succeeded, otherwise the first
// error in input order. An empty input is ready at once.
template <typename T>
Future<void> WhenAll(const std::vector<Future<T>>& futures) {
  if (futures.empty()) return Future<void>::Ready(absl::OkStatus());
  struct Join {
    Promise<void> promise;
    std::atomic<size_t> remaining;
    std::vector<absl::Status> statuses;
  };
  auto join = std::make_shared<Join>();
  join->remaining = futures.size();
  join->statuses.resize(futures.size());
  for (size_t i = 0; i < futures.size(); ++i) {
    futures[i].OnReady([join, i](const ResultOf<T>& result) {
      if constexpr (std::is_void_v<T>) {
        join->statuses[i] = result;
      } else {
        join->statuses[i] = result.status();
      }
      if (join->remaining.fetch_sub(1) == 1) {
        absl::Status first;
        for (const absl::Status& s : join->statuses) {
          if (!s.ok()) {
            first = s;
            break;
          }
        }
        join->promise.Set(first);
      }
    });
  }
  return join->promise.future();
}

}  // namespace dcp

#endif  // DCP_CORE_FUTURE_H_
