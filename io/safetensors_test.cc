// The safetensors format rules (io/safetensors.h): every rule has a file
// that breaks it, and the encoder's output passes the parser.
#include "io/safetensors.h"

#include <cstring>
#include <fstream>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file_system.h"
#include "nlohmann/json.hpp"

namespace dcp {
namespace {

using ::testing::HasSubstr;

// 8-byte little-endian length, `json`, then `data_bytes` bytes of data.
std::string MakeFile(const std::string& json, size_t data_bytes) {
  std::string out(8, '\0');
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += json;
  out.append(data_bytes, '\x5a');
  return out;
}

std::string WithLength(uint64_t n, const std::string& rest) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + rest;
}

// Expects `bytes` to be refused as kDataLoss naming the file and `rule`.
void ExpectBroken(const std::string& bytes, const std::string& rule) {
  absl::StatusOr<SafetensorsHeader> parsed = ParseSafetensors(bytes, "x.st");
  ASSERT_FALSE(parsed.ok()) << rule;
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss)
      << parsed.status();
  EXPECT_THAT(parsed.status().message(), HasSubstr("x.st"));
  EXPECT_THAT(parsed.status().message(), HasSubstr(rule));
}

TEST(Safetensors, ParsesAValidFile) {
  const std::string json =
      R"({"__metadata__":{"format":"pt"},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("a":{"dtype":"BF16","shape":[2,2],"data_offsets":[8,16]}})";
  absl::StatusOr<SafetensorsHeader> h =
      ParseSafetensors(MakeFile(json, 16), "f");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->header_length, static_cast<int64_t>(json.size()));
  EXPECT_EQ(h->data_start(), 8 + static_cast<int64_t>(json.size()));
  EXPECT_EQ(h->data_length, 16);
  ASSERT_EQ(h->tensors.size(), 2u);
  EXPECT_EQ(h->tensors[0].name, "b");
  EXPECT_EQ(h->tensors[0].dtype, DType::kF32);
  EXPECT_EQ(h->tensors[1].name, "a");
  EXPECT_EQ(h->tensors[1].shape, (Shape{2, 2}));
  EXPECT_EQ(h->tensors[1].begin, 8);
  EXPECT_EQ(h->metadata.at("format"), "pt");
}

TEST(Safetensors, EmptyHeaderNoMetadataZeroDAndZeroSizeTensors) {
  absl::StatusOr<SafetensorsHeader> empty =
      ParseSafetensors(MakeFile("{}", 0), "f");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->tensors.empty());
  // A 0-d tensor holds one element; zero-size tensors hold no bytes and may
  // sit anywhere, including at the end.
  const std::string json =
      R"({"z1":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},)"
      R"("s":{"dtype":"F64","shape":[],"data_offsets":[0,8]},)"
      R"("z2":{"dtype":"I8","shape":[4,0],"data_offsets":[8,8]},)"
      R"("__metadata__":null})";
  absl::StatusOr<SafetensorsHeader> h =
      ParseSafetensors(MakeFile(json, 8), "f");
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->tensors.size(), 3u);
  EXPECT_EQ(h->tensors[0].name, "z1");
  EXPECT_EQ(h->tensors[1].name, "s");
  EXPECT_TRUE(h->tensors[1].shape.empty());
  EXPECT_EQ(h->tensors[2].name, "z2");
}

TEST(Safetensors, EveryDTypeOfTheFormat) {
  for (int i = 0; i < kNumDTypes; ++i) {
    const DType dtype = static_cast<DType>(i);
    if (!InSafetensors(dtype)) continue;  // Not in the format.
    const std::string json = absl::StrCat(
        R"({"t":{"dtype":")", DTypeName(dtype),
        R"(","shape":[3],"data_offsets":[0,)", 3 * ElementSize(dtype), "]}}");
    absl::StatusOr<SafetensorsHeader> h =
        ParseSafetensors(MakeFile(json, 3 * ElementSize(dtype)), "f");
    ASSERT_TRUE(h.ok()) << DTypeName(dtype) << ": " << h.status();
    EXPECT_EQ(h->tensors[0].dtype, dtype);
  }
}

TEST(Safetensors, FileTooSmallForTheLength) {
  ExpectBroken("", "too small for the 8-byte header length");
  ExpectBroken("\x02\0\0\0", "too small for the 8-byte header length");
}

