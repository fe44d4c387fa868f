#include "io/fs_file_writer.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/checksum.h"
#include "core/status.h"
#include "core/tensor.h"
#include "io/fs_encoded_writer.h"
#include "io/fs_layout.h"
#include "io/safetensors.h"
#include "staging/device_staging.h"

namespace dcp::internal_fs {
namespace {

using internal_io::AlignedBuffer;
using internal_io::AlignUp;
using internal_io::kDirectIoAlignment;

// An item resolved to the bytes to write.
struct ResolvedItem {
  const std::byte* bytes = nullptr;
  int64_t length = 0;
  bool tensor = false;
  bool on_device = false;
};

// A contiguous host copy of the strided device view `view`: the bytes it
// spans are staged to the host through the context's staging (ordered after
// the caller's work, context.device_wait, like every device copy of the
// save), then gathered there.
absl::StatusOr<Tensor> GatherDeviceView(const DataFileContext& context,
                                        const TensorView& view,
                                        const std::string& name) {
  size_t span = 1;
  for (int64_t d = 0; d < view.dim(); ++d) {
    if (view.sizes()[d] == 0) return Tensor::Empty(view.dtype(), view.sizes());
    span += static_cast<size_t>(view.sizes()[d] - 1) *
            static_cast<size_t>(view.strides()[d]);
  }
  const size_t bytes = span * ElementSize(view.dtype());
  DCP_ASSIGN_OR_RETURN(DeviceStaging * staging, context.staging());
  Tensor covering = Tensor::Empty(DType::kU8, {static_cast<int64_t>(bytes)});
  PipelineItem item;
  item.source = TensorView(view.data(), DType::kU8,
                           {static_cast<int64_t>(bytes)}, view.device());
  item.name = name;
  auto* out = static_cast<std::byte*>(covering.data());
  DCP_RETURN_IF_ERROR(staging->Stage(
      {&item, 1},
      [out](StagedPiece piece) -> absl::Status {
        if (piece.length > 0) {
          std::memcpy(out + piece.offset, piece.chunk.data(), piece.length);
        }
        return absl::OkStatus();
      },
      context.device_wait));
  return Tensor::Wrap(TensorView(covering.data(), view.dtype(), view.sizes(),
                                 view.strides(), Device::Cpu()))
      .ContiguousHostCopy();
}

// Resolves every item through the planner into `held` (which keeps the
// values alive) and describes it in `resolved`. Strided tensors are
// gathered into contiguous host copies (device ones through the staging).
absl::Status ResolveItems(const DataFileContext& context,
                          const std::vector<const WriteItem*>& items,
                          SavePlanner& planner,
                          std::vector<dcp::WriteValue>& held,
                          std::vector<ResolvedItem>& resolved) {
  const int rank = context.rank;
  held.reserve(items.size());
  resolved.resize(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const WriteItem& item = *items[i];
    absl::StatusOr<dcp::WriteValue> value = planner.ResolveData(item);
    if (!value.ok()) {
      return Annotate(
          value.status(),
          absl::StrCat("rank ", rank, ": resolving ", item.index.ToString()));
    }
    held.push_back(*std::move(value));
    ResolvedItem& r = resolved[i];
    if (Tensor* strided = std::get_if<Tensor>(&held.back());
        strided != nullptr && !strided->view().is_contiguous()) {
      // A strided view (a transposed weight, a slice) is gathered into a
      // contiguous host copy that lives as long as `held`; a device one is
      // then written as a host item.
      absl::StatusOr<Tensor> gathered =
          strided->device().is_cpu()
              ? strided->ContiguousHostCopy()
              : GatherDeviceView(context, strided->view(),
                                 item.index.ToString());
      if (!gathered.ok()) {
        return Annotate(
            gathered.status(),
            absl::StrCat("rank ", rank, ": gathering ", item.index.ToString()));
      }
      held.back() = *std::move(gathered);
    }
    if (const Tensor* tensor = std::get_if<Tensor>(&held.back())) {
      r.bytes = static_cast<const std::byte*>(tensor->data());
      r.length = static_cast<int64_t>(tensor->nbytes());
      if (r.length != item.StorageBytes()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", rank, ": tensor ", item.index.ToString(), " resolved to ",
            r.length, " bytes, the plan says ", item.StorageBytes()));
      }
      r.tensor = true;
      r.on_device = !tensor->device().is_cpu();
    } else {
      const std::string& value = std::get<std::string>(held.back());
      r.bytes = reinterpret_cast<const std::byte*>(value.data());
      r.length = static_cast<int64_t>(value.size());
    }
  }
  return absl::OkStatus();
}

