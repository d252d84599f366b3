/* dtensor/plan.c — the redistribute planner.
 *
 * A plan is a sequence of single-mesh-dim steps from the source placements
 * to the target ones. The planner runs Dijkstra over placement lists
 * (like PyTorch's DTensorRedistributePlanner with shard orders), where an
 * edge changes the placement of one mesh dim i:
 *
 *   R -> S/SS        local slice        valid if every rank's new holding is
 *                                        inside its old one
 *   R -> P           local              only towards a target Partial
 *   S/SS -> R        all-gather over i  valid if the old holdings of the
 *                                        group cover the new one
 *   S/SS -> S/SS     all-to-all over i  same, per receiving rank
 *   P -> R           all-reduce over i  always valid
 *   P -> S/SS        reduce-scatter     valid if each new holding is inside
 *                                        the (common) old one
 *
 * Validity is checked with the exact shard geometry (geometry.c) for every
 * combination of the mesh coordinates that matter, so a step is only taken
 * when it reproduces the target layout exactly — nested shards ((S0,S0) ->
 * (R,S0) must replicate the inner mesh dim first), strided shards and uneven
 * sizes included. Edge cost = estimated bytes one rank sends (nccl-tests bus
 * bytes: all-gather / all-to-all / reduce-scatter (m-1)/m of the buffer,
 * all-reduce twice that) plus a per-collective latency term, so a
 * single-dim move is always its one direct collective. The plan depends only
 * on (mesh shape, source, target, shape, element size): every rank computes
 * the same one. Plans are cached.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor_internal.h"

#define DT_LATENCY_BYTES 65536.0 /* a collective's start-up cost in byte-equivalents */
#define DT_MAX_EXPANSIONS 200000

/* ---------------------------------------------------------------- costs */

static double est_local_bytes(const weft_dtensor_spec *s) {
  double n = (double)weft_dtype_size(s->dtype);
  for (int d = 0; d < s->ndim; d++) {
    double f = 1;
    for (int i = 0; i < s->mesh_ndim; i++)
      if (weft_placement_is_shard(s->placements[i]) && s->placements[i].dim == d)
        f *= s->mesh_shape[i];
    n *= (double)s->shape[d] / f;
  }
  return n;
}

static bool step_kind_of(weft_placement from, weft_placement to, dt_step_kind *kind) {
  bool fs = weft_placement_is_shard(from), ts = weft_placement_is_shard(to);
  if (from.kind == WEFT_PLACE_REPLICATE) {
    if (ts)
      *kind = DT_STEP_LOCAL;
    else if (to.kind == WEFT_PLACE_PARTIAL)
      *kind = DT_STEP_PARTITION;
    else
      return false;
    return true;
  }
  if (fs) {
    if (to.kind == WEFT_PLACE_REPLICATE)
      *kind = DT_STEP_ALL_GATHER;
    else if (ts)
      *kind = DT_STEP_ALL_TO_ALL;
    else
      return false;
    return true;
  }
  /* partial */
  if (to.kind == WEFT_PLACE_REPLICATE)
    *kind = DT_STEP_ALL_REDUCE;
  else if (ts)
    *kind = DT_STEP_REDUCE_SCATTER;
  else
    return false;
  return true;
}

static double step_cost(const weft_dtensor_spec *x, const weft_dtensor_spec *y, int i,
                        dt_step_kind kind) {
  double m = x->mesh_shape[i];
  if (m == 1) return 1.0;
  double f = (m - 1) / m;
  switch (kind) {
    case DT_STEP_LOCAL:
    case DT_STEP_PARTITION:
      return 1.0;
    case DT_STEP_ALL_GATHER:
      return DT_LATENCY_BYTES + est_local_bytes(y) * f;
    case DT_STEP_ALL_TO_ALL:
      return DT_LATENCY_BYTES + est_local_bytes(x) * f;
    case DT_STEP_ALL_REDUCE:
      return DT_LATENCY_BYTES + 2 * est_local_bytes(x) * f;
    case DT_STEP_REDUCE_SCATTER:
      return DT_LATENCY_BYTES + est_local_bytes(x) * f;
  }
  return 1e300;
}

/* ------------------------------------------------------------- validity */

