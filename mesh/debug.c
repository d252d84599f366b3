/* WEFT_DEBUG=1: before a collective, the ranks of its group compare what
 * they are about to call.
 *
 * Protocol (on the group's control communicator, never the one the
 * collective uses): every rank posts a receive from and a send to every
 * other member, 1 message each way (a fingerprint: op, dim, dtype, count,
 * reduce op, root, sequence number), then waits with the usual backoff and
 * timeout. Every rank then holds all n fingerprints and reaches the same
 * verdict, so a mismatch is reported on every rank with the same list of
 * who called what. A rank that never arrives leaves its receive pending:
 * the timeout names it. Messages between two ranks on one communicator do
 * not overtake each other (MPI-4.0 §3.5), so the k-th fingerprint from a
 * peer always pairs with this rank's k-th collective on the group.
 *
 * Notices: a rank that never arrives may be healthy but stuck waiting in
 * another group for a rank that stopped (dp peer of a tp peer). So a rank
 * whose wait times out sends every world rank a notice (on
 * weft__rt.notice) naming whom it waited for, and before it reports, it
 * looks for the notices of the ranks it found missing: the blame follows
 * the chain to the rank that stopped (weft__notice_resolve).
 *
 * all_to_all_v adds the pairwise counts (what I send you, what I expect
 * from you) to each message; since only the two ranks of a pair can see a
 * disagreement, a second exchange shares each rank's verdict.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mesh_internal.h"

enum { TAG_FP = 17, TAG_VERDICT = 18, TAG_NOTICE = 19 };

#define NOTICE_MAGIC 0x4543544eu /* "NTCE" */
#define NOTICE_ROOTS 8

/* A timed-out rank's report: the ranks at the ends of its chains (at most
 * NOTICE_ROOTS; none when it cannot tell who is missing) and what it was
 * waiting in. */
typedef struct notice_msg {
  uint32_t magic;
  int32_t nroots;
  int roots[NOTICE_ROOTS]; /* world ranks (every rank runs the same binary) */
  char what[200];
} notice_msg;

/* Sends may be in flight after the call returns: their buffers live here
 * (a ring; one timeout per group, so reuse comes long after delivery). */
static notice_msg notice_out[4];
static int notice_next;

/* Seconds to look for the notices of missing ranks at a timeout: a stuck
 * peer began waiting at about the same time as we did. */
static double notice_grace(void) {
  double t = weft__rt.settings.timeout_s / 2;
  return t < 2.0 ? t : 2.0;
}

static void notice_send(const int *ranks, int n, const char *what) {
  const int me = weft__rt.world_rank, world = weft__rt.world_size;
  notice_msg *out = &notice_out[notice_next++ % 4];
  memset(out, 0, sizeof *out);
  out->magic = NOTICE_MAGIC;
  out->nroots = n < NOTICE_ROOTS ? n : NOTICE_ROOTS;
  for (int k = 0; k < out->nroots; k++) out->roots[k] = ranks[k];
  snprintf(out->what, sizeof out->what, "%s", what);
  for (int r = 0; r < world; r++) {
    if (r == me) continue;
    MPI_Request q;
    if (MPI_Isend(out, (int)sizeof *out, MPI_BYTE, r, TAG_NOTICE, weft__rt.notice, &q) ==
        MPI_SUCCESS)
      MPI_Request_free(&q);
  }
}

/* The latest notice from world rank r, if any came: true and *m. */
static bool notice_take(int r, notice_msg *m) {
  bool got = false;
  int flag = 0;
  MPI_Status stt;
  while (MPI_Iprobe(r, TAG_NOTICE, weft__rt.notice, &flag, &stt) == MPI_SUCCESS && flag) {
    notice_msg in;
    MPI_Recv(&in, (int)sizeof in, MPI_BYTE, r, TAG_NOTICE, weft__rt.notice, MPI_STATUS_IGNORE);
    if (in.magic != NOTICE_MAGIC || in.nroots < 0 || in.nroots > NOTICE_ROOTS) continue;
    in.what[sizeof in.what - 1] = '\0';
    *m = in;
    got = true;
  }
  return got;
}

