#include "tools/synthetic_state.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace dcp {
namespace {

// Layers of one F32 weight (sharded), one BF16 weight (sharded), an F32
// bias (replicated); the optimizer keeps F32 exp_avg/exp_avg_sq (sharded)
// and an I64 step per layer. Per layer: 4*R*C + 2*R*C + 8*R*C bytes.
constexpr int kLayers = 8;
constexpr int64_t kCols = 1024;
constexpr int64_t kBytesPerRowAndCol = 14;

// R, the rows of every layer's sharded tensors, for `total_bytes`.
int64_t SyntheticRows(int64_t total_bytes) {
  const int64_t per_layer = std::max<int64_t>(total_bytes / kLayers, 1);
  return std::max<int64_t>(per_layer / (kBytesPerRowAndCol * kCols), 1);
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

uint64_t NameKey(uint64_t seed, const std::string& name) {
  uint64_t key = seed;
  for (char c : name) key = SplitMix64(key ^ static_cast<uint8_t>(c));
  return key;
}

// Writes the `n` bytes at `global_byte_offset` of the tensor keyed `key`:
// they depend only on (key, global byte offset), so any chunking of the
// same tensor sees the same values.
void FillBytes(unsigned char* out, int64_t n, uint64_t key,
               int64_t global_byte_offset) {
  int64_t i = 0;
  // Word-aligned in global coordinates so chunks agree.
  while (i < n && (global_byte_offset + i) % 8 != 0) {
    const int64_t g = global_byte_offset + i;
    out[i++] =
        static_cast<unsigned char>(SplitMix64(key + g / 8) >> (8 * (g % 8)));
  }
  for (; i + 8 <= n; i += 8) {
    const uint64_t word = SplitMix64(key + (global_byte_offset + i) / 8);
    std::memcpy(out + i, &word, 8);
  }
  for (; i < n; ++i) {
    const int64_t g = global_byte_offset + i;
    out[i] =
        static_cast<unsigned char>(SplitMix64(key + g / 8) >> (8 * (g % 8)));
  }
}

void FillChunk(Tensor& t, uint64_t seed, const std::string& name,
               int64_t global_byte_offset) {
  FillBytes(static_cast<unsigned char*>(t.data()),
            static_cast<int64_t>(t.nbytes()), NameKey(seed, name),
            global_byte_offset);
}

Tensor MakeTensor(DType dtype, Shape sizes, const SyntheticStateOptions& o,
                  const std::string& name, int64_t global_byte_offset = 0) {
  Tensor t = Tensor::Empty(dtype, std::move(sizes));
  if (o.fill) FillChunk(t, o.seed, name, global_byte_offset);
  return t;
}

// Rows [begin, end) of `rows` owned by `rank` out of `world` (uneven split).
std::pair<int64_t, int64_t> RowRange(int64_t rows, int rank, int world) {
  const int64_t base = rows / world, extra = rows % world;
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

ShardedTensor MakeRowSharded(DType dtype, int64_t rows, int64_t cols,
                             const SyntheticStateOptions& o,
                             const std::string& name) {
  auto [begin, end] = RowRange(rows, o.rank, o.world_size);
  const int64_t row_bytes = cols * static_cast<int64_t>(ElementSize(dtype));
  std::vector<Shard> shards;
  shards.push_back(Shard{
      {begin, 0},
      MakeTensor(dtype, {end - begin, cols}, o, name, begin * row_bytes)});
  return ShardedTensor(dtype, {rows, cols}, std::move(shards));
}

}  // namespace

StateDict MakeSyntheticState(const SyntheticStateOptions& o) {
  const int64_t rows = SyntheticRows(o.total_bytes);

  StateDict model;
  StateDict optim_state;
  for (int layer = 0; layer < kLayers; ++layer) {
    const std::string prefix = absl::StrCat("model.layers.", layer);
    StateDict params;
    params["weight"] =
        MakeRowSharded(DType::kF32, rows, kCols, o, prefix + ".weight");
    params["proj_bf16"] =
        MakeRowSharded(DType::kBF16, rows, kCols, o, prefix + ".proj_bf16");
    params["bias"] = MakeTensor(DType::kF32, {kCols}, o, prefix + ".bias");
    model[absl::StrCat("layers.", layer)] = std::move(params);

    const std::string opt = absl::StrCat("optim.state.", layer);
    StateDict state;
    state["exp_avg"] =
        MakeRowSharded(DType::kF32, rows, kCols, o, opt + ".exp_avg");
    state["exp_avg_sq"] =
        MakeRowSharded(DType::kF32, rows, kCols, o, opt + ".exp_avg_sq");
    state["step"] = MakeTensor(DType::kI64, {}, o, opt + ".step");
    optim_state[absl::StrCat(layer)] = std::move(state);
  }
  StateDict group;
  group["lr"] = o.fill ? 3e-4 : 0.0;
  group["betas"] = StateList{o.fill ? 0.9 : 0.0, o.fill ? 0.999 : 0.0};
  group["name"] = std::string(o.fill ? "adamw" : "");
  StateDict optim;
  optim["state"] = std::move(optim_state);
  optim["param_groups"] = StateList{std::move(group)};

  StateDict state;
  state["model"] = std::move(model);
  state["optim"] = std::move(optim);
  state["epoch"] = int64_t{o.fill ? 7 : 0};
  state["rng_state"] = Bytes{o.fill ? std::string("\x01\x02\x00\xff", 4) : ""};
  return state;
}

Shape SyntheticSizeTensorShape(int64_t total_bytes) {
  return {SyntheticRows(total_bytes), kCols};
}

absl::StatusOr<int64_t> SyntheticTotalBytesForShape(const Shape& shape) {
  if (shape.size() != 2 || shape[0] < 1 || shape[1] != kCols) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape ", ShapeToString(shape), " of ", kSyntheticSizeTensor,
        " is not a synthetic state's ([rows >= 1, ", kCols, "])"));
  }
  // SyntheticRows of rows x (bytes per row of all layers) is `rows`.
  int64_t total = 0;
  if (__builtin_mul_overflow(shape[0], kLayers * kBytesPerRowAndCol * kCols,
                             &total)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape ", ShapeToString(shape), " of ", kSyntheticSizeTensor,
        " means a synthetic state of more than 2^63 bytes"));
  }
  return total;
}

