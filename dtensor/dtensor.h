/* weft/dtensor.h — distributed tensors: placements, shard geometry,
 * redistribution and sharding propagation over a weft_mesh.
 *
 * A tour (SPMD: every rank of the mesh runs this):
 *
 *     // mesh (dp=2, tp=2); x is a full f32[8, 6] tensor on mesh rank 0
 *     weft_placement pl[2] = {weft_shard(0), weft_shard(1)};
 *     weft_dtensor *dx;
 *     weft_dtensor_distribute(mesh, x, 0, pl, 2, &dx);     // scatter from mesh rank 0
 *     weft_tensor *mine = weft_dtensor_local(dx);            // f32[4, 3] on every rank
 *     weft_placement rs[2] = {weft_replicate(), weft_shard(1)};
 *     weft_dtensor *dy;
 *     weft_dtensor_redistribute(dx, rs, 2, &dy);             // all-gather over dp
 *     weft_tensor *full;
 *     weft_dtensor_full_tensor(dy, &full);                   // f32[8, 6] everywhere
 *     weft_dtensor_visualize(dx, stdout);                    // who holds what
 *     weft_tensor_destroy(full); weft_dtensor_destroy(dy); weft_dtensor_destroy(dx);
 *
 * Semantics follow torch.distributed.tensor (DTensor):
 * - One placement per mesh dim. Replicate: every rank of that mesh dim holds
 *   the same values. Shard(d): tensor dim d is split over that mesh dim with
 *   torch.chunk semantics (chunk size ceil(n/k), trailing chunks smaller or
 *   empty; zero-size local shards are legal). Partial(op): every rank holds a
 *   partial value; the DTensor's value is the reduction (sum, avg, max, min)
 *   over that mesh dim. Negative shard dims count from the end and are
 *   normalised when a spec is built.
 * - Placements nest left to right: for (Shard(0), Shard(0)) on mesh (dp, tp)
 *   dim 0 is split into dp chunks, then each of those into tp chunks.
 * - Strided shard (PyTorch's _StridedShard(dim, split_factor)) records the
 *   right-to-left layout that FSDP produces on top of TP. On mesh dim i of
 *   size m, with coordinate c, applied to the index list L the rank holds
 *   along `dim` so far: L is split into split_factor virtual blocks
 *   V_0..V_{sf-1}, and the rank keeps chunk(V_j, m)[c] of every block, in
 *   block order (so the local rows need not be one contiguous range). Later
 *   plain Shard(dim) placements then pick whole blocks when the number of
 *   blocks held is a multiple of their mesh dim size (block range
 *   [c'*B/m', (c'+1)*B/m')), else they chunk the concatenated list.
 *   The virtual split is torch.chunk(L, sf), except that when the later plain
 *   Shard(dim) mesh dims have sizes m_1, m_2, ... whose leading product A
 *   divides sf, it is the nested chunk by m_1, then m_2, ..., then by sf/A,
 *   so that (StridedShard(0, tp), Shard(0)) on (dp, tp) is exactly
 *   chunk(chunk(x, tp)[tp_coord], dp)[dp_coord] — FSDP's split of a TP shard —
 *   also for uneven sizes. For evenly divisible sizes this is exactly
 *   PyTorch's _StridedShard._split_tensor. StridedShard(d, 1) is Shard(d).
 * - Partial as a redistribute target is only allowed where the source has the
 *   same Partial on that mesh dim (as DTensor.redistribute); the _ex variant
 *   allows Replicate -> Partial for internal use. Replicate -> Partial(sum)
 *   divides by the mesh dim size on floating dtypes, as PyTorch's
 *   Partial._partition_value does (tensor / num_chunks); on integer dtypes,
 *   where division is not exact, coordinate 0 keeps the value and the other
 *   coordinates hold 0. Replicate -> Partial(avg|max|min) keeps the value on
 *   every rank (exact). One placement list may not mix different Partial ops.
 *
 * Ownership: a weft_dtensor owns its local tensor unless made by
 * weft_dtensor_from_local with WEFT_LOCAL_VIEW; it retains its mesh
 * (weft_mesh_retain), so weft_mesh_destroy returns WEFT_ERR_BUSY while
 * DTensors on it exist. weft_dtensor_destroy(NULL) is a no-op.
 *
 * Collectives: functions marked "collective" must be called by every rank of
 * the DTensor's mesh with the same arguments (placements, shapes, dtype), in
 * the same order as other collectives on that mesh. Argument errors that can
 * be detected from the arguments alone are reported on every rank without
 * communicating, so bad input never hangs.
 */
