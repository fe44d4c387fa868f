// The MEGA file and index encodings: layout, round trips and the decoder's
// refusals of malformed input (each kDataLoss naming the file, never a
// crash).
#include "io/mega_format.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "core/checksum.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace dcp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using Json = nlohmann::json;

MegaHeader TwoEntries() {
  MegaHeader header;
  header.checksum_block_size = 8192;
  MegaEntry w;
  w.name = "w";
  w.dtype = DType::kBF16;
  w.shape = {10, 6};
  w.offsets = {4, 0};
  w.sizes = {6, 6};
  w.length = 72;
  w.checksums = {0x0123456789abcdefULL};
  MegaEntry step;
  step.name = "step";
  step.is_tensor = false;
  step.length = 10000;
  step.checksums = {1, 2};
  MegaEntry scalar;
  scalar.name = "s";
  scalar.dtype = DType::kC128;
  scalar.length = 16;
  scalar.checksums = {3};
  header.entries = {w, step, scalar};
  return header;
}

// A whole file of `header` (laid out) with zero data.
std::string FileOf(MegaHeader header) {
  std::string bytes = EncodeMegaHeader(header);
  bytes.resize(static_cast<size_t>(header.file_size), '\0');
  return bytes;
}

TEST(MegaFormat, FileNames) {
  EXPECT_EQ(MegaFileName(1, 1), "model.mega");
  EXPECT_EQ(MegaFileName(2, 5), "model-00002-of-00005.mega");
  EXPECT_TRUE(IsMegaCheckpointFileName("model-00002-of-00005.mega"));
  EXPECT_TRUE(IsMegaCheckpointFileName(kMegaIndexFileName));
  EXPECT_FALSE(IsMegaCheckpointFileName("model-2-of.mega"));
  EXPECT_FALSE(IsMegaCheckpointFileName("model.safetensors"));
}

TEST(MegaFormat, LayoutAlignsEveryEntryAndRoundTrips) {
  MegaHeader header = TwoEntries();
  ASSERT_TRUE(LayOutMegaFile(header).ok());
  EXPECT_EQ(header.data_start % kMegaAlignment, 0);
  EXPECT_EQ(header.entries[0].begin, 0);
  EXPECT_EQ(header.entries[1].begin, 4096);
  EXPECT_EQ(header.entries[2].begin, 16384);
  EXPECT_EQ(header.file_size, header.data_start + 16384 + 16);
  const std::string bytes = FileOf(header);
  EXPECT_EQ(bytes.substr(0, 8), std::string(kMegaMagic, 8));
  EXPECT_EQ(bytes[8], 1);  // Major version, little-endian.
  absl::StatusOr<MegaHeader> decoded =
      DecodeMegaHeader(bytes, header.file_size, "f.mega");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->data_start, header.data_start);
  ASSERT_EQ(decoded->entries.size(), 3u);
  const MegaEntry& w = decoded->entries[0];
  EXPECT_EQ(w.dtype, DType::kBF16);
  EXPECT_EQ(w.shape, (Shape{10, 6}));
  EXPECT_EQ(w.offsets, (Shape{4, 0}));
  EXPECT_EQ(w.checksums, (std::vector<uint64_t>{0x0123456789abcdefULL}));
  EXPECT_FALSE(decoded->entries[1].is_tensor);
  EXPECT_EQ(decoded->entries[1].checksums, (std::vector<uint64_t>{1, 2}));
  EXPECT_TRUE(decoded->entries[2].shape.empty());
  // Checksums do not change the layout.
  MegaHeader unsummed = TwoEntries();
  for (MegaEntry& e : unsummed.entries) e.checksums.clear();
  ASSERT_TRUE(LayOutMegaFile(unsummed).ok());
  EXPECT_EQ(EncodeMegaHeader(unsummed).size(), EncodeMegaHeader(header).size());
  // A checksum block that is not a multiple of 4 KiB.
  header.checksum_block_size = 5000;
  EXPECT_EQ(LayOutMegaFile(header).code(), absl::StatusCode::kInvalidArgument);
}

