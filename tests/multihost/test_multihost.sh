#!/usr/bin/env bash
# Multi-host jobs for real, on one machine: three test hosts (network
# namespaces joined by a bridge, scripts/netns/dsc-netns.sh), a hostfile with
# their names, and dsc-launch --hostfile --remote-agent netns-agent.sh --net
# starting MPI over TCP between them, the launcher itself running on host 0
# as on a cluster's head node. Checks:
#   - placement follows the hostfile, --include / --exclude and per-host slots;
#     DSC_* variables reach ranks on another host;
#   - an unreachable host is named before the job starts;
#   - DP and PP x EP training (dsc-train) across 2 hosts give the losses and
#     gradient norms of the same job on one host;
#   - with one host's link slowed (netem delay + loss, or a tbf queue where
#     the kernel has no netem) the job completes with the same results;
#   - a host's link pulled mid-step: the job stops within comm.timeout_s + 10 s
#     with a message naming the host whose ranks did not answer;
#   - SIGKILL of all ranks of one host: the job stops, the launcher names the host;
#   - no process of any job remains.
# Skipped (status 77, reason printed) when not root or namespaces cannot be made.
#
# usage: test_multihost.sh BIN_DIR MH_HOSTS LAUNCH_HELPER SOURCE_DIR
# The 10 s bound is the failure-handling requirement, not a speed claim.
set -u
bin=$1 mh_hosts=$2 helper=$3 src=$4
netns=$src/scripts/netns/dsc-netns.sh
agent=$src/scripts/netns/netns-agent.sh
prefix=dscmh$$
timeout_s=5
. "$(dirname "${BASH_SOURCE[0]}")/../support/check.sh"

skip() {
    echo "SKIP: $*"
    exit 77
}
[[ $(id -u) -eq 0 ]] || skip "multi-host tests need root to create network namespaces"
command -v ip >/dev/null && command -v unshare >/dev/null || skip "iproute2 (ip) and unshare are needed"
ip netns add "$prefix-probe" 2>/dev/null || skip "cannot create a network namespace (ip netns add failed)"
ip netns del "$prefix-probe"
work=$(mktemp -d /tmp/dsc-multihost.XXXXXX)

