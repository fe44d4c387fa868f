#include "io/file_system_storage.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "io/fs_commit.h"
#include "io/fs_file_writer.h"
#include "io/fs_layout.h"
#include "io/fs_read_plan.h"
#include "io/fs_read_window.h"
#include "io/internal/parallel_work.h"
#include "io/internal/storage_resources.h"
#include "io/io_engine.h"
#include "io/metadata_format.h"
#include "staging/device_staging.h"

namespace dcp {
namespace {

using internal_fs::CommittedFileNames;
using internal_fs::HoldsPickledMetadata;
using internal_fs::IsDataFileName;
using internal_fs::IsTempMetadataFileName;
using internal_fs::ReadMetadataFile;
using internal_io::EngineOrOwn;
using internal_io::FirstError;
using internal_io::OrLocal;
using internal_io::RunWorkers;

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
        !(IsDataFileName(name) || IsTempMetadataFileName(name) ||
          IsProbeFileName(name))) {
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

bool IsWriterFileName(absl::string_view name) {
  return internal_fs::IsDataFileName(name) ||
         internal_fs::IsTempMetadataFileName(name);
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
      save_id_(internal_fs::NewSaveId()),
      created_(std::make_unique<internal_fs::CreatedFiles>()) {
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
      owned_staging_ = internal_io::NewWriteStaging(
          options_.per_thread_copy_ahead, options_.thread_count);
    }
    staging = owned_staging_.get();
  }
  DCP_ASSIGN_OR_RETURN(HostBufferPool * pool, staging->Pool());
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

Executor& FileSystemWriter::executor() {
  if (options_.executor != nullptr) return *options_.executor;
  if (owned_executor_ == nullptr) {
    owned_executor_ = std::make_unique<ThreadPool>(options_.thread_count);
  }
  return *owned_executor_;
}

absl::Status FileSystemWriter::Reset(const std::string& checkpoint_id) {
  if (!checkpoint_id.empty()) path_ = checkpoint_id;
  dir_ = path_;
  rank_local_rank_ = -1;
  save_id_ = internal_fs::NewSaveId();
  save_marker_.clear();
  committed_ = false;
  replaceable_files_.clear();
  committed_files_.clear();
  orphan_cleanup_ = OrphanCleanup();
  directory_lock_.reset();
  layout_lock_.reset();
  device_wait_ = DeviceWait{};
  created_->Forget();
  return absl::OkStatus();
}

absl::Status FileSystemWriter::SelectRankLocal(int rank) {
  if (rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank-local save for rank ", rank));
  }
  dir_ = RankLocalDirectory(path_, rank);
  rank_local_rank_ = rank;
  return RefuseSymbolicLink(*fs_, dir_,
                            absl::StrCat("rank ", rank,
                                         "'s rank-local "
                                         "directory"));
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

absl::Status FileSystemWriter::SetUp(bool is_coordinator, int rank,
                                     bool /*use_collectives*/) {
  DCP_RETURN_IF_ERROR(engine_error_);
  if (options_.checksum_block_size > kMaxChecksumBlockSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("checksum_block_size ", options_.checksum_block_size,
                     " is larger than the most a reader accepts (",
                     kMaxChecksumBlockSize, ")"));
  }
  if (options_.serialization_format == SerializationFormat::kSafetensors &&
      !options_.extensions.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank,
                     ": serialization_format safetensors cannot store items "
                     "through extensions (",
                     options_.extensions.size(),
                     " given); drop the compression or use the native "
                     "format"));
  }
  is_coordinator_ = is_coordinator;
  // A rank-local save runs alone (as rank 0): its messages name the group
  // rank it saves for.
  if (dir_ != path_ && rank_local_rank_ >= 0) rank = rank_local_rank_;
  rank_ = rank;
  // Every rank, before it creates anything (the coordinator checks again
  // under the lock).
  DCP_RETURN_IF_ERROR(RefuseOtherFormats(*fs_, path_, CheckpointFormat::kDcp,
                                         /*list=*/false));
  DCP_RETURN_IF_ERROR(
      Annotate(fs_->CreateDir(dir_), absl::StrCat("rank ", rank,
                                                  ": cannot create checkpoint "
                                                  "directory ",
                                                  dir_)));
  // Probe that the directory takes new files now rather than failing after
  // planning: permission bits, read-only mounts and quotas all show here.
  DCP_RETURN_IF_ERROR(ProbeWritable(*fs_, dir_, rank, save_id_));
  if (!is_coordinator_) return absl::OkStatus();
  // The coordinator holds the directory until the save commits or aborts:
  // a second save into it fails here, before it has written anything.
  const std::string holder =
      absl::StrCat(ThisProcessDescription(), " (save ", save_id_, ")");
  if (dir_ != path_ && layout_lock_ == nullptr) {
    absl::StatusOr<std::unique_ptr<DirectoryLock>> lock = fs_->LockDirectory(
        path_, absl::StrCat(holder, ", rank-local"), LockMode::kShared);
    // A parent this process may not write is one no save of all ranks
    // together from it could use either: the rank-local save goes on
    // without the layout lock.
    if (lock.ok()) {
      layout_lock_ = *std::move(lock);
    } else if (!absl::IsPermissionDenied(lock.status())) {
      return lock.status();
    }
  }
  if (directory_lock_ == nullptr) {
    absl::StatusOr<std::unique_ptr<DirectoryLock>> lock =
        fs_->LockDirectory(dir_, holder, LockMode::kExclusive);
    if (!lock.ok()) {
      layout_lock_.reset();
      return lock.status();
    }
    directory_lock_ = *std::move(lock);
  }
  absl::Status status = SetUpLocked();
  // After the orphan sweep (which would take it for an interrupted save's),
  // whether or not the committed metadata could be read.
  if (status.ok()) status = CreateSaveMarker();
  if (!status.ok()) {
    directory_lock_.reset();
    layout_lock_.reset();
  }
  return status;
}

