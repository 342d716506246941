#!/bin/sh
# kiln-agent against a stand-in for kilnd's side of the agent contract
# (stand_in_kilnd.py), with a stand-in trainer, three agents each in a
# network namespace of its own with its own host name (netns.sh): they
# register with their cores and GPUs; a start fetches the data set and
# runs pinned to its cores with the command's variables, its progress
# arrives in order with each checkpoint uploaded (state, weights) before
# the line naming it, whose path is kilnd's; a start delivered twice runs
# once; signal TERM stops it (exit 6 posted); drop kills it and posts
# nothing; resume fetches the checkpoint and its state; a LOST agent
# registers again; a multi-host start runs mpirun on rank 0's host, whose
# daemon for the other host goes through `kiln-agent rsh` and kilnd's
# relay, each rank on its own host; `kiln-agent job` streams the same way;
# a wrong token stops the agent (exit 2) and registers nothing; SIGTERM
# stops an agent's jobs cleanly. Without namespaces (not root, no
# iproute2) the agents run on loopback, the relay part skipped, and the
# script says so.
# Usage: agent_on_stand_in.sh KILN_AGENT [MPIRUN [GPU_STANDIN]]
# (GPU_STANDIN: the tests' host-memory CUDA module: an agent opening it
# through KILN_CUDA_MODULE reports its 2 GPUs, as kiln-train sees them.)
set -eu
agent_bin="$1"
mpirun="${2:-}"
standin="${3:-}"
here=$(cd "$(dirname "$0")" && pwd)
trainer="$here/stand_in_agent_trainer.sh"
. "$here/netns.sh"
kx_scratch
fail() {
  echo "FAIL: $*"
  for f in "$d"/agent-*.log; do echo "--- $f"; tail -30 "$f"; done
  exit 1
}

mkdir -p "$d/out" "$d/kilnd"
echo "kiln_g_agenttoken" > "$d/token"
echo "kiln_g_wrongtoken" > "$d/bad-token"
port=$((20000 + $$ % 20000))
if kx_up 3; then
  netns=1
  srv_addr=$(kx_addr 0)
  in0() { kx_run 0 kilnd "$@"; }
  host() { kx_run "$@"; }
  spawn() { kx_spawn "$@"; }
  network=$(printf '"network":{"oob_tcp_if_include":"10.77.0.0/24","btl_tcp_if_include":"10.77.0.0/24"}')
else
  netns=0
  echo "SKIP namespaces: $kx_why; the agents run on loopback (the mpirun relay part is skipped)"
  srv_addr=127.0.0.1
  in0() { "$@"; }
  host() {
    shift 2
    "$@"
  }
  spawn() {
    shift 2
    exec "$@"
  }
fi
server="http://$srv_addr:$port"
in0 python3 "$here/stand_in_kilnd.py" "$srv_addr" "$port" kiln_g_agenttoken "$d/kilnd" \
  > "$d/kilnd.log" 2>&1 &
pids="$pids $!"
for _ in $(seq 50); do grep -q listening "$d/kilnd.log" && break; sleep 0.1; done
grep -q listening "$d/kilnd.log" || fail "the stand-in kilnd did not start: $(cat "$d/kilnd.log")"

call() { in0 curl -sf -X POST -H 'Content-Type: application/json' -d "$2" "$server/test/$1"; }
state() { in0 curl -sf "$server/test/state"; }
# check 'PYTHON EXPR over s (the state)' [seconds]: waits until it is true.
check() {
  t=${2:-20}
  while :; do
    if state | python3 -c "import json,sys; s=json.load(sys.stdin); sys.exit(0 if ($1) else 1)" 2>/dev/null; then
      return 0
    fi
    t=$((t - 1))
    [ "$t" -gt 0 ] || fail "timed out waiting for: $1"
    sleep 1
  done
}
# The events of one kind for one allocation.
ev() { echo "[e for e in s['events'] if e[0]=='$1' and e[1]=='$2']"; }

