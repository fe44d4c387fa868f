#include "engine/internal/group_turns.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace dcp::internal {
namespace {

// The turns of one group: `serving` runs; those below it have ended;
// `ended` holds the turns above it that ended early.
struct Turns {
  uint64_t next = 0;
  uint64_t serving = 0;
  std::set<uint64_t> ended;
};

struct Registry {
  absl::Mutex mu;
  // Only groups with turns not yet ended: an entry goes once all have,
  // so a group freed and another made at its address starts afresh.
  std::map<comm::ProcessGroup*, Turns> groups ABSL_GUARDED_BY(mu);
  std::function<void()> wait_observer ABSL_GUARDED_BY(mu);
};

// The groups whose turn this thread holds (waited for, not yet ended).
thread_local std::vector<comm::ProcessGroup*> held_groups;

bool Holds(comm::ProcessGroup* group) {
  return std::find(held_groups.begin(), held_groups.end(), group) !=
         held_groups.end();
}

Registry& TheRegistry() {
  static Registry* registry = new Registry;
  return *registry;
}

}  // namespace

GroupTurn GroupTurn::Take(comm::ProcessGroup* group) {
  if (group == nullptr || Holds(group)) return GroupTurn();
  Registry& r = TheRegistry();
  absl::MutexLock lock(&r.mu);
  return GroupTurn(group, r.groups[group].next++);
}

GroupTurn::GroupTurn(GroupTurn&& other) noexcept
    : group_(std::exchange(other.group_, nullptr)),
      number_(other.number_),
      held_(std::exchange(other.held_, false)) {}

GroupTurn& GroupTurn::operator=(GroupTurn&& other) noexcept {
  if (this != &other) {
    End();
    group_ = std::exchange(other.group_, nullptr);
    number_ = other.number_;
    held_ = std::exchange(other.held_, false);
  }
  return *this;
}

void GroupTurn::Wait() {
  if (group_ == nullptr || held_) return;
  WaitUnheld();
  held_ = true;
  held_groups.push_back(group_);
}

void GroupTurn::WaitUnheld() const {
  Registry& r = TheRegistry();
  std::function<void()> observer;
  {
    absl::MutexLock lock(&r.mu);
    if (r.groups.at(group_).serving == number_) return;
    observer = r.wait_observer;
  }
  if (observer) observer();
  absl::MutexLock lock(&r.mu);
  // The entry stays while this turn has not ended.
  struct Up {
    const Turns* turns;
    uint64_t number;
    bool Ready() const { return turns->serving == number; }
  } up{&r.groups.at(group_), number_};
  r.mu.Await(absl::Condition(&up, &Up::Ready));
}

void GroupTurn::End() {
  if (group_ == nullptr) return;
  if (held_) {
    held_ = false;
    auto it = std::find(held_groups.begin(), held_groups.end(), group_);
    if (it != held_groups.end()) held_groups.erase(it);
  }
  Registry& r = TheRegistry();
  absl::MutexLock lock(&r.mu);
  auto it = r.groups.find(group_);
  group_ = nullptr;
  if (it == r.groups.end()) return;
  Turns& turns = it->second;
  if (number_ != turns.serving) {
    turns.ended.insert(number_);
    return;
  }
  ++turns.serving;
  while (!turns.ended.empty() && *turns.ended.begin() == turns.serving) {
    turns.ended.erase(turns.ended.begin());
    ++turns.serving;
  }
  if (turns.serving == turns.next) r.groups.erase(it);
}

void SetGroupTurnWaitObserverForTesting(std::function<void()> observer) {
  Registry& r = TheRegistry();
  absl::MutexLock lock(&r.mu);
  r.wait_observer = std::move(observer);
}

}  // namespace dcp::internal
