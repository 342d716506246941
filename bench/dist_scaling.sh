#!/usr/bin/env bash
# Throughput scaling of kiln's strategies on this machine, one core per
# replica: mirrored R=2 against R=1 (threads in one kiln-train) and
# multi_worker N=2 against N=1 (kiln-train under mpirun, one core bound to
# each rank; N=2 once with the default 1 MiB bucket cap, where the big
# dense kernel's all-reduce overlaps the convolutions' backward, and once
# with DDP's 25 MiB, where the CNN's gradients make one bucket all-reduced
# after backward), with the share of training time spent making the
# replicas' gradients one; then PyTorch DDP (gloo) with 1 and 2 processes
# on the same CNN and per-process batch. Each figure is the best of REPS
# interleaved runs, in examples/s after 5 warm-up steps (as bench/torch_ddp.py times
# PyTorch), read from the times kiln-train's progress lines arrive; the
# whole run's figure (setup and final checkpoint included) is shown beside
# it. parameter_server sync and async with W=2 workers run against W=1,
# each with one server process (unbound: it mostly waits). Never part of
# CI's pass/fail.
# Usage: bench/dist_scaling.sh [BUILD_DIR] [EXAMPLES] [BATCH] [REPS (5)]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
examples="${2:-6400}"
batch="${3:-64}"
reps="${4:-5}"
trainer="$build/worker/kiln-train"
data="${KILN_DATASETS_DIR:-/usr/share/datasets}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

spec() { # STRATEGY-JSON
  cat <<SPEC
{"display_name": "dist-bench",
 "model": {"input_shape": [28, 28, 1], "layers": [
   {"type": "conv2d", "filters": 32, "kernel_size": 3, "padding": "same", "activation": "relu"},
   {"type": "max_pool2d", "pool_size": 2},
   {"type": "conv2d", "filters": 64, "kernel_size": 3, "padding": "same", "activation": "relu"},
   {"type": "max_pool2d", "pool_size": 2},
   {"type": "flatten"},
   {"type": "dense", "units": 128, "activation": "relu"},
   {"type": "dense", "units": 10}]},
 "loss": "sparse_categorical_crossentropy",
 "dataset": {"name": "fashion-mnist", "validation": "none"},
 "pipeline": {"batch_size": $batch, "take": $examples, "num_parallel_calls": 0},
 "optimizer": {"type": "adam", "learning_rate": 0.001},
 "epochs": 1, "log_every_steps": 5, "seed": 1, "strategy": $1}
SPEC
}

# Reads kiln-train's progress lines as they come and prints "steady whole
# comm%": examples/s from the step-5 line to the last step line (GLOBAL
# examples a step), the whole run's examples/s and comm share.
read_progress() { # GLOBAL-BATCH
  /usr/bin/python3 -u -c '
import re, sys, time
per_step = int(sys.argv[1])
first = last = None
whole = comm = "0"
for line in sys.stdin:
    now = time.monotonic()
    m = re.match(r"\{\"step\":(\d+),\"epoch\":\d+,\"metrics\":\{\"loss\"", line)
    if m and int(m.group(1)) >= 5:
        if first is None:
            first = (int(m.group(1)), now)
        last = (int(m.group(1)), now)
    m = re.search(r"\(([0-9.]+) examples/s\)", line)
    if m:
        whole = m.group(1)
    m = re.search(r"one took [0-9.]+ s \(([0-9.]+)%\)", line)
    if m:
        comm = m.group(1)
steady = (last[0] - first[0]) * per_step / (last[1] - first[1]) if first and last[1] > first[1] else 0
print(f"{steady:.0f} {whole} {comm}")
' "$1"
}

# One kiln-train run (under a launcher): "steady whole comm%".
kiln() { # NAME GLOBAL-BATCH STRATEGY-JSON LAUNCHER...
  local name="$1" global="$2" strategy="$3"
  shift 3
  spec "$strategy" > "$work/$name.json"
  "$@" "$trainer" --threads 1 --json --checkpoint-dir "$work/$name" "$work/$name.json" |
    read_progress "$global"
}

# The better of two "steady whole comm%" results (by steady).
better() { if [ "${1%% *}" -gt "${2%% *}" ]; then echo "$1"; else echo "$2"; fi; }

