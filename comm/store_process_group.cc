#include "comm/store_process_group.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <deque>
#include <optional>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/status.h"

namespace dcp::comm {
namespace {

// A run of this many broadcasts from one root, with no call between them
// that tells the root about every rank, ends with an acknowledged one.
constexpr int kBroadcastsPerAck = 16;

// How often rank 0 looks again at the join keys of ranks that have not
// confirmed (a stale nonce is answered within one interval): from the
// first to the last value, doubling while nothing changes.
constexpr absl::Duration kFirstPoll = absl::Milliseconds(10);
constexpr absl::Duration kLastPoll = absl::Milliseconds(500);
// How much longer than rank 0 the other ranks wait for its verdict on the
// join (several of its polls).
constexpr absl::Duration kReadyReportGrace = absl::Seconds(2);

// How long rank 0, whose joining failed, waits for the ranks it welcomed
// to say they left before it removes the creation's keys. A live rank says
// so within a poll interval; this bounds only the wait for one that died.
constexpr absl::Duration kDepartureWait = absl::Seconds(10);

absl::Duration Remaining(absl::Time deadline) {
  return std::max(deadline - absl::Now(), absl::ZeroDuration());
}

// 16 hex digits from the kernel's random source: generations and nonces.
absl::StatusOr<std::string> RandomId() {
  uint64_t bits = 0;
  ssize_t got;
  do {
    got = getrandom(&bits, sizeof(bits), 0);
  } while (got < 0 && errno == EINTR);
  if (got != static_cast<ssize_t>(sizeof(bits))) {
    return ErrnoError(got < 0 ? errno : EIO,
                      "getrandom for a store process group id");
  }
  return absl::StrFormat("%016x", bits);
}

// "<id> <size>", the value of join and welcome keys.
std::string IdAndSize(absl::string_view id, int size) {
  return absl::StrCat(id, " ", size);
}

bool ParseIdAndSize(absl::string_view value, std::string* id, int* size) {
  std::vector<absl::string_view> parts = absl::StrSplit(value, ' ');
  if (parts.size() != 2 || parts[0].empty()) return false;
  *id = std::string(parts[0]);
  return absl::SimpleAtoi(parts[1], size);
}

std::string RankList(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ",
                      absl::StrJoin(ranks, ", "));
}

bool IsDeadline(const absl::Status& status) {
  return status.code() == absl::StatusCode::kDeadlineExceeded;
}

// A failed store operation in `what` (e.g. "gather on rank 2"). Codes that
// break a group pass through; others become kAborted (see the header).
absl::Status StoreError(absl::string_view what, absl::string_view verb,
                        absl::string_view key, const absl::Status& status) {
  const std::string context =
      absl::StrFormat("%s: store %s of key \"%s\" failed", what, verb, key);
  if (BreaksGroup(status)) return Annotate(status, context);
  return absl::AbortedError(absl::StrCat(context, ": ", status.ToString()));
}

// The store operations of one group (or of one creation), with errors that
// say who was doing what. `what` prefixes every message.
class StoreClient {
 public:
  // `can_remove`: false once the store said it cannot remove keys.
  StoreClient(KeyValueStore& store, std::string what, bool can_remove = true)
      : store_(store), what_(std::move(what)), can_remove_(can_remove) {}

  const std::string& what() const { return what_; }
  void set_what(std::string what) { what_ = std::move(what); }

  absl::Status Set(const std::string& key, absl::string_view value) {
    absl::Status s = store_.Set(key, value);
    return s.ok() ? s : StoreError(what_, "set", key, s);
  }

  // The value of `key`, waiting until `deadline`; nullopt when the key is
  // not there by then.
  absl::StatusOr<std::optional<std::string>> Get(const std::string& key,
                                                 absl::Time deadline) {
    return GetFor(key, Remaining(deadline));
  }
  absl::StatusOr<std::optional<std::string>> GetFor(const std::string& key,
                                                    absl::Duration timeout) {
    absl::StatusOr<std::string> value = store_.Get(key, timeout);
    if (value.ok()) return std::optional<std::string>(*std::move(value));
    if (IsDeadline(value.status())) return std::optional<std::string>();
    return StoreError(what_, "get", key, value.status());
  }

