#include "capi/internal/last_error.h"

#include <pthread.h>

#include <atomic>
#include <exception>
#include <map>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/checkpoint_exception.h"

namespace dcp::capi {
namespace {

struct RankFailure {
  int32_t rank;
  int code;
  std::string message;
};

struct LastError {
  int code = 0;
  std::string message;
  std::vector<RankFailure> failures;
};

thread_local LastError last_error;

std::atomic<bool> used{false};
std::atomic<bool> forked_after_use{false};

void ChildAfterFork() {
  if (used.load(std::memory_order_relaxed)) {
    forked_after_use.store(true, std::memory_order_relaxed);
  }
}

// Registered when the library is loaded, before any call can start a
// thread.
[[maybe_unused]] const bool registered_at_fork = [] {
  return pthread_atfork(nullptr, nullptr, ChildAfterFork) == 0;
}();

// When even recording the error runs out of memory: a message that needs
// no allocation.
void RecordWithoutMemory() noexcept {
  last_error.code = static_cast<int>(absl::StatusCode::kResourceExhausted);
  last_error.failures.clear();
  last_error.message.clear();  // Keeps its capacity; never throws.
}

}  // namespace

int RecordStatus(const absl::Status& status) noexcept {
  if (status.ok()) return 0;
  try {
    LastError error;
    error.code = static_cast<int>(status.code());
    error.message = std::string(status.message());
    if (std::optional<std::map<int, absl::Status>> failures =
            CheckpointFailures(status)) {
      for (const auto& [rank, failure] : *failures) {
        error.failures.push_back({rank, static_cast<int>(failure.code()),
                                  std::string(failure.message())});
      }
    }
    last_error = std::move(error);
  } catch (...) {
    RecordWithoutMemory();
  }
  return static_cast<int>(status.code());
}

bool ForkedAfterUse() noexcept {
  return forked_after_use.load(std::memory_order_relaxed);
}

void NoteUse() noexcept {
  if (!used.load(std::memory_order_relaxed)) {
    used.store(true, std::memory_order_relaxed);
  }
}

int RecordForkedChild() noexcept {
  return RecordStatus(absl::FailedPreconditionError(
      "libdcp cannot be used in a child of fork(2) of a process that had "
      "used it: its threads stayed in the parent. Start such processes "
      "with spawn or forkserver, or fork before the first dcp call"));
}

int RecordCurrentException() noexcept {
  try {
    throw;
  } catch (const std::bad_alloc& e) {
    return RecordStatus(absl::ResourceExhaustedError(
        absl::StrCat("out of memory (std::bad_alloc: ", e.what(), ")")));
  } catch (const std::length_error& e) {
    return RecordStatus(absl::ResourceExhaustedError(
        absl::StrCat("a size beyond what can be allocated "
                     "(std::length_error: ",
                     e.what(), ")")));
  } catch (const std::exception& e) {
    return RecordStatus(absl::InternalError(
        absl::StrCat("unexpected C++ exception in dcp: ", e.what())));
  } catch (...) {
    return RecordStatus(
        absl::InternalError("unexpected non-standard C++ exception in dcp"));
  }
}

int LastErrorCode() noexcept { return last_error.code; }

const char* LastErrorMessage() noexcept { return last_error.message.c_str(); }

size_t LastErrorNumRankFailures() noexcept {
  return last_error.failures.size();
}

bool LastErrorRankFailure(size_t index, int32_t& rank, int& code,
                          const char*& message) noexcept {
  if (index >= last_error.failures.size()) return false;
  const RankFailure& failure = last_error.failures[index];
  rank = failure.rank;
  code = failure.code;
  message = failure.message.c_str();
  return true;
}

}  // namespace dcp::capi
