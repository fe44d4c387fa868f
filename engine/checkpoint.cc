#include "engine/checkpoint.h"

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "comm/process_group.h"
#include "core/checkpoint_exception.h"
#include "core/status.h"
#include "engine/internal/dist_wrapper.h"
#include "engine/internal/group_turns.h"
#include "engine/internal/write_results_codec.h"
#include "io/file_system_storage.h"
#include "io/metadata_format.h"
#include "io/storage_registry.h"
#include "planner/default_planner.h"
#include "planner/plan_codec.h"

namespace dcp {
namespace {

std::atomic<comm::ProcessGroup*> default_group{nullptr};

comm::ProcessGroup* GroupFor(comm::ProcessGroup* requested, bool no_dist) {
  if (no_dist) return nullptr;
  return requested != nullptr ? requested : DefaultProcessGroup();
}

// After a step every rank ran on its own: every rank learns every rank's
// outcome, so a failure anywhere fails everywhere with the same Status.
absl::Status ShareOutcome(comm::ProcessGroup& group, absl::string_view what,
                          const absl::Status& local) {
  absl::StatusOr<std::vector<absl::Status>> all =
      comm::AllGatherStatuses(group, local);
  if (!all.ok()) {
    return Annotate(all.status(), absl::StrCat("checkpoint ", what, " on rank ",
                                               group.rank()));
  }
  std::map<int, absl::Status> failures;
  for (size_t r = 0; r < all->size(); ++r) {
    if (!(*all)[r].ok()) failures[static_cast<int>(r)] = (*all)[r];
  }
  return MakeCheckpointException(what, failures);
}

template <typename T, typename Decode>
absl::StatusOr<std::vector<T>> DecodeAll(const std::vector<std::string>& in,
                                         Decode decode,
                                         absl::string_view what) {
  std::vector<T> out;
  out.reserve(in.size());
  for (size_t r = 0; r < in.size(); ++r) {
    absl::StatusOr<T> value = decode(in[r]);
    if (!value.ok()) {
      return Annotate(value.status(), absl::StrCat(what, " from rank ", r));
    }
    out.push_back(*std::move(value));
  }
  return out;
}

// Runs the seed's plan exchange: local plans travel to the coordinator,
// which runs `global_step` on all of them; each rank gets its final plan.
template <typename Plan>
absl::StatusOr<Plan> ExchangePlans(
    internal::DistWrapper& dist, absl::string_view step,
    absl::FunctionRef<absl::StatusOr<Plan>()> local_step,
    absl::FunctionRef<absl::StatusOr<std::vector<Plan>>(std::vector<Plan>)>
        global_step,
    std::string (*encode)(const Plan&),
    absl::StatusOr<Plan> (*decode)(absl::string_view)) {
  DCP_ASSIGN_OR_RETURN(
      std::string encoded,
      dist.GatherScatter(
          step,
          [&]() -> absl::StatusOr<std::string> {
            DCP_ASSIGN_OR_RETURN(Plan plan, local_step());
            return encode(plan);
          },
          [&](std::vector<std::string> encoded_plans)
              -> absl::StatusOr<std::vector<std::string>> {
            DCP_ASSIGN_OR_RETURN(std::vector<Plan> plans,
                                 DecodeAll<Plan>(encoded_plans, decode, step));
            DCP_ASSIGN_OR_RETURN(plans, global_step(std::move(plans)));
            std::vector<std::string> out;
            out.reserve(plans.size());
            for (const Plan& plan : plans) out.push_back(encode(plan));
            return out;
          }));
  return decode(encoded);
}

// Records where each item was stored, as the seed's finish does on the
// metadata it returns: Save's result and the metadata other ranks receive
// name every item's file, offset, length and checksums.
// The results are moved in; ranks write in name order, so each item mostly
// lands at the end of the map (O(1)).
void AddStorageData(std::vector<std::vector<WriteResult>>&& results,
                    Metadata& metadata) {
  for (std::vector<WriteResult>& rank_results : results) {
    for (WriteResult& result : rank_results) {
      metadata.storage_data.insert_or_assign(metadata.storage_data.end(),
                                             std::move(result.index),
                                             std::move(result.storage_data));
    }
  }
}

// What the coordinator broadcasts after the commit step: kCommitted and the
// committed metadata (io/metadata_format.h's encoding), or kDecided and the
// failure of a Finish that failed after its commit was decided
// (StorageWriter::CommitDecided): code, newline, message.
constexpr char kCommitted = 'C';
constexpr char kDecided = 'D';

std::string EncodeDecidedFailure(const absl::Status& failure) {
  return absl::StrCat(std::string(1, kDecided),
                      static_cast<int>(failure.code()), "\n",
                      failure.message());
}

// The failure every rank reports for a decided commit whose Finish failed
// on the coordinator (`coordinator`): each rank kept what it wrote.
absl::Status DecidedFailure(absl::string_view encoded, int coordinator) {
  absl::string_view body = encoded.substr(1);
  const size_t newline = body.find('\n');
  int code = static_cast<int>(absl::StatusCode::kUnknown);
  if (newline == absl::string_view::npos ||
      !absl::SimpleAtoi(body.substr(0, newline), &code) || code <= 0 ||
      code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    code = static_cast<int>(absl::StatusCode::kUnknown);
  }
  const absl::string_view message =
      newline == absl::string_view::npos ? body : body.substr(newline + 1);
  return absl::Status(
      static_cast<absl::StatusCode>(code),
      absl::StrCat("the checkpoint was committed, but the coordinator (rank ",
                   coordinator,
                   ") failed after the commit was decided: ", message,
                   "; every rank kept the files it wrote (the next save "
                   "removes what the checkpoint no longer names)"));
}

// The seed's _save_state_dict: plans travel to the coordinator and back
// (GatherScatter), every rank writes, the write results travel to the
// coordinator, which commits (GatherBroadcast); on any failure every rank
// aborts its writer, so nothing half-written stays behind.
// `prepared`: how this rank's preparation of the writer went (Reset,
// SetDeviceWait). A failure is this rank's local step's failure, so every
// rank of the exchange fails with it instead of waiting for this one.
absl::StatusOr<Metadata> SaveWithCoordination(
    const StateDict& state_dict, StorageWriter& writer, SavePlanner& planner,
    internal::DistWrapper& dist, bool use_collectives,
    const absl::Status& prepared, const RankLocalSave* rank_local) {
  const bool is_coordinator = dist.is_coordinator();
  // Shared, not copied: with plan caching it is the planner's cached
  // metadata itself, so a cached re-plan costs O(ranks) on the critical
  // path of the plan exchange.
  std::shared_ptr<Metadata> global_metadata;
  // What the rank that planned globally commits and returns: the planner's
  // metadata itself when nothing else holds it (no plan cache), else a copy
  // made while its own writes run.
  Metadata returned_metadata;

  auto local_step = [&]() -> absl::StatusOr<SavePlan> {
    DCP_RETURN_IF_ERROR(prepared);
    DCP_RETURN_IF_ERROR(
        planner.SetUp(state_dict, writer.GetStorageMeta(), is_coordinator));
    DCP_RETURN_IF_ERROR(
        writer.SetUp(is_coordinator, dist.rank(), use_collectives));
    DCP_ASSIGN_OR_RETURN(SavePlan plan, planner.CreateLocalPlan());
    return writer.PrepareLocalPlan(std::move(plan));
  };
  auto global_step = [&](std::vector<SavePlan> plans)
      -> absl::StatusOr<std::vector<SavePlan>> {
    DCP_ASSIGN_OR_RETURN(SharedGlobalSavePlan global,
                         planner.CreateSharedGlobalPlan(std::move(plans)));
    global_metadata = std::move(global.metadata);
    return writer.PrepareGlobalPlan(std::move(global.plans));
  };

  // This rank's write results went to the coordinator, which may commit
  // from then on.
  bool results_sent = false;
  auto run = [&]() -> absl::StatusOr<Metadata> {
    SavePlan central_plan;
    if (use_collectives && dist.size() > 1) {
      DCP_ASSIGN_OR_RETURN(
          central_plan,
          ExchangePlans<SavePlan>(dist, "save plan", local_step, global_step,
                                  EncodeSavePlan, DecodeSavePlan));
    } else {
      if (dist.size() > 1) {
        return absl::UnimplementedError(
            "use_collectives=false with more than one rank is not supported "
            "yet; save with use_collectives=true or no_dist=true");
      }
      DCP_ASSIGN_OR_RETURN(SavePlan plan, local_step());
      std::vector<SavePlan> plans;
      plans.push_back(std::move(plan));
      DCP_ASSIGN_OR_RETURN(plans, global_step(std::move(plans)));
      central_plan = std::move(plans.at(0));
    }

    auto write_step = [&]() -> absl::StatusOr<std::vector<WriteResult>> {
      DCP_ASSIGN_OR_RETURN(SavePlan final_plan,
                           planner.FinishPlan(std::move(central_plan)));
      Future<std::vector<WriteResult>> written =
          writer.WriteData(final_plan, planner);
      if (global_metadata != nullptr) {
        if (global_metadata.use_count() == 1) {
          returned_metadata = std::move(*global_metadata);
        } else {
          returned_metadata = *global_metadata;
        }
        global_metadata.reset();
      }
      return written.Wait();
    };
    if (dist.size() == 1) {
      DCP_ASSIGN_OR_RETURN(std::vector<WriteResult> results, write_step());
      std::vector<std::vector<WriteResult>> all;
      all.push_back(std::move(results));
      if (rank_local != nullptr) returned_metadata.rank_local = *rank_local;
      writer.DescribeCommit(returned_metadata);
      DCP_RETURN_IF_ERROR(writer.Finish(returned_metadata, all));
      DCP_RETURN_IF_ERROR(writer.MarkCommitted());
      AddStorageData(std::move(all), returned_metadata);
      return std::move(returned_metadata);
    }
    DCP_ASSIGN_OR_RETURN(
        std::string outcome,
        dist.GatherBroadcast(
            "write",
            [&]() -> absl::StatusOr<std::string> {
              DCP_ASSIGN_OR_RETURN(std::vector<WriteResult> results,
                                   write_step());
              absl::StatusOr<std::string> encoded =
                  internal::EncodeWriteResults(results);
              results_sent = encoded.ok();
              return encoded;
            },
            [&](std::vector<std::string> encoded_results)
                -> absl::StatusOr<std::string> {
              DCP_ASSIGN_OR_RETURN(
                  std::vector<std::vector<WriteResult>> all,
                  DecodeAll<std::vector<WriteResult>>(
                      encoded_results, internal::DecodeWriteResults,
                      "write results"));
              writer.DescribeCommit(returned_metadata);
              absl::Status finished = writer.Finish(returned_metadata, all);
              if (!finished.ok()) {
                // Decided: the other ranks must keep their files.
                if (writer.CommitDecided()) {
                  return EncodeDecidedFailure(finished);
                }
                return finished;
              }
              AddStorageData(std::move(all), returned_metadata);
              // The metadata travels in its on-disk encoding
              // (io/metadata_format.h), which every rank decodes and
              // validates as a load would.
              DCP_ASSIGN_OR_RETURN(std::string encoded,
                                   EncodeMetadata(returned_metadata));
              encoded.insert(encoded.begin(), kCommitted);
              return encoded;
            }));
    if (!outcome.empty() && outcome.front() == kDecided) {
      // Keep this rank's files: the committed checkpoint names them. The
      // coordinator's Abort (below) completes a decided commit.
      if (!is_coordinator) writer.MarkCommitted().IgnoreError();
      return DecidedFailure(outcome, dist.coordinator_rank());
    }
    if (outcome.empty() || outcome.front() != kCommitted) {
      return absl::InternalError(
          "the coordinator's commit outcome has an unknown tag");
    }
    DCP_RETURN_IF_ERROR(writer.MarkCommitted());
    if (is_coordinator) return std::move(returned_metadata);
    return DecodeMetadata(absl::string_view(outcome).substr(1),
                          "metadata broadcast by the coordinator");
  };

  absl::StatusOr<Metadata> metadata = run();
  if (metadata.ok()) return metadata;
  // The coordinator reports its outcome as a CheckpointException (or a
  // decided failure, which keeps the files). Any other failure after this
  // rank's results went out (the coordinator died, the broadcast timed
  // out) leaves the outcome unknown: the coordinator may have committed a
  // checkpoint that names this rank's files, so they stay (the next save
  // in the directory removes them if it does not).
  if (!is_coordinator && results_sent &&
      !CheckpointFailures(metadata.status()).has_value()) {
    writer.MarkCommitted().IgnoreError();
    return Annotate(
        metadata.status(),
        absl::StrCat("rank ", dist.rank(),
                     " did not learn whether the coordinator committed the "
                     "checkpoint, so it kept its files"));
  }
  writer.Abort();
  return metadata;
}

// The seed's _load_state_dict: every rank reads the metadata and plans its
// reads; the coordinator may rewrite the plans (read dedup); every rank
// reads; the outcome is exchanged so every rank reports every failure.
// `preread`: the reader's metadata when the caller read it already (it
// outlives the load).
absl::Status LoadWithCoordination(StateDict& state_dict, StorageReader& reader,
                                  LoadPlanner& planner,
                                  internal::DistWrapper& dist,
                                  const Metadata* preread = nullptr) {
  const bool is_coordinator = dist.is_coordinator();
  // Planner and reader keep references to the metadata until the load ends.
  Metadata read;
  const Metadata* metadata = preread;
  auto local_step = [&]() -> absl::StatusOr<LoadPlan> {
    if (metadata == nullptr) {
      DCP_ASSIGN_OR_RETURN(read, reader.ReadMetadata());
      metadata = &read;
    }
    DCP_RETURN_IF_ERROR(planner.SetUp(&state_dict, *metadata, is_coordinator));
    DCP_RETURN_IF_ERROR(reader.SetUp(*metadata, is_coordinator));
    DCP_ASSIGN_OR_RETURN(LoadPlan plan, planner.CreateLocalPlan());
    return reader.PrepareLocalPlan(std::move(plan));
  };
  auto global_step = [&](std::vector<LoadPlan> plans)
      -> absl::StatusOr<std::vector<LoadPlan>> {
    DCP_ASSIGN_OR_RETURN(plans, planner.CreateGlobalPlan(std::move(plans)));
    return reader.PrepareGlobalPlan(std::move(plans));
  };
  auto read_step = [&](LoadPlan central_plan) -> absl::Status {
    DCP_ASSIGN_OR_RETURN(LoadPlan final_plan,
                         planner.FinishPlan(std::move(central_plan)));
    return reader.ReadData(final_plan, planner).Wait();
  };

  if (dist.size() == 1) {
    DCP_ASSIGN_OR_RETURN(LoadPlan plan, local_step());
    std::vector<LoadPlan> plans;
    plans.push_back(std::move(plan));
    DCP_ASSIGN_OR_RETURN(plans, global_step(std::move(plans)));
    return read_step(std::move(plans.at(0)));
  }
  DCP_ASSIGN_OR_RETURN(
      LoadPlan central_plan,
      ExchangePlans<LoadPlan>(dist, "load plan", local_step, global_step,
                              EncodeLoadPlan, DecodeLoadPlan));
  // Every rank learns whether every other rank's reads succeeded.
  return dist
      .GatherBroadcast(
          "read",
          [&]() -> absl::StatusOr<std::string> {
            DCP_RETURN_IF_ERROR(read_step(std::move(central_plan)));
            return std::string();
          },
          [](std::vector<std::string>) -> absl::StatusOr<std::string> {
            return std::string();
          })
      .status();
}

// The wait a load passes its reader: `wait` when the state dict holds a
// device tensor (all of them on wait.device), else none.
absl::StatusOr<DeviceWait> DeviceWaitForLoad(StateDict& state_dict,
                                             const DeviceWait& wait) {
  if (wait.empty()) return wait;
  DCP_ASSIGN_OR_RETURN(auto leaves, FlattenStateDictInPlace(state_dict));
  bool any_device = false;
  auto check = [&](const std::string& name, const Tensor& t) -> absl::Status {
    if (!t.device().is_cuda()) return absl::OkStatus();
    any_device = true;
    if (t.device().index == wait.device) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", name, "\" is on ", t.device().ToString(),
        ", but the caller's stream to wait for (LoadOptions::device_wait) is "
        "on cuda:",
        wait.device));
  };
  for (const auto& [name, value] : leaves) {
    if (value->is_tensor()) {
      DCP_RETURN_IF_ERROR(check(name, value->tensor()));
    } else if (value->is_sharded_tensor()) {
      for (const Shard& shard : value->sharded_tensor().local_shards()) {
        DCP_RETURN_IF_ERROR(check(name, shard.tensor));
      }
    }
  }
  return any_device ? wait : DeviceWait{};
}

}  // namespace

