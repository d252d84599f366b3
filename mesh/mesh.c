/* The N-dimensional DeviceMesh: layout, groups, sub-meshes, flattening.
 *
 * Layout (torch.distributed.DeviceMesh): mesh rank r has coordinates
 * unravel(r, shape) row-major, i.e. the mesh is arange(prod(shape)).view(shape)
 * and mesh rank r is rank r of the (duplicated) creating communicator. The
 * group of dim d through a rank is the ranks whose coordinates differ from it
 * only in d, ordered by that coordinate. A flattened dim over root dims
 * (s0, ..., sk) groups the ranks that differ only in those dims; its
 * coordinate is the row-major index of (c[s0], ..., c[sk]).
 *
 * Communicators are made once, without blocking MPI collectives where it
 * can be helped: MPICH 4.0.2's blocking calls busy-poll, and on 8 ranks
 * over 2 cores one MPI_Comm_split cost ~80 ms against ~15 ms for
 * MPI_Comm_create_group over a 2-rank group and ~5 ms for an MPI_Comm_idup
 * waited with backoff. weft_mesh_create_ordered reorders the world with one
 * MPI_Comm_create_group over all ranks (MPI has no nonblocking form; the
 * ranks are computed locally, so no MPI_Comm_split), after a nonblocking
 * agreement on the arguments so that every rank is known to be there.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_comm.h"
#include "mesh_internal.h"

enum { TAG_ROOT_DIM = 100, TAG_FLAT_DIM = 200, TAG_ORDERED = 300 };

void weft__format_ranks(const int *ranks, int n, char *buf, size_t cap) {
  if (cap == 0) return;
  buf[0] = '\0';
  if (n == 0) {
    snprintf(buf, cap, "(none)");
    return;
  }
  size_t len = 0;
  for (int i = 0; i < n; i++) {
    if (len + 16 >= cap) {
      snprintf(buf + len, cap - len, ", ...");
      return;
    }
    len += (size_t)snprintf(buf + len, cap - len, "%s%d", i ? ", " : "", ranks[i]);
  }
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) {
    h ^= b[i];
    h *= 1099511628211ull;
  }
  return h;
}
#define FNV_INIT 14695981039346656037ull

static weft_status mpi_fail(int rc, const char *func, const char *call) {
  char s[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  MPI_Error_string(rc, s, &len);
  return weft_error_at(WEFT_ERR_MPI, func, "%s failed: %s", call, s);
}

/* ------------------------------------------------------------- layout */

static void unravel(int r, int ndim, const int *shape, int *coord) {
  for (int d = ndim - 1; d >= 0; d--) {
    coord[d] = r % shape[d];
    r /= shape[d];
  }
}

static int ravel(int ndim, const int *shape, const int *coord) {
  int r = 0;
  for (int d = 0; d < ndim; d++) r = r * shape[d] + coord[d];
  return r;
}

/* Mesh ranks of the group spanning root dims src[0..nsrc) through this
 * rank, in flattened-coordinate order; *coord is this rank's position. */
static int *group_members(const weft_mesh *root, int nsrc, const int *src, int *size, int *coord) {
  int mine[WEFT_MESH_MAX_DIMS], c[WEFT_MESH_MAX_DIMS];
  unravel(root->rank, root->ndim, root->shape, mine);
  int n = 1, me = 0;
  for (int i = 0; i < nsrc; i++) {
    n *= root->shape[src[i]];
    me = me * root->shape[src[i]] + mine[src[i]];
  }
  int *m = malloc((size_t)n * sizeof *m);
  if (!m) return NULL;
  for (int f = 0; f < n; f++) {
    memcpy(c, mine, sizeof c);
    int t = f;
    for (int i = nsrc - 1; i >= 0; i--) {
      c[src[i]] = t % root->shape[src[i]];
      t /= root->shape[src[i]];
    }
    m[f] = ravel(root->ndim, root->shape, c);
  }
  *size = n;
  *coord = me;
  return m;
}

static mesh_dim *dim_new(void) {
  mesh_dim *d = calloc(1, sizeof *d);
  if (d) {
    d->comm = MPI_COMM_NULL;
    d->ctl = MPI_COMM_NULL;
  }
  return d;
}

static void comm_free(MPI_Comm *c) {
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin && *c != MPI_COMM_NULL) MPI_Comm_free(c);
  *c = MPI_COMM_NULL;
}

static void dim_free(mesh_dim *d) {
  if (!d) return;
  weft__device_dim_free(d); /* NCCL communicator, if one was made */
  comm_free(&d->comm);
  comm_free(&d->ctl);
  free(d->members);
  free(d);
}

/* Makes d->comm over the mesh ranks mranks[0..n) of root (in that order).
 * Only the group's members call this. */
