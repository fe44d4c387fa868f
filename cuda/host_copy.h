// BulkHostCopy: a host-to-host copy of large buffers that writes around the
// CPU caches (non-temporal stores), as a DMA copy engine does.
//
// Why: staging copies hundreds of MiB that nobody reads again soon. glibc's
// memcpy switches to non-temporal stores only above a large threshold (far
// above a staging piece), so a state copied in pieces would pay for
// read-for-ownership traffic and cache pollution that one large memcpy does
// not. The host-memory runtime uses it for its "device" copies and the
// stager for CPU tensors.
#ifndef DCP_CUDA_HOST_COPY_H_
#define DCP_CUDA_HOST_COPY_H_

#include <cstddef>

namespace dcp {

// Below this many bytes BulkHostCopy is plain memcpy.
inline constexpr size_t kBulkHostCopyThreshold = size_t{1} << 20;

// Large host copies are cut into pieces of this size spread over copy
// threads (the stager's CPU tensors, dcp_copy_host): small enough that a
// few large tensors still keep every thread busy.
inline constexpr size_t kHostCopyPieceBytes = size_t{8} << 20;

// Copies `bytes` bytes; the ranges must not overlap. Any alignment. Thread-
// safe; the stores are fenced before it returns.
void BulkHostCopy(void* dst, const void* src, size_t bytes);

}  // namespace dcp

#endif  // DCP_CUDA_HOST_COPY_H_
