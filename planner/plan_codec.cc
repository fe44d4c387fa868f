#include "planner/plan_codec.h"

#include <algorithm>
#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "core/status.h"
#include "planner/plan.pb.h"

namespace dcp {
namespace {

namespace pb = ::dcp::planner_proto;

// SavePlannerData with joined masks: readers of version 1 would split the
// names at every dot, so such data says it needs a newer reader.
constexpr uint32_t kJoinedMasksVersion = 2;

absl::Status VersionError(absl::string_view what, uint32_t version,
                          uint32_t newest = kPlanEncodingVersion) {
  return absl::DataLossError(absl::StrCat(
      what, " has encoding version ", version, " but this build reads up to ",
      newest, "; upgrade the reader"));
}

void MappingToProto(const FlattenMapping& mapping, pb::FlattenMapping& proto) {
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
}

absl::StatusOr<FlattenMapping> MappingFromProto(
    const pb::FlattenMapping& proto) {
  if (proto.version() > kPlanEncodingVersion) {
    return VersionError("flatten mapping", proto.version());
  }
  FlattenMapping mapping;
  for (const pb::FlattenEntry& entry : proto.entries()) {
    ObjectPath path;
    if (entry.derived()) {
      DCP_ASSIGN_OR_RETURN(path,
                           PathFromListMask(entry.name(), entry.list_mask()));
    } else {
      for (const pb::PathElement& element : entry.path()) {
        if (element.kind_case() == pb::PathElement::kKey) {
          path.emplace_back(element.key());
        } else if (element.index() < 0) {
          // No state dict has one, and PathFromListMask refuses it: a
          // mapping holding one would re-encode to bytes that do not decode.
          return absl::DataLossError(
              absl::StrCat("flatten path of \"", entry.name(),
                           "\" has negative list index ", element.index()));
        } else {
          path.emplace_back(element.index());
        }
      }
    }
    mapping.emplace(entry.name(), std::move(path));
  }
  return mapping;
}

template <typename Proto>
absl::Status Parse(absl::string_view bytes, absl::string_view what,
                   Proto& proto) {
  if (bytes.size() > static_cast<size_t>(INT32_MAX) ||
      !proto.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::DataLossError(
        absl::StrCat(what, " does not parse (", bytes.size(), " bytes)"));
  }
  return absl::OkStatus();
}

}  // namespace

std::optional<DerivedPath> DerivePath(absl::string_view name,
                                      const ObjectPath& path) {
  if (path.empty() || path.size() > 64) return std::nullopt;
  DerivedPath out;
  size_t pos = 0;  // Where the next element's text starts in `name`.
  size_t dot = 0;  // How many of the name's dots lie before `pos`.
  char digits[absl::numbers_internal::kFastToBufferSize];
  for (size_t i = 0; i < path.size(); ++i) {
    absl::string_view text;
    if (const auto* key = std::get_if<std::string>(&path[i])) {
      text = *key;
    } else {
      const int64_t index = std::get<int64_t>(path[i]);
      // The root is a key; a negative index has no list to live in.
      if (i == 0 || index < 0) return std::nullopt;
      text = absl::string_view(
          digits,
          absl::numbers_internal::FastIntToBuffer(index, digits) - digits);
      out.list |= uint64_t{1} << i;
    }
    if (name.substr(pos, text.size()) != text) return std::nullopt;
    for (char c : text) {
      if (c != '.') continue;
      if (dot >= 64) return std::nullopt;
      out.joined |= uint64_t{1} << dot++;
    }
    pos += text.size();
    if (i + 1 < path.size()) {
      if (pos >= name.size() || name[pos] != '.') return std::nullopt;
      ++pos;
      ++dot;
    }
  }
  if (pos != name.size()) return std::nullopt;
  return out;
}

std::optional<uint64_t> DerivedListMask(absl::string_view name,
                                        const ObjectPath& path) {
  std::optional<DerivedPath> derived = DerivePath(name, path);
  if (!derived.has_value() || derived->joined != 0) return std::nullopt;
  return derived->list;
}

absl::StatusOr<ObjectPath> PathFromListMask(absl::string_view name,
                                            uint64_t list, uint64_t joined) {
  auto misfit = [&] {
    return absl::DataLossError(absl::StrCat("flatten path masks ", list, "/",
                                            joined, " do not fit \"", name,
                                            "\""));
  };
  if ((list & 1) != 0) return misfit();
  ObjectPath path;
  size_t begin = 0;  // Of the segment being read.
  size_t dot = 0;    // Dots seen.
  size_t segment = 0;
  for (size_t i = 0; i <= name.size(); ++i) {
    if (i < name.size()) {
      if (name[i] != '.') continue;
      const bool inside_key = dot < 64 && ((joined >> dot) & 1) != 0;
      ++dot;
      if (inside_key) continue;
    }
    if (segment >= 64) return misfit();
    const absl::string_view text = name.substr(begin, i - begin);
    if ((list >> segment) & 1) {
      int64_t index;
      if (!absl::SimpleAtoi(text, &index) || index < 0) {
        return absl::DataLossError(absl::StrCat("flatten path of \"", name,
                                                "\": segment ", segment,
                                                " is not a list index"));
      }
      path.emplace_back(index);
    } else {
      path.emplace_back(std::string(text));
    }
    ++segment;
    begin = i + 1;
  }
  // No bit past the last segment or dot.
  if ((segment < 64 && (list >> segment) != 0) ||
      (dot < 64 && (joined >> dot) != 0)) {
    return misfit();
  }
  return path;
}

void SetCompactMapping(const std::vector<WriteItem>& items,
                       const FlattenMapping& mapping, SavePlannerData* data) {
  data->list_masks.clear();
  data->joined_masks.clear();
  data->mapping.clear();
  bool any_joined = false;
  auto add_masks = [&](const std::optional<DerivedPath>& derived) {
    const uint64_t joined = derived.has_value() ? derived->joined : 0;
    if (joined != 0 && !any_joined) {
      any_joined = true;
      data->joined_masks.resize(data->list_masks.size(), 0);
    }
    data->list_masks.push_back(derived.has_value() ? derived->list
                                                   : kExplicitPath);
    if (any_joined) data->joined_masks.push_back(joined);
  };
  const bool in_order = std::is_sorted(
      items.begin(), items.end(), [](const WriteItem& a, const WriteItem& b) {
        return a.index.fqn < b.index.fqn;
      });
  if (in_order) {
    // One merge of the two name-ordered sequences: no look-ups.
    auto it = mapping.begin();
    for (size_t i = 0; i < items.size(); ++i) {
      const std::string& name = items[i].index.fqn;
      if (i > 0 && name == items[i - 1].index.fqn) continue;
      while (it != mapping.end() && it->first < name) {
        data->mapping.insert(data->mapping.end(), *it++);  // No items.
      }
      std::optional<DerivedPath> derived;
      if (it != mapping.end() && it->first == name) {
        derived = DerivePath(name, it->second);
        if (!derived.has_value())
          data->mapping.insert(data->mapping.end(), *it);
        ++it;
      }
      add_masks(derived);
    }
    data->mapping.insert(it, mapping.end());
    return;
  }
  absl::string_view previous;
  absl::flat_hash_map<absl::string_view, bool> covered;
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string& name = items[i].index.fqn;
    if (i > 0 && name == previous) continue;
    previous = name;
    auto it = mapping.find(name);
    std::optional<DerivedPath> derived;
    if (it != mapping.end()) derived = DerivePath(name, it->second);
    add_masks(derived);
    if (!derived.has_value() && it != mapping.end()) {
      data->mapping.insert(*it);
    }
    covered[name] = true;
  }
  for (const auto& entry : mapping) {
    if (!covered.contains(entry.first)) data->mapping.insert(entry);
  }
}

