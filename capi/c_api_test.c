/* Tests of the C ABI (dcp/dcp.h), compiled as C99 and linked against
 * libdcp.so itself: what a C, Rust or ctypes caller sees. A tiny harness:
 * every CHECK counts, failures print where and why, main returns 1 if any
 * failed. Nothing here sleeps; async completions are waited for by
 * dcp_async_save_wait or by a condition variable the callback signals.
 */
#define _DEFAULT_SOURCE /* mincore, MAP_ANONYMOUS */
#define _POSIX_C_SOURCE 200809L

#include <dlpack/dlpack.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dcp/dcp.h"

/* ------------------------------------------------------------------------
 * Harness
 * ---------------------------------------------------------------------- */

static int g_checks = 0;
static int g_failures = 0;

#define CHECK(cond)                                                            \
  do {                                                                         \
    ++g_checks;                                                                \
    if (!(cond)) {                                                             \
      ++g_failures;                                                            \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                          \
  } while (0)

/* `expr` returns DCP_OK. */
#define CHECK_OK(expr)                                                   \
  do {                                                                   \
    int rc_ = (expr);                                                    \
    ++g_checks;                                                          \
    if (rc_ != DCP_OK) {                                                 \
      ++g_failures;                                                      \
      fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, \
              #expr, dcp_status_name(rc_), dcp_last_error_message());    \
    }                                                                    \
  } while (0)

/* `expr` fails with `code`, and the last error has that code and a message
 * containing `needle`. */
#define CHECK_ERROR(expr, code, needle) \
  check_error((expr), (code), (needle), #expr, __FILE__, __LINE__)

static void check_error(int rc, int code, const char* needle, const char* expr,
                        const char* file, int line) {
  ++g_checks;
  if (rc != code || dcp_last_error_code() != code ||
      strstr(dcp_last_error_message(), needle) == NULL) {
    ++g_failures;
    fprintf(stderr,
            "%s:%d: %s returned %s (last error %s: \"%s\"); expected %s "
            "with a message containing \"%s\"\n",
            file, line, expr, dcp_status_name(rc),
            dcp_status_name(dcp_last_error_code()), dcp_last_error_message(),
            dcp_status_name(code), needle);
  }
}

/* Paths: PATH(KEY("model"), KEY("layers"), IDX(0)). */
#define KEY(k) \
  { (k), -1 }
#define IDX(i) \
  { NULL, (i) }
#define PATH(...)                             \
  ((dcp_path_t){                              \
      (const dcp_path_elem_t[]){__VA_ARGS__}, \
      sizeof((dcp_path_elem_t[]){__VA_ARGS__}) / sizeof(dcp_path_elem_t)})

static char g_root[4096];

/* A fresh directory path under the test's temporary directory (not
 * created: a save creates it). */
static const char* dir_for(const char* name, char* buf, size_t size) {
  snprintf(buf, size, "%s/%s", g_root, name);
  return buf;
}

static DLTensor make_tensor(void* data, int32_t ndim, int64_t* shape,
                            int64_t* strides, uint8_t code, uint8_t bits) {
  DLTensor t;
  memset(&t, 0, sizeof(t));
  t.data = data;
  t.device.device_type = kDLCPU;
  t.device.device_id = 0;
  t.ndim = ndim;
  t.dtype.code = code;
  t.dtype.bits = bits;
  t.dtype.lanes = 1;
  t.shape = shape;
  t.strides = strides;
  t.byte_offset = 0;
  return t;
}

static dcp_save_options_t save_options(const char* dir) {
  dcp_save_options_t o;
  memset(&o, 0, sizeof(o));
  o.struct_size = sizeof(o);
  o.checkpoint_id = dir;
  return o;
}

static dcp_load_options_t load_options(const char* dir) {
  dcp_load_options_t o;
  memset(&o, 0, sizeof(o));
  o.struct_size = sizeof(o);
  o.checkpoint_id = dir;
  return o;
}

static dcp_leaf_info_t leaf_info(void) {
  dcp_leaf_info_t info;
  memset(&info, 0, sizeof(info));
  info.struct_size = sizeof(info);
  return info;
}

/* DLPack codes of each dcp dtype (dcp/dcp.h). */
typedef struct dtype_case {
  int dtype;
  uint8_t code;
  uint8_t bits;
} dtype_case;

static const dtype_case kDTypes[] = {
    {DCP_DTYPE_BOOL, 6, 8},
    {DCP_DTYPE_U8, kDLUInt, 8},
    {DCP_DTYPE_I8, kDLInt, 8},
    {DCP_DTYPE_U16, kDLUInt, 16},
    {DCP_DTYPE_I16, kDLInt, 16},
    {DCP_DTYPE_U32, kDLUInt, 32},
    {DCP_DTYPE_I32, kDLInt, 32},
    {DCP_DTYPE_U64, kDLUInt, 64},
    {DCP_DTYPE_I64, kDLInt, 64},
    {DCP_DTYPE_F16, kDLFloat, 16},
    {DCP_DTYPE_BF16, kDLBfloat, 16},
    {DCP_DTYPE_F32, kDLFloat, 32},
    {DCP_DTYPE_F64, kDLFloat, 64},
    {DCP_DTYPE_F8_E4M3, 10, 8},
    {DCP_DTYPE_F8_E5M2, 12, 8},
    {DCP_DTYPE_C64, kDLComplex, 64},
    {DCP_DTYPE_C128, kDLComplex, 128},
};
#define NUM_DTYPES ((int)(sizeof(kDTypes) / sizeof(kDTypes[0])))

/* ------------------------------------------------------------------------
 * Version, names
 * ---------------------------------------------------------------------- */

static void test_version_and_names(void) {
  char expected[32];
  snprintf(expected, sizeof(expected), "%d.%d.%d", DCP_VERSION_MAJOR,
           DCP_VERSION_MINOR, DCP_VERSION_PATCH);
  CHECK(strcmp(dcp_version(), expected) == 0);
  CHECK(strcmp(dcp_status_name(DCP_OK), "OK") == 0);
  CHECK(strcmp(dcp_status_name(DCP_INVALID_ARGUMENT), "INVALID_ARGUMENT") == 0);
  CHECK(strcmp(dcp_status_name(DCP_UNAUTHENTICATED), "UNAUTHENTICATED") == 0);
  CHECK(strcmp(dcp_status_name(17), "UNKNOWN_CODE") == 0);
  CHECK(strcmp(dcp_status_name(-1), "UNKNOWN_CODE") == 0);
  CHECK(strcmp(dcp_dtype_name(DCP_DTYPE_F32), "F32") == 0);
  CHECK(strcmp(dcp_dtype_name(DCP_DTYPE_BF16), "BF16") == 0);
  CHECK(strcmp(dcp_dtype_name(DCP_DTYPE_F8_E4M3), "F8_E4M3") == 0);
  CHECK(strcmp(dcp_dtype_name(DCP_DTYPE_C128), "C128") == 0);
  CHECK(strcmp(dcp_dtype_name(DCP_DTYPE_F8_E8M0), "F8_E8M0") == 0);
  CHECK(strcmp(dcp_dtype_name(DCP_DTYPE_F4_E2M1_X2), "F4_E2M1_X2") == 0);
  CHECK(strcmp(dcp_dtype_name(DCP_DTYPE_C32), "C32") == 0);
  CHECK(dcp_dtype_name(DCP_DTYPE_C32 + 1) == NULL);
  CHECK(dcp_dtype_name(-1) == NULL);
}

/* ------------------------------------------------------------------------
 * Round trips
 * ---------------------------------------------------------------------- */

/* Every dtype, a 0-d tensor and a tensor with a byte_offset, byte-exact. */
static void test_roundtrip_every_dtype(void) {
  enum { kRows = 3, kCols = 5, kMaxBytes = kRows * kCols * 16 };
  static unsigned char src[NUM_DTYPES][kMaxBytes];
  static unsigned char dst[NUM_DTYPES][kMaxBytes];
  int64_t shape[2] = {kRows, kCols};
  char dir[4200];
  dcp_state_dict_t* saved = NULL;
  dcp_state_dict_t* loaded = NULL;
  int i;
  size_t b;
  double scalar = 2.5, scalar_out = 0;
  unsigned char offset_src[64], offset_dst[64];
  int64_t offset_shape[1] = {4};
  DLTensor t;
  dcp_save_options_t so;
  dcp_load_options_t lo;
  dcp_leaf_info_t info = leaf_info();

  CHECK_OK(dcp_state_dict_create(&saved));
  CHECK_OK(dcp_state_dict_create(&loaded));
  for (i = 0; i < NUM_DTYPES; ++i) {
    const size_t bytes = (size_t)kRows * kCols * kDTypes[i].bits / 8;
    const char* name = dcp_dtype_name(kDTypes[i].dtype);
    for (b = 0; b < bytes; ++b) {
      src[i][b] = kDTypes[i].dtype == DCP_DTYPE_BOOL
                      ? (unsigned char)(b % 2)
                      : (unsigned char)(b * 37 + (size_t)i * 11 + 1);
    }
    memset(dst[i], 0, sizeof(dst[i]));
    t = make_tensor(src[i], 2, shape, NULL, kDTypes[i].code, kDTypes[i].bits);
    CHECK_OK(
        dcp_state_dict_set_tensor(saved, PATH(KEY("t"), KEY(name)), &t, NULL));
    t.data = dst[i];
    CHECK_OK(
        dcp_state_dict_set_tensor(loaded, PATH(KEY("t"), KEY(name)), &t, NULL));
  }
  /* A 0-d tensor. */
  t = make_tensor(&scalar, 0, NULL, NULL, kDLFloat, 64);
  CHECK_OK(dcp_state_dict_set_tensor(saved, PATH(KEY("scalar")), &t, NULL));
  t.data = &scalar_out;
  CHECK_OK(dcp_state_dict_set_tensor(loaded, PATH(KEY("scalar")), &t, NULL));
  /* byte_offset: the tensor starts 8 bytes into its buffer. */
  for (b = 0; b < sizeof(offset_src); ++b) offset_src[b] = (unsigned char)b;
  memset(offset_dst, 0, sizeof(offset_dst));
  t = make_tensor(offset_src, 1, offset_shape, NULL, kDLUInt, 32);
  t.byte_offset = 8;
  CHECK_OK(dcp_state_dict_set_tensor(saved, PATH(KEY("offset")), &t, NULL));
  t = make_tensor(offset_dst, 1, offset_shape, NULL, kDLUInt, 32);
  CHECK_OK(dcp_state_dict_set_tensor(loaded, PATH(KEY("offset")), &t, NULL));

  so = save_options(dir_for("dtypes", dir, sizeof(dir)));
  CHECK_OK(dcp_save(saved, &so, NULL));
  lo = load_options(dir);
  CHECK_OK(dcp_load(loaded, &lo));
  for (i = 0; i < NUM_DTYPES; ++i) {
    const size_t bytes = (size_t)kRows * kCols * kDTypes[i].bits / 8;
    const char* name = dcp_dtype_name(kDTypes[i].dtype);
    CHECK(memcmp(src[i], dst[i], bytes) == 0);
    CHECK_OK(dcp_state_dict_get(loaded, PATH(KEY("t"), KEY(name)), &info));
    CHECK(info.kind == DCP_VALUE_TENSOR);
    CHECK(info.dtype == kDTypes[i].dtype);
    CHECK(info.ndim == 2 && info.shape[0] == kRows && info.shape[1] == kCols);
  }
  CHECK(scalar_out == 2.5);
  CHECK_OK(dcp_state_dict_get(loaded, PATH(KEY("scalar")), &info));
  CHECK(info.kind == DCP_VALUE_TENSOR && info.ndim == 0);
  CHECK(memcmp(offset_src + 8, offset_dst, 16) == 0);
  CHECK(offset_dst[16] == 0);
  CHECK_OK(dcp_state_dict_free(saved));
  CHECK_OK(dcp_state_dict_free(loaded));
}

/* Strided sources and destinations: a view of every other column. */
static void test_strided(void) {
  float src[4][6], gathered[4][3], strided_dst[4][6];
  int64_t shape[2] = {4, 3};
  int64_t strides[2] = {6, 2};
  int64_t transposed_shape[2] = {6, 4};
  int64_t transposed_strides[2] = {1, 6};
  float transposed[6][4];
  char dir[4200];
  dcp_state_dict_t* saved = NULL;
  dcp_state_dict_t* loaded = NULL;
  DLTensor t;
  dcp_save_options_t so;
  dcp_load_options_t lo;
  int r, c;

  for (r = 0; r < 4; ++r) {
    for (c = 0; c < 6; ++c) src[r][c] = (float)(r * 10 + c);
  }
  memset(gathered, 0, sizeof(gathered));
  memset(strided_dst, 0, sizeof(strided_dst));
  memset(transposed, 0, sizeof(transposed));
  CHECK_OK(dcp_state_dict_create(&saved));
  t = make_tensor(src, 2, shape, strides, kDLFloat, 32);
  CHECK_OK(dcp_state_dict_set_tensor(saved, PATH(KEY("view")), &t, NULL));
  t = make_tensor(src, 2, transposed_shape, transposed_strides, kDLFloat, 32);
  CHECK_OK(dcp_state_dict_set_tensor(saved, PATH(KEY("transposed")), &t, NULL));
  so = save_options(dir_for("strided", dir, sizeof(dir)));
  CHECK_OK(dcp_save(saved, &so, NULL));

  /* Into a contiguous tensor, then into a strided one. */
  CHECK_OK(dcp_state_dict_create(&loaded));
  t = make_tensor(gathered, 2, shape, NULL, kDLFloat, 32);
  CHECK_OK(dcp_state_dict_set_tensor(loaded, PATH(KEY("view")), &t, NULL));
  t = make_tensor(transposed, 2, transposed_shape, NULL, kDLFloat, 32);
  CHECK_OK(
      dcp_state_dict_set_tensor(loaded, PATH(KEY("transposed")), &t, NULL));
  lo = load_options(dir);
  CHECK_OK(dcp_load(loaded, &lo));
  for (r = 0; r < 4; ++r) {
    for (c = 0; c < 3; ++c) CHECK(gathered[r][c] == src[r][2 * c]);
  }
  for (r = 0; r < 6; ++r) {
    for (c = 0; c < 4; ++c) CHECK(transposed[r][c] == src[c][r]);
  }
  t = make_tensor(strided_dst, 2, shape, strides, kDLFloat, 32);
  CHECK_OK(dcp_state_dict_set_tensor(loaded, PATH(KEY("view")), &t, NULL));
  CHECK_OK(dcp_load(loaded, &lo));
  for (r = 0; r < 4; ++r) {
    for (c = 0; c < 6; ++c) {
      CHECK(strided_dst[r][c] == (c % 2 == 0 ? src[r][c] : 0.0f));
    }
  }
  CHECK_OK(dcp_state_dict_free(saved));
  CHECK_OK(dcp_state_dict_free(loaded));
}

/* Nested maps and lists of plain values, read back by dcp_state_dict_get. */
static void test_plain_values(void) {
  static const char kString[] = {'a', '\0', 'b', 'c'};
  static const unsigned char kBytes[] = {0, 255, 0, 7, 0};
  char dir[4200];
  dcp_state_dict_t* saved = NULL;
  dcp_state_dict_t* loaded = NULL;
  dcp_save_options_t so;
  dcp_load_options_t lo;
  dcp_leaf_info_t info = leaf_info();
  size_t n = 0;
  const char* name = NULL;

  CHECK_OK(dcp_state_dict_create(&saved));
  CHECK_OK(dcp_state_dict_set_int(saved, PATH(KEY("opt"), KEY("step")),
                                  -1234567890123LL));
  CHECK_OK(dcp_state_dict_set_float(saved, PATH(KEY("opt"), KEY("lr")), 0.125));
  CHECK_OK(dcp_state_dict_set_bool(
      saved, PATH(KEY("opt"), KEY("groups"), IDX(0), KEY("nesterov")), 1));
  CHECK_OK(dcp_state_dict_set_string(saved,
                                     PATH(KEY("opt"), KEY("groups"), IDX(2)),
                                     kString, sizeof(kString)));
  CHECK_OK(dcp_state_dict_set_bytes(saved, PATH(KEY("blob")), kBytes,
                                    sizeof(kBytes)));
  CHECK_OK(dcp_state_dict_set_none(saved, PATH(KEY("nothing"))));
  /* Leaves in flattened-name order; groups.1 is an unset (None) element. */
  CHECK_OK(dcp_state_dict_num_leaves(saved, &n));
  CHECK(n == 7);
  CHECK_OK(dcp_state_dict_leaf(saved, 0, &name, &info));
  CHECK(strcmp(name, "blob") == 0 && info.kind == DCP_VALUE_BYTES);
  CHECK_OK(dcp_state_dict_leaf(saved, 3, &name, &info));
  CHECK(strcmp(name, "opt.groups.1") == 0 && info.kind == DCP_VALUE_NONE);
  CHECK_OK(dcp_state_dict_leaf(saved, 6, &name, &info));
  CHECK(strcmp(name, "opt.step") == 0 && info.kind == DCP_VALUE_INT);
  CHECK_ERROR(dcp_state_dict_leaf(saved, 7, &name, &info), DCP_OUT_OF_RANGE,
              "leaf index 7");
  /* A path through a None finds nothing there (as a set would make the
   * container), like a missing key. */
  CHECK_ERROR(dcp_state_dict_get(saved, PATH(KEY("nothing"), KEY("x")), &info),
              DCP_NOT_FOUND, "no value at \"nothing.x\"");

  so = save_options(dir_for("values", dir, sizeof(dir)));
  CHECK_OK(dcp_save(saved, &so, NULL));

  /* The destination holds other values at the same paths. */
  CHECK_OK(dcp_state_dict_create(&loaded));
  CHECK_OK(dcp_state_dict_set_none(loaded, PATH(KEY("opt"), KEY("step"))));
  CHECK_OK(dcp_state_dict_set_int(loaded, PATH(KEY("opt"), KEY("lr")), 0));
  CHECK_OK(dcp_state_dict_set_none(
      loaded, PATH(KEY("opt"), KEY("groups"), IDX(0), KEY("nesterov"))));
  CHECK_OK(
      dcp_state_dict_set_none(loaded, PATH(KEY("opt"), KEY("groups"), IDX(2))));
  CHECK_OK(dcp_state_dict_set_none(loaded, PATH(KEY("blob"))));
  CHECK_OK(dcp_state_dict_set_int(loaded, PATH(KEY("nothing")), 5));
  lo = load_options(dir);
  CHECK_OK(dcp_load(loaded, &lo));

  CHECK_OK(dcp_state_dict_get(loaded, PATH(KEY("opt"), KEY("step")), &info));
  CHECK(info.kind == DCP_VALUE_INT && info.int_value == -1234567890123LL);
  CHECK_OK(dcp_state_dict_get(loaded, PATH(KEY("opt"), KEY("lr")), &info));
  CHECK(info.kind == DCP_VALUE_FLOAT && info.float_value == 0.125);
  CHECK_OK(dcp_state_dict_get(
      loaded, PATH(KEY("opt"), KEY("groups"), IDX(0), KEY("nesterov")), &info));
  CHECK(info.kind == DCP_VALUE_BOOL && info.bool_value == 1);
  CHECK_OK(dcp_state_dict_get(loaded, PATH(KEY("opt"), KEY("groups"), IDX(2)),
                              &info));
  CHECK(info.kind == DCP_VALUE_STRING && info.size == sizeof(kString) &&
        memcmp(info.data, kString, sizeof(kString)) == 0);
  CHECK_OK(dcp_state_dict_get(loaded, PATH(KEY("opt"), KEY("groups"), IDX(1)),
                              &info));
  CHECK(info.kind == DCP_VALUE_NONE);
  CHECK_OK(dcp_state_dict_get(loaded, PATH(KEY("blob")), &info));
  CHECK(info.kind == DCP_VALUE_BYTES && info.size == sizeof(kBytes) &&
        memcmp(info.data, kBytes, sizeof(kBytes)) == 0);
  CHECK_OK(dcp_state_dict_get(loaded, PATH(KEY("nothing")), &info));
  CHECK(info.kind == DCP_VALUE_NONE);
  CHECK_OK(dcp_state_dict_free(saved));
  CHECK_OK(dcp_state_dict_free(loaded));
}

/* A sharded tensor saved as two row chunks, loaded as three column chunks;
 * another set through dcp_state_dict_set_tensors with one whole chunk. */
static void test_resharding(void) {
  float global[4][6], cols[3][4][2], whole[2][2], whole_out[2][2];
  int64_t global_shape[2] = {4, 6};
  int64_t row_shape[2] = {2, 6};
  int64_t col_shape[2] = {4, 2};
  int64_t row_offsets[2][2] = {{0, 0}, {2, 0}};
  int64_t col_offsets[3][2] = {{0, 0}, {0, 2}, {0, 4}};
  const int64_t* row_offset_ptrs[2] = {row_offsets[0], row_offsets[1]};
  const int64_t* col_offset_ptrs[3] = {col_offsets[0], col_offsets[1],
                                       col_offsets[2]};
  int64_t whole_shape[2] = {2, 2};
  int64_t zero[2] = {0, 0};
  DLTensor rows[2], col_tensors[3], plain[2];
  dcp_shard_t shards[2];
  dcp_path_t paths[2];
  char dir[4200];
  dcp_state_dict_t* saved = NULL;
  dcp_state_dict_t* loaded = NULL;
  dcp_save_options_t so;
  dcp_load_options_t lo;
  dcp_leaf_info_t info = leaf_info();
  float scalar = 3.0f, scalar_out = 0.0f;
  int r, c, k;

  for (r = 0; r < 4; ++r) {
    for (c = 0; c < 6; ++c) global[r][c] = (float)(r * 100 + c);
  }
  for (r = 0; r < 2; ++r) {
    for (c = 0; c < 2; ++c) whole[r][c] = (float)(r * 2 + c + 1);
  }
  memset(cols, 0, sizeof(cols));
  memset(whole_out, 0, sizeof(whole_out));
  CHECK_OK(dcp_state_dict_create(&saved));
  rows[0] = make_tensor(global[0], 2, row_shape, NULL, kDLFloat, 32);
  rows[1] = make_tensor(global[2], 2, row_shape, NULL, kDLFloat, 32);
  CHECK_OK(dcp_state_dict_set_sharded_tensor(
      saved, PATH(KEY("w")), 2, global_shape, 2, rows, row_offset_ptrs));
  /* set_tensors: a sharded tensor of one whole chunk, and a plain one. */
  paths[0] = PATH(KEY("whole"));
  paths[1] = PATH(KEY("plain"));
  plain[0] = make_tensor(whole, 2, whole_shape, NULL, kDLFloat, 32);
  plain[1] = make_tensor(&scalar, 0, NULL, NULL, kDLFloat, 32);
  shards[0].ndim = 2;
  shards[0].global_shape = whole_shape;
  shards[0].offsets = zero;
  shards[1].ndim = 0;
  shards[1].global_shape = NULL;
  shards[1].offsets = NULL;
  CHECK_OK(dcp_state_dict_set_tensors(saved, 2, paths, plain, shards));
  {
    /* A shard ndim that disagrees with the chunk's is refused before it
     * sizes a read of global_shape or offsets (1 entry each here). */
    int64_t one_shape[1] = {4}, one_offset[1] = {0};
    dcp_shard_t wrong = {0};
    DLTensor row = make_tensor(whole, 1, one_shape, NULL, kDLFloat, 32);
    wrong.ndim = 100000000;
    wrong.global_shape = one_shape;
    wrong.offsets = one_offset;
    CHECK_ERROR(
        dcp_state_dict_set_tensor(saved, PATH(KEY("wrong")), &row, &wrong),
        DCP_INVALID_ARGUMENT, "has ndim 1 but the global shape has 100000000");
  }
  CHECK_OK(dcp_state_dict_get(saved, PATH(KEY("w")), &info));
  CHECK(info.kind == DCP_VALUE_SHARDED_TENSOR && info.ndim == 2 &&
        info.shape[0] == 4 && info.shape[1] == 6 &&
        info.dtype == DCP_DTYPE_F32);
  CHECK_OK(dcp_state_dict_get(saved, PATH(KEY("whole")), &info));
  CHECK(info.kind == DCP_VALUE_SHARDED_TENSOR);
  CHECK_OK(dcp_state_dict_get(saved, PATH(KEY("plain")), &info));
  CHECK(info.kind == DCP_VALUE_TENSOR && info.ndim == 0);
  so = save_options(dir_for("sharded", dir, sizeof(dir)));
  CHECK_OK(dcp_save(saved, &so, NULL));

  CHECK_OK(dcp_state_dict_create(&loaded));
  for (k = 0; k < 3; ++k) {
    col_tensors[k] = make_tensor(cols[k], 2, col_shape, NULL, kDLFloat, 32);
  }
  CHECK_OK(dcp_state_dict_set_sharded_tensor(loaded, PATH(KEY("w")), 2,
                                             global_shape, 3, col_tensors,
                                             col_offset_ptrs));
  /* The sharded "whole" loads into a plain tensor, and back. */
  plain[0].data = whole_out;
  plain[1].data = &scalar_out;
  CHECK_OK(dcp_state_dict_set_tensors(loaded, 2, paths, plain, NULL));
  lo = load_options(dir);
  CHECK_OK(dcp_load(loaded, &lo));
  for (k = 0; k < 3; ++k) {
    for (r = 0; r < 4; ++r) {
      for (c = 0; c < 2; ++c) CHECK(cols[k][r][c] == global[r][2 * k + c]);
    }
  }
  CHECK(memcmp(whole, whole_out, sizeof(whole)) == 0);
  CHECK(scalar_out == 3.0f);
  CHECK_OK(dcp_state_dict_free(saved));
  CHECK_OK(dcp_state_dict_free(loaded));
}

/* What a checkpoint holds, from dcp_save's result and from disk. */
/* The packed items of `md` (dcp_metadata_items_packed) say what the
 * per-item calls say; `*shared_key` counts path keys that point at a string
 * another item's path key already pointed at. */
static void check_packed_items(const dcp_metadata_t* md, int* shared_key) {
  const int64_t* r = NULL;
  const char* text = NULL;
  size_t num_records = 0, text_size = 0, n = 0, i, at = 0, e, d, c;
  int64_t model_at = -1;
  dcp_item_info_t item;
  dcp_path_elem_t elem;
  const int64_t* offsets = NULL;
  const int64_t* sizes = NULL;

  memset(&item, 0, sizeof(item));
  item.struct_size = sizeof(item);
  *shared_key = 0;
  CHECK_OK(dcp_metadata_items_packed(md, &r, &num_records, &text, &text_size));
  CHECK_OK(dcp_metadata_num_items(md, &n));
  for (i = 0; i < n; ++i) {
    CHECK_OK(dcp_metadata_item(md, i, &item));
    CHECK(at + 8 <= num_records);
    CHECK(r[at] >= 0 && (size_t)(r[at] + r[at + 1]) <= text_size);
    CHECK((size_t)r[at + 1] == strlen(item.name) &&
          memcmp(text + r[at], item.name, (size_t)r[at + 1]) == 0);
    CHECK(r[at + 2] == item.is_tensor && r[at + 3] == item.dtype);
    CHECK(r[at + 4] == item.requires_grad && r[at + 5] == item.ndim);
    CHECK((size_t)r[at + 6] == item.path_len);
    CHECK((size_t)r[at + 7] == item.num_chunks);
    at += 8;
    for (d = 0; d < (size_t)item.ndim; ++d) CHECK(r[at++] == item.shape[d]);
    for (e = 0; e < item.path_len; ++e) {
      CHECK_OK(dcp_metadata_item_path(md, i, e, &elem));
      if (elem.key == NULL) {
        CHECK(r[at] == -1 && r[at + 1] == elem.index);
      } else {
        CHECK((size_t)r[at + 1] == strlen(elem.key) &&
              memcmp(text + r[at], elem.key, (size_t)r[at + 1]) == 0);
        if (strcmp(elem.key, "model") == 0) {
          if (model_at >= 0 && model_at == r[at]) ++*shared_key;
          model_at = r[at];
        }
      }
      at += 2;
    }
    for (c = 0; c < item.num_chunks; ++c) {
      CHECK_OK(dcp_metadata_chunk(md, i, c, &offsets, &sizes));
      for (d = 0; d < (size_t)item.ndim; ++d) CHECK(r[at++] == offsets[d]);
      for (d = 0; d < (size_t)item.ndim; ++d) CHECK(r[at++] == sizes[d]);
    }
  }
  CHECK(at == num_records);
  CHECK_ERROR(
      dcp_metadata_items_packed(md, NULL, &num_records, &text, &text_size),
      DCP_INVALID_ARGUMENT, "records");
}

/* The packed storage entries of `md` say what dcp_metadata_storage says. */
static void check_packed_storage(const dcp_metadata_t* md) {
  const int64_t* r = NULL;
  const char* text = NULL;
  size_t num_records = 0, text_size = 0, n = 0, i, at = 0, d;
  dcp_storage_info_t where;

  memset(&where, 0, sizeof(where));
  where.struct_size = sizeof(where);
  CHECK_OK(
      dcp_metadata_storage_packed(md, &r, &num_records, &text, &text_size));
  CHECK_OK(dcp_metadata_num_storage(md, &n));
  CHECK(n > 0);
  for (i = 0; i < n; ++i) {
    CHECK_OK(dcp_metadata_storage(md, i, &where));
    CHECK(at + 4 <= num_records);
    CHECK((size_t)r[at + 1] == strlen(where.name) &&
          memcmp(text + r[at], where.name, (size_t)r[at + 1]) == 0);
    CHECK(r[at + 2] == where.has_offsets && r[at + 3] == where.ndim);
    at += 4;
    for (d = 0; d < (size_t)where.ndim; ++d) {
      CHECK(r[at++] == where.offsets[d]);
    }
    CHECK((size_t)r[at + 1] == strlen(where.relative_path) &&
          memcmp(text + r[at], where.relative_path, (size_t)r[at + 1]) == 0);
    CHECK(r[at + 2] == where.offset && r[at + 3] == where.length);
    at += 4;
  }
  CHECK(at == num_records);
}

static void test_metadata(void) {
  float a[2][3] = {{1, 2, 3}, {4, 5, 6}};
  int64_t a_shape[2] = {2, 3};
  int64_t half_shape[2] = {1, 3};
  int64_t offsets[2][2] = {{0, 0}, {1, 0}};
  const int64_t* offset_ptrs[2] = {offsets[0], offsets[1]};
  DLTensor chunks[2];
  char dir[4200];
  dcp_state_dict_t* sd = NULL;
  dcp_metadata_t* from_save = NULL;
  dcp_metadata_t* from_disk = NULL;
  dcp_metadata_t* decoded = NULL;
  dcp_metadata_t* both[3];
  char* encoded = NULL;
  size_t encoded_size = 0, asked = 0;
  dcp_save_options_t so;
  dcp_item_info_t item;
  dcp_path_elem_t elem;
  size_t n = 0, index = 99, lo = 0, hi = 0;
  const int64_t* chunk_offsets = NULL;
  const int64_t* chunk_sizes = NULL;
  const char* checkpoint_id = NULL;
  const char* save_id = NULL;
  int m, shared = 0;

  CHECK_OK(dcp_state_dict_create(&sd));
  chunks[0] = make_tensor(a[0], 2, half_shape, NULL, kDLFloat, 32);
  chunks[1] = make_tensor(a[1], 2, half_shape, NULL, kDLFloat, 32);
  CHECK_OK(dcp_state_dict_set_sharded_tensor(
      sd, PATH(KEY("model"), KEY("layers"), IDX(1), KEY("w")), 2, a_shape, 2,
      chunks, offset_ptrs));
  CHECK_OK(dcp_state_dict_set_int(sd, PATH(KEY("step")), 7));
  so = save_options(dir_for("metadata", dir, sizeof(dir)));
  CHECK_OK(dcp_save(sd, &so, &from_save));
  CHECK(from_save != NULL);
  CHECK_OK(dcp_metadata_read(dir, &from_disk));
  /* Encoded and decoded again (what a writer process sends its parent). */
  CHECK_OK(dcp_metadata_encode(from_save, NULL, 0, &encoded_size));
  CHECK(encoded_size > 0);
  encoded = (char*)malloc(encoded_size);
  CHECK_ERROR(dcp_metadata_encode(from_save, encoded, encoded_size - 1, &asked),
              DCP_OUT_OF_RANGE, "the buffer holds");
  CHECK_OK(dcp_metadata_encode(from_save, encoded, encoded_size, &asked));
  CHECK(asked == encoded_size);
  CHECK_OK(dcp_metadata_decode(encoded, encoded_size, "sent", &decoded));
  CHECK_ERROR(dcp_metadata_decode(encoded, encoded_size / 2, "half", &both[2]),
              DCP_DATA_LOSS, "half");
  CHECK_ERROR(dcp_metadata_decode(NULL, 4, NULL, &both[2]),
              DCP_INVALID_ARGUMENT, "NULL");
  free(encoded);
  both[0] = from_save;
  both[1] = from_disk;
  both[2] = decoded;
  for (m = 0; m < 3; ++m) {
    const dcp_metadata_t* md = both[m];
    /* layers.0 is the None the list was padded with. */
    CHECK_OK(dcp_metadata_num_items(md, &n));
    CHECK(n == 3);
    memset(&item, 0, sizeof(item));
    item.struct_size = sizeof(item);
    CHECK_OK(dcp_metadata_item(md, 0, &item));
    CHECK(strcmp(item.name, "model.layers.0") == 0 && item.is_tensor == 0);
    CHECK_OK(dcp_metadata_item(md, 1, &item));
    CHECK(strcmp(item.name, "model.layers.1.w") == 0);
    CHECK(item.is_tensor == 1 && item.dtype == DCP_DTYPE_F32);
    CHECK(item.ndim == 2 && item.shape[0] == 2 && item.shape[1] == 3);
    CHECK(item.num_chunks == 2 && item.requires_grad == 0);
    CHECK(item.path_len == 4);
    if (dcp_metadata_chunk(md, 1, 1, &chunk_offsets, &chunk_sizes) == DCP_OK) {
      CHECK(chunk_offsets[0] == 1 && chunk_offsets[1] == 0);
      CHECK(chunk_sizes[0] == 1 && chunk_sizes[1] == 3);
    } else {
      CHECK(0 && "dcp_metadata_chunk");
    }
    CHECK_OK(dcp_metadata_item_path(md, 1, 0, &elem));
    CHECK(elem.key != NULL && strcmp(elem.key, "model") == 0);
    CHECK_OK(dcp_metadata_item_path(md, 1, 2, &elem));
    CHECK(elem.key == NULL && elem.index == 1);
    CHECK_ERROR(dcp_metadata_item_path(md, 1, 4, &elem), DCP_OUT_OF_RANGE,
                "model.layers.1.w");
    CHECK_ERROR(dcp_metadata_chunk(md, 1, 2, &chunk_offsets, &chunk_sizes),
                DCP_OUT_OF_RANGE, "model.layers.1.w");
    CHECK_OK(dcp_metadata_item(md, 2, &item));
    CHECK(strcmp(item.name, "step") == 0 && item.is_tensor == 0);
    CHECK(item.num_chunks == 0 && item.path_len == 1);
    CHECK_ERROR(dcp_metadata_chunk(md, 2, 0, &chunk_offsets, &chunk_sizes),
                DCP_INVALID_ARGUMENT, "\"step\" is a plain value");
    CHECK_ERROR(dcp_metadata_item(md, 3, &item), DCP_OUT_OF_RANGE, "index 3");
    CHECK_OK(dcp_metadata_find(md, "step", &index));
    CHECK(index == 2);
    CHECK_ERROR(dcp_metadata_find(md, "model", &index), DCP_NOT_FOUND,
                "\"model\"");
    CHECK_OK(dcp_metadata_find_path(
        md, PATH(KEY("model"), KEY("layers"), IDX(1), KEY("w")), &index));
    CHECK(index == 1);
    CHECK_OK(dcp_metadata_find_path(
        md, PATH(KEY("model"), KEY("layers"), IDX(0)), &index));
    CHECK(index == 0);
    /* The same name, another path. */
    CHECK_ERROR(dcp_metadata_find_path(
                    md, PATH(KEY("model.layers"), IDX(1), KEY("w")), &index),
                DCP_NOT_FOUND, "\"model.layers.1.w\"");
    CHECK_ERROR(dcp_metadata_find_path(md, PATH(KEY("model")), &index),
                DCP_NOT_FOUND, "\"model\"");
    CHECK_OK(
        dcp_metadata_find_prefix(md, "model.layers.", &index, &n, &lo, &hi));
    CHECK(index == 0 && n == 2 && lo == 3 && hi == 4);
    CHECK_OK(dcp_metadata_find_prefix(md, "model.layers.1.", &index, &n, NULL,
                                      NULL));
    CHECK(index == 1 && n == 1);
    CHECK_OK(dcp_metadata_find_prefix(md, "", &index, &n, &lo, &hi));
    CHECK(index == 0 && n == 3 && lo == 1 && hi == 4);
    CHECK_OK(dcp_metadata_find_prefix(md, "st", &index, &n, &lo, NULL));
    CHECK(index == 2 && n == 1 && lo == 1);
    CHECK_OK(
        dcp_metadata_find_prefix(md, "model.layers.2", &index, &n, &lo, &hi));
    CHECK(index == 2 && n == 0 && lo == 0 && hi == 0);
    CHECK_OK(dcp_metadata_find_prefix(md, "zz", &index, &n, NULL, NULL));
    CHECK(index == 3 && n == 0);
    CHECK_ERROR(dcp_metadata_find_prefix(md, NULL, &index, &n, NULL, NULL),
                DCP_INVALID_ARGUMENT, "prefix is NULL");
    CHECK_ERROR(dcp_metadata_find_prefix(md, "m", &index, NULL, NULL, NULL),
                DCP_INVALID_ARGUMENT, "count");
    CHECK_OK(dcp_metadata_ids(md, &checkpoint_id, &save_id));
    CHECK(strcmp(checkpoint_id, dir) == 0);
    CHECK(strlen(save_id) > 0);
    /* "model" starts the paths of two items: one copy in the text. */
    check_packed_items(md, &shared);
    CHECK(shared == 1);
    check_packed_items(md, &shared); /* the kept packing, again */
    check_packed_storage(md);
  }
  CHECK_OK(dcp_metadata_free(from_save));
  CHECK_OK(dcp_metadata_free(from_disk));
  CHECK_OK(dcp_metadata_free(decoded));
  CHECK_OK(dcp_state_dict_free(sd));
}

/* requires_grad marks, the format version and storage data of a save, a
 * reader's own metadata read (native and Hugging Face), and the load's
 * device wait with host tensors (nothing to order: accepted). */
static void test_metadata_extras(void) {
  float w[4] = {1, 2, 3, 4}, b[2] = {5, 6}, w_out[4], b_out[2];
  int64_t w_shape[1] = {4}, b_shape[1] = {2};
  const dcp_path_t marked[1] = {PATH(KEY("model"), KEY("w"))};
  const dcp_path_t step_path[1] = {PATH(KEY("step"))};
  const dcp_path_t missing[1] = {PATH(KEY("model"), KEY("x"))};
  char dir[4200], hf_dir[4200];
  dcp_state_dict_t* sd = NULL;
  dcp_metadata_t* md = NULL;
  dcp_storage_reader_t* reader = NULL;
  dcp_storage_writer_t* writer = NULL;
  dcp_save_options_t so;
  dcp_load_options_t lo;
  dcp_item_info_t item;
  dcp_storage_info_t where;
  const char* version = NULL;
  size_t n = 0, index = 0, i;
  int found_w = 0, found_step = 0;
  DLTensor t;

  memset(&item, 0, sizeof(item));
  item.struct_size = sizeof(item);
  memset(&where, 0, sizeof(where));
  where.struct_size = sizeof(where);
  CHECK_OK(dcp_state_dict_create(&sd));
  t = make_tensor(w, 1, w_shape, NULL, kDLFloat, 32);
  CHECK_OK(
      dcp_state_dict_set_tensor(sd, PATH(KEY("model"), KEY("w")), &t, NULL));
  t = make_tensor(b, 1, b_shape, NULL, kDLFloat, 32);
  CHECK_OK(
      dcp_state_dict_set_tensor(sd, PATH(KEY("model"), KEY("b")), &t, NULL));
  CHECK_OK(dcp_state_dict_set_int(sd, PATH(KEY("step")), 3));
  CHECK_OK(dcp_state_dict_mark_requires_grad(sd, 1, marked));
  CHECK_ERROR(dcp_state_dict_mark_requires_grad(sd, 1, step_path),
              DCP_INVALID_ARGUMENT, "\"step\"");
  CHECK_ERROR(dcp_state_dict_mark_requires_grad(sd, 1, missing), DCP_NOT_FOUND,
              "model.x");
  CHECK_ERROR(dcp_state_dict_mark_requires_grad(sd, 1, NULL),
              DCP_INVALID_ARGUMENT, "paths is NULL");
  so = save_options(dir_for("extras", dir, sizeof(dir)));
  CHECK_OK(dcp_save(sd, &so, &md));

  /* requires_grad as marked, version, storage data. */
  CHECK_OK(dcp_metadata_find(md, "model.w", &index));
  CHECK_OK(dcp_metadata_item(md, index, &item));
  CHECK(item.requires_grad == 1);
  CHECK_OK(dcp_metadata_find(md, "model.b", &index));
  CHECK_OK(dcp_metadata_item(md, index, &item));
  CHECK(item.requires_grad == 0);
  CHECK_OK(dcp_metadata_version(md, &version));
  CHECK(strcmp(version, "dcp-1") == 0);
  CHECK_ERROR(dcp_metadata_version(md, NULL), DCP_INVALID_ARGUMENT, "version");
  CHECK_OK(dcp_metadata_num_storage(md, &n));
  CHECK(n == 3);
  for (i = 0; i < n; ++i) {
    CHECK_OK(dcp_metadata_storage(md, i, &where));
    CHECK(where.relative_path != NULL && strlen(where.relative_path) > 0);
    if (strcmp(where.name, "model.w") == 0) {
      found_w = 1;
      CHECK(where.has_offsets == 1 && where.ndim == 1 && where.offsets[0] == 0);
      CHECK(where.length == (int64_t)sizeof(w) && where.offset >= 0);
    } else if (strcmp(where.name, "step") == 0) {
      found_step = 1;
      CHECK(where.has_offsets == 0 && where.ndim == 0 && where.length > 0);
    }
  }
  CHECK(found_w && found_step);
  CHECK_ERROR(dcp_metadata_storage(md, 3, &where), DCP_OUT_OF_RANGE, "index 3");
  CHECK_OK(dcp_metadata_free(md));

  /* The same metadata, read through a reader handle. */
  CHECK_OK(dcp_fs_reader_create(dir, NULL, &reader));
  CHECK_OK(dcp_storage_reader_read_metadata(reader, NULL, &md));
  CHECK_OK(dcp_metadata_find(md, "model.w", &index));
  CHECK_OK(dcp_metadata_item(md, index, &item));
  CHECK(item.requires_grad == 1);
  CHECK_OK(dcp_metadata_free(md));
  CHECK_ERROR(dcp_storage_reader_read_metadata(reader, "", &md),
              DCP_INVALID_ARGUMENT, "empty");
  CHECK_ERROR(dcp_storage_reader_read_metadata(reader, NULL, NULL),
              DCP_INVALID_ARGUMENT, "dcp_metadata_t**");
  CHECK_ERROR(dcp_storage_reader_read_metadata(
                  reader, dir_for("extras-none", hf_dir, sizeof(hf_dir)), &md),
              DCP_NOT_FOUND, "extras-none");
  CHECK_OK(dcp_storage_reader_free(reader));

  /* A leaf set again loses its mark. */
  t = make_tensor(w, 1, w_shape, NULL, kDLFloat, 32);
  CHECK_OK(
      dcp_state_dict_set_tensor(sd, PATH(KEY("model"), KEY("w")), &t, NULL));
  CHECK_OK(dcp_save(sd, &so, &md));
  CHECK_OK(dcp_metadata_find(md, "model.w", &index));
  CHECK_OK(dcp_metadata_item(md, index, &item));
  CHECK(item.requires_grad == 0);
  CHECK_OK(dcp_metadata_free(md));
  CHECK_OK(dcp_state_dict_free(sd));

  /* A load with a device wait but no device tensor: nothing to order. */
  CHECK_OK(dcp_state_dict_create(&sd));
  t = make_tensor(w_out, 1, w_shape, NULL, kDLFloat, 32);
  CHECK_OK(
      dcp_state_dict_set_tensor(sd, PATH(KEY("model"), KEY("w")), &t, NULL));
  t = make_tensor(b_out, 1, b_shape, NULL, kDLFloat, 32);
  CHECK_OK(
      dcp_state_dict_set_tensor(sd, PATH(KEY("model"), KEY("b")), &t, NULL));
  lo = load_options(dir);
  lo.device_wait.kind = DCP_DEVICE_WAIT_STREAM;
  CHECK_OK(dcp_load(sd, &lo));
  CHECK(memcmp(w, w_out, sizeof(w)) == 0 && memcmp(b, b_out, sizeof(b)) == 0);
  lo.device_wait.kind = 7;
  CHECK_ERROR(dcp_load(sd, &lo), DCP_INVALID_ARGUMENT, "kind");
  CHECK_OK(dcp_state_dict_free(sd));

  /* A Hugging Face directory's metadata through its reader. */
  CHECK_OK(dcp_hf_writer_create(dir_for("extras-hf", hf_dir, sizeof(hf_dir)),
                                NULL, &writer));
  CHECK_OK(dcp_state_dict_create(&sd));
  t = make_tensor(w, 1, w_shape, NULL, kDLFloat, 32);
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("w")), &t, NULL));
  so = save_options(NULL);
  so.storage_writer = writer;
  CHECK_OK(dcp_save(sd, &so, NULL));
  CHECK_OK(dcp_state_dict_free(sd));
  CHECK_OK(dcp_storage_writer_free(writer));
  CHECK_OK(dcp_hf_reader_create(hf_dir, NULL, &reader));
  CHECK_OK(dcp_storage_reader_read_metadata(reader, NULL, &md));
  CHECK_OK(dcp_metadata_num_items(md, &n));
  CHECK(n == 1);
  CHECK_OK(dcp_metadata_item(md, 0, &item));
  CHECK(strcmp(item.name, "w") == 0 && item.is_tensor == 1);
  CHECK(item.dtype == DCP_DTYPE_F32 && item.ndim == 1 && item.shape[0] == 4);
  CHECK_OK(dcp_metadata_free(md));
  CHECK_ERROR(dcp_storage_reader_read_metadata(reader, dir, &md), DCP_NOT_FOUND,
              "extras");
  CHECK_OK(dcp_storage_reader_free(reader));
}

