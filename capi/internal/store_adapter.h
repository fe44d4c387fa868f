// dcp_process_group_create_from_store: a caller's C key-value store
// (dcp_store_t, e.g. torchrun's TCPStore reached from Python) adapted to
// comm::KeyValueStore, and the store process group over it
// (comm/store_process_group.h).
//
// Thread safety: the adapter calls the C callbacks one at a time (a mutex
// per adapter, hence per group), as dcp/dcp.h promises the caller.
#ifndef DCP_CAPI_INTERNAL_STORE_ADAPTER_H_
#define DCP_CAPI_INTERNAL_STORE_ADAPTER_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "comm/process_group.h"
#include "dcp/dcp.h"

namespace dcp::capi {

// Joins the store group of `options` (group_name, timeout_ms; the timeout
// bounds joining too) as `rank` of `size`. kInvalidArgument for a NULL or
// mis-sized store, missing set/get callbacks, or a backend other than
// "auto" or "store"; otherwise CreateStoreProcessGroup's errors.
absl::StatusOr<std::unique_ptr<comm::ProcessGroup>> CreateGroupOverStore(
    const dcp_store_t* store, int32_t rank, int32_t size,
    const dcp_process_group_options_t* options);

}  // namespace dcp::capi

#endif  // DCP_CAPI_INTERNAL_STORE_ADAPTER_H_
