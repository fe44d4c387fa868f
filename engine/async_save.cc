#include "engine/async_save.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <memory>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/status/status.h"

namespace dcp {
namespace {

std::atomic<bool> refuse_waiter_threads{false};

absl::Status ShutDownError() {
  return absl::CancelledError(
      "AsyncSave: the AsyncCheckpointer was shut down (the process-wide one "
      "at exit) before this save's work ran; nothing was written");
}

}  // namespace

AsyncCheckpointer::AsyncCheckpointer() = default;

AsyncCheckpointer::~AsyncCheckpointer() {
  // Every stage lands (as before the queued uploads can run), then the
  // upload pool drains and joins.
  absl::MutexLock lock(&staging_waiters_->mu);
  staging_waiters_->mu.Await(absl::Condition(
      +[](int* running) { return *running == 0; }, &staging_waiters_->running));
}

void AsyncCheckpointer::StartStagingWaiter(Task wait) {
  std::shared_ptr<StagingWaiters> waiters = staging_waiters_;
  {
    absl::MutexLock lock(&waiters->mu);
    ++waiters->running;
  }
  auto task = std::make_shared<Task>(std::move(wait));
  try {
    if (refuse_waiter_threads.load(std::memory_order_relaxed)) {
      throw std::system_error(EAGAIN, std::generic_category(),
                              "staging waiter threads refused (a test)");
    }
    std::thread([task, waiters] {
      std::move (*task)();
      *task = nullptr;  // What it holds goes before the count drops.
      absl::MutexLock lock(&waiters->mu);
      --waiters->running;
    }).detach();
  } catch (const std::system_error&) {
    // No thread to be had (a thread or process limit): wait here, so the
    // stage still completes and its callbacks still run.
    {
      absl::MutexLock lock(&waiters->mu);
      --waiters->running;
    }
    std::move (*task)();
  }
}

bool AsyncCheckpointer::shut_down() const {
  absl::MutexLock lock(&mu_);
  return shut_down_;
}

AsyncSaveResponse AsyncCheckpointer::AsyncSave(
    const StateDict& state_dict, const AsyncSaveOptions& options) {
  Promise<void> staged_promise;
  Promise<Metadata> upload_promise;
  AsyncSaveResponse response{staged_promise.future(), upload_promise.future()};
  if (shut_down()) {
    staged_promise.Set(ShutDownError());
    upload_promise.Set(ShutDownError());
    return response;
  }
  if (options.async_checkpointer_type == AsyncCheckpointerType::kProcess) {
    const absl::Status unimplemented = absl::UnimplementedError(
        "AsyncSave with AsyncCheckpointerType::kProcess is not implemented; "
        "use kThread");
    staged_promise.Set(unimplemented);
    upload_promise.Set(unimplemented);
    return response;
  }

  // The upload's collectives come in this call's turn on the group, taken
  // when the upload is queued: a later Save or Load on it waits for them
  // (engine/internal/group_turns.h).
  SaveOptions save = options.save;
  if (!save.no_dist && save.process_group == nullptr) {
    save.process_group = DefaultProcessGroup();
  }
  save.device_wait = DeviceWait{};
  auto turn = std::make_shared<internal::GroupTurn>();

  std::shared_ptr<AsyncStager> owned_stager;
  AsyncStager* stager = options.async_stager;
  if (stager == nullptr) {
    owned_stager =
        std::make_shared<DefaultStager>(StagingOptions::AsyncSaveDefault());
    stager = owned_stager.get();
  }
  // The stager's copies wait for the caller's device work; the upload
  // writes host memory and needs no wait.
  Promise<void> released;
  Future<StateDict> staged =
      stager->StageReleasing(state_dict, options.save.device_wait, released);

  // Staging is complete when the stager lets the tensors go (with a
  // copy-on-write snapshot, before the staged dict has filled) and, for
  // non-blocking device copies, when the copies have landed. The task
  // shares the owned stager: Shutdown may drop the upload that also holds
  // it.
  // Asked now: once Shutdown has cancelled the upload, the caller may free
  // its stager, which only a synchronization still in progress uses then.
  // A DefaultStager's `released` comes once this stage's own non-blocking
  // copies have landed: a SynchronizeStaging would also report another
  // stage's failure as this one's.
  const auto* default_stager = dynamic_cast<const DefaultStager*>(stager);
  const bool synchronize =
      default_stager == nullptr && stager->should_synchronize_after_execute();
  // On a thread of this save's own: staging_completion's callbacks run
  // there, and one that saves on the group waits for the uploads queued
  // before its save, which wait for their own stages' threads.
  // A custom stager's SynchronizeStaging is called by one thread at a time,
  // as by one thread before.
  StartStagingWaiter([this, released = released.future(), stager, owned_stager,
                      staged_promise, synchronize, waiters = staging_waiters_] {
    absl::Status status = released.Wait();
    if (status.ok() && synchronize) {
      absl::MutexLock lock(&waiters->synchronize_mu);
      status = shut_down() ? ShutDownError() : stager->SynchronizeStaging();
    }
    staged_promise.Set(status);
  });

  const bool copy_on_write =
      default_stager != nullptr && default_stager->options().copy_on_write;
  QueuedUpload queued{
      upload_promise,
      [staged, staged_done = response.staging_completion, upload_promise, save,
       owned_stager, turn] {
        absl::Status staging = staged_done.Wait();
        const absl::StatusOr<StateDict>& filled = staged.Wait();
        if (staging.ok()) staging = filled.status();
        // A failed stage still takes part in the save, so that every rank
        // fails with it rather than wait for this one.
        absl::StatusOr<Metadata> saved =
            staging.ok()
                ? internal::SaveInTurn(*filled, save, *turn)
                : absl::StatusOr<Metadata>(
                      internal::JoinSaveWithFailure(save, staging, turn.get()));
        // The callbacks run in the upload's turn: one that saves or loads
        // on the group does so here, at the same point on every rank.
        upload_promise.Set(std::move(saved));
        turn->End();
        if (owned_stager != nullptr) owned_stager->Close();
      },
      copy_on_write ? staged : Future<StateDict>(), turn};
  {
    absl::MutexLock lock(&mu_);
    // Checked again here: a Shutdown since the check above has drained a
    // queue this upload must not join. Scheduled under the lock, so the
    // uploads run in the order they were queued, before any WaitForPending
    // marker scheduled after this returns.
    if (!shut_down_) {
      *turn = internal::TakeTurn(save);
      queued_.push_back(std::move(queued));
      uploader_.Schedule([this] { RunNextUpload(); });
      return response;
    }
  }
  Cancel(queued);
  return response;
}

void AsyncCheckpointer::Cancel(QueuedUpload& upload) {
  // A copy-on-write stage reads the caller's tensors until its dict has
  // filled: the caller may free them once upload_completion is ready, so
  // that comes last.
  if (upload.filling.valid()) upload.filling.Wait().IgnoreError();
  if (upload.turn != nullptr) upload.turn->End();
  upload.promise.Set(ShutDownError());
}

void AsyncCheckpointer::RunNextUpload() {
  upload_thread_.store(std::this_thread::get_id());
  Task upload;
  {
    absl::MutexLock lock(&mu_);
    if (queued_.empty()) return;  // Shutdown took it.
    upload = std::move(queued_.front().run);
    queued_.pop_front();
  }
  std::move(upload)();
}

void AsyncCheckpointer::WaitForPending() {
  // An upload's own callbacks run on the upload thread: it cannot wait for
  // itself.
  if (upload_thread_.load() == std::this_thread::get_id()) return;
  // One upload thread, first in first out: the marker runs after every
  // upload scheduled before it.
  Promise<void> drained;
  uploader_.Schedule([drained] { drained.Set(absl::OkStatus()); });
  drained.future().Wait().IgnoreError();
}

void AsyncCheckpointer::Shutdown() {
  std::deque<QueuedUpload> cancelled;
  {
    absl::MutexLock lock(&mu_);
    shut_down_ = true;
    cancelled.swap(queued_);
  }
  for (QueuedUpload& upload : cancelled) Cancel(upload);
  cancelled.clear();  // Releases their staged copies.
  WaitForPending();
}

namespace {

// Never destroyed: ~AsyncCheckpointer would run the queued uploads during
// static destruction. At exit, Shutdown fails those not started instead.
AsyncCheckpointer& ProcessCheckpointer() {
  static AsyncCheckpointer* const checkpointer = [] {
    auto* created = new AsyncCheckpointer;
    // Not in a child of fork(2): the uploads and their threads are the
    // parent's.
    static const pid_t owner = getpid();
    std::atexit([] {
      if (getpid() == owner) ProcessCheckpointer().Shutdown();
    });
    return created;
  }();
  return *checkpointer;
}

}  // namespace

AsyncSaveResponse AsyncSave(const StateDict& state_dict,
                            const AsyncSaveOptions& options) {
  return ProcessCheckpointer().AsyncSave(state_dict, options);
}

void WaitForPendingAsyncSaves() { ProcessCheckpointer().WaitForPending(); }

void ShutdownAsyncCheckpointer() { ProcessCheckpointer().Shutdown(); }

namespace internal {

void RefuseStagingWaiterThreadsForTesting(bool refuse) {
  refuse_waiter_threads.store(refuse, std::memory_order_relaxed);
}

}  // namespace internal
}  // namespace dcp
