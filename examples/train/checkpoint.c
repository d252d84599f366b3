/* examples/train/checkpoint.c — weft-train's checkpoints: a DCP folder
 * (dcp.h) holds the model, the optimizer, the step, the model's config and
 * family ("llama" or "gpt2"); --resume reads the config first (a checkpoint
 * of another model is an error, not a crash), then loads the tensors in
 * place, resharded onto this run's mesh; --save writes one at the end and,
 * with --save-every, asynchronously between steps (training goes on while
 * it writes; the next save or the end waits for it); --export-safetensors
 * writes the model as one safetensors file. Every function is collective
 * over the world, and dcp's errors are the same on every rank: rank 0
 * prints them.
 *
 * --keep-checkpoints K: --save DIR is always the newest committed
 * checkpoint (what --resume DIR loads). Before a save replaces it, rank 0
 * keeps DIR's committed checkpoint as the sibling DIR.step-N (N: its
 * train.step): hard links to its metadata.json and data files (a copy
 * where the file system has no links), made as DIR.step-N.tmp and renamed
 * into place. A DCP save into DIR commits by renaming a new metadata.json
 * over the old one and then unlinks the old data files, which the sibling
 * still links. After the new save has committed (at its async wait, or
 * after the last, synchronous save) rank 0 removes the siblings beyond the
 * K - 1 highest steps (never the --resume checkpoint). A save is refused
 * when a tensor of the state holds NaN or Inf. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llama.h"
#include "train_internal.h"

static const char *family_of(const run_state *s) { return s->o->gpt2 ? "gpt2" : "llama"; }

/* The state dict of a checkpoint: model, optimizer, step, config, family. */
static weft_status fill_state_dict(run_state *s, weft_state_dict *sd, int64_t step) {
  WEFT_CHECK(weft_get_model_state_dict(s->model, NULL, sd));
  WEFT_CHECK(weft_get_optimizer_state_dict(s->model, s->opt, NULL, sd));
  WEFT_CHECK(weft_state_dict_set_int(sd, "train.step", step));
  WEFT_CHECK(weft_state_dict_set_llama_config(sd, "model.config", &s->cfg));
  WEFT_CHECK(weft_state_dict_set_string(sd, "model.family", family_of(s)));
  return WEFT_OK;
}

/* The header of a checkpoint (config, step, family; older checkpoints have
 * no family: Llama). */
typedef struct ckpt_header {
  weft_llama_config cfg;
  int64_t step;
  char family[16];
} ckpt_header;

static weft_status read_header(const char *dir, ckpt_header *h) {
  weft_state_dict *sd = NULL;
  WEFT_CHECK(weft_state_dict_create(&sd));
  weft_llama_config z = WEFT_LLAMA_CONFIG_INIT;
  h->cfg = z;
  h->step = 0;
  snprintf(h->family, sizeof h->family, "llama");
  weft_status st = weft_state_dict_set_llama_config(sd, "model.config", &z);
  if (st == WEFT_OK) st = weft_state_dict_set_int(sd, "train.step", 0);
  if (st == WEFT_OK) st = weft_state_dict_set_string(sd, "model.family", "llama");
  weft_dcp_opts lo = WEFT_DCP_OPTS_INIT;
  lo.allow_partial = true;
  if (st == WEFT_OK) st = weft_dcp_load(sd, dir, &lo, NULL);
  if (st == WEFT_OK) st = weft_state_dict_get_llama_config(sd, "model.config", &h->cfg);
  if (st == WEFT_OK) st = weft_state_dict_get_int(sd, "train.step", &h->step);
  const char *fam = NULL;
  if (st == WEFT_OK) st = weft_state_dict_get_string(sd, "model.family", &fam);
  if (st == WEFT_OK) snprintf(h->family, sizeof h->family, "%s", fam);
  weft_state_dict_destroy(sd);
  return st;
}

