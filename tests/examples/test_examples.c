/* tests/examples: weft-train and weft-plan end to end, as a user runs them
 * (mpiexec -n N <program> flags...), sized for 2 shared cores.
 *
 * Each case starts mpiexec (or the program itself) with posix_spawn,
 * stdout and stderr redirected to files, MPIEXEC_TIMEOUT below the
 * Criterion timeout so a hang fails instead of blocking, and checks the
 * exit status, the output and the wall time. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <fcntl.h>
#include <dirent.h>
#include <math.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend.h" /* weft_device_count: is --device cuda runnable here */
#include "golden.h"
#include "harness.h"
#include "stats.h" /* examples/plan: plan_ranks, plan_spearman */

extern char **environ;

#define TRAIN WEFT_EXAMPLES_DIR "/weft-train"
#define PLAN WEFT_EXAMPLES_DIR "/weft-plan"

typedef struct run_out {
  int rc;      /* exit status, 128 + signal, or -1 */
  double secs; /* wall time */
  char *out;   /* stdout (malloc'ed) */
  char *err;   /* stderr */
} run_out;

/* The file's text, "" when it cannot be read (the caller frees). */
static char *slurp(const char *path) {
  char *b = weft_test_slurp(path, NULL);
  return b ? b : strdup("");
}

static int tmp_counter = 0;

/* "/tmp/weft-test-examples-<pid>-<name>": this process's own file, so runs
 * of the suite side by side (two builds) do not clobber each other's. The
 * result stays valid for the next 15 calls. */
static const char *tmp_file(const char *name) {
  static char ring[16][256];
  static int next = 0;
  char *b = ring[next++ % 16];
  snprintf(b, sizeof ring[0], "/tmp/weft-test-examples-%d-%s", (int)getpid(), name);
  return b;
}

/* rm -rf of a tmp_file directory, and of the earlier checkpoints weft-train
 * keeps beside a --save directory (DIR.step-N). */
