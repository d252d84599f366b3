#!/usr/bin/env bash
# nodes.sh: K emulated nodes on this machine, for real multi-node mpiexec jobs
# without a cluster. Each node is a network + UTS + IPC namespace with its
# own host name and one veth into a shared bridge; addresses come only from
# 127.0.0.0/8. MPICH (ch4:ucx) then sees K hosts: ranks of one node talk
# through shared memory, ranks of different nodes through TCP over the veth,
# whose rate `tc tbf` limits in both directions.
#
#   nodes.sh up K [--ranks-per-node R] [--link RATE] [--burst SIZE] [--latency TIME]
#                 [--shared-cpus]
#   nodes.sh run [--] CMD...       run CMD on node 1; an mpiexec in CMD gets
#                                  the hostfile, the launcher and -iface
#   nodes.sh exec NODE [--] CMD... run CMD on node NODE (1..K or its name)
#   nodes.sh job K [up flags] -- CMD...   up, run CMD, down (also on failure)
#   nodes.sh kill-node NODE        kill every process on NODE (a node failure)
#   nodes.sh status                what is up
#   nodes.sh down                  remove exactly what up created
#   nodes.sh check                 exit 0 if nodes can be made here, else
#                                  77 with the reason (for test suites)
#
# RATE and SIZE are tc's units (1gbit, 200mbit; 64kb). --latency is tbf's
# queue bound (how long a packet may wait in the shaper before it is
# dropped), not an added delay: netem, which adds delay, is not available on
# every kernel this runs on. Without --link the link is the veth's own speed.
# Each node runs on its own share of the machine's CPUs (taskset; with more
# nodes than CPUs, or --shared-cpus, on all of them): nodes share no cores.
#
# Environment: WEFT_NODES_NAME (default "weft") prefixes every object this
# script makes (namespaces NAMEn1.., bridge NAMEbr, veths NAMEv1..; at most
# 8 characters) and names its state directory /run/NAME-nodes, so a test can
# run its own cluster beside a user's. WEFT_NODES_NET (default 127.77.0 for
# "weft", else 127.78.0) is the /24 the nodes' addresses come from (node i
# is NET.i); it must lie in 127.0.0.0/8.
#
# Everything up creates is listed in its state directory; down removes
# those objects and nothing else (and kills the processes still running in
# the namespaces it made). It never touches an interface, route, sysctl or
# namespace it did not create: the bridge in the root namespace gets no
# address, the sysctls it sets are inside its own namespaces.
set -Eeuo pipefail

NAME="${WEFT_NODES_NAME:-weft}"
if ! [[ "$NAME" =~ ^[a-z][a-z0-9]{0,7}$ ]]; then
  echo "nodes.sh: WEFT_NODES_NAME='$NAME': want 1-8 lowercase letters or digits, starting with a letter" >&2
  exit 2
fi
if [ "$NAME" = weft ]; then NET="${WEFT_NODES_NET:-127.77.0}"; else NET="${WEFT_NODES_NET:-127.78.0}"; fi
STATE="/run/$NAME-nodes"
BRIDGE="${NAME}br"
IFACE=wn0 # the node's end of its veth, inside its namespace

die() {
  echo "nodes.sh: $*" >&2
  exit 2
}

usage() {
  sed -n '2,/^set -Eeuo/p' "$0" | sed -e '/^set -Eeuo/d' -e 's/^# \{0,1\}//'
}

need_root() {
  [ "$(id -u)" -eq 0 ] ||
    die "must run as root: network namespaces, veths, a bridge and tc need CAP_SYS_ADMIN and CAP_NET_ADMIN (try sudo)"
  local t
  for t in ip tc unshare nsenter; do
    command -v "$t" >/dev/null || die "'$t' is not installed (Debian: iproute2 for ip and tc, util-linux for unshare and nsenter)"
  done
}

check_net() {
  [[ "$NET" =~ ^127\.([0-9]{1,3})\.([0-9]{1,3})$ ]] ||
    die "WEFT_NODES_NET='$NET': want 127.A.B (a /24 inside 127.0.0.0/8)"
  [ "${BASH_REMATCH[1]}" -le 255 ] && [ "${BASH_REMATCH[2]}" -le 255 ] ||
    die "WEFT_NODES_NET='$NET': octets must be <= 255"
}

is_up() { [ -f "$STATE/config" ]; }

load_config() {
  is_up || die "no nodes are up (run: nodes.sh up K)"
  # shellcheck source=/dev/null
  . "$STATE/config"
}