TEST(Safetensors, HeaderLengthOverTheLimit) {
  ExpectBroken(WithLength(100'000'001, "{}"),
               "more than the format's limit of 100000000");
  ExpectBroken(WithLength(~uint64_t{0}, "{}"), "more than the format's limit");
}

TEST(Safetensors, HeaderLengthPastTheEndOfTheFile) {
  ExpectBroken(WithLength(64, "{}"), "the file has only 2 bytes after it");
}

TEST(Safetensors, HeaderNotUtf8) {
  ExpectBroken(MakeFile("{\"a\xff\":1}", 0), "not valid UTF-8");
  // Overlong encoding of '/' and an encoded surrogate.
  ExpectBroken(MakeFile("{\"\xc0\xaf\":1}", 0), "not valid UTF-8");
  ExpectBroken(MakeFile("{\"\xed\xa0\x80\":1}", 0), "not valid UTF-8");
}

TEST(Safetensors, HeaderNotJson) {
  ExpectBroken(MakeFile("{\"a\": ", 0), "not valid JSON");
  ExpectBroken(MakeFile("{} trailing", 0), "not valid JSON");
  ExpectBroken(MakeFile(" {}", 0), "does not start with '{'");
  ExpectBroken(MakeFile("[1]", 0), "does not start with '{'");
  ExpectBroken(MakeFile("", 0), "does not start with '{'");
}

TEST(Safetensors, TrailingSpacesArePadding) {
  absl::StatusOr<SafetensorsHeader> h =
      ParseSafetensors(MakeFile("{}      ", 0), "f");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->header_length, 8);
}

TEST(Safetensors, DuplicateKeys) {
  ExpectBroken(
      MakeFile(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
               R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
               2),
      "the key \"a\" more than once");
  ExpectBroken(MakeFile(R"({"__metadata__":{"k":"1","k":"2"}})", 0),
               "the key \"k\" more than once");
  ExpectBroken(MakeFile(R"({"a":{"dtype":"U8","dtype":"I8","shape":[1],)"
                        R"("data_offsets":[0,1]}})",
                        1),
               "the key \"dtype\" more than once");
}

TEST(Safetensors, Gap) {
  ExpectBroken(
      MakeFile(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
               R"("b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}})",
               6),
      "bytes [2, 4) of the data belong to no tensor");
  ExpectBroken(
      MakeFile(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})", 3),
      "bytes [0, 1) of the data belong to no tensor");
}

TEST(Safetensors, Overlap) {
  ExpectBroken(
      MakeFile(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
               R"("b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
               4),
      "overlapping tensors");
}

TEST(Safetensors, SizeDoesNotMatchDTypeTimesShape) {
  ExpectBroken(
      MakeFile(R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,12]}})",
               12),
      "needs 24 bytes but its data_offsets [0,12] span 12");
  ExpectBroken(
      MakeFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4),
      "end before they begin");
}

TEST(Safetensors, TruncatedAndOverlongData) {
  const std::string json =
      R"({"a":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})";
  ExpectBroken(MakeFile(json, 15), "the file is truncated");
  ExpectBroken(MakeFile(json, 17), "1 bytes after the last tensor's data");
  ExpectBroken(MakeFile("{}", 1), "1 bytes after the last tensor's data");
}

TEST(Safetensors, OverflowingShape) {
  // 2^62 x 4 elements of 4 bytes: the element count overflows int64.
  ExpectBroken(MakeFile(R"({"a":{"dtype":"F32","shape":[4611686018427387904,)"
                        R"(4],"data_offsets":[0,0]}})",
                        0),
               "has a byte size that overflows");
  // 2^61 elements fit, their bytes do not.
  ExpectBroken(MakeFile(R"({"a":{"dtype":"F64","shape":[2305843009213693952],)"
                        R"("data_offsets":[0,0]}})",
                        0),
               "has a byte size that overflows");
  // Beyond u64 and beyond int64.
  ExpectBroken(MakeFile(R"({"a":{"dtype":"U8","shape":[18446744073709551616],)"
                        R"("data_offsets":[0,0]}})",
                        0),
               "sizes are integers");
  ExpectBroken(MakeFile(R"({"a":{"dtype":"U8","shape":[9223372036854775808],)"
                        R"("data_offsets":[0,0]}})",
                        0),
               "sizes are integers");
}

