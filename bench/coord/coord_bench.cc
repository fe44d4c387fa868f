// coord_bench: coordination time per distributed save (plan exchange plus
// commit, excluding data writes) for N local ranks, with and without plan
// caching, and the bytes of the plans that travel.
//
// Each configuration forks N processes that meet over Gloo (tcp on
// 127.0.0.1, FileStore rendezvous in a temporary directory) and save a tiny
// state (--items tensors of --item_bytes per rank, so data writes are
// small) --saves times with plan caching off, then --saves times with it on
// (the first cached save is the miss that fills the cache; it is reported
// apart and left out of the cached median).
//
// How data writes are excluded: every rank's StorageWriter is the real
// FileSystemWriter wrapped by TimedWriter, which times WriteData (resolving
// items, checksums, writes and fsync of the rank's data file) on its own.
// Ranks stamp times on the machine's one monotonic clock; a save's
// coordination time is its span (first rank entering SaveStateDict to last
// rank returning) minus the window in which any rank was writing data (first
// WriteData start to last WriteData end). Subtracting each rank's own write
// time instead would count a fast writer's wait for the slowest one as
// coordination. What is left: planning, plan gather, global planning and
// scatter (plan_ms), then the write results gather, the metadata commit
// (fsync + rename + directory fsync) on the coordinator and the outcome
// broadcast (finish_ms).
//
// Bytes: every rank's local plan as sent (EncodeSavePlan of the plan after
// the writer's PrepareLocalPlan, the exact payload the engine gathers), the
// final plans the coordinator scatters (EncodeSavePlan of
// PrepareGlobalPlan's output) and the committed metadata broadcast back
// (EncodeMetadata, io/metadata_format.h, the engine's encoding of it). The
// write results exchange and the small status messages are not counted
// (their codec is internal to engine/).
//
//   bazel run //bench/coord:coord_bench -- --ranks 2,4,8,16 --json
#include "bench/coord/coord_bench.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "bench/coord/netns.h"
#include "comm/process_group_factory.h"
#include "core/state_dict.h"
#include "core/status.h"
#include "engine/checkpoint.h"
#include "io/file_system_storage.h"
#include "io/metadata_format.h"
#include "io/storage.h"
#include "nlohmann/json.hpp"
#include "planner/default_planner.h"
#include "planner/plan_codec.h"

namespace dcp {
namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

double Millis(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// steady_clock is CLOCK_MONOTONIC, one clock for every process of the
// machine: ranks' timestamps compare directly.
int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             Clock::now().time_since_epoch())
      .count();
}

// Forwards every call to a FileSystemWriter, timing WriteData and Finish and
// recording the encoded size of the plans that pass through.
class TimedWriter final : public StorageWriter {
 public:
  explicit TimedWriter(const std::string& dir) : inner_(dir) {}

  absl::Status Reset(const std::string& checkpoint_id) override {
    return inner_.Reset(checkpoint_id);
  }
  StorageMeta GetStorageMeta() const override {
    return inner_.GetStorageMeta();
  }
  absl::Status SetUp(bool is_coordinator, int rank,
                     bool use_collectives) override {
    return inner_.SetUp(is_coordinator, rank, use_collectives);
  }
  absl::StatusOr<SavePlan> PrepareLocalPlan(SavePlan plan) override {
    absl::StatusOr<SavePlan> out = inner_.PrepareLocalPlan(std::move(plan));
    if (out.ok()) local_plan_bytes_ = EncodeSavePlan(*out).size();
    return out;
  }
  absl::StatusOr<std::vector<SavePlan>> PrepareGlobalPlan(
      std::vector<SavePlan> plans) override {
    absl::StatusOr<std::vector<SavePlan>> out =
        inner_.PrepareGlobalPlan(std::move(plans));
    if (out.ok()) {
      global_plan_bytes_ = 0;
      for (const SavePlan& p : *out) {
        global_plan_bytes_ += EncodeSavePlan(p).size();
      }
    }
    return out;
  }
  Future<std::vector<WriteResult>> WriteData(const SavePlan& plan,
                                             SavePlanner& planner) override {
    write_start_ns_ = NowNs();
    Future<std::vector<WriteResult>> done = inner_.WriteData(plan, planner);
    done.Wait();
    write_end_ns_ = NowNs();
    return done;
  }
  absl::Status Finish(
      const Metadata& metadata,
      const std::vector<std::vector<WriteResult>>& results) override {
    const Clock::time_point start = Clock::now();
    absl::Status s = inner_.Finish(metadata, results);
    commit_ms_ = Millis(start, Clock::now());
    absl::StatusOr<std::string> encoded = EncodeMetadata(metadata);
    metadata_bytes_ = encoded.ok() ? encoded->size() : 0;
    return s;
  }
  void DescribeCommit(Metadata& metadata) const override {
    inner_.DescribeCommit(metadata);
  }
  bool CommitDecided() const override { return inner_.CommitDecided(); }
  absl::Status MarkCommitted() override { return inner_.MarkCommitted(); }
  void Abort() override { inner_.Abort(); }

