#include "nn_util.h"

#include "worker.h"

weft_status mesh_world(weft_mesh **out) {
  int shape[1] = {weft_world_size()};
  const char *names[1] = {"tp"};
  weft_status st = weft_mesh_create(1, shape, names, out);
  if (st == WEFT_OK) weft_worker_mesh_on_device(*out);
  return st;
}
