// OrderedReader: the C ABI's readers with the load-side stream rule
// (dcp_load_options_t.device_wait). It forwards every step to the reader it
// wraps; SetDeviceWait keeps the wait, and ReadData first makes the copy
// streams of the reader's DeviceStaging (the one the wrapped reader was
// created with, its options' device_staging) wait for it on the device, so
// no copy into a device tensor starts before the caller's work.
//
// Thread safety: as StorageReader (one load at a time).
#ifndef DCP_CAPI_INTERNAL_ORDERED_READER_H_
#define DCP_CAPI_INTERNAL_ORDERED_READER_H_

#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/future.h"
#include "io/storage.h"
#include "staging/device_staging.h"

namespace dcp::capi {

class OrderedReader final : public StorageReader {
 public:
  // `inner` was created with `staging` as its device staging; neither is
  // null. Both are kept alive by the wrapper.
  OrderedReader(std::shared_ptr<StorageReader> inner,
                std::shared_ptr<DeviceStaging> staging)
      : inner_(std::move(inner)), staging_(std::move(staging)) {}

  // Clears the wait, as a writer's Reset does. After FailResets, fails
  // with that status instead.
  absl::Status Reset(const std::string& checkpoint_id) override {
    wait_ = DeviceWait{};
    if (!reset_failure_.ok()) return reset_failure_;
    return inner_->Reset(checkpoint_id);
  }
  // Every Reset fails with `failure` (not OK): a rank whose storage could
  // not be made still takes part in the load's shared setup, failing
  // there, so the other ranks learn why instead of waiting for it.
  void FailResets(absl::Status failure) { reset_failure_ = std::move(failure); }
  absl::Status SetDeviceWait(const DeviceWait& wait) override {
    wait_ = wait;
    return absl::OkStatus();
  }
  absl::StatusOr<bool> DetectRankLocal(int rank) override {
    return inner_->DetectRankLocal(rank);
  }
  absl::StatusOr<Metadata> ReadMetadata() override {
    return inner_->ReadMetadata();
  }
  absl::Status SetUp(const Metadata& metadata, bool is_coordinator) override {
    return inner_->SetUp(metadata, is_coordinator);
  }
  absl::StatusOr<LoadPlan> PrepareLocalPlan(LoadPlan plan) override {
    return inner_->PrepareLocalPlan(std::move(plan));
  }
  absl::StatusOr<std::vector<LoadPlan>> PrepareGlobalPlan(
      std::vector<LoadPlan> plans) override {
    return inner_->PrepareGlobalPlan(std::move(plans));
  }
  // The wait's runtime error (e.g. a stream of another runtime) fails the
  // read before any byte is copied. Ready once every copy to the device
  // the read enqueued through the staging has landed, the planner's too
  // (DefaultLoadPlanner::SetDeviceConversion): the staging is flushed after
  // the wrapped reader's ReadData, whose error comes first.
  Future<void> ReadData(const LoadPlan& plan, LoadPlanner& planner) override {
    absl::Status ordered = staging_->OrderUploadsAfter(wait_);
    if (!ordered.ok()) return Future<void>::Ready(std::move(ordered));
    Promise<void> done;
    inner_->ReadData(plan, planner)
        .OnReady([done, staging = staging_](const absl::Status& read) {
          absl::Status flushed = staging->Flush();
          done.Set(read.ok() ? flushed : read);
        });
    return done.future();
  }

 private:
  std::shared_ptr<StorageReader> inner_;
  std::shared_ptr<DeviceStaging> staging_;
  DeviceWait wait_;
  absl::Status reset_failure_;
};

}  // namespace dcp::capi

#endif  // DCP_CAPI_INTERNAL_ORDERED_READER_H_
