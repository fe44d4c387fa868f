// Saving device tensors through the FileSystemWriter: every device tensor is
// copied piece by piece into a bounded staging pool (staging/device_staging.h)
// and written from there. The device_save_test target runs on the
// host-memory runtime ("device" memory is host memory allocated by that
// runtime; copies run on its stream workers like CUDA copies would); the
// device_save_gpu_test target (DCP_DEVICE_SAVE_ON_CUDA) runs the same tests
// on a real GPU and skips without one.
#include <atomic>
#include <cstring>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "core/state_dict.h"
#include "cuda/host_runtime.h"
#include "engine/checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file_system_storage.h"
#include "planner/default_planner.h"
#include "staging/device_staging.h"
#include "tests/test_util.h"

namespace dcp {
namespace {

using ::dcp::testing::ListFiles;
using ::dcp::testing::MakeTempDir;
using ::dcp::testing::SeededTensor;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr size_t kChunk = 64 * 1024;

// A device copy of a host tensor, freed when the last Tensor copy goes.
Tensor ToDevice(DeviceRuntime& runtime, const Tensor& host) {
  void* data = *runtime.AllocateDevice(0, std::max<size_t>(host.nbytes(), 1));
  EXPECT_TRUE(
      runtime.Copy(data, host.data(), host.nbytes(), CopyKind::kHostToDevice)
          .ok());
  std::shared_ptr<void> owner(
      data, [&runtime](void* p) { runtime.FreeDevice(p).IgnoreError(); });
  return Tensor::WithOwner(
      TensorView(data, host.dtype(), host.sizes(), Device::Cuda(0)),
      std::move(owner));
}

struct Case {
  bool direct_io;
  int thread_count;
};

class DeviceSaveTest : public ::testing::TestWithParam<Case> {
 protected:
  // Host originals and their device copies, sized to cross chunk and
  // checksum-block boundaries: several chunks with a ragged tail, an exact
  // multiple of the chunk, a few bytes, zero elements.
  void MakeState() {
    host_["model"] = StateDict{
        {"big", SeededTensor(DType::kF32, {5 * 16384 + 3}, 1)},
        {"exact", SeededTensor(DType::kBF16, {2, kChunk}, 2)},
        {"tiny", SeededTensor(DType::kU8, {3}, 3)},
        {"empty", SeededTensor(DType::kF32, {0, 4}, 4)},
    };
    host_["cpu"] = SeededTensor(DType::kI64, {1000}, 5);
    host_["step"] = int64_t{77};
    device_ = host_;
    StateDict& model = device_["model"].dict();
    for (auto& [name, value] : model) {
      value = ToDevice(*runtime_, value.tensor());
    }
  }

  FileSystemWriterOptions WriterOptions() {
    FileSystemWriterOptions options;
    options.direct_io = GetParam().direct_io;
    options.thread_count = GetParam().thread_count;
    options.checksum_block_size = 3 * 4096;  // Blocks straddle pieces.
    options.device_staging = staging_.get();
    return options;
  }

  // Loads `dir` into host tensors and compares with the originals.
  void ExpectHostOriginals(const std::string& dir) {
    StateDict loaded = host_;
    for (auto& [name, value] : loaded["model"].dict()) {
      value = Tensor::Empty(value.tensor().dtype(), value.tensor().sizes());
    }
    loaded["cpu"] = Tensor::Empty(DType::kI64, {1000});
    loaded["step"] = int64_t{0};
    LoadOptions load;
    load.checkpoint_id = dir;
    absl::Status status = Load(loaded, load);
    ASSERT_TRUE(status.ok()) << status;
    for (const auto& [name, value] : host_.at("model").dict()) {
      EXPECT_TRUE(value.tensor().BytesEqual(
          loaded.at("model").dict().at(name).tensor()))
          << name;
    }
    EXPECT_TRUE(host_.at("cpu").tensor().BytesEqual(loaded.at("cpu").tensor()));
    EXPECT_EQ(loaded.at("step").int_value(), 77);
  }

  void SetUpStaging(HostRuntimeOptions runtime_options = {}) {
#ifdef DCP_DEVICE_SAVE_ON_CUDA
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    if (runtime_options.copy_fault) {
      GTEST_SKIP() << "copy faults are injected by the host runtime only";
    }
    absl::StatusOr<std::unique_ptr<DeviceRuntime>> cuda =
        CreateDeviceRuntime(DeviceRuntimeMode::kCuda);
    ASSERT_TRUE(cuda.ok()) << cuda.status();
    runtime_ = *std::move(cuda);
#else
    runtime_ = CreateHostRuntime(std::move(runtime_options));
#endif
    DeviceStagingOptions options;
    options.chunk_bytes = kChunk;
    options.pool_bytes = 2 * kChunk;  // Far smaller than the state.
    staging_ = std::make_unique<DeviceStaging>(options, runtime_.get());
  }

