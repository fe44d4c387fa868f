// The stream rule (SaveOptions::device_wait): a save issued while the
// caller's stream still writes a device tensor copies it only after that
// write. On the host-memory runtime: the caller's write is a copy on the
// caller's stream, held back until the test lets it go; every device-to-host
// copy of the tensor records whether the write had finished when it started,
// and the checkpoint must hold the written bytes. The runtime is wrapped
// (OrderingRuntime) to see, without timing, when the save enqueues a copy of
// the tensor and whether that copy's stream was ordered after the caller's.
#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "core/state_dict.h"
#include "cuda/host_runtime.h"
#include "engine/async_save.h"
#include "engine/checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file_system_storage.h"
#include "staging/device_staging.h"
#include "staging/stager.h"
#include "tests/test_util.h"

namespace dcp {
namespace {

using ::dcp::testing::MakeTempDir;

constexpr size_t kFloats = 300000;  // Several pool chunks of the writer.

// Forwards every call to `base`, telling `hooks` (before forwarding) of the
// calls that order work or enqueue copies. Hooks run on the calling thread
// and must be thread-safe.
class OrderingRuntime : public DeviceRuntime {
 public:
  struct Hooks {
    std::function<void(DeviceStream*, const DeviceWait&)> stream_wait_native;
    std::function<void(DeviceStream*, DeviceEvent*)> stream_wait_event;
    std::function<void(DeviceEvent*, DeviceStream*)> record_event;
    std::function<void(DeviceStream*)> synchronize_stream;
    std::function<void(DeviceEvent*)> synchronize_event;
    std::function<void(const void* src, CopyKind, DeviceStream*)> copy_async;
  };

  OrderingRuntime(std::unique_ptr<DeviceRuntime> base, Hooks hooks)
      : base_(std::move(base)), hooks_(std::move(hooks)) {}

  absl::string_view name() const override { return base_->name(); }
  bool is_host() const override { return base_->is_host(); }
  int DeviceCount() const override { return base_->DeviceCount(); }
  absl::StatusOr<DeviceProperties> GetDeviceProperties(
      int device) const override {
    return base_->GetDeviceProperties(device);
  }
  absl::StatusOr<DeviceStream*> CreateStream(int device) override {
    return base_->CreateStream(device);
  }
  absl::Status DestroyStream(DeviceStream* stream) override {
    return base_->DestroyStream(stream);
  }
  absl::Status SynchronizeStream(DeviceStream* stream) override {
    hooks_.synchronize_stream(stream);
    return base_->SynchronizeStream(stream);
  }
  absl::Status StreamWaitEvent(DeviceStream* stream,
                               DeviceEvent* event) override {
    hooks_.stream_wait_event(stream, event);
    return base_->StreamWaitEvent(stream, event);
  }
  absl::Status StreamWaitNative(DeviceStream* stream,
                                const DeviceWait& wait) override {
    hooks_.stream_wait_native(stream, wait);
    return base_->StreamWaitNative(stream, wait);
  }
  absl::StatusOr<DeviceEvent*> CreateEvent(int device,
                                           bool enable_timing) override {
    return base_->CreateEvent(device, enable_timing);
  }
  absl::Status DestroyEvent(DeviceEvent* event) override {
    return base_->DestroyEvent(event);
  }
  absl::Status RecordEvent(DeviceEvent* event, DeviceStream* stream) override {
    hooks_.record_event(event, stream);
    return base_->RecordEvent(event, stream);
  }
  absl::StatusOr<bool> QueryEvent(DeviceEvent* event) override {
    return base_->QueryEvent(event);
  }
  absl::Status SynchronizeEvent(DeviceEvent* event) override {
    hooks_.synchronize_event(event);
    return base_->SynchronizeEvent(event);
  }
  absl::StatusOr<double> ElapsedMillis(DeviceEvent* start,
                                       DeviceEvent* end) override {
    return base_->ElapsedMillis(start, end);
  }
  absl::Status CopyAsync(void* dst, const void* src, size_t bytes,
                         CopyKind kind, DeviceStream* stream) override {
    hooks_.copy_async(src, kind, stream);
    return base_->CopyAsync(dst, src, bytes, kind, stream);
  }
  absl::Status Copy(void* dst, const void* src, size_t bytes,
                    CopyKind kind) override {
    return base_->Copy(dst, src, bytes, kind);
  }
  absl::StatusOr<void*> AllocatePinned(size_t bytes) override {
    return base_->AllocatePinned(bytes);
  }
  absl::Status FreePinned(void* ptr) override { return base_->FreePinned(ptr); }
  absl::Status RegisterHost(void* ptr, size_t bytes) override {
    return base_->RegisterHost(ptr, bytes);
  }
  absl::Status UnregisterHost(void* ptr) override {
    return base_->UnregisterHost(ptr);
  }
  absl::StatusOr<void*> AllocateDevice(int device, size_t bytes) override {
    return base_->AllocateDevice(device, bytes);
  }
  absl::Status FreeDevice(void* ptr) override { return base_->FreeDevice(ptr); }
  absl::StatusOr<DeviceAllocation> FindAllocation(int device,
                                                  const void* ptr) override {
    return base_->FindAllocation(device, ptr);
  }
  void* NativeStream(DeviceStream* stream) override {
    return base_->NativeStream(stream);
  }
  absl::StatusOr<int> SetCurrentDevice(int device) override {
    return base_->SetCurrentDevice(device);
  }

