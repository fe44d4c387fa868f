// Stream compression (zstd) against no compression, in one run: for a
// realistic training state (bf16 weights, fp32 AdamW moments) and for
// random bytes, each variant saves a fresh checkpoint (sync_files, the
// default O_DIRECT writer) and loads it back cold (page cache dropped) into
// zeroed tensors, rounds alternating the variants. Prints the compression
// ratio (tensor bytes / checkpoint file bytes) and save and load GB/s of
// tensor bytes, per round and as medians, and checks every loaded byte.
//
//   bazel run -c opt //bench:compression_bench -- --size 1GiB --reps 3
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/state_dict.h"
#include "core/status.h"
#include "engine/checkpoint.h"
#include "io/extensions.h"
#include "io/file_system_storage.h"
#include "tools/commands.h"
#include "tools/page_cache.h"

namespace dcp {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int64_t kColumns = 4096;
constexpr int64_t kRowsPerTensor = 2048;  // 16-32 MiB per tensor.

// bf16 of `value` (truncation: the bench needs plausible bit patterns).
uint16_t ToBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  return static_cast<uint16_t>(bits >> 16);
}

// A realistic state of about `bytes` tensor bytes: per parameter matrix a
// bf16 weight (normal, std 0.02) and fp32 AdamW moments exp_avg (normal,
// std 1e-3) and exp_avg_sq (its square scale, positive); or, with
// `random`, fp32 tensors of random bytes. `fill` false: zeroed tensors.
StateDict MakeState(int64_t bytes, bool random, bool fill, uint32_t seed) {
  StateDict model, exp_avg, exp_avg_sq, state;
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t per_param = kRowsPerTensor * kColumns * (random ? 4 : 10);
  const int64_t params = std::max<int64_t>(1, bytes / per_param);
  for (int64_t p = 0; p < params; ++p) {
    const std::string name = absl::StrCat("layers.", p, ".weight");
    if (random) {
      Tensor t = Tensor::Empty(DType::kF32, {kRowsPerTensor, kColumns});
      auto* words = static_cast<uint64_t*>(t.data());
      for (size_t i = 0; fill && i < t.nbytes() / 8; ++i) words[i] = gen();
      if (!fill) std::memset(t.data(), 0, t.nbytes());
      model[name] = std::move(t);
      continue;
    }
    Tensor w = Tensor::Empty(DType::kBF16, {kRowsPerTensor, kColumns});
    Tensor m = Tensor::Empty(DType::kF32, {kRowsPerTensor, kColumns});
    Tensor v = Tensor::Empty(DType::kF32, {kRowsPerTensor, kColumns});
    auto* wd = static_cast<uint16_t*>(w.data());
    auto* md = static_cast<float*>(m.data());
    auto* vd = static_cast<float*>(v.data());
    const int64_t n = kRowsPerTensor * kColumns;
    for (int64_t i = 0; i < n; ++i) {
      if (!fill) {
        wd[i] = 0;
        md[i] = vd[i] = 0;
        continue;
      }
      wd[i] = ToBf16(0.02f * normal(gen));
      const float g = 1e-3f * normal(gen);
      md[i] = g;
      vd[i] = g * g + 1e-8f * std::fabs(normal(gen));
    }
    model[name] = std::move(w);
    exp_avg[name] = std::move(m);
    exp_avg_sq[name] = std::move(v);
  }
  state["model"] = std::move(model);
  if (!random) {
    StateDict optim;
    optim["exp_avg"] = std::move(exp_avg);
    optim["exp_avg_sq"] = std::move(exp_avg_sq);
    state["optim"] = std::move(optim);
  }
  return state;
}

// Every tensor of `state`, in order.
void Tensors(const StateDict& state, std::vector<const Tensor*>& out) {
  for (const auto& [key, value] : state) {
    if (const auto* t = std::get_if<Tensor>(&value.variant())) {
      out.push_back(t);
    } else if (const auto* d = std::get_if<StateDict>(&value.variant())) {
      Tensors(*d, out);
    }
  }
}

int64_t TensorBytes(const StateDict& state) {
  std::vector<const Tensor*> tensors;
  Tensors(state, tensors);
  int64_t total = 0;
  for (const Tensor* t : tensors) total += static_cast<int64_t>(t->nbytes());
  return total;
}

bool SameBytes(const StateDict& a, const StateDict& b) {
  std::vector<const Tensor*> x, y;
  Tensors(a, x);
  Tensors(b, y);
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i]->nbytes() != y[i]->nbytes() ||
        std::memcmp(x[i]->data(), y[i]->data(), x[i]->nbytes()) != 0) {
      return false;
    }
  }
  return true;
}

