#include "capi/internal/dlpack_bridge.h"

#include <climits>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/dlpack.h"

namespace dcp::capi {
namespace {

// DLPack type codes beyond DLPack 0.6's enum.
constexpr uint8_t kDLBoolCode = 6;           // DLPack >= 0.8.
constexpr uint8_t kDLFloat8E4M3FnCode = 10;  // DLPack >= 1.1, as below.
constexpr uint8_t kDLFloat8E4M3FnuzCode = 11;
constexpr uint8_t kDLFloat8E5M2Code = 12;
constexpr uint8_t kDLFloat8E5M2FnuzCode = 13;
constexpr uint8_t kDLFloat8E8M0FnuCode = 14;
constexpr uint8_t kDLFloat4E2M1FnCode = 17;

struct TypeCode {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes = 1;
};

// Indexed by DType.
constexpr TypeCode kTypeCodes[kNumDTypes] = {
    {kDLBoolCode, 8},            // kBool
    {kDLUInt, 8},                // kU8
    {kDLInt, 8},                 // kI8
    {kDLUInt, 16},               // kU16
    {kDLInt, 16},                // kI16
    {kDLUInt, 32},               // kU32
    {kDLInt, 32},                // kI32
    {kDLUInt, 64},               // kU64
    {kDLInt, 64},                // kI64
    {kDLFloat, 16},              // kF16
    {kDLBfloat, 16},             // kBF16
    {kDLFloat, 32},              // kF32
    {kDLFloat, 64},              // kF64
    {kDLFloat8E4M3FnCode, 8},    // kF8E4M3
    {kDLFloat8E5M2Code, 8},      // kF8E5M2
    {kDLComplex, 64},            // kC64
    {kDLComplex, 128},           // kC128
    {kDLFloat8E4M3FnuzCode, 8},  // kF8E4M3FNUZ
    {kDLFloat8E5M2FnuzCode, 8},  // kF8E5M2FNUZ
    {kDLFloat8E8M0FnuCode, 8},   // kF8E8M0
    // kF4E2M1X2: two 4-bit lanes per element, as torch exports
    // float4_e2m1fn_x2.
    {kDLFloat4E2M1FnCode, 4, 2},
    {kDLComplex, 32},  // kC32
};

}  // namespace

absl::StatusOr<DType> DTypeFromDLPack(DLDataType type) {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (kTypeCodes[i].code == type.code && kTypeCodes[i].bits == type.bits &&
        kTypeCodes[i].lanes == type.lanes) {
      return static_cast<DType>(i);
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "DLPack dtype (code ", type.code, ", bits ", type.bits, ", lanes ",
      type.lanes,
      ") is not supported; dcp takes bool, [u]int8..64, float16, bfloat16, "
      "float32, float64, complex32/64/128, float8 e4m3fn, e4m3fnuz, e5m2, "
      "e5m2fnuz, e8m0fnu (codes 10-14, lanes 1) and float4_e2m1fn (code "
      "17, 4 bits, lanes 2)"));
}

DLDataType DLPackFromDType(DType dtype) {
  const TypeCode& code = kTypeCodes[static_cast<int>(dtype)];
  return DLDataType{code.code, code.bits, code.lanes};
}

absl::StatusOr<Device> DeviceFromDLPack(DLDevice device) {
  switch (device.device_type) {
    case kDLCPU:
    case kDLCUDAHost:
      return Device::Cpu();
    case kDLCUDA:
      if (device.device_id < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "DLPack CUDA device id ", device.device_id, " is negative"));
      }
      return Device::Cuda(device.device_id);
    default:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("DLPack device type ", static_cast<int>(device.device_type),
                   " is not supported; dcp takes kDLCPU (1), kDLCUDA (2) and "
                   "kDLCUDAHost (3)"));
}

absl::StatusOr<TensorView> ViewOfDLTensor(const DLTensor& tensor) {
  absl::StatusOr<DType> dtype = DTypeFromDLPack(tensor.dtype);
  if (!dtype.ok()) return dtype.status();
  absl::StatusOr<Device> device = DeviceFromDLPack(tensor.device);
  if (!device.ok()) return device.status();
  if (tensor.ndim < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DLPack tensor has ndim ", tensor.ndim));
  }
  if (tensor.ndim > 0 && tensor.shape == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DLPack tensor of ndim ", tensor.ndim, " has a NULL shape"));
  }
  Shape sizes(tensor.shape, tensor.shape + tensor.ndim);
  const std::optional<int64_t> numel = CheckedNumElements(sizes);
  if (!numel.has_value() || !CheckedNumBytes(*dtype, sizes).has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("DLPack tensor shape ", ShapeToString(sizes),
                     " has a negative size or too many bytes"));
  }
  // Contiguous strides of a shape whose bytes fit in 64 bits fit too.
  Shape strides = tensor.strides != nullptr
                      ? Shape(tensor.strides, tensor.strides + tensor.ndim)
                      : ContiguousStrides(sizes);
  // The last element's offset, in elements, must fit in bytes too (an
  // empty tensor spans none).
  int64_t last = 0;
  for (int d = 0; d < tensor.ndim; ++d) {
    if (strides[d] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("DLPack tensor strides ", ShapeToString(strides),
                       " have a negative stride"));
    }
    int64_t step = 0;
    if (*numel > 0 &&
        (__builtin_mul_overflow(sizes[d] - 1, strides[d], &step) ||
         __builtin_add_overflow(last, step, &last))) {
      last = -1;
      break;
    }
  }
  int64_t count = 0;
  int64_t extent = 0;
  if (last < 0 || __builtin_add_overflow(last, *numel > 0, &count) ||
      __builtin_mul_overflow(count, static_cast<int64_t>(ElementSize(*dtype)),
                             &extent) ||
      tensor.byte_offset > static_cast<uint64_t>(INT64_MAX - extent)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DLPack tensor shape ", ShapeToString(sizes), " with strides ",
        ShapeToString(strides), " and byte_offset ", tensor.byte_offset,
        " spans more bytes than fit in 64 bits"));
  }
  if (*numel > 0 && tensor.data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DLPack tensor of shape ", ShapeToString(sizes), " has NULL data"));
  }
  void* data = tensor.data == nullptr
                   ? nullptr
                   : static_cast<char*>(tensor.data) + tensor.byte_offset;
  return TensorView(data, *dtype, std::move(sizes), std::move(strides),
                    *device);
}

absl::StatusOr<DLManagedTensor*> ExportDLPack(const Tensor& tensor) {
  // core/dlpack.h exports DLPack 0.6's codes: a float8 or float4 tensor
  // goes out as U8 (same size), kept alive by a copy of `tensor`, and gets
  // its code here.
  const DLDataType type = DLPackFromDType(tensor.dtype());
  Tensor exported = tensor;
  if (ElementSize(tensor.dtype()) == 1 && type.code >= kDLFloat8E4M3FnCode) {
    const TensorView& v = tensor.view();
    exported = Tensor::WithOwner(
        TensorView(v.data(), DType::kU8, v.sizes(), v.strides(), v.device()),
        std::make_shared<Tensor>(tensor));
  }
  absl::StatusOr<DLManagedTensor*> managed = ToDLPack(exported);
  if (managed.ok()) (*managed)->dl_tensor.dtype = type;
  return managed;
}

}  // namespace dcp::capi
