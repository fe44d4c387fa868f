// QuantizedHuggingFaceStorageReader against hand-computed values: fp8 bytes
// whose values are known exactly, scales chosen so every product is exact in
// bf16 and f16, loaded whole, as resharded slices, in one-row windows, into
// device tensors (host runtime), and malformed checkpoints.
#include "io/hf_quantized_storage.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/state_dict.h"
#include "cuda/host_runtime.h"
#include "engine/checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/quantized_dequant.h"
#include "io/safetensors.h"
#include "staging/device_staging.h"

namespace dcp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

#define ASSERT_LOADS(expr)          \
  do {                              \
    const absl::Status s_ = (expr); \
    ASSERT_TRUE(s_.ok()) << s_;     \
  } while (false)

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  std::string bytes;
};

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()),
                     values.size() * sizeof(T));
}

std::string TempDir(const std::string& tag) {
  const char* root = std::getenv("TEST_TMPDIR");
  std::string dir =
      absl::StrCat(root != nullptr ? root : "/tmp", "/", tag, "-XXXXXX");
  return mkdtemp(dir.data());
}

void WriteSafetensors(const std::string& path,
                      const std::vector<Entry>& entries) {
  std::vector<SafetensorsTensor> tensors;
  for (const Entry& e : entries) tensors.push_back({e.name, e.dtype, e.shape});
  absl::StatusOr<std::string> header =
      EncodeSafetensorsHeader(tensors, {{"format", "pt"}});
  ASSERT_TRUE(header.ok()) << header.status();
  std::ofstream out(path, std::ios::binary);
  out << *header;
  for (const SafetensorsTensor& t : tensors) {
    for (const Entry& e : entries) {
      if (e.name == t.name) out << e.bytes;
    }
  }
}

// W [3, 5] in blocks of 2: scale [2, 3].
const std::vector<uint8_t> kW = {0x38, 0x40, 0x3c, 0xb8, 0x30,   //
                                 0x00, 0x01, 0x7e, 0x44, 0x48,   //
                                 0xc0, 0x34, 0x38, 0x38, 0x38};  //
const std::vector<float> kWScale = {2, 0.5f, 10, -1, 4, 0.25f};
// float(W) * scale, by hand: 1*2, 2*2, 1.5*.5, -1*.5, .5*10 / 0*2, 2^-9*2,
// 448*.5, 3*.5, 4*10 / -2*-1, .75*-1, 1*4, 1*4, 1*.25.
const std::vector<float> kWValue = {2, 4,           0.75f, -0.5f, 5,   //
                                    0, 0.00390625f, 224,   1.5f,  40,  //
                                    2, -0.75f,      4,     4,     0.25f};

// E [2, 3, 5]: expert 0 is W, expert 1 is W with every scale doubled.
std::vector<uint8_t> ExpertBytes() {
  std::vector<uint8_t> e = kW;
  e.insert(e.end(), kW.begin(), kW.end());
  return e;
}
std::vector<float> ExpertScales() {
  std::vector<float> s = kWScale;
  for (float v : kWScale) s.push_back(2 * v);
  return s;
}
std::vector<float> ExpertValues() {
  std::vector<float> v = kWValue;
  for (float x : kWValue) v.push_back(2 * x);
  return v;
}

// A checkpoint with W, E (and their scales) and a plain F32 bias.
std::string QuantizedCheckpoint() {
  const std::string dir = TempDir("quantized");
  WriteSafetensors(
      dir + "/model.safetensors",
      {{"w.weight", DType::kF8E4M3, {3, 5}, Bytes(kW)},
       {"w.weight_scale_inv", DType::kF32, {2, 3}, Bytes(kWScale)},
       {"experts.weight", DType::kF8E4M3, {2, 3, 5}, Bytes(ExpertBytes())},
       {"experts.weight_scale_inv",
        DType::kF32,
        {2, 2, 3},
        Bytes(ExpertScales())},
       {"bias", DType::kF32, {3}, Bytes(std::vector<float>{1, 2, 3})}});
  return dir;
}

