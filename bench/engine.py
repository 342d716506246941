"""The engine benchmark: kiln and PyTorch side by side in one run on the same
models (the MLP 784-512-256-10 and the CNN conv3x3 1->32, pool, conv3x3
32->64, pool, dense 128, dense 10), batch 128, Adam, fp32, at 1 and 2
threads. Reports ms/step, samples/s, achieved GFLOP/s and its share of this
machine's FMA peak (measured here by kiln-fma-peak), peak RSS, the optimized
plan against the unoptimized one (no passes, no buffer reuse) on the CNN, and with --accuracy the Fashion-MNIST test accuracy of the
full recipes (MLP 5 epochs, CNN 3 epochs). kiln/PyTorch ratios throughout.
PyTorch runs at its best: with a caching malloc setting (bench/torch_best.py)
and, for each row, the faster of the BLAS thread variables unset and
OPENBLAS_NUM_THREADS=1 (the row names which).

  /usr/bin/python3 bench/engine.py [--build build] [--repeats 3] [--accuracy [--seeds N]]
                                   [--data /usr/share/datasets]

Each speed figure is the median of --repeats runs, kiln's and PyTorch's
interleaved: this kind of machine drifts by 20% from one run to the next.

With --seeds N each recipe trains N times in each framework, seeds 42, 43,
...: one run's accuracy moves by a few tenths of a point with the seed, so
the gap is read between the means (each run's figure is printed too).

For reading, never for gating CI."""
import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
BLAS_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "GOTO_NUM_THREADS")


