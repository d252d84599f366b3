/* tests/dtensor/test_geometry.c — placements, specs, shard geometry,
 * planner and visualisation: pure functions, no MPI needed. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "ref.h"
#include "dtensor.h"

static weft_dtensor_spec mk(int k, const int *mesh, const weft_placement *pl, int nd,
                            const int64_t *shape) {
  weft_dtensor_spec s;
  weft_status st = weft_dtensor_spec_init(&s, k, mesh, pl, k, WEFT_F32, nd, shape);
  cr_assert_eq(st, WEFT_OK, "spec_init: %s", weft_last_error());
  return s;
}

/* ------------------------------------------------------------ placements */

Test(dtensor_geometry, placements_describe_and_parse_roundtrip) {
  weft_placement p[5] = {weft_replicate(), weft_shard(1), weft_strided_shard(0, 4),
                         weft_partial(WEFT_OP_AVG), weft_partial(WEFT_OP_MIN)};
  char buf[256];
  weft_placements_describe(p, 5, buf, sizeof buf);
  cr_assert_str_eq(buf, "(R, S(1), SS(0,4), P(avg), P(min))");
  weft_placement q[8];
  int n = 0;
  cr_assert_eq(weft_placements_parse(buf, q, 8, &n), WEFT_OK, "%s", weft_last_error());
  cr_assert_eq(n, 5);
  for (int i = 0; i < 5; i++) cr_assert(weft_placement_equal(p[i], q[i]), "placement %d", i);
  cr_assert_eq(weft_placements_parse("Shard(-1), Replicate(), _StridedShard(0, split_factor=2), "
                                     "Partial(max)",
                                     q, 8, &n),
               WEFT_OK, "%s", weft_last_error());
  cr_assert_eq(n, 4);
  cr_assert(weft_placement_equal(q[0], weft_shard(-1)));
  cr_assert(weft_placement_equal(q[2], weft_strided_shard(0, 2)));
  cr_assert(weft_placement_equal(q[3], weft_partial(WEFT_OP_MAX)));
  cr_assert_eq(weft_placements_parse("S(0), Q", q, 8, &n), WEFT_ERR_INVALID);
  cr_assert(strstr(weft_last_error(), "Q") != NULL, "%s", weft_last_error());
  cr_assert_eq(weft_placements_parse("S(0),S(1)", q, 1, &n), WEFT_ERR_INVALID);
}

Test(dtensor_geometry, spec_init_normalises_and_rejects_bad_placements) {
  int mesh[2] = {2, 3};
  int64_t shape[3] = {4, 5, 6};
  weft_placement pl[2] = {weft_shard(-1), weft_strided_shard(-3, 1)};
  weft_dtensor_spec s;
  cr_assert_eq(weft_dtensor_spec_init(&s, 2, mesh, pl, 2, WEFT_F32, 3, shape), WEFT_OK);
  cr_assert(weft_placement_equal(s.placements[0], weft_shard(2)));
  cr_assert(weft_placement_equal(s.placements[1], weft_shard(0)), "SS(d,1) is S(d)");
  /* shard dim out of range */
  pl[0] = weft_shard(3);
  cr_assert_eq(weft_dtensor_spec_init(&s, 2, mesh, pl, 2, WEFT_F32, 3, shape), WEFT_ERR_INVALID);
  cr_assert(strstr(weft_last_error(), "out of range"), "%s", weft_last_error());
  pl[0] = weft_shard(-4);
  cr_assert_eq(weft_dtensor_spec_init(&s, 2, mesh, pl, 2, WEFT_F32, 3, shape), WEFT_ERR_INVALID);
  /* wrong number of placements */
  pl[0] = weft_replicate();
  cr_assert_eq(weft_dtensor_spec_init(&s, 2, mesh, pl, 1, WEFT_F32, 3, shape), WEFT_ERR_INVALID);
  cr_assert(strstr(weft_last_error(), "one placement per mesh dim"), "%s", weft_last_error());
  /* split factor */
  pl[1] = weft_strided_shard(0, 0);
  cr_assert_eq(weft_dtensor_spec_init(&s, 2, mesh, pl, 2, WEFT_F32, 3, shape), WEFT_ERR_INVALID);
  /* mixed Partial ops */
  pl[0] = weft_partial(WEFT_OP_SUM);
  pl[1] = weft_partial(WEFT_OP_MAX);
  cr_assert_eq(weft_dtensor_spec_init(&s, 2, mesh, pl, 2, WEFT_F32, 3, shape),
               WEFT_ERR_UNSUPPORTED);
  /* bad op, negative shape */
  pl[1] = weft_partial((weft_reduce_op)17);
  cr_assert_eq(weft_dtensor_spec_init(&s, 2, mesh, pl, 2, WEFT_F32, 3, shape), WEFT_ERR_INVALID);
  pl[1] = weft_replicate();
  int64_t neg[3] = {4, -1, 2};
  cr_assert_eq(weft_dtensor_spec_init(&s, 2, mesh, pl, 2, WEFT_F32, 3, neg), WEFT_ERR_INVALID);
}