int weft__notice_resolve(const int *missing, int nmissing, const char *what, int *roots, int cap,
                         char *why, size_t why_cap) {
  const int me = weft__rt.world_rank, world = weft__rt.world_size;
  if (why_cap) why[0] = '\0';
  /* first tell everyone whom this rank waits for, so that a rank waiting
   * for us finds it without waiting for our own look-up */
  notice_send(missing, nmissing, what);
  if (nmissing <= 0) return 0;
  /* then follow the chains: a missing rank that sent a notice is stuck,
   * and whom it waits for is looked up in turn; one that sent none by the
   * end of the grace is where a chain ends */
  enum { UNSEEN, PENDING, STUCK, END };
  unsigned char *state = calloc((size_t)world, 1);
  if (!state) { /* no memory: the plain list */
    int n = 0;
    for (int i = 0; i < nmissing && n < cap; i++) roots[n++] = missing[i];
    return n;
  }
  for (int i = 0; i < nmissing; i++)
    if (missing[i] >= 0 && missing[i] < world && missing[i] != me) state[missing[i]] = PENDING;
  const double end = weft__now() + notice_grace();
  size_t len = 0;
  for (;;) {
    int pending = 0;
    for (int r = 0; r < world; r++) {
      if (state[r] != PENDING) continue;
      notice_msg m;
      if (!notice_take(r, &m)) {
        pending++;
        continue;
      }
      if (!m.nroots) { /* stuck where it cannot tell who is missing: a chain end */
        state[r] = END;
      } else {
        state[r] = STUCK;
        for (int k = 0; k < m.nroots; k++) {
          const int q = m.roots[k];
          if (q >= 0 && q < world && q != me && state[q] == UNSEEN) {
            state[q] = PENDING;
            pending++;
          }
        }
      }
      char list[128] = "";
      weft__format_ranks(m.roots, m.nroots, list, sizeof list);
      if (len < why_cap)
        len += (size_t)snprintf(why + len, why_cap - len, "%sworld rank %d is itself stuck: %s%s%s",
                                len ? "; " : "", r, m.what,
                                m.nroots ? ", waiting for world ranks " : "", list);
    }
    if (!pending || weft__now() >= end) break;
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
  }
  int n = 0;
  for (int r = 0; r < world && n < cap; r++)
    if (state[r] == PENDING || state[r] == END) roots[n++] = r;
  free(state);
  return n;
}

typedef struct fp_msg {
  weft_fingerprint fp;
  int64_t to_you, from_you; /* all_to_all_v pair counts */
} fp_msg;

/* The first pair this rank found inconsistent: sender sends `sends`
 * elements to receiver, which expects `expects` (group ranks; -1: none). */
typedef struct verdict_msg {
  int64_t sender, receiver, sends, expects;
} verdict_msg;

static bool fp_equal(const weft_fingerprint *a, const weft_fingerprint *b) {
  return memcmp(a, b, sizeof *a) == 0;
}

void weft__fingerprint_describe(const weft_fingerprint *fp, char *buf, size_t cap) {
  if (fp->magic != WEFT_FP_MAGIC) {
    snprintf(buf, cap, "(garbled fingerprint)");
    return;
  }
  const char *kind = weft_coll_kind_name((weft_coll_kind)fp->kind);
  int len = snprintf(buf, cap, "%s%s(", kind, fp->vflag ? "_v" : "");
  if (len < 0 || (size_t)len >= cap) return;
  if (fp->dtype >= 0)
    len += snprintf(buf + len, cap - (size_t)len, "%s, ", weft_dtype_name((weft_dtype)fp->dtype));
  if ((size_t)len < cap && fp->count >= 0)
    len += snprintf(buf + len, cap - (size_t)len, "count %" PRId64 ", ", fp->count);
  if ((size_t)len < cap && fp->vflag && fp->kind == WEFT_COLL_ALL_GATHER)
    len += snprintf(buf + len, cap - (size_t)len, "counts hash %08" PRIx64 ", ",
                    (uint64_t)fp->extra & 0xffffffffu);
  if ((size_t)len < cap && fp->op >= 0)
    len +=
        snprintf(buf + len, cap - (size_t)len, "%s, ", weft_reduce_op_name((weft_reduce_op)fp->op));
  if ((size_t)len < cap && fp->root >= 0)
    len += snprintf(buf + len, cap - (size_t)len, "root %" PRId64 ", ", fp->root);
  if ((size_t)len < cap)
    snprintf(buf + len, cap - (size_t)len, "seq %" PRIu64 ")", (uint64_t)fp->seq);
}

/* Cancels the receives still pending (peers that never sent) and lets go of
 * sends nobody took. Returns how many receives were missing, their world
 * ranks in `missing`. */
