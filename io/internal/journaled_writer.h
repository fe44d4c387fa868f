// Internal to io/: JournaledStorageWriter, what the storage writers whose
// files have fixed names and whose commit is a journal (io/hf_storage.h,
// io/mega_storage.h) share: the save id and the save's commit state, the
// coordinator's lock and recovery, the plan-caching markers, the writer
// threads and device staging, and temporary files. Each writer keeps its
// own format: plans, file contents, the index and the journal's contents.
//
// Thread safety: one instance serves one save at a time, driven from one
// thread (io/storage.h); WriteFiles runs its callback on several threads,
// and CreateTempFile, WriterOptions, Staging and StageAndAppend may be
// called from them.
#ifndef DCP_IO_INTERNAL_JOURNALED_WRITER_H_
#define DCP_IO_INTERNAL_JOURNALED_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "core/executor.h"
#include "io/file_system.h"
#include "io/io_engine.h"
#include "io/storage.h"

namespace dcp {

class DeviceStaging;  // staging/device_staging.h
struct PipelineItem;  // staging/staging_pipeline.h

namespace internal_io {

class JournaledSave;  // io/internal/commit_journal.h
struct CommitJournal;
class SequentialWriter;  // io/internal/sequential_writer.h
struct SequentialWriterOptions;

// The options of a journaled writer that the shared part uses (the
// writer's options of the same names).
struct JournaledWriterOptions {
  // nullptr: LocalFileSystem(). Not owned.
  FileSystemBase* file_system = nullptr;
  // nullptr: an engine of `io_mode` owned by the writer. Not owned.
  IoEngine* io_engine = nullptr;
  IoMode io_mode = IoMode::kAuto;
  // nullptr: staging made on first use (NewWriteStaging). Not owned.
  DeviceStaging* device_staging = nullptr;
  // Files written in parallel (at least 1).
  int thread_count = 1;
  int64_t per_thread_copy_ahead = 10000000;
  bool sync_files = true;
  bool direct_io = true;
  bool uncached_writes = true;
  int64_t writeback_bytes = 0;
};

// The JournaledWriterOptions of a writer's options, which have members of
// the same names.
template <typename WriterOptions>
JournaledWriterOptions JournaledOptionsOf(const WriterOptions& options) {
  return {.file_system = options.file_system,
          .io_engine = options.io_engine,
          .io_mode = options.io_mode,
          .device_staging = options.device_staging,
          .thread_count = options.thread_count,
          .per_thread_copy_ahead = options.per_thread_copy_ahead,
          .sync_files = options.sync_files,
          .direct_io = options.direct_io,
          .uncached_writes = options.uncached_writes,
          .writeback_bytes = options.writeback_bytes};
}

// kInvalidArgument naming (escaped) the first value of `plan` whose name is
// not valid UTF-8: the JSON headers, index and plans of the formats cannot
// hold it (nlohmann's dump() throws). `format` names the format in the
// message ("a Hugging Face checkpoint (safetensors headers, JSON index)").
absl::Status CheckUtf8Names(const SavePlan& plan, absl::string_view format);

// The temporary name of checkpoint file `relative` in save `save_id`:
// ".NAME.tmp-<save id>" in the same directory.
std::string TempRelativePath(absl::string_view relative,
                             absl::string_view save_id);

// The shared part of a journaled writer (see the file comment).
class JournaledStorageWriter : public StorageWriter {
 public:
  ~JournaledStorageWriter() override;

  // checkpoint_id: the directory; save_id: this save's.
  StorageMeta GetStorageMeta() const override;
  absl::Status SetDeviceWait(const DeviceWait& wait) override;
  // True once Finish has made its commit journal durable.
  bool CommitDecided() const override;
  // Releases the directory lock; on other ranks, keeps this save's files.
  absl::Status MarkCommitted() override;
  // Before the commit was decided: removes this save's files. After: the
  // commit is completed instead (CompleteCommitOnDisk). Releases the lock.
  void Abort() override;

  // The checkpoint directory.
  const std::string& path() const { return path_; }
  const std::string& save_id() const { return save_id_; }

 protected:
  // (name, stored bytes) of each item of one rank's plan.
  using PlannedItems = std::vector<std::pair<std::string, int64_t>>;

  JournaledStorageWriter(std::string path,
                         const JournaledWriterOptions& options);