/* ----------------------------------------------------------- geometry */

/* PyTorch's compute_local_shape_and_global_offset docstring: [2, 5] with
 * (Shard(1), Shard(1)) on (2, 2). */
Test(dtensor_geometry, nested_shards_match_pytorch_docstring) {
  int mesh[2] = {2, 2};
  int64_t shape[2] = {2, 5};
  weft_placement pl[2] = {weft_shard(1), weft_shard(1)};
  weft_dtensor_spec s = mk(2, mesh, pl, 2, shape);
  int64_t want_shape[4][2] = {{2, 2}, {2, 1}, {2, 1}, {2, 1}};
  int64_t want_off[4][2] = {{0, 0}, {0, 2}, {0, 3}, {0, 4}};
  for (int r = 0; r < 4; r++) {
    int c[2] = {r / 2, r % 2};
    int64_t ls[2], off[2];
    bool contig;
    cr_assert_eq(weft_dtensor_spec_local_shape(&s, c, ls, off, &contig), WEFT_OK);
    cr_assert(contig);
    cr_assert(ls[0] == want_shape[r][0] && ls[1] == want_shape[r][1], "rank %d shape", r);
    cr_assert(off[0] == want_off[r][0] && off[1] == want_off[r][1], "rank %d offset %lld,%lld", r,
              (long long)off[0], (long long)off[1]);
  }
}

/* PyTorch's _StridedShard docstring: [8, 8], mesh (dp=2, tp=2),
 * (_StridedShard(0, sf=2), Shard(0)): rank (i, k) holds shard index 2k+i,
 * i.e. rows 0-1, 4-5, 2-3, 6-7 for ranks 0..3. */
Test(dtensor_geometry, strided_shard_matches_pytorch_docstring) {
  int mesh[2] = {2, 2};
  int64_t shape[2] = {8, 8};
  weft_placement pl[2] = {weft_strided_shard(0, 2), weft_shard(0)};
  weft_dtensor_spec s = mk(2, mesh, pl, 2, shape);
  int64_t want[4] = {0, 4, 2, 6};
  for (int r = 0; r < 4; r++) {
    int c[2] = {r / 2, r % 2};
    weft_range rg[4];
    int n;
    cr_assert_eq(weft_dtensor_spec_ranges(&s, c, 0, rg, 4, &n), WEFT_OK);
    cr_assert_eq(n, 1);
    cr_assert(rg[0].start == want[r] && rg[0].len == 2, "rank %d: [%lld, +%lld)", r,
              (long long)rg[0].start, (long long)rg[0].len);
  }
  /* with the tp shard gathered (SS(0,2), R) a dp rank holds two row runs */
  pl[1] = weft_replicate();
  s = mk(2, mesh, pl, 2, shape);
  int c[2] = {1, 0};
  weft_range rg[4];
  int n;
  bool contig = true;
  int64_t ls[2], off[2];
  cr_assert_eq(weft_dtensor_spec_ranges(&s, c, 0, rg, 4, &n), WEFT_OK);
  cr_assert_eq(n, 2);
  cr_assert(rg[0].start == 2 && rg[0].len == 2 && rg[1].start == 6 && rg[1].len == 2);
  cr_assert_eq(weft_dtensor_spec_local_shape(&s, c, ls, off, &contig), WEFT_OK);
  cr_assert(!contig && ls[0] == 4 && off[0] == 2);
}

/* FSDP over TP, any sizes: (SS(0, tp), S(0)) on (dp, tp) holds exactly
 * chunk(chunk(rows, tp)[k], dp)[i] (weft_chunk_range twice). */
