#!/bin/sh
# Multi-host on one machine: a real kilnd and three real kiln-agents, each
# in a network namespace of its own with its own host name (netns.sh),
# real kiln-train under real mpirun whose daemons go through kiln-agent's
# relay. Shown: the three agents register and appear with their devices;
# a wrong agent token gets 401 and changes nothing; a multi_worker CNN job
# of 2 workers gang-placed on 2 hosts (one core each) trains to the same
# weights and loss (1e-5) as 2 workers under mpirun on one host, a rank
# in each host's namespace; cancel leaves no process of the job in any
# namespace within 10 s; a link down for less than the grace window costs
# nothing; SIGKILL of an agent mid-job requeues the job (AGENT_LOST, an
# infrastructure restart) and it resumes from its checkpoint on the
# remaining hosts and succeeds; a link down longer than the grace fails
# over the same way; after kilnd restarts every agent registers again and
# the next job runs. Exits 77 (skipped, with the reason) where network
# namespaces cannot be made, or without mpirun or the data sets.
# Usage: multihost.sh KILND KILN_TRAIN KILN_AGENT MPIRUN
set -eu
kilnd="$1"
trainer="$2"
agent_bin="$3"
mpirun="${4:-}"
here=$(cd "$(dirname "$0")" && pwd)
. "$here/netns.sh"
datasets="${KILN_DATASETS_DIR:-/usr/share/datasets}"
if [ -z "$mpirun" ]; then
  echo "SKIP: this build has no mpirun (KILN_MPI off)"
  exit 77
fi
if [ ! -d "$datasets/fashion-mnist" ]; then
  echo "SKIP: the built-in data sets are not at $datasets (KILN_DATASETS_DIR)"
  exit 77
fi
kx_scratch
if ! kx_up 3; then
  echo "SKIP: network namespaces cannot be made here: $kx_why"
  exit 77
fi
fail() {
  echo "FAIL: $*"
  for f in "$d"/agent-*.log "$d/kilnd.log"; do echo "--- $f"; tail -25 "$f"; done
  exit 1
}

grace=12
port=$((30000 + $$ % 20000))
server="http://$(kx_addr 0):$port"
cat > "$d/pools.json" <<EOF
{"pools": [{"name": "default", "devices": 1},
  {"name": "hosts", "kind": "agents", "device_type": "cpu", "grace_s": $grace,
   "start_timeout_s": 60,
   "network": {"oob_tcp_if_include": "10.77.0.0/24", "btl_tcp_if_include": "10.77.0.0/24"}}]}
EOF
mkdir -p "$d/data"
admin=$("$kilnd" token create --tenant default --role admin --data-dir "$d/data" | tail -1)
"$kilnd" token create --role agent --data-dir "$d/data" | tail -1 > "$d/agent.token"
echo "kiln_wrong_agent_token" > "$d/bad.token"
start_kilnd() {
  (kx_spawn 0 kilnd "$kilnd" --listen "$(kx_addr 0):$port" --behind-tls-proxy --data-dir "$d/data" \
    --datasets-dir "$datasets" --trainer "$trainer" --pools "$d/pools.json" >> "$d/kilnd.log" 2>&1) &
  kilnd_pid=$!
  pids="$pids $!"
}
start_kilnd

api() { # METHOD PATH [BODY] -> body on stdout, status in $d/status
  kx_run 0 kilnd curl -s -o "$d/body" -w '%{http_code}' -X "$1" -H "Authorization: Bearer ${TOKEN:-$admin}" \
    -H 'Content-Type: application/json' ${3:+--data "$3"} "$server$2" > "$d/status" || true
  cat "$d/body"
}
for _ in $(seq 100); do
  [ "$(api GET /v1/agents > /dev/null; cat "$d/status")" = 200 ] && break
  sleep 0.2
done
[ "$(cat "$d/status")" = 200 ] || fail "kilnd did not come up"

start_agent() { # index name
  (kx_spawn "$1" "$2" "$agent_bin" --server "$server" --token-file "$d/agent.token" --name "$2" \
    --pool hosts --address "$(kx_addr "$1")" --work-dir "$d/work-$2" --cpus 1 --trainer "$trainer" \
    --mpirun "$mpirun" --poll-wait 2 >> "$d/agent-$2.log" 2>&1) &
  eval "agent_$(echo "$2" | tr -d -)=\$!"
  pids="$pids $!"
}
start_agent 1 host-a
start_agent 2 host-b
start_agent 3 host-c
py() { python3 -c "import json,sys; d=json.load(open('$d/body')); $1"; }
wait_for() { # 'PYTHON over d (the answer to GET $2)' path seconds
  t=$3
  while :; do
    api GET "$2" > /dev/null
    if python3 -c "import json,sys; d=json.load(open('$d/body')); sys.exit(0 if ($1) else 1)" 2>/dev/null; then return 0; fi
    t=$((t - 1))
    [ "$t" -gt 0 ] || fail "timed out waiting for $1 on $2: $(cat "$d/body")"
    sleep 1
  done
}

