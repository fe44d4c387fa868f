// Measures metadata encode/decode at scale (docs/FORMAT.md promises it stays
// fast at a million items): what each rank of a load pays to decode the
// metadata file, and what the coordinator of a save pays to encode the
// metadata it broadcasts (the same encoding).
//
//   bazel run -c opt //bench:io_bench_metadata -- [items [chunks]]
//
// `chunks` (default 1, a power of two up to 4096): each tensor is saved as
// that many row shards (a sharded save's layout; the decoder checks the
// chunks of a tensor are disjoint), `items` stored items in all.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "io/metadata_format.h"

namespace {

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dcp;
  const int64_t items = argc > 1 ? std::atoll(argv[1]) : 1000000;
  const int64_t chunks = argc > 2 ? std::atoll(argv[2]) : 1;
  if (chunks < 1 || chunks > 4096 || (chunks & (chunks - 1)) != 0) {
    std::fprintf(stderr, "chunks must be a power of two up to 4096\n");
    return 2;
  }
  const int64_t rows = 4096 / chunks;
  Metadata metadata;
  for (int64_t t = 0; t < items / chunks; ++t) {
    const std::string fqn =
        absl::StrCat("model.layers.", t / 16, ".block.param_", t % 16);
    TensorStorageMetadata tensor;
    tensor.properties.dtype = DType::kBF16;
    tensor.size = {4096, 1024};
    // Listed in reverse: the decoder must not rely on the order.
    for (int64_t c = chunks; c-- > 0;) {
      tensor.chunks.push_back({{c * rows, 0}, {rows, 1024}});
    }
    metadata.state_dict_metadata.emplace(fqn, std::move(tensor));
    metadata.flatten_mapping.emplace(
        fqn,
        ObjectPath{std::string("model"), std::string("layers"), int64_t{t / 16},
                   std::string("block"), absl::StrCat("param_", t % 16)});
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t i = t * chunks + c;
      metadata.storage_data.emplace(
          MetadataIndex(fqn, Shape{c * rows, 0}),
          StorageInfo{absl::StrCat("__", i % 64, "_0123456789abcdef_0.distcp"),
                      (i / 64) * (8 << 20) / chunks,
                      (8 << 20) / chunks,
                      {uint64_t(i) * 31, uint64_t(i) * 37}});
    }
  }
  auto start = std::chrono::steady_clock::now();
  std::string bytes = *EncodeMetadata(metadata);
  const double encode = Seconds(start);
  start = std::chrono::steady_clock::now();
  absl::StatusOr<Metadata> decoded = DecodeMetadata(bytes, "bench");
  const double decode = Seconds(start);
  if (!decoded.ok() ||
      decoded->storage_data.size() != metadata.storage_data.size()) {
    std::fprintf(
        stderr, "decode failed: %s\n",
        decoded.ok() ? "items lost" : decoded.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "{\"items\": %lld, \"chunks_per_tensor\": %lld, "
      "\"metadata_bytes\": %zu, \"encode_seconds\": %.3f, "
      "\"decode_seconds\": %.3f}\n",
      static_cast<long long>(metadata.storage_data.size()),
      static_cast<long long>(chunks), bytes.size(), encode, decode);
  return 0;
}
