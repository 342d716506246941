"""ASHA against random search on the Fashion-MNIST CNN, through kilnd.

  /usr/bin/python3 bench/asha.py [--build build-rel] [--trials 9]
                                 [--max-epochs 9] [--min-epochs 1] [--eta 3]
                                 [--concurrency 1,2] [--take N] [--seeds 7]
                                 [--json asha.json]

Starts kilnd (its trainer kiln-train, the default pool of every CPU core)
and runs, for each concurrency (max_concurrent_trials), two experiments
over the same base spec, bench/specs/asha-cnn.json (the CNN of
examples/fmnist-cnn.json, Adam, validation on the test split): learning
rate log-uniform 1e-4..1e-1 and batch size one of 64, 128, 256, with
--trials trials each:

  random  every trial trains the full --max-epochs;
  asha    rungs at --min-epochs x --eta^k up to --max-epochs; the top 1/eta
          of each rung is promoted and resumes from its checkpoint.

Both use the same seed, and a trial's values depend only on (seed, index),
so both searches draw the same configurations: what differs is only how
far each is trained. Reports each experiment's best val_accuracy (test
accuracy), ASHA's difference from random search in points, the epochs
trained in all and ASHA's fraction of random search's, and the wall time.
--seeds runs the pair once per search seed (a different set of trials
each) and adds the mean difference and fraction over the seeds: one
search's nine draws decide a lot by luck.
--take trains on the first N examples only (a quick check of the script;
the figures in bench/README.md use the whole set)."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default="build", help="the build folder with kilnd and kiln-train")
    p.add_argument("--trials", type=int, default=9)
    p.add_argument("--max-epochs", type=int, default=9)
    p.add_argument("--min-epochs", type=int, default=1)
    p.add_argument("--eta", type=int, default=3)
    p.add_argument("--concurrency", default="1,2",
                   help="max_concurrent_trials values, comma-separated")
    p.add_argument("--take", type=int, default=0, help="train on the first N examples (0: all)")
    p.add_argument("--seeds", default="7",
                   help="search seeds, comma-separated: one pair of experiments per seed")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    if args.trials < 1 or args.max_epochs < 1 or args.min_epochs < 1 or args.eta < 2:
        p.error("--trials, --max-epochs and --min-epochs must be >= 1, --eta >= 2")
    if args.min_epochs > args.max_epochs:
        p.error("--min-epochs must be <= --max-epochs")
    try:
        args.concurrency = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        p.error("--concurrency takes integers, e.g. 1,2")
    if any(c < 1 for c in args.concurrency):
        p.error("--concurrency values must be >= 1")
    try:
        args.seeds = [int(x) for x in args.seeds.split(",")]
    except ValueError:
        p.error("--seeds takes integers, e.g. 7,8,9")
    return args


class Kilnd:
    def __init__(self, build, tmp):
        self.tmp = tmp
        server = os.path.join(build, "server", "kilnd")
        trainer = os.path.join(build, "worker", "kiln-train")
        for path in (server, trainer):
            if not os.access(path, os.X_OK):
                sys.exit(f"asha.py: {path} is not built (cmake --build {build})")
        port_file = os.path.join(tmp, "port")
        self.log = open(os.path.join(tmp, "kilnd.log"), "w")
        self.proc = subprocess.Popen(
            [server, "--listen", "127.0.0.1:0", "--data-dir", os.path.join(tmp, "data"),
             "--port-file", port_file, "--trainer", trainer], stderr=self.log)
        for _ in range(200):
            if os.path.exists(port_file) and os.path.getsize(port_file) > 0:
                break
            if self.proc.poll() is not None:
                sys.exit(f"asha.py: kilnd exited; see {tmp}/kilnd.log")
            time.sleep(0.1)
        with open(port_file) as f:
            self.url = f"http://127.0.0.1:{f.read().strip()}"
        with open(os.path.join(tmp, "data", "admin.token")) as f:
            self.token = f.read().strip()

    def call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as res:
                return json.load(res)
        except urllib.error.HTTPError as e:
            sys.exit(f"asha.py: {method} {path}: {e.code} {e.read().decode(errors='replace')}")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


def search(args, searcher, concurrency, seed):
    s = {
        "searcher": searcher,
        "metric": "val_accuracy",
        "mode": "max",
        "max_trials": args.trials,
        "max_concurrent_trials": concurrency,
        "seed": seed,
        "parameters": {
            "optimizer.learning_rate": {"type": "log_uniform", "min": 1e-4, "max": 1e-1},
            "pipeline.batch_size": {"type": "categorical", "values": [64, 128, 256]},
        },
    }
    if searcher == "asha":
        s["asha"] = {"min_epochs": args.min_epochs, "max_epochs": args.max_epochs,
                     "reduction_factor": args.eta}
    return s


def run(kilnd, args, spec, searcher, concurrency, seed):
    body = {"display_name": f"bench-{searcher}-c{concurrency}-s{seed}", "spec": spec,
            "search": search(args, searcher, concurrency, seed)}
    start = time.monotonic()
    exp = kilnd.call("POST", "/v1/experiments", body)
    while exp["state"] == "RUNNING":
        time.sleep(2)
        exp = kilnd.call("GET", f"/v1/experiments/{exp['id']}")
    wall = time.monotonic() - start
    if exp["state"] != "SUCCEEDED":
        sys.exit(f"asha.py: experiment {exp['id']} ended {exp['state']}: {exp.get('message')}")
    best = exp["best_trial"]
    print(f"  {searcher:6} c={concurrency}: best val_accuracy {best['metric']:.4f} "
          f"(trial {best['index']}, {best['epochs']} epochs, {best['values']}), "
          f"{exp['epochs_trained']} epochs in all, {wall:.0f} s", flush=True)
    return {"searcher": searcher, "concurrency": concurrency, "seed": seed,
            "experiment": exp["id"],
            "best_accuracy": best["metric"], "best_values": best["values"],
            "best_epochs": best["epochs"], "epochs_trained": exp["epochs_trained"],
            "wall_s": wall}


def main():
    args = parse_args()
    with open(os.path.join(ROOT, "bench", "specs", "asha-cnn.json")) as f:
        spec = json.load(f)
    spec["epochs"] = args.max_epochs  # random search's full budget; ASHA sets its own
    if args.take:
        spec["pipeline"]["take"] = args.take
    tmp = tempfile.mkdtemp(prefix="kiln-bench-asha-")
    kilnd = Kilnd(os.path.join(ROOT, args.build) if not os.path.isabs(args.build) else args.build,
                  tmp)
    results = []
    try:
        for seed in args.seeds:
            for c in args.concurrency:
                print(f"seed {seed}: {args.trials} trials, {args.max_epochs} epochs each at most, "
                      f"{c} at a time:", flush=True)
                r = run(kilnd, args, spec, "random", c, seed)
                a = run(kilnd, args, spec, "asha", c, seed)
                results += [r, a]
    finally:
        kilnd.stop()
    print()
    print("| seed | trials at a time | random: best test acc. | ASHA: best test acc. | "
          "difference (points) | epochs: random | epochs: ASHA | ASHA / random | "
          "wall s: random / ASHA |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = []
    for r, a in zip(results[0::2], results[1::2]):
        diff = 100 * (a["best_accuracy"] - r["best_accuracy"])
        frac = a["epochs_trained"] / r["epochs_trained"] if r["epochs_trained"] else float("nan")
        rows.append({"seed": r["seed"], "concurrency": r["concurrency"], "random": r, "asha": a,
                     "difference_points": diff, "epoch_fraction": frac})
        print(f"| {r['seed']} | {r['concurrency']} | {r['best_accuracy']:.4f} | "
              f"{a['best_accuracy']:.4f} | {diff:+.2f} | {r['epochs_trained']} | "
              f"{a['epochs_trained']} | {frac:.2f} | {r['wall_s']:.0f} / {a['wall_s']:.0f} |")
    if len(args.seeds) > 1:
        for c in args.concurrency:
            mine = [x for x in rows if x["concurrency"] == c]
            d = sum(x["difference_points"] for x in mine) / len(mine)
            f = sum(x["epoch_fraction"] for x in mine) / len(mine)
            print(f"mean over {len(mine)} seeds, {c} at a time: difference {d:+.2f} points, "
                  f"epochs {f:.2f} of random search's")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items() if k != "json"},
                       "rows": rows}, f, indent=1)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
