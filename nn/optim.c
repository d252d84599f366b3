/* nn/optim.c — AdamW and SGD over a module's parameters (local shards,
 * torch.optim semantics through layers.h's kernels), the warmup + cosine
 * learning-rate schedule and clip_grad_norm_ over any meshes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn_internal.h"

typedef enum opt_kind { OPT_ADAMW, OPT_SGD } opt_kind;

typedef struct opt_entry {
  weft_param *p;
  weft_dtensor_spec spec; /* the data's spec at creation */
  weft_dtensor *s[3];     /* AdamW: exp_avg, exp_avg_sq, max_exp_avg_sq; SGD: momentum_buffer */
  int64_t step;
  int group;  /* index into the optimizer's groups (0 without groups) */
  bool taken; /* weft_optimizer_step: already in a multi-tensor call this step */
} opt_entry;

/* weft_optimizer.magic: live, or destroyed (weft_optimizer_destroy frees
 * the state and keeps the emptied struct, so a second destroy or a step on
 * it is an error, not a use of freed memory). */
#define OPT_LIVE 0x4f505431u /* "OPT1" */
#define OPT_DEAD 0x44454144u /* "DEAD" */

struct weft_optimizer {
  uint32_t magic;
  struct weft_optimizer *dead; /* next destroyed optimizer (kept reachable) */
  opt_kind kind;
  weft_adamw_params adam;
  weft_sgd_params sgd;
  weft_adamw_params *groups; /* AdamW parameter groups (NULL: one group, `adam`) */
  int ngroups;
  opt_entry *e;
  int n;
  /* flattened named state, in entry order */
  char **names;
  weft_dtensor **states;
  int nstates;
  int64_t steps;
  bool has_sched;
  weft_lr_schedule sched;
};

/* Destroyed optimizers: emptied structs, never reused (a handle kept by
 * mistake then still finds OPT_DEAD). */
static weft_optimizer *destroyed_opts;

weft_status weft_optimizer_destroy(weft_optimizer *o) {
  if (!o) return WEFT_OK;
  if (o->magic == OPT_DEAD)
    return weft_error(WEFT_ERR_INVALID,
                      "weft_optimizer_destroy: this optimizer was already destroyed (twice?)");
  for (int i = 0; i < o->n; i++)
    for (int k = 0; k < 3; k++) weft_dtensor_destroy(o->e[i].s[k]);
  for (int i = 0; i < o->nstates; i++) free(o->names[i]);
  free(o->names);
  free(o->states);
  free(o->e);
  free(o->groups);
  *o = (weft_optimizer){.magic = OPT_DEAD, .dead = destroyed_opts};
  destroyed_opts = o;
  return WEFT_OK;
}

static weft_status add_state(weft_optimizer *o, opt_entry *e, int k, const char *what) {
  const weft_dtensor_spec *s = &e->spec;
  /* next to the parameter: on its device, or on the host when offloaded */
  WEFT_CHECK(weft_dtensor_zeros_like(e->p->data, s->dtype, &e->s[k]));
  size_t len = strlen(e->p->fqn) + strlen(what) + 16;
  char *name = malloc(len);
  if (!name) return weft_error(WEFT_ERR_OOM, "state name");
  snprintf(name, len, "state.%s.%s", e->p->fqn, what);
  o->names[o->nstates] = name;
  o->states[o->nstates++] = e->s[k];
  return WEFT_OK;
}