static void remove_tree(const char *dir) {
  char cmd[640];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'.step-*", dir, dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

/* Skips the test, saying why, where this process sees no WEFT_CUDA device
 * (the device tests run on the emulated device and on GPUs). */
#define SKIP_WITHOUT_DEVICE()                                                             \
  do {                                                                                    \
    if (weft_device_count(WEFT_CUDA) == 0)                                                \
      cr_skip(                                                                            \
          "no WEFT_CUDA device here (%s): runs on the emulated device (-Dcuda=emulated) " \
          "and on GPUs",                                                                  \
          weft_backend_get(WEFT_CUDA) ? "the CUDA backend is built but sees no GPU"       \
                                      : "this build has no CUDA backend");                \
  } while (0)

/* Runs `mpiexec -n nranks prog args...` (nranks 0: prog args... directly). */
static run_out run(int nranks, const char *prog, const char *const *args, int timeout_s) {
  run_out r = {-1, 0, NULL, NULL};
  char outp[256], errp[256];
  snprintf(outp, sizeof outp, "/tmp/weft-test-examples-%d-%d.out", (int)getpid(), tmp_counter);
  snprintf(errp, sizeof errp, "/tmp/weft-test-examples-%d-%d.err", (int)getpid(), tmp_counter++);
  const char *argv[64];
  int n = 0;
  char nbuf[16];
  if (nranks > 0) {
    snprintf(nbuf, sizeof nbuf, "%d", nranks);
    argv[n++] = WEFT_TEST_MPIEXEC;
    argv[n++] = "-n";
    argv[n++] = nbuf;
  }
  argv[n++] = prog;
  for (int i = 0; args && args[i] && n < 62; i++) argv[n++] = args[i];
  argv[n] = NULL;
  /* environment: ours with MPIEXEC_TIMEOUT replaced */
  int ne = 0;
  while (environ[ne]) ne++;
  char **envp = calloc((size_t)ne + 2, sizeof *envp);
  int k = 0;
  for (int i = 0; i < ne; i++)
    if (strncmp(environ[i], "MPIEXEC_TIMEOUT=", 16)) envp[k++] = environ[i];
  char tbuf[64];
  snprintf(tbuf, sizeof tbuf, "MPIEXEC_TIMEOUT=%d", timeout_s);
  envp[k++] = tbuf;
  envp[k] = NULL;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, outp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  pid_t pid;
  if (posix_spawn(&pid, argv[0], &fa, NULL, (char *const *)argv, envp) == 0) {
    int st = 0;
    waitpid(pid, &st, 0);
    r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  posix_spawn_file_actions_destroy(&fa);
  free(envp);
  r.secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  r.out = slurp(outp);
  r.err = slurp(errp);
  unlink(outp);
  unlink(errp);
  return r;
}

static void run_free(run_out *r) {
  free(r->out);
  free(r->err);
}

static int count_lines(const char *s) {
  int n = 0;
  for (; *s; s++) n += *s == '\n';
  return n;
}

/* The last "loss" and "val_loss" of a --log-json file (one object a line). */
static bool read_json_last(const char *path, double *loss, double *val_loss, int *lines) {
  char *t = slurp(path);
  *lines = count_lines(t);
  char *last = NULL;
  for (char *p = t; (p = strstr(p, "\"loss\":")); p++) last = p;
  bool ok = last != NULL;
  if (last) *loss = strtod(last + 7, NULL);
  char *v = NULL;
  for (char *p = t; (p = strstr(p, "\"val_loss\":")); p++) v = p;
  if (v)
    *val_loss = strtod(v + 11, NULL);
  else
    ok = false;
  free(t);
  return ok;
}

/* ---------------------------------------------------------------- training */

Test(examples, train_2x2_reaches_the_1_rank_loss, .timeout = 120) {
  const char *j1 = tmp_file("1rank.jsonl"), *j4 = tmp_file("2x2.jsonl");
  const char *a1[] = {"--steps", "12", "--val-every", "6", "--log-json", j1, NULL};
  const char *a4[] = {"--mesh", "dp=2,tp=2",  "--steps", "12", "--val-every",
                      "6",      "--log-json", j4,        NULL};
  run_out r1 = run(1, TRAIN, a1, 50);
  cr_assert_eq(r1.rc, 0, "1-rank run failed (rc %d): %s", r1.rc, r1.err);
  run_out r4 = run(4, TRAIN, a4, 90);
  cr_assert_eq(r4.rc, 0, "2x2 run failed (rc %d): %s", r4.rc, r4.err);
  double l1 = 0, l4 = 0, v1 = 0, v4 = 0;
  int n1 = 0, n4 = 0;
  cr_assert(read_json_last(j1, &l1, &v1, &n1), "no loss/val_loss in %s", j1);
  cr_assert(read_json_last(j4, &l4, &v4, &n4), "no loss/val_loss in %s", j4);
  cr_assert_eq(n1, 12, "want one JSON line per step, got %d", n1);
  cr_assert_eq(n4, 12, "want one JSON line per step, got %d", n4);
  cr_assert(fabs(l4 - l1) <= 0.01 * l1, "final loss 2x2 %.6f vs 1 rank %.6f (> 1%%)", l4, l1);
  cr_assert(fabs(v4 - v1) <= 0.01 * v1, "held-out loss 2x2 %.6f vs 1 rank %.6f (> 1%%)", v4, v1);
  /* it learns: well below ln V = ln 64 = 4.159 after 12 steps */
  cr_assert(l1 < 3.6 && v1 < 3.6, "the demo model did not learn: loss %.4f, held-out %.4f", l1, v1);
  cr_assert(strstr(r4.out, "summary") && strstr(r4.out, "held-out accuracy"), "no summary:\n%s",
            r4.out);
  cr_assert(strstr(r4.out, "step   12/12") != NULL, "no step lines:\n%s", r4.out);
  /* the 2x2 run communicates on both dims */
  cr_assert(strstr(r4.out, " dp ") && strstr(r4.out, " tp "), "no per-dim comm:\n%s", r4.out);
  run_free(&r1);
  run_free(&r4);
  unlink(j1);
  unlink(j4);
}

/* Each rank runs under `sh -c` that prints "rank-exit <status>" after the
 * program ends, so the test sees every rank's own exit status. */
static const char *const RANK_EXIT_SH = "\"$0\" \"$@\"; rc=$?; echo \"rank-exit $rc\"; exit $rc";

/* One bad invocation: non-zero exit on every rank, one error line, no hang.
 * expect_error_sh runs each rank under its own sh -c script (it must run
 * "$0" "$@" and print "rank-exit <status>" as RANK_EXIT_SH does). */
static void expect_error_of(const char *prog, const char *prefix, int nranks, const char *script,
                            const char *const *args, const char *needle) {
  const char *argv[40] = {"-c", script, prog};
  int n = 3;
  for (int i = 0; args[i] && n < 39; i++) argv[n++] = args[i];
  argv[n] = NULL;
  run_out r = run(nranks, "/bin/sh", argv, 30);
  int exits = 0, nonzero = 0;
  for (const char *p = r.out; (p = strstr(p, "rank-exit ")); p += 10) {
    exits++;
    nonzero += atoi(p + 10) != 0;
  }
  cr_expect_eq(exits, nranks, "[%s] %d ranks reported an exit status, want %d:\n%s", needle, exits,
               nranks, r.out);
  cr_expect_eq(nonzero, nranks, "[%s] %d of %d ranks exited non-zero", needle, nonzero, nranks);
  cr_expect_neq(r.rc, 0, "[%s] want a non-zero exit, got 0", needle);
  cr_expect(r.rc < 128, "[%s] killed (rc %d): a hang or a crash", needle, r.rc);
  cr_expect(r.secs < 25, "[%s] took %.1f s", needle, r.secs);
  cr_expect_eq(count_lines(r.err), 1, "[%s] want one line on stderr, got:\n%s", needle, r.err);
  cr_expect(strstr(r.err, needle) != NULL, "[%s] not in stderr:\n%s", needle, r.err);
  cr_expect(strstr(r.err, prefix) != NULL, "[%s] no error prefix:\n%s", needle, r.err);
  run_free(&r);
}
static void expect_error_sh(int nranks, const char *script, const char *const *args,
                            const char *needle) {
  expect_error_of(TRAIN, "weft-train: error:", nranks, script, args, needle);
}
static void expect_error(int nranks, const char *const *args, const char *needle) {
  expect_error_sh(nranks, RANK_EXIT_SH, args, needle);
}

Test(examples, train_bad_input_gives_one_line_and_nonzero_exit_on_every_rank, .timeout = 200) {
  const char *a1[] = {"--bogus-flag", NULL};
  expect_error(2, a1, "unknown flag '--bogus-flag'");
  const char *a2[] = {"--mesh", "dp=3,tp=2", NULL};
  expect_error(2, a2, "needs 6 ranks but the world has 2");
  const char *a3[] = {"--mesh", "tp=2", "--dim", "48", "--heads", "3", NULL};
  expect_error(2, a3, "must be divisible by tp=2");
  const char *a4[] = {"--data", "/nonexistent/train.bin", NULL};
  expect_error(2, a4, "cannot open data file '/nonexistent/train.bin'");
  const char *a5[] = {"--steps", "ten", NULL};
  expect_error(2, a5, "--steps: want an integer");
  const char *a6[] = {"--mesh", "dp=2,pp=1", NULL};
  expect_error(2, a6, "unknown dim 'pp'");
  const char *a7[] = {"--device", "cuda", NULL};
  if (weft_device_count(WEFT_CUDA) == 0) /* else it trains (the emulated device, a GPU) */
    expect_error(2, a7, "--device cuda: ");
  const char *a8[] = {"--batch", "3", NULL};
  expect_error(2, a8, "divisible by the data-parallel size 2");
  const char *a9[] = {"--text", "/nonexistent.txt", "--vocab", "256", NULL};
  expect_error(2, a9, "cannot open text file");
  const char *a10[] = {"--model", "huge", NULL};
  expect_error(2, a10, "unknown preset 'huge'");
  const char *a11[] = {"--mesh", "tp=2", "--cpu-offload", NULL};
  expect_error(2, a11,
               "--cpu-offload: offloading is FSDP's (its sharded state) and needs a dp dim");
  const char *a12[] = {"--mesh", "tp=2", "--dtype", "bf16", NULL};
  expect_error(2, a12, "--dtype bf16: bf16 is FSDP's mixed precision and needs a dp dim");
  const char *a13[] = {"--on-nonfinite", "ignore", NULL};
  expect_error(2, a13, "--on-nonfinite: want stop or skip (got 'ignore')");
  const char *a14[] = {"--keep-checkpoints", "0", NULL};
  expect_error(2, a14, "--keep-checkpoints: want an integer in [1, 1000]");
  const char *a15[] = {"--max-skipped-steps", "-1", NULL};
  expect_error(2, a15, "--max-skipped-steps: want an integer in [1, 1000000000]");
}

/* Issue 34 findings 2 and 8: numbers past any use segfaulted, corrupted the
 * heap (the step-time record was indexed without bounds), grew memory
 * without output, ran until killed, overflowed in their own message or
 * became inf. Each is now one error line before any work, on every rank. */
Test(examples, train_numbers_past_their_range_are_errors_before_any_work, .timeout = 200) {
  struct {
    const char *args[5], *needle;
  } cases[] = {
      {{"--steps", "2305843009213693952"}, "--steps: want an integer in [0, 1000000000]"},
      {{"--steps", "9223372036854775807"}, "--steps: want an integer in [0, 1000000000]"},
      {{"--steps", "99999999999999999999"}, "--steps: want an integer"},
      {{"--layers", "100000000"}, "--layers: want an integer in [1, 4096]"},
      {{"--grad-accum", "4611686018427387904"}, "--grad-accum: want an integer in [1, 1048576]"},
      {{"--val-batches", "9223372036854775807"}, "--val-batches: want an integer in [0, 1048576]"},
      {{"--seq-len", "9223372036854775807"}, "--seq-len: want an integer in [1, 1048576]"},
      {{"--lr", "1e39"}, "--lr: want a number in [0, 1e+30]"},
      {{"--lr", "nan"}, "--lr: want a number"},
      {{"--seed", "-1"}, "--seed: want an integer in [0, 2^64 - 1]"},
      {{"--quiet=maybe"}, "--quiet takes no value, or true / false (got 'maybe')"},
      {{"--layers", "4096", "--dim", "65536"}, "more than this machine's"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    expect_error(2, cases[i].args, cases[i].needle);
  /* a value read from a checkpoint has a range too: train.step -7 resumed
   * "at step -7" and corrupted the heap (the metadata checksum is dropped:
   * this stands for a checkpoint written without one) */
  const char *dir = tmp_file("ckpt-range");
  remove_tree(dir);
  const char *save[] = {"--steps", "2", "--save", dir, NULL};
  run_out w = run(1, TRAIN, save, 60);
  cr_assert_eq(w.rc, 0, "save: %s", w.err);
  run_free(&w);
  char meta[512];
  snprintf(meta, sizeof meta, "%s/metadata.json", dir);
  char *text = slurp(meta);
  cr_assert_not_null(text);
  char *v = strstr(text, "\"train.step\":{\"type\":\"int\",\"value\":\"2\"}");
  char *sum = strstr(text, ",\"checksum\":");
  cr_assert(v && sum, "no train.step or checksum in %s", meta);
  FILE *f = fopen(meta, "w");
  cr_assert_not_null(f);
  fprintf(f, "%.*s\"train.step\":{\"type\":\"int\",\"value\":\"-7\"}%.*s}", (int)(v - text), text,
          (int)(sum - v - 39), v + 39);
  fclose(f);
  free(text);
  const char *res[] = {"--steps", "4", "--resume", dir, NULL};
  expect_error(2, res, "value 'train.step' = -7 is outside [0, 10^9]");
  remove_tree(dir);
  /* at the bounds: a uint64 seed and --quiet=1 are taken */
  const char *ok[] = {"--steps", "1", "--seed", "18446744073709551615", "--quiet=1", NULL};
  run_out r = run(1, TRAIN, ok, 60);
  cr_expect_eq(r.rc, 0, "--seed 2^64-1 --quiet=1: rc %d:\n%s%s", r.rc, r.out, r.err);
  cr_expect(strstr(r.out, "step    1/1") == NULL, "--quiet=1 printed step lines:\n%s", r.out);
  run_free(&r);
}

Test(examples, train_help_documents_every_flag, .timeout = 30) {
  const char *a[] = {"--help", NULL};
  run_out r = run(1, TRAIN, a, 20);
  cr_assert_eq(r.rc, 0);
  static const char *const flags[] = {"--mesh",
                                      "--model",
                                      "--dim",
                                      "--layers",
                                      "--heads",
                                      "--kv-heads",
                                      "--ffn-dim",
                                      "--vocab",
                                      "--seq-len",
                                      "--steps",
                                      "--batch",
                                      "--grad-accum",
                                      "--lr",
                                      "--warmup",
                                      "--weight-decay",
                                      "--beta1",
                                      "--beta2",
                                      "--eps",
                                      "--clip",
                                      "--seed",
                                      "--dtype",
                                      "--reshard-after-forward",
                                      "--sequence-parallel",
                                      "--cpu-offload",
                                      "--device",
                                      "--matmul",
                                      "--data",
                                      "--val-data",
                                      "--text",
                                      "--save",
                                      "--save-every",
                                      "--resume",
                                      "--keep-checkpoints",
                                      "--on-nonfinite",
                                      "--max-skipped-steps",
                                      "--export-safetensors",
                                      "--init-from",
                                      "--log-json",
                                      "--tp-across-nodes",
                                      "--tp-inside-node",
                                      NULL};
  for (int i = 0; flags[i]; i++)
    cr_expect(strstr(r.out, flags[i]) != NULL, "--help lacks %s", flags[i]);
  run_free(&r);
}

Test(examples, train_flag_variants_run_and_learn, .timeout = 120) {
  static const char *const variants[][8] = {
      {"--mesh", "dp=2", "--dtype", "bf16", NULL},
      {"--model", "gpt2-demo", "--mesh", "dp=2", "--dtype", "bf16", NULL},
      {"--mesh", "tp=2", "--sequence-parallel", NULL},
      {"--mesh", "dp=2", "--reshard-after-forward=false", "--grad-accum", "2", NULL},
      {"--mesh", "dp_replicate=2", NULL},
      {"--mesh", "tp=2", "--no-loss-parallel", "--kv-heads", "2", NULL},
  };
  for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
    const char *argv[16];
    int n = 0;
    for (int i = 0; variants[v][i]; i++) argv[n++] = variants[v][i];
    argv[n++] = "--steps";
    argv[n++] = "4";
    argv[n++] = "--log-json";
    argv[n++] = tmp_file("v.jsonl");
    argv[n] = NULL;
    run_out r = run(2, TRAIN, argv, 60);
    cr_expect_eq(r.rc, 0, "variant %zu (%s %s) failed: %s", v, variants[v][0], variants[v][1],
                 r.err);
    double l = 0, vl = 0;
    int lines = 0;
    cr_expect(read_json_last(tmp_file("v.jsonl"), &l, &vl, &lines));
    cr_expect(l < 4.0 && vl < 4.0, "variant %zu does not learn: loss %.4f, held-out %.4f", v, l,
              vl);
    run_free(&r);
  }
  unlink(tmp_file("v.jsonl"));
}

/* ------------------------------------------- mesh layout over nodes */

/* An sh -c script that runs the rank in a UTS namespace of its own whose
 * host name is weftnode<node_expr> (shell arithmetic on PMI_RANK), so
 * weft_init sees emulated nodes, then does what RANK_EXIT_SH does. */
static const char *node_sh(const char *node_expr, char *buf, size_t cap) {
  snprintf(buf, cap, "exec unshare -u sh -c 'hostname weftnode$((%s)) && %s' \"$0\" \"$@\"",
           node_expr, RANK_EXIT_SH);
  return buf;
}

static int read_json_losses(const char *path, double *loss, int cap);

static bool can_emulate_nodes(void) { return system("unshare -u true >/dev/null 2>&1") == 0; }

/* AdamW's --beta1, --beta2 and --eps (nanoGPT trains with beta2 0.95):
 * torch's defaults given explicitly change no bit of the loss curve;
 * beta2 0.95 and eps 1e-6 change it from step 3 on (AdamW's first step is
 * sign-like, its bias corrections cancel the betas) and the checkpoint
 * records them; a beta of 1 and a negative eps are refused. */
Test(examples, train_adamw_betas_and_eps_flags, .timeout = 120) {
  enum { STEPS = 3 };
  const char *dir = tmp_file("betas-ckpt");
  remove_tree(dir);
  double loss[3][STEPS];
  for (int v = 0; v < 3; v++) {
    const char *j = tmp_file("betas.jsonl");
    const char *a[16] = {"--steps", "3", "--val-every", "0", "--log-json", j};
    int n = 6;
    if (v == 1) {
      const char *more[] = {"--beta1", "0.9", "--beta2", "0.999", "--eps", "1e-8"};
      for (int k = 0; k < 6; k++) a[n++] = more[k];
    } else if (v == 2) {
      const char *more[] = {"--beta2", "0.95", "--eps", "1e-6", "--save", dir};
      for (int k = 0; k < 6; k++) a[n++] = more[k];
    }
    a[n] = NULL;
    run_out r = run(1, TRAIN, a, 60);
    cr_assert_eq(r.rc, 0, "run %d: rc %d: %s", v, r.rc, r.err);
    cr_assert_eq(read_json_losses(j, loss[v], STEPS), STEPS);
    unlink(j);
    run_free(&r);
  }
  for (int s = 0; s < STEPS; s++)
    cr_expect_eq(loss[1][s], loss[0][s], "explicit defaults, step %d: %.17g vs %.17g", s + 1,
                 loss[1][s], loss[0][s]);
  cr_expect_neq(loss[2][STEPS - 1], loss[0][STEPS - 1], "beta2 0.95 left step %d's loss at %.17g",
                STEPS, loss[0][STEPS - 1]);
  char meta[512];
  snprintf(meta, sizeof meta, "%s/metadata.json", dir);
  char *text = slurp(meta);
  cr_assert_not_null(text);
  /* the f32 hyper-parameters as doubles: 0.95f (JSON), 1e-6f (hex) */
  cr_expect(strstr(text, "0.949999988079071]") != NULL, "beta2 0.95 not in %s", meta);
  cr_expect(strstr(text, "\"0x1.0c6f7ap-20\"") != NULL, "eps 1e-6 not in %s", meta);
  free(text);
  remove_tree(dir);
  const char *b1[] = {"--beta1", "1", NULL};
  expect_error(2, b1, "--beta1 1: want a number in [0, 1)");
  const char *b2[] = {"--beta2", "2", NULL};
  expect_error(2, b2, "--beta2: want a number in [0, 1]");
  const char *e[] = {"--eps", "-1", NULL};
  expect_error(2, e, "--eps: want a number in [0, 1]");
}

/* --tp-across-nodes lays tp outermost (tp groups {0, 2}, {1, 3} instead of
 * {0, 1}, {2, 3}); the per-step losses must not change (bitwise: the dims,
 * coordinates and reduction orders are the layout's own, only the world
 * ranks move). --tp-inside-node keeps the default layout. */
Test(examples, train_tp_layout_flags_keep_the_loss_curve, .timeout = 120) {
  enum { STEPS = 3 };
  const char *flag[3] = {NULL, "--tp-across-nodes", "--tp-inside-node"};
  const char *pic[3] = {"[[0, 1], [2, 3]]", "[[0, 2], [1, 3]]", "[[0, 1], [2, 3]]"};
  double loss[3][STEPS];
  for (int v = 0; v < 3; v++) {
    const char *j = tmp_file("layout.jsonl");
    const char *a[] = {"--mesh", "dp=2,tp=2",  "--steps", "3",     "--val-every",
                       "0",      "--log-json", j,         flag[v], NULL};
    run_out r = run(4, TRAIN, a, 60);
    cr_assert_eq(r.rc, 0, "%s: rc %d: %s", flag[v] ? flag[v] : "default", r.rc, r.err);
    cr_expect(strstr(r.out, pic[v]) != NULL, "%s: want the layout %s in:\n%s",
              flag[v] ? flag[v] : "default", pic[v], r.out);
    cr_expect(strstr(r.out, "step time (after step 1)") != NULL, "no step time:\n%s", r.out);
    cr_assert_eq(read_json_losses(j, loss[v], STEPS), STEPS);
    char *t = slurp(j);
    cr_expect(strstr(t, "\"comm_seconds\":{\"dp\":") != NULL, "no comm_seconds:\n%s", t);
    free(t);
    unlink(j);
    run_free(&r);
  }
  for (int v = 1; v < 3; v++)
    for (int s = 0; s < STEPS; s++) {
      cr_expect(fabs(loss[v][s] - loss[0][s]) <= 1e-6 * fabs(loss[0][s]),
                "%s step %d: %.17g vs default %.17g", flag[v], s + 1, loss[v][s], loss[0][s]);
      if (loss[v][s] != loss[0][s])
        printf("note: %s step %d differs from the default in the last bits (%.17g vs %.17g)\n",
               flag[v], s + 1, loss[v][s], loss[0][s]);
    }
}

/* --dtype bf16 on a Llama preset trains models/llama (the same model on the
 * op graph) under FSDP mixed precision: bf16 parameters and activations.
 * Its loss curve tracks the fp32 run within 2% and its peak is lower. */
Test(examples, train_bf16_llama_tracks_fp32_with_a_lower_peak, .timeout = 120) {
  enum { STEPS = 30 };
  double loss[2][STEPS], peak[2] = {0, 0};
  for (int k = 0; k < 2; k++) {
    const char *j = tmp_file("bf16.jsonl");
    const char *a[] = {"--mesh",
                       "dp=2",
                       "--steps",
                       "30",
                       "--val-every",
                       "0",
                       "--log-json",
                       j,
                       k ? "--dtype" : NULL,
                       "bf16",
                       NULL};
    run_out r = run(2, TRAIN, a, 90);
    cr_assert_eq(r.rc, 0, "%s: rc %d: %s", k ? "bf16" : "fp32", r.rc, r.err);
    cr_assert_eq(read_json_losses(j, loss[k], STEPS), STEPS);
    const char *m = strstr(r.out, "peak memory (max rank)");
    cr_assert(m && sscanf(m + strlen("peak memory (max rank)"), "%lf", &peak[k]) == 1,
              "no peak memory in:\n%s", r.out);
    unlink(j);
    run_free(&r);
  }
  for (int s = 0; s < STEPS; s++)
    cr_expect(fabs(loss[1][s] - loss[0][s]) <= 0.02 * fabs(loss[0][s]),
              "step %d: bf16 loss %.6f vs fp32 %.6f", s + 1, loss[1][s], loss[0][s]);
  cr_expect(loss[0][STEPS - 1] < 0.8 * loss[0][0], "fp32 did not learn: %.4f -> %.4f", loss[0][0],
            loss[0][STEPS - 1]);
  cr_expect(peak[1] < peak[0], "bf16 peak %.1f MiB, fp32 %.1f MiB", peak[1], peak[0]);
}

/* Issue 43's memory target: GPT-2 in bf16 (gpt2-tiny, FSDP on dp=2) needs
 * far less memory than fp32. The op graph's buffers (the activations and
 * the grads in flight, `--profile`'s "peak") are half of fp32's (measured
 * 43.3 / 86.0 MiB = 0.50). The whole peak was 0.57 of fp32's (148.8 /
 * 261.9 MiB, then 140.8 / 245.9) while backward kept every activation's
 * grad until the step ended; since it returns each consumed grad to the
 * pool both fell (85.4 / 135.2 MiB) and the fixed part weighs more: the
 * f32 master weights, grads and AdamW state that bf16 keeps as fp32 does,
 * so the whole ratio is 0.63 and is pinned at 0.65. */
Test(examples, train_bf16_gpt2_graph_needs_half_of_fp32s_memory, .timeout = 120) {
  double peak[2] = {0, 0}, graph[2] = {0, 0};
  for (int k = 0; k < 2; k++) {
    const char *a[] = {
        "--model",     "gpt2-tiny", "--mesh",    "dp=2",    "--steps",           "2",
        "--val-every", "0",         "--profile", "--dtype", k ? "bf16" : "fp32", NULL};
    run_out r = run(2, TRAIN, a, 90);
    cr_assert_eq(r.rc, 0, "%s: rc %d: %s", k ? "bf16" : "fp32", r.rc, r.err);
    const char *m = strstr(r.out, "peak memory (max rank)");
    cr_assert(m && sscanf(m + strlen("peak memory (max rank)"), "%lf", &peak[k]) == 1,
              "no peak memory in:\n%s", r.out);
    const char *p = strstr(r.out, "op graph per step:");
    p = p ? strstr(p, ", peak ") : NULL;
    cr_assert(p && sscanf(p, ", peak %lf MiB", &graph[k]) == 1, "no graph peak in:\n%s", r.out);
    run_free(&r);
  }
  cr_expect(graph[1] <= 0.52 * graph[0], "bf16 graph peak %.1f MiB is %.3f of fp32's %.1f MiB",
            graph[1], graph[1] / graph[0], graph[0]);
  cr_expect(peak[1] <= 0.65 * peak[0], "bf16 peak %.1f MiB is %.3f of fp32's %.1f MiB", peak[1],
            peak[1] / peak[0], peak[0]);
}

Test(examples, train_tp_layout_flag_errors, .timeout = 120) {
  const char *a1[] = {"--mesh", "dp=2,tp=2", "--tp-across-nodes", "--tp-inside-node", NULL};
  expect_error(4, a1, "--tp-across-nodes and --tp-inside-node contradict each other");
  const char *a2[] = {"--tp-across-nodes", "--mesh", "dp=2", NULL};
  expect_error(2, a2, "--tp-across-nodes: --mesh has no tp dim");
  const char *a3[] = {"--tp-inside-node", NULL};
  expect_error(2, a3, "--tp-inside-node: --mesh has no tp dim");
  /* one host whose LOCAL_WORLD_SIZE says 2 ranks per node */
  const char *a4[] = {"--mesh", "tp=4", "--tp-inside-node", NULL};
  char script[512];
  snprintf(script, sizeof script, "LOCAL_WORLD_SIZE=2 %s", RANK_EXIT_SH);
  expect_error_sh(4, script, a4, "--tp-inside-node: tp=4 does not divide the 2 ranks per node");
}

/* Emulated nodes (a UTS namespace a rank, unshare -u; skipped where not
 * permitted): 2 nodes x 2 ranks take --tp-inside-node and
 * --tp-across-nodes; unequal nodes and ranks placed round-robin over the
 * nodes fail --tp-inside-node with the node sizes / the straddling group. */
Test(examples, train_tp_inside_node_on_emulated_nodes, .timeout = 150) {
  if (!can_emulate_nodes()) cr_skip_test("unshare -u is not permitted here");
  char script[512];
  const char *flags[2] = {"--tp-inside-node", "--tp-across-nodes"};
  for (int v = 0; v < 2; v++) {
    const char *a[] = {"-c",        node_sh("PMI_RANK / 2", script, sizeof script),
                       TRAIN,       "--mesh",
                       "dp=2,tp=2", "--steps",
                       "2",         "--val-every",
                       "0",         flags[v],
                       NULL};
    run_out r = run(4, "/bin/sh", a, 60);
    cr_expect_eq(r.rc, 0, "%s on 2 nodes x 2: rc %d:\n%s", flags[v], r.rc, r.err);
    cr_expect(strstr(r.out, "summary") != NULL, "%s: no summary:\n%s", flags[v], r.out);
    run_free(&r);
  }
  const char *a1[] = {"--mesh", "dp=3,tp=1", "--batch", "6", "--tp-inside-node", NULL};
  expect_error_sh(3, node_sh("PMI_RANK / 2", script, sizeof script), a1,
                  "--tp-inside-node: nodes hold different numbers of ranks (node 0: 2, node 1: 1)");
  const char *a2[] = {"--mesh", "dp=2,tp=2", "--tp-inside-node", NULL};
  expect_error_sh(4, node_sh("PMI_RANK % 2", script, sizeof script), a2,
                  "the tp group of world ranks 0..1 spans nodes 0 and 1");
}

static void write_bin(const char *path, int n, int magic, int V) {
  FILE *f = fopen(path, "wb");
  int32_t h[256] = {0};
  h[0] = magic;
  h[1] = 1;
  h[2] = n;
  fwrite(h, sizeof h, 1, f);
  for (int i = 0; i < n; i++) {
    uint16_t t = (uint16_t)((i * 7 + (i / 5)) % V); /* a learnable pattern */
    fwrite(&t, 2, 1, f);
  }
  fclose(f);
}

Test(examples, train_reads_llm_c_bin_and_text_files, .timeout = 120) {
  const char *bin = tmp_file("data.bin"), *badb = tmp_file("bad.bin");
  const char *txt = tmp_file("data.txt");
  write_bin(bin, 4000, 20240520, 64);
  write_bin(badb, 4000, 12345, 64);
  FILE *f = fopen(txt, "w");
  for (int i = 0; i < 200; i++)
    fprintf(f, "the quick brown fox jumps over the lazy dog %d\n", i % 10);
  fclose(f);
  const char *a1[] = {"--mesh", "dp=2", "--data", bin, "--steps", "4", NULL};
  run_out r = run(2, TRAIN, a1, 50);
  cr_expect_eq(r.rc, 0, "bin run failed: %s", r.err);
  cr_expect(strstr(r.out, "held-out loss") != NULL, "%s", r.out);
  run_free(&r);
  const char *a2[] = {"--mesh", "tp=2", "--text", txt, "--vocab", "256", "--steps", "3", NULL};
  r = run(2, TRAIN, a2, 50);
  cr_expect_eq(r.rc, 0, "text run failed: %s", r.err);
  run_free(&r);
  const char *a3[] = {"--data", badb, "--steps", "2", NULL};
  expect_error(2, a3, "bad magic 12345");
  const char *a4[] = {"--data", bin, "--vocab", "32", "--steps", "2", NULL};
  expect_error(2, a4, ">= the model's vocab 32");
  unlink(bin);
  unlink(badb);
  unlink(txt);
}

/* Issue 34 finding 6: --save-errors continue. Every data-file write of
 * rank 1 fails with ENOSPC (WEFT_DCP_FAULT=1:write:enospc, dcp's test
 * hook): with continue the run warns at each failed save and trains on to
 * the last step, whose save failing still ends it with an error; by
 * default the first failed save stops the run. No failed save leaves a
 * file behind. */
Test(examples, train_save_errors_continue_trains_on_after_a_failed_save, .timeout = 120) {
  const char *dir = tmp_file("ckpt-enospc");
  remove_tree(dir);
  const char *cont[] = {"WEFT_DCP_FAULT=1:write:enospc",
                        TRAIN,
                        "--mesh",
                        "dp=2",
                        "--steps",
                        "4",
                        "--save",
                        dir,
                        "--save-every",
                        "1",
                        "--save-errors",
                        "continue",
                        NULL};
  run_out r = run(2, "/usr/bin/env", cont, 60);
  cr_expect_neq(r.rc, 0, "the last save failed, yet exit 0");
  cr_expect(strstr(r.out, "step    4/4") != NULL, "did not train on to step 4:\n%s", r.out);
  int warnings = 0;
  for (const char *p = r.err; (p = strstr(p, "weft-train: warning: --save")); p++) warnings++;
  cr_expect_eq(warnings, 3, "want a warning for each of the 3 async saves:\n%s", r.err);
  cr_expect(strstr(r.err, "No space left on device") != NULL, "%s", r.err);
  run_free(&r);
  DIR *d = opendir(dir);
  int files = 0;
  struct dirent *e;
  while (d && (e = readdir(d)))
    if (e->d_name[0] != '.') files++;
  if (d) closedir(d);
  cr_expect_eq(files, 0, "failed saves left %d file(s) in %s", files, dir);
  cont[10] = NULL; /* the same run without --save-errors continue */
  r = run(2, "/usr/bin/env", cont, 60);
  cr_expect_neq(r.rc, 0, "a failed save did not stop the run");
  cr_expect(strstr(r.out, "step    4/4") == NULL, "trained on after a failed save:\n%s", r.out);
  run_free(&r);
  remove_tree(dir);
}

/* Issue 34's fault suite, CLI part: every numeric flag just past each end
 * of its range, and a non-number, is one error line naming the flag and
 * the range (the ranges as examples/train/options.c states them), on 1
 * rank, before any work. */
Test(examples, train_every_numeric_flag_is_refused_past_both_ends_of_its_range, .timeout = 300) {
  static const struct {
    const char *flag;
    long long lo, hi;
  } ints[] = {
      {"--steps", 0, 1000000000},
      {"--batch", 1, 1 << 20},
      {"--grad-accum", 1, 1 << 20},
      {"--warmup", 0, 1000000000},
      {"--val-every", 0, 1000000000},
      {"--val-batches", 0, 1 << 20},
      {"--save-every", 0, 1000000000},
      {"--keep-checkpoints", 1, 1000},
      {"--max-skipped-steps", 1, 1000000000},
      {"--dim", 1, 1 << 16},
      {"--layers", 1, 1 << 12},
      {"--heads", 1, 1 << 12},
      {"--kv-heads", 1, 1 << 12},
      {"--ffn-dim", 1, 1 << 20},
      {"--vocab", 1, 1 << 24},
      {"--seq-len", 1, 1 << 20},
  };
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
    char range[128], past[32], below[32];
    snprintf(range, sizeof range, "%s: want an integer in [%lld, %lld]", ints[i].flag, ints[i].lo,
             ints[i].hi);
    snprintf(past, sizeof past, "%lld", ints[i].hi + 1);
    snprintf(below, sizeof below, "%lld", ints[i].lo - 1);
    const char *a[] = {ints[i].flag, past, NULL}, *b[] = {ints[i].flag, below, NULL},
               *c[] = {ints[i].flag, "12x", NULL};
    expect_error(1, a, range);
    expect_error(1, b, range);
    expect_error(1, c, range);
  }
  static const struct {
    const char *flag, *range;
  } dbls[] = {{"--lr", "[0, 1e+30]"},
              {"--min-lr", "[0, 1e+30]"},
              {"--weight-decay", "[0, 1e+30]"},
              {"--clip", "[0, 1e+30]"},
              {"--dropout", "[0, 1]"}};
  for (size_t i = 0; i < sizeof dbls / sizeof dbls[0]; i++) {
    char need[96];
    snprintf(need, sizeof need, "%s: want a number in %s", dbls[i].flag, dbls[i].range);
    const char *past = strcmp(dbls[i].flag, "--dropout") ? "1e31" : "1.5";
    const char *a[] = {dbls[i].flag, past, NULL}, *b[] = {dbls[i].flag, "-1", NULL},
               *c[] = {dbls[i].flag, "inf", NULL};
    expect_error(1, a, need);
    expect_error(1, b, need);
    expect_error(1, c, need);
  }
}

/* tokens[at] of a bin file written by write_bin set to `token`. */
static void poke_token(const char *path, int at, uint16_t token) {
  FILE *f = fopen(path, "r+b");
  cr_assert_not_null(f, "%s", path);
  fseek(f, 1024 + 2L * at, SEEK_SET);
  fwrite(&token, 2, 1, f);
  fclose(f);
}

/* Issue 34 finding 5: what can be checked before step 1 is. One
 * out-of-vocab token in --data was found only if a step sampled its window,
 * one in --val-data only at the first validation (and the final save was
 * skipped); an unusable --save failed after all the steps. Each is now an
 * error before any step line. */
Test(examples, train_checks_data_and_save_target_before_step_1, .timeout = 120) {
  const char *bin = tmp_file("scan.bin"), *val = tmp_file("scan-val.bin");
  write_bin(bin, 40000, 20240520, 64);
  write_bin(val, 4000, 20240520, 64);
  poke_token(bin, 39000, 64); /* near the end: 2 steps of 8 rows would not read it */
  poke_token(val, 100, 999);
  struct {
    const char *args[9], *needle;
  } cases[] = {
      {{"--data", bin, "--steps", "2"}, "token 64 at 39000 is >= the model's vocab 64"},
      {{"--data", val, "--val-data", val, "--steps", "2"}, "token 999 at 100"},
      {{"--steps", "2", "--save", "/etc/hostname"}, "--save /etc/hostname: not a directory"},
      {{"--steps", "2", "--save", "/etc/hostname/ck"}, "cannot create the directory"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    run_out r = run(2, TRAIN, cases[i].args, 60);
    cr_expect_neq(r.rc, 0, "[%s] want a non-zero exit", cases[i].needle);
    cr_expect(strstr(r.err, cases[i].needle), "[%s] not in stderr:\n%s", cases[i].needle, r.err);
    cr_expect(strstr(r.out, "step    1/") == NULL, "[%s] a step ran first:\n%s", cases[i].needle,
              r.out);
    run_free(&r);
  }
  unlink(bin);
  unlink(val);
}

/* Writes an llm.c-style file: a 256-int header (magic, version, count)
 * followed by `held` tokens, whatever the header says. */
static void write_bin_raw(const char *path, int magic, int version, int count, int held) {
  FILE *f = fopen(path, "wb");
  cr_assert_not_null(f, "%s", path);
  int32_t h[256] = {magic, version, count};
  fwrite(h, sizeof h, 1, f);
  for (int i = 0; i < held; i++) {
    uint16_t t = (uint16_t)(i % 60);
    fwrite(&t, 2, 1, f);
  }
  fclose(f);
}

/* Issue 34 (fault suite, data files): every way a data or text file can be
 * unusable is one error line on every rank naming the file, before any
 * step: a header cut short, another magic or version, fewer or more tokens
 * than the header says, too few tokens for one sequence, a directory. */
Test(examples, train_refuses_every_unusable_data_file_before_step_1, .timeout = 120) {
  char p[8][128];
  for (int i = 0; i < 8; i++) {
    char name[32];
    snprintf(name, sizeof name, "bad-data-%d.bin", i);
    snprintf(p[i], sizeof p[i], "%s", tmp_file(name));
  }
  FILE *f = fopen(p[0], "wb");
  cr_assert_not_null(f);
  fwrite("llm.c", 1, 5, f); /* shorter than the header */
  fclose(f);
  write_bin_raw(p[1], 12345, 1, 4000, 4000);
  write_bin_raw(p[2], 20240520, 2, 4000, 4000);
  write_bin_raw(p[3], 20240520, 1, 4000, 3000);
  write_bin_raw(p[4], 20240520, 1, 4000, 4001);
  write_bin_raw(p[5], 20240520, 1, 20, 20);
  write_bin_raw(p[6], 20240520, 1, 0, 0);
  write_bin_raw(p[7], 20240520, 1, 4000, 4000);
  struct {
    const char *args[7], *needle;
  } cases[] = {
      {{"--data", p[0]}, "shorter than the 1024-byte llm.c header"},
      {{"--data", p[1]}, "bad magic 12345"},
      {{"--data", p[2]}, "version 2 (want 1"},
      {{"--data", p[3]}, "truncated: the header says 4000 tokens but the file holds 3000"},
      {{"--data", p[4]}, "2 bytes after the 4000 tokens of its header"},
      {{"--data", p[5]}, "need at least seq-len + 1 = 33 tokens each"},
      {{"--data", p[6]}, "header says 0 tokens"},
      {{"--data", p[7], "--val-data", p[3]}, "truncated"},
      {{"--data", "/tmp"}, "'/tmp': Is a directory"},
      {{"--text", "/tmp", "--vocab", "256"},
       "text file '/tmp' is not a regular file (a directory)"},
      {{"--text", "/dev/null", "--vocab", "256"}, "is not a regular file"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *args[10] = {"--steps", "2"};
    for (int k = 0; cases[i].args[k]; k++) args[2 + k] = cases[i].args[k];
    run_out r = run(2, TRAIN, args, 60);
    cr_expect(r.rc != 0 && r.rc < 128, "[%s] rc %d, want an error exit", cases[i].needle, r.rc);
    cr_expect(strstr(r.err, cases[i].needle), "[%s] not in stderr:\n%s", cases[i].needle, r.err);
    cr_expect_eq(count_lines(r.err), 1, "[%s] want one line:\n%s", cases[i].needle, r.err);
    cr_expect(strstr(r.out, "step    1/") == NULL, "[%s] a step ran first:\n%s", cases[i].needle,
              r.out);
    run_free(&r);
  }
  for (int i = 0; i < 8; i++) unlink(p[i]);
}

Test(examples, train_checkpoint_resumes_on_another_mesh_and_rejects_another_model, .timeout = 150) {
  const char *dir = tmp_file("ckpt"), *st = tmp_file("model.safetensors");
  remove_tree(dir);
  const char *a1[] = {"--mesh",
                      "dp=2",
                      "--steps",
                      "4",
                      "--save",
                      dir,
                      "--save-every",
                      "2",
                      "--export-safetensors",
                      st,
                      "--warmup",
                      "0",
                      "--min-lr",
                      "0.003",
                      NULL};
  run_out r = run(2, TRAIN, a1, 60);
  cr_assert_eq(r.rc, 0, "save run failed: %s", r.err);
  run_free(&r);
  struct stat sb;
  cr_assert_eq(stat(st, &sb), 0, "no safetensors file");
  /* constant lr (no warmup, min-lr = lr): saving after 4 of 4 steps and
   * resuming to 6 is the same run as 6 steps straight */
  const char *j6 = tmp_file("6.jsonl"), *jr = tmp_file("r.jsonl");
  const char *a2[] = {"--mesh", "tp=2",     "--steps", "6",          "--resume", dir, "--warmup",
                      "0",      "--min-lr", "0.003",   "--log-json", jr,         NULL};
  r = run(2, TRAIN, a2, 60);
  cr_expect_eq(r.rc, 0, "resume failed: %s", r.err);
  cr_expect(strstr(r.out, "resumed from") && strstr(r.out, "at step 4"), "%s", r.out);
  cr_expect(strstr(r.out, "step    5/6") != NULL, "resumed run did not start at step 5:\n%s",
            r.out);
  run_free(&r);
  const char *a5[] = {"--steps", "6", "--warmup", "0", "--min-lr", "0.003", "--log-json", j6, NULL};
  r = run(1, TRAIN, a5, 60);
  cr_expect_eq(r.rc, 0, "straight run failed: %s", r.err);
  run_free(&r);
  double l6 = 0, lr6 = 0, v6 = 0, vr = 0;
  int n6 = 0, nr = 0;
  cr_expect(read_json_last(j6, &l6, &v6, &n6));
  cr_expect(read_json_last(jr, &lr6, &vr, &nr));
  cr_expect_eq(nr, 2, "the resumed run should log steps 5 and 6 only, got %d lines", nr);
  cr_expect(fabs(l6 - lr6) <= 1e-4 * l6,
            "step 6 loss: resumed on tp=2 %.7f vs straight on 1 rank %.7f", lr6, l6);
  cr_expect(fabs(v6 - vr) <= 1e-4 * v6, "held-out loss: resumed %.7f vs straight %.7f", vr, v6);
  unlink(j6);
  unlink(jr);
  const char *a3[] = {"--mesh", "dp=2", "--dim", "32", "--steps", "2", "--resume", dir, NULL};
  expect_error(2, a3, "checkpoint of another model");
  const char *a4[] = {"--mesh", "tp=2", "--steps", "1", "--init-from", st, NULL};
  r = run(2, TRAIN, a4, 60);
  cr_expect_eq(r.rc, 0, "--init-from failed: %s", r.err);
  run_free(&r);
  remove_tree(dir);
  unlink(st);
}

/* ------------------------------------------ Hugging Face GPT-2 weights */

/* How many tensors of a (all but transformers' buffers, counted in
 * *masks) are in b with the same dtype, shape and bytes
 * (golden_same_params). */
static int64_t same_tensors(const char *a_path, const char *b_path, int64_t *masks, int64_t *nb) {
  int64_t same = 0;
  char first[256];
  cr_assert_eq(golden_same_params(a_path, b_path, &same, masks, nb, first, sizeof first), WEFT_OK,
               "%s", weft_last_error());
  return same;
}

/* --init-from a GPT-2 in transformers' layout (tests/data/golden's
 * init_hf.safetensors, made by PyTorch: make_gpt2_hf.py) on dp=2, then
 * --export-safetensors --hf: every parameter comes back bit for bit; the
 * export loads again in weft's own run; with --max-positions, a run on
 * shorter sequences than the file's positions; the same for a Llama
 * (make_llama_hf.py) on tp=2; --hf and --max-positions are refused where
 * they mean nothing. */
Test(examples, train_from_hugging_face_weights_and_back_bitwise, .timeout = 120) {
  const char *hf = WEFT_TEST_DATA_DIR "/golden/gpt2_tiny/init_hf.safetensors";
  const char *out = tmp_file("hf_out.safetensors");
  const char *a[] = {"--model",     "gpt2-demo", "--dim",
                     "64",          "--layers",  "2",
                     "--heads",     "4",         "--ffn-dim",
                     "256",         "--vocab",   "96",
                     "--seq-len",   "32",        "--mesh",
                     "dp=2",        "--steps",   "0",
                     "--init-from", hf,          "--export-safetensors",
                     out,           "--hf",      NULL};
  run_out r = run(2, TRAIN, a, 60);
  cr_assert_eq(r.rc, 0, "--init-from an HF file and --hf export: %s", r.err);
  run_free(&r);
  int64_t masks = 0, nb = 0, same = same_tensors(hf, out, &masks, &nb);
  cr_expect_eq(masks, 2, "mask buffers in the HF file: %lld", (long long)masks);
  cr_expect_eq(same, nb, "%lld of the %lld exported tensors equal the HF file's", (long long)same,
               (long long)nb);
  cr_expect_eq(same, 28, "tensors back bit for bit: %lld of 28", (long long)same);
  /* the exported file trains on from where it was (weft's own run, 2 steps) */
  const char *b[] = {"--model",     "gpt2-demo", "--dim",   "64", "--layers",  "2",  "--heads", "4",
                     "--ffn-dim",   "256",       "--vocab", "96", "--seq-len", "32", "--steps", "2",
                     "--init-from", out,         NULL};
  r = run(1, TRAIN, b, 60);
  cr_expect_eq(r.rc, 0, "--init-from the --hf export: %s", r.err);
  run_free(&r);
  /* shorter sequences than the file's 32 positions: --max-positions */
  const char *p[] = {"--model",     "gpt2-demo", "--dim",
                     "64",          "--layers",  "2",
                     "--heads",     "4",         "--ffn-dim",
                     "256",         "--vocab",   "96",
                     "--seq-len",   "16",        "--max-positions",
                     "32",          "--steps",   "0",
                     "--init-from", hf,          "--export-safetensors",
                     out,           "--hf",      NULL};
  r = run(1, TRAIN, p, 60);
  cr_expect_eq(r.rc, 0, "--seq-len 16 --max-positions 32: %s", r.err);
  cr_expect(strstr(r.out, "T=16 positions=32") != NULL, "run header: %s", r.out);
  run_free(&r);
  cr_expect_eq(same_tensors(hf, out, &masks, &nb), 28, "--max-positions 32: not all 28 back");
  const char *p2[] = {"--model", "gpt2-demo", "--seq-len", "16", "--max-positions", "8", NULL};
  expect_error(1, p2, "--max-positions 8 is below --seq-len 16");
  const char *p3[] = {"--model", "demo", "--max-positions", "64", NULL};
  expect_error(1, p3, "--max-positions: the Llama model has no learned positions");
  const char *c[] = {"--model", "gpt2-demo", "--hf", NULL};
  expect_error(1, c, "--hf: it sets the layout of --export-safetensors");
  /* the Llama: the golden tiny_gqa in transformers' layout, on tp=2 */
  const char *lh = WEFT_TEST_DATA_DIR "/golden/tiny_gqa/init_hf.safetensors";
  const char *d[] = {"--dim",       "64",      "--layers",
                     "2",           "--heads", "4",
                     "--kv-heads",  "2",       "--ffn-dim",
                     "172",         "--vocab", "96",
                     "--seq-len",   "16",      "--mesh",
                     "tp=2",        "--steps", "0",
                     "--init-from", lh,        "--export-safetensors",
                     out,           "--hf",    NULL};
  r = run(2, TRAIN, d, 60);
  cr_expect_eq(r.rc, 0, "Llama --init-from an HF file and --hf export: %s", r.err);
  run_free(&r);
  cr_expect_eq(same_tensors(lh, out, &masks, &nb), 21,
               "Llama: not all 21 parameters back bit for bit (of %lld)", (long long)nb);
  /* the same Llama as a sharded set (model.safetensors.index.json + 2 files) */
  const char *ix = WEFT_TEST_DATA_DIR "/golden/tiny_gqa/hf_sharded/model.safetensors.index.json";
  int at = 0;
  while (d[at] && strcmp(d[at], "--init-from") != 0) at++;
  cr_assert(d[at]);
  d[at + 1] = ix;
  r = run(2, TRAIN, d, 60);
  cr_expect_eq(r.rc, 0, "Llama --init-from a sharded set: %s", r.err);
  run_free(&r);
  cr_expect_eq(same_tensors(lh, out, &masks, &nb), 21,
               "Llama from a sharded set: not all 21 parameters bit for bit (of %lld)",
               (long long)nb);
  /* an index naming a file that is not there */
  const char *badix = tmp_file("bad.index.json");
  FILE *bf = fopen(badix, "w");
  cr_assert(bf);
  fputs("{\"weight_map\": {\"model.norm.weight\": \"absent.safetensors\"}}", bf);
  fclose(bf);
  d[at + 1] = badix;
  expect_error(2, d, "absent.safetensors");
  unlink(badix);
  /* a model of another shape: the error names the user's file and the tensor */
  const char *e[] = {"--model", "gpt2-demo", "--dim",       "32", "--seq-len", "32",
                     "--steps", "1",         "--init-from", hf,   NULL};
  expect_error(2, e,
               "(transformers' layout): [rank 0] weft_safetensors_import_model: import: "
               "'transformer.wte.weight' has shape [0:96, 0:64] in '" WEFT_TEST_DATA_DIR
               "/golden/gpt2_tiny/init_hf.safetensors'");
  unlink(out);
}

/* --fixed-batch (debug): every step trains on the first step's batch, so a
 * correct model overfits it: after 40 steps on dp=2 its loss is far below
 * the same run's on fresh batches (measured 0.94 vs 2.21 on 1 rank). */
Test(examples, train_fixed_batch_overfits_the_first_batch, .timeout = 120) {
  const char *jf = tmp_file("fixed.jsonl"), *jn = tmp_file("fresh.jsonl");
  const char *f[] = {"--model",       "gpt2-demo",  "--mesh",   "dp=2", "--steps",     "40",
                     "--lr",          "3e-3",       "--warmup", "0",    "--val-every", "40",
                     "--fixed-batch", "--log-json", jf,         NULL};
  const char *n[] = {"--model",     "gpt2-demo", "--mesh",     "dp=2",     "--steps",
                     "40",          "--lr",      "3e-3",       "--warmup", "0",
                     "--val-every", "40",        "--log-json", jn,         NULL};
  run_out r = run(2, TRAIN, f, 60);
  cr_assert_eq(r.rc, 0, "--fixed-batch: %s", r.err);
  run_free(&r);
  r = run(2, TRAIN, n, 60);
  cr_assert_eq(r.rc, 0, "fresh batches: %s", r.err);
  run_free(&r);
  double lf = 0, vf = 0, ln = 0, vn = 0;
  int nf = 0, nn = 0;
  cr_assert(read_json_last(jf, &lf, &vf, &nf) && read_json_last(jn, &ln, &vn, &nn));
  cr_expect(lf < 1.5 && ln > 1.8 && lf < 0.7 * ln,
            "step 40 loss: fixed batch %.4f, fresh batches %.4f (want the fixed far lower)", lf,
            ln);
  unlink(jf);
  unlink(jn);
}

/* ------------------------------------------------------------ generation */

#define GENERATE WEFT_EXAMPLES_DIR "/weft-generate"

/* generate.json's prompt and greedy tokens as space-separated ids. */
static void read_generate_json(const char *path, char *prompt, char *tokens, size_t cap) {
  char *t = slurp(path);
  cJSON *j = cJSON_Parse(t);
  free(t);
  cr_assert(j, "%s is not JSON", path);
  const char *keys[2] = {"prompt", "tokens"};
  char *outs[2] = {prompt, tokens};
  for (int k = 0; k < 2; k++) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, keys[k]), *e;
    cr_assert(cJSON_IsArray(a), "%s: no '%s'", path, keys[k]);
    size_t n = 0;
    outs[k][0] = 0;
    cJSON_ArrayForEach(e, a) n +=
        (size_t)snprintf(outs[k] + n, cap - n, n ? " %d" : "%d", e->valueint);
  }
  cJSON_Delete(j);
}

/* weft-generate's greedy tokens equal PyTorch's (tests/data/golden/
 * make_generate.py: a model trained in PyTorch to count up by 3, its greedy
 * continuation by a transformers-semantics forward, every margin > 5) for
 * GPT-2 on 1, 2 and 4 ranks and for the GQA Llama on 1 and 2 (past its 16
 * positions: the last 16 tokens); sampling gives the same tokens on every
 * mesh for a seed; bad input is one clear line. */
Test(examples, generate_greedy_equals_pytorch_on_every_tp_size, .timeout = 180) {
  const char *gj = WEFT_TEST_DATA_DIR "/golden/gpt2_tiny/generate.json";
  const char *lj = WEFT_TEST_DATA_DIR "/golden/tiny_gqa/generate.json";
  char prompt[256], want[1024];
  read_generate_json(gj, prompt, want, sizeof want);
  const char *g[] = {"--model",
                     "gpt2-demo",
                     "--dim",
                     "64",
                     "--layers",
                     "2",
                     "--heads",
                     "4",
                     "--ffn-dim",
                     "256",
                     "--vocab",
                     "96",
                     "--seq-len",
                     "32",
                     "--init-from",
                     WEFT_TEST_DATA_DIR "/golden/gpt2_tiny/gen_hf.safetensors",
                     "--prompt",
                     prompt,
                     "--max-new-tokens",
                     "24",
                     NULL};
  for (int n = 1; n <= 4; n *= 2) {
    run_out r = run(n, GENERATE, g, 60);
    cr_expect_eq(r.rc, 0, "GPT-2 on %d ranks: %s", n, r.err);
    cr_expect(r.out && !strncmp(r.out, want, strlen(want)) && r.out[strlen(want)] == '\n',
              "GPT-2 greedy on %d ranks:\n  got  %s  want %s", n, r.out ? r.out : "", want);
    run_free(&r);
  }
  read_generate_json(lj, prompt, want, sizeof want);
  const char *l[] = {
      "--model",  "demo",        "--dim",
      "64",       "--layers",    "2",
      "--heads",  "4",           "--kv-heads",
      "2",        "--ffn-dim",   "172",
      "--vocab",  "96",          "--seq-len",
      "16",       "--init-from", WEFT_TEST_DATA_DIR "/golden/tiny_gqa/gen_hf.safetensors",
      "--prompt", prompt,        "--max-new-tokens",
      "24",       NULL};
  for (int n = 1; n <= 2; n++) {
    run_out r = run(n, GENERATE, l, 60);
    cr_expect_eq(r.rc, 0, "Llama on %d ranks: %s", n, r.err);
    cr_expect(r.out && !strncmp(r.out, want, strlen(want)) && r.out[strlen(want)] == '\n',
              "Llama greedy on %d ranks:\n  got  %s  want %s", n, r.out ? r.out : "", want);
    run_free(&r);
  }
  /* --resume: a weft-train checkpoint of the Llama (the built-in fp32
   * model wrote it; --lr 0 keeps the weights) on tp=2 */
  const char *dir = tmp_file("gen_ckpt");
  remove_tree(dir);
  const char *t[] = {
      "--dim",     "64",  "--layers",    "2",
      "--heads",   "4",   "--kv-heads",  "2",
      "--ffn-dim", "172", "--vocab",     "96",
      "--seq-len", "16",  "--steps",     "1",
      "--lr",      "0",   "--init-from", WEFT_TEST_DATA_DIR "/golden/tiny_gqa/gen_hf.safetensors",
      "--save",    dir,   NULL};
  run_out tr = run(1, TRAIN, t, 60);
  cr_expect_eq(tr.rc, 0, "weft-train --save: %s", tr.err);
  run_free(&tr);
  const char *lr[] = {
      "--model",    "demo", "--dim",     "64",   "--layers",         "2",  "--heads",   "4",
      "--kv-heads", "2",    "--ffn-dim", "172",  "--vocab",          "96", "--seq-len", "16",
      "--resume",   dir,    "--prompt",  prompt, "--max-new-tokens", "24", NULL};
  tr = run(2, GENERATE, lr, 60);
  cr_expect(tr.rc == 0 && tr.out && !strncmp(tr.out, want, strlen(want)),
            "Llama --resume on 2 ranks:\n  got  %s  want %s%s", tr.out ? tr.out : "", want,
            tr.err ? tr.err : "");
  run_free(&tr);
  remove_tree(dir);
  /* sampling: a seed's tokens on 1 rank and on tp=2 alike */
  const char *s[] = {"--model",
                     "gpt2-demo",
                     "--dim",
                     "64",
                     "--layers",
                     "2",
                     "--heads",
                     "4",
                     "--ffn-dim",
                     "256",
                     "--vocab",
                     "96",
                     "--seq-len",
                     "32",
                     "--init-from",
                     WEFT_TEST_DATA_DIR "/golden/gpt2_tiny/init_hf.safetensors",
                     "--prompt",
                     "1 2 3",
                     "--max-new-tokens",
                     "12",
                     "--temperature",
                     "1.5",
                     "--top-k",
                     "20",
                     "--seed",
                     "7",
                     NULL};
  run_out a = run(1, GENERATE, s, 60), b = run(2, GENERATE, s, 60);
  cr_expect(a.rc == 0 && b.rc == 0 && a.out && b.out && !strcmp(a.out, b.out),
            "sampling differs between 1 and 2 ranks:\n  %s  %s%s%s", a.out ? a.out : "",
            b.out ? b.out : "", a.err ? a.err : "", b.err ? b.err : "");
  run_free(&a);
  run_free(&b);
  const char *e1[] = {"--model", "gpt2-demo", "--init-from", "x", NULL};
  expect_error_of(GENERATE, "weft-generate: error:", 2, RANK_EXIT_SH, e1,
                  "--prompt: give at least one token id");
  const char *e2[] = {"--model", "gpt2-demo", "--prompt", "1 96", "--init-from", "x", NULL};
  expect_error_of(GENERATE, "weft-generate: error:", 2, RANK_EXIT_SH, e2,
                  "--prompt: id 96 at position 1 is not below the vocabulary size 64");
  const char *e3[] = {"--model", "gpt2-demo", "--prompt", "1", NULL};
  expect_error_of(GENERATE, "weft-generate: error:", 2, RANK_EXIT_SH, e3,
                  "give the weights: --init-from F or --resume DIR");
  const char *e4[] = {"--model", "gpt2-demo", "--prompt", "1", "--init-from", "/nonexistent", NULL};
  expect_error_of(GENERATE, "weft-generate: error:", 2, RANK_EXIT_SH, e4,
                  "--init-from /nonexistent:");
}

/* A checkpoint written before weft-train's Llama moved onto models/llama
 * (tests/data/ckpt_llama_v0: main at 9ac8ae5, the built-in nn/ Llama, 3
 * steps of a 2-layer GQA model) still resumes: steps 4 and 5 and the
 * held-out loss are what that build computed resuming it (step 4
 * 4.0711473227, step 5 3.9672910226, held-out 3.9136079414), on 1 rank and
 * on tp=2. */
Test(examples, train_resumes_a_checkpoint_of_the_builtin_llama, .timeout = 120) {
  const char *dir = tmp_file("ckpt_v0");
  char cmd[1200];
  remove_tree(dir);
  snprintf(cmd, sizeof cmd, "cp -r '%s/ckpt_llama_v0' '%s'", WEFT_TEST_DATA_DIR, dir);
  cr_assert_eq(system(cmd), 0, "%s", cmd);
  const double want[2] = {4.0711473227413038, 3.967291022567383}, want_val = 3.91360794142729;
  for (int tp = 1; tp <= 2; tp++) {
    const char *j = tmp_file("v0.jsonl");
    const char *a[] = {"--dim",      "32",
                       "--layers",   "2",
                       "--heads",    "4",
                       "--kv-heads", "2",
                       "--ffn-dim",  "64",
                       "--vocab",    "64",
                       "--seq-len",  "16",
                       "--batch",    "4",
                       "--seed",     "5",
                       "--warmup",   "0",
                       "--steps",    "5",
                       "--resume",   dir,
                       "--mesh",     tp == 1 ? "tp=1" : "tp=2",
                       "--log-json", j,
                       NULL};
    run_out r = run(tp, TRAIN, a, 60);
    cr_expect_eq(r.rc, 0, "resume on tp=%d: %s", tp, r.err);
    cr_expect(r.out && strstr(r.out, "at step 3"), "tp=%d: %s", tp, r.out ? r.out : "");
    run_free(&r);
    char *t = slurp(j);
    int k = 0;
    for (char *p = t; p && (p = strstr(p, "\"loss\":")) && k < 2; p += 7, k++) {
      double l = strtod(p + 7, NULL);
      cr_expect(fabs(l - want[k]) <= 1e-5 * want[k], "tp=%d step %d: loss %.10f want %.10f", tp,
                4 + k, l, want[k]);
    }
    cr_expect_eq(k, 2, "tp=%d: %d steps logged", tp, k);
    char *v = t ? strstr(t, "\"val_loss\":") : NULL;
    cr_expect(v && fabs(strtod(v + 11, NULL) - want_val) <= 1e-5 * want_val,
              "tp=%d: held-out loss %s", tp, v ? v : "(none)");
    free(t);
    unlink(j);
  }
  remove_tree(dir);
}

/* ------------------------------------------------- non-finite training */

static bool is_dir(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* "<dir>.step-<n>", valid until the next call. */
static const char *sibling(const char *dir, int n) {
  static char b[300];
  snprintf(b, sizeof b, "%s.step-%d", dir, n);
  return b;
}

#ifdef WEFT_CKPT
/* weft-ckpt verify --finite DIR: its exit status (and output in *r). */
static int verify_finite(const char *dir, run_out *r) {
  const char *a[] = {"verify", "--finite", dir, NULL};
  *r = run(0, WEFT_CKPT, a, 30);
  return r->rc;
}
#endif

/* A diverging run (a huge --lr, no clipping) stops with an error on every
 * rank naming the step and what was non-finite, before the update and
 * before any further save: the good checkpoint already in --save DIR
 * survives, is finite and resumes (today the run saved NaN over it and
 * exited 0). */
Test(examples, train_nonfinite_loss_stops_and_keeps_the_last_good_checkpoint, .timeout = 150) {
  static const struct {
    int nranks;
    const char *mesh, *model, *lr, *needle;
  } cases[] = {
      {1, "dp=1", "demo", "1e6", "step 2: the gradient norm is NaN"},
      {2, "dp=2", "demo", "1e10", "step 2: the loss is NaN"},
      {2, "dp=2", "gpt2-demo", "1e10", "step 2: the loss is NaN"},
  };
  const char *dir = tmp_file("diverge-ck");
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    remove_tree(dir);
    const char *good[] = {"--mesh", cases[c].mesh, "--model", cases[c].model, "--steps",
                          "2",      "--save",      dir,       "--quiet",      NULL};
    run_out r = run(cases[c].nranks, TRAIN, good, 60);
    cr_assert_eq(r.rc, 0, "[%zu] the good run failed: %s", c, r.err);
    run_free(&r);
    const char *bad[] = {"--mesh",   cases[c].mesh, "--model",      cases[c].model,
                         "--lr",     cases[c].lr,   "--clip",       "0",
                         "--warmup", "0",           "--steps",      "6",
                         "--save",   dir,           "--save-every", "2",
                         NULL};
    expect_error(cases[c].nranks, bad, cases[c].needle);
    cr_expect(!is_dir(sibling(dir, 2)), "[%zu] a save ran after the stop", c);
#ifdef WEFT_CKPT
    cr_expect_eq(verify_finite(dir, &r), 0, "[%zu] the kept checkpoint: %s%s", c, r.out, r.err);
    cr_expect(strstr(r.out, "all finite") != NULL, "[%zu] %s", c, r.out);
    run_free(&r);
#endif
    const char *res[] = {"--mesh",   cases[c].mesh, "--model", cases[c].model, "--steps", "3",
                         "--resume", dir,           NULL};
    r = run(cases[c].nranks, TRAIN, res, 60);
    cr_expect_eq(r.rc, 0, "[%zu] resume failed: %s", c, r.err);
    cr_expect(strstr(r.out, "at step 2") != NULL, "[%zu] did not resume the good checkpoint:\n%s",
              c, r.out);
    run_free(&r);
  }
  remove_tree(dir);
}

/* The tensors of a checkpoint (metadata.json: dtypes, shapes, chunks and
 * every block's CRC32C) and one of its values, as text (the caller frees). */
static char *ckpt_tensors(const char *dir, const char *value, char *val, size_t cap) {
  char path[320];
  snprintf(path, sizeof path, "%s/metadata.json", dir);
  char *t = slurp(path);
  cJSON *j = cJSON_Parse(t);
  free(t);
  char *out = j ? cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "tensors")) : NULL;
  const cJSON *v =
      cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "values"), value), "value");
  snprintf(val, cap, "%s", cJSON_IsString(v) ? v->valuestring : "?");
  cJSON_Delete(j);
  return out ? out : strdup("");
}