#ifndef WEFT_DTENSOR_H
#define WEFT_DTENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kernels.h"
#include "mesh.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------- placements */

typedef enum weft_placement_kind {
  WEFT_PLACE_REPLICATE = 0,
  WEFT_PLACE_SHARD = 1,
  WEFT_PLACE_STRIDED_SHARD = 2,
  WEFT_PLACE_PARTIAL = 3,
} weft_placement_kind;

/* One mesh dim's placement. A plain value type; build with the helpers. */
typedef struct weft_placement {
  weft_placement_kind kind;
  int dim;           /* shard / strided shard: tensor dim (negative until normalised) */
  int split_factor;  /* strided shard: number of virtual blocks (>= 1); else 1 */
  weft_reduce_op op; /* partial: the pending reduction; else WEFT_OP_SUM */
} weft_placement;

static inline weft_placement weft_replicate(void) {
  weft_placement p = {WEFT_PLACE_REPLICATE, 0, 1, WEFT_OP_SUM};
  return p;
}
static inline weft_placement weft_shard(int dim) {
  weft_placement p = {WEFT_PLACE_SHARD, dim, 1, WEFT_OP_SUM};
  return p;
}
static inline weft_placement weft_strided_shard(int dim, int split_factor) {
  weft_placement p = {WEFT_PLACE_STRIDED_SHARD, dim, split_factor, WEFT_OP_SUM};
  return p;
}
static inline weft_placement weft_partial(weft_reduce_op op) {
  weft_placement p = {WEFT_PLACE_PARTIAL, 0, 1, op};
  return p;
}

/* true for Shard and StridedShard. */
WEFT_API bool weft_placement_is_shard(weft_placement p);
/* Same kind and the fields that kind uses (dim, split_factor, op). */
WEFT_API bool weft_placement_equal(weft_placement a, weft_placement b);
/* "R", "S(0)", "SS(0,2)", "P(sum)" into buf (always NUL-terminated). */
WEFT_API void weft_placement_describe(weft_placement p, char *buf, size_t cap);
/* "(S(0), R)" for a list. */
WEFT_API void weft_placements_describe(const weft_placement *p, int n, char *buf, size_t cap);
/* Parses a comma-separated list in the describe format ("S(0),R", "SS(0,2), S(0)",
 * "P(avg)"; "Shard(0)", "Replicate()", "Partial(sum)" also accepted) into
 * out[0..*n). WEFT_ERR_INVALID naming the bad token otherwise. */
WEFT_API weft_status weft_placements_parse(const char *text, weft_placement *out, int cap, int *n);

/* ---------------------------------------------------------- layout (spec) */

/* Everything that fixes where each element lives, without the data: the mesh
 * shape, one placement per mesh dim (normalised), the global shape and dtype.
 * A plain value; DCP and FSDP store and compare these. */
typedef struct weft_dtensor_spec {
  int mesh_ndim;
  int mesh_shape[WEFT_MESH_MAX_DIMS];
  weft_placement placements[WEFT_MESH_MAX_DIMS];
  int ndim;
  int64_t shape[WEFT_MAX_DIMS];
  weft_dtype dtype;
} weft_dtensor_spec;

/* Builds and validates a spec: mesh_ndim 1..8 sizes >= 1, nplacements ==
 * mesh_ndim, shard dims in [-ndim, ndim) (normalised to >= 0), split_factor
 * >= 1 (StridedShard(d, 1) becomes Shard(d)), valid reduce ops, no mix of
 * different Partial ops, shape entries >= 0. Errors name the offending
 * placement. No communication. */
WEFT_API weft_status weft_dtensor_spec_init(weft_dtensor_spec *spec, int mesh_ndim,
                                            const int *mesh_shape, const weft_placement *placements,
                                            int nplacements, weft_dtype dtype, int ndim,
                                            const int64_t *shape);
