// Host memory through StagingPipeline and DeviceUploader: CPU items and CPU
// destinations are copied on the host, byte exact, and never reach the
// device runtime (on CUDA a copy on device 0's streams would create a
// context on a device the job may not use).
#include <atomic>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "cuda/host_runtime.h"
#include "gtest/gtest.h"
#include "staging/device_uploader.h"
#include "staging/host_buffer_pool.h"
#include "staging/staging_pipeline.h"

namespace dcp {
namespace {

constexpr size_t kChunk = 16 * 1024;

struct CountingRuntime {
  CountingRuntime() {
    HostRuntimeOptions options;
    options.copy_observer = [this](const HostCopyTrace& trace) {
      if (trace.phase == HostCopyTrace::Phase::kStart) ++copies;
    };
    runtime = CreateHostRuntime(options);
    HostBufferPoolOptions pool_options;
    pool_options.chunk_bytes = kChunk;
    pool_options.total_bytes = 3 * kChunk;
    pool = *HostBufferPool::Create(runtime.get(), pool_options);
  }
  std::atomic<int> copies{0};
  std::unique_ptr<DeviceRuntime> runtime;
  std::unique_ptr<HostBufferPool> pool;
};

std::vector<unsigned char> Pattern(size_t n) {
  std::vector<unsigned char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = (i * 13 + (i >> 9)) & 0xff;
  return v;
}

TEST(HostItemsTest, PipelineCopiesHostItemsWithoutTheRuntime) {
  CountingRuntime f;
  const std::vector<unsigned char> host = Pattern(kChunk * 7 + 99);
  StagingPipeline pipeline(f.runtime.get(), f.pool.get());
  const std::vector<PipelineItem> items = {
      {TensorView(const_cast<unsigned char*>(host.data()), DType::kU8,
                  {static_cast<int64_t>(host.size())}, Device::Cpu()),
       4}};
  std::vector<unsigned char> got;
  absl::Status status = pipeline.Run(items, [&](StagedPiece piece) {
    EXPECT_EQ(piece.offset, got.size());
    const auto* bytes =
        reinterpret_cast<const unsigned char*>(piece.chunk.data());
    got.insert(got.end(), bytes, bytes + piece.length);
    return absl::OkStatus();
  });
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(got, host);
  EXPECT_EQ(f.copies, 0);
  EXPECT_EQ(f.pool->in_use(), 0);
}

TEST(HostItemsTest, UploaderCopiesToHostDestinationsWithoutTheRuntime) {
  CountingRuntime f;
  const std::vector<unsigned char> source = Pattern(2 * kChunk);
  std::vector<unsigned char> dst(source.size() + 10, 0);
  DeviceUploader uploader(f.runtime.get());
  absl::StatusOr<PoolChunk> first = f.pool->Acquire();
  ASSERT_TRUE(first.ok()) << first.status();
  std::memcpy(first->data(), source.data(), kChunk);
  ASSERT_TRUE(
      uploader.Upload(*std::move(first), kChunk, dst.data(), Device::Cpu())
          .ok());
  // Landed when Upload returned: the chunk is back before any Flush.
  EXPECT_EQ(f.pool->in_use(), 0);
  absl::StatusOr<PoolChunk> second = f.pool->Acquire();
  ASSERT_TRUE(second.ok()) << second.status();
  std::memcpy(second->data(), source.data() + kChunk, kChunk);
  const UploadRun runs[] = {{0, 100, dst.data() + kChunk},
                            {100, kChunk - 100, dst.data() + kChunk + 100}};
  ASSERT_TRUE(
      uploader.UploadRuns(*std::move(second), runs, Device::Cpu()).ok());
  ASSERT_TRUE(uploader.Flush().ok());
  EXPECT_TRUE(std::equal(source.begin(), source.end(), dst.begin()));
  EXPECT_EQ(dst[source.size()], 0);
  EXPECT_EQ(f.copies, 0);
  EXPECT_EQ(f.pool->in_use(), 0);
}

}  // namespace
}  // namespace dcp
