#include "io/fs_read_window.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <new>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "core/box_copy.h"
#include "core/checksum.h"
#include "core/status.h"
#include "io/metadata_format.h"
#include "staging/device_box_upload.h"
#include "staging/device_staging.h"

namespace dcp::internal_fs {
namespace {

using internal_io::AlignDown;
using internal_io::AlignUp;
using internal_io::FirstError;
using internal_io::kDirectIoAlignment;
using internal_io::RunWorkers;

// "<item> in data file <file>", for messages about a slot's item.
std::string ItemName(const ReadSlot& slot) {
  return absl::StrCat(slot.stored->index->ToString(), " in data file ",
                      slot.stored->info->relative_path);
}

// Plans `stored`'s reads, appending slots to `out`: one zero-copy slot when
// it can be read in place (CanReadInPlace), otherwise PlanPieces' pieces.
// Resolves each tensor use's destination once and checks its box; commits
// the uses at once when there is nothing to read.
absl::Status PlanItem(
    StoredItem& stored, LoadPlanner& planner, const ReadWindowOptions& options,
    OpenFiles& files,
    const std::function<absl::StatusOr<DeviceStaging*>()>& device_staging,
    std::deque<ReadSlot>& out) {
  // The file is open already (CheckStoredItem); if it is not, its error
  // comes when it is read.
  absl::StatusOr<const OpenFiles::Entry*> entry =
      files.Get(stored.info->relative_path);
  stored.direct = entry.ok() ? (*entry)->file->direct() : options.direct;
  const int64_t block_size = options.block_size;
  const int64_t length = stored.info->RawLength();
  const int64_t blocks = ChecksumBlockCount(length, block_size);
  const bool encoded = NeedsDecoding(*stored.info);
  if (encoded) {
    DCP_ASSIGN_OR_RETURN(
        stored.decoders,
        ResolveExtensions(*options.extensions, stored.info->extensions,
                          stored.index->ToString()));
    stored.block_starts.assign(1, 0);
    for (int64_t size : stored.info->block_lengths) {
      stored.block_starts.push_back(stored.block_starts.back() + size);
    }
  }
  stored.pieces_left = std::make_unique<std::atomic<int64_t>>(0);
  auto add = [&](const ReadPiece& piece) -> ReadSlot& {
    ReadSlot& slot = out.emplace_back();
    slot.stored = &stored;
    slot.first_block = piece.first_block;
    slot.end_block = piece.end_block;
    slot.begin = piece.first_block * block_size;
    slot.end = std::min(piece.end_block * block_size, length);
    slot.io_begin =
        encoded ? stored.block_starts[piece.first_block] : slot.begin;
    slot.io_end = encoded ? stored.block_starts[piece.end_block] : slot.end;
    slot.first_element = piece.first_element;
    slot.end_element = piece.end_element;
    // What PrepareSlot will allocate: with O_DIRECT the read widens to
    // whole aligned blocks (a 100-byte item takes 4 or 8 KiB).
    const int64_t start = stored.info->offset + slot.io_begin;
    const int64_t end = stored.info->offset + slot.io_end;
    const int64_t read_bytes = stored.direct
                                   ? AlignUp(end, kDirectIoAlignment) -
                                         AlignDown(start, kDirectIoAlignment)
                                   : end - start;
    slot.buffer_bytes = read_bytes + (encoded ? slot.end - slot.begin : 0);
    stored.pieces_left->fetch_add(1);
    return slot;
  };
  if (!stored.is_tensor) {  // Bytes: delivered whole.
    add({0, blocks, 0, 0});
    return absl::OkStatus();
  }
  // Temporaries the planner allocated for the destinations (a converting
  // load) count as this item's memory in the window.
  int64_t temporary_bytes = 0;
  for (const ReadItem* item : stored.uses) {
    DCP_ASSIGN_OR_RETURN(TensorView dest, planner.ResolveTensor(*item));
    temporary_bytes += planner.TemporaryBytes(*item);
    const std::string what =
        absl::StrCat("loading ", item->storage_index.ToString(), " into ",
                     item->dest_index.ToString());
    if (dest.device().is_cuda() && stored.staging == nullptr) {
      absl::StatusOr<DeviceStaging*> staging = device_staging();
      if (!staging.ok()) return Annotate(staging.status(), what);
      stored.staging = *staging;
    }
    // Checks the box against the chunk and the destination.
    DCP_RETURN_IF_ERROR(Annotate(
        CopyBoxPart(nullptr, 0, 0, stored.chunk_sizes, item->storage_offsets,
                    stored.element_size, AsHostView(dest), item->dest_offsets,
                    item->lengths),
        what));
    stored.dests.push_back(std::move(dest));
  }
  // Items under kMinInPlaceBytes go through bounce runs even when they
  // could be read in place: one read for a run of them costs less than a
  // read each (ReadStoredItems).
  if (stored.info->length >= kMinInPlaceBytes &&
      CanReadInPlace(stored, stored.dests.front(), stored.direct)) {
    ReadSlot& slot = add({0, blocks, 0, NumElements(stored.chunk_sizes)});
    slot.zero_copy = true;
    // In place, but under O_DIRECT a partial last block comes through a
    // one-block tail buffer (PrepareSlot).
    const bool tail = stored.direct &&
                      (slot.io_end - slot.io_begin) % kDirectIoAlignment != 0;
    slot.buffer_bytes = (tail ? kDirectIoAlignment : 0) + temporary_bytes;
    slot.target = static_cast<std::byte*>(stored.dests.front().data());
    return absl::OkStatus();
  }
  const size_t first_piece = out.size();
  for (const ReadPiece& piece :
       PlanPieces(stored, block_size, options.piece_bytes)) {
    add(piece);
  }
  if (out.size() > first_piece)
    out[first_piece].buffer_bytes += temporary_bytes;
  if (*stored.pieces_left == 0) {  // Only empty boxes: nothing to read.
    for (size_t u = 0; u < stored.uses.size(); ++u) {
      DCP_RETURN_IF_ERROR(
          planner.CommitTensor(*stored.uses[u], stored.dests[u]));
    }
  }
  return absl::OkStatus();
}

// Builds `slot`'s read requests, allocating its bounce buffers.
absl::Status PrepareSlot(OpenFiles& files, BounceMeter& meter, ReadSlot& slot) {
  const bool direct = slot.stored->direct;
  absl::StatusOr<const OpenFiles::Entry*> entry =
      files.Get(slot.stored->info->relative_path);
  if (!entry.ok()) {
    return Annotate(entry.status(), absl::StrCat("reading ", ItemName(slot)));
  }
  slot.file = (*entry)->file.get();
  const int64_t offset = slot.stored->info->offset + slot.io_begin;
  const int64_t length = slot.io_end - slot.io_begin;
  if (length == 0) return absl::OkStatus();
  if (slot.zero_copy) {
    if (!direct) {
      slot.requests.push_back(
          IoRequest::Read(slot.file, offset, slot.target, length));
      return absl::OkStatus();
    }
    slot.body = AlignDown(length, kDirectIoAlignment);
    if (slot.body > 0) {
      slot.requests.push_back(
          IoRequest::Read(slot.file, offset, slot.target, slot.body));
    }
    if (slot.body < length) {
      DCP_ASSIGN_OR_RETURN(slot.tail, NewBounceBuffer(kDirectIoAlignment, meter,
                                                      ItemName(slot)));
      slot.requests.push_back(IoRequest::Read(slot.file, offset + slot.body,
                                              slot.tail->data(),
                                              kDirectIoAlignment));
    }
    return absl::OkStatus();
  }
  const int64_t start = direct ? AlignDown(offset, kDirectIoAlignment) : offset;
  const int64_t end =
      direct ? AlignUp(offset + length, kDirectIoAlignment) : offset + length;
  DCP_ASSIGN_OR_RETURN(slot.buffer,
                       NewBounceBuffer(end - start, meter, ItemName(slot)));
  slot.lead = offset - start;
  slot.target = slot.buffer->data() + slot.lead;
  slot.requests.push_back(
      IoRequest::Read(slot.file, start, slot.buffer->data(), end - start));
  return absl::OkStatus();
}

// The file bytes [start, end) a bounce slot reads (widened to aligned
// blocks under O_DIRECT).
std::pair<int64_t, int64_t> BounceRange(const ReadSlot& slot) {
  const int64_t start = slot.stored->info->offset + slot.io_begin;
  const int64_t end = slot.stored->info->offset + slot.io_end;
  if (!slot.stored->direct) return {start, end};
  return {AlignDown(start, kDirectIoAlignment),
          AlignUp(end, kDirectIoAlignment)};
}

// Small bounce slots of one file that follow each other on disk, read with
// one request into one buffer: a state of many small tensors packs them
// into few files, and one read per item would cost more than its bytes.
class BounceRun {
 public:
  // The largest gap between two slots' bytes that a run reads through.
  static constexpr int64_t kMaxGapBytes = 4096;

