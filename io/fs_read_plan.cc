#include "io/fs_read_plan.h"

#include <algorithm>
#include <utility>
#include <variant>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "core/box_copy.h"
#include "core/dtype.h"
#include "io/internal/parallel_work.h"

namespace dcp::internal_fs {
namespace {

using internal_io::kDirectIoAlignment;

// Hashes MetadataIndex by fqn and offset (the system abseil cannot hash
// std::optional, so MetadataIndex's AbslHashValue does not instantiate).
struct IndexHash {
  size_t operator()(const MetadataIndex& index) const {
    size_t h = absl::Hash<std::string>()(index.fqn);
    if (index.offset.has_value()) {
      h = absl::HashOf(h, *index.offset);
    }
    return h;
  }
};

bool AllZero(const Shape& shape) {
  return std::all_of(shape.begin(), shape.end(),
                     [](int64_t v) { return v == 0; });
}

// The chunk of `tensor` that `index` names: by its index hint when that
// matches, else by its offsets. nullptr when there is none.
const ChunkStorageMetadata* FindChunk(const TensorStorageMetadata& tensor,
                                      const MetadataIndex& index) {
  const auto& hint = index.index;
  if (hint.has_value() && *hint >= 0 &&
      *hint < static_cast<int64_t>(tensor.chunks.size()) &&
      tensor.chunks[*hint].offsets == index.offset) {
    return &tensor.chunks[*hint];
  }
  const ChunkStorageMetadata* chunk = nullptr;
  for (const ChunkStorageMetadata& c : tensor.chunks) {
    if (c.offsets == index.offset) chunk = &c;
  }
  return chunk;
}

}  // namespace

absl::StatusOr<std::vector<StoredItem>> GroupReadItems(
    const LoadPlan& plan, const Metadata& metadata, const std::string& dir,
    absl::FunctionRef<absl::Status(const MetadataIndex&, const StorageInfo&)>
        check) {
  absl::flat_hash_map<MetadataIndex, size_t, IndexHash> position;
  std::vector<StoredItem> stored;
  for (const ReadItem& item : plan.items) {
    auto [it, inserted] =
        position.try_emplace(item.storage_index, stored.size());
    if (inserted) {
      auto info = metadata.storage_data.find(item.storage_index);
      if (info == metadata.storage_data.end()) {
        return absl::DataLossError(absl::StrCat("the metadata of ", dir,
                                                " has no storage entry for ",
                                                item.storage_index.ToString()));
      }
      if (absl::Status checked = check(info->first, info->second);
          !checked.ok()) {
        return checked;
      }
      StoredItem s;
      s.index = &info->first;
      s.info = &info->second;
      s.is_tensor = item.type == LoadItemType::kTensor;
      if (s.is_tensor) {
        auto value = metadata.state_dict_metadata.find(item.storage_index.fqn);
        const auto* tensor =
            value == metadata.state_dict_metadata.end()
                ? nullptr
                : std::get_if<TensorStorageMetadata>(&value->second);
        const ChunkStorageMetadata* chunk =
            tensor == nullptr ? nullptr
                              : FindChunk(*tensor, item.storage_index);
        if (chunk == nullptr) {
          return absl::DataLossError(
              absl::StrCat("the metadata of ", dir, " has no tensor chunk ",
                           item.storage_index.ToString()));
        }
        s.chunk_sizes = chunk->sizes;
        s.element_size = ElementSize(tensor->properties.dtype);
        // DecodeMetadata checked this; metadata handed to SetUp by other
        // means is checked here, without overflow, before any box arithmetic.
        if (CheckedNumBytes(tensor->properties.dtype, s.chunk_sizes) !=
            s.info->RawLength()) {
          return absl::DataLossError(absl::StrCat(
              "the metadata of ", dir, " stores ", s.info->RawLength(),
              " bytes for ", item.storage_index.ToString(), " of shape ",
              ShapeToString(s.chunk_sizes), " and dtype ",
              DTypeName(tensor->properties.dtype)));
        }
      }
      stored.push_back(std::move(s));
    }
    stored[it->second].uses.push_back(&item);
  }
  return stored;
}

bool FillsWholeHostTensor(const StoredItem& stored, const TensorView& dest) {
  const ReadItem& first = *stored.uses.front();
  return stored.uses.size() == 1 && AllZero(first.storage_offsets) &&
         AllZero(first.dest_offsets) && first.lengths == stored.chunk_sizes &&
         dest.device().is_cpu() && dest.is_contiguous() &&
         dest.sizes() == first.lengths &&
         static_cast<int64_t>(dest.nbytes()) == stored.info->RawLength();
}

bool CanReadInPlace(const StoredItem& stored, const TensorView& dest,
                    bool direct) {
  return !NeedsDecoding(*stored.info) && FillsWholeHostTensor(stored, dest) &&
         (!direct ||
          (reinterpret_cast<uintptr_t>(dest.data()) % kDirectIoAlignment == 0 &&
           stored.info->offset % kDirectIoAlignment == 0));
}

std::vector<ReadPiece> PlanPieces(const StoredItem& stored, int64_t block_size,
                                  int64_t piece_bytes) {
  const int64_t length = stored.info->RawLength();
  // The element ranges the boxes span, merged where they share a block.
  const int64_t es = static_cast<int64_t>(stored.element_size);
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const ReadItem* item : stored.uses) {
    auto span =
        BoxSpan(stored.chunk_sizes, item->storage_offsets, item->lengths);
    if (span.first < span.second) spans.push_back(span);
  }
  std::sort(spans.begin(), spans.end());
  std::vector<std::pair<int64_t, int64_t>> merged;
  for (const auto& span : spans) {
    if (!merged.empty() && span.first * es / block_size <=
                               (merged.back().second * es - 1) / block_size) {
      merged.back().second = std::max(merged.back().second, span.second);
    } else {
      merged.push_back(span);
    }
  }
  const int64_t blocks_per_piece =
      std::max<int64_t>(1, piece_bytes / block_size);
  std::vector<ReadPiece> pieces;
  for (const auto& [span_begin, span_end] : merged) {
    for (int64_t e = span_begin; e < span_end;) {
      const int64_t first_block = e * es / block_size;
      const int64_t end_byte =
          std::min((first_block + blocks_per_piece) * block_size, length);
      const int64_t next = std::max(e + 1, std::min(span_end, end_byte / es));
      const int64_t end_block = (next * es + block_size - 1) / block_size;
      pieces.push_back({first_block, end_block, e, next});
      e = next;
    }
  }
  return pieces;
}

}  // namespace dcp::internal_fs
