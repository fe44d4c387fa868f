// Fuzz target: the index of a Hugging Face checkpoint
// (model.safetensors.index.json: io/hf_storage.h ResolveHfCheckpointFiles),
// which names the files a load opens and maps each tensor to one, and the
// metadata the reader builds from it and the files' headers.
//
// Each input is the index file, placed in a scratch directory beside two
// fixed safetensors files (model-00001-of-00002: "a" F32 [2, 3] and "b"
// BF16 [4]; model-00002-of-00002: "c" I64 [3]).
//
// Invariants: resolving never crashes and fails only with kDataLoss; what it
// returns are plain file names, exactly the names the weight map uses; the
// reader then fails only with kDataLoss, kNotFound (a named file is missing)
// or kUnimplemented, and a load of what it reads does not crash.
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "fuzz/fuzz_check.h"
#include "fuzz/hf_fixture.h"
#include "fuzz/scratch.h"
#include "io/file_system.h"
#include "io/hf_storage.h"

namespace dcp::fuzz {
namespace {

const std::string& CheckpointDir() {
  static const std::string* dir = [] {
    const std::string& scratch = GetScratch().dir;
    WriteWholeFile(JoinPath(scratch, HfFileName(1, 2)),
                   SafetensorsFileOf(
                       {{"a", DType::kF32, {2, 3}}, {"b", DType::kBF16, {4}}},
                       {{"format", "pt"}}));
    WriteWholeFile(JoinPath(scratch, HfFileName(2, 2)),
                   SafetensorsFileOf({{"c", DType::kI64, {3}}}, {}));
    return new std::string(scratch);
  }();
  return *dir;
}

bool IsPlainName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

void CheckIndex(absl::string_view index) {
  const std::string& dir = CheckpointDir();
  WriteWholeFile(JoinPath(dir, kHfIndexFileName), index);
  std::map<std::string, std::string> weight_map;
  absl::StatusOr<std::vector<std::string>> files =
      ResolveHfCheckpointFiles(LocalFileSystem(), dir, &weight_map);
  if (Verbose()) {
    std::fprintf(stderr, "resolve: %s\n", files.status().ToString().c_str());
  }
  if (!files.ok()) {
    CheckDecodeError(files.status());
    return;
  }
  std::set<std::string> mapped;
  for (const auto& [fqn, file] : weight_map) mapped.insert(file);
  DCP_FUZZ_CHECK(std::set<std::string>(files->begin(), files->end()) == mapped,
                 "the files resolved differ from those the weight map names");
  for (const std::string& file : *files) {
    DCP_FUZZ_CHECK(IsPlainName(file), "a resolved file is not a plain name");
  }
  ReadAndLoadHfCheckpoint(dir);
}

}  // namespace
}  // namespace dcp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dcp::fuzz::CheckIndex(dcp::fuzz::AsBytes(data, size));
  return 0;
}
