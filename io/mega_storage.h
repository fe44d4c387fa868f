// MegaStorageWriter and MegaStorageReader: the seed's storage for MEGA
// directories (io/mega_format.h, docs/FORMAT.md section 8): shard files
// `model.mega` or `model-0000I-of-0000N.mega` and `model.mega.index.json`.
// The guarantees are the native format's:
//
// - Each tensor chunk (or non-tensor value) is an entry of one file, its
//   data 4 KiB aligned and covered by XXH3-64 block checksums; a load
//   verifies every byte it reads, reads a resharded slice in pieces of
//   whole checksum blocks covering only the rows it needs, and reads a
//   whole chunk into a whole contiguous host destination straight into it
//   (O_DIRECT where the file system takes it).
// - A save commits atomically: files are written under temporary names
//   (`.NAME.tmp-<save id>`) and fsynced; at Finish the coordinator writes
//   the index under a temporary name, then a commit journal,
//   `.dcp-mega-commit`, listing the renames (the index last) and the files
//   of the replaced checkpoint to remove, then applies and removes it. A
//   failure before the journal is durable leaves the previous checkpoint
//   as it was; after, whoever comes next (Abort, the next save's SetUp)
//   completes the commit. Readers refuse a directory whose journal is still
//   there (kFailedPrecondition), so they see the old checkpoint or the new
//   one, never a mix. The coordinator holds the directory lock from SetUp
//   to MarkCommitted or Abort.
// - Files read are untrusted (io/mega_format.h); the index must name
//   exactly the entries the files hold (kDataLoss naming file and tensor).
//
// Locations: a directory path, `mega:///abs/dir` or `mega://rel/dir`
// (MegaPathFromId). Thread safety: one instance serves one save or load at
// a time, driven from one thread (io/storage.h); WriteData/ReadData use
// internal threads.
#ifndef DCP_IO_MEGA_STORAGE_H_
#define DCP_IO_MEGA_STORAGE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "core/executor.h"
#include "io/file_system.h"
#include "io/file_system_storage.h"
#include "io/internal/journaled_writer.h"
#include "io/io_engine.h"
#include "io/storage.h"

namespace dcp {

class DeviceStaging;  // staging/device_staging.h

inline constexpr char kMegaScheme[] = "mega";

// The directory a MEGA checkpoint_id names: `mega:///abs/dir` -> "/abs/dir",
// `mega://rel/dir` -> "rel/dir", a plain path as it is. kInvalidArgument for
// `mega://` without a path or another scheme.
absl::StatusOr<std::string> MegaPathFromId(absl::string_view checkpoint_id);

struct MegaStorageWriterOptions {
  // Tensor name -> 1-based file index. Empty: every value in one file
  // (`model.mega`). A value missing from a non-empty mapping fails the save
  // (kInvalidArgument naming it). Saved by several ranks, a file index
  // whose values lie on more than one rank becomes one file per rank (each
  // file has one writer), numbered consecutively in (index, rank) order.
  std::map<std::string, int> fqn_to_index_mapping;
  // Files written in parallel per rank.
  int thread_count = 1;
  // Bytes per checksum block: a multiple of 4 KiB up to 1 GiB. A resharded
  // load reads whole blocks.
  int64_t checksum_block_size = int64_t{4} << 20;
  // As FileSystemWriterOptions.
  bool sync_files = true;
  bool direct_io = true;
  bool uncached_writes = true;
  int64_t writeback_bytes = int64_t{16} << 20;
  int64_t per_thread_copy_ahead = 10000000;
  // nullptr: LocalFileSystem(). Not owned; must outlive the writer.
  FileSystemBase* file_system = nullptr;
  // nullptr: an engine of `io_mode` owned by the writer. Not owned.
  IoEngine* io_engine = nullptr;
  IoMode io_mode = IoMode::kAuto;
  // Copies device tensors to host. Not owned; must outlive the writer.
  DeviceStaging* device_staging = nullptr;
};

// GetStorageMeta, SetDeviceWait, CommitDecided, MarkCommitted, Abort,
// path() (the path of a mega:// URI) and save_id() are
// internal_io::JournaledStorageWriter's.
class MegaStorageWriter final : public internal_io::JournaledStorageWriter {
 public:
  // `path`: a directory or a mega:// URI (an invalid one fails SetUp).
  explicit MegaStorageWriter(std::string path,
                             MegaStorageWriterOptions options = {});
  ~MegaStorageWriter() override;