  // Removes `key` unless the store cannot remove keys.
  absl::Status Remove(const std::string& key) {
    if (!can_remove_) return absl::OkStatus();
    absl::Status s = store_.Remove(key);
    if (s.ok() || s.code() == absl::StatusCode::kNotFound) {
      return absl::OkStatus();
    }
    if (s.code() == absl::StatusCode::kUnimplemented) {
      can_remove_ = false;
      return absl::OkStatus();
    }
    return StoreError(what_, "remove", key, s);
  }
  bool can_remove() const { return can_remove_; }

 private:
  KeyValueStore& store_;
  std::string what_;
  bool can_remove_;
};

// Keys of one generation of one group.
class KeyScheme {
 public:
  KeyScheme(absl::string_view group, absl::string_view generation)
      : prefix_(absl::StrCat(group, "/", generation, "/")) {}

  std::string Key(int64_t call, absl::string_view op, int rank) const {
    return absl::StrCat(prefix_, call, "/", op, "/", rank);
  }

 private:
  std::string prefix_;
};

std::string JoinKey(absl::string_view group, int rank) {
  return absl::StrCat(group, "/join/", rank);
}
std::string WelcomeKey(absl::string_view group, absl::string_view nonce) {
  return absl::StrCat(group, "/welcome/", nonce);
}

// Rank 0's side of joining: draws the generation, welcomes every rank,
// waits for each to confirm, then sets the ready key (or, on failure, a
// record of it). Returns the generation.
absl::StatusOr<std::string> AdmitRanks(StoreClient& client,
                                       const std::string& group, int size,
                                       absl::Time deadline) {
  DCP_ASSIGN_OR_RETURN(const std::string generation, RandomId());
  const KeyScheme keys(group, generation);
  const std::string welcome_value = IdAndSize(generation, size);

  struct Peer {
    std::optional<std::string> nonce;  // The nonce welcomed last.
    bool joined = false;
  };
  std::vector<Peer> peers(size);
  int waiting = size - 1;
  absl::Duration poll = kFirstPoll;
  absl::Status failure;
  while (waiting > 0) {
    bool progress = false;
    std::string wait_key;
    for (int r = 1; r < size && failure.ok(); ++r) {
      Peer& peer = peers[r];
      if (peer.joined) continue;
      const std::string joined_key = keys.Key(0, "joined", r);
      if (peer.nonce.has_value()) {
        absl::StatusOr<std::optional<std::string>> joined =
            client.GetFor(joined_key, absl::ZeroDuration());
        if (!joined.ok()) {
          failure = joined.status();
          break;
        }
        if (joined->has_value()) {
          peer.joined = true;
          --waiting;
          progress = true;
          failure = client.Remove(joined_key);
          continue;
        }
      }
      // A nonce not welcomed yet: the rank's first, or a fresh one replacing
      // a stale key that an earlier group left.
      const std::string join_key = JoinKey(group, r);
      absl::StatusOr<std::optional<std::string>> join =
          client.GetFor(join_key, absl::ZeroDuration());
      if (!join.ok()) {
        failure = join.status();
        break;
      }
      std::string nonce;
      int their_size = 0;
      if (join->has_value() && ParseIdAndSize(**join, &nonce, &their_size) &&
          nonce != peer.nonce) {
        if (peer.nonce.has_value()) {
          failure = client.Remove(WelcomeKey(group, *peer.nonce));
          if (!failure.ok()) break;
        }
        failure = client.Set(WelcomeKey(group, nonce), welcome_value);
        peer.nonce = nonce;
        progress = true;
        // Welcomed all the same, so that rank learns the size and fails
        // too; rank 0 fails now instead of waiting for ranks that may
        // never come.
        if (failure.ok() && their_size != size) {
          failure = absl::InvalidArgumentError(absl::StrFormat(
              "%s: rank %d was given %d ranks for store process group "
              "\"%s\"; this rank was given %d",
              client.what(), r, their_size, group, size));
          break;
        }
      }
      // Wait on a key seen missing just now, so the wait is a real one.
      if (wait_key.empty()) {
        wait_key = !join->has_value() && !peer.nonce.has_value() ? join_key
                                                                 : joined_key;
      }
    }
    if (!failure.ok() || waiting == 0) break;
    if (absl::Now() >= deadline) {
      std::vector<int> missing;
      for (int r = 1; r < size; ++r) {
        if (!peers[r].joined) missing.push_back(r);
      }
      failure = absl::DeadlineExceededError(absl::StrFormat(
          "%s: timed out waiting for %s to join store process group \"%s\" "
          "(%d ranks)",
          client.what(), RankList(missing), group, size));
      break;
    }
    poll = progress ? kFirstPoll : std::min(2 * poll, kLastPoll);
    absl::StatusOr<std::optional<std::string>> woken =
        client.GetFor(wait_key, std::min(poll, Remaining(deadline)));
    if (!woken.ok()) failure = woken.status();
  }
  // The ready key tells the other ranks how joining ended. When the store
  // itself failed it may not get there; they then time out on rank 0.
  const absl::Status told =
      client.Set(keys.Key(0, "ready", 0), EncodeStatus(failure));
  if (!failure.ok()) {
    // The ranks welcomed may still read the record just written (and a
    // welcome); each says when it is done (JoinGroup's "left" key). Then
    // nothing of this creation is read again: its keys go, so a store
    // that outlives many failed attempts does not fill with them.
    const absl::Time until = absl::Now() + kDepartureWait;
    for (int r = 1; r < size; ++r) {
      if (!peers[r].nonce.has_value()) continue;
      if (!client.Get(keys.Key(0, "left", r), until).ok()) break;
    }
    for (int r = 1; r < size; ++r) {
      if (peers[r].nonce.has_value()) {
        client.Remove(WelcomeKey(group, *peers[r].nonce)).IgnoreError();
      }
      client.Remove(keys.Key(0, "joined", r)).IgnoreError();
      client.Remove(keys.Key(0, "left", r)).IgnoreError();
    }
    client.Remove(keys.Key(0, "ready", 0)).IgnoreError();
    return failure;
  }
  if (!told.ok()) return told;
  return generation;
}

// The value of `key`; kDeadlineExceeded, saying this rank was waiting for
// `whom` to set it, when it is not set by `deadline`.
absl::StatusOr<std::string> Await(StoreClient& client, absl::string_view group,
                                  const std::string& key, absl::Time deadline,
                                  absl::string_view whom) {
  DCP_ASSIGN_OR_RETURN(std::optional<std::string> value,
                       client.Get(key, deadline));
  if (value.has_value()) return *std::move(value);
  return absl::DeadlineExceededError(absl::StrFormat(
      "%s: timed out waiting for %s in store process group \"%s\" (key "
      "\"%s\" not set)",
      client.what(), whom, group, key));
}

// The side of rank `rank` > 0: announces a nonce, learns the generation
// from rank 0's welcome, confirms, and waits until rank 0 says every rank
// joined. Returns the generation.
// `*generation` is set once rank 0's welcome has been read.
absl::StatusOr<std::string> JoinWithNonce(StoreClient& client,
                                          const std::string& group, int rank,
                                          int size, absl::Time deadline,
                                          const std::string& nonce,
                                          std::string* generation_read) {
  const std::string join_key = JoinKey(group, rank);
  const std::string welcome_key = WelcomeKey(group, nonce);
  DCP_RETURN_IF_ERROR(client.Set(join_key, IdAndSize(nonce, size)));
  DCP_ASSIGN_OR_RETURN(
      const std::string welcome,
      Await(client, group, welcome_key, deadline, "rank 0 to admit this rank"));
  std::string generation;
  int root_size = 0;
  if (!ParseIdAndSize(welcome, &generation, &root_size)) {
    return absl::DataLossError(
        absl::StrFormat("%s: key \"%s\" holds \"%s\", not \"<generation> "
                        "<size>\"",
                        client.what(), welcome_key, absl::CHexEscape(welcome)));
  }
  *generation_read = generation;
  // Rank 0 has read both keys: nobody reads them again.
  DCP_RETURN_IF_ERROR(client.Remove(welcome_key));
  DCP_RETURN_IF_ERROR(client.Remove(join_key));
  if (root_size != size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: rank 0 created store process group \"%s\" with %d ranks; this "
        "rank was given %d",
        client.what(), group, root_size, size));
  }
  const KeyScheme keys(group, generation);
  DCP_RETURN_IF_ERROR(client.Set(keys.Key(0, "joined", rank), ""));
  const std::string ready_key = keys.Key(0, "ready", 0);
  // Rank 0 gives up at the same deadline and then says which ranks never
  // joined: waiting a few of its polls longer reads that report instead of
  // blaming rank 0.
  DCP_ASSIGN_OR_RETURN(
      const std::string ready,
      Await(client, group, ready_key, deadline + kReadyReportGrace,
            "rank 0 to see every rank join"));
  absl::Status outcome;
  if (absl::Status s = DecodeStatus(ready, &outcome); !s.ok()) {
    return Annotate(s, absl::StrCat(client.what(), ": key ", ready_key));
  }
  if (!outcome.ok()) {
    return absl::Status(
        outcome.code(),
        absl::StrCat(client.what(), ": rank 0 gave up: ", outcome.message()));
  }
  return generation;
}

