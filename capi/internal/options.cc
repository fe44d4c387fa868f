#include "capi/internal/options.h"

#include <map>
#include <string>

#include "core/status.h"
#include "io/metadata_format.h"

namespace dcp::capi {
namespace {

// A count or size field: 0 -> `default_value`; negative -> kInvalidArgument.
template <typename Int>
absl::StatusOr<Int> ReadCount(Int value, Int default_value, const char* field) {
  if (value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is ", value, "; it must be >= 0 (0: default)"));
  }
  return value == 0 ? default_value : value;
}

// Threads a pool may be asked for: a pool of more could not start (each
// thread maps a stack), and a pool that fails to start part-way is an error
// the caller can act on only if it is refused here.
constexpr int32_t kMaxThreadCount = 1024;

// A thread count: as ReadCount, and at most kMaxThreadCount.
absl::StatusOr<int32_t> ReadThreadCount(int32_t value, int32_t default_value,
                                        const char* field) {
  DCP_ASSIGN_OR_RETURN(int32_t n, ReadCount(value, default_value, field));
  if (n > kMaxThreadCount) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " is ", n, "; it must be at most ", kMaxThreadCount));
  }
  return n;
}

// A byte count: as ReadCount, and at most `max` (so products and
// alignments of it stay within int64).
absl::StatusOr<int64_t> ReadBytes(int64_t value, int64_t default_value,
                                  int64_t max, const char* field) {
  DCP_ASSIGN_OR_RETURN(int64_t n, ReadCount(value, default_value, field));
  if (n > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is ", n, "; it must be at most ", max));
  }
  return n;
}

absl::StatusOr<absl::Duration> ReadMilliseconds(int64_t ms,
                                                absl::Duration default_value,
                                                const char* field) {
  DCP_ASSIGN_OR_RETURN(int64_t value, ReadCount<int64_t>(ms, 0, field));
  return value == 0 ? default_value : absl::Milliseconds(value);
}

// The fqn -> file index mapping of a writer's options struct `type_name`
// (fqns and file_indices, num_mappings entries each); the fqns are copied.
absl::StatusOr<std::map<std::string, int>> ReadMapping(
    const char* const* fqns, const int32_t* file_indices, size_t num_mappings,
    const char* type_name) {
  std::map<std::string, int> out;
  if (num_mappings > 0 && (fqns == nullptr || file_indices == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat(type_name, ".num_mappings is ", num_mappings,
                     " but fqns or file_indices is NULL"));
  }
  for (size_t i = 0; i < num_mappings; ++i) {
    if (fqns[i] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(type_name, ".fqns[", i, "] is NULL"));
    }
    if (file_indices[i] < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          type_name, ".file_indices[", i, "] (for \"", fqns[i], "\") is ",
          file_indices[i], "; file indices start at 1"));
    }
    if (!out.emplace(fqns[i], file_indices[i]).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(type_name, ".fqns[", i, "] \"", fqns[i],
                       "\" appears twice in the mapping"));
    }
  }
  return out;
}

}  // namespace

absl::Status CheckStructSize(size_t struct_size, size_t size,
                             const char* type_name) {
  // Every version's size is a multiple of alignof(size_t) (struct_size
  // comes first): any other size would cut a field in two.
  if (struct_size == 0 || struct_size > size ||
      struct_size % alignof(size_t) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        type_name, ".struct_size is ", struct_size, "; set it to sizeof(",
        type_name, ") (", size,
        " in this library; smaller sizes from older headers are accepted)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ReadFlag(dcp_flag_t flag, bool default_value,
                              const char* field) {
  switch (flag) {
    case DCP_DEFAULT:
      return default_value;
    case DCP_TRUE:
      return true;
    case DCP_FALSE:
      return false;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          field, " is ", flag,
          "; a dcp_flag_t is DCP_DEFAULT (0), DCP_TRUE (1) or DCP_FALSE (-1)"));
  }
}