 private:
  std::unique_ptr<DeviceRuntime> base_;
  Hooks hooks_;
};

class StreamOrderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HostRuntimeOptions options;
    options.copy_observer = [this](const HostCopyTrace& t) { Observe(t); };
    OrderingRuntime::Hooks hooks;
    hooks.stream_wait_native = [this](DeviceStream* s, const DeviceWait& w) {
      // On the host runtime a native stream handle is the DeviceStream*.
      if (w.kind == DeviceWait::Kind::kStream && w.handle == caller_) {
        Ordered(s);
      }
    };
    hooks.stream_wait_event = [this](DeviceStream* s, DeviceEvent* e) {
      if (IsCallerEvent(e)) Ordered(s);
    };
    hooks.record_event = [this](DeviceEvent* e, DeviceStream* s) {
      absl::MutexLock lock(&mu_);
      if (s == caller_) {
        caller_events_.insert(e);
      } else {
        caller_events_.erase(e);
      }
    };
    hooks.synchronize_stream = [this](DeviceStream* s) {
      if (s == caller_) SaveReachedTheTensor();
    };
    hooks.synchronize_event = [this](DeviceEvent* e) {
      if (IsCallerEvent(e)) SaveReachedTheTensor();
    };
    hooks.copy_async = [this](const void* src, CopyKind kind, DeviceStream* s) {
      Enqueued(src, kind, s);
    };
    runtime_ = std::make_unique<OrderingRuntime>(
        CreateHostRuntime(std::move(options)), std::move(hooks));
    device_ = *runtime_->AllocateDevice(0, kFloats * sizeof(float));
    std::vector<float> zeros(kFloats, 0.0f);
    ASSERT_TRUE(runtime_
                    ->Copy(device_, zeros.data(), kFloats * sizeof(float),
                           CopyKind::kHostToDevice)
                    .ok());
    written_.resize(kFloats);
    for (size_t i = 0; i < kFloats; ++i) written_[i] = 1.0f + i;
    // Filled here, not in EnqueueNextStep: the stream's worker reads
    // next_step_.data() in Observe while the test thread enqueues.
    next_step_.assign(kFloats, -7.0f);
    caller_ = *runtime_->CreateStream(0);
  }
  void TearDown() override {
    Release();  // Never leave a held copy behind.
    ReleaseNextStep();
    ASSERT_TRUE(runtime_->SynchronizeStream(caller_).ok());
    ASSERT_TRUE(runtime_->DestroyStream(caller_).ok());
    ASSERT_TRUE(runtime_->FreeDevice(device_).ok());
  }

