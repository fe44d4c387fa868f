#include "io/internal/hf_internal.h"

#include <algorithm>
#include <climits>
#include <limits>
#include <optional>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/box_copy.h"
#include "core/status.h"
#include "io/hf_storage.h"
#include "io/safetensors.h"
#include "nlohmann/json.hpp"
#include "planner/chunk_geometry.h"

namespace dcp::internal_hf {
namespace {

using Json = nlohmann::json;

// One tensor entry of one file, as the headers describe it.
struct Found {
  DType dtype = DType::kF32;
  Shape sizes;
  Shape offsets;
  bool sharded = false;  // Its offsets came from DCP_SHARDING_INFO.
  size_t source = 0;
  int64_t offset = 0;  // In the file.
  int64_t length = 0;
};

// The file's DCP_SHARDING_INFO: tensor -> saved offsets, validated
// against the header's shapes. Empty without one.
absl::StatusOr<std::map<std::string, Shape>> ShardingInfo(
    const SafetensorsHeader& header, const std::string& path) {
  std::map<std::string, Shape> result;
  auto it = header.metadata.find(kHfShardingInfoKey);
  if (it == header.metadata.end()) return result;
  const auto bad = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(path, ": __metadata__[\"",
                                            kHfShardingInfoKey, "\"] ", why));
  };
  DCP_ASSIGN_OR_RETURN(
      Json json,
      ParseUntrustedJson(it->second, absl::StrCat(path, ": __metadata__[\"",
                                                  kHfShardingInfoKey, "\"]")));
  if (!json.is_object()) return bad("is not a JSON object");
  std::map<std::string, const SafetensorsTensor*> tensors;
  for (const SafetensorsTensor& t : header.tensors) tensors[t.name] = &t;
  for (const auto& [fqn, entry] : json.items()) {
    auto tensor = tensors.find(fqn);
    if (tensor == tensors.end()) {
      return bad(absl::StrCat("names \"", fqn, "\", which the file lacks"));
    }
    const Shape& sizes = tensor->second->shape;
    if (!entry.is_object() || !entry.contains(kHfSavedOffsetsKey) ||
        !entry[kHfSavedOffsetsKey].is_array() ||
        entry[kHfSavedOffsetsKey].size() != sizes.size()) {
      return bad(absl::StrCat("has no ", sizes.size(), " saved_offsets for \"",
                              fqn, "\""));
    }
    Shape offsets;
    for (size_t d = 0; d < sizes.size(); ++d) {
      const Json& v = entry[kHfSavedOffsetsKey][d];
      if (!v.is_number_unsigned() ||
          v.get<uint64_t>() >
              static_cast<uint64_t>(std::numeric_limits<int64_t>::max() -
                                    sizes[d])) {
        return bad(absl::StrCat("gives \"", fqn, "\" the offsets ",
                                DescribeJsonValue(entry[kHfSavedOffsetsKey]),
                                ", outside [0, 2^63) with its shape ",
                                ShapeToString(sizes)));
      }
      offsets.push_back(static_cast<int64_t>(v.get<uint64_t>()));
    }
    result.emplace(fqn, std::move(offsets));
  }
  return result;
}

}  // namespace

absl::Status CheckPlainName(absl::string_view name) {
  if (name.empty() || name == "." || name == ".." || name.size() > NAME_MAX ||
      name.find('/') != absl::string_view::npos ||
      name.find('\0') != absl::string_view::npos) {
    return absl::DataLossError(absl::StrCat(
        "\"", name, "\" is not a plain file name inside the directory"));
  }
  return absl::OkStatus();
}

absl::Status CheckRelativePath(absl::string_view relative) {
  const size_t slash = relative.find('/');
  if (slash == absl::string_view::npos) return CheckPlainName(relative);
  if (relative.substr(0, slash) != kHfShardedDirName) {
    return absl::DataLossError(absl::StrCat(
        "\"", relative, "\" is neither a file of the directory nor of ",
        kHfShardedDirName, "/"));
  }
  return CheckPlainName(relative.substr(slash + 1));
}

void BoxRuns(absl::Span<const int64_t> sizes, absl::Span<const int64_t> offsets,
             absl::Span<const int64_t> lengths, int64_t max_gap,
             std::vector<std::pair<int64_t, int64_t>>& out) {
  const size_t n = sizes.size();
  for (int64_t length : lengths) {
    if (length == 0) return;
  }
  if (n == 0) {
    out.emplace_back(0, 1);
    return;
  }
  const Shape strides = ContiguousStrides(sizes);
  // The box's rows for fixed indices in dims [0, d) each lie in `span`
  // elements; climb while the gaps between them are small.
  size_t d = n - 1;
  int64_t span = lengths[d];
  while (d > 0 && (lengths[d - 1] == 1 || strides[d - 1] - span <= max_gap)) {
    span += (lengths[d - 1] - 1) * strides[d - 1];
    --d;
  }
  int64_t base = 0;
  for (size_t j = d; j < n; ++j) base += offsets[j] * strides[j];
  std::vector<int64_t> index(offsets.begin(), offsets.begin() + d);
  while (true) {
    int64_t start = base;
    for (size_t j = 0; j < d; ++j) start += index[j] * strides[j];
    out.emplace_back(start, start + span);
    size_t j = d;
    while (j > 0) {
      --j;
      if (++index[j] < offsets[j] + lengths[j]) break;
      index[j] = offsets[j];
      if (j == 0) return;
    }
    if (d == 0) return;
  }
}

