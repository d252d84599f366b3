#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs every
# Criterion suite (one at a time, -j1: multi-rank tests oversubscribe the
# cores) and ends with one line "N passed, N failed, N skipped".
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh || { echo "0 passed, 1 failed"; exit 1; }
set +e

BUILD_DIR="${WEFT_BUILD_DIR:-build}"
LOG_DIR="$BUILD_DIR/test-logs"
mkdir -p "$LOG_DIR"
suites=$(find "$BUILD_DIR/tests" -maxdepth 2 -type f -name 'test_*' -perm -u+x | sort)

passed=0 failed=0 skipped=0 bad_exit=0
start=$(date +%s)
for t in $suites; do
  name=$(basename "$t")
  log="$LOG_DIR/$name.log"
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
    echo "== $name: no Synthesis line (exit $rc); log follows"
    cat "$log"
    failed=$((failed + 1))
    bad_exit=1
    continue
  fi
  passed=$((passed + pass))
  failed=$((failed + fail + crash))
  skipped=$((skipped + skip))
  printf '== %-16s %3d passed, %d failed, %d skipped (%ds)\n' "$name" "$pass" "$((fail + crash))" "$skip" "$((s1 - s0))"
  if [ "$rc" -ne 0 ] || [ "$((fail + crash))" -ne 0 ]; then
    grep -aE 'FAIL|CRASH|check failed|Assertion|rank [0-9]+\]' "$log" | head -n 60
    bad_exit=1
  fi
done
echo "suite time: $(( $(date +%s) - start )) s; logs in $LOG_DIR"
echo "$passed passed, $failed failed, $skipped skipped"
exit $bad_exit
