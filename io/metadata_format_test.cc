#include "io/metadata_format.h"

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/checksum.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/testing/metadata_surgery.h"

namespace dcp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

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
  EXPECT_EQ(a.rank_local, b.rank_local);
  EXPECT_EQ(a.version, b.version);
  EXPECT_EQ(a.checksum_block_size, b.checksum_block_size);
}

// Results recorded while encoding give the bytes of the metadata with the
// results inserted (insert_or_assign, in order): new items, replaced items,
// a later rank's result for the same index, results out of name order.
TEST(MetadataFormatTest, EncodingWithResultsEqualsEncodingTheMergedCopy) {
  const Metadata base = SampleMetadata();
  std::vector<std::vector<WriteResult>> results(2);
  results[0].push_back({MetadataIndex("step", Shape{}), 8,
                        StorageInfo{"__0_b_0.distcp", 16, 8, {9}}});
  results[0].push_back({MetadataIndex("model.w", Shape{2, 0}), 24,
                        StorageInfo{"__0_b_0.distcp", 0, 24, {7}}});
  results[1].push_back(
      {MetadataIndex("extra"), 0, StorageInfo{"__1_b_0.distcp", 0, 0, {}}});
  results[1].push_back({MetadataIndex("model.w", Shape{2, 0}), 24,
                        StorageInfo{"__1_b_0.distcp", 8, 24, {8}}});
  results[1].push_back({MetadataIndex("new", Shape{0}), 0,
                        StorageInfo{"__1_b_0.distcp", 32, 0, {}}});
  Metadata merged = base;
  merged.state_dict_metadata["new"] = TensorStorageMetadata{
      TensorProperties{}, Shape{0}, {{Shape{0}, Shape{0}}}};
  Metadata with_new = base;
  with_new.state_dict_metadata["new"] = merged.state_dict_metadata["new"];
  for (const auto& rank : results) {
    for (const WriteResult& r : rank) {
      merged.storage_data.insert_or_assign(r.index, r.storage_data);
    }
  }
  absl::StatusOr<std::string> expected = EncodeMetadata(merged);
  ASSERT_TRUE(expected.ok()) << expected.status();
  absl::StatusOr<std::string> got = EncodeMetadata(with_new, results);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, *expected);
  absl::StatusOr<Metadata> decoded = DecodeMetadata(*got, ".metadata");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->storage_data.at(MetadataIndex("model.w", Shape{2, 0}))
                .relative_path,
            "__1_b_0.distcp");
  // No results: the plain encoding.
  EXPECT_EQ(*EncodeMetadata(base, {}), *EncodeMetadata(base));
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

TEST(MetadataFormatTest, RankLocalRecordRoundTrips) {
  Metadata m = SampleMetadata();
  m.rank_local = RankLocalSave{"0123456789abcdef", 2, 3};
  absl::StatusOr<Metadata> decoded =
      DecodeMetadata(*EncodeMetadata(m), "x/.metadata");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ExpectEqual(m, *decoded);
  ASSERT_TRUE(decoded->rank_local.has_value());
  EXPECT_EQ(decoded->rank_local->group_save_id, "0123456789abcdef");
  EXPECT_EQ(decoded->rank_local->rank, 2);
  EXPECT_EQ(decoded->rank_local->world_size, 3);
  // Without one, none comes back.
  EXPECT_FALSE(DecodeMetadata(*EncodeMetadata(SampleMetadata()), ".metadata")
                   ->rank_local.has_value());
}