/* --on-nonfinite skip: each non-finite step's update is dropped (the
 * checkpoints saved after steps 1, 2 and 3, with steps 2 and 3 skipped,
 * hold the same parameters and optimizer state, byte for byte by their
 * checksums, and the optimizer has taken one step); after
 * --max-skipped-steps 3 skipped in a row the run stops with an error. */
Test(examples, train_nonfinite_skip_keeps_the_state_and_stops_after_k_in_a_row, .timeout = 60) {
  const char *dir = tmp_file("skip-ck");
  remove_tree(dir);
  const char *a[] = {"--lr",
                     "1e6",
                     "--clip",
                     "0",
                     "--warmup",
                     "0",
                     "--steps",
                     "8",
                     "--save",
                     dir,
                     "--save-every",
                     "1",
                     "--keep-checkpoints",
                     "10",
                     "--on-nonfinite",
                     "skip",
                     "--max-skipped-steps",
                     "3",
                     NULL};
  run_out r = run(1, TRAIN, a, 40);
  cr_expect_neq(r.rc, 0, "want a non-zero exit after 3 skipped steps:\n%s", r.out);
  cr_expect(r.rc < 128, "killed (rc %d)", r.rc);
  cr_expect(strstr(r.err, "step 4: the gradient norm is NaN: 3 steps in a row skipped") != NULL,
            "%s", r.err);
  cr_expect(strstr(r.out, "step 2 skipped") && strstr(r.out, "step 3 skipped"), "%s", r.out);
  cr_expect(strstr(r.out, "step 1 skipped") == NULL, "%s", r.out);
  run_free(&r);
  const char *dirs[3] = {NULL, NULL, dir};
  char d1[300], d2[300];
  snprintf(d1, sizeof d1, "%s", sibling(dir, 1));
  snprintf(d2, sizeof d2, "%s", sibling(dir, 2));
  dirs[0] = d1;
  dirs[1] = d2;
  char *tens[3];
  for (int k = 0; k < 3; k++) {
    char steps[32], step[32];
    tens[k] = ckpt_tensors(dirs[k], "state.num_steps", steps, sizeof steps);
    free(ckpt_tensors(dirs[k], "train.step", step, sizeof step));
    cr_expect(strlen(tens[k]) > 100, "no checkpoint in %s", dirs[k]);
    cr_expect_str_eq(steps, "1", "%s: the optimizer took %s steps, want 1", dirs[k], steps);
    cr_expect_eq(atoi(step), k + 1, "%s holds step %s", dirs[k], step);
  }
  cr_expect_str_eq(tens[0], tens[1], "a skipped step (2) changed the state");
  cr_expect_str_eq(tens[1], tens[2], "a skipped step (3) changed the state");
  for (int k = 0; k < 3; k++) free(tens[k]);
  cr_expect(!is_dir(sibling(dir, 3)), "a save ran after the stop");
  remove_tree(dir);
}

