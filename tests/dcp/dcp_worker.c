/* tests/dcp/dcp_worker.c — the MPI side of the dcp suite (test_dcp.c starts
 * each case through mpiexec). Every case checks on every rank against an
 * independent reference:
 * - plain DTensors: values are Normal(seed, key = name) by global index
 *   (weft_dtensor_fill_normal), so the reference is a full tensor filled
 *   with weft_tensor_fill_normal; integer tensors get a hash of the global
 *   index; loads compare weft_dtensor_full_tensor bitwise with it;
 * - models: the saving run writes the full state (gathered) to a
 *   safetensors file with the independent safetensors writer; loads compare
 *   each parameter's and optimizer state's full tensor bitwise with it.
 * Arguments: argv[2..] are directories/files made by the Criterion test.
 *
 * Device mode: with WEFT_TEST_DEVICE=cuda (test_dcp's *_on_device tests)
 * every root mesh a case makes, the 1-rank MPI_COMM_SELF meshes included,
 * is put on WEFT_CUDA as it is made (on_dev), so DTensors, models and
 * optimizer state live there and DCP stages them through the host; the
 * worker reads numbers only through host copies (equal_host, get_host).
 * The cross-device case (xdev) chooses each mesh's device itself,
 * from its arguments, whatever the environment says. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <dirent.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dcp.h"
#include "safetensors.h"
#include "worker.h"
#ifdef DCP_TEST_HAVE_FSDP
#include "fsdp.h"
#endif
#ifdef DCP_TEST_HAVE_TP
#include "tp.h"
#endif
#ifdef DCP_TEST_HAVE_GPT2
#include "autograd.h"
#include "gpt2.h"
#endif

#define SEED 20240607u

static const char *arg(int i) {
  /* weft_test_mpiexec_env passes no arguments: the first comes in the
   * environment then */
  if (i == 2 && i >= weft_worker_argc && getenv("DCP_TEST_ARG")) return getenv("DCP_TEST_ARG");
  if (i >= weft_worker_argc) {
    fprintf(stderr, "worker: missing argument %d\n", i);
    exit(2);
  }
  return weft_worker_argv[i];
}

static bool rank0(void) { return weft_world_rank() == 0; }

/* ------------------------------------------------------ devices */

/* The device the xdev cases force on the next root meshes (they set it
 * before making each one); -1: the worker's mode decides (on_dev). */
static int forced_dev = -1;

/* Every root mesh passes through here as it is made: on WEFT_CUDA in
 * device mode (or on forced_dev), else left on the CPU. */
static weft_mesh *on_dev(weft_mesh *m) {
  if (!m || forced_dev < 0) return weft_worker_mesh_on_device(m);
  if (weft_mesh_device(m) != (weft_device)forced_dev) {
    weft_status st = weft_mesh_set_device(m, (weft_device)forced_dev);
    WCHECK(st == WEFT_OK, "mesh_set_device(%s): %s", weft_device_name((weft_device)forced_dev),
           weft_last_error());
  }
  WCHECK(weft_mesh_device(m) == (weft_device)forced_dev, "mesh on %s, want %s",
         weft_device_name(weft_mesh_device(m)), weft_device_name((weft_device)forced_dev));
  return m;
}

/* weft_tensor_get of t (on any device). NaN if it cannot be read. */
static double get_host(const weft_tensor *t, const int64_t *idx) {
  weft_tensor *tmp = NULL;
  const weft_tensor *h = weft_worker_host_copy(t, &tmp);
  double v = h ? weft_tensor_get(h, idx) : NAN;
  weft_tensor_destroy(tmp);
  return v;
}

static void barrier(void) { MPI_Barrier(MPI_COMM_WORLD); }

static char *path2(const char *a, const char *b) {
  size_t n = strlen(a) + strlen(b) + 2;
  char *p = malloc(n);
  if (!p) abort();
  snprintf(p, n, "%s/%s", a, b);
  return p;
}

