/* dtensor/dtensor_internal.h — shared between the dtensor sources only. */
#ifndef WEFT_DTENSOR_INTERNAL_H
#define WEFT_DTENSOR_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "dtensor.h"
#include "backend.h"

struct weft_dtensor {
  weft_mesh *mesh;        /* retained */
  weft_dtensor_spec spec; /* normalised */
  weft_tensor *local;
  bool owns_local; /* destroy `local` with the DTensor */
};

/* ------------------------------------------------------------ run lists */

/* An ordered list of runs of global indices along one tensor dim: the local
 * index order is the concatenation of the runs. Heap storage. */
typedef struct dt_runs {
  int n;
  int cap;
  weft_range *r;
} dt_runs;

void dt_runs_free(dt_runs *l);
weft_status dt_runs_push(dt_runs *l, int64_t start, int64_t len); /* merges with the last run */
int64_t dt_runs_total(const dt_runs *l);
bool dt_runs_equal(const dt_runs *a, const dt_runs *b);

/* The holding of `coords` along `dim` under `spec`. out is reset first. */
weft_status dt_holding(const weft_dtensor_spec *spec, const int *coords, int dim, dt_runs *out);

/* A box = one run list per tensor dim. */
typedef struct dt_box {
  int ndim;
  dt_runs d[WEFT_MAX_DIMS];
} dt_box;
void dt_box_free(dt_box *b);
weft_status dt_box_of(const weft_dtensor_spec *spec, const int *coords, dt_box *out);
int64_t dt_box_numel(const dt_box *b);

/* One piece of the intersection of two run lists A and B along a dim:
 * global indices [g, g+len) sit at local position pa in A and pb in B. */
typedef struct dt_seg {
  int64_t pa;
  int64_t pb;
  int64_t len;
} dt_seg;
typedef struct dt_segs {
  int n;
  int cap;
  dt_seg *s;
} dt_segs;
void dt_segs_free(dt_segs *s);
/* Intersection of A and B, listed in B's local order. */
weft_status dt_intersect(const dt_runs *a, const dt_runs *b, dt_segs *out);
/* Number of global indices in both A and B. */
int64_t dt_intersect_count(const dt_runs *a, const dt_runs *b);

/* ------------------------------------------------------------- copying */

/* The transfer of the elements of box A (held by a sender, local tensor
 * layout) that box B (receiver) needs: per dim the segments of A ∩ B in B
 * order. The packed form is a dense row-major tensor of shape
 * packed_shape (per dim sum of segment lengths). */
typedef struct dt_xfer {
  int ndim;
  dt_segs seg[WEFT_MAX_DIMS];
  int64_t packed_shape[WEFT_MAX_DIMS];
  int64_t numel;
} dt_xfer;
void dt_xfer_free(dt_xfer *x);
weft_status dt_xfer_make(const dt_box *a, const dt_box *b, dt_xfer *out);
/* A-side tensor -> packed buffer (host, element-aligned), and packed
 * buffer -> B-side tensor; each box by weft_tensor_copy_region, whose
 * errors they return (none for valid transfers of host tensors). */
weft_status dt_xfer_pack(const dt_xfer *x, const weft_tensor *a_local, void *packed);
weft_status dt_xfer_unpack(const dt_xfer *x, const void *packed, weft_tensor *b_local);
/* Direct A-local -> B-local copy of the intersection. */
weft_status dt_xfer_copy(const dt_xfer *x, const weft_tensor *a_local, weft_tensor *b_local);

/* ------------------------------------------------------------- planner */

typedef enum dt_step_kind {
  DT_STEP_LOCAL = 0,      /* R -> S/R: slice */
  DT_STEP_PARTITION,      /* R -> P: local transform */
  DT_STEP_ALL_GATHER,     /* S -> R */
  DT_STEP_ALL_TO_ALL,     /* S -> S */
  DT_STEP_ALL_REDUCE,     /* P -> R */
  DT_STEP_REDUCE_SCATTER, /* P -> S */
} dt_step_kind;

typedef struct dt_step {
  int mesh_dim;
  dt_step_kind kind;
  weft_placement from;
  weft_placement to;
} dt_step;

typedef struct dt_plan {
  int nsteps;
  dt_step steps[64];
  double cost;
} dt_plan;

/* Finds (or takes from the cache) the plan from src to dst placements.
 * Validates dst. *plan points into the cache (valid until cache clear). */
weft_status dt_plan_get(const weft_dtensor_spec *src, const weft_placement *dst, bool allow_partial,
                        dt_plan *plan);
/* The planner's cost estimate for src -> dst (0 when equal); fails like
 * dt_plan_get. */
weft_status dt_plan_cost(const weft_dtensor_spec *src, const weft_placement *dst,
                         bool allow_partial, double *cost);

/* Executes one redistribution on this rank: into a new DTensor (*out), or
 * into the local tensor `into` (of the target's local shape) when given. */
weft_status dt_redistribute_run(const weft_dtensor *dt, const weft_dtensor_spec *dst_spec,
                                const dt_plan *plan, weft_tensor *into, weft_dtensor **out);

/* ------------------------------------------------------ buffer cache */

/* Scratch buffers on `dev`: host ones through the opt-in cache (cache.c),
 * device ones straight from the device's caching allocator; put takes the
 * size the block was asked for (and frees device blocks). dt_tensor_new /
 * dt_tensor_release make and drop owning contiguous tensors the same way. */
weft_status dt_buf_get(weft_device dev, size_t bytes, void **out);
void dt_buf_put(void *p, size_t bytes);
weft_status dt_tensor_new(weft_device dev, weft_dtype dt, int ndim, const int64_t *shape,
                          weft_tensor **out);
void dt_tensor_release(weft_tensor *t);

/* ------------------------------------------------------------ helpers */

/* This rank's coordinates on the mesh (mesh_ndim entries). */
void dt_my_coords(const weft_mesh *mesh, int *coords);
/* Makes a DTensor around `local` (takes ownership when owns). Retains mesh. */
weft_status dt_wrap(weft_mesh *mesh, const weft_dtensor_spec *spec, weft_tensor *local, bool owns,
                    weft_dtensor **out);
/* Same mesh: same object, or same dims backed by the same communicators. */
bool dt_same_mesh(const weft_mesh *a, const weft_mesh *b);
/* Validates a placement list against a spec's mesh and ndim into a new spec
 * (same mesh shape/shape/dtype). */
weft_status dt_spec_with(const weft_dtensor_spec *base, const weft_placement *pl, int n,
                         weft_dtensor_spec *out);
bool dt_placements_equal(const weft_placement *a, const weft_placement *b, int n);
/* Linear mesh rank of coords (row-major). */
int dt_linear(const int *mesh_shape, int mesh_ndim, const int *coords);
void dt_unlinear(const int *mesh_shape, int mesh_ndim, int rank, int *coords);

#endif
