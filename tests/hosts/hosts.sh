#!/usr/bin/env bash
# hosts.sh -- several network hosts on one machine, for the tests and
# benchmarks that must cross a real network stack (docs/distributed.md,
# "Several hosts").
#
# Each host is a Linux network namespace with its own address, joined to the
# others by a veth pair and a bridge, as machines on one switch; a link may
# be limited to a rate (tc tbf on both ends: this kernel has no netem, so no
# latency is added). Open MPI reaches the hosts through its rsh launcher
# with tests/hosts/netns-rsh as the agent (which enters the host's namespace
# where ssh would log in), and is told to use TCP between hosts, so every
# byte between ranks crosses a network stack, and a host can be cut off
# (`cut`) or frozen like a real one. Needs root (CI runs as root).
#
#   hosts.sh up NAME N [RATE]   N hosts NAME-h0 .. NAME-h<N-1> at 10.213.0.1 ..
#                               10.213.0.N/24 (RATE, e.g. 1gbit: each link's limit)
#   hosts.sh down NAME          removes them all (idempotent: also after a failed run)
#   hosts.sh mpirun NAME N ARG...   mpirun on host 0 of NAME, one rank per host
#                               (-H 10.213.0.1,...), TCP between hosts
#   hosts.sh cut NAME I         takes host I's link down (the host vanishes)
#   hosts.sh join NAME I        brings it up again
#   hosts.sh addr I             host I's address
#
# Only these hosts' own addresses are ever contacted: mpirun itself runs
# inside host 0, and the bridge carries no address of the machine's.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
SUBNET=10.213.0

addr() { echo "$SUBNET.$(($1 + 1))"; }
ns() { echo "$1-h$2"; }
bridge() { echo "$1-br"; }

need_root() {
  if [ "$(id -u)" != 0 ]; then
    echo "hosts.sh: network namespaces need root (CI runs as root)" >&2
    exit 2
  fi
}

check_name() {  # interface names are at most 15 characters: NAME-br, NAME-v<i>h
  if ! [[ "$1" =~ ^[a-z][a-z0-9]{0,7}$ ]]; then
    echo "hosts.sh: NAME must be 1-8 lower-case letters or digits, starting with a letter; got '$1'" >&2
    exit 2
  fi
}

up() {
  local name=$1 n=$2 rate=${3:-}
  need_root; check_name "$name"
  if ! [[ "$n" =~ ^[0-9]+$ ]] || [ "$n" -lt 1 ] || [ "$n" -gt 200 ]; then
    echo "hosts.sh: N must be 1 to 200 hosts; got '$n'" >&2; exit 2
  fi
  down "$name" 2>/dev/null || true
  trap 'down "$name" >/dev/null 2>&1 || true' ERR
  ip link add "$(bridge "$name")" type bridge
  ip link set "$(bridge "$name")" up
  for ((i = 0; i < n; i++)); do
    local h; h=$(ns "$name" "$i")
    ip netns add "$h"
    ip link add "$name-v${i}b" type veth peer name "$name-v${i}h"
    ip link set "$name-v${i}b" master "$(bridge "$name")" up
    ip link set "$name-v${i}h" netns "$h"
    ip -n "$h" link set lo up
    ip -n "$h" link set "$name-v${i}h" name eth0
    ip -n "$h" addr add "$(addr "$i")/24" dev eth0
    ip -n "$h" link set eth0 up
    # A connection with data in flight to a vanished host gives up after ~3 s
    # of retransmissions instead of ~15 min: what lets mpirun, which runs on
    # host 0, end the job when a host's daemon cannot be reached
    # (docs/distributed.md, "When a host is lost"). Per namespace: the
    # machine's own setting is untouched.
    ip netns exec "$h" sysctl -qw net.ipv4.tcp_retries2=3
    if [ -n "$rate" ]; then  # both directions of the link
      tc qdisc add dev "$name-v${i}b" root tbf rate "$rate" burst 4mb latency 50ms
      ip netns exec "$h" tc qdisc add dev eth0 root tbf rate "$rate" burst 4mb latency 50ms
    fi
  done
  trap - ERR
  # Host 0 reaches every other host (a TCP connect to its closed port 9 is
  # refused at once once the link carries packets) before anyone uses them.
  for ((i = 1; i < n; i++)); do
    local ok=0 t
    for t in 1 2 3 4 5 6 7 8 9 10; do
      local said
      said=$(ip netns exec "$(ns "$name" 0)" timeout 2 bash -c \
               "exec 3<>/dev/tcp/$(addr "$i")/9" 2>&1 || true)
      if [[ "$said" == *refused* ]]; then ok=1; break; fi
      sleep 0.2
    done
    [ $ok = 1 ] || { echo "hosts.sh: host $i of $name does not answer" >&2; down "$name"; exit 1; }
  done
}

down() {
  local name=$1 h
  check_name "$name"
  for h in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$name-h[0-9]+$" || true); do
    ip netns pids "$h" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$h" 2>/dev/null || true
  done
  for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' |
             grep -E "^$name-(br|v[0-9]+b)$" || true); do
    ip link del "$l" 2>/dev/null || true
  done
}

run_mpirun() {
  local name=$1 n=$2; shift 2
  local hosts="" i
  for ((i = 0; i < n; i++)); do hosts+="${hosts:+,}$(addr "$i")"; done
  # rsh launcher with the namespace agent (no tree spawn: only host 0 may
  # launch), TCP for both MPI's messages and its runtime, on the hosts'
  # subnet only; one rank per host.
  DYNEMB_HOSTS_NAME=$name exec ip netns exec "$(ns "$name" 0)" \
    mpirun --allow-run-as-root -H "$hosts" -np "$n" --map-by node \
    --mca plm rsh --mca plm_rsh_agent "$here/netns-rsh" --mca plm_rsh_no_tree_spawn 1 \
    --mca btl tcp,self --mca btl_tcp_if_include "$SUBNET.0/24" \
    --mca oob_tcp_if_include "$SUBNET.0/24" "$@"
}

cmd=${1:-}
case "$cmd" in
  up) [ $# -ge 3 ] || { echo "usage: hosts.sh up NAME N [RATE]" >&2; exit 2; }; up "$2" "$3" "${4:-}" ;;
  down) [ $# -eq 2 ] || { echo "usage: hosts.sh down NAME" >&2; exit 2; }; need_root; down "$2" ;;
  mpirun) [ $# -ge 4 ] || { echo "usage: hosts.sh mpirun NAME N ARG..." >&2; exit 2; }
          run_mpirun "${@:2}" ;;
  cut) [ $# -eq 3 ] || { echo "usage: hosts.sh cut NAME I" >&2; exit 2; }
       ip link set "$2-v${3}b" down ;;
  join) [ $# -eq 3 ] || { echo "usage: hosts.sh join NAME I" >&2; exit 2; }
        ip link set "$2-v${3}b" up ;;
  addr) addr "$2" ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2; exit 2 ;;
esac
