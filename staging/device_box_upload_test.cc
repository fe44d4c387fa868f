#include "staging/device_box_upload.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/box_copy.h"
#include "core/dtype_convert.h"
#include "cuda/host_runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "staging/device_staging.h"

namespace dcp {
namespace {

using ::testing::HasSubstr;

Shape RandomShape(std::mt19937& rng, int rank, int64_t max_size) {
  Shape s(rank);
  for (int64_t& v : s) v = 1 + rng() % max_size;
  return s;
}

// A random box inside `sizes`: offsets and lengths (lengths >= 1).
void RandomBox(std::mt19937& rng, const Shape& sizes, Shape& offsets,
               Shape& lengths) {
  offsets.resize(sizes.size());
  lengths.resize(sizes.size());
  for (size_t d = 0; d < sizes.size(); ++d) {
    offsets[d] = rng() % sizes[d];
    lengths[d] = 1 + rng() % (sizes[d] - offsets[d]);
  }
}

class DeviceBoxUploadTest : public ::testing::Test {
 protected:
  void MakeStaging(size_t chunk_bytes) {
    DeviceStagingOptions options;
    options.chunk_bytes = chunk_bytes;
    options.pool_bytes = 2 * chunk_bytes;
    staging_ = std::make_unique<DeviceStaging>(options, runtime_.get());
  }

  std::unique_ptr<DeviceRuntime> runtime_ = CreateHostRuntime();
  std::unique_ptr<DeviceStaging> staging_;
};

// Random N-d chunks, boxes and destinations (contiguous, or a strided view
// into a larger allocation), the chunk streamed through random windows:
// the device destination ends up exactly as a host CopyBox would make it,
// and no byte outside the box changes.
TEST_F(DeviceBoxUploadTest, RandomBoxesAndWindowsMatchTheHostCopy) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    // Chunks of 4 KiB hold few elements: most boxes span several.
    MakeStaging(4096);
    const int rank = rng() % 5;
    const size_t es = size_t{1} << (rng() % 4);
    const DType dtype = es == 1   ? DType::kU8
                        : es == 2 ? DType::kBF16
                        : es == 4 ? DType::kF32
                                  : DType::kF64;
    const Shape chunk_sizes = RandomShape(rng, rank, 12);
    Shape src_offsets, lengths;
    RandomBox(rng, chunk_sizes, src_offsets, lengths);
    // Destination: a box-sized-or-larger tensor, perhaps a view with padded
    // rows or a transposed stride order.
    Shape dst_sizes(rank), dst_offsets(rank);
    for (int d = 0; d < rank; ++d) {
      dst_sizes[d] = lengths[d] + rng() % 3;
      dst_offsets[d] = rng() % (dst_sizes[d] - lengths[d] + 1);
    }
    Shape alloc_sizes = dst_sizes;
    const bool padded = rank > 0 && rng() % 2 == 0;
    if (padded) alloc_sizes.back() += 1 + rng() % 3;
    Shape strides = ContiguousStrides(alloc_sizes);
    if (rank >= 2 && rng() % 3 == 0) {  // Dimensions 0 and 1 swapped.
      int64_t inner = 1;
      for (int d = 2; d < rank; ++d) inner *= alloc_sizes[d];
      strides[0] = inner;
      strides[1] = inner * alloc_sizes[0];
    }
    int64_t span = 1;
    for (int d = 0; d < rank; ++d) span += (alloc_sizes[d] - 1) * strides[d];
    const size_t alloc_bytes = static_cast<size_t>(span) * es * 2;

    std::vector<std::byte> src(NumElements(chunk_sizes) * es);
    for (std::byte& b : src) b = static_cast<std::byte>(rng());
    std::vector<std::byte> host_dst(alloc_bytes);
    for (std::byte& b : host_dst) b = static_cast<std::byte>(rng());
    void* device = *runtime_->AllocateDevice(0, alloc_bytes);
    ASSERT_TRUE(runtime_
                    ->Copy(device, host_dst.data(), alloc_bytes,
                           CopyKind::kHostToDevice)
                    .ok());
    const TensorView device_view(device, dtype, dst_sizes, strides,
                                 Device::Cuda(0));
    const TensorView host_view(host_dst.data(), dtype, dst_sizes, strides,
                               Device{});
    ASSERT_TRUE(CopyBox(src.data(), chunk_sizes, src_offsets, es, host_view,
                        dst_offsets, lengths)
                    .ok());

