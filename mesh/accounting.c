/* Comm accounting: per group (root dim, flattened dim, whole mesh) and per
 * collective kind, the calls, payload bytes, bus bytes and seconds of this
 * rank. Seconds: collectives.c reads the clock where a call starts
 * (begin), where a blocking call completes or an async one is handed out
 * (finish), and around weft_work_wait / weft_work_test: one
 * clock_gettime pair per call or wait.
 *
 * Bus bytes follow the nccl-tests convention (doc/PERFORMANCE.md there):
 * what one rank moves in a ring / pairwise algorithm for a payload P over n
 * ranks: all-gather, reduce-scatter, all-to-all P(n-1)/n; all-reduce
 * 2P(n-1)/n; broadcast P. Integer division rounds down (exact whenever P is
 * n equal blocks, as for the even collectives). */
#include "mesh_internal.h"

void weft__account(mesh_dim *d, weft_coll_kind kind, int64_t payload) {
  int64_t n = d->size, bus = 0;
  switch (kind) {
    case WEFT_COLL_ALL_GATHER:
    case WEFT_COLL_REDUCE_SCATTER:
    case WEFT_COLL_ALL_TO_ALL:
      bus = payload / n * (n - 1) + payload % n * (n - 1) / n;
      break;
    case WEFT_COLL_ALL_REDUCE:
      bus = 2 * (payload / n * (n - 1)) + 2 * (payload % n) * (n - 1) / n;
      break;
    case WEFT_COLL_BROADCAST:
      bus = payload;
      break;
    default:
      bus = 0;
  }
  weft_comm_count *c = &d->stats[kind];
  c->calls++;
  c->bytes += payload;
  c->bus_bytes += bus;
}

void weft__account_seconds(mesh_dim *d, int64_t kind, double seconds) {
  if (!d || kind < 0 || kind >= WEFT_COLL_KIND_COUNT || !(seconds > 0)) return;
  d->stats[kind].seconds += seconds;
}

weft_comm_count weft_comm_stats(const weft_mesh *mesh, int dim, weft_coll_kind kind) {
  weft_comm_count zero = {0};
  if (!mesh || (unsigned)kind >= WEFT_COLL_KIND_COUNT) return zero;
  const weft_mesh *root = mesh->root;
  if (dim == -1) {
    /* the row of the group spanning the mesh (weft_mesh_comm's), if any */
    const mesh_dim *g = weft__mesh_whole(mesh);
    return g ? g->stats[kind] : zero;
  }
  if (dim < 0 || dim >= mesh->ndim) return zero;
  return root->dims[mesh->dim_id[dim]]->stats[kind];
}

weft_comm_count weft_comm_stats_dim(const weft_mesh *mesh, int dim) {
  weft_comm_count sum = {0};
  for (int k = 0; k < WEFT_COLL_KIND_COUNT; k++) {
    weft_comm_count c = weft_comm_stats(mesh, dim, (weft_coll_kind)k);
    sum.calls += c.calls;
    sum.bytes += c.bytes;
    sum.bus_bytes += c.bus_bytes;
    sum.seconds += c.seconds;
  }
  return sum;
}

void weft_comm_stats_reset(weft_mesh *mesh) {
  if (!mesh) return;
  weft_mesh *root = mesh->root;
  for (int i = 0; i < root->ndims_all; i++)
    for (int k = 0; k < WEFT_COLL_KIND_COUNT; k++) root->dims[i]->stats[k] = (weft_comm_count){0};
  for (int k = 0; k < WEFT_COLL_KIND_COUNT; k++) root->whole.stats[k] = (weft_comm_count){0};
}