/* --keep-checkpoints K after 4 saves (steps 2, 4, 6, 8): DIR holds step 8
 * and DIR.step-N the K - 1 before it; --resume DIR takes the newest, and
 * DIR.step-6 resumes too. */
Test(examples, train_keep_checkpoints_keeps_the_last_k_and_resume_takes_the_newest,
     .timeout = 120) {
  static const struct {
    const char *keep;
    bool kept[3]; /* DIR.step-2, -4, -6 */
  } cases[] = {
      {"1", {false, false, false}},
      {"2", {false, false, true}},
      {"3", {false, true, true}},
  };
  const char *dir = tmp_file("keep-ck");
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    remove_tree(dir);
    const char *a[] = {"--steps",
                       "8",
                       "--save",
                       dir,
                       "--save-every",
                       "2",
                       "--keep-checkpoints",
                       cases[c].keep,
                       "--on-nonfinite",
                       "skip",
                       "--quiet",
                       NULL};
    run_out r = run(1, TRAIN, a, 40);
    cr_assert_eq(r.rc, 0, "[keep %s] failed: %s", cases[c].keep, r.err);
    cr_expect(strstr(r.out, "steps skipped") != NULL, "no skipped count:\n%s", r.out);
    run_free(&r);
    cr_expect(is_dir(dir), "[keep %s] no %s", cases[c].keep, dir);
    for (int k = 0; k < 3; k++)
      cr_expect_eq(is_dir(sibling(dir, 2 * k + 2)), cases[c].kept[k], "[keep %s] %s: %s",
                   cases[c].keep, sibling(dir, 2 * k + 2), cases[c].kept[k] ? "missing" : "kept");
    cr_expect(!is_dir(sibling(dir, 8)), "[keep %s] the newest is DIR, not DIR.step-8",
              cases[c].keep);
  }
  /* the last case (keep 3): resume the newest, and an earlier one */
  const char *from[2] = {dir, sibling(dir, 6)};
  char f1[300];
  snprintf(f1, sizeof f1, "%s", from[1]);
  from[1] = f1;
  const char *want[2] = {"at step 8", "at step 6"};
  for (int k = 0; k < 2; k++) {
    const char *a[] = {"--steps", "9", "--resume", from[k], "--quiet", NULL};
    run_out r = run(1, TRAIN, a, 40);
    cr_expect_eq(r.rc, 0, "resume %s: %s", from[k], r.err);
    cr_expect(strstr(r.out, want[k]) != NULL, "resume %s:\n%s", from[k], r.out);
    run_free(&r);
#ifdef WEFT_CKPT
    cr_expect_eq(verify_finite(from[k], &r), 0, "%s: %s", from[k], r.err);
    run_free(&r);
#endif
  }
  remove_tree(dir);
}

#ifdef WEFT_CKPT
/* weft-ckpt verify --finite names every tensor holding NaN or Inf with its
 * count and exits non-zero; plain verify (checksums only) still says OK.
 * The checkpoint: a safetensors file with a NaN and an Inf written in,
 * turned into one by weft-ckpt from-safetensors. */
