#include "core/box_copy.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dcp {
namespace {

absl::Status CheckInside(absl::string_view what,
                         absl::Span<const int64_t> sizes,
                         absl::Span<const int64_t> offsets,
                         absl::Span<const int64_t> lengths) {
  for (size_t d = 0; d < sizes.size(); ++d) {
    // offsets[d] + lengths[d] <= sizes[d], without the sum overflowing.
    if (offsets[d] < 0 || lengths[d] < 0 || lengths[d] > sizes[d] ||
        offsets[d] > sizes[d] - lengths[d]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "box at ", ShapeToString(offsets), " of ", ShapeToString(lengths),
          " leaves the ", what, " of shape ", ShapeToString(sizes)));
    }
  }
  return absl::OkStatus();
}

// The checks both copies share.
absl::Status CheckBox(absl::Span<const int64_t> src_sizes,
                      absl::Span<const int64_t> src_offsets,
                      size_t element_size, const TensorView& dst,
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
  return CheckInside("destination", dst.sizes(), dst_offsets, lengths);
}

int64_t Linear(absl::Span<const int64_t> index, const Shape& strides) {
  int64_t linear = 0;
  for (size_t i = 0; i < index.size(); ++i) linear += index[i] * strides[i];
  return linear;
}

// Copies one box of `lengths` from `s` (the source element at its first
// corner) to `d`, with per-dimension byte strides.
struct BoxCopier {
  Shape src_strides;  // Bytes.
  Shape dst_strides;  // Bytes.
  size_t element_size;
  bool inner_contiguous;

  void Copy(absl::Span<const int64_t> lengths, size_t dim, const std::byte* s,
            std::byte* d) const {
    if (lengths.empty()) {
      std::memcpy(d, s, element_size);
      return;
    }
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
      Copy(lengths, dim + 1, s + i * src_strides[dim],
           d + i * dst_strides[dim]);
    }
  }
};

// Copies sub-boxes of one box whose source elements lie in a window of the
// chunk's row-major elements.
class WindowedBoxCopy {
 public:
  WindowedBoxCopy(const std::byte* window, int64_t begin,
                  absl::Span<const int64_t> src_sizes,
                  absl::Span<const int64_t> src_offsets, size_t element_size,
                  const TensorView& dst, absl::Span<const int64_t> dst_offsets,
                  absl::Span<const int64_t> lengths)
      : window_(window),
        begin_(begin),
        src_offsets_(src_offsets),
        dst_offsets_(dst_offsets),
        lengths_(lengths),
        src_elem_strides_(ContiguousStrides(src_sizes)),
        dst_elem_strides_(dst.strides()),
        dst_(static_cast<std::byte*>(dst.data())) {
    const size_t rank = lengths.size();
    copier_.element_size = element_size;
    for (size_t i = 0; i < rank; ++i) {
      copier_.src_strides.push_back(src_elem_strides_[i] * element_size);
      copier_.dst_strides.push_back(dst_elem_strides_[i] * element_size);
    }
    copier_.inner_contiguous = rank == 0 || dst_elem_strides_[rank - 1] == 1;
    sub_offsets_.assign(src_offsets.begin(), src_offsets.end());
    sub_lengths_.assign(lengths.begin(), lengths.end());
  }

  // Copies the box elements whose row-major index lies in [lo, hi).
  void Run(int64_t lo, int64_t hi) {
    if (lengths_.empty()) {
      if (lo <= 0 && hi > 0) Emit();
      return;
    }
    Decompose(0, 0, lo, hi);
  }

 private:
  // Dimensions before `k` are fixed in sub_offsets_ (length 1); `base` is
  // the linear index of that prefix; [lo, hi) is relative to `base` and lies
  // within the prefix's hyper-row.
  void Decompose(size_t k, int64_t base, int64_t lo, int64_t hi) {
    if (lo >= hi) return;
    const int64_t stride = src_elem_strides_[k];
    const int64_t box_lo = src_offsets_[k];
    const int64_t box_hi = src_offsets_[k] + lengths_[k];
    // Indices of dimension k whose whole hyper-row lies in [lo, hi).
    const int64_t full_lo = std::max(box_lo, (lo + stride - 1) / stride);
    const int64_t full_hi = std::min(box_hi, hi / stride);
    if (full_lo < full_hi) {
      sub_offsets_[k] = full_lo;
      sub_lengths_[k] = full_hi - full_lo;
      for (size_t j = k + 1; j < lengths_.size(); ++j) {
        sub_offsets_[j] = src_offsets_[j];
        sub_lengths_[j] = lengths_[j];
      }
      Emit();
    }
    // The hyper-rows cut by lo and by hi (at most two, maybe the same one).
    const int64_t cut_lo = lo % stride != 0 ? lo / stride : -1;
    const int64_t cut_hi = hi % stride != 0 ? hi / stride : -1;
    const int64_t cuts[2] = {cut_lo, cut_hi == cut_lo ? -1 : cut_hi};
    for (int64_t i : cuts) {
      if (i < box_lo || i >= box_hi) continue;
      sub_offsets_[k] = i;
      sub_lengths_[k] = 1;
      const int64_t row = i * stride;
      Decompose(k + 1, base + row, std::max<int64_t>(lo - row, 0),
                std::min<int64_t>(hi - row, stride));
    }
  }