/* The checkpoint's model against this run's (alike on every rank). */
static int check_header(const run_state *s, const ckpt_header *h) {
  const char *dir = s->o->resume_dir;
  const weft_llama_config *c = &s->cfg, *k = &h->cfg;
  /* a value read from a file has a range like a flag: a train.step of -7
   * resumed "at step -7" and corrupted the heap */
  if (h->step < 0 || h->step > 1000000000LL)
    return train_fail_all(
        "--resume %s: metadata.json value 'train.step' = %lld is outside [0, "
        "10^9] (a corrupt or foreign checkpoint)",
        dir, (long long)h->step);
  if (strcmp(h->family, family_of(s)) != 0)
    return train_fail_all("--resume %s: a checkpoint of a %s model; this run trains a %s model",
                          dir, h->family, family_of(s));
  if (k->dim != c->dim || k->n_layers != c->n_layers || k->n_heads != c->n_heads ||
      k->n_kv_heads != c->n_kv_heads || k->ffn_dim != c->ffn_dim || k->vocab != c->vocab)
    return train_fail_all(
        "--resume %s: checkpoint of another model (D=%lld L=%lld H=%lld Hkv=%lld F=%lld V=%lld; "
        "this run: D=%lld L=%lld H=%lld Hkv=%lld F=%lld V=%lld)",
        dir, (long long)k->dim, (long long)k->n_layers, (long long)k->n_heads,
        (long long)k->n_kv_heads, (long long)k->ffn_dim, (long long)k->vocab, (long long)c->dim,
        (long long)c->n_layers, (long long)c->n_heads, (long long)c->n_kv_heads,
        (long long)c->ffn_dim, (long long)c->vocab);
  return 0;
}

/* The tensors are loaded in place (views); the optimizer's step counts and
 * learning rate are values: applied after. */
static weft_status load_state(run_state *s) {
  weft_state_dict *sd = NULL;
  WEFT_CHECK(weft_state_dict_create(&sd));
  weft_status st = fill_state_dict(s, sd, 0);
  if (st == WEFT_OK) st = weft_dcp_load(sd, s->o->resume_dir, NULL, NULL);
  if (st == WEFT_OK) st = weft_set_optimizer_state_dict(s->model, s->opt, sd, NULL, NULL, NULL);
  weft_state_dict_destroy(sd);
  return st;
}

/* Rank 0 makes the --save directory (when absent) and writes, syncs and
 * removes a small file in it; any rank's failure is every rank's. Issue
 * 34: an unwritable or non-directory --save failed only at the end of the
 * run, after all its steps. */
int train_save_check(run_state *s) {
  const char *dir = s->o->save_dir;
  char err[1024] = "";
  bool bad = false;
  if (s->rank == 0) {
    struct stat sb;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
      bad = true;
      snprintf(err, sizeof err, "--save %s: cannot create the directory: %s", dir, strerror(errno));
    } else if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
      bad = true;
      snprintf(err, sizeof err, "--save %s: not a directory", dir);
    } else {
      char probe[4096];
      snprintf(probe, sizeof probe, "%s/.weft-train-write-test-%ld", dir, (long)getpid());
      int fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      static const char block[4096];
      if (fd < 0 || write(fd, block, sizeof block) != (ssize_t)sizeof block || fsync(fd) != 0) {
        bad = true;
        snprintf(err, sizeof err, "--save %s: cannot write there: %s", dir, strerror(errno));
      }
      if (fd >= 0) close(fd);
      unlink(probe);
    }
  }
  return train_agree_fail(bad, err) ? 2 : 0;
}

int train_resume(run_state *s, int64_t *start_step) {
  const char *dir = s->o->resume_dir;
  ckpt_header h;
  if (read_header(dir, &h) != WEFT_OK)
    return train_fail_all("--resume %s: %s", dir, weft_last_error());
  int rc = check_header(s, &h);
  if (rc) return rc;
  if (load_state(s) != WEFT_OK) return train_fail_all("--resume %s: %s", dir, weft_last_error());
  *start_step = h.step;
  if (s->rank == 0 && !s->o->silent)
    printf("resumed from %s at step %lld\n", dir, (long long)h.step);
  return 0;
}

