#!/usr/bin/env python3
"""Evaluation speed: how long kiln-train's validation pass over the 10,000
Fashion-MNIST test images takes, for one or more builds side by side
(e.g. a build with the bn_fold pass against one without).

    /usr/bin/python3 bench/eval_speed.py --builds build-a,build-b \
        --models resnet,mobilenet --repeats 5

Each run trains a zoo model (bench/specs/zoo) for 4 steps, then validates
on the test split; the time from the last step's progress line to the
line with the validation metrics is the evaluation. Runs alternate between
the builds; medians are printed with the validation accuracy, which must
not differ between builds beyond rounding."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo  # noqa: E402


def one_run(build, spec_path, threads, out):
    argv = [os.path.join(build, "worker", "kiln-train"), "--json", "--threads", str(threads),
            "--data-dir", zoo.DATA, "--checkpoint-dir", out, spec_path]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    last_step = evaluated = accuracy = None
    for line in p.stdout:
        t = time.perf_counter()
        if not line.startswith("{"):
            continue
        metrics = json.loads(line).get("metrics", {})
        if "val_accuracy" in metrics:
            evaluated, accuracy = t - last_step, metrics["val_accuracy"]
        elif "loss" in metrics:
            last_step = t
    if p.wait() != 0 or evaluated is None:
        sys.exit(f"eval_speed: {' '.join(argv)} failed")
    return evaluated, accuracy


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--builds", required=True, help="comma-separated build directories")
    ap.add_argument("--models", default="resnet,mobilenet")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    builds = args.builds.split(",")
    work = tempfile.mkdtemp()
    print("| model | build | evaluation s (median) | runs | validation accuracy |")
    print("|---|---|---|---|---|")
    for model in args.models.split(","):
        spec = zoo.spec_of(model)
        spec["epochs"] = 1
        spec["log_every_steps"] = 1
        spec["pipeline"]["take"] = 4 * spec["pipeline"]["batch_size"]
        spec["dataset"]["validation"] = "test"
        path = os.path.join(work, model + ".json")
        with open(path, "w") as f:
            json.dump(spec, f)
        times = {b: [] for b in builds}
        accs = {b: set() for b in builds}
        for _ in range(args.repeats):
            for b in builds:
                t, acc = one_run(b, path, args.threads, os.path.join(work, "ckpt"))
                times[b].append(t)
                accs[b].add(round(acc, 4))
        for b in builds:
            print(f"| {model} | {b} | {statistics.median(times[b]):.3f} | "
                  f"{', '.join(f'{t:.3f}' for t in times[b])} | "
                  f"{', '.join(str(a) for a in sorted(accs[b]))} |")


if __name__ == "__main__":
    main()
