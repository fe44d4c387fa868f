// The C++ side of tests/hf_interop_test.py: saves tensors given as raw
// bytes through dcp::Save with a HuggingFaceStorageWriter, and loads a
// Hugging Face directory through dcp::Load with a HuggingFaceStorageReader
// into raw bytes, so the reference `safetensors` library and dcp can be
// compared byte for byte.
//
//   hf_interop_helper save DIR MANIFEST
//     MANIFEST: {"tensors": [{"name", "dtype", "shape", "file"}],
//                "mapping": {name: index} (optional),
//                "save_distributed": bool, "enable_consolidation": bool}
//   hf_interop_helper load DIR OUTDIR [--rows-from-third]
//     Loads every tensor of DIR (with --rows-from-third: rows [n/3, n) of
//     each tensor of rank >= 1, as a shard) and writes OUTDIR/NAME.bin with
//     the bytes and OUTDIR/manifest.json with {name: {dtype, shape, offsets}}.
//   hf_interop_helper load-quantized DIR OUTDIR TARGET BLOCK THREADS [BOXES]
//     The same through a QuantizedHuggingFaceStorageReader (TARGET F32, BF16
//     or F16). BOXES, a JSON file: {name: {"offsets", "lengths"}} loads
//     those tensors as that one shard. The manifest adds "__stats__".
//
// Exits 0 on success, 1 with the error on stderr.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/state_dict.h"
#include "core/status.h"
#include "engine/checkpoint.h"
#include "io/hf_quantized_storage.h"
#include "io/hf_storage.h"
#include "nlohmann/json.hpp"

