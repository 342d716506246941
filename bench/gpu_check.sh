#!/usr/bin/env bash
# The GPU check: one command on a machine with an NVIDIA GPU, a few minutes,
# one table. It builds kiln with CUDA (unless BUILD_DIR already holds such a
# build), then:
#   - test_cuda: every kernel kiln's CUDA backend runs (matmul in its four
#     transpose forms on odd sizes and on TF32 and bf16 tensor cores, relu
#     and its gradient with NaN, -0 and inf, a bias added to rows and its
#     gradient, im2col, col2im, max and average pooling and their
#     gradients, mixed_bfloat16's casts) on the device against plain CPU
#     loops; and again under compute-sanitizer's memcheck where the machine
#     has it;
#   - test_nccl: soft placement, NCCL communicators on the device (one
#     rank, and a timeout instead of a hang), mirrored replicas on two GPUs
#     against one (skipped, saying so, with fewer GPUs);
#   - test_engine_placement: GPU-placed graphs (dense, and a CNN in float32
#     and mixed_bfloat16) against the CPU, and a model split over two GPUs
#     (model parallelism) against one (skipped, saying so, with one GPU);
#   - the Fashion-MNIST CNN (examples/fmnist-cnn.json), one epoch with
#     resources.device_type gpu: examples/s against the 2-core machine's
#     (CPU_CNN_EPS, the zoo's cnn row), test accuracy;
#   - the step of a GEMM-bound model, a wide MLP (784 - 4 x 4096 - 10,
#     batch 1024 and 4096) in float32, TF32 (allow_tf32), mixed_bfloat16
#     and mixed_float16 (f16's dense peak is bf16's): ms a step, achieved TFLOP/s and its share of that
#     math's dense peak, the share of the step the host copies alone
#     explain (the bytes the graph copied a step, from its profile, over
#     this machine's pinned copy bandwidth), and PyTorch's step of the same
#     model on the same GPU (float32, TF32, bf16 and f16 autocast) as a
#     ratio;
#   - the zoo's ResNet, MobileNet, Inception and wide MLP (bench/specs/zoo)
#     for 60 steps each on the GPU: examples/s, and how many kernels ran
#     there;
#   - with two GPUs, the wide MLP split over them (its last three layers on
#     cuda:1): ms a step against the one-GPU figure;
# and prints the table.
#
#   bash bench/gpu_check.sh [BUILD_DIR] [DATA_DIR]
#
# BUILD_DIR defaults to build-gpu (Release, KILN_CUDA=ON); DATA_DIR holds
# fashion-mnist/*.gz (default /usr/share/datasets). The dense peaks (an
# H100/H200 SXM's datasheet figures by default) are PEAK_TFLOPS (float32,
# 67), PEAK_TF32_TFLOPS (494.7) and PEAK_BF16_TFLOPS (989.4). Exit status:
# 0 when every check ran and passed.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
data=${2:-/usr/share/datasets}
peak=${PEAK_TFLOPS:-67}
peak_tf32=${PEAK_TF32_TFLOPS:-494.7}
peak_bf16=${PEAK_BF16_TFLOPS:-989.4}
# the Fashion-MNIST CNN's examples/s on the 2-core machine kiln's other
# benches run on (bench/README, zoo's cnn row): the GPU's target is 10x
cpu_cnn=${CPU_CNN_EPS:-5989}
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
# test_cuda again under compute-sanitizer (out-of-bounds and misaligned
# accesses, leaks), where the machine has it
if command -v compute-sanitizer > /dev/null; then
  if timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$build/tests/cuda/test_cuda" > "$work/sanitizer.log" 2>&1; then
    echo "test_cuda under compute-sanitizer memcheck: no errors" > "$work/r_sanitizer"
  else
    status=1
    echo "test_cuda under compute-sanitizer memcheck: FAILED: $(grep -m2 'ERROR\|Invalid' \
      "$work/sanitizer.log" | tr '\n' ' ')" > "$work/r_sanitizer"
  fi
else
  echo "test_cuda under compute-sanitizer memcheck: skipped (no compute-sanitizer here)" \
    > "$work/r_sanitizer"
fi
cat "$work/r_test_cuda" "$work/r_sanitizer" "$work/r_test_nccl" "$work/r_test_placement"

# The training runs and the table.
PEAK=$peak PEAK_TF32=$peak_tf32 PEAK_BF16=$peak_bf16 CPU_CNN=$cpu_cnn \
  "$python" - "$build" "$data" "$work" <<'EOF'
import json, os, re, subprocess, sys, time