Test(dtensor_geometry, strided_shard_is_fsdp_over_tp_for_uneven_sizes) {
  for (int dp = 1; dp <= 4; dp++)
    for (int tp = 2; tp <= 4; tp++)
      for (int64_t rows = 0; rows <= 23; rows++) {
        int mesh[2] = {dp, tp};
        int64_t shape[1] = {rows};
        weft_placement pl[2] = {weft_strided_shard(0, tp), weft_shard(0)};
        weft_dtensor_spec s = mk(2, mesh, pl, 1, shape);
        for (int i = 0; i < dp; i++)
          for (int k = 0; k < tp; k++) {
            int64_t ts, tl, ds, dl;
            weft_chunk_range(rows, tp, k, &ts, &tl);
            weft_chunk_range(tl, dp, i, &ds, &dl);
            int c[2] = {i, k};
            weft_range rg[8];
            int n;
            cr_assert_eq(weft_dtensor_spec_ranges(&s, c, 0, rg, 8, &n), WEFT_OK);
            int64_t ls, off;
            weft_dtensor_spec_local_shape(&s, c, &ls, &off, NULL);
            cr_assert_eq(ls, dl, "rows %lld dp %d tp %d (%d,%d): %lld rows, want %lld",
                         (long long)rows, dp, tp, i, k, (long long)ls, (long long)dl);
            if (dl > 0) {
              cr_assert(n == 1 && rg[0].start == ts + ds, "rows %lld dp %d tp %d (%d,%d)",
                        (long long)rows, dp, tp, i, k);
              cr_assert_eq(off, ts + ds);
            } else {
              cr_assert_eq(n, 0);
              cr_assert_eq(off, rows, "empty shard offset is the dim size");
            }
          }
      }
}

/* Every coordinate of random specs against the index-array reference. */
Test(dtensor_geometry, random_specs_match_reference_for_every_rank) {
  unsigned long seed = weft_test_seed(20240611);
  ref_rng r;
  ref_rng_seed(&r, seed);
  static const int meshes[][4] = {{1, 1},    {1, 2},    {1, 3},    {1, 4},       {2, 1, 4},
                                  {2, 2, 2}, {2, 2, 3}, {2, 4, 2}, {3, 2, 2, 2}, {3, 3, 2, 2}};
  int checked = 0;
  for (int it = 0; it < 3000; it++) {
    const int *m = meshes[ref_rng_int(&r, 0, 9)];
    int k = m[0];
    const int *mshape = m + 1;
    int nd = ref_rng_int(&r, 0, 3);
    int64_t shape[WEFT_MAX_DIMS];
    for (int d = 0; d < nd; d++) shape[d] = ref_rng_int(&r, 0, 13);
    weft_placement pl[4];
    ref_random_placements(&r, k, mshape, nd, pl);
    weft_dtensor_spec s;
    cr_assert_eq(weft_dtensor_spec_init(&s, k, mshape, pl, k, WEFT_F32, nd, shape), WEFT_OK, "%s",
                 weft_last_error());
    int total = 1;
    for (int i = 0; i < k; i++) total *= mshape[i];
    for (int rank = 0; rank < total; rank++) {
      int c[4];
      for (int i = k - 1, q = rank; i >= 0; i--) {
        c[i] = q % mshape[i];
        q /= mshape[i];
      }
      int64_t ls[WEFT_MAX_DIMS], off[WEFT_MAX_DIMS];
      bool contig;
      cr_assert_eq(weft_dtensor_spec_local_shape(&s, c, ls, off, &contig), WEFT_OK);
      bool all_contig = true;
      for (int d = 0; d < nd; d++) {
        int64_t n;
        int64_t *idx = ref_indices(&s, c, d, &n);
        weft_range rg[64];
        int nr;
        cr_assert_eq(weft_dtensor_spec_ranges(&s, c, d, rg, 64, &nr), WEFT_OK);
        char desc[512];
        ref_case_describe(&s, NULL, desc, sizeof desc);
        cr_assert_eq(ls[d], n, "seed %lu it %d %s rank %d dim %d: %lld vs ref %lld", seed, it, desc,
                     rank, d, (long long)ls[d], (long long)n);
        /* expand the runs and compare index by index */
        int64_t at = 0;
        for (int q = 0; q < nr && q < 64; q++)
          for (int64_t j = 0; j < rg[q].len; j++, at++)
            cr_assert(at < n && idx[at] == rg[q].start + j,
                      "seed %lu it %d %s rank %d dim %d: local %lld is global %lld, ref %lld", seed,
                      it, desc, rank, d, (long long)at, (long long)(rg[q].start + j),
                      (long long)(at < n ? idx[at] : -1));
        cr_assert_eq(at, n);
        cr_assert_eq(off[d], n ? idx[0] : shape[d]);
        if (nr > 1) all_contig = false;
        free(idx);
        checked++;
      }
      cr_assert_eq(contig, all_contig);
    }
  }
  cr_assert_gt(checked, 10000);
}