/* dcp_fs_writer_options_t.compression: a zstd checkpoint loads back bit
 * for bit; a bad setting is refused naming the field. */
static void test_writer_compression(void) {
  static int32_t src[65536], dst[65536];
  int64_t shape[1] = {65536};
  char dir[4200];
  dcp_fs_writer_options_t wo;
  dcp_storage_writer_t* writer = NULL;
  dcp_state_dict_t* sd = NULL;
  dcp_save_options_t so;
  DLTensor t;
  int i;

  for (i = 0; i < 65536; ++i) src[i] = i % 7;
  memset(&wo, 0, sizeof(wo));
  wo.struct_size = sizeof(wo);
  wo.compression = "zstd:99";
  dir_for("compression", dir, sizeof(dir));
  CHECK_ERROR(dcp_fs_writer_create(dir, &wo, &writer), DCP_INVALID_ARGUMENT,
              "dcp_fs_writer_options_t.compression");
  wo.compression = "zstd:3";
  CHECK_OK(dcp_fs_writer_create(dir, &wo, &writer));
  CHECK_OK(dcp_state_dict_create(&sd));
  t = make_tensor(src, 1, shape, NULL, kDLInt, 32);
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("x")), &t, NULL));
  so = save_options(dir);
  so.storage_writer = writer;
  CHECK_OK(dcp_save(sd, &so, NULL));
  t.data = dst;
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("x")), &t, NULL));
  {
    dcp_load_options_t lo = load_options(dir);
    CHECK_OK(dcp_load(sd, &lo));
  }
  CHECK(memcmp(src, dst, sizeof(src)) == 0);
  CHECK_OK(dcp_storage_writer_free(writer));
  CHECK_OK(dcp_state_dict_free(sd));
}