// Chunks that share elements, or offsets while one holds an element, are
// damaged metadata: a load would read one chunk's bytes as another's, or
// take values from whichever of two overlapping chunks it met first.
// Empty chunks at one offset (ranks holding nothing of an empty tensor) and
// gaps (a rank-local save) stay valid.
TEST(MetadataFormatTest, OverlappingChunksAreDataLoss) {
  struct Case {
    std::vector<ChunkStorageMetadata> chunks;
    const char* message;  // nullptr: valid.
  };
  const Case cases[] = {
      {{{{0, 0}, {2, 6}}, {{0, 0}, {4, 2}}}, "at the same offsets [0, 0]"},
      {{{{2, 0}, {2, 6}}, {{0, 0}, {0, 6}}, {{0, 0}, {2, 6}}},
       "at the same offsets [0, 0]"},
      {{{{0, 0}, {2, 6}}, {{1, 0}, {2, 6}}}, "overlap"},
      {{{{2, 0}, {2, 6}}, {{0, 3}, {1, 1}}, {{0, 0}, {3, 3}}}, "overlap"},
      {{{{0, 0}, {0, 6}}, {{0, 0}, {0, 6}}}, nullptr},
      {{{{0, 0}, {2, 6}}}, nullptr},
  };
  for (const Case& c : cases) {
    Metadata m;
    TensorStorageMetadata w;
    w.properties.dtype = DType::kF32;
    w.size = {4, 6};
    w.chunks = c.chunks;
    m.state_dict_metadata["w"] = w;
    m.version = kFormatVersion;
    m.checksum_block_size = 1 << 20;
    absl::StatusOr<Metadata> decoded =
        DecodeMetadata(*EncodeMetadata(m), "d/.metadata");
    if (c.message == nullptr) {
      EXPECT_TRUE(decoded.ok()) << decoded.status();
      continue;
    }
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kDataLoss)
        << decoded.status();
    EXPECT_THAT(decoded.status().message(),
                AllOf(HasSubstr("w"), HasSubstr(c.message),
                      HasSubstr("damaged metadata")));
  }
}

TEST(MetadataFormatTest, EncodingIsDeterministic) {
  EXPECT_EQ(*EncodeMetadata(SampleMetadata()),
            *EncodeMetadata(SampleMetadata()));
}

// The bytes dcp-1 has always written for SampleMetadata(): a checkpoint
// without extensions is encoded exactly as before they existed.
constexpr char kSampleMetadataGolden[] =
    "894443500d0a1a0a010000000000000023010000000000000fb3ccac4504a088"
    "0a056463702d31108080401a290a20626164ff2e7574663865787472616d6f64"
    "656c2e77737465706f7074696d2e30120509050704072204000102032a040000"
    "010132020a083a020100420202004a020406520202015a040000020062040206"
    "02066a020204720202027a04000204018201120a0b6d6f64656c776f7074696d"
    "12030501058a010e5f5f315f615f302e6469737463708a010e5f5f305f615f30"
    "2e64697374637092010500010202039a01050000030301a2010400000200aa01"
    "050000010100b20106080800802000ba01050000181808c201050000020101ca"
    "0120010000000000000002000000000000000300000000000000040000000000"
    "0000d2011e0a072f636b70742ffe1205736176653122056d6f64656c22056f70"
    "74696d";