/* The shards of every rank of a mesh partition each replica group: every
 * element is held exactly once per combination of the replicate dims. */
Test(dtensor_geometry, shards_tile_the_tensor_exactly) {
  unsigned long seed = weft_test_seed(777);
  ref_rng r;
  ref_rng_seed(&r, seed);
  int mesh[3] = {2, 3, 2};
  for (int it = 0; it < 400; it++) {
    int64_t shape[2] = {ref_rng_int(&r, 0, 11), ref_rng_int(&r, 0, 7)};
    weft_placement pl[3];
    ref_random_placements(&r, 3, mesh, 2, pl);
    weft_dtensor_spec s = mk(3, mesh, pl, 2, shape);
    int reps = 1;
    for (int i = 0; i < 3; i++)
      if (!weft_placement_is_shard(s.placements[i])) reps *= mesh[i];
    int *count = calloc((size_t)(shape[0] * shape[1] + 1), sizeof *count);
    for (int rank = 0; rank < 12; rank++) {
      int c[3] = {rank / 6, (rank / 2) % 3, rank % 2};
      weft_range r0[32], r1[32];
      int n0, n1;
      weft_dtensor_spec_ranges(&s, c, 0, r0, 32, &n0);
      weft_dtensor_spec_ranges(&s, c, 1, r1, 32, &n1);
      for (int a = 0; a < n0; a++)
        for (int64_t i = r0[a].start; i < r0[a].start + r0[a].len; i++)
          for (int b = 0; b < n1; b++)
            for (int64_t j = r1[b].start; j < r1[b].start + r1[b].len; j++)
              count[i * shape[1] + j]++;
    }
    char desc[512];
    ref_case_describe(&s, NULL, desc, sizeof desc);
    for (int64_t e = 0; e < shape[0] * shape[1]; e++)
      cr_assert_eq(count[e], reps, "seed %lu %s: element %lld held %d times, want %d", seed, desc,
                   (long long)e, count[e], reps);
    free(count);
  }
}

/* weft_dtensor_spec_local_boxes against the reference index lists: every
 * element of every piece sits at local position local_start + i holding
 * global index off + i along each dim, and the pieces tile the local
 * tensor exactly once (random specs with strided shards, every rank). */
