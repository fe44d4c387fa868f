// GlooProcessGroup: the ProcessGroup over Gloo (libgloo-dev) on its tcp
// transport, for CPU jobs and for coordination next to GPU jobs. Gloo types
// stay out of this header.
//
// Isolation from the training loop: each GlooProcessGroup owns its own Gloo
// context (its own tcp device, loop thread and full mesh of sockets) and
// meets its peers under its own store prefix "<group_name>/<instance>",
// where <instance> counts the groups of that name this process created
// before. Nothing is shared with a training loop's process group (a
// PyTorch or Gloo group the application made), so a save running on a
// background thread cannot interleave with, or wait behind, the loop's
// collectives. Ranks must create their groups in the same order (as with
// any process group library).
//
// Payloads of any size travel as Gloo point-to-point messages on unbound
// buffers: first a 24-byte header (the collective's name, its root, the
// payload size; a rank in another collective gets kDataLoss saying so),
// then the bytes, on slots derived from a
// per-group call counter. Waiting per peer is what lets an error name the
// rank that was lost or late. Costs per call: gather and scatter move n-1
// messages through the root, broadcast n-1 from the root, all-gather and
// barrier n-1 per rank (full mesh; fine for coordination payloads, not for
// bulk data).
//
// Errors: a peer whose socket closed gives kUnavailable ("... lost
// connection to rank K ..."); a deadline gives kDeadlineExceeded ("...
// waiting for ... rank K ..."). Either breaks the group (see
// process_group.h). A rank that fails writes an abort record (its Status)
// under "<prefix>/abort/<rank>" in the store and closes its sockets, so
// ranks blocked on it fail at once, and with its reason: when rank 1 dies
// during a gather to rank 0, ranks 2 and 3 waiting on rank 0 report
// "rank 0 gave up first: gather on rank 0 ...: lost connection to rank 1",
// with rank 0's code, instead of timing out on rank 0. A rank that dies
// without a record costs its peers up to 250 ms of looking for one.
//
// Naming the lost ranks: each rank keeps a listening socket beside its Gloo
// pairs (comm/internal/peer_probe.h) and learns its peers' when the group
// forms. A rank whose collective fails first connects to every peer's, for
// at most a quarter of the group timeout (100 ms to 2 s), and appends
// "lost as seen from rank R: rank K at HOST (unreachable: ...)" or "(...
// its process is gone)" for every peer that does not answer, so after a
// link cut every surviving rank names the ranks behind it, whichever rank
// it was waiting for. A peer found unreachable is not asked for its abort
// record (it may still reach the store, and its record would call this
// rank's side lost).
//
// Joining: a peer whose advertised address does not answer fails Create
// with "no connection with rank K at HOST:PORT (the address it
// advertised) within the connect timeout of T" (kUnavailable when refused,
// kDeadlineExceeded when nothing answered in time).
//
// Reusing a rendezvous: groups meet under "<group_name>/job-<job_id>/
// <instance>" when the membership names a job (see rendezvous.h), so
// concurrent jobs sharing a store never meet each other's keys. Under it
// the ranks first agree on a fresh random generation (JoinGeneration in
// store_process_group.h: rank 0 draws it and hands it to each rank) and
// Gloo's mesh keys live under ".../<instance>/<generation>". Keys a crashed
// job with the same job id left (addresses, join state, abort records)
// belong to another generation and are never read, so the restarted job
// forms a fresh mesh. Once the mesh is up the ranks pass a barrier and each
// removes its own address keys, and rank 0 the generation's ready key, so
// a job that formed leaves only abort records of a failed group behind.
// A creation that fails removes what it wrote (best effort): joining's
// keys as store_process_group.h says; after joining, each rank its address
// keys, and the last rank to fail every rank's address keys, abort and
// waiting records and the ready key (LeaveFailedGeneration). Only a rank
// that dies mid-creation leaves keys of that attempt behind.
#ifndef DCP_COMM_GLOO_PROCESS_GROUP_H_
#define DCP_COMM_GLOO_PROCESS_GROUP_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/process_group.h"
#include "comm/rendezvous.h"

namespace dcp::comm {

struct GlooOptions : GroupMembership {
  // Address of this rank's tcp listener; peers connect to it.
  std::string listen_address = "127.0.0.1";
  // When not empty, listen on this network interface's address instead.
  std::string listen_interface;
};

class GlooProcessGroup final : public ProcessGroup {
 public:
  // Joins the group: publishes this rank's address in the store and
  // connects to every other rank. Blocks until all `world_size` ranks have
  // joined or `connect_timeout` passes (kDeadlineExceeded). kInvalidArgument
  // for bad rank/size or an unusable store directory; kUnavailable when the
  // redis server cannot be reached or a connection fails.
  // The first call in a process sets SIGPIPE to ignored when it has its
  // default action (a write to a lost rank would otherwise kill this one);
  // a handler or disposition the program set is left alone.
  static absl::StatusOr<std::unique_ptr<GlooProcessGroup>> Create(
      const GlooOptions& options);

  ~GlooProcessGroup() override;

  absl::string_view backend() const override { return "gloo"; }

 protected:
  absl::StatusOr<std::vector<std::string>> DoGather(
      absl::string_view payload, int root, absl::Time deadline) override;
  absl::StatusOr<std::string> DoScatter(absl::Span<const std::string> payloads,
                                        int root, absl::Time deadline) override;
  absl::StatusOr<std::string> DoBroadcast(absl::string_view payload, int root,
                                          absl::Time deadline) override;
  absl::StatusOr<std::vector<std::string>> DoAllGather(
      absl::string_view payload, absl::Time deadline) override;
  absl::Status DoBarrier(absl::Time deadline) override;

 private:
  class Impl;
  GlooProcessGroup(int rank, int size, absl::Duration timeout,
                   std::unique_ptr<Impl> impl);
  // `root` sends per_rank[r] to each rank r (only root's `per_rank` is
  // read); returns this rank's payload.
  absl::StatusOr<std::string> FromRoot(
      absl::string_view op, int root,
      const std::vector<absl::string_view>& per_rank, absl::Time deadline);
  // Every rank sends `payload` to every other rank; returns all payloads
  // indexed by rank.
  absl::StatusOr<std::vector<std::string>> AllToAll(absl::string_view op,
                                                    absl::string_view payload,
                                                    absl::Time deadline);

  std::unique_ptr<Impl> impl_;
};

}  // namespace dcp::comm

#endif  // DCP_COMM_GLOO_PROCESS_GROUP_H_