cleanup() { # the jobs run on the test hosts, so taking the hosts down ends them
    "$netns" down "$prefix"
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$netns" up "$prefix" 3 >/dev/null || skip "cannot create the test hosts (veth / bridge)"
h0=$prefix-h0 h1=$prefix-h1 h2=$prefix-h2
"$netns" hostfile "$prefix" 3 2 >"$work/hosts"
unset OMP_NUM_THREADS DSC_NUM_THREADS

has() { grep -qF -- "$2" "$1"; }
line_has() { grep -- "$2" "$1" | grep -qF -- "$3"; } # line_has FILE PATTERN TEXT
gone() { ! pgrep -f -- "$1" >/dev/null; }

# launch NAME ARGS...: dsc-launch on host 0 over the test hosts; output in
# $work/NAME, status in $rc, duration in $ms.
launch() {
    local name=$1
    shift
    local start
    start=$(date +%s%N)
    timeout 90 "$netns" exec "$h0" "$bin/dsc-launch" --hostfile "$work/hosts" --remote-agent "$agent" \
        --net 10.77.0.0/24 "$@" >"$work/$name" 2>&1
    rc=$?
    ms=$((($(date +%s%N) - start) / 1000000))
    echo "--- [$name] dsc-launch --hostfile ... $* -> status $rc after $ms ms"
    tail -n 25 "$work/$name"
}

# local NAME ARGS...: the same job on this machine alone (the reference).
local_run() {
    local name=$1
    shift
    timeout 90 "$bin/dsc-launch" "$@" >"$work/$name" 2>&1
    rc=$?
    echo "--- [$name] dsc-launch $* -> status $rc"
}

# same_numbers A B PATTERN: the text matching PATTERN (grep -oE) carries the
# same numbers in A and B (relative difference <= 1e-6; sorted, since ranks
# print in any order).
same_numbers() {
    local a b
    a=$(grep -oE "$3" "$1" | sort)
    b=$(grep -oE "$3" "$2" | sort)
    [[ -n $a && $(wc -l <<<"$a") -eq $(wc -l <<<"$b") ]] || return 1
    paste -d'|' <(echo "$a") <(echo "$b") | awk -F'|' '
        { n = split($1, x, /[ =,]+/); split($2, y, /[ =,]+/)
          for (i = 1; i <= n; i++) {
            if (x[i] ~ /^-?[0-9.]+(e[-+][0-9]+)?$/) {
              d = x[i] - y[i]; if (d < 0) d = -d; s = (x[i] < 0 ? -x[i] : x[i]) + 1e-30
              if (d / s > worst) worst = d / s
              if (d / s > 1e-6) bad++
            } else if (x[i] != y[i]) bad++ } }
        END { printf "    compared %d lines, worst relative difference %.2e\n", NR, worst; exit bad > 0 }'
}

# ---- placement, slots, include / exclude, environment --------------------------
# placed FILE N0 N1 N2: mh_hosts reported N0, N1, N2 ranks on hosts 0, 1, 2.
placed() {
    local file=$1 i=0 n
    shift
    for n in "$@"; do
        [ "$(grep -c " on host $prefix-h$i\$" "$file")" -eq "$n" ] || return 1
        i=$((i + 1))
    done
}
launch placement -n 6 "$mh_hosts"
check "6 ranks fill the 2 slots of each of 3 hosts" placed "$work/placement" 2 2 2
check "in hostfile order" has "$work/placement" "rank 2 of 6 on host $h1"
launch include -n 3 --include "$h0:1@$h2" "$mh_hosts"
check "--include host:slot@host uses 1 slot of host 0 and both of host 2" placed "$work/include" 1 0 2
launch exclude -n 4 --exclude "$h0" "$mh_hosts"
check "--exclude host 0 runs on hosts 1 and 2 only" placed "$work/exclude" 0 2 2
DSC_MH_VALUE="across hosts" launch env -n 2 --include "$h1" "$helper" env DSC_MH_VALUE OMP_NUM_THREADS "$work"
check "DSC_* variables reach ranks on another host" has "$work/env" "DSC_MH_VALUE=across hosts"
check "the one-thread default reaches them too" has "$work/env" "OMP_NUM_THREADS=1"

# ---- an unreachable host ---------------------------------------------------------
"$netns" link "$h2" down
launch unreachable -n 6 "$mh_hosts"
"$netns" link "$h2" up
check "an unreachable host stops the launch with status 2" [ "$rc" -eq 2 ]
check "the message names the unreachable host" has "$work/unreachable" "dsc-launch: host $h2 is unreachable"

# ---- DP training across 2 hosts equals one host ------------------------------------
head -c 300000 "$src/data/tinyshakespeare.txt" >"$work/text.txt"
"$bin/dsc-train" --prepare "$work/text.txt" "$work/text.tok" >/dev/null
cat >"$work/dp.json" <<EOF
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "steps_per_print": 1, "seed": 5,
 "model": {"arch": "gpt", "n_layer": 2, "d_model": 32, "n_head": 2, "vocab_size": 256, "seq_len": 16},
 "optimizer": {"type": "adamw", "params": {"lr": 0.003}},
 "comm": {"timeout_s": $timeout_s},
 "data": {"path": "$work/text.tok", "val_fraction": 0},
 "train": {"steps": 6}}
EOF
dp_job=("$bin/dsc-train" "$work/dp.json" --no-progress --sample 0)
loss_fields='"step": [0-9]+, "loss": [^,]+|"grad_norm": [^,]+'
local_run dp_local -n 4 "${dp_job[@]}" --metrics "$work/dp_local.jsonl"
launch dp_hosts -n 4 --include "$h0@$h1" "${dp_job[@]}" --metrics "$work/dp_hosts.jsonl"
check "DP job across 2 hosts succeeds" [ "$rc" -eq 0 ]
check "DP losses across 2 hosts equal one host's" same_numbers "$work/dp_hosts.jsonl" "$work/dp_local.jsonl" "$loss_fields"

