#include "core/dtype_convert.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace dcp {
namespace {

std::vector<uint16_t> ToBf16(const std::vector<float>& in) {
  std::vector<uint16_t> out(in.size());
  ConvertElements(reinterpret_cast<const std::byte*>(in.data()), DType::kF32,
                  static_cast<int64_t>(in.size()),
                  reinterpret_cast<std::byte*>(out.data()), DType::kBF16);
  return out;
}

TEST(DtypeConvertTest, F32ToBf16RoundsToNearestEven) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> in = {
      1.0f,
      std::bit_cast<float>(0x3f808000u),  // Halfway, even below: down.
      std::bit_cast<float>(0x3f818000u),  // Halfway, odd below: up.
      std::bit_cast<float>(0x3f808001u),  // Above halfway: up.
      -2.5f,
      inf,
      -inf,
      std::bit_cast<float>(0x7f7fffffu),  // FLT_MAX rounds to infinity.
      std::bit_cast<float>(0x00008000u),  // A subnormal halfway: to zero.
      std::bit_cast<float>(0x00018000u),  // A subnormal halfway: up.
  };
  const std::vector<uint16_t> want = {0x3f80, 0x3f80, 0x3f82, 0x3f81, 0xc020,
                                      0x7f80, 0xff80, 0x7f80, 0x0000, 0x0002};
  EXPECT_EQ(ToBf16(in), want);
}

TEST(DtypeConvertTest, NanStaysNan) {
  const std::vector<uint16_t> out =
      ToBf16({std::numeric_limits<float>::quiet_NaN(),
              std::bit_cast<float>(0x7f800001u)});  // Payload below bf16's.
  for (uint16_t h : out) {
    EXPECT_EQ(h & 0x7f80, 0x7f80) << std::hex << h;
    EXPECT_NE(h & 0x007f, 0) << std::hex << h;
  }
}

TEST(DtypeConvertTest, F64ToBf16NarrowsThroughFloat) {
  // 1 + 2^-8 + 2^-30: rounded to float first it is 1 + 2^-8 (the tie), which
  // rounds down to 1.0 (even); rounded once it would go up to 1 + 2^-7.
  const double in = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30);
  uint16_t out = 0;
  ConvertElements(reinterpret_cast<const std::byte*>(&in), DType::kF64, 1,
                  reinterpret_cast<std::byte*>(&out), DType::kBF16);
  EXPECT_EQ(out, 0x3f80);
}

TEST(DtypeConvertTest, WideningIsExactBothWays) {
  // Every bf16 and f16 bit pattern that is not NaN survives F32 and back.
  for (DType narrow : {DType::kBF16, DType::kF16}) {
    std::vector<uint16_t> all(1 << 16);
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
    std::vector<float> wide(all.size());
    std::vector<uint16_t> back(all.size());
    ConvertElements(reinterpret_cast<const std::byte*>(all.data()), narrow,
                    static_cast<int64_t>(all.size()),
                    reinterpret_cast<std::byte*>(wide.data()), DType::kF32);
    ConvertElements(reinterpret_cast<const std::byte*>(wide.data()),
                    DType::kF32, static_cast<int64_t>(wide.size()),
                    reinterpret_cast<std::byte*>(back.data()), narrow);
    for (size_t i = 0; i < all.size(); ++i) {
      if (std::isnan(wide[i])) continue;
      ASSERT_EQ(back[i], all[i]) << DTypeName(narrow) << " " << i;
    }
  }
  const float f = 0.1f;
  double d = 0;
  ConvertElements(reinterpret_cast<const std::byte*>(&f), DType::kF32, 1,
                  reinterpret_cast<std::byte*>(&d), DType::kF64);
  EXPECT_EQ(d, static_cast<double>(0.1f));
}

TEST(DtypeConvertTest, F32ToF16RoundsAndOverflows) {
  const std::vector<float> in = {1.0f, 65504.0f, 65520.0f, 1e-8f,
                                 std::bit_cast<float>(0x3f801000u)};
  std::vector<uint16_t> out(in.size());
  ConvertElements(reinterpret_cast<const std::byte*>(in.data()), DType::kF32,
                  static_cast<int64_t>(in.size()),
                  reinterpret_cast<std::byte*>(out.data()), DType::kF16);
  // 65520 is halfway between 65504 and the next step: rounds to infinity;
  // 1e-8 is under half the smallest subnormal: zero; 1 + 2^-11 is a tie
  // that rounds to even (1.0).
  EXPECT_EQ(out,
            (std::vector<uint16_t>{0x3c00, 0x7bff, 0x7c00, 0x0000, 0x3c00}));
}