  // The training step: writes `written_` into the tensor on the caller's
  // stream; the copy is held until Release().
  void EnqueueStep() {
    ASSERT_TRUE(runtime_
                    ->CopyAsync(device_, written_.data(),
                                kFloats * sizeof(float),
                                CopyKind::kHostToDevice, caller_)
                    .ok());
  }
  void Release() {
    if (!release_.HasBeenNotified()) release_.Notify();
  }
  // The next training step, enqueued on the caller's stream after the save
  // was called; held until ReleaseNextStep().
  void EnqueueNextStep() {
    ASSERT_TRUE(runtime_
                    ->CopyAsync(device_, next_step_.data(),
                                kFloats * sizeof(float),
                                CopyKind::kHostToDevice, caller_)
                    .ok());
  }
  void ReleaseNextStep() {
    if (!release_next_.HasBeenNotified()) release_next_.Notify();
  }

  StateDict State() {
    return StateDict{
        {"w", Tensor::Wrap(TensorView(device_, DType::kF32,
                                      {static_cast<int64_t>(kFloats)},
                                      Device::Cuda(0)))}};
  }
  DeviceWait WaitForCaller() { return DeviceWait::Stream(0, caller_); }
  // AsyncSave of the state into `dir` through `stager`, after the caller's
  // stream.
  AsyncSaveResponse AsyncSaveAfterStep(AsyncCheckpointer& checkpointer,
                                       AsyncStager& stager,
                                       const std::string& dir) {
    AsyncSaveOptions async;
    async.save.checkpoint_id = dir;
    async.save.device_wait = WaitForCaller();
    async.async_stager = &stager;
    return checkpointer.AsyncSave(State(), async);
  }
  // Device-to-host copies of the tensor that started before the write.
  int early_copies() const { return early_copies_.load(); }
  // Device-to-host copies of the tensor enqueued while the write was held
  // on a stream not ordered after the caller's (they may run before it).
  int unordered_copies() const { return unordered_copies_.load(); }
  // Waits until the save enqueued its first device-to-host copy of the
  // tensor, or blocks on the caller's stream itself: from then on a copy
  // that ignores the rule has shown itself (unordered_copies).
  void WaitUntilTheSaveReachedTheTensor() {
    save_reached_tensor_.WaitForNotification();
  }
  int copies_of_tensor() const { return copies_of_tensor_.load(); }

  void ExpectCheckpointHoldsTheWrite(const std::string& dir) {
    Tensor back = Tensor::Empty(DType::kF32, {static_cast<int64_t>(kFloats)});
    std::memset(back.data(), 0, back.nbytes());
    StateDict loaded{{"w", back}};
    LoadOptions load;
    load.checkpoint_id = dir;
    ASSERT_TRUE(Load(loaded, load).ok());
    EXPECT_EQ(std::memcmp(back.data(), written_.data(), back.nbytes()), 0);
  }

  std::unique_ptr<DeviceRuntime> runtime_;
  void* device_ = nullptr;
  DeviceStream* caller_ = nullptr;
  std::vector<float> written_;
  std::vector<float> next_step_;

 private:
  bool InTensor(const void* p) const {
    const auto* begin = static_cast<const std::byte*>(device_);
    const auto* at = static_cast<const std::byte*>(p);
    return at >= begin && at < begin + kFloats * sizeof(float);
  }
  bool IsCallerEvent(DeviceEvent* e) {
    absl::MutexLock lock(&mu_);
    return caller_events_.count(e) > 0;
  }
  void Ordered(DeviceStream* s) {
    absl::MutexLock lock(&mu_);
    ordered_streams_.insert(s);
  }
  void SaveReachedTheTensor() {
    if (!save_reached_tensor_.HasBeenNotified()) save_reached_tensor_.Notify();
  }
  void Enqueued(const void* src, CopyKind kind, DeviceStream* s) {
    if (kind != CopyKind::kDeviceToHost || !InTensor(src)) return;
    bool ordered;
    {
      absl::MutexLock lock(&mu_);
      ordered = ordered_streams_.count(s) > 0;
    }
    if (!ordered && !write_done_.load()) unordered_copies_.fetch_add(1);
    SaveReachedTheTensor();
  }

