#include "comm/internal/payload_limit.h"

#include <unistd.h>

#include <cstdint>
#include <limits>

namespace dcp::comm::internal {
namespace {

// The bound where the physical memory is unknown.
constexpr uint64_t kUnknownMemoryBytes = uint64_t{1} << 40;

}  // namespace

uint64_t PhysicalMemoryBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return kUnknownMemoryBytes;
  const uint64_t p = static_cast<uint64_t>(pages);
  const uint64_t s = static_cast<uint64_t>(page_size);
  if (p > std::numeric_limits<uint64_t>::max() / s) return kUnknownMemoryBytes;
  return p * s;
}

uint64_t MaxPayloadBytes(uint64_t configured) {
  return configured != 0 ? configured : PhysicalMemoryBytes();
}

}  // namespace dcp::comm::internal
