# kilnd.sh — sourced by the service benchmarks: start_kilnd TRAINER starts
# "$build/server/kilnd" on a free loopback port with its data in "$tmp/data"
# and TRAINER as its trainer, waits until it serves, and sets url, token
# and kilnd_pid; stop_kilnd stops it. The caller sets build and tmp.
start_kilnd() {
  "$build/server/kilnd" --listen 127.0.0.1:0 --data-dir "$tmp/data" --port-file "$tmp/port" \
    --trainer "$1" 2> "$tmp/kilnd.log" &
  kilnd_pid=$!
  for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.1; done
  url="http://127.0.0.1:$(cat "$tmp/port")"
  token=$(cat "$tmp/data/admin.token")
}

stop_kilnd() {
  [ -n "${kilnd_pid:-}" ] && kill "$kilnd_pid" 2>/dev/null && wait "$kilnd_pid" 2>/dev/null || true
}
