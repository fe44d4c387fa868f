// Fuzz target: the write-results codec (engine/internal/write_results_codec.h
// DecodeWriteResults), which decodes what each rank reports to the
// coordinator after writing its data: the storage locations the committed
// metadata will record.
//
// Invariants: decoding never crashes and fails only with kDataLoss; what it
// returns re-encodes (EncodeWriteResults) to bytes that decode to the same
// results, and encoding is a fixed point after one round.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/internal/write_results_codec.h"
#include "fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using dcp::WriteResult;
  absl::StatusOr<std::vector<WriteResult>> results =
      dcp::internal::DecodeWriteResults(dcp::fuzz::AsBytes(data, size));
  if (!results.ok()) {
    dcp::fuzz::CheckDecodeError(results.status());
    return 0;
  }
  const std::string encoded = dcp::internal::EncodeWriteResults(*results);
  absl::StatusOr<std::vector<WriteResult>> again =
      dcp::internal::DecodeWriteResults(encoded);
  DCP_FUZZ_CHECK(again.ok(), "re-encoded write results do not decode");
  DCP_FUZZ_CHECK(again->size() == results->size(),
                 "re-encoded write results decode to another count");
  for (size_t i = 0; i < results->size(); ++i) {
    const WriteResult& a = (*results)[i];
    const WriteResult& b = (*again)[i];
    DCP_FUZZ_CHECK(a.index == b.index && a.size_in_bytes == b.size_in_bytes &&
                       a.storage_data == b.storage_data,
                   "re-encoded write results decode to other values");
  }
  DCP_FUZZ_CHECK(dcp::internal::EncodeWriteResults(*again) == encoded,
                 "encoding is not a fixed point after one round");
  return 0;
}