absl::Status FileSystemWriter::SetUpLocked() {
  // (A rank-local save's ranks each come here: they look up the fixed
  // names only, not list the directory of every rank's one.)
  DCP_RETURN_IF_ERROR(RefuseOtherFormats(*fs_, path_, CheckpointFormat::kDcp,
                                         /*list=*/dir_ == path_));
  const std::string metadata_path = JoinPath(dir_, kMetadataFileName);
  // A directory holds one layout (FORMAT.md section 6): a checkpoint of
  // the other layout committed beside an existing one would leave a
  // directory that no load reads (which is newer is unknown).
  const bool rank_local = dir_ != path_;
  const std::string other_layout =
      rank_local ? JoinPath(path_, kMetadataFileName)
                 : JoinPath(RankLocalDirectory(path_, 0), kMetadataFileName);
  DCP_ASSIGN_OR_RETURN(bool other_exists, fs_->Exists(other_layout));
  if (other_exists) {
    return absl::FailedPreconditionError(absl::StrCat(
        path_, " already holds ",
        rank_local
            ? "a checkpoint saved by all ranks together ("
            : "rank-local checkpoints saved with use_collectives=false (",
        other_layout, "); a ",
        rank_local ? "rank-local save" : "save of all ranks together",
        " beside it would leave a directory no load can read: save into "
        "another directory or move that one away"));
  }
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
    if (HoldsPickledMetadata(*fs_, metadata_path)) {
      return absl::FailedPreconditionError(absl::StrCat(
          dir_, " holds a checkpoint written by torch.distributed.checkpoint (",
          metadata_path,
          " is a Python pickle, not dcp's metadata); a dcp save would replace "
          "its metadata and leave its data files behind: save into another "
          "directory, or remove that checkpoint first (convert it with "
          "dcp.format_utils.torch_dcp_to_dcp to keep it)"));
    }
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

absl::Status FileSystemWriter::CreateSaveMarker() {
  // Each rank its own directory; or made by an earlier SetUp of this save.
  if (dir_ != path_ || !save_marker_.empty()) return absl::OkStatus();
  const std::string marker =
      JoinPath(dir_, internal_fs::SaveMarkerFileName(save_id_));
  absl::StatusOr<std::unique_ptr<File>> file = fs_->OpenForWrite(marker);
  if (!file.ok()) {
    return Annotate(file.status(),
                    absl::StrCat("rank ", rank_, ": checkpoint directory ",
                                 dir_, " is not writable"));
  }
  created_->Record(marker);
  save_marker_ = marker;
  return (*file)->Close();
}

absl::Status FileSystemWriter::CheckCoordinatorDirectory(const SavePlan& plan) {
  if (is_coordinator_ || dir_ != path_) return absl::OkStatus();
  const absl::string_view save_id =
      internal_fs::SaveIdOfDataFilePrefix(plan.storage_data);
  if (save_id.empty()) return absl::OkStatus();  // Not a plan of this writer.
  const std::string marker =
      JoinPath(dir_, internal_fs::SaveMarkerFileName(save_id));
  DCP_ASSIGN_OR_RETURN(bool found, fs_->Exists(marker));
  if (found) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "rank ", rank_, ": checkpoint directory ", dir_,
      " is not the one the coordinator saves into (it holds no ",
      internal_fs::SaveMarkerFileName(save_id),
      "): every rank of a save must pass the same checkpoint_id, naming one "
      "directory that all of them reach"));
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
    plans[i].storage_data =
        internal_fs::DataFilePrefix(static_cast<int>(i), save_id_);
  }
  return plans;
}

