// Helpers for multi-process resharding tests: global tensors whose every
// byte is a function of (tensor, global element index, byte), so any rank
// fills or checks any chunk of one without the others; state dicts holding
// a rank's chunks of them; and forked Gloo worlds to run the ranks in.
#ifndef DCP_TESTS_GLOBAL_TENSORS_H_
#define DCP_TESTS_GLOBAL_TENSORS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "comm/process_group.h"
#include "core/state_dict.h"
#include "core/tensor.h"

namespace dcp::testing {

struct GlobalTensor {
  std::string name;
  DType dtype;
  Shape shape;
  // false: pseudo-random bytes (incompressible). true: each element holds
  // its own row-major index in its low (up to four) bytes, little-endian,
  // and a byte of the name in the others; zstd shrinks that, and an element
  // read from the wrong place differs as long as the index fits the
  // element (256 elements for 1-byte dtypes, 65536 for 2-byte ones).
  bool compressible = false;
};

// Byte `byte` of element `flat` (row-major global index) of `g`.
uint8_t GlobalByte(const GlobalTensor& g, int64_t flat, size_t byte);

// With `fill`, writes into `chunk`, the block of `g` at `offsets`, the
// bytes it holds; otherwise returns whether it holds them.
bool FillOrCheckChunk(const GlobalTensor& g, const Shape& offsets,
                      Tensor& chunk, bool fill);

// Tensor name -> one rank's chunks of it as (offsets, sizes); no chunks:
// the rank holds a whole replica.
using ChunkLayout = std::map<std::string, std::vector<std::pair<Shape, Shape>>>;

// (begin, count) of rank `rank`'s share of `n` split over `world` ranks,
// the first n % world ranks holding one more.
std::pair<int64_t, int64_t> EvenSplit(int64_t n, int rank, int world);

// A state dict with, for each of `globals` (keyed by name), a ShardedTensor
// of the chunks `layout` lists or a whole tensor, filled with their bytes
// when `fill` (otherwise uninitialized).
StateDict BuildState(const std::vector<GlobalTensor>& globals,
                     const ChunkLayout& layout, bool fill);

// "" when every chunk of `state` (made by BuildState with `layout`) holds
// its bytes, else "NAME at [OFFSETS] differs" for the first that does not.
std::string VerifyState(StateDict& state,
                        const std::vector<GlobalTensor>& globals,
                        const ChunkLayout& layout);

// Forks `world` processes that meet in a fresh Gloo group (file store
// under $TEST_TMPDIR, 30 s timeouts) and run body(rank, group), whose
// return value is the process's exit code (tests/comm/multiprocess.h: use
// Check). Kills what still runs after 90 s. Returns how many ranks did not
// exit with 0, each reported on stderr.
int RunGlooWorld(int world,
                 const std::function<int(int, comm::ProcessGroup&)>& body);

}  // namespace dcp::testing

#endif  // DCP_TESTS_GLOBAL_TENSORS_H_
