// FileSystemWriter and FileSystemReader: the seed's file-system storage, a
// checkpoint directory holding one metadata file (io/metadata_format.h) and
// per-rank data files. docs/FORMAT.md specifies the layout; the guarantees:
//
// - A checkpoint exists only once its metadata file is committed (written
//   under a temporary name, fsynced, renamed, directory fsynced).
// - A save never reuses a file name (names carry the save id), so saving
//   over a checkpoint leaves the old one loadable until the new metadata is
//   committed; the old data files (those the old metadata names, nothing
//   else) are removed in MarkCommitted.
// - Files of interrupted saves do not accumulate: once it holds the
//   directory lock, the coordinator removes the orphans of earlier saves
//   (RemoveOrphans) before it writes anything.
// - One save into a directory at a time: the coordinator holds an advisory
//   lock on the directory from SetUp to the commit, and a second save fails
//   at SetUp naming the holder.
// - The metadata and data files are untrusted when read: every number and
//   name is validated before use (DecodeMetadata; the reader checks items
//   against the real file sizes), data files are opened without following
//   symbolic links, and a crafted checkpoint is kDataLoss, never an
//   out-of-bounds access or an unbounded allocation.
// - Every stored item carries XXH3-64 checksums of its blocks; the reader
//   verifies every byte it reads and rejects truncated files (kDataLoss).
// - A rank-local save (SaveOptions::use_collectives=false) makes each rank
//   an independent one-rank checkpoint in RankLocalDirectory(path, rank);
//   the writer and reader select it (SelectRankLocal, DetectRankLocal)
//   without changing the path they were given.
//
// Thread safety: one instance serves one save or load at a time, driven from
// one thread (see io/storage.h). WriteData and ReadData return at once and
// run on the instance's executor (options: `executor`, else a ThreadPool of
// thread_count threads the instance creates on first use and keeps); their
// futures resolve on its threads.
//
// The implementation's units (internal to io/): io/fs_layout.h (names,
// placement, a data file's layout), io/fs_file_writer.h (one data file's
// writes), io/fs_commit.h (the metadata commit and the crash-safety
// invariant), io/fs_read_plan.h (what a load reads) and io/fs_read_window.h
// (how it reads, verifies and delivers it).
#ifndef DCP_IO_FILE_SYSTEM_STORAGE_H_
#define DCP_IO_FILE_SYSTEM_STORAGE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "core/executor.h"
#include "io/checkpoint_formats.h"
#include "io/extensions.h"
#include "io/file_system.h"
#include "io/io_engine.h"
#include "io/storage.h"

