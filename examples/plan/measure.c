/* weft-plan --measure: does the time model rank the meshes as they run?
 *
 *     mpiexec -n 4 weft-plan --measure --model tiny --steps 4 --svg p.svg --json p.json
 *
 * 1. probe this world (probe.c): links per kind, GEMM and element-wise
 *    rates, the comm/compute overlap;
 * 2. predict every factorisation of the world (plan.c's model) on the
 *    cluster the probe found (nodes = weft_node_count, ranks per node), with
 *    tp > 1 and dp > 1 in both layouts (tp inside nodes, tp across);
 * 3. run each one with weft-train's core for --steps steps (the first is
 *    warm-up) and take the median step time (the slowest rank's, per step),
 *    the last step's comm bytes and calls per dim and kind, and the seconds
 *    each dim's collectives held a rank up (max over ranks);
 * 4. report on rank 0: predicted vs measured step time and rank, the comm
 *    bytes (exact, as --validate asserts), Spearman's rank correlation, the
 *    largest error, the predicted and measured fastest; --svg draws the
 *    scatter, --json writes the same numbers.
 * Exit status: 0 when every run ran and every comm byte count matched
 * (the accuracy of the time model is reported, not asserted).
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"

/* One measured factorisation. */
typedef struct row {
  plan_config k;
  char name[96];
  bool ran, exact;
  double meas_s, min_s;
  double rounds[PLAN_MAX_REPEAT]; /* each round's median step time */
  double bytes[3][WEFT_COLL_KIND_COUNT], calls[3][WEFT_COLL_KIND_COUNT], secs[3];
  double prank, mrank, err;
} row;

/* ------------------------------------------------------------------ SVG */

static void xml_text(FILE *f, const char *s) {
  for (; *s; s++) {
    if (*s == '<')
      fputs("&lt;", f);
    else if (*s == '>')
      fputs("&gt;", f);
    else if (*s == '&')
      fputs("&amp;", f);
    else if (*s == '"')
      fputs("&quot;", f);
    else
      fputc(*s, f);
  }
}

/* A tick step of 1, 2 or 5 x 10^k giving about 5 ticks up to hi. */
static double tick_step(double hi) {
  double raw = hi / 5, p = pow(10, floor(log10(raw))), m = raw / p;
  return p * (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10);
}

static int write_svg(const char *path, const plan_opts *o, const plan_probe *pr, const row *rows,
                     int n, double rho) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  /* the plot on the left, a numbered legend of the points on the right */
  const double W = 1200, H = 700, L = 90, R = 420, T = 80, B = 70;
  double hi = 0;
  for (int i = 0; i < n; i++)
    if (rows[i].ran) hi = fmax(hi, fmax(rows[i].k.t_step, rows[i].meas_s));
  hi = hi > 0 ? hi * 1.15 : 1;
  double step = tick_step(hi);
  hi = ceil(hi / step) * step;
