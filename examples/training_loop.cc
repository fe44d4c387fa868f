// training_loop: a small training loop that checkpoints with AsyncSave.
//
// The state is a model plus an optimizer-like dict of CPU tensors (weights,
// biases, Adam-style exp_avg / exp_avg_sq) and step counters. Every step
// updates every tensor deterministically; every `--every` steps the loop
// calls AsyncSave into DIR/step-K with a DefaultStager (default
// StagingOptions: pinned, shared, async staging, non-blocking copies),
// waits for staging_completion (the contract: only then may the tensors
// change) and keeps training while the upload runs in the background. At the
// end it waits for every upload, restores the last checkpoint into fresh
// tensors and checks them against the state at that step, recomputed by
// replaying the same updates from the initial state.
//
// Per save it prints the time the loop was blocked in staging next to a
// plain memcpy of the same bytes measured in the same run. The staging
// memory is reserved when the loop starts (DefaultStager::Reserve), so the
// first save blocks no longer than the others.
//
// With --device (auto, cuda or host) the tensors live in device memory, as
// in a GPU job: each step computes on a host mirror and copies the result
// to the device (standing in for the kernels), AsyncSave stages the device
// tensors into pinned host memory on copy streams, and the restore loads
// straight into fresh device tensors (FileSystemReader::device_staging).
// "host" is the host-memory runtime: the same code path without a GPU.
//
//   bazel run //examples:training_loop --
//       --steps 50 --every 10 --size 256 --dir /tmp/ckpt [--device auto]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/state_dict.h"
#include "core/status.h"
#include "cuda/device_runtime.h"
#include "engine/async_save.h"
#include "engine/checkpoint.h"
#include "io/file_system_storage.h"
#include "staging/device_staging.h"
#include "staging/stager.h"

