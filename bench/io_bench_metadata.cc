// Measures metadata encode/decode at scale (docs/FORMAT.md promises it stays
// fast at a million items): what each rank of a load pays to decode the
// metadata file, and what the coordinator of a save pays to encode the
// metadata it broadcasts (the same encoding).
//
//   bazel run -c opt //bench:io_bench_metadata -- [items]
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
  Metadata metadata;
  for (int64_t i = 0; i < items; ++i) {
    const std::string fqn =
        absl::StrCat("model.layers.", i / 16, ".block.param_", i % 16);
    TensorStorageMetadata tensor;
    tensor.properties.dtype = DType::kBF16;
    tensor.size = {4096, 1024};
    tensor.chunks = {{{0, 0}, {4096, 1024}}};
    metadata.state_dict_metadata.emplace(fqn, std::move(tensor));
    metadata.flatten_mapping.emplace(
        fqn,
        ObjectPath{std::string("model"), std::string("layers"), int64_t{i / 16},
                   std::string("block"), absl::StrCat("param_", i % 16)});
    metadata.storage_data.emplace(
        MetadataIndex(fqn, Shape{0, 0}),
        StorageInfo{absl::StrCat("__", i % 64, "_0123456789abcdef_0.distcp"),
                    (i / 64) * (8 << 20),
                    8 << 20,
                    {uint64_t(i) * 31, uint64_t(i) * 37}});
  }
  auto start = std::chrono::steady_clock::now();
  std::string bytes = *EncodeMetadata(metadata);
  const double encode = Seconds(start);
  start = std::chrono::steady_clock::now();
  absl::StatusOr<Metadata> decoded = DecodeMetadata(bytes, "bench");
  const double decode = Seconds(start);
  if (!decoded.ok() ||
      decoded->storage_data.size() != metadata.storage_data.size()) {
    std::fprintf(stderr, "decode failed\n");
    return 1;
  }
  std::printf(
      "{\"items\": %lld, \"metadata_bytes\": %zu, \"encode_seconds\": %.3f, "
      "\"decode_seconds\": %.3f}\n",
      static_cast<long long>(items), bytes.size(), encode, decode);
  return 0;
}
