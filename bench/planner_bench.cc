// Planner benchmark (issue 3). Simulates a job in one process:
//
// - Save: R ranks x 256 items. Half of each rank's items are whole tensors
//   replicated across its 8-rank group (written once after dedup); the other
//   half are row shards of 128 tensors sharded over all R ranks. Times the
//   coordinator's CreateGlobalPlan (decode of every rank's planner data,
//   dedup, O(n log n) validation, metadata), then a cached re-plan where
//   every rank sends an "unchanged" marker, through CreateSharedGlobalPlan
//   as the engine calls it (cached_plan_by_value_seconds: through
//   CreateGlobalPlan, which returns a copy of the cached metadata).
// - Load: the same model saved by 1024 ranks, loaded by 768 ranks (each
//   requests its 768-way row shard of every sharded tensor and every
//   replicated tensor of its group): the local plans of all 768 ranks plus
//   the global plan with read dedup, summed (load_plan_seconds; the run
//   with the median sum of 3, all three in load_plan_seconds_runs).
// - Sizes: encoded local save plan bytes per item; metadata bytes per
//   stored item (with one file location and checksum per item), as io/'s
//   metadata file and as the planner's exchange message.
// - Scaling: global plan time from 64 to R ranks.
//
// Times are CPU seconds of the planning thread (see Stopwatch); the global
// and cached plans are medians of 3 runs.
//
// Usage: planner_bench [--ranks 4096] [--json] [--global_only] [--load_only]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "core/state_dict.h"
#include "io/metadata_format.h"
#include "nlohmann/json.hpp"
#include "planner/default_planner.h"
#include "planner/global_load_plan.h"
#include "planner/plan_cache.h"
#include "planner/plan_codec.h"

namespace dcp {
namespace {

constexpr int kItemsPerRank = 256;
constexpr int kReplicated = kItemsPerRank / 2;  // Per 8-rank group.
constexpr int kSharded = kItemsPerRank - kReplicated;
constexpr int kGroup = 8;
constexpr int64_t kRowsPerRank = 4;
constexpr int64_t kCols = 1024;

// Planning is single-threaded; its cost is the CPU time of this thread
// ("on one core"), which stays meaningful on a shared, loaded machine where
// wall time does not.
struct Stopwatch {
  static double CpuNow() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
  }
  double cpu = CpuNow();
  std::chrono::steady_clock::time_point wall = std::chrono::steady_clock::now();
};

double Seconds(const Stopwatch& start) {
  return Stopwatch::CpuNow() - start.cpu;
}

double WallSeconds(const Stopwatch& start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                       start.wall)
      .count();
}

std::string ReplicatedName(int group, int k) {
  return absl::StrCat("model.group", group, ".replicated.", k, ".weight");
}
std::string ShardedName(int k) {
  return absl::StrCat("model.layers.", k, ".mlp.weight");
}
DType DTypeOf(int k) { return k % 2 == 0 ? DType::kBF16 : DType::kF32; }

WriteItem MakeItem(const std::string& name, WriteItemType type, Shape offsets,
                   Shape sizes, Shape global, DType dtype) {
  WriteItem item;
  item.index = MetadataIndex(name, offsets);
  item.type = type;
  item.tensor_data = TensorWriteData{
      {std::move(offsets), std::move(sizes)}, {dtype}, std::move(global)};
  return item;
}

// Rank r's local plan, as DefaultSavePlanner::CreateLocalPlan builds it
// (items in name order, planner_data with the flatten mapping and, with
// caching, the digest).
SavePlan LocalPlan(int rank, int num_ranks, bool caching) {
  SavePlan plan;
  FlattenMapping mapping;
  const int group = rank / kGroup;
  for (int k = 0; k < kReplicated; ++k) {
    const std::string name = ReplicatedName(group, k);
    plan.items.push_back(MakeItem(name, WriteItemType::kTensor, {0, 0},
                                  {16, 256}, {16, 256}, DTypeOf(k)));
    mapping[name] = {"model", absl::StrCat("group", group), "replicated",
                     int64_t{k}, "weight"};
  }
  for (int k = 0; k < kSharded; ++k) {
    const std::string name = ShardedName(k);
    plan.items.push_back(MakeItem(
        name, WriteItemType::kShard, {rank * kRowsPerRank, 0},
        {kRowsPerRank, kCols}, {num_ranks * kRowsPerRank, kCols}, DTypeOf(k)));
    mapping[name] = {"model", "layers", int64_t{k}, "mlp", "weight"};
  }
  std::sort(
      plan.items.begin(), plan.items.end(),
      [](const WriteItem& a, const WriteItem& b) { return a.index < b.index; });
  SavePlannerData data;
  if (caching) data.digest = DigestSavePlan(plan.items, mapping);
  SetCompactMapping(plan.items, mapping, &data);
  plan.planner_data = EncodeSavePlannerData(data);
  return plan;
}

