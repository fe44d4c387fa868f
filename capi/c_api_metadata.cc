// The C ABI's checkpoint metadata (dcp_metadata_*): reading it from a
// checkpoint or through a storage reader, and its items, chunks, paths and
// storage entries.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "capi/internal/handles.h"
#include "capi/internal/last_error.h"
#include "capi/internal/options.h"
#include "capi/internal/registry.h"
#include "capi/internal/state_tree.h"
#include "core/state_dict.h"
#include "core/status.h"
#include "dcp/dcp.h"
#include "io/file_system_storage.h"
#include "io/metadata_format.h"
#include "planner/metadata.h"

namespace dcp::capi {
namespace {

absl::StatusOr<const MetadataItem*> ItemAt(const dcp_metadata& md,
                                           size_t index) {
  if (index >= md.items.size()) {
    return absl::OutOfRangeError(absl::StrCat("metadata item index ", index,
                                              " is out of range; there are ",
                                              md.items.size(), " items"));
  }
  return &md.items[index];
}

// Orders items by the first `size` bytes of their names.
struct ByPrefix {
  size_t size;
  std::string_view Head(const MetadataItem& item) const {
    return std::string_view(*item.name).substr(0, size);
  }
  bool operator()(const MetadataItem& a, std::string_view b) const {
    return Head(a) < b;
  }
  bool operator()(std::string_view a, const MetadataItem& b) const {
    return a < Head(b);
  }
};

// Appends to a Packed: records, and strings into its text (each distinct
// string once, so keys and file names shared by many items cost one copy).
class Packer {
 public:
  explicit Packer(dcp_metadata::Packed& out) : out_(out) {}

  void Add(int64_t value) { out_.records.push_back(value); }

  // The string's offset and size in the text, as two records.
  void AddString(const std::string& s) {
    auto [it, added] = offsets_.try_emplace(s, out_.text.size());
    if (added) out_.text += s;
    Add(static_cast<int64_t>(it->second));
    Add(static_cast<int64_t>(s.size()));
  }

 private:
  dcp_metadata::Packed& out_;
  absl::flat_hash_map<std::string, size_t> offsets_;
};

dcp_metadata::Packed PackItems(const dcp_metadata& md) {
  dcp_metadata::Packed packed;
  Packer packer(packed);
  for (const MetadataItem& item : md.items) {
    const TensorStorageMetadata* tensor = item.tensor;
    packer.AddString(*item.name);
    packer.Add(tensor != nullptr ? 1 : 0);
    packer.Add(
        tensor != nullptr ? static_cast<int64_t>(tensor->properties.dtype) : 0);
    packer.Add(tensor != nullptr && tensor->properties.requires_grad ? 1 : 0);
    const size_t ndim = tensor != nullptr ? tensor->size.size() : 0;
    packer.Add(static_cast<int64_t>(ndim));
    packer.Add(static_cast<int64_t>(item.path.size()));
    packer.Add(tensor != nullptr ? static_cast<int64_t>(tensor->chunks.size())
                                 : 0);
    for (size_t d = 0; d < ndim; ++d) packer.Add(tensor->size[d]);
    for (const PathElement& element : item.path) {
      if (const auto* key = std::get_if<std::string>(&element)) {
        packer.AddString(*key);
      } else {
        packer.Add(-1);
        packer.Add(std::get<int64_t>(element));
      }
    }
    if (tensor == nullptr) continue;
    for (const ChunkStorageMetadata& chunk : tensor->chunks) {
      for (size_t d = 0; d < ndim; ++d) packer.Add(chunk.offsets[d]);
      for (size_t d = 0; d < ndim; ++d) packer.Add(chunk.sizes[d]);
    }
  }
  return packed;
}

dcp_metadata::Packed PackStorage(const dcp_metadata& md) {
  dcp_metadata::Packed packed;
  Packer packer(packed);
  for (const auto* entry : md.storage) {
    const auto& [key, where] = *entry;
    packer.AddString(key.fqn);
    packer.Add(key.offset.has_value() ? 1 : 0);
    packer.Add(key.offset.has_value() ? static_cast<int64_t>(key.offset->size())
                                      : 0);
    if (key.offset.has_value()) {
      for (int64_t offset : *key.offset) packer.Add(offset);
    }
    packer.AddString(where.relative_path);
    packer.Add(where.offset);
    packer.Add(where.length);
  }
  return packed;
}

// The packed form `slot` of `md`, made by `pack` on first use.
absl::Status ReturnPacked(
    dcp_metadata& md, std::optional<dcp_metadata::Packed> dcp_metadata::*slot,
    dcp_metadata::Packed (*pack)(const dcp_metadata&), const int64_t** records,
    size_t* num_records, const char** text, size_t* text_size) {
  DCP_RETURN_IF_ERROR(CheckOut(records, "const int64_t** records"));
  DCP_RETURN_IF_ERROR(CheckOut(num_records, "size_t* num_records"));
  DCP_RETURN_IF_ERROR(CheckOut(text, "const char** text"));
  DCP_RETURN_IF_ERROR(CheckOut(text_size, "size_t* text_size"));
  absl::MutexLock lock(&md.packed_mu);
  std::optional<dcp_metadata::Packed>& packed = md.*slot;
  if (!packed.has_value()) packed = pack(md);
  *records = packed->records.data();
  *num_records = packed->records.size();
  *text = packed->text.data();
  *text_size = packed->text.size();
  return absl::OkStatus();
}

}  // namespace
}  // namespace dcp::capi