/* ------------------------------------------- the last K checkpoints */

/* "<a>/<b>" or "<a><b>" (sep NULL), malloc'ed; NULL when out of memory. */
static char *cat3(const char *a, const char *sep, const char *b) {
  size_t n = strlen(a) + (sep ? strlen(sep) : 0) + strlen(b) + 1;
  char *p = malloc(n);
  if (p) snprintf(p, n, "%s%s%s", a, sep ? sep : "", b);
  return p;
}

/* The --save path without trailing slashes (its siblings are named after
 * it), malloc'ed. */
static char *save_base(const char *dir) {
  char *b = strdup(dir);
  if (!b) return NULL;
  size_t n = strlen(b);
  while (n > 1 && b[n - 1] == '/') b[--n] = '\0';
  return b;
}

/* Removes a checkpoint directory (plain files only); absent is fine. */
static int remove_ckpt(const char *dir, char *err, size_t cap) {
  DIR *d = opendir(dir);
  if (!d) {
    if (errno == ENOENT) return 0;
    return train_perr(err, cap, "cannot open '%s': %s", dir, strerror(errno));
  }
  int rc = 0;
  struct dirent *e;
  while (!rc && (e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char *f = cat3(dir, "/", e->d_name);
    if (!f || (unlink(f) != 0 && errno != ENOENT))
      rc = train_perr(err, cap, "cannot remove '%s': %s", f ? f : e->d_name,
                      f ? strerror(errno) : "out of memory");
    free(f);
  }
  closedir(d);
  if (!rc && rmdir(dir) != 0 && errno != ENOENT)
    rc = train_perr(err, cap, "cannot remove '%s': %s", dir, strerror(errno));
  return rc;
}

/* A copy of src as dst (where dst cannot be a hard link of it). */
static int copy_file(const char *src, const char *dst, char *err, size_t cap) {
  int in = open(src, O_RDONLY | O_CLOEXEC);
  if (in < 0) return train_perr(err, cap, "cannot open '%s': %s", src, strerror(errno));
  int out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (out < 0) {
    int e = errno;
    close(in);
    return train_perr(err, cap, "cannot create '%s': %s", dst, strerror(e));
  }
  static char buf[1 << 16];
  int rc = 0;
  for (;;) {
    ssize_t n = read(in, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      rc = train_perr(err, cap, "cannot read '%s': %s", src, strerror(errno));
      break;
    }
    for (ssize_t at = 0; at < n && !rc;) {
      ssize_t w = write(out, buf + at, (size_t)(n - at));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) rc = train_perr(err, cap, "cannot write '%s': %s", dst, strerror(errno));
      at += w > 0 ? w : 0;
    }
    if (rc) break;
  }
  if (!rc && fsync(out) != 0) rc = train_perr(err, cap, "fsync '%s': %s", dst, strerror(errno));
  close(in);
  if (close(out) != 0 && !rc) rc = train_perr(err, cap, "close '%s': %s", dst, strerror(errno));
  return rc;
}

/* dir/name as to/name: a hard link, or a copy where links are refused. */
static int keep_file(const char *dir, const char *to, const char *name, char *err, size_t cap) {
  char *src = cat3(dir, "/", name), *dst = cat3(to, "/", name);
  int rc = 0;
  if (!src || !dst)
    rc = train_perr(err, cap, "out of memory");
  else if (link(src, dst) != 0) {
    if (errno == EXDEV || errno == EPERM || errno == EMLINK || errno == ENOTSUP ||
        errno == EOPNOTSUPP || errno == ENOSYS)
      rc = copy_file(src, dst, err, cap);
    else
      rc = train_perr(err, cap, "cannot link '%s' as '%s': %s", src, dst, strerror(errno));
  }
  free(src);
  free(dst);
  return rc;
}

