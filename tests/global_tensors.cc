#include "tests/global_tensors.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "comm/process_group_factory.h"
#include "tests/comm/multiprocess.h"

namespace dcp::testing {

uint8_t GlobalByte(const GlobalTensor& g, int64_t flat, size_t byte) {
  uint64_t h = 1469598103934665603ULL;
  for (char c : g.name) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ULL;
  if (g.compressible) {
    return byte < 4
               ? static_cast<uint8_t>(static_cast<uint64_t>(flat) >> (8 * byte))
               : static_cast<uint8_t>(h >> 17);
  }
  // SplitMix64's finalizer: every output bit depends on every input bit.
  uint64_t z =
      h + (static_cast<uint64_t>(flat) * 8 + byte) * 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return static_cast<uint8_t>(z ^ (z >> 31));
}

bool FillOrCheckChunk(const GlobalTensor& g, const Shape& offsets,
                      Tensor& chunk, bool fill) {
  const size_t es = ElementSize(g.dtype);
  const Shape& sizes = chunk.sizes();
  auto* data = static_cast<uint8_t*>(chunk.data());
  Shape local(sizes.size());
  for (int64_t i = 0; i < chunk.numel(); ++i) {
    // Local multi-index -> global row-major index.
    int64_t rem = i, flat = 0, stride = 1;
    for (size_t d = sizes.size(); d-- > 0;) {
      local[d] = rem % sizes[d];
      rem /= sizes[d];
    }
    for (size_t d = sizes.size(); d-- > 0;) {
      flat += (local[d] + offsets[d]) * stride;
      stride *= g.shape[d];
    }
    for (size_t b = 0; b < es; ++b) {
      const uint8_t want = GlobalByte(g, flat, b);
      if (fill) {
        data[i * es + b] = want;
      } else if (data[i * es + b] != want) {
        return false;
      }
    }
  }
  return true;
}

std::pair<int64_t, int64_t> EvenSplit(int64_t n, int rank, int world) {
  const int64_t base = n / world, extra = n % world;
  return {rank * base + std::min<int64_t>(rank, extra),
          base + (rank < extra ? 1 : 0)};
}

StateDict BuildState(const std::vector<GlobalTensor>& globals,
                     const ChunkLayout& layout, bool fill) {
  StateDict state;
  for (const GlobalTensor& g : globals) {
    const auto& chunks = layout.at(g.name);
    if (chunks.empty()) {
      Tensor t = Tensor::Empty(g.dtype, g.shape);
      if (fill) FillOrCheckChunk(g, Shape(g.shape.size(), 0), t, true);
      state[g.name] = t;
      continue;
    }
    std::vector<Shard> shards;
    for (const auto& [offsets, sizes] : chunks) {
      Tensor t = Tensor::Empty(g.dtype, sizes);
      if (fill) FillOrCheckChunk(g, offsets, t, true);
      shards.push_back(Shard{offsets, t});
    }
    state[g.name] = ShardedTensor(g.dtype, g.shape, std::move(shards));
  }
  return state;
}

std::string VerifyState(StateDict& state,
                        const std::vector<GlobalTensor>& globals,
                        const ChunkLayout& layout) {
  for (const GlobalTensor& g : globals) {
    StateValue& value = state[g.name];
    if (layout.at(g.name).empty()) {
      if (!FillOrCheckChunk(g, Shape(g.shape.size(), 0), value.tensor(),
                            false)) {
        return absl::StrCat(g.name, " differs");
      }
      continue;
    }
    for (Shard& shard : value.sharded_tensor().mutable_local_shards()) {
      if (!FillOrCheckChunk(g, shard.offsets, shard.tensor, false)) {
        return absl::StrCat(g.name, " at ", ShapeToString(shard.offsets),
                            " differs");
      }
    }
  }
  return "";
}

int RunGlooWorld(int world,
                 const std::function<int(int, comm::ProcessGroup&)>& body) {
  const std::string rendezvous = FreshTestDir("gloo_rdv");
  const std::vector<RankExit> exits = RunRanks(
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
  for (size_t rank = 0; rank < exits.size(); ++rank) {
    const RankExit& e = exits[rank];
    if (e.exited && e.exit_code == 0) continue;
    ++failed;
    std::fprintf(stderr, "rank %zu: exit %d signal %d timed out %d\n", rank,
                 e.exit_code, e.signal, e.timed_out ? 1 : 0);
  }
  return failed;
}

}  // namespace dcp::testing
