// HuggingFaceStorageWriter/Reader against hostile directories and state
// dicts: JSON nested past any real file's depth (index, DCP_SHARDING_INFO),
// names JSON cannot hold, and a directory that cannot be listed. Each is a
// Status naming the file or value, never a crash or an exception.
#include "io/hf_storage.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/state_dict.h"
#include "core/tensor.h"
#include "engine/checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/fault_injection.h"
#include "io/file_system.h"
#include "io/safetensors.h"
#include "planner/default_planner.h"

namespace dcp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string TempDir(const std::string& tag) {
  const char* root = std::getenv("TEST_TMPDIR");
  std::string dir =
      absl::StrCat(root != nullptr ? root : "/tmp", "/", tag, "-XXXXXX");
  return mkdtemp(dir.data());
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Deep enough that dump() overflowed an 8 MiB stack in every build (50000
// levels did under the sanitizers, 100000 in -c opt).
constexpr int kDeep = 200000;

// `depth` nested arrays around nothing: "[[[...]]]".
std::string Nested(int depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

// A safetensors file holding F32 tensor `name` = `values`.
void WriteSafetensors(const std::string& path, const std::string& name,
                      const std::vector<float>& values,
                      const std::map<std::string, std::string>& metadata = {
                          {"format", "pt"}}) {
  std::vector<SafetensorsTensor> tensors = {
      {name, DType::kF32, {static_cast<int64_t>(values.size())}}};
  absl::StatusOr<std::string> header =
      EncodeSafetensorsHeader(tensors, metadata);
  ASSERT_TRUE(header.ok()) << header.status();
  std::ofstream out(path, std::ios::binary);
  out << *header;
  out.write(reinterpret_cast<const char*>(values.data()),
            static_cast<std::streamsize>(values.size() * sizeof(float)));
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

absl::StatusOr<Metadata> SaveHf(const std::string& dir, const StateDict& state,
                                HuggingFaceStorageWriterOptions options = {}) {
  HuggingFaceStorageWriter writer(dir, std::move(options));
  SaveOptions save;
  save.storage_writer = &writer;
  return Save(state, save);
}

absl::Status LoadHf(const std::string& dir, StateDict& state) {
  HuggingFaceStorageReader reader(dir);
  LoadOptions load;
  load.storage_reader = &reader;
  return Load(state, load);
}

bool Exists(const std::string& path) { return std::filesystem::exists(path); }

TEST(HfDirectory, AMissingFileTheIndexNamesIsDataLossNamingItsTensors) {
  const std::string dir = TempDir("hf-missing-file");
  StateDict state;
  state["a"] = F32({1, 2});
  state["b"] = F32({3});
  HuggingFaceStorageWriterOptions options;
  options.fqn_to_index_mapping = {{"a", 1}, {"b", 2}};
  ASSERT_TRUE(SaveHf(dir, state, options).ok());
  const std::string gone = dir + "/model-00002-of-00002.safetensors";
  ASSERT_TRUE(std::filesystem::remove(gone));
  StateDict back;
  back["a"] = F32({0, 0});
  absl::Status status = LoadHf(dir, back);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr(gone + " is missing"),
                    HasSubstr("maps 1 tensor to it (b)"),
                    HasSubstr("the checkpoint is incomplete")));
}

// A load planner that runs `between` once it has planned: after the
// reader described the checkpoint, before it reads the files.
class PlanThenRun final : public DefaultLoadPlanner {
 public:
  explicit PlanThenRun(std::function<void()> between)
      : between_(std::move(between)) {}
  absl::StatusOr<LoadPlan> CreateLocalPlan() override {
    absl::StatusOr<LoadPlan> plan = DefaultLoadPlanner::CreateLocalPlan();
    between_();
    return plan;
  }

 private:
  std::function<void()> between_;
};

// A load whose files another save replaced after the reader described
// them is kAborted saying so (not kDataLoss: nothing is damaged); files
// removed with no new checkpoint in their place stay kDataLoss.
TEST(HfDirectory, FilesReplacedDuringALoadAreAbortedNotDataLoss) {
  const std::string dir = TempDir("hf-replaced-during-load");
  StateDict state;
  state["a"] = F32({1, 2});
  state["b"] = F32({3});
  HuggingFaceStorageWriterOptions two_files;
  two_files.fqn_to_index_mapping = {{"a", 1}, {"b", 2}};
  ASSERT_TRUE(SaveHf(dir, state, two_files).ok());
  StateDict back;
  back["a"] = F32({0, 0});
  back["b"] = F32({0});
  PlanThenRun replace([&] {
    StateDict next;
    next["a"] = F32({5, 6});
    next["b"] = F32({7});
    ASSERT_TRUE(SaveHf(dir, next).ok());  // One file now.
  });
  HuggingFaceStorageReader reader(dir);
  LoadOptions load;
  load.storage_reader = &reader;
  load.planner = &replace;
  absl::Status status = Load(back, load);
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("was replaced by another save while this load "
                              "read it"),
                    HasSubstr("load again")));
  ASSERT_TRUE(LoadHf(dir, back).ok());
  EXPECT_EQ(ValuesOf(back["b"].tensor()), std::vector<float>({7}));