// Streams the device tensors `device_items` through pinned staging chunks
// into `queue`: each piece is written straight from its chunk (aligned:
// O_DIRECT needs no bounce; the last piece is zero-padded to a whole
// block) while the next is copied, and the chunk returns to the pool when
// its write completes. The pool bounds the memory, whatever the tensors'
// size. Fills the items' block checksums.
absl::Status WriteDeviceItems(const DataFileContext& context,
                              const std::string& path,
                              const std::vector<PipelineItem>& device_items,
                              const std::vector<WriteResult*>& results,
                              FileWriteQueue& queue) {
  absl::StatusOr<DeviceStaging*> staging = context.staging();
  if (!staging.ok()) {
    return Annotate(staging.status(), absl::StrCat("rank ", context.rank));
  }
  BlockChecksummer checksums(context.checksum_block_size);
  absl::Status status = (*staging)->Stage(
      device_items,
      [&](StagedPiece piece) -> absl::Status {
        if (queue.failed()) {
          return absl::AbortedError("an earlier write of this file failed");
        }
        const size_t i = piece.destination;
        checksums.Update(piece.chunk.data(),
                         static_cast<int64_t>(piece.length));
        if (piece.length > 0) {
          size_t length = piece.length;
          if (context.direct_io) {
            length = AlignUp(length, kDirectIoAlignment);
            std::memset(piece.chunk.data() + piece.length, 0,
                        length - piece.length);
          }
          auto lease = std::make_shared<PoolChunk>(std::move(piece.chunk));
          queue
              .Write(i, results[i]->storage_data.offset + piece.offset,
                     lease->data(), length)
              .OnReady([lease](const absl::Status&) { lease->Release(); });
        }
        if (piece.last) {
          results[i]->storage_data.block_checksums = checksums.Finish();
        }
        return absl::OkStatus();
      },
      context.device_wait);
  // A failed write stopped the pipeline: its own error (ENOSPC, EIO) is
  // reported with the others.
  if (status.ok() || queue.failed()) return absl::OkStatus();
  return Annotate(
      status, absl::StrCat("rank ", context.rank, ": staging ",
                           device_items.size(), " device tensor(s) of ", path));
}

// The safetensors name of item `item`: its fqn for a bytes value or a whole
// tensor, else `fqn@o0,o1,...` (the chunk's offsets).
std::string SafetensorsName(const WriteItem& item) {
  if (!item.tensor_data.has_value()) return item.index.fqn;
  const TensorWriteData& data = *item.tensor_data;
  if (data.chunk.sizes == data.size &&
      std::all_of(data.chunk.offsets.begin(), data.chunk.offsets.end(),
                  [](int64_t o) { return o == 0; })) {
    return item.index.fqn;
  }
  return absl::StrCat(item.index.fqn, "@",
                      absl::StrJoin(data.chunk.offsets, ","));
}

// Lays out a safetensors data file: the header (returned, padded so the data
// starts kDirectIoAlignment-aligned), then the items back to back in plan
// order, tensors as their dtype and chunk shape, bytes values as 1-D U8.
// kInvalidArgument for what the format cannot hold (a dtype it lacks, a
// duplicate or empty name).
absl::StatusOr<std::string> SafetensorsLayout(
    const std::vector<const WriteItem*>& items,
    const std::vector<ResolvedItem>& resolved, FileLayout& layout) {
  std::vector<SafetensorsTensor> tensors(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const WriteItem& item = *items[i];
    SafetensorsTensor& t = tensors[i];
    t.name = SafetensorsName(item);
    if (resolved[i].tensor && item.tensor_data.has_value()) {
      t.dtype = item.tensor_data->properties.dtype;
      t.shape = item.tensor_data->chunk.sizes;
    } else {
      t.dtype = DType::kU8;
      t.shape = {resolved[i].length};
    }
  }
  DCP_ASSIGN_OR_RETURN(
      std::string header,
      EncodeSafetensorsHeader(tensors, {{"format", "pt"}}, kDirectIoAlignment));
  const int64_t start = static_cast<int64_t>(header.size());
  layout.offset.resize(items.size());
  layout.pack.assign(items.size(), -1);
  layout.end = start;
  for (size_t i = 0; i < items.size(); ++i) {
    if (tensors[i].end - tensors[i].begin != resolved[i].length) {
      return absl::InvalidArgumentError(
          absl::StrCat("item ", items[i]->index.ToString(), " holds ",
                       resolved[i].length, " bytes, its dtype and shape say ",
                       tensors[i].end - tensors[i].begin));
    }
    layout.offset[i] = start + tensors[i].begin;
    layout.end = std::max(layout.end, start + tensors[i].end);
  }
  return header;
}

}  // namespace