static weft_status opt_create(weft_module *root, opt_kind kind, weft_optimizer **out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  *out = NULL;
  if (!root) return weft_error(WEFT_ERR_INVALID, "root is NULL");
  int count;
  WEFT_CHECK(weft_module_parameters(root, NULL, 0, &count));
  weft_optimizer *o = calloc(1, sizeof *o);
  if (o) o->magic = OPT_LIVE;
  weft_param **ps = calloc((size_t)(count ? count : 1), sizeof *ps);
  weft_status st = WEFT_OK;
  if (!o || !ps) {
    free(o);
    free(ps);
    return weft_error(WEFT_ERR_OOM, "optimizer");
  }
  o->kind = kind;
  WEFT_CHECK_GOTO(weft_module_parameters(root, ps, count, &count), st, fail);
  o->e = calloc((size_t)(count ? count : 1), sizeof *o->e);
  o->names = calloc((size_t)(3 * count + 1), sizeof *o->names);
  o->states = calloc((size_t)(3 * count + 1), sizeof *o->states);
  if (!o->e || !o->names || !o->states) {
    st = weft_error(WEFT_ERR_OOM, "optimizer state");
    goto fail;
  }
  for (int i = 0; i < count; i++) {
    weft_param *p = ps[i];
    if (!p->requires_grad) continue;
    if (!p->data) {
      st = weft_error(WEFT_ERR_STATE,
                      "optimizer: parameter '%s' has no storage (initialise or load the model, "
                      "and shard it, before creating the optimizer)",
                      p->fqn);
      goto fail;
    }
    opt_entry *e = &o->e[o->n++];
    e->p = p;
    e->spec = *weft_dtensor_get_spec(p->data);
    if (e->spec.dtype != WEFT_F32) {
      st = weft_error(WEFT_ERR_UNSUPPORTED, "optimizer: parameter '%s' is %s (f32 only)", p->fqn,
                      weft_dtype_name(e->spec.dtype));
      goto fail;
    }
  }
  *out = o;
  free(ps);
  return WEFT_OK;
fail:
  free(ps);
  weft_optimizer_destroy(o);
  return weft_error_trace(st, __func__);
}

static weft_status adamw_check(const weft_adamw_params *hp) {
  if (!hp) return weft_error(WEFT_ERR_INVALID, "hyper-parameters are NULL");
  if (!(hp->lr >= 0) || !(hp->eps >= 0) || !(hp->beta1 >= 0 && hp->beta1 < 1) ||
      !(hp->beta2 >= 0 && hp->beta2 < 1) || !(hp->weight_decay >= 0))
    return weft_error(WEFT_ERR_INVALID,
                      "AdamW: need lr >= 0, eps >= 0, 0 <= betas < 1, weight_decay >= 0 (got lr "
                      "%g, betas (%g, %g), eps %g, wd %g)",
                      (double)hp->lr, (double)hp->beta1, (double)hp->beta2, (double)hp->eps,
                      (double)hp->weight_decay);
  return WEFT_OK;
}

/* The hyper-parameters of AdamW group g (the only one without groups). */
static const weft_adamw_params *group_hp(const weft_optimizer *o, int g) {
  return o->groups ? &o->groups[g] : &o->adam;
}

/* exp_avg, exp_avg_sq (and max_exp_avg_sq where the group has amsgrad) of
 * every entry; on failure the caller destroys o. */
static weft_status adamw_add_states(weft_optimizer *o) {
  for (int i = 0; i < o->n; i++) {
    WEFT_CHECK(add_state(o, &o->e[i], 0, "exp_avg"));
    WEFT_CHECK(add_state(o, &o->e[i], 1, "exp_avg_sq"));
    if (group_hp(o, o->e[i].group)->amsgrad)
      WEFT_CHECK(add_state(o, &o->e[i], 2, "max_exp_avg_sq"));
  }
  return WEFT_OK;
}

weft_status weft_adamw_create(weft_module *root, const weft_adamw_params *hp,
                              weft_optimizer **out) {
  WEFT_CHECK(adamw_check(hp));
  weft_optimizer *o;
  WEFT_CHECK(opt_create(root, OPT_ADAMW, &o));
  o->adam = *hp;
  weft_status st = adamw_add_states(o);
  if (st) {
    weft_optimizer_destroy(o);
    return weft_error_trace(st, __func__);
  }
  *out = o;
  return WEFT_OK;
}

