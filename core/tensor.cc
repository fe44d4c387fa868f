#include "core/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dcp {

int64_t NumElements(absl::Span<const int64_t> sizes) {
  // An empty shape may have other dimensions whose product overflows.
  for (int64_t s : sizes) {
    if (s == 0) return 0;
  }
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

std::optional<int64_t> CheckedNumElements(absl::Span<const int64_t> sizes) {
  bool any_zero = false;
  for (int64_t s : sizes) {
    if (s < 0) return std::nullopt;
    any_zero |= s == 0;
  }
  if (any_zero) return 0;
  int64_t n = 1;
  for (int64_t s : sizes) {
    if (__builtin_mul_overflow(n, s, &n)) return std::nullopt;
  }
  return n;
}

std::optional<int64_t> CheckedNumBytes(DType dtype,
                                       absl::Span<const int64_t> sizes) {
  const std::optional<int64_t> elements = CheckedNumElements(sizes);
  int64_t bytes;
  if (!elements.has_value() ||
      __builtin_mul_overflow(
          *elements, static_cast<int64_t>(ElementSize(dtype)), &bytes)) {
    return std::nullopt;
  }
  return bytes;
}

Shape ContiguousStrides(absl::Span<const int64_t> sizes) {
  Shape strides(sizes.size());
  int64_t stride = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = stride;
    // Only an empty tensor's product can overflow (callers check the bytes
    // of the others first); its strides address nothing.
    if (__builtin_mul_overflow(stride, sizes[i] > 0 ? sizes[i] : 1, &stride)) {
      stride = 1;
    }
  }
  return strides;
}

std::string ShapeToString(absl::Span<const int64_t> sizes) {
  return absl::StrCat("[", absl::StrJoin(sizes, ", "), "]");
}

TensorView::TensorView(void* data, DType dtype, Shape sizes, Device device)
    : data_(data),
      dtype_(dtype),
      sizes_(std::move(sizes)),
      strides_(ContiguousStrides(sizes_)),
      device_(device) {}

TensorView::TensorView(void* data, DType dtype, Shape sizes, Shape strides,
                       Device device)
    : data_(data),
      dtype_(dtype),
      sizes_(std::move(sizes)),
      strides_(std::move(strides)),
      device_(device) {}

bool TensorView::is_contiguous() const {
  if (numel() <= 1) return true;
  int64_t expected = 1;
  for (size_t i = sizes_.size(); i-- > 0;) {
    if (sizes_[i] != 1 && strides_[i] != expected) return false;
    expected *= sizes_[i];
  }
  return true;
}

bool TensorView::may_overlap() const {
  if (numel() == 0) return false;
  std::vector<std::pair<int64_t, int64_t>> dims;  // (|stride|, size)
  for (size_t i = 0; i < sizes_.size(); ++i) {
    if (sizes_[i] > 1) dims.emplace_back(std::abs(strides_[i]), sizes_[i]);
  }
  std::sort(dims.begin(), dims.end());
  // The span of the dimensions so far, less one element (no overflow: the
  // view's extent was checked when it was made from caller memory).
  int64_t reach = 0;
  for (const auto& [stride, size] : dims) {
    if (stride < reach + 1) return true;
    reach += stride * (size - 1);
  }
  return false;
}

Tensor Tensor::Empty(DType dtype, Shape sizes) {
  constexpr int64_t kAlign = 4096;
  const std::optional<int64_t> nbytes = CheckedNumBytes(dtype, sizes);
  if (!nbytes.has_value() || *nbytes > INT64_MAX - kAlign) {
    throw std::bad_alloc();
  }
  const size_t padded = (*nbytes + kAlign - 1) / kAlign * kAlign;
  void* memory = padded == 0 ? nullptr : std::aligned_alloc(kAlign, padded);
  if (padded != 0 && memory == nullptr) throw std::bad_alloc();
  if (memory != nullptr) std::memset(memory, 0, padded);
  Tensor t;
  t.view_ = TensorView(memory, dtype, std::move(sizes));
  t.owner_ = std::shared_ptr<void>(memory, [](void* p) { std::free(p); });
  return t;
}

Tensor Tensor::Wrap(TensorView view) {
  Tensor t;
  t.view_ = std::move(view);
  return t;
}

Tensor Tensor::WithOwner(TensorView view, std::shared_ptr<void> owner) {
  Tensor t;
  t.view_ = std::move(view);
  t.owner_ = std::move(owner);
  return t;
}

namespace {

// Copies a strided host view into contiguous `out`, one innermost row at a
// time.
void GatherStrided(const TensorView& v, std::byte* out) {
  const size_t elem = ElementSize(v.dtype());
  const int64_t rank = v.dim();
  const int64_t n = v.numel();
  if (n == 0) return;
  if (rank == 0) {
    std::memcpy(out, v.data(), elem);
    return;
  }
  std::vector<int64_t> index(rank, 0);
  const auto* base = static_cast<const std::byte*>(v.data());
  const int64_t inner = v.sizes()[rank - 1];
  const int64_t inner_stride = v.strides()[rank - 1];
  for (int64_t done = 0; done < n; done += inner) {
    int64_t offset = 0;
    for (int64_t d = 0; d < rank - 1; ++d) offset += index[d] * v.strides()[d];
    for (int64_t i = 0; i < inner; ++i) {
      std::memcpy(out, base + (offset + i * inner_stride) * elem, elem);
      out += elem;
    }
    for (int64_t d = rank - 2; d >= 0; --d) {
      if (++index[d] < v.sizes()[d]) break;
      index[d] = 0;
    }
  }
}

}  // namespace

absl::StatusOr<Tensor> Tensor::ContiguousHostCopy() const {
  if (!device().is_cpu()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ContiguousHostCopy of a ", device().ToString(),
                     " tensor; copy device memory with the DeviceRuntime"));
  }
  Tensor copy = Empty(dtype(), sizes());
  if (view_.is_contiguous()) {
    if (nbytes() > 0) std::memcpy(copy.data(), data(), nbytes());
  } else {
    GatherStrided(view_, static_cast<std::byte*>(copy.data()));
  }
  return copy;
}

bool Tensor::BytesEqual(const Tensor& other) const {
  if (dtype() != other.dtype() || sizes() != other.sizes()) return false;
  if (nbytes() == 0) return true;
  return std::memcmp(data(), other.data(), nbytes()) == 0;
}

}  // namespace dcp
