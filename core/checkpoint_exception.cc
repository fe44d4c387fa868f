#include "core/checkpoint_exception.h"

#include <cstdint>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace dcp {
namespace {

// Payload layout: repeated records of
//   int32 rank, int32 code, uint32 message length, message bytes
// all little-endian (the process-local representation; payloads are never
// stored on disk).
void AppendU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

bool ReadU32(absl::string_view& in, uint32_t& v) {
  if (in.size() < 4) return false;
  v = 0;
  for (int i = 0; i < 4; ++i) {
    v |= static_cast<uint32_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  }
  in.remove_prefix(4);
  return true;
}

}  // namespace

absl::Status MakeCheckpointException(
    absl::string_view what, const std::map<int, absl::Status>& failures) {
  if (failures.empty()) return absl::OkStatus();
  absl::StatusCode code = absl::StatusCode::kUnknown;
  bool have_code = false;
  std::string payload;
  std::string details;
  for (const auto& [rank, status] : failures) {
    if (!have_code && status.code() != absl::StatusCode::kAborted) {
      code = status.code();
      have_code = true;
    }
    AppendU32(payload, static_cast<uint32_t>(rank));
    AppendU32(payload, static_cast<uint32_t>(status.code()));
    AppendU32(payload, static_cast<uint32_t>(status.message().size()));
    payload.append(status.message().data(), status.message().size());
    // A message that names its rank first already (a storage error does,
    // for whoever sees it alone) does not get the rank twice.
    absl::StrAppend(
        &details, "; rank ", rank, ": ",
        absl::StatusCodeToString(status.code()), ": ",
        absl::StripPrefix(status.message(), absl::StrCat("rank ", rank, ": ")));
  }
  if (!have_code) code = failures.begin()->second.code();
  absl::Status combined(
      code, absl::StrCat("checkpoint ", what, " failed on ", failures.size(),
                         failures.size() == 1 ? " rank" : " ranks", details));
  combined.SetPayload(kCheckpointFailuresPayload, absl::Cord(payload));
  return combined;
}

std::optional<std::map<int, absl::Status>> CheckpointFailures(
    const absl::Status& status) {
  auto payload = status.GetPayload(kCheckpointFailuresPayload);
  if (!payload.has_value()) return std::nullopt;
  const std::string flat(*payload);
  absl::string_view in(flat);
  std::map<int, absl::Status> failures;
  while (!in.empty()) {
    uint32_t rank = 0, code = 0, length = 0;
    if (!ReadU32(in, rank) || !ReadU32(in, code) || !ReadU32(in, length) ||
        in.size() < length) {
      return std::nullopt;
    }
    failures[static_cast<int>(rank)] =
        absl::Status(static_cast<absl::StatusCode>(code), in.substr(0, length));
    in.remove_prefix(length);
  }
  return failures;
}

}  // namespace dcp
