// The Hugging Face measurements hf_bench does not make (docs/BENCHMARKS.md
// section 7):
//
//   bazel-bin/bench/hf_bench_extra consolidate --size 1GiB --dir D [--repeat 3]
//   bazel-bin/bench/hf_bench_extra quantized --size 1GiB --dir D [--repeat 3]
//                                   [--threads N]
//
// consolidate: the hf_bench state (per layer a [2048, 4096] BF16 weight and
// a [4096] F32 norm) saved by HuggingFaceStorageWriter with
// save_distributed and enable_consolidation (one rank: one shard per
// tensor). The time of Finish (consolidation, index, commit) and the peak
// RSS above the RSS at its start (VmHWM reset through /proc/self/
// clear_refs), with the shards dropped from the page cache first. Leaves
// D/shards/sharded/ (a save without consolidation) for
// bench/hf_torch_consolidate.py, PyTorch's consolidation of the same files.
//
// quantized: an fp8 checkpoint (per layer an F8_E4M3 [4096, 7168] weight
// with its F32 [32, 56] weight_scale_inv) loaded, alternating, (a) as stored
// (HuggingFaceStorageReader into F8_E4M3 tensors: a plain read of the same
// bytes) and (b) through QuantizedHuggingFaceStorageReader into BF16, cold
// (dropped from the page cache) and warm (cached: the CPU cost alone).
// Prints GB/s of fp8 bytes (1e9 bytes/s) per run and the medians.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "engine/checkpoint.h"
#include "io/hf_quantized_storage.h"
#include "io/hf_storage.h"
#include "io/safetensors.h"
#include "tools/page_cache.h"

namespace dcp {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

int64_t ParseSize(const std::string& text) {
  double value = std::stod(text);
  std::string unit = text.substr(text.find_first_not_of("0123456789."));
  if (unit == "GiB") value *= double(1 << 30);
  if (unit == "MiB") value *= double(1 << 20);
  return static_cast<int64_t>(value);
}

// kB of "VmRSS" / "VmHWM" in /proc/self/status.
int64_t StatusKb(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0)
      return std::stoll(line.substr(key.size() + 1));
  }
  return -1;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void Fill(Tensor& t, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
  auto* bytes = static_cast<uint8_t*>(t.data());
  for (size_t i = 0; i < t.nbytes(); ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    bytes[i] = static_cast<uint8_t>(x);
  }
}

// Forwards to `inner`, timing Finish and the peak RSS above its start.
class TimedWriter final : public StorageWriter {
 public:
  explicit TimedWriter(StorageWriter& inner) : inner_(inner) {}
  absl::Status Reset(const std::string& id) override {
    return inner_.Reset(id);
  }
  StorageMeta GetStorageMeta() const override {
    return inner_.GetStorageMeta();
  }
  absl::Status SetUp(bool c, int r, bool u) override {
    return inner_.SetUp(c, r, u);
  }
  absl::StatusOr<SavePlan> PrepareLocalPlan(SavePlan plan) override {
    return inner_.PrepareLocalPlan(std::move(plan));
  }
  absl::StatusOr<std::vector<SavePlan>> PrepareGlobalPlan(
      std::vector<SavePlan> plans) override {
    return inner_.PrepareGlobalPlan(std::move(plans));
  }
  Future<std::vector<WriteResult>> WriteData(const SavePlan& plan,
                                             SavePlanner& planner) override {
    return inner_.WriteData(plan, planner);
  }
  absl::Status Finish(
      const Metadata& metadata,
      const std::vector<std::vector<WriteResult>>& results) override {
    DropPageCache(shards_);
    std::ofstream("/proc/self/clear_refs") << "5";
    const int64_t rss = StatusKb("VmRSS");
    const auto start = Clock::now();
    absl::Status status = inner_.Finish(metadata, results);
    finish_s = Seconds(start);
    peak_above_kb = StatusKb("VmHWM") - rss;
    return status;
  }
  void DescribeCommit(Metadata& metadata) const override {
    inner_.DescribeCommit(metadata);
  }
  bool CommitDecided() const override { return inner_.CommitDecided(); }
  absl::Status MarkCommitted() override { return inner_.MarkCommitted(); }
  void Abort() override { inner_.Abort(); }