absl::StatusOr<FileSystemWriterOptions> WriterOptionsFromC(
    const dcp_fs_writer_options_t* options) {
  DCP_ASSIGN_OR_RETURN(dcp_fs_writer_options_t in,
                       ReadVersioned(options, "dcp_fs_writer_options_t"));
  FileSystemWriterOptions out;
  DCP_ASSIGN_OR_RETURN(
      out.single_file_per_rank,
      ReadFlag(in.single_file_per_rank, out.single_file_per_rank,
               "dcp_fs_writer_options_t.single_file_per_rank"));
  DCP_ASSIGN_OR_RETURN(out.sync_files,
                       ReadFlag(in.sync_files, out.sync_files,
                                "dcp_fs_writer_options_t.sync_files"));
  DCP_ASSIGN_OR_RETURN(out.thread_count,
                       ReadThreadCount(in.thread_count, 1,
                                       "dcp_fs_writer_options_t."
                                       "thread_count"));
  DCP_ASSIGN_OR_RETURN(out.overwrite,
                       ReadFlag(in.overwrite, out.overwrite,
                                "dcp_fs_writer_options_t.overwrite"));
  DCP_ASSIGN_OR_RETURN(
      out.per_thread_copy_ahead,
      ReadBytes(in.per_thread_copy_ahead, out.per_thread_copy_ahead,
                int64_t{1} << 40,
                "dcp_fs_writer_options_t.per_thread_copy_ahead"));
  DCP_ASSIGN_OR_RETURN(out.direct_io,
                       ReadFlag(in.direct_io, out.direct_io,
                                "dcp_fs_writer_options_t.direct_io"));
  if (in.compression != nullptr) {
    absl::StatusOr<ExtensionChain> chain = ParseCompression(in.compression);
    if (!chain.ok()) {
      return Annotate(chain.status(), "dcp_fs_writer_options_t.compression");
    }
    out.extensions = *std::move(chain);
  }
  switch (in.serialization_format) {
    case DCP_SERIALIZATION_FORMAT_NATIVE:
      out.serialization_format = SerializationFormat::kNative;
      break;
    case DCP_SERIALIZATION_FORMAT_SAFETENSORS:
      out.serialization_format = SerializationFormat::kSafetensors;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "dcp_fs_writer_options_t.serialization_format is ",
          in.serialization_format, "; expected 0 (native) or 1 (safetensors)"));
  }
  return out;
}

absl::StatusOr<FileSystemReaderOptions> ReaderOptionsFromC(
    const dcp_fs_reader_options_t* options) {
  DCP_ASSIGN_OR_RETURN(dcp_fs_reader_options_t in,
                       ReadVersioned(options, "dcp_fs_reader_options_t"));
  FileSystemReaderOptions out;
  DCP_ASSIGN_OR_RETURN(out.thread_count,
                       ReadThreadCount(in.thread_count, 1,
                                       "dcp_fs_reader_options_t."
                                       "thread_count"));
  DCP_ASSIGN_OR_RETURN(out.direct_io,
                       ReadFlag(in.direct_io, out.direct_io,
                                "dcp_fs_reader_options_t.direct_io"));
  return out;
}

absl::StatusOr<HuggingFaceStorageWriterOptions> HfWriterOptionsFromC(
    const dcp_hf_writer_options_t* options) {
  DCP_ASSIGN_OR_RETURN(dcp_hf_writer_options_t in,
                       ReadVersioned(options, "dcp_hf_writer_options_t"));
  HuggingFaceStorageWriterOptions out;
  DCP_ASSIGN_OR_RETURN(out.fqn_to_index_mapping,
                       ReadMapping(in.fqns, in.file_indices, in.num_mappings,
                                   "dcp_hf_writer_options_t"));
  DCP_ASSIGN_OR_RETURN(out.thread_count,
                       ReadThreadCount(in.thread_count, 1,
                                       "dcp_hf_writer_options_t."
                                       "thread_count"));
  DCP_ASSIGN_OR_RETURN(out.save_distributed,
                       ReadFlag(in.save_distributed, out.save_distributed,
                                "dcp_hf_writer_options_t.save_distributed"));
  DCP_ASSIGN_OR_RETURN(
      out.enable_consolidation,
      ReadFlag(in.enable_consolidation, out.enable_consolidation,
               "dcp_hf_writer_options_t.enable_consolidation"));
  DCP_ASSIGN_OR_RETURN(
      out.thread_count_consolidation,
      ReadThreadCount(in.thread_count_consolidation, 1,
                      "dcp_hf_writer_options_t.thread_count_consolidation"));
  DCP_ASSIGN_OR_RETURN(out.sync_files,
                       ReadFlag(in.sync_files, out.sync_files,
                                "dcp_hf_writer_options_t.sync_files"));
  DCP_ASSIGN_OR_RETURN(out.direct_io,
                       ReadFlag(in.direct_io, out.direct_io,
                                "dcp_hf_writer_options_t.direct_io"));
  DCP_ASSIGN_OR_RETURN(
      out.consolidation_buffer_bytes,
      ReadCount<int64_t>(in.consolidation_buffer_bytes,
                         out.consolidation_buffer_bytes,
                         "dcp_hf_writer_options_t.consolidation_buffer_bytes"));
  return out;
}