build, data, work = sys.argv[1:4]
peak = float(os.environ["PEAK"])
peak_tf32 = float(os.environ["PEAK_TF32"])
peak_bf16 = float(os.environ["PEAK_BF16"])
cpu_cnn = float(os.environ["CPU_CNN"])
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
                 f"{eps:,.0f} examples/s = {eps / cpu_cnn:.1f}x the 2-core machine's "
                 f"{cpu_cnn:,.0f}, test accuracy {acc[-1]:.4f}, {wall:.0f} s in all"
                 + (f" ({where[0]})" if where else "")))
else:
    rows.append(("CNN, 1 epoch, device_type gpu", f"FAILED (exit {rc}): {err.strip()[-300:]}"))
    failed = True

W, S, B = 3, 12, 1024
dims = [784, 4096, 4096, 4096, 4096, 10]


def wide_mlp(batch, precision="float32", tf32=False, profile=True):
    spec = {"display_name": "wide-mlp-gpu",
            "model": {"input_shape": [28, 28, 1], "layers": [{"type": "flatten"}] +
                      [{"type": "dense", "units": 4096, "activation": "relu"} for _ in range(4)] +
                      [{"type": "dense", "units": 10, "activation": "softmax"}]},
            "loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"],
            "dataset": {"name": "fashion-mnist", "validation": "none"},
            "pipeline": {"batch_size": batch, "shuffle": True, "normalize": True,
                         "take": (W + S) * batch},
            "optimizer": {"type": "sgd", "learning_rate": 0.01}, "epochs": 1, "seed": 1,
            "log_every_steps": 1, "precision": precision, "allow_tf32": tf32,
            "resources": {"device_type": "gpu", "devices": 1}}
    if profile:
        spec["profile"] = {"steps": [W + 1, W + S]}
    return spec


def step_flop(batch):
    # multiply-adds a step: forward, weight gradients, input gradients (none for the input)
    fwd = sum(a * b for a, b in zip(dims, dims[1:]))
    return 2 * batch * (3 * fwd - dims[0] * dims[1])


# host <-> device copy bandwidth, both ways, from pinned memory (kiln pins
# the buffers its GPU kernels copy, where the CUDA module can)
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


def torch_step_ms(batch, mode):
    """PyTorch's step of the same model on the same GPU, ms (None without torch)."""
    try:
        import torch
        torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
        layers = []
        for a, b in zip(dims[:-1], dims[1:]):
            layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
        m = torch.nn.Sequential(*layers[:-1]).cuda()
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        x = torch.randn(batch, 784, device="cuda")
        y = torch.randint(0, 10, (batch,), device="cuda")

        def step():
            opt.zero_grad(set_to_none=True)
            dtype = torch.float16 if mode == "f16" else torch.bfloat16
            with torch.autocast("cuda", dtype=dtype, enabled=mode in ("bf16", "f16")):
                loss = torch.nn.functional.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            return loss

        for _ in range(W):
            step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(S):
            loss = step()
        loss.item()  # kiln reads its loss every step too
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / S * 1e3
    except Exception as e:
        print(f"(no PyTorch step for {mode}: {e})")
        return None


# The GEMM-bound step: float32, TF32 (allow_tf32) and mixed_bfloat16, at
# batch 1024 and 4096, against each math's dense peak and PyTorch's step.
peaks = {"float32": peak, "tf32": peak_tf32, "bf16": peak_bf16, "f16": peak_bf16}
mlp_ms = {}
# GPU_CHECK_BATCHES="64": smaller runs, to try the script
for batch in [int(b) for b in os.environ.get("GPU_CHECK_BATCHES", "1024 4096").split()]:
    for mode in ("float32", "tf32", "bf16", "f16"):
        precision = {"bf16": "mixed_bfloat16", "f16": "mixed_float16"}.get(mode, "float32")
        spec = wide_mlp(batch, precision, mode == "tf32")
        name = f"mlp_{mode}_{batch}"
        rc, lines, wall, err, out = run(spec, name, threads)
        label = f"wide MLP 784-4x4096-10, batch {batch}, {mode}"
        if rc != 0:
            rows.append((label, f"FAILED (exit {rc}): {err.strip()[-300:]}"))
            failed = True
            continue
        at = {l["step"]: t for t, l in lines if "metrics" in l and "loss" in l["metrics"]}
        ms = (at[W + S] - at[W]) / S * 1e3
        mlp_ms[(batch, mode)] = ms
        tflops = step_flop(batch) / (ms / 1e3) / 1e12
        copied = 0.0  # what crosses a step, as the graph counted it (profile.txt)
        with open(os.path.join(out, "profile.txt")) as f:
            for line in f:
                m = re.search(r"copied ([0-9.]+) MB to them and ([0-9.]+) MB back a profiled step",
                              line)
                if m:
                    copied = (float(m.group(1)) + float(m.group(2))) * 1e6
        copy_share = f"{copied / bw / (ms / 1e3):.1%}" if bw else "n/a"
        theirs = torch_step_ms(batch, mode)
        vs = f"; PyTorch {theirs:.2f} ms/step ({theirs / ms:.2f}x)" if theirs else ""
        rows.append((label,
                     f"{ms:.2f} ms/step, {tflops:.1f} TFLOP/s = {tflops / peaks[mode]:.1%} of "
                     f"{peaks[mode]:g} dense {mode}; copies {copied / 1e6:.2f} MB a step = "
                     f"{copy_share} of it at {(bw or 0) / 1e9:.1f} GB/s pinned{vs}"))