  explicit BounceRun(int64_t max_bytes) : max_bytes_(max_bytes) {}

  bool empty() const { return slots_.empty(); }

  // Whether `slot` (a bounce slot with bytes to read) extends the run.
  bool Extends(const ReadSlot& slot) const {
    if (slots_.empty()) return true;
    const auto [start, end] = BounceRange(slot);
    // One file: one `direct` for the whole run.
    return slot.stored->info->relative_path ==
               slots_.front()->stored->info->relative_path &&
           start >= end_ - (slots_.front()->stored->direct ? kDirectIoAlignment
                                                           : 0) &&
           start <= end_ + kMaxGapBytes && end - start_ <= max_bytes_;
  }

  void Add(ReadSlot& slot) {
    const auto [start, end] = BounceRange(slot);
    if (slots_.empty()) start_ = start;
    end_ = std::max(end_, end);
    slots_.push_back(&slot);
  }

  // Allocates the run's buffer and returns its one request (the run is
  // then empty, its slots in `slots`); the slots point into the buffer. The
  // error of opening the file, set as every slot's read.
  absl::StatusOr<IoRequest> Prepare(OpenFiles& files, BounceMeter& meter,
                                    std::vector<ReadSlot*>& slots) {
    slots.swap(slots_);
    slots_.clear();
    absl::StatusOr<const OpenFiles::Entry*> entry =
        files.Get(slots.front()->stored->info->relative_path);
    if (!entry.ok()) {
      const absl::Status status = Annotate(
          entry.status(), absl::StrCat("reading ", ItemName(*slots.front())));
      for (ReadSlot* slot : slots) {
        slot->reads.push_back(Future<size_t>::Ready(status));
      }
      return status;
    }
    File* file = (*entry)->file.get();
    absl::StatusOr<std::unique_ptr<BounceBuffer>> allocated =
        NewBounceBuffer(end_ - start_, meter, ItemName(*slots.front()));
    if (!allocated.ok()) {
      for (ReadSlot* slot : slots) {
        slot->reads.push_back(Future<size_t>::Ready(allocated.status()));
      }
      return allocated.status();
    }
    std::shared_ptr<BounceBuffer> buffer = *std::move(allocated);
    for (ReadSlot* slot : slots) {
      slot->file = file;
      slot->buffer = buffer;
      slot->lead = slot->stored->info->offset + slot->io_begin - start_;
      slot->target = buffer->data() + slot->lead;
    }
    return IoRequest::Read(file, start_, buffer->data(), end_ - start_);
  }