namespace dcp {

class DeviceStaging;  // staging/device_staging.h
namespace internal_fs {
class CreatedFiles;  // io/fs_commit.h
}  // namespace internal_fs

// How a FileSystemWriter lays out its data files (docs/FORMAT.md section
// 2.1). kNative: dcp's own layout. kSafetensors: every data file is also a
// valid safetensors file (items named `fqn`, or `fqn@o0,o1,...` for a
// chunk at those offsets; bytes values as 1-D U8 tensors), the metadata's
// offsets counting from the file's start, so dcp loads it as usual. It is
// written buffered (direct_io is ignored) and refuses extensions.
enum class SerializationFormat : uint8_t {
  kNative = 0,
  kSafetensors = 1,
};

// The seed's FileSystemWriter keyword arguments.
struct FileSystemWriterOptions {
  // One data file per rank and writer thread (true) or one per item.
  bool single_file_per_rank = true;
  // fsync data files, the metadata file and the directory. Off trades crash
  // safety for speed (the rename stays atomic, durability is not promised).
  bool sync_files = true;
  // Data files written in parallel per rank (items are balanced by bytes).
  int thread_count = 1;
  // Bytes of device data copied ahead of the writer per thread: device
  // tensors are copied into pinned chunks of a bounded pool (see
  // device_staging) and each chunk is written while the next is copied. The
  // pool the writer creates holds thread_count x this, rounded up to whole
  // 8 MiB chunks and at least two per thread. CPU tensors are written
  // straight from their memory.
  int64_t per_thread_copy_ahead = 10000000;
  // false: SetUp fails with kAlreadyExists on a directory that holds a
  // committed checkpoint.
  bool overwrite = true;
  // Bytes per checksum block (recorded as Metadata::checksum_block_size).
  int64_t checksum_block_size = int64_t{4} << 20;
  // Stream extensions (io/extensions.h; ParseCompression("zstd:3")) applied
  // to host tensors larger than 64 KiB, block by block (the checksum
  // blocks): each block encoded on the writer's thread while earlier blocks
  // are written, stored as is when it would not shrink, and recorded in the
  // metadata (docs/FORMAT.md section 3.1; a checkpoint that uses them is
  // version dcp-2). Device tensors and smaller items are stored as they
  // are. Empty (the default): no extensions, the dcp-1 format.
  ExtensionChain extensions;
  // The file system to use; nullptr means LocalFileSystem(). Not owned; must
  // outlive the writer.
  FileSystemBase* file_system = nullptr;
  // Open data files with O_DIRECT (where the file system supports it; tmpfs
  // and others that refuse it get buffered I/O): every write is then 4 KiB
  // aligned; unaligned tails and unaligned memory go through aligned bounce
  // chunks (at most 32 MiB in flight per file). On by default: at 4 GiB
  // faster than buffered (uncached) writes plus fsync, at 1 GiB within the
  // disk's noise of them (docs/BENCHMARKS.md section 1), and it keeps the
  // checkpoint out of the page cache on every kernel.
  bool direct_io = true;
  // Buffered data files with sync_files: after every this many bytes
  // written to a file, start writing them back to the disk (File::
  // StartWriteback) instead of leaving all of it to the final fsync. The
  // disk then works while the rest is written, and the dirty pages stay
  // below the kernel's limit, past which it throttles the writer (with the
  // state itself in memory the limit is lower). 0 turns it off; O_DIRECT
  // files have no dirty pages (docs/BENCHMARKS.md section 1,
  // "Writeback").
  int64_t writeback_bytes = int64_t{16} << 20;
  // Buffered data files leave the page cache as their bytes reach the disk
  // (OpenOptions::uncached: RWF_DONTCACHE on Linux 6.14+; elsewhere they
  // are written as usual). A checkpoint then neither evicts the training
  // job's cached files nor has the kernel find fresh memory for each of its
  // pages, which is what slows a large buffered save. The price: a load
  // right after the save reads from the disk, as it does after an O_DIRECT
  // save (docs/BENCHMARKS.md section 1, "Uncached buffered I/O").
  bool uncached_writes = true;
  // The I/O engine; nullptr means one of `io_mode` owned by the writer. Not
  // owned; must outlive the writer.
  IoEngine* io_engine = nullptr;
  IoMode io_mode = IoMode::kAuto;
  // Copies device tensors to host (runtime and staging pool). nullptr: the
  // writer creates one on its first device tensor, with the auto device
  // runtime and the pool size above, and registers the pool with its own
  // I/O engine as fixed buffers. Pass one to use a runtime of your own (the
  // device tensors must belong to it) or to share a pool between writers.
  // Not owned; must outlive the writer.
  DeviceStaging* device_staging = nullptr;
  // Runs WriteData: one task per call, which writes files itself and with
  // up to thread_count - 1 more tasks (RunWorkers in io/internal/
  // parallel_work.h: it never waits for a free thread, so a one-thread pool
  // works). nullptr: a ThreadPool of thread_count threads the writer creates
  // on its first WriteData and keeps. Not owned; must outlive the writer.
  // An InlineExecutor makes WriteData run on the calling thread.
  Executor* executor = nullptr;
  // The data files' layout. kSafetensors with non-empty `extensions` fails
  // at SetUp with kInvalidArgument.
  SerializationFormat serialization_format = SerializationFormat::kNative;
};

// What RemoveOrphans found in a checkpoint directory. Orphans are the files
// a FileSystemWriter creates that the committed metadata does not name:
// data files named `__<rank>_<save id>_<k>.distcp` (save id: 16 lowercase
// hex digits) and temporary metadata `.metadata.tmp-<save id>`, both
// regular files. A save that was killed or failed before its Abort leaves
// them behind, each as large as it was preallocated.
struct OrphanCleanup {
  // The orphans removed (names, sorted) and their total size in bytes.
  std::vector<std::string> removed;
  int64_t removed_bytes = 0;
  // Orphans found but not removed (their removal failed) and their bytes.
  std::vector<std::string> left;
  int64_t left_bytes = 0;
  // OK, or why orphans may remain: the first failed removal, or why the
  // directory was not searched (its committed metadata exists but cannot be
  // read or decoded, so which files it names is unknown and nothing is
  // removed; or the directory cannot be listed).
  absl::Status status;

