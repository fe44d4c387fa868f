/* Saves a small state dict through the C ABI, loads it into fresh memory
 * and checks every byte, then inspects the checkpoint's metadata.
 *
 *   c_example DIR     (exit status 0 when everything round-tripped) */
#include <stdio.h>
#include <string.h>

#include "dcp/dcp.h"

#define CHECK(call)                                                           \
  do {                                                                        \
    int status_ = (call);                                                     \
    if (status_ != DCP_OK) {                                                  \
      fprintf(stderr, "%s failed: %s: %s\n", #call, dcp_status_name(status_), \
              dcp_last_error_message());                                      \
      return 1;                                                               \
    }                                                                         \
  } while (0)

static DLTensor HostTensor(void* data, DLDataType dtype, int32_t ndim,
                           int64_t* shape) {
  DLTensor t;
  memset(&t, 0, sizeof(t));
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = ndim;
  t.dtype = dtype;
  t.shape = shape;
  return t;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  printf("dcp %s\n", dcp_version());

  float weight[2][3] = {{1, 2, 3}, {4, 5, 6}};
  int64_t weight_shape[2] = {2, 3};
  DLDataType f32 = {kDLFloat, 32, 1};
  DLTensor weight_t = HostTensor(weight, f32, 2, weight_shape);
  dcp_path_elem_t weight_path[2] = {{"model", 0}, {"weight", 0}};
  dcp_path_elem_t step_path[1] = {{"step", 0}};
  dcp_path_t weight_p = {weight_path, 2};
  dcp_path_t step_p = {step_path, 1};

  dcp_state_dict_t* sd = NULL;
  CHECK(dcp_state_dict_create(&sd));
  CHECK(dcp_state_dict_set_tensor(sd, weight_p, &weight_t, NULL));
  CHECK(dcp_state_dict_set_int(sd, step_p, 100));

  dcp_save_options_t save;
  memset(&save, 0, sizeof(save));
  save.struct_size = sizeof(save);
  save.checkpoint_id = argv[1];
  CHECK(dcp_save(sd, &save, NULL));
  CHECK(dcp_state_dict_free(sd));

  /* Load into zeroed memory. */
  float loaded[2][3];
  memset(loaded, 0, sizeof(loaded));
  DLTensor loaded_t = HostTensor(loaded, f32, 2, weight_shape);
  CHECK(dcp_state_dict_create(&sd));
  CHECK(dcp_state_dict_set_tensor(sd, weight_p, &loaded_t, NULL));
  CHECK(dcp_state_dict_set_int(sd, step_p, 0));
  dcp_load_options_t load;
  memset(&load, 0, sizeof(load));
  load.struct_size = sizeof(load);
  load.checkpoint_id = argv[1];
  CHECK(dcp_load(sd, &load));
  dcp_leaf_info_t step;
  memset(&step, 0, sizeof(step));
  step.struct_size = sizeof(step);
  CHECK(dcp_state_dict_get(sd, step_p, &step));
  CHECK(dcp_state_dict_free(sd));
  if (memcmp(weight, loaded, sizeof(weight)) != 0 || step.int_value != 100) {
    fprintf(stderr, "loaded values differ from the saved ones\n");
    return 1;
  }

  /* What the checkpoint holds, without loading it. */
  dcp_metadata_t* md = NULL;
  CHECK(dcp_metadata_read(argv[1], &md));
  size_t n = 0;
  CHECK(dcp_metadata_num_items(md, &n));
  for (size_t i = 0; i < n; ++i) {
    dcp_item_info_t item;
    memset(&item, 0, sizeof(item));
    item.struct_size = sizeof(item);
    CHECK(dcp_metadata_item(md, i, &item));
    printf("  %s %s\n", item.name,
           item.is_tensor ? dcp_dtype_name(item.dtype) : "(value)");
  }
  CHECK(dcp_metadata_free(md));

  /* Errors come back as codes with a message. */
  dcp_metadata_t* missing = NULL;
  int status = dcp_metadata_read("/nonexistent/dcp-checkpoint", &missing);
  if (status != DCP_NOT_FOUND) {
    fprintf(stderr, "expected NOT_FOUND, got %s\n", dcp_status_name(status));
    return 1;
  }
  printf("missing checkpoint: %s\n", dcp_last_error_message());
  printf("c_example: OK\n");
  return 0;
}
