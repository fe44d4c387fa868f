// The public save/load API of dcp (the seed's save, load, save_state_dict,
// load_state_dict). Python keyword arguments become option structs; errors
// are absl::Status. A multi-rank failure is a CheckpointException Status
// (core/checkpoint_exception.h) on every rank.
//
// Thread safety: Save, Load and their *StateDict forms block the calling
// thread until every rank is done. One save or load per StorageWriter/Reader
// and planner at a time; independent saves may run concurrently on
// different instances. SetDefaultProcessGroup/DefaultProcessGroup may be
// called from any thread (an atomic pointer).
//
// Errors (docs/ARCHITECTURE.md, "Errors", has the whole table):
// kInvalidArgument for bad input (shapes, dtypes, overlapping chunks, an
// unknown checkpoint_id scheme, options that contradict); kNotFound when
// there is no committed checkpoint to load or a key is missing (unless the
// load planner allows a partial load); kAlreadyExists when the writer may
// not overwrite (FileSystemWriterOptions::overwrite) and a checkpoint is
// there; kFailedPrecondition when another save holds the directory or the
// location is ambiguous; kPermissionDenied, kResourceExhausted (disk full)
// and kDataLoss (checksum mismatch, truncated or unparsable files) from the
// storage; kUnavailable and kDeadlineExceeded when a peer is lost or a
// collective times out; kUnimplemented for a device wait the storage or
// stager cannot honour. A failure on any rank is a CheckpointException on
// every rank.
#ifndef DCP_ENGINE_CHECKPOINT_H_
#define DCP_ENGINE_CHECKPOINT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/state_dict.h"
#include "engine/internal/group_turns.h"
#include "io/storage.h"
#include "planner/metadata.h"
#include "planner/planner.h"