/* dcp_fs_writer_options_t.serialization_format: safetensors data files
 * load back bit for bit; an unknown value is refused naming the field, and
 * safetensors with compression fails the save. */
static void test_writer_safetensors(void) {
  int32_t src[8] = {1, 2, 3, 4, 5, 6, 7, 8}, dst[8];
  int64_t shape[1] = {8};
  char dir[4200];
  dcp_fs_writer_options_t wo;
  dcp_storage_writer_t* writer = NULL;
  dcp_state_dict_t* sd = NULL;
  dcp_save_options_t so;
  DLTensor t;

  memset(&wo, 0, sizeof(wo));
  wo.struct_size = sizeof(wo);
  wo.serialization_format = 7;
  dir_for("safetensors", dir, sizeof(dir));
  CHECK_ERROR(dcp_fs_writer_create(dir, &wo, &writer), DCP_INVALID_ARGUMENT,
              "dcp_fs_writer_options_t.serialization_format");
  wo.serialization_format = DCP_SERIALIZATION_FORMAT_SAFETENSORS;
  CHECK_OK(dcp_state_dict_create(&sd));
  t = make_tensor(src, 1, shape, NULL, kDLInt, 32);
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("x")), &t, NULL));
  wo.compression = "zstd";
  CHECK_OK(dcp_fs_writer_create(dir, &wo, &writer));
  so = save_options(dir);
  so.storage_writer = writer;
  CHECK(dcp_save(sd, &so, NULL) != DCP_OK);
  CHECK_OK(dcp_storage_writer_free(writer));
  wo.compression = NULL;
  CHECK_OK(dcp_fs_writer_create(dir, &wo, &writer));
  so.storage_writer = writer;
  CHECK_OK(dcp_save(sd, &so, NULL));
  t.data = dst;
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("x")), &t, NULL));
  {
    dcp_load_options_t lo = load_options(dir);
    CHECK_OK(dcp_load(sd, &lo));
  }
  CHECK(memcmp(src, dst, sizeof(src)) == 0);
  CHECK_OK(dcp_storage_writer_free(writer));
  CHECK_OK(dcp_state_dict_free(sd));
}

/* A storage writer and reader of the caller's, pointed at checkpoint_id. */
static void test_writer_and_reader_handles(void) {
  int32_t src[8] = {1, 2, 3, 4, 5, 6, 7, 8}, dst[8];
  int64_t shape[1] = {8};
  char dir[4200], other[4200];
  dcp_fs_writer_options_t wo;
  dcp_fs_reader_options_t ro;
  dcp_storage_writer_t* writer = NULL;
  dcp_storage_reader_t* reader = NULL;
  dcp_state_dict_t* sd = NULL;
  dcp_metadata_t* md = NULL;
  dcp_save_options_t so;
  dcp_load_options_t lo;
  DLTensor t;

  memset(&wo, 0, sizeof(wo));
  wo.struct_size = sizeof(wo);
  wo.sync_files = DCP_FALSE;
  wo.direct_io = DCP_FALSE;
  wo.thread_count = 2;
  memset(&ro, 0, sizeof(ro));
  ro.struct_size = sizeof(ro);
  ro.direct_io = DCP_FALSE;
  dir_for("writer-first", other, sizeof(other));
  CHECK_OK(dcp_fs_writer_create(other, &wo, &writer));
  CHECK_OK(dcp_fs_reader_create(other, &ro, &reader));
  CHECK_OK(dcp_state_dict_create(&sd));
  t = make_tensor(src, 1, shape, NULL, kDLInt, 32);
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("x")), &t, NULL));
  /* checkpoint_id with a writer: the writer is pointed at it. */
  so = save_options(dir_for("writer-second", dir, sizeof(dir)));
  so.storage_writer = writer;
  CHECK_OK(dcp_save(sd, &so, NULL));
  CHECK_OK(dcp_metadata_read(dir, &md));
  CHECK_OK(dcp_metadata_free(md));
  CHECK_ERROR(dcp_metadata_read(other, &md), DCP_NOT_FOUND, other);
  /* The same writer again, at its (new) location: a fresh save id. */
  so.checkpoint_id = NULL;
  CHECK_OK(dcp_save(sd, &so, NULL));

  memset(dst, 0, sizeof(dst));
  t.data = dst;
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("x")), &t, NULL));
  lo = load_options(dir);
  lo.storage_reader = reader;
  CHECK_OK(dcp_load(sd, &lo));
  CHECK(memcmp(src, dst, sizeof(src)) == 0);
  CHECK_OK(dcp_storage_writer_free(writer));
  CHECK_OK(dcp_storage_reader_free(reader));
  CHECK_OK(dcp_state_dict_free(sd));
}