start_agent() { # index name [token file]
  spawn "$1" "$2" env STANDIN_OUT="$d/out" "$agent_bin" --server "$server" --token-file "${3:-$d/token}" \
    --name "$2" --pool hosts --address "$(kx_addr "$1")" --work-dir "$d/work-$2" \
    --trainer "$trainer" ${mpirun:+--mpirun "$mpirun"} --poll-wait 5 > "$d/agent-$2.log" 2>&1 &
  pids="$pids $!"
  eval "agent_pid_$(echo "$2" | tr -d -)=\$!"
}
start_agent 1 host-a
start_agent 2 host-b
start_agent 3 host-c

# Three agents register with their cores and no GPU (this build's CUDA module has none).
cores=$(python3 -c "import os; print(len(os.sched_getaffinity(0)))")
check "all(n in s['agents'] and s['agents'][n]['body']['cpus'] == $cores and s['agents'][n]['body']['gpus'] == [] and s['agents'][n]['body']['pool'] == 'hosts' for n in ('host-a','host-b','host-c'))"
check "s['agents']['host-b']['body']['address'] == '$(kx_addr 2)' and s['agents']['host-b']['body']['hostname'] == ('host-b' if $netns else s['agents']['host-b']['body']['hostname'])"
echo "ok: three agents registered with $cores cores each"

# GPUs as kiln-train sees them: through the CUDA module (here the stand-in's two).
if [ -n "$standin" ] && [ -f "$standin" ]; then
  (spawn 3 host-g env KILN_CUDA_MODULE="$standin" KILN_HOST_GPUS=2 "$agent_bin" --server "$server" \
    --token-file "$d/token" --name host-g --pool hosts --address "$(kx_addr 3)" \
    --work-dir "$d/work-host-g" --poll-wait 60 > "$d/agent-host-g.log" 2>&1) &
  pids="$pids $!"
  echo $! > "$d/host-g.pid"
  check "'host-g' in s['agents'] and s['agents']['host-g']['body']['gpus'] == [{'index': 0, 'name': 'host stand-in 0'}, {'index': 1, 'name': 'host stand-in 1'}]"
  # Its polls wait at most the heartbeat_s kilnd answered (5 here), not its --poll-wait 60.
  check "s['agents']['host-g'].get('last_wait') == 5"
  kill "$(cat "$d/host-g.pid")"
  wait "$(cat "$d/host-g.pid")" || true
  echo "ok: an agent reports the GPUs of its CUDA module (2 of the stand-in)"
else
  echo "SKIP GPUs: no CUDA module stand-in given"
fi

alloc() { call alloc "{\"alloc\":\"$1\",\"token\":\"kiln_a_$1\"${2:-}}" > /dev/null; }
start_cmd() { # alloc extra-json
  echo "{\"kind\":\"start\",\"alloc\":\"$1\",\"token\":\"kiln_a_$1\",\"job\":\"job-$1\",\"attempt\":1,\"spec\":{\"display_name\":\"$1\"},\"dataset\":{\"name\":\"toy\",\"sha256\":\"\"},\"resume\":false,\"cores\":[0],\"gpus\":[],\"mpi\":null$2}"
}
queue() { call queue "{\"agent\":\"$1\",\"command\":$2}"; }

