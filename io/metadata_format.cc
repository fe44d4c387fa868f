#include "io/metadata_format.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/checksum.h"
#include "core/status.h"
#include "google/protobuf/arena.h"
#include "io/extensions.h"
#include "io/format.pb.h"
#include "planner/chunk_geometry.h"

namespace dcp {
namespace {

void PutU32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
void PutU64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= uint32_t{static_cast<uint8_t>(p[i])} << (8 * i);
  return v;
}
uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= uint64_t{static_cast<uint8_t>(p[i])} << (8 * i);
  return v;
}

// Builds a StringTable and hands out ids.
class StringTableBuilder {
 public:
  // Adds `s` without indexing it for Id() (the caller guarantees no
  // duplicates among appended strings and later Id() queries).
  uint32_t Append(absl::string_view s) {
    blob_.append(s.data(), s.size());
    lengths_.push_back(static_cast<uint32_t>(s.size()));
    return static_cast<uint32_t>(lengths_.size() - 1);
  }

  uint32_t Id(absl::string_view s) {
    auto [it, inserted] =
        ids_.try_emplace(s, static_cast<uint32_t>(lengths_.size()));
    if (inserted) {
      blob_.append(s.data(), s.size());
      lengths_.push_back(static_cast<uint32_t>(s.size()));
    }
    return it->second;
  }
  void Emit(format::StringTable* table) {
    table->set_blob(std::move(blob_));
    table->mutable_lengths()->Add(lengths_.begin(), lengths_.end());
  }

 private:
  // Keys view strings owned by the Metadata being encoded.
  absl::flat_hash_map<absl::string_view, uint32_t> ids_;
  std::string blob_;
  std::vector<uint32_t> lengths_;
};

// Name ids for the sorted streams of names in Metadata's maps. The value
// names get ids 0..n-1 in order; a query stream that is itself sorted (the
// flatten mapping, the storage data) finds them by a forward merge, without
// hashing; names that are not value names go through the string table.
class NameIds {
 public:
  NameIds(const Metadata& metadata, StringTableBuilder& table) : table_(table) {
    sorted_.reserve(metadata.state_dict_metadata.size());
    for (const auto& [fqn, value] : metadata.state_dict_metadata) {
      sorted_.push_back(fqn);
      table_.Append(fqn);
    }
  }

  // Restarts the forward merge for a new sorted stream.
  void Rewind() { pos_ = 0; }

  uint32_t Id(absl::string_view fqn) {
    while (pos_ < sorted_.size() && sorted_[pos_] < fqn) ++pos_;
    if (pos_ < sorted_.size() && sorted_[pos_] == fqn) {
      return static_cast<uint32_t>(pos_);
    }
    return table_.Id(fqn);
  }

 private:
  StringTableBuilder& table_;
  std::vector<absl::string_view> sorted_;
  size_t pos_ = 0;
};

absl::StatusOr<std::vector<absl::string_view>> ReadStringTable(
    const format::StringTable& table, absl::string_view what) {
  std::vector<absl::string_view> out;
  out.reserve(table.lengths_size());
  size_t pos = 0;
  for (uint32_t length : table.lengths()) {
    if (length > table.blob().size() - pos) {
      return absl::DataLossError(
          absl::StrCat("the ", what, " table overruns its blob"));
    }
    out.emplace_back(table.blob().data() + pos, length);
    pos += length;
  }
  return out;
}

// Reads consecutive values of a packed array with bounds checks.
template <typename T>
class Cursor {
 public:
  Cursor(const google::protobuf::RepeatedField<T>& field, const char* name)
      : field_(field), name_(name) {}

  absl::StatusOr<T> Next() {
    if (pos_ >= field_.size()) return Overrun();
    return field_.Get(pos_++);
  }
  // The next `count` values as a Shape.
  absl::StatusOr<Shape> NextShape(uint64_t count) {
    if (count > static_cast<uint64_t>(field_.size() - pos_)) return Overrun();
    Shape out(field_.begin() + pos_, field_.begin() + pos_ + count);
    pos_ += static_cast<int>(count);
    return out;
  }
  // Values not yet read.
  uint64_t remaining() const {
    return static_cast<uint64_t>(field_.size() - pos_);
  }
  absl::Status ExpectEnd() const {
    if (pos_ == field_.size()) return absl::OkStatus();
    return absl::DataLossError(
        absl::StrCat("array ", name_, " has ", field_.size() - pos_,
                     " values more than its entries use"));
  }

 private:
  absl::Status Overrun() const {
    return absl::DataLossError(
        absl::StrCat("array ", name_, " ends before its entries do"));
  }
  const google::protobuf::RepeatedField<T>& field_;
  const char* name_;
  int pos_ = 0;
};

#define DCP_CURSOR(field) Cursor cursor_##field(proto.field(), #field)