/* dcp_load_options_t.metadata: a load plans against the metadata the
 * caller read and does not read the file again; another checkpoint's
 * metadata fails the load. */
static void test_load_with_read_metadata(void) {
  int32_t first[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  int32_t second[8] = {9, 9, 9, 9, 9, 9, 9, 9};
  int32_t dst[8];
  int64_t shape[1] = {8};
  char dir[4200], other[4200], path[4300];
  dcp_state_dict_t* sd = NULL;
  dcp_metadata_t* md = NULL;
  dcp_save_options_t so;
  dcp_load_options_t lo;
  DLTensor t;
  FILE* f;

  CHECK_OK(dcp_state_dict_create(&sd));
  t = make_tensor(first, 1, shape, NULL, kDLInt, 32);
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("x")), &t, NULL));
  so = save_options(dir_for("read-metadata", dir, sizeof(dir)));
  CHECK_OK(dcp_save(sd, &so, NULL));
  t.data = second;
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("x")), &t, NULL));
  so = save_options(dir_for("read-metadata-other", other, sizeof(other)));
  CHECK_OK(dcp_save(sd, &so, NULL));
  CHECK_OK(dcp_metadata_read(dir, &md));

  /* The file is garbage now: only the metadata read before can plan. */
  snprintf(path, sizeof(path), "%s/.metadata", dir);
  f = fopen(path, "wb");
  CHECK(f != NULL);
  fputs("not a checkpoint", f);
  fclose(f);
  memset(dst, 0, sizeof(dst));
  t.data = dst;
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("x")), &t, NULL));
  lo = load_options(dir);
  CHECK_ERROR(dcp_load(sd, &lo), DCP_DATA_LOSS, ".metadata");
  lo.metadata = md;
  CHECK_OK(dcp_load(sd, &lo));
  CHECK(memcmp(first, dst, sizeof(first)) == 0);

  /* Another checkpoint's metadata names data files (each save's own) that
   * this location lacks. */
  memset(dst, 0, sizeof(dst));
  lo.checkpoint_id = other;
  CHECK_ERROR(dcp_load(sd, &lo), DCP_DATA_LOSS, ".distcp is missing");
  CHECK(dst[0] == 0);
  /* A handle of another type is refused before anything is read. */
  lo.metadata = (const dcp_metadata_t*)sd;
  CHECK_ERROR(dcp_load(sd, &lo), DCP_INVALID_ARGUMENT, "dcp_metadata_t");
  CHECK_OK(dcp_metadata_free(md));
  CHECK_OK(dcp_state_dict_free(sd));
}

/* dcp_state_dict_dtype_mismatches: the tensor leaves a load would refuse
 * for their dtype, with the checkpoint's dtypes; leaves the checkpoint
 * lacks or holds as plain values do not count. */
static void test_dtype_mismatches(void) {
  float f32[4] = {1, 2, 3, 4};
  int32_t i32[4] = {5, 6, 7, 8};
  double f64[4];
  int64_t shape[1] = {4};
  size_t indices[4], count = 99;
  int32_t dtypes[4];
  const char* name = NULL;
  dcp_leaf_info_t info;
  char dir[4200];
  dcp_state_dict_t* sd = NULL;
  dcp_metadata_t* md = NULL;
  dcp_save_options_t so;
  dcp_load_options_t lo;
  DLTensor a, b, c;

  CHECK_OK(dcp_state_dict_create(&sd));
  a = make_tensor(f32, 1, shape, NULL, kDLFloat, 32);
  b = make_tensor(i32, 1, shape, NULL, kDLInt, 32);
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("m"), KEY("a")), &a, NULL));
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("m"), KEY("b")), &b, NULL));
  CHECK_OK(dcp_state_dict_set_int(sd, PATH(KEY("v")), 3));
  so = save_options(dir_for("dtype-mismatches", dir, sizeof(dir)));
  CHECK_OK(dcp_save(sd, &so, NULL));
  CHECK_OK(dcp_metadata_read(dir, &md));
  CHECK_OK(dcp_state_dict_free(sd));

  /* m.a as f64 (mismatch), m.b as i32 (same), v as a tensor (a plain value
   * in the checkpoint), z (not in the checkpoint). */
  CHECK_OK(dcp_state_dict_create(&sd));
  c = make_tensor(f64, 1, shape, NULL, kDLFloat, 64);
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("m"), KEY("a")), &c, NULL));
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("m"), KEY("b")), &b, NULL));
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("v")), &c, NULL));
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("z")), &c, NULL));
  CHECK_OK(dcp_state_dict_dtype_mismatches(sd, md, 0, NULL, NULL, &count));
  CHECK(count == 1);
  CHECK_OK(dcp_state_dict_dtype_mismatches(sd, md, 4, indices, dtypes, &count));
  CHECK(count == 1 && dtypes[0] == DCP_DTYPE_F32);
  info.struct_size = sizeof(info);
  CHECK_OK(dcp_state_dict_leaf(sd, indices[0], &name, &info));
  CHECK(strcmp(name, "m.a") == 0 && info.dtype == DCP_DTYPE_F64);
  /* What the load refuses, naming the tensor. */
  lo = load_options(dir);
  CHECK_ERROR(dcp_load(sd, &lo), DCP_INVALID_ARGUMENT, "\"m.a\"");
  /* With convert_dtypes, m.a loads widened into f64 (v and z still fail:
   * dropped here). */
  {
    dcp_load_planner_options_t po;
    dcp_state_dict_t* convert = NULL;
    int k;
    memset(&po, 0, sizeof(po));
    po.struct_size = sizeof(po);
    po.convert_dtypes = DCP_TRUE;
    lo.planner = &po;
    memset(f64, 0, sizeof(f64));
    CHECK_OK(dcp_state_dict_create(&convert));
    CHECK_OK(
        dcp_state_dict_set_tensor(convert, PATH(KEY("m"), KEY("a")), &c, NULL));
    CHECK_OK(dcp_load(convert, &lo));
    for (k = 0; k < 4; ++k) CHECK(f64[k] == (double)f32[k]);
    po.convert_dtypes = 7;
    CHECK_ERROR(dcp_load(convert, &lo), DCP_INVALID_ARGUMENT, "convert_dtypes");
    lo.planner = NULL;
    CHECK_OK(dcp_state_dict_free(convert));
  }
  CHECK_ERROR(dcp_state_dict_dtype_mismatches(sd, md, 0, NULL, NULL, NULL),
              DCP_INVALID_ARGUMENT, "count");
  CHECK_ERROR(dcp_state_dict_dtype_mismatches(sd, (const dcp_metadata_t*)sd, 0,
                                              NULL, NULL, &count),
              DCP_INVALID_ARGUMENT, "dcp_metadata_t");
  CHECK_OK(dcp_metadata_free(md));
  CHECK_OK(dcp_state_dict_free(sd));
}

/* ------------------------------------------------------------------------
 * Hugging Face storage
 * ---------------------------------------------------------------------- */

/* The whole file at `path` into `buf` (NUL-terminated); its size, or -1. */
static long read_file(const char* path, char* buf, size_t size) {
  FILE* f = fopen(path, "rb");
  size_t n;
  if (f == NULL) return -1;
  n = fread(buf, 1, size - 1, f);
  fclose(f);
  buf[n] = '\0';
  return (long)n;
}

static dcp_hf_writer_options_t hf_writer_options(void) {
  dcp_hf_writer_options_t o;
  memset(&o, 0, sizeof(o));
  o.struct_size = sizeof(o);
  o.sync_files = DCP_FALSE;
  return o;
}

/* A save through the HF writer with a mapping into two files, then a load
 * through the HF reader into another sharding. */
static void test_hf_roundtrip(void) {
  int32_t a[4][6], a_cols[3][4][2];
  float b[5], b_out[5];
  uint8_t c[3] = {1, 0, 1}, c_out[3] = {0, 0, 0};
  int64_t a_shape[2] = {4, 6}, col_shape[2] = {4, 2};
  int64_t b_shape[1] = {5}, c_shape[1] = {3};
  int64_t col_offsets[3][2] = {{0, 0}, {0, 2}, {0, 4}};
  const int64_t* col_offset_ptrs[3] = {col_offsets[0], col_offsets[1],
                                       col_offsets[2]};
  const char* fqns[3] = {"a", "b", "c"};
  const int32_t files[3] = {1, 2, 2};
  char dir[4200], file[4400], text[8192];
  dcp_hf_writer_options_t wo = hf_writer_options();
  dcp_hf_reader_options_t ro;
  dcp_storage_writer_t* writer = NULL;
  dcp_storage_reader_t* reader = NULL;
  dcp_state_dict_t* sd = NULL;
  dcp_save_options_t so;
  dcp_load_options_t lo;
  DLTensor t, cols[3];
  uint64_t header_len = 0;
  int r, k, i;

  for (r = 0; r < 4; ++r) {
    for (k = 0; k < 6; ++k) a[r][k] = r * 10 + k;
  }
  for (i = 0; i < 5; ++i) b[i] = 0.5f * (float)i - 1.0f;
  wo.fqns = fqns;
  wo.file_indices = files;
  wo.num_mappings = 3;
  wo.thread_count = 2;
  dir_for("hf", dir, sizeof(dir));
  CHECK_OK(dcp_hf_writer_create(dir, &wo, &writer));
  CHECK_OK(dcp_state_dict_create(&sd));
  t = make_tensor(a, 2, a_shape, NULL, kDLInt, 32);
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("a")), &t, NULL));
  t = make_tensor(b, 1, b_shape, NULL, kDLFloat, 32);
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("b")), &t, NULL));
  t = make_tensor(c, 1, c_shape, NULL, 6 /* kDLBool */, 8);
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("c")), &t, NULL));
  so = save_options(NULL);
  so.storage_writer = writer;
  CHECK_OK(dcp_save(sd, &so, NULL));
  CHECK_OK(dcp_state_dict_free(sd));

  /* The files of a Hugging Face directory; the index maps each tensor. */
  snprintf(file, sizeof(file), "%s/model.safetensors.index.json", dir);
  CHECK(read_file(file, text, sizeof(text)) > 0);
  CHECK(strstr(text, "\"weight_map\"") != NULL);
  CHECK(strstr(text, "\"total_size\"") != NULL);
  CHECK(strstr(text, "model-00001-of-00002.safetensors") != NULL);
  CHECK(strstr(text, "model-00002-of-00002.safetensors") != NULL);
  snprintf(file, sizeof(file), "%s/model-00002-of-00002.safetensors", dir);
  CHECK(read_file(file, text, sizeof(text)) > 8);
  for (i = 7; i >= 0; --i) {
    header_len = (header_len << 8) | (uint8_t)text[i];
  }
  CHECK(header_len % 8 == 0 && header_len < sizeof(text) - 8);
  CHECK(strstr(text + 8, "\"format\":\"pt\"") != NULL);
  CHECK(strstr(text + 8, "\"BOOL\"") != NULL);
  CHECK(strstr(text + 8, "\"F32\"") != NULL);
  CHECK(strstr(text + 8, "\"I32\"") == NULL); /* "a" is in file 1. */

  /* Load: "a" as three column chunks, the others whole. */
  memset(&ro, 0, sizeof(ro));
  ro.struct_size = sizeof(ro);
  ro.thread_count = 2;
  ro.read_window_bytes = 4096;
  CHECK_OK(dcp_hf_reader_create(dir, &ro, &reader));
  memset(a_cols, 0, sizeof(a_cols));
  memset(b_out, 0, sizeof(b_out));
  CHECK_OK(dcp_state_dict_create(&sd));
  for (k = 0; k < 3; ++k) {
    cols[k] = make_tensor(a_cols[k], 2, col_shape, NULL, kDLInt, 32);
  }
  CHECK_OK(dcp_state_dict_set_sharded_tensor(sd, PATH(KEY("a")), 2, a_shape, 3,
                                             cols, col_offset_ptrs));
  t = make_tensor(b_out, 1, b_shape, NULL, kDLFloat, 32);
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("b")), &t, NULL));
  t = make_tensor(c_out, 1, c_shape, NULL, 6 /* kDLBool */, 8);
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("c")), &t, NULL));
  lo = load_options(NULL);
  lo.storage_reader = reader;
  CHECK_OK(dcp_load(sd, &lo));
  for (k = 0; k < 3; ++k) {
    for (r = 0; r < 4; ++r) {
      for (i = 0; i < 2; ++i) CHECK(a_cols[k][r][i] == a[r][2 * k + i]);
    }
  }
  CHECK(memcmp(b, b_out, sizeof(b)) == 0);
  CHECK(memcmp(c, c_out, sizeof(c)) == 0);
  /* A shape that differs from the file's is refused naming the tensor. */
  t = make_tensor(b_out, 1, c_shape, NULL, kDLFloat, 32);
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("b")), &t, NULL));
  CHECK_ERROR(dcp_load(sd, &lo), DCP_INVALID_ARGUMENT, "b");
  CHECK_OK(dcp_state_dict_free(sd));
  CHECK_OK(dcp_storage_writer_free(writer));
  CHECK_OK(dcp_storage_reader_free(reader));
}

static void test_hf_errors(void) {
  union {
    dcp_hf_writer_options_t options;
    unsigned char bytes[sizeof(dcp_hf_writer_options_t) + 64];
  } big;
  float x[2] = {1.0f, 2.0f};
  int64_t shape[1] = {2};
  const char* fqns[2] = {"x", "x"};
  const int32_t files[3] = {0, 1, 1};
  char dir[4200], file[4400], text[64];
  dcp_hf_writer_options_t wo;
  dcp_hf_reader_options_t ro;
  dcp_storage_writer_t* writer = NULL;
  dcp_storage_reader_t* reader = NULL;
  dcp_state_dict_t* sd = NULL;
  dcp_save_options_t so;
  dcp_load_options_t lo;
  DLTensor t;

  dir_for("hf-errors", dir, sizeof(dir));
  /* Versioned structs: 0 and larger than the library's are refused. */
  memset(&wo, 0, sizeof(wo));
  CHECK_ERROR(dcp_hf_writer_create(dir, &wo, &writer), DCP_INVALID_ARGUMENT,
              "dcp_hf_writer_options_t.struct_size is 0");
  memset(&big, 0, sizeof(big));
  big.options.struct_size = sizeof(big);
  CHECK_ERROR(dcp_hf_writer_create(dir, &big.options, &writer),
              DCP_INVALID_ARGUMENT, "dcp_hf_writer_options_t.struct_size");
  memset(&ro, 0, sizeof(ro));
  ro.struct_size = sizeof(ro) + 8;
  CHECK_ERROR(dcp_hf_reader_create(dir, &ro, &reader), DCP_INVALID_ARGUMENT,
              "dcp_hf_reader_options_t.struct_size");
  /* Bad options. */
  wo = hf_writer_options();
  wo.save_distributed = 7;
  CHECK_ERROR(dcp_hf_writer_create(dir, &wo, &writer), DCP_INVALID_ARGUMENT,
              "dcp_hf_writer_options_t.save_distributed is 7");
  wo = hf_writer_options();
  wo.fqns = fqns;
  wo.file_indices = files;
  wo.num_mappings = 1;
  CHECK_ERROR(dcp_hf_writer_create(dir, &wo, &writer), DCP_INVALID_ARGUMENT,
              "file indices start at 1");
  wo.file_indices = files + 1;
  wo.num_mappings = 2;
  CHECK_ERROR(dcp_hf_writer_create(dir, &wo, &writer), DCP_INVALID_ARGUMENT,
              "appears twice");
  wo.fqns = NULL;
  CHECK_ERROR(dcp_hf_writer_create(dir, &wo, &writer), DCP_INVALID_ARGUMENT,
              "num_mappings is 2");
  CHECK_ERROR(dcp_hf_writer_create("", NULL, &writer), DCP_INVALID_ARGUMENT,
              "dcp_hf_writer_create");
  CHECK_ERROR(dcp_hf_reader_create(NULL, NULL, &reader), DCP_INVALID_ARGUMENT,
              "dcp_hf_reader_create");
  CHECK(writer == NULL && reader == NULL);

  /* A non-tensor value is refused with its key named; nothing is written
   * (no index). An older, smaller struct gets defaults for the rest. */
  wo = hf_writer_options();
  wo.struct_size = offsetof(dcp_hf_writer_options_t, thread_count);
  CHECK_OK(dcp_hf_writer_create(dir, &wo, &writer));
  CHECK_OK(dcp_state_dict_create(&sd));
  t = make_tensor(x, 1, shape, NULL, kDLFloat, 32);
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("x")), &t, NULL));
  CHECK_OK(dcp_state_dict_set_int(sd, PATH(KEY("opt"), KEY("step")), 3));
  so = save_options(NULL);
  so.storage_writer = writer;
  CHECK_ERROR(dcp_save(sd, &so, NULL), DCP_INVALID_ARGUMENT, "opt.step");
  snprintf(file, sizeof(file), "%s/model.safetensors.index.json", dir);
  CHECK(read_file(file, text, sizeof(text)) < 0);

  /* Reading a directory without a checkpoint: DCP_NOT_FOUND. */
  CHECK_OK(dcp_hf_reader_create(dir, NULL, &reader));
  lo = load_options(NULL);
  lo.storage_reader = reader;
  CHECK_OK(dcp_state_dict_free(sd));
  CHECK_OK(dcp_state_dict_create(&sd));
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("x")), &t, NULL));
  CHECK(dcp_load(sd, &lo) != DCP_OK);
  CHECK_OK(dcp_state_dict_free(sd));
  CHECK_OK(dcp_storage_writer_free(writer));
  CHECK_OK(dcp_storage_reader_free(reader));
}

