#include "io/mega_format.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <limits>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/checksum.h"
#include "core/status.h"
#include "io/internal/untrusted_json.h"
#include "nlohmann/json.hpp"

namespace dcp {
namespace {

using internal_io::DescribeJsonValue;
using internal_io::IsValidUtf8;
using internal_io::ParseUntrustedJson;
using Json = nlohmann::json;

// Numbers in a header stay below this, so sums of two never overflow.
constexpr int64_t kMaxNumber = int64_t{1} << 62;

int64_t AlignUp(int64_t v) {
  return (v + kMegaAlignment - 1) / kMegaAlignment * kMegaAlignment;
}

void PutLe(std::string& out, size_t at, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out[at + i] = static_cast<char>(v >> 8 * i);
}

uint64_t GetLe(absl::string_view in, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) {
    v |= static_cast<uint64_t>(static_cast<uint8_t>(in[at + i])) << 8 * i;
  }
  return v;
}

std::string JsonText(const MegaHeader& header, bool with_checksums) {
  Json entries = Json::array();
  int64_t data_bytes = 0;
  for (const MegaEntry& e : header.entries) {
    Json sums = Json::array();
    const int64_t blocks = (e.length + header.checksum_block_size - 1) /
                           header.checksum_block_size;
    for (int64_t b = 0; b < blocks; ++b) {
      const uint64_t sum =
          with_checksums && b < static_cast<int64_t>(e.checksums.size())
              ? e.checksums[b]
              : 0;
      sums.push_back(absl::StrFormat("%016x", sum));
    }
    Json entry = {{"name", e.name}};
    if (e.is_tensor) {
      entry["kind"] = "tensor";
      entry["dtype"] = std::string(DTypeName(e.dtype));
      entry["shape"] = e.shape;
      entry["offsets"] = e.offsets;
      entry["sizes"] = e.sizes;
      entry["requires_grad"] = e.requires_grad;
    } else {
      entry["kind"] = "bytes";
    }
    entry["begin"] = e.begin;
    entry["length"] = e.length;
    entry["checksums"] = std::move(sums);
    entries.push_back(std::move(entry));
    data_bytes = std::max(data_bytes, e.begin + e.length);
  }
  Json json = {
      {"format", "mega"},
      {"version", {kMegaMajorVersion, header.minor_version}},
      {"checksum",
       {{"algorithm", "xxh3-64"}, {"block_size", header.checksum_block_size}}},
      {"data_bytes", data_bytes},
      {"entries", std::move(entries)},
  };
  return json.dump();
}

// json[key] as a number in [0, kMaxNumber).
absl::StatusOr<int64_t> Count(const Json& json, const char* key,
                              const std::string& where) {
  if (!json.is_object() || !json.contains(key) ||
      !json[key].is_number_unsigned() ||
      json[key].get<uint64_t>() >= static_cast<uint64_t>(kMaxNumber)) {
    return absl::DataLossError(absl::StrCat(where, " has no valid \"", key,
                                            "\" (a count below 2^62)"));
  }
  return static_cast<int64_t>(json[key].get<uint64_t>());
}

absl::StatusOr<Shape> Dims(const Json& json, const char* key,
                           const std::string& where) {
  if (!json.contains(key) || !json[key].is_array() ||
      json[key].size() > static_cast<size_t>(kMaxTensorDims)) {
    return absl::DataLossError(
        absl::StrCat(where, " has no valid \"", key, "\" array"));
  }
  Shape dims;
  for (const Json& v : json[key]) {
    if (!v.is_number_unsigned() ||
        v.get<uint64_t>() >= static_cast<uint64_t>(kMaxNumber)) {
      return absl::DataLossError(
          absl::StrCat(where, " has a \"", key, "\" outside [0, 2^62): ",
                       DescribeJsonValue(v), " at dimension ", dims.size()));
    }
    dims.push_back(static_cast<int64_t>(v.get<uint64_t>()));
  }
  return dims;
}

absl::Status CheckVersion(const Json& json, const std::string& path) {
  if (!json.is_object() || !json.contains("version") ||
      !json["version"].is_array() || json["version"].size() != 2 ||
      !json["version"][0].is_number_unsigned()) {
    return absl::DataLossError(
        absl::StrCat(path, " has no \"version\": [major, minor]"));
  }
  const uint64_t major = json["version"][0].get<uint64_t>();
  if (major != kMegaMajorVersion) {
    return absl::UnimplementedError(
        absl::StrCat(path, " is MEGA format version ", major,
                     ".x; this build reads ", kMegaMajorVersion, ".x"));
  }
  return absl::OkStatus();
}

absl::StatusOr<MegaEntry> DecodeEntry(const Json& json, int64_t block,
                                      const std::string& where) {
  MegaEntry e;
  if (!json.is_object() || !json.contains("name") ||
      !json["name"].is_string() || json["name"].get<std::string>().empty()) {
    return absl::DataLossError(absl::StrCat(where, " has no \"name\""));
  }
  e.name = json["name"].get<std::string>();
  if (absl::StrContains(e.name, '\0')) {
    return absl::DataLossError(
        absl::StrCat(where, " has a name holding a NUL byte (\"",
                     absl::CHexEscape(e.name), "\")"));
  }
  const std::string at = absl::StrCat(where, " (\"", e.name, "\")");
  const std::string kind =
      json.contains("kind") && json["kind"].is_string() ? json["kind"] : "";
  if (kind != "tensor" && kind != "bytes") {
    return absl::DataLossError(
        absl::StrCat(at, " has a \"kind\" other than \"tensor\" or \"bytes\""));
  }
  e.is_tensor = kind == "tensor";
  DCP_ASSIGN_OR_RETURN(e.begin, Count(json, "begin", at));
  DCP_ASSIGN_OR_RETURN(e.length, Count(json, "length", at));
  if (e.begin % kMegaAlignment != 0) {
    return absl::DataLossError(absl::StrCat(
        at, " begins at ", e.begin, ", not a multiple of ", kMegaAlignment));
  }
  if (e.is_tensor) {
    if (!json.contains("dtype") || !json["dtype"].is_string()) {
      return absl::DataLossError(absl::StrCat(at, " has no \"dtype\""));
    }
    absl::StatusOr<DType> dtype =
        DTypeFromName(json["dtype"].get<std::string>());
    if (!dtype.ok()) {
      return absl::DataLossError(absl::StrCat(
          at, " has the unknown dtype ", DescribeJsonValue(json["dtype"])));
    }
    e.dtype = *dtype;
    DCP_ASSIGN_OR_RETURN(e.shape, Dims(json, "shape", at));
    DCP_ASSIGN_OR_RETURN(e.offsets, Dims(json, "offsets", at));
    DCP_ASSIGN_OR_RETURN(e.sizes, Dims(json, "sizes", at));
    if (e.offsets.size() != e.shape.size() ||
        e.sizes.size() != e.shape.size()) {
      return absl::DataLossError(
          absl::StrCat(at, " has shape, offsets and sizes of different ranks"));
    }
    // The whole tensor's bytes must fit int64 too, not only this chunk's
    // (an empty chunk of a [2^32, 2^32] tensor has none).
    if (!CheckedNumBytes(e.dtype, e.shape).has_value()) {
      return absl::DataLossError(absl::StrCat(
          at, ": a ", DTypeName(e.dtype), " tensor of shape ",
          ShapeToString(e.shape), " has a byte size that overflows"));
    }
    unsigned __int128 bytes = ElementSize(e.dtype);
    for (size_t d = 0; d < e.shape.size(); ++d) {
      if (e.offsets[d] + e.sizes[d] > e.shape[d]) {
        return absl::DataLossError(absl::StrCat(
            at, ": the chunk at ", ShapeToString(e.offsets), " of sizes ",
            ShapeToString(e.sizes), " lies outside the tensor's shape ",
            ShapeToString(e.shape)));
      }
      bytes *= static_cast<uint64_t>(e.sizes[d]);
      if (bytes >= static_cast<unsigned __int128>(kMaxNumber))
        bytes = kMaxNumber;
    }
    if (bytes != static_cast<unsigned __int128>(e.length)) {
      return absl::DataLossError(
          absl::StrCat(at, " has length ", e.length, ", but a ",
                       DTypeName(e.dtype), " ", ShapeToString(e.sizes),
                       " chunk has ", static_cast<int64_t>(bytes), " bytes"));
    }
    if (json.contains("requires_grad")) {
      if (!json["requires_grad"].is_boolean()) {
        return absl::DataLossError(
            absl::StrCat(at, " has a non-boolean \"requires_grad\""));
      }
      e.requires_grad = json["requires_grad"].get<bool>();
    }
  }
  const int64_t blocks = (e.length + block - 1) / block;
  if (!json.contains("checksums") || !json["checksums"].is_array() ||
      static_cast<int64_t>(json["checksums"].size()) != blocks) {
    return absl::DataLossError(absl::StrCat(
        at, " needs ", blocks, " checksums (one per ", block, "-byte block)"));
  }
  for (const Json& sum : json["checksums"]) {
    uint64_t value = 0;
    if (!sum.is_string() || sum.get<std::string>().size() != 16 ||
        !absl::SimpleHexAtoi(sum.get<std::string>(), &value)) {
      return absl::DataLossError(absl::StrCat(at, " has the checksum ",
                                              DescribeJsonValue(sum),
                                              ", not 16 hex digits"));
    }
    e.checksums.push_back(value);
  }
  return e;
}

}  // namespace

