// Internal to io/: where a FileSystemWriter puts things. Data-file and
// temporary-metadata names, the byte-balanced assignment of a rank's items to
// its data files, and the layout of one data file (docs/FORMAT.md section
// 2). Pure functions, no I/O (NewSaveId aside).
#ifndef DCP_IO_FS_LAYOUT_H_
#define DCP_IO_FS_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace dcp::internal_fs {

inline constexpr char kDataFileSuffix[] = ".distcp";
inline constexpr char kTempMetadataPrefix[] = ".metadata.tmp-";

// Host items of at most kPackItemBytes share packs of at most kPackBytes,
// kPackAlignment apart (LayOutFile).
inline constexpr int64_t kPackItemBytes = int64_t{64} << 10;
inline constexpr int64_t kPackBytes = int64_t{1} << 20;
inline constexpr int64_t kPackAlignment = 64;

// A fresh save id: 16 lowercase hex digits from getrandom (the clock when
// that fails).
std::string NewSaveId();

// "__<rank>_<save id>_": a rank's data files are this prefix, an index and
// kDataFileSuffix.
std::string DataFilePrefix(int rank, absl::string_view save_id);
// `prefix`, `index`, kDataFileSuffix.
std::string DataFileName(absl::string_view prefix, size_t index);
// kTempMetadataPrefix and the save id.
std::string TempMetadataFileName(absl::string_view save_id);
// The save id of DataFilePrefix(rank, save id) `prefix`; empty for anything
// else.
absl::string_view SaveIdOfDataFilePrefix(absl::string_view prefix);
// The file a save's coordinator keeps in a checkpoint directory all ranks
// write into, from its SetUp until it commits: a rank that finds none for
// the coordinator's save id (its plan's data file prefix) in its own
// directory was given another directory (checkpoint_id). A probe file by
// name (kProbeFilePrefix, "save-", the save id): an interrupted save's is
// swept as probes are.
std::string SaveMarkerFileName(absl::string_view save_id);

// Whether `text` is a save id (NewSaveId's form).
bool IsSaveId(absl::string_view text);
// Whether `name` is a data file name: DataFilePrefix(rank, save id), a
// decimal index, kDataFileSuffix.
bool IsDataFileName(absl::string_view name);
// Whether `name` is a temporary metadata file name.
bool IsTempMetadataFileName(absl::string_view name);

// Which items go into which data file. `sizes` are the items' stored bytes
// in plan order. One file per item unless `single_file_per_rank`; then
// min(thread_count, items) files (at least one), the largest items placed
// first, each into the file with the fewest bytes so far (ties: the lower
// index). Each file lists its item indices in plan order; no items, no
// files.
std::vector<std::vector<size_t>> AssignItemsToFiles(
    absl::Span<const int64_t> sizes, int thread_count,
    bool single_file_per_rank);

// One item of a data file, as the layout sees it.
struct LayoutItem {
  int64_t length = 0;
  bool tensor = false;     // Tensors start aligned; bytes values may not.
  bool on_device = false;  // Device tensors are staged, never packed.
};

// A run of small host items written by one write from one buffer.
struct FilePack {
  int64_t start = 0;      // File offset, kDirectIoAlignment aligned.
  int64_t used = 0;       // Bytes from `start` to the end of its last item.
  size_t first_item = 0;  // Index of its first item.
};

struct FileLayout {
  std::vector<int64_t> offset;  // Per item: where its bytes start.
  std::vector<int> pack;        // Per item: its pack, or -1.
  std::vector<FilePack> packs;
  // The file's size: past the last item, kDirectIoAlignment aligned with
  // direct I/O (what the writer preallocates).
  int64_t end = 0;
};

// Lays out a data file's items in order. Tensors start on kDirectIoAlignment
// boundaries (O_DIRECT reads them straight into aligned memory), and with
// direct I/O so does everything; bytes values follow each other unaligned in
// a buffered file. Non-empty host items of at most kPackItemBytes that
// follow each other share packs: kPackAlignment apart, at most kPackBytes a
// pack, each pack starting aligned. Readers find every item by its offset
// in the metadata, so the layout is the writer's choice.
FileLayout LayOutFile(absl::Span<const LayoutItem> items, bool direct_io);

}  // namespace dcp::internal_fs

#endif  // DCP_IO_FS_LAYOUT_H_