std::vector<std::pair<int64_t, int64_t>> MergeAndSplit(
    std::vector<std::pair<int64_t, int64_t>> ranges, int64_t max_gap,
    int64_t piece) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<int64_t, int64_t>> merged;
  for (const auto& range : ranges) {
    if (!merged.empty() && range.first - merged.back().second <= max_gap) {
      merged.back().second = std::max(merged.back().second, range.second);
    } else {
      merged.push_back(range);
    }
  }
  piece = std::max<int64_t>(1, piece);
  std::vector<std::pair<int64_t, int64_t>> pieces;
  for (const auto& [begin, end] : merged) {
    for (int64_t e = begin; e < end; e += piece) {
      pieces.emplace_back(e, std::min(end, e + piece));
    }
  }
  return pieces;
}

absl::StatusOr<Metadata> BuildHfMetadata(
    FileSystemBase& fs, const std::vector<HfSource>& sources,
    const std::map<std::string, std::string>& weight_map) {
  std::map<std::string, std::vector<Found>> found;
  OpenOptions options;
  options.exclusive = false;
  options.no_follow = !kHfReadersFollowLinks;
  for (size_t s = 0; s < sources.size(); ++s) {
    const HfSource& source = sources[s];
    DCP_RETURN_IF_ERROR(CheckRelativePath(source.relative));
    absl::StatusOr<std::unique_ptr<File>> opened =
        fs.OpenForRead(source.path, options);
    if (absl::IsNotFound(opened.status()) && !weight_map.empty()) {
      std::vector<std::string> held;
      for (const auto& [fqn, file] : weight_map) {
        if (file == source.relative) held.push_back(fqn);
      }
      const size_t shown = std::min<size_t>(held.size(), 3);
      return absl::DataLossError(absl::StrCat(
          source.path, " is missing: ", kHfIndexFileName, " maps ", held.size(),
          held.size() == 1 ? " tensor" : " tensors", " to it (",
          absl::StrJoin(held.begin(), held.begin() + shown, ", "),
          held.size() > shown ? ", ..." : "",
          "), so the checkpoint is incomplete (a file removed, or not "
          "copied with the rest)"));
    }
    DCP_ASSIGN_OR_RETURN(std::unique_ptr<File> file, std::move(opened));
    DCP_ASSIGN_OR_RETURN(SafetensorsHeader header,
                         ReadSafetensorsHeader(*file));
    DCP_RETURN_IF_ERROR(file->Close());
    DCP_ASSIGN_OR_RETURN(auto sharding, ShardingInfo(header, source.path));
    for (const SafetensorsTensor& t : header.tensors) {
      Found f;
      f.dtype = t.dtype;
      f.sizes = t.shape;
      auto it = sharding.find(t.name);
      f.sharded = it != sharding.end();
      f.offsets = f.sharded ? it->second : Shape(t.shape.size(), 0);
      f.source = s;
      f.offset = header.data_start() + t.begin;
      f.length = t.end - t.begin;
      found[t.name].push_back(std::move(f));
    }
  }
  for (const auto& [fqn, file] : weight_map) {
    auto it = found.find(fqn);
    const std::string& mapped = file;  // clang 14 captures no bindings.
    const bool there =
        it != found.end() &&
        std::any_of(it->second.begin(), it->second.end(), [&](const Found& f) {
          return sources[f.source].relative == mapped;
        });
    if (!there) {
      return absl::DataLossError(
          absl::StrCat("the index maps \"", fqn, "\" to ", file,
                       ", whose header has no such tensor"));
    }
  }
  Metadata metadata;
  metadata.version = "safetensors";
  for (auto& entry : found) {
    // Named references, not structured bindings: lambdas below capture them.
    const std::string& fqn = entry.first;
    std::vector<Found>& chunks = entry.second;
    const Found& first = chunks.front();
    const std::string& first_file = sources[first.source].path;
    for (const Found& c : chunks) {
      const std::string& file = sources[c.source].path;
      if (chunks.size() > 1 && !c.sharded) {
        return absl::DataLossError(absl::StrCat(
            "tensor \"", fqn, "\" is in both ", first_file, " and ",
            file == first_file ? sources[chunks[1].source].path : file,
            ", and not as shards (no ", kHfShardingInfoKey, " offsets)"));
      }
      if (c.dtype != first.dtype || c.sizes.size() != first.sizes.size()) {
        return absl::DataLossError(absl::StrCat(
            "the shards of tensor \"", fqn,
            "\" disagree: ", DTypeName(first.dtype), ShapeToString(first.sizes),
            " in ", first_file, ", ", DTypeName(c.dtype),
            ShapeToString(c.sizes), " in ", file));
      }
    }
    // The global shape: the chunks' extent (offsets checked to not
    // overflow with their sizes).
    const Found first_copy = first;
    Shape global(first.sizes.size(), 0);
    for (const Found& c : chunks) {
      for (size_t d = 0; d < global.size(); ++d) {
        global[d] = std::max(global[d], c.offsets[d] + c.sizes[d]);
      }
    }
    // Chunks without elements (a rank that held none of a dimension) take
    // part in the extent only; one is kept for a tensor without elements.
    if (chunks.size() > 1) {
      std::erase_if(chunks,
                    [](const Found& c) { return NumElements(c.sizes) == 0; });
      if (chunks.empty()) chunks.push_back(first_copy);
    }
    std::optional<int64_t> volume = CheckedNumBytes(first_copy.dtype, global);
    if (!volume.has_value()) {
      return absl::DataLossError(absl::StrCat(
          "the shards of tensor \"", fqn, "\" make a tensor of shape ",
          ShapeToString(global), ", whose byte size overflows"));
    }
    // Every element in exactly one shard (the extent is the tensor, so the
    // shards lie inside it).
    std::vector<ChunkStorageMetadata> boxes;
    boxes.reserve(chunks.size());
    for (const Found& c : chunks) boxes.push_back({c.offsets, c.sizes});
    absl::Status tiled = ValidateTiling(fqn, global, boxes, [&](size_t i) {
      return absl::StrCat("at ", ShapeToString(chunks[i].offsets), " in ",
                          sources[chunks[i].source].path);
    });
    if (!tiled.ok()) {
      return absl::DataLossError(
          absl::StrCat("safetensors shards: ", tiled.message()));
    }
    TensorStorageMetadata tensor;
    tensor.properties.dtype = first_copy.dtype;
    tensor.size = global;
    for (const Found& c : chunks) {
      tensor.chunks.push_back({c.offsets, c.sizes});
      StorageInfo info;
      info.relative_path = sources[c.source].relative;
      info.offset = c.offset;
      info.length = c.length;
      metadata.storage_data.emplace(
          MetadataIndex(fqn, c.offsets,
                        static_cast<int64_t>(tensor.chunks.size() - 1)),
          std::move(info));
    }
    metadata.state_dict_metadata.emplace(fqn, std::move(tensor));
  }
  return metadata;
}