/* Same with the mesh shape taken from a mesh. */
WEFT_API weft_status weft_dtensor_spec_init_mesh(weft_dtensor_spec *spec, const weft_mesh *mesh,
                                                 const weft_placement *placements, int nplacements,
                                                 weft_dtype dtype, int ndim, const int64_t *shape);
/* Same mesh shape, placements, shape and dtype. */
WEFT_API bool weft_dtensor_spec_equal(const weft_dtensor_spec *a, const weft_dtensor_spec *b);
/* "f32[8, 6] (S(0), R) on mesh 2x2" */
WEFT_API void weft_dtensor_spec_describe(const weft_dtensor_spec *spec, char *buf, size_t cap);

/* ---------------------------------------------------------- shard geometry */

/* Pure functions of a spec and mesh coordinates (mesh_ndim entries; NULL is
 * not allowed here — use the weft_dtensor_ variants for "this rank"). No
 * communication; any rank may ask about any other rank (DCP, FSDP). */

/* A run of global indices [start, start+len) along one tensor dim. */
typedef struct weft_range {
  int64_t start;
  int64_t len;
} weft_range;

/* Local shape and global offset of the shard held at `coords`. For each dim
 * the offset is the global index of the first local element along it; for a
 * zero-size local dim it is the global size of that dim (out of bounds, as
 * PyTorch's compute_local_shape_and_global_offset does for empty shards).
 * With strided shards the local piece may not be one contiguous range:
 * `contiguous` (may be NULL) is set false then, and the ranges come from
 * weft_dtensor_spec_ranges. */
WEFT_API weft_status weft_dtensor_spec_local_shape(const weft_dtensor_spec *spec, const int *coords,
                                                   int64_t *local_shape, int64_t *global_offset,
                                                   bool *contiguous);
/* The runs of global indices the shard at `coords` holds along `dim`, in
 * local order (local index 0 is ranges[0].start, ...; adjacent runs merged,
 * empty runs omitted). Writes min(cap, count) runs; *count is the total (0
 * for an empty local dim). */
WEFT_API weft_status weft_dtensor_spec_ranges(const weft_dtensor_spec *spec, const int *coords,
                                              int dim, weft_range *ranges, int cap, int *count);

/* A box of a global tensor: indices [off[d], off[d] + size[d]) along each
 * dim d < ndim (ndim travels alongside). Pure local helpers on it: */
typedef struct weft_box {
  int64_t off[WEFT_MAX_DIMS];
  int64_t size[WEFT_MAX_DIMS];
} weft_box;
/* Number of elements (product of the ndim sizes; 1 for ndim 0). */
WEFT_API int64_t weft_box_volume(const weft_box *b, int ndim);
/* Same offsets and sizes in the first ndim dims. */
WEFT_API bool weft_box_equal(const weft_box *a, const weft_box *b, int ndim);
/* The intersection of a and b into *out (out may be NULL); false, and out
 * untouched, when it is empty. */
WEFT_API bool weft_box_intersect(const weft_box *a, const weft_box *b, int ndim, weft_box *out);

/* One rectangular piece of a shard: the global box it covers and where it
 * starts in the local tensor (local_start[d], local indices). A shard is the
 * product of its runs (weft_dtensor_spec_ranges) along every dim, so it is
 * one box for Shard/Replicate placements and several with strided shards. */
typedef struct weft_local_box {
  weft_box global;
  int64_t local_start[WEFT_MAX_DIMS];
} weft_local_box;
/* The pieces of the shard held at `coords` — PyTorch's
 * compute_local_shape_and_global_offset generalised to strided shards —
 * in row-major order of the runs (local_start increasing). Empty pieces are
 * left out: an empty shard gives *n = 0 and *out = NULL; a 0-d tensor one
 * piece. *out is malloc'ed, the caller frees it with free(). Local (no
 * communication); DCP uses it to name what each rank saves and loads.
 * Errors: WEFT_ERR_INVALID for NULL arguments or coords off the mesh;
 * WEFT_ERR_OOM. */
