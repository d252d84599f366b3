/* nn/mixed.c — bf16 / f16 inputs of the built-in ops whose kernel takes
 * only f32 on the device.
 *
 * Most ops have storage-dtype kernels (backend.h takes_dtype; then
 * nn_mixed_begin_kernel does nothing below); mean, a mix of f32 and 16-bit
 * inputs, and a backend whose table declares fewer dtypes go through here.
 * For them the kernels compute in f32. An op given a bf16 (or f16) input works as
 * PyTorch's CPU and CUDA ops do for such dtypes: the inputs are widened to
 * f32 (exact), the op computes in f32 (f32 accumulation), and its outputs
 * are rounded once to the result dtype, which follows PyTorch's promotion:
 * the low dtype when every floating input has it, f32 when any is f32 (ops
 * that take two operands of one dtype, as a matmul, reject a mix).
 *
 * What the graph keeps for backward stays in the low dtype, so saved
 * activations take half the memory of f32: the f32 copies exist only while
 * the op runs (freed right after, not kept in the graph's pool, where a
 * spare buffer of every shape would outweigh the saving).
 *
 *   nn_mixed_begin   swaps every low-precision input var for a proxy var
 *                    holding an f32 copy; the op then runs as for f32;
 *   nn_mixed_end     points the op's nodes back at the original vars,
 *                    rounds their saved inputs and every var the op made
 *                    (outputs and intermediates) to the result dtype,
 *                    returns the f32 copies to the pool and marks the
 *                    nodes mixed;
 *   backward         (nn_mixed_backward_begin/_end, from graph.c's
 *                    run_node) widens a mixed node's saved inputs,
 *                    outputs, saved buffers and output grads to f32 for
 *                    the op's backward and rounds each input grad to its
 *                    input's dtype (a parameter's grad, kept in f32, gets
 *                    that rounded contribution, as PyTorch's bf16 grad).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd_internal.h"

static bool is_low(weft_dtype d) { return d == WEFT_BF16 || d == WEFT_F16; }

/* A graph buffer holding d (16-bit) widened to f32, counted in
 * weft_op_stats.widened. */
static weft_status widen(weft_graph *g, const weft_dtensor *d, weft_dtensor **out) {
  WEFT_CHECK(nn_graph_converted(g, d, WEFT_F32, out));
  nn_count_widened(1);
  return WEFT_OK;
}

/* Whether every float input is of dtype dt (no f64; integer inputs such
 * as token ids are never widened and do not count) and the inputs' device
 * computes kop in it. */
static bool kernel_takes(weft_var *const *in, int nin, weft_kernel_op kop, weft_dtype dt) {
  weft_device dev = WEFT_DEVICE_COUNT;
  for (int i = 0; i < nin; i++) {
    if (!in[i]) continue;
    const weft_dtensor *d = nn_var_now(in[i]);
    if (!weft_dtype_is_float(weft_dtensor_dtype(d))) continue;
    if (weft_dtensor_dtype(d) != dt) return false;
    dev = weft_dtensor_local(d)->device;
  }
  return dev != WEFT_DEVICE_COUNT && weft_backend_takes_dtype(dev, kop, dt);
}

weft_status nn_mixed_begin(nn_mixed *mx, const char *name, weft_var **in, int nin,
                           bool same_dtype) {
  return nn_mixed_begin_kernel(mx, name, in, nin, same_dtype, WEFT_KERNEL_OP_COUNT);
}

static weft_status begin(nn_mixed *mx, const char *name, weft_var **in, int nin, bool same_dtype,
                         weft_kernel_op kop);

/* Every built-in op enters through begin and leaves through end: an error
 * of either, or of the op between them, is headed by the public function
 * the caller called (weft_op_<name>) and keeps where it arose as "at". */
