// `dcp convert` (tools/convert.h).
#include "tools/convert.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/state_dict.h"
#include "core/status.h"
#include "engine/checkpoint.h"
#include "io/file_system.h"
#include "io/file_system_storage.h"
#include "io/hf_storage.h"
#include "io/quantized_dequant.h"
#include "io/safetensors.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"

namespace dcp {
namespace {

using Json = nlohmann::json;

bool IsFloating(DType d) {
  return d == DType::kF16 || d == DType::kBF16 || d == DType::kF32 ||
         d == DType::kF64;
}

DType OutputDtype(DType d, const ConvertOptions& options) {
  return options.dtype.has_value() && IsFloating(d) ? *options.dtype : d;
}

float ToFloat(const std::byte* p, DType d) {
  switch (d) {
    case DType::kF32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::kF64: {
      double v;
      std::memcpy(&v, p, 8);
      return static_cast<float>(v);
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      const uint32_t bits = uint32_t{h} << 16;
      float v;
      std::memcpy(&v, &bits, 4);
      return v;
    }
    default: {  // kF16
      _Float16 h;
      std::memcpy(&h, p, 2);
      return static_cast<float>(h);
    }
  }
}

// Converts `n` elements; `to` is F32, BF16 or F16 (F64 sources are
// narrowed through float).
void ConvertElements(const std::byte* src, DType from, int64_t n,
                     std::byte* dst, DType to) {
  const size_t in = ElementSize(from);
  for (int64_t i = 0; i < n; ++i) {
    const float v = ToFloat(src + i * in, from);
    if (to == DType::kF32) {
      std::memcpy(dst + i * 4, &v, 4);
    } else {
      const uint16_t h = to == DType::kBF16 ? FloatToBf16(v) : FloatToF16(v);
      std::memcpy(dst + i * 2, &h, 2);
    }
  }
}

absl::Status PrepareDestination(const std::string& dst) {
  std::error_code ec;
  if (std::filesystem::exists(dst, ec)) {
    if (!std::filesystem::is_directory(dst, ec) ||
        !std::filesystem::is_empty(dst, ec)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "dcp convert: the destination ", dst,
          " exists and is not an empty directory; choose a new one"));
    }
    return absl::OkStatus();
  }
  std::filesystem::create_directories(dst, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("dcp convert: cannot create ", dst, ": ", ec.message()));
  }
  return absl::OkStatus();
}

// "converting: 123 / 456 MiB (27%)" redrawn in place.
class Progress {
 public:
  Progress(bool enabled, int64_t total) : enabled_(enabled), total_(total) {}
  void Add(int64_t bytes) {
    done_ += bytes;
    if (!enabled_) return;
    std::printf("\rconverting: %lld / %lld MiB (%d%%)",
                static_cast<long long>(done_ >> 20),
                static_cast<long long>(total_ >> 20),
                total_ > 0 ? static_cast<int>(100 * done_ / total_) : 100);
    std::fflush(stdout);
  }
  void Finish() {
    if (enabled_) std::printf("\n");
  }

 private:
  const bool enabled_;
  const int64_t total_;
  int64_t done_ = 0;
};

absl::Status Rename(const std::string& from, const std::string& to) {
  std::error_code ec;
  std::filesystem::rename(from, to, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("renaming ", from, " to ", to, ": ", ec.message()));
  }
  return absl::OkStatus();
}

// One window of whole rows of a tensor, loaded in a batch.
struct Piece {
  const SafetensorsTensor* tensor = nullptr;
  DType source = DType::kF32;
  int64_t row0 = 0, rows = 0;  // Dim 0; a 0-d tensor is one "row".
  int64_t bytes = 0;           // In the source dtype.
};

