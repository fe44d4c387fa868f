#include "engine/async_save.h"

#include <memory>
#include <utility>

#include "absl/status/status.h"

namespace dcp {

AsyncCheckpointer::AsyncCheckpointer() = default;
AsyncCheckpointer::~AsyncCheckpointer() = default;  // Pools drain, then join.

AsyncSaveResponse AsyncCheckpointer::AsyncSave(
    const StateDict& state_dict, const AsyncSaveOptions& options) {
  Promise<void> staged_promise;
  Promise<Metadata> upload_promise;
  AsyncSaveResponse response{staged_promise.future(), upload_promise.future()};
  if (options.async_checkpointer_type == AsyncCheckpointerType::kProcess) {
    const absl::Status unimplemented = absl::UnimplementedError(
        "AsyncSave with AsyncCheckpointerType::kProcess is not implemented; "
        "use kThread");
    staged_promise.Set(unimplemented);
    upload_promise.Set(unimplemented);
    return response;
  }

  std::shared_ptr<AsyncStager> owned_stager;
  AsyncStager* stager = options.async_stager;
  if (stager == nullptr) {
    owned_stager =
        std::make_shared<DefaultStager>(StagingOptions::AsyncSaveDefault());
    stager = owned_stager.get();
  }
  // The stager's copies wait for the caller's device work; the upload
  // writes host memory and needs no wait.
  Future<StateDict> staged =
      stager->Stage(state_dict, options.save.device_wait);

  // Staging is complete when the staged dict is ready and, for non-blocking
  // device copies, when the copies have landed.
  staging_waiter_.Schedule([staged, stager, staged_promise] {
    const absl::StatusOr<StateDict>& result = staged.Wait();
    absl::Status status = result.status();
    if (status.ok() && stager->should_synchronize_after_execute()) {
      status = stager->SynchronizeStaging();
    }
    staged_promise.Set(status);
  });

  SaveOptions save = options.save;
  save.device_wait = DeviceWait{};
  uploader_.Schedule([staged, staged_done = response.staging_completion,
                      upload_promise, save, owned_stager] {
    absl::Status staging = staged_done.Wait();
    if (!staging.ok()) {
      upload_promise.Set(staging);
    } else {
      upload_promise.Set(Save(*staged.Wait(), save));
    }
    if (owned_stager != nullptr) owned_stager->Close();
  });
  return response;
}

AsyncSaveResponse AsyncSave(const StateDict& state_dict,
                            const AsyncSaveOptions& options) {
  // Destroyed at exit, which waits for the uploads still queued.
  static AsyncCheckpointer checkpointer;
  return checkpointer.AsyncSave(state_dict, options);
}

}  // namespace dcp