#define X(v) (L + (v) / hi * (W - L - R))
#define Y(v) (H - B - (v) / hi * (H - T - B))
  fprintf(f,
          "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
          "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n"
          "<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n",
          W, H, W, H, W, H);
  /* title */
  char links[160];
  int len = snprintf(links, sizeof links, "intra %.0f MB/s", pr->intra_bw / 1e6);
  if (pr->nodes > 1)
    snprintf(links + len, sizeof links - (size_t)len, ", inter %.0f MB/s", pr->inter_bw / 1e6);
  if (pr->gpn <= 1) snprintf(links, sizeof links, "inter %.0f MB/s", pr->inter_bw / 1e6);
  fprintf(f, "<text x=\"%.0f\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">", W / 2);
  fputs("weft-plan --measure: model ", f);
  xml_text(f, o->model_name);
  fprintf(f, ", %d node%s x %d ranks</text>\n", pr->nodes, pr->nodes == 1 ? "" : "s", pr->gpn);
  fprintf(f,
          "<text x=\"%.0f\" y=\"50\" text-anchor=\"middle\">probed links per rank: %s; %.2f "
          "GFLOP/s per rank; Spearman %.3f</text>\n",
          W / 2, links, pr->flops / 1e9, rho);
  /* +-25% band between y = 0.75 x and y = 1.25 x, clipped to the plot */
  double xe = hi / 1.25;
  fprintf(f,
          "<polygon points=\"%.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f\" fill=\"#dde8f5\" "
          "stroke=\"none\"><title>+-25%%</title></polygon>\n",
          X(0), Y(0), X(xe), Y(hi), X(hi), Y(hi), X(hi), Y(0.75 * hi));
  /* axes, ticks, grid */
  fprintf(f,
          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n"
          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
          X(0), Y(0), X(hi), Y(0), X(0), Y(0), X(0), Y(hi));
  for (double v = 0; v <= hi * (1 + 1e-9); v += step) {
    fprintf(f,
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>"
            "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n",
            X(v), Y(0), X(v), Y(0) + 5, X(v), Y(0) + 20, v);
    fprintf(f,
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>"
            "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n",
            X(0) - 5, Y(v), X(0), Y(v), X(0) - 8, Y(v) + 4, v);
  }
  fprintf(f,
          "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">predicted step time (s)</text>\n"
          "<text x=\"20\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 20 %.1f)\">"
          "measured step time (s, median)</text>\n",
          (X(0) + X(hi)) / 2, H - 20, (Y(0) + Y(hi)) / 2, (Y(0) + Y(hi)) / 2);
  /* y = x */
  fprintf(f,
          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"gray\" "
          "stroke-dasharray=\"6,4\"/><text x=\"%.1f\" y=\"%.1f\" fill=\"gray\">y = x (band "
          "+-25%%)</text>\n",
          X(0), Y(0), X(hi), Y(hi), X(hi) - 130, Y(hi) + 16);
  /* one numbered point per factorisation; the legend names them */
  double lx = W - R + 30, ly = T + 10;
  fprintf(f,
          "<text x=\"%.1f\" y=\"%.1f\" font-weight=\"bold\">factorisation: predicted / "
          "measured s (error)</text>\n",
          lx, ly);
  int num = 0;
  for (int i = 0; i < n; i++) {
    if (!rows[i].ran) continue;
    num++;
    const char *color = rows[i].k.across ? "#d9480f" : "#1864ab";
    double px = X(rows[i].k.t_step), py = Y(rows[i].meas_s);
    fprintf(f,
            "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"%s\"><title>predicted %.4f s, "
            "measured %.4f s</title></circle>\n",
            px, py, color, rows[i].k.t_step, rows[i].meas_s);
    /* numbers alternate left and right of their points: close points stay legible */
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" font-weight=\"bold\">%d</text>\n",
            num % 2 ? px + 8 : px - 8, py + 4, num % 2 ? "start" : "end", num);
    double y = ly + 30.0 * num;
    fprintf(f,
            "<rect x=\"%.1f\" y=\"%.1f\" width=\"10\" height=\"10\" fill=\"%s\"/><text x=\"%.1f\" "
            "y=\"%.1f\" font-weight=\"bold\">%d</text>",
            lx, y - 9, color, lx + 16, y, num);
    fprintf(f, "<text class=\"label\" x=\"%.1f\" y=\"%.1f\">", lx + 34, y);
    xml_text(f, rows[i].name);
    fprintf(f, "</text><text x=\"%.1f\" y=\"%.1f\" fill=\"#444\">%.3f / %.3f (%+.0f%%)</text>\n",
            lx + 34, y + 12, rows[i].k.t_step, rows[i].meas_s,
            100 * (rows[i].k.t_step - rows[i].meas_s) / rows[i].meas_s);
  }
  fprintf(f,
          "<text x=\"%.1f\" y=\"%.1f\" fill=\"#444\">blue: tp innermost (inside nodes); "
          "orange: tp across nodes</text>\n",
          lx, ly + 30.0 * (num + 1) + 4);
  fputs("</svg>\n", f);
#undef X
#undef Y
  return fclose(f) ? -1 : 0;
}

/* ----------------------------------------------------------------- JSON */