// `values` as `dtype` bits.
std::string Expected(const std::vector<float>& values, DType dtype) {
  std::string out;
  for (float v : values) {
    if (dtype == DType::kF32) {
      out.append(reinterpret_cast<const char*>(&v), 4);
    } else {
      const uint16_t bits =
          dtype == DType::kBF16 ? FloatToBf16(v) : FloatToF16(v);
      out.append(reinterpret_cast<const char*>(&bits), 2);
    }
  }
  return out;
}

std::string BytesOf(const Tensor& t) {
  return std::string(static_cast<const char*>(t.data()), t.nbytes());
}

absl::Status LoadQuantized(const std::string& dir, StateDict& state,
                           QuantizedHuggingFaceStorageReaderOptions options,
                           QuantizedHuggingFaceStorageReader** out = nullptr) {
  static QuantizedHuggingFaceStorageReader* last = nullptr;
  delete last;
  last = new QuantizedHuggingFaceStorageReader(dir, options);
  if (out != nullptr) *out = last;
  LoadOptions load;
  load.storage_reader = last;
  return Load(state, load);
}

TEST(Fp8Dequant, TableHoldsE4M3FnValues) {
  const float* t = Fp8E4M3Table();
  EXPECT_EQ(t[0x00], 0.0f);
  EXPECT_TRUE(std::signbit(t[0x80]));
  EXPECT_EQ(t[0x38], 1.0f);
  EXPECT_EQ(t[0x3c], 1.5f);
  EXPECT_EQ(t[0xb8], -1.0f);
  EXPECT_EQ(t[0x01], std::ldexp(1.0f, -9));  // Smallest subnormal.
  EXPECT_EQ(t[0x07], 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(t[0x08], std::ldexp(1.0f, -6));  // Smallest normal.
  EXPECT_EQ(t[0x7e], 448.0f);
  EXPECT_EQ(t[0xfe], -448.0f);
  EXPECT_TRUE(std::isnan(t[0x7f]));
  EXPECT_TRUE(std::isnan(t[0xff]));
}

TEST(Fp8Dequant, ConversionsRoundToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);  // Tie: even.
  EXPECT_EQ(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(FloatToBf16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToF16(1.0f), 0x3c00);
  EXPECT_EQ(FloatToF16(448.0f), 0x5f00);
  EXPECT_EQ(FloatToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // Tie: even.
  EXPECT_EQ(Fp8ScaleShape({3, 5}, 2).value(), (Shape{2, 3}));
  EXPECT_EQ(Fp8ScaleShape({4, 256, 300}, 128).value(), (Shape{4, 2, 3}));
  EXPECT_EQ(Fp8ScaleShape({300}, 128).value(), (Shape{3}));
  EXPECT_FALSE(Fp8ScaleShape({}, 128).ok());
}

TEST(Fp8Dequant, RowStartingInsideABlock) {
  // Columns 3..7 of a row with blocks of 4: scales 2 (col 3), 3 (cols 4-7).
  const std::vector<uint8_t> in = {0x38, 0x38, 0x40, 0x40, 0x3c};
  const std::vector<float> scales = {2, 3};
  std::vector<float> out(5);
  DequantizeFp8Row(in.data(), 5, 3, scales.data(), 4, DType::kF32, out.data());
  EXPECT_EQ(out, (std::vector<float>{2, 3, 6, 6, 4.5f}));
}

class QuantizedLoad : public ::testing::TestWithParam<DType> {};

TEST_P(QuantizedLoad, WholeTensorsMatchHandComputedValues) {
  const DType target = GetParam();
  const std::string dir = QuantizedCheckpoint();
  StateDict state;
  state["w.weight"] = Tensor::Empty(target, {3, 5});
  state["experts.weight"] = Tensor::Empty(target, {2, 3, 5});
  state["bias"] = Tensor::Empty(DType::kF32, {3});
  QuantizedHuggingFaceStorageReaderOptions options;
  options.target_dtype = target;
  options.block_size = 2;
  QuantizedHuggingFaceStorageReader* reader = nullptr;
  ASSERT_LOADS(LoadQuantized(dir, state, options, &reader));
  EXPECT_EQ(BytesOf(state["w.weight"].tensor()), Expected(kWValue, target));
  EXPECT_EQ(BytesOf(state["experts.weight"].tensor()),
            Expected(ExpertValues(), target));
  EXPECT_EQ(BytesOf(state["bias"].tensor()),
            Bytes(std::vector<float>{1, 2, 3}));
  EXPECT_EQ(reader->quantized_bytes_read(), 15 + 30);
  EXPECT_EQ(reader->scale_tensors_read(), 2);
}

TEST_P(QuantizedLoad, MetadataGivesTheTargetDtype) {
  const std::string dir = QuantizedCheckpoint();
  QuantizedHuggingFaceStorageReaderOptions options;
  options.target_dtype = GetParam();
  options.block_size = 2;
  QuantizedHuggingFaceStorageReader reader(dir, options);
  absl::StatusOr<Metadata> metadata = reader.ReadMetadata();
  ASSERT_TRUE(metadata.ok()) << metadata.status();
  auto dtype = [&](const std::string& name) {
    return std::get<TensorStorageMetadata>(
               metadata->state_dict_metadata.at(name))
        .properties.dtype;
  };
  EXPECT_EQ(dtype("w.weight"), GetParam());
  EXPECT_EQ(dtype("experts.weight"), GetParam());
  EXPECT_EQ(dtype("w.weight_scale_inv"), DType::kF32);
  EXPECT_EQ(dtype("bias"), DType::kF32);
}

TEST_P(QuantizedLoad, ReshardedSlicesReadOnlyTheirBytes) {
  const DType target = GetParam();
  const std::string dir = QuantizedCheckpoint();
  QuantizedHuggingFaceStorageReaderOptions options;
  options.target_dtype = target;
  options.block_size = 2;
  // Rows 1-2, columns 2-4 of W: two row segments 8 bytes apart.
  StateDict slice;
  slice["w.weight"] = ShardedTensor(
      target, {3, 5}, {Shard{{1, 2}, Tensor::Empty(target, {2, 3})}});
  QuantizedHuggingFaceStorageReader* reader = nullptr;
  ASSERT_LOADS(LoadQuantized(dir, slice, options, &reader));
  EXPECT_EQ(
      BytesOf(slice["w.weight"].sharded_tensor().local_shards()[0].tensor),
      Expected({224, 1.5f, 40, 4, 4, 0.25f}, target));
  EXPECT_EQ(reader->quantized_bytes_read(), 5 + 3);
  EXPECT_EQ(reader->scale_tensors_read(), 1);

  // Expert 1, rows 1-2: 10 bytes, scaled by expert 1's scales only.
  StateDict expert;
  expert["experts.weight"] = ShardedTensor(
      target, {2, 3, 5}, {Shard{{1, 1, 0}, Tensor::Empty(target, {1, 2, 5})}});
  ASSERT_LOADS(LoadQuantized(dir, expert, options, &reader));
  const std::vector<float> all = ExpertValues();
  const std::vector<float> want(all.begin() + 20, all.end());
  EXPECT_EQ(
      BytesOf(
          expert["experts.weight"].sharded_tensor().local_shards()[0].tensor),
      Expected(want, target));
  EXPECT_EQ(reader->quantized_bytes_read(), 10);
}

TEST_P(QuantizedLoad, OneRowWindowsReadEachScaleOnce) {
  const DType target = GetParam();
  const std::string dir = QuantizedCheckpoint();
  QuantizedHuggingFaceStorageReaderOptions options;
  options.target_dtype = target;
  options.block_size = 2;
  options.read_window_bytes = 1;  // One unit per row: 3 + 6 units.
  options.thread_count = 3;
  StateDict state;
  state["w.weight"] = Tensor::Empty(target, {3, 5});
  state["experts.weight"] = Tensor::Empty(target, {2, 3, 5});
  QuantizedHuggingFaceStorageReader* reader = nullptr;
  ASSERT_LOADS(LoadQuantized(dir, state, options, &reader));
  EXPECT_EQ(BytesOf(state["w.weight"].tensor()), Expected(kWValue, target));
  EXPECT_EQ(BytesOf(state["experts.weight"].tensor()),
            Expected(ExpertValues(), target));
  EXPECT_EQ(reader->scale_tensors_read(), 2);
}

// Host-to-device copies of a host runtime, in bytes.
struct CountedHostRuntime {
  explicit CountedHostRuntime(size_t device_memory_limit = 0) {
    HostRuntimeOptions options;
    options.copy_observer = [this](const HostCopyTrace& trace) {
      if (trace.phase == HostCopyTrace::Phase::kStart &&
          trace.kind == CopyKind::kHostToDevice) {
        h2d_bytes += static_cast<int64_t>(trace.bytes);
      }
    };
    options.device_memory_limit = device_memory_limit;
    runtime = CreateHostRuntime(options);
  }
  std::atomic<int64_t> h2d_bytes{0};
  std::unique_ptr<DeviceRuntime> runtime;
};

TEST_P(QuantizedLoad, DeviceDestinationsAreDequantizedByTheDevice) {
  const DType target = GetParam();
  const std::string dir = QuantizedCheckpoint();
  CountedHostRuntime host;
  DeviceStagingOptions staging_options;
  staging_options.chunk_bytes = 64;
  staging_options.pool_bytes = 128;
  DeviceStaging staging(staging_options, host.runtime.get());
  const size_t bytes = 30 * ElementSize(target);
  void* data = *host.runtime->AllocateDevice(0, bytes);
  StateDict state;
  state["experts.weight"] =
      Tensor::Wrap(TensorView(data, target, {2, 3, 5}, Device::Cuda(0)));
  QuantizedHuggingFaceStorageReaderOptions options;
  options.target_dtype = target;
  options.block_size = 2;
  options.read_window_bytes = 5;
  options.base.device_staging = &staging;
  QuantizedHuggingFaceStorageReader* reader = nullptr;
  ASSERT_LOADS(LoadQuantized(dir, state, options, &reader));
  std::string got(bytes, '\0');
  ASSERT_TRUE(
      host.runtime->Copy(got.data(), data, bytes, CopyKind::kDeviceToHost)
          .ok());
  EXPECT_EQ(got, Expected(ExpertValues(), target));
  // Only the fp8 bytes and the scales, once, went to the device.
  EXPECT_EQ(reader->device_dequantized_elements(), 30);
  EXPECT_EQ(reader->uploaded_dequantized_elements(), 0);
  EXPECT_EQ(host.h2d_bytes, 30 + 12 * 4);
  ASSERT_TRUE(host.runtime->FreeDevice(data).ok());
}

INSTANTIATE_TEST_SUITE_P(Targets, QuantizedLoad,
                         ::testing::Values(DType::kF32, DType::kBF16,
                                           DType::kF16),
                         [](const auto& info) {
                           return std::string(DTypeName(info.param));
                         });

// A checkpoint whose block edges fall inside the tensors, in blocks of 16:
// W [37, 300], a stacked expert tensor E [3, 20, 45] and a 1-D V [50], fp8
// bytes covering every value (NaNs included), scales that make the target's
// rounding matter.
struct Quantized {
  std::string name;
  Shape shape;
};
const std::vector<Quantized> kBlocked = {{"w.weight", {37, 300}},
                                         {"experts.weight", {3, 20, 45}},
                                         {"v.weight", {50}}};
constexpr int64_t kBlock = 16;

std::string BlockedCheckpoint() {
  const std::string dir = TempDir("blocked");
  std::vector<Entry> entries;
  int salt = 0;
  for (const Quantized& q : kBlocked) {
    std::vector<uint8_t> fp8(NumElements(q.shape));
    for (size_t i = 0; i < fp8.size(); ++i) {
      fp8[i] = static_cast<uint8_t>(i * 131 + i / 7 + salt);
    }
    const Shape scale_shape = *Fp8ScaleShape(q.shape, kBlock);
    std::vector<float> scales(NumElements(scale_shape));
    for (size_t i = 0; i < scales.size(); ++i) {
      scales[i] = 0.37f * (i + 1) - 2 + 0.01f * salt;
    }
    entries.push_back({q.name, DType::kF8E4M3, q.shape, Bytes(fp8)});
    entries.push_back(
        {q.name + "_scale_inv", DType::kF32, scale_shape, Bytes(scales)});
    salt += 3;
  }
  WriteSafetensors(dir + "/model.safetensors", entries);
  return dir;
}

// One box of each kBlocked tensor: offsets and sizes (empty: whole).
struct Box {
  Shape offsets;
  Shape sizes;
};
const std::vector<Box> kWhole = {{}, {}, {}};
// Starting and ending inside blocks; E's ends on its clipped edge blocks.
const std::vector<Box> kSlices = {
    {{5, 7}, {25, 243}}, {{1, 3, 10}, {2, 14, 35}}, {{9}, {30}}};

struct BoxLoad {
  std::vector<std::string> bytes;  // Per kBlocked tensor, as loaded.
  int64_t quantized_bytes_read = 0;
  int64_t device_elements = 0;
  int64_t uploaded_elements = 0;
};

// Loads `boxes` into CPU tensors (runtime null) or into device tensors of
// `runtime` (through `staging`); `transposed` gives W's box column-major
// strides.
BoxLoad LoadBoxes(const std::string& dir, DType target,
                  const std::vector<Box>& boxes, DeviceRuntime* runtime,
                  DeviceStaging* staging, bool transposed = false) {
  const int64_t es = static_cast<int64_t>(ElementSize(target));
  StateDict state;
  std::vector<void*> data;
  std::vector<int64_t> sizes;
  std::vector<std::string> host_buffers(kBlocked.size());
  for (size_t i = 0; i < kBlocked.size(); ++i) {
    const Quantized& q = kBlocked[i];
    const Shape box = boxes[i].sizes.empty() ? q.shape : boxes[i].sizes;
    const int64_t bytes = NumElements(box) * es;
    void* at;
    if (runtime != nullptr) {
      at = *runtime->AllocateDevice(0, bytes);
    } else {
      host_buffers[i].resize(bytes);
      at = host_buffers[i].data();
    }
    Shape strides = ContiguousStrides(box);
    if (transposed && i == 0) strides = {1, box[0]};
    const Device device = runtime != nullptr ? Device::Cuda(0) : Device{};
    Tensor tensor = Tensor::Wrap(TensorView(at, target, box, strides, device));
    if (boxes[i].sizes.empty()) {
      state[q.name] = tensor;
    } else {
      state[q.name] =
          ShardedTensor(target, q.shape, {Shard{boxes[i].offsets, tensor}});
    }
    data.push_back(at);
    sizes.push_back(bytes);
  }
  QuantizedHuggingFaceStorageReaderOptions options;
  options.target_dtype = target;
  options.block_size = kBlock;
  options.read_window_bytes = 700;  // Two or three rows per window.
  options.thread_count = 2;
  options.base.device_staging = staging;
  QuantizedHuggingFaceStorageReader* reader = nullptr;
  BoxLoad load;
  const absl::Status status = LoadQuantized(dir, state, options, &reader);
  EXPECT_TRUE(status.ok()) << status;
  load.quantized_bytes_read = reader->quantized_bytes_read();
  load.device_elements = reader->device_dequantized_elements();
  load.uploaded_elements = reader->uploaded_dequantized_elements();
  for (size_t i = 0; i < data.size(); ++i) {
    if (runtime == nullptr) {
      load.bytes.push_back(host_buffers[i]);
      continue;
    }
    std::string bytes(sizes[i], '\0');
    EXPECT_TRUE(
        runtime->Copy(bytes.data(), data[i], sizes[i], CopyKind::kDeviceToHost)
            .ok());
    EXPECT_TRUE(runtime->FreeDevice(data[i]).ok());
    load.bytes.push_back(std::move(bytes));
  }
  return load;
}

int64_t BoxElements(const std::vector<Box>& boxes) {
  int64_t n = 0;
  for (size_t i = 0; i < boxes.size(); ++i) {
    n += NumElements(boxes[i].sizes.empty() ? kBlocked[i].shape
                                            : boxes[i].sizes);
  }
  return n;
}

// Floats of every kBlocked scale.
int64_t ScaleFloats() {
  int64_t n = 0;
  for (const Quantized& q : kBlocked) {
    n += NumElements(*Fp8ScaleShape(q.shape, kBlock));
  }
  return n;
}

class QuantizedDeviceLoad : public ::testing::TestWithParam<DType> {};

TEST_P(QuantizedDeviceLoad, EqualsTheCpuLoadBitForBit) {
  const DType target = GetParam();
  const std::string dir = BlockedCheckpoint();
  for (const std::vector<Box>* boxes : {&kWhole, &kSlices}) {
    SCOPED_TRACE(boxes == &kWhole ? "whole" : "slices");
    const BoxLoad cpu = LoadBoxes(dir, target, *boxes, nullptr, nullptr);
    CountedHostRuntime host;
    DeviceStaging staging({}, host.runtime.get());
    const BoxLoad device =
        LoadBoxes(dir, target, *boxes, host.runtime.get(), &staging);
    ASSERT_EQ(device.bytes.size(), kBlocked.size());
    for (size_t i = 0; i < kBlocked.size(); ++i) {
      EXPECT_TRUE(device.bytes[i] == cpu.bytes[i]) << kBlocked[i].name;
    }
    // Every element by the device; to it went the fp8 bytes read and each
    // scale once, never dequantized values.
    EXPECT_EQ(device.device_elements, BoxElements(*boxes));
    EXPECT_EQ(device.uploaded_elements, 0);
    EXPECT_EQ(device.quantized_bytes_read, cpu.quantized_bytes_read);
    EXPECT_EQ(host.h2d_bytes, device.quantized_bytes_read + 4 * ScaleFloats());
  }
}

TEST_P(QuantizedDeviceLoad, StridedColumnsAreDequantizedOnTheCpu) {
  const DType target = GetParam();
  const std::string dir = BlockedCheckpoint();
  const BoxLoad cpu = LoadBoxes(dir, target, kSlices, nullptr, nullptr,
                                /*transposed=*/true);
  CountedHostRuntime host;
  DeviceStaging staging({}, host.runtime.get());
  const BoxLoad device = LoadBoxes(dir, target, kSlices, host.runtime.get(),
                                   &staging, /*transposed=*/true);
  for (size_t i = 0; i < kBlocked.size(); ++i) {
    EXPECT_TRUE(device.bytes[i] == cpu.bytes[i]) << kBlocked[i].name;
  }
  EXPECT_EQ(device.uploaded_elements, 25 * 243);
  EXPECT_EQ(device.device_elements, BoxElements(kSlices) - 25 * 243);
}

TEST_P(QuantizedDeviceLoad, WithoutDeviceMemoryForScalesTheCpuDequantizes) {
  const DType target = GetParam();
  const std::string dir = BlockedCheckpoint();
  const BoxLoad cpu = LoadBoxes(dir, target, kWhole, nullptr, nullptr);
  // Room for the destinations only (each rounded up to a page).
  int64_t limit = 0;
  for (const Quantized& q : kBlocked) {
    const int64_t bytes = NumElements(q.shape) * ElementSize(target);
    limit += (bytes + 4095) / 4096 * 4096;
  }
  CountedHostRuntime host(limit);
  DeviceStaging staging({}, host.runtime.get());
  const BoxLoad device =
      LoadBoxes(dir, target, kWhole, host.runtime.get(), &staging);
  for (size_t i = 0; i < kBlocked.size(); ++i) {
    EXPECT_TRUE(device.bytes[i] == cpu.bytes[i]) << kBlocked[i].name;
  }
  EXPECT_EQ(device.device_elements, 0);
  EXPECT_EQ(device.uploaded_elements, BoxElements(kWhole));
}

INSTANTIATE_TEST_SUITE_P(Targets, QuantizedDeviceLoad,
                         ::testing::Values(DType::kF32, DType::kBF16,
                                           DType::kF16),
                         [](const auto& info) {
                           return std::string(DTypeName(info.param));
                         });

absl::Status MetadataError(const std::vector<Entry>& entries,
                           std::string& dir) {
  dir = TempDir("bad");
  WriteSafetensors(dir + "/model.safetensors", entries);
  QuantizedHuggingFaceStorageReaderOptions options;
  options.block_size = 2;
  options.target_dtype = DType::kBF16;
  QuantizedHuggingFaceStorageReader reader(dir, options);
  return reader.ReadMetadata().status();
}

void WriteConfig(const std::string& dir, const std::string& text) {
  std::ofstream(dir + "/config.json") << text;
}

// block_size 0 takes the tile edge from config.json, as transformers'
// FP8 models and DeepSeek-V3 record it, else 128.
TEST(QuantizedConfig, BlockSizeComesFromConfigJson) {
  const std::string dir = QuantizedCheckpoint();  // 2x2 tiles.
  WriteConfig(dir, R"({"model_type": "deepseek_v3", "quantization_config":
                       {"quant_method": "fp8", "fmt": "e4m3",
                        "weight_block_size": [2, 2]}})");
  StateDict state;
  state["w.weight"] = Tensor::Empty(DType::kF32, {3, 5});
  QuantizedHuggingFaceStorageReaderOptions options;  // block_size 0.
  ASSERT_LOADS(LoadQuantized(dir, state, options));
  EXPECT_EQ(BytesOf(state["w.weight"].tensor()),
            Expected(kWValue, DType::kF32));
  EXPECT_EQ(ConfiguredFp8BlockSize(LocalFileSystem(), dir).value(), 2);

  // No config.json: 128, which these scales do not fit.
  std::filesystem::remove(dir + "/config.json");
  EXPECT_EQ(ConfiguredFp8BlockSize(LocalFileSystem(), dir).value(),
            std::nullopt);
  QuantizedHuggingFaceStorageReader reader(dir, options);
  absl::Status status = reader.ReadMetadata().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("in 128x128 blocks"));
  // An explicit block_size wins over config.json.
  WriteConfig(dir, R"({"quantization_config": {"weight_block_size": [4, 4]}})");
  options.block_size = 2;
  ASSERT_LOADS(LoadQuantized(dir, state, options));
  // A config.json without a block size: the default.
  WriteConfig(dir, R"({"quantization_config": {"quant_method": "fp8"}})");
  EXPECT_EQ(ConfiguredFp8BlockSize(LocalFileSystem(), dir).value(),
            std::nullopt);
}

