// Save and load through the public API with the default planners and the
// FileSystem storage: every dtype, nesting, resharding, strict and partial
// loads, and every load error the foundation promises.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "core/dtype_convert.h"
#include "core/state_dict.h"
#include "engine/checkpoint.h"
#include "gtest/gtest.h"
#include "io/file_system_storage.h"
#include "planner/default_planner.h"
#include "tests/test_util.h"

namespace dcp {
namespace {

using ::dcp::testing::ListFiles;
using ::dcp::testing::MakeTempDir;
using ::dcp::testing::SeededTensor;

absl::StatusOr<Metadata> SaveTo(const std::string& dir, const StateDict& sd) {
  SaveOptions options;
  options.checkpoint_id = dir;
  return Save(sd, options);
}

absl::Status LoadFrom(const std::string& dir, StateDict& sd) {
  LoadOptions options;
  options.checkpoint_id = dir;
  return Load(sd, options);
}

Tensor ZerosLike(const Tensor& t) {
  return Tensor::Empty(t.dtype(), t.sizes());
}

TEST(EngineRoundTrip, EveryDTypeAndShapeKind) {
  const std::string dir = MakeTempDir("dtypes");
  StateDict saved, loaded;
  for (int i = 0; i < kNumDTypes; ++i) {
    const DType dtype = static_cast<DType>(i);
    const std::string name(DTypeName(dtype));
    saved[name] = SeededTensor(dtype, {3, 5}, i);
    loaded[name] = ZerosLike(saved[name].tensor());
  }
  saved["scalar"] = SeededTensor(DType::kF64, {}, 99);
  loaded["scalar"] = Tensor::Empty(DType::kF64, {});
  saved["empty"] = SeededTensor(DType::kF32, {4, 0, 2}, 5);
  loaded["empty"] = Tensor::Empty(DType::kF32, {4, 0, 2});
  ASSERT_TRUE(SaveTo(dir, saved).ok());
  ASSERT_TRUE(LoadFrom(dir, loaded).ok());
  for (const auto& [name, value] : saved) {
    EXPECT_TRUE(value.tensor().BytesEqual(loaded.at(name).tensor())) << name;
  }
}

// A strided host view (a transposed weight) saves as the tensor it shows:
// the writer gathers it, and a load into contiguous memory gets the
// transposed values.
TEST(EngineRoundTrip, StridedHostViewSavesWhatItShows) {
  const std::string dir = MakeTempDir("strided");
  std::vector<float> storage(6);
  for (int i = 0; i < 6; ++i) storage[i] = static_cast<float>(i + 1);
  // storage is 2x3 row-major; the view is its 3x2 transpose.
  StateDict saved;
  saved["w_t"] = Tensor::Wrap(
      TensorView(storage.data(), DType::kF32, {3, 2}, {1, 3}, Device::Cpu()));
  ASSERT_TRUE(SaveTo(dir, saved).ok());
  StateDict loaded;
  loaded["w_t"] = Tensor::Empty(DType::kF32, {3, 2});
  ASSERT_TRUE(LoadFrom(dir, loaded).ok());
  const float* got = static_cast<const float*>(loaded["w_t"].tensor().data());
  const float want[6] = {1, 4, 2, 5, 3, 6};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(got[i], want[i]) << i;
}

TEST(EngineRoundTrip, SaveReturnsWhereEveryItemIsStored) {
  const std::string dir = MakeTempDir("returned_metadata");
  StateDict saved;
  saved["w"] = SeededTensor(DType::kF32, {64, 3}, 1);
  saved["b"] = SeededTensor(DType::kBF16, {5}, 2);
  saved["step"] = int64_t{9};
  absl::StatusOr<Metadata> returned = SaveTo(dir, saved);
  ASSERT_TRUE(returned.ok()) << returned.status();
  absl::StatusOr<Metadata> on_disk = FileSystemReader(dir).ReadMetadata();
  ASSERT_TRUE(on_disk.ok()) << on_disk.status();
  ASSERT_EQ(returned->storage_data.size(), 3u);
  ASSERT_EQ(returned->storage_data.size(), on_disk->storage_data.size());
  for (const auto& [index, info] : on_disk->storage_data) {
    auto it = returned->storage_data.find(index);
    ASSERT_NE(it, returned->storage_data.end()) << index.ToString();
    EXPECT_EQ(it->second.relative_path, info.relative_path);
    EXPECT_EQ(it->second.offset, info.offset);
    EXPECT_EQ(it->second.length, info.length);
    EXPECT_EQ(it->second.block_checksums, info.block_checksums);
  }
}

TEST(EngineRoundTrip, NestingAndPlainValues) {
  const std::string dir = MakeTempDir("nesting");
  StateDict saved;
  saved["model"] = StateDict{{"w", SeededTensor(DType::kBF16, {8, 8}, 1)}};
  saved["optim"] = StateDict{
      {"state",
       StateDict{{"0", StateDict{{"exp_avg", SeededTensor(DType::kF32, {8}, 2)},
                                 {"step", int64_t{42}}}}}},
      {"param_groups", StateList{StateDict{{"lr", 0.125},
                                           {"amsgrad", false},
                                           {"name", std::string("decay")}}}}};
  saved["blob"] = Bytes{std::string("\0\xff\x10", 3)};
  saved["dotted.key"] = int64_t{-5};
  ASSERT_TRUE(SaveTo(dir, saved).ok());

  StateDict loaded;
  loaded["model"] = StateDict{{"w", Tensor::Empty(DType::kBF16, {8, 8})}};
  loaded["optim"] = StateDict{
      {"state",
       StateDict{{"0", StateDict{{"exp_avg", Tensor::Empty(DType::kF32, {8})},
                                 {"step", int64_t{0}}}}}},
      {"param_groups",
       StateList{StateDict{
           {"lr", 0.0}, {"amsgrad", true}, {"name", std::string()}}}}};
  loaded["blob"] = Bytes{};
  loaded["dotted.key"] = int64_t{0};
  ASSERT_TRUE(LoadFrom(dir, loaded).ok());

  EXPECT_TRUE(loaded["model"].dict()["w"].tensor().BytesEqual(
      saved["model"].dict()["w"].tensor()));
  const StateDict& state0 = loaded["optim"].dict()["state"].dict()["0"].dict();
  EXPECT_EQ(state0.at("step").int_value(), 42);
  const StateDict& group =
      loaded["optim"].dict()["param_groups"].list()[0].dict();
  EXPECT_DOUBLE_EQ(group.at("lr").double_value(), 0.125);
  EXPECT_FALSE(group.at("amsgrad").bool_value());
  EXPECT_EQ(group.at("name").string_value(), "decay");
  EXPECT_EQ(loaded["blob"].bytes_value().data, std::string("\0\xff\x10", 3));
  EXPECT_EQ(loaded["dotted.key"].int_value(), -5);
}

// Saved as 3 uneven row shards of a 2-d tensor; loaded as 2 column blocks.
TEST(EngineRoundTrip, ShardedTensorReshardsOnLoad) {
  const std::string dir = MakeTempDir("reshard");
  const Tensor full = SeededTensor(DType::kF32, {7, 6}, 11);
  auto rows = [&](int64_t begin, int64_t end) {
    Tensor t = Tensor::Empty(DType::kF32, {end - begin, 6});
    std::memcpy(t.data(), static_cast<float*>(full.data()) + begin * 6,
                t.nbytes());
    return Shard{{begin, 0}, t};
  };
  StateDict saved;
  saved["w"] =
      ShardedTensor(DType::kF32, {7, 6}, {rows(0, 3), rows(3, 4), rows(4, 7)});
  ASSERT_TRUE(SaveTo(dir, saved).ok());

  StateDict loaded;
  loaded["w"] =
      ShardedTensor(DType::kF32, {7, 6},
                    {Shard{{0, 0}, Tensor::Empty(DType::kF32, {7, 2})},
                     Shard{{0, 2}, Tensor::Empty(DType::kF32, {7, 4})}});
  ASSERT_TRUE(LoadFrom(dir, loaded).ok());
  const auto& shards = loaded["w"].sharded_tensor().local_shards();
  for (const Shard& shard : shards) {
    const int64_t c0 = shard.offsets[1], nc = shard.tensor.sizes()[1];
    const float* got = static_cast<const float*>(shard.tensor.data());
    for (int64_t r = 0; r < 7; ++r) {
      for (int64_t c = 0; c < nc; ++c) {
        ASSERT_EQ(
            std::memcmp(&got[r * nc + c],
                        static_cast<const float*>(full.data()) + r * 6 + c0 + c,
                        4),
            0)
            << "row " << r << " col " << c0 + c;
      }
    }
  }
  // A plain tensor destination receives the whole sharded tensor.
  StateDict whole;
  whole["w"] = Tensor::Empty(DType::kF32, {7, 6});
  ASSERT_TRUE(LoadFrom(dir, whole).ok());
  EXPECT_TRUE(whole["w"].tensor().BytesEqual(full));
}

// A load into BF16 tensors of a checkpoint saved as F32, with
// convert_dtypes: every element converted as ConvertElements converts it,
// and the file-system reader holds about two read windows of temporaries
// (not all of them), whether items are read in place or through bounce
// runs.
TEST(EngineRoundTrip, ConvertingLoadHoldsAboutTwoWindowsOfTemporaries) {
  const std::string dir = MakeTempDir("convert_window");
  StateDict saved;
  // 40 tensors of 64 KiB (read in place) and 200 of 400 bytes (read in
  // runs through bounce buffers).
  for (int i = 0; i < 40; ++i) {
    saved[absl::StrCat("big", i)] = SeededTensor(DType::kF32, {256, 64}, i);
  }
  for (int i = 0; i < 200; ++i) {
    saved[absl::StrCat("small", i)] = SeededTensor(DType::kF32, {100}, 100 + i);
  }
  for (auto& [name, value] : saved) {  // Finite values: NaN payloads vary.
    auto* f = static_cast<float*>(value.tensor().data());
    for (int64_t k = 0; k < value.tensor().numel(); ++k) {
      if (!std::isfinite(f[k])) f[k] = static_cast<float>(k);
    }
  }
  ASSERT_TRUE(SaveTo(dir, saved).ok());
  for (bool direct : {true, false}) {
    SCOPED_TRACE(direct ? "direct" : "buffered");
    StateDict sd;
    for (const auto& [name, value] : saved) {
      sd[name] = Tensor::Empty(DType::kBF16, value.tensor().sizes());
    }
    FileSystemReaderOptions reader_options;
    reader_options.direct_io = direct;
    reader_options.read_window_bytes = 128 << 10;
    FileSystemReader reader(dir, reader_options);
    DefaultLoadPlanner planner({.convert_dtypes = true});
    LoadOptions options;
    options.storage_reader = &reader;
    options.planner = &planner;
    ASSERT_TRUE(Load(sd, options).ok());
    for (const auto& [name, value] : saved) {
      const Tensor& t = value.tensor();
      Tensor want = Tensor::Empty(DType::kBF16, t.sizes());
      ConvertElements(static_cast<const std::byte*>(t.data()), DType::kF32,
                      t.numel(), static_cast<std::byte*>(want.data()),
                      DType::kBF16);
      ASSERT_TRUE(sd[name].tensor().BytesEqual(want)) << name;
    }
    // All of them would be 40 * 64 KiB + 200 * 400 bytes.
    EXPECT_GT(planner.peak_temporary_bytes(), 0);
    EXPECT_LE(planner.peak_temporary_bytes(),
              2 * reader_options.read_window_bytes + (64 << 10));
  }
}

class EngineLoadErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("errors");
    saved_["a"] = SeededTensor(DType::kF32, {4, 4}, 1);
    saved_["b"] = SeededTensor(DType::kI64, {3}, 2);
    ASSERT_TRUE(SaveTo(dir_, saved_).ok());
  }
  std::string dir_;
  StateDict saved_;
};