TEST(Safetensors, NamesWithNulAndTooManyDimensionsAreBroken) {
  ExpectBroken(MakeFile(R"({"w\u0000evil":{"dtype":"U8","shape":[1],)"
                        R"("data_offsets":[0,1]}})",
                        1),
               "has a name holding a NUL byte");
  std::string dims = "1";
  for (int d = 1; d <= kMaxTensorDims; ++d) dims += ",1";  // 65 of them.
  ExpectBroken(MakeFile(absl::StrCat(R"({"a":{"dtype":"U8","shape":[)", dims,
                                     R"(],"data_offsets":[0,1]}})"),
                        1),
               "has 65 dimensions (at most 64)");
}

TEST(Safetensors, MalformedTensorEntries) {
  ExpectBroken(MakeFile(R"({"a":1})", 0), "is not a JSON object");
  ExpectBroken(MakeFile(R"({"a":{"shape":[1],"data_offsets":[0,1]}})", 1),
               "has no string \"dtype\"");
  ExpectBroken(
      MakeFile(R"({"a":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", 4),
      "unknown dtype \"F33\"");
  ExpectBroken(
      MakeFile(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", 1),
      "sizes are integers");
  ExpectBroken(
      MakeFile(R"({"a":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}})", 1),
      "sizes are integers");
  ExpectBroken(
      MakeFile(R"({"a":{"dtype":"U8","shape":1,"data_offsets":[0,1]}})", 1),
      "has no \"shape\" array");
  ExpectBroken(
      MakeFile(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}})", 1),
      "has no \"data_offsets\" pair");
  ExpectBroken(
      MakeFile(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,"1"]}})", 1),
      "offsets are integers");
  ExpectBroken(MakeFile(R"({"__metadata__":{"k":1}})", 0),
               "entry \"k\" is not a string");
  ExpectBroken(MakeFile(R"({"__metadata__":[]})", 0),
               "\"__metadata__\" is not a JSON object");
}

// Deep enough that dump() overflowed an 8 MiB stack in every build (50000
// levels did under the sanitizers, 100000 in -c opt).
constexpr int kDeep = 200000;

