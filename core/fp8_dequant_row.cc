#include "core/fp8_dequant_row.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

#if defined(__x86_64__)
// AVX2 + F16C: 8 elements per step (gather from the table, one multiply,
// the same round-to-nearest-even as FloatToBf16 / the hardware's f16
// conversion), chosen at run time; the scalar loop finishes the tail.
__attribute__((target("avx2,f16c"))) int64_t RunAvx2(const uint8_t* src,
                                                     int64_t run, float scale,
                                                     DType dtype, void* out,
                                                     const float* table) {
  const __m256 s = _mm256_set1_ps(scale);
  int64_t k = 0;
  for (; k + 8 <= run; k += 8) {
    const __m128i bytes =
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + k));
    const __m256 v = _mm256_mul_ps(
        _mm256_i32gather_ps(table, _mm256_cvtepu8_epi32(bytes), 4), s);
    if (dtype == DType::kF32) {
      _mm256_storeu_ps(static_cast<float*>(out) + k, v);
    } else if (dtype == DType::kF16) {
      _mm_storeu_si128(
          reinterpret_cast<__m128i*>(static_cast<uint16_t*>(out) + k),
          _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else {
      const __m256i bits = _mm256_castps_si256(v);
      const __m256i lsb =
          _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
      const __m256i rounded = _mm256_srli_epi32(
          _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)),
                           lsb),
          16);
      const __m256i quiet =
          _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
      const __m256i nan = _mm256_cmpgt_epi32(
          _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff)),
          _mm256_set1_epi32(0x7f800000));
      const __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);
      // 8 x u32 (each < 2^16) -> 8 x u16.
      const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r),
                                              _mm256_extracti128_si256(r, 1));
      _mm_storeu_si128(
          reinterpret_cast<__m128i*>(static_cast<uint16_t*>(out) + k), packed);
    }
  }
  return k;
}

bool HasAvx2() {
  static const bool has =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return has;
}
#endif

}  // namespace

const float* Fp8E4M3Table() {
  static const std::array<float, 256> table = MakeE4M3Table();
  return table.data();
}

bool IsDequantTarget(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
}

void DequantizeFp8Row(const uint8_t* in, int64_t n, int64_t col0,
                      const float* scale_row, int64_t block, DType dtype,
                      void* out) {
#if defined(__x86_64__)
  if (HasAvx2() && IsDequantTarget(dtype)) {
    const float* table = Fp8E4M3Table();
    const size_t es = ElementSize(dtype);
    int64_t j = 0;
    while (j < n) {
      const int64_t col = col0 + j;
      const float scale = scale_row[col / block];
      const int64_t run = std::min(n - j, block - col % block);
      std::byte* dst = static_cast<std::byte*>(out) + j * es;
      const int64_t done = RunAvx2(in + j, run, scale, dtype, dst, table);
      for (int64_t k = done; k < run; ++k) {
        const float v = table[in[j + k]] * scale;
        if (dtype == DType::kF32) {
          std::memcpy(dst + k * 4, &v, 4);
        } else {
          const uint16_t h =
              dtype == DType::kBF16 ? FloatToBf16(v) : FloatToF16(v);
          std::memcpy(dst + k * 2, &h, 2);
        }
      }
      j += run;
    }
    return;
  }
#endif
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
