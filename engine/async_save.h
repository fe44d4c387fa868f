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
#ifndef DCP_ENGINE_ASYNC_SAVE_H_
#define DCP_ENGINE_ASYNC_SAVE_H_

#include <memory>

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
  // Ready when every byte of the state dict is in host memory; an error if
  // staging failed (then upload_completion carries the same error).
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
  // until staging_completion is ready.
  AsyncSaveResponse AsyncSave(const StateDict& state_dict,
                              const AsyncSaveOptions& options);

 private:
  // Waits for staging (and non-blocking copies) to land.
  ThreadPool staging_waiter_{1};
  // Uploads, one at a time, in call order.
  ThreadPool uploader_{1};
};

// AsyncSave on a process-wide AsyncCheckpointer (which waits for pending
// uploads at process exit).
AsyncSaveResponse AsyncSave(const StateDict& state_dict,
                            const AsyncSaveOptions& options);

}  // namespace dcp

#endif  // DCP_ENGINE_ASYNC_SAVE_H_
