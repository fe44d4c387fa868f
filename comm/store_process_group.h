// A ProcessGroup whose ranks meet only through a shared key-value store: no
// sockets of its own, no Gloo, no shared directory. Made for jobs that
// already run a store, such as a PyTorch job under torchrun, whose TCPStore
// reaches dcp through a C callback store (capi/). Every byte of every
// collective travels through the store, so it suits coordination payloads
// (plans, metadata, statuses), not bulk data.
//
// Keys (all under "<group_name>/"):
//   join/<rank>                      rank -> 0: "<nonce> <size>" (joining)
//   welcome/<nonce>                  0 -> rank: "<generation> <size>"
//   <generation>/0/joined/<rank>     rank -> 0: joined
//   <generation>/0/ready/0           0 -> all: how joining ended (OK, or
//                                    why it failed; EncodeStatus)
//   <generation>/<call>/<op>/<rank>  the payload `rank` wrote in collective
//                                    number <call> (1, 2, ...), <op> one of
//                                    gather, scatter, broadcast, ack,
//                                    allgather, barrier
// <generation> is a random 64-bit id (16 hex digits) that rank 0 draws when
// the group is created, and <nonce> one that each other rank draws, so no
// collective ever reads a key of an earlier group, even one that crashed,
// or one made by an earlier job with the same name on the same store.
//
//   <generation>/0/left/<rank>       rank -> all: done with a creation
//                                    that failed (see "Failed creations")
// Joining: rank r sets join/<r> and waits for welcome/<its nonce>, which
// only this creation's rank 0 can write (it learns the nonce by reading
// join/<r>). join/<r> is the one key an earlier group may have left
// behind, so rank 0 answers whatever nonce it finds there and keeps
// checking the key until rank r confirms under the new generation: a stale
// nonce is replaced by the fresh one rank r sets, and answered then (a
// delay of a poll interval, at most 0.5 s). Creating a group of the same
// name again, after or while the first lives, is therefore correct; the
// ranks create the groups of one name one at a time, in the same order.
// Two jobs must not create groups of one name on one store at the same
// time.
//
// Failed creations remove their keys (best effort), so a store that
// outlives many failed attempts (torchrun's TCPStore, a shared directory)
// does not fill with them. A rank other than 0 whose joining failed removes
// its join key, the welcome for its nonce and its joined key, and, once it
// knew the generation, sets left/<rank>. Rank 0, whose joining failed,
// leaves the record of why in the ready key, waits (at most 10 s, for a
// rank that died) until every rank it welcomed has set left/<rank>, then
// removes the ready, welcome, joined and left keys. A failure after joining
// (in the backends that connect by themselves) ends with
// LeaveFailedGeneration below.
//
// Key removal (so a long job's store stays small; a store whose Remove is
// kUnimplemented keeps every key and the group works the same):
// - A key with one reader (a gather payload, read by the root; a scatter
//   payload, read by its rank; join, welcome and joined keys) is removed by
//   that reader once read.
// - A key with many readers (a broadcast payload; all-gather, barrier and
//   ready keys) is removed by its writer once every reader has finished the
//   call that wrote it. A rank knows that rank x has, once it reads a key x
//   wrote in a later call (ranks run calls in order). All-gather and
//   barrier read every rank, and so does the root of a gather; scatter and
//   broadcast tell the other ranks about the root.
// - Every 16th broadcast from one root since the last all-gather, barrier
//   or gather to that root is acknowledged: the other ranks set an ack key
//   after reading it and the root waits for the acks, so a run of
//   broadcasts keeps at most 16 payloads of its root in the store.
// Removal happens at the end of the call that learns it is safe. What a
// group leaves in the store when destroyed is what its peers may still be
// reading: its last all-gather or barrier key per rank and up to 15
// broadcasts per root (a Save leaves one broadcast of its coordinator, which
// the next Save's gather removes). These keys carry the group's generation
// and are never read again.
//
// Costs per call (store operations): gather, scatter and broadcast n-1 sets
// or gets through the root; all-gather and barrier n sets and n*(n-1) gets
// in all. A call waits for the keys it needs in rank order; when its
// deadline passes it returns kDeadlineExceeded naming the operation and
// every rank whose key is still missing.
//
// Errors: a store error keeps its code where the base class counts it as
// breaking the group (kUnavailable, kDeadlineExceeded, kInternal, kAborted,
// kDataLoss); any other becomes kAborted naming the original code, since
// after a failed store operation the ranks no longer agree on where the
// sequence stands. The message names the call, the rank and the key.
#ifndef DCP_COMM_STORE_PROCESS_GROUP_H_
#define DCP_COMM_STORE_PROCESS_GROUP_H_

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "comm/process_group.h"