weft_status weft_adamw_create_decay_groups(weft_module *root, const weft_adamw_params *hp,
                                           bool decay_embeddings, weft_optimizer **out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  *out = NULL;
  if (!root || !hp) return weft_error(WEFT_ERR_INVALID, "AdamW decay groups: root or hp is NULL");
  int n = 0;
  WEFT_CHECK(weft_module_parameters(root, NULL, 0, &n));
  weft_param **all = calloc((size_t)n + 1, sizeof *all);
  weft_param **decay = calloc((size_t)n + 1, sizeof *decay);
  weft_param **rest = calloc((size_t)n + 1, sizeof *rest);
  weft_status st = all && decay && rest ? WEFT_OK : weft_error(WEFT_ERR_OOM, "AdamW decay groups");
  int nd = 0, nr = 0;
  if (st == WEFT_OK) st = weft_module_parameters(root, all, n, &n);
  for (int i = 0; st == WEFT_OK && i < n; i++) {
    if (!all[i]->requires_grad) continue;
    bool embedding = weft_module_get_kind(all[i]->module) == WEFT_MODULE_EMBEDDING;
    if (all[i]->spec.ndim >= 2 && (decay_embeddings || !embedding))
      decay[nd++] = all[i];
    else
      rest[nr++] = all[i];
  }
  if (st == WEFT_OK) {
    weft_adamw_group groups[2] = {{decay, nd, *hp}, {rest, nr, *hp}};
    groups[1].hp.weight_decay = 0.0f;
    st = weft_adamw_create_groups(root, groups, 2, out);
  }
  free(all);
  free(decay);
  free(rest);
  return st;
}

weft_status weft_adamw_create_groups(weft_module *root, const weft_adamw_group *groups, int ngroups,
                                     weft_optimizer **out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  *out = NULL;
  if (!groups || ngroups < 1) return weft_error(WEFT_ERR_INVALID, "AdamW: no parameter groups");
  for (int g = 0; g < ngroups; g++) {
    weft_status st = adamw_check(&groups[g].hp);
    if (st) return weft_error(st, "AdamW parameter group %d: %s", g, weft_last_error());
  }
  weft_optimizer *o;
  WEFT_CHECK(opt_create(root, OPT_ADAMW, &o));
  weft_status st = WEFT_OK;
  o->adam = groups[0].hp;
  o->groups = malloc((size_t)ngroups * sizeof *o->groups);
  if (!o->groups) st = weft_error(WEFT_ERR_OOM, "optimizer groups");
  for (int g = 0; !st && g < ngroups; g++) o->groups[g] = groups[g].hp;
  o->ngroups = ngroups;
  /* each entry's group: the one listing it (exactly one) */
  for (int i = 0; !st && i < o->n; i++) {
    int found = -1;
    for (int g = 0; g < ngroups && !st; g++)
      for (int j = 0; j < groups[g].nparams; j++)
        if (groups[g].params[j] == o->e[i].p) {
          if (found >= 0)
            st = weft_error(WEFT_ERR_INVALID,
                            "AdamW: parameter '%s' is in groups %d and %d (one group each)",
                            o->e[i].p->fqn, found, g);
          found = g;
          break;
        }
    if (!st && found < 0)
      st = weft_error(WEFT_ERR_INVALID, "AdamW: parameter '%s' is in no parameter group",
                      o->e[i].p->fqn);
    o->e[i].group = found;
  }
  /* a listed parameter the module does not have (or without grad) */
  for (int g = 0; !st && g < ngroups; g++)
    for (int j = 0; !st && j < groups[g].nparams; j++) {
      bool ok = false;
      for (int i = 0; i < o->n && !ok; i++) ok = o->e[i].p == groups[g].params[j];
      if (!ok)
        st = weft_error(WEFT_ERR_INVALID,
                        "AdamW: group %d lists a parameter ('%s') that is not a trainable "
                        "parameter of the module",
                        g, groups[g].params[j] ? groups[g].params[j]->fqn : "(null)");
    }
  if (!st) st = adamw_add_states(o);
  if (st) {
    weft_optimizer_destroy(o);
    return weft_error_trace(st, __func__);
  }
  *out = o;
  return WEFT_OK;
}

int weft_optimizer_num_groups(const weft_optimizer *o) {
  return o ? (o->ngroups ? o->ngroups : 1) : 0;
}

