#include "core/checksum.h"

#include <xxhash.h>

#include <algorithm>
#include <utility>

#include "core/internal/xxh3_avx2.h"

namespace dcp {
namespace {

// XXH3 built for AVX2 where this build has it and the CPU runs it; the
// library's (SSE2) otherwise. Both give the same values.
bool UseAvx2() {
#if defined(__x86_64__)
  static const bool avx2 =
      __builtin_cpu_supports("avx2") != 0 && internal::Xxh3Avx2Built();
  return avx2;
#else
  return false;
#endif
}

}  // namespace

struct StreamingChecksum::State {
  XXH3_state_t* xxh = XXH3_createState();
  ~State() { XXH3_freeState(xxh); }
};

uint64_t Checksum(const void* data, size_t size) {
  return UseAvx2() ? internal::Xxh3Avx2(data, size) : XXH3_64bits(data, size);
}

StreamingChecksum::StreamingChecksum() : state_(std::make_unique<State>()) {
  XXH3_64bits_reset(state_->xxh);
}
StreamingChecksum::~StreamingChecksum() = default;
StreamingChecksum::StreamingChecksum(StreamingChecksum&&) noexcept = default;
StreamingChecksum& StreamingChecksum::operator=(StreamingChecksum&&) noexcept =
    default;

void StreamingChecksum::Update(const void* data, size_t size) {
  XXH3_64bits_update(state_->xxh, data, size);
}

uint64_t StreamingChecksum::Digest() const {
  return XXH3_64bits_digest(state_->xxh);
}

std::vector<uint64_t> BlockChecksums(const std::byte* data, int64_t length,
                                     int64_t block_size) {
  std::vector<uint64_t> sums;
  sums.reserve((length + block_size - 1) / block_size);
  for (int64_t pos = 0; pos < length; pos += block_size) {
    sums.push_back(Checksum(data + pos, std::min(block_size, length - pos)));
  }
  return sums;
}

void BlockChecksummer::Update(const std::byte* data, int64_t length) {
  while (length > 0) {
    const int64_t take = std::min(length, block_size_ - filled_);
    block_.Update(data, take);
    filled_ += take;
    data += take;
    length -= take;
    if (filled_ == block_size_) {
      sums_.push_back(block_.Digest());
      block_ = StreamingChecksum();
      filled_ = 0;
    }
  }
}

std::vector<uint64_t> BlockChecksummer::Finish() {
  if (filled_ > 0) sums_.push_back(block_.Digest());
  filled_ = 0;
  block_ = StreamingChecksum();
  return std::exchange(sums_, {});
}

}  // namespace dcp
