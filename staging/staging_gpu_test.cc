// Staging against a real GPU: DefaultStager and StagingPipeline over the
// CUDA runtime, pinned and shared staging memory. Tagged "gpu"; every test
// skips when CudaDeviceCount() == 0.
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "core/dtype_convert.h"
#include "cuda/device_runtime.h"
#include "gtest/gtest.h"
#include "staging/device_box_upload.h"
#include "staging/device_staging.h"
#include "staging/host_buffer_pool.h"
#include "staging/stager.h"
#include "staging/staging_pipeline.h"

namespace dcp {
namespace {

class StagingGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    auto runtime = CreateDeviceRuntime(DeviceRuntimeMode::kCuda);
    ASSERT_TRUE(runtime.ok()) << runtime.status();
    runtime_ = *std::move(runtime);
  }
  void TearDown() override {
    for (void* p : device_) runtime_->FreeDevice(p).IgnoreError();
  }

  // A device tensor of `n` bytes holding Pattern(n, seed).
  Tensor DeviceBytes(size_t n, unsigned seed) {
    std::vector<unsigned char> host = Pattern(n, seed);
    absl::StatusOr<void*> p = runtime_->AllocateDevice(0, n);
    EXPECT_TRUE(p.ok()) << p.status();
    device_.push_back(*p);
    EXPECT_TRUE(
        runtime_->Copy(*p, host.data(), n, CopyKind::kHostToDevice).ok());
    return Tensor::Wrap(
        TensorView(*p, DType::kU8, {static_cast<int64_t>(n)}, Device::Cuda(0)));
  }

  static std::vector<unsigned char> Pattern(size_t n, unsigned seed) {
    std::vector<unsigned char> v(n);
    for (size_t i = 0; i < n; ++i)
      v[i] = (i * 29 + seed * 13 + (i >> 12)) & 0xff;
    return v;
  }

  static bool Equals(const Tensor& t, const std::vector<unsigned char>& v) {
    return t.nbytes() == v.size() &&
           std::memcmp(t.data(), v.data(), v.size()) == 0;
  }

  std::unique_ptr<DeviceRuntime> runtime_;
  std::vector<void*> device_;
};

// Small tensors carved out of one cudaMalloc block (512-byte rounded, as
// PyTorch's caching allocator places them) stage in shared copies on the
// seed's asynchronous, non-blocking path, and come out byte for byte, as
// do their neighbours in a second block; the same with coalescing off.
TEST_F(StagingGpuTest, NeighbouringSmallTensorsStageByteExact) {
  const size_t block = 4 << 20;
  Tensor a = DeviceBytes(block, 5);
  Tensor b = DeviceBytes(block, 6);
  const std::vector<unsigned char> pa = Pattern(block, 5);
  const std::vector<unsigned char> pb = Pattern(block, 6);
  StateDict sd;
  std::vector<std::tuple<std::string, size_t, size_t, int>> spec;
  size_t offset = 0;
  for (int i = 0; offset + 70000 < block; ++i) {
    const size_t n = i % 3 == 0 ? 4 : 1 + (i * 4099) % 65536;
    spec.emplace_back("t" + std::to_string(i), offset, n, i % 2);
    offset += (n + 511) / 512 * 512 + (i % 7 == 0 ? 70000 : 0);
  }
  for (const auto& [name, at, n, which] : spec) {
    const Tensor& base = which == 0 ? a : b;
    sd.emplace(name, Tensor::Wrap(TensorView(
                         static_cast<std::byte*>(base.data()) + at, DType::kU8,
                         {static_cast<int64_t>(n)}, Device::Cuda(0))));
  }
  for (bool coalesce : {true, false}) {
    StagingOptions options;
    options.coalesce_device_copies = coalesce;
    DefaultStager stager(options, runtime_.get());
    Future<StateDict> f = stager.Stage(sd);
    ASSERT_TRUE(f.Wait().ok()) << f.Wait().status();
    ASSERT_TRUE(stager.SynchronizeStaging().ok());
    const StateDict& staged = *f.Wait();
    for (const auto& [name, at, n, which] : spec) {
      const std::vector<unsigned char>& p = which == 0 ? pa : pb;
      const Tensor& t = staged.at(name).tensor();
      ASSERT_EQ(t.nbytes(), n) << name;
      EXPECT_EQ(std::memcmp(t.data(), p.data() + at, n), 0)
          << name << " coalesce=" << coalesce;
    }
  }
}

TEST_F(StagingGpuTest, DefaultStagerCopiesDeviceTensorsByteExact) {
  Tensor big = DeviceBytes((64 << 20) + 3, 1);
  Tensor small = DeviceBytes(5, 2);
  StagingOptions options;  // Seed defaults: pinned, shared, async.
  DefaultStager stager(options, runtime_.get());
  Future<StateDict> f = stager.Stage({{"big", big}, {"small", small}});
  ASSERT_TRUE(f.Wait().ok()) << f.Wait().status();
  ASSERT_TRUE(stager.SynchronizeStaging().ok());
  EXPECT_TRUE(Equals(f.Wait()->at("big").tensor(), Pattern((64 << 20) + 3, 1)));
  EXPECT_TRUE(Equals(f.Wait()->at("small").tensor(), Pattern(5, 2)));
  EXPECT_TRUE(f.Wait()->at("big").tensor().device().is_cpu());
}

