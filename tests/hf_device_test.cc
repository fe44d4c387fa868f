// Device tensors through the Hugging Face storage: saved through a bounded
// staging pool (each piece written from its chunk), loaded into device
// destinations whole and resharded. hf_device_test runs on the host-memory
// runtime (device memory is host memory the runtime allocates, copies run
// on its stream workers); hf_device_gpu_test (DCP_HF_DEVICE_ON_CUDA) runs
// the same on a real GPU and skips without one.
#include <cstring>
#include <memory>
#include <string>

#include "core/state_dict.h"
#include "cuda/host_runtime.h"
#include "engine/checkpoint.h"
#include "gtest/gtest.h"
#include "io/hf_storage.h"
#include "staging/device_staging.h"
#include "tests/test_util.h"

namespace dcp {
namespace {

using ::dcp::testing::MakeTempDir;
using ::dcp::testing::SeededTensor;

constexpr size_t kChunk = 64 * 1024;

class HfDeviceTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
#ifdef DCP_HF_DEVICE_ON_CUDA
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    absl::StatusOr<std::unique_ptr<DeviceRuntime>> cuda =
        CreateDeviceRuntime(DeviceRuntimeMode::kCuda);
    ASSERT_TRUE(cuda.ok()) << cuda.status();
    runtime_ = *std::move(cuda);
#else
    runtime_ = CreateHostRuntime();
#endif
    DeviceStagingOptions options;
    options.chunk_bytes = kChunk;
    options.pool_bytes = 2 * kChunk;  // Far smaller than the state.
    staging_ = std::make_unique<DeviceStaging>(options, runtime_.get());
  }

  Tensor ToDevice(const Tensor& host) {
    void* data =
        *runtime_->AllocateDevice(0, std::max<size_t>(host.nbytes(), 1));
    EXPECT_TRUE(
        runtime_
            ->Copy(data, host.data(), host.nbytes(), CopyKind::kHostToDevice)
            .ok());
    DeviceRuntime* runtime = runtime_.get();
    std::shared_ptr<void> owner(
        data, [runtime](void* p) { runtime->FreeDevice(p).IgnoreError(); });
    return Tensor::WithOwner(
        TensorView(data, host.dtype(), host.sizes(), Device::Cuda(0)),
        std::move(owner));
  }

  Tensor ToHost(const Tensor& device) {
    Tensor host = Tensor::Empty(device.dtype(), device.sizes());
    EXPECT_TRUE(runtime_
                    ->Copy(host.data(), device.data(), device.nbytes(),
                           CopyKind::kDeviceToHost)
                    .ok());
    return host;
  }

  std::unique_ptr<DeviceRuntime> runtime_;
  std::unique_ptr<DeviceStaging> staging_;
};

TEST_P(HfDeviceTest, SaveFromAndLoadIntoDeviceTensors) {
  const bool direct = GetParam();
  // Several chunks with a ragged tail, a whole number of chunks, a few
  // bytes, no elements, and a host tensor in the same file.
  StateDict host;
  host["big"] = SeededTensor(DType::kF32, {5 * 16384 + 3}, 1);
  host["exact"] = SeededTensor(DType::kBF16, {2, kChunk}, 2);
  host["tiny"] = SeededTensor(DType::kU8, {3}, 3);
  host["empty"] = SeededTensor(DType::kF32, {0, 4}, 4);
  host["rows"] = SeededTensor(DType::kI32, {96, 1000}, 5);
  StateDict device;
  for (const auto& [name, value] : host)
    device[name] = ToDevice(value.tensor());
  device["cpu"] = host["cpu"] = SeededTensor(DType::kI64, {1000}, 6);

  const std::string dir = MakeTempDir("hf_device");
  HuggingFaceStorageWriterOptions writer_options;
  writer_options.direct_io = direct;
  writer_options.device_staging = staging_.get();
  HuggingFaceStorageWriter writer(dir, writer_options);
  SaveOptions save;
  save.storage_writer = &writer;
  absl::StatusOr<Metadata> saved = Save(device, save);
  ASSERT_TRUE(saved.ok()) << saved.status();
  HostBufferPool* pool = *staging_->Pool();
  EXPECT_LE(pool->peak_in_use(), 2);
  EXPECT_EQ(pool->in_use(), 0);  // Every chunk back after the save.

  // Host destinations.
  StateDict loaded;
  for (const auto& [name, value] : host) {
    loaded[name] =
        Tensor::Empty(value.tensor().dtype(), value.tensor().sizes());
  }
  HuggingFaceStorageReaderOptions reader_options;
  reader_options.direct_io = direct;
  reader_options.device_staging = staging_.get();
  {
    HuggingFaceStorageReader reader(dir, reader_options);
    LoadOptions load;
    load.storage_reader = &reader;
    ASSERT_TRUE(Load(loaded, load).ok());
  }
  for (const auto& [name, value] : host) {
    EXPECT_TRUE(value.tensor().BytesEqual(loaded[name].tensor())) << name;
  }

  // Device destinations, one of them a row shard.
  StateDict on_device;
  for (const auto& [name, value] : host) {
    if (name == "cpu") continue;
    on_device[name] =
        ToDevice(Tensor::Empty(value.tensor().dtype(), value.tensor().sizes()));
  }
  on_device["rows"] = ShardedTensor(
      DType::kI32, {96, 1000},
      {Shard{{40, 0}, ToDevice(Tensor::Empty(DType::kI32, {50, 1000}))}});
  {
    HuggingFaceStorageReader reader(dir, reader_options);
    LoadOptions load;
    load.storage_reader = &reader;
    absl::Status status = Load(on_device, load);
    ASSERT_TRUE(status.ok()) << status;
  }
  for (const auto& [name, value] : on_device) {
    if (name == "rows") continue;
    EXPECT_TRUE(host[name].tensor().BytesEqual(ToHost(value.tensor()))) << name;
  }
  const Tensor rows =
      ToHost(on_device["rows"].sharded_tensor().local_shards()[0].tensor);
  EXPECT_EQ(0,
            std::memcmp(rows.data(),
                        static_cast<const char*>(host["rows"].tensor().data()) +
                            40 * 1000 * 4,
                        rows.nbytes()));
}

INSTANTIATE_TEST_SUITE_P(DirectIo, HfDeviceTest, ::testing::Bool());

}  // namespace
}  // namespace dcp
