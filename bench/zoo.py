"""The model zoo: kiln-train against PyTorch on seven models that together
use every layer type and activation a job spec accepts.

  /usr/bin/python3 bench/zoo.py [--build build-rel] [--repeats 3] [--quick]
                                [--models a,b] [--accuracy] [--seeds 2]
                                [--precision] [--json zoo.json]

Models: bench/specs/zoo/*.json, trained by kiln-train as a user runs them;
their PyTorch twins are built from the same specs by bench/torch_zoo.py.
--models also takes paths of other spec files (any model a user sends;
bench/specs/other/ holds a few that are not in the zoo).
Speed: each run trains WARMUP steps, then STEPS more; kiln's examples/s are
read from the times its --json progress lines arrive (a line every 5
steps), PyTorch's from its own clock around the same steps. Both read the
real data set (Fashion-MNIST, or the regression CSV this script writes),
so peak RSS (each process's own, from wait4) holds the data set in both.
Every row is the median of --repeats runs, kiln's and PyTorch's
interleaved; PyTorch runs with the caching malloc setting of
bench/torch_best.py, with the BLAS thread variables unset and with
OPENBLAS_NUM_THREADS=1 in the first repeat, and only the faster of the
two in the later ones. Then one
profiled kiln-train run a model and thread count (the spec's "profile"
option) gives the costliest nodes, their share of the step and, for
memory-bound nodes, an estimate of the bytes they move per second against
kiln-bench-stream's triad bandwidth (a node's output bytes from the trace,
plus its layer's input activations, plus, for a backward node, the layer's
output gradient; layer sizes from a shape walk over the spec). --accuracy trains each recipe for its
epochs with --seeds seeds in both frameworks (mean test accuracy, or test
MSE for the regression; kiln at 2 threads, PyTorch at 1, which it runs
faster on a busy machine). --precision compares kiln with itself instead:
float32 against mixed_bfloat16, examples/s (runs interleaved) and, with
--accuracy, test accuracy in both. Prints markdown tables; --json writes
them all."""
import argparse
import atexit
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from torch_best import TUNABLES  # noqa: E402

PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
SPECS = os.path.join(ROOT, "bench", "specs", "zoo")
DATA = "/usr/share/datasets"
BLAS_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "GOTO_NUM_THREADS")
TORCH_SETTINGS = (("unset", {}), ("OPENBLAS_NUM_THREADS=1", {"OPENBLAS_NUM_THREADS": "1"}))
REGRESSION_ID = "ds-5a00000000000001"


def log_every(steps):
    """A progress line every step for the slow models, every 5 for the rest."""
    return 1 if steps <= 40 else 5

# model: (warm-up steps, timed steps, --quick timed steps, speed target vs PyTorch, what it is)
MODELS = {
    "mlp": (10, 150, 50, 1.5, "784-512-256-10 ReLU (bench/engine.py's MLP)"),
    "cnn": (5, 30, 10, 1.5, "conv 32, pool, conv 64, pool, dense 128 (engine.py's CNN)"),
    "resnet": (3, 10, 4, 2.0, "stem 16 + 3 residual blocks 16/32/64 (stride-2 convs, batch norm, add), GAP"),
    "mobilenet": (3, 10, 4, 2.0, "stride-2 stem 16, 4 depthwise-separable blocks 32-128 + separable_conv2d, "
                  "batch norm, GAP"),
    "wide_mlp": (5, 40, 15, 1.5, "784-1024-1024-512-10, leaky ReLU, ELU, GELU, dropout"),
    "inception": (3, 10, 4, 1.5, "branches of 1x1 / 3x3 / avg-pool convs concatenated, tanh, "
                  "sigmoid, GAP"),
    "regression": (20, 960, 300, 1.5, "CSV, 8 features, dense 64 tanh, 64 sigmoid, 1; MSE"),
}


# A model named by a path to a spec file (any model a user might send) runs
# with these step counts and the 1.5x target.
OTHER = (3, 10, 4, 1.5, "a spec from a file")


def spec_path(model):
    return model if model.endswith(".json") else os.path.join(SPECS, model + ".json")


def about(model):
    return MODELS.get(model, OTHER)


def spec_of(model):
    with open(spec_path(model)) as f:
        return json.load(f)


