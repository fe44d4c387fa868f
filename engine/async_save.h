// AsyncSave: the seed's async_save. Stages the state dict into host memory
// (the training loop may change its tensors once staging_completion is
// ready), then writes and commits the checkpoint in the background
// (upload_completion).
//
// Ordering: an AsyncCheckpointer uploads one checkpoint at a time, in the
// order AsyncSave was called. A second AsyncSave while the first is still
// uploading stages at once (its staging_completion does not wait for the
// first upload) and its upload queues behind the first. Each staged copy
// lives until its upload ends, so two saves in flight hold two copies.
//
// Destruction: ~AsyncCheckpointer waits for every queued upload to finish
// (their futures resolve); it never abandons a half-written checkpoint.
//
// The process-wide checkpointer (the free AsyncSave) is never destroyed, so
// no upload runs during static destruction. Its drain point is
// WaitForPendingAsyncSaves(): call it before the objects that
// AsyncSaveOptions points at go away, and before the process exits. At
// exit (std::exit, or a return from main) it shuts down as
// ShutdownAsyncCheckpointer() does, from a std::atexit handler registered
// by its first use: uploads that have not started fail with kCancelled and
// never run (their options may point at objects the exit is destroying),
// and the exit waits for the one already running, if any.
#ifndef DCP_ENGINE_ASYNC_SAVE_H_
#define DCP_ENGINE_ASYNC_SAVE_H_

#include <atomic>
#include <deque>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "core/executor.h"
#include "core/future.h"
#include "core/state_dict.h"
#include "engine/checkpoint.h"
#include "planner/metadata.h"
#include "staging/stager.h"

namespace dcp {

// The seed's AsyncCheckpointerType. kProcess (a persistent writer process)
// is not implemented yet: AsyncSave returns kUnimplemented for it.
enum class AsyncCheckpointerType { kThread, kProcess };

// The seed's AsyncSaveResponse.
struct AsyncSaveResponse {
  // Ready when the tensors of the state dict may change: every byte is in
  // host memory, or (copy-on-write staging) snapshot so that later writes
  // wait for their bytes' copy. An error if staging failed (then
  // upload_completion fails too, on every rank of the save). Its callbacks
  // run on a thread of this save's own, which nothing else waits for: one
  // may save or load on the group (that waits for the uploads queued
  // before it).
  Future<void> staging_completion;
  // Ready with the committed metadata, or the save's error.
  Future<Metadata> upload_completion;
};

struct AsyncSaveOptions {
  // Where and how to save (checkpoint_id, storage_writer, planner, ...).
  // Pointers in it must stay valid until upload_completion is ready.
  SaveOptions save;
  AsyncCheckpointerType async_checkpointer_type =
      AsyncCheckpointerType::kThread;
  // Not owned; must outlive upload_completion. Default: a DefaultStager with
  // StagingOptions::AsyncSaveDefault(), closed after the upload.
  AsyncStager* async_stager = nullptr;
};

class AsyncCheckpointer {
 public:
  AsyncCheckpointer();
  ~AsyncCheckpointer();
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  // Thread-safe. The caller keeps the tensors of `state_dict` unchanged
  // until staging_completion is ready; with a stager that snapshots them
  // copy-on-write (StagingOptions::copy_on_write), also allocated until
  // upload_completion is. After Shutdown both futures fail at once with
  // kCancelled and nothing is staged.
  AsyncSaveResponse AsyncSave(const StateDict& state_dict,
                              const AsyncSaveOptions& options);

  // Blocks until every upload queued before the call has finished (its
  // upload_completion is ready). Thread-safe. From an upload's own
  // callbacks (they run on the upload thread) it returns at once: the
  // thread cannot wait for itself.
  void WaitForPending();

  // Fails every upload that has not started with kCancelled at once (it
  // never runs, and its staged copy is released) and every later
  // AsyncSave, then waits as WaitForPending does for the upload already
  // running. Thread-safe; idempotent.
  void Shutdown();

 private:
  struct QueuedUpload {
    Promise<Metadata> promise;
    Task run;
    // A copy-on-write stage's dict (invalid for other stages): the stage
    // reads the caller's tensors until it is ready (it always becomes
    // ready), so Shutdown waits for it when it cancels the upload.
    Future<StateDict> filling;
    // The upload's turn on its group, ended by the upload or by Cancel.
    std::shared_ptr<internal::GroupTurn> turn;
  };
  bool shut_down() const;
  // Fails a queued upload that will not run with kCancelled, once its stage
  // no longer reads the caller's tensors.
  static void Cancel(QueuedUpload& upload);
  // Runs the oldest queued upload, unless Shutdown took it.
  void RunNextUpload();
  // Runs `wait` (which waits for one stage to land and sets its
  // staging_completion) on a thread of its own, which the destructor waits
  // for; on the calling thread when no thread can be started.
  void StartStagingWaiter(Task wait);

  // The staging waiter threads still running; shared with them, so the
  // last one's unlock never touches a destroyed checkpointer.
  struct StagingWaiters {
    absl::Mutex mu;
    int running ABSL_GUARDED_BY(mu) = 0;
    // Held around a custom stager's SynchronizeStaging.
    absl::Mutex synchronize_mu;
  };

  mutable absl::Mutex mu_;
  std::deque<QueuedUpload> queued_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<std::thread::id> upload_thread_{};
  const std::shared_ptr<StagingWaiters> staging_waiters_ =
      std::make_shared<StagingWaiters>();
  // Declared last, destroyed first: its tasks use the members above.
  // Uploads, one at a time, in call order.
  ThreadPool uploader_{1};
};

// AsyncSave on the process-wide AsyncCheckpointer (see the file comment for
// its lifetime and what happens at exit).
AsyncSaveResponse AsyncSave(const StateDict& state_dict,
                            const AsyncSaveOptions& options);

// WaitForPending on the process-wide checkpointer: the drain point of the
// free AsyncSave.
void WaitForPendingAsyncSaves();

// Shutdown of the process-wide checkpointer (done at exit by itself): later
// free AsyncSave calls fail with kCancelled.
void ShutdownAsyncCheckpointer();

namespace internal {

// Tests only: while `refuse` is set, the wait for a save's staging finds no
// thread to run on (as under a thread limit) and runs in AsyncSave's call.
void RefuseStagingWaiterThreadsForTesting(bool refuse);

}  // namespace internal
}  // namespace dcp

#endif  // DCP_ENGINE_ASYNC_SAVE_H_
