/* examples/train/loop.c — train_run: set up (setup.c), then each optimizer
 * step in turn: grad_accum micro-steps (forward + backward of this rank's
 * rows, model.c), gradient clipping and the AdamW step; then the step's
 * numbers (communication per mesh dim, peak memory, the loss averaged over
 * the dp ranks), validation when due, one log line (and one JSON object)
 * on rank 0, and a checkpoint when due (checkpoint.c). At the end: the last
 * checkpoint, the export, and the summary. Collective over the world. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "train_internal.h"

/* Step times kept for the summary's median and minimum: the last this
 * many (a ring), so the record is bounded whatever --steps is. */
#define STEP_TIMES 65536

/* What the run has measured so far, and what every step needs. */
typedef struct run_totals {
  int64_t start_step, steps_run, timed_steps, peak_max;
  int64_t skipped, skip_run; /* --on-nonfinite skip: steps skipped, in all and in a row */
  double total_time, timed_time, first_loss, last_loss, vloss, vacc, first_vloss;
  weft_lr_schedule sched;
  double *step_s; /* the slowest rank's time of the last STEP_TIMES timed steps (a ring) */
  int64_t tokens_per_step;
  double fpt; /* training FLOPs per token */
  bool tty;   /* rank 0 draws a progress bar */
  /* --predict: the last step's ten costliest kernels, and how many kernels
   * had records */
  weft_kernel_cost top[10];
  int ntop, nkernels;
} run_totals;

/* One step's numbers (the same on every rank after the reductions). */
typedef struct step_report {
  int64_t step; /* 0-based */
  float lr;
  double loss, norm, dt, dtmax, tps, mfu;
  int64_t peak[2]; /* max over ranks, -min over ranks */
  int64_t comm_bytes[TRAIN_MAX_DIMS], comm_calls[TRAIN_MAX_DIMS];
  double comm_seconds[TRAIN_MAX_DIMS]; /* rank 0's time held up in each dim's collectives */
  weft_op_stats ops;                   /* this rank's op layer during the step (--profile) */
  int64_t graph_peak;    /* the op graph's peak bytes in the step's last micro-step; -1: none */
  weft_device_stats dev; /* this rank's device backend during it (--profile) */
  double pred_s, pred_kernels_s; /* --predict: the modeled step, and its kernels' part */
  int64_t pred_uncosted;         /* calls without a cost formula */
  bool do_val;
  const char *skipped; /* NULL, or what was non-finite ("loss", "gradient norm") */
  /* the guard's loss all-reduce, left out of the step's communication */
  weft_comm_count guard[TRAIN_MAX_DIMS][WEFT_COLL_KIND_COUNT];
} step_report;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fmt_bytes(double b, char *buf, size_t cap) {
  const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int k = 0;
  while (b >= 1024 && k < 4) {
    b /= 1024;
    k++;
  }
  snprintf(buf, cap, k ? "%.1f %s" : "%.0f %s", b, u[k]);
}

/* All-reduce over the whole root mesh (the world): over each dim in turn,
 * tp first. Collective. */
static weft_status world_reduce(const run_state *s, void *buf, int64_t n, weft_dtype dt,
                                weft_reduce_op op) {
  for (int d = s->ndim - 1; d >= 0; d--)
    WEFT_CHECK(weft_all_reduce(s->root, d, buf, buf, n, dt, op, NULL));
  return WEFT_OK;
}

/* ------------------------------------------------------------ the buffers */

/* This rank's batch buffers, their tensor views, the parameter list and
 * the validation scratch (agreed: an allocation may fail on one rank). */
static int alloc_buffers(run_state *s) {
  int64_t T = s->cfg.max_seq_len, N;
  s->rows = s->o->batch / s->dp_total;
  N = s->rows * T;
  s->tok = malloc(sizeof(int32_t) * (size_t)N);
  s->tgt = malloc(sizeof(int32_t) * (size_t)N);
  s->scratch = malloc(sizeof(int32_t) * (size_t)(T + 1));
  s->argmax = malloc(sizeof(float) * (size_t)(2 * N));
  s->argmax_max = malloc(sizeof(float) * (size_t)N);
  bool oom = !s->tok || !s->tgt || !s->scratch || !s->argmax || !s->argmax_max;
  if (train_agree_fail(oom, "out of memory for this rank's batch buffers")) return 2;
  int64_t shape[2] = {s->rows, T};
  weft_status st = weft_tensor_wrap(s->tok, WEFT_I32, WEFT_CPU, 2, shape, &s->tok_t);
  if (st == WEFT_OK) st = weft_tensor_wrap(s->tgt, WEFT_I32, WEFT_CPU, 2, shape, &s->tgt_t);
  if (st == WEFT_OK) st = weft_module_parameters(s->model, NULL, 0, &s->nparams);
  if (st == WEFT_OK && !(s->params = calloc((size_t)s->nparams + 1, sizeof *s->params)))
    st = weft_error(WEFT_ERR_OOM, "parameter list of %d", s->nparams);
  if (st == WEFT_OK) st = weft_module_parameters(s->model, s->params, s->nparams, &s->nparams);
  if (train_agree_fail(st != WEFT_OK, weft_last_error())) return 2;
  return 0;
}

