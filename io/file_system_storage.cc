#include "io/file_system_storage.h"

#include <sys/random.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/checksum.h"
#include "core/status.h"
#include "core/tensor.h"
#include "io/box_copy.h"
#include "io/device_box_upload.h"
#include "io/internal/parallel_work.h"
#include "io/io_engine.h"
#include "io/metadata_format.h"
#include "staging/device_staging.h"

namespace dcp {
namespace {

using internal_io::AlignedBuffer;
using internal_io::FirstError;
using internal_io::RunOnThreads;

constexpr int64_t kPayloadAlignment = 4096;
// O_DIRECT writes of unaligned memory: bounce chunk size and the most bounce
// bytes in flight per file.
constexpr int64_t kBounceChunk = int64_t{4} << 20;
constexpr int64_t kBounceBudget = int64_t{32} << 20;
// Host items of at most kPackItemBytes share packs of at most kPackBytes,
// kPackAlignment apart (FileSystemWriter::WriteFile, docs/FORMAT.md).
constexpr int64_t kPackItemBytes = int64_t{64} << 10;
constexpr int64_t kPackBytes = int64_t{1} << 20;
constexpr int64_t kPackAlignment = 64;
// Buffered saves: writebacks outstanding per file before the writer waits
// for the oldest (2 measured as fast as 8 and faster than none).
constexpr size_t kWritebacksAhead = 2;
// Loads through bounce buffers: the most bytes one read of a stored item
// takes (whole checksum blocks; FileSystemReaderOptions::read_window_bytes
// caps it further).
constexpr int64_t kReadPieceBytes = int64_t{16} << 20;
// The pinned pool a reader creates for device destinations.
constexpr size_t kReadStagingPoolBytes = size_t{64} << 20;
constexpr char kDataFileSuffix[] = ".distcp";
constexpr char kTempMetadataPrefix[] = ".metadata.tmp-";

int64_t AlignUp(int64_t value, int64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

FileSystemBase* OrLocal(FileSystemBase* fs) {
  return fs != nullptr ? fs : &LocalFileSystem();
}

// `given`, or a new engine of `mode` stored in `owned` (a set-up failure
// goes to `error`, reported at SetUp).
IoEngine* EngineOrOwn(IoEngine* given, IoMode mode,
                      std::unique_ptr<IoEngine>& owned, absl::Status& error) {
  if (given != nullptr) return given;
  IoEngineOptions options;
  options.mode = mode;
  absl::StatusOr<std::unique_ptr<IoEngine>> engine = NewIoEngine(options);
  if (!engine.ok()) {
    error = engine.status();
    return nullptr;
  }
  owned = *std::move(engine);
  return owned.get();
}

std::string NewSaveId() {
  uint64_t bits = 0;
  if (::getrandom(&bits, sizeof(bits), 0) != sizeof(bits)) {
    bits = static_cast<uint64_t>(
               std::chrono::steady_clock::now().time_since_epoch().count()) ^
           reinterpret_cast<uintptr_t>(&bits);
  }
  return absl::StrFormat("%016x", bits);
}

// "__<rank>_<save id>_": data files are this prefix, an index and ".distcp".
std::string DataFilePrefix(int rank, absl::string_view save_id) {
  return absl::StrCat("__", rank, "_", save_id, "_");
}

// Whether `text` is a save id (NewSaveId: 16 lowercase hex digits).
bool IsSaveId(absl::string_view text) {
  return text.size() == 16 && std::all_of(text.begin(), text.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

bool IsDecimal(absl::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return c >= '0' && c <= '9';
  });
}

// Whether `name` is a name a FileSystemWriter gives its data files:
// DataFilePrefix(rank, save id), a file index, kDataFileSuffix.
bool IsDataFileName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, "__") ||
      !absl::ConsumeSuffix(&name, kDataFileSuffix)) {
    return false;
  }
  const std::vector<absl::string_view> parts = absl::StrSplit(name, '_');
  return parts.size() == 3 && IsDecimal(parts[0]) && IsSaveId(parts[1]) &&
         IsDecimal(parts[2]);
}

// Whether `name` is a name a FileSystemWriter gives its temporary metadata.
bool IsTempMetadataFileName(absl::string_view name) {
  return absl::ConsumePrefix(&name, kTempMetadataPrefix) && IsSaveId(name);
}

// Reads and decodes the committed metadata file of `dir`. kNotFound "no
// committed checkpoint" when there is none. The file is untrusted: one
// larger than any metadata file is refused before anything is allocated
// for it, a FIFO or other non-regular file is refused without blocking
// (kFailedPrecondition, FileSystemBase::OpenForRead), and DecodeMetadata
// validates the rest.
absl::StatusOr<Metadata> ReadMetadataFile(FileSystemBase& fs,
                                          const std::string& dir) {
  const std::string metadata_path = JoinPath(dir, kMetadataFileName);
  absl::StatusOr<std::unique_ptr<File>> file = fs.OpenForRead(metadata_path);
  if (absl::IsNotFound(file.status())) {
    return absl::NotFoundError(absl::StrCat(
        "no committed checkpoint in ", dir, " (", metadata_path,
        " does not exist; a save that did not finish leaves none)"));
  }
  if (!file.ok()) return file.status();
  DCP_ASSIGN_OR_RETURN(int64_t size, (*file)->Size());
  if (size > kMaxMetadataFileSize) {
    return absl::DataLossError(absl::StrCat(
        metadata_path, " is ", size,
        " bytes, more than any dcp metadata file (", kMaxMetadataFileSize,
        "); the directory holds no readable dcp "
        "checkpoint"));
  }
  std::string bytes(static_cast<size_t>(size), '\0');
  DCP_ASSIGN_OR_RETURN(
      size_t got, (*file)->PRead(0, {reinterpret_cast<std::byte*>(bytes.data()),
                                     bytes.size()}));
  bytes.resize(got);
  DCP_RETURN_IF_ERROR((*file)->Close());
  return DecodeMetadata(bytes, metadata_path);
}

// Block checksums of bytes that arrive in pieces (staged device tensors):
// the same values as BlockChecksums of the whole.
class BlockChecksummer {
 public:
  explicit BlockChecksummer(int64_t block_size) : block_size_(block_size) {}

  void Update(const std::byte* data, int64_t length) {
    while (length > 0) {
      const int64_t take = std::min(length, block_size_ - filled_);
      block_.Update(data, take);
      filled_ += take;
      data += take;
      length -= take;
      if (filled_ == block_size_) {
        sums_.push_back(block_.Digest());
        block_ = StreamingChecksum();
        filled_ = 0;
      }
    }
  }
  std::vector<uint64_t> Finish() {
    if (filled_ > 0) sums_.push_back(block_.Digest());
    filled_ = 0;
    return std::move(sums_);
  }

 private:
  const int64_t block_size_;
  StreamingChecksum block_;
  int64_t filled_ = 0;
  std::vector<uint64_t> sums_;
};

std::vector<uint64_t> BlockChecksums(const std::byte* data, int64_t length,
                                     int64_t block_size) {
  std::vector<uint64_t> sums;
  sums.reserve((length + block_size - 1) / block_size);
  for (int64_t pos = 0; pos < length; pos += block_size) {
    sums.push_back(Checksum(data + pos, std::min(block_size, length - pos)));
  }
  return sums;
}

// The data file names the committed metadata of `dir` uses; none when there
// is no `.metadata`; its error when it cannot be read or decoded.
absl::StatusOr<std::set<std::string>> CommittedFileNames(
    FileSystemBase& fs, const std::string& dir) {
  absl::StatusOr<Metadata> committed = ReadMetadataFile(fs, dir);
  if (absl::IsNotFound(committed.status())) return std::set<std::string>();
  if (!committed.ok()) return committed.status();
  std::set<std::string> names;
  for (const auto& [index, info] : committed->storage_data) {
    names.insert(info.relative_path);
  }
  return names;
}

