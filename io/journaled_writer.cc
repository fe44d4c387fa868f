#include "io/internal/journaled_writer.h"

#include <algorithm>
#include <atomic>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "io/fs_layout.h"
#include "io/internal/commit_journal.h"
#include "io/internal/parallel_work.h"
#include "io/internal/sequential_writer.h"
#include "io/internal/storage_resources.h"
#include "io/internal/untrusted_json.h"
#include "planner/plan_cache.h"
#include "staging/device_staging.h"

namespace dcp::internal_io {

absl::Status CheckUtf8Names(const SavePlan& plan, absl::string_view format) {
  for (const WriteItem& item : plan.items) {
    if (!IsValidUtf8(item.index.fqn)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the name \"", absl::CHexEscape(item.index.fqn),
          "\" is not valid UTF-8; ", format, " holds UTF-8 names only"));
    }
  }
  return absl::OkStatus();
}

std::string TempRelativePath(absl::string_view relative,
                             absl::string_view save_id) {
  const size_t slash = relative.rfind('/');
  const absl::string_view dir =
      slash == absl::string_view::npos ? "" : relative.substr(0, slash + 1);
  const absl::string_view base = relative.substr(dir.size());
  return absl::StrCat(dir, ".", base, ".tmp-", save_id);
}

JournaledStorageWriter::JournaledStorageWriter(
    std::string path, const JournaledWriterOptions& options)
    : path_(std::move(path)),
      fs_(OrLocal(options.file_system)),
      save_id_(internal_fs::NewSaveId()),
      commit_(std::make_unique<JournaledSave>()),
      options_(options) {
  engine_ = EngineOrOwn(options_.io_engine, options_.io_mode, owned_engine_,
                        engine_error_);
  options_.thread_count = std::max(1, options_.thread_count);
}

JournaledStorageWriter::~JournaledStorageWriter() = default;

StorageMeta JournaledStorageWriter::GetStorageMeta() const {
  StorageMeta meta;
  meta.checkpoint_id = path_;
  meta.save_id = save_id_;
  return meta;
}

absl::Status JournaledStorageWriter::SetDeviceWait(const DeviceWait& wait) {
  device_wait_ = wait;
  return absl::OkStatus();
}

bool JournaledStorageWriter::CommitDecided() const {
  return commit_->decided();
}

absl::Status JournaledStorageWriter::MarkCommitted() {
  commit_->MarkCommitted();
  return absl::OkStatus();
}

void JournaledStorageWriter::Abort() {
  commit_->Abort(*fs_, [&] { return CompleteCommitOnDisk(); });
}

void JournaledStorageWriter::StartSave() {
  save_id_ = internal_fs::NewSaveId();
  commit_->Reset();
  replaced_.clear();
  device_wait_ = DeviceWait{};
}

absl::Status JournaledStorageWriter::LockAndRecover(
    absl::string_view directory) {
  return commit_->LockAndRecover(
      *fs_, path_,
      absl::StrCat(ThisProcessDescription(), " (save ", save_id_, ")"), [&] {
        return Annotate(CompleteCommitOnDisk(),
                        absl::StrCat(directory, " ", path_));
      });
}

absl::StatusOr<std::vector<JournaledStorageWriter::PlannedItems>>
JournaledStorageWriter::PlannedItemsOf(const std::vector<SavePlan>& plans,
                                       absl::string_view writer,
                                       absl::string_view format) {
  // A marker for an older plan fails that rank's WriteData, or Finish's
  // check of the index against the results, before anything commits.
  std::vector<PlannedItems> items(plans.size());
  for (size_t r = 0; r < plans.size(); ++r) {
    if (IsUnchangedSavePlan(plans[r])) {
      if (r >= last_items_.size()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "rank ", r, " sent an unchanged-plan marker, but this ", writer,
            " has not seen its plan (reuse the writer across saves with "
            "enable_plan_caching)"));
      }
      items[r] = last_items_[r];
      continue;
    }
    // Again here: WriteData plans a single rank's plan by hand without
    // PrepareLocalPlan.
    DCP_RETURN_IF_ERROR(CheckUtf8Names(plans[r], format));
    for (const WriteItem& item : plans[r].items) {
      items[r].emplace_back(item.index.fqn, item.StorageBytes());
    }
  }
  last_items_ = items;
  return items;
}

