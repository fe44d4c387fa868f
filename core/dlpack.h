// DLPack import and export (libdlpack-dev, DLPack 0.6), so tensors move
// between dcp and frameworks (PyTorch, JAX, CuPy) without copies.
//
// dtypes: signed/unsigned ints, F16, BF16, F32, F64, C64, C128 map
// directly; BOOL uses code 6 (kDLBool of DLPack >= 0.8, which 0.6's header
// lacks). F8_E4M3 and F8_E5M2 have no code in DLPack 0.6: exporting them is
// kInvalidArgument. Devices: kDLCPU and kDLCUDAHost import as cpu, kDLCUDA
// as cuda:N; other devices are kInvalidArgument.
#ifndef DCP_CORE_DLPACK_H_
#define DCP_CORE_DLPACK_H_

#include <dlpack/dlpack.h>

#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace dcp {

// Exports `tensor` (sharing its memory). The result keeps the memory alive
// until the consumer calls its deleter, which frees the DLManagedTensor.
absl::StatusOr<DLManagedTensor*> ToDLPack(const Tensor& tensor);

// Imports `managed`, taking ownership: its deleter runs once the returned
// Tensor and every copy of it are gone. On error the deleter runs at once.
// Strides and byte_offset are honoured (a strided view stays strided).
absl::StatusOr<Tensor> FromDLPack(DLManagedTensor* managed);

}  // namespace dcp

#endif  // DCP_CORE_DLPACK_H_