std::string MegaFileName(int index, int count) {
  if (count == 1) return kMegaSingleFileName;
  return absl::StrFormat("model-%05d-of-%05d.mega", index, count);
}

bool IsMegaCheckpointFileName(absl::string_view name) {
  if (name == kMegaSingleFileName || name == kMegaIndexFileName) return true;
  if (!absl::ConsumePrefix(&name, "model-") ||
      !absl::ConsumeSuffix(&name, ".mega")) {
    return false;
  }
  std::vector<absl::string_view> parts = absl::StrSplit(name, "-of-");
  const auto digits = [](absl::string_view s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
      return c >= '0' && c <= '9';
    });
  };
  return parts.size() == 2 && digits(parts[0]) && digits(parts[1]);
}

absl::Status LayOutMegaFile(MegaHeader& header) {
  const int64_t block = header.checksum_block_size;
  if (block < kMegaAlignment || block > kMegaMaxChecksumBlock ||
      block % kMegaAlignment != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MEGA checksum block size ", block,
                     " is not a multiple of ", kMegaAlignment, " in [",
                     kMegaAlignment, ", ", kMegaMaxChecksumBlock, "]"));
  }
  for (const MegaEntry& e : header.entries) {
    if (!IsValidUtf8(e.name)) {
      return absl::InvalidArgumentError(absl::StrCat("the MEGA entry name \"",
                                                     absl::CHexEscape(e.name),
                                                     "\" is not valid UTF-8"));
    }
  }
  int64_t next = 0;
  for (MegaEntry& e : header.entries) {
    e.begin = next;
    next = AlignUp(e.begin + e.length);
  }
  const int64_t header_bytes =
      static_cast<int64_t>(JsonText(header, /*with_checksums=*/false).size());
  header.data_start = AlignUp(kMegaPreambleBytes + header_bytes);
  header.file_size = header.data_start;
  if (!header.entries.empty()) {
    const MegaEntry& last = header.entries.back();
    header.file_size += last.begin + last.length;
  }
  return absl::OkStatus();
}

