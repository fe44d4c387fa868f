// Evicting a checkpoint from the page cache, so that the load that follows
// reads from the disk (as fio's invalidate=1 does), or reading it in, so
// that the load that follows reads from memory: for the demo and the
// benchmarks.
#ifndef DCP_TOOLS_PAGE_CACHE_H_
#define DCP_TOOLS_PAGE_CACHE_H_

#include <cstdint>
#include <string>

namespace dcp {

// Writes back and drops the cached pages of every regular file under `dir`
// (fdatasync + POSIX_FADV_DONTNEED). Best effort: files that cannot be
// opened are skipped.
void DropPageCache(const std::string& dir);

// Reads every regular file under `dir` once, to its end, so that its pages
// are cached. Returns the bytes read. Best effort, as DropPageCache.
int64_t WarmPageCache(const std::string& dir);

}  // namespace dcp

#endif  // DCP_TOOLS_PAGE_CACHE_H_