std::string EncodeFlattenMapping(const FlattenMapping& mapping) {
  pb::FlattenMapping proto;
  MappingToProto(mapping, proto);
  return proto.SerializeAsString();
}

absl::StatusOr<FlattenMapping> DecodeFlattenMapping(absl::string_view bytes) {
  pb::FlattenMapping proto;
  DCP_RETURN_IF_ERROR(Parse(bytes, "flatten mapping", proto));
  return MappingFromProto(proto);
}

std::string EncodeSavePlannerData(const SavePlannerData& data) {
  pb::SavePlannerData proto;
  proto.set_version(kPlanEncodingVersion);
  if (data.digest.has_value()) {
    proto.set_has_digest(true);
    proto.set_digest_high(data.digest->high);
    proto.set_digest_low(data.digest->low);
  }
  proto.set_unchanged(data.unchanged);
  proto.mutable_list_masks()->Add(data.list_masks.begin(),
                                  data.list_masks.end());
  if (!data.joined_masks.empty()) {
    proto.set_version(kJoinedMasksVersion);
    proto.mutable_joined_masks()->Add(data.joined_masks.begin(),
                                      data.joined_masks.end());
  }
  if (!data.mapping.empty())
    MappingToProto(data.mapping, *proto.mutable_mapping());
  for (const auto& [name, size] : data.unheld) {
    pb::UnheldTensor* unheld = proto.add_unheld();
    unheld->set_name(name);
    unheld->mutable_size()->Add(size.begin(), size.end());
  }
  return proto.SerializeAsString();
}

