#include "worker.h"

#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "mesh.h"

int weft_worker_failures = 0;
int weft_worker_rank = -1;
int weft_worker_argc = 0;
char **weft_worker_argv = NULL;

int weft_worker_main(int argc, char **argv, const weft_worker_case *cases) {
  if (weft_init(&argc, &argv) != WEFT_OK) {
    fprintf(stderr, "worker: weft_init failed: %s\n", weft_last_error());
    return 2;
  }
  weft_worker_rank = weft_world_rank();
  weft_worker_argc = argc;
  weft_worker_argv = argv;
  const weft_worker_case *c = NULL;
  for (int i = 0; argc > 1 && cases[i].name; i++)
    if (strcmp(cases[i].name, argv[1]) == 0) c = &cases[i];
  if (!c) {
    if (weft_worker_rank == 0) {
      fprintf(stderr, "worker: unknown case '%s'; cases:", argc > 1 ? argv[1] : "(none)");
      for (int i = 0; cases[i].name; i++) fprintf(stderr, " %s", cases[i].name);
      fprintf(stderr, "\n");
    }
    weft_finalize();
    return 2;
  }
  c->fn();
  int total = 0;
  MPI_Allreduce(&weft_worker_failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (total && weft_worker_rank == 0)
    fprintf(stderr, "worker case '%s': %d failed check(s) across ranks\n", c->name, total);
  weft_finalize();
  return total ? 1 : 0;
}

/* ------------------------------------------------------ device mode */

bool weft_worker_device_mode(void) {
  const char *e = getenv("WEFT_TEST_DEVICE");
  if (!e || !*e) return false;
  WCHECK(strcmp(e, "cuda") == 0, "WEFT_TEST_DEVICE=%s: the only device mode is 'cuda'", e);
  return strcmp(e, "cuda") == 0;
}

weft_mesh *weft_worker_mesh_on_device(weft_mesh *root) {
  if (!root || !weft_worker_device_mode()) return root;
  weft_status st = weft_mesh_set_device(root, WEFT_CUDA);
  WCHECK(st == WEFT_OK, "mesh_set_device(cuda): %s", weft_last_error());
  WCHECK(weft_mesh_device(root) == WEFT_CUDA, "mesh_set_device(cuda) left the mesh on %s",
         weft_device_name(weft_mesh_device(root)));
  return root;
}

const weft_tensor *weft_worker_host_copy(const weft_tensor *t, weft_tensor **tmp) {
  *tmp = NULL;
  if (!t || t->device == WEFT_CPU) return t;
  weft_status st = weft_tensor_to(t, WEFT_CPU, tmp);
  WCHECK(st == WEFT_OK, "tensor_to(%s -> cpu): %s", weft_device_name(t->device), weft_last_error());
  return *tmp;
}

bool weft_worker_equal_on_host(const weft_tensor *a, const weft_tensor *b) {
  if (!a || !b) return false;
  weft_tensor *ta = NULL, *tb = NULL;
  const weft_tensor *ha = weft_worker_host_copy(a, &ta), *hb = weft_worker_host_copy(b, &tb);
  bool eq = ha && hb && weft_tensor_equal(ha, hb);
  weft_tensor_destroy(ta);
  weft_tensor_destroy(tb);
  return eq;
}
