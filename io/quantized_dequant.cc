#include "io/quantized_dequant.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace dcp {
namespace {

std::array<float, 256> MakeE4M3Table() {
  std::array<float, 256> table{};
  for (int b = 0; b < 256; ++b) {
    const int exponent = (b >> 3) & 0xf;
    const int mantissa = b & 0x7;
    float magnitude;
    if (exponent == 0xf && mantissa == 0x7) {
      magnitude = std::numeric_limits<float>::quiet_NaN();
    } else if (exponent == 0) {
      magnitude = std::ldexp(static_cast<float>(mantissa), -9);  // m/8 2^-6
    } else {
      magnitude = std::ldexp(1.0f + mantissa / 8.0f, exponent - 7);
    }
    table[b] = (b & 0x80) != 0 ? -magnitude : magnitude;
  }
  return table;
}

// Each target's inner loop over one block-wide run of the row, so that the
// compiler sees a loop with one scale and no branches.
template <typename Convert, typename Out>
void RowLoop(const uint8_t* in, int64_t n, int64_t col0, const float* scales,
             int64_t block, Out* out, Convert convert) {
  const float* table = Fp8E4M3Table();
  int64_t j = 0;
  while (j < n) {
    const int64_t col = col0 + j;
    const float scale = scales[col / block];
    const int64_t run = std::min(n - j, block - col % block);
    const uint8_t* src = in + j;
    Out* dst = out + j;
    for (int64_t k = 0; k < run; ++k) dst[k] = convert(table[src[k]] * scale);
    j += run;
  }
}

}  // namespace

const float* Fp8E4M3Table() {
  static const std::array<float, 256> table = MakeE4M3Table();
  return table.data();
}

absl::StatusOr<Shape> Fp8ScaleShape(const Shape& weight, int64_t block) {
  if (block < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the block size must be positive, not ", block));
  }
  if (weight.empty()) {
    return absl::InvalidArgumentError("a 0-d tensor has no blocks to scale");
  }
  Shape scale = weight;
  const size_t first = weight.size() >= 2 ? weight.size() - 2 : 0;
  for (size_t d = first; d < weight.size(); ++d) {
    scale[d] = (weight[d] + block - 1) / block;
  }
  return scale;
}

bool IsDequantTarget(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
}

uint16_t FloatToBf16(float value) {
  // Branch-free (a select), so the row loops vectorise.
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x40u;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan
                                                                  : rounded);
}

uint16_t FloatToF16(float value) {
  return std::bit_cast<uint16_t>(static_cast<_Float16>(value));
}

void DequantizeFp8Row(const uint8_t* in, int64_t n, int64_t col0,
                      const float* scale_row, int64_t block, DType dtype,
                      void* out) {
  switch (dtype) {
    case DType::kF32:
      RowLoop(in, n, col0, scale_row, block, static_cast<float*>(out),
              [](float v) { return v; });
      return;
    case DType::kBF16:
      RowLoop(in, n, col0, scale_row, block, static_cast<uint16_t*>(out),
              [](float v) { return FloatToBf16(v); });
      return;
    case DType::kF16:
      RowLoop(in, n, col0, scale_row, block, static_cast<uint16_t*>(out),
              [](float v) {
                return std::bit_cast<uint16_t>(static_cast<_Float16>(v));
              });
      return;
    default:
      return;  // Callers check IsDequantTarget.
  }
}

}  // namespace dcp