/* Expects st to be `code` with every needle in the message. */
#define EXPECT_ERR(expr, code, ...)                                                               \
  do {                                                                                            \
    weft_status ee_st_ = (expr);                                                                  \
    const char *ee_needles_[] = {__VA_ARGS__, NULL};                                              \
    WCHECK(ee_st_ == (code), "%s -> %s (want %s): %s", #expr, weft_status_str(ee_st_),            \
           weft_status_str(code), weft_last_error());                                             \
    for (int ee_i_ = 0; ee_needles_[ee_i_]; ee_i_++)                                              \
      WCHECK(strstr(weft_last_error(), ee_needles_[ee_i_]) != NULL, "%s: message lacks '%s': %s", \
             #expr, ee_needles_[ee_i_], weft_last_error());                                       \
  } while (0)

/* ------------------------------------------------------------ meshes */

/* "1", "2", "4", "2x2", "2x2x2" -> a mesh with dims a, b, c. */
static weft_mesh *mesh_of(const char *spec, int *nd, int shape[3]) {
  *nd = 0;
  const char *p = spec;
  while (*p && *nd < 3) {
    shape[(*nd)++] = (int)strtol(p, (char **)&p, 10);
    if (*p == 'x') p++;
  }
  const char *names[3] = {"a", "b", "c"};
  weft_mesh *m = NULL;
  WOK(weft_mesh_create(*nd, shape, names, &m));
  return on_dev(m);
}

/* ------------------------------------------------------ plain tensors */

typedef struct tdesc {
  const char *name;
  weft_dtype dt;
  int ndim;
  int64_t shape[3];
} tdesc;

static const tdesc TD[] = {
    {"a", WEFT_F32, 2, {13, 7, 0}},
    {"b", WEFT_F32, 2, {9, 10, 0}},
    {"c", WEFT_F32, 1, {5, 0, 0}},
    {"d", WEFT_F32, 2, {16, 6, 0}},
    {"e", WEFT_BF16, 3, {11, 3, 4}},
    {"f", WEFT_F64, 0, {0, 0, 0}},
    {"g", WEFT_F32, 2, {0, 4, 0}},
    {"h", WEFT_I32, 2, {7, 5, 0}},
    {"layers.0.attention.wq.weight", WEFT_F32, 2, {12, 8, 0}},
};
#define NTD ((int)(sizeof TD / sizeof TD[0]))

/* Placements per mesh, as text (weft_placements_parse). */
static const char *PL_SAVE[NTD] = {"S(0),S(1)", "R,S(0)", "R,R",    "SS(0,2),S(0)", "S(1),S(2)",
                                   "R,R",       "S(0),R", "S(0),R", "S(1),S(0)"};
static const char *PL_1[NTD] = {"R", "R", "R", "R", "R", "R", "R", "R", "R"};
static const char *PL_2[NTD] = {"S(1)", "S(0)", "R",    "S(0)",   "S(0)",
                                "R",    "S(1)", "S(1)", "SS(0,3)"};
static const char *PL_4[NTD] = {"S(0)", "S(1)", "S(0)", "SS(0,2)", "S(2)",
                                "R",    "S(0)", "S(0)", "S(1)"};
static const char *PL_22[NTD] = {"S(1),S(0)", "S(0),S(0)", "S(0),R", "SS(0,2),S(0)", "R,S(0)",
                                 "R,R",       "S(1),S(0)", "R,S(1)", "SS(0,2),S(1)"};
static const char *PL_222[NTD] = {"S(0),S(1),S(0)",    "R,S(1),S(0)", "S(0),S(0),S(0)",
                                  "SS(0,4),S(0),S(0)", "S(1),R,S(2)", "R,R,R",
                                  "R,R,S(0)",          "S(1),S(0),R", "S(0),SS(1,2),S(1)"};

static const char **placements_for(const char *mesh) {
  if (!strcmp(mesh, "1")) return PL_1;
  if (!strcmp(mesh, "2")) return PL_2;
  if (!strcmp(mesh, "4")) return PL_4;
  if (!strcmp(mesh, "2x2")) return PL_22;
  if (!strcmp(mesh, "2x2x2")) return PL_222;
  return NULL;
}

/* The reference full tensor of TD[i] (salt changes the values). */
static weft_tensor *reference(int i, uint64_t salt) {
  weft_tensor *t = NULL;
  WOK(weft_tensor_create(TD[i].dt, WEFT_CPU, TD[i].ndim, TD[i].shape, &t));
  if (!t) return NULL;
  uint64_t key = weft_rng_key(TD[i].name) ^ salt;
  if (weft_dtype_is_float(TD[i].dt)) {
    WOK(weft_tensor_fill_normal(t, SEED, key, NULL, 0.0f, 1.0f));
  } else {
    int32_t *p = t->data;
    for (int64_t e = 0; e < weft_tensor_numel(t); e++)
      p[e] = (int32_t)weft_test_mix64(key + (uint64_t)e);
  }
  return t;
}

/* TD[i] as a DTensor on mesh with placements text. */
static weft_dtensor *make_dt(weft_mesh *mesh, int i, const char *pl, uint64_t salt) {
  weft_placement p[3];
  int n = 0;
  WOK(weft_placements_parse(pl, p, 3, &n));
  weft_dtensor *dt = NULL;
  if (weft_dtype_is_float(TD[i].dt)) {
    WOK(weft_dtensor_empty(mesh, TD[i].dt, TD[i].ndim, TD[i].shape, p, n, &dt));
    if (dt) WOK(weft_dtensor_fill_normal(dt, SEED, weft_rng_key(TD[i].name) ^ salt, 0.0f, 1.0f));
  } else {
    weft_tensor *full = reference(i, salt);
    WOK(weft_dtensor_distribute(mesh, full, WEFT_DTENSOR_ALL_RANKS, p, n, &dt));
    weft_tensor_destroy(full);
  }
  return dt;
}

/* An empty (zeros-filled, other values) DTensor to load into. */
static weft_dtensor *make_target(weft_mesh *mesh, int i, const char *pl) {
  weft_placement p[3];
  int n = 0;
  WOK(weft_placements_parse(pl, p, 3, &n));
  weft_dtensor *dt = NULL;
  WOK(weft_dtensor_zeros(mesh, TD[i].dt, TD[i].ndim, TD[i].shape, p, n, &dt));
  return dt;
}

static void add_values(weft_state_dict *sd) {
  WOK(weft_state_dict_set_int(sd, "train.step", 123456789012345LL));
  WOK(weft_state_dict_set_double(sd, "train.lr", 0.1 + 1e-17));
  WOK(weft_state_dict_set_double(sd, "train.inf", -INFINITY));
  WOK(weft_state_dict_set_string(sd, "train.note", "caf\xc3\xa9 \"quoted\"\n"));
  WOK(weft_state_dict_set_json(sd, "data.loader", "{\"epoch\": 3, \"offset\": [1, 2, 3]}"));
  char per_rank[64];
  snprintf(per_rank, sizeof per_rank, "rng.rank%d", weft_world_rank());
  WOK(weft_state_dict_set_int(sd, per_rank, 1000 + weft_world_rank()));
  weft_llama_config cfg = WEFT_LLAMA_CONFIG_INIT;
  cfg.dim = 768;
  cfg.n_layers = 12;
  cfg.n_heads = 12;
  cfg.n_kv_heads = 4;
  cfg.ffn_dim = 2048;
  cfg.vocab = 8192;
  cfg.max_seq_len = 1024;
  WOK(weft_state_dict_set_llama_config(sd, "model.config", &cfg));
}

static void check_values(weft_state_dict *sd, int saved_world) {
  int64_t i = 0;
  double d = 0;
  const char *s = NULL;
  WOK(weft_state_dict_get_int(sd, "train.step", &i));
  WCHECK(i == 123456789012345LL, "train.step = %" PRId64, i);
  WOK(weft_state_dict_get_double(sd, "train.lr", &d));
  WCHECK(d == 0.1 + 1e-17, "train.lr = %.17g", d);
  WOK(weft_state_dict_get_double(sd, "train.inf", &d));
  WCHECK(isinf(d) && d < 0, "train.inf = %g", d);
  WOK(weft_state_dict_get_string(sd, "train.note", &s));
  WCHECK(s && strcmp(s, "caf\xc3\xa9 \"quoted\"\n") == 0, "train.note = %s", s ? s : "(null)");
  WOK(weft_state_dict_get_json(sd, "data.loader", &s));
  WCHECK(s && strcmp(s, "{\"epoch\":3,\"offset\":[1,2,3]}") == 0, "data.loader = %s",
         s ? s : "(null)");
  weft_llama_config cfg;
  WOK(weft_state_dict_get_llama_config(sd, "model.config", &cfg));
  WCHECK(cfg.dim == 768 && cfg.n_layers == 12 && cfg.n_kv_heads == 4 && cfg.vocab == 8192 &&
             cfg.norm_eps == 1e-5f && cfg.rope_theta == 10000.0 && cfg.init_std == 0.02f,
         "config round trip: dim %" PRId64 " eps %g", cfg.dim, (double)cfg.norm_eps);
  for (int r = 0; r < saved_world; r++) {
    char k[64];
    snprintf(k, sizeof k, "rng.rank%d", r);
    WOK(weft_state_dict_get_int(sd, k, &i));
    WCHECK(i == 1000 + r, "%s = %" PRId64, k, i);
  }
}

/* Loading targets for the values (other values, same types). */
static void add_value_targets(weft_state_dict *sd, int saved_world) {
  WOK(weft_state_dict_set_int(sd, "train.step", -1));
  WOK(weft_state_dict_set_double(sd, "train.lr", -1));
  WOK(weft_state_dict_set_double(sd, "train.inf", 0));
  WOK(weft_state_dict_set_string(sd, "train.note", ""));
  WOK(weft_state_dict_set_json(sd, "data.loader", "null"));
  WOK(weft_state_dict_set_json(sd, "model.config", "null"));
  for (int r = 0; r < saved_world; r++) {
    char k[64];
    snprintf(k, sizeof k, "rng.rank%d", r);
    WOK(weft_state_dict_set_int(sd, k, 0));
  }
}

/* ------------------------------------------------------ plain round trips */

static weft_state_dict *plain_sd(weft_mesh *mesh, const char **pl, uint64_t salt) {
  weft_state_dict *sd = NULL;
  WOK(weft_state_dict_create(&sd));
  for (int i = 0; i < NTD; i++) {
    weft_dtensor *dt = make_dt(mesh, i, pl[i], salt);
    WOK(weft_state_dict_add_dtensor(sd, TD[i].name, dt, WEFT_LOCAL_TAKE));
  }
  /* a plain tensor every rank holds (written once) */
  weft_tensor *p = reference(0, 99);
  WOK(weft_state_dict_add_tensor(sd, "plain", p, WEFT_LOCAL_TAKE));
  return sd;
}

static void case_rt_save(void) {
  int nd, shape[3];
  weft_mesh *mesh = mesh_of("2x2", &nd, shape);
  WREQUIRE(mesh, "mesh");
  weft_state_dict *sd = plain_sd(mesh, PL_SAVE, 0);
  add_values(sd);
  /* a strided (transposed) view: saved through the copy path */
  weft_tensor *base = reference(0, 98), *tv = NULL;
  WOK(weft_tensor_transpose(base, 0, 1, &tv));
  WOK(weft_state_dict_add_tensor(sd, "plain.t", tv, WEFT_LOCAL_VIEW));
  WOK(weft_dcp_save(sd, arg(2), NULL));
  weft_dcp_opts o = WEFT_DCP_OPTS_INIT;
  o.block_bytes = 64;
  WOK(weft_dcp_save(sd, arg(3), &o));
  barrier();
  /* who wrote what: every replicated box once, spread over ranks */
  if (rank0()) {
    weft_dcp_checkpoint *ck = NULL;
    WOK(weft_dcp_open(arg(2), &ck));
    WREQUIRE(ck, "open");
    weft_dcp_info info;
    WOK(weft_dcp_get_info(ck, &info));
    WCHECK(info.world_size == 4 && info.num_files == 4 && info.num_tensors == NTD + 2,
           "info: world %d files %d tensors %" PRId64, info.world_size, info.num_files,
           info.num_tensors);
    uint64_t bytes[4] = {0};
    int repl_writers = 0;
    for (int64_t t = 0; t < info.num_tensors; t++) {
      weft_dcp_tensor_info ti;
      WOK(weft_dcp_tensor_get(ck, t, &ti));
      for (int64_t c = 0; c < ti.num_chunks; c++) {
        weft_dcp_chunk_info ci;
        WOK(weft_dcp_chunk_get(ck, t, c, &ci));
        bytes[ci.rank] += ci.length;
        if (!strcmp(ti.name, "b") || !strcmp(ti.name, "c") || !strcmp(ti.name, "plain"))
          repl_writers |= 1 << ci.rank;
      }
      if (!strcmp(ti.name, "plain"))
        WCHECK(ti.num_chunks == 1 && !strcmp(ti.layout, "full"),
               "plain: %" PRId64 " chunks, layout %s", ti.num_chunks, ti.layout);
      if (!strcmp(ti.name, "b"))
        WCHECK(ti.num_chunks == 2 && strstr(ti.layout, "(R, S(0))"),
               "b: %" PRId64 " chunks, layout %s", ti.num_chunks, ti.layout);
      if (!strcmp(ti.name, "g"))
        WCHECK(ti.num_chunks == 0, "g is empty: %" PRId64 " chunks", ti.num_chunks);
      if (!strcmp(ti.name, "d"))
        WCHECK(ti.num_chunks == 4, "d (strided, one run per rank): %" PRId64 " chunks",
               ti.num_chunks);
    }
    int nw = __builtin_popcount((unsigned)repl_writers);
    WCHECK(nw >= 3, "replicated chunks are written by %d ranks only (mask %x)", nw, repl_writers);
    uint64_t mx = 0, mn = UINT64_MAX;
    for (int r = 0; r < 4; r++) {
      if (bytes[r] > mx) mx = bytes[r];
      if (bytes[r] < mn) mn = bytes[r];
    }
    printf("bytes per rank: %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", bytes[0], bytes[1],
           bytes[2], bytes[3]);
    WCHECK(mx - mn <= 2 * 10 * 9 * 4, "unbalanced: max %" PRIu64 " min %" PRIu64, mx, mn);
    int64_t bad = -1;
    WOK(weft_dcp_verify(ck, &bad, NULL, NULL));
    WCHECK(bad == 0, "verify: %" PRId64 " bad", bad);
    weft_dcp_close(ck);
  }
  weft_state_dict_destroy(sd);
  weft_tensor_destroy(tv);
  weft_tensor_destroy(base);
  WOK(weft_mesh_destroy(mesh));
}

static void check_loaded(weft_state_dict *sd, const char *what) {
  for (int i = 0; i < NTD; i++) {
    weft_sd_entry e;
    WOK(weft_state_dict_find(sd, TD[i].name, &e));
    weft_tensor *want = reference(i, 0), *got = NULL;
    if (e.kind == WEFT_SD_DTENSOR) WOK(weft_dtensor_full_tensor(e.dtensor, &got));
    bool eq = got && want && weft_worker_equal_on_host(got, want);
    WCHECK(eq, "%s: tensor '%s' differs after load", what, TD[i].name);
    if (e.kind == WEFT_SD_DTENSOR) weft_tensor_destroy(got);
    weft_tensor_destroy(want);
  }
  weft_sd_entry e;
  WOK(weft_state_dict_find(sd, "plain", &e));
  weft_tensor *want = reference(0, 99);
  WCHECK(e.kind == WEFT_SD_TENSOR && weft_worker_equal_on_host(e.tensor, want), "%s: plain differs",
         what);
  weft_tensor_destroy(want);
}

/* Loads the plain checkpoints saved by rt_save onto mesh argv[4]. */
static void rt_load(const char *mesh_spec) {
  const char **pl = placements_for(mesh_spec);
  WREQUIRE(pl, "unknown mesh %s", mesh_spec);
  int nd, shape[3];
  weft_mesh *mesh = mesh_of(mesh_spec, &nd, shape);
  WREQUIRE(mesh, "mesh");
  for (int pass = 0; pass < 2; pass++) {
    const char *dir = arg(2 + pass);
    weft_state_dict *sd = NULL;
    WOK(weft_state_dict_create(&sd));
    for (int i = 0; i < NTD; i++)
      WOK(weft_state_dict_add_dtensor(sd, TD[i].name, make_target(mesh, i, pl[i]),
                                      WEFT_LOCAL_TAKE));
    weft_tensor *p = NULL;
    int64_t sh[2] = {13, 7};
    WOK(weft_tensor_zeros(WEFT_F32, WEFT_CPU, 2, sh, &p));
    WOK(weft_state_dict_add_tensor(sd, "plain", p, WEFT_LOCAL_TAKE));
    /* into a transposed view: the element-strided read path */
    weft_tensor *tbuf = NULL, *tview = NULL;
    WOK(weft_tensor_zeros(WEFT_F32, WEFT_CPU, 2, sh, &tbuf));
    WOK(weft_tensor_transpose(tbuf, 0, 1, &tview));
    WOK(weft_state_dict_add_tensor(sd, "plain.t", tview, WEFT_LOCAL_TAKE));
    add_value_targets(sd, 4);
    weft_key_list miss = {0};
    WOK(weft_dcp_load(sd, dir, NULL, &miss));
    weft_tensor *want_t = reference(0, 98);
    WCHECK(weft_worker_equal_on_host(tbuf, want_t), "transposed view target differs after load");
    weft_tensor_destroy(want_t);
    WCHECK(miss.count == 0, "missing %" PRId64, miss.count);
    weft_key_list_clear(&miss);
    char what[64];
    snprintf(what, sizeof what, "mesh %s block %s", mesh_spec, pass ? "64" : "1M");
    check_loaded(sd, what);
    check_values(sd, 4);
    if (pass == 0 && strcmp(mesh_spec, "1") != 0) {
      /* save again from this layout (multi-run strided shards, other
       * replicas) and load that into fully replicated targets */
      WOK(weft_state_dict_remove(sd, "plain.t"));
      char re[600];
      snprintf(re, sizeof re, "%s.re.%s", dir, mesh_spec);
      weft_dcp_opts o = WEFT_DCP_OPTS_INIT;
      o.block_bytes = 128;
      WOK(weft_dcp_save(sd, re, &o));
      weft_state_dict *rsd = NULL;
      WOK(weft_state_dict_create(&rsd));
      const char *rep = nd == 1 ? "R" : nd == 2 ? "R,R" : "R,R,R";
      for (int i = 0; i < NTD; i++)
        WOK(weft_state_dict_add_dtensor(rsd, TD[i].name, make_target(mesh, i, rep),
                                        WEFT_LOCAL_TAKE));
      weft_tensor *p2 = NULL;
      WOK(weft_tensor_zeros(WEFT_F32, WEFT_CPU, 2, sh, &p2));
      WOK(weft_state_dict_add_tensor(rsd, "plain", p2, WEFT_LOCAL_TAKE));
      WOK(weft_dcp_load(rsd, re, NULL, NULL));
      snprintf(what, sizeof what, "re-saved from mesh %s", mesh_spec);
      check_loaded(rsd, what);
      weft_state_dict_destroy(rsd);
    }
    weft_state_dict_destroy(sd);
    weft_tensor_destroy(tbuf);
  }
  /* partial load: keys the checkpoint lacks are reported, others loaded */
  {
    weft_state_dict *sd = NULL;
    WOK(weft_state_dict_create(&sd));
    weft_dtensor *a = make_target(mesh, 0, pl[0]);
    WOK(weft_state_dict_add_dtensor(sd, "a", a, WEFT_LOCAL_TAKE));
    weft_dtensor *z = make_target(mesh, 1, pl[1]);
    WOK(weft_state_dict_add_dtensor(sd, "not.saved", z, WEFT_LOCAL_TAKE));
    WOK(weft_state_dict_set_int(sd, "also.missing", 5));
    EXPECT_ERR(weft_dcp_load(sd, arg(2), NULL, NULL), WEFT_ERR_NOT_FOUND, "not.saved",
               "allow_partial");
    weft_dcp_opts o = WEFT_DCP_OPTS_INIT;
    o.allow_partial = true;
    weft_key_list miss = {0};
    WOK(weft_dcp_load(sd, arg(2), &o, &miss));
    WCHECK(miss.count == 2 && !strcmp(miss.keys[0], "not.saved") &&
               !strcmp(miss.keys[1], "also.missing"),
           "partial: %" PRId64 " missing", miss.count);
    weft_key_list_clear(&miss);
    weft_tensor *got = NULL, *want = reference(0, 0);
    WOK(weft_dtensor_full_tensor(a, &got));
    WCHECK(got && weft_worker_equal_on_host(got, want), "partial: 'a' not loaded");
    weft_tensor_destroy(got);
    weft_tensor_destroy(want);
    weft_state_dict_destroy(sd);
  }
  WOK(weft_mesh_destroy(mesh));
}

/* ------------------------------------------------------ models */

#if defined(DCP_TEST_HAVE_FSDP) && defined(DCP_TEST_HAVE_TP)
#define HAVE_MODELS 1

static weft_llama_config tiny_cfg(void) {
  weft_llama_config c = WEFT_LLAMA_CONFIG_INIT;
  c.dim = 16;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_dim = 24;
  c.vocab = 34;
  c.max_seq_len = 8;
  return c;
}

/* A model on one of the layouts: "1" (one rank), "tp2", "fsdp4",
 * "2x2" (fsdp 2 x tp 2), "2x2x2" (hsdp 2 x 2 x tp 2). */
typedef struct lmodel {
  weft_mesh *root, *dp, *mm;
  bool own_mm;
  int dp_total, dp_index;
  weft_module *m;
  weft_tp *tp;
  weft_optimizer *opt;
} lmodel;

static weft_module *find(weft_module *m, const char *fqn) {
  weft_module *r = NULL;
  WOK(weft_module_find(m, fqn, &r));
  return r;
}

static bool lmodel_make(lmodel *L, const char *layout, uint64_t seed) {
  memset(L, 0, sizeof *L);
  weft_llama_config cfg = tiny_cfg();
  int shape[3], nd = 0, ndp = 0;
  const char *names[3];
  bool tp = false, fsdp = false;
  if (!strcmp(layout, "1")) {
    shape[nd] = 1;
    names[nd++] = "tp";
  } else if (!strcmp(layout, "tp2")) {
    shape[nd] = 2;
    names[nd++] = "tp";
    tp = true;
  } else if (!strncmp(layout, "fsdp", 4)) {
    shape[nd] = atoi(layout + 4);
    names[nd++] = "dp";
    ndp = 1;
    fsdp = true;
  } else if (!strcmp(layout, "2x2")) {
    shape[0] = 2;
    shape[1] = 2;
    names[0] = "dp";
    names[1] = "tp";
    nd = 2;
    ndp = 1;
    fsdp = tp = true;
  } else if (!strcmp(layout, "2x2x2")) {
    shape[0] = shape[1] = shape[2] = 2;
    names[0] = "replicate";
    names[1] = "shard";
    names[2] = "tp";
    nd = 3;
    ndp = 2;
    fsdp = tp = true;
  } else {
    WCHECK(false, "unknown layout %s", layout);
    return false;
  }
  WOK(weft_mesh_create(nd, shape, names, &L->root));
  if (!L->root) return false;
  on_dev(L->root);
  if (fsdp) {
    WOK(weft_mesh_submesh(L->root, ndp, names, &L->dp));
    L->dp_total = 1;
    for (int d = 0; d < ndp; d++) L->dp_total *= shape[d];
    L->dp_index = 0;
    for (int d = 0; d < ndp; d++) L->dp_index = L->dp_index * shape[d] + weft_mesh_coord(L->dp, d);
  } else {
    L->dp_total = 1;
  }
  if (tp || !fsdp) {
    WOK(weft_mesh_submesh(L->root, 1, &names[nd - 1], &L->mm));
  } else {
    int one = 1;
    const char *n1[1] = {"tp"};
    WOK(weft_mesh_create_from_comm(MPI_COMM_SELF, 1, &one, n1, &L->mm));
    on_dev(L->mm);
    L->own_mm = true;
  }
  WOK(weft_llama_create(&cfg, L->mm, &L->m));
  if (!L->m) return false;
  if (tp) WOK(weft_tp_apply_llama_plan(L->m, L->mm, true, true, &L->tp));
  if (fsdp) {
    for (int i = 0; i < cfg.n_layers; i++) {
      char nm[32];
      snprintf(nm, sizeof nm, "layers.%d", i);
      WOK(weft_fully_shard(find(L->m, nm), L->dp, NULL, NULL));
    }
    weft_module *last[2] = {find(L->m, "norm"), find(L->m, "output")};
    WOK(weft_fully_shard_modules(last, 2, L->dp, NULL, NULL));
    WOK(weft_fully_shard(L->m, L->dp, NULL, NULL));
  }
  WOK(weft_module_init_weights(L->m, seed));
  weft_adamw_params hp = WEFT_ADAMW_DEFAULT;
  hp.lr = 1e-2f;
  hp.weight_decay = 0.1f;
  WOK(weft_adamw_create(L->m, &hp, &L->opt));
  if (!L->opt) return false;
  /* a schedule, so that resuming must restore the optimizer's step count */
  weft_lr_schedule sch = {1e-2f, 1e-3f, 1, 4};
  WOK(weft_optimizer_set_schedule(L->opt, &sch));
  return true;
}

static void lmodel_free(lmodel *L) {
  weft_optimizer_destroy(L->opt);
  if (L->m) WOK(weft_fsdp_destroy_all(L->m));
  weft_tp_destroy(L->tp);
  WOK(weft_module_destroy(L->m));
  WOK(weft_mesh_destroy(L->mm));
  WOK(weft_mesh_destroy(L->dp));
  WOK(weft_mesh_destroy(L->root));
  memset(L, 0, sizeof *L);
}

/* One training step on this dp rank's rows of the batch of `step`. */
static double train_step(lmodel *L, int step) {
  const int B = 4, T = 8, rows = B / L->dp_total, row0 = L->dp_index * rows;
  weft_llama_config c = tiny_cfg();
  int64_t shape[2] = {rows, T};
  weft_tensor *tok = NULL, *tgt = NULL;
  WOK(weft_tensor_create(WEFT_I32, WEFT_CPU, 2, shape, &tok));
  WOK(weft_tensor_create(WEFT_I32, WEFT_CPU, 2, shape, &tgt));
  if (!tok || !tgt) return NAN;
  int32_t *a = tok->data, *b = tgt->data;
  for (int r = 0; r < rows; r++)
    for (int t = 0; t < T; t++) {
      uint64_t k = (uint64_t)step * 7919u + (uint64_t)(row0 + r) * 131u + (uint64_t)t;
      a[r * T + t] = (int32_t)(weft_test_mix64(k) % (uint64_t)c.vocab);
      b[r * T + t] = (int32_t)(weft_test_mix64(k ^ 0x5555u) % (uint64_t)c.vocab);
    }
  double loss = NAN, norm = 0;
  WOK(weft_llama_forward(L->m, tok, tgt, &loss));
  WOK(weft_llama_backward(L->m));
  WOK(weft_clip_grad_norm(L->m, 1.0, &norm));
  WOK(weft_optimizer_step(L->opt));
  WOK(weft_module_zero_grad(L->m, false));
  weft_tensor_destroy(tok);
  weft_tensor_destroy(tgt);
  return loss;
}

static weft_state_dict *full_sd(lmodel *L, const weft_state_dict_opts *o) {
  weft_state_dict *sd = NULL;
  WOK(weft_state_dict_create(&sd));
  WOK(weft_get_model_state_dict(L->m, o, sd));
  WOK(weft_get_optimizer_state_dict(L->m, L->opt, o, sd));
  return sd;
}

/* Writes every tensor entry of a (full, plain) state dict to safetensors. */
static void write_ref(weft_state_dict *sd, const char *path) {
  int64_t n = weft_state_dict_count(sd), k = 0;
  weft_safetensors_entry *e = calloc((size_t)n + 1, sizeof *e);
  for (int64_t i = 0; i < n; i++) {
    weft_sd_entry en;
    WOK(weft_state_dict_get(sd, i, &en));
    if (en.kind != WEFT_SD_TENSOR) continue;
    e[k].name = en.name;
    e[k].dtype = en.tensor->dtype;
    e[k].ndim = en.tensor->ndim;
    e[k].shape = en.tensor->shape;
    e[k].data = en.tensor->data;
    k++;
  }
  WOK(weft_safetensors_write(path, e, k, NULL));
  free(e);
}

/* Compares every tensor of sd (views into model/optimizer) with ref. */
static void compare_ref(weft_state_dict *sd, const char *ref, const char *what) {
  weft_safetensors *f = NULL;
  WOK(weft_safetensors_open(ref, &f));
  WREQUIRE(f, "open ref");
  int64_t n = weft_state_dict_count(sd), nt = 0;
  for (int64_t i = 0; i < n; i++) {
    weft_sd_entry en;
    WOK(weft_state_dict_get(sd, i, &en));
    if (en.kind != WEFT_SD_DTENSOR) continue;
    nt++;
    weft_tensor *got = NULL, *want = NULL;
    WOK(weft_dtensor_full_tensor(en.dtensor, &got));
    if (!got) continue;
    WOK(weft_tensor_create(got->dtype, WEFT_CPU, got->ndim, got->shape, &want));
    WOK(weft_safetensors_read_tensor(f, en.name, want));
    WCHECK(want && weft_worker_equal_on_host(got, want), "%s: '%s' differs from the saved state",
           what, en.name);
    weft_tensor_destroy(got);
    weft_tensor_destroy(want);
  }
  WCHECK(nt == weft_safetensors_count(f), "%s: %" PRId64 " tensors vs %" PRId64 " saved", what, nt,
         weft_safetensors_count(f));
  weft_safetensors_close(f);
}

/* FSDP 2 x TP 2: train 2 steps, save (sharded) and the reference. */
static void model_save(const char *dir, const char *ref) {
  lmodel L;
  WREQUIRE(lmodel_make(&L, "2x2", SEED), "model");
  for (int s = 0; s < 2; s++) train_step(&L, s);
  weft_state_dict *sd = full_sd(&L, NULL);
  WOK(weft_state_dict_set_int(sd, "train.step", 2));
  WOK(weft_dcp_save(sd, dir, NULL));
  weft_state_dict_opts o = WEFT_STATE_DICT_OPTS_INIT;
  o.full_state_dict = true;
  o.cpu_offload = true;
  weft_state_dict *full = full_sd(&L, &o);
  if (rank0()) write_ref(full, ref);
  /* cpu_offload: only rank 0 holds tensors */
  int64_t ntensors = 0;
  for (int64_t i = 0; i < weft_state_dict_count(full); i++) {
    weft_sd_entry en;
    WOK(weft_state_dict_get(full, i, &en));
    ntensors += en.kind == WEFT_SD_TENSOR;
  }
  WCHECK(rank0() ? ntensors > 30 : ntensors == 0, "cpu_offload: %" PRId64 " tensors on rank %d",
         ntensors, weft_world_rank());
  weft_state_dict_destroy(full);
  weft_state_dict_destroy(sd);
  lmodel_free(&L);
  barrier();
}

static void model_load(const char *layout, const char *dir, const char *ref) {
  lmodel L;
  WREQUIRE(lmodel_make(&L, layout, SEED + 17), "model");
  weft_state_dict *sd = full_sd(&L, NULL);
  WOK(weft_state_dict_set_int(sd, "train.step", 0));
  WOK(weft_dcp_load(sd, dir, NULL, NULL));
  int64_t step = -1;
  WOK(weft_state_dict_get_int(sd, "train.step", &step));
  WCHECK(step == 2, "train.step %" PRId64, step);
  /* the state dict's values were loaded; set them into the optimizer */
  WOK(weft_set_optimizer_state_dict(L.m, L.opt, sd, NULL, NULL, NULL));
  int64_t ps = -1;
  WOK(weft_optimizer_get_param_step(L.opt, "layers.1.feed_forward.w2.weight", &ps));
  WCHECK(ps == 2, "param step %" PRId64, ps);
  double lr = -1;
  WOK(weft_state_dict_get_double(sd, "param_groups.output.weight.lr", &lr));
  WCHECK(lr > 0 && weft_optimizer_get_lr(L.opt) == (float)lr, "lr %g vs saved %g",
         (double)weft_optimizer_get_lr(L.opt), lr);
  WCHECK(weft_optimizer_num_steps(L.opt) == 2, "num_steps %" PRId64,
         weft_optimizer_num_steps(L.opt));
  char what[64];
  snprintf(what, sizeof what, "model on %s", layout);
  compare_ref(sd, ref, what);
  weft_state_dict_destroy(sd);
  lmodel_free(&L);
}

/* N steps straight == k steps + save + load (fresh model) + N - k steps. */
static void case_resume(void) {
  const char *dir = arg(2);
  const int N = 4, K = 2;
  double straight[4];
  weft_tensor *final[64] = {0};
  int np = 0;
  {
    lmodel L;
    WREQUIRE(lmodel_make(&L, "2x2", SEED), "model");
    for (int s = 0; s < N; s++) straight[s] = train_step(&L, s);
    weft_param *ps[64];
    WOK(weft_module_parameters(L.m, ps, 64, &np));
    for (int i = 0; i < np; i++) WOK(weft_dtensor_full_tensor(ps[i]->data, &final[i]));
    lmodel_free(&L);
  }
  {
    lmodel L;
    WREQUIRE(lmodel_make(&L, "2x2", SEED), "model");
    for (int s = 0; s < K; s++) {
      double l = train_step(&L, s);
      WCHECK(l == straight[s], "step %d: loss %.17g vs %.17g before saving", s, l, straight[s]);
    }
    weft_state_dict *sd = full_sd(&L, NULL);
    WOK(weft_state_dict_set_int(sd, "train.step", K));
    WOK(weft_dcp_save(sd, dir, NULL));
    weft_state_dict_destroy(sd);
    lmodel_free(&L);
  }
  {
    lmodel L;
    WREQUIRE(lmodel_make(&L, "2x2", SEED + 1), "model"); /* other init: load must overwrite */
    weft_state_dict *sd = full_sd(&L, NULL);
    WOK(weft_state_dict_set_int(sd, "train.step", 0));
    WOK(weft_dcp_load(sd, dir, NULL, NULL));
    WOK(weft_set_optimizer_state_dict(L.m, L.opt, sd, NULL, NULL, NULL));
    int64_t k = 0;
    WOK(weft_state_dict_get_int(sd, "train.step", &k));
    WCHECK(k == K, "resumed at %" PRId64, k);
    weft_state_dict_destroy(sd);
    for (int s = (int)k; s < N; s++) {
      double l = train_step(&L, s);
      WCHECK(l == straight[s], "step %d: resumed loss %.17g vs straight %.17g", s, l, straight[s]);
    }
    weft_param *ps[64];
    int n2 = 0;
    WOK(weft_module_parameters(L.m, ps, 64, &n2));
    WCHECK(n2 == np, "params %d vs %d", n2, np);
    for (int i = 0; i < np && i < n2; i++) {
      weft_tensor *got = NULL;
      WOK(weft_dtensor_full_tensor(ps[i]->data, &got));
      WCHECK(got && weft_worker_equal_on_host(got, final[i]), "final '%s' differs after resume",
             ps[i]->fqn);
      weft_tensor_destroy(got);
    }
    lmodel_free(&L);
  }
  for (int i = 0; i < np; i++) weft_tensor_destroy(final[i]);
}

/* full_state_dict, cpu_offload, broadcast_from_rank0, strict. */
static void case_sd_opts(void) {
  lmodel A, B;
  WREQUIRE(lmodel_make(&A, "2x2", SEED), "model A");
  train_step(&A, 0);
  /* full_state_dict: plain tensors equal full_tensor of the views */
  weft_state_dict_opts fo = WEFT_STATE_DICT_OPTS_INIT;
  fo.full_state_dict = true;
  weft_state_dict *full = full_sd(&A, &fo), *views = full_sd(&A, NULL);
  WCHECK(weft_state_dict_count(full) == weft_state_dict_count(views),
         "counts %" PRId64 " vs %" PRId64, weft_state_dict_count(full),
         weft_state_dict_count(views));
  for (int64_t i = 0; i < weft_state_dict_count(views); i++) {
    weft_sd_entry v, f;
    WOK(weft_state_dict_get(views, i, &v));
    if (v.kind != WEFT_SD_DTENSOR) continue;
    WOK(weft_state_dict_find(full, v.name, &f));
    weft_tensor *g = NULL;
    WOK(weft_dtensor_full_tensor(v.dtensor, &g));
    WCHECK(f.kind == WEFT_SD_TENSOR && g && weft_worker_equal_on_host(g, f.tensor), "full '%s'",
           v.name);
    weft_tensor_destroy(g);
  }
  /* broadcast_from_rank0 into a model sharded differently (fsdp over 4):
   * rank 0 passes the full state, the others an empty dict */
  WREQUIRE(lmodel_make(&B, "fsdp4", SEED + 5), "model B");
  fo.cpu_offload = true;
  weft_state_dict *r0 = full_sd(&A, &fo), *empty = NULL;
  WOK(weft_state_dict_create(&empty));
  weft_state_dict_opts bo = WEFT_STATE_DICT_OPTS_INIT;
  bo.broadcast_from_rank0 = true;
  weft_key_list miss = {0}, unexp = {0};
  WOK(weft_set_model_state_dict(B.m, rank0() ? r0 : empty, &bo, &miss, &unexp));
  WCHECK(miss.count == 0 && unexp.count == 0,
         "bcast model: %" PRId64 " missing %" PRId64 " unexpected", miss.count, unexp.count);
  weft_key_list_clear(&miss);
  weft_key_list_clear(&unexp);
  WOK(weft_set_optimizer_state_dict(B.m, B.opt, rank0() ? r0 : empty, &bo, NULL, NULL));
  weft_state_dict *bviews = full_sd(&B, NULL);
  for (int64_t i = 0; i < weft_state_dict_count(views); i++) {
    weft_sd_entry v, w;
    WOK(weft_state_dict_get(views, i, &v));
    if (v.kind != WEFT_SD_DTENSOR) continue;
    WOK(weft_state_dict_find(bviews, v.name, &w));
    weft_tensor *g = NULL, *h = NULL;
    WOK(weft_dtensor_full_tensor(v.dtensor, &g));
    WOK(weft_dtensor_full_tensor(w.dtensor, &h));
    WCHECK(g && h && weft_worker_equal_on_host(g, h), "broadcast_from_rank0: '%s' differs", v.name);
    weft_tensor_destroy(g);
    weft_tensor_destroy(h);
  }
  int64_t st1 = -1;
  WOK(weft_optimizer_get_param_step(B.opt, "output.weight", &st1));
  WCHECK(st1 == 1, "broadcast step %" PRId64, st1);
  /* a full, cpu_offload state dict (tensors on rank 0 only) saves through
   * DCP (rank 0 writes every chunk) and loads into another sharding */
  {
    char *dir = path2(arg(2), "offload");
    WOK(weft_dcp_save(r0, dir, NULL));
    lmodel C;
    WREQUIRE(lmodel_make(&C, "fsdp4", SEED + 9), "model C");
    weft_state_dict *cv = full_sd(&C, NULL);
    WOK(weft_dcp_load(cv, dir, NULL, NULL));
    for (int64_t i = 0; i < weft_state_dict_count(views); i++) {
      weft_sd_entry v, w;
      WOK(weft_state_dict_get(views, i, &v));
      if (v.kind != WEFT_SD_DTENSOR) continue;
      WOK(weft_state_dict_find(cv, v.name, &w));
      weft_tensor *g = NULL, *h = NULL;
      WOK(weft_dtensor_full_tensor(v.dtensor, &g));
      WOK(weft_dtensor_full_tensor(w.dtensor, &h));
      WCHECK(g && h && weft_worker_equal_on_host(g, h), "offloaded save -> load: '%s' differs",
             v.name);
      weft_tensor_destroy(g);
      weft_tensor_destroy(h);
    }
    if (rank0()) {
      weft_dcp_checkpoint *ck = NULL;
      WOK(weft_dcp_open(dir, &ck));
      weft_dcp_tensor_info ti;
      WOK(weft_dcp_tensor_find(ck, "layers.0.attention.wq.weight", &ti));
      weft_dcp_chunk_info ci;
      WOK(weft_dcp_chunk_get(ck, 0, 0, &ci));
      WCHECK(ci.rank == 0 && !strcmp(ti.layout, "full"), "offloaded: chunk by rank %d, layout %s",
             ci.rank, ti.layout);
      weft_dcp_close(ck);
    }
    weft_state_dict_destroy(cv);
    lmodel_free(&C);
    free(dir);
  }
  /* set from views of another mesh (A's DTensors on 2x2 into B on fsdp4:
   * gathered and sliced) and from a plain full state dict, locally */
  WOK(weft_set_model_state_dict(B.m, views, NULL, NULL, NULL));
  WOK(weft_set_model_state_dict(B.m, full, NULL, NULL, NULL));
  /* strict: a missing and an unexpected key */
  weft_state_dict *bad = NULL;
  WOK(weft_state_dict_create(&bad));
  weft_sd_entry e;
  WOK(weft_state_dict_find(full, "norm.weight", &e));
  WOK(weft_state_dict_add_tensor(bad, "norm.weight", e.tensor, WEFT_LOCAL_VIEW));
  WOK(weft_state_dict_add_tensor(bad, "nonsense.weight", e.tensor, WEFT_LOCAL_VIEW));
  EXPECT_ERR(weft_set_model_state_dict(B.m, bad, NULL, NULL, NULL), WEFT_ERR_NOT_FOUND,
             "missing key");
  weft_state_dict_opts ns = WEFT_STATE_DICT_OPTS_INIT;
  ns.strict = false;
  WOK(weft_set_model_state_dict(B.m, bad, &ns, &miss, &unexp));
  WCHECK(unexp.count == 1 && !strcmp(unexp.keys[0], "nonsense.weight"), "unexpected %" PRId64,
         unexp.count);
  WCHECK(miss.count > 10, "missing %" PRId64, miss.count);
  weft_key_list_clear(&miss);
  weft_key_list_clear(&unexp);
  /* wrong shape: an error before anything is written */
  weft_tensor *wrong = NULL;
  int64_t sh[1] = {17};
  WOK(weft_tensor_zeros(WEFT_F32, WEFT_CPU, 1, sh, &wrong));
  WOK(weft_state_dict_remove(bad, "norm.weight"));
  WOK(weft_state_dict_add_tensor(bad, "norm.weight", wrong, WEFT_LOCAL_TAKE));
  EXPECT_ERR(weft_set_model_state_dict(B.m, bad, &ns, NULL, NULL), WEFT_ERR_INVALID, "norm.weight",
             "[0:17]", "[0:16]");
  /* broadcast with a bad rank-0 dict: every rank fails, nobody hangs */
  EXPECT_ERR(weft_set_model_state_dict(B.m, rank0() ? bad : empty, &bo, NULL, NULL),
             WEFT_ERR_NOT_FOUND, "missing key");
  EXPECT_ERR(weft_set_model_state_dict(B.m, rank0() ? views : empty, &bo, NULL, NULL),
             WEFT_ERR_INVALID, "DTensor");
  weft_state_dict_destroy(bad);
  weft_state_dict_destroy(bviews);
  weft_state_dict_destroy(r0);
  weft_state_dict_destroy(empty);
  weft_state_dict_destroy(full);
  weft_state_dict_destroy(views);
  lmodel_free(&B);
  lmodel_free(&A);
}

/* safetensors export (f32, bf16) with a raw reference for Python, and
 * import into other shardings. argv: dir (outputs). */
static void case_st_export(void) {
  const char *dir = arg(2);
  lmodel L;
  WREQUIRE(lmodel_make(&L, "tp2", SEED), "model");
  char *f32 = path2(dir, "model.f32.safetensors"), *bf16 = path2(dir, "model.bf16.safetensors");
  WOK(weft_safetensors_export_model(L.m, f32, WEFT_F32));
  WOK(weft_safetensors_export_model(L.m, bf16, WEFT_BF16));
  EXPECT_ERR(weft_safetensors_export_model(L.m, f32, WEFT_I32), WEFT_ERR_INVALID, "floating");
  /* raw reference: name, shape and f32 data of every parameter */
  weft_param *ps[64];
  int np = 0;
  WOK(weft_module_parameters(L.m, ps, 64, &np));
  char *ref = path2(dir, "ref.bin"), *idx = path2(dir, "ref.json");
  FILE *fb = rank0() ? fopen(ref, "wb") : NULL;
  cJSON *index = cJSON_CreateArray();
  for (int i = 0; i < np; i++) {
    weft_tensor *full = NULL, *fh = NULL;
    WOK(weft_dtensor_full_tensor(ps[i]->data, &full));
    const weft_tensor *hf = fb ? weft_worker_host_copy(full, &fh) : NULL;
    if (hf) {
      fwrite(hf->data, 4, (size_t)weft_tensor_numel(full), fb);
      cJSON *o = cJSON_CreateObject();
      cJSON_AddStringToObject(o, "name", ps[i]->fqn);
      cJSON *sh = cJSON_AddArrayToObject(o, "shape");
      for (int d = 0; d < full->ndim; d++)
        cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)full->shape[d]));
      cJSON_AddItemToArray(index, o);
    }
    weft_tensor_destroy(fh);
    weft_tensor_destroy(full);
  }
  if (fb) {
    fclose(fb);
    char *txt = cJSON_Print(index);
    FILE *fi = fopen(idx, "w");
    fputs(txt, fi);
    fclose(fi);
    free(txt);
  }
  cJSON_Delete(index);
  barrier();
  /* import into a model sharded another way (fsdp over the 2 ranks) */
  lmodel B;
  WREQUIRE(lmodel_make(&B, "fsdp2", SEED + 3), "model B");
  weft_key_list miss = {0}, unexp = {0};
  WOK(weft_safetensors_import_model(B.m, f32, NULL, &miss, &unexp));
  weft_param *qs[64];
  int nq = 0;
  WOK(weft_module_parameters(B.m, qs, 64, &nq));
  for (int i = 0; i < np && i < nq; i++) {
    weft_tensor *a = NULL, *b = NULL;
    WOK(weft_dtensor_full_tensor(ps[i]->data, &a));
    WOK(weft_dtensor_full_tensor(qs[i]->data, &b));
    WCHECK(a && b && weft_worker_equal_on_host(a, b), "import f32: '%s' differs", ps[i]->fqn);
    weft_tensor_destroy(a);
    weft_tensor_destroy(b);
  }
  /* bf16 import: equal to the bf16-rounded values */
  WOK(weft_safetensors_import_model(B.m, bf16, NULL, NULL, NULL));
  for (int i = 0; i < np && i < nq; i++) {
    weft_tensor *a = NULL, *b = NULL, *ab = NULL, *abf = NULL, *ta = NULL;
    WOK(weft_dtensor_full_tensor(ps[i]->data, &a));
    WOK(weft_dtensor_full_tensor(qs[i]->data, &b));
    const weft_tensor *ha = weft_worker_host_copy(a, &ta);
    if (ha) WOK(weft_cast(ha, WEFT_BF16, &ab));
    WOK(weft_cast(ab, WEFT_F32, &abf));
    WCHECK(abf && b && weft_worker_equal_on_host(abf, b), "import bf16: '%s' differs", ps[i]->fqn);
    weft_tensor_destroy(ta);
    weft_tensor_destroy(a);
    weft_tensor_destroy(b);
    weft_tensor_destroy(ab);
    weft_tensor_destroy(abf);
  }
  EXPECT_ERR(weft_safetensors_import_model(B.m, ref, NULL, NULL, NULL), WEFT_ERR_CORRUPT,
             "ref.bin");
  free(f32);
  free(bf16);
  free(ref);
  free(idx);
  lmodel_free(&B);
  lmodel_free(&L);
}

