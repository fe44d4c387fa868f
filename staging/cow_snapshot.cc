#include "staging/cow_snapshot.h"

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/status.h"
#include "cuda/host_copy.h"

namespace dcp {
namespace {

#if defined(__SANITIZE_THREAD__)
constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr bool kThreadSanitizer = true;
#else
constexpr bool kThreadSanitizer = false;
#endif
#else
constexpr bool kThreadSanitizer = false;
#endif

// Linux 6.4's, missing from older kernel headers (Debian 12's are 6.1).
#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)
#endif
#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC_NEW _IO(0xAA, 0x00)
#endif

constexpr uint8_t kProtected = 0;
constexpr uint8_t kClaimed = 1;
constexpr uint8_t kDone = 2;

// Blocks the background copier claims at once (one copy, one ioctl).
constexpr size_t kCopierRunBlocks = 8;

uintptr_t Addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// A run of protected pages, registered with the userfaultfd while its
// snapshot is in flight: the protected parts of the copies that lie in
// it, and one state per block.
struct Region {
  uintptr_t start = 0;             // Page aligned.
  uintptr_t end = 0;               // Page aligned.
  std::vector<HostCopy> copies;    // Sorted by src.
  std::vector<uintptr_t> max_end;  // Prefix maximum of the copies' ends.
  size_t block_bytes = 0;
  size_t blocks = 0;
  std::unique_ptr<std::atomic<uint8_t>[]> state;

  uintptr_t BlockStart(size_t b) const { return start + b * block_bytes; }
  uintptr_t BlockEnd(size_t b) const {
    return std::min(end, BlockStart(b) + block_bytes);
  }

  // Copies the bytes of [from, to) that belong to copies.
  void CopyRange(uintptr_t from, uintptr_t to) const {
    auto it = std::lower_bound(
        copies.begin(), copies.end(), to,
        [](const HostCopy& c, uintptr_t a) { return Addr(c.src) < a; });
    for (ptrdiff_t j = (it - copies.begin()) - 1; j >= 0; --j) {
      if (max_end[j] <= from) break;
      const HostCopy& c = copies[j];
      const uintptr_t lo = std::max(from, Addr(c.src));
      const uintptr_t hi = std::min(to, Addr(c.src) + c.bytes);
      if (lo >= hi) continue;
      BulkHostCopy(c.dst + (lo - Addr(c.src)),
                   reinterpret_cast<const void*>(lo), hi - lo);
    }
  }
};

// One snapshot in flight.
struct Active {
  std::vector<Region> regions;  // Sorted by start, disjoint.
  Promise<CowSnapshotStats> filled;
  CowSnapshotStats stats;
  absl::Notification* hold = nullptr;

  absl::Mutex mu;
  size_t remaining ABSL_GUARDED_BY(mu) = 0;  // Blocks not done.
  size_t on_write ABSL_GUARDED_BY(mu) = 0;

  Region* Find(uintptr_t addr) {
    auto it = std::upper_bound(
        regions.begin(), regions.end(), addr,
        [](uintptr_t a, const Region& r) { return a < r.start; });
    if (it == regions.begin()) return nullptr;
    --it;
    return addr < it->end ? &*it : nullptr;
  }

  void BlocksDone(size_t n, bool on_write_fault) {
    absl::MutexLock lock(&mu);
    remaining -= n;
    if (on_write_fault) on_write += n;
  }
};

class Engine {
 public:
  static Engine& Get() {
    static Engine* const engine = new Engine;  // Never destroyed.
    return *engine;
  }

  const absl::Status& available() const { return available_; }

  absl::StatusOr<CowSnapshot> Take(absl::Span<const HostCopy> copies,
                                   const CowSnapshotOptions& options);

 private:
  Engine() { available_ = Open(); }

  absl::Status Open();
  void HandleFaults();
  void Fill(std::shared_ptr<Active> active);

  int Ioctl(unsigned long request, void* arg) const {
    int rc;
    do {
      rc = ioctl(uffd_, request, arg);
    } while (rc != 0 && errno == EINTR);
    return rc;
  }
  // Lifts the protection of [start, end), waking writers waiting there
  // (explicitly where the ioctl fails, e.g. part of the range was unmapped:
  // a woken writer that faults again is handled again).
  void Unprotect(uintptr_t start, uintptr_t end) const {
    uffdio_writeprotect wp{};
    wp.range.start = start;
    wp.range.len = end - start;
    wp.mode = 0;
    int rc;
    while ((rc = Ioctl(UFFDIO_WRITEPROTECT, &wp)) != 0 && errno == EAGAIN) {
    }
    if (rc != 0) Wake(start, end);
  }
  void Wake(uintptr_t start, uintptr_t end) const {
    uffdio_range range{start, end - start};
    Ioctl(UFFDIO_WAKE, &range);
  }

