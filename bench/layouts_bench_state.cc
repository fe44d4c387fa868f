#include "bench/layouts_bench_state.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace dcp::layouts_bench {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the byte stream is defined over little-endian words");

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15u;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9u;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBu;
  return x ^ (x >> 31);
}

// Writes bytes [offset, offset + n) of the stream of `key` to `out`.
void FillStream(uint64_t key, int64_t offset, int64_t n, std::byte* out) {
  for (int64_t g = offset, end = offset + n; g < end;) {
    const uint64_t word = SplitMix64(key + static_cast<uint64_t>(g / 8));
    const int64_t head = g % 8;
    const int64_t take = std::min<int64_t>(8 - head, end - g);
    std::memcpy(out, reinterpret_cast<const char*>(&word) + head, take);
    out += take;
    g += take;
  }
}

struct LlamaDims {
  int64_t hidden, intermediate, kv_dim, vocab, max_layers;
};
// Qwen2.5-0.5B: 14 query heads and 2 key/value heads of 64.
constexpr LlamaDims kHalfBillion = {896, 4864, 128, 151936, 24};
constexpr LlamaDims kToy = {64, 256, 16, 4096, 24};
// A bf16 weight and AdamW's fp32 exp_avg and exp_avg_sq.
constexpr int64_t kBytesPerParam = 2 + 4 + 4;

// (name, shape) of one decoder layer's parameters, in the model's order.
std::vector<std::pair<std::string, Shape>> LlamaLayer(const LlamaDims& d,
                                                      int64_t layer) {
  const std::string p = absl::StrCat("model.layers.", layer, ".");
  const int64_t h = d.hidden, kv = d.kv_dim, m = d.intermediate;
  return {{p + "input_layernorm.weight", {h}},
          {p + "self_attn.q_proj.weight", {h, h}},
          {p + "self_attn.q_proj.bias", {h}},
          {p + "self_attn.k_proj.weight", {kv, h}},
          {p + "self_attn.k_proj.bias", {kv}},
          {p + "self_attn.v_proj.weight", {kv, h}},
          {p + "self_attn.v_proj.bias", {kv}},
          {p + "self_attn.o_proj.weight", {h, h}},
          {p + "post_attention_layernorm.weight", {h}},
          {p + "mlp.gate_proj.weight", {m, h}},
          {p + "mlp.up_proj.weight", {m, h}},
          {p + "mlp.down_proj.weight", {h, m}}};
}

int64_t Params(const std::vector<std::pair<std::string, Shape>>& params) {
  int64_t n = 0;
  for (const auto& [name, shape] : params) n += NumElements(shape);
  return n;
}

Layout MakeLlama(int64_t budget) {
  LlamaDims d = kHalfBillion;
  auto fixed = [](const LlamaDims& d) { return d.vocab * d.hidden + d.hidden; };
  if (budget < kBytesPerParam * (fixed(d) + 2 * Params(LlamaLayer(d, 0)))) {
    d = kToy;
  }
  const int64_t per_layer = Params(LlamaLayer(d, 0));
  const int64_t layers = std::clamp<int64_t>(
      (budget / kBytesPerParam - fixed(d)) / per_layer, 1, d.max_layers);
  std::vector<std::pair<std::string, Shape>> params = {
      {"model.embed_tokens.weight", {d.vocab, d.hidden}}};
  for (int64_t i = 0; i < layers; ++i) {
    for (auto& p : LlamaLayer(d, i)) params.push_back(std::move(p));
  }
  params.push_back({"model.norm.weight", {d.hidden}});
  Layout layout{"llama"};
  for (const auto& [name, shape] : params) {
    layout.Add({"model", name}, DType::kBF16, shape);
  }
  for (const auto& [name, shape] : params) {
    layout.Add({"optim", "state", name, "step"}, DType::kF32, {});
    layout.Add({"optim", "state", name, "exp_avg"}, DType::kF32, shape);
    layout.Add({"optim", "state", name, "exp_avg_sq"}, DType::kF32, shape);
  }
  layout.dims = {{"hidden", d.hidden}, {"intermediate", d.intermediate},
                 {"kv_dim", d.kv_dim}, {"vocab", d.vocab},
                 {"layers", layers},   {"parameters", Params(params)}};
  return layout;
}

Layout MakeMoe(int64_t budget) {
  constexpr int64_t kHidden = 512, kExpertDim = 96, kBlock = 128;
  const int64_t matrix = kHidden * kExpertDim;  // fp8: one byte each.
  const Shape up_scales = {(kExpertDim + kBlock - 1) / kBlock,
                           (kHidden + kBlock - 1) / kBlock};
  const Shape down_scales = {up_scales[1], up_scales[0]};
  const int64_t per_expert = 3 * (matrix + 4 * NumElements(up_scales));
  const int64_t router_row = kHidden * 2;  // bf16.
  int64_t experts = 256;
  int64_t layers = budget / (experts * (per_expert + router_row));
  if (layers < 1) {
    layers = 1;
    experts = std::max<int64_t>(1, budget / (per_expert + router_row));
  }
  Layout layout{"moe"};
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".mlp.");
    layout.Add({"model", p + "gate.weight"}, DType::kBF16, {experts, kHidden});
    for (int64_t e = 0; e < experts; ++e) {
      const std::string x = absl::StrCat(p, "experts.", e, ".");
      for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
        const bool down = std::strcmp(proj, "down_proj") == 0;
        const std::string name = absl::StrCat(x, proj);
        layout.Add(
            {"model", name + ".weight"}, DType::kF8E4M3,
            down ? Shape{kHidden, kExpertDim} : Shape{kExpertDim, kHidden});
        layout.Add({"model", name + ".weight_scale_inv"}, DType::kF32,
                   down ? down_scales : up_scales);
      }
    }
  }
  layout.dims = {{"hidden", kHidden},
                 {"expert_dim", kExpertDim},
                 {"experts_per_layer", experts},
                 {"layers", layers},
                 {"expert_matrices", 3 * experts * layers}};
  return layout;
}