absl::StatusOr<std::string> JoinGroup(StoreClient& client,
                                      const std::string& group, int rank,
                                      int size, absl::Time deadline) {
  DCP_ASSIGN_OR_RETURN(const std::string nonce, RandomId());
  std::string generation;
  absl::StatusOr<std::string> joined =
      JoinWithNonce(client, group, rank, size, deadline, nonce, &generation);
  if (!joined.ok()) {
    // Best effort: the keys this rank set, and the welcome meant for it,
    // go; once it knows the generation, it tells rank 0 it left (AdmitRanks
    // waits for that before it removes the rest).
    client.Remove(JoinKey(group, rank)).IgnoreError();
    client.Remove(WelcomeKey(group, nonce)).IgnoreError();
    if (!generation.empty()) {
      const KeyScheme keys(group, generation);
      client.Remove(keys.Key(0, "joined", rank)).IgnoreError();
      client.Set(keys.Key(0, "left", rank), "").IgnoreError();
    }
  }
  return joined;
}

class StoreProcessGroup final : public ProcessGroup {
 public:
  StoreProcessGroup(std::shared_ptr<KeyValueStore> store, int rank, int size,
                    const StoreProcessGroupOptions& options,
                    const std::string& generation, bool can_remove)
      : ProcessGroup(rank, size, options.timeout),
        store_(std::move(store)),
        client_(*store_, "", can_remove),
        keys_(options.group_name, generation),
        done_(size, 0),
        unacked_broadcasts_(size, 0) {
    if (size > 1 && rank == 0) Written(0, keys_.Key(0, "ready", 0));
  }

