// MegaStorageWriter/Reader against hostile state dicts and directories:
// names JSON cannot hold, and chunks of one tensor that two files store at
// the same offsets. Each is a Status naming the value or files, never an
// exception or a silently wrong load.
#include "io/mega_storage.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/checksum.h"
#include "core/state_dict.h"
#include "core/tensor.h"
#include "engine/checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/fault_injection.h"
#include "io/mega_format.h"

namespace dcp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr char kFirst[] = "model-00001-of-00002.mega";
constexpr char kSecond[] = "model-00002-of-00002.mega";

std::string TempDir(const std::string& tag) {
  const char* root = std::getenv("TEST_TMPDIR");
  std::string dir =
      absl::StrCat(root != nullptr ? root : "/tmp", "/", tag, "-XXXXXX");
  return mkdtemp(dir.data());
}

std::string Bytes(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()),
                     values.size() * sizeof(float));
}

Tensor F32(const std::vector<float>& values) {
  Tensor t = Tensor::Empty(DType::kF32, {static_cast<int64_t>(values.size())});
  std::memcpy(t.data(), values.data(), values.size() * sizeof(float));
  return t;
}

std::vector<float> ValuesOf(const Tensor& t) {
  std::vector<float> out(t.numel());
  std::memcpy(out.data(), t.data(), t.nbytes());
  return out;
}

// Writes a MEGA file at `path` holding one chunk of the F32 tensor "w" of
// shape [2]: at `offset`, `values` long, with valid checksums.
void WriteChunkOfW(const std::string& path, int64_t offset,
                   const std::vector<float>& values) {
  MegaHeader header;
  header.checksum_block_size = kMegaAlignment;
  MegaEntry e;
  e.name = "w";
  e.dtype = DType::kF32;
  e.shape = {2};
  e.offsets = {offset};
  e.sizes = {static_cast<int64_t>(values.size())};
  const std::string data = Bytes(values);
  e.length = static_cast<int64_t>(data.size());
  e.checksums = BlockChecksums(reinterpret_cast<const std::byte*>(data.data()),
                               e.length, header.checksum_block_size);
  header.entries = {e};
  ASSERT_TRUE(LayOutMegaFile(header).ok());
  std::string bytes = EncodeMegaHeader(header);
  bytes.resize(static_cast<size_t>(header.file_size), '\0');
  bytes.replace(static_cast<size_t>(header.data_start), data.size(), data);
  std::ofstream(path, std::ios::binary) << bytes;
}

// A directory whose two files both hold a chunk of "w" at offset 0: the
// first [1.5, 2.5], the second `second` (empty or not).
std::string TwoFilesAtOffsetZero(const std::string& tag,
                                 const std::vector<float>& second) {
  const std::string dir = TempDir(tag);
  WriteChunkOfW(absl::StrCat(dir, "/", kFirst), 0, {1.5f, 2.5f});
  WriteChunkOfW(absl::StrCat(dir, "/", kSecond), 0, second);
  MegaIndex index;
  index.total_size = 8 + 4 * static_cast<int64_t>(second.size());
  index.files = {kFirst, kSecond};
  index.weight_map["w"] = {kFirst, kSecond};
  std::ofstream(absl::StrCat(dir, "/", kMegaIndexFileName))
      << EncodeMegaIndex(index);
  return dir;
}

absl::Status LoadMega(const std::string& dir, StateDict& state) {
  MegaStorageReader reader(dir);
  LoadOptions load;
  load.storage_reader = &reader;
  return Load(state, load);
}

