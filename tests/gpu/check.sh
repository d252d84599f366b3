#!/usr/bin/env bash
# The short GPU check: its answer in under 5 minutes on a fresh H100 or
# H200 machine that reaches no network. From the repo root:
#
#   bash tests/gpu/fetch_debs.sh          # here, once: .debs/ (~32 MiB)
#   bash tests/gpu/check.sh               # there, with .debs carried along
#   bash tests/gpu/check.sh --dry-run     # here: the same steps on the emulated
#                                         # build and a shrunk model (the suite
#                                         # runs it: tests/gpu/test_gpu_check.c)
#
# Steps (tests/gpu/lib.sh: each under its own timeout, the whole run inside
# WEFT_GPU_BUDGET, default 280 s):
#   0. dependencies from .debs, this run's mpiexec, configure with
#      -Dcuda=enabled and build only what the steps run (weft-train, the
#      backend conformance suite, the examples suite and its workers);
#   1. the backend conformance suite on the device, which fails when fewer
#      than WEFT_GPU_MIN_CASES cases (47 today) passed: a GPU that the
#      process cannot see makes them skip, and that must not pass;
#   2. GPT-2 124M (models/gpt2 through weft-train: llm.c's config, D=768
#      L=12 H=12 T=1024 V=50304), --dtype bf16 --matmul bf16, B=8 and B=16,
#      20 steps each: one RESULT line each with the median step time,
#      tokens/s and MFU (of the GPU's dense bf16 peak), the roofline model's
#      prediction for the same step beside it (--predict, the GPU's kind),
#      and a GOAL line against 45% MFU;
#   3. one multi-rank parity check: weft-train --device cuda against the
#      CPU path on 1, 2 and 4 ranks (tests/examples).
# --dry-run: no .debs, no configure or build; $WEFT_GPU_BUILD must be an
# emulated build (-Dcuda=emulated) already built; GPT-2 is gpt2-demo at
# T=32 (B=8 and 16, 3 steps), and the check of step 1 still holds (the
# emulator runs every case). The log: $WEFT_GPU_LOG, else $OUT/gpu_check.log,
# else $BUILD/gpu_check.log. Exit status: the number of failed steps.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
export WEFT_GPU_BUDGET=${WEFT_GPU_BUDGET:-280}
GPU_LOG_NAME=gpu_check
if [ $DRY = 1 ]; then
  export WEFT_GPU_BUILD=${WEFT_GPU_BUILD:-build-emu}
  [ -f "$WEFT_GPU_BUILD/build.ninja" ] || {
    echo "--dry-run: $WEFT_GPU_BUILD is not a build (meson setup $WEFT_GPU_BUILD -Dcuda=emulated)"
    exit 99
  }
fi
source tests/gpu/lib.sh
echo "weft GPU check $(date -u +%FT%TZ) on $(hostname)$([ $DRY = 1 ] && echo ' (dry run)')"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
echo "GPU: ${GPU:-none seen by nvidia-smi}"

if [ $DRY = 0 ]; then
  command -v nvcc && nvcc --version | tail -1
  gpu_prepare
  step build 150 ninja -C "$BUILD" tests/kernels/test_backend tests/examples/test_examples \
    examples/weft-train || finish 99
  step ldd_build 30 ldd_ok "$BUILD/examples/weft-train" "$BUILD/tests/kernels/test_backend" ||
    finish 99
fi

# ---- 1. the backend conformance suite, on the device ------------------------
conformance() {
  local out=$BUILD/gpu_check_backend.txt want=${WEFT_GPU_MIN_CASES:-47}
  "$BUILD/tests/kernels/test_backend" --jobs=1 --verbose --filter 'backend_cuda/*' > "$out" 2>&1
  local rc=$? n
  n=$(grep -c '^\[PASS\]' "$out")
  tail -3 "$out"
  echo "backend_cuda cases passed: $n (at least $want expected)"
  [ "$rc" -eq 0 ] || return "$rc"
  [ "$n" -ge "$want" ] || { echo "only $n cases ran: is the GPU visible to this process?"; return 1; }
}
export -f conformance
export BUILD
step backend_conformance 90 conformance

# ---- 2. GPT-2 124M, bf16, B=8 and B=16 --------------------------------------
case "$GPU" in *H200*) PREDICT=h200 ;; *) PREDICT=h100 ;; esac
export PREDICT DRY
gpt2_check() { # gpt2_check BATCH: the RESULT and GOAL lines of one run
  local b=$1 out=$BUILD/gpu_check_gpt2_b$b.txt
  local -a model=(--model gpt2 --steps 20 --warmup 2)
  [ "$DRY" = 1 ] && model=(--model gpt2-demo --steps 3 --warmup 1)
  "$BUILD/examples/weft-train" "${model[@]}" --device cuda --dtype bf16 --matmul bf16 \
    --batch "$b" --val-every 0 --quiet --predict "$PREDICT" > "$out" 2>&1
  local rc=$?
  grep -E 'step time|tokens/s|MFU|peak memory|predicted on' "$out" | tail -8
  [ $rc -eq 0 ] || { tail -20 "$out"; return $rc; }
  # the summary's medians; the model's last step
  local step tps mfu pred pmfu
  step=$(sed -n 's/^ *step time (after step 1) *\([0-9.]*\) ms median.*/\1/p' "$out")
  tps=$(sed -n 's/^ *tokens\/s (after step 1) *\([0-9.]*\).*/\1/p' "$out")
  mfu=$(sed -n 's/^ *MFU *\([0-9.]*\)%.*/\1/p' "$out")
  pred=$(sed -n 's/.*predicted on [^:]*: step \([0-9.]*\) ms.*/\1/p' "$out" | tail -1)
  pmfu=$(sed -n 's/.*predicted on .*MFU \([0-9.]*\)%.*/\1/p' "$out" | tail -1)
  [ -n "$step" ] && [ -n "$tps" ] && [ -n "$mfu" ] && [ -n "$pred" ] ||
    { echo "could not read the run's summary or prediction"; return 1; }
  echo "RESULT gpt2-124M bf16 B=$b $([ "$DRY" = 1 ] && echo 'T=32 (dry run: gpt2-demo)' || echo T=1024):" \
    "median step $step ms, $tps tok/s, MFU $mfu%; modeled ($PREDICT) $pred ms, MFU $pmfu%"
  echo "GOAL gpt2-124M bf16 B=$b: MFU $mfu% against 45%:" \
    "$(awk -v m="$mfu" 'BEGIN { print (m >= 45 ? "met" : "not met") }')"
}
export -f gpt2_check
step gpt2_124M_bf16_B8 100 gpt2_check 8
step gpt2_124M_bf16_B16 120 gpt2_check 16

# ---- 3. one multi-rank device-vs-CPU parity check ---------------------------
step weft_train_device_vs_cpu 90 "$BUILD/tests/examples/test_examples" --jobs=1 --verbose \
  --filter 'examples/train_on_the_device*'

finish