Future<std::vector<WriteResult>> FileSystemWriter::WriteData(
    const SavePlan& plan, SavePlanner& planner) {
  if (absl::Status same = CheckCoordinatorDirectory(plan); !same.ok()) {
    return Future<std::vector<WriteResult>>::Ready(std::move(same));
  }
  const std::string prefix = plan.storage_data.empty()
                                 ? internal_fs::DataFilePrefix(rank_, save_id_)
                                 : plan.storage_data;
  std::vector<int64_t> sizes;
  sizes.reserve(plan.items.size());
  for (const WriteItem& item : plan.items) sizes.push_back(item.StorageBytes());
  const std::vector<std::vector<size_t>> assigned =
      internal_fs::AssignItemsToFiles(sizes, options_.thread_count,
                                      options_.single_file_per_rank);
  // What the task writing the files shares with this call.
  struct Write {
    std::vector<WriteResult> results;
    std::vector<std::vector<const WriteItem*>> file_items;
    std::vector<std::vector<WriteResult*>> file_results;
    internal_fs::DataFileContext context;
  };
  auto write = std::make_shared<Write>();
  write->results.resize(plan.items.size());
  write->file_items.resize(assigned.size());
  write->file_results.resize(assigned.size());
  for (size_t f = 0; f < assigned.size(); ++f) {
    for (size_t i : assigned[f]) {
      write->file_items[f].push_back(&plan.items[i]);
      write->file_results[f].push_back(&write->results[i]);
    }
  }
  internal_fs::DataFileContext& context = write->context;
  context.fs = fs_;
  context.engine = engine_;
  context.dir = dir_;
  context.rank = rank_;
  context.safetensors =
      options_.serialization_format == SerializationFormat::kSafetensors;
  context.direct_io = options_.direct_io && !context.safetensors;
  context.uncached_writes = options_.uncached_writes;
  context.sync_files = options_.sync_files;
  context.writeback_bytes = options_.writeback_bytes;
  context.checksum_block_size = options_.checksum_block_size;
  context.extensions = options_.extensions;
  context.device_wait = device_wait_;
  context.staging = [this] { return Staging(); };
  context.record_created = [this](const std::string& path) {
    created_->Record(path);
  };
  // The task writes the files, thread_count at a time (itself and up to
  // thread_count - 1 more tasks of the executor).
  Promise<std::vector<WriteResult>> promise;
  Future<std::vector<WriteResult>> written = promise.future();
  Executor& pool = executor();
  pool.Schedule([this, write, prefix, promise, &planner, &pool] {
    const size_t count = write->file_items.size();
    FirstError error;
    std::atomic<size_t> next{0};
    RunWorkers(pool, std::min<int>(options_.thread_count, count), [&](int) {
      for (size_t f = next++; f < count && !error.failed(); f = next++) {
        error.Update(internal_fs::WriteDataFile(
            write->context, internal_fs::DataFileName(prefix, f),
            write->file_items[f], planner, write->file_results[f]));
      }
    });
    absl::Status status = error.status();
    if (status.ok() && options_.sync_files && count > 0) {
      // Make the new names durable (the commit's directory fsync covers the
      // coordinator's directory too; this covers every rank's).
      status = Annotate(fs_->SyncDir(write->context.dir),
                        absl::StrCat("rank ", write->context.rank));
    }
    if (status.ok()) {
      promise.Set(std::move(write->results));
    } else {
      promise.Set(WithOrphanNote(status));
    }
  });
  return written;
}