# Three agents register and appear with their devices.
wait_for "sorted(a['name'] for a in d['agents'] if a['state'] == 'ONLINE') == ['host-a','host-b','host-c']" /v1/agents 30
py "a = {x['name']: x for x in d['agents']}; assert all(a[n]['cpus'] == 1 and a[n]['gpus'] == [] and a[n]['hostname'] == n and a[n]['pool'] == 'hosts' for n in a), a" ||
  fail "the agents' devices: $(cat "$d/body")"
echo "ok: three agents registered with 1 core and no GPU each, under their own host names"

# A wrong agent token: 401, nothing changes.
api GET /v1/agents > "$d/before.json"
TOKEN=$(cat "$d/bad.token") api POST /v1/agents \
  '{"name":"host-x","hostname":"host-x","pool":"hosts","address":"10.77.0.9","cpus":1,"gpus":[],"version":"0"}' > /dev/null
[ "$(cat "$d/status")" = 401 ] || fail "a wrong agent token got $(cat "$d/status"), not 401"
api GET /v1/agents > "$d/after.json"
python3 -c "
import json; a=json.load(open('$d/before.json'))['agents']; b=json.load(open('$d/after.json'))['agents']
assert [x['name'] for x in a] == [x['name'] for x in b] and 'host-x' not in [x['name'] for x in b]" ||
  fail "a wrong token changed the agents"
echo "ok: a wrong agent token got 401 and changed nothing"

# The CNN on a small slice, 2 workers (one core each).
spec() { # name take extra
  cat <<EOF
{"display_name": "$1",
 "model": {"input_shape": [28, 28, 1], "layers": [
   {"type": "conv2d", "filters": 8, "kernel_size": 3, "padding": "same", "activation": "relu"},
   {"type": "max_pool2d", "pool_size": 2},
   {"type": "conv2d", "filters": 16, "kernel_size": 3, "padding": "same", "activation": "relu"},
   {"type": "max_pool2d", "pool_size": 2},
   {"type": "flatten"}, {"type": "dense", "units": 32, "activation": "relu"},
   {"type": "dense", "units": 10}]},
 "loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"],
 "dataset": {"name": "fashion-mnist", "validation": "none"},
 "pipeline": {"batch_size": 32, "take": $2, "num_parallel_calls": 0},
 "optimizer": {"type": "sgd", "learning_rate": 0.05, "momentum": 0.9},
 "epochs": 1, "seed": 7, "log_every_steps": 2, "checkpoint": {"every_steps": 4},
 "strategy": {"type": "multi_worker", "workers": 2},
 "resources": {"device_type": "cpu", "devices": 2, "pool": "hosts"}$3}
EOF
}
create() { # spec text -> job id
  api POST /v1/jobs "$1" > /dev/null
  [ "$(cat "$d/status")" = 200 ] || fail "create: $(cat "$d/status") $(cat "$d/body")"
  py "print(d['id'])"
}
state_of() { api GET "/v1/jobs/$1" > /dev/null; py "print(d['state'])"; }
wait_state() { # job state seconds
  t=$3
  while [ "$(state_of "$1")" != "$2" ]; do
    s=$(py "print(d['state'])")
    case "$s" in SUCCEEDED | FAILED | CANCELLED) [ "$s" = "$2" ] || fail "job $1 ended $s, not $2: $(cat "$d/body")" ;; esac
    t=$((t - 1))
    [ "$t" -gt 0 ] || fail "job $1 is $(py "print(d['state'])") after the wait, not $2"
    sleep 1
  done
}
# The namespaces where a process named $1 runs.
where() {
  for i in 1 2 3; do
    for p in $(kx_pids "$i"); do
      if [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$1" ]; then echo "host-$(echo "abc" | cut -c"$i")"; break; fi
    done
  done | sort -u | tr '\n' ' '
}
# Processes of jobs (not the agents) in the hosts' namespaces.
job_processes() {
  for i in 1 2 3; do
    for p in $(kx_pids "$i"); do
      c=$(cat "/proc/$p/comm" 2>/dev/null || true)
      case "$c" in kiln-train | orted | mpirun | prterun) echo "$i:$p:$c" ;; esac
    done
  done
}

# 1. 2 workers on 2 hosts against 2 workers on one host. Where kiln-train
# runs is sampled every 0.1 s beside the state polls: its ranks live about
# 2 s, which polls of the API on a loaded machine could step over.
job=$(create "$(spec mh-loss 512 '')")
(while :; do
  where kiln-train
  echo
  sleep 0.1
done > "$d/rank-samples") &
sampler=$!
pids="$pids $sampler"
for _ in $(seq 120); do
  s=$(state_of "$job")
  case "$s" in SUCCEEDED | FAILED | CANCELLED) break ;; esac
  sleep 0.5
