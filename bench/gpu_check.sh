#!/usr/bin/env bash
# The GPU check: one command on a machine with an NVIDIA GPU, a few minutes,
# one table. It builds kiln with CUDA (unless BUILD_DIR already holds such a
# build), then:
#   - test_cuda: every op kiln's CUDA backend runs (matmul in its four
#     transpose forms on odd sizes, relu, relu's gradient with NaN, -0 and
#     inf, a bias added to rows, a bias's gradient) on the device against
#     plain CPU loops, allclose;
#   - test_nccl: soft placement, NCCL communicators on the device (one
#     rank, and a timeout instead of a hang), mirrored replicas on two GPUs
#     against one (skipped, saying so, with fewer GPUs);
#   - test_engine_placement: a GPU-placed graph against the CPU, and a
#     model split over two GPUs (model parallelism) against one (skipped,
#     saying so, with one GPU);
#   - the Fashion-MNIST CNN (examples/fmnist-cnn.json), one epoch with
#     resources.device_type gpu: examples/s, test accuracy;
#   - the step of a GEMM-bound model, a wide MLP (784 - 4 x 4096 - 10,
#     batch 1024), in float32 on the GPU: ms a step, achieved TFLOP/s and
#     its share of the device's dense peak, the share of the step in the
#     GPU nodes, and how much of it the host copies alone explain (the
#     bytes the graph copied over and back a step, from its profile / this
#     machine's measured pinned copy bandwidth); in mixed_bfloat16, which a GPU job
#     refuses today; and with two GPUs, split over them (its last three
#     layers on cuda:1): ms a step against the one-GPU figure;
# and prints the table.
#
#   bash bench/gpu_check.sh [BUILD_DIR] [DATA_DIR]
#
# BUILD_DIR defaults to build-gpu (Release, KILN_CUDA=ON); DATA_DIR holds
# fashion-mnist/*.gz (default /usr/share/datasets). The device peak is
# taken from PEAK_TFLOPS (dense float32, non-tensor; default 67, an
# H100/H200 SXM's). Exit status: 0 when every check ran and passed.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
data=${2:-/usr/share/datasets}
peak=${PEAK_TFLOPS:-67}
python=${PYTHON:-python3}
if [ ! -x "$build/worker/kiln-train" ] || [ ! -f "$build/engine/libkiln_cuda.so" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON >/dev/null &&
    cmake --build "$build" -j "$(nproc)" --target kiln-train kiln_cuda test_cuda test_nccl \
      test_engine_placement \
      >/dev/null || {
    echo "gpu_check: the CUDA build failed (cmake --build $build)" >&2
    exit 2
  }
fi
export KILN_CUDA_MODULE=${KILN_CUDA_MODULE:-$PWD/$build/engine/libkiln_cuda.so}
work=$(mktemp -d)
# GPU_CHECK_LOGS=DIR keeps the suites' and runs' output there, and each
# profiled run's table as RUN.profile.txt
keep_logs() {
  [ -n "${GPU_CHECK_LOGS:-}" ] || return 0
  cp "$work"/*.log "$GPU_CHECK_LOGS"/ 2>/dev/null
  for p in "$work"/*/profile.txt; do
    [ -f "$p" ] && cp "$p" "$GPU_CHECK_LOGS/$(basename "$(dirname "$p")").profile.txt"
  done
  return 0
}
trap 'keep_logs; rm -rf "$work"' EXIT
status=0

gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null |
  head -1)
echo "GPU: ${gpu:-none found by nvidia-smi}"

# A cmocka suite: "N passed, M skipped" (or what failed).
suite() {
  local name=$1 bin=$2
  CMOCKA_MESSAGE_OUTPUT=stdout timeout 300 "$bin" >"$work/$name.log" 2>&1
  local rc=$?
  local passed skipped failed
  passed=$(grep -c '^\[       OK \]' "$work/$name.log")
  # each skipped or failed test is named twice (as it runs, and in the summary)
  skipped=$(grep -o '^\[  SKIPPED \] [a-z_][a-z_0-9]*' "$work/$name.log" | sort -u | wc -l)
  failed=$(grep -o '^\[  FAILED  \] [a-z_][a-z_0-9]*' "$work/$name.log" | sort -u | wc -l)
  if [ "$rc" -ne 0 ] || [ "$failed" -ne 0 ]; then
    status=1
    echo "$name: exit $rc, $passed passed, $failed failed: $(grep -m3 -A2 'FAILED\|ERROR' "$work/$name.log" | tr '\n' ' ')"
  else
    echo "$name: $passed passed, $skipped skipped $(grep -m1 -o 'SKIPPED: [^[]*' "$work/$name.log" | head -1)"
  fi
}
suite test_cuda "$build/tests/cuda/test_cuda" >"$work/r_test_cuda"
suite test_nccl "$build/tests/cuda/test_nccl" >"$work/r_test_nccl"
suite test_engine_placement "$build/tests/engine/test_engine_placement" >"$work/r_test_placement"
cat "$work/r_test_cuda" "$work/r_test_nccl" "$work/r_test_placement"