// Encodes `text` as the header of a file otherwise like `good` with
// `data_bytes` bytes of data.
std::string WithText(const std::string& good, const std::string& text,
                     int64_t data_bytes, int64_t* size) {
  std::string bytes = good.substr(0, 32);
  for (int i = 0; i < 8; ++i) {
    bytes[16 + i] = static_cast<char>(text.size() >> 8 * i);
    bytes[24 + i] =
        static_cast<char>(Checksum(text.data(), text.size()) >> 8 * i);
  }
  bytes += text;
  const int64_t start =
      (static_cast<int64_t>(bytes.size()) + 4095) / 4096 * 4096;
  bytes.resize(start + data_bytes, '\0');
  *size = static_cast<int64_t>(bytes.size());
  return bytes;
}

// Re-encodes `json` as the header of a file otherwise like `good`.
std::string WithJson(const std::string& good, const Json& json, int64_t* size) {
  return WithText(good, json.dump(), json["data_bytes"].get<int64_t>(), size);
}

// The JSON header of the file `bytes`.
Json HeaderJson(const std::string& bytes) {
  const size_t end = bytes.find('\0', 32);
  return Json::parse(bytes.substr(
      32, end == std::string::npos ? bytes.size() - 32 : end - 32));
}

// Empty entries (zero-element tensors, empty shards) take no bytes: laid
// out at the offset of the entry after them (or the end), they overlap
// nothing, in whatever order the header lists them.
TEST(MegaFormat, EmptyEntriesLoadWhereverTheyLie) {
  MegaHeader header;
  header.checksum_block_size = 8192;
  for (int i = 0; i < 40; ++i) {
    MegaEntry e;
    e.name = absl::StrCat("t", i);
    e.dtype = DType::kF32;
    const int64_t rows = i % 3 == 1 ? 0 : 2;
    e.shape = {rows, 3};
    e.sizes = {rows, 3};
    e.offsets = {0, 0};
    e.length = rows * 3 * 4;
    if (e.length > 0) e.checksums = {static_cast<uint64_t>(i)};
    header.entries.push_back(e);
  }
  header.entries.back().shape = {0, 3};  // one last, at the end
  header.entries.back().sizes = {0, 3};
  header.entries.back().length = 0;
  header.entries.back().checksums.clear();
  ASSERT_TRUE(LayOutMegaFile(header).ok());
  const std::string bytes = FileOf(header);
  absl::StatusOr<MegaHeader> decoded =
      DecodeMegaHeader(bytes, header.file_size, "f.mega");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_EQ(decoded->entries.size(), 40u);
  // Each empty entry listed after the entry that shares its offset.
  Json json = HeaderJson(bytes);
  Json& entries = json["entries"];
  for (size_t i = 1; i + 1 < entries.size(); i += 3) {
    std::swap(entries[i], entries[i + 1]);
  }
  int64_t size = 0;
  const std::string swapped = WithJson(bytes, json, &size);
  decoded = DecodeMegaHeader(swapped, size, "f.mega");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->entries.size(), 40u);
}

// Deep enough that dump() overflowed an 8 MiB stack in every build (50000
// levels did under the sanitizers, 100000 in -c opt).
constexpr int kDeep = 200000;