  void Observe(const HostCopyTrace& t) {
    if (t.kind == CopyKind::kHostToDevice && t.stream != nullptr &&
        t.stream == caller_) {
      if (t.src == next_step_.data()) {  // The step after the save.
        if (t.phase == HostCopyTrace::Phase::kStart) {
          release_next_.WaitForNotification();
        }
        return;
      }
      if (t.phase == HostCopyTrace::Phase::kStart) {
        release_.WaitForNotification();
      } else {
        write_done_.store(true);
      }
      return;
    }
    if (t.kind == CopyKind::kDeviceToHost &&
        t.phase == HostCopyTrace::Phase::kStart && InTensor(t.src)) {
      copies_of_tensor_.fetch_add(1);
      if (!write_done_.load()) {
        early_copies_.fetch_add(1);
      }
    }
  }

  absl::Notification release_;
  absl::Notification release_next_;
  std::atomic<bool> write_done_{false};

 private:
  std::atomic<int> early_copies_{0};
  std::atomic<int> copies_of_tensor_{0};
  std::atomic<int> unordered_copies_{0};
  absl::Notification save_reached_tensor_;
  absl::Mutex mu_;
  // Streams made to wait for the caller's stream, and the events last
  // recorded on it.
  std::set<DeviceStream*> ordered_streams_ ABSL_GUARDED_BY(mu_);
  std::set<DeviceEvent*> caller_events_ ABSL_GUARDED_BY(mu_);
};

// A synchronous Save through the FileSystemWriter's bounded pool: its copy
// streams wait for the caller's stream; the save finishes once the write is
// let go.
TEST_F(StreamOrderTest, SaveCopiesOnlyAfterTheCallersStream) {
  DeviceStagingOptions staging_options;
  staging_options.chunk_bytes = 64 << 10;
  staging_options.pool_bytes = 256 << 10;
  DeviceStaging staging(staging_options, runtime_.get());
  const std::string dir = MakeTempDir("save_order");
  FileSystemWriterOptions writer_options;
  writer_options.device_staging = &staging;
  FileSystemWriter writer(dir, writer_options);
  EnqueueStep();
  SaveOptions save;
  save.storage_writer = &writer;
  save.device_wait = WaitForCaller();
  absl::Status saved;
  std::thread saver([&] { saved = Save(State(), save).status(); });
  // Save blocks until its copies are written, and they wait for the held
  // write: once the save has enqueued a copy of the tensor, a copy that
  // ignores the rule is on record; then let the write go.
  WaitUntilTheSaveReachedTheTensor();
  Release();
  saver.join();
  ASSERT_TRUE(saved.ok()) << saved;
  EXPECT_GT(copies_of_tensor(), 1);
  EXPECT_EQ(unordered_copies(), 0);
  EXPECT_EQ(early_copies(), 0);
  ExpectCheckpointHoldsTheWrite(dir);
}

// AsyncSave with the seed's stager (non-blocking copies): AsyncSave returns
// while the write is still held, and staging completes after it.
TEST_F(StreamOrderTest, AsyncSaveStagesOnlyAfterTheCallersStream) {
  StagingOptions options;
  options.use_async_staging = false;  // Stage enqueues and returns.
  DefaultStager stager(options, runtime_.get());
  const std::string dir = MakeTempDir("async_order");
  EnqueueStep();
  AsyncCheckpointer checkpointer;
  AsyncSaveResponse response = AsyncSaveAfterStep(checkpointer, stager, dir);
  Release();
  ASSERT_TRUE(response.staging_completion.Wait().ok());
  ASSERT_TRUE(response.upload_completion.Wait().ok());
  EXPECT_GE(copies_of_tensor(), 1);
  EXPECT_EQ(unordered_copies(), 0);
  EXPECT_EQ(early_copies(), 0);
  ExpectCheckpointHoldsTheWrite(dir);
}

