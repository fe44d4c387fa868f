// dcp/dcp.hpp: a header-only C++17 wrapper over the C ABI (dcp/dcp.h) for
// programs built outside dcp's Bazel tree: RAII handles and exceptions over
// the stable C symbols of libdcp.so, so a consumer needs neither dcp's
// internal headers nor its compiler flags or abseil.
//
//   dcp::api::StateDict sd;
//   sd.SetTensor({"model", "weight"}, dl_tensor);   // borrowed DLTensor
//   sd.SetInt({"step"}, 100);
//   dcp::api::SaveOptions options{};
//   options.checkpoint_id = "/ckpt/step-100";
//   dcp::api::Save(sd, options);
//
// Every failing call throws dcp::api::Error, whose code() is the
// dcp_status_t and whose what() is the library's message (naming the rank,
// file or tensor). Thread safety is that of the C ABI.
#ifndef DCP_DCP_HPP_
#define DCP_DCP_HPP_

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dcp/dcp.h"

namespace dcp::api {

class Error : public std::runtime_error {
 public:
  Error(int code, const std::string& message)
      : std::runtime_error(std::string(dcp_status_name(code)) + ": " + message),
        code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

// Throws the calling thread's last error when `status` is not DCP_OK.
inline void Check(int status) {
  if (status != DCP_OK) throw Error(status, dcp_last_error_message());
}

// A path from the root of a state dict: keys, or list indices.
class Path {
 public:
  struct Elem {
    Elem(const char* key) : key(key) {}
    Elem(std::string key) : key(std::move(key)) {}
    // A list index of any integer type (int, size_t, ...); one beyond
    // int64_t's range becomes -1, which the library refuses.
    template <typename I, typename = std::enable_if_t<std::is_integral_v<I> &&
                                                      !std::is_same_v<I, bool>>>
    Elem(I index) : is_index(true), index(ToIndex(index)) {}
    std::string key;
    bool is_index = false;
    int64_t index = 0;

   private:
    template <typename I>
    static int64_t ToIndex(I index) {
      if constexpr (std::is_unsigned_v<I>) {
        if (index > static_cast<uint64_t>(INT64_MAX)) return -1;
      }
      return static_cast<int64_t>(index);
    }
  };
  Path(std::initializer_list<Elem> elems) : elems_(elems) { Build(); }
  Path(const Path& other) : elems_(other.elems_) { Build(); }
  Path& operator=(const Path&) = delete;

  // Valid while this Path lives.
  dcp_path_t c_path() const { return {c_elems_.data(), c_elems_.size()}; }

  // The path as messages name it: elements joined by '.' ("model.layers.0").
  std::string str() const {
    std::string out;
    for (const Elem& e : elems_) {
      if (!out.empty()) out += '.';
      out += e.is_index ? std::to_string(e.index) : e.key;
    }
    return out;
  }

 private:
  void Build() {
    c_elems_.clear();
    for (const Elem& e : elems_) {
      c_elems_.push_back(e.is_index ? dcp_path_elem_t{nullptr, e.index}
                                    : dcp_path_elem_t{e.key.c_str(), 0});
    }
  }
  std::vector<Elem> elems_;
  std::vector<dcp_path_elem_t> c_elems_;
};

// Owns a dcp_metadata_t.
class Metadata {
 public:
  explicit Metadata(dcp_metadata_t* md = nullptr) : md_(md) {}
  Metadata(Metadata&& other) noexcept
      : md_(std::exchange(other.md_, nullptr)) {}
  Metadata& operator=(Metadata&& other) noexcept {
    std::swap(md_, other.md_);
    return *this;
  }
  ~Metadata() { dcp_metadata_free(md_); }

  static Metadata Read(const std::string& checkpoint_id) {
    dcp_metadata_t* md = nullptr;
    Check(dcp_metadata_read(checkpoint_id.c_str(), &md));
    return Metadata(md);
  }
  size_t num_items() const {
    size_t n = 0;
    Check(dcp_metadata_num_items(md_, &n));
    return n;
  }
  dcp_item_info_t item(size_t index) const {
    dcp_item_info_t info{};
    info.struct_size = sizeof(info);
    Check(dcp_metadata_item(md_, index, &info));
    return info;
  }
  dcp_metadata_t* get() const { return md_; }

 private:
  dcp_metadata_t* md_;
};

// Owns a dcp_state_dict_t. Borrowed tensors follow the C ABI's rule: their
// memory stays valid (and unchanged during a save) until the save returns
// or, for AsyncSave, until staging completes.
class StateDict {
 public:
  StateDict() { Check(dcp_state_dict_create(&sd_)); }
  StateDict(const StateDict&) = delete;
  StateDict& operator=(const StateDict&) = delete;
  ~StateDict() { dcp_state_dict_free(sd_); }

  void SetTensor(const Path& path, const DLTensor& tensor,
                 const dcp_shard_t* shard = nullptr) {
    Check(dcp_state_dict_set_tensor(sd_, path.c_path(), &tensor, shard));
  }
  void SetInt(const Path& path, int64_t v) {
    Check(dcp_state_dict_set_int(sd_, path.c_path(), v));
  }
  void SetFloat(const Path& path, double v) {
    Check(dcp_state_dict_set_float(sd_, path.c_path(), v));
  }
  void SetBool(const Path& path, bool v) {
    Check(dcp_state_dict_set_bool(sd_, path.c_path(), v ? 1 : 0));
  }
  void SetString(const Path& path, const std::string& v) {
    Check(dcp_state_dict_set_string(sd_, path.c_path(), v.data(), v.size()));
  }
  void SetBytes(const Path& path, const std::string& v) {
    Check(dcp_state_dict_set_bytes(sd_, path.c_path(), v.data(), v.size()));
  }