/* dir's committed checkpoint (its metadata.json), parsed; NULL when there
 * is none or it does not parse (then there is nothing to keep). */
static cJSON *read_committed(const char *dir) {
  char *path = cat3(dir, "/", "metadata.json");
  FILE *f = path ? fopen(path, "rb") : NULL;
  free(path);
  if (!f) return NULL;
  char *text = NULL;
  long n = -1;
  if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0)
    text = malloc((size_t)n + 1);
  if (text && fread(text, 1, (size_t)n, f) == (size_t)n) {
    text[n] = '\0';
  } else {
    free(text);
    text = NULL;
  }
  fclose(f);
  cJSON *j = text ? cJSON_Parse(text) : NULL;
  free(text);
  return j;
}

/* A plain file name (no '/', not "." or ".."). */
static bool plain_name(const char *n) {
  return n && *n && !strchr(n, '/') && strcmp(n, ".") != 0 && strcmp(n, "..") != 0;
}

/* Rank 0, before a save into base: base's committed checkpoint becomes
 * base.step-N (hard links; base itself is untouched and stays committed). */
static int keep_previous(const char *base, char *err, size_t cap) {
  cJSON *m = read_committed(base);
  if (!m) return 0;
  const cJSON *files = cJSON_GetObjectItemCaseSensitive(m, "files");
  const cJSON *step = cJSON_GetObjectItemCaseSensitive(
      cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(m, "values"), "train.step"),
      "value");
  long long n = cJSON_IsString(step) ? strtoll(step->valuestring, NULL, 10) : 0;
  bool ok = cJSON_IsArray(files) && n >= 0;
  const cJSON *f;
  cJSON_ArrayForEach(f, files) {
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(f, "name");
    ok = ok && cJSON_IsString(nm) && plain_name(nm->valuestring);
  }
  if (!ok) { /* not a checkpoint weft can load: nothing worth keeping */
    cJSON_Delete(m);
    return 0;
  }
  char suffix[48], tsuffix[48];
  snprintf(suffix, sizeof suffix, ".step-%lld", n);
  snprintf(tsuffix, sizeof tsuffix, ".step-%lld.tmp", n);
  char *to = cat3(base, NULL, suffix), *tmp = cat3(base, NULL, tsuffix);
  int rc = !to || !tmp ? train_perr(err, cap, "out of memory") : 0;
  if (!rc) rc = remove_ckpt(tmp, err, cap); /* left by an interrupted run */
  if (!rc && mkdir(tmp, 0755) != 0)
    rc = train_perr(err, cap, "cannot create '%s': %s", tmp, strerror(errno));
  cJSON_ArrayForEach(f, files) {
    if (rc) break;
    rc = keep_file(base, tmp, cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring, err, cap);
  }
  if (!rc) rc = keep_file(base, tmp, "metadata.json", err, cap); /* last: it commits */
  /* an older base.step-N of the same step is superseded by base's */
  if (!rc) rc = remove_ckpt(to, err, cap);
  if (!rc && rename(tmp, to) != 0)
    rc = train_perr(err, cap, "cannot rename '%s' to '%s': %s", tmp, to, strerror(errno));
  free(to);
  free(tmp);
  cJSON_Delete(m);
  return rc;
}

static int cmp_desc(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x < y) - (x > y);
}

/* Rank 0, after a save into base committed: removes the siblings
 * base.step-N beyond the keep - 1 highest N (never the one --resume read). */
