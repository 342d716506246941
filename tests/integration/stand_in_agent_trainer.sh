#!/bin/sh
# A stand-in for kiln-train under kiln-agent: takes kiln-train's flags,
# writes what it was given (host, rank, flags, the data set's files) to
# $STANDIN_OUT/<host>-<rank>, and on rank 0 its progress lines (fd 3, or
# stdout with --json): 6 metric lines, a checkpoint (weights and training
# state) at step 3, then sleeps $STANDIN_SLEEP seconds (SIGTERM: exit 6, as
# kiln-train after its checkpoint) and exits $STANDIN_EXIT.
set -u
progress=3 ckdir=. data="" uploads="" resume="" spec=""
while [ $# -gt 0 ]; do
  case "$1" in
  --json) progress=1 ;;
  --progress-fd) progress=$2; shift ;;
  --checkpoint-dir) ckdir=$2; shift ;;
  --data-dir) data=$2; shift ;;
  --uploads-dir) uploads=$2; shift ;;
  --resume) resume=$2; shift ;;
  --spec) spec=$2; shift ;;
  esac
  shift
done
rank=${OMPI_COMM_WORLD_RANK:-0}
out=${STANDIN_OUT:-/tmp}
{
  echo "host=$(hostname)"
  echo "rank=$rank"
  echo "spec=$(cat "$spec" 2>/dev/null)"
  echo "resume=$resume"
  echo "resume_state=$( [ -n "$resume" ] && cat "${resume%.safetensors}.state")"
  echo "data=$( [ -n "$data" ] && cat "$data/toy/records.txt")"
  echo "uploads_same=$( [ -n "$uploads" ] && [ "$uploads" = "$data" ] && echo yes)"
  echo "devices=${KILN_DEVICES:-}"
  echo "affinity=$(grep Cpus_allowed_list /proc/self/status | cut -f2)"
  echo "extra=${KILN_EXTRA:-}"
} > "$out/$(hostname)-$rank"
trap 'exit 6' TERM
emit() { if [ "$progress" = 1 ]; then echo "$1"; else echo "$1" >&3; fi; }
if [ "$rank" = 0 ]; then
  echo "a log line on stdout"
  for step in 1 2 3 4 5 6; do
    emit "{\"step\":$step,\"epoch\":1,\"metrics\":{\"loss\":0.$step}}"
    if [ "$step" = 3 ]; then
      echo "weights at $step" > "$ckdir/ckpt-3.safetensors"
      echo "state at $step" > "$ckdir/ckpt-3.state"
      sha=$(sha256sum "$ckdir/ckpt-3.safetensors" | cut -d' ' -f1)
      emit "{\"checkpoint\":{\"step\":3,\"path\":\"$ckdir/ckpt-3.safetensors\",\"bytes\":11,\"sha256\":\"$sha\"}}"
    fi
  done
fi
i=0
while [ "$i" -lt "${STANDIN_SLEEP:-0}" ]; do sleep 1 & wait $!; i=$((i + 1)); done
exit "${STANDIN_EXIT:-0}"
