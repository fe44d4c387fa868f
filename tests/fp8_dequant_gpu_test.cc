// DequantizeFp8BlocksOnDevice (cuda/fp8_dequant.h) against the CPU path
// (core/fp8_dequant_row.h), bit for bit: all 256 fp8 bytes, a matrix whose
// edge blocks are clipped, a window that starts inside a block, each target;
// and QuantizedHuggingFaceStorageReader loading into CUDA tensors (the
// kernel path) against its load into CPU tensors. Skips when
// CudaDeviceCount() == 0 (the host runtime's twin: cuda/fp8_dequant_test.cc
// and io/hf_quantized_storage_test.cc).
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/state_dict.h"
#include "cuda/device_runtime.h"
#include "cuda/fp8_dequant.h"
#include "engine/checkpoint.h"
#include "gtest/gtest.h"
#include "io/hf_quantized_storage.h"
#include "io/quantized_dequant.h"
#include "io/safetensors.h"
#include "staging/device_staging.h"

namespace dcp {
namespace {

class Fp8DequantGpu : public ::testing::TestWithParam<DType> {};

TEST_P(Fp8DequantGpu, MatchesTheCpuPathBitForBit) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  std::unique_ptr<DeviceRuntime> cuda =
      *CreateDeviceRuntime(DeviceRuntimeMode::kCuda);
  const DType dtype = GetParam();
  const int64_t es = static_cast<int64_t>(ElementSize(dtype));
  const int64_t block = 128, rows = 300, cols = 517;  // Clipped edges.
  const Shape scale_shape = *Fp8ScaleShape({rows, cols}, block);
  std::vector<uint8_t> fp8(rows * cols);
  for (size_t i = 0; i < fp8.size(); ++i) fp8[i] = (i * 131 + i / 7) & 0xff;
  std::vector<float> scales(scale_shape[0] * scale_shape[1]);
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = 0.37f * (i + 1) - 2;
  // The window: rows [70, 290), columns [100, 517).
  const int64_t r0 = 70, c0 = 100, wr = 220, wc = cols - c0;
  std::vector<std::byte> want(wr * wc * es);
  for (int64_t r = 0; r < wr; ++r) {
    DequantizeFp8Row(fp8.data() + (r0 + r) * cols + c0, wc, c0,
                     scales.data() + ((r0 + r) / block) * scale_shape[1], block,
                     dtype, want.data() + r * wc * es);
  }
  void* d_fp8 = *cuda->AllocateDevice(0, fp8.size());
  void* d_scales = *cuda->AllocateDevice(0, scales.size() * 4);
  void* d_out = *cuda->AllocateDevice(0, want.size());
  ASSERT_TRUE(
      cuda->Copy(d_fp8, fp8.data(), fp8.size(), CopyKind::kHostToDevice).ok());
  ASSERT_TRUE(cuda->Copy(d_scales, scales.data(), scales.size() * 4,
                         CopyKind::kHostToDevice)
                  .ok());
  DeviceStream* stream = *cuda->CreateStream(0);
  Fp8BlockDequantArgs args;
  args.fp8 = static_cast<const std::byte*>(d_fp8) + r0 * cols + c0;
  args.fp8_row_stride = cols;
  args.scales = static_cast<const float*>(d_scales);
  args.scale_row_stride = scale_shape[1];
  args.out = d_out;
  args.out_row_stride = wc;
  args.target = *DequantTargetOf(dtype);
  args.rows = wr;
  args.cols = wc;
  args.row0 = r0;
  args.col0 = c0;
  args.block = block;
  ASSERT_TRUE(DequantizeFp8BlocksOnDevice(*cuda, stream, args).ok());
  ASSERT_TRUE(cuda->SynchronizeStream(stream).ok());
  std::vector<std::byte> got(want.size());
  ASSERT_TRUE(
      cuda->Copy(got.data(), d_out, got.size(), CopyKind::kDeviceToHost).ok());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size()), 0);
  ASSERT_TRUE(cuda->DestroyStream(stream).ok());
  for (void* p : {d_fp8, d_scales, d_out})
    ASSERT_TRUE(cuda->FreeDevice(p).ok());
}

