// MEGA checkpoints across real processes (one forked process per rank,
// Gloo over tcp on 127.0.0.1), chosen by the checkpoint_id alone: four
// ranks save row, column and 2-d block shards of tensors of several dtypes
// (and a replicated one) to mega://DIR, one file per rank; three ranks
// load them by the plain path with another sharding.
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/process_group_factory.h"
#include "engine/checkpoint.h"
#include "gtest/gtest.h"
#include "io/mega_format.h"
#include "tests/comm/multiprocess.h"
#include "tests/test_util.h"

namespace dcp {
namespace {

using ::dcp::testing::Check;
using ::dcp::testing::FreshTestDir;
using ::dcp::testing::ListFiles;
using ::dcp::testing::RunRanks;

struct Spec {
  std::string name;
  DType dtype;
  Shape shape;
};

const std::vector<Spec> kSpecs = {
    {"emb", DType::kBF16, {12, 5}},
    {"proj", DType::kF32, {6, 8}},
    {"grid", DType::kI16, {4, 4}},
    {"scale", DType::kF8E5M2, {9}},
};

// Byte `b` of element `flat` of tensor `name`, so any rank can fill or check
// any chunk.
uint8_t ByteOf(const std::string& name, int64_t flat, size_t b) {
  uint64_t h = 0xcbf29ce484222325ULL ^ name.size();
  for (char c : name) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ULL;
  return static_cast<uint8_t>((h + flat * 131 + b * 7) >> 3);
}

// Fills (or checks) the chunk at `offsets` of `spec` held in `t`.
bool FillOrCheck(const Spec& spec, const Shape& offsets, Tensor& t, bool fill) {
  const size_t es = ElementSize(spec.dtype);
  auto* bytes = static_cast<uint8_t*>(t.data());
  const Shape& sizes = t.sizes();
  for (int64_t i = 0; i < t.numel(); ++i) {
    int64_t rem = i, flat = 0, stride = 1;
    Shape at(sizes.size());
    for (size_t d = sizes.size(); d-- > 0;) {
      at[d] = rem % sizes[d];
      rem /= sizes[d];
    }
    for (size_t d = sizes.size(); d-- > 0;) {
      flat += (at[d] + offsets[d]) * stride;
      stride *= spec.shape[d];
    }
    for (size_t b = 0; b < es; ++b) {
      uint8_t& byte = bytes[i * es + b];
      if (fill) {
        byte = ByteOf(spec.name, flat, b);
      } else if (byte != ByteOf(spec.name, flat, b)) {
        return false;
      }
    }
  }
  return true;
}

// Rank `rank` of `world`'s chunk of each tensor: emb by rows, proj by
// columns, grid by 2x2 blocks (four ranks) or rows, scale replicated on
// save and split on load.
std::vector<std::pair<Shape, Shape>> ChunkOf(const Spec& spec, int rank,
                                             int world, bool saving) {
  auto split = [&](int64_t n) {
    const int64_t base = n / world, extra = n % world;
    return std::make_pair(rank * base + std::min<int64_t>(rank, extra),
                          base + (rank < extra ? 1 : 0));
  };
  if (spec.name == "emb") {
    auto [r0, nr] = split(12);
    return {{{r0, 0}, {nr, 5}}};
  }
  if (spec.name == "proj") {
    auto [c0, nc] = split(8);
    return {{{0, c0}, {6, nc}}};
  }
  if (spec.name == "grid") {
    if (world == 4) return {{{(rank / 2) * 2, (rank % 2) * 2}, {2, 2}}};
    auto [r0, nr] = split(4);
    return {{{r0, 0}, {nr, 4}}};
  }
  if (saving) return {};  // Replicated.
  auto [f0, nf] = split(9);
  return {{{f0}, {nf}}};
}

StateDict Build(int rank, int world, bool saving) {
  StateDict state;
  for (const Spec& spec : kSpecs) {
    const auto chunks = ChunkOf(spec, rank, world, saving);
    if (chunks.empty()) {
      Tensor t = Tensor::Empty(spec.dtype, spec.shape);
      FillOrCheck(spec, Shape(spec.shape.size(), 0), t, true);
      state[spec.name] = t;
      continue;
    }
    std::vector<Shard> shards;
    for (const auto& [offsets, sizes] : chunks) {
      Tensor t = Tensor::Empty(spec.dtype, sizes);
      if (saving) FillOrCheck(spec, offsets, t, true);
      shards.push_back(Shard{offsets, t});
    }
    state[spec.name] = ShardedTensor(spec.dtype, spec.shape, std::move(shards));
  }
  return state;
}

int RunWorld(int world,
             const std::function<int(int, comm::ProcessGroup&)>& body) {
  const std::string rendezvous = FreshTestDir("mega_rdv");
  std::vector<testing::RankExit> exits = RunRanks(
      world,
      [&](int rank) {
        comm::RendezvousInfo info;
        info.rank = rank;
        info.world_size = world;
        info.store =
            comm::StoreAddress{comm::StoreAddress::Kind::kFile, rendezvous};
        comm::ProcessGroupOptions options;
        options.backend = comm::Backend::kGloo;
        options.timeout = absl::Seconds(30);
        options.connect_timeout = absl::Seconds(30);
        auto group = comm::CreateProcessGroup(info, options);
        if (int rc = Check(group.ok(), rank, group.status().ToString())) {
          return rc;
        }
        return body(rank, **group);
      },
      absl::Seconds(90));
  int failed = 0;
  for (const testing::RankExit& e : exits) {
    failed += !(e.exited && e.exit_code == 0);
  }
  return failed;
}

TEST(MegaDistributed, SavedOnFourRanksLoadsOnThree) {
  const std::string dir = FreshTestDir("mega_dist");
  EXPECT_EQ(RunWorld(4,
                     [&](int rank, comm::ProcessGroup& group) {
                       SaveOptions save;
                       save.checkpoint_id = absl::StrCat("mega://", dir);
                       save.process_group = &group;
                       absl::Status status =
                           Save(Build(rank, 4, true), save).status();
                       return Check(status.ok(), rank, status.ToString());
                     }),
            0);
  // Every rank wrote its chunks into a file of its own.
  std::set<std::string> files = ListFiles(dir);
  EXPECT_TRUE(files.contains(kMegaIndexFileName));
  EXPECT_TRUE(files.contains("model-00004-of-00004.mega"));
  EXPECT_EQ(files.size(), 5u);
  EXPECT_EQ(
      RunWorld(
          3,
          [&](int rank, comm::ProcessGroup& group) {
            StateDict state = Build(rank, 3, false);
            LoadOptions load;
            load.checkpoint_id = dir;
            load.process_group = &group;
            absl::Status status = Load(state, load);
            if (int rc = Check(status.ok(), rank, status.ToString())) {
              return rc;
            }
            for (const Spec& spec : kSpecs) {
              for (Shard& shard :
                   state[spec.name].sharded_tensor().mutable_local_shards()) {
                if (int rc = Check(
                        FillOrCheck(spec, shard.offsets, shard.tensor, false),
                        rank, spec.name + " differs")) {
                  return rc;
                }
              }
            }
            return 0;
          }),
      0);
}

}  // namespace
}  // namespace dcp
