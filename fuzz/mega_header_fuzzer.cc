// Fuzz target: the MEGA shard header decoder (io/mega_format.h
// DecodeMegaHeader), which validates the preamble and JSON header of a
// `.mega` file before dcp reads entries by its offsets.
//
// Input: the file's size as 8 little-endian bytes, then the file's first
// bytes (the prefix the reader passes). Each input is tried as it is and
// with the preamble's header length and XXH3 rewritten to cover the rest
// of the prefix (so that mutations of the JSON get past the checksum).
//
// Invariants: decoding never crashes and fails only with kDataLoss,
// kUnimplemented (another major version) or kOutOfRange asking for more
// bytes than the prefix and at most the file; a decoded header describes
// the file (data_start 4 KiB aligned, entries inside the data section, a
// checksum per block); and where the re-encoded JSON fits the same data
// start, EncodeMegaHeader of the decoded header (whose data section ends
// at the last entry, without the slack a file may have after it) decodes
// and re-encodes to the same bytes.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/status/statusor.h"
#include "core/checksum.h"
#include "fuzz/fuzz_check.h"
#include "io/mega_format.h"

namespace dcp::fuzz {
namespace {

uint64_t GetLe(absl::string_view bytes, size_t at, int width) {
  uint64_t value = 0;
  for (int i = width - 1; i >= 0; --i) {
    value = (value << 8) | static_cast<uint8_t>(bytes[at + i]);
  }
  return value;
}

void PutLe(std::string& bytes, size_t at, uint64_t value, int width) {
  for (int i = 0; i < width; ++i) {
    bytes[at + i] = static_cast<char>(value >> (8 * i));
  }
}

void CheckHeader(absl::string_view prefix, int64_t file_size) {
  int64_t needed = -1;
  absl::StatusOr<MegaHeader> header =
      DecodeMegaHeader(prefix, file_size, "fuzz.mega", &needed);
  if (Verbose()) {
    std::fprintf(stderr, "decode: %s\n", header.status().ToString().c_str());
  }
  if (absl::IsOutOfRange(header.status())) {
    DCP_FUZZ_CHECK(
        needed > static_cast<int64_t>(prefix.size()) && needed <= file_size,
        "kOutOfRange without a sensible byte count");
    return;
  }
  if (absl::IsUnimplemented(header.status())) return;
  CheckDecodeError(header.status());
  if (!header.ok()) return;
  DCP_FUZZ_CHECK(header->data_start % kMegaAlignment == 0 &&
                     header->data_start >= kMegaPreambleBytes &&
                     header->file_size == file_size &&
                     header->data_start <= file_size,
                 "the data section does not fit the file");
  const int64_t data_bytes = file_size - header->data_start;
  const int64_t block = header->checksum_block_size;
  for (const MegaEntry& e : header->entries) {
    DCP_FUZZ_CHECK(
        e.begin >= 0 && e.length >= 0 && e.begin <= data_bytes - e.length,
        "an entry lies outside the data section");
    DCP_FUZZ_CHECK(static_cast<int64_t>(e.checksums.size()) ==
                       (e.length + block - 1) / block,
                   "an entry's checksum count differs from its blocks");
  }

  const std::string encoded = EncodeMegaHeader(*header);
  if (static_cast<int64_t>(encoded.size()) != header->data_start) return;
  // The encoder's data section ends at the last entry's end; a decoded
  // file may have slack after it.
  int64_t entries_end = 0;
  for (const MegaEntry& e : header->entries) {
    entries_end = std::max(entries_end, e.begin + e.length);
  }
  absl::StatusOr<MegaHeader> again = DecodeMegaHeader(
      encoded, header->data_start + entries_end, "re-encoded.mega");
  if (!again.ok()) {
    std::fprintf(stderr, "%s\n", again.status().ToString().c_str());
  }
  DCP_FUZZ_CHECK(again.ok(), "a re-encoded header does not decode");
  DCP_FUZZ_CHECK(EncodeMegaHeader(*again) == encoded,
                 "encode(decode(encode(h))) differs from encode(h)");
}

}  // namespace
}  // namespace dcp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dcp;
  const absl::string_view bytes = fuzz::AsBytes(data, size);
  if (bytes.size() < 8) return 0;
  // At most 1 TiB: sizes beyond are refused the same way.
  const int64_t file_size = static_cast<int64_t>(fuzz::GetLe(bytes, 0, 8) &
                                                 ((uint64_t{1} << 40) - 1));
  const absl::string_view prefix = bytes.substr(8);
  fuzz::CheckHeader(prefix, file_size);
  if (prefix.size() < static_cast<size_t>(kMegaPreambleBytes)) return 0;
  std::string fixed(prefix);
  const absl::string_view json = prefix.substr(kMegaPreambleBytes);
  fuzz::PutLe(fixed, 16, json.size(), 8);
  fuzz::PutLe(fixed, 24, Checksum(json.data(), json.size()), 8);
  if (fixed != prefix) fuzz::CheckHeader(fixed, file_size);
  return 0;
}
