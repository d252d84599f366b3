#!/usr/bin/env bash
# MPI's rendezvous across nodes, three ways (mesh/init.c and
# mesh/collectives.c; docs/DESIGN.md "MPICH notes"): weft-train's step on
# emulated nodes (scripts/nodes.sh; root) with UCX's rendezvous and no
# presync (WEFT_TCP_EAGER=0 WEFT_PRESYNC_BYTES=0), with rendezvous and
# presync, the barrier before large blocking collectives on groups that
# hold whole nodes (WEFT_TCP_EAGER=0), and weft's default on a host without
# RDMA: every UCX message eager (UCX_RNDV_THRESH=inf, set by weft_init).
# Rounds alternate the three; each prints weft-train's median step time,
# and the last line gives the medians over rounds and their ratios to the
# first (> 1: faster than rendezvous without presync).
#
#     sudo bash bench/presync.sh [BUILD_DIR]        (default: build)
#
# Environment: PRESYNC_RATE (200mbit), PRESYNC_ROUNDS (3), PRESYNC_MESHES
# ("2x1:dp_replicate=2 2x2:dp_replicate=4 2x2:dp_replicate=2,dp_shard=2":
# nodes x ranks per node, then weft-train's --mesh; HSDP's replicate groups
# share their nodes' links and skip presync). The model is weft-plan's
# "measure" (D=128 L=2 H=4 F=352 V=256 T=64, batch 8), 16 steps a run.
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
  arms=("WEFT_TCP_EAGER=0 WEFT_PRESYNC_BYTES=0" "WEFT_TCP_EAGER=0" "")
  names=("rendezvous" "rendezvous + presync" "eager (default)")
  times=("" "" "")
  for ((i = 1; i <= rounds; i++)); do
    for a in 0 1 2; do
      genv=()
      for kv in ${arms[$a]}; do genv+=(-genv "${kv%%=*}" "${kv#*=}"); done
      ms=$(bash scripts/nodes.sh run -- mpiexec -n $((k * r)) "${genv[@]}" \
        "$TRAIN" --mesh "$mesh" "${model[@]}" | sed -n 's/.*step time (after step 1) *\([0-9.]*\) ms median.*/\1/p')
      [ -n "$ms" ] || {
        echo "presync.sh: weft-train printed no step time ($shape $mesh, ${names[$a]})" >&2
        exit 1
      }
      echo "$shape $mesh round $i ${names[$a]} (${arms[$a]:-no setting}): median step $ms ms"
      times[a]+="$ms"$'\n'
    done
  done
  bash scripts/nodes.sh down >/dev/null
  m0=$(printf '%s' "${times[0]}" | median) m1=$(printf '%s' "${times[1]}" | median)
  m2=$(printf '%s' "${times[2]}" | median)
  r1=$(awk -v a="$m0" -v b="$m1" 'BEGIN{printf "%.2f", a / b}')
  r2=$(awk -v a="$m0" -v b="$m2" 'BEGIN{printf "%.2f", a / b}')
  echo "$shape $mesh at $rate: rendezvous $m0 ms, + presync $m1 ms (x$r1), eager $m2 ms (x$r2)"
  summary+="${summary:+; }$shape $mesh $m0 -> $m1 (x$r1) -> $m2 ms (x$r2)"
done
echo "presync ($rate, median step: rendezvous -> + presync -> eager, the default) $summary"
