// The MEGA checkpoint format (docs/FORMAT.md section 8): shard files
// `model.mega` or `model-00001-of-0000N.mega`, each a 32-byte preamble
// (magic, format version, header length, XXH3-64 of the header), a JSON
// header describing its entries, and 4 KiB aligned entry data; plus
// `model.mega.index.json`, which maps each tensor to the files holding its
// chunks and is written last (the commit point).
//
// This file encodes and decodes those bytes; io/mega_storage.h reads and
// writes directories. Decoding treats its input as untrusted: every number
// and name is validated, and a malformed file is kDataLoss naming the path.
// Thread safety: free functions over values, no shared state.
#ifndef DCP_IO_MEGA_FORMAT_H_
#define DCP_IO_MEGA_FORMAT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "io/file_system.h"

namespace dcp {

inline constexpr char kMegaIndexFileName[] = "model.mega.index.json";
inline constexpr char kMegaSingleFileName[] = "model.mega";
inline constexpr char kMegaCommitJournalName[] = ".dcp-mega-commit";
// The first 8 bytes of every MEGA file.
inline constexpr char kMegaMagic[] = "\x89MEGA\r\n\x1a";
inline constexpr int kMegaMagicBytes = 8;
// The version this build writes. Readers accept any minor version of their
// major version (minor versions only add JSON keys readers may ignore).
inline constexpr int kMegaMajorVersion = 1;
inline constexpr int kMegaMinorVersion = 0;
inline constexpr int64_t kMegaPreambleBytes = 32;
// Entry data, and the data section, start at multiples of this.
inline constexpr int64_t kMegaAlignment = 4096;
// The largest JSON header and index a reader accepts.
inline constexpr int64_t kMegaMaxHeaderBytes = int64_t{256} << 20;
// Checksum blocks: multiples of kMegaAlignment up to this.
inline constexpr int64_t kMegaMaxChecksumBlock = int64_t{1} << 30;

// "model.mega" for a single file (count 1), else "model-00002-of-00005.mega".
std::string MegaFileName(int index, int count);
// Whether `name` is a name MegaFileName makes or the index's name.
bool IsMegaCheckpointFileName(absl::string_view name);

// One stored item of a file: a chunk of a tensor, or a non-tensor value's
// bytes (docs/FORMAT.md "Non-tensor values").
struct MegaEntry {
  std::string name;
  bool is_tensor = true;
  // Tensors: dtype, global shape, this chunk's offsets and sizes in it.
  DType dtype = DType::kU8;
  Shape shape;
  Shape offsets;
  Shape sizes;
  bool requires_grad = false;
  // Bytes from the start of the data section (a multiple of kMegaAlignment)
  // and length (numel x element size for tensors).
  int64_t begin = 0;
  int64_t length = 0;
  // XXH3-64 of each checksum block of the entry's bytes.
  std::vector<uint64_t> checksums;
};

struct MegaHeader {
  int minor_version = kMegaMinorVersion;
  int64_t checksum_block_size = int64_t{4} << 20;
  // Entries in data order.
  std::vector<MegaEntry> entries;

  // Filled by LayOutMegaFile / DecodeMegaHeader: where the data section
  // starts (a multiple of kMegaAlignment) and the file's size.
  int64_t data_start = 0;
  int64_t file_size = 0;
};

// Gives each entry its `begin` (consecutive, each 4 KiB aligned, in entry
// order) and sets data_start and file_size. Checksums need not be set yet:
// they are fixed-width in the header, so the layout does not depend on
// them. kInvalidArgument for a checksum block size out of range or an
// entry name that is not valid UTF-8 (JSON cannot hold it).
absl::Status LayOutMegaFile(MegaHeader& header);

// The preamble and JSON header of `header` (laid out), zero-padded to
// data_start bytes. Entries whose checksums are not yet known encode
// zeros of the same width (the layout stays valid once they are filled).
std::string EncodeMegaHeader(const MegaHeader& header);

// Decodes the preamble and header at the start of `path`: at least the
// first kMegaPreambleBytes bytes of the file in `prefix`; when the header
// is longer, kOutOfRange with the bytes needed in `*needed`. `file_size` is
// the file's real size. kDataLoss naming `path` for a wrong magic, a
// header whose checksum does not match, malformed JSON, an invalid entry
// (unknown dtype, a chunk outside its tensor, a length that does not match
// its shape, a tensor whose byte size overflows int64, an unaligned or
// overlapping entry, a wrong checksum count), JSON nested more than 64
// levels deep, or a file shorter or longer than its header says
// (truncated); kUnimplemented naming both versions for another major
// version.
absl::StatusOr<MegaHeader> DecodeMegaHeader(absl::string_view prefix,
                                            int64_t file_size,
                                            const std::string& path,
                                            int64_t* needed = nullptr);

// Reads and decodes the header of the MEGA file `file` (DecodeMegaHeader).
absl::StatusOr<MegaHeader> ReadMegaHeader(File& file, const std::string& path);

// `model.mega.index.json`: the files of the checkpoint and, for each value,
// the files holding its entries.
struct MegaIndex {
  int64_t total_size = 0;  // Bytes of all entries.
  std::vector<std::string> files;
  std::map<std::string, std::vector<std::string>> weight_map;
};

std::string EncodeMegaIndex(const MegaIndex& index);
// kDataLoss naming `path` when it does not parse (or nests more than 64
// levels deep), a file is not a plain MEGA file name or is listed twice,
// or weight_map names a file `files` lacks; kUnimplemented for another
// major version.
absl::StatusOr<MegaIndex> DecodeMegaIndex(absl::string_view text,
                                          const std::string& path);

}  // namespace dcp

#endif  // DCP_IO_MEGA_FORMAT_H_
