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
  kF8E4M3FNUZ = 17,
  kF8E5M2FNUZ = 18,
  kF8E8M0 = 19,  // torch.float8_e8m0fnu (MX block scales)
  // torch.float4_e2m1fn_x2 (NVFP4): two 4-bit values per byte; shapes
  // and element counts are of the packed bytes, as in torch.
  kF4E2M1X2 = 20,
  kC32 = 21,  // two F16 (torch.complex32)
};

inline constexpr int kNumDTypes = 22;

// Bytes per element (kC64 is two F32, so 8; kF4E2M1X2 1 per packed pair).
size_t ElementSize(DType dtype);

// The safetensors name: "BOOL", "U8", ..., "F8_E4M3", "C64", "F8_E8M0";
// for the dtypes safetensors lacks (InSafetensors) dcp's own: "C128",
// "C32", "F4_E2M1_X2" (safetensors' "F4" counts 4-bit elements, not bytes).
absl::string_view DTypeName(DType dtype);

// Whether a safetensors file can hold `dtype` under DTypeName's name (not
// C128, C32 or F4_E2M1_X2).
bool InSafetensors(DType dtype);

// Parses a safetensors name (exact, upper case). kInvalidArgument otherwise.
absl::StatusOr<DType> DTypeFromName(absl::string_view name);

// Converts the stored numeric value; kDataLoss for values out of range (a
// corrupt or newer metadata file).
absl::StatusOr<DType> DTypeFromCode(uint32_t code);

}  // namespace dcp

#endif  // DCP_CORE_DTYPE_H_