static weft_status make_group_comm(weft_mesh *root, mesh_dim *d, const int *mranks, int n,
                                   int tag) {
  int rc;
  bool identity = n == root->size;
  for (int i = 0; identity && i < n; i++) identity = mranks[i] == i;
  if (n == 1) {
    rc = MPI_Comm_dup(MPI_COMM_SELF, &d->comm); /* local */
    if (rc != MPI_SUCCESS) return mpi_fail(rc, __func__, "MPI_Comm_dup");
  } else if (identity) {
    MPI_Request req;
    rc = MPI_Comm_idup(root->comm, &d->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, __func__, "MPI_Comm_idup");
    weft_status st = weft__wait_all(1, &req, weft__rt.settings.timeout_s);
    if (st == WEFT_ERR_TIMEOUT)
      return weft_error(st,
                        "creating the communicator of mesh dim '%s': not every rank "
                        "arrived within %g s",
                        d->name, weft__rt.settings.timeout_s);
    if (st) return st;
  } else {
    MPI_Group all, g;
    MPI_Comm_group(root->comm, &all);
    MPI_Group_incl(all, n, mranks, &g);
    rc = MPI_Comm_create_group(root->comm, g, tag, &d->comm);
    MPI_Group_free(&g);
    MPI_Group_free(&all);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, __func__, "MPI_Comm_create_group");
  }
  MPI_Comm_set_errhandler(d->comm, MPI_ERRORS_RETURN);
  return WEFT_OK;
}

/* Makes the control communicators of groups ds[0..n) (nonblocking dups). */
static weft_status make_ctl_comms(mesh_dim **ds, int n) {
  MPI_Request reqs[WEFT_MESH_MAX_DIMS + 1];
  for (int i = 0; i < n; i++) {
    int rc = MPI_Comm_idup(ds[i]->comm, &ds[i]->ctl, &reqs[i]);
    if (rc != MPI_SUCCESS) {
      for (int j = 0; j < i; j++) MPI_Wait(&reqs[j], MPI_STATUS_IGNORE);
      return mpi_fail(rc, __func__, "MPI_Comm_idup");
    }
  }
  weft_status st = weft__wait_all(n, reqs, weft__rt.settings.timeout_s);
  if (st == WEFT_ERR_TIMEOUT)
    return weft_error(st,
                      "creating mesh control communicators: not every rank arrived within "
                      "%g s",
                      weft__rt.settings.timeout_s);
  if (st) return st;
  for (int i = 0; i < n; i++) MPI_Comm_set_errhandler(ds[i]->ctl, MPI_ERRORS_RETURN);
  return WEFT_OK;
}

/* Every rank of comm contributes h; all must be equal. Used to check that
 * every rank called the same mesh-building function with the same
 * arguments (so the blocking communicator creation that follows cannot
 * hang). Same verdict on every rank. */
static weft_status agree(MPI_Comm comm, const int *world_of, uint64_t h, const char *what,
                         const char *func) {
  int n;
  MPI_Comm_size(comm, &n);
  uint64_t *all = malloc((size_t)n * sizeof *all);
  if (!all) return weft_error_at(WEFT_ERR_OOM, func, "no memory for %d hashes", n);
  MPI_Request req;
  int rc = MPI_Iallgather(&h, 8, MPI_BYTE, all, 8, MPI_BYTE, comm, &req);
  if (rc != MPI_SUCCESS) {
    free(all);
    return mpi_fail(rc, func, "MPI_Iallgather");
  }
  weft_status st = weft__wait_all(1, &req, weft__rt.settings.timeout_s);
  if (st == WEFT_ERR_TIMEOUT) {
    /* the buffer may still be written: leak it rather than free it */
    return weft_error_at(st, func, "not every rank called %s within %g s", what,
                         weft__rt.settings.timeout_s);
  }
  if (st) {
    free(all);
    return st;
  }
  int bad[8], nbad = 0, more = 0;
  for (int r = 0; r < n; r++)
    if (all[r] != all[0]) {
      if (nbad < 8)
        bad[nbad++] = world_of ? world_of[r] : r;
      else
        more++;
    }
  free(all);
  if (!nbad) return WEFT_OK;
  char rs[128];
  weft__format_ranks(bad, nbad, rs, sizeof rs);
  return weft_error_at(WEFT_ERR_MISMATCH, func,
                       "ranks called %s with different arguments: world ranks %s%s differ "
                       "from world rank %d",
                       what, rs, more ? ", ..." : "", world_of ? world_of[0] : 0);
}

/* ------------------------------------------------------------- create */

static weft_status check_name(const char *name, const char *what, int i) {
  if (!name) return weft_error(WEFT_ERR_INVALID, "%s %d is NULL", what, i);
  if (!name[0]) return weft_error(WEFT_ERR_INVALID, "%s %d is empty", what, i);
  if (strlen(name) >= WEFT_MESH_NAME_MAX)
    return weft_error(WEFT_ERR_INVALID, "%s %d ('%.40s...') is longer than %d characters", what, i,
                      name, WEFT_MESH_NAME_MAX - 1);
  return WEFT_OK;
}

/* All checks that need no communication (every rank sees the same args). */
static weft_status check_args(int ndim, const int *shape, const char *const *names,
                              int group_size) {
  if (ndim < 1 || ndim > WEFT_MESH_MAX_DIMS)
    return weft_error(WEFT_ERR_INVALID, "ndim %d outside 1..%d", ndim, WEFT_MESH_MAX_DIMS);
  if (!shape) return weft_error(WEFT_ERR_INVALID, "shape is NULL");
  if (!names) return weft_error(WEFT_ERR_INVALID, "names is NULL");
  char desc[128] = "";
  size_t len = 0;
  int64_t prod = 1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 1)
      return weft_error(WEFT_ERR_INVALID, "shape[%d] = %d (sizes must be >= 1)", d, shape[d]);
    if (prod <= INT32_MAX) prod *= shape[d];
    len += (size_t)snprintf(desc + len, sizeof desc - len, "%s%d", d ? "x" : "", shape[d]);
    if (len >= sizeof desc) len = sizeof desc - 1;
  }
  for (int d = 0; d < ndim; d++) {
    WEFT_CHECK(check_name(names[d], "dim name", d));
    for (int e = 0; e < d; e++)
      if (strcmp(names[d], names[e]) == 0)
        return weft_error(WEFT_ERR_INVALID, "dim name '%s' repeated (dims %d and %d)", names[d], e,
                          d);
  }
  if (prod != group_size) {
    if (prod > INT32_MAX)
      return weft_error(WEFT_ERR_INVALID, "product of shape (%s) overflows != group size %d", desc,
                        group_size);
    return weft_error(WEFT_ERR_INVALID, "product of shape (%s=%" PRId64 ") != group size %d", desc,
                      prod, group_size);
  }
  return WEFT_OK;
}

