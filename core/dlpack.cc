#include "core/dlpack.h"

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dcp {
namespace {

constexpr uint8_t kDLBoolCode = 6;  // kDLBool in DLPack >= 0.8.

struct Code {
  uint8_t code;
  uint8_t bits;
};

absl::StatusOr<Code> ToCode(DType dtype) {
  switch (dtype) {
    case DType::kBool:
      return Code{kDLBoolCode, 8};
    case DType::kU8:
      return Code{kDLUInt, 8};
    case DType::kI8:
      return Code{kDLInt, 8};
    case DType::kU16:
      return Code{kDLUInt, 16};
    case DType::kI16:
      return Code{kDLInt, 16};
    case DType::kU32:
      return Code{kDLUInt, 32};
    case DType::kI32:
      return Code{kDLInt, 32};
    case DType::kU64:
      return Code{kDLUInt, 64};
    case DType::kI64:
      return Code{kDLInt, 64};
    case DType::kF16:
      return Code{kDLFloat, 16};
    case DType::kBF16:
      return Code{kDLBfloat, 16};
    case DType::kF32:
      return Code{kDLFloat, 32};
    case DType::kF64:
      return Code{kDLFloat, 64};
    case DType::kC64:
      return Code{kDLComplex, 64};
    case DType::kC128:
      return Code{kDLComplex, 128};
    case DType::kC32:
      return Code{kDLComplex, 32};
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kF8E4M3FNUZ:
    case DType::kF8E5M2FNUZ:
    case DType::kF8E8M0:
    case DType::kF4E2M1X2:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("dtype ", DTypeName(dtype), " has no DLPack 0.6 type code"));
}

absl::StatusOr<DType> FromCode(const DLDataType& t) {
  if (t.lanes != 1) {
    return absl::InvalidArgumentError(absl::StrCat("DLPack tensors with ",
                                                   t.lanes,
                                                   " lanes are not "
                                                   "supported"));
  }
  for (int i = 0; i < kNumDTypes; ++i) {
    const DType dtype = static_cast<DType>(i);
    absl::StatusOr<Code> code = ToCode(dtype);
    if (code.ok() && code->code == t.code && code->bits == t.bits) return dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("DLPack dtype code ", t.code,
                                                 " with ", t.bits,
                                                 " bits is not supported"));
}

// What an exported DLManagedTensor owns besides itself.
struct ExportContext {
  Tensor tensor;  // Keeps the memory alive.
  Shape shape;
  Shape strides;
};

}  // namespace

absl::StatusOr<DLManagedTensor*> ToDLPack(const Tensor& tensor) {
  absl::StatusOr<Code> code = ToCode(tensor.dtype());
  if (!code.ok()) return code.status();
  auto context = std::make_unique<ExportContext>();
  context->tensor = tensor;
  context->shape = tensor.sizes();
  context->strides = tensor.view().strides();
  auto managed = std::make_unique<DLManagedTensor>();
  DLTensor& dl = managed->dl_tensor;
  dl.data = tensor.data();
  dl.device = tensor.device().is_cuda()
                  ? DLDevice{kDLCUDA, tensor.device().index}
                  : DLDevice{kDLCPU, 0};
  dl.ndim = static_cast<int>(context->shape.size());
  dl.dtype = DLDataType{code->code, code->bits, 1};
  dl.shape = context->shape.data();
  dl.strides = context->strides.data();
  dl.byte_offset = 0;
  managed->manager_ctx = context.release();
  managed->deleter = [](DLManagedTensor* self) {
    delete static_cast<ExportContext*>(self->manager_ctx);
    delete self;
  };
  return managed.release();
}

absl::StatusOr<Tensor> FromDLPack(DLManagedTensor* managed) {
  if (managed == nullptr) {
    return absl::InvalidArgumentError("FromDLPack of a null tensor");
  }
  std::shared_ptr<void> owner(managed, [](void* p) {
    auto* m = static_cast<DLManagedTensor*>(p);
    if (m->deleter != nullptr) m->deleter(m);
  });
  const DLTensor& dl = managed->dl_tensor;
  absl::StatusOr<DType> dtype = FromCode(dl.dtype);
  if (!dtype.ok()) return dtype.status();
  Device device;
  switch (dl.device.device_type) {
    case kDLCPU:
    case kDLCUDAHost:
      device = Device::Cpu();
      break;
    case kDLCUDA:
      device = Device::Cuda(dl.device.device_id);
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "DLPack device type ", dl.device.device_type, " is not supported"));
  }
  if (dl.ndim < 0 || (dl.ndim > 0 && dl.shape == nullptr)) {
    return absl::InvalidArgumentError("DLPack tensor has no shape");
  }
  Shape sizes(dl.shape, dl.shape + dl.ndim);
  Shape strides = dl.strides != nullptr
                      ? Shape(dl.strides, dl.strides + dl.ndim)
                      : ContiguousStrides(sizes);
  void* data = static_cast<char*>(dl.data) + dl.byte_offset;
  return Tensor::WithOwner(
      TensorView(data, *dtype, std::move(sizes), std::move(strides), device),
      std::move(owner));
}

}  // namespace dcp
