// HuggingFaceStorageWriter::Consolidate: the shards each rank wrote under
// sharded/ become full tensors, streamed. Each output tensor is produced in
// windows (boxes of whole trailing rows, at most a quarter of the thread's
// budget), each window filled from the shards' files by reading only the
// rows it needs, then appended to the output file, which is written front
// to back (append-only file systems take it). Memory per thread: one read
// piece, the windows in flight and the write buffers, each a quarter of
// consolidation_buffer_bytes / threads.
#include <algorithm>
#include <atomic>
#include <memory>

#include "absl/container/node_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "io/hf_storage.h"
#include "io/internal/commit_journal.h"
#include "io/internal/hf_internal.h"
#include "io/internal/sequential_writer.h"
#include "io/safetensors.h"

namespace dcp {
namespace {

using internal_hf::AlignedBuffer;

constexpr int64_t kGapBytes = int64_t{64} << 10;
constexpr int64_t kMinThreadBudget = int64_t{1} << 20;

// Bytes held by consolidation buffers now and at most.
class Meter {
 public:
  void Add(int64_t bytes) {
    const int64_t now = held_.fetch_add(bytes) + bytes;
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
  }
  void Remove(int64_t bytes) { held_.fetch_sub(bytes); }
  int64_t peak() const { return peak_.load(); }

 private:
  std::atomic<int64_t> held_{0};
  std::atomic<int64_t> peak_{0};
};

// A buffer counted by `meter` while it lives.
std::shared_ptr<AlignedBuffer> MeteredBuffer(int64_t size, Meter& meter) {
  meter.Add(size);
  return std::shared_ptr<AlignedBuffer>(new AlignedBuffer(size),
                                        [&meter](AlignedBuffer* b) {
                                          meter.Remove(b->size);
                                          delete b;
                                        });
}

// The input files of one thread, opened once.
class Inputs {
 public:
  explicit Inputs(FileSystemBase& fs) : fs_(fs) {}
  absl::StatusOr<File*> Get(const std::string& path) {
    auto it = files_.find(path);
    if (it != files_.end()) return it->second.get();
    OpenOptions options;
    options.exclusive = false;
    options.no_follow = true;
    DCP_ASSIGN_OR_RETURN(std::unique_ptr<File> file,
                         fs_.OpenForRead(path, options));
    return files_.emplace(path, std::move(file)).first->second.get();
  }