TEST_F(EngineLoadErrors, NoCommittedMetadata) {
  const std::string empty = MakeTempDir("empty");
  StateDict sd{{"a", Tensor::Empty(DType::kF32, {4, 4})}};
  absl::Status s = LoadFrom(empty, sd);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find(empty), absl::string_view::npos) << s;
}

TEST_F(EngineLoadErrors, MissingKeyStrictAndPartial) {
  StateDict sd{{"a", Tensor::Empty(DType::kF32, {4, 4})},
               {"missing", Tensor::Empty(DType::kF32, {2})}};
  absl::Status s = LoadFrom(dir_, sd);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find("missing"), absl::string_view::npos) << s;

  DefaultLoadPlanner partial(
      DefaultLoadPlannerOptions{.allow_partial_load = true});
  LoadOptions options;
  options.checkpoint_id = dir_;
  options.planner = &partial;
  ASSERT_TRUE(Load(sd, options).ok());
  EXPECT_TRUE(sd["a"].tensor().BytesEqual(saved_["a"].tensor()));
}

TEST_F(EngineLoadErrors, DTypeAndShapeMismatch) {
  StateDict wrong_dtype{{"a", Tensor::Empty(DType::kF16, {4, 4})}};
  absl::Status s = LoadFrom(dir_, wrong_dtype);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("\"a\""), absl::string_view::npos) << s;
  StateDict wrong_shape{{"a", Tensor::Empty(DType::kF32, {4, 5})}};
  s = LoadFrom(dir_, wrong_shape);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

