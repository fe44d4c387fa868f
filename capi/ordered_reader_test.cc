// The load side of the stream rule (dcp_load_options_t.device_wait,
// LoadOptions::device_wait) through the C ABI's OrderedReader: a load into a
// device tensor that the caller's stream is still writing (an allocator's
// fill, a kernel) copies into it only after that work. On the host-memory
// runtime: the caller's work is a copy on its stream, held until the test
// lets it go; every upload into the tensor records whether that work had
// finished when it started, and the tensor must end with the checkpoint's
// bytes (an upload that ran first would be overwritten by the held work).
#include "capi/internal/ordered_reader.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "core/dtype_convert.h"
#include "core/state_dict.h"
#include "cuda/host_runtime.h"
#include "engine/checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file_system_storage.h"
#include "planner/default_planner.h"
#include "staging/device_box_upload.h"
#include "staging/device_staging.h"

namespace dcp::capi {
namespace {

constexpr size_t kFloats = 300000;  // Several chunks of the staging pool.

std::string FreshDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::filesystem::path dir =
      std::filesystem::path(tmp != nullptr ? tmp : "/tmp") / name;
  std::filesystem::remove_all(dir);
  return dir.string();
}

class OrderedReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HostRuntimeOptions options;
    options.copy_observer = [this](const HostCopyTrace& t) { Observe(t); };
    // The held work goes once a stream waits for the caller's stream.
    options.wait_observer = [this](const HostWaitTrace& t) {
      if (t.recorder != nullptr && t.recorder == caller_) Release();
    };
    runtime_ = CreateHostRuntime(std::move(options));
    device_ = *runtime_->AllocateDevice(0, kFloats * sizeof(float));
    caller_ = *runtime_->CreateStream(0);
    saved_.resize(kFloats);
    for (size_t i = 0; i < kFloats; ++i) saved_[i] = 1.0f + i;
    fill_.assign(kFloats, -7.0f);
    dir_ = FreshDir("ordered_reader");
    StateDict state{
        {"w", Tensor::Wrap(TensorView(saved_.data(), DType::kF32,
                                      {static_cast<int64_t>(kFloats)},
                                      Device::Cpu()))}};
    SaveOptions save;
    save.checkpoint_id = dir_;
    ASSERT_TRUE(Save(state, save).ok());
  }
  void TearDown() override {
    Release();
    ASSERT_TRUE(runtime_->SynchronizeStream(caller_).ok());
    ASSERT_TRUE(runtime_->DestroyStream(caller_).ok());
    ASSERT_TRUE(runtime_->FreeDevice(device_).ok());
  }

  // The caller's work on the tensor (e.g. the allocator's fill), held on
  // its stream until Release().
  void EnqueueFill() {
    ASSERT_TRUE(runtime_
                    ->CopyAsync(device_, fill_.data(), kFloats * sizeof(float),
                                CopyKind::kHostToDevice, caller_)
                    .ok());
  }
  void Release() {
    std::call_once(released_, [this] { release_.Notify(); });
  }

  // Loads the checkpoint into the device tensor through an OrderedReader
  // whose staging uses the host runtime, with `wait`. The held fill goes
  // when a staging stream waits for the caller's stream (a correct order),
  // or when an upload starts before it (a broken one, counted).
  //
  // With a `dtype` other than F32 the load converts (convert_dtypes), and
  // with `device_conversion` the planner takes converted chunks to the
  // device through the staging, as dcp_load wires it.
  absl::Status LoadWith(const DeviceWait& wait, DType dtype = DType::kF32,
                        bool device_conversion = false) {
    DeviceStagingOptions staging_options;
    staging_options.chunk_bytes = 64 << 10;
    staging_options.pool_bytes = 256 << 10;
    auto staging =
        std::make_shared<DeviceStaging>(staging_options, runtime_.get());
    FileSystemReaderOptions reader_options;
    reader_options.device_staging = staging.get();
    OrderedReader reader(
        std::make_shared<FileSystemReader>(dir_, reader_options), staging);
    StateDict state{{"w", Tensor::Wrap(TensorView(
                              device_, dtype, {static_cast<int64_t>(kFloats)},
                              Device::Cuda(0)))}};
    DefaultLoadPlanner planner({.convert_dtypes = true});
    if (device_conversion) {
      planner.SetDeviceConversion(
          [staging](const std::byte* src, DType from, const TensorView& dst) {
            return ConvertUpload(*staging, src, from, dst);
          });
    }
    LoadOptions load;
    load.storage_reader = &reader;
    load.device_wait = wait;
    load.planner = &planner;
    return Load(state, load);
  }

  // The checkpoint's values converted to `dtype`.
  std::vector<std::byte> SavedAs(DType dtype) const {
    std::vector<std::byte> want(kFloats * ElementSize(dtype));
    ConvertElements(reinterpret_cast<const std::byte*>(saved_.data()),
                    DType::kF32, kFloats, want.data(), dtype);
    return want;
  }

  void ExpectTensorHoldsTheCheckpoint() {
    ASSERT_TRUE(runtime_->SynchronizeStream(caller_).ok());
    std::vector<float> back(kFloats);
    ASSERT_TRUE(runtime_
                    ->Copy(back.data(), device_, kFloats * sizeof(float),
                           CopyKind::kDeviceToHost)
                    .ok());
    EXPECT_EQ(std::memcmp(back.data(), saved_.data(), kFloats * sizeof(float)),
              0);
  }

  std::unique_ptr<DeviceRuntime> runtime_;
  std::vector<float> saved_;
  void* device_ = nullptr;
  DeviceStream* caller_ = nullptr;
  std::string dir_;
  std::atomic<int> uploads_{0};
  std::atomic<int> early_uploads_{0};

 private:
  void Observe(const HostCopyTrace& t) {
    if (t.stream != nullptr && t.stream == caller_) {
      if (t.phase == HostCopyTrace::Phase::kStart) {
        release_.WaitForNotification();
      } else {
        fill_done_.store(true);
      }
      return;
    }
    const auto* begin = static_cast<const std::byte*>(device_);
    const auto* dst = static_cast<const std::byte*>(t.dst);
    if (t.kind == CopyKind::kHostToDevice &&
        t.phase == HostCopyTrace::Phase::kStart && dst >= begin &&
        dst < begin + kFloats * sizeof(float)) {
      uploads_.fetch_add(1);
      if (!fill_done_.load()) {
        early_uploads_.fetch_add(1);
        Release();
      }
    }
  }

  std::vector<float> fill_;
  absl::Notification release_;
  std::once_flag released_;
  std::atomic<bool> fill_done_{false};
};