static int write_json(const char *path, const plan_opts *o, const plan_probe *pr, const row *rows,
                      int n, double rho, double maxerr, const char *pf, const char *mf) {
  cJSON *j = cJSON_CreateObject(), *a = NULL;
  bool ok = j != NULL;
  ok = ok && cJSON_AddStringToObject(j, "model", o->model_name);
  ok = ok && cJSON_AddNumberToObject(j, "nodes", pr->nodes);
  ok = ok && cJSON_AddNumberToObject(j, "ranks_per_node", pr->gpn);
  ok = ok && cJSON_AddNumberToObject(j, "steps", (double)o->steps);
  ok = ok && cJSON_AddNumberToObject(j, "batch", (double)o->batch);
  ok = ok && cJSON_AddNumberToObject(j, "rounds", o->repeat > 1 ? o->repeat : 1);
  cJSON *p = ok ? plan_probe_to_json(pr) : NULL;
  ok = p && cJSON_AddItemToObject(j, "probe", p);
  if (!ok) cJSON_Delete(p);
  ok = ok && (a = cJSON_AddArrayToObject(j, "rows")) != NULL;
  for (int i = 0; ok && i < n; i++) {
    const row *w = &rows[i];
    cJSON *e = cJSON_CreateObject(), *c = NULL;
    ok = e && cJSON_AddItemToArray(a, e);
    ok = ok && cJSON_AddStringToObject(e, "name", w->name);
    ok = ok && cJSON_AddNumberToObject(e, "dp_replicate", w->k.rep);
    ok = ok && cJSON_AddNumberToObject(e, "dp_shard", w->k.shard);
    ok = ok && cJSON_AddNumberToObject(e, "tp", w->k.tp);
    ok = ok && cJSON_AddBoolToObject(e, "tp_across_nodes", w->k.across);
    ok = ok && cJSON_AddBoolToObject(e, "ran", w->ran);
    if (!w->ran) continue;
    ok = ok && cJSON_AddNumberToObject(e, "predicted_s", w->k.t_step);
    ok = ok && cJSON_AddNumberToObject(e, "predicted_compute_s", w->k.t_compute);
    ok = ok && cJSON_AddNumberToObject(e, "measured_s", w->meas_s);
    ok = ok && cJSON_AddNumberToObject(e, "measured_min_s", w->min_s);
    ok = ok && cJSON_AddNumberToObject(e, "error", w->err);
    ok = ok && cJSON_AddNumberToObject(e, "predicted_rank", w->prank);
    ok = ok && cJSON_AddNumberToObject(e, "measured_rank", w->mrank);
    ok = ok && cJSON_AddBoolToObject(e, "comm_exact", w->exact);
    ok = ok && (c = cJSON_AddObjectToObject(e, "comm")) != NULL;
    for (int d = 0; ok && d < 3; d++) {
      int sz[3] = {w->k.rep, w->k.shard, w->k.tp};
      if (sz[d] <= 1) continue;
      double pb = 0, mb = 0;
      for (int kk = 0; kk < WEFT_COLL_KIND_COUNT; kk++) {
        pb += w->k.bytes[d][kk];
        mb += w->bytes[d][kk];
      }
      cJSON *x = cJSON_AddObjectToObject(c, PLAN_DIM_NAMES[d]);
      ok = x && cJSON_AddStringToObject(x, "link", w->k.intra[d] ? "intra" : "inter");
      ok = ok && cJSON_AddNumberToObject(x, "predicted_bytes", pb);
      ok = ok && cJSON_AddNumberToObject(x, "measured_bytes", mb);
      ok = ok && cJSON_AddNumberToObject(x, "predicted_s", w->k.t_comm[d]);
      ok = ok && cJSON_AddNumberToObject(x, "measured_s", w->secs[d]);
    }
  }
  ok = ok && (isfinite(rho) ? cJSON_AddNumberToObject(j, "spearman", rho)
                            : cJSON_AddNullToObject(j, "spearman")) != NULL;
  ok = ok && cJSON_AddNumberToObject(j, "max_abs_error", maxerr);
  ok = ok && cJSON_AddStringToObject(j, "predicted_fastest", pf);
  ok = ok && cJSON_AddStringToObject(j, "measured_fastest", mf);
  if (!ok) {
    cJSON_Delete(j);
    return -1;
  }
  return plan_json_write(path, j);
}

/* --------------------------------------------------------------- report */

