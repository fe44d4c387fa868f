// XXH3-64 checksums (libxxhash) of stored bytes. Every item in a checkpoint
// carries one; loads verify before accepting data.
#ifndef DCP_CORE_CHECKSUM_H_
#define DCP_CORE_CHECKSUM_H_

#include <cstddef>
#include <cstdint>
#include <memory>

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

}  // namespace dcp

#endif  // DCP_CORE_CHECKSUM_H_