TEST(QuantizedConfig, MalformedBlockSizesNameTheFile) {
  const std::string dir = QuantizedCheckpoint();
  const std::string path = dir + "/config.json";
  struct Case {
    std::string text;
    absl::StatusCode code;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {"{not json", absl::StatusCode::kDataLoss, "is not valid JSON"},
           {R"({"quantization_config": {"weight_block_size": [128]}})",
            absl::StatusCode::kDataLoss, "[128], not two positive integers"},
           {R"({"quantization_config": {"weight_block_size": [0, 0]}})",
            absl::StatusCode::kDataLoss, "not two positive integers"},
           {R"({"quantization_config": {"weight_block_size": "128"}})",
            absl::StatusCode::kDataLoss, "not two positive integers"},
           {R"({"quantization_config": {"weight_block_size": [128, 64]}})",
            absl::StatusCode::kUnimplemented, "square blocks only"}}) {
    WriteConfig(dir, c.text);
    QuantizedHuggingFaceStorageReader reader(dir, {});
    absl::Status status = reader.ReadMetadata().status();
    EXPECT_EQ(status.code(), c.code) << c.text;
    EXPECT_THAT(status.message(), AllOf(HasSubstr(path), HasSubstr(c.says)))
        << c.text;
  }
}

// Messages used to dump() the block size, which recursed once per level of
// it: kDeep levels overflowed the stack (50000 did under the sanitizers,
// 100000 in -c opt). Nesting is capped while parsing.
TEST(QuantizedConfig, DeeplyNestedConfigIsDataLossNamingTheFile) {
  constexpr int kDeep = 200000;
  const std::string dir = QuantizedCheckpoint();
  WriteConfig(dir, R"({"quantization_config": {"weight_block_size": [)" +
                       std::string(kDeep, '[') + std::string(kDeep, ']') +
                       "]}}");
  absl::Status status = ConfiguredFp8BlockSize(LocalFileSystem(), dir).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), AllOf(HasSubstr(dir + "/config.json"),
                                      HasSubstr("more than 64 levels deep")));
}

