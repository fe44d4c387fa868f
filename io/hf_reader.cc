// HuggingFaceStorageReader (io/hf_storage.h): metadata from safetensors
// headers, and reads through the I/O engine in windows of bounce buffers,
// as FileSystemReader reads (without checksums, which safetensors lacks).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "core/box_copy.h"
#include "core/status.h"
#include "io/fs_read_plan.h"
#include "io/fs_read_window.h"
#include "io/hf_storage.h"
#include "io/internal/commit_journal.h"
#include "io/internal/hf_internal.h"
#include "io/internal/storage_resources.h"
#include "staging/device_box_upload.h"
#include "staging/device_staging.h"

namespace dcp {
namespace {

using internal_fs::OpenFiles;
using internal_hf::AlignDown;
using internal_hf::AlignedBuffer;
using internal_hf::AlignUp;
using internal_hf::kDirectIoAlignment;

constexpr int64_t kReadPieceBytes = int64_t{16} << 20;
constexpr int64_t kReadGapBytes = int64_t{64} << 10;

// Bounce buffers in power-of-two sizes, reused from piece to piece: a fresh
// 16 MiB buffer per piece costs page faults and the kernel's zeroing of
// every page, as much CPU as the copy out of it.
class BouncePool {
 public:
  static int64_t SizeFor(int64_t bytes) {
    int64_t size = 2 * kDirectIoAlignment;
    while (size < bytes) size <<= 1;
    return size;
  }
  std::unique_ptr<AlignedBuffer> Get(int64_t bytes) {
    const int64_t size = SizeFor(bytes);
    {
      absl::MutexLock lock(&mu_);
      auto& free = free_[size];
      if (!free.empty()) {
        std::unique_ptr<AlignedBuffer> buffer = std::move(free.back());
        free.pop_back();
        return buffer;
      }
    }
    return std::make_unique<AlignedBuffer>(size);
  }
  void Put(std::unique_ptr<AlignedBuffer> buffer) {
    if (buffer == nullptr) return;
    absl::MutexLock lock(&mu_);
    free_[buffer->size].push_back(std::move(buffer));
  }