  absl::Status available_;
  int uffd_ = -1;
  // The process that opened uffd_: a child of fork(2) inherits the
  // descriptor, which still acts on its parent's memory.
  pid_t pid_ = 0;
  long page_ = 4096;

  // Whether the fault handler may look at active_: a snapshot is published
  // or none is being taken (Take protects its pages before it publishes).
  bool Settled() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return active_ != nullptr || !busy_;
  }
  // Ends the in-flight snapshot (or a Take that kept nothing).
  void Finish() {
    absl::MutexLock lock(&mu_);
    active_.reset();
    busy_ = false;
  }

  absl::Mutex mu_;
  // The snapshot in flight, once its pages are protected.
  std::shared_ptr<Active> active_ ABSL_GUARDED_BY(mu_);
  // A snapshot is being taken or is in flight.
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
};

absl::Status Engine::Open() {
  if (kThreadSanitizer) {
    return absl::UnavailableError(
        "copy-on-write snapshots are off in ThreadSanitizer builds");
  }
  page_ = sysconf(_SC_PAGESIZE);
  int fd = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
  int first_errno = errno;
  if (fd < 0) {
    const int dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
    if (dev >= 0) {
      fd = ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK);
      close(dev);
    }
  }
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat(
        "copy-on-write snapshots need userfaultfd, which this process may "
        "not use (",
        std::strerror(first_errno),
        "; root, CAP_SYS_PTRACE, vm.unprivileged_userfaultfd=1 or access to "
        "/dev/userfaultfd)"));
  }
  uffdio_api api{};
  api.api = UFFD_API;
  api.features = UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_WP_UNPOPULATED;
  if (ioctl(fd, UFFDIO_API, &api) != 0) {
    const int e = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat(
        "copy-on-write snapshots need userfaultfd write-protection of "
        "anonymous memory, unpopulated pages included (Linux 6.4); "
        "UFFDIO_API: ",
        std::strerror(e)));
  }
  uffd_ = fd;
  pid_ = getpid();
  std::thread([this] { HandleFaults(); }).detach();
  return absl::OkStatus();
}

void Engine::HandleFaults() {
  for (;;) {
    pollfd p{uffd_, POLLIN, 0};
    if (poll(&p, 1, -1) < 0) continue;
    uffd_msg msg;
    const ssize_t n = read(uffd_, &msg, sizeof(msg));
    if (n != sizeof(msg) || msg.event != UFFD_EVENT_PAGEFAULT) continue;
    const uintptr_t addr = msg.arg.pagefault.address;
    const uintptr_t page = addr & ~static_cast<uintptr_t>(page_ - 1);
    std::shared_ptr<Active> active;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &Engine::Settled));
      active = active_;
    }
    Region* region = active ? active->Find(addr) : nullptr;
    if (region == nullptr) {
      // A fault that outlived its snapshot: unregistering lifted the
      // protection (never lift it here: a later snapshot may protect the
      // page again).
      Wake(page, page + page_);
      continue;
    }
    const size_t b = (addr - region->start) / region->block_bytes;
    uint8_t expected = kProtected;
    if (region->state[b].compare_exchange_strong(expected, kClaimed)) {
      region->CopyRange(region->BlockStart(b), region->BlockEnd(b));
      Unprotect(region->BlockStart(b), region->BlockEnd(b));
      region->state[b].store(kDone);
      active->BlocksDone(1, /*on_write_fault=*/true);
    } else if (expected == kDone) {
      Wake(region->BlockStart(b), region->BlockEnd(b));
    }
    // kClaimed: the copier lifts the protection and so wakes the writer.
  }
}

void Engine::Fill(std::shared_ptr<Active> active) {
  if (active->hold != nullptr) active->hold->WaitForNotification();
  for (Region& r : active->regions) {
    size_t b = 0;
    while (b < r.blocks) {
      size_t claimed = 0;
      while (b + claimed < r.blocks && claimed < kCopierRunBlocks) {
        uint8_t expected = kProtected;
        if (!r.state[b + claimed].compare_exchange_strong(expected, kClaimed)) {
          break;
        }
        ++claimed;
      }
      if (claimed == 0) {  // The fault handler has this block.
        ++b;
        continue;
      }
      r.CopyRange(r.BlockStart(b), r.BlockEnd(b + claimed - 1));
      Unprotect(r.BlockStart(b), r.BlockEnd(b + claimed - 1));
      for (size_t i = 0; i < claimed; ++i) r.state[b + i].store(kDone);
      active->BlocksDone(claimed, /*on_write_fault=*/false);
      b += claimed;
    }
  }
  {
    absl::MutexLock lock(&active->mu);
    active->mu.Await(absl::Condition(
        +[](size_t* remaining) { return *remaining == 0; },
        &active->remaining));
    active->stats.blocks_copied_on_write = active->on_write;
  }
  for (const Region& r : active->regions) {
    uffdio_range range{r.start, r.end - r.start};
    Ioctl(UFFDIO_UNREGISTER, &range);
  }
  const CowSnapshotStats stats = active->stats;
  Promise<CowSnapshotStats> filled = active->filled;
  Finish();
  active.reset();
  filled.Set(stats);
}