static void free_buffers(run_state *s) {
  weft_tensor_destroy(s->tok_t);
  weft_tensor_destroy(s->tgt_t);
  free(s->tok);
  free(s->tgt);
  free(s->scratch);
  free(s->argmax);
  free(s->argmax_max);
  free(s->params);
}

/* ------------------------------------------------------------- validation */

/* Next-token hits of the logits lg (rows, T, V), whose local shard on the
 * tp dim may be a vocab range (loss parallel): argmax per position, then
 * with TP the global max and the lowest index attaining it. */
static int count_hits(run_state *s, const weft_dtensor *lg, double *hits) {
  int64_t V = s->cfg.vocab, N = s->rows * s->cfg.max_seq_len;
  weft_tensor *loc = NULL, *f32 = NULL;
  if (weft_tensor_to(weft_dtensor_local(lg), WEFT_CPU, &loc) != WEFT_OK) /* a host copy */
    return train_fail_all("validation: %s", weft_last_error());
  if (loc->dtype != WEFT_F32) { /* bf16 logits (--dtype bf16): read as f32 */
    weft_status st = weft_tensor_create(WEFT_F32, WEFT_CPU, loc->ndim, loc->shape, &f32);
    if (st == WEFT_OK) st = weft_tensor_copy(f32, loc);
    weft_tensor_destroy(loc);
    loc = f32;
    if (st != WEFT_OK) {
      weft_tensor_destroy(loc);
      return train_fail_all("validation: %s", weft_last_error());
    }
  }
  int64_t v0 = 0, nv = loc->shape[2];
  bool sharded = weft_dtensor_placements(lg)[0].kind == WEFT_PLACE_SHARD && s->tp_size > 1;
  if (sharded) {
    int64_t len;
    weft_chunk_range(V, s->tp_size, weft_mesh_coord(s->model_mesh, 0), &v0, &len);
  }
  float *best = s->argmax, *mx = s->argmax_max;
  const float *z = loc->data;
  for (int64_t n = 0; n < N; n++) {
    float m = -INFINITY;
    int64_t arg = 0;
    for (int64_t k = 0; k < nv; k++) {
      float x = z[n * nv + k];
      if (x > m) {
        m = x;
        arg = v0 + k;
      }
    }
    best[n] = m;
    best[N + n] = (float)arg;
  }
  weft_tensor_destroy(loc);
  if (sharded) {
    memcpy(mx, best, sizeof(float) * (size_t)N);
    weft_status st = weft_all_reduce(s->model_mesh, 0, mx, mx, N, WEFT_F32, WEFT_OP_MAX, NULL);
    for (int64_t n = 0; st == WEFT_OK && n < N; n++)
      best[N + n] = best[n] == mx[n] ? best[N + n] : (float)V;
    if (st == WEFT_OK)
      st = weft_all_reduce(s->model_mesh, 0, best + N, best + N, N, WEFT_F32, WEFT_OP_MIN, NULL);
    if (st != WEFT_OK) return train_fail_here("validation");
  }
  for (int64_t n = 0; n < N; n++) *hits += (int32_t)best[N + n] == s->tgt[n];
  return 0;
}

/* Validation: val_batches held-out batches (B rows each, split over dp):
 * mean loss and next-token accuracy over all of them. */
static int validate(run_state *s, double *loss_out, double *acc_out) {
  const train_opts *o = s->o;
  int64_t B = o->batch, T = s->cfg.max_seq_len, V = s->cfg.vocab;
  double acc[2] = {0, 0}; /* loss sum over (rank, batch), hits */
  char err[512] = "";
  int64_t nb = o->val_batches > 0 ? o->val_batches : 1;
  for (int64_t j = 0; j < nb; j++) {
    int bad = train_data_batch(&s->data.val, false, o->seed, j, B, T, s->dp_index * s->rows,
                               s->rows, s->tok, s->tgt, s->scratch, V, err, sizeof err);
    if (train_agree_fail(bad != 0, err)) return 2;
    double l = 0;
    const weft_dtensor *lg = NULL;
    weft_status st = train_model_step(s, false, 0, &l, &lg);
    if (train_agree_fail(st != WEFT_OK, weft_last_error())) return 2;
    acc[0] += l;
    int rc = count_hits(s, lg, &acc[1]);
    if (rc) return rc;
  }
  /* tp ranks hold the same numbers: sums over the world / tp = sums over dp */
  if (world_reduce(s, acc, 2, WEFT_F64, WEFT_OP_SUM) != WEFT_OK)
    return train_fail_here("validation");
  *loss_out = acc[0] / ((double)nb * s->world);
  *acc_out = acc[1] / s->tp_size / ((double)nb * B * T);
  return 0;
}

/* --------------------------------------------------------------- one step */

/* grad_accum micro-steps: each reads its batch rows, then forward and
 * backward; FSDP syncs gradients on the last one only. */