absl::StatusOr<StagingOptions> StagingOptionsFromC(
    const dcp_stager_options_t* options) {
  DCP_ASSIGN_OR_RETURN(dcp_stager_options_t in,
                       ReadVersioned(options, "dcp_stager_options_t"));
  StagingOptions out;
  const struct {
    dcp_flag_t flag;
    bool* field;
    const char* name;
  } flags[] = {
      {in.use_pinned_memory, &out.use_pinned_memory,
       "dcp_stager_options_t.use_pinned_memory"},
      {in.use_shared_memory, &out.use_shared_memory,
       "dcp_stager_options_t.use_shared_memory"},
      {in.use_async_staging, &out.use_async_staging,
       "dcp_stager_options_t.use_async_staging"},
      {in.use_non_blocking_copy, &out.use_non_blocking_copy,
       "dcp_stager_options_t.use_non_blocking_copy"},
      {in.cache_staged_state_dict, &out.cache_staged_state_dict,
       "dcp_stager_options_t.cache_staged_state_dict"},
      {in.copy_on_write, &out.copy_on_write,
       "dcp_stager_options_t.copy_on_write"},
  };
  for (const auto& f : flags) {
    DCP_ASSIGN_OR_RETURN(*f.field, ReadFlag(f.flag, *f.field, f.name));
  }
  return out;
}

absl::StatusOr<HuggingFaceStorageReaderOptions> HfReaderOptionsFromC(
    const dcp_hf_reader_options_t* options) {
  DCP_ASSIGN_OR_RETURN(dcp_hf_reader_options_t in,
                       ReadVersioned(options, "dcp_hf_reader_options_t"));
  HuggingFaceStorageReaderOptions out;
  DCP_ASSIGN_OR_RETURN(out.thread_count,
                       ReadThreadCount(in.thread_count, 1,
                                       "dcp_hf_reader_options_t."
                                       "thread_count"));
  DCP_ASSIGN_OR_RETURN(out.direct_io,
                       ReadFlag(in.direct_io, out.direct_io,
                                "dcp_hf_reader_options_t.direct_io"));
  DCP_ASSIGN_OR_RETURN(
      out.read_window_bytes,
      ReadCount<int64_t>(in.read_window_bytes, out.read_window_bytes,
                         "dcp_hf_reader_options_t.read_window_bytes"));
  return out;
}

absl::StatusOr<QuantizedHuggingFaceStorageReaderOptions>
HfQuantizedReaderOptionsFromC(
    const dcp_hf_quantized_reader_options_t* options) {
  DCP_ASSIGN_OR_RETURN(
      dcp_hf_quantized_reader_options_t in,
      ReadVersioned(options, "dcp_hf_quantized_reader_options_t"));
  QuantizedHuggingFaceStorageReaderOptions out;
  DCP_ASSIGN_OR_RETURN(
      out.thread_count,
      ReadThreadCount(in.thread_count, 1,
                      "dcp_hf_quantized_reader_options_t.thread_count"));
  switch (in.target_dtype) {
    case 0:
      break;
    case DCP_DTYPE_F32:
    case DCP_DTYPE_BF16:
    case DCP_DTYPE_F16:
      out.target_dtype = static_cast<DType>(in.target_dtype);
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "dcp_hf_quantized_reader_options_t.target_dtype is ", in.target_dtype,
          "; quantized weights load as DCP_DTYPE_F32 (0: default), "
          "DCP_DTYPE_BF16 or DCP_DTYPE_F16"));
  }
  DCP_ASSIGN_OR_RETURN(
      out.block_size,
      ReadCount<int64_t>(in.block_size, out.block_size,
                         "dcp_hf_quantized_reader_options_t.block_size"));
  return out;
}

