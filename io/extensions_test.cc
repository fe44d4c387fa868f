#include "io/extensions.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dcp {
namespace {

using ::testing::HasSubstr;

std::vector<std::byte> Compressible(size_t n) {
  std::vector<std::byte> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = std::byte(i % 7 == 0 ? i / 7 : 3);
  return out;
}

std::vector<std::byte> Random(size_t n, uint32_t seed) {
  std::vector<std::byte> out(n);
  std::mt19937 gen(seed);
  for (auto& b : out) b = std::byte(gen());
  return out;
}

// An extension that XORs every byte and keeps its size: never shrinks.
class XorExtension final : public StreamExtension {
 public:
  absl::string_view name() const override { return "xor"; }
  int major_version() const override { return 2; }
  int minor_version() const override { return 1; }
  absl::StatusOr<size_t> Encode(absl::Span<const std::byte> in,
                                absl::Span<std::byte> out) const override {
    for (size_t i = 0; i < in.size(); ++i) out[i] = in[i] ^ std::byte{0x5a};
    return in.size();
  }
  absl::StatusOr<size_t> Decode(absl::Span<const std::byte> in,
                                absl::Span<std::byte> out) const override {
    for (size_t i = 0; i < in.size(); ++i) out[i] = in[i] ^ std::byte{0x5a};
    return in.size();
  }
};

TEST(ExtensionDescriptorTest, ParsesNameAndVersions) {
  absl::StatusOr<ExtensionDescriptor> d = ParseExtensionDescriptor("zstd/1.2");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->name, "zstd");
  EXPECT_EQ(d->major, 1);
  EXPECT_EQ(d->minor, 2);
  d = ParseExtensionDescriptor("my-ext_2/7");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->major, 7);
  EXPECT_EQ(d->minor, 0);
  for (const char* bad :
       {"", "zstd", "zstd/", "/1", "Zstd/1", "zstd/1.", "zstd/x", "zstd/1.2.3",
        "zstd/-1", "a b/1", "zstd/1234567890"}) {
    absl::StatusOr<ExtensionDescriptor> parsed = ParseExtensionDescriptor(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss) << bad;
  }
}

TEST(ExtensionRegistryTest, DefaultKnowsZstd) {
  const ExtensionRegistry& registry = ExtensionRegistry::Default();
  EXPECT_THAT(registry.Descriptors(), ::testing::ElementsAre("zstd/1.0"));
  absl::StatusOr<const StreamExtension*> zstd =
      registry.Find("zstd/1.0", "tensor w");
  ASSERT_TRUE(zstd.ok()) << zstd.status();
  EXPECT_EQ((*zstd)->name(), "zstd");
  // A newer minor version reads with the same major.
  EXPECT_TRUE(registry.Find("zstd/1.7", "tensor w").ok());
  EXPECT_TRUE(registry.Find("zstd/1", "tensor w").ok());
}

