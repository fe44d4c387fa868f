/* dcp/dcp.h: the C ABI of dcp, the one door for every language other than
 * C++ (the Python package binds it through ctypes).
 *
 * Conventions (those of the C APIs that last: XGBoost's c_api.h, the CUDA
 * driver API):
 * - Handles are opaque pointers made by dcp_*_create (or returned by a call)
 *   and released by the matching dcp_*_free. Every call checks its handles:
 *   NULL, or a pointer that is not a live handle of the right type, gives
 *   DCP_INVALID_ARGUMENT (never a crash). As with free(3), a freed handle
 *   must not be used again (its address may already belong to a new
 *   handle), nor freed while another thread is in a call on it. Freeing
 *   NULL is a no-op that returns DCP_OK.
 * - Every call returns a status code (dcp_status_t, the numbers of
 *   absl::StatusCode). A call that fails records the calling thread's last
 *   error (code, message, per-rank failures), readable with
 *   dcp_last_error_*() until the next failing call on that thread. A call
 *   that succeeds leaves it alone. No exception crosses this boundary. A
 *   call that fails sets its handle outputs (T** out) to NULL, so freeing
 *   them afterwards is a no-op; its other outputs are unspecified.
 * - Option structs are versioned: the caller zero-initialises the whole
 *   struct (memset, padding included), sets struct_size = sizeof(the
 *   struct) and the fields it wants. Zero means
 *   the default in every field. A struct_size of 0 or larger than the
 *   library's struct of that name is DCP_INVALID_ARGUMENT; a smaller one (a
 *   caller compiled against an older header) gets defaults for the fields
 *   it lacks. A NULL options pointer means all defaults. `T o = {0};`
 *   clears padding in C11 and later (memset in C99 and C++ aggregate
 *   code that assigns fields one by one): two fields
 *   (dcp_load_planner_options_t.convert_dtypes,
 *   dcp_stager_options_t.copy_on_write) lie where the struct's first
 *   version had tail padding, so stray bytes there would set them. Fields
 *   added from now on go at the end and grow sizeof.
 * - Tri-state flags (dcp_flag_t): DCP_DEFAULT (0) keeps the seed's default,
 *   DCP_TRUE / DCP_FALSE set it.
 * - Strings passed in are NUL-terminated UTF-8 and copied before the call
 *   returns. Strings and arrays returned by a getter stay valid until the
 *   handle they came from is freed or changed; returned error strings until
 *   the next failing call on the thread.
 * - Thread safety: calls on different handles may run concurrently. A
 *   state dict, writer, reader or planner handle serves one save or load at
 *   a time.
 * - fork(2): a child of a process that has called into libdcp cannot use it
 *   (the library's threads stayed in the parent): every call there fails
 *   with DCP_FAILED_PRECONDITION and does nothing. Fork before the first
 *   call, or start workers with exec (Python: spawn or forkserver).
 *
 * Tensors cross as DLPack (DLTensor, DLManagedTensor, and the versioned
 * DLManagedTensorVersioned of DLPack >= 1.0): host (kDLCPU, kDLCUDAHost) or
 * CUDA (kDLCUDA) memory, strided or not. dtypes: bool, [u]int8..64,
 * float16, bfloat16, float32, float64, complex32, complex64, complex128,
 * the float8 codes of DLPack 1.1 (kDLFloat8_e4m3fn = 10,
 * kDLFloat8_e4m3fnuz = 11, kDLFloat8_e5m2 = 12, kDLFloat8_e5m2fnuz = 13,
 * kDLFloat8_e8m0fnu = 14; lanes 1, 8 bits) and packed float4
 * (kDLFloat4_e2m1fn = 17, 4 bits, lanes 2: torch.float4_e2m1fn_x2, one
 * element per byte). Any other dtype or device is DCP_INVALID_ARGUMENT
 * naming the tensor's path. bool is DLPack's kDLBool = 6 (lanes 1, 8
 * bits); a DLPack header before 0.8 (Debian 12's libdlpack-dev is 0.6)
 * lacks that name and the versioned struct, so a caller built against it
 * writes 6 for the code and passes only DLTensor / DLManagedTensor; use a
 * DLPack >= 1.0 header for dcp_state_dict_set_dlpack_versioned.
 */
#ifndef DCP_DCP_H_
#define DCP_DCP_H_

#include <dlpack/dlpack.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define DCP_API __attribute__((visibility("default")))
#else
#define DCP_API
#endif

/* ------------------------------------------------------------------------
 * Version
 * ---------------------------------------------------------------------- */

#define DCP_VERSION_MAJOR 0
#define DCP_VERSION_MINOR 1
#define DCP_VERSION_PATCH 0

/* The library's semantic version, "MAJOR.MINOR.PATCH". Static storage. */
DCP_API const char* dcp_version(void);

/* ------------------------------------------------------------------------
 * Status codes and the last error
 * ---------------------------------------------------------------------- */

/* The values of absl::StatusCode, one to one. */
typedef enum dcp_status {
  DCP_OK = 0,
  DCP_CANCELLED = 1,
  DCP_UNKNOWN = 2,
  DCP_INVALID_ARGUMENT = 3,
  DCP_DEADLINE_EXCEEDED = 4,
  DCP_NOT_FOUND = 5,
  DCP_ALREADY_EXISTS = 6,
  DCP_PERMISSION_DENIED = 7,
  DCP_RESOURCE_EXHAUSTED = 8,
  DCP_FAILED_PRECONDITION = 9,
  DCP_ABORTED = 10,
  DCP_OUT_OF_RANGE = 11,
  DCP_UNIMPLEMENTED = 12,
  DCP_INTERNAL = 13,
  DCP_UNAVAILABLE = 14,
  DCP_DATA_LOSS = 15,
  DCP_UNAUTHENTICATED = 16
} dcp_status_t;

/* "OK", "INVALID_ARGUMENT", ...; "UNKNOWN_CODE" for other values. Static
 * storage. */
DCP_API const char* dcp_status_name(int code);

/* The code and message of the calling thread's last failed call (DCP_OK and
 * "" when none failed yet). */
DCP_API int dcp_last_error_code(void);
DCP_API const char* dcp_last_error_message(void);

/* A failed save or load of several ranks (the seed's CheckpointException)
 * lists each failing rank: its rank, code and message. 0 failures for an
 * error of this process alone. `index` out of range: DCP_OUT_OF_RANGE (and
 * a NULL output DCP_INVALID_ARGUMENT); these four readers never record an
 * error themselves, so the error being read stays. */
