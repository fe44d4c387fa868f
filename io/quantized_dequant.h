// Block-scaled fp8 dequantization on the CPU, as DeepSeek-V3 style
// checkpoints store weights: an F8_E4M3 tensor `W` plus an F32 tensor
// `W_scale_inv` holding one scale per block x block tile of W's last two
// dimensions (edge tiles clipped; leading dimensions, as in stacked expert
// tensors, are not blocked), so that
//
//   value[..., r, c] = float(W[..., r, c]) * scale[..., r / block, c / block]
//
// A 1-D W is blocked along its one dimension (scale shape [ceil(n/block)]).
// The row arithmetic (Fp8E4M3Table, FloatToBf16/F16, DequantizeFp8Row) is
// core/fp8_dequant_row.h, included here. Pure functions; thread-safe.
#ifndef DCP_IO_QUANTIZED_DEQUANT_H_
#define DCP_IO_QUANTIZED_DEQUANT_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/fp8_dequant_row.h"
#include "core/tensor.h"

namespace dcp {

// The shape the scale tensor of an F8_E4M3 tensor of shape `weight` must
// have: the weight's shape with its last two dimensions (its one dimension
// for 1-D) replaced by ceil(dim / block). kInvalidArgument for a 0-d weight
// or block < 1.
absl::StatusOr<Shape> Fp8ScaleShape(const Shape& weight, int64_t block);

}  // namespace dcp

#endif  // DCP_IO_QUANTIZED_DEQUANT_H_