Test(dtensor_geometry, local_boxes_tile_the_shard_as_the_reference_says) {
  unsigned long seed = weft_test_seed(4242);
  ref_rng r;
  ref_rng_seed(&r, seed);
  static const int meshes[][4] = {{1, 3}, {2, 2, 2}, {2, 2, 3}, {3, 2, 2, 2}};
  int64_t pieces = 0, multi = 0;
  for (int it = 0; it < 600; it++) {
    const int *m = meshes[ref_rng_int(&r, 0, 3)];
    int k = m[0];
    const int *mshape = m + 1;
    int nd = ref_rng_int(&r, 0, 3);
    int64_t shape[WEFT_MAX_DIMS];
    for (int d = 0; d < nd; d++) shape[d] = ref_rng_int(&r, 0, 13);
    weft_placement pl[4];
    ref_random_placements(&r, k, mshape, nd, pl);
    weft_dtensor_spec s = mk(k, mshape, pl, nd, shape);
    char desc[512];
    ref_case_describe(&s, NULL, desc, sizeof desc);
    int total = 1;
    for (int i = 0; i < k; i++) total *= mshape[i];
    for (int rank = 0; rank < total; rank++) {
      int c[4];
      for (int i = k - 1, q = rank; i >= 0; i--) {
        c[i] = q % mshape[i];
        q /= mshape[i];
      }
      int64_t *idx[WEFT_MAX_DIMS], n[WEFT_MAX_DIMS], lnumel = 1;
      for (int d = 0; d < nd; d++) {
        idx[d] = ref_indices(&s, c, d, &n[d]);
        lnumel *= n[d];
      }
      weft_local_box *lb = NULL;
      int64_t nb = -1;
      cr_assert_eq(weft_dtensor_spec_local_boxes(&s, c, &lb, &nb), WEFT_OK, "%s",
                   weft_last_error());
      if (lnumel == 0)
        cr_assert(nb == 0 && lb == NULL, "seed %lu %s rank %d: empty shard gives %lld", seed, desc,
                  rank, (long long)nb);
      char *seen = calloc((size_t)lnumel + 1, 1);
      int64_t vol = 0;
      for (int64_t b = 0; b < nb; b++) {
        const weft_local_box *x = &lb[b];
        int64_t v = weft_box_volume(&x->global, nd);
        cr_assert_gt(v, 0);
        vol += v;
        for (int d = 0; d < nd; d++)
          for (int64_t i = 0; i < x->global.size[d]; i++)
            cr_assert(x->local_start[d] + i < n[d] &&
                          idx[d][x->local_start[d] + i] == x->global.off[d] + i,
                      "seed %lu %s rank %d piece %lld dim %d: local %lld is not global %lld", seed,
                      desc, rank, (long long)b, d, (long long)(x->local_start[d] + i),
                      (long long)(x->global.off[d] + i));
        /* mark the local elements the piece covers */
        int64_t at[WEFT_MAX_DIMS] = {0};
        for (int64_t e = 0; e < v; e++) {
          int64_t lin = 0;
          for (int d = 0; d < nd; d++) lin = lin * n[d] + x->local_start[d] + at[d];
          cr_assert_eq(seen[lin], 0, "seed %lu %s rank %d: local element %lld in two pieces", seed,
                       desc, rank, (long long)lin);
          seen[lin] = 1;
          for (int d = nd - 1; d >= 0 && ++at[d] == x->global.size[d]; d--) at[d] = 0;
        }
      }
      cr_assert_eq(vol, lnumel, "seed %lu %s rank %d: pieces cover %lld of %lld", seed, desc, rank,
                   (long long)vol, (long long)lnumel);
      pieces += nb;
      if (nb > 1) multi++;
      free(seen);
      free(lb);
      for (int d = 0; d < nd; d++) free(idx[d]);
    }
  }
  cr_assert_gt(multi, 50, "strided shards should give several pieces (%lld cases)",
               (long long)multi);
  cr_log_info("%lld pieces, %lld shards of several", (long long)pieces, (long long)multi);
  int c3[2] = {0, 3};
  int m13[2] = {1, 3};
  int64_t sh[1] = {6};
  weft_placement p1[2] = {weft_replicate(), weft_shard(0)};
  weft_dtensor_spec s1 = mk(2, m13, p1, 1, sh);
  weft_local_box *lb;
  int64_t nb;
  cr_assert_eq(weft_dtensor_spec_local_boxes(&s1, c3, &lb, &nb), WEFT_ERR_INVALID);
  cr_assert_eq(weft_dtensor_spec_local_boxes(&s1, NULL, &lb, &nb), WEFT_ERR_INVALID);
}

/* weft_box_* against brute force on small random boxes. */
Test(dtensor_geometry, box_volume_equal_intersect_match_brute_force) {
  unsigned long seed = weft_test_seed(99);
  ref_rng r;
  ref_rng_seed(&r, seed);
  for (int it = 0; it < 2000; it++) {
    int nd = ref_rng_int(&r, 0, 3);
    weft_box a, b, o;
    for (int d = 0; d < nd; d++) {
      a.off[d] = ref_rng_int(&r, 0, 6), a.size[d] = ref_rng_int(&r, 1, 5);
      b.off[d] = ref_rng_int(&r, 0, 6), b.size[d] = ref_rng_int(&r, 1, 5);
    }
    int64_t va = 1, common = 1;
    bool same = true;
    for (int d = 0; d < nd; d++) {
      va *= a.size[d];
      int64_t c = 0;
      for (int64_t i = 0; i < 12; i++)
        c += (i >= a.off[d] && i < a.off[d] + a.size[d]) &&
             (i >= b.off[d] && i < b.off[d] + b.size[d]);
      common *= c;
      same = same && a.off[d] == b.off[d] && a.size[d] == b.size[d];
    }
    cr_assert_eq(weft_box_volume(&a, nd), va);
    cr_assert_eq(weft_box_equal(&a, &b, nd), same);
    cr_assert(weft_box_equal(&a, &a, nd));
    bool hit = weft_box_intersect(&a, &b, nd, &o);
    cr_assert_eq(hit, common > 0, "seed %lu it %d", seed, it);
    if (hit) {
      cr_assert_eq(weft_box_volume(&o, nd), common);
      for (int d = 0; d < nd; d++)
        cr_assert(o.off[d] >= a.off[d] && o.off[d] >= b.off[d] &&
                  o.off[d] + o.size[d] <= a.off[d] + a.size[d] &&
                  o.off[d] + o.size[d] <= b.off[d] + b.size[d]);
    }
  }
}

