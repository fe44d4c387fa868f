// CheckpointException as a Status: a multi-rank failure is one absl::Status
// whose payload lists each failing rank's Status. Every rank of a failed
// save or load returns the same combined Status, so each can log which ranks
// failed and why.
#ifndef DCP_CORE_CHECKPOINT_EXCEPTION_H_
#define DCP_CORE_CHECKPOINT_EXCEPTION_H_

#include <map>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dcp {

// The payload type URL of the per-rank failure list.
inline constexpr char kCheckpointFailuresPayload[] =
    "type.dcp/CheckpointException.failures";

// Combines per-rank failures (rank -> non-OK Status) into one Status. The
// code is that of the lowest failing rank whose code is not kAborted (ranks
// that gave up because another failed report kAborted), the message names
// `what` ("save", "load") and every failing rank with its message. OK when
// `failures` is empty.
absl::Status MakeCheckpointException(
    absl::string_view what, const std::map<int, absl::Status>& failures);

// The per-rank failures carried by `status`, or nullopt when it carries none
// (a single-rank error).
std::optional<std::map<int, absl::Status>> CheckpointFailures(
    const absl::Status& status);

}  // namespace dcp

#endif  // DCP_CORE_CHECKPOINT_EXCEPTION_H_