// The commit. A checkpoint is what `.metadata` names, and `.metadata`
// changes only by the atomic rename in WriteMetadataFile (io/fs_commit.h):
// - before the rename, a failure or crash leaves the old checkpoint intact
//   and Abort removes every file this save created;
// - from the rename on (committed_), the new files are the checkpoint's:
//   nothing removes them;
// - the replaced checkpoint's files go only in MarkCommitted, after every
//   rank's commit, and only those its own metadata named.
absl::Status FileSystemWriter::Finish(
    const Metadata& metadata,
    const std::vector<std::vector<WriteResult>>& results) {
  return WithOrphanNote(CommitMetadata(metadata, results));
}

absl::Status FileSystemWriter::CommitMetadata(
    const Metadata& metadata,
    const std::vector<std::vector<WriteResult>>& results) {
  committed_files_.clear();
  const std::string* last_file = nullptr;
  for (const std::vector<WriteResult>& rank_results : results) {
    for (const WriteResult& result : rank_results) {
      const std::string& file = result.storage_data.relative_path;
      if (last_file == nullptr || *last_file != file) {
        committed_files_.insert(file);
        last_file = &file;
      }
    }
  }
  // The engine passes metadata DescribeCommit already filled; anything else
  // is described in a copy.
  const Metadata* described = &metadata;
  Metadata copy;
  if (metadata.version != kFormatVersion ||
      metadata.checksum_block_size != options_.checksum_block_size ||
      !metadata.storage_meta.has_value()) {
    copy = metadata;
    DescribeCommit(copy);
    described = &copy;
  }
  DCP_ASSIGN_OR_RETURN(std::string bytes, EncodeMetadata(*described, results));
  // Every rank has written (it checked for the marker first): the
  // committed checkpoint holds no marker (a removal that fails fails the
  // save, which Abort then removes).
  if (!save_marker_.empty()) {
    absl::Status removed = fs_->RemoveFile(save_marker_);
    if (!removed.ok() && !absl::IsNotFound(removed)) {
      return Annotate(removed, "remove the save's marker before the commit");
    }
    save_marker_.clear();
  }
  DCP_RETURN_IF_ERROR(internal_fs::WriteMetadataFile(
      *fs_, dir_, save_id_, bytes, options_.sync_files, *created_));
  committed_ = true;
  created_->Forget();
  if (options_.sync_files) {
    DCP_RETURN_IF_ERROR(
        Annotate(fs_->SyncDir(dir_),
                 absl::StrCat("committed ", JoinPath(dir_, kMetadataFileName),
                              " but could not make the rename durable")));
  }
  return absl::OkStatus();
}

void FileSystemWriter::DescribeCommit(Metadata& metadata) const {
  metadata.version = kFormatVersion;
  metadata.checksum_block_size = options_.checksum_block_size;
  if (!metadata.storage_meta.has_value()) {
    metadata.storage_meta = GetStorageMeta();
  }
}

absl::Status FileSystemWriter::MarkCommitted() {
  committed_ = true;
  created_->Forget();
  if (!is_coordinator_) return absl::OkStatus();
  absl::Status status = internal_fs::RemoveReplacedFiles(
      *fs_, dir_, replaceable_files_, committed_files_, options_.sync_files);
  replaceable_files_.clear();
  directory_lock_.reset();
  layout_lock_.reset();
  return Annotate(status, "checkpoint committed; removing replaced files");
}

void FileSystemWriter::Abort() {
  if (committed_) {
    created_->Forget();
  } else {
    created_->RemoveAll(*fs_);
  }
  directory_lock_.reset();
  layout_lock_.reset();
}

// ---------------------------------------------------------------------------
// FileSystemReader

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

Executor& FileSystemReader::executor() {
  if (options_.executor != nullptr) return *options_.executor;
  if (owned_executor_ == nullptr) {
    owned_executor_ = std::make_unique<ThreadPool>(options_.thread_count);
  }
  return *owned_executor_;
}

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
  if (has_local) {
    dir_ = RankLocalDirectory(path_, rank);
    DCP_RETURN_IF_ERROR(RefuseSymbolicLink(
        *fs_, dir_, absl::StrCat("rank ", rank, "'s rank-local directory")));
  }
  return has_local;
}

