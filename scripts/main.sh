#!/usr/bin/env bash
# weft's main job: installs what is missing, builds, then runs the demo on a
# 2x2 mesh over 4 ranks, weft-train on the embedded data (FSDP on dp x TP on
# tp, 2x2 over 4 ranks) and the collective benchmark (2 ranks, then 4).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
BUILD_DIR="${WEFT_BUILD_DIR:-build}"
export MPIEXEC_TIMEOUT="${MPIEXEC_TIMEOUT:-600}"
mpiexec -n 4 "$BUILD_DIR/examples/weft-demo"
mpiexec -n 4 "$BUILD_DIR/examples/weft-train" --mesh dp=2,tp=2 --steps 200 --val-every 50 \
  --log-json "$BUILD_DIR/train-2x2.jsonl"
mpiexec -n 2 "$BUILD_DIR/bench/weft-bench-collectives" --json "$BUILD_DIR/bench-collectives-2.jsonl"
mpiexec -n 4 "$BUILD_DIR/bench/weft-bench-collectives" --json "$BUILD_DIR/bench-collectives-4.jsonl"