absl::StatusOr<SavePlannerData> DecodeSavePlannerData(absl::string_view bytes) {
  pb::SavePlannerData proto;
  DCP_RETURN_IF_ERROR(Parse(bytes, "save planner data", proto));
  if (proto.version() > kJoinedMasksVersion) {
    return VersionError("save planner data", proto.version(),
                        kJoinedMasksVersion);
  }
  if (proto.joined_masks_size() != 0 &&
      proto.joined_masks_size() != proto.list_masks_size()) {
    return absl::DataLossError(absl::StrCat(
        "save planner data has ", proto.joined_masks_size(),
        " joined masks for ", proto.list_masks_size(), " list masks"));
  }
  SavePlannerData data;
  if (proto.has_digest()) {
    data.digest = PlanDigest{proto.digest_high(), proto.digest_low()};
  }
  data.unchanged = proto.unchanged();
  data.list_masks.assign(proto.list_masks().begin(), proto.list_masks().end());
  data.joined_masks.assign(proto.joined_masks().begin(),
                           proto.joined_masks().end());
  if (proto.has_mapping()) {
    DCP_ASSIGN_OR_RETURN(data.mapping, MappingFromProto(proto.mapping()));
  }
  data.unheld.reserve(proto.unheld_size());
  for (const pb::UnheldTensor& unheld : proto.unheld()) {
    data.unheld.emplace_back(unheld.name(),
                             Shape(unheld.size().begin(), unheld.size().end()));
  }
  return data;
}

// ---------------------------------------------------------------------------
// Plans.

namespace {

using Int64s = ::google::protobuf::RepeatedField<int64_t>;
using Strings = ::google::protobuf::RepeatedPtrField<std::string>;

// Interns names while encoding.
class NameTable {
 public:
  explicit NameTable(Strings* out) : out_(out) {}
  uint32_t Id(const std::string& name) {
    auto [it, inserted] = ids_.try_emplace(name, out_->size());
    if (inserted) out_->Add(std::string(name));
    return it->second;
  }