    // Stream the chunk in random windows.
    const int64_t n = NumElements(chunk_sizes);
    for (int64_t begin = 0; begin < n;) {
      const int64_t end = std::min<int64_t>(n, begin + 1 + rng() % (n / 2 + 1));
      absl::Status status = UploadBoxPart(
          *staging_, src.data() + begin * es, begin, end, chunk_sizes,
          src_offsets, es, device_view, dst_offsets, lengths);
      ASSERT_TRUE(status.ok()) << status;
      begin = end;
    }
    ASSERT_TRUE(staging_->Flush().ok());
    std::vector<std::byte> back(alloc_bytes);
    ASSERT_TRUE(
        runtime_
            ->Copy(back.data(), device, alloc_bytes, CopyKind::kDeviceToHost)
            .ok());
    ASSERT_EQ(back, host_dst)
        << "trial " << trial << " rank " << rank << " chunk "
        << ShapeToString(chunk_sizes) << " box " << ShapeToString(src_offsets)
        << "+" << ShapeToString(lengths);
    EXPECT_EQ((*staging_->Pool())->in_use(), 0);
    runtime_->FreeDevice(device).IgnoreError();
  }
}

TEST_F(DeviceBoxUploadTest, RowShardsAreOneCopyPerChunk) {
  // A [8, 1024] f32 chunk, rows 2..5 into a contiguous [4, 1024] device
  // tensor: 16 KiB of box through 4 KiB staging chunks, one contiguous run
  // (one copy) per chunk.
  std::atomic<int> copies{0};
  HostRuntimeOptions count;
  count.copy_observer = [&copies](const HostCopyTrace& trace) {
    if (trace.phase == HostCopyTrace::Phase::kStart &&
        trace.kind == CopyKind::kHostToDevice && trace.stream != nullptr) {
      ++copies;
    }
  };
  runtime_ = CreateHostRuntime(count);
  MakeStaging(4096);
  std::vector<float> src(8 * 1024);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
  void* device = *runtime_->AllocateDevice(0, 4 * 1024 * 4);
  const TensorView dst(device, DType::kF32, {4, 1024}, Device::Cuda(0));
  ASSERT_TRUE(
      UploadBoxPart(*staging_, reinterpret_cast<const std::byte*>(src.data()),
                    0, 8 * 1024, {8, 1024}, {2, 0}, 4, dst, {0, 0}, {4, 1024})
          .ok());
  ASSERT_TRUE(staging_->Flush().ok());
  EXPECT_EQ(copies.load(), 4);
  std::vector<float> back(4 * 1024);
  ASSERT_TRUE(
      runtime_
          ->Copy(back.data(), device, back.size() * 4, CopyKind::kDeviceToHost)
          .ok());
  EXPECT_TRUE(std::equal(back.begin(), back.end(), src.begin() + 2 * 1024));
  runtime_->FreeDevice(device).IgnoreError();
}

TEST_F(DeviceBoxUploadTest, RejectsHostDestinationsAndBadBoxes) {
  MakeStaging(4096);
  std::vector<float> src(16), host(16);
  const auto* window = reinterpret_cast<const std::byte*>(src.data());
  absl::Status status =
      UploadBoxPart(*staging_, window, 0, 16, {16}, {0}, 4,
                    TensorView(host.data(), DType::kF32, {16}), {0}, {16});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("CopyBoxPart"));

  void* device = *runtime_->AllocateDevice(0, 64);
  const TensorView dst(device, DType::kF32, {16}, Device::Cuda(0));
  status = UploadBoxPart(*staging_, window, 0, 16, {16}, {4}, 4, dst, {0},
                         {16});  // Leaves the chunk.
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  status = UploadBoxPart(*staging_, window, 0, 16, {16}, {0}, 2, dst, {0},
                         {16});  // Element size differs.
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  runtime_->FreeDevice(device).IgnoreError();
}