  absl::string_view backend() const override { return "store"; }

 protected:
  absl::StatusOr<std::vector<std::string>> DoGather(
      absl::string_view payload, int root, absl::Time deadline) override {
    const int64_t call = Begin("gather");
    if (size() == 1) return std::vector<std::string>{std::string(payload)};
    unacked_broadcasts_[root] = 0;
    if (rank() != root) {
      DCP_RETURN_IF_ERROR(
          client_.Set(keys_.Key(call, "gather", rank()), payload));
      DCP_RETURN_IF_ERROR(Sweep());
      return std::vector<std::string>{};
    }
    std::vector<std::string> all;
    DCP_RETURN_IF_ERROR(ReadAll(call, "gather", deadline, &all));
    all[rank()] = std::string(payload);
    for (int r = 0; r < size(); ++r) {
      if (r == rank()) continue;
      DCP_RETURN_IF_ERROR(client_.Remove(keys_.Key(call, "gather", r)));
    }
    DCP_RETURN_IF_ERROR(Sweep());
    return all;
  }

  absl::StatusOr<std::string> DoScatter(absl::Span<const std::string> payloads,
                                        int root,
                                        absl::Time deadline) override {
    const int64_t call = Begin("scatter");
    if (size() == 1) return payloads[0];
    if (rank() == root) {
      for (int r = 0; r < size(); ++r) {
        if (r == root) continue;
        DCP_RETURN_IF_ERROR(
            client_.Set(keys_.Key(call, "scatter", r), payloads[r]));
      }
      DCP_RETURN_IF_ERROR(Sweep());
      return payloads[root];
    }
    const std::string key = keys_.Key(call, "scatter", rank());
    DCP_ASSIGN_OR_RETURN(std::string mine, ReadFrom(call, root, key, deadline));
    DCP_RETURN_IF_ERROR(client_.Remove(key));
    DCP_RETURN_IF_ERROR(Sweep());
    return mine;
  }

