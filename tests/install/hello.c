/* tests/install/hello.c — compiled OUTSIDE the build tree by install_check.sh
 * against a temporary install of weft, with `pkg-config --cflags --libs weft`
 * only. Creates a 1-D mesh over the world and a tensor, checks them, and
 * prints one line that the install suite checks:
 *     weft-install-ok version=<WEFT_VERSION> world=<n> mesh=<n> numel=6
 * Exits non-zero (with weft_last_error) on any failure. */
#include <stdio.h>

#include <weft/weft.h>

int main(int argc, char **argv) {
  if (weft_init(&argc, &argv) != WEFT_OK) {
    fprintf(stderr, "weft_init: %s\n", weft_last_error());
    return 1;
  }
  int world = weft_world_size();
  const int shape[1] = {world};
  const char *const names[1] = {"dp"};
  weft_mesh *mesh = NULL;
  if (weft_mesh_create(1, shape, names, &mesh) != WEFT_OK) {
    fprintf(stderr, "weft_mesh_create: %s\n", weft_last_error());
    weft_finalize();
    return 1;
  }
  const int64_t tshape[2] = {2, 3};
  weft_tensor *t = NULL;
  if (weft_tensor_zeros(WEFT_F32, WEFT_CPU, 2, tshape, &t) != WEFT_OK) {
    fprintf(stderr, "weft_tensor_zeros: %s\n", weft_last_error());
    weft_mesh_destroy(mesh);
    weft_finalize();
    return 1;
  }
  if (weft_world_rank() == 0)
    printf("weft-install-ok version=%s world=%d mesh=%d numel=%lld\n", WEFT_VERSION, world,
           weft_mesh_size(mesh), (long long)weft_tensor_numel(t));
  weft_tensor_destroy(t);
  weft_mesh_destroy(mesh);
  return weft_finalize() == WEFT_OK ? 0 : 1;
}
