// The bound on a payload size a peer announces before its bytes: a
// receiving rank allocates the announced size at once, so a corrupt or
// hostile stream must not make it allocate more than it could ever hold.
// Internal to comm/.
#ifndef DCP_COMM_INTERNAL_PAYLOAD_LIMIT_H_
#define DCP_COMM_INTERNAL_PAYLOAD_LIMIT_H_

#include <cstdint>

namespace dcp::comm::internal {

// This machine's physical memory in bytes (sysconf _SC_PHYS_PAGES times
// the page size); 1 TiB when the system does not say.
uint64_t PhysicalMemoryBytes();

// The most bytes one received payload may have: `configured` when it is
// not 0 (GroupMembership::max_payload_bytes), else PhysicalMemoryBytes(): a
// payload is held whole in this process's memory, so one larger than the
// machine's memory is garbage, never a plan.
uint64_t MaxPayloadBytes(uint64_t configured);

}  // namespace dcp::comm::internal

#endif  // DCP_COMM_INTERNAL_PAYLOAD_LIMIT_H_
