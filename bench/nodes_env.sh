# Sourced by the benchmarks that run on emulated nodes (topology.sh,
# presync.sh), from the repository root:
#
#     source bench/nodes_env.sh SCRIPT NODES_NAME PROGRAM
#
# Checks that PROGRAM (a path under the build directory) was built and that
# scripts/nodes.sh can make nodes here (root, namespaces), exporting the
# OpenBLAS settings the suite uses and WEFT_NODES_NAME=NODES_NAME (the
# benchmark's own nodes, apart from a user's); takes the nodes down on exit.
# Errors name SCRIPT.
[ -x "$3" ] || {
  echo "$1: $3 not found (build first)" >&2
  exit 1
}
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}" OPENBLAS_NUM_THREADS=1
export WEFT_NODES_NAME="$2"
bash scripts/nodes.sh check >/dev/null || {
  echo "$1: $(bash scripts/nodes.sh check)" >&2
  exit 1
}
trap 'bash scripts/nodes.sh down >/dev/null 2>&1 || true' EXIT