// The orphans in `dir`, given the names its committed metadata uses
// (`committed`): see RemoveOrphans.
OrphanCleanup RemoveOrphansExcept(FileSystemBase& fs, const std::string& dir,
                                  const std::set<std::string>& committed) {
  OrphanCleanup cleanup;
  absl::StatusOr<std::vector<std::string>> names = fs.ListDir(dir);
  if (!names.ok()) {
    cleanup.status = names.status();
    return cleanup;
  }
  OpenOptions open_options;
  open_options.exclusive = false;
  open_options.no_follow = true;
  for (const std::string& name : *names) {
    if (committed.contains(name) ||
        !(IsDataFileName(name) || IsTempMetadataFileName(name))) {
      continue;
    }
    // Only regular files: opened without following a link, a FIFO or
    // device refused without blocking. Such a file is not the writer's.
    const std::string path = JoinPath(dir, name);
    absl::StatusOr<std::unique_ptr<File>> file =
        fs.OpenForRead(path, open_options);
    if (!file.ok()) continue;
    absl::StatusOr<int64_t> size = (*file)->Size();
    (*file)->Close().IgnoreError();
    const int64_t bytes = size.ok() ? *size : 0;
    absl::Status removed = fs.RemoveFile(path);
    if (absl::IsNotFound(removed)) continue;  // Gone already.
    if (removed.ok()) {
      cleanup.removed.push_back(name);
      cleanup.removed_bytes += bytes;
    } else {
      cleanup.left.push_back(name);
      cleanup.left_bytes += bytes;
      if (cleanup.status.ok()) cleanup.status = removed;
    }
  }
  return cleanup;
}

}  // namespace

std::string OrphanCleanup::Summary(absl::string_view dir) const {
  std::vector<std::string> parts;
  if (!removed.empty()) {
    parts.push_back(absl::StrCat("removed ", removed.size(),
                                 " orphaned file(s) of interrupted saves (",
                                 removed_bytes, " bytes) from ", dir));
  }
  if (!left.empty()) {
    parts.push_back(absl::StrCat(left.size(),
                                 " orphaned file(s) of interrupted saves (",
                                 left_bytes, " bytes) remain in ", dir));
  }
  if (!status.ok()) {
    parts.push_back(
        removed.empty() && left.empty()
            ? absl::StrCat("orphaned files of interrupted saves in ", dir,
                           " were not removed: ", status.message())
            : std::string(status.message()));
  }
  return absl::StrJoin(parts, "; ");
}

std::string RankLocalDirectory(absl::string_view dir, int rank) {
  return JoinPath(dir, absl::StrCat("rank-", rank));
}

OrphanCleanup RemoveOrphans(FileSystemBase& fs, const std::string& dir) {
  absl::StatusOr<std::set<std::string>> committed = CommittedFileNames(fs, dir);
  if (!committed.ok()) {
    OrphanCleanup cleanup;
    cleanup.status = committed.status();
    return cleanup;
  }
  return RemoveOrphansExcept(fs, dir, *committed);
}

// ---------------------------------------------------------------------------
// FileSystemWriter

FileSystemWriter::FileSystemWriter(std::string path,
                                   FileSystemWriterOptions options)
    : path_(std::move(path)),
      dir_(path_),
      options_(options),
      fs_(OrLocal(options.file_system)),
      save_id_(NewSaveId()) {
  engine_ = EngineOrOwn(options_.io_engine, options_.io_mode, owned_engine_,
                        engine_error_);
  options_.thread_count = std::max(1, options_.thread_count);
  if (options_.checksum_block_size <= 0) {
    options_.checksum_block_size = Metadata{}.checksum_block_size;
  }
}

FileSystemWriter::~FileSystemWriter() {
  absl::MutexLock lock(&mu_);
  // The engine must not keep the pool's pages registered once it is gone.
  if (staging_registered_) engine_->RegisterBuffers({}).IgnoreError();
}

absl::StatusOr<DeviceStaging*> FileSystemWriter::Staging() {
  absl::MutexLock lock(&mu_);
  DeviceStaging* staging = options_.device_staging;
  if (staging == nullptr) {
    if (owned_staging_ == nullptr) {
      DeviceStagingOptions staging_options;
      const size_t per_thread =
          AlignUp(std::max<int64_t>(
                      options_.per_thread_copy_ahead,
                      2 * static_cast<int64_t>(staging_options.chunk_bytes)),
                  staging_options.chunk_bytes);
      staging_options.pool_bytes = per_thread * options_.thread_count;
      owned_staging_ = std::make_unique<DeviceStaging>(staging_options);
    }
    staging = owned_staging_.get();
  }
  DCP_ASSIGN_OR_RETURN(PinnedPool * pool, staging->Pool());
  if (owned_engine_ != nullptr && !staging_registered_) {
    // Fixed buffers spare the kernel mapping each chunk per I/O. An engine
    // that cannot register them still writes from the chunks.
    staging_registered_ = true;
    absl::Status registered = engine_->RegisterBuffers(pool->Regions());
    if (!registered.ok()) {
      staging_registered_ = false;
      static std::atomic<bool> said{false};
      if (!said.exchange(true)) {
        std::fprintf(stderr,
                     "dcp: staging pool not registered with %s (%s); "
                     "writing without fixed buffers\n",
                     std::string(engine_->name()).c_str(),
                     registered.ToString().c_str());
      }
    }
  }
  return staging;
}

absl::Status FileSystemWriter::Reset(const std::string& checkpoint_id) {
  if (!checkpoint_id.empty()) path_ = checkpoint_id;
  dir_ = path_;
  save_id_ = NewSaveId();
  committed_ = false;
  replaceable_files_.clear();
  committed_files_.clear();
  orphan_cleanup_ = OrphanCleanup();
  directory_lock_.reset();
  device_wait_ = DeviceWait{};
  absl::MutexLock lock(&mu_);
  created_.clear();
  return absl::OkStatus();
}

absl::Status FileSystemWriter::SelectRankLocal(int rank) {
  if (rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank-local save for rank ", rank));
  }
  dir_ = RankLocalDirectory(path_, rank);
  return absl::OkStatus();
}

absl::Status FileSystemWriter::SetDeviceWait(const DeviceWait& wait) {
  device_wait_ = wait;
  return absl::OkStatus();
}

StorageMeta FileSystemWriter::GetStorageMeta() const {
  StorageMeta meta;
  meta.checkpoint_id = dir_;
  meta.save_id = save_id_;
  return meta;
}

void FileSystemWriter::RecordCreated(const std::string& path) {
  absl::MutexLock lock(&mu_);
  created_.push_back(path);
}

absl::Status FileSystemWriter::SetUp(bool is_coordinator, int rank,
                                     bool /*use_collectives*/) {
  DCP_RETURN_IF_ERROR(engine_error_);
  if (options_.checksum_block_size > kMaxChecksumBlockSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("checksum_block_size ", options_.checksum_block_size,
                     " is larger than the most a reader accepts (",
                     kMaxChecksumBlockSize, ")"));
  }
  is_coordinator_ = is_coordinator;
  rank_ = rank;
  DCP_RETURN_IF_ERROR(
      Annotate(fs_->CreateDir(dir_), absl::StrCat("rank ", rank,
                                                  ": cannot create checkpoint "
                                                  "directory ",
                                                  dir_)));
  // Probe that the directory takes new files now rather than failing after
  // planning: permission bits, read-only mounts and quotas all show here.
  const std::string probe =
      JoinPath(dir_, absl::StrCat(".dcp-probe-", rank, "-", save_id_));
  absl::StatusOr<std::unique_ptr<File>> file = fs_->OpenForWrite(probe);
  if (!file.ok()) {
    return Annotate(file.status(),
                    absl::StrCat("rank ", rank, ": checkpoint directory ", dir_,
                                 " is not writable"));
  }
  absl::Status closed = (*file)->Close();
  absl::Status removed = fs_->RemoveFile(probe);
  DCP_RETURN_IF_ERROR(closed);
  DCP_RETURN_IF_ERROR(removed);
  if (!is_coordinator_) return absl::OkStatus();
  // The coordinator holds the directory until the save commits or aborts:
  // a second save into it fails here, before it has written anything.
  if (directory_lock_ == nullptr) {
    DCP_ASSIGN_OR_RETURN(
        directory_lock_,
        fs_->LockDirectory(dir_, absl::StrCat(ThisProcessDescription(),
                                              " (save ", save_id_, ")")));
  }
  absl::Status status = SetUpLocked();
  if (!status.ok()) directory_lock_.reset();
  return status;
}

absl::Status FileSystemWriter::SetUpLocked() {
  const std::string metadata_path = JoinPath(dir_, kMetadataFileName);
  if (!options_.overwrite) {
    DCP_ASSIGN_OR_RETURN(bool exists, fs_->Exists(metadata_path));
    if (exists) {
      return absl::AlreadyExistsError(absl::StrCat(
          dir_, " already holds a committed checkpoint (", metadata_path,
          "); pass overwrite=true to replace it or choose another directory"));
    }
  }
  // The files MarkCommitted may remove: the data files of the checkpoint
  // this save replaces, as its metadata names them. Metadata that cannot be
  // read names nothing, so nothing is removed, now or at the commit.
  replaceable_files_.clear();
  orphan_cleanup_ = OrphanCleanup();
  absl::StatusOr<std::set<std::string>> named = CommittedFileNames(*fs_, dir_);
  if (!named.ok()) {
    orphan_cleanup_.status = named.status();
    return absl::OkStatus();
  }
  for (const std::string& name : *named) {
    if (IsDataFileName(name)) replaceable_files_.insert(name);
  }
  // With the lock held no other save is writing here: the writer's files
  // that the committed metadata does not name are orphans of interrupted
  // saves. They go before this save reserves space for its own.
  orphan_cleanup_ = RemoveOrphansExcept(*fs_, dir_, *named);
  return absl::OkStatus();
}