FileWriteQueue::FileWriteQueue(IoEngine& engine, File& file,
                               int64_t writeback_bytes)
    : engine_(engine),
      file_(file),
      writeback_bytes_(writeback_bytes),
      failed_(std::make_shared<std::atomic<bool>>(false)) {}

FileWriteQueue::~FileWriteQueue() { WaitForWrites(); }

void FileWriteQueue::Track(size_t item, Future<size_t> f) {
  f.OnReady([failed = failed_](const absl::StatusOr<size_t>& r) {
    if (!r.ok()) failed->store(true);
  });
  futures_.push_back(std::move(f));
  future_item_.push_back(item);
}

Future<void> FileWriteQueue::Write(size_t item, int64_t offset,
                                   const std::byte* data, size_t length) {
  std::vector<Future<size_t>> pieces;
  if (writeback_bytes_ <= 0) {
    Track(item,
          engine_.Submit({IoRequest::Write(&file_, offset, data, length)})[0]);
    pieces.push_back(futures_.back());
    return WhenAll(pieces);
  }
  for (size_t pos = 0; pos < length;) {
    const int64_t at = offset + static_cast<int64_t>(pos);
    const size_t n = std::min<size_t>(
        length - pos,
        static_cast<size_t>(std::max<int64_t>(
            written_back_ + writeback_bytes_ - at, kDirectIoAlignment)));
    Track(item,
          engine_.Submit({IoRequest::Write(&file_, at, data + pos, n)})[0]);
    pieces.push_back(futures_.back());
    pos += n;
    const int64_t end = at + static_cast<int64_t>(n);
    if (end - written_back_ >= writeback_bytes_) {
      Track(item, engine_.Submit({IoRequest::Writeback(
                      &file_, written_back_,
                      static_cast<size_t>(end - written_back_))})[0]);
      written_back_ = end;
      writebacks_.push_back(futures_.back());
      while (writebacks_.size() > kWritebacksAhead) {
        writebacks_.front().Wait();  // Its error is seen with the others.
        writebacks_.pop_front();
      }
    }
  }
  return WhenAll(pieces);
}

AlignedBuffer* FileWriteQueue::TakeBounce(int64_t size) {
  // Sizes within an eighth of a power of two share a capacity.
  const int64_t wanted = std::max(size, kMinBounceCapacity);
  const int64_t capacity = AlignUp(
      wanted,
      static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(wanted)) / 8));
  // Buffers whose writes completed become spares (their errors are seen
  // with the others at Finish).
  auto retire_oldest = [&] {
    bounce_.front().written.Wait();
    spare_.push_back(std::move(bounce_.front().buffer));
    bounce_.pop_front();
  };
  while (!bounce_.empty() && bounce_.front().written.ready()) retire_oldest();
  std::unique_ptr<AlignedBuffer> buffer;
  while (buffer == nullptr) {
    auto same = std::find_if(spare_.begin(), spare_.end(), [&](const auto& b) {
      return b->size == capacity;
    });
    if (same != spare_.end()) {
      buffer = std::move(*same);
      spare_.erase(same);
    } else if (bounce_bytes_ + capacity <= kBounceBudget ||
               (spare_.empty() && bounce_.empty())) {
      buffer = std::make_unique<AlignedBuffer>(capacity);
      bounce_bytes_ += capacity;
    } else if (!spare_.empty()) {
      bounce_bytes_ -= spare_.back()->size;  // Of another capacity.
      spare_.pop_back();
    } else {
      retire_oldest();
    }
  }
  bounce_.push_back({std::move(buffer), Future<void>()});
  return bounce_.back().buffer.get();
}

void FileWriteQueue::SetBounceWritten(Future<void> written) {
  bounce_.back().written = std::move(written);
}

void FileWriteQueue::WaitForWrites() {
  for (Future<size_t>& f : futures_) f.Wait();
}

void FileWriteQueue::Fsync() {
  Track(SIZE_MAX, engine_.Submit({IoRequest::Fsync(&file_)})[0]);
}

