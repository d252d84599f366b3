/* tests/nn/ops_shape_worker.c — multi-rank checks of the autograd ops
 * (started by test_ops_shape.c through mpiexec -n 2 / -n 4).
 *
 * random: for every op case and random input placements (Replicate,
 * Partial, Shard, StridedShard; uneven and empty shards included) and
 * random output grad placements on a 1-D mesh of the world (and a 2x2 mesh
 * on 4 ranks), the outputs' and the input grads' full tensors equal the
 * all-Replicate run (the 1-rank computation) within 1e-5, and the double
 * reference.
 * directed: the shardings the model relies on keep their shards (linear
 * colwise / rowwise / sequence, bias and position-embedding adds, the
 * head-split reshape, the q|k|v split of StridedShard(last, 3), sum).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops_check.h"
#include "ops_sharded.h"
#include "worker.h"

static void case_random(void) {
  int world = weft_world_size();
  int trials = weft_worker_argc > 2 ? atoi(weft_worker_argv[2]) : 6;
  uint64_t st = 0xC0FFEEull + (uint64_t)world;
  /* 1-D over the world, and 2 x world/2 when that is a 2-D mesh */
  int shapes[2][2] = {{world, 0}, {2, world / 2}};
  int nmesh = world >= 4 && world % 2 == 0 ? 2 : 1;
  for (int mi = 0; mi < nmesh; mi++) {
    int ndim = mi == 0 ? 1 : 2;
    weft_mesh *mesh = oc_make_mesh(ndim, shapes[mi]);
    if (!mesh) return;
    for (const oc_case *c = oc_cases; c->name; c++) {
      for (int t = 0; t < trials; t++) {
        weft_placement pl[OC_MAX_IN * WEFT_MESH_MAX_DIMS], gpl[WEFT_MESH_MAX_DIMS];
        oc_random_placements(c, ndim, &st, pl);
        int mode = -1;
        if (c->nout > 1 && (t & 1)) mode = t % c->nout;
        int gj = mode >= 0 ? mode : 0;
        oc_random_grad_placements(c->ondim[gj], ndim, &st, gpl);
        oc_against_replicate(c, mesh, pl, gpl, mode, 1000 + (uint64_t)t, NULL);
      }
    }
    weft_mesh_destroy(mesh);
  }
}

typedef struct directed {
  const char *name;
  weft_placement in[OC_MAX_IN];
  weft_placement want2, want4; /* output placement on 2 and on 4 ranks */
} directed;

static void case_directed(void) {
  int world = weft_world_size();
  weft_placement R = weft_replicate(), P = weft_partial(WEFT_OP_SUM);
#define SH(d) weft_shard(d)
  const directed ds[] = {
      {"linear", {R, SH(0)}, SH(2), SH(2)}, /* colwise */
      {"linear", {SH(2), SH(1)}, P, P},     /* rowwise */
      {"linear", {SH(1), R}, SH(1), SH(1)}, /* sequence-sharded x */
      {"linear", {SH(0), R}, SH(0), SH(0)}, /* batch-sharded x (uneven on 4) */
      {"linear_bias", {R, SH(0), SH(0)}, SH(2), SH(2)},
      {"linear_bias", {SH(2), SH(1), R}, P, P}, /* the bias added once */
      {"add_bias", {SH(1), R}, SH(1), SH(1)},
      {"add_pos", {SH(1), SH(0)}, SH(1), SH(1)}, /* sequence-parallel position add */
      {"add_pos", {SH(0), R}, SH(0), SH(0)},
      {"add", {P, P}, P, P},
      {"mul", {P, R}, P, P},
      {"matmul", {SH(0), R}, SH(0), SH(0)},
      {"matmul", {R, SH(1)}, SH(2), SH(2)},
      {"matmul", {SH(2), SH(0)}, P, P},
      {"reshape_split_heads", {SH(2)}, SH(2), R}, /* H = 2: survives on 2 ranks only */
      {"reshape_split_heads4", {SH(2)}, SH(2), SH(2)},
      {"reshape_split_heads4", {SH(1)}, SH(1), SH(1)}, /* sequence dim untouched (uneven) */
      {"reshape_merge_heads", {SH(2)}, SH(2), R},
      {"reshape_flatten", {SH(2)}, SH(1), SH(1)},
      {"reshape_flatten", {SH(0)}, SH(0), R},
      {"reshape_flatten", {SH(1)}, R, R}, /* inner dim of a merge */
      {"reshape_flatten", {P}, P, P},
      {"transpose_heads", {SH(2)}, SH(1), SH(1)},
      {"transpose", {P}, P, P},
      {"split_qkv", {weft_strided_shard(2, 3)}, SH(2), SH(2)},
      {"split_qkv", {SH(1)}, SH(1), SH(1)},
      {"split_qkv", {SH(2)}, SH(2), SH(2)}, /* all-to-all to StridedShard(2, 3) */
      {"cat_qkv", {SH(2), SH(2), SH(2)}, weft_strided_shard(2, 3), weft_strided_shard(2, 3)},
      {"cat_last", {SH(0), SH(0)}, SH(0), SH(0)},
      {"sum_dim1", {SH(1)}, P, P},
      {"sum_dim1", {SH(2)}, SH(1), SH(1)},
      {"mean_last", {SH(2)}, P, P},
      {"sum_keepdim_last", {SH(0)}, SH(0), SH(0)},
  };
#undef SH
  int shape[1] = {world};
  weft_mesh *mesh = oc_make_mesh(1, shape);
  if (!mesh) return;
  for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) {
    const oc_case *c = oc_find(ds[i].name);
    WCHECK(c != NULL, "no case %s", ds[i].name);
    if (!c) continue;
    weft_placement want = world == 2 ? ds[i].want2 : ds[i].want4;
    int nm = c->nout > 1 ? c->nout + 1 : 1;
    for (int m = 0; m < nm; m++) {
      weft_placement gpl[1] = {weft_replicate()};
      oc_against_replicate(c, mesh, ds[i].in, m == 0 ? NULL : gpl, m - 1, 77 + i, &want);
    }
  }
  weft_mesh_destroy(mesh);
}

static const weft_worker_case cases[] = {
    {"random", case_random},
    {"directed", case_directed},
    {0},
};

int main(int argc, char **argv) { return weft_worker_main(argc, argv, cases); }