DCP_API size_t dcp_last_error_num_rank_failures(void);
DCP_API int dcp_last_error_rank_failure(size_t index, int32_t* rank, int* code,
                                        const char** message);

/* ------------------------------------------------------------------------
 * Common types
 * ---------------------------------------------------------------------- */

typedef int32_t dcp_flag_t;
#define DCP_DEFAULT 0
#define DCP_TRUE 1
#define DCP_FALSE (-1)

/* Element types, numbered as dcp stores them (docs/FORMAT.md). */
typedef enum dcp_dtype {
  DCP_DTYPE_BOOL = 0,
  DCP_DTYPE_U8 = 1,
  DCP_DTYPE_I8 = 2,
  DCP_DTYPE_U16 = 3,
  DCP_DTYPE_I16 = 4,
  DCP_DTYPE_U32 = 5,
  DCP_DTYPE_I32 = 6,
  DCP_DTYPE_U64 = 7,
  DCP_DTYPE_I64 = 8,
  DCP_DTYPE_F16 = 9,
  DCP_DTYPE_BF16 = 10,
  DCP_DTYPE_F32 = 11,
  DCP_DTYPE_F64 = 12,
  DCP_DTYPE_F8_E4M3 = 13,
  DCP_DTYPE_F8_E5M2 = 14,
  DCP_DTYPE_C64 = 15,
  DCP_DTYPE_C128 = 16,
  DCP_DTYPE_F8_E4M3FNUZ = 17,
  DCP_DTYPE_F8_E5M2FNUZ = 18,
  DCP_DTYPE_F8_E8M0 = 19,    /* float8_e8m0fnu */
  DCP_DTYPE_F4_E2M1_X2 = 20, /* two float4_e2m1fn per byte */
  DCP_DTYPE_C32 = 21         /* complex32 */
} dcp_dtype_t;

/* The safetensors name of a dtype ("F32", "BF16", "F8_E4M3"); NULL for an
 * unknown value. Static storage. */
DCP_API const char* dcp_dtype_name(int dtype);

/* The kinds of state-dict leaves. */
typedef enum dcp_value_kind {
  DCP_VALUE_NONE = 0,
  DCP_VALUE_TENSOR = 1,
  DCP_VALUE_SHARDED_TENSOR = 2,
  DCP_VALUE_INT = 3,
  DCP_VALUE_FLOAT = 4,
  DCP_VALUE_BOOL = 5,
  DCP_VALUE_STRING = 6,
  DCP_VALUE_BYTES = 7
} dcp_value_kind_t;

/* One step of a path from the root of a state dict: a map key (key !=
 * NULL) or a list index (key == NULL, index >= 0); the first step is a key.
 * Lists grow to fit the indices set; unset list elements are None, and a
 * None on the way of a path becomes the map or list the path needs. */
typedef struct dcp_path_elem {
  const char* key;
  int64_t index;
} dcp_path_elem_t;

typedef struct dcp_path {
  const dcp_path_elem_t* elems;
  size_t len; /* >= 1 */
} dcp_path_t;

/* Device work to order against (the stream rule, engine/checkpoint.h).
 * kind DCP_DEVICE_WAIT_STREAM: the caller's stream (a cudaStream_t; NULL is
 * the legacy default stream, torch's default); DCP_DEVICE_WAIT_EVENT: a
 * cudaEvent_t the caller recorded. dcp's copy streams wait on the device;
 * the host never blocks for it. */
typedef enum dcp_device_wait_kind {
  DCP_DEVICE_WAIT_NONE = 0,
  DCP_DEVICE_WAIT_STREAM = 1,
  DCP_DEVICE_WAIT_EVENT = 2
} dcp_device_wait_kind_t;

typedef struct dcp_device_wait {
  int32_t kind;   /* dcp_device_wait_kind_t */
  int32_t device; /* CUDA ordinal */
  void* handle;   /* cudaStream_t or cudaEvent_t; not owned */
} dcp_device_wait_t;

/* ------------------------------------------------------------------------
 * Handles
 * ---------------------------------------------------------------------- */

typedef struct dcp_state_dict dcp_state_dict_t;
typedef struct dcp_metadata dcp_metadata_t;
typedef struct dcp_storage_writer dcp_storage_writer_t;
typedef struct dcp_storage_reader dcp_storage_reader_t;
typedef struct dcp_process_group dcp_process_group_t;
typedef struct dcp_async_save dcp_async_save_t;
typedef struct dcp_stager dcp_stager_t;
typedef struct dcp_host_snapshot dcp_host_snapshot_t;

/* ------------------------------------------------------------------------
 * State dicts
 *
 * A state dict holds nested maps and lists whose leaves are tensors,
 * sharded tensors (this rank's chunks of a global tensor) or plain values.
 * Setting a leaf replaces what was at its path (creating the maps and lists
 * on the way; a path through an existing leaf, or using a map as a list, is
 * DCP_INVALID_ARGUMENT). Tensors given as DLTensor are borrowed: their
 * memory must stay valid and, for a save, unchanged until the save returns
 * (for dcp_async_save: until its staging completes); a load writes into it.
 * Managed DLPack tensors are owned by the state dict from the call on
 * (their deleter runs once nothing uses the memory: when the state dict is
 * freed or the leaf replaced, or at once on error; later, on a dcp thread,
 * while an async save still stages or uploads from it, or an export of it
 * lives). In a forked child, where every call fails, the call takes no
 * ownership: the caller still owns the tensor.
 * ---------------------------------------------------------------------- */

DCP_API int dcp_state_dict_create(dcp_state_dict_t** out);
DCP_API int dcp_state_dict_free(dcp_state_dict_t* sd);

/* This rank's chunk of a sharded tensor: the global shape and where the
 * chunk starts in it (ndim entries each; ndim equals the chunk's). */
typedef struct dcp_shard {
  int32_t ndim;
  const int64_t* global_shape;
  const int64_t* offsets;
} dcp_shard_t;

/* Sets one tensor leaf. `shard` NULL: a plain tensor; else a sharded tensor
 * with this one local chunk. */
DCP_API int dcp_state_dict_set_tensor(dcp_state_dict_t* sd, dcp_path_t path,
                                      const DLTensor* tensor,
                                      const dcp_shard_t* shard);

