/* tests/models/model_device.h — the check the tests/models workers
 * (gpt2_worker, llama_worker, ac_worker) add in their device mode (see
 * tests/harness/worker.h: WEFT_TEST_DEVICE=cuda puts every root mesh on
 * WEFT_CUDA): that a model's parameters really went there. Needs nn.h and
 * worker.h. */
#ifndef WEFT_TESTS_MODELS_MODEL_DEVICE_H
#define WEFT_TESTS_MODELS_MODEL_DEVICE_H

#include "nn.h"
#include "worker.h"

/* In device mode, checks that every parameter of model (its data, and its
 * grad where it has one) lives on WEFT_CUDA, naming the first that does
 * not; nothing in host mode. */
static inline void model_check_params_on_device(weft_module *model, const char *what) {
  if (!model || !weft_worker_device_mode()) return;
  weft_param *ps[512];
  int np = 0;
  WOK(weft_module_parameters(model, ps, 512, &np));
  for (int i = 0; i < np; i++) {
    const weft_tensor *d = ps[i]->data ? weft_dtensor_local(ps[i]->data) : NULL;
    const weft_tensor *gr = ps[i]->grad ? weft_dtensor_local(ps[i]->grad) : NULL;
    bool ok = d && d->device == WEFT_CUDA && (!gr || gr->device == WEFT_CUDA);
    WCHECK(ok, "%s: parameter %s is not on the device (data on %s, grad on %s)", what, ps[i]->fqn,
           d ? weft_device_name(d->device) : "-", gr ? weft_device_name(gr->device) : "-");
    if (!ok) return;
  }
}

#endif
