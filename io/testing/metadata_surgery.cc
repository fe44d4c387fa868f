#include "io/testing/metadata_surgery.h"

#include <cstdint>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/checksum.h"
#include "io/file_system.h"
#include "io/metadata_format.h"

namespace dcp::testing {

absl::StatusOr<std::string> RewritePayload(
    absl::string_view bytes,
    absl::FunctionRef<void(format::Metadata&)> mutate) {
  format::Metadata proto;
  if (bytes.size() < kMetadataHeaderSize ||
      !proto.ParseFromArray(
          bytes.data() + kMetadataHeaderSize,
          static_cast<int>(bytes.size() - kMetadataHeaderSize))) {
    return absl::DataLossError("no parsable metadata payload to rewrite");
  }
  mutate(proto);
  const std::string payload = proto.SerializeAsString();
  std::string out(bytes.substr(0, kMetadataHeaderSize));
  const uint64_t length = payload.size();
  const uint64_t sum = Checksum(payload.data(), payload.size());
  for (int i = 0; i < 8; ++i) {
    out[16 + i] = static_cast<char>(length >> (8 * i));
    out[24 + i] = static_cast<char>(sum >> (8 * i));
  }
  return out + payload;
}

int StoredItemPosition(const format::Metadata& proto, absl::string_view fqn) {
  size_t pos = 0;
  for (int id = 0; id < proto.names().lengths_size(); ++id) {
    const size_t length = proto.names().lengths(id);
    if (absl::string_view(proto.names().blob()).substr(pos, length) == fqn) {
      for (int i = 0; i < proto.storage_name_size(); ++i) {
        if (proto.storage_name(i) == static_cast<uint32_t>(id)) return i;
      }
      return -1;
    }
    pos += length;
  }
  return -1;
}

bool ClaimLength(format::Metadata& proto, absl::string_view fqn, int64_t length,
                 int64_t block_size) {
  const int item = StoredItemPosition(proto, fqn);
  if (item < 0) return false;
  // The item's checksums follow those of the items before it.
  int first = 0;
  for (int i = 0; i < item; ++i) first += proto.storage_checksum_count(i);
  const int old_count = proto.storage_checksum_count(item);
  const int new_count =
      static_cast<int>(ChecksumBlockCount(length, block_size));
  std::vector<uint64_t> sums(proto.storage_checksums().begin(),
                             proto.storage_checksums().end());
  sums.erase(sums.begin() + first, sums.begin() + first + old_count);
  sums.insert(sums.begin() + first, new_count, uint64_t{0x5eed});
  proto.mutable_storage_checksums()->Assign(sums.begin(), sums.end());
  proto.set_storage_checksum_count(item, new_count);
  proto.set_storage_length(item, length);
  proto.set_checksum_block_size(block_size);
  return true;
}

absl::Status RewriteMetadataFile(
    const std::string& dir, absl::FunctionRef<void(format::Metadata&)> mutate) {
  const std::string path = JoinPath(dir, kMetadataFileName);
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream bytes;
  bytes << in.rdbuf();
  absl::StatusOr<std::string> rewritten = RewritePayload(bytes.str(), mutate);
  if (!rewritten.ok()) return rewritten.status();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << *rewritten;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace dcp::testing