  ASSERT_TRUE(SaveHf(dir, state, two_files).ok());
  const std::string gone = dir + "/model-00002-of-00002.safetensors";
  PlanThenRun remove([&] { ASSERT_TRUE(std::filesystem::remove(gone)); });
  HuggingFaceStorageReader reader2(dir);
  load.storage_reader = &reader2;
  load.planner = &remove;
  status = Load(back, load);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
}

// nlohmann's dump() recursed once per level of an index's value in the
// error message: kDeep levels overflowed the stack, in a load and in the
// next save's SetUp (which reads the index it replaces).
TEST(HfHostileJson, DeeplyNestedIndexIsDataLossNamingIt) {
  const std::string dir = TempDir("hf-deep-index");
  const std::string index = absl::StrCat(dir, "/", kHfIndexFileName);
  WriteText(index,
            absl::StrCat(R"({"weight_map": {"w": )", Nested(kDeep), "}}"));
  absl::StatusOr<std::vector<std::string>> files =
      ResolveHfCheckpointFiles(LocalFileSystem(), dir);
  ASSERT_FALSE(files.ok());
  EXPECT_EQ(files.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(files.status().message(),
              AllOf(HasSubstr(index), HasSubstr("more than 64 levels deep")));

  // A save replaces the unreadable index.
  StateDict state;
  state["w"] = F32({1, 2});
  absl::StatusOr<Metadata> saved = SaveHf(dir, state);
  ASSERT_TRUE(saved.ok()) << saved.status();
  StateDict loaded;
  loaded["w"] = F32({0, 0});
  ASSERT_TRUE(LoadHf(dir, loaded).ok());
  EXPECT_EQ(ValuesOf(loaded["w"].tensor()), (std::vector<float>{1, 2}));
}

// A `sharded` that is a symbolic link is not followed: it would reach
// safetensors files outside the checkpoint.
TEST(HfHostileJson, ShardedDirectoryBehindASymlinkIsNotFollowed) {
  const std::string outside = TempDir("hf-outside");
  StateDict state;
  state["w"] = F32({1, 2});
  ASSERT_TRUE(SaveHf(outside, state).ok());
  const std::string dir = TempDir("hf-sharded-link");
  std::filesystem::create_directory_symlink(
      outside, absl::StrCat(dir, "/", kHfShardedDirName));
  absl::Status status =
      ResolveHfCheckpointFiles(LocalFileSystem(), dir).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_THAT(status.message(), HasSubstr("symbolic link"));
}

// A save does not follow a `sharded` that is a symbolic link either: its
// clean-up of interrupted saves and of the files it replaces, and a
// distributed save's shards, would reach files outside the checkpoint.
TEST(HfHostileJson, SaveRefusesASymlinkedShardedDirectoryTouchingNothing) {
  const std::string outside = TempDir("hf-victim");
  const std::vector<std::string> victims = {
      ".model.safetensors.tmp-0123456789abcdef",
      "shard-00001-model-00001-of-00001.safetensors", "keep.txt"};
  for (const std::string& name : victims) WriteText(outside + "/" + name, "x");
  const std::string dir = TempDir("hf-save-link");
  std::filesystem::create_directory_symlink(
      outside, absl::StrCat(dir, "/", kHfShardedDirName));
  StateDict state;
  state["w"] = F32({1, 2});
  for (const bool distributed : {false, true}) {
    HuggingFaceStorageWriterOptions options;
    options.save_distributed = distributed;
    absl::Status status = SaveHf(dir, state, options).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_THAT(status.message(),
                AllOf(HasSubstr(absl::StrCat(dir, "/", kHfShardedDirName)),
                      HasSubstr("symbolic link")));
    for (const std::string& name : victims) {
      EXPECT_TRUE(Exists(outside + "/" + name)) << name;
    }
    EXPECT_EQ(std::distance(std::filesystem::directory_iterator(outside),
                            std::filesystem::directory_iterator()),
              3);
  }
}

TEST(HfHostileJson, IndexValuesInMessagesAreDescribedNotDumped) {
  const std::string dir = TempDir("hf-wide-index");
  const std::string index = absl::StrCat(dir, "/", kHfIndexFileName);
  std::string files = "1";
  for (int i = 2; i <= 1000; ++i) absl::StrAppend(&files, ",", i);
  WriteText(index, absl::StrCat(R"({"weight_map": {"w": [)", files, "]}}"));
  absl::Status status =
      ResolveHfCheckpointFiles(LocalFileSystem(), dir).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(
      status.message(),
      AllOf(HasSubstr(index), HasSubstr("\"w\" to an array of 1000 elements")));
}

TEST(HfHostileJson, DeeplyNestedShardingInfoIsDataLossNamingTheFile) {
  const std::string dir = TempDir("hf-deep-sharding");
  const std::string path = absl::StrCat(dir, "/", kHfSingleFileName);
  WriteSafetensors(
      path, "w", {1, 2},
      {{"format", "pt"},
       {kHfShardingInfoKey,
        absl::StrCat(R"({"w": {"saved_offsets": [)", Nested(kDeep), "]}}")}});
  HuggingFaceStorageReader reader(dir);
  absl::Status status = reader.ReadMetadata().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr(path), HasSubstr(kHfShardingInfoKey),
                    HasSubstr("more than 64 levels deep")));
}

