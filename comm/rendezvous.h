// Rendezvous: where this process sits in the job (rank, world size, local
// rank) and where the ranks meet (a shared directory or a redis server),
// read from the environment that launchers set.
//
// Rank and world size, first complete pair wins:
//   DCP_RANK / DCP_WORLD_SIZE                  (dcp_launch)
//   RANK / WORLD_SIZE                          (torchrun)
//   SLURM_PROCID / SLURM_NTASKS                (srun)
//   OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE (Open MPI's mpirun)
// Local rank: LOCAL_RANK, SLURM_LOCALID or OMPI_COMM_WORLD_LOCAL_RANK.
// Meeting point: DCP_RENDEZVOUS, a directory every rank can reach (Gloo's
// FileStore) or redis://host[:port] (Gloo's RedisStore). Required when the
// world has more than one rank.
// Address this rank listens on for collectives: DCP_COMM_ADDR (default
// 127.0.0.1, enough for ranks on one machine), or, when DCP_COMM_ADDR is
// unset, the first address of the network interface named by
// DCP_SOCKET_IFNAME or Gloo's GLOO_SOCKET_IFNAME.
// Job identity (keeps the rendezvous keys of different jobs sharing one
// store apart), first set wins: DCP_JOB_ID (dcp launch sets it),
// SLURM_JOB_ID with SLURM_STEP_ID, TORCHELASTIC_RUN_ID (torchrun; its
// default "none" with MASTER_ADDR:MASTER_PORT, which tell jobs apart),
// OMPI_MCA_ess_base_jobid (Open MPI). None set: "" (jobs then rely on the
// keys being removed once each group has formed).
#ifndef DCP_COMM_RENDEZVOUS_H_
#define DCP_COMM_RENDEZVOUS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace dcp::comm {

// A parsed DCP_RENDEZVOUS value.
struct StoreAddress {
  enum class Kind { kFile, kRedis };
  Kind kind = Kind::kFile;
  std::string path;  // kFile: the shared directory.
  std::string host;  // kRedis.
  int port = 6379;   // kRedis.

  std::string ToString() const;
};

// Parses "redis://host[:port]" or a directory path (anything else that is
// not empty). kInvalidArgument names what is wrong (empty, bad port, other
// scheme).
absl::StatusOr<StoreAddress> ParseStoreAddress(absl::string_view address);

struct RendezvousInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = -1;      // -1 when no launcher said.
  std::string rank_source;  // e.g. "DCP_RANK/DCP_WORLD_SIZE"; "" if none.
  std::optional<StoreAddress> store;  // Absent only for world_size == 1.
  std::string listen_address = "127.0.0.1";
  // Interface to listen on instead of listen_address; "" for none.
  std::string listen_interface;
  std::string job_id;  // "" when the environment names no job.
};

// Who joins which group, and where: what the Gloo and NCCL backends share.
struct GroupMembership {
  int rank = 0;
  int world_size = 1;
  // Where the ranks meet (unused for a world of one).
  StoreAddress store;
  // Keys of this group live under "<group_name>/<instance>/" in the store,
  // <instance> counting the groups of that name this process made before.
  std::string group_name = "dcp-checkpoint";
  // The job this group belongs to (RendezvousInfo::job_id). When not empty,
  // keys live under "<group_name>/job-<job_id>/<instance>/" instead, so
  // jobs sharing a store never read each other's keys.
  std::string job_id;
  // Default per-call timeout.
  absl::Duration timeout = absl::Minutes(5);
  // How long joining waits for every rank.
  absl::Duration connect_timeout = absl::Minutes(5);
  // The largest payload a rank accepts from a peer, in bytes; 0 means this
  // machine's physical memory. A peer announcing more is taken for a
  // corrupt stream (kDataLoss) before anything is allocated for it. NCCL
  // groups, whose ranks all learn every size, also bound the total a rank
  // holds at once (a gather's root, an all-gather) and fail on every rank.
  uint64_t max_payload_bytes = 0;
};

// Looks up one environment variable; nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;

// The process environment (getenv).
EnvLookup ProcessEnvironment();

// A fixed set of variables (for tests, or for a caller that passes the
// rendezvous explicitly instead of through the process environment).
EnvLookup MapEnvironment(std::map<std::string, std::string> vars);

// The job identity described above, read through `env`; "" when none is
// set. Ids from launchers are prefixed by their source ("slurm-", "torch-",
// "ompi-"); DCP_JOB_ID is taken as is.
std::string JobIdFromEnvironment(const EnvLookup& env = ProcessEnvironment());

// Reads the variables above through `env`. With no rank variables at all,
// returns a single-rank world (rank 0 of 1, no store). kInvalidArgument when
// a pair is half set, a value is not an integer, the rank is outside
// [0, world size), or world size > 1 without DCP_RENDEZVOUS; the message
// names the variables involved and what to set.
absl::StatusOr<RendezvousInfo> RendezvousFromEnvironment(
    const EnvLookup& env = ProcessEnvironment());

}  // namespace dcp::comm

#endif  // DCP_COMM_RENDEZVOUS_H_