namespace dcp {
namespace {

using Json = nlohmann::json;

absl::StatusOr<std::string> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

absl::Status Save(const std::string& dir, const std::string& manifest_path) {
  DCP_ASSIGN_OR_RETURN(std::string text, ReadAll(manifest_path));
  const Json manifest = Json::parse(text);
  StateDict state;
  for (const Json& t : manifest["tensors"]) {
    DCP_ASSIGN_OR_RETURN(DType dtype,
                         DTypeFromName(t["dtype"].get<std::string>()));
    Tensor tensor = Tensor::Empty(dtype, t["shape"].get<Shape>());
    DCP_ASSIGN_OR_RETURN(std::string bytes,
                         ReadAll(t["file"].get<std::string>()));
    if (bytes.size() != tensor.nbytes()) {
      return absl::InvalidArgumentError(
          absl::StrCat(t["name"].dump(), ": ", bytes.size(), " bytes"));
    }
    std::copy(bytes.begin(), bytes.end(), static_cast<char*>(tensor.data()));
    state[t["name"].get<std::string>()] = tensor;
  }
  HuggingFaceStorageWriterOptions options;
  if (manifest.contains("mapping")) {
    options.fqn_to_index_mapping =
        manifest["mapping"].get<std::map<std::string, int>>();
  }
  options.save_distributed = manifest.value("save_distributed", false);
  options.enable_consolidation = manifest.value("enable_consolidation", false);
  HuggingFaceStorageWriter writer(dir, options);
  SaveOptions save;
  save.storage_writer = &writer;
  // Nested keys would be flattened; the manifest's names are flat already.
  return dcp::Save(state, save).status();
}

// Writes each loaded tensor (its one shard) to OUT/I.bin, its name in
// `manifest`, and the manifest to OUT/manifest.json.
void WriteLoaded(const StateDict& state, const std::string& out,
                 Json& manifest) {
  int i = 0;
  for (const auto& [name, value] : state) {
    const Tensor& t = value.is_tensor()
                          ? value.tensor()
                          : value.sharded_tensor().local_shards()[0].tensor;
    const std::string file = absl::StrCat(out, "/", i++, ".bin");
    std::ofstream(file, std::ios::binary)
        .write(static_cast<const char*>(t.data()), t.nbytes());
    manifest[name]["file"] = file;
  }
  std::ofstream(absl::StrCat(out, "/manifest.json")) << manifest.dump(1);
}

absl::Status Load(const std::string& dir, const std::string& out,
                  bool rows_from_third) {
  HuggingFaceStorageReader reader(dir);
  DCP_ASSIGN_OR_RETURN(Metadata metadata, reader.ReadMetadata());
  StateDict state;
  Json manifest = Json::object();
  for (const auto& [name, value] : metadata.state_dict_metadata) {
    const auto& tensor = std::get<TensorStorageMetadata>(value);
    const DType dtype = tensor.properties.dtype;
    Shape offsets(tensor.size.size(), 0);
    Shape sizes = tensor.size;
    if (rows_from_third && !sizes.empty()) {
      offsets[0] = sizes[0] / 3;
      sizes[0] -= offsets[0];
      state[name] = ShardedTensor(
          dtype, tensor.size, {Shard{offsets, Tensor::Empty(dtype, sizes)}});
    } else {
      state[name] = Tensor::Empty(dtype, sizes);
    }
    manifest[name] = {{"dtype", std::string(DTypeName(dtype))},
                      {"shape", sizes},
                      {"offsets", offsets}};
  }
  LoadOptions load;
  load.storage_reader = &reader;
  DCP_RETURN_IF_ERROR(dcp::Load(state, load));
  WriteLoaded(state, out, manifest);
  return absl::OkStatus();
}

absl::Status LoadQuantized(const std::string& dir, const std::string& out,
                           const std::string& target, int block, int threads,
                           const std::string& boxes_path) {
  QuantizedHuggingFaceStorageReaderOptions options;
  DCP_ASSIGN_OR_RETURN(options.target_dtype, DTypeFromName(target));
  options.block_size = block;
  options.thread_count = threads;
  options.read_window_bytes = 64 << 10;  // Several windows per tensor.
  Json boxes = Json::object();
  if (!boxes_path.empty()) {
    DCP_ASSIGN_OR_RETURN(std::string text, ReadAll(boxes_path));
    boxes = Json::parse(text);
  }
  QuantizedHuggingFaceStorageReader reader(dir, options);
  DCP_ASSIGN_OR_RETURN(Metadata metadata, reader.ReadMetadata());
  StateDict state;
  Json manifest = Json::object();
  for (const auto& [name, value] : metadata.state_dict_metadata) {
    const auto& tensor = std::get<TensorStorageMetadata>(value);
    const DType dtype = tensor.properties.dtype;
    Shape offsets(tensor.size.size(), 0);
    Shape sizes = tensor.size;
    if (boxes.contains(name)) {
      offsets = boxes[name]["offsets"].get<Shape>();
      sizes = boxes[name]["lengths"].get<Shape>();
      state[name] = ShardedTensor(
          dtype, tensor.size, {Shard{offsets, Tensor::Empty(dtype, sizes)}});
    } else {
      state[name] = Tensor::Empty(dtype, sizes);
    }
    manifest[name] = {{"dtype", std::string(DTypeName(dtype))},
                      {"shape", sizes},
                      {"offsets", offsets}};
  }
  LoadOptions load;
  load.storage_reader = &reader;
  DCP_RETURN_IF_ERROR(dcp::Load(state, load));
  manifest["__stats__"] = {{"fp8_bytes_read", reader.quantized_bytes_read()},
                           {"scales_read", reader.scale_tensors_read()}};
  WriteLoaded(state, out, manifest);
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  const std::string command = argc > 1 ? argv[1] : "";
  absl::Status status;
  if (command == "save" && argc == 4) {
    status = Save(argv[2], argv[3]);
  } else if (command == "load" && (argc == 4 || argc == 5)) {
    status = Load(argv[2], argv[3],
                  argc == 5 && std::string(argv[4]) == "--rows-from-third");
  } else if (command == "load-quantized" && (argc == 7 || argc == 8)) {
    status = LoadQuantized(argv[2], argv[3], argv[4], std::atoi(argv[5]),
                           std::atoi(argv[6]), argc == 8 ? argv[7] : "");
  } else {
    std::fprintf(stderr,
                 "usage: hf_interop_helper save DIR MANIFEST | load DIR "
                 "OUTDIR [--rows-from-third] | load-quantized DIR OUTDIR "
                 "TARGET BLOCK THREADS [BOXES]\n");
    return 2;
  }
  if (!status.ok()) {
    std::fprintf(stderr, "hf_interop_helper: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace dcp

int main(int argc, char** argv) { return dcp::Main(argc, argv); }
