/* tests/tp/test_tp.c — the tp suite: pure tests of patterns, styles and
 * the Llama plan, and multi-rank cases run in tp_worker under mpiexec
 * (tests/harness). Parity cases compare against the same model on one rank
 * within 1e-5 relative (fp32); see tp_worker.c for each case.
 * The *_on_device variants run the same cases with the meshes on WEFT_CUDA
 * (the worker's device mode, WEFT_TEST_DEVICE=cuda) and the same
 * tolerances; they skip, saying why, where this process sees no CUDA
 * device. */
#include <criterion/criterion.h>
#include <string.h>

#include "backend.h"
#include "harness.h"
#include "tp.h"

/* ----------------------------------------------------------- patterns */

Test(tp, fqn_match_wildcards_per_name) {
  struct {
    const char *p, *f;
    bool want;
  } c[] = {
      {.p = "layers.*.attention.wq", .f = "layers.0.attention.wq", .want = true},
      {.p = "layers.*.attention.wq", .f = "layers.12.attention.wq", .want = true},
      {.p = "layers.*.attention.wq", .f = "layers.0.attention.wk", .want = false},
      {.p = "layers.*.attention.wq", .f = "layers.0.attention", .want = false}, /* fewer names */
      {.p = "layers.*.attention", .f = "layers.0.attention.wq", .want = false}, /* more names */
      {.p = "layers.*", .f = "layers.0.attention", .want = false}, /* '*' stays in one name */
      {.p = "*", .f = "output", .want = true},
      {.p = "*", .f = "layers.0", .want = false},
      {.p = "layers.*.*.w*", .f = "layers.3.feed_forward.w2", .want = true},
      {.p = "layers.*.*.w*", .f = "layers.3.feed_forward", .want = false},
      {.p = "layers.1*", .f = "layers.1", .want = true}, /* '*' matches empty */
      {.p = "layers.1*", .f = "layers.10", .want = true},
      {.p = "layers.1*", .f = "layers.2", .want = false},
      {.p = "*_norm", .f = "ffn_norm", .want = true},
      {.p = "*_norm", .f = "norm", .want = false},
      {.p = "a*b*c", .f = "aXXbYYc", .want = true},
      {.p = "a*b*c", .f = "aXXbYY", .want = false},
      {.p = "a*b*c", .f = "abbc", .want = true},
      {.p = "**", .f = "x", .want = true},
      {.p = "output", .f = "output", .want = true},
      {.p = "output", .f = "outputs", .want = false},
      {.p = "outputs", .f = "output", .want = false},
      {.p = "w[qkv]", .f = "wq", .want = false}, /* no character classes: '[' is literal */
      {.p = "w[qkv]", .f = "w[qkv]", .want = true},
      {.p = "", .f = "", .want = true}, /* the module itself */
      {.p = "", .f = "output", .want = false},
      {.p = "output", .f = "", .want = false},
      {.p = "layers..wq", .f = "layers..wq", .want = true},
  };
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
    cr_expect_eq(weft_tp_fqn_match(c[i].p, c[i].f), c[i].want, "'%s' vs '%s': want %d", c[i].p,
                 c[i].f, c[i].want);
  cr_expect_not(weft_tp_fqn_match(NULL, "x"));
  cr_expect_not(weft_tp_fqn_match("x", NULL));
}

/* ------------------------------------------------------------- styles */

static bool is_r(weft_placement p) { return p.kind == WEFT_PLACE_REPLICATE; }
static bool is_s(weft_placement p, int d) { return p.kind == WEFT_PLACE_SHARD && p.dim == d; }

