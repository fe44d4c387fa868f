#include "capi/internal/async_uploads.h"

#include <atomic>
#include <utility>

#include "absl/base/const_init.h"
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace dcp::capi {
namespace {

std::atomic<bool> exiting{false};

// Its destructor runs when static destruction of the library begins.
struct ExitGate {
  ~ExitGate() { exiting.store(true); }
} exit_gate;

ABSL_CONST_INIT absl::Mutex uploads_mu(absl::kConstInit);

std::vector<Future<Metadata>>& Uploads()
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(uploads_mu) {
  static auto* const uploads = new std::vector<Future<Metadata>>();
  return *uploads;
}

thread_local int callback_depth = 0;

absl::Status ExitError() {
  return absl::CancelledError(
      "dcp async save: the process is exiting and uploads still queued at "
      "exit are not run; call dcp_shutdown() before exit");
}

}  // namespace

AsyncCheckpointer& LibraryCheckpointer() {
  // Never destroyed: see the file comment.
  static AsyncCheckpointer* const checkpointer = new AsyncCheckpointer();
  return *checkpointer;
}

bool Exiting() { return exiting.load(); }

void TrackUpload(Future<Metadata> upload) {
  absl::MutexLock lock(&uploads_mu);
  std::vector<Future<Metadata>>& uploads = Uploads();
  std::erase_if(uploads, [](const Future<Metadata>& f) { return f.ready(); });
  uploads.push_back(std::move(upload));
}

void WaitForUploads() {
  std::vector<Future<Metadata>> pending;
  {
    absl::MutexLock lock(&uploads_mu);
    pending = Uploads();
  }
  for (const Future<Metadata>& upload : pending) upload.Wait();
}

CallbackScope::CallbackScope() { ++callback_depth; }
CallbackScope::~CallbackScope() { --callback_depth; }
bool CallbackScope::Active() { return callback_depth > 0; }

ExitGatedWriter::ExitGatedWriter(std::shared_ptr<StorageWriter> inner,
                                 std::string checkpoint_id)
    : inner_(std::move(inner)), checkpoint_id_(std::move(checkpoint_id)) {}

absl::Status ExitGatedWriter::Reset(const std::string& checkpoint_id) {
  if (Exiting()) return ExitError();
  return inner_->Reset(checkpoint_id.empty() ? checkpoint_id_ : checkpoint_id);
}

StorageMeta ExitGatedWriter::GetStorageMeta() const {
  return inner_->GetStorageMeta();
}

absl::Status ExitGatedWriter::SetUp(bool is_coordinator, int rank,
                                    bool use_collectives) {
  if (Exiting()) return ExitError();
  return inner_->SetUp(is_coordinator, rank, use_collectives);
}

absl::StatusOr<SavePlan> ExitGatedWriter::PrepareLocalPlan(SavePlan plan) {
  return inner_->PrepareLocalPlan(std::move(plan));
}

absl::StatusOr<std::vector<SavePlan>> ExitGatedWriter::PrepareGlobalPlan(
    std::vector<SavePlan> plans) {
  return inner_->PrepareGlobalPlan(std::move(plans));
}

absl::Status ExitGatedWriter::SetDeviceWait(const DeviceWait& wait) {
  return inner_->SetDeviceWait(wait);
}

absl::Status ExitGatedWriter::SelectRankLocal(int rank) {
  return inner_->SelectRankLocal(rank);
}

Future<std::vector<WriteResult>> ExitGatedWriter::WriteData(
    const SavePlan& plan, SavePlanner& planner) {
  return inner_->WriteData(plan, planner);
}

absl::Status ExitGatedWriter::Finish(
    const Metadata& metadata,
    const std::vector<std::vector<WriteResult>>& results) {
  return inner_->Finish(metadata, results);
}

void ExitGatedWriter::DescribeCommit(Metadata& metadata) const {
  inner_->DescribeCommit(metadata);
}

bool ExitGatedWriter::CommitDecided() const { return inner_->CommitDecided(); }

absl::Status ExitGatedWriter::MarkCommitted() {
  return inner_->MarkCommitted();
}

void ExitGatedWriter::Abort() { inner_->Abort(); }

}  // namespace dcp::capi