void SetDefaultProcessGroup(comm::ProcessGroup* group) {
  default_group.store(group);
}

comm::ProcessGroup* DefaultProcessGroup() { return default_group.load(); }

absl::Status AgreeInTurn(comm::ProcessGroup* group, absl::string_view what,
                         const absl::Status& local) {
  if (group == nullptr) return local;
  internal::GroupTurn turn = internal::GroupTurn::Take(group);
  turn.Wait();
  return ShareOutcome(*group, what, local);
}

namespace {

// A rank-local save's id (RankLocalSave::group_save_id): 128 random bits.
std::string NewGroupSaveId() {
  absl::BitGen gen;
  return absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen),
                         absl::Uniform<uint64_t>(gen));
}

// What a rank tells the others of its rank-local checkpoint before a load:
// 'E' (its metadata did not read: the load reports why), '-' (no record:
// saved by a dcp before the record existed) or 'R' rank, world size and id.
std::string DescribeRankLocal(const absl::StatusOr<Metadata>& metadata) {
  if (!metadata.ok()) return "E";
  if (!metadata->rank_local.has_value()) return "-";
  const RankLocalSave& r = *metadata->rank_local;
  return absl::StrCat("R", r.rank, "\n", r.world_size, "\n", r.group_save_id);
}

// Every rank of a rank-local load, with each rank's DescribeRankLocal: the
// same verdict on every rank. The checkpoints load together only when all
// come from one save of as many ranks as this load's, each rank its own.
absl::Status CheckRankLocalSet(const std::vector<std::string>& described,
                               absl::string_view location) {
  std::map<std::string, std::vector<int>> ranks_by_save;
  for (size_t r = 0; r < described.size(); ++r) {
    const std::string& d = described[r];
    if (d == "E") return absl::OkStatus();  // The load fails naming it.
    if (d == "-") {
      ranks_by_save["(one saved before dcp recorded save ids)"].push_back(
          static_cast<int>(r));
      continue;
    }
    std::vector<std::string> parts = absl::StrSplit(
        absl::string_view(d).substr(1), absl::MaxSplits('\n', 2));
    int rank = -1;
    int world = -1;
    if (d.front() != 'R' || parts.size() != 3 ||
        !absl::SimpleAtoi(parts[0], &rank) ||
        !absl::SimpleAtoi(parts[1], &world)) {
      return absl::InternalError(absl::StrCat(
          "rank ", r, " described its rank-local checkpoint as \"", d, "\""));
    }
    if (world != static_cast<int>(described.size()) ||
        rank != static_cast<int>(r)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the rank-local checkpoint rank ", r, " reads in ", location,
          " was saved by rank ", rank, " of ", world,
          ", but this load runs on ", described.size(),
          " ranks: load rank-local checkpoints on the rank count that saved "
          "them"));
    }
    ranks_by_save[absl::StrCat("save ", parts[2])].push_back(
        static_cast<int>(r));
  }
  if (ranks_by_save.size() <= 1) return absl::OkStatus();
  std::vector<std::string> held;
  for (const auto& [save, ranks] : ranks_by_save) {
    held.push_back(absl::StrCat(
        ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ", "),
        ranks.size() == 1 ? " holds " : " hold ", save));
  }
  return absl::DataLossError(absl::StrCat(
      "the rank-local checkpoints in ", location,
      " come from different saves (a save that committed on some ranks "
      "only): ",
      absl::StrJoin(held, "; "),
      "; nothing was loaded: load an older checkpoint that every rank "
      "saved"));
}

