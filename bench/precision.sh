#!/usr/bin/env bash
# Mixed precision and recompute on the Fashion-MNIST CNN, in two parts.
#
# speed: kiln's bf16 GEMM against OpenBLAS sgemm at the CNN's GEMM shapes
# (GFLOP/s), then the CNN's training step (batch 128, Adam, random data)
# in float32 and mixed_bfloat16, beside PyTorch in float32 and under
# torch.autocast("cpu", torch.bfloat16) in the same run, as ratios.
#
# accuracy: trains examples/fmnist-cnn.json (3 epochs, batch 128, Adam)
# with kiln-train in float32, mixed_bfloat16, and each with recompute, one
# after another, and prints test accuracy, the planned arena peak, the
# activations kept for backward and wall time side by side.
#
# Figures seen are in bench/README.md.
#
#   bash bench/precision.sh [BUILD_DIR] [THREADS] [EPOCHS] [speed|accuracy|all]
#
# PYTHON names the interpreter with torch (default python3); without torch
# the PyTorch rows are skipped, saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
threads=${2:-1}
epochs=${3:-3}
part=${4:-all}
python=${PYTHON:-python3}
train="$build/worker/kiln-train"
for bin in "$train" "$build/bench/kiln-bench-gemm" "$build/bench/kiln-bench-step"; do
  [ -x "$bin" ] || {
    echo "no $bin: build first (cmake -S . -B $build -DCMAKE_BUILD_TYPE=Release && cmake --build $build -j)" >&2
    exit 2
  }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ "$part" = speed ] || [ "$part" = all ]; then
  echo "## bf16 GEMM vs OpenBLAS sgemm, $threads thread(s)"
  echo
  "$build/bench/kiln-bench-gemm" "$threads" 5 >"$work/gemm.jsonl"
  python3 - "$work/gemm.jsonl" <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print(f"kernel: {rows[0]['kernel']}\n")
print("| GEMM | m x n x k | kiln bf16 GFLOP/s | OpenBLAS sgemm GFLOP/s | bf16 / sgemm |")
print("|---|---|---|---|---|")
for r in rows:
    print(f"| {r['shape']} | {r['m']} x {r['n']} x {r['k']} | {r['bf16_gflops']:.1f} | "
          f"{r['sgemm_gflops']:.1f} | {r['ratio']:.2f}x |")
EOF
  echo
  echo "## CNN training step, batch 128, $threads thread(s)"
  echo
  steps=30
  : >"$work/step.jsonl"
  "$build/bench/kiln-bench-step" cnn "$threads" "$steps" >>"$work/step.jsonl"
  "$build/bench/kiln-bench-step" cnn "$threads" "$steps" mixed_bfloat16 >>"$work/step.jsonl"
  if "$python" -c 'import torch' 2>/dev/null; then
    "$python" bench/torch_engine.py step cnn "$threads" "$steps" >>"$work/step.jsonl"
    "$python" bench/torch_engine.py step cnn "$threads" "$steps" bf16 >>"$work/step.jsonl"
  else
    echo "PyTorch rows SKIPPED: $python has no torch (set PYTHON, or install python3-torch)"
    echo
  fi
  python3 - "$work/step.jsonl" <<'EOF'
import json, sys
rows = {r["framework"]: r for r in map(json.loads, open(sys.argv[1]))}
k32, k16 = rows["kiln"], rows["kiln-mixed_bfloat16"]
print("| framework | float32 ms/step | bf16 ms/step | bf16 speedup | planned arena (MiB) |")
print("|---|---|---|---|---|")
print(f"| kiln, mixed_bfloat16 | {k32['ms_per_step']:.1f} | {k16['ms_per_step']:.1f} | "
      f"{k32['ms_per_step'] / k16['ms_per_step']:.2f}x | "
      f"{k32['arena_mib']:.2f} -> {k16['arena_mib']:.2f} |")
t32, t16 = rows.get("pytorch"), rows.get("pytorch-autocast-bf16")
if t32 and t16:
    print(f"| PyTorch, autocast bf16 | {t32['ms_per_step']:.1f} | {t16['ms_per_step']:.1f} | "
          f"{t32['ms_per_step'] / t16['ms_per_step']:.2f}x | - |")
    print(f"\nPyTorch / kiln step time: float32 {t32['ms_per_step'] / k32['ms_per_step']:.2f}x, "
          f"bf16 {t16['ms_per_step'] / k16['ms_per_step']:.2f}x (above 1: kiln is faster)")
EOF
  echo
fi
[ "$part" = accuracy ] || [ "$part" = all ] || exit 0

echo "## Fashion-MNIST CNN, $epochs epochs, $threads thread(s)"
echo

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
declined = re.search(r"recompute declined: it would plan ([0-9.]+) MiB", text)
if declined:  # compiled without: recompute's own plan was the larger
    recompute += f" (declined: it would plan {declined.group(1)})"
acc = re.findall(r"val_accuracy ([0-9.]+)", text)[-1]
print(f"| {precision} | {recompute} | {acc} | {arena} | {kept.group(1) if kept else '-'} | "
      f"{without.group(1) if without else arena} | {float(end) - float(start):.0f} |")
EOF
done
