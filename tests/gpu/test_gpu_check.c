/* tests/gpu/check.sh --dry-run (issue 41 step 3): the short GPU check's
 * steps on this build when it is the emulated one (-Dcuda=emulated): the
 * backend conformance suite on the device with its count check, the two
 * GPT-2 runs with their RESULT and GOAL lines and the model's prediction,
 * and the multi-rank parity check. On a lent GPU the same script runs for
 * real (without --dry-run); here the main build, which sees no GPU, skips. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "harness.h"

static int count(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)) != NULL; p++) n++;
  return n;
}

Test(gpu_check, dry_run_passes_every_step_on_the_emulated_device, .timeout = 300) {
  if (weft_device_count(WEFT_CUDA) <= 0)
    cr_skip(
        "no WEFT_CUDA device in this build (%s): check.sh --dry-run runs on the emulated "
        "build (-Dcuda=emulated), check.sh itself on a GPU",
        weft_backend_get(WEFT_CUDA) ? "the CUDA backend is built but sees no GPU"
                                    : "no CUDA backend");
  char log[256], cmd[1024];
  snprintf(log, sizeof log, "/tmp/weft-gpu-check-%d.log", (int)getpid());
  /* env -u BXFI_MAP: the Criterion suites that check.sh starts would take
   * this process's sandbox map for their own and abort */
  snprintf(cmd, sizeof cmd,
           "env -u BXFI_MAP WEFT_GPU_BUILD='%s' WEFT_GPU_LOG='%s' bash '%s/tests/gpu/check.sh' "
           "--dry-run > /dev/null 2>&1",
           WEFT_BUILD_ROOT, log, WEFT_SOURCE_ROOT);
  int rc = system(cmd);
  char *out = weft_test_slurp(log, NULL);
  cr_assert(out, "check.sh wrote no log at %s (status %d)", log, rc);
  cr_expect_eq(rc, 0, "check.sh --dry-run failed (status %d):\n%s", rc, out);
  cr_expect(strstr(out, "backend_cuda cases passed: "), "%s", out);
  /* the summary at the end: the steps, then the RESULT and GOAL lines */
  const char *sum = strstr(out, "=== summary");
  cr_assert(sum, "no summary:\n%s", out);
  cr_expect_eq(count(sum, "\nPASS  "), 4, "four steps pass:\n%s", sum);
  cr_expect_eq(count(sum, "\nRESULT gpt2-124M bf16 B="), 2, "%s", sum);
  cr_expect_eq(count(sum, "\nGOAL gpt2-124M bf16 B="), 2, "%s", sum);
  cr_expect(strstr(out, "modeled (h100) "), "the prediction beside the measurement:\n%s", out);
  free(out);
  remove(log);
}
