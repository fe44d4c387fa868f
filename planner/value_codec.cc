#include "planner/value_codec.h"

#include <cstring>

#include "absl/base/internal/endian.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dcp {
namespace {

constexpr size_t kFixedPayload = 8;

std::string TaggedFixed64(ValueTag tag, uint64_t bits) {
  std::string out(1 + kFixedPayload, '\0');
  out[0] = static_cast<char>(tag);
  absl::little_endian::Store64(out.data() + 1, bits);
  return out;
}

std::string Tagged(ValueTag tag, absl::string_view payload) {
  std::string out;
  out.reserve(1 + payload.size());
  out.push_back(static_cast<char>(tag));
  out.append(payload.data(), payload.size());
  return out;
}

absl::Status WrongLength(absl::string_view what, size_t want, size_t got) {
  return absl::DataLossError(absl::StrCat("stored ", what, " value has ", got,
                                          " payload bytes, expected ", want,
                                          "; the item is corrupt"));
}

}  // namespace

absl::StatusOr<std::string> EncodeValue(const StateValue& value) {
  switch (value.kind()) {
    case StateValue::Kind::kNone:
      return Tagged(ValueTag::kNone, "");
    case StateValue::Kind::kInt:
      return TaggedFixed64(ValueTag::kInt,
                           static_cast<uint64_t>(value.int_value()));
    case StateValue::Kind::kDouble: {
      const double d = value.double_value();
      uint64_t bits;
      std::memcpy(&bits, &d, sizeof(bits));
      return TaggedFixed64(ValueTag::kDouble, bits);
    }
    case StateValue::Kind::kBool:
      return Tagged(ValueTag::kBool, value.bool_value()
                                         ? absl::string_view("\x01", 1)
                                         : absl::string_view("\x00", 1));
    case StateValue::Kind::kString:
      return Tagged(ValueTag::kString, value.string_value());
    case StateValue::Kind::kBytes:
      return Tagged(ValueTag::kBytes, value.bytes_value().data);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("cannot encode a ", StateKindName(value.kind()),
                       " as a plain value"));
  }
}

absl::StatusOr<int64_t> EncodedValueSize(const StateValue& value) {
  switch (value.kind()) {
    case StateValue::Kind::kNone:
      return 1;
    case StateValue::Kind::kInt:
    case StateValue::Kind::kDouble:
      return 1 + kFixedPayload;
    case StateValue::Kind::kBool:
      return 2;
    case StateValue::Kind::kString:
      return 1 + static_cast<int64_t>(value.string_value().size());
    case StateValue::Kind::kBytes:
      return 1 + static_cast<int64_t>(value.bytes_value().data.size());
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("cannot encode a ", StateKindName(value.kind()),
                       " as a plain value"));
  }
}

absl::StatusOr<StateValue> DecodeValue(absl::string_view bytes) {
  if (bytes.empty()) {
    return absl::DataLossError(
        "stored value is empty (no type tag); the item is corrupt");
  }
  const uint8_t tag = static_cast<uint8_t>(bytes[0]);
  const absl::string_view payload = bytes.substr(1);
  switch (static_cast<ValueTag>(tag)) {
    case ValueTag::kNone:
      if (!payload.empty()) return WrongLength("none", 0, payload.size());
      return StateValue();
    case ValueTag::kInt:
      if (payload.size() != kFixedPayload) {
        return WrongLength("int", kFixedPayload, payload.size());
      }
      return StateValue(
          static_cast<int64_t>(absl::little_endian::Load64(payload.data())));
    case ValueTag::kDouble: {
      if (payload.size() != kFixedPayload) {
        return WrongLength("float", kFixedPayload, payload.size());
      }
      const uint64_t bits = absl::little_endian::Load64(payload.data());
      double d;
      std::memcpy(&d, &bits, sizeof(d));
      return StateValue(d);
    }
    case ValueTag::kBool:
      if (payload.size() != 1) return WrongLength("bool", 1, payload.size());
      if (payload[0] != 0 && payload[0] != 1) {
        return absl::DataLossError(
            absl::StrCat("stored bool value has byte ",
                         static_cast<int>(static_cast<uint8_t>(payload[0])),
                         ", expected 0 or 1; the item is corrupt"));
      }
      return StateValue(payload[0] == 1);
    case ValueTag::kString:
      return StateValue(std::string(payload));
    case ValueTag::kBytes:
      return StateValue(Bytes{std::string(payload)});
  }
  return absl::DataLossError(
      absl::StrCat("stored value has unknown type tag ", tag,
                   "; the item is corrupt or from a newer format"));
}

}  // namespace dcp
