// Geometry of tensor chunks (boxes in a global tensor): intersection, the
// sweep that finds which chunks of one layout overlap which chunks of
// another (load-time resharding), and validation that a set of chunks tiles
// a tensor exactly once (global save-plan validation). Both run in
// O(n log n) plus the size of the answer for the layouts real jobs use.
#ifndef DCP_PLANNER_CHUNK_GEOMETRY_H_
#define DCP_PLANNER_CHUNK_GEOMETRY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "planner/metadata.h"

namespace dcp {

// "offsets [0, 4] sizes [2, 4]".
std::string ChunkToString(const ChunkStorageMetadata& chunk);

// Elements in a chunk (0 when any size is 0; 1 for a 0-d chunk).
int64_t ChunkVolume(const ChunkStorageMetadata& chunk);

// The common part of two chunks of the same rank, or nullopt when it holds
// no element.
std::optional<ChunkStorageMetadata> IntersectChunks(
    const ChunkStorageMetadata& a, const ChunkStorageMetadata& b);

// Calls `on_overlap(i, j, box)` once for every pair (requested[i], saved[j])
// that shares at least one element, `box` being the intersection in global
// coordinates. All chunks must have the same rank. Sweeps along the
// dimension where `saved` is split most: sorts both sides by start along it
// and pairs only chunks whose extents along it intersect, never all pairs.
// Pairs come in no particular order.
void ForEachOverlap(
    absl::Span<const ChunkStorageMetadata> requested,
    absl::Span<const ChunkStorageMetadata> saved,
    absl::FunctionRef<void(size_t, size_t, const ChunkStorageMetadata&)>
        on_overlap);

// One saved chunk's part of a requested chunk: `saved` is its position in
// the saved list, `box` the intersection in global coordinates.
struct ChunkOverlap {
  size_t saved = 0;
  ChunkStorageMetadata box;
};

// The fast path of load planning, O(log m + answer) for m saved chunks when
// `saved` is sorted and split along one dimension (what metadata holds for
// the usual row or column split: chunks sorted by offset). The dimension is
// the first along which the first and last saved chunks start apart; a
// binary search finds the saved chunks whose extents along it meet
// `requested`'s. Appends their intersections with `requested` to `out` and
// returns true when those saved chunks are disjoint along that dimension
// (so pairwise disjoint) and their intersections hold every element of
// `requested`: the boxes then tile `requested` exactly once, and when the
// saved chunks are pairwise disjoint (as validated metadata is) they are
// the only saved chunks that share an element with it. Otherwise (another
// layout, overlapping or missing saved chunks) returns false and leaves
// `out` as it was: use ForEachOverlap, which handles any layout.
// An empty `requested` needs nothing: true, nothing appended.
bool FindCoveringChunks(const ChunkStorageMetadata& requested,
                        absl::Span<const ChunkStorageMetadata> saved,
                        std::vector<ChunkOverlap>* out);

// Checks that `chunks` tile the tensor of shape `global_size` exactly once:
// each chunk has the tensor's rank and lies within its bounds, no two chunks
// share an element, and every element is covered. Zero-size chunks are
// allowed anywhere within bounds. kInvalidArgument naming `tensor_name` and
// the offending chunks (described by `describe(i)`, e.g. with the rank that
// saved chunk i). With `require_full_coverage` false, only bounds and
// overlaps are checked (a rank-local checkpoint holds some chunks).
absl::Status ValidateTiling(absl::string_view tensor_name,
                            const Shape& global_size,
                            absl::Span<const ChunkStorageMetadata> chunks,
                            absl::FunctionRef<std::string(size_t)> describe,
                            bool require_full_coverage = true);

}  // namespace dcp

#endif  // DCP_PLANNER_CHUNK_GEOMETRY_H_
