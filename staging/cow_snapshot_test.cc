#include "staging/cow_snapshot.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace dcp {
namespace {

// Private anonymous memory, as allocators hand out; unmapped on destruction.
class Mapping {
 public:
  explicit Mapping(size_t bytes, int flags = MAP_PRIVATE | MAP_ANONYMOUS,
                   int fd = -1)
      : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, fd, 0);
    if (p != MAP_FAILED) data_ = static_cast<std::byte*>(p);
  }
  ~Mapping() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  std::byte* data() const { return data_; }

 private:
  size_t bytes_;
  std::byte* data_ = nullptr;
};

std::byte Pattern(size_t i, int salt) {
  return static_cast<std::byte>((i * 131 + salt * 7 + (i >> 12)) & 0xff);
}

void Fill(std::byte* p, size_t n, int salt) {
  for (size_t i = 0; i < n; ++i) p[i] = Pattern(i, salt);
}

// Index of the first byte of p[0..n) that differs from Pattern(salt), or n.
size_t FirstMismatch(const std::byte* p, size_t n, int salt) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != Pattern(i, salt)) return i;
  }
  return n;
}

void CopyRest(const CowSnapshot& snapshot) {
  for (const HostCopy& c : snapshot.to_copy) std::memcpy(c.dst, c.src, c.bytes);
}

class CowSnapshotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::Status available = CowSnapshotsAvailable();
    if (!available.ok()) {
      EXPECT_EQ(available.code(), absl::StatusCode::kUnavailable);
      GTEST_SKIP() << available.message();
    }
  }
  const size_t page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
};

TEST_F(CowSnapshotTest, WritesAfterReturnDoNotReachTheSnapshot) {
  constexpr size_t kMapped = size_t{8} << 20;
  constexpr size_t kOffset = 123;                    // Inside the first page.
  constexpr size_t kBytes = (size_t{5} << 20) + 77;  // Ends inside a page.
  Mapping src(kMapped);
  std::vector<std::byte> dst(kBytes);
  ASSERT_NE(src.data(), nullptr);
  Fill(src.data() + kOffset, kBytes, 1);

  absl::Notification hold;
  CowSnapshotOptions options;
  options.block_bytes = size_t{1} << 20;
  options.hold_background_copy = &hold;
  absl::StatusOr<CowSnapshot> snapshot =
      TakeCowSnapshot({{dst.data(), src.data() + kOffset, kBytes}}, options);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  // The partial first and last pages are left to the caller, exactly.
  ASSERT_EQ(snapshot->to_copy.size(), 2u);
  EXPECT_EQ(snapshot->to_copy[0].src, src.data() + kOffset);
  EXPECT_EQ(snapshot->to_copy[0].dst, dst.data());
  EXPECT_EQ(snapshot->to_copy[0].bytes, page_ - kOffset);
  const size_t end = kOffset + kBytes;
  EXPECT_EQ(snapshot->to_copy[1].src, src.data() + end / page_ * page_);
  EXPECT_EQ(snapshot->to_copy[1].bytes, end % page_);
  CopyRest(*snapshot);

  // Writes meet protected pages (the copier is held): each waits for its
  // block's copy. The first protected byte, one in the middle, the last one,
  // and a write by the kernel (read(2) from a pipe).
  const size_t first = page_ - kOffset;
  const size_t last = end / page_ * page_ - 1 - kOffset;
  for (size_t i : {first, kBytes / 2, last}) {
    src.data()[kOffset + i] = ~Pattern(i, 1);
  }
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const char message[] = "written by the kernel";
  ASSERT_EQ(write(fds[1], message, sizeof(message)),
            static_cast<ssize_t>(sizeof(message)));
  const size_t at = kBytes - (size_t{1} << 20);
  ASSERT_EQ(read(fds[0], src.data() + kOffset + at, sizeof(message)),
            static_cast<ssize_t>(sizeof(message)));
  close(fds[0]);
  close(fds[1]);

  hold.Notify();
  const absl::StatusOr<CowSnapshotStats>& stats = snapshot->filled.Wait();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->protected_bytes, kBytes - (page_ - kOffset) - end % page_);
  EXPECT_EQ(stats->blocks, 5u);  // 5 MiB - 1 page, in 1 MiB blocks.
  EXPECT_EQ(stats->blocks_copied_on_write, 4u);  // first/middle/last/read.
  EXPECT_EQ(FirstMismatch(dst.data(), kBytes, 1), kBytes);
  // The writes themselves went through.
  EXPECT_EQ(src.data()[kOffset + kBytes / 2], ~Pattern(kBytes / 2, 1));
  EXPECT_EQ(src.data()[kOffset + last], ~Pattern(last, 1));
  EXPECT_EQ(std::memcmp(src.data() + kOffset + at, message, sizeof(message)),
            0);
}