Test(tp, style_defaults_follow_pytorch) {
  weft_tp_style c = weft_tp_colwise();
  cr_expect_eq(c.kind, WEFT_TP_COLWISE);
  cr_expect(c.has_input_layout && is_r(c.input_layout));
  cr_expect(c.has_output_layout && is_s(c.output_layout, -1));
  cr_expect(c.use_local_output);
  weft_tp_style r = weft_tp_rowwise();
  cr_expect_eq(r.kind, WEFT_TP_ROWWISE);
  cr_expect_not(r.has_input_layout, "rowwise input defaults by module kind");
  cr_expect(r.has_output_layout && is_r(r.output_layout));
  cr_expect(r.use_local_output);
  weft_tp_style re = weft_tp_rowwise_ex(weft_replicate(), weft_shard(1), false);
  cr_expect(re.has_input_layout && is_r(re.input_layout) && is_s(re.output_layout, 1));
  cr_expect_not(re.use_local_output);
  weft_tp_style ce = weft_tp_colwise_ex(weft_shard(1), weft_replicate(), true);
  cr_expect(is_s(ce.input_layout, 1) && is_r(ce.output_layout));
  weft_tp_style sp = weft_tp_sequence_parallel();
  cr_expect_eq(sp.kind, WEFT_TP_SEQUENCE_PARALLEL);
  cr_expect_eq(sp.sequence_dim, 1);
  cr_expect_not(sp.use_local_output);
  weft_tp_style pi = weft_tp_prepare_input(weft_shard(1), weft_replicate(), false);
  cr_expect(pi.has_input_layout && pi.has_desired_input_layout && !pi.has_output_layout);
  cr_expect(is_s(pi.input_layout, 1) && is_r(pi.desired_input_layout));
  weft_tp_style po = weft_tp_prepare_output(weft_replicate(), weft_shard(1), true);
  cr_expect(po.has_output_layout && po.has_desired_output_layout && !po.has_input_layout);
  cr_expect(is_r(po.output_layout) && is_s(po.desired_output_layout, 1));
}

Test(tp, style_describe_names_kind_and_layouts) {
  char b[128];
  weft_tp_style s = weft_tp_colwise();
  weft_tp_style_describe(&s, b, sizeof b);
  cr_expect_str_eq(b, "colwise(in R, out S(-1))");
  s = weft_tp_rowwise();
  weft_tp_style_describe(&s, b, sizeof b);
  cr_expect_str_eq(b, "rowwise(in default, out R)");
  s = weft_tp_rowwise_ex(weft_replicate(), weft_shard(1), false);
  weft_tp_style_describe(&s, b, sizeof b);
  cr_expect_str_eq(b, "rowwise(in R, out S(1), dtensor output)");
  s = weft_tp_sequence_parallel();
  weft_tp_style_describe(&s, b, sizeof b);
  cr_expect_str_eq(b, "sequence_parallel(sequence dim 1)");
  s = weft_tp_prepare_input(weft_shard(1), weft_replicate(), false);
  weft_tp_style_describe(&s, b, sizeof b);
  cr_expect_str_eq(b, "prepare_input(S(1) -> R)");
  s = weft_tp_prepare_output(weft_replicate(), weft_shard(0), true);
  weft_tp_style_describe(&s, b, sizeof b);
  cr_expect_str_eq(b, "prepare_output(R -> S(0))");
  s.kind = (weft_tp_style_kind)9;
  weft_tp_style_describe(&s, b, sizeof b);
  cr_expect(strstr(b, "invalid style kind 9"), "%s", b);
  weft_tp_style_describe(NULL, b, sizeof b);
  cr_expect_str_eq(b, "(null style)");
  char tiny[8];
  s = weft_tp_colwise();
  weft_tp_style_describe(&s, tiny, sizeof tiny);
  cr_expect_eq(strlen(tiny), 7, "truncated and terminated");
  cr_expect_str_eq(weft_tp_style_kind_name(WEFT_TP_PREPARE_OUTPUT), "prepare_output");
  cr_expect_str_eq(weft_tp_style_kind_name((weft_tp_style_kind)-1), "?");
}

/* ---------------------------------------------------------- llama plan */

static const weft_tp_plan_entry *find(const weft_tp_plan_entry *e, int n, const char *pat) {
  for (int i = 0; i < n; i++)
    if (strcmp(e[i].pattern, pat) == 0) return &e[i];
  return NULL;
}