/* Sets n tensor leaves in one call: paths[i] gets tensors[i], sharded as
 * shards[i] when `shards` is not NULL and shards[i].ndim > 0 (ndim 0 with
 * global_shape NULL means a plain tensor; 0-d sharded tensors do not
 * exist). Fails on the first bad entry with its path in the message; the
 * entries before it stay set. */
DCP_API int dcp_state_dict_set_tensors(dcp_state_dict_t* sd, size_t n,
                                       const dcp_path_t* paths,
                                       const DLTensor* tensors,
                                       const dcp_shard_t* shards);

/* A sharded tensor with several local chunks: chunks[i] starts at
 * offsets[i] (global_ndim entries) in the global shape. num_chunks >= 1
 * (the chunks give the dtype). */
DCP_API int dcp_state_dict_set_sharded_tensor(
    dcp_state_dict_t* sd, dcp_path_t path, int32_t global_ndim,
    const int64_t* global_shape, size_t num_chunks, const DLTensor* chunks,
    const int64_t* const* offsets);

/* Managed DLPack tensors (ownership moves to the state dict). A versioned
 * tensor flagged read-only (DLPACK_FLAG_BITMASK_READ_ONLY) can be saved;
 * a load into it is DCP_INVALID_ARGUMENT naming it. A versioned tensor of
 * a major version other than 1 is DCP_INVALID_ARGUMENT. */
DCP_API int dcp_state_dict_set_dlpack(dcp_state_dict_t* sd, dcp_path_t path,
                                      DLManagedTensor* tensor,
                                      const dcp_shard_t* shard);
struct DLManagedTensorVersioned;
DCP_API int dcp_state_dict_set_dlpack_versioned(
    dcp_state_dict_t* sd, dcp_path_t path,
    struct DLManagedTensorVersioned* tensor, const dcp_shard_t* shard);

/* Marks the n tensor leaves at paths[i] as tensors that require grad (the
 * seed's TensorProperties.requires_grad, read off a torch parameter): the
 * next save records it in the metadata, and dcp_item_info_t.requires_grad
 * reports it. Leaves set without a mark (and a leaf set again later) are
 * recorded as not requiring grad. A path that holds no tensor or sharded
 * tensor is DCP_INVALID_ARGUMENT naming it; the entries before it stay
 * marked. */
DCP_API int dcp_state_dict_mark_requires_grad(dcp_state_dict_t* sd, size_t n,
                                              const dcp_path_t* paths);

DCP_API int dcp_state_dict_set_none(dcp_state_dict_t* sd, dcp_path_t path);
DCP_API int dcp_state_dict_set_int(dcp_state_dict_t* sd, dcp_path_t path,
                                   int64_t value);
DCP_API int dcp_state_dict_set_float(dcp_state_dict_t* sd, dcp_path_t path,
                                     double value);
DCP_API int dcp_state_dict_set_bool(dcp_state_dict_t* sd, dcp_path_t path,
                                    int32_t value);
/* `size` bytes of UTF-8 (may hold NULs). */
DCP_API int dcp_state_dict_set_string(dcp_state_dict_t* sd, dcp_path_t path,
                                      const char* data, size_t size);
DCP_API int dcp_state_dict_set_bytes(dcp_state_dict_t* sd, dcp_path_t path,
                                     const void* data, size_t size);

/* A leaf as the state dict holds it (after a load: the loaded value).
 * Tensor leaves report dtype, ndim and shape; sharded tensors the global
 * shape. `data`/`size` hold string and bytes values. */
typedef struct dcp_leaf_info {
  size_t struct_size;
  int32_t kind; /* dcp_value_kind_t */
  int64_t int_value;
  double float_value;
  int32_t bool_value;
  const char* data;
  size_t size;
  int32_t dtype; /* dcp_dtype_t, tensors */
  int32_t ndim;
  const int64_t* shape;
} dcp_leaf_info_t;

/* The leaf at `path`: DCP_NOT_FOUND naming the path when there is none,
 * DCP_INVALID_ARGUMENT when the path ends at a map or list. */
DCP_API int dcp_state_dict_get(const dcp_state_dict_t* sd, dcp_path_t path,
                               dcp_leaf_info_t* out);

/* Leaves in flattened-name order ("model.layers.0.weight"): their count,
 * and the flattened name and value of leaf `index`. */
DCP_API int dcp_state_dict_num_leaves(const dcp_state_dict_t* sd, size_t* out);
DCP_API int dcp_state_dict_leaf(const dcp_state_dict_t* sd, size_t index,
                                const char** name, dcp_leaf_info_t* out);

/* Tensor leaves of `sd` whose dtype differs from that of the tensor of the
 * same flattened name in the checkpoint metadata `md` (what a load of `sd`
 * refuses with DCP_INVALID_ARGUMENT): how many into `*count`, and the first
 * `capacity` of their leaf indices (dcp_state_dict_leaf order) into
 * `indices` and the checkpoint's dtypes (dcp_dtype_t) into `saved_dtypes`
 * (either may be NULL). Leaves the checkpoint lacks or holds as a plain
 * value do not count. A caller that converts on load loads these leaves
 * into tensors of the saved dtypes, then converts them itself. */
DCP_API int dcp_state_dict_dtype_mismatches(const dcp_state_dict_t* sd,
                                            const dcp_metadata_t* md,
                                            size_t capacity, size_t* indices,
                                            int32_t* saved_dtypes,
                                            size_t* count);

/* Exports the tensor leaf at `path` as DLPack, sharing its memory. A leaf
 * set from a managed tensor (dcp_state_dict_set_dlpack*) stays alive until
 * the export's deleter is called too; a borrowed one (set_tensor) stays
 * the caller's to keep alive. DCP_INVALID_ARGUMENT for a leaf set
 * read-only (the legacy DLManagedTensor has no flag to say so). */
DCP_API int dcp_state_dict_get_dlpack(const dcp_state_dict_t* sd,
                                      dcp_path_t path, DLManagedTensor** out);

/* ------------------------------------------------------------------------
 * Storage: the file-system writer and reader
 *
 * Every thread_count field of the options below takes 0 (its default) up
 * to 1024; more is DCP_INVALID_ARGUMENT at create.
 * ---------------------------------------------------------------------- */