/* A save through the MEGA writer with a mapping into two files, a load
 * through the MEGA reader; bad options and paths. */
static void test_mega(void) {
  union {
    dcp_mega_writer_options_t options;
    unsigned char bytes[sizeof(dcp_mega_writer_options_t) + 64];
  } big;
  int32_t a[3][4], a_out[3][4];
  float b[5], b_out[5];
  int64_t a_shape[2] = {3, 4}, b_shape[1] = {5};
  const char* fqns[2] = {"a", "b"};
  const int32_t files[2] = {2, 1};
  char dir[4200], file[4400], text[8192];
  dcp_mega_writer_options_t wo;
  dcp_mega_reader_options_t ro;
  dcp_storage_writer_t* writer = NULL;
  dcp_storage_reader_t* reader = NULL;
  dcp_state_dict_t* sd = NULL;
  dcp_save_options_t so;
  dcp_load_options_t lo;
  DLTensor t;
  int r, k;

  for (r = 0; r < 3; ++r) {
    for (k = 0; k < 4; ++k) a[r][k] = r * 100 - k;
  }
  for (k = 0; k < 5; ++k) b[k] = 0.25f * (float)k - 2.0f;
  dir_for("mega", dir, sizeof(dir));
  memset(&wo, 0, sizeof(wo));
  wo.struct_size = sizeof(wo);
  wo.fqns = fqns;
  wo.file_indices = files;
  wo.num_mappings = 2;
  wo.thread_count = 2;
  wo.sync_files = DCP_FALSE;
  CHECK_OK(dcp_mega_writer_create(dir, &wo, &writer));
  CHECK_OK(dcp_state_dict_create(&sd));
  t = make_tensor(a, 2, a_shape, NULL, kDLInt, 32);
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("a")), &t, NULL));
  t = make_tensor(b, 1, b_shape, NULL, kDLFloat, 32);
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("b")), &t, NULL));
  so = save_options(NULL);
  so.storage_writer = writer;
  CHECK_OK(dcp_save(sd, &so, NULL));
  CHECK_OK(dcp_state_dict_free(sd));
  snprintf(file, sizeof(file), "%s/model.mega.index.json", dir);
  CHECK(read_file(file, text, sizeof(text)) > 0);
  CHECK(strstr(text, "model-00001-of-00002.mega") != NULL);
  CHECK(strstr(text, "model-00002-of-00002.mega") != NULL);
  snprintf(file, sizeof(file), "%s/model-00002-of-00002.mega", dir);
  CHECK(read_file(file, text, sizeof(text)) > 0);

  memset(&ro, 0, sizeof(ro));
  ro.struct_size = sizeof(ro);
  ro.thread_count = 2;
  CHECK_OK(dcp_mega_reader_create(dir, &ro, &reader));
  memset(a_out, 0, sizeof(a_out));
  memset(b_out, 0, sizeof(b_out));
  CHECK_OK(dcp_state_dict_create(&sd));
  t = make_tensor(a_out, 2, a_shape, NULL, kDLInt, 32);
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("a")), &t, NULL));
  t = make_tensor(b_out, 1, b_shape, NULL, kDLFloat, 32);
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("b")), &t, NULL));
  lo = load_options(NULL);
  lo.storage_reader = reader;
  CHECK_OK(dcp_load(sd, &lo));
  CHECK(memcmp(a, a_out, sizeof(a)) == 0);
  CHECK(memcmp(b, b_out, sizeof(b)) == 0);
  CHECK_OK(dcp_state_dict_free(sd));
  CHECK_OK(dcp_storage_writer_free(writer));
  CHECK_OK(dcp_storage_reader_free(reader));
  writer = NULL;
  reader = NULL;

  /* Bad structs and options, NULL and empty paths. */
  memset(&big, 0, sizeof(big));
  big.options.struct_size = sizeof(big);
  CHECK_ERROR(dcp_mega_writer_create(dir, &big.options, &writer),
              DCP_INVALID_ARGUMENT, "dcp_mega_writer_options_t.struct_size");
  memset(&ro, 0, sizeof(ro));
  CHECK_ERROR(dcp_mega_reader_create(dir, &ro, &reader), DCP_INVALID_ARGUMENT,
              "dcp_mega_reader_options_t.struct_size is 0");
  memset(&wo, 0, sizeof(wo));
  wo.struct_size = sizeof(wo);
  wo.direct_io = 3;
  CHECK_ERROR(dcp_mega_writer_create(dir, &wo, &writer), DCP_INVALID_ARGUMENT,
              "dcp_mega_writer_options_t.direct_io is 3");
  wo.direct_io = DCP_DEFAULT;
  wo.fqns = fqns;
  wo.file_indices = NULL;
  wo.num_mappings = 2;
  CHECK_ERROR(dcp_mega_writer_create(dir, &wo, &writer), DCP_INVALID_ARGUMENT,
              "dcp_mega_writer_options_t.num_mappings is 2");
  CHECK_ERROR(dcp_mega_writer_create(NULL, NULL, &writer), DCP_INVALID_ARGUMENT,
              "dcp_mega_writer_create");
  CHECK_ERROR(dcp_mega_reader_create("", NULL, &reader), DCP_INVALID_ARGUMENT,
              "dcp_mega_reader_create");
  CHECK(writer == NULL && reader == NULL);

  /* A directory without a MEGA checkpoint: DCP_NOT_FOUND naming it. */
  dir_for("mega-empty", dir, sizeof(dir));
  CHECK_OK(dcp_mega_reader_create(dir, NULL, &reader));
  CHECK_OK(dcp_state_dict_create(&sd));
  t = make_tensor(b_out, 1, b_shape, NULL, kDLFloat, 32);
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("b")), &t, NULL));
  lo = load_options(NULL);
  lo.storage_reader = reader;
  CHECK_ERROR(dcp_load(sd, &lo), DCP_NOT_FOUND, "mega-empty");
  CHECK_OK(dcp_state_dict_free(sd));
  CHECK_OK(dcp_storage_reader_free(reader));
}

/* An fp8 E4M3 weight and its float32 block scale saved through the HF
 * writer, loaded dequantized through the quantized reader. */
static void test_hf_quantized(void) {
  /* E4M3: 0x38 1.0, 0x40 2.0, 0xB8 -1.0, 0x3C 1.5. */
  uint8_t w[2][2] = {{0x38, 0x40}, {0xB8, 0x3C}};
  float scale[1][1] = {{0.5f}};
  const float expected[4] = {0.5f, 1.0f, -0.5f, 0.75f};
  float out[2][2];
  int64_t w_shape[2] = {2, 2}, s_shape[2] = {1, 1};
  char dir[4200];
  dcp_hf_quantized_reader_options_t qo;
  dcp_storage_writer_t* writer = NULL;
  dcp_storage_reader_t* reader = NULL;
  dcp_state_dict_t* sd = NULL;
  dcp_hf_writer_options_t wo = hf_writer_options();
  dcp_save_options_t so;
  dcp_load_options_t lo;
  DLTensor t;

  dir_for("hf-quantized", dir, sizeof(dir));
  CHECK_OK(dcp_hf_writer_create(dir, &wo, &writer));
  CHECK_OK(dcp_state_dict_create(&sd));
  t = make_tensor(w, 2, w_shape, NULL, 10 /* kDLFloat8_e4m3fn */, 8);
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("w")), &t, NULL));
  t = make_tensor(scale, 2, s_shape, NULL, kDLFloat, 32);
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("w_scale_inv")), &t, NULL));
  so = save_options(NULL);
  so.storage_writer = writer;
  CHECK_OK(dcp_save(sd, &so, NULL));
  CHECK_OK(dcp_state_dict_free(sd));

  memset(&qo, 0, sizeof(qo));
  qo.struct_size = sizeof(qo);
  qo.target_dtype = DCP_DTYPE_I32;
  CHECK_ERROR(dcp_hf_quantized_reader_create(dir, &qo, &reader),
              DCP_INVALID_ARGUMENT,
              "dcp_hf_quantized_reader_options_t.target_dtype is 6");
  qo.target_dtype = 0;
  qo.block_size = -1;
  CHECK_ERROR(dcp_hf_quantized_reader_create(dir, &qo, &reader),
              DCP_INVALID_ARGUMENT,
              "dcp_hf_quantized_reader_options_t.block_size is -1");
  CHECK_ERROR(dcp_hf_quantized_reader_create(NULL, NULL, &reader),
              DCP_INVALID_ARGUMENT, "dcp_hf_quantized_reader_create");
  CHECK(reader == NULL);

  qo.block_size = 0; /* no config.json: 128, one tile */
  qo.target_dtype = DCP_DTYPE_F32;
  CHECK_OK(dcp_hf_quantized_reader_create(dir, &qo, &reader));
  memset(out, 0, sizeof(out));
  CHECK_OK(dcp_state_dict_create(&sd));
  t = make_tensor(out, 2, w_shape, NULL, kDLFloat, 32);
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("w")), &t, NULL));
  lo = load_options(NULL);
  lo.storage_reader = reader;
  CHECK_OK(dcp_load(sd, &lo));
  CHECK(memcmp(out, expected, sizeof(expected)) == 0);
  CHECK_OK(dcp_state_dict_free(sd));
  CHECK_OK(dcp_storage_writer_free(writer));
  CHECK_OK(dcp_storage_reader_free(reader));
}

/* ------------------------------------------------------------------------
 * Async save
 * ---------------------------------------------------------------------- */

typedef struct gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int calls;
  int status;
} gate;

static void gate_init(gate* g) {
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  g->calls = 0;
  g->status = -1;
}

static void gate_destroy(gate* g) {
  pthread_cond_destroy(&g->cv);
  pthread_mutex_destroy(&g->mu);
}

static void on_done(void* user, int status) {
  gate* g = (gate*)user;
  pthread_mutex_lock(&g->mu);
  ++g->calls;
  g->status = status;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

/* Waits for the callback; the deadline only bounds a hang. */
static int gate_wait(gate* g) {
  struct timespec deadline;
  int calls;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += 120;
  pthread_mutex_lock(&g->mu);
  while (g->calls == 0) {
    if (pthread_cond_timedwait(&g->cv, &g->mu, &deadline) == ETIMEDOUT) break;
  }
  calls = g->calls;
  pthread_mutex_unlock(&g->mu);
  return calls;
}

static void test_async_save(void) {
  double src[16], dst[16];
  int64_t shape[1] = {16};
  char dir[4200], dir2[4200];
  dcp_state_dict_t* sd = NULL;
  dcp_async_save_t* save = NULL;
  dcp_async_save_t* save2 = NULL;
  dcp_metadata_t* md = NULL;
  dcp_process_group_t* group = NULL;
  dcp_save_options_t so;
  dcp_load_options_t lo;
  DLTensor t;
  int32_t done = -1, rank = -1, size = -1;
  size_t n = 0;
  gate upload_gate, now_gate;
  int i;

  for (i = 0; i < 16; ++i) src[i] = i * 0.5;
  CHECK_OK(dcp_state_dict_create(&sd));
  t = make_tensor(src, 1, shape, NULL, kDLFloat, 64);
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("x")), &t, NULL));

  /* Through a process group from the environment (one rank here), made
   * the default. */
  CHECK_OK(dcp_process_group_create_from_env(NULL, &group));
  CHECK_OK(dcp_process_group_rank(group, &rank));
  CHECK_OK(dcp_process_group_size(group, &size));
  CHECK(rank == 0 && size == 1);
  CHECK_OK(dcp_set_default_process_group(group));

  so = save_options(dir_for("async", dir, sizeof(dir)));
  CHECK_OK(dcp_async_save(sd, &so, &save));
  /* Poll, then wait forever: the result is the same completion. */
  CHECK_OK(dcp_async_save_wait(save, DCP_UPLOAD, 0, &done));
  CHECK(done == 0 || done == 1);
  CHECK_OK(dcp_async_save_wait(save, DCP_STAGING, -1, &done));
  CHECK(done == 1);
  CHECK_OK(dcp_async_save_wait(save, DCP_UPLOAD, -1, &done));
  CHECK(done == 1);
  CHECK_OK(dcp_async_save_wait(save, DCP_UPLOAD, 0, &done));
  CHECK(done == 1);
  CHECK_OK(dcp_async_save_metadata(save, &md));
  CHECK_OK(dcp_metadata_num_items(md, &n));
  CHECK(n == 1);
  CHECK_OK(dcp_metadata_free(md));
  /* A callback on a finished completion runs at once, on this thread. */
  gate_init(&now_gate);
  CHECK_OK(dcp_async_save_on_done(save, DCP_STAGING, on_done, &now_gate));
  CHECK(now_gate.calls == 1 && now_gate.status == DCP_OK);
  gate_destroy(&now_gate);
  CHECK_ERROR(dcp_async_save_wait(save, 2, 0, &done), DCP_INVALID_ARGUMENT,
              "completion 2");
  CHECK_OK(dcp_async_save_free(save));

  /* A callback, registered at once; the handle is freed before the upload
   * is known to be done, which does not cancel it. */
  gate_init(&upload_gate);
  so = save_options(dir_for("async-callback", dir2, sizeof(dir2)));
  CHECK_OK(dcp_async_save(sd, &so, &save2));
  CHECK_OK(dcp_async_save_on_done(save2, DCP_UPLOAD, on_done, &upload_gate));
  CHECK_OK(dcp_async_save_free(save2));
  CHECK(gate_wait(&upload_gate) == 1);
  CHECK(upload_gate.status == DCP_OK);
  gate_destroy(&upload_gate);
  CHECK_OK(dcp_shutdown());

  /* Both checkpoints load. */
  memset(dst, 0, sizeof(dst));
  t.data = dst;
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("x")), &t, NULL));
  lo = load_options(dir2);
  CHECK_OK(dcp_load(sd, &lo));
  CHECK(memcmp(src, dst, sizeof(src)) == 0);
  memset(dst, 0, sizeof(dst));
  lo = load_options(dir);
  CHECK_OK(dcp_load(sd, &lo));
  CHECK(memcmp(src, dst, sizeof(src)) == 0);

  /* The default group cannot be freed; unset, it can. */
  CHECK_ERROR(dcp_process_group_free(group), DCP_FAILED_PRECONDITION,
              "default group");
  CHECK_OK(dcp_set_default_process_group(NULL));
  CHECK_OK(dcp_process_group_free(group));
  CHECK_ERROR(dcp_process_group_rank(group, &rank), DCP_INVALID_ARGUMENT,
              "dcp_process_group_t");

  /* The process checkpointer is not in this library. */
  so.async_checkpointer_type = DCP_ASYNC_PROCESS;
  save = NULL;
  CHECK_ERROR(dcp_async_save(sd, &so, &save), DCP_UNIMPLEMENTED,
              "DCP_ASYNC_PROCESS");
  CHECK(save == NULL);
  CHECK_OK(dcp_state_dict_free(sd));
}

/* ------------------------------------------------------------------------
 * Two ranks in one process, coordinating through a C key-value store
 * ---------------------------------------------------------------------- */

typedef struct kv_entry {
  char* key;
  void* value;
  size_t size;
  struct kv_entry* next;
} kv_entry;

/* What torchrun's TCPStore is to a Python caller: a store every rank
 * reaches. Thread-safe; get waits on a condition variable. */
typedef struct mem_store {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  kv_entry* head;
  int sets;
} mem_store;

static kv_entry* store_find(mem_store* s, const char* key) {
  kv_entry* e;
  for (e = s->head; e != NULL; e = e->next) {
    if (strcmp(e->key, key) == 0) return e;
  }
  return NULL;
}

static int store_set(void* user, const char* key, const void* value,
                     size_t size) {
  mem_store* s = (mem_store*)user;
  kv_entry* e;
  void* copy = malloc(size > 0 ? size : 1);
  if (copy == NULL) return DCP_RESOURCE_EXHAUSTED;
  if (size > 0) memcpy(copy, value, size);
  pthread_mutex_lock(&s->mu);
  e = store_find(s, key);
  if (e == NULL) {
    e = (kv_entry*)calloc(1, sizeof(*e));
    e->key = (char*)malloc(strlen(key) + 1);
    strcpy(e->key, key);
    e->next = s->head;
    s->head = e;
  } else {
    free(e->value);
  }
  e->value = copy;
  e->size = size;
  ++s->sets;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return DCP_OK;
}

static int store_get(void* user, const char* key, int64_t timeout_ms,
                     void (*sink)(void* sink_ctx, const void* data,
                                  size_t size),
                     void* sink_ctx) {
  mem_store* s = (mem_store*)user;
  kv_entry* e;
  struct timespec deadline;
  const int64_t day_ms = 86400000;
  if (timeout_ms > day_ms) timeout_ms = day_ms;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += (time_t)(timeout_ms / 1000);
  deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
  if (deadline.tv_nsec >= 1000000000L) {
    deadline.tv_sec += 1;
    deadline.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&s->mu);
  while ((e = store_find(s, key)) == NULL) {
    if (timeout_ms == 0 ||
        pthread_cond_timedwait(&s->cv, &s->mu, &deadline) == ETIMEDOUT) {
      e = store_find(s, key);
      break;
    }
  }
  if (e == NULL) {
    pthread_mutex_unlock(&s->mu);
    return DCP_DEADLINE_EXCEEDED;
  }
  sink(sink_ctx, e->value, e->size);
  pthread_mutex_unlock(&s->mu);
  return DCP_OK;
}

