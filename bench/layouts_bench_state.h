// The training states `dcp bench layouts` saves and loads: the byte stream
// their tensors' bytes come from, the layouts (llama, moe, tiny and tiny's
// one-tensor reference; layouts_bench.cc's file comment describes them), the
// JSON spec bench/layouts_torch.py builds the same state from, and a
// layout's state in host memory with the check of a loaded one.
#ifndef DCP_BENCH_LAYOUTS_BENCH_STATE_H_
#define DCP_BENCH_LAYOUTS_BENCH_STATE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "core/state_dict.h"
#include "core/tensor.h"
#include "nlohmann/json.hpp"

namespace dcp::layouts_bench {

using json = nlohmann::json;

inline constexpr char kTiny[] = "tiny";
inline constexpr char kTinyOne[] = "tiny_one_tensor";

// ---------------------------------------------------------------------------
// The byte stream: a layout's tensors, in order, cover consecutive ranges of
// it. Byte g is byte g % 8 of SplitMix64(key + g / 8), key the layout's name
// folded into the seed: what bench/torch_compare.py's fill_bytes(seed, name,
// g, n) generates.

// The key of `layout`'s stream: its name folded into `seed`.
uint64_t StreamKey(uint64_t seed, const std::string& layout);

struct TensorSpec {
  std::vector<std::string> path;  // Keys from the root of the state dict.
  DType dtype = DType::kF32;
  Shape shape;
  int64_t nbytes = 0;
  int64_t stream_offset = 0;  // Where its bytes start in the stream.
};

struct Layout {
  std::string name;
  std::vector<TensorSpec> tensors;
  int64_t bytes = 0;
  json dims;  // What was chosen to fit the budget.

  void Add(std::vector<std::string> path, DType dtype, Shape shape) {
    const int64_t nbytes = NumElements(shape) * ElementSize(dtype);
    tensors.push_back(
        {std::move(path), dtype, std::move(shape), nbytes, bytes});
    bytes += nbytes;
  }
};

struct LayoutSizes {
  int64_t llama_bytes = int64_t{2} << 30;
  int64_t moe_bytes = int64_t{1} << 30;
  int64_t tiny_count = 100000;
};

// The layout `name` (llama, moe, tiny or tiny_one_tensor) within `sizes`;
// kInvalidArgument naming the choices for another name.
absl::StatusOr<Layout> MakeLayout(const std::string& name,
                                  const LayoutSizes& sizes);

// The layout as bench/layouts_torch.py reads it, with samples of the bytes
// this side generates (the first 16 of about 64 tensors spread over the
// layout), which the Python side checks its own generation against.
json LayoutSpec(const Layout& layout, uint64_t seed);

// A layout's state in host memory.
struct HostState {
  std::shared_ptr<void> memory;  // Every tensor lives in it.
  StateDict state;
};

// The state of `layout`: its bytes from the stream of `key` (fill), else
// zeros (a load's destination). Every page of it is touched.
HostState MakeState(const Layout& layout, uint64_t key, bool fill,
                    std::vector<std::byte*>* data);

// OK when every tensor holds its bytes of the stream; else kDataLoss naming
// the first tensor and offset that differ.
absl::Status Verify(const Layout& layout, uint64_t key,
                    const std::vector<std::byte*>& data);

}  // namespace dcp::layouts_bench

#endif  // DCP_BENCH_LAYOUTS_BENCH_STATE_H_