Test(examples, ckpt_verify_finite_reports_nonfinite_tensors, .timeout = 60) {
  const char *st = tmp_file("nan.safetensors"), *dir = tmp_file("nan-ck");
  remove_tree(dir);
  const char hdr[] =
      "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[24,32]}}";
  uint64_t hl = (sizeof hdr - 1 + 7) / 8 * 8;
  char pad[8] = "       ";
  float data[8] = {1, NAN, 3, INFINITY, 5, NAN, 1, 2};
  FILE *f = fopen(st, "wb");
  cr_assert(f != NULL);
  cr_assert_eq(fwrite(&hl, 8, 1, f), 1); /* little-endian hosts */
  cr_assert_eq(fwrite(hdr, 1, sizeof hdr - 1, f), sizeof hdr - 1);
  cr_assert_eq(fwrite(pad, 1, hl - (sizeof hdr - 1), f), hl - (sizeof hdr - 1));
  cr_assert_eq(fwrite(data, sizeof data, 1, f), 1);
  cr_assert_eq(fclose(f), 0);
  const char *conv[] = {"from-safetensors", st, dir, NULL};
  run_out r = run(0, WEFT_CKPT, conv, 30);
  cr_assert_eq(r.rc, 0, "from-safetensors: %s", r.err);
  run_free(&r);
  const char *plain[] = {"verify", dir, NULL};
  r = run(0, WEFT_CKPT, plain, 30);
  cr_expect_eq(r.rc, 0, "plain verify checks checksums only: %s", r.err);
  run_free(&r);
  cr_expect_eq(verify_finite(dir, &r), 1, "verify --finite: %s%s", r.out, r.err);
  cr_expect(strstr(r.err, "tensor w holds 3 non-finite values") != NULL, "%s", r.err);
  cr_expect(strstr(r.err, "tensor b ") == NULL, "b is finite:\n%s", r.err);
  cr_expect(strstr(r.err, "1 tensor with non-finite values") != NULL, "%s", r.err);
  run_free(&r);
  const char *usage[] = {"verify", "--finite", NULL};
  r = run(0, WEFT_CKPT, usage, 30);
  cr_expect_eq(r.rc, 2, "verify --finite without DIR: rc %d", r.rc);
  run_free(&r);
  remove_tree(dir);
  unlink(st);
}

/* ------------------------------------------- damaged checkpoints (fault suite) */

/* "<dir>/<name of the data file of rank>", or of metadata.json (rank < 0). */
static const char *ckpt_file(const char *dir, int rank) {
  static char b[2][600];
  static int next = 0;
  char *out = b[next++ % 2];
  if (rank < 0) {
    snprintf(out, sizeof b[0], "%s/metadata.json", dir);
    return out;
  }
  char prefix[16];
  snprintf(prefix, sizeof prefix, "r%05d-", rank);
  out[0] = 0;
  DIR *d = opendir(dir);
  cr_assert_not_null(d, "%s", dir);
  for (struct dirent *e; (e = readdir(d));)
    if (!strncmp(e->d_name, prefix, strlen(prefix)))
      snprintf(out, sizeof b[0], "%s/%s", dir, e->d_name);
  closedir(d);
  cr_assert(out[0], "no data file of rank %d in %s", rank, dir);
  return out;
}

static long file_size(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 ? (long)sb.st_size : -1;
}

static void flip_bit(const char *path, long at, int bit) {
  int fd = open(path, O_RDWR);
  cr_assert(fd >= 0, "%s", path);
  unsigned char c;
  cr_assert_eq(pread(fd, &c, 1, at), 1, "%s at %ld", path, at);
  c ^= (unsigned char)(1u << bit);
  cr_assert_eq(pwrite(fd, &c, 1, at), 1);
  close(fd);
}

/* What the directory holds, file by file (names and SHA-256 of contents):
 * equal before and after a run that was refused means nothing was lost. */
static char *tree_digest(const char *dir) {
  char cmd[700];
  snprintf(cmd, sizeof cmd, "cd '%s' 2>/dev/null && sha256sum -- * 2>/dev/null | sort", dir);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  size_t cap = 1 << 14, n = 0;
  char *b = malloc(cap);
  for (size_t got; (got = fread(b + n, 1, cap - n - 1, p)) > 0;) {
    n += got;
    if (n + 1 == cap) b = realloc(b, cap *= 2);
  }
  b[n] = 0;
  pclose(p);
  return b;
}

static void copy_tree(const char *from, const char *to) {
  char cmd[1300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", to, from, to);
  cr_assert_eq(system(cmd), 0, "%s", cmd);
}

/* Issue 34 (fault suite, checkpoint files): a checkpoint damaged in any
 * way a disk, a copy or a person can damage it is refused by --resume on
 * every rank with one line naming the file and what is wrong, before any
 * step; the run leaves the damaged checkpoint exactly as it was (it is
 * still the user's to repair), and the undamaged one resumes. Then seeded
 * single-bit flips anywhere in the checkpoint's bytes: weft-ckpt verify
 * refuses every one (bytes appended to a data file were accepted before
 * the file size was checked against the metadata). */
Test(examples, train_resume_refuses_every_damaged_checkpoint_and_keeps_its_files, .timeout = 240) {
  const char *good = tmp_file("fault-good"), *other = tmp_file("fault-other"),
             *dir = tmp_file("fault-ck");
  remove_tree(good);
  remove_tree(other);
  const char *save[] = {"--mesh", "dp=2", "--steps", "2", "--save", good, NULL};
  run_out w = run(2, TRAIN, save, 60);
  cr_assert_eq(w.rc, 0, "save: %s", w.err);
  run_free(&w);
  const char *save2[] = {"--mesh", "dp=2", "--steps", "1", "--seed", "5", "--save", other, NULL};
  w = run(2, TRAIN, save2, 60);
  cr_assert_eq(w.rc, 0, "second save: %s", w.err);
  run_free(&w);
  enum { FLIP, TRUNCATE, APPEND, REMOVE, EMPTY, SWAP, FOREIGN };
  static const struct {
    int kind, rank; /* rank -1: metadata.json */
    double where;   /* FLIP: the byte at this fraction of the file; TRUNCATE: keep this much */
    const char *needle;
  } cases[] = {
      {FLIP, 1, 0.5, "checksum mismatch in chunk"},
      {FLIP, 0, 0.99, "checksum mismatch in chunk"},
      {FLIP, 0, 0.0, "is not a weft checkpoint data file (bad magic)"},
      {FLIP, 1, 0.05, "checksum mismatch"}, /* in the 64-byte header or the first block */
      {TRUNCATE, 1, 0.5, "(truncated)"},
      {TRUNCATE, 0, 0.0, "is truncated: 0 bytes, not even its 64-byte header"},
      {APPEND, 0, 0, "(bytes appended after the save)"},
      {REMOVE, 1, 0, "(written by rank 1) is missing"},
      {REMOVE, -1, 0, "it has no metadata.json"},
      {EMPTY, -1, 0, "metadata.json: not valid JSON"},
      {FLIP, -1, 0.5, "metadata.json"},
      {SWAP, 0, 0, "belongs to another save"},
      {FOREIGN, 1, 0, "belongs to another save"},
  };
  const char *res[] = {"--mesh", "dp=2", "--steps",      "3", "--resume", dir,
                       "--save", dir,    "--save-every", "1", NULL};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    copy_tree(good, dir);
    char path[600];
    snprintf(path, sizeof path, "%s", ckpt_file(dir, cases[i].rank));
    long size = file_size(path);
    char cmd[1400];
    switch (cases[i].kind) {
      case FLIP:
        flip_bit(path, (long)(cases[i].where * (double)(size - 1)), 3);
        break;
      case TRUNCATE:
        cr_assert_eq(truncate(path, (off_t)(cases[i].where * (double)size)), 0);
        break;
      case APPEND: {
        FILE *f = fopen(path, "ab");
        cr_assert_not_null(f);
        fputs("appended", f);
        fclose(f);
        break;
      }
      case REMOVE:
        cr_assert_eq(unlink(path), 0);
        break;
      case EMPTY:
        cr_assert_eq(truncate(path, 0), 0);
        break;
      case SWAP: /* rank 0's data file holds rank 1's bytes */
        snprintf(cmd, sizeof cmd, "cp '%s' '%s'", ckpt_file(dir, 1), path);
        cr_assert_eq(system(cmd), 0);
        break;
      case FOREIGN: /* the same rank's file of another save, under this name */
        snprintf(cmd, sizeof cmd, "cp '%s' '%s'", ckpt_file(other, cases[i].rank), path);
        cr_assert_eq(system(cmd), 0);
        break;
    }
    char *before = tree_digest(dir);
    expect_error(2, res, cases[i].needle);
    char *after = tree_digest(dir);
    cr_expect_str_eq(after, before, "[%s] the refused run changed the checkpoint", cases[i].needle);
    free(before);
    free(after);
  }
  /* the undamaged checkpoint resumes */
  copy_tree(good, dir);
  run_out r = run(2, TRAIN, res, 60);
  cr_expect_eq(r.rc, 0, "resume of the undamaged copy: %s", r.err);
  cr_expect(strstr(r.out, "at step 2") != NULL, "%s", r.out);
  run_free(&r);
  /* seeded single-bit flips anywhere: every one refused by verify */
  const char *files[3];
  char names[3][600];
  long sizes[3], total = 0;
  copy_tree(good, dir);
  for (int k = 0; k < 3; k++) {
    snprintf(names[k], sizeof names[k], "%s", ckpt_file(dir, k - 1));
    files[k] = names[k];
    total += sizes[k] = file_size(files[k]);
  }
  uint64_t rng = 0x9E3779B97F4A7C15ull;
  int accepted = 0;
  for (int n = 0; n < 60; n++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    long at = (long)((rng >> 20) % (uint64_t)total);
    int k = 0;
    while (at >= sizes[k]) at -= sizes[k++];
    int bit = (int)(rng >> 10) & 7;
    flip_bit(files[k], at, bit);
    const char *v[] = {"verify", dir, NULL};
    r = run(0, WEFT_CKPT, v, 30);
    if (r.rc == 0) accepted++;
    cr_expect(r.rc != 0 && r.rc < 128, "flip of bit %d at byte %ld of %s: verify rc %d\n%s%s", bit,
              at, files[k], r.rc, r.out, r.err);
    run_free(&r);
    flip_bit(files[k], at, bit);
  }
  cr_expect_eq(accepted, 0, "%d of 60 single-bit flips passed verify", accepted);
  remove_tree(dir);
  remove_tree(good);
  remove_tree(other);
}
#endif

/* GPT-2 (models/gpt2, on the op layer) through weft-train: with dropout,
 * the loss curve on dp=2 x tp=2 (FSDP, fused q|k|v TP, sequence parallel)
 * and on rep=2 x shard=2 x tp=2 equals the one-rank curve; a checkpoint
 * resumes on another mesh to the straight run's losses, and a Llama run
 * refuses it. */
/* Every value of "key" (e.g. "\"loss\":") in a --log-json file, in order. */
static int read_json_values(const char *path, const char *key, double *v, int cap) {
  char *t = slurp(path);
  int n = 0;
  size_t k = strlen(key);
  for (char *p = t; (p = strstr(p, key)) && n < cap; p++) v[n++] = strtod(p + k, NULL);
  free(t);
  return n;
}
static int read_json_losses(const char *path, double *loss, int cap) {
  return read_json_values(path, "\"loss\":", loss, cap);
}

Test(examples, train_gpt2_with_dropout_follows_the_1_rank_curve_on_2x2_and_2x2x2, .timeout = 200) {
  enum { STEPS = 6 };
  const char *j1 = tmp_file("gpt2-1.jsonl");
  const char *j4 = tmp_file("gpt2-4.jsonl");
  const char *j8 = tmp_file("gpt2-8.jsonl");
  const char *a1[] = {"--model",     "gpt2-demo", "--steps",    "6", "--dropout", "0.1",
                      "--val-every", "0",         "--log-json", j1,  NULL};
  const char *a4[] = {"--model", "gpt2-demo",  "--mesh",    "dp=2,tp=2", "--sequence-parallel",
                      "--steps", "6",          "--dropout", "0.1",       "--val-every",
                      "0",       "--log-json", j4,          NULL};
  const char *a8[] = {"--model",     "gpt2-demo", "--mesh",     "dp_replicate=2,dp_shard=2,tp=2",
                      "--steps",     "6",         "--dropout",  "0.1",
                      "--val-every", "0",         "--log-json", j8,
                      NULL};
  run_out r1 = run(1, TRAIN, a1, 60), r4 = run(4, TRAIN, a4, 80), r8 = run(8, TRAIN, a8, 120);
  cr_assert_eq(r1.rc, 0, "1 rank: %s", r1.err);
  cr_assert_eq(r4.rc, 0, "2x2: %s", r4.err);
  cr_assert_eq(r8.rc, 0, "2x2x2: %s", r8.err);
  cr_expect(strstr(r1.out, "gpt2-demo") != NULL, "%s", r1.out);
  double l1[STEPS], l4[STEPS], l8[STEPS];
  cr_assert_eq(read_json_losses(j1, l1, STEPS), STEPS);
  cr_assert_eq(read_json_losses(j4, l4, STEPS), STEPS);
  cr_assert_eq(read_json_losses(j8, l8, STEPS), STEPS);
  cr_expect(l1[STEPS - 1] < l1[0] - 0.2, "GPT-2 did not learn: %.4f -> %.4f", l1[0], l1[STEPS - 1]);
  for (int s = 0; s < STEPS; s++) {
    cr_expect(fabs(l4[s] - l1[s]) <= 1e-5 * l1[s], "step %d: 2x2 %.7f vs 1 rank %.7f", s + 1, l4[s],
              l1[s]);
    cr_expect(fabs(l8[s] - l1[s]) <= 1e-5 * l1[s], "step %d: 2x2x2 %.7f vs 1 rank %.7f", s + 1,
              l8[s], l1[s]);
  }
  run_free(&r1);
  run_free(&r4);
  run_free(&r8);
  unlink(j1);
  unlink(j4);
  unlink(j8);
}

/* The "op graph per step" lines of weft-train --profile: how many, and the
 * counters of the last one (false when there is none). */
static int profile_lines(const char *out, long long c[4]) {
  int n = 0;
  for (const char *p = out; (p = strstr(p, "op graph per step:")) != NULL; p++)
    if (sscanf(p, "op graph per step: ops %lld, widened %lld, copies %lld, mallocs %lld", &c[0],
               &c[1], &c[2], &c[3]) == 4)
      n++;
  return n;
}

/* weft-train --profile pins what one gpt2-demo step does in the op layer
 * today (1 rank, after the first step). A change to the op layer that makes
 * fewer copies, widens less or allocates less shows up here as a diff: move
 * the numbers with it, and say so in the commit. fp32: no widening and no
 * large allocation (the graph's pool serves every buffer); bf16: nothing
 * is widened either: every op of the model computes in bf16 itself
 * (backend.h takes_dtype; of the built-in ops only mean still widens,
 * nn/mixed.c), and the host cache serves every buffer from step 3 on (step 2
 * still fills a class or two). copies: 28 until reshape of a graph buffer
 * became a view, forward (20) and backward (12; issue 42 step 2); 12 until
 * split's pieces became column slices of the fused q|k|v that attention
 * reads in place, writing its grads into one buffer that is the
 * projection's grad (issue 42 step 3): none left. */
Test(examples, train_profile_pins_the_op_graph_counts_of_a_gpt2_demo_step, .timeout = 60) {
  static const struct {
    const char *dtype;
    long long want[4]; /* ops, widened, copies, mallocs */
  } cases[] = {{"fp32", {72, 0, 0, 0}}, {"bf16", {72, 0, 0, 0}}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    const char *args[] = {"--model", "gpt2-demo", "--steps",      "4",         "--val-every",
                          "0",       "--dtype",   cases[k].dtype, "--profile", NULL};
    run_out r = run(1, TRAIN, args, 40);
    cr_assert_eq(r.rc, 0, "%s: %s", cases[k].dtype, r.err);
    long long c[4] = {-1, -1, -1, -1};
    cr_expect_eq(profile_lines(r.out, c), 3, "%s: want a counter line after steps 2 to 4:\n%s",
                 cases[k].dtype, r.out);
    const char *what[4] = {"ops", "widened", "copies", "mallocs"};
    for (int i = 0; i < 4; i++)
      cr_expect_eq(c[i], cases[k].want[i], "%s: %s per step %lld, pinned %lld", cases[k].dtype,
                   what[i], c[i], cases[k].want[i]);
    run_free(&r);
  }
  /* without --profile, no counter line */
  const char *quiet[] = {"--model", "gpt2-demo", "--steps", "2", "--val-every", "0", NULL};
  run_out r = run(1, TRAIN, quiet, 40);
  long long c[4];
  cr_expect_eq(r.rc, 0, "%s", r.err);
  cr_expect_eq(profile_lines(r.out, c), 0, "%s", r.out);
  run_free(&r);
}

/* The "device calls per step" lines of weft-train --profile --device cuda:
 * how many, and the counters of the first `cap` (launches, blas, host
 * syncs, mallocs, bytes copied). */
static int device_lines(const char *out, long long c[][5], int cap) {
  int n = 0;
  for (const char *p = out; (p = strstr(p, "device calls per step:")) != NULL; p++) {
    long long v[5];
    if (sscanf(p,
               "device calls per step: launches %lld, blas %lld, host syncs %lld, mallocs %lld, "
               "bytes copied %lld",
               &v[0], &v[1], &v[2], &v[3], &v[4]) != 5)
      continue;
    if (n < cap) memcpy(c[n], v, sizeof v);
    n++;
  }
  return n;
}

/* weft-train --profile --device cuda pins what one gpt2-demo step asks of
 * the device backend today (weft_device_stats, backend.h; 1 rank): kernel
 * launches, cuBLAS calls, host waits, driver allocations and host<->device
 * bytes. The counting code is the same on the emulated device and a GPU, so
 * these are a GPU's numbers too. A change to the device path shows up here
 * as a diff: move the numbers with it, and say so in the commit.
 * Launches, BLAS calls and bytes are the same from step 2 on; host syncs and
 * mallocs are pinned from step 3 on: step 2 still warms up (fp32: one more
 * cudaMalloc, the device cache's first block of a small size class; bf16:
 * 27 cudaMallocs, and the one-rank FSDP collectives' pinned staging buffer
 * grows once more, its cudaFreeHost one more host sync).
 * Where the host syncs of an fp32 step come from today: blocking copies of
 * the fused AdamW's tensor tables (2: one per weight-decay group; 18 when
 * runs of neighbours were batched), cross-entropy's and the embedding's
 * host round trips, the gradient norm. bf16 runs FSDP on one rank, whose
 * collectives stage through the host (the bytes). Launches were 151 (fp32)
 * and 208 (bf16) until split's 12 copy kernels a step went (issue 42 step
 * 3: attention reads the fused q|k|v in place). */