static int store_remove(void* user, const char* key) {
  mem_store* s = (mem_store*)user;
  kv_entry** link;
  pthread_mutex_lock(&s->mu);
  for (link = &s->head; *link != NULL; link = &(*link)->next) {
    if (strcmp((*link)->key, key) == 0) {
      kv_entry* e = *link;
      *link = e->next;
      free(e->key);
      free(e->value);
      free(e);
      break;
    }
  }
  pthread_mutex_unlock(&s->mu);
  return DCP_OK;
}

static void store_destroy(mem_store* s) {
  while (s->head != NULL) {
    kv_entry* e = s->head;
    s->head = e->next;
    free(e->key);
    free(e->value);
    free(e);
  }
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
}

/* DLPack 1.x's DLManagedTensorVersioned (Debian's DLPack 0.6 header has
 * none; dcp/dcp.h only declares it). */
struct DLManagedTensorVersioned {
  struct {
    uint32_t major;
    uint32_t minor;
  } version;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
};

typedef struct rank_run {
  mem_store* store;
  int32_t rank;
  const char* dir;
  /* Results, checked on the main thread. */
  int checks;
  int failures;
  int save_status;
  size_t num_rank_failures;
  int32_t failed_rank;
  int failed_code;
  char failed_message[512];
  float loaded[4];
  float expected[4];
  /* Rank 0: what dcp_async_save_wait answered in a staging callback. */
  int guard_status;
  char guard_message[512];
} rank_run;

/* A staging callback that waits for its save's upload (and records what
 * the wait answered), then tells the other rank through the store. */
typedef struct guard_probe {
  mem_store* store;
  dcp_async_save_t* save;
  int status;
  char message[512];
} guard_probe;

static void ignore_value(void* ctx, const void* data, size_t size) {
  (void)ctx;
  (void)data;
  (void)size;
}

static void guard_probe_cb(void* user, int status) {
  guard_probe* probe = (guard_probe*)user;
  int32_t done = 0;
  (void)status;
  probe->status = dcp_async_save_wait(probe->save, DCP_UPLOAD, -1, &done);
  snprintf(probe->message, sizeof(probe->message), "%s",
           dcp_last_error_message());
  store_set(probe->store, "guard-probed", "1", 1);
}

/* Counts a failed check of a rank thread (CHECK is for the main thread). */
#define RANK_CHECK(run, cond)                                               \
  do {                                                                      \
    ++(run)->checks;                                                        \
    if (!(cond)) {                                                          \
      ++(run)->failures;                                                    \
      fprintf(stderr, "%s:%d: rank %d: CHECK failed: %s (last error %s)\n", \
              __FILE__, __LINE__, (int)(run)->rank, #cond,                  \
              dcp_last_error_message());                                    \
    }                                                                       \
  } while (0)

static void* rank_main(void* arg) {
  rank_run* run = (rank_run*)arg;
  float rows[2][2], column[4];
  int64_t global[2] = {4, 2};
  int64_t row_shape[2] = {2, 2};
  int64_t row_offsets[2];
  int64_t column_shape[2] = {4, 1};
  int64_t column_offsets[2];
  dcp_shard_t shard;
  dcp_store_t store;
  dcp_process_group_options_t go;
  dcp_process_group_t* group = NULL;
  dcp_state_dict_t* sd = NULL;
  dcp_save_options_t so;
  dcp_load_options_t lo;
  DLTensor t;
  int32_t size = 0;
  int r, c;
  const char* message = NULL;

  memset(&store, 0, sizeof(store));
  store.struct_size = sizeof(store);
  store.user = run->store;
  store.set = store_set;
  store.get = store_get;
  store.remove = store_remove;
  memset(&go, 0, sizeof(go));
  go.struct_size = sizeof(go);
  go.group_name = "capi-test";
  go.timeout_ms = 120000;
  RANK_CHECK(run, dcp_process_group_create_from_store(&store, run->rank, 2, &go,
                                                      &group) == DCP_OK);
  if (group == NULL) return NULL;
  RANK_CHECK(run, dcp_process_group_size(group, &size) == DCP_OK && size == 2);

  /* Rank r holds rows [2r, 2r+2) of a 4x2 tensor; loads column r. */
  for (r = 0; r < 2; ++r) {
    for (c = 0; c < 2; ++c) rows[r][c] = (float)((2 * run->rank + r) * 10 + c);
  }
  row_offsets[0] = 2 * run->rank;
  row_offsets[1] = 0;
  shard.ndim = 2;
  shard.global_shape = global;
  shard.offsets = row_offsets;
  RANK_CHECK(run, dcp_state_dict_create(&sd) == DCP_OK);
  t = make_tensor(rows, 2, row_shape, NULL, kDLFloat, 32);
  RANK_CHECK(
      run, dcp_state_dict_set_tensor(sd, PATH(KEY("w")), &t, &shard) == DCP_OK);
  so = save_options(run->dir);
  so.process_group = group;
  RANK_CHECK(run, dcp_save(sd, &so, NULL) == DCP_OK);

  memset(column, 0, sizeof(column));
  column_offsets[0] = 0;
  column_offsets[1] = run->rank;
  shard.offsets = column_offsets;
  t = make_tensor(column, 2, column_shape, NULL, kDLFloat, 32);
  RANK_CHECK(
      run, dcp_state_dict_set_tensor(sd, PATH(KEY("w")), &t, &shard) == DCP_OK);
  lo = load_options(run->dir);
  lo.process_group = group;
  RANK_CHECK(run, dcp_load(sd, &lo) == DCP_OK);
  for (r = 0; r < 4; ++r) {
    run->loaded[r] = column[r];
    run->expected[r] = (float)(r * 10 + run->rank);
  }

  /* Rank 1 fails its local plan ("a.b" twice); every rank gets the same
   * error, listing rank 1's failure. */
  if (run->rank == 1) {
    RANK_CHECK(run, dcp_state_dict_set_int(sd, PATH(KEY("a.b")), 1) == DCP_OK);
    RANK_CHECK(
        run, dcp_state_dict_set_int(sd, PATH(KEY("a"), KEY("b")), 2) == DCP_OK);
  }
  run->save_status = dcp_save(sd, &so, NULL);
  run->num_rank_failures = dcp_last_error_num_rank_failures();
  if (dcp_last_error_rank_failure(0, &run->failed_rank, &run->failed_code,
                                  &message) == DCP_OK) {
    snprintf(run->failed_message, sizeof(run->failed_message), "%s", message);
  }
  RANK_CHECK(run, dcp_state_dict_free(sd) == DCP_OK);
  /* An async save's staging callback waits for the upload, which cannot be
   * done: rank 0's needs rank 1, which saves only after the callback. The
   * wait is refused rather than blocking the dcp thread. */
  {
    dcp_state_dict_t* sd2 = NULL;
    dcp_async_save_t* as = NULL;
    guard_probe probe;
    int32_t done = 0;
    memset(&probe, 0, sizeof(probe));
    probe.store = run->store;
    probe.status = -1;
    RANK_CHECK(run, dcp_state_dict_create(&sd2) == DCP_OK);
    shard.offsets = row_offsets;
    t = make_tensor(rows, 2, row_shape, NULL, kDLFloat, 32);
    RANK_CHECK(run, dcp_state_dict_set_tensor(sd2, PATH(KEY("w")), &t,
                                              &shard) == DCP_OK);
    if (run->rank == 1) {
      /* A plain save: the library's uploads run one at a time, so two
       * ranks of one process cannot both save asynchronously. */
      RANK_CHECK(run, store_get(run->store, "guard-probed", 120000,
                                ignore_value, NULL) == DCP_OK);
      RANK_CHECK(run, dcp_save(sd2, &so, NULL) == DCP_OK);
    } else {
      RANK_CHECK(run, dcp_async_save(sd2, &so, &as) == DCP_OK);
      probe.save = as;
      RANK_CHECK(run, dcp_async_save_on_done(as, DCP_STAGING, guard_probe_cb,
                                             &probe) == DCP_OK);
      RANK_CHECK(run,
                 dcp_async_save_wait(as, DCP_UPLOAD, -1, &done) == DCP_OK &&
                     done == 1);
      RANK_CHECK(run, dcp_async_save_free(as) == DCP_OK);
      run->guard_status = probe.status;
      snprintf(run->guard_message, sizeof(run->guard_message), "%s",
               probe.message);
    }
    RANK_CHECK(run, dcp_state_dict_free(sd2) == DCP_OK);
  }
  /* Rank 1's destination is read-only, a finding of its own: every rank's
   * load fails, naming it (rank 0 in the shared setup, not after its
   * timeout), and the ranks' next collective still pairs up. */
  {
    dcp_state_dict_t* sd3 = NULL;
    struct DLManagedTensorVersioned v;
    int rc;
    RANK_CHECK(run, dcp_state_dict_create(&sd3) == DCP_OK);
    memset(&v, 0, sizeof(v));
    memset(column, 0, sizeof(column));
    v.version.major = 1;
    v.dl_tensor = make_tensor(column, 2, column_shape, NULL, kDLFloat, 32);
    v.flags = run->rank == 1 ? 1 : 0; /* DLPACK_FLAG_BITMASK_READ_ONLY */
    shard.offsets = column_offsets;
    RANK_CHECK(run, dcp_state_dict_set_dlpack_versioned(sd3, PATH(KEY("w")), &v,
                                                        &shard) == DCP_OK);
    rc = dcp_load(sd3, &lo);
    RANK_CHECK(run, rc == DCP_INVALID_ARGUMENT &&
                        strstr(dcp_last_error_message(), "read-only") != NULL);
    t = make_tensor(column, 2, column_shape, NULL, kDLFloat, 32);
    RANK_CHECK(run, dcp_state_dict_set_tensor(sd3, PATH(KEY("w")), &t,
                                              &shard) == DCP_OK);
    RANK_CHECK(run, dcp_load(sd3, &lo) == DCP_OK);
    for (r = 0; r < 4; ++r) {
      RANK_CHECK(run, column[r] == (float)(r * 10 + run->rank));
    }
    RANK_CHECK(run, dcp_state_dict_free(sd3) == DCP_OK);
  }
  RANK_CHECK(run, dcp_process_group_free(group) == DCP_OK);
  return NULL;
}

/* A stager kept across async saves, reserved first: saves stage through it
 * (bytes round-trip, the tensor may change once staged), and it outlives
 * its handle while a save uses it. */
static void test_stager(void) {
  float src[64], dst[64];
  int64_t shape[1] = {64};
  char dir[4200], dir2[4200];
  dcp_state_dict_t* sd = NULL;
  dcp_state_dict_t* into = NULL;
  dcp_stager_t* stager = NULL;
  dcp_async_save_t* save = NULL;
  dcp_stager_options_t opts;
  dcp_save_options_t so;
  dcp_load_options_t lo;
  DLTensor t, d;
  int32_t done = 0;
  int i, round;

  for (i = 0; i < 64; ++i) src[i] = (float)i;
  CHECK_OK(dcp_state_dict_create(&sd));
  t = make_tensor(src, 1, shape, NULL, kDLFloat, 32);
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("w")), &t, NULL));

  memset(&opts, 0, sizeof(opts));
  opts.struct_size = sizeof(opts);
  opts.use_pinned_memory = DCP_FALSE; /* no page-locking limits in tests */
  CHECK_OK(dcp_stager_create(&opts, &stager));
  CHECK_OK(dcp_stager_reserve(stager, sd));

  for (round = 0; round < 2; ++round) {
    so = save_options(dir_for(round == 0 ? "stager-1" : "stager-2",
                              round == 0 ? dir : dir2, sizeof(dir)));
    so.async_stager = stager;
    CHECK_OK(dcp_async_save(sd, &so, &save));
    CHECK_OK(dcp_async_save_wait(save, DCP_STAGING, -1, &done));
    CHECK(done == 1);
    /* Staged: the caller may change its tensor; the checkpoint keeps the
     * values of the call. */
    for (i = 0; i < 64; ++i) src[i] = -1.0f;
    if (round == 1) CHECK_OK(dcp_stager_free(stager)); /* save holds it */
    CHECK_OK(dcp_async_save_wait(save, DCP_UPLOAD, -1, &done));
    CHECK(done == 1);
    CHECK_OK(dcp_async_save_free(save));
    for (i = 0; i < 64; ++i) src[i] = (float)(i + 100 * (round + 1));
  }

  /* Each checkpoint holds what the tensor held when its save was called. */
  for (round = 0; round < 2; ++round) {
    memset(dst, 0, sizeof(dst));
    CHECK_OK(dcp_state_dict_create(&into));
    d = make_tensor(dst, 1, shape, NULL, kDLFloat, 32);
    CHECK_OK(dcp_state_dict_set_tensor(into, PATH(KEY("w")), &d, NULL));
    lo = load_options(round == 0 ? dir : dir2);
    CHECK_OK(dcp_load(into, &lo));
    for (i = 0; i < 64; ++i) CHECK(dst[i] == (float)(i + 100 * round));
    CHECK_OK(dcp_state_dict_free(into));
  }

  /* Errors: a freed stager, a stager given to a synchronous save, a wrong
   * struct size, a bad flag. */
  so = save_options(dir);
  so.async_stager = stager;
  CHECK_ERROR(dcp_async_save(sd, &so, &save), DCP_INVALID_ARGUMENT,
              "dcp_stager_t");
  CHECK_OK(dcp_stager_create(NULL, &stager));
  so.async_stager = stager;
  CHECK_ERROR(dcp_save(sd, &so, NULL), DCP_INVALID_ARGUMENT, "async_stager");
  CHECK_OK(dcp_stager_free(stager));
  opts.struct_size = 0;
  CHECK_ERROR(dcp_stager_create(&opts, &stager), DCP_INVALID_ARGUMENT,
              "dcp_stager_options_t");
  opts.struct_size = sizeof(opts);
  opts.use_async_staging = 7;
  CHECK_ERROR(dcp_stager_create(&opts, &stager), DCP_INVALID_ARGUMENT,
              "use_async_staging");
  CHECK_ERROR(dcp_stager_reserve(NULL, sd), DCP_INVALID_ARGUMENT,
              "dcp_stager_t");
  CHECK_OK(dcp_stager_free(NULL));
  CHECK_OK(dcp_state_dict_free(sd));
}

/* dcp_copy_host: copies of every size (empty, below and across the 8 MiB
 * pieces, at odd offsets) land byte for byte, on any number of threads;
 * bad arguments copy nothing. */
static void test_copy_host(void) {
  const size_t sizes[] = {0, 1, 4095, 1 << 20, (8u << 20) + 3, 19u << 20};
  enum { kCopies = sizeof(sizes) / sizeof(sizes[0]) };
  unsigned char* src[kCopies];
  unsigned char* dst[kCopies];
  dcp_host_copy_t copies[kCopies];
  for (size_t i = 0; i < kCopies; ++i) {
    src[i] = malloc(sizes[i] + 8);
    dst[i] = malloc(sizes[i] + 8);
    for (size_t b = 0; b < sizes[i] + 8; ++b) {
      src[i][b] = (unsigned char)(b * 131 + i * 7 + 1);
    }
    copies[i].dst = dst[i] + (i % 3);
    copies[i].src = src[i] + 5;
    copies[i].bytes = sizes[i];
  }
  const int threads[] = {0, 1, 3, 64};
  for (size_t t = 0; t < sizeof(threads) / sizeof(threads[0]); ++t) {
    for (size_t i = 0; i < kCopies; ++i) memset(dst[i], 0xEE, sizes[i] + 8);
    CHECK_OK(dcp_copy_host(copies, kCopies, threads[t]));
    for (size_t i = 0; i < kCopies; ++i) {
      CHECK(memcmp(dst[i] + (i % 3), src[i] + 5, sizes[i]) == 0);
      CHECK(dst[i][sizes[i] + (i % 3)] == 0xEE); /* nothing past the end */
      if (i % 3 > 0) CHECK(dst[i][0] == 0xEE);   /* nor before the start */
    }
  }
  CHECK_OK(dcp_copy_host(NULL, 0, 0));
  CHECK_ERROR(dcp_copy_host(NULL, 2, 0), DCP_INVALID_ARGUMENT,
              "copies is NULL");
  for (size_t i = 0; i < kCopies; ++i) memset(dst[i], 0xEE, sizes[i] + 8);
  dcp_host_copy_t bad[2] = {copies[5], {NULL, src[1], 1}};
  CHECK_ERROR(dcp_copy_host(bad, 2, 0), DCP_INVALID_ARGUMENT,
              "copies[1] has a NULL dst");
  CHECK(dst[5][(5 % 3) + 1] == 0xEE); /* nothing was copied */
  bad[1].dst = dst[1];
  bad[1].src = NULL;
  CHECK_ERROR(dcp_copy_host(bad, 2, 0), DCP_INVALID_ARGUMENT,
              "copies[1] has a NULL src");
  bad[1].bytes = 0; /* an empty copy may have NULL pointers */
  bad[1].dst = NULL;
  CHECK_OK(dcp_copy_host(bad, 2, 2));
  CHECK(memcmp(dst[5] + 2, src[5] + 5, sizes[5]) == 0);
  for (size_t i = 0; i < kCopies; ++i) {
    free(src[i]);
    free(dst[i]);
  }
}