Test(dtensor_geometry, bad_coordinates_and_dims_are_errors) {
  int mesh[2] = {2, 2};
  int64_t shape[2] = {4, 4};
  weft_placement pl[2] = {weft_shard(0), weft_replicate()};
  weft_dtensor_spec s = mk(2, mesh, pl, 2, shape);
  int c[2] = {2, 0};
  int64_t ls[2];
  cr_assert_eq(weft_dtensor_spec_local_shape(&s, c, ls, NULL, NULL), WEFT_ERR_INVALID);
  c[0] = 0;
  int n;
  cr_assert_eq(weft_dtensor_spec_ranges(&s, c, 2, NULL, 0, &n), WEFT_ERR_INVALID);
  cr_assert_eq(weft_dtensor_spec_ranges(&s, c, 0, NULL, 0, &n), WEFT_OK);
  cr_assert_eq(n, 1);
}

/* ------------------------------------------------------------- planner */

static int plan(const weft_dtensor_spec *src, const char *to, weft_redistribute_step *steps,
                bool allow_partial) {
  weft_placement pl[8];
  int n = 0, ns = -1;
  cr_assert_eq(weft_placements_parse(to, pl, 8, &n), WEFT_OK);
  weft_status st = weft_redistribute_plan(src, pl, n, allow_partial, steps, 16, &ns, NULL);
  cr_assert_eq(st, WEFT_OK, "plan to %s: %s", to, weft_last_error());
  return ns;
}

Test(dtensor_geometry, single_dim_moves_are_one_direct_collective) {
  int mesh[1] = {4};
  int64_t shape[2] = {8, 12};
  struct {
    const char *from, *to;
    weft_coll_kind coll;
  } cases[] = {
      {"S(0)", "R", WEFT_COLL_ALL_GATHER},          {"S(0)", "S(1)", WEFT_COLL_ALL_TO_ALL},
      {"R", "S(1)", WEFT_COLL_KIND_COUNT},          {"P(sum)", "R", WEFT_COLL_ALL_REDUCE},
      {"P(max)", "S(0)", WEFT_COLL_REDUCE_SCATTER}, {"S(1)", "R", WEFT_COLL_ALL_GATHER},
      {"SS(0,2)", "R", WEFT_COLL_ALL_GATHER},       {"SS(0,2)", "S(0)", WEFT_COLL_ALL_TO_ALL}};
  for (unsigned i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    weft_placement pl[1];
    int n;
    weft_placements_parse(cases[i].from, pl, 1, &n);
    weft_dtensor_spec s = mk(1, mesh, pl, 2, shape);
    weft_redistribute_step st[16];
    int ns = plan(&s, cases[i].to, st, false);
    cr_assert_eq(ns, 1, "%s -> %s: %d steps", cases[i].from, cases[i].to, ns);
    cr_assert_eq(st[0].coll, cases[i].coll, "%s -> %s: coll %d", cases[i].from, cases[i].to,
                 (int)st[0].coll);
  }
}