/* Iterates the coordinate combinations of the mesh dims in `rel` (others 0). */
typedef struct coord_iter {
  int n;
  int dims[WEFT_MESH_MAX_DIMS];
  int coords[WEFT_MESH_MAX_DIMS];
  const int *shape;
} coord_iter;

static bool coord_next(coord_iter *it) {
  for (int k = it->n - 1; k >= 0; k--) {
    int d = it->dims[k];
    if (++it->coords[d] < it->shape[d]) return true;
    it->coords[d] = 0;
  }
  return false;
}

/* Product over the dims in t of |A_t ∩ B_t| and of |B_t|. */
typedef struct dimset {
  int n;
  int d[2];
} dimset;

static weft_status step_valid(const weft_dtensor_spec *x, const weft_dtensor_spec *y, int i,
                              dt_step_kind kind, bool *ok) {
  *ok = true;
  if (kind == DT_STEP_ALL_REDUCE || kind == DT_STEP_PARTITION) return WEFT_OK;
  weft_placement from = x->placements[i], to = y->placements[i];
  dimset t = {0, {0, 0}};
  if (weft_placement_is_shard(from)) t.d[t.n++] = from.dim;
  if (weft_placement_is_shard(to) && !(t.n == 1 && t.d[0] == to.dim)) t.d[t.n++] = to.dim;
  if (t.n == 0) return WEFT_OK;
  /* mesh dims that shard a dim of t in x or y, and i */
  coord_iter it = {0};
  it.shape = x->mesh_shape;
  for (int j = 0; j < x->mesh_ndim; j++) {
    bool rel = j == i;
    for (int k = 0; k < t.n; k++) {
      if (weft_placement_is_shard(x->placements[j]) && x->placements[j].dim == t.d[k]) rel = true;
      if (weft_placement_is_shard(y->placements[j]) && y->placements[j].dim == t.d[k]) rel = true;
    }
    if (rel) it.dims[it.n++] = j;
  }
  int m = x->mesh_shape[i];
  weft_status st = WEFT_OK;
  dt_runs nl[2] = {{0}}, ol[2] = {{0}};
  do {
    int c_recv[WEFT_MESH_MAX_DIMS];
    memcpy(c_recv, it.coords, sizeof c_recv);
    int64_t need = 1;
    for (int k = 0; k < t.n; k++) {
      WEFT_CHECK_GOTO(dt_holding(y, c_recv, t.d[k], &nl[k]), st, out);
      need *= dt_runs_total(&nl[k]);
    }
    int64_t have = 0;
    if (kind == DT_STEP_LOCAL || kind == DT_STEP_REDUCE_SCATTER) {
      /* from R or P: the old holding does not depend on c_i */
      int64_t prod = 1;
      for (int k = 0; k < t.n; k++) {
        WEFT_CHECK_GOTO(dt_holding(x, c_recv, t.d[k], &ol[k]), st, out);
        prod *= dt_intersect_count(&ol[k], &nl[k]);
      }
      have = prod;
    } else {
      int c_send[WEFT_MESH_MAX_DIMS];
      memcpy(c_send, c_recv, sizeof c_send);
      for (int c = 0; c < m; c++) {
        c_send[i] = c;
        int64_t prod = 1;
        for (int k = 0; k < t.n; k++) {
          WEFT_CHECK_GOTO(dt_holding(x, c_send, t.d[k], &ol[k]), st, out);
          prod *= dt_intersect_count(&ol[k], &nl[k]);
        }
        have += prod;
      }
    }
    if (have != need) {
      *ok = false;
      goto out;
    }
  } while (coord_next(&it));
out:
  for (int k = 0; k < 2; k++) {
    dt_runs_free(&nl[k]);
    dt_runs_free(&ol[k]);
  }
  return st;
}

/* ------------------------------------------------------------- dijkstra */

typedef struct node {
  uint64_t code;
  double dist;
  int64_t prev; /* index of the previous node, -1 for the source */
  dt_step step; /* step that reached this node */
  bool done;
} node;

typedef struct heap_item {
  double dist;
  int64_t seq;
  int64_t node;
} heap_item;