  // One sentence for a message about `dir` ("removed 3 orphaned files
  // (3221225472 bytes) of interrupted saves from DIR"), or "" when nothing
  // was found and nothing went wrong.
  std::string Summary(absl::string_view dir) const;
};

// Removes the orphans (see OrphanCleanup) from checkpoint directory `dir`,
// and nothing else: never a file the committed `.metadata` names, a file of
// another name or kind (a symbolic link, a FIFO), or anything at all when
// `.metadata` exists but cannot be read or decoded (then `status` says why).
// A directory without `.metadata` has no committed files: every data file
// and temporary metadata file of dcp's naming in it is an orphan. The caller
// must hold the directory's lock (FileSystemBase::LockDirectory): an orphan
// is indistinguishable from a file a save running now is writing.
OrphanCleanup RemoveOrphans(FileSystemBase& fs, const std::string& dir);

// Whether `name` has the form of a file a FileSystemWriter creates (a data
// file or a temporary metadata file): an orphan where the committed
// metadata does not name it.
bool IsWriterFileName(absl::string_view name);

class FileSystemWriter final : public StorageWriter {
 public:
  explicit FileSystemWriter(std::string path,
                            FileSystemWriterOptions options = {});
  ~FileSystemWriter() override;

  // Device tensors of the next WriteData are copied only after `wait`.
  absl::Status SetDeviceWait(const DeviceWait& wait) override;
  // Resets per-save state (a rank-local selection included) and draws a
  // fresh save id; a non-empty `checkpoint_id` replaces the directory.
  absl::Status Reset(const std::string& checkpoint_id) override;
  // The save writes RankLocalDirectory(path(), rank) as a one-rank
  // checkpoint, until the next Reset; path() stays as it is.
  // kInvalidArgument for a negative rank.
  absl::Status SelectRankLocal(int rank) override;
  StorageMeta GetStorageMeta() const override;
  // Creates the directory (and parents). The coordinator then takes the
  // directory's advisory lock (FileSystemBase::LockDirectory; a rank-local
  // save also takes path()'s lock shared, so saves of the other layout stay
  // out), held until
  // MarkCommitted, Abort, Reset or destruction, notes the data files the
  // committed metadata there names (the files MarkCommitted may remove) and
  // removes the orphans of interrupted saves (RemoveOrphans; what it did is
  // orphan_cleanup(), and a failure to remove them does not fail the save).
  // kFailedPrecondition naming the holder (pid, host, save id) while another
  // save into the directory holds the lock: saves into one directory must
  // not overlap. kAlreadyExists with overwrite off and a committed
  // checkpoint there; kPermissionDenied naming the path when the directory
  // cannot be written; kInvalidArgument for a checksum_block_size above
  // kMaxChecksumBlockSize.
  absl::Status SetUp(bool is_coordinator, int rank,
                     bool use_collectives) override;
  absl::StatusOr<SavePlan> PrepareLocalPlan(SavePlan plan) override;
  // Gives plan i the data file prefix of rank i (in storage_data).
  absl::StatusOr<std::vector<SavePlan>> PrepareGlobalPlan(
      std::vector<SavePlan> plans) override;
  // Writes this rank's items into new data files (see the class comment)
  // through the I/O engine: thread_count threads resolve, checksum and
  // submit items of their files while earlier writes are in flight; each
  // file is fsynced after its writes (sync_files). Returns at once; the
  // work runs on the executor and the future resolves when the data is
  // durable. `plan` and `planner` must outlive the future. Out of space
  // (kResourceExhausted, here and in Finish), the coordinator's message
  // also says what orphan_cleanup() found, when it found anything.
  Future<std::vector<WriteResult>> WriteData(const SavePlan& plan,
                                             SavePlanner& planner) override;
  absl::Status Finish(
      const Metadata& metadata,
      const std::vector<std::vector<WriteResult>>& results) override;
  // The format version, this writer's checksum_block_size and its
  // storage_meta (when the metadata has none).
  void DescribeCommit(Metadata& metadata) const override;
  // True once Finish has renamed the metadata into place (a failure after
  // that, making the rename durable, leaves the new checkpoint committed).
  bool CommitDecided() const override { return committed_; }
  // Coordinator: removes the data files that the metadata committed before
  // this save named (read at SetUp) and the new one does not, then releases
  // the directory lock (SetUp removed the orphans of earlier saves). Other
  // ranks: keeps the files this save wrote.
  absl::Status MarkCommitted() override;
  // Removes every file this save created (data files, temporary metadata);
  // after a commit it removes nothing. Releases the directory lock.
  void Abort() override;