absl::Status FileSystemWriter::WithOrphanNote(absl::Status status) const {
  if (!absl::IsResourceExhausted(status)) return status;
  const std::string note = orphan_cleanup_.Summary(dir_);
  if (note.empty()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(status.message(), " (", note, ")"));
}

absl::StatusOr<SavePlan> FileSystemWriter::PrepareLocalPlan(SavePlan plan) {
  return plan;
}

absl::StatusOr<std::vector<SavePlan>> FileSystemWriter::PrepareGlobalPlan(
    std::vector<SavePlan> plans) {
  for (size_t i = 0; i < plans.size(); ++i) {
    plans[i].storage_data = DataFilePrefix(static_cast<int>(i), save_id_);
  }
  return plans;
}

absl::Status FileSystemWriter::WriteFile(
    const std::string& relative_path,
    const std::vector<const WriteItem*>& items, SavePlanner& planner,
    std::vector<WriteResult*>& results) {
  const std::string path = JoinPath(dir_, relative_path);
  OpenOptions open_options;
  open_options.direct = options_.direct_io;
  open_options.uncached = options_.uncached_writes;
  absl::StatusOr<std::unique_ptr<File>> opened =
      fs_->OpenForWrite(path, open_options);
  if (!opened.ok()) {
    return Annotate(opened.status(), absl::StrCat("rank ", rank_));
  }
  std::unique_ptr<File> file = *std::move(opened);
  RecordCreated(path);
  // Every item resolved first: whether it is on the device and how long it
  // is decide where it goes (small host items share packs, below).
  std::vector<dcp::WriteData> held;
  held.reserve(items.size());
  struct Resolved {
    const std::byte* bytes = nullptr;
    int64_t length = 0;
    bool tensor = false;
    bool on_device = false;
  };
  std::vector<Resolved> resolved_items(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const WriteItem& item = *items[i];
    absl::StatusOr<dcp::WriteData> resolved = planner.ResolveData(item);
    if (!resolved.ok()) {
      return Annotate(
          resolved.status(),
          absl::StrCat("rank ", rank_, ": resolving ", item.index.ToString()));
    }
    held.push_back(*std::move(resolved));
    Resolved& r = resolved_items[i];
    if (Tensor* strided = std::get_if<Tensor>(&held.back());
        strided != nullptr && !strided->view().is_contiguous()) {
      // A strided host view (a transposed weight, a slice) is gathered into
      // a contiguous copy that lives as long as `held`. Device tensors are
      // copied by the device path, which takes contiguous memory: stage
      // strided ones first (AsyncSave's stager gathers them).
      if (!strided->device().is_cpu()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", rank_, ": tensor ", item.index.ToString(), " on ",
            strided->device().ToString(),
            " is not contiguous; the file writer copies contiguous device "
            "tensors (make it contiguous, or save it with AsyncSave, whose "
            "stager gathers it)"));
      }
      absl::StatusOr<Tensor> gathered = strided->ContiguousHostCopy();
      if (!gathered.ok()) {
        return Annotate(gathered.status(),
                        absl::StrCat("rank ", rank_, ": gathering ",
                                     item.index.ToString()));
      }
      held.back() = *std::move(gathered);
    }
    if (const Tensor* tensor = std::get_if<Tensor>(&held.back())) {
      r.bytes = static_cast<const std::byte*>(tensor->data());
      r.length = static_cast<int64_t>(tensor->nbytes());
      if (r.length != item.StorageBytes()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", rank_, ": tensor ", item.index.ToString(), " resolved to ",
            r.length, " bytes, the plan says ", item.StorageBytes()));
      }
      r.tensor = true;
      r.on_device = !tensor->device().is_cpu();
    } else {
      const std::string& value = std::get<std::string>(held.back());
      r.bytes = reinterpret_cast<const std::byte*>(value.data());
      r.length = static_cast<int64_t>(value.size());
    }
  }

  // The file's layout. Tensors start on 4 KiB boundaries (O_DIRECT reads
  // them straight into aligned memory); bytes items follow each other
  // unaligned in a buffered file. Small host items (at most kPackItemBytes,
  // tensors or bytes) are packed kPackAlignment apart into packs of at most
  // kPackBytes, each written by one write from one aligned buffer: one
  // write, one Future and one engine request per pack instead of per item,
  // which is what a state of many small tensors costs. A pack starts on a
  // 4 KiB boundary; readers find every item by its metadata offset
  // (docs/FORMAT.md section 2).
  std::vector<int64_t> item_offset(items.size());
  std::vector<int> item_pack(items.size(), -1);
  struct Pack {
    int64_t start = 0;
    int64_t used = 0;
    size_t first_item = 0;
  };
  std::vector<Pack> packs;
  int64_t planned_end = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const Resolved& r = resolved_items[i];
    if (!r.on_device && r.length > 0 && r.length <= kPackItemBytes) {
      // A pack stays open while items are packed back to back.
      const bool open = i > 0 && item_pack[i - 1] >= 0;
      int64_t at =
          open ? AlignUp(packs.back().used, kPackAlignment) : kPackBytes;
      if (at + r.length > kPackBytes) {
        packs.push_back({AlignUp(planned_end, kPayloadAlignment), 0, i});
        at = 0;
      }
      item_pack[i] = static_cast<int>(packs.size() - 1);
      item_offset[i] = packs.back().start + at;
      packs.back().used = at + r.length;
      planned_end = item_offset[i] + r.length;
      continue;
    }
    item_offset[i] = r.tensor || options_.direct_io
                         ? AlignUp(planned_end, kPayloadAlignment)
                         : planned_end;
    planned_end = item_offset[i] + r.length;
  }
  if (options_.direct_io) planned_end = AlignUp(planned_end, kPayloadAlignment);
  // Only for O_DIRECT: buffered writes gain nothing from it on ext4 (delayed
  // allocation lays the file out at writeback; A/B within 2%), and on tmpfs
  // fallocate zeroes every page before the write copies over it (0.3-0.4 s
  // per GiB here), which made a buffered 1 GiB save there 1.5-2x slower.
  const bool preallocate = file->direct();
  if (preallocate) {
    DCP_RETURN_IF_ERROR(
        Annotate(file->Preallocate(planned_end), absl::StrCat("rank ", rank_)));
  }

  // Everything a submitted write reads from stays alive until all complete
  // (`held` above, the bounce and pack buffers here).
  struct Bounce {
    std::unique_ptr<AlignedBuffer> buffer;
    Future<void> done;
  };
  std::deque<Bounce> bounce;
  int64_t bounce_bytes = 0;
  std::vector<Future<size_t>> futures;
  std::vector<size_t> future_item;  // Which item each future writes.
  auto failed = std::make_shared<std::atomic<bool>>(false);
  auto track = [&](size_t item, Future<size_t> f) {
    f.OnReady([failed](const absl::StatusOr<size_t>& r) {
      if (!r.ok()) failed->store(true);
    });
    futures.push_back(std::move(f));
    future_item.push_back(item);
  };
  // Writeback (buffered files with sync_files): the bytes below
  // `written_back` have been handed to StartWriteback; once the bytes
  // submitted past it reach writeback_bytes, they follow (the engine starts
  // the writeback after their writes complete). Large writes are submitted
  // in writeback_bytes pieces, so the writeback keeps pace inside an item,
  // and at most kWritebacksAhead writebacks are outstanding: the writer
  // waits for the oldest, so it runs at the disk's pace with a few pieces
  // of dirty pages instead of filling the page cache until the kernel
  // throttles it (measured: without that wait POSIX gained little and
  // io_uring lost; docs/BENCHMARKS.md section 1, "Writeback").
  const int64_t writeback =
      options_.sync_files && !file->direct() ? options_.writeback_bytes : 0;
  int64_t written_back = 0;
  std::deque<Future<size_t>> writebacks;  // Issued, not yet seen complete.
  // Submits one write; the future is ready once every piece of it is
  // written (the write's memory must outlive it).
  auto submit = [&](size_t item, int64_t offset, const std::byte* data,
                    size_t length) -> Future<void> {
    std::vector<Future<size_t>> pieces;
    if (writeback <= 0) {
      track(item, engine_->Submit(
                      {IoRequest::Write(file.get(), offset, data, length)})[0]);
      pieces.push_back(futures.back());
      return WhenAll(pieces);
    }
    for (size_t pos = 0; pos < length;) {
      const int64_t at = offset + static_cast<int64_t>(pos);
      const size_t n = std::min<size_t>(
          length - pos, static_cast<size_t>(std::max<int64_t>(
                            written_back + writeback - at, kPayloadAlignment)));
      track(item, engine_->Submit(
                      {IoRequest::Write(file.get(), at, data + pos, n)})[0]);
      pieces.push_back(futures.back());
      pos += n;
      const int64_t end = at + static_cast<int64_t>(n);
      if (end - written_back >= writeback) {
        track(item, engine_->Submit({IoRequest::Writeback(
                        file.get(), written_back,
                        static_cast<size_t>(end - written_back))})[0]);
        written_back = end;
        writebacks.push_back(futures.back());
        while (writebacks.size() > kWritebacksAhead) {
          writebacks.front().Wait();  // Its error is seen with the others.
          writebacks.pop_front();
        }
      }
    }
    return WhenAll(pieces);
  };

  // Device tensors: (view, item position), their layout fixed in the loop.
  std::vector<PipelineItem> device_items;

  // Bounce and pack buffers in flight, at most kBounceBudget bytes (older
  // ones are waited for and freed first). The caller sets the new entry's
  // `done` once its write is submitted.
  auto take_bounce = [&](int64_t size) -> AlignedBuffer* {
    while (!bounce.empty() && bounce_bytes + size > kBounceBudget) {
      bounce.front().done.Wait();  // Its error is seen with the others.
      bounce_bytes -= bounce.front().buffer->size;
      bounce.pop_front();
    }
    bounce.push_back({std::make_unique<AlignedBuffer>(size), Future<void>()});
    bounce_bytes += size;
    return bounce.back().buffer.get();
  };
  // The open pack's buffer (zero-filled: the gaps read as zeros), written
  // once its last item is in.
  AlignedBuffer* pack_buffer = nullptr;
  int open_pack = -1;
  auto flush_pack = [&]() {
    if (open_pack < 0) return;
    const Pack& pack = packs[open_pack];
    const int64_t length =
        options_.direct_io ? AlignUp(pack.used, kPayloadAlignment) : pack.used;
    bounce.back().done =
        submit(pack.first_item, pack.start, pack_buffer->data, length);
    open_pack = -1;
    pack_buffer = nullptr;
  };

  absl::Status status;
  int64_t offset = 0;
  for (size_t i = 0; i < items.size() && !failed->load(); ++i) {
    const WriteItem& item = *items[i];
    const Resolved& r = resolved_items[i];
    const std::byte* bytes = r.bytes;
    const int64_t length = r.length;
    offset = item_offset[i];
    WriteResult& result = *results[i];
    result.index = item.index;
    result.size_in_bytes = length;
    result.storage_data.relative_path = relative_path;
    result.storage_data.offset = offset;
    result.storage_data.length = length;
    if (r.on_device) {
      // Staged once the host items are in flight (below).
      device_items.push_back(
          {std::get<Tensor>(held[i]).view(), i, item.index.ToString()});
      offset += length;
      continue;
    }
    if (item_pack[i] >= 0) {
      if (item_pack[i] != open_pack) {
        flush_pack();
        open_pack = item_pack[i];
        pack_buffer =
            take_bounce(AlignUp(packs[open_pack].used, kPayloadAlignment));
        std::memset(pack_buffer->data, 0, pack_buffer->size);
      }
      std::memcpy(pack_buffer->data + (offset - packs[open_pack].start), bytes,
                  length);
    } else {
      flush_pack();
      if (!options_.direct_io) {
        if (length > 0) submit(i, offset, bytes, length);
      } else {
        // The 4 KiB aligned body straight from the caller's memory when it
        // is aligned; the rest through a zero-padded aligned bounce block
        // (the padding lies before the next item's aligned start).
        int64_t body = 0;
        if (reinterpret_cast<uintptr_t>(bytes) % kPayloadAlignment == 0) {
          body = length / kPayloadAlignment * kPayloadAlignment;
          if (body > 0) submit(i, offset, bytes, body);
        }
        for (int64_t pos = body; pos < length; pos += kBounceChunk) {
          const int64_t n = std::min(kBounceChunk, length - pos);
          const int64_t padded = AlignUp(n, kPayloadAlignment);
          AlignedBuffer* buffer = take_bounce(padded);
          std::memcpy(buffer->data, bytes + pos, n);
          std::memset(buffer->data + n, 0, padded - n);
          bounce.back().done = submit(i, offset + pos, buffer->data, padded);
        }
      }
    }
    // Checksums while the item's writes are in flight (the memory stays
    // unchanged until they complete): the CPU work overlaps the I/O instead
    // of delaying it, which a buffered save, finished by one fsync, feels.
    result.storage_data.block_checksums =
        BlockChecksums(bytes, length, options_.checksum_block_size);
    offset += length;
  }
  if (!failed->load()) flush_pack();
  if (status.ok() && !device_items.empty() && !failed->load()) {
    // Each device tensor is copied piece by piece into pinned pool chunks;
    // a piece is written straight from its chunk (4 KiB aligned: O_DIRECT
    // needs no bounce; the last piece is zero-padded to a whole block) while
    // the next is copied, and the chunk returns to the pool when its write
    // completes. The pool bounds the memory, whatever the tensors' size.
    absl::StatusOr<DeviceStaging*> staging = Staging();
    if (!staging.ok()) {
      status = Annotate(staging.status(), absl::StrCat("rank ", rank_));
    } else {
      std::optional<BlockChecksummer> checksums;
      status = (*staging)->Stage(
          device_items,
          [&](StagedPiece piece) -> absl::Status {
            if (failed->load()) {
              return absl::AbortedError("an earlier write of this file failed");
            }
            const size_t i = piece.destination;
            if (piece.offset == 0)
              checksums.emplace(options_.checksum_block_size);
            checksums->Update(piece.chunk.data(),
                              static_cast<int64_t>(piece.length));
            if (piece.length > 0) {
              size_t length = piece.length;
              if (options_.direct_io) {
                length = AlignUp(length, kPayloadAlignment);
                std::memset(piece.chunk.data() + piece.length, 0,
                            length - piece.length);
              }
              auto lease =
                  std::make_shared<PinnedChunk>(std::move(piece.chunk));
              submit(i, results[i]->storage_data.offset + piece.offset,
                     lease->data(), length)
                  .OnReady([lease](const absl::Status&) { lease->Release(); });
            }
            if (piece.last) {
              results[i]->storage_data.block_checksums = checksums->Finish();
            }
            return absl::OkStatus();
          },
          device_wait_);
      // A failed write stopped the pipeline: its own error (ENOSPC, EIO)
      // is reported below with the others.
      if (!status.ok() && failed->load()) status = absl::OkStatus();
      if (!status.ok()) {
        status = Annotate(status, absl::StrCat("rank ", rank_, ": staging ",
                                               device_items.size(),
                                               " device tensor(s) of ", path));
      }
    }
  }
  // A value that resolved to other bytes than planned leaves reserved space
  // past the end: cut it before the fsync.
  const int64_t end =
      options_.direct_io ? AlignUp(offset, kPayloadAlignment) : offset;
  if (status.ok() && preallocate && end < planned_end && !failed->load()) {
    for (Future<size_t>& f : futures) f.Wait();  // Writes land first.
    status = Annotate(file->Truncate(end), absl::StrCat("rank ", rank_));
  }
  if (status.ok() && options_.sync_files && !failed->load()) {
    futures.push_back(engine_->Submit({IoRequest::Fsync(file.get())})[0]);
    future_item.push_back(items.size());
  }
  // Wait for everything in flight before the buffers and the file go away.
  for (size_t f = 0; f < futures.size(); ++f) {
    const absl::StatusOr<size_t>& r = futures[f].Wait();
    if (!r.ok() && status.ok()) {
      status =
          Annotate(r.status(),
                   future_item[f] < items.size()
                       ? absl::StrCat("rank ", rank_, ": writing ",
                                      items[future_item[f]]->index.ToString())
                       : absl::StrCat("rank ", rank_));
    }
  }
  absl::Status closed = file->Close();
  if (status.ok()) status = Annotate(closed, absl::StrCat("rank ", rank_));
  return status;
}