TEST_F(OrderedReaderTest, UploadsStartOnlyAfterTheCallersStream) {
  EnqueueFill();
  absl::Status loaded = LoadWith(DeviceWait::Stream(0, caller_));
  ASSERT_TRUE(loaded.ok()) << loaded;
  EXPECT_GT(uploads_.load(), 1);
  EXPECT_EQ(early_uploads_.load(), 0);
  ExpectTensorHoldsTheCheckpoint();
}

TEST_F(OrderedReaderTest, AnEventRecordedAfterTheWorkOrdersTheUploads) {
  DeviceEvent* event = *runtime_->CreateEvent(0, /*enable_timing=*/false);
  EnqueueFill();
  ASSERT_TRUE(runtime_->RecordEvent(event, caller_).ok());
  absl::Status loaded = LoadWith(DeviceWait::Event(0, event));
  ASSERT_TRUE(loaded.ok()) << loaded;
  EXPECT_EQ(early_uploads_.load(), 0);
  ExpectTensorHoldsTheCheckpoint();
  ASSERT_TRUE(runtime_->DestroyEvent(event).ok());
}

// A wait on another device than the tensor's is refused before any read.
TEST_F(OrderedReaderTest, ATensorOnAnotherDeviceThanTheWaitIsRefused) {
  absl::Status loaded = LoadWith(DeviceWait::Stream(1, caller_));
  EXPECT_EQ(loaded.code(), absl::StatusCode::kInvalidArgument) << loaded;
  EXPECT_THAT(std::string(loaded.message()),
              ::testing::AllOf(::testing::HasSubstr("\"w\""),
                               ::testing::HasSubstr("cuda:1")));
  EXPECT_EQ(uploads_.load(), 0);
}

// A device tensor of another dtype (convert_dtypes): the chunk is read into
// a host temporary of the saved dtype, converted into pool chunks and
// uploaded through the staging, ordered after the caller's stream as plain
// uploads are, and landed when the load returns.
TEST_F(OrderedReaderTest, ConvertedUploadsStartOnlyAfterTheCallersStream) {
  EnqueueFill();
  absl::Status loaded =
      LoadWith(DeviceWait::Stream(0, caller_), DType::kBF16, true);
  ASSERT_TRUE(loaded.ok()) << loaded;
  EXPECT_GT(uploads_.load(), 1);
  EXPECT_EQ(early_uploads_.load(), 0);
  ASSERT_TRUE(runtime_->SynchronizeStream(caller_).ok());
  // The held fill wrote F32 -7s over all of it first; the load's BF16 values
  // then cover the first half.
  const std::vector<std::byte> want = SavedAs(DType::kBF16);
  std::vector<std::byte> back(want.size());
  ASSERT_TRUE(
      runtime_->Copy(back.data(), device_, back.size(), CopyKind::kDeviceToHost)
          .ok());
  EXPECT_EQ(back, want);
}

