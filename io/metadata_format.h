// The metadata file of a committed checkpoint: Metadata encoded as a small
// fixed header (magic, container version, payload length, XXH3-64 of the
// payload) followed by a protobuf payload (io/format.proto). The layout is
// specified in docs/FORMAT.md; this is its only encoder and decoder.
//
// Thread safety: the functions are pure and thread-safe.
#ifndef DCP_IO_METADATA_FORMAT_H_
#define DCP_IO_METADATA_FORMAT_H_

#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "planner/metadata.h"
#include "planner/plan.h"

namespace dcp {

// The name of the metadata file inside a checkpoint directory. Its presence
// (after an atomic rename) is what makes a checkpoint committed.
inline constexpr char kMetadataFileName[] = ".metadata";

// The 8 bytes every dcp metadata file starts with (PNG-style: a high byte,
// the name, and line-ending bytes that reveal text-mode mangling).
inline constexpr char kMetadataMagic[9] =
    "\x89"
    "DCP\r\n\x1a\n";

// The version of the container header (not of the payload schema, which is
// Metadata::version, kFormatVersion).
inline constexpr uint32_t kMetadataHeaderVersion = 1;

// Header size in bytes: magic(8) version(4) flags(4) length(8) xxh3(8).
inline constexpr size_t kMetadataHeaderSize = 32;

// The largest checksum block a checkpoint may use (a reader holds whole
// blocks in memory to verify them); FileSystemWriter refuses larger ones.
inline constexpr int64_t kMaxChecksumBlockSize = int64_t{1} << 30;

// The largest metadata file: the header plus the largest payload protobuf
// parses (2 GiB - 1). Readers refuse larger files before reading them.
inline constexpr int64_t kMaxMetadataFileSize =
    kMetadataHeaderSize + int64_t{INT32_MAX};

// The checksum blocks of an item of `length` >= 0 bytes in blocks of
// `block_size` > 0 bytes (the last may be shorter), without overflow.
inline int64_t ChecksumBlockCount(int64_t length, int64_t block_size) {
  return length / block_size + (length % block_size != 0 ? 1 : 0);
}

// OK when `name` can name a data file of a checkpoint: a plain name inside
// its directory (not empty, not "." or "..", no '/', no NUL, at most
// NAME_MAX bytes), so that
// joining it to the directory never leaves the directory. kDataLoss naming
// it otherwise.
absl::Status CheckDataFileName(absl::string_view name);

// Encodes `metadata` as the complete bytes of a metadata file. The encoding
// is deterministic (std::map order). Version kFormatVersion (dcp-1) unless
// some item is stored through extensions: then kExtensionsFormatVersion
// (dcp-2) with the extension records; kLaterDTypesFormatVersion (dcp-3)
// when some tensor has a dtype added after the first 17 (with or without
// extension records). kInvalidArgument for values the format
// cannot hold (a tensor chunk whose rank differs from its tensor's, an
// extension record whose block sizes disagree with its lengths).
absl::StatusOr<std::string> EncodeMetadata(const Metadata& metadata);

// The encoding of `metadata` with each of `results` recorded in its
// storage_data as insert_or_assign would (in order: a later result for the
// same index wins), without copying the metadata.
absl::StatusOr<std::string> EncodeMetadata(
    const Metadata& metadata,
    absl::Span<const std::vector<WriteResult>> results);

// Decodes the bytes of a metadata file; `source` (a path) names the file in
// messages. kDataLoss for a file that is not a dcp metadata file (bad magic),
// is torn (length mismatch), fails its checksum or does not parse;
// kFailedPrecondition for a file written by a newer, incompatible dcp.
//
// The bytes are untrusted: a payload with a valid checksum may still be
// crafted. Before returning, every number and name is validated, so callers
// may use them without further overflow checks (kDataLoss naming the field,
// the tensor or the file otherwise): data file names are plain names
// (CheckDataFileName); 0 < checksum_block_size <= kMaxChecksumBlockSize;
// every tensor's shape is non-negative and its byte size fits int64_t; every
// chunk lies inside its tensor's shape; every stored item has offset >= 0,
// length >= 0 and offset + length <= INT64_MAX, and belongs to a value: a
// chunk's item to that chunk, with exactly the chunk's bytes, a bytes
// value's item to it (for an item stored through extensions, its raw
// length). Extension records (version dcp-2 only) are well formed: known
// descriptor syntax, one stored size per raw block within the block's raw
// size, adding up to the item's length, one checksum per block; whether
// this dcp knows the extensions is the reader's to check. What needs the
// data files (offset + length within the file, the checksum count against
// the length) is the reader's to check.
absl::StatusOr<Metadata> DecodeMetadata(absl::string_view bytes,
                                        absl::string_view source);

}  // namespace dcp

#endif  // DCP_IO_METADATA_FORMAT_H_
