#!/usr/bin/env bash
# Formats weft's C, C++ and CUDA sources with .clang-format (clang-format 14,
# Debian 12's: other versions break lines differently).
#   bash scripts/format.sh            rewrite every tracked source in place
#   bash scripts/format.sh --check    list the files that differ; exit 1 if any
# Exit 77 (skip) when clang-format 14 is not installed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cf=""
for c in clang-format-14 clang-format; do
  if command -v "$c" >/dev/null 2>&1 && "$c" --version | grep -q 'version 14\.'; then cf=$c; break; fi
done
if [ -z "$cf" ]; then
  echo "format: clang-format 14 not found (apt-get install clang-format); not checked"
  exit 77
fi
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files -- '*.c' '*.h' '*.cu' '*.cuh' '*.cpp')
else
  mapfile -t files < <(find . -path ./build -prune -o -path './build-*' -prune -o \
    -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.cpp' \) -print)
fi
if [ "${1:-}" = "--check" ]; then
  bad=0
  for f in "${files[@]}"; do
    if ! "$cf" --style=file "$f" | cmp -s - "$f"; then
      echo "format: $f differs from .clang-format (bash scripts/format.sh fixes it)"
      bad=$((bad + 1))
    fi
  done
  echo "format: ${#files[@]} files checked, $bad differ"
  [ "$bad" -eq 0 ]
else
  "$cf" --style=file -i "${files[@]}"
  echo "format: ${#files[@]} files formatted"
fi