  int64_t write_start_ns() const { return write_start_ns_; }
  int64_t write_end_ns() const { return write_end_ns_; }
  double commit_ms() const { return commit_ms_; }
  size_t local_plan_bytes() const { return local_plan_bytes_; }
  size_t global_plan_bytes() const { return global_plan_bytes_; }
  size_t metadata_bytes() const { return metadata_bytes_; }

 private:
  FileSystemWriter inner_;
  int64_t write_start_ns_ = 0;
  int64_t write_end_ns_ = 0;
  double commit_ms_ = 0;
  size_t local_plan_bytes_ = 0;
  size_t global_plan_bytes_ = 0;
  size_t metadata_bytes_ = 0;
};

using Config = CoordBenchFlags;

// Rank r's state: `items` distinct 1-d byte tensors (names shared by all
// ranks are sharded tensors with one shard per rank, so the coordinator has
// a real global plan to build), plus the step.
StateDict MakeRankState(int rank, int world, const Config& config) {
  StateDict model;
  for (int i = 0; i < config.items; ++i) {
    Tensor t = Tensor::Empty(DType::kU8, {config.item_bytes});
    std::memset(t.data(), (rank * 31 + i) & 0xFF, t.nbytes());
    std::vector<Shard> shards;
    shards.push_back(Shard{{int64_t{rank} * config.item_bytes}, t});
    model[absl::StrFormat("layer%03d.weight", i)] = ShardedTensor(
        DType::kU8, {int64_t{world} * config.item_bytes}, std::move(shards));
  }
  StateDict state;
  state["model"] = std::move(model);
  state["step"] = int64_t{1};
  return state;
}

// One rank's body: joins the group, saves, writes one JSON line per save to
// `out`. Returns the process exit code.
int RankMain(int rank, int world, const std::string& root, const Config& config,
             const NetworkNamespaces* namespaces, int node) {
  comm::RendezvousInfo info;
  info.rank = rank;
  info.world_size = world;
  if (namespaces != nullptr) {
    if (absl::Status s = namespaces->Enter(node); !s.ok()) {
      std::fprintf(stderr, "[rank %d] %s\n", rank, s.ToString().c_str());
      return 1;
    }
    info.listen_address = NetworkNamespaces::Address(node);
  }
  info.store =
      comm::StoreAddress{comm::StoreAddress::Kind::kFile, root + "/rendezvous"};
  comm::ProcessGroupOptions group_options;
  group_options.backend = comm::Backend::kGloo;
  group_options.timeout = config.timeout;
  group_options.connect_timeout = config.timeout;
  const int64_t join_start_ns = NowNs();
  absl::StatusOr<std::unique_ptr<comm::ProcessGroup>> group =
      comm::CreateProcessGroup(info, group_options);
  const int64_t joined_ns = NowNs();
  if (!group.ok()) {
    std::fprintf(stderr, "[rank %d] join: %s\n", rank,
                 group.status().ToString().c_str());
    return 1;
  }
  std::ofstream out(absl::StrCat(root, "/rank-", rank, ".jsonl"));
  const StateDict state = MakeRankState(rank, world, config);
  for (bool cached : {false, true}) {
    DefaultSavePlannerOptions planner_options;
    planner_options.enable_plan_caching = cached;
    // One planner across the saves: caching compares with its last plan.
    DefaultSavePlanner planner(planner_options);
    for (int s = 0; s < config.saves; ++s) {
      const std::string dir =
          absl::StrCat(root, "/ckpt-", cached ? "cached" : "uncached", "-", s);
      TimedWriter writer(dir);
      absl::Status status = writer.Reset(dir);
      // Start together, so one rank's late start is not counted as
      // coordination.
      if (status.ok()) status = (*group)->Barrier();
      SaveOptions options;
      options.process_group = group->get();
      options.planner = &planner;
      const int64_t start_ns = NowNs();
      if (status.ok()) status = SaveStateDict(state, writer, options).status();
      const int64_t end_ns = NowNs();
      if (!status.ok()) {
        std::fprintf(stderr, "[rank %d] save %d (%s): %s\n", rank, s,
                     cached ? "cached" : "uncached", status.ToString().c_str());
        return 1;
      }
      nlohmann::json line = {{"cached", cached},
                             {"join_start_ns", join_start_ns},
                             {"joined_ns", joined_ns},
                             {"save", s},
                             {"start_ns", start_ns},
                             {"end_ns", end_ns},
                             {"write_start_ns", writer.write_start_ns()},
                             {"write_end_ns", writer.write_end_ns()},
                             {"commit_ms", writer.commit_ms()},
                             {"local_plan_bytes", writer.local_plan_bytes()},
                             {"global_plan_bytes", writer.global_plan_bytes()},
                             {"metadata_bytes", writer.metadata_bytes()}};
      out << line.dump() << "\n";
      out.flush();
      std::error_code ec;
      fs::remove_all(dir, ec);  // Keep the disk footprint flat.
    }
  }
  return out.good() ? 0 : 1;
}

