/* fsdp/trace.c — the debug trace of FSDP's events, the communication
 * counters and the per-rank memory accounting. */
#include <stdlib.h>
#include <string.h>

#include "fsdp_internal.h"

/* --------------------------------------------------------------- trace */

#define TRACE_CAP (1 << 20)

static struct {
  bool on;
  weft_fsdp_event *v;
  int n, cap;
} trace;

static const char *const ev_names[WEFT_FSDP_EV_KIND_COUNT] = {
    "unshard_start",  "unshard_done", "reshard",      "forward_begin", "forward_end",
    "backward_begin", "backward_end", "reduce_start", "reduce_done"};

const char *weft_fsdp_event_kind_name(weft_fsdp_event_kind kind) {
  if ((int)kind < 0 || kind >= WEFT_FSDP_EV_KIND_COUNT) return "?";
  return ev_names[kind];
}

void weft_fsdp_trace_enable(bool on) { trace.on = on; }

void weft_fsdp_trace_clear(void) {
  free(trace.v);
  trace.v = NULL;
  trace.n = trace.cap = 0;
}

int weft_fsdp_trace_count(void) { return trace.n; }

weft_status weft_fsdp_trace_get(int i, weft_fsdp_event *out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "fsdp_trace_get: out is NULL");
  if (i < 0 || i >= trace.n)
    return weft_error(WEFT_ERR_INVALID, "fsdp_trace_get: event %d outside [0, %d)", i, trace.n);
  *out = trace.v[i];
  return WEFT_OK;
}

/* note: events keep a pointer to their group; printing a trace whose
 * groups were destroyed prints "(destroyed)". */
void weft_fsdp_trace_print(FILE *f) {
  if (!f) return;
  for (int i = 0; i < trace.n; i++) {
    const weft_fsdp_event *e = &trace.v[i];
    const char *name = "(destroyed)";
    for (weft_fsdp *g = fsdp__registry; g; g = g->next)
      if (g == e->group) name = g->name;
    fprintf(f, "%d %s %s%s%s", i, weft_fsdp_event_kind_name(e->kind), name,
            e->prefetch ? " (prefetch)" : "", e->backward ? " [bwd]" : "");
    if (e->stream != WEFT_STREAM_COMPUTE) fprintf(f, " on %s", weft_stream_name(e->stream));
    fputc('\n', f);
  }
}

/* Whether the communication started at event i (on a device stream) was
 * still in flight when another group's compute began. */
static bool overlapped(int i, weft_fsdp_event_kind done) {
  const weft_fsdp_event *s = &trace.v[i];
  if (s->stream == WEFT_STREAM_COMPUTE) return false;
  for (int j = i + 1; j < trace.n; j++) {
    const weft_fsdp_event *e = &trace.v[j];
    if (e->group == s->group && e->kind == done) return false;
    if (e->group != s->group &&
        (e->kind == WEFT_FSDP_EV_FORWARD_BEGIN || e->kind == WEFT_FSDP_EV_BACKWARD_BEGIN))
      return true;
  }
  return false;
}

void weft_fsdp_trace_overlaps(int *all_gathers, int *reductions) {
  int ag = 0, rd = 0;
  for (int i = 0; i < trace.n; i++) {
    if (trace.v[i].kind == WEFT_FSDP_EV_UNSHARD_START)
      ag += overlapped(i, WEFT_FSDP_EV_UNSHARD_DONE);
    else if (trace.v[i].kind == WEFT_FSDP_EV_REDUCE_START)
      rd += overlapped(i, WEFT_FSDP_EV_REDUCE_DONE);
  }
  if (all_gathers) *all_gathers = ag;
  if (reductions) *reductions = rd;
}

void fsdp__event(weft_fsdp_event_kind kind, const weft_fsdp *f, bool prefetch, bool backward) {
  fsdp__mem_sample();
  if (!trace.on || trace.n >= TRACE_CAP) return;
  if (trace.n == trace.cap) {
    int c = trace.cap ? 2 * trace.cap : 256;
    weft_fsdp_event *v = realloc(trace.v, (size_t)c * sizeof *v);
    if (!v) return; /* a debug aid: drop events rather than fail training */
    trace.v = v;
    trace.cap = c;
  }
  weft_fsdp_event *e = &trace.v[trace.n++];
  e->kind = kind;
  e->group = f;
  e->prefetch = prefetch;
  e->backward = backward;
  e->stream = WEFT_STREAM_COMPUTE;
  bool start = kind == WEFT_FSDP_EV_UNSHARD_START || kind == WEFT_FSDP_EV_REDUCE_START;
  if (f->dev != WEFT_CPU && start)
    e->stream = fsdp__collective_stream(kind == WEFT_FSDP_EV_REDUCE_START);
}

/* --------------------------------------------------------------- comm */

void fsdp__comm_add(weft_comm_count *c, int64_t payload, int n, bool all_reduce) {
  c->calls++;
  c->bytes += payload;
  int64_t bus = n > 1 ? payload * (n - 1) / n : 0;
  c->bus_bytes += all_reduce ? 2 * bus : bus;
}