# The namespace of a node given as 1..K, nK, or its address.
node_ns() {
  local n="$1" i
  for ((i = 1; i <= K; i++)); do
    if [ "$n" = "$i" ] || [ "$n" = "n$i" ] || [ "$n" = "$NET.$i" ]; then
      echo "${NAME}n$i"
      return 0
    fi
  done
  return 1
}

node_list() {
  local i out=""
  for ((i = 1; i <= K; i++)); do out+="${out:+, }n$i ($NET.$i)"; done
  echo "$out"
}

record() { echo "$*" >>"$STATE/created"; }

# Sends signal $1 to every process in network namespace $2; prints how many.
ns_kill() {
  local pids
  pids=$(ip netns pids "$2" 2>/dev/null || true)
  [ -n "$pids" ] && kill "-$1" $pids 2>/dev/null || true
  echo $pids | wc -w
}

# Removes what $STATE/created lists, newest first; kills what runs in our
# namespaces before removing them.
teardown() {
  [ -f "$STATE/created" ] || {
    rm -rf "$STATE"
    return 0
  }
  local kind obj sig
  for sig in TERM KILL; do
    while read -r kind obj; do
      if [ "$kind" = netns ]; then ns_kill "$sig" "$obj" >/dev/null; fi
    done <"$STATE/created"
    if [ $sig = TERM ]; then sleep 0.2; fi
  done
  tac "$STATE/created" | while read -r kind obj; do
    case "$kind" in
      netns) ip netns del "$obj" 2>/dev/null || true ;;
      link) ip link del "$obj" 2>/dev/null || true ;;
    esac
  done
  rm -rf "$STATE"
}

cmd_up() {
  [ $# -ge 1 ] || die "up: how many nodes? (nodes.sh up K [--ranks-per-node R] [--link RATE])"
  local k="$1" r=1 rate="" burst="" latency=100ms shared_cpus=0
  shift
  [[ "$k" =~ ^[0-9]+$ ]] && [ "$k" -ge 1 ] && [ "$k" -le 64 ] || die "up: K='$k': want 1..64 nodes"
  while [ $# -gt 0 ]; do
    case "$1" in
      --ranks-per-node) r="${2:-}"; shift 2 || die "up: --ranks-per-node needs a value" ;;
      --link) rate="${2:-}"; shift 2 || die "up: --link needs a rate (e.g. 1gbit)" ;;
      --burst) burst="${2:-}"; shift 2 || die "up: --burst needs a size (e.g. 64kb)" ;;
      --latency) latency="${2:-}"; shift 2 || die "up: --latency needs a time (e.g. 100ms)" ;;
      --shared-cpus) shared_cpus=1; shift ;;
      *) die "up: unknown flag '$1'" ;;
    esac
  done
  [[ "$r" =~ ^[0-9]+$ ]] && [ "$r" -ge 1 ] || die "up: --ranks-per-node '$r': want an integer >= 1"
  if [ -n "$rate" ]; then
    [[ "$rate" =~ ^[0-9]+(\.[0-9]+)?([kmg]?bit|[kmg]?bps)$ ]] ||
      die "up: --link '$rate': want a tc rate such as 1gbit or 200mbit"
    if [ -z "$burst" ]; then
      # one millisecond at the rate, at least 16 KiB (a few MTUs)
      local bps
      bps=$(awk -v s="$rate" 'BEGIN{m=1; if(s~/gbit/)m=1e9; else if(s~/mbit/)m=1e6; else if(s~/kbit/)m=1e3;
        else if(s~/gbps/)m=8e9; else if(s~/mbps/)m=8e6; else if(s~/kbps/)m=8e3; else if(s~/bps/)m=8;
        v=s+0; printf "%d", v*m/8/1000}')
      [ "$bps" -lt 16384 ] && bps=16384
      burst="${bps}b"
    fi
  fi
  need_root
  check_net
  is_up && die "nodes are already up ($STATE); run 'nodes.sh down' first"
  mkdir -p "$STATE"
  : >"$STATE/created"
  trap 'echo "nodes.sh: up failed; removing what it made" >&2; teardown' ERR
  ip link add "$BRIDGE" type bridge
  record link "$BRIDGE"
  ip link set "$BRIDGE" up
  local i ns v
  for ((i = 1; i <= k; i++)); do
    ns="${NAME}n$i"
    v="${NAME}v$i"
    ip netns add "$ns"
    record netns "$ns"
    ip link add "$v" type veth peer name "$IFACE" netns "$ns"
    record link "$v"
    ip link set "$v" master "$BRIDGE" up
    ip netns exec "$ns" sysctl -q -w net.ipv4.conf.all.route_localnet=1
    ip netns exec "$ns" ip link set lo up
    # 127.0.0.0/8 is local on lo by default: keep only 127.0.0.1 there so
    # the other nodes' 127 addresses route out through the veth
    ip netns exec "$ns" ip route del local 127.0.0.0/8 dev lo table local 2>/dev/null || true
    ip netns exec "$ns" ip route replace local 127.0.0.1 dev lo table local
    ip netns exec "$ns" ip addr add "$NET.$i/24" dev "$IFACE"
    ip netns exec "$ns" ip link set "$IFACE" up
    ip netns exec "$ns" sysctl -q -w "net.ipv4.conf.$IFACE.route_localnet=1"
    if [ -n "$rate" ]; then
      # both directions: the node's egress and the bridge's egress to it
      ip netns exec "$ns" tc qdisc add dev "$IFACE" root tbf rate "$rate" burst "$burst" latency "$latency"
      tc qdisc add dev "$v" root tbf rate "$rate" burst "$burst" latency "$latency"
    fi
  done
  : >"$STATE/hostfile"
  for ((i = 1; i <= k; i++)); do echo "$NET.$i:$r" >>"$STATE/hostfile"; done
  # each node its own CPUs, as real nodes have (K <= CPUs: an equal share
  # each; more nodes than CPUs, or --shared-cpus: every CPU for every node)
  local ncpu cpus
  ncpu=$(nproc)
  : >"$STATE/cpus"
  for ((i = 1; i <= k; i++)); do
    if [ "$shared_cpus" = 1 ] || [ "$k" -gt "$ncpu" ]; then
      cpus="0-$((ncpu - 1))"
    else
      cpus="$(((i - 1) * ncpu / k))-$((i * ncpu / k - 1))"
    fi
    echo "n$i $cpus" >>"$STATE/cpus"
  done
  write_launcher "$k"
  cat >"$STATE/config" <<EOF
