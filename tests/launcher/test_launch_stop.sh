#!/usr/bin/env bash
# dsc-launch and SIGTERM: the signal reaches every rank as SIGUSR2 (through
# mpirun), so a 2-rank job whose ranks stop cleanly on it makes the launcher
# exit 0; ranks without a handler die of it and the launcher exits 128 + 15
# naming the interrupted job; ranks that ignore it are ended after
# --stop-timeout, or at once by a second SIGTERM. No process is left behind.
# (dsc-serve's drain through the launcher: test_serve_lifecycle_tp2 etc.)
#
# usage: test_launch_stop.sh DSC_LAUNCH
# Every wait has a deadline; the 10 s bounds are the requirement that a
# stopped job ends promptly, not speed claims.
set -u
launch=$1
token=dscstop$$r$RANDOM
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$(dirname "${BASH_SOURCE[0]}")/../support/check.sh"

has_line() { grep -qF -- "$2" "$1"; }
no_leftovers() { ! pgrep -f "$token" >/dev/null; }

# start NAME [LAUNCHER OPTIONS] -- SCRIPT: dsc-launch -n 2 bash -c SCRIPT in
# the background ($0: $work/$token.NAME, so the token names every process of
# the job); each rank touches $0.ready.RANK when it is set up.
start() {
    local name=$1
    shift
    local opts=()
    while [ "$1" != "--" ]; do
        opts+=("$1")
        shift
    done
    local script="$2"
    "$launch" -n 2 "${opts[@]}" bash -c "$script" "$work/$token.$name" >"$work/$name.out" 2>&1 &
    pid=$!
    started=$(date +%s%N)
    for _ in $(seq 600); do
        [ "$(ls "$work/$token.$name".ready.* 2>/dev/null | wc -l)" -eq 2 ] && return 0
        sleep 0.05
    done
    echo "the ranks of $name did not get ready in 30 s"
    return 1
}

# finish: waits (at most 60 s) for the launcher; its status in $rc, the time since the start in $ms.
finish() {
    local name=$1
    for _ in $(seq 1200); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "dsc-launch did not exit within 60 s"
        kill -KILL "$pid"
    fi
    wait "$pid"
    rc=$?
    ms=$((($(date +%s%N) - started) / 1000000))
    echo "--- $name: dsc-launch exited $rc after $ms ms"
    cat "$work/$name.out"
}

ready='touch "$0.ready.$OMPI_COMM_WORLD_RANK";'

# 1. Ranks that stop cleanly on SIGUSR2 (as dsc-serve drains): the launcher exits 0.
start drain -- "trap 'touch \"\$0.stopped.\$OMPI_COMM_WORLD_RANK\"; kill \$! 2>/dev/null; exit 0' USR2; $ready exec -a \"\$0\" sleep 60 & wait"
kill -TERM "$pid"
finish drain
check "a job that stops cleanly on SIGTERM: the launcher exits 0" [ "$rc" -eq 0 ]
check "both ranks got the stop request" [ -e "$work/$token.drain.stopped.0" -a -e "$work/$token.drain.stopped.1" ]
check "the launcher says the ranks stopped" has_line "$work/drain.out" \
    "dsc-launch: every rank stopped and exited 0 after signal 15"
check "no process of the drained job remains" no_leftovers

# 2. Ranks without a handler die of SIGUSR2: the job is interrupted, 128 + 15.
start plain -- "$ready exec -a \"\$0\" sleep 60"
kill -TERM "$pid"
finish plain
check "ranks without a handler: the launcher exits 143" [ "$rc" -eq 143 ]
check "the verdict names the rank, the signal and the interruption" has_line "$work/plain.out" \
    "killed by signal 12 (User defined signal 2) (interrupted by signal 15)"
check "the job ended within 10 s (took $ms ms)" [ "$ms" -lt 10000 ]
check "no process of the interrupted job remains" no_leftovers

# ended NAME WHAT: the launcher ended the job of ranks that ignore SIGUSR2 with 143, within 10 s, cleanly.
ended() {
    finish "$1"
    check "$2: the launcher exits 143" [ "$rc" -eq 143 ]
    check "$2: the job ended within 10 s of the start (took $ms ms)" [ "$ms" -lt 10000 ]
    check "$2: no process of the job remains" no_leftovers
}
deaf="trap '' USR2; $ready exec -a \"\$0\" sleep 60"

# 3. Ranks that ignore it: --stop-timeout 1 ends the job.
start deaf --stop-timeout 1 -- "$deaf"
kill -TERM "$pid"
ended deaf "ranks ignoring the stop request, after the stop timeout"

# 4. ... or a second SIGTERM ends it at once (the stop timeout is 60 s).
start twice -- "$deaf"
kill -TERM "$pid"
sleep 0.5
kill -TERM "$pid"
ended twice "a second SIGTERM"

# 5. SIGINT (kill -INT, not a terminal's Ctrl-C, which reaches mpirun itself) drains as SIGTERM does.
start int -- "trap 'kill \$! 2>/dev/null; exit 0' USR2; $ready exec -a \"\$0\" sleep 60 & wait"
kill -INT "$pid"
finish int
check "SIGINT: the ranks stop cleanly and the launcher exits 0" [ "$rc" -eq 0 ]
check "no process of the SIGINT job remains" no_leftovers
check_summary
