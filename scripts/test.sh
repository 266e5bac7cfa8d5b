#!/usr/bin/env bash
# The whole test suite: the formatting check (.clang-format, every C/CUDA
# source), the unit tests under the address/undefined sanitizers,
# each parser's fuzz harness for 20 s (scripts/fuzz.sh: a new crash fails the
# suite), then every test (unit and multi-rank) of the normal build, compiled as Release
# (-O3) so that warnings only the optimiser finds fail the suite too.
# Ends with ctest's summary.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
"$root/scripts/deps.sh"

echo "== formatting (clang-format --dry-run --Werror over every C and CUDA source)"
(cd "$root" && git ls-files '*.c' '*.h' '*.cu' '*.cuh' | xargs clang-format --dry-run --Werror)

echo "== sanitizer build (address, undefined): unit tests"
DSC_BUILD_DIR=$root/build-asan "$root/scripts/build.sh" -DDSC_SANITIZE=ON -DDSC_CUDA=OFF
(cd "$root/build-asan" && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
   ctest -L unit --output-on-failure -j"$(nproc)")

echo "== fuzz harnesses (clang, libFuzzer + address/undefined): 20 s each"
"$root/scripts/fuzz.sh" 20

echo "== the official openai Python client and tensorboard's event reader for test_serve_openai_client and"
echo "   test_monitor_tensorboard (from PyPI; without them those tests report skipped)"
pyenv=$root/build-pyenv
py=()
if python3 -m venv "$pyenv" >/dev/null 2>&1 &&
   "$pyenv/bin/pip" install -q --retries 1 --timeout 20 openai >/dev/null 2>&1; then
  py=(-DPython3_EXECUTABLE="$pyenv/bin/python")
  "$pyenv/bin/pip" install -q --retries 1 --timeout 20 tensorboard >/dev/null 2>&1 ||
    echo "   tensorboard not installed: test_monitor_tensorboard will report skipped"
else
  echo "   not installed (no PyPI here?): test_serve_openai_client and test_monitor_tensorboard will report skipped"
fi

echo "== normal build, Release -O3 (CUDA backend compiled when nvcc exists): all tests"
"$root/scripts/build.sh" -DCMAKE_BUILD_TYPE=Release "${py[@]}"
cd "$root/build" && ctest --output-on-failure -j"$(nproc)"