weft_status nn_mixed_begin_kernel(nn_mixed *mx, const char *name, weft_var **in, int nin,
                                  bool same_dtype, weft_kernel_op kop) {
  memset(mx, 0, sizeof *mx);
  snprintf(mx->func, sizeof mx->func, "weft_op_%s", name);
  weft_status st = begin(mx, name, in, nin, same_dtype, kop);
  return st == WEFT_OK ? st : weft_error_trace(st, mx->func);
}

static weft_status begin(nn_mixed *mx, const char *name, weft_var **in, int nin, bool same_dtype,
                         weft_kernel_op kop) {
  nn_count_ops(1); /* every built-in op enters here once */
  weft_dtype low = WEFT_DTYPE_COUNT;
  bool any_f32 = false;
  for (int i = 0; i < nin; i++) {
    if (!in[i]) continue;
    weft_dtype d = weft_dtensor_dtype(nn_var_now(in[i]));
    if (d == WEFT_F32) any_f32 = true;
    if (!is_low(d)) continue;
    if (low != WEFT_DTYPE_COUNT && low != d)
      return nn_op_error(WEFT_ERR_UNSUPPORTED, name, in, nin,
                         "inputs of two different 16-bit dtypes (%s and %s): cast one first "
                         "(weft_op_to)",
                         weft_dtype_name(low), weft_dtype_name(d));
    low = d;
  }
  if (low == WEFT_DTYPE_COUNT) return WEFT_OK; /* nothing to widen */
  if (same_dtype && any_f32)
    return nn_op_error(WEFT_ERR_INVALID, name, in, nin,
                       "operands of different dtypes (f32 and %s; PyTorch rejects this too): "
                       "cast one first (weft_op_to)",
                       weft_dtype_name(low));
  if (!any_f32 && kop < WEFT_KERNEL_OP_COUNT && kernel_takes(in, nin, kop, low))
    return WEFT_OK; /* the storage-dtype kernel: nothing to widen */
  weft_graph *g = in[0] ? in[0]->g : NULL;
  for (int i = 0; !g && i < nin; i++) g = in[i] ? in[i]->g : NULL;
  mx->g = g;
  mx->dtype = any_f32 ? WEFT_F32 : low;
  mx->nin = nin;
  for (int i = 0; i < nin; i++) {
    mx->orig[i] = in[i];
    if (!in[i] || !is_low(weft_dtensor_dtype(nn_var_now(in[i])))) continue;
    for (int j = 0; j < i; j++) /* the same var twice: one proxy */
      if (mx->orig[j] == in[i] && mx->proxy[j]) mx->proxy[i] = mx->proxy[j];
    if (!mx->proxy[i]) {
      weft_dtensor *wide;
      WEFT_CHECK(widen(g, nn_var_now(in[i]), &wide));
      WEFT_CHECK(nn_var_new(g, wide, NULL, &mx->proxy[i]));
      mx->proxy[i]->requires_grad = in[i]->requires_grad;
    }
    in[i] = mx->proxy[i];
  }
  mx->v0 = nn_graph_nvars(g);
  mx->n0 = nn_graph_nnodes(g);
  mx->active = true;
  return WEFT_OK;
}

/* The original var of a proxy, else v. */
static weft_var *original(const nn_mixed *mx, weft_var *v) {
  for (int i = 0; i < mx->nin; i++)
    if (v && mx->proxy[i] == v) return mx->orig[i];
  return v;
}

typedef struct swap {
  const weft_dtensor *from, *to;
} swap;

static const weft_dtensor *swapped(const swap *sw, int n, const weft_dtensor *d) {
  for (int i = 0; i < n; i++)
    if (sw[i].from == d) return sw[i].to;
  return d;
}

static weft_status end(nn_mixed *mx, weft_status st, weft_var **out, int nout);

weft_status nn_mixed_end(nn_mixed *mx, weft_status st, weft_var **out, int nout) {
  st = end(mx, st, out, nout);
  return st == WEFT_OK ? st : weft_error_trace(st, mx->func);
}

