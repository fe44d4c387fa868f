// Loading into device tensors: the part of a box that lies in a window of a
// stored chunk (verified host bytes) goes to a destination in device memory.
// The box elements of the window are gathered, in the box's row-major order,
// into chunks of a DeviceStaging pool; each chunk is then copied to
// the device as the runs of elements that are adjacent in the destination
// (one run for a row-sharded or whole contiguous tensor, one per row of a
// column shard), and returns to the pool when its copies have landed.
//
// The copies are asynchronous: the bytes are in device memory only after
// DeviceStaging::Flush() returned OK.
#ifndef DCP_STAGING_DEVICE_BOX_UPLOAD_H_
#define DCP_STAGING_DEVICE_BOX_UPLOAD_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/tensor.h"

namespace dcp {

class DeviceStaging;  // staging/device_staging.h

// As CopyBoxPart (core/box_copy.h) for a destination `dst` in device memory:
// the box elements among chunk elements [begin, end) held at `window`.
// Blocks while every pool chunk is busy. kInvalidArgument as CopyBoxPart;
// the staging's error when its pool or a copy fails.
absl::Status UploadBoxPart(DeviceStaging& staging, const std::byte* window,
                           int64_t begin, int64_t end,
                           absl::Span<const int64_t> src_sizes,
                           absl::Span<const int64_t> src_offsets,
                           size_t element_size, const TensorView& dst,
                           absl::Span<const int64_t> dst_offsets,
                           absl::Span<const int64_t> lengths);

// Converts the contiguous row-major array `src` of `from` elements, shaped
// as `dst`, into `dst`, a tensor in device memory with any strides (as
// ConvertInto, core/dtype_convert.h, does for host tensors): the elements
// are converted on the calling thread into chunks of the staging's pool and
// each chunk is copied to the device as the runs adjacent in `dst`. `src`
// may be freed once this returns; the values are in device memory only after
// DeviceStaging::Flush() returned OK. Blocks while every pool chunk is busy.
// kInvalidArgument when either dtype is not IsConvertibleFloat or `dst` is
// host memory; the staging's error when its pool or a copy fails.
absl::Status ConvertUpload(DeviceStaging& staging, const std::byte* src,
                           DType from, const TensorView& dst);

// `view` as host memory (same pointer, shape and strides, CPU device): for
// checking a device destination's box with the host box copy's checks.
TensorView AsHostView(const TensorView& view);

}  // namespace dcp

#endif  // DCP_STAGING_DEVICE_BOX_UPLOAD_H_