namespace dcp {

namespace comm {
class ProcessGroup;
}  // namespace comm

// The group Save/Load use when the options name none (the seed's
// default process group: "dist.is_initialized()"). Not owned; must outlive
// every Save/Load that uses it. nullptr (the initial value) means
// single-process. Use a group of its own for checkpointing, never the
// training loop's (see comm/process_group.h).
void SetDefaultProcessGroup(comm::ProcessGroup* group);
comm::ProcessGroup* DefaultProcessGroup();

struct SaveOptions {
  // Where to save: without a `storage_writer`, the storage the id names
  // (io/storage_registry.h: a directory saves natively, mega://DIR as MEGA;
  // an unknown scheme is kInvalidArgument listing the known ones). With a
  // `storage_writer`, a non-empty checkpoint_id points it there
  // (StorageWriter::Reset(checkpoint_id), as the seed does); empty keeps the
  // writer's own location.
  std::string checkpoint_id;
  // Not owned; default: the registry's writer for checkpoint_id.
  StorageWriter* storage_writer = nullptr;
  // Not owned; default: a DefaultSavePlanner.
  SavePlanner* planner = nullptr;
  // Not owned; default: DefaultProcessGroup(), else single-process.
  comm::ProcessGroup* process_group = nullptr;
  int coordinator_rank = 0;
  // Save without any collective (every rank writes its own checkpoint).
  bool no_dist = false;
  // false: no plan exchange; each rank saves an independent checkpoint of
  // its own (StorageWriter::SelectRankLocal; FileSystemWriter: in
  // checkpoint_id/rank-R, docs/FORMAT.md) and the ranks only share the
  // outcome. The writer's own location is left as it was, so it can serve
  // the next save. Load finds such a checkpoint by itself
  // (StorageReader::DetectRankLocal); it loads on the same rank count only
  // (each rank reads its own rank-R). With one rank, false saves as true
  // does.
  bool use_collectives = true;
  // The stream rule for device tensors: dcp copies them on its own copy
  // streams, which know nothing of the caller's. A Save or AsyncSave issued
  // right after the kernels that write those tensors must name the
  // caller's stream (or an event recorded after those kernels) here
  // (DeviceWait::Stream / ::Event, core/device.h; on CUDA the native
  // cudaStream_t or cudaEvent_t, e.g. torch.cuda.current_stream()
  // .cuda_stream): no device copy then starts before that work is done.
  // The copy streams wait on the device: AsyncSave with a DefaultStager
  // marks the stream when it is called and returns without waiting (work
  // enqueued afterwards is neither waited for nor copied); a synchronous
  // Save returns once its copies are done, hence after that work, and
  // marks the stream when its copies start (do not enqueue work on it from
  // other threads meanwhile). Empty: the caller has synchronized. A storage
  // writer or stager that cannot order its copies fails with
  // kUnimplemented instead of copying too early.
  DeviceWait device_wait;
};

struct LoadOptions {
  // What to load: without a `storage_reader`, the storage the id names or
  // whose checkpoint the directory holds (io/storage_registry.h: dcp
  // metadata, a MEGA index, Hugging Face files; else the native reader).
  // With a `storage_reader`, a non-empty checkpoint_id points it there
  // (StorageReader::Reset(checkpoint_id)); empty keeps its own location.
  std::string checkpoint_id;
  StorageReader* storage_reader = nullptr;      // Not owned.
  LoadPlanner* planner = nullptr;               // Not owned.
  comm::ProcessGroup* process_group = nullptr;  // Not owned.
  int coordinator_rank = 0;
  bool no_dist = false;
  // The stream rule for a load into device tensors: the caller's stream (or
  // an event recorded after its work) whose work so far must finish before
  // dcp writes the tensors (kernels still reading them, an allocator's
  // fill). The reader's copy streams wait for it on the device
  // (StorageReader::SetDeviceWait); the host never blocks for it. Load
  // returns once the bytes are on the device, so work enqueued afterwards
  // on any stream sees them. Every device tensor must be on `device`
  // (kInvalidArgument naming it); ignored when the state dict holds no
  // device tensor. A reader that cannot order its copies fails the load
  // with kUnimplemented. Empty: the caller has synchronized.
  DeviceWait device_wait;
  // The checkpoint's committed metadata when the caller read it already
  // (the reader's ReadMetadata at the same location, or ReadMetadataFile):
  // the load plans against it instead of reading it again. Not owned; it
  // must outlive the call and be the metadata of the checkpoint loaded
  // (dcp's own name data files of their save, so another one's fails the
  // load with kDataLoss, "data file ... is missing"; Hugging Face files
  // would be read at the other
  // one's offsets). Ignored where the location holds rank-local checkpoints
  // (each rank reads its own).
  const Metadata* metadata = nullptr;
  // A failure this rank found before the load (a check of its own state
  // dict): the rank still takes part in the load's shared setup, failing
  // there, so that every rank fails naming it instead of the others
  // waiting for it (or pairing with its next collective). OK: none.
  absl::Status local_failure;
};

// Saves `state_dict` and returns the committed metadata. On failure nothing
// is committed, what this save wrote is removed, and a previous checkpoint
// at the same location is untouched.
absl::StatusOr<Metadata> Save(const StateDict& state_dict,
                              const SaveOptions& options);

// Loads a checkpoint into `state_dict` in place: tensors are filled in their
// own memory (resharded as needed), plain values replaced. On failure the
// Status says what and where; tensors may hold partial data. A location that
// holds both a checkpoint of all ranks and rank-local ones (use_collectives)
// is kFailedPrecondition naming both; rank-local ones on a single rank are
// kFailedPrecondition too. With several ranks, a rank whose reader fails
// before planning (Reset, SetDeviceWait, DetectRankLocal) fails the load on
// every rank with a CheckpointException naming it.
absl::Status Load(StateDict& state_dict, const LoadOptions& options);

// The seed's save_state_dict / load_state_dict: explicit storage.
// SaveStateDict resets the writer first (a fresh save id; the location is
// options.checkpoint_id when given, else the writer's own), so one writer
// can serve consecutive saves. LoadStateDict resets the reader to
// options.checkpoint_id when given.
absl::StatusOr<Metadata> SaveStateDict(const StateDict& state_dict,
                                       StorageWriter& storage_writer,
                                       SaveOptions options = {});
absl::Status LoadStateDict(StateDict& state_dict, StorageReader& storage_reader,
                           LoadOptions options = {});

// Every rank of `group` calls it with the outcome of its own work before a
// save or load that the engine does not see (a binding's walk of the state
// dict): OK when every rank passed OK, else, on every rank, the
// CheckpointException Status of the failed ranks (`what` names the step:
// "save"). Runs in its turn with the group's saves and loads, after the
// operations this process submitted before (an async_save's upload). Null
// group: `local` alone.
absl::Status AgreeInTurn(comm::ProcessGroup* group, absl::string_view what,
                         const absl::Status& local);

namespace internal {

// Save(options) for a rank whose part failed before it could save (its
// async staging): it joins the save's coordinated steps with `failure` as
// its local failure, so every rank fails with a CheckpointException naming
// it (instead of waiting for this rank, or meeting its next save), and
// returns that. Nothing is written. `failure` must not be OK.
// `turn`: as SaveInTurn's (null: taken now).
absl::Status JoinSaveWithFailure(const SaveOptions& options,
                                 absl::Status failure,
                                 GroupTurn* turn = nullptr);

// The turn on the group a Save with `options` uses
// (engine/internal/group_turns.h), for a save submitted now that runs
// later (AsyncSave's upload).
GroupTurn TakeTurn(const SaveOptions& options);

// Save(options), once `turn` (from TakeTurn with the same options) comes.
absl::StatusOr<Metadata> SaveInTurn(const StateDict& state_dict,
                                    const SaveOptions& options,
                                    GroupTurn& turn);

}  // namespace internal
}  // namespace dcp

#endif  // DCP_ENGINE_CHECKPOINT_H_