typedef struct search {
  int k;
  int ncand;
  weft_placement cand[2 + 2 * WEFT_MAX_DIMS + 2 * WEFT_MESH_MAX_DIMS];
  node *nodes;
  int64_t nnodes, capnodes;
  int64_t *table; /* open addressing: node index + 1, 0 = empty */
  int64_t tcap;
  heap_item *heap;
  int64_t nheap, capheap, seq;
} search;

static uint64_t hash64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

static int cand_index(const search *s, weft_placement p) {
  for (int c = 0; c < s->ncand; c++)
    if (weft_placement_equal(s->cand[c], p)) return c;
  return -1;
}

static uint64_t encode(const search *s, const weft_placement *pl) {
  uint64_t code = 0;
  for (int i = 0; i < s->k; i++) code = code * (uint64_t)s->ncand + (uint64_t)cand_index(s, pl[i]);
  return code;
}

static void decode(const search *s, uint64_t code, weft_placement *pl) {
  for (int i = s->k - 1; i >= 0; i--) {
    pl[i] = s->cand[code % (uint64_t)s->ncand];
    code /= (uint64_t)s->ncand;
  }
}

static weft_status table_grow(search *s) {
  int64_t nc = s->tcap ? s->tcap * 2 : 1024;
  int64_t *nt = calloc((size_t)nc, sizeof *nt);
  if (!nt) return weft_error(WEFT_ERR_OOM, "planner table");
  for (int64_t n = 0; n < s->nnodes; n++) {
    uint64_t h = hash64(s->nodes[n].code) & (uint64_t)(nc - 1);
    while (nt[h]) h = (h + 1) & (uint64_t)(nc - 1);
    nt[h] = n + 1;
  }
  free(s->table);
  s->table = nt;
  s->tcap = nc;
  return WEFT_OK;
}

/* Finds or adds the node for code; *idx = its index. */
static weft_status node_get(search *s, uint64_t code, int64_t *idx, bool *added) {
  if ((s->nnodes + 1) * 2 > s->tcap) WEFT_CHECK(table_grow(s));
  uint64_t h = hash64(code) & (uint64_t)(s->tcap - 1);
  while (s->table[h]) {
    int64_t n = s->table[h] - 1;
    if (s->nodes[n].code == code) {
      *idx = n;
      *added = false;
      return WEFT_OK;
    }
    h = (h + 1) & (uint64_t)(s->tcap - 1);
  }
  if (s->nnodes == s->capnodes) {
    int64_t nc = s->capnodes ? s->capnodes * 2 : 256;
    node *nn = realloc(s->nodes, (size_t)nc * sizeof *nn);
    if (!nn) return weft_error(WEFT_ERR_OOM, "planner nodes");
    s->nodes = nn;
    s->capnodes = nc;
  }
  node *n = &s->nodes[s->nnodes];
  memset(n, 0, sizeof *n);
  n->code = code;
  n->dist = 1e300;
  n->prev = -1;
  s->table[h] = s->nnodes + 1;
  *idx = s->nnodes++;
  *added = true;
  return WEFT_OK;
}

static bool heap_less(const heap_item *a, const heap_item *b) {
  return a->dist < b->dist || (a->dist == b->dist && a->seq < b->seq);
}

static weft_status heap_push(search *s, double dist, int64_t node_idx) {
  if (s->nheap == s->capheap) {
    int64_t nc = s->capheap ? s->capheap * 2 : 256;
    heap_item *nh = realloc(s->heap, (size_t)nc * sizeof *nh);
    if (!nh) return weft_error(WEFT_ERR_OOM, "planner heap");
    s->heap = nh;
    s->capheap = nc;
  }
  int64_t i = s->nheap++;
  s->heap[i] = (heap_item){dist, s->seq++, node_idx};
  while (i > 0) {
    int64_t p = (i - 1) / 2;
    if (!heap_less(&s->heap[i], &s->heap[p])) break;
    heap_item t = s->heap[i];
    s->heap[i] = s->heap[p];
    s->heap[p] = t;
    i = p;
  }
  return WEFT_OK;
}

