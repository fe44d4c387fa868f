// Helpers around Gloo's rendezvous stores shared by the Gloo and NCCL
// process groups: opening a store from a StoreAddress, bounding waits by a
// deadline, and numbering groups of one name. Internal to comm/.
#ifndef DCP_COMM_INTERNAL_GLOO_STORE_H_
#define DCP_COMM_INTERNAL_GLOO_STORE_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "comm/rendezvous.h"
#include "comm/store_process_group.h"
#include "gloo/rendezvous/store.h"

namespace dcp::comm::internal {

using Millis = std::chrono::milliseconds;

// Time left until `deadline`, at least 1 ms so Gloo reports a timeout
// instead of treating 0 as "no timeout".
Millis Remaining(absl::Time deadline);

// The rank a rendezvous key belongs to: Gloo names its keys by rank
// ("3", "rank_3", "3/1"); -1 when the key does not say.
int RankOfKey(absl::string_view key);

// A Store that bounds every wait by one deadline and remembers the keys it
// waited for last, so a rendezvous timeout can name the missing ranks.
// (Gloo's own get() waits a fixed 30 s whatever the context's timeout.)
class DeadlineStore final : public gloo::rendezvous::Store {
 public:
  DeadlineStore(gloo::rendezvous::Store& inner, absl::Time deadline)
      : inner_(inner), deadline_(deadline) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    inner_.set(key, data);
  }
  std::vector<char> get(const std::string& key) override {
    wait({key});
    std::vector<char> value = inner_.get(key);
    last_key_ = key;
    last_value_ = value;
    return value;
  }
  void wait(const std::vector<std::string>& keys) override {
    waiting_for_ = keys;
    last_key_.clear();
    inner_.wait(keys, Remaining(deadline_));
  }
  void wait(const std::vector<std::string>& keys, const Millis&) override {
    wait(keys);
  }

  // The key and value of the last get, when no wait began after it: what
  // Gloo was acting on when it failed (a peer's address it connects to).
  // Empty key otherwise.
  const std::string& last_key() const { return last_key_; }
  const std::vector<char>& last_value() const { return last_value_; }

  // The ranks of the keys of the last wait; empty if none could be told.
  std::vector<int> WaitingForRanks() const {
    std::vector<int> ranks;
    for (const std::string& key : waiting_for_) {
      if (int rank = RankOfKey(key); rank >= 0) ranks.push_back(rank);
    }
    return ranks;
  }

 private:
  gloo::rendezvous::Store& inner_;
  const absl::Time deadline_;
  std::vector<std::string> waiting_for_;
  std::string last_key_;
  std::vector<char> last_value_;
};

// How many groups named `group_name` this process created before as rank
// `rank`: the instance number that keeps successive groups of one name
// apart in the store. Counted per rank so that ranks run as threads of one
// process (tests) number their groups as separate processes would.
// Thread-safe.
int NextInstance(const std::string& group_name, int rank);

// Opens the store named by `address` (creating a missing directory).
// kInvalidArgument for an unusable directory, kUnavailable for an
// unreachable redis server. Throws nothing.
absl::StatusOr<std::unique_ptr<gloo::rendezvous::Store>> OpenStore(
    const StoreAddress& address);

// Whether `key` (the full key, prefixes included) is set, without waiting.
// Works on stores made by OpenStore; false for other stores or on error.
bool KeyExists(gloo::rendezvous::Store& store, const std::string& key);

// Removes `key` (the full key) from a store made by OpenStore; a missing
// key is not an error. False when the store cannot remove keys or the
// removal failed. Throws nothing.
bool RemoveKey(gloo::rendezvous::Store& store, const std::string& key);

// The KeyValueStore face of a store made by OpenStore (nullptr for any
// other store): Set replaces a value (a file renamed into place, a redis
// SET), Get polls every 10 ms until its timeout, Remove deletes. Borrows
// `store`, which must outlive it.
std::unique_ptr<KeyValueStore> AsKeyValueStore(gloo::rendezvous::Store& store);

}  // namespace dcp::comm::internal

#endif  // DCP_COMM_INTERNAL_GLOO_STORE_H_