  std::string shards_;
  double finish_s = 0;
  int64_t peak_above_kb = 0;

 private:
  StorageWriter& inner_;
};

int Consolidate(int64_t size, const std::string& dir, int repeat) {
  StateDict state;
  const int layers =
      static_cast<int>(std::max<int64_t>(1, size / (2048 * 4096 * 2)));
  int64_t bytes = 0;
  for (int i = 0; i < layers; ++i) {
    const std::string prefix = absl::StrCat("model.layers.", i, ".");
    Tensor w = Tensor::Empty(DType::kBF16, {2048, 4096});
    Tensor n = Tensor::Empty(DType::kF32, {4096});
    Fill(w, 2 * i + 1);
    Fill(n, 2 * i + 2);
    bytes += w.nbytes() + n.nbytes();
    state[prefix + "weight"] = w;
    state[prefix + "norm"] = n;
  }
  std::vector<double> rates;
  for (int r = 0; r < repeat; ++r) {
    const std::string out = absl::StrCat(dir, "/consolidated");
    fs::remove_all(out);
    HuggingFaceStorageWriterOptions options;
    options.save_distributed = true;
    options.enable_consolidation = true;
    HuggingFaceStorageWriter writer(out, options);
    TimedWriter timed(writer);
    timed.shards_ = out + "/sharded";
    SaveOptions save;
    save.storage_writer = &timed;
    save.no_dist = true;
    absl::Status status = Save(state, save).status();
    if (!status.ok()) {
      std::fprintf(stderr, "consolidate: %s\n", status.ToString().c_str());
      return 1;
    }
    rates.push_back(bytes / timed.finish_s / 1e9);
    std::printf(
        "consolidate run %d: Finish %.2f s, %.2f GB/s, peak RSS +%lld MiB, "
        "consolidation buffers peak %lld MiB\n",
        r, timed.finish_s, rates.back(),
        static_cast<long long>(timed.peak_above_kb >> 10),
        static_cast<long long>(writer.consolidation_peak_bytes() >> 20));
  }
  // The shards alone, for PyTorch's consolidation.
  const std::string shards = absl::StrCat(dir, "/shards");
  fs::remove_all(shards);
  HuggingFaceStorageWriterOptions options;
  options.save_distributed = true;
  HuggingFaceStorageWriter writer(shards, options);
  SaveOptions save;
  save.storage_writer = &writer;
  save.no_dist = true;
  if (!Save(state, save).ok()) return 1;
  std::printf(
      "consolidate median: %.2f GB/s of %lld bytes; shards in %s/sharded\n",
      Median(rates), static_cast<long long>(bytes), shards.c_str());
  return 0;
}