K=$k
R=$r
RATE='${rate:-none}'
BURST='${burst:-none}'
LATENCY='$latency'
NET='$NET'
EOF
  trap - ERR
  echo "nodes.sh: $k nodes up ($(K=$k node_list)), $r ranks per node, link ${rate:-unlimited}"
  echo "nodes.sh: hostfile $STATE/hostfile; run jobs with: $0 run -- mpiexec -n $((k * r)) PROGRAM"
}

# hydra's ssh launcher calls: launch [-x] HOST COMMAND (one string, as ssh
# runs it through a shell). The launcher enters HOST's namespaces, gives the
# new UTS namespace the node's host name and a fresh IPC namespace (UCX
# treats ranks in one IPC namespace as sharing memory), and runs COMMAND.
write_launcher() {
  local k="$1" i
  {
    echo '#!/bin/bash'
    echo "# written by nodes.sh up: hydra's launcher for the '$NAME' nodes"
    echo 'while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done'
    echo 'host="${1:-}"; shift || true'
    echo 'case "$host" in'
    for ((i = 1; i <= k; i++)); do
      echo "  $i|n$i|$NET.$i) ns=${NAME}n$i; hn=n$i; cpus=$(awk -v n="n$i" '$1 == n { print $2 }' "$STATE/cpus") ;;"
    done
    echo "  *) echo \"nodes.sh launcher: unknown node '\$host' (this cluster has: $(K=$k node_list))\" >&2; exit 2 ;;"
    echo 'esac'
    # not exec: this shell stays in the root namespace to see how the
    # node's proxy ended (killed with its node, or a normal exit)
    echo 'trap "sig=1" TERM HUP INT PIPE'
    echo 'taskset -c "$cpus" ip netns exec "$ns" unshare --uts --ipc /bin/sh -c '"'"'hostname "$0" && exec /bin/sh -c "$1"'"'"' "$hn" "$*"'
    echo 'rc=$?'
    echo "echo \"\$hn \$rc\" >>'$STATE/proxies'"
    echo 'exit $rc'
  } >"$STATE/launch"
  chmod 755 "$STATE/launch"
}

