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
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/dtype_convert.h"
#include "core/state_dict.h"
#include "core/status.h"
#include "engine/checkpoint.h"
#include "io/file_system.h"
#include "io/file_system_storage.h"
#include "io/hf_storage.h"
#include "io/quantized_dequant.h"
#include "io/safetensors.h"
#include "io/storage.h"
#include "io/storage_registry.h"
#include "nlohmann/json.hpp"
#include "planner/default_planner.h"
#include "planner/plan.h"
#include "planner/planner.h"
#include "tools/commands.h"

namespace dcp {
namespace {

using Json = nlohmann::json;

DType OutputDtype(DType d, const ConvertOptions& options) {
  return options.dtype.has_value() && IsConvertibleFloat(d) ? *options.dtype
                                                            : d;
}

// Makes `dst` an empty directory: true when it created it, false when it
// was one already. kAlreadyExists for anything else, kPermissionDenied
// when it cannot be created.
absl::StatusOr<bool> PrepareDestination(const std::string& dst) {
  std::error_code ec;
  if (std::filesystem::exists(dst, ec)) {
    if (!std::filesystem::is_directory(dst, ec)) {
      return absl::AlreadyExistsError(
          absl::StrCat("dcp convert: the destination ", dst,
                       " is a file, not a directory; choose a new one"));
    }
    if (!std::filesystem::is_empty(dst, ec)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "dcp convert: the destination ", dst,
          " exists and is not an empty directory; choose a new one"));
    }
    return false;
  }
  std::filesystem::create_directories(dst, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("dcp convert: cannot create ", dst, ": ", ec.message()));
  }
  return true;
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
  // Ends the line (once; later calls do nothing).
  void Finish() {
    if (enabled_ && !finished_) std::printf("\n");
    finished_ = true;
  }

 private:
  const bool enabled_;
  const int64_t total_;
  int64_t done_ = 0;
  bool finished_ = false;
};

// One window of a tensor, loaded in a batch: a box whose elements are
// contiguous in the tensor's row-major order (indices fixed in the leading
// dimensions, a run of one dimension, whole trailing dimensions).
struct Piece {
  const SafetensorsTensor* tensor = nullptr;  // Output name, dtype, shape.
  DType source = DType::kF32;
  Shape offsets, sizes;  // The box.
  int64_t bytes = 0;     // In the source dtype.
};

// Calls `emit(piece)`, in row-major order, for the windows `t` is read in:
// each at most `buffer_bytes` in the larger of its source and output dtypes
// (at least one element), runs of whole rows where a row fits, else runs
// of whole rows of the first dimension whose rows fit. A tensor with no
// elements has no window.
template <typename Emit>
void ForEachWindow(const SafetensorsTensor& t, DType source,
                   int64_t buffer_bytes, Emit emit) {
  const Shape& shape = t.shape;
  if (NumElements(shape) == 0) return;
  const int64_t widest =
      static_cast<int64_t>(std::max(ElementSize(source), ElementSize(t.dtype)));
  const int ndim = static_cast<int>(shape.size());
  // The first dimension d whose slices (elements of dims > d) fit.
  int d = 0;
  int64_t slice = 1;  // Elements of dims > d.
  for (int k = 1; k < ndim; ++k) slice *= shape[k];
  while (d + 1 < ndim && slice * widest > buffer_bytes) {
    ++d;
    slice /= shape[d];
  }
  const int64_t extent = ndim == 0 ? 1 : shape[d];
  const int64_t run =
      std::clamp<int64_t>(buffer_bytes / (slice * widest), 1, extent);
  Shape index(std::max(d, 0), 0);  // Over dims < d, row-major.
  while (true) {
    for (int64_t j = 0; j < extent; j += run) {
      Piece p{&t, source, Shape(ndim, 0), shape, 0};
      for (int k = 0; k < d; ++k) {
        p.offsets[k] = index[k];
        p.sizes[k] = 1;
      }
      if (ndim > 0) {
        p.offsets[d] = j;
        p.sizes[d] = std::min(run, extent - j);
      }
      p.bytes =
          NumElements(p.sizes) * static_cast<int64_t>(ElementSize(source));
      emit(p);
    }
    int k = d - 1;
    while (k >= 0 && ++index[k] == shape[k]) index[k--] = 0;
    if (k < 0) return;
  }
}