using dcp::capi::CheckOut;
using dcp::capi::Guard;
using dcp::capi::Publish;
using dcp::capi::Resolve;

extern "C" {

int dcp_metadata_read(const char* checkpoint_id, dcp_metadata_t** out) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(out, "dcp_metadata_t**"));
    if (checkpoint_id == nullptr || checkpoint_id[0] == '\0') {
      return absl::InvalidArgumentError(
          "dcp_metadata_read: checkpoint_id is NULL or empty");
    }
    // As `dcp inspect`: the reader's own metadata read and validation.
    dcp::FileSystemReader reader(checkpoint_id);
    DCP_RETURN_IF_ERROR(reader.Reset(checkpoint_id));
    DCP_ASSIGN_OR_RETURN(dcp::Metadata metadata, reader.ReadMetadata());
    *out = Publish(new dcp_metadata(std::move(metadata)));
    return absl::OkStatus();
  });
}

int dcp_metadata_free(dcp_metadata_t* md) { return dcp::capi::FreeHandle(md); }

int dcp_metadata_encode(const dcp_metadata_t* md, void* buf, size_t capacity,
                        size_t* size) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(size, "size_t* size"));
    DCP_ASSIGN_OR_RETURN(dcp_metadata * h, Resolve(md));
    if (buf == nullptr && capacity != 0) {
      return absl::InvalidArgumentError(
          "dcp_metadata_encode: buf is NULL with a capacity");
    }
    DCP_ASSIGN_OR_RETURN(std::string encoded, dcp::EncodeMetadata(h->metadata));
    *size = encoded.size();
    if (buf == nullptr) return absl::OkStatus();
    if (capacity < encoded.size()) {
      return absl::OutOfRangeError(
          absl::StrCat("dcp_metadata_encode: the encoding takes ",
                       encoded.size(), " bytes, the buffer holds ", capacity));
    }
    std::copy(encoded.begin(), encoded.end(), static_cast<char*>(buf));
    return absl::OkStatus();
  });
}

int dcp_metadata_decode(const void* data, size_t size, const char* source,
                        dcp_metadata_t** out) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(out, "dcp_metadata_t**"));
    if (data == nullptr && size != 0) {
      return absl::InvalidArgumentError(
          "dcp_metadata_decode: data is NULL with a size");
    }
    DCP_ASSIGN_OR_RETURN(
        dcp::Metadata metadata,
        dcp::DecodeMetadata(
            absl::string_view(static_cast<const char*>(data), size),
            source != nullptr ? source
                              : "the bytes given to dcp_metadata_decode"));
    *out = Publish(new dcp_metadata(std::move(metadata)));
    return absl::OkStatus();
  });
}

int dcp_metadata_num_items(const dcp_metadata_t* md, size_t* out) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(out, "size_t*"));
    DCP_ASSIGN_OR_RETURN(dcp_metadata * h, Resolve(md));
    *out = h->items.size();
    return absl::OkStatus();
  });
}

int dcp_metadata_item(const dcp_metadata_t* md, size_t index,
                      dcp_item_info_t* out) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(dcp::capi::CheckOutStruct(out, "dcp_item_info_t"));
    DCP_ASSIGN_OR_RETURN(dcp_metadata * h, Resolve(md));
    DCP_ASSIGN_OR_RETURN(const MetadataItem* item,
                         dcp::capi::ItemAt(*h, index));
    dcp_item_info_t info = {};
    info.name = item->name->c_str();
    info.path_len = item->path.size();
    if (item->tensor != nullptr) {
      info.is_tensor = 1;
      info.dtype = static_cast<int32_t>(item->tensor->properties.dtype);
      info.ndim = static_cast<int32_t>(item->tensor->size.size());
      info.shape = item->tensor->size.data();
      info.num_chunks = item->tensor->chunks.size();
      info.requires_grad = item->tensor->properties.requires_grad ? 1 : 0;
    }
    dcp::capi::WriteVersioned(info, out);
    return absl::OkStatus();
  });
}