// The private anonymous mappings of this process, merged, sorted.
std::vector<std::pair<uintptr_t, uintptr_t>> PrivateAnonymousMemory() {
  std::vector<std::pair<uintptr_t, uintptr_t>> spans;
  FILE* maps = std::fopen("/proc/self/maps", "re");
  if (maps == nullptr) return spans;
  char line[4096];
  while (std::fgets(line, sizeof(line), maps) != nullptr) {
    unsigned long start = 0, end = 0, inode = 0;
    char perms[8] = {};
    unsigned long long offset = 0;
    unsigned major = 0, minor = 0;
    if (std::sscanf(line, "%lx-%lx %7s %llx %x:%x %lu", &start, &end, perms,
                    &offset, &major, &minor, &inode) != 7) {
      continue;
    }
    // Lines longer than the buffer continue on the next read; their tail
    // fails the parse above.
    if (std::strcmp(perms, "rw-p") != 0 || inode != 0) continue;
    if (!spans.empty() && spans.back().second == start) {
      spans.back().second = end;
    } else {
      spans.emplace_back(start, end);
    }
  }
  std::fclose(maps);
  return spans;
}

bool Inside(const std::vector<std::pair<uintptr_t, uintptr_t>>& spans,
            uintptr_t start, uintptr_t end) {
  auto it = std::upper_bound(
      spans.begin(), spans.end(), start,
      [](uintptr_t a, const std::pair<uintptr_t, uintptr_t>& s) {
        return a < s.first;
      });
  if (it == spans.begin()) return false;
  --it;
  return start >= it->first && end <= it->second;
}

