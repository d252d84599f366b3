/* tests/nn/ops_sharded.c — see ops_sharded.h. */
#include "ops_sharded.h"

#include <string.h>

#include "worker.h"

static void describe(const weft_placement *p, int n, char *buf, size_t cap) {
  weft_placements_describe(p, n, buf, cap);
}

/* Runs c with placements pl (and grad placements gpl) and compares with
 * the all-Replicate run on the same mesh. */
void oc_against_replicate(const oc_case *c, weft_mesh *mesh, const weft_placement *pl,
                          const weft_placement *gpl, int mode, uint64_t seed,
                          const weft_placement *expect) {
  int k = weft_mesh_ndim(mesh);
  oc_result ref, got;
  int f0 = oc_run(c, mesh, NULL, NULL, mode, seed, 1e-5, &ref);
  int f1 = oc_run(c, mesh, pl, gpl, mode, seed, 1e-5, &got);
  char ps[512] = "", gs[128] = "";
  for (int a = 0; a < c->nin; a++) {
    char one[128];
    describe(pl + a * k, k, one, sizeof one);
    strncat(ps, one, sizeof ps - strlen(ps) - 2);
    strncat(ps, " ", sizeof ps - strlen(ps) - 1);
  }
  if (gpl) describe(gpl, k, gs, sizeof gs);
  WCHECK(f0 == 0, "%s: the all-Replicate run failed %d checks", c->name, f0);
  WCHECK(f1 == 0, "%s: inputs %s grad %s mode %d: %d failed checks against the double reference",
         c->name, ps, gs, mode, f1);
  for (int j = 0; j < c->nout; j++) {
    if (!ref.out[j] || !got.out[j]) continue;
    double e = oc_maxrel(got.out[j], ref.out[j], oc_numel(c->ondim[j], c->oshape[j]));
    WCHECK(e <= 1e-5, "%s: inputs %s: output %d differs from 1 rank by %g", c->name, ps, j, e);
    if (expect) {
      char want[128], have[128];
      describe(expect, k, want, sizeof want);
      describe(got.opl[j], k, have, sizeof have);
      bool same = true;
      for (int i = 0; i < k; i++) same = same && weft_placement_equal(expect[i], got.opl[j][i]);
      WCHECK(same, "%s: inputs %s: output %d placements %s, expected %s", c->name, ps, j, have,
             want);
    }
  }
  for (int a = 0; a < c->nin; a++) {
    if (!ref.grad[a] || !got.grad[a]) continue;
    double e = oc_maxrel(got.grad[a], ref.grad[a], oc_numel(c->ndim[a], c->shape[a]));
    WCHECK(e <= 1e-5, "%s: inputs %s grad %s mode %d: grad %d differs from 1 rank by %g", c->name,
           ps, gs, mode, a, e);
  }
  oc_result_free(c, &ref);
  oc_result_free(c, &got);
}

weft_mesh *oc_make_mesh(int ndim, const int *shape) {
  const char *names[2] = {"dp", "tp"};
  weft_mesh *m = NULL;
  WOK(weft_mesh_create(ndim, shape, ndim == 1 ? names + 1 : names, &m));
  return weft_worker_mesh_on_device(m);
}