static heap_item heap_pop(search *s) {
  heap_item top = s->heap[0];
  s->heap[0] = s->heap[--s->nheap];
  int64_t i = 0;
  for (;;) {
    int64_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < s->nheap && heap_less(&s->heap[l], &s->heap[m])) m = l;
    if (r < s->nheap && heap_less(&s->heap[r], &s->heap[m])) m = r;
    if (m == i) break;
    heap_item t = s->heap[i];
    s->heap[i] = s->heap[m];
    s->heap[m] = t;
    i = m;
  }
  return top;
}

static void search_free(search *s) {
  free(s->nodes);
  free(s->table);
  free(s->heap);
}

static void add_cand(search *s, weft_placement p) {
  if (cand_index(s, p) < 0) s->cand[s->ncand++] = p;
}

static weft_status plan_search(const weft_dtensor_spec *src, const weft_dtensor_spec *dst,
                               dt_plan *plan) {
  memset(plan, 0, sizeof *plan);
  if (dt_placements_equal(src->placements, dst->placements, src->mesh_ndim)) return WEFT_OK;
  search s;
  memset(&s, 0, sizeof s);
  s.k = src->mesh_ndim;
  /* candidates: R, the source's and target's placements, and Shard of every
   * tensor dim either shards */
  add_cand(&s, weft_replicate());
  for (int i = 0; i < s.k; i++) {
    add_cand(&s, src->placements[i]);
    add_cand(&s, dst->placements[i]);
  }
  for (int i = 0; i < s.k; i++) {
    if (weft_placement_is_shard(src->placements[i]))
      add_cand(&s, weft_shard(src->placements[i].dim));
    if (weft_placement_is_shard(dst->placements[i]))
      add_cand(&s, weft_shard(dst->placements[i].dim));
  }
  weft_status st = WEFT_OK;
  int64_t start, goal_idx = -1;
  bool added;
  uint64_t goal = encode(&s, dst->placements);
  WEFT_CHECK_GOTO(node_get(&s, encode(&s, src->placements), &start, &added), st, out);
  s.nodes[start].dist = 0;
  WEFT_CHECK_GOTO(heap_push(&s, 0, start), st, out);
  int64_t expansions = 0;
  while (s.nheap > 0) {
    heap_item h = heap_pop(&s);
    node *cur = &s.nodes[h.node];
    if (cur->done || h.dist > cur->dist) continue;
    cur->done = true;
    if (cur->code == goal) {
      goal_idx = h.node;
      break;
    }
    if (++expansions > DT_MAX_EXPANSIONS) break;
    weft_placement pl[WEFT_MESH_MAX_DIMS];
    decode(&s, cur->code, pl);
    weft_dtensor_spec x = *src;
    memcpy(x.placements, pl, sizeof pl);
    double base = cur->dist;
    for (int i = 0; i < s.k; i++) {
      for (int c = 0; c < s.ncand; c++) {
        weft_placement to = s.cand[c];
        if (weft_placement_equal(to, pl[i])) continue;
        dt_step_kind kind;
        if (!step_kind_of(pl[i], to, &kind)) continue;
        /* Replicate -> Partial only where the target wants that Partial */
        if (kind == DT_STEP_PARTITION && !weft_placement_equal(to, dst->placements[i])) continue;
        weft_dtensor_spec y = x;
        y.placements[i] = to;
        /* no mixing of Partial ops */
        int op = -1;
        bool mixed = false;
        for (int j = 0; j < s.k; j++)
          if (y.placements[j].kind == WEFT_PLACE_PARTIAL) {
            if (op >= 0 && op != (int)y.placements[j].op) mixed = true;
            op = (int)y.placements[j].op;
          }
        if (mixed) continue;
        uint64_t code = encode(&s, y.placements);
        int64_t ni;
        WEFT_CHECK_GOTO(node_get(&s, code, &ni, &added), st, out);
        if (s.nodes[ni].done) continue;
        double nd = base + step_cost(&x, &y, i, kind);
        if (nd >= s.nodes[ni].dist) continue;
        bool ok;
        WEFT_CHECK_GOTO(step_valid(&x, &y, i, kind, &ok), st, out);
        if (!ok) continue;
        s.nodes[ni].dist = nd;
        s.nodes[ni].prev = h.node;
        s.nodes[ni].step = (dt_step){i, kind, pl[i], to};
        WEFT_CHECK_GOTO(heap_push(&s, nd, ni), st, out);
      }
    }
  }
  if (goal_idx < 0) {
    char a[256], b[256];
    weft_placements_describe(src->placements, s.k, a, sizeof a);
    weft_placements_describe(dst->placements, s.k, b, sizeof b);
    st = weft_error(WEFT_ERR_UNSUPPORTED, "no exact redistribution from %s to %s found", a, b);
    goto out;
  }
  {
    int n = 0;
    for (int64_t v = goal_idx; s.nodes[v].prev >= 0; v = s.nodes[v].prev) n++;
    if (n > (int)(sizeof plan->steps / sizeof plan->steps[0])) {
      st = weft_error(WEFT_ERR_UNSUPPORTED, "redistribution plan of %d steps is too long", n);
      goto out;
    }
    plan->nsteps = n;
    plan->cost = s.nodes[goal_idx].dist;
    for (int64_t v = goal_idx; s.nodes[v].prev >= 0; v = s.nodes[v].prev)
      plan->steps[--n] = s.nodes[v].step;
  }
out:
  search_free(&s);
  return st;
}