Test(dtensor_geometry, nested_shards_replicate_the_inner_dim_first) {
  int mesh[2] = {2, 2};
  int64_t shape[1] = {8};
  weft_placement pl[2] = {weft_shard(0), weft_shard(0)};
  weft_dtensor_spec s = mk(2, mesh, pl, 1, shape);
  weft_redistribute_step st[16];
  int ns = plan(&s, "(R, S(0))", st, false);
  /* PyTorch's order: tp S0->R, dp S0->R, tp R->S0 */
  cr_assert_eq(ns, 3);
  cr_assert(st[0].mesh_dim == 1 && st[0].coll == WEFT_COLL_ALL_GATHER);
  cr_assert(st[1].mesh_dim == 0 && st[1].coll == WEFT_COLL_ALL_GATHER);
  cr_assert(st[2].mesh_dim == 1 && st[2].coll == WEFT_COLL_KIND_COUNT);
  /* (S0, S1) -> (S1, S0) on a 2-D tensor works without a full gather */
  int64_t shape2[2] = {8, 8};
  weft_placement p2[2] = {weft_shard(0), weft_shard(1)};
  weft_dtensor_spec s2 = mk(2, mesh, p2, 2, shape2);
  double cost;
  weft_placement tgt[2] = {weft_shard(1), weft_shard(0)};
  int n2;
  cr_assert_eq(weft_redistribute_plan(&s2, tgt, 2, false, st, 16, &n2, &cost), WEFT_OK, "%s",
               weft_last_error());
  cr_assert_geq(n2, 2);
  /* no step of it may replicate the whole tensor: each all-gather result
   * is at most half of it (8*8*4/2 bytes), so the cost stays below a full gather */
  cr_assert_lt(cost, 3 * 65536.0 + 8 * 8 * 4, "cost %g", cost);
}

Test(dtensor_geometry, partial_targets_need_the_same_partial_in_the_source) {
  int mesh[2] = {2, 2};
  int64_t shape[1] = {8};
  weft_placement pl[2] = {weft_shard(0), weft_replicate()};
  weft_dtensor_spec s = mk(2, mesh, pl, 1, shape);
  weft_placement tgt[2] = {weft_replicate(), weft_partial(WEFT_OP_SUM)};
  int ns;
  cr_assert_eq(weft_redistribute_plan(&s, tgt, 2, false, NULL, 0, &ns, NULL), WEFT_ERR_INVALID);
  cr_assert(strstr(weft_last_error(), "Partial"), "%s", weft_last_error());
  /* internal use may create a Partial from a Replicate (S -> R -> P) */
  cr_assert_eq(weft_redistribute_plan(&s, tgt, 2, true, NULL, 0, &ns, NULL), WEFT_OK, "%s",
               weft_last_error());
  cr_assert_eq(ns, 2);
  /* keeping an existing Partial is fine */
  weft_placement p2[2] = {weft_partial(WEFT_OP_MAX), weft_shard(0)};
  weft_dtensor_spec s2 = mk(2, mesh, p2, 1, shape);
  weft_placement t2[2] = {weft_partial(WEFT_OP_MAX), weft_replicate()};
  cr_assert_eq(weft_redistribute_plan(&s2, t2, 2, false, NULL, 0, &ns, NULL), WEFT_OK);
  cr_assert_eq(ns, 1);
  /* wrong count */
  cr_assert_eq(weft_redistribute_plan(&s2, t2, 1, false, NULL, 0, &ns, NULL), WEFT_ERR_INVALID);
}

Test(dtensor_geometry, plans_are_cached_per_source_target_and_shape) {
  weft_redistribute_plan_cache_clear();
  int mesh[2] = {2, 2};
  int64_t shape[2] = {6, 5};
  weft_placement pl[2] = {weft_shard(0), weft_shard(1)};
  weft_dtensor_spec s = mk(2, mesh, pl, 2, shape);
  weft_placement tgt[2] = {weft_replicate(), weft_shard(0)};
  int ns;
  for (int i = 0; i < 5; i++)
    cr_assert_eq(weft_redistribute_plan(&s, tgt, 2, false, NULL, 0, &ns, NULL), WEFT_OK);
  weft_plan_cache_stats c = weft_redistribute_plan_cache_stats();
  cr_assert_eq(c.misses, 1);
  cr_assert_eq(c.hits, 4);
  s.shape[0] = 7; /* another shape is another plan */
  weft_redistribute_plan(&s, tgt, 2, false, NULL, 0, &ns, NULL);
  c = weft_redistribute_plan_cache_stats();
  cr_assert_eq(c.misses, 2);
  cr_assert_eq(c.entries, 2);
}

