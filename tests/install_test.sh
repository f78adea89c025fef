#!/usr/bin/env bash
# `make install` into a scratch DESTDIR with PREFIX=/usr, then what a user of
# the installed library does: finds it with pkg-config, builds
# examples/c/quickstart.c against it (shared and static), runs it, runs the
# installed CLI on the checkpoint it wrote; `make uninstall` last. One
# "PASS name" / "FAIL name" line per check (tests/run_all.sh counts them).
set -u
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
root=$tmp/root
lib=$root/usr/lib
failures=0
pass() { echo "PASS install: $1"; }
fail() { echo "FAIL install: $1"; failures=$((failures + 1)); }
check() {  # NAME COMMAND...: PASS if the command succeeds, else FAIL with its output
  local name=$1 out; shift
  if out=$("$@" 2>&1); then pass "$name"; else printf '%s\n' "$out" | tail -n 20; fail "$name"; fi
}
# The version the header declares: the installed names must carry it.
part() { sed -n "s/^#define DYNEMB_VERSION_$1 *\([0-9][0-9]*\).*/\1/p" include/dynemb.h; }
major=$(part MAJOR)
version=$major.$(part MINOR).$(part PATCH)

check "make install DESTDIR=... PREFIX=/usr" \
  make --no-print-directory install DESTDIR="$root" PREFIX=/usr

files_ok=1
for f in usr/include/dynemb.h usr/lib/libdynemb.a usr/lib/pkgconfig/dynemb.pc; do
  [ -f "$root/$f" ] && [ ! -L "$root/$f" ] || { echo "missing file /$f"; files_ok=0; }
done
[ -f "$lib/libdynemb.so.$version" ] && [ ! -L "$lib/libdynemb.so.$version" ] ||
  { echo "missing file /usr/lib/libdynemb.so.$version"; files_ok=0; }
[ "$(readlink "$lib/libdynemb.so.$major")" = "libdynemb.so.$version" ] ||
  { echo "/usr/lib/libdynemb.so.$major is not a link to libdynemb.so.$version"; files_ok=0; }
[ -L "$lib/libdynemb.so" ] && [ "$(readlink -f "$lib/libdynemb.so")" = "$lib/libdynemb.so.$version" ] ||
  { echo "/usr/lib/libdynemb.so is not a link to libdynemb.so.$version"; files_ok=0; }
[ -x "$root/usr/bin/dynemb" ] || { echo "missing program /usr/bin/dynemb"; files_ok=0; }
if [ "$files_ok" = 1 ]; then pass "every file in place"; else fail "every file in place"; fi

soname=$(readelf -d "$lib/libdynemb.so.$version" 2>&1 | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
if [ "$soname" = "libdynemb.so.$major" ]; then pass "SONAME libdynemb.so.$major"
else echo "SONAME: '${soname}'"; fail "SONAME libdynemb.so.$major"; fi

# pkg-config as it would run on the installed system, the paths moved under
# DESTDIR (sysroot); /usr/include and /usr/lib are system directories that
# pkg-config leaves out unless told to keep them.
pc() {
  PKG_CONFIG_LIBDIR="$lib/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$root" \
    PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1 PKG_CONFIG_ALLOW_SYSTEM_LIBS=1 pkg-config "$@" dynemb
}
modversion=$(pc --modversion 2>&1)
if [ "$modversion" = "$version" ]; then pass "pkg-config --modversion $version"
else echo "pkg-config --modversion: $modversion"; fail "pkg-config --modversion $version"; fi

example=examples/c/quickstart.c
cflags=$(pc --cflags) libs=$(pc --libs) static_libs=$(pc --static --libs)
# shellcheck disable=SC2086  # the flags are words
check "cc \$(pkg-config --cflags --libs dynemb) $example" \
  cc -std=c11 -Wall -Wextra -Werror $example $cflags $libs -o "$tmp/quickstart"
if readelf -d "$tmp/quickstart" 2>/dev/null | grep -q "NEEDED.*\[libdynemb.so.$major\]"; then
  pass "quickstart loads libdynemb.so.$major"
else fail "quickstart loads libdynemb.so.$major"; fi
out=$(LD_LIBRARY_PATH="$lib" "$tmp/quickstart" "$tmp/ckpt" 2>&1)
if grep -q "(moved -0.2000); 2 rows saved in $tmp/ckpt" <<<"$out" && [ -f "$tmp/ckpt/MANIFEST" ]; then
  pass "quickstart runs on the installed shared library"
else printf '%s\n' "$out"; fail "quickstart runs on the installed shared library"; fi
out=$("$root/usr/bin/dynemb" ckpt inspect "$tmp/ckpt" 2>&1)
if grep -qE '^ +2 +0 +4 +sgd .* user$' <<<"$out"; then pass "installed dynemb reads the checkpoint"
else printf '%s\n' "$out"; fail "installed dynemb reads the checkpoint"; fi

# The static archive with the libraries it needs (Libs.private): no
# libdynemb.so at run time.
# shellcheck disable=SC2086
check "cc $example \$(pkg-config --static) with libdynemb.a" \
  cc -std=c11 -Wall -Wextra -Werror $example $cflags ${static_libs/-ldynemb/-l:libdynemb.a} \
  -o "$tmp/quickstart-static"
out=$("$tmp/quickstart-static" "$tmp/ckpt-static" 2>&1)
if ! readelf -d "$tmp/quickstart-static" 2>/dev/null | grep -q 'NEEDED.*libdynemb' &&
   grep -q "(moved -0.2000); 2 rows saved" <<<"$out"; then
  pass "quickstart linked with libdynemb.a runs"
else printf '%s\n' "$out"; fail "quickstart linked with libdynemb.a runs"; fi

check "make uninstall" make --no-print-directory uninstall DESTDIR="$root" PREFIX=/usr
left=$(find "$root" ! -type d)
if [ -z "$left" ]; then pass "uninstall leaves no file"
else printf '%s\n' "$left"; fail "uninstall leaves no file"; fi
[ "$failures" -eq 0 ]