TEST(MetadataFormatTest, WithoutExtensionsTheEncodingIsTheGolden) {
  EXPECT_EQ(absl::BytesToHexString(*EncodeMetadata(SampleMetadata())),
            kSampleMetadataGolden);
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
  EXPECT_THAT(decoded.status().message(), Not(HasSubstr("pickle")));
  EXPECT_EQ(DecodeMetadata("", "e").status().code(),
            absl::StatusCode::kDataLoss);
  // torch.distributed.checkpoint's .metadata: a pickle of protocol 2-5.
  for (char protocol : {'\x02', '\x04', '\x05'}) {
    const std::string pickled =
        std::string("\x80") + protocol + "\x95\x10\x00\x00\x00";
    absl::Status status = DecodeMetadata(pickled, "t/.metadata").status();
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(
        status.message(),
        AllOf(HasSubstr("t/.metadata is not a dcp metadata file"),
              HasSubstr("torch.distributed.checkpoint"),
              HasSubstr("python -m dcp.format_utils torch_dcp_to_dcp")));
  }
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

namespace dcp {
namespace {

// Decodes SampleMetadata() with its payload rewritten by `mutate` (the
// checksum stays valid): what a crafted file gives the decoder.
absl::Status DecodeCrafted(absl::FunctionRef<void(format::Metadata&)> mutate) {
  absl::StatusOr<std::string> bytes =
      testing::RewritePayload(*EncodeMetadata(SampleMetadata()), mutate);
  if (!bytes.ok()) return bytes.status();
  return DecodeMetadata(*bytes, "ckpt/.metadata").status();
}

void ExpectDataLoss(const absl::Status& status,
                    std::vector<std::string> parts) {
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr("ckpt/.metadata"));
  for (const std::string& part : parts) {
    EXPECT_THAT(status.message(), HasSubstr(part)) << status;
  }
}

TEST(CraftedMetadataTest, TheUntouchedRewriteDecodes) {
  EXPECT_TRUE(DecodeCrafted([](format::Metadata&) {}).ok());
}

TEST(CraftedMetadataTest, DataFileNamesMustStayInsideTheDirectory) {
  for (const std::string& name :
       {std::string("../outside/data.distcp"),
        std::string("../../../../etc/passwd"), std::string("/etc/passwd"),
        std::string("sub/__0_a_0.distcp"), std::string(".."), std::string("."),
        std::string(""), std::string("__0_a\0.distcp", 13),
        std::string(256, 'a')}) {
    SCOPED_TRACE(name);
    absl::Status status = DecodeCrafted(
        [&](format::Metadata& proto) { *proto.mutable_files(0) = name; });
    ExpectDataLoss(status, {"data file name", "not a plain file name"});
  }
  // A plain name that merely starts with dots is a name like any other.
  EXPECT_TRUE(DecodeCrafted([](format::Metadata& proto) {
                *proto.mutable_files(0) = "..__0_a_0.distcp";
              }).ok());
  EXPECT_TRUE(CheckDataFileName("__0_0123456789abcdef_0.distcp").ok());
}

// Names cross the C ABI as NUL-terminated strings, and every dimension
// costs memory in every chunk: a name holding a NUL (read as another,
// shorter, name) and more than kMaxTensorDims dimensions are damage.
TEST(CraftedMetadataTest, NamesWithNulAndTooManyDimensionsAreDataLoss) {
  Metadata nul = SampleMetadata();
  const std::string name("model.w\0hidden", 14);
  nul.state_dict_metadata[name] = BytesStorageMetadata{};
  nul.storage_data[MetadataIndex(name)] = {"__1_a_0.distcp", 8, 0, {}};
  absl::StatusOr<Metadata> decoded =
      DecodeMetadata(*EncodeMetadata(nul), "ckpt/.metadata");
  ExpectDataLoss(decoded.status(), {"model.w\\x00hidden", "NUL byte"});

  Metadata wide = SampleMetadata();
  TensorStorageMetadata t;
  t.properties.dtype = DType::kF32;
  t.size = Shape(kMaxTensorDims + 1, 1);
  t.chunks = {{Shape(kMaxTensorDims + 1, 0), Shape(kMaxTensorDims + 1, 1)}};
  wide.state_dict_metadata["wide"] = t;
  wide.storage_data[MetadataIndex("wide", Shape(kMaxTensorDims + 1, 0))] = {
      "__1_a_0.distcp", 16, 4, {5}};
  decoded = DecodeMetadata(*EncodeMetadata(wide), "ckpt/.metadata");
  ExpectDataLoss(decoded.status(), {"tensor wide", "65 dimensions"});
  // kMaxTensorDims itself is a shape like any other.
  t.size = Shape(kMaxTensorDims, 1);
  t.chunks = {{Shape(kMaxTensorDims, 0), Shape(kMaxTensorDims, 1)}};
  wide.state_dict_metadata["wide"] = t;
  wide.storage_data.clear();
  wide.storage_data[MetadataIndex("wide", Shape(kMaxTensorDims, 0))] = {
      "__1_a_0.distcp", 16, 4, {5}};
  decoded = DecodeMetadata(*EncodeMetadata(wide), "ckpt/.metadata");
  EXPECT_TRUE(decoded.ok()) << decoded.status();
}

TEST(CraftedMetadataTest, ChunkOutsideItsTensorIsDataLoss) {
  // model.w is [4, 6] with chunks at rows 0 and 2 of 2 rows each: move the
  // second to row 3, so that it ends at row 5.
  ExpectDataLoss(DecodeCrafted([](format::Metadata& proto) {
                   proto.set_chunk_offsets(2, 3);
                 }),
                 {"tensor model.w", "lies outside the tensor's shape [4, 6]"});
  ExpectDataLoss(DecodeCrafted([](format::Metadata& proto) {
                   proto.set_chunk_offsets(1, -1);
                 }),
                 {"tensor model.w", "lies outside"});
  // offset + size overflows int64: must not wrap to a small sum.
  ExpectDataLoss(DecodeCrafted([](format::Metadata& proto) {
                   proto.set_chunk_offsets(2, INT64_MAX - 1);
                 }),
                 {"tensor model.w", "lies outside"});
}

TEST(CraftedMetadataTest, ChunkSizesWhoseByteCountWrapsAreDataLoss) {
  // 4 x (2^62 + 6) bf16 elements wrap to 24 elements, 48 bytes. Both the
  // global shape and the chunk claim it.
  ExpectDataLoss(DecodeCrafted([](format::Metadata& proto) {
                   proto.set_tensor_size(1, (int64_t{1} << 62) + 6);
                   proto.set_chunk_sizes(1, (int64_t{1} << 62) + 6);
                 }),
                 {"tensor model.w", "more bytes than int64 holds"});
  ExpectDataLoss(DecodeCrafted([](format::Metadata& proto) {
                   proto.set_tensor_size(0, -4);
                 }),
                 {"tensor model.w", "negative size"});
}

TEST(CraftedMetadataTest, StoredLengthMustBeWhatTheChunkHolds) {
  // model.w@[0, 0] is 2 x 6 bf16 elements: 24 bytes.
  ExpectDataLoss(DecodeCrafted([](format::Metadata& proto) {
                   proto.set_storage_length(2, 4096);
                 }),
                 {"model.w", "4096 bytes", "has 24"});
}

TEST(CraftedMetadataTest, StoredItemMustBelongToAValue) {
  // The item of model.w@[2, 0] moved to offset [1, 0], which no chunk has.
  ExpectDataLoss(DecodeCrafted([](format::Metadata& proto) {
                   proto.set_storage_chunk_offset(2, 1);
                 }),
                 {"model.w@", "is no chunk of tensor model.w"});
}

TEST(CraftedMetadataTest, OffsetPlusLengthMustNotOverflow) {
  ExpectDataLoss(DecodeCrafted([](format::Metadata& proto) {
                   proto.set_storage_offset(2, INT64_MAX - 8);
                 }),
                 {"model.w", "ending past the largest file offset"});
}

TEST(CraftedMetadataTest, RankLocalRecordOutsideItsWorldIsDataLoss) {
  for (const auto& [rank, world] :
       std::vector<std::pair<int, int>>{{3, 3}, {-1, 2}, {0, 0}, {0, -4}}) {
    SCOPED_TRACE(absl::StrCat(rank, " of ", world));
    ExpectDataLoss(DecodeCrafted([&](format::Metadata& proto) {
                     proto.mutable_rank_local()->set_rank(rank);
                     proto.mutable_rank_local()->set_world_size(world);
                   }),
                   {"rank-local record", absl::StrCat("rank ", rank)});
  }
}

TEST(CraftedMetadataTest, ChecksumBlockSizeIsBounded) {
  for (int64_t size :
       {int64_t{0}, int64_t{-1}, int64_t{1} << 62, kMaxChecksumBlockSize + 1}) {
    ExpectDataLoss(DecodeCrafted([&](format::Metadata& proto) {
                     proto.set_checksum_block_size(size);
                   }),
                   {"checksum_block_size"});
  }
}

TEST(CraftedMetadataTest, ZeroDTensorClaimingBillionsOfChunksIsRejectedAtOnce) {
  // "step" is the only 0-d tensor: its chunks take no array values, so only
  // the count says how many there are.
  absl::Status status = DecodeCrafted([](format::Metadata& proto) {
    for (int t = 0; t < proto.tensor_rank_size(); ++t) {
      if (proto.tensor_rank(t) == 0) proto.set_tensor_chunk_count(t, ~0u);
    }
  });
  ExpectDataLoss(status, {"tensor step", "4294967295 chunks"});
}

}  // namespace
}  // namespace dcp

