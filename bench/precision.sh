#!/usr/bin/env bash
# Mixed precision and recompute on the Fashion-MNIST CNN: trains
# examples/fmnist-cnn.json (3 epochs, batch 128, Adam) with kiln-train in
# float32, mixed_bfloat16, and each with recompute, one after another, and
# prints test accuracy, the planned arena, the activations kept for
# backward and wall time side by side. Figures seen are in bench/README.md.
#
#   bash bench/precision.sh [BUILD_DIR] [THREADS] [EPOCHS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
threads=${2:-1}
epochs=${3:-3}
train="$build/worker/kiln-train"
[ -x "$train" ] || {
  echo "no $train: build first (cmake -S . -B $build -DCMAKE_BUILD_TYPE=Release && cmake --build $build -j)" >&2
  exit 2
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

variants="float32:false float32:true mixed_bfloat16:false mixed_bfloat16:true"
[ -n "${KILN_BENCH_VARIANTS:-}" ] && variants=$KILN_BENCH_VARIANTS

printf '| precision | recompute | test accuracy | arena peak (MiB) | kept for backward (MiB) | peak without recompute (MiB) | wall (s) |\n'
printf '|---|---|---|---|---|---|---|\n'
for v in $variants; do
  precision=${v%%:*}
  recompute=${v##*:}
  spec="$work/$precision-$recompute.json"
  python3 - "$spec" "$precision" "$recompute" "$epochs" <<'EOF'
import json, sys
path, precision, recompute, epochs = sys.argv[1:]
with open("examples/fmnist-cnn.json") as f:
    spec = json.load(f)
spec["precision"] = precision
spec["recompute"] = recompute == "true"
spec["epochs"] = int(epochs)
spec["log_every_steps"] = 100000
with open(path, "w") as f:
    json.dump(spec, f)
EOF
  mkdir -p "$work/ckpt-$precision-$recompute"
  log="$work/$precision-$recompute.log"
  start=$(date +%s.%N)
  "$train" --threads "$threads" --checkpoint-dir "$work/ckpt-$precision-$recompute" "$spec" >"$log" 2>&1
  end=$(date +%s.%N)
  python3 - "$log" "$precision" "$recompute" "$start" "$end" <<'EOF'
import re, sys
log, precision, recompute, start, end = sys.argv[1:]
text = open(log).read()
arena = re.search(r"activations planned in ([0-9.]+) MiB", text).group(1)
kept = re.search(r"([0-9.]+) MiB of them kept for backward", text)
without = re.search(r"peak ([0-9.]+) MiB without", text)
acc = re.findall(r"val_accuracy ([0-9.]+)", text)[-1]
print(f"| {precision} | {recompute} | {acc} | {arena} | {kept.group(1) if kept else '-'} | "
      f"{without.group(1) if without else arena} | {float(end) - float(start):.0f} |")
EOF
done