weft_status weft_optimizer_group_get(const weft_optimizer *o, int g, weft_adamw_params *hp) {
  if (!o || !hp) return weft_error(WEFT_ERR_INVALID, "NULL argument");
  if (o->kind != OPT_ADAMW) return weft_error(WEFT_ERR_UNSUPPORTED, "parameter groups: AdamW only");
  if (g < 0 || g >= weft_optimizer_num_groups(o))
    return weft_error(WEFT_ERR_INVALID, "group %d outside [0, %d)", g,
                      weft_optimizer_num_groups(o));
  *hp = *group_hp(o, g);
  return WEFT_OK;
}

weft_status weft_optimizer_group_set(weft_optimizer *o, int g, const weft_adamw_params *hp) {
  if (!o) return weft_error(WEFT_ERR_INVALID, "optimizer is NULL");
  WEFT_CHECK(adamw_check(hp));
  if (o->kind != OPT_ADAMW) return weft_error(WEFT_ERR_UNSUPPORTED, "parameter groups: AdamW only");
  if (g < 0 || g >= weft_optimizer_num_groups(o))
    return weft_error(WEFT_ERR_INVALID, "group %d outside [0, %d)", g,
                      weft_optimizer_num_groups(o));
  bool had = group_hp(o, g)->amsgrad;
  if (hp->amsgrad != had)
    return weft_error(WEFT_ERR_INVALID, "group %d: amsgrad cannot change after creation", g);
  if (o->groups)
    o->groups[g] = *hp;
  else
    o->adam = *hp;
  return WEFT_OK;
}

weft_status weft_sgd_create(weft_module *root, const weft_sgd_params *hp, weft_optimizer **out) {
  if (!hp) return weft_error(WEFT_ERR_INVALID, "hyper-parameters are NULL");
  if (!(hp->lr >= 0) || !(hp->momentum >= 0) || !(hp->weight_decay >= 0) ||
      (hp->nesterov && (hp->momentum <= 0 || hp->dampening != 0)))
    return weft_error(WEFT_ERR_INVALID,
                      "SGD: need lr, momentum, weight_decay >= 0, and nesterov only with "
                      "momentum > 0 and dampening 0 (got lr %g, momentum %g, dampening %g, wd %g, "
                      "nesterov %d)",
                      (double)hp->lr, (double)hp->momentum, (double)hp->dampening,
                      (double)hp->weight_decay, (int)hp->nesterov);
  weft_optimizer *o;
  WEFT_CHECK(opt_create(root, OPT_SGD, &o));
  o->sgd = *hp;
  weft_status st = WEFT_OK;
  for (int i = 0; i < o->n && !st && hp->momentum != 0; i++)
    st = add_state(o, &o->e[i], 0, "momentum_buffer");
  if (st) {
    weft_optimizer_destroy(o);
    return weft_error_trace(st, __func__);
  }
  *out = o;
  return WEFT_OK;
}

