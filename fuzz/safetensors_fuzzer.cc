// Fuzz target: the safetensors parser (io/safetensors.h ParseSafetensors),
// which validates a Hugging Face file's header before dcp reads tensors by
// its offsets.
//
// Each input is a whole file, tried as it is and with its 8-byte header
// length rewritten to end the JSON at the input's last '}' (so that a
// mutation that grows or shrinks the JSON still reaches the JSON rules).
//
// Invariants: parsing never crashes and fails only with kDataLoss or
// kUnimplemented (a dtype dcp lacks); a parsed header describes the file
// (data from data_start() to the end, each tensor's bytes inside it and
// matching its dtype and shape); ParseSafetensorsHeader of the JSON agrees;
// and where EncodeSafetensorsHeader takes the parsed tensors and metadata,
// its header followed by the same data parses to the same tensors and
// metadata.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "core/tensor.h"
#include "fuzz/fuzz_check.h"
#include "io/safetensors.h"

namespace dcp::fuzz {
namespace {

// Tensors in a canonical order: zero-size tensors at one offset may come in
// either order.
std::vector<SafetensorsTensor> Sorted(std::vector<SafetensorsTensor> tensors) {
  std::sort(tensors.begin(), tensors.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
              return std::tie(a.begin, a.end, a.name) <
                     std::tie(b.begin, b.end, b.name);
            });
  return tensors;
}

void CheckFile(absl::string_view file) {
  absl::StatusOr<SafetensorsHeader> header = ParseSafetensors(file, "fuzz");
  if (Verbose()) {
    std::fprintf(stderr, "parse: %s\n", header.status().ToString().c_str());
  }
  if (!header.ok()) {
    if (absl::IsUnimplemented(header.status())) return;
    CheckDecodeError(header.status());
    return;
  }
  DCP_FUZZ_CHECK(header->header_length >= 0 &&
                     header->data_start() + header->data_length ==
                         static_cast<int64_t>(file.size()),
                 "the header and data lengths do not add up to the file");
  for (const SafetensorsTensor& t : header->tensors) {
    DCP_FUZZ_CHECK(
        0 <= t.begin && t.begin <= t.end && t.end <= header->data_length,
        "a tensor's bytes lie outside the data");
    DCP_FUZZ_CHECK(CheckedNumBytes(t.dtype, t.shape) == t.end - t.begin,
                   "a tensor's bytes differ from its dtype and shape");
  }
  const absl::string_view json =
      file.substr(8, static_cast<size_t>(header->header_length));
  absl::StatusOr<SafetensorsHeader> from_json =
      ParseSafetensorsHeader(json, header->data_length, "fuzz");
  DCP_FUZZ_CHECK(from_json.ok() && from_json->tensors == header->tensors &&
                     from_json->metadata == header->metadata,
                 "ParseSafetensorsHeader disagrees with ParseSafetensors");

  std::vector<SafetensorsTensor> tensors = header->tensors;
  absl::StatusOr<std::string> encoded =
      EncodeSafetensorsHeader(tensors, header->metadata);
  if (!encoded.ok()) return;  // E.g. an empty name: valid, not written.
  const std::string again_file =
      *encoded + std::string(file.substr(header->data_start()));
  absl::StatusOr<SafetensorsHeader> again =
      ParseSafetensors(again_file, "re-encoded");
  if (!again.ok()) {
    std::fprintf(stderr, "%s\n", again.status().ToString().c_str());
  }
  DCP_FUZZ_CHECK(again.ok(), "the re-encoded header does not parse");
  DCP_FUZZ_CHECK(Sorted(again->tensors) == Sorted(header->tensors) &&
                     again->metadata == header->metadata,
                 "the re-encoded header parses to other tensors or metadata");
}

// `file` with its length prefix set to end the header at the last '}'.
std::string WithHeaderToLastBrace(absl::string_view file) {
  std::string out(file);
  const size_t brace = out.rfind('}');
  const uint64_t n = brace == std::string::npos || brace < 8 ? 0 : brace - 7;
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out;
}

}  // namespace
}  // namespace dcp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view file = dcp::fuzz::AsBytes(data, size);
  dcp::fuzz::CheckFile(file);
  if (size >= 8) {
    const std::string fixed = dcp::fuzz::WithHeaderToLastBrace(file);
    if (fixed != file) dcp::fuzz::CheckFile(fixed);
  }
  return 0;
}