# Hosts named by an mpiexec command line (-f/-hostfile/-machinefile FILE,
# -hosts a,b:2): every one must be a node of this cluster.
check_hosts() {
  local prev="" a h f
  for a in "$@"; do
    case "$prev" in
      -f | -hostfile | -machinefile | --hostfile)
        f="$a"
        [ -r "$f" ] || die "run: hostfile '$f' cannot be read"
        while read -r h _; do
          h="${h%%#*}"
          h="${h%%:*}"
          [ -z "$h" ] && continue
          node_ns "$h" >/dev/null ||
            die "run: hostfile '$f' names '$h', which is not a node of this cluster ($(node_list))"
        done <"$f"
        ;;
      -hosts | --hosts)
        local IFS=,
        for h in $a; do
          h="${h%%:*}"
          node_ns "$h" >/dev/null || die "run: -hosts names '$h', which is not a node of this cluster ($(node_list))"
        done
        unset IFS
        ;;
    esac
    prev="$a"
  done
}

# Runs "$@" on node $1 (its namespaces and host name).
on_node() {
  local ns="$1" hn="$2"
  shift 2
  export UCX_NET_DEVICES="$IFACE"
  local cpus
  cpus=$(awk -v n="$hn" '$1 == n { print $2 }' "$STATE/cpus")
  exec taskset -c "$cpus" ip netns exec "$ns" unshare --uts --ipc /bin/sh -c 'hostname "$0" && shift && exec "$@"' "$hn" -- "$@"
}

cmd_run() {
  need_root
  load_config
  [ "${1:-}" = -- ] && shift
  [ $# -ge 1 ] || die "run: no command (nodes.sh run -- mpiexec -n N PROGRAM)"
  local first
  first=$(basename "$1")
  case "$first" in
    mpiexec | mpiexec.hydra | mpirun)
      local prog="$1" has_hosts=0 a
      shift
      for a in "$@"; do
        case "$a" in -f | -hostfile | -machinefile | --hostfile | -hosts | --hosts) has_hosts=1 ;; esac
        [ "$a" = -launcher ] && die "run: the command sets -launcher; nodes.sh provides its own"
      done
      check_hosts "$@"
      local extra=(-launcher ssh -launcher-exec "$STATE/launch" -iface "$IFACE")
      [ $has_hosts = 0 ] && extra+=(-f "$STATE/hostfile")
      rm -f "$STATE/proxies"
      local rc=0
      (on_node "${NAME}n1" n1 "$prog" "${extra[@]}" "$@") || rc=$?
      [ $rc = 0 ] || report_lost "$rc" "$@"
      return $rc
      ;;
    *) on_node "${NAME}n1" n1 "$@" ;;
  esac
}

# The ranks hydra placed on each node: hosts in hostfile order, each taking
# its slots (or -ppn) in turn, round after round, until -n ranks are placed.
# Prints "NODE first..last" lines.
rank_map() {
  local n="" ppn="" prev="" a hosts=""
  for a in "$@"; do
    case "$prev" in
      -n | -np) n="$a" ;;
      -ppn) ppn="$a" ;;
      -f | -hostfile | -machinefile | --hostfile) hosts="$a" ;;
    esac
    prev="$a"
  done
  [ -n "$hosts" ] || hosts="$STATE/hostfile"
  [ -n "$n" ] || return 0
  awk -v n="$n" -v ppn="$ppn" -v net="$NET" 'BEGIN { k = 0 }
    { h=$1; sub(/#.*/, "", h); if (h == "") next; s=h; sub(/^[^:]*:?/, "", s); sub(/:.*/, "", h);
      if (h ~ "^" net "\\.") { sub("^" net "\\.", "n", h) }
      host[k]=h; slots[k]=(ppn != "" ? ppn : (s == "" ? 1 : s)); k++ }
    END { r=0; while (r < n && k > 0) for (i=0; i<k && r<n; i++) for (j=0; j<slots[i] && r<n; j++) { list[host[i]] = list[host[i]] " " r; r++ }
          for (h in list) print h list[h] }' "$hosts"
}

