// QuantizedHuggingFaceStorageReader (io/hf_quantized_storage.h).
//
// A quantized weight of shape [..., R, C] is viewed as [L, R, C] (L the
// product of the leading dimensions; a 1-D weight as [1, 1, C]) and its
// scale as [L, SR, SC]. A box is cut into units: one leading index and a
// run of rows, at most read_window_bytes of fp8. A unit's rows are read with
// one pread when the box spans whole rows or the skipped bytes between its
// row segments are few, else one pread per row, then dequantized row by row
// (DequantizeFp8Row) into the destination. A device destination whose
// columns are contiguous gets the unit's fp8 rows copied to the device and
// dequantized there (DeviceFp8Dequantizer, scales copied once per load);
// any other device destination gets the CPU's rows through device staging.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/box_copy.h"
#include "core/status.h"
#include "cuda/fp8_dequant.h"
#include "io/hf_quantized_storage.h"
#include "io/internal/commit_journal.h"
#include "io/internal/hf_internal.h"
#include "io/internal/storage_resources.h"
#include "io/quantized_dequant.h"
#include "io/safetensors.h"
#include "nlohmann/json.hpp"
#include "staging/device_box_upload.h"
#include "staging/device_fp8_dequant.h"
#include "staging/device_staging.h"

namespace dcp {
namespace {

// The largest config.json read for its block size.
constexpr int64_t kMaxConfigBytes = int64_t{16} << 20;
// The largest block edge config.json may give (real checkpoints use 128):
// the scale shape and block arithmetic stay far from overflow.
constexpr int64_t kMaxFp8BlockSize = int64_t{1} << 20;

// Skipped bytes between row segments read through rather than split.
constexpr int64_t kReadGapBytes = int64_t{64} << 10;

HuggingFaceStorageReaderOptions InnerOptions(
    const QuantizedHuggingFaceStorageReaderOptions& options) {
  HuggingFaceStorageReaderOptions inner = options.base;
  inner.thread_count = options.thread_count;
  return inner;
}

// Where a tensor's (first) chunk is stored.
const StorageInfo* InfoOf(const Metadata& metadata, const std::string& fqn,
                          const TensorStorageMetadata& tensor) {
  if (tensor.chunks.empty()) return nullptr;
  auto it = metadata.storage_data.find(
      MetadataIndex(fqn, tensor.chunks.front().offsets));
  return it == metadata.storage_data.end() ? nullptr : &it->second;
}

std::string FileOf(const Metadata& metadata, const std::string& fqn,
                   const TensorStorageMetadata& tensor) {
  const StorageInfo* info = InfoOf(metadata, fqn, tensor);
  return info == nullptr ? std::string("(no file)") : info->relative_path;
}

bool IsWhole(const TensorStorageMetadata& tensor) {
  return tensor.chunks.size() == 1 &&
         tensor.chunks.front().sizes == tensor.size;
}

// [L, R, C] of a shape of rank >= 1.
struct View3 {
  int64_t l = 1, r = 1, c = 1;
};
View3 ViewOf(const Shape& shape) {
  View3 v;
  const size_t n = shape.size();
  v.c = shape[n - 1];
  if (n >= 2) v.r = shape[n - 2];
  for (size_t d = 0; d + 2 < n; ++d) v.l *= shape[d];
  return v;
}

// One window of one quantized box.
struct Unit {
  size_t use = 0;
  int64_t lead = 0;    // Linear index over the weight's leading dims.
  Shape offsets;       // In the weight: the unit's first element.
  Shape lengths;       // The unit's box (1 in leading dims).
  Shape dest_offsets;  // In the destination.
};

// A quantized box the plan reads.
struct Use {
  const ReadItem* item = nullptr;
  TensorView dest;
  const StorageInfo* info = nullptr;
  File* file = nullptr;
  int64_t file_size = 0;
  Shape shape;  // The weight's.
  const std::vector<float>* scale = nullptr;
  Shape scale_shape;
  std::unique_ptr<std::atomic<int64_t>> units_left;
  bool on_device = false;
  DeviceStaging* staging = nullptr;  // For a device destination.
  // For a device destination dequantized by the device: the scale tensor's
  // copy there (null: dequantized on the CPU and copied).
  DeviceFp8Dequantizer* dequantizer = nullptr;
  const float* device_scales = nullptr;
};

// What the workers did, for the reader's counters.
struct Progress {
  std::atomic<int64_t> bytes_read{0};
  std::atomic<int64_t> device_elements{0};
  std::atomic<int64_t> uploaded_elements{0};
};

// Per-thread scratch, grown as needed.
struct Scratch {
  std::vector<uint8_t> fp8;
  std::vector<std::byte> row;
  std::vector<std::byte> window;  // Dequantized unit for device uploads.
};

absl::Status ReadUnit(const Use& use, const Unit& unit, int64_t block,
                      Scratch& scratch, Progress& progress) {
  const size_t n = use.shape.size();
  const View3 w = ViewOf(use.shape);
  const View3 s = ViewOf(use.scale_shape);
  const int64_t r0 = n >= 2 ? unit.offsets[n - 2] : 0;
  const int64_t rows = n >= 2 ? unit.lengths[n - 2] : 1;
  const int64_t c0 = unit.offsets[n - 1];
  const int64_t width = unit.lengths[n - 1];
  // Fp8 bytes: row r of the unit at fp8 + r * in_stride.
  const int64_t first = (unit.lead * w.r + r0) * w.c + c0;
  const int64_t span = (rows - 1) * w.c + width;
  const bool one_read = width == w.c || (w.c - width) <= kReadGapBytes ||
                        span <= 2 * rows * width;
  const int64_t in_stride = one_read ? w.c : width;
  scratch.fp8.resize(one_read ? span : rows * width);
  if (use.info->offset + first + span > use.file_size) {
    return absl::DataLossError(absl::StrCat(
        use.file->path(), " is truncated: ", use.item->storage_index.fqn,
        " needs bytes up to offset ", use.info->offset + first + span,
        " but the file ends at offset ", use.file_size));
  }
  auto read = [&](int64_t at, uint8_t* into, int64_t bytes) -> absl::Status {
    DCP_ASSIGN_OR_RETURN(size_t got,
                         use.file->PRead(use.info->offset + at,
                                         {reinterpret_cast<std::byte*>(into),
                                          static_cast<size_t>(bytes)}));
    progress.bytes_read += static_cast<int64_t>(got);
    if (static_cast<int64_t>(got) != bytes) {
      return absl::DataLossError(
          absl::StrCat(use.file->path(), " is truncated: it ends at offset ",
                       use.info->offset + at + static_cast<int64_t>(got),
                       " inside ", use.item->storage_index.fqn));
    }
    return absl::OkStatus();
  };
  if (one_read) {
    DCP_RETURN_IF_ERROR(read(first, scratch.fp8.data(), span));
  } else {
    for (int64_t r = 0; r < rows; ++r) {
      DCP_RETURN_IF_ERROR(
          read(first + r * w.c, scratch.fp8.data() + r * width, width));
    }
  }

  const DType dtype = use.dest.dtype();
  const int64_t es = static_cast<int64_t>(ElementSize(dtype));
  const Shape& strides = use.dest.strides();
  int64_t base = 0;
  for (size_t d = 0; d < n; ++d) base += unit.dest_offsets[d] * strides[d];
  const int64_t row_stride = n >= 2 ? strides[n - 2] : 0;
  const int64_t col_stride = strides[n - 1];
  std::byte* data = static_cast<std::byte*>(use.dest.data());
  if (use.device_scales != nullptr) {
    Fp8DeviceWindow window;
    Fp8BlockDequantArgs& region = window.region;
    region.fp8 = scratch.fp8.data();
    region.fp8_row_stride = in_stride;
    region.rows = rows;
    region.cols = width;
    region.row0 = r0;
    region.col0 = c0;
    region.block = block;
    region.scales = use.device_scales + unit.lead * s.r * s.c;
    region.scale_row_stride = s.c;
    region.out = data + base * es;
    region.out_row_stride = rows > 1 ? row_stride : width;
    DCP_ASSIGN_OR_RETURN(region.target, DequantTargetOf(dtype));
    window.device = use.dest.device().index;
    absl::Status status = use.dequantizer->Dequantize(window);
    if (status.ok()) {
      progress.device_elements += rows * width;
      return status;
    }
    // Without device memory for the scratch, the CPU dequantizes.
    if (!absl::IsResourceExhausted(status)) return status;
  }
  const float* scales = use.scale->data();
  auto scale_row = [&](int64_t r) {
    return scales + (unit.lead * s.r + (r0 + r) / block) * s.c;
  };
  if (use.on_device) {
    progress.uploaded_elements += rows * width;
    scratch.window.resize(rows * width * es);
    for (int64_t r = 0; r < rows; ++r) {
      DequantizeFp8Row(scratch.fp8.data() + r * in_stride, width, c0,
                       scale_row(r), block, dtype,
                       scratch.window.data() + r * width * es);
    }
    const int64_t count = NumElements(unit.lengths);
    return UploadBoxPart(*use.staging, scratch.window.data(), 0, count,
                         unit.lengths, Shape(n, 0), es, use.dest,
                         unit.dest_offsets, unit.lengths);
  }
  if (col_stride != 1) scratch.row.resize(width * es);
  for (int64_t r = 0; r < rows; ++r) {
    std::byte* out = data + (base + r * row_stride) * es;
    if (col_stride == 1) {
      DequantizeFp8Row(scratch.fp8.data() + r * in_stride, width, c0,
                       scale_row(r), block, dtype, out);
      continue;
    }
    DequantizeFp8Row(scratch.fp8.data() + r * in_stride, width, c0,
                     scale_row(r), block, dtype, scratch.row.data());
    for (int64_t j = 0; j < width; ++j) {
      std::memcpy(out + j * col_stride * es, scratch.row.data() + j * es, es);
    }
  }
  return absl::OkStatus();
}

}  // namespace

QuantizedHuggingFaceStorageReader::QuantizedHuggingFaceStorageReader(
    std::string path, QuantizedHuggingFaceStorageReaderOptions options)
    : path_(path), options_(options), inner_(path, InnerOptions(options)) {
  options_.thread_count = std::max(1, options_.thread_count);
  options_.read_window_bytes = std::max<int64_t>(1, options_.read_window_bytes);
}

QuantizedHuggingFaceStorageReader::~QuantizedHuggingFaceStorageReader() =
    default;

absl::Status QuantizedHuggingFaceStorageReader::CheckTarget() const {
  if (!IsDequantTarget(options_.target_dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "QuantizedHuggingFaceStorageReader dequantizes to F32, BF16 or F16, "
        "not ",
        DTypeName(options_.target_dtype)));
  }
  if (options_.block_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "QuantizedHuggingFaceStorageReader: block_size must be positive (0: "
        "config.json's, else ",
        kDefaultFp8BlockSize, "), not ", options_.block_size));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> QuantizedHuggingFaceStorageReader::BlockSize() const {
  if (options_.block_size > 0) return options_.block_size;
  DCP_ASSIGN_OR_RETURN(
      std::optional<int64_t> configured,
      ConfiguredFp8BlockSize(*internal_io::OrLocal(options_.base.file_system),
                             path_));
  return configured.value_or(kDefaultFp8BlockSize);
}

