#include "core/dtype.h"

#include <array>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dcp {
namespace {

struct DTypeInfo {
  absl::string_view name;
  size_t size;
};

constexpr std::array<DTypeInfo, kNumDTypes> kInfo = {{
    {"BOOL", 1},       {"U8", 1},          {"I8", 1},          {"U16", 2},
    {"I16", 2},        {"U32", 4},         {"I32", 4},         {"U64", 8},
    {"I64", 8},        {"F16", 2},         {"BF16", 2},        {"F32", 4},
    {"F64", 8},        {"F8_E4M3", 1},     {"F8_E5M2", 1},     {"C64", 8},
    {"C128", 16},      {"F8_E4M3FNUZ", 1}, {"F8_E5M2FNUZ", 1}, {"F8_E8M0", 1},
    {"F4_E2M1_X2", 1}, {"C32", 4},
}};

}  // namespace

size_t ElementSize(DType dtype) {
  return kInfo[static_cast<size_t>(dtype)].size;
}

absl::string_view DTypeName(DType dtype) {
  return kInfo[static_cast<size_t>(dtype)].name;
}

bool InSafetensors(DType dtype) {
  return dtype != DType::kC128 && dtype != DType::kC32 &&
         dtype != DType::kF4E2M1X2;
}

absl::StatusOr<DType> DTypeFromName(absl::string_view name) {
  for (size_t i = 0; i < kInfo.size(); ++i) {
    if (kInfo[i].name == name) return static_cast<DType>(i);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype \"", name,
                   "\"; expected a safetensors name such as F32, BF16, I64"));
}

absl::StatusOr<DType> DTypeFromCode(uint32_t code) {
  if (code >= static_cast<uint32_t>(kNumDTypes)) {
    return absl::DataLossError(absl::StrCat(
        "dtype code ", code, " is not known to this version of dcp"));
  }
  return static_cast<DType>(code);
}

}  // namespace dcp