namespace dcp::comm {

// A store shared by every rank of a job (torch's TCPStore, redis, or the
// in-memory one below). Implementations are thread-safe: a store may serve
// several groups and threads at once. Keys and values are arbitrary bytes;
// values may be empty.
class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;

  // Sets `key` to `value`, replacing any earlier value.
  virtual absl::Status Set(const std::string& key, absl::string_view value) = 0;

  // Waits up to `timeout` for `key` to exist and returns its value:
  // kDeadlineExceeded when it does not appear in time. A timeout of zero
  // (or less) checks once without waiting.
  virtual absl::StatusOr<std::string> Get(const std::string& key,
                                          absl::Duration timeout) = 0;

  // Removes `key`; OK whether or not it existed (kNotFound is taken as OK
  // too). kUnimplemented is allowed: keys are then left.
  virtual absl::Status Remove(const std::string& key) = 0;
};

struct StoreProcessGroupOptions {
  // Keys live under "<group_name>/". Not empty.
  std::string group_name = "dcp-checkpoint";
  // Bounds creation (every rank must join within it) and is the default
  // per-call timeout. Positive.
  absl::Duration timeout = absl::Minutes(5);
};

// Joins the group `options.group_name` on `store` as `rank` of `size` and
// returns it (backend() "store"). Blocks until every rank has joined:
// kDeadlineExceeded after `options.timeout`, naming the ranks that did not
// join (rank 0 names them; other ranks get rank 0's record of it, or name
// rank 0 when it did not come). kInvalidArgument for a null store, a rank
// outside [0, size), an empty name, a timeout that is not positive, or a
// size that differs from rank 0's. Store errors as above. A group of one
// rank touches no store. Shares `store` with the group for its
// lifetime. Thread-safe; the ranks create groups of one name in the same
// order.
absl::StatusOr<std::unique_ptr<ProcessGroup>> CreateStoreProcessGroup(
    std::shared_ptr<KeyValueStore> store, int rank, int size,
    const StoreProcessGroupOptions& options);

// Joining alone, for backends that meet through a store and then connect
// by themselves (Gloo's mesh, NCCL's unique id): the ranks agree on a fresh
// generation under "<group_name>/" by the joining protocol above and each
// gets it back. Keys an earlier or crashed job of the same name left are
// never taken for this job's: they carry another generation, and a stale
// join/<rank> is replaced as described. kDeadlineExceeded naming the ranks
// that did not join by `deadline`; kInvalidArgument for a rank outside
// [0, size) or a size that differs from rank 0's; store errors as above.
// Leaves one key, the generation's ready key: once every rank has read it
// (every rank has passed a barrier after joining), rank 0 removes it with
// ForgetGeneration. Call it on every rank with size > 1.
absl::StatusOr<std::string> JoinGeneration(KeyValueStore& store,
                                           const std::string& group_name,
                                           int rank, int size,
                                           absl::Time deadline);

// Removes the key JoinGeneration leaves for `generation` (rank 0, once
// every rank has read it). OK when the store cannot remove keys.
absl::Status ForgetGeneration(KeyValueStore& store,
                              const std::string& group_name,
                              const std::string& generation);

// For a creation that failed after JoinGeneration returned `generation`
// (Gloo's mesh, NCCL's communicator did not form): rank `rank` is done
// with every key of the generation and says so under
// "<group_name>/<generation>/0/left/<rank>"; the last of the `size` ranks
// to say so removes `keys` (full keys of every rank: addresses, abort
// records), the generation's ready key and the departure keys. Call it on
// every rank whose creation failed, after it has read all it will read.
// Best effort: keys stay when the store fails or cannot remove keys, or
// when a rank died before calling it.
void LeaveFailedGeneration(KeyValueStore& store, const std::string& group_name,
                           const std::string& generation, int rank, int size,
                           const std::vector<std::string>& keys);

// An in-memory KeyValueStore for tests and single-process use: every rank
// of a group runs in one process (threads) and holds the same instance.
// Thread-safe; Get waits on a condition variable (no polling).
class InMemoryKeyValueStore final : public KeyValueStore {
 public:
  absl::Status Set(const std::string& key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override;
  absl::Status Remove(const std::string& key) override;

  // How many keys the store holds now.
  size_t KeyCount() const;
  // The keys it holds now, sorted.
  std::vector<std::string> Keys() const;

 private:
  mutable absl::Mutex mu_;
  absl::CondVar key_set_;  // Signalled on every Set.
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

// A new, empty InMemoryKeyValueStore.
std::shared_ptr<KeyValueStore> MakeInMemoryStore();

}  // namespace dcp::comm

#endif  // DCP_COMM_STORE_PROCESS_GROUP_H_