 private:
  const int64_t max_bytes_;
  std::vector<ReadSlot*> slots_;
  int64_t start_ = 0, end_ = 0;
};

// Decodes the verified stored blocks of an encoded `slot` into a raw bounce
// buffer and points slot.target at it. kDataLoss naming the item, the file
// and the block's offset for a block that does not decode.
absl::Status DecodeSlot(ReadSlot& slot, int64_t block_size,
                        BounceMeter& meter) {
  const StoredItem& stored = *slot.stored;
  const StorageInfo& info = *stored.info;
  // The whole chunk into the whole of a host tensor: decoded in place.
  std::byte* raw_begin = nullptr;
  if (stored.is_tensor && FillsWholeHostTensor(stored, stored.dests.front())) {
    raw_begin =
        static_cast<std::byte*>(stored.dests.front().data()) + slot.begin;
  } else {
    DCP_ASSIGN_OR_RETURN(slot.decoded, NewBounceBuffer(slot.end - slot.begin,
                                                       meter, ItemName(slot)));
    raw_begin = slot.decoded->data();
  }
  std::vector<std::byte> scratch;
  for (int64_t b = slot.first_block; b < slot.end_block; ++b) {
    const int64_t raw_start = b * block_size;
    const int64_t raw_size = std::min(block_size, info.raw_length - raw_start);
    const int64_t start = stored.block_starts[b];
    absl::Status status = DecodeBlock(
        stored.decoders,
        {slot.target + (start - slot.io_begin),
         static_cast<size_t>(info.block_lengths[b])},
        {raw_begin + (raw_start - slot.begin), static_cast<size_t>(raw_size)},
        scratch);
    if (!status.ok()) {
      return absl::DataLossError(
          absl::StrCat("cannot decode ", stored.index->ToString(), ": file ",
                       slot.file->path(), " offset ", info.offset + start,
                       " length ", info.block_lengths[b], ": ",
                       status.message(), "; the checkpoint is corrupt"));
    }
  }
  slot.target = raw_begin;
  slot.zero_copy = slot.decoded == nullptr;  // Delivered where it is.
  slot.buffer.reset();
  return absl::OkStatus();
}

// Verifies what was read into `slot`, decodes it when it is stored through
// extensions, and hands it to the planner: bytes whole, tensor boxes piece
// by piece; the item's last piece commits each tensor use (device ones are
// committed after the staging's flush).
absl::Status FinishSlot(ReadSlot& slot, int64_t block_size,
                        LoadPlanner& planner, BounceMeter& meter) {
  StoredItem& stored = *slot.stored;
  DCP_ASSIGN_OR_RETURN(int64_t got, AwaitSlot(slot));
  DCP_RETURN_IF_ERROR(VerifySlot(slot, got, block_size));
  if (!stored.decoders.empty()) {
    DCP_RETURN_IF_ERROR(DecodeSlot(slot, block_size, meter));
  }
  if (!stored.is_tensor) {
    for (const ReadItem* item : stored.uses) {
      DCP_RETURN_IF_ERROR(planner.LoadBytes(
          *item, absl::string_view(reinterpret_cast<const char*>(slot.target),
                                   static_cast<size_t>(slot.end))));
    }
    return absl::OkStatus();
  }
  if (!slot.zero_copy) {
    const int64_t es = static_cast<int64_t>(stored.element_size);
    const std::byte* window =
        slot.target + (slot.first_element * es - slot.begin);
    for (size_t u = 0; u < stored.uses.size(); ++u) {
      const ReadItem& item = *stored.uses[u];
      const TensorView& dest = stored.dests[u];
      DCP_RETURN_IF_ERROR(Annotate(
          dest.device().is_cpu()
              ? CopyBoxPart(window, slot.first_element, slot.end_element,
                            stored.chunk_sizes, item.storage_offsets,
                            stored.element_size, dest, item.dest_offsets,
                            item.lengths)
              : UploadBoxPart(*stored.staging, window, slot.first_element,
                              slot.end_element, stored.chunk_sizes,
                              item.storage_offsets, stored.element_size, dest,
                              item.dest_offsets, item.lengths),
          absl::StrCat("loading ", item.storage_index.ToString(), " into ",
                       item.dest_index.ToString())));
    }
  }
  if (stored.pieces_left->fetch_sub(1) != 1) return absl::OkStatus();
  if (stored.staging != nullptr) return absl::OkStatus();
  for (size_t u = 0; u < stored.uses.size(); ++u) {
    DCP_RETURN_IF_ERROR(planner.CommitTensor(*stored.uses[u], stored.dests[u]));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<const OpenFiles::Entry*> OpenFiles::Get(
    const std::string& relative_path) {
  absl::MutexLock lock(&mu_);
  auto it = files_.find(relative_path);
  if (it != files_.end()) return &it->second;
  const std::string path = JoinPath(dir_, relative_path);
  absl::StatusOr<std::unique_ptr<File>> opened =
      fs_.OpenForRead(path, options_);
  if (absl::IsNotFound(opened.status())) {
    // The committed metadata names it: the checkpoint is incomplete.
    return absl::DataLossError(absl::StrCat(
        "data file ", path,
        " is missing: the checkpoint's metadata names it, so the checkpoint "
        "is incomplete (a file removed, or not copied with the rest)"));
  }
  DCP_ASSIGN_OR_RETURN(std::unique_ptr<File> file, std::move(opened));
  DCP_ASSIGN_OR_RETURN(int64_t size, file->Size());
  return &files_.emplace(relative_path, Entry{std::move(file), size})
              .first->second;
}

absl::Status CheckStoredItem(const MetadataIndex& index,
                             const StorageInfo& info, int64_t block_size,
                             const ExtensionRegistry& extensions,
                             OpenFiles& files) {
  if (block_size <= 0 || block_size > kMaxChecksumBlockSize) {
    return absl::DataLossError(absl::StrCat("checksum_block_size ", block_size,
                                            " is outside (0, ",
                                            kMaxChecksumBlockSize, "]"));
  }
  if (info.offset < 0 || info.length < 0 ||
      info.offset > INT64_MAX - info.length) {
    return absl::DataLossError(
        absl::StrCat(index.ToString(), " in data file ", info.relative_path,
                     " has offset ", info.offset, " and length ", info.length));
  }
  const int64_t blocks = ChecksumBlockCount(info.RawLength(), block_size);
  if (static_cast<int64_t>(info.block_checksums.size()) != blocks) {
    return absl::DataLossError(
        absl::StrCat("metadata lists ", info.block_checksums.size(),
                     " checksums for ", index.ToString(), " (",
                     info.RawLength(), " bytes in ", blocks, " blocks)"));
  }
  if (!info.extensions.empty()) {
    // DecodeMetadata checked the record; metadata handed to SetUp by other
    // means is checked here before the reader indexes blocks with it.
    int64_t stored = 0;
    bool sizes_ok = info.raw_length >= 0 &&
                    static_cast<int64_t>(info.block_lengths.size()) == blocks;
    for (int64_t b = 0; sizes_ok && b < blocks; ++b) {
      const int64_t size = info.block_lengths[b];
      sizes_ok = size > 0 &&
                 size <= std::min(block_size, info.raw_length - b * block_size);
      stored += size;
    }
    if (!sizes_ok || stored != info.length) {
      return absl::DataLossError(
          absl::StrCat("the extension record of ", index.ToString(),
                       " in data file ", info.relative_path,
                       " does not match its ", info.length, " stored bytes"));
    }
    DCP_RETURN_IF_ERROR(
        Annotate(ResolveExtensions(extensions, info.extensions,
                                   absl::StrCat("tensor ", index.ToString()))
                     .status(),
                 absl::StrCat("data file ", info.relative_path)));
  }
  DCP_RETURN_IF_ERROR(CheckDataFileName(info.relative_path));
  absl::StatusOr<const OpenFiles::Entry*> opened =
      files.Get(info.relative_path);
  if (!opened.ok()) {
    return Annotate(opened.status(),
                    absl::StrCat("reading ", index.ToString()));
  }
  const OpenFiles::Entry* entry = *opened;
  if (info.offset + info.length > entry->size) {
    return absl::DataLossError(absl::StrCat(
        "data file ", entry->file->path(), " is truncated: ", index.ToString(),
        " needs bytes [", info.offset, ", ", info.offset + info.length,
        ") but the file ends at offset ", entry->size));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<BounceBuffer>> NewBounceBuffer(
    int64_t size, BounceMeter& meter, absl::string_view what) {
  try {
    return std::make_unique<BounceBuffer>(size, meter);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate a read buffer of ", size, " bytes for ", what));
  }
}

void BounceMeter::Add(int64_t bytes) {
  const int64_t now = held_.fetch_add(bytes) + bytes;
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
}

absl::StatusOr<int64_t> AwaitSlot(ReadSlot& slot) {
  // Every read is waited for: the slot's buffers must outlive them (the
  // caller frees the slot on an error).
  DCP_ASSIGN_OR_RETURN(const std::vector<size_t> done, WaitAll(slot.reads));
  const std::vector<int64_t> got(done.begin(), done.end());
  const int64_t length = slot.io_end - slot.io_begin;
  if (slot.tail != nullptr) {
    const int64_t body_got = slot.body > 0 ? got.front() : 0;
    if (body_got < slot.body) return body_got;
    const int64_t tail_got = std::min(got.back(), length - slot.body);
    std::memcpy(slot.target + slot.body, slot.tail->data(), tail_got);
    return slot.body + tail_got;
  }
  if (got.empty()) return 0;
  return std::clamp<int64_t>(got.front() - slot.lead, 0, length);
}

absl::Status VerifySlot(const ReadSlot& slot, int64_t got, int64_t block_size) {
  const StoredItem& stored = *slot.stored;
  const StorageInfo& info = *stored.info;
  const std::string& file_path = slot.file->path();
  if (got != slot.io_end - slot.io_begin) {
    return absl::DataLossError(absl::StrCat(
        "data file ", file_path, " is truncated: ", stored.index->ToString(),
        " needs bytes [", info.offset, ", ", info.offset + info.length,
        ") but the file ends at offset ", info.offset + slot.io_begin + got));
  }
  // CheckStoredItem matched the checksums to the blocks.
  const bool encoded = NeedsDecoding(info);
  for (int64_t b = slot.first_block; b < slot.end_block; ++b) {
    const int64_t start = encoded ? stored.block_starts[b] : b * block_size;
    const int64_t size = encoded ? info.block_lengths[b]
                                 : std::min(block_size, info.length - start);
    const uint64_t actual =
        Checksum(slot.target + (start - slot.io_begin), size);
    if (actual != info.block_checksums[b]) {
      return absl::DataLossError(absl::StrFormat(
          "checksum mismatch in %s: file %s offset %d length %d (xxh3 %016x, "
          "expected %016x); the checkpoint is corrupt",
          stored.index->ToString(), file_path, info.offset + start, size,
          actual, info.block_checksums[b]));
    }
  }
  return absl::OkStatus();
}

absl::Status ReadStoredItems(
    std::vector<StoredItem>& stored, const ReadWindowOptions& options,
    IoEngine& engine, Executor& executor, OpenFiles& files,
    LoadPlanner& planner,
    const std::function<absl::StatusOr<DeviceStaging*>()>& device_staging,
    BounceMeter& meter, const std::string& dir) {
  FirstError error;
  DeviceStaging* staging_used = nullptr;
  const std::function<absl::StatusOr<DeviceStaging*>()> staging =
      [&]() -> absl::StatusOr<DeviceStaging*> {
    DCP_ASSIGN_OR_RETURN(DeviceStaging * s, device_staging());
    staging_used = s;
    return s;
  };
  std::deque<ReadSlot> slots;  // Slots [done, done + slots.size()).
  size_t done = 0;
  size_t next_item = 0;
  size_t next_slot = 0;
  // Plans items and prepares slots until the window's bounce bytes are
  // reached, then submits the window's reads in one batch.
  auto submit_window = [&]() -> std::pair<size_t, size_t> {
    const size_t begin = next_slot;
    int64_t bounce_bytes = 0;
    std::vector<IoRequest> batch;
    // The slots that wait on request i of the batch: batch_slots
    // [batch_first[i], batch_first[i + 1]).
    std::vector<ReadSlot*> batch_slots;
    std::vector<size_t> batch_first;
    BounceRun run(options.piece_bytes);
    std::vector<ReadSlot*> run_slots;
    auto flush_run = [&] {
      if (run.empty()) return;
      absl::StatusOr<IoRequest> request = run.Prepare(files, meter, run_slots);
      if (!request.ok()) {
        error.Update(request.status());
        return;
      }
      batch.push_back(*request);
      batch_first.push_back(batch_slots.size());
      batch_slots.insert(batch_slots.end(), run_slots.begin(), run_slots.end());
    };
    while (!error.failed()) {
      if (next_slot == done + slots.size()) {
        if (next_item == stored.size()) break;
        error.Update(PlanItem(stored[next_item++], planner, options, files,
                              staging, slots));
        continue;
      }
      ReadSlot& slot = slots[next_slot - done];
      if (bounce_bytes > 0 &&
          bounce_bytes + slot.buffer_bytes > options.window_bytes) {
        break;
      }
      ++next_slot;
      bounce_bytes += slot.buffer_bytes;
      if (!slot.zero_copy && slot.io_end > slot.io_begin) {
        if (!run.Extends(slot)) flush_run();
        run.Add(slot);
        continue;
      }
      flush_run();
      absl::Status prepared = PrepareSlot(files, meter, slot);
      if (!prepared.ok()) {
        slot.reads.push_back(Future<size_t>::Ready(prepared));
        error.Update(prepared);
        break;
      }
      for (const IoRequest& request : slot.requests) {
        batch.push_back(request);
        batch_first.push_back(batch_slots.size());
        batch_slots.push_back(&slot);
      }
    }
    flush_run();
    std::vector<Future<size_t>> futures = engine.Submit(batch);
    batch_first.push_back(batch_slots.size());
    for (size_t i = 0; i < futures.size(); ++i) {
      for (size_t j = batch_first[i]; j < batch_first[i + 1]; ++j) {
        batch_slots[j]->reads.push_back(futures[i]);
      }
    }
    return {begin, next_slot};
  };
  // Verifies and delivers the window's slots, then frees them.
  auto finish_window = [&](std::pair<size_t, size_t> window) {
    std::atomic<size_t> next{window.first};
    const int threads = static_cast<int>(
        std::min<size_t>(options.thread_count, window.second - window.first));
    RunWorkers(executor, threads, [&](int) {
      for (size_t i = next++; i < window.second; i = next++) {
        ReadSlot& slot = slots[i - done];
        if (error.failed()) {
          // Keep the buffers until their reads are done.
          for (Future<size_t>& read : slot.reads) read.Wait();
        } else {
          error.Update(FinishSlot(slot, options.block_size, planner, meter));
        }
      }
    });
    // Windows finish in order: this one's slots are the oldest.
    for (size_t i = window.first; i < window.second; ++i) slots.pop_front();
    done = window.second;
  };
  std::pair<size_t, size_t> window = submit_window();
  while (window.first < window.second) {
    std::pair<size_t, size_t> following = submit_window();
    finish_window(window);
    window = following;
  }
  // A failed PrepareSlot leaves a window that was never finished.
  for (ReadSlot& slot : slots) {
    for (Future<size_t>& read : slot.reads) read.Wait();
  }
  if (staging_used != nullptr) {
    // Every copy to a device destination lands before any is committed.
    error.Update(
        Annotate(staging_used->Flush(),
                 absl::StrCat("copying into device tensors from ", dir)));
    for (StoredItem& item : stored) {
      if (error.failed()) break;
      if (item.staging == nullptr || item.pieces_left == nullptr ||
          *item.pieces_left != 0) {
        continue;
      }
      for (size_t u = 0; u < item.uses.size() && !error.failed(); ++u) {
        error.Update(planner.CommitTensor(*item.uses[u], item.dests[u]));
      }
    }
  }
  return error.status();
}

}  // namespace dcp::internal_fs
