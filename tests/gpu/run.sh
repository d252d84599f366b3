#!/usr/bin/env bash
# The GPU proof of weft's CUDA backend, in one run on a GPU machine (an H200
# lent for minutes; it reaches no network). From the repo root:
#
#   bash tests/gpu/fetch_debs.sh          # here, once: .debs/ (~32 MiB)
#   bash tests/gpu/run.sh                 # there, with .debs carried along
#
# Steps (each under its own timeout; the whole run stays under 8 minutes):
#   0. unpack .debs/ into a private sysroot (MPICH, Criterion, OpenBLAS,
#      cJSON, pkgconf: the GPU image has CUDA, gcc, meson and ninja only),
#      configure with -Dcuda=enabled and build;
#   a. the backend conformance suite (tests/kernels/test_backend.c) on the
#      GPU: every operation of backend.h against double references on fresh
#      random inputs, outputs poisoned first (fp32 rel. error <= 1e-5, bf16
#      <= 1e-2), the same argument errors as the CPU; plus the runtime tests;
#   b. one training step of the tiny golden configs on 1 rank and on 2 ranks
#      sharing the GPU (NCCL refuses that: MPI with host staging, logged),
#      compared with the PyTorch float64 golden data that the CPU backend
#      matches (loss 1e-6, grads 1e-5, AdamW update 1e-3);
#   c. the GPT-2-small-sized step (D=768, L=12, H=12, T=1024, V=50304, bf16):
#      tokens/s and MFU against 989 TFLOP/s dense bf16.
# The full log goes to $WEFT_GPU_LOG (default: $OUT/gpu_run.log when $OUT
# is set, else build-gpu/gpu_run.log); a summary table ends it. Exit status:
# the number of failed steps.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD
BUILD=${WEFT_GPU_BUILD:-build-gpu}
mkdir -p "$BUILD"
LOG=${WEFT_GPU_LOG:-${OUT:+$OUT/gpu_run.log}}
LOG=${LOG:-$BUILD/gpu_run.log}
exec > >(tee "$LOG") 2>&1
T0=$(date +%s)
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell} OPENBLAS_NUM_THREADS=1
export WEFT_TIMEOUT=${WEFT_TIMEOUT:-120}

declare -a SUMMARY=()
FAILED=0
step() { # step NAME TIMEOUT_S CMD...: runs CMD, records pass/fail and time
  local name=$1 limit=$2
  shift 2
  local t=$(date +%s)
  echo
  echo "=== $name: $*"
  timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  local dt=$(( $(date +%s) - t ))
  if [ $rc -eq 0 ]; then SUMMARY+=("PASS  $name (${dt}s)"); else
    SUMMARY+=("FAIL  $name (rc $rc, ${dt}s)"); FAILED=$((FAILED + 1)); fi
  return $rc
}

echo "weft GPU run $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || true
command -v nvcc && nvcc --version | tail -1

# ---- 0. dependencies and build ------------------------------------------
if [ -d .debs ] && ls .debs/*.deb > /dev/null 2>&1; then
  SYSROOT=${WEFT_SYSROOT:-/opt/weft-sysroot}
  mkdir -p "$SYSROOT"
  for f in .debs/*.deb; do dpkg-deb -x "$f" "$SYSROOT" || echo "could not unpack $f"; done
  LIBDIR=$SYSROOT/usr/lib/x86_64-linux-gnu
  export PATH=$SYSROOT/usr/bin:$PATH
  export LD_LIBRARY_PATH=$LIBDIR:$LIBDIR/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export LIBRARY_PATH=$LIBDIR:$LIBDIR/openblas-pthread${LIBRARY_PATH:+:$LIBRARY_PATH}
  export PKG_CONFIG=$SYSROOT/usr/bin/pkgconf
  export PKG_CONFIG_SYSROOT_DIR=$SYSROOT
  export PKG_CONFIG_LIBDIR=$LIBDIR/pkgconfig:$LIBDIR/openblas-pthread/pkgconfig:$SYSROOT/usr/share/pkgconfig
  # criterion.pc's private requirements (libgit2, ...) are only for static
  # links; runtime-only packages lack the lib*.so names that -l needs.
  sed -i '/^Requires.private/d' "$LIBDIR/pkgconfig/criterion.pc"
  for so in "$LIBDIR"/lib*.so.[0-9]*; do
    dev=${so%%.so.*}.so
    [ -e "$dev" ] || ln -s "$(basename "$so")" "$dev"
  done
  echo "dependencies unpacked into $SYSROOT"
fi
command -v mpiexec > /dev/null || { [ -x "${SYSROOT:-/nonexistent}/usr/bin/mpiexec.hydra" ] &&
  ln -sf mpiexec.hydra "$SYSROOT/usr/bin/mpiexec"; }

if [ ! -f "$BUILD/build.ninja" ]; then
  step configure 120 meson setup "$BUILD" -Dcuda=enabled -Dwerror=true --buildtype=debugoptimized ||
    { printf '%s\n' "${SUMMARY[@]}"; exit 99; }
fi
step build 240 ninja -C "$BUILD" || { printf '%s\n' "${SUMMARY[@]}"; exit 99; }

# ---- a. kernels and runtime -------------------------------------------------
step backend_conformance 180 "$BUILD/tests/kernels/test_backend" --jobs=1 --verbose
step runtime 60 "$BUILD/tests/cuda/test_cuda_host" --jobs=1

# ---- b. tiny training step, 1 and 2 ranks ----------------------------------
TRAIN=$BUILD/examples/gpu/weft-gpu-train
for cfg in tiny_mha tiny_gqa; do
  step "train_${cfg}_1rank" 60 "$TRAIN" --config "$cfg" --golden "tests/data/golden/$cfg"
done
step train_tiny_mha_2ranks_shared_gpu 90 mpiexec -n 2 "$TRAIN" --config tiny_mha \
  --golden tests/data/golden/tiny_mha

# ---- c. GPT-2-small-sized bf16 step -----------------------------------------
step gpt2s_bf16 180 "$TRAIN" --config gpt2s --precision bf16 --warmup 3 --steps 10
step gpt2s_tf32 120 "$TRAIN" --config gpt2s --precision tf32 --warmup 2 --steps 5

echo
echo "=== summary ($(( $(date +%s) - T0 )) s in all; log: $LOG)"
printf '%s\n' "${SUMMARY[@]}"
grep -h '^RESULT' "$LOG" | sort -u || true
exit $FAILED