/* Hash of a mesh-creation call's arguments (order: NULL to leave out),
 * safe on bad arguments (NULL arrays, ndim out of range). */
static uint64_t args_hash(int ndim, const int *shape, const char *const *names, const int *order) {
  uint64_t h = fnv1a(FNV_INIT, &ndim, sizeof ndim);
  for (int d = 0; d < ndim && d < WEFT_MESH_MAX_DIMS; d++) {
    int sz = shape ? shape[d] : -1;
    h = fnv1a(h, &sz, sizeof sz);
    if (order) h = fnv1a(h, &order[d], sizeof order[d]);
    const char *nm = names && names[d] ? names[d] : "\x01(null)";
    h = fnv1a(h, nm, strnlen(nm, WEFT_MESH_NAME_MAX + 1) + 1);
  }
  return h;
}

/* Releases the communicators of a root mesh (its dims' MPI and device
 * communicators and its own), keeping the tables that name and lay out its
 * ranks: a destroyed mesh still describes itself. */
static void root_release_comms(weft_mesh *m) {
  for (int i = 0; i < m->ndims_all; i++) {
    weft__device_dim_free(m->dims[i]);
    comm_free(&m->dims[i]->comm);
    comm_free(&m->dims[i]->ctl);
  }
  comm_free(&m->whole.ctl);
  m->whole.comm = MPI_COMM_NULL; /* == m->comm */
  comm_free(&m->comm);
}

/* Destroyed meshes: kept until weft_finalize (weft__mesh_free_destroyed). */
static weft_mesh *destroyed;

static void bury(weft_mesh *m) {
  m->magic = WEFT_MESH_DEAD;
  m->dead = destroyed;
  destroyed = m;
}

static void root_free(weft_mesh *m) {
  if (!m) return;
  for (int i = 0; i < m->ndims_all; i++) dim_free(m->dims[i]);
  free(m->dims);
  comm_free(&m->whole.ctl);
  m->whole.comm = MPI_COMM_NULL; /* == m->comm */
  free(m->whole.members);
  comm_free(&m->comm);
  free(m->world_of);
  free(m);
}

/* Appends a group to the root's table (stable pointer). */
static weft_status root_add_dim(weft_mesh *root, mesh_dim *d) {
  if (root->ndims_all == root->dims_cap) {
    int cap = root->dims_cap ? 2 * root->dims_cap : 16;
    mesh_dim **nd = realloc(root->dims, (size_t)cap * sizeof *nd);
    if (!nd) return weft_error(WEFT_ERR_OOM, "no memory for the mesh dim table");
    root->dims = nd;
    root->dims_cap = cap;
  }
  root->dims[root->ndims_all++] = d;
  return WEFT_OK;
}

/* Builds the group over root dims src[0..nsrc) named `name` (comm, ctl,
 * members) and appends it to the root's table. */
static weft_status add_group(weft_mesh *root, const char *name, int nsrc, const int *src, int tag,
                             mesh_dim **out) {
  mesh_dim *d = dim_new();
  if (!d) return weft_error(WEFT_ERR_OOM, "no memory for mesh dim '%s'", name);
  snprintf(d->name, sizeof d->name, "%s", name);
  d->nsrc = nsrc;
  memcpy(d->src, src, (size_t)nsrc * sizeof *src);
  int *mranks = group_members(root, nsrc, src, &d->size, &d->coord);
  weft_status st = WEFT_OK;
  if (!mranks || !(d->members = malloc((size_t)d->size * sizeof *d->members))) {
    st = weft_error(WEFT_ERR_OOM, "no memory for the members of mesh dim '%s'", name);
    goto fail;
  }
  for (int i = 0; i < d->size; i++) d->members[i] = root->world_of[mranks[i]];
  WEFT_CHECK_GOTO(weft__node_facts(d->members, d->size, &d->nodes, &d->whole_nodes), st, fail);
  WEFT_CHECK_GOTO(make_group_comm(root, d, mranks, d->size, tag), st, fail);
  WEFT_CHECK_GOTO(make_ctl_comms(&d, 1), st, fail);
  WEFT_CHECK_GOTO(root_add_dim(root, d), st, fail);
  free(mranks);
  *out = d;
  return WEFT_OK;
fail:
  free(mranks);
  dim_free(d);
  return st;
}