Test(examples, train_profile_pins_the_device_calls_of_a_gpt2_demo_step, .timeout = 120) {
  SKIP_WITHOUT_DEVICE();
  static const struct {
    const char *dtype;
    long long want[5]; /* launches, blas, host syncs, mallocs, bytes copied */
  } cases[] = {{"fp32", {139, 41, 26, 0, 16020}}, {"bf16", {196, 41, 50, 0, 1698446}}};
  const char *what[5] = {"launches", "blas", "host syncs", "mallocs", "bytes copied"};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    const char *args[] = {"--model", "gpt2-demo",    "--steps",   "4",        "--val-every", "0",
                          "--dtype", cases[k].dtype, "--profile", "--device", "cuda",        NULL};
    run_out r = run(1, TRAIN, args, 90);
    cr_assert_eq(r.rc, 0, "%s: %s", cases[k].dtype, r.err);
    long long c[3][5];
    cr_assert_eq(device_lines(r.out, c, 3), 3, "%s: want a device line after steps 2 to 4:\n%s",
                 cases[k].dtype, r.out);
    for (int step = 0; step < 3; step++)
      for (int i = 0; i < 5; i++)
        if (step > 0 || (i != 2 && i != 3)) /* step 2: syncs, mallocs still warm up */
          cr_expect_eq(c[step][i], cases[k].want[i], "%s: step %d: %s per step %lld, pinned %lld",
                       cases[k].dtype, step + 2, what[i], c[step][i], cases[k].want[i]);
    run_free(&r);
  }
  /* a CPU run prints no device line */
  const char *cpu[] = {"--model",     "gpt2-demo", "--steps",   "2",
                       "--val-every", "0",         "--profile", NULL};
  run_out r = run(1, TRAIN, cpu, 40);
  long long c[1][5];
  cr_expect_eq(r.rc, 0, "%s", r.err);
  cr_expect_eq(device_lines(r.out, c, 1), 0, "%s", r.out);
  cr_expect(strstr(r.out, "op graph per step:") != NULL, "%s", r.out);
  run_free(&r);
}

/* weft-train --predict h100|h200 (issue 41 step 2): on the device, each
 * step after the first prints its modeled time and MFU, and the summary
 * the ten costliest kernels; every kernel a gpt2-demo step launches has a
 * cost formula; the faster HBM of the H200 never models a slower step;
 * without --device cuda, or with an unknown GPU, it is an error. */
Test(examples, train_predict_models_the_step_on_a_gpu, .timeout = 120) {
  const char *bad[] = {"--model", "gpt2-demo", "--steps", "2", "--predict", "a100", NULL};
  run_out r = run(1, TRAIN, bad, 40);
  cr_expect_neq(r.rc, 0);
  cr_expect(strstr(r.err, "--predict: want h100 or h200 (got 'a100')"), "%s", r.err);
  run_free(&r);
  const char *cpu[] = {"--model", "gpt2-demo", "--steps", "2", "--predict", "h100", NULL};
  r = run(1, TRAIN, cpu, 40);
  cr_expect_neq(r.rc, 0);
  cr_expect(strstr(r.err, "--predict: needs --device cuda"), "%s", r.err);
  run_free(&r);
  SKIP_WITHOUT_DEVICE();
  double ms[2] = {0, 0};
  const char *gpus[2] = {"h100", "h200"};
  for (int k = 0; k < 2; k++) {
    const char *args[] = {"--model",  "gpt2-demo", "--steps",   "3",     "--val-every", "0",
                          "--device", "cuda",      "--predict", gpus[k], NULL};
    r = run(1, TRAIN, args, 90);
    cr_assert_eq(r.rc, 0, "%s", r.err);
    int lines = 0;
    for (const char *p = r.out; (p = strstr(p, "  predicted on ")) != NULL; p++) {
      char name[32];
      double step_ms, kern_ms, sync_ms, tps, mfu;
      cr_assert_eq(sscanf(p,
                          "  predicted on %31[^:]: step %lf ms (kernels %lf, host syncs %lf), "
                          "%lf tok/s, MFU %lf%%",
                          name, &step_ms, &kern_ms, &sync_ms, &tps, &mfu),
                   6, "%.200s", p);
      cr_expect_str_eq(name, k ? "H200 SXM" : "H100 SXM");
      cr_expect(step_ms > 0 && kern_ms > 0 && fabs(kern_ms + sync_ms - step_ms) < 0.02, "%.200s",
                p);
      ms[k] = step_ms;
      lines++;
    }
    cr_expect_eq(lines, 2, "a prediction after steps 2 and 3:\n%s", r.out);
    cr_expect(strstr(r.out, "device calls per step:"), "--predict implies --profile");
    cr_expect(strstr(r.out, "the last step's ten costliest of "), "%s", r.out);
    cr_expect(!strstr(r.out, "no cost formula"), "a kernel without a cost formula:\n%s", r.out);
    cr_expect(strstr(r.out, "cublas gemm fp32"), "%s", r.out);
    run_free(&r);
  }
  cr_expect(ms[1] <= ms[0], "H200 %.3f ms vs H100 %.3f ms", ms[1], ms[0]);
  /* the emulator's cost-only mode (WEFT_EMU_COST_ONLY, for models at full
   * size) models the same step: it never clips (norms are 0), so the
   * scaling kernel and its sync are missing, ~2% here */
  setenv("WEFT_EMU_COST_ONLY", "1", 1);
  const char *args[] = {"--model",  "gpt2-demo", "--steps",   "3",    "--val-every", "0",
                        "--device", "cuda",      "--predict", "h100", NULL};
  r = run(1, TRAIN, args, 90);
  unsetenv("WEFT_EMU_COST_ONLY");
  cr_assert_eq(r.rc, 0, "%s", r.err);
  const char *p = strstr(r.out, "  predicted on H100 SXM: step ");
  double cost_only_ms = 0;
  cr_assert(p && sscanf(p, "  predicted on H100 SXM: step %lf", &cost_only_ms) == 1, "%s", r.out);
  cr_expect(fabs(cost_only_ms - ms[0]) <= 0.05 * ms[0], "cost-only %.3f ms vs a real run's %.3f",
            cost_only_ms, ms[0]);
  run_free(&r);
}

Test(examples, train_gpt2_checkpoint_resumes_on_another_mesh, .timeout = 150) {
  const char *dir = tmp_file("gpt2-ckpt");
  remove_tree(dir);
  const char *a1[] = {"--model",     "gpt2-demo", "--mesh",   "dp=2,tp=2", "--steps",  "3",
                      "--dropout",   "0.1",       "--warmup", "0",         "--min-lr", "0.003",
                      "--val-every", "0",         "--save",   dir,         NULL};
  run_out r = run(4, TRAIN, a1, 80);
  cr_assert_eq(r.rc, 0, "save run failed: %s", r.err);
  run_free(&r);
  const char *jr = tmp_file("gpt2-r.jsonl"), *js = tmp_file("gpt2-s.jsonl");
  const char *a2[] = {"--model",     "gpt2-demo", "--mesh",   "tp=2", "--steps",    "6",
                      "--dropout",   "0.1",       "--warmup", "0",    "--min-lr",   "0.003",
                      "--val-every", "0",         "--resume", dir,    "--log-json", jr,
                      NULL};
  r = run(2, TRAIN, a2, 60);
  cr_expect_eq(r.rc, 0, "resume failed: %s", r.err);
  cr_expect(strstr(r.out, "at step 3") != NULL, "%s", r.out);
  run_free(&r);
  const char *a3[] = {"--model",     "gpt2-demo", "--steps",    "6",        "--dropout",
                      "0.1",         "--warmup",  "0",          "--min-lr", "0.003",
                      "--val-every", "0",         "--log-json", js,         NULL};
  r = run(1, TRAIN, a3, 60);
  cr_expect_eq(r.rc, 0, "straight run failed: %s", r.err);
  run_free(&r);
  double lr[6], ls[6];
  int nr = read_json_losses(jr, lr, 6), ns = read_json_losses(js, ls, 6);
  cr_assert_eq(nr, 3, "the resumed run should log steps 4..6, got %d", nr);
  cr_assert_eq(ns, 6);
  for (int s = 0; s < 3; s++)
    cr_expect(fabs(lr[s] - ls[3 + s]) <= 1e-5 * ls[3 + s],
              "step %d: resumed on tp=2 %.7f vs straight %.7f", 4 + s, lr[s], ls[3 + s]);
  const char *a4[] = {"--steps", "4", "--resume", dir, NULL};
  expect_error(1, a4, "a checkpoint of a gpt2 model; this run trains a llama model");
  unlink(jr);
  unlink(js);
  remove_tree(dir);
}

/* ------------------------------------------------------------ the tour */

#ifdef WEFT_TOUR
/* The tour's "step N loss L grad norm G" lines, in order: fills loss[] and
 * norm[] (at most cap) and returns how many; -1 if a step number is out of
 * order. */
static int read_tour(const char *out, double *loss, double *norm, int cap) {
  int n = 0;
  for (const char *p = out; (p = strstr(p, "step ")) && n < cap; p++) {
    int step = -1;
    if (sscanf(p, "step %d loss %lf grad norm %lf", &step, &loss[n], &norm[n]) != 3) continue;
    if (step != n) return -1;
    n++;
  }
  return n;
}

/* README.md's tour block: the lines between the ```c line after
 * "<!-- tour:begin -->" and the closing ``` (malloc'ed; NULL if absent);
 * *lines = their count. */
static char *readme_tour(int *lines) {
  char *t = slurp(WEFT_README), *b = strstr(t, "<!-- tour:begin -->\n```c\n"), *e = NULL;
  if (b) {
    b += strlen("<!-- tour:begin -->\n```c\n");
    e = strstr(b, "\n```\n<!-- tour:end -->");
  }
  char *code = NULL;
  if (b && e) {
    code = strndup(b, (size_t)(e - b + 1));
    *lines = count_lines(code);
  }
  free(t);
  return code;
}

Test(examples, readme_tour_is_under_150_lines_and_is_the_program_built, .timeout = 30) {
  int lines = 0;
  char *code = readme_tour(&lines);
  cr_assert(code != NULL, "no ```c block between <!-- tour:begin --> and <!-- tour:end --> in %s",
            WEFT_README);
  cr_expect(lines > 20 && lines < 150,
            "the README's tour has %d lines (want a complete program "
            "under 150)",
            lines);
  /* the built source is a #line directive and then the block as it stands */
  char *built = slurp(WEFT_TOUR_SOURCE), *nl = strchr(built, '\n');
  cr_expect(strncmp(built, "#line ", 6) == 0 && nl, "%s does not start with #line",
            WEFT_TOUR_SOURCE);
  cr_expect(nl && strcmp(nl + 1, code) == 0,
            "%s is not README.md's tour block (rebuild: README.md changed since)",
            WEFT_TOUR_SOURCE);
  free(built);
  free(code);
}

Test(examples, readme_tour_learns_and_prints_the_same_losses_on_1_2_and_4_ranks, .timeout = 150) {
  enum { STEPS = 8 };
  double loss[3][STEPS + 1], norm[3][STEPS + 1];
  const int ranks[3] = {1, 2, 4}; /* 1x1, dp=1 x tp=2, dp=2 x tp=2 */
  for (int k = 0; k < 3; k++) {
    run_out r = run(ranks[k], WEFT_TOUR, NULL, 40 * ranks[k]);
    cr_assert_eq(r.rc, 0, "weft-tour on %d ranks failed (rc %d):\n%s\n%s", ranks[k], r.rc, r.out,
                 r.err);
    int n = read_tour(r.out, loss[k], norm[k], STEPS + 1);
    cr_assert_eq(n, STEPS,
                 "weft-tour on %d ranks: %d step lines, want %d (rank 0 prints them):\n%s",
                 ranks[k], n, STEPS, r.out);
    run_free(&r);
  }
  /* it learns: from about ln V = ln 64 = 4.16, every step lower, at the end
   * below 3/4 of the start (2.80 when this was written) */
  cr_expect(fabs(loss[0][0] - log(64.0)) < 0.05, "first loss %.6f, want about ln 64", loss[0][0]);
  for (int s = 1; s < STEPS; s++)
    cr_expect(loss[0][s] < loss[0][s - 1], "step %d loss %.6f is not below step %d's %.6f", s,
              loss[0][s], s - 1, loss[0][s - 1]);
  cr_expect(loss[0][STEPS - 1] < 0.75 * loss[0][0], "loss %.6f -> %.6f in %d steps", loss[0][0],
            loss[0][STEPS - 1], STEPS);
  /* the same training on every mesh: losses to 1e-5, grad norms to 1e-4 */
  for (int k = 1; k < 3; k++)
    for (int s = 0; s < STEPS; s++) {
      double dl = fabs(loss[k][s] - loss[0][s]) / loss[0][s];
      double dn = fabs(norm[k][s] - norm[0][s]) / norm[0][s];
      cr_expect(dl <= 1e-5, "step %d loss on %d ranks %.9f vs 1 rank %.9f (rel %.2g)", s, ranks[k],
                loss[k][s], loss[0][s], dl);
      cr_expect(dn <= 1e-4, "step %d grad norm on %d ranks %.6f vs 1 rank %.6f (rel %.2g)", s,
                ranks[k], norm[k][s], norm[0][s], dn);
    }
}

/* README.md's app.c ("Use it from your project"), built from the README by
 * examples/tour (so is its "Devices" fragment, compiled only): it runs and
 * prints what the README says it prints. */
Test(examples, readme_app_runs_on_2_ranks_as_the_readme_says, .timeout = 60) {
  run_out r = run(2, WEFT_README_APP, NULL, 40);
  cr_assert_eq(r.rc, 0, "weft-readme-app on 2 ranks failed (rc %d):\n%s\n%s", r.rc, r.out, r.err);
  cr_expect(strstr(r.out, "rank 0 of 2\n") && strstr(r.out, "rank 1 of 2\n"),
            "weft-readme-app printed:\n%s", r.out);
  run_free(&r);
}
#endif

/* ---------------------------------------------------------------- planning */

Test(examples, plan_ranks_70b_on_128x8_in_under_a_second, .timeout = 30) {
  const char *a[] = {"--model", "llama70b", "--nodes", "128", "--gpus-per-node", "8", "--batch",
                     "1024",    "--top",    "0",       NULL};
  run_out r = run(0, PLAN, a, 20);
  cr_assert_eq(r.rc, 0, "%s", r.err);
  cr_expect(r.secs < 1.0, "took %.3f s", r.secs);
  cr_expect(strstr(r.out, "1024 ranks = 128 nodes x 8") != NULL, "%s", r.out);
  cr_expect(strstr(r.out, "factorisations of 1024 ranks") != NULL, "%s", r.out);
  /* tp in {1, 2, 4, 8} within a node, every (rep, shard) split of the rest:
   * 11 + 10 + 9 + 8 = 38 rows, ranked 1..38 */
  cr_expect(strstr(r.out, "38 factorisations") != NULL, "%s", r.out);
  cr_expect(strstr(r.out, "\n  38 ") != NULL, "no 38th row:\n%s", r.out);
  run_free(&r);
  /* a small model does fit: rows marked yes come first */
  const char *b[] = {"--model", "tiny",    "--nodes", "2", "--gpus-per-node",
                     "4",       "--batch", "16",      NULL};
  r = run(0, PLAN, b, 20);
  cr_assert_eq(r.rc, 0, "%s", r.err);
  char *yes = strstr(r.out, " yes ");
  cr_expect(yes != NULL, "nothing fits:\n%s", r.out);
  run_free(&r);
  const char *c[] = {"--cluster", "nowhere", NULL};
  r = run(0, PLAN, c, 20);
  cr_expect_neq(r.rc, 0);
  cr_expect(strstr(r.err, "unknown preset 'nowhere'") != NULL, "%s", r.err);
  run_free(&r);
}

static void validate_on(int n, int timeout, const char *flag) {
  const char *a[] = {"--validate", flag, NULL};
  run_out r = run(n, PLAN, a, timeout);
  cr_expect_eq(r.rc, 0, "weft-plan --validate on %d ranks failed (rc %d):\n%s\n%s", n, r.rc, r.out,
               r.err);
  cr_expect(strstr(r.out, "MISMATCH") == NULL, "%s", r.out);
  cr_expect(strstr(r.out, "comm exact") != NULL, "%s", r.out);
  cr_expect(strstr(r.out, " 0 failed") != NULL, "%s", r.out);
  run_free(&r);
}

Test(examples, plan_validate_2_ranks, .timeout = 200) {
  validate_on(2, 60, NULL);
  validate_on(2, 60, "--sequence-parallel");
  validate_on(2, 60, "--no-loss-parallel");
}
Test(examples, plan_validate_4_ranks, .timeout = 300) { validate_on(4, 280, NULL); }

/* ------------------------------------------------- planning: --measure */

Test(examples, plan_spearman_of_known_vectors_with_ties) {
  /* reference: ranks by hand, Pearson's formula in double */
  double a[5] = {1, 2, 3, 4, 5}, b[5] = {10, 20, 30, 40, 50}, c[5] = {5, 4, 3, 2, 1};
  cr_expect_float_eq(plan_spearman(a, b, 5), 1.0, 1e-12);
  cr_expect_float_eq(plan_spearman(a, c, 5), -1.0, 1e-12);
  /* d = (1,2,3,4,5) vs e = (2,1,4,3,5): sum d^2 = 4, rho = 1 - 6*4/(5*24) = 0.8 */
  double e[5] = {0.2, 0.1, 0.4, 0.3, 0.5};
  cr_expect_float_eq(plan_spearman(a, e, 5), 0.8, 1e-12);
  /* ties: x = (1, 2, 2, 3) has ranks (1, 2.5, 2.5, 4); y = (1, 3, 2, 4) ranks
   * (1, 3, 2, 4); Pearson of the ranks about 2.5: sxy = 2.25 + 0 + 0 + 2.25 = 4.5,
   * sxx = 4.5, syy = 2.25 + 0.25 + 0.25 + 2.25 = 5 */
  double x[4] = {1, 2, 2, 3}, y[4] = {1, 3, 2, 4}, rx[4];
  plan_ranks(x, 4, rx);
  cr_expect_float_eq(rx[0], 1.0, 1e-12);
  cr_expect_float_eq(rx[1], 2.5, 1e-12);
  cr_expect_float_eq(rx[2], 2.5, 1e-12);
  cr_expect_float_eq(rx[3], 4.0, 1e-12);
  double ry[4] = {1, 3, 2, 4}, mx = 2.5, my = 2.5, sxy = 0, sxx = 0, syy = 0;
  for (int i = 0; i < 4; i++) {
    sxy += (rx[i] - mx) * (ry[i] - my);
    sxx += (rx[i] - mx) * (rx[i] - mx);
    syy += (ry[i] - my) * (ry[i] - my);
  }
  cr_expect_float_eq(plan_spearman(x, y, 4), sxy / sqrt(sxx * syy), 1e-12);
  cr_expect_float_eq(plan_spearman(x, y, 4), 4.5 / sqrt(4.5 * 5.0), 1e-12);
  /* random vectors against a double reference with its own tie handling */
  srand(7);
  for (int trial = 0; trial < 20; trial++) {
    double p[9], q[9], rp[9], rq[9];
    for (int i = 0; i < 9; i++) {
      p[i] = rand() % 5; /* many ties */
      q[i] = (double)rand() / RAND_MAX;
    }
    for (int i = 0; i < 9; i++) {
      int lp = 0, ep = 0, lq = 0, eq = 0;
      for (int j = 0; j < 9; j++) {
        lp += p[j] < p[i];
        ep += p[j] == p[i];
        lq += q[j] < q[i];
        eq += q[j] == q[i];
      }
      rp[i] = lp + (ep + 1) / 2.0;
      rq[i] = lq + (eq + 1) / 2.0;
    }
    double a1 = 0, a2 = 0, s12 = 0, s11 = 0, s22 = 0;
    for (int i = 0; i < 9; i++) {
      a1 += rp[i] / 9;
      a2 += rq[i] / 9;
    }
    for (int i = 0; i < 9; i++) {
      s12 += (rp[i] - a1) * (rq[i] - a2);
      s11 += (rp[i] - a1) * (rp[i] - a1);
      s22 += (rq[i] - a2) * (rq[i] - a2);
    }
    double want = s11 > 0 ? s12 / sqrt(s11 * s22) : NAN;
    double got = plan_spearman(p, q, 9);
    if (isnan(want))
      cr_expect(isnan(got), "trial %d: want NAN, got %g", trial, got);
    else
      cr_expect_float_eq(got, want, 1e-12, "trial %d", trial);
  }
  /* constant side or too few points: NAN */
  double k[3] = {2, 2, 2};
  cr_expect(isnan(plan_spearman(a, k, 3)));
  cr_expect(isnan(plan_spearman(a, b, 1)));
}