static int micro_steps(run_state *s, int64_t step, double *loss_sum) {
  const train_opts *o = s->o;
  char err[1024] = "";
  char what[64];
  snprintf(what, sizeof what, "step %lld", (long long)step + 1); /* as the progress lines */
  *loss_sum = 0;
  for (int64_t micro = 0; micro < o->grad_accum; micro++) {
    int64_t key = step * o->grad_accum + micro;
    /* --fixed-batch: every step reads the first step's batches (a model
     * that cannot drive their loss towards 0 has a bug) */
    int64_t data_key = o->fixed_batch ? micro : key;
    int bad = train_data_batch(&s->data.train, true, o->seed, data_key, o->batch,
                               s->cfg.max_seq_len, s->dp_index * s->rows, s->rows, s->tok, s->tgt,
                               s->scratch, s->cfg.vocab, err, sizeof err);
    /* the embedded data is checked once (every token < V by construction) */
    if ((o->data || o->text) && train_agree_fail(bad != 0, err)) return 2;
    if (bad) return train_fail_all("%s", err);
    if (s->root_fsdp && weft_fsdp_set_requires_gradient_sync(
                            s->root_fsdp, micro == o->grad_accum - 1, true) != WEFT_OK)
      return train_fail_here(what);
    double l = 0;
    if (train_model_step(s, true, key, &l, NULL) != WEFT_OK) return train_fail_here(what);
    *loss_sum += l;
  }
  return 0;
}

/* The mean gradient over the micro-steps and its norm over the world,
 * clipped to --clip (with --clip 0 the norm is still computed: the guard
 * reads it). */
static int clip_grads(run_state *s, int64_t step, double *norm) {
  const train_opts *o = s->o;
  weft_status st = WEFT_OK;
  if (o->grad_accum > 1)
    for (int i = 0; i < s->nparams && st == WEFT_OK; i++)
      if (s->params[i]->grad)
        st = weft_scale(weft_dtensor_local(s->params[i]->grad), 1.0 / (double)o->grad_accum);
  if (st == WEFT_OK) st = weft_clip_grad_norm(s->model, o->clip > 0 ? o->clip : 1e30, norm);
  if (st == WEFT_OK) return 0;
  char what[64];
  snprintf(what, sizeof what, "step %lld", (long long)step + 1);
  return train_fail_here(what);
}

/* Every dim's communication counts by kind, so far in this step. */
static void comm_counts(const run_state *s, weft_comm_count c[][WEFT_COLL_KIND_COUNT]) {
  for (int d = 0; d < s->ndim; d++)
    for (int k = 0; k < WEFT_COLL_KIND_COUNT; k++) c[d][k] = weft_comm_stats(s->root, d, k);
}

/* The loss: the mean over micro-batches and ranks (tp ranks agree), before
 * the update, for the guard. Its all-reduce is recorded in r->guard and
 * taken out of the step's communication (which stays what the model and
 * FSDP move, as weft-plan predicts). Collective. */
static int reduce_loss(run_state *s, step_report *r, double loss_sum) {
  weft_comm_count c0[TRAIN_MAX_DIMS][WEFT_COLL_KIND_COUNT];
  comm_counts(s, c0);
  double loss = loss_sum / (double)s->o->grad_accum;
  if (world_reduce(s, &loss, 1, WEFT_F64, WEFT_OP_SUM) != WEFT_OK)
    return train_fail_here("the step's loss");
  r->loss = loss / s->world;
  comm_counts(s, r->guard);
  for (int d = 0; d < s->ndim; d++)
    for (int k = 0; k < WEFT_COLL_KIND_COUNT; k++) {
      r->guard[d][k].calls -= c0[d][k].calls;
      r->guard[d][k].bytes -= c0[d][k].bytes;
      r->guard[d][k].bus_bytes -= c0[d][k].bus_bytes;
      r->guard[d][k].seconds -= c0[d][k].seconds;
    }
  return 0;
}