absl::Status ToSafetensors(const std::string& src, const std::string& dst,
                           const ConvertOptions& options) {
  FileSystemReaderOptions reader_options;
  reader_options.thread_count = options.threads;
  FileSystemReader reader(src, reader_options);
  DCP_RETURN_IF_ERROR(reader.Reset(src));
  DCP_ASSIGN_OR_RETURN(Metadata metadata, reader.ReadMetadata());
  DCP_RETURN_IF_ERROR(PrepareDestination(dst));

  // Files in name order, split at max_shard_bytes.
  struct OutFile {
    std::vector<SafetensorsTensor> layout;
    int64_t bytes = 0;
  };
  std::vector<OutFile> files(1);
  std::map<std::string, DType> source_dtype;
  int64_t total = 0, source_total = 0;
  for (const auto& [name, entry] : metadata.state_dict_metadata) {
    const auto* t = std::get_if<TensorStorageMetadata>(&entry);
    if (t == nullptr) {
      std::fprintf(stderr,
                   "dcp convert: skipping %s, a non-tensor value "
                   "(safetensors holds tensors only)\n",
                   name.c_str());
      continue;
    }
    if (t->properties.dtype == DType::kC128) {
      return absl::InvalidArgumentError(
          absl::StrCat("dcp convert: tensor ", name, " of ", src,
                       " is C128, which safetensors cannot hold"));
    }
    const DType out = OutputDtype(t->properties.dtype, options);
    // The metadata decoder checked that every shape's size fits.
    const int64_t bytes = CheckedNumBytes(out, t->size).value_or(0);
    if (files.back().bytes > 0 &&
        files.back().bytes + bytes > options.max_shard_bytes) {
      files.emplace_back();
    }
    files.back().layout.push_back({name, out, t->size});
    files.back().bytes += bytes;
    source_dtype[name] = t->properties.dtype;
    total += bytes;
    source_total += CheckedNumBytes(t->properties.dtype, t->size).value_or(0);
  }

  Progress progress(options.progress, source_total);
  FileSystemBase& fs = LocalFileSystem();
  Json weight_map = Json::object();
  std::vector<std::pair<std::string, std::string>> renames;
  std::vector<std::byte> buffer, converted;
  const int count = static_cast<int>(files.size());
  for (int f = 0; f < count; ++f) {
    OutFile& file = files[f];
    SortForSafetensors(file.layout);
    DCP_ASSIGN_OR_RETURN(
        std::string header,
        EncodeSafetensorsHeader(file.layout, {{"format", "pt"}}));
    const std::string name = HfFileName(f + 1, count);
    const std::string temp = JoinPath(dst, absl::StrCat(".", name, ".tmp"));
    OpenOptions open_options;
    DCP_ASSIGN_OR_RETURN(std::unique_ptr<File> out,
                         fs.OpenForWrite(temp, open_options));
    int64_t at = 0;
    auto append = [&](const std::byte* data, int64_t bytes) -> absl::Status {
      DCP_RETURN_IF_ERROR(out->PWrite(at, {data, static_cast<size_t>(bytes)}));
      at += bytes;
      return absl::OkStatus();
    };
    DCP_RETURN_IF_ERROR(
        append(reinterpret_cast<const std::byte*>(header.data()),
               static_cast<int64_t>(header.size())));

    // Windows of whole rows, loaded in batches of at most buffer_bytes.
    std::vector<Piece> batch;
    int64_t batch_bytes = 0;
    auto flush = [&]() -> absl::Status {
      if (batch.empty()) return absl::OkStatus();
      buffer.resize(batch_bytes);
      StateDict state;
      int64_t offset = 0;
      for (const Piece& p : batch) {
        const Shape& shape = p.tensor->shape;
        Shape sizes = shape;
        if (!sizes.empty()) sizes[0] = p.rows;
        const TensorView view(buffer.data() + offset, p.source, sizes);
        offset += p.bytes;
        if (shape.empty() || p.rows == shape[0]) {
          state[p.tensor->name] = Tensor::Wrap(view);
        } else {
          Shape offsets(shape.size(), 0);
          offsets[0] = p.row0;
          state[p.tensor->name] = ShardedTensor(
              p.source, shape, {Shard{offsets, Tensor::Wrap(view)}});
        }
      }
      LoadOptions load;
      load.storage_reader = &reader;
      load.no_dist = true;
      DCP_RETURN_IF_ERROR(Load(state, load));
      offset = 0;
      for (const Piece& p : batch) {
        const std::byte* data = buffer.data() + offset;
        offset += p.bytes;
        progress.Add(p.bytes);
        if (p.source == p.tensor->dtype) {
          DCP_RETURN_IF_ERROR(append(data, p.bytes));
          continue;
        }
        const int64_t n = p.bytes / static_cast<int64_t>(ElementSize(p.source));
        converted.resize(n * ElementSize(p.tensor->dtype));
        ConvertElements(data, p.source, n, converted.data(), p.tensor->dtype);
        DCP_RETURN_IF_ERROR(
            append(converted.data(), static_cast<int64_t>(converted.size())));
      }
      batch.clear();
      batch_bytes = 0;
      return absl::OkStatus();
    };
    for (const SafetensorsTensor& t : file.layout) {
      const DType source = source_dtype.at(t.name);
      const int64_t numel = NumElements(t.shape);
      if (numel == 0) continue;
      const int64_t rows = t.shape.empty() ? 1 : t.shape[0];
      const int64_t row_bytes =
          numel / rows * static_cast<int64_t>(ElementSize(source));
      const int64_t window =
          std::clamp<int64_t>(options.buffer_bytes / row_bytes, 1, rows);
      for (int64_t r = 0; r < rows; r += window) {
        Piece p{&t, source, r, std::min(window, rows - r), 0};
        p.bytes = p.rows * row_bytes;
        if (batch_bytes > 0 && batch_bytes + p.bytes > options.buffer_bytes) {
          DCP_RETURN_IF_ERROR(flush());
        }
        batch.push_back(p);
        batch_bytes += p.bytes;
      }
    }
    DCP_RETURN_IF_ERROR(flush());
    DCP_RETURN_IF_ERROR(out->Sync());
    DCP_RETURN_IF_ERROR(out->Close());
    for (const SafetensorsTensor& t : file.layout) weight_map[t.name] = name;
    renames.emplace_back(temp, JoinPath(dst, name));
  }
  progress.Finish();

  const Json index = {{"metadata", {{"total_size", total}}},
                      {"weight_map", weight_map}};
  const std::string text = index.dump(2);
  const std::string index_temp =
      JoinPath(dst, absl::StrCat(".", kHfIndexFileName, ".tmp"));
  {
    DCP_ASSIGN_OR_RETURN(std::unique_ptr<File> out,
                         fs.OpenForWrite(index_temp, OpenOptions{}));
    DCP_RETURN_IF_ERROR(out->PWrite(
        0, {reinterpret_cast<const std::byte*>(text.data()), text.size()}));
    DCP_RETURN_IF_ERROR(out->Sync());
    DCP_RETURN_IF_ERROR(out->Close());
  }
  renames.emplace_back(index_temp, JoinPath(dst, kHfIndexFileName));
  for (const auto& [from, to] : renames) DCP_RETURN_IF_ERROR(Rename(from, to));
  std::printf("converted %s to %s: %zu tensors in %d files, %lld bytes\n",
              src.c_str(), dst.c_str(), source_dtype.size(), count,
              static_cast<long long>(total));
  return absl::OkStatus();
}