Future<std::vector<WriteResult>> FileSystemWriter::WriteData(
    const SavePlan& plan, SavePlanner& planner) {
  const std::string prefix = plan.storage_data.empty()
                                 ? DataFilePrefix(rank_, save_id_)
                                 : plan.storage_data;
  // Assign items to files: balanced by bytes over thread_count files, or one
  // file per item.
  struct FileWork {
    std::string relative_path;
    std::vector<const WriteItem*> items;
    std::vector<WriteResult*> results;
    int64_t bytes = 0;
  };
  std::vector<WriteResult> results(plan.items.size());
  std::vector<FileWork> files;
  if (options_.single_file_per_rank) {
    const size_t count = std::min<size_t>(
        options_.thread_count, std::max<size_t>(1, plan.items.size()));
    files.resize(count);
    std::vector<size_t> order(plan.items.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return plan.items[a].StorageBytes() > plan.items[b].StorageBytes();
    });
    std::vector<std::vector<size_t>> assigned(count);
    for (size_t i : order) {
      size_t best = 0;
      for (size_t f = 1; f < count; ++f) {
        if (files[f].bytes < files[best].bytes) best = f;
      }
      files[best].bytes += plan.items[i].StorageBytes();
      assigned[best].push_back(i);
    }
    for (size_t f = 0; f < count; ++f) {
      std::sort(assigned[f].begin(), assigned[f].end());  // Plan order.
      for (size_t i : assigned[f]) {
        files[f].items.push_back(&plan.items[i]);
        files[f].results.push_back(&results[i]);
      }
    }
  } else {
    files.resize(plan.items.size());
    for (size_t i = 0; i < plan.items.size(); ++i) {
      files[i].items.push_back(&plan.items[i]);
      files[i].results.push_back(&results[i]);
    }
  }
  if (plan.items.empty()) files.clear();
  for (size_t f = 0; f < files.size(); ++f) {
    files[f].relative_path = absl::StrCat(prefix, f, kDataFileSuffix);
  }

  FirstError error;
  std::atomic<size_t> next{0};
  const int threads =
      static_cast<int>(std::min<size_t>(options_.thread_count, files.size()));
  RunOnThreads(threads, [&](int) {
    for (size_t f = next++; f < files.size() && !error.failed(); f = next++) {
      error.Update(WriteFile(files[f].relative_path, files[f].items, planner,
                             files[f].results));
    }
  });
  absl::Status status = error.status();
  if (status.ok() && options_.sync_files && !files.empty()) {
    // Make the new names durable (the commit's directory fsync covers the
    // coordinator's directory too; this covers every rank's).
    status = Annotate(fs_->SyncDir(dir_), absl::StrCat("rank ", rank_));
  }
  if (!status.ok()) {
    return Future<std::vector<WriteResult>>::Ready(WithOrphanNote(status));
  }
  return Future<std::vector<WriteResult>>::Ready(std::move(results));
}

