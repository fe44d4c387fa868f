// Hugging Face (safetensors) and MEGA save and load against dcp's native
// format, in one run, on one directory, with the same state:
//
//   bazel-bin/bench/hf_bench --size 1GiB --dir /tmp/hf_bench [--repeat 3]
//                            [--layout aligned|odd] [--direct on|off]
//                            [--threads N]
//
// The state is a model-like set of tensors: per layer a [2048, 4096] BF16
// weight (16 MiB) and a [4096] F32 norm; --layout odd adds a [4097] BF16
// bias per layer, so most tensors start at file offsets that are not 4 KiB
// aligned (every byte then goes through the writer's bounce buffers). Each
// repetition, for each format (the order alternates between repetitions):
// save into an empty directory (dcp::Save with a FileSystemWriter or a
// HuggingFaceStorageWriter or a MegaStorageWriter, files fsynced), drop the
// checkpoint from the page cache, load into preallocated zero-filled tensors
// (dcp::Load with the matching reader), and check every byte. A third row,
// "hub", loads a file laid out as the reference writer lays it out (8-byte
// aligned data, so no tensor starts 4 KiB aligned: every byte takes the
// reader's bounce path), written plainly (its save time is not dcp's). Prints
// GB/s (1e9 bytes/s of tensor data) per repetition and the medians, and the
// ratios.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/checkpoint.h"
#include "io/file_system_storage.h"
#include "io/hf_storage.h"
#include "io/mega_storage.h"
#include "io/safetensors.h"
#include "tools/machine_info.h"
#include "tools/page_cache.h"

namespace dcp {
namespace {

namespace fs = std::filesystem;

int64_t ParseSize(const std::string& text) {
  double value = std::stod(text);
  std::string unit = text.substr(text.find_first_not_of("0123456789."));
  if (unit == "GiB") value *= double(1 << 30);
  if (unit == "MiB") value *= double(1 << 20);
  return static_cast<int64_t>(value);
}

StateDict MakeState(int64_t total_bytes, bool odd, uint64_t seed, bool fill) {
  const int64_t per_layer = 2048 * 4096 * 2;
  const int layers =
      static_cast<int>(std::max<int64_t>(1, total_bytes / per_layer));
  StateDict state;
  uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
  auto add = [&](const std::string& name, DType dtype, Shape shape) {
    Tensor t = Tensor::Empty(dtype, std::move(shape));
    if (fill) {
      auto* words = static_cast<uint64_t*>(t.data());
      for (size_t i = 0; i < t.nbytes() / 8; ++i) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        words[i] = x;
      }
      auto* bytes = static_cast<uint8_t*>(t.data());
      for (size_t i = t.nbytes() / 8 * 8; i < t.nbytes(); ++i) bytes[i] = i;
    }
    state[name] = t;
  };
  for (int i = 0; i < layers; ++i) {
    const std::string prefix = absl::StrCat("model.layers.", i, ".");
    add(prefix + "weight", DType::kBF16, {2048, 4096});
    add(prefix + "norm", DType::kF32, {4096});
    if (odd) add(prefix + "bias", DType::kBF16, {4097});
  }
  return state;
}

// What a file from the Hugging Face hub looks like: the reference
// writer's order and 8-byte alignment, so tensors start at offsets that
// are not 4 KiB aligned. Written plainly and fsynced ("save" time of the
// hub rows is this, not dcp's).
absl::Status WriteHubFile(const std::string& dir, const StateDict& state) {
  std::vector<SafetensorsTensor> layout;
  for (const auto& [name, value] : state) {
    layout.push_back({name, value.tensor().dtype(), value.tensor().sizes()});
  }
  SortForSafetensors(layout);
  absl::StatusOr<std::string> header =
      EncodeSafetensorsHeader(layout, {{"format", "pt"}});
  if (!header.ok()) return header.status();
  fs::create_directories(dir);
  const std::string path = absl::StrCat(dir, "/", kHfSingleFileName);
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return absl::InternalError("cannot create " + path);
  std::fwrite(header->data(), 1, header->size(), f);
  for (const SafetensorsTensor& t : layout) {
    const Tensor& tensor = state.at(t.name).tensor();
    std::fwrite(tensor.data(), 1, tensor.nbytes(), f);
  }
  std::fflush(f);
  ::fsync(fileno(f));
  std::fclose(f);
  return absl::OkStatus();
}

int64_t TensorBytes(const StateDict& state) {
  int64_t bytes = 0;
  for (const auto& [name, value] : state) bytes += value.tensor().nbytes();
  return bytes;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since)
      .count();
}

