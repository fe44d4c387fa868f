// Fuzz target: the MEGA index decoder (io/mega_format.h DecodeMegaIndex),
// which reads `model.mega.index.json`, the file mapping each value of a
// MEGA checkpoint to the shard files holding it.
//
// Invariants: decoding never crashes and fails only with kDataLoss or
// kUnimplemented (another major version); a decoded index lists plain MEGA
// shard file names only (never the index itself, never a path) and maps
// every value to a non-empty list of those; and EncodeMegaIndex of it
// decodes to an index that encodes to the same bytes.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/status/statusor.h"
#include "fuzz/fuzz_check.h"
#include "io/mega_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dcp;
  absl::StatusOr<MegaIndex> index =
      DecodeMegaIndex(fuzz::AsBytes(data, size), "fuzz.index.json");
  if (fuzz::Verbose()) {
    std::fprintf(stderr, "decode: %s\n", index.status().ToString().c_str());
  }
  if (absl::IsUnimplemented(index.status())) return 0;
  fuzz::CheckDecodeError(index.status());
  if (!index.ok()) return 0;
  for (const std::string& file : index->files) {
    DCP_FUZZ_CHECK(IsMegaCheckpointFileName(file) && file != kMegaIndexFileName,
                   "the index lists a file that is not a MEGA shard name");
  }
  for (const auto& [name, files] : index->weight_map) {
    DCP_FUZZ_CHECK(!files.empty(), "a value maps to no file");
    for (const std::string& file : files) {
      DCP_FUZZ_CHECK(std::find(index->files.begin(), index->files.end(),
                               file) != index->files.end(),
                     "a value maps to a file the index does not list");
    }
  }
  const std::string encoded = EncodeMegaIndex(*index);
  absl::StatusOr<MegaIndex> again = DecodeMegaIndex(encoded, "re-encoded");
  DCP_FUZZ_CHECK(again.ok(), "a re-encoded index does not decode");
  DCP_FUZZ_CHECK(again->files == index->files &&
                     again->weight_map == index->weight_map &&
                     again->total_size == index->total_size,
                 "decode(encode(i)) differs from i");
  DCP_FUZZ_CHECK(EncodeMegaIndex(*again) == encoded,
                 "encode(decode(encode(i))) differs from encode(i)");
  return 0;
}