 private:
  Strings* out_;
  absl::flat_hash_map<std::string, uint32_t> ids_;
};

// Resolves name references while decoding, within a copy budget.
class NameReader {
 public:
  NameReader(const Strings& names, size_t input_size)
      : names_(names), budget_(kMaxNameExpansion * input_size + 4096) {}
  absl::Status Get(uint32_t id, absl::string_view what, std::string* out) {
    if (id >= static_cast<uint32_t>(names_.size())) {
      return absl::DataLossError(
          absl::StrCat(what, " refers to name ", id, " of ", names_.size()));
    }
    const std::string& name = names_.Get(static_cast<int>(id));
    if (name.size() > budget_) {
      return absl::DataLossError(
          absl::StrCat(what, ": names expand beyond ", kMaxNameExpansion,
                       "x the encoded size; the encoding is corrupt"));
    }
    budget_ -= name.size();
    *out = name;
    return absl::OkStatus();
  }

 private:
  const Strings& names_;
  size_t budget_;
};

void PutShape(const Shape& shape, Int64s* out) {
  out->Reserve(static_cast<int>(shape.size()));
  for (int64_t d : shape) out->Add(d);
}

Shape GetShape(const Int64s& in) { return Shape(in.begin(), in.end()); }

// Index fields live in pb::Index and, inlined, in pb::WriteItem.
template <typename P>
void IndexToProto(const MetadataIndex& index, NameTable& names, P* out) {
  out->set_name(names.Id(index.fqn));
  if (index.offset.has_value()) {
    PutShape(*index.offset, out->mutable_offset());
  } else {
    out->set_no_offset(true);
  }
  if (index.index.has_value() && *index.index >= 0) {
    out->set_hint_plus_one(static_cast<uint64_t>(*index.index) + 1);
  }
}

template <typename P>
absl::Status IndexFromProto(const P& in, NameReader& names,
                            MetadataIndex* out) {
  DCP_RETURN_IF_ERROR(names.Get(in.name(), "index", &out->fqn));
  if (!in.no_offset()) {
    out->offset = GetShape(in.offset());
  } else if (in.offset_size() != 0) {
    return absl::DataLossError("index has offsets but is marked offset-free");
  }
  if (in.hint_plus_one() > static_cast<uint64_t>(INT64_MAX)) {
    return absl::DataLossError("index hint out of range");
  }
  if (in.hint_plus_one() != 0) {
    out->index = static_cast<int64_t>(in.hint_plus_one() - 1);
  }
  return absl::OkStatus();
}

template <typename Proto>
absl::Status ParseVersioned(absl::string_view bytes, absl::string_view what,
                            Proto& proto) {
  DCP_RETURN_IF_ERROR(Parse(bytes, what, proto));
  if (proto.version() == 0 || proto.version() > kPlanEncodingVersion) {
    return VersionError(what, proto.version());
  }
  return absl::OkStatus();
}

std::string TensorInfoKey(const TensorWriteData& t) {
  std::string key;
  key.push_back(static_cast<char>(t.properties.dtype));
  key.push_back(t.properties.requires_grad ? 1 : 0);
  key.push_back(t.properties.pin_memory ? 1 : 0);
  key.append(reinterpret_cast<const char*>(t.size.data()),
             t.size.size() * sizeof(int64_t));
  return key;
}

absl::StatusOr<DType> DecodeDType(uint32_t code) {
  absl::StatusOr<DType> dtype = DTypeFromCode(code);
  if (!dtype.ok()) return absl::DataLossError(dtype.status().message());
  return dtype;
}

}  // namespace

