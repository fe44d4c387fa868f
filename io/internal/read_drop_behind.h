// Which pages of a file a buffered reader may drop from the page cache
// behind itself: the file's buffered reads report what they have read
// (Done), and get back the ranges that are now safe to drop with
// POSIX_FADV_DONTNEED, the whole `align`-aligned stretches inside runs of
// bytes already read. A stretch with a read still out next to it is kept, so
// no page is dropped that a read in flight (or the read-ahead for it) still
// needs. Rest gives what is left once no more reads come (at close).
//
// Why not RWF_DONTCACHE on reads: uncached reads of parts in parallel go to
// the disk as requests of the part's size and read some of the file twice
// (a large folio dropped by one part's read before its neighbour has copied
// its half); plain reads with this drop-behind go out as full read-ahead
// requests and read each byte once (docs/BENCHMARKS.md section 1, "Dropping
// read pages behind the reader").
//
// Thread-safe.
#ifndef DCP_IO_INTERNAL_READ_DROP_BEHIND_H_
#define DCP_IO_INTERNAL_READ_DROP_BEHIND_H_

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace dcp {

class ReadDropBehind {
 public:
  // [offset, end) byte ranges.
  using Ranges = std::vector<std::pair<int64_t, int64_t>>;

  // 4 MiB: twice the largest page-cache folio on x86-64 (2 MiB), so that
  // no dropped range ends inside a folio that a neighbouring read shares.
  static constexpr int64_t kDefaultAlign = int64_t{4} << 20;

  explicit ReadDropBehind(int64_t align = kDefaultAlign) : align_(align) {}

  // Records that [offset, offset + length) has been read (and copied out);
  // returns the ranges that just became safe to drop, each at most once.
  Ranges Done(int64_t offset, int64_t length);

  // Every byte read and not yet returned by Done: for when no more reads of
  // the file come.
  Ranges Rest();

 private:
  // Adds [begin, end) to `set` (start -> end, disjoint, not touching),
  // merging; returns the merged run that holds it.
  static std::pair<int64_t, int64_t> Insert(std::map<int64_t, int64_t>& set,
                                            int64_t begin, int64_t end);
  // [begin, end) minus `dropped_`, added to `dropped_`.
  Ranges TakeUndropped(int64_t begin, int64_t end)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t align_;
  absl::Mutex mu_;
  std::map<int64_t, int64_t> read_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, int64_t> dropped_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dcp

#endif  // DCP_IO_INTERNAL_READ_DROP_BEHIND_H_
