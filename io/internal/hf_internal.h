// Internal to io/'s Hugging Face storage (io/hf_storage.h): what its
// writer, reader and consolidation share. Names checked as untrusted input,
// the element ranges a box of a stored chunk needs, dcp Metadata built from
// safetensors headers, a synchronous box read used by consolidation, and
// the checkpoint files a save completes, cleans up and replaces.
#ifndef DCP_IO_INTERNAL_HF_INTERNAL_H_
#define DCP_IO_INTERNAL_HF_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <new>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "core/tensor.h"
#include "io/file_system.h"
#include "io/internal/parallel_work.h"
#include "planner/metadata.h"
#include "planner/plan.h"

namespace dcp::internal_hf {

using internal_io::AlignDown;
using internal_io::AlignedBuffer;
using internal_io::AlignUp;
using internal_io::FirstError;
using internal_io::kDirectIoAlignment;

// Whether readers of a Hugging Face checkpoint follow a file of the
// directory that is a symbolic link (to a regular file: never a FIFO or
// device). They do: a Hugging Face hub cache snapshot links each file to
// ../../blobs/<hash>, and the safetensors library, transformers and
// PyTorch's reader follow such links. The names they open stay plain names
// inside the directory (CheckRelativePath); dcp's own format follows no
// link.
inline constexpr bool kHfReadersFollowLinks = true;

// OK when `name` is a plain file name: not empty, ".", "..", no '/' or NUL,
// at most NAME_MAX bytes.
// kDataLoss otherwise.
absl::Status CheckPlainName(absl::string_view name);

// OK when `relative` is a plain name or "sharded/" and a plain name.
absl::Status CheckRelativePath(absl::string_view relative);

// Appends to `out` the row-major element ranges [begin, end) of a chunk of
// shape `sizes` that hold the box (`offsets`, `lengths`): every box element
// lies in one, and a gap of at most `max_gap` elements between two rows of
// the box is included rather than split (reading through a small gap costs
// less than another read). Ranges come in increasing order and are more
// than `max_gap` apart. Nothing for an empty box. The box must lie in the
// chunk.
void BoxRuns(absl::Span<const int64_t> sizes, absl::Span<const int64_t> offsets,
             absl::Span<const int64_t> lengths, int64_t max_gap,
             std::vector<std::pair<int64_t, int64_t>>& out);

// Sorts `ranges`, merges those that overlap or lie at most `max_gap` apart,
// and splits the result into pieces of at most `piece` elements (>= 1).
std::vector<std::pair<int64_t, int64_t>> MergeAndSplit(
    std::vector<std::pair<int64_t, int64_t>> ranges, int64_t max_gap,
    int64_t piece);

// A safetensors file to describe: `relative` is what the metadata records
// (StorageInfo::relative_path), `path` what is opened.
struct HfSource {
  std::string relative;
  std::string path;
};

// Builds dcp Metadata from the headers of `sources` (see
// HuggingFaceStorageReader::ReadMetadata for the rules and errors).
// `weight_map` (the index's, or empty) must agree with the headers.
absl::StatusOr<Metadata> BuildHfMetadata(
    FileSystemBase& fs, const std::vector<HfSource>& sources,
    const std::map<std::string, std::string>& weight_map);

// Copies the box (`storage_offsets`, `lengths`) of a stored chunk of shape
// `sizes` and `element_size`, whose bytes are [offset, offset + length) of
// `file`, into host view `dst` at `dst_offsets`, reading only the ranges
// BoxRuns gives through `buffer` (its size bounds each read; at least one
// element). kDataLoss when the file ends early; CopyBox's errors.
absl::Status ReadBoxFromFile(File& file, int64_t offset, int64_t length,
                             absl::Span<const int64_t> sizes,
                             size_t element_size,
                             absl::Span<const int64_t> storage_offsets,
                             absl::Span<const int64_t> lengths,
                             const TensorView& dst,
                             absl::Span<const int64_t> dst_offsets,
                             AlignedBuffer& buffer, int64_t max_gap_bytes);

// The checkpoint files a save finds in its directory (io/hf_files.cc).

// Completes the commit a journal in `dir` records, if there is one.
absl::Status RollForward(FileSystemBase& fs, const std::string& dir, bool sync);

// Removes the temporary files of interrupted saves from `dir` (and
// sharded/): names ".NAME.tmp-<save id>", and the probe files
// (IsProbeFileName) in `dir`; nothing else.
void RemoveTemporaryFiles(FileSystemBase& fs, const std::string& dir);

// The files of the checkpoint in `dir` that a new save replaces: the
// single file, the index and what it names, the files a Hugging Face
// writer names `model-N-of-M`, and the shards in sharded/. Never other
// files (a LoRA adapter, a tokenizer). The listing's error when `dir`
// cannot be listed (a save that took it for empty would commit beside an
// old model.safetensors, which readers prefer); a missing sharded/ holds
// nothing.
absl::StatusOr<std::set<std::string>> ReplaceableFiles(FileSystemBase& fs,
                                                       const std::string& dir);

}  // namespace dcp::internal_hf

#endif  // DCP_IO_INTERNAL_HF_INTERNAL_H_