// `depth` nested arrays around nothing: "[[[...]]]".
std::string Nested(int depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

// Messages used to dump() the offending JSON value, which recursed once per
// level: kDeep levels overflowed the stack. Nesting is capped while parsing.
TEST(Safetensors, DeeplyNestedHeaderIsDataLoss) {
  const std::string deep = Nested(kDeep);
  ExpectBroken(MakeFile(R"({"a":{"dtype":"F32","shape":)" + deep +
                            R"(,"data_offsets":[0,0]}})",
                        0),
               "the header nests arrays and objects more than 64 levels deep");
  ExpectBroken(MakeFile(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[)" +
                            deep + ",1]}}",
                        1),
               "more than 64 levels deep");
  ExpectBroken(MakeFile(R"({"__metadata__":{"k":)" + deep + "}}", 0),
               "more than 64 levels deep");
}

TEST(Safetensors, UntrustedJsonNestsUpToTheLimit) {
  absl::StatusOr<nlohmann::json> json =
      ParseUntrustedJson(Nested(kMaxUntrustedJsonDepth), "j");
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_TRUE(json->is_array());
  json =
      ParseUntrustedJson("{\"a\":" + Nested(kMaxUntrustedJsonDepth) + "}", "j");
  EXPECT_EQ(json.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(json.status().message(), HasSubstr("j nests arrays and objects"));
  json = ParseUntrustedJson("[1,", "j");
  EXPECT_EQ(json.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(json.status().message(), HasSubstr("j is not valid JSON"));
}

TEST(Safetensors, UntrustedJsonRefusesAKeyGivenTwiceInOneObject) {
  absl::StatusOr<nlohmann::json> json =
      ParseUntrustedJson(R"({"a":{"x":1},"b":{"x":2}})", "j");
  ASSERT_TRUE(json.ok()) << json.status();  // one key per object: fine
  json = ParseUntrustedJson(R"({"a":1,"b":2,"a":3})", "j");
  EXPECT_EQ(json.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(json.status().message(),
              HasSubstr(R"(j has the key "a" more than once)"));
  json = ParseUntrustedJson(R"([{"k":[{"x":1,"x":1}]}])", "j");
  EXPECT_THAT(json.status().message(),
              HasSubstr(R"(the key "x" more than once)"));
  // Keys are counted per object: the outer object's after an inner one
  // closed, an inner key equal to an outer one.
  json = ParseUntrustedJson(R"({"a":{"b":1,"a":2},"b":3,"a":4})", "j");
  EXPECT_THAT(json.status().message(),
              HasSubstr(R"(j has the key "a" more than once)"));
  json = ParseUntrustedJson(R"({"a":{"b":1,"a":2},"b":{"a":{}}})", "j");
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ((*json)["a"]["a"], 2);
}

TEST(Safetensors, UntrustedJsonMessagesShowBytesThatAreNotUtf8Escaped) {
  absl::StatusOr<nlohmann::json> json = ParseUntrustedJson(
      "{\"m\xe6"
      "d\": 1",
      "j");
  EXPECT_EQ(json.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(json.status().message(), HasSubstr("j is not valid JSON"));
  EXPECT_THAT(json.status().message(), HasSubstr("\\xe6"));
  EXPECT_TRUE(IsValidUtf8(json.status().message()));
}

TEST(Safetensors, UntrustedJsonParsesAWideObjectWhole) {
  // A header of many tensors: one object of 50,000 members, each an object.
  std::string text = "{";
  for (int i = 0; i < 50000; ++i) {
    absl::StrAppend(&text, i == 0 ? "" : ",", "\"t", i, "\":{\"i\":", i, "}");
  }
  text += "}";
  absl::StatusOr<nlohmann::json> json = ParseUntrustedJson(text, "j");
  ASSERT_TRUE(json.ok()) << json.status();
  ASSERT_EQ(json->size(), 50000u);
  EXPECT_EQ((*json)["t0"]["i"], 0);
  EXPECT_EQ((*json)["t49999"]["i"], 49999);
  json =
      ParseUntrustedJson(text.substr(0, text.size() - 1) + ",\"t7\":{}}", "j");
  EXPECT_THAT(json.status().message(),
              HasSubstr(R"(j has the key "t7" more than once)"));
}

TEST(Safetensors, MessagesDescribeLargeValuesWithoutDumpingThem) {
  std::string dims = "1";
  for (int i = 0; i < 59; ++i) dims += ",1";
  ExpectBroken(MakeFile(R"({"a":{"dtype":"U8","shape":[)" + dims +
                            R"(,[1]],"data_offsets":[0,1]}})",
                        1),
               "has [1] as dimension 60 of its shape");
  ExpectBroken(MakeFile(R"({"a":{"dtype":"U8","shape":[)" + Nested(10) +
                            R"(],"data_offsets":[0,1]}})",
                        1),
               "has an array of 1 element as dimension 0");
  ExpectBroken(MakeFile(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[")" +
                            std::string(1000, 'x') + R"(",1]}})",
                        1),
               "has the data_offsets an array of 2 elements");

  using Json = nlohmann::json;
  EXPECT_EQ(DescribeJsonValue(Json(-3)), "-3");
  EXPECT_EQ(DescribeJsonValue(Json(nullptr)), "null");
  EXPECT_EQ(DescribeJsonValue(Json("ab")), "\"ab\"");
  EXPECT_EQ(DescribeJsonValue(Json(std::string(65, 'x'))),
            "a string of 65 bytes");
  EXPECT_EQ(DescribeJsonValue(Json::parse("[1,true,\"x\"]")), "[1,true,\"x\"]");
  EXPECT_EQ(DescribeJsonValue(Json::parse("[1,2,3,4,5,6,7,8,9]")),
            "an array of 9 elements");
  EXPECT_EQ(DescribeJsonValue(Json::parse(R"({"a":1})")),
            "an object of 1 member");
  // Never throws, whatever the string holds.
  EXPECT_EQ(DescribeJsonValue(Json(std::string("a\xff"))), "\"a\ufffd\"");
}

TEST(Safetensors, DTypesDcpDoesNotHoldAreUnimplemented) {
  absl::StatusOr<SafetensorsHeader> h = ParseSafetensors(
      MakeFile(R"({"a":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}})", 1),
      "x.st");
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(h.status().message(), HasSubstr("F4"));
  // dcp's own names for what safetensors lacks are not the format's.
  h = ParseSafetensors(
      MakeFile(R"({"a":{"dtype":"C32","shape":[1],"data_offsets":[0,4]}})", 4),
      "x.st");
  EXPECT_EQ(h.status().code(), absl::StatusCode::kDataLoss) << h.status();
  // The float8 kinds of MX and ROCm are read.
  h = ParseSafetensors(
      MakeFile(R"({"a":{"dtype":"F8_E8M0","shape":[1],"data_offsets":[0,1]}})",
               1),
      "x.st");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->tensors[0].dtype, DType::kF8E8M0);
}

TEST(Safetensors, EncoderOutputParsesWithEveryDType) {
  std::vector<SafetensorsTensor> tensors;
  for (int i = 0; i < kNumDTypes; ++i) {
    const DType dtype = static_cast<DType>(i);
    if (!InSafetensors(dtype)) continue;  // Not in the format.
    tensors.push_back({std::string(DTypeName(dtype)), dtype, {2, 3}, 0, 0});
  }
  tensors.push_back({"scalar", DType::kF64, {}, 0, 0});
  tensors.push_back({"empty", DType::kF32, {0, 7}, 0, 0});
  tensors.push_back({"ünïcode.weight", DType::kBF16, {1}, 0, 0});
  SortForSafetensors(tensors);
  for (size_t i = 1; i < tensors.size(); ++i) {
    EXPECT_GE(ElementSize(tensors[i - 1].dtype), ElementSize(tensors[i].dtype));
  }
  // Sorted for 4 KiB blocks, the tensors of whole blocks come first, and
  // with a 4 KiB aligned data section each of them starts aligned.
  {
    std::vector<SafetensorsTensor> blocks = tensors;
    blocks.push_back({"page", DType::kF32, {1024}, 0, 0});
    blocks.push_back({"pages", DType::kBF16, {3, 2048}, 0, 0});
    SortForSafetensors(blocks, 4096);
    ASSERT_TRUE(EncodeSafetensorsHeader(blocks, {}, 4096).ok());
    bool odd_seen = false;
    for (const SafetensorsTensor& t : blocks) {
      const bool whole_blocks = (t.end - t.begin) % 4096 == 0;
      EXPECT_FALSE(whole_blocks && odd_seen) << t.name;
      odd_seen = odd_seen || !whole_blocks;
      if (whole_blocks) EXPECT_EQ(t.begin % 4096, 0) << t.name;
      EXPECT_EQ(t.begin % ElementSize(t.dtype), 0) << t.name;
    }
    EXPECT_EQ(blocks[1].name, "page");
    EXPECT_EQ(blocks[2].name, "pages");
  }
  for (int64_t alignment : {8, 4096}) {
    std::vector<SafetensorsTensor> laid_out = tensors;
    absl::StatusOr<std::string> head =
        EncodeSafetensorsHeader(laid_out, {{"format", "pt"}}, alignment);
    ASSERT_TRUE(head.ok()) << head.status();
    EXPECT_EQ(head->size() % alignment, 0u);
    EXPECT_EQ(head->back(), ' ');  // Padding is spaces.
    const int64_t data = laid_out.back().end;
    absl::StatusOr<SafetensorsHeader> parsed =
        ParseSafetensors(*head + std::string(data, '\1'), "f");
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->data_start(), static_cast<int64_t>(head->size()));
    EXPECT_EQ(parsed->metadata.at("format"), "pt");
    ASSERT_EQ(parsed->tensors.size(), laid_out.size());
    for (const SafetensorsTensor& t : laid_out) {
      auto it = std::find_if(
          parsed->tensors.begin(), parsed->tensors.end(),
          [&](const SafetensorsTensor& p) { return p.name == t.name; });
      ASSERT_NE(it, parsed->tensors.end()) << t.name;
      EXPECT_EQ(*it, t);
    }
  }
}

