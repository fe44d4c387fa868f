// Real-GPU checks of the CUDA DeviceRuntime. Tagged "gpu"; every test skips
// when CudaDeviceCount() == 0, so the suite passes on machines without one.
#include <cstring>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "cuda/device_runtime.h"
#include "cuda/fp8_dequant.h"
#include "cuda/internal/scoped_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dcp {
namespace {

class CudaRuntimeGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    absl::StatusOr<std::unique_ptr<DeviceRuntime>> runtime =
        CreateDeviceRuntime(DeviceRuntimeMode::kCuda);
    ASSERT_TRUE(runtime.ok()) << runtime.status();
    runtime_ = *std::move(runtime);
  }
  std::unique_ptr<DeviceRuntime> runtime_;
};

// First in the file: no earlier test of this process has made a context on
// device 0. dcp's own threads (the upload completion thread, the stager's
// landing waiter) report device 0 as current without a context; waiting
// for, querying and freeing a device-1 stream, event, allocation or pinned
// buffer there creates none on device 0 (each would be ~0.5 GiB of device
// 0's memory in every rank of a job).
TEST_F(CudaRuntimeGpuTest, ThreadsOfDcpsCreateNoContextOnDeviceZero) {
  if (runtime_->DeviceCount() < 2) GTEST_SKIP() << "needs two devices";
  if (cuda_internal::HasActiveContext(0)) {
    GTEST_SKIP() << "device 0 has a context already";
  }
  ASSERT_TRUE(runtime_->SetCurrentDevice(1).ok());
  absl::StatusOr<DeviceStream*> stream = runtime_->CreateStream(1);
  absl::StatusOr<DeviceEvent*> event = runtime_->CreateEvent(1, false);
  absl::StatusOr<void*> dev = runtime_->AllocateDevice(1, 1 << 20);
  absl::StatusOr<void*> pinned = runtime_->AllocatePinned(1 << 20);
  ASSERT_TRUE(stream.ok() && event.ok() && dev.ok() && pinned.ok());
  ASSERT_TRUE(
      runtime_
          ->CopyAsync(*dev, *pinned, 1 << 20, CopyKind::kHostToDevice, *stream)
          .ok());
  ASSERT_TRUE(runtime_->RecordEvent(*event, *stream).ok());
  std::vector<absl::Status> results;
  std::thread dcp_thread([&] {
    absl::StatusOr<bool> done = runtime_->QueryEvent(*event);
    results.push_back(done.status());
    results.push_back(runtime_->SynchronizeEvent(*event));
    results.push_back(runtime_->SynchronizeStream(*stream));
    results.push_back(runtime_->FreeDevice(*dev));
    results.push_back(runtime_->FreePinned(*pinned));
    results.push_back(runtime_->DestroyEvent(*event));
    results.push_back(runtime_->DestroyStream(*stream));
  });
  dcp_thread.join();
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
  EXPECT_FALSE(cuda_internal::HasActiveContext(0));
}

TEST_F(CudaRuntimeGpuTest, PropertiesOfDeviceZero) {
  absl::StatusOr<DeviceProperties> props = runtime_->GetDeviceProperties(0);
  ASSERT_TRUE(props.ok()) << props.status();
  EXPECT_FALSE(props->name.empty());
  EXPECT_GT(props->total_memory, 0u);
  EXPECT_GE(props->async_engine_count, 1);
  EXPECT_EQ(
      runtime_->GetDeviceProperties(runtime_->DeviceCount()).status().code(),
      absl::StatusCode::kInvalidArgument);
}

// The stager copies neighbouring tensors of one allocation in one copy: the
// allocation's bounds must be exact, and host memory never one.
TEST_F(CudaRuntimeGpuTest, FindAllocationGivesTheBlockOfAnInteriorPointer) {
  const size_t n = (3 << 20) + 100;
  absl::StatusOr<void*> dev = runtime_->AllocateDevice(0, n);
  absl::StatusOr<void*> pinned = runtime_->AllocatePinned(4096);
  ASSERT_TRUE(dev.ok() && pinned.ok());
  const std::byte* base = static_cast<const std::byte*>(*dev);
  absl::StatusOr<DeviceAllocation> found =
      runtime_->FindAllocation(0, base + n - 1);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->base, base);
  EXPECT_GE(found->size, n);
  EXPECT_EQ(runtime_->FindAllocation(0, *pinned).status().code(),
            absl::StatusCode::kNotFound);
  std::vector<char> pageable(64);
  EXPECT_EQ(runtime_->FindAllocation(0, pageable.data()).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(runtime_->FreeDevice(*dev).ok());
  ASSERT_TRUE(runtime_->FreePinned(*pinned).ok());
}

