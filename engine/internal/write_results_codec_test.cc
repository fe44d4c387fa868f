#include "engine/internal/write_results_codec.h"

#include <cstdint>
#include <string>
#include <vector>

#include "engine/internal/coordination.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dcp::internal {
namespace {

using ::testing::HasSubstr;

std::vector<WriteResult> SampleResults() {
  WriteResult tensor;
  tensor.index = MetadataIndex("model.w", Shape{4, 0}, 1);
  tensor.size_in_bytes = 4096;
  tensor.storage_data.relative_path = "__0_0.distcp";
  tensor.storage_data.offset = 8192;
  tensor.storage_data.length = 4096;
  tensor.storage_data.block_checksums = {1, 0xffffffffffffffffULL};
  tensor.storage_data.extensions = {"zstd/1.0"};
  tensor.storage_data.raw_length = 8192;
  tensor.storage_data.block_lengths = {1000, 3096};
  WriteResult value;
  value.index = MetadataIndex("step");
  value.size_in_bytes = 8;
  value.storage_data.relative_path = "__0_0.distcp";
  value.storage_data.length = 8;
  return {tensor, value};
}

TEST(WriteResultsCodecTest, RoundTripsEveryField) {
  const std::vector<WriteResult> in = SampleResults();
  absl::StatusOr<std::vector<WriteResult>> out =
      DecodeWriteResults(EncodeWriteResults(in));
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ((*out)[i].index, in[i].index) << i;
    EXPECT_EQ((*out)[i].size_in_bytes, in[i].size_in_bytes) << i;
    EXPECT_EQ((*out)[i].storage_data, in[i].storage_data) << i;
  }
}

TEST(WriteResultsCodecTest, GarbageIsDataLoss) {
  absl::StatusOr<std::vector<WriteResult>> out =
      DecodeWriteResults(std::string("\xff\xff\xff\xff\x0f", 5));
  EXPECT_EQ(out.status().code(), absl::StatusCode::kDataLoss);
}

// Found by //fuzz:write_results: a raw length or block lengths without an
// extension record decoded, and re-encoding dropped them, so the rank and
// the coordinator disagreed on the item.
TEST(WriteResultsCodecTest, LengthsWithoutExtensionsAreDataLoss) {
  for (bool block_lengths : {false, true}) {
    engine_wire::WriteResults message;
    message.set_version(1);
    engine_wire::WriteResult* result = message.add_results();
    result->set_fqn("step");
    result->set_relative_path("__0_0.distcp");
    result->set_length(8);
    if (block_lengths) {
      result->add_block_lengths(8);
    } else {
      result->set_raw_length(80);
    }
    absl::StatusOr<std::vector<WriteResult>> out =
        DecodeWriteResults(message.SerializeAsString());
    EXPECT_EQ(out.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(out.status().message()),
                HasSubstr("\"step\" is inconsistent"));
    result->add_extensions("zstd/1.0");
    EXPECT_TRUE(DecodeWriteResults(message.SerializeAsString()).ok());
  }
}

// A length past INT32_MAX is refused before protobuf sees it: 4 GiB plus
// the length of a valid encoding, cast to int, is that valid length, which
// would decode the first bytes as if they were all. The bytes past them are
// never read.
TEST(WriteResultsCodecTest, InputOver2GiBIsRefusedUnread) {
  const std::string one = EncodeWriteResults(SampleResults());
  absl::StatusOr<std::vector<WriteResult>> out = DecodeWriteResults(
      absl::string_view(one.data(), (size_t{1} << 32) + one.size()));
  EXPECT_EQ(out.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("do not parse"));
}

}  // namespace
}  // namespace dcp::internal
