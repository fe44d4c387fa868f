#include "io/checkpoint_formats.h"

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/state_dict.h"
#include "core/tensor.h"
#include "engine/checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file_system_storage.h"
#include "io/hf_storage.h"
#include "io/mega_storage.h"
#include "io/testing/sample_state.h"

namespace dcp {
namespace {

using ::dcp::testing::ListNames;
using ::dcp::testing::NewTestDir;
using ::testing::AllOf;
using ::testing::HasSubstr;

StateDict State(float value) {
  StateDict state;
  state["w"] = Tensor::Empty(DType::kF32, {4});
  float* data = static_cast<float*>(state["w"].tensor().data());
  for (int i = 0; i < 4; ++i) data[i] = value;
  return state;
}

enum class Kind { kDcp, kRankLocal, kMega, kHf };

absl::Status SaveAs(Kind kind, const std::string& dir, float value) {
  StateDict state = State(value);
  SaveOptions options;
  options.no_dist = true;
  FileSystemWriter fs_writer(dir);
  MegaStorageWriter mega_writer(dir);
  HuggingFaceStorageWriter hf_writer(dir);
  switch (kind) {
    case Kind::kDcp:
      options.checkpoint_id = dir;
      break;
    case Kind::kRankLocal:
      options.checkpoint_id = dir;
      options.use_collectives = false;
      break;
    case Kind::kMega:
      options.storage_writer = &mega_writer;
      break;
    case Kind::kHf:
      options.storage_writer = &hf_writer;
      break;
  }
  return Save(state, options).status();
}

float LoadByPath(const std::string& dir) {
  StateDict state = State(0);
  LoadOptions options;
  options.checkpoint_id = dir;
  options.no_dist = true;
  EXPECT_TRUE(Load(state, options).ok());
  return static_cast<const float*>(state["w"].tensor().data())[0];
}

TEST(CheckpointFormatsTest, EvidenceNamesTheFileOfEachFormat) {
  auto& fs = LocalFileSystem();
  const std::string dir = NewTestDir("formats_evidence");
  for (CheckpointFormat f : {CheckpointFormat::kDcp, CheckpointFormat::kMega,
                             CheckpointFormat::kHuggingFace}) {
    EXPECT_EQ(*CheckpointFormatEvidence(fs, dir, f), "");
    EXPECT_EQ(*CheckpointFormatEvidence(fs, dir + "/absent", f), "");
  }
  ASSERT_TRUE(SaveAs(Kind::kHf, dir, 1).ok());
  EXPECT_EQ(*CheckpointFormatEvidence(fs, dir, CheckpointFormat::kHuggingFace),
            dir + "/model-00001-of-00001.safetensors");
  EXPECT_EQ(*CheckpointFormatEvidence(fs, dir, CheckpointFormat::kDcp), "");
  EXPECT_EQ(*CheckpointFormatEvidence(fs, dir, CheckpointFormat::kMega), "");
  EXPECT_TRUE(RefuseOtherFormats(fs, dir, CheckpointFormat::kHuggingFace).ok());
}

// Each save of one format into a directory holding another format's
// checkpoint is refused before it writes anything; the checkpoint there
// stays as it was, and a save of the same format still replaces it.
TEST(CheckpointFormatsTest, ASaveBesideAnotherFormatIsRefused) {
  const std::vector<Kind> kinds = {Kind::kDcp, Kind::kRankLocal, Kind::kMega,
                                   Kind::kHf};
  auto same_format = [](Kind a, Kind b) {
    auto format = [](Kind k) { return k == Kind::kRankLocal ? Kind::kDcp : k; };
    return format(a) == format(b);
  };
  int dirs = 0;
  for (Kind first : kinds) {
    for (Kind second : kinds) {
      if (same_format(first, second)) continue;
      const std::string dir =
          NewTestDir(absl::StrCat("formats_mixed_", dirs++));
      ASSERT_TRUE(SaveAs(first, dir, 1).ok());
      const std::vector<std::string> before = ListNames(dir);
      absl::Status refused = SaveAs(second, dir, 2);
      EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition)
          << static_cast<int>(first) << " then " << static_cast<int>(second)
          << ": " << refused;
      EXPECT_THAT(refused.message(),
                  AllOf(HasSubstr(dir + " already holds a "),
                        HasSubstr("would leave two checkpoints in one "
                                  "directory")));
      EXPECT_EQ(ListNames(dir), before) << refused;
      if (first != Kind::kRankLocal) EXPECT_EQ(LoadByPath(dir), 1.0f);
    }
  }
  const std::string dir = NewTestDir("formats_same");
  ASSERT_TRUE(SaveAs(Kind::kHf, dir, 1).ok());
  ASSERT_TRUE(SaveAs(Kind::kHf, dir, 3).ok());
  EXPECT_EQ(LoadByPath(dir), 3.0f);
}

// A refused save creates nothing (a distributed Hugging Face save's
// sharded/ included), and an empty sharded/ is no checkpoint.
TEST(CheckpointFormatsTest, ARefusedSaveLeavesNothingAndEmptyShardsAreNone) {
  const std::string dir = NewTestDir("formats_refused_sharded");
  ASSERT_TRUE(SaveAs(Kind::kDcp, dir, 1).ok());
  const std::vector<std::string> before = ListNames(dir);
  StateDict state = State(2);
  HuggingFaceStorageWriterOptions hf;
  hf.save_distributed = true;
  hf.enable_consolidation = true;
  HuggingFaceStorageWriter writer(dir, hf);
  SaveOptions options;
  options.no_dist = true;
  options.storage_writer = &writer;
  EXPECT_EQ(Save(state, options).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ListNames(dir), before);
  const std::string fresh = NewTestDir("formats_empty_sharded");
  std::filesystem::create_directories(fresh + "/sharded");
  EXPECT_EQ(*CheckpointFormatEvidence(LocalFileSystem(), fresh,
                                      CheckpointFormat::kHuggingFace),
            "");
  EXPECT_TRUE(SaveAs(Kind::kDcp, fresh, 3).ok());
  EXPECT_EQ(LoadByPath(fresh), 3.0f);
}

TEST(CheckpointFormatsTest, MessagesNameBothFormats) {
  const std::string dir = NewTestDir("formats_message");
  ASSERT_TRUE(SaveAs(Kind::kDcp, dir, 1).ok());
  absl::Status refused = SaveAs(Kind::kHf, dir, 2);
  EXPECT_THAT(refused.message(),
              AllOf(HasSubstr("already holds a dcp checkpoint (" + dir +
                              "/.metadata); a Hugging Face save beside it"),
                    HasSubstr("save into another directory or remove that "
                              "checkpoint first")));
}

TEST(CheckpointFormatsTest, ADcpReaderOfAnotherFormatSaysWhichToUse) {
  for (Kind kind : {Kind::kHf, Kind::kMega}) {
    const std::string dir = NewTestDir(
        kind == Kind::kHf ? "formats_reader_hf" : "formats_reader_mega");
    ASSERT_TRUE(SaveAs(kind, dir, 1).ok());
    StateDict state = State(0);
    FileSystemReader reader(dir);
    LoadOptions options;
    options.storage_reader = &reader;
    options.no_dist = true;
    absl::Status status = Load(state, options);
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_THAT(status.message(),
                AllOf(HasSubstr(dir + " holds a "),
                      HasSubstr(kind == Kind::kHf ? "HuggingFaceStorageReader"
                                                  : "MegaStorageReader")));
  }
}

}  // namespace
}  // namespace dcp
