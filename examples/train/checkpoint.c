/* examples/train/checkpoint.c — weft-train's checkpoints: a DCP folder
 * (dcp.h) holds the model, the optimizer, the step, the model's config and
 * family ("llama" or "gpt2"); --resume reads the config first (a checkpoint
 * of another model is an error, not a crash), then loads the tensors in
 * place, resharded onto this run's mesh; --save writes one at the end and,
 * with --save-every, asynchronously between steps (training goes on while
 * it writes; the next save or the end waits for it); --export-safetensors
 * writes the model as one safetensors file. Every function is collective
 * over the world, and dcp's errors are the same on every rank: rank 0
 * prints them. */
#include <stdio.h>
#include <string.h>

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

int train_save_wait(run_state *s) {
  if (!s->pending_save) return 0;
  weft_status st = weft_dcp_async_wait(s->pending_save);
  s->pending_save = NULL;
  if (st != WEFT_OK) return train_fail_all("--save %s: %s", s->o->save_dir, weft_last_error());
  return 0;
}

int train_save_if_due(run_state *s, int64_t done) {
  const train_opts *o = s->o;
  bool last = done == o->steps;
  if (!o->save_dir || !((o->save_every > 0 && done % o->save_every == 0) || last)) return 0;
  int rc = train_save_wait(s);
  if (rc) return rc;
  weft_state_dict *sd = NULL;
  weft_status st = weft_state_dict_create(&sd);
  if (st == WEFT_OK) st = fill_state_dict(s, sd, done);
  if (st == WEFT_OK) {
    if (last)
      st = weft_dcp_save(sd, o->save_dir, NULL);
    else
      st = weft_dcp_async_save(sd, o->save_dir, NULL, &s->pending_save);
  }
  weft_state_dict_destroy(sd);
  if (st != WEFT_OK) return train_fail_all("--save %s: %s", o->save_dir, weft_last_error());
  return 0;
}

int train_export(run_state *s) {
  const char *path = s->o->export_path;
  if (!path) return 0;
  if (weft_safetensors_export_model(s->model, path, WEFT_F32) != WEFT_OK)
    return train_fail_all("--export-safetensors %s: %s", path, weft_last_error());
  return 0;
}