# The training runs and the table.
PEAK=$peak "$python" - "$build" "$data" "$work" <<'EOF'
import json, os, re, subprocess, sys, time

build, data, work = sys.argv[1:4]
peak = float(os.environ["PEAK"])
train = os.path.join(build, "worker", "kiln-train")


def run(spec, name, threads):
    path = os.path.join(work, name + ".json")
    with open(path, "w") as f:
        json.dump(spec, f)
    out = os.path.join(work, name)
    os.makedirs(out, exist_ok=True)
    argv = [train, "--json", "--threads", str(threads), "--data-dir", data,
            "--checkpoint-dir", out, path]
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in p.stdout:
        lines.append((time.perf_counter(), line))
    err = p.stderr.read()
    p.wait()
    parsed = [(t, json.loads(l)) for t, l in lines if l.startswith("{")]
    return p.returncode, parsed, time.perf_counter() - t0, err, out


rows = []
failed = False
threads = os.cpu_count() or 1

with open("examples/fmnist-cnn.json") as f:
    cnn = json.load(f)
cnn["epochs"] = 1
cnn["log_every_steps"] = 50
if os.environ.get("GPU_CHECK_TAKE"):  # a smaller run, to try the script
    cnn["pipeline"]["take"] = int(os.environ["GPU_CHECK_TAKE"])
cnn["resources"] = {"device_type": "gpu", "devices": 1}
rc, lines, wall, err, _ = run(cnn, "cnn", threads)
if rc == 0:
    acc = [l["metrics"]["val_accuracy"] for _, l in lines
           if "metrics" in l and "val_accuracy" in l["metrics"]]
    steps = [(t, l["step"]) for t, l in lines if "metrics" in l and "loss" in l["metrics"]]
    if len(steps) >= 3:  # from the first logged step on: warm-up and compile left out
        (t0, s0), (t1, s1) = steps[0], steps[-1]
        eps = (s1 - s0) * 128 / (t1 - t0)
    else:
        eps = (steps[-1][1] if steps else 0) * 128 / wall
    placed = [l["status"]["message"] for _, l in lines
              if "status" in l and l["status"].get("phase") == "compiled"]
    where = [p for m in placed for p in m.split("; ") if " on cuda" in p]
    rows.append(("CNN, 1 epoch, device_type gpu",
                 f"{eps:,.0f} examples/s, test accuracy {acc[-1]:.4f}, {wall:.0f} s in all"
                 + (f" ({where[0]})" if where else "")))
else:
    rows.append(("CNN, 1 epoch, device_type gpu", f"FAILED (exit {rc}): {err.strip()[-300:]}"))
    failed = True

W, S, B = 3, 12, 1024
mlp = {"display_name": "wide-mlp-gpu",
       "model": {"input_shape": [28, 28, 1], "layers": [{"type": "flatten"}] +
                 [{"type": "dense", "units": 4096, "activation": "relu"}] * 4 +
                 [{"type": "dense", "units": 10, "activation": "softmax"}]},
       "loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"],
       "dataset": {"name": "fashion-mnist", "validation": "none"},
       "pipeline": {"batch_size": B, "shuffle": True, "normalize": True, "take": (W + S) * B},
       "optimizer": {"type": "sgd", "learning_rate": 0.01}, "epochs": 1, "seed": 1,
       "log_every_steps": 1, "profile": {"steps": [W + 1, W + S]},
       "resources": {"device_type": "gpu", "devices": 1}}
