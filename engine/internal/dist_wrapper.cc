#include "engine/internal/dist_wrapper.h"

#include <cstdint>
#include <map>

#include "absl/strings/str_cat.h"
#include "core/checkpoint_exception.h"
#include "core/status.h"

namespace dcp::internal {
namespace {

// Envelope: one tag byte, then the payload (kOk), an encoded Status
// (kError), or a failure list (kFailures: the CheckpointException payload).
enum Tag : char { kOk = 'O', kError = 'E', kFailures = 'F' };

std::string Wrap(const absl::StatusOr<std::string>& result) {
  if (result.ok()) return std::string(1, kOk) + *result;
  return std::string(1, kError) + comm::EncodeStatus(result.status());
}

// The failure list travels as the CheckpointException payload itself.
std::string WrapFailures(const std::map<int, absl::Status>& failures) {
  auto payload = MakeCheckpointException("", failures)
                     .GetPayload(kCheckpointFailuresPayload);
  return std::string(1, kFailures) +
         (payload.has_value() ? std::string(*payload) : std::string());
}

// Unwraps an envelope received in `step`; a failure becomes the
// CheckpointException every rank returns.
absl::StatusOr<std::string> Unwrap(absl::string_view step,
                                   absl::string_view envelope, int sender) {
  auto corrupt = [&] {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", step,
                     ": malformed coordination message from rank ", sender));
  };
  if (envelope.empty()) return corrupt();
  const char tag = envelope[0];
  envelope.remove_prefix(1);
  if (tag == kOk) return std::string(envelope);
  std::map<int, absl::Status> failures;
  if (tag == kError) {
    absl::Status decoded;
    if (!comm::DecodeStatus(envelope, &decoded).ok()) return corrupt();
    failures[sender] = decoded;
  } else if (tag == kFailures) {
    absl::Status carrier = absl::UnknownError("");
    carrier.SetPayload(kCheckpointFailuresPayload, absl::Cord(envelope));
    auto decoded = CheckpointFailures(carrier);
    if (!decoded.has_value()) return corrupt();
    failures = *std::move(decoded);
  } else {
    return corrupt();
  }
  return MakeCheckpointException(step, failures);
}

}  // namespace

DistWrapper::DistWrapper(comm::ProcessGroup* group, int coordinator_rank)
    : group_(group), coordinator_rank_(coordinator_rank) {}

absl::StatusOr<std::vector<std::string>> DistWrapper::GatherResults(
    absl::string_view step, const absl::StatusOr<std::string>& local) {
  if (group_ == nullptr) {
    if (!local.ok()) return local.status();
    return std::vector<std::string>{*local};
  }
  absl::StatusOr<std::vector<std::string>> gathered =
      group_->Gather(Wrap(local), coordinator_rank_);
  if (!gathered.ok()) {
    return Annotate(gathered.status(),
                    absl::StrCat("checkpoint ", step, " on rank ", rank()));
  }
  if (!is_coordinator()) return std::vector<std::string>{};
  std::map<int, absl::Status> failures;
  std::vector<std::string> payloads(gathered->size());
  for (size_t r = 0; r < gathered->size(); ++r) {
    absl::StatusOr<std::string> unwrapped =
        Unwrap(step, (*gathered)[r], static_cast<int>(r));
    if (unwrapped.ok()) {
      payloads[r] = *std::move(unwrapped);
    } else if (auto inner = CheckpointFailures(unwrapped.status())) {
      failures.insert(inner->begin(), inner->end());
    } else {
      failures[static_cast<int>(r)] = unwrapped.status();
    }
  }
  if (!failures.empty()) return MakeCheckpointException(step, failures);
  return payloads;
}