TEST_F(CudaRuntimeGpuTest, PinnedRoundTripOnTwoStreams) {
  const size_t n = (64 << 20) + 12345;
  absl::StatusOr<void*> src = runtime_->AllocatePinned(n);
  absl::StatusOr<void*> dst = runtime_->AllocatePinned(n);
  absl::StatusOr<void*> dev = runtime_->AllocateDevice(0, n);
  ASSERT_TRUE(src.ok() && dst.ok() && dev.ok());
  auto* s = static_cast<unsigned char*>(*src);
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<unsigned char>(i * 7 + 1);
  std::memset(*dst, 0, n);
  auto up = MakeOwnedStream(*runtime_, 0);
  auto down = MakeOwnedStream(*runtime_, 0);
  auto uploaded = MakeOwnedEvent(*runtime_, 0, true);
  auto start = MakeOwnedEvent(*runtime_, 0, true);
  ASSERT_TRUE(up.ok() && down.ok() && uploaded.ok() && start.ok());
  ASSERT_TRUE(runtime_->RecordEvent(start->get(), up->get()).ok());
  ASSERT_TRUE(
      runtime_->CopyAsync(*dev, *src, n, CopyKind::kHostToDevice, up->get())
          .ok());
  ASSERT_TRUE(runtime_->RecordEvent(uploaded->get(), up->get()).ok());
  ASSERT_TRUE(runtime_->StreamWaitEvent(down->get(), uploaded->get()).ok());
  ASSERT_TRUE(
      runtime_->CopyAsync(*dst, *dev, n, CopyKind::kDeviceToHost, down->get())
          .ok());
  ASSERT_TRUE(runtime_->SynchronizeStream(down->get()).ok());
  EXPECT_EQ(std::memcmp(*src, *dst, n), 0);
  absl::StatusOr<double> ms =
      runtime_->ElapsedMillis(start->get(), uploaded->get());
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_GT(*ms, 0.0);
  EXPECT_TRUE(runtime_->FreeDevice(*dev).ok());
  EXPECT_TRUE(runtime_->FreePinned(*src).ok());
  EXPECT_TRUE(runtime_->FreePinned(*dst).ok());
}