static int abandon(mesh_dim *d, MPI_Request *recvs, MPI_Request *sends, int *missing) {
  int nmiss = 0;
  for (int j = 0; j < d->size; j++) {
    if (recvs[j] != MPI_REQUEST_NULL) {
      missing[nmiss++] = d->members[j];
      MPI_Cancel(&recvs[j]);
      MPI_Request_free(&recvs[j]);
    }
    if (sends[j] != MPI_REQUEST_NULL) MPI_Request_free(&sends[j]);
  }
  return nmiss;
}

static weft_status exchange_timeout(mesh_dim *d, const weft_fingerprint *fp, MPI_Request *reqs,
                                    const char *phase) {
  int n = d->size;
  int *missing = malloc((size_t)n * sizeof *missing);
  int *roots = malloc((size_t)n * sizeof *roots);
  char desc[256], ranks[512] = "?", stopped[1024] = "", why[768] = "", what[200];
  weft__fingerprint_describe(fp, desc, sizeof desc);
  snprintf(what, sizeof what, "%.150s on mesh dim '%s'", desc, d->name);
  if (missing && roots) {
    int nmiss = abandon(d, reqs, reqs + n, missing);
    weft__format_ranks(missing, nmiss, ranks, sizeof ranks);
    int nroots = weft__notice_resolve(missing, nmiss, what, roots, n, why, sizeof why);
    if (why[0]) {
      char rs[400];
      weft__format_ranks(roots, nroots, rs, sizeof rs);
      snprintf(stopped, sizeof stopped, " (%.500s); so the ranks that stopped are: %s", why, rs);
    }
  }
  free(missing);
  free(roots);
  d->broken = true;
  snprintf(d->broken_msg, sizeof d->broken_msg, "%.120s timed out in the %.40s exchange", desc,
           phase);
  return weft_error(WEFT_ERR_TIMEOUT,
                    "%s on mesh dim '%s' not started within %g s: world ranks never arrived "
                    "(%s exchange): %s%s",
                    desc, d->name, weft__rt.settings.timeout_s, phase, ranks, stopped);
}

/* Second round for all_to_all_v: every rank shares its pairwise verdict. */
static weft_status share_verdicts(mesh_dim *d, const weft_fingerprint *fp, verdict_msg mine) {
  int n = d->size, me = d->coord;
  verdict_msg *in = calloc((size_t)n, sizeof *in);
  MPI_Request *reqs = malloc(2 * (size_t)n * sizeof *reqs);
  if (!in || !reqs) {
    free(in);
    free(reqs);
    return weft_error(WEFT_ERR_OOM, "no memory for the debug verdict exchange");
  }
  for (int j = 0; j < 2 * n; j++) reqs[j] = MPI_REQUEST_NULL;
  for (int j = 0; j < n; j++) {
    if (j == me) continue;
    MPI_Irecv(&in[j], (int)sizeof in[j], MPI_BYTE, j, TAG_VERDICT, d->ctl, &reqs[j]);
    MPI_Isend(&mine, (int)sizeof mine, MPI_BYTE, j, TAG_VERDICT, d->ctl, &reqs[n + j]);
  }
  in[me] = mine;
  weft_status st = weft__wait_all(2 * n, reqs, weft__rt.settings.timeout_s);
  if (st == WEFT_ERR_TIMEOUT) st = exchange_timeout(d, fp, reqs, "all_to_all_v counts");
  free(reqs);
  if (st != WEFT_OK) {
    free(in);
    return st;
  }
  char list[768] = "";
  size_t len = 0;
  int nbad = 0;
  for (int j = 0; j < n; j++) {
    const verdict_msg *v = &in[j];
    if (v->sender < 0 || v->sender >= n || v->receiver < 0 || v->receiver >= n) continue;
    /* A bad pair shows up at both of its ends: report it once. */
    bool dup = false;
    for (int k = 0; k < j && !dup; k++)
      dup = in[k].sender == v->sender && in[k].receiver == v->receiver;
    if (dup) continue;
    if (nbad < 4 && len < sizeof list)
      len += (size_t)snprintf(list + len, sizeof list - len,
                              "%sworld rank %d sends %" PRId64
                              " to world rank %d, which "
                              "expects %" PRId64,
                              nbad ? "; " : "", d->members[v->sender], v->sends,
                              d->members[v->receiver], v->expects);
    nbad++;
  }
  free(in);
  if (!nbad) return WEFT_OK;
  char desc[256];
  weft__fingerprint_describe(fp, desc, sizeof desc);
  return weft_error(WEFT_ERR_MISMATCH, "%s on mesh dim '%s': counts disagree: %s%s", desc, d->name,
                    list, nbad > 4 ? "; ..." : "");
}

