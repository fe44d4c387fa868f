#include "core/checksum.h"

#include <xxhash.h>

namespace dcp {

struct StreamingChecksum::State {
  XXH3_state_t* xxh = XXH3_createState();
  ~State() { XXH3_freeState(xxh); }
};

uint64_t Checksum(const void* data, size_t size) {
  return XXH3_64bits(data, size);
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

}  // namespace dcp
