#include "planner/value_codec.h"

#include <cstdint>
#include <limits>
#include <random>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dcp {
namespace {

using ::testing::HasSubstr;

std::string Hex(absl::string_view s) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (char c : s) {
    out.push_back(kDigits[static_cast<uint8_t>(c) >> 4]);
    out.push_back(kDigits[static_cast<uint8_t>(c) & 15]);
  }
  return out;
}

TEST(ValueCodecTest, ExactLittleEndianLayout) {
  EXPECT_EQ(Hex(*EncodeValue(StateValue())), "00");
  EXPECT_EQ(Hex(*EncodeValue(StateValue(int64_t{0x0102030405060708}))),
            "010807060504030201");
  EXPECT_EQ(Hex(*EncodeValue(StateValue(int64_t{-2}))), "01feffffffffffffff");
  EXPECT_EQ(Hex(*EncodeValue(StateValue(1.0))), "02000000000000f03f");
  EXPECT_EQ(Hex(*EncodeValue(StateValue(true))), "0301");
  EXPECT_EQ(Hex(*EncodeValue(StateValue(false))), "0300");
  EXPECT_EQ(Hex(*EncodeValue(StateValue("ab"))), "046162");
  EXPECT_EQ(Hex(*EncodeValue(StateValue(Bytes{std::string("\0z", 2)}))),
            "05007a");
}

TEST(ValueCodecTest, RoundTripsEveryKind) {
  const std::vector<StateValue> values = {
      StateValue(),
      StateValue(int64_t{0}),
      StateValue(std::numeric_limits<int64_t>::min()),
      StateValue(std::numeric_limits<int64_t>::max()),
      StateValue(-0.0),
      StateValue(std::numeric_limits<double>::infinity()),
      StateValue(3.25),
      StateValue(true),
      StateValue(false),
      StateValue(""),
      StateValue(std::string("with\0nul", 8)),
      StateValue(Bytes{}),
      StateValue(Bytes{std::string(1000, '\xff')}),
  };
  for (const StateValue& v : values) {
    absl::StatusOr<std::string> encoded = EncodeValue(v);
    ASSERT_TRUE(encoded.ok()) << encoded.status();
    EXPECT_EQ(static_cast<int64_t>(encoded->size()), *EncodedValueSize(v));
    absl::StatusOr<StateValue> decoded = DecodeValue(*encoded);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(decoded->kind(), v.kind());
    EXPECT_EQ(*EncodeValue(*decoded), *encoded);
  }
  EXPECT_TRUE(std::isnan(
      DecodeValue(
          *EncodeValue(StateValue(std::numeric_limits<double>::quiet_NaN())))
          ->double_value()));
}

TEST(ValueCodecTest, RejectsTensorsAndContainers) {
  for (const StateValue& v :
       {StateValue(Tensor::Empty(DType::kF32, {2})), StateValue(StateDict{}),
        StateValue(StateList{}), StateValue(ShardedTensor())}) {
    EXPECT_EQ(EncodeValue(v).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(EncodedValueSize(v).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST(ValueCodecTest, CorruptInputIsDataLoss) {
  EXPECT_THAT(DecodeValue("").status().message(), HasSubstr("no type tag"));
  EXPECT_EQ(DecodeValue("").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(DecodeValue("\x09").status().message(),
              HasSubstr("unknown type tag 9"));
  EXPECT_THAT(DecodeValue(absl::string_view("\x01\x00", 2)).status().message(),
              HasSubstr("int value has 1 payload bytes, expected 8"));
  EXPECT_THAT(DecodeValue("\x03\x02").status().message(),
              HasSubstr("bool value has byte 2"));
  EXPECT_EQ(DecodeValue(absl::string_view("\x00\x00", 2)).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeValue("\x03").status().code(), absl::StatusCode::kDataLoss);
}

TEST(ValueCodecTest, RandomBytesNeverCrash) {
  std::mt19937_64 rng(7);
  int ok = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string s(rng() % 12, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 8);
    absl::StatusOr<StateValue> v = DecodeValue(s);
    if (v.ok()) {
      ++ok;
      EXPECT_EQ(*EncodeValue(*v), s);
    } else {
      EXPECT_EQ(v.status().code(), absl::StatusCode::kDataLoss);
    }
  }
  EXPECT_GT(ok, 0);
}

}  // namespace
}  // namespace dcp
