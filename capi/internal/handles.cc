#include "capi/internal/handles.h"

#include <utility>
#include <variant>

dcp_metadata::dcp_metadata(dcp::Metadata metadata_in)
    : metadata(std::move(metadata_in)) {
  items.reserve(metadata.state_dict_metadata.size());
  for (const auto& [name, entry] : metadata.state_dict_metadata) {
    const auto mapped = metadata.flatten_mapping.find(name);
    items.push_back(MetadataItem{
        &name, std::get_if<dcp::TensorStorageMetadata>(&entry),
        mapped != metadata.flatten_mapping.end() ? mapped->second
                                                 : dcp::ObjectPath{name}});
  }
  storage.reserve(metadata.storage_data.size());
  for (const auto& entry : metadata.storage_data) storage.push_back(&entry);
  if (metadata.storage_meta.has_value()) {
    checkpoint_id = metadata.storage_meta->checkpoint_id;
    save_id = metadata.storage_meta->save_id;
  }
}