// An empty chunk at a real chunk's offsets replaced that chunk's storage
// record (keyed by name and offsets): the load read "w" from zero bytes.
TEST(MegaReader, EmptyChunkAtARealChunksOffsetsIsIgnored) {
  const std::string dir = TwoFilesAtOffsetZero("mega-empty-dup", {});
  MegaStorageReader reader(dir);
  absl::StatusOr<Metadata> metadata = reader.ReadMetadata();
  ASSERT_TRUE(metadata.ok()) << metadata.status();
  auto info = metadata->storage_data.find(MetadataIndex("w", Shape{0}));
  ASSERT_NE(info, metadata->storage_data.end());
  EXPECT_EQ(info->second.relative_path, kFirst);
  EXPECT_EQ(info->second.length, 8);

  StateDict state;
  state["w"] = F32({0, 0});
  const absl::Status loaded = LoadMega(dir, state);
  ASSERT_TRUE(loaded.ok()) << loaded;
  EXPECT_EQ(ValuesOf(state["w"].tensor()), (std::vector<float>{1.5f, 2.5f}));
}

TEST(MegaReader, TwoFilesHoldingOneChunkIsDataLossNamingBoth) {
  const std::string dir = TwoFilesAtOffsetZero("mega-dup", {3, 4});
  MegaStorageReader reader(dir);
  absl::Status status = reader.ReadMetadata().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr(absl::StrCat(dir, "/", kFirst)),
                    HasSubstr(absl::StrCat(dir, "/", kSecond)),
                    HasSubstr("tensor \"w\" at [0]")));
}

// nlohmann's dump() threw type_error.316 on the name in the plan, header
// and index: an exception out of a Status-based save.
TEST(MegaWriter, NonUtf8NameFailsThePlanNamingItEscaped) {
  const std::string dir = TempDir("mega-utf8");
  StateDict state;
  state["\xff"] = F32({1, 2});
  state["ok"] = F32({3});
  MegaStorageWriter writer(dir);
  SaveOptions save;
  save.storage_writer = &writer;
  absl::StatusOr<Metadata> saved;
  ASSERT_NO_THROW(saved = Save(state, save));
  ASSERT_FALSE(saved.ok());
  EXPECT_EQ(saved.status().code(), absl::StatusCode::kInvalidArgument)
      << saved.status();
  EXPECT_THAT(saved.status().message(),
              AllOf(HasSubstr("\"\\xff\""), HasSubstr("not valid UTF-8")));
  // Nothing committed, nothing left.
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    ADD_FAILURE() << "left " << entry.path();
  }
}

TEST(MegaFormat, LayOutRefusesANonUtf8Name) {
  MegaHeader header;
  MegaEntry e;
  e.name = "a\xff";
  e.is_tensor = false;
  header.entries = {e};
  absl::Status status;
  ASSERT_NO_THROW(status = LayOutMegaFile(header));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("\"a\\xff\""));
}

// A save whose SetUp could not list the directory took it for empty: the
// old checkpoint's files outlived the commit beside the new ones.
TEST(MegaWriter, UnlistableDirectoryFailsTheSave) {
  const std::string dir = TempDir("mega-unlistable");
  StateDict state;
  state["w"] = F32({1, 2});
  {
    MegaStorageWriter writer(dir);
    SaveOptions save;
    save.storage_writer = &writer;
    ASSERT_TRUE(Save(state, save).ok());
  }
  FaultInjectionFileSystem fs(LocalFileSystem());
  fs.Inject(Fault{
      .op = FaultOp::kList, .error = EACCES, .path_contains = dir, .nth = 0});
  MegaStorageWriterOptions options;
  options.file_system = &fs;
  MegaStorageWriter writer(dir, options);
  SaveOptions save;
  save.storage_writer = &writer;
  StateDict newer;
  newer["w"] = F32({3, 4});
  absl::StatusOr<Metadata> saved = Save(newer, save);
  ASSERT_FALSE(saved.ok());
  EXPECT_EQ(saved.status().code(), absl::StatusCode::kPermissionDenied)
      << saved.status();
  EXPECT_THAT(saved.status().message(),
              AllOf(HasSubstr("cannot list MEGA directory"), HasSubstr(dir)));
  // The old checkpoint is what a load sees.
  StateDict loaded;
  loaded["w"] = F32({0, 0});
  ASSERT_TRUE(LoadMega(dir, loaded).ok());
  EXPECT_EQ(ValuesOf(loaded["w"].tensor()), (std::vector<float>{1, 2}));
}

}  // namespace
}  // namespace dcp
