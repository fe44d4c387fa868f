// Turns on a process group: the checkpoint operations that use one group
// (Save, Load, and the upload of an AsyncSave) run their collectives one
// operation at a time, in the order they were submitted in this process.
// Every rank submits its operations in the same program order (a training
// loop's async_save, then a later save or load), so the ranks' collectives
// pair up even when an upload still runs on a background thread while the
// caller's thread starts the next operation on the same group.
//
// A turn is taken when the operation is submitted (AsyncSave: on the
// caller's thread, before it returns), waited for before its first
// collective, and ended when the operation's collectives are over. A
// thread that waited for a turn holds it until it ends the turn: a turn it
// takes on the same group meanwhile (a save run from a callback of the
// operation, on its thread) never waits, and is part of the held one.
#ifndef DCP_ENGINE_INTERNAL_GROUP_TURNS_H_
#define DCP_ENGINE_INTERNAL_GROUP_TURNS_H_

#include <cstdint>
#include <functional>

namespace dcp {
namespace comm {
class ProcessGroup;
}  // namespace comm

namespace internal {

class GroupTurn {
 public:
  // The next turn on `group`; with a null group (one process), or a group
  // whose turn this thread holds, a turn that never waits.
  static GroupTurn Take(comm::ProcessGroup* group);

  GroupTurn() = default;
  GroupTurn(GroupTurn&& other) noexcept;
  GroupTurn& operator=(GroupTurn&& other) noexcept;
  GroupTurn(const GroupTurn&) = delete;
  GroupTurn& operator=(const GroupTurn&) = delete;
  ~GroupTurn() { End(); }

  // Blocks until every turn taken before this one on its group has ended;
  // the calling thread then holds the turn.
  void Wait();
  // Ends the turn (also one never waited for: later turns then need not
  // wait for it), on the thread that waited for it if one did. Idempotent.
  void End();

 private:
  GroupTurn(comm::ProcessGroup* group, uint64_t number)
      : group_(group), number_(number) {}
  void WaitUnheld() const;

  comm::ProcessGroup* group_ = nullptr;
  uint64_t number_ = 0;
  bool held_ = false;  // Waited for: the waiting thread holds it.
};

// For tests: `observer` (or none, when empty) is called on a thread whose
// Wait is about to block, before it blocks.
void SetGroupTurnWaitObserverForTesting(std::function<void()> observer);

}  // namespace internal
}  // namespace dcp

#endif  // DCP_ENGINE_INTERNAL_GROUP_TURNS_H_