# multiply-adds a step: forward, weight gradients, input gradients (none for the input)
dims = [784, 4096, 4096, 4096, 4096, 10]
fwd = sum(a * b for a, b in zip(dims, dims[1:]))
macs = B * (2 * fwd + fwd - dims[0] * dims[1])
rc, lines, wall, err, out = run(mlp, "mlp", threads)
if rc == 0:
    at = {l["step"]: t for t, l in lines if "metrics" in l and "loss" in l["metrics"]}
    ms = (at[W + S] - at[W]) / S * 1e3
    tflops = 2 * macs / (ms / 1e3) / 1e12
    with open(os.path.join(out, "profile.json")) as f:
        trace = json.load(f)["traceEvents"]
    n_steps = S
    gpu_ops = ("matmul", "relu", "relu_grad", "bias_add", "reduce_rows")
    gpu_us = sum(e["dur"] for e in trace if e.get("ph") == "X" and e.get("tid") == 2 and
                 e.get("args", {}).get("op") in gpu_ops)
    gpu_share = gpu_us / n_steps / 1e3 / ms
    # what crosses between host and device a step, as the graph counted it
    # (profile.txt: values stay on the GPU between its kernels; the batch
    # and the parameters go over, gradients and what CPU kernels read come
    # back)
    copied = 0.0
    with open(os.path.join(out, "profile.txt")) as f:
        for line in f:
            m = re.search(r"copied ([0-9.]+) MB to them and ([0-9.]+) MB back a profiled step",
                          line)
            if m:
                copied = (float(m.group(1)) + float(m.group(2))) * 1e6
    # host <-> device copy bandwidth, both ways, from pinned memory (kiln
    # pins the buffers its GPU kernels copy, where the CUDA module can)
    bw = None
    try:
        import torch
        x = torch.empty(64 << 20 >> 2).pin_memory()
        y = x.cuda()
        torch.cuda.synchronize()
        best = 1e9
        for _ in range(5):
            t0 = time.perf_counter()
            y.copy_(x, non_blocking=False)
            x.copy_(y, non_blocking=False)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        bw = 2 * x.numel() * 4 / best
    except Exception as e:  # no torch: no estimate
        print(f"(no copy bandwidth probe: {e})")
    copy_share = f"{copied / bw / (ms / 1e3):.0%}" if bw else "n/a"
    rows.append(("wide MLP 784-4x4096-10, batch 1024, float32, device_type gpu",
                 f"{ms:.1f} ms/step, {tflops:.2f} TFLOP/s = {tflops / peak:.1%} of {peak:g} "
                 f"dense float32; GPU nodes {gpu_share:.0%} of the step (their kernels are "
                 f"queued: the wait shows in the node whose input is copied back); "
                 f"copies alone ({copied / 1e9:.2f} GB a step at "
                 f"{(bw or 0) / 1e9:.1f} GB/s pinned) {copy_share}"))
else:
    rows.append(("wide MLP, float32, device_type gpu", f"FAILED (exit {rc}): {err.strip()[-300:]}"))
    failed = True
mlp_bf16 = dict(mlp, precision="mixed_bfloat16")
mlp_bf16.pop("profile")
rc, lines, wall, err, _ = run(mlp_bf16, "mlp_bf16", threads)
rows.append(("wide MLP, mixed_bfloat16, device_type gpu",
             "ran" if rc == 0 else f"refused (exit {rc}): {err.strip().splitlines()[-1][:200]}"))

# Model parallelism: the wide MLP's last three layers on the job's second GPU.
try:
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    n_gpus = sum(1 for l in listed.splitlines() if l.startswith("GPU"))
except OSError:
    n_gpus = 0
if n_gpus >= 2:
    split = json.loads(json.dumps(mlp))
    split.pop("profile")
    split["resources"]["devices"] = 2
    for layer in split["model"]["layers"][-3:]:
        layer["device"] = "cuda:1"
    rc, lines, wall, err, _ = run(split, "mlp_split", threads)
    if rc == 0:
        at = {l["step"]: t for t, l in lines if "metrics" in l and "loss" in l["metrics"]}
        split_ms = (at[W + S] - at[W]) / S * 1e3
        rows.append(("wide MLP, float32, split over cuda:0 and cuda:1",
                     f"{split_ms:.1f} ms/step (one GPU: "
                     + (f"{ms:.1f}" if "ms" in globals() else "n/a") + " ms/step)"))
    else:
        rows.append(("wide MLP, split over two GPUs", f"FAILED (exit {rc}): {err.strip()[-300:]}"))
        failed = True
else:
    rows.append(("wide MLP, split over two GPUs", f"skipped: {n_gpus} GPU(s) here"))

print()
print("| check | result |")
print("|---|---|")
for r in [l for f in ("r_test_cuda", "r_test_nccl", "r_test_placement")
          for l in open(os.path.join(work, f)).read().splitlines()]:
    name, _, res = r.partition(": ")
    print(f"| {name} | {res} |")
for name, res in rows:
    print(f"| {name} | {res} |")
sys.exit(1 if failed else 0)
EOF
[ $? -eq 0 ] || status=1
exit $status