namespace {

void AddBytes(const StateValue& v, int64_t& total) {
  switch (v.kind()) {
    case StateValue::Kind::kTensor:
      total += static_cast<int64_t>(v.tensor().nbytes());
      break;
    case StateValue::Kind::kShardedTensor:
      for (const Shard& s : v.sharded_tensor().local_shards()) {
        total += static_cast<int64_t>(s.tensor.nbytes());
      }
      break;
    case StateValue::Kind::kDict:
      for (const auto& [k, child] : v.dict()) AddBytes(child, total);
      break;
    case StateValue::Kind::kList:
      for (const StateValue& child : v.list()) AddBytes(child, total);
      break;
    default:
      break;
  }
}

absl::Status CompareTensor(const std::string& name, const Tensor& e,
                           const Tensor& a) {
  if (e.dtype() != a.dtype() || e.sizes() != a.sizes()) {
    return absl::DataLossError(absl::StrCat(
        name, ": expected ", DTypeName(e.dtype()), ShapeToString(e.sizes()),
        ", got ", DTypeName(a.dtype()), ShapeToString(a.sizes())));
  }
  const auto* x = static_cast<const unsigned char*>(e.data());
  const auto* y = static_cast<const unsigned char*>(a.data());
  if (e.nbytes() == 0 || std::memcmp(x, y, e.nbytes()) == 0) {
    return absl::OkStatus();
  }
  size_t i = 0;
  while (x[i] == y[i]) ++i;
  return absl::DataLossError(
      absl::StrCat(name, ": bytes differ at byte offset ", i));
}

bool PlainValueEquals(const StateValue& e, const StateValue& a) {
  switch (e.kind()) {
    case StateValue::Kind::kInt:
      return e.int_value() == a.int_value();
    case StateValue::Kind::kDouble:
      return e.double_value() == a.double_value();
    case StateValue::Kind::kBool:
      return e.bool_value() == a.bool_value();
    case StateValue::Kind::kString:
      return e.string_value() == a.string_value();
    case StateValue::Kind::kBytes:
      return e.bytes_value() == a.bytes_value();
    default:
      return true;
  }
}

}  // namespace

int64_t StateTensorBytes(const StateDict& state) {
  int64_t total = 0;
  for (const auto& [k, v] : state) AddBytes(v, total);
  return total;
}