TEST_F(StagingGpuTest, NonBlockingStagingCompletesAfterSynchronize) {
  Tensor t = DeviceBytes(32 << 20, 3);
  StagingOptions options;
  options.use_async_staging = false;
  DefaultStager stager(options, runtime_.get());
  Future<StateDict> f = stager.Stage({{"t", t}});
  ASSERT_TRUE(f.Wait().ok());
  ASSERT_TRUE(stager.SynchronizeStaging().ok());
  EXPECT_TRUE(Equals(f.Wait()->at("t").tensor(), Pattern(32 << 20, 3)));
}

TEST_F(StagingGpuTest, PipelineStreamsThroughASmallPool) {
  HostBufferPoolOptions pool_options;
  pool_options.chunk_bytes = 1 << 20;
  pool_options.total_bytes = 4 << 20;
  pool_options.use_shared_memory = true;
  auto pool = HostBufferPool::Create(runtime_.get(), pool_options);
  ASSERT_TRUE(pool.ok()) << pool.status();
  std::vector<size_t> sizes = {16 << 20, 1, (3 << 20) + 17, 0};
  std::vector<Tensor> tensors;
  std::vector<PipelineItem> items;
  for (size_t i = 0; i < sizes.size(); ++i) {
    tensors.push_back(DeviceBytes(std::max<size_t>(sizes[i], 1), i));
    TensorView v(tensors.back().data(), DType::kU8,
                 {static_cast<int64_t>(sizes[i])}, Device::Cuda(0));
    items.push_back({v, i});
  }
  std::map<uint64_t, std::vector<unsigned char>> out;
  StagingPipeline pipeline(runtime_.get(), pool->get());
  absl::Status s = pipeline.Run(items, [&](StagedPiece piece) {
    auto& o = out[piece.destination];
    const auto* b =
        reinterpret_cast<const unsigned char*>(piece.bytes().data());
    o.insert(o.end(), b, b + piece.length);
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<unsigned char> want = Pattern(std::max<size_t>(sizes[i], 1), i);
    want.resize(sizes[i]);
    EXPECT_EQ(out[i], want) << i;
  }
  EXPECT_LE((*pool)->peak_in_use(), 4);
}

// A load's conversion into a device tensor (ConvertUpload): F32 host values
// into a BF16 device tensor, contiguous and a column view (one run per row),
// through a pinned pool of two 1 MiB chunks, equal to the host conversion.
TEST_F(StagingGpuTest, ConvertUploadLandsTheHostConversion) {
  DeviceStagingOptions options;
  options.chunk_bytes = 1 << 20;
  options.pool_bytes = 2 << 20;
  DeviceStaging staging(options, runtime_.get());
  constexpr int64_t kRows = 1024, kCols = 1536;  // 3 MiB of BF16.
  std::vector<float> src(kRows * kCols);
  for (size_t i = 0; i < src.size(); ++i) {
    src[i] = static_cast<float>(i % 65521) * 0.37f - 9000.0f;
  }
  const auto* bytes = reinterpret_cast<const std::byte*>(src.data());
  std::vector<std::byte> want(src.size() * 2);
  ConvertElements(bytes, DType::kF32, kRows * kCols, want.data(), DType::kBF16);
  // Contiguous [kRows, kCols]; then a [kRows, kCols / 2] view of the same
  // allocation (row stride kCols) takes src's first kRows * kCols / 2
  // values, the other half of each row staying zero.
  void* device = *runtime_->AllocateDevice(0, want.size());
  device_.push_back(device);
  ASSERT_TRUE(ConvertUpload(staging, bytes, DType::kF32,
                            TensorView(device, DType::kBF16, {kRows, kCols},
                                       Device::Cuda(0)))
                  .ok());
  ASSERT_TRUE(staging.Flush().ok());
  std::vector<std::byte> back(want.size());
  ASSERT_TRUE(
      runtime_->Copy(back.data(), device, back.size(), CopyKind::kDeviceToHost)
          .ok());
  EXPECT_EQ(back, want);

  ASSERT_TRUE(runtime_
                  ->Copy(device, std::vector<std::byte>(back.size()).data(),
                         back.size(), CopyKind::kHostToDevice)
                  .ok());
  ASSERT_TRUE(ConvertUpload(staging, bytes, DType::kF32,
                            TensorView(device, DType::kBF16, {kRows, kCols / 2},
                                       {kCols, 1}, Device::Cuda(0)))
                  .ok());
  ASSERT_TRUE(staging.Flush().ok());
  ASSERT_TRUE(
      runtime_->Copy(back.data(), device, back.size(), CopyKind::kDeviceToHost)
          .ok());
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t c = 0; c < kCols; ++c) {
      const size_t at = static_cast<size_t>(r * kCols + c) * 2;
      const size_t from = static_cast<size_t>(r * (kCols / 2) + c) * 2;
      if (c < kCols / 2) {
        ASSERT_EQ(std::memcmp(&back[at], &want[from], 2), 0) << r << "," << c;
      } else {
        ASSERT_EQ(back[at], std::byte{0}) << r << "," << c;
      }
    }
  }
}

}  // namespace
}  // namespace dcp
