// Encoding of non-tensor state dict leaves (the seed's BytesIO items) into
// the bytes stored in a checkpoint. This layout is part of the on-disk format
// (docs/FORMAT.md, format "dcp-1"): never change a tag's meaning, only add
// tags.
//
// Layout: one tag byte, then the payload; the payload fills the rest of the
// item exactly.
//
//   tag 0x00 none    payload: empty
//   tag 0x01 int     payload: 8 bytes, two's complement int64, little-endian
//   tag 0x02 float   payload: 8 bytes, IEEE-754 binary64, little-endian
//   tag 0x03 bool    payload: 1 byte, 0x00 (false) or 0x01 (true)
//   tag 0x04 string  payload: the string's bytes (no terminator, no length)
//   tag 0x05 bytes   payload: the raw bytes (no length)
//
// The item length recorded in the metadata delimits the payload, so strings
// and bytes carry no length prefix.
#ifndef DCP_PLANNER_VALUE_CODEC_H_
#define DCP_PLANNER_VALUE_CODEC_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/state_dict.h"

namespace dcp {

enum class ValueTag : uint8_t {
  kNone = 0x00,
  kInt = 0x01,
  kDouble = 0x02,
  kBool = 0x03,
  kString = 0x04,
  kBytes = 0x05,
};

// Encodes a plain leaf (none, int, float, bool, string, bytes).
// kInvalidArgument for tensors, sharded tensors and containers.
absl::StatusOr<std::string> EncodeValue(const StateValue& value);

// The exact number of bytes EncodeValue produces for `value` (same errors).
absl::StatusOr<int64_t> EncodedValueSize(const StateValue& value);

// Decodes bytes written by EncodeValue. kDataLoss for an empty input, an
// unknown tag, a payload of the wrong length, or a bool byte other than 0/1.
// Never reads outside `bytes`.
absl::StatusOr<StateValue> DecodeValue(absl::string_view bytes);

}  // namespace dcp

#endif  // DCP_PLANNER_VALUE_CODEC_H_