// Returns the only data file (not the metadata) in `dir`.
std::string OnlyDataFile(const std::string& dir) {
  std::string found;
  for (const std::string& name : ListFiles(dir)) {
    if (name.find(".distcp") != std::string::npos) found = name;
  }
  return dir + "/" + found;
}

TEST_F(EngineLoadErrors, ChecksumMismatchIsDataLoss) {
  const std::string data = OnlyDataFile(dir_);
  {
    std::fstream f(data, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5);
    char c;
    f.read(&c, 1);
    c ^= 0x40;
    f.seekp(5);
    f.write(&c, 1);
  }
  StateDict sd{{"a", Tensor::Empty(DType::kF32, {4, 4})},
               {"b", Tensor::Empty(DType::kI64, {3})}};
  absl::Status s = LoadFrom(dir_, sd);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("checksum"), absl::string_view::npos) << s;
}

TEST_F(EngineLoadErrors, TruncatedDataFileIsDataLoss) {
  const std::string data = OnlyDataFile(dir_);
  ASSERT_EQ(::truncate(data.c_str(), 10), 0);
  StateDict sd{{"a", Tensor::Empty(DType::kF32, {4, 4})},
               {"b", Tensor::Empty(DType::kI64, {3})}};
  absl::Status s = LoadFrom(dir_, sd);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
}

