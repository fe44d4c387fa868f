#include "core/dtype_convert.h"

#include <bit>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "absl/strings/str_cat.h"

namespace dcp {
namespace {

// The bits of a T at `p` (unaligned).
template <typename T>
T LoadBits(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void StoreBits(T v, std::byte* p) {
  std::memcpy(p, &v, sizeof(T));
}

// Element<D>: Wide, the type D's values convert through; Load and Store.
template <DType D>
struct Element;
template <>
struct Element<DType::kF64> {
  using Wide = double;
  static double Load(const std::byte* p) { return LoadBits<double>(p); }
  static void Store(double v, std::byte* p) { StoreBits(v, p); }
};
template <>
struct Element<DType::kF32> {
  using Wide = float;
  static float Load(const std::byte* p) { return LoadBits<float>(p); }
  static void Store(float v, std::byte* p) { StoreBits(v, p); }
};
template <>
struct Element<DType::kBF16> {
  using Wide = float;
  static float Load(const std::byte* p) {
    return std::bit_cast<float>(uint32_t{LoadBits<uint16_t>(p)} << 16);
  }
  static void Store(float v, std::byte* p) { StoreBits(FloatToBf16(v), p); }
};
template <>
struct Element<DType::kF16> {
  using Wide = float;
  static float Load(const std::byte* p) {
    return F16ToFloat(LoadBits<uint16_t>(p));
  }
  static void Store(float v, std::byte* p) { StoreBits(FloatToF16(v), p); }
};

// `n` elements, `src_step` / `dst_step` bytes apart. A narrowing to a
// 16-bit type from F64 goes through float (Store takes a float).
template <DType From, DType To>
void ConvertRun(const std::byte* src, int64_t src_step, int64_t n,
                std::byte* dst, int64_t dst_step) {
  using Out = typename Element<To>::Wide;
  for (int64_t i = 0; i < n; ++i) {
    Element<To>::Store(
        static_cast<Out>(Element<From>::Load(src + i * src_step)),
        dst + i * dst_step);
  }
}

#if defined(__x86_64__)
bool HasF16c() {
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) &&
           (c & bit_F16C) != 0;
  }();
  return has;
}

bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

// BF16 <-> F32 8 elements at a time, bit for bit as Element<kBF16>.
__attribute__((target("avx2"))) int64_t Bf16ToF32Vector(const std::byte* src,
                                                        int64_t n,
                                                        std::byte* dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 4 * i),
                        _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  return i;
}

__attribute__((target("avx2"))) int64_t F32ToBf16Vector(const std::byte* src,
                                                        int64_t n,
                                                        std::byte* dst) {
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i half = _mm256_set1_epi32(0x7fff);
  const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
  const __m256i infinity = _mm256_set1_epi32(0x7f800000);
  const __m256i quiet = _mm256_set1_epi32(0x40);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i bits =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 4 * i));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), one);
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(bits, half), lsb), 16);
    const __m256i nan =
        _mm256_cmpgt_epi32(_mm256_and_si256(bits, magnitude), infinity);
    const __m256i out = _mm256_blendv_epi8(
        rounded, _mm256_or_si256(_mm256_srli_epi32(bits, 16), quiet), nan);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i),
                     _mm_packus_epi32(_mm256_castsi256_si128(out),
                                      _mm256_extracti128_si256(out, 1)));
  }
  return i;
}

// The hardware's F16 conversions (round to nearest even, as the scalar
// _Float16 casts), 8 elements at a time; the elements done.
__attribute__((target("avx,f16c"))) int64_t F16ToF32Vector(const std::byte* src,
                                                           int64_t n,
                                                           std::byte* dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    _mm256_storeu_ps(reinterpret_cast<float*>(dst + 4 * i), _mm256_cvtph_ps(h));
  }
  return i;
}

__attribute__((target("avx,f16c"))) int64_t F32ToF16Vector(const std::byte* src,
                                                           int64_t n,
                                                           std::byte* dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v =
        _mm256_loadu_ps(reinterpret_cast<const float*>(src + 4 * i));
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(dst + 2 * i),
        _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  return i;
}
#endif

using RunFn = void (*)(const std::byte*, int64_t, int64_t, std::byte*, int64_t);

template <DType From>
RunFn RunTo(DType to) {
  switch (to) {
    case DType::kF64:
      return &ConvertRun<From, DType::kF64>;
    case DType::kF32:
      return &ConvertRun<From, DType::kF32>;
    case DType::kBF16:
      return &ConvertRun<From, DType::kBF16>;
    default:
      return &ConvertRun<From, DType::kF16>;
  }
}

RunFn Run(DType from, DType to) {
  switch (from) {
    case DType::kF64:
      return RunTo<DType::kF64>(to);
    case DType::kF32:
      return RunTo<DType::kF32>(to);
    case DType::kBF16:
      return RunTo<DType::kBF16>(to);
    default:
      return RunTo<DType::kF16>(to);
  }
}

}  // namespace

