// The StorageWriter and StorageReader contracts of the seed: the storage
// layer turns final plans into bytes on some medium and back. The engine
// drives a writer as
//
//   Reset(checkpoint_id) -> [SelectRankLocal(rank)] ->
//   SetUp(is_coordinator, rank, use_collectives) ->
//   PrepareLocalPlan -> (coordinator) PrepareGlobalPlan -> WriteData ->
//   (coordinator) Finish(metadata, all ranks' results) -> MarkCommitted
//   or, on any failure, Abort()
//
// and a reader as
//
//   Reset(checkpoint_id) -> SetDeviceWait -> DetectRankLocal(rank) ->
//   ReadMetadata -> SetUp -> PrepareLocalPlan -> (coordinator)
//   PrepareGlobalPlan -> ReadData
//
// Thread safety: not thread-safe. One instance serves one save or load at a
// time and its methods are called in the order above from one thread (the
// engine's); WriteData/ReadData may complete their futures on I/O threads.
//
// Errors: every method returns the cause's code (docs/ARCHITECTURE.md,
// "Errors"): kInvalidArgument for a checkpoint_id or plan the storage cannot
// use, kNotFound/kAlreadyExists/kPermissionDenied/kFailedPrecondition for
// the location, kResourceExhausted (disk full) and kDataLoss (EIO, checksum
// mismatch, truncated or unparsable files) for the medium. After any error
// of a writer the engine calls Abort.
#ifndef DCP_IO_STORAGE_H_
#define DCP_IO_STORAGE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/future.h"
#include "planner/metadata.h"
#include "planner/plan.h"
#include "planner/planner.h"

namespace dcp {

class StorageWriter {
 public:
  virtual ~StorageWriter() = default;

  // Starts a new save: points the writer at `checkpoint_id` (empty keeps its
  // current location), draws a fresh save id and clears every per-save
  // state: a lock an earlier SetUp took is released, a rank-local selection
  // and a device wait end. Writes no data. kInvalidArgument for an id this
  // storage cannot name (e.g. a wrong scheme).
  virtual absl::Status Reset(const std::string& checkpoint_id) = 0;

  // Describes this save (checkpoint id, a fresh save id).
  virtual StorageMeta GetStorageMeta() const = 0;

  // Makes the next save rank-local (SaveOptions::use_collectives=false on
  // more than one rank): this rank saves an independent checkpoint of its
  // own, which it commits as its own coordinator, kept apart from the other
  // ranks' below the writer's location. Called after Reset and before
  // SetUp; the next Reset ends it. The location the writer was given stays
  // as it was. Writers without a rank-local layout fail with kUnimplemented
  // (the default).
  virtual absl::Status SelectRankLocal(int /*rank*/) {
    return absl::UnimplementedError(
        "this storage writer has no rank-local layout "
        "(SaveOptions::use_collectives=false)");
  }

  // Called on every rank before planning, after Reset. Fails early when the
  // location cannot be written: kPermissionDenied, kAlreadyExists with
  // overwrite off, kFailedPrecondition when another save holds the location
  // (a writer that locks it, as FileSystemWriter's coordinator does, takes
  // the lock here and keeps it until MarkCommitted or Abort).
  virtual absl::Status SetUp(bool is_coordinator, int rank,
                             bool use_collectives) = 0;

  // Every rank: may annotate this rank's local plan (storage_data) before it
  // is sent to the coordinator. Returns the plan to send; an error fails
  // the save on every rank.
  virtual absl::StatusOr<SavePlan> PrepareLocalPlan(SavePlan plan) = 0;

  // Coordinator only: given every rank's local plan (in rank order), returns
  // one final plan per rank with its file names assigned (storage_data). An
  // error fails the save on every rank.
  virtual absl::StatusOr<std::vector<SavePlan>> PrepareGlobalPlan(
      std::vector<SavePlan> plans) = 0;

  // The caller's device work the next WriteData must let finish before it
  // copies any device tensor (SaveOptions::device_wait). Cleared by Reset.
  // Writers that cannot order their device copies fail a non-empty wait
  // with kUnimplemented (the default) rather than copy too early.
  virtual absl::Status SetDeviceWait(const DeviceWait& wait) {
    if (wait.empty()) return absl::OkStatus();
    return absl::UnimplementedError(
        "this storage writer cannot order its device copies after the "
        "caller's stream (SaveOptions::device_wait)");
  }