weft_status weft_mesh_create_from_comm(MPI_Comm comm, int ndim, const int *shape,
                                       const char *const *names, weft_mesh **out) {
  WEFT_CHECK(weft__require_init(__func__));
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  *out = NULL;
  if (comm == MPI_COMM_NULL) return weft_error(WEFT_ERR_INVALID, "comm is MPI_COMM_NULL");
  int inter = 0;
  MPI_Comm_test_inter(comm, &inter);
  if (inter) return weft_error(WEFT_ERR_INVALID, "comm is an intercommunicator");
  int gsize;
  MPI_Comm_size(comm, &gsize);

  weft_mesh *m = calloc(1, sizeof *m);
  if (!m) return weft_error(WEFT_ERR_OOM, "no memory for a mesh");
  m->magic = WEFT_MESH_LIVE;
  m->root = m;
  m->comm = MPI_COMM_NULL;
  m->whole.comm = m->whole.ctl = MPI_COMM_NULL;
  weft_status st = WEFT_OK;

  MPI_Request req;
  int rc = MPI_Comm_idup(comm, &m->comm, &req);
  if (rc != MPI_SUCCESS) {
    free(m);
    WEFT_CHECK(mpi_fail(rc, __func__, "MPI_Comm_idup"));
    return WEFT_OK;
  }
  st = weft__wait_all(1, &req, weft__rt.settings.timeout_s);
  if (st == WEFT_ERR_TIMEOUT) {
    free(m); /* the duplicate may still complete: leak it, not the mesh */
    return weft_error(st, "not every rank of the communicator called weft_mesh_create within %g s",
                      weft__rt.settings.timeout_s);
  }
  if (st) {
    free(m);
    return st;
  }
  MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(m->comm, &m->rank);
  m->size = gsize;

  /* world rank of every mesh rank (local: group translation) */
  m->world_of = malloc((size_t)gsize * sizeof *m->world_of);
  int *ids = malloc((size_t)gsize * sizeof *ids);
  if (!m->world_of || !ids) {
    free(ids);
    root_free(m);
    return weft_error(WEFT_ERR_OOM, "no memory for a mesh of %d ranks", gsize);
  }
  MPI_Group g, wg;
  MPI_Comm_group(m->comm, &g);
  MPI_Comm_group(MPI_COMM_WORLD, &wg);
  for (int i = 0; i < gsize; i++) ids[i] = i;
  MPI_Group_translate_ranks(g, gsize, ids, wg, m->world_of);
  MPI_Group_free(&g);
  MPI_Group_free(&wg);
  free(ids);

  /* note: the arguments are compared across ranks before they are
   * checked, so that a rank with other arguments makes every rank fail
   * (WEFT_ERR_MISMATCH) instead of leaving the others waiting. */
  uint64_t h = args_hash(ndim, shape, names, NULL);
  WEFT_CHECK_GOTO(agree(m->comm, m->world_of, h, "weft_mesh_create", __func__), st, fail);
  WEFT_CHECK_GOTO(check_args(ndim, shape, names, gsize), st, fail);
  m->ndim = ndim;
  memcpy(m->shape, shape, (size_t)ndim * sizeof *shape);
  for (int d = 0; d < ndim; d++) m->dim_id[d] = d;

  for (int d = 0; d < ndim; d++) {
    mesh_dim *dd;
    WEFT_CHECK_GOTO(add_group(m, names[d], 1, &d, TAG_ROOT_DIM + d, &dd), st, fail);
  }
  m->whole.comm = m->comm;
  m->whole.size = gsize;
  m->whole.coord = m->rank;
  m->whole.nsrc = ndim;
  for (int d = 0; d < ndim; d++) m->whole.src[d] = d;
  snprintf(m->whole.name, sizeof m->whole.name, "(whole mesh)");
  m->whole.members = malloc((size_t)gsize * sizeof *m->whole.members);
  if (!m->whole.members) {
    st = weft_error(WEFT_ERR_OOM, "no memory for a mesh of %d ranks", gsize);
    goto fail;
  }
  memcpy(m->whole.members, m->world_of, (size_t)gsize * sizeof *m->world_of);
  WEFT_CHECK_GOTO(weft__node_facts(m->whole.members, gsize, &m->whole.nodes, &m->whole.whole_nodes),
                  st, fail);
  mesh_dim *wp = &m->whole;
  WEFT_CHECK_GOTO(make_ctl_comms(&wp, 1), st, fail);
  *out = m;
  return WEFT_OK;
fail:
  root_free(m);
  return st;
}

weft_status weft_mesh_create(int ndim, const int *shape, const char *const *names,
                             weft_mesh **out) {
  WEFT_CHECK(weft__require_init(__func__));
  WEFT_CHECK(weft_mesh_create_from_comm(MPI_COMM_WORLD, ndim, shape, names, out));
  return WEFT_OK;
}

/* order must list every dim of 0..ndim-1 once (ndim already checked). */
static weft_status check_order(int ndim, const int *order) {
  if (!order) return weft_error(WEFT_ERR_INVALID, "order is NULL");
  bool seen[WEFT_MESH_MAX_DIMS] = {false};
  for (int i = 0; i < ndim; i++) {
    if (order[i] < 0 || order[i] >= ndim)
      return weft_error(WEFT_ERR_INVALID,
                        "order[%d] = %d is not a dim of the mesh (expected a permutation of "
                        "0..%d)",
                        i, order[i], ndim - 1);
    if (seen[order[i]])
      return weft_error(WEFT_ERR_INVALID,
                        "order[%d] = %d repeats a dim (expected a permutation of 0..%d)", i,
                        order[i], ndim - 1);
    seen[order[i]] = true;
  }
  return WEFT_OK;
}

