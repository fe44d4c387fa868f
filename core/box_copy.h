// Copying an N-d box between a stored chunk (contiguous, row-major) and a
// destination view (any strides), the core of load-time resharding: a
// ReadItem names the box by its offsets in both chunks and its lengths.
//
// CopyBox copies a whole box from a chunk held in memory; CopyBoxPart copies
// the part of a box that lies in one window of the chunk (a contiguous range
// of its elements), so a reader can stream a large stored chunk through a
// small bounce buffer and still deliver every box byte for byte.
//
// The row-major geometry of a box inside a chunk lives here too (BoxSpan,
// BoxElementsBefore, ChunkElementOfBoxElement): which chunk elements a box
// holds and where. Chunk boxes in global coordinates (intersection,
// overlap, tiling) are planner/chunk_geometry.h's. All functions are pure
// and thread-safe.
#ifndef DCP_CORE_BOX_COPY_H_
#define DCP_CORE_BOX_COPY_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/tensor.h"

namespace dcp {

// Copies the box of `lengths` elements per dimension starting at
// `src_offsets` of the contiguous row-major array at `src` (shape
// `src_sizes`, elements of `element_size` bytes) into host view `dst` at
// `dst_offsets`. kInvalidArgument when ranks differ, the box leaves either
// array, or the element sizes differ. Thread-safe (no shared state).
absl::Status CopyBox(const std::byte* src, absl::Span<const int64_t> src_sizes,
                     absl::Span<const int64_t> src_offsets, size_t element_size,
                     const TensorView& dst,
                     absl::Span<const int64_t> dst_offsets,
                     absl::Span<const int64_t> lengths);

// As CopyBox, but `window` holds only the chunk's elements [begin, end) (in
// row-major order; window[0] is element `begin`), and only the box elements
// among them are copied. Calls for windows that cover the chunk copy the
// whole box, each destination element exactly once. Touches no byte outside
// the window. Errors as CopyBox, and kInvalidArgument for a range outside the
// chunk.
absl::Status CopyBoxPart(const std::byte* window, int64_t begin, int64_t end,
                         absl::Span<const int64_t> src_sizes,
                         absl::Span<const int64_t> src_offsets,
                         size_t element_size, const TensorView& dst,
                         absl::Span<const int64_t> dst_offsets,
                         absl::Span<const int64_t> lengths);

// The row-major element range [first, last + 1) of the chunk (shape
// `src_sizes`) that the box spans: every box element lies in it. {0, 0} for
// an empty box.
std::pair<int64_t, int64_t> BoxSpan(absl::Span<const int64_t> src_sizes,
                                    absl::Span<const int64_t> src_offsets,
                                    absl::Span<const int64_t> lengths);

// The coordinates of row-major element `linear` of an array of `shape`
// (zero-size dimensions give coordinate 0).
Shape RowMajorCoordinates(int64_t linear, absl::Span<const int64_t> shape);

// How many elements of the box (`offsets`, `lengths` in a row-major chunk of
// shape `sizes`) come before chunk element `e` in row-major order, i.e. the
// box-order index of the first box element at or after `e`. Equals the
// box's element count for e >= the chunk's element count.
int64_t BoxElementsBefore(absl::Span<const int64_t> sizes,
                          absl::Span<const int64_t> offsets,
                          absl::Span<const int64_t> lengths, int64_t e);

// The row-major chunk element index of box element `b` (box order).
int64_t ChunkElementOfBoxElement(absl::Span<const int64_t> sizes,
                                 absl::Span<const int64_t> offsets,
                                 absl::Span<const int64_t> lengths, int64_t b);

}  // namespace dcp

#endif  // DCP_CORE_BOX_COPY_H_