  // Writes every item of `plan`, pulling data from `planner.ResolveData`.
  // The future resolves with one WriteResult per item once all data is
  // durable (fsynced when sync_files is on), or with the first error (code
  // by cause: kResourceExhausted for ENOSPC, kDataLoss for EIO; the message
  // names operation, file and offset). `planner` outlives the future.
  virtual Future<std::vector<WriteResult>> WriteData(const SavePlan& plan,
                                                     SavePlanner& planner) = 0;

  // Coordinator only: records `results` (all ranks') into the metadata and
  // commits it atomically. The checkpoint exists once this returns OK.
  virtual absl::Status Finish(
      const Metadata& metadata,
      const std::vector<std::vector<WriteResult>>& results) = 0;

  // Sets on `metadata` what this writer records in the committed metadata
  // beyond the plan and the results (the checksum block size its data
  // uses, its storage_meta), so that the metadata Save returns, and the one
  // the coordinator sends the other ranks, is the one committed. Called on
  // the coordinator before Finish. Default: nothing.
  virtual void DescribeCommit(Metadata& /*metadata*/) const {}

  // Coordinator, after Finish failed: whether the commit had been decided
  // when it failed (the location now holds the new checkpoint, or the next
  // save's SetUp completes it), so that no rank may remove what it wrote.
  // The engine then calls MarkCommitted on the other ranks and Abort here,
  // and every rank reports the failure. False (the default) for a Finish
  // that commits all or nothing.
  virtual bool CommitDecided() const { return false; }

  // Every rank, after the commit: removes what the new checkpoint replaced.
  // On a rank other than the coordinator: keeps what this save wrote (it is
  // the checkpoint's now).
  virtual absl::Status MarkCommitted() = 0;

  // After a failure: removes what this save wrote; never touches a
  // committed checkpoint. Safe to call at any point, more than once.
  virtual void Abort() = 0;
};

class StorageReader {
 public:
  virtual ~StorageReader() = default;

  // Starts a new load: points the reader at `checkpoint_id` (empty keeps its
  // current location). Reads nothing. kInvalidArgument for an id this
  // storage cannot name.
  virtual absl::Status Reset(const std::string& checkpoint_id) = 0;

  // Called by every rank of a load after Reset, before ReadMetadata. True
  // when the location holds rank-local checkpoints (saved with
  // SaveOptions::use_collectives=false): the reader then reads rank
  // `rank`'s. False for a checkpoint saved by all ranks together, or none.
  // The answer must not depend on `rank`, so that every rank of a load
  // takes the same path. kFailedPrecondition, naming both, when the
  // location holds both layouts. Readers without a rank-local layout
  // return false (the default).
  virtual absl::StatusOr<bool> DetectRankLocal(int /*rank*/) { return false; }

  // The caller's device work the next ReadData must let finish before it
  // writes any device tensor (LoadOptions::device_wait; the engine passes
  // an empty wait when the state dict has no device tensor). Readers that
  // cannot order their device copies fail a non-empty wait with
  // kUnimplemented (the default) rather than write too early.
  virtual absl::Status SetDeviceWait(const DeviceWait& wait) {
    if (wait.empty()) return absl::OkStatus();
    return absl::UnimplementedError(
        "this storage reader cannot order its device copies after the "
        "caller's stream (LoadOptions::device_wait)");
  }

  // kNotFound when the location holds no committed checkpoint; kDataLoss
  // when the metadata does not parse.
  virtual absl::StatusOr<Metadata> ReadMetadata() = 0;

  // Every rank, after ReadMetadata: the metadata this load reads by (the
  // same on every rank). An error (e.g. an I/O engine that could not be
  // created) fails the load on every rank.
  virtual absl::Status SetUp(const Metadata& metadata, bool is_coordinator) = 0;

  // Every rank: may annotate this rank's local load plan before it is sent
  // to the coordinator. Returns the plan to send.
  virtual absl::StatusOr<LoadPlan> PrepareLocalPlan(LoadPlan plan) = 0;

  // Coordinator only: given every rank's local plan (in rank order), returns
  // one final plan per rank. An error fails the load on every rank.
  virtual absl::StatusOr<std::vector<LoadPlan>> PrepareGlobalPlan(
      std::vector<LoadPlan> plans) = 0;

  // Reads every item of `plan`, verifies checksums, and hands data to
  // `planner` (LoadBytes, or ResolveTensor + copy + CommitTensor). Resolves
  // OK only when every item was delivered; kDataLoss naming tensor, file and
  // offset on a checksum mismatch or a truncated file.
  virtual Future<void> ReadData(const LoadPlan& plan, LoadPlanner& planner) = 0;
};

}  // namespace dcp

#endif  // DCP_IO_STORAGE_H_