absl::StatusOr<MegaStorageWriterOptions> MegaWriterOptionsFromC(
    const dcp_mega_writer_options_t* options) {
  DCP_ASSIGN_OR_RETURN(dcp_mega_writer_options_t in,
                       ReadVersioned(options, "dcp_mega_writer_options_t"));
  MegaStorageWriterOptions out;
  DCP_ASSIGN_OR_RETURN(out.fqn_to_index_mapping,
                       ReadMapping(in.fqns, in.file_indices, in.num_mappings,
                                   "dcp_mega_writer_options_t"));
  DCP_ASSIGN_OR_RETURN(
      out.thread_count,
      ReadThreadCount(in.thread_count, 1,
                      "dcp_mega_writer_options_t.thread_count"));
  DCP_ASSIGN_OR_RETURN(
      out.checksum_block_size,
      ReadBytes(in.checksum_block_size, out.checksum_block_size,
                kMaxChecksumBlockSize,
                "dcp_mega_writer_options_t.checksum_block_size"));
  if (out.checksum_block_size % 4096 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dcp_mega_writer_options_t.checksum_block_size is ",
        out.checksum_block_size, "; it must be a multiple of 4096"));
  }
  DCP_ASSIGN_OR_RETURN(out.sync_files,
                       ReadFlag(in.sync_files, out.sync_files,
                                "dcp_mega_writer_options_t.sync_files"));
  DCP_ASSIGN_OR_RETURN(out.direct_io,
                       ReadFlag(in.direct_io, out.direct_io,
                                "dcp_mega_writer_options_t.direct_io"));
  return out;
}

absl::StatusOr<MegaStorageReaderOptions> MegaReaderOptionsFromC(
    const dcp_mega_reader_options_t* options) {
  DCP_ASSIGN_OR_RETURN(dcp_mega_reader_options_t in,
                       ReadVersioned(options, "dcp_mega_reader_options_t"));
  MegaStorageReaderOptions out;
  DCP_ASSIGN_OR_RETURN(
      out.thread_count,
      ReadThreadCount(in.thread_count, 1,
                      "dcp_mega_reader_options_t.thread_count"));
  DCP_ASSIGN_OR_RETURN(out.direct_io,
                       ReadFlag(in.direct_io, out.direct_io,
                                "dcp_mega_reader_options_t.direct_io"));
  return out;
}

absl::StatusOr<DefaultSavePlannerOptions> SavePlannerOptionsFromC(
    const dcp_save_planner_options_t* options, bool require_full_coverage) {
  DCP_ASSIGN_OR_RETURN(dcp_save_planner_options_t in,
                       ReadVersioned(options, "dcp_save_planner_options_t"));
  DefaultSavePlannerOptions out;
  DCP_ASSIGN_OR_RETURN(
      out.flatten_state_dict,
      ReadFlag(in.flatten_state_dict, out.flatten_state_dict,
               "dcp_save_planner_options_t.flatten_state_dict"));
  DCP_ASSIGN_OR_RETURN(
      out.flatten_sharded_tensors,
      ReadFlag(in.flatten_sharded_tensors, out.flatten_sharded_tensors,
               "dcp_save_planner_options_t.flatten_sharded_tensors"));
  DCP_ASSIGN_OR_RETURN(
      out.dedup_save_to_lowest_rank,
      ReadFlag(in.dedup_save_to_lowest_rank, out.dedup_save_to_lowest_rank,
               "dcp_save_planner_options_t.dedup_save_to_lowest_rank"));
  DCP_ASSIGN_OR_RETURN(
      out.enable_plan_caching,
      ReadFlag(in.enable_plan_caching, out.enable_plan_caching,
               "dcp_save_planner_options_t.enable_plan_caching"));
  out.require_full_coverage = require_full_coverage;
  return out;
}

