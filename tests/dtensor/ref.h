/* tests/dtensor/ref.h — an independent reference for shard geometry and
 * local shards, written from the semantics in dtensor.h with explicit
 * arrays of global indices (no run lists), plus a seeded RNG and random
 * spec generators shared by the dtensor tests. */
#ifndef WEFT_TEST_DTENSOR_REF_H
#define WEFT_TEST_DTENSOR_REF_H

#include <stdbool.h>
#include <stdint.h>

#include "dtensor.h"

/* xorshift64*: the same sequence on every rank for the same seed. */
typedef struct ref_rng {
  uint64_t s;
} ref_rng;
void ref_rng_seed(ref_rng *r, uint64_t seed);
uint64_t ref_rng_next(ref_rng *r);
int ref_rng_int(ref_rng *r, int lo, int hi); /* uniform in [lo, hi] */

/* Global indices along `dim` held at `coords`, in local order. Returns a
 * malloc'd array (free it) of *n entries (may be 0, then non-NULL). */
int64_t *ref_indices(const weft_dtensor_spec *s, const int *coords, int dim, int64_t *n);

/* The local shard `coords` should hold: gathered from the full tensor x
 * (any dtype; bytes copied), new contiguous tensor. */
weft_tensor *ref_local(const weft_dtensor_spec *s, const int *coords, const weft_tensor *x);

/* Random placements for a mesh (no Partial): R, S(d) (negative dims
 * sometimes), strided shards (often the FSDP-over-TP pattern). */
void ref_random_placements(ref_rng *r, int mesh_ndim, const int *mesh_shape, int ndim,
                           weft_placement *out);

/* Fills x with seeded random bytes (bitwise tests: any dtype). */
void ref_fill_bytes(weft_tensor *x, uint64_t seed);

/* "mesh 2x2 f32[3, 0, 5] (S(0), SS(1,2)) -> (R, S(-1))" style description. */
void ref_case_describe(const weft_dtensor_spec *a, const weft_placement *b, char *buf,
                       unsigned cap);

#endif