static int prune(const char *base, int64_t keep, const char *resume_dir, char *err, size_t cap) {
  char *parent = strdup(base);
  if (!parent) return train_perr(err, cap, "out of memory");
  char *slash = strrchr(parent, '/');
  const char *name = slash ? base + (slash - parent) + 1 : base;
  if (!slash)
    snprintf(parent, strlen(parent) + 1, "."); /* "ck": in . */
  else if (slash == parent)
    parent[1] = '\0'; /* "/ck": in / */
  else
    *slash = '\0';
  size_t nl = strlen(name);
  DIR *d = opendir(parent);
  if (!d) {
    int rc = train_perr(err, cap, "cannot list '%s': %s", parent, strerror(errno));
    free(parent);
    return rc;
  }
  int64_t *steps = NULL;
  size_t ns = 0, cs = 0;
  int rc = 0;
  struct dirent *e;
  while (!rc && (e = readdir(d))) {
    const char *p = e->d_name;
    if (strncmp(p, name, nl) != 0 || strncmp(p + nl, ".step-", 6) != 0) continue;
    p += nl + 6;
    if (!*p || strspn(p, "0123456789") != strlen(p) || strlen(p) > 18) continue;
    if (ns == cs) {
      cs = cs ? 2 * cs : 16;
      int64_t *t = realloc(steps, cs * sizeof *t);
      if (!t) {
        rc = train_perr(err, cap, "out of memory");
        break;
      }
      steps = t;
    }
    steps[ns++] = strtoll(p, NULL, 10);
  }
  closedir(d);
  free(parent);
  if (ns) qsort(steps, ns, sizeof *steps, cmp_desc);
  struct stat rs;
  bool have_resume = resume_dir && stat(resume_dir, &rs) == 0;
  for (size_t i = (size_t)(keep - 1); !rc && i < ns; i++) {
    char suffix[48];
    snprintf(suffix, sizeof suffix, ".step-%lld", (long long)steps[i]);
    char *sib = cat3(base, NULL, suffix);
    struct stat ss;
    if (!sib)
      rc = train_perr(err, cap, "out of memory");
    else if (!(have_resume && stat(sib, &ss) == 0 && ss.st_dev == rs.st_dev &&
               ss.st_ino == rs.st_ino))
      rc = remove_ckpt(sib, err, cap);
    free(sib);
  }
  free(steps);
  return rc;
}

/* One of the above on rank 0 (which), agreed over the world. Collective. */
static int on_rank0(run_state *s, bool before_save) {
  char err[1024] = "";
  int bad = 0;
  char *base = NULL;
  if (s->rank == 0) {
    base = save_base(s->o->save_dir);
    if (!base)
      bad = train_perr(err, sizeof err, "out of memory");
    else if (before_save)
      bad = s->o->keep_checkpoints > 1 ? keep_previous(base, err, sizeof err) : 0;
    else
      bad = prune(base, s->o->keep_checkpoints, s->o->resume_dir, err, sizeof err);
  }
  free(base);
  char msg[1200];
  snprintf(msg, sizeof msg, "--save %s: %s: %s", s->o->save_dir,
           before_save ? "keeping the previous checkpoint" : "removing older checkpoints", err);
  return train_agree_fail(bad != 0, msg) ? 2 : 0;
}

/* Every tensor of the state dict is finite (this rank's shards; agreed).
 * Collective. */
static int check_finite(run_state *s, const weft_state_dict *sd, int64_t step) {
  char msg[512] = "";
  bool bad = false;
  for (int64_t i = 0; !bad && i < weft_state_dict_count(sd); i++) {
    weft_sd_entry e;
    if (weft_state_dict_get(sd, i, &e) != WEFT_OK || e.kind == WEFT_SD_VALUE) continue;
    const weft_tensor *t = e.kind == WEFT_SD_DTENSOR ? weft_dtensor_local(e.dtensor) : e.tensor;
    double sum = 0; /* accumulated in double: finite unless an element is not */
    if (!t || !weft_dtype_is_float(t->dtype) || weft_tensor_numel(t) == 0) continue;
    if (weft_reduce_all(t, WEFT_REDUCE_SUM, &sum) != WEFT_OK) {
      snprintf(msg, sizeof msg, "--save %s: %s", s->o->save_dir, weft_last_error());
      bad = true;
    } else if (!isfinite(sum)) {
      snprintf(msg, sizeof msg,
               "--save %s: step %lld: tensor '%s' holds NaN or Inf; not saved (the previous "
               "checkpoint is kept)",
               s->o->save_dir, (long long)step, e.name);
      bad = true;
    }
  }
  return train_agree_fail(bad, msg) ? 2 : 0;
}

