#include "comm/process_group.h"

#include <cstdint>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dcp::comm {
namespace {}  // namespace

// The ranks no longer agree on where the collective sequence stands.
bool BreaksGroup(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kAborted:
      return true;
    default:
      return false;
  }
}

// Holds the group busy for the length of one call and records its outcome.
class ProcessGroup::CallGuard {
 public:
  // `root` is -1 for collectives without a root.
  CallGuard(ProcessGroup& group, absl::string_view op, int root,
            absl::Duration timeout)
      : group_(group),
        deadline_(absl::Now() + (timeout > absl::ZeroDuration()
                                     ? timeout
                                     : group.default_timeout_)) {
    status_ = group_.BeginCall(op, root);
  }
  ~CallGuard() {
    if (status_.ok()) group_.EndCall(result_);
  }
  CallGuard(const CallGuard&) = delete;
  CallGuard& operator=(const CallGuard&) = delete;

  // OK when the call may proceed.
  const absl::Status& status() const { return status_; }
  absl::Time deadline() const { return deadline_; }

  // Records the call's outcome and returns it.
  template <typename T>
  T Finish(T result) {
    if constexpr (std::is_same_v<T, absl::Status>) {
      result_ = result;
    } else {
      result_ = result.status();
    }
    return result;
  }

 private:
  ProcessGroup& group_;
  const absl::Time deadline_;
  absl::Status status_;
  absl::Status result_;
};

ProcessGroup::ProcessGroup(int rank, int size, absl::Duration default_timeout)
    : rank_(rank), size_(size), default_timeout_(default_timeout) {}

absl::Status ProcessGroup::BeginCall(absl::string_view op, int root) {
  if (root != -1 && (root < 0 || root >= size_)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: root %d out of range for a group of %d ranks", op, root, size_));
  }
  absl::MutexLock lock(&mu_);
  if (!broken_.ok()) {
    return absl::Status(
        broken_.code(),
        absl::StrCat(op, " on rank ", rank_,
                     ": process group is broken by an earlier failure: ",
                     broken_.message()));
  }
  if (busy_) {
    return absl::FailedPreconditionError(absl::StrCat(
        op, " on rank ", rank_,
        ": another collective is in flight on this process group; calls on "
        "one group must be ordered (one at a time)"));
  }
  busy_ = true;
  return absl::OkStatus();
}

void ProcessGroup::EndCall(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  busy_ = false;
  if (BreaksGroup(status) && broken_.ok()) broken_ = status;
}

absl::StatusOr<std::vector<std::string>> ProcessGroup::Gather(
    absl::string_view payload, int root, absl::Duration timeout) {
  if (root < 0) root = size_;  // Reported as out of range.
  CallGuard guard(*this, "gather", root, timeout);
  if (!guard.status().ok()) return guard.status();
  return guard.Finish(DoGather(payload, root, guard.deadline()));
}

absl::StatusOr<std::string> ProcessGroup::Scatter(
    absl::Span<const std::string> payloads, int root, absl::Duration timeout) {
  if (root < 0) root = size_;
  if (rank_ == root && static_cast<int>(payloads.size()) != size_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("scatter: root %d passed %d payloads for a group of "
                        "%d ranks (need one per rank)",
                        root, payloads.size(), size_));
  }
  CallGuard guard(*this, "scatter", root, timeout);
  if (!guard.status().ok()) return guard.status();
  return guard.Finish(DoScatter(payloads, root, guard.deadline()));
}

absl::StatusOr<std::string> ProcessGroup::Broadcast(absl::string_view payload,
                                                    int root,
                                                    absl::Duration timeout) {
  if (root < 0) root = size_;
  CallGuard guard(*this, "broadcast", root, timeout);
  if (!guard.status().ok()) return guard.status();
  return guard.Finish(DoBroadcast(payload, root, guard.deadline()));
}

absl::StatusOr<std::vector<std::string>> ProcessGroup::AllGather(
    absl::string_view payload, absl::Duration timeout) {
  CallGuard guard(*this, "allgather", /*root=*/-1, timeout);
  if (!guard.status().ok()) return guard.status();
  return guard.Finish(DoAllGather(payload, guard.deadline()));
}

absl::Status ProcessGroup::Barrier(absl::Duration timeout) {
  CallGuard guard(*this, "barrier", /*root=*/-1, timeout);
  if (!guard.status().ok()) return guard.status();
  return guard.Finish(DoBarrier(guard.deadline()));
}

absl::StatusOr<std::vector<std::string>> LocalProcessGroup::DoGather(
    absl::string_view payload, int, absl::Time) {
  return std::vector<std::string>{std::string(payload)};
}

absl::StatusOr<std::string> LocalProcessGroup::DoScatter(
    absl::Span<const std::string> payloads, int, absl::Time) {
  return payloads[0];
}

absl::StatusOr<std::string> LocalProcessGroup::DoBroadcast(
    absl::string_view payload, int, absl::Time) {
  return std::string(payload);
}

absl::StatusOr<std::vector<std::string>> LocalProcessGroup::DoAllGather(
    absl::string_view payload, absl::Time) {
  return std::vector<std::string>{std::string(payload)};
}

absl::Status LocalProcessGroup::DoBarrier(absl::Time) {
  return absl::OkStatus();
}

std::string EncodeStatus(const absl::Status& status) {
  const uint32_t code = static_cast<uint32_t>(status.code());
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i)
    out[i] = static_cast<char>((code >> (8 * i)) & 0xff);
  out.append(status.message().data(), status.message().size());
  return out;
}

absl::Status DecodeStatus(absl::string_view encoded, absl::Status* decoded) {
  if (encoded.size() < 4) {
    return absl::DataLossError(absl::StrFormat(
        "encoded status is %d bytes, shorter than its 4-byte code",
        encoded.size()));
  }
  uint32_t code = 0;
  for (int i = 0; i < 4; ++i) {
    code |= static_cast<uint32_t>(static_cast<unsigned char>(encoded[i]))
            << (8 * i);
  }
  if (code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::DataLossError(
        absl::StrFormat("encoded status has unknown code %d", code));
  }
  *decoded = code == 0 ? absl::OkStatus()
                       : absl::Status(static_cast<absl::StatusCode>(code),
                                      encoded.substr(4));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<absl::Status>> AllGatherStatuses(
    ProcessGroup& group, const absl::Status& local, absl::Duration timeout) {
  absl::StatusOr<std::vector<std::string>> all =
      group.AllGather(EncodeStatus(local), timeout);
  if (!all.ok()) return all.status();
  std::vector<absl::Status> statuses;
  statuses.reserve(all->size());
  for (size_t r = 0; r < all->size(); ++r) {
    absl::Status decoded;
    if (absl::Status s = DecodeStatus((*all)[r], &decoded); !s.ok()) {
      return absl::DataLossError(
          absl::StrCat("status from rank ", r, ": ", s.message()));
    }
    statuses.push_back(std::move(decoded));
  }
  return statuses;
}

}  // namespace dcp::comm