 private:
  absl::Mutex mu_;
  std::map<int64_t, std::vector<std::unique_ptr<AlignedBuffer>>> free_
      ABSL_GUARDED_BY(mu_);
};

// A stored tensor chunk the plan reads, its uses (what a FileSystemReader
// keeps of one; safetensors have no extensions or checksums, so `decoders`
// and `block_starts` stay empty) and its open file.
struct Stored : internal_fs::StoredItem {
  const OpenFiles::Entry* file = nullptr;
};

// One read: chunk elements [first, end) of `stored`, straight into the
// destination (zero copy) or through a bounce buffer.
struct Piece {
  Stored* stored = nullptr;
  int64_t first = 0, end = 0;
  bool zero_copy = false;
  // Zero copy through the page cache: O_DIRECT cannot move a tensor that
  // does not start 4 KiB aligned in its file into its destination.
  File* buffered = nullptr;
  std::byte* target = nullptr;  // Where element `first` lands.
  std::unique_ptr<AlignedBuffer> buffer;
  int64_t lead = 0;  // Bytes before `target` in `buffer`.
  int64_t body = 0;  // Zero copy with O_DIRECT: bytes read in place.
  std::unique_ptr<AlignedBuffer> tail;
  int64_t buffer_bytes = 0;  // Bounce bytes it will take.
  std::vector<IoRequest> requests;
  std::vector<Future<size_t>> reads;
};

// Builds the read requests of `piece`, allocating its buffers.
void PreparePiece(bool direct, BouncePool& pool,
                  std::atomic<int64_t>& bounce_held, Piece& piece) {
  const Stored& s = *piece.stored;
  const int64_t es = static_cast<int64_t>(s.element_size);
  File* file = s.file->file.get();
  const int64_t offset = s.info->offset + piece.first * es;
  const int64_t length = (piece.end - piece.first) * es;
  if (piece.zero_copy) {
    if (!direct || piece.buffered != nullptr) {
      piece.requests.push_back(
          IoRequest::Read(piece.buffered != nullptr ? piece.buffered : file,
                          offset, piece.target, length));
      return;
    }
    piece.body = AlignDown(length, kDirectIoAlignment);
    if (piece.body > 0) {
      piece.requests.push_back(
          IoRequest::Read(file, offset, piece.target, piece.body));
    }
    if (piece.body < length) {
      piece.tail = std::make_unique<AlignedBuffer>(kDirectIoAlignment);
      piece.requests.push_back(IoRequest::Read(
          file, offset + piece.body, piece.tail->data, kDirectIoAlignment));
    }
    return;
  }
  const int64_t start = direct ? AlignDown(offset, kDirectIoAlignment) : offset;
  const int64_t end =
      direct ? AlignUp(offset + length, kDirectIoAlignment) : offset + length;
  piece.buffer = pool.Get(end - start);
  bounce_held += piece.buffer->size;
  piece.lead = offset - start;
  piece.target = piece.buffer->data + piece.lead;
  piece.requests.push_back(
      IoRequest::Read(file, start, piece.buffer->data, end - start));
}

// Waits for `piece`'s reads, checks they delivered every byte, and copies
// its boxes out; the stored chunk's last piece commits its host uses.
absl::Status FinishPiece(Piece& piece, LoadPlanner& planner,
                         std::atomic<int64_t>& bytes_read) {
  Stored& s = *piece.stored;
  const int64_t es = static_cast<int64_t>(s.element_size);
  const int64_t length = (piece.end - piece.first) * es;
  // Every read is waited for: the piece's buffers must outlive them.
  DCP_ASSIGN_OR_RETURN(const std::vector<size_t> done, WaitAll(piece.reads));
  const std::vector<int64_t> got(done.begin(), done.end());
  int64_t arrived = 0;
  if (piece.tail != nullptr) {
    const int64_t body_got = piece.body > 0 ? got.front() : 0;
    arrived = body_got;
    if (body_got == piece.body) {
      const int64_t tail_got = std::min(got.back(), length - piece.body);
      std::memcpy(piece.target + piece.body, piece.tail->data, tail_got);
      arrived += tail_got;
    }
  } else if (!got.empty()) {
    arrived = std::clamp<int64_t>(got.front() - piece.lead, 0, length);
  }
  bytes_read += arrived;
  if (arrived != length) {
    return absl::DataLossError(absl::StrCat(
        s.file->file->path(), " is truncated: ", s.index->ToString(),
        " needs bytes [", s.info->offset, ", ", s.info->offset + s.info->length,
        ") but the file ends at offset ",
        s.info->offset + piece.first * es + arrived));
  }
  if (!piece.zero_copy) {
    for (size_t u = 0; u < s.uses.size(); ++u) {
      const ReadItem& item = *s.uses[u];
      const TensorView& dest = s.dests[u];
      DCP_RETURN_IF_ERROR(Annotate(
          dest.device().is_cpu()
              ? CopyBoxPart(piece.target, piece.first, piece.end, s.chunk_sizes,
                            item.storage_offsets, s.element_size, dest,
                            item.dest_offsets, item.lengths)
              : UploadBoxPart(*s.staging, piece.target, piece.first, piece.end,
                              s.chunk_sizes, item.storage_offsets,
                              s.element_size, dest, item.dest_offsets,
                              item.lengths),
          absl::StrCat("loading ", item.storage_index.ToString(), " into ",
                       item.dest_index.ToString())));
    }
  }
  piece.tail.reset();
  if (s.pieces_left->fetch_sub(1) != 1 || s.staging != nullptr) {
    return absl::OkStatus();
  }
  for (size_t u = 0; u < s.uses.size(); ++u) {
    DCP_RETURN_IF_ERROR(planner.CommitTensor(*s.uses[u], s.dests[u]));
  }
  return absl::OkStatus();
}

}  // namespace

HuggingFaceStorageReader::HuggingFaceStorageReader(
    std::string path, HuggingFaceStorageReaderOptions options)
    : path_(std::move(path)),
      options_(options),
      fs_(internal_io::OrLocal(options.file_system)) {
  options_.thread_count = std::max(1, options_.thread_count);
  engine_ = internal_io::EngineOrOwn(options_.io_engine, options_.io_mode,
                                     owned_engine_, engine_error_);
}

HuggingFaceStorageReader::~HuggingFaceStorageReader() = default;

absl::Status HuggingFaceStorageReader::Reset(const std::string& checkpoint_id) {
  if (!checkpoint_id.empty()) path_ = checkpoint_id;
  metadata_.reset();
  return absl::OkStatus();
}

absl::StatusOr<Metadata> HuggingFaceStorageReader::ReadMetadata() {
  return internal_io::DescribeWhileCommitsMayRun(
      [this] { return DescribeFiles(); });
}

absl::StatusOr<Metadata> HuggingFaceStorageReader::DescribeFiles() {
  std::map<std::string, std::string> weight_map;
  DCP_ASSIGN_OR_RETURN(std::vector<std::string> files,
                       ResolveHfCheckpointFiles(*fs_, path_, &weight_map));
  std::vector<internal_hf::HfSource> sources;
  for (const std::string& relative : files) {
    sources.push_back({relative, JoinPath(path_, relative)});
  }
  DCP_ASSIGN_OR_RETURN(Metadata metadata,
                       internal_hf::BuildHfMetadata(*fs_, sources, weight_map));
  metadata.storage_meta = StorageMeta{};
  metadata.storage_meta->checkpoint_id = path_;
  return metadata;
}

absl::Status HuggingFaceStorageReader::SetUp(const Metadata& metadata,
                                             bool /*is_coordinator*/) {
  DCP_RETURN_IF_ERROR(engine_error_);
  metadata_ = metadata;
  return absl::OkStatus();
}

absl::StatusOr<LoadPlan> HuggingFaceStorageReader::PrepareLocalPlan(
    LoadPlan plan) {
  return plan;
}

absl::StatusOr<std::vector<LoadPlan>>
HuggingFaceStorageReader::PrepareGlobalPlan(std::vector<LoadPlan> plans) {
  return plans;
}

Future<void> HuggingFaceStorageReader::ReadData(const LoadPlan& plan,
                                                LoadPlanner& planner) {
  Future<void> read = ReadFiles(plan, planner);  // Ready: the call blocks.
  const absl::Status& status = read.Wait();
  // Files another save's commit replaced or removed after this reader
  // described them (their headers now place the tensors elsewhere): not
  // damage. Only where the bytes lie is compared: a reader wrapping this
  // one (the quantized reader) sets it up with other dtypes.
  if (!(absl::IsDataLoss(status) || absl::IsNotFound(status)) ||
      !metadata_.has_value()) {
    return read;
  }
  absl::StatusOr<Metadata> now = ReadMetadata();
  if (!now.ok() || now->storage_data == metadata_->storage_data) return read;
  return Future<void>::Ready(
      ReplacedWhileReading(path_, status, /*removed=*/false));
}

Future<void> HuggingFaceStorageReader::ReadFiles(const LoadPlan& plan,
                                                 LoadPlanner& planner) {
  if (!metadata_.has_value()) {
    return Future<void>::Ready(absl::FailedPreconditionError(
        "HuggingFaceStorageReader::ReadData before SetUp"));
  }
  const Metadata& metadata = *metadata_;
  const bool direct = options_.direct_io;
  OpenOptions open_options;
  open_options.exclusive = false;
  open_options.direct = direct;
  open_options.uncached = options_.uncached_reads;
  open_options.no_follow = !internal_hf::kHfReadersFollowLinks;
  OpenFiles files(*fs_, path_, open_options);
  OpenOptions buffered_options = open_options;
  buffered_options.direct = false;
  OpenFiles buffered_files(*fs_, path_, buffered_options);
  auto fail = [](absl::Status status) {
    return Future<void>::Ready(std::move(status));
  };

  for (const ReadItem& item : plan.items) {
    if (item.type != LoadItemType::kTensor) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("the Hugging Face checkpoint ", path_,
                       " holds tensors only; the plan reads the value ",
                       item.storage_index.ToString())));
    }
  }
  // Group the read items by the stored chunk they use; check each chunk
  // against its file before anything is allocated for it.
  absl::StatusOr<std::vector<internal_fs::StoredItem>> grouped =
      internal_fs::GroupReadItems(
          plan, metadata, path_,
          [&](const MetadataIndex& index,
              const StorageInfo& where) -> absl::Status {
            if (where.offset < 0 || where.length < 0 ||
                where.offset > INT64_MAX - where.length) {
              return absl::DataLossError(absl::StrCat(
                  "the metadata of ", path_, " places ", index.ToString(),
                  " at offset ", where.offset, " length ", where.length, " of ",
                  where.relative_path));
            }
            // Checked once here: buffered_files opens only paths files
            // opened.
            DCP_RETURN_IF_ERROR(
                internal_hf::CheckRelativePath(where.relative_path));
            DCP_ASSIGN_OR_RETURN(const OpenFiles::Entry* file,
                                 files.Get(where.relative_path));
            if (where.offset + where.length > file->size) {
              return absl::DataLossError(absl::StrCat(
                  file->file->path(), " is truncated: ", index.ToString(),
                  " needs bytes [", where.offset, ", ",
                  where.offset + where.length, ") but the file ends at offset ",
                  file->size));
            }
            return absl::OkStatus();
          });
  if (!grouped.ok()) return fail(grouped.status());
  std::deque<Stored> stored;
  for (internal_fs::StoredItem& item : *grouped) {
    absl::StatusOr<const OpenFiles::Entry*> file =
        files.Get(item.info->relative_path);  // Opened by the check.
    if (!file.ok()) return fail(file.status());
    Stored& s = stored.emplace_back();
    static_cast<internal_fs::StoredItem&>(s) = std::move(item);
    s.file = *file;
  }

  // Plan the pieces: destinations resolved once, boxes checked.
  auto device_staging = [&]() {
    return internal_io::ReadStaging(options_.device_staging, owned_staging_);
  };
  DeviceStaging* staging_used = nullptr;
  const int64_t piece_bytes = std::min(
      kReadPieceBytes, std::max<int64_t>(1, options_.read_window_bytes));
  // Pieces are planned as the windows reach their stored chunk (a deque:
  // pieces in flight keep their place as more are added), so the
  // temporaries a planner hands out for destinations (a converting load)
  // count against the window too.
  std::deque<Piece> pieces;
  auto plan_stored = [&](Stored& s) -> absl::Status {
    s.pieces_left = std::make_unique<std::atomic<int64_t>>(0);
    int64_t temporary_bytes = 0;
    for (const ReadItem* item : s.uses) {
      absl::StatusOr<TensorView> dest = planner.ResolveTensor(*item);
      if (!dest.ok()) return dest.status();
      temporary_bytes += planner.TemporaryBytes(*item);
      const std::string what =
          absl::StrCat("loading ", item->storage_index.ToString(), " into ",
                       item->dest_index.ToString());
      if (!dest->device().is_cpu() && s.staging == nullptr) {
        absl::StatusOr<DeviceStaging*> staging = device_staging();
        if (!staging.ok()) return Annotate(staging.status(), what);
        s.staging = staging_used = *staging;
      }
      absl::Status box = CopyBoxPart(
          nullptr, 0, 0, s.chunk_sizes, item->storage_offsets, s.element_size,
          AsHostView(*dest), item->dest_offsets, item->lengths);
      if (!box.ok()) return Annotate(box, what);
      s.dests.push_back(*std::move(dest));
    }
    const TensorView& dest = s.dests.front();
    if (internal_fs::FillsWholeHostTensor(s, dest) && s.info->length > 0) {
      File* buffered = nullptr;
      if (direct &&
          (reinterpret_cast<uintptr_t>(dest.data()) % kDirectIoAlignment != 0 ||
           s.info->offset % kDirectIoAlignment != 0)) {
        absl::StatusOr<const OpenFiles::Entry*> file =
            buffered_files.Get(s.info->relative_path);
        if (!file.ok()) return file.status();
        buffered = (*file)->file.get();
      }
      Piece& piece = pieces.emplace_back();
      piece.stored = &s;
      piece.end = NumElements(s.chunk_sizes);
      piece.zero_copy = true;
      piece.buffered = buffered;
      piece.target = static_cast<std::byte*>(dest.data());
      piece.buffer_bytes = temporary_bytes;
      s.pieces_left->fetch_add(1);
      return absl::OkStatus();
    }
    const int64_t es = static_cast<int64_t>(s.element_size);
    std::vector<std::pair<int64_t, int64_t>> runs;
    for (const ReadItem* item : s.uses) {
      internal_hf::BoxRuns(s.chunk_sizes, item->storage_offsets, item->lengths,
                           kReadGapBytes / es, runs);
    }
    // Pieces whose 4 KiB aligned extent fits a piece_bytes buffer.
    const size_t first_piece = pieces.size();
    for (const auto& [begin, end] : internal_hf::MergeAndSplit(
             std::move(runs), kReadGapBytes / es,
             std::max<int64_t>(piece_bytes - 2 * kDirectIoAlignment, 1) / es)) {
      Piece& piece = pieces.emplace_back();
      piece.stored = &s;
      piece.first = begin;
      piece.end = end;
      piece.buffer_bytes =
          BouncePool::SizeFor((end - begin) * es + 2 * kDirectIoAlignment);
      s.pieces_left->fetch_add(1);
    }
    if (pieces.size() > first_piece) {
      pieces[first_piece].buffer_bytes += temporary_bytes;
    }
    if (*s.pieces_left == 0) {  // Only empty boxes: nothing to read.
      for (size_t u = 0; u < s.uses.size(); ++u) {
        DCP_RETURN_IF_ERROR(planner.CommitTensor(*s.uses[u], s.dests[u]));
      }
    }
    return absl::OkStatus();
  };

  // Windows of at most read_window_bytes of bounce buffers: window w + 1
  // is read while window w is copied out on thread_count threads.
  internal_hf::FirstError error;
  BouncePool pool;
  std::atomic<int64_t> bounce_held{0};
  std::atomic<int64_t> bytes_read{0};
  int64_t peak = 0;
  const int64_t window_bytes = std::max<int64_t>(1, options_.read_window_bytes);
  size_t next = 0;
  size_t next_stored = 0;
  auto submit_window = [&]() -> std::pair<size_t, size_t> {
    const size_t begin = next;
    int64_t bytes = 0;
    std::vector<IoRequest> batch;
    std::vector<Piece*> owners;
    while (!error.failed()) {
      if (next == pieces.size()) {
        if (next_stored == stored.size()) break;
        error.Update(plan_stored(stored[next_stored++]));
        continue;
      }
      Piece& piece = pieces[next];
      if (bytes > 0 && bytes + piece.buffer_bytes > window_bytes) break;
      ++next;
      bytes += piece.buffer_bytes;
      PreparePiece(direct, pool, bounce_held, piece);
      for (const IoRequest& request : piece.requests) {
        batch.push_back(request);
        owners.push_back(&piece);
      }
    }
    peak = std::max(peak, bounce_held.load());
    std::vector<Future<size_t>> futures = engine_->Submit(batch);
    for (size_t i = 0; i < futures.size(); ++i) {
      owners[i]->reads.push_back(std::move(futures[i]));
    }
    return {begin, next};
  };
  auto finish_window = [&](std::pair<size_t, size_t> window) {
    std::atomic<size_t> at{window.first};
    internal_io::RunWorkers(
        internal_io::PoolOf(pool_, options_.thread_count),
        static_cast<int>(std::min<size_t>(options_.thread_count,
                                          window.second - window.first)),
        [&](int) {
          for (size_t i = at++; i < window.second; i = at++) {
            Piece& piece = pieces[i];
            const int64_t held =
                piece.buffer != nullptr ? piece.buffer->size : 0;
            if (error.failed()) {
              for (Future<size_t>& read : piece.reads) read.Wait();
            } else {
              error.Update(FinishPiece(piece, planner, bytes_read));
            }
            pool.Put(std::move(piece.buffer));
            bounce_held -= held;
          }
        });
  };
  std::pair<size_t, size_t> window = submit_window();
  while (window.first < window.second) {
    std::pair<size_t, size_t> following =
        error.failed() ? std::pair<size_t, size_t>{next, next}
                       : submit_window();
    finish_window(window);
    window = following;
  }
  if (staging_used != nullptr) {
    // Device copies land before any device destination is committed.
    error.Update(
        Annotate(staging_used->Flush(),
                 absl::StrCat("copying into device tensors from ", path_)));
    for (Stored& s : stored) {
      if (error.failed()) break;
      if (s.staging == nullptr || s.pieces_left == nullptr ||
          *s.pieces_left != 0) {
        continue;
      }
      for (size_t u = 0; u < s.uses.size() && !error.failed(); ++u) {
        error.Update(planner.CommitTensor(*s.uses[u], s.dests[u]));
      }
    }
  }
  bytes_read_ = bytes_read.load();
  peak_bounce_bytes_ = peak;
  return Future<void>::Ready(error.status());
}

}  // namespace dcp
