#include "engine/checkpoint.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "io/file_system_storage.h"
#include "planner/default_planner.h"

namespace dcp {
namespace {

// The seed's _save_state_dict for one process: plan, write, commit; abort
// the writer on any failure so nothing half-written stays behind.
absl::StatusOr<Metadata> SaveSingleProcess(const StateDict& state_dict,
                                           StorageWriter& writer,
                                           SavePlanner& planner) {
  auto run = [&]() -> absl::StatusOr<Metadata> {
    DCP_RETURN_IF_ERROR(
        planner.SetUp(state_dict, writer.GetStorageMeta(), true));
    DCP_RETURN_IF_ERROR(writer.SetUp(true, 0, true));
    DCP_ASSIGN_OR_RETURN(SavePlan local_plan, planner.CreateLocalPlan());
    DCP_ASSIGN_OR_RETURN(local_plan,
                         writer.PrepareLocalPlan(std::move(local_plan)));
    std::vector<SavePlan> plans;
    plans.push_back(std::move(local_plan));
    DCP_ASSIGN_OR_RETURN(auto global, planner.CreateGlobalPlan(std::move(plans)));
    Metadata metadata = std::move(global.second);
    DCP_ASSIGN_OR_RETURN(plans, writer.PrepareGlobalPlan(std::move(global.first)));
    DCP_ASSIGN_OR_RETURN(SavePlan final_plan,
                         planner.FinishPlan(std::move(plans.at(0))));
    absl::StatusOr<std::vector<WriteResult>> results =
        writer.WriteData(final_plan, planner).Wait();
    if (!results.ok()) return results.status();
    std::vector<std::vector<WriteResult>> all_results;
    all_results.push_back(*std::move(results));
    DCP_RETURN_IF_ERROR(writer.Finish(metadata, all_results));
    DCP_RETURN_IF_ERROR(writer.MarkCommitted());
    return metadata;
  };
  absl::StatusOr<Metadata> metadata = run();
  if (!metadata.ok()) writer.Abort();
  return metadata;
}

absl::Status LoadSingleProcess(StateDict& state_dict, StorageReader& reader,
                               LoadPlanner& planner) {
  DCP_ASSIGN_OR_RETURN(Metadata metadata, reader.ReadMetadata());
  DCP_RETURN_IF_ERROR(planner.SetUp(&state_dict, metadata, true));
  DCP_RETURN_IF_ERROR(reader.SetUp(metadata, true));
  DCP_ASSIGN_OR_RETURN(LoadPlan local_plan, planner.CreateLocalPlan());
  DCP_ASSIGN_OR_RETURN(local_plan,
                       reader.PrepareLocalPlan(std::move(local_plan)));
  std::vector<LoadPlan> plans;
  plans.push_back(std::move(local_plan));
  DCP_ASSIGN_OR_RETURN(plans, planner.CreateGlobalPlan(std::move(plans)));
  DCP_ASSIGN_OR_RETURN(plans, reader.PrepareGlobalPlan(std::move(plans)));
  DCP_ASSIGN_OR_RETURN(LoadPlan final_plan,
                       planner.FinishPlan(std::move(plans.at(0))));
  return reader.ReadData(final_plan, planner).Wait();
}

}  // namespace

absl::StatusOr<Metadata> SaveStateDict(const StateDict& state_dict,
                                       StorageWriter& storage_writer,
                                       SaveOptions options) {
  std::unique_ptr<DefaultSavePlanner> default_planner;
  SavePlanner* planner = options.planner;
  if (planner == nullptr) {
    default_planner = std::make_unique<DefaultSavePlanner>();
    planner = default_planner.get();
  }
  return SaveSingleProcess(state_dict, storage_writer, *planner);
}

absl::StatusOr<Metadata> Save(const StateDict& state_dict,
                              const SaveOptions& options) {
  if (options.storage_writer != nullptr) {
    return SaveStateDict(state_dict, *options.storage_writer, options);
  }
  if (options.checkpoint_id.empty()) {
    return absl::InvalidArgumentError(
        "Save needs a checkpoint_id (a directory) or a storage_writer");
  }
  FileSystemWriter writer(options.checkpoint_id);
  DCP_RETURN_IF_ERROR(writer.Reset(options.checkpoint_id));
  return SaveStateDict(state_dict, writer, options);
}

absl::Status LoadStateDict(StateDict& state_dict,
                           StorageReader& storage_reader,
                           LoadOptions options) {
  std::unique_ptr<DefaultLoadPlanner> default_planner;
  LoadPlanner* planner = options.planner;
  if (planner == nullptr) {
    default_planner = std::make_unique<DefaultLoadPlanner>();
    planner = default_planner.get();
  }
  return LoadSingleProcess(state_dict, storage_reader, *planner);
}

absl::Status Load(StateDict& state_dict, const LoadOptions& options) {
  if (options.storage_reader != nullptr) {
    return LoadStateDict(state_dict, *options.storage_reader, options);
  }
  if (options.checkpoint_id.empty()) {
    return absl::InvalidArgumentError(
        "Load needs a checkpoint_id (a directory) or a storage_reader");
  }
  FileSystemReader reader(options.checkpoint_id);
  DCP_RETURN_IF_ERROR(reader.Reset(options.checkpoint_id));
  return LoadStateDict(state_dict, reader, options);
}

}  // namespace dcp
