// ShardedTensor: a tensor of a known global shape of which this rank holds
// some chunks (the seed's CheckpointableTensor). Chunks of all ranks together
// must tile the global shape exactly once after dedup; the planner checks.
#ifndef DCP_CORE_SHARDED_TENSOR_H_
#define DCP_CORE_SHARDED_TENSOR_H_

#include <vector>

#include "absl/status/status.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace dcp {

struct Shard {
  Shape offsets;  // Where this chunk starts in the global tensor.
  Tensor tensor;  // The chunk; its sizes are the chunk's sizes.
};

class ShardedTensor {
 public:
  ShardedTensor() = default;
  ShardedTensor(DType dtype, Shape global_sizes, std::vector<Shard> shards)
      : dtype_(dtype),
        global_sizes_(std::move(global_sizes)),
        shards_(std::move(shards)) {}

  DType dtype() const { return dtype_; }
  const Shape& global_sizes() const { return global_sizes_; }
  const std::vector<Shard>& local_shards() const { return shards_; }
  std::vector<Shard>& mutable_local_shards() { return shards_; }

  // Checks this rank's shards: same dtype as the tensor, rank matches, each
  // within the global bounds. kInvalidArgument naming `name` otherwise.
  absl::Status Validate(absl::string_view name) const;

 private:
  DType dtype_ = DType::kF32;
  Shape global_sizes_;
  std::vector<Shard> shards_;
};

}  // namespace dcp

#endif  // DCP_CORE_SHARDED_TENSOR_H_
