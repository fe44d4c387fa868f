// The checkpoint formats one directory can hold, told apart by their files
// as a load without a storage reader tells them apart
// (io/storage_registry.h): dcp's own (`.metadata`, or `rank-0/.metadata`
// for a rank-local save), MEGA (its index or its commit journal) and
// Hugging Face (safetensors files, their index, `sharded/`, or its commit
// journal).
//
// A directory holds one of them: a save of one format beside a checkpoint
// of another would leave two checkpoints there, and a load by path would
// pick one by format, not by age (the older one, for a MEGA or Hugging
// Face save beside dcp's). The writers refuse such a save
// (RefuseOtherFormats).
#ifndef DCP_IO_CHECKPOINT_FORMATS_H_
#define DCP_IO_CHECKPOINT_FORMATS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "io/file_system.h"

namespace dcp {

// Names in a Hugging Face directory.
inline constexpr char kHfIndexFileName[] = "model.safetensors.index.json";
inline constexpr char kHfSingleFileName[] = "model.safetensors";
inline constexpr char kHfShardedDirName[] = "sharded";
inline constexpr char kHfCommitJournalName[] = ".dcp-hf-commit";

// Where rank `rank` of a rank-local save keeps its checkpoint below `dir`:
// `dir/rank-<rank>` (docs/FORMAT.md).
std::string RankLocalDirectory(absl::string_view dir, int rank);

enum class CheckpointFormat { kDcp, kMega, kHuggingFace };

// "dcp", "MEGA", "Hugging Face".
absl::string_view CheckpointFormatName(CheckpointFormat format);

// The path of the first file showing that `dir` holds a checkpoint of
// `format` (committed, or with a commit journal a later save completes),
// or "" when it holds none (or does not exist). The file system's errors.
// `list` false: only the fixed names are looked up (no listing of the
// directory, which every rank of a large job would repeat): a Hugging
// Face directory of shards without an index goes unseen.
absl::StatusOr<std::string> CheckpointFormatEvidence(FileSystemBase& fs,
                                                     const std::string& dir,
                                                     CheckpointFormat format,
                                                     bool list = true);

// kFailedPrecondition naming the checkpoint and its file when `dir` holds
// a checkpoint of a format other than `own`, which a save of `own` there
// would leave beside its own; OK otherwise. `list`: as above (the writers
// list on the coordinator only, under the directory's lock; every rank
// looks up the fixed names before it creates anything).
absl::Status RefuseOtherFormats(FileSystemBase& fs, const std::string& dir,
                                CheckpointFormat own, bool list = true);

}  // namespace dcp

#endif  // DCP_IO_CHECKPOINT_FORMATS_H_