/* Imports a safetensors file written by Python (argv[2]) and compares
 * with its raw f32 reference (argv[3], in parameter order). */
static void case_st_import_py(void) {
  lmodel L;
  WREQUIRE(lmodel_make(&L, "tp2", SEED), "model");
  weft_key_list miss = {0}, unexp = {0};
  WOK(weft_safetensors_import_model(L.m, arg(2), NULL, &miss, &unexp));
  FILE *f = fopen(arg(3), "rb");
  WREQUIRE(f, "open %s", arg(3));
  weft_param *ps[64];
  int np = 0;
  WOK(weft_module_parameters(L.m, ps, 64, &np));
  for (int i = 0; i < np; i++) {
    weft_tensor *got = NULL, *tmp = NULL;
    WOK(weft_dtensor_full_tensor(ps[i]->data, &got));
    if (!got) continue;
    const weft_tensor *h = weft_worker_host_copy(got, &tmp);
    int64_t n = weft_tensor_numel(got);
    float *want = malloc((size_t)n * 4);
    size_t r = fread(want, 4, (size_t)n, f);
    WCHECK(h && r == (size_t)n && memcmp(want, h->data, (size_t)n * 4) == 0,
           "python tensor '%s' differs after import", ps[i]->fqn);
    free(want);
    weft_tensor_destroy(tmp);
    weft_tensor_destroy(got);
  }
  fclose(f);
  lmodel_free(&L);
}
#endif /* models */