weft_status weft_optimizer_step(weft_optimizer *o) {
  if (!o) return weft_error(WEFT_ERR_INVALID, "optimizer is NULL");
  if (o->magic != OPT_LIVE)
    return weft_error(WEFT_ERR_INVALID, "the optimizer was destroyed (weft_optimizer_destroy)");
  /* validate everything before touching anything */
  for (int i = 0; i < o->n; i++) {
    opt_entry *e = &o->e[i];
    weft_param *p = e->p;
    if (!p->grad) continue;
    char a[256], b[256];
    if (!p->data || !weft_dtensor_spec_equal(weft_dtensor_get_spec(p->data), &e->spec)) {
      if (p->data)
        weft_dtensor_spec_describe(weft_dtensor_get_spec(p->data), a, sizeof a);
      else
        snprintf(a, sizeof a, "(none)");
      weft_dtensor_spec_describe(&e->spec, b, sizeof b);
      return weft_error(WEFT_ERR_STATE,
                        "optimizer: parameter '%s' is now %s but was %s when the optimizer was "
                        "created (create it after sharding)",
                        p->fqn, a, b);
    }
    if (!weft_dtensor_spec_equal(weft_dtensor_get_spec(p->grad), &e->spec)) {
      weft_dtensor_spec_describe(weft_dtensor_get_spec(p->grad), a, sizeof a);
      weft_dtensor_spec_describe(&e->spec, b, sizeof b);
      return weft_error(WEFT_ERR_STATE, "optimizer: grad of '%s' is %s, its data %s", p->fqn, a, b);
    }
    if (!weft_tensor_is_contiguous(weft_dtensor_local(p->data)) ||
        !weft_tensor_is_contiguous(weft_dtensor_local(p->grad)))
      return weft_error(WEFT_ERR_UNSUPPORTED, "optimizer: '%s' has a non-contiguous shard", p->fqn);
  }
  if (o->has_sched) weft_optimizer_set_lr(o, weft_lr_schedule_at(&o->sched, o->steps));
  /* One multi-tensor call per set of parameters that share a device, a
   * step count and a group (usually one or two sets), at most OPT_BATCH
   * tensors each, gathered over the whole list: weight-decay groups
   * alternate along a model's parameters, and runs of neighbours made 18
   * calls (18 table uploads, each a host wait on a GPU) for a GPT-2 step.
   * Each tensor's update is its own, so the grouping changes no value. */
  enum { OPT_BATCH = 128 };
  float *pa[OPT_BATCH], *s0[OPT_BATCH], *s1[OPT_BATCH], *s2[OPT_BATCH];
  const float *ga[OPT_BATCH];
  int64_t na[OPT_BATCH];
  for (int i = 0; i < o->n; i++) {
    opt_entry *e = &o->e[i];
    e->taken = !e->p->grad;
    if (e->p->grad) e->step++;
  }
  for (int first = 0; first < o->n; first++) {
    const opt_entry *k = &o->e[first];
    if (k->taken) continue;
    const weft_device dev = nn_dev(k->p->data);
    const int64_t step = k->step;
    const int group = k->group;
    const weft_adamw_params *hp = group_hp(o, group);
    int nb = 0;
    for (int i = first; i <= o->n; i++) {
      opt_entry *e = i < o->n ? &o->e[i] : NULL;
      if (e && (e->taken || nn_dev(e->p->data) != dev || e->step != step || e->group != group))
        continue;
      if (nb > 0 && (!e || nb == OPT_BATCH)) {
        if (o->kind == OPT_ADAMW)
          WEFT_CHECK(weft_backend_adamw_multi(dev, pa, ga, s0, s1, hp->amsgrad ? s2 : NULL, na, nb,
                                              step, hp));
        else
          WEFT_CHECK(weft_backend_sgd_multi(dev, pa, ga, o->sgd.momentum != 0.0f ? s0 : NULL, na,
                                            nb, step, &o->sgd));
        nb = 0;
      }
      if (!e) break;
      weft_param *p = e->p;
      e->taken = true;
      pa[nb] = nn_f32(p->data);
      ga[nb] = nn_f32(p->grad);
      s0[nb] = e->s[0] ? nn_f32(e->s[0]) : NULL;
      s1[nb] = e->s[1] ? nn_f32(e->s[1]) : NULL;
      s2[nb] = e->s[2] ? nn_f32(e->s[2]) : NULL;
      na[nb] = nn_numel(p->data);
      nb++;
    }
  }
  o->steps++;
  return WEFT_OK;
}

void weft_optimizer_set_lr(weft_optimizer *o, float lr) {
  if (!o) return;
  o->adam.lr = lr;
  o->sgd.lr = lr;
  for (int g = 0; g < o->ngroups; g++) o->groups[g].lr = lr;
}

float weft_optimizer_get_lr(const weft_optimizer *o) {
  if (!o) return 0.0f;
  if (o->groups) return o->groups[0].lr;
  return o->kind == OPT_ADAMW ? o->adam.lr : o->sgd.lr;
}

int64_t weft_optimizer_num_steps(const weft_optimizer *o) { return o ? o->steps : 0; }