// SaveStateDict; a `local_failure` (not OK) fails this rank's part inside
// the coordinated steps. `turn`: this save's turn on its group, taken when
// it was submitted (null: taken now).
absl::StatusOr<Metadata> SaveStateDictOrFail(const StateDict& state_dict,
                                             StorageWriter& storage_writer,
                                             SaveOptions options,
                                             const absl::Status& local_failure,
                                             internal::GroupTurn* turn) {
  internal::GroupTurn own_turn;
  if (turn == nullptr) {
    own_turn = internal::GroupTurn::Take(
        GroupFor(options.process_group, options.no_dist));
    turn = &own_turn;
  }
  turn->Wait();
  // As the seed's save_state_dict: a fresh save id per save, so a writer
  // reused for the next save never writes over the files of the checkpoint
  // it committed before; as its save, at checkpoint_id when one is given.
  // A rank whose writer refuses either fails inside the coordinated steps
  // below, so the other ranks learn it rather than wait for it.
  absl::Status prepared = local_failure;
  if (prepared.ok()) prepared = storage_writer.Reset(options.checkpoint_id);
  if (prepared.ok()) {
    prepared = storage_writer.SetDeviceWait(options.device_wait);
  }
  internal::DistWrapper dist(GroupFor(options.process_group, options.no_dist),
                             options.coordinator_rank);
  std::unique_ptr<DefaultSavePlanner> default_planner;
  SavePlanner* planner = options.planner;
  if (planner == nullptr) {
    DefaultSavePlannerOptions planner_options;
    planner_options.require_full_coverage =
        options.use_collectives || dist.size() == 1;
    default_planner = std::make_unique<DefaultSavePlanner>(planner_options);
    planner = default_planner.get();
  }
  if (options.coordinator_rank < 0 || options.coordinator_rank >= dist.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("coordinator_rank ", options.coordinator_rank,
                     " is outside the ", dist.size(), "-rank group"));
  }
  if (!options.use_collectives && dist.size() > 1) {
    // Rank-local: each rank saves an independent checkpoint of its own
    // (where, the writer decides) without exchanging plans; only the
    // outcome is shared.
    // Every rank's checkpoint records the save's id, the coordinator's
    // choice, so a load tells one save's checkpoints from a mix of saves
    // (one that committed on some ranks only).
    comm::ProcessGroup& group = *GroupFor(options.process_group, false);
    absl::StatusOr<std::string> group_save_id = group.Broadcast(
        group.rank() == options.coordinator_rank ? NewGroupSaveId()
                                                 : std::string(),
        options.coordinator_rank);
    if (!group_save_id.ok()) {
      return Annotate(group_save_id.status(),
                      absl::StrCat("rank-local save on rank ", group.rank(),
                                   ": agreeing on the save's id"));
    }
    const RankLocalSave record{*std::move(group_save_id), group.rank(),
                               group.size()};
    internal::DistWrapper alone(nullptr, 0);
    absl::Status selected =
        prepared.ok() ? storage_writer.SelectRankLocal(group.rank()) : prepared;
    absl::StatusOr<Metadata> metadata =
        selected.ok()
            ? SaveWithCoordination(state_dict, storage_writer, *planner, alone,
                                   /*use_collectives=*/false, selected, &record)
            : absl::StatusOr<Metadata>(selected);
    DCP_RETURN_IF_ERROR(
        ShareOutcome(group, "rank-local save", metadata.status()));
    return metadata;
  }
  return SaveWithCoordination(state_dict, storage_writer, *planner, dist,
                              options.use_collectives, prepared,
                              /*rank_local=*/nullptr);
}