typedef struct dcp_fs_writer_options {
  size_t struct_size;
  dcp_flag_t single_file_per_rank; /* default true */
  dcp_flag_t sync_files;           /* default true */
  int32_t thread_count;            /* 0: 1 */
  dcp_flag_t overwrite;            /* default true */
  int64_t per_thread_copy_ahead;   /* bytes, <= 2^40; 0: the default */
  dcp_flag_t direct_io;            /* default true */
  /* NULL or "none": tensors stored as they are; "zstd" or "zstd:LEVEL":
   * host tensors over 64 KiB compressed block by block (docs/FORMAT.md
   * section 3.1; loads decode it with no option). */
  const char* compression;
  /* A dcp_serialization_format_t; 0 (and an older, smaller struct): the
   * native format. SAFETENSORS: every data file is also a valid
   * safetensors file (docs/FORMAT.md section 2.1), written buffered;
   * combined with compression the save fails with DCP_INVALID_ARGUMENT. */
  int32_t serialization_format;
} dcp_fs_writer_options_t;

typedef enum dcp_serialization_format {
  DCP_SERIALIZATION_FORMAT_NATIVE = 0,
  DCP_SERIALIZATION_FORMAT_SAFETENSORS = 1,
} dcp_serialization_format_t;

DCP_API int dcp_fs_writer_create(const char* path,
                                 const dcp_fs_writer_options_t* options,
                                 dcp_storage_writer_t** out);
DCP_API int dcp_storage_writer_free(dcp_storage_writer_t* writer);

typedef struct dcp_fs_reader_options {
  size_t struct_size;
  int32_t thread_count; /* 0: 1 */
  dcp_flag_t direct_io; /* default true */
} dcp_fs_reader_options_t;

DCP_API int dcp_fs_reader_create(const char* path,
                                 const dcp_fs_reader_options_t* options,
                                 dcp_storage_reader_t** out);
DCP_API int dcp_storage_reader_free(dcp_storage_reader_t* reader);

/* ------------------------------------------------------------------------
 * Storage: Hugging Face directories (safetensors files and
 * model.safetensors.index.json; docs/FORMAT.md section 7)
 *
 * The seed's HuggingFaceStorageWriter / HuggingFaceStorageReader. Their
 * handles are ordinary dcp_storage_writer_t / dcp_storage_reader_t, freed
 * with dcp_storage_writer_free / dcp_storage_reader_free and passed to
 * dcp_save / dcp_load as storage_writer / storage_reader.
 * ---------------------------------------------------------------------- */

typedef struct dcp_hf_writer_options {
  size_t struct_size;
  /* The seed's fqn_to_index_mapping: tensor fqns[i] goes to the 1-based
   * file file_indices[i] (model-0000I-of-0000N.safetensors). Both arrays
   * have num_mappings entries; num_mappings 0 puts every tensor in one
   * file. With a mapping, a saved tensor it lacks fails the save. */
  const char* const* fqns;
  const int32_t* file_indices;
  size_t num_mappings;
  int32_t thread_count;               /* 0: 1 */
  dcp_flag_t save_distributed;        /* default false */
  dcp_flag_t enable_consolidation;    /* default false */
  int32_t thread_count_consolidation; /* 0: 1 */
  dcp_flag_t sync_files;              /* default true */
  dcp_flag_t direct_io;               /* default true */
  int64_t consolidation_buffer_bytes; /* 0: 256 MiB */
} dcp_hf_writer_options_t;

/* A writer of Hugging Face checkpoints into directory `path`. A save
 * through it fails with DCP_INVALID_ARGUMENT naming the value for what
 * safetensors cannot hold: a non-tensor value, a complex128 tensor, a
 * tensor the mapping lacks. DCP_INVALID_ARGUMENT here for a bad option (a
 * file index below 1, a NULL or duplicate fqn, a negative count). */
DCP_API int dcp_hf_writer_create(const char* path,
                                 const dcp_hf_writer_options_t* options,
                                 dcp_storage_writer_t** out);

typedef struct dcp_hf_reader_options {
  size_t struct_size;
  int32_t thread_count;      /* 0: 1 */
  dcp_flag_t direct_io;      /* default true */
  int64_t read_window_bytes; /* 0: 64 MiB */
} dcp_hf_reader_options_t;

/* A reader of the Hugging Face checkpoint in directory `path` (one
 * model.safetensors, an index naming several files, or the sharded/ files
 * of a distributed save), with resharding. Malformed files fail the load
 * with DCP_DATA_LOSS naming the file. */
DCP_API int dcp_hf_reader_create(const char* path,
                                 const dcp_hf_reader_options_t* options,
                                 dcp_storage_reader_t** out);

typedef struct dcp_hf_quantized_reader_options {
  size_t struct_size;
  int32_t thread_count; /* 0: 1 */
  /* dcp_dtype_t the quantized weights load as: DCP_DTYPE_F32, _BF16 or
   * _F16; 0 (a zeroed struct): DCP_DTYPE_F32. */
  int32_t target_dtype;
  /* The scales' tile edge; 0: config.json's quantization_config
   * .weight_block_size ([edge, edge]) when it has one, else 128. */
  int64_t block_size;
} dcp_hf_quantized_reader_options_t;

/* The seed's QuantizedHuggingFaceStorageReader: the Hugging Face
 * checkpoint in `path` with fp8 weights W and float32 block scales
 * W_scale_inv, the weights dequantized to target_dtype while loading (its
 * metadata gives them target_dtype; the scales stay as stored).
 * DCP_INVALID_ARGUMENT here for another target_dtype or a negative count;
 * a weight without its scale fails the load with DCP_DATA_LOSS naming the
 * file and the tensor. */
DCP_API int dcp_hf_quantized_reader_create(
    const char* path, const dcp_hf_quantized_reader_options_t* options,
    dcp_storage_reader_t** out);

/* ------------------------------------------------------------------------
 * Storage: MEGA directories (model.mega or model-0000I-of-0000N.mega and
 * model.mega.index.json; docs/FORMAT.md section 8)
 *
 * The seed's MegaStorageWriter / MegaStorageReader, also reached by
 * checkpoint ids "mega://DIR". Handles as for Hugging Face above.
 * ---------------------------------------------------------------------- */