// With asynchronous staging (the seed's default) the caller's stream is
// marked when AsyncSave is called: a step the loop enqueues right after
// is neither waited for nor copied. (Marked later, staging would wait for
// that held step; the deadline only bounds that hang.)
TEST_F(StreamOrderTest, TheStreamIsMarkedWhenAsyncSaveIsCalled) {
  DefaultStager stager(StagingOptions(), runtime_.get());
  const std::string dir = MakeTempDir("async_mark");
  EnqueueStep();
  AsyncCheckpointer checkpointer;
  AsyncSaveResponse response = AsyncSaveAfterStep(checkpointer, stager, dir);
  EnqueueNextStep();
  Release();
  ASSERT_TRUE(response.staging_completion.WaitFor(absl::Seconds(30)))
      << "staging waited for the step enqueued after AsyncSave";
  ASSERT_TRUE(response.staging_completion.Wait().ok());
  ReleaseNextStep();
  ASSERT_TRUE(response.upload_completion.Wait().ok());
  EXPECT_EQ(early_copies(), 0);
  ExpectCheckpointHoldsTheWrite(dir);
}

// Tensors on another device than the stream to wait for are refused.
TEST_F(StreamOrderTest, ATensorOnAnotherDeviceThanTheWaitIsRefused) {
  StagingOptions options;
  options.use_async_staging = false;
  DefaultStager stager(options, runtime_.get());
  Future<StateDict> staged =
      stager.Stage(State(), DeviceWait::Stream(1, caller_));
  EXPECT_EQ(staged.Wait().status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(staged.Wait().status().message()),
              ::testing::HasSubstr("cuda:1"));
}

// A caller's event works as well as its stream.
TEST_F(StreamOrderTest, AnEventRecordedAfterTheStepOrdersTheCopies) {
  DeviceEvent* event = *runtime_->CreateEvent(0, /*enable_timing=*/false);
  EnqueueStep();
  ASSERT_TRUE(runtime_->RecordEvent(event, caller_).ok());
  StagingOptions options;
  options.use_async_staging = false;
  DefaultStager stager(options, runtime_.get());
  Future<StateDict> staged = stager.Stage(State(), DeviceWait::Event(0, event));
  Release();
  ASSERT_TRUE(staged.Wait().ok());
  ASSERT_TRUE(stager.SynchronizeStaging().ok());
  EXPECT_EQ(early_copies(), 0);
  EXPECT_EQ(std::memcmp(staged.Wait()->at("w").tensor().data(), written_.data(),
                        kFloats * sizeof(float)),
            0);
  ASSERT_TRUE(runtime_->DestroyEvent(event).ok());
}

// Stagers and writers that cannot order their copies refuse a wait instead
// of copying too early.
TEST(StreamOrderRefusalTest, AStagerWithoutOrderingRefusesAWait) {
  class PlainStager final : public AsyncStager {
   public:
    using AsyncStager::Stage;
    Future<StateDict> Stage(const StateDict& sd) override {
      return Future<StateDict>::Ready(sd);
    }
    bool should_synchronize_after_execute() const override { return false; }
    absl::Status SynchronizeStaging() override { return absl::OkStatus(); }
    void Close() override {}
  } stager;
  int marker = 0;
  EXPECT_EQ(stager.Stage(StateDict{}, DeviceWait::Stream(0, &marker))
                .Wait()
                .status()
                .code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(stager.Stage(StateDict{}, DeviceWait{}).Wait().ok());
}

}  // namespace
}  // namespace dcp