absl::Status FileWriteQueue::Finish(
    int rank, absl::FunctionRef<std::string(size_t item)> describe) {
  internal_io::FirstError error;
  for (size_t f = 0; f < futures_.size(); ++f) {
    const absl::StatusOr<size_t>& r = futures_[f].Wait();
    if (r.ok() || error.failed()) continue;
    error.Update(
        Annotate(r.status(), future_item_[f] == SIZE_MAX
                                 ? absl::StrCat("rank ", rank)
                                 : absl::StrCat("rank ", rank, ": writing ",
                                                describe(future_item_[f]))));
  }
  return error.status();
}

absl::Status WriteDataFile(const DataFileContext& context,
                           const std::string& relative_path,
                           const std::vector<const WriteItem*>& items,
                           SavePlanner& planner,
                           const std::vector<WriteResult*>& results) {
  const std::string rank_note = absl::StrCat("rank ", context.rank);
  const std::string path = JoinPath(context.dir, relative_path);
  OpenOptions open_options;
  open_options.direct = context.direct_io;
  open_options.uncached = context.uncached_writes;
  absl::StatusOr<std::unique_ptr<File>> opened =
      context.fs->OpenForWrite(path, open_options);
  if (!opened.ok()) return Annotate(opened.status(), rank_note);
  std::unique_ptr<File> file = *std::move(opened);
  context.record_created(path);
  // Every item resolved first: whether it is on the device and how long it
  // is decide where it goes.
  std::vector<dcp::WriteValue> held;
  std::vector<ResolvedItem> resolved;
  DCP_RETURN_IF_ERROR(ResolveItems(context, items, planner, held, resolved));
  // Host tensors too large to pack go through the extensions, if any. Their
  // stored size is known once they are encoded: they follow the laid-out
  // items, each from an aligned offset, within a reservation of their raw
  // size (which they never exceed).
  std::vector<bool> encode(items.size(), false);
  int64_t encoded_reserve = 0;
  for (size_t i = 0; i < items.size() && !context.extensions.empty(); ++i) {
    encode[i] = resolved[i].tensor && !resolved[i].on_device &&
                resolved[i].length > kPackItemBytes;
    if (encode[i]) {
      encoded_reserve += AlignUp(resolved[i].length, kDirectIoAlignment);
    }
  }
  std::vector<LayoutItem> layout_items(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    layout_items[i] = {encode[i] ? 0 : resolved[i].length, resolved[i].tensor,
                       resolved[i].on_device};
  }
  std::string safetensors_header;  // Written at offset 0; outlives `queue`.
  FileLayout layout;
  if (context.safetensors) {
    if (context.direct_io || !context.extensions.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(rank_note,
                       ": a safetensors data file is written buffered and "
                       "without extensions"));
    }
    absl::StatusOr<std::string> header =
        SafetensorsLayout(items, resolved, layout);
    if (!header.ok()) return Annotate(header.status(), rank_note);
    safetensors_header = *std::move(header);
  } else {
    layout = LayOutFile(layout_items, context.direct_io);
  }
  const int64_t reserved = layout.end + encoded_reserve;
  // Only for O_DIRECT: buffered writes gain nothing from it on ext4
  // (delayed allocation lays the file out at writeback), and on tmpfs
  // fallocate zeroes every page before the write copies over it.
  const bool preallocate = file->direct();
  if (preallocate) {
    DCP_RETURN_IF_ERROR(Annotate(file->Preallocate(reserved), rank_note));
  }

  // Declared after `held` and `file`: its destructor waits for the writes
  // reading from them.
  FileWriteQueue queue(
      *context.engine, *file,
      context.sync_files && !file->direct() ? context.writeback_bytes : 0);
  std::vector<PipelineItem> device_items;  // Staged after the host items.
  // The open pack's buffer, written once its last item is in. Its gaps
  // (alignment between items, padding after the last) read as zeros: the
  // bytes below `pack_filled` hold items or zeros.
  AlignedBuffer* pack_buffer = nullptr;
  int open_pack = -1;
  int64_t pack_filled = 0;
  auto flush_pack = [&]() {
    if (open_pack < 0) return;
    const FilePack& pack = layout.packs[open_pack];
    const int64_t length =
        context.direct_io ? AlignUp(pack.used, kDirectIoAlignment) : pack.used;
    std::memset(pack_buffer->data + pack_filled, 0, length - pack_filled);
    queue.SetBounceWritten(
        queue.Write(pack.first_item, pack.start, pack_buffer->data, length));
    open_pack = -1;
    pack_buffer = nullptr;
  };
  if (!safetensors_header.empty()) {
    queue.Write(SIZE_MAX, 0,
                reinterpret_cast<const std::byte*>(safetensors_header.data()),
                safetensors_header.size());
  }
  int64_t offset = 0;
  for (size_t i = 0; i < items.size() && !queue.failed(); ++i) {
    const WriteItem& item = *items[i];
    const std::byte* bytes = resolved[i].bytes;
    const int64_t length = resolved[i].length;
    offset = layout.offset[i];
    WriteResult& result = *results[i];
    result.index = item.index;
    result.size_in_bytes = length;
    result.storage_data.relative_path = relative_path;
    result.storage_data.offset = offset;
    result.storage_data.length = length;
    if (encode[i]) continue;  // Written below.
    if (resolved[i].on_device) {
      device_items.push_back(
          {std::get<Tensor>(held[i]).view(), i, item.index.ToString()});
      offset += length;
      continue;
    }
    if (layout.pack[i] >= 0) {
      if (layout.pack[i] != open_pack) {
        flush_pack();
        open_pack = layout.pack[i];
        pack_buffer = queue.TakeBounce(
            AlignUp(layout.packs[open_pack].used, kDirectIoAlignment));
        pack_filled = 0;
      }
      const int64_t at = offset - layout.packs[open_pack].start;
      std::memset(pack_buffer->data + pack_filled, 0, at - pack_filled);
      std::memcpy(pack_buffer->data + at, bytes, length);
      pack_filled = at + length;
    } else {
      flush_pack();
      if (!context.direct_io) {
        if (length > 0) queue.Write(i, offset, bytes, length);
      } else {
        // The aligned body straight from the caller's memory when it is
        // aligned; the rest through a zero-padded aligned bounce block (the
        // padding lies before the next item's aligned start).
        int64_t body = 0;
        if (reinterpret_cast<uintptr_t>(bytes) % kDirectIoAlignment == 0) {
          body = internal_io::AlignDown(length, kDirectIoAlignment);
          if (body > 0) queue.Write(i, offset, bytes, body);
        }
        for (int64_t pos = body; pos < length; pos += kBounceChunk) {
          const int64_t n = std::min(kBounceChunk, length - pos);
          const int64_t padded = AlignUp(n, kDirectIoAlignment);
          AlignedBuffer* buffer = queue.TakeBounce(padded);
          std::memcpy(buffer->data, bytes + pos, n);
          std::memset(buffer->data + n, 0, padded - n);
          queue.SetBounceWritten(
              queue.Write(i, offset + pos, buffer->data, padded));
        }
      }
    }
    // Checksums while the item's writes are in flight (the memory stays
    // unchanged until they complete): the CPU work overlaps the I/O instead
    // of delaying it, which a buffered save, finished by one fsync, feels.
    result.storage_data.block_checksums =
        BlockChecksums(bytes, length, context.checksum_block_size);
    offset += length;
  }
  if (!queue.failed()) flush_pack();
  absl::Status status;
  if (encoded_reserve > 0) {
    offset = AlignUp(std::max(offset, layout.end), kDirectIoAlignment);
    for (size_t i = 0; i < items.size() && status.ok() && !queue.failed();
         ++i) {
      if (!encode[i]) continue;
      absl::StatusOr<int64_t> end = WriteEncodedItem(
          queue, i, context.extensions, resolved[i].bytes, resolved[i].length,
          offset, context.checksum_block_size, context.direct_io,
          results[i]->storage_data);
      if (!end.ok()) {
        status = Annotate(
            end.status(),
            absl::StrCat(rank_note, ": encoding ", items[i]->index.ToString()));
        break;
      }
      offset = AlignUp(*end, kDirectIoAlignment);
    }
  }
  if (status.ok() && !device_items.empty() && !queue.failed()) {
    status = WriteDeviceItems(context, path, device_items, results, queue);
  }
  // A value that resolved to other bytes than planned leaves reserved space
  // past the end: cut it before the fsync.
  const int64_t end =
      context.direct_io ? AlignUp(offset, kDirectIoAlignment) : offset;
  if (status.ok() && preallocate && end < reserved && !queue.failed()) {
    queue.WaitForWrites();  // Writes land first.
    status = Annotate(file->Truncate(end), rank_note);
  }
  if (status.ok() && context.sync_files && !queue.failed()) queue.Fsync();
  // Wait for everything in flight before the buffers and the file go away.
  absl::Status written = queue.Finish(
      context.rank, [&](size_t item) { return items[item]->index.ToString(); });
  if (status.ok()) status = written;
  absl::Status closed = file->Close();
  if (status.ok()) status = Annotate(closed, rank_note);
  return status;
}

}  // namespace dcp::internal_fs