// The vector paths (F16 <-> F32 with F16C, BF16 <-> F32 with AVX2) agree
// with the scalar conversion element by element: random bit patterns, runs
// not a multiple of the vector width.
TEST(DtypeConvertTest, VectorPathsAgreeWithOneElementAtATime) {
  std::mt19937 rng(11);
  std::vector<uint32_t> f32(1003);
  for (uint32_t& bits : f32) bits = rng();
  f32[5] = 0x7f800001u;  // A NaN whose payload bf16 drops.
  f32[6] = 0xff800000u;  // -inf
  f32[7] = 0x3f808000u;  // A bf16 tie.
  const auto* f32_bytes = reinterpret_cast<const std::byte*>(f32.data());
  for (DType narrow : {DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(narrow));
    const uint16_t exponent = narrow == DType::kF16 ? 0x7c00 : 0x7f80;
    std::vector<uint16_t> many(f32.size()), one(f32.size());
    ConvertElements(f32_bytes, DType::kF32, static_cast<int64_t>(f32.size()),
                    reinterpret_cast<std::byte*>(many.data()), narrow);
    for (size_t i = 0; i < f32.size(); ++i) {
      ConvertElements(f32_bytes + 4 * i, DType::kF32, 1,
                      reinterpret_cast<std::byte*>(&one[i]), narrow);
      const bool nan = (f32[i] & 0x7fffffffu) > 0x7f800000u;
      if (nan) {  // NaN stays NaN; payloads may differ between paths.
        ASSERT_EQ(many[i] & exponent, exponent) << i;
        ASSERT_NE(many[i] & ~exponent & 0x7fff, 0) << i;
      } else {
        ASSERT_EQ(many[i], one[i]) << i << " " << std::hex << f32[i];
      }
    }
    std::vector<float> wide(many.size()), wide_one(many.size());
    ConvertElements(reinterpret_cast<const std::byte*>(many.data()), narrow,
                    static_cast<int64_t>(many.size()),
                    reinterpret_cast<std::byte*>(wide.data()), DType::kF32);
    for (size_t i = 0; i < many.size(); ++i) {
      ConvertElements(reinterpret_cast<const std::byte*>(&many[i]), narrow, 1,
                      reinterpret_cast<std::byte*>(&wide_one[i]), DType::kF32);
      if (std::isnan(wide[i])) {
        ASSERT_TRUE(std::isnan(wide_one[i])) << i;
      } else {
        ASSERT_EQ(std::bit_cast<uint32_t>(wide[i]),
                  std::bit_cast<uint32_t>(wide_one[i]))
            << i;
      }
    }
  }
}

// The software F16 conversions agree with the hardware's (the F16C vector
// path) on every f16 value, on the midpoints between neighbours (ties) and
// on the floats next to them.
TEST(DtypeConvertTest, F16AgreesWithTheHardwareOnEveryValueAndTie) {
  std::vector<uint16_t> all(1 << 16);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> wide(all.size());
  ConvertElements(reinterpret_cast<const std::byte*>(all.data()), DType::kF16,
                  static_cast<int64_t>(all.size()),
                  reinterpret_cast<std::byte*>(wide.data()), DType::kF32);
  std::vector<float> inputs;
  for (size_t i = 0; i < all.size(); ++i) {
    const float f = F16ToFloat(all[i]);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(wide[i])) << i;
      continue;
    }
    ASSERT_EQ(std::bit_cast<uint32_t>(f), std::bit_cast<uint32_t>(wide[i]))
        << i;
    const float next = F16ToFloat(static_cast<uint16_t>(i + 1));
    if ((i & 0x7fff) == 0x7bff || (i & 0x7fff) >= 0x7c00) continue;
    const float mid = static_cast<float>((double{f} + double{next}) / 2);
    for (float x : {f, mid, std::nextafter(mid, -INFINITY),
                    std::nextafter(mid, INFINITY)}) {
      inputs.push_back(x);
    }
  }
  inputs.push_back(65520.0f);
  inputs.push_back(std::nextafter(65520.0f, 0.0f));
  std::vector<uint16_t> vector(inputs.size());
  ConvertElements(reinterpret_cast<const std::byte*>(inputs.data()),
                  DType::kF32, static_cast<int64_t>(inputs.size()),
                  reinterpret_cast<std::byte*>(vector.data()), DType::kF16);
  for (size_t i = 0; i < inputs.size(); ++i) {
    ASSERT_EQ(FloatToF16(inputs[i]), vector[i])
        << i << " " << std::hex << std::bit_cast<uint32_t>(inputs[i]);
  }
}

TEST(DtypeConvertTest, ConvertIntoHonoursStrides) {
  // A 2x3 source into the transpose of a 3x2 F32 buffer.
  const std::vector<uint16_t> src = {0x3f80, 0x4000, 0x4040,   // 1 2 3
                                     0x4080, 0x40a0, 0x40c0};  // 4 5 6
  std::vector<float> buffer(6, -1.0f);
  TensorView dst(buffer.data(), DType::kF32, {2, 3}, {1, 2}, Device{});
  ASSERT_TRUE(ConvertInto(reinterpret_cast<const std::byte*>(src.data()),
                          DType::kBF16, dst)
                  .ok());
  EXPECT_EQ(buffer, (std::vector<float>{1, 4, 2, 5, 3, 6}));
  // A 0-d tensor.
  float scalar = 0;
  ASSERT_TRUE(ConvertInto(reinterpret_cast<const std::byte*>(src.data() + 4),
                          DType::kBF16, TensorView(&scalar, DType::kF32, {}))
                  .ok());
  EXPECT_EQ(scalar, 5.0f);
}

TEST(DtypeConvertTest, ConvertIntoRefusesOtherDtypes) {
  int32_t out = 0;
  const float in = 1.0f;
  absl::Status status =
      ConvertInto(reinterpret_cast<const std::byte*>(&in), DType::kF32,
                  TensorView(&out, DType::kI32, {1}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("F32 to I32"), std::string::npos)
      << status.message();
}

}  // namespace
}  // namespace dcp