typedef struct dcp_mega_writer_options {
  size_t struct_size;
  /* As dcp_hf_writer_options_t: tensor fqns[i] goes to the 1-based file
   * file_indices[i] (model-0000I-of-0000N.mega); num_mappings 0 puts
   * every value in model.mega; a saved value the mapping lacks fails the
   * save with DCP_INVALID_ARGUMENT naming it. */
  const char* const* fqns;
  const int32_t* file_indices;
  size_t num_mappings;
  int32_t thread_count;        /* 0: 1 */
  int64_t checksum_block_size; /* 0: 4 MiB; a multiple of 4 KiB <= 1 GiB */
  dcp_flag_t sync_files;       /* default true */
  dcp_flag_t direct_io;        /* default true */
} dcp_mega_writer_options_t;

/* A writer of MEGA checkpoints into directory `path`; a save commits
 * atomically. DCP_INVALID_ARGUMENT here for a bad option (a file index
 * below 1, a NULL or duplicate fqn, a negative count). */
DCP_API int dcp_mega_writer_create(const char* path,
                                   const dcp_mega_writer_options_t* options,
                                   dcp_storage_writer_t** out);

typedef struct dcp_mega_reader_options {
  size_t struct_size;
  int32_t thread_count; /* 0: 1 */
  dcp_flag_t direct_io; /* default true */
} dcp_mega_reader_options_t;

/* A reader of the MEGA checkpoint in directory `path`, with resharding;
 * every byte read is checked against its checksums. A load fails with
 * DCP_NOT_FOUND without an index, DCP_DATA_LOSS naming the file for a
 * malformed or corrupted one. */
DCP_API int dcp_mega_reader_create(const char* path,
                                   const dcp_mega_reader_options_t* options,
                                   dcp_storage_reader_t** out);

/* ------------------------------------------------------------------------
 * Process groups (coordination of the ranks of a save or load)
 * ---------------------------------------------------------------------- */

typedef struct dcp_process_group_options {
  size_t struct_size;
  const char* backend;        /* "auto" (NULL), "local", "gloo", "nccl" */
  const char* group_name;     /* NULL: "dcp-checkpoint" */
  int64_t timeout_ms;         /* per collective; 0: 5 minutes */
  int64_t connect_timeout_ms; /* 0: 5 minutes */
  int32_t cuda_device;        /* NCCL; 0 here means the local rank */
} dcp_process_group_options_t;

/* From the environment (RANK, WORLD_SIZE, DCP_STORE / MASTER_ADDR ...; see
 * comm/rendezvous.h). Blocks until every rank joined. */
DCP_API int dcp_process_group_create_from_env(
    const dcp_process_group_options_t* options, dcp_process_group_t** out);

/* A key-value store that the ranks share (torchrun's TCPStore, reached
 * from Python): a group over it needs nothing else. Callbacks may run on
 * any dcp thread, one at a time per group; they return a dcp_status_t.
 * `get` waits up to timeout_ms for `key` to exist, then hands its value to
 * `sink` (called once, before get returns); it returns
 * DCP_DEADLINE_EXCEEDED when the key did not appear in time. `remove` may
 * be NULL (keys are then left in the store). */
typedef struct dcp_store {
  size_t struct_size;
  void* user;
  int (*set)(void* user, const char* key, const void* value, size_t size);
  int (*get)(void* user, const char* key, int64_t timeout_ms,
             void (*sink)(void* sink_ctx, const void* data, size_t size),
             void* sink_ctx);
  int (*remove)(void* user, const char* key);
} dcp_store_t;

/* A group of `size` ranks coordinating through `store` (copied; `user`
 * must outlive the group). Keys are prefixed with the group name. Of the
 * options, group_name and timeout_ms count (the timeout also bounds
 * joining); backend must be NULL, "auto" or "store". */
DCP_API int dcp_process_group_create_from_store(
    const dcp_store_t* store, int32_t rank, int32_t size,
    const dcp_process_group_options_t* options, dcp_process_group_t** out);

DCP_API int dcp_process_group_rank(const dcp_process_group_t* group,
                                   int32_t* rank);
DCP_API int dcp_process_group_size(const dcp_process_group_t* group,
                                   int32_t* size);
/* Agreement before a save or load: every rank of `group` (NULL: the
 * default group; none: single-process) calls it with the outcome of its own
 * preparation (`code` DCP_OK, or the code and `message` of what failed on
 * this rank). DCP_OK when every rank passed DCP_OK; else it fails on every
 * rank as a save of several ranks does (the lowest failing rank's code,
 * each failing rank in dcp_last_error_rank_failure), so that a rank whose
 * preparation failed does not leave the others waiting in the save. Runs
 * in its turn with the group's saves and loads (after an async_save's
 * upload submitted before it). `what` ("save") names the step. */
DCP_API int dcp_process_group_agree(dcp_process_group_t* group,
                                    const char* what, int code,
                                    const char* message);
/* The group saves and loads use when their options name none (the seed's
 * default process group); NULL: single-process. Not owned. */
DCP_API int dcp_set_default_process_group(dcp_process_group_t* group);
/* Fails with DCP_FAILED_PRECONDITION while it is the default group or a
 * save in flight uses it. */
DCP_API int dcp_process_group_free(dcp_process_group_t* group);

/* ------------------------------------------------------------------------
 * Planner options (the DefaultSavePlanner / DefaultLoadPlanner)
 * ---------------------------------------------------------------------- */

typedef struct dcp_save_planner_options {
  size_t struct_size;
  dcp_flag_t flatten_state_dict;        /* default true */
  dcp_flag_t flatten_sharded_tensors;   /* default true */
  dcp_flag_t dedup_save_to_lowest_rank; /* default false */
  dcp_flag_t enable_plan_caching;       /* default false */
} dcp_save_planner_options_t;

typedef struct dcp_load_planner_options {
  size_t struct_size;
  dcp_flag_t flatten_state_dict;      /* default true */
  dcp_flag_t flatten_sharded_tensors; /* default true */
  dcp_flag_t allow_partial_load;      /* default false */
  /* default false. Load a floating-point tensor (F64, F32, BF16, F16)
   * saved as another of those dtypes by converting it as torch's copy_
   * does (round to nearest even; F64 to BF16 or F16 through F32), into
   * host and device tensors. Each converted tensor is read into a host
   * temporary of the saved dtype and converted when it is complete (for a
   * device tensor into the load's pinned staging chunks, copied up after
   * the work device_wait names, landed when dcp_load returns); the FileSystem
   * and Hugging Face readers hold about two read windows of those
   * temporaries at once (read_window_bytes), the quantized Hugging Face
   * reader all of them. It lies in what was
   * the tail padding of the struct's first version (same sizeof): that
   * version's callers must have zeroed the whole struct, as the
   * conventions ask. */
  dcp_flag_t convert_dtypes;
} dcp_load_planner_options_t;

