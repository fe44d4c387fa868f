// ThreadSanitizer annotations for Debian's prebuilt abseil (--config=tsan
// only; see //third_party:absl).
//
// libabsl_synchronization.so is not built with -fsanitize=thread, so TSan
// does not see absl::Mutex, CondVar or Notification synchronize anything:
// every access guarded by an absl::Mutex would be reported as a race. This
// file defines the public entry points of those classes (and of
// BlockingCounter) itself. The
// dynamic linker binds every call (ours, and those inside abseil that go
// through the PLT) to these definitions, which tell TSan what the call does
// (__tsan_mutex_pre_lock / post_lock, pre_unlock / post_unlock, the same
// brackets abseil's own TSan build uses) and call abseil's definition,
// found with dlsym(RTLD_NEXT). Accesses made inside a bracket (a Condition
// evaluated inside Lock, Unlock or Await) are ignored by TSan, as in
// abseil's own TSan build.
//
// absl::Status shares its heap representation between copies through a
// reference count that the inline copy constructor raises and the
// uninstrumented Status::UnrefNonInlined lowers (and deletes at zero): the
// definition below tells TSan that a thread dropping a reference releases
// what it did with the status, and that the thread deleting it has
// acquired every earlier drop. Which drop deletes is decided inside abseil,
// so every drop acquires: two threads that both held one status are
// ordered at their drops, which could hide a race between them elsewhere.
//
// Limitation: Notification::HasBeenNotified() is inline; it synchronizes
// with Notify() through the release below on the flag's address, which
// relies on Notification's layout (checked by the static_assert).

#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

template <typename Fn>
Fn Next(const char* symbol) {
  void* fn = dlsym(RTLD_NEXT, symbol);
  if (fn == nullptr) {
    std::fprintf(stderr, "absl_tsan_annotations: %s not found: %s\n", symbol,
                 dlerror());
    std::abort();
  }
  return reinterpret_cast<Fn>(fn);
}

// Nesting of the entry points below on this thread. Abseil calls some of
// them itself through the PLT (AwaitWithTimeout calls AwaitWithDeadline,
// Notify calls Lock); only the outermost call is annotated.
thread_local int depth = 0;

struct Nest {
  Nest() { ++depth; }
  ~Nest() { --depth; }
  Nest(const Nest&) = delete;
  Nest& operator=(const Nest&) = delete;
};

// The real definition of `symbol`, looked up once; a nested call goes
// straight to it (the trailing arguments are the real function's).
#define DCP_REAL(type, symbol, ...)            \
  static const auto real = Next<type>(symbol); \
  if (depth > 0) return real(__VA_ARGS__);     \
  Nest nest

constexpr unsigned kRead = __tsan_mutex_read_lock;

// A call that holds the mutex on entry and on exit but releases it inside
// (Await, CondVar::Wait): an unlock then a lock.
template <typename Call>
auto ReleasedDuring(void* mu, unsigned flags, Call call) {
  __tsan_mutex_pre_unlock(mu, flags);
  auto result = call();
  __tsan_mutex_post_unlock(mu, flags);
  __tsan_mutex_pre_lock(mu, flags);
  __tsan_mutex_post_lock(mu, flags, 0);
  return result;
}

// A call that returns with the mutex held (LockWhen...).
template <typename Call>
auto Locking(void* mu, unsigned flags, Call call) {
  __tsan_mutex_pre_lock(mu, flags);
  auto result = call();
  __tsan_mutex_post_lock(mu, flags, 0);
  return result;
}

void* NotifiedFlag(absl::Notification* n) {
  // Notification is { Mutex mutex_; std::atomic<bool> notified_yet_; }.
  static_assert(
      sizeof(absl::Notification) == sizeof(absl::Mutex) + alignof(absl::Mutex),
      "absl::Notification's layout changed");
  return reinterpret_cast<char*>(n) + sizeof(absl::Mutex);
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  DCP_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex4LockEv", this);
  Locking(this, 0, [&] {
    real(this);
    return 0;
  });
}

void Mutex::ReaderLock() {
  DCP_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex10ReaderLockEv", this);
  Locking(this, kRead, [&] {
    real(this);
    return 0;
  });
}

bool Mutex::TryLock() {
  DCP_REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex7TryLockEv", this);
  __tsan_mutex_pre_lock(this, __tsan_mutex_try_lock);
  const bool locked = real(this);
  __tsan_mutex_post_lock(
      this, locked ? __tsan_mutex_try_lock : __tsan_mutex_try_lock_failed, 0);
  return locked;
}

bool Mutex::ReaderTryLock() {
  DCP_REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex13ReaderTryLockEv", this);
  __tsan_mutex_pre_lock(this, __tsan_mutex_try_read_lock);
  const bool locked = real(this);
  __tsan_mutex_post_lock(
      this,
      locked ? __tsan_mutex_try_read_lock : __tsan_mutex_try_read_lock_failed,
      0);
  return locked;
}

void Mutex::Unlock() {
  DCP_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex6UnlockEv", this);
  __tsan_mutex_pre_unlock(this, 0);
  real(this);
  __tsan_mutex_post_unlock(this, 0);
}

void Mutex::ReaderUnlock() {
  DCP_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex12ReaderUnlockEv", this);
  __tsan_mutex_pre_unlock(this, kRead);
  real(this);
  __tsan_mutex_post_unlock(this, kRead);
}