  // The location the writer was given (at construction or by Reset).
  const std::string& path() const { return path_; }
  // Where the current save writes: path(), or its rank-local directory.
  const std::string& directory() const { return dir_; }
  const std::string& save_id() const { return save_id_; }
  // What the coordinator's last SetUp removed (empty on other ranks).
  const OrphanCleanup& orphan_cleanup() const { return orphan_cleanup_; }

 private:
  // Finish without WithOrphanNote.
  absl::Status CommitMetadata(
      const Metadata& metadata,
      const std::vector<std::vector<WriteResult>>& results);
  // The coordinator's part of SetUp once it holds the directory lock.
  absl::Status SetUpLocked();
  // The coordinator's save marker (save_marker_), where all ranks share
  // dir_.
  absl::Status CreateSaveMarker();
  // Another rank's check, before it writes `plan`, that dir_ holds the
  // coordinator's marker: kFailedPrecondition naming the rank and dir_
  // where it does not (the ranks were given different directories).
  absl::Status CheckCoordinatorDirectory(const SavePlan& plan);
  // `status`, with orphan_cleanup_'s summary added when it is
  // kResourceExhausted (the space orphans took, or take, is the reader's
  // next question).
  absl::Status WithOrphanNote(absl::Status status) const;
  // The staging for device tensors (options_.device_staging or one of the
  // writer's own, created on first use; its pool registered with an owned
  // engine).
  absl::StatusOr<DeviceStaging*> Staging();
  // options_.executor, or the writer's own pool (created on first use).
  Executor& executor();

  std::string path_;
  std::string dir_;  // path_ or its rank-local directory.
  FileSystemWriterOptions options_;
  FileSystemBase* fs_;
  std::unique_ptr<IoEngine> owned_engine_;
  IoEngine* engine_ = nullptr;
  absl::Status engine_error_;  // Reported by SetUp.
  std::string save_id_;
  // The coordinator's SaveMarkerFileName in dir_ while it exists (SetUp of
  // a save into the directory all ranks share, to the start of Finish).
  std::string save_marker_;
  bool is_coordinator_ = true;
  int rank_ = 0;
  // The group rank SelectRankLocal chose (its save runs alone, as rank 0):
  // what messages name. -1 when no rank-local directory is selected.
  int rank_local_rank_ = -1;
  bool committed_ = false;
  DeviceWait device_wait_;  // For the next WriteData's device copies.
  // The data files of the replaced checkpoint (its metadata at SetUp names
  // them): the only files MarkCommitted may remove.
  std::set<std::string> replaceable_files_;
  // The coordinator's lock of the directory, from SetUp until MarkCommitted,
  // Abort or Reset.
  std::unique_ptr<DirectoryLock> directory_lock_;
  // A rank-local save's shared lock of path() (its parent), held with
  // directory_lock_: a save of all ranks together locks path() exclusively,
  // so the two layouts never run into one directory at once (each checks
  // for the other's metadata under its lock).
  std::unique_ptr<DirectoryLock> layout_lock_;
  // Data files the committed metadata references.
  std::set<std::string> committed_files_;
  OrphanCleanup orphan_cleanup_;
  // What this save created (Abort removes it until the commit).
  std::unique_ptr<internal_fs::CreatedFiles> created_;