static void case_save_all(void) {
  case_rt_save();
#ifdef HAVE_MODELS
  model_save(arg(4), arg(5));
#endif
}

static void case_load_all(void) {
  const char *mesh = arg(6);
  rt_load(mesh);
#ifdef HAVE_MODELS
  const char *layout = !strcmp(mesh, "1")   ? "1"
                       : !strcmp(mesh, "2") ? "tp2"
                       : !strcmp(mesh, "4") ? "fsdp4"
                                            : mesh;
  model_load(layout, arg(4), arg(5));
#endif
}

/* ------------------------------------------------------ across devices */

static weft_device dev_arg(int i) {
  const char *a = arg(i);
  WCHECK(!strcmp(a, "cuda") || !strcmp(a, "cpu"), "device argument '%s' (cuda or cpu)", a);
  return !strcmp(a, "cuda") ? WEFT_CUDA : WEFT_CPU;
}

/* Every DTensor entry of sd keeps its local on dev. */
static void check_on(weft_state_dict *sd, weft_device dev, const char *what) {
  int64_t bad = 0;
  for (int64_t i = 0; i < weft_state_dict_count(sd); i++) {
    weft_sd_entry e;
    WOK(weft_state_dict_get(sd, i, &e));
    if (e.kind == WEFT_SD_DTENSOR && weft_dtensor_local(e.dtensor)->device != dev) {
      if (!bad++)
        WCHECK(false, "%s: '%s' is on %s, not %s", what, e.name,
               weft_device_name(weft_dtensor_local(e.dtensor)->device), weft_device_name(dev));
    }
  }
}

/* Plain targets for TD on mesh (placements pl) plus the plain tensor and
 * the value targets. */
static weft_state_dict *plain_targets(weft_mesh *mesh, const char **pl) {
  weft_state_dict *sd = NULL;
  WOK(weft_state_dict_create(&sd));
  for (int i = 0; i < NTD; i++)
    WOK(weft_state_dict_add_dtensor(sd, TD[i].name, make_target(mesh, i, pl[i]), WEFT_LOCAL_TAKE));
  weft_tensor *p = NULL;
  int64_t sh[2] = {13, 7};
  WOK(weft_tensor_zeros(WEFT_F32, WEFT_CPU, 2, sh, &p));
  WOK(weft_state_dict_add_tensor(sd, "plain", p, WEFT_LOCAL_TAKE));
  add_value_targets(sd, 4);
  return sd;
}

/* argv: dir, save device, load device (cuda|cpu). 4 ranks. Saves from
 * meshes on the save device (plain DTensors on 2x2; the model FSDP 2 x
 * TP 2 after a step, synchronously and, before one more step that
 * changes every parameter and optimizer state, asynchronously), loads
 * onto other shapes on the load device (plain on 4, the model FSDP over
 * 4), re-saves from there and loads that back onto 2x2 meshes on the
 * save device (other placements, another model init): every full tensor
 * bitwise equal to the reference after each hop. */
