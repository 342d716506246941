"""Trains the Fashion-MNIST MLP recipe with kiln-train and with PyTorch, in
turn, several times, and reports medians and kiln/PyTorch ratios of wall
time and peak memory (each process's own rusage), plus final test accuracy.

  python3 bench/mlp_fmnist.py [--build build] [--runs 3] [--threads 1]

The figures are for reading, never for gating CI."""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(argv):
    """Wall seconds, peak RSS in MiB and stdout of one process."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = proc.stdout.read()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{argv[0]} failed:\n{out}\n{err}")
    return wall, usage.ru_maxrss / 1024.0, out


def last_accuracy(text, pattern):
    found = re.findall(pattern, text)
    return float(found[-1]) if found else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data", default="/usr/share/datasets")
    args = ap.parse_args()

    trainer = os.path.join(args.build, "worker", "kiln-train")
    spec = os.path.join(ROOT, "examples", "fmnist-mlp.json")
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    with tempfile.TemporaryDirectory() as ckpt:
        kiln_cmd = [trainer, "--threads", str(args.threads), "--data-dir", args.data,
                    "--checkpoint-dir", ckpt, spec]
        torch_cmd = [python, os.path.join(ROOT, "bench", "torch_mlp.py"),
                     os.path.join(args.data, "fashion-mnist"), str(args.threads)]
        kiln, torch = [], []
        for _ in range(args.runs):  # alternate, so drift hits both alike
            kiln.append(run(kiln_cmd))
            torch.append(run(torch_cmd))

    def summary(rows, pattern):
        return {"wall_s": statistics.median(r[0] for r in rows),
                "peak_rss_mib": statistics.median(r[1] for r in rows),
                "val_accuracy": last_accuracy(rows[-1][2], pattern)}

    k = summary(kiln, r"val_accuracy ([0-9.]+)")
    t = summary(torch, r"val_accuracy ([0-9.]+)")
    report = {"recipe": "fmnist-mlp 784-256-10, adam 0.002, batch 128, 2 epochs",
              "threads": args.threads, "runs": args.runs, "kiln": k, "pytorch": t,
              "ratio_wall_kiln_over_pytorch": k["wall_s"] / t["wall_s"],
              "ratio_peak_rss_kiln_over_pytorch": k["peak_rss_mib"] / t["peak_rss_mib"]}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
