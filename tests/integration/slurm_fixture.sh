#!/usr/bin/env bash
# slurm_fixture.sh COMMAND [ARGS...] — runs COMMAND against a one-node Slurm
# cluster on this host that it starts for it and removes afterwards: munged
# with its own key and socket, slurmctld and slurmd on ports of their own,
# with their state, spool and logs in a temporary folder. The node is this
# host (`hostname -s`) with every core, in partition `debug`; no cgroups
# (proctrack/linuxproc, task/none) and no accounting database: sacct works
# only with -c, on the job completion log (jobcomp/filetxt).
#
# COMMAND sees SLURM_CONF (so sbatch, squeue, sacct, scancel and scontrol
# talk to this cluster), KILN_SLURM_NODE, KILN_SLURM_PARTITION and
# KILN_SLURM_DIR. The exit status is COMMAND's; 77 (skipped) when the
# cluster cannot be made here (not root, Slurm or munge not installed),
# with the reason on stderr.
set -u

skip() {
  echo "SKIP: slurm fixture: $*" >&2
  exit 77
}
[ $# -ge 1 ] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || skip "needs root to run slurmctld and slurmd (uid $(id -u))"
for tool in munged munge slurmctld slurmd sbatch squeue sacct scancel sinfo scontrol python3; do
  command -v "$tool" >/dev/null 2>&1 || skip "$tool is not installed (bash scripts/install-deps.sh)"
done

dir=$(mktemp -d /tmp/kiln-slurm.XXXXXX) || exit 1
pids=()
conf="$dir/slurm.conf"

# Ends every process this cluster started: the daemons, and the job steps
# slurmd forked (they carry this cluster's SLURM_CONF in their environment,
# so nothing else on the machine is touched), then removes the folder.
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  if [ -S "$dir/munge/socket" ] && [ -f "$conf" ]; then
    ids=$(SLURM_CONF="$conf" timeout 5 squeue -h -o %i 2>/dev/null)
    [ -n "$ids" ] && SLURM_CONF="$conf" timeout 5 scancel $ids 2>/dev/null
  fi
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  for env in /proc/[0-9]*/environ; do
    pid=${env#/proc/}
    pid=${pid%/environ}
    [ "$pid" = "$$" ] && continue
    if { tr '\0' '\n' <"$env"; } 2>/dev/null | grep -qxF "SLURM_CONF=$conf"; then
      kill -9 "$pid" 2>/dev/null
    fi
  done
  rm -rf "$dir"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 143' INT TERM

fail() {
  echo "slurm fixture: $*" >&2
  for log in "$dir"/log/*.log "$dir"/munge/munged.log; do
    [ -f "$log" ] && { echo "--- $log" >&2; tail -n 30 "$log" >&2; }
  done
  exit 1
}

# munged: the key only root may read, the socket's folder open to all (as
# munged insists).
chmod 755 "$dir"
mkdir -m 700 "$dir/key" && mkdir -m 755 "$dir/munge" "$dir/log" "$dir/state" "$dir/spool" ||
  fail "cannot make folders under $dir"
head -c 1024 /dev/urandom >"$dir/key/munge.key" && chmod 400 "$dir/key/munge.key"
munged -F --socket="$dir/munge/socket" --key-file="$dir/key/munge.key" \
  --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" \
  --seed-file="$dir/key/seed" >>"$dir/log/munged.out" 2>&1 &
pids+=($!)
for _ in $(seq 50); do [ -S "$dir/munge/socket" ] && break; sleep 0.1; done
munge -S "$dir/munge/socket" -n 2>/dev/null | unmunge -S "$dir/munge/socket" >/dev/null 2>&1 ||
  fail "munged did not start"

# Two free TCP ports (the kernel's choice), not Slurm's 6817/6818.
read -r ctld_port slurmd_port < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
node=$(hostname -s)
cpus=$(nproc)
cat >"$conf" <<EOF
ClusterName=kilntest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/state/slurmctld.pid
SlurmdPidFile=$dir/spool/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/log/jobcomp.txt
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=2
KillWait=2
Waittime=0
SchedulerType=sched/builtin
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$conf" KILN_SLURM_NODE="$node" KILN_SLURM_PARTITION=debug KILN_SLURM_DIR="$dir"

slurmctld -D -c -i >>"$dir/log/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D >>"$dir/log/slurmd.out" 2>&1 &
pids+=($!)
state=""
for _ in $(seq 150); do
  state=$(timeout 5 sinfo -h -n "$node" -o %T 2>/dev/null)
  [ "$state" = idle ] && break
  sleep 0.2
done
[ "$state" = idle ] || fail "node $node is not idle after 30 s (sinfo says '${state:-nothing}')"
echo "slurm fixture: cluster up (node $node, $cpus CPUs, ports $ctld_port/$slurmd_port, $dir)"

"$@"
