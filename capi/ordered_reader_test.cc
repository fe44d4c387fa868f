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

#include "absl/synchronization/notification.h"
#include "core/state_dict.h"
#include "cuda/host_runtime.h"
#include "engine/checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file_system_storage.h"
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
  absl::Status LoadWith(const DeviceWait& wait) {
    DeviceStagingOptions staging_options;
    staging_options.chunk_bytes = 64 << 10;
    staging_options.pool_bytes = 256 << 10;
    auto staging =
        std::make_shared<DeviceStaging>(staging_options, runtime_.get());
    FileSystemReaderOptions reader_options;
    reader_options.device_staging = staging.get();
    OrderedReader reader(
        std::make_shared<FileSystemReader>(dir_, reader_options), staging);
    StateDict state{
        {"w", Tensor::Wrap(TensorView(device_, DType::kF32,
                                      {static_cast<int64_t>(kFloats)},
                                      Device::Cuda(0)))}};
    LoadOptions load;
    load.storage_reader = &reader;
    load.device_wait = wait;
    return Load(state, load);
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

  std::vector<float> saved_;
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

}  // namespace
}  // namespace dcp::capi
