#include "comm/internal/gloo_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <system_error>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

// How long one redis command may take; a healthy server answers in
// milliseconds.
constexpr absl::Duration kRedisCommandTimeout = absl::Seconds(10);

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

  // Sets `key`, replacing a value: written beside and renamed over it, so
  // a reader sees the old bytes or the new, never part of them.
  absl::Status Put(const std::string& key, absl::string_view value) {
    const std::string path = objectPath(key);
    const std::string tmp = absl::StrFormat("%s.%d.%p.tmp", path, ::getpid(),
                                            static_cast<void*>(&value));
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(value.data(), static_cast<std::streamsize>(value.size()));
      out.close();
      if (!out) {
        std::filesystem::remove(tmp);
        return absl::UnavailableError(
            absl::StrCat("rendezvous directory: cannot write ", tmp));
      }
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      const int err = errno;
      std::filesystem::remove(tmp);
      return absl::UnavailableError(absl::StrCat(
          "rendezvous directory: rename to ", path, ": ", std::strerror(err)));
    }
    return absl::OkStatus();
  }

  // The value of `key`, nullopt when it is not set.
  absl::StatusOr<std::optional<std::string>> TryGet(const std::string& key) {
    const std::string path = objectPath(key);
    std::ifstream in(path, std::ios::binary);
    if (!in.is_open()) {
      if (errno == ENOENT) return std::optional<std::string>();
      return absl::UnavailableError(
          absl::StrCat("rendezvous directory: cannot read ", path, ": ",
                       std::strerror(errno)));
    }
    std::ostringstream text;
    text << in.rdbuf();
    return std::optional<std::string>(text.str());
  }
};

#if GLOO_USE_REDIS
// RedisStore with a DEL, and a bound on every command: without one, a rank
// cut off from the server (a lost link) blocks in its next command until
// TCP gives up, minutes later, instead of reporting its failure.
class RemovableRedisStore final : public gloo::rendezvous::RedisStore {
 public:
  RemovableRedisStore(const std::string& host, int port)
      : RedisStore(host, port) {
    struct timeval limit {};
    limit.tv_sec = absl::ToInt64Seconds(kRedisCommandTimeout);
    redisSetTimeout(redis_, limit);
  }

  bool Remove(const std::string& key) {
    void* reply = redisCommand(redis_, "DEL %b", key.data(), key.size());
    if (reply == nullptr) return false;
    const bool ok = static_cast<redisReply*>(reply)->type != REDIS_REPLY_ERROR;
    freeReplyObject(reply);
    return ok;
  }

  // SET: replaces a value (Gloo's set refuses to).
  absl::Status Put(const std::string& key, absl::string_view value) {
    auto* reply = static_cast<redisReply*>(
        redisCommand(redis_, "SET %b %b", key.data(), key.size(), value.data(),
                     value.size()));
    absl::Status status = ReplyStatus("SET", key, reply);
    if (reply != nullptr) freeReplyObject(reply);
    return status;
  }

  absl::StatusOr<std::optional<std::string>> TryGet(const std::string& key) {
    auto* reply = static_cast<redisReply*>(
        redisCommand(redis_, "GET %b", key.data(), key.size()));
    absl::Status status = ReplyStatus("GET", key, reply);
    std::optional<std::string> value;
    if (status.ok() && reply->type == REDIS_REPLY_STRING) {
      value.emplace(reply->str, reply->len);
    }
    if (reply != nullptr) freeReplyObject(reply);
    if (!status.ok()) return status;
    return value;
  }

 private:
  absl::Status ReplyStatus(absl::string_view command, const std::string& key,
                           const redisReply* reply) const {
    if (reply == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("redis ", command, " \"", key,
                       "\": ", redis_->err != 0 ? redis_->errstr : "no reply"));
    }
    if (reply->type == REDIS_REPLY_ERROR) {
      return absl::UnavailableError(
          absl::StrCat("redis ", command, " \"", key,
                       "\": ", absl::string_view(reply->str, reply->len)));
    }
    return absl::OkStatus();
  }
};
#endif

// The KeyValueStore face of a store made by OpenStore.
template <typename Backend>
class KeyValueView final : public KeyValueStore {
 public:
  explicit KeyValueView(Backend& store) : store_(store) {}

  absl::Status Set(const std::string& key, absl::string_view value) override {
    try {
      return store_.Put(key, value);
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("rendezvous set \"", key, "\": ", e.what()));
    }
  }

  // Polls every 10 ms, as Gloo's stores do: neither a directory on a
  // shared file system nor Gloo's redis client can wait for a key.
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      absl::StatusOr<std::optional<std::string>> value;
      try {
        value = store_.TryGet(key);
      } catch (const std::exception& e) {
        value = absl::UnavailableError(
            absl::StrCat("rendezvous get \"", key, "\": ", e.what()));
      }
      if (!value.ok()) return value.status();
      if (value->has_value()) return **std::move(value);
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        return absl::DeadlineExceededError(
            absl::StrCat("rendezvous key \"", key, "\" not set within ",
                         absl::FormatDuration(timeout)));
      }
      absl::SleepFor(std::min(left, absl::Milliseconds(10)));
    }
  }

  absl::Status Remove(const std::string& key) override {
    if (store_.Remove(key)) return absl::OkStatus();
    return absl::UnavailableError(
        absl::StrCat("rendezvous: cannot remove key \"", key, "\""));
  }

 private:
  Backend& store_;
};

}  // namespace

std::unique_ptr<KeyValueStore> AsKeyValueStore(gloo::rendezvous::Store& store) {
  if (auto* file = dynamic_cast<CheckableFileStore*>(&store)) {
    return std::make_unique<KeyValueView<CheckableFileStore>>(*file);
  }
#if GLOO_USE_REDIS
  if (auto* redis = dynamic_cast<RemovableRedisStore*>(&store)) {
    return std::make_unique<KeyValueView<RemovableRedisStore>>(*redis);
  }
#endif
  return nullptr;
}

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

int NextInstance(const std::string& group_name, int rank) {
  static absl::Mutex mu(absl::kConstInit);
  static std::map<std::pair<std::string, int>, int>* counts ABSL_GUARDED_BY(
      mu) = new std::map<std::pair<std::string, int>, int>();
  absl::MutexLock lock(&mu);
  return (*counts)[{group_name, rank}]++;
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