static void case_xdev(void) {
  const char *dir = arg(2);
  weft_device sdev = dev_arg(3), ldev = dev_arg(4);
  char *plain = path2(dir, "plain"), *plain_back = path2(dir, "plain.back");
  int nd, shape[3];
  /* 1: plain DTensors on 2x2 on the save device */
  forced_dev = (int)sdev;
  weft_mesh *m22 = mesh_of("2x2", &nd, shape);
  WREQUIRE(m22, "mesh");
  {
    weft_state_dict *sd = plain_sd(m22, PL_SAVE, 0);
    add_values(sd);
    check_on(sd, sdev, "plain save");
    WOK(weft_dcp_save(sd, plain, NULL));
    weft_state_dict_destroy(sd);
  }
  /* 2: onto 4 ranks on the load device; save again from there */
  forced_dev = (int)ldev;
  weft_mesh *m4 = mesh_of("4", &nd, shape);
  WREQUIRE(m4, "mesh");
  {
    weft_state_dict *sd = plain_targets(m4, PL_4);
    check_on(sd, ldev, "plain load");
    WOK(weft_dcp_load(sd, plain, NULL, NULL));
    char what[96];
    snprintf(what, sizeof what, "plain %s 2x2 -> %s 4", weft_device_name(sdev),
             weft_device_name(ldev));
    check_loaded(sd, what);
    check_values(sd, 4);
    WOK(weft_dcp_save(sd, plain_back, NULL));
    weft_state_dict_destroy(sd);
  }
  /* 3: back onto 2x2 (other placements) on the save device */
  {
    weft_state_dict *sd = plain_targets(m22, PL_22);
    check_on(sd, sdev, "plain load back");
    WOK(weft_dcp_load(sd, plain_back, NULL, NULL));
    char what[96];
    snprintf(what, sizeof what, "plain back %s 4 -> %s 2x2", weft_device_name(ldev),
             weft_device_name(sdev));
    check_loaded(sd, what);
    check_values(sd, 4);
    weft_state_dict_destroy(sd);
  }
  WOK(weft_mesh_destroy(m4));
  WOK(weft_mesh_destroy(m22));
#ifdef HAVE_MODELS
  char *model = path2(dir, "model"), *model_async = path2(dir, "model.async"),
       *model_back = path2(dir, "model.back"), *ref = path2(dir, "ref.safetensors");
  {
    forced_dev = (int)sdev;
    lmodel L;
    WREQUIRE(lmodel_make(&L, "2x2", SEED), "model");
    train_step(&L, 0);
    weft_state_dict *sd = full_sd(&L, NULL);
    check_on(sd, sdev, "model save");
    WOK(weft_state_dict_set_int(sd, "train.step", 1));
    WOK(weft_dcp_save(sd, model, NULL));
    weft_state_dict_opts o = WEFT_STATE_DICT_OPTS_INIT;
    o.full_state_dict = true;
    o.cpu_offload = true;
    weft_state_dict *full = full_sd(&L, &o);
    if (rank0()) write_ref(full, ref);
    /* async: the next step overwrites the model's (device) tensors right
     * after the save returns; the checkpoint keeps the staged values */
    weft_dcp_async *h = NULL;
    WOK(weft_dcp_async_save(sd, model_async, NULL, &h));
    train_step(&L, 1);
    WOK(weft_state_dict_set_int(sd, "train.step", 2));
    WOK(weft_dcp_async_wait(h));
    int64_t changed = 0, n = 0;
    for (int64_t i = 0; i < weft_state_dict_count(sd); i++) {
      weft_sd_entry v, f;
      WOK(weft_state_dict_get(sd, i, &v));
      if (v.kind != WEFT_SD_DTENSOR) continue;
      weft_tensor *g = NULL;
      WOK(weft_dtensor_full_tensor(v.dtensor, &g));
      n++;
      if (!rank0()) {
        weft_tensor_destroy(g);
        continue;
      }
      WOK(weft_state_dict_find(full, v.name, &f));
      changed += !weft_worker_equal_on_host(g, f.tensor);
      weft_tensor_destroy(g);
    }
    if (rank0())
      WCHECK(changed == n && n > 30,
             "the step after the async save changed %" PRId64 " of %" PRId64
             " tensors (it must change all)",
             changed, n);
    weft_state_dict_destroy(full);
    weft_state_dict_destroy(sd);
    lmodel_free(&L);
    barrier();
  }
  const char *srcs[2] = {model, model_async};
  for (int k = 0; k < 2; k++) {
    forced_dev = (int)ldev;
    lmodel L;
    WREQUIRE(lmodel_make(&L, "fsdp4", SEED + 17), "model");
    weft_state_dict *sd = full_sd(&L, NULL);
    check_on(sd, ldev, "model load");
    WOK(weft_state_dict_set_int(sd, "train.step", 0));
    WOK(weft_dcp_load(sd, srcs[k], NULL, NULL));
    int64_t step = -1;
    WOK(weft_state_dict_get_int(sd, "train.step", &step));
    WCHECK(step == 1, "%s: train.step %" PRId64, srcs[k], step);
    WOK(weft_set_optimizer_state_dict(L.m, L.opt, sd, NULL, NULL, NULL));
    WCHECK(weft_optimizer_num_steps(L.opt) == 1, "%s: num_steps %" PRId64, srcs[k],
           weft_optimizer_num_steps(L.opt));
    char what[128];
    snprintf(what, sizeof what, "%s model %s 2x2 -> %s fsdp4", k ? "async" : "sync",
             weft_device_name(sdev), weft_device_name(ldev));
    compare_ref(sd, ref, what);
    if (k == 0) WOK(weft_dcp_save(sd, model_back, NULL));
    weft_state_dict_destroy(sd);
    lmodel_free(&L);
  }
  {
    forced_dev = (int)sdev;
    lmodel L;
    WREQUIRE(lmodel_make(&L, "2x2", SEED + 29), "model");
    weft_state_dict *sd = full_sd(&L, NULL);
    check_on(sd, sdev, "model load back");
    WOK(weft_dcp_load(sd, model_back, NULL, NULL));
    char what[128];
    snprintf(what, sizeof what, "model back %s fsdp4 -> %s 2x2", weft_device_name(ldev),
             weft_device_name(sdev));
    compare_ref(sd, ref, what);
    weft_state_dict_destroy(sd);
    lmodel_free(&L);
  }
  free(model);
  free(model_async);
  free(model_back);
  free(ref);
#endif
  forced_dev = -1;
  free(plain);
  free(plain_back);
}

/* ------------------------------------------------------ faults */

static weft_state_dict *small_sd(weft_mesh *mesh, uint64_t salt) {
  const char *pl[NTD] = {"S(0)", "R", "R", "S(0)", "S(1)", "R", "S(0)", "S(0)", "S(1)"};
  return plain_sd(mesh, pl, salt);
}

static weft_mesh *world_mesh(void) {
  int n = weft_world_size();
  const char *names[1] = {"w"};
  weft_mesh *m = NULL;
  WOK(weft_mesh_create(1, &n, names, &m));
  return on_dev(m);
}

/* argv: A, B — two good checkpoints (salt 1). */
static void case_fault_prep(void) {
  weft_mesh *m = world_mesh();
  weft_state_dict *sd = small_sd(m, 1);
  WOK(weft_dcp_save(sd, arg(2), NULL));
  WOK(weft_dcp_save(sd, arg(3), NULL));
  weft_state_dict_destroy(sd);
  WOK(weft_mesh_destroy(m));
}

/* argv: dir. Saves (salt 2) with WEFT_DCP_FAULT set by the test: a rank
 * dies; reaching the end is a failure. */
static void case_fault_save(void) {
  weft_mesh *m = world_mesh();
  weft_state_dict *sd = small_sd(m, 2);
  weft_status st = weft_dcp_save(sd, arg(2), NULL);
  WCHECK(false, "the save with a fault injected returned %s", weft_status_str(st));
  weft_state_dict_destroy(sd);
  WOK(weft_mesh_destroy(m));
}

static bool loads_salt(weft_mesh *m, const char *dir, uint64_t salt) {
  weft_state_dict *sd = small_sd(m, 77);
  weft_status st = weft_dcp_load(sd, dir, NULL, NULL);
  WCHECK(st == WEFT_OK, "load %s: %s", dir, weft_last_error());
  bool ok = st == WEFT_OK;
  for (int i = 0; ok && i < NTD; i++) {
    weft_sd_entry e;
    WOK(weft_state_dict_find(sd, TD[i].name, &e));
    weft_tensor *got = NULL, *want = reference(i, salt);
    WOK(weft_dtensor_full_tensor(e.dtensor, &got));
    ok = got && weft_worker_equal_on_host(got, want);
    weft_tensor_destroy(got);
    weft_tensor_destroy(want);
  }
  weft_state_dict_destroy(sd);
  return ok;
}

/* argv: A (good), B (a save over it died at commit), C D (fresh saves
 * that died at write / after sync). */
static void case_fault_check(void) {
  weft_mesh *m = world_mesh();
  WCHECK(loads_salt(m, arg(2), 1), "the previous checkpoint A does not load");
  WCHECK(loads_salt(m, arg(3), 1),
         "checkpoint B does not load its previous contents after a save "
         "over it died before committing");
  for (int k = 4; k <= 5; k++) {
    weft_state_dict *sd = small_sd(m, 77);
    EXPECT_ERR(weft_dcp_load(sd, arg(k), NULL, NULL), WEFT_ERR_NOT_FOUND, "incomplete", arg(k));
    weft_state_dict_destroy(sd);
  }
  /* the next save into B succeeds and removes the dead save's files */
  weft_state_dict *sd = small_sd(m, 3);
  WOK(weft_dcp_save(sd, arg(3), NULL));
  weft_state_dict_destroy(sd);
  WCHECK(loads_salt(m, arg(3), 3), "B after a new save");
  if (rank0()) {
    int nfiles = 0;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "ls %s | grep -c '\\.data$'", arg(3));
    FILE *p = popen(cmd, "r");
    if (p) {
      if (fscanf(p, "%d", &nfiles) != 1) nfiles = -1;
      pclose(p);
    }
    WCHECK(nfiles == weft_world_size(), "B holds %d data files after the commit (stale ones left)",
           nfiles);
  }
  WOK(weft_mesh_destroy(m));
}

/* ------------------------------------------------------ corruption */

static void cp_dir(const char *from, const char *to) {
  if (rank0()) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", to, from, to);
    WCHECK(system(cmd) == 0, "%s", cmd);
  }
  barrier();
}

static void write_all(const char *p, const char *b, size_t n) {
  FILE *f = fopen(p, "wb");
  fwrite(b, 1, n, f);
  fclose(f);
}

/* Edits dir/metadata.json on rank 0 with fn(root). */
static void edit_meta(const char *dir, void (*fn)(cJSON *)) {
  if (rank0()) {
    char *p = path2(dir, "metadata.json");
    char *t = weft_test_slurp(p, NULL);
    WCHECK(t != NULL, "cannot read %s", p);
    cJSON *j = cJSON_Parse(t);
    /* the edit stands for a writer without metadata checksums (FORMAT.md),
     * so that the rule under test, not the checksum, rejects it */
    cJSON_DeleteItemFromObjectCaseSensitive(j, "checksum");
    fn(j);
    char *o = cJSON_PrintUnformatted(j);
    write_all(p, o, strlen(o));
    free(o);
    cJSON_Delete(j);
    free(t);
    free(p);
  }
  barrier();
}

static cJSON *tensor_of(cJSON *root, const char *name) {
  return cJSON_GetObjectItem(cJSON_GetObjectItem(root, "tensors"), name);
}
static void ed_shape(cJSON *r) {
  cJSON *sh = cJSON_GetObjectItem(tensor_of(r, "a"), "shape");
  cJSON_ReplaceItemInArray(sh, 1, cJSON_CreateNumber(8));
}
static void ed_overlap(cJSON *r) {
  cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(tensor_of(r, "a"), "chunks"), 1);
  cJSON *off = cJSON_GetObjectItem(ch, "offsets");
  cJSON_ReplaceItemInArray(off, 0, cJSON_CreateNumber(cJSON_GetArrayItem(off, 0)->valuedouble - 1));
}
static void ed_hole(cJSON *r) {
  cJSON_DeleteItemFromArray(cJSON_GetObjectItem(tensor_of(r, "a"), "chunks"), 0);
}
static void ed_version(cJSON *r) {
  cJSON_ReplaceItemInObject(r, "version", cJSON_CreateNumber(99));
}
static void ed_crc(cJSON *r) {
  cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(tensor_of(r, "b"), "chunks"), 0);
  cJSON_ReplaceItemInObject(ch, "crc32c", cJSON_CreateArray());
}
static void ed_id(cJSON *r) {
  cJSON_ReplaceItemInObject(r, "id", cJSON_CreateString("00000000000000aa"));
}

/* The data file holding tensor name's first chunk, and its byte offset. */
static char *chunk_file(const char *dir, const char *name, uint64_t *off) {
  weft_dcp_checkpoint *ck = NULL;
  WOK(weft_dcp_open(dir, &ck));
  char *p = NULL;
  weft_dcp_tensor_info ti;
  for (int64_t t = 0; ck && t < 64; t++) {
    if (weft_dcp_tensor_get(ck, t, &ti) != WEFT_OK) break;
    if (strcmp(ti.name, name)) continue;
    weft_dcp_chunk_info ci;
    WOK(weft_dcp_chunk_get(ck, t, 0, &ci));
    p = path2(dir, ci.file);
    *off = ci.byte_offset;
  }
  weft_dcp_close(ck);
  return p;
}

/* Loads dir into a fresh state dict and expects an error on every rank;
 * checks that a pre-read error left the entries untouched. */
static void expect_load_error(weft_mesh *m, const char *dir, weft_status code, const char *n1,
                              const char *n2, bool untouched) {
  weft_state_dict *sd = small_sd(m, 55);
  weft_status st = weft_dcp_load(sd, dir, NULL, NULL);
  if (getenv("DCP_TEST_VERBOSE")) printf("[rank %d] %s\n", weft_world_rank(), weft_last_error());
  WCHECK(st == code, "load %s: %s (want %s): %s", dir, weft_status_str(st), weft_status_str(code),
         weft_last_error());
  WCHECK(!n1 || strstr(weft_last_error(), n1), "message lacks '%s': %s", n1, weft_last_error());
  WCHECK(!n2 || strstr(weft_last_error(), n2), "message lacks '%s': %s", n2, weft_last_error());
  if (untouched)
    for (int i = 0; i < NTD; i++) {
      weft_sd_entry e;
      WOK(weft_state_dict_find(sd, TD[i].name, &e));
      weft_tensor *got = NULL, *want = reference(i, 55);
      WOK(weft_dtensor_full_tensor(e.dtensor, &got));
      WCHECK(got && weft_worker_equal_on_host(got, want), "%s: '%s' was modified by a failed load",
             dir, TD[i].name);
      weft_tensor_destroy(got);
      weft_tensor_destroy(want);
    }
  weft_state_dict_destroy(sd);
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The names of dir's entries, sorted, joined by spaces (malloc'ed). */
static char *dir_listing(const char *dir) {
  char *names[64];
  int n = 0;
  DIR *d = opendir(dir);
  struct dirent *de;
  while (d && (de = readdir(d)) && n < 64)
    if (de->d_name[0] != '.') names[n++] = strdup(de->d_name);
  if (d) closedir(d);
  qsort(names, (size_t)n, sizeof *names, cmp_str);
  size_t len = 1;
  for (int i = 0; i < n; i++) len += strlen(names[i]) + 1;
  char *out = calloc(1, len);
  for (int i = 0; i < n; i++) {
    if (i) strcat(out, " ");
    strcat(out, names[i]);
    free(names[i]);
  }
  return out;
}