/* Parses an SVG with Python's XML parser (well-formed or an exception) and
 * prints "circles N" and one "label TEXT" line per <text class="label">. */
static const char *const SVG_PY =
    "import sys, xml.etree.ElementTree as E\n"
    "r = E.parse(sys.argv[1]).getroot()\n"
    "ns = '{http://www.w3.org/2000/svg}'\n"
    "print('root', r.tag)\n"
    "print('circles', len(r.findall('.//' + ns + 'circle')))\n"
    "for t in r.iter(ns + 'text'):\n"
    "    print(('label ' if t.get('class') == 'label' else 'text ') + (t.text or ''))\n";

Test(examples, plan_measure_4_ranks_reports_every_factorisation, .timeout = 200) {
  const char *svg = tmp_file("plan.svg"), *json = tmp_file("plan.json");
  const char *probe = tmp_file("probe.json");
  const char *a[] = {"--measure", "--model", "demo", "--steps",     "2",   "--svg",
                     svg,         "--json",  json,   "--probe-out", probe, NULL};
  run_out r = run(4, PLAN, a, 180);
  cr_assert_eq(r.rc, 0, "rc %d:\n%s\n%s", r.rc, r.out, r.err);
  /* 4 ranks: (rep, shard) of 4 with tp 1 (3), of 2 with tp 2 (2, each in
   * both layouts: 4), tp 4 (1) = 8 rows, every one with exact comm bytes */
  const char *names[8] = {"dp_shard=4",
                          "dp_replicate=2 x dp_shard=2",
                          "dp_replicate=4",
                          "dp_shard=2 x tp=2 (tp inside)",
                          "dp_shard=2 x tp=2 (tp across)",
                          "dp_replicate=2 x tp=2 (tp inside)",
                          "dp_replicate=2 x tp=2 (tp across)",
                          "tp=4"};
  const char *table = strstr(r.out, "weft-plan --measure: model demo");
  cr_assert(table != NULL, "no table:\n%s", r.out);
  for (int i = 0; i < 8; i++) {
    char want[64];
    snprintf(want, sizeof want, "\n%s ", names[i]);
    cr_expect(strstr(table, want) != NULL, "no row '%s':\n%s", names[i], table);
  }
  cr_expect(strstr(r.out, "MISMATCH") == NULL, "%s", r.out);
  cr_expect(strstr(r.out, "run failed") == NULL, "%s", r.out);
  cr_expect(strstr(r.out, "(exact)") != NULL, "%s", r.out);
  cr_expect(strstr(r.out, "Spearman rank correlation") != NULL, "%s", r.out);
  cr_expect(strstr(r.out, "predicted fastest: ") != NULL, "%s", r.out);
  cr_expect(strstr(r.out, "measured fastest:  ") != NULL, "%s", r.out);
  cr_expect(strstr(r.out, "probe: 1 node x 4 ranks per node") != NULL, "%s", r.out);
  /* the SVG: well-formed XML, one circle and one label per factorisation */
  const char *pa[] = {"-c", SVG_PY, svg, NULL};
  run_out s = run(0, "/usr/bin/python3", pa, 30);
  cr_expect_eq(s.rc, 0, "SVG does not parse:\n%s\n%s", s.out, s.err);
  cr_expect(strstr(s.out, "root {http://www.w3.org/2000/svg}svg") != NULL, "%s", s.out);
  cr_expect(strstr(s.out, "circles 8\n") != NULL, "%s", s.out);
  for (int i = 0; i < 8; i++) {
    char want[64];
    snprintf(want, sizeof want, "label %s\n", names[i]);
    cr_expect(strstr(s.out, want) != NULL, "no label '%s':\n%s", names[i], s.out);
  }
  cr_expect(strstr(s.out, "text predicted step time (s)") != NULL, "%s", s.out);
  cr_expect(strstr(s.out, "Spearman") != NULL, "%s", s.out);
  run_free(&s);
  /* the JSON: 8 rows with positive times, bytes predicted == measured */
  char *txt = slurp(json);
  cJSON *j = cJSON_Parse(txt);
  free(txt);
  cr_assert(j != NULL, "JSON does not parse");
  const cJSON *rows = cJSON_GetObjectItem(j, "rows");
  cr_expect_eq(cJSON_GetArraySize(rows), 8);
  const cJSON *row;
  cJSON_ArrayForEach(row, rows) {
    const char *nm = cJSON_GetStringValue(cJSON_GetObjectItem(row, "name"));
    double ps = cJSON_GetNumberValue(cJSON_GetObjectItem(row, "predicted_s"));
    double ms = cJSON_GetNumberValue(cJSON_GetObjectItem(row, "measured_s"));
    cr_expect(ps > 0 && ms > 0, "%s: predicted %g measured %g", nm, ps, ms);
    cr_expect(cJSON_IsTrue(cJSON_GetObjectItem(row, "comm_exact")), "%s", nm);
    const cJSON *dim;
    int dims = 0;
    cJSON_ArrayForEach(dim, cJSON_GetObjectItem(row, "comm")) {
      double pb = cJSON_GetNumberValue(cJSON_GetObjectItem(dim, "predicted_bytes"));
      double mb = cJSON_GetNumberValue(cJSON_GetObjectItem(dim, "measured_bytes"));
      cr_expect(pb > 0 && pb == mb, "%s %s: %.0f vs %.0f", nm, dim->string, pb, mb);
      dims++;
    }
    cr_expect(dims >= 1, "%s: no comm dims", nm);
  }
  double rho = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "spearman"));
  cr_expect(rho >= -1 && rho <= 1, "spearman %g", rho);
  cr_expect(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "max_abs_error")) >= 0);
  cJSON_Delete(j);
  run_free(&r);
  /* --calibrate with the probe just written predicts without running */
  const char *c[] = {"--calibrate", probe,     "--nodes", "1", "--gpus-per-node",
                     "4",           "--model", "demo",    NULL};
  r = run(0, PLAN, c, 30);
  cr_expect_eq(r.rc, 0, "%s\n%s", r.out, r.err);
  cr_expect(strstr(r.out, "8 factorisations of 4 ranks") != NULL, "%s", r.out);
  cr_expect(strstr(r.out, "tp across nodes") != NULL, "%s", r.out);
  run_free(&r);
  unlink(svg);
  unlink(json);
  unlink(probe);
}

/* The step times --calibrate predicts, in the table's row order (the
 * last number of each row's last '|' segment); returns how many. */
static int calibrate_steps(const char *probe, double *steps, int cap, run_out *r) {
  const char *a[] = {"--calibrate", probe, "--model", "measure", "--batch", "8", NULL};
  *r = run(0, PLAN, a, 20);
  int n = 0;
  for (const char *line = r->out; line && *line && n < cap;) {
    const char *end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line) : strlen(line);
    char buf[512];
    snprintf(buf, sizeof buf, "%.*s", (int)(len < 511 ? len : 511), line);
    int rank = 0;
    char *bar = strrchr(buf, '|');
    if (sscanf(buf, "%d", &rank) == 1 && rank > 0 && bar) {
      double v[4];
      if (sscanf(bar + 1, "%lf %lf %lf %lf", &v[0], &v[1], &v[2], &v[3]) == 4) steps[n++] = v[3];
    }
    line = end ? end + 1 : NULL;
  }
  return n;
}

/* Writes j to path and deletes it. */
static void write_json_file(const char *path, cJSON *j) {
  char *out = cJSON_Print(j);
  cJSON_Delete(j);
  FILE *f = fopen(path, "w");
  cr_assert(f != NULL && out != NULL);
  fputs(out, f);
  fclose(f);
  free(out);
}

/* Sets every collective kind's after-gap curve of the probe JSON to its
 * back-to-back curve times `scale` (scale < 0: removes gap_s and the
 * curves) and writes it to path. */
static void write_gap_variant(const char *src, const char *path, double scale) {
  char *txt = slurp(src);
  cJSON *j = cJSON_Parse(txt);
  free(txt);
  cr_assert(j != NULL, "%s does not parse", src);
  cJSON *e;
  cJSON_ArrayForEach(e, cJSON_GetObjectItem(j, "collectives")) {
    const char *kinds[3] = {"all_gather", "reduce_scatter", "all_reduce"};
    for (int k = 0; k < 3; k++) {
      char key[64];
      snprintf(key, sizeof key, "%s_after_gap", kinds[k]);
      cJSON_DeleteItemFromObject(e, key);
      if (scale < 0) continue;
      const cJSON *b = cJSON_GetObjectItem(e, kinds[k]);
      double v[4];
      for (int z = 0; z < 4; z++) v[z] = scale * cJSON_GetNumberValue(cJSON_GetArrayItem(b, z));
      cJSON_AddItemToObject(e, key, cJSON_CreateDoubleArray(v, 4));
    }
    if (scale < 0) cJSON_DeleteItemFromObject(e, "gap_s");
  }
  write_json_file(path, j);
}

/* The after-gap curves (a collective right after compute: a shaped link's
 * token bucket refills in the gap) move each call's time from the
 * back-to-back curve towards them: equal curves change nothing, faster
 * ones lower every step, and a probe without them (an older file) gives
 * the back-to-back prediction. A probe measured on 2 emulated nodes x 2
 * ranks at 1 Gbit/s (bench/topology.sh). */
Test(examples, plan_calibrate_after_gap_curves_move_predictions_their_way, .timeout = 60) {
  const char *src = WEFT_TEST_DATA_DIR "/plan/probe-2x2-1gbit.json";
  const char *none = tmp_file("gap-none.json"), *same = tmp_file("gap-same.json"),
             *half = tmp_file("gap-half.json");
  write_gap_variant(src, none, -1);
  write_gap_variant(src, same, 1);
  write_gap_variant(src, half, 0.5);
  double a[16], b[16], c[16];
  run_out ra, rb, rc;
  int na = calibrate_steps(none, a, 16, &ra), nb = calibrate_steps(same, b, 16, &rb),
      nc = calibrate_steps(half, c, 16, &rc);
  cr_expect_eq(ra.rc, 0, "%s%s", ra.out, ra.err);
  cr_expect_eq(rb.rc, 0, "%s%s", rb.out, rb.err);
  cr_expect_eq(rc.rc, 0, "%s%s", rc.out, rc.err);
  cr_expect(na >= 7 && na == nb && na == nc, "rows %d %d %d:\n%s", na, nb, nc, ra.out);
  /* the table is sorted by step time: compare sorted sums and extremes */
  double sa = 0, sb = 0, sc = 0;
  for (int i = 0; i < na && i < nb && i < nc; i++) {
    sa += a[i];
    sb += b[i];
    sc += c[i];
  }
  cr_expect(fabs(sa - sb) < 1e-4 * sa, "equal curves changed the steps: %g vs %g", sa, sb);
  cr_expect(sc < 0.95 * sa, "halved after-gap curves: steps %g, back to back %g", sc, sa);
  cr_expect(nc > 0 && c[0] < a[0] && c[nc - 1] < a[na - 1], "%s\nvs\n%s", rc.out, ra.out);
  run_free(&ra);
  run_free(&rb);
  run_free(&rc);
  /* gap_s without a kind's after-gap curve: a clear error */
  char *txt = slurp(same);
  cJSON *j = cJSON_Parse(txt);
  free(txt);
  cJSON_DeleteItemFromObject(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "collectives"), 0),
                             "all_reduce_after_gap");
  write_json_file(same, j);
  const char *args[] = {"--calibrate", same, NULL};
  run_out r = run(0, PLAN, args, 20);
  cr_expect_eq(r.rc, 2, "rc %d\n%s", r.rc, r.err);
  cr_expect(strstr(r.err, "collectives[0]") != NULL && strstr(r.err, "after gap_s") != NULL, "%s",
            r.err);
  run_free(&r);
  unlink(none);
  unlink(same);
  unlink(half);
}

/* One row of weft-plan's table: the factorisation and its predicted
 * seconds (dp_replicate, dp_shard and tp comm, step); false if absent. */
typedef struct {
  double rep_s, shard_s, tp_s, step_s;
} plan_row;
static bool plan_find_row(const char *out, int rep, int shard, int tp, bool across, plan_row *row) {
  for (const char *line = out; line && *line;) {
    const char *end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line) : strlen(line);
    char buf[512];
    snprintf(buf, sizeof buf, "%.*s", (int)(len < 511 ? len : 511), line);
    int k, r, s, t;
    char *bar = strrchr(buf, '|');
    if (sscanf(buf, "%d %d %d %d", &k, &r, &s, &t) == 4 && bar && r == rep && s == shard &&
        t == tp && (strstr(buf, "tp across nodes") != NULL) == across &&
        sscanf(bar + 1, "%lf %lf %lf %lf", &row->rep_s, &row->shard_s, &row->tp_s, &row->step_s) ==
            4)
      return true;
    line = end ? end + 1 : NULL;
  }
  return false;
}

/* A factorisation and whether a setting should move its predicted step. */
typedef struct {
  int rep, shard, tp;
  bool across, moves;
} plan_case;

/* One side of a comparison: up to 2 more arguments (NULL-ended) and
 * WEFT_PRESYNC_BYTES (NULL: unset). */
typedef struct {
  const char *args[3];
  const char *presync;
} plan_side;

/* Runs weft-plan --calibrate on the stored 2 x 2 probe at 1 Gbit/s as side
 * a, then as side b, and checks each case's step: up from a to b where it
 * moves (down with `down`), unchanged where it does not. Rows of both runs
 * land in ra / rb. */
static void calibrate_moves(plan_side a, plan_side b, const plan_case *cs, int n, bool down,
                            plan_row *ra, plan_row *rb) {
  const char *src = WEFT_TEST_DATA_DIR "/plan/probe-2x2-1gbit.json";
  run_out r[2];
  for (int i = 0; i < 2; i++) {
    const plan_side *x = i ? &b : &a;
    if (x->presync)
      setenv("WEFT_PRESYNC_BYTES", x->presync, 1);
    else
      unsetenv("WEFT_PRESYNC_BYTES");
    const char *args[] = {"--calibrate", src,        "--model",  "measure", "--batch",
                          "8",           x->args[0], x->args[1], NULL};
    r[i] = run(0, PLAN, args, 20);
    cr_assert_eq(r[i].rc, 0, "%s%s", r[i].out, r[i].err);
  }
  for (int c = 0; c < n; c++) {
    cr_assert(plan_find_row(r[0].out, cs[c].rep, cs[c].shard, cs[c].tp, cs[c].across, &ra[c]) &&
                  plan_find_row(r[1].out, cs[c].rep, cs[c].shard, cs[c].tp, cs[c].across, &rb[c]),
              "no row %d x %d x %d:\n%s", cs[c].rep, cs[c].shard, cs[c].tp, r[0].out);
    double d = down ? ra[c].step_s - rb[c].step_s : rb[c].step_s - ra[c].step_s;
    if (cs[c].moves)
      cr_expect(d > 1e-4, "%d x %d x %d: %g then %g", cs[c].rep, cs[c].shard, cs[c].tp,
                ra[c].step_s, rb[c].step_s);
    else
      cr_expect(fabs(d) < 1e-4, "%d x %d x %d: %g then %g, want equal", cs[c].rep, cs[c].shard,
                cs[c].tp, ra[c].step_s, rb[c].step_s);
  }
  run_free(&r[0]);
  run_free(&r[1]);
}

/* What hides FSDP's comm (plan.c, "overlap"): intra-node dp_shard comm hides
 * under inter-node TP waits and never under compute, so the overlap factor
 * moves neither HSDP (dp_shard inside nodes) nor dp_shard x tp with tp
 * across; inter-node dp_shard comm hides under compute by the factor and
 * not under intra-node TP waits (at overlap 0, tp inside pays both in
 * full). */
Test(examples, plan_calibrate_overlap_hides_only_network_fsdp, .timeout = 60) {
  const plan_case cs[] = {{2, 2, 1, false, false},
                          {1, 2, 2, true, false},
                          {1, 4, 1, false, true},
                          {1, 2, 2, false, true}};
  plan_side zero = {{"--overlap", "0", NULL}, NULL}, one = {{"--overlap", "1", NULL}, NULL};
  plan_row z[4], o[4];
  calibrate_moves(zero, one, cs, 4, true, z, o);
  /* tp inside at overlap 0: no hiding under TP's intra-node waits */
  cr_expect(z[3].step_s > z[3].shard_s + z[3].tp_s, "step %g, comm %g + %g", z[3].step_s,
            z[3].shard_s, z[3].tp_s);
}

/* mesh's presync in the time model: a barrier per blocking call of at
 * least WEFT_PRESYNC_BYTES on groups that span nodes and hold all their
 * ranks (dp_replicate=4 on 2 x 2), none for groups that share their nodes
 * (HSDP's replicate groups, tp across nodes) or for FSDP's async calls
 * (dp_shard=4). */
Test(examples, plan_calibrate_counts_presync_barriers_where_mesh_runs_them, .timeout = 60) {
  const plan_case cs[] = {{4, 1, 1, false, true},
                          {2, 2, 1, false, false},
                          {1, 2, 2, true, false},
                          {1, 4, 1, false, false}};
  plan_side off = {{NULL}, "0"}, on = {{NULL}, "65536"};
  plan_row a[4], b[4];
  calibrate_moves(off, on, cs, 4, false, a, b);
  cr_expect(b[0].rep_s > a[0].rep_s, "dp_replicate comm %g vs %g", b[0].rep_s, a[0].rep_s);
  unsetenv("WEFT_PRESYNC_BYTES");
}