static void print_report(const plan_opts *o, const plan_probe *pr, row *rows, int n, double *rho,
                         double *maxerr, int *pbest, int *mbest) {
  printf(
      "\nweft-plan --measure: model %s (D=%lld L=%lld H=%lld F=%lld V=%lld T=%lld), batch %lld, "
      "%d node(s) x %d ranks, median of steps 2..%lld, median of %d round(s)\n",
      o->model_name, (long long)o->m.dim, (long long)o->m.n_layers, (long long)o->m.n_heads,
      (long long)o->m.ffn_dim, (long long)o->m.vocab, (long long)o->m.max_seq_len,
      (long long)o->batch, pr->nodes, pr->gpn, (long long)o->steps, o->repeat > 1 ? o->repeat : 1);
  printf("%-36s %9s %9s %8s %5s %5s\n", "factorisation", "pred s", "meas s", "error", "prank",
         "mrank");
  for (int i = 0; i < n; i++) {
    row *w = &rows[i];
    if (!w->ran) {
      printf("%-36s %s\n", w->name, w->k.valid ? "run failed" : w->k.why);
      continue;
    }
    printf("%-36s %9.4f %9.4f %+7.1f%% %5.1f %5.1f\n", w->name, w->k.t_step, w->meas_s,
           100 * w->err, w->prank, w->mrank);
    printf("    %-13s       compute %.4f s predicted (%s %.4f, AdamW + element-wise %.4f)\n", "",
           w->k.t_compute, w->k.probed ? "model kernels" : "GEMM FLOPs", w->k.t_gemm, w->k.t_elem);
    int sz[3] = {w->k.rep, w->k.shard, w->k.tp};
    for (int d = 0; d < 3; d++) {
      if (sz[d] <= 1) continue;
      double pb = 0, mb = 0;
      for (int kk = 0; kk < WEFT_COLL_KIND_COUNT; kk++) {
        pb += w->k.bytes[d][kk];
        mb += w->bytes[d][kk];
      }
      printf(
          "    %-13s %-5s comm %12.0f B predicted, %12.0f B measured (%s); %.4f s predicted, "
          "%.4f s measured\n",
          PLAN_DIM_NAMES[d], w->k.intra[d] ? "intra" : "inter", pb, mb,
          w->exact ? "exact" : "MISMATCH", w->k.t_comm[d], w->secs[d]);
    }
  }
  printf("predicted fastest: %s\nmeasured fastest:  %s\n", *pbest >= 0 ? rows[*pbest].name : "-",
         *mbest >= 0 ? rows[*mbest].name : "-");
  if (*pbest >= 0 && *mbest >= 0 && *pbest != *mbest) {
    /* how far apart the two are, against the spread of their own rounds */
    const row *p = &rows[*pbest], *m = &rows[*mbest];
    int R = o->repeat > 1 ? o->repeat : 1;
    double plo = p->rounds[0], phi = plo, mlo = m->rounds[0], mhi = mlo;
    for (int r = 1; r < R; r++) {
      plo = fmin(plo, p->rounds[r]);
      phi = fmax(phi, p->rounds[r]);
      mlo = fmin(mlo, m->rounds[r]);
      mhi = fmax(mhi, m->rounds[r]);
    }
    printf(
        "  the predicted fastest measured %.1f%% slower than the measured fastest; rounds "
        "%.4f..%.4f s vs %.4f..%.4f s (%s)\n",
        100 * (p->meas_s / m->meas_s - 1), plo, phi, mlo, mhi,
        plo <= mhi ? "overlapping: within the measurement's own spread" : "apart");
  }
  printf("Spearman rank correlation (predicted vs measured step time): %.3f\n", *rho);
  printf("max |error|: %.1f%%\n", 100 * *maxerr);
  bool goal = *pbest == *mbest && *rho >= 0.8 && *maxerr <= 0.25;
  printf("goal (same fastest, Spearman >= 0.8, every error within 25%%): %s\n",
         goal ? "met" : "NOT met");
}

