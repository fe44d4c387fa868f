// XXH3-64 checksums (libxxhash) of stored bytes. Every item in a checkpoint
// carries one; loads verify before accepting data.
#ifndef DCP_CORE_CHECKSUM_H_
#define DCP_CORE_CHECKSUM_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace dcp {

// XXH3-64 of `size` bytes at `data`, seed 0.
uint64_t Checksum(const void* data, size_t size);

// Incremental XXH3-64: feeding the bytes in pieces gives the same value as
// Checksum() of the whole. Not thread-safe.
class StreamingChecksum {
 public:
  StreamingChecksum();
  ~StreamingChecksum();
  StreamingChecksum(StreamingChecksum&&) noexcept;
  StreamingChecksum& operator=(StreamingChecksum&&) noexcept;

  void Update(const void* data, size_t size);
  uint64_t Digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Checksums of consecutive `block_size`-byte blocks of `length` bytes at
// `data` (the last block may be shorter): one per block, none for length 0.
// The form every stored item's checksums take (Metadata::
// checksum_block_size). `block_size` > 0.
std::vector<uint64_t> BlockChecksums(const std::byte* data, int64_t length,
                                     int64_t block_size);

// BlockChecksums of bytes that arrive in pieces, in order (staged device
// tensors): Update with each piece, then Finish gives the same values as
// BlockChecksums of the whole. Not thread-safe.
class BlockChecksummer {
 public:
  explicit BlockChecksummer(int64_t block_size) : block_size_(block_size) {}

  void Update(const std::byte* data, int64_t length);
  // The checksums so far, a partial last block included; the checksummer is
  // then empty, ready for the next item.
  std::vector<uint64_t> Finish();

 private:
  const int64_t block_size_;
  StreamingChecksum block_;
  int64_t filled_ = 0;
  std::vector<uint64_t> sums_;
};

}  // namespace dcp

#endif  // DCP_CORE_CHECKSUM_H_