/* Mesh rank of world rank w when the dims are laid out slowest-first in
 * `order`: w unravels over the reordered shape, the coordinates go back
 * to their dims, and the mesh rank is row-major over the mesh's dims. */
static int ordered_mesh_rank(int w, int ndim, const int *shape, const int *order) {
  int coord[WEFT_MESH_MAX_DIMS];
  for (int i = ndim - 1; i >= 0; i--) {
    coord[order[i]] = w % shape[order[i]];
    w /= shape[order[i]];
  }
  return ravel(ndim, shape, coord);
}

weft_status weft_mesh_create_ordered(int ndim, const int *shape, const char *const *names,
                                     const int *order, weft_mesh **out) {
  WEFT_CHECK(weft__require_init(__func__));
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  *out = NULL;
  /* compare first (as weft_mesh_create_from_comm does), then check: same
   * verdict on every rank, and no rank enters the blocking
   * MPI_Comm_create_group unless every rank got this far */
  uint64_t h = args_hash(ndim, shape, names, order);
  int has_order = order != NULL; /* a NULL order hashes apart from an empty one */
  h = fnv1a(h, &has_order, sizeof has_order);
  WEFT_CHECK(agree(MPI_COMM_WORLD, NULL, h, "weft_mesh_create_ordered", __func__));
  int wsize = weft__rt.world_size;
  WEFT_CHECK(check_args(ndim, shape, names, wsize));
  WEFT_CHECK(check_order(ndim, order));
  bool identity = true;
  for (int i = 0; i < ndim; i++) identity = identity && order[i] == i;
  if (identity) {
    WEFT_CHECK(weft_mesh_create_from_comm(MPI_COMM_WORLD, ndim, shape, names, out));
    return WEFT_OK;
  }
  /* world rank of every mesh rank, computed alike on every rank */
  int *world_of = malloc((size_t)wsize * sizeof *world_of);
  if (!world_of) return weft_error(WEFT_ERR_OOM, "no memory for a mesh of %d ranks", wsize);
  for (int w = 0; w < wsize; w++) world_of[ordered_mesh_rank(w, ndim, shape, order)] = w;
  MPI_Group all, g;
  MPI_Comm_group(MPI_COMM_WORLD, &all);
  MPI_Group_incl(all, wsize, world_of, &g);
  MPI_Comm comm = MPI_COMM_NULL;
  int rc = MPI_Comm_create_group(MPI_COMM_WORLD, g, TAG_ORDERED, &comm);
  MPI_Group_free(&g);
  MPI_Group_free(&all);
  free(world_of);
  if (rc != MPI_SUCCESS) WEFT_CHECK(mpi_fail(rc, __func__, "MPI_Comm_create_group"));
  weft_status st = weft_mesh_create_from_comm(comm, ndim, shape, names, out);
  comm_free(&comm);
  WEFT_CHECK(st);
  return WEFT_OK;
}

void weft__mesh_free_destroyed(void) {
  /* the sub-meshes first: each may point at a destroyed root */
  weft_mesh **p = &destroyed;
  while (*p) {
    weft_mesh *m = *p;
    if (m->root != m) {
      *p = m->dead;
      free(m);
    } else {
      p = &m->dead;
    }
  }
  while (destroyed) {
    weft_mesh *m = destroyed;
    destroyed = m->dead;
    root_free(m);
  }
}

weft_status weft_mesh_destroy(weft_mesh *mesh) {
  if (!mesh) return WEFT_OK;
  if (mesh->magic == WEFT_MESH_DEAD)
    return weft_error(WEFT_ERR_INVALID,
                      "weft_mesh_destroy: this mesh was already destroyed (destroyed twice?)");
  if (mesh->magic != WEFT_MESH_LIVE)
    return weft_error(WEFT_ERR_INVALID, "weft_mesh_destroy: not a mesh (bad pointer)");
  if (mesh->refs > 0)
    return weft_error(WEFT_ERR_BUSY, "mesh is still retained %d time(s) (weft_mesh_release first)",
                      mesh->refs);
  weft_mesh *root = mesh->root;
  if (mesh != root) {
    root->nsubs--;
    bury(mesh);
    return WEFT_OK;
  }
  if (root->nsubs > 0)
    return weft_error(WEFT_ERR_BUSY, "mesh still has %d live sub-mesh(es) or flattened mesh(es)",
                      root->nsubs);
  if (root->inflight > 0)
    return weft_error(WEFT_ERR_BUSY, "mesh still has %d async collective(s) in flight",
                      root->inflight);
  root_release_comms(root);
  bury(root);
  return WEFT_OK;
}

void weft_mesh_retain(weft_mesh *mesh) {
  if (mesh) mesh->refs++;
}
void weft_mesh_release(weft_mesh *mesh) {
  if (mesh && mesh->refs > 0) mesh->refs--;
}

/* ------------------------------------------------------------ queries */

int weft_mesh_ndim(const weft_mesh *mesh) { return mesh ? mesh->ndim : 0; }

int weft_mesh_size(const weft_mesh *mesh) {
  if (!mesh) return 0;
  int n = 1;
  for (int d = 0; d < mesh->ndim; d++) n *= mesh->shape[d];
  return n;
}

int weft_mesh_dim_size(const weft_mesh *mesh, int dim) {
  if (!mesh || dim < 0 || dim >= mesh->ndim) return 0;
  return mesh->shape[dim];
}

const char *weft_mesh_dim_name(const weft_mesh *mesh, int dim) {
  if (!mesh || dim < 0 || dim >= mesh->ndim) return NULL;
  return mesh->root->dims[mesh->dim_id[dim]]->name;
}