absl::StatusOr<std::optional<int64_t>> ConfiguredFp8BlockSize(
    FileSystemBase& fs, const std::string& dir) {
  const std::string path = JoinPath(dir, "config.json");
  absl::StatusOr<std::string> text = internal_io::ReadSmallFile(
      fs, path, kMaxConfigBytes, internal_hf::kHfReadersFollowLinks);
  if (absl::IsNotFound(text.status())) return std::nullopt;
  if (!text.ok()) return text.status();
  DCP_ASSIGN_OR_RETURN(const nlohmann::json config,
                       ParseUntrustedJson(*text, path));
  if (!config.is_object()) return std::nullopt;
  auto quantization = config.find("quantization_config");
  if (quantization == config.end() || !quantization->is_object()) {
    return std::nullopt;
  }
  auto block = quantization->find("weight_block_size");
  if (block == quantization->end() || block->is_null()) return std::nullopt;
  const auto positive = [](const nlohmann::json& v) {
    return v.is_number_integer() && v.get<int64_t>() > 0;
  };
  if (!block->is_array() || block->size() != 2 || !positive((*block)[0]) ||
      !positive((*block)[1])) {
    return absl::DataLossError(
        absl::StrCat(path, ": quantization_config.weight_block_size is ",
                     DescribeJsonValue(*block), ", not two positive integers"));
  }
  const int64_t rows = (*block)[0].get<int64_t>();
  const int64_t columns = (*block)[1].get<int64_t>();
  if (rows > kMaxFp8BlockSize || columns > kMaxFp8BlockSize) {
    return absl::DataLossError(absl::StrCat(
        path, ": quantization_config.weight_block_size is [", rows, ", ",
        columns, "], larger than the largest block edge read (",
        kMaxFp8BlockSize, ")"));
  }
  if (rows != columns) {
    return absl::UnimplementedError(absl::StrCat(
        path, ": quantization_config.weight_block_size is [", rows, ", ",
        columns,
        "]; QuantizedHuggingFaceStorageReader reads square blocks only"));
  }
  return rows;
}