absl::Status FileSystemWriter::Finish(
    const Metadata& metadata,
    const std::vector<std::vector<WriteResult>>& results) {
  return WithOrphanNote(CommitMetadata(metadata, results));
}

absl::Status FileSystemWriter::CommitMetadata(
    const Metadata& metadata,
    const std::vector<std::vector<WriteResult>>& results) {
  Metadata committed = metadata;
  committed.version = kFormatVersion;
  committed.checksum_block_size = options_.checksum_block_size;
  if (!committed.storage_meta.has_value()) {
    committed.storage_meta = GetStorageMeta();
  }
  committed_files_.clear();
  for (const std::vector<WriteResult>& rank_results : results) {
    for (const WriteResult& result : rank_results) {
      committed_files_.insert(result.storage_data.relative_path);
      committed.storage_data.insert_or_assign(result.index,
                                              result.storage_data);
    }
  }
  DCP_ASSIGN_OR_RETURN(std::string bytes, EncodeMetadata(committed));

  const std::string final_path = JoinPath(dir_, kMetadataFileName);
  const std::string temp_path =
      JoinPath(dir_, absl::StrCat(kTempMetadataPrefix, save_id_));
  DCP_ASSIGN_OR_RETURN(std::unique_ptr<File> file,
                       fs_->OpenForWrite(temp_path));
  RecordCreated(temp_path);
  DCP_RETURN_IF_ERROR(file->PWrite(
      0, {reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()}));
  if (options_.sync_files) DCP_RETURN_IF_ERROR(file->Sync());
  DCP_RETURN_IF_ERROR(file->Close());
  DCP_RETURN_IF_ERROR(fs_->Rename(temp_path, final_path));
  // From here on the new checkpoint is the committed one: Abort must not
  // remove its files.
  committed_ = true;
  {
    absl::MutexLock lock(&mu_);
    created_.clear();
  }
  if (options_.sync_files) {
    DCP_RETURN_IF_ERROR(
        Annotate(fs_->SyncDir(dir_),
                 absl::StrCat("committed ", final_path,
                              " but could not make the rename durable")));
  }
  return absl::OkStatus();
}

absl::Status FileSystemWriter::MarkCommitted() {
  // The files this rank wrote now belong to the committed checkpoint: a
  // later Abort must not remove them.
  committed_ = true;
  {
    absl::MutexLock lock(&mu_);
    created_.clear();
  }
  if (!is_coordinator_) return absl::OkStatus();
  absl::Status first;
  bool removed_any = false;
  for (const std::string& name : replaceable_files_) {
    if (committed_files_.contains(name)) continue;
    absl::Status status = fs_->RemoveFile(JoinPath(dir_, name));
    if (status.ok()) {
      removed_any = true;
    } else if (!absl::IsNotFound(status) && first.ok()) {
      first = status;
    }
  }
  replaceable_files_.clear();
  if (removed_any && options_.sync_files) {
    absl::Status status = fs_->SyncDir(dir_);
    if (first.ok()) first = status;
  }
  directory_lock_.reset();
  return Annotate(first, "checkpoint committed; removing replaced files");
}

void FileSystemWriter::Abort() {
  std::vector<std::string> created;
  {
    absl::MutexLock lock(&mu_);
    created.swap(created_);
  }
  if (!committed_) {
    for (const std::string& path : created) {
      // Best effort: Abort runs after a failure and reports nothing.
      fs_->RemoveFile(path).IgnoreError();
    }
  }
  directory_lock_.reset();
}

// ---------------------------------------------------------------------------
// FileSystemReader

namespace {

// What the reader knows about one stored item the plan uses.
struct StoredItem {
  const MetadataIndex* index = nullptr;
  const StorageInfo* info = nullptr;
  Shape chunk_sizes;  // Tensor chunks only.
  size_t element_size = 1;
  bool is_tensor = false;
  std::vector<const ReadItem*> uses;
  // Set when the reader reaches the item, on the submitting thread: each
  // tensor use's destination (resolved once), and the pieces still to be
  // delivered (the last one commits every use).
  std::vector<TensorView> dests;
  std::unique_ptr<std::atomic<int64_t>> pieces_left;
  // Some destination is device memory: filled through `staging`, committed
  // after the staging's copies have landed.
  DeviceStaging* staging = nullptr;
};

// Hashes MetadataIndex by fqn and offset (the system abseil cannot hash
// std::optional, so MetadataIndex's AbslHashValue does not instantiate).
struct IndexHash {
  size_t operator()(const MetadataIndex& index) const {
    size_t h = absl::Hash<std::string>()(index.fqn);
    if (index.offset.has_value()) {
      h = absl::HashOf(h, *index.offset);
    }
    return h;
  }
};

bool AllZero(const Shape& shape) {
  return std::all_of(shape.begin(), shape.end(),
                     [](int64_t v) { return v == 0; });
}

int64_t AlignDown(int64_t value, int64_t alignment) {
  return value / alignment * alignment;
}

// Opens each data file once per ReadData and shares it between threads.
class OpenFiles {
 public:
  // An open data file and its size when opened.
  struct Entry {
    std::unique_ptr<File> file;
    int64_t size = 0;
  };

  OpenFiles(FileSystemBase& fs, std::string dir, OpenOptions options)
      : fs_(fs), dir_(std::move(dir)), options_(options) {}

  absl::StatusOr<const Entry*> Get(const std::string& relative_path) {
    absl::MutexLock lock(&mu_);
    auto it = files_.find(relative_path);
    if (it != files_.end()) return &it->second;
    DCP_ASSIGN_OR_RETURN(
        std::unique_ptr<File> file,
        fs_.OpenForRead(JoinPath(dir_, relative_path), options_));
    DCP_ASSIGN_OR_RETURN(int64_t size, file->Size());
    return &files_.emplace(relative_path, Entry{std::move(file), size})
                .first->second;
  }