Test(tp, llama_plan_is_torchtitans) {
  for (int sp = 0; sp < 2; sp++)
    for (int lp = 0; lp < 2; lp++) {
      weft_tp_plan_entry e[32];
      int n = -1;
      cr_assert_eq(weft_tp_llama_plan(sp, lp, e, 32, &n), WEFT_OK);
      cr_expect_eq(n, sp ? 14 : 9, "sp=%d: %d entries", sp, n);
      const weft_tp_plan_entry *t = find(e, n, "tok_embeddings");
      cr_assert(t);
      cr_expect(t->style.kind == WEFT_TP_ROWWISE && is_r(t->style.input_layout));
      cr_expect(sp ? is_s(t->style.output_layout, 1) : is_r(t->style.output_layout));
      const weft_tp_plan_entry *o = find(e, n, "output");
      cr_assert(o);
      cr_expect(o->style.kind == WEFT_TP_COLWISE);
      cr_expect(sp ? is_s(o->style.input_layout, 1) : is_r(o->style.input_layout));
      cr_expect(lp ? is_s(o->style.output_layout, -1) : is_r(o->style.output_layout));
      cr_expect_eq(o->style.use_local_output, !lp);
      const char *col[] = {"layers.*.attention.wq", "layers.*.attention.wk",
                           "layers.*.attention.wv", "layers.*.feed_forward.w1",
                           "layers.*.feed_forward.w3"};
      for (int i = 0; i < 5; i++) {
        const weft_tp_plan_entry *c = find(e, n, col[i]);
        cr_assert(c, "%s", col[i]);
        cr_expect(c->style.kind == WEFT_TP_COLWISE && is_s(c->style.output_layout, -1));
      }
      const char *row[] = {"layers.*.attention.wo", "layers.*.feed_forward.w2"};
      for (int i = 0; i < 2; i++) {
        const weft_tp_plan_entry *r = find(e, n, row[i]);
        cr_assert(r, "%s", row[i]);
        cr_expect(r->style.kind == WEFT_TP_ROWWISE && is_s(r->style.input_layout, -1));
        cr_expect(sp ? is_s(r->style.output_layout, 1) : is_r(r->style.output_layout));
      }
      const char *spn[] = {"norm", "layers.*.attention_norm", "layers.*.ffn_norm"};
      for (int i = 0; i < 3; i++) {
        const weft_tp_plan_entry *x = find(e, n, spn[i]);
        cr_expect_eq(x != NULL, (bool)sp, "%s", spn[i]);
        if (x) cr_expect(x->style.kind == WEFT_TP_SEQUENCE_PARALLEL);
      }
      const char *prep[] = {"layers.*.attention", "layers.*.feed_forward"};
      for (int i = 0; i < 2; i++) {
        const weft_tp_plan_entry *x = find(e, n, prep[i]);
        cr_expect_eq(x != NULL, (bool)sp, "%s", prep[i]);
        if (x)
          cr_expect(x->style.kind == WEFT_TP_PREPARE_INPUT && is_s(x->style.input_layout, 1) &&
                    is_r(x->style.desired_input_layout));
      }
    }
  /* cap: writes what fits, counts all */
  weft_tp_plan_entry e[3];
  memset(e, 0, sizeof e);
  int n;
  cr_expect_eq(weft_tp_llama_plan(true, true, e, 2, &n), WEFT_OK);
  cr_expect_eq(n, 14);
  cr_expect(e[0].pattern && e[1].pattern && !e[2].pattern);
  cr_expect_eq(weft_tp_llama_plan(true, true, NULL, 0, &n), WEFT_OK);
  cr_expect_eq(weft_tp_llama_plan(true, true, e, 3, NULL), WEFT_ERR_INVALID);
  cr_expect_eq(weft_tp_llama_plan(true, true, NULL, 3, &n), WEFT_ERR_INVALID);
}

Test(tp, null_objects_are_harmless) {
  weft_tp_destroy(NULL);
  weft_tp_loss_destroy(NULL);
  cr_expect_eq(weft_tp_num_applied(NULL), 0);
  cr_expect_null(weft_tp_mesh(NULL));
  char b[4] = "xyz";
  cr_expect_eq(weft_tp_describe(NULL, b, sizeof b), 0);
  cr_expect_str_eq(b, "");
  cr_expect_eq(weft_tp_loss_create(NULL), WEFT_ERR_INVALID);
  weft_tp_loss *l;
  cr_assert_eq(weft_tp_loss_create(&l), WEFT_OK);
  double loss;
  cr_expect_eq(weft_tp_loss_forward(l, NULL, NULL, &loss), WEFT_ERR_INVALID);
  cr_expect_eq(weft_tp_loss_forward(NULL, NULL, NULL, &loss), WEFT_ERR_INVALID);
  cr_expect_eq(weft_tp_loss_backward(l, NULL, NULL, 1.0, NULL), WEFT_ERR_INVALID);
  weft_tp_loss_destroy(l);
  const weft_loss_impl *impl = weft_tp_loss_impl();
  cr_expect(impl && impl->forward && impl->backward);
  weft_tp *tp = (weft_tp *)1;
  cr_expect_eq(weft_parallelize_module(NULL, NULL, NULL, 0, &tp), WEFT_ERR_INVALID);
  cr_expect_null(tp);
  cr_expect_eq(weft_tp_apply_llama_plan(NULL, NULL, false, false, NULL), WEFT_ERR_INVALID);
}

