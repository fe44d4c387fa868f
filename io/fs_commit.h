// Internal to io/: the files of a checkpoint directory that decide which
// checkpoint it holds, and the commit that switches it.
//
// The crash-safety invariant: a directory's checkpoint is the one its
// `.metadata` names, and `.metadata` only ever changes by an atomic rename of
// a complete, fsynced temporary file (WriteMetadataFile). Before the rename
// a crash leaves the old checkpoint loadable (its files are untouched: new
// saves never reuse a name); after it, the new one. Files of the replaced
// checkpoint go only after the rename (RemoveReplacedFiles), and only those
// its metadata named.
#ifndef DCP_IO_FS_COMMIT_H_
#define DCP_IO_FS_COMMIT_H_

#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "io/file_system.h"
#include "planner/metadata.h"

namespace dcp::internal_fs {

// The paths of the files a save created, for an abort to remove.
// Thread-safe.
class CreatedFiles {
 public:
  void Record(const std::string& path);
  // The files now belong to a committed checkpoint: none is removed.
  void Forget();
  // Removes every recorded file (best effort: an abort follows a failure and
  // reports nothing) and forgets them.
  void RemoveAll(FileSystemBase& fs);

 private:
  absl::Mutex mu_;
  std::vector<std::string> paths_ ABSL_GUARDED_BY(mu_);
};

// Reads and decodes the committed metadata file of `dir`. kNotFound "no
// committed checkpoint in DIR" when there is none. The file is untrusted: one
// larger than any metadata file is refused (kDataLoss) before anything is
// allocated for it, a FIFO or other non-regular file is refused without
// blocking (kFailedPrecondition, FileSystemBase::OpenForRead), and
// DecodeMetadata validates the rest (kDataLoss).
absl::StatusOr<Metadata> ReadMetadataFile(FileSystemBase& fs,
                                          const std::string& dir);

// For a load's `missing` (ReadMetadataFile's kNotFound for `dir`): the
// same code, naming the subdirectories of `dir` that hold a committed
// checkpoint (a run's root: DIR/step-1000, ...; rank-local ones not
// counted, the first 1000 entries looked at) where there are any; else
// `missing` as it is (also any other status). Lists `dir`: not for a
// save's setup.
absl::Status NameCheckpointsInside(FileSystemBase& fs, const std::string& dir,
                                   absl::Status missing);

// Whether the file at `path` opens as a Python pickle (protocol 2 to 5),
// as torch.distributed.checkpoint's `.metadata` does; false when it cannot
// be read.
bool HoldsPickledMetadata(FileSystemBase& fs, const std::string& path);

// The data file names the committed metadata of `dir` uses: none when there
// is no `.metadata`; ReadMetadataFile's error when it cannot be read or
// decoded.
absl::StatusOr<std::set<std::string>> CommittedFileNames(
    FileSystemBase& fs, const std::string& dir);

// Commits `encoded` (EncodeMetadata's bytes) as the metadata of `dir`:
// writes it to TempMetadataFileName(save_id) (reported to `created` first,
// so an abort can remove it), fsyncs it (with `sync`), and renames it over
// `.metadata`. Returns OK exactly when the rename happened, i.e. the new
// checkpoint is the committed one; an error before it leaves the old one.
// The caller then makes the rename durable (SyncDir) with `sync`.
absl::Status WriteMetadataFile(FileSystemBase& fs, const std::string& dir,
                               absl::string_view save_id,
                               absl::string_view encoded, bool sync,
                               CreatedFiles& created);

// Removes from `dir` each of `replaceable` (the data files of the checkpoint
// a commit replaced) that `committed` (the new checkpoint's files) does not
// name, then fsyncs the directory if it removed any (with `sync`). Files
// already gone are not an error; otherwise the first error, after trying
// them all.
absl::Status RemoveReplacedFiles(FileSystemBase& fs, const std::string& dir,
                                 const std::set<std::string>& replaceable,
                                 const std::set<std::string>& committed,
                                 bool sync);

}  // namespace dcp::internal_fs

#endif  // DCP_IO_FS_COMMIT_H_