TEST_F(CowSnapshotTest, SharedMemoryAndSmallCopiesAreLeftToTheCaller) {
  constexpr size_t kBytes = size_t{4} << 20;
  Mapping shared(kBytes, MAP_SHARED | MAP_ANONYMOUS);
  Mapping small(size_t{64} << 10);
  ASSERT_NE(shared.data(), nullptr);
  ASSERT_NE(small.data(), nullptr);
  std::vector<std::byte> dst(kBytes + (size_t{64} << 10));
  const std::vector<HostCopy> copies = {
      {dst.data(), shared.data(), kBytes},
      {dst.data() + kBytes, small.data(), size_t{64} << 10}};
  absl::StatusOr<CowSnapshot> snapshot = TakeCowSnapshot(copies);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  ASSERT_EQ(snapshot->to_copy.size(), 2u);
  EXPECT_EQ(snapshot->to_copy[0].src, shared.data());
  EXPECT_EQ(snapshot->to_copy[0].bytes, kBytes);
  EXPECT_EQ(snapshot->to_copy[1].src, small.data());
  ASSERT_TRUE(snapshot->filled.ready());
  EXPECT_EQ(snapshot->filled.Wait()->protected_bytes, 0u);
}

TEST_F(CowSnapshotTest, OverlappingSourcesFillEveryDestination) {
  constexpr size_t kMiB = size_t{1} << 20;
  Mapping src(6 * kMiB);
  ASSERT_NE(src.data(), nullptr);
  Fill(src.data(), 6 * kMiB, 2);
  std::vector<std::byte> a(4 * kMiB), b(4 * kMiB);
  absl::Notification hold;
  CowSnapshotOptions options;
  options.hold_background_copy = &hold;
  absl::StatusOr<CowSnapshot> snapshot =
      TakeCowSnapshot({{a.data(), src.data(), 4 * kMiB},
                       {b.data(), src.data() + 2 * kMiB, 4 * kMiB}},
                      options);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_TRUE(snapshot->to_copy.empty());  // Page aligned: all protected.
  // Overwrite everything while the copier is held: every block is copied
  // for a write, for both destinations where they overlap.
  std::memset(src.data(), 0x5a, 6 * kMiB);
  hold.Notify();
  const absl::StatusOr<CowSnapshotStats>& stats = snapshot->filled.Wait();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->protected_bytes, 6 * kMiB);  // One region of 6 blocks.
  EXPECT_EQ(stats->blocks_copied_on_write, 6u);
  EXPECT_EQ(FirstMismatch(a.data(), 4 * kMiB, 2), 4 * kMiB);
  for (size_t i = 0; i < 4 * kMiB; ++i) {
    ASSERT_EQ(b[i], Pattern(i + 2 * kMiB, 2)) << i;
  }
}

TEST_F(CowSnapshotTest, SnapshotsOneAfterAnotherEachKeepTheirMoment) {
  constexpr size_t kBytes = size_t{3} << 20;
  Mapping src(kBytes);
  ASSERT_NE(src.data(), nullptr);
  for (int round = 0; round < 3; ++round) {
    Fill(src.data(), kBytes, 10 + round);
    std::vector<std::byte> dst(kBytes);
    absl::StatusOr<CowSnapshot> snapshot =
        TakeCowSnapshot({{dst.data(), src.data(), kBytes}});
    ASSERT_TRUE(snapshot.ok()) << snapshot.status();
    CopyRest(*snapshot);
    // Writers on two threads race the copier.
    std::thread t1([&] { std::memset(src.data(), 1, kBytes / 2); });
    std::thread t2(
        [&] { std::memset(src.data() + kBytes / 2, 2, kBytes - kBytes / 2); });
    t1.join();
    t2.join();
    ASSERT_TRUE(snapshot->filled.Wait().ok());
    EXPECT_EQ(FirstMismatch(dst.data(), kBytes, 10 + round), kBytes)
        << "round " << round;
    EXPECT_EQ(snapshot->filled.Wait()->blocks, 3u);
  }
}