// `depth` nested arrays around nothing: "[[[...]]]".
std::string Nested(int depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

TEST(MegaFormat, MalformedHeadersAreDataLossNamingTheFile) {
  MegaHeader header = TwoEntries();
  ASSERT_TRUE(LayOutMegaFile(header).ok());
  const std::string good = FileOf(header);
  const Json json = Json::parse(good.substr(
      32, good.find('\0', 32) == std::string::npos ? good.size() - 32
                                                   : good.find('\0', 32) - 32));
  auto expect = [&](const std::string& bytes, int64_t size,
                    absl::StatusCode code, const std::string& part) {
    absl::StatusOr<MegaHeader> decoded =
        DecodeMegaHeader(bytes, size, "bad.mega");
    EXPECT_EQ(decoded.status().code(), code) << decoded.status();
    EXPECT_THAT(decoded.status().message(), HasSubstr("bad.mega"));
    EXPECT_THAT(decoded.status().message(), HasSubstr(part));
  };
  expect(good.substr(0, 10), 10, absl::StatusCode::kDataLoss, "preamble");
  expect(good, header.file_size - 1, absl::StatusCode::kDataLoss, "truncated");
  std::string flipped = good;
  flipped[40] ^= 1;
  expect(flipped, header.file_size, absl::StatusCode::kDataLoss, "checksum");
  std::string future = good;
  future[8] = 3;
  expect(future, header.file_size, absl::StatusCode::kUnimplemented,
         "version 3");
  std::string huge = good;
  huge[23] = 0x7f;
  expect(huge, header.file_size, absl::StatusCode::kDataLoss, "header length");

  int64_t size = 0;
  Json bad = json;
  bad["entries"][0]["dtype"] = "F12";
  std::string bytes = WithJson(good, bad, &size);
  expect(bytes, size, absl::StatusCode::kDataLoss, "unknown dtype");
  bad = json;
  bad["entries"][0]["offsets"] = {5, 0};  // 5 + 6 > 10.
  bytes = WithJson(good, bad, &size);
  expect(bytes, size, absl::StatusCode::kDataLoss, "outside the tensor");
  bad = json;
  bad["entries"][0]["length"] = 70;
  bytes = WithJson(good, bad, &size);
  expect(bytes, size, absl::StatusCode::kDataLoss, "length 70");
  bad = json;
  bad["entries"][1]["begin"] = 100;
  bytes = WithJson(good, bad, &size);
  expect(bytes, size, absl::StatusCode::kDataLoss, "multiple of 4096");
  bad = json;
  bad["entries"][2]["begin"] = 8192;  // Inside "step".
  bytes = WithJson(good, bad, &size);
  expect(bytes, size, absl::StatusCode::kDataLoss, "overlap");
  bad = json;
  bad["entries"][1]["checksums"] = {"0000000000000001"};
  bytes = WithJson(good, bad, &size);
  expect(bytes, size, absl::StatusCode::kDataLoss, "needs 2 checksums");
  bad = json;
  bad["entries"][1]["checksums"][0] = "xyz";
  bytes = WithJson(good, bad, &size);
  expect(bytes, size, absl::StatusCode::kDataLoss, "16 hex digits");
  bad = json;
  bad["version"] = {2, 0};
  bytes = WithJson(good, bad, &size);
  expect(bytes, size, absl::StatusCode::kUnimplemented, "version 2");
  bad = json;
  bad["entries"][0]["shape"] = {-1, 6};
  bytes = WithJson(good, bad, &size);
  expect(bytes, size, absl::StatusCode::kDataLoss, "shape");
  // Fields of the wrong JSON type are refused, never thrown.
  for (const Json& algorithm : {Json(1), Json::array(), Json(nullptr)}) {
    bad = json;
    bad["checksum"]["algorithm"] = algorithm;
    bytes = WithJson(good, bad, &size);
    expect(bytes, size, absl::StatusCode::kDataLoss, "xxh3-64");
  }
}

// Messages used to dump() the offending JSON value, which recursed once per
// level: kDeep levels overflowed the stack. Nesting is capped while parsing.
TEST(MegaFormat, DeeplyNestedHeaderIsDataLoss) {
  MegaHeader header = TwoEntries();
  ASSERT_TRUE(LayOutMegaFile(header).ok());
  const std::string good = FileOf(header);
  const Json json = HeaderJson(good);
  std::string text = json.dump();
  const std::string shape = R"("shape":[10,6])";
  ASSERT_NE(text.find(shape), std::string::npos);
  text.replace(text.find(shape), shape.size(),
               R"("shape":[)" + Nested(kDeep) + "]");
  int64_t size = 0;
  const std::string bytes =
      WithText(good, text, json["data_bytes"].get<int64_t>(), &size);
  absl::StatusOr<MegaHeader> decoded = DecodeMegaHeader(bytes, size, "d.mega");
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kDataLoss)
      << decoded.status();
  EXPECT_THAT(decoded.status().message(),
              AllOf(HasSubstr("d.mega"), HasSubstr("more than 64 levels")));
}

