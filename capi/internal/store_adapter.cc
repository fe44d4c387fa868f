#include "capi/internal/store_adapter.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "capi/internal/options.h"
#include "comm/store_process_group.h"
#include "core/status.h"

namespace dcp::capi {
namespace {

// A dcp_status_t from the caller's callback as a Status about `what`.
absl::Status FromCallback(int code, absl::string_view what) {
  if (code == DCP_OK) return absl::OkStatus();
  const absl::StatusCode status_code =
      code > DCP_OK && code <= DCP_UNAUTHENTICATED
          ? static_cast<absl::StatusCode>(code)
          : absl::StatusCode::kUnknown;
  return absl::Status(status_code,
                      absl::StrCat("dcp_store_t.", what, " returned ",
                                   dcp_status_name(code), " (", code, ")"));
}

// What a get's sink received.
struct Received {
  std::string value;
  int calls = 0;
  bool out_of_memory = false;
  bool null_data = false;  // data NULL with size > 0
};

// The sink handed to the caller's get: C calls it, so nothing may throw.
extern "C" void ReceiveValue(void* context, const void* data, size_t size) {
  auto* received = static_cast<Received*>(context);
  ++received->calls;
  if (data == nullptr && size > 0) {
    received->null_data = true;
    return;
  }
  try {
    received->value.assign(static_cast<const char*>(data), size);
  } catch (...) {
    received->out_of_memory = true;
  }
}

class CallbackStore final : public comm::KeyValueStore {
 public:
  explicit CallbackStore(const dcp_store_t& store) : store_(store) {}

  absl::Status Set(const std::string& key, absl::string_view value) override {
    absl::MutexLock lock(&mu_);
    return FromCallback(
        store_.set(store_.user, key.c_str(), value.data(), value.size()),
        absl::StrCat("set of key \"", key, "\""));
  }

  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override {
    int64_t timeout_ms = 0;
    if (timeout == absl::InfiniteDuration()) {
      timeout_ms = std::numeric_limits<int64_t>::max();
    } else if (timeout > absl::ZeroDuration()) {
      // At least 1 ms: 0 would mean "check once".
      timeout_ms = std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout));
    }
    Received received;
    absl::MutexLock lock(&mu_);
    const int code = store_.get(store_.user, key.c_str(), timeout_ms,
                                ReceiveValue, &received);
    DCP_RETURN_IF_ERROR(
        FromCallback(code, absl::StrCat("get of key \"", key, "\"")));
    if (received.out_of_memory) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "out of memory receiving the value of store key \"", key, "\""));
    }
    if (received.null_data) {
      return absl::InvalidArgumentError(
          absl::StrCat("dcp_store_t.get of key \"", key,
                       "\" passed its sink NULL data with a non-zero size"));
    }
    if (received.calls != 1) {
      return absl::InternalError(absl::StrCat("dcp_store_t.get of key \"", key,
                                              "\" returned DCP_OK but called "
                                              "its sink ",
                                              received.calls,
                                              " times instead of once"));
    }
    return std::move(received.value);
  }

  absl::Status Remove(const std::string& key) override {
    if (store_.remove == nullptr) {
      return absl::UnimplementedError("dcp_store_t.remove is NULL");
    }
    absl::MutexLock lock(&mu_);
    return FromCallback(store_.remove(store_.user, key.c_str()),
                        absl::StrCat("remove of key \"", key, "\""));
  }

 private:
  const dcp_store_t store_;
  absl::Mutex mu_;  // One callback at a time.
};

}  // namespace

absl::StatusOr<std::unique_ptr<comm::ProcessGroup>> CreateGroupOverStore(
    const dcp_store_t* store, int32_t rank, int32_t size,
    const dcp_process_group_options_t* options) {
  if (store == nullptr) {
    return absl::InvalidArgumentError(
        "dcp_process_group_create_from_store: the store is NULL");
  }
  DCP_ASSIGN_OR_RETURN(dcp_store_t c_store,
                       ReadVersioned(store, "dcp_store_t"));
  if (c_store.set == nullptr || c_store.get == nullptr) {
    return absl::InvalidArgumentError(
        "dcp_store_t needs its set and get callbacks (remove may be NULL)");
  }
  DCP_ASSIGN_OR_RETURN(dcp_process_group_options_t in,
                       ReadVersioned(options, "dcp_process_group_options_t"));
  if (in.backend != nullptr) {
    const std::string backend = absl::AsciiStrToLower(in.backend);
    if (backend != "auto" && backend != "store") {
      return absl::InvalidArgumentError(absl::StrCat(
          "a process group over a dcp_store_t has its own transport; "
          "dcp_process_group_options_t.backend \"",
          in.backend, "\" must be NULL, \"auto\" or \"store\""));
    }
    in.backend = nullptr;
  }
  // The common fields, validated as for a group from the environment.
  DCP_ASSIGN_OR_RETURN(comm::ProcessGroupOptions common,
                       ProcessGroupOptionsFromC(&in));
  comm::StoreProcessGroupOptions group_options;
  group_options.group_name = common.group_name;
  group_options.timeout = common.timeout;
  return comm::CreateStoreProcessGroup(std::make_shared<CallbackStore>(c_store),
                                       rank, size, group_options);
}

}  // namespace dcp::capi