def run_json(argv, clean_env=False, extra_env=None):
    env = dict(os.environ)
    if clean_env:
        for v in BLAS_VARS:
            env.pop(v, None)
    env.update(extra_env or {})
    out = subprocess.run(argv, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{out.stdout}\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def kiln_train(build, spec, threads, data, seed):
    import resource
    import tempfile
    import time
    with tempfile.TemporaryDirectory() as ckpt:
        with open(spec) as f:
            recipe = json.load(f)
        recipe["seed"] = seed
        seeded = os.path.join(ckpt, "spec.json")
        with open(seeded, "w") as f:
            json.dump(recipe, f)
        t0 = time.perf_counter()
        proc = subprocess.Popen([os.path.join(build, "worker", "kiln-train"), "--json",
                                 "--threads", str(threads), "--data-dir", data,
                                 "--checkpoint-dir", os.path.join(ckpt, "out"), seeded],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = proc.communicate()
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            sys.exit(f"kiln-train failed:\n{out}\n{err}")
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0
    lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    vals = [l["metrics"]["val_accuracy"] for l in lines
            if "metrics" in l and "val_accuracy" in l["metrics"]]
    return {"framework": "kiln", "val_accuracy": vals[-1] if vals else float("nan"),
            "wall_s": wall, "peak_rss_mib_max_so_far": rss}


# PyTorch's settings tried for each row, its best kept: the BLAS thread
# variables unset (OpenBLAS then starts its own threads beside PyTorch's),
# and OpenBLAS held to one thread inside each of PyTorch's.
TORCH_SETTINGS = (("blas-vars-unset", {}), ("OPENBLAS_NUM_THREADS=1", {"OPENBLAS_NUM_THREADS": "1"}))


def torch_best_step(kind, threads, steps):
    best = None
    for name, extra in TORCH_SETTINGS:
        t = run_json([PY, os.path.join(ROOT, "bench", "torch_engine.py"), "step", kind,
                      str(threads), steps], clean_env=True, extra_env=extra)
        t["setting"] = name
        if best is None or t["samples_per_s"] > best["samples_per_s"]:
            best = t
    return best


def median_run(runs):
    """The run with the median samples/s (its other figures with it)."""
    return sorted(runs, key=lambda r: r["samples_per_s"])[len(runs) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--accuracy", action="store_true")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--data", default="/usr/share/datasets")
    ap.add_argument("--mlp-steps", type=int, default=200)
    ap.add_argument("--cnn-steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3,
                    help="runs of each measurement; the median run is reported")
    args = ap.parse_args()
    bench = os.path.join(args.build, "bench")

    peak = run_json([os.path.join(bench, "kiln-fma-peak")])
    print(json.dumps({"fma_peak": peak}))
    per_core = peak["fma512_gflops_per_core"] or peak["fma256_gflops_per_core"]

    rows = []
    for kind in ("mlp", "cnn"):
        steps = str(args.mlp_steps if kind == "mlp" else args.cnn_steps)
        for threads in (1, 2):
            ks, ts = [], []
            for _ in range(args.repeats):  # interleaved, so drift hits both alike
                ks.append(run_json([os.path.join(bench, "kiln-bench-step"), kind, str(threads),
                                    steps]))
                ts.append(torch_best_step(kind, threads, steps))
            k, t = median_run(ks), median_run(ts)
            row = {"model": kind, "threads": threads,
                   "kiln_samples_per_s": round(k["samples_per_s"]),
                   "pytorch_samples_per_s": round(t["samples_per_s"]),
                   "speed_ratio_kiln_over_pytorch": round(k["samples_per_s"] / t["samples_per_s"], 2),
                   "kiln_ms_per_step": round(k["ms_per_step"], 2),
                   "pytorch_ms_per_step": round(t["ms_per_step"], 2),
                   "pytorch_setting": t["setting"],
                   "kiln_gflops": k["gflops"],
                   "kiln_share_of_fma_peak": round(k["gflops"] / (per_core * threads), 3),
                   "kiln_peak_rss_mib": k["peak_rss_mib"],
                   "pytorch_peak_rss_mib": round(t["peak_rss_mib"], 1),
                   "rss_ratio_kiln_over_pytorch": round(k["peak_rss_mib"] / t["peak_rss_mib"], 3),
                   "kiln_arena_mib": k["arena_mib"],
                   "kiln_one_buffer_per_node_mib": k["one_buffer_per_node_mib"]}
            rows.append(row)
            print(json.dumps(row))
    for threads in (1, 2):
        unoptimized = median_run([run_json([os.path.join(bench, "kiln-bench-step"), "cnn",
                                            str(threads), str(args.cnn_steps), "unoptimized"])
                                  for _ in range(args.repeats)])
        graph = [r for r in rows if r["model"] == "cnn" and r["threads"] == threads][0]
        print(json.dumps({"threads": threads, "cnn_optimized_over_unoptimized_speed": round(
            graph["kiln_samples_per_s"] / unoptimized["samples_per_s"], 2),
            "cnn_unoptimized_samples_per_s": round(unoptimized["samples_per_s"]),
            "cnn_unoptimized_arena_mib": unoptimized["arena_mib"]}))

    if args.accuracy:
        recipes = [("mlp", os.path.join(ROOT, "bench", "specs", "fmnist-mlp-512.json"), 5),
                   ("cnn", os.path.join(ROOT, "examples", "fmnist-cnn.json"), 3)]
        for kind, spec, epochs in recipes:
            ks, ts = [], []
            for seed in range(42, 42 + args.seeds):
                k = kiln_train(args.build, spec, 2, args.data, seed)
                t = run_json([PY, os.path.join(ROOT, "bench", "torch_engine.py"), "train", kind,
                              "2", str(epochs), args.data, str(seed)], clean_env=True)
                ks.append(k["val_accuracy"])
                ts.append(t["val_accuracy"])
                print(json.dumps({"recipe": kind, "epochs": epochs, "seed": seed,
                                  "kiln_val_accuracy": round(k["val_accuracy"], 4),
                                  "pytorch_val_accuracy": round(t["val_accuracy"], 4),
                                  "kiln_wall_s": round(k["wall_s"], 1),
                                  "pytorch_train_s": round(t["train_s"], 1)}))
            km, tm = sum(ks) / len(ks), sum(ts) / len(ts)
            print(json.dumps({"recipe": kind, "epochs": epochs, "seeds": args.seeds,
                              "kiln_mean": round(km, 4), "kiln_range": [round(min(ks), 4), round(max(ks), 4)],
                              "pytorch_mean": round(tm, 4),
                              "pytorch_range": [round(min(ts), 4), round(max(ts), 4)],
                              "gap_points": round(100 * (km - tm), 2)}))

if __name__ == "__main__":
    main()
