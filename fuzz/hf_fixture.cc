#include "fuzz/hf_fixture.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <utility>

#include "core/state_dict.h"
#include "core/status.h"
#include "core/tensor.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/scratch.h"
#include "io/hf_storage.h"
#include "io/io_engine.h"
#include "planner/metadata.h"

namespace dcp::fuzz {
namespace {

// What one load may allocate for its destination tensors.
constexpr int64_t kMaxTensorBytes = int64_t{1} << 20;

}  // namespace

std::string SafetensorsFileOf(
    std::vector<SafetensorsTensor> tensors,
    const std::map<std::string, std::string>& metadata) {
  absl::StatusOr<std::string> header =
      EncodeSafetensorsHeader(tensors, metadata);
  if (!header.ok()) return "";
  int64_t end = 0;
  for (const SafetensorsTensor& t : tensors) end = std::max(end, t.end);
  std::string data(static_cast<size_t>(end), '\0');
  for (size_t i = 0; i < data.size(); ++i) {
    data[i] = static_cast<char>(i * 167 + 13);
  }
  return *header + data;
}

void ReadAndLoadHfCheckpoint(const std::string& dir) {
  HuggingFaceStorageReaderOptions options;
  options.direct_io = false;
  options.uncached_reads = false;
  options.io_engine = GetScratch().engine.get();
  // Small windows: chunks are read in pieces and copied box by box.
  options.read_window_bytes = 4096;
  HuggingFaceStorageReader reader(dir, options);
  absl::StatusOr<Metadata> metadata = reader.ReadMetadata();
  if (Verbose()) {
    std::fprintf(stderr, "read metadata: %s\n",
                 metadata.status().ToString().c_str());
  }
  if (!metadata.ok()) {
    const absl::Status& s = metadata.status();
    if (absl::IsNotFound(s) || absl::IsUnimplemented(s)) return;
    CheckDecodeError(s);
    return;
  }
  StateDict state_dict;
  int64_t budget = kMaxTensorBytes;
  for (const auto& [fqn, value] : metadata->state_dict_metadata) {
    const auto* tensor = std::get_if<TensorStorageMetadata>(&value);
    DCP_FUZZ_CHECK(tensor != nullptr, "a safetensors entry is not a tensor");
    const std::optional<int64_t> bytes =
        CheckedNumBytes(tensor->properties.dtype, tensor->size);
    DCP_FUZZ_CHECK(bytes.has_value(),
                   "a tensor's shape overflows its byte count");
    if (*bytes > budget) continue;
    budget -= *bytes;
    state_dict.emplace(fqn,
                       Tensor::Empty(tensor->properties.dtype, tensor->size));
  }
  const absl::Status loaded = LoadOneRank(reader, *metadata, state_dict);
  if (Verbose()) std::fprintf(stderr, "load: %s\n", loaded.ToString().c_str());
}

}  // namespace dcp::fuzz
