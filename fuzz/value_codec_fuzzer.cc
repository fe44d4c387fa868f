// Fuzz target: planner/value_codec.h DecodeValue, which decodes the stored
// bytes of a non-tensor value read from a checkpoint's data file.
//
// Invariants: decoding never crashes and fails only with kDataLoss; the
// encoding is canonical, so a decoded value encodes back to exactly the
// input, and EncodedValueSize agrees.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_check.h"
#include "planner/value_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes = dcp::fuzz::AsBytes(data, size);
  absl::StatusOr<dcp::StateValue> value = dcp::DecodeValue(bytes);
  dcp::fuzz::CheckDecodeError(value.status());
  if (!value.ok()) return 0;
  absl::StatusOr<std::string> encoded = dcp::EncodeValue(*value);
  DCP_FUZZ_CHECK(encoded.ok(), "a decoded value does not encode");
  DCP_FUZZ_CHECK(*encoded == bytes, "decode then encode changed the bytes");
  absl::StatusOr<int64_t> encoded_size = dcp::EncodedValueSize(*value);
  DCP_FUZZ_CHECK(encoded_size.ok() && *encoded_size == int64_t(size),
                 "EncodedValueSize differs from the encoding's size");
  return 0;
}
