#!/bin/sh
# multi_worker over streamed TFRecord shards, under mpirun -np 2: each
# process reads only its own shard files (by file with 8 files; by record,
# every other record of the one file, when there are fewer files than
# workers), as each process's own report of the files it opened shows;
# every process takes the same steps (the remainder beyond the smallest
# share's whole batches dropped), and the job still trains Fashion-MNIST
# to >= 0.80 validation accuracy in one epoch (validation shards split
# between the workers too). With cache "file" (a file per process), the
# second epoch opens no shard file; a memory cache larger than the memory
# limit is refused up front.
# Usage: multi_worker_reads_own_shards.sh KILN_TRAIN MPIRUN DATASETS_DIR
set -eu
trainer="$1"
mpirun="${2:-}"
fm="${3:-}/fashion-mnist"
if [ -z "$mpirun" ]; then
  echo "SKIPPED: multi_worker needs mpirun (kiln built without MPI)"; exit 77
fi
if [ ! -e "$fm/train-images-idx3-ubyte.gz" ]; then
  echo "SKIPPED: no Fashion-MNIST under $3"; exit 77
fi
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
mkdir -p "$d/data/shards/eight/train" "$d/data/shards/eight/test" "$d/data/shards/one/train"
"$trainer" --to-tfrecord "$d/data/shards/eight/train/part" --shards 8 --gzip \
  "$fm/train-images-idx3-ubyte.gz" "$fm/train-labels-idx1-ubyte.gz"
"$trainer" --to-tfrecord "$d/data/shards/eight/test/part" --shards 2 \
  "$fm/t10k-images-idx3-ubyte.gz" "$fm/t10k-labels-idx1-ubyte.gz"
"$trainer" --to-tfrecord "$d/data/shards/one/train/part" --shards 1 \
  "$fm/t10k-images-idx3-ubyte.gz" "$fm/t10k-labels-idx1-ubyte.gz"

spec() { # $1 dataset object, $2 epochs, $3 more pipeline fields
  cat <<SPEC
{"model": {"input_shape": [28, 28, 1], "layers": [{"type": "flatten"},
   {"type": "dense", "units": 64, "activation": "relu"}, {"type": "dense", "units": 10}]},
 "loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"],
 "dataset": $1,
 "pipeline": {"batch_size": 64, "interleave": {"cycle_length": 2}, "num_parallel_calls": 1 $3},
 "optimizer": {"type": "adam", "learning_rate": 0.002},
 "strategy": {"type": "multi_worker", "workers": 2},
 "epochs": $2, "log_every_steps": 50, "seed": 42}
SPEC
}
run() { # $1 name, $2 spec file
  $mpirun --allow-run-as-root --oversubscribe -np 2 "$trainer" --json --threads 1 \
    --data-dir "$d/data" --checkpoint-dir "$d/$1" "$2" > "$d/$1.out" 2> "$d/$1.err"
  grep 'read .* shard file' "$d/$1.err"
}
opened() { # $1 name, $2 rank: the files that rank reported
  sed -n "s/.*worker $2 of 2 read .*times: //p" "$d/$1.err"
}

# (1) By file: 8 files, worker r reads files i % 2 == r and no other.
spec '{"name": "eight", "format": "tfrecord", "validation": "test"}' 1 "" > "$d/byfile.json"
run byfile "$d/byfile.json"
test "$(opened byfile 0)" = "part-00000-of-00008.tfrecord.gz part-00002-of-00008.tfrecord.gz part-00004-of-00008.tfrecord.gz part-00006-of-00008.tfrecord.gz"
test "$(opened byfile 1)" = "part-00001-of-00008.tfrecord.gz part-00003-of-00008.tfrecord.gz part-00005-of-00008.tfrecord.gz part-00007-of-00008.tfrecord.gz"
# Opened once by the count pass and once by the epoch.
grep -q 'worker 0 of 2 read 4 shard file(s) (its own), opened 8 times' "$d/byfile.err"
grep -q 'worker 1 of 2 read 4 shard file(s) (its own), opened 8 times' "$d/byfile.err"
# 30000 examples each: 468 whole batches of 64, 48 examples dropped per worker.
grep -q '"message":"multi_worker: each of 2 workers streams its own share of the shards (29952 examples an epoch each; 96 beyond' "$d/byfile.out"
grep -q '"message":"training .*: 59904 examples, 1 epochs of 468 steps"' "$d/byfile.out"
acc=$(grep -o '"val_accuracy":[0-9.]*' "$d/byfile.out" | tail -1 | cut -d: -f2)
echo "multi_worker by file: val_accuracy $acc after one epoch"
awk -v a="$acc" 'BEGIN { exit !(a >= 0.80) }'

# (2) By record: one file, two workers: each reads it, keeping its records.
spec '{"name": "one", "format": "tfrecord"}' 1 "" > "$d/byrecord.json"
run byrecord "$d/byrecord.json"
grep -q 'worker 0 of 2 read 1 shard file(s) (every file, its records p % workers), opened 2 times: part-00000-of-00001.tfrecord' "$d/byrecord.err"
grep -q 'worker 1 of 2 read 1 shard file(s) (every file, its records p % workers), opened 2 times: part-00000-of-00001.tfrecord' "$d/byrecord.err"
grep -q '5000 examples an epoch each' "$d/byrecord.out" || grep -q '4992 examples an epoch each' "$d/byrecord.out"

# (3) cache "file": 2 epochs, the shards opened by the count pass and the
# first epoch only; each process keeps its own cache file.
spec '{"name": "eight", "format": "tfrecord"}' 2 ', "cache": "file"' > "$d/cached.json"
run cached "$d/cached.json"
grep -q "worker 0 of 2 read 4 shard file(s) (its own), opened 8 times" "$d/cached.err"
grep -q 'worker 1 of 2 read 4 shard file(s) (its own), opened 8 times' "$d/cached.err"
ls -l "$d/cached/stream-cache-train-0.bin" "$d/cached/stream-cache-train-1.bin"
echo "each worker opened only its own shard files"

# (4) cache "memory" of more than the trainer's memory limit: refused up
# front (exit 7, RESOURCE_EXHAUSTED), naming the figures.
sed -e 's/"strategy": {"type": "multi_worker", "workers": 2},//' -e 's/"cache": "file"/"cache": "memory"/' \
  "$d/cached.json" > "$d/toobig.json"
status=0
# One BLAS thread: OpenBLAS's pool threads cannot get their buffers under
# so small a limit, and its exit waits for them.
OPENBLAS_NUM_THREADS=1 prlimit --as=$((150 << 20)) "$trainer" --threads 1 --data-dir "$d/data" \
  --checkpoint-dir "$d/toobig" "$d/toobig.json" 2> "$d/toobig.err" || status=$?
cat "$d/toobig.err"
test $status -eq 7
grep -q 'cache "memory": the decoded data set is 179.7 MiB (60000 examples of 28x28x1 floats), more than the trainer.s memory limit of 150.0 MiB; use cache "file"' "$d/toobig.err"