namespace dcp {
namespace {

// SampleMetadata() with model.w's first chunk (24 raw bytes) stored through
// zstd in blocks of 16: one block encoded to 9 bytes, one stored as is.
Metadata WithExtensions() {
  Metadata m = SampleMetadata();
  m.checksum_block_size = 16;
  for (auto& [index, info] : m.storage_data) {
    info.block_checksums.assign(
        ChecksumBlockCount(info.length, m.checksum_block_size), 7);
  }
  StorageInfo& w = m.storage_data[MetadataIndex("model.w", Shape{0, 0})];
  w.extensions = {"zstd/1.0"};
  w.raw_length = 24;
  w.block_lengths = {9, 8};
  w.length = 17;
  w.block_checksums = {5, 6};
  return m;
}

TEST(MetadataExtensionsTest, RecordsRoundTripAsVersion2) {
  const Metadata m = WithExtensions();
  absl::StatusOr<std::string> bytes = EncodeMetadata(m);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<Metadata> decoded = DecodeMetadata(*bytes, "x/.metadata");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->version, kExtensionsFormatVersion);
  EXPECT_EQ(decoded->storage_data, m.storage_data);
  const StorageInfo& w =
      decoded->storage_data.at(MetadataIndex("model.w", Shape{0, 0}));
  EXPECT_EQ(w.RawLength(), 24);
  EXPECT_EQ(w.length, 17);
}

// A tensor of a dtype added after the first 17 makes the checkpoint dcp-3
// (older readers say "use a newer dcp"), with its extension records too.
TEST(MetadataExtensionsTest, LaterDtypesAreVersion3) {
  Metadata m = WithExtensions();
  auto& tensor =
      std::get<TensorStorageMetadata>(m.state_dict_metadata.at("model.w"));
  tensor.properties.dtype = DType::kF8E8M0;  // 1 byte: twice the columns
  tensor.size = {4, 12};
  tensor.chunks = {{{0, 0}, {2, 12}}, {{2, 0}, {2, 12}}};
  absl::StatusOr<Metadata> decoded =
      DecodeMetadata(*EncodeMetadata(m), "x/.metadata");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->version, kLaterDTypesFormatVersion);
  EXPECT_EQ(decoded->storage_data, m.storage_data);
  EXPECT_EQ(std::get<TensorStorageMetadata>(
                decoded->state_dict_metadata.at("model.w"))
                .properties.dtype,
            DType::kF8E8M0);
}

