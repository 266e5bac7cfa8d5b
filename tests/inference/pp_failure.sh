#!/usr/bin/env bash
# A rank that dies or errors in the middle of pipeline-parallel generation
# (dsc-launch -n 4 dsc-generate MODEL --tp 2 --pp 2) stops every rank within
# 10 s with a message naming the rank, and leaves no process behind — the
# launcher test's approach (tests/launcher/test_launch.sh) applied to serving:
#  1. rank 2 (stage 1, the last) SIGKILLed at its tick 6 (DSC_FAILPOINT=serve_tick:2:6);
#  2. rank 1 (stage 0) returning an error at its tick 6 (DSC_FAILPOINT=serve_error:1:6).
# A run without a failpoint first checks the job succeeds and prints the
# one-process continuation, so the failures are mid-generation.
#
# usage: pp_failure.sh DSC_LAUNCH DSC_GENERATE MODEL_DIR WORK_DIR
# The 10 s bound is the failure-handling requirement (a functional deadline),
# not a speed claim; `timeout 60` only turns a hang into a failure.
set -u
launch=$1 generate=$2 model=$3 work=$4
token=dscppfail$$r$RANDOM
rm -rf "$work" && mkdir -p "$work"
ln -s "$model" "$work/$token" # the model path marks the job's processes
. "$(dirname "${BASH_SOURCE[0]}")/../support/check.sh"
no_leftovers() { ! pgrep -f "$token" >/dev/null; }

# Prefixes every line with the time it arrived (ns), so the stop is timed from the failure itself.
stamp() { while IFS= read -r line; do printf '%s %s\n' "$(date +%s%N)" "$line"; done; }

# run NAME FAILPOINT: the job's output in $work/NAME, its status in $rc, and in $ms the time from
# the failpoint's line (the failure) to the end of the job (from the start when none was printed).
run() {
    local name=$1 start end failed
    start=$(date +%s%N)
    DSC_FAILPOINT=$2 timeout 60 "$launch" -n 4 "$generate" "$work/$token" --tp 2 --pp 2 \
        --tokens 71,69,123,44,56 --max-new-tokens 40 --quiet 2>&1 | stamp >"$work/$name"
    rc=${PIPESTATUS[0]}
    end=$(date +%s%N)
    failed=$(grep -m1 "dsc: failpoint" "$work/$name" | cut -d' ' -f1)
    ms=$(((end - ${failed:-$start}) / 1000000))
    echo "--- DSC_FAILPOINT=$2 -> status $rc, $ms ms after the failure (or the start)"
    cat "$work/$name"
}

run ok none
check "the pipeline job succeeds" [ "$rc" -eq 0 ]
check "it prints the one-process continuation" grep -q "^[0-9]* 71 69 123 44 56 74 10 9 122 92 49" "$work/ok"

run killed serve_tick:2:6
check "a killed rank makes the job fail" [ "$rc" -ne 0 -a "$rc" -ne 124 ]
check "the message names rank 2 and the signal" grep -q "dsc-launch: job failed: rank 2 killed by signal 9" \
    "$work/killed"
check "every rank stopped within 10 s of the failure ($ms ms)" [ "$ms" -lt 10000 ]
check "no process of the killed job remains" no_leftovers

run error serve_error:1:6
check "a failing rank makes the job fail" [ "$rc" -ne 0 -a "$rc" -ne 124 ]
check "the message names rank 1 and its reason" grep -q \
    "dsc-launch: job failed: rank 1.*simulated failure of pipeline stage 0 at tick 6" "$work/error"
check "every rank stopped within 10 s of the failure ($ms ms)" [ "$ms" -lt 10000 ]
check "no process of the failed job remains" no_leftovers

pkill -KILL -f "$token" 2>/dev/null
rm -rf "$work"
check_summary