std::string EncodeSavePlan(const SavePlan& plan) {
  pb::SavePlan proto;
  proto.set_version(kPlanEncodingVersion);
  NameTable names(proto.mutable_names());
  absl::flat_hash_map<std::string, uint32_t> infos;
  proto.mutable_items()->Reserve(static_cast<int>(plan.items.size()));
  for (const WriteItem& item : plan.items) {
    pb::WriteItem* w = proto.add_items();
    IndexToProto(item.index, names, w);
    w->set_type(static_cast<uint32_t>(item.type));
    if (item.bytes_io_data.has_value()) {
      w->set_nbytes_plus_one(static_cast<uint64_t>(item.bytes_io_data->nbytes) +
                             1);
    }
    if (!item.tensor_data.has_value()) continue;
    const TensorWriteData& t = *item.tensor_data;
    auto [it, inserted] = infos.try_emplace(TensorInfoKey(t), infos.size());
    if (inserted) {
      pb::TensorInfo* info = proto.add_tensor_infos();
      info->set_dtype(static_cast<uint32_t>(t.properties.dtype));
      PutShape(t.size, info->mutable_size());
      info->set_requires_grad(t.properties.requires_grad);
      info->set_pin_memory(t.properties.pin_memory);
    }
    w->set_tensor_info_plus_one(it->second + 1);
    PutShape(t.chunk.sizes, w->mutable_chunk_sizes());
    if (!item.index.offset.has_value() ||
        *item.index.offset != t.chunk.offsets) {
      w->set_chunk_offsets_differ(true);
      PutShape(t.chunk.offsets, w->mutable_chunk_offsets());
    }
  }
  proto.set_storage_data(plan.storage_data);
  proto.set_planner_data(plan.planner_data);
  proto.set_unusable(!plan.usable);
  return proto.SerializeAsString();
}

absl::StatusOr<SavePlan> DecodeSavePlan(absl::string_view bytes) {
  pb::SavePlan proto;
  DCP_RETURN_IF_ERROR(ParseVersioned(bytes, "save plan", proto));
  NameReader names(proto.names(), bytes.size());
  std::vector<TensorWriteData> infos;
  for (const pb::TensorInfo& info : proto.tensor_infos()) {
    TensorWriteData t;
    DCP_ASSIGN_OR_RETURN(t.properties.dtype, DecodeDType(info.dtype()));
    t.properties.requires_grad = info.requires_grad();
    t.properties.pin_memory = info.pin_memory();
    t.size = GetShape(info.size());
    infos.push_back(std::move(t));
  }
  SavePlan plan;
  plan.items.reserve(proto.items_size());
  for (const pb::WriteItem& w : proto.items()) {
    WriteItem item;
    DCP_RETURN_IF_ERROR(IndexFromProto(w, names, &item.index));
    if (w.type() > static_cast<uint32_t>(WriteItemType::kBytesIO)) {
      return absl::DataLossError(
          absl::StrCat("save plan item has unknown type ", w.type()));
    }
    item.type = static_cast<WriteItemType>(w.type());
    if (w.nbytes_plus_one() != 0) {
      if (w.nbytes_plus_one() - 1 > static_cast<uint64_t>(INT64_MAX)) {
        return absl::DataLossError("save plan item size out of range");
      }
      item.bytes_io_data =
          BytesIOWriteData{static_cast<int64_t>(w.nbytes_plus_one() - 1)};
    }
    if (w.tensor_info_plus_one() != 0) {
      if (w.tensor_info_plus_one() > infos.size()) {
        return absl::DataLossError(
            absl::StrCat("save plan item refers to tensor info ",
                         w.tensor_info_plus_one() - 1, " of ", infos.size()));
      }
      TensorWriteData t = infos[w.tensor_info_plus_one() - 1];
      t.chunk.sizes = GetShape(w.chunk_sizes());
      if (w.chunk_offsets_differ()) {
        t.chunk.offsets = GetShape(w.chunk_offsets());
      } else if (item.index.offset.has_value()) {
        t.chunk.offsets = *item.index.offset;
      } else {
        return absl::DataLossError("save plan chunk has no offsets");
      }
      if (t.chunk.offsets.size() != t.size.size() ||
          t.chunk.sizes.size() != t.size.size()) {
        return absl::DataLossError(
            absl::StrCat("save plan chunk of ", item.index.ToString(),
                         " does not match its tensor's rank"));
      }
      item.tensor_data = std::move(t);
    }
    plan.items.push_back(std::move(item));
  }
  plan.storage_data = proto.storage_data();
  plan.planner_data = proto.planner_data();
  plan.usable = !proto.unusable();
  return plan;
}