int Main(int argc, char** argv) {
  CLI::App app("HF (safetensors) vs native save/load");
  std::string size = "1GiB", dir = "/tmp/hf_bench", layout = "aligned",
              direct = "on";
  int repeat = 3, threads = 1;
  app.add_option("--size", size);
  app.add_option("--dir", dir);
  app.add_option("--repeat", repeat);
  app.add_option("--layout", layout)->check(CLI::IsMember({"aligned", "odd"}));
  app.add_option("--direct", direct)->check(CLI::IsMember({"on", "off"}));
  app.add_option("--threads", threads);
  CLI11_PARSE(app, argc, argv);
  const bool use_direct = direct == "on";
  fs::create_directories(dir);
  const StateDict source = MakeState(ParseSize(size), layout == "odd", 1, true);
  StateDict target = MakeState(ParseSize(size), layout == "odd", 1, false);
  const int64_t bytes = TensorBytes(source);
  std::printf(
      "# %s\n# hf_bench --size %s --layout %s --direct %s "
      "--threads %d: %zu tensors, %.3f GB\n",
      MachineSummary(DescribeMachine(dir)).c_str(), size.c_str(),
      layout.c_str(), direct.c_str(), threads, source.size(), bytes / 1e9);
  std::map<std::string, std::vector<double>> save_gbs, load_gbs;
  for (int r = 0; r < repeat; ++r) {
    std::vector<std::string> formats = {"native", "hf", "mega", "hub"};
    if (r % 2 == 1) std::reverse(formats.begin(), formats.end());
    for (const std::string& format : formats) {
      const std::string path = absl::StrCat(dir, "/", format);
      fs::remove_all(path);
      ::sync();
      FileSystemWriterOptions native_writer_options;
      native_writer_options.direct_io = use_direct;
      native_writer_options.thread_count = threads;
      HuggingFaceStorageWriterOptions hf_writer_options;
      hf_writer_options.direct_io = use_direct;
      hf_writer_options.thread_count = threads;
      if (threads > 1) {
        // One file per thread, layers dealt round-robin.
        int i = 0;
        for (const auto& [name, value] : source) {
          hf_writer_options.fqn_to_index_mapping[name] = 1 + (i++ % threads);
        }
      }
      MegaStorageWriterOptions mega_writer_options;
      mega_writer_options.direct_io = use_direct;
      mega_writer_options.thread_count = threads;
      mega_writer_options.fqn_to_index_mapping =
          hf_writer_options.fqn_to_index_mapping;
      FileSystemWriter native_writer(path, native_writer_options);
      HuggingFaceStorageWriter hf_writer(path, hf_writer_options);
      MegaStorageWriter mega_writer(path, mega_writer_options);
      SaveOptions save;
      save.storage_writer =
          format == "hf"     ? static_cast<StorageWriter*>(&hf_writer)
          : format == "mega" ? static_cast<StorageWriter*>(&mega_writer)
                             : &native_writer;
      auto start = std::chrono::steady_clock::now();
      absl::Status saved = format == "hub" ? WriteHubFile(path, source)
                                           : Save(source, save).status();
      const double save_s = Seconds(start);
      if (!saved.ok()) {
        std::fprintf(stderr, "%s save: %s\n", format.c_str(),
                     saved.ToString().c_str());
        return 1;
      }
      DropPageCache(path);
      for (auto& [name, value] : target) {
        std::memset(value.tensor().data(), 0, value.tensor().nbytes());
      }
      FileSystemReaderOptions native_reader_options;
      native_reader_options.direct_io = use_direct;
      native_reader_options.thread_count = threads;
      HuggingFaceStorageReaderOptions hf_reader_options;
      hf_reader_options.direct_io = use_direct;
      hf_reader_options.thread_count = threads;
      FileSystemReader native_reader(path, native_reader_options);
      HuggingFaceStorageReader hf_reader(path, hf_reader_options);
      MegaStorageReader mega_reader(path, native_reader_options);
      LoadOptions load;
      load.storage_reader =
          format == "native" ? static_cast<StorageReader*>(&native_reader)
          : format == "mega" ? static_cast<StorageReader*>(&mega_reader)
                             : &hf_reader;
      start = std::chrono::steady_clock::now();
      absl::Status loaded = Load(target, load);
      const double load_s = Seconds(start);
      if (!loaded.ok()) {
        std::fprintf(stderr, "%s load: %s\n", format.c_str(),
                     loaded.ToString().c_str());
        return 1;
      }
      for (const auto& [name, value] : source) {
        if (!value.tensor().BytesEqual(target.at(name).tensor())) {
          std::fprintf(stderr, "%s load: %s differs\n", format.c_str(),
                       name.c_str());
          return 1;
        }
      }
      if (format != "hub") save_gbs[format].push_back(bytes / save_s / 1e9);
      load_gbs[format].push_back(bytes / load_s / 1e9);
      std::printf(
          "rep %d %-6s save %6.3f s %6.2f GB/s   load %6.3f s %6.2f "
          "GB/s\n",
          r + 1, format.c_str(), save_s, bytes / save_s / 1e9, load_s,
          bytes / load_s / 1e9);
      std::fflush(stdout);
      fs::remove_all(path);
    }
  }
  for (const std::string format : {"native", "hf", "mega", "hub"}) {
    std::printf("median %-6s save %6.2f GB/s   load %6.2f GB/s\n",
                format.c_str(), Median(save_gbs[format]),
                Median(load_gbs[format]));
  }
  std::printf("hf/native     save %6.2fx       load %6.2fx\n",
              Median(save_gbs["hf"]) / Median(save_gbs["native"]),
              Median(load_gbs["hf"]) / Median(load_gbs["native"]));
  std::printf("mega/native   save %6.2fx       load %6.2fx\n",
              Median(save_gbs["mega"]) / Median(save_gbs["native"]),
              Median(load_gbs["mega"]) / Median(load_gbs["native"]));
  std::printf("hub/native                        load %6.2fx\n",
              Median(load_gbs["hub"]) / Median(load_gbs["native"]));
  return 0;
}

}  // namespace
}  // namespace dcp

int main(int argc, char** argv) { return dcp::Main(argc, argv); }