mpi=(mpirun --oversubscribe --bind-to core)
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
# One more process than cores at W=2: no binding, the server sleeps between messages.
mpi_ps=(mpirun --oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && mpi_ps+=(--allow-run-as-root)
ps_json() { echo "{\"type\": \"parameter_server\", \"ps\": 1, \"workers\": $1, \"mode\": \"$2\"}"; }
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
# Interleaved, so a busy moment of a shared machine hits every run alike;
# each run's best is kept.
m1b="0 0 0" m2b="0 0 0" w1b="0 0 0" w2b="0 0 0" o2b="0 0 0"
s1b="0 0 0" s2b="0 0 0" a1b="0 0 0" a2b="0 0 0"
for rep in $(seq "$reps"); do
  m1b=$(better "$m1b" "$(kiln m1 "$batch" '{"type": "single"}')")
  m2b=$(better "$m2b" "$(kiln m2 $((2 * batch)) '{"type": "mirrored", "replicas": 2}')")
  w1b=$(better "$w1b" "$(kiln w1 "$batch" '{"type": "multi_worker", "workers": 1}' \
    "${mpi[@]}" -np 1)")
  w2b=$(better "$w2b" "$(kiln w2 $((2 * batch)) '{"type": "multi_worker", "workers": 2}' \
    "${mpi[@]}" -np 2)")
  o2b=$(better "$o2b" "$(kiln o2 $((2 * batch)) \
    '{"type": "multi_worker", "workers": 2, "bucket_cap_mb": 25}' "${mpi[@]}" -np 2)")
  s1b=$(better "$s1b" "$(kiln s1 "$batch" "$(ps_json 1 sync)" "${mpi_ps[@]}" -np 2)")
  s2b=$(better "$s2b" "$(kiln s2 $((2 * batch)) "$(ps_json 2 sync)" "${mpi_ps[@]}" -np 3)")
  a1b=$(better "$a1b" "$(kiln a1 "$batch" "$(ps_json 1 async)" "${mpi_ps[@]}" -np 2)")
  a2b=$(better "$a2b" "$(kiln a2 $((2 * batch)) "$(ps_json 2 async)" "${mpi_ps[@]}" -np 3)")
  echo "run $rep of $reps done; load average $(cut -d' ' -f1-3 /proc/loadavg)"
done
read -r m1 m1w _ <<< "$m1b"
read -r m2 m2w c2 <<< "$m2b"
read -r w1 w1w _ <<< "$w1b"
read -r w2 w2w d2 <<< "$w2b"
read -r o2 o2w e2 <<< "$o2b"
read -r s1 s1w _ <<< "$s1b"
read -r s2 s2w f2 <<< "$s2b"
read -r a1 a1w _ <<< "$a1b"
read -r a2 a2w g2 <<< "$a2b"

eff() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f%%", (b > 0 ? 100 * a / (2 * b) : 0) }'; }
row() { # NAME AT1 AT2 WHOLE1 WHOLE2 COMM
  printf "| %-32s | %7.0f | %7.0f | %10s | %7.0f | %7.0f | %10s | %9s |\n" "$1" "$2" "$3" \
    "$(eff "$3" "$2")" "$4" "$5" "$(eff "$5" "$4")" "$6"
}
echo "kiln, Fashion-MNIST CNN, batch $batch per replica, $examples examples, one core per replica,"
echo "examples/s, best of $reps: after 5 warm-up steps | whole run:"
printf "| %-32s | %7s | %7s | %10s | %7s | %7s | %10s | %9s |\n" run "1" "2" efficiency \
  "1 whole" "2 whole" efficiency "comm (2)"
row "mirrored (threads)" "$m1" "$m2" "$m1w" "$m2w" "$c2%"
row "multi_worker, 1 MiB buckets" "$w1" "$w2" "$w1w" "$w2w" "$d2%"
row "multi_worker, one 25 MiB bucket" "$w1" "$o2" "$w1w" "$o2w" "$e2%"
row "parameter_server sync" "$s1" "$s2" "$s1w" "$s2w" "$f2%"
row "parameter_server async" "$a1" "$a2" "$a1w" "$a2w" "$g2%"

if ! /usr/bin/python3 -c "import torch" 2> /dev/null; then
  echo "SKIPPED: PyTorch DDP (python3-torch is not installed)"
  exit 0
fi
steps=$((examples / (2 * batch)))
torch_rate() { # PROCESSES
  /usr/bin/python3 bench/torch_ddp.py "$1" "$batch" "$steps" "$data/fashion-mnist" |
    /usr/bin/python3 -c 'import json,sys; print(round(json.load(sys.stdin)["examples_per_s"]))'
}
p1=0 p2=0
for rep in $(seq "$reps"); do
  rate=$(torch_rate 1)
  if [ "$rate" -gt "$p1" ]; then p1=$rate; fi
  rate=$(torch_rate 2)
  if [ "$rate" -gt "$p2" ]; then p2=$rate; fi
done
printf "| %-32s | %7.0f | %7.0f | %10s | %7s | %7s | %10s | %9s |\n" "PyTorch DDP (gloo)" "$p1" \
  "$p2" "$(eff "$p2" "$p1")" - - - -
awk -v k="$w2" -v p="$p2" \
  'BEGIN { printf "kiln multi_worker N=2 / PyTorch DDP 2 processes: %.2fx\n", k / p }'
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