Layout MakeTiny(int64_t count) {
  static const std::vector<std::pair<DType, Shape>> kCycle = {
      {DType::kF32, {1024}}, {DType::kBF16, {2048}}, {DType::kF32, {16, 32}},
      {DType::kBF16, {512}}, {DType::kF32, {64}},    {DType::kF32, {}},
      {DType::kI64, {8}},    {DType::kF32, {32, 32}}};
  Layout layout{kTiny};
  for (int64_t i = 0; i < count; ++i) {
    const auto& [dtype, shape] = kCycle[i % kCycle.size()];
    layout.Add({"model", absl::StrCat("blocks.", i / kCycle.size(), ".t",
                                      i % kCycle.size())},
               dtype, shape);
  }
  layout.dims = {{"tensors", count}, {"largest_bytes", 4096}};
  return layout;
}

void Insert(StateDict& root, const std::vector<std::string>& path, Tensor t) {
  StateDict* dict = &root;
  for (size_t i = 0; i + 1 < path.size(); ++i) {
    StateValue& v = (*dict)[path[i]];
    if (v.kind() != StateValue::Kind::kDict) v = StateDict{};
    dict = &v.dict();
  }
  (*dict)[path.back()] = std::move(t);
}

}  // namespace

uint64_t StreamKey(uint64_t seed, const std::string& layout) {
  uint64_t key = seed;
  for (unsigned char c : layout) key = SplitMix64(key ^ c);
  return key;
}

absl::StatusOr<Layout> MakeLayout(const std::string& name,
                                  const LayoutSizes& sizes) {
  if (name == "llama") return MakeLlama(sizes.llama_bytes);
  if (name == "moe") return MakeMoe(sizes.moe_bytes);
  if (name == kTiny) return MakeTiny(sizes.tiny_count);
  if (name == kTinyOne) {
    Layout layout{kTinyOne};
    layout.Add({"model", "flat"}, DType::kU8,
               {MakeTiny(sizes.tiny_count).bytes});
    layout.dims = {{"reference_for", kTiny}};
    return layout;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown layout \"", name, "\"; choose from llama, moe, tiny"));
}

json LayoutSpec(const Layout& layout, uint64_t seed) {
  json tensors = json::array();
  for (const TensorSpec& t : layout.tensors) {
    tensors.push_back({t.path, std::string(DTypeName(t.dtype)), t.shape});
  }
  json samples = json::array();
  const uint64_t key = StreamKey(seed, layout.name);
  const size_t step = std::max<size_t>(1, layout.tensors.size() / 64);
  for (size_t i = 0; i < layout.tensors.size(); i += step) {
    const TensorSpec& t = layout.tensors[i];
    std::byte head[16];
    const int64_t n = std::min<int64_t>(sizeof(head), t.nbytes);
    FillStream(key, t.stream_offset, n, head);
    std::string hex;
    for (int64_t b = 0; b < n; ++b) {
      absl::StrAppendFormat(&hex, "%02x", static_cast<unsigned>(head[b]));
    }
    samples.push_back({i, hex});
  }
  return {{"layout", layout.name},
          {"seed", seed},
          {"bytes", layout.bytes},
          {"tensors", std::move(tensors)},
          {"samples", std::move(samples)}};
}

HostState MakeState(const Layout& layout, uint64_t key, bool fill,
                    std::vector<std::byte*>* data) {
  std::vector<size_t> offsets;
  size_t end = 0;
  for (const TensorSpec& t : layout.tensors) {
    const size_t align = t.nbytes >= 4096 ? 4096 : 64;
    end = (end + align - 1) / align * align;
    offsets.push_back(end);
    end += t.nbytes;
  }
  const size_t padded = std::max<size_t>((end + 4095) / 4096 * 4096, 4096);
  void* block = std::aligned_alloc(4096, padded);
  if (block == nullptr) throw std::bad_alloc();
  HostState s;
  s.memory = std::shared_ptr<void>(block, [](void* p) { std::free(p); });
  std::byte* base = static_cast<std::byte*>(block);
  if (!fill) std::memset(base, 0, padded);
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    const TensorSpec& t = layout.tensors[i];
    std::byte* p = base + offsets[i];
    if (fill) FillStream(key, t.stream_offset, t.nbytes, p);
    data->push_back(p);
    Insert(s.state, t.path,
           Tensor::WithOwner(TensorView(p, t.dtype, t.shape), s.memory));
  }
  return s;
}

absl::Status Verify(const Layout& layout, uint64_t key,
                    const std::vector<std::byte*>& data) {
  std::vector<std::byte> expected(size_t{1} << 20);
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    const TensorSpec& t = layout.tensors[i];
    for (int64_t off = 0; off < t.nbytes; off += expected.size()) {
      const int64_t n = std::min<int64_t>(expected.size(), t.nbytes - off);
      FillStream(key, t.stream_offset + off, n, expected.data());
      if (std::memcmp(expected.data(), data[i] + off, n) != 0) {
        return absl::DataLossError(absl::StrCat(
            absl::StrJoin(t.path, "."), " differs from the generated bytes in ",
            "[", off, ", ", off + n, ")"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace dcp::layouts_bench
