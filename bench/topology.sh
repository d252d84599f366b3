#!/usr/bin/env bash
# Mesh-topology experiments on emulated nodes: for each inter-node link
# rate, brings up 2 nodes x 2 ranks (scripts/nodes.sh; root), runs
# `weft-plan --measure` (the link and collective probe, then every
# factorisation of the 4 ranks, both tp layouts, for a few steps each) and
# takes the nodes down again. weft-plan prints predicted against measured
# step time per factorisation, the predicted and measured fastest, the
# Spearman correlation of the two rankings and the largest error; it writes
# an SVG (predicted x, measured y, one numbered point each) and a JSON.
#
#     sudo bash bench/topology.sh [BUILD_DIR]        (default: build)
#
# Environment: TOPO_RATES (default "1gbit 200mbit"), TOPO_MODEL ("measure":
# D=128 L=2 H=4 F=352 V=256 T=64), TOPO_STEPS (8), TOPO_REPEAT (4 rounds
# over all factorisations). Writes bench/results/topology-RATE.{txt,svg,json};
# the last line sums up every rate (bench/run puts it in the README's
# table). About 1.5 minutes on 2 idle cores; other load makes the step
# times, and so the errors, noisier.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD_DIR="${1:-${WEFT_BUILD_DIR:-build}}"
PLAN="$BUILD_DIR/examples/weft-plan"
source bench/nodes_env.sh topology.sh wtopo "$PLAN"
mkdir -p bench/results
summary=""
for rate in ${TOPO_RATES:-1gbit 200mbit}; do
  out="bench/results/topology-$rate"
  bash scripts/nodes.sh up 2 --ranks-per-node 2 --link "$rate"
  echo "uptime before: $(uptime)" | tee "$out.txt"
  bash scripts/nodes.sh run -- mpiexec -n 4 "$PLAN" --measure --model "${TOPO_MODEL:-measure}" \
    --steps "${TOPO_STEPS:-8}" --repeat "${TOPO_REPEAT:-4}" --svg "$out.svg" --json "$out.json" |
    tee -a "$out.txt"
  bash scripts/nodes.sh down
  rho=$(sed -n 's/^Spearman rank correlation.*: //p' "$out.txt")
  err=$(sed -n 's/^max |error|: //p' "$out.txt")
  pf=$(sed -n 's/^predicted fastest: //p' "$out.txt")
  mf=$(sed -n 's/^measured fastest:  //p' "$out.txt")
  same=no
  [ "$pf" = "$mf" ] && same=yes
  summary+="${summary:+; }$rate: Spearman $rho, max error $err, same fastest $same"
done
echo "topology (2 nodes x 2 ranks) $summary"
