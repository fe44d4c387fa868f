#include "capi/internal/host_copies.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "core/executor.h"
#include "cuda/host_copy.h"

namespace dcp::capi {
namespace {

int DefaultThreads() {
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1,
                    8);
}

// Leaked on purpose: a binding may copy until the process exits.
ThreadPool& Pool() {
  static ThreadPool* pool = new ThreadPool(DefaultThreads());
  return *pool;
}

struct Piece {
  std::byte* dst;
  const std::byte* src;
  size_t bytes;
};

}  // namespace

void CopyHost(absl::Span<const dcp_host_copy_t> copies, int threads) {
  std::vector<Piece> pieces;
  for (const dcp_host_copy_t& copy : copies) {
    auto* dst = static_cast<std::byte*>(copy.dst);
    const auto* src = static_cast<const std::byte*>(copy.src);
    for (size_t at = 0; at < copy.bytes; at += kHostCopyPieceBytes) {
      pieces.push_back(
          {dst + at, src + at, std::min(kHostCopyPieceBytes, copy.bytes - at)});
    }
  }
  // Largest first, so that the last pieces taken are small.
  std::sort(pieces.begin(), pieces.end(),
            [](const Piece& a, const Piece& b) { return a.bytes > b.bytes; });
  const size_t workers =
      std::min(static_cast<size_t>(threads <= 0 ? DefaultThreads() : threads),
               pieces.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next.fetch_add(1); i < pieces.size();
         i = next.fetch_add(1)) {
      BulkHostCopy(pieces[i].dst, pieces[i].src, pieces[i].bytes);
    }
  };
  if (workers <= 1) {
    work();
    return;
  }
  absl::BlockingCounter helpers_done(static_cast<int>(workers - 1));
  for (size_t w = 1; w < workers; ++w) {
    Pool().Schedule([&] {
      work();
      helpers_done.DecrementCount();
    });
  }
  work();  // The calling thread is a worker too.
  helpers_done.Wait();
}

}  // namespace dcp::capi