uint16_t FloatToBf16(float value) {
  // Branch-free (a select), so the row loops vectorise.
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x40u;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan
                                                                  : rounded);
}

uint16_t FloatToF16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {  // NaN: quiet, the payload's top bits.
    return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  }
  // From halfway between 65504 and the next step (a tie that rounds up to
  // even): infinity.
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  uint32_t result = 0;
  uint32_t rest = 0, half = 0;
  if (magnitude < 0x38800000u) {  // Under 2^-14: an f16 subnormal or zero.
    if (magnitude <= 0x33000000u) return static_cast<uint16_t>(sign);
    // The value in units of 2^-24, the f16 subnormal step.
    const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - (magnitude >> 23);  // 14 to 24
    result = mantissa >> shift;
    rest = mantissa & ((1u << shift) - 1);
    half = 1u << (shift - 1);
  } else {  // Rebias the exponent (127 to 15), keep 10 mantissa bits.
    result = (magnitude >> 13) - (112u << 10);
    rest = magnitude & 0x1fffu;
    half = 0x1000u;
  }
  // Round to nearest even; a carry moves into the exponent as it should.
  if (rest > half || (rest == half && (result & 1u))) ++result;
  return static_cast<uint16_t>(sign | result);
}

float F16ToFloat(uint16_t bits) {
  const uint32_t sign = uint32_t{bits & 0x8000u} << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) {  // Infinity or NaN.
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  }
  if (exponent == 0) {  // Zero or subnormal: mantissa * 2^-24, exact.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign != 0 ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) |
                              (mantissa << 13));
}

bool IsConvertibleFloat(DType dtype) {
  return dtype == DType::kF64 || dtype == DType::kF32 ||
         dtype == DType::kBF16 || dtype == DType::kF16;
}

void ConvertElements(const std::byte* src, DType from, int64_t n,
                     std::byte* dst, DType to) {
  if (from == to) {
    std::memcpy(dst, src, static_cast<size_t>(n) * ElementSize(from));
    return;
  }
  const int64_t in = static_cast<int64_t>(ElementSize(from));
  const int64_t out = static_cast<int64_t>(ElementSize(to));
  int64_t done = 0;
#if defined(__x86_64__)
  if (HasF16c() && from == DType::kF16 && to == DType::kF32) {
    done = F16ToF32Vector(src, n, dst);
  } else if (HasF16c() && from == DType::kF32 && to == DType::kF16) {
    done = F32ToF16Vector(src, n, dst);
  } else if (HasAvx2() && from == DType::kBF16 && to == DType::kF32) {
    done = Bf16ToF32Vector(src, n, dst);
  } else if (HasAvx2() && from == DType::kF32 && to == DType::kBF16) {
    done = F32ToBf16Vector(src, n, dst);
  }
#endif
  Run(from, to)(src + done * in, in, n - done, dst + done * out, out);
}

absl::Status ConvertInto(const std::byte* src, DType from,
                         const TensorView& dst) {
  if (!IsConvertibleFloat(from) || !IsConvertibleFloat(dst.dtype())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot convert ", DTypeName(from), " to ", DTypeName(dst.dtype()),
        ": only F64, F32, BF16 and F16 convert"));
  }
  if (!dst.device().is_cpu()) {
    return absl::InvalidArgumentError(
        "converting into a device tensor: host memory only");
  }
  const int64_t numel = dst.numel();
  if (numel == 0) return absl::OkStatus();
  auto* out = static_cast<std::byte*>(dst.data());
  const int64_t in_size = static_cast<int64_t>(ElementSize(from));
  const int64_t out_size = static_cast<int64_t>(ElementSize(dst.dtype()));
  if (dst.is_contiguous()) {
    ConvertElements(src, from, numel, out, dst.dtype());
    return absl::OkStatus();
  }
  // Row by row along the last dimension; `index` counts the rows in
  // row-major order over the leading dimensions.
  const RunFn run = Run(from, dst.dtype());
  const Shape& sizes = dst.sizes();
  const Shape& strides = dst.strides();
  const int64_t rank = dst.dim();
  const int64_t row = rank == 0 ? 1 : sizes.back();
  const int64_t row_step = rank == 0 ? 0 : strides.back() * out_size;
  Shape index(rank > 0 ? rank - 1 : 0, 0);
  for (int64_t done = 0; done < numel; done += row) {
    int64_t offset = 0;
    for (size_t d = 0; d < index.size(); ++d) offset += index[d] * strides[d];
    if (row_step == out_size) {  // A contiguous row.
      ConvertElements(src + done * in_size, from, row, out + offset * out_size,
                      dst.dtype());
    } else {
      run(src + done * in_size, in_size, row, out + offset * out_size,
          row_step);
    }
    for (int64_t d = static_cast<int64_t>(index.size()) - 1; d >= 0; --d) {
      if (++index[d] < sizes[d]) break;
      index[d] = 0;
    }
  }
  return absl::OkStatus();
}

}  // namespace dcp