/* "dp, tp" into buf */
static void list_dims(const weft_mesh *mesh, char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = '\0';
  for (int d = 0; d < mesh->ndim && len < cap; d++)
    len +=
        (size_t)snprintf(buf + len, cap - len, "%s%s", d ? ", " : "", weft_mesh_dim_name(mesh, d));
}

weft_status weft_mesh_dim_index(const weft_mesh *mesh, const char *name, int *dim) {
  if (!mesh) return weft_error(WEFT_ERR_INVALID, "mesh is NULL");
  if (!name) return weft_error(WEFT_ERR_INVALID, "name is NULL");
  for (int d = 0; d < mesh->ndim; d++)
    if (strcmp(weft_mesh_dim_name(mesh, d), name) == 0) {
      if (dim) *dim = d;
      return WEFT_OK;
    }
  char dims[WEFT_MESH_MAX_DIMS * (WEFT_MESH_NAME_MAX + 2)];
  list_dims(mesh, dims, sizeof dims);
  const weft_mesh *root = mesh->root;
  for (int i = root->ndim; i < root->ndims_all; i++)
    if (strcmp(root->dims[i]->name, name) == 0)
      return weft_error(WEFT_ERR_NOT_FOUND,
                        "'%s' is a flattened dim, not a dim of this mesh (%s): take "
                        "weft_mesh_submesh(mesh, 1, {\"%s\"}) to use it",
                        name, dims, name);
  return weft_error(WEFT_ERR_NOT_FOUND, "no dim named '%s' in mesh (%s)", name, dims);
}

int weft_mesh_coord(const weft_mesh *mesh, int dim) {
  if (!mesh || dim < 0 || dim >= mesh->ndim) return -1;
  return mesh->root->dims[mesh->dim_id[dim]]->coord;
}

int weft_mesh_rank(const weft_mesh *mesh) {
  if (!mesh) return -1;
  int r = 0;
  for (int d = 0; d < mesh->ndim; d++) r = r * mesh->shape[d] + weft_mesh_coord(mesh, d);
  return r;
}

int weft_mesh_world_rank_of(const weft_mesh *mesh, const int *coords) {
  if (!mesh || !coords) return -1;
  const weft_mesh *root = mesh->root;
  int c[WEFT_MESH_MAX_DIMS];
  unravel(root->rank, root->ndim, root->shape, c);
  for (int d = 0; d < mesh->ndim; d++) {
    if (coords[d] < 0 || coords[d] >= mesh->shape[d]) return -1;
    const mesh_dim *g = root->dims[mesh->dim_id[d]];
    int t = coords[d];
    for (int i = g->nsrc - 1; i >= 0; i--) {
      c[g->src[i]] = t % root->shape[g->src[i]];
      t /= root->shape[g->src[i]];
    }
  }
  return root->world_of[ravel(root->ndim, root->shape, c)];
}

bool weft_mesh_same_ranks(const weft_mesh *a, const weft_mesh *b) {
  if (a == b) return true;
  if (!a || !b || a->ndim != b->ndim) return false;
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d]) return false;
  int n = weft_mesh_size(a), c[WEFT_MESH_MAX_DIMS];
  for (int r = 0; r < n; r++) {
    unravel(r, a->ndim, a->shape, c);
    if (weft_mesh_world_rank_of(a, c) != weft_mesh_world_rank_of(b, c)) return false;
  }
  return true;
}

void weft_mesh_describe(const weft_mesh *mesh, char *buf, size_t cap) {
  if (!buf || cap == 0) return;
  if (!mesh) {
    snprintf(buf, cap, "(null mesh)");
    return;
  }
  size_t len = (size_t)snprintf(buf, cap, "mesh (");
  for (int d = 0; d < mesh->ndim && len < cap; d++)
    len += (size_t)snprintf(buf + len, cap - len, "%s%s=%d", d ? ", " : "",
                            weft_mesh_dim_name(mesh, d), mesh->shape[d]);
  if (len < cap) len += (size_t)snprintf(buf + len, cap - len, "): ");
  int n = weft_mesh_size(mesh), c[WEFT_MESH_MAX_DIMS];
  for (int r = 0; r < n && len < cap; r++) {
    unravel(r, mesh->ndim, mesh->shape, c);
    /* open one bracket per trailing dim that starts here, close after */
    int open = 0;
    for (int d = mesh->ndim - 1; d >= 0 && c[d] == 0; d--) open++;
    int close = 0;
    for (int d = mesh->ndim - 1; d >= 0 && c[d] == mesh->shape[d] - 1; d--) close++;
    len += (size_t)snprintf(buf + len, cap - len, "%s%.*s%d%.*s", r ? ", " : "", open, "[[[[[[[[",
                            weft_mesh_world_rank_of(mesh, c), close, "]]]]]]]]");
  }
  if (len >= cap) buf[cap - 1] = '\0';
}

/* ------------------------------------------------------------- device */