absl::StatusOr<Metadata> SaveOrFail(const StateDict& state_dict,
                                    const SaveOptions& options,
                                    const absl::Status& local_failure,
                                    internal::GroupTurn* turn) {
  if (options.storage_writer != nullptr) {
    return SaveStateDictOrFail(state_dict, *options.storage_writer, options,
                               local_failure, turn);
  }
  if (options.checkpoint_id.empty()) {
    return absl::InvalidArgumentError(
        "Save needs a checkpoint_id (a directory) or a storage_writer");
  }
  // The storage the id names (io/storage_registry.h): native for a path.
  // The backend's factory took the id; the writer keeps its location.
  absl::StatusOr<std::unique_ptr<StorageWriter>> writer =
      StorageRegistry::Default().CreateWriter(options.checkpoint_id);
  SaveOptions at_writer = options;
  at_writer.checkpoint_id.clear();
  if (!writer.ok()) {
    // This rank still takes part, failing, so the others learn why
    // instead of waiting for it; the placeholder is never written.
    FileSystemWriter placeholder(options.checkpoint_id);
    return SaveStateDictOrFail(
        state_dict, placeholder, at_writer,
        local_failure.ok() ? writer.status() : local_failure, turn);
  }
  return SaveStateDictOrFail(state_dict, **writer, at_writer, local_failure,
                             turn);
}

}  // namespace