  // Copies the box at sub_offsets_/sub_lengths_ (entirely in the window).
  void Emit() {
    const int64_t first = Linear(sub_offsets_, src_elem_strides_);
    const std::byte* s = window_ + (first - begin_) * copier_.element_size;
    std::byte* d = dst_;
    for (size_t i = 0; i < sub_offsets_.size(); ++i) {
      d += (dst_offsets_[i] + sub_offsets_[i] - src_offsets_[i]) *
           dst_elem_strides_[i] * static_cast<int64_t>(copier_.element_size);
    }
    for (int64_t n : sub_lengths_) {
      if (n == 0) return;
    }
    copier_.Copy(sub_lengths_, 0, s, d);
  }

  const std::byte* window_;
  int64_t begin_;
  absl::Span<const int64_t> src_offsets_;
  absl::Span<const int64_t> dst_offsets_;
  absl::Span<const int64_t> lengths_;
  Shape src_elem_strides_;
  Shape dst_elem_strides_;
  std::byte* dst_;
  BoxCopier copier_;
  Shape sub_offsets_;
  Shape sub_lengths_;
};

}  // namespace

absl::Status CopyBox(const std::byte* src, absl::Span<const int64_t> src_sizes,
                     absl::Span<const int64_t> src_offsets, size_t element_size,
                     const TensorView& dst,
                     absl::Span<const int64_t> dst_offsets,
                     absl::Span<const int64_t> lengths) {
  absl::Status checked =
      CheckBox(src_sizes, src_offsets, element_size, dst, dst_offsets, lengths);
  if (!checked.ok()) return checked;
  if (NumElements(lengths) == 0) return absl::OkStatus();
  WindowedBoxCopy copy(src, 0, src_sizes, src_offsets, element_size, dst,
                       dst_offsets, lengths);
  copy.Run(0, NumElements(src_sizes));
  return absl::OkStatus();
}

absl::Status CopyBoxPart(const std::byte* window, int64_t begin, int64_t end,
                         absl::Span<const int64_t> src_sizes,
                         absl::Span<const int64_t> src_offsets,
                         size_t element_size, const TensorView& dst,
                         absl::Span<const int64_t> dst_offsets,
                         absl::Span<const int64_t> lengths) {
  absl::Status checked =
      CheckBox(src_sizes, src_offsets, element_size, dst, dst_offsets, lengths);
  if (!checked.ok()) return checked;
  const int64_t elements = NumElements(src_sizes);
  if (begin < 0 || end < begin || end > elements) {
    return absl::InvalidArgumentError(absl::StrCat(
        "window of elements [", begin, ", ", end, ") outside a chunk of ",
        elements, " elements (shape ", ShapeToString(src_sizes), ")"));
  }
  if (NumElements(lengths) == 0 || begin == end) return absl::OkStatus();
  WindowedBoxCopy copy(window, begin, src_sizes, src_offsets, element_size, dst,
                       dst_offsets, lengths);
  copy.Run(begin, end);
  return absl::OkStatus();
}

std::pair<int64_t, int64_t> BoxSpan(absl::Span<const int64_t> src_sizes,
                                    absl::Span<const int64_t> src_offsets,
                                    absl::Span<const int64_t> lengths) {
  if (NumElements(lengths) == 0) return {0, 0};
  const Shape strides = ContiguousStrides(src_sizes);
  int64_t first = 0, last = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    first += src_offsets[i] * strides[i];
    last += (src_offsets[i] + lengths[i] - 1) * strides[i];
  }
  return {first, last + 1};
}

Shape RowMajorCoordinates(int64_t linear, absl::Span<const int64_t> shape) {
  Shape coords(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    coords[d] = shape[d] == 0 ? 0 : linear % shape[d];
    linear = shape[d] == 0 ? 0 : linear / shape[d];
  }
  return coords;
}

int64_t BoxElementsBefore(absl::Span<const int64_t> sizes,
                          absl::Span<const int64_t> offsets,
                          absl::Span<const int64_t> lengths, int64_t e) {
  const int64_t total = NumElements(lengths);
  if (total == 0 || e <= 0) return 0;
  if (e >= NumElements(sizes)) return total;
  const Shape index = RowMajorCoordinates(e, sizes);
  int64_t count = 0;
  int64_t inner = total;
  for (size_t d = 0; d < sizes.size(); ++d) {
    inner /= lengths[d];
    const int64_t lo = offsets[d];
    const int64_t hi = offsets[d] + lengths[d];
    count += (std::clamp(index[d], lo, hi) - lo) * inner;
    // Beyond this dimension only points sharing the prefix could still
    // come before `e`; outside the box's range there are none.
    if (index[d] < lo || index[d] >= hi) break;
  }
  return count;
}

int64_t ChunkElementOfBoxElement(absl::Span<const int64_t> sizes,
                                 absl::Span<const int64_t> offsets,
                                 absl::Span<const int64_t> lengths, int64_t b) {
  const Shape coords = RowMajorCoordinates(b, lengths);
  int64_t linear = 0;
  for (size_t d = 0; d < sizes.size(); ++d) {
    linear = linear * sizes[d] + offsets[d] + coords[d];
  }
  return linear;
}

}  // namespace dcp
