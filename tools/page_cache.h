// Evicting a checkpoint from the page cache, so that the load that follows
// reads from the disk (as fio's invalidate=1 does): for the demo and the
// benchmarks.
#ifndef DCP_TOOLS_PAGE_CACHE_H_
#define DCP_TOOLS_PAGE_CACHE_H_

#include <string>

namespace dcp {

// Writes back and drops the cached pages of every regular file under `dir`
// (fdatasync + POSIX_FADV_DONTNEED). Best effort: files that cannot be
// opened are skipped.
void DropPageCache(const std::string& dir);

}  // namespace dcp

#endif  // DCP_TOOLS_PAGE_CACHE_H_