TEST_F(EngineLoadErrors, GarbageMetadataIsDataLoss) {
  for (const std::string& name : ListFiles(dir_)) {
    if (name.find(".distcp") == std::string::npos) {
      std::ofstream(dir_ + "/" + name, std::ios::trunc) << "not a checkpoint";
    }
  }
  StateDict sd{{"a", Tensor::Empty(DType::kF32, {4, 4})}};
  absl::Status s = LoadFrom(dir_, sd);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
}

TEST(EngineSave, OverwriteFalseRefusesExistingCheckpoint) {
  const std::string dir = MakeTempDir("no-overwrite");
  StateDict sd{{"a", SeededTensor(DType::kF32, {4}, 1)}};
  ASSERT_TRUE(SaveTo(dir, sd).ok());
  const auto before = ListFiles(dir);
  FileSystemWriter writer(dir, FileSystemWriterOptions{.overwrite = false});
  ASSERT_TRUE(writer.Reset(dir).ok());
  absl::Status s = SaveStateDict(sd, writer).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_EQ(ListFiles(dir), before);
}

// One writer serving two saves: the second writes new files (a fresh save
// id) instead of writing over the committed checkpoint's, then removes them.
TEST(EngineSave, ReusedWriterNeverWritesOverTheCommittedFiles) {
  const std::string dir = MakeTempDir("reused-writer");
  FileSystemWriter writer(dir);
  StateDict first{{"a", SeededTensor(DType::kF32, {64}, 1)}};
  StateDict second{{"a", SeededTensor(DType::kF32, {64}, 2)}};
  ASSERT_TRUE(SaveStateDict(first, writer).ok());
  const auto first_files = ListFiles(dir);
  ASSERT_TRUE(SaveStateDict(second, writer).ok());
  for (const std::string& name : ListFiles(dir)) {
    if (name.find(".distcp") != std::string::npos) {
      EXPECT_FALSE(first_files.count(name)) << name << " was reused";
    }
  }
  StateDict loaded{{"a", Tensor::Empty(DType::kF32, {64})}};
  ASSERT_TRUE(LoadFrom(dir, loaded).ok());
  EXPECT_TRUE(loaded["a"].tensor().BytesEqual(second["a"].tensor()));
}