absl::StatusOr<Metadata> SaveStateDict(const StateDict& state_dict,
                                       StorageWriter& storage_writer,
                                       SaveOptions options) {
  return SaveStateDictOrFail(state_dict, storage_writer, std::move(options),
                             absl::OkStatus(), /*turn=*/nullptr);
}

absl::StatusOr<Metadata> Save(const StateDict& state_dict,
                              const SaveOptions& options) {
  return SaveOrFail(state_dict, options, absl::OkStatus(), /*turn=*/nullptr);
}

namespace internal {

absl::Status JoinSaveWithFailure(const SaveOptions& options,
                                 absl::Status failure, GroupTurn* turn) {
  if (failure.ok()) {
    failure = absl::InternalError("JoinSaveWithFailure without a failure");
  }
  return SaveOrFail(StateDict{}, options, failure, turn).status();
}

GroupTurn TakeTurn(const SaveOptions& options) {
  return GroupTurn::Take(GroupFor(options.process_group, options.no_dist));
}

absl::StatusOr<Metadata> SaveInTurn(const StateDict& state_dict,
                                    const SaveOptions& options,
                                    GroupTurn& turn) {
  return SaveOrFail(state_dict, options, absl::OkStatus(), &turn);
}

}  // namespace internal

namespace {

// LoadStateDict; `location` names the checkpoint in errors; a
// `local_failure` (not OK) fails this rank's part in the shared setup.
absl::Status LoadStateDictAt(StateDict& state_dict,
                             StorageReader& storage_reader,
                             const LoadOptions& options,
                             absl::string_view location,
                             const absl::Status& local_failure) {
  internal::GroupTurn turn = internal::GroupTurn::Take(
      GroupFor(options.process_group, options.no_dist));
  turn.Wait();
  std::unique_ptr<DefaultLoadPlanner> default_planner;
  LoadPlanner* planner = options.planner;
  if (planner == nullptr) {
    default_planner = std::make_unique<DefaultLoadPlanner>();
    planner = default_planner.get();
  }
  internal::DistWrapper dist(GroupFor(options.process_group, options.no_dist),
                             options.coordinator_rank);
  if (options.coordinator_rank < 0 || options.coordinator_rank >= dist.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("coordinator_rank ", options.coordinator_rank,
                     " is outside the ", dist.size(), "-rank group"));
  }
  // Preparing the reader is this rank's own step: with several ranks its
  // outcome is shared, so a rank whose reader fails here fails every rank
  // (naming it) instead of leaving the others waiting in the plan exchange.
  absl::Status prepared = !local_failure.ok() ? local_failure
                          : options.checkpoint_id.empty()
                              ? absl::OkStatus()
                              : storage_reader.Reset(options.checkpoint_id);
  if (prepared.ok()) {
    absl::StatusOr<DeviceWait> wait =
        DeviceWaitForLoad(state_dict, options.device_wait);
    prepared = wait.ok() ? storage_reader.SetDeviceWait(*wait) : wait.status();
  }
  absl::StatusOr<bool> detected =
      prepared.ok() ? storage_reader.DetectRankLocal(dist.rank())
                    : absl::StatusOr<bool>(prepared);
  if (dist.size() > 1) {
    DCP_RETURN_IF_ERROR(
        ShareOutcome(*GroupFor(options.process_group, options.no_dist),
                     "load setup", detected.status()));
  }
  DCP_RETURN_IF_ERROR(detected.status());
  // Every rank gets the same answer (the contract of DetectRankLocal), so
  // all take the same path below.
  const bool rank_local = *detected;
  if (!rank_local) {
    return LoadWithCoordination(state_dict, storage_reader, *planner, dist,
                                options.metadata);
  }
  if (dist.size() == 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        location.empty() ? "the location" : std::string(location),
        " holds rank-local checkpoints (saved with use_collectives=false): "
        "load them on the rank count that saved them, each rank its own"));
  }
  // Rank-local: each rank loads its own checkpoint, alone, once the ranks
  // have checked that their checkpoints come from one save; only the
  // outcome is shared.
  comm::ProcessGroup& group = *GroupFor(options.process_group, options.no_dist);
  absl::StatusOr<Metadata> metadata = storage_reader.ReadMetadata();
  absl::StatusOr<std::vector<std::string>> described =
      group.AllGather(DescribeRankLocal(metadata));
  if (!described.ok()) {
    return Annotate(described.status(),
                    absl::StrCat("rank-local load on rank ", group.rank(),
                                 ": comparing the ranks' checkpoints"));
  }
  DCP_RETURN_IF_ERROR(CheckRankLocalSet(
      *described, location.empty() ? "the reader's location" : location));
  internal::DistWrapper alone(nullptr, 0);
  absl::Status status = metadata.ok()
                            ? LoadWithCoordination(state_dict, storage_reader,
                                                   *planner, alone, &*metadata)
                            : metadata.status();
  return ShareOutcome(group, "rank-local load", status);
}

}  // namespace

