// What the page cache holds of a file, and whether the kernel takes
// uncached (RWF_DONTCACHE) writes in a directory: for tests of writes that
// are meant to leave the page cache (OpenOptions::uncached).
#ifndef DCP_IO_TESTING_PAGE_RESIDENCY_H_
#define DCP_IO_TESTING_PAGE_RESIDENCY_H_

#include <cstdint>
#include <string>

namespace dcp::testing {

struct Residency {
  int64_t resident = 0;  // Pages of the file in the page cache (mincore).
  int64_t pages = 0;     // Pages the file spans.
};

// -1 in both fields when the file cannot be opened or mapped.
Residency PageResidency(const std::string& path);

// PageResidency, polled for up to 2 s until fewer than half of the pages
// are cached: uncached writes leave the cache as their writeback ends,
// which may be just after the fsync that waited for it returns.
Residency AwaitMostlyDropped(const std::string& path);

// Writes `path`'s dirty pages back and drops its pages from the page cache
// (fdatasync, POSIX_FADV_DONTNEED), so that the next read comes from the
// disk.
void DropCachedPages(const std::string& path);

// Whether pwritev2 with RWF_DONTCACHE works on a regular file in `dir` (a
// scratch file, removed again), or on a memfd when `dir` is empty.
bool KernelTakesUncachedWrites(const std::string& dir);

// Whether POSIX_FADV_DONTNEED drops clean pages of files in `dir` (false on
// tmpfs, whose pages are the files): where uncached reads leave the cache.
bool DropsCleanPages(const std::string& dir);

// Whether `dir` is a directory on tmpfs this process may write into.
bool IsWritableTmpfs(const std::string& dir);

}  // namespace dcp::testing

#endif  // DCP_IO_TESTING_PAGE_RESIDENCY_H_