static weft_status end(nn_mixed *mx, weft_status st, weft_var **out, int nout) {
  if (!mx->active) return st;
  weft_graph *g = mx->g;
  if (st != WEFT_OK) { /* the op failed: hand the widened copies back */
    for (int i = 0; i < mx->nin; i++)
      if (mx->proxy[i]) {
        nn_graph_discard(g, mx->proxy[i]->value);
        mx->proxy[i]->value = nn_var_now(mx->orig[i]);
        mx->proxy[i]->requires_grad = false;
      }
    mx->active = false;
    return st;
  }
  /* Every f32 buffer being replaced, with what replaces it: the vars the
   * op made (rounded to the result dtype) and the proxies' copies (the
   * originals). */
  int nv = nn_graph_nvars(g), nn = nn_graph_nnodes(g);
  int nsw = 0;
  swap *sw = calloc((size_t)(nv - mx->v0) + (size_t)mx->nin + (size_t)(nn - mx->n0) * NN_MAX_IN + 1,
                    sizeof *sw);
  if (!sw) st = weft_error(WEFT_ERR_OOM, "mixed precision: out of memory");
  for (int v = mx->v0; st == WEFT_OK && v < nv; v++) {
    weft_var *var = nn_graph_var(g, v);
    const weft_dtensor *d = var->value;
    if (mx->dtype == WEFT_F32 || weft_dtensor_dtype(d) != WEFT_F32) continue;
    weft_dtensor *low;
    st = nn_graph_converted(g, d, mx->dtype, &low);
    if (st == WEFT_OK) {
      sw[nsw++] = (swap){d, low};
      var->value = low;
    }
  }
  for (int i = 0; st == WEFT_OK && i < mx->nin; i++)
    if (mx->proxy[i]) sw[nsw++] = (swap){mx->proxy[i]->value, nn_var_now(mx->orig[i])};
  for (int k = mx->n0; st == WEFT_OK && k < nn; k++) {
    nn_node *n = nn_graph_node(g, k);
    if (n->kind != NN_NODE_OP) continue;
    n->mixed = true;
    for (int i = 0; st == WEFT_OK && i < n->nin; i++) {
      weft_var *o = original(mx, n->in[i]);
      bool was_proxy = o != n->in[i];
      n->in[i] = o;
      const weft_dtensor *u = n->in_used[i];
      if (!u) continue;
      const weft_dtensor *s = swapped(sw, nsw, u);
      if (s != u) {
        n->in_used[i] = s == nn_var_now(o) ? NULL : s;
      } else if (was_proxy && weft_dtensor_dtype(u) == WEFT_F32) {
        /* a redistributed copy of the widened input: kept in the input's
         * dtype (rounding exact but where the move summed a Partial) */
        weft_dtensor *low;
        st = nn_graph_converted(g, u, weft_dtensor_dtype(nn_var_now(o)), &low);
        if (st == WEFT_OK) {
          sw[nsw++] = (swap){u, low};
          n->in_used[i] = low;
        }
      }
    }
    for (int s = 0; s < NN_MAX_SAVED; s++)
      if (n->saved[s]) n->saved[s] = (weft_dtensor *)swapped(sw, nsw, n->saved[s]);
  }
  for (int j = 0; j < nout; j++)
    if (out[j]) out[j] = original(mx, out[j]);
  /* the f32 buffers are free again; the proxies become inert */
  for (int i = 0; i < nsw; i++)
    if (sw[i].from != sw[i].to) nn_graph_discard(g, sw[i].from);
  for (int i = 0; i < mx->nin; i++)
    if (mx->proxy[i]) {
      mx->proxy[i]->value = nn_var_now(mx->orig[i]);
      mx->proxy[i]->requires_grad = false;
    }
  free(sw);
  mx->active = false;
  return st;
}

/* ------------------------------------------------------------- backward */

