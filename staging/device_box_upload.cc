#include "staging/device_box_upload.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/box_copy.h"
#include "core/dtype_convert.h"
#include "core/status.h"
#include "staging/device_staging.h"

namespace dcp {
namespace {

// Elements of the box that are adjacent in the destination from any box
// index that is a multiple of it: the trailing dimensions whose destination
// stride equals the element count of the dimensions inside them (length-1
// dimensions never step, so they never break a run).
int64_t ContiguousRun(const TensorView& dst,
                      absl::Span<const int64_t> lengths) {
  int64_t run = 1;
  for (size_t d = lengths.size(); d-- > 0;) {
    if (lengths[d] == 1) continue;
    if (dst.strides()[d] != run) break;
    run *= lengths[d];
  }
  return run;
}

// The upload runs of box elements [b, b + n) (row-major over `lengths`),
// held contiguously from the chunk's start, into `dst` at `dst_offsets`:
// `run` elements (ContiguousRun) adjacent in `dst` at a time.
void RunsOfBox(const TensorView& dst, absl::Span<const int64_t> dst_offsets,
               absl::Span<const int64_t> lengths, int64_t run, int64_t b,
               int64_t n, std::vector<UploadRun>& runs) {
  const int64_t es = static_cast<int64_t>(ElementSize(dst.dtype()));
  const Shape& strides = dst.strides();
  auto* base = static_cast<std::byte*>(dst.data());
  runs.clear();
  for (int64_t x = b; x < b + n;) {
    const int64_t take = std::min(run - x % run, b + n - x);
    const Shape coords = RowMajorCoordinates(x, lengths);
    int64_t at = 0;
    for (size_t d = 0; d < coords.size(); ++d) {
      at += (dst_offsets[d] + coords[d]) * strides[d];
    }
    runs.push_back({static_cast<size_t>((x - b) * es),
                    static_cast<size_t>(take * es), base + at * es});
    x += take;
  }
}

}  // namespace

TensorView AsHostView(const TensorView& view) {
  return TensorView(view.data(), view.dtype(), view.sizes(), view.strides(),
                    Device{});
}

absl::Status UploadBoxPart(DeviceStaging& staging, const std::byte* window,
                           int64_t begin, int64_t end,
                           absl::Span<const int64_t> src_sizes,
                           absl::Span<const int64_t> src_offsets,
                           size_t element_size, const TensorView& dst,
                           absl::Span<const int64_t> dst_offsets,
                           absl::Span<const int64_t> lengths) {
  if (!dst.device().is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "UploadBoxPart: destination is on ", dst.device().ToString(),
        "; host destinations take CopyBoxPart"));
  }
  // The host copy's checks of ranks, element size and bounds.
  DCP_RETURN_IF_ERROR(CopyBoxPart(nullptr, 0, 0, src_sizes, src_offsets,
                                  element_size, AsHostView(dst), dst_offsets,
                                  lengths));
  if (begin < 0 || end < begin || end > NumElements(src_sizes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("window [", begin, ", ", end, ") outside a chunk of ",
                     NumElements(src_sizes), " elements"));
  }
  const int64_t first =
      BoxElementsBefore(src_sizes, src_offsets, lengths, begin);
  const int64_t last = BoxElementsBefore(src_sizes, src_offsets, lengths, end);
  if (first == last) return absl::OkStatus();

  DCP_ASSIGN_OR_RETURN(HostBufferPool * pool, staging.Pool());
  const int64_t es = static_cast<int64_t>(element_size);
  const int64_t per_chunk = static_cast<int64_t>(pool->chunk_bytes()) / es;
  if (per_chunk == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("elements of ", es, " bytes exceed the staging chunk of ",
                     pool->chunk_bytes(), " bytes"));
  }
  // Box elements are consecutive in the chunk along the box's last
  // dimension; `row` of them at a time.
  const int64_t row = lengths.empty() ? 1 : lengths.back();
  const int64_t run = ContiguousRun(dst, lengths);
  std::vector<UploadRun> runs;
  for (int64_t b = first; b < last;) {
    const int64_t n = std::min(per_chunk, last - b);
    DCP_ASSIGN_OR_RETURN(PoolChunk chunk, staging.AcquireChunk());
    // Gather box elements [b, b + n) in box order.
    for (int64_t x = b; x < b + n;) {
      const int64_t take = std::min(row - x % row, b + n - x);
      const int64_t e =
          ChunkElementOfBoxElement(src_sizes, src_offsets, lengths, x);
      std::memcpy(chunk.data() + (x - b) * es, window + (e - begin) * es,
                  take * es);
      x += take;
    }
    // Copy them out as runs adjacent in the destination.
    RunsOfBox(dst, dst_offsets, lengths, run, b, n, runs);
    DCP_RETURN_IF_ERROR(
        staging.UploadRuns(std::move(chunk), runs, dst.device()));
    b += n;
  }
  return absl::OkStatus();
}

absl::Status ConvertUpload(DeviceStaging& staging, const std::byte* src,
                           DType from, const TensorView& dst) {
  if (!IsConvertibleFloat(from) || !IsConvertibleFloat(dst.dtype())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot convert ", DTypeName(from), " to ", DTypeName(dst.dtype()),
        ": only F64, F32, BF16 and F16 convert"));
  }
  if (!dst.device().is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ConvertUpload: destination is on ", dst.device().ToString(),
        "; host destinations take ConvertInto"));
  }
  const int64_t numel = dst.numel();
  if (numel == 0) return absl::OkStatus();
  DCP_ASSIGN_OR_RETURN(HostBufferPool * pool, staging.Pool());
  const int64_t in = static_cast<int64_t>(ElementSize(from));
  const int64_t out = static_cast<int64_t>(ElementSize(dst.dtype()));
  const int64_t per_chunk = static_cast<int64_t>(pool->chunk_bytes()) / out;
  if (per_chunk == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("elements of ", out, " bytes exceed the staging chunk of ",
                     pool->chunk_bytes(), " bytes"));
  }
  const Shape& sizes = dst.sizes();
  const int64_t run = ContiguousRun(dst, sizes);
  const Shape zeros(sizes.size(), 0);
  std::vector<UploadRun> runs;
  for (int64_t b = 0; b < numel;) {
    const int64_t n = std::min(per_chunk, numel - b);
    DCP_ASSIGN_OR_RETURN(PoolChunk chunk, staging.AcquireChunk());
    ConvertElements(src + b * in, from, n, chunk.data(), dst.dtype());
    RunsOfBox(dst, zeros, sizes, run, b, n, runs);
    DCP_RETURN_IF_ERROR(
        staging.UploadRuns(std::move(chunk), runs, dst.device()));
    b += n;
  }
  return absl::OkStatus();
}

}  // namespace dcp