WEFT_API weft_status weft_dtensor_spec_local_boxes(const weft_dtensor_spec *spec, const int *coords,
                                                   weft_local_box **out, int64_t *n);

/* ----------------------------------------------------------------- dtensor */

typedef struct weft_dtensor weft_dtensor;

/* A mesh rank that holds the source data for distribute, or every rank. */
#define WEFT_DTENSOR_ALL_RANKS (-1)

/* A DTensor with uninitialised (empty) or zero-filled (zeros) local storage
 * of the right local shape on each rank. Partial placements are allowed
 * (e.g. gradient accumulators). Not collective (no communication), but
 * every rank should build the same spec. */
WEFT_API weft_status weft_dtensor_empty(weft_mesh *mesh, weft_dtype dtype, int ndim,
                                        const int64_t *shape, const weft_placement *placements,
                                        int nplacements, weft_dtensor **out);
WEFT_API weft_status weft_dtensor_zeros(weft_mesh *mesh, weft_dtype dtype, int ndim,
                                        const int64_t *shape, const weft_placement *placements,
                                        int nplacements, weft_dtensor **out);
/* weft_dtensor_zeros with this rank's local on dev: the mesh's device, or
 * the CPU for an offloaded DTensor (see weft_dtensor_from_local); another
 * device is WEFT_ERR_INVALID. Local, no communication. */
WEFT_API weft_status weft_dtensor_zeros_on(weft_mesh *mesh, weft_device dev, weft_dtype dtype,
                                           int ndim, const int64_t *shape,
                                           const weft_placement *placements, int nplacements,
                                           weft_dtensor **out);
/* torch.zeros_like: a zero-filled DTensor of dtype with t's mesh, global
 * shape and placements, its local on the device of t's local (so an
 * offloaded t gives an offloaded result: optimizer state next to its
 * parameter). Local, no communication. */
WEFT_API weft_status weft_dtensor_zeros_like(const weft_dtensor *t, weft_dtype dtype,
                                             weft_dtensor **out);

/* Collective. Distributes a full tensor (torch.distributed.tensor.
 * distribute_tensor): with src_rank a mesh rank (weft_mesh_rank numbering),
 * `full` is read on that rank only and the data moves along each mesh dim
 * in turn (scatter for Shard, broadcast for Replicate), so every rank
 * receives exactly its shard; other ranks may pass full = NULL (shape and
 * dtype then come from the source) or a tensor whose shape and dtype must
 * match the source's (checked; a mismatch is WEFT_ERR_MISMATCH on every
 * rank). With src_rank = WEFT_DTENSOR_ALL_RANKS every rank passes the same
 * full tensor and takes its slice locally, with no communication. Partial
 * placements are rejected (WEFT_ERR_INVALID), as distribute_tensor does.
 * `full` may have any strides; the result owns a contiguous local tensor. */
WEFT_API weft_status weft_dtensor_distribute(weft_mesh *mesh, const weft_tensor *full, int src_rank,
                                             const weft_placement *placements, int nplacements,
                                             weft_dtensor **out);

/* What from_local does with the local tensor. */
typedef enum weft_local_ownership {
  WEFT_LOCAL_COPY = 0, /* the DTensor gets its own contiguous copy; caller keeps `local` */
  WEFT_LOCAL_TAKE = 1, /* the DTensor takes `local` and destroys it (only on success) */
  WEFT_LOCAL_VIEW = 2, /* the DTensor refers to `local` without owning it; the caller
                          keeps it alive (and unmoved) until the DTensor is destroyed */
} weft_local_ownership;

/* DTensor.from_local: wraps this rank's local shard. global_shape (local->ndim
 * entries) gives the global shape, needed for uneven shards; NULL derives it
 * as PyTorch does for even shards: local size times the sizes of the mesh
 * dims that shard that dim. Every rank checks its own local shape against
 * the geometry of the spec (WEFT_ERR_INVALID naming dim and sizes). Under
 * WEFT_DEBUG=1 (weft_get_settings()->debug) it is collective: the ranks also
 * exchange their specs and local shapes (weft_dtensor_check), so a rank whose
 * shape, placements or dtype disagree is named on every rank: WEFT_ERR_MISMATCH
 * on the others, its own error code on a rank whose arguments were bad.
 * Without debug it does not communicate. The local lives on the mesh's
 * device, or on the CPU: a host local on a device mesh is an offloaded
 * DTensor (as a CPU tensor on a "cuda" DeviceMesh in PyTorch, FSDP's
 * CPUOffloadPolicy), whose redistributions and ops stay in host memory;
 * a local on another device is WEFT_ERR_INVALID. */
