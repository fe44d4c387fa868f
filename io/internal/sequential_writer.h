// SequentialWriter: writes one file front to back, from a sequence of byte
// ranges, through an IoEngine, for formats whose bytes follow each other
// without gaps (safetensors). Ranges whose memory lines up with the file
// (for O_DIRECT: both 4 KiB aligned) are written straight from that memory;
// the rest is gathered into aligned bounce chunks, at most `bounce_budget`
// bytes of them in flight (older ones are waited for first). An O_DIRECT
// file's last block is written zero-padded and the padding cut at Finish,
// so the file ends exactly at position(). Buffered files with
// `writeback_bytes` start writeback as they go (File::StartWriteback; at
// most two outstanding), as FileSystemWriter does.
//
// Internal to io/. Not thread-safe: one thread appends and finishes. The
// first failed write makes later Appends fail fast with its error.
#ifndef DCP_IO_INTERNAL_SEQUENTIAL_WRITER_H_
#define DCP_IO_INTERNAL_SEQUENTIAL_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "core/future.h"
#include "io/file_system.h"
#include "io/io_engine.h"

namespace dcp::internal_io {

struct SequentialWriterOptions {
  // The file was opened with O_DIRECT (File::direct()).
  bool direct = false;
  // Buffered files: start writeback every this many bytes; 0: never.
  int64_t writeback_bytes = 0;
  // Bounce chunk size (a multiple of 4 KiB) and the most bounce bytes in
  // flight.
  int64_t chunk_bytes = int64_t{8} << 20;
  int64_t bounce_budget = int64_t{32} << 20;
  // The most bytes written straight from memory that a `keepalive` owns in
  // flight (0: no bound): past it, Append waits for the oldest such write,
  // so a caller that hands over buffers bounds their memory.
  int64_t max_kept_bytes = 0;
};

class SequentialWriter {
 public:
  // `engine` and `file` must outlive the writer.
  SequentialWriter(IoEngine& engine, File& file,
                   SequentialWriterOptions options);
  // Waits for writes still in flight (their memory may go away after).
  ~SequentialWriter();
  SequentialWriter(const SequentialWriter&) = delete;
  SequentialWriter& operator=(const SequentialWriter&) = delete;

  // Appends `length` bytes from `data` at position(). Bytes written
  // straight from `data` are read by the engine later: `data` must stay
  // valid and unchanged until Finish returns, unless `keepalive` owns it
  // (the writer then holds `keepalive` until those writes complete, and
  // drops it at once when it copied everything). The first write error.
  absl::Status Append(const std::byte* data, int64_t length,
                      std::shared_ptr<void> keepalive = nullptr);

  // Writes what is buffered, waits for every write, and for O_DIRECT cuts
  // the padding of the last block (File::Truncate). The first error of any
  // write. Call once; nothing may be appended after.
  absl::Status Finish();

  // Bytes appended so far (the file offset of the next byte).
  int64_t position() const { return position_; }
  // Bytes of bounce buffers allocated now.
  int64_t bounce_bytes() const { return bounce_bytes_; }

 private:
  struct Bounce;
  // Submits [offset, offset + length) from `data`; `keepalive` is held
  // until the write completes.
  Future<size_t> Submit(int64_t offset, const std::byte* data, int64_t length,
                        std::shared_ptr<void> keepalive);
  // Writes the open bounce chunk's first `length` bytes (`length` a
  // multiple of 4 KiB for O_DIRECT, or the final padded block).
  void FlushBounce(int64_t length);
  absl::Status FirstError();

  IoEngine& engine_;
  File& file_;
  const SequentialWriterOptions options_;
  int64_t position_ = 0;
  // The open bounce chunk: file offset of its first byte and bytes filled.
  std::unique_ptr<Bounce> open_;
  int64_t open_start_ = 0;
  int64_t open_fill_ = 0;
  std::deque<std::unique_ptr<Bounce>> in_flight_;
  int64_t bounce_bytes_ = 0;
  std::vector<Future<size_t>> writes_;
  std::shared_ptr<std::atomic<bool>> failed_;
  int64_t submitted_end_ = 0;
  int64_t written_back_ = 0;
  std::deque<Future<size_t>> writebacks_;
  // With max_kept_bytes: writes of kept memory in flight, their bytes and
  // the memory (dropped once the write is seen complete, so the bound holds
  // when Append returns).
  struct Kept {
    Future<size_t> write;
    int64_t bytes = 0;
    std::shared_ptr<void> keepalive;
  };
  std::deque<Kept> kept_;
  int64_t kept_bytes_ = 0;
  bool finished_ = false;
};

}  // namespace dcp::internal_io

#endif  // DCP_IO_INTERNAL_SEQUENTIAL_WRITER_H_