namespace {

void SharesToProto(const std::vector<SharedRead>& shares, NameTable& names,
                   google::protobuf::RepeatedPtrField<pb::ReadShare>* out) {
  for (const SharedRead& s : shares) {
    pb::ReadShare* p = out->Add();
    IndexToProto(s.storage_index, names, p->mutable_storage_index());
    for (int32_t r : s.ranks) p->add_ranks(r);
  }
}

absl::Status SharesFromProto(
    const google::protobuf::RepeatedPtrField<pb::ReadShare>& in,
    NameReader& names, std::vector<SharedRead>* out) {
  for (const pb::ReadShare& p : in) {
    SharedRead s;
    DCP_RETURN_IF_ERROR(
        IndexFromProto(p.storage_index(), names, &s.storage_index));
    s.ranks.assign(p.ranks().begin(), p.ranks().end());
    out->push_back(std::move(s));
  }
  return absl::OkStatus();
}

}  // namespace

std::string EncodeLoadPlan(const LoadPlan& plan) {
  pb::LoadPlan proto;
  proto.set_version(kPlanEncodingVersion);
  NameTable names(proto.mutable_names());
  proto.mutable_items()->Reserve(static_cast<int>(plan.items.size()));
  for (const ReadItem& item : plan.items) {
    pb::ReadItem* r = proto.add_items();
    r->set_type(static_cast<uint32_t>(item.type));
    IndexToProto(item.dest_index, names, r->mutable_dest_index());
    PutShape(item.dest_offsets, r->mutable_dest_offsets());
    IndexToProto(item.storage_index, names, r->mutable_storage_index());
    PutShape(item.storage_offsets, r->mutable_storage_offsets());
    PutShape(item.lengths, r->mutable_lengths());
  }
  proto.set_storage_data(plan.storage_data);
  proto.set_planner_data(plan.planner_data);
  SharesToProto(plan.read_for_peers, names, proto.mutable_read_for_peers());
  SharesToProto(plan.received_from, names, proto.mutable_received_from());
  return proto.SerializeAsString();
}

absl::StatusOr<LoadPlan> DecodeLoadPlan(absl::string_view bytes) {
  pb::LoadPlan proto;
  DCP_RETURN_IF_ERROR(ParseVersioned(bytes, "load plan", proto));
  NameReader names(proto.names(), bytes.size());
  LoadPlan plan;
  plan.items.reserve(proto.items_size());
  for (const pb::ReadItem& r : proto.items()) {
    ReadItem item;
    if (r.type() > static_cast<uint32_t>(LoadItemType::kBytesIO)) {
      return absl::DataLossError(
          absl::StrCat("load plan item has unknown type ", r.type()));
    }
    item.type = static_cast<LoadItemType>(r.type());
    DCP_RETURN_IF_ERROR(
        IndexFromProto(r.dest_index(), names, &item.dest_index));
    DCP_RETURN_IF_ERROR(
        IndexFromProto(r.storage_index(), names, &item.storage_index));
    item.dest_offsets = GetShape(r.dest_offsets());
    item.storage_offsets = GetShape(r.storage_offsets());
    item.lengths = GetShape(r.lengths());
    if (item.dest_offsets.size() != item.lengths.size() ||
        item.storage_offsets.size() != item.lengths.size()) {
      return absl::DataLossError(
          absl::StrCat("load plan item for ", item.dest_index.ToString(),
                       " has offsets and lengths of different ranks"));
    }
    plan.items.push_back(std::move(item));
  }
  plan.storage_data = proto.storage_data();
  plan.planner_data = proto.planner_data();
  DCP_RETURN_IF_ERROR(
      SharesFromProto(proto.read_for_peers(), names, &plan.read_for_peers));
  DCP_RETURN_IF_ERROR(
      SharesFromProto(proto.received_from(), names, &plan.received_from));
  return plan;
}

}  // namespace dcp
