#!/bin/sh
# Fashion-MNIST converted to TFRecord shards by kiln-train --to-tfrecord and
# streamed: (1) one shard, no shuffle: the same batches as the IDX files,
# so the same final weights, byte for byte; (2) 8 gzip'd shards shuffled
# (interleave over 4 files, a 10000-record shuffle buffer) against the IDX
# files fully shuffled, same seed: validation accuracy within 0.3 points;
# (3) a run resumed from a checkpoint in the middle of an epoch prints the
# straight run's loss for every later step; (4) a wrong feature name is a
# data error naming the feature.
# Usage: shards_train_like_idx.sh KILN_TRAIN DATASETS_DIR
set -eu
trainer="$1"
fm="$2/fashion-mnist"
if [ ! -e "$fm/train-images-idx3-ubyte.gz" ]; then
  echo "SKIP: no Fashion-MNIST under $2"; exit 77
fi
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
mkdir -p "$d/data/shards/one/train" "$d/data/shards/one/test" "$d/data/shards/eight/train" \
  "$d/data/shards/eight/test"
"$trainer" --to-tfrecord "$d/data/shards/one/train/part" --shards 1 \
  "$fm/train-images-idx3-ubyte.gz" "$fm/train-labels-idx1-ubyte.gz"
"$trainer" --to-tfrecord "$d/data/shards/eight/train/part" --shards 8 --gzip \
  "$fm/train-images-idx3-ubyte.gz" "$fm/train-labels-idx1-ubyte.gz"
for s in one eight; do
  "$trainer" --to-tfrecord "$d/data/shards/$s/test/part" --shards 2 \
    "$fm/t10k-images-idx3-ubyte.gz" "$fm/t10k-labels-idx1-ubyte.gz"
done
ls "$d/data/shards/eight/train/part-00007-of-00008.tfrecord.gz"

spec() { # $1 dataset object, $2 shuffle, $3 epochs, $4 extra top-level fields
  cat <<SPEC
{"model": {"input_shape": [28, 28, 1], "layers": [{"type": "flatten"},
   {"type": "dense", "units": 64, "activation": "relu"}, {"type": "dense", "units": 10}]},
 "loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"],
 "dataset": $1,
 "pipeline": {"batch_size": 128, "shuffle": $2, "normalize": true,
              "interleave": {"cycle_length": 4}, "num_parallel_calls": 2},
 "optimizer": {"type": "adam", "learning_rate": 0.002},
 "epochs": $3, "log_every_steps": 1, "seed": 42 $4}
SPEC
}
idx='{"name": "fashion-mnist", "validation": "test"}'
run() { # $1 name, $2 spec file, $3 data dir, rest: more options
  name=$1 file=$2 data=$3
  shift 3
  "$trainer" --json --threads 1 --data-dir "$data" --checkpoint-dir "$d/$name" "$@" "$file" \
    > "$d/$name.out"
}
final() { grep -o '"val_accuracy":[0-9.]*' "$1" | tail -1 | cut -d: -f2; }

# (1) One shard in order: the IDX run's weights exactly. (Interleave over
# one file is that file; the IDX run has no parts to interleave.)
spec "$idx" false 1 "" | sed 's/"interleave": {"cycle_length": 4}, //' > "$d/idx1.json"
spec '{"name": "one", "format": "tfrecord", "validation": "test"}' false 1 "" > "$d/one.json"
run idx1 "$d/idx1.json" "$2"
run one "$d/one.json" "$d/data"
a=$(sed -n 's/.*"sha256":"\([0-9a-f]*\)".*/\1/p' "$d/idx1.out" | tail -1)
b=$(sed -n 's/.*"sha256":"\([0-9a-f]*\)".*/\1/p' "$d/one.out" | tail -1)
echo "IDX weights $a, one shard $b"
test -n "$a" && test "$a" = "$b"

# (2) Shuffled: 8 shards streamed against the IDX files.
spec "$idx" true 2 "" | sed 's/"interleave": {"cycle_length": 4}, //' > "$d/idx2.json"
spec '{"name": "eight", "format": "tfrecord", "validation": "test"}' true 2 "" > "$d/eight.json"
run idx2 "$d/idx2.json" "$2"
run eight "$d/eight.json" "$d/data"
a=$(final "$d/idx2.out")
b=$(final "$d/eight.out")
echo "val_accuracy: IDX $a, 8 TFRecord shards $b"
awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0.8 && d <= 0.003) }'

# (3) Resumed at step 100 of 469 (epoch 1): the straight run's losses.
spec '{"name": "eight", "format": "tfrecord", "validation": "none"}' true 2 \
  ', "checkpoint": {"every_steps": 100}' > "$d/ckpt.json"
run straight "$d/ckpt.json" "$d/data"
run resumed "$d/ckpt.json" "$d/data" --resume "$d/straight/ckpt-00000100.safetensors"
steps() { grep -o '"step":[0-9]*,"epoch":[0-9]*,"metrics":{"loss":[^,}]*' "$1"; }
steps "$d/straight.out" | awk -F'[:,]' '$2 > 100' > "$d/straight.steps"
steps "$d/resumed.out" > "$d/resumed.steps"
test "$(wc -l < "$d/resumed.steps")" -eq 838
if ! cmp -s "$d/straight.steps" "$d/resumed.steps"; then
  echo "resumed losses differ:"; diff "$d/straight.steps" "$d/resumed.steps" | head; exit 1
fi
echo "steps 101..938 match after resuming mid-epoch from step 100"

# (4) A wrong feature name: exit 4, the feature named.
spec '{"name": "eight", "format": "tfrecord", "features": {"label": "label"}}' true 1 "" \
  > "$d/bad.json"
status=0
"$trainer" --data-dir "$d/data" --checkpoint-dir "$d/bad" "$d/bad.json" 2> "$d/bad.err" || status=$?
cat "$d/bad.err"
test $status -eq 4
grep -q "record 0 has no feature 'label' (the spec's features.label)" "$d/bad.err"