std::vector<SavePlan> LocalPlans(int num_ranks, bool caching) {
  std::vector<SavePlan> plans;
  plans.reserve(num_ranks);
  for (int r = 0; r < num_ranks; ++r) {
    plans.push_back(LocalPlan(r, num_ranks, caching));
  }
  return plans;
}

struct GlobalResult {
  double seconds = 0;
  double wall_seconds = 0;
  std::vector<SavePlan> plans;
  Metadata metadata;
};

GlobalResult TimeGlobalPlan(DefaultSavePlanner& planner,
                            std::vector<SavePlan> local) {
  GlobalResult out;
  const Stopwatch start;
  auto result = planner.CreateGlobalPlan(std::move(local));
  out.seconds = Seconds(start);
  out.wall_seconds = WallSeconds(start);
  if (!result.ok()) {
    std::fprintf(stderr, "CreateGlobalPlan failed: %s\n",
                 result.status().ToString().c_str());
    std::exit(1);
  }
  out.plans = std::move(result->first);
  out.metadata = std::move(result->second);
  return out;
}

// Median of `runs` timings of the uncached global plan.
double GlobalPlanSeconds(int num_ranks, int runs, GlobalResult* last) {
  std::vector<double> times;
  for (int i = 0; i < runs; ++i) {
    DefaultSavePlanner planner;
    GlobalResult result = TimeGlobalPlan(planner, LocalPlans(num_ranks, false));
    times.push_back(result.seconds);
    if (last != nullptr && i + 1 == runs) *last = std::move(result);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Adds a location and checksum per stored item, as a committed save would.
void AddStorageData(Metadata& metadata, const std::vector<SavePlan>& plans) {
  for (size_t r = 0; r < plans.size(); ++r) {
    int64_t offset = 0;
    const std::string file = absl::StrCat("__", r, "_0.distcp");
    for (const WriteItem& item : plans[r].items) {
      const int64_t length = item.StorageBytes();
      metadata.storage_data[item.index] =
          StorageInfo{file, offset, length, {0x9e3779b97f4a7c15ull * offset}};
      offset += (length + 4095) / 4096 * 4096;
    }
  }
}

struct LoadResult {
  double local_seconds = 0;
  double max_rank_local_seconds = 0;
  double global_seconds = 0;
  size_t read_items = 0;
};

// The state dicts of a `load_ranks` job loading a checkpoint saved by
// `save_ranks`: each rank requests its row shard of every sharded tensor
// and every replicated tensor of its group.
std::vector<StateDict> LoadStates(int save_ranks, int load_ranks) {
  static char sink[1];
  const int64_t rows = save_ranks * kRowsPerRank;
  std::vector<StateDict> states(load_ranks);
  for (int r = 0; r < load_ranks; ++r) {
    // Destinations wrap memory that is never touched by planning.
    StateDict& sd = states[r];
    const int group = r * save_ranks / load_ranks / kGroup;
    StateList layers;
    for (int k = 0; k < kSharded; ++k) {
      const int64_t begin = rows * r / load_ranks;
      const int64_t end = rows * (r + 1) / load_ranks;
      std::vector<Shard> shards = {
          {{begin, 0},
           Tensor::Wrap(TensorView(sink, DTypeOf(k), {end - begin, kCols}))}};
      layers.push_back(StateDict{
          {"mlp", StateDict{{"weight", ShardedTensor(DTypeOf(k), {rows, kCols},
                                                     std::move(shards))}}}});
    }
    StateList rep;
    for (int k = 0; k < kReplicated; ++k) {
      rep.push_back(StateDict{
          {"weight", Tensor::Wrap(TensorView(sink, DTypeOf(k), {16, 256}))}});
    }
    sd["model"] = StateDict{{"layers", std::move(layers)},
                            {absl::StrCat("group", group),
                             StateDict{{"replicated", std::move(rep)}}}};
  }
  return states;
}

// Every rank's local plan, one after the other, then the global plan.
LoadResult TimeLoadPlan(const Metadata& metadata,
                        std::vector<StateDict>& states) {
  const int load_ranks = static_cast<int>(states.size());
  LoadResult out;
  std::vector<LoadPlan> local(load_ranks);
  std::vector<DefaultLoadPlanner> planners(load_ranks);
  for (int r = 0; r < load_ranks; ++r) {
    const Stopwatch start;
    absl::Status status = planners[r].SetUp(&states[r], metadata, r == 0);
    absl::StatusOr<LoadPlan> plan = status.ok()
                                        ? planners[r].CreateLocalPlan()
                                        : absl::StatusOr<LoadPlan>(status);
    const double s = Seconds(start);
    if (!plan.ok()) {
      std::fprintf(stderr, "load CreateLocalPlan failed: %s\n",
                   plan.status().ToString().c_str());
      std::exit(1);
    }
    out.local_seconds += s;
    out.max_rank_local_seconds = std::max(out.max_rank_local_seconds, s);
    out.read_items += plan->items.size();
    local[r] = *std::move(plan);
  }
  const Stopwatch start;
  auto global = planners[0].CreateGlobalPlan(std::move(local));
  out.global_seconds = Seconds(start);
  if (!global.ok()) std::exit(1);
  return out;
}

constexpr int kSaveRanks = 1024;
constexpr int kLoadRanks = 768;

// The load benchmark: the model saved by kSaveRanks ranks (with storage
// data), loaded by kLoadRanks ranks; the run with the median total of 3
// (as for the global plan: the first run in a process also pays for
// memory the machine has never handed out, see docs/BENCHMARKS.md).
// `totals`: each run's load_plan_seconds, in run order.
LoadResult TimeLoad(std::vector<double>* totals) {
  GlobalResult saved;
  GlobalPlanSeconds(kSaveRanks, 1, &saved);
  AddStorageData(saved.metadata, saved.plans);
  std::vector<StateDict> states = LoadStates(kSaveRanks, kLoadRanks);
  std::vector<LoadResult> runs;
  for (int i = 0; i < 3; ++i) {
    runs.push_back(TimeLoadPlan(saved.metadata, states));
    totals->push_back(runs.back().local_seconds + runs.back().global_seconds);
  }
  std::sort(runs.begin(), runs.end(),
            [](const LoadResult& a, const LoadResult& b) {
              return a.local_seconds + a.global_seconds <
                     b.local_seconds + b.global_seconds;
            });
  return runs[1];
}

int Main(int argc, char** argv) {
  CLI::App app{"dcp planner benchmark (issue 3)"};
  int num_ranks = 4096;
  bool json = false;
  app.add_option("--ranks", num_ranks, "simulated ranks for the save")
      ->check(CLI::Range(kGroup, 1 << 16));
  bool global_only = false;
  app.add_flag("--json", json, "print one JSON object");
  app.add_flag("--global_only", global_only,
               "time only the uncached global plan (for profiling)");
  bool load_only = false;
  app.add_flag("--load_only", load_only,
               "time only the 1024 -> 768 rank load plans (for profiling)");
  CLI11_PARSE(app, argc, argv);
  num_ranks = num_ranks / kGroup * kGroup;
  const size_t items = static_cast<size_t>(num_ranks) * kItemsPerRank;

  std::vector<double> load_totals;
  if (load_only) {
    const LoadResult load = TimeLoad(&load_totals);
    std::printf(
        "{\"load_plan_seconds\": %f, \"load_global_plan_seconds\": %f}\n",
        load.local_seconds + load.global_seconds, load.global_seconds);
    return 0;
  }
  // Global plan, uncached.
  GlobalResult global;
  const double global_seconds =
      GlobalPlanSeconds(num_ranks, global_only ? 1 : 3, &global);
  if (global_only) {
    std::printf("{\"global_plan_seconds\": %f}\n", global_seconds);
    return 0;
  }
  size_t stored = 0;
  for (const SavePlan& p : global.plans) stored += p.items.size();

  // Cached re-plan: a first save fills the coordinator's cache; then every
  // rank sends a marker.
  DefaultSavePlannerOptions caching;
  caching.enable_plan_caching = true;
  caching.plan_cache = std::make_shared<SavePlanCache>();
  DefaultSavePlanner coordinator(caching);
  std::vector<SavePlan> first = LocalPlans(num_ranks, true);
  std::vector<SavePlan> markers(num_ranks);
  for (int r = 0; r < num_ranks; ++r) {
    SavePlannerData data = *DecodeSavePlannerData(first[r].planner_data);
    data.mapping.clear();
    data.list_masks.clear();
    data.unchanged = true;
    markers[r].planner_data = EncodeSavePlannerData(data);
  }
  const double first_cached_seconds =
      TimeGlobalPlan(coordinator, std::move(first)).seconds;
  const Stopwatch local_start;
  SavePlan rank0 = LocalPlan(0, num_ranks, true);
  const double rank_digest_seconds = Seconds(local_start);
  // Through CreateSharedGlobalPlan (the engine's path: the cached metadata
  // itself, no copy), median of 3.
  std::vector<double> cached_times;
  size_t marker_bytes = 0;
  for (int i = 0; i < 3; ++i) {
    std::vector<SavePlan> input = markers;
    const Stopwatch start;
    absl::StatusOr<SharedGlobalSavePlan> cached =
        coordinator.CreateSharedGlobalPlan(std::move(input));
    cached_times.push_back(Seconds(start));
    if (!cached.ok()) {
      std::fprintf(stderr, "cached re-plan failed: %s\n",
                   cached.status().ToString().c_str());
      return 1;
    }
    size_t n = 0;
    for (const SavePlan& p : cached->plans) n += IsUnchangedSavePlan(p);
    if (n != static_cast<size_t>(num_ranks) ||
        cached->metadata->state_dict_metadata.size() !=
            global.metadata.state_dict_metadata.size()) {
      std::fprintf(stderr, "cached re-plan returned %zu markers of %d\n", n,
                   num_ranks);
      return 1;
    }
    marker_bytes = EncodeSavePlan(markers[1]).size();
  }
  std::sort(cached_times.begin(), cached_times.end());
  const double cached_seconds = cached_times[1];
  // Through CreateGlobalPlan, which returns a copy of the cached metadata.
  const double cached_by_value_seconds =
      TimeGlobalPlan(coordinator, markers).seconds;

  // Encoded sizes.
  size_t plan_bytes = 0;
  for (int r = 0; r < num_ranks; r += std::max(1, num_ranks / 64)) {
    plan_bytes += EncodeSavePlan(LocalPlan(r, num_ranks, false)).size();
  }
  const int sampled = (num_ranks + std::max(1, num_ranks / 64) - 1) /
                      std::max(1, num_ranks / 64);
  const double plan_bytes_per_item =
      static_cast<double>(plan_bytes) / (sampled * kItemsPerRank);
  AddStorageData(global.metadata, global.plans);
  // The metadata file as io/ writes it (docs/FORMAT.md), which is also what
  // the coordinator broadcasts.
  absl::StatusOr<std::string> metadata_file = EncodeMetadata(global.metadata);
  if (!metadata_file.ok()) {
    std::fprintf(stderr, "EncodeMetadata failed: %s\n",
                 metadata_file.status().ToString().c_str());
    return 1;
  }
  const size_t metadata_bytes = metadata_file->size();
  const double metadata_bytes_per_item =
      static_cast<double>(metadata_bytes) / stored;
  const size_t final_plan_bytes = EncodeSavePlan(global.plans[1]).size();

  // Load: 1024 -> 768 ranks.
  const LoadResult load = TimeLoad(&load_totals);

  // Scaling.
  nlohmann::json scaling = nlohmann::json::array();
  for (int r = 64; r <= num_ranks; r *= 2) {
    const double s =
        r == num_ranks ? global_seconds : GlobalPlanSeconds(r, 3, nullptr);
    scaling.push_back({{"ranks", r},
                       {"items", r * kItemsPerRank},
                       {"global_plan_seconds", s},
                       {"ns_per_item", s * 1e9 / (r * kItemsPerRank)}});
  }

  nlohmann::json out = {
      {"ranks", num_ranks},
      {"items", items},
      {"stored_items", stored},
      {"global_plan_seconds", global_seconds},
      {"cached_plan_seconds", cached_seconds},
      {"cached_fraction", cached_seconds / global_seconds},
      {"cached_plan_by_value_seconds", cached_by_value_seconds},
      {"first_cached_save_seconds", first_cached_seconds},
      {"rank_local_plan_with_digest_seconds", rank_digest_seconds},
      {"load_plan_seconds", load.local_seconds + load.global_seconds},
      {"load_plan_seconds_runs", load_totals},
      {"load_local_plans_seconds_all_ranks", load.local_seconds},
      {"load_local_plan_seconds_max_rank", load.max_rank_local_seconds},
      {"load_global_plan_seconds", load.global_seconds},
      {"load_read_items", load.read_items},
      {"load", {{"save_ranks", kSaveRanks}, {"load_ranks", kLoadRanks}}},
      {"plan_bytes_per_item", plan_bytes_per_item},
      {"final_plan_bytes", final_plan_bytes},
      {"unchanged_marker_bytes", marker_bytes},
      {"metadata_bytes", metadata_bytes},
      {"metadata_bytes_per_item", metadata_bytes_per_item},
      {"scaling", scaling},
  };
  if (json) {
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("%s\n", out.dump(2).c_str());
  }
  (void)rank0;
  return 0;
}

}  // namespace
}  // namespace dcp

int main(int argc, char** argv) { return dcp::Main(argc, argv); }
