// Block-scaled fp8 dequantization on the CPU, as DeepSeek-V3 style
// checkpoints store weights: an F8_E4M3 tensor `W` plus an F32 tensor
// `W_scale_inv` holding one scale per block x block tile of W's last two
// dimensions (edge tiles clipped; leading dimensions, as in stacked expert
// tensors, are not blocked), so that
//
//   value[..., r, c] = float(W[..., r, c]) * scale[..., r / block, c / block]
//
// A 1-D W is blocked along its one dimension (scale shape [ceil(n/block)]).
// Pure functions; thread-safe.
#ifndef DCP_IO_QUANTIZED_DEQUANT_H_
#define DCP_IO_QUANTIZED_DEQUANT_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace dcp {

// The float value of every F8_E4M3 byte (the "FN" variant: no infinities,
// 0x7f and 0xff are NaN, the largest finite value 448). 256 entries.
const float* Fp8E4M3Table();

// The shape the scale tensor of an F8_E4M3 tensor of shape `weight` must
// have: the weight's shape with its last two dimensions (its one dimension
// for 1-D) replaced by ceil(dim / block). kInvalidArgument for a 0-d weight
// or block < 1.
absl::StatusOr<Shape> Fp8ScaleShape(const Shape& weight, int64_t block);

// Whether Dequantize* can produce `dtype` (F32, BF16, F16).
bool IsDequantTarget(DType dtype);

// Float to bf16 / f16 bits, rounding to nearest even (NaN stays NaN).
uint16_t FloatToBf16(float value);
uint16_t FloatToF16(float value);

// Dequantizes one row of `n` fp8 bytes `in` whose first element sits at
// column `col0` of the weight: out[j] = table[in[j]] * scale_row[(col0 + j)
// / block], written as `dtype` (IsDequantTarget) to contiguous `out`.
// `scale_row` is the row of scales that covers this weight row.
void DequantizeFp8Row(const uint8_t* in, int64_t n, int64_t col0,
                      const float* scale_row, int64_t block, DType dtype,
                      void* out);

}  // namespace dcp

#endif  // DCP_IO_QUANTIZED_DEQUANT_H_
