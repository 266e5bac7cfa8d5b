#!/usr/bin/env bash
# bench_pp_inference at P = 1, 2 and 4 stages (one thread per rank), with the load average
# before and after (the machine may be shared): tokens/s and each stage's busy fraction beside
# its bound at concurrencies 1..16.
# Usage: bench/bench_pp_inference.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 DSC_NUM_THREADS=1
uptime
"$build/bench/bench_pp_inference"
for p in 2 4; do
    mpirun --oversubscribe -np "$p" -x DSC_NUM_THREADS -x OMP_NUM_THREADS "$build/bench/bench_pp_inference"
done
uptime