# After a failed mpiexec: which nodes were lost (their proxy died of a
# signal, or mpiexec itself on n1), with their ranks; then no process of the
# job may stay behind on any node.
report_lost() {
  local rc="$1" hn prc lost=0 ranks
  shift
  if [ "$rc" -gt 128 ] && [ "$rc" -ne 255 ]; then
    ranks=$(rank_map "$@" | awk '$1 == "n1" { $1 = ""; print }')
    echo "nodes.sh: node n1 ($NET.1) was lost during the job: mpiexec, which ran there, ended by signal $((rc - 128)); ranks on it:${ranks:- unknown}" >&2
    lost=1
  fi
  if [ -f "$STATE/proxies" ]; then
    while read -r hn prc; do
      if [ "$prc" -gt 128 ]; then
        ranks=$(rank_map "$@" | awk -v h="$hn" '$1 == h { $1 = ""; print }')
        echo "nodes.sh: node $hn was lost during the job: its MPI proxy ended by signal $((prc - 128)); lost ranks:${ranks:- unknown}" >&2
        lost=1
      fi
    done <"$STATE/proxies"
  fi
  [ $lost = 1 ] || echo "nodes.sh: the job failed (mpiexec exit status $rc); no node was lost" >&2
  local i left=0
  for ((i = 1; i <= K; i++)); do left=$((left + $(ns_kill KILL "${NAME}n$i"))); done
  [ $left = 0 ] || echo "nodes.sh: killed $left processes the job left behind" >&2
}

cmd_exec() {
  need_root
  load_config
  [ $# -ge 1 ] || die "exec: which node? (nodes.sh exec NODE -- CMD)"
  local ns
  ns=$(node_ns "$1") || die "exec: unknown node '$1' (this cluster has: $(node_list))"
  local hn="n${ns#"${NAME}n"}"
  shift
  [ "${1:-}" = -- ] && shift
  [ $# -ge 1 ] || die "exec: no command"
  on_node "$ns" "$hn" "$@"
}

cmd_kill_node() {
  need_root
  load_config
  [ $# -eq 1 ] || die "kill-node: which node?"
  local ns
  ns=$(node_ns "$1") || die "kill-node: unknown node '$1' (this cluster has: $(node_list))"
  echo "nodes.sh: killed $(ns_kill KILL "$ns") processes on node $1 ($ns)"
}

cmd_status() {
  if ! is_up; then
    echo "nodes.sh: no '$NAME' nodes are up"
    return 0
  fi
  load_config
  echo "nodes.sh: $K '$NAME' nodes up: $(node_list); $R ranks per node; link $RATE (burst $BURST, queue $LATENCY)"
  echo "  hostfile $STATE/hostfile, launcher $STATE/launch"
  local i
  for ((i = 1; i <= K; i++)); do
    echo "  n$i: CPUs $(awk -v n="n$i" '$1 == n { print $2 }' "$STATE/cpus"), $(ip netns pids "${NAME}n$i" 2>/dev/null | wc -l) processes"
  done
}

cmd_down() {
  if ! [ -d "$STATE" ]; then
    echo "nodes.sh: no '$NAME' nodes are up"
    return 0
  fi
  need_root
  teardown
  echo "nodes.sh: '$NAME' nodes removed"
}

cmd_check() {
  [ "$(id -u)" -eq 0 ] || {
    echo "nodes.sh: not root: network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN"
    exit 77
  }
  local t
  for t in ip tc unshare nsenter; do
    command -v "$t" >/dev/null || {
      echo "nodes.sh: '$t' is not installed"
      exit 77
    }
  done
  local probe="${NAME}chk$$"
  probe="${probe:0:15}"
  if ! ip netns add "$probe" 2>/dev/null; then
    echo "nodes.sh: cannot create a network namespace here (a container without CAP_SYS_ADMIN?)"
    exit 77
  fi
  local ok=1
  ip netns exec "$probe" unshare --uts --ipc true 2>/dev/null || ok=0
  ip netns del "$probe"
  [ $ok = 1 ] || {
    echo "nodes.sh: cannot create UTS/IPC namespaces here"
    exit 77
  }
  echo "nodes.sh: namespaces can be made here"
}

cmd_job() {
  [ $# -ge 1 ] || die "job: how many nodes? (nodes.sh job K [up flags] -- CMD...)"
  local up_args=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    up_args+=("$1")
    shift
  done
  [ "${1:-}" = -- ] || die "job: put -- before the command"
  shift
  [ $# -ge 1 ] || die "job: no command"
  cmd_up "${up_args[@]}"
  trap 'teardown' EXIT
  trap 'exit 130' INT TERM
  local rc=0
  (bash "$0" run -- "$@") || rc=$?
  exit $rc
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  run) shift; cmd_run "$@" ;;
  exec) shift; cmd_exec "$@" ;;
  job) shift; cmd_job "$@" ;;
  kill-node) shift; cmd_kill_node "$@" ;;
  status) cmd_status ;;
  down) cmd_down ;;
  check) cmd_check ;;
  -h | --help | help) usage ;;
  "") usage >&2; exit 2 ;;
  *) die "unknown command '$1' (up, run, exec, job, kill-node, status, down, check; --help)" ;;
esac