static const char *nonfinite_str(double v) { return isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf"; }

/* The non-finite guard, before the update: the loss and the gradient norm
 * are reduced over the world, so every rank takes the same decision. 0:
 * update; 1: skip the update (--on-nonfinite skip); 2: stop (every rank
 * returns it, rank 0 prints the error; nothing is saved after it). */
static int guard(run_state *s, run_totals *t, step_report *r) {
  const train_opts *o = s->o;
  bool bad_loss = !isfinite(r->loss), bad_norm = !isfinite(r->norm);
  if (!bad_loss && !bad_norm) {
    t->skip_run = 0;
    return 0;
  }
  const char *what = bad_loss ? "loss" : "gradient norm";
  double v = bad_loss ? r->loss : r->norm;
  long long n = (long long)r->step + 1;
  if (!o->skip_nonfinite) {
    s->stopped = true;
    return train_fail_all(
        "step %lld: the %s is %s%s; stopped before the step's optimizer update, "
        "with no further checkpoint (lower --lr, or --on-nonfinite skip)",
        n, what, nonfinite_str(v), bad_loss && bad_norm ? " (and the gradient norm)" : "");
  }
  r->skipped = what;
  t->skipped++;
  if (++t->skip_run < o->max_skipped) return 1;
  s->stopped = true;
  return train_fail_all(
      "step %lld: the %s is %s: %lld steps in a row skipped "
      "(--max-skipped-steps %lld); stopped, with no further checkpoint",
      n, what, nonfinite_str(v), (long long)t->skip_run, (long long)o->max_skipped);
}

/* The update (unless the guard skips it: then parameters and optimizer
 * state stay as they were), then the gradients are cleared. */
static int optimizer_step(run_state *s, int64_t step, bool skip) {
  weft_status st = WEFT_OK;
  if (!skip) st = weft_optimizer_step(s->opt);
  if (st == WEFT_OK) st = weft_module_zero_grad(s->model, false);
  if (st == WEFT_OK) return 0;
  char what[64];
  snprintf(what, sizeof what, "step %lld", (long long)step + 1);
  return train_fail_here(what);
}

/* This step's communication per dim and this rank's peak memory (read
 * before the reporting all-reduces, which the counters would include). */
static int take_stats(run_state *s, step_report *r, train_result *res) {
  for (int d = 0; d < s->ndim; d++) {
    weft_comm_count k = weft_comm_stats_dim(s->root, d);
    r->comm_bytes[d] = k.bytes;
    r->comm_calls[d] = k.calls;
    r->comm_seconds[d] = k.seconds;
    for (int kk = 0; kk < WEFT_COLL_KIND_COUNT; kk++) { /* less the guard's all-reduce */
      const weft_comm_count *g = &r->guard[d][kk];
      r->comm_bytes[d] -= g->bytes;
      r->comm_calls[d] -= g->calls;
      r->comm_seconds[d] -= g->seconds;
      if (!res) continue;
      weft_comm_count kc = weft_comm_stats(s->root, d, (weft_coll_kind)kk);
      res->comm_kind_bytes[d][kk] = kc.bytes - g->bytes;
      res->comm_kind_calls[d][kk] = kc.calls - g->calls;
      res->comm_kind_seconds[d][kk] = kc.seconds - g->seconds;
    }
  }
  int64_t peak = weft_mem_get(weft_mesh_device(s->root)).peak_bytes; /* where the model lives */
  r->peak[0] = peak;
  r->peak[1] = -peak;
  if (!res) return 0;
  memcpy(res->comm_bytes, r->comm_bytes, sizeof r->comm_bytes);
  memcpy(res->comm_calls, r->comm_calls, sizeof r->comm_calls);
  res->peak_bytes = peak;
  if (!s->root_fsdp) return 0;
  weft_fsdp_memory fm;
  if (weft_fsdp_memory_get(&fm) != WEFT_OK) return train_fail_here("FSDP memory");
  res->param_bytes = fm.sharded_params.peak;
  res->grad_bytes = fm.sharded_grads.peak;
  res->optim_bytes = fm.optimizer.peak;
  res->unsharded_param_peak = fm.unsharded_params.peak;
  res->unsharded_grad_peak = fm.unsharded_grads.peak;
  res->other_peak = fm.other.peak;
  return 0;
}

/* The slowest rank's time; the peak memory's max and min over ranks (the
 * loss was reduced before the update: reduce_loss). */
static int reduce_report(run_state *s, step_report *r) {
  r->dtmax = r->dt;
  weft_status st = world_reduce(s, &r->dtmax, 1, WEFT_F64, WEFT_OP_MAX);
  if (st == WEFT_OK) st = world_reduce(s, r->peak, 2, WEFT_I64, WEFT_OP_MAX);
  if (st != WEFT_OK) return train_fail_here("the step's timing");
  return 0;
}

static void add_to_totals(run_state *s, run_totals *t, step_report *r) {
  if (!r->skipped) { /* a skipped step's loss is not the model's */
    if (isnan(t->first_loss)) t->first_loss = r->loss;
    t->last_loss = r->loss;
  }
  t->steps_run++;
  t->total_time += r->dtmax;
  if (r->step > t->start_step || s->o->steps - t->start_step == 1) {
    t->timed_time += r->dtmax;
    t->step_s[t->timed_steps++ % STEP_TIMES] = r->dtmax;
  }
  if (r->peak[0] > t->peak_max) t->peak_max = r->peak[0];
  r->tps = (double)t->tokens_per_step / r->dtmax;
  r->mfu = r->tps * t->fpt / (s->world * s->peak_flops);
}

/* ---------------------------------------------------------------- logging */

static void progress(int64_t step, int64_t total) {
  int w = 30, fill = total ? (int)(w * step / total) : w;
  printf("\r\033[K[");
  for (int i = 0; i < w; i++) putchar(i < fill ? '#' : '.');
  printf("] %lld/%lld", (long long)step, (long long)total);
  fflush(stdout);
}

static void print_step(const run_state *s, const step_report *r) {
  char pbuf[32], line[512];
  fmt_bytes((double)r->peak[0], pbuf, sizeof pbuf);
  int n = snprintf(line, sizeof line,
                   "step %4lld/%lld | loss %.4f | lr %.2e | norm %.3f | %6.0f tok/s | mfu %5.2f%% "
                   "| peak %s/rank |",
                   (long long)r->step + 1, (long long)s->o->steps, r->loss, r->lr, r->norm, r->tps,
                   100 * r->mfu, pbuf);
  for (int d = 0; d < s->ndim && n < (int)sizeof line; d++) {
    char bb[32];
    fmt_bytes((double)r->comm_bytes[d], bb, sizeof bb);
    n += snprintf(line + n, sizeof line - (size_t)n, " %s %s", s->names[d], bb);
  }
  printf("%s | %.0f ms\n", line, r->dtmax * 1e3);
}

/* One JSON object a line; a failed write is remembered (agreed at the end). */
static void write_json(run_state *s, const step_report *r, const run_totals *t) {
  cJSON *j = cJSON_CreateObject();
  cJSON *cm = j ? cJSON_AddObjectToObject(j, "comm_bytes") : NULL;
  cJSON *cl = j ? cJSON_AddObjectToObject(j, "comm_calls") : NULL;
  cJSON *cs = j ? cJSON_AddObjectToObject(j, "comm_seconds") : NULL;
  bool ok = j && cm && cl && cs;
  ok = ok && cJSON_AddNumberToObject(j, "step", (double)(r->step + 1));
  ok = ok && cJSON_AddNumberToObject(j, "loss", r->loss);
  ok = ok && cJSON_AddNumberToObject(j, "lr", r->lr);
  ok = ok && cJSON_AddNumberToObject(j, "grad_norm", r->norm);
  if (r->skipped) ok = ok && cJSON_AddBoolToObject(j, "skipped", true);
  ok = ok && cJSON_AddNumberToObject(j, "tokens_per_s", r->tps);
  ok = ok && cJSON_AddNumberToObject(j, "mfu", r->mfu);
  ok = ok && cJSON_AddNumberToObject(j, "step_time_s", r->dtmax);
  ok = ok && cJSON_AddNumberToObject(j, "peak_bytes_max", (double)r->peak[0]);
  ok = ok && cJSON_AddNumberToObject(j, "peak_bytes_min", (double)-r->peak[1]);
  for (int d = 0; ok && d < s->ndim; d++) {
    ok = ok && cJSON_AddNumberToObject(cm, s->names[d], (double)r->comm_bytes[d]);
    ok = ok && cJSON_AddNumberToObject(cl, s->names[d], (double)r->comm_calls[d]);
    ok = ok && cJSON_AddNumberToObject(cs, s->names[d], r->comm_seconds[d]);
  }
  if (ok && r->do_val) {
    ok = cJSON_AddNumberToObject(j, "val_loss", t->vloss);
    ok = ok && cJSON_AddNumberToObject(j, "val_acc", t->vacc);
  }
  char *txt = ok ? cJSON_PrintUnformatted(j) : NULL;
  if (!txt || fprintf(s->json, "%s\n", txt) < 0 || fflush(s->json) != 0) s->json_failed = true;
  cJSON_free(txt);
  cJSON_Delete(j);
}

/* Rank 0: the step line, the validation line, the progress bar, JSON. */
static void log_step(run_state *s, const step_report *r, const run_totals *t) {
  const train_opts *o = s->o;
  if (s->rank != 0) return;
  if (t->tty) printf("\r\033[K");
  if (!o->quiet) print_step(s, r);
  if (r->skipped)
    printf(
        "  step %lld skipped: the %s is %s (--on-nonfinite skip: the update is dropped; %lld "
        "in a row, %lld in all)\n",
        (long long)r->step + 1, r->skipped, nonfinite_str(r->skipped[0] == 'l' ? r->loss : r->norm),
        (long long)t->skip_run, (long long)t->skipped);
  if (o->profile && r->step > t->start_step) { /* the first step fills the graph's pool */
    printf("  op graph per step: ops %lld, widened %lld, copies %lld, mallocs %lld",
           (long long)r->ops.ops, (long long)r->ops.widened, (long long)r->ops.copies,
           (long long)r->ops.mallocs);
    if (r->graph_peak >= 0) printf(", peak %.1f MiB", (double)r->graph_peak / (1 << 20));
    printf("\n");
    if (o->cuda) /* weft_device_stats (backend.h): host<->device bytes in one sum */
      printf(
          "  device calls per step: launches %lld, blas %lld, host syncs %lld, mallocs %lld, "
          "bytes copied %lld\n",
          (long long)r->dev.launches, (long long)r->dev.blas, (long long)r->dev.host_syncs,
          (long long)r->dev.mallocs, (long long)(r->dev.bytes_h2d + r->dev.bytes_d2h));
    if (o->predict) {
      const double mfu = (double)t->tokens_per_step * t->fpt /
                         (s->world * o->predict->peak_flops[WEFT_ENGINE_BF16] * r->pred_s);
      printf(
          "  predicted on %s: step %.2f ms (kernels %.2f, host syncs %.2f), %.0f tok/s, "
          "MFU %.1f%%%s\n",
          o->predict->name, 1e3 * r->pred_s, 1e3 * r->pred_kernels_s,
          1e3 * (r->pred_s - r->pred_kernels_s), (double)t->tokens_per_step / r->pred_s, 100 * mfu,
          r->pred_uncosted ? " (some calls have no cost formula: see the end)" : "");
    }
  }
  if (r->do_val && !o->silent)
    printf("  validation after step %lld: held-out loss %.4f, next-token accuracy %.1f%%\n",
           (long long)r->step + 1, t->vloss, 100 * t->vacc);
  if (t->tty) progress(r->step + 1, o->steps);
  fflush(stdout);
  if (s->json) write_json(s, r, t);
}

static void print_banner(const run_state *s) {
  const train_opts *o = s->o;
  const weft_llama_config *c = &s->cfg;
  char buf[512], pos[48] = "";
  weft_mesh_describe(s->root, buf, sizeof buf);
  if (train_positions(o) != c->max_seq_len)
    snprintf(pos, sizeof pos, " positions=%lld", (long long)train_positions(o));
  printf(
      "weft-train: model %s (D=%lld L=%lld H=%lld Hkv=%lld F=%lld V=%lld T=%lld%s, %.2fM "
      "params), %s\n",
      o->model_name, (long long)c->dim, (long long)c->n_layers, (long long)c->n_heads,
      (long long)c->n_kv_heads, (long long)c->ffn_dim, (long long)c->vocab,
      (long long)c->max_seq_len, pos, train_count_params(o, c, true) / 1e6, buf);
  printf(
      "  FSDP on %s, TP %s%s%s, data: %s, batch %lld x %lld tokens x %lld accum, %lld steps\n",
      s->dp_total > 1 ? (s->ndp == 2 ? "dp_replicate x dp_shard (HSDP)" : "dp") : "nothing (dp=1)",
      s->tp_size > 1 ? "on tp" : "off", s->tp_size > 1 && o->sequence_parallel ? " + SP" : "",
      s->tp_size > 1 && o->loss_parallel ? " + loss parallel" : "",
      o->data   ? o->data
      : o->text ? o->text
                : "embedded synthetic language",
      (long long)o->batch, (long long)c->max_seq_len, (long long)o->grad_accum,
      (long long)o->steps);
  fflush(stdout);
}

static void print_summary(const run_state *s, const run_totals *t, double tps_avg, double mfu_avg,
                          double step_med, double step_min) {
  const train_opts *o = s->o;
  char pbuf[32], mbuf[128] = "";
  fmt_bytes((double)t->peak_max, pbuf, sizeof pbuf);
  for (int d = 0; d < s->ndim; d++) {
    size_t l = strlen(mbuf);
    snprintf(mbuf + l, sizeof mbuf - l, "%s%s=%d", d ? " x " : "", s->names[d], s->shape[d]);
  }
  printf("\nsummary\n");
  printf("  %-26s %s\n", "model", o->model_name);
  printf("  %-26s %.3fM\n", "parameters", train_count_params(o, &s->cfg, true) / 1e6);
  printf("  %-26s %s (%d ranks%s)\n", "mesh", mbuf, s->world,
         o->mesh.tp_across_nodes ? ", tp outermost: --tp-across-nodes" : "");
  printf("  %-26s %lld (of %lld)\n", "steps run", (long long)t->steps_run, (long long)o->steps);
  if (s->failed_saves)
    printf("  %-26s %lld (--save-errors continue: the previous checkpoint kept)\n", "saves failed",
           (long long)s->failed_saves);
  if (o->skip_nonfinite)
    printf("  %-26s %lld (non-finite loss or gradient norm: update dropped)\n", "steps skipped",
           (long long)t->skipped);
  printf("  %-26s %.4f -> %.4f (ln V = %.4f)\n", "train loss", t->first_loss, t->last_loss,
         log((double)s->cfg.vocab));
  printf("  %-26s %.4f\n", "held-out loss", t->vloss);
  printf("  %-26s %.2f%% (chance %.2f%%)\n", "held-out accuracy", 100 * t->vacc,
         100.0 / (double)s->cfg.vocab);
  printf("  %-26s %.0f\n", "tokens/s (after step 1)", tps_avg);
  printf("  %-26s %.1f ms median, %.1f ms min\n", "step time (after step 1)", 1e3 * step_med,
         1e3 * step_min);
  printf("  %-26s %.2f%% of %.0f GFLOP/s per rank (%s)\n", "MFU", 100 * mfu_avg,
         s->peak_flops / 1e9, s->peak_why);
  weft_device dev = weft_mesh_device(s->root);
  printf("  %-26s %s (%s)\n", "peak memory (max rank)", pbuf, weft_device_name(dev));
  weft_cache_stats cs;
  if (weft_device_cache_stats(dev, &cs) == WEFT_OK) {
    /* the host's cache holds only blocks of >= 64 KiB (kernels/alloc.c) */
    char cbuf[32], rbuf[32];
    fmt_bytes((double)weft_mem_get(dev).current_bytes, cbuf, sizeof cbuf);
    fmt_bytes((double)cs.reserved_bytes, rbuf, sizeof rbuf);
    printf("  %-26s %s in use, %s reserved (caching allocator%s)\n",
           dev == WEFT_CPU ? "host memory (rank 0)" : "device memory (rank 0)", cbuf, rbuf,
           dev == WEFT_CPU ? ", large blocks" : "");
  }
  printf("  %-26s %.2f s\n", "training time", t->total_time);
  fflush(stdout);
}

/* ---------------------------------------------------------------- the run */

/* Buffers, the JSON log, --resume, the schedule and the banner. */
static int start_run(run_state *s, run_totals *t, train_result *res) {
  const train_opts *o = s->o;
  int rc = alloc_buffers(s);
  if (rc) return rc;
  t->step_s = malloc(sizeof(double) * STEP_TIMES);
  if (train_agree_fail(!t->step_s, "out of memory for the step times")) return 2;
  if (o->log_json && s->rank == 0) s->json = fopen(o->log_json, "w");
  if (train_agree_fail(o->log_json && s->rank == 0 && !s->json, "cannot open the --log-json file"))
    return 2;
  if (o->resume_dir && (rc = train_resume(s, &t->start_step))) return rc;
  if (o->save_dir && (rc = train_save_check(s))) return rc;
  t->sched = (weft_lr_schedule){(float)o->lr, (float)o->min_lr, o->warmup, o->steps};
  t->tokens_per_step = o->batch * s->cfg.max_seq_len * o->grad_accum;
  t->fpt = train_flops_per_token(o, &s->cfg, s->cfg.max_seq_len);
  t->tty = s->rank == 0 && isatty(STDOUT_FILENO) && !o->quiet;
  t->first_loss = t->last_loss = t->vloss = t->vacc = t->first_vloss = NAN;
  if (res) res->num_params = train_count_params(o, &s->cfg, true);
  if (s->rank == 0 && !o->quiet) print_banner(s);
  return 0;
}

/* --predict: this rank's modeled step from the kernels' records (each
 * call's roofline time, backend.h) plus the host synchronisations; keeps
 * the ten costliest kernels for the summary. */
static void predict_step(const run_state *s, run_totals *t, step_report *r) {
  weft_kernel_cost all[WEFT_KERNEL_COSTS_MAX];
  const int n = weft_device_costs_get(all, WEFT_KERNEL_COSTS_MAX);
  r->pred_kernels_s = 0;
  r->pred_uncosted = 0;
  for (int i = 0; i < n; i++) {
    r->pred_kernels_s += all[i].model_s;
    r->pred_uncosted += all[i].uncosted;
  }
  r->pred_s = r->pred_kernels_s + (double)r->dev.host_syncs * s->o->predict->sync_s;
  t->nkernels = n;
  t->ntop = n < 10 ? n : 10;
  memcpy(t->top, all, (size_t)t->ntop * sizeof *all);
}

/* The ten costliest kernels of the last step on the modeled GPU. */
static void print_prediction(const run_state *s, const run_totals *t) {
  const weft_gpu_spec *g = s->o->predict;
  printf(
      "  modeled on %s (per call: max(FLOPs / peak, bytes / %.2f TB/s) on its share of %.0f "
      "SMs, + %.0f us; %.0f us per host sync; peaks fp32 %.0f, tf32 %.0f, bf16 %.0f TFLOP/s)\n",
      g->name, g->mem_bytes_s / 1e12, g->sms, 1e6 * g->launch_s, 1e6 * g->sync_s,
      g->peak_flops[WEFT_ENGINE_FP32] / 1e12, g->peak_flops[WEFT_ENGINE_TF32] / 1e12,
      g->peak_flops[WEFT_ENGINE_BF16] / 1e12);
  printf("  the last step's ten costliest of %d kernels:\n", t->nkernels);
  printf("    %-44s %7s %10s %10s %10s\n", "kernel", "calls", "ms", "GFLOP", "GB");
  for (int i = 0; i < t->ntop; i++) {
    const weft_kernel_cost *k = &t->top[i];
    printf("    %-44.44s %7lld %10.3f %10.2f %10.3f%s\n", k->name, (long long)k->calls,
           1e3 * k->model_s, k->flops / 1e9, k->bytes / 1e9,
           k->uncosted ? "  (no cost formula: launch cost only)" : "");
  }
}

/* One optimizer step, its report, validation when due, the log line and
 * the checkpoint when due. */
static int run_step(run_state *s, run_totals *t, int64_t step, train_result *res) {
  const train_opts *o = s->o;
  step_report r = {.step = step};
  weft_comm_stats_reset(s->root);
  weft_mem_reset_peak(weft_mesh_device(s->root));
  if (s->root_fsdp) weft_fsdp_memory_reset_peak();
  r.lr = weft_lr_schedule_at(&t->sched, step);
  weft_optimizer_set_lr(s->opt, r.lr);
  const weft_op_stats ops0 = weft_op_stats_get();
  const weft_device_stats dev0 = weft_device_stats_get();
  if (o->predict) weft_device_costs_reset();
  double t0 = now_s(), loss_sum = 0;
  int rc = micro_steps(s, step, &loss_sum);
  if (!rc) rc = clip_grads(s, step, &r.norm);
  if (!rc) rc = reduce_loss(s, &r, loss_sum);
  int skip = rc ? 0 : guard(s, t, &r);
  if (skip > 1) return skip;
  if (!rc) rc = optimizer_step(s, step, skip == 1);
  r.dt = now_s() - t0;
  const weft_op_stats ops1 = weft_op_stats_get();
  r.ops = (weft_op_stats){ops1.ops - ops0.ops, ops1.widened - ops0.widened,
                          ops1.copies - ops0.copies, ops1.mallocs - ops0.mallocs};
  r.graph_peak = s->graph ? weft_graph_bytes_peak(s->graph) : -1;
  const weft_device_stats dev1 = weft_device_stats_get();
  r.dev = (weft_device_stats){dev1.launches - dev0.launches,     dev1.blas - dev0.blas,
                              dev1.host_syncs - dev0.host_syncs, dev1.mallocs - dev0.mallocs,
                              dev1.bytes_h2d - dev0.bytes_h2d,   dev1.bytes_d2h - dev0.bytes_d2h};
  if (o->predict) predict_step(s, t, &r);
  if (!rc) rc = take_stats(s, &r, res);
  if (!rc) rc = reduce_report(s, &r);
  if (rc) return rc;
  add_to_totals(s, t, &r);
  r.do_val = (o->val_every > 0 && (step + 1) % o->val_every == 0) || step + 1 == o->steps;
  if (r.do_val) {
    if ((rc = validate(s, &t->vloss, &t->vacc))) return rc;
    if (isnan(t->first_vloss)) t->first_vloss = t->vloss;
  }
  log_step(s, &r, t);
  return train_save_if_due(s, step + 1);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Median and minimum of the timed steps' times (0 when none ran). */
static void step_times(run_totals *t, double *median, double *min) {
  int64_t n = t->timed_steps < STEP_TIMES ? t->timed_steps : STEP_TIMES;
  *median = *min = 0;
  if (n == 0) return;
  qsort(t->step_s, (size_t)n, sizeof *t->step_s, cmp_double);
  *min = t->step_s[0];
  *median = n % 2 ? t->step_s[n / 2] : 0.5 * (t->step_s[n / 2 - 1] + t->step_s[n / 2]);
}

/* The last save, the export, a validation if no step ran, the results and
 * the summary; a failed --log-json write fails the run on every rank. */
static int finish_run(run_state *s, run_totals *t, train_result *res) {
  const train_opts *o = s->o;
  int rc = train_save_wait(s);
  if (!rc) rc = train_export(s);
  if (!rc && t->steps_run == 0 && o->val_batches > 0) {
    rc = validate(s, &t->vloss, &t->vacc);
    t->first_vloss = t->vloss;
  }
  if (rc) return rc;
  if (s->json && fclose(s->json) != 0) s->json_failed = true;
  s->json = NULL;
  if (train_agree_fail(s->json_failed, "writing the --log-json file failed")) return 2;
  double tps_avg =
      t->timed_steps ? (double)(t->tokens_per_step * t->timed_steps) / t->timed_time : 0;
  double mfu_avg = tps_avg * t->fpt / (s->world * s->peak_flops);
  double med = 0, min = 0;
  step_times(t, &med, &min);
  if (res) {
    res->step_s_median = med;
    res->step_s_min = min;
    res->steps_run = t->steps_run;
    res->skipped_steps = t->skipped;
    res->first_loss = t->first_loss;
    res->final_loss = t->last_loss;
    res->val_loss = t->vloss;
    res->val_acc = t->vacc;
    res->first_val_loss = t->first_vloss;
    res->tokens_per_s = tps_avg;
    res->mfu = mfu_avg;
  }
  if (s->rank == 0 && !o->silent) print_summary(s, t, tps_avg, mfu_avg, med, min);
  if (s->rank == 0 && !o->silent && o->predict && t->ntop) print_prediction(s, t);
  return 0;
}

int train_run(const train_opts *o, train_result *res) {
  run_state S, *s = &S;
  memset(s, 0, sizeof *s);
  s->o = o;
  s->cfg = o->model;
  s->rank = weft_world_rank();
  s->world = weft_world_size();
  s->data.text_fd = -1;
  if (res) memset(res, 0, sizeof *res);
  run_totals t = {0};
  int rc = train_setup(s, res);
  if (!rc) rc = start_run(s, &t, res);
  for (int64_t step = t.start_step; !rc && step < o->steps; step++) rc = run_step(s, &t, step, res);
  /* stopped by the guard (alike on every rank): an async save of an
   * earlier, finite state still commits, with its rotation */
  if (rc && s->stopped) train_save_wait(s);
  if (!rc) rc = finish_run(s, &t, res);
  free_buffers(s);
  free(t.step_s);
  if (train_teardown(s) != WEFT_OK && !rc) rc = train_fail_here("teardown");
  return rc;
}
