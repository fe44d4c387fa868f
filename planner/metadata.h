// The global description of a committed checkpoint (the seed's Metadata and
// its parts): for each flattened name, either a tensor (global shape, dtype,
// the chunks it was saved as) or an opaque byte value; where each stored item
// lives (file, offset, length, checksums); the flatten mapping that restores
// nesting; and who saved it. Encoded as described in docs/FORMAT.md.
#ifndef DCP_PLANNER_METADATA_H_
#define DCP_PLANNER_METADATA_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/hash/hash.h"
#include "core/dtype.h"
#include "core/state_dict.h"
#include "core/tensor.h"

namespace dcp {

// Identifies one stored item: a value by flattened name, and for tensors the
// chunk by its offset in the global tensor. `index` is a hint (the position
// of the chunk in TensorStorageMetadata::chunks) that speeds look-ups; it
// takes no part in equality or hashing.
struct MetadataIndex {
  std::string fqn;
  std::optional<Shape> offset;  // Set for tensor chunks.
  std::optional<int64_t> index;

  MetadataIndex() = default;
  explicit MetadataIndex(std::string fqn_in,
                         std::optional<Shape> offset_in = std::nullopt,
                         std::optional<int64_t> index_in = std::nullopt)
      : fqn(std::move(fqn_in)), offset(std::move(offset_in)), index(index_in) {}

  friend bool operator==(const MetadataIndex& a, const MetadataIndex& b) {
    return a.fqn == b.fqn && a.offset == b.offset;
  }
  friend bool operator!=(const MetadataIndex& a, const MetadataIndex& b) {
    return !(a == b);
  }
  friend bool operator<(const MetadataIndex& a, const MetadataIndex& b) {
    if (a.fqn != b.fqn) return a.fqn < b.fqn;
    return a.offset < b.offset;
  }
  // The system abseil (20220623) cannot hash std::optional.
  template <typename H>
  friend H AbslHashValue(H h, const MetadataIndex& m) {
    if (!m.offset.has_value()) return H::combine(std::move(h), m.fqn, false);
    return H::combine(std::move(h), m.fqn, true, *m.offset);
  }

  // "name" or "name@[0, 128]" for messages.
  std::string ToString() const;
};

// A box inside a tensor: where it starts and how large it is, per dimension.
struct ChunkStorageMetadata {
  Shape offsets;
  Shape sizes;

  friend bool operator==(const ChunkStorageMetadata& a,
                         const ChunkStorageMetadata& b) {
    return a.offsets == b.offsets && a.sizes == b.sizes;
  }
};

// The seed's TensorProperties. Only dtype changes the stored bytes; the rest
// is carried so a load can restore it.
struct TensorProperties {
  DType dtype = DType::kF32;
  bool requires_grad = false;
  bool pin_memory = false;

  friend bool operator==(const TensorProperties& a, const TensorProperties& b) {
    return a.dtype == b.dtype && a.requires_grad == b.requires_grad &&
           a.pin_memory == b.pin_memory;
  }
};

struct TensorStorageMetadata {
  TensorProperties properties;
  Shape size;  // The global shape.
  std::vector<ChunkStorageMetadata> chunks;

  friend bool operator==(const TensorStorageMetadata&,
                         const TensorStorageMetadata&) = default;
};

// A non-tensor value, stored as bytes (see docs/FORMAT.md for the encoding
// of int, float, bool, string and bytes values).
struct BytesStorageMetadata {
  friend bool operator==(const BytesStorageMetadata&,
                         const BytesStorageMetadata&) = default;
};

using StorageMetadata =
    std::variant<TensorStorageMetadata, BytesStorageMetadata>;

// Where the bytes of one stored item live, written by the storage layer and
// read back at load. Checksums are XXH3-64 of consecutive blocks of
// `Metadata::checksum_block_size` bytes of the item (the last block may be
// shorter; an empty item has no blocks).
//
// An item stored through extensions (io/extensions.h; docs/FORMAT.md,
// "Extensions") is cut into blocks of checksum_block_size raw bytes, each
// stored encoded or as is; `length` and `block_checksums` then describe the
// stored blocks, which follow each other from `offset`.
struct StorageInfo {
  std::string relative_path;  // Data file, relative to the checkpoint dir.
  int64_t offset = 0;         // Byte offset of the item in the file.
  int64_t length = 0;         // Bytes of the item in the file.
  std::vector<uint64_t> block_checksums;  // Of the stored blocks.
  // The descriptors ("name/MAJOR.MINOR") of the extensions applied to each
  // block, in order; empty for an item stored as it is.
  std::vector<std::string> extensions;
  // With extensions: the item's own (raw) bytes, and each block's stored
  // size (its raw size: stored as is; smaller: encoded).
  int64_t raw_length = 0;
  std::vector<int64_t> block_lengths;

  // The item's own bytes: raw_length with extensions, else length.
  int64_t RawLength() const { return extensions.empty() ? length : raw_length; }

  friend bool operator==(const StorageInfo& a, const StorageInfo& b) {
    return a.relative_path == b.relative_path && a.offset == b.offset &&
           a.length == b.length && a.block_checksums == b.block_checksums &&
           a.extensions == b.extensions && a.raw_length == b.raw_length &&
           a.block_lengths == b.block_lengths;
  }
};

// The seed's StorageMeta: identifies a save and the checkpoint it belongs to.
struct StorageMeta {
  std::string checkpoint_id;
  std::string save_id;
  std::string load_id;
  std::vector<std::string> modules;

  friend bool operator==(const StorageMeta&, const StorageMeta&) = default;
};

// What each rank's checkpoint of one rank-local save records
// (docs/FORMAT.md section 6): the same `group_save_id` on every rank, so a
// load tells a set of checkpoints of one save from a mix of saves (one that
// committed on some ranks only).
struct RankLocalSave {
  std::string group_save_id;
  int rank = 0;
  int world_size = 0;

  friend bool operator==(const RankLocalSave&, const RankLocalSave&) = default;
};

struct Metadata {
  // By flattened name. std::map keeps the encoding deterministic.
  std::map<std::string, StorageMetadata> state_dict_metadata;
  // The flatten mapping (the seed's planner_data for the default planner).
  std::map<std::string, ObjectPath> flatten_mapping;
  // Where each stored item lives (the seed's storage_data).
  std::map<MetadataIndex, StorageInfo> storage_data;
  std::optional<StorageMeta> storage_meta;
  // Only in the checkpoints of a rank-local save.
  std::optional<RankLocalSave> rank_local;
  std::string version;  // The format version that wrote this (FORMAT.md).
  int64_t checksum_block_size = int64_t{4} << 20;

  // Every field equal.
  friend bool operator==(const Metadata&, const Metadata&) = default;
};

// The format version this build writes.
inline constexpr char kFormatVersion[] = "dcp-1";
// The version of checkpoints with items stored through extensions (dcp-1
// plus the extension records, docs/FORMAT.md): readers older than the
// records refuse them instead of misreading encoded bytes.
inline constexpr char kExtensionsFormatVersion[] = "dcp-2";
// The version of checkpoints holding a tensor of a dtype added after the
// first 17 (DType::kF8E4M3FNUZ on, core/dtype.h), extensions or not:
// readers older than those dtypes refuse them ("use a newer dcp") instead
// of calling them corrupt.
inline constexpr char kLaterDTypesFormatVersion[] = "dcp-3";
inline constexpr uint32_t kFirstLaterDTypeCode = 17;

}  // namespace dcp

#endif  // DCP_PLANNER_METADATA_H_
