// HuggingFaceStorageWriter and HuggingFaceStorageReader: the seed's storage
// for Hugging Face checkpoint directories, safetensors files (io/
// safetensors.h) plus a `model.safetensors.index.json` that maps each
// tensor to its file. docs/FORMAT.md ("Hugging Face directories") gives the
// layout; the guarantees:
//
// - Files: `model-00001-of-0000N.safetensors`, where fqn_to_index_mapping
//   decides which tensor goes to which file (every tensor in file 1 when it
//   is empty), and the index with `metadata.total_size` (the tensor bytes)
//   and `weight_map` (tensor -> file name). Each file's header carries
//   `"format": "pt"` in `__metadata__`. With save_distributed each rank
//   writes its own chunks to `shard-0000R-model-0000I-of-0000N.safetensors`
//   (R = rank + 1) in the directory, their offsets in the global tensor in
//   `__metadata__["DCP_SHARDING_INFO"]` ({"fqn": {"saved_offsets": [...]}},
//   the seed's key), and no index (PyTorch's layout, which its reader
//   loads); with enable_consolidation as well the shards go to `sharded/`
//   and the coordinator then streams them into full tensors in the files
//   and index above.
// - A save commits atomically: every file is written under a temporary
//   name (`.NAME.tmp-<save id>`) and fsynced; at Finish the coordinator
//   writes (and fsyncs) a commit journal, `.dcp-hf-commit`, listing the
//   renames (the index last) and the files of the replaced checkpoint to
//   remove, then applies it and removes it. A failure before the journal
//   leaves the previous checkpoint as it was (Abort removes the temporary
//   files); once the journal is durable the save is decided, and whoever
//   comes next (Abort, the next save's SetUp) completes it. Readers refuse
//   a directory whose journal is still there (kFailedPrecondition), so they
//   see the old checkpoint or the new one, never a mix.
// - One save into a directory at a time: the coordinator holds the
//   directory lock (FileSystemBase::LockDirectory) from SetUp until
//   MarkCommitted or Abort, and removes the temporary files of interrupted
//   saves there before it writes anything.
// - Files read are untrusted: headers are validated by the safetensors
//   parser, the index and sharding information before they are used (file
//   names are plain names in the directory, chunks lie inside their tensor
//   and cover it once), and every read is checked against the file's size.
//   A malformed directory is kDataLoss naming the file, never a crash.
//
// Thread safety: one instance serves one save or load at a time, driven
// from one thread (io/storage.h); WriteData/ReadData use internal threads.
#ifndef DCP_IO_HF_STORAGE_H_
#define DCP_IO_HF_STORAGE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "core/executor.h"
#include "io/checkpoint_formats.h"
#include "io/file_system.h"
#include "io/internal/journaled_writer.h"
#include "io/io_engine.h"
#include "io/storage.h"

namespace dcp {

class DeviceStaging;  // staging/device_staging.h

// The names in a Hugging Face directory (kHfIndexFileName, ...) are in
// io/checkpoint_formats.h.
// The `__metadata__` keys of the seed's sharded files.
inline constexpr char kHfShardingInfoKey[] = "DCP_SHARDING_INFO";
inline constexpr char kHfSavedOffsetsKey[] = "saved_offsets";

// "model-00002-of-00005.safetensors"; with `shard` (1-based), the sharded
// name "shard-00003-model-00002-of-00005.safetensors".
std::string HfFileName(int index, int count, std::optional<int> shard = {});

// The seed's HuggingFaceStorageWriter keyword arguments, then dcp's.
struct HuggingFaceStorageWriterOptions {
  // Tensor name -> 1-based file index. Empty: every tensor in file 1 of 1.
  // A tensor missing from a non-empty mapping fails the save
  // (kInvalidArgument naming it). Saved by several ranks without
  // save_distributed, a file whose tensors lie on more than one rank is
  // written as one file per rank (each file has one writer); the files are
  // then numbered consecutively in (index, rank) order.
  std::map<std::string, int> fqn_to_index_mapping;
  // Files written in parallel per rank.
  int thread_count = 1;
  // Each rank writes its chunks to its own files (see the file comment).
  bool save_distributed = false;
  // With save_distributed: the coordinator consolidates the shards into
  // full tensors at Finish.
  bool enable_consolidation = false;
  // Output files consolidated in parallel.
  int thread_count_consolidation = 1;