# A start: data set, pinning, variables, progress in order, checkpoint first.
alloc al-1
queue host-a "$(start_cmd al-1 ',"env":{"KILN_EXTRA":"from-kilnd"}')" > /dev/null
check "[e for e in s['events'] if e[0]=='exit' and e[1]=='al-1']"
check "s['agents']['host-a']['done'].get('1', {}).get('ok') is True"
state > "$d/s1.json"
python3 - "$d/s1.json" "$d/out/$(if [ $netns = 1 ]; then echo host-a; else hostname; fi)-0" <<'PY' || fail "start al-1"
import json, sys
s = json.load(open(sys.argv[1]))
ev = [e for e in s["events"] if len(e) > 1 and e[1] == "al-1"]
kinds = [e[0] for e in ev]
lines = [json.loads(e[2]) for e in ev if e[0] == "progress"]
assert [l.get("step") for l in lines if "step" in l] == [1, 2, 3, 4, 5, 6], lines
ck = [l for l in lines if "checkpoint" in l]
assert len(ck) == 1 and ck[0]["checkpoint"]["path"].endswith("/al-1/ckpt-3.safetensors"), ck
ck_at = next(i for i, e in enumerate(ev) if e[0] == "progress" and "checkpoint" in e[2])
uploads = [(i, e[3]) for i, e in enumerate(ev) if e[0] == "checkpoint"]
assert [u[1] for u in uploads] == ["state", "weights"] and all(i < ck_at for i, _ in uploads), ev
step3 = next(i for i, e in enumerate(ev) if e[0] == "progress" and '"step":3' in e[2])
step4 = next(i for i, e in enumerate(ev) if e[0] == "progress" and '"step":4' in e[2])
assert step3 < ck_at < step4, ev
assert not any("a log line" in e[2] for e in ev if e[0] == "progress")
assert [e[2] for e in ev if e[0] == "dataset"] == ["HEAD", "GET"], kinds
exits = [e[2] for e in ev if e[0] == "exit"]
assert len(exits) == 1 and exits[0]["exit_code"] == 0, exits
out = dict(l.rstrip("\n").split("=", 1) for l in open(sys.argv[2]))
assert out["data"] == "stand-in data set", out
assert out["uploads_same"] == "yes", out  # an uploaded set is read from --uploads-dir
assert out["affinity"] == "0" and out["devices"] == "cpu:0" and out["extra"] == "from-kilnd", out
assert json.loads(out["spec"]) == {"display_name": "al-1"}, out
print("ok: start ran pinned to core 0 with the data set; progress in order, checkpoint uploaded first")
PY

# Delivered twice (same allocation, a later seq): acknowledged, not run again.
queue host-a "$(start_cmd al-1 '')" > /dev/null
check "s['agents']['host-a']['done'].get('2', {}).get('ok') is True"
sleep 1
check "len($(ev exit al-1)) == 1 and len($(ev dataset al-1)) == 2"
echo "ok: a start delivered twice ran once"

# A data set archive that is not what its hash says: nothing runs, the exit says why.
call alloc '{"alloc":"al-0","token":"kiln_a_al-0","corrupt":true}' > /dev/null
queue host-b "$(start_cmd al-0 '')" > /dev/null
check "[e for e in $(ev exit al-0) if e[2].get('exit_code') == 127 and 'SHA-256' in e[2].get('message', '')]"
[ ! -e "$d/work-host-b/jobs/al-0/train.log" ] || fail "al-0's trainer ran on a corrupt data set"
echo "ok: a data set archive that does not match its hash is refused, and the exit says so"

# signal TERM: the group stops, exit 6 posted.
alloc al-2
queue host-b "$(start_cmd al-2 ',"env":{"STANDIN_SLEEP":"120"}')" > /dev/null
check "len($(ev progress al-2)) >= 7"
queue host-b '{"kind":"signal","alloc":"al-2","signal":"TERM"}' > /dev/null
check "[e for e in $(ev exit al-2) if e[2].get('exit_code') == 6]" 10
echo "ok: signal TERM stopped the job (exit 6 posted)"

# drop: killed, no exit posted.
alloc al-3
queue host-c "$(start_cmd al-3 ',"env":{"STANDIN_SLEEP":"120"}')" > /dev/null
check "len($(ev progress al-3)) >= 7"
queue host-c '{"kind":"drop","alloc":"al-3"}' > /dev/null
check "s['agents']['host-c']['done'].get('2', {}).get('ok') is True"
sleep 3
if ps -eo args | grep -v grep | grep -q "work-host-c/jobs/al-3/spec.json"; then fail "al-3 still runs after drop"; fi
check "$(ev exit al-3) == []"
echo "ok: drop killed the job and posted no exit"

# resume: the checkpoint and its training state arrive before the trainer starts.
w=$(ls "$d"/kilnd/al-1/ckpt-3.safetensors)
call alloc "{\"alloc\":\"al-4\",\"token\":\"kiln_a_al-4\",\"resume\":[\"$w\",\"${w%.safetensors}.state\",3]}" > /dev/null
queue host-b "$(start_cmd al-4 '' | sed 's/"resume":false/"resume":true/')" > /dev/null
check "[e for e in $(ev exit al-4) if e[2].get('exit_code') == 0]"
out_b="$d/out/$(if [ $netns = 1 ]; then echo host-b; else hostname; fi)-0"
grep -q '^resume=.*/resume.safetensors$' "$out_b" || fail "al-4 did not resume: $(cat "$out_b")"
grep -q '^resume_state=state at 3$' "$out_b" || fail "al-4 lacks the training state: $(cat "$out_b")"
echo "ok: resume fetched the checkpoint and its training state"