  dcp_leaf_info_t Get(const Path& path) const {
    dcp_leaf_info_t info{};
    info.struct_size = sizeof(info);
    Check(dcp_state_dict_get(sd_, path.c_path(), &info));
    return info;
  }
  // The value of an int, float, str or bytes leaf (a bool leaf is an int
  // here, 0 or 1; GetString takes bytes too); a leaf of another kind
  // throws Error (DCP_INVALID_ARGUMENT) saying which kind it is.
  int64_t GetInt(const Path& path) const {
    dcp_leaf_info_t info = Get(path);
    if (info.kind != DCP_VALUE_BOOL) {
      ExpectKind(path, info, DCP_VALUE_INT, "an int");
    }
    return info.int_value;
  }
  double GetFloat(const Path& path) const {
    dcp_leaf_info_t info = Get(path);
    ExpectKind(path, info, DCP_VALUE_FLOAT, "a float");
    return info.float_value;
  }
  std::string GetString(const Path& path) const {  // a str or bytes leaf
    dcp_leaf_info_t info = Get(path);
    if (info.kind != DCP_VALUE_BYTES) {
      ExpectKind(path, info, DCP_VALUE_STRING, "a string");
    }
    return std::string(info.data, info.size);
  }
  std::string GetBytes(const Path& path) const {
    dcp_leaf_info_t info = Get(path);
    ExpectKind(path, info, DCP_VALUE_BYTES, "bytes");
    return std::string(info.data, info.size);
  }

  dcp_state_dict_t* get() const { return sd_; }

 private:
  static void ExpectKind(const Path& path, const dcp_leaf_info_t& info,
                         int kind, const char* wanted) {
    static const char* const kNames[] = {
        "None",    "a tensor", "a sharded tensor", "an int",
        "a float", "a bool",   "a string",         "bytes"};
    if (info.kind == kind) return;
    const bool known = info.kind >= 0 && info.kind < 8;
    throw Error(DCP_INVALID_ARGUMENT,
                "\"" + path.str() + "\" is " +
                    (known ? kNames[info.kind] : "of an unknown kind") +
                    ", not " + wanted);
  }

  dcp_state_dict_t* sd_ = nullptr;
};

// Option structs with struct_size filled in; zero means the default.
struct SaveOptions {
  std::string checkpoint_id;
  dcp_device_wait_t device_wait{};
  dcp_process_group_t* process_group = nullptr;
  bool no_dist = false;

  dcp_save_options_t c_options() const {
    dcp_save_options_t o{};
    o.struct_size = sizeof(o);
    o.checkpoint_id = checkpoint_id.c_str();
    o.device_wait = device_wait;
    o.process_group = process_group;
    o.no_dist = no_dist ? DCP_TRUE : DCP_DEFAULT;
    return o;
  }
};

struct LoadOptions {
  std::string checkpoint_id;
  dcp_device_wait_t device_wait{};
  dcp_process_group_t* process_group = nullptr;
  bool no_dist = false;
  bool allow_partial_load = false;
  bool convert_dtypes = false;  // dcp_load_planner_options_t.convert_dtypes

  dcp_load_options_t c_options(dcp_load_planner_options_t& planner) const {
    planner = dcp_load_planner_options_t{};
    planner.struct_size = sizeof(planner);
    planner.allow_partial_load = allow_partial_load ? DCP_TRUE : DCP_DEFAULT;
    planner.convert_dtypes = convert_dtypes ? DCP_TRUE : DCP_DEFAULT;
    dcp_load_options_t o{};
    o.struct_size = sizeof(o);
    o.checkpoint_id = checkpoint_id.c_str();
    o.device_wait = device_wait;
    o.process_group = process_group;
    o.no_dist = no_dist ? DCP_TRUE : DCP_DEFAULT;
    o.planner = &planner;
    return o;
  }
};

inline Metadata Save(const StateDict& sd, const SaveOptions& options) {
  dcp_save_options_t o = options.c_options();
  dcp_metadata_t* md = nullptr;
  Check(dcp_save(sd.get(), &o, &md));
  return Metadata(md);
}

inline void Load(StateDict& sd, const LoadOptions& options) {
  dcp_load_planner_options_t planner;
  dcp_load_options_t o = options.c_options(planner);
  Check(dcp_load(sd.get(), &o));
}

// An async save in flight (the seed's AsyncSaveResponse). Destroying it
// does not cancel the save.
class AsyncSave {
 public:
  AsyncSave(const StateDict& sd, const SaveOptions& options) {
    dcp_save_options_t o = options.c_options();
    Check(dcp_async_save(sd.get(), &o, &save_));
  }
  AsyncSave(AsyncSave&& other) noexcept
      : save_(std::exchange(other.save_, nullptr)) {}
  AsyncSave(const AsyncSave&) = delete;
  AsyncSave& operator=(const AsyncSave&) = delete;
  ~AsyncSave() { dcp_async_save_free(save_); }

  // Blocks until staging is done (the caller may change its tensors).
  void WaitStaged() { Wait(DCP_STAGING, -1); }
  // Blocks until the checkpoint is committed; throws the save's error.
  void WaitCommitted() { Wait(DCP_UPLOAD, -1); }
  // True once committed (throws the save's error if it failed).
  bool PollCommitted() { return Wait(DCP_UPLOAD, 0); }

 private:
  bool Wait(int32_t which, int64_t timeout_ms) {
    int32_t done = 0;
    Check(dcp_async_save_wait(save_, which, timeout_ms, &done));
    return done != 0;
  }
  dcp_async_save_t* save_ = nullptr;
};

}  // namespace dcp::api

#endif  // DCP_DCP_HPP_
