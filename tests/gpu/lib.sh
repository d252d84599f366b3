# tests/gpu/lib.sh — what run.sh (the long GPU check) and check.sh (the
# short one) share; sourced from the repo root by both, never run alone:
#   - the log ($WEFT_GPU_LOG, else $OUT/<name>.log, else $BUILD/<name>.log,
#     name from GPU_LOG_NAME), tee'd;
#   - step NAME TIMEOUT_S CMD... (each step cut to what is left of
#     WEFT_GPU_BUDGET seconds) and finish (summary, RESULT/GOAL/KERNELS
#     lines, exit status = failed steps);
#   - gpu_prepare: unpack .debs/ into a private sysroot (MPICH, Criterion,
#     OpenBLAS, cJSON, pkgconf: the GPU image has CUDA, gcc, meson and
#     ninja only), this run's own mpiexec link, ldd of the tools, and
#     configure $BUILD with -Dcuda=enabled when it is not configured yet.
ROOT=$PWD
BUILD=${WEFT_GPU_BUILD:-build-gpu}
mkdir -p "$BUILD/bin"
LOG=${WEFT_GPU_LOG:-${OUT:+$OUT/${GPU_LOG_NAME:-gpu_run}.log}}
LOG=${LOG:-$BUILD/${GPU_LOG_NAME:-gpu_run}.log}
exec > >(tee "$LOG") 2>&1
T0=$(date +%s)
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell} OPENBLAS_NUM_THREADS=1
export WEFT_TIMEOUT=${WEFT_TIMEOUT:-60}
# nvcc where the image keeps it, whether or not it is on PATH
[ -x /usr/local/cuda/bin/nvcc ] && export PATH=$PATH:/usr/local/cuda/bin

declare -a SUMMARY=()
FAILED=0
# The whole run keeps inside WEFT_GPU_BUDGET seconds (the lease is short):
# each step's limit is cut to what is left, and a step with under 20 s left
# is skipped and reported as such.
DEADLINE=$((T0 + ${WEFT_GPU_BUDGET:-500}))
step() { # step NAME TIMEOUT_S CMD...: runs CMD, records pass/fail and time
  local name=$1 limit=$2
  shift 2
  local t=$(date +%s)
  local left=$((DEADLINE - t))
  if [ $left -lt 20 ]; then
    echo "=== $name: skipped, ${left}s of the budget left"
    SUMMARY+=("SKIP  $name (out of time)"); FAILED=$((FAILED + 1)); return 124
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo
  echo "=== $name: $*"
  # through bash, so CMD may be one of the functions below (exported)
  timeout --kill-after=10 "$limit" bash -c '"$@"' step "$@"
  local rc=$?
  local dt=$(( $(date +%s) - t ))
  if [ $rc -eq 0 ]; then SUMMARY+=("PASS  $name (${dt}s)"); else
    SUMMARY+=("FAIL  $name (rc $rc, ${dt}s)"); FAILED=$((FAILED + 1)); fi
  return $rc
}
finish() {
  echo
  echo "=== summary ($(( $(date +%s) - T0 )) s in all; log: $LOG)"
  printf '%s\n' "${SUMMARY[@]}"
  grep -h '^RESULT' "$LOG" | sort -u || true
  grep -h '^GOAL' "$LOG" || true
  grep -h '^KERNELS' "$LOG" || true
  exit "${1:-$FAILED}"
}

# every library the build and the runs need must resolve before anything runs
ldd_ok() {
  local bad=0 f
  for f in "$@"; do
    [ -e "$f" ] || continue
    if ldd "$f" | grep -q 'not found'; then
      echo "ldd $f:"; ldd "$f" | grep 'not found'; bad=1
    fi
  done
  return $bad
}
export -f ldd_ok

gpu_prepare() {
  SYSROOT=
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
  # this run's own mpiexec (hydra from the sysroot, else whatever is there),
  # first on PATH before meson records it for the tests
  HYDRA=
  for c in "${SYSROOT:+$SYSROOT/usr/bin/mpiexec.hydra}" "$(command -v mpiexec.hydra)" \
           "$(command -v mpiexec)"; do
    [ -n "$c" ] && [ -x "$c" ] && { HYDRA=$c; break; }
  done
  [ -n "$HYDRA" ] || { echo "no mpiexec.hydra or mpiexec found"; SUMMARY+=("FAIL  mpiexec"); finish 99; }
  ln -sf "$HYDRA" "$BUILD/bin/mpiexec"
  # hydra starts hydra_pmi_proxy from the folder it was called from
  PROXY=$(dirname "$HYDRA")/hydra_pmi_proxy
  [ -x "$PROXY" ] || PROXY=$(command -v hydra_pmi_proxy)
  [ -n "$PROXY" ] && ln -sf "$PROXY" "$BUILD/bin/hydra_pmi_proxy"
  export PATH=$ROOT/$BUILD/bin:$PATH
  echo "mpiexec: $(command -v mpiexec) -> $HYDRA"
  step ldd_tools 30 ldd_ok "$HYDRA" ${LIBDIR:+$LIBDIR/libmpich.so.12 $LIBDIR/libcriterion.so.3 \
    $LIBDIR/libcjson.so.1 $LIBDIR/openblas-pthread/libopenblas.so.0} || finish 99

  if [ ! -f "$BUILD/build.ninja" ]; then
    step configure 120 meson setup "$BUILD" -Dcuda=enabled -Dwerror=false -Dbench=false \
      --buildtype=debugoptimized || finish 99
  fi
}