weft_status weft__debug_check(mesh_dim *d, const weft_fingerprint *fp, const int64_t *pair_send,
                              const int64_t *pair_recv) {
  int n = d->size, me = d->coord;
  fp_msg *in = calloc((size_t)n, sizeof *in);
  fp_msg *out = calloc((size_t)n, sizeof *out);
  MPI_Request *reqs = malloc(2 * (size_t)n * sizeof *reqs);
  int *cls = malloc((size_t)n * sizeof *cls);
  weft_status st = WEFT_OK;
  if (!in || !out || !reqs || !cls) {
    st = weft_error(WEFT_ERR_OOM, "no memory for the debug fingerprint exchange");
    goto done;
  }
  for (int j = 0; j < 2 * n; j++) reqs[j] = MPI_REQUEST_NULL;
  for (int j = 0; j < n; j++) {
    out[j].fp = *fp;
    out[j].to_you = pair_send ? pair_send[j] : 0;
    out[j].from_you = pair_recv ? pair_recv[j] : 0;
  }
  for (int j = 0; j < n; j++) {
    if (j == me) continue;
    MPI_Irecv(&in[j], (int)sizeof in[j], MPI_BYTE, j, TAG_FP, d->ctl, &reqs[j]);
    MPI_Isend(&out[j], (int)sizeof out[j], MPI_BYTE, j, TAG_FP, d->ctl, &reqs[n + j]);
  }
  in[me] = out[me];
  st = weft__wait_all(2 * n, reqs, weft__rt.settings.timeout_s);
  if (st == WEFT_ERR_TIMEOUT) st = exchange_timeout(d, fp, reqs, "fingerprint");
  if (st != WEFT_OK) goto done;

  /* Classes of equal fingerprints, numbered by their lowest group rank. */
  int nclass = 0;
  for (int j = 0; j < n; j++) {
    cls[j] = j;
    for (int k = 0; k < j; k++)
      if (fp_equal(&in[j].fp, &in[k].fp)) {
        cls[j] = cls[k];
        break;
      }
    if (cls[j] == j) nclass++;
  }
  if (nclass > 1) {
    char list[1400] = "";
    size_t len = 0;
    int shown = 0;
    for (int c = 0; c < n && len < sizeof list; c++) {
      if (cls[c] != c) continue;
      if (shown == 4) {
        len += (size_t)snprintf(list + len, sizeof list - len, "; ...");
        break;
      }
      int ranks[16], nr = 0, more = 0;
      for (int j = 0; j < n; j++)
        if (cls[j] == c) {
          if (nr < 16)
            ranks[nr++] = d->members[j];
          else
            more++;
        }
      char rs[160], desc[256];
      weft__format_ranks(ranks, nr, rs, sizeof rs);
      weft__fingerprint_describe(&in[c].fp, desc, sizeof desc);
      len += (size_t)snprintf(list + len, sizeof list - len, "%sworld rank%s %s%s called %s",
                              shown ? "; " : "", nr + more > 1 ? "s" : "", rs, more ? ", ..." : "",
                              desc);
      shown++;
    }
    st = weft_error(WEFT_ERR_MISMATCH,
                    "collective mismatch on mesh dim '%s' (group of %d, %d different calls): %s",
                    d->name, n, nclass, list);
    goto done;
  }

  if (pair_send) {
    /* all_to_all_v: my send to j must be what j expects from me, and back. */
    verdict_msg v = {-1, -1, 0, 0};
    for (int j = 0; j < n && v.sender < 0; j++) {
      int64_t j_to_me = j == me ? pair_send[me] : in[j].to_you;
      int64_t j_from_me = j == me ? pair_recv[me] : in[j].from_you;
      if (pair_send[j] != j_from_me)
        v = (verdict_msg){me, j, pair_send[j], j_from_me};
      else if (pair_recv[j] != j_to_me)
        v = (verdict_msg){j, me, j_to_me, pair_recv[j]};
    }
    st = share_verdicts(d, fp, v);
  }

done:
  free(in);
  free(out);
  free(reqs);
  free(cls);
  return st;
}
