// The safetensors file format, as the reference implementation (the Rust
// `safetensors` crate, which the Python library wraps) enforces it:
//
//   [8 bytes: N, little-endian u64][N bytes: UTF-8 JSON header][data]
//
// The header is one JSON object. Each key but "__metadata__" names a tensor:
// {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, offsets
// relative to the start of the data, bytes little-endian and row-major.
// "__metadata__", optional, maps strings to strings. A file is valid when:
//   - it has at least 8 bytes, N <= kSafetensorsMaxHeaderBytes, and the
//     file holds the 8 + N bytes the length claims;
//   - the header is valid UTF-8, starts with '{', is JSON with no duplicate
//     key in any object, nested at most kMaxUntrustedJsonDepth levels deep
//     (it needs three; the reference's serde_json stops at 128), and has the
//     shape above (shape and offsets are non-negative integers, dtypes are
//     the format's names);
//   - the product of a shape times the dtype's size does not overflow and
//     equals end - begin;
//   - sorted by offset, the tensors cover the data from 0 with no gap and
//     no overlap (zero-size tensors take no bytes), and the data ends where
//     the file ends (neither truncated nor overlong).
// Trailing whitespace in the header is allowed: writers pad with spaces so
// the data starts aligned.
//
// Everything here is pure except ReadSafetensorsHeader, which reads an open
// File. Parsers take untrusted bytes: every number is checked, with
// overflow-checked arithmetic, before anything is allocated by it, and a
// violation is kDataLoss naming the file and the rule (never a crash).
// Thread-safe (no shared state).
#ifndef DCP_IO_SAFETENSORS_H_
#define DCP_IO_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "io/file_system.h"
#include "io/internal/untrusted_json.h"
#include "nlohmann/json_fwd.hpp"

namespace dcp {

// The largest header the reference accepts (its MAX_HEADER_SIZE).
inline constexpr int64_t kSafetensorsMaxHeaderBytes = 100'000'000;
// The header key of the string-to-string metadata map.
inline constexpr char kSafetensorsMetadataKey[] = "__metadata__";

// One tensor of a safetensors file.
struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  // data_offsets: bytes [begin, end) of the data section (which starts at
  // file offset SafetensorsHeader::data_start()).
  int64_t begin = 0;
  int64_t end = 0;

  friend bool operator==(const SafetensorsTensor& a,
                         const SafetensorsTensor& b) {
    return a.name == b.name && a.dtype == b.dtype && a.shape == b.shape &&
           a.begin == b.begin && a.end == b.end;
  }
};

// A validated header.
struct SafetensorsHeader {
  // N: the JSON header's length in bytes, padding included.
  int64_t header_length = 0;
  // Bytes of data after the header (the file's size - data_start()).
  int64_t data_length = 0;
  // In data order (by begin, then end; zero-size tensors before the tensor
  // that starts where they are), names unique.
  std::vector<SafetensorsTensor> tensors;
  // "__metadata__", empty when absent.
  std::map<std::string, std::string> metadata;

  // File offset of the data section.
  int64_t data_start() const { return 8 + header_length; }
};

// Validates the JSON header `json` (bytes [8, 8 + N) of the file) of a file
// with `data_length` bytes after it. `file` names the file in messages.
// kDataLoss naming `file` and the rule broken; kUnimplemented for a dtype
// of the format that dcp does not hold (F8_E8M0, F4, ...).
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(
    absl::string_view json, int64_t data_length, absl::string_view file);

// Validates a whole file held in memory (`bytes`), as above.
absl::StatusOr<SafetensorsHeader> ParseSafetensors(absl::string_view bytes,
                                                   absl::string_view file);

// Reads and validates the header of the open file `file`: its size, the 8
// length bytes, then the header, allocating the header's bytes only once
// its length has been checked against the limit and the file's size. The
// file's own errors, or the parser's.
absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(File& file);

// The order to lay tensors out in. block = 0: the reference writer's,
// larger elements first (so every tensor of an aligned data section is
// aligned to its element size), then by name. block > 0 (a power of two):
// first the tensors whose byte size is a multiple of `block`, then the
// rest, each group in the reference's order; with the data section
// `block`-aligned, every tensor of the first group starts `block`-aligned
// (O_DIRECT moves it without a bounce copy) and every tensor stays aligned
// to its element size. Readers do not depend on the order.
void SortForSafetensors(std::vector<SafetensorsTensor>& tensors,
                        int64_t block = 0);

// Assigns data offsets to `tensors` in their order (contiguous from 0) and
// returns the bytes that precede the data: the 8-byte length and the JSON
// header, "__metadata__" first, padded with spaces so that the data starts
// at a multiple of `alignment` (a positive multiple of 8; the reference
// pads to 8). kInvalidArgument for a name that is not valid UTF-8, empty,
// duplicated or "__metadata__", a negative shape or an overflowing size, a
// dtype the format lacks (C128), metadata that is not valid UTF-8, or a
// header over kSafetensorsMaxHeaderBytes.
absl::StatusOr<std::string> EncodeSafetensorsHeader(
    std::vector<SafetensorsTensor>& tensors,
    const std::map<std::string, std::string>& metadata, int64_t alignment = 8);

// The checks of untrusted JSON the parsers here apply, for the JSON beside
// the safetensors files (a Hugging Face index, DCP_SHARDING_INFO,
// config.json): IsValidUtf8, kMaxUntrustedJsonDepth, ParseUntrustedJson
// and DescribeJsonValue (io/internal/untrusted_json.h states them).
using internal_io::DescribeJsonValue;
using internal_io::IsValidUtf8;
using internal_io::kMaxUntrustedJsonDepth;
using internal_io::ParseUntrustedJson;

}  // namespace dcp

#endif  // DCP_IO_SAFETENSORS_H_