static void test_snapshot_host(void) {
  const size_t big = (6u << 20) + 5, small = 100;
  unsigned char* src = malloc(big);
  unsigned char* src_small = malloc(small);
  unsigned char* dst = malloc(big + small);
  dcp_host_copy_t copies[2] = {{dst, src, big}, {dst + big, src_small, small}};
  dcp_host_snapshot_t* snap = NULL;
  size_t cow_bytes = 1;
  for (size_t b = 0; b < big; ++b) src[b] = (unsigned char)(b * 131 + 1);
  for (size_t b = 0; b < small; ++b) src_small[b] = (unsigned char)(b + 9);
  CHECK_OK(dcp_snapshot_host(copies, 2, 0, &snap));
  CHECK(snap != NULL);
  /* The sources may change at once; the snapshot keeps the old bytes. */
  memset(src, 0x11, big);
  memset(src_small, 0x22, small);
  CHECK_OK(dcp_host_snapshot_wait(snap, &cow_bytes));
  for (size_t b = 0; b < big; ++b) {
    if (dst[b] != (unsigned char)(b * 131 + 1)) {
      CHECK(!"snapshot byte differs");
      break;
    }
  }
  for (size_t b = 0; b < small; ++b)
    CHECK(dst[big + b] == (unsigned char)(b + 9));
  /* Whole pages of the large source, or nothing without userfaultfd. */
  CHECK(cow_bytes == 0 || (cow_bytes >= big - 8192 && cow_bytes <= big));
  CHECK_OK(dcp_host_snapshot_free(snap));
  CHECK_OK(dcp_host_snapshot_free(NULL));
  CHECK_ERROR(dcp_snapshot_host(NULL, 2, 0, &snap), DCP_INVALID_ARGUMENT,
              "copies is NULL");
  copies[1].src = NULL;
  CHECK_ERROR(dcp_snapshot_host(copies, 2, 0, &snap), DCP_INVALID_ARGUMENT,
              "dcp_snapshot_host: copies[1] has a NULL src");
  CHECK_ERROR(dcp_snapshot_host(copies, 1, 0, NULL), DCP_INVALID_ARGUMENT,
              "dcp_host_snapshot_t**");
  free(src);
  free(src_small);
  free(dst);
}

/* dcp_populate_host: the whole pages inside the range are resident for
 * writing afterwards (a shared mapping, as a binding's segment is, large
 * enough for several threads), the bytes unchanged, the edges untouched. */
static void test_populate_host(void) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  const size_t size = (300u << 20) + 3 * page;
  unsigned char* p = mmap(NULL, size, PROT_READ | PROT_WRITE,
                          MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  unsigned char* resident;
  size_t missing = 0, i;
  CHECK(p != MAP_FAILED);
  if (p == MAP_FAILED) return;
  resident = malloc(size / page);
  p[page + 7] = 42;
  CHECK_OK(dcp_populate_host(p + 5, size - 10));
  CHECK(mincore(p, size, resident) == 0);
  /* The first and last pages are partial in the range: not populated. */
  CHECK((resident[0] & 1) == 0);
  CHECK((resident[size / page - 1] & 1) == 0);
  for (i = 1; i + 1 < size / page; ++i) missing += (resident[i] & 1) == 0;
  CHECK(missing == 0);
  CHECK(p[page + 7] == 42);
  CHECK(p[size / 2] == 0);
  CHECK_OK(dcp_populate_host(NULL, 0));
  CHECK_OK(dcp_populate_host(p, 1));
  CHECK_ERROR(dcp_populate_host(NULL, 10), DCP_INVALID_ARGUMENT,
              "dcp_populate_host: data is NULL with 10 bytes");
  free(resident);
  munmap(p, size);
}

/* Pages the kernel will not fault in for writing are an error naming the
 * range, not a crash: read-only memory, and a range with a hole. (Where
 * the kernel lacks MADV_POPULATE_WRITE the library writes each page, which
 * such ranges fault: skipped there.) */
