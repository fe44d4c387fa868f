#include "io/box_copy.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace dcp {
namespace {

absl::Status CheckInside(absl::string_view what,
                         absl::Span<const int64_t> sizes,
                         absl::Span<const int64_t> offsets,
                         absl::Span<const int64_t> lengths) {
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (offsets[d] < 0 || lengths[d] < 0 ||
        offsets[d] + lengths[d] > sizes[d]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "box at ", ShapeToString(offsets), " of ", ShapeToString(lengths),
          " leaves the ", what, " of shape ", ShapeToString(sizes)));
    }
  }
  return absl::OkStatus();
}

struct BoxCopier {
  Shape src_strides;  // Bytes.
  Shape dst_strides;  // Bytes.
  absl::Span<const int64_t> lengths;
  size_t element_size;
  bool inner_contiguous;

  void Copy(size_t dim, const std::byte* s, std::byte* d) const {
    const size_t last = lengths.size() - 1;
    if (dim == last) {
      if (inner_contiguous) {
        std::memcpy(d, s, lengths[dim] * element_size);
        return;
      }
      for (int64_t i = 0; i < lengths[dim]; ++i) {
        std::memcpy(d + i * dst_strides[dim], s + i * src_strides[dim],
                    element_size);
      }
      return;
    }
    for (int64_t i = 0; i < lengths[dim]; ++i) {
      Copy(dim + 1, s + i * src_strides[dim], d + i * dst_strides[dim]);
    }
  }
};

}  // namespace

absl::Status CopyBox(const std::byte* src, absl::Span<const int64_t> src_sizes,
                     absl::Span<const int64_t> src_offsets, size_t element_size,
                     const TensorView& dst,
                     absl::Span<const int64_t> dst_offsets,
                     absl::Span<const int64_t> lengths) {
  const size_t rank = lengths.size();
  if (src_sizes.size() != rank || src_offsets.size() != rank ||
      dst.sizes().size() != rank || dst_offsets.size() != rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "box of rank ", rank, " between a chunk of rank ", src_sizes.size(),
        " and a destination of rank ", dst.sizes().size()));
  }
  if (ElementSize(dst.dtype()) != element_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stored elements have ", element_size, " bytes, the destination's (",
        DTypeName(dst.dtype()), ") ", ElementSize(dst.dtype())));
  }
  if (!dst.device().is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "destination is on ", dst.device().ToString(), ", not host memory"));
  }
  absl::Status inside =
      CheckInside("stored chunk", src_sizes, src_offsets, lengths);
  if (!inside.ok()) return inside;
  inside = CheckInside("destination", dst.sizes(), dst_offsets, lengths);
  if (!inside.ok()) return inside;
  if (NumElements(lengths) == 0) return absl::OkStatus();

  const Shape src_elem_strides = ContiguousStrides(src_sizes);
  const Shape& dst_elem_strides = dst.strides();
  const std::byte* s = src;
  std::byte* d = static_cast<std::byte*>(dst.data());
  for (size_t i = 0; i < rank; ++i) {
    s += src_offsets[i] * src_elem_strides[i] * element_size;
    d += dst_offsets[i] * dst_elem_strides[i] * element_size;
  }
  if (rank == 0) {
    std::memcpy(d, s, element_size);
    return absl::OkStatus();
  }
  BoxCopier copier;
  copier.lengths = lengths;
  copier.element_size = element_size;
  for (size_t i = 0; i < rank; ++i) {
    copier.src_strides.push_back(src_elem_strides[i] * element_size);
    copier.dst_strides.push_back(dst_elem_strides[i] * element_size);
  }
  copier.inner_contiguous = dst_elem_strides[rank - 1] == 1;
  copier.Copy(0, s, d);
  return absl::OkStatus();
}

}  // namespace dcp