namespace {

// Pairs the leaves of `expected` with those of `actual` by flattened name:
// kDataLoss for a missing one or a different kind, else fn(name, e, a)
// decides.
template <typename Fn>
absl::Status ForEachLeafPair(const StateDict& expected, const StateDict& actual,
                             Fn fn) {
  absl::StatusOr<FlatStateDict> e = FlattenStateDict(expected);
  absl::StatusOr<FlatStateDict> a = FlattenStateDict(actual);
  if (!e.ok()) return e.status();
  if (!a.ok()) return a.status();
  for (const auto& [name, ev] : e->leaves) {
    auto it = a->leaves.find(name);
    if (it == a->leaves.end()) {
      return absl::DataLossError(absl::StrCat(name, ": missing after load"));
    }
    const StateValue& av = it->second;
    if (ev.kind() != av.kind()) {
      return absl::DataLossError(
          absl::StrCat(name, ": expected a ", StateKindName(ev.kind()),
                       ", got a ", StateKindName(av.kind())));
    }
    absl::Status s = fn(name, ev, av);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CompareStates(const StateDict& expected, const StateDict& actual) {
  return ForEachLeafPair(
      expected, actual,
      [](const std::string& name, const StateValue& ev,
         const StateValue& av) -> absl::Status {
        if (ev.is_tensor())
          return CompareTensor(name, ev.tensor(), av.tensor());
        if (ev.is_sharded_tensor()) {
          const auto& es = ev.sharded_tensor().local_shards();
          const auto& as = av.sharded_tensor().local_shards();
          if (es.size() != as.size()) {
            return absl::DataLossError(
                absl::StrCat(name, ": shard count differs"));
          }
          for (size_t i = 0; i < es.size(); ++i) {
            DCP_RETURN_IF_ERROR(CompareTensor(absl::StrCat(name, " shard ", i),
                                              es[i].tensor, as[i].tensor));
          }
          return absl::OkStatus();
        }
        if (!PlainValueEquals(ev, av)) {
          return absl::DataLossError(absl::StrCat(name, ": value differs"));
        }
        return absl::OkStatus();
      });
}

namespace {

// Compares the contiguous host tensor `t` with the generated bytes of
// `name` at `global_byte_offset`, 8 MiB at a time.
absl::Status CheckGenerated(const std::string& what, const Tensor& t,
                            uint64_t seed, const std::string& name,
                            int64_t global_byte_offset) {
  constexpr int64_t kStep = int64_t{8} << 20;
  const uint64_t key = NameKey(seed, name);
  const auto* got = static_cast<const unsigned char*>(t.data());
  const int64_t n = static_cast<int64_t>(t.nbytes());
  std::vector<unsigned char> want(std::min(n, kStep));
  for (int64_t pos = 0; pos < n; pos += kStep) {
    const int64_t m = std::min(kStep, n - pos);
    FillBytes(want.data(), m, key, global_byte_offset + pos);
    if (std::memcmp(want.data(), got + pos, m) != 0) {
      int64_t i = 0;
      while (want[i] == got[pos + i]) ++i;
      return absl::DataLossError(
          absl::StrCat(what, ": bytes differ at byte offset ", pos + i));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status VerifySyntheticState(const StateDict& actual,
                                  const SyntheticStateOptions& options) {
  // The same layout at the smallest size: its keys, kinds and plain values
  // do not depend on the size (only the rows of the sharded tensors do).
  SyntheticStateOptions small = options;
  small.total_bytes = 0;
  small.fill = true;
  const StateDict expected = MakeSyntheticState(small);
  absl::StatusOr<FlatStateDict> flat = FlattenStateDict(actual);
  if (!flat.ok()) return flat.status();
  absl::StatusOr<FlatStateDict> flat_expected = FlattenStateDict(expected);
  if (!flat_expected.ok()) return flat_expected.status();
  if (flat->leaves.size() != flat_expected->leaves.size()) {
    return absl::DataLossError(
        absl::StrCat("expected ", flat_expected->leaves.size(), " values, got ",
                     flat->leaves.size()));
  }
  return ForEachLeafPair(
      expected, actual,
      [&](const std::string& name, const StateValue& ev,
          const StateValue& av) -> absl::Status {
        if (av.is_tensor()) {
          if (av.tensor().dtype() != ev.tensor().dtype() ||
              av.tensor().sizes() != ev.tensor().sizes()) {
            return absl::DataLossError(
                absl::StrCat(name, ": dtype or shape differs"));
          }
          return CheckGenerated(name, av.tensor(), options.seed, name, 0);
        }
        if (av.is_sharded_tensor()) {
          const ShardedTensor& st = av.sharded_tensor();
          const ShardedTensor& et = ev.sharded_tensor();
          if (st.dtype() != et.dtype() ||
              st.global_sizes().size() != et.global_sizes().size() ||
              st.global_sizes().back() != et.global_sizes().back()) {
            return absl::DataLossError(
                absl::StrCat(name, ": dtype or shape differs"));
          }
          const Shape strides = ContiguousStrides(st.global_sizes());
          for (size_t i = 0; i < st.local_shards().size(); ++i) {
            const Shard& shard = st.local_shards()[i];
            // Row shards: each is one contiguous run of the tensor.
            int64_t first = 0;
            for (size_t d = 0; d < shard.offsets.size(); ++d) {
              first += shard.offsets[d] * strides[d];
            }
            DCP_RETURN_IF_ERROR(CheckGenerated(
                absl::StrCat(name, " shard ", i), shard.tensor, options.seed,
                name, first * static_cast<int64_t>(ElementSize(st.dtype()))));
          }
          return absl::OkStatus();
        }
        if (!PlainValueEquals(ev, av)) {
          return absl::DataLossError(absl::StrCat(name, ": value differs"));
        }
        return absl::OkStatus();
      });
}

}  // namespace dcp
