// Internal to io/: writes one item of a data file through stream extensions
// (io/extensions.h; docs/FORMAT.md section 3.1). The item is cut into blocks
// of the checksum block size; each block is encoded on the calling thread,
// checksummed as stored, and appended to aligned bounce buffers that are
// written through the file's FileWriteQueue while the next blocks are
// encoded, so encoding overlaps the I/O.
#ifndef DCP_IO_FS_ENCODED_WRITER_H_
#define DCP_IO_FS_ENCODED_WRITER_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "io/extensions.h"
#include "io/fs_file_writer.h"
#include "planner/metadata.h"

namespace dcp::internal_fs {

// Writes the `length` (> 0) bytes at `bytes` (which must stay valid and
// unchanged until the queue's writes complete: blocks stored as is are
// written from there) through `chain` (not empty) as item `item` of
// `queue`, starting at file offset `offset`
// (kDirectIoAlignment aligned). Fills `info`'s offset, length (stored
// bytes), extensions, raw_length, block_lengths and block_checksums (of the
// stored blocks). With `direct_io` the last write is zero-padded to a whole
// aligned block. Returns the file offset past the item's stored bytes.
// Errors: the chain's (internal); write errors surface in the queue.
absl::StatusOr<int64_t> WriteEncodedItem(FileWriteQueue& queue, size_t item,
                                         const ExtensionChain& chain,
                                         const std::byte* bytes, int64_t length,
                                         int64_t offset, int64_t block_size,
                                         bool direct_io, StorageInfo& info);

}  // namespace dcp::internal_fs

#endif  // DCP_IO_FS_ENCODED_WRITER_H_