/* ---------------------------------------------------------------- cache */

#define CACHE_BUCKETS 1024
#define CACHE_MAX_ENTRIES 8192
#define KEY_WORDS (2 + WEFT_MESH_MAX_DIMS * 9 + WEFT_MAX_DIMS)

typedef struct cache_entry {
  int64_t key[KEY_WORDS];
  dt_plan plan;
  struct cache_entry *next;
} cache_entry;

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static cache_entry *cache_tab[CACHE_BUCKETS];
static int64_t cache_hits, cache_misses, cache_entries;

static void place_key(int64_t *k, weft_placement p) {
  k[0] = p.kind;
  k[1] = weft_placement_is_shard(p) ? p.dim : 0;
  k[2] = p.kind == WEFT_PLACE_STRIDED_SHARD ? p.split_factor : 0;
  k[3] = p.kind == WEFT_PLACE_PARTIAL ? p.op : 0;
}

static void make_key(const weft_dtensor_spec *src, const weft_placement *dst, bool allow_partial,
                     int64_t *key) {
  memset(key, 0, KEY_WORDS * sizeof *key);
  int at = 0;
  key[at++] = src->mesh_ndim | (int64_t)src->ndim << 8 | (int64_t)allow_partial << 16;
  key[at++] = (int64_t)weft_dtype_size(src->dtype);
  for (int i = 0; i < src->mesh_ndim; i++) {
    key[at++] = src->mesh_shape[i];
    place_key(&key[at], src->placements[i]);
    at += 4;
    place_key(&key[at], dst[i]);
    at += 4;
  }
  at = 2 + WEFT_MESH_MAX_DIMS * 9;
  for (int d = 0; d < WEFT_MAX_DIMS; d++) key[at++] = d < src->ndim ? src->shape[d] : -1;
}

static uint64_t key_hash(const int64_t *key) {
  uint64_t h = 1469598103934665603ULL;
  for (int i = 0; i < KEY_WORDS; i++) h = hash64(h ^ (uint64_t)key[i]);
  return h;
}

static void cache_clear_locked(void) {
  for (int b = 0; b < CACHE_BUCKETS; b++) {
    cache_entry *e = cache_tab[b];
    while (e) {
      cache_entry *n = e->next;
      free(e);
      e = n;
    }
    cache_tab[b] = NULL;
  }
  cache_entries = 0;
}

weft_plan_cache_stats weft_redistribute_plan_cache_stats(void) {
  pthread_mutex_lock(&cache_mu);
  weft_plan_cache_stats s = {cache_hits, cache_misses, cache_entries};
  pthread_mutex_unlock(&cache_mu);
  return s;
}

void weft_redistribute_plan_cache_clear(void) {
  pthread_mutex_lock(&cache_mu);
  cache_clear_locked();
  cache_hits = cache_misses = 0;
  pthread_mutex_unlock(&cache_mu);
}