WEFT_API weft_status weft_dtensor_from_local(weft_mesh *mesh, weft_tensor *local,
                                             weft_local_ownership own,
                                             const weft_placement *placements, int nplacements,
                                             const int64_t *global_shape, weft_dtensor **out);

/* torch's view on a DTensor: a DTensor of global `shape` (ndim dims) and
 * `placements` (one per mesh dim) over x's local storage, which must hold
 * exactly as many elements as this rank's shard of the new spec has
 * (WEFT_ERR_INVALID naming both specs otherwise); they are read in order,
 * so the new placements must be ones under which the local elements keep
 * their order (as reshape's sharding rules choose). A strided local works
 * where torch's view would (weft_tensor_view_strides), else
 * WEFT_ERR_INVALID. The result does not own the storage: x (or whoever
 * owns x's storage) must outlive it; destroying it leaves x as it was.
 * Local, no communication, also under WEFT_DEBUG (the caller applies the
 * same view on every rank). nn's reshape uses it for graph buffers. */
WEFT_API weft_status weft_dtensor_view(const weft_dtensor *x, int ndim, const int64_t *shape,
                                       const weft_placement *placements, weft_dtensor **out);
/* torch's as_strided on the local shard: a DTensor of global `shape` and
 * `placements` whose local tensor (this rank's shard shape of that spec)
 * starts `offset` elements into x's local storage with `strides` (in
 * elements, >= 0). Every element it addresses must lie within the span of
 * x's local elements (WEFT_ERR_INVALID naming the span otherwise; a
 * local shape of no elements takes any offset and starts where x's
 * local does); which
 * elements and placements make sense is the caller's to choose (nn's
 * split hands out column slices of its input so). Ownership as
 * weft_dtensor_view; local, no communication. */
WEFT_API weft_status weft_dtensor_as_strided(const weft_dtensor *x, int ndim, const int64_t *shape,
                                             const weft_placement *placements, int64_t offset,
                                             const int64_t *strides, weft_dtensor **out);

/* Collective. Checks that every rank of the mesh has the same spec and a
 * local tensor of the shape the geometry gives it. WEFT_ERR_MISMATCH on
 * every rank (naming the first rank that differs and how) otherwise. */
WEFT_API weft_status weft_dtensor_check(const weft_dtensor *dt);

/* Releases the local tensor (if owned) and the mesh reference. NULL: no-op. */
WEFT_API void weft_dtensor_destroy(weft_dtensor *dt);

/* This rank's local shard, owned by the DTensor: its elements may be
 * written, it must not be destroyed or outlive the DTensor. */
WEFT_API weft_tensor *weft_dtensor_local(const weft_dtensor *dt);
/* A new owning contiguous copy of the local shard (DTensor.to_local()). */
WEFT_API weft_status weft_dtensor_to_local(const weft_dtensor *dt, weft_tensor **out);
/* Collective. The full global tensor on every rank (DTensor.full_tensor():
 * redistribute to all-Replicate, reducing Partial dims). New owning tensor. */
WEFT_API weft_status weft_dtensor_full_tensor(const weft_dtensor *dt, weft_tensor **out);

WEFT_API weft_mesh *weft_dtensor_mesh(const weft_dtensor *dt);
WEFT_API const weft_dtensor_spec *weft_dtensor_get_spec(const weft_dtensor *dt);
WEFT_API const weft_placement *weft_dtensor_placements(
    const weft_dtensor *dt); /* mesh_ndim entries */
WEFT_API int weft_dtensor_ndim(const weft_dtensor *dt);
WEFT_API const int64_t *weft_dtensor_shape(const weft_dtensor *dt); /* global shape */
WEFT_API weft_dtype weft_dtensor_dtype(const weft_dtensor *dt);
/* This rank's global offset (see weft_dtensor_spec_local_shape); returns
 * whether the local piece is one contiguous box. */