absl::StatusOr<Metadata> FileSystemReader::ReadMetadata() {
  absl::StatusOr<Metadata> read = ReadMetadataFile(*fs_, dir_);
  if (absl::IsNotFound(read.status())) {
    // A checkpoint of another format there is no missing dcp one.
    for (CheckpointFormat other :
         {CheckpointFormat::kHuggingFace, CheckpointFormat::kMega}) {
      absl::StatusOr<std::string> evidence =
          CheckpointFormatEvidence(*fs_, dir_, other);
      if (evidence.ok() && !evidence->empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            dir_, " holds a ", CheckpointFormatName(other), " checkpoint (",
            *evidence, "), not a dcp one: read it with ",
            other == CheckpointFormat::kMega ? "MegaStorageReader"
                                             : "HuggingFaceStorageReader",
            ", or load it by its path without a storage reader"));
      }
    }
    return internal_fs::NameCheckpointsInside(*fs_, dir_, read.status());
  }
  DCP_ASSIGN_OR_RETURN(Metadata metadata, std::move(read));
  if (!metadata.storage_meta.has_value()) metadata.storage_meta = StorageMeta{};
  metadata.storage_meta->checkpoint_id = dir_;
  read_save_id_ = metadata.storage_meta->save_id;
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
  Promise<void> promise;
  Future<void> read = promise.future();
  Executor& pool = executor();
  pool.Schedule([this, promise, &plan, &planner, &pool] {
    promise.Set(Read(plan, planner, pool));
  });
  return read;
}

absl::Status FileSystemReader::Read(const LoadPlan& plan, LoadPlanner& planner,
                                    Executor& pool) {
  absl::Status status = ReadFiles(plan, planner, pool);
  // A commit of another save replaces the data files that the metadata
  // this reader read before it names (and a removal removes them): not
  // damage. (Metadata the caller brought from elsewhere is not this.)
  if (!absl::IsDataLoss(status) || !metadata_.has_value()) return status;
  if (metadata_source_ != nullptr) {
    absl::StatusOr<Metadata> now = metadata_source_();
    // Where the bytes lie, and their checksums.
    if (!now.ok() || now->storage_data == metadata_->storage_data) {
      return status;
    }
    return ReplacedWhileReading(dir_, status, /*removed=*/false);
  }
  if (read_save_id_.empty() || !metadata_->storage_meta.has_value() ||
      metadata_->storage_meta->save_id != read_save_id_) {
    return status;
  }
  absl::StatusOr<Metadata> now = ReadMetadataFile(*fs_, dir_);
  if (now.ok() && now->storage_meta.has_value() &&
      now->storage_meta->save_id == read_save_id_) {
    return status;
  }
  return ReplacedWhileReading(dir_, status, /*removed=*/!now.ok());
}

absl::Status FileSystemReader::ReadFiles(const LoadPlan& plan,
                                         LoadPlanner& planner, Executor& pool) {
  if (!metadata_.has_value()) {
    return absl::FailedPreconditionError(
        "FileSystemReader::ReadData before SetUp");
  }
  const Metadata& metadata = *metadata_;
  OpenOptions open_options;
  open_options.exclusive = false;
  open_options.direct = options_.direct_io;
  open_options.uncached = options_.uncached_reads;
  open_options.no_follow = true;
  internal_fs::OpenFiles files(*fs_, dir_, open_options);
  const ExtensionRegistry& extensions = options_.extensions != nullptr
                                            ? *options_.extensions
                                            : ExtensionRegistry::Default();
  // Each stored item is checked against its data file before anything is
  // allocated for it.
  absl::StatusOr<std::vector<internal_fs::StoredItem>> stored =
      internal_fs::GroupReadItems(
          plan, metadata, dir_,
          [&](const MetadataIndex& index, const StorageInfo& info) {
            return internal_fs::CheckStoredItem(
                index, info, metadata.checksum_block_size, extensions, files);
          });
  if (!stored.ok()) return stored.status();

  internal_fs::ReadWindowOptions window;
  window.extensions = &extensions;
  window.direct = options_.direct_io;
  window.block_size = metadata.checksum_block_size;
  window.window_bytes = std::max<int64_t>(1, options_.read_window_bytes);
  window.piece_bytes =
      std::min(internal_fs::kReadPieceBytes, window.window_bytes);
  window.thread_count = options_.thread_count;
  auto device_staging = [this]() {
    return internal_io::ReadStaging(options_.device_staging, owned_staging_);
  };
  internal_fs::BounceMeter meter;
  absl::Status status =
      internal_fs::ReadStoredItems(*stored, window, *engine_, pool, files,
                                   planner, device_staging, meter, dir_);
  peak_bounce_bytes_ = meter.peak();
  return status;
}

}  // namespace dcp