// A block edge near 2^63 overflowed ceil(dim / block); config.json's is
// capped at 2^20.
TEST(QuantizedConfig, HugeBlockSizeIsDataLossNamingTheFile) {
  const std::string dir = QuantizedCheckpoint();
  WriteConfig(dir, R"({"quantization_config": {"weight_block_size":
                       [9223372036854775807, 9223372036854775807]}})");
  absl::Status status = ConfiguredFp8BlockSize(LocalFileSystem(), dir).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr(dir + "/config.json"),
                    HasSubstr("larger than the largest block edge read "
                              "(1048576)")));
  WriteConfig(dir, R"({"quantization_config": {"weight_block_size":
                       [1048576, 1048576]}})");
  EXPECT_EQ(ConfiguredFp8BlockSize(LocalFileSystem(), dir).value(), 1048576);
}

TEST(Fp8Dequant, ScaleShapeOfDimensionsNearTwoToThe63) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  absl::StatusOr<Shape> scale = Fp8ScaleShape({kMax, kMax - 1}, 128);
  ASSERT_TRUE(scale.ok()) << scale.status();
  EXPECT_EQ(*scale, (Shape{kMax / 128 + 1, kMax / 128 + 1}));
  scale = Fp8ScaleShape({kMax}, kMax);
  ASSERT_TRUE(scale.ok()) << scale.status();
  EXPECT_EQ(*scale, (Shape{1}));
  scale = Fp8ScaleShape({256, 255}, 128);
  ASSERT_TRUE(scale.ok()) << scale.status();
  EXPECT_EQ(*scale, (Shape{2, 2}));
}