weft_status weft_optimizer_set_num_steps(weft_optimizer *o, int64_t n) {
  if (!o) return weft_error(WEFT_ERR_INVALID, "optimizer is NULL");
  if (n < 0) return weft_error(WEFT_ERR_INVALID, "num_steps %lld < 0", (long long)n);
  o->steps = n;
  return WEFT_OK;
}

int weft_optimizer_state_count(const weft_optimizer *o) { return o ? o->nstates : 0; }

weft_status weft_optimizer_state_get(const weft_optimizer *o, int i, const char **name,
                                     weft_dtensor **t) {
  if (!o) return weft_error(WEFT_ERR_INVALID, "optimizer is NULL");
  if (i < 0 || i >= o->nstates)
    return weft_error(WEFT_ERR_INVALID, "state index %d outside [0, %d)", i, o->nstates);
  if (name) *name = o->names[i];
  if (t) *t = o->states[i];
  return WEFT_OK;
}

weft_status weft_optimizer_state_find(const weft_optimizer *o, const char *name, weft_dtensor **t) {
  if (!o || !name) return weft_error(WEFT_ERR_INVALID, "NULL argument");
  for (int i = 0; i < o->nstates; i++)
    if (strcmp(o->names[i], name) == 0) {
      if (t) *t = o->states[i];
      return WEFT_OK;
    }
  return weft_error(WEFT_ERR_NOT_FOUND, "optimizer has no state '%s'", name);
}

static opt_entry *find_entry(const weft_optimizer *o, const char *fqn) {
  for (int i = 0; i < o->n; i++)
    if (strcmp(o->e[i].p->fqn, fqn) == 0) return &o->e[i];
  return NULL;
}

weft_status weft_optimizer_get_param_step(const weft_optimizer *o, const char *fqn, int64_t *step) {
  if (!o || !fqn || !step) return weft_error(WEFT_ERR_INVALID, "NULL argument");
  opt_entry *e = find_entry(o, fqn);
  if (!e) return weft_error(WEFT_ERR_NOT_FOUND, "optimizer has no parameter '%s'", fqn);
  *step = e->step;
  return WEFT_OK;
}

weft_status weft_optimizer_param_group(const weft_optimizer *o, const char *fqn, int *group) {
  if (!o || !fqn || !group) return weft_error(WEFT_ERR_INVALID, "NULL argument");
  opt_entry *e = find_entry(o, fqn);
  if (!e) return weft_error(WEFT_ERR_NOT_FOUND, "optimizer has no parameter '%s'", fqn);
  *group = e->group;
  return WEFT_OK;
}

weft_status weft_optimizer_set_param_step(weft_optimizer *o, const char *fqn, int64_t step) {
  if (!o || !fqn) return weft_error(WEFT_ERR_INVALID, "NULL argument");
  if (step < 0) return weft_error(WEFT_ERR_INVALID, "step %lld < 0", (long long)step);
  opt_entry *e = find_entry(o, fqn);
  if (!e) return weft_error(WEFT_ERR_NOT_FOUND, "optimizer has no parameter '%s'", fqn);
  e->step = step;
  return WEFT_OK;
}

/* ------------------------------------------------------------ schedule */

static bool sched_ok(const weft_lr_schedule *s) {
  return s->warmup_steps >= 0 && s->total_steps >= s->warmup_steps;
}

float weft_lr_schedule_at(const weft_lr_schedule *s, int64_t step) {
  if (!s) return 0.0f;
  if (!sched_ok(s)) return s->lr_max;
  if (step < 0) step = 0;
  if (step < s->warmup_steps)
    return (float)((double)s->lr_max * (double)(step + 1) / (double)s->warmup_steps);
  if (step >= s->total_steps) return s->lr_min;
  double r = (double)(step - s->warmup_steps) / (double)(s->total_steps - s->warmup_steps);
  double coeff = 0.5 * (1.0 + cos(M_PI * r));
  return (float)((double)s->lr_min + coeff * ((double)s->lr_max - (double)s->lr_min));
}