// W [300, 517] and stacked experts E [4, 256, 300] in blocks of 128 (edge
// blocks clipped), written as safetensors into a fresh directory.
std::string WriteQuantizedCheckpoint() {
  const char* root = std::getenv("TEST_TMPDIR");
  std::string dir =
      absl::StrCat(root != nullptr ? root : "/tmp", "/fp8-gpu-XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) return "";
  std::vector<SafetensorsTensor> tensors;
  std::vector<std::string> data;
  for (const auto& [name, shape] : std::vector<std::pair<std::string, Shape>>{
           {"w.weight", {300, 517}}, {"experts.weight", {4, 256, 300}}}) {
    std::string fp8(NumElements(shape), '\0');
    for (size_t i = 0; i < fp8.size(); ++i) fp8[i] = (i * 131 + i / 7) & 0xff;
    const Shape scale_shape = *Fp8ScaleShape(shape, 128);
    std::vector<float> scales(NumElements(scale_shape));
    for (size_t i = 0; i < scales.size(); ++i) scales[i] = 0.37f * (i + 1) - 2;
    tensors.push_back({name, DType::kF8E4M3, shape});
    data.push_back(fp8);
    tensors.push_back({name + "_scale_inv", DType::kF32, scale_shape});
    data.emplace_back(reinterpret_cast<const char*>(scales.data()),
                      scales.size() * sizeof(float));
  }
  const absl::StatusOr<std::string> header =
      EncodeSafetensorsHeader(tensors, {{"format", "pt"}});
  if (!header.ok()) return "";
  std::ofstream out(dir + "/model.safetensors", std::ios::binary);
  out << *header;
  for (const std::string& bytes : data) out << bytes;
  return dir;
}

TEST_P(Fp8DequantGpu, ReaderLoadsIntoCudaTensorsAsIntoCpuTensors) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  std::unique_ptr<DeviceRuntime> cuda =
      *CreateDeviceRuntime(DeviceRuntimeMode::kCuda);
  const DType dtype = GetParam();
  const std::string dir = WriteQuantizedCheckpoint();
  ASSERT_FALSE(dir.empty());
  // Whole W; experts 1-3, rows 70-249, columns 100-299 (starting inside
  // blocks, ending on clipped ones).
  const Shape w_shape = {300, 517}, e_box = {3, 180, 200};
  auto load = [&](bool on_device, std::string& w, std::string& e,
                  int64_t& device_elements) {
    const int64_t es = static_cast<int64_t>(ElementSize(dtype));
    const int64_t w_bytes = NumElements(w_shape) * es;
    const int64_t e_bytes = NumElements(e_box) * es;
    w.assign(w_bytes, '\0');
    e.assign(e_bytes, '\0');
    void* w_at = w.data();
    void* e_at = e.data();
    Device device;
    if (on_device) {
      w_at = *cuda->AllocateDevice(0, w_bytes);
      e_at = *cuda->AllocateDevice(0, e_bytes);
      device = Device::Cuda(0);
    }
    StateDict state;
    state["w.weight"] = Tensor::Wrap(TensorView(w_at, dtype, w_shape, device));
    state["experts.weight"] = ShardedTensor(
        dtype, {4, 256, 300},
        {Shard{{1, 70, 100},
               Tensor::Wrap(TensorView(e_at, dtype, e_box, device))}});
    DeviceStaging staging({}, cuda.get());
    QuantizedHuggingFaceStorageReaderOptions options;
    options.target_dtype = dtype;
    options.thread_count = 4;
    options.read_window_bytes = 64 << 10;
    options.base.device_staging = &staging;
    QuantizedHuggingFaceStorageReader reader(dir, options);
    LoadOptions load_options;
    load_options.storage_reader = &reader;
    const absl::Status status = Load(state, load_options);
    ASSERT_TRUE(status.ok()) << status;
    device_elements = reader.device_dequantized_elements();
    if (!on_device) return;
    ASSERT_TRUE(
        cuda->Copy(w.data(), w_at, w_bytes, CopyKind::kDeviceToHost).ok());
    ASSERT_TRUE(
        cuda->Copy(e.data(), e_at, e_bytes, CopyKind::kDeviceToHost).ok());
    ASSERT_TRUE(cuda->FreeDevice(w_at).ok());
    ASSERT_TRUE(cuda->FreeDevice(e_at).ok());
  };
  std::string cpu_w, cpu_e, gpu_w, gpu_e;
  int64_t cpu_elements = -1, gpu_elements = -1;
  load(false, cpu_w, cpu_e, cpu_elements);
  load(true, gpu_w, gpu_e, gpu_elements);
  EXPECT_EQ(cpu_elements, 0);
  EXPECT_EQ(gpu_elements, NumElements(w_shape) + NumElements(e_box));
  EXPECT_TRUE(gpu_w == cpu_w);
  EXPECT_TRUE(gpu_e == cpu_e);
}

INSTANTIATE_TEST_SUITE_P(Targets, Fp8DequantGpu,
                         ::testing::Values(DType::kF32, DType::kBF16,
                                           DType::kF16),
                         [](const auto& info) {
                           return std::string(DTypeName(info.param));
                         });

}  // namespace
}  // namespace dcp
