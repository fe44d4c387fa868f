// Copying an N-d box between a stored chunk (contiguous, row-major) and a
// destination view (any strides), the core of load-time resharding: a
// ReadItem names the box by its offsets in both chunks and its lengths.
#ifndef DCP_IO_BOX_COPY_H_
#define DCP_IO_BOX_COPY_H_

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

}  // namespace dcp

#endif  // DCP_IO_BOX_COPY_H_
