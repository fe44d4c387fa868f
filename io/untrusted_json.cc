#include "io/internal/untrusted_json.h"

#include <algorithm>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace dcp::internal_io {
namespace {

using Json = nlohmann::json;

// A first pass over untrusted JSON that builds nothing: it finds nesting
// deeper than kMaxUntrustedJsonDepth and a key given twice in one object
// (which value counts would be the parser's choice, so two readers could
// see two different checkpoints), in time linear in the text. (A parse
// callback would do it in one pass, but nlohmann's callback parser scans
// the whole parent object at each object's end: quadratic in the entries
// of a safetensors header.)
class Checker final : public nlohmann::json_sax<Json> {
 public:
  bool too_deep() const { return too_deep_; }
  const std::string& duplicate() const { return duplicate_; }
  const std::string& error() const { return error_; }

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    Open();
    // The keys of each object open around the parser, where tracked.
    if (!too_deep_) open_objects_.emplace_back();
    return true;
  }
  bool key(string_t& key) override {
    if (!too_deep_ && !open_objects_.empty() &&
        !open_objects_.back().insert(key).second && duplicate_.empty()) {
      duplicate_ = key;
    }
    return true;
  }
  bool end_object() override {
    if (!too_deep_ && !open_objects_.empty()) open_objects_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override {
    Open();
    return true;
  }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&,
                   const nlohmann::detail::exception& e) override {
    error_ = e.what();
    return false;
  }

 private:
  // Past the limit the keys are no longer tracked (the parse goes on, so
  // that text which is not JSON at all is still reported as such).
  void Open() {
    if (++depth_ > kMaxUntrustedJsonDepth) too_deep_ = true;
  }

  int depth_ = 0;
  bool too_deep_ = false;
  std::vector<absl::flat_hash_set<std::string>> open_objects_;
  std::string duplicate_;
  std::string error_;
};

}  // namespace

std::string TooDeepMessage(absl::string_view what) {
  return absl::StrCat(what, " nests arrays and objects more than ",
                      kMaxUntrustedJsonDepth, " levels deep");
}

absl::StatusOr<Json> ParseUntrustedJson(absl::string_view text,
                                        absl::string_view what) {
  // The parser's message quotes the text it stopped at, which may be
  // anything: bytes outside ASCII are shown escaped unless valid UTF-8.
  const auto not_json = [&](absl::string_view why) {
    std::string shown;
    if (IsValidUtf8(why)) {
      shown = std::string(why);
    } else {
      for (const char c : why) {
        const auto byte = static_cast<unsigned char>(c);
        if (byte < 0x80) {
          shown += c;
        } else {
          absl::StrAppendFormat(&shown, "\\x%02x", byte);
        }
      }
    }
    return absl::DataLossError(
        absl::StrCat(what, " is not valid JSON (", shown, ")"));
  };
  Checker checker;
  try {
    if (!Json::sax_parse(text.begin(), text.end(), &checker)) {
      return not_json(checker.error());
    }
  } catch (const std::exception& e) {
    return not_json(e.what());
  }
  if (checker.too_deep()) return absl::DataLossError(TooDeepMessage(what));
  if (!checker.duplicate().empty()) {
    Json shown = checker.duplicate();
    return absl::DataLossError(absl::StrCat(
        what, " has the key ", DescribeJsonValue(shown), " more than once"));
  }
  // Known valid, shallow and without repeated keys: built without a
  // callback.
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const std::exception& e) {
    return not_json(e.what());
  }
}

std::string DescribeJsonValue(const Json& value) {
  constexpr size_t kMaxStringBytes = 64;
  constexpr size_t kMaxElements = 8;
  // Replaces invalid UTF-8 rather than throwing (parsed strings are valid).
  const auto dump = [](const Json& v) {
    return v.dump(-1, ' ', false, Json::error_handler_t::replace);
  };
  const auto short_scalar = [&](const Json& v) {
    return v.is_null() || v.is_boolean() || v.is_number() ||
           (v.is_string() &&
            v.get_ref<const std::string&>().size() <= kMaxStringBytes);
  };
  if (short_scalar(value)) return dump(value);
  const auto count = [](size_t n, absl::string_view unit) {
    return absl::StrCat(n, " ", unit, n == 1 ? "" : "s");
  };
  switch (value.type()) {
    case Json::value_t::string:
      return absl::StrCat(
          "a string of ",
          count(value.get_ref<const std::string&>().size(), "byte"));
    case Json::value_t::array:
      if (value.size() <= kMaxElements &&
          std::all_of(value.begin(), value.end(), short_scalar)) {
        return dump(value);
      }
      return absl::StrCat("an array of ", count(value.size(), "element"));
    case Json::value_t::object:
      return absl::StrCat("an object of ", count(value.size(), "member"));
    default:
      return "a binary or discarded value";
  }
}

bool IsValidUtf8(absl::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const auto* end = p + text.size();
  while (p < end) {
    const unsigned char c = *p;
    if (c < 0x80) {
      ++p;
      continue;
    }
    int extra = 0;
    uint32_t code = 0;
    uint32_t min = 0;
    if ((c & 0xe0) == 0xc0) {
      extra = 1, code = c & 0x1f, min = 0x80;
    } else if ((c & 0xf0) == 0xe0) {
      extra = 2, code = c & 0x0f, min = 0x800;
    } else if ((c & 0xf8) == 0xf0) {
      extra = 3, code = c & 0x07, min = 0x10000;
    } else {
      return false;
    }
    if (end - p <= extra) return false;
    for (int i = 1; i <= extra; ++i) {
      if ((p[i] & 0xc0) != 0x80) return false;
      code = (code << 6) | (p[i] & 0x3f);
    }
    if (code < min || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) {
      return false;
    }
    p += extra + 1;
  }
  return true;
}

}  // namespace dcp::internal_io
