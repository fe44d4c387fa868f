// Fuzz target: planner/plan_codec.h, the messages ranks exchange (flatten
// mapping, save planner data, save and load plans). Every input goes to
// each of the four decoders: protobuf decodes most byte strings as several
// message types, so one corpus of real encodings serves all four.
//
// Invariants, per decoder: decoding never crashes, fails only with
// kDataLoss and allocates within libFuzzer's -malloc_limit_mb (the codec
// bounds allocation by the input's size); what it returns encodes to bytes
// that decode again, and decode(encode(decode(x))) encodes to the same bytes
// (a fixed point after one round).
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_check.h"
#include "planner/plan_codec.h"

namespace dcp::fuzz {
namespace {

template <typename T>
void CheckRoundTrip(absl::string_view bytes,
                    absl::StatusOr<T> (*decode)(absl::string_view),
                    std::string (*encode)(const T&), const char* what) {
  absl::StatusOr<T> decoded = decode(bytes);
  CheckDecodeError(decoded.status());
  if (!decoded.ok()) return;
  const std::string encoded = encode(*decoded);
  absl::StatusOr<T> again = decode(encoded);
  if (!again.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, again.status().ToString().c_str());
  }
  DCP_FUZZ_CHECK(again.ok(), "an encoding of a decoded value does not decode");
  DCP_FUZZ_CHECK(encode(*again) == encoded,
                 "decode(encode(decode(x))) encodes differently");
}

}  // namespace
}  // namespace dcp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using dcp::fuzz::CheckRoundTrip;
  const absl::string_view bytes = dcp::fuzz::AsBytes(data, size);
  CheckRoundTrip(bytes, &dcp::DecodeFlattenMapping, &dcp::EncodeFlattenMapping,
                 "flatten mapping");
  CheckRoundTrip(bytes, &dcp::DecodeSavePlannerData,
                 &dcp::EncodeSavePlannerData, "save planner data");
  CheckRoundTrip(bytes, &dcp::DecodeSavePlan, &dcp::EncodeSavePlan,
                 "save plan");
  CheckRoundTrip(bytes, &dcp::DecodeLoadPlan, &dcp::EncodeLoadPlan,
                 "load plan");
  return 0;
}