 private:
  FileSystemBase& fs_;
  std::string dir_;
  const OpenOptions options_;
  absl::Mutex mu_;
  // node_hash_map: entries stay where they are while others are added.
  absl::node_hash_map<std::string, Entry> files_ ABSL_GUARDED_BY(mu_);
};

// Bounce-buffer bytes held now and at most (FileSystemReader's
// peak_bounce_bytes).
class BounceMeter {
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

// An AlignedBuffer counted by a BounceMeter while it lives.
class BounceBuffer {
 public:
  BounceBuffer(int64_t size, BounceMeter& meter)
      : buffer_(static_cast<size_t>(size)), meter_(meter) {
    meter_.Add(size);
  }
  ~BounceBuffer() { meter_.Remove(buffer_.size); }
  std::byte* data() const { return buffer_.data; }

 private:
  AlignedBuffer buffer_;
  BounceMeter& meter_;
};

// One read on its way from a data file to the planner: a whole stored item
// read straight into its destination (zero copy), or a piece of one (a run
// of its checksum blocks) read into a bounce buffer, verified, and copied
// out box by box.
struct ReadSlot {
  StoredItem* stored = nullptr;
  File* file = nullptr;
  // The item's checksum blocks [first_block, end_block) (bytes
  // [begin, end) of the item), and for tensors the chunk elements
  // [first_element, end_element) this slot delivers.
  int64_t first_block = 0, end_block = 0;
  int64_t begin = 0, end = 0;
  int64_t first_element = 0, end_element = 0;
  bool zero_copy = false;
  // Where byte `begin` lands: the destination (zero copy) or `lead` bytes
  // into `buffer` (O_DIRECT reads start at a 4 KiB boundary).
  std::byte* target = nullptr;
  std::unique_ptr<BounceBuffer> buffer;
  int64_t lead = 0;
  // Zero copy with O_DIRECT: the aligned body is read in place, the last
  // partial block through `tail`.
  int64_t body = 0;
  std::unique_ptr<BounceBuffer> tail;
  int64_t buffer_bytes = 0;  // What `buffer` will take (window accounting).
  std::vector<IoRequest> requests;
  std::vector<Future<size_t>> reads;
};

// Checks what the metadata says of the stored item `index` against what
// backs it, before the reader allocates or reads anything for it: the
// checksum block size is one a reader accepts, the item has one checksum
// per block, and its data file (opened here, through `files`) holds its
// bytes. kDataLoss naming the item and the file otherwise.
absl::Status CheckStoredItem(const MetadataIndex& index,
                             const StorageInfo& info, int64_t block_size,
                             OpenFiles& files) {
  if (block_size <= 0 || block_size > kMaxChecksumBlockSize) {
    return absl::DataLossError(absl::StrCat("checksum_block_size ", block_size,
                                            " is outside (0, ",
                                            kMaxChecksumBlockSize, "]"));
  }
  if (info.offset < 0 || info.length < 0 ||
      info.offset > INT64_MAX - info.length) {
    return absl::DataLossError(
        absl::StrCat(index.ToString(), " in data file ", info.relative_path,
                     " has offset ", info.offset, " and length ", info.length));
  }
  const int64_t blocks = ChecksumBlockCount(info.length, block_size);
  if (static_cast<int64_t>(info.block_checksums.size()) != blocks) {
    return absl::DataLossError(absl::StrCat(
        "metadata lists ", info.block_checksums.size(), " checksums for ",
        index.ToString(), " (", info.length, " bytes in ", blocks, " blocks)"));
  }
  DCP_RETURN_IF_ERROR(CheckDataFileName(info.relative_path));
  DCP_ASSIGN_OR_RETURN(const OpenFiles::Entry* entry,
                       files.Get(info.relative_path));
  if (info.offset + info.length > entry->size) {
    return absl::DataLossError(absl::StrCat(
        "data file ", entry->file->path(), " is truncated: ", index.ToString(),
        " needs bytes [", info.offset, ", ", info.offset + info.length,
        ") but the file ends at offset ", entry->size));
  }
  return absl::OkStatus();
}

// Plans `stored`'s reads, appending slots to `out`: one zero-copy slot when
// its only use is the whole chunk into a whole contiguous host tensor of the
// same size (and, for O_DIRECT, 4 KiB aligned memory and file offset);
// otherwise pieces of at most about `piece_bytes` (whole checksum blocks,
// at least one element) covering only the elements its uses need. Resolves
// each tensor use's destination once and checks its box.
absl::Status PlanItem(
    StoredItem& stored, LoadPlanner& planner, bool direct, int64_t block_size,
    int64_t piece_bytes,
    absl::FunctionRef<absl::StatusOr<DeviceStaging*>()> device_staging,
    std::deque<ReadSlot>& out) {
  const int64_t length = stored.info->length;
  const int64_t blocks = ChecksumBlockCount(length, block_size);
  stored.pieces_left = std::make_unique<std::atomic<int64_t>>(0);
  auto add = [&](int64_t first_block, int64_t end_block, int64_t first_element,
                 int64_t end_element) -> ReadSlot& {
    ReadSlot& slot = out.emplace_back();
    slot.stored = &stored;
    slot.first_block = first_block;
    slot.end_block = end_block;
    slot.begin = first_block * block_size;
    slot.end = std::min(end_block * block_size, length);
    slot.first_element = first_element;
    slot.end_element = end_element;
    stored.pieces_left->fetch_add(1);
    return slot;
  };
  if (!stored.is_tensor) {  // Bytes: delivered whole.
    add(0, blocks, 0, 0).buffer_bytes = length;
    return absl::OkStatus();
  }
  for (const ReadItem* item : stored.uses) {
    DCP_ASSIGN_OR_RETURN(TensorView dest, planner.ResolveTensor(*item));
    const std::string what =
        absl::StrCat("loading ", item->storage_index.ToString(), " into ",
                     item->dest_index.ToString());
    if (dest.device().is_cuda() && stored.staging == nullptr) {
      absl::StatusOr<DeviceStaging*> staging = device_staging();
      if (!staging.ok()) return Annotate(staging.status(), what);
      stored.staging = *staging;
    }
    // Checks the box against the chunk and the destination.
    DCP_RETURN_IF_ERROR(Annotate(
        CopyBoxPart(nullptr, 0, 0, stored.chunk_sizes, item->storage_offsets,
                    stored.element_size, AsHostView(dest), item->dest_offsets,
                    item->lengths),
        what));
    stored.dests.push_back(std::move(dest));
  }
  const ReadItem& first = *stored.uses.front();
  const TensorView& dest = stored.dests.front();
  if (stored.uses.size() == 1 && AllZero(first.storage_offsets) &&
      AllZero(first.dest_offsets) && first.lengths == stored.chunk_sizes &&
      dest.device().is_cpu() && dest.is_contiguous() &&
      dest.sizes() == first.lengths &&
      static_cast<int64_t>(dest.nbytes()) == length &&
      (!direct ||
       (reinterpret_cast<uintptr_t>(dest.data()) % kPayloadAlignment == 0 &&
        stored.info->offset % kPayloadAlignment == 0))) {
    ReadSlot& slot = add(0, blocks, 0, NumElements(stored.chunk_sizes));
    slot.zero_copy = true;
    slot.target = static_cast<std::byte*>(dest.data());
    return absl::OkStatus();
  }
  // The element ranges the boxes span, merged where they share a block.
  const int64_t es = static_cast<int64_t>(stored.element_size);
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const ReadItem* item : stored.uses) {
    auto span =
        BoxSpan(stored.chunk_sizes, item->storage_offsets, item->lengths);
    if (span.first < span.second) spans.push_back(span);
  }
  std::sort(spans.begin(), spans.end());
  std::vector<std::pair<int64_t, int64_t>> merged;
  for (const auto& span : spans) {
    if (!merged.empty() && span.first * es / block_size <=
                               (merged.back().second * es - 1) / block_size) {
      merged.back().second = std::max(merged.back().second, span.second);
    } else {
      merged.push_back(span);
    }
  }
  const int64_t blocks_per_piece =
      std::max<int64_t>(1, piece_bytes / block_size);
  for (const auto& [span_begin, span_end] : merged) {
    for (int64_t e = span_begin; e < span_end;) {
      const int64_t first_block = e * es / block_size;
      const int64_t end_byte =
          std::min((first_block + blocks_per_piece) * block_size, length);
      const int64_t next = std::max(e + 1, std::min(span_end, end_byte / es));
      const int64_t end_block = (next * es + block_size - 1) / block_size;
      ReadSlot& slot = add(first_block, end_block, e, next);
      slot.buffer_bytes = slot.end - slot.begin;
      e = next;
    }
  }
  if (*stored.pieces_left == 0) {  // Only empty boxes: nothing to read.
    for (size_t u = 0; u < stored.uses.size(); ++u) {
      DCP_RETURN_IF_ERROR(
          planner.CommitTensor(*stored.uses[u], stored.dests[u]));
    }
  }
  return absl::OkStatus();
}

// Builds `slot`'s read requests, allocating its bounce buffers.
absl::Status PrepareSlot(OpenFiles& files, bool direct, BounceMeter& meter,
                         ReadSlot& slot) {
  DCP_ASSIGN_OR_RETURN(const OpenFiles::Entry* entry,
                       files.Get(slot.stored->info->relative_path));
  slot.file = entry->file.get();
  const int64_t offset = slot.stored->info->offset + slot.begin;
  const int64_t length = slot.end - slot.begin;
  if (length == 0) return absl::OkStatus();
  if (slot.zero_copy) {
    if (!direct) {
      slot.requests.push_back(
          IoRequest::Read(slot.file, offset, slot.target, length));
      return absl::OkStatus();
    }
    slot.body = AlignDown(length, kPayloadAlignment);
    if (slot.body > 0) {
      slot.requests.push_back(
          IoRequest::Read(slot.file, offset, slot.target, slot.body));
    }
    if (slot.body < length) {
      slot.tail = std::make_unique<BounceBuffer>(kPayloadAlignment, meter);
      slot.requests.push_back(IoRequest::Read(
          slot.file, offset + slot.body, slot.tail->data(), kPayloadAlignment));
    }
    return absl::OkStatus();
  }
  const int64_t start = direct ? AlignDown(offset, kPayloadAlignment) : offset;
  const int64_t end =
      direct ? AlignUp(offset + length, kPayloadAlignment) : offset + length;
  slot.buffer = std::make_unique<BounceBuffer>(end - start, meter);
  slot.lead = offset - start;
  slot.target = slot.buffer->data() + slot.lead;
  slot.requests.push_back(
      IoRequest::Read(slot.file, start, slot.buffer->data(), end - start));
  return absl::OkStatus();
}

// Waits for the reads of `slot`; returns how many of its bytes arrived
// (fewer than asked: the file is truncated).
absl::StatusOr<int64_t> AwaitSlot(ReadSlot& slot) {
  std::vector<int64_t> got;
  for (Future<size_t>& read : slot.reads) {
    DCP_ASSIGN_OR_RETURN(size_t n, read.Wait());
    got.push_back(static_cast<int64_t>(n));
  }
  const int64_t length = slot.end - slot.begin;
  if (slot.tail != nullptr) {
    const int64_t body_got = slot.body > 0 ? got.front() : 0;
    if (body_got < slot.body) return body_got;
    const int64_t tail_got = std::min(got.back(), length - slot.body);
    std::memcpy(slot.target + slot.body, slot.tail->data(), tail_got);
    return slot.body + tail_got;
  }
  if (got.empty()) return 0;
  return std::clamp<int64_t>(got.front() - slot.lead, 0, length);
}

// Checks that all of `slot`'s bytes arrived and match their block
// checksums.
absl::Status Verify(const ReadSlot& slot, int64_t got, int64_t block_size) {
  const StoredItem& stored = *slot.stored;
  const StorageInfo& info = *stored.info;
  const std::string& file_path = slot.file->path();
  if (got != slot.end - slot.begin) {
    return absl::DataLossError(absl::StrCat(
        "data file ", file_path, " is truncated: ", stored.index->ToString(),
        " needs bytes [", info.offset, ", ", info.offset + info.length,
        ") but the file ends at offset ", info.offset + slot.begin + got));
  }
  // CheckStoredItem matched the checksums to the blocks.
  for (int64_t b = slot.first_block; b < slot.end_block; ++b) {
    const int64_t start = b * block_size;
    const int64_t size = std::min(block_size, info.length - start);
    const uint64_t actual = Checksum(slot.target + (start - slot.begin), size);
    if (actual != info.block_checksums[b]) {
      return absl::DataLossError(absl::StrFormat(
          "checksum mismatch in %s: file %s offset %d length %d (xxh3 %016x, "
          "expected %016x); the checkpoint is corrupt",
          stored.index->ToString(), file_path, info.offset + start, size,
          actual, info.block_checksums[b]));
    }
  }
  return absl::OkStatus();
}

// Verifies what was read into `slot` and hands it to the planner: bytes
// whole, tensor boxes piece by piece; the item's last piece commits each
// tensor use.
absl::Status FinishSlot(ReadSlot& slot, int64_t block_size,
                        LoadPlanner& planner) {
  StoredItem& stored = *slot.stored;
  DCP_ASSIGN_OR_RETURN(int64_t got, AwaitSlot(slot));
  DCP_RETURN_IF_ERROR(Verify(slot, got, block_size));
  if (!stored.is_tensor) {
    for (const ReadItem* item : stored.uses) {
      DCP_RETURN_IF_ERROR(planner.LoadBytes(
          *item, absl::string_view(reinterpret_cast<const char*>(slot.target),
                                   static_cast<size_t>(slot.end))));
    }
    return absl::OkStatus();
  }
  if (!slot.zero_copy) {
    const int64_t es = static_cast<int64_t>(stored.element_size);
    const std::byte* window =
        slot.target + (slot.first_element * es - slot.begin);
    for (size_t u = 0; u < stored.uses.size(); ++u) {
      const ReadItem& item = *stored.uses[u];
      const TensorView& dest = stored.dests[u];
      DCP_RETURN_IF_ERROR(Annotate(
          dest.device().is_cpu()
              ? CopyBoxPart(window, slot.first_element, slot.end_element,
                            stored.chunk_sizes, item.storage_offsets,
                            stored.element_size, dest, item.dest_offsets,
                            item.lengths)
              : UploadBoxPart(*stored.staging, window, slot.first_element,
                              slot.end_element, stored.chunk_sizes,
                              item.storage_offsets, stored.element_size, dest,
                              item.dest_offsets, item.lengths),
          absl::StrCat("loading ", item.storage_index.ToString(), " into ",
                       item.dest_index.ToString())));
    }
  }
  if (stored.pieces_left->fetch_sub(1) != 1) return absl::OkStatus();
  // Device destinations are committed once their copies have landed.
  if (stored.staging != nullptr) return absl::OkStatus();
  for (size_t u = 0; u < stored.uses.size(); ++u) {
    DCP_RETURN_IF_ERROR(planner.CommitTensor(*stored.uses[u], stored.dests[u]));
  }
  return absl::OkStatus();
}

}  // namespace