  absl::StatusOr<std::string> DoBroadcast(absl::string_view payload, int root,
                                          absl::Time deadline) override {
    const int64_t call = Begin("broadcast");
    if (size() == 1) return std::string(payload);
    const bool acknowledged = ++unacked_broadcasts_[root] == kBroadcastsPerAck;
    if (acknowledged) unacked_broadcasts_[root] = 0;
    const std::string key = keys_.Key(call, "broadcast", root);
    if (rank() == root) {
      DCP_RETURN_IF_ERROR(client_.Set(key, payload));
      Written(call, key);
      if (acknowledged) {
        std::vector<std::string> acks;
        DCP_RETURN_IF_ERROR(ReadAll(call, "ack", deadline, &acks));
        // Every rank read this call's payload: it and all before it go.
        for (int r = 0; r < size(); ++r) {
          if (r == rank()) continue;
          done_[r] = std::max(done_[r], call + 1);
          DCP_RETURN_IF_ERROR(client_.Remove(keys_.Key(call, "ack", r)));
        }
      }
      DCP_RETURN_IF_ERROR(Sweep());
      return std::string(payload);
    }
    DCP_ASSIGN_OR_RETURN(std::string value,
                         ReadFrom(call, root, key, deadline));
    if (acknowledged) {
      DCP_RETURN_IF_ERROR(client_.Set(keys_.Key(call, "ack", rank()), ""));
    }
    DCP_RETURN_IF_ERROR(Sweep());
    return value;
  }

  absl::StatusOr<std::vector<std::string>> DoAllGather(
      absl::string_view payload, absl::Time deadline) override {
    const int64_t call = Begin("allgather");
    if (size() == 1) return std::vector<std::string>{std::string(payload)};
    std::vector<std::string> all;
    DCP_RETURN_IF_ERROR(Exchange(call, "allgather", payload, deadline, &all));
    all[rank()] = std::string(payload);
    return all;
  }

  absl::Status DoBarrier(absl::Time deadline) override {
    const int64_t call = Begin("barrier");
    if (size() == 1) return absl::OkStatus();
    std::vector<std::string> ignored;
    return Exchange(call, "barrier", "", deadline, &ignored);
  }

 private:
  // Numbers the next call and names it in errors.
  int64_t Begin(absl::string_view op) {
    client_.set_what(absl::StrCat(op, " on rank ", rank()));
    return next_call_++;
  }

  // Every rank writes `payload` and reads every other rank's.
  absl::Status Exchange(int64_t call, absl::string_view op,
                        absl::string_view payload, absl::Time deadline,
                        std::vector<std::string>* all) {
    const std::string key = keys_.Key(call, op, rank());
    DCP_RETURN_IF_ERROR(client_.Set(key, payload));
    Written(call, key);
    DCP_RETURN_IF_ERROR(ReadAll(call, op, deadline, all));
    std::fill(unacked_broadcasts_.begin(), unacked_broadcasts_.end(), 0);
    return Sweep();
  }

