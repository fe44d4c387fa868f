// FileSystemWriterOptions::serialization_format = kSafetensors: every data
// file is a valid safetensors file holding the items under their names, and
// dcp loads the checkpoint (whole and resharded) bit for bit.
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file_system.h"
#include "io/file_system_storage.h"
#include "io/fs_test_helpers.h"
#include "io/safetensors.h"
#include "io/testing/fake_planners.h"
#include "io/testing/sample_state.h"
#include "planner/metadata.h"

namespace dcp {
namespace {

using ::dcp::fs_testing::DataFiles;
using ::dcp::fs_testing::ExpectLoads;
using ::dcp::fs_testing::NewTestDir;
using ::dcp::fs_testing::ReadMetadataOf;
using ::dcp::fs_testing::Sample;
using ::dcp::fs_testing::Save;
using ::dcp::testing::FakeLoadPlanner;
using ::dcp::testing::FakeSavePlanner;
using ::dcp::testing::LoadOneRank;
using ::dcp::testing::PatternTensor;
using ::dcp::testing::SaveOneRank;
using ::testing::HasSubstr;

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

FileSystemWriterOptions SafetensorsOptions(int threads, bool direct) {
  FileSystemWriterOptions options;
  options.serialization_format = SerializationFormat::kSafetensors;
  options.thread_count = threads;
  options.direct_io = direct;
  return options;
}

// The sample plus one tensor of every dtype the format holds.
Sample EveryDtype() {
  Sample sample = Sample::Make(5);
  for (int d = 0; d < kNumDTypes; ++d) {
    const DType dtype = static_cast<DType>(d);
    if (dtype == DType::kC64 || !InSafetensors(dtype)) continue;
    sample.tensors[absl::StrCat("every.", DTypeName(dtype))] =
        PatternTensor(dtype, {3, 2}, 40 + d);
  }
  sample.bytes["blob"] = std::string("\0\x01\xffsafetensors", 14);
  return sample;
}

// Every data file of `dir` parses as safetensors, and every item of the
// metadata is the tensor of its name, with the item's bytes.
void ExpectSafetensorsFiles(const std::string& dir, const Sample& sample) {
  absl::StatusOr<Metadata> metadata = ReadMetadataOf(dir);
  ASSERT_TRUE(metadata.ok()) << metadata.status();
  std::map<std::string, std::string> files;
  for (const std::string& name : DataFiles(dir)) {
    files[name] = ReadWhole(JoinPath(dir, name));
  }
  ASSERT_FALSE(files.empty());
  std::map<std::string, SafetensorsHeader> headers;
  for (const auto& [name, bytes] : files) {
    absl::StatusOr<SafetensorsHeader> header = ParseSafetensors(bytes, name);
    ASSERT_TRUE(header.ok()) << header.status();
    EXPECT_EQ(header->data_start() % 4096, 0) << name;
    EXPECT_EQ(header->metadata.at("format"), "pt");
    headers[name] = *header;
  }
  size_t items = 0;
  for (const auto& [index, info] : metadata->storage_data) {
    const SafetensorsHeader& header = headers.at(info.relative_path);
    const std::string& bytes = files.at(info.relative_path);
    const SafetensorsTensor* found = nullptr;
    for (const SafetensorsTensor& t : header.tensors) {
      if (t.name == index.fqn) found = &t;
    }
    ASSERT_NE(found, nullptr) << index.ToString();
    EXPECT_EQ(header.data_start() + found->begin, info.offset);
    EXPECT_EQ(found->end - found->begin, info.length);
    const std::string stored = bytes.substr(info.offset, info.length);
    if (auto t = sample.tensors.find(index.fqn); t != sample.tensors.end()) {
      EXPECT_EQ(found->dtype, t->second.dtype()) << index.fqn;
      EXPECT_EQ(found->shape, t->second.sizes()) << index.fqn;
      EXPECT_EQ(stored, std::string(static_cast<const char*>(t->second.data()),
                                    t->second.nbytes()))
          << index.fqn;
    } else {
      EXPECT_EQ(found->dtype, DType::kU8) << index.fqn;
      EXPECT_EQ(stored, sample.bytes.at(index.fqn)) << index.fqn;
    }
    ++items;
  }
  EXPECT_EQ(items, sample.tensors.size() + sample.bytes.size());
}

TEST(SafetensorsFormatTest, EveryDataFileIsSafetensorsAndLoads) {
  const Sample sample = EveryDtype();
  for (int threads : {1, 3}) {
    for (bool direct : {true, false}) {
      SCOPED_TRACE(absl::StrCat("threads ", threads, " direct ", direct));
      const std::string dir = NewTestDir(absl::StrCat("st", threads, direct));
      absl::Status saved =
          Save(dir, sample, SafetensorsOptions(threads, direct));
      ASSERT_TRUE(saved.ok()) << saved;
      EXPECT_EQ(DataFiles(dir).size(), static_cast<size_t>(threads));
      ExpectSafetensorsFiles(dir, sample);
      ExpectLoads(dir, sample);
    }
  }
}

TEST(SafetensorsFormatTest, ChunksAreNamedByOffsetsAndReshard) {
  const std::string dir = NewTestDir("st_reshard");
  const fs_testing::RowShardedColumnBlock w;
  FakeSavePlanner save;
  w.AddShards(save);
  FileSystemWriter writer(dir, SafetensorsOptions(1, true));
  absl::Status saved = SaveOneRank(writer, save);
  ASSERT_TRUE(saved.ok()) << saved;
  const std::vector<std::string> names = DataFiles(dir);
  ASSERT_EQ(names.size(), 1u);
  const std::string bytes = ReadWhole(JoinPath(dir, names[0]));
  absl::StatusOr<SafetensorsHeader> header = ParseSafetensors(bytes, names[0]);
  ASSERT_TRUE(header.ok()) << header.status();
  ASSERT_EQ(header->tensors.size(), 2u);
  EXPECT_EQ(header->tensors[0].name, "w@0,0");
  EXPECT_EQ(header->tensors[1].name, "w@2,0");
  EXPECT_EQ(header->tensors[1].shape, (Shape{2, 6}));
  EXPECT_EQ(
      bytes.substr(header->data_start()),
      std::string(static_cast<const char*>(w.full.data()), w.full.nbytes()));

  FakeLoadPlanner load;
  Tensor block = Tensor::Empty(DType::kI32, {4, 3});
  load.SetDestination(MetadataIndex("w", Shape{0, 1}), block);
  LoadPlan plan;
  for (int64_t row : {0, 2}) {
    plan.items.push_back(fs_testing::RowShardedColumnBlock::BlockItem(row));
  }
  FileSystemReader reader(dir);
  absl::Status status = LoadOneRank(reader, load, &plan);
  ASSERT_TRUE(status.ok()) << status;
  w.ExpectBlock(block);
}

TEST(SafetensorsFormatTest, ChecksumsStillCatchACorruptedByte) {
  const Sample sample = Sample::Make(2);
  const std::string dir = NewTestDir("st_corrupt");
  ASSERT_TRUE(Save(dir, sample, SafetensorsOptions(1, false)).ok());
  absl::StatusOr<Metadata> metadata = ReadMetadataOf(dir);
  ASSERT_TRUE(metadata.ok());
  const auto& info =
      metadata->storage_data.at(MetadataIndex("model.f32", Shape{0, 0}));
  ::dcp::testing::FlipByte(JoinPath(dir, info.relative_path), info.offset + 3);
  absl::Status loaded = ::dcp::fs_testing::LoadSample(dir, sample);
  EXPECT_EQ(loaded.code(), absl::StatusCode::kDataLoss) << loaded;
}

TEST(SafetensorsFormatTest, RefusesExtensions) {
  const std::string dir = NewTestDir("st_zstd");
  FileSystemWriterOptions options = SafetensorsOptions(1, false);
  absl::StatusOr<ExtensionChain> zstd = ParseCompression("zstd:3");
  ASSERT_TRUE(zstd.ok());
  options.extensions = *zstd;
  absl::Status saved = Save(dir, Sample::Make(1), options);
  EXPECT_EQ(saved.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(saved.message(), HasSubstr("safetensors"));
}

TEST(SafetensorsFormatTest, NativeDefaultIsUnchanged) {
  // The default is the native layout: no safetensors header at offset 0.
  EXPECT_EQ(FileSystemWriterOptions().serialization_format,
            SerializationFormat::kNative);
  const Sample sample = Sample::Make(3);
  const std::string dir = NewTestDir("st_native");
  FileSystemWriterOptions options;
  options.direct_io = false;
  ASSERT_TRUE(Save(dir, sample, options).ok());
  absl::StatusOr<Metadata> metadata = ReadMetadataOf(dir);
  ASSERT_TRUE(metadata.ok());
  int64_t smallest = INT64_MAX;
  for (const auto& [index, info] : metadata->storage_data) {
    smallest = std::min(smallest, info.offset);
  }
  EXPECT_EQ(smallest, 0);
  ExpectLoads(dir, sample);
}

}  // namespace
}  // namespace dcp
