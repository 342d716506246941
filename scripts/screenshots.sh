#!/usr/bin/env bash
# Refreshes docs/screenshots/*.png: starts a kilnd from ./build (kilnd and
# kiln-train built) on a scratch data directory with one device, trains
# three small real jobs and a small grid search, and photographs the
# dashboard in headless Chromium (tests/browser/screenshots.js). Needs node
# and chromium, as the browser tests do.
# Usage: bash scripts/screenshots.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
for f in "$build/server/kilnd" "$build/worker/kiln-train"; do
  [ -x "$f" ] || { echo "screenshots: $f is missing; build kilnd and kiln-train first" >&2; exit 1; }
done
data="$(mktemp -d /tmp/kiln-screenshots-XXXXXX)"
echo '{"pools": [{"name": "default", "devices": 1}]}' >"$data/pools.json"
"$build/server/kilnd" --listen 127.0.0.1:0 --data-dir "$data" --port-file "$data/port" \
  --trainer "$build/worker/kiln-train" --pools "$data/pools.json" 2>"$data/kilnd.log" &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 100); do [ -s "$data/port" ] && [ -s "$data/admin.token" ] && break; sleep 0.1; done
mkdir -p docs/screenshots
node tests/browser/screenshots.js "http://127.0.0.1:$(cat "$data/port")" \
  "$(cat "$data/admin.token")" docs/screenshots
ls -l docs/screenshots
