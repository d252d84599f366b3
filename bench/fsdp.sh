#!/bin/sh
# bench/fsdp.sh — weft FSDP (dp=2), TP (tp=2), 2-D (2x2 on 4 oversubscribed
# ranks) and one rank against PyTorch DDP over gloo (2 processes), tiny and
# small configs, same global batch, one thread per rank, in one run:
#
#     bench/fsdp.sh [BUILD_DIR] [TINY_STEPS] [SMALL_STEPS]
#
# BUILD_DIR defaults to build (weft-bench-fsdp is BUILD_DIR/bench/);
# steps are timed steps after one warmup step (defaults 5 and 2). Prints
# each run, then the table of bench/fsdp_torch.py --summary, whose last line
# is "tokens/s ratio weft-fsdp/torch-ddp (small): R".
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
tiny_steps=${2:-5}
small_steps=${3:-2}
bin=$build/bench/weft-bench-fsdp
[ -x "$bin" ] || { echo "fsdp.sh: $bin not found (build with -Dbench=true)" >&2; exit 1; }
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
: "${MPIEXEC_TIMEOUT:=1800}"
export MPIEXEC_TIMEOUT
log=$(mktemp /tmp/weft-fsdp-bench.XXXXXX)
trap 'rm -f "$log"' EXIT
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for cfg in tiny small; do
  if [ "$cfg" = tiny ]; then steps=$tiny_steps; else steps=$small_steps; fi
  for run in "1 single" "2 fsdp" "2 tp" "4 2d"; do
    set -- $run
    mpiexec -n "$1" "$bin" --config "$cfg" --mode "$2" --steps "$steps" --warmup 1 | tee -a "$log"
  done
  /usr/bin/python3 "$here/fsdp_torch.py" --ddp "$cfg" --ranks 2 --steps "$steps" --warmup 1 \
    | tee -a "$log"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/python3 "$here/fsdp_torch.py" --summary "$log"
