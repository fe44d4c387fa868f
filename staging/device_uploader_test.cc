#include "staging/device_uploader.h"

#include <atomic>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "cuda/host_runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dcp {
namespace {

using ::testing::HasSubstr;

constexpr size_t kChunk = 16 * 1024;

std::unique_ptr<HostBufferPool> MakePool(DeviceRuntime& runtime, int chunks) {
  HostBufferPoolOptions o;
  o.chunk_bytes = kChunk;
  o.total_bytes = kChunk * chunks;
  return *HostBufferPool::Create(&runtime, o);
}

std::vector<unsigned char> Pattern(size_t n) {
  std::vector<unsigned char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = (i * 7 + (i >> 8)) & 0xff;
  return v;
}

// Reads a file-sized source through the pool into device memory, like a
// loader: acquire, fill, upload.
TEST(DeviceUploaderTest, LoadsThroughASmallPoolByteExact) {
  auto runtime = CreateHostRuntime();
  auto pool = MakePool(*runtime, 3);
  const std::vector<unsigned char> source = Pattern(kChunk * 25 + 123);
  void* dev = *runtime->AllocateDevice(0, source.size());
  std::vector<unsigned char> host_dst(1000);
  {
    DeviceUploader uploader(runtime.get(), {.num_streams = 2});
    for (size_t off = 0; off < source.size(); off += kChunk) {
      absl::StatusOr<PoolChunk> chunk = pool->Acquire();  // Bounded here.
      ASSERT_TRUE(chunk.ok());
      const size_t n = std::min(kChunk, source.size() - off);
      std::memcpy(chunk->data(), source.data() + off, n);
      ASSERT_TRUE(uploader
                      .Upload(*std::move(chunk), n,
                              static_cast<std::byte*>(dev) + off,
                              Device::Cuda(0))
                      .ok());
    }
    absl::StatusOr<PoolChunk> last = pool->Acquire();
    std::memcpy(last->data(), source.data(), host_dst.size());
    ASSERT_TRUE(uploader
                    .Upload(*std::move(last), host_dst.size(), host_dst.data(),
                            Device::Cpu())
                    .ok());
    ASSERT_TRUE(uploader.Flush().ok());
  }
  std::vector<unsigned char> back(source.size());
  ASSERT_TRUE(
      runtime->Copy(back.data(), dev, back.size(), CopyKind::kDeviceToHost)
          .ok());
  EXPECT_EQ(back, source);
  EXPECT_TRUE(std::equal(host_dst.begin(), host_dst.end(), source.begin()));
  EXPECT_LE(pool->peak_in_use(), 3);
  EXPECT_EQ(pool->in_use(), 0);
}

TEST(DeviceUploaderTest, ChunkReturnsOnlyAfterItsCopyLanded) {
  absl::Notification arrived, open;
  HostRuntimeOptions ro;
  ro.copy_observer = [&](const HostCopyTrace& t) {
    if (t.kind == CopyKind::kHostToDevice &&
        t.phase == HostCopyTrace::Phase::kStart) {
      arrived.Notify();
      open.WaitForNotification();
    }
  };
  auto runtime = CreateHostRuntime(ro);
  auto pool = MakePool(*runtime, 1);
  void* dev = *runtime->AllocateDevice(0, kChunk);
  DeviceUploader uploader(runtime.get());
  absl::StatusOr<PoolChunk> chunk = pool->Acquire();
  std::memset(chunk->data(), 0x3c, kChunk);
  ASSERT_TRUE(
      uploader.Upload(*std::move(chunk), kChunk, dev, Device::Cuda(0)).ok());
  arrived.WaitForNotification();
  // The copy is still reading the chunk: the pool must not hand it out.
  EXPECT_FALSE(pool->TryAcquire().has_value());
  open.Notify();
  ASSERT_TRUE(uploader.Flush().ok());
  EXPECT_TRUE(pool->TryAcquire().has_value());
  EXPECT_EQ(static_cast<unsigned char*>(dev)[kChunk - 1], 0x3c);
}

TEST(DeviceUploaderTest, FailedCopyIsStickyAndReleasesChunks) {
  std::atomic<int> copies{0};
  HostRuntimeOptions ro;
  ro.copy_fault = [&](const HostCopyTrace&) {
    return copies.fetch_add(1) == 1 ? absl::DataLossError("injected H2D fault")
                                    : absl::OkStatus();
  };
  auto runtime = CreateHostRuntime(ro);
  auto pool = MakePool(*runtime, 2);
  void* dev = *runtime->AllocateDevice(0, kChunk * 4);
  DeviceUploader uploader(runtime.get(), {.num_streams = 1});
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(uploader
                    .Upload(*pool->Acquire(), kChunk,
                            static_cast<std::byte*>(dev) + i * kChunk,
                            Device::Cuda(0))
                    .ok());
  }
  absl::Status flushed = uploader.Flush();
  EXPECT_EQ(flushed.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(flushed.message(), HasSubstr("injected H2D fault"));
  absl::Status after =
      uploader.Upload(*pool->Acquire(), 1, dev, Device::Cuda(0));
  EXPECT_EQ(after.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(pool->in_use(), 0);
}

TEST(DeviceUploaderTest, RejectsBadArguments) {
  auto runtime = CreateHostRuntime();
  auto pool = MakePool(*runtime, 1);
  void* dev = *runtime->AllocateDevice(0, kChunk);
  DeviceUploader uploader(runtime.get());
  absl::Status s =
      uploader.Upload(*pool->Acquire(), kChunk + 1, dev, Device::Cuda(0));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = uploader.Upload(*pool->Acquire(), 10, dev, Device::Cuda(2));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("cuda:2"));
  s = uploader.Upload(*pool->Acquire(), 10, nullptr, Device::Cuda(0));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->in_use(), 0);
  EXPECT_TRUE(uploader.Flush().ok());
}

}  // namespace
}  // namespace dcp