// Checks a tensor's global shape and each chunk's box against it, so that
// every element count and byte size derived from them later fits int64_t and
// every chunk lies inside the tensor.
absl::Status CheckTensorGeometry(absl::string_view fqn,
                                 const TensorStorageMetadata& tensor) {
  if (!CheckedNumBytes(tensor.properties.dtype, tensor.size).has_value()) {
    return absl::DataLossError(absl::StrCat(
        "tensor ", fqn, " has shape ", ShapeToString(tensor.size),
        ", which has a negative size or more bytes than int64 holds"));
  }
  const size_t rank = tensor.size.size();
  if (rank > static_cast<size_t>(kMaxTensorDims)) {
    return absl::DataLossError(absl::StrCat("tensor ", fqn, " has ", rank,
                                            " dimensions (at most ",
                                            kMaxTensorDims, ")"));
  }
  for (size_t c = 0; c < tensor.chunks.size(); ++c) {
    const ChunkStorageMetadata& chunk = tensor.chunks[c];
    for (size_t d = 0; d < rank; ++d) {
      // offsets[d] + sizes[d] <= size[d] without the sum overflowing.
      if (chunk.offsets[d] < 0 || chunk.sizes[d] < 0 ||
          chunk.sizes[d] > tensor.size[d] ||
          chunk.offsets[d] > tensor.size[d] - chunk.sizes[d]) {
        return absl::DataLossError(absl::StrCat(
            "tensor ", fqn, " chunk ", c, " at offsets ",
            ShapeToString(chunk.offsets), " with sizes ",
            ShapeToString(chunk.sizes), " lies outside the tensor's shape ",
            ShapeToString(tensor.size)));
      }
    }
  }
  return absl::OkStatus();
}

// Checks that no two chunks of `tensor` share an element, nor offsets when
// either holds an element: a load finds a chunk's stored item by its
// offsets and takes the saved chunks to be disjoint (planner/
// chunk_geometry.h), so such a list would read one chunk's bytes as
// another's, or take values from whichever of two overlapping chunks a
// search meets first. Empty chunks at one offset (ranks holding nothing of
// an empty tensor) are allowed. Gaps are too (a rank-local save).
absl::Status CheckChunksDisjoint(absl::string_view fqn,
                                 const TensorStorageMetadata& tensor) {
  const std::vector<ChunkStorageMetadata>& chunks = tensor.chunks;
  if (chunks.size() < 2) return absl::OkStatus();
  std::vector<size_t> order(chunks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return chunks[a].offsets < chunks[b].offsets;
  });
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    bool holds = false;
    while (j < order.size() &&
           chunks[order[j]].offsets == chunks[order[i]].offsets) {
      holds = holds || ChunkVolume(chunks[order[j]]) > 0;
      ++j;
    }
    if (j - i > 1 && holds) {
      return absl::DataLossError(absl::StrCat(
          "tensor ", fqn, " lists chunks ", std::min(order[i], order[i + 1]),
          " and ", std::max(order[i], order[i + 1]), " at the same offsets ",
          ShapeToString(chunks[order[i]].offsets), " (damaged metadata?)"));
    }
    i = j;
  }
  absl::Status tiling = ValidateTiling(
      fqn, tensor.size, chunks,
      [](size_t i) { return absl::StrCat("chunk ", i); },
      /*require_full_coverage=*/false);
  if (tiling.ok()) return tiling;
  return absl::DataLossError(
      absl::StrCat(tiling.message(), " (damaged metadata?)"));
}

// Checks that every stored item belongs to a value of `metadata`: a tensor
// chunk's item to a chunk of that tensor at the same offset, holding exactly
// the chunk's bytes; a bytes item to a bytes value. Both maps are sorted by
// name, so one merge walk finds each value.
absl::Status CheckStorageAgainstValues(const Metadata& metadata) {
  auto value = metadata.state_dict_metadata.begin();
  const auto values_end = metadata.state_dict_metadata.end();
  // The chunks of the current tensor, sorted by offset, for look-ups.
  const TensorStorageMetadata* sorted_for = nullptr;
  std::vector<const ChunkStorageMetadata*> sorted;
  for (const auto& [index, info] : metadata.storage_data) {
    while (value != values_end && value->first < index.fqn) ++value;
    if (value == values_end || value->first != index.fqn) {
      return absl::DataLossError(absl::StrCat("stored item ", index.ToString(),
                                              " belongs to no value"));
    }
    const auto* tensor = std::get_if<TensorStorageMetadata>(&value->second);
    if (!index.offset.has_value()) {
      if (tensor != nullptr) {
        return absl::DataLossError(
            absl::StrCat("stored item ", index.ToString(),
                         " has no chunk offset but names a tensor"));
      }
      // Writers store only tensors through extensions; a bytes value's
      // declared raw size would have nothing to bound it.
      if (!info.extensions.empty()) {
        return absl::DataLossError(
            absl::StrCat("stored item ", index.ToString(),
                         " is a bytes value stored through extensions"));
      }
      continue;
    }
    if (tensor == nullptr) {
      return absl::DataLossError(
          absl::StrCat("stored item ", index.ToString(),
                       " has a chunk offset but names a bytes value"));
    }
    if (sorted_for != tensor) {
      sorted_for = tensor;
      sorted.clear();
      for (const ChunkStorageMetadata& chunk : tensor->chunks) {
        sorted.push_back(&chunk);
      }
      std::sort(
          sorted.begin(), sorted.end(),
          [](const ChunkStorageMetadata* a, const ChunkStorageMetadata* b) {
            return a->offsets < b->offsets;
          });
    }
    auto chunk = std::lower_bound(
        sorted.begin(), sorted.end(), *index.offset,
        [](const ChunkStorageMetadata* c, const Shape& offsets) {
          return c->offsets < offsets;
        });
    if (chunk == sorted.end() || (*chunk)->offsets != *index.offset) {
      return absl::DataLossError(absl::StrCat(
          "stored item ", index.ToString(), " is no chunk of tensor ",
          index.fqn, " (shape ", ShapeToString(tensor->size), ")"));
    }
    // The geometry is checked: the chunk's byte size fits int64_t.
    const int64_t bytes =
        *CheckedNumBytes(tensor->properties.dtype, (*chunk)->sizes);
    if (info.RawLength() != bytes) {
      return absl::DataLossError(absl::StrCat(
          "stored item ", index.ToString(), " in data file ",
          info.relative_path, " has ", info.RawLength(),
          info.extensions.empty() ? "" : " raw", " bytes; its chunk of ",
          "shape ", ShapeToString((*chunk)->sizes), " and dtype ",
          DTypeName(tensor->properties.dtype), " has ", bytes));
    }
  }
  return absl::OkStatus();
}

