#!/usr/bin/env bash
# bench_multihost — what crossing hosts costs: dsc's all-reduce and
# point-to-point bandwidth, and the pipeline's training throughput (P = 2,
# 1F1B), with the two ranks on two test hosts (TCP over a veth pair and a
# bridge, scripts/netns/dsc-netns.sh) against the same two ranks on one host
# (shared memory). The programs are bench_comm and bench_pipe, launched by
# dsc-launch --hostfile in both placements; this script joins their figures:
# between-hosts beside within-host, and the ratio. Prints, never asserts.
#
#   sudo bench/bench_multihost.sh [BUILD_DIR] [--max-mb N] [--pipe-steps N]
#
# Needs root (network namespaces). The machine is shared: numbers swing
# between runs; the comparison inside one run is the meaningful part.
set -euo pipefail
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$src/build
max_mb=16 pipe_steps=2
while [[ $# -gt 0 ]]; do
    case $1 in
    --max-mb) max_mb=$2 && shift 2 ;;
    --pipe-steps) pipe_steps=$2 && shift 2 ;;
    *) build=$1 && shift ;;
    esac
done
netns=$src/scripts/netns/dsc-netns.sh
[[ $(id -u) -eq 0 ]] || {
    echo "bench_multihost: needs root to create network namespaces" >&2
    exit 1
}
prefix=dscbench$$
work=$(mktemp -d /tmp/dsc-bench-multihost.XXXXXX)
trap '"$netns" down "$prefix"; rm -rf "$work"' EXIT
"$netns" up "$prefix" 2 >/dev/null
h0=$prefix-h0 h1=$prefix-h1
"$netns" hostfile "$prefix" 2 2 >"$work/hosts"
export DSC_NUM_THREADS=1 OMP_NUM_THREADS=1

# run NAME INCLUDE PROGRAM ARGS...: 2 ranks on the slots INCLUDE selects.
run() {
    local name=$1 include=$2
    shift 2
    "$netns" exec "$h0" "$build/bin/dsc-launch" --hostfile "$work/hosts" --remote-agent \
        "$src/scripts/netns/netns-agent.sh" --net 10.77.0.0/24 --include "$include" -n 2 "$@" \
        >"$work/$name" 2>"$work/$name.err" || {
        cat "$work/$name.err" >&2
        exit 1
    }
}

echo "bench_multihost: 2 ranks within host $h0 (shared memory) vs one rank on each of $h0, $h1 (TCP over veth)"
run comm_within "$h0" "$build/bench/bench_comm" --max-mb "$max_mb"
run comm_between "$h0:0@$h1:0" "$build/bench/bench_comm" --max-mb "$max_mb"
echo
echo "dsc communicator, GB/s = buffer bytes / slowest rank's time per call (best of 3 trials)"
printf "%-12s %10s %14s %15s %7s\n" op bytes "within GB/s" "between GB/s" ratio
awk 'NR == FNR { within[$1 " " $2] = $3; next }
     ($1 == "all-reduce" || $1 == "p2p") && ($1 " " $2) in within {
         w = within[$1 " " $2]; printf "%-12s %10d %14.3f %15.3f %7.2f\n", $1, $2, w, $3, (w > 0 ? $3 / w : 0) }' \
    "$work/comm_within" "$work/comm_between"

pipe_args=(--steps "$pipe_steps" --layers 4 --width 64)
run pipe_within "$h0" "$build/bench/bench_pipe" "${pipe_args[@]}"
run pipe_between "$h0:0@$h1:0" "$build/bench/bench_pipe" "${pipe_args[@]}"
echo
echo "pipeline P=2 (1F1B), $(head -n 1 "$work/pipe_within" | sed 's/^bench_pipe: //')"
tokens=$(head -n 1 "$work/pipe_within" | sed -E 's/.*T=([0-9]+), B=([0-9]+).*/\1 * \2/')
printf "%4s %16s %17s %7s\n" M "within ms/step" "between ms/step" ratio
awk -v tokens="$((tokens))" 'NR == FNR { if ($1 ~ /^[0-9]+$/ && $4 ~ /^[0-9]+\.[0-9]+$/) within[$1] = $3; next }
     $1 in within && $4 ~ /^[0-9]+\.[0-9]+$/ { w = 1000 * tokens * $1 / within[$1]; b = 1000 * tokens * $1 / $3
                              printf "%4d %16.1f %17.1f %7.2f\n", $1, w, b, b / w }' \
    "$work/pipe_within" "$work/pipe_between"