  // The value of `key`, written by `writer` in call `call`.
  absl::StatusOr<std::string> ReadFrom(int64_t call, int writer,
                                       const std::string& key,
                                       absl::Time deadline) {
    DCP_ASSIGN_OR_RETURN(std::optional<std::string> value,
                         client_.Get(key, deadline));
    if (!value.has_value()) return Missing({writer}, key);
    done_[writer] = std::max(done_[writer], call);
    return *std::move(value);
  }

  // Reads the keys (call, op, r) of every rank r but this one into
  // (*all)[r], waiting in rank order.
  absl::Status ReadAll(int64_t call, absl::string_view op, absl::Time deadline,
                       std::vector<std::string>* all) {
    all->assign(size(), std::string());
    for (int r = 0; r < size(); ++r) {
      if (r == rank()) continue;
      const std::string key = keys_.Key(call, op, r);
      DCP_ASSIGN_OR_RETURN(std::optional<std::string> value,
                           client_.Get(key, deadline));
      if (!value.has_value()) {
        // Name every rank still missing, not only the first.
        std::vector<int> missing = {r};
        for (int later = r + 1; later < size(); ++later) {
          if (later == rank()) continue;
          DCP_ASSIGN_OR_RETURN(
              std::optional<std::string> probe,
              client_.GetFor(keys_.Key(call, op, later), absl::ZeroDuration()));
          if (!probe.has_value()) missing.push_back(later);
        }
        return Missing(missing, key);
      }
      (*all)[r] = *std::move(value);
      done_[r] = std::max(done_[r], call);
    }
    return absl::OkStatus();
  }

  absl::Status Missing(const std::vector<int>& ranks,
                       const std::string& first_key) const {
    return absl::DeadlineExceededError(absl::StrFormat(
        "%s: timed out waiting for %s (key \"%s\" not set by the deadline)",
        client_.what(), RankList(ranks), first_key));
  }

  // Remembers a key that other ranks read, to remove once they are done.
  void Written(int64_t call, std::string key) {
    if (client_.can_remove()) pending_.push_back({call, std::move(key)});
  }

  // Removes the keys this rank wrote that every other rank is done with.
  absl::Status Sweep() {
    int64_t all_done = INT64_MAX;
    for (int r = 0; r < size(); ++r) {
      if (r != rank()) all_done = std::min(all_done, done_[r]);
    }
    while (!pending_.empty() && pending_.front().call < all_done) {
      DCP_RETURN_IF_ERROR(client_.Remove(pending_.front().key));
      pending_.pop_front();
    }
    if (!client_.can_remove()) pending_.clear();
    return absl::OkStatus();
  }

  struct Pending {
    int64_t call;
    std::string key;
  };

  const std::shared_ptr<KeyValueStore> store_;
  // The fields below are used by one call at a time (the base class
  // serializes calls), hence need no lock.
  StoreClient client_;
  const KeyScheme keys_;
  int64_t next_call_ = 1;  // 0 was joining.
  // done_[r]: rank r has finished reading in every call before done_[r].
  std::vector<int64_t> done_;
  // Keys this rank wrote for several readers, oldest call first.
  std::deque<Pending> pending_;
  // Per root: broadcasts since the root last heard from every rank. The
  // same on every rank: it follows the sequence of calls only.
  std::vector<int> unacked_broadcasts_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ProcessGroup>> CreateStoreProcessGroup(
    std::shared_ptr<KeyValueStore> store, int rank, int size,
    const StoreProcessGroupOptions& options) {
  if (store == nullptr) {
    return absl::InvalidArgumentError("store process group: null store");
  }
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "store process group: rank %d out of range for %d ranks", rank, size));
  }
  if (options.group_name.empty()) {
    return absl::InvalidArgumentError("store process group: empty group name");
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "store process group: timeout ", absl::FormatDuration(options.timeout),
        " is not positive"));
  }
  std::string generation;
  bool can_remove = true;
  if (size > 1) {
    const absl::Time deadline = absl::Now() + options.timeout;
    StoreClient client(*store, absl::StrCat("join on rank ", rank));
    DCP_ASSIGN_OR_RETURN(
        generation,
        rank == 0
            ? AdmitRanks(client, options.group_name, size, deadline)
            : JoinGroup(client, options.group_name, rank, size, deadline));
    can_remove = client.can_remove();
  }
  return std::unique_ptr<ProcessGroup>(new StoreProcessGroup(
      std::move(store), rank, size, options, generation, can_remove));
}

