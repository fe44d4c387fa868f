// ProcessGroup: the collectives that checkpoint coordination needs (gather
// to a root, scatter from a root, broadcast, all-gather, barrier) on byte
// payloads of any size, with a deadline on every call. Implementations:
// LocalProcessGroup (one rank, below), GlooProcessGroup (CPU, tcp;
// gloo_process_group.h), NcclProcessGroup (GPU; nccl_process_group.h) and
// the store group (any shared key-value store, e.g. torchrun's TCPStore;
// store_process_group.h).
// CreateProcessGroup (process_group_factory.h) picks one from the
// environment.
//
// Contract shared by every implementation:
// - Every rank of the group calls the same collectives in the same order with
//   the same root. Payload sizes may differ per rank and per call.
// - Ownership: payloads are read during the call only (views and spans need
//   not outlive it); results are new strings owned by the caller.
// - Threads: one collective at a time per group. A call made while another
//   is in flight on the same group returns kFailedPrecondition at once (it
//   does not queue: a queue would let ranks run collectives in different
//   orders). Any thread may call, one after another; a background save
//   thread should own a group of its own (see the isolation note in
//   gloo_process_group.h). rank(), size(), backend() and default_timeout()
//   are safe from any thread at any time.
// - Time: `timeout` bounds the whole call; kGroupTimeout (the default) means
//   the group's default timeout. A call never waits longer: it returns
//   kDeadlineExceeded naming the operation and the rank it was waiting for
//   (where the backend can tell). A peer whose connection dropped gives
//   kUnavailable naming it.
// - Failure: after kDeadlineExceeded, kUnavailable, kInternal, kAborted or
//   kDataLoss the group is broken: every later call fails at once with the
//   first error's code and message ("... broken by an earlier failure: ..."),
//   since the ranks no longer agree on where the collective sequence stands.
//   Create a new group to continue. Argument errors (kInvalidArgument) do not
//   break the group.
// - Lifetime: destroy a group only when no call is in flight on it.
//   Destroying it closes its connections; peers still using it fail with
//   kUnavailable.
// - No exception crosses this interface.
#ifndef DCP_COMM_PROCESS_GROUP_H_
#define DCP_COMM_PROCESS_GROUP_H_

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace dcp::comm {

// True for the codes after which a group is broken (see "Failure" above):
// kDeadlineExceeded, kUnavailable, kInternal, kAborted, kDataLoss.
bool BreaksGroup(const absl::Status& status);

// Passed as `timeout` to use the group's default timeout.
inline constexpr absl::Duration kGroupTimeout = absl::ZeroDuration();

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // This process's rank in [0, size()) and the number of ranks.
  int rank() const { return rank_; }
  int size() const { return size_; }
  // "local", "gloo", "nccl" or "store".
  virtual absl::string_view backend() const = 0;
  // The timeout used when a call passes kGroupTimeout.
  absl::Duration default_timeout() const { return default_timeout_; }

  // Every rank sends `payload` to `root`. On `root`, returns size() payloads
  // indexed by rank (its own included); on other ranks, an empty vector.
  absl::StatusOr<std::vector<std::string>> Gather(
      absl::string_view payload, int root,
      absl::Duration timeout = kGroupTimeout);

  // `root` passes size() payloads (payloads[r] goes to rank r); other ranks
  // pass an empty span (ignored). Every rank returns its own payload.
  absl::StatusOr<std::string> Scatter(absl::Span<const std::string> payloads,
                                      int root,
                                      absl::Duration timeout = kGroupTimeout);

  // Every rank returns `root`'s payload; other ranks' `payload` is ignored.
  absl::StatusOr<std::string> Broadcast(absl::string_view payload, int root,
                                        absl::Duration timeout = kGroupTimeout);

  // Every rank returns all size() payloads indexed by rank.
  absl::StatusOr<std::vector<std::string>> AllGather(
      absl::string_view payload, absl::Duration timeout = kGroupTimeout);

  // Returns once every rank has entered the barrier.
  absl::Status Barrier(absl::Duration timeout = kGroupTimeout);

 protected:
  ProcessGroup(int rank, int size, absl::Duration default_timeout);

  // Implementations. Arguments are validated (root in range, scatter payload
  // count), `deadline` is absolute, and no other call runs concurrently.
  virtual absl::StatusOr<std::vector<std::string>> DoGather(
      absl::string_view payload, int root, absl::Time deadline) = 0;
  virtual absl::StatusOr<std::string> DoScatter(
      absl::Span<const std::string> payloads, int root,
      absl::Time deadline) = 0;
  virtual absl::StatusOr<std::string> DoBroadcast(absl::string_view payload,
                                                  int root,
                                                  absl::Time deadline) = 0;
  virtual absl::StatusOr<std::vector<std::string>> DoAllGather(
      absl::string_view payload, absl::Time deadline) = 0;
  virtual absl::Status DoBarrier(absl::Time deadline) = 0;

 private:
  class CallGuard;

  // Starts a call: checks `root` (-1: none), that the group is usable and
  // not busy. `op` names the call in errors.
  absl::Status BeginCall(absl::string_view op, int root);
  // Ends a call: records a failure that breaks the group.
  void EndCall(const absl::Status& status);

  const int rank_;
  const int size_;
  const absl::Duration default_timeout_;

  absl::Mutex mu_;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

// A group of one rank: every collective returns the caller's own data at
// once. Used when a job runs without distribution (no_dist).
class LocalProcessGroup final : public ProcessGroup {
 public:
  explicit LocalProcessGroup(absl::Duration default_timeout = absl::Minutes(5))
      : ProcessGroup(/*rank=*/0, /*size=*/1, default_timeout) {}
  absl::string_view backend() const override { return "local"; }

 protected:
  absl::StatusOr<std::vector<std::string>> DoGather(
      absl::string_view payload, int root, absl::Time deadline) override;
  absl::StatusOr<std::string> DoScatter(absl::Span<const std::string> payloads,
                                        int root, absl::Time deadline) override;
  absl::StatusOr<std::string> DoBroadcast(absl::string_view payload, int root,
                                          absl::Time deadline) override;
  absl::StatusOr<std::vector<std::string>> DoAllGather(
      absl::string_view payload, absl::Time deadline) override;
  absl::Status DoBarrier(absl::Time deadline) override;
};

// Status exchange for the coordination steps: every rank contributes its
// local outcome and every rank learns all ranks' outcomes (index = rank), so
// each rank can build the same CheckpointException. Payloads attached to a
// Status do not travel; code and message do. Returns the group's error if
// the exchange itself fails.
absl::StatusOr<std::vector<absl::Status>> AllGatherStatuses(
    ProcessGroup& group, const absl::Status& local,
    absl::Duration timeout = kGroupTimeout);

// The compact wire form used by AllGatherStatuses: 4 bytes of code (little
// endian) then the message. DecodeStatus stores the decoded Status in
// `*decoded` and returns OK, or returns kDataLoss for a payload shorter than
// 4 bytes or with an unknown code. (Not StatusOr<Status>: that type cannot
// tell a decoded error from a failed decode.)
std::string EncodeStatus(const absl::Status& status);
absl::Status DecodeStatus(absl::string_view encoded, absl::Status* decoded);

}  // namespace dcp::comm

#endif  // DCP_COMM_PROCESS_GROUP_H_