WEFT_API bool weft_dtensor_local_offset(const weft_dtensor *dt, int64_t *global_offset);
/* This rank's runs along dim (see weft_dtensor_spec_ranges). */
WEFT_API weft_status weft_dtensor_ranges(const weft_dtensor *dt, int dim, weft_range *ranges,
                                         int cap, int *count);
/* This rank's pieces (see weft_dtensor_spec_local_boxes; local). */
WEFT_API weft_status weft_dtensor_local_boxes(const weft_dtensor *dt, weft_local_box **out,
                                              int64_t *n);
/* "f32[8, 6] (S(0), R) on mesh (dp=2, tp=2), local f32[4, 6] at [0, 0]" */
WEFT_API void weft_dtensor_describe(const weft_dtensor *dt, char *buf, size_t cap);

/* Fills the local shard so that every element gets the value
 * weft_tensor_fill_normal/_uniform would give it in the full tensor: the
 * values depend only on (seed, key, global index), never on the mesh or the
 * placements. Float dtypes. No communication. A Partial DTensor is filled on
 * every rank the same (each holds the full value). */
WEFT_API weft_status weft_dtensor_fill_normal(weft_dtensor *dt, uint64_t seed, uint64_t key,
                                              float mean, float std);
WEFT_API weft_status weft_dtensor_fill_uniform(weft_dtensor *dt, uint64_t seed, uint64_t key,
                                               float lo, float hi);
/* As weft_dtensor_fill_uniform when dt holds rows [row0, row0 + shape[0])
 * (dim 0) of a larger tensor of total_rows rows that is not a DTensor
 * (data parallel: each dp group's batch slice): every element gets the
 * value it has in that larger tensor, so masks drawn by dp groups on their
 * slices equal the one-rank masks. WEFT_ERR_INVALID when the rows do not lie
 * in [0, total_rows) or dt is 0-d. No communication. */
WEFT_API weft_status weft_dtensor_fill_uniform_rows(weft_dtensor *dt, uint64_t seed, uint64_t key,
                                                    float lo, float hi, int64_t row0,
                                                    int64_t total_rows);

/* ------------------------------------------------------------ redistribute */

/* Collective. A new DTensor with the same global value on the same mesh and
 * the given placements (DTensor.redistribute). The input is unchanged.
 * Every pair of placement lists is supported; multi-dim moves are planned as
 * a sequence of single-mesh-dim steps, each one collective over one mesh dim:
 *   Shard -> Replicate       all-gather (exact counts for uneven shards)
 *   Shard(a) -> Shard(b)     all-to-all (local packing)
 *   Replicate -> Shard       local slice, no communication
 *   Partial -> Replicate     all-reduce
 *   Partial -> Shard         reduce-scatter (padded for uneven shards)
 *   Replicate -> Partial     local (only through the _ex variant)
 * The planner searches the sequence that moves the fewest bytes (a
 * single-dim move is the one collective above, with the minimal bytes), and
 * only takes a step when the shard geometry shows it is exact, so nested
 * shardings ((S0,S0) -> (R,S0) replicates the inner dim first) and strided
 * shards come out right. Plans are cached per (mesh shape, source, target,
 * shape, element size). Errors: wrong number of placements, a shard dim out
 * of range, Partial as a target where the source does not already have the
 * same Partial (WEFT_ERR_INVALID, every rank, no communication). */
WEFT_API weft_status weft_dtensor_redistribute(const weft_dtensor *dt,
                                               const weft_placement *placements, int nplacements,
                                               weft_dtensor **out);

/* Options for weft_dtensor_redistribute_ex; versioned so the ABI can grow. */
typedef struct weft_redistribute_opts {
  int version;        /* WEFT_REDISTRIBUTE_OPTS_VERSION */
  bool allow_partial; /* allow Replicate -> Partial targets (internal use: ops, backward) */
} weft_redistribute_opts;
#define WEFT_REDISTRIBUTE_OPTS_VERSION 1
#define WEFT_REDISTRIBUTE_OPTS_INIT \
  { WEFT_REDISTRIBUTE_OPTS_VERSION, false }

