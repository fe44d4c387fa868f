// Encoding of a rank's WriteResults for the commit step (protobuf,
// engine/internal/coordination.proto). Decoding never trusts its input.
#ifndef DCP_ENGINE_INTERNAL_WRITE_RESULTS_CODEC_H_
#define DCP_ENGINE_INTERNAL_WRITE_RESULTS_CODEC_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/plan.h"

namespace dcp::internal {

std::string EncodeWriteResults(const std::vector<WriteResult>& results);
// kDataLoss for bytes that do not parse or fail the consistency checks.
absl::StatusOr<std::vector<WriteResult>> DecodeWriteResults(
    absl::string_view bytes);

}  // namespace dcp::internal

#endif  // DCP_ENGINE_INTERNAL_WRITE_RESULTS_CODEC_H_