/* Issue 34 finding 6: a save that fails on one rank (a write refused for
 * lack of space: here the file size limit, EFBIG) is an error on every
 * rank naming the file and the reason, leaves no file of its own behind,
 * and leaves the previous checkpoint loadable; the next save succeeds.
 * argv: base dir (scratch). */
static void case_failed_save(void) {
  weft_mesh *m = world_mesh();
  char *dir = path2(arg(2), "ck");
  weft_state_dict *sd = small_sd(m, 1);
  WOK(weft_dcp_save(sd, dir, NULL));
  weft_state_dict_destroy(sd);
  barrier();
  char *before = rank0() ? dir_listing(dir) : NULL;
  struct rlimit was;
  WREQUIRE(getrlimit(RLIMIT_FSIZE, &was) == 0, "getrlimit: %s", strerror(errno));
  if (weft_world_rank() == 1) {
    signal(SIGXFSZ, SIG_IGN); /* the write fails with EFBIG instead */
    struct rlimit lim = {200, was.rlim_max};
    WCHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0, "setrlimit: %s", strerror(errno));
  }
  sd = small_sd(m, 2);
  weft_status st = weft_dcp_save(sd, dir, NULL);
  if (weft_world_rank() == 1) setrlimit(RLIMIT_FSIZE, &was);
  WCHECK(st == WEFT_ERR_IO, "the save past the size limit returned %s: %s", weft_status_str(st),
         weft_last_error());
  WCHECK(strstr(weft_last_error(), "r00001-") && strstr(weft_last_error(), strerror(EFBIG)),
         "the error does not name rank 1's data file and the reason: %s", weft_last_error());
  barrier();
  if (rank0()) {
    char *after = dir_listing(dir);
    WCHECK(strcmp(before, after) == 0, "the failed save left files: before '%s', after '%s'",
           before, after);
    free(after);
  }
  WCHECK(loads_salt(m, dir, 1), "the previous checkpoint does not load after a failed save");
  /* with room again, saving goes on */
  WOK(weft_dcp_save(sd, dir, NULL));
  WCHECK(loads_salt(m, dir, 2), "the save after the failed one does not load");
  weft_state_dict_destroy(sd);
  free(before);
  free(dir);
  WOK(weft_mesh_destroy(m));
}

/* argv: base dir (scratch). */
static void case_corrupt(void) {
  weft_mesh *m = world_mesh();
  const char *base = arg(2);
  char *good = path2(base, "good"), *x = path2(base, "x");
  weft_state_dict *sd = small_sd(m, 1);
  WOK(weft_dcp_save(sd, good, NULL));
  weft_state_dict_destroy(sd);
  barrier();
  uint64_t off = 0;
  /* flipped byte in the data of tensor 'd' */
  cp_dir(good, x);
  if (rank0()) {
    char *f = chunk_file(x, "d", &off);
    int fd = open(f, O_RDWR);
    unsigned char c;
    WCHECK(pread(fd, &c, 1, (off_t)off + 5) == 1, "pread");
    c ^= 0x10;
    WCHECK(pwrite(fd, &c, 1, (off_t)off + 5) == 1, "pwrite");
    close(fd);
    free(f);
  }
  barrier();
  expect_load_error(m, x, WEFT_ERR_CORRUPT, "checksum mismatch", "'d'", false);
  /* truncated data file */
  cp_dir(good, x);
  if (rank0()) {
    char *f = chunk_file(x, "a", &off);
    WCHECK(truncate(f, (off_t)off + 3) == 0, "truncate");
    free(f);
  }
  barrier();
  expect_load_error(m, x, WEFT_ERR_CORRUPT, "truncated", ".data", true);
  /* a data file missing */
  cp_dir(good, x);
  if (rank0()) {
    char *f = chunk_file(x, "a", &off);
    unlink(f);
    free(f);
  }
  barrier();
  expect_load_error(m, x, WEFT_ERR_NOT_FOUND, "is missing", "tensor 'a'", true);
  /* metadata: a wrong shape, overlapping chunks, a hole, a newer version,
   * a checksum list of the wrong length, another save's id */
  cp_dir(good, x);
  edit_meta(x, ed_shape);
  expect_load_error(m, x, WEFT_ERR_CORRUPT, "tensor 'a'", "metadata.json", true);
  cp_dir(good, x);
  edit_meta(x, ed_overlap);
  expect_load_error(m, x, WEFT_ERR_CORRUPT, "overlaps", "tensor 'a'", true);
  cp_dir(good, x);
  edit_meta(x, ed_hole);
  expect_load_error(m, x, WEFT_ERR_CORRUPT, "hole", "tensor 'a'", true);
  cp_dir(good, x);
  edit_meta(x, ed_version);
  expect_load_error(m, x, WEFT_ERR_UNSUPPORTED, "version 99", NULL, true);
  cp_dir(good, x);
  edit_meta(x, ed_crc);
  expect_load_error(m, x, WEFT_ERR_CORRUPT, "tensor 'b'", "crc32c", true);
  cp_dir(good, x);
  edit_meta(x, ed_id);
  expect_load_error(m, x, WEFT_ERR_CORRUPT, "another save", ".data", true);
  /* one changed byte of metadata that no other rule checks (a tensor's
   * layout string, informational) breaks the metadata checksum */
  cp_dir(good, x);
  if (rank0()) {
    char *p = path2(x, "metadata.json");
    size_t n = 0;
    char *t = weft_test_slurp(p, &n);
    char *at = t ? strstr(t, "\"layout\":\"") : NULL;
    WCHECK(at != NULL, "no layout in %s", p);
    if (at) at[10] ^= 0x01;
    if (t) write_all(p, t, n);
    free(t);
    free(p);
  }
  barrier();
  expect_load_error(m, x, WEFT_ERR_CORRUPT, "metadata checksum mismatch", "metadata.json", true);
  /* garbage metadata, no metadata, no directory */
  cp_dir(good, x);
  if (rank0()) {
    char *p = path2(x, "metadata.json");
    write_all(p, "{\"format\": \"weft-dcp\", ", 23);
    free(p);
  }
  barrier();
  expect_load_error(m, x, WEFT_ERR_CORRUPT, "not valid JSON", "metadata.json", true);
  if (rank0()) {
    char *p = path2(x, "metadata.json");
    unlink(p);
    free(p);
  }
  barrier();
  expect_load_error(m, x, WEFT_ERR_NOT_FOUND, "incomplete", NULL, true);
  char *nodir = path2(base, "does-not-exist");
  expect_load_error(m, nodir, WEFT_ERR_NOT_FOUND, "does not exist", "does-not-exist", true);
  /* state dict against checkpoint: wrong shape, wrong dtype, value types */
  {
    weft_state_dict *s2 = NULL;
    WOK(weft_state_dict_create(&s2));
    weft_placement r = weft_replicate();
    int64_t sh[2] = {13, 8};
    weft_dtensor *w = NULL;
    WOK(weft_dtensor_zeros(m, WEFT_F32, 2, sh, &r, 1, &w));
    WOK(weft_state_dict_add_dtensor(s2, "a", w, WEFT_LOCAL_TAKE));
    EXPECT_ERR(weft_dcp_load(s2, good, NULL, NULL), WEFT_ERR_INVALID, "tensor 'a'", "[0:13, 0:7]",
               "[0:13, 0:8]");
    WOK(weft_state_dict_remove(s2, "a"));
    int64_t sh2[2] = {13, 7};
    WOK(weft_dtensor_zeros(m, WEFT_F64, 2, sh2, &r, 1, &w));
    WOK(weft_state_dict_add_dtensor(s2, "a", w, WEFT_LOCAL_TAKE));
    EXPECT_ERR(weft_dcp_load(s2, good, NULL, NULL), WEFT_ERR_INVALID, "f32", "f64");
    weft_state_dict_destroy(s2);
    WOK(weft_state_dict_create(&s2));
    WOK(weft_state_dict_set_string(s2, "train.step", "x"));
    weft_state_dict *s3 = small_sd(m, 1);
    add_values(s3);
    char *vd = path2(base, "values");
    WOK(weft_dcp_save(s3, vd, NULL));
    EXPECT_ERR(weft_dcp_load(s2, vd, NULL, NULL), WEFT_ERR_INVALID, "train.step", "int", "string");
    /* a partial DTensor cannot be saved; a bad block size is refused */
    weft_placement pp = weft_partial(WEFT_OP_SUM);
    WOK(weft_dtensor_zeros(m, WEFT_F32, 2, sh2, &pp, 1, &w));
    WOK(weft_state_dict_add_dtensor(s2, "partial", w, WEFT_LOCAL_TAKE));
    EXPECT_ERR(weft_dcp_save(s2, vd, NULL), WEFT_ERR_UNSUPPORTED, "partial", "Partial");
    weft_dcp_opts o = WEFT_DCP_OPTS_INIT;
    o.block_bytes = 100;
    EXPECT_ERR(weft_dcp_save(s3, vd, &o), WEFT_ERR_INVALID, "block_bytes");
    /* ranks disagreeing on a shape or a value */
    weft_state_dict *s5 = NULL;
    WOK(weft_state_dict_create(&s5));
    int64_t shr[1] = {rank0() ? 4 : 5};
    weft_tensor *pt = NULL;
    WOK(weft_tensor_zeros(WEFT_F32, WEFT_CPU, 1, shr, &pt));
    WOK(weft_state_dict_add_tensor(s5, "t", pt, WEFT_LOCAL_TAKE));
    EXPECT_ERR(weft_dcp_save(s5, vd, NULL), WEFT_ERR_MISMATCH, "tensor 't'", "rank 0", "rank 1");
    weft_state_dict_destroy(s5);
    WOK(weft_state_dict_create(&s5));
    WOK(weft_state_dict_set_int(s5, "seed", weft_world_rank()));
    EXPECT_ERR(weft_dcp_save(s5, vd, NULL), WEFT_ERR_MISMATCH, "value 'seed'", "per-rank");
    weft_state_dict_destroy(s5);
    /* overlapping shards that are not replicas: rank 0 holds half of
     * 'dup' as a shard, rank 1 all of it as a plain tensor */
    WOK(weft_state_dict_create(&s5));
    int64_t shg[1] = {8};
    if (rank0()) {
      weft_dtensor *ov = NULL;
      weft_placement sp = weft_shard(0);
      WOK(weft_dtensor_zeros(m, WEFT_F32, 1, shg, &sp, 1, &ov));
      WOK(weft_state_dict_add_dtensor(s5, "dup", ov, WEFT_LOCAL_TAKE));
    } else {
      WOK(weft_tensor_zeros(WEFT_F32, WEFT_CPU, 1, shg, &pt));
      WOK(weft_state_dict_add_tensor(s5, "dup", pt, WEFT_LOCAL_TAKE));
    }
    EXPECT_ERR(weft_dcp_save(s5, vd, NULL), WEFT_ERR_INVALID, "tensor 'dup'", "overlaps");
    weft_state_dict_destroy(s5);
    /* the failed saves left the checkpoint as it was */
    weft_state_dict *s4 = small_sd(m, 9);
    add_value_targets(s4, weft_world_size());
    WOK(weft_dcp_load(s4, vd, NULL, NULL));
    check_values(s4, weft_world_size());
    weft_state_dict_destroy(s4);
    free(vd);
    weft_state_dict_destroy(s3);
    weft_state_dict_destroy(s2);
  }
  /* a group: each rank saves and loads alone, on its own 1-rank mesh */
  {
    int one = 1;
    const char *nm[1] = {"self"};
    weft_mesh *self = NULL;
    WOK(weft_mesh_create_from_comm(MPI_COMM_SELF, 1, &one, nm, &self));
    on_dev(self);
    weft_state_dict *g = NULL, *h = NULL;
    WOK(weft_state_dict_create(&g));
    WOK(weft_state_dict_add_tensor(g, "mine", reference(0, 100 + (uint64_t)weft_world_rank()),
                                   WEFT_LOCAL_TAKE));
    weft_dcp_opts o = WEFT_DCP_OPTS_INIT;
    o.group = self;
    char gd[64];
    snprintf(gd, sizeof gd, "group.%d", weft_world_rank());
    char *gdir = path2(base, gd);
    WOK(weft_dcp_save(g, gdir, &o));
    weft_dcp_checkpoint *ck = NULL;
    WOK(weft_dcp_open(gdir, &ck));
    weft_dcp_info info = {0};
    WOK(weft_dcp_get_info(ck, &info));
    WCHECK(info.world_size == 1, "group save: world size %d", info.world_size);
    weft_dcp_close(ck);
    WOK(weft_state_dict_create(&h));
    int64_t sh[2] = {13, 7};
    weft_tensor *z = NULL;
    WOK(weft_tensor_zeros(WEFT_F32, WEFT_CPU, 2, sh, &z));
    WOK(weft_state_dict_add_tensor(h, "mine", z, WEFT_LOCAL_TAKE));
    WOK(weft_dcp_load(h, gdir, &o, NULL));
    weft_tensor *want = reference(0, 100 + (uint64_t)weft_world_rank());
    WCHECK(weft_worker_equal_on_host(z, want), "group load differs");
    weft_tensor_destroy(want);
    weft_state_dict_destroy(g);
    weft_state_dict_destroy(h);
    free(gdir);
    WOK(weft_mesh_destroy(self));
  }
  free(nodir);
  free(good);
  free(x);
  WOK(weft_mesh_destroy(m));
}

/* ------------------------------------------------------ async */

