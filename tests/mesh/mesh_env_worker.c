/* weft_init against the environment (its own main: weft_worker_main would
 * call weft_init itself). Each rank checks alone and exits 0 on success.
 *
 *   mesh_env_worker expect_invalid   weft_init fails with WEFT_ERR_INVALID
 *                                    and its message contains $MESH_NEEDLE
 *   mesh_env_worker expect_ok        weft_init succeeds with local rank
 *                                    $MESH_LR and local size $MESH_LS
 *                                    (unset: the world rank / size);
 *                                    with $MESH_UCX set, UCX_RNDV_THRESH
 *                                    must then read $MESH_UCX ("unset":
 *                                    absent) and weft must report having
 *                                    set it exactly when $MESH_UCX_SET=1
 * (expectations come through the environment, as the settings under test do)
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mesh.h"

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: mesh_env_worker expect_invalid | expect_ok\n");
    return 2;
  }
  const char *mode = argv[1];
  weft_status st = weft_init(&argc, &argv);
  if (strcmp(mode, "expect_invalid") == 0) {
    const char *needle = getenv("MESH_NEEDLE") ? getenv("MESH_NEEDLE") : "";
    if (st != WEFT_ERR_INVALID) {
      fprintf(stderr, "weft_init returned %s (%s), want invalid argument\n", weft_status_str(st),
              weft_last_error());
      if (st == WEFT_OK) weft_finalize();
      return 1;
    }
    if (!strstr(weft_last_error(), needle)) {
      fprintf(stderr, "weft_init message '%s' lacks '%s'\n", weft_last_error(), needle);
      return 1;
    }
    if (weft_is_initialized()) {
      fprintf(stderr, "weft_init failed but reports initialized\n");
      return 1;
    }
    return 0;
  }
  if (strcmp(mode, "expect_ok") == 0) {
    if (st != WEFT_OK) {
      fprintf(stderr, "weft_init failed: %s\n", weft_last_error());
      return 1;
    }
    int bad = 0;
    int lr = getenv("MESH_LR") ? atoi(getenv("MESH_LR")) : weft_world_rank();
    int ls = getenv("MESH_LS") ? atoi(getenv("MESH_LS")) : weft_world_size();
    if (weft_local_rank() != lr || weft_local_size() != ls) {
      fprintf(stderr, "[rank %d] local rank/size %d/%d want %d/%d\n", weft_world_rank(),
              weft_local_rank(), weft_local_size(), lr, ls);
      bad = 1;
    }
    const char *want_ucx = getenv("MESH_UCX");
    if (want_ucx) {
      const char *ucx = getenv("UCX_RNDV_THRESH");
      bool want_set = getenv("MESH_UCX_SET") && strcmp(getenv("MESH_UCX_SET"), "1") == 0;
      bool same = strcmp(want_ucx, "unset") == 0 ? !ucx : ucx && strcmp(ucx, want_ucx) == 0;
      if (!same || weft_get_settings()->tcp_eager_applied != want_set) {
        fprintf(stderr, "[rank %d] UCX_RNDV_THRESH=%s applied=%d, want %s applied=%d\n",
                weft_world_rank(), ucx ? ucx : "(unset)", weft_get_settings()->tcp_eager_applied,
                want_ucx, want_set);
        bad = 1;
      }
    }
    if (weft_init(NULL, NULL) != WEFT_ERR_STATE) {
      fprintf(stderr, "second weft_init did not fail with WEFT_ERR_STATE\n");
      bad = 1;
    }
    if (weft_finalize() != WEFT_OK) bad = 1;
    return bad;
  }
  fprintf(stderr, "unknown mode '%s'\n", mode);
  return 2;
}
