/* weft-train: trains the reference model on an N-D mesh of the world.
 *
 *     mpiexec -n 4 weft-train --mesh dp=2,tp=2            # embedded data, demo model
 *     mpiexec -n 8 weft-train --mesh dp_replicate=2,dp_shard=2,tp=2 --model tiny
 *     weft-train --help
 *
 * The work is in the weft_train_core library (shared with weft-plan
 * --validate): options.c, model.c, data.c, setup.c, loop.c, checkpoint.c
 * and agree.c; train_internal.h says which does what. */
#include <stdio.h>

#include "train.h"

int main(int argc, char **argv) {
  if (weft_init(&argc, &argv) != WEFT_OK) {
    fprintf(stderr, "weft-train: error: %s\n", weft_last_error());
    return 1;
  }
  train_opts o;
  train_opts_default(&o);
  char err[1024] = "";
  /* every rank parses the same argv: errors are alike everywhere */
  int p = train_parse_args(argc, argv, &o, err, sizeof err, weft_world_rank() == 0);
  int rc = 0;
  if (p < 0) {
    if (weft_world_rank() == 0) fprintf(stderr, "weft-train: error: %s\n", err);
    rc = 2;
  } else if (p == 0) {
    rc = train_run(&o, NULL);
  }
  weft_finalize();
  return rc;
}
