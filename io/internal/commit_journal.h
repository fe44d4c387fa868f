// Internal to io/: the commit journal of the storages whose files have
// fixed names (Hugging Face, MEGA; docs/FORMAT.md sections 7 and 8). A save
// writes its files under temporary names, then the journal, which lists
// the renames (temporary -> final, the index last) and the files of the
// replaced checkpoint to remove. Once the journal is durable under its name
// the save is decided: whoever comes next completes it (CompleteCommit).
//
// Journals found on disk are untrusted: every name is a relative path of
// plain components inside the directory, a rename goes from a temporary
// name (IsTemporaryFileName) to a checkpoint file name in the same
// directory, and removals name checkpoint files only.
//
// Thread safety: the free functions expect the caller to hold the
// directory lock; JournaledSave's own note.
#ifndef DCP_IO_INTERNAL_COMMIT_JOURNAL_H_
#define DCP_IO_INTERNAL_COMMIT_JOURNAL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "io/file_system.h"
#include "planner/metadata.h"

namespace dcp::internal_io {

struct CommitJournal {
  // (temporary, final) paths relative to the checkpoint directory, in the
  // order they are renamed (the index last).
  std::vector<std::pair<std::string, std::string>> renames;
  // Files of the replaced checkpoint, relative to the directory.
  std::vector<std::string> removals;
};

// Whether a relative path may be a final name of a checkpoint file (the
// storage's own naming rules, directories included).
using CheckpointFileTest = absl::FunctionRef<bool(absl::string_view)>;

// ".NAME.tmp-<16 lowercase hex digits>" (a base name).
bool IsTemporaryFileName(absl::string_view name);

// {"renames": [[temporary, final], ...], "removals": [...]}.
std::string EncodeCommitJournal(const CommitJournal& journal);

// kDataLoss naming `path` for text that does not parse or breaks a rule of
// the file comment.
absl::StatusOr<CommitJournal> DecodeCommitJournal(
    absl::string_view text, const std::string& path,
    CheckpointFileTest is_checkpoint_file);

// Carries out `journal` in `dir`: the renames (a temporary file already
// gone was renamed before), directory syncs, the removals (missing files
// were removed before), directory syncs, then removes `dir`/`journal_name`.
// `sync` off skips the syncs.
absl::Status ApplyCommitJournal(FileSystemBase& fs, const std::string& dir,
                                absl::string_view journal_name,
                                const CommitJournal& journal, bool sync);

// Completes the commit the journal `dir`/`journal_name` records; OK when
// there is none.
absl::Status CompleteCommit(FileSystemBase& fs, const std::string& dir,
                            absl::string_view journal_name,
                            CheckpointFileTest is_checkpoint_file, bool sync);

// How long CompletePendingCommitForRead waits for another holder of the
// directory's lock to complete a pending commit.
inline constexpr absl::Duration kPendingCommitWait = absl::Seconds(60);

// Describes a checkpoint whose files another save's commit may be
// renaming meanwhile (the Hugging Face and MEGA formats, whose metadata is
// built from several files): `describe` is tried again, twice at most and
// a few milliseconds apart, while it fails with kDataLoss (a file the index
// names missing, headers that disagree), which a damaged checkpoint keeps
// returning and a commit in progress does not.
absl::StatusOr<Metadata> DescribeWhileCommitsMayRun(
    absl::FunctionRef<absl::StatusOr<Metadata>()> describe);

// How long a save's LockAndRecover waits for a load that holds the
// directory's lock to complete a pending commit (such a load holds it for
// the commit's renames and removals, or a moment where the commit was
// completed already) before it reports the lock held.
inline constexpr absl::Duration kReaderLockWait = absl::Seconds(10);

// The end of the description a load holding the directory's lock gives
// (CompletePendingCommitForRead): saves wait for such a holder.
inline constexpr char kReaderLockHolder[] =
    " (a load completing an interrupted commit)";

// For a reader of `dir`: OK when no commit is pending there; else completes
// the commit the journal `dir`/`journal_name` records (what the next save
// would do first: the journal is there only once the commit was decided)
// under the directory's exclusive lock, so that a save killed after its
// decision leaves a checkpoint that loads. While another process holds the
// lock (the ranks of a restarted job loading one directory together: one
// of them completes the commit; or a save committing now), waits up to
// `wait` for the journal to go or the lock to free. kFailedPrecondition
// naming the journal when neither happens in time, or the commit cannot be
// completed (a directory that is read-only to this process: at once).
absl::Status CompletePendingCommitForRead(
    FileSystemBase& fs, const std::string& dir, absl::string_view journal_name,
    CheckpointFileTest is_checkpoint_file,
    absl::Duration wait = kPendingCommitWait);

// The whole file at `path` (opened without following a symbolic link,
// unless `follow_links`; never a FIFO or device) if it has at most `limit`
// bytes; kDataLoss naming it otherwise.
absl::StatusOr<std::string> ReadSmallFile(FileSystemBase& fs,
                                          const std::string& path,
                                          int64_t limit,
                                          bool follow_links = false);

// Writes `bytes` to the new file `path`, fsynced when `sync`.
absl::Status WriteSmallFile(FileSystemBase& fs, const std::string& path,
                            absl::string_view bytes, bool sync);

// One save's commit state in a writer whose commit is a journal: the files
// the save created (removed by Abort before the decision), whether the
// journal was made durable (decided) and carried out (committed), and the
// coordinator's directory lock.
//
// Thread safety: RecordCreated may be called from any thread; the other
// methods from the thread that drives the save.
class JournaledSave {
 public:
  // A new save: no files, undecided, no lock.
  void Reset();

  // The coordinator: takes the lock on `dir` (kept until MarkCommitted or
  // Abort; already held: kept), then runs `recover` (completing what an
  // interrupted save decided). The lock is released if `recover` fails.
  // A lock held by a load completing a pending commit (kReaderLockHolder),
  // or by a holder that has not described itself yet, is waited for, up to
  // kReaderLockWait; one held by anything else is reported at once
  // (kFailedPrecondition naming the holder).
  absl::Status LockAndRecover(FileSystemBase& fs, const std::string& dir,
                              const std::string& holder,
                              absl::FunctionRef<absl::Status()> recover);

  // `path` was created by this save: Abort removes it while undecided.
  void RecordCreated(const std::string& path);

  // Writes `journal` to `temp_journal` (a temporary name in `dir`), renames
  // it to `dir`/`journal_name` (the decision; decided() from then on),
  // syncs the directory, then carries the journal out. OK: committed.
  absl::Status Commit(FileSystemBase& fs, const std::string& dir,
                      absl::string_view journal_name,
                      const std::string& temp_journal,
                      const CommitJournal& journal, bool sync);

  bool decided() const { return decided_; }

  // The save's files are the checkpoint's (another rank committed it):
  // forgets them and releases the lock.
  void MarkCommitted();

  // Undecided: removes the files the save created. Decided but not carried
  // out: runs `complete` (best effort; the next save's recovery does what
  // is left). Releases the lock.
  void Abort(FileSystemBase& fs, absl::FunctionRef<absl::Status()> complete);

 private:
  std::unique_ptr<DirectoryLock> lock_;
  bool decided_ = false;
  bool committed_ = false;
  absl::Mutex mu_;
  std::vector<std::string> created_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dcp::internal_io

#endif  // DCP_IO_INTERNAL_COMMIT_JOURNAL_H_