TEST_F(CudaRuntimeGpuTest, RegisterTwiceIsAlreadyExists) {
  std::vector<unsigned char> buf(1 << 20);
  ASSERT_TRUE(runtime_->RegisterHost(buf.data(), buf.size()).ok());
  EXPECT_EQ(runtime_->RegisterHost(buf.data(), buf.size()).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(runtime_->UnregisterHost(buf.data()).ok());
  EXPECT_EQ(runtime_->UnregisterHost(buf.data()).code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CudaRuntimeGpuTest, HugeDeviceAllocationIsResourceExhausted) {
  absl::StatusOr<void*> p = runtime_->AllocateDevice(0, size_t{1} << 50);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(p.status().message(), ::testing::HasSubstr("cudaMalloc"));
}

// Copy is finished on return even from pageable memory, where cudaMemcpy
// returns once the bytes are in the driver's staging buffer: a copy on one
// of dcp's non-blocking streams right after reads them all.
TEST_F(CudaRuntimeGpuTest, CopyFromPageableMemoryHasLandedOnReturn) {
  const size_t n = (256 << 20) + 4321;
  std::vector<unsigned char> pageable(n);
  for (size_t i = 0; i < n; ++i) pageable[i] = (i * 29 + (i >> 12)) & 0xff;
  absl::StatusOr<void*> dev = runtime_->AllocateDevice(0, n);
  absl::StatusOr<void*> back = runtime_->AllocatePinned(n);
  ASSERT_TRUE(dev.ok() && back.ok());
  std::memset(*back, 0, n);
  auto stream = MakeOwnedStream(*runtime_, 0);
  ASSERT_TRUE(stream.ok()) << stream.status();
  ASSERT_TRUE(
      runtime_->Copy(*dev, pageable.data(), n, CopyKind::kHostToDevice).ok());
  ASSERT_TRUE(
      runtime_
          ->CopyAsync(*back, *dev, n, CopyKind::kDeviceToHost, stream->get())
          .ok());
  ASSERT_TRUE(runtime_->SynchronizeStream(stream->get()).ok());
  EXPECT_EQ(std::memcmp(*back, pageable.data(), n), 0);
  ASSERT_TRUE(runtime_->FreeDevice(*dev).ok());
  ASSERT_TRUE(runtime_->FreePinned(*back).ok());
}

// Registered (pinned) host memory is no device allocation either.
TEST_F(CudaRuntimeGpuTest, FindAllocationRefusesRegisteredHostMemory) {
  std::vector<char> host(1 << 20);
  ASSERT_TRUE(runtime_->RegisterHost(host.data(), host.size()).ok());
  EXPECT_EQ(runtime_->FindAllocation(0, host.data() + 100).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(runtime_->UnregisterHost(host.data()).ok());
}

// The runtime's calls give the thread its current device back.
TEST_F(CudaRuntimeGpuTest, CallsKeepTheCallersCurrentDevice) {
  if (runtime_->DeviceCount() < 2) GTEST_SKIP() << "needs two devices";
  ASSERT_TRUE(runtime_->SetCurrentDevice(0).ok());
  auto stream = MakeOwnedStream(*runtime_, 1);
  auto event = MakeOwnedEvent(*runtime_, 1, false);
  ASSERT_TRUE(stream.ok() && event.ok());
  absl::StatusOr<void*> dev = runtime_->AllocateDevice(1, 4096);
  ASSERT_TRUE(dev.ok()) << dev.status();
  std::vector<char> host(4096, 7);
  ASSERT_TRUE(runtime_
                  ->CopyAsync(*dev, host.data(), host.size(),
                              CopyKind::kHostToDevice, stream->get())
                  .ok());
  ASSERT_TRUE(runtime_->RecordEvent(event->get(), stream->get()).ok());
  ASSERT_TRUE(runtime_->FindAllocation(1, *dev).ok());
  ASSERT_TRUE(runtime_->SynchronizeStream(stream->get()).ok());
  absl::StatusOr<int> previous = runtime_->SetCurrentDevice(0);
  ASSERT_TRUE(previous.ok());
  EXPECT_EQ(*previous, 0);
  ASSERT_TRUE(runtime_->FreeDevice(*dev).ok());
}

// A failed CUDA call earlier on this thread (non-sticky) is not the
// launch's error.
TEST_F(CudaRuntimeGpuTest, DequantizeIgnoresAnEarlierUnrelatedError) {
  int not_device_memory = 0;
  EXPECT_FALSE(runtime_->FreeDevice(&not_device_memory).ok());
  void* fp8 = *runtime_->AllocateDevice(0, 16);
  void* scales = *runtime_->AllocateDevice(0, sizeof(float));
  void* out = *runtime_->AllocateDevice(0, 16 * sizeof(float));
  auto stream = MakeOwnedStream(*runtime_, 0);
  ASSERT_TRUE(stream.ok()) << stream.status();
  Fp8BlockDequantArgs args;
  args.fp8 = fp8;
  args.fp8_row_stride = 16;
  args.scales = static_cast<const float*>(scales);
  args.scale_row_stride = 1;
  args.out = out;
  args.out_row_stride = 16;
  args.rows = 1;
  args.cols = 16;
  args.block = 128;
  absl::Status launched =
      DequantizeFp8BlocksOnDevice(*runtime_, stream->get(), args);
  EXPECT_TRUE(launched.ok()) << launched;
  ASSERT_TRUE(runtime_->SynchronizeStream(stream->get()).ok());
  for (void* p : {fp8, scales, out}) ASSERT_TRUE(runtime_->FreeDevice(p).ok());
}

}  // namespace
}  // namespace dcp