namespace dcp {
namespace {

using Clock = std::chrono::steady_clock;

double Millis(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

constexpr int kLayers = 2;

// The layout of the state: names and element counts (float32), summing to
// about `bytes`.
struct TensorSpec {
  std::string group;  // "model" or "optim"
  std::string name;
  int64_t numel;
};

std::vector<TensorSpec> Specs(size_t bytes) {
  // Per layer: a weight, a small bias, and the optimizer's exp_avg and
  // exp_avg_sq of the weight (three equal tensors plus the bias).
  const int64_t per_layer = std::max<int64_t>(bytes / kLayers / 4, 64);
  const int64_t weight = std::max<int64_t>(per_layer / 3, 16);
  const int64_t bias = 1024;
  std::vector<TensorSpec> specs;
  for (int l = 0; l < kLayers; ++l) {
    const std::string layer = absl::StrCat("layer", l);
    specs.push_back({"model", layer + ".weight", weight});
    specs.push_back({"model", layer + ".bias", bias});
    specs.push_back({"optim", layer + ".weight.exp_avg", weight});
    specs.push_back({"optim", layer + ".weight.exp_avg_sq", weight});
  }
  return specs;
}

// A fresh state: every tensor zero-filled except a deterministic start.
StateDict MakeState(const std::vector<TensorSpec>& specs) {
  StateDict model, optim;
  for (size_t i = 0; i < specs.size(); ++i) {
    Tensor t = Tensor::Empty(DType::kF32, {specs[i].numel});
    float* p = static_cast<float*>(t.data());
    for (int64_t j = 0; j < specs[i].numel; ++j) {
      p[j] = static_cast<float>((j * 7 + i * 13) % 101) * 0.01f;
    }
    (specs[i].group == "model" ? model : optim)[specs[i].name] = t;
  }
  optim["step"] = int64_t{0};
  StateDict state;
  state["model"] = std::move(model);
  state["optim"] = std::move(optim);
  state["step"] = int64_t{0};
  return state;
}

Tensor& TensorAt(StateDict& state, const TensorSpec& spec) {
  return state[spec.group].dict()[spec.name].tensor();
}

// A copy of `host`'s nesting and values with every tensor in device memory
// of `runtime` (zero-filled; SyncToDevice fills it).
absl::StatusOr<StateDict> DeviceTwin(DeviceRuntime& runtime, StateDict host,
                                     const std::vector<TensorSpec>& specs) {
  for (const TensorSpec& spec : specs) {
    Tensor& t = TensorAt(host, spec);
    DCP_ASSIGN_OR_RETURN(void* data, runtime.AllocateDevice(0, t.nbytes()));
    std::shared_ptr<void> owner(
        data, [&runtime](void* p) { runtime.FreeDevice(p).IgnoreError(); });
    t = Tensor::WithOwner(
        TensorView(data, t.dtype(), t.sizes(), Device::Cuda(0)), owner);
  }
  return host;
}

// Copies every tensor of `host` into its twin in `device` (the step's
// result landing in device memory) and the plain values along.
absl::Status SyncToDevice(DeviceRuntime& runtime, StateDict& host,
                          StateDict& device,
                          const std::vector<TensorSpec>& specs) {
  for (const TensorSpec& spec : specs) {
    const Tensor& from = TensorAt(host, spec);
    DCP_RETURN_IF_ERROR(runtime.Copy(TensorAt(device, spec).data(), from.data(),
                                     from.nbytes(), CopyKind::kHostToDevice));
  }
  device["step"] = host["step"];
  device["optim"].dict()["step"] = host["optim"].dict()["step"];
  return absl::OkStatus();
}

// One training step: every element of every tensor changes, as a function
// of (step, tensor, element) and its old value only, so replaying the steps
// from the initial state gives the same bytes.
void TrainStep(StateDict& state, const std::vector<TensorSpec>& specs,
               int64_t step) {
  for (size_t i = 0; i < specs.size(); ++i) {
    float* p = static_cast<float*>(TensorAt(state, specs[i]).data());
    const float lr = 0.001f * static_cast<float>(step % 17 + 1);
    const float shift = static_cast<float>((step * 31 + i * 7) % 23) * 0.01f;
    for (int64_t j = 0; j < specs[i].numel; ++j) {
      p[j] = p[j] * (1.0f - lr) + shift + static_cast<float>(j & 15) * lr;
    }
  }
  state["step"] = step;
  state["optim"].dict()["step"] = step;
}

size_t StateBytes(StateDict& state, const std::vector<TensorSpec>& specs) {
  size_t bytes = 0;
  for (const TensorSpec& spec : specs) bytes += TensorAt(state, spec).nbytes();
  return bytes;
}

// Median of a few plain memcpys of `bytes` between two prefaulted buffers:
// the floor a snapshot of CPU tensors cannot beat.
double MemcpyMillis(size_t bytes) {
  std::vector<char> src(bytes, 1), dst(bytes, 2);
  std::vector<double> times;
  for (int i = 0; i < 5; ++i) {
    const Clock::time_point start = Clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    times.push_back(Millis(start, Clock::now()));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

struct SaveRecord {
  int64_t step = 0;
  double blocked_ms = 0;       // AsyncSave call until staging_completion.
  bool previous_busy = false;  // An earlier upload still ran at AsyncSave.
  Future<Metadata> upload;
};

int Run(int64_t steps, int64_t every, size_t size_mib, std::string dir,
        const std::string& device_mode) {
  if (dir.empty()) {
    const char* root = std::getenv("TEST_TMPDIR");
    dir = absl::StrCat(root != nullptr ? root : "/tmp", "/training_loop-",
                       ::getpid());
  }
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::vector<TensorSpec> specs = Specs(size_mib << 20);
  StateDict state = MakeState(specs);
  const size_t bytes = StateBytes(state, specs);
  // With a device: `state` stays the host mirror the steps compute on and
  // `saved` holds the device tensors that are checkpointed.
  std::unique_ptr<DeviceRuntime> runtime;
  StateDict device_state;
  if (device_mode != "none") {
    absl::StatusOr<DeviceRuntimeMode> mode =
        ParseDeviceRuntimeMode(device_mode);
    absl::StatusOr<std::unique_ptr<DeviceRuntime>> created =
        mode.ok()
            ? CreateDeviceRuntime(*mode)
            : absl::StatusOr<std::unique_ptr<DeviceRuntime>>(mode.status());
    absl::StatusOr<StateDict> twin =
        created.ok() ? DeviceTwin(**created, state, specs)
                     : absl::StatusOr<StateDict>(created.status());
    if (twin.ok()) {
      runtime = *std::move(created);
      device_state = *std::move(twin);
    }
    absl::Status synced =
        twin.ok() ? SyncToDevice(*runtime, state, device_state, specs)
                  : twin.status();
    if (!synced.ok()) {
      std::fprintf(stderr, "--device %s: %s\n", device_mode.c_str(),
                   synced.ToString().c_str());
      return 1;
    }
    std::printf("tensors in device memory: %s runtime%s\n",
                std::string(runtime->name()).c_str(),
                runtime->is_host() ? " (no GPU: host memory stands in)" : "");
  }
  StateDict& saved_state = runtime != nullptr ? device_state : state;
  const double memcpy_ms = MemcpyMillis(bytes);
  std::printf(
      "training_loop: %lld steps, AsyncSave every %lld, %zu tensors, %.1f "
      "MiB, into %s\n",
      static_cast<long long>(steps), static_cast<long long>(every),
      specs.size(), bytes / 1048576.0, dir.c_str());
  std::printf("plain memcpy of the same bytes: %.2f ms\n", memcpy_ms);

  DefaultStager stager(StagingOptions(), runtime.get());  // Defaults.
  // The staging memory is made (mapped, pinned) now, on the stager's
  // background thread while the loop starts: the first save then blocks no
  // longer than the later ones. A save before it is ready waits for it.
  Future<void> reserved = stager.Reserve(saved_state);
  std::vector<SaveRecord> saves;
  {
    AsyncCheckpointer checkpointer;
    double train_ms = 0;
    for (int64_t step = 1; step <= steps; ++step) {
      const Clock::time_point t0 = Clock::now();
      TrainStep(state, specs, step);
      if (runtime != nullptr) {
        absl::Status synced =
            SyncToDevice(*runtime, state, device_state, specs);
        if (!synced.ok()) {
          std::fprintf(stderr, "step %lld: %s\n", static_cast<long long>(step),
                       synced.ToString().c_str());
          return 1;
        }
      }
      train_ms += Millis(t0, Clock::now());
      if (step % every != 0) continue;
      SaveRecord record;
      record.step = step;
      record.previous_busy = !saves.empty() && !saves.back().upload.ready();
      AsyncSaveOptions options;
      options.save.checkpoint_id = absl::StrCat(dir, "/step-", step);
      options.async_stager = &stager;
      const Clock::time_point s0 = Clock::now();
      AsyncSaveResponse response = checkpointer.AsyncSave(saved_state, options);
      // The contract: no tensor changes before staging_completion.
      absl::Status staged = response.staging_completion.Wait();
      record.blocked_ms = Millis(s0, Clock::now());
      if (!staged.ok()) {
        std::fprintf(stderr, "step %lld: staging failed: %s\n",
                     static_cast<long long>(step), staged.ToString().c_str());
        return 1;
      }
      record.upload = response.upload_completion;
      std::printf(
          "step %5lld: saved to step-%lld, blocked %.2f ms in staging "
          "(%.2fx memcpy)%s\n",
          static_cast<long long>(step), static_cast<long long>(step),
          record.blocked_ms, record.blocked_ms / memcpy_ms,
          record.previous_busy ? ", previous upload still running" : "");
      saves.push_back(std::move(record));
    }
    std::printf("training: %.1f ms in %lld steps\n", train_ms,
                static_cast<long long>(steps));
    // ~AsyncCheckpointer waits for the uploads; check each one's outcome.
    for (const SaveRecord& s : saves) {
      const absl::StatusOr<Metadata>& committed = s.upload.Wait();
      if (!committed.ok()) {
        std::fprintf(stderr, "upload of step %lld failed: %s\n",
                     static_cast<long long>(s.step),
                     committed.status().ToString().c_str());
        return 1;
      }
    }
  }
  stager.Close();
  if (saves.empty()) {
    std::printf("no checkpoint taken (--steps < --every)\n");
    return 0;
  }

  if (!reserved.Wait().ok()) {
    std::fprintf(stderr, "reserving staging memory: %s\n",
                 reserved.Wait().ToString().c_str());
    return 1;
  }
  std::vector<double> blocked;
  for (const SaveRecord& s : saves) blocked.push_back(s.blocked_ms);
  std::sort(blocked.begin(), blocked.end());
  const double median = blocked[blocked.size() / 2];
  std::printf(
      "staging: %zu saves, blocked median %.2f ms, max %.2f ms; plain memcpy "
      "%.2f ms; median/memcpy %.2fx\n",
      saves.size(), median, blocked.back(), memcpy_ms, median / memcpy_ms);

  // Restore the last checkpoint into fresh tensors and compare with the
  // state at that step, recomputed from the start.
  const int64_t last = saves.back().step;
  StateDict restored = MakeState(specs);
  for (const TensorSpec& spec : specs) {
    Tensor& t = TensorAt(restored, spec);
    std::memset(t.data(), 0, t.nbytes());
  }
  std::unique_ptr<DeviceStaging> load_staging;
  StateDict device_restored;
  FileSystemReaderOptions reader_options;
  if (runtime != nullptr) {
    // Restore into fresh device tensors, read back for the comparison.
    absl::StatusOr<StateDict> twin = DeviceTwin(*runtime, restored, specs);
    if (!twin.ok()) {
      std::fprintf(stderr, "%s\n", twin.status().ToString().c_str());
      return 1;
    }
    device_restored = *std::move(twin);
    load_staging =
        std::make_unique<DeviceStaging>(DeviceStagingOptions(), runtime.get());
    reader_options.device_staging = load_staging.get();
  }
  FileSystemReader reader(absl::StrCat(dir, "/step-", last), reader_options);
  LoadOptions load;
  load.storage_reader = &reader;
  const Clock::time_point l0 = Clock::now();
  absl::Status loaded =
      Load(runtime != nullptr ? device_restored : restored, load);
  const double load_ms = Millis(l0, Clock::now());
  if (loaded.ok() && runtime != nullptr) {
    for (const TensorSpec& spec : specs) {
      Tensor& to = TensorAt(restored, spec);
      loaded = runtime->Copy(to.data(), TensorAt(device_restored, spec).data(),
                             to.nbytes(), CopyKind::kDeviceToHost);
      if (!loaded.ok()) break;
    }
    restored["step"] = device_restored["step"];
    restored["optim"].dict()["step"] = device_restored["optim"].dict()["step"];
  }
  if (!loaded.ok()) {
    std::fprintf(stderr, "restore from step-%lld failed: %s\n",
                 static_cast<long long>(last), loaded.ToString().c_str());
    return 1;
  }
  StateDict expected = MakeState(specs);
  for (int64_t step = 1; step <= last; ++step) {
    TrainStep(expected, specs, step);
  }
  int mismatches = 0;
  for (const TensorSpec& spec : specs) {
    if (!TensorAt(restored, spec).BytesEqual(TensorAt(expected, spec))) {
      std::fprintf(stderr, "restored %s.%s differs from step %lld\n",
                   spec.group.c_str(), spec.name.c_str(),
                   static_cast<long long>(last));
      ++mismatches;
    }
  }
  if (restored["step"].int_value() != last ||
      restored["optim"].dict()["step"].int_value() != last) {
    std::fprintf(stderr, "restored step counters differ from %lld\n",
                 static_cast<long long>(last));
    ++mismatches;
  }
  if (mismatches != 0) return 1;
  std::printf(
      "restored step-%lld in %.1f ms: all %zu tensors and counters "
      "equal the state at step %lld\n",
      static_cast<long long>(last), load_ms, specs.size(),
      static_cast<long long>(last));
  return 0;
}

}  // namespace
}  // namespace dcp

int main(int argc, char** argv) {
  CLI::App app{"dcp example: a training loop that checkpoints with AsyncSave"};
  int64_t steps = 50;
  int64_t every = 10;
  size_t size_mib = 64;
  std::string dir;
  app.add_option("--steps", steps, "training steps")
      ->check(CLI::PositiveNumber);
  app.add_option("--every", every, "AsyncSave every N steps")
      ->check(CLI::PositiveNumber);
  app.add_option("--size", size_mib, "state size in MiB")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--dir", dir,
                 "checkpoint root (default: $TEST_TMPDIR or /tmp)");
  std::string device = "none";
  app.add_option("--device", device,
                 "where the tensors live: none (CPU tensors), auto, cuda, "
                 "host (the host-memory device)")
      ->check(CLI::IsMember({"none", "auto", "cuda", "host"}));
  CLI11_PARSE(app, argc, argv);
  return dcp::Run(steps, every, size_mib, dir, device);
}
