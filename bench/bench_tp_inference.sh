#!/usr/bin/env bash
# TP 1 with 2 threads in one rank against TP 2 with 1 thread per rank (bench_tp_inference),
# with the load average (the machine may be shared) and the TP 2 / TP 1 ratios.
# Usage: bench/bench_tp_inference.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
uptime
one=$(DSC_NUM_THREADS=2 OMP_NUM_THREADS=2 "$build/bench/bench_tp_inference")
two=$(DSC_NUM_THREADS=1 mpirun --oversubscribe -np 2 -x DSC_NUM_THREADS -x OMP_NUM_THREADS "$build/bench/bench_tp_inference")
echo "$one"
echo "$two"
uptime
awk -v a="$one" -v b="$two" 'BEGIN {
  split(a, x, " "); split(b, y, " ");
  printf "ratio tp 2 / tp 1: prefill %.2f, decode %.2f\n", y[7] / x[7], y[15] / x[15] }'