weft_status weft_mesh_set_device(weft_mesh *mesh, weft_device dev) {
  if (!mesh) return weft_error(WEFT_ERR_INVALID, "mesh is NULL");
  if (!weft__mesh_live(mesh))
    return weft_error(WEFT_ERR_INVALID, "the mesh was destroyed (weft_mesh_destroy)");
  if (mesh->root != mesh)
    return weft_error(WEFT_ERR_INVALID,
                      "the device belongs to the root mesh: set it there (sub-meshes and "
                      "flattened meshes inherit it)");
  if ((int)dev < 0 || dev >= WEFT_DEVICE_COUNT)
    return weft_error(WEFT_ERR_INVALID, "device %d is not a weft_device", (int)dev);
  weft_status st = agree(mesh->comm, mesh->world_of, fnv1a(0xcbf29ce484222325ULL, &dev, sizeof dev),
                         "weft_mesh_set_device", __func__);
  if (st) return st;
  weft_status mine = WEFT_OK;
  if (dev != WEFT_CPU && weft_device_current(dev) < 0)
    mine = weft_device_init(dev, weft_local_rank(), NULL);
  st = weft_agree_status(mesh->comm, mine, NULL, "weft_mesh_set_device", NULL);
  if (st) return st;
  mesh->device = dev;
  return WEFT_OK;
}

weft_device weft_mesh_device(const weft_mesh *mesh) { return mesh ? mesh->root->device : WEFT_CPU; }

/* ---------------------------------------------------- groups for collectives */

mesh_dim *weft__mesh_group(const weft_mesh *mesh, int dim, const char *func) {
  if (!mesh) {
    weft_error_at(WEFT_ERR_INVALID, func, "mesh is NULL");
    return NULL;
  }
  if (!weft__mesh_live(mesh)) {
    weft_error_at(WEFT_ERR_INVALID, func, "the mesh was destroyed (weft_mesh_destroy)");
    return NULL;
  }
  if (dim < 0 || dim >= mesh->ndim) {
    char dims[WEFT_MESH_MAX_DIMS * (WEFT_MESH_NAME_MAX + 2)];
    list_dims(mesh, dims, sizeof dims);
    weft_error_at(WEFT_ERR_INVALID, func, "dim %d out of range for a %d-D mesh (%s)", dim,
                  mesh->ndim, dims);
    return NULL;
  }
  return mesh->root->dims[mesh->dim_id[dim]];
}

/* Root dims spanned by mesh's dims, in order; returns their count. */
static int expand_src(const weft_mesh *mesh, int *src) {
  int k = 0;
  for (int d = 0; d < mesh->ndim; d++) {
    const mesh_dim *g = mesh->root->dims[mesh->dim_id[d]];
    for (int i = 0; i < g->nsrc; i++) src[k++] = g->src[i];
  }
  return k;
}

mesh_dim *weft__mesh_whole(const weft_mesh *mesh) {
  if (!weft__mesh_live(mesh)) return NULL;
  weft_mesh *root = mesh->root;
  if (mesh == root) return &root->whole;
  if (mesh->ndim == 1) return root->dims[mesh->dim_id[0]];
  int src[WEFT_MESH_MAX_DIMS];
  int k = expand_src(mesh, src);
  bool in_order = k == root->ndim;
  for (int i = 0; in_order && i < k; i++) in_order = src[i] == i;
  if (in_order) return &root->whole;
  for (int i = root->ndim; i < root->ndims_all; i++) {
    const mesh_dim *g = root->dims[i];
    if (g->nsrc == k && memcmp(g->src, src, (size_t)k * sizeof *src) == 0) return root->dims[i];
  }
  return NULL;
}

int weft_mesh_dim_nodes(const weft_mesh *mesh, int dim) {
  mesh_dim *g = weft__mesh_group(mesh, dim, __func__);
  return g ? g->nodes : -1;
}

MPI_Comm weft_mesh_dim_comm(const weft_mesh *mesh, int dim) {
  if (!mesh || dim < 0 || dim >= mesh->ndim) return MPI_COMM_NULL;
  return mesh->root->dims[mesh->dim_id[dim]]->comm;
}

MPI_Comm weft_mesh_comm(const weft_mesh *mesh) {
  mesh_dim *g = weft__mesh_whole(mesh);
  return g ? g->comm : MPI_COMM_NULL;
}

/* --------------------------------------------------- sub-meshes, flattening */

/* Index in root->dims of the group called `name` as seen from mesh: one of
 * mesh's dims, or a flattened dim registered on the root whose root dims
 * all belong to mesh. -1 if none. */
static int lookup(const weft_mesh *mesh, const char *name) {
  const weft_mesh *root = mesh->root;
  for (int d = 0; d < mesh->ndim; d++)
    if (strcmp(root->dims[mesh->dim_id[d]]->name, name) == 0) return mesh->dim_id[d];
  int src[WEFT_MESH_MAX_DIMS];
  int k = expand_src(mesh, src);
  unsigned covered = 0;
  for (int i = 0; i < k; i++) covered |= 1u << src[i];
  for (int i = root->ndim; i < root->ndims_all; i++) {
    const mesh_dim *g = root->dims[i];
    if (strcmp(g->name, name) != 0) continue;
    unsigned need = 0;
    for (int j = 0; j < g->nsrc; j++) need |= 1u << g->src[j];
    if ((need & ~covered) == 0) return i;
  }
  return -1;
}

/* Resolves names to group ids, rejecting unknown, repeated and overlapping
 * dims (a rank cannot sit at two positions along one root dim). */
