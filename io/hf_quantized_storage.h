// QuantizedHuggingFaceStorageReader: the seed's reader for Hugging Face
// checkpoints whose weights are stored as block-scaled fp8 (DeepSeek-V3
// style, io/quantized_dequant.h): each F8_E4M3 tensor `W` comes with an F32
// tensor `W_scale_inv` (for `x.weight`, `x.weight_scale_inv`), and loads
// produce `W` dequantized to target_dtype (bf16, f16 or f32) while reading.
//
// - ReadMetadata describes each quantized weight with target_dtype (its
//   shape unchanged); every other tensor, the scales included, as stored.
// - ReadData reads, for a quantized weight, only the fp8 rows of the box a
//   rank asks for (a resharded slice reads its slice), in windows of at
//   most read_window_bytes, and dequantizes each window on thread_count
//   threads into the destination. Each scale tensor the plan needs is read
//   once per ReadData, whatever the number of boxes that use it. A device
//   destination whose last dimension is contiguous is dequantized by the
//   device: each window's fp8 bytes are copied to device scratch memory and
//   the kernel (cuda/fp8_dequant.h; on the host runtime its CPU twin)
//   writes target_dtype straight into the tensor, with each scale tensor
//   copied to the device once per ReadData; the window is on the device
//   before its thread reads the next. Any other device destination, or a
//   window for which device memory runs out, is dequantized on the CPU and
//   copied through device staging. Both give the CPU destination's bytes.
//   Other tensors are read by an inner HuggingFaceStorageReader.
// - Malformed checkpoints are kDataLoss naming the file and the tensor: an
//   F8_E4M3 tensor without its scale, a scale that is not F32 or whose
//   shape is not Fp8ScaleShape(weight, block_size), a scale beside a tensor
//   that is not F8_E4M3. A quantized weight split across files (sharded
//   under DCP_SHARDING_INFO) is kUnimplemented.
//
// Thread safety: as HuggingFaceStorageReader.
#ifndef DCP_IO_HF_QUANTIZED_STORAGE_H_
#define DCP_IO_HF_QUANTIZED_STORAGE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "core/dtype.h"
#include "core/executor.h"
#include "io/hf_storage.h"
#include "io/storage.h"

namespace dcp {

// The suffix of a scale tensor's name: the scale of `W` is `W` + this.
inline constexpr char kHfScaleSuffix[] = "_scale_inv";

// The tile edge of the scales when neither the options nor config.json
// give one (DeepSeek-V3's).
inline constexpr int64_t kDefaultFp8BlockSize = 128;

// The tile edge config.json in `dir` gives (`quantization_config`
// `weight_block_size`, two equal positive integers); nullopt when there is
// no config.json or it gives none. kDataLoss naming the file for a
// config.json that is not JSON or a weight_block_size that is not two
// positive integers; kUnimplemented for unequal edges.
absl::StatusOr<std::optional<int64_t>> ConfiguredFp8BlockSize(
    FileSystemBase& fs, const std::string& dir);

struct QuantizedHuggingFaceStorageReaderOptions {
  // Threads reading and dequantizing; also the inner reader's.
  int thread_count = 1;
  // What quantized weights load as: kF32, kBF16 or kF16 (else SetUp and
  // ReadMetadata fail with kInvalidArgument).
  DType target_dtype = DType::kF32;
  // The tile edge of the scales; 0: the checkpoint's config.json
  // `quantization_config.weight_block_size` ([edge, edge], as DeepSeek-V3
  // and transformers' FP8 models write it) when it has one, else
  // kDefaultFp8BlockSize.
  int64_t block_size = 0;
  // Fp8 bytes one thread holds per window (at least one row).
  int64_t read_window_bytes = int64_t{8} << 20;
  // The inner reader's other options (thread_count is overridden above);
  // file_system and device_staging are used by this reader as well.
  HuggingFaceStorageReaderOptions base;
};

class QuantizedHuggingFaceStorageReader final : public StorageReader {
 public:
  explicit QuantizedHuggingFaceStorageReader(
      std::string path, QuantizedHuggingFaceStorageReaderOptions options = {});
  ~QuantizedHuggingFaceStorageReader() override;

  absl::Status Reset(const std::string& checkpoint_id) override;
  // HuggingFaceStorageReader::ReadMetadata, with quantized weights in
  // target_dtype; the errors in the file comment.
  absl::StatusOr<Metadata> ReadMetadata() override;
  absl::Status SetUp(const Metadata& metadata, bool is_coordinator) override;
  absl::StatusOr<LoadPlan> PrepareLocalPlan(LoadPlan plan) override;
  absl::StatusOr<std::vector<LoadPlan>> PrepareGlobalPlan(
      std::vector<LoadPlan> plans) override;
  // Blocks; the returned future is ready. kInvalidArgument naming the
  // tensor for a destination whose dtype cannot hold dequantized values;
  // kDataLoss naming the file for a short file.
  Future<void> ReadData(const LoadPlan& plan, LoadPlanner& planner) override;

  const std::string& path() const { return path_; }
  // Of the last ReadData: fp8 bytes read for quantized weights, and scale
  // tensors read (each at most once).
  int64_t quantized_bytes_read() const { return quantized_bytes_read_; }
  int64_t scale_tensors_read() const { return scale_tensors_read_; }
  // Of the last ReadData, elements of device destinations: dequantized by
  // the device, and dequantized on the CPU and then copied.
  int64_t device_dequantized_elements() const {
    return device_dequantized_elements_;
  }
  int64_t uploaded_dequantized_elements() const {
    return uploaded_dequantized_elements_;
  }

 private:
  // A quantized weight: its scale's name and both shapes.
  struct Quantized {
    std::string scale;
    Shape shape;
    Shape scale_shape;
  };
  absl::Status CheckTarget() const;
  // options_.block_size, or when it is 0 config.json's, else the default.
  absl::StatusOr<int64_t> BlockSize() const;

  std::string path_;
  QuantizedHuggingFaceStorageReaderOptions options_;
  HuggingFaceStorageReader inner_;
  std::optional<Metadata> metadata_;
  std::map<std::string, Quantized> quantized_;
  bool analyzed_ = false;   // quantized_ describes path_.
  int64_t block_size_ = 0;  // Of path_, once analyzed_.
  int64_t quantized_bytes_read_ = 0;
  int64_t scale_tensors_read_ = 0;
  int64_t device_dequantized_elements_ = 0;
  int64_t uploaded_dequantized_elements_ = 0;
  std::unique_ptr<DeviceStaging> owned_staging_;
  std::unique_ptr<ThreadPool> pool_;  // Dequantization threads.
};

}  // namespace dcp

#endif  // DCP_IO_HF_QUANTIZED_STORAGE_H_
