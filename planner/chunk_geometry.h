// Geometry of tensor chunks (boxes in a global tensor): intersection, the
// sweep that finds which chunks of one layout overlap which chunks of
// another (load-time resharding), and validation that a set of chunks tiles
// a tensor exactly once (global save-plan validation). Both run in
// O(n log n) plus the size of the answer for the layouts real jobs use.
#ifndef DCP_PLANNER_CHUNK_GEOMETRY_H_
#define DCP_PLANNER_CHUNK_GEOMETRY_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

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
    const std::function<void(size_t, size_t, const ChunkStorageMetadata&)>&
        on_overlap);

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
                            const std::function<std::string(size_t)>& describe,
                            bool require_full_coverage = true);

}  // namespace dcp

#endif  // DCP_PLANNER_CHUNK_GEOMETRY_H_