// Puts `p`'s box at `data` (in dtype `dtype`) into `state`: the tensor
// itself when the window is all of it, else a shard of a ShardedTensor
// (windows of one tensor share it).
// `prefix` goes before the tensor's name in `state`.
void AddPiece(StateDict& state, const Piece& p, std::byte* data, DType dtype,
              const std::string& prefix = "") {
  const Shape& shape = p.tensor->shape;
  const TensorView view(data, dtype, p.sizes);
  const std::string name = prefix + p.tensor->name;
  if (p.sizes == shape) {
    state[name] = Tensor::Wrap(view);
    return;
  }
  Shard shard{p.offsets, Tensor::Wrap(view)};
  auto [it, added] = state.try_emplace(name);
  if (added) {
    it->second = ShardedTensor(dtype, shape, {std::move(shard)});
  } else {
    it->second.sharded_tensor().mutable_local_shards().push_back(
        std::move(shard));
  }
}

// Loads the source bytes of `batch` from `reader` into `buffer`, the pieces
// one after another; the source names each tensor `prefix` + its name.
absl::Status LoadPieces(StorageReader& reader, const std::vector<Piece>& batch,
                        std::byte* buffer, const std::string& prefix = "") {
  StateDict state;
  int64_t offset = 0;
  for (const Piece& p : batch) {
    AddPiece(state, p, buffer + offset, p.source, prefix);
    offset += p.bytes;
  }
  LoadOptions load;
  load.storage_reader = &reader;
  load.no_dist = true;
  return Load(state, load);
}

// The reader of the dcp checkpoint `src`: a dcp directory (read on
// `threads` threads) or any other the storage registry loads from (a MEGA
// directory or mega:// URI).
absl::StatusOr<std::unique_ptr<StorageReader>> SourceReader(
    const std::string& src, int threads) {
  const StorageRegistry& registry = StorageRegistry::Default();
  DCP_ASSIGN_OR_RETURN(const std::string backend,
                       registry.BackendFor(src, /*for_load=*/true));
  if (backend != "native") return registry.CreateReader(src);
  FileSystemReaderOptions options;
  options.thread_count = threads;
  auto reader = std::make_unique<FileSystemReader>(src, options);
  DCP_RETURN_IF_ERROR(reader->Reset(src));
  return reader;
}