done
kill "$sampler" 2> /dev/null || true
wait "$sampler" 2> /dev/null || true
[ "$s" = SUCCEEDED ] || fail "the 2-host job ended $s: $(cat "$d/body")"
tr ' ' '\n' < "$d/rank-samples" | sort -u | grep . > "$d/rank-hosts" || true
[ "$(wc -l < "$d/rank-hosts")" -ge 2 ] || fail "kiln-train ran in $(cat "$d/rank-hosts") only, not on 2 hosts"
echo "ok: the 2-worker job ran a rank on each of $(tr '\n' ' ' < "$d/rank-hosts")"
# Each of them fetched the data set from kilnd into its cache, by content hash.
for h in $(cat "$d/rank-hosts"); do
  ls -d "$d/work-$h"/datasets/*/fashion-mnist > /dev/null 2>&1 || fail "$h has no cached copy of the data set"
done
echo "ok: each of those hosts fetched the data set from kilnd into its cache"
spec mh-loss 512 '' | sed 's/, "pool": "hosts"//' > "$d/one-host.json"
mkdir -p "$d/one"
"$mpirun" --allow-run-as-root --oversubscribe -np 2 "$trainer" --spec "$d/one-host.json" --json \
  --data-dir "$datasets" --checkpoint-dir "$d/one" > "$d/one.out" 2> "$d/one.err" ||
  fail "2 workers on one host: $(tail -5 "$d/one.err")"
last_two=$(ls "$d/data/jobs/$job/checkpoints/"*.safetensors | sort | tail -1)
last_one=$(ls "$d/one/"*.safetensors | sort | tail -1)
python3 - "$last_two" "$last_one" "$d/one.out" "$d/data/jobs/$job/train.log" <<'PY' || fail "the 2-host job does not match one host"
import array, json, struct, sys
def load(path):
    with open(path, 'rb') as f:
        n = struct.unpack('<Q', f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return {k: array.array('f', data[t['data_offsets'][0]:t['data_offsets'][1]])
            for k, t in header.items() if k != '__metadata__'}
a, b = load(sys.argv[1]), load(sys.argv[2])
assert a.keys() == b.keys() and a, (sorted(a), sorted(b))
worst = max(max(abs(x - y) for x, y in zip(a[k], b[k])) / max(abs(y) for y in b[k]) for k in a)
print(f"worst tensor-relative difference, 2 hosts against 1: {worst:.3g}")
assert worst <= 1e-5, worst
PY
one_loss=$(grep -o '"epoch_loss":[0-9.e-]*' "$d/one.out" | tail -1 | cut -d: -f2)
api GET "/v1/jobs/$job/metrics?name=epoch_loss" > /dev/null
two_loss=$(py "
def walk(x):
    if isinstance(x, dict):
        if x.get('name') == 'epoch_loss' and 'value' in x: yield x['value']
        for v in x.values(): yield from walk(v)
    elif isinstance(x, list):
        for v in x: yield from walk(v)
v = list(walk(d)); print(v[-1] if v else '')")
echo "epoch loss: 2 hosts $two_loss, one host $one_loss"
[ -n "$two_loss" ] && [ -n "$one_loss" ] || fail "no epoch loss to compare: $(head -c 300 "$d/body")"
python3 -c "import sys; a,b=$two_loss,$one_loss; sys.exit(0 if abs(a-b) <= 1e-5*max(1,abs(b)) else 1)" ||
  fail "epoch loss $two_loss on 2 hosts, $one_loss on one"
echo "ok: 2 workers on 2 hosts trained to the weights and epoch loss of 2 workers on one host (1e-5)"

# 2. Cancel: nothing of the job is left in any namespace within 10 s.
job=$(create "$(spec mh-cancel 60000 '')")
for _ in $(seq 120); do
  [ "$(where kiln-train | wc -w)" -ge 2 ] && break
  sleep 0.5
done
[ "$(where kiln-train | wc -w)" -ge 2 ] || fail "the job to cancel never ran on 2 hosts ($(state_of "$job"))"
api POST "/v1/jobs/$job:cancel" '{}' > /dev/null
t0=$(date +%s)
while [ -n "$(job_processes)" ]; do
  [ $(($(date +%s) - t0)) -le 10 ] || fail "10 s after cancel these still run: $(job_processes)"
  sleep 0.5
done
echo "ok: cancel left no process of the job in any namespace ($(($(date +%s) - t0)) s)"
wait_state "$job" CANCELLED 20

# 3. A link down for less than the grace window costs nothing.
job=$(create "$(spec mh-blip 4096 '')")
for _ in $(seq 120); do
  [ "$(where kiln-train | wc -w)" -ge 2 ] && break
  sleep 0.5
done
victim=$(where kiln-train | cut -d' ' -f2)
i=$(case "$victim" in host-a) echo 1 ;; host-b) echo 2 ;; *) echo 3 ;; esac)
kx_link "$i" down
sleep $((grace / 3))
kx_link "$i" up
wait_state "$job" SUCCEEDED 240
py "assert d.get('infra_restarts', 0) == 0 and d.get('restarts', 0) == 0, d" ||
  fail "a short link loss restarted the job: $(cat "$d/body")"
echo "ok: $victim's link down for $((grace / 3)) s (grace $grace s) cost nothing"

# Waits until job $1 has a checkpoint and ranks on two hosts. The jobs it
# waits for take 32,768 examples (1,024 steps of 32): with 8,192 a host
# with full-rate 512-bit FMAs finished one before a poll saw it running.
running_with_checkpoint() {
  for _ in $(seq 240); do
    api GET "/v1/jobs/$1/checkpoints" > /dev/null
    n=$(py "print(len(d.get('checkpoints', [])))" 2>/dev/null || echo 0)
    [ "$n" -ge 1 ] && [ "$(where kiln-train | wc -w)" -ge 2 ] && return 0
    sleep 0.25
  done
  fail "job $1 never ran on two hosts with a checkpoint ($(state_of "$1"))"
}

# 4. SIGKILL of an agent mid-job: requeued, resumed from its checkpoint on the other hosts.
job=$(create "$(spec mh-kill 32768 '')")
running_with_checkpoint "$job"
victim=$(where kiln-train | cut -d' ' -f1)
case "$victim" in host-a) kill -9 "$agent_hosta" ;; host-b) kill -9 "$agent_hostb" ;; host-c) kill -9 "$agent_hostc" ;; *) fail "no rank to kill ($(state_of "$job"))" ;; esac
wait_state "$job" SUCCEEDED 300
py "assert d.get('infra_restarts', 0) >= 1 and d.get('restarts', 0) == 0, d" ||
  fail "after SIGKILL of $victim's agent: $(cat "$d/body")"
api GET "/v1/jobs/$job/events" > /dev/null
py "ev=d.get('events', []); assert any(e.get('reason') == 'AGENT_LOST' for e in ev), ev" ||
  fail "no AGENT_LOST event: $(cat "$d/body")"
grep -q "resum" "$d/data/jobs/$job/train.log" 2>/dev/null || api GET "/v1/jobs/$job/events" | grep -q "resuming from step" ||
  fail "the requeued job did not resume from its checkpoint"
echo "ok: SIGKILL of $victim's agent requeued the job (AGENT_LOST), which resumed on the other hosts and succeeded"
case "$victim" in host-a) start_agent 1 host-a ;; host-b) start_agent 2 host-b ;; host-c) start_agent 3 host-c ;; esac
wait_for "sum(a['state'] == 'ONLINE' for a in d['agents']) == 3" /v1/agents 30

# 5. A link down longer than the grace window fails over cleanly.
job=$(create "$(spec mh-cut 32768 '')")
running_with_checkpoint "$job"
victim=$(where kiln-train | cut -d' ' -f1)
i=$(case "$victim" in host-a) echo 1 ;; host-b) echo 2 ;; *) echo 3 ;; esac)
kx_link "$i" down
wait_state "$job" SUCCEEDED 300
kx_link "$i" up
py "assert d.get('infra_restarts', 0) >= 1, d" || fail "the cut did not fail over: $(cat "$d/body")"
wait_for "all(a['state'] == 'ONLINE' for a in d['agents'])" /v1/agents 60
echo "ok: $victim's link down past the grace failed over, the job succeeded, and the agent came back"
# 6. kilnd restarts: the agents, cut off meanwhile, reconnect and run the next job.
registrations() { for h in host-a host-b host-c; do grep -c 'msg="registered"' "$d/agent-$h.log"; done | tr '\n' ' '; }
before=$(registrations)
kill -TERM "$kilnd_pid"
wait "$kilnd_pid" 2>/dev/null || true
sleep 3
start_kilnd
for _ in $(seq 100); do
  [ "$(api GET /v1/agents > /dev/null; cat "$d/status")" = 200 ] && break
  sleep 0.2
done
job=$(create "$(spec mh-after-restart 512 '')")
wait_state "$job" SUCCEEDED 120
after=$(registrations)
python3 -c "import sys; b, a = '$before'.split(), '$after'.split(); sys.exit(0 if all(int(y) > int(x) for x, y in zip(b, a)) else 1)" ||
  fail "not every agent registered again after kilnd's restart (registrations $before, then $after)"
echo "ok: after kilnd restarted the agents registered again and ran the next job"
echo "all multi-host checks passed"