static void case_async(void) {
  weft_mesh *m = world_mesh();
  const char *base = arg(2);
  for (int mode = 0; mode < 2; mode++) {
    char *d1 = path2(base, mode ? "w1" : "t1"), *d2 = path2(base, mode ? "w2" : "t2");
    weft_dcp_opts o = WEFT_DCP_OPTS_INIT;
    o.commit_in_wait = mode == 1;
    o.block_bytes = 128;
    weft_state_dict *sd = small_sd(m, 1);
    add_values(sd);
    weft_dcp_async *h1 = NULL, *h2 = NULL;
    WOK(weft_dcp_async_save(sd, d1, &o, &h1));
    /* training continues: overwrite the state right away */
    for (int i = 0; i < NTD; i++) {
      weft_sd_entry e;
      WOK(weft_state_dict_find(sd, TD[i].name, &e));
      WOK(weft_tensor_fill(weft_dtensor_local(e.dtensor), 3.0));
    }
    WOK(weft_state_dict_set_int(sd, "train.step", 7));
    /* a second save while the first is in flight: the first completes */
    WOK(weft_dcp_async_save(sd, d2, &o, &h2));
    bool done = false;
    WOK(weft_dcp_async_test(h1, &done));
    WCHECK(done, "the first async save is not finished after the second started");
    WOK(weft_dcp_async_wait(h1));
    WOK(weft_dcp_async_wait(h2));
    WCHECK(loads_salt(m, d1, 1), "async save %d: the checkpoint does not hold the staged state",
           mode);
    weft_state_dict *t = small_sd(m, 5);
    add_value_targets(t, weft_world_size());
    WOK(weft_dcp_load(t, d2, NULL, NULL));
    int64_t step = 0;
    WOK(weft_state_dict_get_int(t, "train.step", &step));
    WCHECK(step == 7, "second async save: step %" PRId64, step);
    weft_sd_entry e;
    WOK(weft_state_dict_find(t, "a", &e));
    weft_tensor *got = NULL;
    WOK(weft_dtensor_full_tensor(e.dtensor, &got));
    WCHECK(got && get_host(got, (int64_t[]){12, 6}) == 3.0, "second async save: values");
    weft_tensor_destroy(got);
    weft_state_dict_destroy(t);
    /* an async save whose plan fails reports on every rank */
    weft_dcp_async *h3 = NULL;
    weft_placement pp = weft_partial(WEFT_OP_SUM);
    weft_dtensor *w = NULL;
    int64_t sh[1] = {4};
    WOK(weft_dtensor_zeros(m, WEFT_F32, 1, sh, &pp, 1, &w));
    WOK(weft_state_dict_add_dtensor(sd, "partial", w, WEFT_LOCAL_TAKE));
    EXPECT_ERR(weft_dcp_async_save(sd, d1, &o, &h3), WEFT_ERR_UNSUPPORTED, "Partial");
    WCHECK(h3 == NULL, "handle on failure");
    WOK(weft_dcp_async_wait(NULL));
    weft_state_dict_destroy(sd);
    free(d1);
    free(d2);
  }
  WOK(weft_dcp_release_staging());
  WOK(weft_mesh_destroy(m));
}

/* argv: dir. A checkpoint for the weft-ckpt tests (2 ranks). */
static void case_tool_prep(void) {
  weft_mesh *m = world_mesh();
  weft_state_dict *sd = small_sd(m, 1);
  add_values(sd);
  WOK(weft_dcp_save(sd, arg(2), NULL));
  weft_state_dict_destroy(sd);
  WOK(weft_mesh_destroy(m));
}

#if defined(DCP_TEST_HAVE_FSDP) && defined(DCP_TEST_HAVE_GPT2)
/* ------------------------------------------------------------ GPT-2
 * models/gpt2 through DCP and safetensors: its lm_head.weight is tied to
 * transformer.wte.weight (saved once, under the owner's name; loads accept
 * the alias), and its AdamW has nanoGPT's two parameter groups (saved with
 * their hyper-parameters and members, restored, checked). References are
 * the gathered full tensors written by rank 0 with the plain safetensors
 * writer (write_ref), compared bitwise. */

static weft_gpt2_config g2_cfg(void) {
  weft_gpt2_config c = WEFT_GPT2_CONFIG_INIT;
  c.vocab = 40;
  c.max_seq_len = 16;
  c.dim = 16;
  c.n_layers = 2;
  c.n_heads = 2;
  c.ffn_dim = 32;
  return c;
}

typedef struct g2model {
  weft_mesh *self, *dp; /* model mesh (1 rank), dp mesh (the world) */
  weft_module *m;
  weft_optimizer *opt;
  bool fsdp;
} g2model;

/* GPT-2 on a 1-rank model mesh; with fsdp each block and the root are
 * fully_shard'ed over the world; AdamW with nanoGPT's groups (hp). */
static bool g2_make(g2model *G, bool fsdp, uint64_t seed, const weft_adamw_params *hp) {
  memset(G, 0, sizeof *G);
  weft_gpt2_config c = g2_cfg();
  int one = 1, n = weft_world_size();
  const char *tn[1] = {"tp"}, *dn[1] = {"dp"};
  WOK(weft_mesh_create_from_comm(MPI_COMM_SELF, 1, &one, tn, &G->self));
  WOK(weft_mesh_create(1, &n, dn, &G->dp));
  if (!G->self || !G->dp) return false;
  on_dev(G->self);
  on_dev(G->dp);
  WOK(weft_gpt2_create(&c, G->self, &G->m));
  if (!G->m) return false;
  G->fsdp = fsdp;
  if (fsdp) {
    weft_module *h = find(G->m, "transformer.h");
    for (int i = 0; i < weft_module_num_children(h); i++)
      WOK(weft_fully_shard(weft_module_child(h, i), G->dp, NULL, NULL));
    WOK(weft_fully_shard(G->m, G->dp, NULL, NULL));
  }
  WOK(weft_module_init_weights(G->m, seed));
  if (hp) WOK(weft_gpt2_adamw_create(G->m, hp, &G->opt));
  return !hp || G->opt;
}

static void g2_free(g2model *G) {
  weft_optimizer_destroy(G->opt);
  if (G->m && G->fsdp) WOK(weft_fsdp_destroy_all(G->m));
  WOK(weft_module_destroy(G->m));
  WOK(weft_mesh_destroy(G->dp));
  WOK(weft_mesh_destroy(G->self));
  memset(G, 0, sizeof *G);
}

/* One step on this rank's rows of the batch of `step` (4 rows over the
 * world with FSDP, all 4 without); returns the local loss. */
static double g2_step(g2model *G, int step) {
  const int B = 4, T = 8, V = (int)g2_cfg().vocab;
  int world = G->fsdp ? weft_world_size() : 1;
  int rows = B / world, row0 = G->fsdp ? weft_world_rank() * rows : 0;
  int64_t shape[2] = {rows, T};
  weft_tensor *a = NULL, *b = NULL;
  WOK(weft_tensor_create(WEFT_I32, WEFT_CPU, 2, shape, &a));
  WOK(weft_tensor_create(WEFT_I32, WEFT_CPU, 2, shape, &b));
  if (!a || !b) return NAN;
  for (int r = 0; r < rows; r++)
    for (int t = 0; t < T; t++) {
      uint64_t k = (uint64_t)step * 7919u + (uint64_t)(row0 + r) * 131u + (uint64_t)t;
      ((int32_t *)a->data)[r * T + t] = (int32_t)(weft_test_mix64(k) % (uint64_t)V);
      ((int32_t *)b->data)[r * T + t] = (int32_t)(weft_test_mix64(k ^ 0x5555u) % (uint64_t)V);
    }
  weft_placement pl[1] = {weft_replicate()};
  weft_dtensor *ids = NULL, *tgt = NULL;
  WOK(weft_dtensor_distribute(G->self, a, WEFT_DTENSOR_ALL_RANKS, pl, 1, &ids));
  WOK(weft_dtensor_distribute(G->self, b, WEFT_DTENSOR_ALL_RANKS, pl, 1, &tgt));
  weft_graph *g = NULL;
  WOK(weft_graph_create(&g));
  weft_var *loss = NULL;
  double l = NAN;
  WOK(weft_gpt2_loss(G->m, g, ids, tgt, &loss, NULL));
  if (loss) {
    l = weft_var_item(loss);
    WOK(weft_backward(loss));
    WOK(weft_clip_grad_norm(G->m, 1.0, NULL));
    WOK(weft_optimizer_step(G->opt));
    WOK(weft_module_zero_grad(G->m, false));
  }
  weft_graph_destroy(g);
  weft_dtensor_destroy(ids);
  weft_dtensor_destroy(tgt);
  weft_tensor_destroy(a);
  weft_tensor_destroy(b);
  return l;
}

/* The model's parameters equal ref (a safetensors file of full tensors). */
static void g2_compare(weft_module *m, const char *ref, const char *what) {
  weft_state_dict *sd = NULL;
  WOK(weft_state_dict_create(&sd));
  WOK(weft_get_model_state_dict(m, NULL, sd));
  compare_ref(sd, ref, what);
  weft_state_dict_destroy(sd);
}

/* argv: dir, st, ref. 2 ranks: GPT-2 with FSDP over both, 2 AdamW steps,
 * then a DCP checkpoint (model + optimizer), a safetensors export and the
 * reference; the tied weight is one entry everywhere. */
static void case_gpt2_save(void) {
  const char *dir = arg(2), *st = arg(3), *ref = arg(4);
  weft_adamw_params hp = WEFT_ADAMW_DEFAULT;
  hp.lr = 1e-2f;
  hp.weight_decay = 0.1f;
  g2model G;
  WREQUIRE(g2_make(&G, true, 11, &hp), "model");
  for (int s = 0; s < 2; s++) g2_step(&G, s);
  weft_state_dict *sd = NULL;
  WOK(weft_state_dict_create(&sd));
  WOK(weft_get_model_state_dict(G.m, NULL, sd));
  int np = 0;
  WOK(weft_module_parameters(G.m, NULL, 0, &np));
  WCHECK(weft_state_dict_count(sd) == np && np == 2 + 12 * 2 + 2,
         "model state dict: %lld entries for %d parameters", (long long)weft_state_dict_count(sd),
         np);
  WCHECK(weft_state_dict_find(sd, "transformer.wte.weight", NULL) == WEFT_OK &&
             weft_state_dict_find(sd, "lm_head.weight", NULL) == WEFT_ERR_NOT_FOUND,
         "the tied weight is not saved once under its owner's name");
  weft_clear_error();
  WOK(weft_get_optimizer_state_dict(G.m, G.opt, NULL, sd));
  WOK(weft_dcp_save(sd, dir, NULL));
  WOK(weft_safetensors_export_model(G.m, st, WEFT_F32));
  weft_state_dict_opts o = WEFT_STATE_DICT_OPTS_INIT;
  o.full_state_dict = true;
  o.cpu_offload = true;
  weft_state_dict *full = NULL;
  WOK(weft_state_dict_create(&full));
  WOK(weft_get_model_state_dict(G.m, &o, full));
  if (rank0()) write_ref(full, ref);
  weft_state_dict_destroy(full);
  weft_state_dict_destroy(sd);
  g2_free(&G);
  barrier();
  if (rank0()) {
    /* the files: one wte, no lm_head */
    weft_dcp_checkpoint *ck = NULL;
    weft_dcp_tensor_info ti;
    WOK(weft_dcp_open(dir, &ck));
    WCHECK(ck && weft_dcp_tensor_find(ck, "transformer.wte.weight", &ti) == WEFT_OK &&
               weft_dcp_tensor_find(ck, "lm_head.weight", &ti) == WEFT_ERR_NOT_FOUND,
           "checkpoint: the tied weight is not saved once");
    weft_dcp_close(ck);
    weft_safetensors *f = NULL;
    weft_safetensors_info si;
    WOK(weft_safetensors_open(st, &f));
    WCHECK(f && weft_safetensors_count(f) == np &&
               weft_safetensors_find(f, "lm_head.weight", &si) == WEFT_ERR_NOT_FOUND,
           "safetensors export: %lld tensors, lm_head.weight present?",
           f ? (long long)weft_safetensors_count(f) : -1LL);
    weft_safetensors_close(f);
    weft_clear_error();
  }
}

/* Writes ref's tensors to path, the wte weight under the names in
 * `names` (1 or 2 of them); the second copy gets one element changed by
 * `delta` (0: an exact copy). */
static void write_aliased(const char *ref, const char *path, const char *const *names, int nn,
                          float delta) {
  weft_safetensors *f = NULL;
  WOK(weft_safetensors_open(ref, &f));
  if (!f) return;
  int64_t n = weft_safetensors_count(f);
  weft_safetensors_entry *e = calloc((size_t)n + 2, sizeof *e);
  weft_tensor **keep = calloc((size_t)n + 2, sizeof *keep);
  int64_t k = 0;
  for (int64_t i = 0; i < n; i++) {
    weft_safetensors_info in;
    WOK(weft_safetensors_get(f, i, &in));
    weft_tensor *t = NULL;
    WOK(weft_tensor_create(WEFT_F32, WEFT_CPU, in.ndim, in.shape, &t));
    WOK(weft_safetensors_read_tensor(f, in.name, t));
    bool wte = strcmp(in.name, "transformer.wte.weight") == 0;
    for (int c = 0; c < (wte ? nn : 1); c++) {
      weft_tensor *u = t;
      if (c > 0) {
        WOK(weft_tensor_clone(t, &u));
        ((float *)u->data)[3] += delta;
      }
      keep[k] = u;
      e[k].name = wte ? names[c] : in.name;
      e[k].dtype = WEFT_F32;
      e[k].ndim = u->ndim;
      e[k].shape = u->shape;
      e[k].data = u->data;
      k++;
    }
  }
  WOK(weft_safetensors_write(path, e, k, NULL));
  for (int64_t i = 0; i < k; i++) weft_tensor_destroy(keep[i]);
  free(keep);
  free(e);
  weft_safetensors_close(f);
}

/* A 1-rank state dict of m's parameters with the wte weight under the
 * names in `names`; the second copy has one element changed by delta. */
static weft_state_dict *aliased_sd(weft_module *m, const char *const *names, int nn, float delta) {
  weft_state_dict *sd = NULL;
  WOK(weft_state_dict_create(&sd));
  weft_param *ps[64];
  int np = 0;
  WOK(weft_module_parameters(m, ps, 64, &np));
  for (int i = 0; i < np; i++) {
    bool wte = strcmp(ps[i]->fqn, "transformer.wte.weight") == 0;
    if (!wte) {
      WOK(weft_state_dict_add_dtensor(sd, ps[i]->fqn, ps[i]->data, WEFT_LOCAL_VIEW));
      continue;
    }
    WOK(weft_state_dict_add_dtensor(sd, names[0], ps[i]->data, WEFT_LOCAL_VIEW));
    if (nn > 1) {
      WOK(weft_state_dict_add_dtensor(sd, names[1], ps[i]->data, WEFT_LOCAL_COPY));
      weft_sd_entry en;
      WOK(weft_state_dict_find(sd, names[1], &en));
      /* through the host: the local may be on the device */
      weft_tensor *loc = weft_dtensor_local(en.dtensor), *tmp = NULL, *h = NULL;
      const weft_tensor *hc = weft_worker_host_copy(loc, &tmp);
      if (hc) WOK(weft_tensor_clone(hc, &h));
      if (h) {
        ((float *)h->data)[3] += delta;
        WOK(weft_tensor_copy(loc, h));
      }
      weft_tensor_destroy(h);
      weft_tensor_destroy(tmp);
    }
  }
  return sd;
}