  // A fresh save id; a non-empty `checkpoint_id` (path or mega:// URI)
  // replaces the directory. kInvalidArgument for an invalid URI.
  absl::Status Reset(const std::string& checkpoint_id) override;
  // Creates the directory. The coordinator then takes the directory lock
  // (kFailedPrecondition naming the holder), completes a commit an
  // interrupted save decided, removes temporary files of interrupted saves
  // and notes the MEGA files there, which Finish replaces.
  absl::Status SetUp(bool is_coordinator, int rank,
                     bool use_collectives) override;
  // kInvalidArgument naming the value whose name is not valid UTF-8
  // (escaped) or that the (non-empty) fqn_to_index_mapping lacks or maps
  // below 1; for a checksum block size out of range.
  absl::StatusOr<SavePlan> PrepareLocalPlan(SavePlan plan) override;
  // Assigns every file its name and its one writing rank (storage_data).
  absl::StatusOr<std::vector<SavePlan>> PrepareGlobalPlan(
      std::vector<SavePlan> plans) override;
  // Writes this rank's files under temporary names (thread_count at a
  // time), each fsynced, then the directory. The call blocks. Errors as
  // FileSystemWriter::WriteData, annotated with rank and file.
  Future<std::vector<WriteResult>> WriteData(const SavePlan& plan,
                                             SavePlanner& planner) override;
  // Coordinator: writes the index and commits (see the file comment).
  absl::Status Finish(
      const Metadata& metadata,
      const std::vector<std::vector<WriteResult>>& results) override;
  // This writer's checksum_block_size.
  void DescribeCommit(Metadata& metadata) const override {
    metadata.checksum_block_size = options_.checksum_block_size;
  }

 private:
  struct FileWork;
  absl::Status WriteFile(FileWork& work, SavePlanner& planner);
  // CompleteCommit of the MEGA commit journal.
  absl::Status CompleteCommitOnDisk() override;

  absl::Status path_error_;
  MegaStorageWriterOptions options_;
  // The index the coordinator planned.
  std::map<std::string, std::set<std::string>> weight_map_;
  int64_t total_size_ = 0;
};

// The reader delivers through the native reader (FileSystemReader) over
// metadata built from the MEGA headers: its options are those.
using MegaStorageReaderOptions = FileSystemReaderOptions;

class MegaStorageReader final : public StorageReader {
 public:
  // `path`: a directory or a mega:// URI (an invalid one fails
  // ReadMetadata).
  explicit MegaStorageReader(std::string path,
                             MegaStorageReaderOptions options = {});
  ~MegaStorageReader() override;

  absl::Status Reset(const std::string& checkpoint_id) override;
  // dcp Metadata from the index and the files' headers: one chunk per
  // tensor entry, StorageInfo at the entry's bytes with its checksums.
  // kNotFound without an index ("no MEGA checkpoint in DIR");
  // kFailedPrecondition while a commit journal is there; kDataLoss naming
  // the file (and the tensor) for a malformed header or index, a truncated
  // file, an index that does not name exactly the files' entries, chunks
  // of one tensor that disagree on dtype or shape, overlap or leave part
  // uncovered, or files with different checksum block sizes;
  // kUnimplemented for another major format version.
  absl::StatusOr<Metadata> ReadMetadata() override;
  absl::Status SetUp(const Metadata& metadata, bool is_coordinator) override;
  absl::StatusOr<LoadPlan> PrepareLocalPlan(LoadPlan plan) override;
  absl::StatusOr<std::vector<LoadPlan>> PrepareGlobalPlan(
      std::vector<LoadPlan> plans) override;
  // As FileSystemReader::ReadData (verified, slice reads, O_DIRECT straight
  // into whole destinations).
  Future<void> ReadData(const LoadPlan& plan, LoadPlanner& planner) override;

  const std::string& path() const { return path_; }

 private:
  // ReadMetadata's one look at the files.
  absl::StatusOr<Metadata> DescribeFiles();

  std::string path_;
  absl::Status path_error_;
  MegaStorageReaderOptions options_;
  FileSystemReader delegate_;
};

}  // namespace dcp

#endif  // DCP_IO_MEGA_STORAGE_H_
