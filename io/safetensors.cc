#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <limits>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "io/internal/untrusted_json.h"
#include "nlohmann/json.hpp"

namespace dcp {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

// Dtype names of the format that dcp has no DType for.
constexpr absl::string_view kForeignDTypes[] = {
    "F4",
    "F6_E2M3",
    "F6_E3M2",
};

absl::Status Broken(absl::string_view file, absl::string_view rule) {
  return absl::DataLossError(
      absl::StrCat(file, " is not a valid safetensors file: ", rule));
}

uint64_t LoadLittleEndian64(const char* p) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) {
    value = (value << 8) | static_cast<unsigned char>(p[i]);
  }
  return value;
}

void StoreLittleEndian64(uint64_t value, char* p) {
  for (int i = 0; i < 8; ++i)
    p[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

// Parses the header: valid JSON, nested at most kMaxUntrustedJsonDepth
// levels, no key twice in one object (the reference's serde maps reject
// them; nlohmann would keep the last one silently).
absl::StatusOr<Json> ParseJsonNoDuplicates(absl::string_view json,
                                           absl::string_view file) {
  absl::StatusOr<Json> parsed =
      internal_io::ParseUntrustedJson(json, "the header");
  if (!parsed.ok()) return Broken(file, parsed.status().message());
  return parsed;
}

// A non-negative integer that fits int64 (the reference's usize, bounded
// by what dcp's shapes and offsets hold).
std::optional<int64_t> AsIndex(const Json& value) {
  if (!value.is_number_unsigned()) return std::nullopt;
  const uint64_t v = value.get<uint64_t>();
  if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return std::nullopt;
  }
  return static_cast<int64_t>(v);
}

absl::StatusOr<SafetensorsTensor> ParseTensor(const std::string& name,
                                              const Json& info,
                                              absl::string_view file) {
  const std::string what = absl::StrCat("tensor \"", name, "\"");
  if (!info.is_object()) {
    return Broken(file, absl::StrCat(what, " is not a JSON object"));
  }
  if (absl::StrContains(name, '\0')) {
    return Broken(file, absl::StrCat("tensor \"", absl::CHexEscape(name),
                                     "\" has a name holding a NUL byte"));
  }
  SafetensorsTensor tensor;
  tensor.name = name;
  auto dtype = info.find("dtype");
  if (dtype == info.end() || !dtype->is_string()) {
    return Broken(file, absl::StrCat(what, " has no string \"dtype\""));
  }
  const std::string dtype_name = dtype->get<std::string>();
  absl::StatusOr<DType> parsed = DTypeFromName(dtype_name);
  if (parsed.ok() && !InSafetensors(*parsed)) {  // dcp's own names
    parsed = absl::InvalidArgumentError(dtype_name);
  }
  if (!parsed.ok()) {
    if (std::find(std::begin(kForeignDTypes), std::end(kForeignDTypes),
                  dtype_name) != std::end(kForeignDTypes)) {
      return absl::UnimplementedError(
          absl::StrCat(file, ": ", what, " has dtype ", dtype_name,
                       ", which dcp does not support"));
    }
    return Broken(file, absl::StrCat(what, " has the unknown dtype \"",
                                     dtype_name, "\""));
  }
  tensor.dtype = *parsed;
  auto shape = info.find("shape");
  if (shape == info.end() || !shape->is_array()) {
    return Broken(file, absl::StrCat(what, " has no \"shape\" array"));
  }
  if (shape->size() > static_cast<size_t>(kMaxTensorDims)) {
    return Broken(file,
                  absl::StrCat(what, " has ", shape->size(),
                               " dimensions (at most ", kMaxTensorDims, ")"));
  }
  tensor.shape.reserve(shape->size());
  for (const Json& dim : *shape) {
    std::optional<int64_t> size = AsIndex(dim);
    if (!size.has_value()) {
      return Broken(file, absl::StrCat(what, " has ", DescribeJsonValue(dim),
                                       " as dimension ", tensor.shape.size(),
                                       " of its shape: sizes are integers in "
                                       "[0, 2^63)"));
    }
    tensor.shape.push_back(*size);
  }
  auto offsets = info.find("data_offsets");
  if (offsets == info.end() || !offsets->is_array() || offsets->size() != 2) {
    return Broken(file, absl::StrCat(what,
                                     " has no \"data_offsets\" pair [begin, "
                                     "end]"));
  }
  std::optional<int64_t> begin = AsIndex((*offsets)[0]);
  std::optional<int64_t> end = AsIndex((*offsets)[1]);
  if (!begin.has_value() || !end.has_value()) {
    return Broken(file, absl::StrCat(what, " has the data_offsets ",
                                     DescribeJsonValue(*offsets),
                                     ": offsets are integers in [0, 2^63)"));
  }
  tensor.begin = *begin;
  tensor.end = *end;
  // Both offsets are integers now: messages print them, not the JSON.
  const std::string span =
      absl::StrCat("[", tensor.begin, ",", tensor.end, "]");
  if (tensor.end < tensor.begin) {
    return Broken(file, absl::StrCat(what, " has data_offsets ", span,
                                     " that end before they begin"));
  }
  std::optional<int64_t> bytes = CheckedNumBytes(tensor.dtype, tensor.shape);
  if (!bytes.has_value()) {
    return Broken(file,
                  absl::StrCat(what, " of shape ", ShapeToString(tensor.shape),
                               " and dtype ", dtype_name,
                               " has a byte size that overflows"));
  }
  if (*bytes != tensor.end - tensor.begin) {
    return Broken(file,
                  absl::StrCat(what, " of shape ", ShapeToString(tensor.shape),
                               " and dtype ", dtype_name, " needs ", *bytes,
                               " bytes but its data_offsets ", span, " span ",
                               tensor.end - tensor.begin));
  }
  return tensor;
}

absl::Status ParseMetadata(const Json& value, absl::string_view file,
                           std::map<std::string, std::string>& out) {
  if (value.is_null()) return absl::OkStatus();  // The reference allows it.
  if (!value.is_object()) {
    return Broken(file, "\"__metadata__\" is not a JSON object");
  }
  for (const auto& [key, entry] : value.items()) {
    if (!entry.is_string()) {
      return Broken(file, absl::StrCat("\"__metadata__\" entry \"", key,
                                       "\" is not a string"));
    }
    out.emplace(key, entry.get<std::string>());
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(
    absl::string_view json, int64_t data_length, absl::string_view file) {
  if (static_cast<int64_t>(json.size()) > kSafetensorsMaxHeaderBytes) {
    return Broken(file, absl::StrCat("the header is ", json.size(),
                                     " bytes, more than the format's limit "
                                     "of ",
                                     kSafetensorsMaxHeaderBytes));
  }
  if (data_length < 0) {
    return Broken(file, "the file is shorter than its header");
  }
  if (!IsValidUtf8(json)) {
    return Broken(file, "the header is not valid UTF-8");
  }
  if (json.empty() || json.front() != '{') {
    return Broken(file, "the header does not start with '{'");
  }
  DCP_ASSIGN_OR_RETURN(Json parsed, ParseJsonNoDuplicates(json, file));
  if (!parsed.is_object()) {
    return Broken(file, "the header is not a JSON object");
  }
  SafetensorsHeader header;
  header.header_length = static_cast<int64_t>(json.size());
  header.data_length = data_length;
  header.tensors.reserve(parsed.size());
  for (const auto& [key, value] : parsed.items()) {
    if (key == kSafetensorsMetadataKey) {
      DCP_RETURN_IF_ERROR(ParseMetadata(value, file, header.metadata));
      continue;
    }
    DCP_ASSIGN_OR_RETURN(SafetensorsTensor tensor,
                         ParseTensor(key, value, file));
    header.tensors.push_back(std::move(tensor));
  }
  // The reference's validate(): sorted by offsets, each tensor starts where
  // the previous one ended, and the last ends where the data does.
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
              return std::tie(a.begin, a.end, a.name) <
                     std::tie(b.begin, b.end, b.name);
            });
  int64_t at = 0;
  for (const SafetensorsTensor& tensor : header.tensors) {
    if (tensor.begin > at) {
      return Broken(file, absl::StrCat("bytes [", at, ", ", tensor.begin,
                                       ") of the data belong to no tensor (a "
                                       "gap before \"",
                                       tensor.name, "\")"));
    }
    if (tensor.begin < at) {
      return Broken(file,
                    absl::StrCat("tensor \"", tensor.name,
                                 "\" starts at data offset ", tensor.begin,
                                 ", inside the tensor before it, which "
                                 "ends at ",
                                 at, " (overlapping tensors)"));
    }
    at = tensor.end;
  }
  if (at < data_length) {
    return Broken(file, absl::StrCat("the file has ", data_length - at,
                                     " bytes after the last tensor's data "
                                     "(the tensors end at data offset ",
                                     at, ", the file at ", data_length, ")"));
  }
  if (at > data_length) {
    return Broken(file,
                  absl::StrCat("the file is truncated: the tensors need ", at,
                               " bytes of data, the file holds ", data_length));
  }
  return header;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensors(absl::string_view bytes,
                                                   absl::string_view file) {
  if (bytes.size() < 8) {
    return Broken(file, absl::StrCat("the file is ", bytes.size(),
                                     " bytes, too small for the 8-byte header "
                                     "length"));
  }
  const uint64_t n = LoadLittleEndian64(bytes.data());
  if (n > static_cast<uint64_t>(kSafetensorsMaxHeaderBytes)) {
    return Broken(file, absl::StrCat("the header length is ", n,
                                     ", more than the format's limit of ",
                                     kSafetensorsMaxHeaderBytes));
  }
  if (n > bytes.size() - 8) {
    return Broken(file, absl::StrCat("the header length is ", n,
                                     " but the file has only ",
                                     bytes.size() - 8, " bytes after it"));
  }
  return ParseSafetensorsHeader(
      bytes.substr(8, n), static_cast<int64_t>(bytes.size() - 8 - n), file);
}

absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(File& file) {
  const std::string& path = file.path();
  DCP_ASSIGN_OR_RETURN(int64_t size, file.Size());
  char prefix[8];
  DCP_ASSIGN_OR_RETURN(
      size_t got,
      file.PRead(0, {reinterpret_cast<std::byte*>(prefix), sizeof(prefix)}));
  if (size < 8 || got < 8) {
    return Broken(path,
                  absl::StrCat("the file is ", std::min<int64_t>(size, got),
                               " bytes, too small for the 8-byte header "
                               "length"));
  }
  const uint64_t n = LoadLittleEndian64(prefix);
  if (n > static_cast<uint64_t>(kSafetensorsMaxHeaderBytes)) {
    return Broken(path, absl::StrCat("the header length is ", n,
                                     ", more than the format's limit of ",
                                     kSafetensorsMaxHeaderBytes));
  }
  if (static_cast<int64_t>(n) > size - 8) {
    return Broken(path, absl::StrCat("the header length is ", n,
                                     " but the file has only ", size - 8,
                                     " bytes after it"));
  }
  std::string json(n, '\0');
  DCP_ASSIGN_OR_RETURN(
      got, file.PRead(8, {reinterpret_cast<std::byte*>(json.data()), n}));
  if (got != n) {
    return Broken(path, absl::StrCat("the file ends inside its header (", got,
                                     " of ", n, " bytes read)"));
  }
  return ParseSafetensorsHeader(json, size - 8 - static_cast<int64_t>(n), path);
}

void SortForSafetensors(std::vector<SafetensorsTensor>& tensors,
                        int64_t block) {
  auto odd = [block](const SafetensorsTensor& t) {
    if (block <= 0) return false;
    std::optional<int64_t> bytes = CheckedNumBytes(t.dtype, t.shape);
    return !bytes.has_value() || *bytes % block != 0;
  };
  std::sort(tensors.begin(), tensors.end(),
            [&](const SafetensorsTensor& a, const SafetensorsTensor& b) {
              const bool oa = odd(a), ob = odd(b);
              if (oa != ob) return ob;
              const size_t sa = ElementSize(a.dtype), sb = ElementSize(b.dtype);
              if (sa != sb) return sa > sb;
              return a.name < b.name;
            });
}

absl::StatusOr<std::string> EncodeSafetensorsHeader(
    std::vector<SafetensorsTensor>& tensors,
    const std::map<std::string, std::string>& metadata, int64_t alignment) {
  if (alignment <= 0 || alignment % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "safetensors data alignment ", alignment, " is not a multiple of 8"));
  }
  OrderedJson header = OrderedJson::object();
  if (!metadata.empty()) {
    OrderedJson map = OrderedJson::object();
    for (const auto& [key, value] : metadata) {
      if (!IsValidUtf8(key) || !IsValidUtf8(value)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "safetensors metadata entry \"", key, "\" is not valid UTF-8"));
      }
      map[key] = value;
    }
    header[kSafetensorsMetadataKey] = std::move(map);
  }
  std::set<absl::string_view> names;
  int64_t at = 0;
  for (SafetensorsTensor& tensor : tensors) {
    const std::string what = absl::StrCat("tensor \"", tensor.name, "\"");
    if (tensor.name.empty() || tensor.name == kSafetensorsMetadataKey ||
        !IsValidUtf8(tensor.name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what,
          " cannot be stored in a safetensors file: names are non-empty "
          "UTF-8 strings other than \"__metadata__\""));
    }
    if (!names.insert(tensor.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " appears twice in one safetensors file"));
    }
    if (!InSafetensors(tensor.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " has dtype ", DTypeName(tensor.dtype),
                       ", which the safetensors format lacks"));
    }
    std::optional<int64_t> bytes = CheckedNumBytes(tensor.dtype, tensor.shape);
    if (!bytes.has_value() ||
        at > std::numeric_limits<int64_t>::max() - *bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " of shape ", ShapeToString(tensor.shape),
                       " has no valid byte size"));
    }
    tensor.begin = at;
    tensor.end = at + *bytes;
    at = tensor.end;
    header[tensor.name] = {{"dtype", std::string(DTypeName(tensor.dtype))},
                           {"shape", tensor.shape},
                           {"data_offsets", {tensor.begin, tensor.end}}};
  }
  const std::string json = header.dump();
  const int64_t padded =
      (8 + static_cast<int64_t>(json.size()) + alignment - 1) / alignment *
          alignment -
      8;
  if (padded > kSafetensorsMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the safetensors header of ", tensors.size(), " tensors is ", padded,
        " bytes, more than the format's limit of ", kSafetensorsMaxHeaderBytes,
        "; spread the tensors over more files"));
  }
  std::string out(8 + padded, ' ');
  StoreLittleEndian64(static_cast<uint64_t>(padded), out.data());
  std::memcpy(out.data() + 8, json.data(), json.size());
  return out;
}

}  // namespace dcp
