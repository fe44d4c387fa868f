// Internal to io/: what a FileSystemReader reads for a load plan, decided
// before any file is touched. The plan's ReadItems are grouped by the stored
// item they use (each stored item is read once), each stored item is
// matched to its metadata (storage entry, tensor chunk, size), and its reads
// are cut into pieces: the whole item straight into its destination when it
// can be, otherwise runs of whole checksum blocks covering only the elements
// the boxes need. Pure functions over the metadata and the plan.
#ifndef DCP_IO_FS_READ_PLAN_H_
#define DCP_IO_FS_READ_PLAN_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "planner/metadata.h"
#include "planner/plan.h"

namespace dcp {
class DeviceStaging;    // staging/device_staging.h
class StreamExtension;  // io/extensions.h
}  // namespace dcp

namespace dcp::internal_fs {

// What the reader knows about one stored item the plan uses.
struct StoredItem {
  const MetadataIndex* index = nullptr;  // Into the metadata.
  const StorageInfo* info = nullptr;     // Into the metadata.
  Shape chunk_sizes;                     // Tensor chunks only.
  size_t element_size = 1;
  bool is_tensor = false;
  std::vector<const ReadItem*> uses;  // Into the plan.
  // Set when the reader reaches the item, on the submitting thread: each
  // tensor use's destination (resolved once), and the pieces still to be
  // delivered (the last one commits every use).
  std::vector<TensorView> dests;
  std::unique_ptr<std::atomic<int64_t>> pieces_left;
  // Some destination is device memory: filled through `staging`, committed
  // after the staging's copies have landed.
  DeviceStaging* staging = nullptr;
  // Stored through extensions (info->extensions): their decoders in order
  // of application, and where each stored block starts relative to
  // info->offset (one entry more than the blocks: the last is info->length).
  // Set when the reader reaches the item.
  std::vector<const StreamExtension*> decoders;
  std::vector<int64_t> block_starts;
  // The item's data file is open with O_DIRECT (reads aligned to
  // kDirectIoAlignment). Set when the reader reaches the item, from the
  // file: memory-backed files open buffered even when O_DIRECT is asked
  // for, and their reads land in place at any alignment.
  bool direct = true;
};

// Groups `plan`'s items by the stored item they use, in order of first use,
// and matches each stored item to `metadata`. `check` is called once per
// stored item as it is found (the reader checks it against its data file
// there) and its error returned. kDataLoss naming `dir` when the metadata
// has no storage entry or no tensor chunk for an item, or when a chunk's
// dtype and shape do not make its raw length (StorageInfo::RawLength).
absl::StatusOr<std::vector<StoredItem>> GroupReadItems(
    const LoadPlan& plan, const Metadata& metadata, const std::string& dir,
    absl::FunctionRef<absl::Status(const MetadataIndex&, const StorageInfo&)>
        check);

// One read of a stored item: its checksum blocks [first_block, end_block)
// and, for tensors, the chunk elements [first_element, end_element) it
// delivers.
struct ReadPiece {
  int64_t first_block = 0, end_block = 0;
  int64_t first_element = 0, end_element = 0;

  friend bool operator==(const ReadPiece&, const ReadPiece&) = default;
};

// Whether the stored bytes of `info` must be decoded: it went through
// extensions and some block of it was encoded (an item whose blocks were
// all stored as is holds its raw bytes, laid out as without extensions).
inline bool NeedsDecoding(const StorageInfo& info) {
  return !info.extensions.empty() && info.length != info.raw_length;
}

// Whether tensor `stored`'s only use is the whole chunk into the whole of a
// contiguous host tensor `dest` of the same size.
bool FillsWholeHostTensor(const StoredItem& stored, const TensorView& dest);

// Whether tensor `stored` can be read in one piece straight into `dest`
// (the destination of its only use): FillsWholeHostTensor, the item needs
// no decoding, and with `direct` the destination memory and the file
// offset are kDirectIoAlignment aligned.
bool CanReadInPlace(const StoredItem& stored, const TensorView& dest,
                    bool direct);

// The pieces of tensor `stored` that cover the elements its uses' boxes
// need: the boxes' element spans, merged where they share a checksum block,
// cut into runs of at most max(1, piece_bytes / block_size) whole blocks,
// each at least one element. None when every box is empty.
std::vector<ReadPiece> PlanPieces(const StoredItem& stored, int64_t block_size,
                                  int64_t piece_bytes);

}  // namespace dcp::internal_fs

#endif  // DCP_IO_FS_READ_PLAN_H_
