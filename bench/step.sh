#!/usr/bin/env bash
# One training step (forward, backward, clip_grad_norm, AdamW) of the
# reference model on 1 rank, weft against PyTorch (Debian's python3-torch,
# /usr/bin/python3, fp32, same weights and tokens), interleaved round by
# round in one run; see bench/step.c and bench/step_torch.py.
#
#     bash bench/step.sh [BUILD_DIR]        (default: build)
#     STEP_CONFIGS="gpt2-tiny gpt2-small" bash bench/step.sh    (the GPT-2 row)
#
# Environment: STEP_THREADS (default: the number of CPUs) threads for both
# sides; STEP_CONFIGS (default "tiny small": the Llama; "gpt2-tiny
# gpt2-small": models/gpt2 against bench/gpt2_torch.py, the same sizes);
# STEP_STEPS (timed rounds, 5), STEP_STEPS_SMALL (3, for small and
# gpt2-small), STEP_WARMUP (2: torch's first steps are slow).
# Prints the per-round times, a table (ms/step, tokens/s, MFU against the
# OpenBLAS SGEMM rate measured in the same run, ratios) and last
# `step time ratio weft/torch (<last config>): R`, after a table of the peak
# memory (max RSS) of each side and their ratio. About 3 minutes for the
# Llama configs on 2 idle cores, 7 for the GPT-2 ones at load 5 (mostly the
# small config's steps); load from other processes stretches it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD_DIR="${1:-${WEFT_BUILD_DIR:-build}}"
BIN="$BUILD_DIR/bench/weft-bench-step"
if [ ! -x "$BIN" ]; then
  echo "step.sh: $BIN not found (build first: meson setup $BUILD_DIR && ninja -C $BUILD_DIR)" >&2
  exit 1
fi
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "step.sh: /usr/bin/python3 cannot import torch (apt-get install python3-torch)" >&2
  exit 1
fi
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}"
N="${STEP_THREADS:-$(nproc)}"
echo "weft vs torch training step: $N threads, $(nproc) CPUs, OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE"
echo "uptime: $(uptime)"
# shellcheck disable=SC2086
exec /usr/bin/python3 bench/step_torch.py --weft "$BIN" --threads "$N" \
  --steps "${STEP_STEPS:-5}" --steps-small "${STEP_STEPS_SMALL:-3}" --warmup "${STEP_WARMUP:-2}" \
  ${STEP_CONFIGS:-tiny small}
