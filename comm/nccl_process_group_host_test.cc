// NcclProcessGroup without a GPU: a fake NCCL (collectives between threads
// of this process, on host memory) over the host DeviceRuntime, so every
// path of the group runs here: the unique id through a rendezvous
// directory, the device buffers, the copies, every collective with bytes
// checked, and the keys the rendezvous leaves behind.
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "comm/internal/gloo_store.h"
#include "comm/internal/nccl_library.h"
#include "comm/nccl_process_group.h"
#include "cuda/host_runtime.h"
#include "gtest/gtest.h"
#include "tests/comm/multiprocess.h"

namespace dcp::comm {
namespace {

using ::dcp::testing::FreshTestDir;

// The runtime of the rank running on this thread: the fake synchronizes a
// stream (a host runtime handle) before it reads what was copied onto it.
thread_local DeviceRuntime* tls_runtime = nullptr;

// Ranks whose communicators share a unique id.
struct FakeWorld {
  explicit FakeWorld(int n) : size(n) {}
  const int size;
  absl::Mutex mu;
  absl::CondVar changed;
  int joined ABSL_GUARDED_BY(mu) = 0;
  // Collective number -> each rank's contribution.
  std::map<int64_t, std::vector<std::optional<std::string>>> slots
      ABSL_GUARDED_BY(mu);
  // (from, to) -> messages in order.
  std::map<std::pair<int, int>, std::vector<std::string>> mail
      ABSL_GUARDED_BY(mu);
  std::map<std::pair<int, int>, size_t> mail_read ABSL_GUARDED_BY(mu);
};

struct FakeComm {
  std::shared_ptr<FakeWorld> world;
  int rank = 0;
  int64_t calls = 0;
};

absl::Mutex registry_mu(absl::kConstInit);
std::map<std::string, std::shared_ptr<FakeWorld>>& Registry() {
  static auto* worlds = new std::map<std::string, std::shared_ptr<FakeWorld>>;
  return *worlds;
}

FakeComm* AsFake(ncclComm_t comm) { return reinterpret_cast<FakeComm*>(comm); }

size_t Bytes(size_t count, ncclDataType_t type) {
  return count * (type == ncclUint64 ? 8 : 1);
}

void Sync(cudaStream_t stream) {
  ASSERT_TRUE(
      tls_runtime->SynchronizeStream(reinterpret_cast<DeviceStream*>(stream))
          .ok());
}

// Adds this rank's contribution to its next collective; returns them all
// once every rank in `needed` has contributed.
std::vector<std::optional<std::string>> Contribute(
    FakeComm* c, std::optional<std::string> mine,
    const std::vector<int>& needed) {
  FakeWorld& w = *c->world;
  absl::MutexLock lock(&w.mu);
  auto& slot = w.slots[c->calls++];
  slot.resize(w.size);
  slot[c->rank] = std::move(mine);
  w.changed.SignalAll();
  auto ready = [&] {
    for (int r : needed) {
      if (!slot[r].has_value()) return false;
    }
    return true;
  };
  while (!ready()) w.changed.Wait(&w.mu);
  return slot;
}

ncclResult_t FakeGetUniqueId(ncclUniqueId* id) {
  std::random_device random;
  for (char& byte : id->internal) byte = static_cast<char>(random());
  return ncclSuccess;
}

ncclResult_t FakeInit(ncclComm_t* comm, int n, ncclUniqueId id, int rank,
                      ncclConfig_t*) {
  std::shared_ptr<FakeWorld> world;
  {
    absl::MutexLock lock(&registry_mu);
    auto& entry = Registry()[std::string(id.internal, sizeof(id.internal))];
    if (entry == nullptr) entry = std::make_shared<FakeWorld>(n);
    world = entry;
  }
  {
    // As NCCL's bootstrap: init returns once every rank has joined.
    absl::MutexLock lock(&world->mu);
    ++world->joined;
    world->changed.SignalAll();
    while (world->joined < world->size) world->changed.Wait(&world->mu);
  }
  *comm = reinterpret_cast<ncclComm_t>(new FakeComm{world, rank, 0});
  return ncclSuccess;
}

ncclResult_t FakeAbort(ncclComm_t comm) {
  delete AsFake(comm);
  return ncclSuccess;
}

ncclResult_t FakeAsyncError(ncclComm_t, ncclResult_t* state) {
  *state = ncclSuccess;
  return ncclSuccess;
}

const char* FakeErrorString(ncclResult_t) { return "fake nccl error"; }
const char* FakeLastError(ncclComm_t) { return ""; }

ncclResult_t FakeAllGather(const void* send, void* recv, size_t count,
                           ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
  Sync(stream);
  FakeComm* c = AsFake(comm);
  const size_t bytes = Bytes(count, type);
  std::vector<int> all;
  for (int r = 0; r < c->world->size; ++r) all.push_back(r);
  auto slot =
      Contribute(c, std::string(static_cast<const char*>(send), bytes), all);
  for (int r = 0; r < c->world->size; ++r) {
    std::memcpy(static_cast<char*>(recv) + r * bytes, slot[r]->data(), bytes);
  }
  return ncclSuccess;
}

ncclResult_t FakeBroadcast(const void* send, void* recv, size_t count,
                           ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  Sync(stream);
  FakeComm* c = AsFake(comm);
  const size_t bytes = Bytes(count, type);
  std::optional<std::string> mine;
  if (c->rank == root) mine.emplace(static_cast<const char*>(send), bytes);
  auto slot = Contribute(c, std::move(mine), {root});
  std::memcpy(recv, slot[root]->data(), bytes);
  return ncclSuccess;
}

// Point-to-point operations queued between GroupStart and GroupEnd.
struct P2P {
  bool send;
  void* buffer;
  size_t bytes;
  int peer;
  FakeComm* comm;
  cudaStream_t stream;
};
thread_local std::vector<P2P> tls_group;

ncclResult_t FakeSend(const void* buf, size_t count, ncclDataType_t type,
                      int peer, ncclComm_t comm, cudaStream_t stream) {
  tls_group.push_back({true, const_cast<void*>(buf), Bytes(count, type), peer,
                       AsFake(comm), stream});
  return ncclSuccess;
}

ncclResult_t FakeRecv(void* buf, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  tls_group.push_back(
      {false, buf, Bytes(count, type), peer, AsFake(comm), stream});
  return ncclSuccess;
}

ncclResult_t FakeGroupStart() {
  tls_group.clear();
  return ncclSuccess;
}

ncclResult_t FakeGroupEnd() {
  for (const P2P& op : tls_group) Sync(op.stream);
  for (const P2P& op : tls_group) {
    if (!op.send) continue;
    FakeWorld& w = *op.comm->world;
    absl::MutexLock lock(&w.mu);
    w.mail[{op.comm->rank, op.peer}].emplace_back(
        static_cast<const char*>(op.buffer), op.bytes);
    w.changed.SignalAll();
  }
  for (const P2P& op : tls_group) {
    if (op.send) continue;
    FakeWorld& w = *op.comm->world;
    absl::MutexLock lock(&w.mu);
    const std::pair<int, int> key{op.peer, op.comm->rank};
    while (w.mail[key].size() <= w.mail_read[key]) w.changed.Wait(&w.mu);
    const std::string& message = w.mail[key][w.mail_read[key]++];
    EXPECT_EQ(message.size(), op.bytes);
    std::memcpy(op.buffer, message.data(), std::min(message.size(), op.bytes));
  }
  tls_group.clear();
  return ncclSuccess;
}

const internal::NcclLibrary& FakeNccl() {
  static const internal::NcclLibrary* nccl = [] {
    auto* lib = new internal::NcclLibrary{};
    lib->path = "fake";
    lib->version = 1;
    lib->GetUniqueId = FakeGetUniqueId;
    lib->CommInitRankConfig = FakeInit;
    lib->CommAbort = FakeAbort;
    lib->CommGetAsyncError = FakeAsyncError;
    lib->GetErrorString = FakeErrorString;
    lib->GetLastError = FakeLastError;
    lib->AllGather = FakeAllGather;
    lib->Broadcast = FakeBroadcast;
    lib->Send = FakeSend;
    lib->Recv = FakeRecv;
    lib->GroupStart = FakeGroupStart;
    lib->GroupEnd = FakeGroupEnd;
    return lib;
  }();
  return *nccl;
}

absl::StatusOr<std::unique_ptr<DeviceRuntime>> HostRuntimeForThisThread() {
  std::unique_ptr<DeviceRuntime> runtime = CreateHostRuntime();
  tls_runtime = runtime.get();
  return runtime;
}

NcclOptions Options(const std::string& dir, int rank, int size,
                    absl::Duration connect, const std::string& group) {
  NcclOptions options;
  options.group_name = group;
  options.rank = rank;
  options.world_size = size;
  options.store.path = dir;
  options.timeout = absl::Seconds(20);
  options.connect_timeout = connect;
  return options;
}

size_t FilesIn(const std::string& dir) {
  size_t n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    (void)entry;
    ++n;
  }
  return n;
}

std::string Payload(int rank, size_t size) {
  std::string out(size, '\0');
  for (size_t i = 0; i < size; ++i) out[i] = static_cast<char>(rank * 37 + i);
  return out;
}

// Runs `size` ranks in threads; each creates its group, runs every
// collective with payloads of different sizes and checks the bytes.
// Returns each rank's first failure (OK when none).
std::vector<absl::Status> RunRanks(const std::string& dir, int size,
                                   const std::string& group_name) {
  std::vector<absl::Status> results(size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      absl::Status& result = results[rank];
      auto group = NcclProcessGroup::CreateWith(
          Options(dir, rank, size, absl::Seconds(20), group_name), FakeNccl(),
          HostRuntimeForThisThread);
      if (!group.ok()) {
        result = group.status();
        return;
      }
      ProcessGroup& pg = **group;
      auto expect = [&](bool ok, const std::string& what) {
        if (!ok && result.ok()) result = absl::DataLossError(what);
      };
      const auto size_of = [](int r) { return size_t{1} << (3 * r + 1); };
      auto all = pg.AllGather(Payload(rank, size_of(rank)));
      expect(all.ok(), all.status().ToString());
      for (int r = 0; all.ok() && r < size; ++r) {
        expect((*all)[r] == Payload(r, size_of(r)), "allgather");
      }
      auto gathered = pg.Gather(Payload(rank, size_of(size - rank)), 1);
      expect(gathered.ok(), gathered.status().ToString());
      for (int r = 0; gathered.ok() && rank == 1 && r < size; ++r) {
        expect((*gathered)[r] == Payload(r, size_of(size - r)), "gather");
      }
      std::vector<std::string> parts;
      for (int r = 0; rank == 0 && r < size; ++r) {
        parts.push_back(Payload(10 + r, r == 1 ? 0 : 100 + r));
      }
      auto mine = pg.Scatter(parts, 0);
      expect(
          mine.ok() && *mine == Payload(10 + rank, rank == 1 ? 0 : 100 + rank),
          absl::StrCat("scatter: ", mine.status().ToString()));
      auto b = pg.Broadcast(rank == 2 ? Payload(9, 4096) : "", 2);
      expect(b.ok() && *b == Payload(9, 4096),
             absl::StrCat("broadcast: ", b.status().ToString()));
      absl::Status barrier = pg.Barrier();
      expect(barrier.ok(), barrier.ToString());
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

TEST(NcclProcessGroupHostTest, ThreeRanksMoveExactBytesAndLeaveNoKeys) {
  const std::string dir = FreshTestDir("nccl_host_three");
  for (const absl::Status& s : RunRanks(dir, 3, "three"))
    EXPECT_TRUE(s.ok()) << s;
  // The join state, the generation's ready key and the unique id are gone.
  EXPECT_EQ(FilesIn(dir), 0u);
  // And the next job on the same directory works the same.
  for (const absl::Status& s : RunRanks(dir, 3, "three"))
    EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(FilesIn(dir), 0u);
}

// A crashed job with the same group name left keys where the next job
// meets: join keys of every rank with nonces nobody will answer, a welcome,
// a generation's ready key and the unique id under the names it used. The
// next job forms a fresh generation, moves exact bytes and leaves nothing
// of its own.
TEST(NcclProcessGroupHostTest, CrashedJobsKeysAreNotRead) {
  const std::string dir = FreshTestDir("nccl_host_crashed");
  const std::string base = "crashed-job/0/nccl";
  {
    StoreAddress address;
    address.path = dir;
    auto store = internal::OpenStore(address);
    ASSERT_TRUE(store.ok()) << store.status();
    std::unique_ptr<KeyValueStore> keys = internal::AsKeyValueStore(**store);
    for (int r = 0; r < 3; ++r) {
      ASSERT_TRUE(keys->Set(absl::StrCat(base, "/join/", r),
                            absl::StrCat("00000000deadbee", r, " 3"))
                      .ok());
    }
    const std::string id(sizeof(ncclUniqueId::internal), 'x');
    for (const std::string key :
         {"/welcome/00000000deadbee1", "/0123456789abcdef/0/ready/0",
          "/0123456789abcdef/unique_id", "/unique_id_from_rank_0"}) {
      ASSERT_TRUE(keys->Set(base + key, id).ok());
    }
  }
  EXPECT_EQ(FilesIn(dir), 7u);
  for (const absl::Status& s : RunRanks(dir, 3, "crashed-job")) {
    EXPECT_TRUE(s.ok()) << s;
  }
  // What is left is stale keys only (whether rank 0 answered, and so
  // removed, a stale welcome depends on timing), and the stale join keys of
  // ranks 1 and 2 were replaced and removed by those ranks.
  StoreAddress address;
  address.path = dir;
  auto store = internal::OpenStore(address);
  ASSERT_TRUE(store.ok()) << store.status();
  std::unique_ptr<KeyValueStore> keys = internal::AsKeyValueStore(**store);
  size_t stale_left = 0;
  for (const std::string key :
       {"/join/0", "/join/1", "/join/2", "/welcome/00000000deadbee1",
        "/0123456789abcdef/0/ready/0", "/0123456789abcdef/unique_id",
        "/unique_id_from_rank_0"}) {
    const bool there = keys->Get(base + key, absl::ZeroDuration()).ok();
    stale_left += there ? 1 : 0;
    if (key == "/join/1" || key == "/join/2") {
      EXPECT_FALSE(there) << key;
    }
  }
  EXPECT_EQ(FilesIn(dir), stale_left);
}

// Sizes from peers are checked before anything is allocated for them: two
// ranks that accept at most 1 KiB each all-gather 4 KiB and both fail with
// kDataLoss naming the peer and the size.
// Every rank holds every size, checks all of them and fails alike: no rank
// is left in the collective waiting for one that refused it.
TEST(NcclProcessGroupHostTest, PayloadLargerThanTheBoundIsDataLoss) {
  const std::string dir = FreshTestDir("nccl_host_bound");
  // `op` on both ranks of a fresh group whose ranks accept 1 KiB.
  auto on_both = [&](const std::string& name, auto op) {
    std::vector<absl::Status> results(2);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < 2; ++rank) {
      threads.emplace_back([&, rank] {
        NcclOptions options = Options(dir, rank, 2, absl::Seconds(20), name);
        options.max_payload_bytes = 1024;
        auto group = NcclProcessGroup::CreateWith(options, FakeNccl(),
                                                  HostRuntimeForThisThread);
        results[rank] = group.ok() ? op(**group, rank) : group.status();
      });
    }
    for (std::thread& t : threads) t.join();
    return results;
  };
  const std::vector<absl::Status> all_gathered =
      on_both("bounded", [](NcclProcessGroup& group, int rank) {
        return group.AllGather(Payload(rank, 4096)).status();
      });
  // Each payload fits; the root would hold 1200 bytes.
  const std::vector<absl::Status> gathered =
      on_both("bounded_total", [](NcclProcessGroup& group, int rank) {
        return group.Gather(Payload(rank, 600), 0).status();
      });
  for (int rank = 0; rank < 2; ++rank) {
    const absl::Status& s = all_gathered[rank];
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find(absl::StrCat(
                  "allgather on rank ", rank,
                  " of 2: rank 0 announced a payload of 4096 bytes, more "
                  "than the 1024")),
              std::string::npos)
        << s;
    const absl::Status& g = gathered[rank];
    EXPECT_EQ(g.code(), absl::StatusCode::kDataLoss) << g;
    EXPECT_NE(g.message().find(absl::StrCat(
                  "gather on rank ", rank,
                  " of 2: the ranks announced payloads of 1200 bytes in all, "
                  "more than the 1024")),
              std::string::npos)
        << g;
  }
}

// A creation that fails after the ranks met (the unique id was exchanged)
// leaves nothing in the store: every rank says it left and the last one
// removes the id, the generation's ready key and the departure keys. Two
// failures: the communicator does not form on any rank, and no rank has a
// usable GPU.
ncclResult_t FailingInit(ncclComm_t* comm, int, ncclUniqueId, int,
                         ncclConfig_t*) {
  *comm = nullptr;
  return ncclSystemError;
}

absl::StatusOr<std::unique_ptr<DeviceRuntime>> NoRuntime() {
  return absl::UnavailableError("no CUDA driver");
}

TEST(NcclProcessGroupHostTest, FailedCreationsAfterMeetingLeaveNoKeys) {
  static const internal::NcclLibrary* failing = [] {
    auto* lib = new internal::NcclLibrary(FakeNccl());
    lib->CommInitRankConfig = FailingInit;
    return lib;
  }();
  struct Case {
    std::string name;
    const internal::NcclLibrary* nccl;
    NcclProcessGroup::RuntimeMaker runtime;
    absl::StatusCode code;
    std::string before_rank, after_rank;  // The message names the rank.
  };
  const std::vector<Case> cases = {
      {"init_fails", failing, HostRuntimeForThisThread,
       absl::StatusCode::kUnavailable, "ncclCommInitRank on rank ",
       " of 3: NCCL error: fake nccl error"},
      {"no_gpu", &FakeNccl(), NoRuntime, absl::StatusCode::kFailedPrecondition,
       "nccl process group, rank ", " of 3: no usable GPU (no CUDA driver)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string dir = FreshTestDir(absl::StrCat("nccl_host_", c.name));
    std::vector<absl::Status> results(3);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < 3; ++rank) {
      threads.emplace_back([&, rank] {
        results[rank] = NcclProcessGroup::CreateWith(
                            Options(dir, rank, 3, absl::Seconds(20), c.name),
                            *c.nccl, c.runtime)
                            .status();
      });
    }
    for (std::thread& t : threads) t.join();
    for (int rank = 0; rank < 3; ++rank) {
      EXPECT_EQ(results[rank].code(), c.code) << results[rank];
      EXPECT_NE(results[rank].message().find(
                    absl::StrCat(c.before_rank, rank, c.after_rank)),
                std::string::npos)
          << results[rank];
    }
    std::vector<std::string> left;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      left.push_back(entry.path().filename().string());
    }
    EXPECT_TRUE(left.empty()) << ::testing::PrintToString(left);
  }
}

}  // namespace
}  // namespace dcp::comm