std::string EncodeMegaHeader(const MegaHeader& header) {
  const std::string json = JsonText(header, /*with_checksums=*/true);
  std::string out(static_cast<size_t>(std::max<int64_t>(
                      header.data_start, kMegaPreambleBytes + json.size())),
                  '\0');
  std::memcpy(out.data(), kMegaMagic, kMegaMagicBytes);
  PutLe(out, 8, kMegaMajorVersion, 2);
  PutLe(out, 10, static_cast<uint64_t>(header.minor_version), 2);
  PutLe(out, 12, 0, 4);  // Flags: none defined.
  PutLe(out, 16, json.size(), 8);
  PutLe(out, 24, Checksum(json.data(), json.size()), 8);
  std::memcpy(out.data() + kMegaPreambleBytes, json.data(), json.size());
  return out;
}

absl::StatusOr<MegaHeader> DecodeMegaHeader(absl::string_view prefix,
                                            int64_t file_size,
                                            const std::string& path,
                                            int64_t* needed) {
  if (file_size < kMegaPreambleBytes ||
      static_cast<int64_t>(prefix.size()) < kMegaPreambleBytes) {
    return absl::DataLossError(absl::StrCat(
        path, " is ", file_size, " bytes, shorter than a MEGA preamble (",
        kMegaPreambleBytes, "): truncated or not a MEGA file"));
  }
  if (std::memcmp(prefix.data(), kMegaMagic, kMegaMagicBytes) != 0) {
    return absl::DataLossError(
        absl::StrCat(path, " does not start with the MEGA magic"));
  }
  const uint64_t major = GetLe(prefix, 8, 2);
  if (major != kMegaMajorVersion) {
    return absl::UnimplementedError(absl::StrCat(
        path, " is MEGA format version ", major, ".", GetLe(prefix, 10, 2),
        "; this build reads ", kMegaMajorVersion, ".x"));
  }
  const uint64_t length = GetLe(prefix, 16, 8);
  if (length > static_cast<uint64_t>(kMegaMaxHeaderBytes) ||
      kMegaPreambleBytes + static_cast<int64_t>(length) > file_size) {
    return absl::DataLossError(absl::StrCat(
        path, ": the header length ", length, " exceeds ",
        file_size < kMegaMaxHeaderBytes ? "the file (" : "the limit (",
        std::min(file_size, kMegaMaxHeaderBytes), " bytes)"));
  }
  const int64_t end = kMegaPreambleBytes + static_cast<int64_t>(length);
  if (static_cast<int64_t>(prefix.size()) < end) {
    if (needed != nullptr) *needed = end;
    return absl::OutOfRangeError(
        absl::StrCat(path, ": ", end, " header bytes needed"));
  }
  const absl::string_view text = prefix.substr(kMegaPreambleBytes, length);
  if (Checksum(text.data(), text.size()) != GetLe(prefix, 24, 8)) {
    return absl::DataLossError(absl::StrCat(
        path, ": the header does not match its checksum (corrupted)"));
  }
  DCP_ASSIGN_OR_RETURN(
      Json json, ParseUntrustedJson(text, absl::StrCat(path, ": the header")));
  DCP_RETURN_IF_ERROR(CheckVersion(json, path));
  MegaHeader header;
  header.minor_version = json["version"][1].is_number_unsigned()
                             ? static_cast<int>(std::min<uint64_t>(
                                   json["version"][1].get<uint64_t>(), 65535))
                             : 0;
  if (!json.contains("checksum") || !json["checksum"].is_object() ||
      !json["checksum"].contains("algorithm") ||
      json["checksum"]["algorithm"] != "xxh3-64") {
    return absl::DataLossError(
        absl::StrCat(path, " names no \"xxh3-64\" checksum algorithm"));
  }
  DCP_ASSIGN_OR_RETURN(header.checksum_block_size,
                       Count(json["checksum"], "block_size", path));
  if (header.checksum_block_size < kMegaAlignment ||
      header.checksum_block_size > kMegaMaxChecksumBlock ||
      header.checksum_block_size % kMegaAlignment != 0) {
    return absl::DataLossError(absl::StrCat(path, ": checksum block size ",
                                            header.checksum_block_size,
                                            " is out of range"));
  }
  DCP_ASSIGN_OR_RETURN(const int64_t data_bytes,
                       Count(json, "data_bytes", path));
  header.data_start = AlignUp(end);
  header.file_size = header.data_start + data_bytes;
  if (header.file_size != file_size) {
    return absl::DataLossError(absl::StrCat(
        path, " is ", file_size, " bytes, its header says ", header.file_size,
        file_size < header.file_size ? " (truncated)" : ""));
  }
  if (!json.contains("entries") || !json["entries"].is_array()) {
    return absl::DataLossError(absl::StrCat(path, " has no \"entries\""));
  }
  for (size_t i = 0; i < json["entries"].size(); ++i) {
    DCP_ASSIGN_OR_RETURN(
        MegaEntry e, DecodeEntry(json["entries"][i], header.checksum_block_size,
                                 absl::StrCat(path, ": entry ", i)));
    header.entries.push_back(std::move(e));
  }
  // Entries lie inside the data section, one after another; an empty one
  // (at the offset of the entry after it) overlaps nothing.
  std::vector<const MegaEntry*> order;
  for (const MegaEntry& e : header.entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return std::tie(a->begin, a->length) < std::tie(b->begin, b->length);
  });
  int64_t free_from = 0;
  for (const MegaEntry* e : order) {
    if ((e->length > 0 && e->begin < free_from) ||
        e->begin + e->length > data_bytes) {
      return absl::DataLossError(absl::StrCat(
          path, ": the bytes of \"", e->name, "\" [", e->begin, ", ",
          e->begin + e->length, ") overlap another entry or lie outside the ",
          data_bytes, "-byte data section"));
    }
    if (e->length > 0) free_from = e->begin + e->length;
  }
  return header;
}

