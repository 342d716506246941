#!/usr/bin/env bash
# Throughput scaling of kiln's strategies on this machine, one core per
# replica: mirrored R=2 against R=1 (threads in one kiln-train) and
# multi_worker N=2 against N=1 (kiln-train under mpirun, one core bound to
# each rank), with the share of training time spent making the replicas'
# gradients one; parameter_server sync and async with W=2 workers against
# W=1, each with one server process (unbound: it mostly waits); then
# PyTorch DDP (gloo) with 1 and 2 processes on the same CNN and
# per-process batch. Never part of CI's pass/fail.
# Usage: bench/dist_scaling.sh [BUILD_DIR] [EXAMPLES] [BATCH]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
examples="${2:-6400}"
batch="${3:-64}"
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
 "epochs": 1, "log_every_steps": 1000, "seed": 1, "strategy": $1}
SPEC
}

# Runs kiln-train (under a launcher) and prints "examples/s comm%".
kiln() { # NAME STRATEGY-JSON LAUNCHER...
  local name="$1" strategy="$2"
  shift 2
  spec "$strategy" > "$work/$name.json"
  "$@" "$trainer" --threads 1 --json --checkpoint-dir "$work/$name" "$work/$name.json" \
    > "$work/$name.out"
  local line
  line=$(grep -o 'trained [0-9]* examples in [0-9.]* s ([0-9.]* examples/s)[^"]*' \
    "$work/$name.out" | head -1)
  local rate comm
  rate=$(sed -n 's/.*(\([0-9.]*\) examples\/s).*/\1/p' <<< "$line")
  comm=$(sed -n 's/.*one took [0-9.]* s (\([0-9.]*\)%).*/\1/p' <<< "$line")
  echo "${rate:-0} ${comm:-0}"
}

mpi=(mpirun --oversubscribe --bind-to core)
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
read -r m1 c1 <<< "$(kiln m1 '{"type": "single"}')"
read -r m2 c2 <<< "$(kiln m2 '{"type": "mirrored", "replicas": 2}')"
read -r w1 d1 <<< "$(kiln w1 '{"type": "multi_worker", "workers": 1}' "${mpi[@]}" -np 1)"
read -r w2 d2 <<< "$(kiln w2 '{"type": "multi_worker", "workers": 2}' "${mpi[@]}" -np 2)"
# One more process than cores at W=2: no binding, the server sleeps between messages.
mpi_ps=(mpirun --oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && mpi_ps+=(--allow-run-as-root)
ps_json() { echo "{\"type\": \"parameter_server\", \"ps\": 1, \"workers\": $1, \"mode\": \"$2\"}"; }
read -r s1 e1 <<< "$(kiln s1 "$(ps_json 1 sync)" "${mpi_ps[@]}" -np 2)"
read -r s2 e2 <<< "$(kiln s2 "$(ps_json 2 sync)" "${mpi_ps[@]}" -np 3)"
read -r a1 f1 <<< "$(kiln a1 "$(ps_json 1 async)" "${mpi_ps[@]}" -np 2)"
read -r a2 f2 <<< "$(kiln a2 "$(ps_json 2 async)" "${mpi_ps[@]}" -np 3)"

eff() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f%%", (b > 0 ? 100 * a / (2 * b) : 0) }'; }
echo "kiln, Fashion-MNIST CNN, batch $batch per replica, $examples examples, one core per replica:"
printf "| %-22s | %12s | %12s | %10s | %14s |\n" run "R/N=1 ex/s" "R/N=2 ex/s" efficiency "comm share (2)"
printf "| %-22s | %12.0f | %12.0f | %10s | %13s%% |\n" "mirrored (threads)" "$m1" "$m2" \
  "$(eff "$m2" "$m1")" "$c2"
printf "| %-22s | %12.0f | %12.0f | %10s | %13s%% |\n" "multi_worker (mpirun)" "$w1" "$w2" \
  "$(eff "$w2" "$w1")" "$d2"
printf "| %-22s | %12.0f | %12.0f | %10s | %13s%% |\n" "parameter_server sync" "$s1" "$s2" \
  "$(eff "$s2" "$s1")" "$e2"
printf "| %-22s | %12.0f | %12.0f | %10s | %13s%% |\n" "parameter_server async" "$a1" "$a2" \
  "$(eff "$a2" "$a1")" "$f2"

if ! /usr/bin/python3 -c "import torch" 2> /dev/null; then
  echo "SKIPPED: PyTorch DDP (python3-torch is not installed)"
  exit 0
fi
steps=$((examples / (2 * batch)))
t1=$(/usr/bin/python3 bench/torch_ddp.py 1 "$batch" "$steps" "$data/fashion-mnist")
t2=$(/usr/bin/python3 bench/torch_ddp.py 2 "$batch" "$steps" "$data/fashion-mnist")
p1=$(/usr/bin/python3 -c 'import json,sys; print(json.loads(sys.argv[1])["examples_per_s"])' "$t1")
p2=$(/usr/bin/python3 -c 'import json,sys; print(json.loads(sys.argv[1])["examples_per_s"])' "$t2")
printf "| %-22s | %12.0f | %12.0f | %10s | %14s |\n" "PyTorch DDP (gloo)" "$p1" "$p2" \
  "$(eff "$p2" "$p1")" "-"
awk -v k="$w2" -v p="$p2" 'BEGIN { printf "kiln multi_worker N=2 / PyTorch DDP 2 processes: %.2fx\n", k / p }'
