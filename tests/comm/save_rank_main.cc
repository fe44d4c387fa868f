// One rank of a launched checkpoint job, for rendezvous-reuse and
// multi-node launcher tests: joins the process group the environment
// describes and saves or loads a sharded state.
//   save_rank_main save DIR   saves "weight" (f32 [12, 12], split by rows
//                             over the ranks) and a replicated "bias".
//   save_rank_main load DIR   loads them split by columns and checks every
//                             element; prints "loaded ok".
// Exit codes: 0 done, 2 cannot join, 3 save/load failed, 4 wrong bytes.
// The world size must divide 12.
// With DCP_TEST_GATE_DIR set, a rank opens the FIFO <dir>/rank<R> once it
// has joined and reads one byte before it saves or loads: the test learns
// that the rank joined and decides when it goes on (e.g. after cutting a
// link). DCP_TEST_TIMEOUT_MS sets the group's collective timeout.
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "comm/process_group_factory.h"
#include "core/sharded_tensor.h"
#include "core/state_dict.h"
#include "core/tensor.h"
#include "engine/checkpoint.h"

namespace {

constexpr int64_t kSide = 12;

float WeightAt(int64_t row, int64_t col) {
  return static_cast<float>(row * 1000 + col) + 0.25f;
}

dcp::Tensor WeightBlock(int64_t row0, int64_t rows, int64_t col0, int64_t cols,
                        bool fill) {
  dcp::Tensor t = dcp::Tensor::Empty(dcp::DType::kF32, {rows, cols});
  auto* data = static_cast<float*>(t.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      data[r * cols + c] = fill ? WeightAt(row0 + r, col0 + c) : 0.0f;
    }
  }
  return t;
}

dcp::Tensor Bias(bool fill) {
  dcp::Tensor t = dcp::Tensor::Empty(dcp::DType::kI64, {5});
  auto* data = static_cast<int64_t*>(t.data());
  for (int i = 0; i < 5; ++i) data[i] = fill ? -7 * i - 1 : 0;
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: save_rank_main save|load DIR\n");
    return 1;
  }
  const std::string mode = argv[1];
  const std::string dir = argv[2];
  dcp::comm::ProcessGroupOptions options;
  options.timeout = absl::Seconds(20);
  options.connect_timeout = absl::Seconds(20);
  if (const char* ms = std::getenv("DCP_TEST_TIMEOUT_MS")) {
    options.timeout = absl::Milliseconds(std::atoi(ms));
  }
  auto group = dcp::comm::CreateProcessGroupFromEnvironment(options);
  if (!group.ok()) {
    std::fprintf(stderr, "cannot join: %s\n",
                 group.status().ToString().c_str());
    return 2;
  }
  dcp::comm::ProcessGroup& pg = **group;
  const int rank = pg.rank();
  const int64_t part = kSide / pg.size();
  if (const char* gate = std::getenv("DCP_TEST_GATE_DIR")) {
    const std::string fifo = absl::StrCat(gate, "/rank", rank);
    const int fd = open(fifo.c_str(), O_RDONLY);
    char byte = 0;
    if (fd < 0 || read(fd, &byte, 1) != 1) {
      std::perror(fifo.c_str());
      return 1;
    }
    close(fd);
  }
  if (mode == "save") {
    dcp::StateDict state;
    state["weight"] =
        dcp::ShardedTensor(dcp::DType::kF32, {kSide, kSide},
                           {dcp::Shard{{rank * part, 0},
                                       WeightBlock(rank * part, part, 0, kSide,
                                                   /*fill=*/true)}});
    state["bias"] = Bias(/*fill=*/true);
    dcp::SaveOptions save;
    save.checkpoint_id = dir;
    save.process_group = &pg;
    absl::StatusOr<dcp::Metadata> metadata = dcp::Save(state, save);
    if (!metadata.ok()) {
      std::fprintf(stderr, "save: %s\n", metadata.status().ToString().c_str());
      return 3;
    }
    std::printf("saved as rank %d of %d\n", rank, pg.size());
    return 0;
  }
  dcp::StateDict state;
  state["weight"] = dcp::ShardedTensor(
      dcp::DType::kF32, {kSide, kSide},
      {dcp::Shard{{0, rank * part},
                  WeightBlock(0, kSide, rank * part, part, /*fill=*/false)}});
  state["bias"] = Bias(/*fill=*/false);
  dcp::LoadOptions load;
  load.checkpoint_id = dir;
  load.process_group = &pg;
  if (absl::Status s = dcp::Load(state, load); !s.ok()) {
    std::fprintf(stderr, "load: %s\n", s.ToString().c_str());
    return 3;
  }
  const dcp::Tensor& block =
      state["weight"].sharded_tensor().local_shards()[0].tensor;
  const auto* data = static_cast<const float*>(block.data());
  for (int64_t r = 0; r < kSide; ++r) {
    for (int64_t c = 0; c < part; ++c) {
      if (data[r * part + c] != WeightAt(r, rank * part + c)) {
        std::fprintf(stderr, "wrong weight at row %lld col %lld\n",
                     static_cast<long long>(r),
                     static_cast<long long>(rank * part + c));
        return 4;
      }
    }
  }
  const auto* bias = static_cast<const int64_t*>(state["bias"].tensor().data());
  for (int i = 0; i < 5; ++i) {
    if (bias[i] != -7 * i - 1) {
      std::fprintf(stderr, "wrong bias[%d]\n", i);
      return 4;
    }
  }
  std::printf("loaded ok as rank %d of %d\n", rank, pg.size());
  return pg.Barrier().ok() ? 0 : 1;
}