int plan_measure(const plan_opts *o) {
  int rank = weft_world_rank(), world = weft_world_size();
  double t_start = MPI_Wtime();
  plan_probe pr;
  if (plan_probe_run(o, &pr)) return 1;
  int rc = 0;
  if (rank == 0) {
    plan_probe_print(&pr);
    char err[512];
    if (o->probe_out && plan_probe_save(o->probe_out, &pr, err, sizeof err)) {
      fprintf(stderr, "weft-plan: error: %s\n", err);
      rc = 1;
    }
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (rc) return rc;
  plan_opts q = *o;
  plan_probe_apply(&pr, &q.m, &q.c);
  if (o->has_overlap) q.c.overlap = o->overlap_flag;
  q.tp_across = true;
  plan_config *v = NULL;
  int n = plan_enumerate(&q, world, true, &v);
  row *rows = n > 0 ? calloc((size_t)n, sizeof *rows) : NULL;
  if (!rows) {
    free(v);
    if (rank == 0) fprintf(stderr, "weft-plan: error: out of memory\n");
    return 1;
  }
  int failed = 0, R = o->repeat > 0 ? o->repeat : 1;
  for (int i = 0; i < n; i++) {
    rows[i].k = v[i];
    plan_config_name(&rows[i].k, rows[i].name, sizeof rows[i].name);
  }
  /* rounds over every factorisation in turn, so that a change of the
   * machine's load during the measurement touches them alike; a row's
   * measured step time is the median over the rounds of each run's median */
  for (int round = 0; round < R; round++)
    for (int i = 0; i < n; i++) {
      row *w = &rows[i];
      if (!w->k.valid || (round > 0 && !w->ran)) continue;
      if (rank == 0) {
        printf("running %s (round %d of %d) ... (%.1f s since the start)\n", w->name, round + 1, R,
               MPI_Wtime() - t_start);
        fflush(stdout);
      }
      train_opts t;
      plan_train_opts(&q, &w->k, &t);
      train_result r;
      if (train_run(&t, &r)) {
        failed++;
        w->ran = false;
        continue;
      }
      w->ran = true;
      w->rounds[round] = r.step_s_median;
      w->min_s = round == 0 ? r.step_s_min : fmin(w->min_s, r.step_s_min);
      plan_measured_rows(&r, w->bytes, w->calls, w->secs);
      /* the slowest rank's held-up seconds per dim */
      MPI_Allreduce(MPI_IN_PLACE, w->secs, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      bool exact = true;
      for (int d = 0; d < 3; d++)
        for (int kk = 0; kk < WEFT_COLL_KIND_COUNT; kk++)
          exact =
              exact && w->bytes[d][kk] == w->k.bytes[d][kk] && w->calls[d][kk] == w->k.calls[d][kk];
      w->exact = exact && (round == 0 || w->exact);
      if (!exact) failed++;
    }
  for (int i = 0; i < n; i++)
    if (rows[i].ran) rows[i].meas_s = plan_median(rows[i].rounds, R);
  free(v);
  /* ranks (1 = fastest) among the rows that ran */
  int m = 0;
  double *pt = malloc(sizeof(double) * (size_t)n * 4), *mt = pt + n, *pr_ = pt + 2 * n,
         *mr = pt + 3 * n;
  double rho = NAN, maxerr = 0;
  int pbest = -1, mbest = -1;
  if (pt) {
    for (int i = 0; i < n; i++)
      if (rows[i].ran) {
        pt[m] = rows[i].k.t_step;
        mt[m] = rows[i].meas_s;
        m++;
      }
    plan_ranks(pt, m, pr_);
    plan_ranks(mt, m, mr);
    rho = plan_spearman(pt, mt, m);
    for (int i = 0, j = 0; i < n; i++) {
      row *w = &rows[i];
      if (!w->ran) continue;
      w->prank = pr_[j];
      w->mrank = mr[j];
      j++;
      w->err = (w->k.t_step - w->meas_s) / w->meas_s;
      maxerr = fmax(maxerr, fabs(w->err));
      if (pbest < 0 || w->k.t_step < rows[pbest].k.t_step) pbest = i;
      if (mbest < 0 || w->meas_s < rows[mbest].meas_s) mbest = i;
    }
  }
  free(pt);
  if (rank == 0) {
    print_report(&q, &pr, rows, n, &rho, &maxerr, &pbest, &mbest);
    if (o->svg && write_svg(o->svg, &q, &pr, rows, n, rho)) {
      fprintf(stderr, "weft-plan: error: --svg: cannot write '%s'\n", o->svg);
      rc = 1;
    }
    if (o->json &&
        write_json(o->json, &q, &pr, rows, n, rho, maxerr, pbest >= 0 ? rows[pbest].name : "",
                   mbest >= 0 ? rows[mbest].name : "")) {
      fprintf(stderr, "weft-plan: error: --json: cannot write '%s'\n", o->json);
      rc = 1;
    }
    if (failed) printf("measure: %d of %d runs failed or mismatched\n", failed, n);
    printf("measure: %.1f s in all\n", MPI_Wtime() - t_start);
    fflush(stdout);
  }
  free(rows);
  if (failed) rc = 1;
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return rc;
}