absl::Status ToSafetensors(const std::string& src, const std::string& dst,
                           const ConvertOptions& options) {
  DCP_ASSIGN_OR_RETURN(std::unique_ptr<StorageReader> source,
                       SourceReader(src, options.threads));
  StorageReader& reader = *source;
  DCP_ASSIGN_OR_RETURN(Metadata metadata, reader.ReadMetadata());
  // Windows are sized from the tensors' shapes: one its chunks do not
  // cover would be loaded (and allocated) before the load refuses it.
  const std::vector<std::string> uncovered = UncoveredTensors(metadata);
  if (!uncovered.empty()) {
    return absl::DataLossError(absl::StrCat(
        "dcp convert: ", src, ": ", uncovered.front(), " (damaged metadata?)"));
  }

  // Files in name order, split at max_shard_bytes.
  struct OutFile {
    std::vector<SafetensorsTensor> layout;
    int64_t bytes = 0;
  };
  std::vector<OutFile> files(1);
  std::map<std::string, DType> source_dtype;
  int64_t total = 0, source_total = 0;
  // With a prefix, the tensors under it, named without it.
  const std::string under =
      options.prefix.empty() ? "" : absl::StrCat(options.prefix, ".");
  std::vector<std::string> skipped;  // Non-tensor values, said below.
  for (const auto& [source_name, entry] : metadata.state_dict_metadata) {
    if (!under.empty() && source_name == options.prefix) {
      skipped.push_back(source_name);  // Its name without the prefix: "".
      continue;
    }
    if (!absl::StartsWith(source_name, under)) continue;
    const std::string name = source_name.substr(under.size());
    const auto* t = std::get_if<TensorStorageMetadata>(&entry);
    if (t == nullptr) {
      skipped.push_back(source_name);
      continue;
    }
    if (!InSafetensors(t->properties.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dcp convert: tensor ", name, " of ", src, " is ",
          DTypeName(t->properties.dtype), ", which safetensors cannot hold"));
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

  if (source_dtype.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("dcp convert: ", src, " holds no tensors",
                     under.empty() ? "" : absl::StrCat(" named ", under, "*"),
                     ": a safetensors file would hold nothing"));
  }
  DCP_ASSIGN_OR_RETURN(const bool created, PrepareDestination(dst));
  for (const std::string& name : skipped) {
    std::fprintf(stderr,
                 name == options.prefix
                     ? "dcp convert: skipping %s, named the --prefix itself "
                       "(nothing is left of its name)\n"
                     : "dcp convert: skipping %s, a non-tensor value "
                       "(safetensors holds tensors only)\n",
                 name.c_str());
  }
  FileSystemBase& fs =
      options.file_system != nullptr ? *options.file_system : LocalFileSystem();
  // The files' final names, the index last, and their temporary names.
  const int count = static_cast<int>(files.size());
  std::vector<std::string> names, temps;
  for (int f = 0; f < count; ++f) names.push_back(HfFileName(f + 1, count));
  names.push_back(kHfIndexFileName);
  for (const std::string& name : names) {
    temps.push_back(JoinPath(dst, absl::StrCat(".", name, ".tmp")));
  }

  Progress progress(options.progress, source_total);
  auto run = [&]() -> absl::Status {
    Json weight_map = Json::object();
    std::vector<std::byte> buffer, converted;
    for (int f = 0; f < count; ++f) {
      OutFile& file = files[f];
      SortForSafetensors(file.layout);
      DCP_ASSIGN_OR_RETURN(
          std::string header,
          EncodeSafetensorsHeader(file.layout, {{"format", "pt"}}));
      DCP_ASSIGN_OR_RETURN(std::unique_ptr<File> out,
                           fs.OpenForWrite(temps[f], OpenOptions{}));
      int64_t at = 0;
      auto append = [&](const std::byte* data, int64_t bytes) -> absl::Status {
        DCP_RETURN_IF_ERROR(
            out->PWrite(at, {data, static_cast<size_t>(bytes)}));
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
        DCP_RETURN_IF_ERROR(LoadPieces(reader, batch, buffer.data(), under));
        int64_t offset = 0;
        for (const Piece& p : batch) {
          const std::byte* data = buffer.data() + offset;
          offset += p.bytes;
          progress.Add(p.bytes);
          if (p.source == p.tensor->dtype) {
            DCP_RETURN_IF_ERROR(append(data, p.bytes));
            continue;
          }
          const int64_t n =
              p.bytes / static_cast<int64_t>(ElementSize(p.source));
          converted.resize(n * ElementSize(p.tensor->dtype));
          ConvertElements(data, p.source, n, converted.data(), p.tensor->dtype);
          DCP_RETURN_IF_ERROR(
              append(converted.data(), static_cast<int64_t>(converted.size())));
        }
        batch.clear();
        batch_bytes = 0;
        return absl::OkStatus();
      };
      absl::Status status;
      for (const SafetensorsTensor& t : file.layout) {
        ForEachWindow(t, source_dtype.at(t.name), options.buffer_bytes,
                      [&](const Piece& p) {
                        if (!status.ok()) return;
                        if (batch_bytes > 0 &&
                            batch_bytes + p.bytes > options.buffer_bytes) {
                          status = flush();
                        }
                        batch.push_back(p);
                        batch_bytes += p.bytes;
                      });
        DCP_RETURN_IF_ERROR(status);
      }
      DCP_RETURN_IF_ERROR(flush());
      DCP_RETURN_IF_ERROR(out->Sync());
      DCP_RETURN_IF_ERROR(out->Close());
      for (const SafetensorsTensor& t : file.layout) {
        weight_map[t.name] = names[f];
      }
    }
    progress.Finish();

    const Json index = {{"metadata", {{"total_size", total}}},
                        {"weight_map", weight_map}};
    const std::string text = index.dump(2);
    {
      DCP_ASSIGN_OR_RETURN(std::unique_ptr<File> out,
                           fs.OpenForWrite(temps[count], OpenOptions{}));
      DCP_RETURN_IF_ERROR(out->PWrite(
          0, {reinterpret_cast<const std::byte*>(text.data()), text.size()}));
      DCP_RETURN_IF_ERROR(out->Sync());
      DCP_RETURN_IF_ERROR(out->Close());
    }
    // The commit: the index first, made durable, then the files it names.
    // A directory interrupted in between has an index naming files that
    // are not there, which readers refuse; never files without an index,
    // which readers take for the whole checkpoint (they fall back to every
    // *.safetensors file).
    DCP_RETURN_IF_ERROR(fs.Rename(temps[count], JoinPath(dst, names[count])));
    DCP_RETURN_IF_ERROR(fs.SyncDir(dst));
    for (int f = 0; f < count; ++f) {
      DCP_RETURN_IF_ERROR(fs.Rename(temps[f], JoinPath(dst, names[f])));
    }
    return fs.SyncDir(dst);
  };
  absl::Status status = run();
  if (!status.ok()) {
    progress.Finish();
    // Nothing stays behind, so that the same command can run again: every
    // name this conversion may have created (DST was empty), the files
    // before the index (an interrupted clean-up leaves what an interrupted
    // commit does), then DST itself when it was made here.
    for (int f = 0; f <= count; ++f) {
      fs.RemoveFile(JoinPath(dst, names[f])).IgnoreError();
    }
    for (const std::string& temp : temps) fs.RemoveFile(temp).IgnoreError();
    if (created) {
      std::error_code ec;
      std::filesystem::remove(dst, ec);  // Only when empty.
    }
    return status;
  }
  std::printf("converted %s to %s: %zu tensors in %d files, %lld bytes\n",
              src.c_str(), dst.c_str(), source_dtype.size(), count,
              static_cast<long long>(total));
  return absl::OkStatus();
}