static bool same_param(weft_module *a, weft_module *b, const char *fqn) {
  weft_param *x = NULL, *y = NULL;
  WOK(weft_module_find_param(a, fqn, &x));
  WOK(weft_module_find_param(b, fqn, &y));
  if (!x || !y) return false;
  return weft_worker_equal_on_host(weft_dtensor_local(x->data), weft_dtensor_local(y->data));
}

/* argv: dir, st, ref, work. 1 rank: the 2-rank FSDP checkpoint and export
 * load into an unsharded GPT-2 bitwise; files and state dicts that hold
 * the tied weight as lm_head.weight only load into it; both names with
 * different values are refused naming both, the model unchanged. */
static void case_gpt2_load(void) {
  const char *dir = arg(2), *st = arg(3), *ref = arg(4), *work = arg(5);
  g2model G;
  WREQUIRE(g2_make(&G, false, 99, NULL), "model");
  /* DCP, resharded from FSDP on 2 ranks */
  weft_state_dict *sd = NULL;
  WOK(weft_state_dict_create(&sd));
  WOK(weft_get_model_state_dict(G.m, NULL, sd));
  WOK(weft_dcp_load(sd, dir, NULL, NULL));
  compare_ref(sd, ref, "dcp load on 1 rank");
  weft_state_dict_destroy(sd);
  /* safetensors */
  g2model H;
  WREQUIRE(g2_make(&H, false, 98, NULL), "model");
  WOK(weft_safetensors_import_model(H.m, st, NULL, NULL, NULL));
  g2_compare(H.m, ref, "safetensors import on 1 rank");
  g2_free(&H);
  const char *alias[1] = {"lm_head.weight"};
  const char *both[2] = {"transformer.wte.weight", "lm_head.weight"};
  /* safetensors with lm_head.weight only (strict: nothing missing or unexpected) */
  char *p1 = path2(work, "alias.safetensors"), *p2 = path2(work, "both_diff.safetensors"),
       *p3 = path2(work, "both_same.safetensors");
  write_aliased(ref, p1, alias, 1, 0.0f);
  write_aliased(ref, p2, both, 2, 0.25f);
  write_aliased(ref, p3, both, 2, 0.0f);
  WREQUIRE(g2_make(&H, false, 97, NULL), "model");
  WOK(weft_safetensors_import_model(H.m, p1, NULL, NULL, NULL));
  g2_compare(H.m, ref, "safetensors with lm_head.weight only");
  g2_free(&H);
  WREQUIRE(g2_make(&H, false, 96, NULL), "model");
  EXPECT_ERR(weft_safetensors_import_model(H.m, p2, NULL, NULL, NULL), WEFT_ERR_CORRUPT,
             "'transformer.wte.weight'", "'lm_head.weight'", "different values");
  g2model I;
  WREQUIRE(g2_make(&I, false, 96, NULL), "model");
  WCHECK(same_param(H.m, I.m, "transformer.wte.weight") && same_param(H.m, I.m, "lm_head.weight") &&
             same_param(H.m, I.m, "transformer.ln_f.bias"),
         "a refused import changed the model");
  g2_free(&I);
  WOK(weft_safetensors_import_model(H.m, p3, NULL, NULL, NULL));
  g2_compare(H.m, ref, "safetensors with both names, equal");
  g2_free(&H);
  /* DCP checkpoints of the tied weight as lm_head.weight (only / both) */
  char *d1 = path2(work, "ck_alias"), *d2 = path2(work, "ck_both");
  weft_state_dict *a1 = aliased_sd(G.m, alias, 1, 0.0f), *a2 = aliased_sd(G.m, both, 2, 0.5f);
  WOK(weft_dcp_save(a1, d1, NULL));
  WOK(weft_dcp_save(a2, d2, NULL));
  WREQUIRE(g2_make(&H, false, 95, NULL), "model");
  WOK(weft_state_dict_create(&sd));
  WOK(weft_get_model_state_dict(H.m, NULL, sd));
  WOK(weft_dcp_load(sd, d1, NULL, NULL));
  compare_ref(sd, ref, "dcp checkpoint with lm_head.weight only");
  weft_state_dict_destroy(sd);
  g2_free(&H);
  WREQUIRE(g2_make(&H, false, 94, NULL), "model");
  WREQUIRE(g2_make(&I, false, 94, NULL), "model");
  WOK(weft_state_dict_create(&sd));
  WOK(weft_get_model_state_dict(H.m, NULL, sd));
  EXPECT_ERR(weft_dcp_load(sd, d2, NULL, NULL), WEFT_ERR_CORRUPT, "'transformer.wte.weight'",
             "'lm_head.weight'", "different values");
  WCHECK(same_param(H.m, I.m, "transformer.wte.weight") &&
             same_param(H.m, I.m, "transformer.wpe.weight"),
         "a refused load changed the model");
  weft_state_dict_destroy(sd);
  /* set_model_state_dict: the alias alone, then both names */
  weft_key_list un = {0, NULL};
  WOK(weft_set_model_state_dict(H.m, a1, NULL, NULL, &un));
  WCHECK(un.count == 0, "lm_head.weight reported unexpected");
  weft_key_list_clear(&un);
  g2_compare(H.m, ref, "set_model_state_dict with lm_head.weight only");
  EXPECT_ERR(weft_set_model_state_dict(I.m, a2, NULL, NULL, NULL), WEFT_ERR_INVALID,
             "'transformer.wte.weight'", "'lm_head.weight'", "different values");
  WCHECK(!same_param(I.m, G.m, "transformer.wpe.weight"), "a refused set changed the model");
  weft_state_dict_destroy(a1);
  weft_state_dict_destroy(a2);
  g2_free(&I);
  g2_free(&H);
  g2_free(&G);
  free(p1);
  free(p2);
  free(p3);
  free(d1);
  free(d2);
}

static bool hp_equal(const weft_adamw_params *a, const weft_adamw_params *b) {
  return a->lr == b->lr && a->beta1 == b->beta1 && a->beta2 == b->beta2 && a->eps == b->eps &&
         a->weight_decay == b->weight_decay && a->amsgrad == b->amsgrad;
}

/* Loads dir into G (model and optimizer); returns the set status. */
static weft_status g2_restore(g2model *G, const char *dir) {
  weft_state_dict *sd = NULL;
  WOK(weft_state_dict_create(&sd));
  WOK(weft_get_model_state_dict(G->m, NULL, sd));
  WOK(weft_get_optimizer_state_dict(G->m, G->opt, NULL, sd));
  WOK(weft_dcp_load(sd, dir, NULL, NULL));
  WOK(weft_set_model_state_dict(G->m, sd, NULL, NULL, NULL));
  weft_status st = weft_set_optimizer_state_dict(G->m, G->opt, sd, NULL, NULL, NULL);
  weft_state_dict_destroy(sd);
  return st;
}

/* argv: dir. 2 ranks, FSDP: nanoGPT's two AdamW groups, 2 steps, save,
 * 2 more steps; a model and optimizer made with other hyper-parameters
 * restore the groups' values from the checkpoint and resume bitwise;
 * optimizers whose groups differ are refused naming the group. */
static void case_gpt2_groups(void) {
  const char *dir = arg(2);
  const int N = 4, K = 2;
  weft_adamw_params hp = WEFT_ADAMW_DEFAULT;
  hp.lr = 1e-2f;
  hp.beta2 = 0.95f;
  hp.weight_decay = 0.1f;
  g2model A;
  WREQUIRE(g2_make(&A, true, 21, &hp), "model");
  double la[4];
  for (int s = 0; s < K; s++) la[s] = g2_step(&A, s);
  weft_adamw_params saved[2];
  WOK(weft_optimizer_group_get(A.opt, 0, &saved[0]));
  WOK(weft_optimizer_group_get(A.opt, 1, &saved[1]));
  WCHECK(saved[1].weight_decay == 0.0f && saved[0].weight_decay == 0.1f, "nanoGPT groups");
  weft_state_dict *sd = NULL;
  WOK(weft_state_dict_create(&sd));
  WOK(weft_get_model_state_dict(A.m, NULL, sd));
  WOK(weft_get_optimizer_state_dict(A.m, A.opt, NULL, sd));
  int64_t ng = 0, g = -1;
  WOK(weft_state_dict_get_int(sd, "param_groups.num_groups", &ng));
  WOK(weft_state_dict_get_int(sd, "param_groups.transformer.ln_f.bias.group", &g));
  const char *betas = NULL;
  WOK(weft_state_dict_get_json(sd, "param_groups.transformer.wte.weight.betas", &betas));
  WCHECK(ng == 2 && g == 1 && betas && strstr(betas, "0.9"),
         "saved groups: %lld, ln_f.bias in %lld, "
         "betas %s",
         (long long)ng, (long long)g, betas ? betas : "?");
  WOK(weft_dcp_save(sd, dir, NULL));
  weft_state_dict_destroy(sd);
  for (int s = K; s < N; s++) la[s] = g2_step(&A, s);
  weft_param *pa[64];
  int np = 0;
  WOK(weft_module_parameters(A.m, pa, 64, &np));
  weft_tensor *fa[64] = {0};
  for (int i = 0; i < np; i++) WOK(weft_dtensor_full_tensor(pa[i]->data, &fa[i]));

  /* resume into a model and optimizer made with other hyper-parameters */
  weft_adamw_params other = hp;
  other.lr = 3e-3f;
  other.beta1 = 0.8f;
  other.beta2 = 0.99f;
  other.eps = 1e-6f;
  other.weight_decay = 0.3f;
  g2model B;
  WREQUIRE(g2_make(&B, true, 22, &other), "model");
  WOK(g2_restore(&B, dir));
  for (int k = 0; k < 2; k++) {
    weft_adamw_params got;
    WOK(weft_optimizer_group_get(B.opt, k, &got));
    WCHECK(hp_equal(&got, &saved[k]), "group %d restored as lr %g betas (%g, %g) eps %g wd %g", k,
           (double)got.lr, (double)got.beta1, (double)got.beta2, (double)got.eps,
           (double)got.weight_decay);
  }
  WCHECK(weft_optimizer_num_steps(B.opt) == K, "num_steps %lld",
         (long long)weft_optimizer_num_steps(B.opt));
  double lb[4];
  for (int s = K; s < N; s++) lb[s] = g2_step(&B, s);
  for (int s = K; s < N; s++)
    WCHECK(lb[s] == la[s], "step %d: resumed loss %.9g, straight %.9g", s, lb[s], la[s]);
  weft_param *pb[64];
  int nb = 0;
  WOK(weft_module_parameters(B.m, pb, 64, &nb));
  for (int i = 0; i < np && i < nb; i++) {
    weft_tensor *t = NULL;
    WOK(weft_dtensor_full_tensor(pb[i]->data, &t));
    WCHECK(t && fa[i] && weft_worker_equal_on_host(t, fa[i]),
           "%s: resumed run differs from the straight "
           "run",
           pb[i]->fqn);
    weft_tensor_destroy(t);
  }
  if (rank0())
    printf("gpt2 groups: resumed losses %.9f %.9f == straight %.9f %.9f; %d parameters bitwise\n",
           lb[2], lb[3], la[2], la[3], np);
  for (int i = 0; i < np; i++) weft_tensor_destroy(fa[i]);
  g2_free(&B);
  g2_free(&A);

  /* optimizers whose groups differ from the checkpoint's */
  g2model C;
  WREQUIRE(g2_make(&C, true, 23, NULL), "model");
  weft_adamw_params before;
  WOK(weft_adamw_create(C.m, &other, &C.opt)); /* one group */
  EXPECT_ERR(g2_restore(&C, dir), WEFT_ERR_INVALID, "2 parameter groups", "the optimizer 1",
             "group 1");
  WOK(weft_optimizer_group_get(C.opt, 0, &before));
  WCHECK(hp_equal(&before, &other) && weft_optimizer_num_steps(C.opt) == 0,
         "a refused restore changed the optimizer");
  weft_optimizer_destroy(C.opt);
  C.opt = NULL;
  /* two groups, ln_f.weight moved to the decay group */
  weft_param *ps[64], *g0[64], *g1[64];
  int n = 0, n0 = 0, n1 = 0;
  WOK(weft_module_parameters(C.m, ps, 64, &n));
  for (int i = 0; i < n; i++) {
    bool moved = strcmp(ps[i]->fqn, "transformer.ln_f.weight") == 0;
    if (ps[i]->spec.ndim >= 2 || moved)
      g0[n0++] = ps[i];
    else
      g1[n1++] = ps[i];
  }
  weft_adamw_group grp[3] = {{g0, n0, other}, {g1, n1, other}, {NULL, 0, other}};
  WOK(weft_adamw_create_groups(C.m, grp, 2, &C.opt));
  EXPECT_ERR(g2_restore(&C, dir), WEFT_ERR_INVALID, "'transformer.ln_f.weight'", "group 1",
             "group 0");
  weft_optimizer_destroy(C.opt);
  C.opt = NULL;
  /* three groups (the third empty) */
  grp[1].nparams = n1;
  WOK(weft_adamw_create_groups(C.m, grp, 3, &C.opt));
  EXPECT_ERR(g2_restore(&C, dir), WEFT_ERR_INVALID, "2 parameter groups", "the optimizer 3",
             "group 2");
  g2_free(&C);
}
#endif

static const weft_worker_case cases[] = {
    {"save_all", case_save_all},
    {"load_all", case_load_all},
    {"fault_prep", case_fault_prep},
    {"fault_save", case_fault_save},
    {"fault_check", case_fault_check},
    {"corrupt", case_corrupt},
    {"failed_save", case_failed_save},
    {"async", case_async},
    {"tool_prep", case_tool_prep},
    {"xdev", case_xdev},
#ifdef HAVE_MODELS
    {"resume", case_resume},
    {"sd_opts", case_sd_opts},
    {"st_export", case_st_export},
    {"st_import_py", case_st_import_py},
#endif
#if defined(DCP_TEST_HAVE_FSDP) && defined(DCP_TEST_HAVE_GPT2)
    {"gpt2_save", case_gpt2_save},
    {"gpt2_load", case_gpt2_load},
    {"gpt2_groups", case_gpt2_groups},
#endif
    {NULL, NULL},
};

int main(int argc, char **argv) { return weft_worker_main(argc, argv, cases); }
