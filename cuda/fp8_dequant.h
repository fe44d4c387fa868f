// Block-scaled fp8 dequantization on a CUDA device: the device-side twin of
// core/fp8_dequant_row.h (same layout and arithmetic, so results are bit
// for bit the CPU path's). No CUDA header here; the kernel lives in
// cuda/fp8_dequant.cu, its host-runtime twin in cuda/fp8_dequant.cc.
//
//   out[r][c] = float(fp8[r][c]) * scales[(row0 + r) / block]
//                                         [(col0 + c) / block]
//
// for a window of `rows` x `cols` elements whose first element sits at row
// `row0`, column `col0` of the quantized matrix (one 2-D slice of the
// weight: a stacked expert tensor is one call per expert).
#ifndef DCP_CUDA_FP8_DEQUANT_H_
#define DCP_CUDA_FP8_DEQUANT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "cuda/device_runtime.h"

namespace dcp {

// What the output elements are.
enum class DequantTarget { kF32, kBF16, kF16 };

// The target writing `dtype`; kInvalidArgument for a dtype other than F32,
// BF16 or F16.
absl::StatusOr<DequantTarget> DequantTargetOf(DType dtype);

struct Fp8BlockDequantArgs {
  const void* fp8 = nullptr;  // Device memory: rows of fp8_row_stride bytes.
  int64_t fp8_row_stride = 0;
  const float* scales = nullptr;  // Device memory: the matrix's scale rows.
  int64_t scale_row_stride = 0;   // Floats per scale row.
  void* out = nullptr;            // Device memory: rows of out_row_stride.
  int64_t out_row_stride = 0;     // Elements per output row (contiguous).
  DequantTarget target = DequantTarget::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row0 = 0;
  int64_t col0 = 0;
  int64_t block = 128;
};

// Enqueues the dequantization of `args` on `stream` of `runtime` and
// returns at once; the buffers must stay valid until the stream passes it.
// On CUDA, `stream`'s device is made current for the launch (CUDA launches
// only onto streams of the current device) and the calling thread's
// current device is given back afterwards; a null stream is the current
// device's legacy default stream.
// On the host runtime ("device" memory is host memory) the same arithmetic
// runs on the calling thread with core/fp8_dequant_row.h, after the work
// enqueued on `stream` so far (a null stream waits for nothing), and has
// finished when this returns; there each buffer must lie inside one
// AllocateDevice allocation (kInvalidArgument otherwise, where CUDA would
// fault). kInvalidArgument for negative sizes or strides or a block < 1,
// the launch error otherwise (later kernel faults surface at the stream's
// next synchronization, as DeviceRuntime says).
absl::Status DequantizeFp8BlocksOnDevice(DeviceRuntime& runtime,
                                         DeviceStream* stream,
                                         const Fp8BlockDequantArgs& args);

}  // namespace dcp

#endif  // DCP_CUDA_FP8_DEQUANT_H_
