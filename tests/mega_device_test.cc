// Device tensors through the MEGA storage on the host-memory runtime
// (device memory is host memory the runtime allocates, copies run on its
// stream workers): saved through a staging pool far smaller than the state
// (each piece written from its chunk, checksummed as it passes), with a
// host tensor and a non-tensor value in the same file; loaded into host
// and device destinations.
#include <cstring>
#include <memory>
#include <string>

#include "core/state_dict.h"
#include "cuda/host_runtime.h"
#include "engine/checkpoint.h"
#include "gtest/gtest.h"
#include "io/mega_storage.h"
#include "staging/device_staging.h"
#include "tests/test_util.h"

namespace dcp {
namespace {

using ::dcp::testing::MakeTempDir;
using ::dcp::testing::SeededTensor;

constexpr size_t kChunk = 64 * 1024;

TEST(MegaDevice, SaveFromAndLoadIntoDeviceTensors) {
  std::unique_ptr<DeviceRuntime> runtime = CreateHostRuntime();
  DeviceStagingOptions staging_options;
  staging_options.chunk_bytes = kChunk;
  staging_options.pool_bytes = 2 * kChunk;
  DeviceStaging staging(staging_options, runtime.get());
  auto to_device = [&](const Tensor& host) {
    void* data =
        *runtime->AllocateDevice(0, std::max<size_t>(host.nbytes(), 1));
    EXPECT_TRUE(
        runtime->Copy(data, host.data(), host.nbytes(), CopyKind::kHostToDevice)
            .ok());
    DeviceRuntime* r = runtime.get();
    return Tensor::WithOwner(
        TensorView(data, host.dtype(), host.sizes(), Device::Cuda(0)),
        std::shared_ptr<void>(
            data, [r](void* p) { r->FreeDevice(p).IgnoreError(); }));
  };
  StateDict host;
  host["big"] = SeededTensor(DType::kF32, {5 * 16384 + 3}, 1);
  host["exact"] = SeededTensor(DType::kBF16, {2, kChunk}, 2);
  host["tiny"] = SeededTensor(DType::kU8, {3}, 3);
  host["empty"] = SeededTensor(DType::kF32, {0, 4}, 4);
  StateDict device;
  for (const auto& [name, value] : host) {
    device[name] = to_device(value.tensor());
  }
  device["cpu"] = host["cpu"] = SeededTensor(DType::kI64, {1000}, 6);
  device["step"] = int64_t{42};

  for (bool direct : {false, true}) {
    const std::string dir = MakeTempDir("mega_device");
    MegaStorageWriterOptions writer_options;
    writer_options.direct_io = direct;
    writer_options.checksum_block_size = 16 << 10;  // Blocks span pieces.
    writer_options.device_staging = &staging;
    MegaStorageWriter writer(dir, writer_options);
    SaveOptions save;
    save.storage_writer = &writer;
    absl::StatusOr<Metadata> saved = Save(device, save);
    ASSERT_TRUE(saved.ok()) << saved.status();
    HostBufferPool* pool = *staging.Pool();
    EXPECT_EQ(pool->in_use(), 0);

    MegaStorageReaderOptions reader_options;
    reader_options.direct_io = direct;
    reader_options.device_staging = &staging;
    StateDict loaded;
    for (const auto& [name, value] : host) {
      loaded[name] =
          Tensor::Empty(value.tensor().dtype(), value.tensor().sizes());
    }
    loaded["step"] = int64_t{0};
    loaded["big"] = to_device(Tensor::Empty(DType::kF32, {5 * 16384 + 3}));
    MegaStorageReader reader(dir, reader_options);
    LoadOptions load;
    load.storage_reader = &reader;
    absl::Status status = Load(loaded, load);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(loaded["step"].int_value(), 42);
    for (const auto& [name, value] : host) {
      Tensor got = loaded[name].tensor();
      if (name == "big") {
        Tensor back = Tensor::Empty(got.dtype(), got.sizes());
        ASSERT_TRUE(runtime
                        ->Copy(back.data(), got.data(), got.nbytes(),
                               CopyKind::kDeviceToHost)
                        .ok());
        got = back;
      }
      EXPECT_TRUE(value.tensor().BytesEqual(got)) << name;
    }
  }
}

}  // namespace
}  // namespace dcp
