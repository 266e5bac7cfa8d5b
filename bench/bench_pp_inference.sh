#!/usr/bin/env bash
# bench_pp_inference at P = 1, 2 and 4 stages (one thread per rank), RUNS rounds (default 3), then
# per (P, concurrency, stage) the min and median busy fraction over the rounds beside the bounds
# (sim: the schedule simulator's, equal stages; bal: sim times the stage's forward CPU time over the
# slowest stage's) and the median waits. The machine may be shared: the load average is printed
# around every round. With OLD=path/to/an/older/bench_pp_inference (and OLD_LIB=its libdsc's
# directory, when it is not the one it was linked with), each run of the new binary is followed by
# one of the old, and the old figures are summarised beside (its lines have no waits or bal).
# EXTRA=k runs the new binary with k micro-batches in flight beyond P, PARTITION=compute (or
# parameters) with that partition of the layers (the old binary ignores both).
# Usage: [OLD=... [OLD_LIB=...]] [EXTRA=k] bench/bench_pp_inference.sh [BUILD_DIR [RUNS [NEW_TOKENS]]]
set -euo pipefail
build=${1:-build}
runs=${2:-3}
new_tokens=${3:-32}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 DSC_NUM_THREADS=1
model=${DSC_BENCH_PP_MODEL:-/tmp/dsc_bench_pp_model}
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
run() { # run P BINARY LIBDIR [ARGS...]: ARGS after the model and token count
    local p=$1 bin=$2 lib=$3
    shift 3
    local env=(-x DSC_NUM_THREADS -x OMP_NUM_THREADS)
    [ -n "$lib" ] && env+=(-x "LD_LIBRARY_PATH=$lib")
    if [ "$p" = 1 ]; then
        LD_LIBRARY_PATH=${lib:-${LD_LIBRARY_PATH:-}} "$bin" "$model" "$new_tokens" "$@"
    else
        mpirun --oversubscribe -np "$p" "${env[@]}" "$bin" "$model" "$new_tokens" "$@"
    fi
}
for r in $(seq 1 "$runs"); do
    echo "round $r: $(uptime)"
    for p in 1 2 4; do
        run "$p" "$build/bench/bench_pp_inference" "" 1 "${EXTRA:-0}" "${PARTITION:-uniform}" | tee -a "$log/new"
        if [ -n "${OLD:-}" ]; then run "$p" "$OLD" "${OLD_LIB:-}" | sed 's/^/old: /' | tee -a "$log/old"; fi
    done
done
echo "after: $(uptime)"
python3 - "$log" <<'EOF'
import re, statistics, sys, os
def parse(path):
    rows = {}  # (P, D, c, stage) -> list of (tokens/s, busy, sim, bal, recv, tok, send)
    P = D = None
    for line in open(path):
        line = line.removeprefix("old: ")
        m = re.match(r"pp (\d+) x(?:.*?(\d+) micro-batches in flight)?", line)
        if m:
            P = int(m.group(1))
            D = int(m.group(2)) if m.group(2) else P
            continue
        m = re.match(r"(?:P \d+ )?c\s+(\d+):\s+([\d.]+) tokens/s", line)
        if not m:
            continue
        c, tps = int(m.group(1)), float(m.group(2))
        stages = re.findall(r"stage (\d+) busy ([\d.]+) sim ([\d.]+) bal ([\d.]+) waits ([\d.]+) ([\d.]+) ([\d.]+)", line)
        vals = [(int(k), *map(float, rest)) for k, *rest in stages]
        if not vals:  # an older binary's line: busy / bound only
            stages = re.findall(r"stage (\d+) ([\d.]+) / ([\d.]+)", line)
            vals = [(int(k), float(b), float(s), None, None, None, None) for k, b, s in stages]
        for k, *v in vals:
            rows.setdefault((P, D, c, k), []).append((tps, *v))
    return rows
new = parse(os.path.join(sys.argv[1], "new"))
oldp = os.path.join(sys.argv[1], "old")
old = parse(oldp) if os.path.exists(oldp) else {}
med = statistics.median
print("\nP D  c stage | busy min / median | sim  bal  | waits recv tok send (median) | tokens/s median" +
      (" || old busy min / median, tokens/s" if old else ""))
for key in sorted(new):
    P, D, c, k = key
    v = new[key]
    busy = [x[1] for x in v]
    line = (f"{P} {D} {c:2d} {k:5d} | {min(busy):.2f} / {med(busy):.2f}       | {v[0][2]:.2f} {med(x[3] for x in v):.2f} |"
            f" {med(x[4] for x in v):.2f} {med(x[5] for x in v):.2f} {med(x[6] for x in v):.2f}"
            f"                 | {med(x[0] for x in v):7.1f}")
    if key in old:
        ob = [x[1] for x in old[key]]
        line += f" || {min(ob):.2f} / {med(ob):.2f}, {med(x[0] for x in old[key]):7.1f}"
    print(line)
EOF
