#include "io/metadata_format.h"

#include <string>

#include "absl/strings/match.h"
#include "core/checksum.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dcp {
namespace {

using ::testing::HasSubstr;

Metadata SampleMetadata() {
  Metadata m;
  TensorStorageMetadata w;
  w.properties.dtype = DType::kBF16;
  w.properties.requires_grad = true;
  w.size = {4, 6};
  w.chunks = {{{0, 0}, {2, 6}}, {{2, 0}, {2, 6}}};
  m.state_dict_metadata["model.w"] = w;
  TensorStorageMetadata scalar;
  scalar.properties.dtype = DType::kI64;
  scalar.chunks = {{{}, {}}};
  m.state_dict_metadata["step"] = scalar;
  m.state_dict_metadata["extra"] = BytesStorageMetadata{};
  m.flatten_mapping["model.w"] = {std::string("model"), std::string("w")};
  m.flatten_mapping["optim.0"] = {std::string("optim"), int64_t{0}};
  m.storage_data[MetadataIndex("model.w", Shape{0, 0})] = {
      "__0_a_0.distcp", 0, 24, {1, 2}};
  m.storage_data[MetadataIndex("model.w", Shape{2, 0})] = {
      "__0_a_0.distcp", 4096, 24, {3}};
  m.storage_data[MetadataIndex("step", Shape{})] = {
      "__1_a_0.distcp", 0, 8, {4}};
  m.storage_data[MetadataIndex("extra")] = {"__1_a_0.distcp", 8, 0, {}};
  // Paths and names are byte strings, not necessarily UTF-8.
  m.storage_meta = StorageMeta{"/ckpt/\xfe", "save1", "", {"model", "optim"}};
  m.state_dict_metadata["bad\xff.utf8"] = BytesStorageMetadata{};
  m.storage_data[MetadataIndex("bad\xff.utf8")] = {"__1_a_0.distcp", 8, 0, {}};
  m.version = kFormatVersion;
  m.checksum_block_size = 1 << 20;
  return m;
}

void ExpectEqual(const Metadata& a, const Metadata& b) {
  ASSERT_EQ(a.state_dict_metadata.size(), b.state_dict_metadata.size());
  for (const auto& [fqn, value] : a.state_dict_metadata) {
    auto it = b.state_dict_metadata.find(fqn);
    ASSERT_NE(it, b.state_dict_metadata.end()) << fqn;
    ASSERT_EQ(value.index(), it->second.index()) << fqn;
    if (const auto* t = std::get_if<TensorStorageMetadata>(&value)) {
      const auto& u = std::get<TensorStorageMetadata>(it->second);
      EXPECT_EQ(t->properties, u.properties) << fqn;
      EXPECT_EQ(t->size, u.size) << fqn;
      EXPECT_EQ(t->chunks, u.chunks) << fqn;
    }
  }
  EXPECT_EQ(a.flatten_mapping, b.flatten_mapping);
  EXPECT_EQ(a.storage_data, b.storage_data);
  ASSERT_EQ(a.storage_meta.has_value(), b.storage_meta.has_value());
  if (a.storage_meta.has_value()) {
    EXPECT_EQ(a.storage_meta->checkpoint_id, b.storage_meta->checkpoint_id);
    EXPECT_EQ(a.storage_meta->save_id, b.storage_meta->save_id);
    EXPECT_EQ(a.storage_meta->modules, b.storage_meta->modules);
  }
  EXPECT_EQ(a.version, b.version);
  EXPECT_EQ(a.checksum_block_size, b.checksum_block_size);
}

TEST(MetadataFormatTest, RoundTripsEveryField) {
  const Metadata m = SampleMetadata();
  absl::StatusOr<std::string> bytes = EncodeMetadata(m);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(bytes->substr(0, 8), std::string(kMetadataMagic, 8));
  absl::StatusOr<Metadata> decoded = DecodeMetadata(*bytes, "x/.metadata");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ExpectEqual(m, *decoded);
}

TEST(MetadataFormatTest, EncodingIsDeterministic) {
  EXPECT_EQ(*EncodeMetadata(SampleMetadata()),
            *EncodeMetadata(SampleMetadata()));
}

TEST(MetadataFormatTest, EmptyMetadataRoundTrips) {
  Metadata m;
  absl::StatusOr<Metadata> decoded =
      DecodeMetadata(*EncodeMetadata(m), ".metadata");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_TRUE(decoded->state_dict_metadata.empty());
  EXPECT_EQ(decoded->version, kFormatVersion);
  EXPECT_FALSE(decoded->storage_meta.has_value());
}

TEST(MetadataFormatTest, RejectsForeignFile) {
  absl::StatusOr<Metadata> decoded =
      DecodeMetadata("{\"not\": \"dcp\"}", "dir/.metadata");
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(decoded.status().message(), HasSubstr("dir/.metadata"));
  EXPECT_THAT(decoded.status().message(), HasSubstr("not a dcp metadata file"));
  EXPECT_EQ(DecodeMetadata("", "e").status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(MetadataFormatTest, RejectsTornFileAtEveryLength) {
  const std::string bytes = *EncodeMetadata(SampleMetadata());
  for (size_t length = 0; length < bytes.size(); ++length) {
    absl::StatusOr<Metadata> decoded =
        DecodeMetadata(bytes.substr(0, length), ".metadata");
    ASSERT_EQ(decoded.status().code(), absl::StatusCode::kDataLoss) << length;
  }
  EXPECT_THAT(DecodeMetadata(bytes.substr(0, bytes.size() - 1), ".metadata")
                  .status()
                  .message(),
              HasSubstr("torn"));
}

TEST(MetadataFormatTest, RejectsFlippedByteAnywhereInThePayload) {
  const std::string bytes = *EncodeMetadata(SampleMetadata());
  for (size_t pos = kMetadataHeaderSize; pos < bytes.size(); ++pos) {
    std::string bad = bytes;
    bad[pos] ^= 0x10;
    absl::StatusOr<Metadata> decoded = DecodeMetadata(bad, ".metadata");
    ASSERT_EQ(decoded.status().code(), absl::StatusCode::kDataLoss) << pos;
    ASSERT_THAT(decoded.status().message(), HasSubstr("checksum")) << pos;
  }
}

TEST(MetadataFormatTest, RejectsNewerHeaderVersion) {
  std::string bytes = *EncodeMetadata(SampleMetadata());
  bytes[8] = 2;
  absl::StatusOr<Metadata> decoded = DecodeMetadata(bytes, ".metadata");
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(decoded.status().message(), HasSubstr("newer dcp"));
}

TEST(MetadataFormatTest, RejectsChunkOfWrongRank) {
  Metadata m = SampleMetadata();
  std::get<TensorStorageMetadata>(m.state_dict_metadata["model.w"])
      .chunks.push_back({{0}, {1}});
  EXPECT_EQ(EncodeMetadata(m).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dcp

namespace dcp {
namespace {

// Re-seals `bytes` after its payload was changed: a payload that passes the
// checksum must still never crash the decoder or yield inconsistent
// metadata.
std::string Reseal(std::string bytes) {
  const uint64_t sum = Checksum(bytes.data() + kMetadataHeaderSize,
                                bytes.size() - kMetadataHeaderSize);
  for (int i = 0; i < 8; ++i) bytes[24 + i] = static_cast<char>(sum >> (8 * i));
  return bytes;
}

TEST(MetadataFormatTest, CorruptPayloadsWithValidChecksumsFailCleanly) {
  const std::string good = *EncodeMetadata(SampleMetadata());
  uint32_t state = 12345;
  int rejected = 0;
  for (int round = 0; round < 2000; ++round) {
    std::string bad = good;
    const int flips = 1 + round % 4;
    for (int f = 0; f < flips; ++f) {
      state = state * 1664525u + 1013904223u;
      const size_t pos = kMetadataHeaderSize +
                         (state >> 8) % (bad.size() - kMetadataHeaderSize);
      bad[pos] = static_cast<char>(state >> 3);
    }
    absl::StatusOr<Metadata> decoded = DecodeMetadata(Reseal(bad), ".metadata");
    if (!decoded.ok()) {
      // kFailedPrecondition only for a well-formed but other version.
      ASSERT_TRUE(
          decoded.status().code() == absl::StatusCode::kDataLoss ||
          (decoded.status().code() == absl::StatusCode::kFailedPrecondition &&
           absl::StrContains(decoded.status().message(),
                             "format version dcp-")))
          << decoded.status();
      ++rejected;
      continue;
    }
    // Whatever decoded is self-consistent: every chunk has its tensor's rank.
    for (const auto& [fqn, value] : decoded->state_dict_metadata) {
      if (const auto* t = std::get_if<TensorStorageMetadata>(&value)) {
        for (const ChunkStorageMetadata& c : t->chunks) {
          ASSERT_EQ(c.offsets.size(), t->size.size()) << fqn;
          ASSERT_EQ(c.sizes.size(), t->size.size()) << fqn;
        }
      }
    }
  }
  EXPECT_GT(rejected, 0);
}

}  // namespace
}  // namespace dcp