static void comm_sum(weft_comm_count *a, const weft_comm_count *b) {
  a->calls += b->calls;
  a->bytes += b->bytes;
  a->bus_bytes += b->bus_bytes;
}

weft_status weft_fsdp_comm_get(const weft_fsdp *f, bool recurse, weft_fsdp_comm *out) {
  if (!f || !out) return weft_error(WEFT_ERR_INVALID, "fsdp_comm_get: NULL argument");
  if (!fsdp__live(f)) return weft_error(WEFT_ERR_INVALID, "fsdp_comm_get: not a live FSDP group");
  *out = f->comm;
  if (recurse)
    for (weft_fsdp *g = fsdp__registry; g; g = g->next)
      if (g != f && fsdp__group_within(g, f)) {
        comm_sum(&out->all_gather, &g->comm.all_gather);
        comm_sum(&out->small_all_gather, &g->comm.small_all_gather);
        comm_sum(&out->reduce_scatter, &g->comm.reduce_scatter);
        comm_sum(&out->all_reduce, &g->comm.all_reduce);
      }
  return WEFT_OK;
}

weft_status weft_fsdp_comm_reset(weft_fsdp *f, bool recurse) {
  if (!f) return weft_error(WEFT_ERR_INVALID, "fsdp_comm_reset: NULL argument");
  if (!fsdp__live(f)) return weft_error(WEFT_ERR_INVALID, "fsdp_comm_reset: not a live FSDP group");
  memset(&f->comm, 0, sizeof f->comm);
  if (recurse)
    for (weft_fsdp *g = fsdp__registry; g; g = g->next)
      if (g != f && fsdp__group_within(g, f)) memset(&g->comm, 0, sizeof g->comm);
  return WEFT_OK;
}

/* ------------------------------------------------------------- memory */

static struct {
  weft_fsdp_memory m;
  int64_t unsharded_params; /* exact: FSDP's own allocations */
  int64_t grad_bufs;        /* exact: reduce-scatter buffers */
  const weft_optimizer *opt;
} mem;

static void peak(weft_fsdp_mem_count *c, int64_t v) {
  c->current = v;
  if (v > c->peak) c->peak = v;
}

void fsdp__mem_add_unsharded_params(int64_t bytes) {
  mem.unsharded_params += bytes;
  peak(&mem.m.unsharded_params, mem.unsharded_params);
}

void fsdp__mem_add_unsharded_grads(int64_t bytes) {
  mem.grad_bufs += bytes;
  fsdp__mem_sample();
}

static int64_t nbytes(const weft_dtensor *d) {
  return d ? (int64_t)weft_tensor_nbytes(weft_dtensor_local(d)) : 0;
}

void fsdp__mem_sample(void) {
  int64_t sp = 0, sg = 0, ug = mem.grad_bufs, opt = 0;
  for (weft_fsdp *f = fsdp__registry; f; f = f->next)
    for (int i = 0; i < f->nparams; i++) {
      const fsdp_param *fp = &f->params[i];
      sp += nbytes(fp->sharded);
      ug += nbytes(fp->acc_grad);
      if (f->in_backward) {
        sg += nbytes(fp->held_grad);
        ug += nbytes(fp->p->grad);
      } else {
        sg += nbytes(fp->p->grad);
      }
    }
  if (mem.opt) {
    int n = weft_optimizer_state_count(mem.opt);
    for (int i = 0; i < n; i++) {
      weft_dtensor *t = NULL;
      if (weft_optimizer_state_get(mem.opt, i, NULL, &t) == WEFT_OK) opt += nbytes(t);
    }
  }
  weft_mem_stats a = weft_mem_get(WEFT_CPU);
  peak(&mem.m.sharded_params, sp);
  peak(&mem.m.sharded_grads, sg);
  peak(&mem.m.optimizer, opt);
  peak(&mem.m.unsharded_params, mem.unsharded_params);
  peak(&mem.m.unsharded_grads, ug);
  peak(&mem.m.other, a.current_bytes - sp - sg - opt - mem.unsharded_params - ug);
  mem.m.total.current = a.current_bytes;
  mem.m.total.peak = a.peak_bytes;
}

weft_status weft_fsdp_memory_get(weft_fsdp_memory *out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "fsdp_memory_get: out is NULL");
  fsdp__mem_sample();
  *out = mem.m;
  return WEFT_OK;
}

void weft_fsdp_memory_reset_peak(void) {
  weft_mem_reset_peak(WEFT_CPU);
  fsdp__mem_sample();
  weft_fsdp_mem_count *c[7] = {
      &mem.m.sharded_params,  &mem.m.sharded_grads, &mem.m.optimizer, &mem.m.unsharded_params,
      &mem.m.unsharded_grads, &mem.m.other,         &mem.m.total};
  for (int i = 0; i < 7; i++) c[i]->peak = c[i]->current;
}

void weft_fsdp_memory_track(const weft_optimizer *opt) {
  mem.opt = opt;
  fsdp__mem_sample();
}