// As the seed's save and load: a checkpoint_id given with a storage writer
// or reader points it there (Reset(checkpoint_id)) instead of being ignored.
TEST(EngineSave, CheckpointIdRedirectsAGivenWriterAndReader) {
  const std::string configured = MakeTempDir("writer-configured");
  const std::string chosen = MakeTempDir("checkpoint-id");
  StateDict saved{{"a", SeededTensor(DType::kF32, {64}, 1)}};
  FileSystemWriter writer(configured);
  SaveOptions save;
  save.checkpoint_id = chosen;
  save.storage_writer = &writer;
  ASSERT_TRUE(Save(saved, save).ok());
  EXPECT_TRUE(ListFiles(chosen).count(".metadata"));
  EXPECT_TRUE(ListFiles(configured).empty());

  // The reader is pointed at `chosen` too, away from its own (empty) path.
  FileSystemReader reader(configured);
  StateDict loaded{{"a", Tensor::Empty(DType::kF32, {64})}};
  LoadOptions load;
  load.checkpoint_id = chosen;
  load.storage_reader = &reader;
  absl::Status s = Load(loaded, load);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(loaded["a"].tensor().BytesEqual(saved["a"].tensor()));
}

// A directory holding both a checkpoint saved by all ranks (DIR/.metadata)
// and a rank-local one (DIR/rank-0): the load fails naming both instead of
// taking one of them.
TEST(EngineLoad, BothLayoutsInOneDirectoryFailNamingBoth) {
  const std::string dir = MakeTempDir("both-layouts");
  StateDict saved{{"a", SeededTensor(DType::kF32, {64}, 1)}};
  ASSERT_TRUE(SaveTo(dir, saved).ok());
  ASSERT_TRUE(SaveTo(dir + "/rank-0", saved).ok());
  StateDict loaded{{"a", Tensor::Empty(DType::kF32, {64})}};
  absl::Status s = LoadFrom(dir, loaded);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find(dir + "/.metadata"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find(dir + "/rank-0/.metadata"),
            absl::string_view::npos)
      << s;
}

// The metadata without what differs per save (ids, file names, checksums):
// what a save's layout is.
Metadata Layout(Metadata metadata) {
  metadata.storage_meta.reset();
  metadata.storage_data.clear();
  return metadata;
}