ms = mlp_ms.get((1024, "float32"))

# The zoo's models (bench/specs/zoo) on the GPU: 60 steps each
# (GPU_CHECK_ZOO_STEPS), examples/s from the second logged step on, and
# what ran where.
for name in os.environ.get("GPU_CHECK_ZOO", "resnet mobilenet inception wide_mlp").split():
    with open(os.path.join("bench", "specs", "zoo", name + ".json")) as f:
        spec = json.load(f)
    batch = spec["pipeline"]["batch_size"]
    spec["epochs"] = 1
    spec["log_every_steps"] = 5
    spec["pipeline"]["take"] = int(os.environ.get("GPU_CHECK_ZOO_STEPS", "60")) * batch
    if spec["dataset"].get("name") == "fashion-mnist":
        spec["dataset"]["validation"] = "none"
    spec.pop("profile", None)
    spec["resources"] = {"device_type": "gpu", "devices": 1}
    rc, lines, wall, err, _ = run(spec, "zoo_" + name, threads)
    label = f"zoo {name} (batch {batch}), device_type gpu"
    if rc != 0:
        rows.append((label, f"FAILED (exit {rc}): {err.strip()[-300:]}"))
        failed = True
        continue
    steps = [(t, l["step"]) for t, l in lines if "metrics" in l and "loss" in l["metrics"]]
    placed = [l["status"]["message"] for _, l in lines
              if "status" in l and l["status"].get("phase") == "compiled"]
    where = [p for m in placed for p in m.split("; ") if " on cuda" in p]
    if len(steps) >= 4:
        (t0, s0), (t1, s1) = steps[1], steps[-1]
        rows.append((label, f"{(s1 - s0) * batch / (t1 - t0):,.0f} examples/s"
                     + (f" ({where[0]})" if where else "")))
    else:
        rows.append((label, f"too few steps logged to time ({len(steps)})"))

# Model parallelism: the wide MLP's last three layers on the job's second GPU.
try:
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    n_gpus = sum(1 for l in listed.splitlines() if l.startswith("GPU"))
except OSError:
    n_gpus = 0
if n_gpus >= 2:
    split = wide_mlp(B, profile=False)
    split["resources"]["devices"] = 2
    for layer in split["model"]["layers"][-3:]:
        layer["device"] = "cuda:1"
    rc, lines, wall, err, _ = run(split, "mlp_split", threads)
    if rc == 0:
        at = {l["step"]: t for t, l in lines if "metrics" in l and "loss" in l["metrics"]}
        split_ms = (at[W + S] - at[W]) / S * 1e3
        rows.append(("wide MLP, float32, split over cuda:0 and cuda:1",
                     f"{split_ms:.1f} ms/step (one GPU: "
                     + (f"{ms:.1f}" if ms else "n/a") + " ms/step)"))
    else:
        rows.append(("wide MLP, split over two GPUs", f"FAILED (exit {rc}): {err.strip()[-300:]}"))
        failed = True
else:
    rows.append(("wide MLP, split over two GPUs", f"skipped: {n_gpus} GPU(s) here"))

print()
print("| check | result |")
print("|---|---|")
for r in [l for f in ("r_test_cuda", "r_sanitizer", "r_test_nccl", "r_test_placement")
          for l in open(os.path.join(work, f)).read().splitlines()]:
    name, _, res = r.partition(": ")
    print(f"| {name} | {res} |")
for name, res in rows:
    print(f"| {name} | {res} |")
sys.exit(1 if failed else 0)
EOF
[ $? -eq 0 ] || status=1
exit $status