  std::unique_ptr<DeviceRuntime> runtime_;
  std::unique_ptr<DeviceStaging> staging_;
  StateDict host_;
  StateDict device_;
};

TEST_P(DeviceSaveTest, DeviceTensorsRoundTripThroughABoundedPool) {
  SetUpStaging();
  if (IsSkipped()) return;
  MakeState();
  const std::string dir = MakeTempDir("device_save");
  FileSystemWriter writer(dir, WriterOptions());
  SaveOptions save;
  save.storage_writer = &writer;
  absl::StatusOr<Metadata> saved = Save(device_, save);
  ASSERT_TRUE(saved.ok()) << saved.status();

  // Every device byte went through the two-chunk pool, never more at once.
  HostBufferPool* pool = *staging_->Pool();
  EXPECT_EQ(pool->num_chunks(), 2);
  EXPECT_GE(pool->peak_in_use(), 1);
  EXPECT_LE(pool->peak_in_use(), 2);
  EXPECT_EQ(pool->in_use(), 0);  // Every chunk back after the save.
  // Payloads stay 4 KiB aligned, as for host tensors.
  absl::StatusOr<Metadata> stored = FileSystemReader(dir).ReadMetadata();
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->storage_data.size(), 6u);
  for (const auto& [index, info] : stored->storage_data) {
    if (index.offset.has_value()) {
      EXPECT_EQ(info.offset % 4096, 0) << index.ToString();
    }
  }
  ExpectHostOriginals(dir);
}

TEST_P(DeviceSaveTest, ASecondSaveReusesThePoolAndReplacesTheFirst) {
  SetUpStaging();
  if (IsSkipped()) return;
  MakeState();
  const std::string dir = MakeTempDir("device_resave");
  FileSystemWriter writer(dir, WriterOptions());
  SaveOptions save;
  save.storage_writer = &writer;
  ASSERT_TRUE(Save(device_, save).ok());
  const std::set<std::string> first = ListFiles(dir);
  ASSERT_TRUE(SaveStateDict(device_, writer, save).ok());
  const std::set<std::string> second = ListFiles(dir);
  // The old data files are gone; only the metadata name is shared.
  std::vector<std::string> shared;
  std::set_intersection(first.begin(), first.end(), second.begin(),
                        second.end(), std::back_inserter(shared));
  EXPECT_EQ(shared, std::vector<std::string>{".metadata"});
  EXPECT_EQ((*staging_->Pool())->in_use(), 0);
  ExpectHostOriginals(dir);
}

TEST_P(DeviceSaveTest, ASyncSaveGathersStridedDeviceViews) {
  SetUpStaging();
  if (IsSkipped()) return;
  // A [256, 96] f32 matrix (96 KiB: more than a staging chunk) on the
  // device, saved as its transpose and as every other row from row 1.
  const Tensor host = SeededTensor(DType::kF32, {256, 96}, 11);
  const Tensor device = ToDevice(*runtime_, host);
  auto view = [](const Tensor& base, Device where, int64_t first_element,
                 Shape sizes, Shape strides) {
    return Tensor::Wrap(TensorView(
        static_cast<float*>(const_cast<void*>(base.data())) + first_element,
        DType::kF32, std::move(sizes), std::move(strides), where));
  };
  StateDict state;
  state["transposed"] = view(device, Device::Cuda(0), 0, {96, 256}, {1, 96});
  state["odd_rows"] = view(device, Device::Cuda(0), 96, {128, 96}, {192, 1});
  ASSERT_FALSE(state.at("transposed").tensor().view().is_contiguous());
  ASSERT_FALSE(state.at("odd_rows").tensor().view().is_contiguous());
  const std::string dir = MakeTempDir("device_strided");
  FileSystemWriter writer(dir, WriterOptions());
  SaveOptions save;
  save.storage_writer = &writer;
  absl::StatusOr<Metadata> saved = Save(state, save);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ((*staging_->Pool())->in_use(), 0);

  StateDict loaded;
  loaded["transposed"] = Tensor::Empty(DType::kF32, {96, 256});
  loaded["odd_rows"] = Tensor::Empty(DType::kF32, {128, 96});
  LoadOptions load;
  load.checkpoint_id = dir;
  absl::Status status = Load(loaded, load);
  ASSERT_TRUE(status.ok()) << status;
  // What each view shows, gathered on the host from the host original.
  absl::StatusOr<Tensor> transposed =
      view(host, Device::Cpu(), 0, {96, 256}, {1, 96}).ContiguousHostCopy();
  absl::StatusOr<Tensor> odd_rows =
      view(host, Device::Cpu(), 96, {128, 96}, {192, 1}).ContiguousHostCopy();
  ASSERT_TRUE(transposed.ok() && odd_rows.ok());
  EXPECT_TRUE(transposed->BytesEqual(loaded.at("transposed").tensor()));
  EXPECT_TRUE(odd_rows->BytesEqual(loaded.at("odd_rows").tensor()));
}

TEST_P(DeviceSaveTest, AFailedCopyFailsTheSaveNamingTheTensorAndLeavesNoFiles) {
  // The third piece of "model.big" fails to copy.
  std::atomic<const void*> faulty{nullptr};
  HostRuntimeOptions faults;
  faults.copy_fault = [&faulty](const HostCopyTrace& trace) {
    if (trace.kind == CopyKind::kDeviceToHost && trace.src == faulty.load()) {
      return absl::DataLossError("injected ECC error");
    }
    return absl::OkStatus();
  };
  SetUpStaging(std::move(faults));
  if (IsSkipped()) return;
  MakeState();
  faulty = static_cast<const std::byte*>(
               device_.at("model").dict().at("big").tensor().data()) +
           2 * kChunk;
  const std::string dir = MakeTempDir("device_fault");
  // A committed checkpoint of other values is in the directory already.
  StateDict previous;
  previous["model"] = StateDict{{"big", SeededTensor(DType::kF32, {64}, 9)}};
  SaveOptions plain;
  plain.checkpoint_id = dir;
  ASSERT_TRUE(Save(previous, plain).ok());
  const std::set<std::string> before = ListFiles(dir);

  FileSystemWriter writer(dir, WriterOptions());
  SaveOptions save;
  save.storage_writer = &writer;
  absl::StatusOr<Metadata> saved = Save(device_, save);
  ASSERT_FALSE(saved.ok());
  EXPECT_EQ(saved.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(saved.status().message()),
              AllOf(HasSubstr("rank 0"), HasSubstr("model.big"),
                    HasSubstr("injected ECC error")));
  EXPECT_EQ(ListFiles(dir), before);
  EXPECT_EQ((*staging_->Pool())->in_use(), 0);

  // The previous checkpoint still loads, byte for byte.
  StateDict loaded;
  loaded["model"] = StateDict{{"big", Tensor::Empty(DType::kF32, {64})}};
  LoadOptions load;
  load.checkpoint_id = dir;
  ASSERT_TRUE(Load(loaded, load).ok());
  EXPECT_TRUE(previous.at("model").dict().at("big").tensor().BytesEqual(
      loaded.at("model").dict().at("big").tensor()));
}

// Host bytes of a device tensor.
Tensor ToHost(DeviceRuntime& runtime, const Tensor& device) {
  Tensor host = Tensor::Empty(device.dtype(), device.sizes());
  EXPECT_TRUE(runtime
                  .Copy(host.data(), device.data(), device.nbytes(),
                        CopyKind::kDeviceToHost)
                  .ok());
  return host;
}

// A device tensor of `dtype`/`sizes` full of 0xEE bytes (so a missed byte
// shows).
Tensor DeviceFilled(DeviceRuntime& runtime, DType dtype, Shape sizes) {
  Tensor host = Tensor::Empty(dtype, std::move(sizes));
  // An empty tensor has no memory (data() is null), and memset of a null
  // pointer is undefined even for 0 bytes.
  if (host.nbytes() > 0) std::memset(host.data(), 0xEE, host.nbytes());
  return ToDevice(runtime, host);
}

TEST_P(DeviceSaveTest, LoadsIntoDeviceTensorsWholeAndResharded) {
  SetUpStaging();
  if (IsSkipped()) return;
  MakeState();
  const std::string dir = MakeTempDir("device_load");
  FileSystemWriter writer(dir, WriterOptions());
  SaveOptions save;
  save.storage_writer = &writer;
  // A row-sharded tensor saved from the host, loaded as column blocks.
  const Tensor full = SeededTensor(DType::kF32, {300, 70}, 21);
  auto rows = [&](int64_t begin, int64_t end) {
    Tensor t = Tensor::Empty(DType::kF32, {end - begin, 70});
    std::memcpy(t.data(), static_cast<float*>(full.data()) + begin * 70,
                t.nbytes());
    return Shard{{begin, 0}, t};
  };
  device_["sharded"] = ShardedTensor(
      DType::kF32, {300, 70}, {rows(0, 120), rows(120, 121), rows(121, 300)});
  ASSERT_TRUE(Save(device_, save).ok());

  StateDict loaded;
  StateDict model;
  for (const auto& [name, value] : host_.at("model").dict()) {
    model[name] =
        DeviceFilled(*runtime_, value.tensor().dtype(), value.tensor().sizes());
  }
  loaded["model"] = std::move(model);
  loaded["cpu"] = Tensor::Empty(DType::kI64, {1000});
  loaded["step"] = int64_t{0};
  loaded["sharded"] = ShardedTensor(
      DType::kF32, {300, 70},
      {Shard{{0, 0}, DeviceFilled(*runtime_, DType::kF32, {300, 33})},
       Shard{{0, 33}, DeviceFilled(*runtime_, DType::kF32, {300, 37})}});
  FileSystemReaderOptions reader_options;
  reader_options.direct_io = GetParam().direct_io;
  reader_options.thread_count = GetParam().thread_count;
  reader_options.read_window_bytes = 40000;  // Several windows and pieces.
  reader_options.device_staging = staging_.get();
  FileSystemReader reader(dir, reader_options);
  LoadOptions load;
  load.storage_reader = &reader;
  absl::Status status = Load(loaded, load);
  ASSERT_TRUE(status.ok()) << status;

  for (const auto& [name, value] : host_.at("model").dict()) {
    EXPECT_TRUE(value.tensor().BytesEqual(
        ToHost(*runtime_, loaded.at("model").dict().at(name).tensor())))
        << name;
  }
  EXPECT_TRUE(host_.at("cpu").tensor().BytesEqual(loaded.at("cpu").tensor()));
  EXPECT_EQ(loaded.at("step").int_value(), 77);
  for (const Shard& shard :
       loaded.at("sharded").sharded_tensor().local_shards()) {
    const Tensor got = ToHost(*runtime_, shard.tensor);
    const int64_t c0 = shard.offsets[1], nc = shard.tensor.sizes()[1];
    for (int64_t r = 0; r < 300; ++r) {
      ASSERT_EQ(
          std::memcmp(static_cast<const float*>(got.data()) + r * nc,
                      static_cast<const float*>(full.data()) + r * 70 + c0,
                      nc * 4),
          0)
          << "row " << r << " of the block at column " << c0;
    }
  }
  EXPECT_EQ((*staging_->Pool())->in_use(), 0);
}

TEST_P(DeviceSaveTest, ACorruptBlockFailsADeviceLoadNamingFileAndTensor) {
  SetUpStaging();
  if (IsSkipped()) return;
  MakeState();
  const std::string dir = MakeTempDir("device_corrupt");
  FileSystemWriter writer(dir, WriterOptions());
  SaveOptions save;
  save.storage_writer = &writer;
  ASSERT_TRUE(Save(device_, save).ok());
  absl::StatusOr<Metadata> saved = FileSystemReader(dir).ReadMetadata();
  ASSERT_TRUE(saved.ok()) << saved.status();
  const StorageInfo& big =
      saved->storage_data.at(MetadataIndex("model.big", Shape{0}));
  {
    const std::string path = dir + "/" + big.relative_path;
    FILE* f = std::fopen(path.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, big.offset + 5000, SEEK_SET);
    const int c = std::fgetc(f);
    std::fseek(f, big.offset + 5000, SEEK_SET);
    std::fputc(c ^ 0x40, f);
    std::fclose(f);
  }
  StateDict loaded;
  loaded["model"] =
      StateDict{{"big", DeviceFilled(*runtime_, DType::kF32, {5 * 16384 + 3})}};
  FileSystemReaderOptions reader_options;
  reader_options.device_staging = staging_.get();
  FileSystemReader reader(dir, reader_options);
  LoadOptions load;
  load.storage_reader = &reader;
  DefaultLoadPlannerOptions partial;
  partial.allow_partial_load = true;
  DefaultLoadPlanner planner(partial);
  load.planner = &planner;
  absl::Status status = Load(loaded, load);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("checksum mismatch"), HasSubstr("model.big"),
                    HasSubstr(big.relative_path)));
  EXPECT_EQ((*staging_->Pool())->in_use(), 0);
}

INSTANTIATE_TEST_SUITE_P(Layouts, DeviceSaveTest,
                         ::testing::Values(Case{true, 1}, Case{false, 1},
                                           Case{true, 2}, Case{false, 2}),
                         [](const auto& info) {
                           return std::string(info.param.direct_io
                                                  ? "Direct"
                                                  : "Buffered") +
                                  std::to_string(info.param.thread_count) +
                                  "Threads";
                         });

}  // namespace
}  // namespace dcp
