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
    // ceil(weight[d] / block) without forming weight[d] + block - 1, which
    // overflows for dimensions near 2^63.
    scale[d] = weight[d] / block + (weight[d] % block != 0 ? 1 : 0);
  }
  return scale;
}

}  // namespace dcp
