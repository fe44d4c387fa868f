// Element types of stored tensors: every safetensors dtype, with the names
// safetensors uses, so a checkpoint can be read by any safetensors reader.
#ifndef DCP_CORE_DTYPE_H_
#define DCP_CORE_DTYPE_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dcp {

// The numeric values are part of the on-disk format (docs/FORMAT.md): never
// renumber, only append.
enum class DType : uint8_t {
  kBool = 0,
  kU8 = 1,
  kI8 = 2,
  kU16 = 3,
  kI16 = 4,
  kU32 = 5,
  kI32 = 6,
  kU64 = 7,
  kI64 = 8,
  kF16 = 9,
  kBF16 = 10,
  kF32 = 11,
  kF64 = 12,
  kF8E4M3 = 13,
  kF8E5M2 = 14,
  kC64 = 15,
  kC128 = 16,
};

inline constexpr int kNumDTypes = 17;

// Bytes per element (kC64 is two F32, so 8).
size_t ElementSize(DType dtype);

// The safetensors name: "BOOL", "U8", ..., "F8_E4M3", "C64".
absl::string_view DTypeName(DType dtype);

// Parses a safetensors name (exact, upper case). kInvalidArgument otherwise.
absl::StatusOr<DType> DTypeFromName(absl::string_view name);

// Converts the stored numeric value; kDataLoss for values out of range (a
// corrupt or newer metadata file).
absl::StatusOr<DType> DTypeFromCode(uint32_t code);

}  // namespace dcp

#endif  // DCP_CORE_DTYPE_H_