absl::StatusOr<std::string> JoinGeneration(KeyValueStore& store,
                                           const std::string& group_name,
                                           int rank, int size,
                                           absl::Time deadline) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("join of \"%s\": rank %d out of range for %d ranks",
                        group_name, rank, size));
  }
  StoreClient client(store, absl::StrCat("join on rank ", rank));
  return rank == 0 ? AdmitRanks(client, group_name, size, deadline)
                   : JoinGroup(client, group_name, rank, size, deadline);
}

absl::Status ForgetGeneration(KeyValueStore& store,
                              const std::string& group_name,
                              const std::string& generation) {
  StoreClient client(store, "forgetting a joined generation");
  return client.Remove(KeyScheme(group_name, generation).Key(0, "ready", 0));
}

void LeaveFailedGeneration(KeyValueStore& store, const std::string& group_name,
                           const std::string& generation, int rank, int size,
                           const std::vector<std::string>& keys) {
  StoreClient client(store,
                     absl::StrCat("leaving a failed group on rank ", rank));
  const KeyScheme scheme(group_name, generation);
  if (!client.Set(scheme.Key(0, "left", rank), "").ok()) return;
  // Each rank sets its key before it looks, so the last one sees them all.
  for (int r = 0; r < size; ++r) {
    absl::StatusOr<std::optional<std::string>> left =
        client.GetFor(scheme.Key(0, "left", r), absl::ZeroDuration());
    if (!left.ok() || !left->has_value()) return;
  }
  for (const std::string& key : keys) client.Remove(key).IgnoreError();
  client.Remove(scheme.Key(0, "ready", 0)).IgnoreError();
  for (int r = 0; r < size; ++r) {
    client.Remove(scheme.Key(0, "left", r)).IgnoreError();
  }
}

absl::Status InMemoryKeyValueStore::Set(const std::string& key,
                                        absl::string_view value) {
  absl::MutexLock lock(&mu_);
  values_[key] = std::string(value);
  key_set_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<std::string> InMemoryKeyValueStore::Get(const std::string& key,
                                                       absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  while (true) {
    if (auto it = values_.find(key); it != values_.end()) return it->second;
    if (key_set_.WaitWithDeadline(&mu_, deadline)) {  // Timed out.
      if (auto it = values_.find(key); it != values_.end()) return it->second;
      return absl::DeadlineExceededError(
          absl::StrFormat("in-memory store: key \"%s\" not set within %s", key,
                          absl::FormatDuration(timeout)));
    }
  }
}

absl::Status InMemoryKeyValueStore::Remove(const std::string& key) {
  absl::MutexLock lock(&mu_);
  values_.erase(key);
  return absl::OkStatus();
}

size_t InMemoryKeyValueStore::KeyCount() const {
  absl::MutexLock lock(&mu_);
  return values_.size();
}

std::vector<std::string> InMemoryKeyValueStore::Keys() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> keys;
  keys.reserve(values_.size());
  for (const auto& [key, value] : values_) keys.push_back(key);
  return keys;
}

std::shared_ptr<KeyValueStore> MakeInMemoryStore() {
  return std::make_shared<InMemoryKeyValueStore>();
}

}  // namespace dcp::comm