/* Every random pair of placement lists has a plan (1..8 ranks, 1-3 dims). */
Test(dtensor_geometry, every_random_pair_has_a_plan) {
  unsigned long seed = weft_test_seed(4242);
  ref_rng r;
  ref_rng_seed(&r, seed);
  static const int meshes[][4] = {{1, 1},    {1, 2},    {1, 4},      {2, 1, 4},
                                  {2, 2, 2}, {2, 2, 3}, {3, 2, 2, 2}};
  for (int it = 0; it < 600; it++) {
    const int *m = meshes[ref_rng_int(&r, 0, 6)];
    int k = m[0];
    int nd = ref_rng_int(&r, 0, 3);
    int64_t shape[4];
    for (int d = 0; d < nd; d++) shape[d] = ref_rng_int(&r, 0, 9);
    weft_placement a[4], b[4];
    ref_random_placements(&r, k, m + 1, nd, a);
    ref_random_placements(&r, k, m + 1, nd, b);
    weft_dtensor_spec s = mk(k, m + 1, a, nd, shape);
    int ns;
    weft_status st = weft_redistribute_plan(&s, b, k, false, NULL, 0, &ns, NULL);
    char desc[512];
    ref_case_describe(&s, b, desc, sizeof desc);
    cr_assert_eq(st, WEFT_OK, "seed %lu it %d %s: %s", seed, it, desc, weft_last_error());
  }
}

/* -------------------------------------------------------------- visualize */

Test(dtensor_geometry, visualize_2d_and_1d_tables) {
  int mesh[2] = {2, 2};
  int64_t shape[2] = {8, 6};
  weft_placement pl[2] = {weft_shard(0), weft_shard(1)};
  weft_dtensor_spec s = mk(2, mesh, pl, 2, shape);
  char buf[2048];
  cr_assert_eq(weft_dtensor_spec_visualize(&s, NULL, buf, sizeof buf), WEFT_OK);
  cr_assert_str_eq(buf,
                   "f32[8, 6] (S(0), S(1)) on mesh 2x2\n"
                   "          cols 0-2  cols 3-5\n"
                   "rows 0-3  0         1\n"
                   "rows 4-7  2         3\n");
  /* replicas listed together; uneven and empty shards */
  int mesh1[2] = {2, 3};
  int64_t shape1[1] = {5};
  weft_placement p1[2] = {weft_replicate(), weft_shard(0)};
  weft_dtensor_spec s1 = mk(2, mesh1, p1, 1, shape1);
  cr_assert_eq(weft_dtensor_spec_visualize(&s1, NULL, buf, sizeof buf), WEFT_OK);
  cr_assert_str_eq(buf,
                   "f32[5] (R, S(0)) on mesh 2x3\n"
                   "elems 0-1  0,3\n"
                   "elems 2-3  1,4\n"
                   "elems 4    2,5\n");
  /* strided: a dp rank's rows are two runs */
  int64_t shape2[2] = {4, 2};
  weft_placement p2[2] = {weft_strided_shard(0, 2), weft_replicate()};
  weft_dtensor_spec s2 = mk(2, mesh, p2, 2, shape2);
  cr_assert_eq(weft_dtensor_spec_visualize(&s2, NULL, buf, sizeof buf), WEFT_OK);
  cr_assert_str_eq(buf,
                   "f32[4, 2] (SS(0,2), R) on mesh 2x2\n"
                   "        cols 0-1\n"
                   "rows 0  0,1\n"
                   "rows 1  2,3\n"
                   "rows 2  0,1\n"
                   "rows 3  2,3\n");
  /* partial and 3-d */
  weft_placement p3[2] = {weft_partial(WEFT_OP_SUM), weft_shard(0)};
  weft_dtensor_spec s3 = mk(2, mesh, p3, 1, shape1);
  cr_assert_eq(weft_dtensor_spec_visualize(&s3, NULL, buf, sizeof buf), WEFT_OK);
  cr_assert(strstr(buf, "Partial(sum)"), "%s", buf);
  int64_t shape4[3] = {2, 2, 2};
  weft_dtensor_spec s4 = mk(2, mesh, pl, 3, shape4);
  cr_assert_eq(weft_dtensor_spec_visualize(&s4, NULL, buf, sizeof buf), WEFT_ERR_UNSUPPORTED);
  /* truncation still terminates */
  char small[16];
  cr_assert_eq(weft_dtensor_spec_visualize(&s, NULL, small, sizeof small), WEFT_OK);
  cr_assert_eq(strlen(small), 15u);
}
