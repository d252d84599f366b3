#!/usr/bin/env bash
# Presync across nodes (mesh/collectives.c): weft-train's step with the
# barrier before large blocking collectives on groups that span nodes
# (WEFT_PRESYNC_BYTES default, 64 KiB) against without it
# (WEFT_PRESYNC_BYTES=0), on emulated nodes (scripts/nodes.sh; root).
# Rounds alternate the two settings; each prints weft-train's median step
# time, and the last line gives the ratio of the medians over rounds
# (without / with: > 1 means presync is faster).
#
#     sudo bash bench/presync.sh [BUILD_DIR]        (default: build)
#
# Environment: PRESYNC_RATE (200mbit), PRESYNC_ROUNDS (3), PRESYNC_MESHES
# ("2x1:dp_replicate=2 2x2:dp_replicate=4 2x2:dp_replicate=2,dp_shard=2":
# nodes x ranks per node, then weft-train's --mesh; HSDP's replicate groups
# share their nodes' links and skip presync, so its ratio shows the noise).
# Presync applies to groups that span nodes and hold every rank of them. The model is weft-plan's "measure"
# (D=128 L=2 H=4 F=352 V=256 T=64, batch 8), 16 steps a run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD_DIR="${1:-${WEFT_BUILD_DIR:-build}}"
TRAIN="$BUILD_DIR/examples/weft-train"
source bench/nodes_env.sh presync.sh wpresync "$TRAIN"
rate="${PRESYNC_RATE:-200mbit}"
rounds="${PRESYNC_ROUNDS:-3}"
model=(--dim 128 --layers 2 --heads 4 --ffn-dim 352 --vocab 256 --seq-len 64 --batch 8
  --steps 16 --val-every 0)
median() { sort -g | awk '{v[NR]=$1} END{print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
summary=""
for spec in ${PRESYNC_MESHES:-2x1:dp_replicate=2 2x2:dp_replicate=4 2x2:dp_replicate=2,dp_shard=2}; do
  shape="${spec%%:*}" mesh="${spec#*:}"
  k="${shape%x*}" r="${shape#*x}"
  bash scripts/nodes.sh up "$k" --ranks-per-node "$r" --link "$rate" >/dev/null
  off="" on=""
  for ((i = 1; i <= rounds; i++)); do
    for bytes in 0 65536; do
      ms=$(bash scripts/nodes.sh run -- mpiexec -n $((k * r)) -genv WEFT_PRESYNC_BYTES "$bytes" \
        "$TRAIN" --mesh "$mesh" "${model[@]}" | sed -n 's/.*step time (after step 1) *\([0-9.]*\) ms median.*/\1/p')
      [ -n "$ms" ] || {
        echo "presync.sh: weft-train printed no step time ($shape $mesh)" >&2
        exit 1
      }
      echo "$shape $mesh round $i WEFT_PRESYNC_BYTES=$bytes: median step $ms ms"
      if [ "$bytes" = 0 ]; then off+="$ms"$'\n'; else on+="$ms"$'\n'; fi
    done
  done
  bash scripts/nodes.sh down >/dev/null
  moff=$(printf '%s' "$off" | median) mon=$(printf '%s' "$on" | median)
  ratio=$(awk -v a="$moff" -v b="$mon" 'BEGIN{printf "%.2f", a / b}')
  echo "$shape $mesh at $rate: $moff ms without presync, $mon ms with (ratio $ratio)"
  summary+="${summary:+; }$shape $mesh $moff -> $mon ms (x$ratio)"
done
echo "presync ($rate, median step without -> with) $summary"
