#!/usr/bin/env bash
# The GPU proof of weft's whole stack, in one run on a GPU machine (an H200
# lent for minutes; it reaches no network). From the repo root:
#
#   bash tests/gpu/fetch_debs.sh          # here, once: .debs/ (~32 MiB)
#   bash tests/gpu/run.sh                 # there, with .debs carried along
#
# Steps (each under its own timeout; the whole run stays under 9 minutes):
#   0. unpack .debs/ into a private sysroot (MPICH, Criterion, OpenBLAS,
#      cJSON, pkgconf: the GPU image has CUDA, gcc, meson and ninja only),
#      make this run's own `mpiexec` link (whether or not one exists), check
#      the libraries with ldd, configure with -Dcuda=enabled -Dwerror=false
#      and build only what the steps below run;
#   a. the backend conformance suite (tests/kernels/test_backend.c) on the
#      GPU and the runtime tests;
#   b. (run after c: the measurements come first) the golden checks on the device: the PyTorch float64 golden suites
#      of the reference models with their meshes on the GPU (tests/models
#      *_on_device: loss 1e-6, grads 1e-5, AdamW) and weft-train --device
#      cuda against the CPU path on 1, 2 and 4 ranks sharing the GPU (NCCL
#      refuses a shared GPU: MPI with host staging, logged), checkpoints
#      moving between the GPU and the CPU, FSDP's device memory and
#      cpu_offload, and the fsdp suite's *_on_device cases;
#   c. GPT-2 124M (models/gpt2 through weft-train, llm.c's benchmark config
#      D=768 L=12 H=12 T=1024 V=50304, batch 4) on one GPU: step time,
#      tokens/s and MFU against 989 TFLOP/s (H200 dense bf16), with bf16
#      and with TF32 matrix products (--matmul; the rest is fp32), and in
#      bf16 mixed precision (--dtype bf16: bf16 parameters and activations).
# The full log goes to $WEFT_GPU_LOG (default: $OUT/gpu_run.log when $OUT
# is set, else build-gpu/gpu_run.log); a summary table and the RESULT lines
# end it. Exit status: the number of failed steps.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source tests/gpu/lib.sh
echo "weft GPU run $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || true
command -v nvcc && nvcc --version | tail -1
gpu_prepare
TARGETS=(tests/kernels/test_backend tests/cuda/test_cuda_host tests/cuda/device_comm_worker tests/models/test_models
         tests/models/test_llama tests/models/gpt2_worker tests/models/llama_worker
         tests/fsdp/test_fsdp tests/fsdp/fsdp_worker tests/examples/test_examples
         examples/weft-train)
step build 300 ninja -C "$BUILD" "${TARGETS[@]}" || finish 99
step ldd_build 30 ldd_ok "$BUILD/examples/weft-train" "$BUILD/tests/models/test_models" \
  "$BUILD/tests/kernels/test_backend" || finish 99

# ---- a. kernels and runtime -------------------------------------------------
step backend_conformance 150 "$BUILD/tests/kernels/test_backend" --jobs=1 --verbose \
  --filter 'backend_cuda/*'
step runtime 60 "$BUILD/tests/cuda/test_cuda_host" --jobs=1

# ---- c. GPT-2 124M on one GPU ------------------------------------------------
gpt2() { # gpt2 MATMUL [BATCH [DTYPE]]: 10 steps (the first is warm-up), RESULT lines from the summary
  local m=$1 b=${2:-4} d=${3:-fp32}
  local out=$BUILD/gpt2_${m}_b${b}_$d.txt
  "$BUILD/examples/weft-train" --model gpt2 --device cuda --matmul "$m" --batch "$b" --dtype "$d" \
    --steps 10 --val-every 0 --warmup 2 --peak-tflops 989 > "$out" 2>&1
  local rc=$?
  cat "$out"
  [ $rc -eq 0 ] || return $rc
  echo "RESULT gpt2-124M --matmul $m --dtype $d B=$b T=1024 1 GPU: $(grep -E 'step time|tokens/s|MFU|peak memory' "$out" |
    sed 's/  */ /g' | paste -sd';' -)"
}
export -f gpt2
export BUILD
step gpt2_124M_matmul_bf16 200 gpt2 bf16
step gpt2_124M_matmul_tf32 150 gpt2 tf32
# bf16 mixed precision (FSDP over the one rank: bf16 parameters and activations)
step gpt2_124M_dtype_bf16 150 gpt2 bf16 4 bf16
# where the step's time goes: every kernel's GPU time (ncu, one metric, no
# clock control) over 2 steps of GPT-2 124M cut to 2 layers, largest first
kernel_times() {
  local ncu
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  [ -n "$ncu" ] || { echo "no ncu here: kernel times not measured"; return 0; }
  "$ncu" --clock-control none --csv --metrics gpu__time_duration.sum --print-summary per-kernel \
    "$BUILD/examples/weft-train" --model gpt2 --layers 2 --device cuda --matmul bf16 --batch 4 \
    --steps 2 --val-every 0 --quiet > "$BUILD/ncu_gpt2.csv" 2> "$BUILD/ncu_gpt2.err"
  local rc=$?
  tail -5 "$BUILD/ncu_gpt2.err"
  [ $rc -eq 0 ] || return $rc
  python3 tests/gpu/kernel_times.py < "$BUILD/ncu_gpt2.csv" | sed 's/^/KERNELS /'
}
export -f kernel_times


# ---- b. the golden checks and the CPU parity, on the device -----------------
step golden_gpt2_on_device 120 "$BUILD/tests/models/test_models" --jobs=1 --verbose \
  --filter '*/*on_device*'
step golden_llama_on_device 120 "$BUILD/tests/models/test_llama" --jobs=1 --verbose \
  --filter '*/*on_device*'
step fsdp_on_device 150 "$BUILD/tests/fsdp/test_fsdp" --jobs=1 --verbose --filter '*/*on_device*'
step weft_train_device_vs_cpu 200 "$BUILD/tests/examples/test_examples" --jobs=1 --verbose \
  --filter 'examples/train_on_the_device*'
step weft_train_checkpoints 200 "$BUILD/tests/examples/test_examples" --jobs=1 --verbose \
  --filter 'examples/train_checkpoint_moves*'
step weft_train_fsdp_device_memory 120 "$BUILD/tests/examples/test_examples" --jobs=1 --verbose \
  --filter 'examples/train_fsdp_halves*'
step weft_train_cpu_offload 120 "$BUILD/tests/examples/test_examples" --jobs=1 --verbose \
  --filter 'examples/train_cpu_offload*'
step gpt2_124M_kernel_times 150 kernel_times

finish