/* ------------------------------------------------------- multi-rank */

#define RUN(n, c, secs) weft_test_mpiexec((n), WORKER("tp_worker"), (c), (secs))

/* Loss, every parameter's full gradient and grad norm (3 AdamW steps with
 * clipping), and the parameters after them, equal the 1-rank run within
 * 1e-5 relative: tiny_mha (all sp x lp) and tiny_gqa (Hkv = 2), also with
 * the weights loaded before parallelizing. */
Test(tp, llama_plan_matches_one_rank_tp2, .timeout = 120) {
  cr_assert_eq(RUN(2, "parity_tp2", 110), 0);
}
Test(tp, llama_plan_matches_one_rank_tp2_on_device, .timeout = 120) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(2, WORKER("tp_worker"), "parity_tp2", 110, NULL), 0);
}
/* Same at tp = 4 for tiny_mha; tiny_gqa (Hkv = 2) is refused there. */
Test(tp, llama_plan_matches_one_rank_tp4, .timeout = 150) {
  cr_assert_eq(RUN(4, "parity_tp4", 140), 0);
}
Test(tp, llama_plan_matches_one_rank_tp4_on_device, .timeout = 150) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(4, WORKER("tp_worker"), "parity_tp4", 140, NULL), 0);
}

/* Per block forward: 2 all-reduces of B*T*D floats (no sp), 2 all-gathers
 * + 2 reduce-scatters (sp), nothing else; loss parallel: 2 all-reduces of
 * 3 B*T floats in all and local logits (B, T, V/tp). */
Test(tp, block_forward_comm_counts_tp2, .timeout = 60) { cr_assert_eq(RUN(2, "comm", 50), 0); }
Test(tp, block_forward_comm_counts_tp4, .timeout = 90) { cr_assert_eq(RUN(4, "comm", 80), 0); }
Test(tp, block_forward_comm_counts_tp2_on_device, .timeout = 60) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(2, WORKER("tp_worker"), "comm", 50, NULL), 0);
}

/* Colwise/rowwise embeddings (uneven vocab), sequence parallel from a
 * replicated input, prepare input/output, colwise with output R, rowwise
 * with output S(1) on an uneven (and on 4 ranks empty) sequence shard:
 * output and grads equal the 1-rank run. */
Test(tp, generic_styles_match_one_rank_tp1, .timeout = 60) {
  cr_assert_eq(RUN(1, "styles", 50), 0);
}
Test(tp, generic_styles_match_one_rank_tp2, .timeout = 60) {
  cr_assert_eq(RUN(2, "styles", 50), 0);
}
Test(tp, generic_styles_match_one_rank_tp4, .timeout = 90) {
  cr_assert_eq(RUN(4, "styles", 80), 0);
}
Test(tp, generic_styles_match_one_rank_tp2_on_device, .timeout = 60) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(2, WORKER("tp_worker"), "styles", 50, NULL), 0);
}

/* weft_tp_loss vs a double reference: even/uneven/empty vocab shards. */
Test(tp, loss_parallel_matches_double_reference_tp1, .timeout = 60) {
  cr_assert_eq(RUN(1, "loss", 50), 0);
}
Test(tp, loss_parallel_matches_double_reference_tp2, .timeout = 60) {
  cr_assert_eq(RUN(2, "loss", 50), 0);
}
Test(tp, loss_parallel_matches_double_reference_tp4, .timeout = 90) {
  cr_assert_eq(RUN(4, "loss", 80), 0);
}
Test(tp, loss_parallel_matches_double_reference_tp2_on_device, .timeout = 60) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(2, WORKER("tp_worker"), "loss", 50, NULL), 0);
}

/* Patterns matching nothing, wrong module kinds, two parameter styles,
 * missing/Partial layouts, heads not divisible by tp, an inconsistent
 * plan and a head split found at forward: clear errors on every rank,
 * nothing changed, no hang. */
Test(tp, bad_plans_fail_cleanly_on_every_rank, .timeout = 60) {
  cr_assert_eq(RUN(2, "bad_input", 50), 0);
}