weft_status weft_optimizer_set_schedule(weft_optimizer *o, const weft_lr_schedule *s) {
  if (!o) return weft_error(WEFT_ERR_INVALID, "optimizer is NULL");
  if (!s) {
    o->has_sched = false;
    return WEFT_OK;
  }
  if (!sched_ok(s) || !(s->lr_max >= 0) || !(s->lr_min >= 0))
    return weft_error(WEFT_ERR_INVALID,
                      "lr schedule: need warmup >= 0, total >= warmup, rates >= 0 (got warmup "
                      "%lld, total %lld, lr_max %g, lr_min %g)",
                      (long long)s->warmup_steps, (long long)s->total_steps, (double)s->lr_max,
                      (double)s->lr_min);
  o->sched = *s;
  o->has_sched = true;
  return WEFT_OK;
}

/* ------------------------------------------------------------ clipping */

/* Parameters whose grads are sharded over the same mesh dims (of the same
 * mesh) share one all-reduce of their summed squares. */
#define CLIP_MAX_GROUPS 64
typedef struct clip_group {
  weft_mesh *mesh;
  unsigned mask; /* mesh dims to reduce over */
  double sum;
} clip_group;

/* Over the contiguous f32 local grads of ps, one multi-tensor call per
 * device and batch: sumsq (sq[i] = grad i's sum of squares) or, when !sumsq,
 * grads *= coef. Others are left to the caller. */
static weft_status for_each_f32_grad(weft_param *const *ps, int n, double *sq, float coef,
                                     bool sumsq) {
  enum { BATCH = 128 };
  float *x[BATCH];
  int64_t cnt[BATCH];
  int idx[BATCH];
  double out[BATCH];
  for (int d = 0; d < WEFT_DEVICE_COUNT; d++) {
    int nb = 0;
    for (int i = 0; i <= n; i++) {
      const weft_tensor *l = NULL;
      if (i < n && ps[i] && ps[i]->grad) {
        l = weft_dtensor_local(ps[i]->grad);
        if (l->device != (weft_device)d || !weft_tensor_is_contiguous(l) || l->dtype != WEFT_F32)
          l = NULL;
      }
      if (nb > 0 && (i == n || (l && nb == BATCH))) {
        if (sumsq) {
          WEFT_CHECK(
              weft_backend_sumsq_multi((weft_device)d, (const float *const *)x, cnt, nb, out));
          for (int k = 0; k < nb; k++) sq[idx[k]] = out[k];
        } else {
          WEFT_CHECK(weft_backend_scale_multi((weft_device)d, x, cnt, nb, coef));
        }
        nb = 0;
      }
      if (!l) continue;
      x[nb] = l->data;
      cnt[nb] = weft_tensor_numel(l);
      idx[nb] = i;
      nb++;
    }
  }
  return WEFT_OK;
}