absl::Status ToDcp(const std::string& src, const std::string& dst,
                   const ConvertOptions& options) {
  HuggingFaceStorageReaderOptions reader_options;
  reader_options.thread_count = options.threads;
  HuggingFaceStorageReader reader(src, reader_options);
  DCP_ASSIGN_OR_RETURN(Metadata metadata, reader.ReadMetadata());
  DCP_RETURN_IF_ERROR(PrepareDestination(dst));
  StateDict state;
  int64_t total = 0;
  for (const auto& [name, entry] : metadata.state_dict_metadata) {
    const auto& t = std::get<TensorStorageMetadata>(entry);
    state[name] = Tensor::Empty(t.properties.dtype, t.size);
    total += static_cast<int64_t>(state[name].tensor().nbytes());
  }
  Progress progress(options.progress, total);
  LoadOptions load;
  load.storage_reader = &reader;
  load.no_dist = true;
  DCP_RETURN_IF_ERROR(Load(state, load));
  progress.Add(total / 2);
  for (auto& [name, value] : state) {
    const Tensor& t = value.tensor();
    const DType out = OutputDtype(t.dtype(), options);
    if (out == t.dtype()) continue;
    Tensor converted = Tensor::Empty(out, t.sizes());
    ConvertElements(static_cast<const std::byte*>(t.data()), t.dtype(),
                    t.numel(), static_cast<std::byte*>(converted.data()), out);
    value = converted;
  }
  FileSystemWriterOptions writer_options;
  writer_options.thread_count = options.threads;
  FileSystemWriter writer(dst, writer_options);
  SaveOptions save;
  save.storage_writer = &writer;
  save.no_dist = true;
  DCP_RETURN_IF_ERROR(Save(state, save).status());
  progress.Add(total - total / 2);
  progress.Finish();
  std::printf("converted %s to %s: %zu tensors, %lld bytes loaded\n",
              src.c_str(), dst.c_str(), state.size(),
              static_cast<long long>(total));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ConvertOptions> ParseConvertFlags(
    const std::string& to, const std::string& max_shard_size,
    const std::string& dtype, int threads) {
  ConvertOptions options;
  if (to != "safetensors" && to != "dcp") {
    return absl::InvalidArgumentError(absl::StrCat(
        "dcp convert: --to must be safetensors or dcp, not \"", to, "\""));
  }
  options.to = to;
  if (!max_shard_size.empty()) {
    absl::StatusOr<int64_t> bytes = ParseSize(max_shard_size);
    if (!bytes.ok() || *bytes <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("dcp convert: --max-shard-size \"", max_shard_size,
                       "\" is not a positive size (e.g. 5GB, 500MiB)"));
    }
    options.max_shard_bytes = *bytes;
  }
  if (!dtype.empty()) {
    const std::string d = absl::AsciiStrToLower(dtype);
    if (d == "bf16") {
      options.dtype = DType::kBF16;
    } else if (d == "f16" || d == "fp16") {
      options.dtype = DType::kF16;
    } else if (d == "f32" || d == "fp32") {
      options.dtype = DType::kF32;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("dcp convert: --dtype must be bf16, f16 or f32, not \"",
                       dtype, "\""));
    }
  }
  if (threads < 1 || threads > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dcp convert: --threads must be between 1 and 1024, not ", threads));
  }
  options.threads = threads;
  options.progress = isatty(STDOUT_FILENO) != 0;
  return options;
}

absl::Status RunConvert(const std::string& src, const std::string& dst,
                        const ConvertOptions& options) {
  std::error_code ec;
  if (std::filesystem::exists(dst, ec) && std::filesystem::exists(src, ec) &&
      std::filesystem::equivalent(src, dst, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dcp convert: the source and the destination are the same: ", src));
  }
  if (options.to == "safetensors") return ToSafetensors(src, dst, options);
  if (options.to == "dcp") return ToDcp(src, dst, options);
  return absl::InvalidArgumentError(
      absl::StrCat("dcp convert: --to must be safetensors or dcp, not \"",
                   options.to, "\""));
}

}  // namespace dcp