Test(examples, plan_calibrate_missing_or_corrupt_file_is_a_clear_error, .timeout = 30) {
  const char *bad = tmp_file("bad-probe.json");
  struct {
    const char *content; /* NULL: no file */
    const char *needle;
  } cases[] = {
      {NULL, "cannot open"},
      {"{not json", "is not JSON"},
      {"{\"x\": 1}", "is not a weft-plan probe"},
      {"{\"format\": \"weft-plan probe 1\", \"nodes\": 1, \"ranks_per_node\": 4}",
       "\"intra_lat\" is missing"},
      {"{\"format\": \"weft-plan probe 1\", \"nodes\": 1, \"ranks_per_node\": 4, \"intra_lat\": "
       "1e-4, \"inter_lat\": 0, \"intra_bw\": 1e8, \"inter_bw\": 0, \"intra_rbw\": 1e8, "
       "\"inter_rbw\": 0, \"flops\": -3, \"mem_bw\": 1e9, \"overlap\": 0, \"seconds\": 1}",
       "\"flops\" is missing or not a number > 0"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    unlink(bad);
    if (cases[i].content) {
      FILE *f = fopen(bad, "w");
      cr_assert(f != NULL);
      fputs(cases[i].content, f);
      fclose(f);
    }
    const char *a[] = {"--calibrate", bad, NULL};
    run_out r = run(0, PLAN, a, 20);
    cr_expect_eq(r.rc, 2, "[%s] rc %d", cases[i].needle, r.rc);
    cr_expect_eq(count_lines(r.err), 1, "[%s] want one line:\n%s", cases[i].needle, r.err);
    cr_expect(strstr(r.err, "weft-plan: error: --calibrate:") != NULL, "%s", r.err);
    cr_expect(strstr(r.err, cases[i].needle) != NULL, "[%s] not in:\n%s", cases[i].needle, r.err);
    cr_expect(strstr(r.err, bad) != NULL, "the file is not named:\n%s", r.err);
    run_free(&r);
  }
  unlink(bad);
}

/* --device cuda: the same program with the mesh on the (emulated or real)
 * GPU gives the CPU path's losses and gradient norms within 1e-6
 * relative on every mesh kind: one rank, FSDP x TP with loss parallel,
 * HSDP, TP with sequence parallelism, GPT-2 (tied lm_head, dropout) on
 * 2x2, FSDP dp=4 resharding to pairs after forward with gradient
 * accumulation; the held-out loss too. Skips where this process sees no
 * device. */
Test(examples, train_on_the_device_gives_the_cpu_losses_on_every_mesh_kind, .timeout = 600) {
  SKIP_WITHOUT_DEVICE();
  enum { STEPS = 3 };
  struct {
    int n;
    const char *args[12];
  } runs[] = {
      {1, {NULL}},
      {4, {"--mesh", "dp=2,tp=2", NULL}},
      {4, {"--mesh", "dp_replicate=2,dp_shard=2", NULL}},
      {2, {"--mesh", "tp=2", "--sequence-parallel", NULL}},
      {4, {"--model", "gpt2-demo", "--mesh", "dp=2,tp=2", "--dropout", "0.1", NULL}},
      {4, {"--mesh", "dp=4", "--reshard-after-forward=2", "--grad-accum", "2", NULL}},
  };
  for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
    double loss[2][STEPS], norm[2][STEPS], val[2][1];
    char what[160] = "";
    for (int i = 0; runs[r].args[i]; i++)
      snprintf(what + strlen(what), sizeof what - strlen(what), "%s ", runs[r].args[i]);
    for (int d = 0; d < 2; d++) {
      const char *j = tmp_file(d ? "dev-cuda.jsonl" : "dev-cpu.jsonl");
      const char *a[24] = {"--steps",    "3", "--val-every", "3",
                           "--log-json", j,   "--device",    d ? "cuda" : "cpu"};
      int k = 8;
      for (int i = 0; runs[r].args[i]; i++) a[k++] = runs[r].args[i];
      a[k] = NULL;
      run_out o = run(runs[r].n, TRAIN, a, 150);
      cr_assert_eq(o.rc, 0, "%s--device %s: rc %d: %s", what, d ? "cuda" : "cpu", o.rc, o.err);
      if (d)
        cr_expect(strstr(o.out, "(cuda)") != NULL, "%s: no device memory line:\n%s", what, o.out);
      run_free(&o);
      cr_assert_eq(read_json_losses(j, loss[d], STEPS), STEPS, "%s: losses in %s", what, j);
      cr_assert_eq(read_json_values(j, "\"grad_norm\":", norm[d], STEPS), STEPS, "%s", what);
      cr_assert_eq(read_json_values(j, "\"val_loss\":", val[d], 1), 1, "%s: val_loss", what);
      unlink(j);
    }
    for (int s = 0; s < STEPS; s++) {
      cr_expect(fabs(loss[1][s] - loss[0][s]) <= 1e-6 * fabs(loss[0][s]),
                "%sstep %d: loss on cuda %.9f vs cpu %.9f", what, s + 1, loss[1][s], loss[0][s]);
      cr_expect(fabs(norm[1][s] - norm[0][s]) <= 1e-6 * fabs(norm[0][s]),
                "%sstep %d: grad norm on cuda %.9f vs cpu %.9f", what, s + 1, norm[1][s],
                norm[0][s]);
    }
    cr_expect(fabs(val[1][0] - val[0][0]) <= 1e-6 * fabs(val[0][0]),
              "%sheld-out loss on cuda %.9f vs cpu %.9f", what, val[1][0], val[0][0]);
  }
}

/* Checkpoints across devices: saved from the device on dp=2 x tp=2 (one
 * async save mid-run, one at the end, a safetensors export), resumed on a
 * CPU mesh of another shape and on the device on tp=2, then saved on the
 * CPU and resumed on the device again: every resumed step's loss is the
 * straight device run's within 1e-6, and the export initialises a CPU run
 * as it does a device run. Skips where this process sees no device. */
Test(examples, train_checkpoint_moves_between_the_device_and_the_cpu, .timeout = 600) {
  SKIP_WITHOUT_DEVICE();
  enum { STEPS = 5 };
  const char *dir = tmp_file("ckdev"), *dir2 = tmp_file("ckcpu"), *st = tmp_file("ckdev.st");
  const char *js = tmp_file("straight.jsonl");
#define CONST_LR "--warmup", "0", "--min-lr", "0.003", "--val-every", "0"
  const char *a0[] = {"--mesh", "dp=2,tp=2",  "--device", "cuda",   "--steps",
                      "5",      "--log-json", js,         CONST_LR, NULL};
  run_out r = run(4, TRAIN, a0, 150);
  cr_assert_eq(r.rc, 0, "straight device run: %s", r.err);
  run_free(&r);
  double straight[STEPS];
  cr_assert_eq(read_json_losses(js, straight, STEPS), STEPS);
  const char *a1[] = {"--mesh",
                      "dp=2,tp=2",
                      "--device",
                      "cuda",
                      "--steps",
                      "2",
                      "--save",
                      dir,
                      "--save-every",
                      "1",
                      "--export-safetensors",
                      st,
                      CONST_LR,
                      NULL};
  r = run(4, TRAIN, a1, 150);
  cr_assert_eq(r.rc, 0, "device save run: %s", r.err);
  run_free(&r);
  struct {
    int n;
    const char *mesh, *device, *from, *save;
    int steps, first;
  } legs[] = {{2, "dp=2", "cpu", dir, dir2, 4, 3},
              {2, "tp=2", "cuda", dir, NULL, 5, 3},
              {4, "dp=2,tp=2", "cuda", dir2, NULL, 5, 5}};
  for (size_t l = 0; l < sizeof legs / sizeof legs[0]; l++) {
    const char *jr = tmp_file("leg.jsonl");
    char steps[8];
    snprintf(steps, sizeof steps, "%d", legs[l].steps);
    const char *a[24] = {"--mesh",     legs[l].mesh, "--device", legs[l].device,
                         "--steps",    steps,        "--resume", legs[l].from,
                         "--log-json", jr,           CONST_LR};
    int k = 16;
    if (legs[l].save) {
      a[k++] = "--save";
      a[k++] = legs[l].save;
    }
    a[k] = NULL;
    r = run(legs[l].n, TRAIN, a, 150);
    cr_assert_eq(r.rc, 0, "resume on %s %s: %s", legs[l].mesh, legs[l].device, r.err);
    run_free(&r);
    double got[STEPS];
    int n = read_json_losses(jr, got, STEPS);
    cr_expect_eq(n, legs[l].steps - legs[l].first + 1, "resume on %s %s: %d steps logged",
                 legs[l].mesh, legs[l].device, n);
    for (int s = 0; s < n; s++) {
      double want = straight[legs[l].first - 1 + s];
      cr_expect(fabs(got[s] - want) <= 1e-6 * want,
                "resume on %s %s, step %d: %.9f vs the straight device run's %.9f", legs[l].mesh,
                legs[l].device, legs[l].first + s, got[s], want);
    }
    unlink(jr);
  }
  /* the device's export initialises the CPU and the device alike */
  double init[2][1];
  for (int d = 0; d < 2; d++) {
    const char *ji = tmp_file("init.jsonl");
    const char *a[] = {"--mesh",     "tp=2", "--device",    d ? "cuda" : "cpu",
                       "--steps",    "1",    "--init-from", st,
                       "--log-json", ji,     NULL};
    r = run(2, TRAIN, a, 100);
    cr_assert_eq(r.rc, 0, "--init-from on %s: %s", d ? "cuda" : "cpu", r.err);
    run_free(&r);
    cr_assert_eq(read_json_losses(ji, init[d], 1), 1);
    unlink(ji);
  }
  cr_expect(fabs(init[1][0] - init[0][0]) <= 1e-6 * init[0][0],
            "--init-from: first loss on cuda %.9f vs cpu %.9f", init[1][0], init[0][0]);
#undef CONST_LR
  remove_tree(dir);
  remove_tree(dir2);
  unlink(st);
  unlink(js);
}

/* FSDP on the device: with dp=2 the per-rank device peak (weft-train's
 * peak_bytes_max: weft_alloc's accounting for the device) of the tiny
 * config at batch 2 is at most 0.65x the 1-rank peak. dp=2 halves the
 * sharded state (params, grads, AdamW: ~50 MiB on one rank) and the
 * activations (one row each) and adds one block's unsharded parameters,
 * grads and reduce-scatter buffer (~3 x 3.2 MB). The bound was 0.6 while
 * weft-train's Llama was nn/'s hand-written one; models/llama keeps fewer
 * activations, so the 1-rank peak fell (108.7 MiB on the emulated device)
 * and the fixed block buffers weigh more: measured 0.605 on the emulated
 * device and 0.614 on the CPU (2026-12-08). */
Test(examples, train_fsdp_halves_the_device_peak_memory, .timeout = 300) {
  SKIP_WITHOUT_DEVICE();
  double peak[2][1];
  for (int k = 0; k < 2; k++) {
    const char *j = tmp_file("mem.jsonl");
    const char *a[] = {
        "--model", "tiny",     "--batch", "2",          "--steps", "1",      "--val-every",
        "0",       "--device", "cuda",    "--log-json", j,         "--mesh", k ? "dp=2" : "dp=1",
        NULL};
    run_out r = run(k ? 2 : 1, TRAIN, a, 200);
    cr_assert_eq(r.rc, 0, "tiny on %d rank(s): %s", k + 1, r.err);
    run_free(&r);
    cr_assert_eq(read_json_values(j, "\"peak_bytes_max\":", peak[k], 1), 1);
    unlink(j);
  }
  cr_expect(peak[1][0] <= 0.65 * peak[0][0],
            "device peak per rank with FSDP dp=2: %.1f MiB, 1 rank: %.1f MiB (ratio %.3f > 0.65)",
            peak[1][0] / 1048576, peak[0][0] / 1048576, peak[1][0] / peak[0][0]);
  cr_log_info("device peak per rank: dp=2 %.1f MiB, 1 rank %.1f MiB (ratio %.3f)",
              peak[1][0] / 1048576, peak[0][0] / 1048576, peak[1][0] / peak[0][0]);
}

/* --cpu-offload (FSDP's CPUOffloadPolicy) on the device: the losses of the
 * run without it, and a lower device peak (the sharded parameters, grads
 * and AdamW state live in host memory; the optimizer steps on the CPU). */
Test(examples, train_cpu_offload_keeps_the_losses_and_lowers_the_device_peak, .timeout = 300) {
  SKIP_WITHOUT_DEVICE();
  enum { STEPS = 3 };
  double loss[2][STEPS], peak[2][1];
  for (int k = 0; k < 2; k++) {
    const char *j = tmp_file("offload.jsonl");
    const char *a[] = {"--model",     "tiny",       "--batch",
                       "2",           "--steps",    "3",
                       "--val-every", "0",          "--device",
                       "cuda",        "--log-json", j,
                       "--mesh",      "dp=2",       k ? "--cpu-offload" : NULL,
                       NULL};
    run_out r = run(2, TRAIN, a, 200);
    cr_assert_eq(r.rc, 0, "tiny dp=2%s: %s", k ? " --cpu-offload" : "", r.err);
    run_free(&r);
    cr_assert_eq(read_json_losses(j, loss[k], STEPS), STEPS, "losses in %s", j);
    cr_assert_eq(read_json_values(j, "\"peak_bytes_max\":", peak[k], 1), 1);
    unlink(j);
  }
  for (int s = 0; s < STEPS; s++)
    cr_expect(fabs(loss[1][s] - loss[0][s]) <= 1e-6 * fabs(loss[0][s]),
              "step %d: loss %.9f with --cpu-offload, %.9f without", s + 1, loss[1][s], loss[0][s]);
  cr_expect(peak[1][0] < peak[0][0], "device peak %.2f MiB with --cpu-offload, %.2f MiB without",
            peak[1][0] / 1048576, peak[0][0] / 1048576);
  cr_log_info("device peak per rank: %.2f MiB with --cpu-offload, %.2f MiB without",
              peak[1][0] / 1048576, peak[0][0] / 1048576);
}

/* A checkpoint saved under --cpu-offload (offloaded DTensors: host locals
 * on the device mesh) resumes on the device with and without offload
 * bitwise as the straight offloaded run, and on a CPU tp=2 mesh within
 * 1e-6. */
Test(examples, train_cpu_offload_checkpoint_resumes_on_the_device_and_on_the_cpu, .timeout = 300) {
  SKIP_WITHOUT_DEVICE();
  enum { STEPS = 4 };
  const char *dir = tmp_file("offload-ckpt"), *js = tmp_file("offload-straight.jsonl");
  remove_tree(dir);
  double straight[STEPS], resumed[STEPS];
  const char *a0[] = {"--steps", "4",    "--val-every",   "0",          "--device", "cuda",
                      "--mesh",  "dp=2", "--cpu-offload", "--log-json", js,         NULL};
  run_out r = run(2, TRAIN, a0, 150);
  cr_assert_eq(r.rc, 0, "straight offloaded run: %s", r.err);
  run_free(&r);
  cr_assert_eq(read_json_losses(js, straight, STEPS), STEPS);
  unlink(js);
  const char *a1[] = {"--steps", "2",    "--val-every",   "0",      "--device", "cuda",
                      "--mesh",  "dp=2", "--cpu-offload", "--save", dir,        NULL};
  r = run(2, TRAIN, a1, 150);
  cr_assert_eq(r.rc, 0, "offloaded save run: %s", r.err);
  run_free(&r);
  struct {
    const char *device, *mesh, *offload;
    double tol;
  } resumes[] = {
      {"cuda", "dp=2", NULL, 0}, {"cuda", "dp=2", "--cpu-offload", 0}, {"cpu", "tp=2", NULL, 1e-6}};
  for (size_t k = 0; k < sizeof resumes / sizeof resumes[0]; k++) {
    const char *j = tmp_file("offload-resumed.jsonl");
    const char *a[] = {"--steps",         "4",      "--val-every",      "0",        "--device",
                       resumes[k].device, "--mesh", resumes[k].mesh,    "--resume", dir,
                       "--log-json",      j,        resumes[k].offload, NULL};
    r = run(2, TRAIN, a, 150);
    cr_assert_eq(r.rc, 0, "resume on %s %s%s: %s", resumes[k].device, resumes[k].mesh,
                 resumes[k].offload ? " --cpu-offload" : "", r.err);
    run_free(&r);
    cr_assert_eq(read_json_losses(j, resumed, 2), 2, "resumed losses in %s", j);
    unlink(j);
    for (int s = 0; s < 2; s++)
      cr_expect(fabs(resumed[s] - straight[2 + s]) <= resumes[k].tol * fabs(straight[2 + s]),
                "resume on %s %s%s, step %d: loss %.17g, straight offloaded run %.17g",
                resumes[k].device, resumes[k].mesh, resumes[k].offload ? " --cpu-offload" : "",
                s + 3, resumed[s], straight[2 + s]);
  }
  remove_tree(dir);
}

/* --cpu-offload changes where FSDP's sharded state lives, not the numbers:
 * on the device, 2-D FSDP x TP, HSDP and GPT-2 (tied weights) on 2x2 give
 * bitwise the losses of the run without it. */
Test(examples, train_cpu_offload_is_bitwise_on_2d_hsdp_and_gpt2, .timeout = 300) {
  SKIP_WITHOUT_DEVICE();
  enum { STEPS = 3 };
  const char *meshes[][4] = {{"--mesh", "dp=2,tp=2", NULL, NULL},
                             {"--mesh", "dp_replicate=2,dp_shard=2", NULL, NULL},
                             {"--model", "gpt2-demo", "--mesh", "dp=2,tp=2"}};
  for (size_t m = 0; m < sizeof meshes / sizeof meshes[0]; m++) {
    double loss[2][STEPS];
    for (int k = 0; k < 2; k++) {
      const char *j = tmp_file("offload-bitwise.jsonl");
      const char *a[16] = {"--steps", "3", "--val-every", "0", "--device", "cuda", "--log-json", j};
      int n = 8;
      for (int i = 0; i < 4 && meshes[m][i]; i++) a[n++] = meshes[m][i];
      if (k) a[n++] = "--cpu-offload";
      a[n] = NULL;
      run_out r = run(4, TRAIN, a, 150);
      cr_assert_eq(r.rc, 0, "%s %s%s: %s", meshes[m][0], meshes[m][1], k ? " --cpu-offload" : "",
                   r.err);
      run_free(&r);
      cr_assert_eq(read_json_losses(j, loss[k], STEPS), STEPS);
      unlink(j);
    }
    for (int s = 0; s < STEPS; s++)
      cr_expect(loss[1][s] == loss[0][s],
                "%s %s %s, step %d: %.17g with --cpu-offload, %.17g without", meshes[m][0],
                meshes[m][1], meshes[m][2] ? meshes[m][3] : "", s + 1, loss[1][s], loss[0][s]);
  }
}
