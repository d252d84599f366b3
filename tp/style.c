/* tp/style.c — parallel style values (PyTorch's ColwiseParallel,
 * RowwiseParallel, SequenceParallel, PrepareModuleInput/Output with their
 * defaults), their descriptions, and FQN pattern matching. */
#include <stdio.h>
#include <string.h>

#include "tp.h"

static const char *const style_names[WEFT_TP_STYLE_COUNT] = {
    "colwise", "rowwise", "sequence_parallel", "prepare_input", "prepare_output"};

const char *weft_tp_style_kind_name(weft_tp_style_kind kind) {
  if ((int)kind < 0 || kind >= WEFT_TP_STYLE_COUNT) return "?";
  return style_names[kind];
}

static weft_tp_style blank(weft_tp_style_kind kind) {
  weft_tp_style s;
  memset(&s, 0, sizeof s);
  s.kind = kind;
  s.input_layout = s.desired_input_layout = weft_replicate();
  s.output_layout = s.desired_output_layout = weft_replicate();
  s.sequence_dim = 1;
  return s;
}

weft_tp_style weft_tp_colwise(void) {
  weft_tp_style s = blank(WEFT_TP_COLWISE);
  s.has_input_layout = true;
  s.input_layout = weft_replicate();
  s.has_output_layout = true;
  s.output_layout = weft_shard(-1);
  s.use_local_output = true;
  return s;
}

/* s with both layouts declared and use_local_output set (the _ex forms). */
static weft_tp_style with_layouts(weft_tp_style s, weft_placement input_layout,
                                  weft_placement output_layout, bool use_local_output) {
  s.has_input_layout = true;
  s.input_layout = input_layout;
  s.has_output_layout = true;
  s.output_layout = output_layout;
  s.use_local_output = use_local_output;
  return s;
}

weft_tp_style weft_tp_colwise_ex(weft_placement input_layout, weft_placement output_layout,
                                 bool use_local_output) {
  return with_layouts(weft_tp_colwise(), input_layout, output_layout, use_local_output);
}

weft_tp_style weft_tp_colwise_fused(int n) {
  weft_tp_style s = weft_tp_colwise();
  s.split_factor = n;
  return s;
}

weft_tp_style weft_tp_rowwise(void) {
  weft_tp_style s = blank(WEFT_TP_ROWWISE);
  s.has_input_layout = false; /* S(-1) for Linear, R for Embedding: by module kind */
  s.has_output_layout = true;
  s.output_layout = weft_replicate();
  s.use_local_output = true;
  return s;
}

weft_tp_style weft_tp_rowwise_ex(weft_placement input_layout, weft_placement output_layout,
                                 bool use_local_output) {
  return with_layouts(weft_tp_rowwise(), input_layout, output_layout, use_local_output);
}

weft_tp_style weft_tp_sequence_parallel(void) {
  weft_tp_style s = blank(WEFT_TP_SEQUENCE_PARALLEL);
  s.sequence_dim = 1;
  s.use_local_output = false;
  return s;
}

weft_tp_style weft_tp_prepare_input(weft_placement input_layout,
                                    weft_placement desired_input_layout, bool use_local_output) {
  weft_tp_style s = blank(WEFT_TP_PREPARE_INPUT);
  s.has_input_layout = true;
  s.input_layout = input_layout;
  s.has_desired_input_layout = true;
  s.desired_input_layout = desired_input_layout;
  s.use_local_output = use_local_output;
  return s;
}

weft_tp_style weft_tp_prepare_output(weft_placement output_layout,
                                     weft_placement desired_output_layout, bool use_local_output) {
  weft_tp_style s = blank(WEFT_TP_PREPARE_OUTPUT);
  s.has_output_layout = true;
  s.output_layout = output_layout;
  s.has_desired_output_layout = true;
  s.desired_output_layout = desired_output_layout;
  s.use_local_output = use_local_output;
  return s;
}

/* "R", "S(-1)", or "default" when unset. */
static void layout_str(bool has, weft_placement p, char *buf, size_t cap) {
  if (!has) {
    snprintf(buf, cap, "default");
    return;
  }
  weft_placement_describe(p, buf, cap);
}

void weft_tp_style_describe(const weft_tp_style *s, char *buf, size_t cap) {
  if (!buf || cap == 0) return;
  if (!s) {
    snprintf(buf, cap, "(null style)");
    return;
  }
  char a[32], b[32];
  const char *name = weft_tp_style_kind_name(s->kind);
  switch (s->kind) {
    case WEFT_TP_COLWISE:
    case WEFT_TP_ROWWISE:
      layout_str(s->has_input_layout, s->input_layout, a, sizeof a);
      layout_str(s->has_output_layout, s->output_layout, b, sizeof b);
      if (s->split_factor > 1)
        snprintf(buf, cap, "%s(in %s, out %s, fused x%d%s)", name, a, b, s->split_factor,
                 s->use_local_output ? "" : ", dtensor output");
      else
        snprintf(buf, cap, "%s(in %s, out %s%s)", name, a, b,
                 s->use_local_output ? "" : ", dtensor output");
      break;
    case WEFT_TP_SEQUENCE_PARALLEL:
      snprintf(buf, cap, "%s(sequence dim %d)", name, s->sequence_dim);
      break;
    case WEFT_TP_PREPARE_INPUT:
      layout_str(s->has_input_layout, s->input_layout, a, sizeof a);
      layout_str(s->has_desired_input_layout, s->desired_input_layout, b, sizeof b);
      snprintf(buf, cap, "%s(%s -> %s)", name, a, b);
      break;
    case WEFT_TP_PREPARE_OUTPUT:
      layout_str(s->has_output_layout, s->output_layout, a, sizeof a);
      layout_str(s->has_desired_output_layout, s->desired_output_layout, b, sizeof b);
      snprintf(buf, cap, "%s(%s -> %s)", name, a, b);
      break;
    default:
      snprintf(buf, cap, "invalid style kind %d", (int)s->kind);
  }
}

/* One name against one pattern name (lengths given; no '.' inside):
 * '*' matches any run, other characters themselves. Iterative with one
 * backtrack point (the last '*'), linear-ish for the short names here. */
static bool atom_match(const char *p, size_t np, const char *s, size_t ns) {
  size_t i = 0, j = 0, star = (size_t)-1, mark = 0;
  while (j < ns) {
    if (i < np && p[i] == '*') {
      star = i++;
      mark = j;
    } else if (i < np && p[i] == s[j]) {
      i++;
      j++;
    } else if (star != (size_t)-1) {
      i = star + 1;
      j = ++mark;
    } else {
      return false;
    }
  }
  while (i < np && p[i] == '*') i++;
  return i == np;
}

bool weft_tp_fqn_match(const char *pattern, const char *fqn) {
  if (!pattern || !fqn) return false;
  if (!pattern[0] || !fqn[0]) return !pattern[0] && !fqn[0];
  const char *p = pattern, *s = fqn;
  for (;;) {
    const char *pd = strchr(p, '.'), *sd = strchr(s, '.');
    size_t np = pd ? (size_t)(pd - p) : strlen(p);
    size_t ns = sd ? (size_t)(sd - s) : strlen(s);
    if (!atom_match(p, np, s, ns)) return false;
    if (!pd || !sd) return !pd && !sd;
    p = pd + 1;
    s = sd + 1;
  }
}