# LOST: the agent registers again.
call lose '{"agent":"host-c"}' > /dev/null
check "s['agents']['host-c']['registrations'] >= 2 and s['agents']['host-c']['state'] == 'ONLINE'"
echo "ok: a LOST agent registered again"

# A multi-host start: mpirun on rank 0's host, the other host's daemon relayed.
if [ $netns = 1 ] && [ -n "$mpirun" ]; then
  # host-b's copy of the resume checkpoint takes 4 s to arrive, rank 0's
  # host gets its own at once: host-b's ranks must not start before it has.
  w=$(ls "$d"/kilnd/al-1/ckpt-3.safetensors)
  call alloc "{\"alloc\":\"al-5\",\"token\":\"kiln_a_al-5\",\"resume\":[\"$w\",\"${w%.safetensors}.state\",3],\"slow_resume\":[4]}" > /dev/null
  mpi="\"mpi\":{\"np\":2,\"hosts\":[{\"name\":\"host-a\",\"address\":\"$(kx_addr 1)\",\"slots\":1},{\"name\":\"host-b\",\"address\":\"$(kx_addr 2)\",\"slots\":1}],$network}"
  queue host-b "$(start_cmd al-5 '' | sed -e "s|\"mpi\":null|$mpi|" -e 's/"resume":false/"resume":true/')" > /dev/null
  check "len($(ev resume al-5)) >= 1"
  queue host-a "$(start_cmd al-5 '' | sed -e "s|\"mpi\":null|$mpi|" -e 's/"resume":false/"resume":true/')" > /dev/null
  check "[e for e in $(ev exit al-5)]" 60
  state > "$d/s5.json"
  python3 - "$d/s5.json" "$d/out" <<'PY' || fail "multi-host al-5"
import json, sys
s = json.load(open(sys.argv[1]))
ev = [e for e in s["events"] if len(e) > 1 and e[1] == "al-5"]
exits = [e[2] for e in ev if e[0] == "exit"]
assert len(exits) == 1 and exits[0]["exit_code"] == 0, exits
relays = [e for e in ev if e[0] == "relay"]
assert [r[2] for r in relays] == ["host-b"] and relays[0][3] == "orted", relays
done = [d for d in s["agents"]["host-b"]["done"].values() if "exit_code" in d]
assert done and done[-1]["exit_code"] == 0, s["agents"]["host-b"]["done"]
lines = [json.loads(e[2]) for e in ev if e[0] == "progress"]
assert [l.get("step") for l in lines if "step" in l] == [1, 2, 3, 4, 5, 6], lines
ranks = {}
for name in ("host-a-0", "host-b-1"):
    out = dict(l.rstrip("\n").split("=", 1) for l in open(f"{sys.argv[2]}/{name}"))
    ranks[name] = out
    assert out["host"] == name[:6], out
    assert out["data"] == "stand-in data set", out
print("ok: 2 ranks on 2 hosts through the relay, each on its own host:",
      {k: v["host"] for k, v in ranks.items()})
PY
  prepared=$(grep -n 'alloc=al-5 .*prepared for rank 0' "$d/agent-host-b.log" | cut -d: -f1)
  daemon=$(grep -n 'alloc=al-5 msg="relay daemon started"' "$d/agent-host-b.log" | cut -d: -f1)
  [ -n "$prepared" ] && [ -n "$daemon" ] && [ "$prepared" -lt "$daemon" ] ||
    fail "host-b started al-5's daemon (log line ${daemon:-none}) before its resume checkpoint was in place (${prepared:-never})"
  echo "ok: the relayed daemon waited for its host's resume checkpoint"
else
  echo "SKIP multi-host relay: $( [ $netns = 1 ] && echo 'no mpirun given' || echo 'no namespaces')"
fi