def write_regression_csv(uploads):
    """40,000 rows of 8 standard-normal features and a smooth target plus
    noise (numpy's generator, seed 5), as an upload kiln-train reads."""
    import numpy as np
    d = os.path.join(uploads, REGRESSION_ID)
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((40000, 8)).astype(np.float32)
    y = (np.sin(x[:, 0]) + 0.5 * x[:, 1] * x[:, 2] + 0.3 * x[:, 3] ** 2 - np.tanh(x[:, 4])
         + 0.2 * x[:, 5] + 0.1 * rng.standard_normal(40000)).astype(np.float32)
    path = os.path.join(d, "upload.bin")
    with open(path, "w") as f:
        f.write(",".join([f"x{i}" for i in range(8)] + ["y"]) + "\n")
        for row, t in zip(x, y):
            f.write(",".join(f"{v:.6f}" for v in row) + f",{t:.6f}\n")
    with open(os.path.join(d, "dataset.json"), "w") as f:
        json.dump({"id": REGRESSION_ID, "format": "csv", "label_column": "y"}, f)
    return path


def wait_rss(proc):
    """Waits for proc; its exit status and peak RSS in MiB."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss / 1024.0


def kiln_run(build, spec, threads, workdir, uploads, extra_args=()):
    """Runs kiln-train --json on spec; (progress lines with arrival times, rss)."""
    path = os.path.join(workdir, "spec.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    out = os.path.join(workdir, "out")
    argv = [os.path.join(build, "worker", "kiln-train"), "--json", "--threads", str(threads),
            "--data-dir", DATA, "--uploads-dir", uploads, "--checkpoint-dir", out, path]
    proc = subprocess.Popen(argv + list(extra_args), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, bufsize=1)
    lines = []
    for line in proc.stdout:
        lines.append((time.perf_counter(), line))
    err = proc.stderr.read()
    rc, rss = wait_rss(proc)
    if rc != 0:
        sys.exit(f"kiln-train failed ({rc}) on {spec['display_name']}:\n"
                 + "".join(l for _, l in lines) + err)
    return [(t, json.loads(l)) for t, l in lines if l.startswith("{")], rss


def timed_spec(model, warm, steps, precision=None):
    spec = spec_of(model)
    if precision:
        spec["precision"] = precision
    spec["pipeline"]["take"] = (warm + steps) * spec["pipeline"]["batch_size"]
    spec["epochs"] = 1
    spec["log_every_steps"] = log_every(warm + steps)
    spec["dataset"] = {"name": spec["dataset"]["name"], "validation": "none"}
    return spec


def kiln_speed(build, model, threads, warm, steps, uploads, precision=None):
    with tempfile.TemporaryDirectory() as wd:
        lines, rss = kiln_run(build, timed_spec(model, warm, steps, precision), threads, wd,
                              uploads)
    at = {}
    arena = None
    for t, l in lines:
        if "metrics" in l and "loss" in l["metrics"]:
            at.setdefault(l["step"], t)
        if "status" in l and l["status"]["phase"] == "compiled":
            m = re.search(r"activations planned in ([0-9.]+) MiB", l["status"]["message"])
            arena = float(m.group(1)) if m else None
    last = max(at)
    batch = spec_of(model)["pipeline"]["batch_size"]
    eps = (last - warm) * batch / (at[last] - at[warm])
    return {"examples_per_s": eps, "peak_rss_mib": rss, "arena_mib": arena}


def torch_speed(model, threads, warm, steps, setting, csv):
    env = dict(os.environ)
    for v in BLAS_VARS:
        env.pop(v, None)
    env.update(TUNABLES)
    env.update(dict(TORCH_SETTINGS)[setting])
    argv = [PY, os.path.join(ROOT, "bench", "torch_zoo.py"), "speed",
            spec_path(model), str(threads), str(warm), str(steps), DATA]
    if csv:
        argv.append(csv)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    out = proc.stdout.read()
    err = proc.stderr.read()
    rc, rss = wait_rss(proc)
    if rc != 0:
        sys.exit(f"torch_zoo.py failed on {model}:\n{out}\n{err}")
    r = json.loads(out.strip().splitlines()[-1])
    r["peak_rss_mib"] = rss
    return r


# ---- the profile: costliest nodes, and bytes moved by the memory-bound ones ----

def layer_bytes(spec):
    """Each layer's (input bytes, output bytes) for one batch of float32,
    from a shape walk over the spec (NHWC, as kiln plans)."""
    batch = spec["pipeline"]["batch_size"]
    shapes = {"input": tuple(spec["model"]["input_shape"])}
    prev, out = "input", {}
    for i, l in enumerate(spec["model"]["layers"]):
        name = l.get("name", f"{l['type']}_{i}")
        ins = [shapes[n] for n in l.get("inputs", [prev])]
        s = ins[0]
        t = l["type"]
        if t == "dense":
            o = (l["units"],)
        elif t == "flatten":
            o = (prod(s),)
        elif t in ("conv2d", "depthwise_conv2d", "separable_conv2d", "max_pool2d", "avg_pool2d"):
            pool = t.endswith("pool2d")
            k = l.get("pool_size" if pool else "kernel_size", 2 if pool else 3)
            k = k if isinstance(k, list) else [k, k]
            st = l.get("strides", k if pool else 1)
            st = st if isinstance(st, list) else [st, st]
            if l.get("padding", "valid") == "same":
                h, w = -(-s[0] // st[0]), -(-s[1] // st[1])
            else:
                h, w = (s[0] - k[0]) // st[0] + 1, (s[1] - k[1]) // st[1] + 1
            c = l["filters"] if "filters" in l else s[2] * l.get("depth_multiplier", 1)
            o = (h, w, c)
        elif t == "global_avg_pool2d":
            o = (s[2],)
        elif t == "concatenate":
            o = s[:-1] + (sum(x[-1] for x in ins),)
        else:
            o = s
        shapes[name] = o
        out[name] = (sum(prod(x) for x in ins) * 4 * batch, prod(o) * 4 * batch)
        prev = name
    return out


def prod(xs):
    p = 1
    for x in xs:
        p *= x
    return p


def compute_bound(op):
    """GEMM nodes. A bias's reduce_rows runs its layer's weight-gradient GEMM
    (the bias_grad_in_gemm pass), and conv_input_grad is one GEMM over the
    padded gradient; every other node is counted as memory-bound."""
    return ("matmul" in op or "gemm" in op or op == "phase"
            or op in ("conv2d", "im2col", "reduce_rows", "conv_input_grad"))


def kiln_profile(build, model, threads, uploads, warm, steps, triad_gbs, top=5):
    spec = timed_spec(model, warm, steps)
    spec["profile"] = {"steps": [warm + 1, warm + steps]}
    with tempfile.TemporaryDirectory() as wd:
        kiln_run(build, spec, threads, wd, uploads)
        with open(os.path.join(wd, "out", "profile.json")) as f:
            trace = json.load(f)["traceEvents"]
        with open(os.path.join(wd, "out", "profile.txt")) as f:
            head = f.readline()
    m = re.match(r"(\d+) profiled steps, ([0-9.]+) ms a step", head)
    n_steps, step_ms = int(m.group(1)), float(m.group(2))
    nodes = {}
    for e in trace:
        if e.get("ph") != "X" or e.get("tid") != 2:
            continue
        args = e.get("args", {})
        n = nodes.setdefault(e["name"], {"op": args.get("op", "phase"),
                                         "bytes": args.get("bytes", 0),
                                         "pass": e["cat"], "us": 0.0})
        n["us"] += e["dur"]
    sizes = layer_bytes(spec_of(model))
    rows = []
    for name, n in sorted(nodes.items(), key=lambda kv: -kv[1]["us"])[:top]:
        ms = n["us"] / n_steps / 1e3
        row = {"node": name, "op": n["op"], "pass": n["pass"], "ms": ms,
               "share": ms / step_ms}
        if n["op"] != "phase":
            path = name.split(":", 1)[1]
            if path.startswith("grad/"):
                path = path[5:]
            layer = path.split("/")[0].split(".")[0]
            lin, lout = sizes.get(layer, (n["bytes"], 0))
            moved = n["bytes"] + lin + (lout if n["pass"] == "backward" else 0)
            row["est_bytes"] = moved
            row["gbs"] = moved / (ms / 1e3) / 1e9
            row["of_triad"] = row["gbs"] / triad_gbs
        rows.append(row)
    by_op = {}
    for n in nodes.values():
        by_op[n["op"]] = by_op.get(n["op"], 0.0) + n["us"] / n_steps / 1e3 / step_ms
    return {"step_ms": step_ms, "top": rows,
            "by_op": dict(sorted(by_op.items(), key=lambda kv: -kv[1])[:6])}


def kiln_accuracy(build, model, seed, uploads, precision=None):
    spec = spec_of(model)
    spec["seed"] = seed
    if precision:
        spec["precision"] = precision
    spec["log_every_steps"] = 1000
    with tempfile.TemporaryDirectory() as wd:
        t0 = time.perf_counter()
        lines, _ = kiln_run(build, spec, 2, wd, uploads)
        wall = time.perf_counter() - t0
    key = "val_loss" if spec["loss"] == "mse" else "val_accuracy"
    vals = [l["metrics"][key] for _, l in lines if "metrics" in l and key in l["metrics"]]
    return vals[-1], wall


def torch_accuracy(model, seed, csv):
    spec = spec_of(model)
    env = dict(os.environ)
    for v in BLAS_VARS:
        env.pop(v, None)
    env.update(TUNABLES)
    argv = [PY, os.path.join(ROOT, "bench", "torch_zoo.py"), "train",
            spec_path(model), "1", str(spec["epochs"]), str(seed), DATA]
    if csv:
        argv.append(csv)
    out = subprocess.run(argv, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"torch_zoo.py train failed on {model}:\n{out.stdout}\n{out.stderr}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return r.get("test_mse", r.get("test_accuracy")), r["train_s"]


def fmt(x, digits=0):
    return f"{x:,.{digits}f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build-rel"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 1 repeat, fewer steps, one BLAS setting, one profile")
    ap.add_argument("--models", default=",".join(MODELS),
                    help="zoo names, or paths of other spec files (.json) to run the same way")
    ap.add_argument("--accuracy", action="store_true")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--first-seed", type=int, default=42,
                    help="with --accuracy: the seeds are first-seed .. first-seed + seeds - 1")
    ap.add_argument("--no-speed", action="store_true", help="with --accuracy: accuracy only")
    ap.add_argument("--profile-only", action="store_true", help="kiln's profiles, no timing")
    ap.add_argument("--profile-top", type=int, default=5,
                    help="the costliest nodes a profile lists (60: every node of note)")
    ap.add_argument("--precision", action="store_true",
                    help="kiln in float32 against kiln in mixed_bfloat16 instead of against "
                    "PyTorch: examples/s, and with --accuracy test accuracy, in both")
    ap.add_argument("--json", default=None, help="where to write every figure")
    ap.add_argument("--tables-from", default=None, help="print the tables of a --json file")
    args = ap.parse_args()
    if args.tables_from:
        with open(args.tables_from) as f:
            print_tables(json.load(f))
        return
    models = args.models.split(",")
    threads = [int(t) for t in args.threads.split(",")]
    repeats = 1 if args.quick else args.repeats
    result = {"load_before": os.getloadavg(), "models": {}, "speed": [], "profile": {},
              "accuracy": []}
    started = time.perf_counter()
    uploads = tempfile.mkdtemp(prefix="kiln-zoo-")
    atexit.register(shutil.rmtree, uploads, True)
    csv = write_regression_csv(uploads)

    stream = json.loads(subprocess.run([os.path.join(args.build, "bench", "kiln-bench-stream")],
                                       capture_output=True, text=True, check=True).stdout)
    result["stream"] = stream
    print(f"STREAM-style bandwidth, GB/s: copy {stream['copy_gbs'][0]} / {stream['copy_gbs'][1]}, "
          f"triad {stream['triad_gbs'][0]} / {stream['triad_gbs'][1]} (1 / 2 threads)",
          flush=True)
    for m in models:
        result["models"][m] = about(m)[4]

    if args.precision:
        result["precision"] = precision_runs(args, models, threads, repeats, uploads)
    if not args.no_speed and not args.profile_only and not args.precision:
        runs = {(m, t): {"kiln": [], "unset": [], "OPENBLAS_NUM_THREADS=1": []}
                for m in models for t in threads}
        chosen = {}
        for r in range(repeats):
            for m in models:
                warm, steps, quick_steps = about(m)[:3]
                steps = quick_steps if args.quick else steps
                for t in threads:
                    rr = runs[(m, t)]
                    rr["kiln"].append(kiln_speed(args.build, m, t, warm, steps, uploads))
                    # Both BLAS settings in the first repeat; the faster one after.
                    # --quick: the setting engine.py found faster at this thread count.
                    settings = [s for s, _ in TORCH_SETTINGS] if r == 0 else [chosen[(m, t)]]
                    if args.quick:
                        settings = [TORCH_SETTINGS[0 if t == 1 else 1][0]]
                    for setting in settings:
                        rr[setting].append(torch_speed(m, t, warm, steps, setting,
                                                       csv if m == "regression" else None))
                    if r == 0 or args.quick:
                        chosen[(m, t)] = max(settings, key=lambda s: rr[s][0]["examples_per_s"])
                    print(f"  repeat {r + 1}/{repeats} {m} {t}: kiln "
                          f"{rr['kiln'][-1]['examples_per_s']:.0f}, torch "
                          + " / ".join(f"{s} {rr[s][-1]['examples_per_s']:.0f}"
                                       for s in settings), flush=True)
        for m in models:
            for t in threads:
                rr = runs[(m, t)]
                rr = {k: v for k, v in rr.items() if v}
                med = {k: statistics.median(x["examples_per_s"] for x in v) for k, v in rr.items()}
                rss = {k: statistics.median(x["peak_rss_mib"] for x in v) for k, v in rr.items()}
                best = chosen[(m, t)]
                result["speed"].append({
                    "model": m, "threads": t, "kiln_examples_per_s": med["kiln"],
                    "torch_examples_per_s": med[best], "torch_setting": best,
                    "torch_examples_per_s_by_setting": {s: med[s] for s in med if s != "kiln"},
                    "ratio": med["kiln"] / med[best], "target": about(m)[3],
                    "kiln_peak_rss_mib": rss["kiln"], "torch_peak_rss_mib": rss[best],
                    "rss_ratio": rss["kiln"] / rss[best],
                    "kiln_arena_mib": rr["kiln"][0]["arena_mib"],
                    "runs": {k: [x["examples_per_s"] for x in v] for k, v in rr.items()}})
    if not args.no_speed and not args.precision:
        for m in models:
            warm, steps, quick_steps = about(m)[:3]
            steps = quick_steps if args.quick else steps
            for t in threads[:1] if args.quick else threads:
                result["profile"][f"{m},{t}"] = kiln_profile(
                    args.build, m, t, uploads, warm, steps, stream["triad_gbs"][t - 1],
                    args.profile_top)

    if args.accuracy and not args.precision:
        for m in models:
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                k, kw = kiln_accuracy(args.build, m, seed, uploads)
                p, pw = torch_accuracy(m, seed, csv if m == "regression" else None)
                result["accuracy"].append({"model": m, "seed": seed, "kiln": k, "torch": p,
                                           "kiln_wall_s": kw, "torch_train_s": pw})
                print(f"  accuracy {m} seed {seed}: kiln {k:.4f} torch {p:.4f}", flush=True)

    result["load_after"] = os.getloadavg()
    result["seconds"] = time.perf_counter() - started
    print_tables(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


PRECISIONS = ("float32", "mixed_bfloat16")


def precision_runs(args, models, threads, repeats, uploads):
    """kiln in both precisions: examples/s (runs interleaved, medians) and,
    with --accuracy, test accuracy per seed."""
    out = {"speed": [], "accuracy": []}
    if not args.no_speed:
        runs = {(m, t, p): [] for m in models for t in threads for p in PRECISIONS}
        for r in range(repeats):
            for m in models:
                warm, steps, quick_steps = about(m)[:3]
                steps = quick_steps if args.quick else steps
                for t in threads:
                    for p in PRECISIONS:
                        runs[(m, t, p)].append(kiln_speed(args.build, m, t, warm, steps,
                                                          uploads, p))
                    print(f"  repeat {r + 1}/{repeats} {m} {t}: "
                          + ", ".join(f"{p} {runs[(m, t, p)][-1]['examples_per_s']:.0f}"
                                      for p in PRECISIONS), flush=True)
        for m in models:
            for t in threads:
                med = {p: statistics.median(x["examples_per_s"] for x in runs[(m, t, p)])
                       for p in PRECISIONS}
                out["speed"].append({
                    "model": m, "threads": t, "float32": med["float32"],
                    "mixed_bfloat16": med["mixed_bfloat16"],
                    "ratio": med["mixed_bfloat16"] / med["float32"],
                    "arena_mib": {p: runs[(m, t, p)][0]["arena_mib"] for p in PRECISIONS},
                    "runs": {p: [x["examples_per_s"] for x in runs[(m, t, p)]]
                             for p in PRECISIONS}})
    if args.accuracy:
        for m in models:
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                row = {"model": m, "seed": seed}
                for p in PRECISIONS:
                    row[p], row[p + "_wall_s"] = kiln_accuracy(args.build, m, seed, uploads, p)
                out["accuracy"].append(row)
                print(f"  accuracy {m} seed {seed}: float32 {row['float32']:.4f} "
                      f"mixed_bfloat16 {row['mixed_bfloat16']:.4f}", flush=True)
    return out


def print_precision(pr):
    if pr["speed"]:
        print("| model | threads | float32 ex/s | mixed_bfloat16 ex/s | bf16 / float32 | target "
              "| arena float32 / bf16 (MiB) |")
        print("|---|---|---|---|---|---|---|")
        for s in pr["speed"]:
            ok = "" if s["ratio"] >= 1.3 else " (below)"
            a = s["arena_mib"]
            print(f"| {s['model']} | {s['threads']} | {fmt(s['float32'])} | "
                  f"{fmt(s['mixed_bfloat16'])} | **{s['ratio']:.2f}**{ok} | 1.3 | "
                  f"{a['float32']:.1f} / {a['mixed_bfloat16']:.1f} |")
    if pr["accuracy"]:
        print("\n| model | seeds | float32 (mean) | mixed_bfloat16 (mean) | gap (points) |")
        print("|---|---|---|---|---|")
        by = {}
        for a in pr["accuracy"]:
            by.setdefault(a["model"], []).append(a)
        for m, rows in by.items():
            f = statistics.mean(a["float32"] for a in rows)
            b = statistics.mean(a["mixed_bfloat16"] for a in rows)
            print(f"| {m} | {len(rows)} | {f:.4f} | {b:.4f} | {100 * (b - f):+.2f} |")


def print_tables(result):
    la, lb = result["load_before"], result["load_after"]
    print(f"\nload average {la[0]:.1f} before, {lb[0]:.1f} after; {result['seconds']:.0f} s\n")
    if result.get("precision"):
        print_precision(result["precision"])
    if result["speed"]:
        print("| model | threads | kiln ex/s | PyTorch ex/s (BLAS setting) | kiln / PyTorch | target "
              "| peak RSS kiln / PyTorch (MiB) | RSS ratio (target <= 0.33) | kiln arena (MiB) |")
        print("|---|---|---|---|---|---|---|---|---|")
        for s in result["speed"]:
            ok = "" if s["ratio"] >= s["target"] else " (below)"
            print(f"| {s['model']} | {s['threads']} | {fmt(s['kiln_examples_per_s'])} | "
                  f"{fmt(s['torch_examples_per_s'])} ({s['torch_setting']}) | "
                  f"**{s['ratio']:.2f}**{ok} | {s['target']} | {s['kiln_peak_rss_mib']:.0f} / "
                  f"{s['torch_peak_rss_mib']:.0f} | {s['rss_ratio']:.2f} | "
                  f"{s['kiln_arena_mib']:.1f} |")
    if result["profile"]:
        st = result["stream"]["triad_gbs"]
        print(f"\nkiln's costliest nodes (profiled steps; memory-bound nodes: estimated bytes "
              f"moved / time, against triad {st[0]} / {st[1]} GB/s)\n")
        print("| model, threads | step ms | node | pass | ms | share | est. GB/s (of triad) |")
        print("|---|---|---|---|---|---|---|")
        for key, p in result["profile"].items():
            for i, n in enumerate(p["top"]):
                bw = ("phase" if n["op"] == "phase" else "GEMM" if compute_bound(n["op"])
                      else f"{n['gbs']:.2f} ({n['of_triad']:.0%})")
                head = f"{key} | {p['step_ms']:.1f}" if i == 0 else " | "
                print(f"| {head} | `{n['node']}` | {n['pass'][:3]} | {n['ms']:.2f} | "
                      f"{n['share']:.1%} | {bw} |")
    if any("by_op" in p for p in result["profile"].values()):
        print("\nkiln's step by op kind (share of the profiled step, the six largest)\n")
        print("| model, threads | step ms | op kinds |")
        print("|---|---|---|")
        for key, p in result["profile"].items():
            ops = ", ".join(f"{op} {share:.0%}" for op, share in p.get("by_op", {}).items())
            print(f"| {key} | {p['step_ms']:.1f} | {ops} |")
    if result["accuracy"]:
        print("\n| model | seeds | kiln (mean) | PyTorch (mean) | gap (points; MSE for regression) |")
        print("|---|---|---|---|---|")
        by = {}
        for a in result["accuracy"]:
            by.setdefault(a["model"], []).append(a)
        for m, rows in by.items():
            k = statistics.mean(a["kiln"] for a in rows)
            p = statistics.mean(a["torch"] for a in rows)
            gap = f"{k - p:+.4f}" if m == "regression" else f"{100 * (k - p):+.2f}"
            print(f"| {m} | {len(rows)} | {k:.4f} | {p:.4f} | {gap} |")


if __name__ == "__main__":
    main()