// Forks `world` ranks and waits (killing them all after `deadline`). Returns
// true when every rank exited 0.
bool RunRanks(int world, const std::string& root, const Config& config,
              const NetworkNamespaces* namespaces, absl::Duration deadline) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("fork");
      for (pid_t p : pids) ::kill(p, SIGKILL);
      return false;
    }
    if (pid == 0) {
      const int node =
          namespaces == nullptr ? 0 : r * namespaces->nodes() / world;
      const int rc = RankMain(r, world, root, config, namespaces, node);
      std::fflush(nullptr);
      ::_exit(rc);
    }
    pids.push_back(pid);
  }
  bool ok = true;
  const absl::Time end = absl::Now() + deadline;
  size_t left = pids.size();
  std::vector<bool> done(pids.size(), false);
  while (left > 0) {
    for (size_t r = 0; r < pids.size(); ++r) {
      if (done[r]) continue;
      int status = 0;
      const pid_t got = ::waitpid(pids[r], &status, WNOHANG);
      if (got == pids[r]) {
        done[r] = true;
        --left;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ok = false;
      }
    }
    if (left == 0) break;
    if (absl::Now() > end) {
      std::fprintf(stderr, "coord_bench: %d ranks still running after %s\n",
                   static_cast<int>(left),
                   absl::FormatDuration(deadline).c_str());
      for (size_t r = 0; r < pids.size(); ++r) {
        if (!done[r]) {
          ::kill(pids[r], SIGKILL);
          ::waitpid(pids[r], nullptr, 0);
        }
      }
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return ok;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// One save seen across ranks, on the machine's one monotonic clock.
struct SaveSummary {
  int64_t start_ns = INT64_MAX;        // first rank entering SaveStateDict
  int64_t end_ns = 0;                  // last rank returning
  int64_t write_start_ns = INT64_MAX;  // first rank starting WriteData
  int64_t write_end_ns = 0;            // last rank finishing WriteData
  double commit_ms = 0;                // the coordinator's Finish
  size_t plan_bytes_up = 0;            // all ranks' local plans
  size_t plan_bytes_down = 0;          // all final plans
  size_t metadata_bytes = 0;           // one copy of the committed metadata

  static double Ms(int64_t ns) { return ns / 1e6; }
  double total_ms() const { return Ms(end_ns - start_ns); }
  // The window in which any rank was writing data: excluded.
  double write_ms() const { return Ms(write_end_ns - write_start_ns); }
  // Before the first write: local planning, plan gather, global plan,
  // scatter.
  double plan_ms() const { return Ms(write_start_ns - start_ns); }
  // After the last write: write results gather, commit, outcome broadcast.
  double finish_ms() const { return Ms(end_ns - write_end_ns); }
  double coordination_ms() const { return plan_ms() + finish_ms(); }
};

struct ModeSummary {
  // Medians over the counted saves.
  double coordination_ms = 0;
  double plan_ms = 0;
  double finish_ms = 0;
  double commit_ms = 0;
  double write_ms = 0;
  double total_ms = 0;
  // Of the last save.
  size_t plan_bytes_up = 0;
  size_t plan_bytes_down = 0;
  size_t metadata_bytes = 0;
  double first_coordination_ms = 0;  // the first save of the mode
  int counted = 0;
};

ModeSummary Summarize(const std::vector<SaveSummary>& saves, bool skip_first) {
  ModeSummary m;
  std::vector<double> coord, plan, finish, commit, write, total;
  for (size_t s = skip_first ? 1 : 0; s < saves.size(); ++s) {
    coord.push_back(saves[s].coordination_ms());
    plan.push_back(saves[s].plan_ms());
    finish.push_back(saves[s].finish_ms());
    commit.push_back(saves[s].commit_ms);
    write.push_back(saves[s].write_ms());
    total.push_back(saves[s].total_ms());
  }
  m.coordination_ms = Median(coord);
  m.plan_ms = Median(plan);
  m.finish_ms = Median(finish);
  m.commit_ms = Median(commit);
  m.write_ms = Median(write);
  m.total_ms = Median(total);
  m.counted = static_cast<int>(coord.size());
  if (!saves.empty()) {
    m.plan_bytes_up = saves.back().plan_bytes_up;
    m.plan_bytes_down = saves.back().plan_bytes_down;
    m.metadata_bytes = saves.back().metadata_bytes;
    m.first_coordination_ms = saves.front().coordination_ms();
  }
  return m;
}

// Reads the ranks' JSON lines into per-mode, per-save summaries.
absl::StatusOr<std::map<bool, std::vector<SaveSummary>>> Collect(
    int world, const std::string& root, const Config& config,
    double* rendezvous_ms) {
  int64_t join_start_ns = INT64_MAX, joined_ns = 0;
  std::map<bool, std::vector<SaveSummary>> out;
  out[false].resize(config.saves);
  out[true].resize(config.saves);
  for (int r = 0; r < world; ++r) {
    std::ifstream in(absl::StrCat(root, "/rank-", r, ".jsonl"));
    std::string line;
    int lines = 0;
    while (std::getline(in, line)) {
      const nlohmann::json j = nlohmann::json::parse(line);
      join_start_ns =
          std::min(join_start_ns, j["join_start_ns"].get<int64_t>());
      joined_ns = std::max(joined_ns, j["joined_ns"].get<int64_t>());
      SaveSummary& s = out[j["cached"].get<bool>()].at(j["save"].get<int>());
      s.start_ns = std::min(s.start_ns, j["start_ns"].get<int64_t>());
      s.end_ns = std::max(s.end_ns, j["end_ns"].get<int64_t>());
      s.write_start_ns =
          std::min(s.write_start_ns, j["write_start_ns"].get<int64_t>());
      s.write_end_ns =
          std::max(s.write_end_ns, j["write_end_ns"].get<int64_t>());
      if (r == 0) {
        s.commit_ms = j["commit_ms"];
        s.plan_bytes_down = j["global_plan_bytes"];
        s.metadata_bytes = j["metadata_bytes"];
      }
      s.plan_bytes_up += j["local_plan_bytes"].get<size_t>();
      ++lines;
    }
    if (lines != 2 * config.saves) {
      return absl::DataLossError(absl::StrCat("rank ", r, " reported ", lines,
                                              " saves, expected ",
                                              2 * config.saves));
    }
  }
  *rendezvous_ms = SaveSummary::Ms(joined_ns - join_start_ns);
  return out;
}

}  // namespace

absl::Status RunCoordBench(const CoordBenchFlags& config) {
  const std::vector<int>& ranks = config.ranks;
  const bool json = config.json;
  for (int world : ranks) {
    if (world < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("coord bench: rank count ", world, " is below 1"));
    }
  }
  std::string root_dir = config.dir;
  if (root_dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    root_dir = tmp != nullptr ? tmp : "/tmp";
  }
  const std::string root = absl::StrCat(root_dir, "/coord_bench-", ::getpid());
  nlohmann::json rows = nlohmann::json::array();
  if (!json) {
    std::printf(
        "coordination per save (plan exchange + commit, data writes "
        "excluded), median of %d saves; %d items x %d B per rank; Gloo tcp "
        "on 127.0.0.1 (1 node) or over veth pairs and a bridge between "
        "network namespaces (N nodes), %u cores\n",
        config.saves, config.items, config.item_bytes,
        std::thread::hardware_concurrency());
    std::printf("%5s %5s %7s %7s %9s %8s %9s %9s %9s %9s %10s %10s %7s\n",
                "ranks", "nodes", "join ms", "caching", "coord ms", "plan ms",
                "finish ms", "commit ms", "writes ms", "total ms", "plans up B",
                "plans dn B", "meta B");
  }
  for (int nodes : config.nodes) {
    std::unique_ptr<NetworkNamespaces> namespaces;
    if (nodes > 1) {
      namespaces = std::make_unique<NetworkNamespaces>(nodes);
      DCP_RETURN_IF_ERROR(namespaces->Make());
    }
    for (int world : ranks) {
      if (world < nodes) continue;
      const std::string dir = absl::StrCat(root, "/n", world, "-", nodes);
      fs::create_directories(dir + "/rendezvous");
      if (!RunRanks(world, dir, config, namespaces.get(), absl::Minutes(5))) {
        std::error_code ec;
        fs::remove_all(root, ec);
        return absl::InternalError(absl::StrCat(
            "coord bench: a rank failed or hung with ", world, " ranks on ",
            nodes, " nodes (its message is on stderr)"));
      }
      double rendezvous_ms = 0;
      absl::StatusOr<std::map<bool, std::vector<SaveSummary>>> saves =
          Collect(world, dir, config, &rendezvous_ms);
      if (!saves.ok()) return saves.status();
      std::error_code ec;
      fs::remove_all(dir, ec);
      for (bool cached : {false, true}) {
        // The first cached save fills the cache: report it apart.
        const ModeSummary m = Summarize((*saves)[cached], cached);
        rows.push_back({{"ranks", world},
                        {"nodes", nodes},
                        {"rendezvous_ms", rendezvous_ms},
                        {"plan_caching", cached},
                        {"coordination_ms", m.coordination_ms},
                        {"plan_ms", m.plan_ms},
                        {"finish_ms", m.finish_ms},
                        {"first_save_coordination_ms", m.first_coordination_ms},
                        {"commit_ms", m.commit_ms},
                        {"write_ms", m.write_ms},
                        {"total_ms", m.total_ms},
                        {"saves_counted", m.counted},
                        {"plan_bytes_up", m.plan_bytes_up},
                        {"plan_bytes_down", m.plan_bytes_down},
                        {"metadata_bytes", m.metadata_bytes}});
        if (!json) {
          std::printf(
              "%5d %5d %7.1f %7s %9.2f %8.2f %9.2f %9.2f %9.2f %9.2f %10zu "
              "%10zu %7zu\n",
              world, nodes, rendezvous_ms, cached ? "on" : "off",
              m.coordination_ms, m.plan_ms, m.finish_ms, m.commit_ms,
              m.write_ms, m.total_ms, m.plan_bytes_up, m.plan_bytes_down,
              m.metadata_bytes);
        }
      }
    }
  }
  std::error_code ec;
  fs::remove_all(root, ec);
  if (json) {
    nlohmann::json out;
    out["benchmark"] = "coord";
    out["what"] =
        "coordination_ms per save = plan_ms (first rank entering "
        "SaveStateDict to first rank starting WriteData) + finish_ms (last "
        "rank finishing WriteData to last rank returning); the window in "
        "which any rank wrote data (writes_ms) is excluded; median over "
        "saves; the cached mode leaves out its first (cache-filling) save";
    out["transport"] =
        "gloo tcp: 127.0.0.1 for 1 node; for N nodes, network namespaces "
        "joined by veth pairs to a bridge (10.77.0.x); FileStore rendezvous";
    out["rendezvous_ms"] =
        "first rank starting to join to the last rank joined (group "
        "creation: generation, Gloo mesh, joined barrier)";
    out["cores"] = std::thread::hardware_concurrency();
    out["items_per_rank"] = config.items;
    out["item_bytes"] = config.item_bytes;
    out["saves_per_mode"] = config.saves;
    out["rows"] = rows;
    std::printf("%s\n", out.dump().c_str());
  }
  return absl::OkStatus();
}

}  // namespace dcp
