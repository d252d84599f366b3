#!/usr/bin/env bash
# Installs what weft needs on Debian 12 (as root, or with sudo), then
# configures and builds it in ./build. Sourced by scripts/main.sh and
# scripts/test.sh; safe to run again (it installs only what is missing).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

WEFT_PACKAGES=(build-essential pkg-config meson ninja-build mpich libmpich-dev
               libcriterion-dev libopenblas-dev libcjson-dev python3-torch)
# scripts/test.sh adds what only the checks need (clang-format)
WEFT_PACKAGES+=(${WEFT_EXTRA_PACKAGES[@]+"${WEFT_EXTRA_PACKAGES[@]}"})

missing=()
for p in "${WEFT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# OpenBLAS mis-detects some recent processors; Haswell kernels are correct on
# every x86-64 machine we run on. Respect a value the machine already sets.
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}"
# One BLAS thread per rank: ranks already use the cores.
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"

BUILD_DIR="${WEFT_BUILD_DIR:-build}"
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  meson setup "$BUILD_DIR" -Dwerror=true --buildtype=debugoptimized
fi
ninja -C "$BUILD_DIR"