absl::StatusOr<CowSnapshot> Engine::Take(absl::Span<const HostCopy> copies,
                                         const CowSnapshotOptions& options) {
  DCP_RETURN_IF_ERROR(available_);
  if (getpid() != pid_) {
    return absl::UnavailableError(
        "copy-on-write snapshots are not available in a child of fork(2) "
        "of the process that first took one");
  }
  for (size_t i = 0; i < copies.size(); ++i) {
    if (copies[i].bytes > 0 &&
        (copies[i].dst == nullptr || copies[i].src == nullptr)) {
      return absl::InvalidArgumentError(
          absl::StrCat("TakeCowSnapshot: copy ", i, " has a NULL ",
                       copies[i].dst == nullptr ? "dst" : "src", " and ",
                       copies[i].bytes, " bytes"));
    }
  }
  const size_t page = static_cast<size_t>(page_);
  constexpr size_t kMaxBlock = size_t{1} << 30;
  const size_t block =
      std::max(page, std::min(options.block_bytes, kMaxBlock) / page * page);
  CowSnapshot snapshot;
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](bool* busy) { return !*busy; }, &busy_));
    busy_ = true;
  }
  bool finished = false;
  absl::Cleanup finish = [&] {
    if (!finished) Finish();
  };

  // Split each copy into its protected whole pages and what the caller
  // copies (the mappings read now that no other snapshot is in flight).
  std::vector<HostCopy> protect;
  std::vector<std::pair<uintptr_t, uintptr_t>> anonymous;
  bool mapped = false;
  for (const HostCopy& c : copies) {
    if (c.bytes == 0) continue;
    const uintptr_t src = Addr(c.src);
    const uintptr_t lo = (src + page - 1) / page * page;
    const uintptr_t hi = (src + c.bytes) / page * page;
    if (c.bytes < options.min_protected_bytes || hi <= lo) {
      snapshot.to_copy.push_back(c);
      continue;
    }
    if (!mapped) {
      anonymous = PrivateAnonymousMemory();
      mapped = true;
    }
    if (!Inside(anonymous, lo, hi)) {
      snapshot.to_copy.push_back(c);
      continue;
    }
    if (lo > src) snapshot.to_copy.push_back({c.dst, c.src, lo - src});
    protect.push_back({c.dst + (lo - src), c.src + (lo - src), hi - lo});
    if (src + c.bytes > hi) {
      snapshot.to_copy.push_back(
          {c.dst + (hi - src), c.src + (hi - src), src + c.bytes - hi});
    }
  }
  if (protect.empty()) {
    snapshot.filled = Future<CowSnapshotStats>::Ready(CowSnapshotStats{});
    return snapshot;
  }

  // Regions: overlapping or touching protected ranges merged.
  std::sort(protect.begin(), protect.end(),
            [](const HostCopy& a, const HostCopy& b) { return a.src < b.src; });
  auto active = std::make_shared<Active>();
  active->hold = options.hold_background_copy;
  for (const HostCopy& c : protect) {
    const uintptr_t s = Addr(c.src);
    const uintptr_t e = s + c.bytes;
    if (active->regions.empty() || s > active->regions.back().end) {
      active->regions.emplace_back();
      active->regions.back().start = s;
    }
    Region& r = active->regions.back();
    r.end = std::max(r.end, e);
    r.copies.push_back(c);
    r.max_end.push_back(std::max(r.max_end.empty() ? 0 : r.max_end.back(), e));
  }
  // A destination inside a protected page would make the copier fault on
  // its own write, which no thread would then serve.
  for (const HostCopy& c : protect) {
    const uintptr_t d = Addr(c.dst);
    auto it = std::upper_bound(
        active->regions.begin(), active->regions.end(), d + c.bytes - 1,
        [](uintptr_t a, const Region& r) { return a < r.start; });
    if (it != active->regions.begin() && std::prev(it)->end > d) {
      return absl::InvalidArgumentError(
          absl::StrCat("TakeCowSnapshot: the destination at 0x", absl::Hex(d),
                       " (", c.bytes, " bytes) overlaps a source"));
    }
  }
  for (Region& r : active->regions) {
    r.block_bytes = block;
    r.blocks = (r.end - r.start + block - 1) / block;
    r.state = std::make_unique<std::atomic<uint8_t>[]>(r.blocks);
    for (size_t b = 0; b < r.blocks; ++b) r.state[b].store(kProtected);
  }

  // Register and protect every region. One that cannot be (another
  // userfaultfd holds it, the mapping changed, no memory for page tables)
  // is left to the caller. Nothing is published before its pages are
  // protected: the fault handler waits (Settled) until then.
  std::vector<Region> kept;
  kept.reserve(active->regions.size());
  for (Region& r : active->regions) {
    uffdio_register reg{};
    reg.range.start = r.start;
    reg.range.len = r.end - r.start;
    reg.mode = UFFDIO_REGISTER_MODE_WP;
    bool ok = Ioctl(UFFDIO_REGISTER, &reg) == 0;
    // EBUSY and EINVAL come from checks made before anything is
    // registered; other failures may leave part of the range registered.
    const bool maybe_registered = ok || (errno != EBUSY && errno != EINVAL);
    ok = ok && (reg.ioctls & (uint64_t{1} << _UFFDIO_WRITEPROTECT)) != 0;
    if (ok) {
      uffdio_writeprotect wp{};
      wp.range.start = r.start;
      wp.range.len = r.end - r.start;
      wp.mode = UFFDIO_WRITEPROTECT_MODE_WP;
      ok = Ioctl(UFFDIO_WRITEPROTECT, &wp) == 0;
      if (!ok) Unprotect(r.start, r.end);  // It may have been in part.
    }
    if (ok) {
      kept.push_back(std::move(r));
      continue;
    }
    if (maybe_registered) {
      uffdio_range range{r.start, r.end - r.start};
      Ioctl(UFFDIO_UNREGISTER, &range);
    }
    for (const HostCopy& c : r.copies) snapshot.to_copy.push_back(c);
  }
  active->regions = std::move(kept);
  size_t blocks = 0;
  for (const Region& r : active->regions) {
    blocks += r.blocks;
    active->stats.protected_bytes += r.end - r.start;
  }
  active->stats.blocks = blocks;
  {
    absl::MutexLock lock(&active->mu);
    active->remaining = blocks;
  }
  {
    absl::MutexLock lock(&mu_);
    active_ = active;  // The fault handler finds it from here on.
  }
  finished = true;  // Fill ends the snapshot.
  snapshot.filled = active->filled.future();
  try {
    std::thread([this, active]() mutable { Fill(std::move(active)); }).detach();
  } catch (const std::system_error&) {
    Fill(std::move(active));  // No thread to be had: copy it all now.
  }
  return snapshot;
}

}  // namespace

absl::Status CowSnapshotsAvailable() { return Engine::Get().available(); }

absl::StatusOr<CowSnapshot> TakeCowSnapshot(absl::Span<const HostCopy> copies,
                                            const CowSnapshotOptions& options) {
  return Engine::Get().Take(copies, options);
}

}  // namespace dcp
