# netns.sh — sourced by the multi-host tests: hosts on one machine as
# network namespaces, each with a veth pair on a bridge of its own (the
# addresses exist only inside the namespaces: 10.77.0.1 for kilnd's, .2,
# .3, ... for the hosts), each process run there with its own host name
# (a UTS namespace), all torn down on exit, on failure too.
#   kx_up N        namespace 0 (kilnd) and hosts 1..N; returns 1 with the
#                  reason in $kx_why when namespaces cannot be made here
#   kx_run I NAME CMD...   CMD in namespace I with host name NAME
#   kx_spawn I NAME CMD... the same in place of the calling (background)
#                  shell, so its $! is CMD's own pid
#   kx_addr I      the address of namespace I
#   kx_link I down|up      the host's cable
#   kx_pids I      the processes in namespace I
#   kx_down        everything away (kx_scratch's trap calls it)
#   kx_scratch     a scratch folder in $d and the EXIT trap that kills the
#                  pids listed in $pids, takes the namespaces down and
#                  removes $d (kept, and named, with KEEP=1)
kx_prefix="kx$$"
kx_n=0
kx_why=""

kx_ns() { echo "${kx_prefix}n$1"; }
kx_addr() { echo "10.77.0.$(($1 + 1))"; }

kx_down() {
  i=0
  while [ "$i" -le "$kx_n" ]; do
    for pid in $(ip netns pids "$(kx_ns "$i")" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$(kx_ns "$i")" 2>/dev/null || true
    ip link del "${kx_prefix}v$i" 2>/dev/null || true
    i=$((i + 1))
  done
  ip link del "${kx_prefix}br" 2>/dev/null || true
}

kx_up() {
  kx_n=$1
  if [ "$(id -u)" != 0 ]; then
    kx_why="network namespaces need root (this runs as uid $(id -u))"
    return 1
  fi
  for tool in ip unshare; do
    if ! command -v "$tool" >/dev/null 2>&1; then
      kx_why="$tool is not installed (iproute2, util-linux)"
      return 1
    fi
  done
  if ! out=$(ip link add "${kx_prefix}br" type bridge 2>&1); then
    kx_why="cannot create a bridge: $out"
    return 1
  fi
  ip link set "${kx_prefix}br" up
  i=0
  while [ "$i" -le "$kx_n" ]; do
    ns=$(kx_ns "$i")
    if ! out=$(ip netns add "$ns" 2>&1); then
      kx_why="cannot create a network namespace: $out"
      kx_down
      return 1
    fi
    ip link add "${kx_prefix}v$i" type veth peer name eth0 netns "$ns"
    ip link set "${kx_prefix}v$i" master "${kx_prefix}br" up
    ip -n "$ns" addr add "$(kx_addr "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    i=$((i + 1))
  done
  return 0
}

kx_run() {
  i=$1 name=$2
  shift 2
  ip netns exec "$(kx_ns "$i")" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$name" "$@"
}

kx_spawn() {
  i=$1 name=$2
  shift 2
  exec ip netns exec "$(kx_ns "$i")" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$name" "$@"
}

kx_link() {
  ip link set "${kx_prefix}v$1" "$2"
}

kx_pids() {
  ip netns pids "$(kx_ns "$1")" 2>/dev/null
}

kx_cleanup() {
  for p in $pids; do kill -9 "$p" 2>/dev/null || true; done
  kx_down
  [ -n "${KEEP:-}" ] && echo "kept $d" || rm -rf "$d"
}

kx_scratch() {
  d=$(mktemp -d)
  pids=""
  trap kx_cleanup EXIT
  trap 'exit 1' INT TERM
}
