// Fuzz target: the sharding information of a Hugging Face file saved by a
// distributed save (`__metadata__["DCP_SHARDING_INFO"]`, {"fqn":
// {"saved_offsets": [...]}}), which places each chunk in its tensor, and
// the load that copies chunks by those offsets.
//
// Each input is that JSON text. The scratch directory holds two safetensors
// files with the same tensors ("w" F32 [2, 3], "v" U8 [4]): shard 0 at
// offsets 0, shard 1 with the input as its sharding information (a seed
// places it after shard 0 along dimension 0).
//
// Invariants: the reader never crashes and fails only with a decoder's
// error (ReadAndLoadHfCheckpoint); what it reads describes tensors whose byte
// counts do not overflow, and a load into tensors of those shapes does not
// crash or touch memory outside them.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/fuzz_check.h"
#include "fuzz/hf_fixture.h"
#include "fuzz/scratch.h"
#include "io/file_system.h"
#include "io/hf_storage.h"

namespace dcp::fuzz {
namespace {

const std::vector<SafetensorsTensor>& Tensors() {
  static const auto* tensors = new std::vector<SafetensorsTensor>{
      {"w", DType::kF32, {2, 3}}, {"v", DType::kU8, {4}}};
  return *tensors;
}

const std::string& CheckpointDir() {
  static const std::string* dir = [] {
    const std::string& scratch = GetScratch().dir;
    WriteWholeFile(
        JoinPath(scratch, "shard-0.safetensors"),
        SafetensorsFileOf(Tensors(), {{kHfShardingInfoKey,
                                       R"({"w":{"saved_offsets":[0,0]},)"
                                       R"("v":{"saved_offsets":[0]}})"}}));
    return new std::string(scratch);
  }();
  return *dir;
}

void CheckShardingInfo(absl::string_view info) {
  const std::string& dir = CheckpointDir();
  const std::string file =
      SafetensorsFileOf(Tensors(), {{kHfShardingInfoKey, std::string(info)}});
  if (file.empty()) return;  // Not valid UTF-8: no header holds it.
  WriteWholeFile(JoinPath(dir, "shard-1.safetensors"), file);
  ReadAndLoadHfCheckpoint(dir);
}

}  // namespace
}  // namespace dcp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dcp::fuzz::CheckShardingInfo(dcp::fuzz::AsBytes(data, size));
  return 0;
}