int dcp_metadata_find(const dcp_metadata_t* md, const char* name,
                      size_t* index) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(index, "size_t* index"));
    DCP_ASSIGN_OR_RETURN(dcp_metadata * h, Resolve(md));
    if (name == nullptr) {
      return absl::InvalidArgumentError("dcp_metadata_find: name is NULL");
    }
    const std::string key = name;
    const auto it =
        std::lower_bound(h->items.begin(), h->items.end(), key,
                         [](const MetadataItem& item, const std::string& k) {
                           return *item.name < k;
                         });
    if (it == h->items.end() || *it->name != key) {
      return absl::NotFoundError(
          absl::StrCat("the checkpoint has no item named \"", key, "\""));
    }
    *index = static_cast<size_t>(it - h->items.begin());
    return absl::OkStatus();
  });
}

int dcp_metadata_find_path(const dcp_metadata_t* md, dcp_path_t path,
                           size_t* index) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(index, "size_t* index"));
    DCP_ASSIGN_OR_RETURN(dcp_metadata * h, Resolve(md));
    DCP_ASSIGN_OR_RETURN(dcp::ObjectPath wanted, dcp::capi::PathFromC(path));
    const std::string name = dcp::PathToString(wanted);
    const auto it =
        std::lower_bound(h->items.begin(), h->items.end(), name,
                         [](const MetadataItem& item, const std::string& k) {
                           return *item.name < k;
                         });
    if (it == h->items.end() || *it->name != name || it->path != wanted) {
      return absl::NotFoundError(
          absl::StrCat("the checkpoint has no item at path \"", name, "\""));
    }
    *index = static_cast<size_t>(it - h->items.begin());
    return absl::OkStatus();
  });
}

int dcp_metadata_find_prefix(const dcp_metadata_t* md, const char* prefix,
                             size_t* first, size_t* count, size_t* min_path_len,
                             size_t* max_path_len) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(first, "size_t* first"));
    DCP_RETURN_IF_ERROR(CheckOut(count, "size_t* count"));
    DCP_ASSIGN_OR_RETURN(dcp_metadata * h, Resolve(md));
    if (prefix == nullptr) {
      return absl::InvalidArgumentError(
          "dcp_metadata_find_prefix: prefix is NULL");
    }
    const std::string_view key = prefix;
    // Names in order compare in order by their first key.size() bytes, so
    // the names with the prefix are one range.
    const auto [lo, hi] = std::equal_range(
        h->items.begin(), h->items.end(), key, dcp::capi::ByPrefix{key.size()});
    *first = static_cast<size_t>(lo - h->items.begin());
    *count = static_cast<size_t>(hi - lo);
    size_t shortest = lo == hi ? 0 : SIZE_MAX, longest = 0;
    for (auto it = lo; it != hi; ++it) {
      shortest = std::min(shortest, it->path.size());
      longest = std::max(longest, it->path.size());
    }
    if (min_path_len != nullptr) *min_path_len = shortest;
    if (max_path_len != nullptr) *max_path_len = longest;
    return absl::OkStatus();
  });
}

int dcp_metadata_chunk(const dcp_metadata_t* md, size_t index, size_t chunk,
                       const int64_t** offsets, const int64_t** sizes) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(offsets, "offsets"));
    DCP_RETURN_IF_ERROR(CheckOut(sizes, "sizes"));
    DCP_ASSIGN_OR_RETURN(dcp_metadata * h, Resolve(md));
    DCP_ASSIGN_OR_RETURN(const MetadataItem* item,
                         dcp::capi::ItemAt(*h, index));
    if (item->tensor == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("metadata item \"", *item->name,
                       "\" is a plain value, not a tensor: it has no chunks"));
    }
    if (chunk >= item->tensor->chunks.size()) {
      return absl::OutOfRangeError(absl::StrCat(
          "chunk ", chunk, " of tensor \"", *item->name,
          "\" is out of range; it has ", item->tensor->chunks.size()));
    }
    *offsets = item->tensor->chunks[chunk].offsets.data();
    *sizes = item->tensor->chunks[chunk].sizes.data();
    return absl::OkStatus();
  });
}

