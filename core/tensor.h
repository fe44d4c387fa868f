// TensorView (a non-owning description of tensor memory) and Tensor (a view
// plus shared ownership of what backs it). State dicts hold Tensors.
//
// Layout: sizes and strides are in elements, row-major strides by default.
// 0-d tensors (sizes = {}) have one element; a zero in sizes means no
// elements. Staging and writing take contiguous memory: a non-contiguous
// tensor is gathered into a contiguous copy by the stager (see staging/)
// and, for host tensors, by the synchronous file writer (which otherwise
// writes straight from the caller's memory); that writer rejects a
// non-contiguous device tensor with kInvalidArgument.
#ifndef DCP_CORE_TENSOR_H_
#define DCP_CORE_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/device.h"
#include "core/dtype.h"

namespace dcp {

// Sizes, strides or offsets, one per dimension. Inline up to 4 dimensions:
// plans and metadata hold several per item, so a heap allocation each would
// dominate the cost of saving many small tensors.
using Shape = absl::InlinedVector<int64_t, 4>;

// The most dimensions a checkpoint's tensor has (numpy's limit): saves
// refuse more, and readers of every format take more for damage (each
// dimension costs memory in every chunk of the metadata).
inline constexpr int kMaxTensorDims = 64;

// Number of elements of a shape (1 for the 0-d shape). The shape must be
// valid (no negative size, a product that fits int64_t): shapes decoded from
// a file go through CheckedNumElements first.
int64_t NumElements(absl::Span<const int64_t> sizes);

// Number of elements of `sizes`, or nullopt when a size is negative or the
// product overflows int64_t (a zero size makes it 0 whatever the others).
std::optional<int64_t> CheckedNumElements(absl::Span<const int64_t> sizes);

// Bytes of a contiguous tensor of `dtype` and `sizes`, or nullopt when a
// size is negative or the count overflows int64_t.
std::optional<int64_t> CheckedNumBytes(DType dtype,
                                       absl::Span<const int64_t> sizes);

// Row-major strides of a shape, in elements.
Shape ContiguousStrides(absl::Span<const int64_t> sizes);

// "[2, 3, 4]".
std::string ShapeToString(absl::Span<const int64_t> sizes);

class TensorView {
 public:
  TensorView() = default;
  // A contiguous view.
  TensorView(void* data, DType dtype, Shape sizes, Device device = Device{});
  // A strided view; strides in elements, same rank as sizes.
  TensorView(void* data, DType dtype, Shape sizes, Shape strides,
             Device device);

  void* data() const { return data_; }
  DType dtype() const { return dtype_; }
  const Shape& sizes() const { return sizes_; }
  const Shape& strides() const { return strides_; }
  const Device& device() const { return device_; }
  int64_t dim() const { return static_cast<int64_t>(sizes_.size()); }

  int64_t numel() const { return NumElements(sizes_); }
  // numel() * ElementSize(dtype()): the bytes a contiguous copy occupies.
  size_t nbytes() const { return numel() * ElementSize(dtype_); }
  bool is_contiguous() const;
  // Whether two elements may share memory (a stride 0 or an expanded
  // view). Conservative: false proves they do not (each dimension, by
  // increasing stride, steps past all that the smaller ones span); a rare
  // interleaved layout that does not overlap still reports true.
  bool may_overlap() const;

  // The bytes of a contiguous view. Only valid for host memory.
  absl::Span<const std::byte> bytes() const {
    return {static_cast<const std::byte*>(data_), nbytes()};
  }

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Shape sizes_;
  Shape strides_;
  Device device_;
};

class Tensor {
 public:
  Tensor() = default;

  // Allocates a zero-filled contiguous host tensor, 4 KiB aligned (ready for
  // O_DIRECT reads straight into it). Throws std::bad_alloc when the memory
  // is not there, and also when a size is negative or the byte count
  // overflows (CheckedNumBytes), rather than allocating a wrapped size.
  static Tensor Empty(DType dtype, Shape sizes);

  // Wraps memory the caller keeps alive for as long as the Tensor is used
  // (the usual case for a training loop's parameters).
  static Tensor Wrap(TensorView view);

  // Wraps memory kept alive by `owner` (any shared object: a staging buffer,
  // a DLPack capsule, device memory with a deleter).
  static Tensor WithOwner(TensorView view, std::shared_ptr<void> owner);

  const TensorView& view() const { return view_; }
  void* data() const { return view_.data(); }
  DType dtype() const { return view_.dtype(); }
  const Shape& sizes() const { return view_.sizes(); }
  const Device& device() const { return view_.device(); }
  int64_t numel() const { return view_.numel(); }
  size_t nbytes() const { return view_.nbytes(); }
  bool defined() const { return view_.data() != nullptr || numel() == 0; }

  // A contiguous host copy of this host tensor (gathering strided data).
  // kInvalidArgument for device tensors (use the DeviceRuntime instead).
  absl::StatusOr<Tensor> ContiguousHostCopy() const;

  // True when both views have the same dtype, shape and bytes (host only).
  bool BytesEqual(const Tensor& other) const;

  // Identity of the underlying memory (shared between copies of a Tensor);
  // used to stage a tensor reachable under two keys once.
  const void* storage_id() const { return view_.data(); }

 private:
  TensorView view_;
  std::shared_ptr<void> owner_;
};

}  // namespace dcp

#endif  // DCP_CORE_TENSOR_H_
