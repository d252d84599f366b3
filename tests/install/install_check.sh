#!/bin/sh
# tests/install/install_check.sh — run by test_install.c (the install suite).
# Installs the build into a temporary DESTDIR, builds hello.c outside the tree
# with `pkg-config --cflags --libs weft` only (prefix redirected into the
# temporary install with --define-variable), links it with an rpath to the
# temporary libdir, runs it under mpiexec -n 1 and checks its line. Removes
# the temporary install on every exit.
#
# Environment (set by test_install.c from meson): WEFT_MESON, WEFT_BUILD_ROOT,
# WEFT_PREFIX, WEFT_LIBDIR (relative to the prefix, or absolute), WEFT_CC,
# WEFT_EXTRA_CFLAGS (the build's sanitizer flags), WEFT_MPIEXEC, WEFT_HELLO_C.
# Exit: 0 pass; 77 skip (last line says why); anything else fail.
set -u
fail() { echo "FAIL: $*"; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }

command -v pkg-config >/dev/null 2>&1 || skip "pkg-config not found"
cc_prog=$(printf '%s\n' "$WEFT_CC" | cut -d' ' -f1)
command -v "$cc_prog" >/dev/null 2>&1 || skip "C compiler '$cc_prog' not found"
command -v "$WEFT_MESON" >/dev/null 2>&1 || skip "meson '$WEFT_MESON' not found"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/weft-install.XXXXXX") || fail "mktemp"
trap 'rm -rf "$tmp"' EXIT INT TERM

"$WEFT_MESON" install -C "$WEFT_BUILD_ROOT" --no-rebuild --quiet --destdir "$tmp/root" \
  >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; fail "meson install --destdir"; }

case "$WEFT_LIBDIR" in
  /*) libdir="$tmp/root$WEFT_LIBDIR" ;;
  *) libdir="$tmp/root$WEFT_PREFIX/$WEFT_LIBDIR" ;;
esac
pcdir="$libdir/pkgconfig"
[ -f "$pcdir/weft.pc" ] || fail "no weft.pc installed in $pcdir"
[ -f "$tmp/root$WEFT_PREFIX/include/weft/weft.h" ] || fail "no weft/weft.h installed"

# weft.pc names each library and each dependency once (Requires,
# Requires.private, Libs, Libs.private together; other packages' .pc files
# may repeat their own, which is not weft's to fix).
dups=$(grep -E '^(Requires|Requires\.private|Libs|Libs\.private):' "$pcdir/weft.pc" |
  sed 's/^[^:]*://' | tr -s ', ' '\n' | grep -v '^$' | sort | uniq -d)
[ -z "$dups" ] || fail "weft.pc repeats: $(echo "$dups" | tr '\n' ' ')"

export PKG_CONFIG_PATH="$pcdir"
flags=$(pkg-config --define-variable=prefix="$tmp/root$WEFT_PREFIX" --cflags --libs weft) ||
  fail "pkg-config --cflags --libs weft"
echo "pkg-config --cflags --libs weft: $flags"
echo "$flags" | grep -q -- "-I$tmp/root" || fail "cflags do not point into the install"

cp "$WEFT_HELLO_C" "$tmp/hello.c"
# shellcheck disable=SC2086  # flags are words
(cd "$tmp" && $WEFT_CC $WEFT_EXTRA_CFLAGS -o hello hello.c $flags -Wl,-rpath,"$libdir") \
  >"$tmp/cc.log" 2>&1 || { cat "$tmp/cc.log"; fail "compiling hello.c against the install"; }

# the program must load the installed libraries, not the build tree's
ldd "$tmp/hello" 2>/dev/null | grep 'libweft' | grep -v "$libdir" && \
  fail "hello resolves libweft outside the install"

out=$(MPIEXEC_TIMEOUT=60 "$WEFT_MPIEXEC" -n 1 "$tmp/hello" 2>&1) || { echo "$out"; fail "hello exited non-zero"; }
echo "hello: $out"
want="weft-install-ok version=$WEFT_VERSION world=1 mesh=1 numel=6"
echo "$out" | grep -qx "$want" || fail "hello printed '$out', want '$want'"

# The installed libraries export exactly the functions the installed headers
# declare with WEFT_API: nothing internal (hidden visibility), nothing
# declared and missing.
command -v nm >/dev/null 2>&1 || skip "nm not found (binutils)"
command -v perl >/dev/null 2>&1 || skip "perl not found"
perl -0777 -ne 's{/\*.*?\*/}{}gs; s{//[^\n]*}{}g;
  while (/\bWEFT_API\b[^;(]*?\b(weft_\w+)\s*\(/g) { print "$1\n" }' \
  "$tmp/root$WEFT_PREFIX/include/weft/"*.h | sort -u >"$tmp/declared"
[ -s "$tmp/declared" ] || fail "no WEFT_API declarations found in the installed headers"
for so in "$libdir"/libweft_*.so; do
  nm -D --defined-only "$so" | awk '$2 ~ /^[TDBRVWiu]$/ {print $3}'
done | sort -u >"$tmp/exported"
extra=$(comm -13 "$tmp/declared" "$tmp/exported")
[ -z "$extra" ] || fail "exported but not declared with WEFT_API in an installed header: $(echo "$extra" | head -20 | tr '\n' ' ')"
missing=$(comm -23 "$tmp/declared" "$tmp/exported")
[ -z "$missing" ] || fail "declared with WEFT_API but not exported: $(echo "$missing" | head -20 | tr '\n' ' ')"
echo "exports: $(wc -l <"$tmp/exported") functions, each declared in an installed header"
echo "PASS"
exit 0
