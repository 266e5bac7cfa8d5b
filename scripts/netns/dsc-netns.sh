#!/usr/bin/env bash
# dsc-netns.sh — test hosts on this machine: each host is a network namespace
# with its own host name, joined to the others through a bridge, so that
# dsc-launch can run real multi-host jobs (MPI over TCP between the hosts)
# without a cluster. Needs root and iproute2.
#
#   dsc-netns.sh up PREFIX N         hosts PREFIX-h0 .. PREFIX-h<N-1> at
#                                    10.77.0.1 .. 10.77.0.N (/24); prints the names
#   dsc-netns.sh down PREFIX         removes every namespace of PREFIX and kills
#                                    what still runs in them (idempotent)
#   dsc-netns.sh exec HOST CMD...    runs CMD on HOST (its namespace, its host name)
#   dsc-netns.sh link HOST up|down   the host's cable: plugs or pulls its bridge port
#   dsc-netns.sh shape HOST DELAY_MS LOSS_PCT
#                                    slows the host's link (tc netem; where the
#                                    kernel has no netem, a tbf rate limit whose
#                                    queue delays and drops: see docs/multihost.md)
#   dsc-netns.sh hostfile PREFIX N SLOTS   a DeepSpeed hostfile for the hosts
#
# Layout: namespace PREFIX-sw holds bridge br0 with one port pN per host; host
# i's end of the cable is eth0 in namespace PREFIX-hi. Every namespace has lo
# up. Nothing is created outside these namespaces, and the addresses are a
# private range that exists only inside them.
#
# Not here: starting MPI (dsc-launch), or the remote agent (netns-agent.sh).
set -euo pipefail

NET=10.77.0

die() {
    echo "dsc-netns: $*" >&2
    exit 1
}

# host_index HOST -> i of PREFIX-hi
host_index() {
    local i=${1##*-h}
    [[ $i =~ ^[0-9]+$ ]] || die "\"$1\" is not a test host name (PREFIX-hN)"
    echo "$i"
}

switch_of() { echo "${1%-h*}-sw"; }

up() {
    local prefix=$1 n=$2 sw="$1-sw"
    [[ $n =~ ^[0-9]+$ && $n -ge 1 && $n -le 200 ]] || die "host count must be 1..200, got \"$n\""
    ip netns add "$sw"
    ip -n "$sw" link set lo up
    ip -n "$sw" link add br0 type bridge
    ip -n "$sw" link set br0 up
    for ((i = 0; i < n; i++)); do
        local h="$prefix-h$i"
        ip netns add "$h"
        ip -n "$h" link set lo up
        ip -n "$sw" link add "p$i" type veth peer name eth0 netns "$h"
        ip -n "$sw" link set "p$i" master br0 up
        ip -n "$h" addr add "$NET.$((i + 1))/24" dev eth0
        ip -n "$h" link set eth0 up
        echo "$h"
    done
}

# A host goes down with whatever still runs on it.
down() {
    local prefix=$1 ns pids
    for ns in $(ip netns list | awk '{print $1}'); do
        case $ns in
        "$prefix"-h* | "$prefix"-sw)
            pids=$(ip netns pids "$ns" 2>/dev/null || true)
            [[ -z $pids ]] || kill -KILL $pids 2>/dev/null || true
            ip netns del "$ns" 2>/dev/null || true
            ;;
        esac
    done
}

# The command gets the host's name in a UTS namespace of its own, so that
# MPI_Get_processor_name and mpirun's reports name the test host. Names need
# not resolve: mpirun hands them to the remote agent, and MPI connects to
# addresses.
run_on() {
    local h=$1
    shift
    ip netns list | awk '{print $1}' | grep -qxF "$h" || die "no test host \"$h\""
    exec ip netns exec "$h" unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' "$h" "$@"
}

link() {
    local h=$1 state=$2 i
    i=$(host_index "$h")
    [[ $state == up || $state == down ]] || die "link state must be up or down, got \"$state\""
    ip -n "$(switch_of "$h")" link set "p$i" "$state"
}

# tc on the switch's port shapes traffic towards the host; on the host's eth0,
# traffic from it: both, so that both directions see the delay and the loss.
shape() {
    local h=$1 delay=$2 loss=$3 i
    i=$(host_index "$h")
    local sw
    sw=$(switch_of "$h")
    if ip netns exec "$h" tc qdisc add dev eth0 root netem delay "${delay}ms" loss "${loss}%" 2>/dev/null; then
        ip netns exec "$sw" tc qdisc add dev "p$i" root netem delay "${delay}ms" loss "${loss}%"
        echo "netem delay ${delay}ms loss ${loss}%"
        return
    fi
    # No netem in this kernel: 20 Mbit/s with a short queue. Bursts wait in the
    # queue (delay) and what does not fit is dropped (loss), so TCP retransmits.
    ip netns exec "$h" tc qdisc add dev eth0 root tbf rate 20mbit burst 16kb latency "${delay}ms"
    ip netns exec "$sw" tc qdisc add dev "p$i" root tbf rate 20mbit burst 16kb latency "${delay}ms"
    echo "tbf rate 20mbit burst 16kb latency ${delay}ms (no netem in this kernel)"
}

hostfile() {
    local prefix=$1 n=$2 slots=$3
    for ((i = 0; i < n; i++)); do
        echo "$prefix-h$i slots=$slots"
    done
}

[[ $# -ge 2 ]] || die "usage: dsc-netns.sh up|down|exec|link|shape|hostfile ..."
cmd=$1
shift
case $cmd in
up) [[ $# -eq 2 ]] || die "usage: dsc-netns.sh up PREFIX N" && up "$@" ;;
down) [[ $# -eq 1 ]] || die "usage: dsc-netns.sh down PREFIX" && down "$@" ;;
exec) run_on "$@" ;;
link) [[ $# -eq 2 ]] || die "usage: dsc-netns.sh link HOST up|down" && link "$@" ;;
shape) [[ $# -eq 3 ]] || die "usage: dsc-netns.sh shape HOST DELAY_MS LOSS_PCT" && shape "$@" ;;
hostfile) [[ $# -eq 3 ]] || die "usage: dsc-netns.sh hostfile PREFIX N SLOTS" && hostfile "$@" ;;
*) die "unknown command \"$cmd\"" ;;
esac