int dcp_metadata_item_path(const dcp_metadata_t* md, size_t index, size_t elem,
                           dcp_path_elem_t* out) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(out, "dcp_path_elem_t*"));
    DCP_ASSIGN_OR_RETURN(dcp_metadata * h, Resolve(md));
    DCP_ASSIGN_OR_RETURN(const MetadataItem* item,
                         dcp::capi::ItemAt(*h, index));
    if (elem >= item->path.size()) {
      return absl::OutOfRangeError(
          absl::StrCat("path element ", elem, " of item \"", *item->name,
                       "\" is out of range; its path has ", item->path.size()));
    }
    const dcp::PathElement& element = item->path[elem];
    if (const auto* key = std::get_if<std::string>(&element)) {
      out->key = key->c_str();
      out->index = -1;
    } else {
      out->key = nullptr;
      out->index = std::get<int64_t>(element);
    }
    return absl::OkStatus();
  });
}

int dcp_metadata_items_packed(const dcp_metadata_t* md, const int64_t** records,
                              size_t* num_records, const char** text,
                              size_t* text_size) {
  return Guard([&]() -> absl::Status {
    DCP_ASSIGN_OR_RETURN(dcp_metadata * h, Resolve(md));
    return dcp::capi::ReturnPacked(*h, &dcp_metadata::packed_items,
                                   dcp::capi::PackItems, records, num_records,
                                   text, text_size);
  });
}

int dcp_metadata_storage_packed(const dcp_metadata_t* md,
                                const int64_t** records, size_t* num_records,
                                const char** text, size_t* text_size) {
  return Guard([&]() -> absl::Status {
    DCP_ASSIGN_OR_RETURN(dcp_metadata * h, Resolve(md));
    return dcp::capi::ReturnPacked(*h, &dcp_metadata::packed_storage,
                                   dcp::capi::PackStorage, records, num_records,
                                   text, text_size);
  });
}

int dcp_metadata_version(const dcp_metadata_t* md, const char** version) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(version, "const char** version"));
    DCP_ASSIGN_OR_RETURN(dcp_metadata * h, Resolve(md));
    *version = h->metadata.version.c_str();
    return absl::OkStatus();
  });
}

int dcp_metadata_num_storage(const dcp_metadata_t* md, size_t* out) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(out, "size_t*"));
    DCP_ASSIGN_OR_RETURN(dcp_metadata * h, Resolve(md));
    *out = h->storage.size();
    return absl::OkStatus();
  });
}

int dcp_metadata_storage(const dcp_metadata_t* md, size_t index,
                         dcp_storage_info_t* out) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(dcp::capi::CheckOutStruct(out, "dcp_storage_info_t"));
    DCP_ASSIGN_OR_RETURN(dcp_metadata * h, Resolve(md));
    if (index >= h->storage.size()) {
      return absl::OutOfRangeError(absl::StrCat("storage entry index ", index,
                                                " is out of range; there are ",
                                                h->storage.size(), " entries"));
    }
    const auto& [key, where] = *h->storage[index];
    dcp_storage_info_t info = {};
    info.name = key.fqn.c_str();
    if (key.offset.has_value()) {
      info.has_offsets = 1;
      info.ndim = static_cast<int32_t>(key.offset->size());
      info.offsets = key.offset->data();
    }
    info.relative_path = where.relative_path.c_str();
    info.offset = where.offset;
    info.length = where.length;
    dcp::capi::WriteVersioned(info, out);
    return absl::OkStatus();
  });
}

int dcp_storage_reader_read_metadata(dcp_storage_reader_t* reader,
                                     const char* checkpoint_id,
                                     dcp_metadata_t** out) {
  return Guard([&]() -> absl::Status {
    DCP_RETURN_IF_ERROR(CheckOut(out, "dcp_metadata_t**"));
    DCP_ASSIGN_OR_RETURN(dcp_storage_reader * r, Resolve(reader));
    if (checkpoint_id != nullptr) {
      if (checkpoint_id[0] == '\0') {
        return absl::InvalidArgumentError(
            "dcp_storage_reader_read_metadata: checkpoint_id is empty (pass "
            "NULL to keep the reader's location)");
      }
      DCP_RETURN_IF_ERROR(r->reader->Reset(checkpoint_id));
    } else {
      DCP_RETURN_IF_ERROR(r->reader->Reset(""));
    }
    DCP_ASSIGN_OR_RETURN(dcp::Metadata metadata, r->reader->ReadMetadata());
    *out = Publish(new dcp_metadata(std::move(metadata)));
    return absl::OkStatus();
  });
}

int dcp_metadata_ids(const dcp_metadata_t* md, const char** checkpoint_id,
                     const char** save_id) {
  return Guard([&]() -> absl::Status {
    DCP_ASSIGN_OR_RETURN(dcp_metadata * h, Resolve(md));
    if (checkpoint_id != nullptr) *checkpoint_id = h->checkpoint_id.c_str();
    if (save_id != nullptr) *save_id = h->save_id.c_str();
    return absl::OkStatus();
  });
}

}  // extern "C"
