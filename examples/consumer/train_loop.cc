// A training loop outside dcp's build that checkpoints with AsyncSave
// through the installed library (dcp/dcp.hpp over the C ABI): every few
// steps it starts an async save, waits only for staging before the next
// update, and at the end restores the last checkpoint into fresh memory and
// checks it against the parameters of that step.
//
//   train_loop DIR     (exit status 0 when the restore matched)
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "dcp/dcp.hpp"

namespace {

DLTensor HostF32(std::vector<float>& v, int64_t* shape) {
  DLTensor t{};
  t.data = v.data();
  t.device.device_type = kDLCPU;
  t.ndim = 1;
  t.dtype = DLDataType{kDLFloat, 32, 1};
  t.shape = shape;
  return t;
}

int Run(const std::string& dir) {
  constexpr int64_t kParams = 1 << 20;
  std::vector<float> weights(kParams, 0.0f), momentum(kParams, 0.0f);
  int64_t shape[1] = {kParams};
  std::vector<float> saved_weights;
  std::unique_ptr<dcp::api::AsyncSave> in_flight;
  std::string last_checkpoint;

  for (int step = 1; step <= 6; ++step) {
    // "Training": every parameter moves.
    for (int64_t i = 0; i < kParams; ++i) {
      momentum[i] = 0.9f * momentum[i] + 0.001f * static_cast<float>(i % 7);
      weights[i] -= momentum[i];
    }
    if (step % 2 != 0) continue;
    // The previous upload must be committed before its handle goes; the
    // engine uploads one checkpoint at a time in call order anyway.
    if (in_flight) in_flight->WaitCommitted();
    dcp::api::StateDict sd;
    DLTensor w = HostF32(weights, shape), m = HostF32(momentum, shape);
    sd.SetTensor({"model", "weight"}, w);
    sd.SetTensor({"optim", "momentum"}, m);
    sd.SetInt({"step"}, step);
    dcp::api::SaveOptions options;
    last_checkpoint = dir + "/step-" + std::to_string(step);
    options.checkpoint_id = last_checkpoint;
    in_flight = std::make_unique<dcp::api::AsyncSave>(sd, options);
    // Training may change the tensors once they are staged.
    in_flight->WaitStaged();
    saved_weights = weights;
    std::printf("step %d: staged %s\n", step, last_checkpoint.c_str());
  }
  in_flight->WaitCommitted();

  std::vector<float> restored(kParams, -1.0f), restored_m(kParams, -1.0f);
  dcp::api::StateDict sd;
  DLTensor w = HostF32(restored, shape), m = HostF32(restored_m, shape);
  sd.SetTensor({"model", "weight"}, w);
  sd.SetTensor({"optim", "momentum"}, m);
  sd.SetInt({"step"}, 0);
  dcp::api::LoadOptions options;
  options.checkpoint_id = last_checkpoint;
  dcp::api::Load(sd, options);
  if (sd.GetInt({"step"}) != 6 ||
      std::memcmp(restored.data(), saved_weights.data(),
                  kParams * sizeof(float)) != 0) {
    std::fprintf(stderr, "restored state differs from step 6\n");
    return 1;
  }
  // List indices of any integer type; a getter of the wrong kind throws,
  // naming the path and both kinds.
  const size_t layer = 1;
  sd.SetString({"layers", size_t{0}}, "embed");
  sd.SetInt({"layers", layer}, 7);
  if (sd.GetString({"layers", 0u}) != "embed" ||
      sd.GetInt({"layers", layer}) != 7) {
    std::fprintf(stderr, "list leaves by size_t index differ\n");
    return 1;
  }
  try {
    sd.GetString({"step"});
    std::fprintf(stderr, "GetString of an int leaf succeeded\n");
    return 1;
  } catch (const dcp::api::Error& e) {
    if (e.code() != DCP_INVALID_ARGUMENT ||
        std::string(e.what()).find("\"step\" is an int, not a string") ==
            std::string::npos) {
      std::fprintf(stderr, "GetString of an int leaf: %s\n", e.what());
      return 1;
    }
  }
  // Errors are exceptions carrying the code and the engine's message.
  try {
    dcp::api::LoadOptions missing;
    missing.checkpoint_id = dir + "/no-such-step";
    dcp::api::Load(sd, missing);
    std::fprintf(stderr, "loading a missing checkpoint succeeded\n");
    return 1;
  } catch (const dcp::api::Error& e) {
    std::printf("missing checkpoint: %s\n", e.what());
  }
  std::printf("train_loop: OK\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  try {
    int rc = Run(argv[1]);
    dcp_shutdown();
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_loop: %s\n", e.what());
    return 1;
  }
}
