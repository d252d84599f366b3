/* dcp/comm.c — DCP's own communicator: a duplicate of the group's, used
 * only through nonblocking calls waited on with mesh's MPI_Test backoff
 * (weft_wait_requests), as docs/DESIGN.md ("MPICH notes") explains for
 * more ranks than cores. Safe to use from the async save thread under MPI_THREAD_MULTIPLE
 * (each save has its own duplicate). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcp_internal.h"

bool dcp_thread_multiple(void) {
  int init = 0, p = MPI_THREAD_SINGLE;
  MPI_Initialized(&init);
  if (!init) return false;
  MPI_Query_thread(&p);
  return p == MPI_THREAD_MULTIPLE;
}

static weft_status mpi_err(int rc, const char *what) {
  char s[MPI_MAX_ERROR_STRING];
  int n = 0;
  MPI_Error_string(rc, s, &n);
  return weft_error(WEFT_ERR_MPI, "checkpoint %s: %s", what, s);
}

/* One implementation of the backoff wait: mesh's (weft_wait_requests). */
weft_status dcp_wait(MPI_Request *r, const char *what) {
  char name[160];
  snprintf(name, sizeof name, "checkpoint %s", what);
  return weft_wait_requests(1, r, name);
}

weft_status dcp_comm_open(const weft_mesh *group, dcp_comm *c) {
  memset(c, 0, sizeof *c);
  c->comm = MPI_COMM_NULL;
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin)
    return weft_error(WEFT_ERR_STATE, "checkpoint: MPI is not initialised (call weft_init first)");
  MPI_Comm base = group ? weft_mesh_comm(group) : MPI_COMM_WORLD;
  if (base == MPI_COMM_NULL)
    return weft_error(WEFT_ERR_INVALID, "checkpoint: the group has no communicator");
  MPI_Request r;
  int rc = MPI_Comm_idup(base, &c->comm, &r);
  if (rc != MPI_SUCCESS) return mpi_err(rc, "communicator duplicate");
  WEFT_CHECK(dcp_wait(&r, "communicator duplicate"));
  MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(c->comm, &c->rank);
  MPI_Comm_size(c->comm, &c->size);
  return WEFT_OK;
}

void dcp_comm_close(dcp_comm *c) {
  if (c->comm != MPI_COMM_NULL) MPI_Comm_free(&c->comm);
  c->comm = MPI_COMM_NULL;
}

weft_status dcp_allgatherv(const dcp_comm *c, const void *send, int64_t n, char **recv,
                           int64_t **displs) {
  *recv = NULL;
  *displs = NULL;
  int64_t *counts = malloc((size_t)c->size * sizeof *counts);
  int64_t *dsp = malloc((size_t)(c->size + 1) * sizeof *dsp);
  int *ic = malloc((size_t)c->size * sizeof *ic), *id = malloc((size_t)c->size * sizeof *id);
  weft_status st = WEFT_OK;
  char *buf = NULL;
  if (!counts || !dsp || !ic || !id) {
    st = weft_error(WEFT_ERR_OOM, "checkpoint exchange tables");
    goto done;
  }
  MPI_Request r;
  int rc = MPI_Iallgather(&n, 1, MPI_INT64_T, counts, 1, MPI_INT64_T, c->comm, &r);
  if (rc != MPI_SUCCESS) {
    st = mpi_err(rc, "exchange");
    goto done;
  }
  WEFT_CHECK_GOTO(dcp_wait(&r, "exchange of sizes"), st, done);
  dsp[0] = 0;
  for (int i = 0; i < c->size; i++) dsp[i + 1] = dsp[i] + counts[i];
  if (dsp[c->size] > (int64_t)1 << 31) {
    st = weft_error(WEFT_ERR_UNSUPPORTED, "checkpoint exchange: %lld bytes of plans (limit 2 GiB)",
                    (long long)dsp[c->size]);
    goto done;
  }
  for (int i = 0; i < c->size; i++) {
    ic[i] = (int)counts[i];
    id[i] = (int)dsp[i];
  }
  buf = malloc((size_t)(dsp[c->size] ? dsp[c->size] : 1));
  if (!buf) {
    st = weft_error(WEFT_ERR_OOM, "checkpoint exchange of %lld bytes", (long long)dsp[c->size]);
    goto done;
  }
  rc = MPI_Iallgatherv(send, (int)n, MPI_BYTE, buf, ic, id, MPI_BYTE, c->comm, &r);
  if (rc != MPI_SUCCESS) {
    st = mpi_err(rc, "exchange");
    goto done;
  }
  WEFT_CHECK_GOTO(dcp_wait(&r, "exchange"), st, done);
  *recv = buf;
  *displs = dsp;
  buf = NULL;
  dsp = NULL;
done:
  free(buf);
  free(dsp);
  free(counts);
  free(ic);
  free(id);
  return st;
}

weft_status dcp_bcast(const dcp_comm *c, void *buf, int64_t n, int root) {
  char *p = buf;
  const int64_t piece = (int64_t)1 << 30;
  for (int64_t at = 0; at < n; at += piece) {
    int m = (int)(n - at < piece ? n - at : piece);
    MPI_Request r;
    int rc = MPI_Ibcast(p + at, m, MPI_BYTE, root, c->comm, &r);
    if (rc != MPI_SUCCESS) return mpi_err(rc, "broadcast");
    WEFT_CHECK(dcp_wait(&r, "broadcast"));
  }
  return WEFT_OK;
}

/* One implementation of the agreement: mesh's (weft_agree_status), with
 * dcp's message (without the "[rank] function: " prefix). */
weft_status dcp_agree(const dcp_comm *c, weft_status st, const char *what) {
  return weft_agree_status(c->comm, st, st != WEFT_OK ? dcp_last_msg() : NULL, what, NULL);
}