weft_status weft_clip_grad_norm_params(weft_param *const *ps, int n, double max_norm,
                                       double *total_norm) {
  if (total_norm) *total_norm = 0.0;
  if (n > 0 && !ps) return weft_error(WEFT_ERR_INVALID, "params is NULL");
  if (!(max_norm > 0.0))
    return weft_error(WEFT_ERR_INVALID, "clip_grad_norm: max_norm %g must be > 0", max_norm);
  /* Partial grads are reduced first (collective, in parameter order). */
  for (int i = 0; i < n; i++) {
    weft_param *p = ps[i];
    if (!p || !p->grad) continue;
    const weft_dtensor_spec *s = weft_dtensor_get_spec(p->grad);
    bool partial = false;
    weft_placement want[WEFT_MESH_MAX_DIMS];
    for (int d = 0; d < s->mesh_ndim; d++) {
      partial |= s->placements[d].kind == WEFT_PLACE_PARTIAL;
      want[d] = s->placements[d].kind == WEFT_PLACE_PARTIAL ? weft_replicate() : s->placements[d];
    }
    if (!partial) continue;
    weft_dtensor *r;
    WEFT_CHECK(weft_dtensor_redistribute(p->grad, want, s->mesh_ndim, &r));
    weft_dtensor_destroy(p->grad);
    p->grad = r;
  }
  /* every local grad's sum of squares: contiguous f32 ones in one
   * multi-tensor call per device, the others through weft_reduce_all */
  double *sq = malloc((size_t)(n > 0 ? n : 1) * sizeof *sq);
  if (!sq) return weft_error(WEFT_ERR_OOM, "clip_grad_norm: %d sums", n);
  weft_status st = for_each_f32_grad(ps, n, sq, 0.0f, true);
  if (st) {
    free(sq);
    return weft_error_trace(st, __func__);
  }
  clip_group g[CLIP_MAX_GROUPS];
  int ng = 0;
  for (int i = 0; i < n; i++) {
    weft_param *p = ps[i];
    if (!p || !p->grad) continue;
    const weft_dtensor_spec *s = weft_dtensor_get_spec(p->grad);
    weft_mesh *mesh = weft_dtensor_mesh(p->grad);
    unsigned mask = 0;
    for (int d = 0; d < s->mesh_ndim; d++)
      if (weft_placement_is_shard(s->placements[d]) && s->mesh_shape[d] > 1) mask |= 1u << d;
    const weft_tensor *l = weft_dtensor_local(p->grad);
    double ss = sq[i];
    if (!(weft_tensor_is_contiguous(l) && l->dtype == WEFT_F32)) {
      st = weft_reduce_all(l, WEFT_REDUCE_SUMSQ, &ss);
      if (st) {
        free(sq);
        return weft_error_trace(st, __func__);
      }
    }
    int k = 0;
    while (k < ng && !(g[k].mesh == mesh && g[k].mask == mask)) k++;
    if (k == ng) {
      if (ng == CLIP_MAX_GROUPS) {
        free(sq);
        return weft_error(WEFT_ERR_UNSUPPORTED, "clip_grad_norm: more than %d placement groups",
                          CLIP_MAX_GROUPS);
      }
      g[ng].mesh = mesh;
      g[ng].mask = mask;
      g[ng].sum = 0.0;
      ng++;
    }
    g[k].sum += ss;
  }
  free(sq);
  double total2 = 0.0;
  for (int k = 0; k < ng; k++) {
    for (int d = 0; d < WEFT_MESH_MAX_DIMS; d++)
      if (g[k].mask & (1u << d))
        WEFT_CHECK(
            weft_all_reduce(g[k].mesh, d, &g[k].sum, &g[k].sum, 1, WEFT_F64, WEFT_OP_SUM, NULL));
    total2 += g[k].sum;
  }
  double total = sqrt(total2);
  if (total_norm) *total_norm = total;
  double coef = weft_clip_coef(total, max_norm);
  if (coef < 1.0) {
    WEFT_CHECK(for_each_f32_grad(ps, n, NULL, (float)coef, false));
    for (int i = 0; i < n; i++) {
      weft_param *p = ps[i];
      if (!p || !p->grad) continue;
      weft_tensor *l = weft_dtensor_local(p->grad);
      if (!(weft_tensor_is_contiguous(l) && l->dtype == WEFT_F32)) WEFT_CHECK(weft_scale(l, coef));
    }
  }
  return WEFT_OK;
}

weft_status weft_clip_grad_norm(weft_module *root, double max_norm, double *total_norm) {
  if (total_norm) *total_norm = 0.0;
  if (!root) return weft_error(WEFT_ERR_INVALID, "root is NULL");
  int count;
  WEFT_CHECK(weft_module_parameters(root, NULL, 0, &count));
  /* note: a small malloc per call (not weft_alloc, so not counted as a step
   * allocation); the list is rebuilt because FSDP may swap grads. */
  weft_param **ps = malloc((size_t)(count ? count : 1) * sizeof *ps);
  if (!ps) return weft_error(WEFT_ERR_OOM, "param list");
  weft_status st = weft_module_parameters(root, ps, count, &count);
  if (!st) st = weft_clip_grad_norm_params(ps, count, max_norm, total_norm);
  free(ps);
  return st;
}
