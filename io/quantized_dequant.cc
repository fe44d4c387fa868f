#include "io/quantized_dequant.h"

#include "absl/strings/str_cat.h"

namespace dcp {

absl::StatusOr<Shape> Fp8ScaleShape(const Shape& weight, int64_t block) {
  if (block < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the block size must be positive, not ", block));
  }
  if (weight.empty()) {
    return absl::InvalidArgumentError("a 0-d tensor has no blocks to scale");
  }
  Shape scale = weight;
  const size_t first = weight.size() >= 2 ? weight.size() - 2 : 0;
  for (size_t d = first; d < weight.size(); ++d) {
    scale[d] = (weight[d] + block - 1) / block;
  }
  return scale;
}

}  // namespace dcp