  // fsync files and directories (off: the renames stay atomic, durability
  // is not promised).
  bool sync_files = true;
  // Write with O_DIRECT where the file system takes it (as
  // FileSystemWriterOptions::direct_io). Each file's data section starts
  // 4 KiB aligned (the header padded with spaces) and the tensors whose
  // sizes are whole 4 KiB blocks come first (SortForSafetensors), so they
  // are written from their own memory; the rest go through bounce buffers.
  bool direct_io = true;
  // Buffered files leave the page cache as they reach the disk
  // (FileSystemWriterOptions::uncached_writes).
  bool uncached_writes = true;
  // Buffered files with sync_files: start writeback every this many bytes
  // (FileSystemWriterOptions::writeback_bytes); 0 turns it off.
  int64_t writeback_bytes = int64_t{16} << 20;
  // Consolidation's memory: the tensor windows and write buffers of all
  // its threads together stay under this many bytes (at least 1 MiB per
  // thread).
  int64_t consolidation_buffer_bytes = int64_t{256} << 20;
  // Bytes of device data copied ahead per thread (as
  // FileSystemWriterOptions::per_thread_copy_ahead).
  int64_t per_thread_copy_ahead = 10000000;
  // nullptr: LocalFileSystem(). Not owned; must outlive the writer.
  FileSystemBase* file_system = nullptr;
  // nullptr: an engine of `io_mode` owned by the writer. Not owned.
  IoEngine* io_engine = nullptr;
  IoMode io_mode = IoMode::kAuto;
  // Copies device tensors to host (as FileSystemWriterOptions::
  // device_staging). Not owned; must outlive the writer.
  DeviceStaging* device_staging = nullptr;
};

// GetStorageMeta, SetDeviceWait, CommitDecided, MarkCommitted, Abort,
// path() and save_id() are internal_io::JournaledStorageWriter's.
class HuggingFaceStorageWriter final
    : public internal_io::JournaledStorageWriter {
 public:
  explicit HuggingFaceStorageWriter(
      std::string path, HuggingFaceStorageWriterOptions options = {});
  ~HuggingFaceStorageWriter() override;

  // A fresh save id; a non-empty `checkpoint_id` replaces the directory.
  absl::Status Reset(const std::string& checkpoint_id) override;
  // Creates the directory (and sharded/ for a consolidated save) and probes
  // that it takes files (kPermissionDenied naming it). The coordinator then
  // takes the directory lock (kFailedPrecondition naming the holder while
  // another save has it), completes a commit an interrupted save decided
  // (its journal), removes the temporary files of interrupted saves, and
  // notes the files of the checkpoint there, which Finish replaces (the
  // listing's error, annotated, when the directory cannot be listed).
  absl::Status SetUp(bool is_coordinator, int rank,
                     bool use_collectives) override;
  // kInvalidArgument naming the value for what a Hugging Face directory
  // cannot hold: a name that is not valid UTF-8 (named escaped), a
  // non-tensor value, a C128 tensor, a chunk of a tensor without
  // save_distributed, two chunks of one tensor on one rank with it, a
  // tensor the (non-empty) fqn_to_index_mapping lacks or maps below 1.
  absl::StatusOr<SavePlan> PrepareLocalPlan(SavePlan plan) override;
  // Assigns every file its name and its one writing rank (storage_data).
  absl::StatusOr<std::vector<SavePlan>> PrepareGlobalPlan(
      std::vector<SavePlan> plans) override;
  // Writes this rank's files under temporary names (thread_count at a
  // time), each fsynced, then the directory. Host tensors are written from
  // their memory (O_DIRECT where aligned, else through bounce buffers),
  // device tensors through the staging pool. The call blocks. Errors as
  // FileSystemWriter::WriteData.
  Future<std::vector<WriteResult>> WriteData(const SavePlan& plan,
                                             SavePlanner& planner) override;
  // Coordinator: consolidates (enable_consolidation), writes the index,
  // and commits (see the file comment). The checkpoint exists once this
  // returns OK; `metadata` is not stored (the headers describe the files).
  // The results' relative paths are file names in the directory of their
  // file (sharded/ for a consolidated save_distributed).
  absl::Status Finish(
      const Metadata& metadata,
      const std::vector<std::vector<WriteResult>>& results) override;

  // What the last consolidation held at most at once in windows and write
  // buffers (bytes).
  int64_t consolidation_peak_bytes() const { return consolidation_peak_; }

 private:
  struct FileAssignment;
  absl::Status WriteFile(const FileAssignment& file,
                         const std::vector<const WriteItem*>& items,
                         SavePlanner& planner,
                         std::vector<WriteResult*>& results);
  absl::Status Consolidate(const std::vector<std::string>& shard_files,
                           std::vector<std::string>& outputs,
                           std::map<std::string, std::string>& weight_map,
                           int64_t& total_size);
  // RollForward: the commit journal's renames and removals.
  absl::Status CompleteCommitOnDisk() override;

  HuggingFaceStorageWriterOptions options_;
  bool is_coordinator_ = true;
  // The coordinator's plan: the weight map of the index it will write.
  std::map<std::string, std::string> weight_map_;
  int64_t total_size_ = 0;
  int64_t consolidation_peak_ = 0;
};

struct HuggingFaceStorageReaderOptions {
  // Threads copying read bytes into the destinations.
  int thread_count = 1;
  // nullptr: LocalFileSystem(). Not owned; must outlive the reader.
  FileSystemBase* file_system = nullptr;
  // Bounce buffers per window of reads; two windows are in memory at once.
  // Tensors that cannot be read straight into their destination are read in
  // pieces of at most min(16 MiB, this) covering only the rows their boxes
  // need (gaps of less than 64 KiB are read through).
  int64_t read_window_bytes = int64_t{64} << 20;
  // Read with O_DIRECT where supported (as FileSystemReaderOptions).
  bool direct_io = true;
  // Buffered reads leave the page cache behind the reader.
  bool uncached_reads = true;
  IoEngine* io_engine = nullptr;  // Not owned.
  IoMode io_mode = IoMode::kAuto;
  // For device destinations (as FileSystemReaderOptions). Not owned.
  DeviceStaging* device_staging = nullptr;
};

// The files of the Hugging Face checkpoint in `dir`, relative to it, in
// the order a loader picks them: `model.safetensors` when it exists;
// otherwise the files `model.safetensors.index.json` names (validated:
// plain names, at most kHfMaxIndexBytes); otherwise every `*.safetensors`
// file in `dir`; otherwise every one in `dir`/sharded. kNotFound when there
// is none, kFailedPrecondition while a commit journal is there, kDataLoss
// for an index that does not parse. `weight_map`, when not null, receives
// the index's map (empty without an index).
absl::StatusOr<std::vector<std::string>> ResolveHfCheckpointFiles(
    FileSystemBase& fs, const std::string& dir,
    std::map<std::string, std::string>* weight_map = nullptr);

// The largest index file a reader accepts.
inline constexpr int64_t kHfMaxIndexBytes = int64_t{256} << 20;

class HuggingFaceStorageReader final : public StorageReader {
 public:
  explicit HuggingFaceStorageReader(
      std::string path, HuggingFaceStorageReaderOptions options = {});
  ~HuggingFaceStorageReader() override;

