// HeldStager: an AsyncStager whose staging the test finishes, so that an
// upload waits on staging exactly until the test says.
#ifndef DCP_TESTS_HELD_STAGER_H_
#define DCP_TESTS_HELD_STAGER_H_

#include <atomic>
#include <utility>

#include "absl/status/status.h"
#include "core/future.h"
#include "core/state_dict.h"
#include "staging/stager.h"

namespace dcp::testing {

// Stages nothing itself: every Stage returns the one future that Release
// makes ready. Counts Stage calls.
class HeldStager final : public AsyncStager {
 public:
  Future<StateDict> Stage(const StateDict&) override {
    ++stage_calls;
    return promise_.future();
  }
  bool should_synchronize_after_execute() const override { return false; }
  absl::Status SynchronizeStaging() override { return absl::OkStatus(); }
  void Close() override {}

  // Staging completes with `staged`.
  void Release(StateDict staged) { promise_.Set(std::move(staged)); }

  std::atomic<int> stage_calls{0};

 private:
  Promise<StateDict> promise_;
};

}  // namespace dcp::testing

#endif  // DCP_TESTS_HELD_STAGER_H_
