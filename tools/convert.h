// `dcp convert SRC DST --to safetensors|dcp`: between dcp checkpoints and
// Hugging Face directories (docs/FORMAT.md section 7).
//
// - To safetensors: the dcp checkpoint in SRC (saved by any number of
//   ranks, sharded or not; a dcp directory, or a MEGA one or mega:// URI)
//   becomes DST/model-0000I-of-0000N.safetensors and
//   DST/model.safetensors.index.json. Tensors go to files in name order, a
//   new file starting when the next tensor would take the current one past
//   max_shard_bytes (a larger tensor gets a file of its own). The files are
//   streamed: tensors are loaded in windows of whole rows (of a dimension's
//   slices when a row is larger), batched up to buffer_bytes, and appended,
//   so memory stays near buffer_bytes whatever the model's size. A tensor
//   the checkpoint's chunks do not cover is kDataLoss. Non-tensor values
//   cannot be stored in safetensors: they are skipped, each named on stderr
//   (once DST is known to be usable). `prefix` picks the tensors named
//   PREFIX.* and writes them without "PREFIX." (a model's weights from a
//   training checkpoint); nothing to write is kInvalidArgument.
// - To dcp: the Hugging Face directory SRC (any layout HuggingFaceStorage
//   Reader reads) becomes a dcp checkpoint in DST, streamed the same way:
//   one save planned for the whole state, whose windows are loaded and
//   written a batch of at most buffer_bytes at a time (each batch in data
//   files of its own), so a tensor larger than the buffer is stored as
//   several row chunks. Memory stays near buffer_bytes (twice that when
//   --dtype converts); the metadata is committed last, and a failure
//   removes every file written.
// - dtype (optional) converts floating tensors (F16, BF16, F32, F64) to
//   F32, BF16 or F16 (round to nearest even); other tensors keep theirs.
// - DST must not exist or be empty (kAlreadyExists otherwise). A progress
//   line is drawn on stdout when it is a terminal.
// - To safetensors, files are written and fsynced under temporary names
//   (".NAME.tmp"), then renamed: the index first (and the directory
//   fsynced), then the files it names, then the directory fsynced again.
//   A directory that holds safetensors files without an index, which
//   readers take for a whole checkpoint (they fall back to every
//   *.safetensors file), is never left: one interrupted during the
//   commit (killed, a power loss) has an index naming files that are not
//   there, which readers refuse. Any failure removes every file written,
//   temporary or renamed (and DST when it created it), so the same command
//   can run again; only a conversion killed outright leaves its files.
#ifndef DCP_TOOLS_CONVERT_H_
#define DCP_TOOLS_CONVERT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "core/dtype.h"

namespace dcp {

class FileSystemBase;  // io/file_system.h

struct ConvertOptions {
  std::string to;  // "safetensors" or "dcp".
  int64_t max_shard_bytes = int64_t{5} << 30;
  std::optional<DType> dtype;
  int threads = 4;
  int64_t buffer_bytes = int64_t{256} << 20;
  // To safetensors: only the tensors named `prefix`.*, written without
  // "`prefix`." (a training checkpoint's "model" without its optimizer
  // state); "": all of them.
  std::string prefix;
  bool progress = false;  // Draw the progress line.
  // To safetensors: the file system DST's files are written, renamed and
  // removed through (tests inject faults with it); null: the local one.
  // Not owned.
  FileSystemBase* file_system = nullptr;
};

// Parses `dcp convert`'s flags as typed: --to, --max-shard-size (ParseSize),
// --dtype (bf16, f16, f32), --threads, --prefix (safetensors only).
// kInvalidArgument naming the flag.
absl::StatusOr<ConvertOptions> ParseConvertFlags(
    const std::string& to, const std::string& max_shard_size,
    const std::string& dtype, int threads, const std::string& prefix = "");

// Runs the conversion. kNotFound when SRC holds no checkpoint of the
// expected kind, kAlreadyExists for a DST that is not empty,
// kInvalidArgument for a tensor safetensors cannot hold (C128); the
// loaders' and writers' errors otherwise.
absl::Status RunConvert(const std::string& src, const std::string& dst,
                        const ConvertOptions& options);

}  // namespace dcp

#endif  // DCP_TOOLS_CONVERT_H_