  absl::Status Reset(const std::string& checkpoint_id) override;
  // Builds dcp Metadata from the headers of the checkpoint's files
  // (ResolveHfCheckpointFiles): one chunk per tensor per file, at the
  // offsets its DCP_SHARDING_INFO gives (else the whole tensor), the global
  // shape the chunks' extent. kDataLoss naming the file for a malformed
  // header, index or sharding information, a tensor in two files without
  // sharding information, chunks of one tensor with different dtypes, that
  // overlap or that leave part of it uncovered; kUnimplemented for a dtype
  // dcp lacks; kNotFound and kFailedPrecondition as
  // ResolveHfCheckpointFiles.
  absl::StatusOr<Metadata> ReadMetadata() override;
  absl::Status SetUp(const Metadata& metadata, bool is_coordinator) override;
  absl::StatusOr<LoadPlan> PrepareLocalPlan(LoadPlan plan) override;
  absl::StatusOr<std::vector<LoadPlan>> PrepareGlobalPlan(
      std::vector<LoadPlan> plans) override;
  // Reads what the plan needs: a whole tensor into a whole contiguous host
  // destination straight into it (through the page cache, uncached, where
  // O_DIRECT cannot: a tensor that does not start 4 KiB aligned in its
  // file, as in files the reference library writes); any other box (a resharded
  // slice, a strided or device destination) in pieces covering only the rows of
  // the box, copied out piece by piece (see read_window_bytes). kDataLoss
  // naming the file when it is shorter than its header said; kAborted
  // where another save replaced the files meanwhile (their headers, read
  // again, describe other tensors or places). The call blocks; the
  // returned future is ready.
  Future<void> ReadData(const LoadPlan& plan, LoadPlanner& planner) override;

  const std::string& path() const { return path_; }
  // Bytes the last ReadData read from files, and the most bounce-buffer
  // bytes it held at once.
  int64_t bytes_read() const { return bytes_read_; }
  int64_t peak_bounce_bytes() const { return peak_bounce_bytes_; }

 private:
  // ReadMetadata's one look at the files.
  absl::StatusOr<Metadata> DescribeFiles();
  // ReadData's reads (ready when it returns).
  Future<void> ReadFiles(const LoadPlan& plan, LoadPlanner& planner);

  std::string path_;
  HuggingFaceStorageReaderOptions options_;
  FileSystemBase* fs_;
  std::unique_ptr<IoEngine> owned_engine_;
  IoEngine* engine_ = nullptr;
  absl::Status engine_error_;
  std::optional<Metadata> metadata_;
  int64_t bytes_read_ = 0;
  int64_t peak_bounce_bytes_ = 0;
  std::unique_ptr<DeviceStaging> owned_staging_;
  std::unique_ptr<ThreadPool> pool_;  // Reader threads.
};

}  // namespace dcp

#endif  // DCP_IO_HF_STORAGE_H_