absl::StatusOr<MegaHeader> ReadMegaHeader(File& file, const std::string& path) {
  DCP_ASSIGN_OR_RETURN(const int64_t size, file.Size());
  std::string prefix(static_cast<size_t>(std::min<int64_t>(size, 64 << 10)),
                     '\0');
  for (int attempt = 0; attempt < 2; ++attempt) {
    DCP_ASSIGN_OR_RETURN(
        size_t got, file.PRead(0, {reinterpret_cast<std::byte*>(prefix.data()),
                                   prefix.size()}));
    prefix.resize(got);
    int64_t needed = 0;
    absl::StatusOr<MegaHeader> header =
        DecodeMegaHeader(prefix, size, path, &needed);
    if (!absl::IsOutOfRange(header.status()) || attempt == 1) return header;
    prefix.assign(static_cast<size_t>(needed), '\0');
  }
  return absl::InternalError("unreachable");
}

std::string EncodeMegaIndex(const MegaIndex& index) {
  Json json = {
      {"format", "mega"},
      {"version", {kMegaMajorVersion, kMegaMinorVersion}},
      {"metadata", {{"total_size", index.total_size}}},
      {"files", index.files},
      {"weight_map", index.weight_map},
  };
  return json.dump(2) + "\n";
}

absl::StatusOr<MegaIndex> DecodeMegaIndex(absl::string_view text,
                                          const std::string& path) {
  DCP_ASSIGN_OR_RETURN(
      Json json, ParseUntrustedJson(text, absl::StrCat(path, ": the index")));
  DCP_RETURN_IF_ERROR(CheckVersion(json, path));
  MegaIndex index;
  if (json.contains("metadata") && json["metadata"].is_object() &&
      json["metadata"].contains("total_size")) {
    DCP_ASSIGN_OR_RETURN(index.total_size,
                         Count(json["metadata"], "total_size", path));
  }
  if (!json.contains("files") || !json["files"].is_array() ||
      !json.contains("weight_map") || !json["weight_map"].is_object()) {
    return absl::DataLossError(absl::StrCat(
        path, " has no \"files\" array and \"weight_map\" object"));
  }
  std::set<std::string> listed;
  for (const Json& file : json["files"]) {
    if (!file.is_string() || file.get<std::string>() == kMegaIndexFileName ||
        !IsMegaCheckpointFileName(file.get<std::string>())) {
      return absl::DataLossError(absl::StrCat(path, " lists ",
                                              DescribeJsonValue(file),
                                              ", not a MEGA shard file name"));
    }
    // Read twice, a file's entries would be two copies of each chunk.
    if (!listed.insert(file.get<std::string>()).second) {
      return absl::DataLossError(absl::StrCat(
          path, " lists ", file.get<std::string>(), " more than once"));
    }
    index.files.push_back(file.get<std::string>());
  }
  for (const auto& [name, files] : json["weight_map"].items()) {
    std::vector<std::string>& out = index.weight_map[name];
    if (!files.is_array() || files.empty()) {
      return absl::DataLossError(absl::StrCat(
          path, " maps \"", name, "\" to ", DescribeJsonValue(files),
          ", not a non-empty array of file names"));
    }
    for (const Json& file : files) {
      if (!file.is_string() || !listed.contains(file.get<std::string>())) {
        return absl::DataLossError(absl::StrCat(
            path, " maps \"", name, "\" to ", DescribeJsonValue(file),
            ", which its \"files\" do not list"));
      }
      out.push_back(file.get<std::string>());
    }
  }
  return index;
}

}  // namespace dcp
