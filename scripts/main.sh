#!/usr/bin/env bash
# The main command for now: builds dsc, then runs the communication self-check
# on 4 ranks (process groups, every collective, byte counters). Exits non-zero
# if anything failed. dsc-launch builds the mpirun command (root, oversubscription,
# one thread per rank) and names the rank that failed, if one does.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/build.sh"
build=${DSC_BUILD_DIR:-$root/build}
"$build/bin/dsc-launch" -n 4 "$build/bin/dsc-selfcheck" "$@"