int Quantized(int64_t size, const std::string& dir, int repeat, int threads) {
  const int64_t rows = 4096, cols = 7168, block = 128;
  const int layers =
      static_cast<int>(std::max<int64_t>(1, size / (rows * cols)));
  const std::string path = absl::StrCat(dir, "/fp8");
  fs::remove_all(path);
  fs::create_directories(path);
  std::vector<SafetensorsTensor> layout;
  for (int i = 0; i < layers; ++i) {
    const std::string w = absl::StrCat("model.layers.", i, ".weight");
    layout.push_back({w, DType::kF8E4M3, {rows, cols}});
    layout.push_back(
        {w + "_scale_inv", DType::kF32, {rows / block, cols / block}});
  }
  std::vector<SafetensorsTensor> sorted = layout;
  absl::StatusOr<std::string> header =
      EncodeSafetensorsHeader(sorted, {{"format", "pt"}});
  {
    std::ofstream out(path + "/model.safetensors", std::ios::binary);
    out << *header;
    Tensor w = Tensor::Empty(DType::kF8E4M3, {rows, cols});
    Tensor s = Tensor::Empty(DType::kF32, {rows / block, cols / block});
    auto* sv = static_cast<float*>(s.data());
    for (int64_t i = 0; i < s.numel(); ++i) sv[i] = 0.001f * (i % 97 + 1);
    for (const SafetensorsTensor& t : sorted) {
      const Tensor& data = t.dtype == DType::kF32 ? s : w;
      if (t.dtype != DType::kF32) Fill(w, t.begin);
      out.write(static_cast<const char*>(data.data()), data.nbytes());
    }
  }
  const int64_t fp8_bytes = int64_t{layers} * rows * cols;
  std::map<std::string, std::vector<double>> rates;
  for (int r = 0; r < repeat; ++r) {
    for (int v = 0; v < 4; ++v) {
      const int variant = (v + r) % 4;  // Alternate the order.
      const bool cold = variant < 2;
      const bool dequant = variant % 2 == 1;
      StateDict state;
      for (int i = 0; i < layers; ++i) {
        const std::string w = absl::StrCat("model.layers.", i, ".weight");
        state[w] = Tensor::Empty(dequant ? DType::kBF16 : DType::kF8E4M3,
                                 {rows, cols});
        std::memset(state[w].tensor().data(), 0, state[w].tensor().nbytes());
      }
      if (cold) {
        DropPageCache(path);
      } else {
        WarmPageCache(path);
      }
      const auto start = Clock::now();
      absl::Status status;
      if (dequant) {
        QuantizedHuggingFaceStorageReaderOptions options;
        options.target_dtype = DType::kBF16;
        options.thread_count = threads;
        QuantizedHuggingFaceStorageReader reader(path, options);
        LoadOptions load;
        load.storage_reader = &reader;
        load.no_dist = true;
        status = Load(state, load);
      } else {
        HuggingFaceStorageReaderOptions options;
        options.thread_count = threads;
        HuggingFaceStorageReader reader(path, options);
        LoadOptions load;
        load.storage_reader = &reader;
        load.no_dist = true;
        status = Load(state, load);
      }
      const double s = Seconds(start);
      if (!status.ok()) {
        std::fprintf(stderr, "quantized: %s\n", status.ToString().c_str());
        return 1;
      }
      const std::string name =
          absl::StrCat(dequant ? "dequant->bf16" : "plain fp8 read",
                       cold ? " cold" : " warm");
      rates[name].push_back(fp8_bytes / s / 1e9);
      std::printf("quantized run %d %-22s %.2f GB/s of fp8\n", r, name.c_str(),
                  rates[name].back());
    }
  }
  for (const auto& [name, v] : rates) {
    std::printf(
        "quantized median %-22s %.2f GB/s (%lld fp8 bytes, %d threads)\n",
        name.c_str(), Median(v), static_cast<long long>(fp8_bytes), threads);
  }
  return 0;
}

}  // namespace
}  // namespace dcp

int main(int argc, char** argv) {
  CLI::App app("Hugging Face consolidation and quantized-load benchmarks");
  std::string size = "1GiB", dir = "/tmp/hf_bench_extra";
  int repeat = 3, threads = 1;
  app.require_subcommand(1);
  CLI::App* consolidate = app.add_subcommand("consolidate", "Consolidation");
  CLI::App* quantized = app.add_subcommand("quantized", "fp8 dequantization");
  for (CLI::App* c : {consolidate, quantized}) {
    c->add_option("--size", size);
    c->add_option("--dir", dir);
    c->add_option("--repeat", repeat);
    c->add_option("--threads", threads);
  }
  CLI11_PARSE(app, argc, argv);
  std::filesystem::create_directories(dir);
  if (*consolidate) return dcp::Consolidate(dcp::ParseSize(size), dir, repeat);
  return dcp::Quantized(dcp::ParseSize(size), dir, repeat, threads);
}
