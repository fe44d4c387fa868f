// The stream rule (SaveOptions::device_wait) on a real GPU. The training
// step is work on the caller's own CUDA stream: a long run of memsets of
// the tensor with throw-away bytes, then a copy of its final bytes. Save
// (the FileSystemWriter's pool) and AsyncSave (the seed's DefaultStager,
// non-blocking copies) are called right after, with that stream; their
// checkpoints must hold exactly the final bytes. A save that ignored the
// stream would copy while the memsets run. The step starts with a host
// function that holds the stream for half a second, longer than a save
// takes to plan and reach its first copy, so the hazard is real on a fast
// GPU (it does not pace the test: a save that honours the stream is
// correct whatever the timing). Skips without a GPU.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "core/state_dict.h"
#include "cuda/device_runtime.h"
#include "engine/async_save.h"
#include "engine/checkpoint.h"
#include "gtest/gtest.h"
#include "staging/stager.h"
#include "tests/test_util.h"

namespace dcp {
namespace {

using ::dcp::testing::MakeTempDir;

constexpr size_t kBytes = size_t{256} << 20;
constexpr int kMemsets = 200;

class StreamOrderGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&device_, kBytes), cudaSuccess);
    ASSERT_EQ(cudaMallocHost(&final_, kBytes), cudaSuccess);
    auto* f = static_cast<unsigned char*>(final_);
    for (size_t i = 0; i < kBytes; ++i) f[i] = (i * 131 + (i >> 20)) & 0xff;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
              cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (final_ != nullptr) cudaFreeHost(final_);
    if (device_ != nullptr) cudaFree(device_);
  }

  // Zeroes the tensor, then enqueues the step on the caller's stream.
  void EnqueueStep() {
    ASSERT_EQ(cudaMemset(device_, 0, kBytes), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaLaunchHostFunc(
                  stream_,
                  [](void*) {
                    std::this_thread::sleep_for(std::chrono::milliseconds(500));
                  },
                  nullptr),
              cudaSuccess);
    for (int i = 0; i < kMemsets; ++i) {
      ASSERT_EQ(cudaMemsetAsync(device_, 0x40 + (i & 0x3f), kBytes, stream_),
                cudaSuccess);
    }
    ASSERT_EQ(cudaMemcpyAsync(device_, final_, kBytes, cudaMemcpyHostToDevice,
                              stream_),
              cudaSuccess);
  }

  StateDict State() {
    return StateDict{
        {"w", Tensor::Wrap(TensorView(device_, DType::kU8,
                                      {static_cast<int64_t>(kBytes)},
                                      Device::Cuda(0)))}};
  }
  DeviceWait Wait() { return DeviceWait::Stream(0, stream_); }

  void ExpectCheckpointHoldsTheFinalBytes(const std::string& dir) {
    Tensor back = Tensor::Empty(DType::kU8, {static_cast<int64_t>(kBytes)});
    std::memset(back.data(), 0, kBytes);
    StateDict loaded{{"w", back}};
    LoadOptions load;
    load.checkpoint_id = dir;
    ASSERT_TRUE(Load(loaded, load).ok());
    EXPECT_EQ(std::memcmp(back.data(), final_, kBytes), 0);
  }

  void* device_ = nullptr;
  void* final_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

TEST_F(StreamOrderGpuTest, SaveCopiesAfterTheCallersStream) {
  const std::string dir = MakeTempDir("gpu_save_order");
  EnqueueStep();
  SaveOptions save;
  save.checkpoint_id = dir;
  save.device_wait = Wait();
  absl::StatusOr<Metadata> saved = Save(State(), save);
  ASSERT_TRUE(saved.ok()) << saved.status();
  ExpectCheckpointHoldsTheFinalBytes(dir);
}

TEST_F(StreamOrderGpuTest, AsyncSaveStagesAfterTheCallersStream) {
  const std::string dir = MakeTempDir("gpu_async_order");
  DefaultStager stager;  // The seed's defaults: non-blocking copies.
  EnqueueStep();
  AsyncCheckpointer checkpointer;
  AsyncSaveOptions async;
  async.save.checkpoint_id = dir;
  async.save.device_wait = Wait();
  async.async_stager = &stager;
  AsyncSaveResponse response = checkpointer.AsyncSave(State(), async);
  ASSERT_TRUE(response.staging_completion.Wait().ok());
  ASSERT_TRUE(response.upload_completion.Wait().ok());
  ExpectCheckpointHoldsTheFinalBytes(dir);
}

TEST_F(StreamOrderGpuTest, AnEventRecordedAfterTheStepOrdersTheCopies) {
  const std::string dir = MakeTempDir("gpu_event_order");
  cudaEvent_t event = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
            cudaSuccess);
  EnqueueStep();
  ASSERT_EQ(cudaEventRecord(event, stream_), cudaSuccess);
  SaveOptions save;
  save.checkpoint_id = dir;
  save.device_wait = DeviceWait::Event(0, event);
  absl::StatusOr<Metadata> saved = Save(State(), save);
  ASSERT_TRUE(saved.ok()) << saved.status();
  ExpectCheckpointHoldsTheFinalBytes(dir);
  cudaEventDestroy(event);
}

}  // namespace
}  // namespace dcp
