// dcp_copy_host's work: host-to-host copies cut into pieces and spread over
// a process-wide thread pool, each piece copied with BulkHostCopy (the
// stager's cache-bypassing stores).
#ifndef DCP_CAPI_INTERNAL_HOST_COPIES_H_
#define DCP_CAPI_INTERNAL_HOST_COPIES_H_

#include "absl/types/span.h"
#include "dcp/dcp.h"

namespace dcp::capi {

// Copies every entry of `copies` (validated by the caller: non-null
// pointers where bytes > 0, no overlaps) on up to `threads` threads
// (<= 0: the number of cores, at most 8), the calling thread among them.
// Returns when every byte is copied.
void CopyHost(absl::Span<const dcp_host_copy_t> copies, int threads);

}  // namespace dcp::capi

#endif  // DCP_CAPI_INTERNAL_HOST_COPIES_H_
