#!/usr/bin/env bash
# netns-agent.sh — mpirun's remote agent for the test hosts of dsc-netns.sh,
# in place of ssh:   mpirun --mca plm_rsh_agent netns-agent.sh ...
# Called as `netns-agent.sh HOST COMMAND...`, it behaves like `ssh HOST
# COMMAND...`: it first connects to HOST's address from the caller's network
# (as ssh would: an unknown host or one that cannot be reached over the
# network is an error, status 255), then runs the command line through a
# shell on HOST (its namespace and host name).
# Not here: making hosts (dsc-netns.sh up).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
host=${1:-}
shift || true
[[ -n $host && $# -gt 0 ]] || {
    echo "netns-agent: usage: netns-agent.sh HOST COMMAND..." >&2
    exit 255
}
if ! ip netns list | awk '{print $1}' | grep -qxF "$host"; then
    echo "netns-agent: Could not resolve hostname $host: no such test host" >&2
    exit 255
fi
addr=$(ip -n "$host" -4 -o addr show dev eth0 2>/dev/null | awk '{split($4, a, "/"); print a[1]; exit}')
# A refused connection proves the host answers; a timeout or "no route" does not.
probe=$(timeout 3 bash -c "exec 3<>/dev/tcp/$addr/22" 2>&1)
if [[ $? -eq 124 || $probe == *"No route"* || $probe == *"unreachable"* || -z $addr ]]; then
    echo "netns-agent: connect to host $host (${addr:-no address}) port 22: No route to host" >&2
    exit 255
fi
exec "$here/dsc-netns.sh" exec "$host" /bin/sh -c "$*"
