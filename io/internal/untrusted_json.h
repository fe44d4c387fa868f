// Internal to io/: JSON read from untrusted files (safetensors headers, the
// Hugging Face index, DCP_SHARDING_INFO, config.json, MEGA headers and
// indexes). Parsing bounds the nesting, so code that walks a parsed value
// recursively (nlohmann's dump(), comparisons, conversions) cannot exhaust
// the stack whatever the file holds; messages describe values without
// serializing them.
//
// Thread-safe (no shared state).
#ifndef DCP_IO_INTERNAL_UNTRUSTED_JSON_H_
#define DCP_IO_INTERNAL_UNTRUSTED_JSON_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json_fwd.hpp"

namespace dcp::internal_io {

// The deepest nesting of arrays and objects a parser of untrusted JSON
// accepts (real files nest a few levels).
inline constexpr int kMaxUntrustedJsonDepth = 64;

// "<what> nests arrays and objects more than 64 levels deep": the message
// of parsers that stop at kMaxUntrustedJsonDepth.
std::string TooDeepMessage(absl::string_view what);

// Parses `text`. kDataLoss "<what> is not valid JSON (...)",
// TooDeepMessage(what) when arrays and objects nest more than
// kMaxUntrustedJsonDepth levels deep (nothing that deep is built), or
// "<what> has the key K more than once" for a key given twice in one
// object (which value counts would be the parser's choice).
absl::StatusOr<nlohmann::json> ParseUntrustedJson(absl::string_view text,
                                                  absl::string_view what);

// A parsed JSON value as error messages show it, short and never throwing
// whatever the value: a number, boolean, null, a string of at most 64
// bytes or an array of at most 8 such scalars as JSON; otherwise its kind
// and size ("an array of 50 elements"). Bounded work: containers are not
// serialized.
std::string DescribeJsonValue(const nlohmann::json& value);

// Whether `text` is valid UTF-8 (no overlong forms, surrogates or code
// points above U+10FFFF), as Rust's str::from_utf8 decides: exactly the
// strings nlohmann's dump() writes without throwing.
bool IsValidUtf8(absl::string_view text);

}  // namespace dcp::internal_io

#endif  // DCP_IO_INTERNAL_UNTRUSTED_JSON_H_