FileSystemReader::FileSystemReader(std::string path,
                                   FileSystemReaderOptions options)
    : path_(std::move(path)),
      dir_(path_),
      options_(options),
      fs_(OrLocal(options.file_system)) {
  options_.thread_count = std::max(1, options_.thread_count);
  engine_ = EngineOrOwn(options_.io_engine, options_.io_mode, owned_engine_,
                        engine_error_);
}

FileSystemReader::~FileSystemReader() = default;

absl::Status FileSystemReader::Reset(const std::string& checkpoint_id) {
  if (!checkpoint_id.empty()) path_ = checkpoint_id;
  dir_ = path_;
  metadata_.reset();
  return absl::OkStatus();
}

absl::StatusOr<bool> FileSystemReader::DetectRankLocal(int rank) {
  if (rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank-local load for rank ", rank));
  }
  dir_ = path_;
  // Rank 0's checkpoint marks the layout: every rank sees the same answer.
  const std::string shared = JoinPath(path_, kMetadataFileName);
  const std::string first_local =
      JoinPath(RankLocalDirectory(path_, 0), kMetadataFileName);
  DCP_ASSIGN_OR_RETURN(bool has_shared, fs_->Exists(shared));
  DCP_ASSIGN_OR_RETURN(bool has_local, fs_->Exists(first_local));
  if (has_shared && has_local) {
    return absl::FailedPreconditionError(absl::StrCat(
        path_, " holds both a checkpoint saved by all ranks together (", shared,
        ") and rank-local checkpoints saved with "
        "use_collectives=false (",
        first_local,
        "); which one is newer is unknown: move one of them away"));
  }
  if (has_local) dir_ = RankLocalDirectory(path_, rank);
  return has_local;
}

absl::StatusOr<Metadata> FileSystemReader::ReadMetadata() {
  DCP_ASSIGN_OR_RETURN(Metadata metadata, ReadMetadataFile(*fs_, dir_));
  if (!metadata.storage_meta.has_value()) metadata.storage_meta = StorageMeta{};
  metadata.storage_meta->checkpoint_id = dir_;
  return metadata;
}