/* weft_dtensor_redistribute with options (opts NULL = defaults). */
WEFT_API weft_status weft_dtensor_redistribute_ex(const weft_dtensor *dt,
                                                  const weft_placement *placements, int nplacements,
                                                  const weft_redistribute_opts *opts,
                                                  weft_dtensor **out);

/* Collective. Like weft_dtensor_redistribute_ex, but writes the result into
 * an existing DTensor `out` — same mesh, global shape and dtype; its
 * placements are the target — instead of making a new one, so the result
 * needs no allocation (a multi-step plan still allocates its intermediate
 * steps). out's local tensor is overwritten and may be a VIEW (e.g. a flat
 * FSDP buffer); it must not overlap the input's. opts may be NULL. */
WEFT_API weft_status weft_dtensor_redistribute_into(const weft_dtensor *dt, weft_dtensor *out,
                                                    const weft_redistribute_opts *opts);

/* Opt-in cache of host buffers for DTensor results and redistribute
 * scratch, like PyTorch's caching allocator: up to max_bytes of blocks
 * (>= 64 KiB) freed by weft_dtensor_destroy or by a redistribute are kept
 * and reused by later ones, so a loop of same-size redistributes does not
 * pay first-touch page faults on every result (16384 faults for 64 MiB).
 * Off (0) by default: cached blocks stay allocated and counted by
 * weft_mem_get. Setting 0 frees what is held. Process-wide, thread-safe.
 * Host memory only: DTensors on a device mesh allocate through the
 * device's own caching allocator (weft_device_cache_stats), which reuses
 * blocks whether this is on or off. */
WEFT_API void weft_dtensor_set_buffer_cache(size_t max_bytes);

/* One step of a plan: mesh dim, placements before/after on that dim, and the
 * collective it uses (WEFT_COLL_KIND_COUNT for a local step). */
typedef struct weft_redistribute_step {
  int mesh_dim;
  weft_placement from;
  weft_placement to;
  weft_coll_kind coll;
} weft_redistribute_step;

/* The plan weft_dtensor_redistribute would run from `src` to the target
 * placements (same mesh shape, shape, dtype), without communicating. Writes
 * min(cap, count) steps, *nsteps = count; *cost (may be NULL) = the planner's
 * estimate of bytes sent per rank. allow_partial as in the options. */
WEFT_API weft_status weft_redistribute_plan(const weft_dtensor_spec *src,
                                            const weft_placement *placements, int nplacements,
                                            bool allow_partial, weft_redistribute_step *steps,
                                            int cap, int *nsteps, double *cost);

/* Plan cache counters (process-wide) and reset (tests). */
typedef struct weft_plan_cache_stats {
  int64_t hits;
  int64_t misses;
  int64_t entries;
} weft_plan_cache_stats;
WEFT_API weft_plan_cache_stats weft_redistribute_plan_cache_stats(void);
WEFT_API void weft_redistribute_plan_cache_clear(void);

/* ---------------------------------------------------- sharding propagation */

/* DTensor ops with PyTorch's sharding rules. Each picks, per mesh dim, a
 * strategy that its inputs' placements satisfy; when none does it
 * redistributes the inputs to the strategy whose redistribution moves the
 * fewest bytes (planner estimate; ties go to the strategy listed first),
 * then computes locally. All collective (every rank calls), inputs on the
 * same mesh (WEFT_ERR_INVALID otherwise), same dtype; results are new
 * DTensors owning their local tensors. */

/* a @ b. a: (..., M, K) with ndim >= 2 (leading dims are batch dims), b:
 * (K, N). Per mesh dim (a, b -> out):
 *   S(i), R      -> S(i)     i a batch or row dim of a (row shard of the left input)
 *   R, S(1)      -> S(last)  column shard of the right input
 *   S(last), S(0)-> P(sum)   contracting dim sharded on both
 *   R, R         -> R
 *   P(sum|avg), R -> P(op);  R, P(sum|avg) -> P(op)
 * f32, f64, bf16 (weft_gemm). */
