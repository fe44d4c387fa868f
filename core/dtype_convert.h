// Converting floating-point elements between F64, F32, BF16 and F16 as
// torch's copy_ does on the CPU: a narrowing rounds to nearest even
// (F64 to BF16 or F16 narrows through F32 first, as torch's casts do),
// widening is exact, infinities stay infinities and NaN stays NaN (its
// payload is not kept). Used by loads into a tensor of another dtype than
// the saved one and by `dcp convert`. Pure functions; thread-safe.
#ifndef DCP_CORE_DTYPE_CONVERT_H_
#define DCP_CORE_DTYPE_CONVERT_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace dcp {

// F64, F32, BF16 or F16.
bool IsConvertibleFloat(DType dtype);

// Float to bf16 / f16 bits, rounding to nearest even (NaN stays NaN), bit
// for bit as the hardware's conversions (F16C's vcvtps2ph) where NaN is not
// involved.
uint16_t FloatToBf16(float value);
uint16_t FloatToF16(float value);

// F16 bits to float (exact).
float F16ToFloat(uint16_t bits);

// Converts `n` contiguous elements of `from` at `src` into `n` contiguous
// elements of `to` at `dst` (both IsConvertibleFloat; the same dtype
// copies). The ranges must not overlap.
void ConvertElements(const std::byte* src, DType from, int64_t n,
                     std::byte* dst, DType to);

// Converts the contiguous row-major array `src` of `from` elements, shaped
// as `dst`, into host view `dst` (any strides, its own dtype).
// kInvalidArgument when either dtype is not IsConvertibleFloat or `dst` is
// not host memory.
absl::Status ConvertInto(const std::byte* src, DType from,
                         const TensorView& dst);

}  // namespace dcp

#endif  // DCP_CORE_DTYPE_CONVERT_H_