// A cached re-plan hands the engine the planner's cached metadata; Save
// still returns the metadata of its own save, equal to an uncached save's,
// and a later save leaves what an earlier one returned as it was.
TEST(EngineSave, CachedPlansReturnTheSameMetadata) {
  StateDict sd{{"a", SeededTensor(DType::kF32, {64}, 1)},
               {"b", StateDict{{"c", SeededTensor(DType::kBF16, {3, 5}, 2)},
                               {"step", int64_t{7}}}}};
  DefaultSavePlanner plain;
  DefaultSavePlanner caching(DefaultSavePlannerOptions{
      .enable_plan_caching = true,
      .plan_cache = std::make_shared<SavePlanCache>()});
  std::vector<std::string> dirs;
  std::vector<Metadata> returned;
  for (int i = 0; i < 3; ++i) {
    dirs.push_back(MakeTempDir(absl::StrCat("cached-", i)));
    sd["a"] = SeededTensor(DType::kF32, {64}, 10 + i);
    SaveOptions options;
    options.checkpoint_id = dirs.back();
    options.planner = i == 0 ? &plain : &caching;
    absl::StatusOr<Metadata> metadata = Save(sd, options);
    ASSERT_TRUE(metadata.ok()) << metadata.status();
    returned.push_back(*std::move(metadata));
  }
  // Save 1 filled the cache, save 2 re-planned from it.
  EXPECT_TRUE(Layout(returned[1]) == Layout(returned[0]));
  EXPECT_TRUE(Layout(returned[2]) == Layout(returned[0]));
  std::set<std::string> save_ids;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(returned[i].storage_meta.has_value());
    EXPECT_EQ(returned[i].storage_meta->checkpoint_id, dirs[i]);
    save_ids.insert(returned[i].storage_meta->save_id);
  }
  EXPECT_EQ(save_ids.size(), 3u);
  StateDict loaded{{"a", Tensor::Empty(DType::kF32, {64})},
                   {"b", StateDict{{"c", Tensor::Empty(DType::kBF16, {3, 5})},
                                   {"step", int64_t{0}}}}};
  ASSERT_TRUE(LoadFrom(dirs[2], loaded).ok());
  EXPECT_TRUE(loaded["a"].tensor().BytesEqual(sd["a"].tensor()));
  EXPECT_EQ(loaded["b"].dict().at("step").int_value(), 7);
}

TEST(EngineSave, OverwriteReplacesAndRemovesOldFiles) {
  const std::string dir = MakeTempDir("overwrite");
  StateDict first{{"a", SeededTensor(DType::kF32, {64}, 1)}};
  StateDict second{{"a", SeededTensor(DType::kF32, {64}, 2)}};
  ASSERT_TRUE(SaveTo(dir, first).ok());
  const auto first_files = ListFiles(dir);
  ASSERT_TRUE(SaveTo(dir, second).ok());
  const auto second_files = ListFiles(dir);
  EXPECT_EQ(second_files.size(), first_files.size());
  StateDict loaded{{"a", Tensor::Empty(DType::kF32, {64})}};
  ASSERT_TRUE(LoadFrom(dir, loaded).ok());
  EXPECT_TRUE(loaded["a"].tensor().BytesEqual(second["a"].tensor()));
}

// Runs `save` in a child process that drops root privileges (root ignores
// directory permissions), returning the child's Status code and message.
absl::Status SaveAsUnprivileged(const std::string& dir, const StateDict& sd) {
  int fds[2];
  if (::pipe(fds) != 0) return absl::InternalError("pipe");
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) {
      ::_exit(2);
    }
    absl::Status s = SaveTo(dir, sd).status();
    const std::string out = std::to_string(static_cast<int>(s.code())) + " " +
                            std::string(s.message());
    (void)!::write(fds[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[512];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) out.append(buf, n);
  ::close(fds[0]);
  int wstatus = 0;
  ::waitpid(pid, &wstatus, 0);
  const size_t space = out.find(' ');
  if (space == std::string::npos) {
    return absl::InternalError("child could not drop privileges");
  }
  return absl::Status(static_cast<absl::StatusCode>(std::stoi(out)),
                      out.substr(space + 1));
}

TEST(EngineSave, ReadOnlyDirectoryFailsCleanly) {
  // Under /tmp, not $TEST_TMPDIR: the unprivileged child must be able to
  // reach the directory, and Bazel's output base sits under /root (0700).
  char pattern[] = "/tmp/dcp-readonly-XXXXXX";
  ASSERT_NE(::mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  ASSERT_EQ(::chmod(dir.c_str(), 0555), 0);
  StateDict sd{{"a", SeededTensor(DType::kF32, {4}, 1)}};
  absl::Status s = SaveAsUnprivileged(dir, sd);
  ::chmod(dir.c_str(), 0755);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find(dir), absl::string_view::npos) << s;
  EXPECT_TRUE(ListFiles(dir).empty());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dcp
