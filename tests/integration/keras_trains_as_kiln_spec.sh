#!/bin/sh
# keras_model end to end: kiln-train on each Keras fixture (tests/api/keras,
# Keras 2 and 3, Sequential and functional) and on the kiln spec beside it
# prints the same loss at every step, to the last digit; so does a model
# whose activation layers are written with Keras's layer names (leaky_relu,
# elu, softmax) against the same model written with the activation layer.
# Usage: keras_trains_as_kiln_spec.sh KILN_TRAIN FIXTURES
set -eu
trainer="$1"
fixtures="$2"
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
rest='"loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"],
 "dataset": {"name": "fashion-mnist", "validation": "none"},
 "pipeline": {"batch_size": 32, "take": 128},
 "optimizer": {"type": "adam", "learning_rate": 0.01},
 "epochs": 1, "log_every_steps": 1, "seed": 5}'
# Step lines ("step":N with a loss).
steps() { grep -o '"step":[0-9]*,"epoch":[0-9]*,"metrics":{"loss":[^,}]*' "$1"; }
train() { # NAME SPEC: trains, and keeps the step lines in $d/NAME.steps
  "$trainer" --json --threads 1 --checkpoint-dir "$d/ckpt-$1" "$2" > "$d/$1.out"
  steps "$d/$1.out" > "$d/$1.steps"
  test "$(wc -l < "$d/$1.steps")" -eq 4
}
same() { # A B: the same losses at every step
  if ! cmp -s "$d/$1.steps" "$d/$2.steps"; then
    echo "$1 and $2 train to different losses:"; diff "$d/$1.steps" "$d/$2.steps"; exit 1
  fi
  echo "$1 = $2: $(tr '\n' ' ' < "$d/$1.steps" | sed 's/"metrics":{"loss"://g')"
}
for f in keras2_sequential_mlp keras3_sequential_mlp keras2_sequential_cnn \
  keras3_sequential_cnn keras2_functional keras3_functional; do
  { printf '{"keras_model": '; cat "$fixtures/$f.json"; printf ', %s\n' "$rest"; } > "$d/$f.keras.json"
  { printf '{"model": '; cat "$fixtures/$f.kiln.json"; printf ', %s\n' "$rest"; } > "$d/$f.kiln.json"
  train "$f.keras" "$d/$f.keras.json"
  train "$f.kiln" "$d/$f.kiln.json"
  same "$f.keras" "$f.kiln"
done

# Activation layers by Keras's layer names against the activation layer.
layers() { # LEAKY ELU SOFTMAX: the three activation layers
  printf '{"model": {"input_shape": [28, 28, 1], "layers": [{"type": "flatten"},
   {"type": "dense", "units": 32}, %s, {"type": "dense", "units": 16}, %s,
   {"type": "dense", "units": 10}, %s]}, %s\n' "$1" "$2" "$3" "$rest"
}
layers '{"type": "leaky_relu", "name": "a1", "negative_slope": 0.2}' \
  '{"type": "elu", "name": "a2", "alpha": 0.7}' '{"type": "softmax", "name": "a3"}' \
  > "$d/names.json"
layers '{"type": "activation", "name": "a1", "activation": "leaky_relu", "alpha": 0.2}' \
  '{"type": "activation", "name": "a2", "activation": "elu", "alpha": 0.7}' \
  '{"type": "activation", "name": "a3", "activation": "softmax"}' > "$d/activation.json"
layers '{"type": "activation", "name": "a1", "activation": "leaky_relu", "alpha": 0.05}' \
  '{"type": "activation", "name": "a2", "activation": "elu", "alpha": 0.7}' \
  '{"type": "activation", "name": "a3", "activation": "softmax"}' > "$d/other_slope.json"
train names "$d/names.json"
train activation "$d/activation.json"
train other_slope "$d/other_slope.json"
same names activation
# The slope reaches the trainer: another slope trains to other losses.
if cmp -s "$d/names.steps" "$d/other_slope.steps"; then
  echo "negative_slope 0.2 and 0.05 train to the same losses; the slope is lost"; exit 1
fi
echo "negative_slope 0.05 trains to other losses"