static weft_status resolve(const weft_mesh *mesh, int n, const char *const *names, int *ids,
                           const char *func) {
  if (!mesh) return weft_error_at(WEFT_ERR_INVALID, func, "mesh is NULL");
  if (!weft__mesh_live(mesh))
    return weft_error_at(WEFT_ERR_INVALID, func, "the mesh was destroyed (weft_mesh_destroy)");
  if (n < 1 || n > WEFT_MESH_MAX_DIMS)
    return weft_error_at(WEFT_ERR_INVALID, func, "n = %d outside 1..%d", n, WEFT_MESH_MAX_DIMS);
  if (!names) return weft_error_at(WEFT_ERR_INVALID, func, "names is NULL");
  const weft_mesh *root = mesh->root;
  unsigned used = 0;
  for (int i = 0; i < n; i++) {
    if (!names[i] || !names[i][0])
      return weft_error_at(WEFT_ERR_INVALID, func, "name %d is %s", i, names[i] ? "empty" : "NULL");
    for (int j = 0; j < i; j++)
      if (strcmp(names[i], names[j]) == 0)
        return weft_error_at(WEFT_ERR_INVALID, func, "dim '%s' named twice", names[i]);
    ids[i] = lookup(mesh, names[i]);
    if (ids[i] < 0) {
      char dims[WEFT_MESH_MAX_DIMS * (WEFT_MESH_NAME_MAX + 2)];
      list_dims(mesh, dims, sizeof dims);
      return weft_error_at(WEFT_ERR_NOT_FOUND, func, "no dim named '%s' in mesh (%s)", names[i],
                           dims);
    }
    const mesh_dim *g = root->dims[ids[i]];
    unsigned m = 0;
    for (int j = 0; j < g->nsrc; j++) m |= 1u << g->src[j];
    if (m & used)
      return weft_error_at(WEFT_ERR_INVALID, func,
                           "dim '%s' overlaps another named dim (they share a root dim)", names[i]);
    used |= m;
  }
  return WEFT_OK;
}

static weft_status sub_new(weft_mesh *root, int n, const int *ids, weft_mesh **out) {
  weft_mesh *s = calloc(1, sizeof *s);
  if (!s) return weft_error(WEFT_ERR_OOM, "no memory for a sub-mesh");
  s->magic = WEFT_MESH_LIVE;
  s->root = root;
  s->ndim = n;
  s->comm = MPI_COMM_NULL;
  for (int i = 0; i < n; i++) {
    s->dim_id[i] = ids[i];
    s->shape[i] = root->dims[ids[i]]->size;
  }
  root->nsubs++;
  *out = s;
  return WEFT_OK;
}

weft_mesh *weft_mesh_root(const weft_mesh *mesh) { return mesh ? mesh->root : NULL; }

weft_status weft_mesh_submesh(weft_mesh *mesh, int n, const char *const *names, weft_mesh **out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  *out = NULL;
  int ids[WEFT_MESH_MAX_DIMS];
  WEFT_CHECK(resolve(mesh, n, names, ids, __func__));
  WEFT_CHECK(sub_new(mesh->root, n, ids, out));
  return WEFT_OK;
}

weft_status weft_mesh_flatten(weft_mesh *mesh, int n, const char *const *names,
                              const char *flat_name, weft_mesh **out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  *out = NULL;
  int ids[WEFT_MESH_MAX_DIMS];
  WEFT_CHECK(resolve(mesh, n, names, ids, __func__));
  WEFT_CHECK(check_name(flat_name, "flat_name", 0));
  weft_mesh *root = mesh->root;
  int src[WEFT_MESH_MAX_DIMS], k = 0;
  for (int i = 0; i < n; i++) {
    const mesh_dim *g = root->dims[ids[i]];
    for (int j = 0; j < g->nsrc; j++) src[k++] = g->src[j];
  }
  for (int d = 0; d < root->ndim; d++)
    if (strcmp(root->dims[d]->name, flat_name) == 0)
      return weft_error(WEFT_ERR_INVALID, "flat_name '%s' is already a dim of the root mesh",
                        flat_name);
  for (int i = root->ndim; i < root->ndims_all; i++) {
    const mesh_dim *g = root->dims[i];
    if (strcmp(g->name, flat_name) != 0) continue;
    if (g->nsrc == k && memcmp(g->src, src, (size_t)k * sizeof *src) == 0) {
      WEFT_CHECK(sub_new(root, 1, &i, out));
      return WEFT_OK; /* made before: free */
    }
    char had[WEFT_MESH_MAX_DIMS * (WEFT_MESH_NAME_MAX + 2)] = "";
    size_t len = 0;
    for (int j = 0; j < g->nsrc && len < sizeof had; j++)
      len += (size_t)snprintf(had + len, sizeof had - len, "%s%s", j ? ", " : "",
                              root->dims[g->src[j]]->name);
    return weft_error(WEFT_ERR_INVALID, "flattened dim '%s' already exists over other dims (%s)",
                      flat_name, had);
  }
  /* First time: all ranks of the root agree (so that no group member is
   * missing from the blocking communicator creation), then build it. */
  uint64_t h = fnv1a(FNV_INIT, flat_name, strlen(flat_name) + 1);
  h = fnv1a(h, &k, sizeof k);
  h = fnv1a(h, src, (size_t)k * sizeof *src);
  WEFT_CHECK(agree(root->whole.ctl, root->world_of, h, "weft_mesh_flatten", __func__));
  mesh_dim *g;
  int index = root->ndims_all;
  WEFT_CHECK(add_group(root, flat_name, k, src, TAG_FLAT_DIM + index, &g));
  WEFT_CHECK(sub_new(root, 1, &index, out));
  return WEFT_OK;
}