 private:
  FileSystemBase& fs_;
  absl::node_hash_map<std::string, std::unique_ptr<File>> files_;
};

}  // namespace

absl::Status HuggingFaceStorageWriter::Consolidate(
    const std::vector<std::string>& shard_files,
    std::vector<std::string>& outputs,
    std::map<std::string, std::string>& weight_map, int64_t& total_size) {
  std::vector<internal_hf::HfSource> sources;
  std::map<std::string, std::string> path_of;
  for (const std::string& relative : shard_files) {
    const std::string path = TempPath(relative);
    sources.push_back({relative, path});
    path_of[relative] = path;
  }
  DCP_ASSIGN_OR_RETURN(Metadata metadata,
                       internal_hf::BuildHfMetadata(*fs_, sources, {}));
  const auto& mapping = options_.fqn_to_index_mapping;
  int highest = 1;
  for (const auto& [fqn, index] : mapping) highest = std::max(highest, index);
  std::map<int, std::vector<std::string>> fqns_of;
  for (const auto& [fqn, value] : metadata.state_dict_metadata) {
    auto it = mapping.find(fqn);
    fqns_of[mapping.empty() || it == mapping.end() ? 1 : it->second].push_back(
        fqn);
  }
  weight_map.clear();
  total_size = 0;
  struct Output {
    std::string relative;
    std::vector<std::string> fqns;
  };
  std::vector<Output> files;
  for (auto& [index, fqns] : fqns_of) {
    files.push_back({HfFileName(index, highest), fqns});
    outputs.push_back(files.back().relative);
    for (const std::string& fqn : fqns) {
      weight_map[fqn] = files.back().relative;
      const auto& tensor =
          std::get<TensorStorageMetadata>(metadata.state_dict_metadata[fqn]);
      total_size += *CheckedNumBytes(tensor.properties.dtype, tensor.size);
    }
  }
  const int threads = static_cast<int>(std::min<size_t>(
      options_.thread_count_consolidation, std::max<size_t>(1, files.size())));
  const int64_t budget =
      std::max(kMinThreadBudget, options_.consolidation_buffer_bytes / threads);
  const int64_t quarter =
      internal_hf::AlignDown(budget / 4, internal_hf::kDirectIoAlignment);
  Meter meter;

  // Writes output file `out` (its temporary name) with `inputs` open.
  auto consolidate_file = [&](const Output& out, Inputs& inputs,
                              AlignedBuffer& piece) -> absl::Status {
    std::vector<SafetensorsTensor> layout;
    for (const std::string& fqn : out.fqns) {
      const auto& tensor =
          std::get<TensorStorageMetadata>(metadata.state_dict_metadata[fqn]);
      layout.push_back({fqn, tensor.properties.dtype, tensor.size});
    }
    SortForSafetensors(layout, internal_hf::kDirectIoAlignment);
    DCP_ASSIGN_OR_RETURN(
        std::string header,
        EncodeSafetensorsHeader(layout, {{"format", "pt"}},
                                internal_hf::kDirectIoAlignment));
    const std::string path = TempPath(out.relative);
    DCP_ASSIGN_OR_RETURN(std::unique_ptr<File> file, CreateTempFile(path));
    internal_io::SequentialWriterOptions writer_options = WriterOptions(*file);
    writer_options.chunk_bytes = std::clamp<int64_t>(
        internal_hf::AlignDown(quarter / 2, internal_hf::kDirectIoAlignment),
        internal_hf::kDirectIoAlignment, int64_t{8} << 20);
    writer_options.bounce_budget = quarter;
    writer_options.max_kept_bytes = quarter;
    meter.Add(quarter);  // What the writer's bounce chunks may hold.
    absl::Status status;
    {
      internal_io::SequentialWriter writer(*engine_, *file, writer_options);
      status = writer.Append(reinterpret_cast<const std::byte*>(header.data()),
                             static_cast<int64_t>(header.size()));
      for (const SafetensorsTensor& t : layout) {
        if (!status.ok()) break;
        const auto& tensor = std::get<TensorStorageMetadata>(
            metadata.state_dict_metadata[t.name]);
        const Shape& global = tensor.size;
        const int64_t es = static_cast<int64_t>(ElementSize(t.dtype));
        if (NumElements(global) == 0) continue;
        // Windows: fixed indices in dims [0, d), a run of `rows` indices in
        // dim d, whole trailing dims; dim d is the first whose trailing
        // block fits the window.
        const size_t n = global.size();
        const Shape strides = ContiguousStrides(global);
        size_t d = 0;
        while (d < n && strides[d] * es > quarter) ++d;
        const int64_t rows =
            d < n ? std::min(global[d],
                             std::max<int64_t>(1, quarter / (strides[d] * es)))
                  : 1;
        Shape offsets(n, 0), lengths = global;
        for (size_t j = 0; j < d && j < n; ++j) lengths[j] = 1;
        while (status.ok()) {
          if (d < n) lengths[d] = std::min(rows, global[d] - offsets[d]);
          const int64_t bytes = NumElements(lengths) * es;
          std::shared_ptr<AlignedBuffer> window = MeteredBuffer(bytes, meter);
          const TensorView view(window->data, t.dtype, lengths);
          for (size_t c = 0; c < tensor.chunks.size() && status.ok(); ++c) {
            const ChunkStorageMetadata& chunk = tensor.chunks[c];
            Shape lo(n), hi(n), in_chunk(n), in_window(n), box(n);
            bool empty = false;
            for (size_t j = 0; j < n; ++j) {
              lo[j] = std::max(offsets[j], chunk.offsets[j]);
              hi[j] = std::min(offsets[j] + lengths[j],
                               chunk.offsets[j] + chunk.sizes[j]);
              empty = empty || hi[j] <= lo[j];
              in_chunk[j] = lo[j] - chunk.offsets[j];
              in_window[j] = lo[j] - offsets[j];
              box[j] = hi[j] - lo[j];
            }
            if (empty) continue;
            const StorageInfo& info =
                metadata.storage_data.at(MetadataIndex(t.name, chunk.offsets));
            absl::StatusOr<File*> input =
                inputs.Get(path_of.at(info.relative_path));
            status = input.ok() ? internal_hf::ReadBoxFromFile(
                                      **input, info.offset, info.length,
                                      chunk.sizes, es, in_chunk, box, view,
                                      in_window, piece, kGapBytes)
                                : input.status();
          }
          if (status.ok()) {
            const std::byte* data = window->data;
            status = writer.Append(data, bytes, std::move(window));
          }
          // The next window: advance dim d by `rows`, then the odometer
          // of dims [0, d).
          if (d >= n) break;
          offsets[d] += lengths[d];
          if (offsets[d] < global[d]) continue;
          offsets[d] = 0;
          size_t j = d;
          while (j > 0 && ++offsets[j - 1] == global[j - 1]) offsets[--j] = 0;
          if (j == 0) break;
        }
      }
      absl::Status finished = writer.Finish();
      status.Update(finished);
    }
    meter.Remove(quarter);
    if (status.ok() && options_.sync_files) status = file->Sync();
    absl::Status closed = file->Close();
    status.Update(closed);
    return Annotate(status, absl::StrCat("consolidating into ", path));
  };

  internal_hf::FirstError error;
  std::atomic<size_t> next{0};
  internal_io::RunWorkers(
      internal_io::PoolOf(pool_, std::max(options_.thread_count,
                                          options_.thread_count_consolidation)),
      threads, [&](int) {
        Inputs inputs(*fs_);
        std::shared_ptr<AlignedBuffer> piece = MeteredBuffer(quarter, meter);
        for (size_t f = next++; f < files.size() && !error.failed();
             f = next++) {
          error.Update(consolidate_file(files[f], inputs, *piece));
        }
      });
  consolidation_peak_ = meter.peak();
  return error.status();
}

}  // namespace dcp