  // Completes the commit a journal in path_ records, if there is one: the
  // coordinator's recovery at SetUp and Abort after the decision.
  virtual absl::Status CompleteCommitOnDisk() = 0;

  // A new save: a fresh save id, no files created or replaced, no device
  // wait. The writer resets its own plan state.
  void StartSave();

  // The coordinator's SetUp: takes the directory lock (kFailedPrecondition
  // naming the holder while another save has it) and completes a commit an
  // interrupted save decided (its error annotated with `directory` and
  // path_, e.g. "MEGA directory /ckpt").
  absl::Status LockAndRecover(absl::string_view directory);

  // The items of each rank's plan, kept for the next save: a rank whose
  // plan is unchanged (plan caching) sent a marker without items, and its
  // items are those of its plan in this writer's previous save. Names are
  // checked as CheckUtf8Names does, `format` naming the format. `writer`
  // names the class in the kFailedPrecondition for a marker of a rank this
  // writer has not seen.
  absl::StatusOr<std::vector<PlannedItems>> PlannedItemsOf(
      const std::vector<SavePlan>& plans, absl::string_view writer,
      absl::string_view format);

  // The plan's storage_data; for a plan that never went through
  // PrepareGlobalPlan (a single rank driven by hand), that of
  // PrepareGlobalPlan({plan}).
  absl::StatusOr<std::string> StorageDataOf(const SavePlan& plan);

  // Runs write_file(0) .. write_file(count - 1) on up to thread_count
  // threads of the writer's pool (made with `pool_threads` threads on
  // first use), stopping at the first error; then, with sync_files and at
  // least one file, syncs `dir`. The first error.
  absl::Status WriteFiles(size_t count, int pool_threads,
                          absl::FunctionRef<absl::Status(size_t)> write_file,
                          const std::string& dir);

  // The temporary path of checkpoint file `relative` in this save
  // (".NAME.tmp-<save id>" in its directory).
  std::string TempPath(absl::string_view relative) const;

  // Creates the file `path` (with direct_io and uncached_writes) and
  // records it as this save's (Abort removes it before the decision).
  absl::StatusOr<std::unique_ptr<File>> CreateTempFile(const std::string& path);

  // How `file` is written front to back: direct as it was opened, with
  // writeback every writeback_bytes when sync_files.
  SequentialWriterOptions WriterOptions(const File& file) const;

  // Streams `items` through device staging into `writer`, in item order:
  // for each non-empty piece, `before_append(destination, data, length)`
  // (the item's PipelineItem destination), then the piece is appended
  // from its pinned chunk, which returns to the pool once written. The
  // staging's error, the callback's or the writer's.
  absl::Status StageAndAppend(
      const std::vector<PipelineItem>& items, SequentialWriter& writer,
      absl::FunctionRef<absl::Status(size_t, const std::byte*, int64_t)>
          before_append);

  // Writes `journal` and carries it out (JournaledSave::Commit) with
  // `temp_journal` as its temporary path.
  absl::Status CommitSave(absl::string_view journal_name,
                          const std::string& temp_journal,
                          const CommitJournal& journal);

 private:
  // Declared first, so destroyed last: after the pool and the save's state
  // that may still use the engine.
  std::unique_ptr<IoEngine> owned_engine_;

 protected:
  std::string path_;
  FileSystemBase* fs_;
  IoEngine* engine_ = nullptr;
  // The engine's set-up error, reported at SetUp.
  absl::Status engine_error_;
  std::string save_id_;
  int rank_ = 0;
  // The created files, the decision and the directory lock of this save.
  std::unique_ptr<JournaledSave> commit_;
  // Files (relative to path_) of the checkpoint this save replaces.
  std::set<std::string> replaced_;
  std::unique_ptr<ThreadPool> pool_;  // Writer threads.

 private:
  absl::StatusOr<DeviceStaging*> Staging();

  JournaledWriterOptions options_;
  DeviceWait device_wait_;
  // The coordinator's view of each rank's items in the last global plan
  // (kept across saves: plan caching sends markers for unchanged plans).
  std::vector<PlannedItems> last_items_;
  absl::Mutex mu_;
  std::unique_ptr<DeviceStaging> owned_staging_ ABSL_GUARDED_BY(mu_);
};

}  // namespace internal_io
}  // namespace dcp

#endif  // DCP_IO_INTERNAL_JOURNALED_WRITER_H_