  absl::Mutex mu_;
  std::unique_ptr<DeviceStaging> owned_staging_ ABSL_GUARDED_BY(mu_);
  bool staging_registered_ ABSL_GUARDED_BY(mu_) = false;
  // Declared last: destroyed first, it finishes its tasks while the rest
  // of the writer is still there.
  std::unique_ptr<ThreadPool> owned_executor_;
};

struct FileSystemReaderOptions {
  // Threads verifying checksums, decoding items stored through extensions
  // and delivering items (reads themselves are all in flight in the I/O
  // engine).
  int thread_count = 1;
  // The extensions a load decodes; nullptr means ExtensionRegistry::
  // Default() (zstd). An item stored through one it does not know fails
  // the load before any read (kFailedPrecondition naming the item and the
  // descriptor). Not owned; must outlive the reader.
  const ExtensionRegistry* extensions = nullptr;
  // nullptr means LocalFileSystem(). Not owned; must outlive the reader.
  FileSystemBase* file_system = nullptr;
  // Bytes of bounce buffers per window of reads; two windows are in memory
  // at once. Stored items that cannot be read straight into their
  // destination (resharded boxes, strided or unaligned destinations) are
  // read in pieces of at most min(16 MiB, read_window_bytes) (whole checksum
  // blocks, and at least one element), and their boxes copied out piece by
  // piece, so a load's bounce memory stays under about
  // 2 * max(read_window_bytes, 2 checksum blocks + 8 KiB) however large the
  // stored items. Only non-tensor (bytes) values are read whole.
  int64_t read_window_bytes = int64_t{64} << 20;
  // Read with O_DIRECT (where supported): aligned reads straight into 4 KiB
  // aligned destinations, the rest through aligned bounce buffers. On by
  // default: faster than cold buffered reads (docs/BENCHMARKS.md section 1).
  // Files that open buffered anyway (tmpfs, ramfs, hugetlbfs, file systems
  // that refuse O_DIRECT) are read straight into destinations at any
  // alignment.
  bool direct_io = true;
  // Buffered reads leave the page cache behind the reader
  // (OpenOptions::uncached: POSIX_FADV_DONTNEED of each 4 MiB stretch once
  // it and its neighbours are read; pages cached before the load go too).
  // A checkpoint is read once, into its tensors: caching it would evict the
  // job's other files, and the recycled pages are cheaper than fresh ones.
  // Plain reads dropped behind the reader, not RWF_DONTCACHE reads: those
  // reach the disk as small requests and read parts of the file twice
  // (docs/BENCHMARKS.md section 1, "Dropping read pages behind the reader",
  // "Uncached buffered I/O").
  bool uncached_reads = true;
  // The I/O engine; nullptr means one of `io_mode` owned by the reader. Not
  // owned; must outlive the reader.
  IoEngine* io_engine = nullptr;
  IoMode io_mode = IoMode::kAuto;
  // Copies into device tensors: verified bytes are gathered into pinned
  // chunks and copied to the device as contiguous runs (io/
  // device_box_upload.h), overlapping the next reads. nullptr: the reader
  // creates one on its first device destination (auto device runtime, a
  // 64 MiB pool). Pass one to use a runtime of your own (the destinations
  // must belong to it). Not owned; must outlive the reader.
  DeviceStaging* device_staging = nullptr;
  // Runs ReadData: one task per call, which submits the reads and verifies
  // and delivers with up to thread_count - 1 more tasks (as the writer's
  // `executor`). nullptr: a ThreadPool of thread_count threads the reader
  // creates on its first ReadData and keeps. Not owned; must outlive the
  // reader.
  Executor* executor = nullptr;
};

class FileSystemReader final : public StorageReader {
 public:
  explicit FileSystemReader(std::string path,
                            FileSystemReaderOptions options = {});
  ~FileSystemReader() override;