absl::StatusOr<std::string> JournaledStorageWriter::StorageDataOf(
    const SavePlan& plan) {
  if (!plan.storage_data.empty()) return plan.storage_data;
  DCP_ASSIGN_OR_RETURN(std::vector<SavePlan> planned,
                       PrepareGlobalPlan({plan}));
  return planned.front().storage_data;
}

absl::Status JournaledStorageWriter::WriteFiles(
    size_t count, int pool_threads,
    absl::FunctionRef<absl::Status(size_t)> write_file,
    const std::string& dir) {
  FirstError error;
  std::atomic<size_t> next{0};
  RunWorkers(PoolOf(pool_, pool_threads),
             static_cast<int>(std::min<size_t>(options_.thread_count, count)),
             [&](int) {
               for (size_t f = next++; f < count && !error.failed();
                    f = next++) {
                 error.Update(write_file(f));
               }
             });
  absl::Status status = error.status();
  if (status.ok() && options_.sync_files && count > 0) {
    status = fs_->SyncDir(dir);
  }
  return status;
}

std::string JournaledStorageWriter::TempPath(absl::string_view relative) const {
  return JoinPath(path_, TempRelativePath(relative, save_id_));
}

absl::StatusOr<std::unique_ptr<File>> JournaledStorageWriter::CreateTempFile(
    const std::string& path) {
  OpenOptions open_options;
  open_options.direct = options_.direct_io;
  open_options.uncached = options_.uncached_writes;
  DCP_ASSIGN_OR_RETURN(std::unique_ptr<File> file,
                       fs_->OpenForWrite(path, open_options));
  commit_->RecordCreated(path);
  return file;
}

SequentialWriterOptions JournaledStorageWriter::WriterOptions(
    const File& file) const {
  SequentialWriterOptions writer_options;
  writer_options.direct = file.direct();
  writer_options.writeback_bytes =
      options_.sync_files ? options_.writeback_bytes : 0;
  return writer_options;
}

absl::StatusOr<DeviceStaging*> JournaledStorageWriter::Staging() {
  absl::MutexLock lock(&mu_);
  if (options_.device_staging != nullptr) return options_.device_staging;
  if (owned_staging_ == nullptr) {
    owned_staging_ =
        NewWriteStaging(options_.per_thread_copy_ahead, options_.thread_count);
  }
  return owned_staging_.get();
}

absl::Status JournaledStorageWriter::StageAndAppend(
    const std::vector<PipelineItem>& items, SequentialWriter& writer,
    absl::FunctionRef<absl::Status(size_t, const std::byte*, int64_t)>
        before_append) {
  DCP_ASSIGN_OR_RETURN(DeviceStaging * staging, Staging());
  return staging->Stage(
      items,
      [&](StagedPiece piece) -> absl::Status {
        if (piece.length == 0) return absl::OkStatus();
        const std::byte* data = piece.chunk.data();
        const auto length = static_cast<int64_t>(piece.length);
        DCP_RETURN_IF_ERROR(before_append(piece.destination, data, length));
        auto lease = std::make_shared<PoolChunk>(std::move(piece.chunk));
        return writer.Append(data, length, std::move(lease));
      },
      device_wait_);
}

absl::Status JournaledStorageWriter::CommitSave(absl::string_view journal_name,
                                                const std::string& temp_journal,
                                                const CommitJournal& journal) {
  return commit_->Commit(*fs_, path_, journal_name, temp_journal, journal,
                         options_.sync_files);
}

}  // namespace dcp::internal_io