# A multi_worker job on one host (mpi null): mpirun -np 2 there, as kilnd's runner does.
if [ -n "$mpirun" ]; then
  alloc al-8
  queue host-a "$(start_cmd al-8 '' | sed 's|"spec":{"display_name":"al-8"}|"spec":{"display_name":"al-8","strategy":{"type":"multi_worker","workers":2}}|')" > /dev/null
  check "[e for e in $(ev exit al-8) if e[2].get('exit_code') == 0] and len($(ev progress al-8)) == 7" 60
  ha=$(if [ $netns = 1 ]; then echo host-a; else hostname; fi)
  grep -q '^rank=1$' "$d/out/$ha-1" || fail "al-8 had no rank 1 on $ha"
  echo "ok: multi_worker on one host ran mpirun -np 2 there"
fi

# kiln-agent job: one allocation without registration.
alloc al-6
echo kiln_a_al-6 > "$d/al6.token"
mkdir -p "$d/job-ck"
host 3 host-c env STANDIN_OUT="$d/out" "$agent_bin" job --server "$server" --alloc al-6 \
  --token-file "$d/al6.token" --work-dir "$d/work-job" -- \
  "$trainer" --progress-fd 3 --checkpoint-dir "$d/job-ck" > "$d/agent-job.log" 2>&1 ||
  fail "kiln-agent job exited $?"
check "[e for e in $(ev exit al-6) if e[2].get('exit_code') == 0] and len($(ev progress al-6)) == 7 and len($(ev checkpoint al-6)) == 2"
echo "ok: kiln-agent job streamed progress, checkpoint and exit"

# kiln-agent job on SIGTERM (scancel): the command stops (exit 6), which is
# posted, and kiln-agent job exits as it did.
alloc al-9
echo kiln_a_al-9 > "$d/al9.token"
(spawn 3 host-c env STANDIN_OUT="$d/out" STANDIN_SLEEP=120 "$agent_bin" job --server "$server" \
  --alloc al-9 --token-file "$d/al9.token" --work-dir "$d/work-job" -- \
  "$trainer" --progress-fd 3 --checkpoint-dir "$d/job-ck" > "$d/agent-job9.log" 2>&1) &
job_pid=$!
check "len($(ev progress al-9)) >= 7"
kill -TERM "$job_pid"
set +e
wait "$job_pid"
rc=$?
set -e
[ "$rc" = 6 ] || fail "kiln-agent job exited $rc after SIGTERM, not 6 (its command's)"
check "[e for e in $(ev exit al-9) if e[2].get('exit_code') == 6]"
echo "ok: SIGTERM to kiln-agent job stopped its command (exit 6 posted and returned)"

# A wrong token: kilnd says 401, the agent stops with 2 and nothing registers.
set +e
host 3 host-d "$agent_bin" --server "$server" --token-file "$d/bad-token" --name host-d \
  --pool hosts --address "$(kx_addr 3)" --work-dir "$d/work-d" > "$d/agent-host-d.log" 2>&1
rc=$?
set -e
[ "$rc" = 2 ] || fail "an agent with a wrong token exited $rc, not 2"
check "'host-d' not in s['agents'] and [e for e in s['events'] if e[0] == 'unauthorized']"
grep -q "HTTP 401" "$d/agent-host-d.log" || fail "the agent's log does not say 401"
echo "ok: a wrong token got 401, the agent stopped (2), nothing registered"

# SIGTERM: the agent stops its job (exit 6 posted) and ends.
alloc al-7
queue host-c "$(start_cmd al-7 ',"env":{"STANDIN_SLEEP":"120"}')" > /dev/null
check "len($(ev progress al-7)) >= 7"
kill -TERM "$agent_pid_hostc"
check "[e for e in $(ev exit al-7) if e[2].get('exit_code') == 6]" 15
for _ in $(seq 20); do kill -0 "$agent_pid_hostc" 2>/dev/null || break; sleep 0.5; done
if kill -0 "$agent_pid_hostc" 2>/dev/null; then fail "the agent did not end on SIGTERM"; fi
echo "ok: SIGTERM stopped the agent's job (exit 6 posted) and the agent"
echo "all kiln-agent checks passed"