# ---- PP x EP training across 2 hosts equals one host ---------------------------------
cat >"$work/ppep.json" <<EOF
{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1, "seed": 7,
 "model": {"arch": "gpt-moe", "n_layer": 2, "d_model": 32, "n_head": 2, "d_ff": 48, "vocab_size": 256, "seq_len": 16},
 "moe": {"num_experts": 4, "ep_size": 2, "k": 2, "layer_freq": 1, "capacity_factor": 1.5, "min_capacity": 1},
 "pipeline": {"stages": 2, "p2p_timeout_s": $timeout_s},
 "optimizer": {"type": "adamw", "params": {"lr": 0.003}},
 "comm": {"timeout_s": $timeout_s},
 "data": {"path": "$work/text.tok", "val_fraction": 0},
 "train": {"steps": 4}}
EOF
ppep_job=("$bin/dsc-train" "$work/ppep.json" --no-progress --sample 0)
local_run ppep_local -n 4 "${ppep_job[@]}" --metrics "$work/ppep_local.jsonl"
launch ppep_hosts -n 4 --include "$h0@$h1" "${ppep_job[@]}" --metrics "$work/ppep_hosts.jsonl"
check "PP x EP job across 2 hosts succeeds" [ "$rc" -eq 0 ]
check "it ran 2 pipeline stages x 2 data-parallel ranks (moe.ep_size 2: experts split over both)" has "$work/ppep_hosts" "2 pipeline stages x 2 data-parallel ranks"
check "PP x EP losses (and aux losses, gradient norms) across 2 hosts equal one host's" \
    same_numbers "$work/ppep_hosts.jsonl" "$work/ppep_local.jsonl" "$loss_fields|\"aux_loss\": [^,]+"

# ---- a slow, lossy link ------------------------------------------------------------------
shaping=$("$netns" shape "$h1" 20 1)
check "host 1's link is slowed: $shaping" [ -n "$shaping" ]
launch dp_slow -n 4 --include "$h0@$h1" "${dp_job[@]}" --metrics "$work/dp_slow.jsonl"
check "DP job over a slowed link succeeds ($shaping)" [ "$rc" -eq 0 ]
check "its losses equal one host's" same_numbers "$work/dp_slow.jsonl" "$work/dp_local.jsonl" "$loss_fields"
"$netns" down "$prefix"
"$netns" up "$prefix" 3 >/dev/null

# wait_for_step FILE: until a step line appears (the job is mid-training).
wait_for_step() {
    for _ in $(seq 1 300); do
        grep -q '"step": 2,' "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

# ---- a host's link pulled mid-step -----------------------------------------------------
long_job=("$bin/dsc-train" "$work/dp.json" --no-progress --sample 0 --set train.steps=100000
    --metrics "$work/long.jsonl")
launch link_down -n 4 --include "$h0@$h1" "${long_job[@]}" &
job=$!
wait_for_step "$work/long.jsonl"
cut=$(date +%s%N)
"$netns" link "$h1" down
wait $job
after=$((($(date +%s%N) - cut) / 1000000))
echo "--- [link_down] stopped $after ms after the link went down"
tail -n 12 "$work/link_down"
check "the job stopped within comm.timeout_s + 10 s of the link going down ($after ms)" \
    [ "$after" -lt $(((timeout_s + 10) * 1000)) ]
check "the launcher reports the failure" has "$work/link_down" "dsc-launch: job failed:"
check "a rank names the operation and group that were stuck" \
    line_has "$work/link_down" "dsc-launch: job failed:" "(4 ranks) timed out after $timeout_s s"
check "a rank names the host whose ranks did not answer" line_has "$work/link_down" "did not answer" "(host $h1)"
check "no process of the job remains" gone "$work/dp.json"
"$netns" link "$h1" up

# ---- SIGKILL of every rank of one host ---------------------------------------------------
launch killed -n 4 --include "$h0@$h1" "${long_job[@]}" &
job=$!
rm -f "$work/long.jsonl"
wait_for_step "$work/long.jsonl"
cut=$(date +%s%N)
for pid in $(ip netns pids "$h1"); do
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == dsc-train ]] && kill -KILL "$pid"
done
wait $job
after=$((($(date +%s%N) - cut) / 1000000))
echo "--- [killed] stopped $after ms after the kill"
tail -n 8 "$work/killed"
check "the job stopped within 10 s of the kill ($after ms)" [ "$after" -lt 10000 ]
check "the launcher names the host of the killed ranks" \
    line_has "$work/killed" "dsc-launch: job failed:" "on host $h1 killed by signal 9"
check "no process of the job remains" gone "$work/dp.json"

check_summary
