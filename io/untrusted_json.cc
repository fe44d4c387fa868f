#include "io/internal/untrusted_json.h"

#include <algorithm>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace dcp::internal_io {
namespace {

using Json = nlohmann::json;

// Whether a parse event opens an array or object nested more than
// kMaxUntrustedJsonDepth levels deep (the callback's `depth` counts the
// containers around the event: 0 for the top-level value).
bool OpensTooDeep(int depth, Json::parse_event_t event) {
  return (event == Json::parse_event_t::object_start ||
          event == Json::parse_event_t::array_start) &&
         depth >= kMaxUntrustedJsonDepth;
}

}  // namespace

std::string TooDeepMessage(absl::string_view what) {
  return absl::StrCat(what, " nests arrays and objects more than ",
                      kMaxUntrustedJsonDepth, " levels deep");
}

absl::StatusOr<Json> ParseUntrustedJson(absl::string_view text,
                                        absl::string_view what) {
  bool too_deep = false;
  // The keys of each object open around the parser: a key given twice in
  // one object is refused (which value wins would be the parser's choice,
  // so two readers could see two different checkpoints).
  std::vector<absl::flat_hash_set<std::string>> open_objects;
  std::string duplicate;
  auto callback = [&](int depth, Json::parse_event_t event,
                      Json& parsed) -> bool {
    if (OpensTooDeep(depth, event)) {
      too_deep = true;
      return false;  // Discarded: nothing that deep is built.
    }
    if (too_deep) return true;  // `open_objects` no longer matches.
    switch (event) {
      case Json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!open_objects.empty() && parsed.is_string() &&
            !open_objects.back().insert(parsed.get<std::string>()).second &&
            duplicate.empty()) {
          duplicate = parsed.get<std::string>();
        }
        break;
      default:
        break;
    }
    return true;
  };
  Json parsed;
  try {
    parsed = Json::parse(text.begin(), text.end(), callback);
  } catch (const std::exception& e) {
    return absl::DataLossError(
        absl::StrCat(what, " is not valid JSON (", e.what(), ")"));
  }
  if (too_deep) return absl::DataLossError(TooDeepMessage(what));
  if (!duplicate.empty()) {
    Json shown = duplicate;
    return absl::DataLossError(absl::StrCat(
        what, " has the key ", DescribeJsonValue(shown), " more than once"));
  }
  return parsed;
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
