#!/usr/bin/env bash
# The dashboard's job page on a job with 100,000 metric points: a stand-in
# trainer reports them through kilnd's real ingestion path (49,900 steps of
# loss and accuracy, 50 epochs of epoch and validation metrics), then
# headless Chromium loads the job page several times and reports the time
# from navigation to both charts drawn. Needs a build (cmake --build build),
# node and chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
runs=${RUNS:-7}
tmp=$(mktemp -d)
. bench/kilnd.sh
cleanup() {
  stop_kilnd
  rm -rf "$tmp"
}
trap cleanup EXIT

# Speaks kiln-train's progress protocol on fd 3.
cat > "$tmp/trainer.sh" <<'TRAINER'
#!/bin/sh
exec awk 'BEGIN {
  srand(42); steps_per_epoch = 998;
  for (step = 1; step <= 49900; step++) {
    epoch = int((step - 1) / steps_per_epoch) + 1;
    loss = 2.0 * exp(-step / 6000) + 0.25 + 0.05 * rand();
    acc = 0.93 - 0.8 * exp(-step / 5000) - 0.03 * rand();
    printf "{\"step\":%d,\"epoch\":%d,\"metrics\":{\"loss\":%.5f,\"accuracy\":%.5f}}\n", step, epoch, loss, acc;
    if (step % steps_per_epoch == 0)
      printf "{\"step\":%d,\"epoch\":%d,\"metrics\":{\"epoch_loss\":%.5f,\"epoch_accuracy\":%.5f,\"val_loss\":%.5f,\"val_accuracy\":%.5f}}\n", step, epoch, loss, acc, loss + 0.05, acc - 0.02;
  }
}' >&3
TRAINER
chmod +x "$tmp/trainer.sh"
start_kilnd "$tmp/trainer.sh"
auth="Authorization: Bearer $token"

id=$(curl -s -H "$auth" -X POST --data-binary @examples/fmnist-mlp.json "$url/v1/jobs" |
  sed 's/.*"id":"\([^"]*\)".*/\1/')
state=$(curl -s -H "$auth" -X POST "$url/v1/jobs/$id:wait?timeout=300s" |
  sed 's/.*"state":"\([^"]*\)".*/\1/')
points=$(curl -s -H "$auth" "$url/v1/jobs/$id/metrics" | grep -o '"seq"' | wc -l)
echo "job=$id state=$state metric_points=$points"
[ "$state" = SUCCEEDED ] && [ "$points" -eq 100000 ] || {
  echo "dashboard bench: the job did not end with 100,000 points" >&2
  exit 1
}

echo "== the API calls behind the page (curl, one each)"
for path in "/v1/jobs/$id" "/v1/jobs/$id/metrics?max_points=1000"; do
  curl -s -o /dev/null -H "$auth" -w "GET $path: %{time_total}s, %{size_download} bytes\n" "$url$path"
done

echo "== job page, navigation to charts drawn (headless chromium, $runs loads)"
node bench/dashboard_load.js "$url" "$token" "$id" "$runs"
