/* tests/nn/ops_check.h — checking autograd ops (nn/autograd.h) against
 * double references: forward values and input grads (the backward of
 * sum(out * R) against central finite differences of a double reference).
 * Shared by test_ops_shape.c (1-rank mesh, in process) and
 * ops_shape_worker.c (random placements on 2 and 4 ranks). */
#ifndef WEFT_TEST_OPS_CHECK_H
#define WEFT_TEST_OPS_CHECK_H

#include <stdbool.h>
#include <stdint.h>

#include "autograd.h"

#define OC_MAX_IN 4
#define OC_MAX_OUT 8

typedef struct oc_case oc_case;
struct oc_case {
  const char *name;
  int nin;
  int ndim[OC_MAX_IN];
  int64_t shape[OC_MAX_IN][WEFT_MAX_DIMS];
  int nout;
  int ondim[OC_MAX_OUT];
  int64_t oshape[OC_MAX_OUT][WEFT_MAX_DIMS];
  /* op arguments (meaning per op) */
  int iarg[8];
  int64_t sizes[OC_MAX_OUT];
  double farg;
  /* the finite-difference step of the grad check (0: 1/64, exact for the
   * ops that are linear in each input; smooth non-linear ops take a small
   * step, e.g. 1e-4: the error is O(h^2)) */
  double fd_h;
  /* the double reference: out[j] from in[a] (row-major) */
  void (*ref)(const oc_case *c, double *const *in, double *const *out);
  /* the op on vars */
  weft_status (*run)(const oc_case *c, weft_var *const *in, weft_var **out);
};

/* What a run produced (full tensors, row-major floats), for comparing runs. */
typedef struct oc_result {
  float *out[OC_MAX_OUT];
  float *grad[OC_MAX_IN];
  weft_placement opl[OC_MAX_OUT][WEFT_MESH_MAX_DIMS]; /* output placements */
} oc_result;

/* The op cases (a table ending with name == NULL). */
extern const oc_case oc_cases[];
const oc_case *oc_find(const char *name);

/* Runs case c on mesh with input placements pl (nin * mesh_ndim entries,
 * input a's at pl + a * k; NULL: all Replicate; Partial allowed) and the
 * output grad placements gpl (k entries; NULL: Replicate). mode -1: one
 * backward of sum_j (j+1) * sum(out_j * R_j) (several outputs, a split's,
 * are combined by scale and cat along the split dim iarg[0]); mode j >= 0: backward from output j
 * alone (the others get no grad). Checks forward values and input grads
 * against the double reference (relative tolerance tol) and reports
 * mismatches on stderr. res (may be NULL) receives the results (free with
 * oc_result_free). Returns the number of failed checks (every rank runs
 * the same collectives regardless). Outputs of mode -1 are combined by
 * cat along iarg[0], so they must agree on the other dims. Collective
 * over the mesh. */
int oc_run(const oc_case *c, weft_mesh *mesh, const weft_placement *pl, const weft_placement *gpl,
           int mode, uint64_t seed, double tol, oc_result *res);
void oc_result_free(const oc_case *c, oc_result *r);
/* Random input placements for case c on a k-dim mesh (nin * k entries):
 * Replicate, Partial(sum), Shard and StridedShard of any dim; the fused
 * q|k|v layout StridedShard(last, 3) often for split_qkv. */
void oc_random_placements(const oc_case *c, int k, uint64_t *state, weft_placement *pl);
/* Random output grad placements (Replicate, Partial(sum) or a Shard). */
void oc_random_grad_placements(int ndim, int k, uint64_t *state, weft_placement *pl);
/* The in-process suites' mesh (test_ops_shape, test_ops_bf16): weft_init
 * (MPI as a singleton), then a 1-rank mesh "tp", on WEFT_CUDA when
 * on_device. */
weft_status oc_one_rank_mesh(bool on_device, weft_mesh **out);
/* The full value of d as doubles (any float dtype, any device); *out is
 * malloc'ed (the caller frees), *n its length. Collective over d's mesh. */
weft_status oc_full_values(const weft_dtensor *d, double **out, int64_t *n);
/* Max of |a - b| / (1 + |b|) over n elements. */
double oc_maxrel(const float *a, const float *b, int64_t n);
int64_t oc_numel(int ndim, const int64_t *shape);

#endif
