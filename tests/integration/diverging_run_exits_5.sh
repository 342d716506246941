#!/bin/sh
# kiln-train on a mixed_float16 job that diverges (SGD at rate 10 on raw
# pixels: the hidden layer overflows float16 after a few steps, and every
# later step is skipped): it must not succeed, but exit with status 5 and
# a NUMERIC_ERROR that names the skipped steps, having reported
# skipped_steps, a loss scale of at least 1 and no loss of 0 on the way.
# Usage: diverging_run_exits_5.sh KILN_TRAIN
set -eu
trainer="$1"
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
cat > "$d/spec.json" <<'SPEC'
{"display_name": "diverges",
 "model": {"input_shape": [28, 28, 1], "layers": [
   {"type": "flatten"}, {"type": "dense", "units": 32}, {"type": "dense", "units": 10}]},
 "loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"],
 "dataset": {"name": "fashion-mnist", "validation": "none"},
 "pipeline": {"batch_size": 64, "take": 640, "normalize": false},
 "optimizer": {"type": "sgd", "learning_rate": 10},
 "precision": "mixed_float16",
 "epochs": 20, "log_every_steps": 1, "seed": 7}
SPEC
status=0
"$trainer" --json --threads 1 --checkpoint-dir "$d/c" "$d/spec.json" > "$d/out" 2> "$d/err" ||
  status=$?
tail -n 3 "$d/out"
if [ "$status" -ne 5 ]; then
  echo "kiln-train exited with status $status, expected 5 (a numeric error)"; exit 1
fi
grep -q '"error":{"reason":"NUMERIC_ERROR","message":"mixed_float16: 50 steps in a row were skipped' \
  "$d/out"
grep -q '"skipped_steps":' "$d/out"
if grep -q '"loss":0\.0\|"epoch_loss":0\.0' "$d/out"; then
  echo "a loss of 0 was reported for skipped steps"; exit 1
fi
if grep -o '"loss_scale":[^,}]*' "$d/out" | awk -F: '$2 < 1 { bad = 1 } END { exit !bad }'; then
  echo "the loss scale fell below 1"; exit 1
fi
echo "a diverging mixed_float16 run exits 5 with NUMERIC_ERROR"
