#!/usr/bin/env bash
# Downloads the Debian packages that the GPU machine lacks (MPICH, Criterion,
# OpenBLAS, cJSON, pkg-config and their libraries) into .debs/ at the repo
# root, for tests/gpu/run.sh to unpack there (that machine reaches no
# network; its image has CUDA, meson and ninja but not these). Run here, on
# a Debian 12 machine with apt; then carry .debs to the GPU machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
mkdir -p .debs
grep -qx '/.debs/' .git/info/exclude 2>/dev/null || echo '/.debs/' >> .git/info/exclude

# The packages weft builds against, and the runtime libraries they link
# (from ldd of libmpich, libcriterion, libopenblas, libcjson and mpiexec on
# Debian 12), minus what any CUDA image has (libc, libstdc++, libssl, ...).
# Headers and .pc files come from the -dev packages. About 32 MiB: the
# device tool carries at most 64 MiB with the tree.
pkgs="mpich libmpich12 libmpich-dev libhwloc15 libucx0 libnuma1 libslurm38
      libcriterion3 libcriterion-dev libboxfort-dev libnanomsg5 libgit2-1.5
      libhttp-parser2.9 libssh2-1 libmbedcrypto7 libmbedtls14 libmbedx509-1
      libopenblas0-pthread libopenblas-pthread-dev libopenblas-dev libgfortran5
      libcjson1 libcjson-dev pkgconf pkgconf-bin libpkgconf3"
rm -f .debs/*.deb
(cd .debs && apt-get download $pkgs >/dev/null)
du -sh .debs
ls .debs | wc -l
