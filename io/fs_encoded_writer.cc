#include "io/fs_encoded_writer.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/checksum.h"
#include "core/status.h"
#include "io/internal/parallel_work.h"

namespace dcp::internal_fs {

using internal_io::AlignDown;
using internal_io::AlignedBuffer;
using internal_io::AlignUp;
using internal_io::kDirectIoAlignment;

absl::StatusOr<int64_t> WriteEncodedItem(FileWriteQueue& queue, size_t item,
                                         const ExtensionChain& chain,
                                         const std::byte* bytes, int64_t length,
                                         int64_t offset, int64_t block_size,
                                         bool direct_io, StorageInfo& info) {
  info.offset = offset;
  info.extensions.clear();
  for (const auto& extension : chain) {
    info.extensions.push_back(extension->descriptor());
  }
  info.raw_length = length;
  info.block_lengths.clear();
  info.block_checksums.clear();
  const int64_t blocks = (length + block_size - 1) / block_size;
  info.block_lengths.reserve(static_cast<size_t>(blocks));
  info.block_checksums.reserve(static_cast<size_t>(blocks));
  // A buffer holds at least one whole block after an unaligned carry.
  const int64_t capacity =
      std::max(2 * kBounceChunk,
               AlignUp(block_size, kDirectIoAlignment) + kDirectIoAlignment);
  AlignedBuffer* buffer = queue.TakeBounce(capacity);
  int64_t buffer_start = offset;  // File offset of buffer->data[0].
  int64_t fill = 0;
  // Writes what the buffer holds: with O_DIRECT only its whole aligned
  // blocks, the unaligned rest carried into a fresh buffer, unless `last`
  // (then zero-padded).
  auto flush = [&](bool last) {
    int64_t write = fill;
    if (direct_io) {
      write = last ? AlignUp(fill, kDirectIoAlignment)
                   : AlignDown(fill, kDirectIoAlignment);
      if (last) std::memset(buffer->data + fill, 0, write - fill);
    }
    const int64_t carry = fill - std::min(fill, write);
    std::byte tail[kDirectIoAlignment];
    std::memcpy(tail, buffer->data + write, carry);
    queue.SetBounceWritten(
        write > 0 ? queue.Write(item, buffer_start, buffer->data, write)
                  : Future<void>::Ready(absl::OkStatus()));
    buffer_start += write;
    fill = carry;
    if (last) return;
    buffer = queue.TakeBounce(capacity);
    std::memcpy(buffer->data, tail, carry);
  };
  std::vector<std::byte> scratch;
  int64_t stored = 0;
  for (int64_t pos = 0; pos < length && !queue.failed(); pos += block_size) {
    const int64_t raw = std::min(block_size, length - pos);
    if (capacity - fill < raw) flush(false);
    std::byte* out = buffer->data + fill;
    absl::StatusOr<size_t> encoded =
        EncodeBlock(chain, {bytes + pos, static_cast<size_t>(raw)},
                    {out, static_cast<size_t>(raw)}, scratch);
    if (!encoded.ok()) {
      queue.SetBounceWritten(Future<void>::Ready(absl::OkStatus()));
      return encoded.status();
    }
    const size_t size = *encoded;
    const std::byte* block = bytes + pos;
    if (size < static_cast<size_t>(raw)) {
      block = out;
      fill += static_cast<int64_t>(size);
    } else if (!direct_io ||
               (fill % kDirectIoAlignment == 0 &&
                raw % kDirectIoAlignment == 0 &&
                reinterpret_cast<uintptr_t>(block) % kDirectIoAlignment == 0)) {
      // Stored as is, and writable from the caller's memory where it stands
      // (incompressible state costs no copy): what the buffer holds goes
      // first.
      if (fill > 0) flush(false);
      queue.Write(item, buffer_start, block, static_cast<size_t>(raw));
      buffer_start += raw;
    } else {
      std::memcpy(out, block, static_cast<size_t>(raw));
      block = out;
      fill += raw;
    }
    info.block_checksums.push_back(Checksum(block, size));
    info.block_lengths.push_back(static_cast<int64_t>(size));
    stored += static_cast<int64_t>(size);
  }
  flush(true);
  info.length = stored;
  return offset + stored;
}

}  // namespace dcp::internal_fs
