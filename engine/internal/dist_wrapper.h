// DistWrapper: the seed's coordination steps over a ProcessGroup, with every
// rank's failure reaching every rank. Payloads are opaque bytes (encoded
// plans, write results, metadata); each step wraps them in an envelope that
// says whether the sender succeeded.
//
//   GatherScatter: every rank runs local_step; the coordinator gathers the
//     results, runs global_step on them and scatters one result per rank.
//   GatherBroadcast: every rank runs local_step; the coordinator gathers the
//     results, runs global_step and broadcasts its single result.
//   Broadcast: the coordinator runs step and broadcasts its result.
//
// If any rank's step fails, every rank returns the same CheckpointException
// Status (core/checkpoint_exception.h) listing each failed rank. If the
// collective itself fails (a lost peer, a timeout) every surviving rank
// returns that error, annotated with the step. Without a group (single
// process) the steps run inline.
//
// Not thread-safe: one step at a time, from one thread.
#ifndef DCP_ENGINE_INTERNAL_DIST_WRAPPER_H_
#define DCP_ENGINE_INTERNAL_DIST_WRAPPER_H_

#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "comm/process_group.h"

namespace dcp::internal {

class DistWrapper {
 public:
  using LocalStep = absl::FunctionRef<absl::StatusOr<std::string>()>;
  using GlobalStep = absl::FunctionRef<absl::StatusOr<std::vector<std::string>>(
      std::vector<std::string>)>;
  using ReduceStep =
      absl::FunctionRef<absl::StatusOr<std::string>(std::vector<std::string>)>;

  // `group` is not owned and may be null (single process).
  DistWrapper(comm::ProcessGroup* group, int coordinator_rank);

  int rank() const { return group_ != nullptr ? group_->rank() : 0; }
  int size() const { return group_ != nullptr ? group_->size() : 1; }
  bool is_coordinator() const { return rank() == coordinator_rank_; }
  int coordinator_rank() const { return coordinator_rank_; }

  absl::StatusOr<std::string> GatherScatter(absl::string_view step,
                                            LocalStep local_step,
                                            GlobalStep global_step);
  absl::StatusOr<std::string> GatherBroadcast(absl::string_view step,
                                              LocalStep local_step,
                                              ReduceStep global_step);
  absl::StatusOr<std::string> Broadcast(absl::string_view step,
                                        LocalStep coordinator_step);
  absl::Status Barrier(absl::string_view step);

 private:
  // Gathers each rank's envelope to the coordinator. On the coordinator,
  // returns the payloads when all ranks succeeded, or the combined failure.
  absl::StatusOr<std::vector<std::string>> GatherResults(
      absl::string_view step, const absl::StatusOr<std::string>& local);
  // Delivers the coordinator's outcome: one payload per rank (scatter) or
  // one for all (broadcast), or the failure.
  absl::StatusOr<std::string> Distribute(
      absl::string_view step,
      const absl::StatusOr<std::vector<std::string>>& outcome, bool scatter);

  comm::ProcessGroup* const group_;
  const int coordinator_rank_;
};

}  // namespace dcp::internal

#endif  // DCP_ENGINE_INTERNAL_DIST_WRAPPER_H_