TEST(Safetensors, EncoderRefusesWhatTheFormatCannotHold) {
  auto encode = [](std::vector<SafetensorsTensor> tensors) {
    return EncodeSafetensorsHeader(tensors, {}).status();
  };
  EXPECT_EQ(encode({{"c", DType::kC128, {1}}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(encode({{"", DType::kF32, {1}}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(encode({{"__metadata__", DType::kF32, {1}}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(encode({{"bad\xff", DType::kF32, {1}}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(encode({{"a", DType::kF32, {1}}, {"a", DType::kF32, {1}}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(encode({{"a", DType::kF32, {int64_t{1} << 62, 4}}}).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<SafetensorsTensor> one = {{"a", DType::kF32, {1}}};
  EXPECT_EQ(EncodeSafetensorsHeader(one, {}, 12).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Mutated valid files: the parser never crashes, and whatever it accepts
// satisfies the format's invariants.
TEST(Safetensors, MutatedFilesAreRefusedOrValid) {
  std::vector<SafetensorsTensor> tensors = {{"w", DType::kF32, {3, 4}},
                                            {"b", DType::kBF16, {5}},
                                            {"s", DType::kI64, {}},
                                            {"e", DType::kU8, {0}}};
  absl::StatusOr<std::string> head =
      EncodeSafetensorsHeader(tensors, {{"format", "pt"}});
  ASSERT_TRUE(head.ok());
  const std::string valid = *head + std::string(tensors.back().end, '\7');
  std::mt19937 rng(1234);
  int accepted = 0;
  for (int round = 0; round < 4000; ++round) {
    std::string bytes = valid;
    const int edits = 1 + rng() % 3;
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % bytes.size();
      switch (rng() % 4) {
        case 0:
          bytes[at] = static_cast<char>(rng());
          break;
        case 1:
          bytes[at] = "0123456789[]{},:\"-e."[rng() % 20];
          break;
        case 2:
          bytes.resize(at);
          break;
        default:
          bytes.insert(at, 1, static_cast<char>(rng()));
      }
      if (bytes.empty()) break;
    }
    absl::StatusOr<SafetensorsHeader> parsed = ParseSafetensors(bytes, "m");
    if (!parsed.ok()) continue;
    ++accepted;
    int64_t at = 0;
    for (const SafetensorsTensor& t : parsed->tensors) {
      ASSERT_EQ(t.begin, at);
      ASSERT_EQ(CheckedNumBytes(t.dtype, t.shape), t.end - t.begin);
      at = t.end;
    }
    ASSERT_EQ(at, parsed->data_length);
    ASSERT_EQ(parsed->data_start() + parsed->data_length,
              static_cast<int64_t>(bytes.size()));
  }
  EXPECT_GT(accepted, 0);  // Some edits land in padding or data bytes.
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

TEST(Safetensors, ReadHeaderFromAFile) {
  std::vector<SafetensorsTensor> tensors = {{"w", DType::kF32, {2, 2}}};
  absl::StatusOr<std::string> head = EncodeSafetensorsHeader(tensors, {}, 4096);
  ASSERT_TRUE(head.ok());
  const std::string path = TempPath("read_header.safetensors");
  {
    std::ofstream out(path, std::ios::binary);
    out << *head << std::string(16, '\3');
  }
  auto file = LocalFileSystem().OpenForRead(path);
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<SafetensorsHeader> h = ReadSafetensorsHeader(**file);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->data_start(), 4096);
  EXPECT_EQ(h->tensors.at(0).end, 16);
}

TEST(Safetensors, ReadHeaderRefusesLengthsBeforeAllocating) {
  // A header length near the limit in a tiny file: refused by the size
  // check, before the header's bytes are allocated or read.
  const std::string path = TempPath("huge_claim.safetensors");
  for (uint64_t claim : {uint64_t{99'999'999}, uint64_t{1} << 62}) {
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out << WithLength(claim, "{}");
    }
    auto file = LocalFileSystem().OpenForRead(path);
    ASSERT_TRUE(file.ok());
    absl::StatusOr<SafetensorsHeader> h = ReadSafetensorsHeader(**file);
    ASSERT_FALSE(h.ok());
    EXPECT_EQ(h.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(h.status().message(), HasSubstr(path));
  }
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << "abc";
  }
  auto file = LocalFileSystem().OpenForRead(path);
  ASSERT_TRUE(file.ok());
  EXPECT_THAT(ReadSafetensorsHeader(**file).status().message(),
              HasSubstr("too small"));
}

}  // namespace
}  // namespace dcp
