#!/bin/sh
# multi_worker over hosts: 1 host against 2 hosts, one core each. A real
# kilnd and two kiln-agents, each in a network namespace of its own
# (tests/integration/netns.sh) and pinned to a core of its own (agent a to
# core 0, agent b to core 1, --cpus 1); the same Fashion-MNIST CNN job with
# 1 worker (one host) and with 2 workers (gang-placed on both hosts, mpirun
# through kiln-agent's relay), RUNS times each, alternately. Reports
# kiln-train's own throughput line (examples/s over its training, data
# loading excluded) and the 2-host efficiency = examples/s(2) /
# (2 x examples/s(1)); the medians. Root, iproute2, mpirun and the built-in
# data sets needed.
# Usage: bench/multihost.sh [BUILD_DIR] [RUNS] [TAKE]
set -eu
build=$(cd "${1:-build}" && pwd)
runs=${2:-3}
take=${3:-8192}
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/tests/integration/netns.sh"
datasets="${KILN_DATASETS_DIR:-/usr/share/datasets}"
kilnd="$build/server/kilnd" trainer="$build/worker/kiln-train" agent="$build/agent/kiln-agent"
mpirun=$(command -v mpirun)
d=$(mktemp -d)
pids=""
cleanup() {
  for p in $pids; do kill -9 "$p" 2>/dev/null || true; done
  kx_down
  rm -rf "$d"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
kx_up 2 || {
  echo "multihost bench: $kx_why" >&2
  exit 1
}
port=$((30000 + $$ % 20000))
server="http://$(kx_addr 0):$port"
cat > "$d/pools.json" <<EOF
{"pools": [{"name": "default", "devices": 1},
  {"name": "hosts", "kind": "agents", "device_type": "cpu",
   "network": {"oob_tcp_if_include": "10.77.0.0/24", "btl_tcp_if_include": "10.77.0.0/24"}}]}
EOF
mkdir -p "$d/data"
admin=$("$kilnd" token create --tenant default --role admin --data-dir "$d/data" | tail -1)
"$kilnd" token create --role agent --data-dir "$d/data" | tail -1 > "$d/agent.token"
(kx_spawn 0 kilnd "$kilnd" --listen "$(kx_addr 0):$port" --behind-tls-proxy --data-dir "$d/data" \
  --datasets-dir "$datasets" --trainer "$trainer" --pools "$d/pools.json" > "$d/kilnd.log" 2>&1) &
pids="$pids $!"
for i in 1 2; do
  name=host-$(echo ab | cut -c"$i")
  (kx_spawn "$i" "$name" taskset -c $((i - 1)) "$agent" --server "$server" \
    --token-file "$d/agent.token" --name "$name" --pool hosts --address "$(kx_addr "$i")" \
    --work-dir "$d/work-$name" --cpus 1 --trainer "$trainer" --mpirun "$mpirun" --poll-wait 2 \
    > "$d/agent-$name.log" 2>&1) &
  pids="$pids $!"
done
api() {
  kx_run 0 kilnd curl -s -X "$1" -H "Authorization: Bearer $admin" -H 'Content-Type: application/json' \
    ${3:+--data "$3"} "$server$2"
}
for _ in $(seq 100); do
  [ "$(api GET /v1/agents 2>/dev/null | python3 -c "import json,sys; print(sum(a['state']=='ONLINE' for a in json.load(sys.stdin)['agents']))" 2>/dev/null || echo 0)" = 2 ] && break
  sleep 0.3
done
spec() { # workers
  cat <<EOF
{"display_name": "bench-$1", "model": {"input_shape": [28, 28, 1], "layers": [
   {"type": "conv2d", "filters": 8, "kernel_size": 3, "padding": "same", "activation": "relu"},
   {"type": "max_pool2d", "pool_size": 2},
   {"type": "conv2d", "filters": 16, "kernel_size": 3, "padding": "same", "activation": "relu"},
   {"type": "max_pool2d", "pool_size": 2},
   {"type": "flatten"}, {"type": "dense", "units": 32, "activation": "relu"},
   {"type": "dense", "units": 10}]},
 "loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"],
 "dataset": {"name": "fashion-mnist", "validation": "none"},
 "pipeline": {"batch_size": 64, "take": $take, "num_parallel_calls": 0},
 "optimizer": {"type": "sgd", "learning_rate": 0.05, "momentum": 0.9},
 "epochs": 1, "seed": 7, "log_every_steps": 20,
 "strategy": {"type": "multi_worker", "workers": $1},
 "resources": {"device_type": "cpu", "devices": $1, "pool": "hosts"}}
EOF
}
# One job to its end; kiln-train's examples/s from its throughput line.
run_one() {
  id=$(api POST /v1/jobs "$(spec "$1")" | python3 -c "import json,sys; print(json.load(sys.stdin)['id'])")
  for _ in $(seq 1200); do
    s=$(api GET "/v1/jobs/$id" | python3 -c "import json,sys; print(json.load(sys.stdin)['state'])")
    case "$s" in SUCCEEDED | FAILED | CANCELLED) break ;; esac
    sleep 0.5
  done
  [ "$s" = SUCCEEDED ] || {
    echo "bench job with $1 worker(s) ended $s" >&2
    tail -20 "$d/kilnd.log" >&2
    exit 1
  }
  grep "job=$id phase=throughput" "$d/kilnd.log" | grep -o '([0-9.]* examples/s)' | tr -d '(' | cut -d' ' -f1
}
: > "$d/one" && : > "$d/two"
for r in $(seq "$runs"); do
  run_one 1 >> "$d/one"
  run_one 2 >> "$d/two"
  echo "run $r: 1 host $(tail -1 "$d/one") examples/s, 2 hosts $(tail -1 "$d/two") examples/s" >&2
done
python3 - "$d/one" "$d/two" "$take" "$runs" <<'PY'
import statistics, sys
one = [float(x) for x in open(sys.argv[1]) if x.strip()]
two = [float(x) for x in open(sys.argv[2]) if x.strip()]
m1, m2 = statistics.median(one), statistics.median(two)
print(f"multi_worker CNN, {sys.argv[3]} Fashion-MNIST examples, batch 64 a worker, median of {sys.argv[4]}:")
print("| hosts (1 core each) | workers | examples/s | speed-up | efficiency |")
print("|---|---|---|---|---|")
print(f"| 1 | 1 | {m1:.1f} | 1.00 | 1.00 |")
print(f"| 2 | 2 | {m2:.1f} | {m2 / m1:.2f} | {m2 / (2 * m1):.2f} |")
PY