TEST(QuantizedErrors, MissingScale) {
  std::string dir;
  absl::Status status =
      MetadataError({{"w.weight", DType::kF8E4M3, {3, 5}, Bytes(kW)}}, dir);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr(dir + "/model.safetensors"),
                    HasSubstr("F8_E4M3 tensor w.weight has no scale tensor "
                              "w.weight_scale_inv")));
}

TEST(QuantizedErrors, ScaleShapeNotCeilOfBlocks) {
  std::string dir;
  absl::Status status =
      MetadataError({{"w.weight", DType::kF8E4M3, {3, 5}, Bytes(kW)},
                     {"w.weight_scale_inv",
                      DType::kF32,
                      {2, 2},
                      Bytes(std::vector<float>(4, 1))}},
                    dir);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(
      status.message(),
      AllOf(HasSubstr(dir + "/model.safetensors"),
            HasSubstr("w.weight_scale_inv has shape [2, 2]"),
            HasSubstr("w.weight of shape [3, 5]"), HasSubstr("needs [2, 3]")));
}

TEST(QuantizedErrors, ScaleBesideATensorThatIsNotFp8) {
  std::string dir;
  absl::Status status = MetadataError(
      {{"w.weight", DType::kBF16, {3, 5}, std::string(30, '\0')},
       {"w.weight_scale_inv", DType::kF32, {2, 3}, Bytes(kWScale)}},
      dir);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr(dir + "/model.safetensors"),
                    HasSubstr("tensor w.weight is BF16 but has the scale "
                              "w.weight_scale_inv")));
}

TEST(QuantizedErrors, ScaleThatIsNotF32) {
  std::string dir;
  absl::Status status = MetadataError(
      {{"w.weight", DType::kF8E4M3, {3, 5}, Bytes(kW)},
       {"w.weight_scale_inv", DType::kBF16, {2, 3}, std::string(12, '\0')}},
      dir);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(),
              HasSubstr("the scale w.weight_scale_inv of w.weight is BF16, "
                        "not F32"));
}

TEST(QuantizedErrors, TargetThatCannotHoldDequantizedValues) {
  QuantizedHuggingFaceStorageReaderOptions options;
  options.target_dtype = DType::kI32;
  QuantizedHuggingFaceStorageReader reader(QuantizedCheckpoint(), options);
  absl::Status status = reader.ReadMetadata().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("not I32"));
}

}  // namespace
}  // namespace dcp
