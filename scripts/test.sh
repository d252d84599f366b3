#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs every
# Criterion suite (one at a time, -j1: multi-rank tests oversubscribe the
# cores) and ends with one line "N passed, N failed, N skipped".
#
# Two configurations, each built and run in full:
#   build/      the default (the CUDA backend compiled by nvcc where CUDA is
#               installed; its GPU tests skip, saying why, without a GPU);
#   build-emu/  -Dcuda=emulated: the same CUDA sources compiled against the
#               CPU emulator as the WEFT_CUDA device (strict memory, deferred
#               streams), so the device code and everything above it runs.
# WEFT_BUILD_DIR / WEFT_EMU_BUILD_DIR move them; WEFT_TEST_EMULATED=0 skips
# the second.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
WEFT_EXTRA_PACKAGES=(clang-format iproute2)  # the style check; ip and tc for tests/nodes
source scripts/setup.sh || { echo "0 passed, 1 failed"; exit 1; }
set +e

passed=0 failed=0 skipped=0 bad_exit=0

# run_suites BUILD_DIR LABEL: every tests/*/test_* executable of BUILD_DIR.
run_suites() {
  local build="$1" label="$2"
  local log_dir="$build/test-logs"
  mkdir -p "$log_dir"
  local suites t name log s0 s1 rc line tested pass fail crash skip
  suites=$(find "$build/tests" -maxdepth 2 -type f -name 'test_*' -perm -u+x | sort)
  local start
  start=$(date +%s)
  for t in $suites; do
    name=$(basename "$t")
    log="$log_dir/$name.log"
    s0=$(date +%s)
    # --verbose: Criterion then prints "[SKIP] suite::test: reason" for skips
    "$t" --jobs=1 --verbose >"$log" 2>&1
    rc=$?
    s1=$(date +%s)
    # Criterion's closing line: "[====] Synthesis: Tested: N | Passing: P | Failing: F | Crashing: C"
    line=$(grep -a 'Synthesis:' "$log" | tail -n 1 | sed 's/\x1b\[[0-9;]*m//g')
    tested=$(sed -n 's/.*Tested: \([0-9]*\).*/\1/p' <<<"$line")
    pass=$(sed -n 's/.*Passing: \([0-9]*\).*/\1/p' <<<"$line")
    fail=$(sed -n 's/.*Failing: \([0-9]*\).*/\1/p' <<<"$line")
    crash=$(sed -n 's/.*Crashing: \([0-9]*\).*/\1/p' <<<"$line")
    # one per test (a test may print its own [SKIP] line besides Criterion's)
    skip=$(grep -a '^\[SKIP\]' "$log" | sed 's/\x1b\[[0-9;]*m//g; s/^\[SKIP\] *\([^:]*::[^:]*\).*/\1/' | sort -u | wc -l)
    if [ -z "$tested" ]; then
      echo "== $label $name: no Synthesis line (exit $rc); log follows"
      cat "$log"
      failed=$((failed + 1))
      bad_exit=1
      continue
    fi
    passed=$((passed + pass))
    failed=$((failed + fail + crash))
    skipped=$((skipped + skip))
    printf '== %-5s %-22s %3d passed, %d failed, %d skipped (%ds)\n' "$label" "$name" "$pass" "$((fail + crash))" "$skip" "$((s1 - s0))"
    if [ "$rc" -ne 0 ] || [ "$((fail + crash))" -ne 0 ]; then
      grep -aE 'FAIL|CRASH|check failed|Assertion|rank [0-9]+\]|emulator' "$log" | head -n 60
      bad_exit=1
    fi
  done
  echo "$label suite time: $(( $(date +%s) - start )) s; logs in $log_dir"
}

run_suites "$BUILD_DIR" "main"

if [ "${WEFT_TEST_EMULATED:-1}" != "0" ]; then
  EMU_DIR="${WEFT_EMU_BUILD_DIR:-build-emu}"
  if [ ! -f "$EMU_DIR/build.ninja" ]; then
    meson setup "$EMU_DIR" -Dwerror=true --buildtype=debugoptimized -Dcuda=emulated \
      -Dbench=false >"$BUILD_DIR/emu-setup.log" 2>&1 || { cat "$BUILD_DIR/emu-setup.log"; failed=$((failed + 1)); bad_exit=1; }
  fi
  if [ -f "$EMU_DIR/build.ninja" ]; then
    if ninja -C "$EMU_DIR" >"$BUILD_DIR/emu-build.log" 2>&1; then
      run_suites "$EMU_DIR" "emu"
    else
      tail -n 60 "$BUILD_DIR/emu-build.log"
      echo "== emu: the -Dcuda=emulated build failed"
      failed=$((failed + 1))
      bad_exit=1
    fi
  fi
fi

# The code style (.clang-format), counted as one check.
fmt_out=$(bash scripts/format.sh --check 2>&1)
case $? in
  0) passed=$((passed + 1)); echo "== $(tail -n 1 <<<"$fmt_out")" ;;
  77) skipped=$((skipped + 1)); echo "== $fmt_out" ;;
  *) failed=$((failed + 1)); bad_exit=1; head -n 40 <<<"$fmt_out" ;;
esac

echo "$passed passed, $failed failed, $skipped skipped"
exit $bad_exit
