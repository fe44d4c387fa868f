#include "planner/metadata.h"

#include "absl/strings/str_cat.h"
#include "planner/plan.h"

namespace dcp {

std::string MetadataIndex::ToString() const {
  if (!offset.has_value()) return fqn;
  return absl::StrCat(fqn, "@", ShapeToString(*offset));
}

int64_t WriteItem::StorageBytes() const {
  if (bytes_io_data.has_value()) return bytes_io_data->nbytes;
  if (!tensor_data.has_value()) return 0;
  return NumElements(tensor_data->chunk.sizes) *
         static_cast<int64_t>(ElementSize(tensor_data->properties.dtype));
}

}  // namespace dcp
