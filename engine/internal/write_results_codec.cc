#include "engine/internal/write_results_codec.h"

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/internal/coordination.pb.h"

namespace dcp::internal {
namespace {

constexpr uint32_t kVersion = 1;

}  // namespace

std::string EncodeWriteResults(const std::vector<WriteResult>& results) {
  engine_wire::WriteResults message;
  message.set_version(kVersion);
  message.mutable_results()->Reserve(static_cast<int>(results.size()));
  for (const WriteResult& result : results) {
    engine_wire::WriteResult* out = message.add_results();
    out->set_fqn(result.index.fqn);
    if (result.index.offset.has_value()) {
      out->set_has_offset(true);
      out->mutable_offset()->Add(result.index.offset->begin(),
                                 result.index.offset->end());
    }
    out->set_size_in_bytes(result.size_in_bytes);
    out->set_relative_path(result.storage_data.relative_path);
    out->set_file_offset(result.storage_data.offset);
    out->set_length(result.storage_data.length);
    out->mutable_block_checksums()->Add(
        result.storage_data.block_checksums.begin(),
        result.storage_data.block_checksums.end());
    for (const std::string& extension : result.storage_data.extensions) {
      out->add_extensions(extension);
    }
    if (!result.storage_data.extensions.empty()) {
      out->set_raw_length(result.storage_data.raw_length);
      out->mutable_block_lengths()->Add(
          result.storage_data.block_lengths.begin(),
          result.storage_data.block_lengths.end());
    }
  }
  return message.SerializeAsString();
}

absl::StatusOr<std::vector<WriteResult>> DecodeWriteResults(
    absl::string_view bytes) {
  engine_wire::WriteResults message;
  // Protobuf takes an int length: longer input must not wrap around.
  if (bytes.size() > static_cast<size_t>(INT32_MAX) ||
      !message.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::DataLossError(
        absl::StrCat("write results of ", bytes.size(), " bytes do not parse"));
  }
  if (message.version() == 0 || message.version() > kVersion) {
    return absl::DataLossError(
        absl::StrCat("write results have unknown version ", message.version()));
  }
  std::vector<WriteResult> results;
  results.reserve(message.results_size());
  for (const engine_wire::WriteResult& in : message.results()) {
    // A raw length or block lengths belong to an extension record only
    // (the encoder writes them with one).
    if (in.file_offset() < 0 || in.length() < 0 ||
        (!in.has_offset() && in.offset_size() != 0) ||
        (in.extensions_size() == 0 &&
         (in.raw_length() != 0 || in.block_lengths_size() != 0))) {
      return absl::DataLossError(
          absl::StrCat("write result for \"", in.fqn(), "\" is inconsistent"));
    }
    WriteResult result;
    result.index.fqn = in.fqn();
    if (in.has_offset()) {
      result.index.offset = Shape(in.offset().begin(), in.offset().end());
    }
    result.size_in_bytes = in.size_in_bytes();
    result.storage_data.relative_path = in.relative_path();
    result.storage_data.offset = in.file_offset();
    result.storage_data.length = in.length();
    result.storage_data.block_checksums.assign(in.block_checksums().begin(),
                                               in.block_checksums().end());
    result.storage_data.extensions.assign(in.extensions().begin(),
                                          in.extensions().end());
    result.storage_data.raw_length = in.raw_length();
    result.storage_data.block_lengths.assign(in.block_lengths().begin(),
                                             in.block_lengths().end());
    results.push_back(std::move(result));
  }
  return results;
}

}  // namespace dcp::internal