int64_t DirectoryBytes(const std::string& dir) {
  int64_t total = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_regular_file()) total += entry.file_size();
  }
  return total;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Variant {
  std::string name;
  std::string compression;
  std::vector<double> save_gbps, load_gbps, ratio;
};

absl::Status Run(int64_t size, int reps, int threads, const std::string& level,
                 const std::string& root) {
  for (const bool random : {false, true}) {
    const char* state_name = random ? "random fp32" : "bf16 + fp32 AdamW";
    StateDict source = MakeState(size, random, true, 1);
    StateDict dest = MakeState(size, random, false, 1);
    const int64_t bytes = TensorBytes(source);
    std::vector<Variant> variants = {
        {"none", "none"},
        {absl::StrCat("zstd:", level), absl::StrCat("zstd:", level)}};
    for (int rep = 0; rep < reps; ++rep) {
      // Alternate which variant goes first.
      for (size_t k = 0; k < variants.size(); ++k) {
        Variant& v = variants[(k + rep) % variants.size()];
        const std::string dir = absl::StrCat(root, "/compression_bench");
        fs::remove_all(dir);
        ::sync();
        FileSystemWriterOptions writer_options;
        DCP_ASSIGN_OR_RETURN(writer_options.extensions,
                             ParseCompression(v.compression));
        writer_options.thread_count = threads;
        FileSystemWriter writer(dir, writer_options);
        SaveOptions save;
        save.checkpoint_id = dir;
        save.storage_writer = &writer;
        Clock::time_point start = Clock::now();
        DCP_RETURN_IF_ERROR(Save(source, save).status());
        const double save_s =
            std::chrono::duration<double>(Clock::now() - start).count();
        const int64_t file_bytes = DirectoryBytes(dir);
        DropPageCache(dir);
        FileSystemReaderOptions reader_options;
        reader_options.thread_count = threads;
        FileSystemReader reader(dir, reader_options);
        LoadOptions load;
        load.checkpoint_id = dir;
        load.storage_reader = &reader;
        start = Clock::now();
        DCP_RETURN_IF_ERROR(Load(dest, load));
        const double load_s =
            std::chrono::duration<double>(Clock::now() - start).count();
        if (!SameBytes(source, dest)) {
          return absl::DataLossError(
              absl::StrCat(v.name, ": loaded bytes differ"));
        }
        v.save_gbps.push_back(bytes / save_s / 1e9);
        v.load_gbps.push_back(bytes / load_s / 1e9);
        v.ratio.push_back(static_cast<double>(bytes) / file_bytes);
        std::printf(
            "%-18s %-8s round %d: ratio %.3f  save %.3f s %.3f GB/s  load "
            "%.3f s %.3f GB/s\n",
            state_name, v.name.c_str(), rep, v.ratio.back(), save_s,
            v.save_gbps.back(), load_s, v.load_gbps.back());
        std::fflush(stdout);
        fs::remove_all(dir);
      }
    }
    for (const Variant& v : variants) {
      std::printf(
          "MEDIAN %-18s %-8s %.3f GB tensors: ratio %.3f  save %.3f GB/s  "
          "load %.3f GB/s\n",
          state_name, v.name.c_str(), bytes / 1e9, Median(v.ratio),
          Median(v.save_gbps), Median(v.load_gbps));
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace dcp

int main(int argc, char** argv) {
  CLI::App app("zstd against no compression: ratio, save and load GB/s");
  std::string size_text = "1GiB";
  int reps = 3;
  int threads = 2;
  std::string level = "1";
  std::string dir = "/tmp";
  app.add_option("--size", size_text, "Tensor bytes per state")
      ->capture_default_str();
  app.add_option("--reps", reps, "Rounds (variants alternate)")
      ->capture_default_str();
  app.add_option("--threads", threads,
                 "Writer and reader thread_count (files written in "
                 "parallel; threads verifying, decoding)")
      ->capture_default_str();
  app.add_option("--level", level, "zstd level")->capture_default_str();
  app.add_option("--dir", dir, "Where the checkpoints go (a disk)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  absl::StatusOr<int64_t> size = dcp::ParseSize(size_text);
  if (!size.ok()) {
    std::fprintf(stderr, "%s\n", size.status().ToString().c_str());
    return 2;
  }
  absl::Status status = dcp::Run(*size, reps, threads, level, dir);
  if (!status.ok()) {
    std::fprintf(stderr, "compression_bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