// Reads one item's extension record (`count` > 0 extensions) into `info`,
// whose length and checksums are decoded: the descriptors, the raw length,
// and one stored size per raw block, each in [1, the block's raw size], that
// add up to the stored length, one checksum per block.
absl::Status DecodeExtensionRecord(const format::Metadata& proto,
                                   uint32_t count, int64_t block_size,
                                   Cursor<uint32_t>& ids,
                                   Cursor<int64_t>& raw_lengths,
                                   Cursor<int64_t>& block_lengths,
                                   StorageInfo& info) {
  if (count > ids.remaining()) {
    return absl::DataLossError(
        absl::StrCat("lists ", count, " extensions, more than recorded"));
  }
  for (uint32_t e = 0; e < count; ++e) {
    DCP_ASSIGN_OR_RETURN(uint32_t id, ids.Next());
    if (id >= static_cast<uint32_t>(proto.extensions_size())) {
      return absl::DataLossError(absl::StrCat("uses extension #", id, " of ",
                                              proto.extensions_size()));
    }
    info.extensions.push_back(proto.extensions(static_cast<int>(id)));
  }
  DCP_ASSIGN_OR_RETURN(info.raw_length, raw_lengths.Next());
  if (info.raw_length < 0) {
    return absl::DataLossError(
        absl::StrCat("has raw length ", info.raw_length));
  }
  const int64_t blocks = ChecksumBlockCount(info.raw_length, block_size);
  if (static_cast<uint64_t>(blocks) > block_lengths.remaining() ||
      static_cast<int64_t>(info.block_checksums.size()) != blocks) {
    return absl::DataLossError(absl::StrCat(
        "has ", info.raw_length, " raw bytes in ", blocks, " blocks but ",
        info.block_checksums.size(), " checksums, or fewer stored sizes"));
  }
  info.block_lengths.reserve(static_cast<size_t>(blocks));
  int64_t stored = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    DCP_ASSIGN_OR_RETURN(int64_t length, block_lengths.Next());
    const int64_t raw = std::min(block_size, info.raw_length - b * block_size);
    if (length <= 0 || length > raw) {
      return absl::DataLossError(absl::StrCat(
          "block ", b, " stores ", length, " bytes for ", raw, " raw bytes"));
    }
    stored += length;  // At most raw_length: no overflow.
    info.block_lengths.push_back(length);
  }
  if (stored != info.length) {
    return absl::DataLossError(absl::StrCat("has stored blocks of ", stored,
                                            " bytes in all, but length ",
                                            info.length));
  }
  return absl::OkStatus();
}