absl::Status LoadStateDict(StateDict& state_dict, StorageReader& storage_reader,
                           LoadOptions options) {
  return LoadStateDictAt(state_dict, storage_reader, options,
                         options.checkpoint_id, options.local_failure);
}

absl::Status Load(StateDict& state_dict, const LoadOptions& options) {
  if (options.storage_reader != nullptr) {
    return LoadStateDict(state_dict, *options.storage_reader, options);
  }
  if (options.checkpoint_id.empty()) {
    return absl::InvalidArgumentError(
        "Load needs a checkpoint_id (a directory) or a storage_reader");
  }
  // The storage the id names, or the one whose checkpoint the directory
  // holds (io/storage_registry.h). The backend's factory took the id.
  absl::StatusOr<std::unique_ptr<StorageReader>> reader =
      StorageRegistry::Default().CreateReader(options.checkpoint_id);
  LoadOptions at_reader = options;
  at_reader.checkpoint_id.clear();
  if (!reader.ok()) {
    // This rank still takes part in the shared setup, failing, so the
    // others learn why instead of waiting for it.
    FileSystemReader placeholder(options.checkpoint_id);
    return LoadStateDictAt(
        state_dict, placeholder, at_reader, options.checkpoint_id,
        options.local_failure.ok() ? reader.status() : options.local_failure);
  }
  return LoadStateDictAt(state_dict, **reader, at_reader, options.checkpoint_id,
                         options.local_failure);
}

}  // namespace dcp