static void test_populate_host_refuses_memory_it_cannot_write(void) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  unsigned char* p;
  void* probe = mmap(NULL, page, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  const int has = probe != MAP_FAILED && madvise(probe, page, 23) == 0;
  if (probe != MAP_FAILED) munmap(probe, page);
  if (!has) {
    fprintf(stderr, "skipped: the kernel lacks MADV_POPULATE_WRITE\n");
    return;
  }
  p = mmap(NULL, 3 * page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(p != MAP_FAILED);
  if (p == MAP_FAILED) return;
  CHECK_ERROR(dcp_populate_host(p, 3 * page), DCP_INVALID_ARGUMENT,
              "dcp_populate_host: faulting in");
  CHECK(mprotect(p, 3 * page, PROT_READ | PROT_WRITE) == 0);
  CHECK(munmap(p + page, page) == 0);
  CHECK_ERROR(dcp_populate_host(p, 3 * page), DCP_RESOURCE_EXHAUSTED,
              "for writing (MADV_POPULATE_WRITE");
  CHECK_OK(dcp_populate_host(p, page));
  munmap(p, page);
  munmap(p + 2 * page, page);
}

/* A child of fork(2) after the library was used: every call fails with
 * DCP_FAILED_PRECONDITION saying why, and does nothing (the library's
 * threads stayed here). The child reports through its exit status. */
static void test_forked_child_is_refused(void) {
  int status = 0;
  pid_t child;
  char src[16] = "abc", dst[16] = {0};
  dcp_host_copy_t copy = {dst, src, 4};
  CHECK_OK(dcp_copy_host(&copy, 1, 0)); /* used here */
  child = fork();
  CHECK(child >= 0);
  if (child == 0) {
    int ok = 1;
    dst[0] = 0;
    ok &= dcp_copy_host(&copy, 1, 0) == DCP_FAILED_PRECONDITION;
    ok &= strstr(dcp_last_error_message(), "child of fork(2)") != NULL;
    ok &= dst[0] == 0; /* nothing copied */
    ok &= dcp_shutdown() == DCP_FAILED_PRECONDITION;
    _exit(ok ? 0 : 1);
  }
  CHECK(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  /* The parent is unaffected. */
  memset(dst, 0, sizeof(dst));
  CHECK_OK(dcp_copy_host(&copy, 1, 0));
  CHECK(strcmp(dst, "abc") == 0);
}

static void test_store_process_group(void) {
  mem_store store;
  rank_run runs[2];
  pthread_t threads[2];
  char dir[4200];
  int i, r;
  dcp_process_group_t* group = NULL;
  dcp_store_t bad;

  memset(&store, 0, sizeof(store));
  pthread_mutex_init(&store.mu, NULL);
  pthread_cond_init(&store.cv, NULL);
  dir_for("store-group", dir, sizeof(dir));
  for (i = 0; i < 2; ++i) {
    memset(&runs[i], 0, sizeof(runs[i]));
    runs[i].store = &store;
    runs[i].rank = i;
    runs[i].dir = dir;
    CHECK(pthread_create(&threads[i], NULL, rank_main, &runs[i]) == 0);
  }
  for (i = 0; i < 2; ++i) {
    CHECK(pthread_join(threads[i], NULL) == 0);
    g_checks += runs[i].checks;
    g_failures += runs[i].failures;
    for (r = 0; r < 4; ++r) CHECK(runs[i].loaded[r] == runs[i].expected[r]);
    CHECK(runs[i].save_status == DCP_INVALID_ARGUMENT);
    CHECK(runs[i].num_rank_failures == 1);
    CHECK(runs[i].failed_rank == 1);
    CHECK(runs[i].failed_code == DCP_INVALID_ARGUMENT);
    CHECK(strstr(runs[i].failed_message, "a.b") != NULL);
  }
  CHECK(runs[0].guard_status == DCP_FAILED_PRECONDITION);
  CHECK(strstr(runs[0].guard_message, "callback") != NULL);
  CHECK(store.sets > 0); /* The ranks met through the store. */
  store_destroy(&store);

  /* Store errors. */
  memset(&bad, 0, sizeof(bad));
  CHECK_ERROR(dcp_process_group_create_from_store(&bad, 0, 2, NULL, &group),
              DCP_INVALID_ARGUMENT, "dcp_store_t.struct_size is 0");
  bad.struct_size = sizeof(bad);
  CHECK_ERROR(dcp_process_group_create_from_store(&bad, 0, 2, NULL, &group),
              DCP_INVALID_ARGUMENT, "set and get");
  CHECK_ERROR(dcp_process_group_create_from_store(NULL, 0, 2, NULL, &group),
              DCP_INVALID_ARGUMENT, "store is NULL");
  CHECK(group == NULL);
}

/* ------------------------------------------------------------------------
 * Managed DLPack tensors
 * ---------------------------------------------------------------------- */

typedef struct managed_float {
  DLManagedTensor legacy;
  struct DLManagedTensorVersioned versioned;
  float data[6];
  int64_t shape[2];
  int deletes;
} managed_float;

static void legacy_deleter(DLManagedTensor* self) {
  ((managed_float*)self->manager_ctx)->deletes++;
}

static void versioned_deleter(struct DLManagedTensorVersioned* self) {
  ((managed_float*)self->manager_ctx)->deletes++;
}

static void managed_init(managed_float* m, float first) {
  int i;
  memset(m, 0, sizeof(*m));
  for (i = 0; i < 6; ++i) m->data[i] = first + (float)i;
  m->shape[0] = 2;
  m->shape[1] = 3;
  m->legacy.dl_tensor = make_tensor(m->data, 2, m->shape, NULL, kDLFloat, 32);
  m->legacy.manager_ctx = m;
  m->legacy.deleter = legacy_deleter;
  m->versioned.version.major = 1;
  m->versioned.version.minor = 1;
  m->versioned.dl_tensor = m->legacy.dl_tensor;
  m->versioned.manager_ctx = m;
  m->versioned.deleter = versioned_deleter;
}

static void test_managed_dlpack(void) {
  managed_float a, b, c, d, e, f;
  char dir[4200];
  dcp_state_dict_t* sd = NULL;
  dcp_state_dict_t* dest = NULL;
  dcp_save_options_t so;
  dcp_load_options_t lo;
  DLManagedTensor* exported = NULL;
  int i;

  managed_init(&a, 1);
  managed_init(&b, 10);
  CHECK_OK(dcp_state_dict_create(&sd));
  CHECK_OK(dcp_state_dict_set_dlpack(sd, PATH(KEY("legacy")), &a.legacy, NULL));
  CHECK_OK(dcp_state_dict_set_dlpack_versioned(sd, PATH(KEY("versioned")),
                                               &b.versioned, NULL));
  CHECK(a.deletes == 0 && b.deletes == 0);
  so = save_options(dir_for("managed", dir, sizeof(dir)));
  CHECK_OK(dcp_save(sd, &so, NULL));

  /* Export shares the memory; the export keeps it alive past the leaf. */
  CHECK_OK(dcp_state_dict_get_dlpack(sd, PATH(KEY("legacy")), &exported));
  CHECK(exported->dl_tensor.data == a.data);
  CHECK(exported->dl_tensor.ndim == 2 && exported->dl_tensor.shape[1] == 3);
  CHECK(exported->dl_tensor.dtype.code == kDLFloat &&
        exported->dl_tensor.dtype.bits == 32);
  /* Replacing a leaf releases its tensor (once the export is gone too). */
  CHECK_OK(dcp_state_dict_set_none(sd, PATH(KEY("legacy"))));
  CHECK(a.deletes == 0);
  exported->deleter(exported);
  CHECK(a.deletes == 1);
  CHECK_OK(dcp_state_dict_free(sd));
  CHECK(a.deletes == 1 && b.deletes == 1);

  /* Load into managed tensors. */
  managed_init(&c, 0);
  managed_init(&d, 0);
  memset(c.data, 0, sizeof(c.data));
  memset(d.data, 0, sizeof(d.data));
  CHECK_OK(dcp_state_dict_create(&dest));
  CHECK_OK(
      dcp_state_dict_set_dlpack(dest, PATH(KEY("legacy")), &c.legacy, NULL));
  CHECK_OK(dcp_state_dict_set_dlpack_versioned(dest, PATH(KEY("versioned")),
                                               &d.versioned, NULL));
  lo = load_options(dir);
  CHECK_OK(dcp_load(dest, &lo));
  for (i = 0; i < 6; ++i) {
    CHECK(c.data[i] == 1 + i);
    CHECK(d.data[i] == 10 + i);
  }
  /* A read-only versioned tensor cannot be loaded into. */
  managed_init(&e, 0);
  e.versioned.flags = 1; /* DLPACK_FLAG_BITMASK_READ_ONLY */
  CHECK_OK(dcp_state_dict_set_dlpack_versioned(dest, PATH(KEY("versioned")),
                                               &e.versioned, NULL));
  CHECK(d.deletes == 1);
  CHECK_ERROR(dcp_load(dest, &lo), DCP_INVALID_ARGUMENT,
              "\"versioned\": the tensor is read-only");
  /* Nor is it exported as a (writable) legacy DLManagedTensor. */
  exported = NULL;
  CHECK_ERROR(
      dcp_state_dict_get_dlpack(dest, PATH(KEY("versioned")), &exported),
      DCP_INVALID_ARGUMENT, "is read-only");
  CHECK(exported == NULL);
  CHECK_OK(dcp_state_dict_free(dest));
  CHECK(c.deletes == 1 && d.deletes == 1 && e.deletes == 1);

  /* Every error path calls the deleter once. */
  managed_init(&f, 0);
  CHECK_OK(dcp_state_dict_create(&sd));
  f.versioned.version.major = 2;
  CHECK_ERROR(dcp_state_dict_set_dlpack_versioned(sd, PATH(KEY("v2")),
                                                  &f.versioned, NULL),
              DCP_INVALID_ARGUMENT, "DLPack version 2.1");
  CHECK(f.deletes == 1);
  managed_init(&f, 0);
  f.legacy.dl_tensor.dtype.code = 7; /* kDLFloat8_e3m4 */
  f.legacy.dl_tensor.dtype.bits = 8;
  CHECK_ERROR(dcp_state_dict_set_dlpack(sd, PATH(KEY("e3m4")), &f.legacy, NULL),
              DCP_INVALID_ARGUMENT, "\"e3m4\"");
  CHECK(f.deletes == 1);
  managed_init(&f, 0);
  CHECK_ERROR(dcp_state_dict_set_dlpack(NULL, PATH(KEY("x")), &f.legacy, NULL),
              DCP_INVALID_ARGUMENT, "dcp_state_dict_t");
  CHECK(f.deletes == 1);
  managed_init(&f, 0);
  CHECK_ERROR(
      dcp_state_dict_set_dlpack_versioned(sd, PATH(IDX(0)), &f.versioned, NULL),
      DCP_INVALID_ARGUMENT, "first element must be a key");
  CHECK(f.deletes == 1);
  CHECK_OK(dcp_state_dict_free(sd));
  CHECK(f.deletes == 1);
}

/* ------------------------------------------------------------------------
 * Error paths
 * ---------------------------------------------------------------------- */

/* Tensors and paths whose sizes overflow or run away: refused with
 * DCP_INVALID_ARGUMENT saying why, the state dict unchanged. */
static void test_bad_tensor_sizes(void) {
  dcp_state_dict_t* sd = NULL;
  unsigned char bytes[2] = {1, 2};
  int64_t two[1] = {2}, huge_stride[1] = {INT64_MAX};
  int64_t too_big[2] = {(int64_t)1 << 32, (int64_t)1 << 32};
  int64_t empty[3] = {0, (int64_t)1 << 40, (int64_t)1 << 40};
  int64_t one[1] = {1}, global[1] = {10}, offsets[1] = {INT64_MAX};
  dcp_shard_t shard;
  DLTensor t;
  size_t n = 1;

  CHECK_OK(dcp_state_dict_create(&sd));
  /* The last element's offset (INT64_MAX) + 1 overflows. */
  t = make_tensor(bytes, 1, two, huge_stride, kDLUInt, 8);
  CHECK_ERROR(dcp_state_dict_set_tensor(sd, PATH(KEY("a")), &t, NULL),
              DCP_INVALID_ARGUMENT, "spans more bytes than fit in 64 bits");
  t = make_tensor(bytes, 2, too_big, NULL, kDLFloat, 32);
  CHECK_ERROR(dcp_state_dict_set_tensor(sd, PATH(KEY("b")), &t, NULL),
              DCP_INVALID_ARGUMENT, "has a negative size or too many bytes");
  /* An offset past the global shape whose sum with the size wraps. */
  t = make_tensor(bytes, 1, one, NULL, kDLUInt, 8);
  shard.ndim = 1;
  shard.global_shape = global;
  shard.offsets = offsets;
  CHECK_ERROR(dcp_state_dict_set_tensor(sd, PATH(KEY("c")), &t, &shard),
              DCP_INVALID_ARGUMENT, "lies outside the global shape");
  /* A list index far past the end (an uninitialised path element). */
  CHECK_ERROR(
      dcp_state_dict_set_int(sd, PATH(KEY("d"), IDX((int64_t)1 << 40)), 1),
      DCP_INVALID_ARGUMENT, "past the end of its list (0 entries)");
  CHECK_OK(dcp_state_dict_num_leaves(sd, &n));
  CHECK(n == 0);
  /* An empty tensor of a huge shape spans no bytes: accepted. */
  t = make_tensor(NULL, 3, empty, NULL, kDLUInt, 8);
  CHECK_OK(dcp_state_dict_set_tensor(sd, PATH(KEY("e")), &t, NULL));
  CHECK_OK(dcp_state_dict_set_int(sd, PATH(KEY("d"), IDX(3)), 1));
  CHECK_OK(dcp_state_dict_num_leaves(sd, &n));
  CHECK(n == 5); /* e, and d's four entries (None, None, None, 1) */
  CHECK_OK(dcp_state_dict_free(sd));
}

static void test_bad_handles(void) {
  struct {
    uint64_t a, b, c, d;
  } not_a_handle = {1, 2, 3, 4};
  dcp_state_dict_t* sd = NULL;
  dcp_state_dict_t* freed = NULL;
  dcp_metadata_t* md = NULL;
  size_t n = 0;
  char dir[4200];
  dcp_save_options_t so;
  dcp_leaf_info_t info = leaf_info();

  CHECK_ERROR(dcp_state_dict_num_leaves(NULL, &n), DCP_INVALID_ARGUMENT,
              "dcp_state_dict_t handle is NULL");
  CHECK_OK(dcp_state_dict_create(&freed));
  CHECK_OK(dcp_state_dict_free(freed));
  CHECK_ERROR(dcp_state_dict_num_leaves(freed, &n), DCP_INVALID_ARGUMENT,
              "is not a live dcp_state_dict_t handle");
  CHECK_ERROR(dcp_state_dict_free(freed), DCP_INVALID_ARGUMENT,
              "is not a live dcp_state_dict_t handle");
  CHECK_ERROR(dcp_state_dict_set_int((dcp_state_dict_t*)&not_a_handle,
                                     PATH(KEY("x")), 1),
              DCP_INVALID_ARGUMENT, "is not a live dcp_state_dict_t handle");
  CHECK_ERROR(dcp_metadata_num_items((dcp_metadata_t*)&not_a_handle, &n),
              DCP_INVALID_ARGUMENT, "is not a live dcp_metadata_t handle");
  CHECK_ERROR(dcp_async_save_free((dcp_async_save_t*)&not_a_handle),
              DCP_INVALID_ARGUMENT, "dcp_async_save_t");

  /* A handle of another type. */
  CHECK_OK(dcp_state_dict_create(&sd));
  CHECK_OK(dcp_state_dict_set_int(sd, PATH(KEY("x")), 1));
  so = save_options(dir_for("handles", dir, sizeof(dir)));
  CHECK_OK(dcp_save(sd, &so, &md));
  CHECK_ERROR(dcp_state_dict_get((dcp_state_dict_t*)md, PATH(KEY("x")), &info),
              DCP_INVALID_ARGUMENT,
              "is a dcp_metadata_t handle, not a dcp_state_dict_t");
  CHECK_ERROR(dcp_metadata_num_items((dcp_metadata_t*)sd, &n),
              DCP_INVALID_ARGUMENT,
              "is a dcp_state_dict_t handle, not a dcp_metadata_t");
  so.storage_writer = (dcp_storage_writer_t*)sd;
  CHECK_ERROR(dcp_save(sd, &so, NULL), DCP_INVALID_ARGUMENT,
              "not a dcp_storage_writer_t");
  CHECK_OK(dcp_metadata_free(md));
  CHECK_OK(dcp_state_dict_free(sd));

  /* Freeing NULL is a no-op. */
  CHECK_OK(dcp_state_dict_free(NULL));
  CHECK_OK(dcp_metadata_free(NULL));
  CHECK_OK(dcp_storage_writer_free(NULL));
  CHECK_OK(dcp_storage_reader_free(NULL));
  CHECK_OK(dcp_process_group_free(NULL));
  CHECK_OK(dcp_async_save_free(NULL));
}

static void test_struct_sizes(void) {
  /* Room for a struct larger than the library's. */
  union {
    dcp_save_options_t options;
    unsigned char bytes[sizeof(dcp_save_options_t) + 64];
  } big;
  dcp_state_dict_t* sd = NULL;
  dcp_save_options_t so;
  dcp_leaf_info_t info;
  dcp_item_info_t item;
  dcp_fs_writer_options_t wo;
  dcp_storage_writer_t* writer = NULL;
  char dir[4200];

  CHECK_OK(dcp_state_dict_create(&sd));
  CHECK_OK(dcp_state_dict_set_int(sd, PATH(KEY("x")), 42));
  so = save_options(dir_for("sizes", dir, sizeof(dir)));
  so.struct_size = 0;
  CHECK_ERROR(dcp_save(sd, &so, NULL), DCP_INVALID_ARGUMENT,
              "dcp_save_options_t.struct_size is 0");
  /* A size no version has: it would cut checkpoint_id in two. */
  so.struct_size = 12;
  CHECK_ERROR(dcp_save(sd, &so, NULL), DCP_INVALID_ARGUMENT,
              "dcp_save_options_t.struct_size is 12");
  memset(&big, 0, sizeof(big));
  big.options = save_options(dir);
  big.options.struct_size = sizeof(big);
  CHECK_ERROR(dcp_save(sd, &big.options, NULL), DCP_INVALID_ARGUMENT,
              "dcp_save_options_t.struct_size");
  memset(&wo, 0, sizeof(wo));
  CHECK_ERROR(dcp_fs_writer_create(dir, &wo, &writer), DCP_INVALID_ARGUMENT,
              "dcp_fs_writer_options_t.struct_size is 0");
  wo.struct_size = sizeof(wo);
  wo.overwrite = 5;
  CHECK_ERROR(dcp_fs_writer_create(dir, &wo, &writer), DCP_INVALID_ARGUMENT,
              "dcp_fs_writer_options_t.overwrite is 5");

  /* An output struct: 0 and too large fail; an older, smaller one gets
   * only the fields it has. */
  memset(&info, 0, sizeof(info));
  CHECK_ERROR(dcp_state_dict_get(sd, PATH(KEY("x")), &info),
              DCP_INVALID_ARGUMENT, "dcp_leaf_info_t.struct_size is 0");
  info.struct_size = sizeof(info) + 1;
  CHECK_ERROR(dcp_state_dict_get(sd, PATH(KEY("x")), &info),
              DCP_INVALID_ARGUMENT, "dcp_leaf_info_t.struct_size");
  memset(&info, 0xab, sizeof(info));
  info.struct_size = offsetof(dcp_leaf_info_t, int_value) + sizeof(int64_t);
  CHECK_OK(dcp_state_dict_get(sd, PATH(KEY("x")), &info));
  CHECK(info.kind == DCP_VALUE_INT && info.int_value == 42);
  CHECK(info.struct_size ==
        offsetof(dcp_leaf_info_t, int_value) + sizeof(int64_t));
  CHECK(info.bool_value == (int32_t)0xabababab); /* Beyond its size. */

  /* A NULL options pointer means defaults, which name no checkpoint. */
  so = save_options(dir);
  CHECK_OK(dcp_save(sd, &so, NULL));
  CHECK_ERROR(dcp_save(sd, NULL, NULL), DCP_INVALID_ARGUMENT, "checkpoint_id");
  CHECK_ERROR(dcp_load(sd, NULL), DCP_INVALID_ARGUMENT, "checkpoint_id");
  CHECK_ERROR(dcp_metadata_item(NULL, 0, NULL), DCP_INVALID_ARGUMENT,
              "dcp_item_info_t");
  memset(&item, 0, sizeof(item));
  CHECK_ERROR(dcp_metadata_item(NULL, 0, &item), DCP_INVALID_ARGUMENT,
              "dcp_item_info_t.struct_size is 0");
  CHECK_OK(dcp_state_dict_free(sd));
}

static void test_tensor_errors(void) {
  float data[6] = {0};
  float wrong[8] = {0};
  int64_t shape[2] = {2, 3};
  int64_t wrong_shape[2] = {2, 4};
  int64_t bad_shape[1] = {-1};
  int64_t global[2] = {4, 3};
  int64_t outside[2] = {3, 0};
  dcp_shard_t shard;
  dcp_state_dict_t* sd = NULL;
  dcp_state_dict_t* dest = NULL;
  dcp_save_options_t so;
  dcp_load_options_t lo;
  dcp_leaf_info_t info = leaf_info();
  DLTensor t, tensors[2];
  dcp_path_t paths[2];
  char dir[4200], missing[4200];

  CHECK_OK(dcp_state_dict_create(&sd));
  /* An unknown dtype: float8_e3m4 (code 7). */
  t = make_tensor(data, 2, shape, NULL, 7, 8);
  CHECK_ERROR(
      dcp_state_dict_set_tensor(sd, PATH(KEY("model"), KEY("w")), &t, NULL),
      DCP_INVALID_ARGUMENT,
      "state dict path \"model.w\": DLPack dtype (code 7");
  t = make_tensor(data, 2, shape, NULL, kDLFloat, 32);
  t.dtype.lanes = 4;
  CHECK_ERROR(
      dcp_state_dict_set_tensor(sd, PATH(KEY("model"), KEY("w")), &t, NULL),
      DCP_INVALID_ARGUMENT, "lanes 4");
  /* A device dcp does not take. */
  t = make_tensor(data, 2, shape, NULL, kDLFloat, 32);
  t.device.device_type = kDLMetal;
  CHECK_ERROR(
      dcp_state_dict_set_tensor(sd, PATH(KEY("model"), KEY("w")), &t, NULL),
      DCP_INVALID_ARGUMENT, "\"model.w\": DLPack device type 8");
  t = make_tensor(data, 1, bad_shape, NULL, kDLFloat, 32);
  CHECK_ERROR(dcp_state_dict_set_tensor(sd, PATH(KEY("neg")), &t, NULL),
              DCP_INVALID_ARGUMENT, "\"neg\"");
  t = make_tensor(NULL, 2, shape, NULL, kDLFloat, 32);
  CHECK_ERROR(dcp_state_dict_set_tensor(sd, PATH(KEY("null")), &t, NULL),
              DCP_INVALID_ARGUMENT, "NULL data");
  CHECK_ERROR(dcp_state_dict_set_tensor(sd, PATH(KEY("null")), NULL, NULL),
              DCP_INVALID_ARGUMENT, "the DLTensor is NULL");
  /* A shard outside its global shape; a 0-d sharded tensor. */
  t = make_tensor(data, 2, shape, NULL, kDLFloat, 32);
  shard.ndim = 2;
  shard.global_shape = global;
  shard.offsets = outside;
  CHECK_ERROR(dcp_state_dict_set_tensor(sd, PATH(KEY("s")), &t, &shard),
              DCP_INVALID_ARGUMENT, "\"s\"");
  paths[0] = PATH(KEY("ok"));
  paths[1] = PATH(KEY("bad"));
  tensors[0] = t;
  tensors[1] = t;
  tensors[1].device.device_type = kDLMetal;
  CHECK_ERROR(dcp_state_dict_set_tensors(sd, 2, paths, tensors, NULL),
              DCP_INVALID_ARGUMENT, "\"bad\"");
  CHECK_OK(dcp_state_dict_get(sd, PATH(KEY("ok")), &info)); /* Stays set. */
  CHECK(info.kind == DCP_VALUE_TENSOR);

  /* Paths. */
  CHECK_OK(dcp_state_dict_set_int(sd, PATH(KEY("step")), 1));
  CHECK_ERROR(dcp_state_dict_set_int(sd, PATH(KEY("step"), KEY("x")), 2),
              DCP_INVALID_ARGUMENT, "goes through \"step\", a int leaf");
  CHECK_OK(dcp_state_dict_set_int(sd, PATH(KEY("m"), KEY("a")), 1));
  CHECK_ERROR(dcp_state_dict_set_int(sd, PATH(KEY("m"), IDX(0)), 2),
              DCP_INVALID_ARGUMENT, "uses the map at \"m\" as a list");
  CHECK_OK(dcp_state_dict_set_int(sd, PATH(KEY("l"), IDX(1)), 1));
  CHECK_ERROR(dcp_state_dict_set_int(sd, PATH(KEY("l"), KEY("k")), 2),
              DCP_INVALID_ARGUMENT, "uses the list at \"l\" as a map");
  CHECK_ERROR(dcp_state_dict_get(sd, PATH(KEY("m")), &info),
              DCP_INVALID_ARGUMENT, "ends at a map");
  CHECK_ERROR(dcp_state_dict_get(sd, PATH(KEY("m"), KEY("b")), &info),
              DCP_NOT_FOUND, "\"m.b\"");
  CHECK_ERROR(dcp_state_dict_get(sd, PATH(KEY("step"), KEY("x")), &info),
              DCP_INVALID_ARGUMENT, "goes through \"step\"");
  CHECK_ERROR(dcp_state_dict_set_int(sd, PATH(KEY("l"), IDX(-2)), 1),
              DCP_INVALID_ARGUMENT, "index -2");
  {
    dcp_path_t empty = {NULL, 0};
    CHECK_ERROR(dcp_state_dict_set_int(sd, empty, 1), DCP_INVALID_ARGUMENT,
                "empty");
  }

  /* A missing checkpoint. */
  dir_for("no-such-checkpoint", missing, sizeof(missing));
  lo = load_options(missing);
  CHECK_ERROR(dcp_load(sd, &lo), DCP_NOT_FOUND, missing);

  /* Save; load into a wrong shape, a wrong dtype, a missing key. */
  CHECK_OK(dcp_state_dict_free(sd));
  CHECK_OK(dcp_state_dict_create(&sd));
  t = make_tensor(data, 2, shape, NULL, kDLFloat, 32);
  CHECK_OK(
      dcp_state_dict_set_tensor(sd, PATH(KEY("model"), KEY("w")), &t, NULL));
  so = save_options(dir_for("errors", dir, sizeof(dir)));
  CHECK_OK(dcp_save(sd, &so, NULL));
  CHECK_OK(dcp_state_dict_create(&dest));
  t = make_tensor(wrong, 2, wrong_shape, NULL, kDLFloat, 32);
  CHECK_OK(
      dcp_state_dict_set_tensor(dest, PATH(KEY("model"), KEY("w")), &t, NULL));
  lo = load_options(dir);
  CHECK_ERROR(dcp_load(dest, &lo), DCP_INVALID_ARGUMENT, "model.w");
  t = make_tensor(wrong, 2, shape, NULL, kDLInt, 32);
  CHECK_OK(
      dcp_state_dict_set_tensor(dest, PATH(KEY("model"), KEY("w")), &t, NULL));
  CHECK_ERROR(dcp_load(dest, &lo), DCP_INVALID_ARGUMENT, "model.w");
  t = make_tensor(wrong, 2, shape, NULL, kDLFloat, 32);
  CHECK_OK(
      dcp_state_dict_set_tensor(dest, PATH(KEY("model"), KEY("w")), &t, NULL));
  CHECK_OK(dcp_state_dict_set_int(dest, PATH(KEY("extra")), 1));
  CHECK_ERROR(dcp_load(dest, &lo), DCP_NOT_FOUND, "extra");
  /* A missing key with allow_partial_load is skipped. */
  {
    dcp_load_planner_options_t po;
    memset(&po, 0, sizeof(po));
    po.struct_size = sizeof(po);
    po.allow_partial_load = DCP_TRUE;
    lo.planner = &po;
    CHECK_OK(dcp_load(dest, &lo));
  }
  CHECK_OK(dcp_state_dict_free(dest));
  CHECK_ERROR(dcp_metadata_read(missing, NULL), DCP_INVALID_ARGUMENT,
              "output pointer");
  {
    dcp_metadata_t* md = NULL;
    CHECK_ERROR(dcp_metadata_read(missing, &md), DCP_NOT_FOUND, missing);
    CHECK(md == NULL);
  }
  CHECK_OK(dcp_state_dict_free(sd));
}

/* The last error: kept by successful calls; rank failures. */
static void test_last_error(void) {
  dcp_state_dict_t* sd = NULL;
  int32_t rank = -1;
  int code = -1;
  const char* message = NULL;

  CHECK_ERROR(dcp_state_dict_free((dcp_state_dict_t*)&rank),
              DCP_INVALID_ARGUMENT, "dcp_state_dict_t");
  CHECK_OK(dcp_state_dict_create(&sd));
  CHECK(dcp_last_error_code() == DCP_INVALID_ARGUMENT);
  CHECK(strstr(dcp_last_error_message(), "dcp_state_dict_t") != NULL);
  CHECK(dcp_last_error_num_rank_failures() == 0);
  CHECK(dcp_last_error_rank_failure(0, &rank, &code, &message) ==
        DCP_OUT_OF_RANGE);
  /* Reading it does not replace it. */
  CHECK(dcp_last_error_code() == DCP_INVALID_ARGUMENT);
  CHECK_OK(dcp_state_dict_free(sd));
}

int main(void) {
  const char* tmp = getenv("TEST_TMPDIR");
  char pattern[4096];
  snprintf(pattern, sizeof(pattern), "%s/capi_XXXXXX",
           tmp != NULL ? tmp : "/tmp");
  if (mkdtemp(pattern) == NULL) {
    perror("mkdtemp");
    return 2;
  }
  snprintf(g_root, sizeof(g_root), "%s", pattern);

  test_version_and_names();
  test_roundtrip_every_dtype();
  test_strided();
  test_plain_values();
  test_resharding();
  test_metadata();
  test_metadata_extras();
  test_writer_and_reader_handles();
  test_load_with_read_metadata();
  test_dtype_mismatches();
  test_writer_compression();
  test_writer_safetensors();
  test_hf_roundtrip();
  test_hf_errors();
  test_mega();
  test_hf_quantized();
  test_async_save();
  test_stager();
  test_copy_host();
  test_snapshot_host();
  test_populate_host();
  test_populate_host_refuses_memory_it_cannot_write();
  test_forked_child_is_refused();
  test_store_process_group();
  test_managed_dlpack();
  test_bad_handles();
  test_bad_tensor_sizes();
  test_struct_sizes();
  test_tensor_errors();
  test_last_error();
  if (dcp_shutdown() != DCP_OK) ++g_failures;

  printf("%d checks, %d failed\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