absl::Status DecodePayload(const format::Metadata& proto, Metadata& metadata) {
  metadata.version = proto.version();
  if (metadata.version == kFormatVersion &&
      (proto.storage_extension_count_size() > 0 ||
       proto.extensions_size() > 0)) {
    return absl::DataLossError(
        absl::StrCat("version ", kFormatVersion,
                     " metadata carries extension records (only ",
                     kExtensionsFormatVersion, " may)"));
  }
  metadata.checksum_block_size = proto.checksum_block_size();
  if (metadata.checksum_block_size <= 0 ||
      metadata.checksum_block_size > kMaxChecksumBlockSize) {
    return absl::DataLossError(
        absl::StrCat("checksum_block_size ", metadata.checksum_block_size,
                     " is outside (0, ", kMaxChecksumBlockSize, "]"));
  }
  DCP_ASSIGN_OR_RETURN(std::vector<absl::string_view> names,
                       ReadStringTable(proto.names(), "names"));
  auto name = [&](uint32_t id) -> absl::StatusOr<absl::string_view> {
    if (id >= names.size()) {
      return absl::DataLossError(absl::StrCat(
          "name id ", id, " is outside the table of ", names.size()));
    }
    // Names cross the C ABI as NUL-terminated strings: one holding a NUL
    // would be read as another (shorter) name.
    if (absl::StrContains(names[id], '\0')) {
      return absl::DataLossError(absl::StrCat(
          "name \"", absl::CHexEscape(names[id]), "\" holds a NUL byte"));
    }
    return names[id];
  };

  // Values and flatten mapping on this thread, storage data on another
  // when large: they fill independent maps from the same read-only tables.
  auto decode_values = [&]() -> absl::Status {
    // Values.
    if (proto.value_kind_size() != proto.value_name_size()) {
      return absl::DataLossError("value_kind and value_name differ in length");
    }
    DCP_CURSOR(tensor_dtype);
    DCP_CURSOR(tensor_flags);
    DCP_CURSOR(tensor_rank);
    DCP_CURSOR(tensor_size);
    DCP_CURSOR(tensor_chunk_count);
    DCP_CURSOR(chunk_offsets);
    DCP_CURSOR(chunk_sizes);
    for (int i = 0; i < proto.value_name_size(); ++i) {
      DCP_ASSIGN_OR_RETURN(absl::string_view fqn, name(proto.value_name(i)));
      StorageMetadata decoded;
      if (proto.value_kind(i) == 0) {
        decoded = BytesStorageMetadata{};
      } else if (proto.value_kind(i) == 1) {
        TensorStorageMetadata tensor;
        DCP_ASSIGN_OR_RETURN(uint32_t code, cursor_tensor_dtype.Next());
        absl::StatusOr<DType> dtype = DTypeFromCode(code);
        if (!dtype.ok()) {
          return Annotate(dtype.status(), absl::StrCat("tensor ", fqn));
        }
        tensor.properties.dtype = *dtype;
        DCP_ASSIGN_OR_RETURN(uint32_t flags, cursor_tensor_flags.Next());
        tensor.properties.requires_grad = (flags & 1) != 0;
        tensor.properties.pin_memory = (flags & 2) != 0;
        DCP_ASSIGN_OR_RETURN(uint32_t rank, cursor_tensor_rank.Next());
        DCP_ASSIGN_OR_RETURN(tensor.size, cursor_tensor_size.NextShape(rank));
        DCP_ASSIGN_OR_RETURN(uint32_t chunks, cursor_tensor_chunk_count.Next());
        // Bounded before the loop: a 0-d tensor's chunks take no array
        // values, so nothing else stops a count of 2^32 - 1.
        if (rank == 0 ? chunks > 1
                      : chunks > cursor_chunk_offsets.remaining() / rank ||
                            chunks > cursor_chunk_sizes.remaining() / rank) {
          return absl::DataLossError(absl::StrCat(
              "tensor ", fqn, " of rank ", rank, " lists ", chunks,
              " chunks, more than the chunk arrays hold",
              rank == 0 ? " (a 0-d tensor is saved as one chunk)" : ""));
        }
        tensor.chunks.reserve(chunks);
        for (uint32_t c = 0; c < chunks; ++c) {
          ChunkStorageMetadata chunk;
          DCP_ASSIGN_OR_RETURN(chunk.offsets,
                               cursor_chunk_offsets.NextShape(rank));
          DCP_ASSIGN_OR_RETURN(chunk.sizes, cursor_chunk_sizes.NextShape(rank));
          tensor.chunks.push_back(std::move(chunk));
        }
        DCP_RETURN_IF_ERROR(CheckTensorGeometry(fqn, tensor));
        DCP_RETURN_IF_ERROR(CheckChunksDisjoint(fqn, tensor));
        decoded = std::move(tensor);
      } else {
        return absl::DataLossError(absl::StrCat(
            "value ", fqn, " has unknown kind ", proto.value_kind(i)));
      }
      const size_t before = metadata.state_dict_metadata.size();
      metadata.state_dict_metadata.emplace_hint(
          metadata.state_dict_metadata.end(), std::string(fqn),
          std::move(decoded));
      if (metadata.state_dict_metadata.size() == before) {
        return absl::DataLossError(
            absl::StrCat("value ", fqn, " is listed twice"));
      }
    }
    for (const absl::Status& end :
         {cursor_tensor_dtype.ExpectEnd(), cursor_tensor_flags.ExpectEnd(),
          cursor_tensor_rank.ExpectEnd(), cursor_tensor_size.ExpectEnd(),
          cursor_tensor_chunk_count.ExpectEnd(),
          cursor_chunk_offsets.ExpectEnd(), cursor_chunk_sizes.ExpectEnd()}) {
      DCP_RETURN_IF_ERROR(end);
    }

    // Flatten mapping.
    DCP_ASSIGN_OR_RETURN(std::vector<absl::string_view> keys,
                         ReadStringTable(proto.path_keys(), "path key"));
    if (proto.flatten_path_length_size() != proto.flatten_name_size()) {
      return absl::DataLossError(
          "flatten_path_length and flatten_name differ in length");
    }
    DCP_CURSOR(flatten_path);
    for (int i = 0; i < proto.flatten_name_size(); ++i) {
      DCP_ASSIGN_OR_RETURN(absl::string_view fqn, name(proto.flatten_name(i)));
      ObjectPath path;
      path.reserve(std::min<uint32_t>(proto.flatten_path_length(i), 64));
      for (uint32_t e = 0; e < proto.flatten_path_length(i); ++e) {
        DCP_ASSIGN_OR_RETURN(uint64_t element, cursor_flatten_path.Next());
        if ((element & 1) != 0) {
          path.emplace_back(static_cast<int64_t>(element >> 1));
        } else if ((element >> 1) < keys.size()) {
          path.emplace_back(std::string(keys[element >> 1]));
        } else {
          return absl::DataLossError(absl::StrCat(
              "flatten path of ", fqn, " uses unknown key id ", element >> 1));
        }
      }
      metadata.flatten_mapping.emplace_hint(metadata.flatten_mapping.end(),
                                            std::string(fqn), std::move(path));
    }
    DCP_RETURN_IF_ERROR(cursor_flatten_path.ExpectEnd());

    return absl::OkStatus();
  };
  auto decode_storage = [&]() -> absl::Status {
    // Storage.
    const int items = proto.storage_name_size();
    if (proto.storage_offset_rank_size() != items ||
        proto.storage_file_size() != items ||
        proto.storage_offset_size() != items ||
        proto.storage_length_size() != items ||
        proto.storage_checksum_count_size() != items) {
      return absl::DataLossError("the storage arrays differ in length");
    }
    for (const std::string& file : proto.files()) {
      DCP_RETURN_IF_ERROR(CheckDataFileName(file));
    }
    DCP_CURSOR(storage_chunk_offset);
    DCP_CURSOR(storage_checksums);
    // Extension records (dcp-2; DecodePayload checked the version).
    const bool has_extensions = proto.storage_extension_count_size() > 0;
    if (has_extensions && proto.storage_extension_count_size() != items) {
      return absl::DataLossError(absl::StrCat(
          "storage_extension_count has ", proto.storage_extension_count_size(),
          " entries for ", items, " stored items"));
    }
    if (!has_extensions &&
        (proto.extensions_size() > 0 || proto.storage_extension_size() > 0 ||
         proto.storage_raw_length_size() > 0 ||
         proto.storage_block_length_size() > 0)) {
      return absl::DataLossError(
          "extension records without storage_extension_count");
    }
    for (const std::string& descriptor : proto.extensions()) {
      DCP_RETURN_IF_ERROR(ParseExtensionDescriptor(descriptor).status());
    }
    DCP_CURSOR(storage_extension);
    DCP_CURSOR(storage_raw_length);
    DCP_CURSOR(storage_block_length);
    for (int i = 0; i < items; ++i) {
      DCP_ASSIGN_OR_RETURN(absl::string_view fqn, name(proto.storage_name(i)));
      MetadataIndex index{std::string(fqn)};
      if (const uint32_t rank = proto.storage_offset_rank(i); rank > 0) {
        DCP_ASSIGN_OR_RETURN(index.offset,
                             cursor_storage_chunk_offset.NextShape(rank - 1));
      }
      if (proto.storage_file(i) >= static_cast<uint32_t>(proto.files_size())) {
        return absl::DataLossError(
            absl::StrCat("item ", index.ToString(), " refers to data file #",
                         proto.storage_file(i), " of ", proto.files_size()));
      }
      StorageInfo info;
      info.relative_path = proto.files(static_cast<int>(proto.storage_file(i)));
      info.offset = proto.storage_offset(i);
      info.length = proto.storage_length(i);
      if (info.offset < 0 || info.length < 0 ||
          info.offset > INT64_MAX - info.length) {
        return absl::DataLossError(absl::StrCat(
            "item ", index.ToString(), " in data file ", info.relative_path,
            " has offset ", info.offset, " and length ", info.length,
            ": negative, or ending past the largest file offset"));
      }
      const uint32_t sums = proto.storage_checksum_count(i);
      if (sums > static_cast<uint64_t>(proto.storage_checksums_size())) {
        return absl::DataLossError("storage_checksums ends early");
      }
      info.block_checksums.reserve(sums);
      for (uint32_t c = 0; c < sums; ++c) {
        DCP_ASSIGN_OR_RETURN(uint64_t sum, cursor_storage_checksums.Next());
        info.block_checksums.push_back(sum);
      }
      if (has_extensions && proto.storage_extension_count(i) > 0) {
        DCP_RETURN_IF_ERROR(Annotate(
            DecodeExtensionRecord(
                proto, proto.storage_extension_count(i),
                metadata.checksum_block_size, cursor_storage_extension,
                cursor_storage_raw_length, cursor_storage_block_length, info),
            absl::StrCat("item ", index.ToString(), " in data file ",
                         info.relative_path)));
      }
      const size_t before = metadata.storage_data.size();
      // try_emplace leaves `index` as it is when the key is there already.
      metadata.storage_data.try_emplace(metadata.storage_data.end(),
                                        std::move(index), std::move(info));
      if (metadata.storage_data.size() == before) {
        return absl::DataLossError(absl::StrCat(
            "storage item ", index.ToString(), " is listed twice"));
      }
    }
    DCP_RETURN_IF_ERROR(cursor_storage_chunk_offset.ExpectEnd());
    DCP_RETURN_IF_ERROR(cursor_storage_checksums.ExpectEnd());
    DCP_RETURN_IF_ERROR(cursor_storage_extension.ExpectEnd());
    DCP_RETURN_IF_ERROR(cursor_storage_raw_length.ExpectEnd());
    DCP_RETURN_IF_ERROR(cursor_storage_block_length.ExpectEnd());

    return absl::OkStatus();
  };
  absl::Status storage_status;
  absl::Status values_status;
  if (proto.storage_name_size() > 100000) {
    std::thread storage_thread([&] { storage_status = decode_storage(); });
    values_status = decode_values();
    storage_thread.join();
  } else {
    values_status = decode_values();
    storage_status = decode_storage();
  }
  DCP_RETURN_IF_ERROR(values_status);
  DCP_RETURN_IF_ERROR(storage_status);
  DCP_RETURN_IF_ERROR(CheckStorageAgainstValues(metadata));

  if (proto.has_storage_meta()) {
    const format::StorageMeta& m = proto.storage_meta();
    StorageMeta meta;
    meta.checkpoint_id = m.checkpoint_id();
    meta.save_id = m.save_id();
    meta.load_id = m.load_id();
    meta.modules.assign(m.modules().begin(), m.modules().end());
    metadata.storage_meta = std::move(meta);
  }
  if (proto.has_rank_local()) {
    const format::RankLocal& r = proto.rank_local();
    if (r.world_size() <= 0 || r.rank() < 0 || r.rank() >= r.world_size()) {
      return absl::DataLossError(
          absl::StrCat("the rank-local record names rank ", r.rank(), " of ",
                       r.world_size(), " (damaged metadata?)"));
    }
    metadata.rank_local =
        RankLocalSave{r.group_save_id(), r.rank(), r.world_size()};
  }
  return absl::OkStatus();
}