void Mutex::LockWhen(const Condition& cond) {
  DCP_REAL(void (*)(Mutex*, const Condition&),
           "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE", this, cond);
  Locking(this, 0, [&] {
    real(this, cond);
    return 0;
  });
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  DCP_REAL(void (*)(Mutex*, const Condition&),
           "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE", this,
           cond);
  Locking(this, kRead, [&] {
    real(this, cond);
    return 0;
  });
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  DCP_REAL(bool (*)(Mutex*, const Condition&, Duration),
           "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_"
           "9ConditionENS0_8DurationE",
           this, cond, timeout);
  return Locking(this, 0, [&] { return real(this, cond, timeout); });
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  DCP_REAL(bool (*)(Mutex*, const Condition&, Time),
           "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_"
           "9ConditionENS0_4TimeE",
           this, cond, deadline);
  return Locking(this, 0, [&] { return real(this, cond, deadline); });
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, Duration timeout) {
  DCP_REAL(bool (*)(Mutex*, const Condition&, Duration),
           "_ZN4absl7debian35Mutex25ReaderLockWhenWithTimeoutERKNS0_"
           "9ConditionENS0_8DurationE",
           this, cond, timeout);
  return Locking(this, kRead, [&] { return real(this, cond, timeout); });
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, Time deadline) {
  DCP_REAL(bool (*)(Mutex*, const Condition&, Time),
           "_ZN4absl7debian35Mutex26ReaderLockWhenWithDeadlineERKNS0_"
           "9ConditionENS0_4TimeE",
           this, cond, deadline);
  return Locking(this, kRead, [&] { return real(this, cond, deadline); });
}

void Mutex::Await(const Condition& cond) {
  DCP_REAL(void (*)(Mutex*, const Condition&),
           "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE", this, cond);
  ReleasedDuring(this, 0, [&] {
    real(this, cond);
    return 0;
  });
}

bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  DCP_REAL(bool (*)(Mutex*, const Condition&, Duration),
           "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_"
           "9ConditionENS0_8DurationE",
           this, cond, timeout);
  return ReleasedDuring(this, 0, [&] { return real(this, cond, timeout); });
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  DCP_REAL(bool (*)(Mutex*, const Condition&, Time),
           "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_"
           "9ConditionENS0_4TimeE",
           this, cond, deadline);
  return ReleasedDuring(this, 0, [&] { return real(this, cond, deadline); });
}

void CondVar::Wait(Mutex* mu) {
  DCP_REAL(void (*)(CondVar*, Mutex*),
           "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE", this, mu);
  ReleasedDuring(mu, 0, [&] {
    real(this, mu);
    return 0;
  });
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  DCP_REAL(bool (*)(CondVar*, Mutex*, Duration),
           "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_"
           "8DurationE",
           this, mu, timeout);
  return ReleasedDuring(mu, 0, [&] { return real(this, mu, timeout); });
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  DCP_REAL(bool (*)(CondVar*, Mutex*, Time),
           "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_"
           "4TimeE",
           this, mu, deadline);
  return ReleasedDuring(mu, 0, [&] { return real(this, mu, deadline); });
}

void Notification::Notify() {
  DCP_REAL(void (*)(Notification*), "_ZN4absl7debian312Notification6NotifyEv",
           this);
  __tsan_release(NotifiedFlag(this));
  real(this);
}

void Notification::WaitForNotification() const {
  DCP_REAL(void (*)(const Notification*),
           "_ZNK4absl7debian312Notification19WaitForNotificationEv", this);
  real(this);
  __tsan_acquire(NotifiedFlag(const_cast<Notification*>(this)));
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  DCP_REAL(
      bool (*)(const Notification*, Duration),
      "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_"
      "8DurationE",
      this, timeout);
  const bool notified = real(this, timeout);
  if (notified) __tsan_acquire(NotifiedFlag(const_cast<Notification*>(this)));
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  DCP_REAL(
      bool (*)(const Notification*, Time),
      "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_"
      "4TimeE",
      this, deadline);
  const bool notified = real(this, deadline);
  if (notified) __tsan_acquire(NotifiedFlag(const_cast<Notification*>(this)));
  return notified;
}

// DecrementCount is an atomic decrement inside abseil (only the last one
// takes the mutex): each one releases, Wait acquires them all.
bool BlockingCounter::DecrementCount() {
  DCP_REAL(bool (*)(BlockingCounter*),
           "_ZN4absl7debian315BlockingCounter14DecrementCountEv", this);
  __tsan_release(this);
  return real(this);
}

void BlockingCounter::Wait() {
  DCP_REAL(void (*)(BlockingCounter*),
           "_ZN4absl7debian315BlockingCounter4WaitEv", this);
  real(this);
  __tsan_acquire(this);
}

void Status::UnrefNonInlined(uintptr_t rep) {
  static const auto real =
      Next<void (*)(uintptr_t)>("_ZN4absl7debian36Status15UnrefNonInlinedEm");
  // `rep` points into the representation (tagged): a sync address that
  // lives exactly as long as it does.
  void* sync = reinterpret_cast<void*>(rep);
  __tsan_release(sync);
  __tsan_acquire(sync);
  real(rep);
}

ABSL_NAMESPACE_END
}  // namespace absl
