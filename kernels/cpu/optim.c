/* kernels/cpu/optim.c — CPU fp32 optimizer steps and gradient clipping
 * helpers (layers.h): AdamW (torch's single-tensor update, with the
 * bias-correction scalars in double as torch computes them; 4-float
 * vectors unless amsgrad, the same operations in the same order as the
 * scalar tail), SGD with momentum / Nesterov, and for clip_grad_norm the
 * sum of squares in double, the clip coefficient and an in-place scale. */
#include <math.h>
#include <stdint.h>

#include "arg_checks.h"
#include "layers.h"
#include "simd.h"

weft_status weft_adamw_step(float *param, const float *grad, float *m, float *v, float *vmax,
                            int64_t n, int64_t step, const weft_adamw_params *hp) {
  CHECK_SIZES(n);
  if (!hp) return weft_error_at(WEFT_ERR_INVALID, "adamw_step", "hyper-parameters are NULL");
  CHECK_PTR(param, n);
  CHECK_PTR(grad, n);
  CHECK_PTR(m, n);
  CHECK_PTR(v, n);
  if (hp->amsgrad) CHECK_PTR(vmax, n);
  WEFT_CHECK_ADAMW_HP_("adamw_step", hp, step); /* torch's argument checks (AdamW.__init__) */
  /* Scalars as torch computes them (Python floats, i.e. double). */
  const double bc1 = 1.0 - pow((double)hp->beta1, (double)step);
  const double bc2 = 1.0 - pow((double)hp->beta2, (double)step);
  const float step_size = (float)((double)hp->lr / bc1);
  const float bc2_sqrt = (float)sqrt(bc2);
  const float decay = (float)(1.0 - (double)hp->lr * (double)hp->weight_decay);
  const float one_m_b1 = 1.0f - hp->beta1, one_m_b2 = 1.0f - hp->beta2;
  const float sign = hp->maximize ? -1.0f : 1.0f;
  int64_t i = 0;
  if (!hp->amsgrad) {
    /* the loop below on 4 lanes, the same operations in the same order */
    const vf4 vsign = vset(sign), vdecay = vset(decay), vb1 = vset(one_m_b1), vb2 = vset(hp->beta2),
              v1b2 = vset(one_m_b2), vbc2 = vset(bc2_sqrt), veps = vset(hp->eps),
              vstep = vset(step_size);
    for (; i + VL <= n; i += VL) {
      const vf4 g = vsign * vload(grad + i);
      vf4 p = vload(param + i) * vdecay;
      vf4 mi = vload(m + i), vi = vload(v + i);
      mi = mi + vb1 * (g - mi);
      vi = vi * vb2 + v1b2 * g * g;
      vstore(m + i, mi);
      vstore(v + i, vi);
      const vf4 denom = vsqrt(vi) / vbc2 + veps;
      vstore(param + i, p - vstep * (mi / denom));
    }
  }
  for (; i < n; i++) {
    const float g = sign * grad[i];
    float p = param[i] * decay;
    const float mi = m[i] + one_m_b1 * (g - m[i]); /* exp_avg.lerp_(grad, 1 - beta1) */
    const float vi = v[i] * hp->beta2 + one_m_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    float vv = vi;
    if (hp->amsgrad) {
      vv = vmax[i] > vi ? vmax[i] : vi;
      vmax[i] = vv;
    }
    const float denom = sqrtf(vv) / bc2_sqrt + hp->eps;
    param[i] = p - step_size * (mi / denom);
  }
  return WEFT_OK;
}

weft_status weft_sgd_step(float *param, const float *grad, float *buf, int64_t n, int64_t step,
                          const weft_sgd_params *hp) {
  CHECK_SIZES(n);
  if (!hp) return weft_error_at(WEFT_ERR_INVALID, "sgd_step", "hyper-parameters are NULL");
  CHECK_PTR(param, n);
  CHECK_PTR(grad, n);
  if (hp->momentum != 0.0f) CHECK_PTR(buf, n);
  WEFT_CHECK_SGD_HP_("sgd_step", hp, step); /* torch's argument checks (SGD.__init__) */
  const float sign = hp->maximize ? -1.0f : 1.0f;
  const float mom = hp->momentum, damp = 1.0f - hp->dampening, wd = hp->weight_decay;
  for (int64_t i = 0; i < n; i++) {
    float d = sign * grad[i];
    if (wd != 0.0f) d += wd * param[i];
    if (mom != 0.0f) {
      float bi = step == 1 ? d : mom * buf[i] + damp * d;
      buf[i] = bi;
      d = hp->nesterov ? d + mom * bi : bi;
    }
    param[i] -= hp->lr * d;
  }
  return WEFT_OK;
}

double weft_sumsq(const float *x, int64_t n) {
  if (!x) return 0.0;
  return row_dot_d(x, x, n);
}

void weft_scale_f32(float *x, int64_t n, float alpha) {
  if (!x) return;
  const vf4 a = vset(alpha);
  int64_t i = 0;
  for (; i + VL <= n; i += VL) vstore(x + i, vload(x + i) * a);
  for (; i < n; i++) x[i] *= alpha;
}
