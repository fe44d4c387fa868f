#include "comm/internal/gloo_store.h"

#include <filesystem>
#include <map>
#include <system_error>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

#define HIREDIS_NESTED_INCLUDE 1
#include "gloo/config.h"
#include "gloo/rendezvous/file_store.h"
#if GLOO_USE_REDIS
#include "gloo/rendezvous/redis_store.h"
#endif

namespace dcp::comm::internal {
namespace {

// FileStore with its key check made public.
class CheckableFileStore final : public gloo::rendezvous::FileStore {
 public:
  using FileStore::check;
  using FileStore::FileStore;

  bool Remove(const std::string& key) {
    std::error_code ec;
    std::filesystem::remove(objectPath(key), ec);
    return !ec;
  }
};

#if GLOO_USE_REDIS
// RedisStore with a DEL.
class RemovableRedisStore final : public gloo::rendezvous::RedisStore {
 public:
  using RedisStore::RedisStore;

  bool Remove(const std::string& key) {
    void* reply = redisCommand(redis_, "DEL %b", key.data(), key.size());
    if (reply == nullptr) return false;
    const bool ok = static_cast<redisReply*>(reply)->type != REDIS_REPLY_ERROR;
    freeReplyObject(reply);
    return ok;
  }
};
#endif

}  // namespace

Millis Remaining(absl::Time deadline) {
  const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
  return Millis(ms < 1 ? 1 : ms);
}

int RankOfKey(absl::string_view key) {
  const size_t slash = key.rfind('/');
  absl::string_view tail =
      key.substr(slash == absl::string_view::npos ? 0 : slash + 1);
  if (absl::StartsWith(tail, "rank_")) tail.remove_prefix(5);
  int rank = -1;
  if (!absl::SimpleAtoi(tail, &rank)) return -1;
  return rank;
}

int NextInstance(const std::string& group_name) {
  static absl::Mutex mu(absl::kConstInit);
  static std::map<std::string, int>* counts ABSL_GUARDED_BY(mu) =
      new std::map<std::string, int>();
  absl::MutexLock lock(&mu);
  return (*counts)[group_name]++;
}

absl::StatusOr<std::unique_ptr<gloo::rendezvous::Store>> OpenStore(
    const StoreAddress& address) {
  try {
    if (address.kind == StoreAddress::Kind::kRedis) {
#if GLOO_USE_REDIS
      return std::unique_ptr<gloo::rendezvous::Store>(
          new RemovableRedisStore(address.host, address.port));
#else
      return absl::UnimplementedError(absl::StrCat(
          "rendezvous ", address.ToString(),
          ": this Gloo was built without redis; use a shared directory"));
#endif
    }
    std::error_code ec;
    std::filesystem::create_directories(address.path, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("rendezvous directory ", address.path,
                       " cannot be created: ", ec.message()));
    }
    return std::unique_ptr<gloo::rendezvous::Store>(
        new CheckableFileStore(address.path));
  } catch (const std::exception& e) {
    const absl::StatusCode code = address.kind == StoreAddress::Kind::kRedis
                                      ? absl::StatusCode::kUnavailable
                                      : absl::StatusCode::kInvalidArgument;
    return absl::Status(code, absl::StrCat("rendezvous ", address.ToString(),
                                           " cannot be opened: ", e.what()));
  }
}
bool KeyExists(gloo::rendezvous::Store& store, const std::string& key) {
  try {
    if (auto* file = dynamic_cast<CheckableFileStore*>(&store)) {
      return file->check({key});
    }
#if GLOO_USE_REDIS
    if (auto* redis = dynamic_cast<gloo::rendezvous::RedisStore*>(&store)) {
      return redis->check({key});
    }
#endif
  } catch (const std::exception&) {
  }
  return false;
}

bool RemoveKey(gloo::rendezvous::Store& store, const std::string& key) {
  try {
    if (auto* file = dynamic_cast<CheckableFileStore*>(&store)) {
      return file->Remove(key);
    }
#if GLOO_USE_REDIS
    if (auto* redis = dynamic_cast<RemovableRedisStore*>(&store)) {
      return redis->Remove(key);
    }
#endif
  } catch (const std::exception&) {
  }
  return false;
}

}  // namespace dcp::comm::internal