weft_status dt_plan_get(const weft_dtensor_spec *src, const weft_placement *dst, bool allow_partial,
                        dt_plan *plan) {
  weft_dtensor_spec dspec;
  WEFT_CHECK(dt_spec_with(src, dst, src->mesh_ndim, &dspec));
  if (!allow_partial) {
    for (int i = 0; i < src->mesh_ndim; i++) {
      if (dspec.placements[i].kind == WEFT_PLACE_PARTIAL &&
          !weft_placement_equal(dspec.placements[i], src->placements[i])) {
        char a[32], b[32];
        weft_placement_describe(src->placements[i], a, sizeof a);
        weft_placement_describe(dspec.placements[i], b, sizeof b);
        return weft_error(WEFT_ERR_INVALID,
                          "mesh dim %d: cannot redistribute from %s to %s: Partial is only a "
                          "valid target where the source already has the same Partial",
                          i, a, b);
      }
    }
  }
  int64_t key[KEY_WORDS];
  make_key(src, dspec.placements, allow_partial, key);
  uint64_t b = key_hash(key) % CACHE_BUCKETS;
  pthread_mutex_lock(&cache_mu);
  for (cache_entry *e = cache_tab[b]; e; e = e->next) {
    if (memcmp(e->key, key, sizeof key) == 0) {
      *plan = e->plan;
      cache_hits++;
      pthread_mutex_unlock(&cache_mu);
      return WEFT_OK;
    }
  }
  cache_misses++;
  pthread_mutex_unlock(&cache_mu);
  weft_status st = plan_search(src, &dspec, plan);
  if (st != WEFT_OK) return weft_error_trace(st, __func__);
  cache_entry *e = malloc(sizeof *e);
  if (!e) return WEFT_OK; /* the plan is still good; just not cached */
  memcpy(e->key, key, sizeof key);
  e->plan = *plan;
  pthread_mutex_lock(&cache_mu);
  if (cache_entries >= CACHE_MAX_ENTRIES) cache_clear_locked();
  e->next = cache_tab[b];
  cache_tab[b] = e;
  cache_entries++;
  pthread_mutex_unlock(&cache_mu);
  return WEFT_OK;
}

weft_status dt_plan_cost(const weft_dtensor_spec *src, const weft_placement *dst,
                         bool allow_partial, double *cost) {
  dt_plan plan;
  WEFT_CHECK(dt_plan_get(src, dst, allow_partial, &plan));
  *cost = plan.cost;
  return WEFT_OK;
}

static weft_coll_kind coll_of(dt_step_kind k) {
  switch (k) {
    case DT_STEP_ALL_GATHER:
      return WEFT_COLL_ALL_GATHER;
    case DT_STEP_ALL_TO_ALL:
      return WEFT_COLL_ALL_TO_ALL;
    case DT_STEP_ALL_REDUCE:
      return WEFT_COLL_ALL_REDUCE;
    case DT_STEP_REDUCE_SCATTER:
      return WEFT_COLL_REDUCE_SCATTER;
    default:
      return WEFT_COLL_KIND_COUNT;
  }
}

weft_status weft_redistribute_plan(const weft_dtensor_spec *src, const weft_placement *placements,
                                   int nplacements, bool allow_partial,
                                   weft_redistribute_step *steps, int cap, int *nsteps,
                                   double *cost) {
  if (!src || !nsteps) return weft_error(WEFT_ERR_INVALID, "NULL argument");
  if (nplacements != src->mesh_ndim)
    return weft_error(WEFT_ERR_INVALID,
                      "%d placements for a %d-dim mesh (need one placement per mesh dim)",
                      nplacements, src->mesh_ndim);
  dt_plan plan;
  WEFT_CHECK(dt_plan_get(src, placements, allow_partial, &plan));
  for (int i = 0; i < plan.nsteps && i < cap && steps; i++) {
    steps[i].mesh_dim = plan.steps[i].mesh_dim;
    steps[i].from = plan.steps[i].from;
    steps[i].to = plan.steps[i].to;
    steps[i].coll = src->mesh_shape[plan.steps[i].mesh_dim] == 1 ? WEFT_COLL_KIND_COUNT
                                                                 : coll_of(plan.steps[i].kind);
  }
  *nsteps = plan.nsteps;
  if (cost) *cost = plan.cost;
  return WEFT_OK;
}
