#!/usr/bin/env bash
# dsc-launch end to end: a 4-rank job succeeds; one rank of 4 failing in the
# middle of a collective (by error exit, or by a signal) ends the whole job
# within 10 s with a non-zero status and a message naming the rank, leaving
# no process behind; a wedged mpirun is killed by the watchdog; DSC_*
# variables and the one-thread defaults reach the ranks; --dry-run prints the
# exact command; hostfile errors name the line.
#
# usage: test_launch.sh DSC_LAUNCH LAUNCH_HELPER FAKE_MPIRUN
# The 10 s bound is the failure-handling requirement (a functional deadline),
# not a speed claim; `timeout 60` only turns a hang into a failure.
set -u
launch=$1 helper=$2 fake=$3
token=dsclaunch$$r$RANDOM
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
unset OMP_NUM_THREADS DSC_NUM_THREADS
. "$(dirname "${BASH_SOURCE[0]}")/../support/check.sh"

has_line() { grep -qxF -- "$2" "$1"; }
no_leftovers() { ! pgrep -f "$token" >/dev/null; }

# run NAME ARGS...: runs dsc-launch, keeps its output in $work/NAME, its exit
# status in $rc and its duration in $ms.
run() {
    local name=$1
    shift
    local start end
    start=$(date +%s%N)
    timeout 60 "$launch" "$@" >"$work/$name" 2>&1
    rc=$?
    end=$(date +%s%N)
    ms=$(((end - start) / 1000000))
    echo "--- dsc-launch $* -> status $rc after $ms ms"
    cat "$work/$name"
}

run ok -n 4 "$helper" ok "$token"
check "4 ranks succeed" [ "$rc" -eq 0 ]
check "every rank ran" [ "$(grep -c '^rank [0-3] of 4$' "$work/ok")" -eq 4 ]

run fail -n 4 "$helper" fail 2 "$token"
check "a failed rank makes the launcher fail" [ "$rc" -ne 0 -a "$rc" -ne 124 ]
check "the message names rank 2 and its reason" has_line "$work/fail" \
    "dsc-launch: job failed: rank 2 exited with status 3: simulated error in allreduce 50"
check "the job ended within 10 s (took $ms ms)" [ "$ms" -lt 10000 ]
check "no process of the failed job remains" no_leftovers

run signal -n 4 "$helper" signal 1 9 "$token"
check "a killed rank makes the launcher fail" [ "$rc" -ne 0 -a "$rc" -ne 124 ]
check "the message names rank 1 and the signal" has_line "$work/signal" \
    "dsc-launch: job failed: rank 1 killed by signal 9 (Killed)"
check "the killed job ended within 10 s (took $ms ms)" [ "$ms" -lt 10000 ]
check "no process of the killed job remains" no_leftovers

run wedged --mpirun "$fake" -n 4 "$helper" ok "$token"
check "a wedged mpirun makes the launcher fail" [ "$rc" -ne 0 -a "$rc" -ne 124 ]
check "the watchdog names the failed rank" has_line "$work/wedged" \
    "dsc-launch: job failed: rank 3 failed: stuck in a collective"
check "the watchdog says it killed the job" has_line "$work/wedged" \
    "dsc-launch: mpirun did not end the job within 3 s of the failure; the launcher killed it"
check "the wedged job ended within 10 s (took $ms ms)" [ "$ms" -lt 10000 ]
check "no process of the wedged job remains" no_leftovers

DSC_TEST_VALUE="two words" run env -n 2 "$helper" env DSC_TEST_VALUE OMP_NUM_THREADS DSC_NUM_THREADS "$token"
check "the env job succeeds" [ "$rc" -eq 0 ]
check "DSC_* variables reach the ranks" has_line "$work/env" "DSC_TEST_VALUE=two words"
check "OMP_NUM_THREADS defaults to 1" has_line "$work/env" "OMP_NUM_THREADS=1"
check "DSC_NUM_THREADS defaults to 1" has_line "$work/env" "DSC_NUM_THREADS=1"
OMP_NUM_THREADS=3 run env3 -n 2 "$helper" env OMP_NUM_THREADS "$token"
check "a user's OMP_NUM_THREADS is kept" has_line "$work/env3" "OMP_NUM_THREADS=3"

printf '# test cluster\nnode-a slots=2\nnode-b slots=2 # second\n' >"$work/hosts"
root=""
[ "$(id -u)" -eq 0 ] && root=" --allow-run-as-root"
out=$(env -i PATH="$PATH" DSC_X=1 "$launch" --dry-run --hostfile "$work/hosts" --include 'node-a:1@node-b' \
    --mpi-args "--mca btl self" -n 3 prog --flag 'a b' 2>&1)
check "--dry-run prints the exact command" [ "$out" = \
    "mpirun -np 3$root --host node-a:1,node-b:2 -x DSC_NUM_THREADS -x DSC_X -x OMP_NUM_THREADS --mca btl self prog --flag 'a b'" ]
echo "$out"

printf 'node-a slots=2\nnode-b slots=two\n' >"$work/bad-hosts"
run badhosts --hostfile "$work/bad-hosts" -n 2 "$helper" ok "$token"
check "a bad hostfile is a usage error" [ "$rc" -eq 2 ]
check "the hostfile error names the line" has_line "$work/badhosts" \
    "dsc-launch: $work/bad-hosts:2: slots must be an integer from 1 to 65536, got \"two\""

run missing -n 2 ./no-such-program
check "a missing program is a usage error" [ "$rc" -eq 2 ]
check "the missing program is named" has_line "$work/missing" \
    "dsc-launch: program ./no-such-program is not an executable file"

pkill -KILL -f "$token" 2>/dev/null
check_summary
