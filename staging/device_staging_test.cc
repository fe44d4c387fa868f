#include "staging/device_staging.h"

#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "cuda/host_runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dcp {
namespace {

using ::testing::HasSubstr;

constexpr size_t kChunk = 16 * 1024;

std::vector<unsigned char> Pattern(size_t bytes, unsigned seed) {
  std::vector<unsigned char> out(bytes);
  for (size_t i = 0; i < bytes; ++i) {
    out[i] = static_cast<unsigned char>((i * 131 + seed * 7) >> 2);
  }
  return out;
}

class DeviceStagingTest : public ::testing::Test {
 protected:
  DeviceStagingTest() : runtime_(CreateHostRuntime()) {
    DeviceStagingOptions options;
    options.chunk_bytes = kChunk;
    options.pool_bytes = 3 * kChunk;
    staging_ = std::make_unique<DeviceStaging>(options, runtime_.get());
  }

  // Device memory holding `bytes`.
  void* ToDevice(const std::vector<unsigned char>& bytes) {
    void* data = *runtime_->AllocateDevice(0, bytes.size());
    EXPECT_TRUE(
        runtime_
            ->Copy(data, bytes.data(), bytes.size(), CopyKind::kHostToDevice)
            .ok());
    allocations_.push_back(data);
    return data;
  }

  ~DeviceStagingTest() override {
    for (void* p : allocations_) runtime_->FreeDevice(p).IgnoreError();
  }

  std::unique_ptr<DeviceRuntime> runtime_;
  std::unique_ptr<DeviceStaging> staging_;
  std::vector<void*> allocations_;
};

TEST_F(DeviceStagingTest, PoolIsBoundedAndHasAtLeastTwoChunks) {
  absl::StatusOr<HostBufferPool*> pool = staging_->Pool();
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ((*pool)->num_chunks(), 3);
  EXPECT_EQ((*pool)->chunk_bytes(), kChunk);
  EXPECT_EQ(*staging_->Pool(), *pool);  // Created once.

  DeviceStagingOptions tiny;
  tiny.chunk_bytes = kChunk;
  tiny.pool_bytes = 1;
  DeviceStaging small(tiny, runtime_.get());
  EXPECT_EQ((*small.Pool())->num_chunks(), 2);
}

TEST_F(DeviceStagingTest, RuntimeIsTheOneGiven) {
  EXPECT_EQ(*staging_->Runtime(), runtime_.get());
}

TEST_F(DeviceStagingTest, ConcurrentStagesShareThePoolAndKeepEveryByte) {
  constexpr int kCallers = 3;
  std::vector<std::vector<unsigned char>> expected;
  std::vector<void*> sources;
  for (int c = 0; c < kCallers; ++c) {
    expected.push_back(Pattern(5 * kChunk + 123 * (c + 1), c));
    sources.push_back(ToDevice(expected.back()));
  }
  std::vector<std::vector<unsigned char>> got(kCallers);
  std::vector<absl::Status> results(kCallers);
  std::vector<std::thread> threads;
  for (int c = 0; c < kCallers; ++c) {
    threads.emplace_back([&, c] {
      std::vector<PipelineItem> items = {
          {TensorView(sources[c], DType::kU8,
                      {static_cast<int64_t>(expected[c].size())},
                      Device::Cuda(0)),
           static_cast<uint64_t>(c), "caller"}};
      results[c] = staging_->Stage(items, [&, c](StagedPiece piece) {
        if (piece.offset != got[c].size()) {
          return absl::InternalError("out of order");
        }
        const auto* p =
            reinterpret_cast<const unsigned char*>(piece.chunk.data());
        got[c].insert(got[c].end(), p, p + piece.length);
        return absl::OkStatus();
      });
    });
  }
  for (std::thread& t : threads) t.join();
  for (int c = 0; c < kCallers; ++c) {
    EXPECT_TRUE(results[c].ok()) << results[c];
    EXPECT_EQ(got[c], expected[c]) << "caller " << c;
  }
  HostBufferPool* pool = *staging_->Pool();
  EXPECT_LE(pool->peak_in_use(), 3);
  EXPECT_EQ(pool->in_use(), 0);
}

TEST_F(DeviceStagingTest, UploadsLandInDeviceMemoryAndReleaseTheirChunks) {
  const std::vector<unsigned char> expected = Pattern(4 * kChunk + 7, 5);
  void* dst = ToDevice(std::vector<unsigned char>(expected.size(), 0));
  for (size_t offset = 0; offset < expected.size(); offset += kChunk) {
    absl::StatusOr<PoolChunk> chunk = staging_->AcquireChunk();
    ASSERT_TRUE(chunk.ok()) << chunk.status();
    const size_t n = std::min(kChunk, expected.size() - offset);
    std::memcpy(chunk->data(), expected.data() + offset, n);
    const UploadRun run{0, n, static_cast<unsigned char*>(dst) + offset};
    ASSERT_TRUE(
        staging_->UploadRuns(*std::move(chunk), {&run, 1}, Device::Cuda(0))
            .ok());
  }
  ASSERT_TRUE(staging_->Flush().ok());
  std::vector<unsigned char> back(expected.size());
  ASSERT_TRUE(
      runtime_->Copy(back.data(), dst, back.size(), CopyKind::kDeviceToHost)
          .ok());
  EXPECT_EQ(back, expected);
  EXPECT_EQ((*staging_->Pool())->in_use(), 0);
}

TEST_F(DeviceStagingTest, ErrorsNameTheItem) {
  // Host memory passed as device memory: the host runtime refuses it.
  std::vector<unsigned char> host(100);
  std::vector<PipelineItem> items = {
      {TensorView(host.data(), DType::kU8, {100}, Device::Cuda(0)), 0,
       "layers.0.weight"}};
  absl::Status status =
      staging_->Stage(items, [](StagedPiece) { return absl::OkStatus(); });
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("\"layers.0.weight\""));

  std::vector<PipelineItem> unknown = {
      {TensorView(host.data(), DType::kU8, {100}, Device::Cuda(3)), 0, "x"}};
  status =
      staging_->Stage(unknown, [](StagedPiece) { return absl::OkStatus(); });
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("1 device(s)"));
}

}  // namespace
}  // namespace dcp
