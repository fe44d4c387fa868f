// `dcp convert --to safetensors` (tools/convert.h) commits its output so
// that a directory that looks complete is complete: a failed rename leaves
// nothing behind (and the same command then succeeds), and a conversion
// stopped at any rename (killed: no clean-up) never leaves safetensors
// files without their index. (tests/convert_test.cc covers the rest.)
#include <cstring>
#include <filesystem>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/state_dict.h"
#include "engine/checkpoint.h"
#include "gtest/gtest.h"
#include "io/fault_injection.h"
#include "io/file_system.h"
#include "io/hf_storage.h"
#include "tools/convert.h"

namespace dcp {
namespace {

// A fresh directory under the test's temporary directory.
std::string FreshDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp != nullptr && *tmp ? tmp : "/tmp",
                                       "/convert_commit_test_", name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::set<std::string> ListFiles(const std::string& dir) {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

// Three tensors of 4000 bytes each: three files at max_shard_bytes 5000.
constexpr int kFiles = 3;
// The renames of a conversion: every file and the index.
constexpr int kRenames = kFiles + 1;

StateDict SampleState() {
  StateDict state;
  for (int t = 0; t < kFiles; ++t) {
    Tensor tensor = Tensor::Empty(DType::kF32, {10, 100});
    auto* data = static_cast<float*>(tensor.data());
    for (int i = 0; i < 1000; ++i) data[i] = static_cast<float>(t * 1000 + i);
    state[absl::StrCat("layer", t, ".weight")] = std::move(tensor);
  }
  return state;
}

// Saves SampleState() as a dcp checkpoint in `dir`.
void SaveSource(const std::string& dir) {
  SaveOptions save;
  save.checkpoint_id = dir;
  save.no_dist = true;
  StateDict state = SampleState();
  ASSERT_TRUE(Save(state, save).status().ok());
}

ConvertOptions Options(FileSystemBase* fs) {
  ConvertOptions options;
  options.to = "safetensors";
  options.threads = 1;
  options.max_shard_bytes = 5000;
  options.file_system = fs;
  return options;
}

// Whether a reader takes `dir` for a checkpoint (it reads its metadata).
bool LooksLikeACheckpoint(const std::string& dir) {
  HuggingFaceStorageReader reader(dir);
  return reader.ReadMetadata().ok();
}

TEST(ConvertCommitTest, FailedRenameLeavesNothingBehind) {
  const std::string root = FreshDir("failed_rename");
  SaveSource(root + "/src");
  for (const bool dst_exists : {false, true}) {
    for (int nth = 1; nth <= kRenames; ++nth) {
      SCOPED_TRACE(
          absl::StrCat("rename ", nth, " fails; DST existed: ", dst_exists));
      const std::string dst =
          absl::StrCat(root, "/dst", nth, dst_exists ? "_existing" : "");
      if (dst_exists) std::filesystem::create_directories(dst);
      FaultInjectionFileSystem fs(LocalFileSystem());
      fs.Inject(Fault{.op = FaultOp::kRename, .nth = nth});
      const absl::Status status = RunConvert(root + "/src", dst, Options(&fs));
      EXPECT_FALSE(status.ok());
      EXPECT_EQ(fs.calls(FaultOp::kRename), nth);
      // Nothing is left: no file, temporary or renamed; DST only when it
      // was there before, empty.
      EXPECT_EQ(std::filesystem::exists(dst), dst_exists);
      EXPECT_EQ(ListFiles(dst), std::set<std::string>{});
      // The same command then succeeds.
      const absl::Status retry =
          RunConvert(root + "/src", dst, Options(nullptr));
      ASSERT_TRUE(retry.ok()) << retry;
      EXPECT_EQ(ListFiles(dst).size(), static_cast<size_t>(kRenames));
      EXPECT_TRUE(LooksLikeACheckpoint(dst));
    }
  }
}

// A conversion that stops at a rename and does no more I/O (a kill, a
// crash: its clean-up fails too) leaves a directory that readers refuse,
// before and after the unsynced renames are undone (a power loss).
TEST(ConvertCommitTest, InterruptedCommitNeverLooksComplete) {
  const std::string root = FreshDir("interrupted");
  SaveSource(root + "/src");
  for (int nth = 1; nth <= kRenames; ++nth) {
    SCOPED_TRACE(absl::StrCat("stopped at rename ", nth));
    const std::string dst = absl::StrCat(root, "/dst", nth);
    FaultInjectionFileSystem fs(LocalFileSystem());
    fs.Inject(Fault{.op = FaultOp::kRename, .nth = nth, .crash = true});
    EXPECT_FALSE(RunConvert(root + "/src", dst, Options(&fs)).ok());
    int safetensors = 0;
    bool index = false;
    for (const std::string& name : ListFiles(dst)) {
      safetensors += absl::EndsWith(name, ".safetensors");
      index |= name == kHfIndexFileName;
    }
    // Files that would pass for the whole checkpoint never stand alone.
    EXPECT_TRUE(safetensors == 0 || index) << safetensors << " files";
    EXPECT_LT(safetensors, kFiles);
    EXPECT_FALSE(LooksLikeACheckpoint(dst));
    fs.SimulateCrash();
    EXPECT_FALSE(LooksLikeACheckpoint(dst));
  }
}

}  // namespace
}  // namespace dcp