/* ------------------------------------------------------------------------
 * Save and load
 * ---------------------------------------------------------------------- */

typedef enum dcp_async_checkpointer_type {
  DCP_ASYNC_THREAD = 0,
  DCP_ASYNC_PROCESS = 1 /* not in this library: DCP_UNIMPLEMENTED */
} dcp_async_checkpointer_type_t;

typedef struct dcp_save_options {
  size_t struct_size;
  /* Where to save. With storage_writer too, the writer is pointed at it. */
  const char* checkpoint_id;
  dcp_storage_writer_t* storage_writer;      /* NULL: a fs writer */
  const dcp_save_planner_options_t* planner; /* NULL: defaults */
  dcp_process_group_t* process_group;        /* NULL: the default */
  int32_t coordinator_rank;
  dcp_flag_t no_dist;         /* default false */
  dcp_flag_t use_collectives; /* default true */
  dcp_device_wait_t device_wait;
  /* dcp_async_save only. */
  int32_t async_checkpointer_type; /* dcp_async_checkpointer_type_t */
  /* The stager that stages the state dict (the seed's async_stager); NULL:
   * a new one per save with the seed's async_save defaults (pageable
   * memory, synchronous staging), whose first use in a process maps and
   * faults in fresh memory. A stager kept across saves (and reserved with
   * dcp_stager_reserve) does that once. */
  dcp_stager_t* async_stager;
} dcp_save_options_t;

typedef struct dcp_load_options {
  size_t struct_size;
  const char* checkpoint_id;
  dcp_storage_reader_t* storage_reader;      /* NULL: a fs reader */
  const dcp_load_planner_options_t* planner; /* NULL: defaults */
  dcp_process_group_t* process_group;        /* NULL: the default */
  int32_t coordinator_rank;
  dcp_flag_t no_dist; /* default false */
  /* The stream rule for a load into device tensors: the caller's stream
   * (or an event recorded on it) whose work so far must finish before dcp
   * writes the tensors (kernels still reading them, an allocator's fill).
   * dcp's copy streams wait for it on the device; the host never blocks
   * for it. The load returns once the bytes are on the device, so work the
   * caller enqueues afterwards sees them. Every device tensor of the load
   * must be on `device_wait.device` (DCP_INVALID_ARGUMENT naming it
   * otherwise); ignored when the state dict has no device tensor. */
  dcp_device_wait_t device_wait;
  /* The checkpoint's metadata when the caller read it already
   * (dcp_metadata_read, dcp_storage_reader_read_metadata): the load plans
   * against it instead of reading it again, which saves that read when one
   * checkpoint is loaded in several steps. Not owned. It must be the
   * metadata of the checkpoint loaded: dcp's own checkpoints name data
   * files of their save, so another one's fails the load (DCP_DATA_LOSS,
   * "data file ... is missing"),
   * but Hugging Face files would be read at the other one's offsets.
   * NULL: the load reads it.
   * Ignored where the location holds rank-local checkpoints. */
  const dcp_metadata_t* metadata;
} dcp_load_options_t;

/* Saves `sd` and commits the checkpoint. `metadata_out` (may be NULL)
 * receives the committed metadata, which the caller frees. On failure
 * nothing is committed and a previous checkpoint there is untouched. */
DCP_API int dcp_save(const dcp_state_dict_t* sd,
                     const dcp_save_options_t* options,
                     dcp_metadata_t** metadata_out);

/* Loads into `sd` in place: tensors are filled in their own memory
 * (resharded as needed; DCP_INVALID_ARGUMENT naming the tensor when a shape
 * or dtype differs from the checkpoint's), plain values replaced (read
 * them back with dcp_state_dict_get). A load into device tensors returns
 * after their bytes are on the device. */
DCP_API int dcp_load(dcp_state_dict_t* sd, const dcp_load_options_t* options);

/* ------------------------------------------------------------------------
 * Async save (the seed's async_save)
 *
 * Stages the state dict into host memory, then writes and commits it in
 * the background. Two completions: staging (the caller may change its
 * tensors again) and upload (the checkpoint is committed). Uploads run one
 * at a time in call order. Freeing the handle does not cancel the save.
 * Process exit: call dcp_shutdown() (or wait for every upload) before
 * exit; uploads still queued at static destruction are not run.
 * ---------------------------------------------------------------------- */

DCP_API int dcp_async_save(const dcp_state_dict_t* sd,
                           const dcp_save_options_t* options,
                           dcp_async_save_t** out);

typedef enum dcp_completion {
  DCP_STAGING = 0,
  DCP_UPLOAD = 1
} dcp_completion_t;

/* Waits up to timeout_ms (0: poll, negative: forever) for `which`
 * completion. *done = 1 and the completion's status returned when it is
 * done (a failed save's code, its error recorded as the last error);
 * *done = 0 and DCP_OK when the time ran out. */
DCP_API int dcp_async_save_wait(dcp_async_save_t* save, int32_t which,
                                int64_t timeout_ms, int32_t* done);

/* Calls `callback(user, status)` once `which` completion is done: at once
 * on the calling thread when it already is, else on a dcp thread (keep it
 * short). From a callback, dcp_async_save_wait with a timeout other than 0
 * on a completion not yet done fails with DCP_FAILED_PRECONDITION (it could
 * wait for the thread it blocks), as does dcp_shutdown. */
DCP_API int dcp_async_save_on_done(dcp_async_save_t* save, int32_t which,
                                   void (*callback)(void* user, int status),
                                   void* user);

/* The committed metadata of a finished, successful upload (freed by the
 * caller); DCP_FAILED_PRECONDITION while it is not done. */
DCP_API int dcp_async_save_metadata(dcp_async_save_t* save,
                                    dcp_metadata_t** out);

DCP_API int dcp_async_save_free(dcp_async_save_t* save);

/* A DefaultStager kept across async saves (the seed's DefaultStager and its
 * StagingOptions; defaults are the seed's: every switch on). With
 * cache_staged_state_dict (default on) it keeps its staging memory between
 * saves (two buffers, so a save while the previous upload runs needs no new
 * memory either). */