TEST_F(CowSnapshotTest, AForkedChildCopiesInstead) {
  constexpr size_t kBytes = size_t{2} << 20;
  Mapping src(kBytes);
  ASSERT_NE(src.data(), nullptr);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The inherited userfaultfd acts on the parent's memory: refused.
    std::vector<std::byte> dst(kBytes);
    absl::StatusOr<CowSnapshot> snapshot =
        TakeCowSnapshot({{dst.data(), src.data(), kBytes}});
    _exit(!snapshot.ok() &&
                  snapshot.status().code() == absl::StatusCode::kUnavailable
              ? 0
              : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// Pages never touched before the snapshot are protected too (the snapshot
// holds their zeros), in each of two separate regions.
TEST_F(CowSnapshotTest, UntouchedPagesInTwoRegionsKeepTheirZeros) {
  constexpr size_t kMiB = size_t{1} << 20;
  Mapping src(9 * kMiB);  // Fresh: no page of it is populated.
  ASSERT_NE(src.data(), nullptr);
  std::vector<std::byte> dst(8 * kMiB, std::byte{0xee});
  // [0, 4 MiB) and [5 MiB, 9 MiB): a gap between them, so two regions.
  const std::vector<HostCopy> copies = {
      {dst.data(), src.data(), 4 * kMiB},
      {dst.data() + 4 * kMiB, src.data() + 5 * kMiB, 4 * kMiB}};
  absl::Notification hold;
  CowSnapshotOptions options;
  options.hold_background_copy = &hold;
  absl::StatusOr<CowSnapshot> snapshot = TakeCowSnapshot(copies, options);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_TRUE(snapshot->to_copy.empty());
  // Block 1 of the first region, block 2 of the second.
  std::memset(src.data() + kMiB + 100, 0x5a, 1000);
  std::memset(src.data() + 7 * kMiB + 5, 0x5a, 1000);
  hold.Notify();
  const absl::StatusOr<CowSnapshotStats>& stats = snapshot->filled.Wait();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->blocks, 8u);
  EXPECT_EQ(stats->blocks_copied_on_write, 2u);
  size_t nonzero = 0;
  for (std::byte b : dst) nonzero += b != std::byte{0};
  EXPECT_EQ(nonzero, 0u);
  EXPECT_EQ(src.data()[7 * kMiB + 5], std::byte{0x5a});
}

// A destination inside a protected source would make the copier fault on
// its own write: refused, and the next snapshot works.
TEST_F(CowSnapshotTest, DestinationOverlappingASourceIsInvalidArgument) {
  constexpr size_t kMiB = size_t{1} << 20;
  Mapping src(4 * kMiB);
  ASSERT_NE(src.data(), nullptr);
  Fill(src.data(), 4 * kMiB, 3);
  std::vector<std::byte> dst(2 * kMiB);
  absl::StatusOr<CowSnapshot> snapshot =
      TakeCowSnapshot({{dst.data(), src.data(), 2 * kMiB},
                       {src.data() + kMiB, src.data() + 2 * kMiB, kMiB}});
  ASSERT_FALSE(snapshot.ok());
  EXPECT_EQ(snapshot.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(snapshot.status().message().find("overlaps a source"),
            std::string::npos)
      << snapshot.status();
  // Nothing was protected: the source takes writes, and a snapshot follows.
  Fill(src.data(), 4 * kMiB, 4);
  snapshot = TakeCowSnapshot({{dst.data(), src.data(), 2 * kMiB}});
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  CopyRest(*snapshot);
  ASSERT_TRUE(snapshot->filled.Wait().ok());
  EXPECT_EQ(FirstMismatch(dst.data(), 2 * kMiB, 4), 2 * kMiB);
}

TEST_F(CowSnapshotTest, NullPointerIsInvalidArgument) {
  std::vector<std::byte> dst(16);
  absl::StatusOr<CowSnapshot> snapshot =
      TakeCowSnapshot({{dst.data(), nullptr, 16}});
  ASSERT_FALSE(snapshot.ok());
  EXPECT_EQ(snapshot.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(snapshot.status().message().find("copy 0 has a NULL src"),
            std::string::npos)
      << snapshot.status();
  EXPECT_TRUE(TakeCowSnapshot({{nullptr, nullptr, 0}}).ok());
}

TEST(CowSnapshotAvailabilityTest, AvailableOrSaysWhy) {
  const absl::Status available = CowSnapshotsAvailable();
  if (!available.ok()) {
    EXPECT_EQ(available.code(), absl::StatusCode::kUnavailable);
    EXPECT_FALSE(available.message().empty());
    absl::StatusOr<CowSnapshot> snapshot = TakeCowSnapshot({});
    ASSERT_FALSE(snapshot.ok());
    EXPECT_EQ(snapshot.status().code(), absl::StatusCode::kUnavailable);
  }
}

}  // namespace
}  // namespace dcp
