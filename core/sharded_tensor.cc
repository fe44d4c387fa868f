#include "core/sharded_tensor.h"

#include "absl/strings/str_cat.h"

namespace dcp {

absl::Status ShardedTensor::Validate(absl::string_view name) const {
  if (!CheckedNumBytes(dtype_, global_sizes_).has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sharded tensor \"", name, "\" has global shape ",
        ShapeToString(global_sizes_), ": a negative size or too many bytes"));
  }
  for (size_t i = 0; i < shards_.size(); ++i) {
    const Shard& shard = shards_[i];
    const Shape& sizes = shard.tensor.sizes();
    if (shard.tensor.dtype() != dtype_) {
      return absl::InvalidArgumentError(
          absl::StrCat("sharded tensor \"", name, "\" shard ", i, " has dtype ",
                       DTypeName(shard.tensor.dtype()), " but the tensor is ",
                       DTypeName(dtype_)));
    }
    if (shard.offsets.size() != global_sizes_.size() ||
        sizes.size() != global_sizes_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sharded tensor \"", name, "\" shard ", i, " has offsets ",
          ShapeToString(shard.offsets), " and sizes ", ShapeToString(sizes),
          " but the global shape is ", ShapeToString(global_sizes_)));
    }
    for (size_t d = 0; d < sizes.size(); ++d) {
      // offsets + sizes <= global, without overflowing.
      if (shard.offsets[d] < 0 || sizes[d] < 0 || sizes[d] > global_sizes_[d] ||
          shard.offsets[d] > global_sizes_[d] - sizes[d]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "sharded tensor \"", name, "\" shard ", i, " at offsets ",
            ShapeToString(shard.offsets), " with sizes ", ShapeToString(sizes),
            " lies outside the global shape ", ShapeToString(global_sizes_)));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace dcp
