#include "planner/plan_codec.h"

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "planner/plan.pb.h"

namespace dcp {
namespace {

namespace pb = ::dcp::planner_proto;

absl::Status VersionError(absl::string_view what, uint32_t version) {
  return absl::DataLossError(absl::StrCat(
      what, " has encoding version ", version, " but this build reads up to ",
      kPlanEncodingVersion, "; upgrade the reader"));
}

// Bit i set: segment i of `name` split on '.' is the list index path[i].
// nullopt when the path is not the split name.
std::optional<uint64_t> DerivedListMask(const std::string& name,
                                        const ObjectPath& path) {
  if (path.empty() || path.size() > 64) return std::nullopt;
  uint64_t mask = 0;
  size_t pos = 0;
  for (size_t i = 0; i < path.size(); ++i) {
    size_t end = name.find('.', pos);
    if (end == std::string::npos) end = name.size();
    // Each segment must end where the path's next element starts.
    if ((end == name.size()) != (i + 1 == path.size())) return std::nullopt;
    const absl::string_view segment(name.data() + pos, end - pos);
    if (const auto* key = std::get_if<std::string>(&path[i])) {
      if (segment != *key) return std::nullopt;
    } else {
      if (segment != absl::StrCat(std::get<int64_t>(path[i]))) {
        return std::nullopt;
      }
      mask |= uint64_t{1} << i;
    }
    pos = end + 1;
  }
  return mask;
}

}  // namespace

std::string EncodeFlattenMapping(const FlattenMapping& mapping) {
  pb::FlattenMapping proto;
  proto.set_version(kPlanEncodingVersion);
  for (const auto& [name, path] : mapping) {
    pb::FlattenEntry* entry = proto.add_entries();
    entry->set_name(name);
    if (std::optional<uint64_t> mask = DerivedListMask(name, path)) {
      entry->set_derived(true);
      entry->set_list_mask(*mask);
      continue;
    }
    for (const PathElement& element : path) {
      if (const auto* key = std::get_if<std::string>(&element)) {
        entry->add_path()->set_key(*key);
      } else {
        entry->add_path()->set_index(std::get<int64_t>(element));
      }
    }
  }
  return proto.SerializeAsString();
}

absl::StatusOr<FlattenMapping> DecodeFlattenMapping(absl::string_view bytes) {
  pb::FlattenMapping proto;
  if (!proto.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::DataLossError("flatten mapping does not parse");
  }
  if (proto.version() > kPlanEncodingVersion) {
    return VersionError("flatten mapping", proto.version());
  }
  FlattenMapping mapping;
  for (const pb::FlattenEntry& entry : proto.entries()) {
    ObjectPath path;
    if (entry.derived()) {
      std::vector<absl::string_view> segments =
          absl::StrSplit(entry.name(), '.');
      if (segments.size() > 64 ||
          (segments.size() < 64 &&
           (entry.list_mask() >> segments.size()) != 0)) {
        return absl::DataLossError(absl::StrCat(
            "flatten mapping entry \"", entry.name(), "\" has a bad mask"));
      }
      for (size_t i = 0; i < segments.size(); ++i) {
        if ((entry.list_mask() >> i) & 1) {
          int64_t index;
          if (!absl::SimpleAtoi(segments[i], &index) || index < 0) {
            return absl::DataLossError(
                absl::StrCat("flatten mapping entry \"", entry.name(),
                             "\": segment ", i, " is not a list index"));
          }
          path.emplace_back(index);
        } else {
          path.emplace_back(std::string(segments[i]));
        }
      }
    } else {
      for (const pb::PathElement& element : entry.path()) {
        if (element.kind_case() == pb::PathElement::kKey) {
          path.emplace_back(element.key());
        } else {
          path.emplace_back(element.index());
        }
      }
    }
    mapping.emplace(entry.name(), std::move(path));
  }
  return mapping;
}

}  // namespace dcp