absl::Status QuantizedHuggingFaceStorageReader::Reset(
    const std::string& checkpoint_id) {
  if (!checkpoint_id.empty()) path_ = checkpoint_id;
  metadata_.reset();
  quantized_.clear();
  analyzed_ = false;
  return inner_.Reset(checkpoint_id);
}

absl::StatusOr<Metadata> QuantizedHuggingFaceStorageReader::ReadMetadata() {
  DCP_RETURN_IF_ERROR(CheckTarget());
  DCP_ASSIGN_OR_RETURN(Metadata metadata, inner_.ReadMetadata());
  DCP_ASSIGN_OR_RETURN(const int64_t block, BlockSize());
  std::map<std::string, Quantized> quantized;
  for (const auto& [fqn, value] : metadata.state_dict_metadata) {
    const auto* tensor = std::get_if<TensorStorageMetadata>(&value);
    if (tensor == nullptr) continue;
    const std::string where =
        absl::StrCat(path_, "/", FileOf(metadata, fqn, *tensor));
    if (absl::EndsWith(fqn, kHfScaleSuffix)) {
      const std::string weight =
          fqn.substr(0, fqn.size() - std::strlen(kHfScaleSuffix));
      auto it = metadata.state_dict_metadata.find(weight);
      const auto* w = it == metadata.state_dict_metadata.end()
                          ? nullptr
                          : std::get_if<TensorStorageMetadata>(&it->second);
      if (w != nullptr && w->properties.dtype != DType::kF8E4M3) {
        return absl::DataLossError(absl::StrCat(
            path_, "/", FileOf(metadata, weight, *w), ": tensor ", weight,
            " is ", DTypeName(w->properties.dtype), " but has the scale ", fqn,
            " (in ", where, "); only F8_E4M3 tensors are block-scaled"));
      }
    }
    if (tensor->properties.dtype != DType::kF8E4M3) continue;
    const std::string scale_name = fqn + kHfScaleSuffix;
    auto it = metadata.state_dict_metadata.find(scale_name);
    const auto* scale = it == metadata.state_dict_metadata.end()
                            ? nullptr
                            : std::get_if<TensorStorageMetadata>(&it->second);
    if (scale == nullptr) {
      return absl::DataLossError(absl::StrCat(where, ": F8_E4M3 tensor ", fqn,
                                              " has no scale tensor ",
                                              scale_name, " in ", path_));
    }
    const std::string scale_where =
        absl::StrCat(path_, "/", FileOf(metadata, scale_name, *scale));
    if (!IsWhole(*tensor) || !IsWhole(*scale)) {
      return absl::UnimplementedError(absl::StrCat(
          where, ": the quantized tensor ", fqn, " or its scale ", scale_name,
          " is split into chunks; QuantizedHuggingFaceStorageReader reads "
          "whole quantized tensors only"));
    }
    if (scale->properties.dtype != DType::kF32) {
      return absl::DataLossError(absl::StrCat(
          scale_where, ": the scale ", scale_name, " of ", fqn, " is ",
          DTypeName(scale->properties.dtype), ", not F32"));
    }
    absl::StatusOr<Shape> expected = Fp8ScaleShape(tensor->size, block);
    if (!expected.ok() || *expected != scale->size) {
      return absl::DataLossError(absl::StrCat(
          scale_where, ": the scale ", scale_name, " has shape ",
          ShapeToString(scale->size), " but F8_E4M3 tensor ", fqn, " of shape ",
          ShapeToString(tensor->size), " in ", block, "x", block,
          " blocks needs ",
          expected.ok() ? ShapeToString(*expected)
                        : std::string(expected.status().message())));
    }
    quantized[fqn] = {scale_name, tensor->size, scale->size};
  }
  for (const auto& [fqn, q] : quantized) {
    std::get<TensorStorageMetadata>(metadata.state_dict_metadata[fqn])
        .properties.dtype = options_.target_dtype;
  }
  quantized_ = std::move(quantized);
  block_size_ = block;
  analyzed_ = true;
  return metadata;
}