  // Clears the metadata and a rank-local selection; a non-empty
  // `checkpoint_id` replaces the directory.
  absl::Status Reset(const std::string& checkpoint_id) override;
  // True when path() holds rank-local checkpoints (RankLocalDirectory(
  // path(), 0) has a metadata file): the reader then reads rank `rank`'s,
  // until the next Reset or DetectRankLocal; path() stays as it is.
  // kFailedPrecondition naming both metadata files when path() has its own
  // too; kInvalidArgument for a negative rank.
  absl::StatusOr<bool> DetectRankLocal(int rank) override;
  // kNotFound "no committed checkpoint in DIR" without a metadata file;
  // kDataLoss when it is torn, corrupt or not a dcp metadata file.
  absl::StatusOr<Metadata> ReadMetadata() override;
  absl::Status SetUp(const Metadata& metadata, bool is_coordinator) override;
  absl::StatusOr<LoadPlan> PrepareLocalPlan(LoadPlan plan) override;
  absl::StatusOr<std::vector<LoadPlan>> PrepareGlobalPlan(
      std::vector<LoadPlan> plans) override;
  // Reads the bytes of each stored item the plan uses once, verifies their
  // checksums, then delivers every ReadItem that uses them. A tensor item
  // that covers a whole stored chunk and a whole contiguous host destination
  // is read straight into the destination (no bounce copy); other tensor
  // items are read in bounded pieces covering only the elements their boxes
  // need (see read_window_bytes). Each destination is resolved once and
  // committed after its last piece. Reads are issued together through the
  // I/O engine, in windows of `read_window_bytes` of bounce buffers, and
  // verification overlaps the next window's reads. Device destinations are
  // filled through device_staging and committed once every copy to them has
  // landed. Returns at once; the work runs on the executor (the planner is
  // called from its threads) and the future resolves when every
  // destination is committed. `plan` and `planner` must outlive the future.
  Future<void> ReadData(const LoadPlan& plan, LoadPlanner& planner) override;

  // The location the reader was given (at construction or by Reset).
  const std::string& path() const { return path_; }
  // Where it reads: path(), or the rank-local directory DetectRankLocal
  // selected.
  const std::string& directory() const { return dir_; }
  // The most bounce-buffer bytes the last ReadData held at once.
  int64_t peak_bounce_bytes() const { return peak_bounce_bytes_; }

  // For a reader of metadata another format builds (MegaStorageReader,
  // whose metadata has no save id): reads that metadata again, so that a
  // ReadData failing with kDataLoss can tell a checkpoint another save
  // replaced meanwhile (its files now described otherwise: kAborted) from
  // a damaged one.
  void SetMetadataSource(
      absl::AnyInvocable<absl::StatusOr<Metadata>()> source) {
    metadata_source_ = std::move(source);
  }

 private:
  // ReadData's work, on `pool`: ReadFiles; a kDataLoss of data files that
  // a save committed (or a removal) took away after this reader read the
  // metadata it loads by is kAborted saying so.
  absl::Status Read(const LoadPlan& plan, LoadPlanner& planner, Executor& pool);
  absl::Status ReadFiles(const LoadPlan& plan, LoadPlanner& planner,
                         Executor& pool);
  // options_.executor, or the reader's own pool (created on first use).
  Executor& executor();

  std::string path_;
  std::string dir_;  // path_ or its rank-local directory.
  FileSystemReaderOptions options_;
  FileSystemBase* fs_;
  std::unique_ptr<IoEngine> owned_engine_;
  IoEngine* engine_ = nullptr;
  absl::Status engine_error_;  // Reported by SetUp.
  std::optional<Metadata> metadata_;
  int64_t peak_bounce_bytes_ = 0;
  // The save id of the metadata ReadMetadata last returned ("" before).
  std::string read_save_id_;
  absl::AnyInvocable<absl::StatusOr<Metadata>()> metadata_source_;
  std::unique_ptr<DeviceStaging> owned_staging_;
  // Declared last: destroyed first, it finishes its tasks while the rest
  // of the reader is still there.
  std::unique_ptr<ThreadPool> owned_executor_;
};

}  // namespace dcp

#endif  // DCP_IO_FILE_SYSTEM_STORAGE_H_
