// Plans: what each rank writes (SavePlan of WriteItems) and reads (LoadPlan
// of ReadItems), as in the seed. Plans are plain values: the coordinator
// gathers local plans, rewrites them into final plans and scatters them.
#ifndef DCP_PLANNER_PLAN_H_
#define DCP_PLANNER_PLAN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "planner/metadata.h"

namespace dcp {

enum class WriteItemType : uint8_t {
  kTensor = 0,   // A whole (unsharded) tensor.
  kShard = 1,    // One chunk of a sharded tensor.
  kBytesIO = 2,  // A non-tensor value.
};

struct TensorWriteData {
  ChunkStorageMetadata chunk;  // Which part of the tensor this item is.
  TensorProperties properties;
  Shape size;  // The global shape.
};

struct BytesIOWriteData {
  int64_t nbytes = 0;
};

struct WriteItem {
  MetadataIndex index;
  WriteItemType type = WriteItemType::kTensor;
  std::optional<BytesIOWriteData> bytes_io_data;
  std::optional<TensorWriteData> tensor_data;

  // Bytes this item occupies in storage.
  int64_t StorageBytes() const;
};

// `storage_data` and `planner_data` are opaque to everyone but the storage
// layer and the planner that set them (the seed's Any); they travel with the
// plan. `usable` false marks a plan the coordinator rejected.
struct SavePlan {
  std::vector<WriteItem> items;
  std::string storage_data;
  std::string planner_data;
  bool usable = true;
};

enum class LoadItemType : uint8_t {
  kTensor = 0,
  kBytesIO = 1,
};

// Copy the box `lengths` starting at `storage_offsets` of the stored chunk
// `storage_index` into the destination chunk `dest_index` at `dest_offsets`.
// Offsets are relative to the respective chunk, not the global tensor.
struct ReadItem {
  LoadItemType type = LoadItemType::kTensor;
  MetadataIndex dest_index;
  Shape dest_offsets;
  MetadataIndex storage_index;
  Shape storage_offsets;
  Shape lengths;
};

struct LoadPlan {
  std::vector<ReadItem> items;
  std::string storage_data;
  std::string planner_data;
};

// What writing one item produced (the seed's WriteResult): the item's index,
// its size, and where it landed.
struct WriteResult {
  MetadataIndex index;
  int64_t size_in_bytes = 0;
  StorageInfo storage_data;
};

}  // namespace dcp

#endif  // DCP_PLANNER_PLAN_H_
