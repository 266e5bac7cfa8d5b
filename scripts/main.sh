#!/usr/bin/env bash
# The main command for now: builds dsc, then runs the communication self-check
# on 4 ranks (process groups, every collective, byte counters). Exits non-zero
# if anything failed. (The launcher, dsc-launch, will replace the mpirun line.)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/build.sh"
build=${DSC_BUILD_DIR:-$root/build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
mpirun --oversubscribe -np 4 "$build/bin/dsc-selfcheck" "$@"