absl::Status QuantizedHuggingFaceStorageReader::SetUp(const Metadata& metadata,
                                                      bool is_coordinator) {
  DCP_RETURN_IF_ERROR(CheckTarget());
  // A rank that did not read the metadata itself learns which tensors are
  // quantized from the headers.
  if (!analyzed_) DCP_RETURN_IF_ERROR(ReadMetadata().status());
  metadata_ = metadata;
  return inner_.SetUp(metadata, is_coordinator);
}

absl::StatusOr<LoadPlan> QuantizedHuggingFaceStorageReader::PrepareLocalPlan(
    LoadPlan plan) {
  return plan;
}

absl::StatusOr<std::vector<LoadPlan>>
QuantizedHuggingFaceStorageReader::PrepareGlobalPlan(
    std::vector<LoadPlan> plans) {
  return plans;
}

Future<void> QuantizedHuggingFaceStorageReader::ReadData(const LoadPlan& plan,
                                                         LoadPlanner& planner) {
  auto fail = [](absl::Status status) {
    return Future<void>::Ready(std::move(status));
  };
  if (!metadata_.has_value()) {
    return fail(absl::FailedPreconditionError(
        "QuantizedHuggingFaceStorageReader::ReadData before SetUp"));
  }
  quantized_bytes_read_ = 0;
  scale_tensors_read_ = 0;
  device_dequantized_elements_ = 0;
  uploaded_dequantized_elements_ = 0;
  LoadPlan plain = plan;
  plain.items.clear();
  std::vector<const ReadItem*> items;
  for (const ReadItem& item : plan.items) {
    if (item.type == LoadItemType::kTensor &&
        quantized_.count(item.storage_index.fqn) != 0) {
      items.push_back(&item);
    } else {
      plain.items.push_back(item);
    }
  }
  if (!plain.items.empty()) {
    absl::Status status = inner_.ReadData(plain, planner).Wait();
    if (!status.ok()) return fail(status);
  }
  if (items.empty()) return Future<void>::Ready(absl::OkStatus());

  const Metadata& metadata = *metadata_;
  FileSystemBase* fs = internal_io::OrLocal(options_.base.file_system);
  OpenOptions open_options;
  open_options.exclusive = false;
  open_options.no_follow = !internal_hf::kHfReadersFollowLinks;
  open_options.uncached = options_.base.uncached_reads;
  std::map<std::string, std::pair<std::unique_ptr<File>, int64_t>> files;
  auto open = [&](const StorageInfo& info)
      -> absl::StatusOr<std::pair<File*, int64_t>> {
    auto it = files.find(info.relative_path);
    if (it == files.end()) {
      DCP_RETURN_IF_ERROR(internal_hf::CheckRelativePath(info.relative_path));
      DCP_ASSIGN_OR_RETURN(
          std::unique_ptr<File> file,
          fs->OpenForRead(JoinPath(path_, info.relative_path), open_options));
      DCP_ASSIGN_OR_RETURN(int64_t size, file->Size());
      it = files
               .emplace(info.relative_path,
                        std::make_pair(std::move(file), size))
               .first;
    }
    return std::make_pair(it->second.first.get(), it->second.second);
  };
  auto info_of = [&](const std::string& fqn,
                     const Shape& shape) -> absl::StatusOr<const StorageInfo*> {
    auto it =
        metadata.storage_data.find(MetadataIndex(fqn, Shape(shape.size(), 0)));
    if (it == metadata.storage_data.end()) {
      return absl::DataLossError(
          absl::StrCat("the metadata of ", path_, " has no storage for ", fqn));
    }
    return &it->second;
  };

  // Every scale the plan needs, read once.
  std::map<std::string, std::vector<float>> scales;
  for (const ReadItem* item : items) {
    const Quantized& q = quantized_.at(item->storage_index.fqn);
    if (scales.count(q.scale) != 0) continue;
    absl::StatusOr<const StorageInfo*> info = info_of(q.scale, q.scale_shape);
    if (!info.ok()) return fail(info.status());
    auto file = open(**info);
    if (!file.ok()) return fail(file.status());
    std::vector<float> values(NumElements(q.scale_shape));
    const int64_t bytes = static_cast<int64_t>(values.size() * sizeof(float));
    if ((*info)->length != bytes) {
      return fail(absl::DataLossError(absl::StrCat(
          path_, "/", (*info)->relative_path, ": the scale ", q.scale,
          " takes ", (*info)->length, " bytes, not ", bytes)));
    }
    absl::StatusOr<size_t> got = file->first->PRead(
        (*info)->offset, {reinterpret_cast<std::byte*>(values.data()),
                          static_cast<size_t>(bytes)});
    if (!got.ok()) return fail(got.status());
    if (static_cast<int64_t>(*got) != bytes) {
      return fail(absl::DataLossError(
          absl::StrCat(file->first->path(),
                       " is truncated: it ends inside the scale ", q.scale)));
    }
    ++scale_tensors_read_;
    scales.emplace(q.scale, std::move(values));
  }

  // Destinations and units.
  DeviceStaging* staging = options_.base.device_staging;
  bool staging_used = false;
  std::unique_ptr<DeviceFp8Dequantizer> dequantizer;
  std::vector<Use> uses(items.size());
  std::vector<Unit> units;
  for (size_t u = 0; u < items.size(); ++u) {
    const ReadItem& item = *items[u];
    const Quantized& q = quantized_.at(item.storage_index.fqn);
    Use& use = uses[u];
    use.item = &item;
    use.shape = q.shape;
    use.scale = &scales.at(q.scale);
    use.scale_shape = q.scale_shape;
    use.units_left = std::make_unique<std::atomic<int64_t>>(0);
    const std::string what =
        absl::StrCat("loading ", item.storage_index.ToString(), " into ",
                     item.dest_index.ToString());
    absl::StatusOr<const StorageInfo*> info =
        info_of(item.storage_index.fqn, q.shape);
    if (!info.ok()) return fail(info.status());
    use.info = *info;
    auto file = open(**info);
    if (!file.ok()) return fail(file.status());
    use.file = file->first;
    use.file_size = file->second;
    absl::StatusOr<TensorView> dest = planner.ResolveTensor(item);
    if (!dest.ok()) return fail(dest.status());
    use.dest = *dest;
    if (!IsDequantTarget(dest->dtype())) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
          what, ": the destination is ", DTypeName(dest->dtype()),
          "; a dequantized F8_E4M3 tensor loads as F32, BF16 or F16")));
    }
    const size_t n = q.shape.size();
    if (item.storage_offsets.size() != n || item.lengths.size() != n ||
        item.dest_offsets.size() != n) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat(what, ": the box's rank differs from the tensor's")));
    }
    absl::Status box =
        CopyBoxPart(nullptr, 0, 0, q.shape, item.storage_offsets,
                    ElementSize(dest->dtype()), AsHostView(*dest),
                    item.dest_offsets, item.lengths);
    if (!box.ok()) return fail(Annotate(box, what));
    if (!dest->device().is_cpu()) {
      absl::StatusOr<DeviceStaging*> got =
          internal_io::ReadStaging(staging, owned_staging_);
      if (!got.ok()) return fail(Annotate(got.status(), what));
      staging = *got;
      use.on_device = true;
      use.staging = staging;
      staging_used = true;
      // The kernel writes rows of contiguous columns.
      if (dest->strides()[n - 1] == 1 || item.lengths[n - 1] <= 1) {
        if (dequantizer == nullptr) {
          absl::StatusOr<DeviceRuntime*> runtime = staging->Runtime();
          if (!runtime.ok()) return fail(Annotate(runtime.status(), what));
          dequantizer = std::make_unique<DeviceFp8Dequantizer>(*runtime);
          // The caller's work still using the destinations first, as for
          // the plain uploads.
          absl::Status ordered = dequantizer->OrderAfter(staging->UploadWait());
          if (!ordered.ok()) return fail(Annotate(ordered, what));
        }
        absl::StatusOr<const float*> device_scales = dequantizer->DeviceScales(
            q.scale, *use.scale, dest->device().index);
        if (device_scales.ok()) {
          use.dequantizer = dequantizer.get();
          use.device_scales = *device_scales;
        } else if (!absl::IsResourceExhausted(device_scales.status())) {
          return fail(Annotate(device_scales.status(), what));
        }
      }
    }
    if (NumElements(item.lengths) == 0) {
      absl::Status committed = planner.CommitTensor(item, use.dest);
      if (!committed.ok()) return fail(committed);
      continue;
    }
    // Units: odometer over the box's leading dims, runs of rows.
    const int64_t width = item.lengths[n - 1];
    const int64_t box_rows = n >= 2 ? item.lengths[n - 2] : 1;
    const int64_t rows_per_unit = std::clamp<int64_t>(
        options_.read_window_bytes / std::max<int64_t>(1, width), 1, box_rows);
    const size_t lead_dims = n >= 2 ? n - 2 : 0;
    Shape at(lead_dims, 0);
    while (true) {
      int64_t lead = 0;
      for (size_t d = 0; d < lead_dims; ++d) {
        lead = lead * q.shape[d] + item.storage_offsets[d] + at[d];
      }
      for (int64_t r = 0; r < box_rows; r += rows_per_unit) {
        Unit unit;
        unit.use = u;
        unit.lead = lead;
        unit.offsets = item.storage_offsets;
        unit.lengths = item.lengths;
        unit.dest_offsets = item.dest_offsets;
        for (size_t d = 0; d < lead_dims; ++d) {
          unit.offsets[d] += at[d];
          unit.dest_offsets[d] += at[d];
          unit.lengths[d] = 1;
        }
        if (n >= 2) {
          unit.offsets[n - 2] += r;
          unit.dest_offsets[n - 2] += r;
          unit.lengths[n - 2] = std::min(rows_per_unit, box_rows - r);
        }
        units.push_back(std::move(unit));
        use.units_left->fetch_add(1);
      }
      size_t d = lead_dims;
      while (d > 0 && ++at[d - 1] == item.lengths[d - 1]) at[--d] = 0;
      if (d == 0) break;
    }
  }

  internal_hf::FirstError error;
  std::atomic<size_t> next{0};
  Progress progress;
  const int threads = static_cast<int>(std::min<size_t>(
      options_.thread_count, std::max<size_t>(1, units.size())));
  internal_io::RunWorkers(
      internal_io::PoolOf(pool_, options_.thread_count), threads, [&](int) {
        Scratch scratch;
        for (size_t i = next++; i < units.size() && !error.failed();
             i = next++) {
          const Unit& unit = units[i];
          Use& use = uses[unit.use];
          absl::Status status =
              ReadUnit(use, unit, block_size_, scratch, progress);
          if (!status.ok()) {
            error.Update(Annotate(
                status,
                absl::StrCat("loading ", use.item->storage_index.ToString(),
                             " into ", use.item->dest_index.ToString())));
            continue;
          }
          if (use.units_left->fetch_sub(1) == 1 && !use.on_device) {
            error.Update(planner.CommitTensor(*use.item, use.dest));
          }
        }
      });
  if (staging_used) {
    error.Update(Annotate(staging->Flush(),
                          absl::StrCat("copying dequantized tensors from ",
                                       path_, " to devices")));
    for (Use& use : uses) {
      if (error.failed()) break;
      if (!use.on_device || use.item == nullptr || *use.units_left != 0 ||
          NumElements(use.item->lengths) == 0) {
        continue;
      }
      error.Update(planner.CommitTensor(*use.item, use.dest));
    }
  }
  quantized_bytes_read_ = progress.bytes_read.load();
  device_dequantized_elements_ = progress.device_elements.load();
  uploaded_dequantized_elements_ = progress.uploaded_elements.load();
  return Future<void>::Ready(error.status());
}

}  // namespace dcp