weft_status nn_mixed_backward_begin(nn_node *n, const weft_dtensor **dout, nn_mixed_bwd *b) {
  memset(b, 0, sizeof *b);
  memcpy(b->in_used, n->in_used, sizeof b->in_used); /* restored by end, also on error */
  memcpy(b->saved, n->saved, sizeof b->saved);
  weft_graph *g = nn_node_graph(n);
  for (int j = 0; j < n->nout; j++) {
    if (dout[j] && is_low(weft_dtensor_dtype(dout[j]))) {
      weft_dtensor *w;
      WEFT_CHECK(widen(g, dout[j], &w));
      b->temp[b->ntemp++] = w;
      dout[j] = w;
    }
    const weft_dtensor *y = n->out[j]->value;
    if (is_low(weft_dtensor_dtype(y))) {
      weft_dtensor *w;
      WEFT_CHECK(widen(g, y, &w));
      b->temp[b->ntemp++] = w;
      b->out_value[j] = y;
      n->out[j]->value = w;
    }
  }
  for (int i = 0; i < n->nin; i++) {
    if (!n->in[i]) continue;
    const weft_dtensor *x = nn_node_input(n, i);
    if (!is_low(weft_dtensor_dtype(x))) continue;
    weft_dtensor *w;
    WEFT_CHECK(widen(g, x, &w));
    b->temp[b->ntemp++] = w;
    n->in_used[i] = w;
  }
  for (int s = 0; s < NN_MAX_SAVED; s++) {
    if (!n->saved[s] || !is_low(weft_dtensor_dtype(n->saved[s]))) continue;
    /* a saved output: the widened output already made above */
    weft_dtensor *w = NULL;
    for (int j = 0; j < n->nout && !w; j++)
      if (b->out_value[j] == n->saved[s]) w = (weft_dtensor *)n->out[j]->value;
    if (!w) {
      WEFT_CHECK(widen(g, n->saved[s], &w));
      b->temp[b->ntemp++] = w;
    }
    n->saved[s] = w;
  }
  return WEFT_OK;
}

weft_status nn_mixed_backward_end(nn_node *n, weft_status st, weft_dtensor **din, nn_mixed_bwd *b) {
  weft_graph *g = nn_node_graph(n);
  for (int j = 0; j < n->nout; j++)
    if (b->out_value[j]) n->out[j]->value = b->out_value[j];
  memcpy(n->in_used, b->in_used, sizeof b->in_used);
  memcpy(n->saved, b->saved, sizeof b->saved);
  /* one f32 grad may be handed to several inputs (add's backward): it is
   * rounded once per dtype, and discarded only when no other input has it */
  weft_dtensor *orig[NN_MAX_IN];
  for (int i = 0; i < n->nin; i++) orig[i] = din[i];
  for (int i = 0; st == WEFT_OK && i < n->nin; i++) {
    if (!din[i] || !n->in[i]) continue;
    weft_dtype want = weft_dtensor_dtype(nn_var_now(n->in[i]));
    if (!is_low(want) || weft_dtensor_dtype(din[i]) == want) continue;
    int done = -1, shared = 0;
    for (int k = 0; k < n->nin; k++) {
      if (k == i || orig[k] != orig[i]) continue;
      shared = 1;
      if (k < i && din[k] != orig[k] && weft_dtensor_dtype(din[k]) == want) done = k;
    }
    if (done >= 0) {
      din[i] = din[done];
      continue;
    }
    weft_dtensor *low;
    st = nn_graph_converted(g, din[i], want, &low);
    if (st == WEFT_OK) {
      if (!shared) nn_graph_discard(g, din[i]);
      din[i] = low;
    }
  }
  /* the widened temporaries, but not one handed on as an input's grad (add's
   * backward hands the output grad itself to its inputs) */
  for (int t = 0; t < b->ntemp; t++) {
    bool handed = false;
    for (int i = 0; i < n->nin && !handed; i++) handed = din[i] == b->temp[t];
    if (!handed) nn_graph_discard(g, b->temp[t]);
  }
  return st;
}