TEST(ExtensionRegistryTest, UnknownNameAndMajorVersionNameBoth) {
  const ExtensionRegistry& registry = ExtensionRegistry::Default();
  absl::StatusOr<const StreamExtension*> found =
      registry.Find("lz4/1.0", "tensor layer.w@[0, 0]");
  EXPECT_EQ(found.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(found.status().message(), HasSubstr("tensor layer.w@[0, 0]"));
  EXPECT_THAT(found.status().message(), HasSubstr("lz4/1.0"));
  EXPECT_THAT(found.status().message(), HasSubstr("known: zstd/1.0"));

  found = registry.Find("zstd/2.0", "tensor layer.w@[0, 0]");
  EXPECT_EQ(found.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(found.status().message(), HasSubstr("tensor layer.w@[0, 0]"));
  EXPECT_THAT(found.status().message(), HasSubstr("zstd/2.0"));
  EXPECT_THAT(found.status().message(), HasSubstr("major version 1"));

  found = registry.Find("zstd", "tensor w");
  EXPECT_EQ(found.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(found.status().message(), HasSubstr("tensor w"));
}

TEST(ExtensionRegistryTest, RegistersOwnExtensionsOnce) {
  ExtensionRegistry registry;
  ASSERT_TRUE(registry.Register(std::make_shared<XorExtension>()).ok());
  EXPECT_EQ(registry.Register(std::make_shared<XorExtension>()).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(registry.Find("xor/2.0", "x").ok());
  EXPECT_EQ(registry.Find("zstd/1.0", "x").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ZstdExtensionTest, BlocksRoundTripAndShrink) {
  ExtensionChain chain = {NewZstdExtension(3)};
  std::vector<const StreamExtension*> decode = {chain[0].get()};
  std::vector<std::byte> scratch;
  for (size_t n : {size_t{1}, size_t{100}, size_t{4096}, size_t{1} << 20}) {
    const std::vector<std::byte> raw = Compressible(n);
    std::vector<std::byte> stored(n);
    absl::StatusOr<size_t> size =
        EncodeBlock(chain, raw, absl::MakeSpan(stored), scratch);
    ASSERT_TRUE(size.ok()) << size.status();
    if (n >= 4096) {
      EXPECT_LT(*size, n / 4) << n;
    }
    std::vector<std::byte> back(n);
    ASSERT_TRUE(DecodeBlock(decode, {stored.data(), *size},
                            absl::MakeSpan(back), scratch)
                    .ok());
    EXPECT_EQ(back, raw);
  }
}

TEST(ZstdExtensionTest, IncompressibleBlocksAreStoredRaw) {
  ExtensionChain chain = {NewZstdExtension(3)};
  const std::vector<std::byte> raw = Random(1 << 20, 7);
  std::vector<std::byte> stored(raw.size());
  std::vector<std::byte> scratch;
  absl::StatusOr<size_t> size =
      EncodeBlock(chain, raw, absl::MakeSpan(stored), scratch);
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(*size, raw.size());  // Stored as is: the bytes are `raw`.
  std::vector<std::byte> back(raw.size());
  ASSERT_TRUE(
      DecodeBlock({chain[0].get()}, raw, absl::MakeSpan(back), scratch).ok());
  EXPECT_EQ(back, raw);
}

TEST(ZstdExtensionTest, CorruptFramesAreDataLoss) {
  ExtensionChain chain = {NewZstdExtension(1)};
  const std::vector<const StreamExtension*> decode = {chain[0].get()};
  const std::vector<std::byte> raw = Compressible(1 << 16);
  std::vector<std::byte> stored(raw.size());
  std::vector<std::byte> scratch;
  const size_t size = *EncodeBlock(chain, raw, absl::MakeSpan(stored), scratch);
  stored.resize(size);
  std::vector<std::byte> back(raw.size());

  // Declares more bytes than the block holds.
  std::vector<std::byte> smaller(raw.size() - 1);
  absl::Status status =
      DecodeBlock(decode, stored, absl::MakeSpan(smaller), scratch);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  // Trailing garbage after the frame.
  std::vector<std::byte> longer = stored;
  longer.push_back(std::byte{0});
  status = DecodeBlock(decode, longer, absl::MakeSpan(back), scratch);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr("zstd/1.0"));
  // Flipped bytes in every position either fail or (never) decode wrongly.
  for (size_t i = 0; i < stored.size(); ++i) {
    std::vector<std::byte> bad = stored;
    bad[i] ^= std::byte{0xff};
    status = DecodeBlock(decode, bad, absl::MakeSpan(back), scratch);
    if (status.ok()) {
      // zstd frames carry no checksum here (dcp checksums the stored
      // bytes); a flip may decode to other bytes of the right size.
      continue;
    }
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  }
  // A stored block larger than its raw size.
  status = DecodeBlock(decode, Compressible(10), absl::MakeSpan(back.data(), 9),
                       scratch);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
}

TEST(ExtensionChainTest, ChainsApplyInOrderAndStopWhenNotShrinking) {
  const ExtensionChain chain = {NewZstdExtension(3),
                                std::make_shared<XorExtension>()};
  // XOR never shrinks: every block is stored as is.
  const std::vector<std::byte> raw = Compressible(1 << 16);
  std::vector<std::byte> stored(raw.size());
  std::vector<std::byte> scratch;
  EXPECT_EQ(*EncodeBlock(chain, raw, absl::MakeSpan(stored), scratch),
            raw.size());

  // XOR then zstd: zstd shrinks the XORed bytes; decoding undoes both.
  const ExtensionChain reversed = {std::make_shared<XorExtension>(),
                                   NewZstdExtension(3)};
  absl::StatusOr<size_t> size =
      EncodeBlock(reversed, raw, absl::MakeSpan(stored), scratch);
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, raw.size());  // XOR alone does not shrink: raw.
  ExtensionRegistry registry;
  ASSERT_TRUE(registry.Register(std::make_shared<XorExtension>()).ok());
  ASSERT_TRUE(registry.Register(NewZstdExtension()).ok());
  absl::StatusOr<std::vector<const StreamExtension*>> resolved =
      ResolveExtensions(registry, {"zstd/1.0", "xor/2.1"}, "tensor t");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ((*resolved)[1]->name(), "xor");
  EXPECT_EQ(ResolveExtensions(registry, {"zstd/1.0", "rot13/1.0"}, "tensor t")
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ParseCompressionTest, NoneZstdAndLevels) {
  EXPECT_TRUE(ParseCompression("none")->empty());
  absl::StatusOr<ExtensionChain> chain = ParseCompression("zstd");
  ASSERT_TRUE(chain.ok());
  ASSERT_EQ(chain->size(), 1u);
  EXPECT_EQ((*chain)[0]->descriptor(), "zstd/1.0");
  EXPECT_TRUE(ParseCompression("zstd:19").ok());
  EXPECT_TRUE(ParseCompression("zstd:-5").ok());
  for (const char* bad : {"zstd:", "zstd:0", "zstd:99", "zstd:x", "gzip"}) {
    EXPECT_EQ(ParseCompression(bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

}  // namespace
}  // namespace dcp
