// Save and Load without a storage writer/reader pick the storage from the
// checkpoint_id (io/storage_registry.h): plain paths save natively, loads
// detect native, MEGA and Hugging Face directories, mega:// selects MEGA,
// unknown schemes fail listing the known ones, and a program's own backend
// serves its scheme.
#include "io/storage_registry.h"

#include <filesystem>
#include <memory>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "core/state_dict.h"
#include "engine/checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file_system_storage.h"
#include "io/hf_storage.h"
#include "io/mega_format.h"
#include "tests/test_util.h"

namespace dcp {
namespace {

using ::dcp::testing::ListFiles;
using ::dcp::testing::MakeTempDir;
using ::dcp::testing::SeededTensor;
using ::testing::HasSubstr;

StateDict State(uint64_t seed) {
  StateDict state;
  state["w"] = SeededTensor(DType::kBF16, {33, 7}, seed);
  state["b"] = SeededTensor(DType::kF32, {7}, seed + 1);
  return state;
}

absl::Status LoadAndCompare(const std::string& id, const StateDict& want) {
  StateDict loaded;
  for (const auto& [key, value] : want) {
    loaded[key] = Tensor::Empty(value.tensor().dtype(), value.tensor().sizes());
  }
  LoadOptions load;
  load.checkpoint_id = id;
  absl::Status status = Load(loaded, load);
  if (!status.ok()) return status;
  for (const auto& [key, value] : want) {
    if (!value.tensor().BytesEqual(loaded[key].tensor())) {
      return absl::InternalError(absl::StrCat(key, " differs"));
    }
  }
  return absl::OkStatus();
}

TEST(StorageRegistry, PlainPathsSaveNativelyAndLoadsDetectTheFormat) {
  StorageRegistry& registry = StorageRegistry::Default();
  const StateDict state = State(1);
  // Native: a plain path saves .metadata, and loads back.
  const std::string native = MakeTempDir("registry_native");
  SaveOptions save;
  save.checkpoint_id = native;
  ASSERT_TRUE(Save(state, save).ok());
  EXPECT_TRUE(ListFiles(native).contains(".metadata"));
  EXPECT_EQ(*registry.BackendFor(native, /*for_load=*/true), "native");
  EXPECT_TRUE(LoadAndCompare(native, state).ok());
  // MEGA through mega://, then loaded by its plain path.
  const std::string mega = MakeTempDir("registry_mega");
  save.checkpoint_id = absl::StrCat("mega://", mega);
  ASSERT_TRUE(Save(state, save).ok());
  EXPECT_EQ(*registry.BackendFor(mega, true), "mega");
  EXPECT_EQ(*registry.BackendFor(mega, false), "native");
  EXPECT_TRUE(LoadAndCompare(mega, state).ok());
  // Hugging Face: an index, or only *.safetensors files.
  const std::string hf = MakeTempDir("registry_hf");
  HuggingFaceStorageWriter writer(hf);
  save.checkpoint_id.clear();
  save.storage_writer = &writer;
  ASSERT_TRUE(Save(state, save).ok());
  EXPECT_EQ(*registry.BackendFor(hf, true), "huggingface");
  EXPECT_TRUE(LoadAndCompare(hf, state).ok());
  std::filesystem::remove(JoinPath(hf, kHfIndexFileName));
  EXPECT_EQ(*registry.BackendFor(hf, true), "huggingface");
  EXPECT_TRUE(LoadAndCompare(hf, state).ok());
  // A plain path saves natively, which a directory of Hugging Face files
  // refuses (two checkpoints in one directory; io/checkpoint_formats.h).
  save.storage_writer = nullptr;
  save.checkpoint_id = hf;
  absl::Status refused = Save(State(5), save).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("already holds a Hugging Face"));
  EXPECT_EQ(*registry.BackendFor(hf, true), "huggingface");
  EXPECT_TRUE(LoadAndCompare(hf, state).ok());
  // An empty directory: the native reader says there is no checkpoint.
  const std::string empty = MakeTempDir("registry_empty");
  absl::Status none = LoadAndCompare(empty, state);
  EXPECT_EQ(none.code(), absl::StatusCode::kNotFound) << none;
}

TEST(StorageRegistry, UnknownSchemesFailListingTheKnownOnes) {
  SaveOptions save;
  save.checkpoint_id = "s3://bucket/ckpt";
  absl::Status saved = Save(State(1), save).status();
  EXPECT_EQ(saved.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(saved.message(), HasSubstr("s3://"));
  EXPECT_THAT(saved.message(), HasSubstr("mega://"));
  StateDict state = State(1);
  LoadOptions load;
  load.checkpoint_id = "gs://bucket/ckpt";
  absl::Status loaded = Load(state, load);
  EXPECT_EQ(loaded.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(loaded.message(), HasSubstr("mega://"));
  EXPECT_EQ(CheckpointIdScheme("mega:///x"), "mega");
  EXPECT_EQ(CheckpointIdScheme("/tmp/a://b"), "");
}

// A program's own backend: `vault://NAME` saves natively into a directory
// of its choosing.
TEST(StorageRegistry, ProgramsRegisterTheirOwnBackend) {
  StorageRegistry& registry = StorageRegistry::Default();
  const std::string root = MakeTempDir("registry_vault");
  int writers = 0;
  StorageBackend vault;
  vault.name = "vault";
  vault.schemes = {"vault"};
  auto dir_of = [root](absl::string_view id) {
    absl::ConsumePrefix(&id, "vault://");
    return JoinPath(root, id);
  };
  vault.make_writer = [&, dir_of](const std::string& id)
      -> absl::StatusOr<std::unique_ptr<StorageWriter>> {
    ++writers;
    return std::make_unique<FileSystemWriter>(dir_of(id));
  };
  vault.make_reader = [dir_of](const std::string& id)
      -> absl::StatusOr<std::unique_ptr<StorageReader>> {
    return std::make_unique<FileSystemReader>(dir_of(id));
  };
  ASSERT_TRUE(registry.Register(vault).ok());
  EXPECT_THAT(registry.schemes(), ::testing::Contains("vault"));
  const StateDict state = State(3);
  SaveOptions save;
  save.checkpoint_id = "vault://run1";
  ASSERT_TRUE(Save(state, save).ok());
  EXPECT_EQ(writers, 1);
  EXPECT_TRUE(ListFiles(JoinPath(root, "run1")).contains(".metadata"));
  EXPECT_TRUE(LoadAndCompare("vault://run1", state).ok());
  // Names and schemes are unique; schemes are URI schemes.
  EXPECT_EQ(registry.Register(vault).code(), absl::StatusCode::kAlreadyExists);
  StorageBackend other;
  other.name = "other";
  other.schemes = {"mega"};
  EXPECT_EQ(registry.Register(other).code(), absl::StatusCode::kAlreadyExists);
  other.schemes = {"9p"};
  EXPECT_EQ(registry.Register(other).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(registry.Unregister("vault").ok());
  SaveOptions gone;
  gone.checkpoint_id = "vault://run2";
  EXPECT_EQ(Save(state, gone).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dcp