TEST(MetadataExtensionsTest, ItemsWithoutExtensionsKeepVersion1) {
  Metadata m = WithExtensions();
  for (auto& [index, info] : m.storage_data) {
    info.extensions.clear();
    info.block_lengths.clear();
    info.raw_length = 0;
  }
  m.storage_data[MetadataIndex("model.w", Shape{0, 0})].length = 24;
  m.storage_data[MetadataIndex("model.w", Shape{0, 0})].block_checksums = {1,
                                                                           2};
  absl::StatusOr<Metadata> decoded =
      DecodeMetadata(*EncodeMetadata(m), "x/.metadata");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->version, kFormatVersion);
}

// Writers encode only tensors; a bytes value claiming an encoding (and a
// raw size nothing bounds) is refused before any read allocates for it.
TEST(MetadataExtensionsTest, BytesValueStoredThroughExtensionsIsDataLoss) {
  Metadata m = WithExtensions();
  StorageInfo& extra = m.storage_data[MetadataIndex("extra")];
  extra.extensions = {"zstd/1.0"};
  extra.length = 1;
  extra.raw_length = 8;
  extra.block_lengths = {1};
  extra.block_checksums = {7};
  absl::StatusOr<std::string> bytes = EncodeMetadata(m);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::Status status = DecodeMetadata(*bytes, "ckpt/.metadata").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("ckpt/.metadata"), HasSubstr("extra"),
                    HasSubstr("bytes value stored through extensions")));
}