#undef DCP_CURSOR

// One stored item to encode, in index order.
struct StorageEntry {
  const MetadataIndex* index;
  const StorageInfo* info;

  friend bool operator<(const StorageEntry& a, const StorageEntry& b) {
    return *a.index < *b.index;
  }
};

// Fills the extension records (and version dcp-2) when some item is stored
// through extensions; leaves `proto` untouched otherwise. kInvalidArgument
// for an item whose block sizes do not match its lengths.
absl::Status EncodeExtensionRecords(const Metadata& metadata,
                                    absl::Span<const StorageEntry> entries,
                                    format::Metadata& proto) {
  const bool any = std::any_of(
      entries.begin(), entries.end(),
      [](const StorageEntry& e) { return !e.info->extensions.empty(); });
  if (!any) return absl::OkStatus();
  if (metadata.checksum_block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("checksum_block_size ", metadata.checksum_block_size));
  }
  proto.set_version(kExtensionsFormatVersion);
  absl::flat_hash_map<absl::string_view, uint32_t> ids;
  proto.mutable_storage_extension_count()->Reserve(
      static_cast<int>(entries.size()));
  for (const StorageEntry& entry : entries) {
    const MetadataIndex& index = *entry.index;
    const StorageInfo& info = *entry.info;
    proto.add_storage_extension_count(
        static_cast<uint32_t>(info.extensions.size()));
    if (info.extensions.empty()) continue;
    for (const std::string& descriptor : info.extensions) {
      auto [it, inserted] =
          ids.try_emplace(descriptor, static_cast<uint32_t>(ids.size()));
      if (inserted) proto.add_extensions(descriptor);
      proto.add_storage_extension(it->second);
    }
    const int64_t blocks =
        ChecksumBlockCount(info.raw_length, metadata.checksum_block_size);
    int64_t stored = 0;
    for (int64_t length : info.block_lengths) stored += length;
    if (info.raw_length < 0 ||
        static_cast<int64_t>(info.block_lengths.size()) != blocks ||
        static_cast<int64_t>(info.block_checksums.size()) != blocks ||
        stored != info.length) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stored item ", index.ToString(), " has ", info.raw_length,
          " raw bytes, ", info.block_lengths.size(),
          " block sizes adding up to ", stored, " of length ", info.length,
          " and ", info.block_checksums.size(), " checksums"));
    }
    proto.add_storage_raw_length(info.raw_length);
    proto.mutable_storage_block_length()->Add(info.block_lengths.begin(),
                                              info.block_lengths.end());
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// The stored items `metadata.storage_data` holds once each of `results` is
// recorded in it with insert_or_assign, in index order, without copying.
std::vector<StorageEntry> MergedStorageEntries(
    const Metadata& metadata,
    absl::Span<const std::vector<WriteResult>> results) {
  std::vector<StorageEntry> added;
  for (const std::vector<WriteResult>& rank_results : results) {
    for (const WriteResult& result : rank_results) {
      added.push_back({&result.index, &result.storage_data});
    }
  }
  // Ranks write in name order, so one rank's results are sorted already;
  // equal indices keep their order, and the last recorded one wins.
  if (!std::is_sorted(added.begin(), added.end())) {
    std::stable_sort(added.begin(), added.end());
  }
  std::vector<StorageEntry> merged;
  merged.reserve(metadata.storage_data.size() + added.size());
  auto old = metadata.storage_data.begin();
  const auto old_end = metadata.storage_data.end();
  for (size_t i = 0; i < added.size(); ++i) {
    if (i + 1 < added.size() && !(*added[i].index < *added[i + 1].index)) {
      continue;  // A later result for the same index replaces this one.
    }
    while (old != old_end && old->first < *added[i].index) {
      merged.push_back({&old->first, &old->second});
      ++old;
    }
    if (old != old_end && old->first == *added[i].index) ++old;
    merged.push_back(added[i]);
  }
  for (; old != old_end; ++old) merged.push_back({&old->first, &old->second});
  return merged;
}