TEST(MegaFormat, DeeplyNestedIndexIsDataLoss) {
  const std::string text = absl::StrCat(
      R"({"format":"mega","version":[1,0],"files":["model.mega"],)",
      R"("weight_map":{"w":[)", Nested(kDeep), "]}}");
  absl::Status status = DecodeMegaIndex(text, "deep.json").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), AllOf(HasSubstr("deep.json"),
                                      HasSubstr("more than 64 levels deep")));
  // Within the limit, the value is described, not dumped.
  status =
      DecodeMegaIndex(absl::StrCat(R"({"format":"mega","version":[1,0],)",
                                   R"("files":["model.mega"],)",
                                   R"("weight_map":{"w":[)", Nested(40), "]}}"),
                      "deep.json")
          .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("deep.json"),
                    HasSubstr("maps \"w\" to an array of 1 element")));
}

// A chunk without elements of a tensor whose element count overflows
// int64 passed: only the chunk's bytes were checked.
TEST(MegaFormat, TensorWhoseSizeOverflowsIsDataLoss) {
  MegaHeader header;
  header.checksum_block_size = 4096;
  MegaEntry e;
  e.name = "huge";
  e.dtype = DType::kF32;
  e.shape = {int64_t{1} << 32, int64_t{1} << 32};
  e.offsets = {0, 0};
  e.sizes = {0, 0};
  header.entries = {e};
  ASSERT_TRUE(LayOutMegaFile(header).ok());
  absl::StatusOr<MegaHeader> decoded =
      DecodeMegaHeader(FileOf(header), header.file_size, "o.mega");
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kDataLoss)
      << decoded.status();
  EXPECT_THAT(decoded.status().message(),
              AllOf(HasSubstr("o.mega"), HasSubstr("\"huge\""),
                    HasSubstr("overflows")));
}

TEST(MegaFormat, IndexListingAFileTwiceIsDataLoss) {
  MegaIndex index;
  index.files = {"model-00001-of-00002.mega", "model-00002-of-00002.mega",
                 "model-00001-of-00002.mega"};
  index.weight_map["w"] = {"model-00001-of-00002.mega"};
  absl::Status status =
      DecodeMegaIndex(EncodeMegaIndex(index), "twice.json").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("twice.json"),
                    HasSubstr("model-00001-of-00002.mega more than once")));
}

TEST(MegaFormat, IndexRoundTripAndRefusals) {
  MegaIndex index;
  index.total_size = 42;
  index.files = {"model-00001-of-00002.mega", "model-00002-of-00002.mega"};
  index.weight_map["w"] = index.files;
  index.weight_map["b"] = {"model-00002-of-00002.mega"};
  absl::StatusOr<MegaIndex> decoded =
      DecodeMegaIndex(EncodeMegaIndex(index), "i.json");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->total_size, 42);
  EXPECT_EQ(decoded->files, index.files);
  EXPECT_EQ(decoded->weight_map, index.weight_map);

  Json json = Json::parse(EncodeMegaIndex(index));
  json["weight_map"]["b"] = {"model-00003-of-00003.mega"};
  EXPECT_THAT(DecodeMegaIndex(json.dump(), "i.json").status().message(),
              HasSubstr("\"b\""));
  json = Json::parse(EncodeMegaIndex(index));
  json["files"] = {"../x.mega"};
  EXPECT_EQ(DecodeMegaIndex(json.dump(), "i.json").status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeMegaIndex("[1,2", "i.json").status().code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace dcp