absl::Status ReadBoxFromFile(File& file, int64_t offset, int64_t length,
                             absl::Span<const int64_t> sizes,
                             size_t element_size,
                             absl::Span<const int64_t> storage_offsets,
                             absl::Span<const int64_t> lengths,
                             const TensorView& dst,
                             absl::Span<const int64_t> dst_offsets,
                             AlignedBuffer& buffer, int64_t max_gap_bytes) {
  // The box's checks, before any read.
  DCP_RETURN_IF_ERROR(CopyBoxPart(nullptr, 0, 0, sizes, storage_offsets,
                                  element_size, dst, dst_offsets, lengths));
  const int64_t es = static_cast<int64_t>(element_size);
  std::vector<std::pair<int64_t, int64_t>> runs;
  BoxRuns(sizes, storage_offsets, lengths, max_gap_bytes / es, runs);
  for (const auto& [begin, end] :
       MergeAndSplit(std::move(runs), 0, buffer.size / es)) {
    const int64_t bytes = (end - begin) * es;
    if (begin * es + bytes > length) {
      return absl::DataLossError(absl::StrCat(
          file.path(), ": a box needs bytes past the tensor's ", length));
    }
    DCP_ASSIGN_OR_RETURN(size_t got,
                         file.PRead(offset + begin * es,
                                    {buffer.data, static_cast<size_t>(bytes)}));
    if (static_cast<int64_t>(got) != bytes) {
      return absl::DataLossError(
          absl::StrCat(file.path(), " is truncated: it ends at offset ",
                       offset + begin * es + static_cast<int64_t>(got),
                       ", inside a tensor that ends at ", offset + length));
    }
    DCP_RETURN_IF_ERROR(CopyBoxPart(buffer.data, begin, end, sizes,
                                    storage_offsets, element_size, dst,
                                    dst_offsets, lengths));
  }
  return absl::OkStatus();
}

}  // namespace dcp::internal_hf
