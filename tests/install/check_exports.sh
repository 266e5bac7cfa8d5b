#!/bin/sh
# check_exports.sh LIBDSC INCLUDE_DIR — fails when the shared library exports a
# symbol that no installed header (INCLUDE_DIR/dsc/*.h) names, i.e. when an
# internal function, a backend table or a static library's symbol leaks out
# of libdsc. Prints the exported count, or every symbol that should not be
# there. It does not check the reverse (a declared function left unexported):
# the external-program test links against the installed library for that.
set -eu
lib=$1
inc=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
nm -D --defined-only "$lib" | awk '{print $NF}' | sed 's/@.*//' | sort -u >"$tmp/exported"
grep -ohE '\b[A-Za-z_][A-Za-z0-9_]*\b' "$inc"/dsc/*.h | sort -u >"$tmp/declared"
# Symbols every shared object defines (linker-provided section bounds), and
# those a sanitizer build's instrumentation adds to each module.
printf '%s\n' _init _fini _edata _end __bss_start | sort >"$tmp/linker"
comm -23 "$tmp/exported" "$tmp/declared" | comm -23 - "$tmp/linker" |
    grep -vE '^_+(asan|odr_asan|ubsan|sancov)' >"$tmp/extra" || true
if [ -s "$tmp/extra" ]; then
    echo "libdsc exports $(wc -l <"$tmp/extra") symbol(s) no installed header declares:"
    cat "$tmp/extra"
    exit 1
fi
n=$(wc -l <"$tmp/exported")
[ "$n" -gt 0 ] || { echo "libdsc exports nothing: $lib"; exit 1; }
echo "libdsc exports $n symbols, each declared in an installed header"
