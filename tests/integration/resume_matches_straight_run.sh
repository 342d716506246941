#!/bin/sh
# kiln-train --resume end to end: a run on 640 Fashion-MNIST examples with a
# checkpoint every 5 steps, then a second run resumed from the step-5
# checkpoint must print the same loss for every later step, to the last
# digit, and end with the same weights, byte for byte. Then SIGTERM to a
# long run: it checkpoints the step it is on and exits with status 6.
# Then the CNN: SIGTERM after its first epoch, resumed, against a straight
# two-epoch run.
# Usage: resume_matches_straight_run.sh KILN_TRAIN
set -eu
trainer="$1"
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
cat > "$d/spec.json" <<'SPEC'
{"display_name": "resume-check",
 "model": {"input_shape": [28, 28, 1], "layers": [
   {"type": "flatten"}, {"type": "dense", "units": 32, "activation": "relu"},
   {"type": "dropout", "rate": 0.2}, {"type": "dense", "units": 10}]},
 "loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"],
 "dataset": {"name": "fashion-mnist", "validation": "none"},
 "pipeline": {"batch_size": 64, "take": 640, "augment": ["flip_left_right"]},
 "optimizer": {"type": "adam", "learning_rate": 0.002},
 "checkpoint": {"every_steps": 5},
 "epochs": 2, "log_every_steps": 1, "seed": 7}
SPEC
"$trainer" --json --threads 1 --checkpoint-dir "$d/a" "$d/spec.json" > "$d/a.out"
ls "$d/a/ckpt-00000005.safetensors" "$d/a/ckpt-00000005.state" "$d/a/ckpt-00000020.safetensors"
"$trainer" --json --threads 1 --checkpoint-dir "$d/b" \
  --resume "$d/a/ckpt-00000005.safetensors" "$d/spec.json" > "$d/b.out"
# Step lines ("step":N with a loss), keyed by step.
steps() { grep -o '"step":[0-9]*,"epoch":[0-9]*,"metrics":{"loss":[^,}]*' "$1"; }
steps "$d/a.out" | awk -F'[:,]' '$2 > 5' > "$d/a.steps"
steps "$d/b.out" > "$d/b.steps"
test "$(wc -l < "$d/a.steps")" -eq 15
if ! cmp -s "$d/a.steps" "$d/b.steps"; then
  echo "resumed losses differ from the straight run's:"; diff "$d/a.steps" "$d/b.steps"; exit 1
fi
# The final weights are the same bytes.
cmp "$d/a/ckpt-00000020.safetensors" "$d/b/ckpt-00000020.safetensors"
echo "steps 6..20 match after resuming from step 5"

# SIGTERM: a long run checkpoints the step it is on and exits with 6.
sed -e 's/"take": 640/"take": 6400/' -e 's/"epochs": 2/"epochs": 200/' "$d/spec.json" > "$d/long.json"
"$trainer" --json --threads 1 --checkpoint-dir "$d/c" "$d/long.json" > "$d/c.out" 2> "$d/c.err" &
pid=$!
i=0
while [ ! -e "$d/c/ckpt-00000005.safetensors" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
kill -TERM $pid
status=0
wait $pid || status=$?
cat "$d/c.err"
test $status -eq 6
step=$(sed -n 's/.*stopped on request at step \([0-9]*\), checkpoint written.*/\1/p' "$d/c.err")
test -n "$step" && test "$step" -gt 5 && test "$step" -lt 20000
last=$(printf '%08d' "$step")
ls "$d/c/ckpt-$last.safetensors" "$d/c/ckpt-$last.state"
grep -q "\"checkpoint\":{\"step\":$step," "$d/c.out"
grep -q '"reason":"STOPPED"' "$d/c.out"
echo "SIGTERM at step $step: checkpointed, exit status 6"

# The Fashion-MNIST CNN, 2 epochs straight, against 1 epoch, SIGTERM and a
# resume from the checkpoint SIGTERM wrote: every step after the stop has
# the straight run's loss to the last digit, and the final weights are the
# same bytes. Shuffle, augmentation and dropout all draw from the RNG, so
# the training-state file must carry every stream and the pipeline position.
cat > "$d/cnn.json" <<'SPEC'
{"display_name": "cnn-resume-check",
 "model": {"input_shape": [28, 28, 1], "layers": [
   {"type": "conv2d", "filters": 16, "kernel_size": 3, "padding": "same", "activation": "relu"},
   {"type": "max_pool2d", "pool_size": 2},
   {"type": "conv2d", "filters": 32, "kernel_size": 3, "padding": "same", "activation": "relu"},
   {"type": "max_pool2d", "pool_size": 2},
   {"type": "flatten"}, {"type": "dense", "units": 64, "activation": "relu"},
   {"type": "dropout", "rate": 0.25}, {"type": "dense", "units": 10}]},
 "loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"],
 "dataset": {"name": "fashion-mnist", "validation": "none"},
 "pipeline": {"batch_size": 64, "take": 1280, "shuffle": true, "normalize": true,
              "augment": ["flip_left_right"]},
 "optimizer": {"type": "adam", "learning_rate": 0.001},
 "epochs": 2, "log_every_steps": 1, "seed": 11}
SPEC
"$trainer" --json --threads 1 --checkpoint-dir "$d/cnn-a" "$d/cnn.json" > "$d/cnn-a.out"
"$trainer" --json --threads 1 --checkpoint-dir "$d/cnn-b" "$d/cnn.json" > "$d/cnn-b.out" 2> "$d/cnn-b.err" &
pid=$!
i=0
while ! grep -q '"step":20,' "$d/cnn-b.out" && [ $i -lt 3000 ]; do sleep 0.02; i=$((i+1)); done
kill -TERM $pid
status=0
wait $pid || status=$?
test $status -eq 6
step=$(sed -n 's/.*stopped on request at step \([0-9]*\), checkpoint written.*/\1/p' "$d/cnn-b.err")
test -n "$step" && test "$step" -ge 20 && test "$step" -lt 40
"$trainer" --json --threads 1 --checkpoint-dir "$d/cnn-c" \
  --resume "$d/cnn-b/ckpt-$(printf '%08d' "$step").safetensors" "$d/cnn.json" > "$d/cnn-c.out"
steps "$d/cnn-a.out" | awk -F'[:,]' -v s="$step" '$2 > s' > "$d/cnn-a.steps"
steps "$d/cnn-c.out" > "$d/cnn-c.steps"
test "$(wc -l < "$d/cnn-a.steps")" -eq $((40 - step))
if ! cmp -s "$d/cnn-a.steps" "$d/cnn-c.steps"; then
  echo "CNN losses after the SIGTERM resume differ:"; diff "$d/cnn-a.steps" "$d/cnn-c.steps"; exit 1
fi
cmp "$d/cnn-a/ckpt-00000040.safetensors" "$d/cnn-c/ckpt-00000040.safetensors"
echo "CNN: SIGTERM at step $step after epoch 1, steps $((step + 1))..40 match the straight run"