absl::Status FileSystemReader::SetUp(const Metadata& metadata,
                                     bool /*is_coordinator*/) {
  DCP_RETURN_IF_ERROR(engine_error_);
  metadata_ = metadata;
  return absl::OkStatus();
}

absl::StatusOr<LoadPlan> FileSystemReader::PrepareLocalPlan(LoadPlan plan) {
  return plan;
}

absl::StatusOr<std::vector<LoadPlan>> FileSystemReader::PrepareGlobalPlan(
    std::vector<LoadPlan> plans) {
  return plans;
}

Future<void> FileSystemReader::ReadData(const LoadPlan& plan,
                                        LoadPlanner& planner) {
  if (!metadata_.has_value()) {
    return Future<void>::Ready(absl::FailedPreconditionError(
        "FileSystemReader::ReadData before SetUp"));
  }
  const Metadata& metadata = *metadata_;
  const bool direct = options_.direct_io;
  OpenOptions open_options;
  open_options.exclusive = false;
  open_options.direct = direct;
  open_options.uncached = options_.uncached_reads;
  open_options.no_follow = true;
  OpenFiles files(*fs_, dir_, open_options);
  // Group the read items by the stored item they use: each is read once,
  // and checked against its data file before anything is allocated for it.
  absl::flat_hash_map<MetadataIndex, size_t, IndexHash> slot;
  std::vector<StoredItem> stored;
  for (const ReadItem& item : plan.items) {
    auto [it, inserted] = slot.try_emplace(item.storage_index, stored.size());
    if (inserted) {
      auto info = metadata.storage_data.find(item.storage_index);
      if (info == metadata.storage_data.end()) {
        return Future<void>::Ready(absl::DataLossError(
            absl::StrCat("the metadata of ", dir_, " has no storage entry for ",
                         item.storage_index.ToString())));
      }
      absl::Status checked = CheckStoredItem(
          info->first, info->second, metadata.checksum_block_size, files);
      if (!checked.ok()) return Future<void>::Ready(checked);
      StoredItem s;
      s.index = &info->first;
      s.info = &info->second;
      s.is_tensor = item.type == LoadItemType::kTensor;
      if (s.is_tensor) {
        auto value = metadata.state_dict_metadata.find(item.storage_index.fqn);
        const auto* tensor =
            value == metadata.state_dict_metadata.end()
                ? nullptr
                : std::get_if<TensorStorageMetadata>(&value->second);
        const ChunkStorageMetadata* chunk = nullptr;
        if (tensor != nullptr) {
          const auto& hint = item.storage_index.index;
          if (hint.has_value() && *hint >= 0 &&
              *hint < static_cast<int64_t>(tensor->chunks.size()) &&
              tensor->chunks[*hint].offsets == item.storage_index.offset) {
            chunk = &tensor->chunks[*hint];
          } else {
            for (const ChunkStorageMetadata& c : tensor->chunks) {
              if (c.offsets == item.storage_index.offset) chunk = &c;
            }
          }
        }
        if (chunk == nullptr) {
          return Future<void>::Ready(absl::DataLossError(
              absl::StrCat("the metadata of ", dir_, " has no tensor chunk ",
                           item.storage_index.ToString())));
        }
        s.chunk_sizes = chunk->sizes;
        s.element_size = ElementSize(tensor->properties.dtype);
        // DecodeMetadata checked this; metadata handed to SetUp by other
        // means is checked here, without overflow, before any box arithmetic.
        if (CheckedNumBytes(tensor->properties.dtype, s.chunk_sizes) !=
            s.info->length) {
          return Future<void>::Ready(absl::DataLossError(absl::StrCat(
              "the metadata of ", dir_, " stores ", s.info->length,
              " bytes for ", item.storage_index.ToString(), " of shape ",
              ShapeToString(s.chunk_sizes), " and dtype ",
              DTypeName(tensor->properties.dtype))));
        }
      }
      stored.push_back(std::move(s));
    }
    stored[it->second].uses.push_back(&item);
  }

  // Reads go out in windows of at most read_window_bytes of bounce buffers
  // (zero-copy reads cost none); window w+1 is in flight while window w is
  // verified and delivered on thread_count threads. Stored items are planned
  // (destinations resolved, pieces cut) as the windows reach them.
  const int64_t block_size = metadata.checksum_block_size;
  const int64_t window_bytes = std::max<int64_t>(1, options_.read_window_bytes);
  const int64_t piece_bytes = std::min(kReadPieceBytes, window_bytes);
  FirstError error;
  BounceMeter meter;
  DeviceStaging* staging_used = nullptr;
  auto device_staging = [&]() -> absl::StatusOr<DeviceStaging*> {
    DeviceStaging* staging = options_.device_staging;
    if (staging == nullptr) {
      if (owned_staging_ == nullptr) {
        DeviceStagingOptions staging_options;
        staging_options.pool_bytes = kReadStagingPoolBytes;
        owned_staging_ = std::make_unique<DeviceStaging>(staging_options);
      }
      staging = owned_staging_.get();
    }
    DCP_RETURN_IF_ERROR(staging->Pool().status());
    staging_used = staging;
    return staging;
  };
  std::deque<ReadSlot> slots;  // Slots [done, done + slots.size()).
  size_t done = 0;
  size_t next_item = 0;
  size_t next_slot = 0;
  auto submit_window = [&]() -> std::pair<size_t, size_t> {
    const size_t begin = next_slot;
    int64_t bounce_bytes = 0;
    std::vector<IoRequest> batch;
    std::vector<ReadSlot*> batch_slots;
    while (!error.failed()) {
      if (next_slot == done + slots.size()) {
        if (next_item == stored.size()) break;
        error.Update(PlanItem(stored[next_item++], planner, direct, block_size,
                              piece_bytes, device_staging, slots));
        continue;
      }
      ReadSlot& slot = slots[next_slot - done];
      if (bounce_bytes > 0 && bounce_bytes + slot.buffer_bytes > window_bytes) {
        break;
      }
      ++next_slot;
      absl::Status prepared = PrepareSlot(files, direct, meter, slot);
      if (!prepared.ok()) {
        slot.reads.push_back(Future<size_t>::Ready(prepared));
        error.Update(prepared);
        break;
      }
      bounce_bytes += slot.buffer_bytes;
      for (const IoRequest& request : slot.requests) {
        batch.push_back(request);
        batch_slots.push_back(&slot);
      }
    }
    std::vector<Future<size_t>> futures = engine_->Submit(batch);
    for (size_t i = 0; i < futures.size(); ++i) {
      batch_slots[i]->reads.push_back(std::move(futures[i]));
    }
    return {begin, next_slot};
  };
  auto finish_window = [&](std::pair<size_t, size_t> window) {
    std::atomic<size_t> next{window.first};
    const int threads = static_cast<int>(
        std::min<size_t>(options_.thread_count, window.second - window.first));
    RunOnThreads(threads, [&](int) {
      for (size_t i = next++; i < window.second; i = next++) {
        ReadSlot& slot = slots[i - done];
        if (error.failed()) {
          // Keep the buffers until their reads are done.
          for (Future<size_t>& read : slot.reads) read.Wait();
        } else {
          error.Update(FinishSlot(slot, block_size, planner));
        }
      }
    });
    // Windows finish in order: this one's slots are the oldest.
    for (size_t i = window.first; i < window.second; ++i) slots.pop_front();
    done = window.second;
  };
  std::pair<size_t, size_t> window = submit_window();
  while (window.first < window.second) {
    std::pair<size_t, size_t> following = submit_window();
    finish_window(window);
    window = following;
  }
  // A failed PrepareSlot leaves a window that was never finished.
  for (ReadSlot& slot : slots) {
    for (Future<size_t>& read : slot.reads) read.Wait();
  }
  if (staging_used != nullptr) {
    // Every copy to a device destination lands before any is committed.
    error.Update(
        Annotate(staging_used->Flush(),
                 absl::StrCat("copying into device tensors from ", dir_)));
    for (StoredItem& item : stored) {
      if (error.failed()) break;
      if (item.staging == nullptr || item.pieces_left == nullptr ||
          *item.pieces_left != 0) {
        continue;
      }
      for (size_t u = 0; u < item.uses.size() && !error.failed(); ++u) {
        error.Update(planner.CommitTensor(*item.uses[u], item.dests[u]));
      }
    }
  }
  peak_bounce_bytes_ = meter.peak();
  return Future<void>::Ready(error.status());
}

}  // namespace dcp