typedef struct dcp_stager_options {
  size_t struct_size;
  dcp_flag_t use_pinned_memory;       /* default true */
  dcp_flag_t use_shared_memory;       /* default true */
  dcp_flag_t use_async_staging;       /* default true */
  dcp_flag_t use_non_blocking_copy;   /* default true */
  dcp_flag_t cache_staged_state_dict; /* default true */
  /* default false. Stage contiguous CPU tensors by a copy-on-write snapshot
   * (see dcp_snapshot_host): DCP_STAGING completes once their pages are
   * write-protected, before they are copied; the tensors must then stay
   * allocated (they may change) until DCP_UPLOAD completes. Never for
   * tensors a device writes by DMA (page-locked memory: kDLCUDAHost
   * tensors count as host ones here, so the caller must copy them into
   * ordinary memory first, as the Python package does). Without
   * userfaultfd they are copied as usual. It lies in what was the tail
   * padding of the struct's first version (same sizeof): that version's
   * callers must have zeroed the whole struct, as the conventions ask. */
  dcp_flag_t copy_on_write;
} dcp_stager_options_t;

DCP_API int dcp_stager_create(const dcp_stager_options_t* options,
                              dcp_stager_t** out);
/* Makes the staging memory a save of `sd` (or of any state with the same
 * tensors) will use, mapped and faulted in, so that the first
 * dcp_async_save with this stager blocks no longer than later ones. Call it
 * when the training loop starts. Blocks until the memory is ready; reads
 * only the tensors' sizes and places, never their bytes. */
DCP_API int dcp_stager_reserve(dcp_stager_t* stager,
                               const dcp_state_dict_t* sd);
/* Saves still using the stager keep it until their uploads end. */
DCP_API int dcp_stager_free(dcp_stager_t* stager);
/* Bytes the stager has staged by copy-on-write snapshots so far (0 without
 * copy_on_write or without userfaultfd). */
DCP_API int dcp_stager_copy_on_write_bytes(const dcp_stager_t* stager,
                                           size_t* out);

/* One copy of dcp_copy_host: `bytes` bytes from `src` to `dst`. */
typedef struct dcp_host_copy {
  void* dst;
  const void* src;
  size_t bytes;
} dcp_host_copy_t;

/* Copies host memory the way the stager stages CPU tensors: each of
 * copies[0..count) (ranges must not overlap), large ones cut into 8 MiB
 * pieces spread over up to `threads` threads of a process-wide pool
 * (threads <= 0: the number of cores, at most 8), with stores that bypass
 * the CPU caches. For a binding staging host tensors into memory of its
 * own (a shared-memory segment another process writes out): one call, no
 * interpreter lock held. Blocks until every byte is copied. Thread-safe.
 * DCP_INVALID_ARGUMENT for copies == NULL with count > 0, or a NULL dst or
 * src with bytes > 0 (naming its index); nothing is copied then. */
DCP_API int dcp_copy_host(const dcp_host_copy_t* copies, size_t count,
                          int threads);

/* Faults the whole pages inside [data, data + bytes) in for writing, on up
 * to 8 threads, as dcp's own staging memory is when it is made: a first
 * copy into fresh memory (a new shared-memory segment) otherwise faults
 * each page in on the copying thread. The contents are unchanged; on a
 * kernel before Linux 5.14 each page is read and written back, so nothing
 * else may write the range meanwhile (and the range must be mapped
 * writable). Blocks until done; thread-safe. DCP_INVALID_ARGUMENT for
 * data == NULL with bytes > 0, or for pages the kernel refuses to fault in
 * for writing (read-only memory); DCP_RESOURCE_EXHAUSTED for pages not
 * mapped or memory not to be had; the message names the range. */
DCP_API int dcp_populate_host(void* data, size_t bytes);

/* dcp_copy_host as a copy-on-write snapshot: returns as soon as the sources
 * may change again. Whole pages of sources in private anonymous memory
 * (malloc's, numpy's, torch's CPU tensors) are write-protected and copied
 * by a background thread; a write to one before its copy (by any thread,
 * or by the kernel for a read(2) into it) waits while its block is copied
 * first. The rest (copies under 1 MiB, partial first and last pages,
 * shared or file memory) is copied before it returns, as dcp_copy_host
 * would. Until dcp_host_snapshot_wait returns, the sources stay allocated
 * and nobody touches the destinations. Writes that bypass the page tables
 * are not seen: never pass memory a device writes by DMA (page-locked
 * memory). Without userfaultfd (Linux 6.4 and the right to use it) it
 * copies everything before returning. *out is freed with
 * dcp_host_snapshot_free. One snapshot is in flight per process: a second
 * call waits for the first to fill. */
DCP_API int dcp_snapshot_host(const dcp_host_copy_t* copies, size_t count,
                              int threads, dcp_host_snapshot_t** out);
/* Blocks until every byte of the snapshot is copied. copy_on_write_bytes
 * (may be NULL): the bytes copied after dcp_snapshot_host returned. */
DCP_API int dcp_host_snapshot_wait(dcp_host_snapshot_t* snapshot,
                                   size_t* copy_on_write_bytes);
/* Waits for the snapshot to fill, then frees it. */
DCP_API int dcp_host_snapshot_free(dcp_host_snapshot_t* snapshot);

/* Waits for every upload of this process's async saves to finish. Call it
 * before the process exits. Returns DCP_OK (each save reports its own
 * status). */
DCP_API int dcp_shutdown(void);

/* ------------------------------------------------------------------------
 * Metadata: what a checkpoint holds, without loading it
 * ---------------------------------------------------------------------- */

/* Reads the committed metadata of the checkpoint at `checkpoint_id` (a
 * directory). DCP_NOT_FOUND naming the directory when none is there. */
DCP_API int dcp_metadata_read(const char* checkpoint_id, dcp_metadata_t** out);
DCP_API int dcp_metadata_free(dcp_metadata_t* md);

/* Encodes `md` as the bytes of a checkpoint's .metadata file
 * (docs/FORMAT.md), into `buf` of `capacity` bytes, as snprintf sizes its
 * output: *size is set to the bytes the encoding takes; with buf NULL and
 * capacity 0 nothing is written (ask for the size first).
 * DCP_OUT_OF_RANGE, writing nothing, when capacity is smaller. */
