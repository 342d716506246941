#!/usr/bin/env bash
# The service benchmark, one run on loopback: GET /v1/jobs/{id} under wrk
# against nginx serving the same JSON as a static file, job creation per
# second (in the store alone and through POST /v1/jobs), metric ingestion
# per second, and one scheduling pass over 10,000 queued jobs. Needs a build
# (cmake --build build) and wrk + nginx-light.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
tmp=$(mktemp -d)
. bench/kilnd.sh
nginx_conf="$tmp/nginx.conf"
cleanup() {
  stop_kilnd
  [ -f "$tmp/nginx.pid" ] && nginx -c "$nginx_conf" -s stop 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

echo "== store"
"$build/bench/bench_service" store "$tmp" examples/fmnist-mlp.json | tee "$tmp/store.out"

echo "== one scheduling pass (placement over the queue, then reading it from the store)"
"$build/bench/kiln-bench-sched-pass"

echo "== kilnd (jobs queue behind one that never ends, so nothing trains)"
printf '#!/bin/sh\nexec sleep 600\n' > "$tmp/trainer.sh"
chmod +x "$tmp/trainer.sh"
start_kilnd "$tmp/trainer.sh"
"$build/bench/bench_service" http "$url" "$token" examples/fmnist-mlp.json 2000 | tee "$tmp/http.out"

id=$(curl -s -H "Authorization: Bearer $token" -X POST --data-binary @examples/fmnist-mlp.json \
  "$url/v1/jobs" | sed 's/.*"id":"\([^"]*\)".*/\1/')
mkdir -p "$tmp/www"
curl -s -H "Authorization: Bearer $token" "$url/v1/jobs/$id" > "$tmp/www/job.json"
cat > "$nginx_conf" <<CONF
worker_processes 2;
pid $tmp/nginx.pid;
error_log $tmp/nginx.err;
events { worker_connections 1024; }
http {
  access_log off;
  server {
    listen 127.0.0.1:18089;
    root $tmp/www;
    location / { default_type application/json; }
  }
}
CONF
nginx -c "$nginx_conf"
sleep 0.5

echo "== GET /v1/jobs/{id}: kilnd vs nginx (wrk -t2 -c32 -d5s)"
kilnd_rps=$(wrk -t2 -c32 -d5s -H "Authorization: Bearer $token" "$url/v1/jobs/$id" |
  awk '/Requests\/sec/ {print $2}')
nginx_rps=$(wrk -t2 -c32 -d5s "http://127.0.0.1:18089/job.json" | awk '/Requests\/sec/ {print $2}')
echo "kilnd_get_rps=$kilnd_rps"
echo "nginx_get_rps=$nginx_rps"
awk -v k="$kilnd_rps" -v n="$nginx_rps" 'BEGIN { printf "kilnd_over_nginx=%.2f\n", k / n }'