/* A failed save (its status agreed by DCP on every rank; the save removed
 * its own files and left the previous checkpoint as it was): an error, or
 * with --save-errors continue a warning on rank 0 and 0, so the run goes
 * on (not for the last save: the run would end without its checkpoint). */
static int save_failed(run_state *s, bool last) {
  if (!s->o->save_errors_continue || last)
    return train_fail_all("--save %s: %s", s->o->save_dir, weft_last_error());
  s->failed_saves++;
  if (s->rank == 0) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", weft_last_error());
    msg[strcspn(msg, "\n")] = '\0';
    fprintf(stderr,
            "weft-train: warning: --save %s failed, the previous checkpoint stays; training goes "
            "on (--save-errors continue): %s\n",
            s->o->save_dir, msg);
    fflush(stderr);
  }
  return 0;
}

int train_save_wait(run_state *s) {
  if (!s->pending_save) return 0;
  weft_status st = weft_dcp_async_wait(s->pending_save);
  s->pending_save = NULL;
  if (st != WEFT_OK) return save_failed(s, false);
  return on_rank0(s, false); /* committed: the older ones can go */
}

int train_save_if_due(run_state *s, int64_t done) {
  const train_opts *o = s->o;
  bool last = done == o->steps;
  if (s->stopped) return 0; /* the guard stopped the run: nothing is saved after it */
  if (!o->save_dir || !((o->save_every > 0 && done % o->save_every == 0) || last)) return 0;
  int rc = train_save_wait(s);
  if (rc) return rc;
  weft_state_dict *sd = NULL;
  weft_status st = weft_state_dict_create(&sd);
  if (st == WEFT_OK) st = fill_state_dict(s, sd, done);
  if (st == WEFT_OK && ((rc = check_finite(s, sd, done)) || (rc = on_rank0(s, true)))) {
    weft_state_dict_destroy(sd);
    return rc;
  }
  if (st == WEFT_OK) {
    if (last)
      st = weft_dcp_save(sd, o->save_dir, NULL);
    else
      st = weft_dcp_async_save(sd, o->save_dir, NULL, &s->pending_save);
  }
  weft_state_dict_destroy(sd);
  if (st != WEFT_OK) return save_failed(s, last);
  return last ? on_rank0(s, false) : 0;
}

int train_export(run_state *s) {
  const char *path = s->o->export_path;
  if (!path || s->stopped) return 0;
  if (!s->o->export_hf) {
    if (weft_safetensors_export_model(s->model, path, WEFT_F32) != WEFT_OK)
      return train_fail_all("--export-safetensors %s: %s", path, weft_last_error());
    return 0;
  }
  /* --hf: weft's layout into a file beside the target (rank 0 writes
   * both), converted into transformers' layout, then removed */
  char tmp[1100];
  snprintf(tmp, sizeof tmp, "%s.weft-%d", path, (int)getpid());
  if (weft_safetensors_export_model(s->model, tmp, WEFT_F32) != WEFT_OK)
    return train_fail_all("--export-safetensors %s: %s", path, weft_last_error());
  bool bad = false;
  char msg[1300] = "";
  if (weft_world_rank() == 0) {
    bad = (s->o->gpt2 ? weft_gpt2_weft_to_hf(tmp, path)
                      : weft_llama_weft_to_hf(tmp, path, &s->cfg)) != WEFT_OK;
    if (bad) snprintf(msg, sizeof msg, "--export-safetensors %s --hf: %s", path, weft_last_error());
    remove(tmp);
  }
  return train_agree_fail(bad, msg) ? 2 : 0;
}