WEFT_API weft_status weft_dtensor_matmul(const weft_dtensor *a, const weft_dtensor *b,
                                         weft_dtensor **out);
/* x @ w^T (nn.Linear without bias). x: (..., K), w: (N, K) as Linear.weight.
 * Same rules with w's out-features dim 0 as the column dim (colwise:
 * w S(0) -> out S(last)) and w's dim 1 as the contracting dim (rowwise:
 * x S(last), w S(1) -> P(sum)). */
WEFT_API weft_status weft_dtensor_linear(const weft_dtensor *x, const weft_dtensor *w,
                                         weft_dtensor **out);
/* Elementwise on same-shape float DTensors. add: matching placements; P(op)+P(op)
 * -> P(op) for sum and avg. mul: matching placements; P(sum|avg) * R -> P. */
WEFT_API weft_status weft_dtensor_add(const weft_dtensor *a, const weft_dtensor *b,
                                      weft_dtensor **out);
WEFT_API weft_status weft_dtensor_mul(const weft_dtensor *a, const weft_dtensor *b,
                                      weft_dtensor **out);
/* Sum / mean over `dim` (negative counts from the end). A shard of `dim`
 * becomes P(sum) (mean: local sum times 1/n of the global size, exact for
 * uneven shards, where PyTorch uses P(avg) of local means); shards of other
 * dims stay (renumbered when keepdim is false); P(sum|avg) stays; P(max|min)
 * inputs are reduced first. */
WEFT_API weft_status weft_dtensor_sum(const weft_dtensor *x, int dim, bool keepdim,
                                      weft_dtensor **out);
WEFT_API weft_status weft_dtensor_mean(const weft_dtensor *x, int dim, bool keepdim,
                                       weft_dtensor **out);

/* A sharding strategy of one mesh dim for an op of up to
 * WEFT_SHARDING_MAX_INPUTS inputs: the placement each input must have and
 * the placement of the outputs (all outputs share it). */
#define WEFT_SHARDING_MAX_INPUTS 4
typedef struct weft_sharding_option {
  weft_placement in[WEFT_SHARDING_MAX_INPUTS];
  weft_placement out;
} weft_sharding_option;

/* Picks one option per mesh dim for inputs with specs in[0..nin) (an entry
 * may be NULL: an input that is never redistributed, e.g. integer ids;
 * its option placements are ignored): the combination the inputs already
 * satisfy costs nothing, otherwise the one whose redistributions move the
 * fewest bytes per rank (the planner's estimate), ties to the options
 * listed first; combinations whose outputs mix Partial ops are skipped.
 * opts[i * cap + j] is option j of mesh dim i (nopt[i] of them, >= 1).
 * allow_partial: Replicate -> Partial targets are allowed (free: one rank
 * keeps the value). Writes the inputs' targets (targets[k * mesh_ndim + i]
 * for input k, mesh dim i) and the outputs' placements. WEFT_ERR_UNSUPPORTED
 * when no combination can be reached. Local (no communication). */
WEFT_API weft_status weft_sharding_choose(const weft_dtensor_spec *const *in, int nin,
                                          int mesh_ndim, const weft_sharding_option *opts, int cap,
                                          const int *nopt, bool allow_partial,
                                          weft_placement *targets, weft_placement *out_placements);

/* ------------------------------------------------------------ visualization */

/* Like torch's visualize_sharding: for a 1-D or 2-D tensor, a table of the
 * global index ranges (rows, and columns for 2-D) and the mesh ranks that
 * hold each one (replicas listed together; Partial dims noted in the
 * header). Pure geometry, no communication; any rank may call it. Writes to
 * `f` when non-NULL, else into buf (cap bytes, NUL-terminated; truncated
 * output still terminates). WEFT_ERR_UNSUPPORTED for other ranks of tensor. */
WEFT_API weft_status weft_dtensor_spec_visualize(const weft_dtensor_spec *spec, FILE *f, char *buf,
                                                 size_t cap);
WEFT_API weft_status weft_dtensor_visualize(const weft_dtensor *dt, FILE *f);
WEFT_API weft_status weft_dtensor_visualize_str(const weft_dtensor *dt, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_DTENSOR_H */
