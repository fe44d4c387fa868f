// What the C ABI keeps around AsyncSave: the library's own
// AsyncCheckpointer, the uploads dcp_shutdown() waits for, and the exit
// gate that keeps uploads still queued when the process exits from running.
//
// Exit: the library's checkpointer is never destroyed (its threads may be
// busy when static destructors run). When static destruction of the library
// begins, Exiting() turns true; an upload that starts afterwards fails at
// once with kCancelled (its writer is an ExitGatedWriter) and the C
// callbacks of async saves are no longer called. An upload already running
// then is the caller's fault: dcp/dcp.h says to call dcp_shutdown() first.
//
// Thread safety: every function is thread-safe.
#ifndef DCP_CAPI_INTERNAL_ASYNC_UPLOADS_H_
#define DCP_CAPI_INTERNAL_ASYNC_UPLOADS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/future.h"
#include "engine/async_save.h"
#include "io/storage.h"
#include "planner/metadata.h"

namespace dcp::capi {

// The library's checkpointer, created on first use.
AsyncCheckpointer& LibraryCheckpointer();

// True once static destruction of the library has begun.
bool Exiting();

// Remembers an upload for WaitForUploads (forgetting finished ones).
void TrackUpload(Future<Metadata> upload);

// Waits until every upload tracked so far is done.
void WaitForUploads();

// Marks the calling thread as running a C callback of an async save for
// the scope's life: waiting for uploads there would wait for itself.
class CallbackScope {
 public:
  CallbackScope();
  ~CallbackScope();
  CallbackScope(const CallbackScope&) = delete;
  CallbackScope& operator=(const CallbackScope&) = delete;

  static bool Active();
};

// A StorageWriter that forwards to `inner`. Reset("") points `inner` at
// `checkpoint_id` when that is not empty (the C ABI's "with storage_writer
// too, the writer is pointed at checkpoint_id"), in the engine's order, on
// the thread that runs the save. Once Exiting(), Reset and SetUp fail with
// kCancelled, so nothing of the save is written.
class ExitGatedWriter final : public StorageWriter {
 public:
  ExitGatedWriter(std::shared_ptr<StorageWriter> inner,
                  std::string checkpoint_id);

  absl::Status Reset(const std::string& checkpoint_id) override;
  StorageMeta GetStorageMeta() const override;
  absl::Status SetUp(bool is_coordinator, int rank,
                     bool use_collectives) override;
  absl::StatusOr<SavePlan> PrepareLocalPlan(SavePlan plan) override;
  absl::StatusOr<std::vector<SavePlan>> PrepareGlobalPlan(
      std::vector<SavePlan> plans) override;
  absl::Status SetDeviceWait(const DeviceWait& wait) override;
  absl::Status SelectRankLocal(int rank) override;
  Future<std::vector<WriteResult>> WriteData(const SavePlan& plan,
                                             SavePlanner& planner) override;
  absl::Status Finish(
      const Metadata& metadata,
      const std::vector<std::vector<WriteResult>>& results) override;
  void DescribeCommit(Metadata& metadata) const override;
  bool CommitDecided() const override;
  absl::Status MarkCommitted() override;
  void Abort() override;

 private:
  std::shared_ptr<StorageWriter> inner_;
  std::string checkpoint_id_;
};

}  // namespace dcp::capi

#endif  // DCP_CAPI_INTERNAL_ASYNC_UPLOADS_H_