absl::StatusOr<DefaultLoadPlannerOptions> LoadPlannerOptionsFromC(
    const dcp_load_planner_options_t* options) {
  DCP_ASSIGN_OR_RETURN(dcp_load_planner_options_t in,
                       ReadVersioned(options, "dcp_load_planner_options_t"));
  DefaultLoadPlannerOptions out;
  DCP_ASSIGN_OR_RETURN(
      out.flatten_state_dict,
      ReadFlag(in.flatten_state_dict, out.flatten_state_dict,
               "dcp_load_planner_options_t.flatten_state_dict"));
  DCP_ASSIGN_OR_RETURN(
      out.flatten_sharded_tensors,
      ReadFlag(in.flatten_sharded_tensors, out.flatten_sharded_tensors,
               "dcp_load_planner_options_t.flatten_sharded_tensors"));
  DCP_ASSIGN_OR_RETURN(
      out.allow_partial_load,
      ReadFlag(in.allow_partial_load, out.allow_partial_load,
               "dcp_load_planner_options_t.allow_partial_load"));
  DCP_ASSIGN_OR_RETURN(out.convert_dtypes,
                       ReadFlag(in.convert_dtypes, out.convert_dtypes,
                                "dcp_load_planner_options_t.convert_dtypes"));
  return out;
}

absl::StatusOr<comm::ProcessGroupOptions> ProcessGroupOptionsFromC(
    const dcp_process_group_options_t* options) {
  DCP_ASSIGN_OR_RETURN(dcp_process_group_options_t in,
                       ReadVersioned(options, "dcp_process_group_options_t"));
  comm::ProcessGroupOptions out;
  if (in.backend != nullptr) {
    DCP_ASSIGN_OR_RETURN(out.backend, comm::ParseBackend(in.backend));
  }
  if (in.group_name != nullptr) {
    if (in.group_name[0] == '\0') {
      return absl::InvalidArgumentError(
          "dcp_process_group_options_t.group_name is empty; pass NULL for "
          "the default \"dcp-checkpoint\"");
    }
    out.group_name = in.group_name;
  }
  DCP_ASSIGN_OR_RETURN(
      out.timeout, ReadMilliseconds(in.timeout_ms, out.timeout,
                                    "dcp_process_group_options_t.timeout_ms"));
  DCP_ASSIGN_OR_RETURN(
      out.connect_timeout,
      ReadMilliseconds(in.connect_timeout_ms, out.connect_timeout,
                       "dcp_process_group_options_t.connect_timeout_ms"));
  DCP_ASSIGN_OR_RETURN(
      out.cuda_device,
      ReadCount<int32_t>(in.cuda_device, -1,
                         "dcp_process_group_options_t.cuda_device"));
  return out;
}

absl::StatusOr<DeviceWait> DeviceWaitFromC(const dcp_device_wait_t& wait) {
  if (wait.device < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dcp_device_wait_t.device is ", wait.device, "; it must be >= 0"));
  }
  switch (wait.kind) {
    case DCP_DEVICE_WAIT_NONE:
      return DeviceWait{};
    case DCP_DEVICE_WAIT_STREAM:
      return DeviceWait::Stream(wait.device, wait.handle);
    case DCP_DEVICE_WAIT_EVENT:
      if (wait.handle == nullptr) {
        return absl::InvalidArgumentError(
            "dcp_device_wait_t of kind DCP_DEVICE_WAIT_EVENT has a NULL "
            "event");
      }
      return DeviceWait::Event(wait.device, wait.handle);
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "dcp_device_wait_t.kind is ", wait.kind,
          "; use DCP_DEVICE_WAIT_NONE (0), _STREAM (1) or _EVENT (2)"));
  }
}

}  // namespace dcp::capi