// Without a way to the device the planner refuses the destination, naming
// it and both dtypes, before any copy.
TEST_F(OrderedReaderTest, AConvertingDeviceDestinationNeedsADeviceConversion) {
  absl::Status loaded = LoadWith(DeviceWait{}, DType::kBF16, false);
  EXPECT_EQ(loaded.code(), absl::StatusCode::kInvalidArgument) << loaded;
  EXPECT_THAT(std::string(loaded.message()),
              ::testing::AllOf(::testing::HasSubstr("\"w\""),
                               ::testing::HasSubstr("BF16"),
                               ::testing::HasSubstr("F32")));
  EXPECT_EQ(uploads_.load(), 0);
}

// Many converting device destinations: the host temporaries stay within
// the read window's bound (two windows and a chunk), not the whole state,
// and every tensor lands with its converted values.
TEST_F(OrderedReaderTest, ConvertedDeviceLoadsHoldAWindowOfTemporaries) {
  constexpr int kTensors = 40;
  constexpr int64_t kElements = 16384;  // 64 KiB saved, 32 KiB loaded.
  const std::string dir = FreshDir("ordered_reader_many");
  std::vector<std::vector<float>> values(kTensors);
  StateDict saved;
  for (int i = 0; i < kTensors; ++i) {
    values[i].resize(kElements);
    for (int64_t k = 0; k < kElements; ++k) values[i][k] = 0.5f * k - i;
    saved[absl::StrCat("t", i)] = Tensor::Wrap(
        TensorView(values[i].data(), DType::kF32, {kElements}, Device::Cpu()));
  }
  SaveOptions save;
  save.checkpoint_id = dir;
  ASSERT_TRUE(Save(saved, save).ok());

  DeviceStagingOptions staging_options;
  staging_options.chunk_bytes = 64 << 10;
  staging_options.pool_bytes = 256 << 10;
  auto staging =
      std::make_shared<DeviceStaging>(staging_options, runtime_.get());
  FileSystemReaderOptions reader_options;
  reader_options.device_staging = staging.get();
  reader_options.read_window_bytes = 128 << 10;
  OrderedReader reader(std::make_shared<FileSystemReader>(dir, reader_options),
                       staging);
  void* device = *runtime_->AllocateDevice(0, kTensors * kElements * 2);
  StateDict state;
  for (int i = 0; i < kTensors; ++i) {
    state[absl::StrCat("t", i)] = Tensor::Wrap(
        TensorView(static_cast<std::byte*>(device) + i * kElements * 2,
                   DType::kBF16, {kElements}, Device::Cuda(0)));
  }
  DefaultLoadPlanner planner({.convert_dtypes = true});
  planner.SetDeviceConversion(
      [staging](const std::byte* src, DType from, const TensorView& dst) {
        return ConvertUpload(*staging, src, from, dst);
      });
  LoadOptions load;
  load.storage_reader = &reader;
  load.planner = &planner;
  absl::Status loaded = Load(state, load);
  ASSERT_TRUE(loaded.ok()) << loaded;
  EXPECT_GT(planner.peak_temporary_bytes(), 0);
  EXPECT_LE(planner.peak_temporary_bytes(),
            2 * reader_options.read_window_bytes + kElements * 4);
  std::vector<std::byte> back(kElements * 2), want(kElements * 2);
  for (int i = 0; i < kTensors; ++i) {
    ASSERT_TRUE(runtime_
                    ->Copy(back.data(),
                           static_cast<std::byte*>(device) + i * kElements * 2,
                           back.size(), CopyKind::kDeviceToHost)
                    .ok());
    ConvertElements(reinterpret_cast<const std::byte*>(values[i].data()),
                    DType::kF32, kElements, want.data(), DType::kBF16);
    EXPECT_EQ(back, want) << "t" << i;
  }
  EXPECT_EQ((*staging->Pool())->in_use(), 0);
  ASSERT_TRUE(runtime_->FreeDevice(device).ok());
}

}  // namespace
}  // namespace dcp::capi
