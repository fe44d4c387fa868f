// DLPack <-> dcp tensors for the C ABI (dcp/dcp.h): the dtype map of the
// header (DLPack 0.6's codes, kDLBool = 6, and DLPack 1.1's float8 codes
// kDLFloat8_e4m3fn = 10 -> F8_E4M3 and kDLFloat8_e5m2 = 12 -> F8_E5M2) and
// the device map (kDLCPU and kDLCUDAHost -> cpu, kDLCUDA -> cuda:N).
// core/dlpack.h knows only DLPack 0.6's codes, hence this bridge.
//
// Thread safety: the functions are pure.
#ifndef DCP_CAPI_INTERNAL_DLPACK_BRIDGE_H_
#define DCP_CAPI_INTERNAL_DLPACK_BRIDGE_H_

#include <dlpack/dlpack.h>

#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace dcp::capi {

// kInvalidArgument naming the code, bits and lanes for any other type.
absl::StatusOr<DType> DTypeFromDLPack(DLDataType type);
DLDataType DLPackFromDType(DType dtype);

// kInvalidArgument naming the device type for devices other than the three.
absl::StatusOr<Device> DeviceFromDLPack(DLDevice device);

// A view of the memory `tensor` describes: byte_offset applied, strides (in
// elements) honoured, contiguous when strides is NULL. The memory is not
// touched. kInvalidArgument for an unknown dtype or device, a negative ndim,
// size or stride, a NULL shape (ndim > 0) or data (elements > 0), or an
// extent whose byte count overflows int64_t. Messages do not name the
// tensor: the caller adds its path.
absl::StatusOr<TensorView> ViewOfDLTensor(const DLTensor& tensor);

// Exports `tensor` as a legacy DLManagedTensor sharing its memory, which
// the result keeps alive until its deleter runs (the deleter frees the
// DLManagedTensor too). Float8 tensors carry DLPack 1.1's codes.
absl::StatusOr<DLManagedTensor*> ExportDLPack(const Tensor& tensor);

}  // namespace dcp::capi

#endif  // DCP_CAPI_INTERNAL_DLPACK_BRIDGE_H_