absl::StatusOr<std::string> Encode(const Metadata& metadata,
                                   absl::Span<const StorageEntry> entries) {
  google::protobuf::Arena arena;
  auto* proto =
      google::protobuf::Arena::CreateMessage<format::Metadata>(&arena);
  proto->set_version(metadata.version.empty() ? kFormatVersion
                                              : metadata.version);
  proto->set_checksum_block_size(metadata.checksum_block_size);
  StringTableBuilder table;
  NameIds names(metadata, table);

  const int values = static_cast<int>(metadata.state_dict_metadata.size());
  bool later_dtypes = false;
  proto->mutable_value_name()->Reserve(values);
  proto->mutable_value_kind()->Reserve(values);
  for (const auto& [fqn, value] : metadata.state_dict_metadata) {
    proto->add_value_name(names.Id(fqn));  // The merge finds each at once.
    const auto* tensor = std::get_if<TensorStorageMetadata>(&value);
    if (tensor == nullptr) {
      proto->add_value_kind(0);
      continue;
    }
    proto->add_value_kind(1);
    const size_t rank = tensor->size.size();
    const uint32_t dtype = static_cast<uint32_t>(tensor->properties.dtype);
    later_dtypes = later_dtypes || dtype >= kFirstLaterDTypeCode;
    proto->add_tensor_dtype(dtype);
    proto->add_tensor_flags((tensor->properties.requires_grad ? 1u : 0u) |
                            (tensor->properties.pin_memory ? 2u : 0u));
    proto->add_tensor_rank(static_cast<uint32_t>(rank));
    proto->mutable_tensor_size()->Add(tensor->size.begin(), tensor->size.end());
    proto->add_tensor_chunk_count(static_cast<uint32_t>(tensor->chunks.size()));
    for (const ChunkStorageMetadata& chunk : tensor->chunks) {
      if (chunk.offsets.size() != rank || chunk.sizes.size() != rank) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor ", fqn, " has a chunk whose rank differs from its shape ",
            ShapeToString(tensor->size)));
      }
      proto->mutable_chunk_offsets()->Add(chunk.offsets.begin(),
                                          chunk.offsets.end());
      proto->mutable_chunk_sizes()->Add(chunk.sizes.begin(), chunk.sizes.end());
    }
  }

  StringTableBuilder keys;
  names.Rewind();
  for (const auto& [fqn, path] : metadata.flatten_mapping) {
    proto->add_flatten_name(names.Id(fqn));
    proto->add_flatten_path_length(static_cast<uint32_t>(path.size()));
    for (const PathElement& element : path) {
      if (const auto* key = std::get_if<std::string>(&element)) {
        proto->add_flatten_path(uint64_t{keys.Id(*key)} << 1);
      } else {
        const int64_t index = std::get<int64_t>(element);
        if (index < 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "flatten path of ", fqn, " has negative list index ", index));
        }
        proto->add_flatten_path((static_cast<uint64_t>(index) << 1) | 1);
      }
    }
  }
  keys.Emit(proto->mutable_path_keys());

  absl::flat_hash_map<absl::string_view, uint32_t> file_ids;
  const int items = static_cast<int>(entries.size());
  proto->mutable_storage_name()->Reserve(items);
  proto->mutable_storage_offset_rank()->Reserve(items);
  proto->mutable_storage_file()->Reserve(items);
  proto->mutable_storage_offset()->Reserve(items);
  proto->mutable_storage_length()->Reserve(items);
  proto->mutable_storage_checksum_count()->Reserve(items);
  names.Rewind();
  for (const StorageEntry& entry : entries) {
    const MetadataIndex& index = *entry.index;
    const StorageInfo& info = *entry.info;
    proto->add_storage_name(names.Id(index.fqn));
    if (index.offset.has_value()) {
      proto->add_storage_offset_rank(
          static_cast<uint32_t>(index.offset->size() + 1));
      proto->mutable_storage_chunk_offset()->Add(index.offset->begin(),
                                                 index.offset->end());
    } else {
      proto->add_storage_offset_rank(0);
    }
    auto [it, inserted] = file_ids.try_emplace(
        info.relative_path, static_cast<uint32_t>(file_ids.size()));
    if (inserted) proto->add_files(info.relative_path);
    proto->add_storage_file(it->second);
    proto->add_storage_offset(info.offset);
    proto->add_storage_length(info.length);
    proto->add_storage_checksum_count(
        static_cast<uint32_t>(info.block_checksums.size()));
    proto->mutable_storage_checksums()->Add(info.block_checksums.begin(),
                                            info.block_checksums.end());
  }
  table.Emit(proto->mutable_names());
  DCP_RETURN_IF_ERROR(EncodeExtensionRecords(metadata, entries, *proto));
  if (later_dtypes) proto->set_version(kLaterDTypesFormatVersion);

  if (metadata.storage_meta.has_value()) {
    format::StorageMeta* m = proto->mutable_storage_meta();
    m->set_checkpoint_id(metadata.storage_meta->checkpoint_id);
    m->set_save_id(metadata.storage_meta->save_id);
    m->set_load_id(metadata.storage_meta->load_id);
    for (const std::string& module : metadata.storage_meta->modules) {
      m->add_modules(module);
    }
  }
  if (metadata.rank_local.has_value()) {
    format::RankLocal* r = proto->mutable_rank_local();
    r->set_group_save_id(metadata.rank_local->group_save_id);
    r->set_rank(metadata.rank_local->rank);
    r->set_world_size(metadata.rank_local->world_size);
  }

  const size_t payload_size = proto->ByteSizeLong();
  std::string out(kMetadataHeaderSize + payload_size, '\0');
  char* payload = out.data() + kMetadataHeaderSize;
  if (!proto->SerializeWithCachedSizesToArray(
          reinterpret_cast<uint8_t*>(payload))) {
    return absl::InternalError("protobuf serialization of the metadata failed");
  }
  std::memcpy(out.data(), kMetadataMagic, 8);
  PutU32(out.data() + 8, kMetadataHeaderVersion);
  PutU32(out.data() + 12, 0);
  PutU64(out.data() + 16, payload_size);
  PutU64(out.data() + 24, Checksum(payload, payload_size));
  return out;
}

}  // namespace

