// Block-scaled fp8 arithmetic on the CPU: the E4M3 decode, float to
// bf16 / f16 rounding and the dequantization of one row, as DeepSeek-V3
// style checkpoints need it (io/quantized_dequant.h describes the layout).
// In core/ so that both the reader (io/) and the host runtime's twin of the
// device kernel (cuda/fp8_dequant.h) compute with the same code. Pure
// functions; thread-safe.
#ifndef DCP_CORE_FP8_DEQUANT_ROW_H_
#define DCP_CORE_FP8_DEQUANT_ROW_H_

#include <cstdint>

#include "core/dtype.h"
#include "core/dtype_convert.h"  // FloatToBf16, FloatToF16

namespace dcp {

// The float value of every F8_E4M3 byte (the "FN" variant: no infinities,
// 0x7f and 0xff are NaN, the largest finite value 448). 256 entries.
const float* Fp8E4M3Table();

// Whether DequantizeFp8Row can produce `dtype` (F32, BF16, F16).
bool IsDequantTarget(DType dtype);

// Dequantizes one row of `n` fp8 bytes `in` whose first element sits at
// column `col0` of the weight: out[j] = table[in[j]] * scale_row[(col0 + j)
// / block], written as `dtype` (IsDequantTarget) to contiguous `out`.
// `scale_row` is the row of scales that covers this weight row.
void DequantizeFp8Row(const uint8_t* in, int64_t n, int64_t col0,
                      const float* scale_row, int64_t block, DType dtype,
                      void* out);

}  // namespace dcp

#endif  // DCP_CORE_FP8_DEQUANT_ROW_H_