// The windows of one save, written together: their source bytes at
// source_offset of the load buffer, and converted ones at output_offset of
// the output buffer.
struct Batch {
  std::vector<Piece> pieces;
  std::vector<int64_t> output_offsets;  // -1: saved from the load buffer.
  int64_t source_bytes = 0;
  int64_t output_bytes = 0;
};

// Converts the Hugging Face directory `src` into a dcp checkpoint in `dst`
// with one save whose data is produced batch by batch: the state dict the
// planner sees holds views into two buffers (the loaded source bytes and
// the converted ones) that every batch reuses, and the writer's WriteData
// runs once per batch, under a file prefix of its own, after that batch was
// loaded. The metadata, planned once for the whole state, is committed at
// the end; a failure removes every file written.
absl::Status ToDcp(const std::string& src, const std::string& dst,
                   const ConvertOptions& options) {
  HuggingFaceStorageReaderOptions reader_options;
  reader_options.thread_count = options.threads;
  HuggingFaceStorageReader reader(src, reader_options);
  DCP_ASSIGN_OR_RETURN(Metadata source_metadata, reader.ReadMetadata());
  DCP_RETURN_IF_ERROR(PrepareDestination(dst).status());

  std::vector<SafetensorsTensor> tensors;  // In the output dtype.
  std::vector<DType> sources;
  tensors.reserve(source_metadata.state_dict_metadata.size());
  int64_t total = 0;
  for (const auto& [name, entry] : source_metadata.state_dict_metadata) {
    const auto& t = std::get<TensorStorageMetadata>(entry);
    tensors.push_back({name, OutputDtype(t.properties.dtype, options), t.size});
    sources.push_back(t.properties.dtype);
    total += CheckedNumBytes(t.properties.dtype, t.size).value_or(0);
  }

  // Windows in batches of at most buffer_bytes loaded (and as many
  // converted); a batch holds whole windows, at least one.
  std::vector<Batch> batches(1);
  int64_t max_source = 0, max_output = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    ForEachWindow(
        tensors[i], sources[i], options.buffer_bytes, [&](const Piece& p) {
          const int64_t n =
              p.bytes / static_cast<int64_t>(ElementSize(p.source));
          const int64_t converted =
              p.source == p.tensor->dtype
                  ? 0
                  : n * static_cast<int64_t>(ElementSize(p.tensor->dtype));
          Batch* b = &batches.back();
          if (!b->pieces.empty() &&
              (b->source_bytes + p.bytes > options.buffer_bytes ||
               b->output_bytes + converted > options.buffer_bytes)) {
            b = &batches.emplace_back();
          }
          b->pieces.push_back(p);
          b->output_offsets.push_back(converted > 0 ? b->output_bytes : -1);
          b->source_bytes += p.bytes;
          b->output_bytes += converted;
          max_source = std::max(max_source, b->source_bytes);
          max_output = std::max(max_output, b->output_bytes);
        });
  }
  const Tensor source_buffer = Tensor::Empty(DType::kU8, {max_source});
  const Tensor output_buffer = Tensor::Empty(DType::kU8, {max_output});
  auto* const loaded = static_cast<std::byte*>(source_buffer.data());
  auto* const output = static_cast<std::byte*>(output_buffer.data());

  // What the planner saves: every window as a view into the buffers (a
  // batch's bytes are there while its WriteData runs), tensors without
  // elements as themselves.
  StateDict state;
  std::map<std::pair<std::string, Shape>, size_t> batch_of;  // name, offsets
  for (size_t b = 0; b < batches.size(); ++b) {
    int64_t offset = 0;
    for (size_t k = 0; k < batches[b].pieces.size(); ++k) {
      const Piece& p = batches[b].pieces[k];
      const int64_t out = batches[b].output_offsets[k];
      AddPiece(state, p, out < 0 ? loaded + offset : output + out,
               p.tensor->dtype);
      batch_of[{p.tensor->name, p.offsets}] = b;
      offset += p.bytes;
    }
  }
  for (const SafetensorsTensor& t : tensors) {
    if (NumElements(t.shape) == 0)
      state[t.name] = Tensor::Empty(t.dtype, t.shape);
  }

  FileSystemWriterOptions writer_options;
  writer_options.thread_count = options.threads;
  FileSystemWriter writer(dst, writer_options);
  DefaultSavePlanner planner;
  Progress progress(options.progress, total);
  auto run = [&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(writer.Reset(dst));
    DCP_RETURN_IF_ERROR(planner.SetUp(state, writer.GetStorageMeta(),
                                      /*is_coordinator=*/true));
    DCP_RETURN_IF_ERROR(writer.SetUp(/*is_coordinator=*/true, /*rank=*/0,
                                     /*use_collectives=*/false));
    DCP_ASSIGN_OR_RETURN(SavePlan local, planner.CreateLocalPlan());
    DCP_ASSIGN_OR_RETURN(local, writer.PrepareLocalPlan(std::move(local)));
    std::vector<SavePlan> locals;
    locals.push_back(std::move(local));
    DCP_ASSIGN_OR_RETURN(SharedGlobalSavePlan global,
                         planner.CreateSharedGlobalPlan(std::move(locals)));
    DCP_ASSIGN_OR_RETURN(SavePlan final_plan,
                         planner.FinishPlan(std::move(global.plans.at(0))));
    // One plan per batch; the writer names each one's files apart.
    std::vector<SavePlan> plans(batches.size());
    for (WriteItem& item : final_plan.items) {
      const Shape offsets = item.tensor_data.has_value()
                                ? item.tensor_data->chunk.offsets
                                : Shape{};
      auto it = batch_of.find({item.index.fqn, offsets});
      plans[it == batch_of.end() ? 0 : it->second].items.push_back(
          std::move(item));
    }
    DCP_ASSIGN_OR_RETURN(plans, writer.PrepareGlobalPlan(std::move(plans)));
    Metadata metadata = *global.metadata;
    global.metadata.reset();
    std::vector<std::vector<WriteResult>> results;
    for (size_t b = 0; b < batches.size(); ++b) {
      const Batch& batch = batches[b];
      if (!batch.pieces.empty()) {
        DCP_RETURN_IF_ERROR(LoadPieces(reader, batch.pieces, loaded));
      }
      int64_t offset = 0;
      for (size_t k = 0; k < batch.pieces.size(); ++k) {
        const Piece& p = batch.pieces[k];
        if (batch.output_offsets[k] >= 0) {
          ConvertElements(loaded + offset, p.source,
                          p.bytes / static_cast<int64_t>(ElementSize(p.source)),
                          output + batch.output_offsets[k], p.tensor->dtype);
        }
        offset += p.bytes;
      }
      DCP_ASSIGN_OR_RETURN(std::vector<WriteResult> written,
                           writer.WriteData(plans[b], planner).Wait());
      results.push_back(std::move(written));
      progress.Add(batch.source_bytes);
    }
    writer.DescribeCommit(metadata);
    DCP_RETURN_IF_ERROR(writer.Finish(metadata, results));
    return writer.MarkCommitted();
  };
  absl::Status status = run();
  progress.Finish();
  if (!status.ok()) {
    writer.Abort();
    return status;
  }
  std::printf(
      "converted %s to %s: %zu tensors in %zu batches, %lld bytes "
      "loaded\n",
      src.c_str(), dst.c_str(), tensors.size(), batches.size(),
      static_cast<long long>(total));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ConvertOptions> ParseConvertFlags(
    const std::string& to, const std::string& max_shard_size,
    const std::string& dtype, int threads, const std::string& prefix) {
  ConvertOptions options;
  if (to != "safetensors" && to != "dcp") {
    return absl::InvalidArgumentError(absl::StrCat(
        "dcp convert: --to must be safetensors or dcp, not \"", to, "\""));
  }
  options.to = to;
  if (!prefix.empty() && to != "safetensors") {
    return absl::InvalidArgumentError(
        "dcp convert: --prefix picks tensors of a dcp checkpoint for "
        "--to safetensors");
  }
  if (absl::StartsWith(prefix, ".") || absl::EndsWith(prefix, ".") ||
      absl::StrContains(prefix, "..")) {
    return absl::InvalidArgumentError(
        absl::StrCat("dcp convert: --prefix \"", prefix,
                     "\" is a name without its dots around (e.g. model)"));
  }
  options.prefix = prefix;
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
  DCP_RETURN_IF_ERROR(RefuseNonCheckpointSource(src));
  if (options.to == "safetensors") return ToSafetensors(src, dst, options);
  if (options.to == "dcp") return ToDcp(src, dst, options);
  return absl::InvalidArgumentError(
      absl::StrCat("dcp convert: --to must be safetensors or dcp, not \"",
                   options.to, "\""));
}

}  // namespace dcp
