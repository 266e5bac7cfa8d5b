#!/bin/sh
# test_install.sh BUILD_DIR C_COMPILER — installs the build into a fresh
# temporary prefix, then builds and runs tests/install/external/main.c twice:
# as a CMake project (find_package(dsc), dsc::dsc) and with
# `pkg-config --cflags --libs dsc`. Nothing of the build tree may be needed.
set -eu
build=$1
cc=$2
here=$(cd "$(dirname "$0")" && pwd)
prefix=$(mktemp -d /tmp/dsc-install.XXXXXX)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix/usr" >"$prefix/install.log" || { cat "$prefix/install.log"; exit 1; }

echo "== find_package(dsc) from $prefix/usr"
cmake -S "$here/external" -B "$prefix/cmake-build" -DCMAKE_PREFIX_PATH="$prefix/usr" -DCMAKE_C_COMPILER="$cc" \
    >"$prefix/cmake.log" 2>&1 || { cat "$prefix/cmake.log"; exit 1; }
cmake --build "$prefix/cmake-build" >"$prefix/build.log" 2>&1 || { cat "$prefix/build.log"; exit 1; }
"$prefix/cmake-build/dsc_external"

echo "== pkg-config dsc from $prefix/usr"
pc=$(find "$prefix/usr" -name dsc.pc)
[ -n "$pc" ] || { echo "dsc.pc was not installed"; exit 1; }
export PKG_CONFIG_PATH="$(dirname "$pc")"
flags=$(pkg-config --cflags --libs dsc)
echo "pkg-config --cflags --libs dsc: $flags"
libdir=$(pkg-config --variable=libdir dsc)
case "$libdir" in "$prefix"/*) ;; *) echo "dsc.pc points at $libdir, not into $prefix"; exit 1 ;; esac
# shellcheck disable=SC2086 # the flags are a word list
"$cc" -std=c17 "$here/external/main.c" -o "$prefix/dsc_external_pc" $flags -Wl,-rpath,"$libdir"
"$prefix/dsc_external_pc"