TEST(MetadataExtensionsTest, EncoderRefusesInconsistentRecords) {
  Metadata m = WithExtensions();
  m.storage_data[MetadataIndex("model.w", Shape{0, 0})].block_lengths = {9};
  EXPECT_EQ(EncodeMetadata(m).status().code(),
            absl::StatusCode::kInvalidArgument);
}

absl::Status DecodeCraftedExtensions(
    absl::FunctionRef<void(format::Metadata&)> mutate) {
  absl::StatusOr<std::string> bytes =
      testing::RewritePayload(*EncodeMetadata(WithExtensions()), mutate);
  if (!bytes.ok()) return bytes.status();
  return DecodeMetadata(*bytes, "ckpt/.metadata").status();
}

TEST(MetadataExtensionsTest, CraftedRecordsAreDataLossNamingTheItem) {
  ASSERT_TRUE(DecodeCraftedExtensions([](format::Metadata&) {}).ok());
  struct Case {
    const char* what;
    std::function<void(format::Metadata&)> mutate;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"version 1 with records",
       [](format::Metadata& p) { p.set_version(kFormatVersion); },
       "carries extension records"},
      {"count array too short",
       [](format::Metadata& p) {
         p.mutable_storage_extension_count()->RemoveLast();
       },
       "storage_extension_count has"},
      {"unknown extension id",
       [](format::Metadata& p) { p.set_storage_extension(0, 5); },
       "uses extension #5"},
      {"malformed descriptor",
       [](format::Metadata& p) { p.set_extensions(0, "zstd"); },
       "not name/MAJOR"},
      {"block larger than raw",
       [](format::Metadata& p) { p.set_storage_block_length(1, 9); },
       "stores 9 bytes for 8 raw bytes"},
      {"empty block",
       [](format::Metadata& p) { p.set_storage_block_length(0, 0); },
       "stores 0 bytes"},
      {"sizes do not add up to length",
       [](format::Metadata& p) { p.set_storage_block_length(0, 8); },
       "16 bytes in all, but length 17"},
      {"raw length not the chunk's",
       [](format::Metadata& p) {
         p.set_storage_raw_length(0, 40);
         p.add_storage_block_length(1);
       },
       "3 blocks but 2 checksums"},
      {"negative raw length",
       [](format::Metadata& p) { p.set_storage_raw_length(0, -1); },
       "raw length -1"},
      {"stray block sizes",
       [](format::Metadata& p) { p.add_storage_block_length(3); },
       "storage_block_length"},
  };
  for (const Case& c : cases) {
    absl::Status status = DecodeCraftedExtensions(c.mutate);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << c.what << status;
    EXPECT_THAT(status.message(), HasSubstr(c.message)) << c.what;
  }
  // Messages about one item name it and its file.
  absl::Status status = DecodeCraftedExtensions(
      [](format::Metadata& p) { p.set_storage_block_length(1, 9); });
  EXPECT_THAT(status.message(), HasSubstr("model.w"));
  EXPECT_THAT(status.message(), HasSubstr("__0_a_0.distcp"));
}

TEST(MetadataExtensionsTest, RawLengthMustBeWhatTheChunkHolds) {
  absl::Status status = DecodeCraftedExtensions(
      [](format::Metadata& p) { p.set_storage_raw_length(0, 25); });
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("25 raw bytes"));
}

}  // namespace
}  // namespace dcp