DCP_API int dcp_metadata_encode(const dcp_metadata_t* md, void* buf,
                                size_t capacity, size_t* size);
/* The metadata in `size` bytes at `data` that dcp_metadata_encode wrote
 * (or a .metadata file holds); `source` (NULL: "the bytes given to
 * dcp_metadata_decode") names them in errors. The bytes are checked as a load
 * checks a .metadata file: DCP_DATA_LOSS when they are not dcp metadata or are
 * damaged, DCP_FAILED_PRECONDITION for a newer dcp's format. */
DCP_API int dcp_metadata_decode(const void* data, size_t size,
                                const char* source, dcp_metadata_t** out);

typedef struct dcp_item_info {
  size_t struct_size;
  const char* name;  /* flattened name */
  int32_t is_tensor; /* 0: a plain value stored as bytes */
  int32_t dtype;     /* dcp_dtype_t */
  int32_t ndim;
  const int64_t* shape; /* the global shape */
  size_t num_chunks;
  int32_t requires_grad;
  size_t path_len; /* elements of the nesting path (dcp_metadata_item_path) */
} dcp_item_info_t;

/* Items in flattened-name order. */
DCP_API int dcp_metadata_num_items(const dcp_metadata_t* md, size_t* out);
DCP_API int dcp_metadata_item(const dcp_metadata_t* md, size_t index,
                              dcp_item_info_t* out);
/* The item named `name`: DCP_NOT_FOUND when there is none. */
DCP_API int dcp_metadata_find(const dcp_metadata_t* md, const char* name,
                              size_t* index);
/* The item whose nesting path (dcp_metadata_item_path) is `path`: its name
 * and its path elements both match (a key "b.1" under "a" is not list item
 * 1 of "a.b"). DCP_NOT_FOUND when there is none. */
DCP_API int dcp_metadata_find_path(const dcp_metadata_t* md, dcp_path_t path,
                                   size_t* index);
/* The items whose flattened names start with `prefix` (the leaves under a
 * container: prefix "model.layers."), which are adjacent in name order:
 * `*count` of them from index `*first` on. None: *count 0, *first where
 * they would be. `min_path_len` and `max_path_len` (either may be NULL):
 * the shortest and longest nesting path among them (0 when none). */
DCP_API int dcp_metadata_find_prefix(const dcp_metadata_t* md,
                                     const char* prefix, size_t* first,
                                     size_t* count, size_t* min_path_len,
                                     size_t* max_path_len);
/* Chunk `chunk` of tensor item `index`: offsets and sizes, ndim each. */
DCP_API int dcp_metadata_chunk(const dcp_metadata_t* md, size_t index,
                               size_t chunk, const int64_t** offsets,
                               const int64_t** sizes);
/* The nesting path of item `index` (element `elem` of path_len), as the
 * saver's state dict had it: a key or a list index. */
DCP_API int dcp_metadata_item_path(const dcp_metadata_t* md, size_t index,
                                   size_t elem, dcp_path_elem_t* out);
/* The save's identity: checkpoint_id and save_id strings. */
DCP_API int dcp_metadata_ids(const dcp_metadata_t* md,
                             const char** checkpoint_id, const char** save_id);

/* Every item in one call, for bindings that read them all: `*records`
 * points to `*num_records` integers and `*text` to `*text_size` bytes (not
 * NUL-terminated), both owned by `md` until dcp_metadata_free. A string is
 * two records, its offset and size in `text` (one copy of each distinct
 * string). The items follow one another in dcp_metadata_item's order, each
 *   name (2 records), is_tensor, dtype, requires_grad, ndim, path_len,
 *   num_chunks, then the shape (ndim records), then each path element
 *   (a key: its string; a list index: -1 and the index), then each chunk
 *   (its offsets, then its sizes: ndim records each).
 * A plain value has is_tensor, dtype, requires_grad, ndim and num_chunks 0.
 */
DCP_API int dcp_metadata_items_packed(const dcp_metadata_t* md,
                                      const int64_t** records,
                                      size_t* num_records, const char** text,
                                      size_t* text_size);

/* Every storage entry in one call, as dcp_metadata_items_packed; each, in
 * dcp_metadata_storage's order:
 *   name (2 records), has_offsets, ndim, the offsets (ndim records),
 *   relative_path (2 records), offset, length. */
DCP_API int dcp_metadata_storage_packed(const dcp_metadata_t* md,
                                        const int64_t** records,
                                        size_t* num_records, const char** text,
                                        size_t* text_size);

/* The format of the checkpoint: "dcp-1", "dcp-2" (compressed items) or
 * "dcp-3" (a tensor of a dtype from code 17 on) for dcp's own
 * (docs/FORMAT.md), "safetensors" for a Hugging Face directory. */
DCP_API int dcp_metadata_version(const dcp_metadata_t* md,
                                 const char** version);

/* Where one stored item lives (the seed's storage_data, keyed by its
 * MetadataIndex: the item's name and, for a tensor chunk, the chunk's
 * offsets in the tensor). */
typedef struct dcp_storage_info {
  size_t struct_size;
  const char* name;          /* the item's flattened name */
  int32_t has_offsets;       /* 1: a tensor chunk; 0: a plain value */
  int32_t ndim;              /* entries of `offsets` */
  const int64_t* offsets;    /* the chunk's offsets in its tensor */
  const char* relative_path; /* the data file, relative to the checkpoint */
  int64_t offset;            /* byte offset of the item in that file */
  int64_t length;            /* bytes of the item */
} dcp_storage_info_t;

/* Entries of the storage data, ordered by name then offsets. */
DCP_API int dcp_metadata_num_storage(const dcp_metadata_t* md, size_t* out);
DCP_API int dcp_metadata_storage(const dcp_metadata_t* md, size_t index,
                                 dcp_storage_info_t* out);

/* Reads the metadata of the checkpoint a storage reader points at (a
 * Hugging Face reader's directory, whose tensors, dtypes and shapes come
 * from the safetensors headers; or a file-system reader's), without
 * loading. `checkpoint_id` NULL keeps the reader's own location, else the
 * reader is pointed there first. DCP_NOT_FOUND naming the directory when
 * it holds no checkpoint. */
DCP_API int dcp_storage_reader_read_metadata(dcp_storage_reader_t* reader,
                                             const char* checkpoint_id,
                                             dcp_metadata_t** out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DCP_DCP_H_ */