// Random shapes, convertible dtype pairs and destination layouts (padded
// rows, swapped leading dimensions): the device destination ends up exactly
// as the host conversion (ConvertInto) makes the same layout, the padding
// untouched, every chunk back in the pool.
TEST_F(DeviceBoxUploadTest, ConvertUploadMatchesTheHostConversion) {
  std::mt19937 rng(11);
  const DType kDtypes[] = {DType::kF64, DType::kF32, DType::kBF16, DType::kF16};
  for (int trial = 0; trial < 200; ++trial) {
    MakeStaging(4096);
    const DType from = kDtypes[rng() % 4];
    const DType to = kDtypes[rng() % 4];
    const size_t in = ElementSize(from), out = ElementSize(to);
    const int rank = rng() % 4;
    const Shape sizes = RandomShape(rng, rank, 40);
    Shape alloc_sizes = sizes;
    if (rank > 0 && rng() % 2 == 0) alloc_sizes.back() += 1 + rng() % 3;
    Shape strides = ContiguousStrides(alloc_sizes);
    if (rank >= 2 && rng() % 3 == 0) {
      int64_t inner = 1;
      for (int d = 2; d < rank; ++d) inner *= alloc_sizes[d];
      strides[0] = inner;
      strides[1] = inner * alloc_sizes[0];
    }
    // The whole allocation: padding and the swapped layout's span.
    const int64_t span = NumElements(alloc_sizes);
    const size_t alloc_bytes = static_cast<size_t>(span) * out;

    // Finite values of every magnitude, stored as `from`.
    const int64_t n = NumElements(sizes);
    std::vector<double> values(n);
    std::uniform_real_distribution<double> unit(-1.0, 1.0);
    for (double& v : values) v = unit(rng) * std::ldexp(1.0, rng() % 20 - 10);
    std::vector<std::byte> src(n * in);
    ConvertElements(reinterpret_cast<const std::byte*>(values.data()),
                    DType::kF64, n, src.data(), from);

    std::vector<std::byte> host_dst(alloc_bytes);
    for (std::byte& b : host_dst) b = static_cast<std::byte>(rng());
    void* device = *runtime_->AllocateDevice(0, alloc_bytes);
    ASSERT_TRUE(runtime_
                    ->Copy(device, host_dst.data(), alloc_bytes,
                           CopyKind::kHostToDevice)
                    .ok());
    ASSERT_TRUE(
        ConvertInto(src.data(), from,
                    TensorView(host_dst.data(), to, sizes, strides, Device{}))
            .ok());
    absl::Status status =
        ConvertUpload(*staging_, src.data(), from,
                      TensorView(device, to, sizes, strides, Device::Cuda(0)));
    ASSERT_TRUE(status.ok()) << status;
    ASSERT_TRUE(staging_->Flush().ok());
    std::vector<std::byte> back(alloc_bytes);
    ASSERT_TRUE(
        runtime_
            ->Copy(back.data(), device, alloc_bytes, CopyKind::kDeviceToHost)
            .ok());
    ASSERT_EQ(back, host_dst)
        << "trial " << trial << " " << DTypeName(from) << " -> "
        << DTypeName(to) << " " << ShapeToString(sizes) << " strides "
        << ShapeToString(strides);
    EXPECT_EQ((*staging_->Pool())->in_use(), 0);
    runtime_->FreeDevice(device).IgnoreError();
  }
}

TEST_F(DeviceBoxUploadTest,
       ConvertUploadRejectsHostDestinationsAndOtherDtypes) {
  MakeStaging(4096);
  std::vector<float> src(16), host(16);
  const auto* bytes = reinterpret_cast<const std::byte*>(src.data());
  absl::Status status =
      ConvertUpload(*staging_, bytes, DType::kF32,
                    TensorView(host.data(), DType::kBF16, {16}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("ConvertInto"));
  void* device = *runtime_->AllocateDevice(0, 64);
  status =
      ConvertUpload(*staging_, bytes, DType::kF32,
                    TensorView(device, DType::kI32, {16}, Device::Cuda(0)));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("only F64, F32, BF16 and F16"));
  runtime_->FreeDevice(device).IgnoreError();
}

}  // namespace
}  // namespace dcp