absl::StatusOr<std::string> DistWrapper::Distribute(
    absl::string_view step,
    const absl::StatusOr<std::vector<std::string>>& outcome, bool scatter) {
  if (group_ == nullptr) {
    if (!outcome.ok()) return outcome.status();
    return outcome->at(0);
  }
  std::vector<std::string> envelopes;
  std::string single;
  if (is_coordinator()) {
    std::string failure;
    if (!outcome.ok()) {
      auto failures = CheckpointFailures(outcome.status());
      failure = WrapFailures(
          failures.has_value()
              ? *failures
              : std::map<int, absl::Status>{{rank(), outcome.status()}});
    }
    if (scatter) {
      for (int r = 0; r < size(); ++r) {
        envelopes.push_back(outcome.ok() ? std::string(1, kOk) + outcome->at(r)
                                         : failure);
      }
    } else {
      single = outcome.ok() ? std::string(1, kOk) + outcome->at(0) : failure;
    }
  }
  absl::StatusOr<std::string> received =
      scatter ? group_->Scatter(envelopes, coordinator_rank_)
              : group_->Broadcast(single, coordinator_rank_);
  if (!received.ok()) {
    return Annotate(received.status(),
                    absl::StrCat("checkpoint ", step, " on rank ", rank()));
  }
  return Unwrap(step, *received, coordinator_rank_);
}

absl::StatusOr<std::string> DistWrapper::GatherScatter(absl::string_view step,
                                                       LocalStep local_step,
                                                       GlobalStep global_step) {
  absl::StatusOr<std::vector<std::string>> gathered =
      GatherResults(step, local_step());
  if (group_ != nullptr && !gathered.ok() &&
      !CheckpointFailures(gathered.status()).has_value()) {
    return gathered.status();  // The collective failed: nothing to scatter.
  }
  absl::StatusOr<std::vector<std::string>> outcome = std::move(gathered);
  if (is_coordinator() && outcome.ok()) {
    outcome = global_step(*std::move(outcome));
    if (outcome.ok() && static_cast<int>(outcome->size()) != size()) {
      outcome = absl::InternalError(
          absl::StrCat("checkpoint ", step, ": global step returned ",
                       outcome->size(), " plans for ", size(), " ranks"));
    }
    if (group_ != nullptr && !outcome.ok() &&
        !CheckpointFailures(outcome.status()).has_value()) {
      outcome = MakeCheckpointException(step, {{rank(), outcome.status()}});
    }
  }
  return Distribute(step, outcome, /*scatter=*/true);
}

absl::StatusOr<std::string> DistWrapper::GatherBroadcast(
    absl::string_view step, LocalStep local_step, ReduceStep global_step) {
  absl::StatusOr<std::vector<std::string>> gathered =
      GatherResults(step, local_step());
  if (group_ != nullptr && !gathered.ok() &&
      !CheckpointFailures(gathered.status()).has_value()) {
    return gathered.status();
  }
  absl::StatusOr<std::vector<std::string>> outcome = std::move(gathered);
  if (is_coordinator() && outcome.ok()) {
    absl::StatusOr<std::string> reduced = global_step(*std::move(outcome));
    if (reduced.ok()) {
      outcome = std::vector<std::string>{*std::move(reduced)};
    } else if (group_ == nullptr ||
               CheckpointFailures(reduced.status()).has_value()) {
      outcome = reduced.status();
    } else {
      outcome = MakeCheckpointException(step, {{rank(), reduced.status()}});
    }
  }
  return Distribute(step, outcome, /*scatter=*/false);
}

absl::StatusOr<std::string> DistWrapper::Broadcast(absl::string_view step,
                                                   LocalStep coordinator_step) {
  absl::StatusOr<std::vector<std::string>> outcome = std::vector<std::string>{};
  if (is_coordinator()) {
    absl::StatusOr<std::string> result = coordinator_step();
    if (result.ok()) {
      outcome = std::vector<std::string>{*std::move(result)};
    } else if (group_ == nullptr) {
      outcome = result.status();
    } else {
      outcome = MakeCheckpointException(step, {{rank(), result.status()}});
    }
  }
  return Distribute(step, outcome, /*scatter=*/false);
}

absl::Status DistWrapper::Barrier(absl::string_view step) {
  if (group_ == nullptr) return absl::OkStatus();
  return Annotate(group_->Barrier(),
                  absl::StrCat("checkpoint ", step, " on rank ", rank()));
}

}  // namespace dcp::internal