absl::StatusOr<std::string> EncodeMetadata(const Metadata& metadata) {
  return EncodeMetadata(metadata, {});
}

absl::StatusOr<std::string> EncodeMetadata(
    const Metadata& metadata,
    absl::Span<const std::vector<WriteResult>> results) {
  return Encode(metadata, MergedStorageEntries(metadata, results));
}

absl::Status CheckDataFileName(absl::string_view name) {
  if (name.empty() || name == "." || name == ".." || name.size() > NAME_MAX ||
      name.find('/') != absl::string_view::npos ||
      name.find('\0') != absl::string_view::npos) {
    return absl::DataLossError(absl::StrCat(
        "data file name \"", absl::CHexEscape(name),
        "\" is not a plain file name inside the checkpoint directory"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Metadata> DecodeMetadata(absl::string_view bytes,
                                        absl::string_view source) {
  if (bytes.size() < 8 || std::memcmp(bytes.data(), kMetadataMagic, 8) != 0) {
    // A Python pickle (PROTO opcode, protocol 2 to 5): the .metadata of
    // PyTorch's torch.distributed.checkpoint.
    const bool pickle = bytes.size() >= 2 &&
                        static_cast<unsigned char>(bytes[0]) == 0x80 &&
                        bytes[1] >= 2 && bytes[1] <= 5;
    return absl::DataLossError(absl::StrCat(
        source, " is not a dcp metadata file (", bytes.size(),
        " bytes, bad magic)",
        absl::EndsWith(source, ".metadata")
            ? "; the directory holds no readable dcp checkpoint"
            : "",
        pickle ? absl::StrCat(
                     ". It is a Python pickle, as torch.distributed."
                     "checkpoint writes: convert that checkpoint once with "
                     "`python -m dcp.format_utils torch_dcp_to_dcp SRC_DIR "
                     "NEW_DIR`")
               : ""));
  }
  if (bytes.size() < kMetadataHeaderSize) {
    return absl::DataLossError(absl::StrCat(
        source, " is torn: ", bytes.size(), " bytes, shorter than the ",
        kMetadataHeaderSize, "-byte header"));
  }
  const uint32_t header_version = GetU32(bytes.data() + 8);
  if (header_version != kMetadataHeaderVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(source, " has metadata header version ", header_version,
                     "; this dcp reads version ", kMetadataHeaderVersion,
                     " (use a newer dcp)"));
  }
  const uint64_t length = GetU64(bytes.data() + 16);
  const uint64_t expected = GetU64(bytes.data() + 24);
  const uint64_t actual_length = bytes.size() - kMetadataHeaderSize;
  if (length != actual_length) {
    return absl::DataLossError(
        absl::StrCat(source, " is torn: the header says ", length,
                     " payload bytes, the file holds ", actual_length));
  }
  const char* payload = bytes.data() + kMetadataHeaderSize;
  const uint64_t actual = Checksum(payload, length);
  if (actual != expected) {
    return absl::DataLossError(
        absl::StrFormat("%s is corrupt: payload checksum %016x, expected %016x",
                        source, actual, expected));
  }
  google::protobuf::Arena arena;
  auto* proto =
      google::protobuf::Arena::CreateMessage<format::Metadata>(&arena);
  if (length > static_cast<uint64_t>(INT32_MAX) ||
      !proto->ParseFromArray(payload, static_cast<int>(length))) {
    return absl::DataLossError(absl::StrCat(source,
                                            " does not parse as dcp metadata (",
                                            length, " payload bytes)"));
  }
  const std::string& version = proto->version();
  if (version.size() <= 4 || version.rfind("dcp-", 0) != 0 ||
      !std::all_of(version.begin() + 4, version.end(),
                   [](char c) { return c >= '0' && c <= '9'; })) {
    return absl::DataLossError(absl::StrCat(source, " has format version '",
                                            proto->version(), "', not dcp-N"));
  }
  if (proto->version() != kFormatVersion &&
      proto->version() != kExtensionsFormatVersion &&
      proto->version() != kLaterDTypesFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        source, " has format version ", proto->version(), "; this dcp reads ",
        kFormatVersion, ", ", kExtensionsFormatVersion, " and ",
        kLaterDTypesFormatVersion, " (use a newer dcp)"));
  }
  Metadata metadata;
  absl::Status status = DecodePayload(*proto, metadata);
  if (!status.ok()) return Annotate(status, source);
  return metadata;
}

}  // namespace dcp