// nlohmann's dump() threw type_error.316 on the name in the plan, header
// and index: an exception out of a Status-based save.
TEST(HfHostileNames, NonUtf8NameFailsThePlanNamingItEscaped) {
  const std::string dir = TempDir("hf-utf8");
  StateDict state;
  state["\xff"] = F32({1, 2});
  absl::StatusOr<Metadata> saved;
  ASSERT_NO_THROW(saved = SaveHf(dir, state));
  ASSERT_FALSE(saved.ok());
  EXPECT_EQ(saved.status().code(), absl::StatusCode::kInvalidArgument)
      << saved.status();
  EXPECT_THAT(saved.status().message(),
              AllOf(HasSubstr("\"\\xff\""), HasSubstr("not valid UTF-8")));
  // Nothing committed, nothing left.
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    ADD_FAILURE() << "left " << entry.path();
  }

  // The same with save_distributed (sharded files carry the names in
  // DCP_SHARDING_INFO too).
  HuggingFaceStorageWriterOptions options;
  options.save_distributed = true;
  ASSERT_NO_THROW(saved = SaveHf(dir, state, options));
  EXPECT_EQ(saved.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(Exists(absl::StrCat(dir, "/", kHfIndexFileName)));
}

// A save whose SetUp could not list the directory took it for empty: it
// committed beside the old model.safetensors, which readers prefer, so
// later loads got the old weights.
TEST(HfDirectory, UnlistableDirectoryFailsTheSave) {
  const std::string dir = TempDir("hf-unlistable");
  const std::string old_file = absl::StrCat(dir, "/", kHfSingleFileName);
  WriteSafetensors(old_file, "w", {1, 2});

  FaultInjectionFileSystem fs(LocalFileSystem());
  fs.Inject(Fault{
      .op = FaultOp::kList, .error = EACCES, .path_contains = dir, .nth = 0});
  HuggingFaceStorageWriterOptions options;
  options.file_system = &fs;
  StateDict state;
  state["w"] = F32({3, 4});
  absl::StatusOr<Metadata> saved = SaveHf(dir, state, options);
  ASSERT_FALSE(saved.ok());
  EXPECT_EQ(saved.status().code(), absl::StatusCode::kPermissionDenied)
      << saved.status();
  EXPECT_THAT(
      saved.status().message(),
      AllOf(HasSubstr("cannot list checkpoint directory"), HasSubstr(dir)));
  EXPECT_FALSE(Exists(absl::StrCat(dir, "/", kHfIndexFileName)));
  EXPECT_FALSE(Exists(absl::StrCat(dir, "/", HfFileName(1, 1))));

  // The old checkpoint is what a load sees; once the directory lists, the
  // save replaces it.
  StateDict loaded;
  loaded["w"] = F32({0, 0});
  ASSERT_TRUE(LoadHf(dir, loaded).ok());
  EXPECT_EQ(ValuesOf(loaded["w"].tensor()), (std::vector<float>{1, 2}));
  fs.ClearFaults();
  saved = SaveHf(dir, state, options);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_FALSE(Exists(old_file));
  ASSERT_TRUE(LoadHf(dir, loaded).ok());
  EXPECT_EQ(ValuesOf(loaded["w"].tensor()), (std::vector<float>{3, 4}));
}

}  // namespace
}  // namespace dcp
